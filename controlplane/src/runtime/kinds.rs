//! Names of the Kubernetes things every part of the runtime refers to: HyperShift's
//! label and annotation, the guest objects a pass looks for, and API resources by
//! name. A leaf: it imports nothing of the runtime, so the guest session, guest
//! reads, stores and the reconcile pass can all use it without importing each other.

use kube::api::ApiResource;

/// The guest CRD whose presence means "OLM CRDs are served".
pub const GUEST_OLM_CRD: &str = "catalogsources.operators.coreos.com";

/// The CatalogSource HyperShift deletes as deprecated.
pub const DEPRECATED_MARKETPLACE: &str = "redhat-marketplace";

/// HyperShift's label on every HCP namespace it makes.
pub const HCP_NAMESPACE_LABEL: &str = "hypershift.openshift.io/hosted-control-plane";
/// HyperShift's annotation on the HostedControlPlane: `<namespace>/<name>` of its
/// HostedCluster.
pub const HOSTED_CLUSTER_ANNOTATION: &str = "hypershift.openshift.io/cluster";

pub(crate) fn api_resource(api_version: &str, kind: &str, plural: &str) -> ApiResource {
    let (group, version) = match api_version.split_once('/') {
        Some((g, v)) => (g.to_string(), v.to_string()),
        None => (String::new(), api_version.to_string()),
    };
    ApiResource {
        group,
        version,
        api_version: api_version.to_string(),
        kind: kind.to_string(),
        plural: plural.to_string(),
    }
}
