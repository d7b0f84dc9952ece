//! Objects in the HCP namespace of the management cluster.

use std::collections::BTreeMap;

use base64::Engine;
use base64::engine::general_purpose::STANDARD as B64;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use time::format_description::well_known::Rfc3339;

mod catalogs;
mod gateway;
mod olm;

use super::labels::{self, metadata, selector};
use super::{
    ApplyPolicy, Desired, Object, Pending, RenderError, RenderInput, ResolvedCatalog, names, ports,
};
use crate::certs::{CertMaterial, hex};
use crate::hostedolm::CatalogPlacement;
use crate::validate::{Severity, ValidInput};

const KUBECONFIG_DIR: &str = "/etc/openshift/kubeconfig";
const PACKAGESERVER_CERT_DIR: &str = "/apiserver.local.config/certificates";
/// Key of the replaced CA certificate in the CA Secret (see [`super::PkiInput::previous_ca_pem`]).
pub const PREVIOUS_CA_KEY: &str = "previous-ca.crt";
const GLOBAL_CATALOG_NAMESPACE: &str = "openshift-marketplace";
const CONTROL_PLANE_PRIORITY: &str = "hypershift-control-plane";
const API_CRITICAL_PRIORITY: &str = "hypershift-api-critical";

/// Decide which catalogs get rendered (enabled + an image), reporting the others.
pub(super) fn resolved_catalogs(
    input: &RenderInput,
    pending: &mut Vec<Pending>,
) -> Vec<ResolvedCatalog> {
    let v = &input.valid;
    let mut out = Vec::new();
    for c in &v.enabled_catalogs {
        if let Some(pin) = v.catalog_pins.get(c) {
            out.push(ResolvedCatalog {
                catalog: *c,
                image: crate::catalogs::CatalogImage::pinned(pin),
                shared: None,
            });
            continue;
        }
        match input.catalog_images.get(c) {
            Some(Ok(img)) => {
                if let Some(message) = input
                    .held_catalogs
                    .iter()
                    .find(|h| h.catalog == *c)
                    .and_then(crate::last_good::Held::message)
                {
                    pending.push(Pending {
                        component: names::catalog(*c),
                        reason: crate::last_good::HELD_REASON,
                        severity: Severity::Degraded,
                        message,
                    });
                }
                if img.fell_back {
                    pending.push(Pending {
                        component: names::catalog(*c),
                        reason: "CatalogVersionFallback",
                        severity: Severity::Progressing,
                        message: format!(
                            "no {} catalog for {}; using {}",
                            c,
                            v.catalog_minor(),
                            img.version
                        ),
                    });
                }
                out.push(ResolvedCatalog {
                    catalog: *c,
                    image: img.clone(),
                    shared: crate::sharing::decide(v, *c, Some(img)).key().cloned(),
                })
            }
            Some(Err(e @ crate::catalogs::CatalogImageError::Pending { .. })) => {
                pending.push(Pending {
                    component: names::catalog(*c),
                    reason: "CatalogImageUnresolved",
                    severity: Severity::Progressing,
                    message: e.to_string(),
                })
            }
            Some(Err(e)) => pending.push(Pending {
                component: names::catalog(*c),
                reason: match e {
                    crate::catalogs::CatalogImageError::Unauthorized { .. } => {
                        "CatalogImageUnauthorized"
                    }
                    _ => "CatalogImageUnavailable",
                },
                severity: Severity::Degraded,
                message: e.to_string(),
            }),
            None => pending.push(Pending {
                component: names::catalog(*c),
                reason: "CatalogImageUnresolved",
                severity: Severity::Progressing,
                message: format!("the {c} catalog image has not been resolved yet"),
            }),
        }
    }
    out
}

pub(super) fn owner(input: &RenderInput) -> Option<&super::Owner> {
    input.owner.as_ref()
}

pub(super) fn ns(input: &RenderInput) -> &str {
    &input.valid.cluster.hcp_namespace
}

