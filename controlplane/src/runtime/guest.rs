//! One connection and one watch-fed metadata cache per guest, kept across passes.
//!
//! A pass used to build a new client from the admin kubeconfig (a TCP and TLS handshake to
//! the guest API server each time) and to read back every object it compares: one GET per
//! desired guest object and one LIST per kind we prune. A [`Session`] keeps the client for
//! as long as the kubeconfig Secret's bytes stay the same, and, while the controller loop
//! runs, a [`WatchCache`] of our objects in that guest, so a converged pass's applier and
//! pruner ask the guest nothing.
//!
//! Bounds (every guest is a hostile tenant's cluster):
//! - connections: one per guest. The client speaks HTTP/2 where the server offers it
//!   (ALPN; a kube-apiserver does), so the cache's watches (one per kind we render) and the
//!   pass's requests share one TLS connection instead of one each; keep-alive PINGs find a
//!   dead peer in [`KEEPALIVE_INTERVAL`] + [`KEEPALIVE_TIMEOUT`].
//! - memory and work: metadata only (trimmed: no spec, no data, no managedFields) of objects
//!   carrying our managed-by label, within [`CACHE_LIMITS`]: 256 KiB per guest, 500 objects
//!   per kind, 4 KiB per object (checked before anything of it is kept), 600 changes per
//!   kind per minute. A guest whose users cross a bound (label many objects as ours, long
//!   labels, a stream of changes) loses the cache for that kind, which is then read from
//!   the API server as without a cache, and costs no more memory or decoding.
//! - cost: measured in controller RSS at 1,000 guests (docs/controller-bench.md), against a
//!   guest API request per compared object per pass.
//! - status reads: [`super::guest_reads`] keeps what a pass reports (five more watches,
//!   projections only, bounded the same way).
//! - lifetime: a session ends when the kubeconfig changes, when the guest stops answering
//!   (its watches would only retry), when the HostedCluster is cleaned up, and when no pass
//!   has used it for [`IDLE_TTL`] (a HostedCluster deleted without our finalizer, or one
//!   whose passes stop before the guest, e.g. while HyperShift's own OLM runs).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hcp_olm_apply::cache::{Limits, WatchCache};

use super::guest_reads::GuestReads;
use kube::client::ConfigExt;
use sha2::{Digest, Sha256};

/// What a guest's cache holds and takes at most (a guest holds a few dozen objects of ours,
/// a few hundred bytes each, and changes them a few times per pass).
pub const CACHE_LIMITS: Limits = Limits {
    objects_per_kind: 500,
    bytes: 256 * 1024,
    entry_bytes: 4 * 1024,
    events_per_minute: 600,
    watch: hcp_olm_apply::watch::Options::UNTRUSTED,
};
/// Largest body of a guest answer that is not a watch, in bytes: a watch's list page is
/// bounded the same ([`hcp_olm_apply::watch::Options::UNTRUSTED`]), so the fallback reads
/// of a pass cost no more than the watches they stand in for. A kube-apiserver's object is
/// at most 1.5 MiB (etcd's limit), and our reads are of single objects, label-selected
/// lists of ours and pages of at most 100 items.
pub const RESPONSE_BYTES: usize = hcp_olm_apply::watch::Options::UNTRUSTED.max_page_bytes;

/// HTTP/2 PING interval on an idle guest connection.
pub const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(20);
/// How long a PING may go unanswered before the connection is closed.
pub const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(10);

/// A session no pass has used for this long is ended (at most a minute later); five
/// times the default resync interval.
pub const IDLE_TTL: Duration = Duration::from_secs(25 * 60);

/// How often idle sessions are looked for.
const SWEEP_EVERY: Duration = Duration::from_secs(60);

/// A guest's client and cache.
pub struct Session {
    digest: [u8; 32],
    used: Mutex<Instant>,
    pub client: kube::Client,
    /// Our objects in the guest (None while caches are off: every read goes to the guest).
    pub cache: Option<Arc<WatchCache>>,
    /// What a pass reads back for status (None while caches are off).
    pub reads: Option<Arc<GuestReads>>,
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("cache", &self.cache)
            .finish_non_exhaustive()
    }
}

/// The SHA-256 of a kubeconfig's bytes: a session is reused only for the same bytes.
pub fn digest(kubeconfig: &[u8]) -> [u8; 32] {
    Sha256::digest(kubeconfig).into()
}

