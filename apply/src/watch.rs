//! List-then-watch of one kind's **metadata**, label-selected, over all namespaces: the
//! event stream [`crate::cache::WatchCache`] keeps its stores from.
//!
//! Our own rather than kube-runtime's `watcher`, for two reasons that matter at a thousand
//! hosted clusters with nine watches each:
//! - **memory**: kube reads a watch through a `FramedRead` whose 8 KiB line buffer lives as
//!   long as the watch; 9,000 idle watches held about 70 MiB of empty buffers (heaptrack:
//!   47 % of a guest session's heap). Here a watch that is between events holds no buffer:
//!   complete lines are decoded straight from the received chunk, and only a partial line
//!   is copied, into a buffer that is released once the line completes;
//! - **bounds**: kube reads list bodies and watch lines without a limit, and a guest API
//!   server is untrusted. Here a list page and a watch line have a size bound, and crossing
//!   it is an error of its own ([`WatchError::TooLarge`]).
//!
//! The stream yields kube-runtime's [`watcher::Event`]s (`Init`, `InitApply`…, `InitDone`,
//! then `Apply`/`Delete`), resumes a watch that the server ended (its `timeoutSeconds`) from
//! the last resourceVersion seen (bookmarks included), and ends after the first error: the
//! caller lists again after a pause (410 Gone included).

use std::collections::VecDeque;

use bytes::Bytes;
use http_body_util::BodyExt;
use kube::api::{ApiResource, DynamicObject, ListParams, WatchParams};
use kube::core::{PartialObjectMeta, Request, WatchEvent};
use kube::runtime::watcher;

type Meta = PartialObjectMeta<DynamicObject>;

/// A watch the server ends sooner than this is an error (see `State::read`).
const MIN_WATCH: std::time::Duration = std::time::Duration::from_secs(1);
/// Watches in a row that may end before a quarter of their timeout.
const SHORT_WATCHES: u32 = 3;
/// Largest error body read, in bytes.
const MAX_ERROR_BYTES: usize = 64 << 10;

/// Sizes and times of a watch ([`Options::DEFAULT`] where the server is trusted,
/// [`Options::UNTRUSTED`] where it is not).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Options {
    /// Objects asked for per list page; a page with more is refused (a real server never
    /// sends more than asked, and decoding stops there).
    pub page: u32,
    /// Largest list page accepted, in bytes.
    pub max_page_bytes: usize,
    /// Pages one list may take (a server can send empty pages with a continue token).
    pub max_pages: u32,
    /// Largest watch event accepted, in bytes (one object).
    pub max_event_bytes: usize,
    /// Events decoded from one received chunk at most.
    pub max_chunk_events: usize,
    /// The server is asked to end each watch after this long; it is then resumed from the
    /// last version seen. Watches that end much sooner several times in a row are an error.
    pub timeout_s: u32,
}

impl Options {
    /// Where the server is ours to trust (the management cluster).
    pub const DEFAULT: Self = Self {
        page: 250,
        max_page_bytes: 32 << 20,
        max_pages: u32::MAX,
        // etcd itself refuses objects over 1.5 MiB.
        max_event_bytes: 4 << 20,
        max_chunk_events: 4096,
        timeout_s: 290,
    };

    /// Where the server is a tenant's (a guest): at most 64 pages of 100 objects, 8 MiB a
    /// page, 1 MiB an event (our objects' metadata are a few KiB).
    pub const UNTRUSTED: Self = Self {
        page: 100,
        max_page_bytes: 8 << 20,
        max_pages: 64,
        max_event_bytes: 1 << 20,
        max_chunk_events: 4096,
        timeout_s: 290,
    };
}

impl Default for Options {
    fn default() -> Self {
        Self::DEFAULT
    }
}

