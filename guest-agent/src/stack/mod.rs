//! A userspace TCP/IP stack (smoltcp) for the tunnel's inner packets. No I/O of its own: it
//! takes decrypted IP packets from the WireGuard engine and gives back packets to encrypt.
//! [`spawn`] drives it on tokio and hands out TCP connections and UDP sockets as channel
//! pairs, so that relays never touch smoltcp directly.
//!
//! - Listening: instead of pre-created listeners, every inbound SYN (no ACK) is shown to an
//!   [`AcceptPolicy`]; when it allows the destination and no socket already covers the
//!   4-tuple, a listener on exactly that destination is created just before smoltcp sees the
//!   SYN. Refused destinations get smoltcp's RST. In "any IP" mode (the agent) this accepts
//!   connections to arbitrary guest addresses the gateway opens.
//! - Dial first (the agent, [`StackConfig::dial_first`]): an allowed SYN is held and shown to
//!   the application, which dials the real destination; only when that succeeds
//!   ([`Stack::dial_done`]) does the listener take the SYN, else smoltcp answers it with a
//!   RST — so the far side's connect fails as the destination refused, instead of succeeding
//!   and then seeing an empty stream. Retransmitted SYNs of a held one are dropped.
//! - MTU/MSS: the device MTU is the tunnel MTU (1420), so smoltcp advertises and uses an MSS of
//!   MTU − 40 (IPv4) and never emits a larger packet; a peer's larger MSS is clamped to ours.
//! - Flow control: data moves between smoltcp buffers and bounded channels only when the
//!   other side has room, so a slow reader closes the TCP window instead of growing memory.

mod device;

use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use smoltcp::iface::{Config, Interface, SocketHandle, SocketSet};
use smoltcp::socket::{tcp, udp};
use smoltcp::wire::{HardwareAddress, IpAddress, IpCidr, IpEndpoint, IpListenEndpoint};
use tokio::sync::{Notify, mpsc, oneshot};
use tokio_util::sync::CancellationToken;

use device::QueueDevice;

/// Per-connection smoltcp send buffer.
const TCP_BUF: usize = 256 * 1024;
/// Per-connection smoltcp receive buffer: the window this side advertises, so the most the
/// peer sends back to back. Kept to what a kernel-default UDP receive buffer absorbs.
const TCP_RX_BUF: usize = 128 * 1024;
/// Chunk size moved from a socket to its channel.
const CHUNK: usize = 16 * 1024;
/// Chunks buffered per direction in the channels.
const CHAN: usize = 16;
const UDP_PACKETS: usize = 64;
const UDP_BUF: usize = 64 * 1024;
/// A spawned listener that never saw its SYN is removed after this.
const LISTEN_TTL: Duration = Duration::from_secs(10);
/// An outbound connect that has not completed is aborted after this.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(15);
const FIRST_EPHEMERAL: u16 = 49_152;

/// Decides which inbound TCP destinations get a listener.
pub type AcceptPolicy = Arc<dyn Fn(SocketAddr, SocketAddr) -> bool + Send + Sync>;

/// Stack configuration.
#[derive(Clone)]
pub struct StackConfig {
    /// Our tunnel addresses (with prefix).
    pub addresses: Vec<(IpAddr, u8)>,
    /// Accept packets for any destination address (the agent's relay mode).
    pub any_ip: bool,
    /// Inner MTU.
    pub mtu: usize,
    /// `(local destination, remote source)` of an inbound SYN → accept?
    pub accept: AcceptPolicy,
    /// Dial first: allowed SYNs are held and `(remote source, local destination)` sent here;
    /// answer each with [`Stack::dial_done`]. `None`: accept at once.
    pub dial_first: Option<mpsc::Sender<(SocketAddr, SocketAddr)>>,
}

/// SYNs held while their destinations are dialled, at most (more are refused).
const MAX_HELD_SYNS: usize = 256;
/// A held SYN the application has not answered for this long is refused.
const HELD_TTL: Duration = Duration::from_secs(20);

/// Counters of the stack.
#[derive(Debug, Default)]
pub struct StackCounters {
    pub packets_in: AtomicU64,
    pub packets_out: AtomicU64,
    pub tcp_accepted: AtomicU64,
    pub tcp_refused: AtomicU64,
    pub tcp_connected: AtomicU64,
    pub tcp_connect_failed: AtomicU64,
}

