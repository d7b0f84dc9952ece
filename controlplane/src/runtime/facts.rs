//! Facts from outside the HostedCluster: the release version (release image label)
//! and catalog images (registry lookups, prefetched so selection stays pure).

use std::collections::BTreeMap;
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

/// Registry answers shared by every HostedCluster, each reused for a lifetime (the
/// catalog refresh interval): 1000 hosted clusters on a few releases need a few
/// lookups, not thousands. Keys hold everything that changes an answer: the image and
/// [`hcp_olm_oci::Client::cache_key`] (a hash of the cluster's mirrors and credentials),
/// so one tenant's mirror never answers for another. Concurrent misses for one key
/// make one lookup (single flight). Errors are never cached. Bounded: at most
/// [`LookupCache::CAPACITY`] fresh answers plus as many last good payload answers.
#[derive(Clone)]
pub struct LookupCache {
    fresh: moka::future::Cache<String, (Instant, Cached)>,
    /// The last good release payload answer per key, served when the payload cannot
    /// be read now (documented in docs/controller.md).
    last_good: moka::future::Cache<String, Arc<BTreeMap<String, String>>>,
}

impl std::fmt::Debug for LookupCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LookupCache")
            .field("fresh", &self.fresh.entry_count())
            .field("last_good", &self.last_good.entry_count())
            .finish()
    }
}

