//! Prometheus metrics of reconciles and what the admin HTTP endpoints (`/healthz`,
//! `/readyz`, `/metrics`; served by [`hcp_olm_binkit::admin`]) answer.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use hcp_olm_binkit::admin::Admin;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

type Labels = Vec<(String, String)>;

/// Reconcile metrics.
pub struct Metrics {
    registry: Arc<Registry>,
    reconciles: Family<Labels, Counter>,
    errors: Family<Labels, Counter>,
    duration: Histogram,
    leader_gauge: Gauge,
    writes: Family<Labels, Counter>,
    metrics_requests: Family<Labels, Counter>,
    ready: AtomicBool,
    /// The controller's watch caches have listed everything once.
    synced: AtomicBool,
    /// 0: no leader election, 1: standby, 2: leader.
    role: AtomicU8,
    /// Reconciles running now.
    inflight: AtomicUsize,
    /// When the loop last made progress: a reconcile finished, or work started after idling.
    last_progress: Mutex<Instant>,
    /// How long reconciles may run with none finishing before `/healthz` fails.
    stall_limit: Duration,
    /// Where the fleet gauges read the HostedOLMs (set once the stores run).
    fleet: Arc<Mutex<Option<FleetSource>>>,
}

/// The HostedOLMs the fleet gauges describe (the watch-fed store's).
pub type FleetSource = Box<dyn Fn() -> Vec<Arc<crate::hostedolm::HostedOLM>> + Send + Sync>;

/// The fleet gauges, read at each scrape from the HostedOLM store: per HostedOLM, each
/// condition (1 True, 0 otherwise) and the catalogs not READY; nothing before the store runs
/// (a standby replica exports none). The alerts in `manifests/monitoring` use them.
struct FleetCollector {
    source: Arc<Mutex<Option<FleetSource>>>,
}

impl std::fmt::Debug for FleetCollector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FleetCollector")
            .field(
                "set",
                &self.source.lock().map(|s| s.is_some()).unwrap_or(false),
            )
            .finish()
    }
}

/// Conditions exported per HostedOLM.
const FLEET_CONDITIONS: [&str; 4] = ["Available", "Progressing", "Degraded", "Upgradeable"];

impl prometheus_client::collector::Collector for FleetCollector {
    fn encode(
        &self,
        mut encoder: prometheus_client::encoding::DescriptorEncoder<'_>,
    ) -> std::fmt::Result {
        use prometheus_client::encoding::EncodeMetric;
        use prometheus_client::metrics::gauge::ConstGauge;
        let holms = match self.source.lock() {
            Ok(s) => match s.as_ref() {
                Some(source) => source(),
                None => return Ok(()),
            },
            Err(_) => return Ok(()),
        };
        let gauge = ConstGauge::new(0i64);
        {
            let mut family = encoder.encode_descriptor(
                "hosted_olm_condition",
                "Conditions of each HostedOLM: 1 while True, 0 otherwise",
                None,
                gauge.metric_type(),
            )?;
            for h in &holms {
                let (ns, name) = meta_names(h);
                let conditions = h
                    .status
                    .as_ref()
                    .map(|s| s.conditions.as_slice())
                    .unwrap_or_default();
                for c in FLEET_CONDITIONS {
                    let on = conditions
                        .iter()
                        .any(|x| x.type_ == c && x.status == "True");
                    let labels = [("namespace", ns), ("name", name), ("condition", c)];
                    ConstGauge::new(i64::from(on)).encode(family.encode_family(&labels)?)?;
                }
            }
        }
        let mut family = encoder.encode_descriptor(
            "hosted_olm_catalogs_not_ready",
            "Enabled default catalogs of each HostedOLM whose guest CatalogSource is not READY",
            None,
            gauge.metric_type(),
        )?;
        for h in &holms {
            let (ns, name) = meta_names(h);
            let n = h
                .status
                .as_ref()
                .map(|s| {
                    s.catalogs
                        .iter()
                        .filter(|c| c.enabled && c.source.is_some())
                        .filter(|c| c.connection_state.as_deref() != Some("READY"))
                        .count()
                })
                .unwrap_or(0);
            let labels = [("namespace", ns), ("name", name)];
            ConstGauge::new(n as i64).encode(family.encode_family(&labels)?)?;
        }
        Ok(())
    }
}

fn meta_names(h: &crate::hostedolm::HostedOLM) -> (&str, &str) {
    (
        h.metadata.namespace.as_deref().unwrap_or_default(),
        h.metadata.name.as_deref().unwrap_or_default(),
    )
}

