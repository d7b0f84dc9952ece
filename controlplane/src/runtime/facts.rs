//! Facts from outside the HostedCluster: the release version (release image label)
//! and catalog images (registry lookups, prefetched so selection stays pure).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::catalogs::{
    self, AssumeTagsExist, CatalogImage, CatalogImageError, DefaultCatalog, ImageLookup,
    LookupResult, StaticLookup,
};
use crate::hostedcluster::HostedCluster;
use crate::hostedolm::CatalogPlacement;
use crate::validate::{PayloadProblem, ReleaseFacts, ValidInput};

use super::Config;

/// How long a pass waits for registry answers it does not have yet (release facts and
/// catalog images each; their lookups run concurrently). A lookup that takes longer goes on
/// in the background, bounded by [`LOOKUP_DEADLINE`], and wakes the HostedClusters that
/// waited for it when it ends; the pass goes on without it. So a slow or hostile registry
/// (a tenant's mirror) holds none of the controller's reconcile slots for longer than this
/// (issue 35 item 5).
pub const LOOKUP_WAIT: Duration = Duration::from_secs(2);
/// Deadline of one lookup in all: every request, challenge and layer it makes.
pub const LOOKUP_DEADLINE: Duration = Duration::from_secs(60);
/// A failed lookup is not tried again for this long after its first failure, doubling with
/// each further failure up to [`FAILURE_BACKOFF_MAX`] (and never longer than the answer
/// lifetime), each wait with ±20 % jitter, so a hostile payload is not read again every
/// pass and many failing clusters do not retry in step.
pub const FAILURE_BACKOFF_MIN: Duration = Duration::from_secs(10);
/// The longest wait before a failed lookup is tried again.
pub const FAILURE_BACKOFF_MAX: Duration = Duration::from_secs(600);
/// Lookups at one registry (the registry an image reference names; its mirrors are asked
/// on its behalf) running at once, across every HostedCluster: a controller restart with a
/// thousand clusters of different pull secrets (one cache key each) queues at the
/// registry's door instead of opening thousands of connections (issue 38 item 4). A queued
/// lookup counts against its [`LOOKUP_DEADLINE`].
pub const REGISTRY_CONCURRENCY: usize = 16;
/// An answer is reused for its lifetime less up to this fraction, drawn per answer, so
/// answers fetched together (a restart) do not all expire together, and none is used
/// longer than the refresh interval.
pub const REFRESH_JITTER: f64 = 0.2;

/// Wakes a HostedCluster (namespace, name): set by the controller loop, called when a
/// background lookup it waited for has ended.
pub type LookupWaker = Arc<dyn Fn(&str, &str) + Send + Sync>;

/// Registry answers shared by every HostedCluster, each reused for a lifetime (the
/// catalog refresh interval): 1000 hosted clusters on a few releases need a few
/// lookups, not thousands. Keys hold everything that changes an answer: the image and
/// [`hcp_olm_oci::Client::cache_key`] (a hash of the cluster's mirrors and credentials),
/// so one tenant's mirror never answers for another. Concurrent misses for one key
/// make one lookup (single flight), run as a task of its own (see [`LOOKUP_WAIT`]).
/// Failures are remembered under the same key with backoff ([`FAILURE_BACKOFF_MIN`]), so
/// one tenant's failing mirror or credentials never stand for another's. Bounded: at most
/// [`LookupCache::CAPACITY`] fresh answers, as many failures and last good payload
/// answers, and one lookup under way per key.
#[derive(Clone)]
pub struct LookupCache {
    /// Answers: (fetched at, the answer, the fraction of the lifetime cut off, drawn
    /// from [0, [`REFRESH_JITTER`]]).
    fresh: moka::future::Cache<String, (Instant, Cached, f64)>,
    /// The last good release payload answer per key, served when the payload cannot
    /// be read now (documented in docs/controller.md).
    last_good: moka::future::Cache<String, Arc<BTreeMap<String, String>>>,
    /// Failed lookups: (not before, consecutive failures, the failure).
    failed: moka::future::Cache<String, (Instant, u32, Failure)>,
    /// One semaphore of [`REGISTRY_CONCURRENCY`] permits per registry (at most
    /// [`LookupCache::CAPACITY`] registries; one evicted while in use is made again, so
    /// that registry briefly gets twice the permits).
    registries: moka::future::Cache<String, Arc<tokio::sync::Semaphore>>,
    /// Lookups under way, by key.
    inflight: Arc<std::sync::Mutex<std::collections::HashMap<String, InFlight>>>,
    waker: Arc<std::sync::RwLock<Option<LookupWaker>>>,
    /// [`LOOKUP_WAIT`] and [`LOOKUP_DEADLINE`] (shorter in unit tests).
    wait: Duration,
    deadline: Duration,
}

type Shared = futures::future::Shared<futures::future::BoxFuture<'static, Result<Cached, Failure>>>;

/// One lookup under way: its answer, and the HostedClusters to wake when it ends.
struct InFlight {
    answer: Shared,
    waiting: Vec<(String, String)>,
}

impl std::fmt::Debug for LookupCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LookupCache")
            .field("fresh", &self.fresh.entry_count())
            .field("last_good", &self.last_good.entry_count())
            .field("failed", &self.failed.entry_count())
            .finish()
    }
}

