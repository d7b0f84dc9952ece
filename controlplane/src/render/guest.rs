//! Objects in the guest cluster (applied through the guest API server).

use base64::Engine;
use base64::engine::general_purpose::STANDARD as B64;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use super::labels::{self, metadata, selector};
use super::tunnel::{
    PRIVATE_KEY_KEY, agent_catalog_port, agent_peer_config, agent_peer_config_without_keys,
    exposed_services, network as tunnel_network,
};
use super::{
    ApplyPolicy, Desired, Object, Pending, RenderError, RenderInput, ResolvedCatalog, names, ports,
};
use crate::catalogs::DefaultCatalog;
use crate::certs::hex;
use crate::hostedolm::CatalogPlacement;
use crate::validate::Severity;

fn push(out: &mut Desired, body: Value, plural: &str, policy: ApplyPolicy) {
    out.guest.push(Object::new(body, plural, policy));
}

fn restricted_container() -> Value {
    json!({
        "allowPrivilegeEscalation": false,
        "readOnlyRootFilesystem": true,
        "runAsNonRoot": true,
        "capabilities": {"drop": ["ALL"]},
    })
}

pub(super) fn render(
    input: &RenderInput,
    catalogs: &[ResolvedCatalog],
    out: &mut Desired,
) -> Result<(), RenderError> {
    agent(input, catalogs, out)?;
    // TakeOver: HyperShift's hosted-cluster-config-operator writes OperatorHub, the default
    // CatalogSources, packageserver's Service, Endpoints and APIService; what it writes is
    // right for ours (same Service, certificate and CA), so only it writes them.
    let hcco_writes = input.valid.hypershift_take_over;
    if !hcco_writes {
        operator_hub(input, out)?;
    }
    catalog_sources(input, catalogs, out);
    packageserver_api(input, hcco_writes, out);
    Ok(())
}

/// The guest agent: namespace, account, peer config, Deployment, and (management
/// placement) a Service per enabled catalog.
fn agent(
    input: &RenderInput,
    catalogs: &[ResolvedCatalog],
    out: &mut Desired,
) -> Result<(), RenderError> {
    let v = &input.valid;
    let management = v.placement == CatalogPlacement::Management;
    let ns = names::GUEST_NAMESPACE;
    let enabled: Vec<DefaultCatalog> = catalogs.iter().map(|c| c.catalog).collect();

    // Guest agent: namespace, account, peer config, Deployment, Services.
    let mut ns_meta = metadata(v, ns, None, "guest-agent", None);
    ns_meta["labels"]["pod-security.kubernetes.io/enforce"] = json!("restricted");
    push(
        out,
        json!({"apiVersion": "v1", "kind": "Namespace", "metadata": ns_meta}),
        "namespaces",
        ApplyPolicy::Apply,
    );
    push(
        out,
        json!({
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": metadata(v, names::GUEST_AGENT, Some(ns), "guest-agent", None),
            "automountServiceAccountToken": false,
        }),
        "serviceaccounts",
        ApplyPolicy::Apply,
    );
    let (secret, peer_hash) = agent_peer_secret(input, catalogs)?;
    push(out, secret, "secrets", ApplyPolicy::Apply);
    push(
        out,
        agent_deployment(input, &enabled, &peer_hash),
        "deployments",
        ApplyPolicy::Apply,
    );
    if management {
        for c in &enabled {
            let name = names::catalog(*c);
            push(
                out,
                json!({
                    "apiVersion": "v1",
                    "kind": "Service",
                    "metadata": metadata(v, &name, Some(ns), "guest-agent", None),
                    "spec": {
                        "type": "ClusterIP",
                        "selector": selector(names::GUEST_AGENT),
                        "ports": [{"name": "grpc", "protocol": "TCP", "port": ports::CATALOG_GRPC, "targetPort": agent_catalog_port(*c)}],
                    }
                }),
                "services",
                ApplyPolicy::Apply,
            );
        }
    }
    Ok(())
}

/// The agent's peer config Secret (with its WireGuard key) and the hash of the config
/// without keys (the Deployment's config hash).
fn agent_peer_secret(
    input: &RenderInput,
    catalogs: &[ResolvedCatalog],
) -> Result<(Value, String), RenderError> {
    let v = &input.valid;
    let management = v.placement == CatalogPlacement::Management;
    let ns = names::GUEST_NAMESPACE;
    let exposed = if management {
        exposed_services(catalogs)
    } else {
        Vec::new()
    };
    let peer = agent_peer_config(&input.tunnel, &tunnel_network(input), exposed);
    let peer_json =
        serde_json::to_string_pretty(&peer).map_err(|source| RenderError::Serialize {
            what: "agent peer config",
            source,
        })?;
    // Keys are left out: the agent re-reads them from the mounted Secret, so a key
    // rotation must not restart it (that would cut the catalog streams it carries).
    let mut h = Sha256::new();
    h.update(
        serde_json::to_string(&agent_peer_config_without_keys(&peer))
            .map_err(|source| RenderError::Serialize {
                what: "agent peer config",
                source,
            })?
            .as_bytes(),
    );
    let peer_hash = hex(&h.finalize()[..16]);
    let secret = json!({
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": metadata(v, names::GUEST_AGENT_PEER, Some(ns), "guest-agent", None),
        "type": "Opaque",
        "data": {
            "peer.json": B64.encode(&peer_json),
            PRIVATE_KEY_KEY: B64.encode(&input.tunnel.agent_private_key),
        },
    });
    Ok((secret, peer_hash))
}

