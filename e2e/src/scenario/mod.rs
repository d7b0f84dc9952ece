//! The end-to-end scenario (issue 5), shared by `controlplane/tests/olm_e2e.rs` and
//! `make demo`: two real control planes, our controller as a process under its
//! ServiceAccount, a management node running every Deployment the controller rendered into
//! the HCP namespace (real catalog-operator, olm-operator, package-server, opm catalogs, our
//! tunnel gateway) and a guest node running the guest agent the controller rendered into the
//! guest plus a user catalog. The two pod networks are linked as two sites behind NAT: the
//! guest reaches only the management node's NodePorts, so every guest-catalog byte OLM reads
//! crosses the WireGuard tunnel.
//!
//! Nothing the controller rendered is rewritten; the node runs it as it is or fails with the
//! reason. The steps and their durations are recorded for the report.

pub mod catalogs;

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail, ensure};
use k8s_openapi::ByteString;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Secret, Service};
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams,
};

use crate::kubelet::ImageStore;
use crate::kubelet::node::{Node, NodeConfig};
use crate::podnet::{self, HostNat, PodNetwork};
use crate::tools::fixtures_dir;
use crate::{Cluster, ClusterOptions, Environment};

pub const HC_NS: &str = "clusters";
pub const NAME: &str = "example";
pub const HCP_NS: &str = "clusters-example";
/// The guest namespace of the agent (controlplane `names::GUEST_NAMESPACE`).
pub const AGENT_NS: &str = "hcp-olm";
pub const MARKETPLACE: &str = "openshift-marketplace";
/// Where the guest user's catalog runs, and its CatalogSource.
pub const USER_NS: &str = "user-catalogs";
pub const USER_CATALOG: &str = "widget-catalog";
pub const USER_SOURCE: &str = "guest-widgets";
const OLM_IMAGE: &str =
    "registry.test/olm@sha256:0000000000000000000000000000000000000000000000000000000000000001";
const USER_IMAGE: &str = "registry.test/user/widget-catalog:v1";
const RELEASE: &str = "quay.io/openshift-release-dev/ocp-release:4.18.3-x86_64";
const DEFAULT_SOURCES: [&str; 3] = [
    "redhat-operators",
    "certified-operators",
    "community-operators",
];
const MGMT_PREFIX: [u8; 3] = [198, 18, 16];
const GUEST_PREFIX: [u8; 3] = [198, 18, 32];
const LINK_PREFIX: [u8; 3] = [198, 18, 250];
const MGMT_SERVICE_CIDR: &str = "198.19.16.0/24";
const GUEST_SERVICE_CIDR: &str = "198.19.32.0/24";
/// `.10` of the guest Service CIDR: where the controller points the agent's DNS.
const GUEST_DNS_IP: &str = "198.19.32.10";

/// Our binaries the scenario runs.
#[derive(Clone, Debug)]
pub struct Binaries {
    pub controller: PathBuf,
    pub gateway: PathBuf,
    pub agent: PathBuf,
    /// `hcp-olm`, the user CLI (a guest workload browsing a control-plane catalog).
    pub cli: PathBuf,
}

impl Binaries {
    /// The binaries in the cargo target directory `dir` (`target/debug`).
    pub fn in_dir(dir: &Path) -> Self {
        Self {
            controller: dir.join("hcp-olm-controller"),
            gateway: dir.join("hcp-olm-gateway"),
            agent: dir.join("hcp-olm-agent"),
            cli: dir.join("hcp-olm"),
        }
    }

    /// The target directory of the running executable (a test in `target/debug/deps`, or a
    /// binary in `target/debug`).
    pub fn next_to_current_exe() -> Result<Self> {
        Ok(Self::in_dir(&crate::tools::current_target_dir()))
    }
}

/// Where progress and summaries go.
pub type Log = Arc<dyn Fn(&str) + Send + Sync>;

/// One step's result.
#[derive(Clone, Debug)]
pub struct StepRecord {
    pub name: String,
    pub seconds: f64,
    pub ok: bool,
}

struct Steps {
    log: Log,
    records: Vec<StepRecord>,
    current: Option<(String, Instant)>,
}

impl Steps {
    fn begin(&mut self, name: &str) {
        (self.log)(&format!("== step: {name}"));
        self.current = Some((name.to_string(), Instant::now()));
    }

    fn end(&mut self) {
        if let Some((name, t)) = self.current.take() {
            let seconds = t.elapsed().as_secs_f64();
            (self.log)(&format!("== step done: {name} ({seconds:.1}s)"));
            self.records.push(StepRecord {
                name,
                seconds,
                ok: true,
            });
        }
    }

    fn fail(&mut self) -> Option<String> {
        let (name, t) = self.current.take()?;
        self.records.push(StepRecord {
            name: name.clone(),
            seconds: t.elapsed().as_secs_f64(),
            ok: false,
        });
        Some(name)
    }
}

/// Everything running. Dropped in field order after [`World::teardown`].
pub struct World {
    pub env: Environment,
    pub mgmt_net: Arc<PodNetwork>,
    pub guest_net: Arc<PodNetwork>,
    mgmt_node: Option<Node>,
    guest_node: Option<Node>,
    nat: Option<HostNat>,
    controller: Option<crate::process::ManagedProcess>,
    controller_log: PathBuf,
    _guest_controllers: crate::realnode::ClusterControllers,
    work: tempfile::TempDir,
}

impl World {
    /// The last lines of the controller's log.
    pub fn controller_log_tail(&self, n: usize) -> String {
        let log = std::fs::read_to_string(&self.controller_log).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(n)..].join("\n")
    }

    /// Logs of not-ready pods on both nodes, and the nodes' errors.
    pub fn node_diagnosis(&self) -> String {
        let mut out = String::new();
        for (side, node) in [("management", &self.mgmt_node), ("guest", &self.guest_node)] {
            if let Some(n) = node {
                let v = n.view();
                out.push_str(&format!(
                    "--- {side} node errors now: {:?}\n--- {side} node errors seen: {:?}\n{}\n",
                    v.errors,
                    v.history,
                    v.not_ready_logs()
                ));
            }
        }
        out
    }

    /// Stops the controller, the nodes (their pods) and the networks' helpers.
    pub async fn teardown(mut self) {
        if let Some(c) = self.controller.take() {
            c.kill();
        }
        for n in [self.guest_node.take(), self.mgmt_node.take()]
            .into_iter()
            .flatten()
        {
            n.stop().await;
        }
        drop(self.nat.take());
        let _ = self.work.path();
    }
}

/// The outcome: the steps run, and the error of the step that failed.
pub struct Outcome {
    pub steps: Vec<StepRecord>,
    pub failed: Option<(String, anyhow::Error)>,
    pub world: Option<World>,
}

/// What the run does after the checks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Finish {
    /// Run every step, including deleting the HostedCluster.
    All,
    /// Stop before deleting the HostedCluster (the demo leaves it up to explore).
    BeforeDelete,
    /// Every step, and before the deletion HyperShift's own OLM is taken over (issue 13
    /// item 13) and both run side by side for the given time.
    AllWithTakeOver(Duration),
}

/// Runs the scenario. The world is returned (also on failure, when it got that far) so the
/// caller can print diagnosis, keep it up, and tear it down.
pub async fn run(bins: &Binaries, log: Log, finish: Finish) -> Outcome {
    let mut steps = Steps {
        log: log.clone(),
        records: Vec::new(),
        current: None,
    };
    let mut world = None;
    let result = run_steps(bins, &log, &mut steps, &mut world, finish).await;
    let failed = match result {
        Ok(()) => None,
        Err(e) => Some((steps.fail().unwrap_or_else(|| "setup".into()), e)),
    };
    Outcome {
        steps: steps.records,
        failed,
        world,
    }
}

/// The deletion step on its own (the demo runs it after Ctrl-C).
pub async fn delete_step(world: &World, log: &Log) -> Result<f64> {
    let t = Instant::now();
    (log)("== step: delete the HostedCluster: nothing of ours left in either cluster");
    delete_hosted_cluster(world, log).await?;
    let s = t.elapsed().as_secs_f64();
    (log)(&format!("== step done: delete ({s:.1}s)"));
    Ok(s)
}

fn ar(group: &str, version: &str, kind: &str, plural: &str) -> ApiResource {
    ApiResource {
        group: group.into(),
        version: version.into(),
        api_version: if group.is_empty() {
            version.into()
        } else {
            format!("{group}/{version}")
        },
        kind: kind.into(),
        plural: plural.into(),
    }
}

