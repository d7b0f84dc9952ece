//! Tokio driver for the split-DNS engine: UDP and TCP listeners on pre-bound sockets,
//! forwarding to the owner's upstreams, RFC 8767 client response timer, bounded concurrency
//! and graceful shutdown.

pub mod file;
pub mod metrics;
mod udp_batch;
mod upstream;

use std::io;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use hickory_proto::op::{Message, MessageType, OpCode, Query, ResponseCode};
use hickory_proto::rr::{Name, RData, RecordType};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream, UdpSocket};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::dns::{Action, Engine, Forward, Reply, Transport};
pub use metrics::DnsMetrics;
pub use upstream::{GuestExchange, resolve};

/// Receive loops per UDP socket (cache hits are answered inline by these loops). One: each
/// wakeup reads and answers a whole batch (`udp_batch`), and a second loop on the same socket
/// would mostly wake up to find the queue already emptied.
const UDP_WORKERS: usize = 1;
/// Queries answered per unit of tokio's cooperative budget in the UDP loop.
const BUDGET_EVERY: usize = 4;
/// Forwarded queries in flight per TCP connection (RFC 7766 pipelining).
const TCP_PIPELINE: usize = 32;
/// Client addresses whose rate-limit state is kept; when full, idle ones are forgotten and
/// new ones are dropped until there is room.
const MAX_TRACKED_CLIENTS: usize = 16_384;

/// Ports tried for `listen: <ip>:0` before giving up (each try holds its UDP port, so the
/// kernel offers a new one every time).
const PAIR_BIND_TRIES: usize = 128;

/// Binds the DNS listeners: UDP and TCP on one address. With port 0 the kernel picks the UDP
/// port, and that port can be taken for TCP; then another UDP port is tried (the refused ones
/// are held until the end so none is offered twice), up to [`PAIR_BIND_TRIES`] ports.
pub async fn bind_udp_and_tcp(addr: SocketAddr) -> io::Result<(UdpSocket, TcpListener)> {
    if addr.port() != 0 {
        let udp = UdpSocket::bind(addr).await?;
        let tcp = TcpListener::bind(addr).await?;
        return Ok((udp, tcp));
    }
    let mut refused = Vec::new();
    for _ in 0..PAIR_BIND_TRIES {
        let udp = UdpSocket::bind(addr).await?;
        let bound = udp.local_addr()?;
        match TcpListener::bind(bound).await {
            Ok(tcp) => return Ok((udp, tcp)),
            Err(e) if e.kind() == io::ErrorKind::AddrInUse => refused.push(udp),
            Err(e) => return Err(e),
        }
    }
    Err(io::Error::new(
        io::ErrorKind::AddrInUse,
        format!(
            "no port on {} free for both UDP and TCP in {PAIR_BIND_TRIES} tries",
            addr.ip()
        ),
    ))
}

/// Per-client token buckets (queries per second, burst).
#[derive(Debug)]
struct ClientLimiter {
    qps: f64,
    burst: f64,
    buckets: std::sync::Mutex<std::collections::HashMap<IpAddr, (f64, std::time::Instant)>>,
}

impl ClientLimiter {
    fn new(qps: u32, burst: u32) -> Self {
        Self {
            qps: f64::from(qps),
            burst: f64::from(burst),
            buckets: std::sync::Mutex::new(std::collections::HashMap::new()),
        }
    }

