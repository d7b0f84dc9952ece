//! Default catalogs and the choice of their images.
//!
//! The choice is a pure function over an abstract registry lookup ([`ImageLookup`]).
//! The runtime can prefetch every candidate asynchronously ([`candidates`]) into a
//! [`StaticLookup`] and then call [`select_image`] synchronously.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// One of the default catalogs a hosted cluster gets.
#[derive(
    Clone,
    Copy,
    Debug,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    Serialize,
    Deserialize,
    schemars::JsonSchema,
)]
#[serde(rename_all = "kebab-case")]
pub enum DefaultCatalog {
    RedhatOperators,
    CertifiedOperators,
    CommunityOperators,
}

impl DefaultCatalog {
    pub const ALL: [DefaultCatalog; 3] = [
        DefaultCatalog::RedhatOperators,
        DefaultCatalog::CertifiedOperators,
        DefaultCatalog::CommunityOperators,
    ];

    /// CatalogSource name in the guest (`openshift-marketplace`).
    pub fn name(self) -> &'static str {
        match self {
            DefaultCatalog::RedhatOperators => "redhat-operators",
            DefaultCatalog::CertifiedOperators => "certified-operators",
            DefaultCatalog::CommunityOperators => "community-operators",
        }
    }

    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|c| c.name() == name)
    }

    /// Repository of the index image, without a tag.
    pub fn repository(self) -> &'static str {
        match self {
            DefaultCatalog::RedhatOperators => "registry.redhat.io/redhat/redhat-operator-index",
            DefaultCatalog::CertifiedOperators => {
                "registry.redhat.io/redhat/certified-operator-index"
            }
            DefaultCatalog::CommunityOperators => {
                "registry.redhat.io/redhat/community-operator-index"
            }
        }
    }

    pub fn display_name(self) -> &'static str {
        match self {
            DefaultCatalog::RedhatOperators => "Red Hat Operators",
            DefaultCatalog::CertifiedOperators => "Certified Operators",
            DefaultCatalog::CommunityOperators => "Community Operators",
        }
    }

    /// CatalogSource priority, as on standalone OpenShift.
    pub fn priority(self) -> i64 {
        match self {
            DefaultCatalog::RedhatOperators => -100,
            DefaultCatalog::CertifiedOperators => -200,
            DefaultCatalog::CommunityOperators => -400,
        }
    }

    /// Memory request of the catalog server (the Red Hat index is the largest).
    pub fn memory_request(self) -> &'static str {
        match self {
            DefaultCatalog::RedhatOperators => "420Mi",
            _ => "160Mi",
        }
    }

    /// The per-catalog pinning annotation HyperShift defines on HostedCluster.
    pub fn pin_annotation(self) -> String {
        format!("hypershift.openshift.io/{}-catalog-image", self.name())
    }
}

impl std::fmt::Display for DefaultCatalog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// A `major.minor` OpenShift version used for catalog tags.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct MinorVersion {
    pub major: u64,
    pub minor: u64,
}

impl MinorVersion {
    pub fn new(major: u64, minor: u64) -> Self {
        Self { major, minor }
    }

    /// Parse `X.Y` or `X.Y.Z[-pre]`.
    pub fn parse(s: &str) -> Option<Self> {
        let s = s.trim().trim_start_matches('v');
        let mut it = s.split(['.', '-', '+']);
        let major = it.next()?.parse().ok()?;
        let minor = it.next()?.parse().ok()?;
        Some(Self { major, minor })
    }

    /// The previous minor. Crossing a major boundary uses [`LAST_MINOR_OF_MAJOR`].
    pub fn previous(self) -> Option<Self> {
        if self.minor > 0 {
            return Some(Self::new(self.major, self.minor - 1));
        }
        LAST_MINOR_OF_MAJOR
            .iter()
            .find(|(major, _)| *major + 1 == self.major)
            .map(|(major, minor)| Self::new(*major, *minor))
    }

    pub fn tag(self) -> String {
        format!("v{}.{}", self.major, self.minor)
    }
}

impl std::fmt::Display for MinorVersion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}", self.major, self.minor)
    }
}

