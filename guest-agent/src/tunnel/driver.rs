//! The tokio driver: one UDP socket, one [`Peer`], a 250 ms timer tick, and channels to the
//! local packet source/sink (a userspace stack, a TUN, or a test).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::net::UdpSocket;
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;

use super::peer::{Keys, Output, Peer, PeerStatus};

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
    let mut keys_open = true;
    let mut endpoint_open = true;
    let mut ticker = tokio::time::interval(TICK);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut buf = vec![0u8; 65_536];
    let mut out = Vec::new();
    let mut app_open = true;
    let mut delivery_drops: u64 = 0;
    loop {
        tokio::select! {
            _ = cancel.cancelled() => break,
            _ = ticker.tick() => peer.tick(Instant::now(), &mut out),
            r = socket.recv_from(&mut buf) => match r {
                Ok((n, from)) => {
                    let _ = peer.handle_datagram(from, &buf[..n], Instant::now(), &mut out);
                }
                Err(e) => {
                    // ICMP port unreachable surfaces here on Linux; not fatal.
                    tracing::debug!(error = %e, "udp receive error");
                }
            },
            k = rx_keys.recv(), if keys_open => match k {
                Some(k) => { peer.set_keys(k, Instant::now(), &mut out); }
                None => keys_open = false,
            },
            e = rx_endpoint.recv(), if endpoint_open => match e {
                Some(e) => peer.set_endpoint(e),
                None => endpoint_open = false,
            },
            p = rx_app.recv(), if app_open => match p {
                Some(p) => { let _ = peer.send_packet(&p, &mut out); }
                None => app_open = false,
            },
        }
        for o in out.drain(..) {
            match o {
                Output::Send { to, datagram } => {
                    if let Err(e) = socket.send_to(&datagram, to).await {
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
