//! The guest agent: dials the gateway (guest → management only), runs a userspace stack in
//! "any IP" mode for connections the gateway opens and relays each to the real guest address
//! with an OS socket when the destination is allowed (CIDRs + ports), forwards tunnel DNS
//! (UDP and TCP on its tunnel address, port 53) to the guest DNS, and listens on local ports
//! for exposed control-plane services, carrying them through the tunnel to the gateway.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};

use bytes::Bytes;
use hcp_olm_tunnel_api::AgentPeerConfig;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;
use tokio::net::{TcpListener, TcpStream, UdpSocket};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::daemon::{self, ConnResult, Proto, TunnelMetrics};
use crate::dns::ConfigError;
use crate::stack::{self, Stack, StackConfig, TcpConn, UdpSender};
use crate::tunnel::{Cidr, Keys, Peer, PeerConfig, driver};

const DIAL_TIMEOUT: Duration = Duration::from_secs(10);
const DNS_TIMEOUT: Duration = Duration::from_secs(3);
const DNS_PORT: u16 = 53;

/// The agent's keys from its config: its private key (inline or file) and the gateway's
/// public key.
pub fn agent_keys(c: &AgentPeerConfig) -> Result<Keys, ConfigError> {
    use daemon::*;
    Ok(Keys {
        private_key: private_key(
            c.private_key.as_deref(),
            c.private_key_file.as_deref(),
            "private_key",
            "private_key_file",
        )?,
        peer_public_key: public_key("gateway_public_key", &c.gateway_public_key)?,
        preshared_key: None,
        previous_private_keys: Vec::new(),
        previous_peer_public_keys: Vec::new(),
    })
}

/// Validated agent settings.
#[derive(Debug)]
pub struct AgentSettings {
    /// Gateway endpoint as configured (resolved at start).
    pub gateway_endpoint: String,
    /// Own key and the gateway's.
    pub keys: Keys,
    /// Where the config was read from, for key reloads (set by the binary).
    pub config_path: Option<std::path::PathBuf>,
    pub key_reload: Option<Duration>,
    pub tunnel: (IpAddr, u8),
    pub gateway_ip: IpAddr,
    /// The IPv6 pair inside the tunnel (own address with prefix, the gateway's), if
    /// configured.
    pub tunnel6: Option<daemon::TunnelPair6>,
    pub keepalive: u16,
    pub allowed_cidrs: Vec<Cidr>,
    pub allowed_ports: Vec<u16>,
    pub guest_dns: Vec<SocketAddr>,
    /// (listen port = tunnel port, name)
    pub exposed: Vec<(u16, String)>,
    pub exposed_listen: IpAddr,
    pub health_listen: SocketAddr,
    pub mtu: usize,
    pub drain_timeout: Duration,
    /// Relayed connections at once (both directions).
    pub max_connections: u32,
    /// Relays on which nothing moved for this long are closed.
    pub idle_timeout: Duration,
}

