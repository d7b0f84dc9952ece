//! The node: a loop that does for a set of namespaces what the deployment controller, the
//! kubelet, the endpoints controller and kube-proxy do together, with processes.
//!
//! - Every Deployment gets `spec.replicas` pods (each its own network namespace in the
//!   [`PodNetwork`]), planned strictly from its template; a changed template replaces them.
//! - Containers that exit are restarted (restartPolicy Always), counted.
//! - Readiness is reported by server-side-applying the Deployment's status (only on change).
//! - Services get DNS names and DNAT rules to their ready pods (selector) or their Endpoints
//!   (no selector).
//!
//! Problems (a plan refused, an init container failing, a probe never passing) are kept as
//! errors the test can assert on, and written to the Deployment's `Progressing` condition.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Endpoints, Secret, Service};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};

use super::image::ImageStore;
use super::plan::{self, NodeFacts, Objects, PodInput, ServiceAccountFiles};
use super::run::{self, PodSite, RunningPod};
use crate::podnet::{PodNet, PodNetwork, Protocol, ServiceEntry, ServicePort};

/// Field manager of the node's status writes.
pub const FIELD_MANAGER: &str = "hcp-olm-e2e-node";

/// What the node needs.
pub struct NodeConfig {
    /// A client with rights to read Deployments, Services, Endpoints, Secrets, ConfigMaps,
    /// write Deployment status and request ServiceAccount tokens in `namespaces`.
    pub client: kube::Client,
    pub namespaces: Vec<String>,
    pub network: Arc<PodNetwork>,
    pub images: ImageStore,
    /// `KUBERNETES_SERVICE_HOST`/`_PORT` as pods see them.
    pub api_host: String,
    pub api_port: u16,
    /// The cluster CA, for the service-account volume's `ca.crt`.
    pub ca_pem: Vec<u8>,
    pub work_dir: PathBuf,
    /// How often the node looks at the cluster.
    pub interval: Duration,
    /// Init containers' time limit, each.
    pub init_timeout: Duration,
}

/// A problem the node met, kept for the test.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeError {
    pub namespace: String,
    pub deployment: String,
    pub message: String,
}

impl std::fmt::Display for NodeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}/{}: {}",
            self.namespace, self.deployment, self.message
        )
    }
}

/// What the test can see of the node.
#[derive(Clone, Debug, Default)]
pub struct NodeView {
    /// Problems of the last pass (a Secret not there yet is one until it appears).
    pub errors: Vec<NodeError>,
    /// Every distinct problem seen since start.
    pub history: Vec<NodeError>,
    /// (namespace, deployment) → container process ids of its pods.
    pub pids: BTreeMap<(String, String), Vec<u32>>,
    /// (namespace, deployment) → ready pods.
    pub ready: BTreeMap<(String, String), usize>,
    /// Container restarts by (namespace, deployment).
    pub restarts: BTreeMap<(String, String), u32>,
    /// The last lines of each container's log, by (namespace, deployment), for diagnosis.
    pub logs: BTreeMap<(String, String), String>,
}

impl NodeView {
    /// The log tails of the Deployments not ready, for error messages.
    pub fn not_ready_logs(&self) -> String {
        self.logs
            .iter()
            .filter(|(k, _)| self.ready.get(*k).copied().unwrap_or(0) == 0)
            .map(|((ns, d), log)| format!("--- {ns}/{d}:\n{log}"))
            .collect::<Vec<_>>()
            .join("\n")
    }
}

/// A running node. Dropping it stops the loop and every pod.
pub struct Node {
    view: Arc<Mutex<NodeView>>,
    task: tokio::task::JoinHandle<()>,
}

impl Node {
    /// Starts the loop.
    pub fn start(cfg: NodeConfig) -> Self {
        let view = Arc::new(Mutex::new(NodeView::default()));
        let task = tokio::spawn(run_loop(cfg, view.clone()));
        Self { view, task }
    }

