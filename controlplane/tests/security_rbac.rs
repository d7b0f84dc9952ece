//! The controller's own permissions on the management cluster, on a real
//! kube-apiserver with exactly the RBAC and admission policies of manifests/ (every
//! non-CRD file manifests/kustomization.yaml lists, applied as it is).
//!
//! Each refused request below was allowed by the manifests before the ClusterRole was
//! narrowed and the ValidatingAdmissionPolicies were added; each allowed request is
//! something the controller does (so a policy that refused everything fails too).

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail, ensure};
use hcp_olm_e2e::cluster::{Cluster, ClusterOptions};
use hcp_olm_e2e::tools::fixtures_dir;
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams,
};

const SA_NS: &str = "hcp-olm-system";
const SA: &str = "hcp-olm-controller";
const HC_NS: &str = "clusters";
const HCP_NS: &str = "clusters-hc1";
const HCP_LABEL: &str = "hypershift.openshift.io/hosted-control-plane";
const FINALIZER: &str = hcp_olm_controlplane::runtime::FINALIZER;

fn repo_file(p: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..").join(p)
}

fn yaml_docs(path: &PathBuf) -> Result<Vec<serde_json::Value>> {
    let text = std::fs::read_to_string(path).with_context(|| format!("reading {path:?}"))?;
    let mut out = Vec::new();
    for doc in serde_yaml_ng::Deserializer::from_str(&text) {
        let v: serde_json::Value = serde::Deserialize::deserialize(doc)?;
        if !v.is_null() {
            out.push(v);
        }
    }
    Ok(out)
}

/// Server-side applies every object of the non-CRD files manifests/kustomization.yaml
/// lists (CRDs are installed with [`Cluster::install_crds`]).
async fn apply_manifests(cluster: &Cluster) -> Result<()> {
    let kust = yaml_docs(&repo_file("manifests/kustomization.yaml"))?;
    let resources = kust
        .first()
        .and_then(|k| k["resources"].as_array())
        .context("kustomization has resources")?;
    let client = cluster.client();
    for r in resources {
        let file = r.as_str().context("resource is a path")?;
        if file.starts_with("crds/") {
            continue;
        }
        for v in yaml_docs(&repo_file(&format!("manifests/{file}")))? {
            let api_version = v["apiVersion"].as_str().context("apiVersion")?;
            let kind = v["kind"].as_str().context("kind")?;
            let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
            let gvk = GroupVersionKind::gvk(group, version, kind);
            let (ar, caps) = kube::discovery::pinned_kind(&client, &gvk).await?;
            let name = v["metadata"]["name"].as_str().context("name")?.to_string();
            let api: Api<DynamicObject> = match v["metadata"]["namespace"].as_str() {
                Some(ns) if caps.scope == kube::discovery::Scope::Namespaced => {
                    Api::namespaced_with(client.clone(), ns, &ar)
                }
                _ => Api::all_with(client.clone(), &ar),
            };
            api.patch(
                &name,
                &PatchParams::apply("test").force(),
                &Patch::Apply(&v),
            )
            .await
            .with_context(|| format!("applying {kind} {name} from manifests/{file}"))?;
        }
    }
    Ok(())
}

fn hc_resource() -> ApiResource {
    ApiResource::erase::<hcp_olm_controlplane::hostedcluster::HostedCluster>(&())
}

/// A HostedCluster from the `none-minimal` fixture (as the runtime tests make it).
async fn create_hc(cluster: &Cluster, name: &str) -> Result<()> {
    let mut hc = None;
    for v in yaml_docs(&fixtures_dir().join("hypershift/examples/none-minimal.yaml"))? {
        if v["kind"] == "HostedCluster" {
            hc = Some(v);
        }
    }
    let mut v = hc.context("fixture has a HostedCluster")?;
    v["metadata"]["name"] = name.into();
    v["metadata"]["namespace"] = HC_NS.into();
    v["metadata"]["finalizers"] = serde_json::json!(["hypershift.openshift.io/finalizer"]);
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
    Api::<DynamicObject>::namespaced_with(cluster.client(), HC_NS, &hc_resource())
        .create(&PostParams::default(), &obj)
        .await?;
    Ok(())
}

