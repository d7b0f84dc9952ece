//! Helpers of the tenancy tests (`security_tenancy.rs`, `security_entitlement.rs`): real
//! API servers (management + guest), real registries, the controller as its ServiceAccount
//! with exactly the RBAC and admission policies of manifests/controller.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context as _, Result, ensure};
use hcp_olm_controlplane::hostedcluster::HostedCluster;
use hcp_olm_controlplane::runtime::reconcile::{Outcome, reconcile_one};
use hcp_olm_controlplane::runtime::{Config, Context, shared};
use hcp_olm_e2e::cluster::{Cluster, Environment};
use hcp_olm_e2e::hypershift_standin::resource;
use hcp_olm_e2e::registry::{Registry, TEST_USER_HASH, TEST_USER_PASSWORD};
use hcp_olm_e2e::tools::fixtures_dir;
use k8s_openapi::ByteString;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, ApiResource, DynamicObject, Patch, PatchParams, PostParams};

pub const OLM_IMAGE: &str = "quay.io/openshift-release-dev/ocp-v4.0-art-dev@sha256:aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
/// The shared redhat-operators catalog of 4.18 (Deployment, Service, PDB, NetworkPolicy).
pub const RH: &str = "hcp-olm-redhat-operators-v4-18";
/// A finalizer of someone else's (the attacker's) that holds a deleted HostedCluster.
pub const HOLD: &str = "attacker.example.com/hold";

pub fn repo_file(p: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..").join(p)
}

pub fn hc_resource() -> ApiResource {
    ApiResource::erase::<HostedCluster>(&())
}

pub fn hcp_resource() -> ApiResource {
    resource(
        "hypershift.openshift.io/v1beta1",
        "HostedControlPlane",
        "hostedcontrolplanes",
    )
}

/// A stand-in for HyperShift's HostedControlPlane CRD (the fixtures carry only the
/// HostedCluster and NodePool CRDs): same group, version, kind and scope; schema open.
const HCP_CRD_STANDIN: &str = r#"{"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
 "metadata": {"name": "hostedcontrolplanes.hypershift.openshift.io"},
 "spec": {"group": "hypershift.openshift.io", "scope": "Namespaced",
  "names": {"kind": "HostedControlPlane", "plural": "hostedcontrolplanes", "singular": "hostedcontrolplane", "listKind": "HostedControlPlaneList"},
  "versions": [{"name": "v1beta1", "served": true, "storage": true,
    "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}}]}}"#;

/// CRDs in both clusters (HostedCluster, HostedOLM, the HostedControlPlane stand-in; OLM and
/// OperatorHub in the guest).
pub async fn setup(env: &Environment) -> Result<()> {
    let fx = fixtures_dir();
    let crd: serde_json::Value = serde_json::from_str(HCP_CRD_STANDIN)?;
    let dir = tempfile::tempdir()?;
    let crd_file = dir.path().join("hcp-crd.yaml");
    std::fs::write(&crd_file, serde_yaml_ng::to_string(&crd)?)?;
    env.management
        .install_crds(&[
            fx.join("hypershift/crds/hostedclusters-Hypershift-Default.crd.yaml"),
            repo_file("manifests/crds/hostedolm.yaml"),
            crd_file,
        ])
        .await?;
    let mut guest_crds: Vec<PathBuf> = std::fs::read_dir(fx.join("crds/olm"))?
        .map(|e| e.map(|e| e.path()))
        .collect::<std::io::Result<_>>()?;
    guest_crds.push(fx.join("crds/openshift/0000_03_marketplace_01_operatorhubs.crd.yaml"));
    env.guest.install_crds(&guest_crds).await?;
    env.guest.ensure_namespace("openshift-marketplace").await?;
    Ok(())
}

/// Create or replace Secret `ns/name` with one key.
pub async fn put_secret(
    c: &Cluster,
    ns: &str,
    name: &str,
    key: &str,
    value: Vec<u8>,
) -> Result<()> {
    c.ensure_namespace(ns).await?;
    let data = BTreeMap::from([(key.to_string(), ByteString(value))]);
    Api::<Secret>::namespaced(c.client(), ns)
        .patch(
            name,
            &PatchParams::apply("test").force(),
            &Patch::Apply(serde_json::json!({
                "apiVersion": "v1", "kind": "Secret",
                "metadata": {"name": name, "namespace": ns},
                "data": data,
            })),
        )
        .await?;
    Ok(())
}

/// The HCP namespace of `hc_ns/name` as HyperShift makes (or adopts) it: `<hc_ns>-<name>`
/// with its label and a HostedControlPlane annotated `<hc_ns>/<name>`.
pub async fn hcp_namespace_for(c: &Cluster, hc_ns: &str, name: &str) -> Result<()> {
    let hcp_ns = format!("{hc_ns}-{name}");
    c.ensure_namespace(&hcp_ns).await?;
    Api::<k8s_openapi::api::core::v1::Namespace>::all(c.client())
        .patch(
            &hcp_ns,
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"metadata": {"labels": {
                "hypershift.openshift.io/hosted-control-plane": "true"}}})),
        )
        .await?;
    let hcp: DynamicObject = serde_json::from_value(serde_json::json!({
        "apiVersion": "hypershift.openshift.io/v1beta1", "kind": "HostedControlPlane",
        "metadata": {"name": name, "annotations": {"hypershift.openshift.io/cluster": format!("{hc_ns}/{name}")}},
        "spec": {},
    }))?;
    Api::<DynamicObject>::namespaced_with(c.client(), &hcp_ns, &hcp_resource())
        .create(&PostParams::default(), &hcp)
        .await?;
    Ok(())
}