impl Default for LookupCache {
    fn default() -> Self {
        Self {
            fresh: moka::future::Cache::new(Self::CAPACITY),
            last_good: moka::future::Cache::new(Self::CAPACITY),
            failed: moka::future::Cache::new(Self::CAPACITY),
            registries: moka::future::Cache::new(Self::CAPACITY),
            inflight: Default::default(),
            waker: Default::default(),
            wait: LOOKUP_WAIT,
            deadline: LOOKUP_DEADLINE,
        }
    }
}

#[derive(Clone, Debug)]
enum Cached {
    Catalog(LookupResult),
    Release(String),
    /// Component → image of a release payload (`image-references`).
    Payload(Arc<BTreeMap<String, String>>),
    /// Whether a catalog answer proves the cluster may read the image (see
    /// [`entitlement`]).
    Entitled(bool),
}

/// Why a lookup has no answer.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Failure {
    /// A release or payload lookup failed.
    Problem(PayloadProblem),
    /// A catalog lookup failed.
    Message(String),
    /// Still under way after [`LOOKUP_WAIT`] (never cached).
    Pending,
}

/// The wait before failed lookup number `n` (1 = the first failure) is tried again.
fn failure_backoff(n: u32, ttl: Duration, jitter: f64) -> Duration {
    let base = FAILURE_BACKOFF_MIN
        .saturating_mul(1u32 << n.saturating_sub(1).min(16))
        .min(FAILURE_BACKOFF_MAX)
        .min(ttl);
    base.mul_f64((1.0 + jitter.clamp(-0.2, 0.2)).max(0.0))
}

/// A uniform value in [-0.2, 0.2] (0 when the system has no randomness to give).
fn jitter() -> f64 {
    let r = getrandom::u32().unwrap_or(u32::MAX / 2);
    (f64::from(r) / f64::from(u32::MAX) - 0.5) * 0.4
}

impl LookupCache {
    /// Fresh answers held at most (and as many failures and last good payload answers).
    pub const CAPACITY: u64 = 4096;

    /// A slot for one lookup at `image`'s registry (see [`REGISTRY_CONCURRENCY`]); held
    /// until dropped. None when the semaphore was closed (never: it is not closed).
    async fn registry_slot(&self, image: &str) -> Option<tokio::sync::OwnedSemaphorePermit> {
        let registry = registry_of(image).unwrap_or_default();
        let s = self
            .registries
            .get_with(registry, async {
                Arc::new(tokio::sync::Semaphore::new(REGISTRY_CONCURRENCY))
            })
            .await;
        s.acquire_owned().await.ok()
    }

    /// Wake HostedClusters through `waker` when a lookup they waited for ends (the
    /// controller loop sets it; replaced when set again).
    pub fn set_waker(&self, waker: LookupWaker) {
        *self.waker.write().unwrap_or_else(|p| p.into_inner()) = Some(waker);
    }

    /// The answer for `key`: fresh from the cache when younger than `ttl`, the remembered
    /// failure while its backoff lasts, else from `fetch`: one task for all concurrent
    /// callers of a key, awaited for at most [`LOOKUP_WAIT`] ([`Failure::Pending`] after
    /// that; `who` is woken when it ends). `ttl` zero: no caching, `fetch` is awaited
    /// (within [`LOOKUP_DEADLINE`]).
    async fn get_or_fetch<F>(
        &self,
        key: String,
        ttl: Duration,
        who: (String, String),
        fetch: F,
    ) -> Result<Cached, Failure>
    where
        F: std::future::Future<Output = Result<Cached, Failure>> + Send + 'static,
    {
        if ttl.is_zero() {
            return tokio::time::timeout(self.deadline, fetch)
                .await
                .unwrap_or_else(|_| Err(deadline_failure(&key, self.deadline)));
        }
        if let Some((at, v, cut)) = self.fresh.get(&key).await {
            if at.elapsed() < ttl.mul_f64(1.0 - cut) {
                return Ok(v);
            }
            self.fresh.invalidate(&key).await;
        }
        let failed = self.failed.get(&key).await;
        if let Some((not_before, _, failure)) = &failed
            && Instant::now() < *not_before
        {
            return Err(failure.clone());
        }
        // A failure remembered from the attempt before (its backoff over) stands until the
        // next attempt answers, so a registry that keeps timing out is reported as failing,
        // not as merely slow, on every pass.
        let previous = failed.map(|(_, _, f)| f);
        let answer = {
            let mut inflight = self.inflight.lock().unwrap_or_else(|p| p.into_inner());
            let f = inflight.entry(key.clone()).or_insert_with(|| InFlight {
                answer: self.spawn_lookup(key.clone(), ttl, fetch),
                waiting: Vec::new(),
            });
            // No wait when `who` already waited for this lookup in an earlier pass (it is
            // woken when the lookup ends), and a tenth of it for the retry of a lookup that
            // failed: a slow or failing registry holds a reconcile slot for one wait per
            // lookup, not for one per pass (issue 35 item 5's fairness), while a registry
            // that has recovered still answers within the pass.
            if f.waiting.contains(&who) {
                return Err(previous.unwrap_or(Failure::Pending));
            }
            f.answer.clone()
        };
        let wait = if previous.is_some() {
            self.wait / 10
        } else {
            self.wait
        };
        if let Ok(r) = tokio::time::timeout(wait, answer.clone()).await {
            return r;
        }
        {
            let mut inflight = self.inflight.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(f) = inflight.get_mut(&key) {
                if !f.waiting.contains(&who) {
                    f.waiting.push(who);
                }
                return Err(previous.unwrap_or(Failure::Pending));
            }
        }
        // It ended between the wait and the registration.
        futures::FutureExt::now_or_never(answer).unwrap_or(Err(Failure::Pending))
    }

