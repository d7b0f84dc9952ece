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

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail, ensure};
use base64::Engine as _;
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

fn pod(name: &str, image: &str, pull_secret: &str) -> Result<Pod> {
    Ok(serde_json::from_value(serde_json::json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NS},
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
    loop {
        if let Some(p) = pods.get_opt(name).await?
            && let Some(t) = check(&p)
        {
            return Ok(t);
        }
        if start.elapsed() > BOUND {
            let status = pods
                .get_opt(name)
                .await?
                .and_then(|p| p.status)
                .map(|s| serde_json::to_string_pretty(&s).unwrap_or_default());
            bail!(
                "pod {name}: not {what} within {BOUND:?}; status: {status:?}\nlogs:\n{}\nkubelet:\n{}",
                node.pod_logs(NS, name, 20),
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
    let site = Site::create()?;
    let mut copts = ClusterOptions::new("realnode");
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

    // Images: the pod sandbox (our pause) and the catalog server from this build's binary,
    // both made by the same code as `make images`.
    let ca = std::fs::read(hcp_olm_images::CA_BUNDLE).context("the CA bundle (ca-certificates)")?;
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
    let started = Instant::now();
    let node = RealNode::start(site, &cluster, nopts).await?;
    eprintln!(
        "real-node: node Ready in {:.1}s",
        started.elapsed().as_secs_f64()
    );
    let cgroup = node.cgroup().to_string();

    // The namespace enforces the restricted Pod Security level.
    let kc = cluster.client();
    let ns: Namespace = serde_json::from_value(serde_json::json!({
        "apiVersion": "v1", "kind": "Namespace",
        "metadata": {"name": NS, "labels": {
            "pod-security.kubernetes.io/enforce": "restricted",
            "pod-security.kubernetes.io/enforce-version": "latest",
        }},
    }))?;
    Api::<Namespace>::all(kc.clone())
        .create(&PostParams::default(), &ns)
        .await?;
    let secrets: Api<Secret> = Api::namespaced(kc.clone(), NS);
    for (name, password) in [
        ("pull-secret", TEST_USER_PASSWORD),
        ("wrong-pull-secret", "wrong"),
    ] {
        let s: Secret = serde_json::from_value(serde_json::json!({
            "apiVersion": "v1", "kind": "Secret",
            "metadata": {"name": name, "namespace": NS},
            "type": "kubernetes.io/dockerconfigjson",
            "data": {".dockerconfigjson": base64::engine::general_purpose::STANDARD.encode(docker_config(reg.addr(), password))},
        }))?;
        secrets.create(&PostParams::default(), &s).await?;
    }
    let mut data = BTreeMap::new();
    let small = tools::fixtures_dir().join("catalogs/small");
    for e in std::fs::read_dir(&small)? {
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
            namespace: Some(NS.into()),
            ..Default::default()
        },
        data: Some(data),
        ..Default::default()
    };
    Api::<ConfigMap>::namespaced(kc.clone(), NS)
        .create(&PostParams::default(), &cm)
        .await?;

    let pods: Api<Pod> = Api::namespaced(kc.clone(), NS);
    // Pod Security: a pod that may run as root is refused by admission.
    let mut rootable = pod("rootable", &cs_ref, "pull-secret")?;
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
        &pod("catalog", &cs_ref, "pull-secret")?,
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
    let mut opm_pod = pod("opm", &index_ref, "pull-secret")?;
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
        let mut p = pod(name, image, secret)?;
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
    let template = pod("template", &cs_ref, "pull-secret")?;
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