/// Last minor of a finished major line, so `5.0` can fall back to `4.x`.
/// ASSUMPTION: OpenShift 4 ends at 4.22 (the newest catalog minor HyperShift caps at).
pub const LAST_MINOR_OF_MAJOR: &[(u64, u64)] = &[(4, 22)];

/// How many versions are tried per catalog by default (the release minor and three
/// earlier ones), as HyperShift does.
pub const DEFAULT_CANDIDATES: usize = 4;

/// Registry rewrite: a candidate starting with `source` gets `mirror` instead.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct RegistryOverride {
    pub source: String,
    pub mirror: String,
}

/// Apply the longest matching prefix override (on a path-segment boundary).
pub fn apply_registry_overrides(image: &str, overrides: &[RegistryOverride]) -> String {
    overrides
        .iter()
        .filter(|o| {
            !o.source.is_empty()
                && image.starts_with(o.source.as_str())
                && matches!(
                    image.as_bytes().get(o.source.len()),
                    Some(b'/' | b':' | b'@') | None
                )
        })
        .max_by_key(|o| o.source.len())
        .map(|o| format!("{}{}", o.mirror, &image[o.source.len()..]))
        .unwrap_or_else(|| image.to_string())
}

/// Parse HyperShift's `src=dst,src2=dst2` override annotation.
pub fn parse_registry_overrides(text: &str) -> Result<Vec<RegistryOverride>, String> {
    text.split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|pair| match pair.split_once('=') {
            Some((s, d)) if !s.trim().is_empty() && !d.trim().is_empty() => Ok(RegistryOverride {
                source: s.trim().to_string(),
                mirror: d.trim().to_string(),
            }),
            _ => Err(format!("{pair:?} is not of the form source=mirror")),
        })
        .collect()
}

/// The candidate tag references for one catalog, newest first.
pub fn candidates(
    catalog: DefaultCatalog,
    release: MinorVersion,
    cap: Option<MinorVersion>,
    count: usize,
    overrides: &[RegistryOverride],
) -> Vec<(MinorVersion, String)> {
    let mut v = match cap {
        Some(cap) if cap < release => cap,
        _ => release,
    };
    let mut out = Vec::with_capacity(count);
    for _ in 0..count.max(1) {
        let image = format!("{}:{}", catalog.repository(), v.tag());
        out.push((v, apply_registry_overrides(&image, overrides)));
        match v.previous() {
            Some(p) => v = p,
            None => break,
        }
    }
    out
}

/// What a registry said about one image reference.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LookupResult {
    /// The tag exists; its manifest digest (`sha256:...`) if known.
    Exists { digest: Option<String> },
    /// `manifest unknown` or `not found`: try an earlier minor.
    Missing,
    /// The registry refused our credentials (401/403): the choice cannot be made.
    Unauthorized { registry: String },
    /// Anything else (network, 5xx): the choice cannot be made now.
    Error(String),
}

/// Abstract "does this tag exist, and what is its digest" lookup.
pub trait ImageLookup {
    fn lookup(&self, image: &str) -> LookupResult;
}

/// A lookup backed by prefetched answers; unknown references count as errors.
#[derive(Clone, Debug, Default)]
pub struct StaticLookup(pub BTreeMap<String, LookupResult>);

impl ImageLookup for StaticLookup {
    fn lookup(&self, image: &str) -> LookupResult {
        self.0
            .get(image)
            .cloned()
            .unwrap_or_else(|| LookupResult::Error(format!("no answer for {image}")))
    }
}

/// A lookup that assumes every tag exists and knows no digests (offline `render`,
/// guest placement where HyperShift checks nothing either).
#[derive(Clone, Copy, Debug, Default)]
pub struct AssumeTagsExist;

impl ImageLookup for AssumeTagsExist {
    fn lookup(&self, _image: &str) -> LookupResult {
        LookupResult::Exists { digest: None }
    }
}

/// The image chosen for one catalog.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CatalogImage {
    /// The tag reference that was found (`repo:vX.Y`), after registry overrides.
    pub tag_ref: String,
    /// `repo@sha256:...` when the digest is known (what management pods run).
    pub pinned_ref: Option<String>,
    /// The catalog version that was found.
    pub version: String,
    /// True when it is older than the release minor (a fallback happened).
    pub fell_back: bool,
}

