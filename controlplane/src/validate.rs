//! Validation: HostedCluster + HostedOLM overrides + resolved release facts →
//! [`ValidInput`], or every problem found as a [`ConditionReason`].

use std::collections::BTreeMap;
use std::net::IpAddr;

use k8s_openapi::api::core::v1::Toleration;
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

use crate::catalogs::{self, DEFAULT_CANDIDATES, DefaultCatalog, MinorVersion, RegistryOverride};
use crate::hostedcluster::{
    HCP_PULL_SECRET, HostedCluster, HostedClusterSpec, REGISTRY_OVERRIDES_ANNOTATION,
    SERVICE_NETWORK_ADMIN_KUBECONFIG,
};
use crate::hostedolm::{
    CatalogPlacement, CatalogServerKind, CatalogSharing, HostedOLMSpec, HyperShiftOLMMode,
    ImageOverrides, SubscriptionDefaults, TunnelServiceType,
};
use crate::operatorhub::OperatorHubSpec;

/// Facts the runtime resolved from the release payload (image labels and references).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ReleaseFacts {
    /// `io.openshift.release` label of the release image (e.g. `4.18.3`).
    pub version: Option<String>,
    /// Release-payload image `operator-lifecycle-manager`.
    pub olm_image: Option<String>,
    /// Release-payload image `operator-registry`.
    pub operator_registry_image: Option<String>,
    /// Why the OLM image could not be taken from the release payload (reported when
    /// neither a flag nor a HostedOLM override names one).
    pub payload_problem: Option<PayloadProblem>,
}

/// A release payload whose component images could not be read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PayloadProblem {
    /// The release image or its `release-manifests/image-references` is unreadable.
    Unreadable(String),
    /// The payload does not name an `operator-lifecycle-manager` image.
    OLMImageMissing(String),
    /// A manifest or blob fetched by digest (from any mirror) is not that digest.
    DigestMismatch(String),
    /// A registry answer larger than its bound.
    TooLarge(String),
}

/// Settings of the controller installation (flags of the controller Deployment).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ControllerDefaults {
    pub catalog_server_image: String,
    pub tunnel_gateway_image: String,
    pub guest_agent_image: String,
    /// Secret in the HCP namespace with the guest kubeconfig for OLM pods.
    pub kubeconfig_secret: String,
    /// Key of the kubeconfig in that Secret.
    pub kubeconfig_key: String,
    /// Pull secret in the HCP namespace used by catalog pods.
    pub pull_secret: String,
    /// Newest catalog minor (None: no cap). Default: HyperShift's cap (4.22).
    pub max_catalog_version: Option<MinorVersion>,
    /// Catalog sharing where a HostedOLM does not set `spec.catalogSharing`
    /// (`--catalog-sharing`, default Shared).
    pub catalog_sharing: CatalogSharing,
}

impl Default for ControllerDefaults {
    fn default() -> Self {
        let v = env!("CARGO_PKG_VERSION");
        Self {
            catalog_server_image: format!("quay.io/hcp-olm/hcp-olm-catalog-server:v{v}"),
            tunnel_gateway_image: format!("quay.io/hcp-olm/hcp-olm-tunnel-gateway:v{v}"),
            guest_agent_image: format!("quay.io/hcp-olm/hcp-olm-guest-agent:v{v}"),
            kubeconfig_secret: SERVICE_NETWORK_ADMIN_KUBECONFIG.to_string(),
            kubeconfig_key: "kubeconfig".to_string(),
            pull_secret: HCP_PULL_SECRET.to_string(),
            max_catalog_version: Some(crate::catalogs::HYPERSHIFT_MAX_CATALOG_VERSION),
            catalog_sharing: CatalogSharing::Shared,
        }
    }
}

/// Whether a problem blocks (Degraded) or is expected to clear by itself (Progressing).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Severity {
    Degraded,
    Progressing,
}

/// Machine-readable reason codes (used as condition `reason`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReasonCode {
    MissingClusterIdentity,
    MissingReleaseVersion,
    InvalidReleaseVersion,
    WaitingForReleaseInfo,
    InvalidCatalogPlacement,
    InvalidAvailabilityPolicy,
    InvalidOverride,
    InvalidCatalogPin,
    InvalidNetworking,
    InvalidTLSSecurityProfile,
    ReleasePayloadUnreadable,
    ReleasePayloadDigestMismatch,
    RegistryResponseTooLarge,
    OLMImageNotInPayload,
}

impl ReasonCode {
    pub fn as_str(self) -> &'static str {
        match self {
            ReasonCode::MissingClusterIdentity => "MissingClusterIdentity",
            ReasonCode::MissingReleaseVersion => "MissingReleaseVersion",
            ReasonCode::InvalidReleaseVersion => "InvalidReleaseVersion",
            ReasonCode::WaitingForReleaseInfo => "WaitingForReleaseInfo",
            ReasonCode::InvalidCatalogPlacement => "InvalidCatalogPlacement",
            ReasonCode::InvalidAvailabilityPolicy => "InvalidAvailabilityPolicy",
            ReasonCode::InvalidOverride => "InvalidOverride",
            ReasonCode::InvalidCatalogPin => "InvalidCatalogPin",
            ReasonCode::InvalidNetworking => "InvalidNetworking",
            ReasonCode::InvalidTLSSecurityProfile => "InvalidTLSSecurityProfile",
            ReasonCode::ReleasePayloadUnreadable => "ReleasePayloadUnreadable",
            ReasonCode::ReleasePayloadDigestMismatch => "ReleasePayloadDigestMismatch",
            ReasonCode::RegistryResponseTooLarge => "RegistryResponseTooLarge",
            ReasonCode::OLMImageNotInPayload => "OLMImageNotInPayload",
        }
    }

    pub fn severity(self) -> Severity {
        match self {
            ReasonCode::WaitingForReleaseInfo => Severity::Progressing,
            _ => Severity::Degraded,
        }
    }
}

