//! Facts from outside the HostedCluster: the release version (release image label)
//! and catalog images (registry lookups, prefetched so selection stays pure).

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::catalogs::{
    self, AssumeTagsExist, CatalogImage, CatalogImageError, DefaultCatalog, ImageLookup,
    LookupResult, StaticLookup,
};
use crate::hostedcluster::HostedCluster;
use crate::validate::{PayloadProblem, ReleaseFacts, ValidInput};

use super::Config;

/// Registry answers shared by every HostedCluster, each reused for a lifetime (the
/// catalog refresh interval): 1000 hosted clusters on a few releases need a few
/// lookups, not thousands. Errors are never cached.
#[derive(Clone, Debug, Default)]
pub struct LookupCache {
    inner: Arc<Mutex<HashMap<String, (Instant, Cached)>>>,
}

#[derive(Clone, Debug)]
enum Cached {
    Catalog(LookupResult),
    Release(String),
    /// Component → image of a release payload (`image-references`).
    Payload(BTreeMap<String, String>),
}

impl LookupCache {
    fn get(&self, key: &str, ttl: Duration, now: Instant) -> Option<Cached> {
        let mut m = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        match m.get(key) {
            Some((at, v)) if now.duration_since(*at) < ttl => Some(v.clone()),
            // Payload answers stay for [`LookupCache::get_stale`].
            Some((_, Cached::Payload(_))) => None,
            Some(_) => {
                m.remove(key);
                None
            }
            None => None,
        }
    }

    /// An entry regardless of its age (a release payload that cannot be read right
    /// now is served from the last good answer).
    fn get_stale(&self, key: &str) -> Option<Cached> {
        let m = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        m.get(key).map(|(_, v)| v.clone())
    }

    fn put(&self, key: String, v: Cached, now: Instant) {
        let mut m = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        // Bound the map: drop expired-looking old entries when it grows large.
        if m.len() > 4096 {
            m.clear();
        }
        m.insert(key, (now, v));
    }

    /// Entries held (expired ones included until looked at).
    pub fn len(&self) -> usize {
        self.inner.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Forget everything (the next reconciles look up again).
    pub fn clear(&self) {
        self.inner.lock().unwrap_or_else(|p| p.into_inner()).clear();
    }
}

/// The registry client for one HostedCluster: the controller's, with the
/// HostedCluster's `imageContentSources` as extra mirrors.
fn oci_for(hc: &HostedCluster, oci: &hcp_olm_oci::Client) -> hcp_olm_oci::Client {
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
    if extra.is_empty() {
        oci.clone()
    } else {
        oci.with_mirrors(&extra)
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
/// image, so the payload is not read.
pub async fn release_facts_cached(
    hc: &HostedCluster,
    config: &Config,
    olm_overridden: bool,
    cache: &LookupCache,
    ttl: Duration,
) -> ReleaseFacts {
    let mut facts = release_facts_without_lookup(hc, config);
    let Some(oci) = config.oci.as_ref() else {
        return facts;
    };
    let oci = oci_for(hc, oci);
    let image = hc.spec.release.image.clone();
    if !image.is_empty() {
        let key = format!("release:{image}");
        if let Some(Cached::Release(v)) = cache.get(&key, ttl, Instant::now()) {
            facts.version = Some(v);
        } else {
            match oci.release_version(&image).await {
                Ok(v) => {
                    cache.put(key, Cached::Release(v.clone()), Instant::now());
                    facts.version = Some(v);
                }
                Err(e) => {
                    tracing::warn!(%image, error = %e, "cannot read the release version label")
                }
            }
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
    let key = format!("payload:{image}");
    let refs = match cache.get(&key, ttl, Instant::now()) {
        Some(Cached::Payload(m)) => m,
        _ => match oci.release_image_references(image).await {
            Ok(m) => {
                if !ttl.is_zero() {
                    cache.put(key, Cached::Payload(m.clone()), Instant::now());
                }
                m
            }
            Err(e) => match cache.get_stale(&key) {
                Some(Cached::Payload(m)) => {
                    tracing::warn!(%image, error = %e, "cannot read the release payload's image references; using the last answer");
                    m
                }
                _ => {
                    tracing::warn!(%image, error = %e, "cannot read the release payload's image references");
                    facts.payload_problem = Some(PayloadProblem::Unreadable(e.to_string()));
                    return;
                }
            },
        },
    };
    use hcp_olm_oci::payload::{OLM_COMPONENT, OPERATOR_REGISTRY_COMPONENT};
    match refs.get(OLM_COMPONENT) {
        Some(olm) => facts.olm_image = Some(olm.clone()),
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
    release_facts_cached(hc, config, false, &LookupCache::default(), Duration::ZERO).await
}

/// Choose every enabled catalog's image. With a registry client the candidate tags
/// are looked up first (concurrently); without, tags are assumed to exist.
pub async fn catalog_images(
    valid: &ValidInput,
    config: &Config,
) -> BTreeMap<DefaultCatalog, Result<CatalogImage, CatalogImageError>> {
    catalog_images_cached(valid, config, &LookupCache::default(), Duration::ZERO).await
}

/// [`catalog_images`] with registry answers reused from `cache` for `ttl`.
pub async fn catalog_images_cached(
    valid: &ValidInput,
    config: &Config,
    cache: &LookupCache,
    ttl: Duration,
) -> BTreeMap<DefaultCatalog, Result<CatalogImage, CatalogImageError>> {
    let todo: Vec<DefaultCatalog> = valid
        .enabled_catalogs
        .iter()
        .copied()
        .filter(|c| !valid.catalog_pins.contains_key(c))
        .collect();
    let lookup: Box<dyn ImageLookup + Send + Sync> = match &config.oci {
        None => Box::new(AssumeTagsExist),
        Some(oci) => {
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
            let answers = futures::future::join_all(refs.into_iter().map(|image| async move {
                let key = format!("catalog:{image}");
                if let Some(Cached::Catalog(r)) = cache.get(&key, ttl, Instant::now()) {
                    return (image, r);
                }
                let r = match oci.resolve(&image).await {
                    Ok(hcp_olm_oci::Lookup::Found { digest, .. }) => LookupResult::Exists {
                        digest: Some(digest),
                    },
                    Ok(hcp_olm_oci::Lookup::Missing { .. }) => LookupResult::Missing,
                    Err(e) => LookupResult::Error(e.to_string()),
                };
                if !matches!(r, LookupResult::Error(_)) && !ttl.is_zero() {
                    cache.put(key, Cached::Catalog(r.clone()), Instant::now());
                }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expired_payload_answers_remain_as_a_fallback_only() {
        let c = LookupCache::default();
        let t0 = Instant::now();
        let ttl = Duration::from_secs(60);
        let m = BTreeMap::from([("operator-lifecycle-manager".to_string(), "x".to_string())]);
        c.put("payload:r".into(), Cached::Payload(m.clone()), t0);
        c.put("release:r".into(), Cached::Release("4.18.3".into()), t0);
        assert!(matches!(
            c.get("payload:r", ttl, t0),
            Some(Cached::Payload(_))
        ));
        let later = t0 + Duration::from_secs(61);
        assert!(c.get("payload:r", ttl, later).is_none());
        assert!(c.get("release:r", ttl, later).is_none());
        assert!(matches!(c.get_stale("payload:r"), Some(Cached::Payload(p)) if p == m));
        assert!(
            c.get_stale("release:r").is_none(),
            "expired release labels are dropped"
        );
    }
}
