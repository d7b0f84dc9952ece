//! The `run` loop: a kube-runtime `Controller` over HostedClusters cluster-wide,
//! also woken by changes to Secrets carrying our labels (mapped back to their
//! HostedCluster), with backoff on errors and bounded concurrency.

use std::sync::Arc;
use std::time::Instant;

use tracing::Instrument;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Secret;
use kube::Api;
use kube::runtime::controller::{Action, Config as ControllerConfig, Controller};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;

use super::reconcile::{State, reconcile_one};
use super::{Context, Error};
use crate::hostedcluster::HostedCluster;
use crate::render::labels;

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
    match reconcile_one(&ctx, &hc).instrument(span).await {
        Ok(o) => {
            ctx.reset_backoff(&key);
            ctx.metrics
                .observe(state_label(&o.state), started.elapsed());
            tracing::debug!(state = ?o.state, hcp = o.hcp_writes, guest = o.guest_writes, status = o.status_written, "reconciled");
            if o.state == State::CleanedUp {
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

/// Map a Secret with our labels to the HostedCluster it belongs to.
fn secret_owner(s: Secret) -> Option<ObjectRef<HostedCluster>> {
    let l = s.metadata.labels.as_ref()?;
    let ns = l.get(labels::CLUSTER_NAMESPACE_KEY)?;
    let name = l.get(labels::CLUSTER_NAME_KEY)?;
    Some(ObjectRef::new(name).within(ns))
}

/// Run until `shutdown` resolves.
pub async fn run(
    ctx: Arc<Context>,
    opts: RunOptions,
    shutdown: impl std::future::Future<Output = ()> + Send + Sync + 'static,
) {
    let client = ctx.client.clone();
    let hcs: Api<HostedCluster> = Api::all(client.clone());
    let secrets: Api<Secret> = Api::all(client);
    let secret_cfg = watcher::Config::default().labels(&format!(
        "{}={}",
        labels::MANAGED_BY_KEY,
        labels::MANAGED_BY
    ));
    ctx.metrics.set_ready(true);
    Controller::new(hcs, watcher::Config::default())
        .with_config(ControllerConfig::default().concurrency(opts.concurrency))
        .watches(secrets, secret_cfg, secret_owner)
        .graceful_shutdown_on(shutdown)
        .run(reconcile, error_policy, ctx.clone())
        .for_each(|r| async move {
            if let Err(e) = r {
                tracing::debug!(error = %e, "controller event");
            }
        })
        .await;
    ctx.metrics.set_ready(false);
}