/// One validation problem, naming the offending field.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {message} ({})", .code.as_str())]
pub struct ConditionReason {
    pub code: ReasonCode,
    /// e.g. `HostedCluster.spec.olmCatalogPlacement` or `HostedOLM.spec.images.catalogs`.
    pub field: String,
    pub message: String,
}

impl ConditionReason {
    fn new(code: ReasonCode, field: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            code,
            field: field.into(),
            message: message.into(),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AvailabilityPolicy {
    SingleReplica,
    HighlyAvailable,
}

/// `spec.pausedUntil`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PausedUntil {
    NotPaused,
    Forever,
    Until(OffsetDateTime),
}

impl PausedUntil {
    pub fn is_paused(self, now: OffsetDateTime) -> bool {
        match self {
            PausedUntil::NotPaused => false,
            PausedUntil::Forever => true,
            PausedUntil::Until(t) => now < t,
        }
    }
}

/// Identity of the hosted cluster and where its control plane lives.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClusterRef {
    pub namespace: String,
    pub name: String,
    pub hcp_namespace: String,
}

impl ClusterRef {
    /// `<namespace>/<name>`.
    pub fn key(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }
}

/// Resolved images.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Images {
    pub olm: String,
    pub operator_registry: String,
    pub catalog_server: String,
    pub tunnel_gateway: String,
    pub guest_agent: String,
}

/// Everything render needs from the HostedCluster and the overrides, checked.
#[derive(Clone, Debug, PartialEq)]
pub struct ValidInput {
    pub cluster: ClusterRef,
    pub release_version: semver::Version,
    pub placement: CatalogPlacement,
    pub availability: AvailabilityPolicy,
    pub operator_hub: OperatorHubSpec,
    /// Default catalogs that should exist (OperatorHub ∩ overrides), canonical order.
    pub enabled_catalogs: Vec<DefaultCatalog>,
    /// Catalogs pinned by the user (`@sha256:` references).
    pub catalog_pins: BTreeMap<DefaultCatalog, String>,
    pub catalog_server: CatalogServerKind,
    /// The catalog server kind the HostedOLM asked for (None: not set).
    pub catalog_server_requested: Option<CatalogServerKind>,
    /// Whether the HostedOLM overrides the catalog server image.
    pub catalog_server_image_overridden: bool,
    /// Catalog sharing: the HostedOLM's `spec.catalogSharing`, else the controller's.
    pub catalog_sharing: CatalogSharing,
    /// Whether this cluster's registry lookups used its own pull secret (or no credentials
    /// at all), so a resolved digest proves the cluster may read the image. Set by the
    /// runtime after validation; false otherwise (no sharing).
    pub lookup_credentials_are_own: bool,
    /// Catalogs whose lookup a mirror answered without this cluster's credentials while
    /// the default catalog registry did not grant its pull secret (issue 35, item 6): the
    /// answer proves nothing about what the cluster may read, so they are not shared. Set
    /// by the runtime after the catalog lookups; empty otherwise.
    pub entitlement_unproven: std::collections::BTreeSet<crate::catalogs::DefaultCatalog>,
    pub registry_overrides: Vec<RegistryOverride>,
    /// Malformed or inapplicable registry overrides that were skipped (bounded; each names
    /// its field), reported as a warning Event, never Degraded.
    pub registry_override_warnings: Vec<String>,
    /// packageserver's `--tls-min-version` / `--tls-cipher-suites` from the guest API
    /// server's TLS profile.
    pub packageserver_tls_args: Vec<String>,
    /// Whether replicas must spread over zones (HyperShift relaxes this to a preference on
    /// OpenStack and KubeVirt, where zones are often not there).
    pub zone_spread_required: bool,
    /// HyperShift's `hypershift.openshift.io/disable-monitoring-services` annotation is on
    /// the HostedCluster: no metrics Services, no ServiceMonitors.
    pub monitoring_disabled: bool,
    /// `spec.clusterID` when it is a plausible ID (at most 64 characters of letters, digits
    /// and `-`): the `_id` label HyperShift's ServiceMonitors put on every metric.
    pub cluster_id: Option<String>,
    /// `spec.platform.type` is `IBMCloud`: packageserver runs 2 replicas when highly
    /// available, as HyperShift renders it there.
    pub ibm_cloud: bool,
    /// HyperShift's control-plane knobs from the HostedCluster's annotations (priority
    /// classes, restart date, resource request overrides; `crate::knobs`).
    pub knobs: crate::knobs::Knobs,
    /// Knob values that were skipped, reported as a warning Event.
    pub knob_warnings: Vec<String>,
    pub max_catalog_version: Option<MinorVersion>,
    /// Number of catalog versions tried (release minor included).
    pub catalog_candidates: usize,
    pub images: Images,
    pub node_selector: BTreeMap<String, String>,
    pub tolerations: Vec<Toleration>,
    pub labels: BTreeMap<String, String>,
    pub paused_until: PausedUntil,
    /// A `pausedUntil` value HyperShift would also ignore (reported as a warning Event).
    pub paused_until_warning: Option<String>,
    pub kubeconfig_secret: String,
    pub kubeconfig_key: String,
    pub pull_secret: String,
    pub tunnel_service_type: TunnelServiceType,
    /// HostedOLM `spec.tunnel.address`: where the guest reaches the gateway Service.
    pub tunnel_address: Option<String>,
    /// `HostedOLM.spec.tunnel.keyRotation`: a new value rotates the tunnel keys.
    pub tunnel_key_rotation: Option<String>,
    /// The HostedCluster's NodePort publishing address (`spec.services[]`).
    pub node_port_address: Option<String>,
    pub subscription_defaults: SubscriptionDefaults,
    /// Mirror sources from `spec.imageContentSources` (guest nodes use them).
    pub image_content_sources: Vec<(String, Vec<String>)>,
    /// The guest's Service CIDRs, IPv4 and IPv6 (the first holds the cluster DNS at its
    /// 10th address).
    pub guest_service_cidrs: Vec<String>,
    /// The guest's pod CIDRs, IPv4 and IPv6.
    pub guest_pod_cidrs: Vec<String>,
    /// HostedOLM `spec.hyperShiftOLM: TakeOver`: ours runs in place of HyperShift's OLM
    /// operators and packageserver; HyperShift keeps its default catalogs and writes the
    /// guest objects its hosted-cluster-config-operator owns (so `enabled_catalogs` is empty).
    pub hypershift_take_over: bool,
}