fn push(out: &mut Desired, body: Value, plural: &str) {
    out.hcp.push(Object::new(body, plural, ApplyPolicy::Apply));
}

fn sha(data: &[u8]) -> String {
    hex(&Sha256::digest(data))
}

fn rfc3339(t: time::OffsetDateTime) -> String {
    t.format(&Rfc3339).unwrap_or_default()
}

/// Hash of a set of named inputs, for the config-hash annotation.
pub(super) fn config_hash(parts: &BTreeMap<String, String>) -> String {
    let mut h = Sha256::new();
    for (k, v) in parts {
        h.update(k.as_bytes());
        h.update(b"=");
        h.update(v.as_bytes());
        h.update(b"\n");
    }
    hex(&h.finalize()[..16])
}

fn hash_secret_data(data: &BTreeMap<&str, &str>) -> String {
    let mut h = Sha256::new();
    for (k, v) in data {
        h.update(k.as_bytes());
        h.update(b"=");
        h.update(v.as_bytes());
        h.update(b"\n");
    }
    hex(&h.finalize())
}

fn tls_secret(
    input: &RenderInput,
    name: &str,
    component: &str,
    cert: &CertMaterial,
    ca_pem: Option<&str>,
    extra_annotations: &[(&str, String)],
) -> (Value, String) {
    let mut data: BTreeMap<&str, &str> = BTreeMap::from([
        ("tls.crt", cert.cert_pem.as_str()),
        ("tls.key", cert.key_pem.as_str()),
    ]);
    if let Some(ca) = ca_pem {
        data.insert("ca.crt", ca);
    }
    let hash = hash_secret_data(&data);
    let mut meta = metadata(&input.valid, name, Some(ns(input)), component, owner(input));
    meta["annotations"][labels::NOT_BEFORE_ANNOTATION] = json!(rfc3339(cert.not_before));
    meta["annotations"][labels::NOT_AFTER_ANNOTATION] = json!(rfc3339(cert.not_after));
    for (k, v) in extra_annotations {
        meta["annotations"][*k] = json!(v);
    }
    let encoded: BTreeMap<&str, String> = data.iter().map(|(k, v)| (*k, B64.encode(v))).collect();
    (
        json!({
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": meta,
            "type": "kubernetes.io/tls",
            "data": encoded,
        }),
        hash,
    )
}

/// NO_PROXY for OLM pods: the guest API server and, in management placement, the
/// management-side catalog Services are dialled directly; everything else (guest
/// catalog Services) goes through the tunnel gateway's SOCKS5 proxy.
pub(super) fn no_proxy(v: &ValidInput, catalogs: &[ResolvedCatalog]) -> String {
    let mut hosts = vec![
        "kube-apiserver".to_string(),
        format!("kube-apiserver.{}.svc", v.cluster.hcp_namespace),
    ];
    if v.placement == CatalogPlacement::Management && v.hypershift_take_over {
        // HyperShift's catalog Services, which its CatalogSources name (`redhat-operators:50051`)
        for c in crate::catalogs::DefaultCatalog::ALL {
            hosts.push(c.name().to_string());
            hosts.push(format!("{}.{}.svc", c.name(), v.cluster.hcp_namespace));
        }
    }
    if v.placement == CatalogPlacement::Management {
        for c in catalogs {
            match &c.shared {
                Some(k) => hosts.push(k.host()),
                None => {
                    hosts.push(names::catalog(c.catalog));
                    hosts.push(format!(
                        "{}.{}.svc",
                        names::catalog(c.catalog),
                        v.cluster.hcp_namespace
                    ));
                }
            }
        }
    }
    hosts.join(",")
}

fn grpc_proxy() -> String {
    format!("socks5://{}:{}", names::TUNNEL_GATEWAY, ports::SOCKS)
}