/// Sessions per HostedCluster (`namespace/name`).
#[derive(Clone, Default)]
pub struct Sessions {
    map: Arc<Mutex<HashMap<String, Arc<Session>>>>,
    caches: Arc<AtomicBool>,
    swept: Arc<Mutex<Option<Instant>>>,
}

impl Sessions {
    /// New sessions start a watch cache from now on (the controller loop turns this on
    /// with the management cache; one-off passes and tests without it read the guest).
    pub fn enable_caches(&self) {
        self.caches.store(true, Ordering::Release);
    }

    /// No new session starts a cache, and every open session ends (their watches stop).
    pub fn stop(&self) {
        self.caches.store(false, Ordering::Release);
        self.lock().clear();
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<Session>>> {
        self.map.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The session of `cluster` when it was made from the same kubeconfig bytes (and has a
    /// cache when caches are on).
    pub fn get(&self, cluster: &str, digest: &[u8; 32]) -> Option<Arc<Session>> {
        self.sweep(Instant::now(), IDLE_TTL);
        let caches = self.caches.load(Ordering::Acquire);
        let s = self
            .lock()
            .get(cluster)
            .filter(|s| s.digest == *digest && s.cache.is_some() == caches)
            .cloned()?;
        *s.used.lock().unwrap_or_else(|p| p.into_inner()) = Instant::now();
        Some(s)
    }

    /// Ends the sessions unused for `ttl` at `now`, when the last look was [`SWEEP_EVERY`]
    /// ago or more.
    fn sweep(&self, now: Instant, ttl: Duration) {
        {
            let mut swept = self.swept.lock().unwrap_or_else(|p| p.into_inner());
            if swept.is_some_and(|at| now.saturating_duration_since(at) < SWEEP_EVERY) {
                return;
            }
            *swept = Some(now);
        }
        self.lock().retain(|cluster, s| {
            let used = *s.used.lock().unwrap_or_else(|p| p.into_inner());
            let keep = now.saturating_duration_since(used) < ttl;
            if !keep {
                tracing::debug!(cluster = %cluster, "guest session idle; closed");
            }
            keep
        });
    }

    /// A new session for `cluster` (replacing, and so ending, any other).
    pub fn open(
        &self,
        cluster: &str,
        digest: [u8; 32],
        client: kube::Client,
        kinds: &[kube::api::ApiResource],
        label_selector: &str,
        field_manager: &str,
    ) -> Arc<Session> {
        let caching = self.caches.load(Ordering::Acquire);
        let reads = caching.then(|| Arc::new(GuestReads::start(&client)));
        let cache = caching.then(|| {
            Arc::new(WatchCache::start_limited(
                &client,
                kinds,
                label_selector,
                field_manager,
                None,
                CACHE_LIMITS,
            ))
        });
        let s = Arc::new(Session {
            digest,
            used: Mutex::new(Instant::now()),
            client,
            cache,
            reads,
        });
        self.lock().insert(cluster.to_string(), s.clone());
        s
    }

    /// A session for one use that is not kept and has no cache (cleanup).
    pub fn detached(digest: [u8; 32], client: kube::Client) -> Arc<Session> {
        Arc::new(Session {
            digest,
            used: Mutex::new(Instant::now()),
            client,
            cache: None,
            reads: None,
        })
    }

    /// Ends the session of `cluster` (its watches stop once the last pass using it ends).
    pub fn close(&self, cluster: &str) {
        if self.lock().remove(cluster).is_some() {
            tracing::debug!(cluster, "guest session closed");
        }
    }

    /// Open sessions, for metrics and tests.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// True when no session is open.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The status stores of `cluster`'s session, for tests.
    pub fn reads(&self, cluster: &str) -> Option<Arc<GuestReads>> {
        self.lock().get(cluster).and_then(|s| s.reads.clone())
    }

    /// The cache of `cluster`'s session, for tests.
    pub fn cache(&self, cluster: &str) -> Option<Arc<WatchCache>> {
        self.lock().get(cluster).and_then(|s| s.cache.clone())
    }
}

/// Which addresses a guest kubeconfig's `server:` may lead the controller to (issue 35).
///
/// The admin kubeconfig Secret lives in the HostedCluster's namespace, which the
/// HostedCluster's owner can write: its `server:` is the owner's choice. The controller
/// refuses to dial loopback, link-local (cloud metadata services among them), unspecified,
/// multicast and broadcast addresses, and the management cluster's internal ranges given
/// with `--guest-server-refused-cidrs` (pod, service and node networks), unless the server
/// is the HCP's own API server (`kube-apiserver.<hcp-namespace>.svc`, whose Service address
/// is internal by nature). Names are checked as they resolve at dial time (a resolver that
/// drops refused answers: DNS rebinding gains nothing); IP literals before anything is
/// dialled. `allowed` (`--guest-server-allowed-cidrs`, default empty) lets test and lab
/// set-ups whose guest API servers listen on loopback through; never in production.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ServerPolicy {
    /// Refused besides the special-purpose ranges (unless the server is the HCP's own).
    pub internal: Vec<ipnet::IpNet>,
    /// Allowed whatever else says (test/lab only).
    pub allowed: Vec<ipnet::IpNet>,
}

impl ServerPolicy {
    /// A policy allowing `cidrs` (e.g. `["127.0.0.1/8"]`), refusing nothing more.
    pub fn allowing(cidrs: &[&str]) -> Result<Self, String> {
        Ok(Self {
            allowed: parse_cidrs(cidrs)?,
            internal: Vec::new(),
        })
    }
}

/// CIDRs (`10.128.0.0/14`, `fd00::/48`; a bare address is one host).
pub fn parse_cidrs(cidrs: &[&str]) -> Result<Vec<ipnet::IpNet>, String> {
    cidrs
        .iter()
        .map(|c| {
            let c = c.trim();
            c.parse::<ipnet::IpNet>()
                .or_else(|_| c.parse::<std::net::IpAddr>().map(ipnet::IpNet::from))
                .map_err(|_| format!("{c:?} is not a CIDR (e.g. 10.128.0.0/14)"))
        })
        .collect()
}

/// A guest API server address the [`ServerPolicy`] refuses.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "the guest API server {server} is at {address}, {why}: refused (the controller dials no loopback, link-local or management-internal address a kubeconfig names)"
)]
pub struct ServerRefused {
    pub server: String,
    pub address: std::net::IpAddr,
    pub why: &'static str,
}