/// OpenShift's defaults when `spec.networking` leaves them out.
pub const DEFAULT_SERVICE_CIDR: &str = "172.30.0.0/16";
pub const DEFAULT_POD_CIDR: &str = "10.128.0.0/14";

/// The tunnel's own addresses (gateway `.1`, agent `.2`; `hcp_olm_tunnel_api`): no guest
/// range may overlap them.
const TUNNEL_RANGE: (IpAddr, u8) = (IpAddr::V4(std::net::Ipv4Addr::new(100, 127, 255, 0)), 30);
/// The IPv6 pair inside the tunnel (`hcp_olm_tunnel_api::GATEWAY_TUNNEL_ADDRESS6`).
const TUNNEL_RANGE6: (IpAddr, u8) = (
    IpAddr::V6(std::net::Ipv6Addr::new(
        0xfd9c, 0x4f1e, 0x7a2b, 0xffff, 0, 0, 0, 0,
    )),
    126,
);

/// Ranges per `spec.networking` field the tunnel carries (Kubernetes has at most two Service
/// ranges, one per family; OpenShift a handful of cluster networks).
const MAX_NETWORK_ENTRIES: usize = 16;

/// The network address of `ip/len` as a 128-bit number (IPv4 in the low 32 bits).
fn network_bits(ip: IpAddr, len: u8) -> u128 {
    let (bits, width) = match ip {
        IpAddr::V4(v) => (u128::from(u32::from(v)), 32u32),
        IpAddr::V6(v) => (u128::from(v), 128u32),
    };
    let host = width - u32::from(len);
    if host >= 128 { 0 } else { bits >> host << host }
}

/// Whether two ranges share an address (ranges of different families never do). Pure.
fn cidrs_overlap(a: (IpAddr, u8), b: (IpAddr, u8)) -> bool {
    if a.0.is_ipv4() != b.0.is_ipv4() {
        return false;
    }
    let len = a.1.min(b.1);
    network_bits(a.0, len) == network_bits(b.0, len)
}

/// Parses a CIDR, IPv4 (`a.b.c.d/n`, n ≤ 32) or IPv6 (`x::/n`, n ≤ 128).
pub fn parse_cidr(s: &str) -> Option<(IpAddr, u8)> {
    let (ip, len) = s.split_once('/')?;
    let ip: IpAddr = ip.parse().ok()?;
    let len: u8 = len.parse().ok()?;
    let max = if ip.is_ipv4() { 32 } else { 128 };
    (len <= max).then_some((ip, len))
}

/// Whether any of `cidrs` is an IPv6 range (the tunnel then carries IPv6 inside too).
/// A guest whose Service and pod ranges are all IPv6: its nodes are taken to reach IPv6
/// addresses (and names) only.
pub fn guest_ipv6_only(v: &ValidInput) -> bool {
    let all: Vec<String> = v
        .guest_service_cidrs
        .iter()
        .chain(v.guest_pod_cidrs.iter())
        .cloned()
        .collect();
    has_ipv6(&all)
        && !all
            .iter()
            .any(|c| parse_cidr(c).is_some_and(|(ip, _)| ip.is_ipv4()))
}

/// A guest with any IPv6 range.
pub fn guest_has_ipv6(v: &ValidInput) -> bool {
    has_ipv6(&v.guest_service_cidrs) || has_ipv6(&v.guest_pod_cidrs)
}

pub fn has_ipv6(cidrs: &[String]) -> bool {
    cidrs
        .iter()
        .any(|c| parse_cidr(c).is_some_and(|(ip, _)| ip.is_ipv6()))
}

/// The guest cluster DNS Service address: the 10th address of the first Service CIDR, of
/// either family (Kubernetes' convention: `172.30.0.10`, `fd02::a`).
pub fn guest_dns_address(service_cidrs: &[String]) -> Option<IpAddr> {
    let (ip, len) = parse_cidr(service_cidrs.first()?)?;
    let net = network_bits(ip, len);
    Some(match ip {
        IpAddr::V4(_) => IpAddr::V4(std::net::Ipv4Addr::from((net as u32).wrapping_add(10))),
        IpAddr::V6(_) => IpAddr::V6(std::net::Ipv6Addr::from(net.wrapping_add(10))),
    })
}

impl ValidInput {
    /// Follow the guest's live OperatorHub (guest placement, after HyperShift-style
    /// create-once): its spec decides which default catalogs exist, still limited to the
    /// HostedOLM's `defaultCatalogs` when set.
    pub fn follow_operator_hub(&mut self, live: OperatorHubSpec, only: Option<&[DefaultCatalog]>) {
        let mut enabled = live.enabled_catalogs();
        if let Some(only) = only {
            enabled.retain(|c| only.contains(c));
        }
        self.operator_hub = live;
        self.enabled_catalogs = enabled;
    }
}

/// HyperShift's HostedCluster annotation that turns off metrics Services and ServiceMonitors.
pub const DISABLE_MONITORING_ANNOTATION: &str =
    "hypershift.openshift.io/disable-monitoring-services";

