//! Other parties' NetworkPolicies in an HCP namespace, as far as they decide our pods'
//! egress (issue 37 item 6).
//!
//! HyperShift's `management-kas` policy (AWS, written by the HyperShift operator) selects
//! every HCP pod without its `need-management-kas-access` label and allows egress only to the
//! same namespace, DNS, and addresses outside the management cluster's pod network and API
//! server. Our shared catalogs run in `hcp-olm-catalogs`, on that pod network: under such a
//! policy the catalog readers could not reach them. The render answers with an egress policy
//! of its own that adds exactly the shared catalogs' gRPC port, and only when some other
//! policy already isolates the readers' egress (a policy of ours alone would isolate them and
//! cut everything else they reach).
//!
//! Pure: the runtime lists the namespace's NetworkPolicies and passes them here.

use serde_json::Value;

use crate::render::labels::{MANAGED_BY, MANAGED_BY_KEY};

/// At most this many NetworkPolicies of one HCP namespace are considered (the list is read
/// with this limit; HyperShift writes about ten).
pub const MAX_POLICIES: usize = 256;

/// A NetworkPolicy, not ours, that isolates the egress of the pods it selects.
#[derive(Clone, Debug, PartialEq)]
pub struct EgressIsolation {
    pub policy: String,
    /// `spec.podSelector` (a LabelSelector).
    pub pod_selector: Value,
}

/// `Some` for a policy that is not ours and whose `spec.policyTypes` include `Egress`. The API
/// server fills `policyTypes` in on every write; an object without it (read from an older
/// store) isolates egress when it has `spec.egress` rules, as the API defines the default.
pub fn egress_isolation(policy: &Value) -> Option<EgressIsolation> {
    let meta = &policy["metadata"];
    if meta["labels"][MANAGED_BY_KEY] == MANAGED_BY {
        return None;
    }
    let spec = &policy["spec"];
    let egress = match spec["policyTypes"].as_array() {
        Some(types) => types.iter().any(|t| t == "Egress"),
        None => spec.get("egress").is_some(),
    };
    egress.then(|| EgressIsolation {
        policy: meta["name"].as_str().unwrap_or_default().to_string(),
        pod_selector: spec["podSelector"].clone(),
    })
}

/// Whether a LabelSelector selects a pod with `labels`: every `matchLabels` pair and every
/// `matchExpressions` requirement holds; the empty selector selects every pod. A requirement
/// with an unknown operator selects nothing (the API server refuses such a selector, so only
/// a malformed object gets here).
pub fn selects(selector: &Value, labels: &serde_json::Map<String, Value>) -> bool {
    if !(selector.is_object() || selector.is_null()) {
        return false;
    }
    let label = |k: &str| labels.get(k).and_then(Value::as_str);
    let pairs_hold = selector["matchLabels"]
        .as_object()
        .into_iter()
        .flatten()
        .all(|(k, v)| v.as_str().is_some() && label(k) == v.as_str());
    let requirements_hold = selector["matchExpressions"]
        .as_array()
        .into_iter()
        .flatten()
        .all(|r| {
            let Some(key) = r["key"].as_str() else {
                return false;
            };
            let values: Vec<&str> = r["values"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(Value::as_str)
                .collect();
            match r["operator"].as_str() {
                Some("In") => label(key).is_some_and(|v| values.contains(&v)),
                Some("NotIn") => label(key).is_none_or(|v| !values.contains(&v)),
                Some("Exists") => label(key).is_some(),
                Some("DoesNotExist") => label(key).is_none(),
                _ => false,
            }
        });
    pairs_hold && requirements_hold
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn labels(v: Value) -> serde_json::Map<String, Value> {
        v.as_object().cloned().unwrap()
    }

    /// HyperShift's `management-kas` selector (openshift/hypershift 3ee9615,
    /// `reconcileManagementKASNetworkPolicy`).
    fn management_kas_selector() -> Value {
        json!({"matchExpressions": [
            {"key": "hypershift.openshift.io/need-management-kas-access", "operator": "DoesNotExist"},
            {"key": "name", "operator": "NotIn", "values": ["aws-ebs-csi-driver-operator"]},
        ]})
    }

    #[test]
    fn management_kas_selects_our_pods_and_not_those_with_its_access_label() {
        let s = management_kas_selector();
        let ours = labels(
            json!({MANAGED_BY_KEY: MANAGED_BY, "app.kubernetes.io/name": "hcp-olm-packageserver"}),
        );
        assert!(selects(&s, &ours));
        let kas = labels(json!({"app": "kube-apiserver",
            "hypershift.openshift.io/need-management-kas-access": "true"}));
        assert!(!selects(&s, &kas));
        let csi = labels(json!({"name": "aws-ebs-csi-driver-operator"}));
        assert!(!selects(&s, &csi));
    }

    #[test]
    fn selector_forms() {
        let l = labels(json!({"a": "1", "b": "2"}));
        assert!(selects(&json!({}), &l), "empty selects all");
        assert!(selects(&Value::Null, &l), "absent selects all");
        assert!(selects(&json!({"matchLabels": {"a": "1"}}), &l));
        assert!(!selects(&json!({"matchLabels": {"a": "2"}}), &l));
        assert!(!selects(&json!({"matchLabels": {"c": "1"}}), &l));
        assert!(selects(
            &json!({"matchExpressions": [{"key": "a", "operator": "In", "values": ["0", "1"]}]}),
            &l
        ));
        assert!(!selects(
            &json!({"matchExpressions": [{"key": "c", "operator": "In", "values": ["1"]}]}),
            &l
        ));
        assert!(selects(
            &json!({"matchExpressions": [{"key": "c", "operator": "NotIn", "values": ["1"]}]}),
            &l
        ));
        assert!(selects(
            &json!({"matchExpressions": [{"key": "b", "operator": "Exists"}]}),
            &l
        ));
        assert!(!selects(
            &json!({"matchExpressions": [{"key": "b", "operator": "Gt", "values": ["1"]}]}),
            &l
        ));
        assert!(!selects(&json!("a=1"), &l), "malformed selects nothing");
    }

    #[test]
    fn only_others_egress_policies_isolate() {
        let theirs = json!({"metadata": {"name": "management-kas"},
            "spec": {"podSelector": management_kas_selector(), "policyTypes": ["Egress"]}});
        assert_eq!(
            egress_isolation(&theirs),
            Some(EgressIsolation {
                policy: "management-kas".into(),
                pod_selector: management_kas_selector()
            })
        );
        let ingress = json!({"metadata": {"name": "same-namespace"},
            "spec": {"podSelector": {}, "policyTypes": ["Ingress"]}});
        assert_eq!(egress_isolation(&ingress), None);
        let ours = json!({"metadata": {"name": "x", "labels": {MANAGED_BY_KEY: MANAGED_BY}},
            "spec": {"podSelector": {}, "policyTypes": ["Egress"]}});
        assert_eq!(egress_isolation(&ours), None);
        let defaulted = json!({"metadata": {"name": "old"},
            "spec": {"podSelector": {}, "egress": []}});
        assert!(egress_isolation(&defaulted).is_some());
    }
}
