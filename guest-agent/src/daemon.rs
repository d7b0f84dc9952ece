//! What the gateway and agent binaries share: config and key loading with field-named
//! errors, the admin server (/healthz /readyz /metrics), tunnel metrics, and relay tasks.

use std::net::{IpAddr, SocketAddr};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::dns::ConfigError;
use crate::stack::StackCounters;
use crate::tunnel::{Cidr, Keys, PeerStatus, PrivateKey, PublicKey};

/// Exit code for configuration errors (EX_CONFIG).
pub const EX_CONFIG: u8 = hcp_olm_binkit::EX_USAGE;

/// What the tunnel binaries' `main` does after parsing flags: a configuration error exits
/// 64 with the message, then `run` is driven on a multi-threaded tokio runtime; its error is
/// logged and exits 1.
pub fn run_daemon<S, F, Fut>(
    name: &str,
    settings: Result<S, ConfigError>,
    run: F,
) -> std::process::ExitCode
where
    F: FnOnce(S) -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<()>>,
{
    use std::process::ExitCode;
    let settings = match settings {
        Ok(s) => s,
        Err(e) => {
            eprintln!("{name}: invalid configuration: {e}");
            return ExitCode::from(EX_CONFIG);
        }
    };
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("{name}: cannot start runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match rt.block_on(run(settings)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(error = format!("{e:#}"), "exiting");
            ExitCode::FAILURE
        }
    }
}

fn err(field: &str, reason: impl Into<String>) -> ConfigError {
    ConfigError {
        field: field.to_string(),
        reason: reason.into(),
    }
}

/// Reads and parses a JSON config document; the error names the offending field's path.
pub fn load_json<T: serde::de::DeserializeOwned>(path: &Path) -> Result<T, ConfigError> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| err("--config", format!("cannot read {}: {e}", path.display())))?;
    let de = &mut serde_json::Deserializer::from_str(&text);
    serde_path_to_error::deserialize(de).map_err(|e| {
        let path = e.path().to_string();
        let field = if path.is_empty() || path == "." {
            "<document>".to_string()
        } else {
            path
        };
        err(&field, e.into_inner().to_string())
    })
}

/// The private key from exactly one of `inline` / `file`; errors never contain key bytes.
pub fn private_key(
    inline: Option<&str>,
    file: Option<&str>,
    inline_field: &str,
    file_field: &str,
) -> Result<PrivateKey, ConfigError> {
    match (inline, file) {
        (Some(_), Some(_)) => Err(err(
            inline_field,
            format!("set either {inline_field} or {file_field}, not both"),
        )),
        (None, None) => Err(err(
            file_field,
            format!("one of {inline_field} or {file_field} is required"),
        )),
        (Some(k), None) => PrivateKey::from_base64(k).map_err(|e| err(inline_field, e.to_string())),
        (None, Some(f)) => {
            let text = std::fs::read_to_string(f)
                .map_err(|e| err(file_field, format!("cannot read {f}: {e}")))?;
            PrivateKey::from_base64(&text).map_err(|e| err(file_field, e.to_string()))
        }
    }
}

pub fn public_key(field: &str, s: &str) -> Result<PublicKey, ConfigError> {
    PublicKey::from_base64(s).map_err(|e| err(field, e.to_string()))
}

/// `a.b.c.d/len` → (address, prefix).
pub fn interface_address(field: &str, s: &str) -> Result<(IpAddr, u8), ConfigError> {
    let (a, p) = s
        .split_once('/')
        .ok_or_else(|| err(field, format!("`{s}` is not ADDRESS/PREFIX")))?;
    let ip: IpAddr = a
        .parse()
        .map_err(|_| err(field, format!("`{a}` is not an IP address")))?;
    let p: u8 = p
        .parse()
        .ok()
        .filter(|&p| p <= if ip.is_ipv4() { 32 } else { 128 })
        .ok_or_else(|| err(field, format!("`{s}` has a bad prefix length")))?;
    Ok((ip, p))
}

pub fn cidrs(field: &str, list: &[String]) -> Result<Vec<Cidr>, ConfigError> {
    list.iter()
        .enumerate()
        .map(|(i, s)| {
            s.parse::<Cidr>()
                .map_err(|e| err(&format!("{field}[{i}]"), e.to_string()))
        })
        .collect()
}

pub fn socket_addr(field: &str, s: &str) -> Result<SocketAddr, ConfigError> {
    s.parse()
        .map_err(|_| err(field, format!("`{s}` is not an IP:port")))
}

/// `ip` (port `default_port`) or `ip:port`.
pub fn server_addr(field: &str, s: &str, default_port: u16) -> Result<SocketAddr, ConfigError> {
    if let Ok(a) = s.parse::<SocketAddr>() {
        return Ok(a);
    }
    s.parse::<IpAddr>()
        .map(|ip| SocketAddr::new(ip, default_port))
        .map_err(|_| err(field, format!("`{s}` is not an IP or IP:port")))
}