impl ServerPolicy {
    /// Why `ip` is refused, if it is; `own`: the server is the HCP's own API server.
    pub fn refusal(&self, ip: std::net::IpAddr, own: bool) -> Option<&'static str> {
        use std::net::IpAddr;
        // `::ffff:127.0.0.1` is 127.0.0.1.
        let ip = ip.to_canonical();
        if self.allowed.iter().any(|n| n.contains(&ip)) {
            return None;
        }
        if ip.is_loopback() {
            return Some("a loopback address");
        }
        if ip.is_unspecified() {
            return Some("an unspecified address");
        }
        if ip.is_multicast() {
            return Some("a multicast address");
        }
        match ip {
            IpAddr::V4(v4) if v4.is_link_local() => return Some("a link-local address"),
            IpAddr::V4(v4) if v4.is_broadcast() => return Some("a broadcast address"),
            IpAddr::V6(v6) if v6.is_unicast_link_local() => {
                return Some("a link-local address");
            }
            _ => {}
        }
        if !own && self.internal.iter().any(|n| n.contains(&ip)) {
            return Some("inside the management cluster's internal ranges");
        }
        None
    }
}

/// Whether `host` names the HCP's own API server Service (`kube-apiserver` in
/// `hcp_namespace`), as HyperShift's own kubeconfigs in the HCP namespace do.
pub fn is_own_api_server(host: &str, hcp_namespace: Option<&str>) -> bool {
    let Some(ns) = hcp_namespace else {
        return false;
    };
    let host = host.trim_end_matches('.');
    host == format!("kube-apiserver.{ns}.svc")
        || host == format!("kube-apiserver.{ns}.svc.cluster.local")
}

/// A resolver that drops refused answers and fails when none is left, naming one.
#[derive(Clone)]
struct FilteringResolver {
    inner: hyper_util::client::legacy::connect::dns::GaiResolver,
    policy: Arc<ServerPolicy>,
    own: bool,
}

type Resolved = std::vec::IntoIter<std::net::SocketAddr>;

impl tower::Service<hyper_util::client::legacy::connect::dns::Name> for FilteringResolver {
    type Response = Resolved;
    type Error = Box<dyn std::error::Error + Send + Sync>;
    type Future =
        std::pin::Pin<Box<dyn std::future::Future<Output = Result<Resolved, Self::Error>> + Send>>;

    fn poll_ready(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        tower::Service::poll_ready(&mut self.inner, cx).map_err(Into::into)
    }

