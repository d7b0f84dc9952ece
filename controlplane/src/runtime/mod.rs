//! The controller runtime: reads the clusters, composes the pure pieces of this crate
//! and writes the result.
//!
//! - [`reconcile`]: [`reconcile::reconcile_one`] for one HostedCluster, and the
//!   finalizer cleanup;
//! - [`facts`]: release version and catalog images (registry lookups);
//! - [`secrets`]: PKI and tunnel keys persisted in the HCP namespace;
//! - [`controller`]: the kube-runtime `Controller` loop behind `hcp-olm-controller run`;
//! - [`pods`]: why a component's pods are not ready (image pulls, scheduling, crashes);
//! - [`metrics`]: Prometheus metrics and the admin HTTP endpoints;
//! - [`leader`]: leader election with a `coordination.k8s.io/v1` Lease;
//! - [`events`]: Kubernetes Events on HostedOLM condition transitions;
//! - [`uninstall`]: the finalizer's cleanup for every HostedCluster at once;
//! - [`shared`]: the shared catalogs' pass (issue 18).

pub mod components;
pub mod controller;
pub mod events;
pub mod facts;
pub mod guest;
pub mod guest_reads;
pub mod kinds;
pub mod leader;
pub mod metrics;
pub mod pods;
pub mod reconcile;
pub mod secrets;
pub mod secure_metrics;
pub mod shared;
pub mod stores;
pub mod uninstall;

use std::sync::Arc;
use std::time::Duration;

use crate::validate::ControllerDefaults;

/// Field manager of every write (server-side apply and status).
pub const FIELD_MANAGER: &str = "hcp-olm";
/// Finalizer on HostedClusters: our objects in both clusters are removed first.
pub const FINALIZER: &str = "hcp-olm.io/cleanup";
/// Key of the kubeconfig in HyperShift's admin kubeconfig Secret (`status.kubeconfig`).
pub const ADMIN_KUBECONFIG_KEY: &str = "kubeconfig";

/// How the runtime is set up (flags of `run`).
#[derive(Clone, Debug, Default)]
pub struct Config {
    pub defaults: ControllerDefaults,
    /// OLM image to use when the HostedOLM does not override it; None takes the
    /// release payload's operator-lifecycle-manager image (needs `oci`).
    pub olm_image: Option<String>,
    /// operator-registry image (falls back to the OLM image).
    pub operator_registry_image: Option<String>,
    /// Registry client for release labels and catalog tag lookups; None means the
    /// release version comes from `status.version.desired.version` and catalog tags
    /// are assumed to exist.
    pub oci: Option<Arc<hcp_olm_oci::Client>>,
    /// Image with OLM's `copy-content` for the shared catalogs' init container (None:
    /// [`shared::DEFAULT_UTILITIES_IMAGE`]). The controller's, never a hosted cluster's.
    pub shared_utilities_image: Option<String>,
    /// Pull secret in `hcp-olm-catalogs` for the shared catalog pods (None: the nodes').
    pub shared_pull_secret: Option<String>,
    /// Whether `oci` carries credentials of the controller (`--pull-secret-file`): then a
    /// lookup made without a cluster's own pull secret proves nothing about that cluster.
    pub controller_registry_credentials: bool,
    /// Which addresses a guest kubeconfig's `server:` may lead to (issue 35; default:
    /// no loopback, link-local, unspecified or multicast address).
    pub guest_servers: guest::ServerPolicy,
    /// `--registry-mirror-entitles`: an administrator's mirror answering without
    /// credentials proves a cluster may read a shared catalog (else the default registry
    /// is asked with the cluster's pull secret; see [`facts::entitlement`]).
    pub mirror_answers_entitle: bool,
    /// The HostedClusters managed (`--hosted-cluster-selector`; default: all). Outside it a
    /// HostedCluster is untouched; one that leaves it is cleaned up (issue 37 item 1).
    pub scope: crate::scope::Scope,
    /// What to do beside HyperShift's own OLM where a HostedOLM does not say
    /// (`--hypershift-olm`; default StandDown).
    pub hypershift_olm: crate::hostedolm::HyperShiftOLMMode,
}

