//! The two ends of the WireGuard tunnel: their configuration documents (typed, so the
//! tunnel engineer can change them in one place) and the keys the runtime passes in.

use serde::{Deserialize, Serialize};

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

/// Reference to a key inside a Secret.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SecretKeyRef {
    pub name: String,
    pub key: String,
}

/// A guest Service the control plane may reach through the tunnel. `*` matches any
/// namespace or name.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AllowedService {
    pub namespace: String,
    pub name: String,
    pub port: u16,
}

/// A control-plane service the agent exposes inside the guest: it listens on
/// `listen_port` and forwards through the tunnel to `target` (`host:port` as the
/// gateway resolves it in the HCP namespace).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExposedService {
    pub name: String,
    pub listen_port: u16,
    pub target: String,
}

/// The guest agent's peer configuration (JSON in the `peer.json` key of
/// `hcp-olm/hcp-olm-guest-agent-peer`). PROVISIONAL: owned by the tunnel design.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AgentPeerConfig {
    /// `host:port` of the gateway's WireGuard UDP endpoint; None until known.
    pub gateway_endpoint: Option<String>,
    pub gateway_public_key: String,
    pub agent_private_key_secret_ref: SecretKeyRef,
    pub tunnel_address: String,
    pub gateway_tunnel_address: String,
    pub persistent_keepalive_seconds: u16,
    /// Guest Services the gateway may ask the agent to dial.
    pub allowed_services: Vec<AllowedService>,
    /// Control-plane services the agent re-exposes in the guest.
    pub exposed_services: Vec<ExposedService>,
}

/// The gateway's configuration (JSON in `config.json` of the HCP Secret
/// `hcp-olm-tunnel-gateway`). PROVISIONAL: owned by the tunnel design.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct GatewayConfig {
    pub listen_port: u16,
    pub private_key: String,
    pub agent_public_key: String,
    pub tunnel_address: String,
    pub agent_tunnel_address: String,
    /// SOCKS5 listener OLM pods use as `GRPC_PROXY`.
    pub socks_listen: String,
    pub health_listen: String,
    pub allowed_services: Vec<AllowedService>,
    pub exposed_services: Vec<ExposedService>,
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

pub fn agent_peer_config(keys: &TunnelKeys, exposed: Vec<ExposedService>) -> AgentPeerConfig {
    AgentPeerConfig {
        gateway_endpoint: keys.gateway_endpoint.clone(),
        gateway_public_key: keys.gateway_public_key.clone(),
        agent_private_key_secret_ref: SecretKeyRef {
            name: names::GUEST_AGENT_PEER.into(),
            key: "private-key".into(),
        },
        tunnel_address: AGENT_TUNNEL_ADDRESS.into(),
        gateway_tunnel_address: GATEWAY_TUNNEL_ADDRESS.into(),
        persistent_keepalive_seconds: 25,
        allowed_services: default_allowed_services(),
        exposed_services: exposed,
    }
}

pub fn gateway_config(keys: &TunnelKeys, exposed: Vec<ExposedService>) -> GatewayConfig {
    GatewayConfig {
        listen_port: ports::WIREGUARD,
        private_key: keys.gateway_private_key.clone(),
        agent_public_key: keys.agent_public_key.clone(),
        tunnel_address: GATEWAY_TUNNEL_ADDRESS.into(),
        agent_tunnel_address: AGENT_TUNNEL_ADDRESS.into(),
        socks_listen: format!("0.0.0.0:{}", ports::SOCKS),
        health_listen: format!("0.0.0.0:{}", ports::TUNNEL_HEALTH),
        allowed_services: default_allowed_services(),
        exposed_services: exposed,
    }
}