#[derive(Debug, thiserror::Error)]
pub enum WatchError {
    #[error("listing: {0}")]
    List(String),
    #[error("watching: {0}")]
    Watch(String),
    /// The server answered a list or watch with this status.
    #[error("{what}: HTTP {code}: {message}")]
    Status {
        what: &'static str,
        code: u16,
        message: String,
    },
    /// The watch's resourceVersion is too old (410 Gone): list again.
    #[error("watch expired (410 Gone)")]
    Gone,
    /// A list page or watch event crossed its size bound.
    #[error("{what} larger than {limit} bytes")]
    TooLarge { what: &'static str, limit: usize },
    /// The answer crossed the byte or time bound of the client's [`crate::bounded`] layer.
    #[error("{0}")]
    Bound(#[from] crate::bounded::BoundError),
    #[error("decoding {what}: {error}")]
    Decode {
        what: &'static str,
        error: serde_json::Error,
    },
}

impl WatchError {
    /// The server does not serve the kind (404 on the first list).
    pub fn not_served(&self) -> bool {
        matches!(
            self,
            WatchError::Status {
                what: "list",
                code: 404,
                ..
            }
        )
    }
}

enum Phase {
    /// The next list page (`None`: the first).
    List(Option<String>),
    /// A watch to open from this version.
    Watch(String),
    /// The open watch ([`State::body`]) to read on.
    Reading,
    /// After an error.
    Done,
}

struct State<T> {
    client: kube::Client,
    request: Request,
    selector: Selector,
    /// Metadata only (`PartialObjectMetadata`), or whole objects.
    metadata_only: bool,
    options: Options,
    phase: Phase,
    /// Decoded events not yet yielded.
    ready: VecDeque<watcher::Event<T>>,
    /// The open watch response and the partial line it left.
    body: Option<(kube::client::Body, Vec<u8>)>,
    /// The last resourceVersion seen on the open watch.
    version: String,
    /// When the open watch was opened.
    opened: std::time::Instant,
    /// Watches in a row that ended well before their timeout.
    short: u32,
    /// Pages of the list under way.
    pages: u32,
}

/// What a watch selects: one namespace or all, by labels and fields (`metadata.name=x`).
#[derive(Clone, Debug, Default)]
pub struct Selector {
    pub namespace: Option<String>,
    pub labels: String,
    pub fields: String,
}

impl Selector {
    /// All namespaces, by labels.
    pub fn labels(labels: &str) -> Self {
        Self {
            labels: labels.to_string(),
            ..Self::default()
        }
    }
}

/// The metadata of `resource`'s objects selected by `selector`, as list-then-watch events
/// (see the module docs).
pub fn metadata(
    client: kube::Client,
    resource: &ApiResource,
    selector: Selector,
    options: Options,
) -> impl futures::Stream<Item = Result<watcher::Event<Meta>, WatchError>> + Send + use<> {
    start(client, resource, selector, true, options)
}

/// Whole objects of `resource` selected by `selector`, as list-then-watch events.
pub fn objects(
    client: kube::Client,
    resource: &ApiResource,
    selector: Selector,
    options: Options,
) -> impl futures::Stream<Item = Result<watcher::Event<DynamicObject>, WatchError>> + Send + use<> {
    start(client, resource, selector, false, options)
}

fn start<T>(
    client: kube::Client,
    resource: &ApiResource,
    selector: Selector,
    metadata_only: bool,
    options: Options,
) -> impl futures::Stream<Item = Result<watcher::Event<T>, WatchError>> + Send + use<T>
where
    T: kube::Resource + serde::de::DeserializeOwned + Clone + Send + 'static,
{
    let state = State {
        client,
        request: Request::new(<DynamicObject as kube::Resource>::url_path(
            resource,
            selector.namespace.as_deref(),
        )),
        selector,
        metadata_only,
        options,
        phase: Phase::List(None),
        ready: VecDeque::new(),
        body: None,
        version: String::new(),
        opened: std::time::Instant::now(),
        short: 0,
        pages: 0,
    };
    futures::stream::unfold(state, |mut s| async move {
        let item = s.next().await?;
        if item.is_err() {
            s.phase = Phase::Done;
            s.body = None;
        }
        Some((item, s))
    })
}

impl<T> State<T>
where
    T: kube::Resource + serde::de::DeserializeOwned + Clone + Send + 'static,
{
    async fn next(&mut self) -> Option<Result<watcher::Event<T>, WatchError>> {
        loop {
            if let Some(ev) = self.ready.pop_front() {
                if self.ready.is_empty() {
                    // Release what a burst of events grew.
                    self.ready = VecDeque::new();
                }
                return Some(Ok(ev));
            }
            let step = match std::mem::replace(&mut self.phase, Phase::Done) {
                Phase::Done => return None,
                // Boxed: a watch spends its life reading, and this keeps the larger
                // request futures out of the idle task's size (9,000 tasks at 1,000
                // hosted clusters).
                Phase::List(token) => Box::pin(self.list_page(token)).await,
                Phase::Watch(version) => Box::pin(self.open(version)).await,
                Phase::Reading => self.read().await,
            };
            if let Err(e) = step {
                return Some(Err(e));
            }
        }
    }

    /// Called when the open watch ended: an error when it ended within [`MIN_WATCH`], or
    /// well before its timeout ([`SHORT_WATCHES`] times in a row), so a server that ends
    /// every watch (at once, or after a second) is not asked again and again without a
    /// pause: the caller pauses and lists again.
    fn ended_early(&mut self) -> Result<(), WatchError> {
        let lasted = self.opened.elapsed();
        let short = std::time::Duration::from_secs(u64::from(self.options.timeout_s) / 4);
        if lasted < MIN_WATCH {
            return Err(WatchError::Watch(format!(
                "the server ended the watch within {MIN_WATCH:?}"
            )));
        }
        if lasted < short {
            self.short += 1;
            if self.short >= SHORT_WATCHES {
                return Err(WatchError::Watch(format!(
                    "the server ended {SHORT_WATCHES} watches in a row within {short:?}"
                )));
            }
        } else {
            self.short = 0;
        }
        Ok(())
    }

    async fn list_page(&mut self, token: Option<String>) -> Result<(), WatchError> {
        let mut lp = ListParams::default()
            .labels(&self.selector.labels)
            .fields(&self.selector.fields)
            .limit(self.options.page);
        if let Some(t) = &token {
            lp = lp.continue_token(t);
        }
        let req = if self.metadata_only {
            self.request.list_metadata(&lp)
        } else {
            self.request.list(&lp)
        }
        .map_err(|e| WatchError::List(e.to_string()))?;
        let res = send(&self.client, req, "list").await?;
        let bytes = read_limited(res.into_body(), self.options.max_page_bytes, "list page").await?;
        let (metadata, items) = decode_page::<T>(&bytes, self.options.page as usize)?;
        if token.is_none() {
            self.pages = 0;
            self.ready.push_back(watcher::Event::Init);
        }
        self.pages += 1;
        self.ready
            .extend(items.into_iter().map(watcher::Event::InitApply));
        match metadata.continue_.filter(|c| !c.is_empty()) {
            Some(_) if self.pages >= self.options.max_pages => {
                return Err(WatchError::TooLarge {
                    what: "list (pages)",
                    limit: self.options.max_pages as usize,
                });
            }
            Some(next) => self.phase = Phase::List(Some(next)),
            None => {
                self.ready.push_back(watcher::Event::InitDone);
                let version = metadata.resource_version.unwrap_or_default();
                self.phase = Phase::Watch(version);
            }
        }
        Ok(())
    }

    async fn open(&mut self, version: String) -> Result<(), WatchError> {
        let wp = WatchParams::default()
            .labels(&self.selector.labels)
            .fields(&self.selector.fields)
            .timeout(self.options.timeout_s);
        let req = if self.metadata_only {
            self.request.watch_metadata(&wp, &version)
        } else {
            self.request.watch(&wp, &version)
        }
        .map_err(|e| WatchError::Watch(e.to_string()))?;
        let res = send(&self.client, req, "watch").await?;
        self.body = Some((res.into_body(), Vec::new()));
        self.opened = std::time::Instant::now();
        self.version = version;
        self.phase = Phase::Reading;
        Ok(())
    }

    /// Reads one chunk of the open watch; when the watch ends, the next step opens a new
    /// one from the last version seen.
    async fn read(&mut self) -> Result<(), WatchError> {
        let Some((body, partial)) = self.body.as_mut() else {
            self.phase = Phase::Watch(std::mem::take(&mut self.version));
            return Ok(());
        };
        let frame = match body.frame().await {
            None => None,
            Some(Ok(f)) => match f.into_data() {
                Ok(d) => Some(d),
                // Trailers: read on.
                Err(_) => {
                    self.phase = Phase::Reading;
                    return Ok(());
                }
            },
            Some(Err(e)) => {
                // A connection ended mid-watch: resume from the last version (as the
                // server's own timeout would), rather than list everything again; unless
                // it ended at once (see below).
                tracing::debug!(error = %e, "watch stream ended");
                self.body = None;
                self.ended_early()?;
                self.phase = Phase::Watch(std::mem::take(&mut self.version));
                return Ok(());
            }
        };
        let Some(chunk) = frame else {
            if self.body.take().is_some_and(|(_, p)| !p.is_empty()) {
                tracing::debug!("watch ended within an event");
            }
            self.ended_early()?;
            self.phase = Phase::Watch(std::mem::take(&mut self.version));
            return Ok(());
        };
        let mut events: Vec<WatchEvent<T>> = Vec::new();
        let most = self.options.max_chunk_events;
        split_lines(partial, chunk, self.options.max_event_bytes, |line| {
            if events.len() == most {
                return Err(WatchError::TooLarge {
                    what: "events in one chunk",
                    limit: most,
                });
            }
            events.push(decode(line)?);
            Ok(())
        })?;
        for ev in events {
            match ev {
                WatchEvent::Added(m) | WatchEvent::Modified(m) => {
                    if let Some(v) = &m.meta().resource_version {
                        self.version.clone_from(v);
                    }
                    self.ready.push_back(watcher::Event::Apply(m));
                }
                WatchEvent::Deleted(m) => {
                    if let Some(v) = &m.meta().resource_version {
                        self.version.clone_from(v);
                    }
                    self.ready.push_back(watcher::Event::Delete(m));
                }
                WatchEvent::Bookmark(b) => self.version = b.metadata.resource_version,
                WatchEvent::Error(e) if e.code == 410 => return Err(WatchError::Gone),
                WatchEvent::Error(e) => {
                    return Err(WatchError::Status {
                        what: "watch",
                        code: e.code,
                        message: e.message,
                    });
                }
            }
        }
        self.phase = Phase::Reading;
        Ok(())
    }
}

/// One page of a list (not a watch), read as the watches read theirs: `options.page` items
/// asked for and at most that many decoded (decoding stops there), at most
/// `options.max_page_bytes` bytes, `continue_` from the previous page. For reads of an
/// untrusted server outside a watch (with [`Options::UNTRUSTED`]), where kube's `Api::list`
/// would decode any number of items (a page of `{},{},…` costs far more memory than its
/// bytes).
pub async fn list_page<T>(
    client: &kube::Client,
    resource: &ApiResource,
    selector: &Selector,
    metadata_only: bool,
    options: Options,
    continue_: Option<&str>,
) -> Result<(kube::core::ListMeta, Vec<T>), WatchError>
where
    T: serde::de::DeserializeOwned,
{
    let request = Request::new(<DynamicObject as kube::Resource>::url_path(
        resource,
        selector.namespace.as_deref(),
    ));
    let mut lp = ListParams::default()
        .labels(&selector.labels)
        .fields(&selector.fields)
        .limit(options.page);
    if let Some(t) = continue_ {
        lp = lp.continue_token(t);
    }
    let req = if metadata_only {
        request.list_metadata(&lp)
    } else {
        request.list(&lp)
    }
    .map_err(|e| WatchError::List(e.to_string()))?;
    let res = send(client, req, "list").await?;
    let bytes = read_limited(res.into_body(), options.max_page_bytes, "list page").await?;
    decode_page::<T>(&bytes, options.page as usize)
}

async fn send(
    client: &kube::Client,
    mut req: http::Request<Vec<u8>>,
    what: &'static str,
) -> Result<http::Response<kube::client::Body>, WatchError> {
    req.headers_mut().insert(
        http::header::ACCEPT_ENCODING,
        http::HeaderValue::from_static("identity"),
    );
    let res = client
        .send(req.map(kube::client::Body::from))
        .await
        .map_err(|e| match (crate::bounded::find(&e), what) {
            (Some(b), _) => WatchError::Bound(b.clone()),
            (None, "list") => WatchError::List(e.to_string()),
            (None, _) => WatchError::Watch(e.to_string()),
        })?;
    let code = res.status().as_u16();
    if res.status().is_success() {
        return Ok(res);
    }
    let body = read_limited(res.into_body(), MAX_ERROR_BYTES, "error body")
        .await
        .unwrap_or_default();
    let message = serde_json::from_slice::<kube::core::Status>(&body)
        .map(|s| s.message)
        .unwrap_or_else(|_| String::from_utf8_lossy(&body).into_owned());
    if code == 410 {
        return Err(WatchError::Gone);
    }
    Err(WatchError::Status {
        what,
        code,
        message,
    })
}

/// A list page's metadata and items, refusing more than `most` items: decoding stops there,
/// so a page of many tiny items (`{},{},…`, each decoded into a whole default object) cannot
/// take far more memory than its bytes.
fn decode_page<T: serde::de::DeserializeOwned>(
    bytes: &[u8],
    most: usize,
) -> Result<(kube::core::ListMeta, Vec<T>), WatchError> {
    #[derive(serde::Deserialize)]
    struct Page<'a> {
        #[serde(default)]
        metadata: kube::core::ListMeta,
        #[serde(borrow)]
        items: Option<&'a serde_json::value::RawValue>,
    }
    struct Bounded<T>(usize, std::marker::PhantomData<T>);
    impl<'de, T: serde::Deserialize<'de>> serde::de::Visitor<'de> for Bounded<T> {
        type Value = Vec<T>;
        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            write!(f, "a list of at most {} items", self.0)
        }
        fn visit_unit<E>(self) -> Result<Vec<T>, E> {
            Ok(Vec::new())
        }
        fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Vec<T>, A::Error> {
            let mut out = Vec::new();
            while let Some(item) = seq.next_element()? {
                if out.len() == self.0 {
                    return Err(serde::de::Error::custom(format!(
                        "more than {} items in a page",
                        self.0
                    )));
                }
                out.push(item);
            }
            Ok(out)
        }
    }
    let decode_err = |error| WatchError::Decode {
        what: "list page",
        error,
    };
    let page: Page<'_> = serde_json::from_slice(bytes).map_err(decode_err)?;
    let items = match page.items {
        None => Vec::new(),
        Some(raw) => {
            let mut de = serde_json::Deserializer::from_str(raw.get());
            let items = serde::Deserializer::deserialize_any(
                &mut de,
                Bounded::<T>(most, std::marker::PhantomData),
            )
            .map_err(decode_err)?;
            de.end().map_err(decode_err)?;
            items
        }
    };
    Ok((page.metadata, items))
}