/// When HostedClusters are looked at again (flags of `run`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Schedule {
    /// Requeue of a converged HostedCluster (drift correction; no writes when nothing
    /// drifted).
    pub resync: Duration,
    /// Requeue while waiting for something outside our control (guest kubeconfig,
    /// guest OLM CRDs, HCP namespace). Secret changes trigger earlier.
    pub waiting: Duration,
    /// How long registry answers (catalog tag → digest, release version label) are
    /// reused; after that the next reconcile looks them up again, and a changed digest
    /// rolls the catalog Deployment.
    pub catalog_refresh: Duration,
    /// How long each phase of a tunnel key rotation is held: longer than a changed Secret
    /// takes to reach the mounted volumes of the gateway and the agent (the kubelet's
    /// sync period plus its cache TTL, about a minute by default).
    pub key_propagation: Duration,
}

impl Default for Schedule {
    fn default() -> Self {
        Self {
            resync: Duration::from_secs(300),
            waiting: Duration::from_secs(30),
            catalog_refresh: Duration::from_secs(15 * 60),
            key_propagation: Duration::from_secs(180),
        }
    }
}

/// Shared state of reconciles.
#[derive(Clone)]
pub struct Context {
    /// Management-cluster client.
    pub client: kube::Client,
    pub config: Config,
    pub metrics: Arc<metrics::Metrics>,
    /// Requeue intervals and the registry-answer lifetime.
    pub schedule: Schedule,
    /// Registry answers shared by all HostedClusters (see [`Schedule::catalog_refresh`]).
    pub lookups: facts::LookupCache,
    /// Events on HostedOLM condition transitions (None: no events).
    pub events: Option<events::Events>,
    /// Consecutive failures per HostedCluster (`namespace/name`), for backoff.
    failures: Arc<std::sync::Mutex<std::collections::HashMap<String, u32>>>,
    /// The warnings last reported per HostedCluster (`namespace/name`), so a lasting one is
    /// an Event once, not one per resync.
    warned: Arc<std::sync::Mutex<std::collections::HashMap<String, Vec<String>>>>,
    /// Metadata of our objects in the management cluster, kept by watches while the
    /// controller loop runs (None before it starts and after it stops: reads go to the API
    /// server).
    mgmt_cache: Arc<std::sync::Mutex<Option<Arc<hcp_olm_apply::cache::WatchCache>>>>,
    /// resourceVersion of our last HostedOLM status write per `namespace/name`, until the
    /// store has caught up with it (so a pass right after the write does not compare
    /// against the old status and write it again).
    status_rv: Arc<std::sync::Mutex<std::collections::HashMap<String, u64>>>,
    /// Watch-fed stores of what a reconcile reads (see [`stores`]), alongside `mgmt_cache`.
    stores: Arc<std::sync::Mutex<Option<Arc<stores::ManagementStores>>>>,
    /// Discovery answers (is `resource` of `group/version` served by the management
    /// cluster?) shared by every pass for [`DISCOVERY_TTL`]: the answer is a property of the
    /// management cluster, not of a HostedCluster, so N clusters' resyncs ask once per TTL
    /// instead of twice per pass. Only successful answers are kept.
    discovery: moka::future::Cache<(String, String), bool>,
    /// The digests hosted clusters resolved for the shared catalogs they use.
    pub shared_digests: shared::SharedDigests,
    /// The HCP namespaces the shared catalogs' live NetworkPolicies admitted when this
    /// process first looked (see [`shared::confirmed_users`]).
    pub shared_admitted: shared::AdmittedAtStart,
    /// Each guest's client and cache, kept across passes (see [`guest`]).
    pub guests: guest::Sessions,
}

/// How long a discovery answer is reused (a ServiceMonitor or SCC kind installed later is
/// noticed within this).
pub const DISCOVERY_TTL: Duration = Duration::from_secs(60);

