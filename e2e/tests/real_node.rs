//! A real node (containerd 2, runc, the CNI bridge, the kubelet of the pinned Kubernetes
//! release; `hcp_olm_e2e::realnode`) runs our catalog server from its image, pulled by
//! containerd from a registry that requires auth, with the pod's pull secret, in a namespace
//! that enforces the `restricted` Pod Security level:
//! - the pod becomes Ready through the kubelet's own gRPC readiness probe, its process runs as
//!   uid 65532 with a read-only root, and the host reaches it at its pod IP;
//! - a catalog image shaped like Red Hat's index images (FBC under `/configs`, opm and its
//!   cache owned by the image's user; `Image::to_oci` of the scenario's index image) is served
//!   by the real opm;
//! - a wrong pull secret and a missing image end as the kubelet's `ErrImagePull` /
//!   `ImagePullBackOff` naming the image and why, and the controller's reading of pod status
//!   (`runtime::pods::problem`, what HostedOLM status shows) says the same;
//! - with kube-controller-manager and kube-scheduler, a Deployment's pods are scheduled onto
//!   the node, become Ready and are published in their Service's EndpointSlice, and the
//!   Service's ClusterIP answers from the node through kube-proxy's nftables rules, as does
//!   the `kubernetes` Service (in-cluster API access);
//! - deleting the pod stops the server with SIGTERM (it drains and exits well before the
//!   grace period would have the kubelet SIGKILL it);
//! - the node's teardown leaves no process, cgroup, mount or namespace behind.
//!
//! The pod here is written by the test in the shape the controller renders for our catalog
//! server (command, probes, security context, volumes), with the catalog in a ConfigMap: the
//! rendered one copies its catalog out of a catalog image, which the real-node scenario
//! will use.
//!
//! `shared_catalog_network_policy_is_enforced_by_a_real_implementation`: on a node that
//! enforces NetworkPolicy (kube-router's firewall), the controller's rendered NetworkPolicy
//! of a shared catalog admits exactly the catalog readers of the users' namespaces, and a
//! re-rendered one applied live admits a user added and refuses a user removed.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail, ensure};
use base64::Engine as _;
use hcp_olm_controlplane::render::labels::{MANAGED_BY, MANAGED_BY_KEY, NAME_KEY};
use hcp_olm_e2e::realnode::{
    ClusterControllers, NodeOptions, PlainHttpRegistry, RealNode, Site, push_image,
    push_sandbox_image,
};
use hcp_olm_e2e::registry::{Registry, TEST_USER_HASH, TEST_USER_PASSWORD};
use hcp_olm_e2e::{Cluster, ClusterOptions, tools};
use hcp_olm_images::IMAGES;
use hcp_olm_oci::{Client, ClientOptions, PullSecret};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Pod, Secret, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Api, DeleteParams, ListParams, PostParams};

const NS: &str = "catalogs";
const NODE: &str = "node-a";
/// Bound on a pod reaching the state a step waits for.
const BOUND: Duration = Duration::from_secs(120);

fn docker_config(registry: &str, password: &str) -> Vec<u8> {
    let auth = base64::engine::general_purpose::STANDARD.encode(format!("reader:{password}"));
    serde_json::to_vec(&serde_json::json!({"auths": {registry: {"auth": auth}}}))
        .unwrap_or_default()
}

fn pod(ns: &str, name: &str, image: &str, pull_secret: &str) -> Result<Pod> {
    Ok(serde_json::from_value(serde_json::json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": ns},
        "spec": {
            "nodeName": NODE,
            "automountServiceAccountToken": false,
            "terminationGracePeriodSeconds": 30,
            "imagePullSecrets": [{"name": pull_secret}],
            "securityContext": {"runAsNonRoot": true, "seccompProfile": {"type": "RuntimeDefault"}},
            "containers": [{
                "name": "catalog-server",
                "image": image,
                "imagePullPolicy": "IfNotPresent",
                "command": ["/usr/bin/hcp-olm-catalog-server"],
                "args": ["--catalog=/catalog", "--listen=0.0.0.0:50051", "--log-format=json", "--shutdown-timeout=10s"],
                "ports": [{"containerPort": 50051, "name": "grpc"}],
                "readinessProbe": {"grpc": {"port": 50051}, "periodSeconds": 2, "timeoutSeconds": 1},
                "livenessProbe": {"grpc": {"port": 50051}, "periodSeconds": 10, "initialDelaySeconds": 10},
                "securityContext": {
                    "allowPrivilegeEscalation": false,
                    "capabilities": {"drop": ["ALL"]},
                    "readOnlyRootFilesystem": true,
                },
                "resources": {
                    "requests": {"cpu": "10m", "memory": "64Mi"},
                    "limits": {"cpu": "1", "memory": "256Mi"},
                },
                "volumeMounts": [
                    {"name": "catalog", "mountPath": "/catalog", "readOnly": true},
                    {"name": "tmp", "mountPath": "/tmp"},
                ],
            }],
            "volumes": [
                {"name": "catalog", "configMap": {"name": "catalog"}},
                {"name": "tmp", "emptyDir": {}},
            ],
        },
    }))?)
}

/// What every test here starts from: a cluster (real kube-apiserver and etcd) with one real
/// node on a site of its own, a registry that requires auth (user `reader`), a client
/// pushing there, and the catalog server image of this build's binary pushed as `cs_ref`.
struct Env {
    // Field order is drop order: the node goes before the registry and cluster it uses.
    node: RealNode,
    client: Client,
    reg: Registry,
    cluster: Cluster,
    cs_ref: String,
}