    /// A snapshot of what the node sees.
    pub fn view(&self) -> NodeView {
        self.view.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Stops the loop; pods are stopped and namespaces deleted as the loop's state drops.
    pub async fn stop(self) {
        self.task.abort();
        let _ = self.task.await;
    }
}

struct PodSlot {
    // field order is drop order: processes before their namespace
    pod: RunningPod,
    net: PodNet,
    labels: BTreeMap<String, String>,
    ready: bool,
}

struct DeploySlot {
    hash: String,
    generation: i64,
    pods: Vec<PodSlot>,
    failed_at: Option<Instant>,
    last_status: Option<serde_json::Value>,
    restarts: u32,
    last_restart: Option<Instant>,
    ports: BTreeMap<String, u16>,
}

async fn run_loop(cfg: NodeConfig, view: Arc<Mutex<NodeView>>) {
    let mut slots: BTreeMap<(String, String), DeploySlot> = BTreeMap::new();
    let mut last_services: Vec<ServiceEntry> = Vec::new();
    let mut serial = 0u64;
    loop {
        let mut errors = Vec::new();
        for ns in &cfg.namespaces {
            sync_namespace(&cfg, ns, &mut slots, &mut errors, &mut serial).await;
        }
        match services(&cfg, &slots).await {
            Ok(s) if s != last_services => match cfg.network.set_services(&s) {
                Ok(()) => last_services = s,
                Err(e) => errors.push(NodeError {
                    namespace: String::new(),
                    deployment: String::new(),
                    message: format!("services: {e}"),
                }),
            },
            Ok(_) => {}
            Err(e) => tracing::debug!(error = %e, "listing services"),
        }
        {
            let mut v = view.lock().unwrap_or_else(|p| p.into_inner());
            for e in &errors {
                if !v.history.contains(e) {
                    v.history.push(e.clone());
                }
            }
            v.errors = errors;
            v.pids = slots
                .iter()
                .map(|(k, s)| {
                    (
                        k.clone(),
                        s.pods
                            .iter()
                            .flat_map(|p| p.pod.processes().map(|(_, pr)| pr.pid()))
                            .collect(),
                    )
                })
                .collect();
            v.ready = slots
                .iter()
                .map(|(k, s)| (k.clone(), s.pods.iter().filter(|p| p.ready).count()))
                .collect();
            v.restarts = slots.iter().map(|(k, s)| (k.clone(), s.restarts)).collect();
            v.logs = slots
                .iter()
                .map(|(k, s)| {
                    let text = s
                        .pods
                        .iter()
                        .flat_map(|p| {
                            p.pod
                                .processes()
                                .map(|(c, pr)| format!("[{c}]\n{}", pr.log_tail(15)))
                        })
                        .collect::<Vec<_>>()
                        .join("\n");
                    (k.clone(), text)
                })
                .collect();
        }
        tokio::time::sleep(cfg.interval).await;
    }
}

fn template_hash(d: &Deployment) -> String {
    let t = d
        .spec
        .as_ref()
        .map(|s| serde_json::to_string(&s.template).unwrap_or_default())
        .unwrap_or_default();
    // FNV-1a: stable, no dependency
    let mut h: u64 = 0xcbf29ce484222325;
    for b in t.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x100000001b3);
    }
    format!("{h:016x}")
}

