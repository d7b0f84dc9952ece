//! The end-to-end scenario (issue 5), shared by `controlplane/tests/olm_e2e.rs` and
//! `make demo`, on real nodes (issue 15): two real control planes, each with a real node
//! (containerd and runc, the CNI bridge, kubelet, kube-proxy in nftables mode, CoreDNS,
//! kube-controller-manager and kube-scheduler; `crate::realnode`) on a network site of its
//! own; our controller as a process under its ServiceAccount. Everything the controller
//! rendered runs from images pulled by containerd from a test registry that requires auth:
//! in the HCP namespace the real catalog-operator, olm-operator, package-server, opm catalogs
//! and our tunnel gateway (with the HCP pull secret); in the guest our agent and a user's
//! catalog (with the node's pull secret, as OpenShift nodes carry the global one). The guest
//! node reaches the management side only at the management node's address (the gateway's
//! NodePort), so every guest-catalog byte OLM reads crosses the WireGuard tunnel.
//!
//! Nothing the controller rendered is rewritten; the nodes run it as it is or the step fails
//! with the reason. The steps and their durations are recorded for the report.
//!
//! [`run_with`] `GuestStack::Ipv6` (issue 19) runs the same steps with an IPv6-only guest and
//! a dual-stack management side, plus two checks of its own (see [`GuestStack::Ipv6`] and
//! docs/test-environment.md, "The IPv6-only guest variant").

pub mod catalogs;

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail, ensure};
use k8s_openapi::ByteString;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Node, Pod, Secret, Service};
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams,
};

use crate::clusterdns;
use crate::hcpimages;
use crate::realnode::{
    ClusterControllers, HostRoute, NodeOptions, PlainHttpRegistry, RealNode, Site, SiteLink,
    SiteStack,
};
use crate::registry::{Registry, TEST_USER_HASH, TEST_USER_PASSWORD};
use crate::tools::fixtures_dir;
use crate::{Cluster, ClusterOptions, Environment};

pub const HC_NS: &str = "clusters";
pub const NAME: &str = "example";
pub const HCP_NS: &str = "clusters-example";
/// The guest agent's namespace (rendered by the controller).
pub const AGENT_NS: &str = "hcp-olm";
pub const MARKETPLACE: &str = "openshift-marketplace";
/// A guest user's own catalog: Deployment + Service here, CatalogSource in openshift-marketplace.
pub const USER_NS: &str = "user-catalogs";
pub const USER_CATALOG: &str = "widget-catalog";
pub const USER_SOURCE: &str = "guest-widgets";
/// The release's OLM image as the controller names it (`--olm-image`); HostedOLM
/// `spec.images` then names the test registry's copy.
const OLM_IMAGE: &str =
    "registry.test/olm@sha256:0000000000000000000000000000000000000000000000000000000000000001";
const RELEASE: &str = "quay.io/openshift-release-dev/ocp-release:4.18.3-x86_64";
const DEFAULT_SOURCES: [&str; 3] = [
    "redhat-operators",
    "certified-operators",
    "community-operators",
];
const INDEX_IMAGES: [&str; 3] = [
    "registry.redhat.io/redhat/redhat-operator-index:v4.18",
    "registry.redhat.io/redhat/certified-operator-index:v4.18",
    "registry.redhat.io/redhat/community-operator-index:v4.18",
];
/// The guest's Service network, apart from the management cluster's (198.19.224.0/24 +
/// the management site's slot): the gateway tells them apart by range.
const GUEST_SERVICE_CIDR: &str = "198.19.254.0/24";
/// The IPv6-only guest's Service network ([`GuestStack::Ipv6`]).
const GUEST_SERVICE_CIDR6: &str = "fd00:198:254::/112";

/// The guest's address families (issue 19).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GuestStack {
    /// The guest, its node and pods IPv4, as before issue 19.
    Ipv4,
    /// An IPv6-only guest: its API server's Service range IPv6 (its `kubernetes` Service and
    /// every guest Service IPv6, the API server advertising an IPv6 address), its node's
    /// address and pod CIDR IPv6 (pods have no IPv4), kube-proxy and CoreDNS serving IPv6,
    /// its path to the management node IPv6, and the HostedCluster's `spec.networking`
    /// IPv6 only. The management side becomes dual-stack (its API server `v4,v6`, its node
    /// and pods both families), so the tunnel's Service gets an IPv6 NodePort.
    Ipv6,
}

impl std::str::FromStr for GuestStack {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "ipv4" => Ok(Self::Ipv4),
            "ipv6" => Ok(Self::Ipv6),
            other => Err(format!("unknown guest stack {other:?} (ipv4 or ipv6)")),
        }
    }
}
/// The nodes' names.
const MGMT_NODE: &str = "mgmt-a";
const GUEST_NODE: &str = "guest-a";

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
    controller: Option<crate::process::ManagedProcess>,
    controller_log: PathBuf,
    guest_node: Option<RealNode>,
    mgmt_node: Option<RealNode>,
    link: Option<SiteLink>,
    _route: Option<HostRoute>,
    _guest_controllers: Option<ClusterControllers>,
    _mgmt_controllers: Option<ClusterControllers>,
    /// The images pushed for the HCP namespace (HostedOLM `spec.images`).
    overrides: serde_json::Value,
    _registry: Option<Registry>,
    work: tempfile::TempDir,
}

