//! The two ends of the WireGuard tunnel: their configuration documents (typed, so the
//! tunnel engineer can change them in one place) and the keys the runtime passes in.

use super::{names, ports};
use crate::catalogs::DefaultCatalog;

/// WireGuard keys (base64, as `wg genkey`/`wg pubkey` print them) and the gateway's
/// externally reachable endpoint (`host:port`, from its Service once known).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TunnelKeys {
    pub gateway_private_key: String,
    pub gateway_public_key: String,
    pub agent_private_key: String,
    pub agent_public_key: String,
    pub gateway_endpoint: Option<String>,
}

/// Tunnel-internal addresses (a /30 point-to-point link).
pub const GATEWAY_TUNNEL_ADDRESS: &str = "100.127.255.1/30";
pub const AGENT_TUNNEL_ADDRESS: &str = "100.127.255.2/30";

pub use hcp_olm_tunnel_api::{
    AgentPeerConfig, AllowedService, ExposedService, GatewayConfig, GatewayDns, SecretKeyRef,
};

/// Where the tunnel ends read their keys: the Secrets are mounted at these directories.
pub const GATEWAY_CONFIG_DIR: &str = "/etc/hcp-olm/tunnel";
pub const AGENT_CONFIG_DIR: &str = "/etc/hcp-olm/peer";
/// Key of the private key in the gateway and agent Secrets.
pub const PRIVATE_KEY_KEY: &str = "private-key";

/// What the two ends need to know about the guest's networks and the HCP namespace.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TunnelNetwork {
    pub hcp_namespace: String,
    /// Guest Service and pod CIDRs: the only addresses the agent relays to.
    pub guest_cidrs: Vec<String>,
    /// The guest cluster DNS (`<ip>:53`), which the agent forwards tunnel DNS to.
    pub guest_dns: Option<String>,
    /// Resolvers for management-owned names (the HCP pods' cluster DNS).
    pub management_dns: Vec<String>,
}

/// Port the agent listens on for a management-side catalog (fixed per catalog so a
/// changed OperatorHub does not renumber the others).
pub fn agent_catalog_port(c: DefaultCatalog) -> u16 {
    match c {
        DefaultCatalog::RedhatOperators => 50051,
        DefaultCatalog::CertifiedOperators => 50052,
        DefaultCatalog::CommunityOperators => 50053,
    }
}

/// Guest catalog pods that OLM creates listen on 50051 in any namespace.
pub fn default_allowed_services() -> Vec<AllowedService> {
    vec![AllowedService {
        namespace: "*".into(),
        name: "*".into(),
        port: ports::CATALOG_GRPC,
    }]
}

pub fn exposed_services(catalogs: &[DefaultCatalog]) -> Vec<ExposedService> {
    catalogs
        .iter()
        .map(|c| ExposedService {
            name: names::catalog(*c),
            listen_port: agent_catalog_port(*c),
            target: format!("{}:{}", names::catalog(*c), ports::CATALOG_GRPC),
        })
        .collect()
}

pub fn agent_peer_config(
    keys: &TunnelKeys,
    net: &TunnelNetwork,
    exposed: Vec<ExposedService>,
) -> AgentPeerConfig {
    AgentPeerConfig {
        gateway_endpoint: keys.gateway_endpoint.clone(),
        gateway_public_key: keys.gateway_public_key.clone(),
        agent_private_key_secret_ref: Some(SecretKeyRef {
            name: names::GUEST_AGENT_PEER.into(),
            key: PRIVATE_KEY_KEY.into(),
        }),
        private_key_file: Some(format!("{AGENT_CONFIG_DIR}/{PRIVATE_KEY_KEY}")),
        private_key: None,
        tunnel_address: AGENT_TUNNEL_ADDRESS.into(),
        gateway_tunnel_address: GATEWAY_TUNNEL_ADDRESS.into(),
        persistent_keepalive_seconds: 25,
        allowed_services: default_allowed_services(),
        allowed_cidrs: net.guest_cidrs.clone(),
        allowed_ports: Vec::new(),
        guest_dns: net.guest_dns.iter().cloned().collect(),
        exposed_services: exposed,
        exposed_listen_address: Some("0.0.0.0".into()),
        health_listen: Some(format!("0.0.0.0:{}", ports::TUNNEL_HEALTH)),
        mtu: None,
        drain_timeout_seconds: None,
    }
}

pub fn gateway_config(
    keys: &TunnelKeys,
    net: &TunnelNetwork,
    exposed: Vec<ExposedService>,
) -> GatewayConfig {
    GatewayConfig {
        listen_port: ports::WIREGUARD,
        listen_address: None,
        private_key: None,
        private_key_file: Some(format!("{GATEWAY_CONFIG_DIR}/{PRIVATE_KEY_KEY}")),
        agent_public_key: keys.agent_public_key.clone(),
        tunnel_address: GATEWAY_TUNNEL_ADDRESS.into(),
        agent_tunnel_address: AGENT_TUNNEL_ADDRESS.into(),
        guest_cidrs: net.guest_cidrs.clone(),
        hcp_namespace: Some(net.hcp_namespace.clone()),
        cluster_domain: None,
        socks_listen: Some(format!("0.0.0.0:{}", ports::SOCKS)),
        connect_listen: None,
        health_listen: format!("0.0.0.0:{}", ports::TUNNEL_HEALTH),
        allow_local_targets: None,
        dns: GatewayDns {
            local_upstreams: net.management_dns.clone(),
            rules: Vec::new(),
            listen: None,
        },
        allowed_services: default_allowed_services(),
        exposed_services: exposed,
        persistent_keepalive_seconds: None,
        mtu: None,
        drain_timeout_seconds: None,
    }
}

/// The networks of one hosted cluster as the tunnel ends see them.
pub fn network(input: &super::RenderInput) -> TunnelNetwork {
    let v = &input.valid;
    TunnelNetwork {
        hcp_namespace: v.cluster.hcp_namespace.clone(),
        guest_cidrs: v
            .guest_service_cidrs
            .iter()
            .chain(v.guest_pod_cidrs.iter())
            .cloned()
            .collect(),
        guest_dns: crate::validate::guest_dns_address(&v.guest_service_cidrs)
            .map(|ip| format!("{ip}:53")),
        // the gateway falls back to its pod's resolv.conf (the management cluster DNS)
        management_dns: Vec::new(),
    }
}
