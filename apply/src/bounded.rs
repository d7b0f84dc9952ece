//! A bound in bytes and time on every answer of an untrusted server (a guest API server),
//! as a tower layer under kube's client.
//!
//! kube's client reads a whole response body into memory before decoding it, with no
//! limit, and its timeouts cover only the wait for a response's head: a server that
//! answers `200` and then streams an endless body grows the reader until it is OOM-killed,
//! and one that trickles its body holds the request for as long as it likes. [`BoundLayer`]
//! wraps the HTTP service kube's client sends through: every request that is not a watch
//! gets a deadline on the whole exchange (head and body) and a cap on its body's bytes
//! (a `Content-Length` over the cap is refused before any of the body is read). Crossing
//! either is a [`BoundError`] naming the bound and the request, which reaches the caller
//! inside `kube::Error::Service` ([`find`] digs it out).
//!
//! Watches (`watch=true`) are left alone: they are meant to stay open for minutes, and
//! [`crate::watch`] bounds each of their events and pages itself.
//!
//! Our own rather than `tower_http::limit`/`timeout`: tower-http's body limit answers a
//! *request* with 413 (it limits what a server accepts, not what a client reads), and its
//! timeouts bound the head or the time between frames, not a whole body.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};

/// Type-erased error, as tower and kube use it.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The bounds of one answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Bounds {
    /// Largest body accepted, in bytes.
    pub max_bytes: usize,
    /// Longest a request may take from sending it to the end of its answer's body.
    pub deadline: Duration,
}

/// An answer crossed one of its [`Bounds`].
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum BoundError {
    /// The body (or its announced length) is larger than the bound.
    #[error(
        "the answer to {request} is larger than {limit} bytes (the bound on an untrusted server's answer)"
    )]
    TooLarge { request: String, limit: usize },
    /// The head and body did not arrive within the deadline.
    #[error(
        "the answer to {request} took longer than {limit:?} (the deadline on an untrusted server's whole answer, body included)"
    )]
    Timeout { request: String, limit: Duration },
}

