//! A registry that fails is not an answer (issue 38, item 3).
//!
//! A catalog whose registry lookup failed (timeout, 5xx, connection refused) or has not
//! answered yet keeps the image it was last served with: the one its HostedOLM status
//! records (`status.catalogs[].image` and `.version`, written by every pass), so the
//! choice survives controller restarts and the lookup cache's expiry. Only a definite
//! answer (the tag is missing, the registry refused the pull secret) changes what is
//! served. A catalog held after a failure is reported `Degraded` with the registry and
//! the error; one whose lookup is merely still under way is held silently (a refresh that
//! takes more than the pass's short wait is not a fault).
//!
//! The same rule holds for a shared catalog's entitlement check (issue 35, item 6): a
//! check without an answer leaves the decision the status records.
//!
//! Pure: the runtime hands in the lookups' results and the previous status.

use std::collections::{BTreeMap, BTreeSet};

use crate::catalogs::{CatalogImage, CatalogImageError, DefaultCatalog, candidates};
use crate::hostedolm::HostedOLMStatus;
use crate::validate::ValidInput;

/// Reason of the `Degraded` note for a catalog served from its last good image.
pub const HELD_REASON: &str = "CatalogRegistryUnavailable";

/// A catalog served from its last good image in this pass.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Held {
    pub catalog: DefaultCatalog,
    /// The image kept (`repo@sha256:...` as the status recorded it).
    pub image: String,
    /// Why the lookup gave no answer: None while it is still under way.
    pub failure: Option<Failure>,
}

/// A failed lookup, for the `Degraded` note.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Failure {
    /// The reference that was asked for.
    pub asked: String,
    /// The registry client's error: each registry tried (mirrors, then the source) with
    /// its failure.
    pub error: String,
}

impl Held {
    /// The `Degraded` note's message (None while the lookup is still under way).
    pub fn message(&self) -> Option<String> {
        let f = self.failure.as_ref()?;
        Some(format!(
            "the registry lookup of {} failed ({}); serving the last good image {} until it answers",
            f.asked, f.error, self.image
        ))
    }
}

/// The previous image of `catalog` as a [`CatalogImage`], when the status recorded one.
fn previous(
    valid: &ValidInput,
    status: &HostedOLMStatus,
    catalog: DefaultCatalog,
) -> Option<CatalogImage> {
    let entry = status
        .catalogs
        .iter()
        .find(|s| s.name == catalog.name() && s.enabled)?;
    let image = entry.image.as_deref().filter(|i| !i.is_empty())?;
    let version = entry.version.as_deref().filter(|v| !v.is_empty())?;
    // The tag it was found under: the candidate of that version in the same repository
    // (what sharing and the entitlement check compare), else that repository's tag.
    let repo = image
        .split_once('@')
        .map(|(r, _)| r)
        .unwrap_or_else(|| image.rsplit_once(':').map_or(image, |(r, _)| r));
    let cands = candidates(
        catalog,
        valid.catalog_minor(),
        None,
        valid.catalog_candidates,
        &valid.registry_overrides,
    );
    let first = cands.first().map(|(v, _)| v.to_string());
    let tag_ref = cands
        .iter()
        .find(|(v, tag)| v.to_string() == version && tag.starts_with(&format!("{repo}:")))
        .map(|(_, tag)| tag.clone())
        .unwrap_or_else(|| format!("{repo}:v{version}"));
    Some(CatalogImage {
        tag_ref,
        pinned_ref: image.contains('@').then(|| image.to_string()),
        version: version.to_string(),
        fell_back: first.as_deref() != Some(version),
    })
}

/// Replace every catalog whose lookup gave no definite answer with its last good image
/// from `status`, returning what was held. A catalog without a recorded image keeps its
/// error (nothing of it is served yet, so nothing is removed).
pub fn hold(
    valid: &ValidInput,
    status: Option<&HostedOLMStatus>,
    images: &mut BTreeMap<DefaultCatalog, Result<CatalogImage, CatalogImageError>>,
) -> Vec<Held> {
    let Some(status) = status else {
        return Vec::new();
    };
    let mut held = Vec::new();
    for (catalog, result) in images.iter_mut() {
        let failure = match result {
            Ok(_) => continue,
            Err(e) if e.is_definite() => continue,
            Err(CatalogImageError::Lookup { image, message }) => Some(Failure {
                asked: image.clone(),
                error: message.clone(),
            }),
            // still under way
            Err(_) => None,
        };
        let Some(img) = previous(valid, status, *catalog) else {
            continue;
        };
        held.push(Held {
            catalog: *catalog,
            image: img.image().to_string(),
            failure,
        });
        *result = Ok(img);
    }
    held
}

