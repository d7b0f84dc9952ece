//! A minimal in-process stand-in for many guest API servers, for the controller benchmark
//! only (`hcp-olm-bench-controller`) when the machine cannot hold one real kube-apiserver
//! per hosted cluster.
//!
//! It is NOT a Kubernetes API server. It speaks the small REST subset the controller uses
//! against a guest, over HTTPS on loopback with client-certificate authentication (its own
//! CA; the kubeconfig carries inline material only, as the controller requires of guest
//! kubeconfigs), one virtual guest per path prefix `/guests/<i>`:
//! - GET of one object (404 `Status` when absent) and of collections, with equality
//!   `labelSelector`s and an optional namespace; metadata only where the client asks for
//!   `PartialObjectMetadata`;
//! - PATCH (server-side apply and JSON merge patch), POST, PUT, DELETE;
//! - WATCH of collections (`?watch=true`), as the controller's guest caches use it: events
//!   after the `resourceVersion` asked for, from a history of the last
//!   [`WATCH_HISTORY`] writes per guest (older: an `ERROR` event with a 410 `Status`, so
//!   the client lists again, as a kube-apiserver answers "too old resource version"),
//!   ended after `timeoutSeconds`; watches are counted apart from other requests, as the
//!   benchmark leaves a real API server's WATCH verb out;
//! - HTTP/2 (ALPN `h2`) and HTTP/1.1;
//! - the guest OLM CRDs, read-only and shared by every guest (parsed from the fixture files).
//!
//! An applied object is stored as sent, plus `uid`, `resourceVersion`, `creationTimestamp`,
//! `generation` and, for server-side apply, a `managedFields` entry of the applying field
//! manager built from the applied object (maps by field, lists owned whole: close enough to
//! the real fieldsV1 for the controller's "is this object already as desired" check, which
//! reads only its own manager's fields); there is no validation, defaulting or admission,
//! and no second manager's fields. A stored Deployment reports itself rolled out
//! (`status` with every replica ready at its generation): the stand-in also stands in for
//! the guest's deployment controller and kubelets, so "converged" can mean Available as it
//! does on a real cluster with running pods. Every write is
//! counted per guest, so the benchmark can count guest writes as the real API server's
//! `apiserver_request_total` would.

use std::collections::{BTreeMap, HashMap};
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use http::{Method, Request, Response, StatusCode};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Bytes, Frame, Incoming};
use serde_json::{Value, json};

type Key = (String, String, Option<String>, String); // group, plural, namespace, name
type Body = BoxBody<Bytes, Infallible>;

/// Writes per guest a watch can resume after (see the module docs).
pub const WATCH_HISTORY: usize = 256;

/// One change, as a watch reports it.
struct Change {
    rv: u64,
    key: Key,
    kind: &'static str,
    object: Value,
    /// The object before a MODIFIED change (a watch with a label selector sees an object
    /// that stops matching as DELETED, one that starts matching as ADDED).
    before: Option<Value>,
}

impl Change {
    /// The event type a watch selecting `matches` sees for this change, if any.
    fn seen_as(&self, matches: impl Fn(&Key, &Value) -> bool) -> Option<&'static str> {
        let now = matches(&self.key, &self.object);
        let was = self.before.as_ref().is_some_and(|b| matches(&self.key, b));
        match (self.kind, was, now) {
            ("MODIFIED", true, true) => Some("MODIFIED"),
            ("MODIFIED", false, true) => Some("ADDED"),
            ("MODIFIED", true, false) => Some("DELETED"),
            ("MODIFIED", false, false) => None,
            (kind, _, true) => Some(kind),
            _ => None,
        }
    }
}

struct Guest {
    objects: Mutex<BTreeMap<Key, Value>>,
    /// The last [`WATCH_HISTORY`] changes (written under the `objects` lock, so in
    /// resourceVersion order), and the newest resourceVersion no longer in it.
    history: Mutex<(std::collections::VecDeque<Arc<Change>>, u64)>,
    changes: tokio::sync::broadcast::Sender<Arc<Change>>,
    writes: AtomicU64,
    /// Writes by `plural[/subresource]`.
    by_resource: Mutex<BTreeMap<String, u64>>,
}

impl Default for Guest {
    fn default() -> Self {
        Self {
            objects: Mutex::default(),
            history: Mutex::default(),
            changes: tokio::sync::broadcast::channel(WATCH_HISTORY).0,
            writes: AtomicU64::new(0),
            by_resource: Mutex::default(),
        }
    }
}