fn hc_ar() -> ApiResource {
    ar(
        "hypershift.openshift.io",
        "v1beta1",
        "HostedCluster",
        "hostedclusters",
    )
}
fn holm_ar() -> ApiResource {
    ar("olm.hcp-olm.io", "v1alpha1", "HostedOLM", "hostedolms")
}
fn catsrc_ar() -> ApiResource {
    ar(
        "operators.coreos.com",
        "v1alpha1",
        "CatalogSource",
        "catalogsources",
    )
}
fn pm_ar() -> ApiResource {
    ar(
        "packages.operators.coreos.com",
        "v1",
        "PackageManifest",
        "packagemanifests",
    )
}

async fn until<F, Fut>(what: &str, secs: u64, mut f: F) -> Result<()>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<(), String>>,
{
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        match f().await {
            Ok(()) => return Ok(()),
            Err(e) if Instant::now() >= deadline => bail!("{what} (after {secs}s): {e}"),
            Err(_) => tokio::time::sleep(Duration::from_millis(500)).await,
        }
    }
}

fn repo_file(p: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..").join(p)
}

async fn apply_json(cluster: &Cluster, ar: &ApiResource, obj: serde_json::Value) -> Result<()> {
    let ns = obj["metadata"]["namespace"].as_str().map(str::to_string);
    let name = obj["metadata"]["name"]
        .as_str()
        .context("object has a name")?
        .to_string();
    let api: Api<DynamicObject> = match &ns {
        Some(ns) => Api::namespaced_with(cluster.client(), ns, ar),
        None => Api::all_with(cluster.client(), ar),
    };
    api.patch(
        &name,
        &PatchParams::apply("hcp-olm-e2e-user").force(),
        &Patch::Apply(&obj),
    )
    .await
    .with_context(|| format!("applying {} {name}", ar.kind))?;
    Ok(())
}

async fn put_secret(
    cluster: &Cluster,
    ns: &str,
    name: &str,
    key: &str,
    data: Vec<u8>,
) -> Result<()> {
    let s = Secret {
        metadata: kube::api::ObjectMeta {
            name: Some(name.into()),
            namespace: Some(ns.into()),
            ..Default::default()
        },
        data: Some(BTreeMap::from([(key.to_string(), ByteString(data))])),
        ..Default::default()
    };
    Api::<Secret>::namespaced(cluster.client(), ns)
        .create(&PostParams::default(), &s)
        .await?;
    Ok(())
}

/// The admin kubeconfig of `cluster`, pointed at `server`.
fn kubeconfig_at(cluster: &Cluster, server: &str) -> Result<Vec<u8>> {
    let text = std::fs::read_to_string(cluster.kubeconfig())?;
    let mut v: serde_yaml_ng::Value = serde_yaml_ng::from_str(&text)?;
    if let Some(clusters) = v["clusters"].as_sequence_mut() {
        for c in clusters {
            c["cluster"]["server"] = server.into();
        }
    }
    Ok(serde_yaml_ng::to_string(&v)?.into_bytes())
}

async fn setup_crds(env: &Environment) -> Result<()> {
    let fx = fixtures_dir();
    env.management
        .install_crds(&[
            fx.join("hypershift/crds/hostedclusters-Hypershift-Default.crd.yaml"),
            repo_file("manifests/crds/hostedolm.yaml"),
        ])
        .await?;
    let mut guest_crds: Vec<PathBuf> = std::fs::read_dir(fx.join("crds/olm"))?
        .map(|e| e.map(|e| e.path()))
        .collect::<std::io::Result<_>>()?;
    guest_crds.push(fx.join("crds/openshift/0000_03_marketplace_01_operatorhubs.crd.yaml"));
    // Proxy and ClusterOperator, as the CVO installs them in a guest (see the SOURCES.md there)
    for f in [
        "0000_03_config-operator_01_proxies.crd.yaml",
        "0000_00_cluster-version-operator_01_clusteroperators.crd.yaml",
    ] {
        guest_crds.push(repo_file("e2e/testdata/crds/openshift").join(f));
    }
    env.guest.install_crds(&guest_crds).await?;
    for ns in [
        MARKETPLACE,
        "openshift-operator-lifecycle-manager",
        USER_NS,
        "kube-system",
    ] {
        env.guest.ensure_namespace(ns).await?;
    }
    env.management.ensure_namespace(HC_NS).await?;
    env.management.ensure_hcp_namespace(HCP_NS).await?;
    Ok(())
}

/// The HostedCluster of the fixture, with this environment's networks: the guest's Service
/// and pod CIDRs, and the management node's address for NodePort services.
async fn create_hc(env: &Environment, node_address: Ipv4Addr) -> Result<()> {
    let text =
        std::fs::read_to_string(fixtures_dir().join("hypershift/examples/none-minimal.yaml"))?;
    let mut value = None;
    for doc in serde_yaml_ng::Deserializer::from_str(&text) {
        let v: serde_json::Value = serde::Deserialize::deserialize(doc)?;
        if v["kind"] == "HostedCluster" {
            value = Some(v);
        }
    }
    let mut v = value.context("fixture has a HostedCluster")?;
    v["metadata"]["name"] = NAME.into();
    v["metadata"]["namespace"] = HC_NS.into();
    if let Some(services) = v["spec"]["services"].as_array_mut() {
        for svc in services {
            if let Some(np) = svc["servicePublishingStrategy"]["nodePort"].as_object_mut() {
                np.insert("address".into(), node_address.to_string().into());
            }
        }
    }
    v["spec"]["networking"]["clusterNetwork"] = serde_json::json!([{"cidr": format!(
        "{}.{}.{}.0/24",
        GUEST_PREFIX[0], GUEST_PREFIX[1], GUEST_PREFIX[2]
    )}]);
    v["spec"]["networking"]["serviceNetwork"] = serde_json::json!([{"cidr": GUEST_SERVICE_CIDR}]);
    v["spec"]["release"]["image"] = RELEASE.into();
    let obj: DynamicObject = serde_json::from_value(v)?;
    let api: Api<DynamicObject> = Api::namespaced_with(env.management.client(), HC_NS, &hc_ar());
    api.create(&PostParams::default(), &obj).await?;
    api.patch_status(
        NAME,
        &PatchParams::default(),
        &Patch::Merge(serde_json::json!({"status": {
            "kubeconfig": {"name": "example-admin-kubeconfig"},
            "version": {"desired": {"image": RELEASE, "version": "4.18.3"}, "availableUpdates": [], "observedGeneration": 1},
        }})),
    )
    .await?;
    Ok(())
}

/// The controller's ServiceAccount with the ClusterRole and admission policies from manifests/.
async fn controller_kubeconfig(env: &Environment) -> Result<PathBuf> {
    use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
    let sa = env
        .management
        .service_account(
            "hcp-olm-system",
            "hcp-olm-controller",
            Duration::from_secs(3600),
        )
        .await?;
    let admin = env.management.client();
    let role: ClusterRole = serde_yaml_ng::from_str(&std::fs::read_to_string(repo_file(
        "manifests/controller/clusterrole.yaml",
    ))?)?;
    Api::<ClusterRole>::all(admin.clone())
        .create(&PostParams::default(), &role)
        .await?;
    let binding: ClusterRoleBinding = serde_yaml_ng::from_str(&std::fs::read_to_string(
        repo_file("manifests/controller/clusterrolebinding.yaml"),
    )?)?;
    Api::<ClusterRoleBinding>::all(admin)
        .create(&PostParams::default(), &binding)
        .await?;
    // ... and under the admission policies that confine its writes to HCP namespaces.
    env.management
        .create_admission_policies(&repo_file("manifests/controller/admission-policy.yaml"))
        .await?;
    Ok(sa.kubeconfig)
}

