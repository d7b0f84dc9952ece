//! Upstream exchanges: UDP on a fresh connected socket (random source port; the kernel
//! drops datagrams from any other source), retry over TCP when truncated, retry without EDNS
//! on FORMERR, next upstream of the same owner on failure. Never another owner.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpStream, UdpSocket};
use tokio::time::{Instant, timeout_at};

use super::metrics::{DnsMetrics, UpstreamResultLabel};
use crate::dns::{Engine, Forward, Owner, PendingQuery, Reply, Transport, UpstreamVerdict};
use futures::future::BoxFuture;

enum Attempt {
    Verdict(UpstreamVerdict),
    Timeout,
    Io(io::Error),
}

/// Resolve a forwarded query through its owner's upstreams; returns the client reply
/// (owner answer, stale or SERVFAIL). Bounded by `upstream_timeout` per upstream.
/// Takes owned handles so the future is `'static` and can outlive the client (refresh).
pub async fn resolve(engine: Arc<Engine>, metrics: DnsMetrics, f: Forward) -> Reply {
    resolve_with(engine, metrics, f, None).await
}

/// A way to reach the guest's resolvers other than OS sockets (the tunnel's userspace
/// stack). Each call is one exchange: send the query, return the first reply message.
pub trait GuestExchange: Send + Sync + std::fmt::Debug {
    /// One UDP exchange with `addr`.
    fn udp(&self, addr: SocketAddr, query: Vec<u8>) -> BoxFuture<'static, io::Result<Vec<u8>>>;
    /// One TCP exchange with `addr` (RFC 7766 framing is the implementation's job).
    fn tcp(&self, addr: SocketAddr, query: Vec<u8>) -> BoxFuture<'static, io::Result<Vec<u8>>>;
}

/// [`resolve`], with guest-owned queries sent through `guest` when given.
pub async fn resolve_with(
    engine: Arc<Engine>,
    metrics: DnsMetrics,
    f: Forward,
    guest: Option<Arc<dyn GuestExchange>>,
) -> Reply {
    let engine = &*engine;
    let metrics = &metrics;
    let q = f.query;
    let per_upstream = engine.config().upstream_timeout;
    for addr in f.upstreams {
        let deadline = Instant::now() + per_upstream;
        let mut edns = true;
        let mut via = Transport::Udp;
        let outcome = loop {
            let attempt = match (&guest, q.owner) {
                (Some(g), Owner::Guest) => {
                    hook_exchange(engine, g.as_ref(), &q, addr, via, edns, deadline).await
                }
                _ => match via {
                    Transport::Udp => udp_exchange(engine, metrics, &q, addr, edns, deadline).await,
                    Transport::Tcp => tcp_exchange(engine, &q, addr, edns, deadline).await,
                },
            };
            match attempt {
                Attempt::Verdict(UpstreamVerdict::Truncated) => {
                    metrics.upstream(q.owner, UpstreamResultLabel::truncated);
                    via = Transport::Tcp;
                }
                Attempt::Verdict(UpstreamVerdict::RetryWithoutEdns) if edns => {
                    edns = false;
                }
                other => break other,
            }
        };
        let now = std::time::Instant::now();
        match outcome {
            Attempt::Verdict(UpstreamVerdict::Answer(msg)) => {
                metrics.upstream(q.owner, UpstreamResultLabel::answer);
                engine.record_upstream(addr, true, now);
                return engine.complete(&q, *msg, now);
            }
            Attempt::Verdict(v) => {
                // The server is alive but could not answer this name: next upstream.
                tracing::debug!(%addr, verdict = ?v, "upstream server failure");
                metrics.upstream(q.owner, UpstreamResultLabel::server_failure);
                engine.record_upstream(addr, true, now);
            }
            Attempt::Timeout => {
                tracing::debug!(%addr, "upstream timeout");
                metrics.upstream(q.owner, UpstreamResultLabel::timeout);
                engine.record_upstream(addr, false, now);
            }
            Attempt::Io(e) => {
                tracing::debug!(%addr, error = %e, "upstream i/o error");
                metrics.upstream(q.owner, UpstreamResultLabel::error);
                engine.record_upstream(addr, false, now);
            }
        }
    }
    engine.fail(&q, std::time::Instant::now())
}