pub fn mtu(field: &str, m: Option<u16>) -> Result<usize, ConfigError> {
    let m = m.unwrap_or(hcp_olm_tunnel_api::DEFAULT_MTU);
    if !(1280..=9000).contains(&m) {
        return Err(err(field, "must be between 1280 and 9000"));
    }
    Ok(usize::from(m))
}

pub fn config_error(field: &str, reason: impl Into<String>) -> ConfigError {
    err(field, reason)
}

/// `key_reload_seconds`: default 5 s, 0 disables.
pub fn reload_interval(s: Option<u64>) -> Option<Duration> {
    match s.unwrap_or(5) {
        0 => None,
        n => Some(Duration::from_secs(n)),
    }
}

/// Key rotation: every `interval`, `load` re-reads the config and key files (a Secret
/// volume's files change in place when the Secret does); keys that differ from the last
/// ones go to the tunnel. A file that does not parse is reported (field named, never key
/// bytes) and the keys in use stay.
pub fn spawn_key_reload<F>(
    interval: Duration,
    mut last: Keys,
    load: F,
    tx: tokio::sync::mpsc::Sender<Keys>,
    metrics: TunnelMetrics,
    cancel: tokio_util::sync::CancellationToken,
) where
    F: Fn() -> Result<Keys, ConfigError> + Send + 'static,
{
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tick.tick().await;
        let mut failing = false;
        loop {
            tokio::select! {
                _ = cancel.cancelled() => return,
                _ = tick.tick() => {}
            }
            match load() {
                Err(e) => {
                    metrics.key_reload(ReloadResult::error);
                    if !failing {
                        tracing::warn!(field = %e.field, reason = %e.reason,
                            "cannot reload tunnel keys; keeping the keys in use");
                    }
                    failing = true;
                }
                Ok(k) => {
                    if failing {
                        tracing::info!("tunnel key files readable again");
                    }
                    failing = false;
                    if k == last {
                        continue;
                    }
                    tracing::info!(
                        public_key = %k.private_key.public_key(),
                        peer_public_key = %k.peer_public_key,
                        previous_own = k.previous_private_keys.len(),
                        previous_peer = k.previous_peer_public_keys.len(),
                        "tunnel keys changed"
                    );
                    metrics.key_reload(ReloadResult::applied);
                    last = k.clone();
                    if tx.send(k).await.is_err() {
                        return;
                    }
                }
            }
        }
    });
}

#[derive(Debug, Clone, Copy, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)]
pub enum Proto {
    connect,
    socks,
    tunnel,
    exposed,
}