/// The guest's cluster DNS Service at `.10` of its Service CIDR (what the controller gives
/// the agent), backed by the guest pod network's DNS; and the user's catalog: a Deployment
/// and Service in `user-catalogs`, and an address-type CatalogSource naming the Service.
async fn guest_objects(env: &Environment, guest_net: &PodNetwork) -> Result<()> {
    let svc = ar("", "v1", "Service", "services");
    let eps = ar("", "v1", "Endpoints", "endpoints");
    apply_json(
        &env.guest,
        &svc,
        serde_json::json!({
            "apiVersion": "v1", "kind": "Service",
            "metadata": {"name": "dns-default", "namespace": "kube-system"},
            "spec": {"clusterIP": GUEST_DNS_IP, "ports": [
                {"name": "dns", "port": 53, "protocol": "UDP"},
                {"name": "dns-tcp", "port": 53, "protocol": "TCP"}]}
        }),
    )
    .await?;
    apply_json(
        &env.guest,
        &eps,
        serde_json::json!({
            "apiVersion": "v1", "kind": "Endpoints",
            "metadata": {"name": "dns-default", "namespace": "kube-system"},
            "subsets": [{"addresses": [{"ip": guest_net.gateway().to_string()}],
                         "ports": [{"name": "dns", "port": 53, "protocol": "UDP"},
                                   {"name": "dns-tcp", "port": 53, "protocol": "TCP"}]}]
        }),
    )
    .await?;
    let labels = serde_json::json!({"app": USER_CATALOG});
    let grpc_probe =
        serde_json::json!({"grpc": {"port": 50051}, "periodSeconds": 2, "failureThreshold": 30});
    apply_json(
        &env.guest,
        &ar("apps", "v1", "Deployment", "deployments"),
        serde_json::json!({
            "apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": USER_CATALOG, "namespace": USER_NS},
            "spec": {"replicas": 1, "selector": {"matchLabels": labels},
                     "template": {"metadata": {"labels": labels}, "spec": {
                     // (no controller-manager creates `default` ServiceAccounts here)
                     "automountServiceAccountToken": false,
                     "containers": [{
                         "name": "registry-server", "image": USER_IMAGE,
                         "args": ["serve", "/configs", "--cache-dir=/tmp/cache", "--pprof-addr="],
                         "ports": [{"name": "grpc", "containerPort": 50051}],
                         "readinessProbe": grpc_probe}]}}}
        }),
    )
    .await?;
    apply_json(&env.guest, &svc, serde_json::json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": USER_CATALOG, "namespace": USER_NS},
        "spec": {"selector": labels, "ports": [{"name": "grpc", "port": 50051, "targetPort": 50051, "protocol": "TCP"}]}
    })).await?;
    apply_json(&env.guest, &catsrc_ar(), serde_json::json!({
        "apiVersion": "operators.coreos.com/v1alpha1", "kind": "CatalogSource",
        "metadata": {"name": USER_SOURCE, "namespace": MARKETPLACE},
        "spec": {"sourceType": "grpc", "displayName": "Widgets (guest)", "publisher": "guest user",
                 "address": format!("{USER_CATALOG}.{USER_NS}.svc:50051")}
    })).await?;
    Ok(())
}

