//! Configuration documents of the two tunnel ends: the control-plane gateway (HCP namespace,
//! unprivileged) and the guest agent. Serde types only; the binaries in
//! `hcp-olm-guest-agent` validate them (exit 64 naming the field) and the controller renders
//! them. Both documents are JSON.

use serde::{Deserialize, Serialize};

/// Tunnel-internal addresses (a /30 point-to-point link).
pub const GATEWAY_TUNNEL_ADDRESS: &str = "100.127.255.1/30";
pub const AGENT_TUNNEL_ADDRESS: &str = "100.127.255.2/30";
/// The IPv6 pair inside the tunnel (a /126 of a unique local prefix), configured when the
/// guest has IPv6 Service or pod ranges: the gateway dials IPv6 guest targets from it.
pub const GATEWAY_TUNNEL_ADDRESS6: &str = "fd9c:4f1e:7a2b:ffff::1/126";
pub const AGENT_TUNNEL_ADDRESS6: &str = "fd9c:4f1e:7a2b:ffff::2/126";
/// The cluster domain both sides use unless told otherwise.
pub const DEFAULT_CLUSTER_DOMAIN: &str = "cluster.local";
/// The tunnel's inner MTU (WireGuard over a 1500-byte underlay, IPv6 worst case).
pub const DEFAULT_MTU: u16 = 1420;

/// Why an IP address cannot be where one tunnel end dials the other (`None`: it can; loopback
/// passes, for tests on one host). The controller checks `HostedOLM.spec.tunnel.address`
/// with it, the agent its `gateway_endpoint` and every address a gateway name resolves to.
pub fn unusable_endpoint_ip(ip: std::net::IpAddr) -> Option<&'static str> {
    use std::net::IpAddr;
    match ip {
        IpAddr::V4(v) if v.is_link_local() => Some("link-local"),
        IpAddr::V6(v) if v.is_unicast_link_local() => Some("link-local"),
        ip if ip.is_unspecified() => Some("unspecified"),
        ip if ip.is_multicast() => Some("multicast"),
        IpAddr::V4(v) if v.is_broadcast() => Some("broadcast"),
        _ => None,
    }
}

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

/// A control-plane service the agent exposes inside the guest: the agent listens on
/// `listen_port` and carries each connection through the tunnel to the gateway's tunnel
/// address on the same port; the gateway dials `target` (`host:port` as resolved in the HCP
/// namespace, or `ip:port`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExposedService {
    pub name: String,
    pub listen_port: u16,
    pub target: String,
}

/// Who answers a DNS name (split DNS).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DnsOwner {
    /// Management-side resolvers (`GatewayDns::local_upstreams`).
    Local,
    /// The guest's DNS, across the tunnel (the agent forwards to its `guest_dns`).
    Guest,
    /// Answer REFUSED.
    Refuse,
}

/// One ownership rule: names under `[namespace.]suffix` belong to `owner`; longest match wins.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DnsRule {
    pub suffix: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    pub owner: DnsOwner,
}

/// The gateway's split DNS (used for CONNECT/SOCKS targets, optionally served to pods).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GatewayDns {
    /// Management-side resolvers (`ip` or `ip:port`), e.g. the cluster DNS Service IP.
    pub local_upstreams: Vec<String>,
    /// Ownership rules. Empty means the default split: `svc.<domain>` → guest,
    /// `<hcp_namespace>.svc.<domain>` → local, the reverse zones of `guest_cidrs`
    /// (`in-addr.arpa`, `ip6.arpa`; PTR names of guest addresses) → guest, everything else →
    /// local.
    #[serde(default)]
    pub rules: Vec<DnsRule>,
    /// Optional `ip:port` to serve the split DNS on (UDP and TCP) for pods' `dnsConfig`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub listen: Option<String>,
    /// Source CIDRs `listen` answers; queries from anywhere else get REFUSED (never an open
    /// resolver). Empty: loopback and private ranges (10/8, 172.16/12, 192.168/16,
    /// 100.64/10, fc00::/7).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allowed_clients: Vec<String>,
    /// Queries per second one client address may send to `listen` (default 200, bursts of
    /// twice that); more are dropped.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate_limit_qps: Option<u32>,
}