    /// Takes one token for `ip`; false when its bucket is empty.
    fn allow(&self, ip: IpAddr, now: std::time::Instant) -> bool {
        let mut b = self.buckets.lock().unwrap_or_else(|p| p.into_inner());
        if !b.contains_key(&ip) && b.len() >= MAX_TRACKED_CLIENTS {
            let (qps, burst) = (self.qps, self.burst);
            b.retain(|_, (t, at)| *t + now.duration_since(*at).as_secs_f64() * qps < burst);
            if b.len() >= MAX_TRACKED_CLIENTS {
                return false;
            }
        }
        let (tokens, at) = b.entry(ip).or_insert((self.burst, now));
        *tokens = (*tokens + now.duration_since(*at).as_secs_f64() * self.qps).min(self.burst);
        *at = now;
        if *tokens >= 1.0 {
            *tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

/// The DNS server. Clone is cheap; all clones share state.
#[derive(Clone, Debug)]
pub struct DnsServer {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    engine: Arc<Engine>,
    metrics: DnsMetrics,
    inflight: Arc<Semaphore>,
    tcp_conns: Arc<Semaphore>,
    tracker: TaskTracker,
    cancel: CancellationToken,
    guest: Option<Arc<dyn GuestExchange>>,
    limiter: ClientLimiter,
}

impl DnsServer {
    pub fn new(engine: Arc<Engine>, metrics: DnsMetrics) -> Self {
        Self::with_guest_exchange(engine, metrics, None)
    }

    /// A server whose guest-owned queries go through `guest` (e.g. the tunnel's userspace
    /// stack) instead of OS sockets.
    pub fn with_guest_exchange(
        engine: Arc<Engine>,
        metrics: DnsMetrics,
        guest: Option<Arc<dyn GuestExchange>>,
    ) -> Self {
        let cfg = engine.config();
        let inflight = Arc::new(Semaphore::new(cfg.max_in_flight));
        let tcp_conns = Arc::new(Semaphore::new(cfg.max_tcp_connections));
        let limiter = ClientLimiter::new(cfg.client_rate_qps, cfg.client_rate_burst);
        Self {
            inner: Arc::new(Inner {
                engine,
                metrics,
                inflight,
                tcp_conns,
                tracker: TaskTracker::new(),
                cancel: CancellationToken::new(),
                guest,
                limiter,
            }),
        }
    }

    pub fn engine(&self) -> &Arc<Engine> {
        &self.inner.engine
    }

    pub fn metrics(&self) -> &DnsMetrics {
        &self.inner.metrics
    }

    /// Serve UDP on a pre-bound socket until shutdown.
    pub fn spawn_udp(&self, socket: UdpSocket) {
        let socket = Arc::new(socket);
        for _ in 0..UDP_WORKERS {
            let this = self.clone();
            let socket = Arc::clone(&socket);
            self.inner
                .tracker
                .spawn(async move { this.udp_loop(socket).await });
        }
    }

    /// Serve TCP (RFC 7766) on a pre-bound listener until shutdown.
    pub fn spawn_tcp(&self, listener: TcpListener) {
        let this = self.clone();
        self.inner
            .tracker
            .spawn(async move { this.tcp_accept_loop(listener).await });
    }

    /// Stop accepting, let in-flight queries finish for up to `grace`. Returns true when
    /// everything drained in time.
    pub async fn shutdown(&self, grace: Duration) -> bool {
        self.inner.cancel.cancel();
        self.inner.tracker.close();
        tokio::time::timeout(grace, self.inner.tracker.wait())
            .await
            .is_ok()
    }

    /// Handle one client message end to end (used by listeners and by in-process callers such
    /// as the gateway resolving CONNECT targets). `None` means drop.
    pub async fn answer(&self, bytes: &[u8], transport: Transport) -> Option<Reply> {
        match self.handle(bytes, transport, None, std::time::Instant::now()) {
            Handled::Done(r) => r,
            Handled::Forward(f, permit) => Some(self.answer_forward(f, permit).await),
        }
    }

    /// Resolve `name` to addresses (A, then AAAA if there are none) through the ownership
    /// table, cache and owners exactly like a client query (used by the gateway for CONNECT
    /// targets). Relative names are taken as absolute.
    pub async fn lookup_ip(&self, name: &str) -> Result<Vec<IpAddr>, LookupError> {
        self.lookup_families(name, &[RecordType::A, RecordType::AAAA])
            .await
    }

    /// Like [`DnsServer::lookup_ip`], asking for the record types `rtypes` (A, AAAA) in
    /// order and returning the first non-empty answer: a dual-stack gateway asks only for the
    /// families it can dial. NXDOMAIN ends the lookup.
    pub async fn lookup_families(
        &self,
        name: &str,
        rtypes: &[RecordType],
    ) -> Result<Vec<IpAddr>, LookupError> {
        let mut n = Name::from_ascii(name).map_err(|_| LookupError::InvalidName(name.into()))?;
        n.set_fqdn(true);
        for &rtype in rtypes {
            let mut m = Message::new(rand::random(), MessageType::Query, OpCode::Query);
            m.metadata.recursion_desired = true;
            m.add_query(Query::query(n.clone(), rtype));
            let bytes = m
                .to_vec()
                .map_err(|_| LookupError::InvalidName(name.into()))?;
            let reply = self
                .answer(&bytes, Transport::Tcp)
                .await
                .ok_or(LookupError::Failed(ResponseCode::ServFail))?;
            let msg = Message::from_vec(&reply.bytes)
                .map_err(|_| LookupError::Failed(ResponseCode::ServFail))?;
            match msg.metadata.response_code {
                ResponseCode::NoError => {}
                ResponseCode::NXDomain => return Err(LookupError::NxDomain(name.into())),
                other => return Err(LookupError::Failed(other)),
            }
            let ips: Vec<IpAddr> = msg
                .answers
                .iter()
                .filter_map(|r| match &r.data {
                    RData::A(a) => Some(IpAddr::V4(a.0)),
                    RData::AAAA(a) => Some(IpAddr::V6(a.0)),
                    _ => None,
                })
                .collect();
            if !ips.is_empty() {
                return Ok(ips);
            }
        }
        Err(LookupError::NoAddresses(name.into()))
    }

    /// `client`: the source address of a listener's query (checked against
    /// `clients.allowed` and the rate limit); None for in-process callers.
    /// `now`: one reading of the clock for a whole receive batch.
    fn handle(
        &self,
        bytes: &[u8],
        transport: Transport,
        client: Option<IpAddr>,
        now: std::time::Instant,
    ) -> Handled {
        let i = &self.inner;
        if let Some(ip) = client {
            let ip = match ip {
                IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
                v4 => v4,
            };
            let cfg = i.engine.config();
            if !cfg.allowed_clients.iter().any(|c| c.contains(ip)) {
                i.metrics.clients_refused.inc();
                return Handled::Done(i.engine.refused_reply(bytes));
            }
            if !i.limiter.allow(ip, now) {
                i.metrics.rate_limited.inc();
                return Handled::Done(None);
            }
        }
        match i.engine.handle_query(bytes, transport, now) {
            Action::Reply(r) => {
                i.metrics.observe(&r.outcome);
                Handled::Done(Some(r))
            }
            Action::Drop => {
                i.metrics.dropped();
                Handled::Done(None)
            }
            Action::Forward(f) => match Arc::clone(&i.inflight).try_acquire_owned() {
                Ok(p) => Handled::Forward(f, p),
                Err(_) => {
                    i.metrics.overloaded.inc();
                    let r = i.engine.rcode_reply(&f.query, ResponseCode::Refused);
                    i.metrics.observe(&r.outcome);
                    Handled::Done(Some(r))
                }
            },
        }
    }

    /// Resolve through the owner with the RFC 8767 client response timer: if the owner has not
    /// answered within `client_timer` and a stale answer exists, return it at once and let the
    /// resolution finish in the background to refresh the cache (the permit goes with it).
    async fn answer_forward(&self, f: Forward, permit: OwnedSemaphorePermit) -> Reply {
        let i = &self.inner;
        let q = f.query.clone();
        let mut fut = Box::pin(upstream::resolve_with(
            Arc::clone(&i.engine),
            i.metrics.clone(),
            f,
            i.guest.clone(),
        ));
        let timer = tokio::time::sleep(i.engine.config().client_timer);
        let reply = tokio::select! {
            r = &mut fut => r,
            _ = timer => match i.engine.stale_reply(&q, std::time::Instant::now()) {
                Some(stale) => {
                    i.tracker.spawn(async move {
                        let _ = fut.await;
                        drop(permit);
                    });
                    i.metrics.observe(&stale.outcome);
                    return stale;
                }
                None => fut.await,
            },
        };
        drop(permit);
        i.metrics.observe(&reply.outcome);
        reply
    }

    async fn udp_loop(self, socket: Arc<UdpSocket>) {
        use std::os::fd::AsRawFd;
        use tokio::io::Interest;
        let fd = socket.as_raw_fd();
        let mut rx = udp_batch::Receiver::new();
        let mut tx = udp_batch::Sender::new();
        loop {
            tokio::select! {
                _ = self.inner.cancel.cancelled() => return,
                r = socket.async_io(Interest::READABLE, || rx.recv(fd)) => if let Err(e) = r {
                    // ICMP errors from earlier sends surface here on some platforms.
                    tracing::debug!(error = %e, "udp recv error");
                    continue;
                },
            }
            let now = std::time::Instant::now();
            for (n, (bytes, got)) in rx.datagrams().enumerate() {
                // One unit of tokio's cooperative budget per BUDGET_EVERY queries (the read
                // itself spends one): a flood of cached queries yields the worker to the TCP
                // listener, forwarded queries and (in the gateway) the tunnel after at most
                // 128 × BUDGET_EVERY queries, a few milliseconds. (A unit per query cost 15%
                // of the answers per CPU-second in `BENCH_LEGS=dns`.)
                if n % BUDGET_EVERY == BUDGET_EVERY - 1 {
                    tokio::task::consume_budget().await;
                }
                let Some(peer) = got.peer else {
                    self.inner.metrics.dropped();
                    continue;
                };
                if got.truncated {
                    tracing::debug!(%peer, "udp query longer than {} bytes dropped", udp_batch::MAX_QUERY);
                    self.inner.metrics.dropped();
                    continue;
                }
                match self.handle(bytes, Transport::Udp, Some(peer.ip()), now) {
                    Handled::Done(None) => {}
                    Handled::Done(Some(r)) => tx.push(r.bytes, peer),
                    Handled::Forward(f, permit) => {
                        let this = self.clone();
                        let socket = Arc::clone(&socket);
                        self.inner.tracker.spawn(async move {
                            let r = this.answer_forward(f, permit).await;
                            send_udp(&socket, &r.bytes, peer).await;
                        });
                    }
                }
            }
            while !tx.is_empty() {
                let sent = tokio::select! {
                    _ = self.inner.cancel.cancelled() => return,
                    r = socket.async_io(Interest::WRITABLE, || tx.send(fd)) => r,
                };
                if let Err(e) = sent {
                    // The first answer's own failure (an unreachable peer): drop it, go on.
                    let peer = tx.drop_first();
                    tracing::debug!(?peer, error = %e, "udp send failed");
                }
            }
        }
    }

    async fn tcp_accept_loop(self, listener: TcpListener) {
        loop {
            let (stream, peer) = tokio::select! {
                _ = self.inner.cancel.cancelled() => return,
                r = listener.accept() => match r {
                    Ok(x) => x,
                    Err(e) => {
                        tracing::warn!(error = %e, "tcp accept error");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                },
            };
            let Ok(permit) = Arc::clone(&self.inner.tcp_conns).try_acquire_owned() else {
                self.inner.metrics.overloaded.inc();
                drop(stream);
                continue;
            };
            let this = self.clone();
            self.inner.tracker.spawn(async move {
                if let Err(e) = this.tcp_conn(stream, peer.ip()).await {
                    tracing::debug!(%peer, error = %e, "tcp connection ended");
                }
                drop(permit);
            });
        }
    }

    async fn tcp_conn(&self, stream: TcpStream, client: IpAddr) -> io::Result<()> {
        let _ = stream.set_nodelay(true);
        let (mut rd, mut wr) = stream.into_split();
        let (tx, mut rx) = mpsc::channel::<Vec<u8>>(TCP_PIPELINE);
        let writer = tokio::spawn(async move {
            while let Some(msg) = rx.recv().await {
                let Ok(len) = u16::try_from(msg.len()) else {
                    continue;
                };
                let mut frame = Vec::with_capacity(msg.len() + 2);
                frame.extend_from_slice(&len.to_be_bytes());
                frame.extend_from_slice(&msg);
                if wr.write_all(&frame).await.is_err() {
                    return;
                }
            }
            let _ = wr.shutdown().await;
        });
        let pipeline = Arc::new(Semaphore::new(TCP_PIPELINE));
        let idle = self.inner.engine.config().tcp_idle_timeout;
        let mut buf = vec![0u8; 65_535];
        loop {
            let mut len = [0u8; 2];
            let deadline = Instant::now() + idle;
            let got = tokio::select! {
                _ = self.inner.cancel.cancelled() => break,
                r = tokio::time::timeout_at(deadline, rd.read_exact(&mut len)) => r,
            };
            match got {
                Ok(Ok(_)) => {}
                Ok(Err(_)) | Err(_) => break, // EOF, error or idle timeout
            }
            let n = usize::from(u16::from_be_bytes(len));
            if n == 0 {
                self.inner.metrics.dropped();
                break;
            }
            match tokio::time::timeout_at(deadline, rd.read_exact(&mut buf[..n])).await {
                Ok(Ok(_)) => {}
                _ => break,
            }
            match self.handle(
                &buf[..n],
                Transport::Tcp,
                Some(client),
                std::time::Instant::now(),
            ) {
                Handled::Done(None) => {
                    // Garbage on a stream: the framing can no longer be trusted.
                    break;
                }
                Handled::Done(Some(r)) => {
                    if tx.send(r.bytes).await.is_err() {
                        break;
                    }
                }
                Handled::Forward(f, permit) => {
                    let Ok(slot) = Arc::clone(&pipeline).acquire_owned().await else {
                        break;
                    };
                    let this = self.clone();
                    let tx = tx.clone();
                    self.inner.tracker.spawn(async move {
                        let r = this.answer_forward(f, permit).await;
                        let _ = tx.send(r.bytes).await;
                        drop(slot);
                    });
                }
            }
        }
        drop(tx);
        // In-flight answers still hold senders; the writer exits after the last one.
        let _ = writer.await;
        Ok(())
    }
}

/// Why [`DnsServer::lookup_ip`] found no address.
#[derive(Debug, thiserror::Error)]
pub enum LookupError {
    #[error("invalid DNS name `{0}`")]
    InvalidName(String),
    #[error("`{0}` does not exist (NXDOMAIN from its owner)")]
    NxDomain(String),
    #[error("`{0}` has no A or AAAA records")]
    NoAddresses(String),
    #[error("resolution failed: {0}")]
    Failed(ResponseCode),
}

enum Handled {
    Done(Option<Reply>),
    Forward(Forward, OwnedSemaphorePermit),
}

async fn send_udp(socket: &UdpSocket, bytes: &[u8], peer: SocketAddr) {
    if let Err(e) = socket.send_to(bytes, peer).await {
        tracing::debug!(%peer, error = %e, "udp send failed");
    }
}