/// Warnings (at most five, then a count) for override sources that do not apply to the
/// default catalogs.
fn inapplicable_sources(field: &str, pairs: &[RegistryOverride], out: &mut Vec<String>) {
    let bad: Vec<&RegistryOverride> = pairs
        .iter()
        .filter(|o| !o.source.trim().is_empty() && !catalogs::applies_to_catalogs(&o.source))
        .collect();
    for o in bad.iter().take(5) {
        let mut source = o.source.clone();
        truncate_chars(&mut source, 120);
        out.push(format!(
            "{field}: source {source:?} does not apply to the default catalogs (only {} and registry.redhat.io do, as in HyperShift)",
            catalogs::DEFAULT_CATALOG_REGISTRY
        ));
    }
    if bad.len() > 5 {
        out.push(format!(
            "{field}: {} more sources that do not apply",
            bad.len() - 5
        ));
    }
}

/// Cut `s` to at most `max` characters (untrusted text quoted in messages), marking the cut.
fn truncate_chars(s: &mut String, max: usize) {
    if let Some((i, _)) = s.char_indices().nth(max) {
        s.truncate(i);
        s.push('…');
    }
}

impl ValidInput {
    /// The catalog minor derived from the release version and the cap.
    pub fn catalog_minor(&self) -> MinorVersion {
        let v = MinorVersion::new(self.release_version.major, self.release_version.minor);
        match self.max_catalog_version {
            Some(cap) if cap < v => cap,
            _ => v,
        }
    }
}

fn parse_release_version(s: &str) -> Option<semver::Version> {
    let s = s.trim().trim_start_matches('v');
    semver::Version::parse(s).ok().or_else(|| {
        // Accept `X.Y` too.
        let mv = MinorVersion::parse(s)?;
        if s.split('.').count() == 2 {
            Some(semver::Version::new(mv.major, mv.minor, 0))
        } else {
            None
        }
    })
}

fn valid_image_ref(s: &str) -> bool {
    !s.is_empty() && !s.chars().any(char::is_whitespace) && !s.starts_with(['/', ':', '@'])
}

fn is_digest_ref(s: &str) -> bool {
    match s.split_once("@sha256:") {
        Some((repo, hex)) => {
            valid_image_ref(repo) && hex.len() == 64 && hex.bytes().all(|b| b.is_ascii_hexdigit())
        }
        None => false,
    }
}

/// Validate a HostedCluster with optional HostedOLM overrides. Collects every problem.
///
/// A composition of small parsers, one per part of the input, in this order (which is
/// the order of the reasons reported): identity, release, placement and availability,
/// networking, pause, TLS profile, OperatorHub, registry overrides, catalog pins and
/// versions, images, tunnel. Each parser returns its part and adds its own problems to
/// `errs`; the input is valid when none did.
pub fn validate(
    hc: &HostedCluster,
    overrides: Option<&HostedOLMSpec>,
    facts: &ReleaseFacts,
    defaults: &ControllerDefaults,
) -> Result<ValidInput, Vec<ConditionReason>> {
    let mut errs = Vec::new();
    let empty = HostedOLMSpec::default();
    let ov = overrides.unwrap_or(&empty);
    let spec = &hc.spec;
    let e = &mut errs;

    let cluster = identity(hc, e);
    let release_version = release_version(hc, facts, e);
    let placement = placement(ov, spec, e);
    let availability = availability(spec, e);
    let (guest_service_cidrs, guest_pod_cidrs) = networking(spec, e);
    let (paused_until, paused_until_warning) = paused_until(spec);
    let (knobs, knob_warnings) = hc
        .metadata
        .annotations
        .as_ref()
        .map(crate::knobs::read)
        .unwrap_or_default();
    let packageserver_tls_args = packageserver_tls_args(spec, e);
    let (operator_hub, enabled_catalogs, hypershift_take_over) = operator_hub(spec, ov);
    let (registry_overrides, registry_override_warnings) = registry_overrides(hc, ov, e);
    let image_ov = ov.images.clone().unwrap_or_default();
    let catalog_pins = catalog_pins(hc, &image_ov, e);
    let (max_catalog_version, catalog_candidates) = catalog_versions(ov, defaults, e);
    let images = images(&image_ov, facts, defaults, e);
    let (tunnel_address, tunnel_key_rotation) = tunnel(ov, e);

    match (cluster, release_version, images) {
        (Some(cluster), Some(release_version), Some(images)) if errs.is_empty() => Ok(ValidInput {
            cluster,
            release_version,
            placement,
            availability,
            operator_hub,
            enabled_catalogs,
            catalog_pins,
            catalog_server: ov.catalog_server.unwrap_or_default(),
            catalog_server_requested: ov.catalog_server,
            catalog_server_image_overridden: image_ov.catalog_server.is_some(),
            catalog_sharing: ov.catalog_sharing.unwrap_or(defaults.catalog_sharing),
            lookup_credentials_are_own: false,
            entitlement_unproven: Default::default(),
            registry_overrides,
            registry_override_warnings,
            packageserver_tls_args,
            knobs,
            knob_warnings,
            cluster_id: spec.cluster_id.clone().filter(|id| {
                !id.is_empty()
                    && id.len() <= 64
                    && id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
            }),
            ibm_cloud: spec.platform.as_ref().and_then(|p| p.type_.as_deref()) == Some("IBMCloud"),
            monitoring_disabled: hc
                .metadata
                .annotations
                .as_ref()
                .is_some_and(|a| a.contains_key(DISABLE_MONITORING_ANNOTATION)),
            zone_spread_required: !matches!(
                spec.platform.as_ref().and_then(|p| p.type_.as_deref()),
                Some("OpenStack" | "KubeVirt")
            ),
            max_catalog_version,
            catalog_candidates,
            images,
            node_selector: spec.node_selector.clone().unwrap_or_default(),
            tolerations: spec.tolerations.clone().unwrap_or_default(),
            labels: spec.labels.clone().unwrap_or_default(),
            paused_until,
            paused_until_warning,
            kubeconfig_secret: defaults.kubeconfig_secret.clone(),
            kubeconfig_key: defaults.kubeconfig_key.clone(),
            pull_secret: defaults.pull_secret.clone(),
            tunnel_service_type: ov
                .tunnel
                .as_ref()
                .and_then(|t| t.service_type)
                .unwrap_or_default(),
            tunnel_address,
            tunnel_key_rotation,
            node_port_address: hc.node_port_address(),
            subscription_defaults: ov.subscription_defaults.clone().unwrap_or_default(),
            image_content_sources: spec
                .image_content_sources
                .iter()
                .flatten()
                .map(|s| (s.source.clone(), s.mirrors.clone()))
                .collect(),
            guest_service_cidrs,
            guest_pod_cidrs,
            hypershift_take_over,
        }),
        _ => {
            for e in &errs {
                tracing::debug!(field = %e.field, reason = e.code.as_str(), "validation: {}", e.message);
            }
            Err(errs)
        }
    }
}