impl Context {
    pub fn new(client: kube::Client, config: Config) -> Self {
        Self {
            events: Some(events::Events::new(client.clone(), events::reporter())),
            client,
            config,
            metrics: Arc::new(metrics::Metrics::default()),
            schedule: Schedule::default(),
            lookups: facts::LookupCache::default(),
            failures: Arc::default(),
            warned: Arc::default(),
            mgmt_cache: Arc::default(),
            stores: Arc::default(),
            status_rv: Arc::default(),
            discovery: moka::future::Cache::builder()
                .max_capacity(16)
                .time_to_live(DISCOVERY_TTL)
                .build(),
            shared_digests: shared::SharedDigests::default(),
            shared_admitted: shared::AdmittedAtStart::default(),
            guests: guest::Sessions::default(),
        }
    }

    /// Whether the management cluster serves `resource` of `group_version` (prometheus-
    /// operator's ServiceMonitors, OpenShift's SecurityContextConstraints), from the
    /// discovery cache when answered within [`DISCOVERY_TTL`]. Only a 404 means "not
    /// served"; any other failure is an error (the pass fails and is retried, nothing is
    /// cached), so a discovery hiccup never prunes the ServiceMonitors or changes the pods'
    /// users.
    pub async fn served(&self, group_version: &str, resource: &str) -> Result<bool, Error> {
        let key = (group_version.to_string(), resource.to_string());
        if let Some(v) = self.discovery.get(&key).await {
            return Ok(v);
        }
        let v = match self.client.list_api_group_resources(group_version).await {
            Ok(list) => list.resources.iter().any(|r| r.name == resource),
            Err(kube::Error::Api(s)) if s.code == 404 => false,
            Err(e) => return Err(kube_err(format!("discovering {group_version}"))(e)),
        };
        self.discovery.insert(key, v).await;
        Ok(v)
    }

    /// Remembers the resourceVersion our status write of HostedOLM `key` produced.
    pub(crate) fn status_written(&self, key: &str, rv: Option<&str>) {
        let mut m = self.status_rv.lock().unwrap_or_else(|p| p.into_inner());
        match rv.and_then(|r| r.parse().ok()) {
            Some(rv) => {
                m.insert(key.to_string(), rv);
            }
            None => {
                m.remove(key);
            }
        }
    }

    /// Whether a stored HostedOLM `key` at `rv` includes our last status write (then it
    /// can stand in for a GET). resourceVersions are compared as the etcd revisions the
    /// kube-apiserver uses; anything unparseable means no.
    pub(crate) fn status_seen(&self, key: &str, rv: Option<&str>) -> bool {
        let mut m = self.status_rv.lock().unwrap_or_else(|p| p.into_inner());
        let Some(want) = m.get(key).copied() else {
            return true;
        };
        match rv.and_then(|r| r.parse::<u64>().ok()) {
            Some(have) if have >= want => {
                m.remove(key);
                true
            }
            _ => false,
        }
    }

    /// A Secret, from the stores when its current resourceVersion was read before (no
    /// request), else from the API server (and kept for the next pass).
    /// Seeds the Secret data cache with Secrets this process has just written (the applier's
    /// answers): [`Self::read_secret`] returns them without a GET while their
    /// resourceVersion is the one the watch reports.
    pub async fn remember_written_secrets(&self, written: Vec<kube::api::DynamicObject>) {
        let Some(stores) = self.stores() else {
            return;
        };
        for o in written {
            let (Some(ns), Some(name)) = (o.metadata.namespace.clone(), o.metadata.name.clone())
            else {
                continue;
            };
            let Ok(mut secret) = serde_json::to_value(&o)
                .and_then(serde_json::from_value::<k8s_openapi::api::core::v1::Secret>)
            else {
                continue;
            };
            secret.metadata.managed_fields = None;
            stores
                .secret_data
                .insert((ns, name), Arc::new(secret))
                .await;
        }
    }