/// Default for [`Metrics::with_stall_limit`]: far above one reconcile's own timeouts
/// (guest connect 10 s, read 60 s per request), so only a loop that stopped moving trips it.
pub const DEFAULT_STALL_LIMIT: Duration = Duration::from_secs(600);

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry =
            hcp_olm_binkit::admin::registry("hcp-olm-controller", env!("CARGO_PKG_VERSION"));
        let reconciles = Family::<Labels, Counter>::default();
        let errors = Family::<Labels, Counter>::default();
        let duration = Histogram::new(exponential_buckets(0.01, 2.0, 14));
        registry.register(
            "reconciles",
            "Reconciles of HostedClusters by result",
            reconciles.clone(),
        );
        registry.register(
            "reconcile_errors",
            "Failed reconciles by reason",
            errors.clone(),
        );
        registry.register(
            "reconcile_duration_seconds",
            "Duration of reconciles",
            duration.clone(),
        );
        let writes = Family::<Labels, Counter>::default();
        registry.register(
            "apply_writes",
            "API writes by reconciles: cluster (management, guest) and what (objects, status)",
            writes.clone(),
        );
        let leader_gauge = Gauge::default();
        registry.register(
            "leader",
            "1 while this replica holds the leader-election Lease",
            leader_gauge.clone(),
        );
        let metrics_requests = Family::<Labels, Counter>::default();
        registry.register(
            "metrics_requests",
            "Requests of the TLS /metrics endpoint by result (allowed, unauthenticated, forbidden, review_failed)",
            metrics_requests.clone(),
        );
        let fleet = Arc::new(Mutex::new(None));
        registry.register_collector(Box::new(FleetCollector {
            source: Arc::clone(&fleet),
        }));
        Self {
            registry: Arc::new(registry),
            reconciles,
            errors,
            duration,
            leader_gauge,
            writes,
            metrics_requests,
            ready: AtomicBool::new(false),
            synced: AtomicBool::new(false),
            role: AtomicU8::new(0),
            inflight: AtomicUsize::new(0),
            last_progress: Mutex::new(Instant::now()),
            stall_limit: DEFAULT_STALL_LIMIT,
            fleet,
        }
    }
}

impl Metrics {
    /// Metrics whose `/healthz` fails once reconciles have been running for `limit` with
    /// none finishing.
    pub fn with_stall_limit(limit: Duration) -> Self {
        Self {
            stall_limit: limit,
            ..Self::default()
        }
    }

    /// Where the fleet gauges read the HostedOLMs from now on.
    pub fn set_fleet_source(&self, source: FleetSource) {
        *self.fleet.lock().unwrap_or_else(|p| p.into_inner()) = Some(source);
    }

    /// A reconcile starts (pair with [`Metrics::reconcile_finished`]).
    pub fn reconcile_started(&self) {
        self.reconcile_started_at(Instant::now());
    }

    fn reconcile_started_at(&self, now: Instant) {
        if self.inflight.fetch_add(1, Ordering::SeqCst) == 0 {
            // idle time is not a stall
            *self.last_progress.lock().unwrap_or_else(|e| e.into_inner()) = now;
        }
    }

    /// A reconcile finished (either way).
    pub fn reconcile_finished(&self) {
        self.reconcile_finished_at(Instant::now());
    }

