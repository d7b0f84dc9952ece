//! OCI registry lookups for the controller: does a tag exist, what is its manifest digest,
//! what labels does an image config carry (the release image's version). Honours pull-secret
//! credentials (basic and bearer-token auth) and repository mirrors (`imageContentSources`).
//!
//! Why our own HTTP side rather than `oci-client` (checked against oci-client 0.17,
//! June 2026): it reads manifests and token answers with an unbounded `bytes()`, follows
//! reqwest's default redirects (10 hops, any scheme and host, loopback included) and takes
//! any token `realm` — each of which reopens a hole issue 12 closed (`security_registry.rs`:
//! a manifest streamed without end, redirects and realms to http/loopback/link-local). Layer
//! archives are read with the `tar` crate ([`payload`]).

pub mod auth;
pub mod manifest;
pub mod payload;
pub mod reference;

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Method, Request, StatusCode, header};
use http_body_util::{BodyExt as _, Full, LengthLimitError, Limited};
use hyper_util::client::legacy::Client as HttpClient;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use sha2::{Digest as _, Sha256};

pub use auth::{Credentials, PullSecret, PullSecretError};
pub use manifest::{MAX_MANIFEST_BYTES, Manifest};
pub use reference::{Reference, ReferenceError};

/// The label OpenShift release images carry their version in.
pub const RELEASE_VERSION_LABEL: &str = "io.openshift.release";

const MANIFEST_TYPES: &str = "application/vnd.oci.image.index.v1+json, \
application/vnd.docker.distribution.manifest.list.v2+json, \
application/vnd.oci.image.manifest.v1+json, \
application/vnd.docker.distribution.manifest.v2+json";

/// Errors from registry lookups. Messages never contain credentials.
#[derive(Debug, thiserror::Error)]
pub enum OciError {
    #[error(transparent)]
    Reference(#[from] ReferenceError),
    #[error("{url}: {message}")]
    Transport { url: String, message: String },
    #[error("{url}: unexpected HTTP {status}")]
    Status { url: String, status: u16 },
    #[error("{image}: {message}")]
    Manifest { image: String, message: String },
    /// Content fetched by digest (from the source or any mirror) is not that digest.
    #[error(
        "{image}: content served by {via} does not match the digest {expected} (it is {actual})"
    )]
    DigestMismatch {
        image: String,
        via: String,
        expected: String,
        actual: String,
    },
    /// A response body larger than the bound for its kind; reading stopped at the bound.
    #[error("{url}: response larger than {limit} bytes")]
    TooLarge { url: String, limit: u64 },
    /// A redirect or token realm pointing where the client does not go.
    #[error("{url}: refused {what}: {message}")]
    UnsafeTarget {
        url: String,
        what: &'static str,
        message: String,
    },
    #[error("{image} not found ({reason})")]
    NotFound { image: String, reason: String },
    /// Every place the image may come from (its mirrors, then its own registry) failed;
    /// each failure names its registry.
    #[error("{image}: no registry answered: {}", .failures.join("; "))]
    Unreachable {
        image: String,
        failures: Vec<String>,
    },
    #[error("release image {image} has no version label ({RELEASE_VERSION_LABEL})")]
    NoVersionLabel { image: String },
    #[error(
        "release image {image} has no {} in any layer",
        payload::IMAGE_REFERENCES_PATH
    )]
    NoImageReferences { image: String },
    #[error(
        "release image {image}: {} is unreadable: {message}",
        payload::IMAGE_REFERENCES_PATH
    )]
    InvalidImageReferences { image: String, message: String },
    /// A release payload that cannot be searched within the per-lookup bounds
    /// ([`payload::MAX_LAYERS_SEARCHED`], [`payload::MAX_PAYLOAD_BYTES`]).
    #[error("release image {image}: {message}")]
    PayloadBound { image: String, message: String },
    #[error("release image {image}: layer {digest}: {message}")]
    Layer {
        image: String,
        digest: String,
        message: String,
    },
}

/// A repository mirror: references under `source` are looked up under each mirror first.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mirror {
    /// `registry/repository` prefix, e.g. `quay.io/openshift-release-dev/ocp-release`.
    pub source: String,
    /// Replacement prefixes, tried in order before the source.
    pub mirrors: Vec<String>,
}

/// Options for [`Client::new`].
#[derive(Clone, Debug, Default)]
pub struct ClientOptions {
    /// Credentials per registry.
    pub pull_secret: PullSecret,
    /// Mirrors (HyperShift `imageContentSources`).
    pub mirrors: Vec<Mirror>,
    /// Registries reached over plain HTTP (test registries on loopback).
    pub plain_http: Vec<String>,
    /// Deadline of each HTTP request, head and body together (default 10 s).
    pub timeout: Option<Duration>,
}

/// What the registry said about a tag or digest.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Lookup {
    /// It exists: its manifest digest and the reference that answered (a mirror or the
    /// source). `authenticated`: that registry demanded credentials and accepted this
    /// client's pull secret for it (false for an anonymous answer, which proves nothing about
    /// what the pull secret may read).
    Found {
        digest: String,
        via: String,
        authenticated: bool,
    },
    /// No such manifest: `reason` says so, per candidate.
    Missing { reason: String },
    /// Not found anywhere, and `registry` refused the credentials (401/403).
    Unauthorized { registry: String, reason: String },
}

type Body = Full<Bytes>;

