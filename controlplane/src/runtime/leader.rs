//! Leader election with a `coordination.k8s.io/v1` Lease, so that only one replica of
//! the controller reconciles.
//!
//! - [`decide`] is the pure rule: given what we observed of the Lease and when,
//!   create it, take it over, renew it, or follow its holder;
//! - [`elect`] drives it with tokio: poll every `retry_period`, publish whether we
//!   lead, step down when renewals fail for `renew_deadline`, release on stop;
//! - [`run_with_leader_election`] runs the controller loop only while leading.
//!
//! Expiry is judged by the local monotonic clock from when the Lease record was
//! last seen to change (its resourceVersion), never by comparing `renewTime` with
//! our wall clock, so clock skew between replicas does not matter.

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::FutureExt;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::Api;
use kube::api::{ObjectMeta, PostParams};
use tokio::sync::watch;

use super::Context;
use super::controller::{self, RunOptions};

/// Settings of leader election (flags of `run`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaderConfig {
    /// Namespace of the Lease (the controller's own).
    pub namespace: String,
    /// Name of the Lease.
    pub name: String,
    /// This replica's identity (holderIdentity); unique per process.
    pub identity: String,
    /// How long a Lease is honoured after its last observed change.
    pub lease_duration: Duration,
    /// A leader that could not renew for this long stops reconciling.
    pub renew_deadline: Duration,
    /// Interval between attempts to acquire or renew.
    pub retry_period: Duration,
}

impl LeaderConfig {
    /// Defaults of controller-runtime: 15 s / 10 s / 2 s.
    pub fn new(namespace: &str, name: &str, identity: &str) -> Self {
        Self {
            namespace: namespace.into(),
            name: name.into(),
            identity: identity.into(),
            lease_duration: Duration::from_secs(15),
            renew_deadline: Duration::from_secs(10),
            retry_period: Duration::from_secs(2),
        }
    }

    /// `retry_period < renew_deadline < lease_duration`, identity and names set.
    pub fn check(&self) -> Result<(), String> {
        if self.namespace.is_empty() || self.name.is_empty() {
            return Err("lease namespace and name must be set".into());
        }
        if self.identity.is_empty() {
            return Err("identity must be set".into());
        }
        if self.retry_period.is_zero() {
            return Err("retry period must be positive".into());
        }
        if self.renew_deadline <= self.retry_period {
            return Err(format!(
                "renew deadline ({:?}) must be longer than the retry period ({:?})",
                self.renew_deadline, self.retry_period
            ));
        }
        if self.lease_duration <= self.renew_deadline {
            return Err(format!(
                "lease duration ({:?}) must be longer than the renew deadline ({:?})",
                self.lease_duration, self.renew_deadline
            ));
        }
        Ok(())
    }
}

/// A default identity: the host (pod) name plus random bits, so a restarted process
/// never mistakes its predecessor's Lease for its own.
pub fn default_identity() -> String {
    let host = std::env::var("POD_NAME")
        .or_else(|_| std::env::var("HOSTNAME"))
        .ok()
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "hcp-olm-controller".into());
    let mut b = [0u8; 6];
    if getrandom::fill(&mut b).is_err() {
        b = (std::process::id() as u64).to_le_bytes()[..6]
            .try_into()
            .unwrap_or_default();
    }
    let suffix: String = b.iter().map(|x| format!("{x:02x}")).collect();
    format!("{host}_{suffix}")
}

/// What we know of the Lease between polls.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Observation {
    /// `holderIdentity`; None or empty when released.
    pub holder: Option<String>,
    /// The holder's `leaseDurationSeconds`.
    pub lease_duration: Duration,
    /// `resourceVersion` of the record.
    pub version: String,
    /// Local time at which this version was first seen.
    pub seen_at: Instant,
}

impl Observation {
    /// Update from a freshly read Lease: `seen_at` moves only when the record changed.
    pub fn observe(
        prev: Option<&Observation>,
        lease: &Lease,
        now: Instant,
        default_duration: Duration,
    ) -> Observation {
        let spec = lease.spec.clone().unwrap_or_default();
        let version = lease.metadata.resource_version.clone().unwrap_or_default();
        let seen_at = match prev {
            Some(p) if p.version == version => p.seen_at,
            _ => now,
        };
        Observation {
            holder: spec.holder_identity.filter(|h| !h.is_empty()),
            lease_duration: spec
                .lease_duration_seconds
                .and_then(|s| u64::try_from(s).ok())
                .map_or(default_duration, Duration::from_secs),
            version,
            seen_at,
        }
    }
}

