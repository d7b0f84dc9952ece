//! Pure rendering of every object hcp-olm wants for one hosted cluster.
//!
//! [`desired`] turns a [`RenderInput`] (validated HostedCluster view plus facts the
//! runtime resolved: catalog images, certificate material, tunnel keys, the
//! packageserver ClusterIP, hashes of Secrets we mount but do not own) into two
//! ordered object lists: one for the HCP namespace of the management cluster and one
//! for the guest cluster. Every object carries [`labels::MANAGED_BY`] and the
//! hosted-cluster labels so an applier can prune what is no longer desired.

mod guest;
mod hcp;
pub mod labels;
pub mod shared;
pub mod tunnel;

use std::collections::BTreeMap;

use serde::Serialize;
use serde_json::Value;

use crate::catalogs::{CatalogImage, CatalogImageError, DefaultCatalog};
use crate::certs::CertMaterial;
use crate::validate::{Severity, ValidInput};

pub use hcp::PREVIOUS_CA_KEY;
pub use tunnel::{
    AgentPeerConfig, AllowedService, ExposedService, GatewayConfig, TunnelKeys, TunnelNetwork,
};

/// Names of the objects in the HCP namespace. Everything is prefixed with `hcp-olm-`
/// so it never collides with HyperShift's own OLM objects in the same namespace.
pub mod names {
    pub const CATALOG_OPERATOR: &str = "hcp-olm-catalog-operator";
    pub const OLM_OPERATOR: &str = "hcp-olm-olm-operator";
    pub const PACKAGESERVER: &str = "hcp-olm-packageserver";
    pub const PACKAGESERVER_CERT: &str = "hcp-olm-packageserver-cert";
    /// Serving certificates of the OLM operators' metrics endpoints.
    pub const CATALOG_OPERATOR_METRICS_CERT: &str = "hcp-olm-catalog-operator-metrics-cert";
    pub const OLM_OPERATOR_METRICS_CERT: &str = "hcp-olm-olm-operator-metrics-cert";
    /// Client certificate a ServiceMonitor scrapes those endpoints with.
    pub const METRICS_CLIENT: &str = "hcp-olm-metrics-client";
    /// The metrics Service of an OLM operator Deployment.
    pub fn metrics_service(deployment: &str) -> String {
        format!("{deployment}-metrics")
    }
    pub const PACKAGESERVER_PDB: &str = "hcp-olm-packageserver";
    pub const CA: &str = "hcp-olm-ca";
    pub const CATALOG_SA: &str = "hcp-olm-catalog";
    pub const TUNNEL_GATEWAY: &str = "hcp-olm-tunnel-gateway";
    /// Egress to the shared catalogs, where another NetworkPolicy isolates the readers'.
    pub const SHARED_CATALOG_EGRESS: &str = "hcp-olm-shared-catalog-egress";
    pub const TUNNEL_GATEWAY_WG: &str = "hcp-olm-tunnel-gateway-wg";
    /// Headless Service naming every gateway replica (forwarding to the session holder).
    pub const TUNNEL_GATEWAY_PEERS: &str = "hcp-olm-tunnel-gateway-peers";
    /// The gateways' metrics Service (their health port), scraped by a ServiceMonitor.
    pub const TUNNEL_GATEWAY_METRICS: &str = "hcp-olm-tunnel-gateway-metrics";
    pub const GUEST_NAMESPACE: &str = "hcp-olm";
    pub const GUEST_AGENT: &str = "hcp-olm-guest-agent";
    pub const GUEST_AGENT_PEER: &str = "hcp-olm-guest-agent-peer";
    pub const MARKETPLACE_NAMESPACE: &str = "openshift-marketplace";
    /// Guest Service/Endpoints behind the APIService (the name the cert covers).
    pub const GUEST_PACKAGESERVER: &str = "packageserver";
    /// HyperShift's packageserver Service and serving-certificate Secret in the HCP
    /// namespace (its control-plane-operator's names); used in `TakeOver`.
    pub const HYPERSHIFT_PACKAGESERVER: &str = "packageserver";
    pub const HYPERSHIFT_PACKAGESERVER_CERT: &str = "packageserver-cert";
    pub const APISERVICE: &str = "v1.packages.operators.coreos.com";

    /// Name of a management-side catalog Deployment/Service (also the host in the
    /// guest CatalogSource's `spec.address`).
    pub fn catalog(c: crate::catalogs::DefaultCatalog) -> String {
        format!("hcp-olm-{}", c.name())
    }
}

