//! The tokio driver: one UDP socket, one [`Peer`], a 250 ms timer tick, and channels to the
//! local packet source/sink (a userspace stack, a TUN, or a test).
//!
//! Batched on both sides, as the TUN driver is (the per-datagram system calls and their trips
//! through the kernel's UDP path were the largest cost of a bulk stream):
//! - app → peer: the packets waiting in the channel (up to [`SEND_BATCH`]) are encrypted into
//!   one buffer and sent with UDP GSO, one `sendmsg` per run of equal-sized datagrams;
//! - peer → app: `recvmmsg` with UDP GRO (through `quinn-udp`), so one call can return many
//!   datagrams of a burst.
//!
//! Where the kernel has no GSO or GRO, `quinn-udp` sends and receives one datagram per
//! message, as before.

use std::io::IoSliceMut;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use quinn_udp::{RecvMeta, Transmit, UdpSocketState};
use tokio::io::Interest;
use tokio::net::UdpSocket;
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;

use super::peer::{Keys, Output, Peer, PeerStatus};

/// Inner packets taken from the channel and sent at once at most.
const SEND_BATCH: usize = 64;
/// Receive buffers per `recvmmsg`; each holds one GRO super-datagram.
const RECV_BATCH: usize = 8;
const RX_BUF: usize = 65_536;
/// Room a WireGuard data message needs beyond its inner packet: 16-byte header, 16-byte tag
/// and up to 15 bytes of padding.
const WG_ROOM: usize = 48;
/// The most one GSO send may carry: the kernel refuses (EMSGSIZE) a batch whose UDP payload
/// exceeds what one IPv4 datagram could hold (65,507 bytes), whatever the segment count; 64
/// segments of 1,452 bytes would be 92,928. Found by `make bench-tunnel`: about half of the
/// bulk traffic was silently lost that way.
pub(crate) const GSO_MAX_BYTES: usize = 65_000;

/// WireGuard's timer granularity; boringtun's own device uses the same.
pub const TICK: Duration = Duration::from_millis(250);
const CHANNEL_DEPTH: usize = 1024;
/// Requested UDP socket buffer size (receive and send), for the userspace and TUN drivers.
pub(crate) const SOCKET_BUFFER: usize = 4 << 20;

/// The application side of a running tunnel.
#[derive(Debug)]
pub struct TunnelHandle {
    /// IP packets to send through the tunnel.
    pub to_peer: mpsc::Sender<Vec<u8>>,
    /// IP packets that arrived through the tunnel.
    pub from_peer: mpsc::Receiver<Vec<u8>>,
    /// The latest peer status (updated after every event and tick).
    pub status: watch::Receiver<PeerStatus>,
    /// New keys for the peer (a rotation; see [`Peer::set_keys`]).
    pub keys: mpsc::Sender<Keys>,
    /// A new address of the peer (see [`Peer::set_endpoint`]).
    pub endpoint: mpsc::Sender<SocketAddr>,
}

/// Asks for `SOCKET_BUFFER` bytes of receive and send buffer on the tunnel socket (the kernel
/// caps the request at `net.core.rmem_max`/`wmem_max`; no privilege needed). A default-sized
/// (~208 KiB) receive buffer overflows when a tunnelled TCP connection sends a full window at
/// once (a catalog's ListBundles from a fast server), and every lost datagram costs the
/// userspace TCP a retransmission timeout of at least a second.
fn size_buffers(socket: &UdpSocket) {
    let s = socket2::SockRef::from(socket);
    for (what, r) in [
        ("receive", s.set_recv_buffer_size(SOCKET_BUFFER)),
        ("send", s.set_send_buffer_size(SOCKET_BUFFER)),
    ] {
        if let Err(e) = r {
            tracing::warn!(error = %e, "could not size the tunnel socket's {what} buffer");
        }
    }
    tracing::debug!(
        receive = s.recv_buffer_size().unwrap_or(0),
        send = s.send_buffer_size().unwrap_or(0),
        "tunnel socket buffers"
    );
}

/// Runs `peer` over `socket` until `cancel` fires; returns the peer so that a caller can
/// rebind to a new socket and keep the session (as a host does when its address changes).
pub fn spawn(
    socket: UdpSocket,
    peer: Peer,
    cancel: CancellationToken,
) -> (TunnelHandle, tokio::task::JoinHandle<Peer>) {
    size_buffers(&socket);
    let (to_peer, rx_app) = mpsc::channel(CHANNEL_DEPTH);
    let (tx_app, from_peer) = mpsc::channel(CHANNEL_DEPTH);
    let (status_tx, status) = watch::channel(peer.status());
    let (keys, rx_keys) = mpsc::channel(4);
    let (endpoint, rx_endpoint) = mpsc::channel(4);
    let task = tokio::spawn(run(
        Arc::new(socket),
        peer,
        Channels {
            rx_app,
            tx_app,
            rx_keys,
            rx_endpoint,
            status: status_tx,
        },
        cancel,
    ));
    (
        TunnelHandle {
            to_peer,
            from_peer,
            status,
            keys,
            endpoint,
        },
        task,
    )
}

