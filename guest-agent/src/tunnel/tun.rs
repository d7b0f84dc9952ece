//! The TUN driver: one [`Peer`] between a Linux TUN device and one UDP socket, for places
//! that allow NET_ADMIN (the guest service and pod CIDRs are routed into the device instead
//! of through the userspace stack).
//!
//! Throughput comes from batching on both sides, with buffers allocated once:
//! - TUN → peer: the device runs with virtio-net offload, so one read returns a TCP/UDP
//!   super-packet that `tun-rs` splits into MTU-sized packets; they are encrypted in place
//!   into one contiguous buffer and sent with UDP GSO (one `sendmsg` per run of equal-sized
//!   datagrams) through `quinn-udp`.
//! - peer → TUN: `recvmmsg` with UDP GRO fills up to 32 × 64 KiB buffers per call; each
//!   datagram is decrypted straight into a TUN write buffer, and the batch is written with
//!   `tun-rs`'s GRO coalescing (TCP segments of one flow become one write; UDP datagrams
//!   too where the kernel has UDP segmentation offload for TUN, 6.2 and later). A device that
//!   refuses writes (some kernels had GRO-on-TUN regressions) is reported as a warning, at
//!   most once a minute, naming the way out: `[tun] offload = false`.
//!
//! The engine stays I/O-free: this module only moves bytes and holds the [`Peer`] behind a
//! mutex that is never held across an `.await`.

use std::io::IoSliceMut;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use quinn_udp::{RecvMeta, UdpSocketState};
use tokio::io::Interest;
use tokio::net::UdpSocket;
use tokio::sync::watch;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tun_rs::{AsyncDevice, GROTable, IDEAL_BATCH_SIZE, VIRTIO_NET_HDR_LEN};

use super::driver::{SOCKET_BUFFER, TICK, add_to_runs, send_gso, udp_state};
use super::peer::{Keys, Output, Peer, PeerStatus};

/// WireGuard's data-message overhead: 16-byte header and 16-byte tag (plus up to 15 padding).
const WG_OVERHEAD: usize = 32 + 16;
/// Bytes reserved per TUN packet buffer beyond the MTU.
const SLACK: usize = 64;
/// A receive buffer holds one GRO super-datagram.
const RX_BUF: usize = 65_536;
/// The largest packet a TUN write buffer may grow to by coalescing (GRO): a buffer's capacity
/// is this plus twice the virtio-net header, which is what `tun-rs` requires of a buffer it
/// coalesces into (it bounds the merged packet only by the capacity, so this is the upper limit
/// too: an IP packet's 16-bit length). A buffer sized for one packet made every segment its
/// own TUN write.
const MAX_SUPER_PACKET: usize = 65_535;
/// Failed TUN writes are logged as a warning at most this often.
const WRITE_WARNING_EVERY: std::time::Duration = std::time::Duration::from_secs(60);

/// Options of the TUN driver.
#[derive(Debug, Clone, Copy)]
pub struct TunOptions {
    /// The device MTU (inner packets never exceed it).
    pub mtu: u16,
    /// Whether the device was opened with offload (`IFF_VNET_HDR`).
    pub offload: bool,
}

/// Owns the peer while the driver runs.
#[derive(Debug)]
pub struct TunTunnel {
    peer: Arc<Mutex<Peer>>,
    tasks: JoinSet<()>,
    cancel: CancellationToken,
    /// The latest peer status, refreshed every timer tick.
    pub status: watch::Receiver<PeerStatus>,
    /// New keys for the peer (a rotation; see [`Peer::set_keys`]).
    pub keys: tokio::sync::mpsc::Sender<Keys>,
}

fn lock(peer: &Mutex<Peer>) -> MutexGuard<'_, Peer> {
    peer.lock().unwrap_or_else(|e| e.into_inner())
}