/// The `/metrics` text of the gateway process `pid`, read inside its pod's network namespace
/// (the health port is not in any Service).
fn gateway_metrics(pid: u32) -> Result<String, String> {
    let out = std::process::Command::new("nsenter")
        .arg(format!("--net=/proc/{pid}/ns/net"))
        .args([
            "timeout",
            "5",
            "bash",
            "-c",
            "exec 3<>/dev/tcp/127.0.0.1/8081 && printf 'GET /metrics HTTP/1.0\\r\\n\\r\\n' >&3 && cat <&3",
        ])
        .output()
        .map_err(|e| format!("nsenter: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "reading the gateway's metrics: {}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

async fn catalog_states(env: &Environment) -> Result<BTreeMap<String, String>> {
    catalog_states_of(env.guest.client()).await
}

async fn catalog_states_of(guest: kube::Client) -> Result<BTreeMap<String, String>> {
    let api: Api<DynamicObject> = Api::namespaced_with(guest, MARKETPLACE, &catsrc_ar());
    Ok(api
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .map(|o| {
            let state = o.data["status"]["connectionState"]["lastObservedState"]
                .as_str()
                .unwrap_or("-")
                .to_string();
            (o.metadata.name.unwrap_or_default(), state)
        })
        .collect())
}

/// Changes of the guest catalog's state: (seconds since recording began, state).
type StateLog = Arc<std::sync::Mutex<Vec<(f64, String)>>>;

/// Records every change of the guest catalog's `lastObservedState` (seconds since start),
/// polling twice a second, so the agent steps can show the whole sequence.
fn record_states(guest: kube::Client) -> (StateLog, tokio::task::JoinHandle<()>) {
    let seen = Arc::new(std::sync::Mutex::new(Vec::<(f64, String)>::new()));
    let out = seen.clone();
    let start = Instant::now();
    let task = tokio::spawn(async move {
        // bounded: one hour at most
        for _ in 0..7200 {
            if let Ok(m) = catalog_states_of(guest.clone()).await {
                let state = m.get(USER_SOURCE).cloned().unwrap_or_else(|| "-".into());
                let mut v = seen.lock().unwrap_or_else(|p| p.into_inner());
                if v.last().is_none_or(|(_, s)| *s != state) {
                    v.push((start.elapsed().as_secs_f64(), state));
                }
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    });
    (out, task)
}

fn states_since(seen: &std::sync::Mutex<Vec<(f64, String)>>, from: f64) -> Vec<(f64, String)> {
    seen.lock()
        .unwrap_or_else(|p| p.into_inner())
        .iter()
        .filter(|(t, _)| *t >= from)
        .cloned()
        .collect()
}

/// `kubectl get packagemanifests -n openshift-marketplace` in the guest: `name (source)`.
/// Bounded: an unreachable aggregated API would otherwise hold the caller for minutes.
async fn package_manifests(env: &Environment) -> Result<Vec<String>> {
    let api: Api<DynamicObject> = Api::namespaced_with(env.guest.client(), MARKETPLACE, &pm_ar());
    let mut names: Vec<String> =
        tokio::time::timeout(Duration::from_secs(10), api.list(&ListParams::default()))
            .await
            .context("listing packagemanifests: no answer within 10s")??
            .items
            .into_iter()
            .map(|o| {
                format!(
                    "{} ({})",
                    o.metadata.name.unwrap_or_default(),
                    o.data["status"]["catalogSource"].as_str().unwrap_or("?")
                )
            })
            .collect();
    names.sort();
    Ok(names)
}

async fn hosted_olm(env: &Environment) -> Result<serde_json::Value> {
    let api: Api<DynamicObject> = Api::namespaced_with(env.management.client(), HCP_NS, &holm_ar());
    Ok(api.get(NAME).await?.data)
}

fn is_not_found(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        c.downcast_ref::<kube::Error>()
            .is_some_and(|k| matches!(k, kube::Error::Api(s) if s.code == 404))
    })
}

/// A readable summary: components, catalogs and their state, packages seen in the guest.
pub async fn summary(world: &World) -> String {
    let env = &world.env;
    let mut out = String::new();
    match hosted_olm(env).await {
        Ok(h) => {
            let st = &h["status"];
            for c in st["conditions"].as_array().into_iter().flatten() {
                out.push_str(&format!(
                    "  condition {}={} ({})\n",
                    c["type"].as_str().unwrap_or("?"),
                    c["status"].as_str().unwrap_or("?"),
                    c["reason"].as_str().unwrap_or("")
                ));
            }
            for c in st["components"].as_array().into_iter().flatten() {
                out.push_str(&format!(
                    "  component {:<28} available={} {}/{} {}\n",
                    c["name"].as_str().unwrap_or("?"),
                    c["available"],
                    c["readyReplicas"].as_i64().unwrap_or(0),
                    c["desiredReplicas"].as_i64().unwrap_or(0),
                    c["reason"].as_str().unwrap_or("")
                ));
            }
            if let Some(t) = st["tunnel"].as_object() {
                out.push_str(&format!(
                    "  tunnel endpoint {} ({})\n",
                    t.get("endpoint").and_then(|e| e.as_str()).unwrap_or("-"),
                    t.get("reason").and_then(|e| e.as_str()).unwrap_or("")
                ));
            }
        }
        Err(e) if is_not_found(&e) => {
            out.push_str("  HostedOLM: none (the HostedCluster is gone)\n")
        }
        Err(e) => out.push_str(&format!("  HostedOLM: {e}\n")),
    }
    match catalog_states(env).await {
        Ok(m) => {
            for (n, s) in m {
                out.push_str(&format!("  guest CatalogSource {n:<22} {s}\n"));
            }
        }
        Err(e) => out.push_str(&format!("  CatalogSources: {e}\n")),
    }
    match package_manifests(env).await {
        Ok(p) => out.push_str(&format!("  guest packagemanifests: {}\n", p.join(", "))),
        Err(e) if is_not_found(&e) => {
            out.push_str("  packagemanifests: not served (the packageserver APIService is gone)\n")
        }
        Err(e) => out.push_str(&format!("  packagemanifests: {e:#}\n")),
    }
    out
}

async fn run_steps(
    bins: &Binaries,
    log: &Log,
    steps: &mut Steps,
    slot: &mut Option<World>,
    finish: Finish,
) -> Result<()> {
    steps.begin("networks and control planes");
    let mgmt_net = Arc::new(PodNetwork::create("mgmt", MGMT_PREFIX, "cluster.local").await?);
    let guest_net = Arc::new(PodNetwork::create("guest", GUEST_PREFIX, "cluster.local").await?);
    podnet::link(&guest_net, &mgmt_net, LINK_PREFIX)?;
    let mut mo = ClusterOptions::new("management");
    mo.service_cidr = MGMT_SERVICE_CIDR.into();
    mo.extra_sans.push(mgmt_net.gateway().to_string());
    let mut go = ClusterOptions::new("guest");
    go.service_cidr = GUEST_SERVICE_CIDR.into();
    go.extra_sans.push(mgmt_net.gateway().to_string());
    go.extra_sans.push(guest_net.gateway().to_string());
    let (management, guest) = tokio::try_join!(Cluster::start(mo), Cluster::start(go))?;
    let env = Environment { management, guest };
    let loopback = |port| SocketAddr::from(([127, 0, 0, 1], port));
    // HCP pods: in-cluster = management; the guest API server as HyperShift's kube-apiserver
    mgmt_net
        .forward_to_host(6443, loopback(env.management.port()))
        .await?;
    mgmt_net
        .forward_to_host(6444, loopback(env.guest.port()))
        .await?;
    guest_net
        .forward_to_host(6443, loopback(env.guest.port()))
        .await?;
    setup_crds(&env).await?;
    // The guest's real kube-controller-manager, for the one controller a guest needs here
    // (the process node runs Deployments itself): Endpoints mirrored into EndpointSlices.
    let guest_controllers =
        crate::realnode::ClusterControllers::start_with(&env.guest, "endpointslicemirroring")?;
    let work = tempfile::Builder::new()
        .prefix("hcp-olm-scenario-")
        .tempdir()?;
    let controller_log = work.path().join("controller.log");
    *slot = Some(World {
        env,
        mgmt_net: mgmt_net.clone(),
        guest_net: guest_net.clone(),
        mgmt_node: None,
        guest_node: None,
        nat: None,
        controller: None,
        controller_log,
        _guest_controllers: guest_controllers,
        work,
    });
    let world = slot.as_mut().context("world")?;
    (log)(&format!(
        "  management kubeconfig: {}\n  guest kubeconfig:      {}",
        world.env.management.kubeconfig().display(),
        world.env.guest.kubeconfig().display()
    ));
    steps.end();

    steps.begin("HostedCluster, kubeconfigs, controller (as its ServiceAccount)");
    let env = &world.env;
    put_secret(
        &env.management,
        HC_NS,
        "example-admin-kubeconfig",
        "kubeconfig",
        std::fs::read(env.guest.kubeconfig())?,
    )
    .await?;
    let in_hcp = kubeconfig_at(&env.guest, &format!("https://{}:6444", mgmt_net.gateway()))?;
    put_secret(
        &env.management,
        HCP_NS,
        "service-network-admin-kubeconfig",
        "kubeconfig",
        in_hcp,
    )
    .await?;
    create_hc(env, mgmt_net.node_address()).await?;
    let kubeconfig = controller_kubeconfig(env).await?;
    let admin_port = crate::ports::free_port()?;
    ensure!(
        bins.controller.is_file(),
        "controller binary {} not built",
        bins.controller.display()
    );
    let mut cmd = crate::process::command(&bins.controller);
    cmd.args([
        "run",
        "--admin-addr",
        &format!("127.0.0.1:{admin_port}"),
        "--registry-lookups=false",
        "--olm-image",
        OLM_IMAGE,
        "--waiting-interval",
        "2s",
    ])
    .env("KUBECONFIG", &kubeconfig)
    .env("RUST_LOG", "info");
    world.controller = Some(
        crate::process::ManagedProcess::spawn("controller", cmd, &world.controller_log)
            .context("starting the controller")?,
    );
    steps.end();

    steps.begin("nodes run the rendered Deployments (management: OLM, catalogs, gateway; guest: agent, user catalog)");
    let version = env!("CARGO_PKG_VERSION");
    let mut images = ImageStore::new();
    images.insert(OLM_IMAGE, catalogs::olm_image()?);
    images.insert(
        &format!("quay.io/hcp-olm/hcp-olm-tunnel-gateway:v{version}"),
        catalogs::binary_image(&bins.gateway)?,
    );
    for (name, image_ref) in [
        (
            "redhat",
            "registry.redhat.io/redhat/redhat-operator-index:v4.18",
        ),
        (
            "certified",
            "registry.redhat.io/redhat/certified-operator-index:v4.18",
        ),
        (
            "community",
            "registry.redhat.io/redhat/community-operator-index:v4.18",
        ),
    ] {
        images.insert(
            image_ref,
            catalogs::index_image(world.work.path(), name, &format!("{name}-widget"))?,
        );
    }
    world.mgmt_node = Some(Node::start(NodeConfig {
        client: world.env.management.client(),
        namespaces: vec![HCP_NS.into()],
        network: mgmt_net.clone(),
        images,
        api_host: mgmt_net.gateway().to_string(),
        api_port: 6443,
        ca_pem: world.env.management.ca_pem().as_bytes().to_vec(),
        work_dir: world.work.path().join("mgmt-node"),
        interval: Duration::from_secs(1),
        init_timeout: Duration::from_secs(60),
    }));
    let mut gimages = ImageStore::new();
    gimages.insert(
        &format!("quay.io/hcp-olm/hcp-olm-guest-agent:v{version}"),
        catalogs::binary_image(&bins.agent)?,
    );
    gimages.insert(
        USER_IMAGE,
        catalogs::index_image(world.work.path(), "user", "guest-widget")?,
    );
    guest_objects(&world.env, &guest_net).await?;
    world.guest_node = Some(Node::start(NodeConfig {
        client: world.env.guest.client(),
        namespaces: vec![AGENT_NS.into(), USER_NS.into(), "kube-system".into()],
        network: guest_net.clone(),
        images: gimages,
        api_host: guest_net.gateway().to_string(),
        api_port: 6443,
        ca_pem: world.env.guest.ca_pem().as_bytes().to_vec(),
        work_dir: world.work.path().join("guest-node"),
        interval: Duration::from_secs(1),
        init_timeout: Duration::from_secs(60),
    }));
    let wanted: Vec<(bool, &str, &str)> = vec![
        (true, HCP_NS, "hcp-olm-catalog-operator"),
        (true, HCP_NS, "hcp-olm-olm-operator"),
        (true, HCP_NS, "hcp-olm-packageserver"),
        (true, HCP_NS, "hcp-olm-redhat-operators"),
        (true, HCP_NS, "hcp-olm-certified-operators"),
        (true, HCP_NS, "hcp-olm-community-operators"),
        (true, HCP_NS, "hcp-olm-tunnel-gateway"),
        (false, AGENT_NS, "hcp-olm-guest-agent"),
        (false, USER_NS, USER_CATALOG),
    ];
    {
        let world = &*world;
        until("Deployments ready", 180, || async {
            let mut missing = Vec::new();
            for (mgmt, ns, name) in &wanted {
                let c = if *mgmt {
                    &world.env.management
                } else {
                    &world.env.guest
                };
                let ready = Api::<Deployment>::namespaced(c.client(), ns)
                    .get_opt(name)
                    .await
                    .map_err(|e| e.to_string())?
                    .and_then(|d| d.status?.ready_replicas)
                    .unwrap_or(0);
                if ready < 1 {
                    missing.push(format!("{ns}/{name}"));
                }
            }
            if missing.is_empty() {
                Ok(())
            } else {
                Err(format!(
                    "not ready: {missing:?}\n{}",
                    world.node_diagnosis()
                ))
            }
        })
        .await?;
    }
    steps.end();

    steps.begin("HostedOLM reports every component Available");
    {
        let world = &*world;
        until("every component Available", 60, || async {
            let h = hosted_olm(&world.env).await.map_err(|e| e.to_string())?;
            let st = &h["status"];
            let not: Vec<String> = st["components"]
                .as_array()
                .into_iter()
                .flatten()
                .filter(|c| c["available"] != true)
                .map(|c| format!("{}: {}", c["name"], c["reason"]))
                .collect();
            let available = st["conditions"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|c| c["type"] == "Available" && c["status"] == "True");
            let n = st["components"].as_array().map_or(0, Vec::len);
            if not.is_empty() && available && n >= 7 {
                Ok(())
            } else {
                Err(format!(
                    "components not available: {not:?}, Available condition {available}, {n} components; status {st}"
                ))
            }
        })
        .await?;
    }
    (log)(&summary(world).await);
    steps.end();

    steps.begin("guest lists packagemanifests of the control-plane catalogs and the guest catalog");
    // The guest API server is the HCP's: it reaches the packageserver Service through the
    // management network (kube-proxy's part, done here for the host namespace).
    let guest_ip = Api::<Service>::namespaced(world.env.guest.client(), "default")
        .get("packageserver")
        .await?
        .spec
        .and_then(|s| s.cluster_ip)
        .context("guest packageserver ClusterIP")?;
    let hcp_ip = Api::<Service>::namespaced(world.env.management.client(), HCP_NS)
        .get("hcp-olm-packageserver")
        .await?
        .spec
        .and_then(|s| s.cluster_ip)
        .context("HCP packageserver ClusterIP")?;
    world.nat = Some(
        HostNat::create(
            &mgmt_net,
            &[(
                guest_ip.parse()?,
                443,
                SocketAddr::new(hcp_ip.parse()?, 443),
            )],
        )
        .await?,
    );
    let all_packages = [
        "certified-widget (certified-operators)",
        "community-widget (community-operators)",
        "guest-widget (guest-widgets)",
        "redhat-widget (redhat-operators)",
    ];
    {
        let world = &*world;
        until("packagemanifests listed in the guest", 180, || async {
            let names = package_manifests(&world.env)
                .await
                .map_err(|e| format!("{e:#}\n{}", world.node_diagnosis()))?;
            if names == all_packages {
                Ok(())
            } else {
                Err(format!("{names:?}\n{}", world.node_diagnosis()))
            }
        })
        .await?;
    }
    steps.end();

    steps.begin(
        "both CatalogSources READY (control-plane catalog and guest catalog via the tunnel)",
    );
    {
        let world = &*world;
        until("CatalogSources READY", 120, || async {
            let m = catalog_states(&world.env)
                .await
                .map_err(|e| e.to_string())?;
            let ok = ["redhat-operators", USER_SOURCE]
                .iter()
                .all(|n| m.get(*n).map(String::as_str) == Some("READY"));
            if ok { Ok(()) } else { Err(format!("{m:?}")) }
        })
        .await?;
    }
    (log)(&summary(world).await);
    steps.end();

    steps.begin("a guest workload reads a control-plane catalog through the agent's guest Service");
    {
        ensure!(
            bins.cli.is_file(),
            "CLI binary {} not built",
            bins.cli.display()
        );
        let pod = guest_net.add_pod("gwl", "default")?;
        let addr = format!("hcp-olm-redhat-operators.{AGENT_NS}.svc:50051");
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let out = pod
                .netns
                .command(&bins.cli)
                .args([
                    "catalog",
                    "--addr",
                    &addr,
                    "--timeout",
                    "5s",
                    "-o",
                    "json",
                    "packages",
                ])
                .env_remove("HCP_OLM_CATALOG_PROXY")
                .output()?;
            let text = String::from_utf8_lossy(&out.stdout).into_owned();
            if out.status.success() && text.contains("redhat-widget") {
                (log)(&format!(
                    "  guest pod {} -> {addr}: {}",
                    pod.ip,
                    text.trim()
                ));
                break;
            }
            let last = format!("{text}{}", String::from_utf8_lossy(&out.stderr));
            ensure!(
                Instant::now() < deadline,
                "listing {addr} from a guest pod: {last}"
            );
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    }
    steps.end();

    for (pkg, source, ns) in [
        ("redhat-widget", "redhat-operators", "widgets"),
        ("guest-widget", USER_SOURCE, "guest-widgets"),
    ] {
        steps.begin(match source {
            USER_SOURCE => "Subscription to the guest catalog's package -> InstallPlan -> CSV -> operator Deployment",
            _ => "Subscription to a control-plane catalog's package -> InstallPlan -> CSV -> operator Deployment",
        });
        let result = subscribe(&world.env, pkg, source, ns).await?;
        (log)(&format!("  {result}"));
        steps.end();
    }

    steps.begin("OperatorHub disableAllDefaultSources=true: default sources and their packages go");
    set_disable_all(&world.env, true).await?;
    {
        let world = &*world;
        until("default CatalogSources removed", 90, || async {
            let m = catalog_states(&world.env)
                .await
                .map_err(|e| e.to_string())?;
            let p = package_manifests(&world.env)
                .await
                .map_err(|e| e.to_string())?;
            let left: Vec<&str> = DEFAULT_SOURCES
                .iter()
                .copied()
                .filter(|s| m.contains_key(*s))
                .collect();
            if left.is_empty() && p == ["guest-widget (guest-widgets)"] {
                Ok(())
            } else {
                Err(format!("sources left {left:?}, packages {p:?}"))
            }
        })
        .await?;
    }
    (log)(&summary(world).await);
    steps.end();

    steps.begin("OperatorHub disableAllDefaultSources=false: default sources and packages return");
    set_disable_all(&world.env, false).await?;
    {
        let world = &*world;
        until("default CatalogSources restored", 120, || async {
            let p = package_manifests(&world.env)
                .await
                .map_err(|e| e.to_string())?;
            let m = catalog_states(&world.env)
                .await
                .map_err(|e| e.to_string())?;
            if p == all_packages && m.get("redhat-operators").map(String::as_str) == Some("READY") {
                Ok(())
            } else {
                Err(format!("packages {p:?}, sources {m:?}"))
            }
        })
        .await?;
    }
    steps.end();

    steps.begin(
        "tunnel gateway killed (kill -9) and restarted by the node: the new process takes the agent's session over (handshake offer) and serves OLM; guest catalog READY within 30 s",
    );
    {
        let world = &*world;
        let node = world.mgmt_node.as_ref().context("management node")?;
        let gw_key = (HCP_NS.to_string(), "hcp-olm-tunnel-gateway".to_string());
        let (seen, recorder) = record_states(world.env.guest.client());
        let t0 = Instant::now();
        let since = |t: Instant| t.duration_since(t0).as_secs_f64();
        until("guest catalog READY before the kill", 120, || async {
            let m = catalog_states(&world.env)
                .await
                .map_err(|e| e.to_string())?;
            match m.get(USER_SOURCE).map(String::as_str) {
                Some("READY") => Ok(()),
                s => Err(format!("{USER_SOURCE} is {s:?}")),
            }
        })
        .await?;
        let before = node.view().pids.get(&gw_key).cloned().unwrap_or_default();
        ensure!(!before.is_empty(), "no tunnel gateway process to kill");
        let killed = Instant::now();
        for pid in &before {
            std::process::Command::new("kill")
                .args(["-KILL", &pid.to_string()])
                .status()?;
        }
        let mut restarted = Vec::new();
        until("the node restarts the gateway container", 60, || {
            let now = node.view().pids.get(&gw_key).cloned().unwrap_or_default();
            let fresh = !now.is_empty() && now.iter().all(|p| !before.contains(p));
            if fresh {
                restarted = now.clone();
            }
            let r = if fresh {
                Ok(())
            } else {
                Err(format!("gateway pids {now:?} (killed {before:?})"))
            };
            async move { r }
        })
        .await?;
        // The new process holds a session and has relayed OLM's calls into the guest (its
        // own counters, read inside its pod's network namespace), and the guest's
        // CatalogSource says READY.
        let pid = restarted[0];
        until("the restarted gateway serves OLM and the guest catalog is READY", 90, || async move {
            let metrics = gateway_metrics(pid)?;
            let value = |prefix: &str| -> f64 {
                metrics
                    .lines()
                    .filter(|l| l.starts_with(prefix))
                    .filter_map(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok())
                    .sum()
            };
            let handshake = value("hcp_olm_tunnel_last_handshake_timestamp_seconds");
            let offers = value("hcp_olm_tunnel_handshake_offers_total");
            let relayed = value(
                "hcp_olm_tunnel_proxy_connections_total{proto=\"socks\",result=\"ok\"}",
            );
            let m = catalog_states(&world.env)
                .await
                .map_err(|e| e.to_string())?;
            let state = m.get(USER_SOURCE).cloned().unwrap_or_default();
            if handshake > 0.0 && offers >= 1.0 && relayed >= 1.0 && state == "READY" {
                Ok(())
            } else {
                Err(format!(
                    "handshake {handshake}, handshakes offered {offers}, relayed socks connections {relayed}, {USER_SOURCE} {state}"
                ))
            }
        })
        .await?;
        let served_after = killed.elapsed();
        (log)(&format!(
            "  gateway kill -9 -> served again after {:.1} s; {USER_SOURCE} states since the kill (s, state): {:?}",
            served_after.as_secs_f64(),
            states_since(&seen, since(killed))
        ));
        // The new process offered the agent a handshake on its first keepalive (10 s as
        // rendered); the agent's own dead-peer path would take 3 x 10 s + 5 s.
        ensure!(
            served_after < Duration::from_secs(30),
            "served again only after {served_after:?}"
        );
        recorder.abort();
    }
    steps.end();

    steps.begin(
        "guest agent killed and kept down: guest catalog goes TRANSIENT_FAILURE and stays there",
    );
    let agent_key = (AGENT_NS.to_string(), "hcp-olm-guest-agent".to_string());
    let (seen, recorder) = record_states(world.env.guest.client());
    let t0 = Instant::now();
    let since = |t: Instant| t.duration_since(t0).as_secs_f64();
    {
        let world = &*world;
        // precondition: READY through the tunnel right now
        until("guest catalog READY before the agent goes", 120, || async {
            let m = catalog_states(&world.env)
                .await
                .map_err(|e| e.to_string())?;
            match m.get(USER_SOURCE).map(String::as_str) {
                Some("READY") => Ok(()),
                s => Err(format!("{USER_SOURCE} is {s:?}")),
            }
        })
        .await?;
        let node = world.guest_node.as_ref().context("guest node")?;
        let held_at = since(Instant::now());
        node.hold(&agent_key.0, &agent_key.1);
        until("agent process gone", 30, || async {
            let pids = node
                .view()
                .pids
                .get(&agent_key)
                .cloned()
                .unwrap_or_default();
            if pids.is_empty() {
                Ok(())
            } else {
                Err(format!("agent pids {pids:?}"))
            }
        })
        .await?;
        until(
            "guest catalog TRANSIENT_FAILURE after the agent went",
            150,
            || async {
                let after = states_since(&seen, held_at);
                if after.iter().any(|(_, s)| s == "TRANSIENT_FAILURE") {
                    Ok(())
                } else {
                    Err(format!("states since the hold: {after:?}"))
                }
            },
        )
        .await?;
        // while the agent is away it must not come back READY
        tokio::time::sleep(Duration::from_secs(10)).await;
        let m = catalog_states(&world.env).await?;
        ensure!(
            m.get(USER_SOURCE).map(String::as_str) != Some("READY"),
            "{USER_SOURCE} READY while the agent is down: {:?}",
            states_since(&seen, held_at)
        );
        (log)(&format!(
            "  {USER_SOURCE} states since the agent went (s, state): {:?}",
            states_since(&seen, held_at)
        ));
    }
    steps.end();

    steps.begin("guest agent back: guest catalog READY again");
    {
        let node = world.guest_node.as_ref().context("guest node")?;
        let released_at = since(Instant::now());
        node.release(&agent_key.0, &agent_key.1);
        let world = &*world;
        let seen = &seen;
        until("guest catalog READY again", 150, || async {
            let after = states_since(seen, released_at);
            if after.last().is_some_and(|(_, s)| s == "READY") {
                Ok(())
            } else {
                Err(format!(
                    "states since the agent returned: {after:?}\n{}",
                    world.node_diagnosis()
                ))
            }
        })
        .await?;
        (log)(&format!(
            "  {USER_SOURCE} states since the agent returned (s, state): {:?}",
            states_since(seen, released_at)
        ));
    }
    recorder.abort();
    steps.end();

    if let Finish::AllWithTakeOver(soak) = finish {
        take_over_steps(world, &mgmt_net, log, steps, soak).await?;
    }
    if finish != Finish::BeforeDelete {
        steps.begin("delete the HostedCluster: nothing of ours left in either cluster");
        delete_hosted_cluster(world, log).await?;
        steps.end();
    }
    Ok(())
}

/// The APIService `v1.packages.operators.coreos.com`'s `Available` status in the guest
/// (`""` when absent).
async fn apiservice_available(env: &Environment) -> Result<String> {
    let api: Api<DynamicObject> = Api::all_with(
        env.guest.client(),
        &ar("apiregistration.k8s.io", "v1", "APIService", "apiservices"),
    );
    let Some(a) = api.get_opt("v1.packages.operators.coreos.com").await? else {
        return Ok(String::new());
    };
    Ok(a.data["status"]["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|c| c["type"] == "Available")
        .and_then(|c| c["status"].as_str())
        .unwrap_or("")
        .to_string())
}

/// Issue 13 item 13 with the real OLM: HyperShift's OLM objects appear in the HCP
/// namespace as its control-plane-operator makes them (created here, named: its Deployments
/// at 0 replicas as it keeps every component `debug-deployments` lists; its catalogs running
/// on the node), the HostedOLM asks for `TakeOver`, and a stand-in for its
/// hosted-cluster-config-operator (`hypershift_standin`, every 5 s) writes the guest's OLM
/// objects. Then both run side by side for `soak`: the packageserver APIService stays
/// `Available` at every 1 s sample, no object is rewritten by anyone, packagemanifests list
/// at every 15 s sample, and Subscriptions to a HyperShift catalog and to the guest catalog
/// are installed meanwhile.
async fn take_over_steps(
    world: &mut World,
    mgmt_net: &PodNetwork,
    log: &Log,
    steps: &mut Steps,
    soak: Duration,
) -> Result<()> {
    use crate::hypershift_standin::{hcco_object_versions, hcco_round};
    steps.begin(
        "HyperShift's OLM objects appear (stand-ins, named) and the HostedOLM takes over: ours serve behind HyperShift's packageserver Service and certificate",
    );
    let mgmt = world.env.management.client();
    let guest = world.env.guest.client();
    // HyperShift's root CA and packageserver serving certificate.
    let ca = crate::pki::Ca::new("root-ca")?;
    let ps_sans = [
        "packageserver".to_string(),
        "packageserver.default".to_string(),
        "packageserver.default.svc".to_string(),
        "packageserver.default.svc.cluster.local".to_string(),
        format!("packageserver.{HCP_NS}.svc"),
        format!("packageserver.{HCP_NS}.svc.cluster.local"),
    ];
    let sans: Vec<&str> = ps_sans.iter().map(String::as_str).collect();
    let leaf = ca.issue("packageserver", &[], &sans, crate::pki::Usage::Server)?;
    put_secret(
        &world.env.management,
        HCP_NS,
        "root-ca",
        "ca.crt",
        ca.cert_pem().as_bytes().to_vec(),
    )
    .await?;
    Api::<Secret>::namespaced(mgmt.clone(), HCP_NS)
        .create(
            &PostParams::default(),
            &Secret {
                metadata: kube::api::ObjectMeta {
                    name: Some("packageserver-cert".into()),
                    namespace: Some(HCP_NS.into()),
                    ..Default::default()
                },
                data: Some(BTreeMap::from([
                    (
                        "tls.crt".to_string(),
                        ByteString(leaf.cert_pem.into_bytes()),
                    ),
                    ("tls.key".to_string(), ByteString(leaf.key_pem.into_bytes())),
                ])),
                ..Default::default()
            },
        )
        .await?;
    let svc_ar = ar("", "v1", "Service", "services");
    apply_json(
        &world.env.management,
        &svc_ar,
        serde_json::json!({
            "apiVersion": "v1", "kind": "Service",
            "metadata": {"name": "packageserver", "namespace": HCP_NS},
            "spec": {"selector": {"app": "packageserver",
                    "hypershift.openshift.io/control-plane-component": "packageserver"},
                "ports": [{"name": "https", "port": 443, "targetPort": 5443, "protocol": "TCP"}]}
        }),
    )
    .await?;
    // HyperShift's catalogs (management placement): Deployment `<name>-catalog`, Service
    // `<name>`, the same index images the node already has.
    let dep_ar = ar("apps", "v1", "Deployment", "deployments");
    for (svc, image) in [
        (
            "redhat-operators",
            "registry.redhat.io/redhat/redhat-operator-index:v4.18",
        ),
        (
            "certified-operators",
            "registry.redhat.io/redhat/certified-operator-index:v4.18",
        ),
        (
            "community-operators",
            "registry.redhat.io/redhat/community-operator-index:v4.18",
        ),
    ] {
        let labels = serde_json::json!({"app": format!("{svc}-catalog")});
        apply_json(&world.env.management, &dep_ar, serde_json::json!({
            "apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": format!("{svc}-catalog"), "namespace": HCP_NS,
                "labels": {"hypershift.openshift.io/managed-by": "control-plane-operator"}},
            "spec": {"replicas": 1, "selector": {"matchLabels": labels},
                "template": {"metadata": {"labels": labels}, "spec": {
                    "automountServiceAccountToken": false,
                    "containers": [{
                        "name": "registry", "image": image,
                        "args": ["serve", "/configs", "--cache-dir=/tmp/cache", "--pprof-addr="],
                        "ports": [{"name": "grpc", "containerPort": 50051}],
                        "readinessProbe": {"grpc": {"port": 50051}, "periodSeconds": 2, "failureThreshold": 30}}]}}}
        })).await?;
        apply_json(&world.env.management, &svc_ar, serde_json::json!({
            "apiVersion": "v1", "kind": "Service",
            "metadata": {"name": svc, "namespace": HCP_NS},
            "spec": {"selector": labels, "ports": [{"name": "grpc", "port": 50051, "targetPort": 50051, "protocol": "TCP"}]}
        })).await?;
    }
    let holms: Api<DynamicObject> = Api::namespaced_with(mgmt.clone(), HCP_NS, &holm_ar());
    holms
        .patch(
            NAME,
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"spec": {"hyperShiftOLM": "TakeOver"}})),
        )
        .await?;
    let hcs: Api<DynamicObject> = Api::namespaced_with(mgmt.clone(), HC_NS, &hc_ar());
    until(
        "debug-deployments lists HyperShift's OLM operators",
        60,
        || async {
            let hc = hcs.get(NAME).await.map_err(|e| e.to_string())?;
            let v = hc
                .metadata
                .annotations
                .unwrap_or_default()
                .get("hypershift.openshift.io/debug-deployments")
                .cloned()
                .unwrap_or_default();
            let listed: Vec<&str> = v.split(',').collect();
            if ["catalog-operator", "olm-operator", "packageserver"]
                .iter()
                .all(|n| listed.contains(n))
            {
                Ok(())
            } else {
                Err(format!("debug-deployments {v:?}"))
            }
        },
    )
    .await?;
    // HyperShift's control-plane-operator keeps every listed component at 0 (stand-in: its
    // Deployments are made at 0).
    for d in ["catalog-operator", "olm-operator", "packageserver"] {
        let labels = if d == "packageserver" {
            serde_json::json!({"app": "packageserver",
                "hypershift.openshift.io/control-plane-component": "packageserver"})
        } else {
            serde_json::json!({"app": d})
        };
        apply_json(
            &world.env.management,
            &dep_ar,
            serde_json::json!({
                "apiVersion": "apps/v1", "kind": "Deployment",
                "metadata": {"name": d, "namespace": HCP_NS,
                    "labels": {"hypershift.openshift.io/managed-by": "control-plane-operator"}},
                "spec": {"replicas": 0, "selector": {"matchLabels": labels},
                    "template": {"metadata": {"labels": labels},
                        "spec": {"containers": [{"name": d, "image": OLM_IMAGE}]}}}
            }),
        )
        .await?;
    }
    let deps: Api<Deployment> = Api::namespaced(mgmt.clone(), HCP_NS);
    until(
        "our packageserver serves HyperShift's certificate behind its Service, rolled out",
        180,
        || async {
            let d = deps
                .get("hcp-olm-packageserver")
                .await
                .map_err(|e| e.to_string())?;
            let tpl = serde_json::to_value(&d.spec).map_err(|e| e.to_string())?;
            let labelled = tpl["template"]["metadata"]["labels"]["app"] == "packageserver";
            let cert = tpl["template"]["spec"]["volumes"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|v| v["secret"]["secretName"] == "packageserver-cert");
            let st = d.status.unwrap_or_default();
            let want = d.spec.and_then(|s| s.replicas).unwrap_or(1);
            let rolled = st.observed_generation == d.metadata.generation
                && st.updated_replicas.unwrap_or(0) == want
                && st.ready_replicas.unwrap_or(0) == want;
            if labelled && cert && rolled {
                Ok(())
            } else {
                Err(format!(
                    "labelled {labelled}, HyperShift's cert {cert}, rolled out {rolled}: {st:?}"
                ))
            }
        },
    )
    .await?;
    // Our guest objects that HyperShift's config operator writes are gone (pruned).
    until(
        "ours gone from the guest objects HyperShift's config operator writes",
        60,
        || async {
            let a = Api::<DynamicObject>::all_with(
                guest.clone(),
                &ar("apiregistration.k8s.io", "v1", "APIService", "apiservices"),
            )
            .get_opt("v1.packages.operators.coreos.com")
            .await
            .map_err(|e| e.to_string())?;
            let ours = |m: Option<kube::api::ObjectMeta>| {
                m.and_then(|m| m.labels)
                    .is_some_and(|l| l.contains_key("app.kubernetes.io/managed-by"))
            };
            let svc = Api::<Service>::namespaced(guest.clone(), "default")
                .get_opt("packageserver")
                .await
                .map_err(|e| e.to_string())?;
            let cs =
                Api::<DynamicObject>::namespaced_with(guest.clone(), MARKETPLACE, &catsrc_ar())
                    .get_opt("redhat-operators")
                    .await
                    .map_err(|e| e.to_string())?;
            let left: Vec<&str> = [
                ("APIService", ours(a.map(|o| o.metadata))),
                (
                    "Service default/packageserver",
                    ours(svc.map(|o| o.metadata)),
                ),
                (
                    "CatalogSource redhat-operators",
                    ours(cs.map(|o| o.metadata)),
                ),
            ]
            .into_iter()
            .filter(|(_, o)| *o)
            .map(|(n, _)| n)
            .collect();
            if left.is_empty() {
                Ok(())
            } else {
                Err(format!("ours still there: {left:?}"))
            }
        },
    )
    .await?;
    let first = hcco_round(&guest, &mgmt, HCP_NS).await?;
    (log)(&format!(
        "  HyperShift's config operator (stand-in), first round: {first:?}"
    ));
    // The guest API server reaches HyperShift's packageserver Service (kube-proxy's part for
    // the host namespace, as before for ours).
    let guest_ip = Api::<Service>::namespaced(guest.clone(), "default")
        .get("packageserver")
        .await?
        .spec
        .and_then(|s| s.cluster_ip)
        .context("guest packageserver ClusterIP")?;
    let theirs_ip = Api::<Service>::namespaced(mgmt.clone(), HCP_NS)
        .get("packageserver")
        .await?
        .spec
        .and_then(|s| s.cluster_ip)
        .context("HyperShift's packageserver ClusterIP")?;
    world.nat = None;
    world.nat = Some(
        HostNat::create(
            mgmt_net,
            &[(
                guest_ip.parse()?,
                443,
                SocketAddr::new(theirs_ip.parse()?, 443),
            )],
        )
        .await?,
    );
    {
        let world = &*world;
        until(
            "APIService Available and every CatalogSource READY",
            240,
            || async {
                let _ = hcco_round(&guest, &mgmt, HCP_NS).await;
                let a = apiservice_available(&world.env)
                    .await
                    .map_err(|e| e.to_string())?;
                let m = catalog_states(&world.env)
                    .await
                    .map_err(|e| e.to_string())?;
                let ready = [
                    "redhat-operators",
                    "certified-operators",
                    "community-operators",
                    USER_SOURCE,
                ]
                .iter()
                .all(|n| m.get(*n).map(String::as_str) == Some("READY"));
                if a == "True" && ready {
                    Ok(())
                } else {
                    Err(format!("APIService Available={a:?}, CatalogSources {m:?}"))
                }
            },
        )
        .await?;
    }
    steps.end();

    steps.begin(&format!(
        "side by side for {}s: APIService Available at every sample, nothing rewritten, packagemanifests listed, Subscriptions installed",
        soak.as_secs()
    ));
    let world = &*world;
    let settled = hcco_object_versions(&guest, true).await?;
    let start = Instant::now();
    let monitor = async {
        let mut samples = 0u32;
        let mut unavailable = Vec::new();
        let mut hcco_writes = Vec::new();
        let mut listings = 0u32;
        let mut listing_failures = Vec::new();
        let mut tick = 0u64;
        while start.elapsed() < soak {
            tokio::time::sleep(Duration::from_secs(1)).await;
            tick += 1;
            samples += 1;
            match apiservice_available(&world.env).await {
                Ok(a) if a == "True" => {}
                other => unavailable.push((start.elapsed().as_secs(), format!("{other:?}"))),
            }
            if tick.is_multiple_of(5) {
                hcco_writes.extend(hcco_round(&guest, &mgmt, HCP_NS).await?);
            }
            if tick.is_multiple_of(15) {
                listings += 1;
                match package_manifests(&world.env).await {
                    Ok(p)
                        if p.iter().any(|n| n.starts_with("guest-widget "))
                            && p.iter().any(|n| n.starts_with("redhat-widget ")) => {}
                    other => {
                        listing_failures.push((start.elapsed().as_secs(), format!("{other:?}")))
                    }
                }
            }
        }
        anyhow::Ok((
            samples,
            unavailable,
            hcco_writes,
            listings,
            listing_failures,
        ))
    };
    let installs = async {
        tokio::time::sleep(soak / 6).await;
        let a = subscribe(
            &world.env,
            "redhat-widget",
            "redhat-operators",
            "takeover-redhat",
        )
        .await?;
        let b = subscribe(&world.env, "guest-widget", USER_SOURCE, "takeover-guest").await?;
        anyhow::Ok((a, b, start.elapsed()))
    };
    let (monitored, installed) = tokio::join!(monitor, installs);
    let (samples, unavailable, hcco_writes, listings, listing_failures) = monitored?;
    let (a, b, installed_at) = installed?;
    let after = hcco_object_versions(&guest, true).await?;
    let changed: Vec<_> = settled
        .iter()
        .filter(|(k, v)| after.get(*k) != Some(v))
        .map(|(k, _)| k.clone())
        .collect();
    (log)(&format!(
        "  {samples} APIService samples, {} not Available; config operator writes after its first rounds: {}; objects changed: {changed:?}; {listings} packagemanifest listings, {} failed; Subscriptions installed by {:.0}s: {a}; {b}",
        unavailable.len(),
        hcco_writes.len(),
        listing_failures.len(),
        installed_at.as_secs_f64()
    ));
    ensure!(
        unavailable.is_empty(),
        "APIService not Available at {unavailable:?}"
    );
    ensure!(
        hcco_writes.is_empty(),
        "ping-pong: the config operator rewrote {hcco_writes:?}"
    );
    ensure!(changed.is_empty(), "written during the soak: {changed:?}");
    ensure!(
        listing_failures.is_empty(),
        "packagemanifests: {listing_failures:?}"
    );
    ensure!(
        installed_at < soak,
        "Subscriptions installed only after the soak ({installed_at:?})"
    );
    steps.end();
    Ok(())
}

