//! The admin HTTP endpoints every long-running binary serves, one implementation:
//! - `/healthz`: liveness, 200 unless the binary's health probe fails (503 with the reason);
//! - `/readyz`: readiness, 200 with the probe's body (e.g. `ok: leader`) or 503 with why not;
//! - `/metrics`: the binary's [`Registry`] as OpenMetrics text.
//!
//! Start from [`registry`]: every name in it gets the `hcp_olm_` prefix, and it carries
//! `hcp_olm_build_info{version,binary} 1`. Bodies end with a newline.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use prometheus_client::metrics::info::Info;
use prometheus_client::registry::Registry;
use tokio::net::TcpListener;

/// The prefix of every metric name (`hcp_olm_…`).
pub const PREFIX: &str = "hcp_olm";

/// Content type of `/metrics`.
pub const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// A registry whose names get the `hcp_olm_` prefix, with
/// `hcp_olm_build_info{version="<version>",binary="<binary>"} 1` registered. Pass
/// `env!("CARGO_PKG_VERSION")` as `version`.
pub fn registry(binary: &str, version: &str) -> Registry {
    let mut r = Registry::with_prefix(PREFIX);
    r.register(
        "build",
        "Build information: the version and binary as labels, value 1",
        Info::new(vec![
            ("version".to_string(), version.to_string()),
            ("binary".to_string(), binary.to_string()),
        ]),
    );
    r
}

/// `registry` as OpenMetrics text.
pub fn encode(registry: &Registry) -> Result<String, std::fmt::Error> {
    let mut s = String::new();
    prometheus_client::encoding::text::encode(&mut s, registry)?;
    Ok(s)
}

/// A probe: `Ok(body)` answers 200, `Err(reason)` answers 503.
pub type Probe = Arc<dyn Fn() -> Result<String, String> + Send + Sync>;

/// The admin endpoints of one binary: its registry and its two probes (both answer
/// `200 ok` until set).
#[derive(Clone)]
pub struct Admin {
    registry: Arc<Registry>,
    healthz: Probe,
    readyz: Probe,
    /// `/metrics` is served elsewhere (TLS, authenticated): here it answers 404 with this.
    metrics_elsewhere: Option<String>,
}

impl std::fmt::Debug for Admin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Admin").finish_non_exhaustive()
    }
}

fn always_ok() -> Probe {
    Arc::new(|| Ok("ok".to_string()))
}

impl Admin {
    /// Serves `registry` on `/metrics`; `/healthz` and `/readyz` answer `200 ok`.
    pub fn new(registry: impl Into<Arc<Registry>>) -> Self {
        Self {
            registry: registry.into(),
            healthz: always_ok(),
            readyz: always_ok(),
            metrics_elsewhere: None,
        }
    }

    /// The liveness probe of `/healthz`.
    pub fn healthz<F>(mut self, probe: F) -> Self
    where
        F: Fn() -> Result<String, String> + Send + Sync + 'static,
    {
        self.healthz = Arc::new(probe);
        self
    }

    /// The readiness probe of `/readyz`.
    pub fn readyz<F>(mut self, probe: F) -> Self
    where
        F: Fn() -> Result<String, String> + Send + Sync + 'static,
    {
        self.readyz = Arc::new(probe);
        self
    }

    /// Serves only the probes: `/metrics` answers 404 naming where it is (`note`).
    pub fn metrics_elsewhere(mut self, note: impl Into<String>) -> Self {
        self.metrics_elsewhere = Some(note.into());
        self
    }

    /// The router of the three endpoints.
    pub fn router(self) -> Router {
        Router::new()
            .route(
                "/healthz",
                get(|State(a): State<Admin>| async move { probe(&a.healthz) }),
            )
            .route(
                "/readyz",
                get(|State(a): State<Admin>| async move { probe(&a.readyz) }),
            )
            .route("/metrics", get(metrics))
            .with_state(self)
    }