/// The gateway's configuration (JSON in `config.json` of the HCP Secret
/// `hcp-olm-tunnel-gateway`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct GatewayConfig {
    /// WireGuard UDP port (bound on `listen_address`).
    pub listen_port: u16,
    /// Address the UDP socket binds (default `0.0.0.0`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub listen_address: Option<String>,
    /// The gateway's private key inline (base64) ...
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub private_key: Option<String>,
    /// ... or a file holding it (a Secret mount). Exactly one of the two.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub private_key_file: Option<String>,
    pub agent_public_key: String,
    /// Key rotation: files of earlier gateway private keys it still answers handshakes
    /// with, until the agent has moved to the new gateway key.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub previous_private_key_files: Vec<String>,
    /// Key rotation: earlier agent public keys still accepted besides `agent_public_key`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub previous_agent_public_keys: Vec<String>,
    /// How often the config and key files are re-read for new keys, in seconds (default 5;
    /// 0: never). Only keys are taken over; other changes need a restart.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key_reload_seconds: Option<u64>,
    /// This end's tunnel address with prefix (`100.127.255.1/30`).
    pub tunnel_address: String,
    pub agent_tunnel_address: String,
    /// This end's IPv6 tunnel address with prefix (`fd9c:4f1e:7a2b:ffff::1/126`) and the
    /// agent's: both or neither. Needed for IPv6 `guest_cidrs`; absent, IPv4 only inside.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tunnel_address6: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent_tunnel_address6: Option<String>,
    /// Guest Service and pod CIDRs (IPv4 and IPv6): inner source addresses accepted from
    /// the agent besides its tunnel address (replies of guest services the gateway dialed).
    #[serde(default)]
    pub guest_cidrs: Vec<String>,
    /// Kubernetes namespace of this hosted control plane (its names resolve locally).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hcp_namespace: Option<String>,
    /// Cluster domain of both sides (default `cluster.local`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster_domain: Option<String>,
    /// SOCKS5 listener (`ip:port`) for OLM pods; optional.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub socks_listen: Option<String>,
    /// HTTP CONNECT listener (`ip:port`) OLM pods use as `GRPC_PROXY`/`HTTPS_PROXY`; optional.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub connect_listen: Option<String>,
    /// Replicas: where this replica takes connections other replicas forward (`ip:port`,
    /// SOCKS5). They are answered only through this replica's own tunnel session, never
    /// forwarded again. Optional.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peer_listen: Option<String>,
    /// Replicas: `host:port` naming every replica's `peer_listen` (a headless Service). A
    /// proxy request for a guest target that arrives while this replica holds no tunnel
    /// session (the agent's WireGuard flow is pinned to one replica) is forwarded to a
    /// replica that holds it. Optional.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peers: Option<String>,
    /// `/healthz` `/readyz` `/metrics`.
    pub health_listen: String,
    pub dns: GatewayDns,
    pub allowed_services: Vec<AllowedService>,
    /// Management-side Services (`<name>.<namespace>.svc`, exact names, no `*`) the proxies
    /// may dial with an OS socket, e.g. the HCP's own catalogs. Every other name the split DNS
    /// gives to the management side is refused (as if it did not exist): guest-chosen names
    /// must never reach the management network. Default: none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allowed_local_services: Vec<AllowedService>,
    /// Proxy and exposed-service connections relayed at once (default 128); more are closed
    /// at once and counted (`result="over_limit"`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_connections: Option<u32>,
    /// Total time a proxy client has to send its CONNECT/SOCKS5 request, in seconds
    /// (default 10).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub handshake_timeout_seconds: Option<u64>,
    /// A relayed stream on which no byte moved in either direction for this long is closed,
    /// in seconds (default 3600).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idle_timeout_seconds: Option<u64>,
    pub exposed_services: Vec<ExposedService>,
    /// Keepalive towards the agent once its endpoint is known (default 25); lets the agent
    /// notice a restarted gateway.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub persistent_keepalive_seconds: Option<u16>,
    /// The agent counts as gone when nothing authenticated came from it for this long
    /// (default 2 × keepalive + 5): tunnel connections are then reset, so clients such as
    /// OLM see the failure at once, and new ones are refused until the agent is back. Keep
    /// it above the agent's `persistent_keepalive_seconds`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peer_timeout_seconds: Option<u64>,
    /// Inner MTU (default 1420).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mtu: Option<u16>,
    /// SIGTERM drain budget in seconds (default 10).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drain_timeout_seconds: Option<u64>,
}