fn tolerations(v: &ValidInput) -> Value {
    let mut t = vec![
        json!({"key": "hypershift.openshift.io/control-plane", "operator": "Equal", "value": "true", "effect": "NoSchedule"}),
        json!({"key": "hypershift.openshift.io/cluster", "operator": "Equal", "value": v.cluster.hcp_namespace, "effect": "NoSchedule"}),
    ];
    for tol in &v.tolerations {
        t.push(serde_json::to_value(tol).unwrap_or(Value::Null));
    }
    Value::Array(t)
}

fn affinity(v: &ValidInput) -> Value {
    json!({
        "nodeAffinity": {
            "preferredDuringSchedulingIgnoredDuringExecution": [
                {"weight": 50, "preference": {"matchExpressions": [
                    {"key": "hypershift.openshift.io/control-plane", "operator": "In", "values": ["true"]}]}},
                {"weight": 100, "preference": {"matchExpressions": [
                    {"key": "hypershift.openshift.io/cluster", "operator": "In", "values": [v.cluster.hcp_namespace]}]}},
            ]
        },
        "podAffinity": {
            "preferredDuringSchedulingIgnoredDuringExecution": [
                {"weight": 100, "podAffinityTerm": {
                    "labelSelector": {"matchLabels": {labels::HCP_POD_LABEL: v.cluster.hcp_namespace}},
                    "topologyKey": "kubernetes.io/hostname"}},
            ]
        }
    })
}

/// HyperShift's spread of a highly available component's replicas: at most one per node
/// (required) and one per zone (required, or preferred where zones may be missing).
fn spread_replicas(deployment: &mut Value, name: &str, zone_required: bool) {
    let term = |topology: &str| json!({"labelSelector": {"matchLabels": selector(name)}, "topologyKey": topology});
    let mut required = vec![term("kubernetes.io/hostname")];
    let mut anti = json!({});
    if zone_required {
        required.insert(0, term("topology.kubernetes.io/zone"));
    } else {
        anti["preferredDuringSchedulingIgnoredDuringExecution"] =
            json!([{"weight": 100, "podAffinityTerm": term("topology.kubernetes.io/zone")}]);
    }
    anti["requiredDuringSchedulingIgnoredDuringExecution"] = Value::Array(required);
    deployment["spec"]["template"]["spec"]["affinity"]["podAntiAffinity"] = anti;
}

/// catalog-operator / olm-operator serve health and metrics over TLS on 8443 (instead of
/// HTTP on 8080) with the flags HyperShift passes: `--tls-cert`, `--tls-key`, and
/// `--client-ca` (our CA: the metrics client certificate is signed by it). The certificate
/// Secret's hash joins the config hash, so a new certificate rolls the pods.
fn serve_metrics_over_tls(deployment: &mut Value, secret: &str, cert_hash: &str) {
    const DIR: &str = "/srv-cert";
    let pod = &mut deployment["spec"]["template"];
    let old = pod["metadata"]["annotations"][labels::CONFIG_HASH_ANNOTATION]
        .as_str()
        .unwrap_or_default()
        .to_string();
    pod["metadata"]["annotations"][labels::CONFIG_HASH_ANNOTATION] =
        json!(config_hash(&BTreeMap::from([
            ("base".to_string(), old),
            (secret.to_string(), cert_hash.to_string())
        ])));
    if let Some(v) = pod["spec"]["volumes"].as_array_mut() {
        v.push(json!({"name": "srv-cert", "secret": {"secretName": secret, "defaultMode": 0o440}}));
    }
    let c = &mut pod["spec"]["containers"][0];
    if let Some(a) = c["args"].as_array_mut() {
        for (flag, file) in [
            ("--tls-cert", "tls.crt"),
            ("--tls-key", "tls.key"),
            ("--client-ca", "ca.crt"),
        ] {
            a.push(json!(flag));
            a.push(json!(format!("{DIR}/{file}")));
        }
    }
    c["ports"] =
        json!([{"name": "metrics", "containerPort": ports::OLM_METRICS_TLS, "protocol": "TCP"}]);
    c["livenessProbe"] = http_probe("/healthz", ports::OLM_METRICS_TLS, "HTTPS", 60, 3);
    c["readinessProbe"] = http_probe("/healthz", ports::OLM_METRICS_TLS, "HTTPS", 0, 3);
    if let Some(m) = c["volumeMounts"].as_array_mut() {
        m.push(json!({"name": "srv-cert", "mountPath": DIR, "readOnly": true}));
    }
}