/// The [`BoundError`] somewhere in `e`'s chain of sources (itself included).
pub fn find<'a>(e: &'a (dyn std::error::Error + 'static)) -> Option<&'a BoundError> {
    let mut next: Option<&(dyn std::error::Error + 'static)> = Some(e);
    // A chain is finite, but one built by a peer's data could be long; 32 links are more
    // than any real error has.
    for _ in 0..32 {
        let cur = next?;
        if let Some(b) = cur.downcast_ref::<BoundError>() {
            return Some(b);
        }
        next = cur.source();
    }
    None
}

/// Whether `uri` asks for a watch (`watch=true` or `watch=1` in its query).
pub fn is_watch(uri: &http::Uri) -> bool {
    uri.query().is_some_and(|q| {
        q.split('&')
            .any(|kv| matches!(kv, "watch=true" | "watch=1" | "watch=True"))
    })
}

/// `METHOD path` of a request, for messages (no query: label selectors can be long; no
/// headers: never a token).
fn describe<B>(req: &http::Request<B>) -> String {
    let path = req.uri().path();
    let mut path: String = path.chars().take(256).collect();
    if req.uri().path().len() > path.len() {
        path.push('…');
    }
    format!("{} {path}", req.method())
}

/// The layer (see the module docs).
#[derive(Clone, Copy, Debug)]
pub struct BoundLayer {
    bounds: Bounds,
}

impl BoundLayer {
    pub fn new(bounds: Bounds) -> Self {
        Self { bounds }
    }
}

impl<S> tower::Layer<S> for BoundLayer {
    type Service = BoundService<S>;
    fn layer(&self, inner: S) -> Self::Service {
        BoundService {
            inner,
            bounds: self.bounds,
        }
    }
}

/// The service [`BoundLayer`] makes.
#[derive(Clone, Debug)]
pub struct BoundService<S> {
    inner: S,
    bounds: Bounds,
}

type ResponseFuture<B> =
    Pin<Box<dyn Future<Output = Result<http::Response<BoundedBody<B>>, BoxError>> + Send>>;

impl<S, ReqB, ResB> tower::Service<http::Request<ReqB>> for BoundService<S>
where
    S: tower::Service<http::Request<ReqB>, Response = http::Response<ResB>>,
    S::Future: Send + 'static,
    S::Error: Into<BoxError>,
    ResB: Body<Data = Bytes> + Unpin + Send + 'static,
    ResB::Error: Into<BoxError>,
{
    type Response = http::Response<BoundedBody<ResB>>;
    type Error = BoxError;
    type Future = ResponseFuture<ResB>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, req: http::Request<ReqB>) -> Self::Future {
        if is_watch(req.uri()) {
            let fut = self.inner.call(req);
            return Box::pin(async move {
                let res = fut.await.map_err(Into::into)?;
                Ok(res.map(|b| BoundedBody {
                    inner: b,
                    bound: None,
                }))
            });
        }
        let bounds = self.bounds;
        let request = describe(&req);
        let deadline = tokio::time::Instant::now() + bounds.deadline;
        let fut = self.inner.call(req);
        Box::pin(async move {
            let timeout = || BoundError::Timeout {
                request: request.clone(),
                limit: bounds.deadline,
            };
            let res = match tokio::time::timeout_at(deadline, fut).await {
                Ok(r) => r.map_err(Into::into)?,
                Err(_) => return Err(timeout().into()),
            };
            let announced = res
                .headers()
                .get(http::header::CONTENT_LENGTH)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.parse::<u64>().ok());
            if announced.is_some_and(|n| n > bounds.max_bytes as u64) {
                return Err(BoundError::TooLarge {
                    request,
                    limit: bounds.max_bytes,
                }
                .into());
            }
            Ok(res.map(|b| BoundedBody {
                inner: b,
                bound: Some(Bound {
                    left: bounds.max_bytes,
                    limit: bounds.max_bytes,
                    sleep: Box::pin(tokio::time::sleep_until(deadline)),
                    deadline: bounds.deadline,
                    request,
                    failed: false,
                }),
            }))
        })
    }
}

struct Bound {
    left: usize,
    limit: usize,
    sleep: Pin<Box<tokio::time::Sleep>>,
    deadline: Duration,
    request: String,
    /// An error was returned: the body ends.
    failed: bool,
}

/// A response body under its bounds (none for a watch).
pub struct BoundedBody<B> {
    inner: B,
    bound: Option<Bound>,
}

