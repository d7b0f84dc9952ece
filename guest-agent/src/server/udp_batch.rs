//! Batched UDP I/O for the DNS listener: one `recvmmsg` reads up to [`BATCH`] queries and one
//! `sendmmsg` sends up to [`BATCH`] answers, so the per-call cost of the kernel (entry, file
//! lookup, socket lock, the scheduler on return) is paid once per batch, not per query.
//!
//! Why not quinn-udp (the tunnel's socket layer): it switches on GRO, receive timestamps, ToS
//! and packet-info control messages, which a DNS listener would pay for on every query and
//! does not use, and it has no `sendmmsg` to many peers. `nix` wraps the two system calls
//! with none of that.
//!
//! Both calls are non-blocking: the caller drives them from tokio readiness
//! (`UdpSocket::async_io`), so a `WouldBlock` means "wait for readiness", as with `recv_from`.

use std::io::{self, IoSlice, IoSliceMut};
use std::net::{SocketAddr, SocketAddrV4, SocketAddrV6};
use std::os::fd::RawFd;

use nix::sys::socket::{
    ControlMessage, MsgFlags, MultiHeaders, SockaddrStorage, recvmmsg, sendmmsg,
};

/// Datagrams per system call.
pub const BATCH: usize = 32;

/// Largest UDP query read whole. A DNS query is a question and an OPT record, well under
/// 512 bytes in practice; anything longer than this arrives truncated (`MSG_TRUNC`) and is
/// dropped rather than parsed from a prefix.
pub const MAX_QUERY: usize = 4096;

/// One received datagram: `len` bytes at the start of its buffer.
#[derive(Debug, Clone, Copy)]
pub struct Received {
    pub len: usize,
    /// `None` when the kernel gave no address (never for a UDP socket).
    pub peer: Option<SocketAddr>,
    /// Longer than [`MAX_QUERY`]: only a prefix was read.
    pub truncated: bool,
}

/// Receive side: [`BATCH`] buffers of [`MAX_QUERY`] bytes (128 KiB), allocated once. (The
/// message headers are built per call: nix's `MultiHeaders` holds raw pointers and is not
/// `Send`, so it cannot live across an await in a tokio task; building one costs two small
/// allocations per batch, not per query.)
pub struct Receiver {
    buf: Vec<u8>,
    got: Vec<Received>,
}

impl Default for Receiver {
    fn default() -> Self {
        Self::new()
    }
}

impl Receiver {
    pub fn new() -> Self {
        Self {
            buf: vec![0; BATCH * MAX_QUERY],
            got: Vec::with_capacity(BATCH),
        }
    }

    /// Reads what is queued on `fd`, up to [`BATCH`] datagrams, without blocking. Returns how
    /// many were read (`WouldBlock` when none was queued).
    pub fn recv(&mut self, fd: RawFd) -> io::Result<usize> {
        self.got.clear();
        let mut iovs: Vec<[IoSliceMut<'_>; 1]> = self
            .buf
            .chunks_mut(MAX_QUERY)
            .map(|c| [IoSliceMut::new(c)])
            .collect();
        let mut hdrs = MultiHeaders::<SockaddrStorage>::preallocate(BATCH, None);
        let msgs = recvmmsg(fd, &mut hdrs, iovs.iter_mut(), MsgFlags::MSG_DONTWAIT, None)
            .map_err(io::Error::from)?;
        for m in msgs {
            self.got.push(Received {
                len: m.bytes.min(MAX_QUERY),
                peer: m.address.as_ref().and_then(to_std),
                truncated: m.flags.contains(MsgFlags::MSG_TRUNC),
            });
        }
        Ok(self.got.len())
    }

    /// The datagrams of the last [`Receiver::recv`], with their bytes.
    pub fn datagrams(&self) -> impl Iterator<Item = (&[u8], Received)> + '_ {
        self.got
            .iter()
            .zip(self.buf.chunks(MAX_QUERY))
            .map(|(r, b)| (&b[..r.len], *r))
    }
}

fn to_std(a: &SockaddrStorage) -> Option<SocketAddr> {
    if let Some(v4) = a.as_sockaddr_in() {
        return Some(SocketAddr::V4(SocketAddrV4::from(*v4)));
    }
    a.as_sockaddr_in6()
        .map(|v6| SocketAddr::V6(SocketAddrV6::from(*v6)))
}

/// Send side: answers queued in order and sent from the front, [`BATCH`] per call. The
/// peers are kept in the form `sendmmsg` takes, converted once when queued.
pub struct Sender {
    answers: Vec<Vec<u8>>,
    peers: Vec<Option<SockaddrStorage>>,
}

impl Default for Sender {
    fn default() -> Self {
        Self::new()
    }
}

impl Sender {
    pub fn new() -> Self {
        Self {
            answers: Vec::with_capacity(BATCH),
            peers: Vec::with_capacity(BATCH),
        }
    }

    pub fn push(&mut self, bytes: Vec<u8>, peer: SocketAddr) {
        self.answers.push(bytes);
        self.peers.push(Some(SockaddrStorage::from(peer)));
    }

    pub fn is_empty(&self) -> bool {
        self.answers.is_empty()
    }