/// What to do with the Lease.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    /// It does not exist: create it, held by us.
    Create,
    /// Released or expired: take it over (`leaseTransitions` + 1).
    Acquire,
    /// We hold it: renew.
    Renew,
    /// Someone else holds a live Lease.
    Follow {
        holder: String,
        expires_in: Duration,
    },
}

/// The election rule. Pure.
pub fn decide(me: &str, lease: Option<&Observation>, now: Instant) -> Decision {
    let Some(o) = lease else {
        return Decision::Create;
    };
    match o.holder.as_deref() {
        None => Decision::Acquire,
        Some(h) if h == me => Decision::Renew,
        Some(h) => {
            let expires = o.seen_at + o.lease_duration;
            if now >= expires {
                Decision::Acquire
            } else {
                Decision::Follow {
                    holder: h.to_string(),
                    expires_in: expires - now,
                }
            }
        }
    }
}

/// How long a leader may still act without a successful renewal (zero: step down).
/// Pure.
pub fn renew_time_left(
    last_renew: Option<Instant>,
    now: Instant,
    renew_deadline: Duration,
) -> Duration {
    match last_renew {
        Some(t) => renew_deadline.saturating_sub(now.saturating_duration_since(t)),
        None => Duration::ZERO,
    }
}

fn micro_now() -> MicroTime {
    MicroTime(k8s_openapi::jiff::Timestamp::now())
}

fn secs(d: Duration) -> i32 {
    i32::try_from(d.as_secs().max(1)).unwrap_or(i32::MAX)
}

/// One poll: read the Lease, decide, write. Returns whether we lead afterwards.
async fn step(
    api: &Api<Lease>,
    cfg: &LeaderConfig,
    obs: &mut Option<Observation>,
) -> Result<bool, kube::Error> {
    let now = Instant::now();
    let lease = api.get_opt(&cfg.name).await?;
    *obs = lease
        .as_ref()
        .map(|l| Observation::observe(obs.as_ref(), l, now, cfg.lease_duration));
    let decision = decide(&cfg.identity, obs.as_ref(), now);
    let mine = |acquire: Option<MicroTime>, transitions: i32| LeaseSpec {
        holder_identity: Some(cfg.identity.clone()),
        lease_duration_seconds: Some(secs(cfg.lease_duration)),
        acquire_time: acquire.or_else(|| Some(micro_now())),
        renew_time: Some(micro_now()),
        lease_transitions: Some(transitions),
        ..Default::default()
    };
    let result = match (decision, lease) {
        (Decision::Create, _) => {
            let l = Lease {
                metadata: ObjectMeta {
                    name: Some(cfg.name.clone()),
                    namespace: Some(cfg.namespace.clone()),
                    ..Default::default()
                },
                spec: Some(mine(None, 0)),
            };
            api.create(&PostParams::default(), &l).await.map(Some)
        }
        (Decision::Acquire, Some(mut l)) => {
            let transitions = l
                .spec
                .as_ref()
                .and_then(|s| s.lease_transitions)
                .unwrap_or(0)
                .saturating_add(1);
            l.spec = Some(mine(None, transitions));
            api.replace(&cfg.name, &PostParams::default(), &l)
                .await
                .map(Some)
        }
        (Decision::Renew, Some(mut l)) => {
            let spec = l.spec.clone().unwrap_or_default();
            l.spec = Some(mine(spec.acquire_time, spec.lease_transitions.unwrap_or(0)));
            api.replace(&cfg.name, &PostParams::default(), &l)
                .await
                .map(Some)
        }
        (Decision::Follow { .. }, _) | (_, None) => return Ok(false),
    };
    match result {
        Ok(Some(l)) => {
            // Our own write is a change we have seen now.
            *obs = Some(Observation::observe(
                None,
                &l,
                Instant::now(),
                cfg.lease_duration,
            ));
            Ok(true)
        }
        Ok(None) => Ok(false),
        // Someone else wrote first: not ours (this round).
        Err(kube::Error::Api(s)) if s.code == 409 => Ok(false),
        Err(e) => Err(e),
    }
}