impl Guest {
    /// Records a change for watches; called with the `objects` lock held.
    fn publish(&self, rv: u64, key: Key, kind: &'static str, object: Value, before: Option<Value>) {
        let change = Arc::new(Change {
            rv,
            key,
            kind,
            object,
            before,
        });
        {
            let mut h = self.history.lock().unwrap_or_else(|e| e.into_inner());
            h.0.push_back(change.clone());
            while h.0.len() > WATCH_HISTORY {
                if let Some(old) = h.0.pop_front() {
                    h.1 = old.rv;
                }
            }
        }
        // No receiver: nobody watches.
        let _ = self.changes.send(change);
    }

    fn wrote(&self, p: &Path) {
        self.writes.fetch_add(1, Ordering::Relaxed);
        let key = match &p.subresource {
            Some(sub) => format!("{}/{sub}", p.plural),
            None => p.plural.clone(),
        };
        *self
            .by_resource
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(key)
            .or_default() += 1;
    }
}

struct Shared {
    guests: Vec<Arc<Guest>>,
    crds: HashMap<String, Value>,
    next_rv: AtomicU64,
    requests: AtomicU64,
    watches: AtomicU64,
}

/// A running stand-in serving `count` virtual guests.
pub struct GuestStandIn {
    shared: Arc<Shared>,
    addr: SocketAddr,
    task: tokio::task::JoinHandle<()>,
    /// CA certificate (PEM) the server certificate chains to.
    ca_pem: String,
    /// The client certificate every guest kubeconfig carries.
    client: crate::pki::KeyedCert,
}

impl Drop for GuestStandIn {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl GuestStandIn {
    /// Binds 127.0.0.1 on a free port and serves `count` guests that all "serve" the given
    /// CRDs (JSON objects, e.g. parsed from `fixtures/crds`).
    pub async fn start(count: usize, crds: Vec<Value>) -> std::io::Result<Self> {
        use rustls::pki_types::pem::PemObject;
        use rustls::pki_types::{CertificateDer, PrivateKeyDer};
        let io = |e: String| std::io::Error::other(e);
        let ca = crate::pki::Ca::new("hcp-olm guest stand-in CA").map_err(|e| io(e.to_string()))?;
        let server = ca
            .issue(
                "guest-standin",
                &[],
                &["127.0.0.1"],
                crate::pki::Usage::Server,
            )
            .map_err(|e| io(e.to_string()))?;
        let client = ca
            .issue(
                "system:admin",
                &["system:masters"],
                &[],
                crate::pki::Usage::Client,
            )
            .map_err(|e| io(e.to_string()))?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut roots = rustls::RootCertStore::empty();
        roots
            .add(
                CertificateDer::from_pem_slice(ca.cert_pem().as_bytes())
                    .map_err(|e| io(e.to_string()))?,
            )
            .map_err(|e| io(e.to_string()))?;
        let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
            Arc::new(roots),
            provider.clone(),
        )
        .build()
        .map_err(|e| io(e.to_string()))?;
        let mut config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| io(e.to_string()))?
            .with_client_cert_verifier(verifier)
            .with_single_cert(
                vec![
                    CertificateDer::from_pem_slice(server.cert_pem.as_bytes())
                        .map_err(|e| io(e.to_string()))?,
                ],
                PrivateKeyDer::from_pem_slice(server.key_pem.as_bytes())
                    .map_err(|e| io(e.to_string()))?,
            )
            .map_err(|e| io(e.to_string()))?;
        config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", 0)).await?;
        let addr = listener.local_addr()?;
        let shared = Arc::new(Shared {
            guests: (0..count).map(|_| Arc::new(Guest::default())).collect(),
            crds: crds
                .into_iter()
                .filter_map(|c| Some((c["metadata"]["name"].as_str()?.to_string(), c)))
                .collect(),
            next_rv: AtomicU64::new(1),
            requests: AtomicU64::new(0),
            watches: AtomicU64::new(0),
        });
        let s = shared.clone();
        let task = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                let s = s.clone();
                let acceptor = acceptor.clone();
                tokio::spawn(async move {
                    // Client-certificate authentication happens in the handshake.
                    let Ok(stream) = acceptor.accept(stream).await else {
                        return;
                    };
                    let svc = hyper::service::service_fn(move |req| {
                        let s = s.clone();
                        async move { Ok::<_, Infallible>(handle(&s, req).await) }
                    });
                    let _ = hyper_util::server::conn::auto::Builder::new(
                        hyper_util::rt::TokioExecutor::new(),
                    )
                    .serve_connection(hyper_util::rt::TokioIo::new(stream), svc)
                    .await;
                });
            }
        });
        Ok(Self {
            shared,
            addr,
            task,
            ca_pem: ca.cert_pem().to_string(),
            client,
        })
    }

    /// The server URL of guest `i` (for a kubeconfig).
    pub fn url(&self, i: usize) -> String {
        format!("https://{}/guests/{i}", self.addr)
    }

    /// A kubeconfig for guest `i`: HTTPS, the stand-in's CA and a client certificate, all
    /// inline.
    pub fn kubeconfig(&self, i: usize) -> String {
        use base64::Engine as _;
        let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
        let doc = json!({
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "guest", "cluster": {
                "server": self.url(i),
                "certificate-authority-data": b64(&self.ca_pem),
            }}],
            "users": [{"name": "admin", "user": {
                "client-certificate-data": b64(&self.client.cert_pem),
                "client-key-data": b64(&self.client.key_pem),
            }}],
            "contexts": [{"name": "guest", "context": {"cluster": "guest", "user": "admin"}}],
            "current-context": "guest",
        });
        serde_yaml_ng::to_string(&doc).expect("a JSON value always serializes to YAML")
    }

    /// Writes (POST, PUT, PATCH, DELETE) guest `i` has received.
    pub fn writes(&self, i: usize) -> u64 {
        self.shared.guests[i].writes.load(Ordering::Relaxed)
    }

    /// Writes over all guests.
    pub fn total_writes(&self) -> u64 {
        self.shared
            .guests
            .iter()
            .map(|g| g.writes.load(Ordering::Relaxed))
            .sum()
    }

    /// Writes over all guests by `plural[/subresource]`.
    pub fn writes_by_resource(&self) -> BTreeMap<String, u64> {
        let mut out = BTreeMap::new();
        for g in &self.shared.guests {
            for (k, v) in g
                .by_resource
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .iter()
            {
                *out.entry(k.clone()).or_default() += v;
            }
        }
        out
    }

    /// Requests of any verb but WATCH over all guests.
    pub fn total_requests(&self) -> u64 {
        self.shared.requests.load(Ordering::Relaxed)
    }

    /// WATCH requests over all guests.
    pub fn total_watches(&self) -> u64 {
        self.shared.watches.load(Ordering::Relaxed)
    }

    /// The object guest `i` holds, as stored.
    pub fn get(
        &self,
        i: usize,
        group: &str,
        plural: &str,
        ns: Option<&str>,
        name: &str,
    ) -> Option<Value> {
        let key = (
            group.to_string(),
            plural.to_string(),
            ns.map(str::to_string),
            name.to_string(),
        );
        self.shared.guests[i]
            .objects
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&key)
            .cloned()
    }

    /// Whether guest `i` holds the object.
    pub fn has(&self, i: usize, group: &str, plural: &str, ns: Option<&str>, name: &str) -> bool {
        let key = (
            group.to_string(),
            plural.to_string(),
            ns.map(str::to_string),
            name.to_string(),
        );
        self.shared.guests[i]
            .objects
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .contains_key(&key)
    }
}