/// A HostedCluster `hc_ns/name` from the `none-minimal` fixture on `release`, whose
/// status.kubeconfig names Secret `kc` of its namespace; with `hcp` its HCP namespace is
/// made as HyperShift makes it.
pub async fn create_hc(
    c: &Cluster,
    hc_ns: &str,
    name: &str,
    release: &str,
    hcp: bool,
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
    v["metadata"]["name"] = name.into();
    v["metadata"]["namespace"] = hc_ns.into();
    if let Some(services) = v["spec"]["services"].as_array_mut() {
        for svc in services {
            if let Some(np) = svc["servicePublishingStrategy"]["nodePort"].as_object_mut() {
                np.insert("address".into(), "api.example.com".into());
            }
        }
    }
    v["spec"]["release"]["image"] = release.into();
    let obj: DynamicObject = serde_json::from_value(v)?;
    c.ensure_namespace(hc_ns).await?;
    let api: Api<DynamicObject> = Api::namespaced_with(c.client(), hc_ns, &hc_resource());
    api.create(&PostParams::default(), &obj).await?;
    api.patch_status(
        name,
        &PatchParams::default(),
        &Patch::Merge(serde_json::json!({"status": {
            "kubeconfig": {"name": "kc"},
            "version": {
                "desired": {"image": release, "version": "4.18.3"},
                "availableUpdates": [],
                "observedGeneration": 1,
            },
        }})),
    )
    .await?;
    if hcp {
        hcp_namespace_for(c, hc_ns, name).await?;
    }
    Ok(())
}