impl AgentSettings {
    pub fn from_config(c: &AgentPeerConfig) -> Result<Self, ConfigError> {
        use daemon::{config_error as err, *};
        let gateway_endpoint = c
            .gateway_endpoint
            .clone()
            .filter(|e| !e.trim().is_empty())
            .ok_or_else(|| err("gateway_endpoint", "not known yet (required)"))?;
        if gateway_endpoint
            .rsplit_once(':')
            .is_none_or(|(h, p)| h.is_empty() || p.parse::<u16>().is_err())
        {
            return Err(err(
                "gateway_endpoint",
                format!("`{gateway_endpoint}` is not host:port"),
            ));
        }
        if let Some(why) = daemon::unusable_endpoint(&gateway_endpoint) {
            return Err(err(
                "gateway_endpoint",
                format!("`{gateway_endpoint}` is a {why} address"),
            ));
        }
        let keys = agent_keys(c)?;
        let TunnelAddressing {
            own: tunnel,
            other: (gateway_ip, _),
            pair6: tunnel6,
            ranges: allowed_cidrs,
        } = tunnel_addressing(
            [
                ("tunnel_address", &c.tunnel_address),
                ("gateway_tunnel_address", &c.gateway_tunnel_address),
            ],
            [
                ("tunnel_address6", c.tunnel_address6.as_deref()),
                (
                    "gateway_tunnel_address6",
                    c.gateway_tunnel_address6.as_deref(),
                ),
            ],
            ("allowed_cidrs", &c.allowed_cidrs),
        )?;
        let mut allowed_ports = c.allowed_ports.clone();
        if allowed_ports.is_empty() {
            allowed_ports = c.allowed_services.iter().map(|a| a.port).collect();
        }
        if allowed_ports.contains(&0) {
            return Err(err("allowed_ports", "port 0 is not a port"));
        }
        let guest_dns = c
            .guest_dns
            .iter()
            .enumerate()
            .map(|(i, s)| server_addr(&format!("guest_dns[{i}]"), s, DNS_PORT))
            .collect::<Result<Vec<_>, _>>()?;
        let mut exposed: Vec<(u16, String)> = Vec::new();
        for (i, e) in c.exposed_services.iter().enumerate() {
            if e.listen_port == 0 || exposed.iter().any(|(p, _)| *p == e.listen_port) {
                return Err(err(
                    &format!("exposed_services[{i}].listen_port"),
                    "must be non-zero and unique",
                ));
            }
            exposed.push((e.listen_port, e.name.clone()));
        }
        let el = c.exposed_listen_address.as_deref().unwrap_or("0.0.0.0");
        let exposed_listen = el
            .parse()
            .map_err(|_| err("exposed_listen_address", format!("`{el}` is not an IP")))?;
        let health_listen = socket_addr(
            "health_listen",
            c.health_listen.as_deref().unwrap_or("0.0.0.0:9090"),
        )?;
        let max_connections = match c.max_connections {
            Some(0) => return Err(err("max_connections", "must be at least 1")),
            v => v.unwrap_or(crate::gateway::DEFAULT_MAX_CONNECTIONS),
        };
        let idle_timeout = match c.idle_timeout_seconds {
            Some(0) => return Err(err("idle_timeout_seconds", "must be at least 1")),
            v => Duration::from_secs(v.unwrap_or(crate::gateway::DEFAULT_IDLE_TIMEOUT_SECONDS)),
        };
        if c.persistent_keepalive_seconds == 0 {
            return Err(err(
                "persistent_keepalive_seconds",
                "must be > 0 (the agent is behind NAT and detects a restarted gateway by it)",
            ));
        }
        Ok(Self {
            gateway_endpoint,
            keys,
            config_path: None,
            key_reload: daemon::reload_interval(c.key_reload_seconds),
            tunnel,
            gateway_ip,
            tunnel6,
            keepalive: c.persistent_keepalive_seconds,
            allowed_cidrs,
            allowed_ports,
            guest_dns,
            exposed,
            exposed_listen,
            health_listen,
            mtu: mtu("mtu", c.mtu)?,
            drain_timeout: Duration::from_secs(c.drain_timeout_seconds.unwrap_or(10)),
            max_connections,
            idle_timeout,
        })
    }

    /// Whether `ip` is one of our tunnel addresses (IPv4, or IPv6 when configured).
    pub fn is_own_tunnel_ip(&self, ip: IpAddr) -> bool {
        ip == self.tunnel.0 || self.tunnel6.is_some_and(|((a, _), _)| a == ip)
    }

    /// Whether `ip` is one of the gateway's tunnel addresses.
    pub fn is_gateway_ip(&self, ip: IpAddr) -> bool {
        ip == self.gateway_ip || self.tunnel6.is_some_and(|(_, g)| g == ip)
    }

    /// Whether the gateway may open a connection to `dst` through us.
    pub fn destination_allowed(&self, dst: SocketAddr) -> bool {
        if self.is_own_tunnel_ip(dst.ip()) {
            return dst.port() == DNS_PORT && !self.guest_dns.is_empty();
        }
        self.allowed_ports.contains(&dst.port())
            && self.allowed_cidrs.iter().any(|c| c.contains(dst.ip()))
    }
}

struct Shared {
    s: AgentSettings,
    stack: Stack,
    metrics: TunnelMetrics,
    dns_queries: Family<DnsLabels, Counter>,
    tracker: TaskTracker,
    cancel: CancellationToken,
    /// One permit per relayed connection (`max_connections`).
    slots: Arc<tokio::sync::Semaphore>,
    /// Guest connections dialled for a held SYN, waiting for their tunnel side, by
    /// (tunnel source, destination); entries unclaimed after [`PRE_DIALED_TTL`] are dropped.
    pre_dialed: std::sync::Mutex<HashMap<(SocketAddr, SocketAddr), (Instant, TcpStream)>>,
}