fn decode<T: serde::de::DeserializeOwned>(line: &[u8]) -> Result<WatchEvent<T>, WatchError> {
    serde_json::from_slice(line).map_err(|error| WatchError::Decode {
        what: "watch event",
        error,
    })
}

/// Calls `each` with every complete (non-empty) line of `partial` + `chunk`, leaving the
/// unfinished rest in `partial`; `partial` holds no memory once it is empty again. A line
/// longer than `max` is an error.
fn split_lines(
    partial: &mut Vec<u8>,
    chunk: Bytes,
    max: usize,
    mut each: impl FnMut(&[u8]) -> Result<(), WatchError>,
) -> Result<(), WatchError> {
    let too_large = WatchError::TooLarge {
        what: "watch event",
        limit: max,
    };
    let mut rest: &[u8] = &chunk;
    if !partial.is_empty() {
        match rest.iter().position(|b| *b == b'\n') {
            None => {
                if partial.len() + rest.len() > max {
                    return Err(too_large);
                }
                partial.extend_from_slice(rest);
                return Ok(());
            }
            Some(i) => {
                if partial.len() + i > max {
                    return Err(too_large);
                }
                partial.extend_from_slice(&rest[..i]);
                let line = std::mem::take(partial);
                if !line.trim_ascii().is_empty() {
                    each(&line)?;
                }
                rest = &rest[i + 1..];
            }
        }
    }
    while let Some(i) = rest.iter().position(|b| *b == b'\n') {
        if i > max {
            return Err(too_large);
        }
        let line = &rest[..i];
        if !line.trim_ascii().is_empty() {
            each(line)?;
        }
        rest = &rest[i + 1..];
    }
    if rest.len() > max {
        return Err(too_large);
    }
    if !rest.is_empty() {
        *partial = rest.to_vec();
    }
    Ok(())
}