impl World {
    /// The last lines of the controller's log.
    pub fn controller_log_tail(&self, n: usize) -> String {
        let log = std::fs::read_to_string(&self.controller_log).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(n)..].join("\n")
    }

    /// The pods of ours (and the guest user's catalog) that are not Ready, with their status
    /// and the last lines of their containers' logs, read from the nodes.
    pub async fn node_diagnosis(&self) -> String {
        let mut out = String::new();
        for (side, cluster, node, namespaces) in [
            (
                "management",
                &self.env.management,
                &self.mgmt_node,
                &[HCP_NS][..],
            ),
            (
                "guest",
                &self.env.guest,
                &self.guest_node,
                &[AGENT_NS, USER_NS, MARKETPLACE][..],
            ),
        ] {
            let Some(node) = node else { continue };
            for ns in namespaces {
                let pods = match Api::<Pod>::namespaced(cluster.client(), ns)
                    .list(&ListParams::default())
                    .await
                {
                    Ok(l) => l.items,
                    Err(e) => {
                        out.push_str(&format!("--- {side} {ns}: listing pods: {e}\n"));
                        continue;
                    }
                };
                for p in pods.iter().filter(|p| !pod_ready(p)) {
                    let name = p.metadata.name.as_deref().unwrap_or_default();
                    out.push_str(&format!(
                        "--- {side} pod {ns}/{name} not ready: {}\n{}",
                        serde_json::to_string(&p.status).unwrap_or_default(),
                        node.pod_logs(ns, name, 15)
                    ));
                }
            }
            if side == "management"
                && let Ok(pods) = Api::<Pod>::namespaced(cluster.client(), HCP_NS)
                    .list(&ListParams::default())
                    .await
            {
                for p in pods.items.iter().filter_map(|p| p.metadata.name.as_deref()) {
                    if p.starts_with("hcp-olm-catalog-operator")
                        || p.starts_with("hcp-olm-tunnel-gateway")
                    {
                        out.push_str(&format!("--- {p}:\n{}", node.pod_logs(HCP_NS, p, 40)));
                    }
                }
            }
            out.push_str(&format!(
                "--- {side} kubelet (last lines):\n{}\n",
                node.kubelet_log(8)
            ));
        }
        out
    }

    /// Stops the controller, then the nodes (every pod, by PID), the controllers, the
    /// registry and the control planes.
    pub async fn teardown(mut self) {
        if let Some(c) = self.controller.take() {
            c.kill();
        }
        drop(self.guest_node.take());
        drop(self.link.take());
        drop(self.mgmt_node.take());
        let _ = self.work.path();
    }
}

fn pod_ready(p: &Pod) -> bool {
    p.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
        || p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Succeeded")
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
    run_with(bins, log, finish, GuestStack::Ipv4).await
}

/// [`run`] with a guest of the address families `stack`.
pub async fn run_with(bins: &Binaries, log: Log, finish: Finish, stack: GuestStack) -> Outcome {
    let mut steps = Steps {
        log: log.clone(),
        records: Vec::new(),
        current: None,
    };
    let mut world = None;
    let result = run_steps(bins, &log, &mut steps, &mut world, finish, stack).await;
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

/// The agent's persistent keepalive as the controller renders it
/// (`KEEPALIVE_SECONDS` in controlplane/src/render/tunnel.rs).
const KEEPALIVE_AS_RENDERED: Duration = Duration::from_secs(10);

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
    // HyperShift's operator creates these on the management cluster; the HCP pods name them.
    let pcs = ar(
        "scheduling.k8s.io",
        "v1",
        "PriorityClass",
        "priorityclasses",
    );
    for (pc, value) in [
        ("hypershift-control-plane", 100_000_000),
        ("hypershift-api-critical", 100_001_000),
    ] {
        apply_json(
            &env.management,
            &pcs,
            serde_json::json!({
                "apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
                "metadata": {"name": pc}, "value": value, "globalDefault": false,
            }),
        )
        .await?;
    }
    Ok(())
}

