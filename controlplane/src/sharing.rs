//! Shared catalogs (issue 18): which default catalogs of one hosted cluster are served by
//! a catalog Deployment shared with other hosted clusters, and which by its own copy.
//!
//! Pure. [`decide`] looks at one hosted cluster's catalog; [`plan`] gathers every hosted
//! cluster's decision (read back from the HostedOLMs' status, so the reference count is
//! derived from state, never stored) into the shared Deployments that must exist and who
//! uses each. Rendering of the shared objects is in [`crate::render::shared`].
//!
//! A catalog is shared only when nothing of the hosted cluster can change what the shared
//! server serves: management placement, the catalog image resolved to a digest at the
//! default catalog repository (with this cluster's own pull secret, so a resolution proves
//! its credentials read the image), our catalog server with the controller's image, and
//! no pin, registry override or `imageContentSources` mirror of that catalog. Otherwise
//! the cluster gets its own copy and the reason says why.

use std::collections::{BTreeMap, BTreeSet};

use serde::Serialize;

use crate::catalogs::{CatalogImage, DEFAULT_CATALOG_REGISTRY, DefaultCatalog, catalog_registries};
use crate::hostedolm::{CatalogPlacement, CatalogServerKind, CatalogSharing};
use crate::validate::ValidInput;

/// The namespace of the shared catalog Deployments.
pub const SHARED_NAMESPACE: &str = "hcp-olm-catalogs";

/// The controller's own namespace as the manifests install it (`manifests/controller/`;
/// the admission policies name its ServiceAccount there).
pub const CONTROLLER_NAMESPACE: &str = "hcp-olm-system";

/// Whether `namespace` is one of ours ([`SHARED_NAMESPACE`], [`CONTROLLER_NAMESPACE`]).
/// Both are possible `<namespace>-<name>` HCP namespace values (HostedCluster
/// `hcp-olm/catalogs`, `hcp-olm/system`; issue 35, item 9): the controller never treats
/// them as HCP namespaces, never writes or prunes a hosted cluster's objects there and never
/// counts them as users of a shared catalog, whatever labels or HostedControlPlanes they
/// carry. A HostedCluster whose HCP namespace is one of them is refused
/// (`ControlPlaneNamespaceReserved`).
pub fn reserved(namespace: &str) -> bool {
    namespace == SHARED_NAMESPACE || namespace == CONTROLLER_NAMESPACE
}

/// The longest a registry answer that admits a cluster to a shared catalog is reused, and
/// the longest a cluster's recorded use of a shared catalog counts without a complete
/// reconcile confirming it (issue 35, item 6): credentials revoked at the registry stop
/// admitting a cluster within this interval plus one pass (the pass runs every 10 s), and
/// a cluster whose passes stop early (a dead guest API server) is re-checked, i.e. dropped,
/// within it. Three resyncs (5 minutes each by default), so a cluster that converges keeps
/// its use across a failed pass or two.
pub const ENTITLEMENT_REFRESH: std::time::Duration = std::time::Duration::from_secs(15 * 60);

/// Most HCP namespaces one shared catalog serves. Each is one entry of its NetworkPolicy
/// (listed in chunks of [`NAMESPACES_PER_PEER`]); beyond this the shared pass refuses to
/// render that catalog (see [`plan`]), so the object stays far below the API server's
/// request size limit (5000 names of at most 63 bytes: about 340 KB).
pub const MAX_USERS: usize = 5000;

/// Namespaces per `from` peer of the shared NetworkPolicy.
pub const NAMESPACES_PER_PEER: usize = 1000;

