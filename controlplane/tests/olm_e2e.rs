//! End to end with the real OLM binaries (issue 5), first stage: a HostedCluster is created,
//! our controller (as a process, as its ServiceAccount) renders OLM into the HCP namespace,
//! and the node stand-in runs the rendered Deployments as they are — catalog-operator,
//! olm-operator, package-server and the default catalogs — in a management pod network, with
//! the guest API server reached through the rendered kubeconfig. Then the guest serves
//! `packagemanifests` through packageserver and the aggregation layer.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};
use hcp_olm_e2e::kubelet::node::{Node, NodeConfig};
use hcp_olm_e2e::kubelet::{Image, ImageStore};
use hcp_olm_e2e::podnet::{self, HostNat, PodNetwork};
use hcp_olm_e2e::tools::{self, fixtures_dir};
use hcp_olm_e2e::{Cluster, ClusterOptions, Environment};
use k8s_openapi::ByteString;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Secret, Service};
use kube::api::{Api, ApiResource, DynamicObject, ListParams, Patch, PatchParams, PostParams};

const HC_NS: &str = "clusters";
const NAME: &str = "example";
const HCP_NS: &str = "clusters-example";
const OLM_IMAGE: &str =
    "registry.test/olm@sha256:0000000000000000000000000000000000000000000000000000000000000001";
const RELEASE: &str = "quay.io/openshift-release-dev/ocp-release:4.18.3-x86_64";

fn repo_file(p: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..").join(p)
}