/// Subscribes namespace `ns` (with an OwnNamespace OperatorGroup) to `pkg` from `source` and
/// waits for the InstallPlan, the CSV and the operator's Deployment in the guest.
async fn subscribe(env: &Environment, pkg: &str, source: &str, ns: &str) -> Result<String> {
    env.guest.ensure_namespace(ns).await?;
    apply_json(
        &env.guest,
        &ar(
            "operators.coreos.com",
            "v1",
            "OperatorGroup",
            "operatorgroups",
        ),
        serde_json::json!({
            "apiVersion": "operators.coreos.com/v1", "kind": "OperatorGroup",
            "metadata": {"name": ns, "namespace": ns},
            "spec": {"targetNamespaces": [ns]}
        }),
    )
    .await?;
    let sub_ar = ar(
        "operators.coreos.com",
        "v1alpha1",
        "Subscription",
        "subscriptions",
    );
    apply_json(
        &env.guest,
        &sub_ar,
        serde_json::json!({
            "apiVersion": "operators.coreos.com/v1alpha1", "kind": "Subscription",
            "metadata": {"name": pkg, "namespace": ns},
            "spec": {"name": pkg, "channel": "stable", "source": source,
                     "sourceNamespace": MARKETPLACE, "installPlanApproval": "Automatic"}
        }),
    )
    .await?;
    let subs: Api<DynamicObject> = Api::namespaced_with(env.guest.client(), ns, &sub_ar);
    let csvs: Api<DynamicObject> = Api::namespaced_with(
        env.guest.client(),
        ns,
        &ar(
            "operators.coreos.com",
            "v1alpha1",
            "ClusterServiceVersion",
            "clusterserviceversions",
        ),
    );
    let deployments: Api<Deployment> = Api::namespaced(env.guest.client(), ns);
    let csv_name = format!("{pkg}.v0.1.0");
    let dep_name = format!("{pkg}-controller");
    let result = std::sync::Mutex::new(String::new());
    let result_ref = &result;
    until(&format!("{pkg}: operator Deployment in the guest"), 180, || async {
        let sub = subs.get(pkg).await.map_err(|e| e.to_string())?;
        let st = &sub.data["status"];
        let plan = st["installPlanRef"]["name"].as_str().unwrap_or("").to_string();
        let csv = csvs.get_opt(&csv_name).await.map_err(|e| e.to_string())?;
        let phase = csv
            .as_ref()
            .and_then(|c| c.data["status"]["phase"].as_str().map(str::to_string))
            .unwrap_or_default();
        let dep = deployments.get_opt(&dep_name).await.map_err(|e| e.to_string())?;
        if !plan.is_empty() && csv.is_some() && dep.is_some() {
            *result_ref.lock().unwrap_or_else(|p| p.into_inner()) = format!(
                "Subscription {ns}/{pkg}: state {}, InstallPlan {plan}, CSV {csv_name} phase {phase}, Deployment {ns}/{dep_name} created",
                st["state"].as_str().unwrap_or("?")
            );
            Ok(())
        } else {
            Err(format!(
                "installPlan {plan:?}, csv {:?} phase {phase:?}, deployment {}; subscription status {st}",
                csv.is_some(),
                dep.is_some()
            ))
        }
    })
    .await?;
    Ok(result.into_inner().unwrap_or_else(|p| p.into_inner()))
}

