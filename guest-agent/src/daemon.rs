//! What the daemons share: config and key loading with field-named errors, the metrics
//! registry and admin server (/healthz /readyz /metrics, from [`hcp_olm_binkit::admin`]),
//! the tunnel metrics of the gateway and agent, those of `hcp-olm-tunnel`
//! ([`tun_registry`]), and relay tasks.

use std::net::{IpAddr, SocketAddr};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, SystemTime};

use hcp_olm_binkit::admin::Admin;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{
    DescriptorEncoder, EncodeLabelSet, EncodeLabelValue, EncodeMetric,
};
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};
use prometheus_client::registry::Registry;
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::dns::ConfigError;
use crate::stack::StackCounters;
use crate::tunnel::{Cidr, DropReason, Keys, PeerStatus, PrivateKey, PublicKey};

/// A daemon's metrics registry: names get the `hcp_olm_` prefix, and
/// `hcp_olm_build_info{version,binary}` is registered.
pub fn registry(binary: &str) -> Registry {
    hcp_olm_binkit::admin::registry(binary, env!("CARGO_PKG_VERSION"))
}

/// Unix seconds of `t` (0 for `None`: never).
fn unix_seconds(t: Option<SystemTime>) -> i64 {
    t.and_then(|t| t.duration_since(SystemTime::UNIX_EPOCH).ok())
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
}

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

/// Both ends' addresses inside the tunnel and the guest ranges routed into it, parsed the
/// same way by the agent and the gateway (each names its own fields).
#[derive(Debug, Clone)]
pub struct TunnelAddressing {
    /// This end's IPv4 address with prefix.
    pub own: (IpAddr, u8),
    /// The other end's IPv4 address with prefix.
    pub other: (IpAddr, u8),
    /// The optional IPv6 pair (see [`tunnel_pair6`]).
    pub pair6: Option<TunnelPair6>,
    /// The guest ranges (see [`guest_ranges`]).
    pub ranges: Vec<Cidr>,
}

/// Parses [`TunnelAddressing`]: `v4` and `v6` are (field, value) of this end, then of the
/// other end; `ranges` the field and list of guest ranges.
pub fn tunnel_addressing(
    v4: [(&str, &str); 2],
    v6: [(&str, Option<&str>); 2],
    ranges: (&str, &[String]),
) -> Result<TunnelAddressing, ConfigError> {
    let own = interface_address(v4[0].0, v4[0].1)?;
    let other = interface_address(v4[1].0, v4[1].1)?;
    let pair6 = tunnel_pair6(v6[0].0, v6[0].1, v6[1].0, v6[1].1)?;
    let mut tunnel = vec![own, other];
    if let Some((own6, other6)) = pair6 {
        tunnel.extend([own6, (other6, own6.1)]);
    }
    let ranges = guest_ranges(
        ranges.0,
        ranges.1,
        &tunnel,
        &format!("{} and {}", v6[0].0, v6[1].0),
    )?;
    Ok(TunnelAddressing {
        own,
        other,
        pair6,
        ranges,
    })
}

/// Guest ranges routed into the tunnel; a /0 is refused (it would send every address there).
pub fn cidrs(field: &str, list: &[String]) -> Result<Vec<Cidr>, ConfigError> {
    list.iter()
        .enumerate()
        .map(|(i, s)| {
            let f = format!("{field}[{i}]");
            if s.trim().ends_with("/0") {
                return Err(err(
                    &f,
                    format!("`{s}`: a /0 would send every address into the tunnel"),
                ));
            }
            s.parse::<Cidr>().map_err(|e| err(&f, e.to_string()))
        })
        .collect()
}

/// The IPv6 pair inside the tunnel: this end's address with its prefix, and the other end's
/// address.
pub type TunnelPair6 = ((IpAddr, u8), IpAddr);

/// The optional IPv6 pair inside the tunnel: this end's address with prefix (`own`) and the
/// other end's (`other`, its prefix ignored). Both or neither; each must be IPv6. `None`:
/// IPv4 only inside.
pub fn tunnel_pair6(
    own_field: &str,
    own: Option<&str>,
    other_field: &str,
    other: Option<&str>,
) -> Result<Option<TunnelPair6>, ConfigError> {
    let v6 = |field: &str, s: &str| {
        let a = interface_address(field, s)?;
        if !a.0.is_ipv6() {
            return Err(err(field, format!("`{s}` is not an IPv6 address")));
        }
        Ok(a)
    };
    match (own, other) {
        (None, None) => Ok(None),
        (Some(o), Some(p)) => Ok(Some((v6(own_field, o)?, v6(other_field, p)?.0))),
        (Some(_), None) => Err(err(
            other_field,
            format!("required when `{own_field}` is set (both or neither)"),
        )),
        (None, Some(_)) => Err(err(
            own_field,
            format!("required when `{other_field}` is set (both or neither)"),
        )),
    }
}