/// Why a catalog is shared or not (`status.catalogs[].reason`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub enum SharingReason {
    /// Shared with the other hosted clusters of this catalog minor.
    SharedCatalog,
    /// `catalogSharing: Own` (HostedOLM or controller default).
    SharingDisabled,
    /// Guest placement: OLM runs the catalog pods in the guest.
    GuestPlacement,
    /// The HostedOLM asks for `catalogServer: Opm`; shared catalogs run our server.
    OpmRequested,
    /// The HostedOLM overrides the catalog server image.
    CatalogServerImageOverridden,
    /// The catalog is pinned (HostedCluster annotation or `spec.images.catalogs`).
    CatalogPinned,
    /// A registry override or an `imageContentSources` mirror applies to the catalog.
    CatalogMirrored,
    /// The image was not resolved to a digest at the default repository with this
    /// cluster's pull secret.
    DigestNotResolved,
    /// The lookup used the controller's credentials, not this cluster's pull secret (absent
    /// from its HCP namespace), so it proves nothing about what this cluster may read.
    OwnPullSecretNotUsed,
    /// The image's catalog minor is not of the form `X.Y`.
    InvalidCatalogVersion,
    /// An administrator's mirror answered without this cluster's credentials (anonymously),
    /// and the default catalog registry did not grant this cluster's pull secret: nothing
    /// shows the cluster may read the image.
    EntitlementNotProven,
}

impl SharingReason {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::SharedCatalog => "SharedCatalog",
            Self::SharingDisabled => "SharingDisabled",
            Self::GuestPlacement => "GuestPlacement",
            Self::OpmRequested => "OpmRequested",
            Self::CatalogServerImageOverridden => "CatalogServerImageOverridden",
            Self::CatalogPinned => "CatalogPinned",
            Self::CatalogMirrored => "CatalogMirrored",
            Self::DigestNotResolved => "DigestNotResolved",
            Self::OwnPullSecretNotUsed => "OwnPullSecretNotUsed",
            Self::InvalidCatalogVersion => "InvalidCatalogVersion",
            Self::EntitlementNotProven => "EntitlementNotProven",
        }
    }
}

/// The identity of one shared catalog Deployment: a catalog and its catalog minor. The
/// digest is not part of it: a new digest of the tag rolls the same Deployment, once for
/// every user.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub struct SharedKey {
    pub catalog: DefaultCatalog,
    /// `X.Y` (checked by [`SharedKey::new`]).
    pub version: String,
}

impl SharedKey {
    /// None unless `version` is `X.Y` with decimal numbers.
    pub fn new(catalog: DefaultCatalog, version: &str) -> Option<Self> {
        let (major, minor) = version.split_once('.')?;
        let num = |s: &str| !s.is_empty() && s.len() <= 4 && s.bytes().all(|b| b.is_ascii_digit());
        (num(major) && num(minor)).then(|| Self {
            catalog,
            version: version.to_string(),
        })
    }

    /// Name of the Deployment, Service, PodDisruptionBudget and NetworkPolicy
    /// (`hcp-olm-redhat-operators-v4-18`; at most 43 characters).
    pub fn name(&self) -> String {
        format!(
            "hcp-olm-{}-v{}",
            self.catalog.name(),
            self.version.replace('.', "-")
        )
    }

    /// The Service's DNS name.
    pub fn host(&self) -> String {
        format!("{}.{SHARED_NAMESPACE}.svc", self.name())
    }

    /// `namespace/name` of the Deployment (`status.catalogs[].servingDeployment`).
    pub fn deployment_ref(&self) -> String {
        format!("{SHARED_NAMESPACE}/{}", self.name())
    }

    /// Parse a `servingDeployment` back (None when it is not a shared one).
    pub fn from_deployment_ref(catalog: DefaultCatalog, s: &str) -> Option<Self> {
        let name = s.strip_prefix(SHARED_NAMESPACE)?.strip_prefix('/')?;
        let rest = name
            .strip_prefix("hcp-olm-")?
            .strip_prefix(catalog.name())?
            .strip_prefix("-v")?;
        let (major, minor) = rest.split_once('-')?;
        Self::new(catalog, &format!("{major}.{minor}"))
    }
}

/// Shared or own.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub enum Sharing {
    Shared(SharedKey),
    Own,
}

/// The decision for one catalog of one hosted cluster.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Decision {
    pub sharing: Sharing,
    pub reason: SharingReason,
}