/// How long a guest connection dialled ahead waits for its tunnel side.
const PRE_DIALED_TTL: Duration = Duration::from_secs(30);

impl Shared {
    fn slot(&self, proto: Proto) -> Option<tokio::sync::OwnedSemaphorePermit> {
        let p = Arc::clone(&self.slots).try_acquire_owned().ok();
        if p.is_none() {
            self.metrics.conn(proto, ConnResult::over_limit);
            tracing::warn!(
                ?proto,
                max_connections = self.s.max_connections,
                "connection refused: max_connections reached"
            );
        }
        p
    }
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, prometheus_client::encoding::EncodeLabelSet)]
pub(crate) struct DnsLabels {
    pub(crate) transport: &'static str,
    pub(crate) result: &'static str,
}

/// The agent's registry: build info, the tunnel metrics and the DNS it forwards.
pub(crate) fn metrics() -> (Registry, TunnelMetrics, Family<DnsLabels, Counter>) {
    let mut registry = daemon::registry("hcp-olm-agent");
    let metrics = TunnelMetrics::register(&mut registry);
    let dns_queries = Family::<DnsLabels, Counter>::default();
    registry.register(
        "agent_dns_queries",
        "DNS queries from the tunnel forwarded to the guest DNS",
        dns_queries.clone(),
    );
    (registry, metrics, dns_queries)
}

/// How often a silent peer's name is resolved again.
const RESOLVE_EVERY: Duration = Duration::from_secs(5);

/// Whether `endpoint` (`host:port`) names its host by an IP address.
fn is_ip_literal(endpoint: &str) -> bool {
    endpoint.parse::<SocketAddr>().is_ok()
}

/// Follows a gateway that changes address: every [`RESOLVE_EVERY`] while nothing
/// authenticated has arrived for two keepalive intervals (or ever), resolves `name` again and
/// sends an address that differs from the current one (same family as `first`) to `tx`.
fn spawn_endpoint_follower(
    name: String,
    first: SocketAddr,
    status: tokio::sync::watch::Receiver<crate::tunnel::PeerStatus>,
    tx: tokio::sync::mpsc::Sender<SocketAddr>,
    keepalive: u16,
    cancel: CancellationToken,
) {
    let silent_after = Duration::from_secs(u64::from(keepalive.max(1)) * 2);
    tokio::spawn(async move {
        let mut current = first;
        let mut tick = tokio::time::interval(RESOLVE_EVERY);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = cancel.cancelled() => return,
                _ = tick.tick() => {}
            }
            let silent = status
                .borrow()
                .since_authenticated
                .is_none_or(|a| a >= silent_after);
            if !silent {
                continue;
            }
            let found = match tokio::net::lookup_host(name.as_str()).await {
                Ok(addrs) => addrs
                    .filter(|a| a.is_ipv4() == first.is_ipv4())
                    .filter(|a| hcp_olm_tunnel_api::unusable_endpoint_ip(a.ip()).is_none())
                    .collect::<Vec<_>>(),
                Err(e) => {
                    tracing::debug!(%name, error = %e, "cannot resolve the gateway again");
                    continue;
                }
            };
            if found.is_empty() || found.contains(&current) {
                continue;
            }
            let next = found[0];
            tracing::info!(%name, from = %current, to = %next, "gateway address changed");
            current = next;
            if tx.send(next).await.is_err() {
                return;
            }
        }
    });
}

/// The guest address a tunnel destination stands for (our own tunnel address: the guest DNS).
fn guest_target(sh: &Shared, dst: SocketAddr) -> Option<SocketAddr> {
    if sh.s.is_own_tunnel_ip(dst.ip()) {
        sh.s.guest_dns.first().copied()
    } else {
        Some(dst)
    }
}

/// Dial first: dials the guest for a held SYN, keeps the stream for [`handle_inbound`] and
/// tells the stack whether to complete the tunnel's handshake or reset it.
async fn pre_dial(sh: Arc<Shared>, src: SocketAddr, dst: SocketAddr) {
    let stream = match guest_target(&sh, dst) {
        Some(target) if sh.s.destination_allowed(dst) => {
            tokio::time::timeout(DIAL_TIMEOUT, TcpStream::connect(target))
                .await
                .ok()
                .and_then(Result::ok)
        }
        _ => None,
    };
    let ok = stream.is_some();
    if let Some(os) = stream {
        let mut m = sh.pre_dialed.lock().unwrap_or_else(|p| p.into_inner());
        m.retain(|_, (t, _)| t.elapsed() < PRE_DIALED_TTL);
        m.insert((src, dst), (Instant::now(), os));
    } else {
        tracing::info!(%dst, "guest dial failed; the tunnel connection is reset");
        sh.metrics.conn(Proto::tunnel, ConnResult::dial_failed);
    }
    let _ = sh.stack.dial_done(src, dst, ok).await;
}

