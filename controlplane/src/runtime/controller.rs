//! The `run` loop: a kube-runtime `Controller` over HostedClusters cluster-wide, also
//! woken by the management caches' watches once their stores hold a change (see
//! `Context::start_mgmt_cache`): our objects, HCP namespaces, HostedOLMs, HyperShift's OLM
//! Deployments, and the Secrets a reconcile reads (the guest admin kubeconfig named by
//! `status.kubeconfig`, the pull secret, the HCP namespace's
//! `service-network-admin-kubeconfig` and `pull-secret`, and Secrets carrying our labels),
//! mapped back to their HostedCluster through the controller's HostedCluster store (no
//! labels needed on HyperShift's Secrets). Backoff on errors, bounded concurrency.

use std::sync::Arc;
use std::time::Instant;

use tracing::Instrument;

use futures::StreamExt;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Api;
use kube::runtime::controller::{Action, Config as ControllerConfig, Controller};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::{WatchStreamExt, watcher};

use super::reconcile::{State, reconcile_one};
use super::{Context, Error};
use crate::hostedcluster::HostedCluster;
use crate::render::labels;
use crate::validate::ControllerDefaults;

/// Settings of the loop.
#[derive(Clone, Debug)]
pub struct RunOptions {
    /// Reconciles running at once.
    pub concurrency: u16,
}

impl Default for RunOptions {
    fn default() -> Self {
        Self { concurrency: 4 }
    }
}

fn state_label(s: &State) -> &'static str {
    match s {
        State::Applied => "applied",
        State::Waiting(_) => "waiting",
        State::Invalid(_) => "invalid",
        State::Paused => "paused",
        State::CleanedUp => "cleaned_up",
        State::OutOfScope => "out_of_scope",
    }
}

async fn reconcile(hc: Arc<HostedCluster>, ctx: Arc<Context>) -> Result<Action, Error> {
    let started = Instant::now();
    let span = tracing::info_span!(
        "reconcile",
        cluster = %format!(
            "{}/{}",
            hc.metadata.namespace.as_deref().unwrap_or(""),
            hc.metadata.name.as_deref().unwrap_or("")
        )
    );
    let key = cluster_key(&hc);
    ctx.metrics.reconcile_started();
    let result = reconcile_one(&ctx, &hc).instrument(span).await;
    ctx.metrics.reconcile_finished();
    match result {
        Ok(o) => {
            ctx.reset_backoff(&key);
            ctx.metrics
                .observe(state_label(&o.state), started.elapsed());
            ctx.metrics
                .writes(o.hcp_writes, o.guest_writes, o.status_written);
            tracing::debug!(state = ?o.state, hcp = o.hcp_writes, guest = o.guest_writes, status = o.status_written, "reconciled");
            if matches!(o.state, State::CleanedUp | State::OutOfScope) {
                Ok(Action::await_change())
            } else {
                Ok(Action::requeue(o.requeue))
            }
        }
        Err(e) => {
            ctx.metrics.error(e.reason(), started.elapsed());
            Err(e)
        }
    }
}

fn error_policy(hc: Arc<HostedCluster>, err: &Error, ctx: Arc<Context>) -> Action {
    tracing::warn!(
        cluster = %format!(
            "{}/{}",
            hc.metadata.namespace.as_deref().unwrap_or(""),
            hc.metadata.name.as_deref().unwrap_or("")
        ),
        error = %err,
        "reconcile failed"
    );
    Action::requeue(ctx.next_backoff(&cluster_key(&hc)))
}

fn cluster_key(hc: &HostedCluster) -> String {
    format!(
        "{}/{}",
        hc.metadata.namespace.as_deref().unwrap_or(""),
        hc.metadata.name.as_deref().unwrap_or("")
    )
}

