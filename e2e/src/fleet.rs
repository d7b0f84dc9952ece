//! A fleet of HostedClusters for the controller benchmark and the restart test: the
//! HostedCluster fixture as a template, one kubeconfig Secret + HostedCluster (+ status) +
//! labelled HCP namespace per cluster, and the controller's ServiceAccount with the RBAC
//! from `manifests/`.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use futures::StreamExt as _;

use anyhow::{Context as _, Result};
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{Endpoints, Secret};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
use kube::api::{Api, ApiResource, DynamicObject, Patch, PatchParams, PostParams};

use crate::guest_standin::GuestStandIn;
use crate::tools::fixtures_dir;
use crate::{Cluster, ClusterOptions, SharedEtcd};

/// Every resource the controller may write, in either cluster (the tests count writes to
/// these).
pub const RESOURCES: &[&str] = &[
    "deployments",
    "services",
    "serviceaccounts",
    "secrets",
    "networkpolicies",
    "poddisruptionbudgets",
    "hostedolms",
    "hostedclusters",
    "catalogsources",
    "apiservices",
    "endpoints",
    "endpointslices",
    "operatorhubs",
    "namespaces",
    "events",
    "servicemonitors",
    "subscriptions",
];
pub const HC_NS: &str = "clusters";
pub const OLM_IMAGE: &str = "quay.io/openshift-release-dev/ocp-v4.0-art-dev@sha256:aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
pub const RELEASE_IMAGE: &str = "quay.io/openshift-release-dev/ocp-release:4.18.3-x86_64";

/// The real registry standing in for quay.io and registry.redhat.io (reached through the
/// controller's `--registry-mirror`, as an administrator's mirror): the release of
/// [`RELEASE_IMAGE`] (label `io.openshift.release`, a payload whose image-references name
/// [`OLM_IMAGE`]) and the three default catalogs' `v4.18` indexes (tiny images: lookups
/// read only manifests and labels).
pub struct LocalRegistry {
    pub registry: crate::registry::Registry,
    /// The controller flags that make its lookups use this registry.
    pub controller_flags: Vec<String>,
}

impl LocalRegistry {
    pub async fn start() -> Result<Self> {
        use hcp_olm_oci::payload::{IMAGE_REFERENCES_PATH, OLM_COMPONENT, tar_gz};
        let registry = crate::registry::Registry::start()?;
        let a = registry.addr().to_string();
        let oci = hcp_olm_oci::Client::new(hcp_olm_oci::ClientOptions {
            plain_http: vec![a.clone()],
            timeout: Some(Duration::from_secs(20)),
            ..Default::default()
        })?;
        let refs = serde_json::to_vec(&serde_json::json!({
            "kind": "ImageStream", "apiVersion": "image.openshift.io/v1",
            "spec": {"tags": [
                {"name": OLM_COMPONENT, "from": {"kind": "DockerImage", "name": OLM_IMAGE}},
            ]},
        }))?;
        oci.push_image_with_layers(
            &RELEASE_IMAGE.replacen("quay.io", &a, 1),
            &BTreeMap::from([("io.openshift.release".to_string(), "4.18.3".to_string())]),
            &[tar_gz(&[(IMAGE_REFERENCES_PATH, &refs)])],
        )
        .await
        .context("pushing the release")?;
        for idx in [
            "redhat-operator-index",
            "certified-operator-index",
            "community-operator-index",
        ] {
            oci.push_image(&format!("{a}/redhat/{idx}:v4.18"), &BTreeMap::new())
                .await
                .with_context(|| format!("pushing {idx}"))?;
        }
        let controller_flags = vec![
            "--plain-http".into(),
            a.clone(),
            "--registry-mirror".into(),
            format!("registry.redhat.io/redhat={a}/redhat"),
            "--registry-mirror".into(),
            format!("quay.io/openshift-release-dev={a}/openshift-release-dev"),
            // The mirror answers without credentials; every test cluster may read it
            // (else the default registry, not reachable here, would be asked).
            "--registry-mirror-entitles=true".into(),
        ];
        Ok(Self {
            registry,
            controller_flags,
        })
    }
}