/// The controller's identity: the ServiceAccount of manifests/controller bound to the
/// ClusterRole there, with the leader-election Role and the admission policies.
pub async fn controller_client(c: &Cluster) -> Result<kube::Client> {
    use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
    let sa = c
        .service_account(
            "hcp-olm-system",
            "hcp-olm-controller",
            Duration::from_secs(3600),
        )
        .await?;
    let admin = c.client();
    let role: ClusterRole = serde_yaml_ng::from_str(&std::fs::read_to_string(repo_file(
        "manifests/controller/clusterrole.yaml",
    ))?)?;
    Api::<ClusterRole>::all(admin.clone())
        .create(&PostParams::default(), &role)
        .await?;
    let binding: ClusterRoleBinding = serde_yaml_ng::from_str(&std::fs::read_to_string(
        repo_file("manifests/controller/clusterrolebinding.yaml"),
    )?)?;
    Api::<ClusterRoleBinding>::all(admin.clone())
        .create(&PostParams::default(), &binding)
        .await?;
    let text =
        std::fs::read_to_string(repo_file("manifests/controller/leader-election-role.yaml"))?;
    for doc in serde_yaml_ng::Deserializer::from_str(&text) {
        let v: serde_json::Value = serde::Deserialize::deserialize(doc)?;
        match v["kind"].as_str() {
            Some("Role") => {
                let r: Role = serde_json::from_value(v)?;
                Api::<Role>::namespaced(admin.clone(), "hcp-olm-system")
                    .create(&PostParams::default(), &r)
                    .await?;
            }
            Some("RoleBinding") => {
                let r: RoleBinding = serde_json::from_value(v)?;
                Api::<RoleBinding>::namespaced(admin.clone(), "hcp-olm-system")
                    .create(&PostParams::default(), &r)
                    .await?;
            }
            other => anyhow::bail!("unexpected kind {other:?} in leader-election-role.yaml"),
        }
    }
    c.create_admission_policies(&repo_file("manifests/controller/admission-policy.yaml"))
        .await?;
    Ok(sa.client)
}

/// The namespaces the shared catalog `name`'s NetworkPolicy admits (None: no such policy).
pub async fn admitted(c: &Cluster, name: &str) -> Result<Option<Vec<String>>> {
    let Some(np) = Api::<k8s_openapi::api::networking::v1::NetworkPolicy>::namespaced(
        c.client(),
        hcp_olm_controlplane::sharing::SHARED_NAMESPACE,
    )
    .get_opt(name)
    .await?
    else {
        return Ok(None);
    };
    Ok(Some(
        shared::admitted(&serde_json::to_value(&np)?)
            .into_iter()
            .collect(),
    ))
}

/// Whether the shared catalog `name`'s Deployment exists.
pub async fn shared_deployment(c: &Cluster, name: &str) -> Result<bool> {
    Ok(
        Api::<Deployment>::namespaced(c.client(), hcp_olm_controlplane::sharing::SHARED_NAMESPACE)
            .get_opt(name)
            .await?
            .is_some(),
    )
}

pub async fn reconcile(ctx: &Context, c: &Cluster, ns: &str, name: &str) -> Result<Outcome> {
    let hc = Api::<HostedCluster>::namespaced(c.client(), ns)
        .get(name)
        .await?;
    let o = reconcile_one(ctx, &hc).await?;
    eprintln!("reconcile {ns}/{name}: {o:?}");
    Ok(o)
}

pub async fn pass(ctx: &Context, what: &str) -> Result<shared::PassReport> {
    let r = shared::pass(ctx).await;
    eprintln!("shared pass ({what}): {r:?}");
    ensure!(r.errors.is_empty(), "{what}: {:?}", r.errors);
    Ok(r)
}

pub fn controller_ctx(client: kube::Client, oci: std::sync::Arc<hcp_olm_oci::Client>) -> Context {
    Context::new(
        client,
        Config {
            olm_image: Some(OLM_IMAGE.into()),
            oci: Some(oci),
            // the test's guest API servers listen on 127.0.0.1 (issue 35 item 1)
            guest_servers: hcp_olm_controlplane::runtime::guest::ServerPolicy::allowing(&[
                "127.0.0.0/8",
            ])
            .expect("a CIDR"),
            ..Default::default()
        },
    )
}

/// A `.dockerconfigjson` for `registry` as `user` (with the test password, or `password`).
pub fn docker_config(registry: &str, user: &str, password: Option<&str>) -> Result<Vec<u8>> {
    Ok(serde_json::to_vec(
        &serde_json::json!({"auths": {registry: {
        "username": user, "password": password.unwrap_or(TEST_USER_PASSWORD)}}}),
    )?)
}

