//! `/metrics` over TLS, for authenticated and authorized readers only (issue 39 item 4), the
//! way Kubernetes components and kube-rbac-proxy protect theirs: the caller presents a bearer
//! token, the API server says who it is (TokenReview) and whether that identity may `get` the
//! non-resource URL `/metrics` (SubjectAccessReview). The controller's ServiceAccount needs
//! `system:auth-delegator` for both reviews; a reader needs a role granting
//! `nonResourceURLs: ["/metrics"], verbs: ["get"]` (manifests/monitoring binds one to
//! OpenShift's Prometheus).
//!
//! The serving certificate is read from `tls.crt`/`tls.key` in a directory (OpenShift's
//! service CA writes them into the Secret named on the metrics Service; cert-manager can too),
//! re-read when the files change; without them a self-signed certificate is made at start
//! (scrapers then skip verification, as with controller-runtime's default).
//!
//! Bounds: a token longer than 8 KiB is refused unread; decisions (allowed and refused) are
//! kept 60 s for at most 1,024 tokens, keyed by the token's SHA-256, so a scraper every 30 s
//! costs two reviews a minute and a flood of bad tokens at most one review pair per token a
//! minute; at most 4 reviews in flight (a request waiting over 2 s for one is 503), 64
//! connections at once, each with 10 s for its TLS handshake. A review the API server cannot
//! answer is 503 and not remembered. No token is logged.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use k8s_openapi::api::authorization::v1::{
    NonResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use kube::Api;
use kube::api::PostParams;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use sha2::{Digest, Sha256};

use super::metrics::Metrics;

/// The longest bearer token read.
pub const MAX_TOKEN_BYTES: usize = 8 * 1024;
/// How long a decision about one token is kept.
pub const DECISION_TTL: Duration = Duration::from_secs(60);
/// Tokens remembered at once.
pub const MAX_REMEMBERED: u64 = 1024;
/// Connections served at once.
pub const MAX_CONNECTIONS: usize = 64;
/// Token reviews in flight at once (a flood of new tokens cannot turn into a flood of
/// TokenReviews against the API server); a request that waits longer than
/// [`REVIEW_WAIT`] for one is answered 503.
pub const MAX_CONCURRENT_REVIEWS: usize = 4;
pub const REVIEW_WAIT: Duration = Duration::from_secs(2);
/// Time for a client's TLS handshake.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// How often the certificate files are checked for a change.
const RELOAD_CHECK: Duration = Duration::from_secs(30);

/// Where and how the TLS metrics endpoint serves.
#[derive(Clone, Debug)]
pub struct SecureMetricsConfig {
    pub addr: SocketAddr,
    /// Directory with `tls.crt` and `tls.key`; `None` or missing files: self-signed.
    pub cert_dir: Option<PathBuf>,
    /// Names of the self-signed certificate.
    pub self_signed_names: Vec<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum SecureMetricsError {
    #[error("binding {0}: {1}")]
    Bind(SocketAddr, std::io::Error),
    #[error("serving certificate: {0}")]
    Certificate(String),
}

/// What the API server said about a token.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    Allowed,
    /// Not a valid token (401).
    Unauthenticated,
    /// Valid, but that identity may not get /metrics (403), with who it is.
    Forbidden(String),
}

/// TokenReview + SubjectAccessReview with a bounded cache of decisions.
#[derive(Clone)]
pub struct Authorizer {
    client: kube::Client,
    decisions: moka::future::Cache<[u8; 32], Decision>,
    reviews: Arc<tokio::sync::Semaphore>,
}

impl Authorizer {
    pub fn new(client: kube::Client) -> Self {
        Self {
            client,
            decisions: moka::future::Cache::builder()
                .max_capacity(MAX_REMEMBERED)
                .time_to_live(DECISION_TTL)
                .build(),
            reviews: Arc::new(tokio::sync::Semaphore::new(MAX_CONCURRENT_REVIEWS)),
        }
    }

    /// Whether `token` may read /metrics; `Err` when the API server did not answer.
    pub async fn check(&self, token: &str) -> Result<Decision, String> {
        let key: [u8; 32] = Sha256::digest(token.as_bytes()).into();
        if let Some(d) = self.decisions.get(&key).await {
            return Ok(d);
        }
        let _slot = match tokio::time::timeout(REVIEW_WAIT, self.reviews.acquire()).await {
            Ok(Ok(p)) => p,
            _ => return Err("too many token reviews at once".to_string()),
        };
        let d = self.review(token).await?;
        self.decisions.insert(key, d.clone()).await;
        Ok(d)
    }

