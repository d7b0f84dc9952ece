//! The control-plane gateway: WireGuard responder with a userspace stack (no privileges: one
//! UDP socket and TCP listeners), HTTP CONNECT and SOCKS5 proxies for OLM pods whose targets
//! are resolved with the split DNS and checked against the allowed-services table, and the
//! reverse path for control-plane services the agent exposes in the guest.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use bytes::Bytes;
use futures::future::BoxFuture;
use hcp_olm_tunnel_api::{AllowedService, DnsOwner, DnsRule, GatewayConfig};
use hickory_proto::rr::Name;
use prometheus_client::registry::Registry;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream, UdpSocket};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::daemon::{self, ConnResult, Proto, TunnelMetrics};
use crate::dns::{ConfigError, DnsConfigSpec, Engine, Owner};
use crate::proxy::{Host, Target, http, policy, socks};
use crate::server::{DnsMetrics, DnsServer, GuestExchange};
use crate::stack::{self, Stack, StackConfig, TcpConn};
use crate::tunnel::{Cidr, Keys, Peer, PeerConfig, PeerStatus, PrivateKey, driver};

/// Defaults of the resource bounds (see `GatewayConfig`).
pub const DEFAULT_MAX_CONNECTIONS: u32 = 128;
pub const DEFAULT_HANDSHAKE_TIMEOUT_SECONDS: u64 = 10;
pub const DEFAULT_IDLE_TIMEOUT_SECONDS: u64 = 3600;
const DIAL_TIMEOUT: Duration = Duration::from_secs(10);
/// Connecting to another replica (same cluster network; a gone pod's address does not answer).
const PEER_CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// Retransmission interval of DNS queries to the agent.
const DNS_RETRANSMIT: Duration = Duration::from_millis(400);

/// Validated gateway settings.
#[derive(Debug)]
pub struct GatewaySettings {
    pub listen: SocketAddr,
    /// `listen_address` unset: the WireGuard socket takes both families (`[::]` with
    /// IPv6-only off), so agents reach it over an IPv4 or an IPv6 underlay; a pod without
    /// IPv6 gets `0.0.0.0` ([`bind_wireguard`]).
    pub listen_dual_stack: bool,
    /// Own key and the agent's, with the previous ones of a rotation.
    pub keys: Keys,
    /// Where the config was read from, for key reloads (set by the binary).
    pub config_path: Option<std::path::PathBuf>,
    pub key_reload: Option<Duration>,
    pub tunnel: (IpAddr, u8),
    pub agent_ip: IpAddr,
    /// The IPv6 pair inside the tunnel (own address with prefix, the agent's), if configured.
    pub tunnel6: Option<daemon::TunnelPair6>,
    pub allowed_sources: Vec<Cidr>,
    /// Guest Service and pod CIDRs: the only addresses dialed through the tunnel.
    pub guest_cidrs: Vec<Cidr>,
    pub cluster_domain: String,
    pub connect_listen: Option<SocketAddr>,
    pub socks_listen: Option<SocketAddr>,
    /// Replicas: forwarded connections from other replicas (see `GatewayConfig`).
    pub peer_listen: Option<SocketAddr>,
    /// Replicas: `host:port` of every replica's peer listener.
    pub peers: Option<String>,
    /// This replica's address among `peers` (set by the binary from `POD_IP`).
    pub own_address: Option<IpAddr>,
    pub health_listen: SocketAddr,
    pub dns_listen: Option<SocketAddr>,
    pub dns: DnsConfigSpec,
    pub allowed_services: Vec<AllowedService>,
    /// Management-side Services the proxies may dial (exact names).
    pub allowed_local_services: Vec<AllowedService>,
    pub max_connections: u32,
    /// Total time a proxy client has for its request.
    pub handshake_timeout: Duration,
    /// Relays on which nothing moved for this long are closed.
    pub idle_timeout: Duration,
    /// Tunnel port → HCP-namespace target.
    pub exposed: Vec<(u16, String)>,
    pub keepalive: u16,
    /// Silence after which the agent counts as gone.
    pub peer_timeout: Duration,
    pub mtu: usize,
    pub drain_timeout: Duration,
}

fn owner_spec(o: DnsOwner) -> &'static str {
    match o {
        DnsOwner::Local => "local",
        DnsOwner::Guest => "guest",
        DnsOwner::Refuse => "refuse",
    }
}