/// The agent's Deployment: one replica, a port per enabled catalog (management
/// placement) and its health port.
fn agent_deployment(input: &RenderInput, enabled: &[DefaultCatalog], peer_hash: &str) -> Value {
    let v = &input.valid;
    let management = v.placement == CatalogPlacement::Management;
    let ns = names::GUEST_NAMESPACE;
    let agent_ports: Vec<Value> = enabled
        .iter()
        .filter(|_| management)
        .map(|c| json!({"name": format!("cat-{}", agent_catalog_port(*c)), "containerPort": agent_catalog_port(*c), "protocol": "TCP"}))
        .chain(std::iter::once(json!({"name": "health", "containerPort": ports::TUNNEL_HEALTH, "protocol": "TCP"})))
        .collect();
    let mut pod_labels = labels::object_labels(v, "guest-agent", names::GUEST_AGENT);
    pod_labels.extend(
        selector(names::GUEST_AGENT)
            .as_object()
            .into_iter()
            .flatten()
            .map(|(k, val)| (k.clone(), val.as_str().unwrap_or_default().to_string())),
    );
    json!({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": metadata(v, names::GUEST_AGENT, Some(ns), "guest-agent", None),
        "spec": {
            "replicas": 1,
            "revisionHistoryLimit": 2,
            "selector": {"matchLabels": selector(names::GUEST_AGENT)},
            "template": {
                "metadata": {
                    "labels": pod_labels,
                    "annotations": {labels::CONFIG_HASH_ANNOTATION: peer_hash},
                },
                "spec": {
                    "serviceAccountName": names::GUEST_AGENT,
                    "automountServiceAccountToken": false,
                    "securityContext": {"runAsNonRoot": true, "seccompProfile": {"type": "RuntimeDefault"}},
                    "containers": [{
                        "name": "agent",
                        "image": v.images.guest_agent,
                        "imagePullPolicy": "IfNotPresent",
                        "terminationMessagePolicy": "FallbackToLogsOnError",
                        "args": ["--config", "/etc/hcp-olm/peer/peer.json"],
                        "ports": agent_ports,
                        "livenessProbe": {"httpGet": {"path": "/healthz", "port": ports::TUNNEL_HEALTH}, "initialDelaySeconds": 10, "periodSeconds": 10},
                        "readinessProbe": {"httpGet": {"path": "/readyz", "port": ports::TUNNEL_HEALTH}, "periodSeconds": 10},
                        "resources": {"requests": {"cpu": "10m", "memory": "30Mi"}, "limits": {"memory": super::tunnel::TUNNEL_MEMORY_LIMIT}},
                        "securityContext": restricted_container(),
                        "volumeMounts": [{"name": "peer", "mountPath": "/etc/hcp-olm/peer", "readOnly": true}],
                    }],
                    // 0444: the agent runs as its image's user with no fsGroup (a fixed
                    // one is refused where an SCC assigns it; a plain Kubernetes guest
                    // assigns none), and the files are root's. Only the agent's own
                    // container mounts them (Kubernetes' default mode is 0644).
                    "volumes": [{"name": "peer", "secret": {"secretName": names::GUEST_AGENT_PEER, "defaultMode": 0o444}}],
                }
            }
        }
    })
}

/// OperatorHub/cluster: continuously owned in management placement, created once (then
/// owned by the guest) in guest placement, as HyperShift does.
fn operator_hub(input: &RenderInput, out: &mut Desired) -> Result<(), RenderError> {
    let v = &input.valid;
    let management = v.placement == CatalogPlacement::Management;
    let hub_policy = if management {
        ApplyPolicy::Apply
    } else {
        ApplyPolicy::CreateOnly
    };
    let mut hub_spec =
        serde_json::to_value(&v.operator_hub).map_err(|source| RenderError::Serialize {
            what: "OperatorHub spec",
            source,
        })?;
    // Never an empty spec: once a field we applied is dropped, server-side apply would leave
    // `spec: null`, which the OperatorHub schema refuses. Unset means "not disabled".
    if let Some(o) = hub_spec.as_object_mut() {
        o.entry("disableAllDefaultSources").or_insert(json!(false));
    }
    push(
        out,
        json!({
            "apiVersion": "config.openshift.io/v1",
            "kind": "OperatorHub",
            "metadata": metadata(v, "cluster", None, "operatorhub", None),
            "spec": hub_spec,
        }),
        "operatorhubs",
        hub_policy,
    );
    Ok(())
}

