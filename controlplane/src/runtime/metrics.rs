//! Prometheus metrics of reconciles and the admin HTTP endpoints
//! (`/healthz`, `/readyz`, `/metrics`).

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

type Labels = Vec<(String, String)>;

/// Reconcile metrics.
pub struct Metrics {
    registry: Registry,
    reconciles: Family<Labels, Counter>,
    errors: Family<Labels, Counter>,
    duration: Histogram,
    leader_gauge: Gauge,
    writes: Family<Labels, Counter>,
    ready: AtomicBool,
    /// The controller's watch caches have listed everything once.
    synced: AtomicBool,
    /// 0: no leader election, 1: standby, 2: leader.
    role: AtomicU8,
    /// Reconciles running now.
    inflight: AtomicUsize,
    /// When the loop last made progress: a reconcile finished, or work started after idling.
    last_progress: Mutex<Instant>,
    /// How long reconciles may run with none finishing before `/healthz` fails.
    stall_limit: Duration,
}

/// Default for [`Metrics::with_stall_limit`]: far above one reconcile's own timeouts
/// (guest connect 10 s, read 60 s per request), so only a loop that stopped moving trips it.
pub const DEFAULT_STALL_LIMIT: Duration = Duration::from_secs(600);

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("hcp_olm");
        let reconciles = Family::<Labels, Counter>::default();
        let errors = Family::<Labels, Counter>::default();
        let duration = Histogram::new(exponential_buckets(0.01, 2.0, 14));
        registry.register(
            "reconciles",
            "Reconciles of HostedClusters by result",
            reconciles.clone(),
        );
        registry.register(
            "reconcile_errors",
            "Failed reconciles by reason",
            errors.clone(),
        );
        registry.register(
            "reconcile_duration_seconds",
            "Duration of reconciles",
            duration.clone(),
        );
        let writes = Family::<Labels, Counter>::default();
        registry.register(
            "apply_writes",
            "API writes by reconciles: cluster (management, guest) and what (objects, status)",
            writes.clone(),
        );
        registry.register(
            "build",
            "Build information",
            prometheus_client::metrics::info::Info::new(vec![
                ("version".to_string(), env!("CARGO_PKG_VERSION").to_string()),
                ("binary".to_string(), "hcp-olm-controller".to_string()),
            ]),
        );
        let leader_gauge = Gauge::default();
        registry.register(
            "leader",
            "1 while this replica holds the leader-election Lease",
            leader_gauge.clone(),
        );
        Self {
            registry,
            reconciles,
            errors,
            duration,
            leader_gauge,
            writes,
            ready: AtomicBool::new(false),
            synced: AtomicBool::new(false),
            role: AtomicU8::new(0),
            inflight: AtomicUsize::new(0),
            last_progress: Mutex::new(Instant::now()),
            stall_limit: DEFAULT_STALL_LIMIT,
        }
    }
}

impl Metrics {
    /// Metrics whose `/healthz` fails once reconciles have been running for `limit` with
    /// none finishing.
    pub fn with_stall_limit(limit: Duration) -> Self {
        Self {
            stall_limit: limit,
            ..Self::default()
        }
    }

    /// A reconcile starts (pair with [`Metrics::reconcile_finished`]).
    pub fn reconcile_started(&self) {
        self.reconcile_started_at(Instant::now());
    }

    fn reconcile_started_at(&self, now: Instant) {
        if self.inflight.fetch_add(1, Ordering::SeqCst) == 0 {
            // idle time is not a stall
            *self.last_progress.lock().unwrap_or_else(|e| e.into_inner()) = now;
        }
    }

    /// A reconcile finished (either way).
    pub fn reconcile_finished(&self) {
        self.reconcile_finished_at(Instant::now());
    }