    fn call(&mut self, name: hyper_util::client::legacy::connect::dns::Name) -> Self::Future {
        let (policy, own) = (self.policy.clone(), self.own);
        let server = name.as_str().to_string();
        let lookup = tower::Service::call(&mut self.inner, name);
        Box::pin(async move {
            let mut refused = None;
            let kept: Vec<std::net::SocketAddr> = lookup
                .await?
                .filter(|a| match policy.refusal(a.ip(), own) {
                    None => true,
                    Some(why) => {
                        refused.get_or_insert((a.ip(), why));
                        false
                    }
                })
                .collect();
            if kept.is_empty()
                && let Some((address, why)) = refused
            {
                tracing::warn!(server = %server, %address, why, "guest API server address refused");
                return Err(Box::new(ServerRefused {
                    server,
                    address,
                    why,
                }) as Self::Error);
            }
            Ok(kept.into_iter())
        })
    }
}

/// Why no guest client was built.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("{0}")]
    Refused(#[from] ServerRefused),
    #[error("{0}")]
    Invalid(String),
}

/// The `T` somewhere in `e`'s chain of sources (itself included), at most 32 links down.
pub fn find_source<'a, T: std::error::Error + 'static>(
    e: &'a (dyn std::error::Error + 'static),
) -> Option<&'a T> {
    let mut next = Some(e);
    for _ in 0..32 {
        let cur = next?;
        if let Some(t) = cur.downcast_ref::<T>() {
            return Some(t);
        }
        next = cur.source();
    }
    None
}

/// A client for one guest from its (checked) kubeconfig: kube's own stack (base URI, auth,
/// extra headers) over a connector that offers HTTP/2, with a bound on connecting and on
/// waiting for a response's head, and, for every request that is not a watch, a bound on
/// the whole answer: [`RESPONSE_BYTES`] of body and `response_timeout` from sending the
/// request to the body's end ([`hcp_olm_apply::bounded`]; issue 35: kube reads a whole
/// body into memory, so one endless answer grew the controller until it was OOM-killed).
/// Watches keep their own per-event and per-page bounds and their long lifetimes.
///
/// Not `kube::Client::try_from`: kube's client offers only HTTP/1.1, where each watch holds
/// a connection of its own.
///
/// `servers` decides which addresses the kubeconfig's `server:` may lead to
/// ([`ServerPolicy`]): an IP literal is checked here, before anything is dialled; a name
/// as it resolves, at each dial. `hcp_namespace`: the HCP namespace, whose own API server
/// (`kube-apiserver.<hcp_namespace>.svc`) may be at an internal address.
pub fn client(
    config: &kube::Config,
    connect_timeout: Duration,
    response_timeout: Duration,
    servers: &ServerPolicy,
    hcp_namespace: Option<&str>,
) -> Result<kube::Client, ClientError> {
    use hyper_util::client::legacy::connect::HttpConnector;
    use tower::ServiceBuilder;

    let host = config.cluster_url.host().unwrap_or_default();
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let own = is_own_api_server(host, hcp_namespace);
    if let Ok(address) = host.parse::<std::net::IpAddr>()
        && let Some(why) = servers.refusal(address, own)
    {
        return Err(ServerRefused {
            server: host.to_string(),
            address,
            why,
        }
        .into());
    }
    let invalid = |e: String| ClientError::Invalid(e);
    let mut tls = config
        .rustls_client_config()
        .map_err(|e| invalid(e.to_string()))?;
    // rustls's default keeps up to 256 resumable sessions per client config (its cache is
    // sized up front); a guest's client talks to one server over one kept connection.
    tls.resumption = rustls::client::Resumption::in_memory_sessions(4);
    let mut http = HttpConnector::new_with_resolver(FilteringResolver {
        inner: hyper_util::client::legacy::connect::dns::GaiResolver::new(),
        policy: Arc::new(servers.clone()),
        own,
    });
    http.enforce_http(false);
    http.set_connect_timeout(Some(connect_timeout));
    http.set_nodelay(true);
    // Where h2 is not offered (each watch then holds an HTTP/1.1 connection), TCP
    // keep-alive still finds a half-open one.
    http.set_keepalive(Some(KEEPALIVE_INTERVAL));
    // Guest kubeconfigs name https servers only (kubeconfig-check); never plain text here.
    let mut https = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(tls)
        .https_only();
    if let Some(name) = &config.tls_server_name {
        let name = rustls::pki_types::ServerName::try_from(name.clone())
            .map_err(|e| invalid(format!("tls-server-name {name:?}: {e}")))?;
        https = https.with_server_name_resolver(hyper_rustls::FixedServerNameResolver::new(name));
    }
    let https = https.enable_http1().enable_http2().wrap_connector(http);
    let http_client =
        hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
            .timer(hyper_util::rt::TokioTimer::new())
            .http2_keep_alive_interval(KEEPALIVE_INTERVAL)
            .http2_keep_alive_timeout(KEEPALIVE_TIMEOUT)
            .http2_keep_alive_while_idle(true)
            .build(https);
    let auth = config.auth_layer().map_err(|e| invalid(e.to_string()))?;
    let headers = config
        .extra_headers_layer()
        .map_err(|e| invalid(e.to_string()))?;
    // As kube's own client: 429, 503 and 504 are retried (a CRD's storage just created
    // answers 429 for a moment), here at most 5 times within about 10 s, ignoring a guest's
    // Retry-After.
    let retry = kube::client::retry::RetryPolicy::new(
        Duration::from_millis(50),
        Duration::from_secs(5),
        5,
        false,
    )
    .map_err(|e| invalid(e.to_string()))?;
    let service = ServiceBuilder::new()
        .layer(config.base_uri_layer())
        .layer(tower::retry::RetryLayer::new(retry))
        .option_layer(auth)
        .layer(headers)
        .map_err(tower::BoxError::from)
        .timeout(response_timeout)
        .layer(hcp_olm_apply::bounded::BoundLayer::new(
            hcp_olm_apply::bounded::Bounds {
                max_bytes: RESPONSE_BYTES,
                deadline: response_timeout,
            },
        ))
        .service(http_client);
    Ok(kube::Client::new(service, config.default_namespace.clone()))
}