/// Guest ranges routed into the tunnel (see [`cidrs`]), checked against the tunnel's own
/// addresses: an IPv6 range needs the IPv6 pair (`v6`, named by `v6_field` in the error),
/// and no range may overlap a tunnel address's prefix (`tunnel`: every configured tunnel
/// address with its prefix).
pub fn guest_ranges(
    field: &str,
    list: &[String],
    tunnel: &[(IpAddr, u8)],
    v6_field: &str,
) -> Result<Vec<Cidr>, ConfigError> {
    let ranges = cidrs(field, list)?;
    let has_v6 = tunnel.iter().any(|(a, _)| a.is_ipv6());
    for (i, r) in ranges.iter().enumerate() {
        let f = format!("{field}[{i}]");
        if r.addr().is_ipv6() && !has_v6 {
            return Err(err(
                &f,
                format!(
                    "`{}`: an IPv6 range needs the IPv6 tunnel pair (`{v6_field}`)",
                    list[i]
                ),
            ));
        }
        if let Some((a, p)) = tunnel.iter().find(|(a, p)| Cidr::new(*a, *p).overlaps(r)) {
            let net = Cidr::new(*a, *p);
            return Err(err(
                &f,
                format!(
                    "`{}` overlaps the tunnel's own range {}/{p}",
                    list[i],
                    net.network()
                ),
            ));
        }
    }
    Ok(ranges)
}

/// Why an endpoint's (`ip:port`) IP cannot be dialled for the tunnel (`None`: it can; names
/// and loopback pass).
pub fn unusable_endpoint(endpoint: &str) -> Option<&'static str> {
    let ip: IpAddr = endpoint.parse::<SocketAddr>().ok()?.ip();
    hcp_olm_tunnel_api::unusable_endpoint_ip(ip)
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
    last: Keys,
    load: F,
    tx: tokio::sync::mpsc::Sender<Keys>,
    metrics: TunnelMetrics,
    cancel: tokio_util::sync::CancellationToken,
) where
    F: Fn() -> Result<Keys, ConfigError> + Send + 'static,
{
    spawn_key_reload_reporting(
        interval,
        last,
        load,
        tx,
        move |r| metrics.key_reload(r),
        cancel,
    );
}

/// [`spawn_key_reload`] reporting each reload's result to `report` (the TUN daemon counts
/// them in its own registry).
pub fn spawn_key_reload_reporting<F, R>(
    interval: Duration,
    mut last: Keys,
    load: F,
    tx: tokio::sync::mpsc::Sender<Keys>,
    report: R,
    cancel: tokio_util::sync::CancellationToken,
) where
    F: Fn() -> Result<Keys, ConfigError> + Send + 'static,
    R: Fn(ReloadResult) + Send + 'static,
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
                    report(ReloadResult::error);
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
                    report(ReloadResult::applied);
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
    /// A connection another gateway replica forwarded.
    peer,
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
    /// Handed to the replica that holds the tunnel session.
    forwarded,
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

/// Metrics both ends export (`hcp_olm_tunnel_*`).
#[derive(Debug, Clone)]
pub struct TunnelMetrics {
    /// Unix seconds of the last completed handshake, 0 before the first.
    pub last_handshake: Gauge,
    pub bytes: Family<DirLabels, Counter>,
    pub connections: Family<ConnLabels, Counter>,
    pub dropped_datagrams: Counter,
    pub inner_packets: Family<DirLabels, Counter>,
    pub inbound_refused: Counter,
    pub key_reloads: Family<ReloadLabels, Counter>,
    pub rekeys: Counter,
    pub key_switches: Counter,
    pub handshake_offers: Counter,
}

