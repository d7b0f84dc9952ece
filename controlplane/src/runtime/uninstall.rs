//! `hcp-olm uninstall` (and `hcp-olm-controller uninstall`): what the controller's finalizer
//! would do on deletion, for every HostedCluster at once, so the controller can be removed
//! without leaving HostedClusters whose deletion waits forever on `hcp-olm.io/cleanup`.
//!
//! Order (docs/controller.md, "Uninstall"): stop the controller first (scale its Deployment
//! to 0), then run this, then delete `manifests/` (the CRD last). Each HostedCluster carrying
//! our finalizer gets [`cleanup`]: our objects go from its guest and its HCP namespace, its
//! HostedOLM is deleted and the finalizer removed. HostedOLMs left without a HostedCluster
//! are deleted too, then the shared catalogs.
//!
//! A guest that does not answer (issue 39 item 7): the HostedCluster is left untouched
//! (finalizer and all), so a later run can still remove the guest's objects (an APIService
//! left behind points the guest's API server at nothing), and the run fails naming it; with
//! [`UninstallArgs::force_unreachable_guests`] it is released and the run still fails,
//! naming what stays in the guest. A HostedCluster being deleted is released either way
//! (its guest goes with it). `--dry-run` lists every object it would remove and changes
//! nothing.

use std::io::Write;

use kube::Api;
use kube::api::{DeleteParams, ListParams};

use hcp_olm_apply::Applier;

use super::reconcile::{
    cleanup_with, guest_client, guest_kinds, hcp_kinds, identity, selector_for,
};
use super::{Context, Error, FIELD_MANAGER, FINALIZER};
use crate::hostedcluster::HostedCluster;
use crate::hostedolm::HostedOLM;

/// The flags of `uninstall` (both binaries), besides how to reach the management cluster.
#[derive(clap::Args, Clone, Debug, Default)]
pub struct UninstallArgs {
    /// List what would be removed or released, change nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Release a HostedCluster whose guest API server does not answer anyway (its guest
    /// objects stay and are named; the run still exits non-zero). Default: such a
    /// HostedCluster is left untouched for a later run.
    #[arg(long)]
    pub force_unreachable_guests: bool,
}

/// What one uninstall did (or, dry run, would do).
#[derive(Debug, Default)]
pub struct Report {
    /// `namespace/name` of each HostedCluster released.
    pub released: Vec<String>,
    /// HostedOLMs deleted after their HostedCluster's cleanup did not remove them
    /// (`namespace/name`).
    pub orphans_deleted: Vec<String>,
    /// HostedClusters (or other steps) not done, with why.
    pub failed: Vec<(String, String)>,
    /// Objects of the shared catalogs deleted (`Kind/namespace/name`; the namespace
    /// `hcp-olm-catalogs` itself goes with `kubectl delete namespace`, which the controller's
    /// permissions do not allow).
    pub shared_deleted: Vec<String>,
    /// Released HostedClusters whose guest did not answer: their guest objects stay (reason).
    pub guest_left: Vec<(String, String)>,
    /// Dry run: every removal or release it would make, in order.
    pub would: Vec<String>,
    /// hcp-olm's own namespaces labelled `hcp-olm.io/allow-delete=true` (the last step, only
    /// when everything else was done): the `hcp-olm-own-namespaces` admission policy refuses
    /// their deletion without it.
    pub namespaces_released: Vec<String>,
}

impl Report {
    /// Nothing failed and nothing was left behind.
    pub fn complete(&self) -> bool {
        self.failed.is_empty() && self.guest_left.is_empty()
    }
}