/// Which addresses a guest kubeconfig's `server:` may lead the controller to.
#[derive(clap::Args, Clone, Debug, Default)]
pub struct GuestServerArgs {
    /// The management cluster's internal ranges (pod, service and node networks, comma
    /// separated CIDRs): a guest kubeconfig's server there is refused
    /// (`Degraded=True GuestServerRefused`) unless it is the HCP's own API server
    /// (`kube-apiserver.<hcp-namespace>.svc`). Loopback, link-local, unspecified,
    /// multicast and broadcast addresses are always refused.
    #[arg(
        long,
        env = "HCP_OLM_GUEST_SERVER_REFUSED_CIDRS",
        value_delimiter = ',',
        value_parser = parse_cidr
    )]
    pub guest_server_refused_cidrs: Vec<ipnet::IpNet>,
    /// TEST AND LAB ONLY: CIDRs a guest kubeconfig's server may be in whatever the rules
    /// above say (the test environments run guest API servers on 127.0.0.1: 127.0.0.0/8).
    /// Default empty; never set it in production: it lets a HostedCluster's owner point
    /// the controller at those addresses.
    #[arg(
        long,
        env = "HCP_OLM_GUEST_SERVER_ALLOWED_CIDRS",
        value_delimiter = ',',
        value_parser = parse_cidr
    )]
    pub guest_server_allowed_cidrs: Vec<ipnet::IpNet>,
}

impl GuestServerArgs {
    /// The policy these flags give.
    pub fn policy(&self) -> ServerPolicy {
        ServerPolicy {
            internal: self.guest_server_refused_cidrs.clone(),
            allowed: self.guest_server_allowed_cidrs.clone(),
        }
    }
}

