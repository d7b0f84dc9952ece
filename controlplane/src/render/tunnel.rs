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
    /// Why `gateway_endpoint` is None, when the runtime looked (None in offline
    /// renders: the Service has not been read).
    pub gateway_endpoint_wait: Option<EndpointWait>,
}

/// Why the gateway's endpoint is not known.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EndpointWait {
    pub reason: &'static str,
    pub message: String,
    /// True when it cannot resolve without a configuration change (Degraded), false
    /// while waiting for the cluster (Progressing).
    pub blocking: bool,
}

/// The gateway's externally reachable `host:port`, from its WireGuard Service as read
/// back from the management cluster (`service`: the live object, None when it does
/// not exist yet).
///
/// - NodePort: `address` (HostedOLM `spec.tunnel.address`), else the HostedCluster's
///   NodePort publishing address, with the allocated node port;
/// - LoadBalancer: `address` if given, else `status.loadBalancer.ingress[0]` ip or
///   hostname, with the Service port.
pub fn gateway_endpoint(
    service: Option<&k8s_openapi::api::core::v1::Service>,
    expected_type: &str,
    address: Option<&str>,
    node_port_address: Option<&str>,
) -> Result<String, EndpointWait> {
    let name = names::TUNNEL_GATEWAY_WG;
    let wait = |reason, message: String| EndpointWait {
        reason,
        message,
        blocking: false,
    };
    let Some(svc) = service else {
        return Err(wait(
            "WaitingForTunnelService",
            format!("the Service {name} does not exist yet"),
        ));
    };
    let spec = svc.spec.clone().unwrap_or_default();
    let port = spec
        .ports
        .iter()
        .flatten()
        .find(|p| p.protocol.as_deref() == Some("UDP") && p.port == i32::from(ports::WIREGUARD))
        .or_else(|| spec.ports.iter().flatten().next())
        .cloned();
    let host_port = |host: &str, port: i32| {
        if host.contains(':') {
            format!("[{host}]:{port}")
        } else {
            format!("{host}:{port}")
        }
    };
    if spec.type_.as_deref() != Some(expected_type) {
        return Err(wait(
            "WaitingForTunnelService",
            format!(
                "the Service {name} has type {:?}, not {expected_type} yet",
                spec.type_
            ),
        ));
    }
    match spec.type_.as_deref() {
        Some("LoadBalancer") => {
            let Some(p) = port else {
                return Err(wait(
                    "WaitingForTunnelPort",
                    format!("the Service {name} has no port"),
                ));
            };
            if let Some(a) = address {
                return Ok(host_port(a, p.port));
            }
            let ingress = svc
                .status
                .as_ref()
                .and_then(|s| s.load_balancer.as_ref())
                .and_then(|lb| lb.ingress.as_ref())
                .and_then(|i| i.first())
                .and_then(|i| {
                    i.ip.clone()
                        .filter(|v| !v.is_empty())
                        .or_else(|| i.hostname.clone().filter(|v| !v.is_empty()))
                });
            match ingress {
                Some(h) => Ok(host_port(&h, p.port)),
                None => Err(wait(
                    "WaitingForLoadBalancer",
                    format!(
                        "the LoadBalancer Service {name} has no status.loadBalancer.ingress yet"
                    ),
                )),
            }
        }
        Some("NodePort") => {
            let Some(node_port) = port.and_then(|p| p.node_port).filter(|p| *p > 0) else {
                return Err(wait(
                    "WaitingForNodePort",
                    format!("the NodePort Service {name} has no node port allocated yet"),
                ));
            };
            match address.or(node_port_address) {
                Some(a) => Ok(host_port(a, node_port)),
                None => Err(EndpointWait {
                    reason: "TunnelAddressUnknown",
                    message: format!(
                        "the NodePort Service {name} has node port {node_port}, but no address is known: the HostedCluster publishes no service by NodePort (spec.services) and HostedOLM spec.tunnel.address is unset"
                    ),
                    blocking: true,
                }),
            }
        }
        other => Err(wait(
            "WaitingForTunnelService",
            format!("the Service {name} has type {other:?}, not the rendered one yet"),
        )),
    }
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

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::Service;

    fn svc(v: serde_json::Value) -> Service {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn endpoint_from_node_port_or_load_balancer() {
        let np = svc(serde_json::json!({"spec": {"type": "NodePort", "ports": [
            {"port": 51820, "protocol": "UDP", "nodePort": 31234}]}}));
        assert_eq!(
            gateway_endpoint(Some(&np), "NodePort", None, Some("api.example.com")),
            Ok("api.example.com:31234".into())
        );
        assert_eq!(
            gateway_endpoint(
                Some(&np),
                "NodePort",
                Some("fd00::7"),
                Some("api.example.com")
            ),
            Ok("[fd00::7]:31234".into())
        );
        let e = gateway_endpoint(Some(&np), "NodePort", None, None).unwrap_err();
        assert_eq!((e.reason, e.blocking), ("TunnelAddressUnknown", true));
        let e = gateway_endpoint(Some(&np), "LoadBalancer", None, None).unwrap_err();
        assert_eq!(e.reason, "WaitingForTunnelService");
        let e = gateway_endpoint(None, "NodePort", None, Some("a")).unwrap_err();
        assert_eq!((e.reason, e.blocking), ("WaitingForTunnelService", false));

        let mut lb = svc(
            serde_json::json!({"spec": {"type": "LoadBalancer", "ports": [
            {"port": 51820, "protocol": "UDP", "nodePort": 31234}]}}),
        );
        let e = gateway_endpoint(Some(&lb), "LoadBalancer", None, Some("a")).unwrap_err();
        assert_eq!(e.reason, "WaitingForLoadBalancer");
        lb.status = Some(
            serde_json::from_value(serde_json::json!({"loadBalancer": {"ingress": [
                {"hostname": "lb.example.com"}]}}))
            .unwrap(),
        );
        assert_eq!(
            gateway_endpoint(Some(&lb), "LoadBalancer", None, Some("a")),
            Ok("lb.example.com:51820".into())
        );
    }
}