/// Give the Lease up if we hold it (holder cleared, duration 1 s) so a standby takes
/// over at its next poll instead of after the lease duration.
async fn release(api: &Api<Lease>, cfg: &LeaderConfig) -> Result<bool, kube::Error> {
    let Some(mut l) = api.get_opt(&cfg.name).await? else {
        return Ok(false);
    };
    let spec = l.spec.clone().unwrap_or_default();
    if spec.holder_identity.as_deref() != Some(cfg.identity.as_str()) {
        return Ok(false);
    }
    l.spec = Some(LeaseSpec {
        holder_identity: None,
        lease_duration_seconds: Some(1),
        renew_time: Some(micro_now()),
        ..spec
    });
    api.replace(&cfg.name, &PostParams::default(), &l).await?;
    Ok(true)
}

/// Campaign until `stop` resolves, publishing on `leading` whether we lead; then
/// release the Lease if we hold it. Readiness (`metrics`) is true while the Lease
/// can be read (leader or standby), the leader gauge tells which.
pub async fn elect(
    client: kube::Client,
    cfg: LeaderConfig,
    leading: watch::Sender<bool>,
    metrics: Arc<super::metrics::Metrics>,
    stop: impl std::future::Future<Output = ()> + Send,
) {
    let api: Api<Lease> = Api::namespaced(client, &cfg.namespace);
    let mut obs: Option<Observation> = None;
    let mut last_ok: Option<Instant> = None;
    let mut last_renew: Option<Instant> = None;
    let bound = cfg.retry_period.max(cfg.renew_deadline / 2);
    let mut stop = std::pin::pin!(stop);
    loop {
        let was = *leading.borrow();
        // A leader never waits past its renew deadline for an answer.
        let limit = if was {
            bound.min(renew_time_left(
                last_renew,
                Instant::now(),
                cfg.renew_deadline,
            ))
        } else {
            bound
        };
        let r = tokio::time::timeout(limit, step(&api, &cfg, &mut obs)).await;
        let now = Instant::now();
        let lead = match r {
            Ok(Ok(l)) => {
                last_ok = Some(now);
                if l {
                    last_renew = Some(now);
                }
                l
            }
            Ok(Err(e)) => {
                tracing::warn!(lease = %format!("{}/{}", cfg.namespace, cfg.name), error = %e, "leader election");
                was && !renew_time_left(last_renew, now, cfg.renew_deadline).is_zero()
            }
            Err(_) => {
                tracing::warn!(lease = %format!("{}/{}", cfg.namespace, cfg.name), "leader election request timed out");
                was && !renew_time_left(last_renew, now, cfg.renew_deadline).is_zero()
            }
        };
        if lead != was {
            if lead {
                tracing::info!(identity = %cfg.identity, "acquired the lease: leading");
            } else {
                tracing::warn!(identity = %cfg.identity, holder = ?obs.as_ref().and_then(|o| o.holder.clone()), "not leading");
            }
            leading.send_replace(lead);
        }
        metrics.set_leader(Some(lead));
        metrics.set_ready(last_ok.is_some_and(|t| now.duration_since(t) < cfg.lease_duration));
        tokio::select! {
            _ = &mut stop => break,
            _ = tokio::time::sleep(if lead {
                // Wake up by the renew deadline at the latest.
                cfg.retry_period.min(renew_time_left(last_renew, now, cfg.renew_deadline))
            } else {
                cfg.retry_period
            }) => {}
        }
    }
    metrics.set_ready(false);
    let held = *leading.borrow();
    leading.send_replace(false);
    metrics.set_leader(Some(false));
    if held {
        match tokio::time::timeout(bound, release(&api, &cfg)).await {
            Ok(Ok(true)) => tracing::info!(identity = %cfg.identity, "released the lease"),
            Ok(Ok(false)) => {}
            Ok(Err(e)) => tracing::warn!(error = %e, "releasing the lease"),
            Err(_) => tracing::warn!("releasing the lease timed out"),
        }
    }
}

