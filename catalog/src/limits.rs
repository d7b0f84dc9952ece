//! Bounds that keep one client from taking the server from the others
//! (issue 35 item 2). A shared catalog server answers every tenant's
//! catalog-operator, packageserver and tunnel gateway; each of those reaches
//! it from its own pod address, so the *peer address* is the unit of
//! fairness: one tenant is one peer (or a few), never all of them.
//!
//! - **Connections**: at most [`Limits::max_connections`] in all and
//!   [`Limits::max_connections_per_peer`] per peer address; a connection over
//!   either is closed at accept. HTTP/2 streams per connection are capped by
//!   `SETTINGS_MAX_CONCURRENT_STREAMS` ([`Limits::max_streams_per_connection`],
//!   set on the transport in `server.rs`).
//! - **Calls** ([`CallLimitLayer`]): a call holds an *admission* from the
//!   moment its handler runs until its whole answer is sent (or the stream is
//!   reset), so the memory of answers waiting for a client's flow-control
//!   window is bounded by [`Limits::max_calls`] in all and
//!   [`Limits::max_calls_per_peer`] per peer. Calls over that wait (parked,
//!   no CPU) for an admission, handed out round-robin over the waiting peers;
//!   a call that waits longer than [`Limits::admission_timeout`] is answered
//!   `RESOURCE_EXHAUSTED`.
//! - **CPU** ([`Fair::work`]): the handlers that render bundles or scan the
//!   catalog take one of [`Limits::work_slots`] slots while they compute
//!   (`ListBundles` one per bundle), again round-robin over the waiting peers;
//!   with fewer slots than runtime workers a flood of heavy calls never holds
//!   every worker, and cheap calls (GetPackage, ListPackages, health) take no
//!   slot at all.
//! - **Idle connections** ([`Conn`]): closed after [`Limits::idle_timeout`]
//!   with no call in flight; HTTP/2 keepalive pings (in `server.rs`) drop
//!   peers that stopped answering.
//!
//! Our own small round-robin queue rather than a crate: tower's and tokio's
//! limiters (ConcurrencyLimit, Semaphore) are FIFO over all callers, so the
//! peer with the most waiting calls would get most of the slots.

use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::io;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::sync::oneshot;
use tokio::time::{Instant, Sleep};

/// The bounds; [`Limits::default`] are the served defaults (flags of the binary).
#[derive(Debug, Clone)]
pub struct Limits {
    /// Open connections in all.
    pub max_connections: usize,
    /// Open connections per peer address.
    pub max_connections_per_peer: usize,
    /// HTTP/2 streams per connection (`SETTINGS_MAX_CONCURRENT_STREAMS`).
    pub max_streams_per_connection: u32,
    /// Calls being answered in all.
    pub max_calls: usize,
    /// Calls being answered per peer address.
    pub max_calls_per_peer: usize,
    /// Longest wait for a call admission before `RESOURCE_EXHAUSTED`.
    pub admission_timeout: Duration,
    /// Heavy handlers computing at once (keep below the runtime's workers).
    pub work_slots: usize,
    /// A connection with no call in flight for this long is closed.
    pub idle_timeout: Duration,
    /// HTTP/2 PING interval; a peer that does not answer within
    /// `keepalive_timeout` is dropped.
    pub keepalive_interval: Duration,
    /// See `keepalive_interval`.
    pub keepalive_timeout: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_connections: 512,
            max_connections_per_peer: 64,
            max_streams_per_connection: 16,
            max_calls: 128,
            max_calls_per_peer: 16,
            admission_timeout: Duration::from_secs(30),
            work_slots: 1,
            idle_timeout: Duration::from_secs(600),
            keepalive_interval: Duration::from_secs(30),
            keepalive_timeout: Duration::from_secs(10),
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // No code path panics while holding these locks; if one ever did, the
    // counts are still the best information there is.
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// A round-robin queue of waiters per peer in front of `capacity` slots, with
/// at most `per_peer` slots held by one peer.
#[derive(Debug)]
struct RoundRobin {
    capacity: usize,
    per_peer: usize,
    state: Mutex<RrState>,
}

#[derive(Debug, Default)]
struct RrState {
    used: usize,
    held: HashMap<IpAddr, usize>,
    /// Peers with waiters, in turn order.
    waiting: VecDeque<(IpAddr, VecDeque<oneshot::Sender<()>>)>,
}

impl RoundRobin {
    fn new(capacity: usize, per_peer: usize) -> Arc<Self> {
        Arc::new(RoundRobin {
            capacity: capacity.max(1),
            per_peer: per_peer.max(1),
            state: Mutex::new(RrState::default()),
        })
    }

