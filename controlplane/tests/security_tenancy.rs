//! Hostile tenants and the controller's shared state (issue 35, items 3 and 9), on real
//! API servers (management + guest) and real registries, the controller as its
//! ServiceAccount with exactly the RBAC and admission policies of manifests/controller.
//!
//! Each test is an attack that succeeded on the code before its fix (the commit that added
//! it says how it failed).

#[path = "common/tenancy.rs"]
mod tenancy;

use anyhow::{Result, ensure};
use hcp_olm_controlplane::hostedcluster::HostedCluster;
use hcp_olm_controlplane::hostedolm::HostedOLM;
use hcp_olm_controlplane::runtime::FINALIZER;
use hcp_olm_controlplane::runtime::reconcile::{State, hcp_kinds, selector_for};
use kube::api::{Api, DynamicObject, ListParams, Patch, PatchParams};
use tenancy::*;

/// One environment at a time under `cargo test` (see runtime.rs).
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Issue 35, item 3: HostedCluster `team/a-b` computes the HCP namespace `team-a-b` of its
/// victim `team-a/b` (HyperShift's owner, the only user of the shared redhat-operators
/// catalog). The attacker deletes its HostedCluster while a finalizer of its own holds it,
/// and patches it again and again (each patch is a reconcile of the deleted cluster), first
/// with our finalizer on it, then without. The victim must stay admitted by the shared catalog's
/// NetworkPolicy and the shared catalog must stay, after every round.
#[tokio::test]
async fn security_colliding_hosted_cluster_cannot_cut_a_victim_off_its_shared_catalog() -> Result<()>
{
    let _serial = SERIAL.lock().await;
    let w = World::start().await?;
    let m = w.m();
    w.cluster("team-a", "b", Some("reader"), true).await?;
    w.cluster("team", "a-b", None, false).await?;
    let ctx = w.controller().await?.with_events(None);
    // The first pass looks at the (not yet existing) NetworkPolicies: nobody was admitted
    // before this process, so only this process's decisions count.
    pass(&ctx, "before anything").await?;
    reconcile(&ctx, m, "team-a", "b").await?;
    reconcile(&ctx, m, "team-a", "b").await?;
    pass(&ctx, "victim reconciled").await?;
    ensure!(
        shared_deployment(m, RH).await?,
        "no shared {RH} for the victim"
    );
    ensure!(
        admitted(m, RH).await? == Some(vec!["team-a-b".to_string()]),
        "victim not admitted: {:?}",
        admitted(m, RH).await?
    );
    let o = reconcile(&ctx, m, "team", "a-b").await?;
    ensure!(
        o.state == State::Invalid("ControlPlaneNamespaceNotOwned".into()),
        "the attacker was served: {o:?}"
    );

    // The attack: deleted, held by the attacker's finalizer, patched again and again. Our
    // finalizer is on it too at first (its owner may write its metadata; none can be added
    // once it is being deleted), so the first cleanup runs past its finalizer check and
    // releases ours; later ones stop at it.
    let hcs = Api::<DynamicObject>::namespaced_with(m.client(), "team", &hc_resource());
    hcs.patch(
        "a-b",
        &PatchParams::default(),
        &Patch::Merge(serde_json::json!({"metadata": {"finalizers": [HOLD, FINALIZER]}})),
    )
    .await?;
    hcs.delete("a-b", &Default::default()).await?;
    for round in 0..4 {
        hcs.patch(
            "a-b",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"metadata": {
                "labels": {"round": round.to_string()},
            }})),
        )
        .await?;
        let o = reconcile(&ctx, m, "team", "a-b").await?;
        ensure!(o.state == State::CleanedUp, "round {round}: {o:?}");
        pass(&ctx, &format!("attack round {round}")).await?;
        ensure!(
            shared_deployment(m, RH).await?,
            "round {round}: the colliding HostedCluster team/a-b's cleanup deleted the shared catalog {RH} its victim team-a/b uses"
        );
        let adm = admitted(m, RH).await?;
        ensure!(
            adm == Some(vec!["team-a-b".to_string()]),
            "round {round}: the colliding HostedCluster team/a-b's cleanup cut its victim team-a/b off the shared catalog: admitted {adm:?}"
        );
    }
    // The victim is still served, and nothing changes for it.
    let o = reconcile(&ctx, m, "team-a", "b").await?;
    ensure!(o.hcp_writes == 0, "victim after the attack: {o:?}");
    hcs.patch(
        "a-b",
        &PatchParams::default(),
        &Patch::Merge(serde_json::json!({"metadata": {"finalizers": []}})),
    )
    .await?;
    Ok(())
}