pub fn guest_crd_files() -> Vec<PathBuf> {
    let fx = fixtures_dir();
    vec![
        fx.join("crds/olm/operators.coreos.com_catalogsources.yaml"),
        fx.join("crds/olm/operators.coreos.com_clusterserviceversions.yaml"),
        fx.join("crds/openshift/0000_03_marketplace_01_operatorhubs.crd.yaml"),
    ]
}

pub fn yaml_docs(path: &PathBuf) -> Result<Vec<serde_json::Value>> {
    let text = std::fs::read_to_string(path).with_context(|| format!("{}", path.display()))?;
    let mut out = Vec::new();
    for doc in serde_yaml_ng::Deserializer::from_str(&text) {
        let v: serde_json::Value = serde::Deserialize::deserialize(doc)?;
        if !v.is_null() {
            out.push(v);
        }
    }
    Ok(out)
}

pub fn hc_resource() -> ApiResource {
    ApiResource {
        group: "hypershift.openshift.io".into(),
        version: "v1beta1".into(),
        api_version: "hypershift.openshift.io/v1beta1".into(),
        kind: "HostedCluster".into(),
        plural: "hostedclusters".into(),
    }
}

pub fn holm_resource() -> ApiResource {
    ApiResource {
        group: "olm.hcp-olm.io".into(),
        version: "v1alpha1".into(),
        api_version: "olm.hcp-olm.io/v1alpha1".into(),
        kind: "HostedOLM".into(),
        plural: "hostedolms".into(),
    }
}

pub fn hosted_cluster_template() -> Result<serde_json::Value> {
    let mut v = yaml_docs(&fixtures_dir().join("hypershift/examples/none-minimal.yaml"))?
        .into_iter()
        .find(|v| v["kind"] == "HostedCluster")
        .context("fixture has a HostedCluster")?;
    // The fixture carries the placeholder `fakeAddress`, which the real CRD rejects.
    if let Some(services) = v["spec"]["services"].as_array_mut() {
        for svc in services {
            if let Some(np) = svc["servicePublishingStrategy"]["nodePort"].as_object_mut() {
                np.insert("address".into(), "api.example.com".into());
            }
        }
    }
    v["spec"]["release"]["image"] = RELEASE_IMAGE.into();
    v["metadata"]["namespace"] = HC_NS.into();
    Ok(v)
}

/// Kubeconfig Secret, HostedCluster (+ status) and HCP namespace for hosted cluster `i`.
pub async fn create_hosted_cluster(
    mgmt: &Cluster,
    template: &serde_json::Value,
    i: usize,
    kubeconfig: Vec<u8>,
) -> Result<()> {
    let name = format!("hc{i}");
    let secret_name = format!("{name}-admin-kubeconfig");
    let s = Secret {
        metadata: kube::api::ObjectMeta {
            name: Some(secret_name.clone()),
            namespace: Some(HC_NS.into()),
            ..Default::default()
        },
        data: Some(BTreeMap::from([(
            "kubeconfig".to_string(),
            ByteString(kubeconfig),
        )])),
        ..Default::default()
    };
    Api::<Secret>::namespaced(mgmt.client(), HC_NS)
        .create(&PostParams::default(), &s)
        .await?;
    mgmt.ensure_hcp_namespace(&format!("{HC_NS}-{name}"))
        .await?;
    let mut v = template.clone();
    v["metadata"]["name"] = name.clone().into();
    let obj: DynamicObject = serde_json::from_value(v)?;
    let api: Api<DynamicObject> = Api::namespaced_with(mgmt.client(), HC_NS, &hc_resource());
    api.create(&PostParams::default(), &obj).await?;
    api.patch_status(
        &name,
        &PatchParams::default(),
        &Patch::Merge(serde_json::json!({"status": {
            "kubeconfig": {"name": secret_name},
            "version": {
                "desired": {"image": RELEASE_IMAGE, "version": "4.18.3"},
                "availableUpdates": [],
                "observedGeneration": 1,
            },
        }})),
    )
    .await?;
    Ok(())
}