/// The HostedClusters whose computed HCP namespace (`<namespace>-<name>`) is the
/// Namespace `meta` names. HyperShift creates (and labels) the HCP namespace after the
/// HostedCluster, so the first reconcile usually finds it missing or not yet labelled;
/// this wakes the HostedCluster as soon as it is there. `<namespace>-<name>` is
/// ambiguous, so several may match: each reconcile checks ownership itself. Pure; `hcs`
/// is the controller's store.
pub fn namespace_triggers<'a>(
    meta: &ObjectMeta,
    hcs: impl IntoIterator<Item = &'a HostedCluster>,
) -> Vec<ObjectRef<HostedCluster>> {
    let Some(ns_name) = meta.name.as_deref() else {
        return Vec::new();
    };
    hcs.into_iter()
        .filter_map(|hc| {
            let (ns, name) = (
                hc.metadata.namespace.as_deref()?,
                hc.metadata.name.as_deref()?,
            );
            (ns.len() + 1 + name.len() == ns_name.len()
                && ns_name.starts_with(ns)
                && ns_name[ns.len()..].starts_with('-')
                && ns_name.ends_with(name))
            .then(|| ObjectRef::new(name).within(ns))
        })
        .collect()
}

/// The HostedCluster named by an object's cluster labels, for any object we labelled.
pub fn labelled_owner(meta: &ObjectMeta) -> Option<ObjectRef<HostedCluster>> {
    let l = meta.labels.as_ref()?;
    if l.get(labels::MANAGED_BY_KEY).map(String::as_str) != Some(labels::MANAGED_BY) {
        return None;
    }
    Some(
        ObjectRef::new(l.get(labels::CLUSTER_NAME_KEY)?)
            .within(l.get(labels::CLUSTER_NAMESPACE_KEY)?),
    )
}

/// The HostedClusters a change of the Secret with `meta` must reconcile: the one
/// named by our labels, and every HostedCluster that reads it (`status.kubeconfig`
/// or `spec.pullSecret` in its namespace; the kubeconfig and pull Secrets of
/// `defaults` in its HCP namespace). Pure; `hcs` is the controller's store.
pub fn secret_triggers<'a>(
    meta: &ObjectMeta,
    hcs: impl IntoIterator<Item = &'a HostedCluster>,
    defaults: &ControllerDefaults,
) -> Vec<ObjectRef<HostedCluster>> {
    let (Some(sns), Some(sname)) = (meta.namespace.as_deref(), meta.name.as_deref()) else {
        return Vec::new();
    };
    let mut out: Vec<ObjectRef<HostedCluster>> = Vec::new();
    if let Some(l) = meta.labels.as_ref()
        && l.get(labels::MANAGED_BY_KEY).map(String::as_str) == Some(labels::MANAGED_BY)
        && let (Some(ns), Some(name)) = (
            l.get(labels::CLUSTER_NAMESPACE_KEY),
            l.get(labels::CLUSTER_NAME_KEY),
        )
    {
        out.push(ObjectRef::new(name).within(ns));
    }
    for hc in hcs {
        let (Some(ns), Some(name)) = (
            hc.metadata.namespace.as_deref(),
            hc.metadata.name.as_deref(),
        ) else {
            continue;
        };
        let reads = if sns == ns {
            hc.admin_kubeconfig_secret()
                .is_some_and(|(_, n)| n == sname)
                || hc
                    .spec
                    .pull_secret
                    .as_ref()
                    .is_some_and(|p| !p.name.is_empty() && p.name == sname)
        } else {
            hc.hcp_namespace().as_deref() == Some(sns)
                && (sname == defaults.kubeconfig_secret || sname == defaults.pull_secret)
        };
        if reads {
            let r = ObjectRef::new(name).within(ns);
            if !out.contains(&r) {
                out.push(r);
            }
        }
    }
    out
}

/// Run until `shutdown` resolves (ready while running).
pub async fn run(
    ctx: Arc<Context>,
    opts: RunOptions,
    shutdown: impl std::future::Future<Output = ()> + Send + Sync + 'static,
) {
    ctx.metrics.set_ready(true);
    run_controller(ctx.clone(), opts, shutdown).await;
    ctx.metrics.set_ready(false);
}