    /// Sends from the front of the queue, up to [`BATCH`] answers, without blocking, and
    /// removes what was sent. Returns how many were sent (at least one on `Ok`). An error is
    /// the first answer's own (`WouldBlock` when the socket buffer is full); the caller waits
    /// or drops that answer with [`Sender::drop_first`].
    pub fn send(&mut self, fd: RawFd) -> io::Result<usize> {
        let n = self.answers.len().min(BATCH);
        if n == 0 {
            return Ok(0);
        }
        let iovs: Vec<[IoSlice<'_>; 1]> = self.answers[..n]
            .iter()
            .map(|b| [IoSlice::new(b)])
            .collect();
        let none: [ControlMessage<'_>; 0] = [];
        let mut hdrs = MultiHeaders::<SockaddrStorage>::preallocate(n, None);
        let sent = sendmmsg(
            fd,
            &mut hdrs,
            iovs.iter(),
            &self.peers[..n],
            none,
            MsgFlags::MSG_DONTWAIT,
        )
        .map_err(io::Error::from)?
        .count();
        if sent == 0 {
            // not expected from the kernel; an error makes the caller drop one answer, so
            // the send loop always ends
            return Err(io::Error::other("sendmmsg sent nothing"));
        }
        self.answers.drain(..sent);
        self.peers.drain(..sent);
        Ok(sent)
    }

    /// Gives up on the first queued answer (its send failed for a reason of its own, such as
    /// an unreachable peer); returns its peer for the log.
    pub fn drop_first(&mut self) -> Option<SocketAddr> {
        if self.answers.is_empty() {
            return None;
        }
        self.answers.remove(0);
        self.peers.remove(0).as_ref().and_then(to_std)
    }
}

// The address family checks of the helpers, without a socket.
#[cfg(test)]
mod tests {
    use super::*;

    /// A non-blocking server socket and a client socket, both on 127.0.0.1.
    fn loopback_pair() -> (std::net::UdpSocket, std::net::UdpSocket) {
        let server = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        server.set_nonblocking(true).unwrap();
        let client = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        (server, client)
    }

    #[test]
    fn addresses_round_trip_both_families() {
        for a in [
            "198.18.0.1:53".parse::<SocketAddr>().unwrap(),
            "[fd00::1]:5353".parse().unwrap(),
            "[::ffff:198.18.0.2]:53".parse().unwrap(),
        ] {
            assert_eq!(to_std(&SockaddrStorage::from(a)), Some(a));
        }
    }

    /// `sendmmsg` reports an error only for the first message of a call: an answer that
    /// cannot be sent (here to an IPv6 peer from an IPv4 socket) costs only itself, the
    /// answers before and after it arrive.
    #[test]
    fn an_unsendable_answer_costs_only_itself() {
        use std::os::fd::AsRawFd;
        let (server, client) = loopback_pair();
        client
            .set_read_timeout(Some(std::time::Duration::from_secs(2)))
            .unwrap();
        let to = client.local_addr().unwrap();
        let mut tx = Sender::new();
        tx.push(b"first".to_vec(), to);
        tx.push(b"lost".to_vec(), "[::1]:53".parse().unwrap());
        tx.push(b"third".to_vec(), to);
        let fd = server.as_raw_fd();
        let mut errors = 0;
        while !tx.is_empty() {
            match tx.send(fd) {
                Ok(n) => assert!(n > 0),
                Err(_) => {
                    errors += 1;
                    assert_eq!(tx.drop_first(), Some("[::1]:53".parse().unwrap()));
                }
            }
        }
        assert_eq!(errors, 1);
        let mut buf = [0u8; 16];
        for want in [&b"first"[..], b"third"] {
            let n = client.recv(&mut buf).unwrap();
            assert_eq!(&buf[..n], want);
        }
    }

    /// Two datagrams queued, read with one call; one longer than [`MAX_QUERY`] is marked.
    #[test]
    fn a_batch_is_read_with_its_peers_and_truncation() {
        use std::os::fd::AsRawFd;
        let (server, client) = loopback_pair();
        client
            .send_to(b"small", server.local_addr().unwrap())
            .unwrap();
        client
            .send_to(&vec![7u8; MAX_QUERY + 100], server.local_addr().unwrap())
            .unwrap();
        let mut rx = Receiver::new();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
        let mut got = Vec::new();
        while got.len() < 2 && std::time::Instant::now() < deadline {
            match rx.recv(server.as_raw_fd()) {
                Ok(_) => got.extend(rx.datagrams().map(|(b, r)| (b.to_vec(), r))),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    std::thread::sleep(std::time::Duration::from_millis(5))
                }
                Err(e) => panic!("{e}"),
            }
        }
        assert_eq!(got.len(), 2);
        assert_eq!(got[0].0, b"small");
        assert!(!got[0].1.truncated);
        assert_eq!(got[0].1.peer, Some(client.local_addr().unwrap()));
        assert_eq!(got[1].0.len(), MAX_QUERY);
        assert!(got[1].1.truncated);
        // nothing left
        assert_eq!(
            rx.recv(server.as_raw_fd()).unwrap_err().kind(),
            io::ErrorKind::WouldBlock
        );
    }
}