/// One TCP connection's application side. Dropping [`TcpConn::tx`] sends FIN after the queued
/// data; `rx` yields `None` at the peer's FIN or a reset.
#[derive(Debug)]
pub struct TcpConn {
    pub local: SocketAddr,
    pub remote: SocketAddr,
    pub rx: mpsc::Receiver<Bytes>,
    pub tx: mpsc::Sender<Bytes>,
    notify: Arc<Notify>,
}

impl TcpConn {
    /// Queue data for the peer.
    pub async fn send(&self, b: Bytes) -> io::Result<()> {
        self.tx.send(b).await.map_err(|_| stopped())?;
        self.notify.notify_one();
        Ok(())
    }

    /// Next data from the peer; `None` at its FIN or a reset.
    pub async fn recv(&mut self) -> Option<Bytes> {
        let r = self.rx.recv().await;
        self.notify.notify_one();
        r
    }

    /// Relays between this connection and an OS TCP stream until both directions end, or
    /// until no byte moved either way for `idle` (then both sides are closed and
    /// `ErrorKind::TimedOut` is returned). Returns (bytes stack→os, bytes os→stack).
    pub async fn relay(self, os: tokio::net::TcpStream, idle: Duration) -> io::Result<(u64, u64)> {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let _ = os.set_nodelay(true);
        let (mut ord, mut owr) = os.into_split();
        let TcpConn {
            mut rx, tx, notify, ..
        } = self;
        let n2 = Arc::clone(&notify);
        let moved = Arc::new(AtomicU64::new(0));
        let (m_down, m_up) = (Arc::clone(&moved), Arc::clone(&moved));
        let down = async move {
            let mut n = 0u64;
            while let Some(b) = rx.recv().await {
                n2.notify_one();
                n += b.len() as u64;
                m_down.fetch_add(1, Ordering::Relaxed);
                if owr.write_all(&b).await.is_err() {
                    break;
                }
            }
            let _ = owr.shutdown().await;
            drop(rx);
            n2.notify_one();
            n
        };
        let up = async move {
            let mut n = 0u64;
            let mut buf = vec![0u8; CHUNK];
            loop {
                let r = match ord.read(&mut buf).await {
                    Ok(0) | Err(_) => break,
                    Ok(r) => r,
                };
                n += r as u64;
                m_up.fetch_add(1, Ordering::Relaxed);
                if tx.send(Bytes::copy_from_slice(&buf[..r])).await.is_err() {
                    break;
                }
                notify.notify_one();
            }
            drop(tx);
            notify.notify_one();
            n
        };
        tokio::select! {
            (a, b) = async { tokio::join!(down, up) } => Ok((a, b)),
            _ = idle_watch(&moved, idle) => Err(io::ErrorKind::TimedOut.into()),
        }
    }
}

/// Returns once `moved` (a count of transfers) stayed unchanged for `idle` (checked every
/// quarter of it, so it returns within 1.25 × `idle` of the last transfer).
pub async fn idle_watch(moved: &AtomicU64, idle: Duration) {
    let tick = (idle / 4).max(Duration::from_millis(50));
    let mut last = moved.load(Ordering::Relaxed);
    let mut since = tokio::time::Instant::now();
    loop {
        tokio::time::sleep(tick).await;
        let now = moved.load(Ordering::Relaxed);
        if now != last {
            last = now;
            since = tokio::time::Instant::now();
        } else if since.elapsed() >= idle {
            return;
        }
    }
}

/// One UDP socket's application side: datagrams with their remote endpoint.
#[derive(Debug)]
pub struct UdpConn {
    pub local: SocketAddr,
    pub rx: mpsc::Receiver<(SocketAddr, Bytes)>,
    tx: mpsc::Sender<(SocketAddr, Bytes)>,
    notify: Arc<Notify>,
}

impl UdpConn {
    /// Queue one datagram.
    pub async fn send_to(&self, to: SocketAddr, data: Bytes) -> io::Result<()> {
        self.tx
            .send((to, data))
            .await
            .map_err(|_| io::Error::new(io::ErrorKind::BrokenPipe, "stack stopped"))?;
        self.notify.notify_one();
        Ok(())
    }

