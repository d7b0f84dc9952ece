//! Objects of the shared catalogs in [`SHARED_NAMESPACE`] (issue 18): the Namespace, and
//! per shared catalog a Deployment (2 replicas of our catalog server, spread over nodes
//! and zones), a Service, a PodDisruptionBudget (minAvailable 1) and a NetworkPolicy
//! admitting only the catalog readers of the HCP namespaces that use it.
//!
//! Pure. Every object carries our managed-by label and none of a hosted cluster's labels or
//! a HostedOLM owner: it outlives any one hosted cluster, and the per-cluster pruning never
//! selects it. Nothing here comes from a HostedCluster or a HostedOLM except the digest
//! (resolved by the controller at the default repository, see [`crate::sharing::decide`])
//! and the users' namespace names: images, flags and pull secret are the controller's.

use std::collections::BTreeMap;

use serde_json::{Value, json};

use super::hcp::{catalog_server_container, config_hash, container_security, resources};
use super::labels::{COMPONENT_KEY, MANAGED_BY, MANAGED_BY_KEY, NAME_KEY, selector};
use super::{ApplyPolicy, Object, names, ports};
use crate::sharing::{NAMESPACES_PER_PEER, SHARED_NAMESPACE, SharedCatalog};

/// Label of every shared catalog object: the catalog's name.
pub const SHARED_CATALOG_KEY: &str = "hcp-olm.io/shared-catalog";
/// Label of every shared catalog object: the catalog minor.
pub const CATALOG_VERSION_KEY: &str = "hcp-olm.io/catalog-version";
/// Component label value of the shared objects (what the shared pass lists by).
pub const COMPONENT: &str = "shared-catalog";

/// The controller's settings for the shared catalogs (never a hosted cluster's).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SharedSettings {
    /// `hcp-olm-catalog-server` image (the controller's `--catalog-server-image`).
    pub catalog_server_image: String,
    /// Image holding `/bin/copy-content` (OLM's), for the init container that copies the
    /// catalog out of its image.
    pub utilities_image: String,
    /// A pull secret in [`SHARED_NAMESPACE`] put there by the administrator (None: the
    /// nodes' credentials).
    pub image_pull_secret: Option<String>,
    /// As [`super::RenderInput::management_has_scc`].
    pub management_has_scc: bool,
}

/// Labels of every shared object (the shared pass lists by the first two).
pub fn shared_labels() -> BTreeMap<String, String> {
    BTreeMap::from([
        (MANAGED_BY_KEY.to_string(), MANAGED_BY.to_string()),
        (COMPONENT_KEY.to_string(), COMPONENT.to_string()),
    ])
}

fn object_labels(c: &SharedCatalog) -> BTreeMap<String, String> {
    let mut l = shared_labels();
    l.insert(NAME_KEY.to_string(), c.key.name());
    l.insert(
        SHARED_CATALOG_KEY.to_string(),
        c.key.catalog.name().to_string(),
    );
    l.insert(CATALOG_VERSION_KEY.to_string(), c.key.version.clone());
    l
}

fn meta(c: &SharedCatalog) -> Value {
    json!({
        "name": c.key.name(),
        "namespace": SHARED_NAMESPACE,
        "labels": object_labels(c),
    })
}

fn object(body: Value, plural: &str) -> Object {
    Object::new(body, plural, ApplyPolicy::Apply)
}

/// The shared namespace. Enforces the `restricted` Pod Security level (every container of
/// a shared catalog runs restricted).
pub fn namespace() -> Object {
    let mut labels = shared_labels();
    labels.insert(
        "pod-security.kubernetes.io/enforce".to_string(),
        "restricted".to_string(),
    );
    object(
        json!({
            "apiVersion": "v1",
            "kind": "Namespace",
            "metadata": {"name": SHARED_NAMESPACE, "labels": labels},
        }),
        "namespaces",
    )
}