impl GatewaySettings {
    pub fn from_config(c: &GatewayConfig) -> Result<Self, ConfigError> {
        use daemon::{config_error as err, *};
        let addr = c.listen_address.as_deref().unwrap_or("0.0.0.0");
        let ip: IpAddr = addr
            .parse()
            .map_err(|_| err("listen_address", format!("`{addr}` is not an IP address")))?;
        let keys = gateway_keys(c)?;
        let TunnelAddressing {
            own: tunnel,
            other: (agent_ip, _),
            pair6: tunnel6,
            ranges: guest_cidrs,
        } = tunnel_addressing(
            [
                ("tunnel_address", &c.tunnel_address),
                ("agent_tunnel_address", &c.agent_tunnel_address),
            ],
            [
                ("tunnel_address6", c.tunnel_address6.as_deref()),
                ("agent_tunnel_address6", c.agent_tunnel_address6.as_deref()),
            ],
            ("guest_cidrs", &c.guest_cidrs),
        )?;
        let mut allowed_sources = guest_cidrs.clone();
        allowed_sources.push(Cidr::new(
            agent_ip,
            if agent_ip.is_ipv4() { 32 } else { 128 },
        ));
        if let Some((_, agent6)) = tunnel6 {
            allowed_sources.push(Cidr::new(agent6, 128));
        }
        let domain = c
            .cluster_domain
            .clone()
            .unwrap_or_else(|| hcp_olm_tunnel_api::DEFAULT_CLUSTER_DOMAIN.into())
            .trim_end_matches('.')
            .to_ascii_lowercase();
        if crate::proxy::valid_name(&domain).is_none() {
            return Err(err(
                "cluster_domain",
                format!("`{domain}` is not a DNS name"),
            ));
        }
        let keepalive = c.persistent_keepalive_seconds.unwrap_or(25);
        let peer_timeout = c
            .peer_timeout_seconds
            .unwrap_or(2 * u64::from(keepalive) + 5);
        if peer_timeout == 0 {
            return Err(err("peer_timeout_seconds", "must be at least 1"));
        }
        let connect_listen = c
            .connect_listen
            .as_deref()
            .map(|s| socket_addr("connect_listen", s))
            .transpose()?;
        let socks_listen = c
            .socks_listen
            .as_deref()
            .map(|s| socket_addr("socks_listen", s))
            .transpose()?;
        if connect_listen.is_none() && socks_listen.is_none() {
            return Err(err(
                "connect_listen",
                "at least one of connect_listen or socks_listen is required",
            ));
        }
        let health_listen = socket_addr("health_listen", &c.health_listen)?;
        let peer_listen = c
            .peer_listen
            .as_deref()
            .map(|s| socket_addr("peer_listen", s))
            .transpose()?;
        let peers = c.peers.as_deref().map(|p| {
            let ok = p.rsplit_once(':').is_some_and(|(h, port)| {
                (crate::proxy::valid_name(h).is_some() || h.parse::<IpAddr>().is_ok())
                    && port.parse::<u16>().is_ok_and(|p| p != 0)
            });
            ok.then(|| p.to_string())
                .ok_or_else(|| err("peers", format!("`{p}` is not host:port")))
        });
        let peers = peers.transpose()?;
        let dns_listen = c
            .dns
            .listen
            .as_deref()
            .map(|s| socket_addr("dns.listen", s))
            .transpose()?;
        if c.dns.local_upstreams.is_empty() {
            return Err(err(
                "dns.local_upstreams",
                "at least one resolver is required (none given and none in /etc/resolv.conf)",
            ));
        }
        for (i, u) in c.dns.local_upstreams.iter().enumerate() {
            server_addr(&format!("dns.local_upstreams[{i}]"), u, 53)?;
        }
        let rules: Vec<DnsRule> = if c.dns.rules.is_empty() {
            let mut r = vec![
                DnsRule {
                    suffix: ".".into(),
                    namespace: None,
                    owner: DnsOwner::Local,
                },
                DnsRule {
                    suffix: format!("svc.{domain}"),
                    namespace: None,
                    owner: DnsOwner::Guest,
                },
            ];
            if let Some(ns) = &c.hcp_namespace {
                r.push(DnsRule {
                    suffix: format!("svc.{domain}"),
                    namespace: Some(ns.clone()),
                    owner: DnsOwner::Local,
                });
            }
            r.extend(reverse_zone_rules(&guest_cidrs));
            r
        } else {
            c.dns.rules.clone()
        };
        // Build the split-DNS config through its own (validating) format.
        let spec = serde_json::json!({
            "cluster_domain": domain,
            "upstreams": {
                "local": c.dns.local_upstreams,
                "guest": [SocketAddr::new(agent_ip, 53).to_string()],
            },
            "rules": rules.iter().map(|r| serde_json::json!({
                "suffix": r.suffix,
                "namespace": r.namespace,
                "owner": owner_spec(r.owner),
            })).collect::<Vec<_>>(),
            "clients": {
                "allowed": (!c.dns.allowed_clients.is_empty()).then_some(&c.dns.allowed_clients),
                "rate_limit_qps": c.dns.rate_limit_qps.unwrap_or(200),
                "rate_limit_burst": 2 * u64::from(c.dns.rate_limit_qps.unwrap_or(200)),
            },
        });
        let dns: DnsConfigSpec =
            serde_json::from_value(spec).map_err(|e| err("dns", e.to_string()))?;
        dns.validate().map_err(|e| {
            // the client settings come from `dns.allowed_clients` / `dns.rate_limit_qps`
            let field = match e.field.strip_prefix("clients.allowed") {
                Some(rest) => format!("dns.allowed_clients{rest}"),
                None if e.field.starts_with("clients.") => "dns.rate_limit_qps".into(),
                None => format!("dns.{}", e.field),
            };
            err(&field, e.reason)
        })?;
        for (i, a) in c.allowed_services.iter().enumerate() {
            if a.port == 0 {
                return Err(err(&format!("allowed_services[{i}].port"), "must not be 0"));
            }
        }
        for (i, a) in c.allowed_local_services.iter().enumerate() {
            let f = |k: &str| format!("allowed_local_services[{i}].{k}");
            if a.port == 0 {
                return Err(err(&f("port"), "must not be 0"));
            }
            for (k, v) in [("namespace", &a.namespace), ("name", &a.name)] {
                if v == "*" || crate::proxy::valid_name(v).is_none_or(|n| n.contains('.')) {
                    return Err(err(
                        &f(k),
                        format!(
                            "`{v}` is not a single DNS label (no wildcards on the management side)"
                        ),
                    ));
                }
            }
        }
        let positive = |field: &str, v: Option<u64>, default: u64| match v {
            Some(0) => Err(err(field, "must be at least 1")),
            v => Ok(v.unwrap_or(default)),
        };
        let max_connections = positive(
            "max_connections",
            c.max_connections.map(u64::from),
            u64::from(DEFAULT_MAX_CONNECTIONS),
        )? as u32;
        let handshake_timeout = positive(
            "handshake_timeout_seconds",
            c.handshake_timeout_seconds,
            DEFAULT_HANDSHAKE_TIMEOUT_SECONDS,
        )?;
        let idle_timeout = positive(
            "idle_timeout_seconds",
            c.idle_timeout_seconds,
            DEFAULT_IDLE_TIMEOUT_SECONDS,
        )?;
        let mut exposed = Vec::new();
        for (i, e) in c.exposed_services.iter().enumerate() {
            if e.listen_port == 0 {
                return Err(err(
                    &format!("exposed_services[{i}].listen_port"),
                    "must not be 0",
                ));
            }
            if e.target.rsplit_once(':').is_none_or(|(h, p)| {
                h.is_empty() || p.parse::<u16>().ok().filter(|&p| p != 0).is_none()
            }) {
                return Err(err(
                    &format!("exposed_services[{i}].target"),
                    format!("`{}` is not host:port", e.target),
                ));
            }
            if exposed.iter().any(|(p, _)| *p == e.listen_port) {
                return Err(err(
                    &format!("exposed_services[{i}].listen_port"),
                    "duplicate port",
                ));
            }
            exposed.push((e.listen_port, e.target.clone()));
        }
        Ok(Self {
            listen: SocketAddr::new(ip, c.listen_port),
            listen_dual_stack: c.listen_address.is_none(),
            keys,
            config_path: None,
            key_reload: daemon::reload_interval(c.key_reload_seconds),
            tunnel,
            agent_ip,
            tunnel6,
            allowed_sources,
            guest_cidrs,
            cluster_domain: domain,
            connect_listen,
            socks_listen,
            peer_listen,
            peers,
            own_address: None,
            health_listen,
            dns_listen,
            dns,
            allowed_services: c.allowed_services.clone(),
            allowed_local_services: c.allowed_local_services.clone(),
            max_connections,
            handshake_timeout: Duration::from_secs(handshake_timeout),
            idle_timeout: Duration::from_secs(idle_timeout),
            exposed,
            keepalive,
            peer_timeout: Duration::from_secs(peer_timeout),
            mtu: mtu("mtu", c.mtu)?,
            drain_timeout: Duration::from_secs(c.drain_timeout_seconds.unwrap_or(10)),
        })
    }
}

/// Default split-DNS rules for PTR lookups: the reverse zones (`in-addr.arpa`, `ip6.arpa`) of
/// the guest ranges belong to the guest, once each (a range off an octet or nibble boundary
/// covers the zones at the next boundary, at most 128).
pub fn reverse_zone_rules(guest_cidrs: &[Cidr]) -> Vec<DnsRule> {
    let mut seen = std::collections::BTreeSet::new();
    guest_cidrs
        .iter()
        .flat_map(|c| crate::dns::reverse_zones(c.addr(), c.prefix()))
        .filter(|z| seen.insert(z.clone()))
        .map(|suffix| DnsRule {
            suffix,
            namespace: None,
            owner: DnsOwner::Guest,
        })
        .collect()
}

/// The gateway's keys from its config: its private key (inline or file), the agent's
/// public key, and the earlier ones a rotation still accepts.
pub fn gateway_keys(c: &GatewayConfig) -> Result<Keys, ConfigError> {
    use daemon::{config_error as err, *};
    let private_key = private_key(
        c.private_key.as_deref(),
        c.private_key_file.as_deref(),
        "private_key",
        "private_key_file",
    )?;
    let mut previous_private_keys = Vec::new();
    for (i, f) in c.previous_private_key_files.iter().enumerate() {
        let field = format!("previous_private_key_files[{i}]");
        let text =
            std::fs::read_to_string(f).map_err(|e| err(&field, format!("cannot read {f}: {e}")))?;
        previous_private_keys
            .push(PrivateKey::from_base64(&text).map_err(|e| err(&field, e.to_string()))?);
    }
    let peer_public_key = public_key("agent_public_key", &c.agent_public_key)?;
    let previous_peer_public_keys = c
        .previous_agent_public_keys
        .iter()
        .enumerate()
        .map(|(i, k)| public_key(&format!("previous_agent_public_keys[{i}]"), k))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Keys {
        private_key,
        peer_public_key,
        preshared_key: None,
        previous_private_keys,
        previous_peer_public_keys,
    })
}

/// DNS exchanges with the agent's forwarder through the userspace stack.
#[derive(Debug)]
struct StackExchange(Stack);