/// The controller's ServiceAccount with the ClusterRole, the leader-election Role and their
/// bindings from manifests/.
pub async fn controller_identity(mgmt: &Cluster) -> Result<PathBuf> {
    let sa = mgmt
        .service_account(
            "hcp-olm-system",
            "hcp-olm-controller",
            Duration::from_secs(6 * 3600),
        )
        .await?;
    let role: ClusterRole = serde_yaml_ng::from_str(&std::fs::read_to_string(
        crate::tools::repo_file("manifests/controller/clusterrole.yaml"),
    )?)?;
    Api::<ClusterRole>::all(mgmt.client())
        .create(&PostParams::default(), &role)
        .await?;
    let binding: ClusterRoleBinding = serde_yaml_ng::from_str(&std::fs::read_to_string(
        crate::tools::repo_file("manifests/controller/clusterrolebinding.yaml"),
    )?)?;
    Api::<ClusterRoleBinding>::all(mgmt.client())
        .create(&PostParams::default(), &binding)
        .await?;
    // Leader election: the Role and RoleBinding for Leases in hcp-olm-system.
    for doc in yaml_docs(&crate::tools::repo_file(
        "manifests/controller/leader-election-role.yaml",
    ))? {
        match doc["kind"].as_str() {
            Some("Role") => {
                let r: k8s_openapi::api::rbac::v1::Role = serde_json::from_value(doc)?;
                Api::<k8s_openapi::api::rbac::v1::Role>::namespaced(
                    mgmt.client(),
                    "hcp-olm-system",
                )
                .create(&PostParams::default(), &r)
                .await?;
            }
            Some("RoleBinding") => {
                let b: k8s_openapi::api::rbac::v1::RoleBinding = serde_json::from_value(doc)?;
                Api::<k8s_openapi::api::rbac::v1::RoleBinding>::namespaced(
                    mgmt.client(),
                    "hcp-olm-system",
                )
                .create(&PostParams::default(), &b)
                .await?;
            }
            other => anyhow::bail!("unexpected kind {other:?} in leader-election-role.yaml"),
        }
    }
    Ok(sa.kubeconfig)
}

/// CPU seconds (user + system) a process has used so far (0 when unreadable).
pub fn cpu_seconds(pid: u32) -> f64 {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return 0.0;
    };
    let Some(rest) = stat.rsplit_once(')').map(|(_, r)| r) else {
        return 0.0;
    };
    let f: Vec<&str> = rest.split_whitespace().collect();
    // Fields after the command: state is index 0, utime is field 14 overall → index 11.
    let ticks: u64 = f.get(11).and_then(|v| v.parse().ok()).unwrap_or(0)
        + f.get(12).and_then(|v| v.parse().ok()).unwrap_or(0);
    ticks as f64 / 100.0
}

/// The API server's `/metrics` text.
pub async fn metrics_text(c: &Cluster) -> Result<String> {
    let req = http::Request::get("/metrics").body(Vec::new())?;
    Ok(c.client().request_text(req).await?)
}

/// One real guest: kube-apiserver on the shared etcd, the guest CRDs and namespace.
pub async fn start_real_guest(i: usize, etcd: &SharedEtcd, extra: &[String]) -> Result<Cluster> {
    let mut opts = ClusterOptions::new(&format!("guest{i}"));
    opts.shared_etcd = Some(etcd.with_prefix(&format!("guest{i}")));
    opts.extra_apiserver_args = extra.to_vec();
    opts.ready_timeout = Duration::from_secs(240);
    let c = Cluster::start(opts)
        .await
        .with_context(|| format!("starting guest {i}"))?;
    c.install_crds(&guest_crd_files()).await?;
    c.ensure_namespace("openshift-marketplace").await?;
    Ok(c)
}