    fn reconcile_finished_at(&self, now: Instant) {
        let _ = self
            .inflight
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1));
        *self.last_progress.lock().unwrap_or_else(|e| e.into_inner()) = now;
    }

    /// `Some(how long)` when reconciles are running and none finished for longer than the
    /// stall limit.
    pub fn stalled(&self, now: Instant) -> Option<Duration> {
        if self.inflight.load(Ordering::SeqCst) == 0 {
            return None;
        }
        let since = now.saturating_duration_since(
            *self.last_progress.lock().unwrap_or_else(|e| e.into_inner()),
        );
        (since > self.stall_limit).then_some(since)
    }

    /// The watch caches have synced (`true`) or the loop stopped (`false`).
    pub fn set_synced(&self, synced: bool) {
        self.synced.store(synced, Ordering::Relaxed);
    }

    /// Whether the watch caches have synced.
    pub fn synced(&self) -> bool {
        self.synced.load(Ordering::Relaxed)
    }

    /// Ready to serve: running, and, unless a standby, with synced caches.
    pub fn serving(&self) -> bool {
        self.is_ready() && (self.leader() == Some(false) || self.synced())
    }

    /// Count one reconcile with its result (`applied`, `waiting`, `invalid`, ...).
    pub fn observe(&self, result: &str, took: Duration) {
        self.reconciles
            .get_or_create(&vec![("result".to_string(), result.to_string())])
            .inc();
        self.duration.observe(took.as_secs_f64());
    }

    /// Count the writes of one reconcile.
    pub fn writes(&self, management: usize, guest: usize, status: bool) {
        for (cluster, what, n) in [
            ("management", "objects", management),
            ("guest", "objects", guest),
            ("management", "status", usize::from(status)),
        ] {
            if n > 0 {
                self.writes
                    .get_or_create(&vec![
                        ("cluster".to_string(), cluster.to_string()),
                        ("what".to_string(), what.to_string()),
                    ])
                    .inc_by(n as u64);
            }
        }
    }

    /// Count one failed reconcile.
    /// One request of the TLS `/metrics` endpoint, by result.
    pub fn metrics_request(&self, result: &str) {
        self.metrics_requests
            .get_or_create(&vec![("result".to_string(), result.to_string())])
            .inc();
    }

    pub fn error(&self, reason: &str, took: Duration) {
        self.observe("error", took);
        self.errors
            .get_or_create(&vec![("reason".to_string(), reason.to_string())])
            .inc();
    }

    /// Mark the controller ready (its watches are running).
    pub fn set_ready(&self, ready: bool) {
        self.ready.store(ready, Ordering::Relaxed);
    }

    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::Relaxed)
    }

    /// Leader-election role: None without election, else whether we lead.
    pub fn set_leader(&self, leading: Option<bool>) {
        let role = match leading {
            None => 0,
            Some(false) => 1,
            Some(true) => 2,
        };
        self.role.store(role, Ordering::Relaxed);
        self.leader_gauge.set(i64::from(role == 2));
    }

    /// Whether this replica leads (None: no leader election).
    pub fn leader(&self) -> Option<bool> {
        match self.role.load(Ordering::Relaxed) {
            0 => None,
            r => Some(r == 2),
        }
    }

    /// OpenMetrics text.
    pub fn encode(&self) -> String {
        hcp_olm_binkit::admin::encode(&self.registry).unwrap_or_else(|e| {
            tracing::warn!(error = %e, "encoding metrics");
            String::new()
        })
    }

    /// `/healthz`: fails while the reconcile loop is stalled.
    fn health(&self) -> Result<String, String> {
        match self.stalled(Instant::now()) {
            None => Ok("ok".to_string()),
            Some(d) => Err(format!(
                "reconcile loop stalled: {} reconciles running, none finished for {}s",
                self.inflight.load(Ordering::SeqCst),
                d.as_secs()
            )),
        }
    }

    /// `/readyz`: a standby replica is ready too (else a rolling update of a 2-replica
    /// Deployment never completes); the body says which. The leader (or a lone
    /// controller) is ready once its caches synced.
    fn readiness(&self) -> Result<String, String> {
        match (self.serving(), self.leader()) {
            (true, None) => Ok("ok".to_string()),
            (true, Some(true)) => Ok("ok: leader".to_string()),
            (true, Some(false)) => Ok("ok: standby".to_string()),
            (false, _) => Err("not ready".to_string()),
        }
    }
}

/// The admin endpoints: `/healthz` fails on a stalled reconcile loop, `/readyz` waits for
/// the caches (`ok`, `ok: leader`, `ok: standby`), `/metrics` is [`Metrics::encode`].
pub fn admin(metrics: Arc<Metrics>) -> Admin {
    let (h, r) = (Arc::clone(&metrics), Arc::clone(&metrics));
    Admin::new(Arc::clone(&metrics.registry))
        .healthz(move || h.health())
        .readyz(move || r.readiness())
}

/// Serve the admin endpoints until `shutdown` resolves.
pub async fn serve(
    addr: SocketAddr,
    metrics: Arc<Metrics>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    tracing::info!(addr = %listener.local_addr()?, "admin endpoints listening");
    admin(metrics).serve(listener, shutdown).await
}