impl GuestExchange for StackExchange {
    fn udp(
        &self,
        addr: SocketAddr,
        query: Vec<u8>,
    ) -> BoxFuture<'static, std::io::Result<Vec<u8>>> {
        let stack = self.0.clone();
        Box::pin(async move {
            let mut s = stack.bind_udp(None).await?;
            let query = Bytes::from(query);
            // Like a stub resolver, retransmit while waiting: one lost datagram on the
            // tunnel must not fail the lookup (the caller's deadline bounds this loop).
            loop {
                s.send_to(addr, query.clone()).await?;
                let wait = tokio::time::sleep(DNS_RETRANSMIT);
                tokio::pin!(wait);
                loop {
                    tokio::select! {
                        _ = &mut wait => break,
                        r = s.recv() => match r {
                            Some((from, d)) if from == addr => return Ok(d.to_vec()),
                            Some(_) => continue,
                            None => return Err(std::io::ErrorKind::BrokenPipe.into()),
                        },
                    }
                }
            }
        })
    }

    fn tcp(
        &self,
        addr: SocketAddr,
        query: Vec<u8>,
    ) -> BoxFuture<'static, std::io::Result<Vec<u8>>> {
        let stack = self.0.clone();
        Box::pin(async move {
            let mut c = stack.connect(addr).await?;
            let len = u16::try_from(query.len())
                .map_err(|_| std::io::Error::from(std::io::ErrorKind::InvalidInput))?;
            let mut frame = len.to_be_bytes().to_vec();
            frame.extend_from_slice(&query);
            c.send(Bytes::from(frame)).await?;
            let mut buf = Vec::new();
            while let Some(d) = c.recv().await {
                buf.extend_from_slice(&d);
                if buf.len() >= 2 {
                    let n = usize::from(u16::from_be_bytes([buf[0], buf[1]]));
                    if buf.len() >= 2 + n {
                        return Ok(buf[2..2 + n].to_vec());
                    }
                }
            }
            Err(std::io::ErrorKind::UnexpectedEof.into())
        })
    }
}

/// Where an allowed target is dialed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    Tunnel(SocketAddr),
    Local(SocketAddr),
}

/// Why a target is not dialed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    Denied,
    ResolveFailed,
}

struct Shared {
    s: GatewaySettings,
    stack: Stack,
    dns: DnsServer,
    metrics: TunnelMetrics,
    tracker: TaskTracker,
    cancel: CancellationToken,
    /// Set while the agent is silent for longer than `peer_timeout`.
    peer_gone: AtomicBool,
    /// The tunnel's latest status (whether this replica holds the session).
    status: tokio::sync::watch::Receiver<PeerStatus>,
    /// One permit per relayed connection (`max_connections`).
    slots: Arc<tokio::sync::Semaphore>,
}

impl Shared {
    fn over_limit(&self, proto: Proto) {
        self.metrics.conn(proto, ConnResult::over_limit);
        tracing::warn!(
            ?proto,
            max_connections = self.s.max_connections,
            "connection refused: max_connections reached"
        );
    }

    /// Decides where a proxy target goes, without I/O: its qualified name, and whether it is
    /// management-side (`true`) or a guest name. Guest-owned names go into the tunnel (and,
    /// in [`Shared::resolve`], only to an address inside the guest CIDRs); management-owned
    /// names only when they are an allow-listed Service (never to loopback or link-local
    /// addresses). The address is checked after resolving, and exactly that address is
    /// dialed (no second lookup).
    fn classify(&self, t: &Target) -> Result<(String, bool), Refusal> {
        let name = match &t.host {
            // An IP literal cannot be checked against the service table.
            Host::Ip(_) => return Err(Refusal::Denied),
            Host::Name(n) => policy::qualify(n, &self.s.cluster_domain),
        };
        let mut fqdn = Name::from_ascii(&name).map_err(|_| Refusal::Denied)?;
        fqdn.set_fqdn(true);
        let owner = self
            .dns
            .engine()
            .config()
            .table
            .lookup(&fqdn.to_lowercase())
            .owner;
        let local = match owner {
            Owner::Guest => {
                let Some((svc, ns)) = policy::service_of(&name, &self.s.cluster_domain) else {
                    return Err(Refusal::Denied);
                };
                if !policy::service_allowed(&self.s.allowed_services, svc, ns, t.port) {
                    return Err(Refusal::Denied);
                }
                false
            }
            Owner::Local => {
                let Some((svc, ns)) = policy::service_of(&name, &self.s.cluster_domain) else {
                    return Err(Refusal::Denied);
                };
                if !policy::service_allowed(&self.s.allowed_local_services, svc, ns, t.port) {
                    return Err(Refusal::Denied);
                }
                true
            }
            _ => return Err(Refusal::Denied),
        };
        Ok((name, local))
    }

    /// Resolves a target [`Shared::classify`] allowed: exactly the address that will be dialed.
    async fn resolve(&self, name: &str, local: bool, port: u16) -> Result<Route, Refusal> {
        let (ips, ip) = if local {
            let ips = self
                .dns
                .lookup_ip(name)
                .await
                .map_err(|_| Refusal::ResolveFailed)?;
            let ip = ips
                .iter()
                .copied()
                .find(|ip| policy::local_address_allowed(*ip));
            (ips, ip)
        } else {
            self.resolve_guest(name).await?
        };
        let Some(ip) = ip else {
            tracing::info!(target = %name, addresses = ?ips, "no resolved address is allowed");
            return Err(Refusal::Denied);
        };
        let a = SocketAddr::new(ip, port);
        Ok(if local {
            Route::Local(a)
        } else {
            Route::Tunnel(a)
        })
    }

    /// A guest name's addresses, and the first that may be dialed into the tunnel (inside
    /// `guest_cidrs`, of a family the tunnel carries). Each family the guest ranges have is
    /// asked for in turn (A first), so that a dual-stack name is dialed over the family
    /// whose range holds it and an AAAA-only name is found.
    async fn resolve_guest(&self, name: &str) -> Result<(Vec<IpAddr>, Option<IpAddr>), Refusal> {
        use hickory_proto::rr::RecordType;
        let mut all = Vec::new();
        for (v4, rtype) in [(true, RecordType::A), (false, RecordType::AAAA)] {
            if !self.s.guest_cidrs.iter().any(|c| c.addr().is_ipv4() == v4) {
                continue;
            }
            let ips = match self.dns.lookup_families(name, &[rtype]).await {
                Ok(ips) => ips,
                Err(crate::server::LookupError::NoAddresses(_)) => continue,
                Err(_) => break,
            };
            let ip = ips.iter().copied().find(|ip| {
                self.stack_family(*ip) && self.s.guest_cidrs.iter().any(|c| c.contains(*ip))
            });
            all.extend(ips);
            if ip.is_some() {
                return Ok((all, ip));
            }
        }
        if all.is_empty() {
            return Err(Refusal::ResolveFailed);
        }
        Ok((all, None))
    }

    /// Whether the tunnel has an address of `ip`'s family to dial it from.
    fn stack_family(&self, ip: IpAddr) -> bool {
        ip.is_ipv4() == self.s.tunnel.0.is_ipv4()
            || self
                .s
                .tunnel6
                .is_some_and(|((a, _), _)| a.is_ipv4() == ip.is_ipv4())
    }

    /// Whether this replica holds the agent's session: heard from within the peer timeout.
    fn has_session(&self) -> bool {
        has_session(
            self.status.borrow().since_authenticated,
            self.s.peer_timeout,
        )
    }

    /// Opens a proxy target: checked, then dialed here, or (a guest target while another
    /// replica holds the tunnel session and `may_forward`) through that replica.
    async fn open(&self, t: &Target, may_forward: bool) -> Result<Dialed, Failure> {
        let (name, local) = self.classify(t).map_err(Failure::Refused)?;
        if local && !may_forward {
            // the peer port serves guest targets through this replica's session, nothing else
            return Err(Failure::Refused(Refusal::Denied));
        }
        if !local && !self.has_session() {
            if may_forward && self.s.peers.is_some() {
                return match forward(self, &name, t.port).await {
                    Ok((up, early)) => Ok(Dialed::Peer(up, early)),
                    Err(e) => {
                        tracing::info!(target = %name, error = %e, "no replica took the request");
                        Err(Failure::DialFailed)
                    }
                };
            }
            if !may_forward {
                // forwarded to us: fail fast so the forwarding replica tries the next one
                return Err(Failure::DialFailed);
            }
        }
        let route = self
            .resolve(&name, local, t.port)
            .await
            .map_err(Failure::Refused)?;
        dial(self, route).await.map_err(|e| {
            tracing::info!(target = %name, ?route, error = %e, "dial failed");
            Failure::DialFailed
        })
    }
}