    async fn review(&self, token: &str) -> Result<Decision, String> {
        let reviews: Api<TokenReview> = Api::all(self.client.clone());
        let tr = TokenReview {
            spec: TokenReviewSpec {
                token: token.to_string(),
                audiences: None,
            },
            ..Default::default()
        };
        let tr = reviews
            .create(&PostParams::default(), &tr)
            .await
            .map_err(|e| format!("TokenReview: {e}"))?;
        let Some(status) = tr.status.filter(|s| s.authenticated == Some(true)) else {
            return Ok(Decision::Unauthenticated);
        };
        let user = status.user.unwrap_or_default();
        let who = user.username.clone().unwrap_or_default();
        let sar = SubjectAccessReview {
            spec: SubjectAccessReviewSpec {
                user: user.username,
                groups: user.groups,
                uid: user.uid,
                extra: user.extra,
                non_resource_attributes: Some(NonResourceAttributes {
                    path: Some("/metrics".to_string()),
                    verb: Some("get".to_string()),
                }),
                ..Default::default()
            },
            ..Default::default()
        };
        let sars: Api<SubjectAccessReview> = Api::all(self.client.clone());
        let sar = sars
            .create(&PostParams::default(), &sar)
            .await
            .map_err(|e| format!("SubjectAccessReview: {e}"))?;
        if sar.status.is_some_and(|s| s.allowed) {
            Ok(Decision::Allowed)
        } else {
            Ok(Decision::Forbidden(who))
        }
    }
}

/// The bearer token of a request, if any and not too long.
fn bearer(headers: &HeaderMap) -> Option<&str> {
    let v = headers.get(header::AUTHORIZATION)?;
    if v.len() > MAX_TOKEN_BYTES + 7 {
        return None;
    }
    let t = v.to_str().ok()?.strip_prefix("Bearer ")?.trim();
    (!t.is_empty()).then_some(t)
}

#[derive(Clone)]
struct AppState {
    metrics: Arc<Metrics>,
    auth: Authorizer,
}

async fn metrics_handler(State(s): State<AppState>, headers: HeaderMap) -> Response {
    let Some(token) = bearer(&headers) else {
        s.metrics.metrics_request("unauthenticated");
        return (
            StatusCode::UNAUTHORIZED,
            [(header::WWW_AUTHENTICATE, "Bearer")],
            "a bearer token is required\n",
        )
            .into_response();
    };
    match s.auth.check(token).await {
        Ok(Decision::Allowed) => {
            s.metrics.metrics_request("allowed");
            (
                [(header::CONTENT_TYPE, hcp_olm_binkit::admin::OPENMETRICS)],
                s.metrics.encode(),
            )
                .into_response()
        }
        Ok(Decision::Unauthenticated) => {
            s.metrics.metrics_request("unauthenticated");
            (StatusCode::UNAUTHORIZED, "the token was not accepted\n").into_response()
        }
        Ok(Decision::Forbidden(who)) => {
            s.metrics.metrics_request("forbidden");
            (
                StatusCode::FORBIDDEN,
                format!("{who} may not get /metrics\n"),
            )
                .into_response()
        }
        Err(e) => {
            s.metrics.metrics_request("review_failed");
            tracing::warn!(error = %e, "metrics: the API server did not review a token");
            (
                StatusCode::SERVICE_UNAVAILABLE,
                "the API server did not answer the review\n",
            )
                .into_response()
        }
    }
}

/// The serving certificate, re-read from its files when they change.
#[derive(Debug)]
struct Certificates {
    dir: Option<PathBuf>,
    state: Mutex<CertState>,
}

#[derive(Debug)]
struct CertState {
    checked: Instant,
    modified: Option<SystemTime>,
    key: Arc<CertifiedKey>,
}

fn load_dir(dir: &Path) -> Result<(Arc<CertifiedKey>, Option<SystemTime>), String> {
    let crt = dir.join("tls.crt");
    let key = dir.join("tls.key");
    let modified = std::fs::metadata(&crt).and_then(|m| m.modified()).ok();
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(&crt)
        .map_err(|e| format!("{}: {e}", crt.display()))?
        .collect::<Result<_, _>>()
        .map_err(|e| format!("{}: {e}", crt.display()))?;
    if chain.is_empty() {
        return Err(format!("{}: no certificate", crt.display()));
    }
    let k = PrivateKeyDer::from_pem_file(&key).map_err(|e| format!("{}: {e}", key.display()))?;
    certified(chain, k).map(|c| (c, modified))
}