/// The HostedCluster's namespace and name, and the HCP namespace they make.
fn identity(hc: &HostedCluster, errs: &mut Vec<ConditionReason>) -> Option<ClusterRef> {
    match (
        hc.metadata.namespace.as_deref(),
        hc.metadata.name.as_deref(),
    ) {
        (Some(ns), Some(name)) if !ns.is_empty() && !name.is_empty() => {
            let hcp = format!("{ns}-{name}");
            if hcp.len() > 63 {
                errs.push(ConditionReason::new(
                    ReasonCode::MissingClusterIdentity,
                    "HostedCluster.metadata.name",
                    format!("HCP namespace {hcp:?} is longer than 63 characters"),
                ));
            }
            Some(ClusterRef {
                namespace: ns.to_string(),
                name: name.to_string(),
                hcp_namespace: hcp,
            })
        }
        _ => {
            errs.push(ConditionReason::new(
                ReasonCode::MissingClusterIdentity,
                "HostedCluster.metadata",
                "metadata.namespace and metadata.name are required",
            ));
            None
        }
    }
}

/// Release version: the release image's label, else the version HyperShift reports.
fn release_version(
    hc: &HostedCluster,
    facts: &ReleaseFacts,
    errs: &mut Vec<ConditionReason>,
) -> Option<semver::Version> {
    let status_version = hc
        .status
        .as_ref()
        .and_then(|s| s.version.as_ref())
        .and_then(|v| v.desired.as_ref())
        .map(|d| d.version.clone())
        .filter(|v| !v.is_empty());
    let raw_version = facts
        .version
        .clone()
        .filter(|v| !v.is_empty())
        .or(status_version);
    match raw_version {
        None => {
            errs.push(ConditionReason::new(
                ReasonCode::MissingReleaseVersion,
                "HostedCluster.spec.release.image",
                format!(
                    "cannot determine the release version of {:?}: no io.openshift.release label and no status.version.desired.version",
                    hc.spec.release.image
                ),
            ));
            None
        }
        Some(v) => match parse_release_version(&v) {
            Some(sv) => Some(sv),
            None => {
                errs.push(ConditionReason::new(
                    ReasonCode::InvalidReleaseVersion,
                    "HostedCluster.spec.release.image",
                    format!("release version {v:?} is not a semantic version"),
                ));
                None
            }
        },
    }
}

/// Placement: the HostedOLM override wins, else the HostedCluster's, else management.
fn placement(
    ov: &HostedOLMSpec,
    spec: &HostedClusterSpec,
    errs: &mut Vec<ConditionReason>,
) -> CatalogPlacement {
    match ov.catalog_placement {
        Some(p) => p,
        None => match spec.olm_catalog_placement.as_deref() {
            None | Some("") | Some("management") => CatalogPlacement::Management,
            Some("guest") => CatalogPlacement::Guest,
            Some(other) => {
                errs.push(ConditionReason::new(
                    ReasonCode::InvalidCatalogPlacement,
                    "HostedCluster.spec.olmCatalogPlacement",
                    format!("{other:?} is neither \"management\" nor \"guest\""),
                ));
                CatalogPlacement::Management
            }
        },
    }
}

fn availability(spec: &HostedClusterSpec, errs: &mut Vec<ConditionReason>) -> AvailabilityPolicy {
    match spec.controller_availability_policy.as_deref() {
        // unset: HyperShift's API default (the CRD defaults it too)
        None | Some("") | Some("HighlyAvailable") => AvailabilityPolicy::HighlyAvailable,
        Some("SingleReplica") => AvailabilityPolicy::SingleReplica,
        Some(other) => {
            errs.push(ConditionReason::new(
                ReasonCode::InvalidAvailabilityPolicy,
                "HostedCluster.spec.controllerAvailabilityPolicy",
                format!("{other:?} is neither SingleReplica nor HighlyAvailable"),
            ));
            AvailabilityPolicy::SingleReplica
        }
    }
}

/// The guest's service and pod ranges (each the default when none is usable).
fn networking(
    spec: &HostedClusterSpec,
    errs: &mut Vec<ConditionReason>,
) -> (Vec<String>, Vec<String>) {
    let service = network_ranges(
        "serviceNetwork",
        spec.networking.as_ref().map(|n| &n.service_network),
        DEFAULT_SERVICE_CIDR,
        errs,
    );
    let pod = network_ranges(
        "clusterNetwork",
        spec.networking.as_ref().map(|n| &n.cluster_network),
        DEFAULT_POD_CIDR,
        errs,
    );
    (service, pod)
}