/// Whether the agent was heard from within `timeout` (pure).
pub fn has_session(since_authenticated: Option<Duration>, timeout: Duration) -> bool {
    since_authenticated.is_some_and(|d| d <= timeout)
}

/// Why a proxy request was not served.
#[derive(Debug, Clone, Copy)]
enum Failure {
    Refused(Refusal),
    DialFailed,
}

impl Failure {
    fn result(self) -> ConnResult {
        match self {
            Failure::Refused(Refusal::Denied) => ConnResult::denied,
            Failure::Refused(Refusal::ResolveFailed) => ConnResult::resolve_failed,
            Failure::DialFailed => ConnResult::dial_failed,
        }
    }
}

impl Dialed {
    fn result(&self) -> ConnResult {
        match self {
            Dialed::Peer(..) => ConnResult::forwarded,
            _ => ConnResult::ok,
        }
    }
}

/// Whether `ip` is one of this host's (pod's) addresses: binding to it works.
fn is_own_address(ip: IpAddr) -> bool {
    std::net::UdpSocket::bind(SocketAddr::new(ip, 0)).is_ok()
}

/// Hands a guest target to another replica: every address `peers` names (but our own) is
/// asked in turn over SOCKS5; the first that answers success holds the session. Returns the
/// stream and any bytes the target already sent after the reply.
async fn forward(sh: &Shared, name: &str, port: u16) -> std::io::Result<(TcpStream, Vec<u8>)> {
    use std::io::{Error, ErrorKind};
    let peers = sh.s.peers.as_deref().unwrap_or_default();
    let addrs: Vec<SocketAddr> = tokio::time::timeout(DIAL_TIMEOUT, tokio::net::lookup_host(peers))
        .await
        .map_err(|_| Error::from(ErrorKind::TimedOut))??
        .filter(|a| match sh.s.own_address {
            Some(own) => a.ip() != own && !a.ip().is_loopback(),
            None => !is_own_address(a.ip()),
        })
        .collect();
    let request = socks::client_connect(name, port)
        .ok_or_else(|| Error::new(ErrorKind::InvalidInput, "name too long"))?;
    let mut last = Error::new(ErrorKind::NotConnected, "no other replica");
    for a in addrs {
        let attempt = async {
            let mut up = tokio::time::timeout(PEER_CONNECT_TIMEOUT, TcpStream::connect(a))
                .await
                .map_err(|_| {
                    Error::new(ErrorKind::TimedOut, format!("replica {a}: no connection"))
                })??;
            let _ = up.set_nodelay(true);
            up.write_all(&request).await?;
            let mut buf = Vec::with_capacity(64);
            let mut chunk = [0u8; 512];
            loop {
                let n = up.read(&mut chunk).await?;
                if n == 0 || buf.len() + n > 4096 {
                    return Err(Error::from(ErrorKind::UnexpectedEof));
                }
                buf.extend_from_slice(&chunk[..n]);
                match socks::parse_client_reply(&buf) {
                    Ok(None) => continue,
                    Ok(Some((socks::REP_SUCCEEDED, used))) => {
                        return Ok((up, buf.split_off(used)));
                    }
                    Ok(Some((code, _))) => {
                        return Err(Error::new(
                            ErrorKind::ConnectionRefused,
                            format!("replica {a} answered {code}"),
                        ));
                    }
                    Err(e) => return Err(Error::new(ErrorKind::InvalidData, e.to_string())),
                }
            }
        };
        // The holder answers after its own name lookup and dial (each up to DIAL_TIMEOUT).
        match tokio::time::timeout(PEER_CONNECT_TIMEOUT + 2 * DIAL_TIMEOUT, attempt).await {
            Ok(Ok(x)) => return Ok(x),
            Ok(Err(e)) => last = e,
            Err(_) => last = Error::new(ErrorKind::TimedOut, format!("replica {a} timed out")),
        }
    }
    Err(last)
}

enum Dialed {
    Tunnel(TcpConn),
    Local(TcpStream),
    /// Through another replica, with what the target already sent.
    Peer(TcpStream, Vec<u8>),
}

async fn dial(sh: &Shared, r: Route) -> std::io::Result<Dialed> {
    if matches!(r, Route::Tunnel(_)) && sh.peer_gone.load(Ordering::SeqCst) {
        // fail fast: waiting out the connect timeout would only delay the client's retry
        return Err(std::io::Error::new(
            std::io::ErrorKind::NotConnected,
            "guest agent unreachable (no tunnel traffic within the peer timeout)",
        ));
    }
    match r {
        Route::Tunnel(a) => tokio::time::timeout(DIAL_TIMEOUT, sh.stack.connect(a))
            .await
            .map_err(|_| std::io::Error::from(std::io::ErrorKind::TimedOut))?
            .map(Dialed::Tunnel),
        Route::Local(a) => tokio::time::timeout(DIAL_TIMEOUT, TcpStream::connect(a))
            .await
            .map_err(|_| std::io::Error::from(std::io::ErrorKind::TimedOut))?
            .map(|s| {
                let _ = s.set_nodelay(true);
                Dialed::Local(s)
            }),
    }
}

async fn splice(d: Dialed, mut client: TcpStream, early: &[u8], idle: Duration) {
    match d {
        Dialed::Tunnel(c) => {
            if !early.is_empty() && c.send(Bytes::copy_from_slice(early)).await.is_err() {
                return;
            }
            if c.relay(client, idle).await.is_err() {
                tracing::debug!("idle tunnel relay closed");
            }
        }
        Dialed::Local(up) => splice_os(up, client, early, idle).await,
        Dialed::Peer(up, from_target) => {
            if !from_target.is_empty() && client.write_all(&from_target).await.is_err() {
                return;
            }
            splice_os(up, client, early, idle).await;
        }
    }
}

async fn splice_os(mut up: TcpStream, client: TcpStream, early: &[u8], idle: Duration) {
    if !early.is_empty() && up.write_all(early).await.is_err() {
        return;
    }
    if relay_os(client, up, idle).await.is_err() {
        tracing::debug!("idle relay closed");
    }
}

/// Relays between two OS streams until both directions end, or until nothing moved either
/// way for `idle` (then `TimedOut`).
async fn relay_os(a: TcpStream, b: TcpStream, idle: Duration) -> std::io::Result<()> {
    use std::sync::atomic::AtomicU64;
    let moved = Arc::new(AtomicU64::new(0));
    let copy = |mut from: tokio::net::tcp::OwnedReadHalf,
                mut to: tokio::net::tcp::OwnedWriteHalf,
                moved: Arc<AtomicU64>| async move {
        let mut buf = vec![0u8; 16 * 1024];
        loop {
            match from.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    moved.fetch_add(1, Ordering::Relaxed);
                    if to.write_all(&buf[..n]).await.is_err() {
                        break;
                    }
                }
            }
        }
        let _ = to.shutdown().await;
    };
    let (ar, aw) = a.into_split();
    let (br, bw) = b.into_split();
    tokio::select! {
        _ = async {
            tokio::join!(copy(ar, bw, Arc::clone(&moved)), copy(br, aw, Arc::clone(&moved)))
        } => Ok(()),
        _ = stack::idle_watch(&moved, idle) => Err(std::io::ErrorKind::TimedOut.into()),
    }
}