/// One CIDR of the guest server flags (a bare address is one host).
fn parse_cidr(s: &str) -> Result<ipnet::IpNet, String> {
    parse_cidrs(&[s]).map(|mut v| v.remove(0))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn session(sessions: &Sessions, cluster: &str, used: Instant) {
        // A client that is never used: no request leaves it.
        let config = kube::Config::new("http://127.0.0.1:9".parse().unwrap());
        let client = client(
            &config,
            Duration::from_secs(1),
            Duration::from_secs(1),
            &ServerPolicy::allowing(&["127.0.0.0/8"]).unwrap(),
            None,
        )
        .unwrap();
        let s = sessions.open(cluster, digest(cluster.as_bytes()), client, &[], "", "test");
        *s.used.lock().unwrap() = used;
    }

    /// Sessions no pass used for the TTL end at the next sweep; used ones stay; sweeps run
    /// at most once per SWEEP_EVERY.
    #[tokio::test]
    async fn idle_sessions_end_and_used_ones_stay() {
        let sessions = Sessions::default();
        let t0 = Instant::now();
        session(&sessions, "ns/idle", t0);
        session(&sessions, "ns/used", t0);
        let later = t0 + IDLE_TTL + Duration::from_secs(1);
        *sessions.lock()["ns/used"].used.lock().unwrap() = later;
        sessions.sweep(later, IDLE_TTL);
        let mut left: Vec<String> = sessions.lock().keys().cloned().collect();
        left.sort();
        assert_eq!(left, ["ns/used"]);
        // Within SWEEP_EVERY of the last sweep nothing is looked at.
        *sessions.lock()["ns/used"].used.lock().unwrap() = t0;
        sessions.sweep(later + Duration::from_secs(1), IDLE_TTL);
        assert_eq!(sessions.len(), 1);
        sessions.sweep(later + SWEEP_EVERY, IDLE_TTL);
        assert!(sessions.is_empty());
    }

    /// Loopback, link-local, unspecified, multicast, broadcast and the configured internal
    /// ranges are refused (IPv4-mapped IPv6 too); the HCP's own API server may be internal;
    /// the allowed ranges win.
    #[test]
    fn server_addresses_are_refused_by_kind() {
        let p = ServerPolicy {
            internal: parse_cidrs(&["10.128.0.0/14", "172.30.0.0/16", "fd02::/112"]).unwrap(),
            allowed: Vec::new(),
        };
        let ip = |s: &str| s.parse::<std::net::IpAddr>().unwrap();
        for (addr, why) in [
            ("127.0.0.1", "a loopback address"),
            ("127.1.2.3", "a loopback address"),
            ("::1", "a loopback address"),
            ("::ffff:127.0.0.1", "a loopback address"),
            ("0.0.0.0", "an unspecified address"),
            ("::", "an unspecified address"),
            ("169.254.169.254", "a link-local address"),
            ("fe80::1", "a link-local address"),
            ("224.0.0.1", "a multicast address"),
            ("ff02::1", "a multicast address"),
            ("255.255.255.255", "a broadcast address"),
            (
                "172.30.0.1",
                "inside the management cluster's internal ranges",
            ),
            (
                "10.130.4.5",
                "inside the management cluster's internal ranges",
            ),
            (
                "fd02::10",
                "inside the management cluster's internal ranges",
            ),
        ] {
            assert_eq!(p.refusal(ip(addr), false), Some(why), "{addr}");
        }
        for addr in ["203.0.113.7", "10.0.0.1", "2001:db8::1"] {
            assert_eq!(p.refusal(ip(addr), false), None, "{addr}");
        }
        // The HCP's own kube-apiserver Service: internal by nature, still never loopback.
        assert_eq!(p.refusal(ip("172.30.0.1"), true), None);
        assert_eq!(p.refusal(ip("127.0.0.1"), true), Some("a loopback address"));
        assert!(is_own_api_server(
            "kube-apiserver.clusters-a.svc",
            Some("clusters-a")
        ));
        assert!(is_own_api_server(
            "kube-apiserver.clusters-a.svc.cluster.local.",
            Some("clusters-a")
        ));
        assert!(!is_own_api_server(
            "kube-apiserver.clusters-b.svc",
            Some("clusters-a")
        ));
        assert!(!is_own_api_server("kube-apiserver.clusters-a.svc", None));
        let lab = ServerPolicy::allowing(&["127.0.0.0/8"]).unwrap();
        assert_eq!(lab.refusal(ip("127.0.0.1"), false), None);
        assert_eq!(lab.refusal(ip("::1"), false), Some("a loopback address"));
        assert!(parse_cidrs(&["nonsense"]).is_err());
        assert_eq!(
            parse_cidrs(&["10.0.0.1"]).unwrap()[0].to_string(),
            "10.0.0.1/32"
        );
    }

    /// A session is reused only for the same kubeconfig bytes and cache mode.
    #[tokio::test]
    async fn a_session_is_reused_only_for_the_same_bytes_and_cache_mode() {
        let sessions = Sessions::default();
        session(&sessions, "ns/a", Instant::now());
        assert!(sessions.get("ns/a", &digest(b"ns/a")).is_some());
        assert!(sessions.get("ns/a", &digest(b"other")).is_none());
        sessions.enable_caches();
        assert!(sessions.get("ns/a", &digest(b"ns/a")).is_none());
        sessions.stop();
        assert!(sessions.is_empty());
    }
}
