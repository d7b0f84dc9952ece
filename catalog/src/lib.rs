//! hcp-olm catalog server core: loads a file-based catalog (FBC) directory,
//! validates it, lays it out in memory and serves it over the
//! operator-registry `api.Registry` gRPC API with the semantics of `opm serve`.

pub mod blob;
pub mod csv;
pub mod error;
pub mod gojson;
pub mod limits;
pub mod load;
pub mod model;
pub mod render_pool;
pub mod server;

pub use error::{LoadError, Location, Rule};
pub use limits::Limits;
pub use model::Catalog;
pub use server::{HealthService, RegistryService, ServeError, serve, serve_with};