async fn http_reply(mut s: TcpStream, status: &str) {
    let r = format!("HTTP/1.1 {status}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
    let _ = s.write_all(r.as_bytes()).await;
    let _ = s.shutdown().await;
    linger(s).await;
}

/// Reads and discards what the client still sends (bounded), so that closing with unread
/// data does not reset the connection before the client has read our error reply.
async fn linger(mut s: TcpStream) {
    let mut buf = [0u8; 4096];
    let deadline = tokio::time::Instant::now() + Duration::from_secs(1);
    for _ in 0..64 {
        match tokio::time::timeout_at(deadline, s.read(&mut buf)).await {
            Ok(Ok(n)) if n > 0 => {}
            _ => break,
        }
    }
}

async fn handle_connect(sh: Arc<Shared>, mut s: TcpStream) {
    // One deadline for the whole request, not per read: a client dripping a byte at a
    // time must not hold the connection.
    let deadline = tokio::time::Instant::now() + sh.s.handshake_timeout;
    let mut buf = Vec::with_capacity(1024);
    let req = loop {
        let mut chunk = [0u8; 2048];
        let n = match tokio::time::timeout_at(deadline, s.read(&mut chunk)).await {
            Ok(Ok(n)) if n > 0 => n,
            _ => {
                sh.metrics.conn(Proto::connect, ConnResult::bad_request);
                return;
            }
        };
        buf.extend_from_slice(&chunk[..n]);
        match http::parse_connect(&buf) {
            Ok(Some(r)) => break r,
            Ok(None) => continue,
            Err(e) => {
                tracing::debug!(error = %e, "bad CONNECT request");
                sh.metrics.conn(Proto::connect, ConnResult::bad_request);
                http_reply(s, e.status()).await;
                return;
            }
        }
    };
    let d = match sh.open(&req.target, true).await {
        Ok(d) => d,
        Err(f) => {
            if matches!(f, Failure::Refused(Refusal::Denied)) {
                tracing::info!(target = %req.target, "CONNECT denied");
            }
            // Every failure answers alike (like a name that does not resolve): the client (a
            // guest's CatalogSource status) learns nothing about what exists behind the gateway.
            sh.metrics.conn(Proto::connect, f.result());
            http_reply(s, "502 Bad Gateway").await;
            return;
        }
    };
    if s.write_all(b"HTTP/1.1 200 Connection Established\r\n\r\n")
        .await
        .is_err()
    {
        return;
    }
    sh.metrics.conn(Proto::connect, d.result());
    let early = buf[req.head_len..].to_vec();
    splice(d, s, &early, sh.s.idle_timeout).await;
}

async fn handle_socks(sh: Arc<Shared>, s: TcpStream) {
    socks_request(sh, s, Proto::socks).await
}

/// A connection another replica forwarded: served only through our own tunnel session.
async fn handle_peer(sh: Arc<Shared>, s: TcpStream) {
    socks_request(sh, s, Proto::peer).await
}

async fn socks_request(sh: Arc<Shared>, mut s: TcpStream, proto: Proto) {
    let may_forward = proto != Proto::peer;
    let deadline = tokio::time::Instant::now() + sh.s.handshake_timeout;
    let mut buf = Vec::with_capacity(512);
    let mut chunk = [0u8; 1024];
    let bad = |sh: &Shared| sh.metrics.conn(proto, ConnResult::bad_request);
    // Greeting.
    let used = loop {
        match socks::parse_greeting(&buf) {
            Ok(Some(n)) => break n,
            Ok(None) => {}
            Err(e) => {
                tracing::debug!(error = %e, "bad SOCKS greeting");
                bad(&sh);
                let _ = s.write_all(&[5, 0xff]).await;
                return;
            }
        }
        match tokio::time::timeout_at(deadline, s.read(&mut chunk)).await {
            Ok(Ok(n)) if n > 0 && buf.len() + n <= 512 => buf.extend_from_slice(&chunk[..n]),
            _ => {
                bad(&sh);
                return;
            }
        }
    };
    buf.drain(..used);
    if s.write_all(&[5, 0]).await.is_err() {
        return;
    }
    let (target, used) = loop {
        match socks::parse_request(&buf) {
            Ok(Some(x)) => break x,
            Ok(None) => {}
            Err(e) => {
                tracing::debug!(error = %e, "bad SOCKS request");
                bad(&sh);
                let _ = s.write_all(&socks::reply(e.reply_code())).await;
                return;
            }
        }
        match tokio::time::timeout_at(deadline, s.read(&mut chunk)).await {
            Ok(Ok(n)) if n > 0 && buf.len() + n <= 512 => buf.extend_from_slice(&chunk[..n]),
            _ => {
                bad(&sh);
                return;
            }
        }
    };
    let d = match sh.open(&target, may_forward).await {
        Ok(d) => d,
        Err(f) => {
            let code = match f {
                Failure::Refused(r) => {
                    if r == Refusal::Denied {
                        tracing::info!(%target, "SOCKS CONNECT denied");
                    }
                    // like a name that does not resolve (see handle_connect)
                    socks::REP_HOST_UNREACHABLE
                }
                Failure::DialFailed => socks::REP_CONNECTION_REFUSED,
            };
            sh.metrics.conn(proto, f.result());
            let _ = s.write_all(&socks::reply(code)).await;
            return;
        }
    };
    if s.write_all(&socks::reply(socks::REP_SUCCEEDED))
        .await
        .is_err()
    {
        return;
    }
    sh.metrics.conn(proto, d.result());
    let early = buf[used..].to_vec();
    splice(d, s, &early, sh.s.idle_timeout).await;
}

/// A connection the agent opened to one of our exposed ports.
async fn handle_inbound(sh: Arc<Shared>, c: TcpConn) {
    let Some((_, target)) = sh.s.exposed.iter().find(|(p, _)| *p == c.local.port()) else {
        sh.metrics.conn(Proto::exposed, ConnResult::denied);
        return;
    };
    let addr = match tokio::net::lookup_host(target.as_str()).await {
        Ok(mut a) => a.next(),
        Err(_) => None,
    };
    let Some(addr) = addr else {
        sh.metrics.conn(Proto::exposed, ConnResult::resolve_failed);
        return;
    };
    match tokio::time::timeout(DIAL_TIMEOUT, TcpStream::connect(addr)).await {
        Ok(Ok(os)) => {
            let _ = os.set_nodelay(true);
            sh.metrics.conn(Proto::exposed, ConnResult::ok);
            if c.relay(os, sh.s.idle_timeout).await.is_err() {
                tracing::debug!(%target, "idle exposed-service relay closed");
            }
        }
        _ => {
            tracing::info!(%target, "exposed service dial failed");
            sh.metrics.conn(Proto::exposed, ConnResult::dial_failed);
        }
    }
}

async fn accept_loop<F, Fut>(sh: Arc<Shared>, l: TcpListener, proto: Proto, f: F)
where
    F: Fn(Arc<Shared>, TcpStream) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    loop {
        let s = tokio::select! {
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
        let Ok(permit) = Arc::clone(&sh.slots).try_acquire_owned() else {
            sh.over_limit(proto);
            drop(s);
            continue;
        };
        let _ = s.set_nodelay(true);
        let fut = f(Arc::clone(&sh), s);
        sh.tracker.spawn(async move {
            fut.await;
            drop(permit);
        });
    }
}

/// Whether the agent is gone: it was heard from once, and not for `timeout` since (pure).
pub fn peer_gone(since_authenticated: Option<Duration>, timeout: Duration) -> bool {
    since_authenticated.is_some_and(|d| d > timeout)
}

/// Watches the tunnel: when the agent goes silent past the peer timeout, every tunnel
/// connection is reset (a client such as OLM's catalog-operator would otherwise hold a
/// stalled stream for minutes and keep reporting READY) and new ones are refused until
/// the agent is heard from again.
async fn watch_peer(sh: Arc<Shared>, status: tokio::sync::watch::Receiver<PeerStatus>) {
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = sh.cancel.cancelled() => return,
            _ = tick.tick() => {}
        }
        let since = status.borrow().since_authenticated;
        let gone = peer_gone(since, sh.s.peer_timeout);
        if gone == sh.peer_gone.swap(gone, Ordering::SeqCst) {
            continue;
        }
        if gone {
            let reset = sh.stack.abort_all().await.unwrap_or(0);
            tracing::warn!(
                silent_seconds = since.map_or(0, |d| d.as_secs()),
                reset_connections = reset,
                "guest agent unreachable: tunnel connections reset, new ones refused"
            );
        } else {
            tracing::info!("guest agent reachable again");
        }
    }
}

/// Binds everything, runs until SIGTERM/SIGINT, drains.
/// The gateway's registry: build info, the split-DNS metrics and the tunnel metrics.
pub(crate) fn metrics() -> (Registry, DnsMetrics, TunnelMetrics) {
    let mut registry = daemon::registry("hcp-olm-gateway");
    let dns = DnsMetrics::register(&mut registry);
    let tunnel = TunnelMetrics::register(&mut registry);
    (registry, dns, tunnel)
}