/// The ServiceAccount of the shared catalog pods (no token mounted; no permissions).
pub fn service_account() -> Object {
    let mut labels = shared_labels();
    labels.insert(NAME_KEY.to_string(), names::CATALOG_SA.to_string());
    object(
        json!({
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": {"name": names::CATALOG_SA, "namespace": SHARED_NAMESPACE, "labels": labels},
            "automountServiceAccountToken": false,
        }),
        "serviceaccounts",
    )
}

/// The objects of one shared catalog, in apply order: Deployment, Service,
/// PodDisruptionBudget, NetworkPolicy.
pub fn catalog(c: &SharedCatalog, s: &SharedSettings) -> Vec<Object> {
    vec![
        object(deployment(c, s), "deployments"),
        object(service(c), "services"),
        object(pdb(c), "poddisruptionbudgets"),
        object(network_policy(c), "networkpolicies"),
    ]
}

fn pod_security(s: &SharedSettings) -> Value {
    let mut sc = json!({"runAsNonRoot": true, "seccompProfile": {"type": "RuntimeDefault"}});
    if !s.management_has_scc {
        sc["runAsUser"] = json!(super::DEFAULT_POD_USER);
        sc["fsGroup"] = json!(super::DEFAULT_POD_USER);
    }
    sc
}

/// Two replicas, preferably on different nodes and zones (required spreading would leave
/// a replica pending on a one-node management cluster), so one pod lost never drops every
/// user's catalog; the PodDisruptionBudget keeps one through voluntary disruptions.
fn spread(name: &str) -> (Value, Value) {
    let term = |topology: &str| {
        json!({"weight": 100, "podAffinityTerm": {
            "labelSelector": {"matchLabels": selector(name)},
            "topologyKey": topology,
        }})
    };
    let affinity = json!({
        "nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
            {"weight": 50, "preference": {"matchExpressions": [
                {"key": "hypershift.openshift.io/control-plane", "operator": "In", "values": ["true"]}]}},
        ]},
        "podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
            term("kubernetes.io/hostname"),
            term("topology.kubernetes.io/zone"),
        ]},
    });
    let constraints = json!([{
        "maxSkew": 1,
        "topologyKey": "kubernetes.io/hostname",
        "whenUnsatisfiable": "ScheduleAnyway",
        "labelSelector": {"matchLabels": selector(name)},
    }]);
    (affinity, constraints)
}

fn deployment(c: &SharedCatalog, s: &SharedSettings) -> Value {
    let name = c.key.name();
    let utilities = json!({
        "name": "extract-utilities",
        "image": s.utilities_image,
        "imagePullPolicy": "IfNotPresent",
        "command": ["cp"],
        "args": ["/bin/copy-content", "/utilities/copy-content"],
        "resources": resources("10m", "50Mi"),
        "securityContext": container_security(),
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "volumeMounts": [{"name": "utilities", "mountPath": "/utilities"}],
    });
    let extract = json!({
        "name": "extract-content",
        "image": c.image,
        "imagePullPolicy": "IfNotPresent",
        "command": ["/utilities/copy-content"],
        "args": ["--catalog.from=/configs", "--catalog.to=/extracted-catalog/catalog"],
        "resources": resources("10m", "50Mi"),
        "securityContext": container_security(),
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "volumeMounts": [
            {"name": "utilities", "mountPath": "/utilities"},
            {"name": "catalog-content", "mountPath": "/extracted-catalog"},
        ],
    });
    // The same server as a hosted cluster's own copy (docs/catalog-server.md).
    let mut server =
        catalog_server_container(&s.catalog_server_image, c.key.catalog.memory_request());
    server["terminationMessagePolicy"] = json!("FallbackToLogsOnError");
    let hash = config_hash(&BTreeMap::from([
        ("image".to_string(), c.image.clone()),
        ("server".to_string(), s.catalog_server_image.clone()),
        ("utilities".to_string(), s.utilities_image.clone()),
    ]));
    let (affinity, constraints) = spread(&name);
    let pod_labels = object_labels(c);
    let mut pod_spec = json!({
        "serviceAccountName": names::CATALOG_SA,
        "automountServiceAccountToken": false,
        "enableServiceLinks": false,
        "priorityClassName": "hypershift-control-plane",
        "securityContext": pod_security(s),
        "tolerations": [{"key": "hypershift.openshift.io/control-plane", "operator": "Equal", "value": "true", "effect": "NoSchedule"}],
        "affinity": affinity,
        "topologySpreadConstraints": constraints,
        "nodeSelector": {"kubernetes.io/os": "linux"},
        "terminationGracePeriodSeconds": 15,
        "initContainers": [utilities, extract],
        "containers": [server],
        "volumes": [
            {"name": "utilities", "emptyDir": {}},
            {"name": "catalog-content", "emptyDir": {}},
            {"name": "tmp", "emptyDir": {}},
        ],
    });
    if let Some(ps) = &s.image_pull_secret {
        pod_spec["imagePullSecrets"] = json!([{"name": ps}]);
    }
    json!({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": meta(c),
        "spec": {
            "replicas": 2,
            "revisionHistoryLimit": 2,
            "selector": {"matchLabels": selector(&name)},
            // one replica at a time: the other keeps serving while a new digest rolls out
            "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}},
            "template": {
                "metadata": {
                    "labels": pod_labels,
                    "annotations": {super::labels::CONFIG_HASH_ANNOTATION: hash},
                },
                "spec": pod_spec,
            },
        },
    })
}