    /// Waits for a slot for `peer`; `None` when `timeout` passes first.
    async fn acquire(self: &Arc<Self>, peer: IpAddr, timeout: Option<Duration>) -> Option<Slot> {
        let rx = {
            let mut st = lock(&self.state);
            let held = st.held.get(&peer).copied().unwrap_or(0);
            let peer_waits = st.waiting.iter().any(|(p, _)| *p == peer);
            // Room, and no earlier call of this peer queued: no turn to wait
            // for. Waiters of other peers left in the queue while there is
            // room are at their own per-peer bound (a release grants the
            // others at once), so this takes nothing from them.
            if st.used < self.capacity && held < self.per_peer && !peer_waits {
                st.used += 1;
                *st.held.entry(peer).or_insert(0) += 1;
                return Some(Slot {
                    rr: Arc::clone(self),
                    peer,
                });
            }
            let (tx, rx) = oneshot::channel();
            match st.waiting.iter_mut().find(|(p, _)| *p == peer) {
                Some((_, q)) => q.push_back(tx),
                None => st.waiting.push_back((peer, VecDeque::from([tx]))),
            }
            rx
        };
        let mut waiter = Waiter {
            rx: Some(rx),
            rr: Arc::clone(self),
            peer,
        };
        let granted = async {
            match waiter.rx.as_mut() {
                Some(rx) => rx.await.is_ok(),
                None => false,
            }
        };
        let ok = match timeout {
            Some(t) => tokio::time::timeout(t, granted).await.unwrap_or(false),
            None => granted.await,
        };
        if ok {
            // The grant already counted the slot as held.
            waiter.rx = None;
            Some(Slot {
                rr: Arc::clone(self),
                peer,
            })
        } else {
            None
        }
    }

    /// Gives a freed slot of `peer` to the next waiting peer in turn that is
    /// under its own bound, or back to the pool.
    fn release(&self, peer: IpAddr) {
        let mut st = lock(&self.state);
        st.used = st.used.saturating_sub(1);
        if let Some(n) = st.held.get_mut(&peer) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                st.held.remove(&peer);
            }
        }
        self.grant(&mut st);
    }

    fn grant(&self, st: &mut RrState) {
        let mut passes = st.waiting.len();
        while st.used < self.capacity && passes > 0 {
            let Some((p, mut q)) = st.waiting.pop_front() else {
                return;
            };
            let held = st.held.get(&p).copied().unwrap_or(0);
            if held >= self.per_peer {
                // This peer has its share: it keeps its place at the back.
                st.waiting.push_back((p, q));
                passes -= 1;
                continue;
            }
            let mut granted = false;
            while let Some(tx) = q.pop_front() {
                if tx.send(()).is_ok() {
                    granted = true;
                    break;
                }
                // That caller gave up (timeout, reset): try its next call.
            }
            if !q.is_empty() {
                st.waiting.push_back((p, q));
            }
            if granted {
                st.used += 1;
                *st.held.entry(p).or_insert(0) += 1;
                passes = st.waiting.len();
            } else {
                passes = passes.saturating_sub(1);
            }
        }
    }
}

/// A waiting caller; a grant that arrives after it gave up goes back.
struct Waiter {
    rx: Option<oneshot::Receiver<()>>,
    rr: Arc<RoundRobin>,
    peer: IpAddr,
}

impl Drop for Waiter {
    fn drop(&mut self) {
        if let Some(mut rx) = self.rx.take() {
            rx.close();
            if rx.try_recv().is_ok() {
                self.rr.release(self.peer);
            }
        }
    }
}

/// A held slot; dropping it frees the slot.
#[derive(Debug)]
pub struct Slot {
    rr: Arc<RoundRobin>,
    peer: IpAddr,
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.rr.release(self.peer);
    }
}