    /// Runs `fetch` as a task of its own (bounded by [`LOOKUP_DEADLINE`]) that records its
    /// answer or failure, leaves the in-flight map and wakes whoever waited.
    fn spawn_lookup<F>(&self, key: String, ttl: Duration, fetch: F) -> Shared
    where
        F: std::future::Future<Output = Result<Cached, Failure>> + Send + 'static,
    {
        let cache = self.clone();
        let task = tokio::spawn(async move {
            let r = tokio::time::timeout(cache.deadline, fetch)
                .await
                .unwrap_or_else(|_| Err(deadline_failure(&key, cache.deadline)));
            match &r {
                Ok(v) => {
                    cache
                        .fresh
                        .insert(
                            key.clone(),
                            (
                                Instant::now(),
                                v.clone(),
                                (jitter() + 0.2) / 0.4 * REFRESH_JITTER,
                            ),
                        )
                        .await;
                    cache.failed.invalidate(&key).await;
                }
                Err(f) => {
                    let n = cache
                        .failed
                        .get(&key)
                        .await
                        .map_or(0, |(_, n, _)| n)
                        .saturating_add(1);
                    let wait = failure_backoff(n, ttl, jitter());
                    tracing::debug!(%key, failures = n, retry_in = ?wait, "registry lookup failed; remembered");
                    cache
                        .failed
                        .insert(key.clone(), (Instant::now() + wait, n, f.clone()))
                        .await;
                }
            }
            let waiting = cache
                .inflight
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .remove(&key)
                .map(|f| f.waiting)
                .unwrap_or_default();
            let waker = cache
                .waker
                .read()
                .unwrap_or_else(|p| p.into_inner())
                .clone();
            if let Some(wake) = waker {
                for (ns, name) in &waiting {
                    wake(ns, name);
                }
            }
            r
        });
        futures::FutureExt::shared(futures::FutureExt::boxed(async move {
            task.await
                .unwrap_or_else(|e| Err(Failure::Message(format!("registry lookup task: {e}"))))
        }))
    }
}

fn deadline_failure(key: &str, deadline: Duration) -> Failure {
    let message = format!("registry lookup not complete within {deadline:?}");
    if key.starts_with("catalog:") {
        Failure::Message(message)
    } else {
        Failure::Problem(PayloadProblem::Unreadable(message))
    }
}

/// (namespace, name) of a HostedCluster, for waking it.
fn who(hc: &HostedCluster) -> (String, String) {
    (
        hc.metadata.namespace.clone().unwrap_or_default(),
        hc.metadata.name.clone().unwrap_or_default(),
    )
}

/// The registry client for one HostedCluster: the controller's, with the
/// HostedCluster's `imageContentSources` as extra mirrors and its own pull secret
/// (when read) instead of the controller's.
fn oci_for(
    hc: &HostedCluster,
    oci: &hcp_olm_oci::Client,
    pull_secret: Option<&hcp_olm_oci::PullSecret>,
) -> hcp_olm_oci::Client {
    let extra: Vec<hcp_olm_oci::Mirror> = hc
        .spec
        .image_content_sources
        .iter()
        .flatten()
        .map(|s| hcp_olm_oci::Mirror {
            source: s.source.clone(),
            mirrors: s.mirrors.clone(),
        })
        .collect();
    let c = if extra.is_empty() {
        oci.clone()
    } else {
        oci.with_mirrors(&extra)
    };
    match pull_secret {
        Some(ps) => c.with_pull_secret(ps.clone()),
        None => c,
    }
}

/// How a release lookup failed, for the HostedOLM condition.
fn payload_problem(e: &hcp_olm_oci::OciError) -> PayloadProblem {
    match e {
        hcp_olm_oci::OciError::DigestMismatch { .. } => {
            PayloadProblem::DigestMismatch(e.to_string())
        }
        hcp_olm_oci::OciError::TooLarge { .. } => PayloadProblem::TooLarge(e.to_string()),
        e => PayloadProblem::Unreadable(e.to_string()),
    }
}

/// The image whose payload holds the OLM images: `spec.controlPlaneRelease` when
/// set, else `spec.release`.
fn payload_image(hc: &HostedCluster) -> String {
    hc.spec
        .control_plane_release
        .as_ref()
        .map(|r| r.image.clone())
        .filter(|i| !i.is_empty())
        .unwrap_or_else(|| hc.spec.release.image.clone())
}