/// What a deployment controller and kubelets running every pod would report (see the
/// module docs).
fn rolled_out(d: &mut Value) {
    let replicas = d["spec"]["replicas"].as_i64().unwrap_or(1);
    let generation = d["metadata"]["generation"].clone();
    d["status"] = json!({
        "observedGeneration": generation,
        "replicas": replicas,
        "updatedReplicas": replicas,
        "readyReplicas": replicas,
        "availableReplicas": replicas,
        "conditions": [{"type": "Available", "status": "True", "reason": "MinimumReplicasAvailable"}],
    });
}

fn reply(code: StatusCode, body: &Value) -> Response<Body> {
    Response::builder()
        .status(code)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body.to_string())).boxed())
        .expect("static response parts are valid")
}

fn status(code: StatusCode, reason: &str, message: String) -> Response<Body> {
    reply(
        code,
        &json!({
            "apiVersion": "v1", "kind": "Status", "metadata": {},
            "status": if code.is_success() { "Success" } else { "Failure" },
            "message": message, "reason": reason, "code": code.as_u16(),
        }),
    )
}

struct Path {
    guest: usize,
    group: String,
    plural: String,
    namespace: Option<String>,
    name: Option<String>,
    subresource: Option<String>,
}

fn parse_path(path: &str) -> Option<Path> {
    let mut segs = path.trim_matches('/').split('/');
    if segs.next()? != "guests" {
        return None;
    }
    let guest = segs.next()?.parse().ok()?;
    let segs: Vec<&str> = segs.collect();
    let rest = match segs.as_slice() {
        ["api", "v1", rest @ ..] => ("", rest),
        ["apis", group, _version, rest @ ..] => (*group, rest),
        _ => return None,
    };
    let (group, rest) = rest;
    let (namespace, rest) = match rest {
        ["namespaces", ns, more @ ..] if !more.is_empty() => (Some(ns.to_string()), more),
        other => (None, other),
    };
    let (plural, name, subresource) = match rest {
        [plural] => (plural.to_string(), None, None),
        [plural, name] => (plural.to_string(), Some(name.to_string()), None),
        [plural, name, sub] => (
            plural.to_string(),
            Some(name.to_string()),
            Some(sub.to_string()),
        ),
        _ => return None,
    };
    Some(Path {
        guest,
        group: group.to_string(),
        plural,
        namespace,
        name,
        subresource,
    })
}