async fn hook_exchange(
    engine: &Engine,
    g: &dyn GuestExchange,
    q: &PendingQuery,
    addr: SocketAddr,
    via: Transport,
    edns: bool,
    deadline: Instant,
) -> Attempt {
    let txid: u16 = rand::random();
    let query = engine.upstream_query(q, txid, edns);
    let fut = match via {
        Transport::Udp => g.udp(addr, query),
        Transport::Tcp => g.tcp(addr, query),
    };
    match timeout_at(deadline, fut).await {
        Err(_) => Attempt::Timeout,
        Ok(Err(e)) => Attempt::Io(e),
        Ok(Ok(reply)) => match engine.check_upstream_reply(q, txid, &reply, via, edns) {
            UpstreamVerdict::Mismatch => Attempt::Io(io::Error::new(
                io::ErrorKind::InvalidData,
                "reply does not match the query",
            )),
            v => Attempt::Verdict(v),
        },
    }
}

fn unspecified_for(addr: SocketAddr) -> SocketAddr {
    if addr.is_ipv4() {
        SocketAddr::from(([0, 0, 0, 0], 0))
    } else {
        SocketAddr::from(([0u16; 8], 0))
    }
}

async fn udp_exchange(
    engine: &Engine,
    metrics: &DnsMetrics,
    q: &PendingQuery,
    addr: SocketAddr,
    edns: bool,
    deadline: Instant,
) -> Attempt {
    let sock = match UdpSocket::bind(unspecified_for(addr)).await {
        Ok(s) => s,
        Err(e) => return Attempt::Io(e),
    };
    if let Err(e) = sock.connect(addr).await {
        return Attempt::Io(e);
    }
    let txid: u16 = rand::random();
    let query = engine.upstream_query(q, txid, edns);
    if let Err(e) = sock.send(&query).await {
        return Attempt::Io(e);
    }
    let mut buf = vec![0u8; 65_535];
    loop {
        match timeout_at(deadline, sock.recv(&mut buf)).await {
            Err(_) => return Attempt::Timeout,
            Ok(Err(e)) => return Attempt::Io(e),
            Ok(Ok(n)) => {
                match engine.check_upstream_reply(q, txid, &buf[..n], Transport::Udp, edns) {
                    UpstreamVerdict::Mismatch => {
                        metrics.upstream(q.owner, UpstreamResultLabel::mismatch);
                    }
                    v => return Attempt::Verdict(v),
                }
            }
        }
    }
}

async fn tcp_exchange(
    engine: &Engine,
    q: &PendingQuery,
    addr: SocketAddr,
    edns: bool,
    deadline: Instant,
) -> Attempt {
    let r = timeout_at(deadline, async {
        let mut s = TcpStream::connect(addr).await?;
        let _ = s.set_nodelay(true);
        let txid: u16 = rand::random();
        let query = engine.upstream_query(q, txid, edns);
        let len = u16::try_from(query.len())
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "query too long"))?;
        let mut frame = Vec::with_capacity(query.len() + 2);
        frame.extend_from_slice(&len.to_be_bytes());
        frame.extend_from_slice(&query);
        s.write_all(&frame).await?;
        let mut lb = [0u8; 2];
        s.read_exact(&mut lb).await?;
        let n = usize::from(u16::from_be_bytes(lb));
        let mut buf = vec![0u8; n];
        s.read_exact(&mut buf).await?;
        Ok::<_, io::Error>(engine.check_upstream_reply(q, txid, &buf, Transport::Tcp, edns))
    })
    .await;
    match r {
        Err(_) => Attempt::Timeout,
        Ok(Err(e)) => Attempt::Io(e),
        // On a dedicated connection a mismatching reply is a broken upstream.
        Ok(Ok(UpstreamVerdict::Mismatch)) => Attempt::Io(io::Error::new(
            io::ErrorKind::InvalidData,
            "tcp reply does not match the query",
        )),
        Ok(Ok(v)) => Attempt::Verdict(v),
    }
}