async fn set_disable_all(env: &Environment, disable: bool) -> Result<()> {
    let api: Api<DynamicObject> = Api::namespaced_with(env.management.client(), HC_NS, &hc_ar());
    api.patch(
        NAME,
        &PatchParams::default(),
        &Patch::Merge(serde_json::json!({"spec": {"configuration": {"operatorhub": {"disableAllDefaultSources": disable}}}})),
    )
    .await?;
    Ok(())
}

/// Every kind the controller writes, per cluster, to prove deletion leaves none.
fn our_kinds() -> (Vec<ApiResource>, Vec<ApiResource>) {
    let common = vec![
        ar("apps", "v1", "Deployment", "deployments"),
        ar("", "v1", "Service", "services"),
        ar("", "v1", "ServiceAccount", "serviceaccounts"),
        ar("", "v1", "Secret", "secrets"),
        ar("", "v1", "Endpoints", "endpoints"),
        ar("discovery.k8s.io", "v1", "EndpointSlice", "endpointslices"),
        ar("rbac.authorization.k8s.io", "v1", "Role", "roles"),
        ar(
            "rbac.authorization.k8s.io",
            "v1",
            "RoleBinding",
            "rolebindings",
        ),
        ar(
            "rbac.authorization.k8s.io",
            "v1",
            "ClusterRole",
            "clusterroles",
        ),
        ar(
            "rbac.authorization.k8s.io",
            "v1",
            "ClusterRoleBinding",
            "clusterrolebindings",
        ),
    ];
    let mut mgmt = common.clone();
    mgmt.extend([
        ar(
            "networking.k8s.io",
            "v1",
            "NetworkPolicy",
            "networkpolicies",
        ),
        ar(
            "policy",
            "v1",
            "PodDisruptionBudget",
            "poddisruptionbudgets",
        ),
        holm_ar(),
    ]);
    let mut guest = common;
    guest.extend([
        catsrc_ar(),
        ar("apiregistration.k8s.io", "v1", "APIService", "apiservices"),
        ar("config.openshift.io", "v1", "OperatorHub", "operatorhubs"),
        ar("", "v1", "Namespace", "namespaces"),
    ]);
    (mgmt, guest)
}