impl Decision {
    fn own(reason: SharingReason) -> Self {
        Self {
            sharing: Sharing::Own,
            reason,
        }
    }

    pub fn key(&self) -> Option<&SharedKey> {
        match &self.sharing {
            Sharing::Shared(k) => Some(k),
            Sharing::Own => None,
        }
    }

    /// `shared` or `own` (`status.catalogs[].sharing`).
    pub fn sharing_str(&self) -> &'static str {
        match self.sharing {
            Sharing::Shared(_) => "shared",
            Sharing::Own => "own",
        }
    }
}

/// Whether an `imageContentSources` source covers a repository (HyperShift and the
/// container runtimes match a source as a prefix at a path boundary).
fn source_covers(source: &str, repository: &str) -> bool {
    let source = source.trim_end_matches('/');
    !source.is_empty()
        && (repository == source
            || repository
                .strip_prefix(source)
                .is_some_and(|rest| rest.starts_with('/')))
}

/// The digest reference of an image resolved at the catalog's default repository, or
/// None (not resolved, or resolved elsewhere).
fn canonical_digest_ref(catalog: DefaultCatalog, image: &CatalogImage) -> Option<&str> {
    let pinned = image.pinned_ref.as_deref()?;
    let repo = catalog.repository();
    let tag_ok = image
        .tag_ref
        .strip_prefix(repo)
        .is_some_and(|t| t.starts_with(':'));
    let digest = pinned.strip_prefix(repo)?.strip_prefix("@sha256:")?;
    let digest_ok = digest.len() == 64 && digest.bytes().all(|b| b.is_ascii_hexdigit());
    (tag_ok && digest_ok).then_some(pinned)
}

/// Whether any catalog of this hosted cluster may be shared ([`decide`]'s first checks,
/// which need no image): its catalog answers then admit it to shared catalogs and are
/// reused at most [`ENTITLEMENT_REFRESH`].
pub fn may_share(v: &ValidInput) -> bool {
    v.placement == CatalogPlacement::Management && v.catalog_sharing != CatalogSharing::Own
}

/// Decide whether `catalog` of this hosted cluster is shared. `image` is the image the
/// controller selected for it (None when none was selected).
pub fn decide(v: &ValidInput, catalog: DefaultCatalog, image: Option<&CatalogImage>) -> Decision {
    use SharingReason::*;
    if v.placement != CatalogPlacement::Management {
        return Decision::own(GuestPlacement);
    }
    if v.catalog_sharing == CatalogSharing::Own {
        return Decision::own(SharingDisabled);
    }
    if v.catalog_server_requested == Some(CatalogServerKind::Opm) {
        return Decision::own(OpmRequested);
    }
    if v.catalog_server_image_overridden {
        return Decision::own(CatalogServerImageOverridden);
    }
    if v.catalog_pins.contains_key(&catalog) {
        return Decision::own(CatalogPinned);
    }
    let registry_overridden =
        catalog_registries(&v.registry_overrides) != [DEFAULT_CATALOG_REGISTRY];
    let mirrored = v
        .image_content_sources
        .iter()
        .any(|(source, _)| source_covers(source, catalog.repository()));
    if registry_overridden || mirrored {
        return Decision::own(CatalogMirrored);
    }
    if !v.lookup_credentials_are_own {
        return Decision::own(OwnPullSecretNotUsed);
    }
    if v.entitlement_unproven.contains(&catalog) {
        return Decision::own(EntitlementNotProven);
    }
    let Some(image) = image.filter(|i| canonical_digest_ref(catalog, i).is_some()) else {
        return Decision::own(DigestNotResolved);
    };
    match SharedKey::new(catalog, &image.version) {
        Some(key) => Decision {
            sharing: Sharing::Shared(key),
            reason: SharedCatalog,
        },
        None => Decision::own(InvalidCatalogVersion),
    }
}