/// Cleans up every HostedCluster that carries our finalizer, then orphaned HostedOLMs, then
/// the shared catalogs. One failure does not stop the others; they are reported. `progress`
/// gets a line per HostedCluster as it is done.
pub async fn uninstall(
    ctx: &Context,
    args: &UninstallArgs,
    progress: &mut dyn FnMut(String),
) -> Result<Report, Error> {
    let mut report = Report::default();
    let hcs: Api<HostedCluster> = Api::all(ctx.client.clone());
    let list = hcs
        .list(&ListParams::default())
        .await
        .map_err(super::kube_err("listing HostedClusters"))?;
    let ours: Vec<&HostedCluster> = list
        .items
        .iter()
        .filter(|hc| {
            hc.metadata
                .finalizers
                .as_ref()
                .is_some_and(|f| f.iter().any(|f| f == FINALIZER))
        })
        .collect();
    let total = ours.len();
    // HostedClusters left in place (skipped or failed): their HostedOLMs are not orphans.
    let mut kept: std::collections::BTreeSet<String> = std::collections::BTreeSet::new();
    for (i, hc) in ours.into_iter().enumerate() {
        let (ns, name, hcp_ns) = identity(hc)?;
        let key = format!("{ns}/{name}");
        let at = format!("[{}/{total}] HostedCluster {key}", i + 1);
        let deleting = hc.metadata.deletion_timestamp.is_some();
        let mut guest = guest_client(ctx, hc, false).await?;
        // A client is made without dialling: ask the guest's API server once.
        if let Ok(session) = &guest
            && session
                .client
                .apiserver_version()
                .await
                .is_err_and(|e| !matches!(e, kube::Error::Api(_)))
        {
            guest = Err(super::reconcile::GuestAccess::Unreachable(
                "the guest API server does not answer".to_string(),
            ));
        }
        if args.dry_run {
            let selector = selector_for(&ns, &name);
            let mgmt = match dry(ctx.client.clone(), &hcp_kinds(), Some(&hcp_ns), &selector).await {
                Ok(ids) => ids,
                Err(e) => {
                    report.failed.push((key.clone(), e));
                    Vec::new()
                }
            };
            let guest_objects = match &guest {
                Ok(session) => dry(session.client.clone(), &guest_kinds(), None, &selector)
                    .await
                    .map_err(|e| format!("guest unreachable: {e}")),
                Err(access) => Err(format!("guest unreachable ({})", access.reason())),
            };
            for id in &mgmt {
                report.would.push(format!("delete {id} (management)"));
            }
            match &guest_objects {
                Ok(ids) => {
                    for id in ids {
                        report.would.push(format!("delete {id} (guest of {key})"));
                    }
                }
                Err(why) => report
                    .failed
                    .push((key.clone(), format!("{why}: its objects cannot be listed"))),
            }
            report
                .would
                .push(format!("delete HostedOLM {hcp_ns}/{name}"));
            report.would.push(format!(
                "remove finalizer {FINALIZER} from HostedCluster {key}"
            ));
            progress(format!(
                "{at}: would remove {} management objects, {}",
                mgmt.len(),
                match &guest_objects {
                    Ok(ids) => format!("{} guest objects", ids.len()),
                    Err(_) => "guest objects unknown (see below)".to_string(),
                }
            ));
            continue;
        }
        if let Err(access) = &guest
            && !deleting
            && !args.force_unreachable_guests
        {
            let why = format!(
                "guest unreachable ({}): left untouched so a later run can remove its guest objects; rerun once the guest answers, or pass --force-unreachable-guests to release it anyway",
                access.reason()
            );
            progress(format!("{at}: skipped, {why}"));
            kept.insert(key.clone());
            report.failed.push((key, why));
            continue;
        }
        match cleanup_with(ctx, hc, deleting || args.force_unreachable_guests).await {
            Ok(out) => {
                progress(format!(
                    "{at}: released ({} management, {} guest objects removed){}",
                    out.hcp_writes,
                    out.guest_writes,
                    match out.guest_left {
                        Some(r) => format!("; guest unreachable ({r}), its objects left"),
                        None => String::new(),
                    }
                ));
                if let Some(r) = out.guest_left
                    && !deleting
                {
                    report.guest_left.push((key.clone(), r.to_string()));
                }
                report.released.push(key);
            }
            Err(e) => {
                progress(format!("{at}: failed: {e}"));
                kept.insert(key.clone());
                report.failed.push((key, e.to_string()));
            }
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
        if h.spec
            .hosted_cluster
            .as_ref()
            .is_some_and(|o| kept.contains(&format!("{}/{}", o.namespace, o.name)))
        {
            continue;
        }
        if args.dry_run {
            if let Some(owner) = &h.spec.hosted_cluster {
                let sel = selector_for(&owner.namespace, &owner.name);
                match dry(ctx.client.clone(), &hcp_kinds(), Some(&ns), &sel).await {
                    Ok(ids) => {
                        for id in ids {
                            let line = format!("delete {id} (management)");
                            if !report.would.contains(&line) {
                                report.would.push(line);
                            }
                        }
                    }
                    Err(e) => report.failed.push((format!("HostedOLM {key}"), e)),
                }
            }
            let line = format!("delete HostedOLM {key}");
            if !report.would.contains(&line) {
                report.would.push(line);
            }
            continue;
        }
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
            Ok(_) => {
                progress(format!(
                    "HostedOLM {key}: deleted (no HostedCluster holds it)"
                ));
                report.orphans_deleted.push(key);
            }
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(e) => report
                .failed
                .push((format!("HostedOLM {key}"), e.to_string())),
        }
    }
    // The shared catalogs (issue 18): no hosted cluster uses them any more.
    let r = super::shared::remove_all(ctx, args.dry_run).await;
    if args.dry_run {
        report.would.extend(
            r.deleted
                .iter()
                .map(|id| format!("delete {id} (shared catalogs)")),
        );
    } else {
        if !r.deleted.is_empty() {
            progress(format!(
                "shared catalogs: {} objects removed",
                r.deleted.len()
            ));
        }
        report.shared_deleted = r.deleted;
    }
    report.failed.extend(
        r.errors
            .iter()
            .map(|e| ("shared catalogs".to_string(), e.to_string())),
    );
    // Last, and only when nothing is left: hcp-olm's own namespaces may now be deleted
    // (`kubectl delete -k manifests/`, `kubectl delete namespace`); the admission policy
    // refuses that without the label. An incomplete run keeps them protected.
    if report.complete() {
        release_namespaces(ctx, args.dry_run, &mut report).await;
    }
    Ok(report)
}