impl TunnelMetrics {
    pub fn register(r: &mut Registry) -> Self {
        let m = Self {
            last_handshake: Gauge::default(),
            bytes: Family::default(),
            connections: Family::default(),
            dropped_datagrams: Counter::default(),
            inner_packets: Family::default(),
            inbound_refused: Counter::default(),
            key_reloads: Family::default(),
            rekeys: Counter::default(),
            key_switches: Counter::default(),
            handshake_offers: Counter::default(),
        };
        r.register(
            "tunnel_last_handshake_timestamp_seconds",
            "Unix time of the last completed WireGuard handshake (0: none yet)",
            m.last_handshake.clone(),
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
        r.register(
            "tunnel_handshake_offers",
            "Handshakes offered to the sender of data for a session this replica does not hold",
            m.handshake_offers.clone(),
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
            let (mut rk0, mut ks0, mut ho0) = (0, 0, 0);
            loop {
                tokio::time::sleep(Duration::from_secs(1)).await;
                if status.has_changed().is_err() {
                    return;
                }
                let s = status.borrow_and_update().clone();
                m.last_handshake.set(unix_seconds(s.last_handshake));
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
                bump(&m.handshake_offers, &mut ho0, s.counters.solicited);
            }
        });
    }
}

/// Serves /healthz, /readyz (`ready` set and not draining) and /metrics.
pub fn spawn_admin(
    listener: TcpListener,
    registry: Registry,
    ready: Arc<AtomicBool>,
    draining: Arc<AtomicBool>,
) {
    let readyz = move || {
        if draining.load(Ordering::SeqCst) {
            Err("draining".to_string())
        } else if ready.load(Ordering::SeqCst) {
            Ok("ready".to_string())
        } else {
            Err("no tunnel handshake yet".to_string())
        }
    };
    Admin::new(registry)
        .readyz(readyz)
        .spawn(listener, std::future::pending());
}

/// The registry of `hcp-olm-tunnel` (TUN mode): `hcp_olm_tunnel_*{tun="<device>"}`, read
/// from the tunnel's status at each scrape.
pub fn tun_registry(
    status: impl Fn() -> PeerStatus + Send + Sync + 'static,
    tun: &str,
) -> (Registry, Family<ReloadLabels, Counter>) {
    let mut r = registry("hcp-olm-tunnel");
    let key_reloads = Family::<ReloadLabels, Counter>::default();
    r.register(
        "tunnel_key_reloads",
        "Key file reloads that changed the keys, or failed",
        key_reloads.clone(),
    );
    r.sub_registry_with_label(("tun".into(), tun.to_string().into()))
        .register_collector(Box::new(TunCollector {
            status: Box::new(status),
        }));
    (r, key_reloads)
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabels {
    reason: &'static str,
}

/// Reads the tunnel's counters when scraped: not the status the timer task publishes each
/// tick, which a scrape right after a burst would see before the burst.
struct TunCollector {
    status: Box<dyn Fn() -> PeerStatus + Send + Sync>,
}

impl std::fmt::Debug for TunCollector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TunCollector").finish_non_exhaustive()
    }
}

impl TunCollector {
    fn counter(e: &mut DescriptorEncoder<'_>, name: &str, help: &str, v: u64) -> std::fmt::Result {
        let c = ConstCounter::new(v);
        c.encode(e.encode_descriptor(name, help, None, c.metric_type())?)
    }

    fn rx_tx(
        e: &mut DescriptorEncoder<'_>,
        name: &str,
        help: &str,
        rx: u64,
        tx: u64,
    ) -> std::fmt::Result {
        let mut f = e.encode_descriptor(name, help, None, ConstCounter::new(0u64).metric_type())?;
        for (direction, v) in [(Dir::rx, rx), (Dir::tx, tx)] {
            ConstCounter::new(v).encode(f.encode_family(&DirLabels { direction })?)?;
        }
        Ok(())
    }
}