fn service(c: &SharedCatalog) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": meta(c),
        "spec": {
            "type": "ClusterIP",
            "selector": selector(&c.key.name()),
            "ports": [{"name": "grpc", "protocol": "TCP", "port": ports::CATALOG_GRPC, "targetPort": ports::CATALOG_GRPC}],
        },
    })
}

fn pdb(c: &SharedCatalog) -> Value {
    json!({
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": meta(c),
        "spec": {
            "minAvailable": 1,
            "selector": {"matchLabels": selector(&c.key.name())},
            "unhealthyPodEvictionPolicy": "AlwaysAllow",
        },
    })
}

/// The pods of an HCP namespace that dial catalogs: catalog-operator and packageserver,
/// and the tunnel gateway, which carries guest reads of the management-side catalogs.
pub const CATALOG_READERS: [&str; 3] = [
    names::CATALOG_OPERATOR,
    names::PACKAGESERVER,
    names::TUNNEL_GATEWAY,
];

/// The spec of the egress NetworkPolicy an HCP namespace gets where another policy isolates
/// the egress of some `readers` (of [`CATALOG_READERS`]; see `crate::netpol`): those of our
/// pods may open the gRPC port of shared catalog pods in [`SHARED_NAMESPACE`], nothing else.
pub fn reader_egress_spec(readers: &[&str]) -> Value {
    json!({
        "podSelector": {
            "matchLabels": {MANAGED_BY_KEY: MANAGED_BY},
            "matchExpressions": [{"key": NAME_KEY, "operator": "In", "values": readers}],
        },
        "policyTypes": ["Egress"],
        "egress": [{
            "to": [{
                "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": SHARED_NAMESPACE}},
                "podSelector": {"matchLabels": shared_labels()},
            }],
            "ports": [{"protocol": "TCP", "port": ports::CATALOG_GRPC}],
        }],
    })
}

