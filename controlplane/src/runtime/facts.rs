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
use crate::validate::{ReleaseFacts, ValidInput};

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
}

impl LookupCache {
    fn get(&self, key: &str, ttl: Duration, now: Instant) -> Option<Cached> {
        let mut m = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        match m.get(key) {
            Some((at, v)) if now.duration_since(*at) < ttl => Some(v.clone()),
            Some(_) => {
                m.remove(key);
                None
            }
            None => None,
        }
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

/// [`release_facts`] with the release version label reused from `cache` for `ttl`.
pub async fn release_facts_cached(
    hc: &HostedCluster,
    config: &Config,
    cache: &LookupCache,
    ttl: Duration,
) -> ReleaseFacts {
    let image = hc.spec.release.image.clone();
    if config.oci.is_none() || image.is_empty() {
        return release_facts(hc, config).await;
    }
    let key = format!("release:{image}");
    if let Some(Cached::Release(v)) = cache.get(&key, ttl, Instant::now()) {
        return ReleaseFacts {
            version: Some(v),
            olm_image: config.olm_image.clone(),
            operator_registry_image: config.operator_registry_image.clone(),
        };
    }
    let oci = config.oci.as_ref().expect("checked above");
    match oci.release_version(&image).await {
        Ok(v) => {
            cache.put(key, Cached::Release(v.clone()), Instant::now());
            ReleaseFacts {
                version: Some(v),
                olm_image: config.olm_image.clone(),
                operator_registry_image: config.operator_registry_image.clone(),
            }
        }
        Err(e) => {
            tracing::warn!(%image, error = %e, "cannot read the release version label");
            release_facts_without_lookup(hc, config)
        }
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
    }
}

/// Release facts: the version from the release image's `io.openshift.release` label
/// when a registry client is configured (falling back to
/// `status.version.desired.version` when the lookup fails), images from the config.
pub async fn release_facts(hc: &HostedCluster, config: &Config) -> ReleaseFacts {
    let status_version = hc
        .status
        .as_ref()
        .and_then(|s| s.version.as_ref())
        .and_then(|v| v.desired.as_ref())
        .map(|d| d.version.clone())
        .filter(|v| !v.is_empty());
    let image = Some(hc.spec.release.image.clone());
    let version = match (&config.oci, image.filter(|i| !i.is_empty())) {
        (Some(oci), Some(image)) => match oci.release_version(&image).await {
            Ok(v) => Some(v),
            Err(e) => {
                tracing::warn!(%image, error = %e, "cannot read the release version label");
                status_version
            }
        },
        _ => status_version,
    };
    ReleaseFacts {
        version,
        olm_image: config.olm_image.clone(),
        operator_registry_image: config.operator_registry_image.clone(),
    }
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
