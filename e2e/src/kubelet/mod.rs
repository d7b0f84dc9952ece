//! A kubelet stand-in: runs what the controller rendered as real processes.
//!
//! - [`image`]: image references → small root filesystems assembled from host files.
//! - [`plan`]: pod spec → argv, env, volumes, mounts and probes (pure; strict).
pub mod image;
pub mod plan;

pub use image::{Image, ImageStore};
pub use plan::{NodeFacts, Objects, PlanError, PodInput, PodPlan, ServiceAccountFiles};