/// A registry client.
#[derive(Clone)]
pub struct Client {
    http: HttpClient<hyper_rustls::HttpsConnector<HttpConnector>, Body>,
    opts: ClientOptions,
    /// Answers to registries' challenges (`Authorization` values) until they expire, by
    /// credentials fingerprint, registry and repository (a token's scope); shared by clones,
    /// never across credentials (the fingerprint is in the key).
    auths: Arc<std::sync::Mutex<HashMap<String, (String, Instant)>>>,
    /// Where a registry is reached instead of its own name (`registry` → `scheme://host:port`;
    /// see [`Client::with_endpoint`]).
    endpoints: Arc<BTreeMap<String, String>>,
}

/// Cached challenge answers kept at most (expired ones go first, then all).
const MAX_CACHED_AUTHS: usize = 4096;
/// How long a token without `expires_in` is used (the distribution spec's default).
const DEFAULT_TOKEN_SECONDS: u64 = 60;
/// How long a Basic answer is reused without a new challenge.
const BASIC_AUTH_REUSE: Duration = Duration::from_secs(600);

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("mirrors", &self.opts.mirrors)
            .finish_non_exhaustive()
    }
}

struct Response {
    status: StatusCode,
    headers: http::HeaderMap,
    /// Read only for 2xx answers (else empty), at most the caller's bound.
    body: Bytes,
    /// The request carried credentials of this client's pull secret in answer to the
    /// registry's challenge (now or earlier: a cached answer).
    authenticated: bool,
}

/// The largest token response read from a Bearer realm.
const MAX_TOKEN_BYTES: u64 = 64 << 10;

/// The address class a client must not be sent to unless the registry itself is there.
fn special_class(ip: IpAddr) -> Option<&'static str> {
    match ip.to_canonical() {
        IpAddr::V4(v4) if v4.is_loopback() => Some("loopback"),
        IpAddr::V4(v4) if v4.is_link_local() => Some("link-local"),
        IpAddr::V4(v4) if v4.is_unspecified() || v4.is_broadcast() => Some("unspecified"),
        IpAddr::V6(v6) if v6.is_loopback() => Some("loopback"),
        IpAddr::V6(v6) if v6.is_unicast_link_local() => Some("link-local"),
        IpAddr::V6(v6) if v6.is_unspecified() => Some("unspecified"),
        _ => None,
    }
}

/// May a request for `registry` (reached over plain HTTP or not, at `registry_ips`) be
/// sent on to `scheme://` at `target_ips` (a redirect or a token realm)? Only https (or
/// the registry's own plain http), and never to loopback / link-local addresses unless
/// the registry itself is in that class.
pub fn target_allowed(
    registry_plain_http: bool,
    registry_ips: &[IpAddr],
    scheme: &str,
    target_ips: &[IpAddr],
) -> Result<(), String> {
    match scheme {
        "https" => {}
        "http" if registry_plain_http => {}
        other => return Err(format!("scheme {other:?} (only https)")),
    }
    for ip in target_ips {
        if let Some(class) = special_class(*ip)
            && (class == "unspecified"
                || !registry_ips
                    .iter()
                    .any(|r| special_class(*r) == Some(class)))
        {
            return Err(format!("{ip} is a {class} address and the registry is not"));
        }
    }
    Ok(())
}

async fn resolve_host(uri: &http::Uri) -> Result<Vec<IpAddr>, String> {
    let host = uri.host().ok_or("no host")?;
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let port = uri
        .port_u16()
        .unwrap_or(if uri.scheme_str() == Some("http") {
            80
        } else {
            443
        });
    if let Ok(ip) = host.parse::<IpAddr>() {
        return Ok(vec![ip]);
    }
    tokio::net::lookup_host((host, port))
        .await
        .map(|a| a.map(|a| a.ip()).collect())
        .map_err(|e| format!("cannot resolve {host}: {e}"))
}

impl Client {
    /// A client trusting the system's root certificates.
    pub fn new(opts: ClientOptions) -> Result<Self, OciError> {
        let provider = std::sync::Arc::new(rustls_ring_provider());
        let https = hyper_rustls::HttpsConnectorBuilder::new()
            .with_provider_and_native_roots(provider)
            .map_err(|e| OciError::Transport {
                url: "(tls setup)".into(),
                message: e.to_string(),
            })?
            .https_or_http()
            .enable_http1()
            .enable_http2()
            .build();
        Ok(Self {
            http: HttpClient::builder(TokioExecutor::new()).build(https),
            opts,
            auths: Arc::default(),
            endpoints: Arc::default(),
        })
    }

    /// This client reaching `registry` at `base` (`http://127.0.0.1:5000`) instead of at its
    /// name; everything else (credentials looked up by `registry`, references, mirrors)
    /// stays. For a test registry standing in for a public one (the default catalog
    /// registry) on loopback; shares the connection pool.
    pub fn with_endpoint(&self, registry: &str, base: &str) -> Self {
        let mut c = self.clone();
        let mut m = (*c.endpoints).clone();
        m.insert(registry.to_string(), base.trim_end_matches('/').to_string());
        c.endpoints = Arc::new(m);
        c
    }

    /// The cache key of a request to `url` on `registry`: credentials, registry and the
    /// repository of a `/v2/<repository>/{manifests,blobs}/…` path; `None` for other paths.
    fn auth_key(&self, registry: &str, url: &str) -> Option<String> {
        let path = url.split_once("/v2/")?.1;
        let repo = ["/manifests/", "/blobs/"]
            .iter()
            .find_map(|m| path.split_once(m).map(|(r, _)| r))?;
        Some(format!(
            "{}\0{registry}\0{repo}",
            self.opts.pull_secret.fingerprint()
        ))
    }