/// The controller loop itself, leaving readiness to the caller (leader election
/// keeps a standby replica ready).
pub(crate) async fn run_controller(
    ctx: Arc<Context>,
    opts: RunOptions,
    shutdown: impl std::future::Future<Output = ()> + Send + Sync + 'static,
) {
    let client = ctx.client.clone();
    let hcs: Api<HostedCluster> = Api::all(client);
    // Our own reflector, so readiness can follow its first complete list (InitDone):
    // Store::wait_until_ready wakes only the last of several waiters, and the Controller
    // itself waits on it.
    let (reader, writer) = kube::runtime::reflector::store::<HostedCluster>();
    // Converged passes read watched metadata and status instead of the API server. The
    // same watches wake the HostedCluster an object belongs to, *after* their store holds
    // the change, so the pass they start reads it: our objects of every kind (drift is
    // repaired at once, status follows our Deployments' pods, a gateway Service's node
    // port or ingress reaches the guest), HCP namespaces that appear or gain HyperShift's
    // label after their HostedCluster, and HyperShift's own OLM Deployments.
    let (wake_tx, wake_rx) = tokio::sync::mpsc::unbounded_channel::<ObjectRef<HostedCluster>>();
    // A registry lookup that outlived its pass's wait (facts::LOOKUP_WAIT) wakes the
    // HostedClusters that waited for it when it ends, so they do not hold a slot meanwhile.
    let lookup_wake = wake_tx.clone();
    ctx.lookups.set_waker(Arc::new(move |ns: &str, name: &str| {
        let _ = lookup_wake.send(ObjectRef::new(name).within(ns));
    }));
    let hc_index = reader.clone();
    let defaults = ctx.config.defaults.clone();
    let wake: super::stores::Wake = Arc::new(move |changed| {
        let refs: Vec<ObjectRef<HostedCluster>> = match changed {
            super::stores::Changed::Labelled(meta) => labelled_owner(meta).into_iter().collect(),
            // The Secrets a reconcile reads (HyperShift's, by name) and ours (by label).
            super::stores::Changed::Secret(meta) => {
                let hcs = hc_index.state();
                secret_triggers(meta, hcs.iter().map(|h| h.as_ref()), &defaults)
            }
            super::stores::Changed::HcpNamespace(ns) => {
                let meta = ObjectMeta {
                    name: Some(ns.to_string()),
                    ..Default::default()
                };
                let hcs = hc_index.state();
                namespace_triggers(&meta, hcs.iter().map(|h| h.as_ref()))
            }
        };
        for r in refs {
            // The receiver lives as long as the controller; a send after it stopped
            // has nothing left to wake.
            let _ = wake_tx.send(r);
        }
    });
    // A stop asked for while the caches take their first lists (up to 30 s) ends the loop
    // at once: nothing has been reconciled yet.
    let shutdown = futures::FutureExt::shared(shutdown);
    tokio::select! {
        () = ctx.start_mgmt_cache(std::time::Duration::from_secs(30), Some(wake)) => {}
        () = shutdown.clone() => {
            ctx.stop_mgmt_cache();
            return;
        }
    }
    // The shared catalogs (issue 18), beside the controller and stopped with it.
    let shared_pass = tokio::spawn(super::shared::run(ctx.clone(), shutdown.clone()));
    let synced_metrics = ctx.metrics.clone();
    let hc_stream = watcher(hcs, watcher::Config::default())
        .default_backoff()
        // Nothing reads a HostedCluster's managedFields, and they are most of its size in
        // memory (a fieldsV1 tree per writer: HyperShift's status updates, ours, users').
        .modify(|hc: &mut HostedCluster| hc.metadata.managed_fields = None)
        .reflect(writer)
        .inspect(move |ev| {
            if matches!(ev, Ok(watcher::Event::InitDone)) && !synced_metrics.synced() {
                synced_metrics.set_synced(true);
                tracing::info!("HostedCluster cache synced");
            }
        })
        .applied_objects();
    let controller = Controller::for_stream(hc_stream, reader)
        .with_config(ControllerConfig::default().concurrency(opts.concurrency))
        .reconcile_on(tokio_stream::wrappers::UnboundedReceiverStream::new(
            wake_rx,
        ))
        .graceful_shutdown_on(shutdown.clone())
        .run(reconcile, error_policy, ctx.clone())
        .for_each(|r| async move {
            if let Err(e) = r {
                tracing::debug!(error = %e, "controller event");
            }
        });
    let mut controller = std::pin::pin!(controller);
    tokio::select! {
        () = &mut controller => {}
        () = shutdown => {
            // kube's runner starts no reconcile before the HostedCluster store has listed
            // once, and a graceful shutdown cuts the stream that would list it: stopped before
            // that, it would wait for ever. Then nothing has run and nothing needs draining;
            // after it, running reconciles finish first.
            if ctx.metrics.synced() {
                controller.await;
            }
        }
    }
    // Already told to stop by `shutdown`; a pass in flight finishes or is cut here.
    shared_pass.abort();
    let _ = shared_pass.await;
    ctx.stop_mgmt_cache();
    ctx.metrics.set_synced(false);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hostedcluster::{HostedClusterStatus, LocalObjectReference};

    fn hc(ns: &str, name: &str, kubeconfig: Option<&str>, pull: Option<&str>) -> HostedCluster {
        let mut h = HostedCluster::new(name, Default::default());
        h.metadata.namespace = Some(ns.into());
        h.spec.pull_secret = pull.map(|p| LocalObjectReference { name: p.into() });
        h.status = kubeconfig.map(|k| HostedClusterStatus {
            kubeconfig: Some(LocalObjectReference { name: k.into() }),
            ..Default::default()
        });
        h
    }

    fn meta(ns: &str, name: &str) -> ObjectMeta {
        ObjectMeta {
            namespace: Some(ns.into()),
            name: Some(name.into()),
            ..Default::default()
        }
    }

    fn names(v: Vec<ObjectRef<HostedCluster>>) -> Vec<String> {
        v.into_iter()
            .map(|r| format!("{}/{}", r.namespace.unwrap_or_default(), r.name))
            .collect()
    }

    #[test]
    fn hcp_namespaces_map_to_every_hosted_cluster_computing_them() {
        let hcs = [
            hc("team-a", "b", None, None),
            hc("team", "a-b", None, None),
            hc("clusters", "x", None, None),
        ];
        let ns = |n: &str| ObjectMeta {
            name: Some(n.into()),
            ..Default::default()
        };
        // ambiguous on purpose: both candidates are woken, each checks ownership itself
        assert_eq!(
            names(namespace_triggers(&ns("team-a-b"), hcs.iter())),
            ["team-a/b", "team/a-b"]
        );
        assert_eq!(
            names(namespace_triggers(&ns("clusters-x"), hcs.iter())),
            ["clusters/x"]
        );
        for other in ["clusters-xy", "clusters", "clustersx", "xclusters-x", "x"] {
            assert!(
                namespace_triggers(&ns(other), hcs.iter()).is_empty(),
                "{other}"
            );
        }
        assert!(namespace_triggers(&ObjectMeta::default(), hcs.iter()).is_empty());
    }

    #[test]
    fn secrets_map_to_the_hosted_clusters_reading_them() {
        let d = ControllerDefaults::default();
        let hcs = [
            hc("clusters", "a", Some("a-admin-kubeconfig"), Some("a-pull")),
            hc(
                "clusters",
                "b",
                Some("b-admin-kubeconfig"),
                Some("shared-pull"),
            ),
            hc("clusters", "c", None, Some("shared-pull")),
            // `clusters-a` is also the namespace of "a"'s HCP: names must not be
            // confused with the HCP namespace of a HostedCluster in another namespace.
            hc("clusters-a", "x", Some("x-kc"), None),
        ];
        let m = |ns, n| names(secret_triggers(&meta(ns, n), hcs.iter(), &d));
        assert_eq!(m("clusters", "a-admin-kubeconfig"), ["clusters/a"]);
        assert_eq!(m("clusters", "shared-pull"), ["clusters/b", "clusters/c"]);
        assert_eq!(
            m("clusters-a", "service-network-admin-kubeconfig"),
            ["clusters/a"]
        );
        assert_eq!(m("clusters-a", "pull-secret"), ["clusters/a"]);
        assert_eq!(m("clusters-a", "x-kc"), ["clusters-a/x"]);
        assert!(m("clusters-a", "unrelated").is_empty());
        assert!(m("other", "a-admin-kubeconfig").is_empty());
        // Our own Secrets map through their labels, even without a store entry.
        let mut ours = meta("clusters-z", "hcp-olm-ca");
        ours.labels = Some(crate::runtime::reconcile::selector_for("clusters", "z"));
        assert_eq!(
            names(secret_triggers(&ours, hcs.iter(), &d)),
            ["clusters/z"]
        );
    }
}