impl TunTunnel {
    /// Starts the driver: a TUN reader, a UDP reader and a timer task. Stops when `cancel`
    /// fires (or [`TunTunnel::shutdown`] is called).
    pub fn spawn(
        device: AsyncDevice,
        socket: UdpSocket,
        peer: Peer,
        opts: TunOptions,
        cancel: CancellationToken,
    ) -> std::io::Result<Self> {
        let state = Arc::new(udp_state(&socket)?);
        // Large socket buffers absorb bursts while the other side of the driver is busy.
        let _ = state.set_recv_buffer_size((&socket).into(), SOCKET_BUFFER);
        let _ = state.set_send_buffer_size((&socket).into(), SOCKET_BUFFER);
        let io = Arc::new(Io {
            device,
            socket,
            state,
            opts,
        });
        let (status_tx, status) = watch::channel(peer.status());
        let peer = Arc::new(Mutex::new(peer));
        let mut tasks = JoinSet::new();
        tasks.spawn(tun_to_peer(
            Arc::clone(&io),
            Arc::clone(&peer),
            cancel.clone(),
        ));
        tasks.spawn(peer_to_tun(
            Arc::clone(&io),
            Arc::clone(&peer),
            cancel.clone(),
        ));
        let (keys, rx_keys) = tokio::sync::mpsc::channel(4);
        tasks.spawn(timers(
            io,
            Arc::clone(&peer),
            status_tx,
            rx_keys,
            cancel.clone(),
        ));
        Ok(Self {
            peer,
            tasks,
            cancel,
            status,
            keys,
        })
    }

    /// A status snapshot taken now.
    pub fn status_now(&self) -> PeerStatus {
        lock(&self.peer).status()
    }

    /// Reads the status at each call (for metrics scraped at any moment).
    pub fn status_source(&self) -> impl Fn() -> PeerStatus + Send + Sync + 'static {
        let peer = Arc::clone(&self.peer);
        move || lock(&peer).status()
    }

    /// Stops all tasks and waits for them.
    pub async fn shutdown(mut self) -> PeerStatus {
        self.cancel.cancel();
        while self.tasks.join_next().await.is_some() {}
        lock(&self.peer).status()
    }
}

struct Io {
    device: AsyncDevice,
    socket: UdpSocket,
    state: Arc<UdpSocketState>,
    opts: TunOptions,
}

impl Io {
    /// Sends `contents` (one datagram, or `segment`-sized datagrams back to back).
    async fn send(&self, to: SocketAddr, contents: &[u8], segment: usize) {
        send_gso(&self.socket, &self.state, to, contents, segment).await;
    }

    /// Carries out control outputs (handshakes, keepalives, cookie replies).
    async fn control(&self, out: &mut Vec<Output>) {
        for o in out.drain(..) {
            match o {
                Output::Send { to, datagram } => {
                    if let Err(e) = self.socket.send_to(&datagram, to).await {
                        tracing::debug!(%to, error = %e, "udp send failed");
                    }
                }
                Output::Deliver(p) => {
                    if let Err(e) = self.device.send(&p).await {
                        tracing::debug!(error = %e, "tun write failed");
                    }
                }
            }
        }
    }
}

/// TUN → encrypt → UDP (GSO).
async fn tun_to_peer(io: Arc<Io>, peer: Arc<Mutex<Peer>>, cancel: CancellationToken) {
    let mtu = usize::from(io.opts.mtu);
    let pkt_len = mtu + SLACK;
    let mut original = vec![0u8; VIRTIO_NET_HDR_LEN + 65_535];
    let mut bufs = vec![vec![0u8; pkt_len]; IDEAL_BATCH_SIZE];
    let mut sizes = vec![0usize; IDEAL_BATCH_SIZE];
    let slot = pkt_len + WG_OVERHEAD;
    let mut wire = vec![0u8; slot * IDEAL_BATCH_SIZE];
    // (start, end, datagram size) of each run of equal-sized datagrams in `wire`.
    let mut runs: Vec<(usize, usize, usize)> = Vec::with_capacity(IDEAL_BATCH_SIZE);
    let mut control = Vec::new();
    let max_segments = io.state.max_gso_segments().max(1);
    loop {
        let n = tokio::select! {
            _ = cancel.cancelled() => return,
            r = io.device.recv_multiple(&mut original, &mut bufs, &mut sizes, 0) => match r {
                Ok(n) => n,
                Err(e) => {
                    tracing::debug!(error = %e, "tun read failed");
                    continue;
                }
            },
        };
        runs.clear();
        let endpoint = {
            let mut p = lock(&peer);
            let mut off = 0;
            for (buf, &size) in bufs.iter().zip(&sizes).take(n) {
                let dst = &mut wire[off..off + slot];
                let Ok(Some(len)) = p.encapsulate_into(&buf[..size], dst, &mut control) else {
                    continue;
                };
                add_to_runs(&mut runs, off, len, max_segments);
                off += len;
            }
            p.endpoint()
        };
        io.control(&mut control).await;
        let Some(to) = endpoint else { continue };
        for &(start, end, seg) in &runs {
            io.send(to, &wire[start..end], seg).await;
        }
    }
}