/// Counts connections per peer.
#[derive(Debug)]
struct ConnCounts {
    max: usize,
    per_peer: usize,
    state: Mutex<(usize, HashMap<IpAddr, usize>)>,
}

/// The shared state of every bound.
#[derive(Debug)]
pub struct Fair {
    limits: Limits,
    conns: ConnCounts,
    calls: Arc<RoundRobin>,
    work: Arc<RoundRobin>,
    renders: crate::render_pool::RenderPool,
}

impl Fair {
    /// Bounds per `limits`; starts the render threads (one per work slot).
    pub fn new(limits: Limits) -> std::io::Result<Arc<Self>> {
        let renders = crate::render_pool::RenderPool::new(limits.work_slots)?;
        Ok(Arc::new(Fair {
            conns: ConnCounts {
                max: limits.max_connections,
                per_peer: limits.max_connections_per_peer,
                state: Mutex::new((0, HashMap::new())),
            },
            calls: RoundRobin::new(limits.max_calls, limits.max_calls_per_peer),
            // One peer may use every work slot while nobody else waits.
            work: RoundRobin::new(limits.work_slots, limits.work_slots),
            renders,
            limits,
        }))
    }

    /// The bounds in force.
    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    /// Waits for a CPU slot for `peer` (round-robin over waiting peers).
    pub async fn work(&self, peer: IpAddr) -> Slot {
        loop {
            if let Some(s) = self.work.acquire(peer, None).await {
                return s;
            }
        }
    }

    /// Runs `f` for `peer` once it has a CPU slot (round-robin over waiting
    /// peers), on a render thread (see [`crate::render_pool`]). The slot goes
    /// with the job and is freed when `f` is done, not when the caller stops
    /// waiting: a client that drops its calls cannot queue renders beyond the
    /// slots (`cancelled_calls_cannot_queue_renders_past_the_slots`).
    pub async fn compute<R: Send + 'static>(
        &self,
        peer: IpAddr,
        f: impl FnOnce() -> R + Send + 'static,
    ) -> Result<R, crate::render_pool::JobLost> {
        let slot = self.work(peer).await;
        self.renders
            .run(move || {
                let _slot = slot;
                f()
            })
            .await
    }

    /// Jobs in the render pool (queued or running).
    pub fn renders_pending(&self) -> usize {
        self.renders.pending()
    }

    /// Wraps an accepted connection, or `None` (the caller closes it) when
    /// the server or this peer is at its connection bound.
    pub fn accept(self: &Arc<Self>, io: TcpStream) -> Option<Conn> {
        let remote = io.peer_addr().ok()?;
        let local = io.local_addr().ok();
        let peer = remote.ip();
        {
            let mut st = lock(&self.conns.state);
            let n = st.1.get(&peer).copied().unwrap_or(0);
            if st.0 >= self.conns.max || n >= self.conns.per_peer {
                tracing::debug!(%peer, open = st.0, of_peer = n, "connection refused: at the connection bound");
                return None;
            }
            st.0 += 1;
            *st.1.entry(peer).or_insert(0) += 1;
        }
        let _ = io.set_nodelay(true);
        let state = Arc::new(ConnState {
            open_calls: AtomicUsize::new(0),
            last_change: Mutex::new(Instant::now()),
        });
        Some(Conn {
            io,
            info: PeerInfo {
                remote,
                local,
                conn: Arc::clone(&state),
            },
            idle: Box::pin(tokio::time::sleep(self.limits.idle_timeout)),
            idle_timeout: self.limits.idle_timeout,
            fair: Arc::clone(self),
        })
    }

    fn closed(&self, peer: IpAddr) {
        let mut st = lock(&self.conns.state);
        st.0 = st.0.saturating_sub(1);
        if let Some(n) = st.1.get_mut(&peer) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                st.1.remove(&peer);
            }
        }
    }
}

/// Per-connection activity, for the idle timeout.
#[derive(Debug)]
struct ConnState {
    open_calls: AtomicUsize,
    last_change: Mutex<Instant>,
}

/// What a handler learns about its caller (a request extension).
#[derive(Debug, Clone)]
pub struct PeerInfo {
    /// The client's address.
    pub remote: SocketAddr,
    /// Our address.
    pub local: Option<SocketAddr>,
    conn: Arc<ConnState>,
}