/// The world of a tenancy test: two API servers with the CRDs; a registry without auth
/// holding the release (4.18.3); a registry with htpasswd auth (users `reader` and
/// `reader2`, one password) holding the three default catalogs' `v4.18` indexes under
/// `redhat/`, the administrator's mirror of registry.redhat.io/redhat; and the controller's
/// registry client using that mirror, with no credentials of its own.
pub struct World {
    pub env: Environment,
    pub open: Registry,
    pub locked: Registry,
    pub oci: hcp_olm_oci::Client,
    pub release: String,
}

impl World {
    pub async fn start() -> Result<Self> {
        let env = Environment::start().await?;
        setup(&env).await?;
        let open = Registry::start()?;
        let locked = Registry::start_with_htpasswd(&[
            ("reader", TEST_USER_HASH),
            ("reader2", TEST_USER_HASH),
        ])?;
        let (o, l) = (open.addr().to_string(), locked.addr().to_string());
        let pusher = hcp_olm_oci::Client::new(hcp_olm_oci::ClientOptions {
            plain_http: vec![o.clone(), l.clone()],
            pull_secret: hcp_olm_oci::PullSecret::parse(&docker_config(&l, "reader", None)?)?,
            timeout: Some(Duration::from_secs(5)),
            ..Default::default()
        })?;
        let release = format!("{o}/ocp/release:4.18.3-x86_64");
        pusher
            .push_image(
                &release,
                &BTreeMap::from([("io.openshift.release".to_string(), "4.18.3".to_string())]),
            )
            .await?;
        for idx in [
            "redhat-operator-index",
            "certified-operator-index",
            "community-operator-index",
        ] {
            pusher
                .push_image(&format!("{l}/redhat/{idx}:v4.18"), &BTreeMap::new())
                .await?;
        }
        let oci = hcp_olm_oci::Client::new(hcp_olm_oci::ClientOptions {
            plain_http: vec![o.clone(), l.clone()],
            mirrors: vec![hcp_olm_oci::Mirror {
                source: "registry.redhat.io/redhat".into(),
                mirrors: vec![format!("{l}/redhat")],
            }],
            timeout: Some(Duration::from_secs(5)),
            ..Default::default()
        })?;
        env.management.ensure_namespace("clusters").await?;
        Ok(Self {
            env,
            open,
            locked,
            oci,
            release,
        })
    }

    pub fn m(&self) -> &Cluster {
        &self.env.management
    }

    /// HostedCluster `hc_ns/name` (with its HCP namespace made as HyperShift makes it when
    /// `hcp`), its admin kubeconfig Secret `kc` reaching the guest, and, with `user`, a pull
    /// secret in its HCP namespace reading the locked registry as that user.
    pub async fn cluster(
        &self,
        hc_ns: &str,
        name: &str,
        user: Option<&str>,
        hcp: bool,
    ) -> Result<()> {
        let m = self.m();
        put_secret(
            m,
            hc_ns,
            "kc",
            "kubeconfig",
            std::fs::read(self.env.guest.kubeconfig())?,
        )
        .await?;
        create_hc(m, hc_ns, name, &self.release, hcp).await?;
        if let Some(user) = user {
            put_secret(
                m,
                &format!("{hc_ns}-{name}"),
                hcp_olm_controlplane::hostedcluster::HCP_PULL_SECRET,
                ".dockerconfigjson",
                docker_config(self.locked.addr(), user, None)?,
            )
            .await?;
        }
        Ok(())
    }

    /// The controller: its ServiceAccount, this world's registry client, events on.
    pub async fn controller(&self) -> Result<Context> {
        Ok(controller_ctx(
            controller_client(self.m()).await?,
            std::sync::Arc::new(self.oci.clone()),
        ))
    }
}

/// Spins (bounded by `d`) without a request: the lifetime of a recorded use runs out.
pub async fn wait(d: Duration) {
    let deadline = std::time::Instant::now() + d;
    while std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}