/// UDP (recvmmsg + GRO) → decrypt → TUN (GRO coalescing).
async fn peer_to_tun(io: Arc<Io>, peer: Arc<Mutex<Peer>>, cancel: CancellationToken) {
    let mtu = usize::from(io.opts.mtu);
    let offset = if io.opts.offload {
        VIRTIO_NET_HDR_LEN
    } else {
        0
    };
    let pkt_len = offset + mtu + SLACK;
    let batch = quinn_udp::BATCH_SIZE;
    let mut rx: Vec<Vec<u8>> = vec![vec![0u8; RX_BUF]; batch];
    let mut meta = vec![RecvMeta::default(); batch];
    let mut out = tun_write_buffers(offset, pkt_len, io.opts.offload);
    let mut gro = GROTable::default();
    let mut control = Vec::new();
    // Failed device writes, and when the last warning about them was logged.
    let (mut write_errors, mut warned) = (0u64, None);
    loop {
        let n = {
            let mut iovs: Vec<IoSliceMut<'_>> = rx.iter_mut().map(|b| IoSliceMut::new(b)).collect();
            tokio::select! {
                _ = cancel.cancelled() => return,
                r = io.socket.async_io(Interest::READABLE, || {
                    io.state.recv((&io.socket).into(), &mut iovs, &mut meta)
                }) => match r {
                    Ok(n) => n,
                    Err(e) => {
                        // ICMP port unreachable surfaces here on Linux; not fatal.
                        tracing::debug!(error = %e, "udp receive error");
                        continue;
                    }
                },
            }
        };
        let now = Instant::now();
        // (message, byte offset inside it) of the next datagram to decrypt.
        let mut pos = (0usize, 0usize);
        while pos.0 < n {
            let k = {
                let mut p = lock(&peer);
                decrypt_batch(
                    &mut p,
                    &rx[..n],
                    &meta[..n],
                    &mut pos,
                    now,
                    &mut out,
                    offset,
                    pkt_len,
                    &mut control,
                )
            };
            if k > 0
                && let Err(e) = write_tun(&io, &mut gro, &mut out[..k], offset).await
            {
                write_errors += 1;
                if warned.is_none_or(|t: Instant| t.elapsed() >= WRITE_WARNING_EVERY) {
                    warned = Some(Instant::now());
                    tracing::warn!(
                        error = %e,
                        write_errors,
                        offload = io.opts.offload,
                        "the TUN device refused a write (its packets are lost); if this \
                         persists with offload on, set [tun] offload = false"
                    );
                }
            }
        }
        io.control(&mut control).await;
    }
}