/// The whole body, if it is at most `max` bytes.
async fn read_limited(
    body: kube::client::Body,
    max: usize,
    what: &'static str,
) -> Result<Bytes, WatchError> {
    let limited = http_body_util::Limited::new(body, max);
    match limited.collect().await {
        Ok(c) => Ok(c.to_bytes()),
        Err(e) if e.is::<http_body_util::LengthLimitError>() => {
            Err(WatchError::TooLarge { what, limit: max })
        }
        Err(e) => Err(match crate::bounded::find(e.as_ref()) {
            Some(b) => WatchError::Bound(b.clone()),
            None => WatchError::List(format!("reading {what}: {e}")),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines(chunks: &[&str], max: usize) -> (Result<Vec<String>, String>, usize) {
        let mut partial = Vec::new();
        let mut out = Vec::new();
        for c in chunks {
            let r = split_lines(&mut partial, Bytes::from(c.to_string()), max, |l| {
                out.push(String::from_utf8_lossy(l).into_owned());
                Ok(())
            });
            if let Err(e) = r {
                return (Err(e.to_string()), partial.capacity());
            }
        }
        (Ok(out), partial.capacity())
    }

    #[test]
    fn lines_are_split_across_chunks_and_the_buffer_is_released() {
        let (got, held) = lines(&["{\"a\":1}\n{\"b\"", ":2}\n\n{\"c\":3}\n"], 100);
        assert_eq!(got.unwrap(), ["{\"a\":1}", "{\"b\":2}", "{\"c\":3}"]);
        assert_eq!(held, 0, "no buffer is kept between events");
        let (got, held) = lines(&["{\"a\"", ":1}"], 100);
        assert_eq!(got.unwrap(), Vec::<String>::new());
        assert!(held > 0, "an unfinished line is kept");
    }

    #[test]
    fn a_line_over_the_bound_is_refused_whole_or_in_pieces() {
        let long = "x".repeat(50);
        for chunks in [
            vec![long.as_str()],
            vec![&long[..30], &long[30..]],
            vec![&long[..30], "xxxxxxxxxxxxxxxx\n"],
        ] {
            let (got, _) = lines(&chunks, 40);
            assert!(
                got.as_ref().is_err_and(|e| e.contains("larger than 40")),
                "{chunks:?}: {got:?}"
            );
        }
        let (got, _) = lines(&[&long[..40], "\n"], 40);
        assert_eq!(got.unwrap().len(), 1, "exactly the bound is accepted");
    }

    /// Every watch is a task for the life of its cache (9,000 at 1,000 hosted clusters):
    /// the stream stays small while it waits for the next chunk (the request futures are
    /// boxed only while they run): 528 bytes, against 1,792 before they were boxed.
    #[tokio::test]
    async fn an_idle_watch_stream_is_small() {
        let config = kube::Config::new("http://127.0.0.1:1".parse().unwrap());
        let client = kube::Client::try_from(config).unwrap();
        let r = ApiResource::erase::<k8s_openapi::api::core::v1::ConfigMap>(&());
        let s = metadata(client, &r, Selector::labels("a=b"), Options::default());
        assert!(
            std::mem::size_of_val(&s) <= 640,
            "{}",
            std::mem::size_of_val(&s)
        );
    }

    /// A hostile server (a stand-in: a real API server does not do this) that answers the
    /// list and then ends every watch at once: the stream reports an error instead of
    /// asking again at once for ever.
    #[tokio::test]
    async fn a_server_that_ends_every_watch_at_once_is_an_error() {
        use futures::StreamExt;
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let watches = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counted = watches.clone();
        tokio::spawn(async move {
            loop {
                let Ok((mut sock, _)) = listener.accept().await else {
                    return;
                };
                let counted = counted.clone();
                tokio::spawn(async move {
                    let mut buf = vec![0u8; 8192];
                    loop {
                        let Ok(n) = sock.read(&mut buf).await else {
                            return;
                        };
                        if n == 0 {
                            return;
                        }
                        let head = String::from_utf8_lossy(&buf[..n]).to_string();
                        let body = if head.contains("watch=true") {
                            counted.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                            String::new()
                        } else {
                            r#"{"apiVersion":"v1","kind":"List","metadata":{"resourceVersion":"5"},"items":[]}"#.to_string()
                        };
                        let reply = format!(
                            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
                            body.len()
                        );
                        if sock.write_all(reply.as_bytes()).await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
        let config = kube::Config::new(format!("http://{addr}").parse().unwrap());
        let client = kube::Client::try_from(config).unwrap();
        let r = ApiResource::erase::<k8s_openapi::api::core::v1::ConfigMap>(&());
        let s = metadata(client, &r, Selector::labels("a=b"), Options::default());
        futures::pin_mut!(s);
        let mut seen = Vec::new();
        let until = tokio::time::Instant::now() + std::time::Duration::from_secs(5);
        while let Ok(Some(ev)) = tokio::time::timeout_at(until, s.next()).await {
            let err = ev.is_err();
            seen.push(ev.map(|_| ()).map_err(|e| e.to_string()));
            if err {
                break;
            }
        }
        assert!(
            seen.last()
                .is_some_and(|e| e.as_ref().is_err_and(|e| e.contains("ended the watch"))),
            "{seen:?}"
        );
        assert_eq!(watches.load(std::sync::atomic::Ordering::Relaxed), 1);
    }

    /// A page with more items than asked for is refused while decoding (a page of `{}`s
    /// would otherwise become that many whole default objects).
    #[test]
    fn a_page_with_more_items_than_asked_is_refused() {
        let page = |n: usize| {
            let items = vec!["{}"; n].join(",");
            format!(r#"{{"metadata":{{"resourceVersion":"7","continue":"c"}},"items":[{items}]}}"#)
        };
        let (meta, items) = decode_page::<Meta>(page(3).as_bytes(), 3).unwrap();
        assert_eq!(
            (meta.resource_version.as_deref(), items.len()),
            (Some("7"), 3)
        );
        assert_eq!(meta.continue_.as_deref(), Some("c"));
        let e = decode_page::<Meta>(page(4).as_bytes(), 3).unwrap_err();
        assert!(e.to_string().contains("more than 3 items"), "{e}");
        let (_, none) = decode_page::<Meta>(br#"{"metadata":{},"items":null}"#, 3).unwrap();
        assert!(none.is_empty());
    }
}