/// [`release_facts`] with registry answers (version label, payload component
/// images) reused from `cache` for `ttl`. `olm_overridden`: the HostedOLM names an OLM
/// image, so the payload is not read. `pull_secret`: the HostedCluster's own. The two
/// lookups run concurrently, each awaited for at most [`LOOKUP_WAIT`].
pub async fn release_facts_cached(
    hc: &HostedCluster,
    config: &Config,
    pull_secret: Option<&hcp_olm_oci::PullSecret>,
    olm_overridden: bool,
    cache: &LookupCache,
    ttl: Duration,
) -> ReleaseFacts {
    let mut facts = release_facts_without_lookup(hc, config);
    let Some(oci) = config.oci.as_ref() else {
        return facts;
    };
    let oci = oci_for(hc, oci, pull_secret);
    let image = hc.spec.release.image.clone();
    let version = async {
        if image.is_empty() {
            return None;
        }
        let key = format!("release:{}:{image}", oci.cache_key());
        let (oci, image, slots) = (oci.clone(), image.clone(), cache.clone());
        Some(
            cache
                .get_or_fetch(key, ttl, who(hc), async move {
                    let _slot = slots.registry_slot(&image).await;
                    oci.release_version(&image)
                        .await
                        .map(Cached::Release)
                        .map_err(|e| {
                            tracing::warn!(%image, error = %e, "cannot read the release version label");
                            Failure::Problem(payload_problem(&e))
                        })
                })
                .await,
        )
    };
    let read_payload = config.olm_image.is_none() && !olm_overridden;
    let payload = async {
        if read_payload {
            payload_references(&oci, &payload_image(hc), cache, ttl, who(hc)).await
        } else {
            None
        }
    };
    let (got, refs) = futures::join!(version, payload);
    match got {
        Some(Ok(Cached::Release(v))) => facts.version = Some(v),
        // A hostile or oversized answer is reported even when the payload is not
        // read (an OLM image override).
        Some(Err(Failure::Problem(
            p @ (PayloadProblem::DigestMismatch(_) | PayloadProblem::TooLarge(_)),
        ))) => facts.payload_problem = Some(p),
        // Not known (yet): the version HyperShift reports stands.
        _ => {}
    }
    if let Some(refs) = refs {
        payload_images(&mut facts, &payload_image(hc), refs);
    }
    facts
}

/// The release payload's component images (`None`: not read), or why they are unknown.
async fn payload_references(
    oci: &hcp_olm_oci::Client,
    image: &str,
    cache: &LookupCache,
    ttl: Duration,
    who: (String, String),
) -> Option<Result<Arc<BTreeMap<String, String>>, PayloadProblem>> {
    if image.is_empty() {
        return None;
    }
    let key = format!("payload:{}:{image}", oci.cache_key());
    let (c, i, slots) = (oci.clone(), image.to_string(), cache.clone());
    let got = cache
        .get_or_fetch(key.clone(), ttl, who, async move {
            let _slot = slots.registry_slot(&i).await;
            c.release_image_references(&i)
                .await
                .map(|m| Cached::Payload(Arc::new(m)))
                .map_err(|e| Failure::Problem(payload_problem(&e)))
        })
        .await;
    let problem = match got {
        Ok(Cached::Payload(m)) => {
            if !ttl.is_zero() {
                cache.last_good.insert(key, m.clone()).await;
            }
            return Some(Ok(m));
        }
        Ok(_) => return None,
        Err(Failure::Problem(p)) => p,
        Err(Failure::Message(m)) => PayloadProblem::Unreadable(m),
        Err(Failure::Pending) => PayloadProblem::Unreadable(format!(
            "the registry has not answered within {LOOKUP_WAIT:?}; still reading, and the HostedCluster is reconciled again when the lookup ends (at most {LOOKUP_DEADLINE:?})"
        )),
    };
    // A payload that fails its digest is never replaced by an older answer.
    let stale = match problem {
        PayloadProblem::Unreadable(_) | PayloadProblem::TooLarge(_) => {
            cache.last_good.get(&key).await
        }
        _ => None,
    };
    match stale {
        Some(m) => {
            tracing::warn!(%image, error = ?problem, "cannot read the release payload's image references; using the last answer");
            Some(Ok(m))
        }
        None => {
            tracing::warn!(%image, error = ?problem, "cannot read the release payload's image references");
            Some(Err(problem))
        }
    }
}

/// Fills the OLM and operator-registry images from the release payload's answer, or says
/// why not.
fn payload_images(
    facts: &mut ReleaseFacts,
    image: &str,
    refs: Result<Arc<BTreeMap<String, String>>, PayloadProblem>,
) {
    let refs = match refs {
        Ok(m) => m,
        Err(problem) => {
            facts.payload_problem = Some(problem);
            return;
        }
    };
    use hcp_olm_oci::payload::{OLM_COMPONENT, OPERATOR_REGISTRY_COMPONENT};
    match refs.get(OLM_COMPONENT) {
        Some(olm) => {
            facts.olm_image = Some(olm.clone());
        }
        None => {
            facts.payload_problem = Some(PayloadProblem::OLMImageMissing(format!(
                "the release payload {image} names no {OLM_COMPONENT} image ({} components)",
                refs.len()
            )))
        }
    }
    if facts.operator_registry_image.is_none() {
        facts.operator_registry_image = refs.get(OPERATOR_REGISTRY_COMPONENT).cloned();
    }
}

