//! The controller runtime against two real API servers (management + guest).
//!
//! One environment per test function keeps the 2-core budget; the scenarios run in
//! sequence inside it.

use std::collections::BTreeMap;
use std::path::PathBuf;

use anyhow::{Context as _, Result, ensure};
use hcp_olm_controlplane::hostedcluster::HostedCluster;
use hcp_olm_controlplane::hostedolm::HostedOLM;
use hcp_olm_controlplane::runtime::reconcile::{
    Outcome, State, guest_kinds, hcp_kinds, reconcile_one, selector_for,
};
use hcp_olm_controlplane::runtime::{Config, Context, FINALIZER};
use hcp_olm_e2e::cluster::{Cluster, Environment};
use hcp_olm_e2e::tools::fixtures_dir;
use k8s_openapi::ByteString;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Secret, Service};
use kube::api::{Api, ApiResource, DynamicObject, ListParams, Patch, PatchParams, PostParams};

const HC_NS: &str = "clusters";
const OLM_IMAGE: &str = "quay.io/openshift-release-dev/ocp-v4.0-art-dev@sha256:aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";

/// Resources whose writes we count (everything the controller may touch).
const RESOURCES: &[&str] = &[
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
    "operatorhubs",
    "namespaces",
];

fn repo_file(p: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..").join(p)
}

fn hc_resource() -> ApiResource {
    ApiResource::erase::<HostedCluster>(&())
}

async fn setup(env: &Environment) -> Result<()> {
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
    env.guest.ensure_namespace("openshift-marketplace").await?;
    env.management.ensure_namespace(HC_NS).await?;
    Ok(())
}

/// Create a HostedCluster from the `none-minimal` fixture, named `name`, whose
/// status.kubeconfig names `kubeconfig_secret`.
async fn create_hc(env: &Environment, name: &str, kubeconfig_secret: &str) -> Result<()> {
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
    v["metadata"]["name"] = name.into();
    v["metadata"]["namespace"] = HC_NS.into();
    // The fixture (`hypershift create cluster none --render`) carries the placeholder
    // `fakeAddress`, which the real CRD's validation rejects.
    if let Some(services) = v["spec"]["services"].as_array_mut() {
        for svc in services {
            if let Some(np) = svc["servicePublishingStrategy"]["nodePort"].as_object_mut() {
                np.insert("address".into(), "api.example.com".into());
            }
        }
    }
    v["spec"]["release"]["image"] =
        "quay.io/openshift-release-dev/ocp-release:4.18.3-x86_64".into();
    let obj: DynamicObject = serde_json::from_value(v)?;
    let api: Api<DynamicObject> =
        Api::namespaced_with(env.management.client(), HC_NS, &hc_resource());
    api.create(&PostParams::default(), &obj).await?;
    api.patch_status(
        name,
        &PatchParams::default(),
        &Patch::Merge(serde_json::json!({"status": {
            "kubeconfig": {"name": kubeconfig_secret},
            "version": {
                "desired": {"image": "quay.io/openshift-release-dev/ocp-release:4.18.3-x86_64", "version": "4.18.3"},
                "availableUpdates": [],
                "observedGeneration": 1,
            },
        }})),
    )
    .await?;
    env.management
        .ensure_namespace(&format!("{HC_NS}-{name}"))
        .await?;
    Ok(())
}

async fn put_kubeconfig_secret(env: &Environment, name: &str) -> Result<()> {
    let yaml = std::fs::read(env.guest.kubeconfig())?;
    let s = Secret {
        metadata: kube::api::ObjectMeta {
            name: Some(name.into()),
            namespace: Some(HC_NS.into()),
            ..Default::default()
        },
        data: Some(BTreeMap::from([(
            "kubeconfig".to_string(),
            ByteString(yaml),
        )])),
        ..Default::default()
    };
    Api::<Secret>::namespaced(env.management.client(), HC_NS)
        .create(&PostParams::default(), &s)
        .await?;
    Ok(())
}

async fn get_hc(env: &Environment, name: &str) -> Result<HostedCluster> {
    Ok(
        Api::<HostedCluster>::namespaced(env.management.client(), HC_NS)
            .get(name)
            .await?,
    )
}

async fn reconcile(ctx: &Context, env: &Environment, name: &str) -> Result<Outcome> {
    let hc = get_hc(env, name).await?;
    let o = reconcile_one(ctx, &hc).await?;
    eprintln!("reconcile {name}: {o:?}");
    Ok(o)
}