    /// Serves on `listener` until `shutdown` resolves.
    pub async fn serve(
        self,
        listener: TcpListener,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> std::io::Result<()> {
        axum::serve(listener, self.router())
            .with_graceful_shutdown(shutdown)
            .await
    }

    /// [`Admin::serve`] on a task; an error is logged.
    pub fn spawn(
        self,
        listener: TcpListener,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> tokio::task::JoinHandle<()> {
        tokio::spawn(async move {
            if let Err(e) = self.serve(listener, shutdown).await {
                tracing::error!(error = %e, "admin server failed");
            }
        })
    }
}

/// The readiness of a daemon that drains on SIGTERM: `200 ready` while `ready` is set,
/// else `503 draining`.
pub fn ready_until_draining(ready: Arc<AtomicBool>) -> impl Fn() -> Result<String, String> {
    move || {
        if ready.load(Ordering::SeqCst) {
            Ok("ready".to_string())
        } else {
            Err("draining".to_string())
        }
    }
}

fn with_newline(mut s: String) -> String {
    if !s.ends_with('\n') {
        s.push('\n');
    }
    s
}

fn probe(p: &Probe) -> (StatusCode, String) {
    match p() {
        Ok(body) => (StatusCode::OK, with_newline(body)),
        Err(why) => (StatusCode::SERVICE_UNAVAILABLE, with_newline(why)),
    }
}

async fn metrics(State(a): State<Admin>) -> Response {
    if let Some(note) = &a.metrics_elsewhere {
        return (StatusCode::NOT_FOUND, with_newline(note.clone())).into_response();
    }
    match encode(&a.registry) {
        Ok(body) => ([(header::CONTENT_TYPE, OPENMETRICS)], body).into_response(),
        Err(e) => {
            tracing::warn!(error = %e, "encoding metrics");
            StatusCode::INTERNAL_SERVER_ERROR.into_response()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus_client::metrics::counter::Counter;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    async fn get(addr: std::net::SocketAddr, path: &str) -> (u16, String) {
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        s.write_all(format!("GET {path} HTTP/1.0\r\nHost: x\r\n\r\n").as_bytes())
            .await
            .unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).await.unwrap();
        let code = out.split_whitespace().nth(1).unwrap().parse().unwrap();
        let body = out.split_once("\r\n\r\n").unwrap().1.to_string();
        (code, body)
    }

    #[test]
    fn registry_prefixes_names_and_carries_build_info() {
        let mut r = registry("hcp-olm-test", "1.2.3");
        let c = Counter::<u64>::default();
        r.register("things", "Things", c.clone());
        c.inc();
        let text = encode(&r).unwrap();
        assert!(
            text.contains("hcp_olm_build_info{version=\"1.2.3\",binary=\"hcp-olm-test\"} 1"),
            "{text}"
        );
        assert!(text.contains("hcp_olm_things_total 1"), "{text}");
        assert!(text.ends_with("# EOF\n"), "{text}");
    }

    #[tokio::test]
    async fn serves_probes_and_metrics_until_shutdown() {
        let ready = Arc::new(AtomicBool::new(true));
        let healthy = Arc::new(AtomicBool::new(true));
        let h = Arc::clone(&healthy);
        let admin = Admin::new(registry("hcp-olm-test", "0.0.0"))
            .readyz(ready_until_draining(Arc::clone(&ready)))
            .healthz(move || {
                if h.load(Ordering::SeqCst) {
                    Ok("ok".into())
                } else {
                    Err("stuck".into())
                }
            });
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let task = admin.spawn(l, async move {
            let _ = rx.await;
        });

        assert_eq!(get(addr, "/healthz").await, (200, "ok\n".into()));
        assert_eq!(get(addr, "/readyz").await, (200, "ready\n".into()));
        healthy.store(false, Ordering::SeqCst);
        ready.store(false, Ordering::SeqCst);
        assert_eq!(get(addr, "/healthz").await, (503, "stuck\n".into()));
        assert_eq!(get(addr, "/readyz").await, (503, "draining\n".into()));
        let (code, body) = get(addr, "/metrics").await;
        assert_eq!(code, 200);
        assert!(
            body.contains("\nhcp_olm_build_info{version=\"0.0.0\""),
            "{body}"
        );
        assert_eq!(get(addr, "/nope").await.0, 404);

        tx.send(()).unwrap();
        tokio::time::timeout(std::time::Duration::from_secs(5), task)
            .await
            .expect("stops on shutdown")
            .unwrap();
    }
}