fn release_facts_without_lookup(hc: &HostedCluster, config: &Config) -> ReleaseFacts {
    ReleaseFacts {
        version: hc
            .status
            .as_ref()
            .and_then(|s| s.version.as_ref())
            .and_then(|v| v.desired.as_ref())
            .map(|d| d.version.clone())
            .filter(|v| !v.is_empty()),
        olm_image: config.olm_image.clone(),
        operator_registry_image: config.operator_registry_image.clone(),
        payload_problem: None,
    }
}

/// Release facts: the version from the release image's `io.openshift.release` label
/// when a registry client is configured (falling back to
/// `status.version.desired.version` when the lookup fails); the OLM and
/// operator-registry images from the flags, else from the release payload.
pub async fn release_facts(hc: &HostedCluster, config: &Config) -> ReleaseFacts {
    release_facts_cached(
        hc,
        config,
        None,
        false,
        &LookupCache::default(),
        Duration::ZERO,
    )
    .await
}

/// Choose every enabled catalog's image. With a registry client the candidate tags
/// are looked up first (concurrently); without, tags are assumed to exist.
pub async fn catalog_images(
    hc: &HostedCluster,
    valid: &ValidInput,
    config: &Config,
) -> BTreeMap<DefaultCatalog, Result<CatalogImage, CatalogImageError>> {
    catalog_images_cached(
        hc,
        valid,
        config,
        None,
        &LookupCache::default(),
        Duration::ZERO,
    )
    .await
}

/// [`catalog_images`] with registry answers reused from `cache` for `ttl`, looked up
/// with the HostedCluster's mirrors and `pull_secret`. Guest placement looks nothing
/// up (HyperShift renders tags with registryPoll there).
pub async fn catalog_images_cached(
    hc: &HostedCluster,
    valid: &ValidInput,
    config: &Config,
    pull_secret: Option<&hcp_olm_oci::PullSecret>,
    cache: &LookupCache,
    ttl: Duration,
) -> BTreeMap<DefaultCatalog, Result<CatalogImage, CatalogImageError>> {
    let todo: Vec<DefaultCatalog> = valid
        .enabled_catalogs
        .iter()
        .copied()
        .filter(|c| !valid.catalog_pins.contains_key(c))
        .collect();
    let oci = match &config.oci {
        Some(oci) if valid.placement != CatalogPlacement::Guest => Some(oci),
        _ => None,
    };
    let lookup: Box<dyn ImageLookup + Send + Sync> = match oci {
        None => Box::new(AssumeTagsExist),
        Some(oci) => {
            let oci = oci_for(hc, oci, pull_secret);
            let client_key = oci.cache_key();
            let refs: Vec<String> = todo
                .iter()
                .flat_map(|c| {
                    catalogs::candidates(
                        *c,
                        valid.catalog_minor(),
                        None,
                        valid.catalog_candidates,
                        &valid.registry_overrides,
                    )
                })
                .map(|(_, image)| image)
                .collect();
            let oci = &oci;
            let client_key = &client_key;
            let who = who(hc);
            let who = &who;
            let answers = futures::future::join_all(refs.into_iter().map(|image| async move {
                let key = format!("catalog:{client_key}:{image}");
                let (c, i, slots) = (oci.clone(), image.clone(), cache.clone());
                let r = cache
                    .get_or_fetch(key, ttl, who.clone(), async move {
                        let _slot = slots.registry_slot(&i).await;
                        let r = match c.resolve(&i).await {
                            Ok(hcp_olm_oci::Lookup::Found { digest, .. }) => LookupResult::Exists {
                                digest: Some(digest),
                            },
                            Ok(hcp_olm_oci::Lookup::Missing { .. }) => LookupResult::Missing,
                            Ok(hcp_olm_oci::Lookup::Unauthorized { registry, .. }) => {
                                LookupResult::Unauthorized { registry }
                            }
                            Err(e) => return Err(Failure::Message(e.to_string())),
                        };
                        Ok(Cached::Catalog(r))
                    })
                    .await;
                let r = match r {
                    Ok(Cached::Catalog(r)) => r,
                    Ok(_) => LookupResult::Error("unexpected cached answer".into()),
                    Err(Failure::Message(e)) => LookupResult::Error(e),
                    Err(Failure::Problem(p)) => LookupResult::Error(format!("{p:?}")),
                    // answered later: the HostedCluster is reconciled again then, and
                    // meanwhile serves its last good image (crate::last_good)
                    Err(Failure::Pending) => LookupResult::Pending,
                };
                (image, r)
            }))
            .await;
            Box::new(StaticLookup(answers.into_iter().collect()))
        }
    };
    todo.into_iter()
        .map(|c| {
            (
                c,
                catalogs::select_image(
                    c,
                    valid.catalog_minor(),
                    None,
                    valid.catalog_candidates,
                    &valid.registry_overrides,
                    lookup.as_ref(),
                ),
            )
        })
        .collect()
}

fn registry_of(image: &str) -> Option<String> {
    hcp_olm_oci::Reference::parse(image)
        .ok()
        .map(|r| r.registry)
}

/// What the entitlement lookups of one pass established (see [`entitlement`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Entitlement {
    /// Catalogs a definite answer did not grant this cluster.
    pub unproven: BTreeSet<DefaultCatalog>,
    /// Catalogs without an answer (the registry failed, or has not answered yet): the
    /// decision the cluster's status records stands ([`crate::last_good::entitlement`]).
    pub unknown: BTreeSet<DefaultCatalog>,
}

