//! The cluster DNS of a test cluster with real nodes ([`crate::realnode`]): the pinned CoreDNS
//! (`e2e/tools/coredns`) as kubeadm deploys it: a Deployment in `kube-system` behind the
//! Service `kube-dns` at the tenth address of the Service CIDR, answering `cluster.local` from
//! the API server as its own ServiceAccount, with its least-privilege ClusterRole. Pods find
//! it through the kubelet's `clusterDNS` ([`crate::realnode::NodeOptions::cluster_dns`]).
//!
//! Two differences from kubeadm, both for the test environment: the ServiceAccount's token
//! comes in a kubeconfig Secret (a projected token would make CoreDNS reach the API server
//! through the `kubernetes` Service address, which the test API server's certificate does not
//! carry), and CoreDNS listens on 1053 as its non-root user (the Service
//! maps 53 to it), so it needs no capability. It forwards nothing: nodes resolve no names
//! outside the cluster, so test traffic stays inside the test.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Secret, Service};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;

use crate::cluster::Cluster;
use crate::realnode::{NodeError, push_test_image};

const NS: &str = "kube-system";
const NAME: &str = "coredns";
/// The field manager of the test environment's own objects.
const MANAGER: &str = "hcp-olm-e2e";

/// The cluster DNS address of a Service CIDR `a.b.c.d/n` (or an IPv6 one, issue 19): its
/// tenth address, as kubeadm picks it.
pub fn dns_ip(service_cidr: &str) -> Result<IpAddr, NodeError> {
    let bad = || NodeError::Setup {
        node: "-".into(),
        problem: format!(
            "service CIDR {service_cidr:?} is not an IPv4 or IPv6 CIDR of at least 16 addresses"
        ),
    };
    let (net, len) = service_cidr.split_once('/').ok_or_else(bad)?;
    let len: u32 = len.parse().map_err(|_| bad())?;
    if let Ok(net) = net.parse::<Ipv4Addr>() {
        if len > 28 {
            return Err(bad());
        }
        let mask = u32::MAX.checked_shl(32 - len).unwrap_or(0);
        return Ok(IpAddr::V4(Ipv4Addr::from((u32::from(net) & mask) + 10)));
    }
    let net: Ipv6Addr = net.parse().map_err(|_| bad())?;
    if len > 124 {
        return Err(bad());
    }
    let mask = u128::MAX.checked_shl(128 - len).unwrap_or(0);
    Ok(IpAddr::V6(Ipv6Addr::from((u128::from(net) & mask) + 10)))
}

/// Pushes the CoreDNS image (the pinned binary, user 65532) to `registry`; returns its
/// reference.
pub async fn push_coredns_image(
    client: &hcp_olm_oci::Client,
    registry: &str,
) -> Result<String, NodeError> {
    push_test_image(
        client,
        registry,
        "the CoreDNS image",
        crate::testimages::coredns(),
    )
    .await
}

/// The Corefile: `cluster.local` and reverse zones from the API server, health on 8080,
/// readiness on 8181, nothing forwarded.
pub fn corefile() -> &'static str {
    r#".:1053 {
    errors
    health :8080
    ready :8181
    kubernetes cluster.local in-addr.arpa ip6.arpa {
        kubeconfig /etc/coredns/kubeconfig/kubeconfig
        pods insecure
        fallthrough in-addr.arpa ip6.arpa
        ttl 30
    }
    cache 30
    loadbalance
}
"#
}