/// A ServiceMonitor scraping an OLM operator's metrics Service over TLS with our metrics
/// client certificate, verifying the server against our CA (as HyperShift's do, with its
/// annotations naming the metrics job).
fn service_monitor(input: &RenderInput, deployment: &str, component: &str, service: &str) -> Value {
    let v = &input.valid;
    let mut meta = metadata(v, deployment, Some(ns(input)), component, owner(input));
    meta["annotations"]["hypershift.openshift.io/metrics-job"] = json!(service);
    meta["annotations"]["hypershift.openshift.io/metrics-namespace"] =
        json!("openshift-operator-lifecycle-manager");
    meta["annotations"]["hypershift.openshift.io/metrics-service"] = json!(service);
    meta["annotations"]["hypershift.openshift.io/metrics-endpoint"] = json!("https-metrics");
    let mut endpoint = json!({
        "scheme": "https",
        "targetPort": "metrics",
        "tlsConfig": {
            "ca": {"secret": {"name": names::METRICS_CLIENT, "key": "ca.crt"}},
            "cert": {"secret": {"name": names::METRICS_CLIENT, "key": "tls.crt"}},
            "keySecret": {"name": names::METRICS_CLIENT, "key": "tls.key"},
            "serverName": service,
        },
    });
    // As HyperShift labels its control plane's metrics: the cluster's ID as `_id`.
    if let Some(id) = &v.cluster_id {
        endpoint["relabelings"] =
            json!([{"action": "replace", "targetLabel": "_id", "replacement": id}]);
    }
    json!({
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "ServiceMonitor",
        "metadata": meta,
        "spec": {
            // the metrics Service (by its labels), not the pods
            "selector": {"matchLabels": selector(service)},
            "endpoints": [endpoint],
        },
    })
}

pub(super) fn container_security() -> Value {
    json!({
        "allowPrivilegeEscalation": false,
        "readOnlyRootFilesystem": true,
        "runAsNonRoot": true,
        "capabilities": {"drop": ["ALL"]},
    })
}

/// The pod security context of every HCP Deployment: non-root, RuntimeDefault seccomp, and
/// where no SCC assigns them, HyperShift's default user and fsGroup.
fn pod_security(input: &RenderInput) -> Value {
    let mut sc = json!({"runAsNonRoot": true, "seccompProfile": {"type": "RuntimeDefault"}});
    if !input.management_has_scc {
        sc["runAsUser"] = json!(super::DEFAULT_POD_USER);
        sc["fsGroup"] = json!(super::DEFAULT_POD_USER);
    }
    sc
}

fn pod_labels(v: &ValidInput, name: &str, component: &str) -> Value {
    let mut l: BTreeMap<String, String> = v.labels.clone();
    l.extend(labels::object_labels(v, component, name));
    l.insert(
        labels::HCP_POD_LABEL.to_string(),
        v.cluster.hcp_namespace.clone(),
    );
    json!(l)
}

struct PodSpec<'a> {
    name: &'a str,
    component: &'a str,
    replicas: i32,
    service_account: &'a str,
    automount_token: bool,
    priority_class: &'a str,
    init_containers: Vec<Value>,
    containers: Vec<Value>,
    volumes: Vec<Value>,
    config_hash: String,
    image_pull_secrets: Vec<String>,
    strategy: Option<Value>,
    termination_grace_seconds: Option<i64>,
}