/// The guest agent's configuration (JSON in the `peer.json` key of
/// `hcp-olm/hcp-olm-guest-agent-peer`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AgentPeerConfig {
    /// `host:port` of the gateway's WireGuard UDP endpoint; None until known (the agent then
    /// reports a config error naming this field).
    pub gateway_endpoint: Option<String>,
    pub gateway_public_key: String,
    /// Where the controller put the private key (informational for the agent) ...
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent_private_key_secret_ref: Option<SecretKeyRef>,
    /// ... and the file it is mounted at; or the key inline. Exactly one of the two.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub private_key_file: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub private_key: Option<String>,
    /// How often this document and the key file are re-read for new keys, in seconds
    /// (default 5; 0: never). A new private key or gateway public key starts a handshake
    /// at once; other changes need a restart.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key_reload_seconds: Option<u64>,
    pub tunnel_address: String,
    pub gateway_tunnel_address: String,
    /// The IPv6 pair inside the tunnel (this end's with prefix, and the gateway's): both or
    /// neither. Needed for IPv6 `allowed_cidrs`; absent, IPv4 only inside.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tunnel_address6: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gateway_tunnel_address6: Option<String>,
    pub persistent_keepalive_seconds: u16,
    /// Guest Services the gateway may ask the agent to dial (their ports feed
    /// `allowed_ports` when that is empty).
    pub allowed_services: Vec<AllowedService>,
    /// Guest destinations the agent relays to: Service and pod CIDRs (IPv4 and IPv6) ...
    #[serde(default)]
    pub allowed_cidrs: Vec<String>,
    /// ... and ports (empty: the ports of `allowed_services`).
    #[serde(default)]
    pub allowed_ports: Vec<u16>,
    /// Guest DNS servers (`ip` or `ip:port`) tunnel DNS queries are forwarded to.
    #[serde(default)]
    pub guest_dns: Vec<String>,
    /// Control-plane services the agent re-exposes in the guest.
    pub exposed_services: Vec<ExposedService>,
    /// Address the exposed-service listeners bind (default `0.0.0.0`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exposed_listen_address: Option<String>,
    /// `/healthz` `/readyz` `/metrics` (default `0.0.0.0:9090`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub health_listen: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mtu: Option<u16>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drain_timeout_seconds: Option<u64>,
    /// Connections relayed at once, both directions together (default 128); more are closed
    /// at once and counted (`result="over_limit"`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_connections: Option<u32>,
    /// A relayed stream on which no byte moved in either direction for this long is closed,
    /// in seconds (default 3600).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idle_timeout_seconds: Option<u64>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn provisional_style_agent_document_still_parses() {
        let doc = r#"{
          "gateway_endpoint": "198.18.0.1:51820",
          "gateway_public_key": "k",
          "agent_private_key_secret_ref": {"name": "hcp-olm-guest-agent-peer", "key": "private-key"},
          "tunnel_address": "100.127.255.2/30",
          "gateway_tunnel_address": "100.127.255.1/30",
          "persistent_keepalive_seconds": 25,
          "allowed_services": [{"namespace": "*", "name": "*", "port": 50051}],
          "exposed_services": [{"name": "redhat-operators", "listen_port": 50051, "target": "redhat-operators:50051"}]
        }"#;
        let c: AgentPeerConfig = serde_json::from_str(doc).unwrap();
        assert_eq!(c.allowed_services[0].port, 50051);
        assert!(c.allowed_cidrs.is_empty());
        let back: AgentPeerConfig =
            serde_json::from_str(&serde_json::to_string(&c).unwrap()).unwrap();
        assert_eq!(back, c);
    }

    #[test]
    fn gateway_round_trip() {
        let c = GatewayConfig {
            listen_port: 51820,
            listen_address: None,
            private_key: Some("x".into()),
            private_key_file: None,
            agent_public_key: "y".into(),
            previous_private_key_files: vec![],
            previous_agent_public_keys: vec![],
            key_reload_seconds: None,
            tunnel_address: GATEWAY_TUNNEL_ADDRESS.into(),
            agent_tunnel_address: AGENT_TUNNEL_ADDRESS.into(),
            tunnel_address6: None,
            agent_tunnel_address6: None,
            guest_cidrs: vec!["10.96.0.0/12".into()],
            hcp_namespace: Some("clusters-a".into()),
            cluster_domain: None,
            socks_listen: Some("0.0.0.0:1080".into()),
            connect_listen: Some("0.0.0.0:3128".into()),
            peer_listen: None,
            peers: None,
            health_listen: "0.0.0.0:9090".into(),
            dns: GatewayDns {
                local_upstreams: vec!["172.30.0.10".into()],
                rules: vec![],
                listen: None,
                allowed_clients: vec![],
                rate_limit_qps: None,
            },
            allowed_services: vec![],
            allowed_local_services: vec![],
            max_connections: None,
            handshake_timeout_seconds: None,
            idle_timeout_seconds: None,
            exposed_services: vec![],
            persistent_keepalive_seconds: None,
            peer_timeout_seconds: None,
            mtu: None,
            drain_timeout_seconds: None,
        };
        let s = serde_json::to_string(&c).unwrap();
        assert!(!s.contains("private_key_file"));
        assert_eq!(serde_json::from_str::<GatewayConfig>(&s).unwrap(), c);
    }
}
