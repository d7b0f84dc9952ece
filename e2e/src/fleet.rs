//! A fleet of HostedClusters for the controller benchmark and the restart test: the
//! HostedCluster fixture as a template, one kubeconfig Secret + HostedCluster (+ status) +
//! labelled HCP namespace per cluster, and the controller's ServiceAccount with the RBAC
//! from `manifests/`.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context as _, Result};
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
use kube::api::{Api, ApiResource, DynamicObject, Patch, PatchParams, PostParams};

use crate::Cluster;
use crate::tools::fixtures_dir;

/// Every resource the controller may write, in either cluster.
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
    "operatorhubs",
    "namespaces",
    "events",
];
pub const HC_NS: &str = "clusters";
pub const OLM_IMAGE: &str = "quay.io/openshift-release-dev/ocp-v4.0-art-dev@sha256:aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
pub const RELEASE_IMAGE: &str = "quay.io/openshift-release-dev/ocp-release:4.18.3-x86_64";

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
