//! Prometheus metrics of reconciles and the admin HTTP endpoints
//! (`/healthz`, `/readyz`, `/metrics`).

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

type Labels = Vec<(String, String)>;

/// Reconcile metrics.
pub struct Metrics {
    registry: Registry,
    reconciles: Family<Labels, Counter>,
    errors: Family<Labels, Counter>,
    duration: Histogram,
    ready: AtomicBool,
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
        Self {
            registry,
            reconciles,
            errors,
            duration,
            ready: AtomicBool::new(false),
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
                if m.is_ready() {
                    (StatusCode::OK, "ok")
                } else {
                    (StatusCode::SERVICE_UNAVAILABLE, "not ready")
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