    /// A cloneable sending half.
    pub fn sender(&self) -> UdpSender {
        UdpSender {
            tx: self.tx.clone(),
            notify: Arc::clone(&self.notify),
        }
    }

    /// Next datagram.
    pub async fn recv(&mut self) -> Option<(SocketAddr, Bytes)> {
        let r = self.rx.recv().await;
        self.notify.notify_one();
        r
    }
}

/// A cloneable sending half of a [`UdpConn`].
#[derive(Debug, Clone)]
pub struct UdpSender {
    tx: mpsc::Sender<(SocketAddr, Bytes)>,
    notify: Arc<Notify>,
}

impl UdpSender {
    /// Queue one datagram.
    pub async fn send_to(&self, to: SocketAddr, data: Bytes) -> io::Result<()> {
        self.tx.send((to, data)).await.map_err(|_| stopped())?;
        self.notify.notify_one();
        Ok(())
    }
}

enum Command {
    Connect {
        remote: SocketAddr,
        reply: oneshot::Sender<io::Result<TcpConn>>,
    },
    BindUdp {
        local: Option<SocketAddr>,
        reply: oneshot::Sender<io::Result<UdpConn>>,
    },
    /// Reset every TCP connection (the peer is gone).
    AbortAll { reply: oneshot::Sender<usize> },
    /// The application's dial for a held SYN finished.
    DialDone {
        src: SocketAddr,
        dst: SocketAddr,
        ok: bool,
    },
}

/// Handle to a running stack. Clone is cheap.
#[derive(Clone)]
pub struct Stack {
    cmd: mpsc::Sender<Command>,
    notify: Arc<Notify>,
    pub counters: Arc<StackCounters>,
}

impl std::fmt::Debug for Stack {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Stack").finish_non_exhaustive()
    }
}

fn stopped() -> io::Error {
    io::Error::new(io::ErrorKind::BrokenPipe, "stack stopped")
}

impl Stack {
    /// Opens a TCP connection through the tunnel.
    pub async fn connect(&self, remote: SocketAddr) -> io::Result<TcpConn> {
        let (reply, rx) = oneshot::channel();
        self.cmd
            .send(Command::Connect { remote, reply })
            .await
            .map_err(|_| stopped())?;
        self.notify.notify_one();
        rx.await.map_err(|_| stopped())?
    }

    /// Resets every TCP connection of the stack (a RST to the peer, an error to the
    /// application side); returns how many there were.
    pub async fn abort_all(&self) -> io::Result<usize> {
        let (reply, rx) = oneshot::channel();
        self.cmd
            .send(Command::AbortAll { reply })
            .await
            .map_err(|_| stopped())?;
        self.notify.notify_one();
        rx.await.map_err(|_| stopped())
    }

    /// Dial first: the destination of the SYN from `src` to `dst` answered (`ok`, the
    /// listener takes the SYN) or not (the SYN gets a RST).
    pub async fn dial_done(&self, src: SocketAddr, dst: SocketAddr, ok: bool) -> io::Result<()> {
        self.cmd
            .send(Command::DialDone { src, dst, ok })
            .await
            .map_err(|_| stopped())?;
        self.notify.notify_one();
        Ok(())
    }

    /// Binds a UDP socket (`None`: our first address, ephemeral port).
    pub async fn bind_udp(&self, local: Option<SocketAddr>) -> io::Result<UdpConn> {
        let (reply, rx) = oneshot::channel();
        self.cmd
            .send(Command::BindUdp { local, reply })
            .await
            .map_err(|_| stopped())?;
        self.notify.notify_one();
        rx.await.map_err(|_| stopped())?
    }
}

enum Phase {
    /// Spawned for an inbound SYN.
    Listening {
        since: std::time::Instant,
    },
    Connecting {
        reply: Option<oneshot::Sender<io::Result<TcpConn>>>,
        since: std::time::Instant,
    },
    Open,
}

struct TcpEntry {
    phase: Phase,
    to_app: Option<mpsc::Sender<Bytes>>,
    from_app: Option<mpsc::Receiver<Bytes>>,
    pending: Option<Bytes>,
}

struct UdpEntry {
    to_app: mpsc::Sender<(SocketAddr, Bytes)>,
    from_app: mpsc::Receiver<(SocketAddr, Bytes)>,
}