impl<B> Body for BoundedBody<B>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        let Some(b) = this.bound.as_mut() else {
            return Pin::new(&mut this.inner).poll_frame(cx).map_err(Into::into);
        };
        if b.failed {
            return Poll::Ready(None);
        }
        // The deadline first: a body that always has a frame ready still ends on time.
        if b.sleep.as_mut().poll(cx).is_ready() {
            b.failed = true;
            return Poll::Ready(Some(Err(BoundError::Timeout {
                request: std::mem::take(&mut b.request),
                limit: b.deadline,
            }
            .into())));
        }
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                let n = frame.data_ref().map_or(0, Bytes::len);
                if n > b.left {
                    b.failed = true;
                    return Poll::Ready(Some(Err(BoundError::TooLarge {
                        request: std::mem::take(&mut b.request),
                        limit: b.limit,
                    }
                    .into())));
                }
                b.left -= n;
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Err(e))) => Poll::Ready(Some(Err(e.into()))),
            Poll::Ready(None) => Poll::Ready(None),
            Poll::Pending => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.bound.as_ref().is_some_and(|b| b.failed) || self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;
    use tower::{Layer, Service, ServiceExt};

    /// A service answering every request with `body()`.
    fn answering<B: Send + 'static>(
        body: impl Fn() -> B + Clone + Send + 'static,
    ) -> impl Service<
        http::Request<()>,
        Response = http::Response<B>,
        Error = BoxError,
        Future = impl Future<Output = Result<http::Response<B>, BoxError>> + Send,
    > + Clone {
        tower::service_fn(move |_req: http::Request<()>| {
            let body = body.clone();
            async move { Ok::<_, BoxError>(http::Response::new(body())) }
        })
    }

    fn endless() -> impl Body<Data = Bytes, Error = BoxError> + Unpin + Send {
        http_body_util::StreamBody::new(futures::stream::repeat_with(|| {
            Ok::<_, BoxError>(Frame::data(Bytes::from_static(&[b'x'; 4096])))
        }))
    }

    const BOUNDS: Bounds = Bounds {
        max_bytes: 1 << 20,
        deadline: Duration::from_secs(5),
    };

    fn get(uri: &str) -> http::Request<()> {
        http::Request::get(uri).body(()).unwrap()
    }

    /// An endless body ends at the byte bound, with an error naming it and the request.
    #[tokio::test]
    async fn an_endless_body_ends_at_its_byte_bound() {
        let mut svc = BoundLayer::new(BOUNDS).layer(answering(endless));
        let res = svc
            .ready()
            .await
            .unwrap()
            .call(get("/apis/x/v1/things?limit=5"))
            .await
            .unwrap();
        let e = res.into_body().collect().await.err().unwrap();
        let b = find(e.as_ref()).unwrap();
        assert_eq!(
            b,
            &BoundError::TooLarge {
                request: "GET /apis/x/v1/things".into(),
                limit: 1 << 20
            }
        );
    }

    /// A body that never ends and never sends (or sends too slowly) ends at the deadline.
    #[tokio::test]
    async fn a_stalled_body_ends_at_its_deadline() {
        let bounds = Bounds {
            deadline: Duration::from_millis(300),
            ..BOUNDS
        };
        let pending = || {
            http_body_util::StreamBody::new(futures::stream::pending::<
                Result<Frame<Bytes>, BoxError>,
            >())
        };
        let started = tokio::time::Instant::now();
        let mut svc = BoundLayer::new(bounds).layer(answering(pending));
        let res = svc
            .ready()
            .await
            .unwrap()
            .call(get("/api/v1/pods"))
            .await
            .unwrap();
        let e = res.into_body().collect().await.err().unwrap();
        assert!(matches!(find(e.as_ref()), Some(BoundError::Timeout { .. })));
        let took = started.elapsed();
        assert!(
            took >= bounds.deadline && took < bounds.deadline + Duration::from_secs(2),
            "{took:?}"
        );
    }

    /// A too-large Content-Length is refused before any body is read; a watch is not
    /// bounded (it keeps its own per-event bounds).
    #[tokio::test]
    async fn announced_lengths_and_watches() {
        let mut svc =
            BoundLayer::new(BOUNDS).layer(tower::service_fn(|_req: http::Request<()>| async {
                let mut r = http::Response::new(endless());
                r.headers_mut()
                    .insert(http::header::CONTENT_LENGTH, (1u64 << 30).into());
                Ok::<_, BoxError>(r)
            }));
        let e = svc
            .ready()
            .await
            .unwrap()
            .call(get("/api/v1/pods/p"))
            .await
            .err()
            .unwrap();
        assert!(matches!(
            find(e.as_ref()),
            Some(BoundError::TooLarge { .. })
        ));

        let mut svc = BoundLayer::new(BOUNDS).layer(answering(endless));
        let res = svc
            .ready()
            .await
            .unwrap()
            .call(get("/api/v1/pods?watch=true&resourceVersion=1"))
            .await
            .unwrap();
        let mut body = res.into_body();
        let mut read = 0usize;
        while read <= 4 * BOUNDS.max_bytes {
            read += body
                .frame()
                .await
                .unwrap()
                .unwrap()
                .into_data()
                .unwrap()
                .len();
        }
        assert!(is_watch(&"/x?labelSelector=a&watch=1".parse().unwrap()));
        assert!(!is_watch(&"/x?watchy=true".parse().unwrap()));
    }
}
