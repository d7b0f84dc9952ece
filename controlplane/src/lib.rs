//! hcp-olm-controlplane: the management-cluster side of hcp-olm.
//!
//! Pure pieces the controller runtime composes:
//! - [`hostedcluster`]: the HostedCluster fields we read;
//! - [`hostedolm`]: our `HostedOLM` CRD (overrides and status);
//! - [`validate`]: HostedCluster + overrides + release facts → [`validate::ValidInput`];
//! - [`catalogs`]: default catalogs and image selection with fallback;
//! - [`certs`]: per-cluster CA, packageserver serving cert, rotation decision;
//! - [`render`]: every desired object for the HCP namespace and the guest;
//! - [`sharing`]: which default catalogs a hosted cluster shares with others, and why;
//! - [`status`]: conditions from validation/render results;
//! - [`runtime`]: the controller runtime that reads and writes both clusters.

pub mod catalogs;
pub mod certs;
pub mod hostedcluster;
pub mod hostedolm;
pub mod knobs;
pub mod last_good;
pub mod netpol;
pub mod operatorhub;
pub mod render;
pub mod runtime;
pub mod scope;
pub mod sharing;
pub mod status;
pub mod takeover;
pub mod tls;
pub mod validate;