/// One term of a label or field selector, as far as the stand-in understands them.
#[derive(Debug, PartialEq, Eq)]
enum Term {
    /// `key=value`
    Label(String, String),
    /// `!key`
    NoLabel(String),
    /// `metadata.name=value` (field selector)
    Name(String),
}

fn selector_matches(selector: &[Term], obj: &Value) -> bool {
    let labels = &obj["metadata"]["labels"];
    selector.iter().all(|t| match t {
        Term::Label(k, v) => labels[k.as_str()].as_str().is_some_and(|l| l == v),
        Term::NoLabel(k) => labels.get(k.as_str()).is_none(),
        Term::Name(n) => obj["metadata"]["name"].as_str() == Some(n.as_str()),
    })
}

/// The `fieldManager` query parameter.
fn field_manager(query: Option<&str>) -> Option<String> {
    query
        .unwrap_or_default()
        .split('&')
        .find_map(|kv| kv.strip_prefix("fieldManager="))
        .map(|v| v.replace("%3A", ":"))
}

/// A fieldsV1 set for everything in `v`: maps by field, lists and scalars as leaves. At the
/// top the object's identity (apiVersion, kind, metadata name/namespace) is left out, as the
/// API server does.
fn fields_of(v: &Value, top: bool) -> Value {
    let Value::Object(m) = v else {
        return json!({});
    };
    let mut out = serde_json::Map::new();
    for (k, child) in m {
        if top && (k == "apiVersion" || k == "kind") {
            continue;
        }
        let sub = if top && k == "metadata" {
            let mut meta = child.clone();
            if let Some(o) = meta.as_object_mut() {
                for id in [
                    "name",
                    "namespace",
                    "uid",
                    "resourceVersion",
                    "generation",
                    "creationTimestamp",
                    "managedFields",
                ] {
                    o.remove(id);
                }
            }
            fields_of(&meta, false)
        } else {
            fields_of(child, false)
        };
        out.insert(format!("f:{k}"), sub);
    }
    Value::Object(out)
}

/// The `labelSelector` (`k=v`, `k==v`, `!k`) and `fieldSelector` (`metadata.name=x`) terms
/// of a query. Other terms are not understood: set-based ones are ignored (everything
/// matches them), and `k!=v` reads as a label `k!` (nothing matches it).
fn selector_terms(query: Option<&str>) -> Vec<Term> {
    let mut out = Vec::new();
    for pair in query.unwrap_or_default().split('&') {
        let Some((which, v)) = pair.split_once('=') else {
            continue;
        };
        let v = percent_decode(v);
        for term in v.split(',').filter(|t| !t.is_empty()) {
            match (which, term.split_once('=')) {
                ("labelSelector", Some((k, val))) => out.push(Term::Label(
                    k.trim_end_matches('=').to_string(),
                    val.trim_start_matches('=').to_string(),
                )),
                ("labelSelector", None) => {
                    if let Some(k) = term.strip_prefix('!') {
                        out.push(Term::NoLabel(k.to_string()));
                    }
                }
                ("fieldSelector", Some((f, val))) if f.trim_end_matches('=') == "metadata.name" => {
                    out.push(Term::Name(val.trim_start_matches('=').to_string()));
                }
                _ => {}
            }
        }
    }
    out
}

fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'%' if i + 2 < b.len() => {
                match std::str::from_utf8(&b[i + 1..i + 3])
                    .ok()
                    .and_then(|h| u8::from_str_radix(h, 16).ok())
                {
                    Some(v) => {
                        out.push(v);
                        i += 3;
                    }
                    None => {
                        out.push(b'%');
                        i += 1;
                    }
                }
            }
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            c => {
                out.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn merge_patch(target: &mut Value, patch: &Value) {
    match (target, patch) {
        (Value::Object(t), Value::Object(p)) => {
            for (k, v) in p {
                if v.is_null() {
                    t.remove(k);
                } else {
                    merge_patch(t.entry(k.clone()).or_insert(Value::Null), v);
                }
            }
        }
        (t, p) => *t = p.clone(),
    }
}

/// A query parameter's (undecoded) value.
fn query_param<'a>(query: Option<&'a str>, name: &str) -> Option<&'a str> {
    query
        .unwrap_or_default()
        .split('&')
        .find_map(|kv| kv.strip_prefix(name)?.strip_prefix('='))
}