fn to_ip(a: IpAddress) -> IpAddr {
    match a {
        IpAddress::Ipv4(v) => IpAddr::V4(v),
        IpAddress::Ipv6(v) => IpAddr::V6(v),
    }
}

fn to_sa(e: IpEndpoint) -> SocketAddr {
    SocketAddr::new(to_ip(e.addr), e.port)
}

fn from_sa(s: SocketAddr) -> IpEndpoint {
    IpEndpoint::new(IpAddress::from(s.ip()), s.port())
}

/// The I/O-free part: interface, sockets, and the bookkeeping around them.
struct Engine {
    iface: Interface,
    dev: QueueDevice,
    sockets: SocketSet<'static>,
    tcp: HashMap<SocketHandle, TcpEntry>,
    udp: HashMap<SocketHandle, UdpEntry>,
    accept: AcceptPolicy,
    next_port: u16,
    epoch: std::time::Instant,
    notify: Arc<Notify>,
    counters: Arc<StackCounters>,
    addresses: Vec<IpAddr>,
    dial_first: Option<mpsc::Sender<(SocketAddr, SocketAddr)>>,
    /// Dial first: SYNs waiting for their dial, by (source, destination).
    held: HashMap<(SocketAddr, SocketAddr), (std::time::Instant, Vec<u8>)>,
}

impl Engine {
    fn new(cfg: &StackConfig, notify: Arc<Notify>, counters: Arc<StackCounters>) -> Self {
        let mut dev = QueueDevice::new(cfg.mtu);
        let mut c = Config::new(HardwareAddress::Ip);
        c.random_seed = rand::random();
        let epoch = std::time::Instant::now();
        let mut iface = Interface::new(c, &mut dev, smoltcp::time::Instant::from_micros(0));
        iface.update_ip_addrs(|a| {
            for (ip, p) in &cfg.addresses {
                let _ = a.push(IpCidr::new(IpAddress::from(*ip), *p));
            }
        });
        for (ip, _) in &cfg.addresses {
            // Everything is "on link" on a point-to-point tunnel; with any_ip the route via our
            // own address also makes smoltcp accept every destination.
            match ip {
                IpAddr::V4(v) => {
                    let _ = iface.routes_mut().add_default_ipv4_route(*v);
                }
                IpAddr::V6(v) => {
                    let _ = iface.routes_mut().add_default_ipv6_route(*v);
                }
            }
        }
        iface.set_any_ip(cfg.any_ip);
        Self {
            iface,
            dev,
            sockets: SocketSet::new(Vec::new()),
            tcp: HashMap::new(),
            udp: HashMap::new(),
            accept: Arc::clone(&cfg.accept),
            next_port: FIRST_EPHEMERAL + rand::random::<u16>() % 8192,
            epoch,
            notify,
            counters,
            addresses: cfg.addresses.iter().map(|(a, _)| *a).collect(),
            dial_first: cfg.dial_first.clone(),
            held: HashMap::new(),
        }
    }

    fn now(&self) -> smoltcp::time::Instant {
        smoltcp::time::Instant::from_micros(self.epoch.elapsed().as_micros() as i64)
    }

    fn ephemeral_port(&mut self) -> u16 {
        let p = self.next_port;
        self.next_port = if self.next_port == u16::MAX {
            FIRST_EPHEMERAL
        } else {
            self.next_port + 1
        };
        p
    }