fn ar(group: &str, version: &str, kind: &str, plural: &str) -> ApiResource {
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(group, version, kind), plural)
}

/// A minimal valid object of each kind the controller writes in HCP namespaces.
fn sample(kind: &str, name: &str) -> (ApiResource, serde_json::Value) {
    let meta = serde_json::json!({"name": name});
    match kind {
        "Secret" => (
            ar("", "v1", "Secret", "secrets"),
            serde_json::json!({"apiVersion": "v1", "kind": "Secret", "metadata": meta,
                "stringData": {"k": "v"}}),
        ),
        "ServiceAccount" => (
            ar("", "v1", "ServiceAccount", "serviceaccounts"),
            serde_json::json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": meta}),
        ),
        "Service" => (
            ar("", "v1", "Service", "services"),
            serde_json::json!({"apiVersion": "v1", "kind": "Service", "metadata": meta,
                "spec": {"ports": [{"port": 443}], "selector": {"app": name}}}),
        ),
        "Deployment" => (
            ar("apps", "v1", "Deployment", "deployments"),
            serde_json::json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": meta,
                "spec": {"selector": {"matchLabels": {"app": name}},
                  "template": {"metadata": {"labels": {"app": name}},
                    "spec": {"serviceAccountName": "hcp-olm-sample",
                      "containers": [{"name": "c", "image": "registry.invalid/x:1"}]}}}}),
        ),
        "NetworkPolicy" => (
            ar(
                "networking.k8s.io",
                "v1",
                "NetworkPolicy",
                "networkpolicies",
            ),
            serde_json::json!({"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
                "metadata": meta, "spec": {"podSelector": {}}}),
        ),
        "PodDisruptionBudget" => (
            ar(
                "policy",
                "v1",
                "PodDisruptionBudget",
                "poddisruptionbudgets",
            ),
            serde_json::json!({"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
                "metadata": meta, "spec": {"maxUnavailable": 1,
                  "selector": {"matchLabels": {"app": name}}}}),
        ),
        "ServiceMonitor" => (
            ar(
                "monitoring.coreos.com",
                "v1",
                "ServiceMonitor",
                "servicemonitors",
            ),
            serde_json::json!({"apiVersion": "monitoring.coreos.com/v1", "kind": "ServiceMonitor",
                "metadata": meta, "spec": {"selector": {"matchLabels": {"app": name}}, "endpoints": []}}),
        ),
        other => panic!("no sample for {other}"),
    }
}

/// The shared catalogs' namespace (issue 18).
const SHARED_NS: &str = "hcp-olm-catalogs";

const WRITTEN_KINDS: &[&str] = &[
    "Secret",
    "ServiceAccount",
    "Service",
    "Deployment",
    "NetworkPolicy",
    "PodDisruptionBudget",
    "ServiceMonitor",
];

async fn create_as(client: &kube::Client, ns: &str, kind: &str, name: &str) -> kube::Result<()> {
    let (ar, v) = sample(kind, name);
    let obj: DynamicObject = serde_json::from_value(v).expect("sample is an object");
    Api::<DynamicObject>::namespaced_with(client.clone(), ns, &ar)
        .create(&PostParams::default(), &obj)
        .await
        .map(|_| ())
}

/// `r` must be a 403; returns its message.
fn forbidden(r: kube::Result<impl std::fmt::Debug>, what: &str) -> Result<String> {
    match r {
        Err(kube::Error::Api(s)) if s.code == 403 => Ok(s.message),
        Err(e) => bail!("{what}: expected 403 Forbidden, got error {e}"),
        Ok(v) => bail!("{what}: the controller's ServiceAccount was allowed (expected 403): {v:?}"),
    }
}

const VAP_NS_MESSAGE: &str = "hcp-olm-controller may write";
const VAP_HC_MESSAGE: &str = "hcp-olm-controller may only add or remove the finalizer";

