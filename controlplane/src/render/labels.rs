//! Labels and metadata shared by every rendered object.

use std::collections::BTreeMap;

use serde_json::{Value, json};

use super::Owner;
use crate::validate::ValidInput;

pub const MANAGED_BY_KEY: &str = "app.kubernetes.io/managed-by";
pub const MANAGED_BY: &str = "hcp-olm";
pub const COMPONENT_KEY: &str = "app.kubernetes.io/component";
pub const NAME_KEY: &str = "app.kubernetes.io/name";
/// Label values cannot contain `/`, so namespace and name are two labels.
pub const CLUSTER_NAMESPACE_KEY: &str = "hcp-olm.io/hosted-cluster-namespace";
pub const CLUSTER_NAME_KEY: &str = "hcp-olm.io/hosted-cluster-name";
/// Annotation with `<namespace>/<name>` for humans.
pub const CLUSTER_ANNOTATION: &str = "hcp-olm.io/hosted-cluster";
/// Pod-template annotation: hash of the configuration the pod mounts.
pub const CONFIG_HASH_ANNOTATION: &str = "hcp-olm.io/config-hash";
/// Certificate Secret annotations (defined with the certificates that read them).
pub use crate::certs::{NOT_AFTER_ANNOTATION, NOT_BEFORE_ANNOTATION, SANS_ANNOTATION};
/// HyperShift's label for pods of one hosted control plane (used for co-location).
pub const HCP_POD_LABEL: &str = "hypershift.openshift.io/hosted-control-plane";

/// The labels the applier lists by to prune (identical for both clusters).
pub fn prune_selector(v: &ValidInput) -> BTreeMap<String, String> {
    BTreeMap::from([
        (MANAGED_BY_KEY.to_string(), MANAGED_BY.to_string()),
        (
            CLUSTER_NAMESPACE_KEY.to_string(),
            v.cluster.namespace.clone(),
        ),
        (CLUSTER_NAME_KEY.to_string(), v.cluster.name.clone()),
    ])
}

/// Object labels: prune labels + component + name.
pub fn object_labels(v: &ValidInput, component: &str, name: &str) -> BTreeMap<String, String> {
    let mut l = prune_selector(v);
    l.insert(COMPONENT_KEY.to_string(), component.to_string());
    l.insert(NAME_KEY.to_string(), name.to_string());
    l
}

/// Selector labels of a workload (stable: Deployment selectors are immutable).
pub fn selector(name: &str) -> Value {
    json!({ NAME_KEY: name, MANAGED_BY_KEY: MANAGED_BY })
}

/// Metadata for an object.
pub fn metadata(
    v: &ValidInput,
    name: &str,
    namespace: Option<&str>,
    component: &str,
    owner: Option<&Owner>,
) -> Value {
    let mut m = json!({
        "name": name,
        "labels": object_labels(v, component, name),
        "annotations": { CLUSTER_ANNOTATION: v.cluster.key() },
    });
    if let Some(ns) = namespace {
        m["namespace"] = json!(ns);
    }
    if let Some(o) = owner {
        m["ownerReferences"] = json!([{
            "apiVersion": o.api_version,
            "kind": o.kind,
            "name": o.name,
            "uid": o.uid,
            "controller": true,
            "blockOwnerDeletion": true,
        }]);
    }
    m
}