impl Default for LookupCache {
    fn default() -> Self {
        Self {
            fresh: moka::future::Cache::new(Self::CAPACITY),
            last_good: moka::future::Cache::new(Self::CAPACITY),
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
    /// [`entitlement_unproven`]).
    Entitled(bool),
}

impl LookupCache {
    /// Fresh answers held at most (and as many last good payload answers).
    pub const CAPACITY: u64 = 4096;

    /// The answer for `key`: fresh from the cache when younger than `ttl`, else from
    /// `fetch` (one call for all concurrent callers of a key). `ttl` zero: no caching.
    async fn get_or_fetch<F, E>(&self, key: String, ttl: Duration, fetch: F) -> Result<Cached, E>
    where
        F: std::future::Future<Output = Result<Cached, E>>,
        E: Clone + Send + Sync + 'static,
    {
        if ttl.is_zero() {
            return fetch.await;
        }
        if let Some((at, v)) = self.fresh.get(&key).await {
            if at.elapsed() < ttl {
                return Ok(v);
            }
            self.fresh.invalidate(&key).await;
        }
        self.fresh
            .try_get_with(key, async move { fetch.await.map(|v| (Instant::now(), v)) })
            .await
            .map(|(_, v)| v)
            .map_err(|e| e.as_ref().clone())
    }
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
/// image, so the payload is not read. `pull_secret`: the HostedCluster's own.
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
    if !image.is_empty() {
        let key = format!("release:{}:{image}", oci.cache_key());
        let got = cache
            .get_or_fetch(key, ttl, async {
                oci.release_version(&image)
                    .await
                    .map(Cached::Release)
                    .map_err(|e| {
                        tracing::warn!(%image, error = %e, "cannot read the release version label");
                        payload_problem(&e)
                    })
            })
            .await;
        match got {
            Ok(Cached::Release(v)) => facts.version = Some(v),
            Ok(_) => {}
            // A hostile or oversized answer is reported even when the payload is not
            // read (an OLM image override).
            Err(p @ (PayloadProblem::DigestMismatch(_) | PayloadProblem::TooLarge(_))) => {
                facts.payload_problem = Some(p)
            }
            Err(_) => {}
        }
    }
    if config.olm_image.is_none() && !olm_overridden {
        payload_images(&mut facts, &oci, &payload_image(hc), cache, ttl).await;
    }
    facts
}

/// Fills the OLM and operator-registry images from the release payload, or says why
/// not.
async fn payload_images(
    facts: &mut ReleaseFacts,
    oci: &hcp_olm_oci::Client,
    image: &str,
    cache: &LookupCache,
    ttl: Duration,
) {
    if image.is_empty() {
        return;
    }
    let key = format!("payload:{}:{image}", oci.cache_key());
    let got = cache
        .get_or_fetch(key.clone(), ttl, async {
            oci.release_image_references(image)
                .await
                .map(|m| Cached::Payload(Arc::new(m)))
                .map_err(|e| payload_problem(&e))
        })
        .await;
    let refs = match got {
        Ok(Cached::Payload(m)) => {
            if !ttl.is_zero() {
                cache.last_good.insert(key, m.clone()).await;
            }
            m
        }
        Ok(_) => return,
        Err(problem) => {
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
                    m
                }
                None => {
                    tracing::warn!(%image, error = ?problem, "cannot read the release payload's image references");
                    facts.payload_problem = Some(problem);
                    return;
                }
            }
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
            let answers = futures::future::join_all(refs.into_iter().map(|image| async move {
                let key = format!("catalog:{client_key}:{image}");
                let r = cache
                    .get_or_fetch(key, ttl, async {
                        let r = match oci.resolve(&image).await {
                            Ok(hcp_olm_oci::Lookup::Found { digest, .. }) => LookupResult::Exists {
                                digest: Some(digest),
                            },
                            Ok(hcp_olm_oci::Lookup::Missing { .. }) => LookupResult::Missing,
                            Ok(hcp_olm_oci::Lookup::Unauthorized { registry, .. }) => {
                                LookupResult::Unauthorized { registry }
                            }
                            Err(e) => return Err(e.to_string()),
                        };
                        Ok(Cached::Catalog(r))
                    })
                    .await;
                let r = match r {
                    Ok(Cached::Catalog(r)) => r,
                    Ok(_) => LookupResult::Error("unexpected cached answer".into()),
                    Err(e) => LookupResult::Error(e),
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

/// The catalogs this cluster would share whose lookup proves nothing about its own
/// credentials (issue 35, item 6): the answer came from a mirror of the administrator's
/// (`--registry-mirror`) that asked for no credentials (or not this cluster's), and the
/// default catalog registry itself, asked with this cluster's pull secret, did not find the
/// tag (refused, missing or unreachable). An answer at the default registry, or one a
/// mirror gave after accepting this cluster's own credentials, proves it. Answers are
/// reused for `ttl` under the client's cache key (mirrors and credentials); transport
/// errors are not cached and leave the catalog unproven for this pass.
pub async fn entitlement_unproven(
    hc: &HostedCluster,
    valid: &ValidInput,
    config: &Config,
    pull_secret: Option<&hcp_olm_oci::PullSecret>,
    images: &BTreeMap<DefaultCatalog, Result<CatalogImage, CatalogImageError>>,
    cache: &LookupCache,
    ttl: Duration,
) -> std::collections::BTreeSet<DefaultCatalog> {
    let Some(oci) = config.oci.as_ref() else {
        return Default::default();
    };
    if config.mirror_answers_entitle {
        return Default::default();
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
        let r = cache
            .get_or_fetch(key, ttl, async {
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
                    Err(e) => return Err(e.to_string()),
                };
                Ok(Cached::Entitled(proven))
            })
            .await;
        let proven = matches!(r, Ok(Cached::Entitled(true)));
        if !proven {
            tracing::info!(catalog = %c.name(), image = %tag, answer = ?r, "a mirror answered without this cluster's credentials and the default registry did not grant them: not shared");
        }
        (c, proven)
    }))
    .await;
    answers
        .into_iter()
        .filter(|(_, proven)| !proven)
        .map(|(c, _)| c)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn answers_expire_errors_are_not_cached_and_last_good_payloads_stay() {
        let c = LookupCache::default();
        let ttl = Duration::from_millis(200);
        let calls = std::sync::atomic::AtomicUsize::new(0);
        let fetch = |v: Result<&str, &str>| {
            calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            let v = v
                .map(|v| Cached::Release(v.to_string()))
                .map_err(str::to_string);
            async move { v }
        };
        let got = |r: Result<Cached, String>| match r {
            Ok(Cached::Release(v)) => Ok(v),
            Ok(other) => Err(format!("{other:?}")),
            Err(e) => Err(e),
        };
        assert_eq!(
            got(c.get_or_fetch("k".into(), ttl, fetch(Err("down"))).await),
            Err("down".into())
        );
        assert_eq!(
            got(c.get_or_fetch("k".into(), ttl, fetch(Ok("4.18.3"))).await),
            Ok("4.18.3".into())
        );
        assert_eq!(
            got(c.get_or_fetch("k".into(), ttl, fetch(Ok("other"))).await),
            Ok("4.18.3".into())
        );
        assert_eq!(
            calls.load(std::sync::atomic::Ordering::SeqCst),
            3,
            "the cached answer is not fetched again"
        );
        tokio::time::sleep(ttl + Duration::from_millis(50)).await;
        assert_eq!(
            got(c.get_or_fetch("k".into(), ttl, fetch(Ok("4.18.4"))).await),
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
}