    fn cached_auth(&self, key: &str) -> Option<String> {
        let m = self.auths.lock().unwrap_or_else(|p| p.into_inner());
        m.get(key)
            .filter(|(_, until)| Instant::now() < *until)
            .map(|(a, _)| a.clone())
    }

    fn remember_auth(&self, key: String, authorization: String, valid_for: Duration) {
        let mut m = self.auths.lock().unwrap_or_else(|p| p.into_inner());
        if m.len() >= MAX_CACHED_AUTHS {
            let now = Instant::now();
            m.retain(|_, (_, until)| now < *until);
            if m.len() >= MAX_CACHED_AUTHS {
                m.clear();
            }
        }
        m.insert(key, (authorization, Instant::now() + valid_for));
    }

    /// This client with `extra` mirrors tried after its own (a HostedCluster's
    /// `imageContentSources`); shares the connection pool.
    pub fn with_mirrors(&self, extra: &[Mirror]) -> Self {
        let mut c = self.clone();
        for m in extra {
            if !c.opts.mirrors.contains(m) {
                c.opts.mirrors.push(m.clone());
            }
        }
        c
    }

    fn base(&self, registry: &str) -> String {
        if let Some(base) = self.endpoints.get(registry) {
            return base.clone();
        }
        let scheme = if self.opts.plain_http.iter().any(|r| r == registry) {
            "http"
        } else {
            "https"
        };
        // Docker Hub's API lives on registry-1.docker.io.
        let host = if registry == "docker.io" {
            "registry-1.docker.io"
        } else {
            registry
        };
        format!("{scheme}://{host}")
    }

    async fn send_once(
        &self,
        method: &Method,
        url: &str,
        headers: &[(header::HeaderName, String)],
        body: &Bytes,
        limit: u64,
    ) -> Result<Response, OciError> {
        let mut req = Request::builder().method(method.clone()).uri(url);
        for (k, v) in headers {
            req = req.header(k, v);
        }
        let req = req
            .body(Full::new(body.clone()))
            .map_err(|e| OciError::Transport {
                url: url.to_string(),
                message: e.to_string(),
            })?;
        let timeout = self.opts.timeout.unwrap_or(Duration::from_secs(10));
        let transport = |message: String| OciError::Transport {
            url: url.to_string(),
            message,
        };
        // One deadline for the whole request, head and body: a registry that answers the
        // head at once and then trickles the body gets no more time than one that is silent.
        let deadline = tokio::time::Instant::now() + timeout;
        let resp = tokio::time::timeout_at(deadline, self.http.request(req))
            .await
            .map_err(|_| transport(format!("no answer within {timeout:?}")))?
            .map_err(|e| transport(format!("{e}")))?;
        let (parts, body) = resp.into_parts();
        if !parts.status.is_success() || *method == Method::HEAD || limit == 0 {
            // A body that is not used (errors, redirects, HEAD, uploads) is not read.
            return Ok(Response {
                status: parts.status,
                headers: parts.headers,
                body: Bytes::new(),
                authenticated: false,
            });
        }
        let too_large = || OciError::TooLarge {
            url: url.to_string(),
            limit,
        };
        let declared = parts
            .headers
            .get(header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok());
        if declared.is_some_and(|n| n > limit) {
            return Err(too_large());
        }
        // Limited stops reading as soon as more than `limit` bytes arrived.
        let limited = Limited::new(body, usize::try_from(limit).unwrap_or(usize::MAX));
        let body = tokio::time::timeout_at(deadline, limited.collect())
            .await
            .map_err(|_| {
                transport(format!(
                    "response not complete within {timeout:?} (one deadline for head and body)"
                ))
            })?
            .map_err(|e| {
                if e.downcast_ref::<LengthLimitError>().is_some() {
                    too_large()
                } else {
                    transport(e.to_string())
                }
            })?
            .to_bytes();
        Ok(Response {
            status: parts.status,
            headers: parts.headers,
            body,
            authenticated: false,
        })
    }

