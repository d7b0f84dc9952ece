//! Our CRD: `HostedOLM` (olm.hcp-olm.io/v1alpha1), one per hosted cluster, living in
//! the HCP namespace. The controller creates it with an empty spec; users may set
//! overrides. Its status reports what the controller found.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Toleration;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::{CustomResource, CustomResourceExt};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::catalogs::{DefaultCatalog, RegistryOverride};

/// Group of our API.
pub const GROUP: &str = "olm.hcp-olm.io";

/// Optional overrides for one hosted cluster's OLM. Every field is optional; an
/// empty spec means "what the HostedCluster says".
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "olm.hcp-olm.io",
    version = "v1alpha1",
    kind = "HostedOLM",
    plural = "hostedolms",
    shortname = "holm",
    category = "hcp-olm",
    category = "hypershift",
    namespaced,
    doc = "HostedOLM: OLM for one HyperShift hosted cluster. The hcp-olm controller creates one per HostedCluster, named like it, in the hosted control plane (HCP) namespace, with an empty spec: it runs catalog-operator, olm-operator, packageserver and the default catalogs there and writes the guest's CatalogSources, OperatorHub and packageserver APIService. Set spec fields to override what the HostedCluster says (catalog placement, images, catalog versions, tunnel); status reports each component, each default catalog and the tunnel, with Available, Progressing, Degraded and Upgradeable conditions.",
    status = "HostedOLMStatus",
    printcolumn = r#"{"name":"Cluster","type":"string","jsonPath":".spec.hostedCluster.name"}"#,
    printcolumn = r#"{"name":"Placement","type":"string","jsonPath":".status.placement"}"#,
    printcolumn = r#"{"name":"Version","type":"string","jsonPath":".status.releaseVersion"}"#,
    printcolumn = r#"{"name":"Available","type":"string","jsonPath":".status.conditions[?(@.type==\"Available\")].status"}"#,
    printcolumn = r#"{"name":"Degraded","type":"string","jsonPath":".status.conditions[?(@.type==\"Degraded\")].status"}"#,
    printcolumn = r#"{"name":"Upgradeable","type":"string","jsonPath":".status.conditions[?(@.type==\"Upgradeable\")].status","priority":1}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct HostedOLMSpec {
    /// The HostedCluster this object belongs to (set by the controller).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hosted_cluster: Option<HostedClusterRef>,
    /// Where the default catalogs run. Defaults to the HostedCluster's
    /// `olmCatalogPlacement`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub catalog_placement: Option<CatalogPlacement>,
    /// Restrict the default catalogs to this list (OperatorHub settings still apply).
    /// Unset means all three.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default_catalogs: Option<Vec<DefaultCatalog>>,
    /// Image overrides.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub images: Option<ImageOverrides>,
    /// Which gRPC catalog server runs the management-side catalogs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub catalog_server: Option<CatalogServerKind>,
    /// Whether the management-side default catalogs may be served by one shared catalog
    /// Deployment per (catalog, catalog minor) in the `hcp-olm-catalogs` namespace, used by
    /// every hosted cluster of that catalog minor (`Shared`), or always by this cluster's own
    /// copy in its HCP namespace (`Own`). Unset: the controller's `--catalog-sharing`
    /// (default `Shared`). `Shared` is a wish: a catalog is shared only when safe (management
    /// placement, digest resolved with this cluster's pull secret, our catalog server, no pin
    /// or mirror of that catalog); `status.catalogs[].sharing` and `reason` say what happened.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub catalog_sharing: Option<CatalogSharing>,
    /// Mirrors of the default catalogs, tried after those of the HostedCluster's
    /// `olm-catalogs-is-registry-overrides` annotation and with HyperShift's meaning: source
    /// `registry.redhat.io/redhat` → the mirror replaces registry and namespace; source
    /// `registry.redhat.io` → the mirror replaces the registry (and the namespace too when
    /// it has a path). Other sources do not apply (a warning Event says so).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub registry_overrides: Vec<RegistryOverride>,
    /// Newest catalog minor to use (`4.22`); unset means the release minor.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^[0-9]+\.[0-9]+$"))]
    pub max_catalog_version: Option<String>,
    /// How many earlier minors to try when a catalog tag is missing (default 3).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub catalog_fallback_minors: Option<u32>,
    /// Defaults for `spec.config` of guest Subscriptions, so user operators land on a
    /// chosen node pool: a Subscription that sets no `nodeSelector` (or no `tolerations`)
    /// of its own gets these written into it by the controller; OLM then places the
    /// operator's pods accordingly. Changing them later does not rewrite Subscriptions
    /// that already have values.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subscription_defaults: Option<SubscriptionDefaults>,
    /// Tunnel settings.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tunnel: Option<TunnelSpec>,
    /// What to do while HyperShift's own OLM runs in the HCP namespace (StandDown or
    /// TakeOver; see the type).
    #[serde(
        default,
        rename = "hyperShiftOLM",
        skip_serializing_if = "Option::is_none"
    )]
    pub hyper_shift_olm: Option<HyperShiftOLMMode>,
}