/// The HostedCluster of the fixture, with this environment's networks: the guest's Service
/// and pod CIDRs, and the management node's address for NodePort services.
async fn create_hc(
    env: &Environment,
    node_address: IpAddr,
    pod_cidr: &str,
    service_cidr: &str,
    machine_cidr: Option<&str>,
) -> Result<()> {
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
    v["spec"]["networking"]["clusterNetwork"] = serde_json::json!([{"cidr": pod_cidr}]);
    v["spec"]["networking"]["serviceNetwork"] = serde_json::json!([{"cidr": service_cidr}]);
    if let Some(m) = machine_cidr {
        v["spec"]["networking"]["machineNetwork"] = serde_json::json!([{"cidr": m}]);
    }
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

/// A guest user's own catalog: a Deployment (the index image `image`, pulled with the node's
/// pull secret) and Service in `user-catalogs`, and an address-type CatalogSource naming the
/// Service by its in-guest name.
async fn guest_objects(env: &Environment, image: &str) -> Result<()> {
    let svc = ar("", "v1", "Service", "services");
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
                     "automountServiceAccountToken": false,
                     "containers": [{
                         "name": "registry-server", "image": image,
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
    stack: GuestStack,
) -> Result<()> {
    use base64::Engine as _;
    steps.begin("sites, control planes, a registry that requires auth, a real node on each side (containerd, kubelet, kube-proxy, CoreDNS, controller-manager, scheduler)");
    for (what, bin) in [
        ("controller", &bins.controller),
        ("gateway", &bins.gateway),
        ("agent", &bins.agent),
        ("CLI", &bins.cli),
    ] {
        ensure!(bin.is_file(), "{what} binary {} not built", bin.display());
    }
    let bin_dir = bins
        .gateway
        .parent()
        .context("the binaries' directory")?
        .to_path_buf();
    // The guest's site first: the HostedCluster names its pod network.
    let v6 = stack == GuestStack::Ipv6;
    let (msite, gsite) = if v6 {
        (
            Site::create_with(SiteStack::DualStack)?,
            Site::create_with(SiteStack::Ipv6)?,
        )
    } else {
        (Site::create()?, Site::create()?)
    };
    let guest_pod_cidr = gsite.pod_cidr().to_string();
    let guest_service_cidr = if v6 {
        GUEST_SERVICE_CIDR6
    } else {
        GUEST_SERVICE_CIDR
    };
    let mut mo = ClusterOptions::new("management");
    mo.bind_address = msite.host_ip().into();
    // Real controllers run: pods get their ServiceAccount's pull secrets, as in every cluster.
    mo.service_account_admission = true;
    // The host routes this range to this run's management node (below): one range per
    // site slot, so concurrent runs (the demo beside the tests) never share the route.
    mo.service_cidr = format!("198.19.{}.0/24", 224 + msite.slot());
    let mgmt_service_cidr = mo.service_cidr.clone();
    if v6 {
        // dual-stack (IPv4 first, as the management cluster's Services stay IPv4): the
        // tunnel's Service, rendered PreferDualStack, gets an IPv6 ClusterIP and NodePort
        mo.service_cidr = format!("{mgmt_service_cidr},fd00:198:224:{:x}::/112", msite.slot());
    }
    // The guest API server where the HCP pods reach it (HyperShift's kube-apiserver Service);
    // an IPv6-only guest's advertises an IPv6 address (the family of its Service range).
    let mut go = ClusterOptions::new("guest");
    go.bind_address = match msite.host_ip6() {
        Some(a) if v6 => a.into(),
        _ => msite.host_ip().into(),
    };
    go.service_cidr = guest_service_cidr.into();
    go.service_account_admission = true;
    // As HyperShift runs the guest API server: it dials an aggregated API's endpoints (the
    // HCP packageserver), never a guest ClusterIP, which only guest nodes can reach.
    go.extra_apiserver_args
        .push("--enable-aggregator-routing=true".into());
    let (management, guest) = tokio::try_join!(Cluster::start(mo), Cluster::start(go))?;
    let env = Environment { management, guest };
    setup_crds(&env).await?;
    let registry =
        Registry::start_with_htpasswd_on(msite.host_ip().into(), &[("reader", TEST_USER_HASH)])?;
    let reg = registry.addr().to_string();
    let auth =
        base64::engine::general_purpose::STANDARD.encode(format!("reader:{TEST_USER_PASSWORD}"));
    let docker_config = serde_json::to_vec(&serde_json::json!({"auths": {&reg: {"auth": auth}}}))?;
    let oci = hcp_olm_oci::Client::new(hcp_olm_oci::ClientOptions {
        pull_secret: hcp_olm_oci::PullSecret::parse(&docker_config)?,
        plain_http: vec![reg.clone()],
        ..Default::default()
    })?;
    let pause = crate::realnode::push_sandbox_image(&oci, &reg).await?;
    let coredns = clusterdns::push_coredns_image(&oci, &reg).await?;
    let node_opts = |name: &str, service_cidr: &str| -> Result<NodeOptions> {
        let mut o = NodeOptions::new(name, &pause);
        o.sandbox_credentials = Some(format!("reader:{TEST_USER_PASSWORD}"));
        o.plain_http = vec![PlainHttpRegistry { host: reg.clone() }];
        o.cluster_dns = Some(clusterdns::dns_ip(service_cidr)?);
        Ok(o)
    };
    let work = tempfile::Builder::new()
        .prefix("hcp-olm-scenario-")
        .tempdir()?;
    let controller_log = work.path().join("controller.log");
    *slot = Some(World {
        env,
        controller: None,
        controller_log,
        guest_node: None,
        mgmt_node: None,
        link: None,
        _route: None,
        _guest_controllers: None,
        _mgmt_controllers: None,
        overrides: serde_json::Value::Null,
        _registry: Some(registry),
        work,
    });
    let world = slot.as_mut().context("world")?;
    let mgmt_node = RealNode::start(
        msite,
        &world.env.management,
        node_opts(MGMT_NODE, &mgmt_service_cidr)?,
    )
    .await?;
    world._mgmt_controllers = Some(ClusterControllers::start(&world.env.management)?);
    clusterdns::deploy(
        &world.env.management,
        &coredns,
        &docker_config,
        &mgmt_service_cidr,
    )
    .await?;
    // The guest's nodes reach the management side at the management node's address only.
    world.link = Some(gsite.reach_node_of(mgmt_node.site())?);
    // HyperShift runs the guest API server as a pod of the HCP namespace, which reaches the
    // management cluster's Services through kube-proxy; ours runs on the host, and a host
    // route for the management Service range to the management node plays that part (the
    // host originates the traffic, so nothing is forwarded).
    world._route = Some(HostRoute::add(
        &mgmt_service_cidr,
        &mgmt_node.site().node_ip().to_string(),
    )?);
    // where the guest's nodes reach the management node (the NodePort address the
    // HostedCluster publishes): its IPv6 address for an IPv6-only guest
    let mgmt_ip: IpAddr = match mgmt_node.site().node_ip6() {
        Some(a) if v6 => a.into(),
        _ => mgmt_node.site().node_ip().into(),
    };
    let guest_machine_cidr = gsite.node_ip6().filter(|_| v6).map(|a| format!("{}/64", a));
    world.mgmt_node = Some(mgmt_node);
    world._guest_controllers = Some(ClusterControllers::start(&world.env.guest)?);
    let mut gopts = node_opts(GUEST_NODE, guest_service_cidr)?;
    // As OpenShift nodes carry the cluster's global pull secret.
    gopts.pull_secret = Some(docker_config.clone());
    if v6 {
        // The IPv6 node's one IPv4 use is its containerd pulling from the test registry
        // (whose references are `IPv4:port`); everything else it would send by IPv4 is
        // dropped and counted, and the IPv6 check below wants none.
        let registry_addr: std::net::SocketAddrV4 = reg
            .parse()
            .with_context(|| format!("the registry address {reg}"))?;
        gsite.fence_ipv4(registry_addr)?;
    }
    world.guest_node = Some(RealNode::start(gsite, &world.env.guest, gopts).await?);
    clusterdns::deploy(
        &world.env.guest,
        &coredns,
        &docker_config,
        guest_service_cidr,
    )
    .await?;
    (log)(&format!(
        "  management kubeconfig: {}\n  guest kubeconfig:      {}\n  registry {reg} (user reader), management node {mgmt_ip}, guest ({stack:?}) pod network {guest_pod_cidr}, Service network {guest_service_cidr}",
        world.env.management.kubeconfig().display(),
        world.env.guest.kubeconfig().display()
    ));
    steps.end();

    steps.begin("HostedCluster, kubeconfigs, pull secret, controller (as its ServiceAccount)");
    let env = &world.env;
    let guest_kubeconfig = std::fs::read(env.guest.kubeconfig())?;
    put_secret(
        &env.management,
        HC_NS,
        "example-admin-kubeconfig",
        "kubeconfig",
        guest_kubeconfig.clone(),
    )
    .await?;
    // HyperShift's control-plane-operator writes these two into the HCP namespace.
    put_secret(
        &env.management,
        HCP_NS,
        "service-network-admin-kubeconfig",
        "kubeconfig",
        guest_kubeconfig,
    )
    .await?;
    let pull_secret: Secret = serde_json::from_value(serde_json::json!({
        "apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/dockerconfigjson",
        "metadata": {"name": "pull-secret", "namespace": HCP_NS},
        "data": {".dockerconfigjson": base64::engine::general_purpose::STANDARD.encode(&docker_config)},
    }))?;
    Api::<Secret>::namespaced(env.management.client(), HCP_NS)
        .create(&PostParams::default(), &pull_secret)
        .await?;
    create_hc(
        env,
        mgmt_ip,
        &guest_pod_cidr,
        guest_service_cidr,
        guest_machine_cidr.as_deref(),
    )
    .await?;
    let kubeconfig = controller_kubeconfig(env).await?;
    let admin_port = crate::ports::free_port()?;
    let mut cmd = crate::process::command(&bins.controller);
    // The test API servers listen on 127.0.0.1 (test/lab-only flag).
    cmd.env("HCP_OLM_GUEST_SERVER_ALLOWED_CIDRS", "127.0.0.0/8");
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

    steps.begin(
        "images built (as make images builds ours) and pushed; HostedOLM spec.images names them",
    );
    let pushed_started = Instant::now();
    // The operator both Subscriptions install, and a bundle image per package: OLM unpacks
    // each with a Job on the guest node.
    let push = |img: crate::testimages::TestImage| {
        let (oci, reg) = (&oci, reg.clone());
        async move {
            let target = format!("{reg}/{}:{}", img.repository, img.tag);
            let built = crate::realnode::push_image(oci, &target, &img.config, &img.files).await?;
            anyhow::Ok((
                format!("{reg}/{}@{}", img.repository, built.digest()),
                built.size(),
            ))
        }
    };
    let mut operator = crate::testimages::widget_operator()?;
    operator.repository = "widgets/widget-operator".into();
    let (operator_ref, mut bytes) = push(operator).await?;
    let mut bundles = BTreeMap::new();
    for pkg in ["redhat-widget", "guest-widget"] {
        let mut bundle = crate::testimages::bundle_with(pkg, &operator_ref)?;
        bundle.repository = format!("widgets/{pkg}-bundle");
        let (r, n) = push(bundle).await?;
        bytes += n;
        bundles.insert(pkg.to_string(), r);
    }
    let mut refs: BTreeSet<String> = INDEX_IMAGES.iter().map(|s| s.to_string()).collect();
    refs.insert(OLM_IMAGE.into());
    refs.insert(format!(
        "quay.io/hcp-olm/hcp-olm-tunnel-gateway:v{}",
        env!("CARGO_PKG_VERSION")
    ));
    let pushed = hcpimages::push_hcp_images(&refs, &bin_dir, &oci, &reg, &bundles).await?;
    let (user_image, n) = push(crate::testimages::index_with(
        world.work.path(),
        "user/widget-catalog",
        "v1",
        "guest-widget",
        bundles.get("guest-widget").map(String::as_str),
    )?)
    .await?;
    bytes += n + pushed.bytes;
    let (cli_image, _) = hcpimages::push_ours("hcp-olm-cli", &bin_dir, &oci, &reg).await?;
    let holms: Api<DynamicObject> =
        Api::namespaced_with(world.env.management.client(), HCP_NS, &holm_ar());
    until("the controller creates the HostedOLM", 60, || async {
        match holms.get_opt(NAME).await {
            Ok(Some(_)) => Ok(()),
            Ok(None) => Err("no HostedOLM yet".to_string()),
            Err(e) => Err(e.to_string()),
        }
    })
    .await?;
    holms
        .patch(
            NAME,
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"spec": {"images": pushed.overrides}})),
        )
        .await?;
    world.overrides = pushed.overrides.clone();
    (log)(&format!(
        "  {} images ({:.1} MiB, the CLI's not counted) pushed in {:.0}s; HostedOLM spec.images: {}",
        pushed.count + 4,
        bytes as f64 / 1048576.0,
        pushed_started.elapsed().as_secs_f64(),
        pushed.overrides
    ));
    steps.end();

    steps.begin("nodes run the rendered Deployments from their images (management: OLM, catalogs, gateway; guest: agent, user catalog)");
    guest_objects(&world.env, &user_image).await?;
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
        until("Deployments ready", 240, || async {
            let mut missing = Vec::new();
            for (mgmt, ns, name) in &wanted {
                let c = if *mgmt {
                    &world.env.management
                } else {
                    &world.env.guest
                };
                let d = Api::<Deployment>::namespaced(c.client(), ns)
                    .get_opt(name)
                    .await
                    .map_err(|e| e.to_string())?;
                // rolled out: the pods of the current template (the images' override) ready
                let done = d.is_some_and(|d| {
                    let want = d.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1);
                    let st = d.status.unwrap_or_default();
                    st.observed_generation == d.metadata.generation
                        && st.updated_replicas.unwrap_or(0) == want
                        && st.ready_replicas.unwrap_or(0) >= want
                        && st.replicas.unwrap_or(0) == want
                });
                if !done {
                    missing.push(format!("{ns}/{name}"));
                }
            }
            if missing.is_empty() {
                Ok(())
            } else {
                Err(format!("not rolled out: {missing:?}"))
            }
        })
        .await?;
        // Each runs as the user its image or the rendered security context names, never root.
        let mut users = Vec::new();
        for (node, comms) in [
            (
                world.mgmt_node.as_ref(),
                &["catalog", "olm", "package-server", "opm", "hcp-olm-gateway"][..],
            ),
            (world.guest_node.as_ref(), &["hcp-olm-agent", "opm"][..]),
        ] {
            let node = node.context("node")?;
            for comm in comms {
                let pids = node.pids_named(comm);
                ensure!(!pids.is_empty(), "no {comm} process on {}", node.name());
                for pid in pids {
                    let uid = process_uid(pid).with_context(|| format!("uid of {comm} {pid}"))?;
                    ensure!(
                        uid != 0,
                        "{comm} (pid {pid}) on {} runs as root",
                        node.name()
                    );
                    users.push(format!("{comm}@{}={uid}", node.name()));
                }
            }
        }
        users.sort();
        users.dedup();
        (log)(&format!("  processes and their uids: {}", users.join(" ")));
    }
    steps.end();

    if v6 {
        steps.begin("the guest is IPv6-only: its Node, every pod and every Service IPv6 alone, no IPv4 from its node but image pulls; the tunnel's Service dual-stack, its published endpoint IPv6");
        let node = world.guest_node.as_ref().context("guest node")?;
        let (fenced, to) = node.site().ipv4_fenced()?;
        ensure!(
            fenced == 0,
            "the guest node sent or forwarded {fenced} IPv4 packets other than its image pulls (to: {to})"
        );
        let found = ipv6_only_guest(&world.env).await?;
        (log)(&format!("  {found}"));
        steps.end();
    }

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
                .map_err(|e| format!("{e:#}"))?;
            if names == all_packages {
                Ok(())
            } else {
                Err(format!("{names:?}"))
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

    steps.begin("a guest workload (a pod of the CLI's image) reads a control-plane catalog through the agent's guest Service");
    {
        let addr = format!("hcp-olm-redhat-operators.{AGENT_NS}.svc:50051");
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "browse-catalog", "namespace": "default"},
            "spec": {"restartPolicy": "OnFailure", "automountServiceAccountToken": false,
                "securityContext": {"runAsNonRoot": true, "seccompProfile": {"type": "RuntimeDefault"}},
                "containers": [{"name": "cli", "image": cli_image,
                    // exits non-zero unless the catalog serves the package
                    "args": ["catalog", "--addr", addr, "--timeout", "5s", "channels", "redhat-widget"],
                    "terminationMessagePolicy": "FallbackToLogsOnError",
                    "securityContext": {"allowPrivilegeEscalation": false, "readOnlyRootFilesystem": true,
                        "capabilities": {"drop": ["ALL"]}}}]}
        }))?;
        let pods: Api<Pod> = Api::namespaced(world.env.guest.client(), "default");
        pods.create(&PostParams::default(), &pod).await?;
        // (the kubelet may remove a finished pod's containers, and their logs, at once: the
        // exit status says it; a failed run's last lines are in its termination message)
        let runs = std::sync::atomic::AtomicI32::new(0);
        let runs = &runs;
        until(
            "the CLI pod reads the package from the catalog",
            90,
            || async {
                let p = pods
                    .get("browse-catalog")
                    .await
                    .map_err(|e| e.to_string())?;
                let st = p.status.unwrap_or_default();
                let phase = st.phase.unwrap_or_default();
                let cs = st.container_statuses.unwrap_or_default();
                runs.store(
                    cs.first().map_or(0, |c| c.restart_count + 1),
                    std::sync::atomic::Ordering::Relaxed,
                );
                if phase == "Succeeded" {
                    Ok(())
                } else {
                    Err(format!(
                        "pod phase {phase:?}; container: {:?}",
                        cs.first().map(|c| (&c.state, &c.last_state))
                    ))
                }
            },
        )
        .await?;
        (log)(&format!(
            "  guest pod (CLI image) -> {addr}: `hcp-olm catalog channels redhat-widget` exited 0 (runs: {})",
            runs.load(std::sync::atomic::Ordering::Relaxed)
        ));
        pods.delete("browse-catalog", &DeleteParams::default())
            .await?;
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
        "tunnel gateway killed (kill -9) and restarted by the kubelet: the new process takes the agent's session over (its handshake offer, or the agent's own handshake when that comes first) and serves OLM; guest catalog READY within 30 s",
    );
    {
        let world = &*world;
        let node = world.mgmt_node.as_ref().context("management node")?;
        let (seen, recorder) = record_states(world.env.guest.client());
        let t0 = Instant::now();
        let since = |t: Instant| t.duration_since(t0).as_secs_f64();
        wait_user_catalog_ready(world, log, "before the kill").await?;
        let before = node.pids_named("hcp-olm-gateway");
        ensure!(!before.is_empty(), "no tunnel gateway process to kill");
        let killed = Instant::now();
        for pid in &before {
            std::process::Command::new("kill")
                .args(["-KILL", &pid.to_string()])
                .status()?;
        }
        let mut restarted = Vec::new();
        until("the kubelet restarts the gateway container", 60, || {
            let now = node.pids_named("hcp-olm-gateway");
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
        let restarted_after = killed.elapsed();
        // The new process holds a session and has relayed OLM's calls into the guest (its
        // own counters, read inside its pod's network namespace), and the guest's
        // CatalogSource says READY. It takes the session over with a handshake offer when the
        // agent's next keepalive (every 10 s as rendered) reaches it first; when the kubelet
        // took longer than that to restart it (seen on a loaded machine), the agent's own
        // handshake (after 15 s of unanswered data, or its 120 s rekey falling in the
        // window) may come first, and either path counts: a run on a loaded machine saw the
        // gateway back after less than 10 s and the agent's handshake first (0 offers).
        // The offer itself is asserted without that race by
        // `proxy_e2e::replicas_forward_to_the_session_holder_and_survive_its_kill`; here its
        // count is only reported.
        let offer_likely = restarted_after < KEEPALIVE_AS_RENDERED;
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
            if handshake > 0.0
                && relayed >= 1.0
                && state == "READY"
            {
                Ok(())
            } else {
                Err(format!(
                    "handshake {handshake}, handshakes offered {offers} (likely: {offer_likely}, the kubelet restarted the gateway after {:.1} s), relayed socks connections {relayed}, {USER_SOURCE} {state}",
                    restarted_after.as_secs_f64()
                ))
            }
        })
        .await?;
        let served_after = killed.elapsed();
        let offers: f64 = gateway_metrics(pid)
            .map(|m| {
                m.lines()
                    .filter(|l| l.starts_with("hcp_olm_tunnel_handshake_offers_total"))
                    .filter_map(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok())
                    .sum()
            })
            .unwrap_or(f64::NAN);
        (log)(&format!(
            "  gateway kill -9 -> restarted by the kubelet after {:.1} s, handshakes offered {offers} (an offer likely: {offer_likely}), served again after {:.1} s; {USER_SOURCE} states since the kill (s, state): {:?}",
            restarted_after.as_secs_f64(),
            served_after.as_secs_f64(),
            states_since(&seen, since(killed))
        ));
        // Whichever handshake came first, it must come well before the agent's dead-peer
        // path alone would give up on the old session (3 x 10 s + 5 s).
        ensure!(
            served_after < Duration::from_secs(30),
            "served again only after {served_after:?}"
        );
        recorder.abort();
    }
    steps.end();

    steps.begin(
        "guest agent killed (kill -9) and restarted by the kubelet: guest catalog READY again",
    );
    {
        let world = &*world;
        let node = world.guest_node.as_ref().context("guest node")?;
        let (seen, recorder) = record_states(world.env.guest.client());
        let t0 = Instant::now();
        wait_user_catalog_ready(world, log, "before the kill").await?;
        let before = node.pids_named("hcp-olm-agent");
        ensure!(!before.is_empty(), "no guest agent process to kill");
        let killed = t0.elapsed().as_secs_f64();
        for pid in &before {
            std::process::Command::new("kill")
                .args(["-KILL", &pid.to_string()])
                .status()?;
        }
        let killed_wall = k8s_openapi::jiff::Timestamp::now();
        // READY again through a connection OLM made after the kill (its `lastConnect`, which
        // OLM stamps at each state change, has seconds only)
        until(
            "a new agent process and the guest catalog READY again",
            120,
            || async {
                let now = node.pids_named("hcp-olm-agent");
                let fresh = !now.is_empty() && now.iter().all(|p| !before.contains(p));
                let cs = Api::<DynamicObject>::namespaced_with(
                    world.env.guest.client(),
                    MARKETPLACE,
                    &catsrc_ar(),
                )
                .get(USER_SOURCE)
                .await
                .map_err(|e| e.to_string())?;
                let st = &cs.data["status"]["connectionState"];
                let state = st["lastObservedState"].as_str().unwrap_or_default();
                let since_kill = st["lastConnect"]
                    .as_str()
                    .and_then(|t| t.parse::<k8s_openapi::jiff::Timestamp>().ok())
                    .is_some_and(|t| t.as_second() >= killed_wall.as_second());
                if fresh && state == "READY" && since_kill {
                    Ok(())
                } else {
                    Err(format!(
                        "agent pids {now:?} (killed {before:?}), {USER_SOURCE}: {st}"
                    ))
                }
            },
        )
        .await?;
        (log)(&format!(
            "  agent kill -9 -> a new agent and {USER_SOURCE} READY after {:.1} s; states since the kill (s, state): {:?}",
            t0.elapsed().as_secs_f64() - killed,
            states_since(&seen, killed)
        ));
        recorder.abort();
    }
    steps.end();

    steps.begin(
        "the guest site's path to the management side cut and kept down: guest catalog goes TRANSIENT_FAILURE and stays there",
    );
    let (seen, recorder) = record_states(world.env.guest.client());
    let t0 = Instant::now();
    let since = |t: Instant| t.duration_since(t0).as_secs_f64();
    {
        let world = &*world;
        wait_user_catalog_ready(world, log, "before the cut").await?;
        let link = world.link.as_ref().context("site link")?;
        let cut_at = since(Instant::now());
        link.set_cut(true)?;
        until(
            "guest catalog TRANSIENT_FAILURE after the cut",
            150,
            || async {
                let after = states_since(&seen, cut_at);
                if after.iter().any(|(_, s)| s == "TRANSIENT_FAILURE") {
                    Ok(())
                } else {
                    Err(format!("states since the cut: {after:?}"))
                }
            },
        )
        .await?;
        // while the path is down it must not come back READY
        tokio::time::sleep(Duration::from_secs(10)).await;
        let m = catalog_states(&world.env).await?;
        ensure!(
            m.get(USER_SOURCE).map(String::as_str) != Some("READY"),
            "{USER_SOURCE} READY while the path is cut: {:?}",
            states_since(&seen, cut_at)
        );
        (log)(&format!(
            "  {USER_SOURCE} states since the cut (s, state): {:?}",
            states_since(&seen, cut_at)
        ));
    }
    steps.end();

    steps.begin("the path back: guest catalog READY again");
    {
        let world = &*world;
        let link = world.link.as_ref().context("site link")?;
        let restored_at = since(Instant::now());
        link.set_cut(false)?;
        let seen = &seen;
        until("guest catalog READY again", 150, || async {
            let after = states_since(seen, restored_at);
            if after.last().is_some_and(|(_, s)| s == "READY") {
                Ok(())
            } else {
                Err(format!("states since the path returned: {after:?}"))
            }
        })
        .await?;
        (log)(&format!(
            "  {USER_SOURCE} states since the path returned (s, state): {:?}",
            states_since(seen, restored_at)
        ));
    }
    recorder.abort();
    steps.end();

    if let Finish::AllWithTakeOver(soak) = finish {
        take_over_steps(world, log, steps, soak).await?;
    }
    if v6 {
        steps.begin("the guest node sent no IPv4 but its image pulls during the whole run");
        let node = world.guest_node.as_ref().context("guest node")?;
        let (fenced, to) = node.site().ipv4_fenced()?;
        ensure!(
            fenced == 0,
            "the guest node sent or forwarded {fenced} IPv4 packets other than its image pulls (to: {to})"
        );
        steps.end();
    }
    if finish != Finish::BeforeDelete {
        steps.begin("delete the HostedCluster: nothing of ours left in either cluster");
        delete_hosted_cluster(world, log).await?;
        steps.end();
    }
    Ok(())
}

