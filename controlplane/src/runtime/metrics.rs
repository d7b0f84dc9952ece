//! Prometheus metrics of reconciles and the admin HTTP endpoints
//! (`/healthz`, `/readyz`, `/metrics`).

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::time::Duration;

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
    ready: AtomicBool,
    /// 0: no leader election, 1: standby, 2: leader.
    role: AtomicU8,
}

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
            ready: AtomicBool::new(false),
            role: AtomicU8::new(0),
        }
    }
}

impl Metrics {
    /// Count one reconcile with its result (`applied`, `waiting`, `invalid`, ...).
    pub fn observe(&self, result: &str, took: Duration) {
        self.reconciles
            .get_or_create(&vec![("result".to_string(), result.to_string())])
            .inc();
        self.duration.observe(took.as_secs_f64());
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
        .route("/healthz", get(|| async { "ok" }))
        .route(
            "/readyz",
            get(|State(m): State<Arc<Metrics>>| async move {
                // A standby replica is ready too (else a rolling update of a
                // 2-replica Deployment never completes); the body says which.
                match (m.is_ready(), m.leader()) {
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
