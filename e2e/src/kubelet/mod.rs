//! A kubelet stand-in: runs what the controller rendered as real processes.
//!
//! - [`image`]: image references → small root filesystems assembled from host files.
//! - [`plan`]: pod spec → argv, env, volumes, mounts and probes (pure; strict).
//! - [`run`]: a planned pod started under `bwrap` in its network namespace; init containers
//!   run to completion first; [`probe`] runs its probes as the kubelet would.
//! - [`node`]: the loop that turns a namespace's Deployments and Services into running pods,
//!   Deployment status, DNS names and DNAT rules.
pub mod image;
pub mod node;
pub mod plan;
pub mod probe;
pub mod run;

pub use image::{Image, ImageStore};
pub use plan::{NodeFacts, Objects, PlanError, PodInput, PodPlan, ServiceAccountFiles};
pub use run::{PodSite, RunError, RunningPod, start};