    fn reconcile_finished_at(&self, now: Instant) {
        let _ = self
            .inflight
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1));
        *self.last_progress.lock().unwrap_or_else(|e| e.into_inner()) = now;
    }

    /// `Some(how long)` when reconciles are running and none finished for longer than the
    /// stall limit.
    pub fn stalled(&self, now: Instant) -> Option<Duration> {
        if self.inflight.load(Ordering::SeqCst) == 0 {
            return None;
        }
        let since = now.saturating_duration_since(
            *self.last_progress.lock().unwrap_or_else(|e| e.into_inner()),
        );
        (since > self.stall_limit).then_some(since)
    }

    /// The watch caches have synced (`true`) or the loop stopped (`false`).
    pub fn set_synced(&self, synced: bool) {
        self.synced.store(synced, Ordering::Relaxed);
    }

    /// Whether the watch caches have synced.
    pub fn synced(&self) -> bool {
        self.synced.load(Ordering::Relaxed)
    }

    /// Ready to serve: running, and, unless a standby, with synced caches.
    pub fn serving(&self) -> bool {
        self.is_ready() && (self.leader() == Some(false) || self.synced())
    }

    /// Count one reconcile with its result (`applied`, `waiting`, `invalid`, ...).
    pub fn observe(&self, result: &str, took: Duration) {
        self.reconciles
            .get_or_create(&vec![("result".to_string(), result.to_string())])
            .inc();
        self.duration.observe(took.as_secs_f64());
    }

    /// Count the writes of one reconcile.
    pub fn writes(&self, management: usize, guest: usize, status: bool) {
        for (cluster, what, n) in [
            ("management", "objects", management),
            ("guest", "objects", guest),
            ("management", "status", usize::from(status)),
        ] {
            if n > 0 {
                self.writes
                    .get_or_create(&vec![
                        ("cluster".to_string(), cluster.to_string()),
                        ("what".to_string(), what.to_string()),
                    ])
                    .inc_by(n as u64);
            }
        }
    }

    /// Count one failed reconcile.
    pub fn error(&self, reason: &str, took: Duration) {
        self.observe("error", took);
        self.errors
            .get_or_create(&vec![("reason".to_string(), reason.to_string())])
            .inc();
    }

    /// Mark the controller ready (its watches are running).
    pub fn set_ready(&self, ready: bool) {
        self.ready.store(ready, Ordering::Relaxed);
    }

    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::Relaxed)
    }

    /// Leader-election role: None without election, else whether we lead.
    pub fn set_leader(&self, leading: Option<bool>) {
        let role = match leading {
            None => 0,
            Some(false) => 1,
            Some(true) => 2,
        };
        self.role.store(role, Ordering::Relaxed);
        self.leader_gauge.set(i64::from(role == 2));
    }

    /// Whether this replica leads (None: no leader election).
    pub fn leader(&self) -> Option<bool> {
        match self.role.load(Ordering::Relaxed) {
            0 => None,
            r => Some(r == 2),
        }
    }

    /// OpenMetrics text.
    pub fn encode(&self) -> String {
        let mut s = String::new();
        if let Err(e) = prometheus_client::encoding::text::encode(&mut s, &self.registry) {
            tracing::warn!(error = %e, "encoding metrics");
        }
        s
    }
}