/// `object` as a response shows it: whole, or its metadata only.
fn shown(object: &Value, metadata_only: bool) -> Value {
    if metadata_only {
        json!({"apiVersion": "meta.k8s.io/v1", "kind": "PartialObjectMetadata",
               "metadata": object["metadata"]})
    } else {
        object.clone()
    }
}

fn event_line(kind: &str, object: &Value) -> Bytes {
    let mut line = json!({"type": kind, "object": object}).to_string();
    line.push('\n');
    Bytes::from(line)
}

/// A WATCH of the collection `p` (see the module docs).
fn watch(
    s: &Shared,
    guest: &Arc<Guest>,
    p: Path,
    query: Option<&str>,
    metadata_only: bool,
) -> Response<Body> {
    s.watches.fetch_add(1, Ordering::Relaxed);
    let sel = selector_terms(query);
    let since: u64 = query_param(query, "resourceVersion")
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let timeout = std::time::Duration::from_secs(
        query_param(query, "timeoutSeconds")
            .and_then(|v| v.parse().ok())
            .unwrap_or(1800),
    );
    let matches = move |key: &Key, object: &Value| {
        key.0 == p.group
            && key.1 == p.plural
            && (p.namespace.is_none() || key.2 == p.namespace)
            && selector_matches(&sel, object)
    };
    // Under the objects lock: no write between the history read and the subscription.
    let (backlog, expired, mut live) = {
        let objects = guest.objects.lock().unwrap_or_else(|e| e.into_inner());
        let history = guest.history.lock().unwrap_or_else(|e| e.into_inner());
        if since == 0 {
            let all = objects
                .iter()
                .filter(|(k, o)| matches(k, o))
                .map(|(_, o)| event_line("ADDED", &shown(o, metadata_only)))
                .collect();
            (all, false, guest.changes.subscribe())
        } else if since < history.1 {
            let gone = json!({"apiVersion": "v1", "kind": "Status", "metadata": {}, "status": "Failure",
                "message": format!("too old resource version: {since} ({})", history.1),
                "reason": "Expired", "code": 410});
            (
                vec![event_line("ERROR", &gone)],
                true,
                guest.changes.subscribe(),
            )
        } else {
            let newer = history
                .0
                .iter()
                .filter(|c| c.rv > since)
                .filter_map(|c| {
                    Some(event_line(
                        c.seen_as(&matches)?,
                        &shown(&c.object, metadata_only),
                    ))
                })
                .collect();
            (newer, false, guest.changes.subscribe())
        }
    };
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Frame<Bytes>, Infallible>>(64);
    tokio::spawn(async move {
        for line in backlog {
            if tx.send(Ok(Frame::data(line))).await.is_err() {
                return;
            }
        }
        if expired {
            return;
        }
        let until = tokio::time::Instant::now() + timeout;
        loop {
            let change = tokio::select! {
                c = live.recv() => c,
                () = tokio::time::sleep_until(until) => return,
                () = tx.closed() => return,
            };
            // Lagged: end the watch; the client resumes from its last resourceVersion.
            let Ok(c) = change else { return };
            if c.rv > since
                && let Some(kind) = c.seen_as(&matches)
                && tx
                    .send(Ok(Frame::data(event_line(
                        kind,
                        &shown(&c.object, metadata_only),
                    ))))
                    .await
                    .is_err()
            {
                return;
            }
        }
    });
    let body = StreamBody::new(futures::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|f| (f, rx))
    }));
    Response::builder()
        .status(StatusCode::OK)
        .header("content-type", "application/json")
        .body(BodyExt::boxed(body))
        .expect("static response parts are valid")
}