/// The WireGuard UDP socket: `listen`, or with `dual_stack` one socket for both families on
/// `[::]:port` (IPv4 peers arrive as `::ffff:a.b.c.d`), falling back to `listen` (`0.0.0.0`)
/// where the pod has no IPv6 (kernel or sysctl without it).
async fn bind_wireguard(listen: SocketAddr, dual_stack: bool) -> std::io::Result<UdpSocket> {
    if dual_stack {
        let any6 = SocketAddr::new(IpAddr::V6(std::net::Ipv6Addr::UNSPECIFIED), listen.port());
        let dual = || -> std::io::Result<std::net::UdpSocket> {
            use socket2::{Domain, Protocol, Socket, Type};
            let sock = Socket::new(Domain::IPV6, Type::DGRAM, Some(Protocol::UDP))?;
            sock.set_only_v6(false)?;
            sock.bind(&any6.into())?;
            sock.set_nonblocking(true)?;
            Ok(sock.into())
        };
        match dual() {
            Ok(sock) => return UdpSocket::from_std(sock),
            Err(e) => tracing::info!(
                error = %e,
                "no IPv6 socket here; the WireGuard socket takes IPv4 only"
            ),
        }
    }
    UdpSocket::bind(listen).await
}

pub async fn run(s: GatewaySettings) -> anyhow::Result<()> {
    use anyhow::Context;
    let udp = bind_wireguard(s.listen, s.listen_dual_stack)
        .await
        .with_context(|| format!("bind wireguard udp {}", s.listen))?;
    if let Ok(a) = udp.local_addr() {
        tracing::info!(wireguard = %a, "wireguard socket bound");
    }
    let connect = match s.connect_listen {
        Some(a) => Some(
            TcpListener::bind(a)
                .await
                .with_context(|| format!("bind connect {a}"))?,
        ),
        None => None,
    };
    let socks_l = match s.socks_listen {
        Some(a) => Some(
            TcpListener::bind(a)
                .await
                .with_context(|| format!("bind socks {a}"))?,
        ),
        None => None,
    };
    let peer_l = match s.peer_listen {
        Some(a) => Some(
            TcpListener::bind(a)
                .await
                .with_context(|| format!("bind peer {a}"))?,
        ),
        None => None,
    };
    let admin = TcpListener::bind(s.health_listen)
        .await
        .with_context(|| format!("bind health {}", s.health_listen))?;
    let dns_sockets = match s.dns_listen {
        Some(a) => {
            let pair = crate::server::bind_udp_and_tcp(a)
                .await
                .with_context(|| format!("bind dns udp and tcp {a}"))?;
            Some(pair)
        }
        None => None,
    };

    let cancel = CancellationToken::new();
    let peer = Peer::new(PeerConfig {
        private_key: s.keys.private_key.clone(),
        peer_public_key: s.keys.peer_public_key,
        preshared_key: None,
        endpoint: None,
        persistent_keepalive: (s.keepalive > 0).then_some(s.keepalive),
        dead_peer_timeout: None,
        allowed_ips: s.allowed_sources.clone(),
        index: rand::random(),
        previous_private_keys: s.keys.previous_private_keys.clone(),
        previous_peer_public_keys: s.keys.previous_peer_public_keys.clone(),
        solicit_after: Some(s.peer_timeout),
    });
    let (handle, _tunnel_task) = driver::spawn(udp, peer, cancel.clone());
    let gw_ip = s.tunnel.0;
    let agent_ip = s.agent_ip;
    let pair6 = s.tunnel6.map(|((gw6, _), agent6)| (gw6, agent6));
    let ports: Vec<u16> = s.exposed.iter().map(|(p, _)| *p).collect();
    let (registry, dns_metrics, metrics) = metrics();
    let slots = Arc::new(tokio::sync::Semaphore::new(s.max_connections as usize));
    let syn_slots = Arc::clone(&slots);
    let syn_metrics = metrics.clone();
    let (stack, inbound) = stack::spawn(
        StackConfig {
            addresses: std::iter::once(s.tunnel)
                .chain(s.tunnel6.map(|(own, _)| own))
                .collect(),
            any_ip: false,
            mtu: s.mtu,
            accept: Arc::new(move |dst: SocketAddr, src: SocketAddr| {
                // from the agent's tunnel address to ours, of either pair
                let pair = (dst.ip() == gw_ip && src.ip() == agent_ip)
                    || pair6.is_some_and(|(gw6, agent6)| dst.ip() == gw6 && src.ip() == agent6);
                if !(pair && ports.contains(&dst.port())) {
                    return false;
                }
                // over max_connections: reset at the SYN, before any socket exists
                let room = syn_slots.available_permits() > 0;
                if !room {
                    syn_metrics.conn(Proto::exposed, ConnResult::over_limit);
                }
                room
            }),
            dial_first: None,
        },
        handle.from_peer,
        handle.to_peer,
        cancel.clone(),
    );

    let engine_cfg = s
        .dns
        .validate()
        .map_err(|e| anyhow::anyhow!("dns config: {e}"))?;
    let dns = DnsServer::with_guest_exchange(
        Arc::new(Engine::new(engine_cfg)),
        dns_metrics,
        Some(Arc::new(StackExchange(stack.clone()))),
    );
    if let Some((u, t)) = dns_sockets {
        dns.spawn_udp(u);
        dns.spawn_tcp(t);
    }
    let draining = Arc::new(AtomicBool::new(false));
    let reload = s
        .key_reload
        .zip(s.config_path.clone())
        .map(|(every, path)| {
            (every, move || {
                daemon::load_json::<GatewayConfig>(&path).and_then(|c| gateway_keys(&c))
            })
        });
    // The session flag is the metrics' only: readiness does not wait for a handshake (below).
    daemon::spawn_tunnel_upkeep(
        &metrics,
        handle.status.clone(),
        Arc::clone(&stack.counters),
        reload,
        (s.keys.clone(), handle.keys.clone()),
        cancel.clone(),
    );
    // Ready once bound, not on a handshake: the agent dials in through a Service, and a
    // Service sends nothing to a pod that is not ready, so a handshake-gated readiness
    // would never let the first handshake arrive. Tunnel state is in the metrics and in
    // the agent's readiness.
    daemon::spawn_admin(
        admin,
        registry,
        Arc::new(AtomicBool::new(true)),
        Arc::clone(&draining),
    );

    let listeners_cancel = CancellationToken::new();
    let sh = Arc::new(Shared {
        s,
        stack,
        dns: dns.clone(),
        metrics,
        tracker: TaskTracker::new(),
        cancel: listeners_cancel.clone(),
        peer_gone: AtomicBool::new(false),
        status: handle.status.clone(),
        slots,
    });
    tokio::spawn(watch_peer(Arc::clone(&sh), handle.status.clone()));
    if let Some(l) = connect {
        tracing::info!(addr = %l.local_addr()?, "HTTP CONNECT proxy listening");
        tokio::spawn(accept_loop(
            Arc::clone(&sh),
            l,
            Proto::connect,
            handle_connect,
        ));
    }
    if let Some(l) = socks_l {
        tracing::info!(addr = %l.local_addr()?, "SOCKS5 proxy listening");
        tokio::spawn(accept_loop(Arc::clone(&sh), l, Proto::socks, handle_socks));
    }
    if let Some(l) = peer_l {
        tracing::info!(addr = %l.local_addr()?, peers = ?sh.s.peers, "replica listener");
        tokio::spawn(accept_loop(Arc::clone(&sh), l, Proto::peer, handle_peer));
    }
    {
        let sh2 = Arc::clone(&sh);
        daemon::spawn_serving(sh.cancel.clone(), sh.tracker.clone(), inbound, move |c| {
            let Ok(permit) = Arc::clone(&sh2.slots).try_acquire_owned() else {
                sh2.over_limit(Proto::exposed);
                return None;
            };
            let fut = handle_inbound(Arc::clone(&sh2), c);
            Some(async move {
                fut.await;
                drop(permit);
            })
        });
    }
    tracing::info!(
        wireguard = %sh.s.listen,
        public_key = %sh.s.keys.private_key.public_key(),
        "gateway running"
    );
    daemon::terminated().await?;
    let drained = daemon::drain(
        &draining,
        &listeners_cancel,
        &sh.tracker,
        sh.s.drain_timeout,
    )
    .await;
    let _ = dns.shutdown(Duration::from_secs(1)).await;
    cancel.cancel();
    if drained {
        tracing::info!("drained");
        Ok(())
    } else {
        anyhow::bail!("drain did not finish within {:?}", sh.s.drain_timeout)
    }
}