/// The catalogs this cluster would share whose lookup proves nothing about its own
/// credentials (issue 35, item 6): the answer came from a mirror of the administrator's
/// (`--registry-mirror`) that asked for no credentials (or not this cluster's), and the
/// default catalog registry itself, asked with this cluster's pull secret, did not find the
/// tag (refused, missing or unreachable). An answer at the default registry, or one a
/// mirror gave after accepting this cluster's own credentials, proves it. Answers are
/// reused for `ttl` under the client's cache key (mirrors and credentials); a lookup that
/// failed (remembered with the lookups' backoff) or has not answered yet is `unknown`:
/// a registry outage is not an answer (issue 38, item 3).
pub async fn entitlement(
    hc: &HostedCluster,
    valid: &ValidInput,
    config: &Config,
    pull_secret: Option<&hcp_olm_oci::PullSecret>,
    images: &BTreeMap<DefaultCatalog, Result<CatalogImage, CatalogImageError>>,
    cache: &LookupCache,
    ttl: Duration,
) -> Entitlement {
    let Some(oci) = config.oci.as_ref() else {
        return Entitlement::default();
    };
    if config.mirror_answers_entitle {
        return Entitlement::default();
    }
    let oci = oci_for(hc, oci, pull_secret);
    let client_key = oci.cache_key();
    let candidates: Vec<(DefaultCatalog, String)> = images
        .iter()
        .filter_map(|(c, img)| {
            let img = img.as_ref().ok()?;
            crate::sharing::decide(valid, *c, Some(img)).key()?;
            Some((*c, img.tag_ref.clone()))
        })
        .collect();
    let (oci, client_key) = (&oci, &client_key);
    let answers = futures::future::join_all(candidates.into_iter().map(|(c, tag)| async move {
        let key = format!("entitled:{client_key}:{tag}");
        let (oci, tag2, slots) = (oci.clone(), tag.clone(), cache.clone());
        let r = cache
            .get_or_fetch(key, ttl, who(hc), async move {
                let (oci, tag) = (oci, tag2);
                let _slot = slots.registry_slot(&tag).await;
                let proven = match oci.resolve(&tag).await {
                    // the default registry itself answered, or accepted our credentials
                    Ok(hcp_olm_oci::Lookup::Found {
                        via, authenticated, ..
                    }) if authenticated || registry_of(&via) == registry_of(&tag) => true,
                    // A mirror answered without our credentials: the default registry
                    // decides. Unreachable counts as not granted and is remembered like an
                    // answer (a disconnected management cluster would otherwise ask again,
                    // and wait for the timeout, on every pass).
                    Ok(hcp_olm_oci::Lookup::Found { .. }) => matches!(
                        oci.resolve_at_source(&tag).await,
                        Ok(hcp_olm_oci::Lookup::Found { .. })
                    ),
                    Ok(_) => false,
                    Err(e) => return Err(Failure::Message(e.to_string())),
                };
                Ok(Cached::Entitled(proven))
            })
            .await;
        let proven = match r {
            Ok(Cached::Entitled(p)) => Some(p),
            Ok(_) => Some(false),
            Err(ref e) => {
                tracing::debug!(catalog = %c.name(), image = %tag, answer = ?e, "no entitlement answer; the recorded decision stands");
                None
            }
        };
        if proven == Some(false) {
            tracing::info!(catalog = %c.name(), image = %tag, answer = ?r, "a mirror answered without this cluster's credentials and the default registry did not grant them: not shared");
        }
        (c, proven)
    }))
    .await;
    let mut out = Entitlement::default();
    for (c, proven) in answers {
        match proven {
            Some(true) => {}
            Some(false) => {
                out.unproven.insert(c);
            }
            None => {
                out.unknown.insert(c);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    fn release(r: Result<Cached, Failure>) -> Result<String, Failure> {
        match r {
            Ok(Cached::Release(v)) => Ok(v),
            Ok(other) => Err(Failure::Message(format!("{other:?}"))),
            Err(e) => Err(e),
        }
    }

    fn who() -> (String, String) {
        ("clusters".into(), "a".into())
    }

    #[tokio::test]
    async fn answers_expire_failures_back_off_and_last_good_payloads_stay() {
        let c = LookupCache::default();
        let ttl = Duration::from_millis(200);
        let calls = Arc::new(AtomicUsize::new(0));
        let fetch = |v: Result<&str, &str>| {
            calls.fetch_add(1, Ordering::SeqCst);
            let v = v
                .map(|v| Cached::Release(v.to_string()))
                .map_err(|e| Failure::Message(e.to_string()));
            async move { v }
        };
        let down = Err(Failure::Message("down".into()));
        assert_eq!(
            release(
                c.get_or_fetch("k".into(), ttl, who(), fetch(Err("down")))
                    .await
            ),
            down.clone()
        );
        // The failure is remembered (its backoff is capped at the answer lifetime here).
        assert_eq!(
            release(
                c.get_or_fetch("k".into(), ttl, who(), fetch(Ok("4.18.3")))
                    .await
            ),
            down
        );
        tokio::time::sleep(ttl + ttl / 5 + Duration::from_millis(50)).await;
        assert_eq!(
            release(
                c.get_or_fetch("k".into(), ttl, who(), fetch(Ok("4.18.3")))
                    .await
            ),
            Ok("4.18.3".into())
        );
        assert_eq!(
            release(
                c.get_or_fetch("k".into(), ttl, who(), fetch(Ok("other")))
                    .await
            ),
            Ok("4.18.3".into())
        );
        // Another key (another client: mirrors, credentials) is not affected by k's failure.
        assert_eq!(
            release(
                c.get_or_fetch("k2".into(), ttl, who(), fetch(Ok("x")))
                    .await
            ),
            Ok("x".into())
        );
        tokio::time::sleep(ttl + Duration::from_millis(50)).await;
        assert_eq!(
            release(
                c.get_or_fetch("k".into(), ttl, who(), fetch(Ok("4.18.4")))
                    .await
            ),
            Ok("4.18.4".into())
        );
        // Last good payloads survive clearing of fresh answers by capacity or age.
        let m = Arc::new(BTreeMap::from([(
            "operator-lifecycle-manager".to_string(),
            "x".to_string(),
        )]));
        c.last_good.insert("payload:k".into(), m.clone()).await;
        c.fresh.invalidate_all();
        assert_eq!(c.last_good.get("payload:k").await, Some(m));
    }

    #[tokio::test]
    async fn answers_expire_within_the_last_fifth_of_their_lifetime() {
        // Issue 38 item 4: answers fetched together do not expire together, and none is
        // used past its lifetime.
        let c = LookupCache::default();
        // long enough that 40 cached answers are read well inside the margins below on a
        // loaded machine (with 500 ms it failed once beside `make test`)
        let ttl = Duration::from_secs(2);
        for i in 0..40 {
            let k = format!("k{i}");
            let _ = c
                .get_or_fetch(k, ttl, who(), async { Ok(Cached::Release("a".into())) })
                .await;
        }
        let mut cuts = Vec::new();
        for i in 0..40 {
            let (_, _, cut) = c.fresh.get(&format!("k{i}")).await.expect("cached");
            assert!((0.0..=REFRESH_JITTER).contains(&cut), "{cut}");
            cuts.push(cut);
        }
        cuts.sort_by(f64::total_cmp);
        assert!(
            cuts[39] - cuts[0] > REFRESH_JITTER / 4.0,
            "not spread: {cuts:?}"
        );
        // at 75 % of the lifetime every answer is still fresh; past it, none is
        tokio::time::sleep(ttl.mul_f64(0.75)).await;
        let fresh = |v: &'static str| async move { Ok(Cached::Release(v.into())) };
        for i in 0..40 {
            assert_eq!(
                release(
                    c.get_or_fetch(format!("k{i}"), ttl, who(), fresh("b"))
                        .await
                ),
                Ok("a".into())
            );
        }
        tokio::time::sleep(ttl.mul_f64(0.27)).await;
        for i in 0..40 {
            assert_eq!(
                release(
                    c.get_or_fetch(format!("k{i}"), ttl, who(), fresh("b"))
                        .await
                ),
                Ok("b".into())
            );
        }
    }

    #[tokio::test]
    async fn lookups_at_one_registry_are_bounded() {
        let c = LookupCache::default();
        let running = Arc::new(AtomicUsize::new(0));
        let most = Arc::new(AtomicUsize::new(0));
        let lookups = (0..REGISTRY_CONCURRENCY * 3).map(|i| {
            let (c2, running, most) = (c.clone(), running.clone(), most.clone());
            let image = if i % 3 == 0 {
                // another registry does not wait for this one's slots
                format!("other.example.com/x:{i}")
            } else {
                format!("registry.example.com/x:{i}")
            };
            c.get_or_fetch(
                format!("k{i}"),
                Duration::from_secs(60),
                who(),
                async move {
                    let _slot = c2.registry_slot(&image).await;
                    if image.starts_with("registry.") {
                        let now = running.fetch_add(1, Ordering::SeqCst) + 1;
                        most.fetch_max(now, Ordering::SeqCst);
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    if image.starts_with("registry.") {
                        running.fetch_sub(1, Ordering::SeqCst);
                    }
                    Ok(Cached::Release("a".into()))
                },
            )
        });
        for r in futures::future::join_all(lookups).await {
            assert_eq!(release(r), Ok("a".into()));
        }
        assert_eq!(most.load(Ordering::SeqCst), REGISTRY_CONCURRENCY);
    }

    #[test]
    fn failure_backoff_doubles_is_capped_and_jittered() {
        let hour = Duration::from_secs(3600);
        assert_eq!(failure_backoff(1, hour, 0.0), FAILURE_BACKOFF_MIN);
        assert_eq!(failure_backoff(2, hour, 0.0), FAILURE_BACKOFF_MIN * 2);
        assert_eq!(failure_backoff(40, hour, 0.0), FAILURE_BACKOFF_MAX);
        assert_eq!(
            failure_backoff(40, Duration::from_secs(30), 0.0),
            Duration::from_secs(30)
        );
        let secs = |d: Duration| d.as_secs_f64();
        assert!((secs(failure_backoff(1, hour, 0.2)) - 12.0).abs() < 1e-6);
        assert!((secs(failure_backoff(1, hour, -9.0)) - 8.0).abs() < 1e-6);
        let j: Vec<f64> = (0..64).map(|_| jitter()).collect();
        assert!(j.iter().all(|x| (-0.2..=0.2).contains(x)));
        assert!(j.iter().any(|x| *x != j[0]), "jitter varies: {j:?}");
    }

    /// A slow lookup holds its caller for the wait at most; it goes on in the background,
    /// wakes its callers when it ends, and its answer is then cached. Concurrent callers
    /// share one lookup; a lookup past its deadline ends as a remembered failure. (Wait and
    /// deadline scaled down: 200 ms and 1 s.)
    #[tokio::test]
    async fn a_failure_stands_while_the_next_attempt_is_under_way() {
        // A registry that keeps timing out: the retry after the backoff is still under way
        // when a pass looks; that pass sees the failure at once, not "still looking" after
        // a wait (issue 38 item 3: the old cache answered Pending there, and Degraded never
        // showed; issue 35 item 5: each such pass held a reconcile slot for the wait).
        let c = LookupCache {
            wait: Duration::from_secs(1),
            deadline: Duration::from_secs(5),
            ..LookupCache::default()
        };
        let ttl = Duration::from_millis(100);
        let down = || async { Err(Failure::Message("registry timed out".into())) };
        assert_eq!(
            release(c.get_or_fetch("k".into(), ttl, who(), down()).await),
            Err(Failure::Message("registry timed out".into()))
        );
        // past the backoff (at most ttl + 20 %)
        tokio::time::sleep(Duration::from_millis(200)).await;
        let slow = |ms: u64| async move {
            tokio::time::sleep(Duration::from_millis(ms)).await;
            Err(Failure::Message("registry timed out again".into()))
        };
        let t0 = Instant::now();
        assert_eq!(
            release(c.get_or_fetch("k".into(), ttl, who(), slow(500)).await),
            Err(Failure::Message("registry timed out".into()))
        );
        assert!(
            t0.elapsed() < Duration::from_millis(300),
            "{:?}",
            t0.elapsed()
        );
        // a key that never failed is waited for, and then merely under way ...
        let t0 = Instant::now();
        assert_eq!(
            release(c.get_or_fetch("new".into(), ttl, who(), slow(3000)).await),
            Err(Failure::Pending)
        );
        assert!(t0.elapsed() >= Duration::from_secs(1));
        // ... and not waited for again by the cluster that already waited for it
        let t0 = Instant::now();
        assert_eq!(
            release(c.get_or_fetch("new".into(), ttl, who(), slow(3000)).await),
            Err(Failure::Pending)
        );
        assert!(
            t0.elapsed() < Duration::from_millis(300),
            "{:?}",
            t0.elapsed()
        );
    }

    #[tokio::test]
    async fn a_slow_lookup_is_left_running_and_wakes_its_waiters() {
        let c = LookupCache {
            wait: Duration::from_millis(200),
            deadline: Duration::from_secs(1),
            ..LookupCache::default()
        };
        let woken = Arc::new(std::sync::Mutex::new(Vec::new()));
        let w = woken.clone();
        c.set_waker(Arc::new(move |ns: &str, name: &str| {
            w.lock().unwrap().push(format!("{ns}/{name}"))
        }));
        let calls = Arc::new(AtomicUsize::new(0));
        let slow = || {
            let calls = calls.clone();
            async move {
                calls.fetch_add(1, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(600)).await;
                Ok(Cached::Release("4.18.3".into()))
            }
        };
        let ttl = Duration::from_secs(600);
        let t0 = Instant::now();
        let (a, b) = futures::join!(
            c.get_or_fetch("k".into(), ttl, who(), slow()),
            c.get_or_fetch("k".into(), ttl, ("clusters".into(), "b".into()), slow()),
        );
        let waited = t0.elapsed();
        assert!(
            (Duration::from_millis(200)..Duration::from_millis(500)).contains(&waited),
            "{waited:?}"
        );
        assert_eq!(
            (release(a), release(b)),
            (Err(Failure::Pending), Err(Failure::Pending))
        );
        assert!(woken.lock().unwrap().is_empty());
        tokio::time::sleep(Duration::from_millis(800)).await;
        let mut w = woken.lock().unwrap().clone();
        w.sort();
        assert_eq!(w, ["clusters/a", "clusters/b"]);
        assert_eq!(
            release(c.get_or_fetch("k".into(), ttl, who(), slow()).await),
            Ok("4.18.3".into())
        );
        assert_eq!(
            calls.load(Ordering::SeqCst),
            1,
            "one lookup for all callers"
        );
        let endless = || async {
            tokio::time::sleep(Duration::from_secs(3600)).await;
            Ok(Cached::Release("never".into()))
        };
        let _ = c.get_or_fetch("e".into(), ttl, who(), endless()).await;
        tokio::time::sleep(Duration::from_millis(1200)).await;
        let got = release(c.get_or_fetch("e".into(), ttl, who(), endless()).await);
        assert!(
            matches!(&got, Err(Failure::Problem(PayloadProblem::Unreadable(m))) if m.contains("not complete within")),
            "{got:?}"
        );
    }
}