/// The shared catalogs one hosted cluster uses, with the digest reference it resolved for
/// each (what its render points at; see [`decide`]).
pub fn shared_uses(
    v: &ValidInput,
    images: &BTreeMap<DefaultCatalog, Result<CatalogImage, crate::catalogs::CatalogImageError>>,
) -> Vec<(SharedKey, String)> {
    v.enabled_catalogs
        .iter()
        .filter_map(|c| {
            let img = images.get(c)?.as_ref().ok()?;
            let key = decide(v, *c, Some(img)).key()?.clone();
            Some((key, img.image().to_string()))
        })
        .collect()
}

/// One hosted cluster's use of a shared catalog, as its HostedOLM's status says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Use {
    /// The HCP namespace.
    pub namespace: String,
    pub key: SharedKey,
    /// The digest reference this cluster resolved (`repo@sha256:...`).
    pub image: String,
}

/// One shared catalog Deployment as it must be.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct SharedCatalog {
    pub key: SharedKey,
    /// The image served (`repo@sha256:...`).
    pub image: String,
    /// The HCP namespaces using it, sorted.
    pub users: BTreeSet<String>,
}

/// What [`plan`] refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PlanError {
    #[error("shared catalog {name} has {users} users; at most {max} are served by one Deployment")]
    TooManyUsers {
        name: String,
        users: usize,
        max: usize,
    },
}

/// The digest a shared catalog serves when its users resolved different ones (a refresh
/// in progress): the one most users resolved, ties broken by the greatest reference, so
/// every controller picks the same one. Users only ever resolve the default repository's
/// tag (see [`decide`]), so any of them is that tag's content at some moment.
fn chosen_image(images: &BTreeMap<String, usize>) -> Option<String> {
    images
        .iter()
        .max_by(|a, b| a.1.cmp(b.1).then(a.0.cmp(b.0)))
        .map(|(i, _)| i.clone())
}