/// Ports.
pub mod ports {
    pub const CATALOG_GRPC: u16 = 50051;
    pub const PACKAGESERVER: u16 = 5443;
    /// OLM operators serve health and metrics on plain :8080 when no TLS flags are set.
    pub const OLM_HEALTH_METRICS: u16 = 8080;
    /// OLM operators' health and metrics with TLS (`--tls-cert`/`--tls-key`).
    pub const OLM_METRICS_TLS: u16 = 8443;
    pub const WIREGUARD: u16 = 51820;
    pub const SOCKS: u16 = 1080;
    /// Gateway replicas forward to each other here.
    pub const GATEWAY_PEER: u16 = 1081;
    pub const TUNNEL_HEALTH: u16 = 8081;
}

/// How the applier treats an object.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum ApplyPolicy {
    /// Server-side apply on every reconcile.
    Apply,
    /// Create if absent, never update afterwards (guest OperatorHub under guest
    /// placement: the guest owns it after creation).
    CreateOnly,
}

/// One desired object.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Object {
    pub api_version: String,
    pub kind: String,
    /// Resource plural (for a dynamic API).
    pub plural: String,
    pub namespace: Option<String>,
    pub name: String,
    pub policy: ApplyPolicy,
    /// The full object, including apiVersion, kind and metadata.
    pub body: Value,
}

impl Object {
    pub(crate) fn new(body: Value, plural: &str, policy: ApplyPolicy) -> Self {
        let s = |p: &str| body.pointer(p).and_then(Value::as_str).map(str::to_string);
        Self {
            api_version: s("/apiVersion").unwrap_or_default(),
            kind: s("/kind").unwrap_or_default(),
            plural: plural.to_string(),
            namespace: s("/metadata/namespace"),
            name: s("/metadata/name").unwrap_or_default(),
            policy,
            body,
        }
    }

    /// `Kind/namespace/name` for logs and tests.
    pub fn id(&self) -> String {
        match &self.namespace {
            Some(ns) => format!("{}/{}/{}", self.kind, ns, self.name),
            None => format!("{}/{}", self.kind, self.name),
        }
    }
}

/// Something the runtime should surface as a condition: the render still produced
/// everything it could.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Pending {
    pub component: String,
    pub reason: &'static str,
    #[serde(skip)]
    pub severity: Severity,
    pub message: String,
}

/// The result of a render.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Desired {
    /// Objects for the HCP namespace of the management cluster, in apply order.
    pub hcp: Vec<Object>,
    /// Objects for the guest cluster, in apply order.
    pub guest: Vec<Object>,
    pub pending: Vec<Pending>,
}

/// An owner for the HCP-namespace objects (our HostedOLM; the HostedCluster lives in
/// another namespace and cannot own them).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Owner {
    pub api_version: String,
    pub kind: String,
    pub name: String,
    pub uid: String,
}

/// PKI material the runtime issued (see [`crate::certs`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PkiInput {
    pub ca: CertMaterial,
    pub packageserver: CertMaterial,
    /// [`crate::certs::sans_fingerprint`] of the SANs the serving cert was issued for.
    pub packageserver_sans_fingerprint: String,
    /// The CA this one replaced (certificate only), while packageserver pods serving a
    /// certificate it signed may still run: the guest APIService `caBundle` trusts both
    /// until the packageserver Deployment has rolled out the new certificate.
    pub previous_ca_pem: Option<String>,
    /// TLS for catalog-operator's and olm-operator's metrics (None: plain HTTP on 8080, as
    /// in offline renders without a CA).
    pub metrics: Option<MetricsPki>,
}

/// Certificates of the OLM operators' metrics endpoints, as HyperShift gives them: a
/// serving certificate each, and a client certificate for scrapers (`--client-ca` is our
/// CA), all signed by the cluster CA.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MetricsPki {
    pub catalog_operator: CertMaterial,
    pub olm_operator: CertMaterial,
    pub client: CertMaterial,
}

impl PkiInput {
    /// The guest APIService `caBundle`: the current CA, then the previous one while it is
    /// still trusted.
    pub fn ca_bundle(&self) -> String {
        let mut b = self.ca.cert_pem.clone();
        if let Some(prev) = &self.previous_ca_pem {
            if !b.ends_with('\n') {
                b.push('\n');
            }
            b.push_str(prev);
        }
        b
    }
}