impl Env {
    /// Starts it all; `network_policies`: the node enforces NetworkPolicy.
    async fn start(name: &str, network_policies: bool) -> Result<Self> {
        let site = Site::create()?;
        let mut copts = ClusterOptions::new(name);
        copts.bind_address = site.host_ip().into();
        let cluster = Cluster::start(copts).await?;
        let reg =
            Registry::start_with_htpasswd_on(site.host_ip().into(), &[("reader", TEST_USER_HASH)])?;
        let good = docker_config(reg.addr(), TEST_USER_PASSWORD);
        let client = Client::new(ClientOptions {
            pull_secret: PullSecret::parse(&good)?,
            plain_http: vec![reg.addr().to_string()],
            timeout: Some(Duration::from_secs(120)),
            ..Default::default()
        })?;

        // Images: the pod sandbox (our pause) and the catalog server from this build's
        // binary, both made by the same code as `make images`.
        let ca =
            std::fs::read(hcp_olm_images::CA_BUNDLE).context("the CA bundle (ca-certificates)")?;
        let pause_ref = push_sandbox_image(&client, reg.addr()).await?;
        let cs_def = IMAGES
            .iter()
            .find(|d| d.name == "hcp-olm-catalog-server")
            .context("catalog server image")?;
        let bin = tools::workspace_bin("hcp-olm-catalog-server", "hcp-olm-catalog")?;
        let cs_files = hcp_olm_images::files_for(cs_def, bin.parent().context("bin dir")?, &ca)?;
        let cs_ref = format!("{}/hcp-olm/hcp-olm-catalog-server:test", reg.addr());
        push_image(
            &client,
            &cs_ref,
            &hcp_olm_images::our_config(cs_def)?,
            &cs_files,
        )
        .await?;

        let mut nopts = NodeOptions::new(NODE, &pause_ref);
        nopts.sandbox_credentials = Some(format!("reader:{TEST_USER_PASSWORD}"));
        nopts.plain_http = vec![PlainHttpRegistry {
            host: reg.addr().to_string(),
        }];
        nopts.network_policies = network_policies;
        let started = Instant::now();
        let node = RealNode::start(site, &cluster, nopts).await?;
        eprintln!(
            "real-node: node Ready in {:.1}s",
            started.elapsed().as_secs_f64()
        );
        Ok(Self {
            node,
            client,
            reg,
            cluster,
            cs_ref,
        })
    }
}

/// Creates namespace `name` with `labels`.
async fn create_namespace(kc: &kube::Client, name: &str, labels: serde_json::Value) -> Result<()> {
    let ns: Namespace = serde_json::from_value(serde_json::json!({
        "apiVersion": "v1", "kind": "Namespace",
        "metadata": {"name": name, "labels": labels},
    }))?;
    Api::<Namespace>::all(kc.clone())
        .create(&PostParams::default(), &ns)
        .await
        .with_context(|| format!("creating namespace {name}"))?;
    Ok(())
}

/// Creates pull secret `ns/name` for user `reader` at `registry` with `password`.
async fn create_pull_secret(
    kc: &kube::Client,
    ns: &str,
    name: &str,
    registry: &str,
    password: &str,
) -> Result<()> {
    let s: Secret = serde_json::from_value(serde_json::json!({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": name, "namespace": ns},
        "type": "kubernetes.io/dockerconfigjson",
        "data": {".dockerconfigjson": base64::engine::general_purpose::STANDARD.encode(docker_config(registry, password))},
    }))?;
    Api::<Secret>::namespaced(kc.clone(), ns)
        .create(&PostParams::default(), &s)
        .await
        .with_context(|| format!("creating secret {ns}/{name}"))?;
    Ok(())
}

/// Creates ConfigMap `ns/catalog` holding the small test catalogs (what [`pod`] serves).
async fn create_catalog_config_map(kc: &kube::Client, ns: &str) -> Result<()> {
    let mut data = BTreeMap::new();
    let small = tools::fixtures_dir().join("catalogs/small");
    for e in std::fs::read_dir(&small).with_context(|| format!("reading {}", small.display()))? {
        let e = e?;
        let f = e.path().join("catalog.yaml");
        if f.is_file() {
            data.insert(
                format!("{}.yaml", e.file_name().to_string_lossy()),
                std::fs::read_to_string(&f)?,
            );
        }
    }
    ensure!(!data.is_empty(), "no catalog in {}", small.display());
    let cm = ConfigMap {
        metadata: kube::api::ObjectMeta {
            name: Some("catalog".into()),
            namespace: Some(ns.into()),
            ..Default::default()
        },
        data: Some(data),
        ..Default::default()
    };
    Api::<ConfigMap>::namespaced(kc.clone(), ns)
        .create(&PostParams::default(), &cm)
        .await
        .with_context(|| format!("creating ConfigMap {ns}/catalog"))?;
    Ok(())
}