    fn new_tcp_socket() -> tcp::Socket<'static> {
        let mut s = tcp::Socket::new(
            tcp::SocketBuffer::new(vec![0u8; TCP_RX_BUF]),
            tcp::SocketBuffer::new(vec![0u8; TCP_BUF]),
        );
        s.set_nagle_enabled(false);
        s.set_ack_delay(Some(smoltcp::time::Duration::from_millis(5)));
        s.set_keep_alive(Some(smoltcp::time::Duration::from_secs(20)));
        s.set_timeout(Some(smoltcp::time::Duration::from_secs(120)));
        s
    }

    /// Inspect an inbound packet before smoltcp does: a SYN to an allowed destination gets a
    /// listener.
    fn ingress(&mut self, p: Vec<u8>) {
        self.counters.packets_in.fetch_add(1, Ordering::Relaxed);
        let syn = syn_of(&p);
        if let Some((src, dst)) = syn {
            let covered = self.tcp.keys().any(|h| {
                let s = self.sockets.get::<tcp::Socket<'_>>(*h);
                match s.state() {
                    tcp::State::Listen => {
                        let l = s.listen_endpoint();
                        l.port == dst.port() && l.addr.map(to_ip) == Some(dst.ip())
                    }
                    _ => {
                        s.local_endpoint().map(to_sa) == Some(dst)
                            && s.remote_endpoint().map(to_sa) == Some(src)
                    }
                }
            });
            if !covered {
                if (self.accept)(dst, src) {
                    if let Some(dials) = self.dial_first.clone() {
                        let key = (src, dst);
                        if self.held.contains_key(&key) {
                            return; // a retransmission of the SYN being dialled for
                        }
                        if self.held.len() >= MAX_HELD_SYNS {
                            self.expire_held();
                        }
                        if self.held.len() < MAX_HELD_SYNS && dials.try_send(key).is_ok() {
                            self.held.insert(key, (std::time::Instant::now(), p));
                            return;
                        }
                        // too many at once: refused (the RST below)
                        self.counters.tcp_refused.fetch_add(1, Ordering::Relaxed);
                    } else {
                        self.listen_on(dst);
                    }
                } else {
                    self.counters.tcp_refused.fetch_add(1, Ordering::Relaxed);
                    tracing::debug!(%src, %dst, "inbound connection refused by policy");
                }
            }
        }
        self.dev.rx.push_back(p);
        if syn.is_some() {
            // Let the new listener take this SYN before the next one is inspected.
            self.poll();
        }
    }

    /// Refuses held SYNs older than [`HELD_TTL`] (their dial never answered).
    fn expire_held(&mut self) {
        let old: Vec<_> = self
            .held
            .iter()
            .filter(|(_, (t, _))| t.elapsed() >= HELD_TTL)
            .map(|(k, _)| *k)
            .collect();
        for k in old {
            if let Some((_, p)) = self.held.remove(&k) {
                self.counters.tcp_refused.fetch_add(1, Ordering::Relaxed);
                self.dev.rx.push_back(p);
            }
        }
    }

    /// A listener on exactly `dst`, for the SYN about to be ingested.
    fn listen_on(&mut self, dst: SocketAddr) {
        let mut s = Self::new_tcp_socket();
        if s.listen(IpListenEndpoint {
            addr: Some(IpAddress::from(dst.ip())),
            port: dst.port(),
        })
        .is_ok()
        {
            let h = self.sockets.add(s);
            self.tcp.insert(
                h,
                TcpEntry {
                    phase: Phase::Listening {
                        since: std::time::Instant::now(),
                    },
                    to_app: None,
                    from_app: None,
                    pending: None,
                },
            );
        }
    }

    fn command(&mut self, c: Command) {
        match c {
            Command::DialDone { src, dst, ok } => {
                if let Some((_, p)) = self.held.remove(&(src, dst)) {
                    if ok {
                        self.listen_on(dst);
                    } else {
                        // no listener: smoltcp answers the SYN with a RST
                        self.counters.tcp_refused.fetch_add(1, Ordering::Relaxed);
                    }
                    self.dev.rx.push_back(p);
                    self.poll();
                }
            }
            Command::Connect { remote, reply } => {
                let mut s = Self::new_tcp_socket();
                let port = self.ephemeral_port();
                let local_addr = self
                    .addresses
                    .iter()
                    .find(|a| a.is_ipv4() == remote.is_ipv4())
                    .copied();
                let Some(local_addr) = local_addr else {
                    let _ = reply.send(Err(io::Error::new(
                        io::ErrorKind::AddrNotAvailable,
                        "no tunnel address of that family",
                    )));
                    return;
                };
                let local = IpListenEndpoint {
                    addr: Some(IpAddress::from(local_addr)),
                    port,
                };
                if let Err(e) = s.connect(self.iface.context(), from_sa(remote), local) {
                    let _ = reply.send(Err(io::Error::new(
                        io::ErrorKind::InvalidInput,
                        format!("connect {remote}: {e}"),
                    )));
                    return;
                }
                let h = self.sockets.add(s);
                self.tcp.insert(
                    h,
                    TcpEntry {
                        phase: Phase::Connecting {
                            reply: Some(reply),
                            since: std::time::Instant::now(),
                        },
                        to_app: None,
                        from_app: None,
                        pending: None,
                    },
                );
            }
            Command::AbortAll { reply } => {
                let handles: Vec<SocketHandle> = self.tcp.keys().copied().collect();
                for h in &handles {
                    self.sockets.get_mut::<tcp::Socket<'_>>(*h).abort();
                }
                let _ = reply.send(handles.len());
            }
            Command::BindUdp { local, reply } => {
                let mut s = udp::Socket::new(
                    udp::PacketBuffer::new(
                        vec![udp::PacketMetadata::EMPTY; UDP_PACKETS],
                        vec![0u8; UDP_BUF],
                    ),
                    udp::PacketBuffer::new(
                        vec![udp::PacketMetadata::EMPTY; UDP_PACKETS],
                        vec![0u8; UDP_BUF],
                    ),
                );
                let local = match local {
                    Some(l) => l,
                    None => match self.addresses.first() {
                        Some(a) => SocketAddr::new(*a, self.ephemeral_port()),
                        None => {
                            let _ = reply.send(Err(stopped()));
                            return;
                        }
                    },
                };
                if let Err(e) = s.bind(IpListenEndpoint {
                    addr: Some(IpAddress::from(local.ip())),
                    port: local.port(),
                }) {
                    let _ = reply.send(Err(io::Error::new(
                        io::ErrorKind::InvalidInput,
                        format!("bind {local}: {e}"),
                    )));
                    return;
                }
                let h = self.sockets.add(s);
                let (to_app, rx) = mpsc::channel(UDP_PACKETS);
                let (tx, from_app) = mpsc::channel(UDP_PACKETS);
                self.udp.insert(h, UdpEntry { to_app, from_app });
                let _ = reply.send(Ok(UdpConn {
                    local,
                    rx,
                    tx,
                    notify: Arc::clone(&self.notify),
                }));
            }
        }
    }

    fn poll(&mut self) {
        let now = self.now();
        self.iface.poll(now, &mut self.dev, &mut self.sockets);
    }

    fn open_channels(&mut self, h: SocketHandle) -> Option<TcpConn> {
        let s = self.sockets.get::<tcp::Socket<'_>>(h);
        let (local, remote) = (s.local_endpoint()?, s.remote_endpoint()?);
        let (to_app, rx) = mpsc::channel(CHAN);
        let (tx, from_app) = mpsc::channel(CHAN);
        let e = self.tcp.get_mut(&h)?;
        e.to_app = Some(to_app);
        e.from_app = Some(from_app);
        e.phase = Phase::Open;
        // Data that came with the handshake is moved on the next pass: make it happen now
        // rather than at the next timer.
        self.notify.notify_one();
        Some(TcpConn {
            local: to_sa(local),
            remote: to_sa(remote),
            rx,
            tx,
            notify: Arc::clone(&self.notify),
        })
    }

    /// Move data between sockets and channels; complete connects and accepts; reap.
    fn service(&mut self, accepted: &mpsc::Sender<TcpConn>) {
        let handles: Vec<SocketHandle> = self.tcp.keys().copied().collect();
        let mut remove = Vec::new();
        for h in handles {
            let state = self.sockets.get::<tcp::Socket<'_>>(h).state();
            let Some(e) = self.tcp.get_mut(&h) else {
                continue;
            };
            match &mut e.phase {
                Phase::Listening { since } => {
                    match state {
                        tcp::State::Listen if since.elapsed() > LISTEN_TTL => remove.push(h),
                        tcp::State::Listen | tcp::State::SynReceived => {}
                        tcp::State::Closed => remove.push(h),
                        _ => {
                            if let Some(c) = self.open_channels(h) {
                                self.counters.tcp_accepted.fetch_add(1, Ordering::Relaxed);
                                if accepted.try_send(c).is_err() {
                                    tracing::debug!("accept queue full; connection reset");
                                    self.sockets.get_mut::<tcp::Socket<'_>>(h).abort();
                                    remove.push(h);
                                    continue;
                                }
                            }
                        }
                    }
                    continue;
                }
                Phase::Connecting { reply, since } => {
                    let gone = reply.as_ref().is_none_or(|r| r.is_closed());
                    match state {
                        tcp::State::SynSent if gone || since.elapsed() > CONNECT_TIMEOUT => {
                            if let Some(r) = reply.take() {
                                let _ = r.send(Err(io::Error::new(
                                    io::ErrorKind::TimedOut,
                                    "connect timed out",
                                )));
                            }
                            self.counters
                                .tcp_connect_failed
                                .fetch_add(1, Ordering::Relaxed);
                            self.sockets.get_mut::<tcp::Socket<'_>>(h).abort();
                            remove.push(h);
                        }
                        tcp::State::SynSent => {}
                        tcp::State::Closed => {
                            if let Some(r) = reply.take() {
                                let _ = r.send(Err(io::Error::new(
                                    io::ErrorKind::ConnectionRefused,
                                    "connection refused",
                                )));
                            }
                            self.counters
                                .tcp_connect_failed
                                .fetch_add(1, Ordering::Relaxed);
                            remove.push(h);
                        }
                        _ => {
                            let r = reply.take();
                            if let (Some(c), Some(r)) = (self.open_channels(h), r) {
                                self.counters.tcp_connected.fetch_add(1, Ordering::Relaxed);
                                if r.send(Ok(c)).is_err() {
                                    self.sockets.get_mut::<tcp::Socket<'_>>(h).abort();
                                }
                            }
                        }
                    }
                    continue;
                }
                Phase::Open => {}
            }
            let s = self.sockets.get_mut::<tcp::Socket<'_>>(h);
            // Socket → app.
            if let Some(to_app) = &e.to_app {
                while s.can_recv() {
                    match to_app.try_reserve() {
                        Ok(permit) => {
                            let mut buf = vec![0u8; CHUNK.min(s.recv_queue().max(1))];
                            match s.recv_slice(&mut buf) {
                                Ok(n) => {
                                    buf.truncate(n);
                                    permit.send(Bytes::from(buf));
                                }
                                Err(_) => break,
                            }
                        }
                        Err(mpsc::error::TrySendError::Full(())) => break,
                        Err(mpsc::error::TrySendError::Closed(())) => {
                            // Nobody reads any more: reset.
                            s.abort();
                            break;
                        }
                    }
                }
                if !s.may_recv() && s.recv_queue() == 0 {
                    e.to_app = None; // EOF
                }
            }
            // App → socket.
            loop {
                if e.pending.is_none() {
                    let Some(from_app) = e.from_app.as_mut() else {
                        break;
                    };
                    match from_app.try_recv() {
                        Ok(b) => e.pending = Some(b),
                        Err(mpsc::error::TryRecvError::Empty) => break,
                        Err(mpsc::error::TryRecvError::Disconnected) => {
                            e.from_app = None;
                            s.close();
                            break;
                        }
                    }
                }
                if !s.may_send() {
                    e.pending = None;
                    e.from_app = None;
                    break;
                }
                let Some(b) = e.pending.as_mut() else { break };
                match s.send_slice(b) {
                    Ok(n) => {
                        let _ = b.split_to(n);
                        if b.is_empty() {
                            e.pending = None;
                        } else {
                            break;
                        }
                    }
                    Err(_) => break,
                }
            }
            match s.state() {
                tcp::State::Closed | tcp::State::TimeWait => {
                    e.to_app = None;
                    remove.push(h);
                }
                _ => {}
            }
        }
        for h in remove {
            self.tcp.remove(&h);
            self.sockets.remove(h);
        }
        let handles: Vec<SocketHandle> = self.udp.keys().copied().collect();
        for h in handles {
            let Some(e) = self.udp.get_mut(&h) else {
                continue;
            };
            let s = self.sockets.get_mut::<udp::Socket<'_>>(h);
            if e.to_app.is_closed() {
                self.udp.remove(&h);
                self.sockets.remove(h);
                continue;
            }
            while let Ok((data, meta)) = s.recv() {
                if e.to_app
                    .try_send((to_sa(meta.endpoint), Bytes::copy_from_slice(data)))
                    .is_err()
                {
                    tracing::debug!("udp receiver not keeping up; datagram dropped");
                }
            }
            while s.can_send() {
                match e.from_app.try_recv() {
                    Ok((to, data)) => {
                        let _ = s.send_slice(&data, from_sa(to));
                    }
                    Err(_) => break,
                }
            }
        }
    }
}

