//! Real test environments for hcp-olm.
//!
//! - [`tools`]: the pinned upstream binaries (`make tools`).

pub mod tools;