/// The shared catalogs that must exist, from every hosted cluster's use, and the ones
/// refused (more than [`MAX_USERS`] users: their objects are left as they are and the
/// error is logged; splitting a catalog over several Deployments is not built).
pub fn plan(uses: &[Use]) -> (Vec<SharedCatalog>, Vec<PlanError>) {
    let mut by_key: BTreeMap<&SharedKey, (BTreeSet<String>, BTreeMap<String, usize>)> =
        BTreeMap::new();
    for u in uses {
        let e = by_key.entry(&u.key).or_default();
        e.0.insert(u.namespace.clone());
        *e.1.entry(u.image.clone()).or_default() += 1;
    }
    let mut out = Vec::new();
    let mut errs = Vec::new();
    for (key, (users, images)) in by_key {
        if users.len() > MAX_USERS {
            errs.push(PlanError::TooManyUsers {
                name: key.name(),
                users: users.len(),
                max: MAX_USERS,
            });
            continue;
        }
        if let Some(image) = chosen_image(&images) {
            out.push(SharedCatalog {
                key: key.clone(),
                image,
                users,
            });
        }
    }
    (out, errs)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::catalogs::RegistryOverride;

    const D: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

    fn image(catalog: DefaultCatalog, version: &str) -> CatalogImage {
        CatalogImage {
            tag_ref: format!("{}:v{version}", catalog.repository()),
            pinned_ref: Some(format!("{}@sha256:{D}", catalog.repository())),
            version: version.to_string(),
            fell_back: false,
        }
    }

    fn valid() -> ValidInput {
        let hc: crate::hostedcluster::HostedCluster = serde_yaml_ng::from_str(
            r#"
apiVersion: hypershift.openshift.io/v1beta1
kind: HostedCluster
metadata: {namespace: clusters, name: a}
spec:
  release: {image: "quay.io/openshift-release-dev/ocp-release:4.18.3-x86_64"}
"#,
        )
        .expect("hostedcluster");
        let facts = crate::validate::ReleaseFacts {
            version: Some("4.18.3".into()),
            olm_image: Some("quay.io/olm:x".into()),
            operator_registry_image: Some("quay.io/opm:x".into()),
            payload_problem: None,
        };
        let mut v =
            crate::validate::validate(&hc, None, &facts, &Default::default()).expect("valid");
        v.lookup_credentials_are_own = true;
        v
    }

    const RH: DefaultCatalog = DefaultCatalog::RedhatOperators;

    #[test]
    fn shared_by_default_when_resolved_at_the_default_repository() {
        let v = valid();
        let d = decide(&v, RH, Some(&image(RH, "4.18")));
        assert_eq!(d.reason, SharingReason::SharedCatalog);
        let k = d.key().expect("shared");
        assert_eq!(k.name(), "hcp-olm-redhat-operators-v4-18");
        assert_eq!(
            k.host(),
            "hcp-olm-redhat-operators-v4-18.hcp-olm-catalogs.svc"
        );
        assert_eq!(
            SharedKey::from_deployment_ref(RH, &k.deployment_ref()),
            Some(k.clone())
        );
        assert_eq!(d.sharing_str(), "shared");
    }

    #[test]
    fn own_with_a_reason_for_each_unsafe_case() {
        let img = image(RH, "4.18");
        let check = |v: &ValidInput, img: Option<&CatalogImage>, want: SharingReason| {
            let d = decide(v, RH, img);
            assert_eq!((d.sharing_str(), d.reason), ("own", want));
        };
        let mut v = valid();
        v.placement = CatalogPlacement::Guest;
        check(&v, Some(&img), SharingReason::GuestPlacement);
        let mut v = valid();
        v.catalog_sharing = CatalogSharing::Own;
        check(&v, Some(&img), SharingReason::SharingDisabled);
        let mut v = valid();
        v.catalog_server_requested = Some(CatalogServerKind::Opm);
        check(&v, Some(&img), SharingReason::OpmRequested);
        let mut v = valid();
        v.catalog_server_image_overridden = true;
        check(&v, Some(&img), SharingReason::CatalogServerImageOverridden);
        let mut v = valid();
        v.entitlement_unproven.insert(RH);
        check(&v, Some(&img), SharingReason::EntitlementNotProven);
        // another catalog's unproven answer does not matter
        let mut v = valid();
        v.entitlement_unproven
            .insert(DefaultCatalog::CommunityOperators);
        check_shared(&v, &img);
        let mut v = valid();
        v.catalog_pins
            .insert(RH, format!("{}@sha256:{D}", RH.repository()));
        check(&v, Some(&img), SharingReason::CatalogPinned);
        // a pin of another catalog does not matter
        let mut v = valid();
        v.catalog_pins.insert(
            DefaultCatalog::CommunityOperators,
            format!("x.example/c@sha256:{D}"),
        );
        check_shared(&v, &img);
        let mut v = valid();
        v.registry_overrides = vec![RegistryOverride {
            source: "registry.redhat.io".into(),
            mirror: "mirror.example".into(),
        }];
        check(&v, Some(&img), SharingReason::CatalogMirrored);
        // an override of a source that does not apply to catalogs does not matter
        let mut v = valid();
        v.registry_overrides = vec![RegistryOverride {
            source: "quay.io".into(),
            mirror: "mirror.example".into(),
        }];
        check_shared(&v, &img);
        for source in [
            "registry.redhat.io",
            "registry.redhat.io/redhat/",
            RH.repository(),
        ] {
            let mut v = valid();
            v.image_content_sources = vec![(source.into(), vec!["m.example/x".into()])];
            check(&v, Some(&img), SharingReason::CatalogMirrored);
        }
        let mut v = valid();
        v.image_content_sources = vec![("registry.redhat.io/redhat-other".into(), vec![])];
        check_shared(&v, &img);
        let mut v = valid();
        v.lookup_credentials_are_own = false;
        check(&v, Some(&img), SharingReason::OwnPullSecretNotUsed);
        let v = valid();
        check(&v, None, SharingReason::DigestNotResolved);
        let mut tag_only = img.clone();
        tag_only.pinned_ref = None;
        check(&v, Some(&tag_only), SharingReason::DigestNotResolved);
        let mut elsewhere = img.clone();
        elsewhere.tag_ref = "mirror.example/redhat/redhat-operator-index:v4.18".into();
        elsewhere.pinned_ref = Some(format!(
            "mirror.example/redhat/redhat-operator-index@sha256:{D}"
        ));
        check(&v, Some(&elsewhere), SharingReason::DigestNotResolved);
        let mut bad_digest = img.clone();
        bad_digest.pinned_ref = Some(format!("{}@sha256:zz", RH.repository()));
        check(&v, Some(&bad_digest), SharingReason::DigestNotResolved);
        let mut bad_version = img.clone();
        bad_version.version = "4.18/../x".into();
        check(&v, Some(&bad_version), SharingReason::InvalidCatalogVersion);
    }

    fn check_shared(v: &ValidInput, img: &CatalogImage) {
        assert_eq!(
            decide(v, RH, Some(img)).reason,
            SharingReason::SharedCatalog
        );
    }

    #[test]
    fn shared_key_refuses_names_that_are_not_minors() {
        assert!(SharedKey::new(RH, "4.18").is_some());
        for bad in ["", "4", "4.", ".1", "4.18.1", "a.b", "4.-1", "99999.1"] {
            assert!(SharedKey::new(RH, bad).is_none(), "{bad}");
        }
        assert_eq!(SharedKey::from_deployment_ref(RH, "ns/x"), None);
        assert_eq!(
            SharedKey::from_deployment_ref(RH, "hcp-olm-catalogs/hcp-olm-redhat-operators-v4-x"),
            None
        );
        assert_eq!(
            SharedKey::from_deployment_ref(
                DefaultCatalog::CommunityOperators,
                "hcp-olm-catalogs/hcp-olm-redhat-operators-v4-18"
            ),
            None
        );
    }

    fn use_(ns: &str, version: &str, digest_char: char) -> Use {
        Use {
            namespace: ns.into(),
            key: SharedKey::new(RH, version).expect("key"),
            image: format!(
                "{}@sha256:{}",
                RH.repository(),
                digest_char.to_string().repeat(64)
            ),
        }
    }

    #[test]
    fn plan_counts_users_from_state_and_agrees_on_one_digest() {
        let (plan_, errs) = plan(&[
            use_("clusters-b", "4.18", 'a'),
            use_("clusters-a", "4.18", 'b'),
            use_("clusters-c", "4.18", 'b'),
            use_("clusters-d", "4.17", 'c'),
        ]);
        assert!(errs.is_empty());
        assert_eq!(plan_.len(), 2);
        let v418 = plan_
            .iter()
            .find(|s| s.key.version == "4.18")
            .expect("4.18");
        assert_eq!(
            v418.users.iter().map(String::as_str).collect::<Vec<_>>(),
            ["clusters-a", "clusters-b", "clusters-c"]
        );
        assert!(v418.image.ends_with(&"b".repeat(64)), "majority digest");
        // a tie: the greatest reference, whatever the order of the input
        let (p1, _) = plan(&[use_("x", "4.18", 'a'), use_("y", "4.18", 'b')]);
        let (p2, _) = plan(&[use_("y", "4.18", 'b'), use_("x", "4.18", 'a')]);
        assert_eq!(p1, p2);
        assert!(p1[0].image.ends_with(&"b".repeat(64)));
        // no users: nothing
        assert!(plan(&[]).0.is_empty());
    }

    #[test]
    fn plan_refuses_more_users_than_the_bound() {
        let uses: Vec<Use> = (0..=MAX_USERS)
            .map(|i| use_(&format!("ns-{i}"), "4.18", 'a'))
            .collect();
        let (p, errs) = plan(&uses);
        assert!(p.is_empty());
        assert!(
            matches!(errs[..], [PlanError::TooManyUsers { users, .. }] if users == MAX_USERS + 1)
        );
    }
}