    /// Sends a request; on 401 answers the registry's challenge once (basic or bearer token
    /// with the pull-secret credentials for that registry) and retries.
    async fn send(
        &self,
        registry: &str,
        method: Method,
        url: &str,
        mut headers: Vec<(header::HeaderName, String)>,
        body: Bytes,
        limit: u64,
    ) -> Result<Response, OciError> {
        // A cached answer to this repository's challenge first (one request instead of three).
        let key = self.auth_key(registry, url);
        let cached = key.as_deref().and_then(|k| self.cached_auth(k));
        let creds = self.opts.pull_secret.for_registry(registry);
        let resp = match cached {
            Some(a) => {
                let mut h = headers.clone();
                h.push((header::AUTHORIZATION, a));
                let mut r = self.send_once(&method, url, &h, &body, limit).await?;
                // The cached answer was made with these credentials (their fingerprint is
                // in the key).
                r.authenticated = creds.is_some();
                r
            }
            None => self.send_once(&method, url, &headers, &body, limit).await?,
        };
        if resp.status != StatusCode::UNAUTHORIZED {
            return Ok(resp);
        }
        if let Some(k) = &key {
            self.auths
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .remove(k);
        }
        let challenge = resp
            .headers
            .get(header::WWW_AUTHENTICATE)
            .and_then(|v| v.to_str().ok())
            .and_then(auth::parse_challenge);
        let (authorization, valid_for) = match challenge {
            Some(auth::Challenge::Basic) => match creds {
                Some(c) => (c.basic(), BASIC_AUTH_REUSE),
                None => return Ok(resp),
            },
            Some(auth::Challenge::Bearer {
                realm,
                service,
                scope,
            }) => {
                let mut token_url = realm.clone();
                let mut sep = if realm.contains('?') { '&' } else { '?' };
                for (k, v) in [("service", service), ("scope", scope)] {
                    if let Some(v) = v {
                        token_url.push_str(&format!("{sep}{k}={}", encode_query(&v)));
                        sep = '&';
                    }
                }
                self.check_target(registry, &realm, "token realm").await?;
                let mut th = Vec::new();
                if let Some(c) = creds {
                    th.push((header::AUTHORIZATION, c.basic()));
                }
                let tr = self
                    .send_once(
                        &Method::GET,
                        &token_url,
                        &th,
                        &Bytes::new(),
                        MAX_TOKEN_BYTES,
                    )
                    .await?;
                if !tr.status.is_success() {
                    return Ok(resp);
                }
                let v: serde_json::Value =
                    serde_json::from_slice(&tr.body).map_err(|_| OciError::Transport {
                        url: realm.clone(),
                        message: "token response is not JSON".into(),
                    })?;
                let token = v
                    .get("token")
                    .or_else(|| v.get("access_token"))
                    .and_then(|t| t.as_str())
                    .unwrap_or_default();
                // Used until 90 % of its lifetime, at most an hour.
                let secs = v
                    .get("expires_in")
                    .and_then(serde_json::Value::as_u64)
                    .unwrap_or(DEFAULT_TOKEN_SECONDS)
                    .min(3600);
                (
                    format!("Bearer {token}"),
                    Duration::from_secs(secs) * 9 / 10,
                )
            }
            None => return Ok(resp),
        };
        headers.push((header::AUTHORIZATION, authorization.clone()));
        let mut resp = self.send_once(&method, url, &headers, &body, limit).await?;
        resp.authenticated = creds.is_some();
        if let Some(k) = key
            && resp.status != StatusCode::UNAUTHORIZED
            && resp.status != StatusCode::FORBIDDEN
        {
            self.remember_auth(k, authorization, valid_for);
        }
        Ok(resp)
    }

    /// Refuses to send a request on `registry`'s behalf to `url` (a redirect or token
    /// realm) unless [`target_allowed`]. The host is resolved here; the connection
    /// resolves it again (a name that changes its answer in between is not caught).
    async fn check_target(
        &self,
        registry: &str,
        url: &str,
        what: &'static str,
    ) -> Result<(), OciError> {
        let refuse = |message: String| OciError::UnsafeTarget {
            url: url.to_string(),
            what,
            message,
        };
        let target: http::Uri = url.parse().map_err(|_| refuse("not a URL".into()))?;
        let base: http::Uri = self
            .base(registry)
            .parse()
            .map_err(|_| refuse(format!("registry {registry} is not a host")))?;
        let plain = self.opts.plain_http.iter().any(|r| r == registry);
        let registry_ips = resolve_host(&base).await.unwrap_or_default();
        let target_ips = resolve_host(&target).await.map_err(refuse)?;
        target_allowed(
            plain,
            &registry_ips,
            target.scheme_str().unwrap_or(""),
            &target_ips,
        )
        .map_err(refuse)
    }

    /// A key for cached answers of this client: a hash of everything besides the image
    /// that changes an answer (mirrors, plain-HTTP registries, credentials). Holds no
    /// secret.
    pub fn cache_key(&self) -> String {
        let mut h = Sha256::new();
        for m in &self.opts.mirrors {
            h.update(b"mirror\0");
            h.update(m.source.as_bytes());
            for x in &m.mirrors {
                h.update(b"\0");
                h.update(x.as_bytes());
            }
            h.update(b"\n");
        }
        for p in &self.opts.plain_http {
            h.update(b"plain\0");
            h.update(p.as_bytes());
            h.update(b"\n");
        }
        for (registry, base) in self.endpoints.iter() {
            h.update(b"endpoint\0");
            h.update(registry.as_bytes());
            h.update(b"\0");
            h.update(base.as_bytes());
            h.update(b"\n");
        }
        h.update(b"creds\0");
        h.update(self.opts.pull_secret.fingerprint().as_bytes());
        format!("{:x}", h.finalize())[..32].to_string()
    }

    /// This client with `pull_secret` instead of its own (a HostedCluster's); shares
    /// the connection pool.
    pub fn with_pull_secret(&self, pull_secret: PullSecret) -> Self {
        let mut c = self.clone();
        c.opts.pull_secret = pull_secret;
        c
    }

    /// The references to try for `r`: its mirrors in order, then `r` itself.
    pub fn candidates(&self, r: &Reference) -> Vec<Reference> {
        let name = r.name();
        let mut out = Vec::new();
        for m in &self.opts.mirrors {
            let Some(rest) = name.strip_prefix(&m.source) else {
                continue;
            };
            if !(rest.is_empty() || rest.starts_with('/')) {
                continue;
            }
            for mirror in &m.mirrors {
                let mut s = format!("{mirror}{rest}");
                if let Some(t) = &r.tag {
                    s.push_str(&format!(":{t}"));
                }
                if let Some(d) = &r.digest {
                    s.push_str(&format!("@{d}"));
                }
                if let Ok(mr) = Reference::parse(&s) {
                    out.push(mr);
                }
            }
        }
        out.push(r.clone());
        out
    }