/// Ingress on the gRPC port only from [`CATALOG_READERS`] pods (by our labels) in the
/// users' namespaces (by `kubernetes.io/metadata.name`, which the API server sets on every
/// namespace: no labels of ours needed). The namespaces are listed in chunks of
/// [`NAMESPACES_PER_PEER`], one `from` peer each; [`crate::sharing::plan`] bounds the
/// total. No users: no peer, so nothing is admitted.
fn network_policy(c: &SharedCatalog) -> Value {
    let users: Vec<&String> = c.users.iter().collect();
    let from: Vec<Value> = users
        .chunks(NAMESPACES_PER_PEER)
        .map(|chunk| {
            json!({
                "namespaceSelector": {"matchExpressions": [
                    {"key": "kubernetes.io/metadata.name", "operator": "In", "values": chunk},
                ]},
                "podSelector": {"matchExpressions": [
                    {"key": MANAGED_BY_KEY, "operator": "In", "values": [MANAGED_BY]},
                    {"key": NAME_KEY, "operator": "In", "values": CATALOG_READERS},
                ]},
            })
        })
        .collect();
    let ingress = if from.is_empty() {
        json!([])
    } else {
        json!([{"from": from, "ports": [{"protocol": "TCP", "port": ports::CATALOG_GRPC}]}])
    };
    json!({
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": meta(c),
        "spec": {
            "podSelector": {"matchLabels": selector(&c.key.name())},
            "policyTypes": ["Ingress"],
            "ingress": ingress,
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::catalogs::DefaultCatalog;
    use crate::sharing::SharedKey;

    fn settings() -> SharedSettings {
        SharedSettings {
            catalog_server_image: "quay.io/hcp-olm/hcp-olm-catalog-server:test".into(),
            utilities_image: "quay.io/operator-framework/olm:test".into(),
            image_pull_secret: None,
            management_has_scc: false,
        }
    }

    fn shared(users: &[&str], digest: char) -> SharedCatalog {
        SharedCatalog {
            key: SharedKey::new(DefaultCatalog::RedhatOperators, "4.18").expect("key"),
            image: format!(
                "registry.redhat.io/redhat/redhat-operator-index@sha256:{}",
                digest.to_string().repeat(64)
            ),
            users: users.iter().map(|s| s.to_string()).collect(),
        }
    }

    #[test]
    fn a_new_digest_changes_only_the_pod_template() {
        let a = catalog(&shared(&["clusters-a"], 'a'), &settings());
        let b = catalog(&shared(&["clusters-a", "clusters-b"], 'b'), &settings());
        assert_eq!(a[0].name, b[0].name, "same Deployment");
        assert_eq!(a[0].body["metadata"], b[0].body["metadata"]);
        assert_ne!(a[0].body["spec"]["template"], b[0].body["spec"]["template"]);
        assert_eq!(a[1].body, b[1].body, "Service unchanged");
        assert_eq!(a[2].body, b[2].body, "PDB unchanged");
        assert_ne!(a[3].body, b[3].body, "NetworkPolicy lists the users");
    }

    #[test]
    fn no_owner_and_no_cluster_labels() {
        for o in catalog(&shared(&["clusters-a"], 'a'), &settings())
            .iter()
            .chain([namespace()].iter())
        {
            assert!(
                o.body["metadata"].get("ownerReferences").is_none(),
                "{}",
                o.id()
            );
            let l = o.body["metadata"]["labels"].as_object().expect("labels");
            assert_eq!(l[MANAGED_BY_KEY], MANAGED_BY);
            assert_eq!(l[COMPONENT_KEY], COMPONENT);
            assert!(!l.contains_key(super::super::labels::CLUSTER_NAME_KEY));
        }
    }

    #[test]
    fn network_policy_lists_users_in_bounded_chunks() {
        let users: Vec<String> = (0..(NAMESPACES_PER_PEER * 2 + 1))
            .map(|i| format!("ns-{i:05}"))
            .collect();
        let refs: Vec<&str> = users.iter().map(String::as_str).collect();
        let np = network_policy(&shared(&refs, 'a'));
        let from = np["spec"]["ingress"][0]["from"].as_array().expect("from");
        assert_eq!(from.len(), 3);
        let listed: usize = from
            .iter()
            .map(|p| {
                p["namespaceSelector"]["matchExpressions"][0]["values"]
                    .as_array()
                    .map_or(0, Vec::len)
            })
            .sum();
        assert_eq!(listed, users.len());
        let none = network_policy(&shared(&[], 'a'));
        assert_eq!(none["spec"]["ingress"], json!([]));
    }
}
