//! Real test environments for hcp-olm, built from pinned upstream binaries.
//!
//! - [`tools`]: where the upstream binaries are (`make tools`).
//! - [`cluster`]: etcd + kube-apiserver control planes ([`Cluster`], [`Environment`]).
//! - [`netns`]: network namespaces joined by veth, with per-namespace `resolv.conf`.
//! - [`fleet`]: many HostedClusters and the controller's identity (benchmark, restart test).
//! - [`guest_standin`]: a minimal stand-in for many guest API servers (controller benchmark only).
//! - [`registry`]: a real OCI registry on loopback.
//! - [`hypershift_standin`]: HyperShift's hosted-cluster-config-operator's guest OLM writes.
//! - [`hostile_registry`]: a stand-in for a hostile registry (answers chosen by the test).
//! - [`realnode`]: real nodes (containerd, runc, CNI bridge, kubelet) in their own namespaces.
//! - [`hcpimages`]: real images for what the controller renders, pushed to a test registry.
//! - [`imagetree`]: images described as trees of host files, for the test images.
//! - [`process`]: processes started and stopped by PID (killed with the test process).

pub mod catalogbench;
pub mod cluster;
pub mod clusterdns;
pub mod fleet;
pub mod guest_standin;
pub mod hcpimages;
pub mod hostile_registry;
pub mod hypershift_standin;
pub mod imagetree;
pub mod kubeconfig;
pub mod netns;
pub mod pki;
pub mod ports;
pub mod process;
pub mod realnode;
pub mod registry;
pub mod scenario;
pub mod testimages;
pub mod tools;

pub use cluster::{Cluster, ClusterError, ClusterOptions, Environment, Identity, SharedEtcd};