    pub async fn read_secret(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<Option<k8s_openapi::api::core::v1::Secret>, kube::Error> {
        let api: kube::Api<k8s_openapi::api::core::v1::Secret> =
            kube::Api::namespaced(self.client.clone(), namespace);
        let Some(stores) = self.stores() else {
            return api.get_opt(name).await;
        };
        let key = (namespace.to_string(), name.to_string());
        // What this process last read or wrote of it, with that resourceVersion.
        let remembered = stores
            .secret_data
            .get(&key)
            .await
            .filter(|s| s.metadata.resource_version.is_some());
        let same = |rv: Option<&str>| {
            remembered
                .as_ref()
                .filter(|s| rv.is_some() && s.metadata.resource_version.as_deref() == rv)
                .map(|s| s.as_ref().clone())
        };
        match stores.secrets.get(Some(namespace), name) {
            Some(Some(current)) => {
                if let Some(s) = same(current.metadata.resource_version.as_deref()) {
                    return Ok(Some(s));
                }
            }
            // Absent: the store's watch wakes the HostedCluster once a Secret appears, so
            // absent is the answer, unless it is one of ours that we wrote a moment ago
            // (the applier's cache, which holds our own writes at once, says so: then the
            // data we wrote is the answer, when we remember that very version).
            Some(None) => {
                let secret = kinds::api_resource("v1", "Secret", "secrets");
                match self
                    .mgmt_cache()
                    .and_then(|c| c.get(&secret, Some(namespace), name))
                {
                    Some(None) => return Ok(None),
                    Some(Some(ours)) => {
                        if let Some(s) = same(ours["metadata"]["resourceVersion"].as_str()) {
                            return Ok(Some(s));
                        }
                    }
                    None => {}
                }
            }
            None => {}
        }
        let live = api.get_opt(name).await?;
        match &live {
            Some(s) => {
                let mut kept = s.clone();
                kept.metadata.managed_fields = None;
                stores.secret_data.insert(key, Arc::new(kept)).await
            }
            None => stores.secret_data.invalidate(&key).await,
        }
        Ok(live)
    }

    /// The management stores, when they run.
    pub fn stores(&self) -> Option<Arc<stores::ManagementStores>> {
        self.stores
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// The management cache, when one runs.
    pub fn mgmt_cache(&self) -> Option<Arc<hcp_olm_apply::cache::WatchCache>> {
        self.mgmt_cache
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Starts the management cache (metadata watches of every kind we render into HCP
    /// namespaces, selected by our managed-by label) and the [`stores`], and waits up to
    /// `timeout` for their first lists; until then, and for kinds not served, reads go to
    /// the API server. `wake`, when given, is called after a cache or store holds a change
    /// (the controller maps it to HostedClusters to reconcile).
    pub async fn start_mgmt_cache(&self, timeout: Duration, wake: Option<stores::Wake>) {
        // Guests get caches of their own, started with each guest's session.
        self.guests.enable_caches();
        // Our kinds in HCP namespaces, and namespaces we create (the shared catalogs'), so
        // a converged shared-catalog pass reads nothing either.
        let kinds: Vec<_> = reconcile::hcp_kinds()
            .into_iter()
            .map(|(r, _)| r)
            .chain([kinds::api_resource("v1", "Namespace", "namespaces")])
            .collect();
        let on_change = wake.clone().map(|w| {
            Arc::new(move |m: &kube::core::ObjectMeta| w(stores::Changed::Labelled(m)))
                as hcp_olm_apply::cache::OnChange
        });
        let cache = hcp_olm_apply::cache::WatchCache::start_with(
            &self.client,
            &kinds,
            &format!(
                "{}={}",
                crate::render::labels::MANAGED_BY_KEY,
                crate::render::labels::MANAGED_BY
            ),
            FIELD_MANAGER,
            on_change,
        );
        let cache = Arc::new(cache);
        *self.mgmt_cache.lock().unwrap_or_else(|p| p.into_inner()) = Some(cache.clone());
        let stores = Arc::new(stores::ManagementStores::start(
            &self.client,
            reconcile::HYPERSHIFT_OLM_DEPLOYMENTS,
            wake,
        ));
        *self.stores.lock().unwrap_or_else(|p| p.into_inner()) = Some(stores.clone());
        // The fleet gauges read this store (weakly: a store replaced later stops its watches).
        let weak = Arc::downgrade(&stores);
        self.metrics.set_fleet_source(Box::new(move || {
            weak.upgrade()
                .map(|s| s.hosted_olms.all())
                .unwrap_or_default()
        }));
        let until = std::time::Instant::now() + timeout;
        while !stores.synced() && std::time::Instant::now() < until {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        if !cache
            .wait_settled(until.saturating_duration_since(std::time::Instant::now()))
            .await
            || !stores.synced()
        {
            tracing::info!(cache = ?cache, stores = ?stores, "management caches not fully synced yet; what is not synced is read from the API server");
        }
    }

    /// Stops the management cache (reads go to the API server again).
    pub fn stop_mgmt_cache(&self) {
        self.guests.stop();
        *self.mgmt_cache.lock().unwrap_or_else(|p| p.into_inner()) = None;
        *self.stores.lock().unwrap_or_else(|p| p.into_inner()) = None;
    }

    /// Whether `warnings` for `cluster` differ from the ones last reported (and remember
    /// them). An empty list forgets the cluster.
    pub fn warnings_changed(&self, cluster: &str, warnings: &[String]) -> bool {
        let mut w = self.warned.lock().unwrap_or_else(|p| p.into_inner());
        if warnings.is_empty() {
            w.remove(cluster);
            return false;
        }
        if w.get(cluster).is_some_and(|old| old.as_slice() == warnings) {
            return false;
        }
        w.insert(cluster.to_string(), warnings.to_vec());
        true
    }

    /// Replace the schedule.
    pub fn with_schedule(mut self, schedule: Schedule) -> Self {
        self.schedule = schedule;
        self
    }

    /// Replace the metrics (e.g. with another `/healthz` stall limit).
    pub fn with_metrics(mut self, metrics: metrics::Metrics) -> Self {
        self.metrics = Arc::new(metrics);
        self
    }

    /// Disable (None) or replace the event recorder.
    pub fn with_events(mut self, events: Option<events::Events>) -> Self {
        self.events = events;
        self
    }

    /// Exponential backoff after a failure: 1s, 2s, 4s, ... capped at 5 minutes.
    pub fn next_backoff(&self, key: &str) -> std::time::Duration {
        let mut f = self.failures.lock().unwrap_or_else(|p| p.into_inner());
        let n = f.entry(key.to_string()).or_insert(0);
        *n = n.saturating_add(1);
        std::time::Duration::from_secs(1u64 << (*n - 1).min(8))
            .min(std::time::Duration::from_secs(300))
    }

    /// Forget failures after a successful reconcile.
    pub fn reset_backoff(&self, key: &str) {
        let mut f = self.failures.lock().unwrap_or_else(|p| p.into_inner());
        f.remove(key);
    }
}

/// A reconcile failure (retried with backoff by the controller).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{what}: {source}")]
    Kube {
        what: String,
        #[source]
        source: kube::Error,
    },
    #[error("rendering: {0}")]
    Render(#[from] crate::render::RenderError),
    #[error("certificates: {0}")]
    Cert(#[from] crate::certs::CertError),
    #[error("{cluster} cluster: {count} object(s) failed: {first}")]
    Apply {
        cluster: &'static str,
        count: usize,
        first: String,
    },
    #[error("tunnel keys: {0}")]
    Keys(String),
    #[error("HostedCluster {0} has no namespace or name")]
    Identity(String),
    #[error("the pass took longer than {0:?} and was stopped; it is retried")]
    PassTimeout(Duration),
}

impl Error {
    /// A short machine-readable reason (metrics label).
    pub fn reason(&self) -> &'static str {
        match self {
            Error::Kube { .. } => "KubeError",
            Error::Render(_) => "RenderError",
            Error::Cert(_) => "CertError",
            Error::Apply { .. } => "ApplyFailed",
            Error::PassTimeout(_) => "PassTimeout",
            Error::Keys(_) => "TunnelKeysError",
            Error::Identity(_) => "MissingClusterIdentity",
        }
    }
}

pub(crate) fn kube_err(what: impl Into<String>) -> impl FnOnce(kube::Error) -> Error {
    let what = what.into();
    move |source| Error::Kube { what, source }
}