/// The default CatalogSources: the catalog's address in management placement, its image
/// (polled by OLM) in guest placement.
fn catalog_sources(input: &RenderInput, catalogs: &[ResolvedCatalog], out: &mut Desired) {
    let v = &input.valid;
    let management = v.placement == CatalogPlacement::Management;
    for c in catalogs {
        let mut meta = metadata(
            v,
            c.catalog.name(),
            Some(names::MARKETPLACE_NAMESPACE),
            "catalogsource",
            None,
        );
        meta["annotations"]["target.workload.openshift.io/management"] =
            json!(r#"{"effect": "PreferredDuringScheduling"}"#);
        let mut spec = json!({
            "sourceType": "grpc",
            "displayName": c.catalog.display_name(),
            "publisher": "Red Hat",
            "priority": c.catalog.priority(),
        });
        if management {
            spec["address"] = json!(c.address());
        } else {
            // A tag, so OLM's registry poll picks up new catalog content.
            spec["image"] = json!(c.image.tag_ref);
            spec["updateStrategy"] = json!({"registryPoll": {"interval": "10m"}});
            spec["grpcPodConfig"] = json!({"securityContextConfig": "restricted"});
        }
        push(
            out,
            json!({
                "apiVersion": "operators.coreos.com/v1alpha1",
                "kind": "CatalogSource",
                "metadata": meta,
                "spec": spec,
            }),
            "catalogsources",
            ApplyPolicy::Apply,
        );
    }
}

/// packageserver's aggregated API: Service + Endpoints to the HCP ClusterIP, then the
/// APIService with our CA bundle (under TakeOver HyperShift writes them); a pending note
/// while the ClusterIP is not known.
fn packageserver_api(input: &RenderInput, hcco_writes: bool, out: &mut Desired) {
    let v = &input.valid;
    if !hcco_writes {
        push(
            out,
            json!({
                "apiVersion": "v1",
                "kind": "Service",
                "metadata": metadata(v, names::GUEST_PACKAGESERVER, Some("default"), "packageserver", None),
                "spec": {
                    "type": "ClusterIP",
                    "ports": [{"name": "https", "protocol": "TCP", "port": 443, "targetPort": 443}],
                }
            }),
            "services",
            ApplyPolicy::Apply,
        );
    }
    match input.packageserver_cluster_ip.as_deref() {
        Some(ip) => {
            if !hcco_writes {
            push(
                out,
                json!({
                    "apiVersion": "v1",
                    "kind": "Endpoints",
                    "metadata": metadata(v, names::GUEST_PACKAGESERVER, Some("default"), "packageserver", None),
                    "subsets": [{
                        "addresses": [{"ip": ip}],
                        "ports": [{"name": "https", "port": 443, "protocol": "TCP"}],
                    }],
                }),
                "endpoints",
                ApplyPolicy::Apply,
            );
            }
            // No EndpointSlice of ours: the guest's kube-controller-manager (HyperShift
            // runs one in the HCP namespace) mirrors these Endpoints into one, as a real guest
            // node showed; kube-proxy and the aggregator read that.
            if input.guest_olm_crds_ready && !hcco_writes {
                push(
                    out,
                    json!({
                        "apiVersion": "apiregistration.k8s.io/v1",
                        "kind": "APIService",
                        "metadata": metadata(v, names::APISERVICE, None, "packageserver", None),
                        "spec": {
                            "group": "packages.operators.coreos.com",
                            "version": "v1",
                            "groupPriorityMinimum": 2000,
                            "versionPriority": 15,
                            "service": {"namespace": "default", "name": names::GUEST_PACKAGESERVER, "port": 443},
                            "caBundle": B64.encode(input.pki.ca_bundle()),
                        }
                    }),
                    "apiservices",
                    ApplyPolicy::Apply,
                );
            }
        }
        None => out.pending.push(Pending {
            component: "packageserver".into(),
            reason: "WaitingForPackageServerService",
            severity: Severity::Progressing,
            message: format!(
                "the ClusterIP of Service {}/{} is not known yet; guest Endpoints and APIService are not created",
                v.cluster.hcp_namespace,
                if hcco_writes { names::HYPERSHIFT_PACKAGESERVER } else { names::PACKAGESERVER }
            ),
        }),
    }
}
