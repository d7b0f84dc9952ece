//! The OLM operators in the HCP namespace: catalog-operator, olm-operator and
//! packageserver (its Deployment and PodDisruptionBudget). What each runs, its knobs
//! (replicas, availability, priority class, resources) and its hashes are here; the
//! renderer in `hcp.rs` supplies what they share ([`Shared`]) and pushes them in order.

use std::collections::BTreeMap;

use serde_json::{Value, json};

use base64::Engine;
use base64::engine::general_purpose::STANDARD as B64;

use super::super::labels::{self, metadata, selector};
use super::super::{Desired, Pending, RenderInput, names, ports};
use super::{
    API_CRITICAL_PRIORITY, CONTROL_PLANE_PRIORITY, GLOBAL_CATALOG_NAMESPACE, KUBECONFIG_DIR,
    PACKAGESERVER_CERT_DIR, PodSpec, ResolvedCatalog, config_hash, container_security, deployment,
    grpc_proxy, http_probe, kubeconfig_volume, no_proxy, owner, resources, serve_metrics_over_tls,
    spread_replicas, tmp_volume,
};
use crate::validate::{AvailabilityPolicy, Severity};

/// What the three OLM Deployments share, computed by the renderer.
pub(super) struct Shared<'a> {
    pub input: &'a RenderInput,
    pub catalogs: &'a [ResolvedCatalog],
    /// Path of the guest kubeconfig in the pods.
    pub kubeconfig_path: &'a str,
    /// Hash of the guest kubeconfig Secret ("absent" when it does not exist).
    pub kubeconfig_hash: &'a str,
    /// Hashes of the metrics serving certificate Secrets, by Secret name.
    pub metrics_hashes: &'a BTreeMap<&'a str, String>,
    /// Hash of our packageserver serving certificate Secret.
    pub packageserver_cert_hash: &'a str,
}

impl Shared<'_> {
    /// OLM runs only once the guest serves its CRDs: 0 replicas until then.
    fn replicas(&self, n: i32) -> i32 {
        if self.input.guest_olm_crds_ready {
            n
        } else {
            0
        }
    }

    fn env(&self, extra: Vec<Value>) -> Value {
        let v = &self.input.valid;
        let mut env = extra;
        env.push(json!({"name": "RELEASE_VERSION", "value": v.release_version.to_string()}));
        env.push(json!({"name": "KUBECONFIG", "value": self.kubeconfig_path}));
        env.push(json!({"name": "GRPC_PROXY", "value": grpc_proxy()}));
        env.push(json!({"name": "NO_PROXY", "value": no_proxy(v, self.catalogs)}));
        Value::Array(env)
    }

    fn kube_mount(&self) -> Value {
        json!({"name": "kubeconfig", "mountPath": KUBECONFIG_DIR, "readOnly": true})
    }

    fn tmp_mount(&self) -> Value {
        json!({"name": "tmp", "mountPath": "/tmp"})
    }

    /// The config hash of catalog-operator and olm-operator: the guest kubeconfig.
    fn operator_hash(&self) -> String {
        config_hash(&BTreeMap::from([(
            self.input.valid.kubeconfig_secret.clone(),
            self.kubeconfig_hash.to_string(),
        )]))
    }
}

/// Pushes the OLM operators' Deployments and packageserver's PodDisruptionBudget.
pub(super) fn render(s: &Shared<'_>, out: &mut Desired) {
    super::push(out, catalog_operator(s), "deployments");
    super::push(out, olm_operator(s), "deployments");
    let ps = packageserver(s, out);
    super::push(out, ps, "deployments");
    if let Some(pdb) = packageserver_pdb(s.input) {
        super::push(out, pdb, "poddisruptionbudgets");
    }
}