impl Collector for TunCollector {
    fn encode(&self, mut e: DescriptorEncoder<'_>) -> std::fmt::Result {
        let st = (self.status)();
        let c = &st.counters;
        Self::rx_tx(
            &mut e,
            "tunnel_datagrams",
            "WireGuard datagrams received (rx) and sent (tx)",
            c.datagrams_in,
            c.datagrams_out,
        )?;
        Self::rx_tx(
            &mut e,
            "tunnel_datagram_bytes",
            "WireGuard datagram bytes received (rx) and sent (tx)",
            c.bytes_in,
            c.bytes_out,
        )?;
        Self::rx_tx(
            &mut e,
            "tunnel_inner_packets",
            "IP packets written to the TUN device (rx) and read from it and encapsulated (tx)",
            c.packets_delivered,
            c.packets_sent,
        )?;
        Self::counter(&mut e, "tunnel_roams", "Peer endpoint changes", c.roams)?;
        Self::counter(
            &mut e,
            "tunnel_dead_peer_restarts",
            "Handshakes restarted after the peer went silent",
            c.dead_peer_restarts,
        )?;
        {
            let mut f = e.encode_descriptor(
                "tunnel_dropped",
                "Datagrams or packets dropped, by reason",
                None,
                ConstCounter::new(0u64).metric_type(),
            )?;
            for r in DropReason::ALL {
                ConstCounter::new(c.dropped(r))
                    .encode(f.encode_family(&ReasonLabels { reason: r.as_str() })?)?;
            }
        }
        let g = ConstGauge::new(unix_seconds(st.last_handshake));
        g.encode(e.encode_descriptor(
            "tunnel_last_handshake_timestamp_seconds",
            "Unix time of the last completed WireGuard handshake (0: none yet)",
            None,
            g.metric_type(),
        )?)
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

/// What every tunnel daemon runs beside its tunnel: the metrics updater and, when
/// `reload` is `Some((interval, load))`, the key reload (new keys go to `keys_tx`). The
/// returned flag is set while a session exists.
pub fn spawn_tunnel_upkeep<F>(
    metrics: &TunnelMetrics,
    status: watch::Receiver<PeerStatus>,
    counters: Arc<StackCounters>,
    reload: Option<(Duration, F)>,
    keys: (Keys, tokio::sync::mpsc::Sender<Keys>),
    cancel: tokio_util::sync::CancellationToken,
) -> Arc<AtomicBool>
where
    F: Fn() -> Result<Keys, ConfigError> + Send + 'static,
{
    let session = Arc::new(AtomicBool::new(false));
    metrics.spawn_updater(status, counters, Arc::clone(&session));
    if let Some((every, load)) = reload {
        spawn_key_reload(every, keys.0, load, keys.1, metrics.clone(), cancel);
    }
    session
}

/// Serves each item of `rx` (a connection or a dial the tunnel's stack hands over) on
/// `tracker` until `cancel` or the channel ends. `serve` turns an item into its task, or
/// returns `None` to refuse it (the item is dropped, e.g. over the connection bound).
/// The agent and the gateway both run their tunnel's inbound connections this way.
pub fn spawn_serving<T, Fut>(
    cancel: tokio_util::sync::CancellationToken,
    tracker: tokio_util::task::TaskTracker,
    mut rx: tokio::sync::mpsc::Receiver<T>,
    mut serve: impl FnMut(T) -> Option<Fut> + Send + 'static,
) where
    T: Send + 'static,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    tokio::spawn(async move {
        loop {
            let item = tokio::select! {
                _ = cancel.cancelled() => return,
                i = rx.recv() => match i { Some(i) => i, None => return },
            };
            if let Some(task) = serve(item) {
                tracker.spawn(task);
            }
        }
    });
}