/// Everything [`desired`] needs.
#[derive(Clone, Debug)]
pub struct RenderInput {
    pub valid: ValidInput,
    /// Per enabled catalog: the chosen image, or why none was found. A catalog without
    /// an entry or with an error is left out (and reported); the rest of OLM proceeds.
    pub catalog_images: BTreeMap<DefaultCatalog, Result<CatalogImage, CatalogImageError>>,
    /// Catalogs in `catalog_images` that keep their last good image because their registry
    /// gave no answer ([`crate::last_good`]); reported, still rendered.
    pub held_catalogs: Vec<crate::last_good::Held>,
    pub pki: PkiInput,
    pub tunnel: TunnelKeys,
    /// ClusterIP of the HCP `hcp-olm-packageserver` Service, once allocated.
    pub packageserver_cluster_ip: Option<String>,
    /// Whether the guest serves the OLM CRDs; OLM pods are scaled to 0 until then.
    pub guest_olm_crds_ready: bool,
    /// Content hashes of Secrets we mount but do not own, by name (the guest
    /// kubeconfig). Feeds the config-hash pod annotations.
    pub external_secret_hashes: BTreeMap<String, String>,
    pub owner: Option<Owner>,
    /// Whether the management cluster serves `monitoring.coreos.com/v1` ServiceMonitors
    /// (they are rendered only then, as HyperShift does).
    pub service_monitors_served: bool,
    /// Whether the management cluster serves OpenShift's SecurityContextConstraints. Without
    /// them (a plain Kubernetes management cluster) the HCP pods run as HyperShift's default
    /// user and group, 1001 (`runAsUser` and `fsGroup`, as HyperShift sets them there), so
    /// the Secret volumes (mode 0440) are readable by the non-root user whatever user the
    /// image names. With them the SCC assigns both from the namespace's range, and a fixed
    /// value would be refused.
    pub management_has_scc: bool,
    /// NetworkPolicies of others in the HCP namespace that isolate egress (HyperShift's
    /// `management-kas`): the shared-catalog readers they select get an egress policy of ours
    /// for the shared catalogs' port ([`crate::netpol`]).
    pub egress_isolation: Vec<crate::netpol::EgressIsolation>,
}

/// HyperShift's user and group for control-plane pods on a management cluster without SCCs.
pub const DEFAULT_POD_USER: i64 = 1001;

#[derive(Debug, thiserror::Error)]
pub enum RenderError {
    #[error("cannot serialize {what}: {source}")]
    Serialize {
        what: &'static str,
        source: serde_json::Error,
    },
    #[error("inconsistent render input: {0}")]
    Input(String),
}

/// Render every object for both clusters.
pub fn desired(input: &RenderInput) -> Result<Desired, RenderError> {
    if input.tunnel.gateway_public_key.is_empty() || input.tunnel.agent_private_key.is_empty() {
        return Err(RenderError::Input("tunnel keys are empty".into()));
    }
    let mut out = Desired::default();
    let catalogs = hcp::resolved_catalogs(input, &mut out.pending);
    hcp::render(input, &catalogs, &mut out)?;
    guest::render(input, &catalogs, &mut out)?;
    tracing::debug!(
        cluster = %input.valid.cluster.key(),
        hcp = out.hcp.len(),
        guest = out.guest.len(),
        pending = out.pending.len(),
        "rendered desired objects"
    );
    Ok(out)
}

/// A catalog that will be rendered, with its image.
#[derive(Clone, Debug)]
pub(crate) struct ResolvedCatalog {
    pub catalog: DefaultCatalog,
    pub image: CatalogImage,
    /// The shared catalog serving it (management placement; see [`crate::sharing`]), or
    /// None for this cluster's own copy in its HCP namespace.
    pub shared: Option<crate::sharing::SharedKey>,
}

impl ResolvedCatalog {
    /// `host:port` of the catalog's gRPC Service, as read from the HCP namespace: the
    /// shared Service's DNS name, or this cluster's own Service.
    pub fn address(&self) -> String {
        match &self.shared {
            Some(k) => format!("{}:{}", k.host(), ports::CATALOG_GRPC),
            None => format!("{}:{}", names::catalog(self.catalog), ports::CATALOG_GRPC),
        }
    }

    /// Whether this cluster runs its own copy in its HCP namespace.
    pub fn own(&self) -> bool {
        self.shared.is_none()
    }
}

/// Multi-document YAML of a render: HCP objects, then guest objects, each document
/// preceded by a comment naming its cluster. Used by `render` and the golden tests.
pub fn to_yaml(d: &Desired) -> Result<String, serde_yaml_ng::Error> {
    let mut s = String::new();
    for (cluster, objs) in [("management", &d.hcp), ("guest", &d.guest)] {
        for o in objs {
            s.push_str("---\n");
            s.push_str(&format!("# cluster: {cluster}; policy: {:?}\n", o.policy));
            s.push_str(&serde_yaml_ng::to_string(&o.body)?);
        }
    }
    Ok(s)
}

/// JSON of a render: `{"hcp": [...], "guest": [...], "pending": [...]}`.
pub fn to_json(d: &Desired) -> Result<String, serde_json::Error> {
    let bodies = |objs: &[Object]| objs.iter().map(|o| o.body.clone()).collect::<Vec<_>>();
    serde_json::to_string_pretty(&serde_json::json!({
        "hcp": bodies(&d.hcp),
        "guest": bodies(&d.guest),
        "pending": d.pending,
    }))
}