struct Channels {
    rx_app: mpsc::Receiver<Vec<u8>>,
    tx_app: mpsc::Sender<Vec<u8>>,
    rx_keys: mpsc::Receiver<Keys>,
    rx_endpoint: mpsc::Receiver<SocketAddr>,
    status: watch::Sender<PeerStatus>,
}

/// `quinn-udp`'s state for the tunnel socket, with the socket's path-MTU behaviour put back
/// to the kernel default (`WANT`: a datagram larger than the path MTU is fragmented by this
/// host). `quinn-udp` sets `PROBE` (never fragment, for QUIC's own MTU discovery), which makes
/// every datagram larger than the link MTU fail with EMSGSIZE: a tunnel in a pod whose network
/// MTU is below its 1480-byte datagrams (OVN-Kubernetes pods have 1400) would carry
/// handshakes and small packets but no full-sized segment. Kernel WireGuard fragments too.
pub(crate) fn udp_state(socket: &UdpSocket) -> std::io::Result<UdpSocketState> {
    use rustix::net::sockopt;
    let state = UdpSocketState::new(socket.into())?;
    let v6 = socket.local_addr().is_ok_and(|a| a.is_ipv6());
    // On an IPv6 socket the IPv4 option applies to v4-mapped peers; it may be refused on a
    // v6-only one, which has none.
    let v4 = sockopt::set_ip_mtu_discover(socket, sockopt::Ipv4PathMtuDiscovery::WANT);
    if !v6 {
        v4?;
    } else {
        sockopt::set_ipv6_mtu_discover(socket, sockopt::Ipv6PathMtuDiscovery::WANT)?;
    }
    Ok(state)
}

/// What woke the driver.
enum Event {
    Cancel,
    Tick,
    Received(std::io::Result<usize>),
    Keys(Option<Keys>),
    Endpoint(Option<SocketAddr>),
    App(Option<Vec<u8>>),
}

/// The socket with `quinn-udp`'s state (GSO/GRO support, found at start).
struct Udp {
    socket: Arc<UdpSocket>,
    state: UdpSocketState,
}

impl Udp {
    async fn send(&self, to: SocketAddr, contents: &[u8], segment: usize) {
        send_gso(&self.socket, &self.state, to, contents, segment).await;
    }
}

async fn try_send(
    socket: &UdpSocket,
    state: &UdpSocketState,
    to: SocketAddr,
    contents: &[u8],
    segment_size: Option<usize>,
) -> std::io::Result<()> {
    let t = Transmit {
        destination: to,
        ecn: None,
        contents,
        segment_size,
        src_ip: None,
    };
    socket
        .async_io(Interest::WRITABLE, || state.try_send(socket.into(), &t))
        .await
}

/// Sends `contents`: one datagram, or `segment`-sized datagrams back to back (GSO; the last
/// may be shorter). Used by this driver and the TUN driver.
pub(crate) async fn send_gso(
    socket: &UdpSocket,
    state: &UdpSocketState,
    to: SocketAddr,
    contents: &[u8],
    segment: usize,
) {
    let batched = contents.len() > segment;
    match try_send(socket, state, to, contents, batched.then_some(segment)).await {
        Ok(()) => {}
        // A GSO send is refused (EINVAL) when a segment exceeds the link MTU, which only
        // fragmentation of single datagrams can cross (`quinn-udp` stops using GSO on this
        // socket after it): send this batch's datagrams one by one rather than lose them.
        Err(e) if batched => {
            tracing::debug!(%to, error = %e, segment, "GSO send refused; sending datagrams singly");
            for d in contents.chunks(segment.max(1)) {
                if let Err(e) = try_send(socket, state, to, d, None).await {
                    tracing::debug!(%to, error = %e, bytes = d.len(), "udp send failed");
                }
            }
        }
        Err(e) => tracing::debug!(%to, error = %e, bytes = contents.len(), "udp send failed"),
    }
}

/// Records a datagram of `len` bytes at `off` in the send buffer: it extends the last run of
/// equal-sized datagrams (`(start, end, segment size)`) when it directly follows it and GSO
/// allows (a shorter one may end a run; at most `max_segments` and [`GSO_MAX_BYTES`]), else
/// starts a new run. Shared by this driver and the TUN driver.
pub(crate) fn add_to_runs(
    runs: &mut Vec<(usize, usize, usize)>,
    off: usize,
    len: usize,
    max_segments: usize,
) {
    match runs.last_mut() {
        Some((start, end, seg))
            if *end == off
                && len <= *seg
                && (*end - *start) % *seg == 0
                && (*end - *start) / *seg < max_segments
                && off + len - *start <= GSO_MAX_BYTES =>
        {
            *end = off + len;
        }
        _ => runs.push((off, off + len, len)),
    }
}

