//! The subset of HyperShift's `HostedCluster` (hypershift.openshift.io/v1beta1) that
//! hcp-olm reads. Every struct tolerates unknown fields, so a newer HyperShift API
//! still parses; only the fields below are interpreted.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Toleration;
use kube::CustomResource;
use serde::{Deserialize, Serialize};

use crate::operatorhub::OperatorHubSpec;

/// Spec of a HyperShift HostedCluster, reduced to what the OLM controller needs.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[kube(
    group = "hypershift.openshift.io",
    version = "v1beta1",
    kind = "HostedCluster",
    plural = "hostedclusters",
    namespaced,
    status = "HostedClusterStatus",
    schema = "disabled"
)]
#[serde(rename_all = "camelCase")]
pub struct HostedClusterSpec {
    /// Data-plane release; its version label selects the catalog tags.
    #[serde(default)]
    pub release: Release,
    /// Optional separate control-plane release (OLM images come from it when set).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub control_plane_release: Option<Release>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pull_secret: Option<LocalObjectReference>,
    /// `management` (default) or `guest`. Kept as a string so an unknown value can be
    /// reported instead of failing to parse.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub olm_catalog_placement: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub configuration: Option<ClusterConfiguration>,
    /// `HighlyAvailable` (default) or `SingleReplica`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub controller_availability_policy: Option<String>,
    /// The platform (only its type is read: it decides whether zone spread is required).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub platform: Option<PlatformSpec>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_selector: Option<BTreeMap<String, String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tolerations: Option<Vec<Toleration>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub labels: Option<BTreeMap<String, String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_content_sources: Option<Vec<ImageContentSource>>,
    /// A boolean or an RFC 3339 time (read as HyperShift reads it: `validate::paused_until`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub paused_until: Option<String>,
    /// The cluster's UUID; HyperShift labels its control plane's metrics with it (`_id`).
    #[serde(rename = "clusterID", default, skip_serializing_if = "Option::is_none")]
    pub cluster_id: Option<String>,
    /// How control-plane services are published; the NodePort address of these is
    /// where the guest reaches the tunnel gateway's NodePort.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub services: Option<Vec<ServicePublishingStrategyMapping>>,
    /// The guest's Service and pod networks (what the tunnel may carry).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub networking: Option<ClusterNetworking>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct ClusterNetworking {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub service_network: Vec<NetworkEntry>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub cluster_network: Vec<NetworkEntry>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct NetworkEntry {
    #[serde(default)]
    pub cidr: String,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct ServicePublishingStrategyMapping {
    /// `APIServer`, `OAuthServer`, `Konnectivity`, `Ignition`, ...
    #[serde(default)]
    pub service: String,
    #[serde(default)]
    pub service_publishing_strategy: ServicePublishingStrategy,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct ServicePublishingStrategy {
    /// `LoadBalancer`, `NodePort`, `Route`, `None`, `S3`.
    #[serde(default, rename = "type")]
    pub type_: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_port: Option<NodePortPublishingStrategy>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct NodePortPublishingStrategy {
    /// Host or IP the NodePort services are reached on.
    #[serde(default)]
    pub address: String,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct Release {
    #[serde(default)]
    pub image: String,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
pub struct LocalObjectReference {
    #[serde(default)]
    pub name: String,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ClusterConfiguration {
    /// Note the lower-case `h`: HyperShift's field name is `operatorhub`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub operatorhub: Option<OperatorHubSpec>,
    /// The guest API server's settings; its TLS profile also applies to packageserver.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_server: Option<crate::tls::ApiServerConfig>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
pub struct PlatformSpec {
    #[serde(rename = "type", default, skip_serializing_if = "Option::is_none")]
    pub type_: Option<String>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct ImageContentSource {
    #[serde(default)]
    pub source: String,
    #[serde(default)]
    pub mirrors: Vec<String>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct HostedClusterStatus {
    /// Admin kubeconfig for the guest, in the HostedCluster's namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kubeconfig: Option<LocalObjectReference>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<ClusterVersionStatus>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct ClusterVersionStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub desired: Option<ReleaseStatus>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct ReleaseStatus {
    #[serde(default)]
    pub image: String,
    #[serde(default)]
    pub version: String,
}

/// HyperShift's default name of the guest kubeconfig Secret that control-plane pods mount.
pub const SERVICE_NETWORK_ADMIN_KUBECONFIG: &str = "service-network-admin-kubeconfig";
/// HyperShift copies the HostedCluster pull secret into the HCP namespace under this name.
pub const HCP_PULL_SECRET: &str = "pull-secret";
/// Registry rewrite annotation for catalog images (`src=dst,src2=dst2`).
pub const REGISTRY_OVERRIDES_ANNOTATION: &str =
    "hypershift.openshift.io/olm-catalogs-is-registry-overrides";

impl HostedCluster {
    /// The address HyperShift publishes node ports on: the APIServer's NodePort
    /// strategy address, else that of any other NodePort-published service.
    pub fn node_port_address(&self) -> Option<String> {
        let services = self.spec.services.as_deref().unwrap_or_default();
        let address = |s: &ServicePublishingStrategyMapping| {
            let p = &s.service_publishing_strategy;
            (p.type_ == "NodePort")
                .then(|| p.node_port.as_ref().map(|n| n.address.clone()))
                .flatten()
                .filter(|a| !a.is_empty())
        };
        services
            .iter()
            .filter(|s| s.service == "APIServer")
            .chain(services.iter().filter(|s| s.service != "APIServer"))
            .find_map(address)
    }

    /// The hosted control plane namespace: `<namespace>-<name>`.
    pub fn hcp_namespace(&self) -> Option<String> {
        let ns = self.metadata.namespace.as_deref()?;
        let name = self.metadata.name.as_deref()?;
        Some(format!("{ns}-{name}"))
    }

    /// `(namespace, name)` of the guest admin kubeconfig Secret the controller itself
    /// uses (`status.kubeconfig`, in the HostedCluster's namespace); None until
    /// HyperShift has published it.
    pub fn admin_kubeconfig_secret(&self) -> Option<(String, String)> {
        let ns = self.metadata.namespace.clone()?;
        let name = self.status.as_ref()?.kubeconfig.as_ref()?.name.clone();
        (!name.is_empty()).then_some((ns, name))
    }

    /// Parse the HostedCluster documents out of a multi-document YAML stream (other
    /// kinds, such as the Namespace, Secret and NodePool of `hypershift create cluster
    /// --render`, are skipped).
    pub fn from_yaml_stream(text: &str) -> Result<Vec<HostedCluster>, serde_yaml_ng::Error> {
        let mut out = Vec::new();
        for doc in serde_yaml_ng::Deserializer::from_str(text) {
            let value = serde_yaml_ng::Value::deserialize(doc)?;
            let kind = value.get("kind").and_then(|k| k.as_str());
            let api = value.get("apiVersion").and_then(|k| k.as_str());
            if kind == Some("HostedCluster")
                && api.is_some_and(|a| a.starts_with("hypershift.openshift.io/"))
            {
                out.push(serde_yaml_ng::from_value(value)?);
            }
        }
        Ok(out)
    }
}