/// Admission policies reach the API server's cache a moment after they are created:
/// probe with a Secret in `default` until it is refused (bounded), so later checks are
/// not racing the cache. With no policy in manifests/ this fails after the bound.
async fn wait_policies_active(sa: &kube::Client, admin: &kube::Client) -> Result<()> {
    let bound = Duration::from_secs(30);
    let start = Instant::now();
    let secrets: Api<DynamicObject> =
        Api::namespaced_with(admin.clone(), "default", &sample("Secret", "x").0);
    loop {
        match create_as(sa, "default", "Secret", "probe").await {
            Err(kube::Error::Api(s)) if s.code == 403 && s.message.contains(VAP_NS_MESSAGE) => {
                return Ok(());
            }
            Err(e) => bail!("probe Secret default/probe: unexpected error {e}"),
            Ok(()) => {
                secrets.delete("probe", &DeleteParams::default()).await?;
            }
        }
        if start.elapsed() > bound {
            bail!(
                "the controller's ServiceAccount still creates Secret default/probe after {bound:?}: \
                 no admission policy confines its writes to HCP namespaces"
            );
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

#[tokio::test]
async fn controller_service_account_is_confined() -> Result<()> {
    let cluster = Cluster::start(ClusterOptions::new("rbac")).await?;
    let admin = cluster.client();
    cluster
        .install_crds(&[
            fixtures_dir().join("hypershift/crds/hostedclusters-Hypershift-Default.crd.yaml"),
            repo_file("manifests/crds/hostedolm.yaml"),
            repo_file("e2e/testdata/crds/standin/servicemonitors.monitoring.coreos.com.yaml"),
        ])
        .await?;
    apply_manifests(&cluster).await?;
    let sa = cluster
        .service_account(SA_NS, SA, Duration::from_secs(3600))
        .await?
        .client;
    cluster.ensure_namespace(HC_NS).await?;
    cluster.ensure_namespace(HCP_NS).await?;
    Api::<k8s_openapi::api::core::v1::Namespace>::all(admin.clone())
        .patch(
            HCP_NS,
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"metadata": {"labels": {HCP_LABEL: "true"}}})),
        )
        .await?;
    create_hc(&cluster, "hc1").await?;

    wait_policies_active(&sa, &admin).await?;
    // (No kube-controller-manager runs, so policy status.typeChecking is never set; a
    // broken expression shows as a refused allowed-request below: failurePolicy Fail.)

    // 1. Writes outside HCP namespaces are refused: every kind the controller writes,
    //    in `default` and in the HostedCluster's own namespace.
    for ns in ["default", HC_NS] {
        for kind in WRITTEN_KINDS {
            let msg = forbidden(
                create_as(&sa, ns, kind, "intruder").await,
                &format!("create {kind} {ns}/intruder"),
            )?;
            ensure!(msg.contains(VAP_NS_MESSAGE), "create {kind} in {ns}: {msg}");
        }
    }
    // Update and delete of an object someone else made there are refused too.
    let (secret_ar, _) = sample("Secret", "x");
    create_as(&admin, "kube-system", "Secret", "someone-elses").await?;
    let sa_secrets: Api<DynamicObject> =
        Api::namespaced_with(sa.clone(), "kube-system", &secret_ar);
    forbidden(
        sa_secrets
            .patch(
                "someone-elses",
                &PatchParams::default(),
                &Patch::Merge(serde_json::json!({"stringData": {"k": "stolen"}})),
            )
            .await,
        "patch Secret kube-system/someone-elses",
    )?;
    forbidden(
        sa_secrets
            .delete("someone-elses", &DeleteParams::default())
            .await,
        "delete Secret kube-system/someone-elses",
    )?;
    let (dep_ar, _) = sample("Deployment", "x");
    create_as(&admin, "default", "Deployment", "someone-elses").await?;
    forbidden(
        Api::<DynamicObject>::namespaced_with(sa.clone(), "default", &dep_ar)
            .patch(
                "someone-elses",
                &PatchParams::default(),
                &Patch::Merge(serde_json::json!({"spec": {"template": {"spec":
                    {"serviceAccountName": "admin"}}}})),
            )
            .await,
        "patch Deployment default/someone-elses (run as another ServiceAccount)",
    )?;
    // The policies bind only the controller: an administrator is not affected.
    create_as(&admin, "default", "Service", "admins-own").await?;

    // 2. In a namespace with HyperShift's HCP label everything the controller renders
    //    is created, updated and deleted (RBAC grants it, the policy lets it through).
    for kind in WRITTEN_KINDS {
        create_as(&sa, HCP_NS, kind, "ours")
            .await
            .with_context(|| format!("create {kind} {HCP_NS}/ours as the controller"))?;
        let (ar, _) = sample(kind, "ours");
        let api: Api<DynamicObject> = Api::namespaced_with(sa.clone(), HCP_NS, &ar);
        api.patch(
            "ours",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"metadata": {"labels": {"x": "y"}}})),
        )
        .await
        .with_context(|| format!("patch {kind} {HCP_NS}/ours as the controller"))?;
        api.delete("ours", &DeleteParams::default())
            .await
            .with_context(|| format!("delete {kind} {HCP_NS}/ours as the controller"))?;
    }
    // Not even there may its Deployments run as a ServiceAccount it does not render
    // (HyperShift's own in that namespace hold more rights).
    let (_, mut dep) = sample("Deployment", "borrowed");
    dep["spec"]["template"]["spec"]["serviceAccountName"] = "control-plane-operator".into();
    let msg = forbidden(
        Api::<DynamicObject>::namespaced_with(sa.clone(), HCP_NS, &dep_ar)
            .create(&PostParams::default(), &serde_json::from_value(dep)?)
            .await,
        "create Deployment running as control-plane-operator in the HCP namespace",
    )?;
    ensure!(
        msg.contains("only as its own ServiceAccounts"),
        "borrowed ServiceAccount: {msg}"
    );
    // Its own Lease in hcp-olm-system and Events stay allowed.
    let lease = serde_json::json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
        "metadata": {"name": "hcp-olm-controller"}, "spec": {"holderIdentity": "a"}});
    Api::<DynamicObject>::namespaced_with(
        sa.clone(),
        SA_NS,
        &ar("coordination.k8s.io", "v1", "Lease", "leases"),
    )
    .create(&PostParams::default(), &serde_json::from_value(lease)?)
    .await
    .context("create Lease as the controller")?;
    let event = serde_json::json!({"apiVersion": "events.k8s.io/v1", "kind": "Event",
        "metadata": {"name": "e1"}, "eventTime": "2026-01-01T00:00:00.000000Z",
        "reportingController": "hcp-olm.io/controller", "reportingInstance": "a",
        "action": "Reconcile", "reason": "Test", "type": "Normal",
        "regarding": {"apiVersion": "olm.hcp-olm.io/v1alpha1", "kind": "HostedOLM",
            "namespace": HCP_NS, "name": "hc1"}});
    Api::<DynamicObject>::namespaced_with(
        sa.clone(),
        HCP_NS,
        &ar("events.k8s.io", "v1", "Event", "events"),
    )
    .create(&PostParams::default(), &serde_json::from_value(event)?)
    .await
    .context("create Event as the controller")?;

    // 2b. Shared catalogs (issue 18): the controller may create the namespace
    //     hcp-olm-catalogs and nothing else, never delete it, and write there only the
    //     kinds of a shared catalog (no Secrets).
    let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(sa.clone());
    let ns_obj = |name: &str| -> Result<k8s_openapi::api::core::v1::Namespace> {
        Ok(serde_json::from_value(
            serde_json::json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}),
        )?)
    };
    // The controller's own write: server-side apply of the rendered namespace, as the
    // shared pass sends it (with the apply hash annotation; creates it).
    let rendered_ns =
        hcp_olm_apply::compare::with_hash(&hcp_olm_controlplane::render::shared::namespace().body);
    let apply_rendered = || async {
        namespaces
            .patch(
                SHARED_NS,
                &PatchParams::apply(hcp_olm_controlplane::runtime::FIELD_MANAGER).force(),
                &Patch::Apply(&rendered_ns),
            )
            .await
    };
    apply_rendered()
        .await
        .context("apply the rendered namespace hcp-olm-catalogs as the controller")?;
    let msg = forbidden(
        namespaces
            .create(&PostParams::default(), &ns_obj("intruder-ns")?)
            .await,
        "create namespace intruder-ns",
    )?;
    ensure!(
        msg.contains("only the namespace hcp-olm-catalogs"),
        "create namespace: {msg}"
    );
    forbidden(
        namespaces
            .patch(
                "default",
                &PatchParams::default(),
                &Patch::Merge(serde_json::json!({"metadata": {"labels": {"x": "y"}}})),
            )
            .await,
        "patch namespace default",
    )?;
    forbidden(
        namespaces.delete(SHARED_NS, &DeleteParams::default()).await,
        "delete namespace hcp-olm-catalogs",
    )?;
    // Issue 35, item 4: the labels of hcp-olm-catalogs decide what may run there. The
    // controller may not lower its Pod Security level, drop it, add HyperShift's HCP label
    // (which opens the namespace to its Secret writes) or any label it does not render.
    // (Each of these was allowed before the policy checked labels: relabelling to
    // `enforce=privileged` answered 200.)
    for (what, labels, says) in [
        (
            "relabel enforce=privileged",
            serde_json::json!({"pod-security.kubernetes.io/enforce": "privileged"}),
            "Pod Security level",
        ),
        (
            "drop the enforce label",
            serde_json::json!({"pod-security.kubernetes.io/enforce": null}),
            "Pod Security level",
        ),
        (
            "add the HCP label",
            serde_json::json!({HCP_LABEL: "true"}),
            HCP_LABEL,
        ),
        (
            "relabel enforce-version=v1.0",
            serde_json::json!({"pod-security.kubernetes.io/enforce-version": "v1.0"}),
            "only the labels it renders",
        ),
        (
            "add an unrendered label",
            serde_json::json!({"x": "y"}),
            "only the labels it renders",
        ),
    ] {
        let msg = forbidden(
            namespaces
                .patch(
                    SHARED_NS,
                    &PatchParams::default(),
                    &Patch::Merge(serde_json::json!({"metadata": {"labels": labels}})),
                )
                .await,
            &format!("{what} on namespace hcp-olm-catalogs"),
        )?;
        ensure!(msg.contains(says), "{what}: {msg}");
    }
    forbidden(
        namespaces
            .patch(
                SHARED_NS,
                &PatchParams::default(),
                &Patch::Merge(serde_json::json!({"metadata": {"annotations": {"x": "y"}}})),
            )
            .await,
        "annotate namespace hcp-olm-catalogs",
    )?;
    // The controller's own apply still passes: again (no change), and after an
    // administrator lowered the level by hand (the apply raises it back).
    apply_rendered()
        .await
        .context("apply the rendered namespace again as the controller")?;
    Api::<k8s_openapi::api::core::v1::Namespace>::all(admin.clone())
        .patch(
            SHARED_NS,
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"metadata": {"labels": {
                "pod-security.kubernetes.io/enforce": "baseline", "team": "platform"}}})),
        )
        .await?;
    let back = apply_rendered()
        .await
        .context("apply the rendered namespace over an admin's baseline as the controller")?;
    let labels = back.metadata.labels.unwrap_or_default();
    ensure!(
        labels
            .get("pod-security.kubernetes.io/enforce")
            .map(String::as_str)
            == Some("restricted")
            && labels.get("team").map(String::as_str) == Some("platform"),
        "after the controller's apply: {labels:?}"
    );
    for kind in [
        "ServiceAccount",
        "Service",
        "Deployment",
        "NetworkPolicy",
        "PodDisruptionBudget",
    ] {
        create_as(&sa, SHARED_NS, kind, "shared")
            .await
            .with_context(|| format!("create {kind} {SHARED_NS}/shared as the controller"))?;
    }
    let msg = forbidden(
        create_as(&sa, SHARED_NS, "Secret", "shared").await,
        "create Secret in hcp-olm-catalogs",
    )?;
    ensure!(msg.contains(VAP_NS_MESSAGE), "Secret in {SHARED_NS}: {msg}");

    // 3. HostedClusters: the controller adds and removes its finalizer (a merge patch,
    //    as ensure_finalizer sends); nothing else.
    let hcs: Api<DynamicObject> = Api::namespaced_with(sa.clone(), HC_NS, &hc_resource());
    let set_finalizers = |f: Vec<&str>| serde_json::json!({"metadata": {"finalizers": f}});
    hcs.patch(
        "hc1",
        &PatchParams::default(),
        &Patch::Merge(set_finalizers(vec![
            "hypershift.openshift.io/finalizer",
            FINALIZER,
        ])),
    )
    .await
    .context("add our finalizer to HostedCluster hc1 as the controller")?;
    let msg = forbidden(
        hcs.patch(
            "hc1",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"spec": {"release": {"image":
                "quay.io/attacker/release:1"}}})),
        )
        .await,
        "patch HostedCluster spec.release.image",
    )?;
    ensure!(msg.contains(VAP_HC_MESSAGE), "spec patch: {msg}");
    for (what, patch) in [
        (
            "labels",
            serde_json::json!({"metadata": {"labels": {"x": "y"}}}),
        ),
        (
            "annotations",
            serde_json::json!({"metadata": {"annotations": {"x": "y"}}}),
        ),
        ("HyperShift's finalizer", set_finalizers(vec![FINALIZER])),
    ] {
        let msg = forbidden(
            hcs.patch("hc1", &PatchParams::default(), &Patch::Merge(patch))
                .await,
            &format!("patch HostedCluster {what}"),
        )?;
        ensure!(msg.contains(VAP_HC_MESSAGE), "{what}: {msg}");
    }
    // TakeOver: exactly catalog-operator, olm-operator and packageserver may be added to
    // and removed from HyperShift's debug-deployments (with our record beside it); any
    // other name — which would stop another control-plane component — is refused, as is
    // removing a name an admin listed.
    let debug = |v: Option<&str>, record: Option<&str>| {
        serde_json::json!({"metadata": {"annotations": {
            "hypershift.openshift.io/debug-deployments": v,
            "hcp-olm.io/debug-deployments-added": record,
        }}})
    };
    Api::<DynamicObject>::namespaced_with(admin.clone(), HC_NS, &hc_resource())
        .patch(
            "hc1",
            &PatchParams::default(),
            &Patch::Merge(debug(Some("konnectivity-agent"), None)),
        )
        .await
        .context("an admin lists a Deployment in debug-deployments")?;
    hcs.patch(
        "hc1",
        &PatchParams::default(),
        &Patch::Merge(debug(
            Some("konnectivity-agent,catalog-operator,olm-operator,packageserver"),
            Some(r#"{"before":"konnectivity-agent","added":["catalog-operator","olm-operator","packageserver"]}"#),
        )),
    )
    .await
    .context("take over: add the OLM Deployments to debug-deployments as the controller")?;
    for (what, value) in [
        (
            "add kube-apiserver",
            "konnectivity-agent,catalog-operator,olm-operator,packageserver,kube-apiserver",
        ),
        (
            "remove the admin's konnectivity-agent",
            "catalog-operator,olm-operator,packageserver",
        ),
    ] {
        let msg = forbidden(
            hcs.patch(
                "hc1",
                &PatchParams::default(),
                &Patch::Merge(debug(Some(value), None)),
            )
            .await,
            &format!("debug-deployments: {what}"),
        )?;
        ensure!(
            msg.contains("may only add or remove catalog-operator, olm-operator and packageserver"),
            "{what}: {msg}"
        );
    }
    hcs.patch(
        "hc1",
        &PatchParams::default(),
        &Patch::Merge(debug(Some("konnectivity-agent"), None)),
    )
    .await
    .context("hand back: restore debug-deployments as the controller")?;
    Api::<DynamicObject>::namespaced_with(admin.clone(), HC_NS, &hc_resource())
        .patch(
            "hc1",
            &PatchParams::default(),
            &Patch::Merge(debug(None, None)),
        )
        .await?;
    // No update (PUT), no status, no create/delete: RBAC.
    let current = hcs.get("hc1").await?;
    forbidden(
        hcs.replace("hc1", &PostParams::default(), &current).await,
        "update (PUT) HostedCluster",
    )?;
    forbidden(
        hcs.patch_status(
            "hc1",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"status": {"kubeconfig": {"name": "evil"}}})),
        )
        .await,
        "patch HostedCluster status",
    )?;
    forbidden(
        hcs.delete("hc1", &DeleteParams::default()).await,
        "delete HostedCluster",
    )?;
    hcs.patch(
        "hc1",
        &PatchParams::default(),
        &Patch::Merge(set_finalizers(vec!["hypershift.openshift.io/finalizer"])),
    )
    .await
    .context("remove our finalizer from HostedCluster hc1 as the controller")?;
    let after = Api::<DynamicObject>::namespaced_with(admin.clone(), HC_NS, &hc_resource())
        .get("hc1")
        .await?;
    ensure!(
        after.metadata.finalizers == Some(vec!["hypershift.openshift.io/finalizer".into()])
            && after.data["spec"]["release"]["image"]
                == "quay.io/openshift-release-dev/ocp-release:4.18.3-x86_64",
        "HostedCluster changed beyond our finalizer: {:?} {}",
        after.metadata.finalizers,
        after.data["spec"]["release"]
    );
    Ok(())
}