/// The admin router.
pub fn router(metrics: Arc<Metrics>) -> Router {
    Router::new()
        .route(
            "/healthz",
            get(|State(m): State<Arc<Metrics>>| async move {
                match m.stalled(Instant::now()) {
                    None => (StatusCode::OK, "ok".to_string()),
                    Some(d) => (
                        StatusCode::SERVICE_UNAVAILABLE,
                        format!(
                            "reconcile loop stalled: {} reconciles running, none finished for {}s",
                            m.inflight.load(Ordering::SeqCst),
                            d.as_secs()
                        ),
                    ),
                }
            }),
        )
        .route(
            "/readyz",
            get(|State(m): State<Arc<Metrics>>| async move {
                // A standby replica is ready too (else a rolling update of a
                // 2-replica Deployment never completes); the body says which.
                // The leader (or a lone controller) is ready once its caches synced.
                match (m.serving(), m.leader()) {
                    (true, None) => (StatusCode::OK, "ok"),
                    (true, Some(true)) => (StatusCode::OK, "ok: leader"),
                    (true, Some(false)) => (StatusCode::OK, "ok: standby"),
                    (false, _) => (StatusCode::SERVICE_UNAVAILABLE, "not ready"),
                }
            }),
        )
        .route(
            "/metrics",
            get(|State(m): State<Arc<Metrics>>| async move {
                (
                    [(
                        header::CONTENT_TYPE,
                        "application/openmetrics-text; version=1.0.0; charset=utf-8",
                    )],
                    m.encode(),
                )
                    .into_response()
            }),
        )
        .with_state(metrics)
}

/// Serve the admin endpoints until `shutdown` resolves.
pub async fn serve(
    addr: SocketAddr,
    metrics: Arc<Metrics>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    tracing::info!(addr = %listener.local_addr()?, "admin endpoints listening");
    axum::serve(listener, router(metrics))
        .with_graceful_shutdown(shutdown)
        .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn healthz_fails_only_when_running_reconciles_stop_finishing() {
        let m = Metrics::with_stall_limit(Duration::from_secs(60));
        let t0 = Instant::now();
        // idle for longer than the limit: healthy
        assert_eq!(m.stalled(t0 + Duration::from_secs(3600)), None);
        m.reconcile_started_at(t0 + Duration::from_secs(3600));
        assert_eq!(m.stalled(t0 + Duration::from_secs(3630)), None);
        m.reconcile_started_at(t0 + Duration::from_secs(3640));
        m.reconcile_finished_at(t0 + Duration::from_secs(3650));
        // one still running, progress 50 s ago
        assert_eq!(m.stalled(t0 + Duration::from_secs(3700)), None);
        assert_eq!(
            m.stalled(t0 + Duration::from_secs(3711)),
            Some(Duration::from_secs(61))
        );
        m.reconcile_finished_at(t0 + Duration::from_secs(3712));
        assert_eq!(m.stalled(t0 + Duration::from_secs(9999)), None);
    }

    #[test]
    fn metric_names_follow_prometheus_conventions() {
        let m = Metrics::default();
        m.observe("applied", Duration::from_millis(5));
        m.error("ApplyFailed", Duration::from_millis(5));
        m.writes(3, 2, true);
        let text = m.encode();
        for want in [
            "hcp_olm_build_info{version=",
            "hcp_olm_reconciles_total{result=\"applied\"} 1",
            "hcp_olm_reconcile_errors_total{reason=\"ApplyFailed\"} 1",
            "hcp_olm_reconcile_duration_seconds_bucket",
            "hcp_olm_apply_writes_total{cluster=\"management\",what=\"objects\"} 3",
            "hcp_olm_apply_writes_total{cluster=\"guest\",what=\"objects\"} 2",
            "hcp_olm_apply_writes_total{cluster=\"management\",what=\"status\"} 1",
            "hcp_olm_leader 0",
        ] {
            assert!(text.contains(want), "{want} missing in\n{text}");
        }
        for line in text
            .lines()
            .filter(|l| !l.starts_with('#') && !l.is_empty())
        {
            assert!(line.starts_with("hcp_olm_"), "unprefixed series: {line}");
        }
    }

    #[test]
    fn ready_after_sync_unless_standby() {
        let m = Metrics::default();
        m.set_ready(true);
        assert!(!m.serving(), "no caches yet");
        m.set_synced(true);
        assert!(m.serving());
        m.set_synced(false);
        m.set_leader(Some(false));
        assert!(m.serving(), "a standby is ready without caches");
        m.set_leader(Some(true));
        assert!(!m.serving(), "a new leader waits for its caches");
    }
}