fn certified(
    chain: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
) -> Result<Arc<CertifiedKey>, String> {
    let signing = rustls::crypto::ring::sign::any_supported_type(&key)
        .map_err(|e| format!("private key: {e}"))?;
    Ok(Arc::new(CertifiedKey::new(chain, signing)))
}

fn self_signed(names: &[String]) -> Result<Arc<CertifiedKey>, String> {
    let c = rcgen::generate_simple_self_signed(names.to_vec()).map_err(|e| e.to_string())?;
    let key = PrivateKeyDer::try_from(c.signing_key.serialize_der()).map_err(|e| e.to_string())?;
    certified(vec![c.cert.der().clone()], key)
}

impl Certificates {
    fn new(cfg: &SecureMetricsConfig) -> Result<Self, String> {
        let from_dir = cfg
            .cert_dir
            .as_deref()
            .filter(|d| d.join("tls.crt").exists() && d.join("tls.key").exists());
        let (key, modified) = match from_dir {
            Some(d) => {
                let loaded = load_dir(d)?;
                tracing::info!(dir = %d.display(), "metrics: serving certificate from files");
                loaded
            }
            None => {
                tracing::warn!(
                    "metrics: no tls.crt/tls.key in --metrics-cert-dir; serving a self-signed certificate"
                );
                (self_signed(&cfg.self_signed_names)?, None)
            }
        };
        Ok(Self {
            dir: from_dir.map(Path::to_path_buf),
            state: Mutex::new(CertState {
                checked: Instant::now(),
                modified,
                key,
            }),
        })
    }

    fn current(&self) -> Arc<CertifiedKey> {
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(dir) = &self.dir
            && s.checked.elapsed() >= RELOAD_CHECK
        {
            s.checked = Instant::now();
            let modified = std::fs::metadata(dir.join("tls.crt"))
                .and_then(|m| m.modified())
                .ok();
            if modified != s.modified {
                match load_dir(dir) {
                    Ok((key, m)) => {
                        tracing::info!("metrics: serving certificate reloaded");
                        s.key = key;
                        s.modified = m;
                    }
                    // Keep the one that works (a half-written pair is retried next check).
                    Err(e) => tracing::warn!(error = %e, "metrics: certificate not reloaded"),
                }
            }
        }
        s.key.clone()
    }
}

impl ResolvesServerCert for Certificates {
    fn resolve(&self, _: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current())
    }
}

/// Binds `cfg.addr` (before anything else happens, so a port clash fails the start).
pub async fn bind(
    cfg: &SecureMetricsConfig,
) -> Result<tokio::net::TcpListener, SecureMetricsError> {
    tokio::net::TcpListener::bind(cfg.addr)
        .await
        .map_err(|e| SecureMetricsError::Bind(cfg.addr, e))
}

/// The TLS configuration of the endpoint: the certificate from `cfg.cert_dir` (reloaded when
/// its files change) or self-signed. An unreadable certificate is an error here, at start.
pub fn tls_config(
    cfg: &SecureMetricsConfig,
) -> Result<Arc<rustls::ServerConfig>, SecureMetricsError> {
    let certs = Arc::new(Certificates::new(cfg).map_err(SecureMetricsError::Certificate)?);
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut tls = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| SecureMetricsError::Certificate(e.to_string()))?
        .with_no_client_auth()
        .with_cert_resolver(certs);
    tls.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(Arc::new(tls))
}