/// Waits until `check` says the pod is where the step wants it (`Some`), or fails with the
/// pod's status and the kubelet's log.
async fn wait_pod<T>(
    pods: &Api<Pod>,
    node: &RealNode,
    name: &str,
    what: &str,
    check: impl Fn(&Pod) -> Option<T>,
) -> Result<T> {
    let start = Instant::now();
    let mut ns = NS.to_string();
    loop {
        if let Some(p) = pods.get_opt(name).await? {
            if let Some(t) = check(&p) {
                return Ok(t);
            }
            ns = p.metadata.namespace.unwrap_or(ns);
        }
        if start.elapsed() > BOUND {
            let status = pods
                .get_opt(name)
                .await?
                .and_then(|p| p.status)
                .map(|s| serde_json::to_string_pretty(&s).unwrap_or_default());
            bail!(
                "pod {name}: not {what} within {BOUND:?}; status: {status:?}\nlogs:\n{}\nkubelet:\n{}",
                node.pod_logs(&ns, name, 20),
                node.kubelet_log(40)
            );
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Waits (at most 30 s) until a TCP connect from the node's network namespace to `target`
/// succeeds; returns how long that took.
async fn answers_from_node(
    node: &RealNode,
    target: std::net::SocketAddr,
    what: &str,
) -> Result<Duration> {
    let started = Instant::now();
    loop {
        let ok = hcp_olm_e2e::netns::in_netns(node.site().netns().name(), move || {
            std::net::TcpStream::connect_timeout(&target, Duration::from_secs(1)).map(|_| ())
        })
        .await
        .is_ok();
        if ok {
            return Ok(started.elapsed());
        }
        ensure!(
            started.elapsed() < Duration::from_secs(30),
            "{what} {target} did not answer from the node within 30s\nkube-proxy:\n{}",
            node.kube_proxy_log(30)
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

fn ready(p: &Pod) -> bool {
    p.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// The waiting reason and message of the pod's container, once it is an image pull failure.
fn pull_failure(p: &Pod) -> Option<(String, String)> {
    let w = p
        .status
        .as_ref()?
        .container_statuses
        .as_ref()?
        .first()?
        .state
        .as_ref()?
        .waiting
        .as_ref()?;
    let reason = w.reason.clone().unwrap_or_default();
    matches!(reason.as_str(), "ErrImagePull" | "ImagePullBackOff")
        .then(|| (reason, w.message.clone().unwrap_or_default()))
}

/// `Uid:` of /proc/<pid>/status: real, effective, saved, filesystem.
fn uids(pid: u32) -> Option<Vec<u32>> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = s.lines().find(|l| l.starts_with("Uid:"))?;
    Some(
        line.split_whitespace()
            .skip(1)
            .filter_map(|v| v.parse().ok())
            .collect(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn our_catalog_server_image_runs_on_a_real_node() -> Result<()> {
    let Env {
        node,
        client,
        reg,
        cluster,
        cs_ref,
    } = Env::start("realnode", false).await?;
    let cgroup = node.cgroup().to_string();

    // The namespace enforces the restricted Pod Security level.
    let kc = cluster.client();
    create_namespace(
        &kc,
        NS,
        serde_json::json!({
            "pod-security.kubernetes.io/enforce": "restricted",
            "pod-security.kubernetes.io/enforce-version": "latest",
        }),
    )
    .await?;
    for (name, password) in [
        ("pull-secret", TEST_USER_PASSWORD),
        ("wrong-pull-secret", "wrong"),
    ] {
        create_pull_secret(&kc, NS, name, reg.addr(), password).await?;
    }
    create_catalog_config_map(&kc, NS).await?;

    let pods: Api<Pod> = Api::namespaced(kc.clone(), NS);
    // Pod Security: a pod that may run as root is refused by admission.
    let mut rootable = pod(NS, "rootable", &cs_ref, "pull-secret")?;
    if let Some(sc) = rootable
        .spec
        .as_mut()
        .and_then(|s| s.security_context.as_mut())
    {
        sc.run_as_non_root = None;
    }
    match pods.create(&PostParams::default(), &rootable).await {
        Err(kube::Error::Api(e)) if e.code == 403 && e.message.contains("restricted") => {}
        other => bail!("a pod that may run as root was not refused: {other:?}"),
    }

    // The catalog server: pulled with the pod's pull secret, Ready by the kubelet's gRPC probe.
    let started = Instant::now();
    pods.create(
        &PostParams::default(),
        &pod(NS, "catalog", &cs_ref, "pull-secret")?,
    )
    .await?;
    let ip = wait_pod(&pods, &node, "catalog", "Ready", |p| {
        ready(p)
            .then(|| p.status.as_ref()?.pod_ip.clone())
            .flatten()
    })
    .await?;
    eprintln!(
        "real-node: catalog server pulled, started and Ready in {:.1}s at {ip}",
        started.elapsed().as_secs_f64()
    );
    // Its process: uid 65532 (the image's numeric USER), in the node's cgroups.
    let server_pid = node
        .pids()
        .into_iter()
        .find(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/comm"))
                .is_ok_and(|c| c.trim() == "hcp-olm-catalog")
        })
        .context("no catalog server process in the node's cgroups")?;
    let ids = uids(server_pid).context("reading the server's uids")?;
    ensure!(
        ids.iter().all(|&u| u == hcp_olm_images::USER_ID),
        "uids {ids:?}"
    );
    // Read-only root: the container's root mount is mounted ro.
    let mounts = std::fs::read_to_string(format!("/proc/{server_pid}/mounts"))?;
    let root = mounts
        .lines()
        .find(|l| l.split_whitespace().nth(1) == Some("/"))
        .context("no root mount")?;
    ensure!(
        root.split_whitespace()
            .nth(3)
            .is_some_and(|o| o.split(',').any(|f| f == "ro")),
        "root mount is not read-only: {root}"
    );
    // The host reaches the pod over the node's link and bridge.
    tokio::time::timeout(
        Duration::from_secs(10),
        tokio::net::TcpStream::connect((ip.as_str(), 50051)),
    )
    .await
    .context("connecting to the pod timed out")??;

    // A catalog image shaped like Red Hat's index images (FBC under /configs, opm, opm's
    // cache under /tmp/cache, the index label), served by the real opm as a non-root user.
    let work = tempfile::tempdir()?;
    let index = hcp_olm_e2e::testimages::index(
        work.path(),
        "hcp-olm-test/widgets-index",
        "v1",
        "widget-operator",
    )?;
    let index_ref = index.reference(reg.addr());
    let img = push_image(&client, &index_ref, &index.config, &index.files).await?;
    let mut opm_pod = pod(NS, "opm", &index_ref, "pull-secret")?;
    if let Some(c) = opm_pod.spec.as_mut().and_then(|s| s.containers.first_mut()) {
        c.command = None;
        c.args = Some(
            [
                "serve",
                "/configs",
                "--cache-dir=/tmp/cache",
                "--pprof-addr=",
            ]
            .map(String::from)
            .to_vec(),
        );
        c.volume_mounts = None;
        // opm writes its cache's lock file (OLM's own catalog pods run it so too)
        if let Some(sc) = c.security_context.as_mut() {
            sc.read_only_root_filesystem = Some(false);
        }
    }
    if let Some(spec) = opm_pod.spec.as_mut() {
        spec.volumes = None;
    }
    let started = Instant::now();
    pods.create(&PostParams::default(), &opm_pod).await?;
    wait_pod(&pods, &node, "opm", "Ready", |p| ready(p).then_some(())).await?;
    eprintln!(
        "real-node: index image ({:.1} MiB compressed) pulled and served by opm, Ready in {:.1}s",
        img.size() as f64 / (1024.0 * 1024.0),
        started.elapsed().as_secs_f64()
    );

    // Bad input: a wrong pull secret, and an image the registry does not have.
    let missing = format!("{}/hcp-olm/hcp-olm-catalog-server:missing", reg.addr());
    for (name, image, secret, says) in [
        ("wrong-secret", cs_ref.as_str(), "wrong-pull-secret", "401"),
        (
            "missing-image",
            missing.as_str(),
            "pull-secret",
            "not found",
        ),
    ] {
        let mut p = pod(NS, name, image, secret)?;
        // A fresh pull every time, so the cached image does not hide the wrong secret.
        if let Some(c) = p.spec.as_mut().and_then(|s| s.containers.first_mut()) {
            c.image_pull_policy = Some("Always".into());
        }
        pods.create(&PostParams::default(), &p).await?;
        let (reason, message) =
            wait_pod(&pods, &node, name, "failing to pull", pull_failure).await?;
        eprintln!("real-node: {name}: {reason}: {message}");
        // The kubelet's message (ErrImagePull, and ImagePullBackOff's "Back-off pulling
        // image ...: ErrImagePull: ...") names the image and the registry's answer.
        ensure!(
            message.contains(image) && message.contains(says),
            "{name}: {reason}: {message}"
        );
        // What the controller makes of it for HostedOLM status.
        let live = pods.get(name).await?;
        let problem = hcp_olm_controlplane::runtime::pods::problem([&live])
            .context("the controller finds no problem in a pod that cannot pull")?;
        ensure!(
            ["ErrImagePull", "ImagePullBackOff"].contains(&problem.reason.as_str())
                && problem.message.contains(image)
                && problem.message.contains(says),
            "{problem:?}"
        );
    }

    // A Deployment and a Service: kube-controller-manager makes the pods, kube-scheduler
    // places them on the node, the EndpointSlice controller publishes the ready ones.
    let controllers = ClusterControllers::start(&cluster)?;
    let template = pod(NS, "template", &cs_ref, "pull-secret")?;
    let mut spec = serde_json::to_value(template.spec.context("spec")?)?;
    if let Some(o) = spec.as_object_mut() {
        o.remove("nodeName");
    }
    let deployment: Deployment = serde_json::from_value(serde_json::json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "catalog", "namespace": NS},
        "spec": {
            "replicas": 2,
            "selector": {"matchLabels": {"app": "catalog"}},
            "template": {"metadata": {"labels": {"app": "catalog"}}, "spec": spec},
        },
    }))?;
    let started = Instant::now();
    Api::<Deployment>::namespaced(kc.clone(), NS)
        .create(&PostParams::default(), &deployment)
        .await?;
    let service: Service = serde_json::from_value(serde_json::json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "catalog", "namespace": NS},
        "spec": {"selector": {"app": "catalog"}, "ports": [{"name": "grpc", "port": 50051}]},
    }))?;
    Api::<Service>::namespaced(kc.clone(), NS)
        .create(&PostParams::default(), &service)
        .await?;
    let slices: Api<EndpointSlice> = Api::namespaced(kc.clone(), NS);
    loop {
        let ready: usize = slices
            .list(&ListParams::default().labels("kubernetes.io/service-name=catalog"))
            .await?
            .items
            .iter()
            .flat_map(|s| s.endpoints.iter().flatten())
            .filter(|e| e.conditions.as_ref().and_then(|c| c.ready) == Some(true))
            .count();
        if ready == 2 {
            break;
        }
        ensure!(
            started.elapsed() < BOUND,
            "the Deployment's 2 pods were not ready endpoints within {BOUND:?} ({ready} were)\n{}\nkubelet:\n{}",
            controllers.log_tail(20),
            node.kubelet_log(20)
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    eprintln!(
        "real-node: Deployment of 2 scheduled, Ready and in the Service's EndpointSlice in {:.1}s",
        started.elapsed().as_secs_f64()
    );
    // kube-proxy (nftables) on the node: the Service's ClusterIP answers from the node.
    let cluster_ip = Api::<Service>::namespaced(kc.clone(), NS)
        .get("catalog")
        .await?
        .spec
        .and_then(|s| s.cluster_ip)
        .context("the Service has no ClusterIP")?;
    let target: std::net::SocketAddr = format!("{cluster_ip}:50051").parse()?;
    let took = answers_from_node(&node, target, "the Service's ClusterIP").await?;
    eprintln!(
        "real-node: ClusterIP {target} answers from the node (kube-proxy nftables) after {:.1}s",
        took.as_secs_f64()
    );
    // In-cluster API access: the `kubernetes` Service (endpoints from the API server's own
    // reconciler) answers at its ClusterIP from the node, as pods' clients expect.
    let api_ip = Api::<Service>::namespaced(kc.clone(), "default")
        .get("kubernetes")
        .await?
        .spec
        .and_then(|s| s.cluster_ip)
        .context("the kubernetes Service has no ClusterIP")?;
    let api_target: std::net::SocketAddr = format!("{api_ip}:443").parse()?;
    answers_from_node(&node, api_target, "the kubernetes Service").await?;
    drop(controllers);

    // Deleting the pod: SIGTERM, the server drains and exits; well inside the grace period.
    let started = Instant::now();
    pods.delete("catalog", &DeleteParams::default()).await?;
    loop {
        let alive = Path::new(&format!("/proc/{server_pid}")).exists()
            && std::fs::read_to_string(format!("/proc/{server_pid}/stat"))
                .is_ok_and(|s| !s.contains(") Z "));
        if !alive {
            break;
        }
        ensure!(
            started.elapsed() < Duration::from_secs(25),
            "the catalog server still runs {:?} after its pod was deleted",
            started.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    eprintln!(
        "real-node: catalog server exited {:.1}s after its pod was deleted (grace period 30s)",
        started.elapsed().as_secs_f64()
    );

    // Teardown leaves nothing behind.
    let mount_dir = node.dir().join("ns");
    let netns = node.site().netns().name().to_string();
    drop(node);
    let listed = std::process::Command::new("ip")
        .args(["netns", "list"])
        .output()?;
    ensure!(
        !String::from_utf8_lossy(&listed.stdout).contains(&netns),
        "the node's network namespace {netns} is still there"
    );
    for h in std::fs::read_dir("/sys/fs/cgroup")? {
        let d = h?.path().join(&cgroup);
        ensure!(!d.exists(), "{} left behind", d.display());
    }
    let mounts = std::fs::read_to_string("/proc/self/mountinfo")?;
    ensure!(
        !mounts.contains(&mount_dir.display().to_string()),
        "the node's mount namespace is still mounted"
    );
    Ok(())
}

/// A client of the shared catalog: a pod of our CLI's image in `ns` with `labels`, which
/// dials the catalog server's pod IP on the gRPC port once (`hcp-olm catalog packages`).
#[derive(Clone, Copy, Debug)]
struct Reader {
    what: &'static str,
    ns: &'static str,
    /// `app.kubernetes.io/name` with our managed-by label; None: no labels at all.
    name: Option<&'static str>,
}

impl Reader {
    fn labels(&self) -> serde_json::Value {
        match self.name {
            Some(n) => serde_json::json!({MANAGED_BY_KEY: MANAGED_BY, NAME_KEY: n}),
            None => serde_json::json!({}),
        }
    }
}

/// What one probe pod saw.
#[derive(Debug)]
enum Reach {
    /// It listed the catalog's packages (exit status 0), after this many refused attempts.
    Connected(usize),
    /// Two attempts got no connection: the CLI's `unreachable` or `no connection within`
    /// error (the last one's message).
    Refused(String),
}

/// How long a probe waits for its connection.
const PROBE_TIMEOUT: &str = "3s";

/// Runs one probe pod per reader at once and returns what each saw. A probe pod retries by
/// the kubelet's restarts (`restartPolicy: OnFailure`, the second attempt about 10 s after
/// the first, from the same pod IP): its first attempt may run before the policy
/// implementation has learnt the new pod's address (the kubelet publishes it as the
/// container starts), so an attempt is judged refused only when the one after it is too.
/// A pod that ends any other way (pull failure, a catalog error after connecting) is an
/// error. The pods are deleted afterwards.
async fn probe_round(
    kc: &kube::Client,
    node: &RealNode,
    cli_ref: &str,
    target: &str,
    readers: &[Reader],
    round: usize,
) -> Result<Vec<Reach>> {
    let mut created = Vec::new();
    for (i, r) in readers.iter().enumerate() {
        let name = format!("probe-{round}-{i}");
        let p: Pod = serde_json::from_value(serde_json::json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": r.ns, "labels": r.labels()},
            "spec": {
                "nodeName": NODE,
                "restartPolicy": "OnFailure",
                "automountServiceAccountToken": false,
                "terminationGracePeriodSeconds": 0,
                "imagePullSecrets": [{"name": "pull-secret"}],
                "securityContext": {"runAsNonRoot": true, "seccompProfile": {"type": "RuntimeDefault"}},
                "containers": [{
                    "name": "probe",
                    "image": cli_ref,
                    "imagePullPolicy": "IfNotPresent",
                    "args": ["catalog", "--addr", target, "--timeout", PROBE_TIMEOUT, "packages"],
                    // the kubelet may remove a finished container, and its log, at once
                    "terminationMessagePolicy": "FallbackToLogsOnError",
                    "securityContext": {"allowPrivilegeEscalation": false, "readOnlyRootFilesystem": true,
                        "capabilities": {"drop": ["ALL"]}},
                }],
            },
        }))?;
        Api::<Pod>::namespaced(kc.clone(), r.ns)
            .create(&PostParams::default(), &p)
            .await
            .with_context(|| format!("creating probe pod {}/{name} ({})", r.ns, r.what))?;
        created.push((r, name));
    }
    let refused = |m: &str| {
        m.contains(&format!("catalog {target}: unreachable"))
            || m.contains(&format!("catalog {target}: no connection within"))
    };
    let mut out = Vec::new();
    for (r, name) in &created {
        let pods: Api<Pod> = Api::namespaced(kc.clone(), r.ns);
        // failed attempts seen: container id -> termination message
        let failed = std::sync::Mutex::new(BTreeMap::<String, String>::new());
        let outcome = wait_pod(&pods, node, name, "finished", |p| {
            let st = p.status.as_ref()?;
            let cs = st.container_statuses.as_ref()?.first()?;
            let mut failed = failed.lock().ok()?;
            for t in [
                cs.state.as_ref().and_then(|s| s.terminated.as_ref()),
                cs.last_state.as_ref().and_then(|s| s.terminated.as_ref()),
            ]
            .into_iter()
            .flatten()
            {
                if t.exit_code != 0 {
                    failed.insert(
                        t.container_id.clone().unwrap_or_default(),
                        t.message.clone().unwrap_or_default().trim().to_string(),
                    );
                }
            }
            if let Some((_, m)) = failed.iter().find(|(_, m)| !refused(m)) {
                return Some(Err(m.clone()));
            }
            if st.phase.as_deref() == Some("Succeeded") {
                return Some(Ok(Reach::Connected(failed.len())));
            }
            (failed.len() >= 2).then(|| {
                Ok(Reach::Refused(
                    failed.values().last().cloned().unwrap_or_default(),
                ))
            })
        })
        .await
        .with_context(|| format!("probe of {}", r.what))?;
        match outcome {
            Ok(reach) => out.push(reach),
            Err(m) => bail!(
                "probe of {} ({}/{name}) failed, but not for want of a connection: {m}",
                r.what,
                r.ns
            ),
        }
    }
    for (r, name) in &created {
        let _ = Api::<Pod>::namespaced(kc.clone(), r.ns)
            .delete(name, &DeleteParams::default().grace_period(0))
            .await;
    }
    Ok(out)
}

/// Probes in rounds until every reader in `allowed` has connected and every reader in
/// `refused` was refused (two attempts, see [`probe_round`]), within 120 s. The policy
/// implementation applies a change asynchronously, so a reader may still connect, or still
/// be refused, in the first round after one; the next round probes it again from a new pod.
async fn expect_reach(
    kc: &kube::Client,
    node: &RealNode,
    cli_ref: &str,
    target: &str,
    allowed: &[Reader],
    refused: &[Reader],
    round: &mut usize,
) -> Result<()> {
    let started = Instant::now();
    let mut pending: Vec<(Reader, bool)> = allowed
        .iter()
        .map(|r| (*r, true))
        .chain(refused.iter().map(|r| (*r, false)))
        .collect();
    while !pending.is_empty() {
        ensure!(
            started.elapsed() < Duration::from_secs(120),
            "within 120s, not as wanted: {:?}\nnetwork policies:\n{}",
            pending
                .iter()
                .map(|(r, allow)| format!(
                    "{} ({})",
                    r.what,
                    if *allow { "allowed" } else { "refused" }
                ))
                .collect::<Vec<_>>(),
            node.network_policies_log(30)
        );
        *round += 1;
        let readers: Vec<Reader> = pending.iter().map(|(r, _)| *r).collect();
        let seen = probe_round(kc, node, cli_ref, target, &readers, *round).await?;
        let mut next = Vec::new();
        for ((r, allow), reach) in pending.iter().zip(seen) {
            match (allow, reach) {
                (true, Reach::Connected(failed)) => eprintln!(
                    "real-node: round {round}: {} connected (wanted; {failed} refused attempt(s) first)",
                    r.what
                ),
                (false, Reach::Refused(m)) => {
                    eprintln!(
                        "real-node: round {round}: {} refused twice (wanted): {m}",
                        r.what
                    )
                }
                (true, Reach::Refused(m)) => {
                    eprintln!(
                        "real-node: round {round}: {} refused, want connected: {m}",
                        r.what
                    );
                    next.push((*r, *allow));
                }
                (false, Reach::Connected(_)) => {
                    eprintln!(
                        "real-node: round {round}: {} connected, want refused",
                        r.what
                    );
                    next.push((*r, *allow));
                }
            }
        }
        pending = next;
    }
    Ok(())
}

/// The controller's NetworkPolicy of a shared catalog, enforced by a real implementation
/// (kube-router's firewall on a real node, [`NodeOptions::network_policies`]): the server is
/// a pod of our catalog server image carrying the labels of the rendered Deployment's pods
/// (the rendered Deployment itself copies its catalog out of a catalog image with OLM's
/// utilities, which this test does not build), in the namespace the controller renders, and
/// the NetworkPolicy is `render::shared::catalog`'s object, unmodified, server-side applied
/// with the controller's field manager. Clients are pods of our CLI's image dialling the
/// server's pod IP on the gRPC port once each.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shared_catalog_network_policy_is_enforced_by_a_real_implementation() -> Result<()> {
    use hcp_olm_controlplane::catalogs::DefaultCatalog;
    use hcp_olm_controlplane::render::{names, shared};
    use hcp_olm_controlplane::runtime::{FIELD_MANAGER, reconcile};
    use hcp_olm_controlplane::sharing::{SHARED_NAMESPACE, SharedCatalog, SharedKey};

    let test_started = Instant::now();
    let env = Env::start("netpol", true).await?;
    let kc = env.cluster.client();
    let bin_dir = tools::workspace_bin("hcp-olm", "hcp-olm-cli")?
        .parent()
        .context("bin dir")?
        .to_path_buf();
    let (cli_ref, _) =
        hcp_olm_e2e::hcpimages::push_ours("hcp-olm-cli", &bin_dir, &env.client, env.reg.addr())
            .await?;

    // The shared catalog as the controller renders it, for users clusters-a and clusters-b.
    let (a, b, c) = ("clusters-a", "clusters-b", "clusters-c");
    let settings = shared::SharedSettings {
        catalog_server_image: env.cs_ref.clone(),
        utilities_image: format!("{}/operator-framework/olm:test", env.reg.addr()),
        image_pull_secret: None,
        management_has_scc: false,
    };
    let key = SharedKey::new(DefaultCatalog::RedhatOperators, "4.18")
        .context("the shared catalog's key")?;
    let render = |users: &[&str]| -> Result<(serde_json::Value, hcp_olm_apply::Target)> {
        let c = SharedCatalog {
            key: key.clone(),
            image: format!(
                "{}/redhat/redhat-operator-index@sha256:{}",
                env.reg.addr(),
                "a".repeat(64)
            ),
            users: users.iter().map(|u| u.to_string()).collect(),
        };
        let objects = shared::catalog(&c, &settings);
        let labels = objects
            .iter()
            .find(|o| o.kind == "Deployment")
            .and_then(|o| o.body.pointer("/spec/template/metadata/labels").cloned())
            .context("the rendered Deployment's pod labels")?;
        let np = objects
            .iter()
            .find(|o| o.kind == "NetworkPolicy")
            .context("the rendered NetworkPolicy")?;
        Ok((labels, reconcile::target(np)))
    };
    let applier = hcp_olm_apply::Applier::new(kc.clone(), FIELD_MANAGER);
    let apply = |t: hcp_olm_apply::Target, what: &'static str| {
        let applier = applier.clone();
        async move {
            let report = applier.apply(&[t]).await;
            ensure!(report.errors.is_empty(), "{what}: {:?}", report.errors);
            ensure!(report.writes() == 1, "{what}: nothing written: {report:?}");
            Ok::<_, anyhow::Error>(())
        }
    };

    // The namespace as rendered (restricted Pod Security), then the server pod in it.
    let ns_target = reconcile::target(&shared::namespace());
    apply(ns_target, "the shared namespace").await?;
    create_pull_secret(
        &kc,
        SHARED_NAMESPACE,
        "pull-secret",
        env.reg.addr(),
        TEST_USER_PASSWORD,
    )
    .await?;
    create_catalog_config_map(&kc, SHARED_NAMESPACE).await?;
    let (pod_labels, np_ab) = render(&[a, b])?;
    let mut server = pod(
        SHARED_NAMESPACE,
        "catalog-server",
        &env.cs_ref,
        "pull-secret",
    )?;
    server.metadata.labels = Some(serde_json::from_value(pod_labels)?);
    let server_pods: Api<Pod> = Api::namespaced(kc.clone(), SHARED_NAMESPACE);
    server_pods.create(&PostParams::default(), &server).await?;
    let ip = wait_pod(&server_pods, &env.node, "catalog-server", "Ready", |p| {
        ready(p)
            .then(|| p.status.as_ref()?.pod_ip.clone())
            .flatten()
    })
    .await?;
    let target = format!("{ip}:{}", hcp_olm_controlplane::render::ports::CATALOG_GRPC);

    for ns in [a, b, c] {
        create_namespace(&kc, ns, serde_json::json!({})).await?;
        create_pull_secret(&kc, ns, "pull-secret", env.reg.addr(), TEST_USER_PASSWORD).await?;
    }
    let a_reader = Reader {
        what: "catalog-operator of clusters-a",
        ns: a,
        name: Some(names::CATALOG_OPERATOR),
    };
    let b_reader = Reader {
        what: "packageserver of clusters-b",
        ns: b,
        name: Some(names::PACKAGESERVER),
    };
    let c_reader = Reader {
        what: "tunnel-gateway of clusters-c",
        ns: c,
        name: Some(names::TUNNEL_GATEWAY),
    };
    let a_unlabelled = Reader {
        what: "an unlabelled pod of clusters-a",
        ns: a,
        name: None,
    };
    let a_olm = Reader {
        what: "olm-operator of clusters-a (ours, not a catalog reader)",
        ns: a,
        name: Some(names::OLM_OPERATOR),
    };
    ensure!(
        shared::CATALOG_READERS.contains(&names::CATALOG_OPERATOR)
            && shared::CATALOG_READERS.contains(&names::PACKAGESERVER)
            && shared::CATALOG_READERS.contains(&names::TUNNEL_GATEWAY)
            && !shared::CATALOG_READERS.contains(&names::OLM_OPERATOR),
        "the readers of this test are not the controller's: {:?}",
        shared::CATALOG_READERS
    );
    let all = [a_reader, b_reader, c_reader, a_unlabelled, a_olm];
    let mut round = 0;
    let step = Instant::now();

    // Without a NetworkPolicy every client connects: the refusals below are the policy's.
    expect_reach(&kc, &env.node, &cli_ref, &target, &all, &[], &mut round).await?;
    eprintln!(
        "real-node: without a NetworkPolicy all {} clients connect to {target} ({:.1}s)",
        all.len(),
        step.elapsed().as_secs_f64()
    );

    // The rendered policy for users clusters-a and clusters-b.
    let step = Instant::now();
    apply(np_ab, "the NetworkPolicy for clusters-a, clusters-b").await?;
    expect_reach(
        &kc,
        &env.node,
        &cli_ref,
        &target,
        &[a_reader, b_reader],
        &[c_reader, a_unlabelled, a_olm],
        &mut round,
    )
    .await?;
    eprintln!(
        "real-node: users clusters-a, clusters-b: their readers connect; clusters-c's reader, an unlabelled pod and olm-operator of clusters-a are refused ({:.1}s)",
        step.elapsed().as_secs_f64()
    );

    // A user added: re-rendered and applied, clusters-c's reader connects now.
    let step = Instant::now();
    let (_, np_abc) = render(&[a, b, c])?;
    apply(np_abc, "the NetworkPolicy with clusters-c added").await?;
    expect_reach(
        &kc,
        &env.node,
        &cli_ref,
        &target,
        &[a_reader, b_reader, c_reader],
        &[a_unlabelled, a_olm],
        &mut round,
    )
    .await?;
    eprintln!(
        "real-node: clusters-c added: its reader connects ({:.1}s)",
        step.elapsed().as_secs_f64()
    );

    // A user removed: clusters-b's reader is refused; the others are not affected.
    let step = Instant::now();
    let (_, np_ac) = render(&[a, c])?;
    apply(np_ac, "the NetworkPolicy with clusters-b removed").await?;
    expect_reach(
        &kc,
        &env.node,
        &cli_ref,
        &target,
        &[a_reader, c_reader],
        &[b_reader, a_unlabelled],
        &mut round,
    )
    .await?;
    eprintln!(
        "real-node: clusters-b removed: its reader is refused ({:.1}s)",
        step.elapsed().as_secs_f64(),
    );

    // Issue 37 item 6: HyperShift's policies of an HCP namespace, in clusters-a, as its
    // operator renders them on an OpenShift management cluster on AWS (openshift/hypershift
    // 3ee9615, hypershift-operator/controllers/hostedcluster/network_policies.go; written here
    // by the test, standing in for HyperShift's operator): `same-namespace` (ingress only from
    // the namespace), `openshift-monitoring` (ingress from monitoring), and `management-kas`
    // (egress only to the namespace, DNS, and addresses outside the management pod network
    // and the API server's endpoints, for every pod without its access label).
    let step = Instant::now();
    let kas_block: Vec<String> = {
        let eps: Api<k8s_openapi::api::core::v1::Endpoints> =
            Api::namespaced(kc.clone(), "default");
        eps.get("kubernetes")
            .await?
            .subsets
            .into_iter()
            .flatten()
            .flat_map(|s| s.addresses.into_iter().flatten())
            .map(|a| format!("{}/32", a.ip))
            .collect()
    };
    let mut except = kas_block.clone();
    except.push(hcp_olm_e2e::realnode::POD_CIDRS.to_string());
    let hypershift_policies = [
        serde_json::json!({"metadata": {"name": "same-namespace"}, "spec": {
            "podSelector": {}, "policyTypes": ["Ingress"],
            "ingress": [{"from": [{"podSelector": {}}]}]}}),
        serde_json::json!({"metadata": {"name": "openshift-monitoring"}, "spec": {
            "podSelector": {}, "policyTypes": ["Ingress"],
            "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {"network.openshift.io/policy-group": "monitoring"}}}]}]}}),
        serde_json::json!({"metadata": {"name": "management-kas"}, "spec": {
            "podSelector": {"matchExpressions": [
                {"key": "hypershift.openshift.io/need-management-kas-access", "operator": "DoesNotExist"},
                {"key": "name", "operator": "NotIn", "values": ["aws-ebs-csi-driver-operator"]}]},
            "policyTypes": ["Egress"],
            "egress": [
                {"to": [{"podSelector": {}}]},
                {"to": [{"ipBlock": {"cidr": "0.0.0.0/0", "except": except}}]},
                {"to": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "openshift-dns"}}}],
                 "ports": [{"port": 5353, "protocol": "UDP"}, {"port": 5353, "protocol": "TCP"}]}]}}),
    ];
    let nps: Api<k8s_openapi::api::networking::v1::NetworkPolicy> = Api::namespaced(kc.clone(), a);
    let mut isolation = Vec::new();
    for p in &hypershift_policies {
        let np: k8s_openapi::api::networking::v1::NetworkPolicy =
            serde_json::from_value(p.clone())?;
        let created = nps.create(&PostParams::default(), &np).await?;
        // what the controller reads of them (crate::netpol), from the stored objects
        if let Some(i) =
            hcp_olm_controlplane::netpol::egress_isolation(&serde_json::to_value(&created)?)
        {
            isolation.push(i);
        }
    }
    ensure!(
        isolation.len() == 1 && isolation[0].policy == "management-kas",
        "only management-kas isolates egress: {isolation:?}"
    );
    // An own catalog of clusters-a, as the controller runs one in an HCP namespace (reached
    // over the namespace's own pod addresses, which management-kas allows).
    create_catalog_config_map(&kc, a).await?;
    let own_pods: Api<Pod> = Api::namespaced(kc.clone(), a);
    let mut own = pod(a, "own-catalog", &env.cs_ref, "pull-secret")?;
    own.metadata.labels = Some(BTreeMap::from([
        (MANAGED_BY_KEY.to_string(), MANAGED_BY.to_string()),
        (
            NAME_KEY.to_string(),
            names::catalog(DefaultCatalog::CommunityOperators),
        ),
    ]));
    own_pods.create(&PostParams::default(), &own).await?;
    let own_ip = wait_pod(&own_pods, &env.node, "own-catalog", "Ready", |p| {
        ready(p)
            .then(|| p.status.as_ref()?.pod_ip.clone())
            .flatten()
    })
    .await?;
    let own_target = format!(
        "{own_ip}:{}",
        hcp_olm_controlplane::render::ports::CATALOG_GRPC
    );
    let a_packageserver = Reader {
        what: "packageserver of clusters-a",
        ns: a,
        name: Some(names::PACKAGESERVER),
    };
    // Under management-kas alone clusters-a's readers lose the shared catalog (the shared
    // policy still admits them: the refusal is their egress); clusters-c's reader does not.
    expect_reach(
        &kc,
        &env.node,
        &cli_ref,
        &target,
        &[c_reader],
        &[a_reader, a_packageserver],
        &mut round,
    )
    .await?;
    eprintln!(
        "real-node: HyperShift's management-kas in clusters-a (stand-in, as its operator renders it; except {except:?}): clusters-a's catalog-operator and packageserver are refused by the shared catalog ({:.1}s)",
        step.elapsed().as_secs_f64()
    );

    // The controller's answer, its rendered spec unmodified: egress to the shared catalogs'
    // port for the readers management-kas isolates. Both readers reach the shared catalog
    // and their own; an unlabelled pod of clusters-a reaches its own catalog's namespace
    // neighbour but not the shared one.
    let step = Instant::now();
    let readers: Vec<&str> = shared::CATALOG_READERS.to_vec();
    let ours: k8s_openapi::api::networking::v1::NetworkPolicy =
        serde_json::from_value(serde_json::json!({
            "apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
            "metadata": {"name": names::SHARED_CATALOG_EGRESS, "namespace": a,
                "labels": {MANAGED_BY_KEY: MANAGED_BY}},
            "spec": shared::reader_egress_spec(&readers),
        }))?;
    apply(
        hcp_olm_apply::Target::new(
            "networking.k8s.io/v1",
            "NetworkPolicy",
            "networkpolicies",
            hcp_olm_apply::Policy::Apply,
            serde_json::to_value(&ours)?,
        ),
        "the shared-catalog egress policy",
    )
    .await?;
    expect_reach(
        &kc,
        &env.node,
        &cli_ref,
        &target,
        &[a_reader, a_packageserver, c_reader],
        &[a_unlabelled],
        &mut round,
    )
    .await?;
    expect_reach(
        &kc,
        &env.node,
        &cli_ref,
        &own_target,
        &[a_reader, a_packageserver],
        &[],
        &mut round,
    )
    .await?;
    eprintln!(
        "real-node: with hcp-olm's egress policy beside management-kas, clusters-a's catalog-operator and packageserver reach the shared catalog and their own; an unlabelled pod is still refused ({:.1}s); {round} probe rounds, test {:.1}s",
        step.elapsed().as_secs_f64(),
        test_started.elapsed().as_secs_f64()
    );
    Ok(())
}