impl PeerInfo {
    /// The peer of a request; unspecified when the request did not come
    /// through [`Fair::accept`] (then every such caller is one peer).
    pub fn peer_of<T>(req: &tonic::Request<T>) -> IpAddr {
        req.extensions()
            .get::<PeerInfo>()
            .map(|p| p.remote.ip())
            .unwrap_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED))
    }
}

/// An accepted connection: counted against the connection bounds until
/// dropped, closed when idle for [`Limits::idle_timeout`].
pub struct Conn {
    io: TcpStream,
    info: PeerInfo,
    idle: Pin<Box<Sleep>>,
    idle_timeout: Duration,
    fair: Arc<Fair>,
}

impl Drop for Conn {
    fn drop(&mut self) {
        self.fair.closed(self.info.remote.ip());
    }
}

impl tonic::transport::server::Connected for Conn {
    type ConnectInfo = PeerInfo;
    fn connect_info(&self) -> PeerInfo {
        self.info.clone()
    }
}

impl AsyncRead for Conn {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        match Pin::new(&mut this.io).poll_read(cx, buf) {
            Poll::Pending => {
                if this.info.conn.open_calls.load(Ordering::Acquire) == 0 {
                    let deadline = *lock(&this.info.conn.last_change) + this.idle_timeout;
                    if this.idle.deadline() != deadline {
                        this.idle.as_mut().reset(deadline);
                    }
                    if this.idle.as_mut().poll(cx).is_ready()
                        && this.info.conn.open_calls.load(Ordering::Acquire) == 0
                    {
                        tracing::debug!(peer = %this.info.remote, "closing idle connection");
                        return Poll::Ready(Err(io::Error::new(
                            io::ErrorKind::TimedOut,
                            "idle connection closed",
                        )));
                    }
                }
                Poll::Pending
            }
            r => r,
        }
    }
}

impl AsyncWrite for Conn {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }
    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }
}

/// A call in flight: its admission and its connection's activity count.
struct CallGuard {
    _admission: Slot,
    conn: Option<Arc<ConnState>>,
}

impl Drop for CallGuard {
    fn drop(&mut self) {
        if let Some(c) = &self.conn {
            *lock(&c.last_change) = Instant::now();
            c.open_calls.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

/// The tower layer admitting calls (see the module docs).
#[derive(Debug, Clone)]
pub struct CallLimitLayer {
    fair: Arc<Fair>,
}

impl CallLimitLayer {
    /// Admits calls per `fair`'s bounds.
    pub fn new(fair: Arc<Fair>) -> Self {
        CallLimitLayer { fair }
    }
}

impl<S> tower::Layer<S> for CallLimitLayer {
    type Service = CallLimit<S>;
    fn layer(&self, inner: S) -> CallLimit<S> {
        CallLimit {
            inner,
            fair: Arc::clone(&self.fair),
        }
    }
}

/// See [`CallLimitLayer`].
#[derive(Debug, Clone)]
pub struct CallLimit<S> {
    inner: S,
    fair: Arc<Fair>,
}

type BoxFuture<T, E> = Pin<Box<dyn Future<Output = Result<T, E>> + Send + 'static>>;

impl<S, B> tower::Service<http::Request<B>> for CallLimit<S>
where
    S: tower::Service<http::Request<B>, Response = http::Response<tonic::body::Body>>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    B: Send + 'static,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = S::Error;
    type Future = BoxFuture<Self::Response, Self::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        // The service that was driven to readiness serves this call; a clone
        // takes its place for the next one (tower's usual pattern).
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let fair = Arc::clone(&self.fair);
        let info = req.extensions().get::<PeerInfo>().cloned();
        let peer = info
            .as_ref()
            .map(|i| i.remote.ip())
            .unwrap_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED));
        Box::pin(async move {
            let conn = info.map(|i| i.conn);
            if let Some(c) = &conn {
                c.open_calls.fetch_add(1, Ordering::AcqRel);
            }
            let admission = fair
                .calls
                .acquire(peer, Some(fair.limits.admission_timeout))
                .await;
            let Some(admission) = admission else {
                if let Some(c) = &conn {
                    *lock(&c.last_change) = Instant::now();
                    c.open_calls.fetch_sub(1, Ordering::AcqRel);
                }
                tracing::debug!(%peer, "call refused: no admission within the admission timeout");
                return Ok(tonic::Status::resource_exhausted(
                    "catalog server busy: too many calls in flight from this client",
                )
                .into_http());
            };
            let guard = CallGuard {
                _admission: admission,
                conn,
            };
            let resp = inner.call(req).await?;
            Ok(resp.map(|body| {
                tonic::body::Body::new(Guarded {
                    body,
                    _guard: guard,
                })
            }))
        })
    }
}