/// The `nameserver` addresses of a `resolv.conf` text, in order.
pub fn resolv_conf_nameservers(text: &str) -> Vec<String> {
    text.lines()
        .filter_map(|l| {
            let mut w = l.split_whitespace();
            (w.next() == Some("nameserver")).then(|| w.next().map(str::to_string))?
        })
        .collect()
}

#[cfg(test)]
mod tests {

    #[test]
    fn peer_gone_only_after_being_heard_and_then_silent() {
        let t = Duration::from_secs(25);
        assert!(
            !peer_gone(None, t),
            "never heard: not gone (still connecting)"
        );
        assert!(!peer_gone(Some(Duration::from_secs(3)), t));
        assert!(!peer_gone(Some(t), t));
        assert!(peer_gone(Some(Duration::from_secs(26)), t));
    }

    #[test]
    fn a_replica_holds_the_session_only_while_the_agent_is_heard() {
        let t = Duration::from_secs(25);
        assert!(!has_session(None, t), "never heard: another replica has it");
        assert!(has_session(Some(Duration::from_secs(3)), t));
        assert!(has_session(Some(t), t));
        assert!(!has_session(Some(Duration::from_secs(26)), t));
    }

    #[test]
    fn own_addresses_are_told_from_other_replicas() {
        assert!(is_own_address("127.0.0.1".parse().unwrap()));
        // TEST-NET-2 is never assigned to this host
        assert!(!is_own_address("198.51.100.7".parse().unwrap()));
    }

    #[test]
    fn peer_timeout_defaults_to_two_keepalives_and_five_seconds() {
        let mut c = config();
        assert_eq!(
            GatewaySettings::from_config(&c).unwrap().peer_timeout,
            Duration::from_secs(55)
        );
        c.persistent_keepalive_seconds = Some(10);
        assert_eq!(
            GatewaySettings::from_config(&c).unwrap().peer_timeout,
            Duration::from_secs(25)
        );
        c.peer_timeout_seconds = Some(7);
        assert_eq!(
            GatewaySettings::from_config(&c).unwrap().peer_timeout,
            Duration::from_secs(7)
        );
        c.peer_timeout_seconds = Some(0);
        let e = GatewaySettings::from_config(&c).unwrap_err().to_string();
        assert!(e.contains("peer_timeout_seconds"), "{e}");
    }

    #[test]
    fn resolv_conf_nameservers_in_order() {
        let text = "# comment\nsearch a.svc.cluster.local\nnameserver 198.18.16.1\nnameserver  10.0.0.10 \noptions ndots:5\nnameserver\n";
        assert_eq!(
            super::resolv_conf_nameservers(text),
            ["198.18.16.1", "10.0.0.10"]
        );
    }
    use super::*;
    use hcp_olm_tunnel_api::GatewayDns;

    fn config() -> GatewayConfig {
        let k = PrivateKey::generate();
        GatewayConfig {
            listen_port: 51820,
            listen_address: None,
            private_key: Some(k.to_base64()),
            private_key_file: None,
            agent_public_key: k.public_key().to_string(),
            previous_private_key_files: vec![],
            previous_agent_public_keys: vec![],
            key_reload_seconds: None,
            tunnel_address: hcp_olm_tunnel_api::GATEWAY_TUNNEL_ADDRESS.into(),
            agent_tunnel_address: hcp_olm_tunnel_api::AGENT_TUNNEL_ADDRESS.into(),
            tunnel_address6: None,
            agent_tunnel_address6: None,
            guest_cidrs: vec!["10.96.0.0/12".into()],
            hcp_namespace: Some("clusters-a".into()),
            cluster_domain: None,
            socks_listen: None,
            connect_listen: Some("127.0.0.1:3128".into()),
            peer_listen: None,
            peers: None,
            health_listen: "127.0.0.1:9090".into(),
            dns: GatewayDns {
                local_upstreams: vec!["172.30.0.10".into()],
                rules: vec![],
                listen: None,
                allowed_clients: vec![],
                rate_limit_qps: None,
            },
            allowed_services: vec![],
            allowed_local_services: vec![],
            max_connections: None,
            handshake_timeout_seconds: None,
            idle_timeout_seconds: None,
            exposed_services: vec![],
            persistent_keepalive_seconds: None,
            peer_timeout_seconds: None,
            mtu: None,
            drain_timeout_seconds: None,
        }
    }

