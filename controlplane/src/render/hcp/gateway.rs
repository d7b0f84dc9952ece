//! The tunnel gateway in the HCP namespace: its config Secret (with the WireGuard keys),
//! its NetworkPolicy, its Services (SOCKS for OLM, the replicas' peer Service, the
//! WireGuard Service the agent dials) and its Deployment (with a PodDisruptionBudget when
//! highly available). The renderer in `hcp.rs` calls each in the order objects are
//! listed (Secrets, NetworkPolicies, Services, Deployments).

use std::collections::BTreeMap;

use base64::Engine;
use base64::engine::general_purpose::STANDARD as B64;
use serde_json::{Value, json};

use super::super::labels::{metadata, selector};
use super::super::tunnel::{
    EXTRA_PRIVATE_KEY_KEY, PRIVATE_KEY_KEY, allowed_local_services, exposed_services,
    gateway_config, gateway_config_without_keys, network as tunnel_network,
};
use super::super::{Desired, Pending, RenderError, RenderInput, ResolvedCatalog, names, ports};
use super::{
    CONTROL_PLANE_PRIORITY, PodSpec, config_hash, container_security, deployment, http_probe,
    owner, push, service, sha, spread_replicas,
};
use crate::hostedolm::{CatalogPlacement, TunnelServiceType};
use crate::validate::{AvailabilityPolicy, Severity};

/// Pushes the gateway's config Secret; returns the hash of its config without the keys
/// (the Deployment's config hash).
pub(super) fn secret(
    input: &RenderInput,
    catalogs: &[ResolvedCatalog],
    out: &mut Desired,
) -> Result<String, RenderError> {
    let v = &input.valid;
    let hcp_ns = super::ns(input).to_string();
    let management = v.placement == CatalogPlacement::Management;
    let exposed = if management {
        exposed_services(catalogs)
    } else {
        Vec::new()
    };
    let local = if management {
        allowed_local_services(&v.cluster.hcp_namespace, catalogs)
    } else {
        Vec::new()
    };
    let gw = gateway_config(&input.tunnel, &tunnel_network(input), exposed, local);
    let gw_json = serde_json::to_string_pretty(&gw).map_err(|source| RenderError::Serialize {
        what: "gateway config",
        source,
    })?;
    // Keys are left out: the gateway re-reads them from the mounted Secret, so a key
    // rotation must not restart it (that would cut the catalog streams it carries).
    let gw_hash = sha(serde_json::to_string(&gateway_config_without_keys(&gw))
        .map_err(|source| RenderError::Serialize {
            what: "gateway config",
            source,
        })?
        .as_bytes());
    let mut gw_data = serde_json::Map::new();
    gw_data.insert("config.json".into(), json!(B64.encode(&gw_json)));
    gw_data.insert(
        PRIVATE_KEY_KEY.into(),
        json!(B64.encode(&input.tunnel.gateway_private_key)),
    );
    if let Some(k) = &input.tunnel.gateway_extra_private_key {
        gw_data.insert(EXTRA_PRIVATE_KEY_KEY.into(), json!(B64.encode(k)));
    }
    push(
        out,
        json!({
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": metadata(v, names::TUNNEL_GATEWAY, Some(&hcp_ns), "tunnel-gateway", owner(input)),
            "type": "Opaque",
            "data": gw_data,
        }),
        "secrets",
    );
    Ok(gw_hash)
}