    /// Does `image` (a tag or digest reference) exist, and what is its manifest digest?
    /// Mirrors are tried first. `Missing`: "manifest unknown" everywhere (try another
    /// tag); `Unauthorized`: not found and some registry refused the credentials;
    /// transport errors and 5xx are errors (decide later, not now).
    pub async fn resolve(&self, image: &str) -> Result<Lookup, OciError> {
        let r = Reference::parse(image)?;
        let candidates = self.candidates(&r);
        self.resolve_among(&r, candidates).await
    }

    /// [`Client::resolve`] at `image`'s own registry only, mirrors skipped: whether the
    /// registry that owns the image (the default catalog registry) grants this client's
    /// pull secret, whatever a mirror answers.
    pub async fn resolve_at_source(&self, image: &str) -> Result<Lookup, OciError> {
        let r = Reference::parse(image)?;
        self.resolve_among(&r, vec![r.clone()]).await
    }

    async fn resolve_among(
        &self,
        r: &Reference,
        candidates: Vec<Reference>,
    ) -> Result<Lookup, OciError> {
        let mut reasons = Vec::new();
        let mut unauthorized = None;
        let mut last_error = None;
        let mut failures = Vec::new();
        let tried = candidates.len();
        for c in candidates {
            let url = format!(
                "{}/v2/{}/manifests/{}",
                self.base(&c.registry),
                c.repository,
                c.manifest_ref()
            );
            let resp = match self
                .send(
                    &c.registry,
                    Method::HEAD,
                    &url,
                    vec![(header::ACCEPT, MANIFEST_TYPES.into())],
                    Bytes::new(),
                    0,
                )
                .await
            {
                Ok(r) => r,
                Err(e) => {
                    tracing::debug!(candidate = %c, error = %e, "registry lookup failed");
                    failures.push(e.to_string());
                    last_error = Some(e);
                    continue;
                }
            };
            match resp.status {
                s if s.is_success() => {
                    let header = resp
                        .headers
                        .get("docker-content-digest")
                        .and_then(|v| v.to_str().ok())
                        .filter(|d| manifest::valid_digest(d));
                    let digest = match (&c.digest, header) {
                        // Asked by digest: the answer is that digest; a different claim
                        // is a lie (the content is checked when it is read).
                        (Some(want), Some(d)) if d != want => {
                            return Err(OciError::DigestMismatch {
                                image: r.to_string(),
                                via: c.to_string(),
                                expected: want.clone(),
                                actual: d.to_string(),
                            });
                        }
                        (Some(want), _) => want.clone(),
                        (None, Some(d)) => d.to_string(),
                        (None, None) => self.manifest(&c).await?.0,
                    };
                    return Ok(Lookup::Found {
                        digest,
                        via: c.to_string(),
                        authenticated: resp.authenticated,
                    });
                }
                StatusCode::NOT_FOUND => reasons.push(format!("{c}: manifest unknown")),
                StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN => {
                    unauthorized.get_or_insert(c.registry.clone());
                    reasons.push(format!("{c}: not authorized"))
                }
                s => {
                    let e = OciError::Status {
                        url,
                        status: s.as_u16(),
                    };
                    failures.push(e.to_string());
                    last_error = Some(e)
                }
            }
        }
        match (last_error, unauthorized) {
            // A mirror and the source both failed: say so for each (the administrator
            // looks at the mirror first, and the source's error alone hides it).
            (Some(_), _) if reasons.is_empty() && tried > 1 => Err(OciError::Unreachable {
                image: r.to_string(),
                failures,
            }),
            (Some(e), _) if reasons.is_empty() => Err(e),
            (_, Some(registry)) => Ok(Lookup::Unauthorized {
                registry,
                reason: reasons.join("; "),
            }),
            _ => Ok(Lookup::Missing {
                reason: reasons.join("; "),
            }),
        }
    }

    /// GETs a manifest (at most [`MAX_MANIFEST_BYTES`]); returns (digest, manifest). A
    /// reference with a digest must be answered with content of that digest.
    async fn manifest(&self, r: &Reference) -> Result<(String, Manifest), OciError> {
        let url = format!(
            "{}/v2/{}/manifests/{}",
            self.base(&r.registry),
            r.repository,
            r.manifest_ref()
        );
        let resp = self
            .send(
                &r.registry,
                Method::GET,
                &url,
                vec![(header::ACCEPT, MANIFEST_TYPES.into())],
                Bytes::new(),
                MAX_MANIFEST_BYTES,
            )
            .await?;
        match resp.status {
            s if s.is_success() => {}
            StatusCode::NOT_FOUND | StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN => {
                return Err(OciError::NotFound {
                    image: r.to_string(),
                    reason: format!("HTTP {}", resp.status.as_u16()),
                });
            }
            s => {
                return Err(OciError::Status {
                    url,
                    status: s.as_u16(),
                });
            }
        }
        let digest = format!("sha256:{:x}", Sha256::digest(&resp.body));
        if let Some(want) = &r.digest
            && *want != digest
        {
            return Err(OciError::DigestMismatch {
                image: r.to_string(),
                via: r.registry.clone(),
                expected: want.clone(),
                actual: digest,
            });
        }
        let parsed = Manifest::parse(&resp.body).map_err(|message| OciError::Manifest {
            image: r.to_string(),
            message,
        })?;
        Ok((digest, parsed))
    }