/// Serves `/metrics` over TLS on `listener` until `shutdown` resolves.
pub async fn serve(
    listener: tokio::net::TcpListener,
    tls: Arc<rustls::ServerConfig>,
    metrics: Arc<Metrics>,
    client: kube::Client,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) {
    let acceptor = tokio_rustls::TlsAcceptor::from(tls);
    let app: Router = Router::new()
        .route("/metrics", get(metrics_handler))
        .with_state(AppState {
            metrics,
            auth: Authorizer::new(client),
        });
    let slots = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
    if let Ok(a) = listener.local_addr() {
        tracing::info!(addr = %a, "metrics (TLS, authenticated) listening");
    }
    tokio::pin!(shutdown);
    loop {
        let (stream, _) = tokio::select! {
            _ = &mut shutdown => return,
            r = listener.accept() => match r {
                Ok(s) => s,
                Err(e) => {
                    tracing::warn!(error = %e, "metrics: accept");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        // Over the cap: the connection is closed at once.
        let Ok(permit) = slots.clone().try_acquire_owned() else {
            drop(stream);
            continue;
        };
        let acceptor = acceptor.clone();
        let app = app.clone();
        tokio::spawn(async move {
            let _permit = permit;
            let Ok(Ok(tls)) =
                tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await
            else {
                return;
            };
            let svc = hyper_util::service::TowerToHyperService::new(app);
            let mut builder =
                hyper_util::server::conn::auto::Builder::new(hyper_util::rt::TokioExecutor::new());
            builder
                .http1()
                .header_read_timeout(Some(HANDSHAKE_TIMEOUT))
                .timer(hyper_util::rt::TokioTimer::new());
            let conn = builder.serve_connection(hyper_util::rt::TokioIo::new(tls), svc);
            // A connection lives at most 5 minutes (scrapers reconnect).
            let _ = tokio::time::timeout(Duration::from_secs(300), conn).await;
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bearer_tokens_are_read_only_when_well_formed_and_bounded() {
        let mut h = HeaderMap::new();
        assert_eq!(bearer(&h), None);
        h.insert(header::AUTHORIZATION, "Bearer abc".parse().unwrap());
        assert_eq!(bearer(&h), Some("abc"));
        h.insert(header::AUTHORIZATION, "Basic abc".parse().unwrap());
        assert_eq!(bearer(&h), None);
        h.insert(header::AUTHORIZATION, "Bearer ".parse().unwrap());
        assert_eq!(bearer(&h), None);
        let long = format!("Bearer {}", "a".repeat(MAX_TOKEN_BYTES + 1));
        h.insert(header::AUTHORIZATION, long.parse().unwrap());
        assert_eq!(bearer(&h), None);
        let max = format!("Bearer {}", "a".repeat(MAX_TOKEN_BYTES));
        h.insert(header::AUTHORIZATION, max.parse().unwrap());
        assert!(bearer(&h).is_some());
    }

    /// A flood of new tokens makes at most MAX_CONCURRENT_REVIEWS reviews at once: against an
    /// API server that accepts and never answers, 12 checks open at most 4 connections, and
    /// the ones left waiting give up after REVIEW_WAIT.
    #[tokio::test]
    async fn token_reviews_in_flight_are_capped() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let accepted = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let count = accepted.clone();
        let hold = tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((s, _)) = listener.accept().await {
                count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                held.push(s);
            }
        });
        let mut config = kube::Config::new(format!("http://{addr}").parse().unwrap());
        config.read_timeout = Some(Duration::from_secs(30));
        let auth = Authorizer::new(kube::Client::try_from(config).unwrap());
        let started = Instant::now();
        let checks: Vec<_> = (0..12)
            .map(|i| {
                let a = auth.clone();
                tokio::spawn(async move { a.check(&format!("token-{i}")).await })
            })
            .collect();
        tokio::time::sleep(REVIEW_WAIT + Duration::from_millis(500)).await;
        let opened = accepted.load(std::sync::atomic::Ordering::SeqCst);
        assert!(
            (1..=MAX_CONCURRENT_REVIEWS).contains(&opened),
            "{opened} connections for 12 reviews"
        );
        let mut busy = 0;
        for c in checks {
            if c.is_finished() {
                let r = c.await.unwrap();
                assert_eq!(r, Err("too many token reviews at once".to_string()));
                busy += 1;
            } else {
                c.abort();
            }
        }
        assert_eq!(
            busy,
            12 - MAX_CONCURRENT_REVIEWS,
            "after {:?}",
            started.elapsed()
        );
        hold.abort();
    }

    #[test]
    fn an_unreadable_certificate_fails_the_start() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("tls.crt"), "not a certificate").unwrap();
        std::fs::write(dir.path().join("tls.key"), "not a key").unwrap();
        let cfg = SecureMetricsConfig {
            addr: "127.0.0.1:0".parse().unwrap(),
            cert_dir: Some(dir.path().to_path_buf()),
            self_signed_names: vec!["x".into()],
        };
        let e = tls_config(&cfg).unwrap_err().to_string();
        assert!(e.contains("tls.crt"), "{e}");
    }

    #[test]
    fn a_self_signed_certificate_is_made_without_files() {
        let cfg = SecureMetricsConfig {
            addr: "127.0.0.1:0".parse().unwrap(),
            cert_dir: Some(PathBuf::from("/nonexistent")),
            self_signed_names: vec!["hcp-olm-controller-metrics.hcp-olm-system.svc".into()],
        };
        let c = Certificates::new(&cfg).expect("self-signed");
        assert!(c.dir.is_none());
        assert_eq!(c.current().cert.len(), 1);
    }
}