async fn handle(s: &Shared, req: Request<Incoming>) -> Response<Body> {
    let method = req.method().clone();
    let uri = req.uri().clone();
    let watching =
        method == Method::GET && matches!(query_param(uri.query(), "watch"), Some("true" | "1"));
    if !watching {
        s.requests.fetch_add(1, Ordering::Relaxed);
    }
    // A metadata-only list or watch (kube's `list_metadata`, `PartialObjectMeta` watches):
    // answered with each object's metadata only, as a kube-apiserver does.
    let metadata_only = req
        .headers()
        .get("accept")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|a| a.contains("as=PartialObjectMetadata"));
    let content_type = req
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_string();
    let Some(p) = parse_path(uri.path()) else {
        return status(
            StatusCode::NOT_FOUND,
            "NotFound",
            format!("the stand-in does not serve {}", uri.path()),
        );
    };
    let Some(guest) = s.guests.get(p.guest) else {
        return status(StatusCode::NOT_FOUND, "NotFound", "no such guest".into());
    };
    if watching {
        if p.name.is_some() {
            return status(
                StatusCode::METHOD_NOT_ALLOWED,
                "MethodNotAllowed",
                "the stand-in watches collections only".into(),
            );
        }
        return watch(s, guest, p, uri.query(), metadata_only);
    }
    let body = match req.into_body().collect().await {
        Ok(b) => b.to_bytes(),
        Err(e) => return status(StatusCode::BAD_REQUEST, "BadRequest", e.to_string()),
    };

    // The OLM CRDs: served read-only, the same for every guest.
    if p.group == "apiextensions.k8s.io" && p.plural == "customresourcedefinitions" {
        return match (&method, &p.name) {
            (&Method::GET, Some(n)) => match s.crds.get(n) {
                Some(c) => reply(StatusCode::OK, c),
                None => status(StatusCode::NOT_FOUND, "NotFound", format!("crd {n}")),
            },
            (&Method::GET, None) => {
                let sel = selector_terms(uri.query());
                let items: Vec<Value> = s
                    .crds
                    .values()
                    .filter(|c| selector_matches(&sel, c))
                    .map(|c| shown(c, metadata_only))
                    .collect();
                reply(
                    StatusCode::OK,
                    &json!({"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinitionList",
                            "metadata": {}, "items": items}),
                )
            }
            _ => status(
                StatusCode::METHOD_NOT_ALLOWED,
                "MethodNotAllowed",
                "CRDs are read-only in the stand-in".into(),
            ),
        };
    }

    let mut objects = guest.objects.lock().unwrap_or_else(|e| e.into_inner());
    let key = |name: &str| -> Key {
        (
            p.group.clone(),
            p.plural.clone(),
            p.namespace.clone(),
            name.to_string(),
        )
    };
    let not_found = |name: &str| {
        status(
            StatusCode::NOT_FOUND,
            "NotFound",
            format!("{} \"{name}\" not found", p.plural),
        )
    };
    match (method, p.name.as_deref()) {
        (Method::GET, Some(name)) => match objects.get(&key(name)) {
            Some(o) => reply(StatusCode::OK, o),
            None => not_found(name),
        },
        (Method::GET, None) => {
            let sel = selector_terms(uri.query());
            let items: Vec<Value> = objects
                .iter()
                .filter(|((g, pl, ns, _), _)| {
                    *g == p.group
                        && *pl == p.plural
                        && (p.namespace.is_none() || *ns == p.namespace)
                })
                .map(|(_, o)| o)
                .filter(|o| selector_matches(&sel, o))
                .map(|o| shown(o, metadata_only))
                .collect();
            // The last resourceVersion given out: this guest's writes take theirs under
            // the lock held here, so every one up to it is in this list.
            let rv = (s.next_rv.load(Ordering::Relaxed) - 1).to_string();
            reply(
                StatusCode::OK,
                &json!({"apiVersion": "v1", "kind": "List", "metadata": {"resourceVersion": rv}, "items": items}),
            )
        }
        (Method::DELETE, Some(name)) => match objects.remove(&key(name)) {
            Some(mut gone) => {
                let rv = s.next_rv.fetch_add(1, Ordering::Relaxed);
                gone["metadata"]["resourceVersion"] = rv.to_string().into();
                guest.publish(rv, key(name), "DELETED", gone, None);
                guest.wrote(&p);
                status(StatusCode::OK, "", format!("deleted {name}"))
            }
            None => not_found(name),
        },
        (m @ (Method::PATCH | Method::PUT | Method::POST), name) => {
            let incoming: Value = match serde_json::from_slice(&body) {
                Ok(v) => v,
                Err(e) => {
                    return status(
                        StatusCode::BAD_REQUEST,
                        "BadRequest",
                        format!("the stand-in takes JSON bodies: {e}"),
                    );
                }
            };
            let name = match name {
                Some(n) => n.to_string(),
                None => match incoming["metadata"]["name"].as_str() {
                    Some(n) => n.to_string(),
                    None => return status(StatusCode::BAD_REQUEST, "BadRequest", "no name".into()),
                },
            };
            let k = key(&name);
            let old = objects.get(&k).cloned();
            let mut new = match (&m, &old) {
                (&Method::POST, Some(_)) => {
                    return status(
                        StatusCode::CONFLICT,
                        "AlreadyExists",
                        format!("{} \"{name}\" already exists", p.plural),
                    );
                }
                (&Method::PATCH, Some(o)) if !content_type.contains("apply-patch") => {
                    let mut o = o.clone();
                    merge_patch(&mut o, &incoming);
                    o
                }
                (&Method::PATCH, None) if !content_type.contains("apply-patch") => {
                    return not_found(&name);
                }
                (&Method::PUT, None) => return not_found(&name),
                _ => incoming,
            };
            let uid = old
                .as_ref()
                .and_then(|o| o["metadata"]["uid"].as_str().map(str::to_string))
                .unwrap_or_else(|| {
                    format!("standin-{}-{}", p.guest, s.next_rv.load(Ordering::Relaxed))
                });
            let generation = old
                .as_ref()
                .and_then(|o| o["metadata"]["generation"].as_i64())
                .unwrap_or(0)
                + 1;
            let created = old
                .as_ref()
                .and_then(|o| {
                    o["metadata"]["creationTimestamp"]
                        .as_str()
                        .map(str::to_string)
                })
                .unwrap_or_else(|| "2026-01-01T00:00:00Z".to_string());
            let rv_n = s.next_rv.fetch_add(1, Ordering::Relaxed);
            let rv = rv_n.to_string();
            let applied_by = content_type
                .contains("apply-patch")
                .then(|| field_manager(uri.query()))
                .flatten();
            let fields = applied_by.as_ref().map(|_| fields_of(&new, true));
            let api_version = new["apiVersion"].clone();
            if let Some(meta) = new["metadata"].as_object_mut() {
                if let (Some(manager), Some(fields)) = (applied_by, fields) {
                    meta.insert(
                        "managedFields".into(),
                        json!([{
                            "manager": manager,
                            "operation": "Apply",
                            "apiVersion": api_version,
                            "fieldsType": "FieldsV1",
                            "fieldsV1": fields,
                        }]),
                    );
                }
                meta.insert("uid".into(), uid.into());
                meta.insert("resourceVersion".into(), rv.into());
                meta.insert("generation".into(), generation.into());
                meta.insert("creationTimestamp".into(), created.into());
                if let Some(ns) = &p.namespace {
                    meta.insert("namespace".into(), ns.clone().into());
                }
            }
            if p.group == "apps" && p.plural == "deployments" {
                rolled_out(&mut new);
            }
            objects.insert(k.clone(), new.clone());
            let kind = if old.is_some() { "MODIFIED" } else { "ADDED" };
            guest.publish(rv_n, k, kind, new.clone(), old.clone());
            guest.wrote(&p);
            let code = if old.is_some() {
                StatusCode::OK
            } else {
                StatusCode::CREATED
            };
            reply(code, &new)
        }
        (m, _) => status(
            StatusCode::METHOD_NOT_ALLOWED,
            "MethodNotAllowed",
            format!("{m} is not served by the stand-in"),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_paths_and_selectors() {
        let p = parse_path("/guests/7/api/v1/namespaces/default/endpoints/packageserver").unwrap();
        assert_eq!(
            (p.guest, p.group.as_str(), p.plural.as_str()),
            (7, "", "endpoints")
        );
        assert_eq!(p.namespace.as_deref(), Some("default"));
        assert_eq!(p.name.as_deref(), Some("packageserver"));
        let p = parse_path("/guests/0/api/v1/namespaces/openshift-marketplace").unwrap();
        assert_eq!(
            (p.plural.as_str(), p.namespace, p.name.as_deref()),
            ("namespaces", None, Some("openshift-marketplace"))
        );
        let p = parse_path("/guests/1/apis/apiregistration.k8s.io/v1/apiservices").unwrap();
        assert_eq!((p.group.as_str(), p.name), ("apiregistration.k8s.io", None));
        assert_eq!(
            selector_terms(Some("labelSelector=a%3Db%2Cc%3Dd&limit=5")),
            [
                Term::Label("a".into(), "b".into()),
                Term::Label("c".into(), "d".into())
            ]
        );
        assert_eq!(
            selector_terms(Some(
                "labelSelector=%21olm.copiedFrom&fieldSelector=metadata.name%3Dx&limit=5"
            )),
            [
                Term::NoLabel("olm.copiedFrom".into()),
                Term::Name("x".into())
            ]
        );
    }

    async fn client_of(standin: &GuestStandIn, i: usize) -> kube::Client {
        let kc = kube::config::Kubeconfig::from_yaml(&standin.kubeconfig(i)).unwrap();
        let config = kube::Config::from_custom_kubeconfig(kc, &Default::default())
            .await
            .unwrap();
        kube::Client::try_from(config).unwrap()
    }

    /// Server-side applies ConfigMap `name` labelled `app=label`.
    async fn put(api: &kube::Api<k8s_openapi::api::core::v1::ConfigMap>, name: &str, label: &str) {
        let pp = kube::api::PatchParams::apply("test");
        api.patch(name, &pp, &kube::api::Patch::Apply(cm(name, label)))
            .await
            .unwrap();
    }

    fn cm(name: &str, label: &str) -> Value {
        json!({"apiVersion": "v1", "kind": "ConfigMap",
               "metadata": {"name": name, "namespace": "ns", "labels": {"app": label}},
               "data": {"a": "1"}})
    }

    /// kube's watcher over the stand-in: the first list, then a write, a change and a
    /// deletion of selected objects arrive as events (an unselected one and another guest's
    /// do not); watches are counted apart from other requests.
    #[tokio::test]
    async fn a_watch_sees_what_is_written_after_the_list() {
        use futures::StreamExt as _;
        use k8s_openapi::api::core::v1::ConfigMap;
        use kube::api::{Api, DeleteParams, Patch, PatchParams};
        use kube::runtime::watcher;
        let standin = GuestStandIn::start(2, Vec::new()).await.unwrap();
        let (c0, c1) = (client_of(&standin, 0).await, client_of(&standin, 1).await);
        let api: Api<ConfigMap> = Api::namespaced(c0, "ns");
        let other: Api<ConfigMap> = Api::namespaced(c1, "ns");
        let pp = PatchParams::apply("test");
        put(&api, "before", "x").await;
        let requests0 = standin.total_requests();
        let mut events = Box::pin(watcher(
            Api::<ConfigMap>::all(api.clone().into_client()),
            watcher::Config::default().labels("app=x"),
        ));
        let mut next = async || {
            tokio::time::timeout(std::time::Duration::from_secs(10), events.next())
                .await
                .expect("an event within 10 s")
                .expect("the stream goes on")
                .expect("no watch error")
        };
        let name = |e: &watcher::Event<ConfigMap>| match e {
            watcher::Event::Init => "init".to_string(),
            watcher::Event::InitApply(o) => format!("list {}", o.metadata.name.as_deref().unwrap()),
            watcher::Event::InitDone => "listed".to_string(),
            watcher::Event::Apply(o) => format!(
                "apply {} {}",
                o.metadata.name.as_deref().unwrap(),
                o.data.as_ref().unwrap()["a"]
            ),
            watcher::Event::Delete(o) => format!("delete {}", o.metadata.name.as_deref().unwrap()),
        };
        let mut seen = Vec::new();
        for _ in 0..3 {
            seen.push(name(&next().await));
        }
        // The watch is open once the list is done; give the request a moment to arrive.
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        put(&other, "theirs", "x").await;
        put(&api, "unselected", "y").await;
        put(&api, "after", "x").await;
        let mut changed = cm("after", "x");
        changed["data"]["a"] = "2".into();
        api.patch("after", &pp, &Patch::Apply(changed))
            .await
            .unwrap();
        api.delete("before", &DeleteParams::default())
            .await
            .unwrap();
        // Relabelled: out of the selection (DELETED), back in (ADDED).
        put(&api, "after", "z").await;
        put(&api, "unselected", "x").await;
        for _ in 0..5 {
            seen.push(name(&next().await));
        }
        assert_eq!(
            seen,
            [
                "init",
                "list before",
                "listed",
                "apply after 1",
                "apply after 2",
                "delete before",
                "delete after",
                "apply unselected 1"
            ]
        );
        assert!(standin.total_watches() >= 1);
        // The list and seven writes; the watch is not among them.
        assert_eq!(standin.total_requests() - requests0, 8);
    }

    /// A watch from a resourceVersion older than the history gets a 410 ERROR event, as a
    /// kube-apiserver's "too old resource version" (the client then lists again).
    #[tokio::test]
    async fn a_watch_from_beyond_the_history_is_told_to_list_again() {
        use futures::StreamExt as _;
        use k8s_openapi::api::core::v1::ConfigMap;
        use kube::api::{Api, WatchEvent, WatchParams};
        let standin = GuestStandIn::start(1, Vec::new()).await.unwrap();
        let api: Api<ConfigMap> = Api::namespaced(client_of(&standin, 0).await, "ns");
        // resourceVersions 1.. : a few more writes than the history keeps.
        for i in 0..WATCH_HISTORY + 5 {
            put(&api, &format!("c{i}"), "x").await;
        }
        let mut s = Box::pin(api.watch(&WatchParams::default(), "1").await.unwrap());
        match s.next().await {
            Some(Ok(WatchEvent::Error(e))) => assert_eq!(e.code, 410),
            other => panic!("expected a 410 ERROR event, got {other:?}"),
        }
        // From the newest write on: nothing old, the next write arrives.
        let list = api.list(&Default::default()).await.unwrap();
        let rv = list.metadata.resource_version.unwrap();
        let mut s = Box::pin(api.watch(&WatchParams::default(), &rv).await.unwrap());
        put(&api, "new", "x").await;
        match tokio::time::timeout(std::time::Duration::from_secs(10), s.next()).await {
            Ok(Some(Ok(WatchEvent::Added(o)))) => {
                assert_eq!(o.metadata.name.as_deref(), Some("new"))
            }
            other => panic!("expected the new object, got {other:?}"),
        }
    }
}