/// One list of `spec.networking.<field>`: its usable CIDRs, or `default` when none is.
fn network_ranges(
    field: &str,
    entries: Option<&Vec<crate::hostedcluster::NetworkEntry>>,
    default: &str,
    errs: &mut Vec<ConditionReason>,
) -> Vec<String> {
    let n = entries.map_or(0, Vec::len);
    if n > MAX_NETWORK_ENTRIES {
        // Each range becomes tunnel routes and split-DNS reverse zones (up to 128
        // each) in both tunnel ends: a HostedCluster owner must not size those.
        errs.push(ConditionReason::new(
            ReasonCode::InvalidNetworking,
            format!("HostedCluster.spec.networking.{field}"),
            format!("{n} ranges; at most {MAX_NETWORK_ENTRIES} are carried by the tunnel"),
        ));
        return vec![default.to_string()];
    }
    let mut list = Vec::new();
    for (i, e) in entries.into_iter().flatten().enumerate() {
        match range_problem(&e.cidr) {
            None => list.push(e.cidr.clone()),
            Some(p) => errs.push(ConditionReason::new(
                ReasonCode::InvalidNetworking,
                format!("HostedCluster.spec.networking.{field}[{i}].cidr"),
                p,
            )),
        }
    }
    if list.is_empty() {
        vec![default.to_string()]
    } else {
        list
    }
}

/// Why a guest range cannot be carried by the tunnel: not a CIDR, all addresses, or the
/// tunnel's own range.
fn range_problem(cidr: &str) -> Option<String> {
    match parse_cidr(cidr) {
        None => Some(format!("{cidr:?} is not an IPv4 or IPv6 CIDR")),
        Some(c) if c.1 == 0 => Some(format!(
            "{cidr:?}: a /0 would send every address into the tunnel"
        )),
        Some(c) => [TUNNEL_RANGE, TUNNEL_RANGE6]
            .into_iter()
            .find(|t| cidrs_overlap(c, *t))
            .map(|t| format!("{cidr:?}: overlaps the tunnel's own range {}/{}", t.0, t.1)),
    }
}

/// `spec.pausedUntil` as HyperShift reads it (its `IsReconciliationPaused`): a boolean as
/// Go's `strconv.ParseBool` spells it, else an RFC 3339 time; any other value counts as
/// not paused (HyperShift logs it and goes on), here with a warning Event.
fn paused_until(spec: &HostedClusterSpec) -> (PausedUntil, Option<String>) {
    let Some(s) = spec.paused_until.as_deref() else {
        return (PausedUntil::NotPaused, None);
    };
    match s {
        "1" | "t" | "T" | "TRUE" | "true" | "True" => (PausedUntil::Forever, None),
        "0" | "f" | "F" | "FALSE" | "false" | "False" => (PausedUntil::NotPaused, None),
        _ => match OffsetDateTime::parse(s, &Rfc3339) {
            Ok(t) => (PausedUntil::Until(t), None),
            Err(_) => {
                let shown: String = s.chars().take(64).collect();
                (
                    PausedUntil::NotPaused,
                    Some(format!(
                        "HostedCluster.spec.pausedUntil {shown:?} is neither a boolean nor an RFC 3339 time: not paused (as in HyperShift)"
                    )),
                )
            }
        },
    }
}

/// The guest API server's TLS profile also governs packageserver (as in HyperShift).
fn packageserver_tls_args(
    spec: &HostedClusterSpec,
    errs: &mut Vec<ConditionReason>,
) -> Vec<String> {
    match crate::tls::server_args(
        spec.configuration
            .as_ref()
            .and_then(|c| c.api_server.as_ref())
            .and_then(|a| a.tls_security_profile.as_ref()),
    ) {
        Ok(a) => a,
        Err(e) => {
            errs.push(ConditionReason::new(
                ReasonCode::InvalidTLSSecurityProfile,
                "HostedCluster.spec.configuration.apiServer.tlsSecurityProfile",
                e,
            ));
            Vec::new()
        }
    }
}

/// OperatorHub, the default catalogs it enables (none under TakeOver: HyperShift's
/// catalogs and CatalogSources keep serving; at most HostedOLM's `defaultCatalogs`), and
/// whether HyperShift's OLM is taken over.
fn operator_hub(
    spec: &HostedClusterSpec,
    ov: &HostedOLMSpec,
) -> (OperatorHubSpec, Vec<DefaultCatalog>, bool) {
    let operator_hub = spec
        .configuration
        .as_ref()
        .and_then(|c| c.operatorhub.clone())
        .unwrap_or_default();
    let take_over = ov.hyper_shift_olm == Some(HyperShiftOLMMode::TakeOver);
    let mut enabled = operator_hub.enabled_catalogs();
    if take_over {
        enabled.clear();
    }
    if let Some(only) = &ov.default_catalogs {
        enabled.retain(|c| only.contains(c));
    }
    (operator_hub, enabled, take_over)
}