/// Parses `(source, destination)` of a TCP SYN without ACK in an IPv4 or IPv6 packet.
pub fn syn_of(p: &[u8]) -> Option<(SocketAddr, SocketAddr)> {
    let v = p.first()? >> 4;
    let (src, dst, tcp) = match v {
        4 => {
            let ihl = usize::from(p[0] & 0x0f) * 4;
            if p.len() < ihl + 20 || ihl < 20 || p[9] != 6 {
                return None;
            }
            // Later fragments carry no TCP header.
            if u16::from_be_bytes([p[6], p[7]]) & 0x1fff != 0 {
                return None;
            }
            let s: [u8; 4] = p[12..16].try_into().ok()?;
            let d: [u8; 4] = p[16..20].try_into().ok()?;
            (IpAddr::from(s), IpAddr::from(d), &p[ihl..])
        }
        6 => {
            if p.len() < 60 || p[6] != 6 {
                return None;
            }
            let s: [u8; 16] = p[8..24].try_into().ok()?;
            let d: [u8; 16] = p[24..40].try_into().ok()?;
            (IpAddr::from(s), IpAddr::from(d), &p[40..])
        }
        _ => return None,
    };
    let flags = tcp[13];
    let (syn, ack) = (flags & 0x02 != 0, flags & 0x10 != 0);
    if !syn || ack {
        return None;
    }
    let sp = u16::from_be_bytes([tcp[0], tcp[1]]);
    let dp = u16::from_be_bytes([tcp[2], tcp[3]]);
    Some((SocketAddr::new(src, sp), SocketAddr::new(dst, dp)))
}

