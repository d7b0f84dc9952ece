//! hcp-olm CLI library: the `catalog` subcommand (browsing catalogs over the
//! registry gRPC API), kept out of main.rs so it can be tested.

pub mod catalog;
pub mod connect;