/// The controller lists and watches Secrets cluster-wide (RBAC cannot grant less), but
/// asks only for metadata: the `run` loop (in process, as the ServiceAccount under
/// manifests/) against an API server whose audit log records the controller's Secret
/// requests with their responses. Every Secret LIST it makes is answered with a
/// PartialObjectMetadataList and carries no Secret data. (The audit log records no
/// response body for WATCH; the watcher sends the same Accept header for its list and
/// its watch, so the list stands for both.)
#[tokio::test]
async fn secret_list_and_watch_are_metadata_only() -> Result<()> {
    use futures::FutureExt;
    use hcp_olm_controlplane::runtime::controller::{RunOptions, run};
    use hcp_olm_controlplane::runtime::{Config, Context};

    let dir = tempfile::tempdir()?;
    let policy = dir.path().join("audit-policy.yaml");
    let audit_log = dir.path().join("audit.log");
    std::fs::write(
        &policy,
        format!(
            "apiVersion: audit.k8s.io/v1\nkind: Policy\nomitStages: [\"RequestReceived\"]\n\
             rules:\n  - level: RequestResponse\n    users: [\"system:serviceaccount:{SA_NS}:{SA}\"]\n\
             \x20   resources: [{{group: \"\", resources: [\"secrets\"]}}]\n  - level: None\n"
        ),
    )?;
    let mut opts = ClusterOptions::new("audit");
    opts.extra_apiserver_args = vec![
        format!("--audit-policy-file={}", policy.display()),
        format!("--audit-log-path={}", audit_log.display()),
        "--audit-log-mode=blocking".into(),
    ];
    let cluster = Cluster::start(opts).await?;
    cluster
        .install_crds(&[
            fixtures_dir().join("hypershift/crds/hostedclusters-Hypershift-Default.crd.yaml"),
            repo_file("manifests/crds/hostedolm.yaml"),
        ])
        .await?;
    apply_manifests(&cluster).await?;
    let sa = cluster
        .service_account(SA_NS, SA, Duration::from_secs(3600))
        .await?
        .client;
    cluster.ensure_namespace(HC_NS).await?;
    // A Secret whose value must never show up in a list/watch response.
    const MARKER: &str = "marker-value-not-for-the-controller";
    Api::<k8s_openapi::api::core::v1::Secret>::namespaced(cluster.client(), "default")
        .create(
            &PostParams::default(),
            &serde_json::from_value(serde_json::json!({
                "metadata": {"name": "someone-elses"},
                "stringData": {"password": MARKER},
            }))?,
        )
        .await?;
    let marker_b64 = {
        use base64::Engine as _;
        base64::engine::general_purpose::STANDARD.encode(MARKER)
    };

    let ctx = std::sync::Arc::new(Context::new(
        sa,
        Config {
            olm_image: Some(format!(
                "quay.io/openshift-release-dev/ocp-v4.0-art-dev@sha256:{}",
                "a".repeat(64)
            )),
            guest_servers: hcp_olm_controlplane::runtime::guest::ServerPolicy::allowing(&[
                "127.0.0.0/8",
            ])
            .expect("a CIDR"),
            ..Default::default()
        },
    ));
    let (stop_tx, stop_rx) = futures::channel::oneshot::channel::<()>();
    let runner = tokio::spawn(run(ctx, RunOptions::default(), stop_rx.map(|_| ())));

    // Bounded wait for the controller's cluster-wide Secret list to be audited.
    let events = async {
        let start = Instant::now();
        loop {
            let text = std::fs::read_to_string(&audit_log).unwrap_or_default();
            let events: Vec<serde_json::Value> = text
                .lines()
                .filter_map(|l| serde_json::from_str(l).ok())
                .filter(|e: &serde_json::Value| {
                    e["stage"] == "ResponseComplete"
                        && (e["verb"] == "list" || e["verb"] == "watch")
                })
                .collect();
            if events
                .iter()
                .any(|e| e["verb"] == "list" && e["objectRef"]["namespace"].is_null())
            {
                return Ok(events);
            }
            ensure!(
                start.elapsed() < Duration::from_secs(60),
                "no cluster-wide Secret list by the controller in the audit log after 60 s"
            );
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }
    .await;
    let _ = stop_tx.send(());
    tokio::time::timeout(Duration::from_secs(30), runner)
        .await
        .context("controller did not stop within 30 s")??;
    let events: Vec<serde_json::Value> = events?;

    for e in &events {
        let uri = e["requestURI"].as_str().unwrap_or_default();
        ensure!(
            e["user"]["username"] == format!("system:serviceaccount:{SA_NS}:{SA}"),
            "audit policy leaked another user's request: {uri}"
        );
        if e["verb"] == "list" && e["responseStatus"]["code"] == 200 {
            ensure!(
                e["responseObject"]["kind"] == "PartialObjectMetadataList",
                "the controller listed full Secret objects: {uri} answered with {}",
                e["responseObject"]["kind"]
            );
        }
        ensure!(
            !e.to_string().contains(&marker_b64) && !e.to_string().contains(MARKER),
            "Secret data reached the controller through {} {uri}",
            e["verb"]
        );
    }
    eprintln!(
        "audited Secret list/watch requests by the controller: {}",
        events.len()
    );
    Ok(())
}

/// A stop asked for while the controller still waits for its caches' first lists (up to 30 s;
/// here they never complete: the ServiceAccount has no RBAC at all) ends the loop at once.
/// Found under `make test`'s parallel load, where the caches of
/// `secret_list_and_watch_are_metadata_only` were slow to list and its stop took over 30 s.
#[tokio::test]
async fn stop_while_the_caches_sync_ends_the_controller_at_once() -> Result<()> {
    use futures::FutureExt as _;
    use hcp_olm_controlplane::runtime::controller::{RunOptions, run};
    use hcp_olm_controlplane::runtime::{Config, Context};
    let cluster = Cluster::start(ClusterOptions::new("stop")).await?;
    let nobody = cluster
        .service_account("default", "nobody", Duration::from_secs(3600))
        .await?
        .client;
    let ctx = std::sync::Arc::new(Context::new(nobody, Config::default()));
    let (stop_tx, stop_rx) = futures::channel::oneshot::channel::<()>();
    let runner = tokio::spawn(run(ctx, RunOptions::default(), stop_rx.map(|_| ())));
    tokio::time::sleep(Duration::from_secs(2)).await;
    let asked = Instant::now();
    let _ = stop_tx.send(());
    tokio::time::timeout(Duration::from_secs(10), runner)
        .await
        .context(
            "the controller did not stop within 10 s of being asked while its caches synced",
        )??;
    eprintln!("stopped {:?} after being asked", asked.elapsed());
    Ok(())
}