fn deployment(input: &RenderInput, mut p: PodSpec<'_>) -> Value {
    let v = &input.valid;
    // A container that fails says why in its status (the tail of its log), which HostedOLM
    // passes on (`runtime::pods`).
    for c in p.containers.iter_mut().chain(p.init_containers.iter_mut()) {
        c["terminationMessagePolicy"] = json!("FallbackToLogsOnError");
    }
    hypershift_knobs(v, &mut p);
    let annotations = pod_annotations(v, &p);
    let mut pod_spec = json!({
        "serviceAccountName": p.service_account,
        "automountServiceAccountToken": p.automount_token,
        "priorityClassName": priority_class(v, p.priority_class),
        "securityContext": pod_security(input),
        "tolerations": tolerations(v),
        "affinity": affinity(v),
        "containers": p.containers,
        "volumes": p.volumes,
    });
    if !p.init_containers.is_empty() {
        pod_spec["initContainers"] = Value::Array(p.init_containers);
    }
    if !v.node_selector.is_empty() {
        pod_spec["nodeSelector"] = json!(v.node_selector);
    }
    if let Some(g) = p.termination_grace_seconds {
        pod_spec["terminationGracePeriodSeconds"] = json!(g);
    }
    if !p.image_pull_secrets.is_empty() {
        pod_spec["imagePullSecrets"] = Value::Array(
            p.image_pull_secrets
                .iter()
                .map(|n| json!({"name": n}))
                .collect(),
        );
    }
    let mut spec = json!({
        "replicas": p.replicas,
        "revisionHistoryLimit": 2,
        "selector": {"matchLabels": selector(p.name)},
        "template": {
            "metadata": {
                "labels": pod_labels(v, p.name, p.component),
                "annotations": annotations,
            },
            "spec": pod_spec,
        }
    });
    if let Some(s) = p.strategy {
        spec["strategy"] = s;
    }
    json!({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": metadata(v, p.name, Some(ns(input)), p.component, owner(input)),
        "spec": spec,
    })
}

/// The priority class HyperShift's annotations name in place of `default`, if any.
fn priority_class<'a>(v: &'a ValidInput, default: &'a str) -> &'a str {
    let k = &v.knobs;
    let chosen = match default {
        CONTROL_PLANE_PRIORITY => k.control_plane_priority_class.as_deref(),
        API_CRITICAL_PRIORITY => k.api_critical_priority_class.as_deref(),
        _ => None,
    };
    chosen.unwrap_or(default)
}

/// HyperShift's resource request overrides (`crate::knobs`), applied as its
/// control-plane-operator applies them to its own Deployments.
fn hypershift_knobs(v: &ValidInput, p: &mut PodSpec<'_>) {
    let k = &v.knobs;
    let Some(theirs) = crate::knobs::hypershift_deployment_name(p.name) else {
        return;
    };
    for c in p.containers.iter_mut().chain(p.init_containers.iter_mut()) {
        let name = c["name"].as_str().unwrap_or_default();
        let key = (
            theirs.clone(),
            crate::knobs::hypershift_container_name(name).to_string(),
        );
        let Some(requests) = k.requests.get(&key) else {
            continue;
        };
        for (resource, quantity) in requests {
            c["resources"]["requests"][resource] = json!(quantity);
            // Where we set a limit (the catalog servers' memory, limit = request for
            // Guaranteed QoS), it follows the request: a request above its limit would be
            // refused at admission.
            if c["resources"]["limits"].get(resource).is_some() {
                c["resources"]["limits"][resource] = json!(quantity);
            }
        }
    }
}