/// What to do while HyperShift's own OLM runs in the HCP namespace (it always deploys
/// one). `StandDown` (default): apply nothing and report `HyperShiftOLMActive`.
/// `TakeOver`: add catalog-operator, olm-operator and packageserver to the HostedCluster's
/// `hypershift.openshift.io/debug-deployments` annotation (HyperShift then keeps them at 0
/// replicas) and run ours behind HyperShift's packageserver Service and certificate, so the
/// guest objects HyperShift's hosted-cluster-config-operator writes stay right and only it
/// writes them; HyperShift's default catalogs keep serving. Removing the field (or the
/// HostedOLM) hands back: the annotation is restored as it was.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum HyperShiftOLMMode {
    /// Leave HyperShift's OLM alone; hcp-olm applies nothing while it runs.
    #[default]
    StandDown,
    /// Keep HyperShift's OLM operators at 0 replicas and run ours in their place.
    TakeOver,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
pub struct HostedClusterRef {
    pub namespace: String,
    pub name: String,
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum CatalogPlacement {
    /// Catalog servers run in the HCP namespace; guest CatalogSources use `address`.
    #[default]
    Management,
    /// Guest CatalogSources use `image`; OLM runs the catalog pods in the guest.
    Guest,
}

impl CatalogPlacement {
    pub fn as_str(self) -> &'static str {
        match self {
            CatalogPlacement::Management => "management",
            CatalogPlacement::Guest => "guest",
        }
    }
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum CatalogServerKind {
    /// operator-registry's `opm serve` from the catalog image itself.
    #[default]
    Opm,
    /// Our `hcp-olm-catalog-server` (flags documented in docs/catalog-server.md).
    HcpOlm,
}

/// Sharing of the management-side default catalogs between hosted clusters.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum CatalogSharing {
    /// One shared catalog Deployment per (catalog, catalog minor), when safe.
    #[default]
    Shared,
    /// This hosted cluster's own catalog Deployments in its HCP namespace.
    Own,
}

