//! The two ends of the WireGuard tunnel: their configuration documents (typed, so the
//! tunnel engineer can change them in one place) and the keys the runtime passes in.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use super::{ResolvedCatalog, names, ports};
use crate::catalogs::DefaultCatalog;

/// WireGuard keys (base64, as `wg genkey`/`wg pubkey` print them) and the gateway's
/// externally reachable endpoint (`host:port`, from its Service once known).
#[derive(Clone, Default, PartialEq, Eq)]
pub struct TunnelKeys {
    pub gateway_private_key: String,
    pub gateway_public_key: String,
    pub agent_private_key: String,
    pub agent_public_key: String,
    /// Key rotation: a further gateway private key the gateway accepts handshakes with
    /// (the next one, then the previous one) ...
    pub gateway_extra_private_key: Option<String>,
    /// ... and a further agent public key it accepts.
    pub agent_extra_public_key: Option<String>,
    /// `Idle`, `NewKeysAccepted` or `OldKeysAccepted`.
    pub rotation_phase: &'static str,
    /// The `spec.tunnel.keyRotation` value the last rotation was started for.
    pub rotation_token: Option<String>,
    /// When the rotation wants the next reconcile.
    pub rotation_recheck: Option<std::time::Duration>,
    pub gateway_endpoint: Option<String>,
    /// Why `gateway_endpoint` is None, when the runtime looked (None in offline
    /// renders: the Service has not been read).
    pub gateway_endpoint_wait: Option<EndpointWait>,
}