/// The pod template's annotations: our config hash, HyperShift's restart date, and, as
/// HyperShift marks its own, the local volumes the cluster autoscaler may drop on eviction.
fn pod_annotations(v: &ValidInput, p: &PodSpec<'_>) -> Value {
    let mut a = serde_json::Map::new();
    a.insert(
        labels::CONFIG_HASH_ANNOTATION.to_string(),
        json!(p.config_hash),
    );
    if let Some(d) = &v.knobs.restart_date {
        a.insert(crate::knobs::RESTART_DATE.to_string(), json!(d));
    }
    let local: Vec<&str> = p
        .volumes
        .iter()
        .filter(|vol| vol.get("emptyDir").is_some() || vol.get("hostPath").is_some())
        .filter_map(|vol| vol["name"].as_str())
        .collect();
    if !local.is_empty() {
        a.insert(
            crate::knobs::SAFE_TO_EVICT_LOCAL_VOLUMES.to_string(),
            json!(local.join(",")),
        );
    }
    Value::Object(a)
}

fn service(
    input: &RenderInput,
    name: &str,
    component: &str,
    sel: &str,
    ports: Value,
    type_: &str,
) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": metadata(&input.valid, name, Some(ns(input)), component, owner(input)),
        "spec": {"type": type_, "selector": selector(sel), "ports": ports},
    })
}

fn service_account(
    input: &RenderInput,
    name: &str,
    component: &str,
    pull_secret: Option<&str>,
) -> Value {
    let mut sa = json!({
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": metadata(&input.valid, name, Some(ns(input)), component, owner(input)),
        "automountServiceAccountToken": false,
    });
    if let Some(ps) = pull_secret {
        sa["imagePullSecrets"] = json!([{"name": ps}]);
    }
    sa
}

fn kubeconfig_volume(v: &ValidInput) -> Value {
    json!({"name": "kubeconfig", "secret": {"secretName": v.kubeconfig_secret, "defaultMode": 0o440}})
}

fn tmp_volume() -> Value {
    json!({"name": "tmp", "emptyDir": {}})
}

fn http_probe(path: &str, port: u16, scheme: &str, initial: i32, failure: i32) -> Value {
    without_zero_delay(json!({
        "httpGet": {"path": path, "port": port, "scheme": scheme},
        "initialDelaySeconds": initial,
        "periodSeconds": 10,
        "timeoutSeconds": 5,
        "failureThreshold": failure,
    }))
}

/// The API server drops `initialDelaySeconds: 0` (its default), so rendering it would
/// make every applied Deployment look changed on every reconcile.
pub(super) fn without_zero_delay(mut probe: Value) -> Value {
    if probe["initialDelaySeconds"] == json!(0)
        && let Some(o) = probe.as_object_mut()
    {
        o.remove("initialDelaySeconds");
    }
    probe
}

pub(super) fn resources(cpu: &str, memory: &str) -> Value {
    json!({"requests": {"cpu": cpu, "memory": memory}})
}

/// An ingress-only NetworkPolicy in the HCP namespace: `target`'s pods accept `ports`
/// from `from`.
fn ingress_policy(
    input: &RenderInput,
    name: &str,
    component: &str,
    target: &str,
    from: Value,
    ports: Value,
) -> Value {
    json!({
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": metadata(&input.valid, name, Some(ns(input)), component, owner(input)),
        "spec": {
            "podSelector": {"matchLabels": selector(target)},
            "policyTypes": ["Ingress"],
            "ingress": [{"from": from, "ports": ports}],
        }
    })
}