/// catalog-operator: pflag double-dash flags; --kubeconfig is a real flag here.
fn catalog_operator(s: &Shared<'_>) -> Value {
    let v = &s.input.valid;
    operator(
        s,
        Operator {
            name: names::CATALOG_OPERATOR,
            component: "catalog-operator",
            command: "/bin/catalog",
            args: json!([
                "--namespace",
                GLOBAL_CATALOG_NAMESPACE,
                "--configmapServerImage",
                v.images.operator_registry,
                "--opmImage",
                v.images.operator_registry,
                "--util-image",
                v.images.olm,
                "--writeStatusName",
                "operator-lifecycle-manager-catalog",
                "--kubeconfig",
                s.kubeconfig_path,
            ]),
            env: vec![],
            memory: "80Mi",
            metrics_cert: names::CATALOG_OPERATOR_METRICS_CERT,
        },
    )
}

/// olm-operator: NO --kubeconfig flag (controller-runtime reads KUBECONFIG).
fn olm_operator(s: &Shared<'_>) -> Value {
    operator(
        s,
        Operator {
            name: names::OLM_OPERATOR,
            component: "olm-operator",
            command: "/bin/olm",
            args: json!([
                "--namespace",
                "$(OPERATOR_NAMESPACE)",
                "--writeStatusName",
                "operator-lifecycle-manager",
                "--writePackageServerStatusName=",
            ]),
            env: vec![
                json!({"name": "OPERATOR_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}}),
                json!({"name": "OPERATOR_NAME", "value": "olm-operator"}),
            ],
            memory: "160Mi",
            metrics_cert: names::OLM_OPERATOR_METRICS_CERT,
        },
    )
}

/// What tells catalog-operator and olm-operator apart; the rest of their Deployments is
/// the same (one replica, the OLM image, health and metrics on one port, the guest
/// kubeconfig, metrics over TLS when its certificate exists).
struct Operator<'a> {
    name: &'a str,
    component: &'a str,
    command: &'a str,
    args: Value,
    env: Vec<Value>,
    memory: &'a str,
    metrics_cert: &'a str,
}

fn operator(s: &Shared<'_>, o: Operator<'_>) -> Value {
    let (input, v) = (s.input, &s.input.valid);
    let mut d = deployment(
        input,
        PodSpec {
            name: o.name,
            component: o.component,
            replicas: s.replicas(1),
            service_account: o.name,
            automount_token: false,
            priority_class: CONTROL_PLANE_PRIORITY,
            init_containers: vec![],
            containers: vec![json!({
                "name": o.component,
                "image": v.images.olm,
                "imagePullPolicy": "IfNotPresent",
                "command": [o.command],
                "args": o.args,
                "env": s.env(o.env),
                "ports": [{"name": "http-metrics", "containerPort": ports::OLM_HEALTH_METRICS, "protocol": "TCP"}],
                "livenessProbe": http_probe("/healthz", ports::OLM_HEALTH_METRICS, "HTTP", 60, 3),
                "readinessProbe": http_probe("/healthz", ports::OLM_HEALTH_METRICS, "HTTP", 0, 3),
                "resources": resources("10m", o.memory),
                "securityContext": container_security(),
                "volumeMounts": [s.kube_mount(), s.tmp_mount()],
            })],
            volumes: vec![kubeconfig_volume(v), tmp_volume()],
            config_hash: s.operator_hash(),
            image_pull_secrets: vec![],
            strategy: None,
            termination_grace_seconds: None,
        },
    );
    if let Some(h) = s.metrics_hashes.get(o.metrics_cert) {
        serve_metrics_over_tls(&mut d, o.metrics_cert, h);
    }
    d
}

/// packageserver: aggregated API server on 5443 with our serving cert (HyperShift's
/// under TakeOver; a missing one is reported in `out.pending`).
fn packageserver(s: &Shared<'_>, out: &mut Desired) -> Value {
    let (input, v) = (s.input, &s.input.valid);
    let (ps_replicas, ps_strategy) = match v.availability {
        AvailabilityPolicy::SingleReplica => (1, None),
        AvailabilityPolicy::HighlyAvailable => (
            if v.ibm_cloud { 2 } else { 3 },
            Some(
                json!({"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1}}),
            ),
        ),
    };
    let mut ps_hash_parts =
        BTreeMap::from([(v.kubeconfig_secret.clone(), s.kubeconfig_hash.to_string())]);
    // TakeOver: ours serves HyperShift's certificate (its root CA is in the guest APIService
    // its hosted-cluster-config-operator writes); otherwise ours, signed by our CA.
    let serving_cert_secret = if v.hypershift_take_over {
        let h = match input
            .external_secret_hashes
            .get(names::HYPERSHIFT_PACKAGESERVER_CERT)
        {
            Some(h) => h.clone(),
            None => {
                // Our pods would wait for the volume without saying why: say it here.
                out.pending.push(Pending {
                    component: "packageserver".into(),
                    reason: "WaitingForHyperShiftPackageServerCert",
                    severity: Severity::Progressing,
                    message: format!(
                        "taking over from HyperShift's OLM, packageserver serves HyperShift's certificate, but Secret {}/{} does not exist (HyperShift's control-plane-operator makes it)",
                        v.cluster.hcp_namespace,
                        names::HYPERSHIFT_PACKAGESERVER_CERT
                    ),
                });
                "absent".to_string()
            }
        };
        ps_hash_parts.insert(names::HYPERSHIFT_PACKAGESERVER_CERT.to_string(), h);
        names::HYPERSHIFT_PACKAGESERVER_CERT
    } else {
        ps_hash_parts.insert(
            names::PACKAGESERVER_CERT.to_string(),
            s.packageserver_cert_hash.to_string(),
        );
        names::PACKAGESERVER_CERT
    };
    let mut ps_containers = vec![json!({
        "name": "packageserver",
        "image": v.images.olm,
        "imagePullPolicy": "IfNotPresent",
        "command": ["/bin/package-server"],
        "args": [
            "--v=2",
            "--secure-port", ports::PACKAGESERVER.to_string(),
            "--global-namespace", GLOBAL_CATALOG_NAMESPACE,
            "--kubeconfig", s.kubeconfig_path,
            "--authentication-kubeconfig", s.kubeconfig_path,
            "--authorization-kubeconfig", s.kubeconfig_path,
            "--tls-cert-file", format!("{PACKAGESERVER_CERT_DIR}/tls.crt"),
            "--tls-private-key-file", format!("{PACKAGESERVER_CERT_DIR}/tls.key"),
        ],
        "env": s.env(vec![json!({"name": "OPERATOR_CONDITION_NAME", "value": "packageserver"})]),
        "ports": [{"name": "https", "containerPort": ports::PACKAGESERVER, "protocol": "TCP"}],
        "livenessProbe": http_probe("/healthz", ports::PACKAGESERVER, "HTTPS", 0, 10),
        "readinessProbe": http_probe("/healthz", ports::PACKAGESERVER, "HTTPS", 0, 3),
        "resources": resources("10m", "250Mi"),
        "securityContext": container_security(),
        "volumeMounts": [
            s.kube_mount(),
            {"name": "serving-cert", "mountPath": PACKAGESERVER_CERT_DIR, "readOnly": true},
            s.tmp_mount(),
        ],
    })];
    // The guest API server's TLS profile (validated), as HyperShift passes it on.
    if let Some(a) = ps_containers[0]["args"].as_array_mut() {
        a.extend(v.packageserver_tls_args.iter().map(|s| json!(s)));
    }
    let mut packageserver = deployment(
        input,
        PodSpec {
            name: names::PACKAGESERVER,
            component: "packageserver",
            replicas: s.replicas(ps_replicas),
            service_account: names::PACKAGESERVER,
            // HyperShift mounts a token for packageserver: its delegating authorizer
            // builds one in-cluster client even with --authorization-kubeconfig.
            automount_token: true,
            priority_class: API_CRITICAL_PRIORITY,
            init_containers: vec![],
            containers: ps_containers,
            volumes: vec![
                kubeconfig_volume(v),
                json!({"name": "serving-cert", "secret": {"secretName": serving_cert_secret, "defaultMode": 0o440}}),
                tmp_volume(),
            ],
            config_hash: config_hash(&ps_hash_parts),
            image_pull_secrets: vec![],
            strategy: ps_strategy,
            termination_grace_seconds: None,
        },
    );
    if v.hypershift_take_over {
        // HyperShift's packageserver Service selects these labels: with its own pods kept
        // at 0, the ClusterIP its guest Endpoints point at reaches ours.
        let l = &mut packageserver["spec"]["template"]["metadata"]["labels"];
        l["app"] = json!("packageserver");
        l["hypershift.openshift.io/control-plane-component"] = json!("packageserver");
    }
    if v.availability == AvailabilityPolicy::HighlyAvailable {
        spread_replicas(
            &mut packageserver,
            names::PACKAGESERVER,
            v.zone_spread_required,
        );
    }
    packageserver
}

/// packageserver's PodDisruptionBudget: `maxUnavailable: 1` when highly available; none
/// for a single replica (as HyperShift renders it: `minAvailable: 1` on one pod allows no
/// eviction ever, so a node drain would never finish) and none under TakeOver, where our
/// pods carry HyperShift's labels and its `packageserver-pdb` covers them (a pod selected by
/// two PDBs cannot be evicted at all: the Eviction API answers 500).
fn packageserver_pdb(input: &RenderInput) -> Option<Value> {
    let v = &input.valid;
    if v.hypershift_take_over || v.availability == AvailabilityPolicy::SingleReplica {
        return None;
    }
    Some(json!({
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": metadata(v, names::PACKAGESERVER_PDB, Some(super::ns(input)), "packageserver", owner(input)),
        "spec": {
            "maxUnavailable": 1,
            "selector": {"matchLabels": selector(names::PACKAGESERVER)},
            "unhealthyPodEvictionPolicy": "AlwaysAllow",
        },
    }))
}

/// The OLM operators' metrics TLS Secrets (serving certificates, and the scrapers' client
/// certificate with the CA the ServiceMonitors verify the servers with), pushed; their
/// hashes by Secret name (for [`Shared::metrics_hashes`]).
pub(super) fn metrics_secrets(
    input: &RenderInput,
    out: &mut Desired,
) -> BTreeMap<&'static str, String> {
    let mut metrics_hashes: BTreeMap<&'static str, String> = BTreeMap::new();
    if let Some(m) = &input.pki.metrics {
        for (secret, component, cert, sans) in [
            (
                names::CATALOG_OPERATOR_METRICS_CERT,
                "catalog-operator",
                &m.catalog_operator,
                crate::certs::metrics_sans(
                    super::ns(input),
                    &names::metrics_service(names::CATALOG_OPERATOR),
                ),
            ),
            (
                names::OLM_OPERATOR_METRICS_CERT,
                "olm-operator",
                &m.olm_operator,
                crate::certs::metrics_sans(
                    super::ns(input),
                    &names::metrics_service(names::OLM_OPERATOR),
                ),
            ),
            (names::METRICS_CLIENT, "metrics", &m.client, Vec::new()),
        ] {
            let (body, hash) = super::tls_secret(
                input,
                secret,
                component,
                cert,
                Some(&input.pki.ca.cert_pem),
                &[(
                    super::labels::SANS_ANNOTATION,
                    crate::certs::sans_fingerprint(&sans),
                )],
            );
            super::push(out, body, "secrets");
            metrics_hashes.insert(secret, hash);
        }
    }
    metrics_hashes
}

/// The OLM operators' metrics Services (and ServiceMonitors where the management cluster
/// serves them), pushed, unless HyperShift's disable-monitoring-services annotation is set.
fn metrics_services(input: &RenderInput, out: &mut Desired) {
    let v = &input.valid;
    let metrics_tls = input.pki.metrics.is_some();
    for (name, component) in [
        (names::CATALOG_OPERATOR, "catalog-operator"),
        (names::OLM_OPERATOR, "olm-operator"),
    ] {
        if v.monitoring_disabled {
            continue;
        }
        let svc = names::metrics_service(name);
        let port = if metrics_tls {
            json!([{"name": "https-metrics", "protocol": "TCP", "port": ports::OLM_METRICS_TLS, "targetPort": "metrics"}])
        } else {
            json!([{"name": "http-metrics", "protocol": "TCP", "port": ports::OLM_HEALTH_METRICS, "targetPort": ports::OLM_HEALTH_METRICS}])
        };
        super::push(
            out,
            super::service(input, &svc, component, name, port, "ClusterIP"),
            "services",
        );
        if metrics_tls && input.service_monitors_served {
            super::push(
                out,
                super::service_monitor(input, name, component, &svc),
                "servicemonitors",
            );
        }
    }
}

/// Says the OLM pods wait (0 replicas) while the guest does not serve the OLM CRDs.
pub(super) fn wait_for_guest_crds(input: &RenderInput, out: &mut Desired) {
    if !input.guest_olm_crds_ready {
        out.pending.push(Pending {
            component: "olm".into(),
            reason: "WaitingForGuestOLMCRDs",
            severity: Severity::Progressing,
            message:
                "the guest API server does not serve the OLM CRDs yet; OLM pods are scaled to 0"
                    .into(),
        });
    }
}

/// The three operators' ServiceAccounts. Each carries the HCP namespace's pull secret, as
/// HyperShift's OLM ServiceAccounts do, so nodes without an OpenShift pull secret can pull
/// the images.
pub(super) fn service_accounts(input: &RenderInput, out: &mut Desired) {
    for (sa, component) in [
        (names::CATALOG_OPERATOR, "catalog-operator"),
        (names::OLM_OPERATOR, "olm-operator"),
        (names::PACKAGESERVER, "packageserver"),
    ] {
        super::push(
            out,
            super::service_account(input, sa, component, Some(&input.valid.pull_secret)),
            "serviceaccounts",
        );
    }
}

/// The CA Secret (persisted so the runtime can sign again, with the replaced CA while it is
/// still trusted) and packageserver's serving certificate; returns the latter's hash.
pub(super) fn pki_secrets(input: &RenderInput, out: &mut Desired) -> String {
    let (mut ca_secret, _) = super::tls_secret(input, names::CA, "pki", &input.pki.ca, None, &[]);
    if let Some(prev) = &input.pki.previous_ca_pem {
        // the replaced CA, trusted by the guest APIService until packageserver has rolled
        ca_secret["data"][super::PREVIOUS_CA_KEY] = json!(B64.encode(prev));
    }
    super::push(out, ca_secret, "secrets");
    let (ps_secret, ps_hash) = super::tls_secret(
        input,
        names::PACKAGESERVER_CERT,
        "packageserver",
        &input.pki.packageserver,
        Some(&input.pki.ca.cert_pem),
        &[(
            labels::SANS_ANNOTATION,
            input.pki.packageserver_sans_fingerprint.clone(),
        )],
    );
    super::push(out, ps_secret, "secrets");
    ps_hash
}

/// packageserver accepts its port from the whole namespace: the guest kube-apiserver runs
/// there and reaches it.
pub(super) fn network_policy(input: &RenderInput, out: &mut Desired) {
    super::push(
        out,
        super::ingress_policy(
            input,
            names::PACKAGESERVER,
            "packageserver",
            names::PACKAGESERVER,
            json!([{"podSelector": {}}]),
            json!([{"protocol": "TCP", "port": ports::PACKAGESERVER}]),
        ),
        "networkpolicies",
    );
}

/// The operators' metrics Services, then packageserver's Service.
pub(super) fn services(input: &RenderInput, out: &mut Desired) {
    metrics_services(input, out);
    super::push(
        out,
        super::service(
            input,
            names::PACKAGESERVER,
            "packageserver",
            names::PACKAGESERVER,
            json!([{"name": "https", "protocol": "TCP", "port": 443, "targetPort": ports::PACKAGESERVER}]),
            "ClusterIP",
        ),
        "services",
    );
}