    /// The image manifest of `image` (through mirrors), an index resolved to its
    /// linux/amd64 entry (else the first); returns the reference that answered (with the
    /// digest read) and the manifest. Every manifest is fetched by digest and checked
    /// against it, whichever mirror serves it.
    async fn image_manifest(&self, image: &str) -> Result<(Reference, Manifest), OciError> {
        let r = Reference::parse(image)?;
        let found = match self.resolve(image).await? {
            Lookup::Found { via, digest, .. } => Reference {
                tag: None,
                digest: Some(digest),
                ..Reference::parse(&via)?
            },
            Lookup::Missing { reason } | Lookup::Unauthorized { reason, .. } => {
                return Err(OciError::NotFound {
                    image: image.to_string(),
                    reason,
                });
            }
        };
        let (_, mut manifest) = self.manifest(&found).await.map_err(|e| named(e, &r))?;
        if let Some(pick) = manifest.pick_platform() {
            let child = Reference {
                tag: None,
                digest: Some(pick.to_string()),
                ..found.clone()
            };
            manifest = self.manifest(&child).await.map_err(|e| named(e, &r))?.1;
            if matches!(manifest, Manifest::Index(_)) {
                return Err(OciError::Manifest {
                    image: r.to_string(),
                    message: "image index names another index".into(),
                });
            }
        }
        Ok((found, manifest))
    }

    /// GETs a blob of `r`'s repository, following one redirect (registries hand blobs
    /// to a storage backend), refusing more than `max` bytes, checking its digest.
    async fn blob(&self, r: &Reference, digest: &str, max: u64) -> Result<Bytes, OciError> {
        let url = format!(
            "{}/v2/{}/blobs/{digest}",
            self.base(&r.registry),
            r.repository
        );
        if !manifest::valid_digest(digest) {
            return Err(OciError::Manifest {
                image: r.to_string(),
                message: "blob digest is not sha256:<64 hex>".into(),
            });
        }
        let mut resp = self
            .send(&r.registry, Method::GET, &url, vec![], Bytes::new(), max)
            .await?;
        if resp.status.is_redirection()
            && let Some(loc) = resp
                .headers
                .get(header::LOCATION)
                .and_then(|v| v.to_str().ok())
        {
            let next = if loc.starts_with("http") {
                loc.to_string()
            } else {
                format!("{}{loc}", self.base(&r.registry))
            };
            self.check_target(&r.registry, &next, "redirect").await?;
            // No credentials to another host: the location carries its own token.
            resp = self
                .send_once(&Method::GET, &next, &[], &Bytes::new(), max)
                .await?;
        }
        if !resp.status.is_success() {
            return Err(OciError::Status {
                url,
                status: resp.status.as_u16(),
            });
        }
        let actual = format!("sha256:{:x}", Sha256::digest(&resp.body));
        if actual != digest {
            return Err(OciError::DigestMismatch {
                image: r.to_string(),
                via: r.registry.clone(),
                expected: digest.to_string(),
                actual,
            });
        }
        Ok(resp.body)
    }