/// Decrypts datagrams from `pos` on into `out` until `out` is full or the received batch
/// is done; returns how many packets `out` holds.
#[allow(clippy::too_many_arguments)]
fn decrypt_batch(
    p: &mut Peer,
    rx: &[Vec<u8>],
    meta: &[RecvMeta],
    pos: &mut (usize, usize),
    now: Instant,
    out: &mut [Vec<u8>],
    offset: usize,
    pkt_len: usize,
    control: &mut Vec<Output>,
) -> usize {
    let mut k = 0;
    while pos.0 < rx.len() && k < out.len() {
        let m = &meta[pos.0];
        let len = m.len.min(rx[pos.0].len());
        if pos.1 >= len {
            *pos = (pos.0 + 1, 0);
            continue;
        }
        let stride = if m.stride == 0 { len } else { m.stride };
        let end = (pos.1 + stride).min(len);
        let datagram = &rx[pos.0][pos.1..end];
        pos.1 = end;
        let b = &mut out[k];
        b.resize(pkt_len, 0);
        match p.decapsulate_into(m.addr, datagram, now, &mut b[offset..], control) {
            Ok(Some(range)) if range.start == 0 => {
                b.truncate(offset + range.end);
                k += 1;
            }
            Ok(Some(_)) => tracing::debug!("decapsulated packet not at buffer start; dropped"),
            _ => {}
        }
    }
    k
}

/// The buffers decrypted packets are written from: `pkt_len` long (a packet and the
/// virtio-net header), and with offload room to coalesce a super-packet in place (`vec![v; n]`
/// would clone only the length, not the capacity). 128 buffers of 64 KiB capacity: 8 MiB of
/// address space; pages become resident as super-packets reach them, and stay so.
fn tun_write_buffers(offset: usize, pkt_len: usize, offload: bool) -> Vec<Vec<u8>> {
    let capacity = if offload {
        2 * offset + MAX_SUPER_PACKET
    } else {
        pkt_len
    };
    (0..IDEAL_BATCH_SIZE)
        .map(|_| {
            let mut b = Vec::with_capacity(capacity);
            b.resize(pkt_len, 0);
            b
        })
        .collect()
}

async fn write_tun(
    io: &Io,
    gro: &mut GROTable,
    bufs: &mut [Vec<u8>],
    offset: usize,
) -> std::io::Result<()> {
    if io.opts.offload {
        io.device.send_multiple(gro, bufs, offset).await.map(|_| ())
    } else {
        let mut r = Ok(());
        for b in bufs.iter() {
            if let Err(e) = io.device.send(&b[offset..]).await {
                r = Err(e);
            }
        }
        r
    }
}