impl CatalogSharing {
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "Shared" | "shared" => Some(Self::Shared),
            "Own" | "own" => Some(Self::Own),
            _ => None,
        }
    }
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ImageOverrides {
    /// OLM image (catalog-operator, olm-operator, packageserver).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub olm: Option<String>,
    /// operator-registry image (opm; bundle unpack).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub operator_registry: Option<String>,
    /// hcp-olm-catalog-server image.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub catalog_server: Option<String>,
    /// Tunnel gateway image (HCP namespace).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tunnel_gateway: Option<String>,
    /// Guest agent image.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub guest_agent: Option<String>,
    /// Per default catalog: an image pinned by digest (`repo@sha256:...`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub catalogs: BTreeMap<String, String>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SubscriptionDefaults {
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub node_selector: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tolerations: Vec<Toleration>,
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum TunnelServiceType {
    #[default]
    NodePort,
    LoadBalancer,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TunnelSpec {
    /// How the gateway's WireGuard UDP port is exposed to the guest.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service_type: Option<TunnelServiceType>,
    /// Host or IP the guest reaches the gateway Service on. Default: for NodePort the
    /// HostedCluster's NodePort publishing address (`spec.services[]`, APIServer
    /// first); for LoadBalancer the Service's `status.loadBalancer.ingress[0]`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub address: Option<String>,
    /// Changing this value (any string, e.g. a date) rotates the tunnel's WireGuard keys:
    /// the gateway first accepts the new keys besides the old ones, then the agent moves
    /// to them, then the old ones are dropped, each step held for the controller's
    /// `--tunnel-key-propagation`. Neither end restarts; established catalog streams see
    /// one handshake.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub key_rotation: Option<String>,
}

/// Where the guest agent reaches the tunnel gateway, as far as the controller knows.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TunnelStatus {
    /// `NodePort` or `LoadBalancer`.
    pub service_type: String,
    /// `host:port` of the gateway's WireGuard endpoint once known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoint: Option<String>,
    pub reason: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
    /// The key rotation, once one was asked for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key_rotation: Option<KeyRotationStatus>,
}

/// State of the tunnel key rotation.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct KeyRotationStatus {
    /// The `spec.tunnel.keyRotation` value the last rotation was started for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token: Option<String>,
    /// `NewKeysAccepted` (the gateway accepts the new keys; the agent still uses the old
    /// ones), `OldKeysAccepted` (the agent uses the new keys; the gateway still accepts
    /// the old ones) or `Idle` (done).
    pub phase: String,
}

/// What the controller observed. Conditions: `Available`, `Progressing`, `Degraded`,
/// `Upgradeable`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HostedOLMStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// `Available`, `Progressing`, `Degraded`, `Upgradeable`; one per type.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub placement: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub release_version: Option<String>,
    /// One entry per component (catalog-operator, olm-operator, packageserver,
    /// tunnel-gateway, guest-agent, catalog servers).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub components: Vec<ComponentStatus>,
    /// One entry per default catalog.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub catalogs: Vec<CatalogStatus>,
    /// The tunnel gateway's endpoint as derived from its Service.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tunnel: Option<TunnelStatus>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ComponentStatus {
    pub name: String,
    pub available: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ready_replicas: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub desired_replicas: Option<i32>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub reason: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CatalogStatus {
    pub name: String,
    /// False when disabled by OperatorHub or overrides.
    pub enabled: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    /// Catalog minor that was found (may be older than the release minor).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    /// `spec.address` or `spec.image` of the guest CatalogSource.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<String>,
    /// `shared` (served by a Deployment in `hcp-olm-catalogs` with other hosted clusters)
    /// or `own` (this cluster's own Deployment in its HCP namespace). Unset for guest
    /// placement and disabled catalogs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sharing: Option<String>,
    /// Why `sharing` is what it is (a reason code such as `SharedCatalog`, `CatalogPinned`,
    /// `CatalogMirrored`, `DigestNotResolved`, `SharingDisabled`).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub reason: String,
    /// `namespace/name` of the Deployment serving this catalog.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub serving_deployment: Option<String>,
    /// `status.connectionState.lastObservedState` read back from the guest
    /// CatalogSource (IDLE, CONNECTING, READY, TRANSIENT_FAILURE, SHUTDOWN).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub connection_state: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_connect: Option<String>,
    /// Since when (RFC 3339) the guest CatalogSource has been seen not READY, every pass in a
    /// row; unset while READY. Past a grace period the HostedOLM is not Available
    /// (`CatalogsNotReady`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub not_ready_since: Option<String>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
}

/// The CRD as YAML (what `hcp-olm-controller crd` prints and manifests/ holds).
pub fn crd_yaml() -> Result<String, serde_yaml_ng::Error> {
    serde_yaml_ng::to_string(&HostedOLM::crd())
}