/// Private keys never appear in Debug output (logs, panics, error chains).
impl std::fmt::Debug for TunnelKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let redacted = |k: &str| if k.is_empty() { "" } else { "<redacted>" };
        f.debug_struct("TunnelKeys")
            .field("gateway_private_key", &redacted(&self.gateway_private_key))
            .field("gateway_public_key", &self.gateway_public_key)
            .field("agent_private_key", &redacted(&self.agent_private_key))
            .field("agent_public_key", &self.agent_public_key)
            .field(
                "gateway_extra_private_key",
                &self
                    .gateway_extra_private_key
                    .as_ref()
                    .map(|_| "<redacted>"),
            )
            .field("agent_extra_public_key", &self.agent_extra_public_key)
            .field("rotation_phase", &self.rotation_phase)
            .field("rotation_token", &self.rotation_token)
            .field("rotation_recheck", &self.rotation_recheck)
            .field("gateway_endpoint", &self.gateway_endpoint)
            .field("gateway_endpoint_wait", &self.gateway_endpoint_wait)
            .finish()
    }
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
///   hostname, with the Service port. For an `ipv6_only` guest (its nodes reach IPv6
///   addresses and names only) the first IPv6 or hostname ingress; with IPv4 ingress alone
///   it waits (`WaitingForIPv6LoadBalancer`).
pub fn gateway_endpoint(
    service: Option<&k8s_openapi::api::core::v1::Service>,
    expected_type: &str,
    address: Option<&str>,
    node_port_address: Option<&str>,
    ipv6_only: bool,
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
            let all: Vec<String> = svc
                .status
                .as_ref()
                .and_then(|s| s.load_balancer.as_ref())
                .and_then(|lb| lb.ingress.as_ref())
                .into_iter()
                .flatten()
                .filter_map(|i| {
                    i.ip.clone()
                        .filter(|v| !v.is_empty())
                        .or_else(|| i.hostname.clone().filter(|v| !v.is_empty()))
                })
                .collect();
            let ingress = if ipv6_only {
                // an IPv6 literal, or a name (which may have AAAA records)
                all.iter()
                    .find(|h| h.parse::<std::net::Ipv4Addr>().is_err())
                    .cloned()
            } else {
                all.first().cloned()
            };
            match ingress {
                Some(h) => Ok(host_port(&h, p.port)),
                None if !all.is_empty() => Err(wait(
                    "WaitingForIPv6LoadBalancer",
                    format!(
                        "the guest is IPv6-only and the LoadBalancer Service {name} has IPv4 ingress only ({}); a load balancer with IPv6 (the Service asks for both families), or HostedOLM spec.tunnel.address, is needed",
                        all.join(", ")
                    ),
                )),
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

/// Tunnel-internal addresses (a /30 point-to-point link; the IPv6 pair for guests with IPv6
/// ranges).
pub use hcp_olm_tunnel_api::{
    AGENT_TUNNEL_ADDRESS, AGENT_TUNNEL_ADDRESS6, GATEWAY_TUNNEL_ADDRESS, GATEWAY_TUNNEL_ADDRESS6,
};
pub use hcp_olm_tunnel_api::{
    AgentPeerConfig, AllowedService, ExposedService, GatewayConfig, GatewayDns, SecretKeyRef,
};

/// Where the tunnel ends read their keys: the Secrets are mounted at these directories.
pub const GATEWAY_CONFIG_DIR: &str = "/etc/hcp-olm/tunnel";
pub const AGENT_CONFIG_DIR: &str = "/etc/hcp-olm/peer";
/// Key of the private key in the gateway and agent Secrets.
pub const PRIVATE_KEY_KEY: &str = "private-key";
/// Key of the further private key the gateway accepts during a key rotation.
pub const EXTRA_PRIVATE_KEY_KEY: &str = "extra-private-key";

/// What the two ends need to know about the guest's networks and the HCP namespace.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TunnelNetwork {
    pub hcp_namespace: String,
    /// Guest Service and pod CIDRs, IPv4 and IPv6: the only addresses the agent relays to.
    pub guest_cidrs: Vec<String>,
    /// The guest cluster DNS (`<ip>:53`, `[<ipv6>]:53`), which the agent forwards tunnel
    /// DNS to.
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

/// Keepalive of both ends. WireGuard's usual 25 s is about NAT bindings; 10 s also lets the
/// gateway tell within [`PEER_TIMEOUT_SECONDS`] that the agent is gone (32 bytes each way
/// per 10 s per hosted cluster).
pub const KEEPALIVE_SECONDS: u16 = 10;
/// The gateway resets tunnel connections after this much silence from the agent, so OLM
/// reports a guest catalog TRANSIENT_FAILURE instead of holding a stalled stream.
pub const PEER_TIMEOUT_SECONDS: u64 = 25;

/// Memory limit of both tunnel ends' containers: `max_connections` (default 128) stalled
/// relays at up to ~1 MiB each plus the process (measured by
/// `security_gateway_stream_flood_keeps_memory_bounded`).
pub const TUNNEL_MEMORY_LIMIT: &str = "384Mi";

/// Guest catalog pods that OLM creates listen on 50051 in any namespace.
pub fn default_allowed_services() -> Vec<AllowedService> {
    vec![AllowedService {
        namespace: "*".into(),
        name: "*".into(),
        port: ports::CATALOG_GRPC,
    }]
}

pub(crate) fn exposed_services(catalogs: &[ResolvedCatalog]) -> Vec<ExposedService> {
    catalogs
        .iter()
        .map(|c| ExposedService {
            name: names::catalog(c.catalog),
            listen_port: agent_catalog_port(c.catalog),
            target: c.address(),
        })
        .collect()
}

/// The management-side Services the gateway's proxies may dial: the HCP's own catalog
/// Services, or the shared ones in `hcp-olm-catalogs` (management placement). Every other
/// management name is refused, so a name a guest puts in a CatalogSource cannot reach the
/// management network.
pub(crate) fn allowed_local_services(
    hcp_namespace: &str,
    catalogs: &[ResolvedCatalog],
) -> Vec<AllowedService> {
    catalogs
        .iter()
        .map(|c| match &c.shared {
            Some(k) => AllowedService {
                namespace: crate::sharing::SHARED_NAMESPACE.to_string(),
                name: k.name(),
                port: ports::CATALOG_GRPC,
            },
            None => AllowedService {
                namespace: hcp_namespace.to_string(),
                name: names::catalog(c.catalog),
                port: ports::CATALOG_GRPC,
            },
        })
        .collect()
}

pub fn agent_peer_config(
    keys: &TunnelKeys,
    net: &TunnelNetwork,
    exposed: Vec<ExposedService>,
) -> AgentPeerConfig {
    let ipv6 = crate::validate::has_ipv6(&net.guest_cidrs);
    let any = if ipv6 {
        IpAddr::V6(Ipv6Addr::UNSPECIFIED)
    } else {
        IpAddr::V4(Ipv4Addr::UNSPECIFIED)
    };
    AgentPeerConfig {
        gateway_endpoint: keys.gateway_endpoint.clone(),
        gateway_public_key: keys.gateway_public_key.clone(),
        agent_private_key_secret_ref: Some(SecretKeyRef {
            name: names::GUEST_AGENT_PEER.into(),
            key: PRIVATE_KEY_KEY.into(),
        }),
        private_key_file: Some(format!("{AGENT_CONFIG_DIR}/{PRIVATE_KEY_KEY}")),
        private_key: None,
        key_reload_seconds: None,
        tunnel_address: AGENT_TUNNEL_ADDRESS.into(),
        gateway_tunnel_address: GATEWAY_TUNNEL_ADDRESS.into(),
        tunnel_address6: ipv6.then(|| AGENT_TUNNEL_ADDRESS6.into()),
        gateway_tunnel_address6: ipv6.then(|| GATEWAY_TUNNEL_ADDRESS6.into()),
        persistent_keepalive_seconds: KEEPALIVE_SECONDS,
        allowed_services: default_allowed_services(),
        allowed_cidrs: net.guest_cidrs.clone(),
        allowed_ports: Vec::new(),
        guest_dns: net.guest_dns.iter().cloned().collect(),
        exposed_services: exposed,
        // `::` takes IPv4 too (dual-stack pods); an IPv4-only pod may have no IPv6 at all.
        exposed_listen_address: Some(any.to_string()),
        health_listen: Some(SocketAddr::new(any, ports::TUNNEL_HEALTH).to_string()),
        mtu: None,
        drain_timeout_seconds: None,
        max_connections: None,
        idle_timeout_seconds: None,
    }
}

/// `local`: see [`allowed_local_services`].
pub fn gateway_config(
    keys: &TunnelKeys,
    net: &TunnelNetwork,
    exposed: Vec<ExposedService>,
    local: Vec<AllowedService>,
) -> GatewayConfig {
    // IPv6 inside the tunnel only where the guest has IPv6 ranges (the gateway dials them
    // from its IPv6 tunnel address); IPv4-only guests keep the config they had.
    let ipv6 = crate::validate::has_ipv6(&net.guest_cidrs);
    GatewayConfig {
        listen_port: ports::WIREGUARD,
        listen_address: None,
        private_key: None,
        private_key_file: Some(format!("{GATEWAY_CONFIG_DIR}/{PRIVATE_KEY_KEY}")),
        agent_public_key: keys.agent_public_key.clone(),
        previous_private_key_files: keys
            .gateway_extra_private_key
            .iter()
            .map(|_| format!("{GATEWAY_CONFIG_DIR}/{EXTRA_PRIVATE_KEY_KEY}"))
            .collect(),
        previous_agent_public_keys: keys.agent_extra_public_key.iter().cloned().collect(),
        key_reload_seconds: None,
        tunnel_address: GATEWAY_TUNNEL_ADDRESS.into(),
        agent_tunnel_address: AGENT_TUNNEL_ADDRESS.into(),
        tunnel_address6: ipv6.then(|| GATEWAY_TUNNEL_ADDRESS6.into()),
        agent_tunnel_address6: ipv6.then(|| AGENT_TUNNEL_ADDRESS6.into()),
        guest_cidrs: net.guest_cidrs.clone(),
        hcp_namespace: Some(net.hcp_namespace.clone()),
        cluster_domain: None,
        socks_listen: Some(format!("0.0.0.0:{}", ports::SOCKS)),
        connect_listen: None,
        // Every replica (one, or two when highly available) finds the others here; one
        // without the agent's session forwards guest targets to the one that has it.
        peer_listen: Some(format!("0.0.0.0:{}", ports::GATEWAY_PEER)),
        peers: Some(format!(
            "{}.{}.svc:{}",
            names::TUNNEL_GATEWAY_PEERS,
            net.hcp_namespace,
            ports::GATEWAY_PEER
        )),
        health_listen: format!("0.0.0.0:{}", ports::TUNNEL_HEALTH),
        dns: GatewayDns {
            local_upstreams: net.management_dns.clone(),
            rules: Vec::new(),
            listen: None,
            allowed_clients: Vec::new(),
            rate_limit_qps: None,
        },
        allowed_services: default_allowed_services(),
        allowed_local_services: local,
        max_connections: None,
        handshake_timeout_seconds: None,
        idle_timeout_seconds: None,
        exposed_services: exposed,
        persistent_keepalive_seconds: Some(KEEPALIVE_SECONDS),
        peer_timeout_seconds: Some(PEER_TIMEOUT_SECONDS),
        mtu: None,
        drain_timeout_seconds: None,
    }
}

/// The gateway config without its key fields: what the gateway pods must restart for
/// (keys are re-read from the mounted Secret while running).
pub fn gateway_config_without_keys(c: &GatewayConfig) -> GatewayConfig {
    GatewayConfig {
        agent_public_key: String::new(),
        previous_private_key_files: Vec::new(),
        previous_agent_public_keys: Vec::new(),
        ..c.clone()
    }
}

/// The agent config without its key fields (see [`gateway_config_without_keys`]).
pub fn agent_peer_config_without_keys(c: &AgentPeerConfig) -> AgentPeerConfig {
    AgentPeerConfig {
        gateway_public_key: String::new(),
        ..c.clone()
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
        // `[fd02::a]:53` for an IPv6 Service range
        guest_dns: crate::validate::guest_dns_address(&v.guest_service_cidrs)
            .map(|ip| SocketAddr::new(ip, 53).to_string()),
        // the gateway falls back to its pod's resolv.conf (the management cluster DNS)
        management_dns: Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::Service;

    fn svc(v: serde_json::Value) -> Service {
        serde_json::from_value(v).unwrap()
    }

    /// For a guest that is not IPv6-only.
    fn gateway_endpoint(
        service: Option<&Service>,
        expected_type: &str,
        address: Option<&str>,
        node_port_address: Option<&str>,
    ) -> Result<String, EndpointWait> {
        super::gateway_endpoint(service, expected_type, address, node_port_address, false)
    }

    /// Issue 19: an IPv6-only guest's nodes reach only IPv6 addresses (or a name), so of a
    /// dual-stack load balancer's ingress it takes the IPv6 one; with IPv4 ingress alone it
    /// waits, saying why.
    #[test]
    fn an_ipv6_only_guest_takes_the_ipv6_ingress() {
        let mut lb = svc(
            serde_json::json!({"spec": {"type": "LoadBalancer", "ports": [
            {"port": 51820, "protocol": "UDP", "nodePort": 31234}]}}),
        );
        let ingress = |lb: &mut Service, v: serde_json::Value| {
            lb.status = Some(
                serde_json::from_value(serde_json::json!({"loadBalancer": {"ingress": v}}))
                    .unwrap(),
            );
        };
        ingress(
            &mut lb,
            serde_json::json!([{"ip": "198.18.0.9"}, {"ip": "fd00::9"}]),
        );
        let ep = |lb: &Service, v6: bool| {
            super::gateway_endpoint(Some(lb), "LoadBalancer", None, None, v6)
        };
        assert_eq!(ep(&lb, false), Ok("198.18.0.9:51820".into()));
        assert_eq!(ep(&lb, true), Ok("[fd00::9]:51820".into()));
        ingress(
            &mut lb,
            serde_json::json!([{"ip": "198.18.0.9"}, {"hostname": "lb.example.com"}]),
        );
        assert_eq!(ep(&lb, true), Ok("lb.example.com:51820".into()));
        ingress(&mut lb, serde_json::json!([{"ip": "198.18.0.9"}]));
        let e = ep(&lb, true).unwrap_err();
        assert_eq!(
            (e.reason, e.blocking),
            ("WaitingForIPv6LoadBalancer", false)
        );
        assert!(e.message.contains("spec.tunnel.address"), "{}", e.message);
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

#[cfg(test)]
mod debug_tests {
    use super::TunnelKeys;

    #[test]
    fn private_keys_never_appear_in_debug_output() {
        let k = TunnelKeys {
            gateway_private_key: "R0FURVdBWS1QUklWQVRFLUtFWQ==".into(),
            gateway_public_key: "gw-public".into(),
            agent_private_key: "QUdFTlQtUFJJVkFURS1LRVk=".into(),
            agent_public_key: "agent-public".into(),
            gateway_extra_private_key: Some("TkVYVC1HQVRFV0FZLUtFWQ==".into()),
            ..Default::default()
        };
        let text = format!("{k:?} {k:#?}");
        for secret in [
            "R0FURVdBWS1QUklWQVRFLUtFWQ==",
            "QUdFTlQtUFJJVkFURS1LRVk=",
            "TkVYVC1HQVRFV0FZLUtFWQ==",
        ] {
            assert!(!text.contains(secret), "{text}");
        }
        assert!(text.contains("gw-public") && text.contains("agent-public"));
    }
}
