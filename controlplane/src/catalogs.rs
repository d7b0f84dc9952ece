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

    /// Name of the index image inside its registry namespace (`redhat-operator-index`).
    pub fn image_name(self) -> &'static str {
        self.repository()
            .rsplit_once('/')
            .map(|(_, n)| n)
            .unwrap_or(self.repository())
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

/// The registry and namespace of the default catalogs (`registry.redhat.io/redhat`).
pub const DEFAULT_CATALOG_REGISTRY: &str = "registry.redhat.io/redhat";
const RH_REGISTRY: &str = "registry.redhat.io";
const RH_NAMESPACE: &str = "redhat";

/// The newest catalog minor HyperShift uses (its `maxCatalogVersion`): a newer release
/// takes this minor's catalogs, falling back from there.
pub const HYPERSHIFT_MAX_CATALOG_VERSION: MinorVersion = MinorVersion {
    major: 4,
    minor: 22,
};

/// Parse HyperShift's `source=mirror,source2=mirror2` annotation as HyperShift does
/// (`support/util.ConvertImageRegistryOverrideStringToMap`): pairs split at `,`, each at its
/// first `=`; a pair without `=` or with an empty side is skipped, not fatal; one source
/// may name several mirrors, kept in order. Unlike HyperShift, white space around a pair
/// and its sides is trimmed. Returns the pairs and the skipped pieces (for a warning).
pub fn parse_registry_overrides(text: &str) -> (Vec<RegistryOverride>, Vec<String>) {
    let mut pairs = Vec::new();
    let mut skipped = Vec::new();
    if text.trim().is_empty() || text.trim() == "=" {
        return (pairs, skipped);
    }
    for piece in text.split(',') {
        match piece.split_once('=') {
            Some((s, m)) if !s.trim().is_empty() && !m.trim().is_empty() => {
                pairs.push(RegistryOverride {
                    source: s.trim().to_string(),
                    mirror: m.trim().to_string(),
                })
            }
            _ => skipped.push(piece.to_string()),
        }
    }
    (pairs, skipped)
}

/// Whether HyperShift applies an override of this source to the default catalogs.
pub fn applies_to_catalogs(source: &str) -> bool {
    source == DEFAULT_CATALOG_REGISTRY || source == RH_REGISTRY
}

/// The registries (with namespace) the default catalogs are looked for in, in order, with
/// HyperShift's replacement semantics (`support/catalogs.computeCatalogImages`):
/// `registry.redhat.io/redhat=M` uses `M` as registry and namespace;
/// `registry.redhat.io=M` uses `M` when it has a path (`quay.io/org`), else `M/redhat`;
/// other sources do not apply to catalogs. Without any, `registry.redhat.io/redhat`.
/// (HyperShift's result with both sources depends on Go's map order; this takes the
/// `registry.redhat.io/redhat` mirrors first, one of its two outcomes.)
pub fn catalog_registries(overrides: &[RegistryOverride]) -> Vec<String> {
    let trim = |m: &str| m.trim_end_matches('/').to_string();
    let mut out: Vec<String> = overrides
        .iter()
        .filter(|o| o.source == DEFAULT_CATALOG_REGISTRY)
        .map(|o| trim(&o.mirror))
        .collect();
    out.extend(
        overrides
            .iter()
            .filter(|o| o.source == RH_REGISTRY)
            .map(|o| {
                let m = trim(&o.mirror);
                if m.contains('/') {
                    m
                } else {
                    format!("{m}/{RH_NAMESPACE}")
                }
            }),
    );
    let mut seen = std::collections::BTreeSet::new();
    out.retain(|r| !r.is_empty() && seen.insert(r.clone()));
    if out.is_empty() {
        out.push(DEFAULT_CATALOG_REGISTRY.to_string());
    }
    out
}

/// The candidate tag references for one catalog, newest first: `count` minors from the
/// release minor (capped), and within each minor every registry of
/// [`catalog_registries`] in order.
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
    let registries = catalog_registries(overrides);
    let name = catalog.image_name();
    let mut out = Vec::with_capacity(count * registries.len());
    for _ in 0..count.max(1) {
        for r in &registries {
            out.push((v, format!("{r}/{name}:{}", v.tag())));
        }
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
    /// Asked, and the registry has not answered yet (the lookup goes on off the reconcile
    /// slot; the HostedCluster is reconciled again when it ends).
    Pending,
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
    #[error("the registry has not answered for {image} yet; still looking")]
    Pending { image: String },
}