/// Names (`Kind/ns/name`) of every object carrying the prune selector of `name`.
async fn ours(cluster: &Cluster, kinds: &[(ApiResource, bool)], name: &str) -> Result<Vec<String>> {
    let sel = selector_for(HC_NS, name)
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(",");
    let mut out = Vec::new();
    for (ar, _) in kinds {
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

fn condition<'a>(
    h: &'a HostedOLM,
    t: &str,
) -> Option<&'a k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition> {
    h.status.as_ref()?.conditions.iter().find(|c| c.type_ == t)
}

/// The controller's identity: the ServiceAccount of manifests/controller bound to the
/// ClusterRole there, so a missing permission fails this test.
async fn controller_client(env: &Environment) -> Result<kube::Client> {
    use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
    let sa = env
        .management
        .service_account(
            "hcp-olm-system",
            "hcp-olm-controller",
            std::time::Duration::from_secs(3600),
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
    Ok(sa.client)
}

fn ctx(client: kube::Client) -> Context {
    Context::new(
        client,
        Config {
            olm_image: Some(OLM_IMAGE.into()),
            ..Default::default()
        },
    )
}

#[tokio::test]
async fn reconcile_converges_prunes_and_cleans_up() -> Result<()> {
    let env = Environment::start().await?;
    setup(&env).await?;
    let ctx = ctx(controller_client(&env).await?);
    let name = "example";
    let hcp_ns = format!("{HC_NS}-{name}");
    put_kubeconfig_secret(&env, "example-admin-kubeconfig").await?;
    create_hc(&env, name, "example-admin-kubeconfig").await?;

    // Pass 1 creates everything but cannot know the packageserver ClusterIP yet;
    // pass 2 picks it up.
    let first = reconcile(&ctx, &env, name).await?;
    ensure!(first.hcp_writes > 0 && first.guest_writes > 0, "{first:?}");
    reconcile(&ctx, &env, name).await?;

    // Objects exist in both clusters.
    let deps = Api::<Deployment>::namespaced(env.management.client(), &hcp_ns)
        .list(&ListParams::default())
        .await?;
    let dep_names: Vec<String> = deps
        .items
        .iter()
        .filter_map(|d| d.metadata.name.clone())
        .collect();
    for want in [
        "hcp-olm-catalog-operator",
        "hcp-olm-olm-operator",
        "hcp-olm-packageserver",
    ] {
        ensure!(
            dep_names.iter().any(|n| n == want),
            "{want} missing from {dep_names:?}"
        );
    }
    let ip = Api::<Service>::namespaced(env.management.client(), &hcp_ns)
        .get("hcp-olm-packageserver")
        .await?
        .spec
        .and_then(|s| s.cluster_ip)
        .context("ClusterIP")?;
    let cs_ar = ApiResource {
        group: "operators.coreos.com".into(),
        version: "v1alpha1".into(),
        api_version: "operators.coreos.com/v1alpha1".into(),
        kind: "CatalogSource".into(),
        plural: "catalogsources".into(),
    };
    let sources: Api<DynamicObject> =
        Api::namespaced_with(env.guest.client(), "openshift-marketplace", &cs_ar);
    let mut cs_names: Vec<String> = sources
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .filter_map(|o| o.metadata.name)
        .collect();
    cs_names.sort();
    assert_eq!(
        cs_names,
        [
            "certified-operators",
            "community-operators",
            "redhat-operators"
        ]
    );
    let apisvc_ar = ApiResource {
        group: "apiregistration.k8s.io".into(),
        version: "v1".into(),
        api_version: "apiregistration.k8s.io/v1".into(),
        kind: "APIService".into(),
        plural: "apiservices".into(),
    };
    Api::<DynamicObject>::all_with(env.guest.client(), &apisvc_ar)
        .get("v1.packages.operators.coreos.com")
        .await
        .context("APIService in the guest")?;
    let eps =
        Api::<k8s_openapi::api::core::v1::Endpoints>::namespaced(env.guest.client(), "default")
            .get("packageserver")
            .await
            .context("guest Endpoints for packageserver")?;
    let ep_ips: Vec<String> = eps
        .subsets
        .unwrap_or_default()
        .into_iter()
        .flat_map(|s| s.addresses.unwrap_or_default())
        .map(|a| a.ip)
        .collect();
    assert_eq!(
        ep_ips,
        [ip],
        "guest Endpoints point at the HCP packageserver ClusterIP"
    );

    let holm = Api::<HostedOLM>::namespaced(env.management.client(), &hcp_ns)
        .get(name)
        .await?;
    let st = holm.status.as_ref().context("HostedOLM status")?;
    eprintln!("status: {}", serde_json::to_string_pretty(st)?);
    assert_eq!(st.observed_generation, holm.metadata.generation);
    for t in ["Available", "Progressing", "Degraded", "Upgradeable"] {
        ensure!(condition(&holm, t).is_some(), "condition {t} missing");
    }
    assert_eq!(condition(&holm, "Degraded").unwrap().status, "False");
    assert_eq!(st.release_version.as_deref(), Some("4.18.3"));
    assert_eq!(st.catalogs.len(), 3);
    ensure!(
        holm.metadata.uid.is_some()
            && get_hc(&env, name)
                .await?
                .metadata
                .finalizers
                .unwrap_or_default()
                .contains(&FINALIZER.to_string())
    );

    // Converged: a third pass makes zero writes, as counted by both API servers.
    let (m0, g0) = (
        env.management.api_writes(RESOURCES).await?,
        env.guest.api_writes(RESOURCES).await?,
    );
    let third = reconcile(&ctx, &env, name).await?;
    let (m1, g1) = (
        env.management.api_writes(RESOURCES).await?,
        env.guest.api_writes(RESOURCES).await?,
    );
    eprintln!(
        "converged pass: management writes {}, guest writes {}",
        m1 - m0,
        g1 - g0
    );
    assert_eq!((m1 - m0, g1 - g0), (0, 0), "API writes on a converged pass");
    assert_eq!(
        (third.hcp_writes, third.guest_writes, third.status_written),
        (0, 0, false)
    );

    // Disable all default sources: the guest CatalogSources are pruned.
    Api::<DynamicObject>::namespaced_with(env.management.client(), HC_NS, &hc_resource())
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"spec": {"configuration": {"operatorhub": {"disableAllDefaultSources": true}}}})),
        )
        .await?;
    let o = reconcile(&ctx, &env, name).await?;
    ensure!(o.guest_writes >= 3, "{o:?}");
    let left: Vec<String> = sources
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .filter(|o| o.metadata.deletion_timestamp.is_none())
        .filter_map(|o| o.metadata.name)
        .collect();
    assert!(left.is_empty(), "CatalogSources left: {left:?}");
    let holm = Api::<HostedOLM>::namespaced(env.management.client(), &hcp_ns)
        .get(name)
        .await?;
    ensure!(
        holm.status
            .as_ref()
            .unwrap()
            .catalogs
            .iter()
            .all(|c| !c.enabled),
        "catalog status still enabled"
    );
    // ...and that is converged too.
    let (m0, g0) = (
        env.management.api_writes(RESOURCES).await?,
        env.guest.api_writes(RESOURCES).await?,
    );
    reconcile(&ctx, &env, name).await?;
    assert_eq!(
        (
            env.management.api_writes(RESOURCES).await? - m0,
            env.guest.api_writes(RESOURCES).await? - g0
        ),
        (0, 0)
    );

    // A HostedCluster whose kubeconfig Secret is missing: status says so, no panic.
    create_hc(&env, "nokc", "nokc-admin-kubeconfig").await?;
    let o = reconcile(&ctx, &env, "nokc").await?;
    assert_eq!(o.state, State::Waiting("GuestKubeconfigMissing".into()));
    let holm = Api::<HostedOLM>::namespaced(env.management.client(), "clusters-nokc")
        .get("nokc")
        .await?;
    let d = condition(&holm, "Degraded").context("Degraded")?;
    assert_eq!(
        (d.status.as_str(), d.reason.as_str()),
        ("True", "GuestKubeconfigMissing")
    );
    ensure!(
        d.message.contains("clusters/nokc-admin-kubeconfig"),
        "{}",
        d.message
    );
    let p = condition(&holm, "Progressing").context("Progressing")?;
    assert_eq!(
        (p.status.as_str(), p.reason.as_str()),
        ("True", "WaitingForGuestKubeconfig")
    );
    assert_eq!(condition(&holm, "Available").unwrap().status, "False");
    // (Both HostedClusters would share the one guest here, so "nokc" stays without
    // guest access; its deletion exercises cleanup with an unreachable guest.)

    // Deleting a HostedCluster: the finalizer removes everything of ours in both clusters.
    ensure!(!ours(&env.guest, &guest_kinds(), name).await?.is_empty());
    for n in [name, "nokc"] {
        Api::<HostedCluster>::namespaced(env.management.client(), HC_NS)
            .delete(n, &Default::default())
            .await?;
        let o = reconcile(&ctx, &env, n).await?;
        assert_eq!(o.state, State::CleanedUp);
        let gone = Api::<HostedCluster>::namespaced(env.management.client(), HC_NS)
            .get_opt(n)
            .await?;
        ensure!(gone.is_none(), "HostedCluster {n} still exists");
        let left_m = ours(&env.management, &hcp_kinds(), n).await?;
        ensure!(
            left_m.is_empty(),
            "management objects left for {n}: {left_m:?}"
        );
        let left_g = ours(&env.guest, &guest_kinds(), n).await?;
        ensure!(left_g.is_empty(), "guest objects left for {n}: {left_g:?}");
        let holm = Api::<HostedOLM>::namespaced(env.management.client(), &format!("{HC_NS}-{n}"))
            .get_opt(n)
            .await?;
        ensure!(holm.is_none(), "HostedOLM {n} left");
    }
    Ok(())
}