/// The first half of a SIGTERM drain: marks the daemon draining (`/readyz` fails),
/// stops the listeners, and waits up to `within` for the tasks on `tracker`. True when
/// they all finished.
pub async fn drain(
    draining: &AtomicBool,
    listeners: &tokio_util::sync::CancellationToken,
    tracker: &tokio_util::task::TaskTracker,
    within: Duration,
) -> bool {
    draining.store(true, Ordering::SeqCst);
    listeners.cancel();
    tracker.close();
    tokio::time::timeout(within, tracker.wait()).await.is_ok()
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;
    use crate::server::DnsMetrics;
    use crate::tunnel::{Peer, PeerConfig};

    /// Checks the exposition `text` against the Prometheus naming conventions and returns
    /// the exposed names (`name_total` for counters, `name_info` for infos, else `name`),
    /// sorted. (A family without series is not encoded: touch every one first.)
    fn exposed_names(text: &str) -> Vec<String> {
        let mut names = Vec::new();
        let mut types = std::collections::HashMap::new();
        for l in text.lines() {
            let Some(rest) = l.strip_prefix("# TYPE ") else {
                continue;
            };
            let (name, ty) = rest.split_once(' ').expect("TYPE line");
            assert!(name.starts_with("hcp_olm_"), "unprefixed: {l}");
            assert!(
                !name.ends_with("_total"),
                "a family name ends in _total: {l}"
            );
            for unit in ["bytes", "seconds"] {
                assert!(
                    !name.contains(unit) || name.ends_with(&format!("_{unit}")),
                    "{name}: the unit ({unit}) goes last"
                );
            }
            let exposed = match ty {
                "counter" => format!("{name}_total"),
                "info" => format!("{name}_info"),
                "gauge" => name.to_string(),
                other => panic!("unexpected type {other}: {l}"),
            };
            assert!(
                types.insert(name.to_string(), ty.to_string()).is_none(),
                "twice: {l}"
            );
            names.push(exposed);
        }
        names.sort();
        let mut series = BTreeSet::new();
        for l in text
            .lines()
            .filter(|l| !l.starts_with('#') && !l.is_empty())
        {
            let (s, _value) = l.rsplit_once(' ').expect("sample");
            assert!(series.insert(s.to_string()), "duplicated series: {l}");
            let name = s.split('{').next().unwrap_or(s);
            assert!(
                names.iter().any(|n| n == name),
                "sample {name} of no declared family (counters end in _total): {l}"
            );
        }
        let build = format!(
            "hcp_olm_build_info{{version=\"{}\"",
            env!("CARGO_PKG_VERSION")
        );
        assert!(
            text.lines()
                .any(|l| l.starts_with(&build) && l.ends_with("} 1")),
            "{build}... 1 missing in\n{text}"
        );
        assert!(!text.contains("handshake_age"), "{text}");
        names
    }

    fn encode(r: &Registry) -> String {
        hcp_olm_binkit::admin::encode(r).expect("encode")
    }

    const TUNNEL: [&str; 10] = [
        "hcp_olm_tunnel_last_handshake_timestamp_seconds",
        "hcp_olm_tunnel_payload_bytes_total",
        "hcp_olm_tunnel_proxy_connections_total",
        "hcp_olm_tunnel_dropped_datagrams_total",
        "hcp_olm_tunnel_inner_packets_total",
        "hcp_olm_tunnel_inbound_refused_total",
        "hcp_olm_tunnel_key_reloads_total",
        "hcp_olm_tunnel_rekeys_total",
        "hcp_olm_tunnel_key_switches_total",
        "hcp_olm_tunnel_handshake_offers_total",
    ];

    const DNS: [&str; 9] = [
        "hcp_olm_dns_queries_total",
        "hcp_olm_dns_cache_hits_total",
        "hcp_olm_dns_stale_answers_total",
        "hcp_olm_dns_truncated_total",
        "hcp_olm_dns_malformed_total",
        "hcp_olm_dns_upstream_attempts_total",
        "hcp_olm_dns_overloaded_total",
        "hcp_olm_dns_clients_refused_total",
        "hcp_olm_dns_rate_limited_total",
    ];

    fn touch_tunnel(m: &TunnelMetrics) {
        m.last_handshake.set(1_700_000_000);
        m.bytes
            .get_or_create(&DirLabels { direction: Dir::rx })
            .inc();
        m.inner_packets
            .get_or_create(&DirLabels { direction: Dir::tx })
            .inc();
        m.conn(Proto::connect, ConnResult::ok);
        m.key_reload(ReloadResult::applied);
    }

    fn touch_dns(m: &DnsMetrics) {
        use crate::server::metrics::{OwnerLabel, QueryLabels, ResultLabel, SourceLabel};
        m.queries
            .get_or_create(&QueryLabels {
                owner: OwnerLabel::guest,
                result: ResultLabel::noerror,
                source: SourceLabel::upstream,
            })
            .inc();
        m.dropped();
        m.upstream(
            crate::dns::Owner::Guest,
            crate::server::metrics::UpstreamResultLabel::answer,
        );
    }

    /// `rest` and `hcp_olm_build_info`, sorted.
    fn with_build(rest: &[&str]) -> Vec<String> {
        let mut v: Vec<String> = std::iter::once("hcp_olm_build_info")
            .chain(rest.iter().copied())
            .map(String::from)
            .collect();
        v.sort();
        v
    }

    #[test]
    fn agent_metric_names_follow_prometheus_conventions() {
        let (r, tunnel, dns) = crate::agent::metrics();
        touch_tunnel(&tunnel);
        dns.get_or_create(&crate::agent::DnsLabels {
            transport: "udp",
            result: "forwarded",
        })
        .inc();
        let text = encode(&r);
        let want: Vec<&str> = TUNNEL
            .iter()
            .copied()
            .chain(["hcp_olm_agent_dns_queries_total"])
            .collect();
        assert_eq!(exposed_names(&text), with_build(&want), "{text}");
        assert!(text.contains("binary=\"hcp-olm-agent\""), "{text}");
        assert!(
            text.contains("hcp_olm_tunnel_last_handshake_timestamp_seconds 1700000000"),
            "{text}"
        );
        assert!(
            text.contains(
                "hcp_olm_agent_dns_queries_total{transport=\"udp\",result=\"forwarded\"} 1"
            ),
            "{text}"
        );
    }

    #[test]
    fn gateway_metric_names_follow_prometheus_conventions() {
        let (r, dns, tunnel) = crate::gateway::metrics();
        touch_tunnel(&tunnel);
        touch_dns(&dns);
        let text = encode(&r);
        let want: Vec<&str> = DNS.iter().chain(TUNNEL.iter()).copied().collect();
        assert_eq!(exposed_names(&text), with_build(&want), "{text}");
        assert!(text.contains("binary=\"hcp-olm-gateway\""), "{text}");
        assert!(
            text.contains("hcp_olm_tunnel_payload_bytes_total{direction=\"rx\"} 1"),
            "{text}"
        );
    }

    #[test]
    fn dns_metric_names_follow_prometheus_conventions() {
        let (r, dns) = DnsMetrics::standalone();
        touch_dns(&dns);
        let text = encode(&r);
        assert_eq!(exposed_names(&text), with_build(&DNS), "{text}");
        assert!(text.contains("binary=\"hcp-olm-dns\""), "{text}");
    }

    #[test]
    fn tun_metric_names_follow_prometheus_conventions() {
        let peer = Peer::new(PeerConfig {
            private_key: PrivateKey::generate(),
            peer_public_key: PrivateKey::generate().public_key(),
            preshared_key: None,
            endpoint: None,
            persistent_keepalive: None,
            dead_peer_timeout: None,
            allowed_ips: vec![],
            index: 1,
            previous_private_keys: Vec::new(),
            previous_peer_public_keys: Vec::new(),
            solicit_after: None,
        });
        let mut st = peer.status();
        let (tx, rx) = watch::channel(st.clone());
        let (r, reloads) = tun_registry(move || rx.borrow().clone(), "hcpolm0");
        reloads
            .get_or_create(&ReloadLabels {
                result: ReloadResult::applied,
            })
            .inc();
        let text = encode(&r);
        assert_eq!(
            exposed_names(&text),
            with_build(&[
                "hcp_olm_tunnel_key_reloads_total",
                "hcp_olm_tunnel_datagrams_total",
                "hcp_olm_tunnel_datagram_bytes_total",
                "hcp_olm_tunnel_inner_packets_total",
                "hcp_olm_tunnel_roams_total",
                "hcp_olm_tunnel_dead_peer_restarts_total",
                "hcp_olm_tunnel_dropped_total",
                "hcp_olm_tunnel_last_handshake_timestamp_seconds",
            ]),
            "{text}"
        );
        assert!(text.contains("binary=\"hcp-olm-tunnel\""), "{text}");
        assert!(
            text.contains("hcp_olm_tunnel_last_handshake_timestamp_seconds{tun=\"hcpolm0\"} 0"),
            "never: 0\n{text}"
        );
        // read at each scrape
        st.counters.packets_delivered = 1234;
        st.counters.bytes_out = 99;
        st.last_handshake = Some(SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000));
        tx.send_replace(st);
        let text = encode(&r);
        for want in [
            "hcp_olm_tunnel_inner_packets_total{tun=\"hcpolm0\",direction=\"rx\"} 1234",
            "hcp_olm_tunnel_datagram_bytes_total{tun=\"hcpolm0\",direction=\"tx\"} 99",
            "hcp_olm_tunnel_dropped_total{tun=\"hcpolm0\",reason=\"unauthenticated\"} 0",
            "hcp_olm_tunnel_last_handshake_timestamp_seconds{tun=\"hcpolm0\"} 1700000000",
        ] {
            assert!(text.contains(want), "{want} missing in\n{text}");
        }
    }
}