/// Pushes the gateway's NetworkPolicy. WireGuard comes from guest nodes (anywhere);
/// SOCKS only from `olm_clients`.
pub(super) fn network_policy(
    input: &RenderInput,
    catalogs: &[ResolvedCatalog],
    olm_clients: Value,
    out: &mut Desired,
) {
    let v = &input.valid;
    let hcp_ns = super::ns(input).to_string();
    let management = v.placement == CatalogPlacement::Management;
    // WireGuard comes from guest nodes (anywhere); SOCKS only from OLM pods.
    // Egress: DNS (53, and 5353 where the cluster DNS pods listen behind port 53),
    // WireGuard to the agent (UDP; its NATed address and port are not known in advance) and,
    // in management placement, this HCP's catalog pods. Nothing else in the management
    // network, whatever a proxy client asks for.
    let gateway_pods = json!([{"podSelector": {"matchLabels": selector(names::TUNNEL_GATEWAY)}}]);
    let mut egress = vec![
        // the other replicas (forwarding to the one holding the agent's session)
        json!({"to": gateway_pods, "ports": [{"protocol": "TCP", "port": ports::GATEWAY_PEER}]}),
        json!({"ports": [
            {"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53},
            {"protocol": "UDP", "port": 5353}, {"protocol": "TCP", "port": 5353},
        ]}),
        json!({"ports": [{"protocol": "UDP"}]}),
    ];
    if management && !catalogs.is_empty() {
        let to: Vec<Value> = catalogs
            .iter()
            .map(|c| match &c.shared {
                Some(k) => json!({
                    "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": crate::sharing::SHARED_NAMESPACE}},
                    "podSelector": {"matchLabels": selector(&k.name())},
                }),
                None => json!({"podSelector": {"matchLabels": selector(&names::catalog(c.catalog))}}),
            })
            .collect();
        egress.push(json!({"to": to, "ports": [{"protocol": "TCP", "port": ports::CATALOG_GRPC}]}));
    }
    let mut ingress = vec![
        json!({"ports": [{"protocol": "UDP", "port": ports::WIREGUARD}]}),
        json!({"from": olm_clients, "ports": [{"protocol": "TCP", "port": ports::SOCKS}]}),
        json!({"from": gateway_pods, "ports": [{"protocol": "TCP", "port": ports::GATEWAY_PEER}]}),
    ];
    // The metrics port, from the cluster's monitoring (OpenShift labels its monitoring
    // namespaces with this policy group, as HyperShift's own policies select them).
    if !v.monitoring_disabled {
        ingress.push(json!({
            "from": [{"namespaceSelector": {"matchLabels": {MONITORING_POLICY_GROUP.0: MONITORING_POLICY_GROUP.1}}}],
            "ports": [{"protocol": "TCP", "port": ports::TUNNEL_HEALTH}],
        }));
    }
    push(
        out,
        json!({
            "apiVersion": "networking.k8s.io/v1",
            "kind": "NetworkPolicy",
            "metadata": metadata(v, names::TUNNEL_GATEWAY, Some(&hcp_ns), "tunnel-gateway", owner(input)),
            "spec": {
                "podSelector": {"matchLabels": selector(names::TUNNEL_GATEWAY)},
                "policyTypes": ["Ingress", "Egress"],
                "ingress": ingress,
                "egress": egress,
            }
        }),
        "networkpolicies",
    );
}

/// The namespace label of OpenShift's monitoring namespaces (openshift-monitoring,
/// openshift-user-workload-monitoring).
pub const MONITORING_POLICY_GROUP: (&str, &str) =
    ("network.openshift.io/policy-group", "monitoring");

/// The gateways' metrics Service and, where the management cluster serves them, a
/// ServiceMonitor scraping every replica's `/metrics` (plain HTTP on the health port, which
/// the gateway's NetworkPolicy opens to the monitoring namespaces only): the
/// `HcpOlmTunnelHandshakeStale` alert reads them. Left out with HyperShift's
/// disable-monitoring-services annotation, as the OLM operators' are.
fn metrics(input: &RenderInput, out: &mut Desired) {
    let v = &input.valid;
    if v.monitoring_disabled {
        return;
    }
    push(
        out,
        service(
            input,
            names::TUNNEL_GATEWAY_METRICS,
            "tunnel-gateway",
            names::TUNNEL_GATEWAY,
            json!([{"name": "http-metrics", "protocol": "TCP", "port": ports::TUNNEL_HEALTH, "targetPort": "health"}]),
            "ClusterIP",
        ),
        "services",
    );
    if !input.service_monitors_served {
        return;
    }
    let mut endpoint = json!({"port": "http-metrics", "path": "/metrics", "scheme": "http"});
    if let Some(id) = &v.cluster_id {
        endpoint["relabelings"] =
            json!([{"action": "replace", "targetLabel": "_id", "replacement": id}]);
    }
    push(
        out,
        json!({
            "apiVersion": "monitoring.coreos.com/v1",
            "kind": "ServiceMonitor",
            "metadata": metadata(v, names::TUNNEL_GATEWAY, Some(super::ns(input)), "tunnel-gateway", owner(input)),
            "spec": {
                "selector": {"matchLabels": selector(names::TUNNEL_GATEWAY_METRICS)},
                "endpoints": [endpoint],
            },
        }),
        "servicemonitors",
    );
}