async fn handle_inbound(sh: Arc<Shared>, c: TcpConn) {
    // Re-check: the policy ran on the SYN, this is the established connection.
    if !sh.s.destination_allowed(c.local) {
        sh.metrics.conn(Proto::tunnel, ConnResult::denied);
        return;
    }
    let Some(target) = guest_target(&sh, c.local) else {
        return;
    };
    let pre = sh
        .pre_dialed
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .remove(&(c.remote, c.local))
        .map(|(_, os)| os);
    let dialed = match pre {
        Some(os) => Ok(Ok(os)),
        None => tokio::time::timeout(DIAL_TIMEOUT, TcpStream::connect(target)).await,
    };
    match dialed {
        Ok(Ok(os)) => {
            // Relayed bytes are the client's writes: send them as they come (Nagle would hold
            // the second frame of a gRPC request for the catalog's delayed ACK, ~40 ms).
            let _ = os.set_nodelay(true);
            sh.metrics.conn(Proto::tunnel, ConnResult::ok);
            if target.port() == DNS_PORT && sh.s.is_own_tunnel_ip(c.local.ip()) {
                sh.dns_queries
                    .get_or_create(&DnsLabels {
                        transport: "tcp",
                        result: "forwarded",
                    })
                    .inc();
            }
            if c.relay(os, sh.s.idle_timeout).await.is_err() {
                tracing::debug!(%target, "idle relay closed");
            }
        }
        _ => {
            tracing::info!(%target, "guest dial failed");
            sh.metrics.conn(Proto::tunnel, ConnResult::dial_failed);
        }
    }
}

async fn forward_dns(sh: Arc<Shared>, reply: UdpSender, from: SocketAddr, q: Bytes) {
    let mut result = "error";
    for up in &sh.s.guest_dns {
        let r = async {
            let any: SocketAddr = if up.is_ipv4() {
                "0.0.0.0:0".parse().unwrap_or_else(|_| unreachable!())
            } else {
                "[::]:0".parse().unwrap_or_else(|_| unreachable!())
            };
            let s = UdpSocket::bind(any).await?;
            s.connect(up).await?;
            s.send(&q).await?;
            let mut buf = vec![0u8; 65_535];
            let n = s.recv(&mut buf).await?;
            buf.truncate(n);
            Ok::<_, std::io::Error>(buf)
        };
        match tokio::time::timeout(DNS_TIMEOUT, r).await {
            Ok(Ok(a)) => {
                let _ = reply.send_to(from, Bytes::from(a)).await;
                result = "forwarded";
                break;
            }
            Ok(Err(_)) => result = "error",
            Err(_) => result = "timeout",
        }
    }
    sh.dns_queries
        .get_or_create(&DnsLabels {
            transport: "udp",
            result,
        })
        .inc();
}