/// Issue 35, item 9: `hcp-olm-catalogs` and `hcp-olm-system` are the HCP namespaces of
/// HostedClusters `hcp-olm/catalogs` and `hcp-olm/system`. HyperShift must not adopt them
/// (its label) or delete them with the HostedCluster: policy `hcp-olm-own-namespaces`
/// refuses both for every user. Without that policy (left out of an installation), HyperShift
/// adopting them (its label and a HostedControlPlane annotated with the HostedCluster, made
/// here as HyperShift makes them) must still not make them HCP namespaces for the
/// controller: both HostedClusters are refused (`ControlPlaneNamespaceReserved`, with an
/// Event naming the namespace), nothing of theirs is written there (no HostedOLM, no
/// finalizer), their deletion prunes nothing there, and the shared catalogs and their user
/// are untouched throughout.
#[tokio::test]
async fn security_our_namespaces_are_never_hcp_namespaces() -> Result<()> {
    let _serial = SERIAL.lock().await;
    let w = World::start().await?;
    let m = w.m();
    w.cluster("clusters", "user", Some("reader"), true).await?;
    let ctx = w.controller().await?;
    pass(&ctx, "before anything").await?;
    reconcile(&ctx, m, "clusters", "user").await?;
    reconcile(&ctx, m, "clusters", "user").await?;
    pass(&ctx, "user reconciled").await?;
    let shared_ns = hcp_olm_controlplane::sharing::SHARED_NAMESPACE;
    ensure!(shared_deployment(m, RH).await?, "no shared {RH}");
    let want = Some(vec!["clusters-user".to_string()]);
    ensure!(admitted(m, RH).await? == want);

    // HostedClusters hcp-olm/catalogs and hcp-olm/system. HyperShift (the administrator's
    // client stands in for it) cannot adopt our namespaces for them (its label), nor
    // delete them with the HostedCluster: policy hcp-olm-own-namespaces. Policies reach the
    // API server's cache a moment after they are made: bounded retries.
    for name in ["catalogs", "system"] {
        w.cluster("hcp-olm", name, None, false).await?;
    }
    let namespaces = Api::<k8s_openapi::api::core::v1::Namespace>::all(m.client());
    let hcp_label = serde_json::json!({"metadata": {"labels": {
        "hypershift.openshift.io/hosted-control-plane": "true"}}});
    for ns in [shared_ns, "hcp-olm-system"] {
        let t0 = std::time::Instant::now();
        let msg = loop {
            match namespaces
                .patch(ns, &PatchParams::default(), &Patch::Merge(&hcp_label))
                .await
            {
                Err(kube::Error::Api(s)) if s.code == 403 => break s.message,
                other => {
                    ensure!(
                        t0.elapsed() < std::time::Duration::from_secs(30),
                        "HyperShift's HCP label on our namespace {ns} still allowed after 30 s: {:?}",
                        other.map(|n| n.metadata.labels)
                    );
                    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
                }
            }
        };
        ensure!(
            msg.contains("never a hosted control plane namespace"),
            "{ns}: {msg}"
        );
        match namespaces.delete(ns, &Default::default()).await {
            Err(kube::Error::Api(s)) if s.code == 403 && s.message.contains("allow-delete") => {}
            other => anyhow::bail!("deleting our namespace {ns}: {:?}", other.map(|_| ())),
        }
    }
    // The controller refuses the HostedCluster by itself too: without the policy (an
    // installation that left it out), HyperShift adopts both namespaces.
    Api::<DynamicObject>::all_with(
        m.client(),
        &kube::api::ApiResource::from_gvk_with_plural(
            &kube::api::GroupVersionKind::gvk(
                "admissionregistration.k8s.io",
                "v1",
                "ValidatingAdmissionPolicyBinding",
            ),
            "validatingadmissionpolicybindings",
        ),
    )
    .delete("hcp-olm-own-namespaces", &Default::default())
    .await?;
    for name in ["catalogs", "system"] {
        let t0 = std::time::Instant::now();
        loop {
            match hcp_namespace_for(m, "hcp-olm", name).await {
                Ok(()) => break,
                Err(e) if t0.elapsed() < std::time::Duration::from_secs(30) => {
                    eprintln!("adopting hcp-olm-{name} (policy binding still cached): {e}");
                    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
                }
                Err(e) => return Err(e),
            }
        }
    }
    for (name, hcp_ns) in [("catalogs", shared_ns), ("system", "hcp-olm-system")] {
        for _ in 0..2 {
            let o = reconcile(&ctx, m, "hcp-olm", name).await?;
            ensure!(
                o.state == State::Invalid("ControlPlaneNamespaceReserved".into())
                    && o.hcp_writes == 0
                    && o.guest_writes == 0,
                "HostedCluster hcp-olm/{name} (HCP namespace {hcp_ns}) was served: {o:?}"
            );
        }
        let holms = Api::<HostedOLM>::namespaced(m.client(), hcp_ns)
            .list(&ListParams::default())
            .await?;
        ensure!(
            holms.items.is_empty(),
            "a HostedOLM in {hcp_ns}: {:?}",
            holms
                .items
                .iter()
                .map(|h| &h.metadata.name)
                .collect::<Vec<_>>()
        );
        let sel = selector_for("hcp-olm", name)
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(",");
        for (ar, _) in hcp_kinds() {
            let api: Api<DynamicObject> = Api::namespaced_with(m.client(), hcp_ns, &ar);
            if let Ok(l) = api.list_metadata(&ListParams::default().labels(&sel)).await {
                ensure!(
                    l.items.is_empty(),
                    "hcp-olm/{name} got {} objects in {hcp_ns}",
                    ar.kind
                );
            }
        }
        let hc = Api::<HostedCluster>::namespaced(m.client(), "hcp-olm")
            .get(name)
            .await?;
        ensure!(
            !hc.metadata
                .finalizers
                .unwrap_or_default()
                .iter()
                .any(|f| f == FINALIZER),
            "our finalizer on hcp-olm/{name}"
        );
        let evs = Api::<k8s_openapi::api::events::v1::Event>::namespaced(m.client(), "hcp-olm")
            .list(&ListParams::default())
            .await?;
        ensure!(
            evs.items.iter().any(
                |e| e.reason.as_deref() == Some("ControlPlaneNamespaceReserved")
                    && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name)
                    && e.note.as_deref().is_some_and(|n| n.contains(hcp_ns))
            ),
            "hcp-olm/{name}: no ControlPlaneNamespaceReserved event naming {hcp_ns}"
        );
    }
    pass(&ctx, "after the reserved clusters").await?;
    ensure!(
        admitted(m, RH).await? == want,
        "admitted: {:?}",
        admitted(m, RH).await?
    );

    // Deleted (held by someone's finalizer, with ours put on by hand as an older controller
    // would have): the cleanup releases ours and prunes nothing in our namespaces.
    let hcs = Api::<DynamicObject>::namespaced_with(m.client(), "hcp-olm", &hc_resource());
    for name in ["catalogs", "system"] {
        hcs.patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"metadata": {"finalizers": [HOLD, FINALIZER]}})),
        )
        .await?;
        hcs.delete(name, &Default::default()).await?;
        let o = reconcile(&ctx, m, "hcp-olm", name).await?;
        ensure!(o.state == State::CleanedUp, "{o:?}");
        let left = hcs.get(name).await?.metadata.finalizers.unwrap_or_default();
        ensure!(left == [HOLD], "finalizers of hcp-olm/{name}: {left:?}");
    }
    pass(&ctx, "after the reserved clusters' cleanup").await?;
    ensure!(shared_deployment(m, RH).await?, "shared {RH} gone");
    ensure!(
        admitted(m, RH).await? == want,
        "admitted: {:?}",
        admitted(m, RH).await?
    );
    let o = reconcile(&ctx, m, "clusters", "user").await?;
    ensure!(o.hcp_writes == 0, "user after the reserved clusters: {o:?}");
    for name in ["catalogs", "system"] {
        hcs.patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"metadata": {"finalizers": []}})),
        )
        .await?;
    }
    Ok(())
}