/// The IPv6-only guest variant's own check ([`GuestStack::Ipv6`]), once what the controller
/// rendered runs: the guest Node's addresses, every guest pod's addresses and every guest
/// Service's families are IPv6 alone (so whatever reaches a guest pod or Service crossed the
/// tunnel over IPv6, and the agent, an IPv6-only pod, reached the gateway over IPv6); the
/// tunnel's Service has both families and the endpoint the agent was given (HostedOLM
/// `status.tunnel.endpoint`) is an IPv6 address. Returns what it found, for the log.
async fn ipv6_only_guest(env: &Environment) -> Result<String> {
    let v6 = |a: &str| a.parse::<IpAddr>().is_ok_and(|a| a.is_ipv6());
    let guest = env.guest.client();
    let mut node_ips = Vec::new();
    for n in Api::<Node>::all(guest.clone())
        .list(&ListParams::default())
        .await?
        .items
    {
        let name = n.metadata.name.clone().unwrap_or_default();
        let ips: Vec<String> = n
            .status
            .and_then(|s| s.addresses)
            .unwrap_or_default()
            .into_iter()
            .filter(|a| a.type_ == "InternalIP")
            .map(|a| a.address)
            .collect();
        ensure!(
            !ips.is_empty() && ips.iter().all(|a| v6(a)),
            "guest Node {name} has InternalIPs {ips:?}, not IPv6 alone"
        );
        node_ips.extend(ips);
    }
    ensure!(!node_ips.is_empty(), "the guest has no Node");
    let pods = Api::<Pod>::all(guest.clone())
        .list(&ListParams::default())
        .await?
        .items;
    let mut pod_count = 0;
    for p in &pods {
        let name = format!(
            "{}/{}",
            p.metadata.namespace.as_deref().unwrap_or_default(),
            p.metadata.name.as_deref().unwrap_or_default()
        );
        let ips: Vec<String> = p
            .status
            .as_ref()
            .and_then(|s| s.pod_ips.clone())
            .unwrap_or_default()
            .into_iter()
            .map(|i| i.ip)
            .collect();
        if ips.is_empty() {
            continue;
        }
        ensure!(
            ips.iter().all(|a| v6(a)),
            "guest pod {name} has addresses {ips:?}, not IPv6 alone"
        );
        pod_count += 1;
    }
    ensure!(
        pods.iter()
            .any(|p| p.metadata.namespace.as_deref() == Some(AGENT_NS)),
        "no guest agent pod"
    );
    let services = Api::<Service>::all(guest)
        .list(&ListParams::default())
        .await?;
    for svc in &services.items {
        let spec = svc.spec.clone().unwrap_or_default();
        let families = spec.ip_families.unwrap_or_default();
        ensure!(
            families == ["IPv6"],
            "guest Service {}/{} has ipFamilies {families:?}, not [IPv6]",
            svc.metadata.namespace.as_deref().unwrap_or_default(),
            svc.metadata.name.as_deref().unwrap_or_default()
        );
    }
    let wg = Api::<Service>::namespaced(env.management.client(), HCP_NS)
        .get("hcp-olm-tunnel-gateway-wg")
        .await?
        .spec
        .unwrap_or_default();
    let wg_ips = wg.cluster_ips.unwrap_or_default();
    ensure!(
        wg_ips.iter().any(|a| v6(a)),
        "the tunnel's Service has ClusterIPs {wg_ips:?} (policy {:?}), none IPv6",
        wg.ip_family_policy
    );
    let endpoint = hosted_olm(env).await?["status"]["tunnel"]["endpoint"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    ensure!(
        endpoint
            .parse::<std::net::SocketAddr>()
            .is_ok_and(|a| a.is_ipv6()),
        "the tunnel endpoint the agent is given is {endpoint:?}, not an IPv6 address"
    );
    Ok(format!(
        "guest Node addresses {node_ips:?}; {pod_count} guest pods and {} guest Services, IPv6 alone; the tunnel's Service ClusterIPs {wg_ips:?}, endpoint {endpoint}",
        services.items.len()
    ))
}

/// Waits (bounded) until the guest user's CatalogSource is READY; `when` names the moment.
///
/// catalog-operator can leave a CatalogSource's status at `IDLE` after its connection dropped
/// and came back (seen once in four runs after the agent's rollout: its log showed IDLE,
/// CONNECTING, READY, the status kept IDLE for minutes). After 20 s not READY, the
/// CatalogSource gets an annotation (a user's edit), which makes catalog-operator sync it and
/// write its current state; each such nudge is logged.
async fn wait_user_catalog_ready(world: &World, log: &Log, when: &str) -> Result<()> {
    let api: Api<DynamicObject> =
        Api::namespaced_with(world.env.guest.client(), MARKETPLACE, &catsrc_ar());
    let started = Instant::now();
    let nudges = std::sync::atomic::AtomicU32::new(0);
    let nudges = &nudges;
    until(&format!("guest catalog READY {when}"), 120, || async {
        let m = catalog_states(&world.env)
            .await
            .map_err(|e| e.to_string())?;
        match m.get(USER_SOURCE).map(String::as_str) {
            Some("READY") => Ok(()),
            s => {
                let n = nudges.load(std::sync::atomic::Ordering::Relaxed);
                if started.elapsed() > Duration::from_secs(20 * (u64::from(n) + 1)) {
                    nudges.store(n + 1, std::sync::atomic::Ordering::Relaxed);
                    (log)(&format!(
                        "  {USER_SOURCE} {s:?} for {:.0}s {when}: annotating it (nudge {})",
                        started.elapsed().as_secs_f64(),
                        n + 1
                    ));
                    let _ = api
                        .patch(
                            USER_SOURCE,
                            &PatchParams::default(),
                            &Patch::Merge(serde_json::json!({"metadata": {"annotations": {
                                "hcp-olm.io/e2e-nudge": (n + 1).to_string()}}})),
                        )
                        .await;
                }
                Err(format!("{USER_SOURCE} is {s:?}"))
            }
        }
    })
    .await
}

/// The effective user id of process `pid` (`/proc/<pid>/status`).
fn process_uid(pid: u32) -> Option<u32> {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
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

/// Evicts every running pod of ours in `ns` through pods/eviction as a dry run (the
/// PodDisruptionBudget checks run, nothing is deleted): each must answer 201 or 429, never
/// 500 (a pod two PDBs select). Says how many of each, and fails while no packageserver pod
/// of ours runs (a Pending pod skips the PDB checks, so it would prove nothing).
async fn evict_each_of_ours(cluster: &Cluster, ns: &str) -> Result<String> {
    // kube's default client retries a 429 (up to 15 times, honouring Retry-After): here a
    // 429 is an answer, so this client does not retry.
    let kubeconfig = kube::config::Kubeconfig::read_from(cluster.kubeconfig())?;
    let mut config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default()).await?;
    config.default_retry = false;
    let pods: Api<Pod> = Api::namespaced(kube::Client::try_from(config)?, ns);
    let list = pods
        .list(&ListParams::default().labels("app.kubernetes.io/managed-by=hcp-olm"))
        .await?;
    let (mut allowed, mut budget, mut packageservers) = (0, 0, 0);
    for p in list.items {
        let name = p.metadata.name.clone().unwrap_or_default();
        let running = p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running");
        if !running || p.metadata.deletion_timestamp.is_some() {
            continue;
        }
        let params = kube::api::EvictParams {
            delete_options: Some(DeleteParams {
                dry_run: true,
                ..Default::default()
            }),
            post_options: PostParams {
                dry_run: true,
                ..Default::default()
            },
        };
        let answer = tokio::time::timeout(Duration::from_secs(10), pods.evict(&name, &params))
            .await
            .with_context(|| format!("evicting pod {ns}/{name} (dry run): no answer in 10 s"))?;
        match answer {
            Ok(_) => allowed += 1,
            Err(kube::Error::Api(e)) if e.code == 429 => budget += 1,
            Err(e) => bail!("evicting pod {ns}/{name} (dry run): {e}"),
        }
        if name.starts_with("hcp-olm-packageserver-") {
            packageservers += 1;
        }
    }
    ensure!(
        packageservers > 0,
        "no running packageserver pod of ours in {ns} yet"
    );
    Ok(format!(
        "{} pods of ours ({packageservers} packageserver): {allowed} allowed (201), {budget} held by their budget (429), none refused (500)",
        allowed + budget
    ))
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
    // `<name>`, the same index images ours run (the registry's copies, pulled with the HCP
    // pull secret as HyperShift's control-plane-operator gives its catalogs).
    let dep_ar = ar("apps", "v1", "Deployment", "deployments");
    for svc in DEFAULT_SOURCES {
        let image = world.overrides["catalogs"][svc]
            .as_str()
            .with_context(|| format!("no pushed image for {svc}"))?
            .to_string();
        let labels = serde_json::json!({"app": format!("{svc}-catalog")});
        apply_json(&world.env.management, &dep_ar, serde_json::json!({
            "apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": format!("{svc}-catalog"), "namespace": HCP_NS,
                "labels": {"hypershift.openshift.io/managed-by": "control-plane-operator"}},
            "spec": {"replicas": 1, "selector": {"matchLabels": labels},
                "template": {"metadata": {"labels": labels}, "spec": {
                    "automountServiceAccountToken": false,
                    "imagePullSecrets": [{"name": "pull-secret"}],
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
    // Issue 37 item 3: HyperShift's `packageserver-pdb` (stand-in, named; as its
    // control-plane-operator renders it, selecting the labels our pods now carry) and ours
    // must never both select a pod: the Eviction API refuses such a pod with a 500, and
    // management node drains stall. Every running pod of ours is evicted through
    // pods/eviction as a dry run (the PDB checks run, nothing is deleted).
    apply_json(
        &world.env.management,
        &ar(
            "policy",
            "v1",
            "PodDisruptionBudget",
            "poddisruptionbudgets",
        ),
        serde_json::json!({
            "apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
            "metadata": {"name": "packageserver-pdb", "namespace": HCP_NS,
                "labels": {"hypershift.openshift.io/managed-by": "control-plane-operator"}},
            "spec": {"minAvailable": 1,
                "selector": {"matchLabels": {"app": "packageserver",
                    "hypershift.openshift.io/control-plane-component": "packageserver"}},
                "unhealthyPodEvictionPolicy": "AlwaysAllow"}
        }),
    )
    .await?;
    let evicted = std::sync::Mutex::new(String::new());
    until(
        "each pod of ours can be evicted beside HyperShift's packageserver-pdb (201 or 429, never 500)",
        60,
        || async {
            let line = evict_each_of_ours(&world.env.management, HCP_NS)
                .await
                .map_err(|e| format!("{e:#}"))?;
            *evicted.lock().unwrap_or_else(|p| p.into_inner()) = line;
            Ok(())
        },
    )
    .await?;
    (log)(&format!(
        "eviction (dry run) beside HyperShift's packageserver-pdb: {}",
        evicted.lock().unwrap_or_else(|p| p.into_inner())
    ));
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
    // The guest API server reaches HyperShift's packageserver Service as ours: through the
    // host route for the management Service range.
    {
        let world = &*world;
        until(
            "APIService Available, every CatalogSource READY, both sides' packages listed",
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
                // and the packageserver now serving (rolled out behind HyperShift's Service)
                // lists both sides' packages
                let p = package_manifests(&world.env)
                    .await
                    .map_err(|e| e.to_string())?;
                let listed = p.iter().any(|n| n.starts_with("guest-widget "))
                    && p.iter().any(|n| n.starts_with("redhat-widget "));
                if a == "True" && ready && listed {
                    Ok(())
                } else {
                    Err(format!(
                        "APIService Available={a:?}, CatalogSources {m:?}, packagemanifests {p:?}"
                    ))
                }
            },
        )
        .await?;
        // The soak measures the steady state: a packageserver that has just rolled out has
        // sometimes listed both sides once and, 15 s later, not yet the guest catalog's
        // package again (twice under make test's parallel load). Settled means three listings
        // 5 s apart show both sides; a miss starts the count again (bounded).
        let settle_until = Instant::now() + Duration::from_secs(120);
        let mut in_a_row = 0;
        let mut misses = 0;
        while in_a_row < 3 {
            tokio::time::sleep(Duration::from_secs(5)).await;
            let p = package_manifests(&world.env).await.unwrap_or_default();
            if p.iter().any(|n| n.starts_with("guest-widget "))
                && p.iter().any(|n| n.starts_with("redhat-widget "))
            {
                in_a_row += 1;
            } else {
                in_a_row = 0;
                misses += 1;
                ensure!(
                    Instant::now() < settle_until,
                    "packagemanifests did not list both sides three times in a row within 120 s after the takeover: {p:?}"
                );
            }
        }
        (log)(&format!(
            "  settled: both sides listed three times in a row ({misses} listings missed a side before)"
        ));
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

/// Subscribes namespace `ns` (enforcing `restricted`, with an OwnNamespace OperatorGroup) to
/// `pkg` from `source` and waits for the InstallPlan, the CSV `Succeeded` and the operator's
/// pod `Running` on the guest node (its bundle unpacked by OLM's Job from the bundle image).
async fn subscribe(env: &Environment, pkg: &str, source: &str, ns: &str) -> Result<String> {
    // The namespace enforces the `restricted` Pod Security level: the operator's pod must meet it.
    apply_json(
        &env.guest,
        &ar("", "v1", "Namespace", "namespaces"),
        serde_json::json!({
            "apiVersion": "v1", "kind": "Namespace",
            "metadata": {"name": ns, "labels": {"pod-security.kubernetes.io/enforce": "restricted"}}
        }),
    )
    .await?;
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
    let pods: Api<Pod> = Api::namespaced(env.guest.client(), ns);
    let csv_name = format!("{pkg}.v0.1.0");
    let result = std::sync::Mutex::new(String::new());
    let result_ref = &result;
    let started = Instant::now();
    until(&format!("{pkg}: CSV Succeeded and the operator's pod Running on the guest node"), 300, || async {
        let sub = subs.get(pkg).await.map_err(|e| e.to_string())?;
        let st = &sub.data["status"];
        let plan = st["installPlanRef"]["name"].as_str().unwrap_or("").to_string();
        let csv = csvs.get_opt(&csv_name).await.map_err(|e| e.to_string())?;
        let phase = csv
            .as_ref()
            .and_then(|c| c.data["status"]["phase"].as_str().map(str::to_string))
            .unwrap_or_default();
        let running = pods
            .list(&ListParams::default().labels(&format!("app={pkg}")))
            .await
            .map_err(|e| e.to_string())?
            .items
            .into_iter()
            .find(|p| {
                p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(GUEST_NODE)
                    && p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
            });
        match (phase.as_str(), running) {
            ("Succeeded", Some(p)) if !plan.is_empty() => {
                *result_ref.lock().unwrap_or_else(|p| p.into_inner()) = format!(
                    "Subscription {ns}/{pkg}: state {}, InstallPlan {plan}, CSV {csv_name} Succeeded, operator pod {} Running on {GUEST_NODE} ({:.0}s)",
                    st["state"].as_str().unwrap_or("?"),
                    p.metadata.name.unwrap_or_default(),
                    started.elapsed().as_secs_f64()
                );
                Ok(())
            }
            (_, running) => Err(format!(
                "installPlan {plan:?}, CSV phase {phase:?}, operator pod running {}; subscription status {st}",
                running.is_some()
            )),
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