/// Runs a stack between `from_tunnel`/`to_tunnel` (the WireGuard driver's channels) until
/// `cancel`. Inbound connections accepted by the policy arrive on the returned receiver.
pub fn spawn(
    cfg: StackConfig,
    mut from_tunnel: mpsc::Receiver<Vec<u8>>,
    to_tunnel: mpsc::Sender<Vec<u8>>,
    cancel: CancellationToken,
) -> (Stack, mpsc::Receiver<TcpConn>) {
    let notify = Arc::new(Notify::new());
    let counters = Arc::new(StackCounters::default());
    let (cmd_tx, mut cmd_rx) = mpsc::channel::<Command>(256);
    let (acc_tx, acc_rx) = mpsc::channel(256);
    let mut eng = Engine::new(&cfg, Arc::clone(&notify), Arc::clone(&counters));
    let n = Arc::clone(&notify);
    let ctr = Arc::clone(&counters);
    tokio::spawn(async move {
        loop {
            let delay = eng
                .iface
                .poll_delay(eng.now(), &eng.sockets)
                .map(|d| Duration::from_micros(d.total_micros()))
                .unwrap_or(Duration::from_secs(1))
                .min(Duration::from_secs(1));
            tokio::select! {
                _ = cancel.cancelled() => break,
                p = from_tunnel.recv() => match p {
                    Some(p) => {
                        eng.ingress(p);
                        for _ in 0..256 {
                            match from_tunnel.try_recv() {
                                Ok(p) => eng.ingress(p),
                                Err(_) => break,
                            }
                        }
                    }
                    None => break,
                },
                c = cmd_rx.recv() => match c {
                    Some(c) => eng.command(c),
                    None => break,
                },
                _ = n.notified() => {},
                _ = tokio::time::sleep(delay) => {},
            }
            // Bounded rounds: ingest, move data, emit; repeat while progress is made.
            for _ in 0..4 {
                eng.poll();
                eng.service(&acc_tx);
                eng.poll();
                let out: Vec<Vec<u8>> = eng.dev.tx.drain(..).collect();
                if out.is_empty() {
                    break;
                }
                for p in out {
                    ctr.packets_out.fetch_add(1, Ordering::Relaxed);
                    if to_tunnel.send(p).await.is_err() {
                        return;
                    }
                }
            }
        }
    });
    (
        Stack {
            cmd: cmd_tx,
            notify,
            counters,
        },
        acc_rx,
    )
}

#[cfg(test)]
mod tests;