impl CatalogImage {
    /// The reference pods should run: the digest when known, else the tag.
    pub fn image(&self) -> &str {
        self.pinned_ref.as_deref().unwrap_or(&self.tag_ref)
    }

    /// An explicit user pin (`...@sha256:...`).
    pub fn pinned(image: &str) -> Self {
        Self {
            tag_ref: image.to_string(),
            pinned_ref: Some(image.to_string()),
            version: String::new(),
            fell_back: false,
        }
    }
}

/// Why no image could be chosen for a catalog.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum CatalogImageError {
    #[error("no catalog image found; tried {}", .tried.join(", "))]
    NotFound { tried: Vec<String> },
    #[error("registry lookup of {image} failed: {message}")]
    Lookup { image: String, message: String },
    #[error(
        "registry {registry} refused the pull secret for {image} (HTTP 401/403): the HostedCluster's pull secret cannot read it"
    )]
    Unauthorized { image: String, registry: String },
}

/// Choose the image of one catalog: the first candidate whose tag exists, pinned by
/// digest when the lookup knows it. A transient error on a candidate stops the search
/// (an earlier minor must not be picked just because the registry hiccupped).
pub fn select_image(
    catalog: DefaultCatalog,
    release: MinorVersion,
    cap: Option<MinorVersion>,
    count: usize,
    overrides: &[RegistryOverride],
    lookup: &dyn ImageLookup,
) -> Result<CatalogImage, CatalogImageError> {
    let cands = candidates(catalog, release, cap, count, overrides);
    let first = cands.first().map(|(v, _)| *v);
    let mut tried = Vec::new();
    for (version, image) in cands {
        match lookup.lookup(&image) {
            LookupResult::Exists { digest } => {
                let pinned_ref = digest.map(|d| {
                    let repo = image.rsplit_once(':').map(|(r, _)| r).unwrap_or(&image);
                    format!("{repo}@{d}")
                });
                tracing::debug!(%catalog, %image, ?pinned_ref, "catalog image selected");
                return Ok(CatalogImage {
                    tag_ref: image,
                    pinned_ref,
                    version: version.to_string(),
                    fell_back: Some(version) != first,
                });
            }
            LookupResult::Missing => tried.push(image),
            LookupResult::Unauthorized { registry } => {
                return Err(CatalogImageError::Unauthorized { image, registry });
            }
            LookupResult::Error(message) => {
                return Err(CatalogImageError::Lookup { image, message });
            }
        }
    }
    Err(CatalogImageError::NotFound { tried })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lookup(entries: &[(&str, LookupResult)]) -> StaticLookup {
        StaticLookup(
            entries
                .iter()
                .map(|(k, v)| (k.to_string(), v.clone()))
                .collect(),
        )
    }

    const RH: &str = "registry.redhat.io/redhat/redhat-operator-index";

    #[test]
    fn parses_versions() {
        assert_eq!(
            MinorVersion::parse("4.18.3"),
            Some(MinorVersion::new(4, 18))
        );
        assert_eq!(MinorVersion::parse("v4.19"), Some(MinorVersion::new(4, 19)));
        assert_eq!(
            MinorVersion::parse("4.20.0-rc.1"),
            Some(MinorVersion::new(4, 20))
        );
        assert_eq!(MinorVersion::parse("4"), None);
        assert_eq!(MinorVersion::parse("x.y"), None);
    }

    #[test]
    fn exact_tag_pinned_by_digest() {
        let l = lookup(&[(
            &format!("{RH}:v4.18"),
            LookupResult::Exists {
                digest: Some("sha256:aa".into()),
            },
        )]);
        let img = select_image(
            DefaultCatalog::RedhatOperators,
            MinorVersion::new(4, 18),
            None,
            4,
            &[],
            &l,
        )
        .unwrap();
        assert_eq!(img.image(), format!("{RH}@sha256:aa"));
        assert_eq!(img.version, "4.18");
        assert!(!img.fell_back);
    }

    #[test]
    fn falls_back_over_missing_minors() {
        let l = lookup(&[
            (&format!("{RH}:v4.20"), LookupResult::Missing),
            (&format!("{RH}:v4.19"), LookupResult::Missing),
            (
                &format!("{RH}:v4.18"),
                LookupResult::Exists {
                    digest: Some("sha256:bb".into()),
                },
            ),
        ]);
        let img = select_image(
            DefaultCatalog::RedhatOperators,
            MinorVersion::new(4, 20),
            None,
            4,
            &[],
            &l,
        )
        .unwrap();
        assert_eq!(img.version, "4.18");
        assert!(img.fell_back);
        assert_eq!(img.tag_ref, format!("{RH}:v4.18"));
    }

    #[test]
    fn gives_up_after_count_candidates() {
        let l = lookup(&[
            (&format!("{RH}:v4.20"), LookupResult::Missing),
            (&format!("{RH}:v4.19"), LookupResult::Missing),
            (&format!("{RH}:v4.18"), LookupResult::Missing),
            (&format!("{RH}:v4.17"), LookupResult::Missing),
            (
                &format!("{RH}:v4.16"),
                LookupResult::Exists { digest: None },
            ),
        ]);
        let err = select_image(
            DefaultCatalog::RedhatOperators,
            MinorVersion::new(4, 20),
            None,
            4,
            &[],
            &l,
        )
        .unwrap_err();
        match err {
            CatalogImageError::NotFound { tried } => assert_eq!(tried.len(), 4),
            other => panic!("unexpected {other:?}"),
        }
    }

    #[test]
    fn transient_error_does_not_fall_back() {
        let l = lookup(&[
            (
                &format!("{RH}:v4.20"),
                LookupResult::Error("timeout".into()),
            ),
            (
                &format!("{RH}:v4.19"),
                LookupResult::Exists { digest: None },
            ),
        ]);
        let err = select_image(
            DefaultCatalog::RedhatOperators,
            MinorVersion::new(4, 20),
            None,
            4,
            &[],
            &l,
        )
        .unwrap_err();
        assert!(matches!(err, CatalogImageError::Lookup { .. }));
    }

    #[test]
    fn cap_and_major_boundary() {
        let c = candidates(
            DefaultCatalog::CommunityOperators,
            MinorVersion::new(4, 25),
            Some(MinorVersion::new(4, 22)),
            2,
            &[],
        );
        assert_eq!(c[0].0, MinorVersion::new(4, 22));
        assert_eq!(c[1].0, MinorVersion::new(4, 21));
        let c = candidates(
            DefaultCatalog::CommunityOperators,
            MinorVersion::new(5, 1),
            None,
            4,
            &[],
        );
        let versions: Vec<String> = c.iter().map(|(v, _)| v.to_string()).collect();
        assert_eq!(versions, vec!["5.1", "5.0", "4.22", "4.21"]);
        // An unknown major boundary stops the list instead of inventing versions.
        let c = candidates(
            DefaultCatalog::CommunityOperators,
            MinorVersion::new(7, 0),
            None,
            4,
            &[],
        );
        assert_eq!(c.len(), 1);
    }

    #[test]
    fn registry_overrides_longest_prefix_on_boundary() {
        let o = parse_registry_overrides(
            "registry.redhat.io=mirror.example/rh, registry.redhat.io/redhat=mirror.example/idx",
        )
        .unwrap();
        assert_eq!(
            apply_registry_overrides(&format!("{RH}:v4.18"), &o),
            "mirror.example/idx/redhat-operator-index:v4.18"
        );
        assert_eq!(
            apply_registry_overrides("registry.redhat.io.evil/x:1", &o),
            "registry.redhat.io.evil/x:1"
        );
        assert!(parse_registry_overrides("nonsense").is_err());
        let c = candidates(
            DefaultCatalog::RedhatOperators,
            MinorVersion::new(4, 18),
            None,
            1,
            &o,
        );
        assert_eq!(c[0].1, "mirror.example/idx/redhat-operator-index:v4.18");
    }
}