async fn sync_namespace(
    cfg: &NodeConfig,
    ns: &str,
    slots: &mut BTreeMap<(String, String), DeploySlot>,
    errors: &mut Vec<NodeError>,
    serial: &mut u64,
) {
    let api: Api<Deployment> = Api::namespaced(cfg.client.clone(), ns);
    let list = match api.list(&ListParams::default()).await {
        Ok(l) => l,
        Err(e) => {
            tracing::debug!(namespace = ns, error = %e, "listing deployments");
            return;
        }
    };
    let names: Vec<String> = list
        .items
        .iter()
        .filter_map(|d| d.metadata.name.clone())
        .collect();
    slots.retain(|(n, d), _| n != ns || names.contains(d));
    for d in &list.items {
        let Some(name) = d.metadata.name.clone() else {
            continue;
        };
        let key = (ns.to_string(), name.clone());
        let hash = template_hash(d);
        let generation = d.metadata.generation.unwrap_or(0);
        let replicas = d.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1).max(0) as usize;
        let replace = match slots.get(&key) {
            None => true,
            Some(s) if s.hash != hash || s.pods.len() != replicas && s.failed_at.is_none() => true,
            Some(s) => s
                .failed_at
                .is_some_and(|t| t.elapsed() > Duration::from_secs(5)),
        };
        if replace {
            // old pods go first (their ports and names are reused)
            if let Some(mut old) = slots.remove(&key) {
                old.pods.clear();
            }
            let mut slot = DeploySlot {
                hash,
                generation,
                pods: Vec::new(),
                failed_at: None,
                last_status: None,
                restarts: 0,
                last_restart: None,
                ports: BTreeMap::new(),
            };
            for i in 0..replicas {
                *serial += 1;
                match start_pod(cfg, ns, &name, d, i, *serial).await {
                    Ok((p, ports)) => {
                        slot.ports = ports;
                        slot.pods.push(p);
                    }
                    Err(message) => {
                        errors.push(NodeError {
                            namespace: ns.to_string(),
                            deployment: name.clone(),
                            message,
                        });
                        slot.failed_at = Some(Instant::now());
                        break;
                    }
                }
            }
            slots.insert(key.clone(), slot);
        }
        let Some(slot) = slots.get_mut(&key) else {
            continue;
        };
        slot.generation = generation;
        // readiness; restart exited containers' pods
        let mut restart = Vec::new();
        for (i, p) in slot.pods.iter_mut().enumerate() {
            match p.pod.ready().await {
                Ok(r) => p.ready = r,
                Err(e) => {
                    // restartPolicy Always, with the kubelet's doubling back-off (capped)
                    p.ready = false;
                    let backoff = Duration::from_millis(250)
                        .saturating_mul(1 << slot.restarts.min(6))
                        .min(Duration::from_secs(10));
                    if slot.last_restart.is_none_or(|t| t.elapsed() >= backoff) {
                        errors.push(NodeError {
                            namespace: ns.to_string(),
                            deployment: name.clone(),
                            message: format!("restarting: {e}"),
                        });
                        restart.push(i);
                    }
                }
            }
        }
        for i in restart.into_iter().rev() {
            slot.pods.remove(i);
            slot.restarts += 1;
            slot.last_restart = Some(Instant::now());
            *serial += 1;
            match start_pod(cfg, ns, &name, d, i, *serial).await {
                Ok((p, _)) => slot.pods.insert(i, p),
                Err(message) => errors.push(NodeError {
                    namespace: ns.to_string(),
                    deployment: name.clone(),
                    message,
                }),
            }
        }
        let ready = slot.pods.iter().filter(|p| p.ready).count() as i64;
        let failure = errors
            .iter()
            .rev()
            .find(|e| e.namespace == ns && e.deployment == name)
            .map(|e| e.message.clone());
        let status = deployment_status(generation, replicas as i64, ready, failure.as_deref());
        if slot.last_status.as_ref() != Some(&status) {
            let patch = serde_json::json!({
                "apiVersion": "apps/v1",
                "kind": "Deployment",
                "status": status,
            });
            match api
                .patch_status(
                    &name,
                    &PatchParams::apply(FIELD_MANAGER).force(),
                    &Patch::Apply(&patch),
                )
                .await
            {
                Ok(_) => slot.last_status = Some(status),
                Err(e) => errors.push(NodeError {
                    namespace: ns.to_string(),
                    deployment: name.clone(),
                    message: format!("writing Deployment status: {e}"),
                }),
            }
        }
    }
}

fn deployment_status(
    generation: i64,
    replicas: i64,
    ready: i64,
    failure: Option<&str>,
) -> serde_json::Value {
    let available = ready >= replicas.min(1) && ready > 0 || replicas == 0;
    let mut conditions = vec![serde_json::json!({
        "type": "Available",
        "status": if available { "True" } else { "False" },
        "reason": if available { "MinimumReplicasAvailable" } else { "MinimumReplicasUnavailable" },
        "message": format!("{ready}/{replicas} pods ready (hcp-olm e2e node)"),
    })];
    if let Some(f) = failure {
        conditions.push(serde_json::json!({
            "type": "Progressing",
            "status": "False",
            "reason": "NodeRunnerError",
            "message": f,
        }));
    }
    serde_json::json!({
        "observedGeneration": generation,
        "replicas": replicas,
        "updatedReplicas": replicas,
        "readyReplicas": ready,
        "availableReplicas": ready,
        "unavailableReplicas": (replicas - ready).max(0),
        "conditions": conditions,
    })
}