#[derive(Debug, Clone, Copy, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)]
pub enum ConnResult {
    ok,
    denied,
    bad_request,
    resolve_failed,
    dial_failed,
    /// Closed at once: `max_connections` relays were already running.
    over_limit,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ConnLabels {
    pub proto: Proto,
    pub result: ConnResult,
}

#[derive(Debug, Clone, Copy, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)]
pub enum ReloadResult {
    applied,
    error,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReloadLabels {
    pub result: ReloadResult,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DirLabels {
    pub direction: Dir,
}

#[derive(Debug, Clone, Copy, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)]
pub enum Dir {
    rx,
    tx,
}

/// Metrics both ends export.
#[derive(Debug, Clone)]
pub struct TunnelMetrics {
    pub handshake_age: Gauge<f64, AtomicU64>,
    pub bytes: Family<DirLabels, Counter>,
    pub connections: Family<ConnLabels, Counter>,
    pub dropped_datagrams: Counter,
    pub inner_packets: Family<DirLabels, Counter>,
    pub inbound_refused: Counter,
    pub key_reloads: Family<ReloadLabels, Counter>,
    pub rekeys: Counter,
    pub key_switches: Counter,
}

impl TunnelMetrics {
    pub fn register(r: &mut Registry) -> Self {
        let m = Self {
            handshake_age: Gauge::default(),
            bytes: Family::default(),
            connections: Family::default(),
            dropped_datagrams: Counter::default(),
            inner_packets: Family::default(),
            inbound_refused: Counter::default(),
            key_reloads: Family::default(),
            rekeys: Counter::default(),
            key_switches: Counter::default(),
        };
        r.register(
            "tunnel_handshake_age_seconds",
            "Seconds since the current session's handshake (-1 without a session)",
            m.handshake_age.clone(),
        );
        r.register(
            "tunnel_payload_bytes",
            "Payload bytes through the WireGuard session",
            m.bytes.clone(),
        );
        r.register(
            "tunnel_proxy_connections",
            "Proxied connections by protocol and result",
            m.connections.clone(),
        );
        r.register(
            "tunnel_dropped_datagrams",
            "WireGuard datagrams dropped (malformed, unauthenticated, replayed, ...)",
            m.dropped_datagrams.clone(),
        );
        r.register(
            "tunnel_inner_packets",
            "IP packets through the userspace stack",
            m.inner_packets.clone(),
        );
        r.register(
            "tunnel_inbound_refused",
            "Connections arriving through the tunnel that no policy allowed",
            m.inbound_refused.clone(),
        );
        r.register(
            "tunnel_key_reloads",
            "Key file reloads that changed the keys (applied) or could not be read (error)",
            m.key_reloads.clone(),
        );
        r.register(
            "tunnel_rekeys",
            "Key pairs put in use after a key change (each ends the old session)",
            m.rekeys.clone(),
        );
        r.register(
            "tunnel_key_switches",
            "Moves to another accepted key pair because the peer handshook with it",
            m.key_switches.clone(),
        );
        m
    }

    pub fn key_reload(&self, result: ReloadResult) {
        self.key_reloads
            .get_or_create(&ReloadLabels { result })
            .inc();
    }

    pub fn conn(&self, proto: Proto, result: ConnResult) {
        self.connections
            .get_or_create(&ConnLabels { proto, result })
            .inc();
    }

    /// Copies the peer status and stack counters into the metrics every second; sets
    /// `ready` while a session exists.
    pub fn spawn_updater(
        &self,
        mut status: watch::Receiver<PeerStatus>,
        stack: Arc<StackCounters>,
        handshake_done: Arc<AtomicBool>,
    ) {
        let m = self.clone();
        tokio::spawn(async move {
            let (mut rx0, mut tx0, mut drop0, mut pin0, mut pout0, mut ref0) = (0, 0, 0, 0, 0, 0);
            let (mut rk0, mut ks0) = (0, 0);
            loop {
                tokio::time::sleep(Duration::from_secs(1)).await;
                if status.has_changed().is_err() {
                    return;
                }
                let s = status.borrow_and_update().clone();
                m.handshake_age
                    .set(s.handshake_age.map_or(-1.0, |d| d.as_secs_f64()));
                handshake_done.store(s.handshake_age.is_some(), Ordering::SeqCst);
                let bump = |c: &Counter, last: &mut u64, now: u64| {
                    c.inc_by(now.saturating_sub(*last));
                    *last = now;
                };
                bump(
                    &m.bytes.get_or_create(&DirLabels { direction: Dir::rx }),
                    &mut rx0,
                    s.rx_bytes,
                );
                bump(
                    &m.bytes.get_or_create(&DirLabels { direction: Dir::tx }),
                    &mut tx0,
                    s.tx_bytes,
                );
                bump(
                    &m.dropped_datagrams,
                    &mut drop0,
                    s.counters.dropped.iter().sum(),
                );
                bump(
                    &m.inner_packets
                        .get_or_create(&DirLabels { direction: Dir::rx }),
                    &mut pin0,
                    stack.packets_in.load(Ordering::Relaxed),
                );
                bump(
                    &m.inner_packets
                        .get_or_create(&DirLabels { direction: Dir::tx }),
                    &mut pout0,
                    stack.packets_out.load(Ordering::Relaxed),
                );
                bump(
                    &m.inbound_refused,
                    &mut ref0,
                    stack.tcp_refused.load(Ordering::Relaxed),
                );
                bump(&m.rekeys, &mut rk0, s.counters.rekeys);
                bump(&m.key_switches, &mut ks0, s.counters.key_switches);
            }
        });
    }
}

#[derive(Clone)]
struct AdminState {
    handshake_done: Arc<AtomicBool>,
    draining: Arc<AtomicBool>,
    registry: Arc<Registry>,
}

/// Serves /healthz, /readyz (handshake done and not draining) and /metrics.
pub fn spawn_admin(
    listener: TcpListener,
    registry: Registry,
    handshake_done: Arc<AtomicBool>,
    draining: Arc<AtomicBool>,
) {
    let state = AdminState {
        handshake_done,
        draining,
        registry: Arc::new(registry),
    };
    let app = Router::new()
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics_handler))
        .with_state(state);
    tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, app).await {
            tracing::error!(error = %e, "admin server failed");
        }
    });
}

async fn readyz(State(s): State<AdminState>) -> impl IntoResponse {
    if s.draining.load(Ordering::SeqCst) {
        (StatusCode::SERVICE_UNAVAILABLE, "draining\n")
    } else if s.handshake_done.load(Ordering::SeqCst) {
        (StatusCode::OK, "ready\n")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "no tunnel handshake yet\n")
    }
}

async fn metrics_handler(State(s): State<AdminState>) -> impl IntoResponse {
    let mut body = String::new();
    match prometheus_client::encoding::text::encode(&mut body, &s.registry) {
        Ok(()) => (
            StatusCode::OK,
            [(
                header::CONTENT_TYPE,
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
            )],
            body,
        )
            .into_response(),
        Err(_) => StatusCode::INTERNAL_SERVER_ERROR.into_response(),
    }
}

/// Waits for SIGTERM or SIGINT.
pub async fn terminated() -> std::io::Result<()> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    tokio::select! {
        _ = term.recv() => tracing::info!("SIGTERM: draining"),
        _ = int.recv() => tracing::info!("SIGINT: draining"),
    }
    Ok(())
}