/// A response body that holds its call's admission until it is done or dropped.
struct Guarded {
    body: tonic::body::Body,
    _guard: CallGuard,
}

impl http_body::Body for Guarded {
    type Data = bytes::Bytes;
    type Error = tonic::Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(n: u8) -> IpAddr {
        IpAddr::V4(Ipv4Addr::new(127, 0, 0, n))
    }

    #[tokio::test]
    async fn round_robin_serves_peers_in_turn_and_bounds_each_peer() {
        let rr = RoundRobin::new(1, 1);
        let first = rr.acquire(ip(2), None).await.expect("free slot");
        // Peer 2 queues three calls, then peer 3 one: peer 3 is served second.
        let order = Arc::new(Mutex::new(Vec::new()));
        let mut tasks = Vec::new();
        for (n, who) in [(2u8, "a1"), (2, "a2"), (2, "a3"), (3, "b1")] {
            let rr = Arc::clone(&rr);
            let order = Arc::clone(&order);
            tasks.push(tokio::spawn(async move {
                let s = rr.acquire(ip(n), None).await.expect("slot");
                lock(&order).push(who);
                tokio::task::yield_now().await;
                drop(s);
            }));
            tokio::task::yield_now().await;
        }
        drop(first);
        for t in tasks {
            t.await.expect("task");
        }
        assert_eq!(*lock(&order), vec!["a1", "b1", "a2", "a3"]);
        let st = lock(&rr.state);
        assert_eq!(st.used, 0);
        assert!(st.held.is_empty());
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn cancelled_calls_cannot_queue_renders_past_the_slots() {
        // A client that drops its calls once they hold the work slot must not leave
        // their renders queued behind it: every other tenant's render would wait for all
        // of them. At most `work_slots` renders may be pending at any time.
        let fair = Fair::new(Limits::default()).expect("fair");
        let slots = Limits::default().work_slots;
        let max_seen = Arc::new(AtomicUsize::new(0));
        let watch = {
            let (fair, max_seen) = (Arc::clone(&fair), Arc::clone(&max_seen));
            tokio::spawn(async move {
                loop {
                    max_seen.fetch_max(fair.renders_pending(), Ordering::Relaxed);
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
            })
        };
        for _ in 0..40 {
            let call = fair.compute(ip(7), || std::thread::sleep(Duration::from_millis(20)));
            // Dropped once it has been handed to the pool (or is still waiting).
            let _ = tokio::time::timeout(Duration::from_millis(2), call).await;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        watch.abort();
        let seen = max_seen.load(Ordering::Relaxed);
        // One more than the slots: a finishing job frees its slot just before the pool
        // counts it done, so the next one may be handed over in between.
        assert!(
            seen <= slots + 1,
            "{seen} renders pending at once from cancelled calls (work slots: {slots})"
        );
    }

    #[tokio::test]
    async fn a_peer_at_its_bound_waits_while_others_get_slots() {
        let rr = RoundRobin::new(4, 2);
        let _a = rr.acquire(ip(2), None).await.expect("slot");
        let _b = rr.acquire(ip(2), None).await.expect("slot");
        assert!(
            rr.acquire(ip(2), Some(Duration::from_millis(50)))
                .await
                .is_none(),
            "a third slot for peer 2"
        );
        let c = rr
            .acquire(ip(3), Some(Duration::from_millis(50)))
            .await
            .expect("peer 3 gets a slot");
        drop(c);
        // A given-up waiter leaves nothing held.
        let st = lock(&rr.state);
        assert_eq!(st.used, 2);
    }
}