async fn start_pod(
    cfg: &NodeConfig,
    ns: &str,
    deployment: &str,
    d: &Deployment,
    index: usize,
    serial: u64,
) -> Result<(PodSlot, BTreeMap<String, u16>), String> {
    let tmpl = d
        .spec
        .as_ref()
        .map(|s| s.template.clone())
        .ok_or("no spec")?;
    let spec = tmpl.spec.clone().ok_or("no pod template spec")?;
    let labels = tmpl
        .metadata
        .as_ref()
        .and_then(|m| m.labels.clone())
        .unwrap_or_default();
    let pod_name = format!("{deployment}-{serial:x}");
    let (secrets, cms) = plan::referenced_objects(ns, &spec);
    let mut objects = Objects::default();
    let sapi: Api<Secret> = Api::namespaced(cfg.client.clone(), ns);
    for s in secrets {
        if let Ok(Some(sec)) = sapi.get_opt(&s).await {
            let data = sec
                .data
                .unwrap_or_default()
                .into_iter()
                .map(|(k, v)| (k, v.0))
                .chain(
                    sec.string_data
                        .unwrap_or_default()
                        .into_iter()
                        .map(|(k, v)| (k, v.into_bytes())),
                )
                .collect();
            objects.secrets.insert((ns.to_string(), s), data);
        }
    }
    let capi: Api<ConfigMap> = Api::namespaced(cfg.client.clone(), ns);
    for c in cms {
        if let Ok(Some(cm)) = capi.get_opt(&c).await {
            let data = cm
                .data
                .unwrap_or_default()
                .into_iter()
                .map(|(k, v)| (k, v.into_bytes()))
                .chain(
                    cm.binary_data
                        .unwrap_or_default()
                        .into_iter()
                        .map(|(k, v)| (k, v.0)),
                )
                .collect();
            objects.config_maps.insert((ns.to_string(), c), data);
        }
    }
    let service_account = if plan::automounts_token(&spec) {
        let sa = spec
            .service_account_name
            .clone()
            .unwrap_or_else(|| "default".into());
        Some(ServiceAccountFiles {
            token: token_for(&cfg.client, ns, &sa).await?,
            ca_crt: cfg.ca_pem.clone(),
        })
    } else {
        None
    };
    let net = cfg
        .network
        .add_pod("pod", ns)
        .map_err(|e| format!("pod network: {e}"))?;
    let facts = NodeFacts {
        api_host: cfg.api_host.clone(),
        api_port: cfg.api_port,
        pod_ip: net.ip.to_string(),
        node_name: cfg.network.name().to_string(),
        service_account,
    };
    let plan = plan::plan(
        &PodInput {
            namespace: ns,
            name: &pod_name,
            labels: &labels,
            spec: &spec,
        },
        &objects,
        &cfg.images,
        &facts,
    )
    .map_err(|e| e.to_string())?;
    let ports = plan_ports(&spec);
    let dir = cfg.work_dir.join(ns).join(format!("{pod_name}-{index}"));
    let site = PodSite {
        name: &pod_name,
        netns: Some(&net.netns),
        ip: net.ip.into(),
        dir: &dir,
        init_timeout: cfg.init_timeout,
    };
    let pod = run::start(&plan, &cfg.images, &site)
        .await
        .map_err(|e| e.to_string())?;
    Ok((
        PodSlot {
            pod,
            net,
            labels,
            ready: false,
        },
        ports,
    ))
}

fn plan_ports(spec: &k8s_openapi::api::core::v1::PodSpec) -> BTreeMap<String, u16> {
    spec.containers
        .iter()
        .flat_map(|c| c.ports.iter().flatten())
        .filter_map(|p| Some((p.name.clone()?, p.container_port as u16)))
        .collect()
}