/// Pushes the gateway's Services, and a pending note while the WireGuard Service has no
/// reachable address.
pub(super) fn services(input: &RenderInput, out: &mut Desired) {
    let v = &input.valid;
    push(
        out,
        service(
            input,
            names::TUNNEL_GATEWAY,
            "tunnel-gateway",
            names::TUNNEL_GATEWAY,
            json!([{"name": "socks", "protocol": "TCP", "port": ports::SOCKS, "targetPort": ports::SOCKS}]),
            "ClusterIP",
        ),
        "services",
    );
    // Headless: each replica's address, ready or not (every replica is ready once bound).
    let mut peers = service(
        input,
        names::TUNNEL_GATEWAY_PEERS,
        "tunnel-gateway",
        names::TUNNEL_GATEWAY,
        json!([{"name": "peer", "protocol": "TCP", "port": ports::GATEWAY_PEER, "targetPort": ports::GATEWAY_PEER}]),
        "ClusterIP",
    );
    peers["spec"]["clusterIP"] = json!("None");
    peers["spec"]["publishNotReadyAddresses"] = json!(true);
    push(out, peers, "services");
    let wg_type = match v.tunnel_service_type {
        TunnelServiceType::NodePort => "NodePort",
        TunnelServiceType::LoadBalancer => "LoadBalancer",
    };
    let mut wg = service(
        input,
        names::TUNNEL_GATEWAY_WG,
        "tunnel-gateway",
        names::TUNNEL_GATEWAY,
        json!([{"name": "wireguard", "protocol": "UDP", "port": ports::WIREGUARD, "targetPort": ports::WIREGUARD}]),
        wg_type,
    );
    // A guest with IPv6: both families where the management cluster has both, so its
    // IPv6 nodes reach the node port or load balancer (one family on a single-stack
    // management cluster). IPv4 guests keep the cluster's default (SingleStack).
    if crate::validate::guest_has_ipv6(v) {
        wg["spec"]["ipFamilyPolicy"] = json!("PreferDualStack");
    }
    push(out, wg, "services");
    metrics(input, out);
    if input.tunnel.gateway_endpoint.is_none() {
        out.pending.push(match &input.tunnel.gateway_endpoint_wait {
            Some(w) => Pending {
                component: "tunnel-gateway".into(),
                reason: w.reason,
                severity: if w.blocking {
                    Severity::Degraded
                } else {
                    Severity::Progressing
                },
                message: w.message.clone(),
            },
            None => Pending {
                component: "tunnel-gateway".into(),
                reason: "WaitingForTunnelEndpoint",
                severity: Severity::Progressing,
                message: format!(
                    "the {wg_type} Service {} has no reachable address yet",
                    names::TUNNEL_GATEWAY_WG
                ),
            },
        });
    }
}

/// The gateway's ServiceAccount (with the pull secret, as the OLM operators').
pub(super) fn service_account(input: &RenderInput, out: &mut Desired) {
    super::push(
        out,
        super::service_account(
            input,
            names::TUNNEL_GATEWAY,
            "tunnel-gateway",
            Some(&input.valid.pull_secret),
        ),
        "serviceaccounts",
    );
}