    #[test]
    fn rotation_keys_are_read_and_their_errors_name_the_field() {
        let mut c = config();
        let old = PrivateKey::generate();
        let dir = std::env::temp_dir().join(format!("hcp-olm-gw-keys-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("old-key");
        std::fs::write(&f, format!("{}\n", old.to_base64())).unwrap();
        c.previous_private_key_files = vec![f.display().to_string()];
        c.previous_agent_public_keys = vec![PrivateKey::generate().public_key().to_string()];
        let k = gateway_keys(&c).unwrap();
        assert_eq!(k.previous_private_keys[0].public_key(), old.public_key());
        assert_eq!(k.previous_peer_public_keys.len(), 1);
        assert_eq!(
            GatewaySettings::from_config(&c).unwrap().key_reload,
            Some(Duration::from_secs(5))
        );
        c.key_reload_seconds = Some(0);
        assert_eq!(GatewaySettings::from_config(&c).unwrap().key_reload, None);

        c.previous_agent_public_keys.push("short".into());
        let e = gateway_keys(&c).unwrap_err();
        assert_eq!(e.field, "previous_agent_public_keys[1]");
        c.previous_agent_public_keys.pop();
        std::fs::write(&f, "not a key").unwrap();
        let e = gateway_keys(&c).unwrap_err();
        assert_eq!(e.field, "previous_private_key_files[0]");
        assert!(!e.reason.contains(&old.to_base64()));
        std::fs::remove_dir_all(&dir).unwrap();
        let e = gateway_keys(&c).unwrap_err();
        assert_eq!(e.field, "previous_private_key_files[0]");
    }

    /// The IPv6 pair and one IPv6 guest range added to `config()` (dual stack).
    fn with_v6(c: &mut GatewayConfig) {
        c.tunnel_address6 = Some(hcp_olm_tunnel_api::GATEWAY_TUNNEL_ADDRESS6.into());
        c.agent_tunnel_address6 = Some(hcp_olm_tunnel_api::AGENT_TUNNEL_ADDRESS6.into());
        c.guest_cidrs.push("fd00:10:96::/112".into());
    }

    #[test]
    fn dual_stack_sources_and_reverse_zones_owned_by_the_guest() {
        let mut c = config();
        with_v6(&mut c);
        let s = GatewaySettings::from_config(&c).unwrap();
        let ip = |a: &str| a.parse::<IpAddr>().unwrap();
        assert_eq!(
            s.tunnel6,
            Some((
                (ip("fd9c:4f1e:7a2b:ffff::1"), 126),
                ip("fd9c:4f1e:7a2b:ffff::2")
            ))
        );
        for a in [
            "fd9c:4f1e:7a2b:ffff::2",
            "fd00:10:96::10",
            "100.127.255.2",
            "10.96.0.1",
        ] {
            assert!(s.allowed_sources.iter().any(|c| c.contains(ip(a))), "{a}");
        }
        for a in ["fd9c:4f1e:7a2b:ffff::3", "fd00:10:97::10"] {
            assert!(!s.allowed_sources.iter().any(|c| c.contains(ip(a))), "{a}");
        }
        // 10.96.0.0/12 → 16 zones, fd00:10:96::/112 → one zone at /112
        assert_eq!(owner(&s, "10.0.96.10.in-addr.arpa"), Owner::Guest);
        assert_eq!(owner(&s, "1.2.111.10.in-addr.arpa"), Owner::Guest);
        assert_eq!(owner(&s, "1.2.112.10.in-addr.arpa"), Owner::Local);
        assert_eq!(
            owner(
                &s,
                "a.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.6.9.0.0.0.1.0.0.0.0.d.f.ip6.arpa"
            ),
            Owner::Guest
        );
        assert_eq!(
            owner(
                &s,
                "a.0.0.0.1.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.6.9.0.0.0.1.0.0.0.0.d.f.ip6.arpa"
            ),
            Owner::Local
        );
        assert_eq!(owner(&s, "cat.team-a.svc.cluster.local"), Owner::Guest);
        assert_eq!(owner(&s, "cat.clusters-a.svc.cluster.local"), Owner::Local);
        assert_eq!(owner(&s, "quay.io"), Owner::Local);
        // Overlapping ranges give each zone once (the DNS table refuses duplicates).
        c.guest_cidrs.push("10.96.0.0/16".into());
        c.guest_cidrs.push("fd00:10:96::/120".into());
        let s = GatewaySettings::from_config(&c).unwrap();
        assert_eq!(owner(&s, "1.2.96.10.in-addr.arpa"), Owner::Guest);
        // Explicit rules are taken as they are.
        c.dns.rules = vec![DnsRule {
            suffix: ".".into(),
            namespace: None,
            owner: DnsOwner::Local,
        }];
        let s = GatewaySettings::from_config(&c).unwrap();
        assert_eq!(owner(&s, "10.0.96.10.in-addr.arpa"), Owner::Local);
    }

    fn owner(s: &GatewaySettings, name: &str) -> Owner {
        let cfg = s.dns.validate().unwrap();
        let mut n = Name::from_ascii(name).unwrap();
        n.set_fqdn(true);
        cfg.table.lookup(&n).owner
    }

    #[test]
    fn default_split_guest_svc_but_hcp_namespace_and_rest_local() {
        let s = GatewaySettings::from_config(&config()).unwrap();
        assert_eq!(owner(&s, "cat.team-a.svc.cluster.local"), Owner::Guest);
        assert_eq!(owner(&s, "cat.clusters-a.svc.cluster.local"), Owner::Local);
        assert_eq!(owner(&s, "quay.io"), Owner::Local);
        assert_eq!(s.mtu, 1420);
        assert!(
            s.allowed_sources
                .iter()
                .any(|c| c.contains("100.127.255.2".parse().unwrap()))
        );
    }

    #[test]
    fn errors_name_fields() {
        let mut c = config();
        c.private_key_file = Some("/nonexistent".into());
        assert_eq!(
            GatewaySettings::from_config(&c).unwrap_err().field,
            "private_key"
        );
        let mut c = config();
        c.connect_listen = None;
        assert_eq!(
            GatewaySettings::from_config(&c).unwrap_err().field,
            "connect_listen"
        );
        let mut c = config();
        c.dns.local_upstreams = vec!["nope".into()];
        assert_eq!(
            GatewaySettings::from_config(&c).unwrap_err().field,
            "dns.local_upstreams[0]"
        );
        let mut c = config();
        c.mtu = Some(100);
        assert_eq!(GatewaySettings::from_config(&c).unwrap_err().field, "mtu");
        for bad in ["peers-without-port", "bad_name!:1081", "peers:0", ":1081"] {
            let mut c = config();
            c.peers = Some(bad.into());
            assert_eq!(
                GatewaySettings::from_config(&c).unwrap_err().field,
                "peers",
                "{bad}"
            );
        }
        let mut c = config();
        c.peers = Some("hcp-olm-tunnel-gateway-peers.clusters-a.svc:1081".into());
        c.peer_listen = Some("0.0.0.0:1081".into());
        let s = GatewaySettings::from_config(&c).unwrap();
        assert_eq!(s.peer_listen, Some("0.0.0.0:1081".parse().unwrap()));
        c.peer_listen = Some("nope".into());
        assert_eq!(
            GatewaySettings::from_config(&c).unwrap_err().field,
            "peer_listen"
        );
        for (i, (ns, name, port, field)) in [
            ("*", "cat", 50051, "allowed_local_services[0].namespace"),
            ("clusters-a", "*", 50051, "allowed_local_services[0].name"),
            ("clusters-a", "a.b", 50051, "allowed_local_services[0].name"),
            ("clusters-a", "cat", 0, "allowed_local_services[0].port"),
        ]
        .into_iter()
        .enumerate()
        {
            let mut c = config();
            c.allowed_local_services = vec![AllowedService {
                namespace: ns.into(),
                name: name.into(),
                port,
            }];
            let e = GatewaySettings::from_config(&c).unwrap_err();
            assert_eq!(e.field, field, "case {i}");
        }
        for (f, set) in [
            (
                "max_connections",
                (|c: &mut GatewayConfig| c.max_connections = Some(0)) as fn(&mut GatewayConfig),
            ),
            ("handshake_timeout_seconds", |c| {
                c.handshake_timeout_seconds = Some(0)
            }),
            ("idle_timeout_seconds", |c| c.idle_timeout_seconds = Some(0)),
        ] {
            let mut c = config();
            set(&mut c);
            assert_eq!(GatewaySettings::from_config(&c).unwrap_err().field, f);
        }
        let mut c = config();
        c.dns.allowed_clients = vec!["10.0.0.0/8".into(), "nope".into()];
        assert_eq!(
            GatewaySettings::from_config(&c).unwrap_err().field,
            "dns.allowed_clients[1]"
        );
        let mut c = config();
        c.dns.rate_limit_qps = Some(0);
        assert_eq!(
            GatewaySettings::from_config(&c).unwrap_err().field,
            "dns.rate_limit_qps"
        );
        // Issue 19: the IPv6 pair and IPv6 guest ranges.
        type Edit = fn(&mut GatewayConfig);
        let cases: [(Edit, &str); 8] = [
            (
                |c| c.guest_cidrs.push("fd00:10:96::/112".into()),
                "guest_cidrs[1]",
            ),
            (
                |c| {
                    with_v6(c);
                    c.guest_cidrs.push("::/0".into());
                },
                "guest_cidrs[2]",
            ),
            (
                |c| {
                    with_v6(c);
                    c.guest_cidrs.push("fd9c:4f1e:7a2b::/48".into());
                },
                "guest_cidrs[2]",
            ),
            (
                |c| {
                    with_v6(c);
                    c.guest_cidrs.push("fd9c:4f1e:7a2b:ffff::/127".into());
                },
                "guest_cidrs[2]",
            ),
            (
                |c| {
                    with_v6(c);
                    c.agent_tunnel_address6 = None;
                },
                "agent_tunnel_address6",
            ),
            (
                |c| {
                    with_v6(c);
                    c.tunnel_address6 = None;
                },
                "tunnel_address6",
            ),
            (
                |c| {
                    with_v6(c);
                    c.tunnel_address6 = Some("100.127.254.1/30".into());
                },
                "tunnel_address6",
            ),
            (
                |c| {
                    with_v6(c);
                    c.agent_tunnel_address6 = Some("not-an-address/126".into());
                },
                "agent_tunnel_address6",
            ),
        ];
        for (i, (edit, field)) in cases.into_iter().enumerate() {
            let mut c = config();
            edit(&mut c);
            let e = GatewaySettings::from_config(&c).unwrap_err();
            assert_eq!(e.field, field, "case {i}: {e}");
        }
        // A guest range overlapping the tunnel's own /30 (documented as refused; it was not).
        let mut c = config();
        c.guest_cidrs = vec!["10.96.0.0/12".into(), "100.127.255.0/24".into()];
        let e = GatewaySettings::from_config(&c).unwrap_err();
        assert_eq!(e.field, "guest_cidrs[1]", "{e}");
        let s = GatewaySettings::from_config(&config()).unwrap();
        assert_eq!(
            (s.max_connections, s.handshake_timeout, s.idle_timeout),
            (128, Duration::from_secs(10), Duration::from_secs(3600))
        );
    }
}