/// Encrypts `batch` into `wire` and sends it: one GSO send per run of equal-sized datagrams
/// (a shorter one may end a run). Control messages (a handshake when there is no session)
/// go to `out`.
async fn send_batch(
    udp: &Udp,
    peer: &mut Peer,
    batch: &[Vec<u8>],
    wire: &mut Vec<u8>,
    out: &mut Vec<Output>,
) {
    let max_segments = udp.state.max_gso_segments().max(1);
    // (start, end, datagram size) of each run in `wire`.
    let mut runs: Vec<(usize, usize, usize)> = Vec::new();
    let mut off = 0;
    for p in batch {
        if wire.len() < off + p.len() + WG_ROOM {
            wire.resize(off + p.len() + WG_ROOM, 0);
        }
        let Ok(Some(len)) = peer.encapsulate_into(p, &mut wire[off..], out) else {
            continue;
        };
        add_to_runs(&mut runs, off, len, max_segments);
        off += len;
    }
    let Some(to) = peer.endpoint() else { return };
    for (start, end, seg) in runs {
        udp.send(to, &wire[start..end], seg).await;
    }
}

async fn run(
    socket: Arc<UdpSocket>,
    mut peer: Peer,
    ch: Channels,
    cancel: CancellationToken,
) -> Peer {
    let Channels {
        mut rx_app,
        tx_app,
        mut rx_keys,
        mut rx_endpoint,
        status,
    } = ch;
    let state = match udp_state(&socket) {
        Ok(s) => s,
        Err(e) => {
            // Not expected for a bound UDP socket; without it nothing can be sent.
            tracing::error!(error = %e, "cannot set up the tunnel socket");
            return peer;
        }
    };
    let udp = Udp { socket, state };
    let mut keys_open = true;
    let mut endpoint_open = true;
    let mut ticker = tokio::time::interval(TICK);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut rx: Vec<Vec<u8>> = vec![vec![0u8; RX_BUF]; RECV_BATCH];
    let mut meta = vec![RecvMeta::default(); RECV_BATCH];
    let mut batch: Vec<Vec<u8>> = Vec::with_capacity(SEND_BATCH);
    let mut wire: Vec<u8> = Vec::new();
    let mut out = Vec::new();
    let mut app_open = true;
    let mut delivery_drops: u64 = 0;
    loop {
        let event = {
            let mut iovs: Vec<IoSliceMut<'_>> = rx.iter_mut().map(|b| IoSliceMut::new(b)).collect();
            tokio::select! {
                _ = cancel.cancelled() => Event::Cancel,
                _ = ticker.tick() => Event::Tick,
                r = udp.socket.async_io(Interest::READABLE, || {
                    udp.state.recv((&*udp.socket).into(), &mut iovs, &mut meta)
                }) => Event::Received(r),
                k = rx_keys.recv(), if keys_open => Event::Keys(k),
                e = rx_endpoint.recv(), if endpoint_open => Event::Endpoint(e),
                p = rx_app.recv(), if app_open => Event::App(p),
            }
        };
        match event {
            Event::Cancel => break,
            Event::Tick => peer.tick(Instant::now(), &mut out),
            Event::Received(Ok(n)) => {
                let now = Instant::now();
                for (buf, m) in rx.iter().zip(&meta).take(n) {
                    let len = m.len.min(buf.len());
                    let stride = if m.stride == 0 { len } else { m.stride };
                    for datagram in buf[..len].chunks(stride.max(1)) {
                        let _ = peer.handle_datagram(m.addr, datagram, now, &mut out);
                    }
                }
            }
            // ICMP port unreachable surfaces here on Linux; not fatal.
            Event::Received(Err(e)) => tracing::debug!(error = %e, "udp receive error"),
            Event::Keys(Some(k)) => {
                peer.set_keys(k, Instant::now(), &mut out);
            }
            Event::Keys(None) => keys_open = false,
            Event::Endpoint(Some(e)) => peer.set_endpoint(e),
            Event::Endpoint(None) => endpoint_open = false,
            Event::App(Some(p)) => {
                batch.clear();
                batch.push(p);
                while batch.len() < SEND_BATCH {
                    match rx_app.try_recv() {
                        Ok(p) => batch.push(p),
                        Err(_) => break,
                    }
                }
                send_batch(&udp, &mut peer, &batch, &mut wire, &mut out).await;
            }
            Event::App(None) => app_open = false,
        }
        for o in out.drain(..) {
            match o {
                Output::Send { to, datagram } => {
                    if let Err(e) = udp.socket.send_to(&datagram, to).await {
                        tracing::debug!(%to, error = %e, "udp send failed");
                    }
                }
                Output::Deliver(p) => {
                    if tx_app.try_send(p).is_err() {
                        delivery_drops += 1;
                        tracing::debug!(
                            delivery_drops,
                            "local side not keeping up; packet dropped"
                        );
                    }
                }
            }
        }
        status.send_replace(peer.status());
    }
    peer
}