async fn ours(cluster: &Cluster, kinds: &[ApiResource]) -> Result<Vec<String>> {
    let sel = format!(
        "app.kubernetes.io/managed-by=hcp-olm,hcp-olm.io/hosted-cluster-namespace={HC_NS},hcp-olm.io/hosted-cluster-name={NAME}"
    );
    let mut out = Vec::new();
    for ar in kinds {
        let api: Api<DynamicObject> = Api::all_with(cluster.client(), ar);
        match api.list_metadata(&ListParams::default().labels(&sel)).await {
            Ok(list) => {
                for o in list.items {
                    if o.metadata.deletion_timestamp.is_some() {
                        continue;
                    }
                    out.push(format!(
                        "{}/{}/{}",
                        ar.kind,
                        o.metadata.namespace.unwrap_or_default(),
                        o.metadata.name.unwrap_or_default()
                    ));
                }
            }
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(out)
}

async fn delete_hosted_cluster(world: &World, log: &Log) -> Result<()> {
    let env = &world.env;
    let (mk, gk) = our_kinds();
    let before_m = ours(&env.management, &mk).await?;
    let before_g = ours(&env.guest, &gk).await?;
    ensure!(
        !before_m.is_empty() && !before_g.is_empty(),
        "nothing of ours found before deletion (selector wrong?)"
    );
    (log)(&format!(
        "  before: {} objects of ours in management, {} in the guest",
        before_m.len(),
        before_g.len()
    ));
    let api: Api<DynamicObject> = Api::namespaced_with(env.management.client(), HC_NS, &hc_ar());
    api.delete(NAME, &DeleteParams::default()).await?;
    until(
        "HostedCluster gone and nothing of ours left",
        120,
        || async {
            let hc = api.get_opt(NAME).await.map_err(|e| e.to_string())?;
            let m = ours(&env.management, &mk)
                .await
                .map_err(|e| e.to_string())?;
            let g = ours(&env.guest, &gk).await.map_err(|e| e.to_string())?;
            if hc.is_none() && m.is_empty() && g.is_empty() {
                Ok(())
            } else {
                Err(format!(
                    "HostedCluster present {}; management left {m:?}; guest left {g:?}",
                    hc.is_some()
                ))
            }
        },
    )
    .await?;
    (log)("  after: 0 objects of ours in either cluster, HostedCluster gone");
    Ok(())
}