async fn token_for(client: &kube::Client, ns: &str, sa: &str) -> Result<String, String> {
    use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
    let api: Api<k8s_openapi::api::core::v1::ServiceAccount> = Api::namespaced(client.clone(), ns);
    let request = TokenRequest {
        spec: Some(TokenRequestSpec {
            expiration_seconds: Some(3600),
            ..Default::default()
        }),
        ..Default::default()
    };
    api.create_token_request(sa, &PostParams::default(), &request)
        .await
        .map_err(|e| format!("service account {ns}/{sa}: token request: {e}"))?
        .status
        .and_then(|s| s.token)
        .ok_or_else(|| format!("service account {ns}/{sa}: token request returned no token"))
}

async fn services(
    cfg: &NodeConfig,
    slots: &BTreeMap<(String, String), DeploySlot>,
) -> Result<Vec<ServiceEntry>, kube::Error> {
    let mut out = Vec::new();
    for ns in &cfg.namespaces {
        let sapi: Api<Service> = Api::namespaced(cfg.client.clone(), ns);
        let eapi: Api<Endpoints> = Api::namespaced(cfg.client.clone(), ns);
        for svc in sapi.list(&ListParams::default()).await?.items {
            let Some(name) = svc.metadata.name.clone() else {
                continue;
            };
            let Some(spec) = svc.spec else { continue };
            let cluster_ip = spec
                .cluster_ip
                .as_deref()
                .and_then(|ip| ip.parse::<Ipv4Addr>().ok());
            let mut ports = Vec::new();
            match spec.selector.filter(|s| !s.is_empty()) {
                Some(selector) => {
                    let pods: Vec<(&PodSlot, &BTreeMap<String, u16>)> = slots
                        .iter()
                        .filter(|((n, _), _)| n == ns)
                        .flat_map(|(_, s)| s.pods.iter().map(move |p| (p, &s.ports)))
                        .filter(|(p, _)| {
                            p.ready && selector.iter().all(|(k, v)| p.labels.get(k) == Some(v))
                        })
                        .collect();
                    for sp in spec.ports.iter().flatten() {
                        let endpoints = pods
                            .iter()
                            .filter_map(|(p, named)| {
                                let target = match &sp.target_port {
                                    None => u16::try_from(sp.port).ok(),
                                    Some(IntOrString::Int(i)) => u16::try_from(*i).ok(),
                                    Some(IntOrString::String(s)) => named.get(s).copied(),
                                }?;
                                Some((p.net.ip, target))
                            })
                            .collect();
                        ports.push(ServicePort {
                            protocol: protocol(sp.protocol.as_deref()),
                            port: u16::try_from(sp.port).unwrap_or(0),
                            node_port: sp.node_port.and_then(|p| u16::try_from(p).ok()),
                            endpoints,
                        });
                    }
                }
                None => {
                    // no selector: the Endpoints object says where it goes
                    let ep = eapi.get_opt(&name).await?;
                    for sp in spec.ports.iter().flatten() {
                        let mut endpoints = Vec::new();
                        for subset in ep.iter().flat_map(|e| e.subsets.iter().flatten()) {
                            let port = subset
                                .ports
                                .iter()
                                .flatten()
                                .find(|p| p.name == sp.name)
                                .map(|p| p.port);
                            for a in subset.addresses.iter().flatten() {
                                if let (Ok(ip), Some(port)) = (a.ip.parse::<Ipv4Addr>(), port) {
                                    endpoints.push((ip, u16::try_from(port).unwrap_or(0)));
                                }
                            }
                        }
                        ports.push(ServicePort {
                            protocol: protocol(sp.protocol.as_deref()),
                            port: u16::try_from(sp.port).unwrap_or(0),
                            node_port: sp.node_port.and_then(|p| u16::try_from(p).ok()),
                            endpoints,
                        });
                    }
                }
            }
            out.push(ServiceEntry {
                namespace: ns.clone(),
                name,
                cluster_ip,
                ports,
            });
        }
    }
    Ok(out)
}

fn protocol(p: Option<&str>) -> Protocol {
    match p {
        Some("UDP") => Protocol::Udp,
        _ => Protocol::Tcp,
    }
}