/// The probes only, on `listener`: `/metrics` is on the TLS endpoint at `secure`.
pub async fn serve_probes(
    listener: tokio::net::TcpListener,
    metrics: Arc<Metrics>,
    secure: SocketAddr,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    tracing::info!(addr = %listener.local_addr()?, "probes listening");
    admin(metrics)
        .metrics_elsewhere(format!(
            "/metrics is served over TLS to authorized readers on port {}",
            secure.port()
        ))
        .serve(listener, shutdown)
        .await
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 39 item 4: the fleet gauges the alerts read, from the HostedOLM store.
    #[test]
    fn fleet_gauges_per_hosted_olm() {
        use crate::hostedolm::{CatalogStatus, HostedOLM, HostedOLMStatus};
        let m = Metrics::default();
        assert!(
            !m.encode().contains("hcp_olm_hosted_olm_condition{"),
            "none before the store"
        );
        let cond = |t: &str, st: &str| k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition {
            type_: t.into(),
            status: st.into(),
            reason: "R".into(),
            message: String::new(),
            observed_generation: None,
            last_transition_time: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
            ),
        };
        let catalog = |name: &str, state: Option<&str>, enabled: bool| CatalogStatus {
            name: name.into(),
            enabled,
            source: Some("x:50051".into()),
            connection_state: state.map(str::to_string),
            ..Default::default()
        };
        let mut h = HostedOLM::new("a", Default::default());
        h.metadata.namespace = Some("clusters-a".into());
        h.status = Some(HostedOLMStatus {
            conditions: vec![cond("Available", "False"), cond("Degraded", "True")],
            catalogs: vec![
                catalog("redhat-operators", Some("TRANSIENT_FAILURE"), true),
                catalog("certified-operators", Some("READY"), true),
                catalog("community-operators", None, false),
            ],
            ..Default::default()
        });
        let one = Arc::new(h);
        m.set_fleet_source(Box::new(move || vec![Arc::clone(&one)]));
        let text = m.encode();
        for line in [
            "hcp_olm_hosted_olm_condition{namespace=\"clusters-a\",name=\"a\",condition=\"Available\"} 0",
            "hcp_olm_hosted_olm_condition{namespace=\"clusters-a\",name=\"a\",condition=\"Degraded\"} 1",
            "hcp_olm_hosted_olm_condition{namespace=\"clusters-a\",name=\"a\",condition=\"Upgradeable\"} 0",
            "hcp_olm_hosted_olm_catalogs_not_ready{namespace=\"clusters-a\",name=\"a\"} 1",
            "# TYPE hcp_olm_hosted_olm_condition gauge",
        ] {
            assert!(text.lines().any(|l| l == line), "{line} missing:\n{text}");
        }
    }

    #[test]
    fn healthz_fails_only_when_running_reconciles_stop_finishing() {
        let m = Metrics::with_stall_limit(Duration::from_secs(60));
        let t0 = Instant::now();
        // idle for longer than the limit: healthy
        assert_eq!(m.stalled(t0 + Duration::from_secs(3600)), None);
        m.reconcile_started_at(t0 + Duration::from_secs(3600));
        assert_eq!(m.stalled(t0 + Duration::from_secs(3630)), None);
        m.reconcile_started_at(t0 + Duration::from_secs(3640));
        m.reconcile_finished_at(t0 + Duration::from_secs(3650));
        // one still running, progress 50 s ago
        assert_eq!(m.stalled(t0 + Duration::from_secs(3700)), None);
        assert_eq!(
            m.stalled(t0 + Duration::from_secs(3711)),
            Some(Duration::from_secs(61))
        );
        m.reconcile_finished_at(t0 + Duration::from_secs(3712));
        assert_eq!(m.stalled(t0 + Duration::from_secs(9999)), None);
        assert_eq!(m.health(), Ok("ok".to_string()));
        let stuck = Metrics::with_stall_limit(Duration::from_millis(1));
        stuck.reconcile_started_at(Instant::now() - Duration::from_secs(5));
        let why = stuck.health().unwrap_err();
        assert!(
            why.starts_with("reconcile loop stalled: 1 reconciles running"),
            "{why}"
        );
    }

    #[test]
    fn metric_names_follow_prometheus_conventions() {
        let m = Metrics::default();
        m.observe("applied", Duration::from_millis(5));
        m.error("ApplyFailed", Duration::from_millis(5));
        m.writes(3, 2, true);
        let text = m.encode();
        for want in [
            "hcp_olm_build_info{version=",
            "hcp_olm_reconciles_total{result=\"applied\"} 1",
            "hcp_olm_reconcile_errors_total{reason=\"ApplyFailed\"} 1",
            "hcp_olm_reconcile_duration_seconds_bucket",
            "hcp_olm_apply_writes_total{cluster=\"management\",what=\"objects\"} 3",
            "hcp_olm_apply_writes_total{cluster=\"guest\",what=\"objects\"} 2",
            "hcp_olm_apply_writes_total{cluster=\"management\",what=\"status\"} 1",
            "hcp_olm_leader 0",
        ] {
            assert!(text.contains(want), "{want} missing in\n{text}");
        }
        for line in text
            .lines()
            .filter(|l| !l.starts_with('#') && !l.is_empty())
        {
            assert!(line.starts_with("hcp_olm_"), "unprefixed series: {line}");
        }
    }

    #[test]
    fn ready_after_sync_unless_standby() {
        let m = Metrics::default();
        m.set_ready(true);
        assert!(!m.serving(), "no caches yet");
        assert_eq!(m.readiness(), Err("not ready".to_string()));
        m.set_synced(true);
        assert!(m.serving());
        m.set_synced(false);
        m.set_leader(Some(false));
        assert!(m.serving(), "a standby is ready without caches");
        assert_eq!(m.readiness(), Ok("ok: standby".to_string()));
        m.set_leader(Some(true));
        assert!(!m.serving(), "a new leader waits for its caches");
        m.set_synced(true);
        assert_eq!(m.readiness(), Ok("ok: leader".to_string()));
    }
}