    /// The labels of an image's config (`config.Labels`). A multi-arch index resolves to its
    /// linux/amd64 entry (else the first).
    pub async fn labels(&self, image: &str) -> Result<BTreeMap<String, String>, OciError> {
        let (found, manifest) = self.image_manifest(image).await?;
        let bad = |message: &str| OciError::Manifest {
            image: image.to_string(),
            message: message.to_string(),
        };
        let Manifest::Image { config, .. } = &manifest else {
            return Err(bad("manifest has no config digest"));
        };
        let body = self
            .blob(&found, &config.digest, MAX_MANIFEST_BYTES)
            .await?;
        let cfg: serde_json::Value =
            serde_json::from_slice(&body).map_err(|_| bad("image config is not JSON"))?;
        Ok(cfg
            .pointer("/config/Labels")
            .and_then(|l| l.as_object())
            .map(|l| {
                l.iter()
                    .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_string())))
                    .collect()
            })
            .unwrap_or_default())
    }

    /// The component images of a release payload: `release-manifests/image-references`
    /// from the release image's layers (newest layer first), parsed into component
    /// name → image reference. Layer and file sizes are bounded (see [`payload`]).
    pub async fn release_image_references(
        &self,
        image: &str,
    ) -> Result<BTreeMap<String, String>, OciError> {
        let (found, manifest) = self.image_manifest(image).await?;
        let layers: Vec<(String, u64)> = match manifest {
            Manifest::Image { layers, .. } => {
                layers.into_iter().map(|d| (d.digest, d.size)).collect()
            }
            Manifest::Index(_) => vec![],
        };
        let mut first_error = None;
        let total = layers.len();
        let mut read_bytes: u64 = 0;
        for (searched, (digest, size)) in layers.into_iter().rev().enumerate() {
            let layer_err = |message: String| OciError::Layer {
                image: image.to_string(),
                digest: digest.clone(),
                message,
            };
            // A payload is read in bounded work: at most MAX_LAYERS_SEARCHED layers and
            // MAX_PAYLOAD_BYTES in all, however many layers the manifest lists.
            let left = payload::MAX_PAYLOAD_BYTES.saturating_sub(read_bytes);
            if searched >= payload::MAX_LAYERS_SEARCHED || left == 0 || size > left {
                return Err(OciError::PayloadBound {
                    image: image.to_string(),
                    message: format!(
                        "{} not found in the newest {searched} of {total} layers ({read_bytes} bytes read; at most {} layers and {} bytes are read per lookup)",
                        payload::IMAGE_REFERENCES_PATH,
                        payload::MAX_LAYERS_SEARCHED,
                        payload::MAX_PAYLOAD_BYTES,
                    ),
                });
            }
            if size > payload::MAX_LAYER_BYTES {
                first_error.get_or_insert(layer_err(format!(
                    "{size} bytes, more than the {} searched",
                    payload::MAX_LAYER_BYTES
                )));
                continue;
            }
            let blob = self
                .blob(&found, &digest, payload::MAX_LAYER_BYTES.min(left))
                .await
                .map_err(|e| named(e, &Reference::parse(image).unwrap_or(found.clone())))?;
            read_bytes += blob.len() as u64;
            let found_file = tokio::task::spawn_blocking(move || {
                payload::find_in_layer(&blob, payload::IMAGE_REFERENCES_PATH)
            })
            .await
            .map_err(|e| layer_err(e.to_string()))?;
            match found_file {
                Ok(Some(data)) => {
                    return payload::parse_image_references(&data).map_err(|message| {
                        OciError::InvalidImageReferences {
                            image: image.to_string(),
                            message,
                        }
                    });
                }
                Ok(None) => {}
                Err(e @ payload::LayerError::FileTooLarge { .. }) => {
                    return Err(OciError::InvalidImageReferences {
                        image: image.to_string(),
                        message: e.to_string(),
                    });
                }
                Err(e) => {
                    first_error.get_or_insert(layer_err(e.to_string()));
                }
            }
        }
        Err(first_error.unwrap_or(OciError::NoImageReferences {
            image: image.to_string(),
        }))
    }

    /// The OpenShift version of a release image, from its `io.openshift.release` label.
    pub async fn release_version(&self, image: &str) -> Result<String, OciError> {
        self.labels(image)
            .await?
            .remove(RELEASE_VERSION_LABEL)
            .filter(|v| !v.is_empty())
            .ok_or_else(|| OciError::NoVersionLabel {
                image: image.to_string(),
            })
    }

    /// Pushes a minimal image (no layers, a config with `labels`) as `image` (a tag reference)
    /// and returns its manifest digest. Used by tests and the demo to fill a local registry.
    pub async fn push_image(
        &self,
        image: &str,
        labels: &BTreeMap<String, String>,
    ) -> Result<String, OciError> {
        self.push_image_with_layers(image, labels, &[]).await
    }

    /// Uploads one blob to `r`'s repository; returns its digest.
    async fn push_blob(&self, r: &Reference, data: Bytes) -> Result<String, OciError> {
        let base = self.base(&r.registry);
        let digest = format!("sha256:{:x}", Sha256::digest(&data));
        let start = format!("{base}/v2/{}/blobs/uploads/", r.repository);
        let resp = self
            .send(&r.registry, Method::POST, &start, vec![], Bytes::new(), 0)
            .await?;
        if resp.status != StatusCode::ACCEPTED {
            return Err(OciError::Status {
                url: start,
                status: resp.status.as_u16(),
            });
        }
        let location = resp
            .headers
            .get(header::LOCATION)
            .and_then(|v| v.to_str().ok())
            .ok_or_else(|| OciError::Manifest {
                image: r.to_string(),
                message: "upload has no Location".into(),
            })?;
        let mut put = if location.starts_with("http") {
            location.to_string()
        } else {
            format!("{base}{location}")
        };
        put.push(if put.contains('?') { '&' } else { '?' });
        put.push_str(&format!("digest={digest}"));
        let resp = self
            .send(
                &r.registry,
                Method::PUT,
                &put,
                vec![(header::CONTENT_TYPE, "application/octet-stream".into())],
                data,
                0,
            )
            .await?;
        if resp.status != StatusCode::CREATED {
            return Err(OciError::Status {
                url: put,
                status: resp.status.as_u16(),
            });
        }
        Ok(digest)
    }

    /// Pushes an image built elsewhere exactly as given — its blobs (`layers` and `config`)
    /// and its `manifest` bytes (an OCI image manifest naming those digests) — as `image` (a
    /// tag reference); returns the manifest digest (that of `manifest`, so a reproducible
    /// build pushes to the same digest).
    pub async fn push_built(
        &self,
        image: &str,
        layers: &[Bytes],
        config: Bytes,
        manifest: Bytes,
    ) -> Result<String, OciError> {
        let r = Reference::parse(image)?;
        let base = self.base(&r.registry);
        for l in layers {
            self.push_blob(&r, l.clone()).await?;
        }
        self.push_blob(&r, config).await?;
        self.put_manifest(
            &r,
            &base,
            "application/vnd.oci.image.manifest.v1+json",
            manifest,
        )
        .await
    }

    /// PUTs `bytes` (of `media_type`) as the manifest `r` names; returns its digest.
    async fn put_manifest(
        &self,
        r: &Reference,
        base: &str,
        media_type: &str,
        bytes: Bytes,
    ) -> Result<String, OciError> {
        let url = format!("{base}/v2/{}/manifests/{}", r.repository, r.manifest_ref());
        let resp = self
            .send(
                &r.registry,
                Method::PUT,
                &url,
                vec![(header::CONTENT_TYPE, media_type.into())],
                bytes.clone(),
                0,
            )
            .await?;
        if resp.status != StatusCode::CREATED {
            return Err(OciError::Status {
                url,
                status: resp.status.as_u16(),
            });
        }
        Ok(format!("sha256:{:x}", Sha256::digest(&bytes)))
    }

    /// Pushes an OCI image index (`index`: its bytes, naming manifests already pushed to the
    /// same repository) as `image` (a tag reference); returns its digest.
    pub async fn push_index(&self, image: &str, index: Bytes) -> Result<String, OciError> {
        let r = Reference::parse(image)?;
        let base = self.base(&r.registry);
        self.put_manifest(&r, &base, "application/vnd.oci.image.index.v1+json", index)
            .await
    }

    /// Pushes an image with `layers` (gzip-compressed tar blobs, e.g. from
    /// [`payload::tar_gz`]) and a config with `labels` as `image`; returns its manifest
    /// digest. Used by tests and the demo (release images carrying image-references).
    pub async fn push_image_with_layers(
        &self,
        image: &str,
        labels: &BTreeMap<String, String>,
        layers: &[Vec<u8>],
    ) -> Result<String, OciError> {
        let mut blobs = Vec::new();
        let mut descriptors = Vec::new();
        let mut diff_ids = Vec::new();
        for l in layers {
            // diff_id: digest of the uncompressed tar.
            let mut plain = Vec::new();
            let uncompressed = if l.starts_with(&[0x1f, 0x8b]) {
                std::io::Read::read_to_end(
                    &mut flate2::read::MultiGzDecoder::new(&l[..]),
                    &mut plain,
                )
                .map(|_| plain.as_slice())
                .unwrap_or(l.as_slice())
            } else {
                l.as_slice()
            };
            diff_ids.push(format!("sha256:{:x}", Sha256::digest(uncompressed)));
            descriptors.push(serde_json::json!({
                "mediaType": "application/vnd.oci.image.layer.v1.tar+gzip",
                "digest": format!("sha256:{:x}", Sha256::digest(l)), "size": l.len(),
            }));
            blobs.push(Bytes::from(l.clone()));
        }
        let config = serde_json::json!({
            "architecture": "amd64", "os": "linux",
            "config": { "Labels": labels },
            "rootfs": { "type": "layers", "diff_ids": diff_ids },
        });
        let config = Bytes::from(serde_json::to_vec(&config).unwrap_or_default());
        let manifest = serde_json::json!({
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": { "mediaType": "application/vnd.oci.image.config.v1+json",
                        "digest": format!("sha256:{:x}", Sha256::digest(&config)),
                        "size": config.len() },
            "layers": descriptors,
        });
        let manifest = Bytes::from(serde_json::to_vec(&manifest).unwrap_or_default());
        self.push_built(image, &blobs, config, manifest).await
    }
}