pub enum Guests {
    Real(Vec<Cluster>),
    StandIn(GuestStandIn),
}

impl Guests {
    pub fn kubeconfig(&self, i: usize) -> Result<Vec<u8>> {
        match self {
            Guests::Real(cs) => Ok(std::fs::read(cs[i].kubeconfig())?),
            Guests::StandIn(s) => Ok(s.kubeconfig(i).into_bytes()),
        }
    }

    pub async fn writes(&self) -> Result<u64> {
        match self {
            Guests::Real(cs) => {
                let counts = futures::stream::iter(cs.iter())
                    .map(|c| c.api_writes(RESOURCES))
                    .buffer_unordered(8)
                    .collect::<Vec<_>>()
                    .await;
                let mut sum = 0;
                for c in counts {
                    sum += c?;
                }
                Ok(sum)
            }
            Guests::StandIn(s) => Ok(s.total_writes()),
        }
    }

    /// Has guest `i` got the packageserver Endpoints (written on the controller's second pass)?
    pub async fn done(&self, i: usize) -> bool {
        match self {
            Guests::Real(cs) => Api::<Endpoints>::namespaced(cs[i].client(), "default")
                .get_opt("packageserver")
                .await
                .ok()
                .flatten()
                .is_some(),
            Guests::StandIn(s) => s.has(i, "", "endpoints", Some("default"), "packageserver"),
        }
    }

    /// For real guests: guest 0's write requests by resource, subresource and verb.
    pub async fn breakdown(&self) -> Result<String> {
        let Guests::Real(cs) = self else {
            return Ok(String::new());
        };
        let out = write_requests(&metrics_text(&cs[0]).await?, true);
        Ok(out
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(" "))
    }

    /// Write requests (POST, PUT, PATCH, APPLY, DELETE) by `resource[/subresource]`, summed
    /// over every guest: the real API servers' own counters, or the stand-in's.
    pub async fn writes_by_resource(&self) -> Result<BTreeMap<String, u64>> {
        match self {
            Guests::Real(cs) => {
                let mut out = BTreeMap::new();
                for c in cs {
                    for (k, v) in writes_by_resource(&metrics_text(c).await?) {
                        *out.entry(k).or_default() += v;
                    }
                }
                Ok(out)
            }
            Guests::StandIn(s) => Ok(s.writes_by_resource()),
        }
    }

    /// Requests served to the guests so far (real: the API servers' non-watch
    /// `apiserver_request_total`; stand-in: every request it answered).
    pub async fn requests(&self) -> Result<u64> {
        match self {
            Guests::Real(cs) => {
                let mut sum = 0.0;
                for c in cs {
                    sum += metrics_text(c)
                        .await?
                        .lines()
                        .filter(|l| l.starts_with("apiserver_request_total{"))
                        .filter(|l| {
                            !l.contains("verb=\"WATCH\"") && !l.contains("verb=\"CONNECT\"")
                        })
                        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
                        .sum::<f64>();
                }
                Ok(sum as u64)
            }
            Guests::StandIn(s) => Ok(s.total_requests()),
        }
    }

    pub fn cpu_seconds(&self) -> f64 {
        match self {
            Guests::Real(cs) => cs.iter().map(|c| cpu_seconds(c.pids()[0])).sum(),
            Guests::StandIn(_) => 0.0,
        }
    }
}

/// The value of label `name` in one Prometheus text line ("" when absent; pure).
pub fn metric_label(line: &str, name: &str) -> String {
    line.split_once(&format!("{name}=\""))
        .and_then(|(_, r)| r.split_once('"'))
        .map(|(v, _)| v.to_string())
        .unwrap_or_default()
}

