//! `hcp-olm-controller uninstall`: what the controller's finalizer would do on deletion,
//! for every HostedCluster at once, so the controller can be removed without leaving
//! HostedClusters whose deletion waits forever on `hcp-olm.io/cleanup`.
//!
//! Order (docs/controller.md, "Uninstall"): stop the controller first (scale its Deployment
//! to 0), then run this, then delete `manifests/` (the CRD last). Each HostedCluster carrying
//! our finalizer gets [`cleanup`]: our objects go from its guest (when the guest answers)
//! and its HCP namespace, its HostedOLM is deleted and the finalizer removed. HostedOLMs
//! left without a HostedCluster are deleted too.

use kube::Api;
use kube::api::{DeleteParams, ListParams};

use hcp_olm_apply::Applier;

use super::reconcile::{cleanup, hcp_kinds, selector_for};
use super::{Context, Error, FIELD_MANAGER, FINALIZER};
use crate::hostedcluster::HostedCluster;
use crate::hostedolm::HostedOLM;

/// What one uninstall did.
#[derive(Debug, Default)]
pub struct Report {
    /// `namespace/name` of each HostedCluster released.
    pub released: Vec<String>,
    /// HostedOLMs deleted after their HostedCluster's cleanup did not remove them
    /// (`namespace/name`).
    pub orphans_deleted: Vec<String>,
    /// HostedClusters that could not be cleaned up, with the error.
    pub failed: Vec<(String, String)>,
    /// Objects of the shared catalogs deleted (`Kind/namespace/name`; the namespace
    /// `hcp-olm-catalogs` itself goes with `kubectl delete namespace`, which the controller's
    /// permissions do not allow).
    pub shared_deleted: Vec<String>,
}

/// Cleans up every HostedCluster that carries our finalizer, then orphaned HostedOLMs.
/// One failure does not stop the others; they are reported.
pub async fn uninstall(ctx: &Context) -> Result<Report, Error> {
    let mut report = Report::default();
    let hcs: Api<HostedCluster> = Api::all(ctx.client.clone());
    let list = hcs
        .list(&ListParams::default())
        .await
        .map_err(super::kube_err("listing HostedClusters"))?;
    for hc in &list.items {
        let key = format!(
            "{}/{}",
            hc.metadata.namespace.as_deref().unwrap_or(""),
            hc.metadata.name.as_deref().unwrap_or("")
        );
        let ours = hc
            .metadata
            .finalizers
            .as_ref()
            .is_some_and(|f| f.iter().any(|f| f == FINALIZER));
        if !ours {
            continue;
        }
        match cleanup(ctx, hc).await {
            Ok(_) => report.released.push(key),
            Err(e) => report.failed.push((key, e.to_string())),
        }
    }
    // HostedOLMs still there: their HostedCluster is gone or lost our finalizer by hand.
    // Their HCP-namespace objects are pruned by our labels, then they are deleted.
    let holms: Api<HostedOLM> = Api::all(ctx.client.clone());
    let left = holms
        .list(&ListParams::default())
        .await
        .map_err(super::kube_err("listing HostedOLMs"))?;
    for h in left.items {
        let (Some(ns), Some(name)) = (h.metadata.namespace.clone(), h.metadata.name.clone()) else {
            continue;
        };
        let key = format!("{ns}/{name}");
        if let Some(owner) = &h.spec.hosted_cluster {
            let r = Applier::new(ctx.client.clone(), FIELD_MANAGER)
                .prune(
                    &hcp_kinds(),
                    Some(&ns),
                    &selector_for(&owner.namespace, &owner.name),
                    &[],
                )
                .await;
            if let Some(e) = r.errors.first() {
                report
                    .failed
                    .push((format!("HostedOLM {key}"), e.to_string()));
                continue;
            }
        }
        match Api::<HostedOLM>::namespaced(ctx.client.clone(), &ns)
            .delete(&name, &DeleteParams::default())
            .await
        {
            Ok(_) => report.orphans_deleted.push(key),
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(e) => report
                .failed
                .push((format!("HostedOLM {key}"), e.to_string())),
        }
    }
    // The shared catalogs (issue 18): no hosted cluster uses them any more.
    let r = super::shared::remove_all(ctx).await;
    report.shared_deleted = r.deleted;
    report.failed.extend(
        r.errors
            .iter()
            .map(|e| ("shared catalogs".to_string(), e.to_string())),
    );
    Ok(report)
}