impl CatalogImageError {
    /// Whether the answer says something about the image (missing, access refused), as
    /// opposed to a registry that failed or has not answered yet: only a definite answer
    /// may change what is served (issue 38 item 3).
    pub fn is_definite(&self) -> bool {
        matches!(self, Self::NotFound { .. } | Self::Unauthorized { .. })
    }
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
    // A mirror that refuses our pull secret is passed over like a missing tag (another
    // mirror may serve it); refused everywhere it is its own reason, not "not found".
    let mut refused: Option<(String, String)> = None;
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
                refused.get_or_insert((image.clone(), registry));
                tried.push(image);
            }
            LookupResult::Error(message) => {
                return Err(CatalogImageError::Lookup { image, message });
            }
            LookupResult::Pending => return Err(CatalogImageError::Pending { image }),
        }
    }
    match refused {
        Some((image, registry)) => Err(CatalogImageError::Unauthorized { image, registry }),
        None => Err(CatalogImageError::NotFound { tried }),
    }
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
        assert!(!err.is_definite());
        let l = lookup(&[
            (&format!("{RH}:v4.20"), LookupResult::Pending),
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
        assert_eq!(
            err,
            CatalogImageError::Pending {
                image: format!("{RH}:v4.20")
            }
        );
        assert!(!err.is_definite());
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

    /// HyperShift's cases (`support/catalogs/images_test.go` and `support/util`): the
    /// annotation's pairs, several mirrors per source in order, malformed pairs skipped, and
    /// the replacement semantics of its two catalog sources.
    #[test]
    fn registry_overrides_follow_hypershift() {
        let regs = |text: &str| catalog_registries(&parse_registry_overrides(text).0);
        let first = |text: &str| {
            candidates(
                DefaultCatalog::RedhatOperators,
                MinorVersion::new(4, 18),
                None,
                1,
                &parse_registry_overrides(text).0,
            )
            .into_iter()
            .map(|(_, i)| i)
            .collect::<Vec<_>>()
        };
        // no overrides: Red Hat's registry
        assert_eq!(regs(""), ["registry.redhat.io/redhat"]);
        assert_eq!(regs("="), ["registry.redhat.io/redhat"]);
        // registry.redhat.io=<host>: the namespace stays redhat
        assert_eq!(
            first("registry.redhat.io=mirror.example"),
            ["mirror.example/redhat/redhat-operator-index:v4.18"]
        );
        // registry.redhat.io=<host>/<org>: replaces registry and namespace (was
        // quay.io/org/redhat/redhat-operator-index before)
        assert_eq!(
            first("registry.redhat.io=quay.io/org"),
            ["quay.io/org/redhat-operator-index:v4.18"]
        );
        // registry.redhat.io/redhat=<anything>: used as registry and namespace
        assert_eq!(
            first("registry.redhat.io/redhat=mirror.example/idx"),
            ["mirror.example/idx/redhat-operator-index:v4.18"]
        );
        // several mirrors of one source, tried in order within each minor
        assert_eq!(
            first("registry.redhat.io/redhat=a.example/x,registry.redhat.io/redhat=b.example/y"),
            [
                "a.example/x/redhat-operator-index:v4.18",
                "b.example/y/redhat-operator-index:v4.18"
            ]
        );
        // both sources: registry.redhat.io/redhat first
        assert_eq!(
            regs("registry.redhat.io=c.example,registry.redhat.io/redhat=a.example/x"),
            ["a.example/x", "c.example/redhat"]
        );
        // other sources do not apply to catalogs
        assert_eq!(
            regs("quay.io=mirror.example"),
            ["registry.redhat.io/redhat"]
        );
        assert!(!applies_to_catalogs("registry.redhat.io.evil"));
        // malformed pairs are skipped, the good ones kept
        let (pairs, skipped) = parse_registry_overrides(
            "nonsense,=x,registry.redhat.io=,registry.redhat.io=m.example",
        );
        assert_eq!(
            pairs,
            [RegistryOverride {
                source: "registry.redhat.io".into(),
                mirror: "m.example".into()
            }]
        );
        assert_eq!(skipped, ["nonsense", "=x", "registry.redhat.io="]);
        // a mirror value may itself hold '=' (split at the first)
        assert_eq!(
            parse_registry_overrides("registry.redhat.io/redhat=m.example/a=b").0[0].mirror,
            "m.example/a=b"
        );
        // minors × mirrors, newest minor first
        let c = candidates(
            DefaultCatalog::CertifiedOperators,
            MinorVersion::new(4, 18),
            None,
            2,
            &parse_registry_overrides(
                "registry.redhat.io=a.example/o,registry.redhat.io=b.example",
            )
            .0,
        );
        let c: Vec<&str> = c.iter().map(|(_, i)| i.as_str()).collect();
        assert_eq!(
            c,
            [
                "a.example/o/certified-operator-index:v4.18",
                "b.example/redhat/certified-operator-index:v4.18",
                "a.example/o/certified-operator-index:v4.17",
                "b.example/redhat/certified-operator-index:v4.17",
            ]
        );
    }

    #[test]
    fn a_refusing_mirror_is_passed_over_and_refused_everywhere_is_unauthorized() {
        let o = parse_registry_overrides(
            "registry.redhat.io/redhat=closed.example/x,registry.redhat.io/redhat=open.example/y",
        )
        .0;
        let refused = |img: &str| LookupResult::Unauthorized {
            registry: img.split('/').next().unwrap().to_string(),
        };
        let l = lookup(&[
            (
                "closed.example/x/redhat-operator-index:v4.18",
                refused("closed.example"),
            ),
            (
                "open.example/y/redhat-operator-index:v4.18",
                LookupResult::Exists { digest: None },
            ),
        ]);
        let got = select_image(
            DefaultCatalog::RedhatOperators,
            MinorVersion::new(4, 18),
            None,
            1,
            &o,
            &l,
        )
        .unwrap();
        assert_eq!(got.tag_ref, "open.example/y/redhat-operator-index:v4.18");
        let l = lookup(&[
            (
                "closed.example/x/redhat-operator-index:v4.18",
                refused("closed.example"),
            ),
            (
                "open.example/y/redhat-operator-index:v4.18",
                LookupResult::Missing,
            ),
        ]);
        let err = select_image(
            DefaultCatalog::RedhatOperators,
            MinorVersion::new(4, 18),
            None,
            1,
            &o,
            &l,
        )
        .unwrap_err();
        assert!(
            matches!(&err, CatalogImageError::Unauthorized { registry, .. } if registry == "closed.example"),
            "{err:?}"
        );
    }
}