/// Write requests by `resource[/subresource]` in a kube-apiserver's `/metrics` text (pure).
pub fn writes_by_resource(text: &str) -> BTreeMap<String, u64> {
    write_requests(text, false)
}

/// Write requests (POST, PUT, PATCH, APPLY, DELETE) in a kube-apiserver's `/metrics` text by
/// `resource[/subresource]`, and `/verb` when `by_verb` (pure).
fn write_requests(text: &str, by_verb: bool) -> BTreeMap<String, u64> {
    let label = metric_label;
    let mut out = BTreeMap::new();
    for l in text
        .lines()
        .filter(|l| l.starts_with("apiserver_request_total{"))
    {
        let verb = label(l, "verb");
        if !["POST", "PUT", "PATCH", "APPLY", "DELETE"].contains(&verb.as_str()) {
            continue;
        }
        let v: f64 = l
            .rsplit(' ')
            .next()
            .and_then(|v| v.parse().ok())
            .unwrap_or(0.0);
        let mut key = match label(l, "subresource").as_str() {
            "" => label(l, "resource"),
            sub => format!("{}/{sub}", label(l, "resource")),
        };
        if by_verb {
            key = format!("{key}/{verb}");
        }
        *out.entry(key).or_default() += v as u64;
    }
    out
}

/// A stand-in for the deployment controller and kubelets of a cluster that has neither (the
/// benchmark's API servers run no pods): every Deployment carrying our managed-by label is
/// reported rolled out (its `status` patched: every replica ready at its generation), so a
/// HostedOLM can become Available as it would with running pods. It counts its own writes,
/// which the benchmark subtracts from the API server's counters. Dropping it stops it.
pub struct RolloutStandIn {
    writes: std::sync::Arc<std::sync::atomic::AtomicU64>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for RolloutStandIn {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl RolloutStandIn {
    pub fn start(client: kube::Client) -> Self {
        use k8s_openapi::api::apps::v1::Deployment;
        use kube::runtime::{WatchStreamExt as _, watcher};
        let writes = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
        let counted = writes.clone();
        let api: Api<Deployment> = Api::all(client.clone());
        let config = watcher::Config::default().labels("app.kubernetes.io/managed-by=hcp-olm");
        let task = tokio::spawn(async move {
            watcher(api, config)
                .default_backoff()
                .applied_objects()
                .filter_map(|d| async move { d.ok() })
                .filter(|d| futures::future::ready(!rolled_out(d)))
                .for_each_concurrent(4, |d| {
                    let (client, counted) = (client.clone(), counted.clone());
                    async move {
                        let (Some(ns), Some(name)) =
                            (d.metadata.namespace.clone(), d.metadata.name.clone())
                        else {
                            return;
                        };
                        let replicas = d.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1);
                        let status = serde_json::json!({"status": {
                            "observedGeneration": d.metadata.generation,
                            "replicas": replicas,
                            "updatedReplicas": replicas,
                            "readyReplicas": replicas,
                            "availableReplicas": replicas,
                            "conditions": [{"type": "Available", "status": "True",
                                "reason": "MinimumReplicasAvailable"}],
                        }});
                        let api: Api<Deployment> = Api::namespaced(client, &ns);
                        if api
                            .patch_status(&name, &PatchParams::default(), &Patch::Merge(&status))
                            .await
                            .is_ok()
                        {
                            counted.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        }
                    }
                })
                .await;
        });
        Self { writes, task }
    }

    /// Status writes made so far.
    pub fn writes(&self) -> u64 {
        self.writes.load(std::sync::atomic::Ordering::Relaxed)
    }
}

fn rolled_out(d: &k8s_openapi::api::apps::v1::Deployment) -> bool {
    let want = d.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1);
    d.status.as_ref().is_some_and(|s| {
        s.observed_generation == d.metadata.generation && s.ready_replicas.unwrap_or(0) >= want
    })
}