/// Registry overrides: annotation first, then HostedOLM; mirrors are tried in that order
/// (catalogs::catalog_registries). As in HyperShift, a malformed pair of the annotation
/// is skipped, not fatal: it becomes a warning (an Event on the HostedCluster).
fn registry_overrides(
    hc: &HostedCluster,
    ov: &HostedOLMSpec,
    errs: &mut Vec<ConditionReason>,
) -> (Vec<RegistryOverride>, Vec<String>) {
    let mut overrides = Vec::new();
    let mut warnings = Vec::new();
    if let Some(text) = hc
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(REGISTRY_OVERRIDES_ANNOTATION))
    {
        let (pairs, skipped) = catalogs::parse_registry_overrides(text);
        let field = format!("HostedCluster.metadata.annotations[{REGISTRY_OVERRIDES_ANNOTATION}]");
        for piece in skipped.iter().take(5) {
            let mut piece = piece.clone();
            truncate_chars(&mut piece, 120);
            warnings.push(format!(
                "{field}: skipped {piece:?}: not of the form source=mirror"
            ));
        }
        if skipped.len() > 5 {
            warnings.push(format!(
                "{field}: {} more malformed pairs skipped",
                skipped.len() - 5
            ));
        }
        inapplicable_sources(&field, &pairs, &mut warnings);
        overrides.extend(pairs);
    }
    inapplicable_sources(
        "HostedOLM.spec.registryOverrides",
        &ov.registry_overrides,
        &mut warnings,
    );
    for (i, o) in ov.registry_overrides.iter().enumerate() {
        if o.source.trim().is_empty() || o.mirror.trim().is_empty() {
            errs.push(ConditionReason::new(
                ReasonCode::InvalidOverride,
                format!("HostedOLM.spec.registryOverrides[{i}]"),
                "source and mirror must both be set",
            ));
        } else {
            overrides.push(o.clone());
        }
    }
    (overrides, warnings)
}

/// Catalog pins: HostedCluster annotations, then HostedOLM `images.catalogs`.
fn catalog_pins(
    hc: &HostedCluster,
    image_ov: &ImageOverrides,
    errs: &mut Vec<ConditionReason>,
) -> BTreeMap<DefaultCatalog, String> {
    let mut pins = BTreeMap::new();
    for c in DefaultCatalog::ALL {
        if let Some(img) = hc
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(&c.pin_annotation()))
        {
            if is_digest_ref(img) {
                pins.insert(c, img.clone());
            } else {
                errs.push(ConditionReason::new(
                    ReasonCode::InvalidCatalogPin,
                    format!("HostedCluster.metadata.annotations[{}]", c.pin_annotation()),
                    format!("{img:?} is not an image pinned by digest (repo@sha256:<64 hex>)"),
                ));
            }
        }
    }
    for (name, img) in &image_ov.catalogs {
        match DefaultCatalog::from_name(name) {
            None => errs.push(ConditionReason::new(
                ReasonCode::InvalidOverride,
                format!("HostedOLM.spec.images.catalogs[{name}]"),
                "not a default catalog (redhat-operators, certified-operators, community-operators)",
            )),
            Some(_) if !is_digest_ref(img) => errs.push(ConditionReason::new(
                ReasonCode::InvalidCatalogPin,
                format!("HostedOLM.spec.images.catalogs[{name}]"),
                format!("{img:?} is not an image pinned by digest (repo@sha256:<64 hex>)"),
            )),
            Some(c) => {
                pins.insert(c, img.clone());
            }
        }
    }
    pins
}

/// The newest catalog minor and how many minors are candidates.
fn catalog_versions(
    ov: &HostedOLMSpec,
    defaults: &ControllerDefaults,
    errs: &mut Vec<ConditionReason>,
) -> (Option<MinorVersion>, usize) {
    let max = match &ov.max_catalog_version {
        None => defaults.max_catalog_version,
        Some(s) => match MinorVersion::parse(s) {
            Some(v) => Some(v),
            None => {
                errs.push(ConditionReason::new(
                    ReasonCode::InvalidOverride,
                    "HostedOLM.spec.maxCatalogVersion",
                    format!("{s:?} is not a version like 4.22"),
                ));
                None
            }
        },
    };
    let candidates = match ov.catalog_fallback_minors {
        None => DEFAULT_CANDIDATES,
        Some(n) if n <= 10 => n as usize + 1,
        Some(n) => {
            errs.push(ConditionReason::new(
                ReasonCode::InvalidOverride,
                "HostedOLM.spec.catalogFallbackMinors",
                format!("{n} is more than 10"),
            ));
            DEFAULT_CANDIDATES
        }
    };
    (max, candidates)
}

/// An image: the HostedOLM override (when a valid reference), else the release fact,
/// else the controller's default.
fn image(
    field: &str,
    ov: &Option<String>,
    fact: Option<&String>,
    default: Option<&str>,
    errs: &mut Vec<ConditionReason>,
) -> Option<String> {
    if let Some(v) = ov {
        if valid_image_ref(v) {
            return Some(v.clone());
        }
        errs.push(ConditionReason::new(
            ReasonCode::InvalidOverride,
            format!("HostedOLM.spec.images.{field}"),
            format!("{v:?} is not an image reference"),
        ));
        return None;
    }
    if let Some(v) = fact.filter(|v| !v.is_empty()) {
        return Some(v.clone());
    }
    default.map(str::to_string)
}

/// Every image; `None` when the OLM image is not known (the reason is in `errs`).
fn images(
    image_ov: &ImageOverrides,
    facts: &ReleaseFacts,
    defaults: &ControllerDefaults,
    errs: &mut Vec<ConditionReason>,
) -> Option<Images> {
    let olm = image("olm", &image_ov.olm, facts.olm_image.as_ref(), None, errs);
    let operator_registry = image(
        "operatorRegistry",
        &image_ov.operator_registry,
        facts.operator_registry_image.as_ref(),
        None,
        errs,
    );
    let catalog_server = image(
        "catalogServer",
        &image_ov.catalog_server,
        None,
        Some(defaults.catalog_server_image.as_str()),
        errs,
    );
    let tunnel_gateway = image(
        "tunnelGateway",
        &image_ov.tunnel_gateway,
        None,
        Some(defaults.tunnel_gateway_image.as_str()),
        errs,
    );
    let guest_agent = image(
        "guestAgent",
        &image_ov.guest_agent,
        None,
        Some(defaults.guest_agent_image.as_str()),
        errs,
    );
    if olm.is_none() && image_ov.olm.is_none() {
        errs.push(olm_image_unknown(facts.payload_problem.as_ref()));
    }
    let olm = olm?;
    Some(Images {
        // operator-registry only matters for bundle unpack Jobs; fall back to the OLM image.
        operator_registry: operator_registry.unwrap_or_else(|| olm.clone()),
        olm,
        catalog_server: catalog_server.unwrap_or_default(),
        tunnel_gateway: tunnel_gateway.unwrap_or_default(),
        guest_agent: guest_agent.unwrap_or_default(),
    })
}