/// Every HCP-namespace object of one cluster, component by component, in the order the
/// golden files fix: ServiceAccounts, Secrets, NetworkPolicies, Services, Deployments.
pub(super) fn render(
    input: &RenderInput,
    catalogs: &[ResolvedCatalog],
    out: &mut Desired,
) -> Result<(), RenderError> {
    let v = &input.valid;
    let kubeconfig_path = format!("{KUBECONFIG_DIR}/{}", v.kubeconfig_key);
    let kubeconfig_hash = input
        .external_secret_hashes
        .get(&v.kubeconfig_secret)
        .cloned()
        .unwrap_or_else(|| "absent".to_string());
    olm::wait_for_guest_crds(input, out);

    olm::service_accounts(input, out);
    gateway::service_account(input, out);
    catalogs::service_account(input, catalogs, out);

    let packageserver_cert_hash = olm::pki_secrets(input, out);
    let metrics_hashes = olm::metrics_secrets(input, out);
    let gw_hash = gateway::secret(input, catalogs, out)?;

    // The pods that dial catalogs.
    let olm_clients = json!([
        {"podSelector": {"matchLabels": selector(names::CATALOG_OPERATOR)}},
        {"podSelector": {"matchLabels": selector(names::OLM_OPERATOR)}},
        {"podSelector": {"matchLabels": selector(names::PACKAGESERVER)}},
        {"podSelector": {"matchLabels": selector(names::TUNNEL_GATEWAY)}},
    ]);
    catalogs::network_policies(input, catalogs, &olm_clients, out);
    olm::network_policy(input, out);
    gateway::network_policy(input, catalogs, olm_clients, out);

    olm::services(input, out);
    catalogs::services(input, catalogs, out);
    gateway::services(input, out);

    // Deployments: tunnel gateway first (OLM needs it for guest catalogs).
    gateway::deployment_and_pdb(input, gw_hash, out);
    catalogs::deployments(input, catalogs, out)?;
    olm::render(
        &olm::Shared {
            input,
            catalogs,
            kubeconfig_path: &kubeconfig_path,
            kubeconfig_hash: &kubeconfig_hash,
            metrics_hashes: &metrics_hashes,
            packageserver_cert_hash: &packageserver_cert_hash,
        },
        out,
    );
    // Last: it reads the readers' pod labels from the Deployments rendered above, and goes
    // in with the other NetworkPolicies (applied before the Deployments).
    catalogs::shared_catalog_egress(input, catalogs, out);
    Ok(())
}

/// A gRPC probe of a catalog server's port (pure).
pub(super) fn grpc_probe(initial: i32, timeout: i32, period: i32, failure: i32) -> Value {
    without_zero_delay(json!({
        "grpc": {"port": ports::CATALOG_GRPC},
        "initialDelaySeconds": initial,
        "timeoutSeconds": timeout,
        "periodSeconds": period,
        "failureThreshold": failure,
    }))
}

/// Our catalog server's container, serving the catalog extracted to `/extracted-catalog`
/// (pure; a hosted cluster's own copy and a shared catalog run the same one).
pub(super) fn catalog_server_container(image: &str, memory: &str) -> Value {
    json!({
        "name": "catalog-server",
        "image": image,
        "imagePullPolicy": "IfNotPresent",
        "command": ["/usr/bin/hcp-olm-catalog-server"],
        "args": [
            "--catalog=/extracted-catalog/catalog",
            format!("--listen=0.0.0.0:{}", ports::CATALOG_GRPC),
            "--log-format=json",
            "--shutdown-timeout=10s",
        ],
        "ports": [{"name": "grpc", "containerPort": ports::CATALOG_GRPC, "protocol": "TCP"}],
        "readinessProbe": grpc_probe(0, 1, 5, 3),
        "livenessProbe": grpc_probe(10, 1, 10, 3),
        "startupProbe": grpc_probe(0, 1, 2, 60),
        // Limit = request (issue 35 item 2): the request was sized for opm, about ten times
        // what our server holds; under the attack of catalog/tests/dos.rs (one client
        // flooding, the others measured) the server on the large catalog peaked far below
        // the smallest of them (docs/catalog-server.md "Limits"), so one tenant cannot grow
        // a shared server until the node evicts something else.
        "resources": {"requests": {"cpu": "10m", "memory": memory}, "limits": {"memory": memory}},
        "securityContext": container_security(),
        "volumeMounts": [
            {"name": "catalog-content", "mountPath": "/extracted-catalog", "readOnly": true},
            {"name": "tmp", "mountPath": "/tmp"},
        ],
    })
}