/// A small file-based catalog whose bundle carries its manifests inline (`olm.bundle.object`,
/// `image: ""`), so OLM needs no unpack Job: package `<pkg>`, channel `stable`, one bundle.
fn write_catalog(dir: &Path, pkg: &str) -> Result<()> {
    use base64::Engine as _;
    let b64 = |v: serde_json::Value| {
        base64::engine::general_purpose::STANDARD.encode(serde_json::to_vec(&v).unwrap())
    };
    let group = format!("{pkg}.example.com");
    let crd = serde_json::json!({
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": format!("widgets.{group}")},
        "spec": {"group": group, "scope": "Namespaced",
                 "names": {"plural": "widgets", "singular": "widget", "kind": "Widget", "listKind": "WidgetList"},
                 "versions": [{"name": "v1", "served": true, "storage": true,
                               "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}}]}
    });
    let csv_name = format!("{pkg}.v0.1.0");
    let csv = serde_json::json!({
        "apiVersion": "operators.coreos.com/v1alpha1", "kind": "ClusterServiceVersion",
        "metadata": {"name": csv_name, "annotations": {"alm-examples": "[]", "capabilities": "Basic Install"}},
        "spec": {
            "displayName": pkg, "version": "0.1.0", "provider": {"name": "hcp-olm tests"},
            "installModes": [
                {"type": "OwnNamespace", "supported": true}, {"type": "SingleNamespace", "supported": true},
                {"type": "MultiNamespace", "supported": false}, {"type": "AllNamespaces", "supported": true}],
            "customresourcedefinitions": {"owned": [{"name": format!("widgets.{group}"), "version": "v1", "kind": "Widget", "displayName": "Widget", "description": "a widget"}]},
            "install": {"strategy": "deployment", "spec": {"deployments": [{
                "name": format!("{pkg}-controller"),
                "spec": {"replicas": 1, "selector": {"matchLabels": {"app": pkg}},
                         "template": {"metadata": {"labels": {"app": pkg}},
                                      "spec": {"containers": [{"name": "manager", "image": "registry.test/widget-operator:v0.1.0"}]}}}}],
                "permissions": [], "clusterPermissions": []}}
        }
    });
    let docs = [
        serde_json::json!({"schema": "olm.package", "name": pkg, "defaultChannel": "stable"}),
        serde_json::json!({"schema": "olm.channel", "package": pkg, "name": "stable", "entries": [{"name": csv_name}]}),
        serde_json::json!({"schema": "olm.bundle", "package": pkg, "name": csv_name, "image": "",
        "properties": [
            {"type": "olm.package", "value": {"packageName": pkg, "version": "0.1.0"}},
            {"type": "olm.gvk", "value": {"group": group, "kind": "Widget", "version": "v1"}},
            {"type": "olm.bundle.object", "value": {"data": b64(csv)}},
            {"type": "olm.bundle.object", "value": {"data": b64(crd)}}
        ]}),
    ];
    let pdir = dir.join(pkg);
    std::fs::create_dir_all(&pdir)?;
    let text: Vec<String> = docs.iter().map(|d| d.to_string()).collect();
    std::fs::write(pdir.join("catalog.json"), text.join("\n"))?;
    Ok(())
}

/// An index image as a directory: opm, `/configs`, and the pre-built cache in `/tmp/cache`.
fn index_image(work: &Path, name: &str, pkg: &str) -> Result<Image> {
    let configs = work.join(format!("{name}-configs"));
    write_catalog(&configs, pkg)?;
    let cache = work.join(format!("{name}-cache"));
    let opm = tools::bin("opm")?;
    let out = std::process::Command::new(&opm)
        .args([
            "serve",
            configs.to_str().unwrap_or_default(),
            "--cache-only",
            "--pprof-addr=127.0.0.1:0",
            "--cache-dir",
        ])
        .arg(&cache)
        .output()?;
    if !out.status.success() {
        bail!(
            "opm cache for {name}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(Image::new()
        .file("/bin/opm", &opm)
        .tree("/configs", configs)
        .tree("/tmp/cache", cache)
        .entrypoint(&["/bin/opm"]))
}

fn olm_image() -> Result<Image> {
    let mut img = Image::new().with_host_libraries();
    for b in ["catalog", "olm", "package-server", "copy-content"] {
        img = img.file(&format!("/bin/{b}"), tools::bin(b)?);
    }
    Ok(img.file("/bin/cp", "/usr/bin/cp"))
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
    env.guest.install_crds(&guest_crds).await?;
    for ns in [
        "openshift-marketplace",
        "openshift-operator-lifecycle-manager",
    ] {
        env.guest.ensure_namespace(ns).await?;
    }
    env.management.ensure_namespace(HC_NS).await?;
    env.management.ensure_namespace(HCP_NS).await?;
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

async fn create_hc(env: &Environment) -> Result<()> {
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
                np.insert("address".into(), "api.example.com".into());
            }
        }
    }
    v["spec"]["release"]["image"] = RELEASE.into();
    let ar = ApiResource::erase::<hcp_olm_controlplane::hostedcluster::HostedCluster>(&());
    let obj: DynamicObject = serde_json::from_value(v)?;
    let api: Api<DynamicObject> = Api::namespaced_with(env.management.client(), HC_NS, &ar);
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

/// The controller's ServiceAccount with the ClusterRole from manifests/.
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
    Ok(sa.kubeconfig)
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

struct Step {
    name: &'static str,
    started: Instant,
}

impl Step {
    fn new(name: &'static str) -> Self {
        eprintln!("== step: {name}");
        Self {
            name,
            started: Instant::now(),
        }
    }
    fn done(self) {
        eprintln!(
            "== step done: {} ({:.1}s)",
            self.name,
            self.started.elapsed().as_secs_f64()
        );
    }
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
            Err(e) if Instant::now() >= deadline => bail!("{what}: {e}"),
            Err(_) => tokio::time::sleep(Duration::from_millis(500)).await,
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn hosted_cluster_gets_olm_from_rendered_deployments() -> Result<()> {
    let step = Step::new("networks and control planes");
    let mgmt_net = Arc::new(PodNetwork::create("mgmt", [198, 18, 16], "cluster.local").await?);
    let guest_net = Arc::new(PodNetwork::create("guest", [198, 18, 32], "cluster.local").await?);
    podnet::link(&guest_net, &mgmt_net, [198, 18, 250])?;
    let mut mo = ClusterOptions::new("management");
    mo.service_cidr = "198.19.16.0/24".into();
    mo.extra_sans.push(mgmt_net.gateway().to_string());
    let mut go = ClusterOptions::new("guest");
    go.service_cidr = "198.19.32.0/24".into();
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
    step.done();

    let step = Step::new("HostedCluster, kubeconfigs, controller");
    let guest_admin = std::fs::read(env.guest.kubeconfig())?;
    put_secret(
        &env.management,
        HC_NS,
        "example-admin-kubeconfig",
        "kubeconfig",
        guest_admin,
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
    create_hc(&env).await?;
    let work = tempfile::tempdir()?;
    let kubeconfig = controller_kubeconfig(&env).await?;
    let admin_port = hcp_olm_e2e::ports::free_port()?;
    let log_path = work.path().join("controller.log");
    let mut controller = std::process::Command::new(env!("CARGO_BIN_EXE_hcp-olm-controller"))
        .args([
            "run",
            "--admin-addr",
            &format!("127.0.0.1:{admin_port}"),
            "--registry-lookups=false",
            "--olm-image",
            OLM_IMAGE,
        ])
        .env("KUBECONFIG", &kubeconfig)
        .env("RUST_LOG", "info")
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(&log_path)?)
        .spawn()?;
    step.done();

    let result = async {
        let step = Step::new("node runs the rendered HCP Deployments");
        let mut images = ImageStore::new();
        images.insert(OLM_IMAGE, olm_image()?);
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
                index_image(work.path(), name, &format!("{name}-widget"))?,
            );
        }
        let node = Node::start(NodeConfig {
            client: env.management.client(),
            namespaces: vec![HCP_NS.into()],
            network: mgmt_net.clone(),
            images,
            api_host: mgmt_net.gateway().to_string(),
            api_port: 6443,
            ca_pem: env.management.ca_pem().as_bytes().to_vec(),
            work_dir: work.path().join("mgmt-node"),
            interval: Duration::from_secs(1),
            init_timeout: Duration::from_secs(60),
        });
        let deployments: Api<Deployment> = Api::namespaced(env.management.client(), HCP_NS);
        let wanted = [
            "hcp-olm-catalog-operator",
            "hcp-olm-olm-operator",
            "hcp-olm-packageserver",
            "hcp-olm-redhat-operators",
            "hcp-olm-certified-operators",
            "hcp-olm-community-operators",
        ];
        until("OLM Deployments ready", 150, || async {
            let mut missing = Vec::new();
            for w in wanted {
                let ready = deployments
                    .get_opt(w)
                    .await
                    .map_err(|e| e.to_string())?
                    .and_then(|d| d.status?.ready_replicas)
                    .unwrap_or(0);
                if ready < 1 {
                    missing.push(w);
                }
            }
            if missing.is_empty() {
                Ok(())
            } else {
                let v = node.view();
                let logs: Vec<String> = missing
                    .iter()
                    .map(|m| {
                        let k = (HCP_NS.to_string(), m.to_string());
                        format!(
                            "--- {m} (node ready {:?}, restarts {:?}):\n{}",
                            v.ready.get(&k),
                            v.restarts.get(&k),
                            v.logs.get(&k).cloned().unwrap_or_default()
                        )
                    })
                    .collect();
                Err(format!(
                    "not ready: {missing:?}; node errors: {:#?}\n{}",
                    v.errors,
                    logs.join("\n")
                ))
            }
        })
        .await?;
        step.done();

        let step = Step::new("guest serves packagemanifests through packageserver");
        // the guest API server is the HCP's: it reaches the packageserver Service through the
        // management network (kube-proxy's part, done here for the host namespace)
        let guest_svc = Api::<Service>::namespaced(env.guest.client(), "default")
            .get("packageserver")
            .await?;
        let guest_ip = guest_svc
            .spec
            .and_then(|s| s.cluster_ip)
            .context("guest ClusterIP")?;
        let hcp_svc = Api::<Service>::namespaced(env.management.client(), HCP_NS)
            .get("hcp-olm-packageserver")
            .await?;
        let hcp_ip = hcp_svc
            .spec
            .and_then(|s| s.cluster_ip)
            .context("HCP ClusterIP")?;
        let _nat = HostNat::create(
            &mgmt_net,
            &[(
                guest_ip.parse()?,
                443,
                SocketAddr::new(hcp_ip.parse()?, 443),
            )],
        )
        .await?;
        let pm = ApiResource {
            group: "packages.operators.coreos.com".into(),
            version: "v1".into(),
            api_version: "packages.operators.coreos.com/v1".into(),
            kind: "PackageManifest".into(),
            plural: "packagemanifests".into(),
        };
        let api: Api<DynamicObject> =
            Api::namespaced_with(env.guest.client(), "openshift-marketplace", &pm);
        let apisvc_ar = ApiResource {
            group: "apiregistration.k8s.io".into(),
            version: "v1".into(),
            api_version: "apiregistration.k8s.io/v1".into(),
            kind: "APIService".into(),
            plural: "apiservices".into(),
        };
        let apisvcs: Api<DynamicObject> = Api::all_with(env.guest.client(), &apisvc_ar);
        let diagnose = || async {
            let status = apisvcs
                .get("v1.packages.operators.coreos.com")
                .await
                .map(|o| o.data["status"].to_string())
                .unwrap_or_else(|e| e.to_string());
            let curl = std::process::Command::new("curl")
                .args(["-sk", "--max-time", "3", "-o", "/dev/null", "-w", "%{http_code}"])
                .arg(format!("https://{guest_ip}:443/healthz"))
                .output()
                .map(|o| {
                    format!(
                        "{} {}",
                        String::from_utf8_lossy(&o.stdout),
                        String::from_utf8_lossy(&o.stderr)
                    )
                })
                .unwrap_or_else(|e| e.to_string());
            let v = node.view();
            let ps = v
                .logs
                .get(&(HCP_NS.to_string(), "hcp-olm-packageserver".to_string()))
                .cloned()
                .unwrap_or_default();
            format!(
                "APIService status: {status}; host curl https://{guest_ip}/healthz: {curl}; packageserver log:\n{ps}"
            )
        };
        until("packagemanifests listed in the guest", 180, || async {
            let list = match api.list(&ListParams::default()).await {
                Ok(l) => l,
                Err(e) => return Err(format!("{e}; {}", diagnose().await)),
            };
            let mut names: Vec<String> = list
                .items
                .into_iter()
                .filter_map(|o| o.metadata.name)
                .collect();
            names.sort();
            if names == ["certified-widget", "community-widget", "redhat-widget"] {
                eprintln!("packagemanifests: {names:?}");
                Ok(())
            } else {
                Err(format!(
                    "{names:?}; node errors: {:#?}\n{}",
                    node.view().errors,
                    node.view()
                        .logs
                        .iter()
                        .map(|((_, d), l)| format!("--- {d}\n{l}"))
                        .collect::<Vec<_>>()
                        .join("\n")
                ))
            }
        })
        .await?;
        step.done();
        node.stop().await;
        Ok::<(), anyhow::Error>(())
    }
    .await;
    let _ = controller.kill();
    let _ = controller.wait();
    if let Err(e) = result {
        let log = std::fs::read_to_string(&log_path).unwrap_or_default();
        let tail: Vec<&str> = log.lines().rev().take(40).collect();
        bail!(
            "{e:#}\n--- controller log (last 40 lines, newest first):\n{}",
            tail.join("\n")
        );
    }
    Ok(())
}