/// The label that lets an administrator delete one of hcp-olm's own namespaces
/// (manifests/controller/admission-policy.yaml, policy 4).
pub const ALLOW_DELETE_LABEL: &str = "hcp-olm.io/allow-delete";

async fn release_namespaces(ctx: &Context, dry_run: bool, report: &mut Report) {
    use k8s_openapi::api::core::v1::Namespace;
    let api: Api<Namespace> = Api::all(ctx.client.clone());
    for ns in [
        crate::sharing::CONTROLLER_NAMESPACE,
        crate::sharing::SHARED_NAMESPACE,
    ] {
        match api.get_opt(ns).await {
            Ok(None) => continue,
            Ok(Some(_)) if dry_run => {
                report
                    .would
                    .push(format!("label namespace {ns} {ALLOW_DELETE_LABEL}=true"));
            }
            Ok(Some(_)) => {
                let patch =
                    serde_json::json!({"metadata": {"labels": {ALLOW_DELETE_LABEL: "true"}}});
                match api
                    .patch(
                        ns,
                        &kube::api::PatchParams::default(),
                        &kube::api::Patch::Merge(&patch),
                    )
                    .await
                {
                    Ok(_) => report.namespaces_released.push(ns.to_string()),
                    Err(e) => report.failed.push((
                        format!("namespace {ns}"),
                        format!("labelling it {ALLOW_DELETE_LABEL}=true: {e}"),
                    )),
                }
            }
            Err(e) => report
                .failed
                .push((format!("namespace {ns}"), format!("reading it: {e}"))),
        }
    }
}

/// What a prune of `kinds` by `selector` would delete, or the first list that failed.
async fn dry(
    client: kube::Client,
    kinds: &[(kube::api::ApiResource, bool)],
    namespace: Option<&str>,
    selector: &std::collections::BTreeMap<String, String>,
) -> Result<Vec<String>, String> {
    let r = Applier::new(client, FIELD_MANAGER)
        .dry_run(true)
        .prune(kinds, namespace, selector, &[])
        .await;
    match r.errors.first() {
        Some(e) => Err(e.to_string()),
        None => Ok(r.deleted),
    }
}

/// Prints a report: what was done (or would be) on `out`, what was not on `err`. Returns
/// whether the uninstall is complete (the exit status).
pub fn print(
    report: &Report,
    args: &UninstallArgs,
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> bool {
    // Output errors (a closed pipe) change nothing of what was done: the status says it.
    if args.dry_run {
        for w in &report.would {
            let _ = writeln!(out, "would {w}");
        }
    }
    for c in &report.released {
        let _ = writeln!(out, "released HostedCluster {c}");
    }
    for h in &report.orphans_deleted {
        let _ = writeln!(out, "deleted HostedOLM {h}");
    }
    for o in &report.shared_deleted {
        let _ = writeln!(out, "deleted shared catalog object {o}");
    }
    for (c, reason) in &report.guest_left {
        let (ns, name) = c.split_once('/').unwrap_or((c.as_str(), ""));
        let selector = selector_for(ns, name)
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(",");
        let kinds = guest_kinds()
            .iter()
            .map(|(r, _)| match r.group.as_str() {
                "" => r.plural.clone(),
                g => format!("{}.{g}", r.plural),
            })
            .collect::<Vec<_>>()
            .join(",");
        let _ = writeln!(
            err,
            "left: the guest objects of {c} (its API server did not answer: {reason}), among them the APIService v1.packages.operators.coreos.com, which now points at nothing; remove them in the guest with: kubectl delete {kinds} -A -l {selector}"
        );
    }
    for (what, e) in &report.failed {
        let _ = writeln!(err, "error: {what}: {e}");
    }
    let complete = report.complete();
    if args.dry_run {
        let _ = writeln!(
            out,
            "uninstall (dry run): {} changes listed, nothing changed{}",
            report.would.len(),
            if complete {
                String::new()
            } else {
                format!("; {} problems above", report.failed.len())
            }
        );
    } else if complete {
        for ns in &report.namespaces_released {
            let _ = writeln!(out, "labelled namespace {ns} {ALLOW_DELETE_LABEL}=true");
        }
        let _ = writeln!(
            out,
            "uninstall: {} HostedClusters released; now remove the install (helm uninstall hcp-olm -n hcp-olm-system, or kubectl delete -k manifests/), the HostedOLM CRD and the namespaces{}",
            report.released.len(),
            if report.namespaces_released.is_empty() {
                String::new()
            } else {
                format!(
                    " {} (labelled for deletion)",
                    report.namespaces_released.join(", ")
                )
            }
        );
    } else {
        let _ = writeln!(
            err,
            "uninstall incomplete: {} not done (fix the cause and run uninstall again), {} guests left with our objects (remove them as shown above)",
            report.failed.len(),
            report.guest_left.len()
        );
    }
    complete
}