/// Deploys CoreDNS into `cluster` (image `image`, pulled with `docker_config`, a
/// `.dockerconfigjson`) behind `kube-dns` at [`dns_ip`] of `service_cidr`; returns that
/// address. The pods run on the cluster's real nodes; [`wait_ready`] waits for them.
pub async fn deploy(
    cluster: &Cluster,
    image: &str,
    docker_config: &[u8],
    service_cidr: &str,
) -> Result<IpAddr, NodeError> {
    use base64::Engine as _;
    let ip = dns_ip(service_cidr)?;
    let sa = cluster
        .service_account(NS, NAME, Duration::from_secs(24 * 3600))
        .await?;
    let kubeconfig = std::fs::read(&sa.kubeconfig).map_err(|source| NodeError::Io {
        what: format!("reading {}", sa.kubeconfig.display()),
        source,
    })?;
    let b64 = |b: &[u8]| base64::engine::general_purpose::STANDARD.encode(b);
    let client = cluster.client();
    apply(&Api::<ClusterRole>::all(client.clone()), json!({
                "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
                "metadata": {"name": "system:coredns"},
                "rules": [
                    {"apiGroups": [""], "resources": ["endpoints", "services", "pods", "namespaces"], "verbs": ["list", "watch"]},
                    {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": ["list", "watch"]},
                ],
            })).await?;
    apply(&Api::<ClusterRoleBinding>::all(client.clone()), json!({
                "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
                "metadata": {"name": "system:coredns"},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "system:coredns"},
                "subjects": [{"kind": "ServiceAccount", "name": NAME, "namespace": NS}],
            })).await?;
    let secrets = Api::<Secret>::namespaced(client.clone(), NS);
    apply(
        &secrets,
        json!({
            "apiVersion": "v1", "kind": "Secret",
            "metadata": {"name": "coredns-kubeconfig", "namespace": NS},
            "data": {"kubeconfig": b64(&kubeconfig)},
        }),
    )
    .await?;
    apply(
        &secrets,
        json!({
            "apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/dockerconfigjson",
            "metadata": {"name": "coredns-pull", "namespace": NS},
            "data": {".dockerconfigjson": b64(docker_config)},
        }),
    )
    .await?;
    apply(
        &Api::<ConfigMap>::namespaced(client.clone(), NS),
        json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": NAME, "namespace": NS},
            "data": {"Corefile": corefile()},
        }),
    )
    .await?;
    let drop_all = json!({
        "allowPrivilegeEscalation": false, "readOnlyRootFilesystem": true,
        "capabilities": {"drop": ["ALL"]},
    });
    apply(&Api::<Deployment>::namespaced(client.clone(), NS), json!({
                "apiVersion": "apps/v1", "kind": "Deployment",
                "metadata": {"name": NAME, "namespace": NS, "labels": {"k8s-app": "kube-dns"}},
                "spec": {
                    "replicas": 1,
                    "selector": {"matchLabels": {"k8s-app": "kube-dns"}},
                    "template": {
                        "metadata": {"labels": {"k8s-app": "kube-dns"}},
                        "spec": {
                            "serviceAccountName": NAME,
                            "automountServiceAccountToken": false,
                            "dnsPolicy": "Default",
                            "imagePullSecrets": [{"name": "coredns-pull"}],
                            "securityContext": {
                                "runAsNonRoot": true, "runAsUser": 65532, "runAsGroup": 65532,
                                "fsGroup": 65532, "seccompProfile": {"type": "RuntimeDefault"},
                            },
                            "containers": [{
                                "name": NAME,
                                "image": image,
                                "args": ["-conf", "/etc/coredns/Corefile"],
                                "ports": [
                                    {"name": "dns", "containerPort": 1053, "protocol": "UDP"},
                                    {"name": "dns-tcp", "containerPort": 1053, "protocol": "TCP"},
                                ],
                                "readinessProbe": {"httpGet": {"path": "/ready", "port": 8181}, "periodSeconds": 2},
                                "livenessProbe": {"httpGet": {"path": "/health", "port": 8080}, "initialDelaySeconds": 30},
                                "resources": {"requests": {"cpu": "10m", "memory": "30Mi"}, "limits": {"memory": "170Mi"}},
                                "securityContext": drop_all,
                                "volumeMounts": [
                                    {"name": "config", "mountPath": "/etc/coredns", "readOnly": true},
                                    {"name": "kubeconfig", "mountPath": "/etc/coredns/kubeconfig", "readOnly": true},
                                ],
                            }],
                            "volumes": [
                                {"name": "config", "configMap": {"name": NAME, "items": [{"key": "Corefile", "path": "Corefile"}]}},
                                {"name": "kubeconfig", "secret": {"secretName": "coredns-kubeconfig", "defaultMode": 0o440}},
                            ],
                        },
                    },
                },
            })).await?;
    apply(
        &Api::<Service>::namespaced(client, NS),
        json!({
            "apiVersion": "v1", "kind": "Service",
            "metadata": {"name": "kube-dns", "namespace": NS, "labels": {"k8s-app": "kube-dns"}},
            "spec": {
                "clusterIP": ip.to_string(),
                "selector": {"k8s-app": "kube-dns"},
                "ports": [
                    {"name": "dns", "port": 53, "targetPort": 1053, "protocol": "UDP"},
                    {"name": "dns-tcp", "port": 53, "targetPort": 1053, "protocol": "TCP"},
                ],
            },
        }),
    )
    .await?;
    Ok(ip)
}