/// The catalogs not proven entitled: the definite answers, and the catalogs without an
/// answer that the status does not record as shared.
pub fn entitlement(
    unproven: BTreeSet<DefaultCatalog>,
    unknown: &BTreeSet<DefaultCatalog>,
    status: Option<&HostedOLMStatus>,
) -> BTreeSet<DefaultCatalog> {
    let was_shared = |c: &DefaultCatalog| {
        status.is_some_and(|s| {
            s.catalogs
                .iter()
                .any(|e| e.name == c.name() && e.sharing.as_deref() == Some("shared"))
        })
    };
    let mut out = unproven;
    out.extend(unknown.iter().filter(|c| !was_shared(c)).copied());
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::catalogs::{LookupResult, MinorVersion, StaticLookup, select_image};
    use crate::hostedolm::CatalogStatus;

    const RH: &str = "registry.redhat.io/redhat/redhat-operator-index";
    const DIGEST: &str = "sha256:1111111111111111111111111111111111111111111111111111111111111111";

    fn valid() -> ValidInput {
        let hc: crate::hostedcluster::HostedCluster = serde_json::from_value(serde_json::json!({
            "apiVersion": "hypershift.openshift.io/v1beta1", "kind": "HostedCluster",
            "metadata": {"name": "a", "namespace": "clusters"},
            "spec": {"release": {"image": "quay.io/openshift-release-dev/ocp-release:4.18.3-x86_64"}},
        }))
        .expect("a HostedCluster");
        let facts = crate::validate::ReleaseFacts {
            version: Some("4.18.3".into()),
            olm_image: Some("quay.io/olm:x".into()),
            operator_registry_image: Some("quay.io/opm:x".into()),
            payload_problem: None,
        };
        crate::validate::validate(&hc, None, &facts, &Default::default()).expect("valid")
    }

    fn status(sharing: Option<&str>) -> HostedOLMStatus {
        HostedOLMStatus {
            catalogs: vec![CatalogStatus {
                name: "redhat-operators".into(),
                enabled: true,
                image: Some(format!("{RH}@{DIGEST}")),
                version: Some("4.18".into()),
                sharing: sharing.map(str::to_string),
                ..Default::default()
            }],
            ..Default::default()
        }
    }

    /// The selection when the registry answers `r` for every candidate tag.
    fn answer(r: LookupResult) -> Result<CatalogImage, CatalogImageError> {
        let l = StaticLookup(
            ["4.18", "4.17", "4.16", "4.15"]
                .into_iter()
                .map(|v| (format!("{RH}:v{v}"), r.clone()))
                .collect(),
        );
        select_image(
            DefaultCatalog::RedhatOperators,
            MinorVersion::new(4, 18),
            None,
            4,
            &[],
            &l,
        )
    }

    #[test]
    fn a_failed_or_pending_lookup_keeps_the_recorded_image() {
        let v = valid();
        let st = status(None);
        let good = answer(LookupResult::Exists {
            digest: Some(DIGEST.into()),
        })
        .expect("found");
        for (r, degraded) in [
            (LookupResult::Error("503 Service Unavailable".into()), true),
            (LookupResult::Pending, false),
        ] {
            let mut images = BTreeMap::from([(DefaultCatalog::RedhatOperators, answer(r))]);
            let held = hold(&v, Some(&st), &mut images);
            // exactly the image a successful lookup gives: nothing rendered changes
            assert_eq!(images[&DefaultCatalog::RedhatOperators], Ok(good.clone()));
            assert_eq!(held.len(), 1);
            assert_eq!(held[0].image, format!("{RH}@{DIGEST}"));
            match held[0].message() {
                Some(m) => {
                    assert!(degraded);
                    assert!(m.contains("registry.redhat.io") && m.contains("503"), "{m}");
                }
                None => assert!(!degraded),
            }
        }
    }

    #[test]
    fn definite_answers_and_unrecorded_catalogs_are_not_held() {
        let v = valid();
        for r in [
            LookupResult::Missing,
            LookupResult::Unauthorized {
                registry: "registry.redhat.io".into(),
            },
        ] {
            let mut images = BTreeMap::from([(DefaultCatalog::RedhatOperators, answer(r))]);
            let before = images.clone();
            assert!(hold(&v, Some(&status(None)), &mut images).is_empty());
            assert_eq!(images, before);
        }
        // no status, or a status without an image: the error stays
        let mut images = BTreeMap::from([(
            DefaultCatalog::RedhatOperators,
            answer(LookupResult::Error("timeout".into())),
        )]);
        assert!(hold(&v, None, &mut images).is_empty());
        let mut empty = status(None);
        empty.catalogs[0].image = None;
        assert!(hold(&v, Some(&empty), &mut images).is_empty());
        assert!(images[&DefaultCatalog::RedhatOperators].is_err());
    }

    #[test]
    fn an_unanswered_entitlement_keeps_the_recorded_decision() {
        let rh = DefaultCatalog::RedhatOperators;
        let ce = DefaultCatalog::CertifiedOperators;
        let unknown = BTreeSet::from([rh]);
        assert!(entitlement(BTreeSet::new(), &unknown, Some(&status(Some("shared")))).is_empty());
        assert_eq!(
            entitlement(BTreeSet::new(), &unknown, Some(&status(Some("own")))),
            unknown
        );
        assert_eq!(entitlement(BTreeSet::new(), &unknown, None), unknown);
        // a definite answer wins over the record
        assert_eq!(
            entitlement(
                BTreeSet::from([ce]),
                &BTreeSet::new(),
                Some(&status(Some("shared")))
            ),
            BTreeSet::from([ce])
        );
    }
}