/// Why the OLM image is not known, from what reading the release payload found.
fn olm_image_unknown(problem: Option<&PayloadProblem>) -> ConditionReason {
    use ReasonCode::*;
    let field = "HostedCluster.spec.release.image";
    match problem {
        Some(PayloadProblem::Unreadable(msg)) => ConditionReason::new(
            ReleasePayloadUnreadable,
            field,
            format!(
                "the OLM image cannot be taken from the release payload: {msg} (set HostedOLM spec.images.olm to override)"
            ),
        ),
        Some(PayloadProblem::DigestMismatch(msg)) => ConditionReason::new(
            ReleasePayloadDigestMismatch,
            field,
            format!(
                "the release payload was refused: {msg} (a mirror in spec.imageContentSources or the registry serves other content under this digest)"
            ),
        ),
        Some(PayloadProblem::TooLarge(msg)) => ConditionReason::new(
            RegistryResponseTooLarge,
            field,
            format!(
                "the release payload cannot be read: {msg} (set HostedOLM spec.images.olm to override)"
            ),
        ),
        Some(PayloadProblem::OLMImageMissing(msg)) => ConditionReason::new(
            OLMImageNotInPayload,
            field,
            format!("{msg} (set HostedOLM spec.images.olm to override)"),
        ),
        None => ConditionReason::new(
            WaitingForReleaseInfo,
            field,
            "the operator-lifecycle-manager image of the release payload is not known yet",
        ),
    }
}

/// The tunnel's address override and key-rotation token.
fn tunnel(ov: &HostedOLMSpec, errs: &mut Vec<ConditionReason>) -> (Option<String>, Option<String>) {
    let address = ov.tunnel.as_ref().and_then(|t| t.address.clone());
    if let Some(a) = &address {
        if !valid_host(a) {
            errs.push(ConditionReason::new(
                ReasonCode::InvalidOverride,
                "HostedOLM.spec.tunnel.address",
                format!("{a:?} is not a host name or IP address"),
            ));
        } else if let Some(why) = a
            .parse::<std::net::IpAddr>()
            .ok()
            .and_then(hcp_olm_tunnel_api::unusable_endpoint_ip)
        {
            errs.push(ConditionReason::new(
                ReasonCode::InvalidOverride,
                "HostedOLM.spec.tunnel.address",
                format!("{a} is a {why} address: the guest cannot reach the gateway there"),
            ));
        }
    }
    let key_rotation = ov
        .tunnel
        .as_ref()
        .and_then(|t| t.key_rotation.clone())
        .filter(|t| !t.is_empty());
    if let Some(t) = &key_rotation
        && (t.len() > 253 || t.chars().any(char::is_control))
    {
        errs.push(ConditionReason::new(
            ReasonCode::InvalidOverride,
            "HostedOLM.spec.tunnel.keyRotation",
            "must be at most 253 characters without control characters",
        ));
    }
    (address, key_rotation)
}

/// A DNS name or an IP address (no port).
fn valid_host(s: &str) -> bool {
    s.parse::<std::net::IpAddr>().is_ok()
        || (!s.is_empty()
            && s.len() <= 253
            && s.split('.').all(|l| {
                !l.is_empty()
                    && l.len() <= 63
                    && !l.starts_with('-')
                    && !l.ends_with('-')
                    && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
            }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tunnel_ranges_are_the_tunnel_apis_addresses() {
        for (range, addrs) in [
            (
                TUNNEL_RANGE,
                [
                    hcp_olm_tunnel_api::GATEWAY_TUNNEL_ADDRESS,
                    hcp_olm_tunnel_api::AGENT_TUNNEL_ADDRESS,
                ],
            ),
            (
                TUNNEL_RANGE6,
                [
                    hcp_olm_tunnel_api::GATEWAY_TUNNEL_ADDRESS6,
                    hcp_olm_tunnel_api::AGENT_TUNNEL_ADDRESS6,
                ],
            ),
        ] {
            for a in addrs {
                let c = parse_cidr(a).expect(a);
                assert_eq!(c.1, range.1, "{a}");
                assert!(cidrs_overlap(c, range), "{a}");
            }
        }
    }

    #[test]
    fn cidrs_of_both_families() {
        let c = |s| parse_cidr(s).unwrap();
        assert!(parse_cidr("10.0.0.0/33").is_none());
        assert!(parse_cidr("fd02::/129").is_none());
        assert!(parse_cidr("fd02::").is_none());
        assert!(cidrs_overlap(c("fd02::/112"), c("fd02::5/128")));
        assert!(!cidrs_overlap(c("fd02::/112"), c("fd02::1:0/112")));
        assert!(cidrs_overlap(c("::/0"), c("fd02::/112")));
        // families never overlap, even where the bits agree
        assert!(!cidrs_overlap(c("0.0.0.0/0"), c("::/0")));
        assert!(!cidrs_overlap(c("10.0.0.0/8"), c("::a00:0/104")));
        assert_eq!(
            guest_dns_address(&["fd02::/112".into()]),
            Some("fd02::a".parse().unwrap())
        );
        assert_eq!(
            guest_dns_address(&["172.30.0.0/16".into(), "fd02::/112".into()]),
            Some("172.30.0.10".parse().unwrap())
        );
        assert!(has_ipv6(&["10.0.0.0/8".into(), "fd01::/48".into()]));
        assert!(!has_ipv6(&["10.0.0.0/8".into()]));
    }
}