async fn exposed_loop(sh: Arc<Shared>, l: TcpListener, port: u16) {
    let target = SocketAddr::new(sh.s.gateway_ip, port);
    loop {
        let os = tokio::select! {
            _ = sh.cancel.cancelled() => return,
            r = l.accept() => match r {
                Ok((s, _)) => s,
                Err(e) => {
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let Some(permit) = sh.slot(Proto::exposed) else {
            drop(os);
            continue;
        };
        let sh2 = Arc::clone(&sh);
        sh.tracker.spawn(async move {
            match tokio::time::timeout(DIAL_TIMEOUT, sh2.stack.connect(target)).await {
                Ok(Ok(c)) => {
                    sh2.metrics.conn(Proto::exposed, ConnResult::ok);
                    if c.relay(os, sh2.s.idle_timeout).await.is_err() {
                        tracing::debug!(%target, "idle exposed-service relay closed");
                    }
                }
                _ => sh2.metrics.conn(Proto::exposed, ConnResult::dial_failed),
            }
            drop(permit);
        });
    }
}

/// Binds everything, runs until SIGTERM/SIGINT, drains.
pub async fn run(s: AgentSettings) -> anyhow::Result<()> {
    use anyhow::Context;
    let endpoint = tokio::net::lookup_host(s.gateway_endpoint.as_str())
        .await
        .with_context(|| format!("resolve gateway_endpoint {}", s.gateway_endpoint))?
        .next()
        .with_context(|| format!("gateway_endpoint {} has no address", s.gateway_endpoint))?;
    let bind: SocketAddr = if endpoint.is_ipv4() {
        SocketAddr::from(([0, 0, 0, 0], 0))
    } else {
        SocketAddr::from(([0u16; 8], 0))
    };
    let udp = UdpSocket::bind(bind).await.context("bind udp")?;
    let mut exposed = Vec::new();
    for (port, name) in &s.exposed {
        let a = SocketAddr::new(s.exposed_listen, *port);
        let l = TcpListener::bind(a)
            .await
            .with_context(|| format!("bind exposed service {name} on {a}"))?;
        exposed.push((l, *port));
    }
    let admin = TcpListener::bind(s.health_listen)
        .await
        .with_context(|| format!("bind health {}", s.health_listen))?;

    let cancel = CancellationToken::new();
    let keepalive = s.keepalive;
    let peer = Peer::new(PeerConfig {
        private_key: s.keys.private_key.clone(),
        peer_public_key: s.keys.peer_public_key,
        preshared_key: None,
        endpoint: Some(endpoint),
        persistent_keepalive: Some(keepalive),
        // The gateway keeps alive at its own interval (configure it like ours); silence for
        // 3 intervals + 5 s means it restarted or moved: handshake again.
        dead_peer_timeout: Some(Duration::from_secs(u64::from(keepalive) * 3 + 5)),
        allowed_ips: std::iter::once(s.gateway_ip)
            .chain(s.tunnel6.map(|(_, gw6)| gw6))
            .map(|ip| Cidr::new(ip, if ip.is_ipv4() { 32 } else { 128 }))
            .collect(),
        index: rand::random(),
        previous_private_keys: Vec::new(),
        previous_peer_public_keys: Vec::new(),
        solicit_after: None,
    });
    let (handle, _tunnel_task) = driver::spawn(udp, peer, cancel.clone());
    // Relocation: a gateway named by a host name may move (a new LoadBalancer IP or node
    // address). While the peer is silent, the name is resolved again and a new address of the
    // socket's family goes to the peer; an IP literal is never re-resolved.
    if !is_ip_literal(&s.gateway_endpoint) {
        spawn_endpoint_follower(
            s.gateway_endpoint.clone(),
            endpoint,
            handle.status.clone(),
            handle.endpoint.clone(),
            keepalive,
            cancel.clone(),
        );
    }
    // The policy needs the settings; share them through an Arc built before the stack.
    let policy_settings = Arc::new((
        std::iter::once(s.tunnel.0)
            .chain(s.tunnel6.map(|((a, _), _)| a))
            .collect::<Vec<_>>(),
        std::iter::once(s.gateway_ip)
            .chain(s.tunnel6.map(|(_, g)| g))
            .collect::<Vec<_>>(),
        s.allowed_cidrs.clone(),
        s.allowed_ports.clone(),
        !s.guest_dns.is_empty(),
    ));
    // Dial first: the guest destination is dialled before the tunnel's TCP handshake
    // completes, so a refusal reaches the gateway's client as a refusal (pre_dial).
    let (dials_tx, dials_rx) = tokio::sync::mpsc::channel(256);
    let (stack, inbound) = stack::spawn(
        StackConfig {
            addresses: std::iter::once(s.tunnel)
                .chain(s.tunnel6.map(|(own, _)| own))
                .collect(),
            any_ip: true,
            mtu: s.mtu,
            accept: Arc::new(move |dst: SocketAddr, src: SocketAddr| {
                let (me, gw, cidrs, ports, dns) = &*policy_settings;
                if !gw.contains(&src.ip()) {
                    return false;
                }
                if me.contains(&dst.ip()) {
                    return dst.port() == DNS_PORT && *dns;
                }
                ports.contains(&dst.port()) && cidrs.iter().any(|c| c.contains(dst.ip()))
            }),
            dial_first: Some(dials_tx),
        },
        handle.from_peer,
        handle.to_peer,
        cancel.clone(),
    );

    let (registry, metrics, dns_queries) = metrics();
    let draining = Arc::new(AtomicBool::new(false));
    let reload = s
        .key_reload
        .zip(s.config_path.clone())
        .map(|(every, path)| {
            (every, move || {
                daemon::load_json::<AgentPeerConfig>(&path).and_then(|c| agent_keys(&c))
            })
        });
    let handshake_done = daemon::spawn_tunnel_upkeep(
        &metrics,
        handle.status.clone(),
        Arc::clone(&stack.counters),
        reload,
        (s.keys.clone(), handle.keys.clone()),
        cancel.clone(),
    );
    daemon::spawn_admin(
        admin,
        registry,
        Arc::clone(&handshake_done),
        Arc::clone(&draining),
    );
    let listeners_cancel = CancellationToken::new();
    let tunnel_ips: Vec<IpAddr> = std::iter::once(s.tunnel.0)
        .chain(s.tunnel6.map(|((a, _), _)| a))
        .collect();
    let has_dns = !s.guest_dns.is_empty();
    let slots = Arc::new(tokio::sync::Semaphore::new(s.max_connections as usize));
    let sh = Arc::new(Shared {
        s,
        stack: stack.clone(),
        metrics,
        dns_queries,
        tracker: TaskTracker::new(),
        cancel: listeners_cancel.clone(),
        slots,
        pre_dialed: std::sync::Mutex::new(HashMap::new()),
    });
    {
        let sh2 = Arc::clone(&sh);
        daemon::spawn_serving(
            sh.cancel.clone(),
            sh.tracker.clone(),
            dials_rx,
            move |(src, dst)| Some(pre_dial(Arc::clone(&sh2), src, dst)),
        );
    }
    for tunnel_ip in tunnel_ips.into_iter().filter(|_| has_dns) {
        let mut u = stack
            .bind_udp(Some(SocketAddr::new(tunnel_ip, DNS_PORT)))
            .await
            .context("bind tunnel dns")?;
        let sh = Arc::clone(&sh);
        tokio::spawn(async move {
            let reply = u.sender();
            loop {
                let (from, q) = tokio::select! {
                    _ = sh.cancel.cancelled() => return,
                    r = u.recv() => match r { Some(x) => x, None => return },
                };
                sh.tracker
                    .spawn(forward_dns(Arc::clone(&sh), reply.clone(), from, q));
            }
        });
    }
    for (l, port) in exposed {
        tracing::info!(addr = %l.local_addr()?, "exposed service listening");
        tokio::spawn(exposed_loop(Arc::clone(&sh), l, port));
    }
    {
        let sh2 = Arc::clone(&sh);
        daemon::spawn_serving(sh.cancel.clone(), sh.tracker.clone(), inbound, move |c| {
            let permit = sh2.slot(Proto::tunnel)?;
            let fut = handle_inbound(Arc::clone(&sh2), c);
            Some(async move {
                fut.await;
                drop(permit);
            })
        });
    }
    tracing::info!(
        gateway = %endpoint,
        public_key = %sh.s.keys.private_key.public_key(),
        "agent running"
    );
    daemon::terminated().await?;
    let drained = daemon::drain(
        &draining,
        &listeners_cancel,
        &sh.tracker,
        sh.s.drain_timeout,
    )
    .await;
    cancel.cancel();
    if drained {
        tracing::info!("drained");
        Ok(())
    } else {
        anyhow::bail!("drain did not finish within {:?}", sh.s.drain_timeout)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tunnel::PrivateKey;
    use hcp_olm_tunnel_api::{AGENT_TUNNEL_ADDRESS6, GATEWAY_TUNNEL_ADDRESS6};

    fn config() -> AgentPeerConfig {
        let k = PrivateKey::generate();
        AgentPeerConfig {
            gateway_endpoint: Some("[fd00:50::1]:51820".into()),
            gateway_public_key: k.public_key().to_string(),
            agent_private_key_secret_ref: None,
            private_key_file: None,
            private_key: Some(k.to_base64()),
            key_reload_seconds: None,
            tunnel_address: hcp_olm_tunnel_api::AGENT_TUNNEL_ADDRESS.into(),
            gateway_tunnel_address: hcp_olm_tunnel_api::GATEWAY_TUNNEL_ADDRESS.into(),
            tunnel_address6: Some(AGENT_TUNNEL_ADDRESS6.into()),
            gateway_tunnel_address6: Some(GATEWAY_TUNNEL_ADDRESS6.into()),
            persistent_keepalive_seconds: 25,
            allowed_services: vec![],
            allowed_cidrs: vec!["10.96.0.0/12".into(), "fd00:10:96::/112".into()],
            allowed_ports: vec![50051],
            guest_dns: vec!["[fd00:10:96::a]:53".into()],
            exposed_services: vec![],
            exposed_listen_address: Some("::".into()),
            health_listen: Some("[::]:9090".into()),
            mtu: None,
            drain_timeout_seconds: None,
            max_connections: None,
            idle_timeout_seconds: None,
        }
    }

    #[test]
    fn dual_stack_destinations_and_the_v6_pair() {
        let s = AgentSettings::from_config(&config()).unwrap();
        let ip = |a: &str| a.parse::<IpAddr>().unwrap();
        assert_eq!(
            s.tunnel6,
            Some((
                (ip("fd9c:4f1e:7a2b:ffff::2"), 126),
                ip("fd9c:4f1e:7a2b:ffff::1")
            ))
        );
        assert!(s.destination_allowed("[fd00:10:96::10]:50051".parse().unwrap()));
        assert!(s.destination_allowed("10.96.0.10:50051".parse().unwrap()));
        assert!(!s.destination_allowed("[fd00:10:97::10]:50051".parse().unwrap()));
        assert!(!s.destination_allowed("[fd00:10:96::10]:22".parse().unwrap()));
        // tunnel DNS on either own address
        assert!(s.destination_allowed("[fd9c:4f1e:7a2b:ffff::2]:53".parse().unwrap()));
        assert!(s.destination_allowed("100.127.255.2:53".parse().unwrap()));
        assert!(!s.destination_allowed("[fd9c:4f1e:7a2b:ffff::2]:50051".parse().unwrap()));
        assert!(s.is_gateway_ip(ip("fd9c:4f1e:7a2b:ffff::1")));
        assert!(!s.is_gateway_ip(ip("fd9c:4f1e:7a2b:ffff::3")));
        assert_eq!(s.guest_dns, ["[fd00:10:96::a]:53".parse().unwrap()]);
        assert_eq!(s.exposed_listen, ip("::"));
    }

    #[test]
    fn v6_errors_name_the_field() {
        type Edit = fn(&mut AgentPeerConfig);
        let cases: [(Edit, &str); 8] = [
            (
                |c| {
                    c.tunnel_address6 = None;
                    c.gateway_tunnel_address6 = None;
                },
                "allowed_cidrs[1]",
            ),
            (|c| c.allowed_cidrs[1] = "::/0".into(), "allowed_cidrs[1]"),
            (
                |c| c.allowed_cidrs[1] = "fd9c:4f1e:7a2b:ffff::/64".into(),
                "allowed_cidrs[1]",
            ),
            (
                |c| c.allowed_cidrs[1] = "fd9c:4f1e:7a2b:ffff::3/128".into(),
                "allowed_cidrs[1]",
            ),
            (
                |c| c.gateway_tunnel_address6 = None,
                "gateway_tunnel_address6",
            ),
            (|c| c.tunnel_address6 = None, "tunnel_address6"),
            (
                |c| c.tunnel_address6 = Some("100.127.254.2/30".into()),
                "tunnel_address6",
            ),
            (
                |c| c.gateway_tunnel_address6 = Some("fd9c:4f1e:7a2b:ffff::1".into()),
                "gateway_tunnel_address6",
            ),
        ];
        for (i, (edit, field)) in cases.into_iter().enumerate() {
            let mut c = config();
            edit(&mut c);
            let e = AgentSettings::from_config(&c).unwrap_err();
            assert_eq!(e.field, field, "case {i}: {e}");
        }
        // IPv4 only, as before: no pair needed
        let mut c = config();
        c.tunnel_address6 = None;
        c.gateway_tunnel_address6 = None;
        c.allowed_cidrs.pop();
        assert!(AgentSettings::from_config(&c).unwrap().tunnel6.is_none());
        // a v4 range overlapping the tunnel's own /30
        c.allowed_cidrs.push("100.127.255.0/29".into());
        assert_eq!(
            AgentSettings::from_config(&c).unwrap_err().field,
            "allowed_cidrs[1]"
        );
    }
}