/// `e` about `image` (the reference asked for) rather than the mirror that answered;
/// the mirror stays named in `via`.
fn named(e: OciError, image: &Reference) -> OciError {
    match e {
        OciError::DigestMismatch {
            via,
            expected,
            actual,
            ..
        } => OciError::DigestMismatch {
            image: image.to_string(),
            via,
            expected,
            actual,
        },
        e => e,
    }
}

fn rustls_ring_provider() -> rustls::crypto::CryptoProvider {
    rustls::crypto::ring::default_provider()
}

fn encode_query(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redirects_and_realms_only_to_https_and_not_to_loopback_or_link_local() {
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        let public = [ip("198.18.0.1")];
        let lo = [ip("127.0.0.1")];
        // https to a public address: fine; plain http only for a plain-http registry.
        assert!(target_allowed(false, &public, "https", &public).is_ok());
        assert!(target_allowed(false, &public, "http", &public).is_err());
        assert!(target_allowed(true, &lo, "http", &lo).is_ok());
        assert!(target_allowed(true, &lo, "file", &lo).is_err());
        // A public registry sending us to the metadata service or to ourselves: refused.
        for bad in [
            "169.254.169.254",
            "127.0.0.1",
            "::1",
            "fe80::1",
            "0.0.0.0",
            "::ffff:127.0.0.1",
        ] {
            let e = target_allowed(false, &public, "https", &[ip(bad)]).unwrap_err();
            assert!(e.contains(bad) || e.contains("127.0.0.1"), "{bad}: {e}");
        }
        // A registry on loopback (tests) may send us to loopback, not to link-local.
        assert!(target_allowed(true, &lo, "http", &[ip("::1")]).is_ok());
        assert!(target_allowed(true, &lo, "https", &[ip("169.254.169.254")]).is_err());
    }

    #[test]
    fn cache_keys_tell_mirrors_and_credentials_apart_without_holding_them() {
        let c = Client::new(ClientOptions::default()).unwrap();
        let m = Mirror {
            source: "quay.io/ocp".into(),
            mirrors: vec!["evil.example.com/ocp".into()],
        };
        let ps = PullSecret::parse(
            br#"{"auths":{"quay.io":{"username":"bot","password":"s3cret-token"}}}"#,
        )
        .unwrap();
        let keys = [
            c.cache_key(),
            c.with_mirrors(std::slice::from_ref(&m)).cache_key(),
            c.with_pull_secret(ps.clone()).cache_key(),
        ];
        assert_ne!(keys[0], keys[1]);
        assert_ne!(keys[0], keys[2]);
        assert_ne!(keys[1], keys[2]);
        assert_eq!(keys[2], c.with_pull_secret(ps).cache_key());
        assert!(keys.iter().all(|k| !k.contains("s3cret")));
        // A registry reached elsewhere answers differently.
        let moved = c.with_endpoint("registry.redhat.io", "http://127.0.0.1:5000/");
        assert_ne!(moved.cache_key(), keys[0]);
        assert_eq!(moved.base("registry.redhat.io"), "http://127.0.0.1:5000");
        assert_eq!(moved.base("quay.io"), "https://quay.io");
    }
}