async fn timers(
    io: Arc<Io>,
    peer: Arc<Mutex<Peer>>,
    status: watch::Sender<PeerStatus>,
    mut rx_keys: tokio::sync::mpsc::Receiver<Keys>,
    cancel: CancellationToken,
) {
    let mut ticker = tokio::time::interval(TICK);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut control = Vec::new();
    let mut keys_open = true;
    loop {
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = ticker.tick() => {}
            k = rx_keys.recv(), if keys_open => match k {
                Some(k) => {
                    lock(&peer).set_keys(k, Instant::now(), &mut control);
                    io.control(&mut control).await;
                    continue;
                }
                None => keys_open = false,
            },
        }
        let s = {
            let mut p = lock(&peer);
            p.tick(Instant::now(), &mut control);
            p.status()
        };
        io.control(&mut control).await;
        status.send_replace(s);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tunnel::peer::tests::{GUEST, GUEST_IP, GW_IP, established};
    use std::net::Ipv4Addr;

    /// An IPv4/TCP segment of one flow, `src` → `dst`: 20-byte IP header, 20-byte TCP header
    /// (ACK), payload, valid checksums (tun-rs checks them before coalescing).
    fn segment(src: Ipv4Addr, dst: Ipv4Addr, seq: u32, payload: usize) -> Vec<u8> {
        let total = 40 + payload;
        let mut p = vec![0u8; total];
        p[0] = 0x45;
        p[2..4].copy_from_slice(&(total as u16).to_be_bytes());
        p[6] = 0x40; // don't fragment
        p[8] = 64;
        p[9] = 6;
        p[12..16].copy_from_slice(&src.octets());
        p[16..20].copy_from_slice(&dst.octets());
        let ip_sum = tun_rs::checksum(&p[..20], 0);
        p[10..12].copy_from_slice(&(!ip_sum).to_be_bytes());
        p[20..22].copy_from_slice(&40000u16.to_be_bytes());
        p[22..24].copy_from_slice(&5201u16.to_be_bytes());
        p[24..28].copy_from_slice(&seq.to_be_bytes());
        p[28..32].copy_from_slice(&1u32.to_be_bytes());
        p[32] = 5 << 4;
        p[33] = 0x10; // ACK (PSH may only end a coalesced run)
        p[34..36].copy_from_slice(&64240u16.to_be_bytes());
        p[40..].fill(0xab);
        let mut pseudo = Vec::with_capacity(12 + total - 20);
        pseudo.extend_from_slice(&p[12..20]);
        pseudo.extend_from_slice(&[0, 6]);
        pseudo.extend_from_slice(&((total - 20) as u16).to_be_bytes());
        pseudo.extend_from_slice(&p[20..]);
        let tcp_sum = tun_rs::checksum(&pseudo, 0);
        p[36..38].copy_from_slice(&(!tcp_sum).to_be_bytes());
        p
    }

    /// Segments of one flow, encrypted by the guest and received by the gateway, go through
    /// the driver's own decryption (`decrypt_batch` into `tun_write_buffers`) and come out as
    /// one TUN write (GRO), batch after batch, with every buffer keeping its capacity. With
    /// buffers of one packet's capacity (the code before) tun-rs could not coalesce: 8
    /// segments were 8 writes, and the receiving kernel ran TCP's receive path per segment.
    #[test]
    fn decrypted_segments_of_a_flow_coalesce_into_one_tun_write() {
        let (offset, mtu) = (VIRTIO_NET_HDR_LEN, 1420);
        let pkt_len = offset + mtu + SLACK;
        let capacity = 2 * offset + MAX_SUPER_PACKET;
        let mut pair = established();
        let mut out = tun_write_buffers(offset, pkt_len, true);
        let (payload, n) = (mtu - 40, 8);
        let mut control = Vec::new();
        for round in 0..3 {
            let mut rx = Vec::new();
            for i in 0..n {
                let seq = 1 + ((round * n + i) * payload) as u32;
                let p = segment(GUEST_IP, GW_IP, seq, payload);
                let mut d = vec![0u8; p.len() + WG_OVERHEAD];
                let len = pair
                    .guest
                    .encapsulate_into(&p, &mut d, &mut control)
                    .expect("encapsulate")
                    .expect("a data message");
                d.truncate(len);
                rx.push(d);
            }
            let meta: Vec<RecvMeta> = rx
                .iter()
                .map(|d| {
                    let mut m = RecvMeta::default();
                    (m.addr, m.len, m.stride) = (GUEST.parse().unwrap(), d.len(), d.len());
                    m
                })
                .collect();
            let mut pos = (0, 0);
            let k = decrypt_batch(
                &mut pair.gw,
                &rx,
                &meta,
                &mut pos,
                Instant::now(),
                &mut out,
                offset,
                pkt_len,
                &mut control,
            );
            assert_eq!(k, n, "round {round}: every segment decrypted");
            // (tables start empty per write batch, as `send_multiple` resets them)
            let mut to_write = Vec::new();
            tun_rs::handle_gro(
                &mut out[..k],
                offset,
                &mut Default::default(),
                &mut Default::default(),
                false,
                &mut to_write,
            )
            .expect("gro");
            assert_eq!(
                to_write.len(),
                1,
                "round {round}: one write, got {to_write:?}"
            );
            assert_eq!(out[to_write[0]].len(), offset + 40 + n * payload);
            assert!(
                out.iter().all(|b| b.capacity() == capacity),
                "round {round}: a buffer lost its capacity"
            );
        }
        assert!(control.is_empty(), "no control messages: {control:?}");
    }

    /// Without offload nothing is coalesced, and buffers hold one packet.
    #[test]
    fn without_offload_buffers_hold_one_packet() {
        let out = tun_write_buffers(0, 1420 + SLACK, false);
        assert!(
            out.iter()
                .all(|b| b.capacity() == 1420 + SLACK && b.len() == 1420 + SLACK)
        );
    }
}