fn http_get(port: u16, path: &str) -> Result<String> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port))?;
    s.write_all(format!("GET {path} HTTP/1.0\r\nHost: localhost\r\n\r\n").as_bytes())?;
    let mut out = String::new();
    s.read_to_string(&mut out)?;
    Ok(out)
}

/// `hcp-olm-controller run` as a process: it reconciles a new HostedCluster on its own,
/// serves the admin endpoints and exits cleanly on SIGTERM.
#[tokio::test]
async fn run_subcommand_reconciles_and_stops_on_sigterm() -> Result<()> {
    let env = Environment::start().await?;
    setup(&env).await?;
    put_kubeconfig_secret(&env, "example-admin-kubeconfig").await?;
    create_hc(&env, "example", "example-admin-kubeconfig").await?;
    let port = hcp_olm_e2e::ports::free_port()?;
    let log = tempfile::NamedTempFile::new()?;
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_hcp-olm-controller"))
        .args([
            "run",
            "--admin-addr",
            &format!("127.0.0.1:{port}"),
            "--registry-lookups=false",
            "--olm-image",
            OLM_IMAGE,
        ])
        .env("KUBECONFIG", env.management.kubeconfig())
        .env("RUST_LOG", "info")
        .stdout(std::process::Stdio::null())
        .stderr(log.reopen()?)
        .spawn()?;
    let result = async {
        let api = Api::<Service>::namespaced(env.guest.client(), "default");
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        // The guest Endpoints exist only after the second pass (ClusterIP read back).
        loop {
            let eps = Api::<k8s_openapi::api::core::v1::Endpoints>::namespaced(
                env.guest.client(),
                "default",
            )
            .get_opt("packageserver")
            .await?;
            if eps.is_some() && api.get_opt("packageserver").await?.is_some() {
                break;
            }
            ensure!(
                std::time::Instant::now() < deadline,
                "controller did not converge"
            );
            tokio::time::sleep(std::time::Duration::from_millis(500)).await;
        }
        let hc = get_hc(&env, "example").await?;
        ensure!(
            hc.metadata
                .finalizers
                .unwrap_or_default()
                .contains(&FINALIZER.to_string())
        );
        ensure!(http_get(port, "/healthz")?.starts_with("HTTP/1.0 200"));
        ensure!(http_get(port, "/readyz")?.starts_with("HTTP/1.0 200"));
        let metrics = http_get(port, "/metrics")?;
        ensure!(
            metrics.contains("hcp_olm_reconciles_total{result=\"applied\"}")
                || metrics.contains("hcp_olm_reconciles_total{result=\"waiting\"}"),
            "{metrics}"
        );
        ensure!(
            metrics.contains("hcp_olm_reconcile_duration_seconds"),
            "{metrics}"
        );
        Ok(())
    }
    .await;
    let killed = std::process::Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()?;
    ensure!(killed.success());
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    let status = loop {
        if let Some(st) = child.try_wait()? {
            break Some(st);
        }
        if std::time::Instant::now() > deadline {
            child.kill()?;
            break None;
        }
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    };
    let logs = std::fs::read_to_string(log.path())?;
    if let Err(e) = result {
        anyhow::bail!("{e:#}\ncontroller log:\n{logs}");
    }
    let status = status.context("controller did not stop on SIGTERM")?;
    ensure!(status.success(), "exit {status:?}\n{logs}");
    ensure!(!logs.contains("BEGIN PRIVATE KEY"), "key material in logs");
    Ok(())
}
