//! Facts from outside the HostedCluster: the release version (release image label)
//! and catalog images (registry lookups, prefetched so selection stays pure).

use std::collections::BTreeMap;

use crate::catalogs::{
    self, AssumeTagsExist, CatalogImage, CatalogImageError, DefaultCatalog, ImageLookup,
    LookupResult, StaticLookup,
};
use crate::hostedcluster::HostedCluster;
use crate::validate::{ReleaseFacts, ValidInput};

use super::Config;

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
                let r = match oci.resolve(&image).await {
                    Ok(hcp_olm_oci::Lookup::Found { digest, .. }) => LookupResult::Exists {
                        digest: Some(digest),
                    },
                    Ok(hcp_olm_oci::Lookup::Missing { .. }) => LookupResult::Missing,
                    Err(e) => LookupResult::Error(e.to_string()),
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