/// Run the controller only while this replica holds the Lease, until `shutdown`
/// resolves; then stop the controller and release the Lease (in that order, so no
/// reconcile runs after the release). Losing the Lease stops the controller and
/// returns to standby.
pub async fn run_with_leader_election(
    ctx: Arc<Context>,
    opts: RunOptions,
    cfg: LeaderConfig,
    shutdown: impl std::future::Future<Output = ()> + Send + Sync + 'static,
) {
    let (tx, rx) = watch::channel(false);
    let (stop_tx, stop_rx) = futures::channel::oneshot::channel::<()>();
    let elector = tokio::spawn(elect(
        ctx.client.clone(),
        cfg,
        tx,
        ctx.metrics.clone(),
        stop_rx.map(|_| ()),
    ));
    let shutdown = Box::pin(shutdown).shared();
    loop {
        let mut r = rx.clone();
        tokio::select! {
            _ = shutdown.clone() => break,
            res = r.wait_for(|l| *l) => if res.is_err() { break },
        }
        tracing::info!("leading: starting the controller");
        // The controller stops on shutdown or when leadership is lost.
        let (term_tx, term_rx) = futures::channel::oneshot::channel::<()>();
        let mut lost = rx.clone();
        let sd = shutdown.clone();
        let watcher = tokio::spawn(async move {
            tokio::select! {
                _ = sd => {}
                _ = lost.wait_for(|l| !*l) => {}
            }
            let _ = term_tx.send(());
        });
        controller::run_controller(ctx.clone(), opts.clone(), term_rx.map(|_| ())).await;
        watcher.abort();
        if shutdown.peek().is_some() {
            break;
        }
        tracing::warn!("lost the lease: controller stopped, standing by");
    }
    let _ = stop_tx.send(());
    if let Err(e) = elector.await {
        tracing::warn!(error = %e, "leader election task");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn obs(holder: Option<&str>, seen_at: Instant) -> Observation {
        Observation {
            holder: holder.map(str::to_string),
            lease_duration: Duration::from_secs(15),
            version: "1".into(),
            seen_at,
        }
    }

    #[test]
    fn decisions() {
        let t0 = Instant::now();
        assert_eq!(decide("me", None, t0), Decision::Create);
        assert_eq!(decide("me", Some(&obs(None, t0)), t0), Decision::Acquire);
        assert_eq!(
            decide("me", Some(&obs(Some("me"), t0)), t0),
            Decision::Renew
        );
        // Another holder: followed until the lease duration has passed since the
        // record last changed, then taken over.
        let o = obs(Some("other"), t0);
        assert_eq!(
            decide("me", Some(&o), t0 + Duration::from_secs(5)),
            Decision::Follow {
                holder: "other".into(),
                expires_in: Duration::from_secs(10)
            }
        );
        assert_eq!(
            decide("me", Some(&o), t0 + Duration::from_secs(15)),
            Decision::Acquire
        );
    }

    #[test]
    fn seen_at_moves_only_when_the_record_changes() {
        let t0 = Instant::now();
        let t1 = t0 + Duration::from_secs(3);
        let mut l = Lease {
            metadata: ObjectMeta {
                resource_version: Some("7".into()),
                ..Default::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: Some("other".into()),
                lease_duration_seconds: Some(4),
                ..Default::default()
            }),
        };
        let a = Observation::observe(None, &l, t0, Duration::from_secs(15));
        assert_eq!(a.lease_duration, Duration::from_secs(4));
        let b = Observation::observe(Some(&a), &l, t1, Duration::from_secs(15));
        assert_eq!(b.seen_at, t0, "unchanged record keeps its first sighting");
        l.metadata.resource_version = Some("8".into());
        let c = Observation::observe(Some(&b), &l, t1, Duration::from_secs(15));
        assert_eq!(c.seen_at, t1);
        // A released lease (empty holder) reads as free.
        l.spec.as_mut().unwrap().holder_identity = Some(String::new());
        let d = Observation::observe(Some(&c), &l, t1, Duration::from_secs(15));
        assert_eq!(decide("me", Some(&d), t1), Decision::Acquire);
    }

    #[test]
    fn renew_deadline_bounds_leadership() {
        let t0 = Instant::now();
        let d = Duration::from_secs(10);
        assert_eq!(renew_time_left(None, t0, d), Duration::ZERO);
        assert_eq!(
            renew_time_left(Some(t0), t0 + Duration::from_secs(4), d),
            Duration::from_secs(6)
        );
        assert_eq!(
            renew_time_left(Some(t0), t0 + Duration::from_secs(11), d),
            Duration::ZERO
        );
    }

    #[test]
    fn config_check() {
        let mut c = LeaderConfig::new("ns", "lease", "id");
        assert!(c.check().is_ok());
        c.renew_deadline = c.lease_duration;
        assert!(c.check().is_err());
        assert!(default_identity() != default_identity());
    }
}