/// Pushes the gateway's Deployment (and its PodDisruptionBudget when highly available).
/// `config_hash` is [`secret`]'s. Highly available means two replicas on different nodes
/// (zones where required) sharing the keys: the agent's WireGuard flow reaches one of them
/// (the Service pins it); the other forwards guest targets to it, and takes the session
/// over when it goes (the agent re-handshakes through the same Service address).
pub(super) fn deployment_and_pdb(input: &RenderInput, gw_hash: String, out: &mut Desired) {
    let v = &input.valid;
    let hcp_ns = super::ns(input).to_string();
    let (gw_replicas, gw_strategy) = match v.availability {
        AvailabilityPolicy::SingleReplica => (1, None),
        AvailabilityPolicy::HighlyAvailable => (
            2,
            Some(
                json!({"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1}}),
            ),
        ),
    };
    let mut gateway = deployment(
        input,
        PodSpec {
            name: names::TUNNEL_GATEWAY,
            component: "tunnel-gateway",
            replicas: gw_replicas,
            service_account: names::TUNNEL_GATEWAY,
            automount_token: false,
            priority_class: CONTROL_PLANE_PRIORITY,
            init_containers: vec![],
            containers: vec![json!({
                "name": "gateway",
                "image": v.images.tunnel_gateway,
                "imagePullPolicy": "IfNotPresent",
                "args": ["--config", "/etc/hcp-olm/tunnel/config.json"],
                // skipped among the replicas' addresses when forwarding
                "env": [{"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}],
                "ports": [
                    {"name": "wireguard", "containerPort": ports::WIREGUARD, "protocol": "UDP"},
                    {"name": "socks", "containerPort": ports::SOCKS, "protocol": "TCP"},
                    {"name": "peer", "containerPort": ports::GATEWAY_PEER, "protocol": "TCP"},
                    {"name": "health", "containerPort": ports::TUNNEL_HEALTH, "protocol": "TCP"},
                ],
                "livenessProbe": http_probe("/healthz", ports::TUNNEL_HEALTH, "HTTP", 10, 3),
                "readinessProbe": http_probe("/readyz", ports::TUNNEL_HEALTH, "HTTP", 0, 3),
                // Limit: max_connections (128) stalled relays at up to ~1 MiB each plus the
                // process (security_gateway_stream_flood_keeps_memory_bounded).
                "resources": {"requests": {"cpu": "10m", "memory": "30Mi"}, "limits": {"memory": super::super::tunnel::TUNNEL_MEMORY_LIMIT}},
                "securityContext": container_security(),
                "volumeMounts": [{"name": "config", "mountPath": "/etc/hcp-olm/tunnel", "readOnly": true}],
            })],
            volumes: vec![
                json!({"name": "config", "secret": {"secretName": names::TUNNEL_GATEWAY, "defaultMode": 0o440}}),
            ],
            config_hash: config_hash(&BTreeMap::from([(
                names::TUNNEL_GATEWAY.to_string(),
                gw_hash,
            )])),
            image_pull_secrets: vec![],
            strategy: gw_strategy,
            termination_grace_seconds: None,
        },
    );
    if v.availability == AvailabilityPolicy::HighlyAvailable {
        spread_replicas(&mut gateway, names::TUNNEL_GATEWAY, v.zone_spread_required);
        push(out, gateway, "deployments");
        push(
            out,
            json!({
                "apiVersion": "policy/v1",
                "kind": "PodDisruptionBudget",
                "metadata": metadata(v, names::TUNNEL_GATEWAY, Some(&hcp_ns), "tunnel-gateway", owner(input)),
                "spec": {
                    "maxUnavailable": 1,
                    "selector": {"matchLabels": selector(names::TUNNEL_GATEWAY)},
                    "unhealthyPodEvictionPolicy": "AlwaysAllow",
                },
            }),
            "poddisruptionbudgets",
        );
    } else {
        push(out, gateway, "deployments");
    }
}