/// Server-side applies `obj` (which names itself) through `api` as the test environment.
async fn apply<K>(api: &Api<K>, obj: serde_json::Value) -> Result<(), NodeError>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let what = format!(
        "applying {} {}",
        obj["kind"].as_str().unwrap_or("object"),
        obj["metadata"]["name"].as_str().unwrap_or_default()
    );
    let name = obj["metadata"]["name"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    api.patch(
        &name,
        &PatchParams::apply(MANAGER).force(),
        &Patch::Apply(obj),
    )
    .await
    .map_err(|source| NodeError::Kube { what, source })?;
    Ok(())
}

/// Waits until CoreDNS's Deployment is ready (at most `timeout`).
pub async fn wait_ready(cluster: &Cluster, timeout: Duration) -> Result<Duration, NodeError> {
    let started = std::time::Instant::now();
    let api = Api::<Deployment>::namespaced(cluster.client(), NS);
    loop {
        let d = api.get_opt(NAME).await.map_err(|source| NodeError::Kube {
            what: "reading Deployment coredns".into(),
            source,
        })?;
        if d.and_then(|d| d.status?.ready_replicas).unwrap_or(0) >= 1 {
            return Ok(started.elapsed());
        }
        if started.elapsed() > timeout {
            return Err(NodeError::Setup {
                node: "-".into(),
                problem: format!("CoreDNS not ready within {}s", timeout.as_secs()),
            });
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Asks `server` (UDP) for the A records of `name` from inside network namespace `netns` (a
/// node's: where the Service address is served). Returns the addresses, empty for NXDOMAIN.
pub async fn query_a(
    netns: &str,
    server: SocketAddr,
    name: &str,
) -> Result<Vec<Ipv4Addr>, NodeError> {
    use hickory_proto::op::{Message, MessageType, OpCode, Query, ResponseCode};
    use hickory_proto::rr::{Name, RData, RecordType};
    let io = |what: &str| {
        let what = what.to_string();
        move |source| NodeError::Io { what, source }
    };
    let qname = Name::from_ascii(name).map_err(|e| NodeError::Setup {
        node: "-".into(),
        problem: format!("DNS name {name:?}: {e}"),
    })?;
    let mut m = Message::new(0x4242, MessageType::Query, OpCode::Query);
    m.metadata.recursion_desired = true;
    m.add_query(Query::query(qname, RecordType::A));
    let bytes = m.to_vec().map_err(|e| NodeError::Setup {
        node: "-".into(),
        problem: format!("encoding a DNS query: {e}"),
    })?;
    let answer = crate::netns::in_netns(netns, move || {
        let sock = std::net::UdpSocket::bind("0.0.0.0:0")?;
        sock.set_read_timeout(Some(Duration::from_secs(2)))?;
        sock.send_to(&bytes, server)?;
        let mut buf = vec![0u8; 4096];
        let (n, _) = sock.recv_from(&mut buf)?;
        buf.truncate(n);
        Ok(buf)
    })
    .await
    .map_err(io(&format!("asking {server} for {name}")))?;
    let reply = Message::from_vec(&answer).map_err(|e| NodeError::Setup {
        node: "-".into(),
        problem: format!("the DNS reply from {server}: {e}"),
    })?;
    match reply.metadata.response_code {
        ResponseCode::NoError | ResponseCode::NXDomain => {}
        other => {
            return Err(NodeError::Setup {
                node: "-".into(),
                problem: format!("{server} answered {name} with {other}"),
            });
        }
    }
    Ok(reply
        .answers
        .iter()
        .filter_map(|r| match &r.data {
            RData::A(a) => Some(a.0),
            _ => None,
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dns_address_is_the_tenth_of_the_service_cidr() {
        assert_eq!(
            dns_ip("198.19.255.0/24").unwrap(),
            IpAddr::V4(Ipv4Addr::new(198, 19, 255, 10))
        );
        assert_eq!(
            dns_ip("198.19.255.77/24").unwrap(),
            IpAddr::V4(Ipv4Addr::new(198, 19, 255, 10))
        );
        // the address the controller renders as an IPv6 guest's DNS (`[fd02::a]:53`)
        assert_eq!(
            dns_ip("fd02::/112").unwrap(),
            "fd02::a".parse::<IpAddr>().unwrap()
        );
        assert!(dns_ip("fd02::/125").is_err());
        assert!(dns_ip("198.19.255.0/29").is_err());
        assert!(dns_ip("198.19.255.0/x").is_err());
        assert!(dns_ip("garbage").is_err());
    }
}
