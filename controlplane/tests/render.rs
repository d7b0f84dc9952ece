//! Properties of rendered objects that must hold for every input.

mod common;

use std::collections::BTreeSet;

use hcp_olm_controlplane::catalogs::{CatalogImageError, DefaultCatalog};
use hcp_olm_controlplane::render::{
    self, ApplyPolicy, Desired, Object, RenderInput, labels, names,
};
use hcp_olm_controlplane::validate::Severity;
use serde_json::Value;

fn all_inputs() -> Vec<(String, RenderInput)> {
    let mut out = Vec::new();
    for f in [
        "aws-default-flags.yaml",
        "kubevirt-complex-flags.yaml",
        "none-minimal.yaml",
    ] {
        let hc = common::load_hc(f);
        out.push((
            format!("{f}/waiting"),
            common::input(common::valid(&hc, None), false),
        ));
        out.push((
            format!("{f}/live"),
            common::with_live_facts(common::input(common::valid(&hc, None), true)),
        ));
        let mut g = hc.clone();
        g.spec.olm_catalog_placement = Some("guest".into());
        out.push((
            format!("{f}/guest"),
            common::with_live_facts(common::input(common::valid(&g, None), true)),
        ));
    }
    out
}

fn find<'a>(objs: &'a [Object], kind: &str, name: &str) -> &'a Object {
    objs.iter()
        .find(|o| o.kind == kind && o.name == name)
        .unwrap_or_else(|| {
            panic!(
                "{kind} {name} not rendered; have {:?}",
                objs.iter().map(Object::id).collect::<Vec<_>>()
            )
        })
}

fn container<'a>(d: &'a Desired, deploy: &str, name: &str) -> &'a Value {
    find(&d.hcp, "Deployment", deploy).body["spec"]["template"]["spec"]["containers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == name)
        .unwrap()
}

fn args(c: &Value) -> Vec<String> {
    c["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap().to_string())
        .collect()
}

fn env(c: &Value, name: &str) -> Option<String> {
    c["env"]
        .as_array()?
        .iter()
        .find(|e| e["name"] == name)
        .map(|e| e["value"].as_str().unwrap_or("<from>").to_string())
}

/// Deserialize into the k8s-openapi type and back: a misspelled or misplaced field
/// is dropped by the typed round trip and shows up as a difference.
fn roundtrip<T: serde::de::DeserializeOwned + serde::Serialize>(o: &Object) {
    let typed: T =
        serde_json::from_value(o.body.clone()).unwrap_or_else(|e| panic!("{}: {e}", o.id()));
    let back = serde_json::to_value(&typed).unwrap();
    pretty_assertions::assert_eq!(
        o.body,
        back,
        "{} does not round-trip through its typed API",
        o.id()
    );
}

#[test]
fn typed_objects_round_trip() {
    use k8s_openapi::api::{
        apps::v1 as apps, core::v1 as core, networking::v1 as net, policy::v1 as policy,
    };
    use k8s_openapi::kube_aggregator::pkg::apis::apiregistration::v1 as agg;
    let mut kinds = BTreeSet::new();
    for (_, input) in all_inputs() {
        let d = render::desired(&input).unwrap();
        for o in d.hcp.iter().chain(&d.guest) {
            kinds.insert(o.kind.clone());
            match o.kind.as_str() {
                "Deployment" => roundtrip::<apps::Deployment>(o),
                "Service" => roundtrip::<core::Service>(o),
                "Secret" => roundtrip::<core::Secret>(o),
                "ServiceAccount" => roundtrip::<core::ServiceAccount>(o),
                "Namespace" => roundtrip::<core::Namespace>(o),
                "Endpoints" => roundtrip::<core::Endpoints>(o),
                "EndpointSlice" => roundtrip::<k8s_openapi::api::discovery::v1::EndpointSlice>(o),
                "NetworkPolicy" => roundtrip::<net::NetworkPolicy>(o),
                "PodDisruptionBudget" => roundtrip::<policy::PodDisruptionBudget>(o),
                "APIService" => roundtrip::<agg::APIService>(o),
                "CatalogSource" | "OperatorHub" | "ServiceMonitor" => {}
                other => panic!("unexpected kind {other}"),
            }
        }
    }
    assert!(kinds.contains("APIService") && kinds.contains("PodDisruptionBudget"));
}

#[test]
fn every_object_is_labelled_unique_and_namespaced_right() {
    for (what, input) in all_inputs() {
        let d = render::desired(&input).unwrap();
        let sel = labels::prune_selector(&input.valid);
        for (cluster, objs) in [("hcp", &d.hcp), ("guest", &d.guest)] {
            let mut ids = BTreeSet::new();
            for o in objs.iter() {
                assert!(ids.insert(o.id()), "{what}: duplicate {}", o.id());
                for (k, v) in &sel {
                    assert_eq!(
                        o.body["metadata"]["labels"][k],
                        Value::String(v.clone()),
                        "{what}: {} lacks {k}",
                        o.id()
                    );
                }
                if cluster == "hcp" {
                    assert_eq!(
                        o.namespace.as_deref(),
                        Some(input.valid.cluster.hcp_namespace.as_str()),
                        "{what}: {}",
                        o.id()
                    );
                    assert!(
                        o.name.starts_with("hcp-olm-"),
                        "{what}: {} must not collide with HyperShift names",
                        o.id()
                    );
                }
                assert!(
                    o.body["metadata"]["labels"]
                        .as_object()
                        .unwrap()
                        .values()
                        .all(|v| {
                            let s = v.as_str().unwrap();
                            s.len() <= 63 && !s.contains('/')
                        }),
                    "{what}: {} has an invalid label value",
                    o.id()
                );
            }
        }
    }
}

#[test]
fn olm_binaries_get_flags_they_accept() {
    for (what, input) in all_inputs() {
        let d = render::desired(&input).unwrap();
        let cat = container(&d, names::CATALOG_OPERATOR, "catalog-operator");
        let olm = container(&d, names::OLM_OPERATOR, "olm-operator");
        let ps = container(&d, names::PACKAGESERVER, "packageserver");
        let (ca, oa, pa) = (args(cat), args(olm), args(ps));
        assert!(ca.contains(&"--kubeconfig".to_string()), "{what}");
        assert!(
            !oa.iter().any(|a| a.starts_with("--kubeconfig")),
            "{what}: olm-operator has no --kubeconfig flag"
        );
        assert!(
            env(olm, "KUBECONFIG").is_some(),
            "{what}: olm-operator reads KUBECONFIG"
        );
        for flag in [
            "--secure-port",
            "--global-namespace",
            "--kubeconfig",
            "--authentication-kubeconfig",
            "--authorization-kubeconfig",
        ] {
            assert!(
                pa.contains(&flag.to_string()),
                "{what}: packageserver lacks {flag}"
            );
        }
        let port_at = pa.iter().position(|a| a == "--secure-port").unwrap();
        assert_eq!(pa[port_at + 1], "5443");
        for c in [cat, olm, ps] {
            for a in args(c) {
                assert!(
                    !(a.starts_with('-') && !a.starts_with("--") && a.len() > 2),
                    "{what}: single-dash long flag {a}"
                );
            }
            assert!(env(c, "CI").is_none(), "{what}: CI must be absent");
            assert!(
                env(c, "GRPC_PROXY")
                    .unwrap()
                    .starts_with("socks5://hcp-olm-tunnel-gateway:"),
                "{what}"
            );
            let no_proxy = env(c, "NO_PROXY").unwrap();
            assert!(no_proxy.split(',').any(|h| h == "kube-apiserver"), "{what}");
            let direct = no_proxy.split(',').any(|h| h == "hcp-olm-redhat-operators");
            let management = what.ends_with("/live") || what.ends_with("/waiting");
            assert_eq!(
                direct, management,
                "{what}: NO_PROXY decides which side a catalog is on"
            );
        }
    }
}

#[test]
fn waiting_for_crds_scales_olm_to_zero_and_withholds_apiservice() {
    let hc = common::load_hc("none-minimal.yaml");
    let mut input = common::with_live_facts(common::input(common::valid(&hc, None), false));
    let d = render::desired(&input).unwrap();
    for n in [
        names::CATALOG_OPERATOR,
        names::OLM_OPERATOR,
        names::PACKAGESERVER,
    ] {
        assert_eq!(find(&d.hcp, "Deployment", n).body["spec"]["replicas"], 0);
    }
    assert!(!d.guest.iter().any(|o| o.kind == "APIService"));
    assert!(
        d.pending
            .iter()
            .any(|p| p.reason == "WaitingForGuestOLMCRDs" && p.severity == Severity::Progressing)
    );
    input.guest_olm_crds_ready = true;
    let d = render::desired(&input).unwrap();
    assert_eq!(
        find(&d.hcp, "Deployment", names::PACKAGESERVER).body["spec"]["replicas"],
        1
    );
    let api = find(&d.guest, "APIService", names::APISERVICE);
    assert_eq!(api.body["spec"]["service"]["name"], "packageserver");
    assert!(!api.body["spec"]["caBundle"].as_str().unwrap().is_empty());
    let ep = find(&d.guest, "Endpoints", "packageserver");
    assert_eq!(ep.body["subsets"][0]["addresses"][0]["ip"], "172.30.12.34");
}

#[test]
fn availability_policy_sets_replicas_and_pdb() {
    let hc = common::load_hc("kubevirt-complex-flags.yaml");
    let d = render::desired(&common::input(common::valid(&hc, None), true)).unwrap();
    assert_eq!(
        find(&d.hcp, "Deployment", names::PACKAGESERVER).body["spec"]["replicas"],
        3
    );
    let pdb = &find(&d.hcp, "PodDisruptionBudget", names::PACKAGESERVER_PDB).body["spec"];
    assert_eq!(pdb["maxUnavailable"], 1);
    assert!(pdb.get("minAvailable").is_none());
    let hc = common::load_hc("none-minimal.yaml");
    let d = render::desired(&common::input(common::valid(&hc, None), true)).unwrap();
    assert_eq!(
        find(&d.hcp, "Deployment", names::PACKAGESERVER).body["spec"]["replicas"],
        1
    );
    // One replica: no PDB (one_pdb_per_pod_in_every_mode).
    assert!(
        !d.hcp
            .iter()
            .any(|o| o.kind == "PodDisruptionBudget" && o.name == names::PACKAGESERVER_PDB)
    );
}

#[test]
fn config_hash_follows_the_kubeconfig_secret() {
    let hc = common::load_hc("none-minimal.yaml");
    let mut input = common::input(common::valid(&hc, None), true);
    let hash = |d: &Desired, n: &str| {
        find(&d.hcp, "Deployment", n).body["spec"]["template"]["metadata"]["annotations"]
            [labels::CONFIG_HASH_ANNOTATION]
            .clone()
    };
    let before = render::desired(&input).unwrap();
    input.external_secret_hashes.insert(
        "service-network-admin-kubeconfig".into(),
        "kubeconfig-v2".into(),
    );
    let after = render::desired(&input).unwrap();
    for n in [
        names::CATALOG_OPERATOR,
        names::OLM_OPERATOR,
        names::PACKAGESERVER,
    ] {
        assert_ne!(
            hash(&before, n),
            hash(&after, n),
            "{n} must roll on a kubeconfig change"
        );
    }
    assert_eq!(
        hash(&before, names::TUNNEL_GATEWAY),
        hash(&after, names::TUNNEL_GATEWAY)
    );
    // A new serving cert rolls only packageserver.
    let mut input2 = input.clone();
    input2.pki.packageserver.cert_pem.push('\n');
    let rotated = render::desired(&input2).unwrap();
    assert_ne!(
        hash(&after, names::PACKAGESERVER),
        hash(&rotated, names::PACKAGESERVER)
    );
    assert_eq!(
        hash(&after, names::OLM_OPERATOR),
        hash(&rotated, names::OLM_OPERATOR)
    );
}

#[test]
fn catalog_sources_follow_placement() {
    let hc = common::load_hc("none-minimal.yaml");
    let d = render::desired(&common::input(common::valid(&hc, None), true)).unwrap();
    let cs = find(&d.guest, "CatalogSource", "redhat-operators");
    assert_eq!(cs.body["spec"]["address"], "hcp-olm-redhat-operators:50051");
    assert!(cs.body["spec"].get("image").is_none());
    assert_eq!(
        find(&d.hcp, "Service", "hcp-olm-redhat-operators").body["spec"]["ports"][0]["port"],
        50051
    );
    // The community catalog fell back to 4.17 and runs pinned by digest.
    let img = container(&d, "hcp-olm-community-operators", "registry")["image"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(
        img.ends_with(&format!("@sha256:{}", "3".repeat(64))),
        "{img}"
    );
    assert!(
        d.pending
            .iter()
            .any(|p| p.reason == "CatalogVersionFallback")
    );
    assert_eq!(
        find(&d.guest, "OperatorHub", "cluster").policy,
        ApplyPolicy::Apply
    );

    let mut g = hc.clone();
    g.spec.olm_catalog_placement = Some("guest".into());
    let d = render::desired(&common::input(common::valid(&g, None), true)).unwrap();
    let cs = find(&d.guest, "CatalogSource", "community-operators");
    assert_eq!(
        cs.body["spec"]["image"],
        "registry.redhat.io/redhat/community-operator-index:v4.17"
    );
    assert!(cs.body["spec"].get("address").is_none());
    assert!(
        !d.hcp.iter().any(|o| o.name == "hcp-olm-redhat-operators"),
        "no management catalogs in guest placement"
    );
    assert_eq!(
        find(&d.guest, "OperatorHub", "cluster").policy,
        ApplyPolicy::CreateOnly
    );
}

#[test]
fn a_missing_catalog_never_blocks_the_rest() {
    let hc = common::load_hc("none-minimal.yaml");
    let mut input = common::input(common::valid(&hc, None), true);
    input.catalog_images.insert(
        DefaultCatalog::CertifiedOperators,
        Err(CatalogImageError::NotFound {
            tried: vec!["x:v4.18".into()],
        }),
    );
    input
        .catalog_images
        .remove(&DefaultCatalog::RedhatOperators);
    let d = render::desired(&input).unwrap();
    assert!(!d.guest.iter().any(|o| o.name == "certified-operators"));
    assert!(!d.guest.iter().any(|o| o.name == "redhat-operators"));
    find(&d.guest, "CatalogSource", "community-operators");
    find(&d.hcp, "Deployment", names::PACKAGESERVER);
    let degraded: Vec<_> = d
        .pending
        .iter()
        .filter(|p| p.severity == Severity::Degraded)
        .collect();
    assert_eq!(degraded.len(), 1);
    assert_eq!(degraded[0].reason, "CatalogImageUnavailable");
    assert!(
        d.pending
            .iter()
            .any(|p| p.reason == "CatalogImageUnresolved")
    );
}

#[test]
fn tunnel_peer_config_is_typed_json() {
    use base64::Engine;
    let hc = common::load_hc("none-minimal.yaml");
    let d = render::desired(&common::with_live_facts(common::input(
        common::valid(&hc, None),
        true,
    )))
    .unwrap();
    let s = find(&d.guest, "Secret", names::GUEST_AGENT_PEER);
    let raw = base64::engine::general_purpose::STANDARD
        .decode(s.body["data"]["peer.json"].as_str().unwrap())
        .unwrap();
    let peer: render::AgentPeerConfig = serde_json::from_slice(&raw).unwrap();
    assert_eq!(peer.gateway_endpoint.as_deref(), Some("203.0.113.10:31820"));
    let key_ref = peer.agent_private_key_secret_ref.clone().unwrap();
    assert_eq!(key_ref.name, names::GUEST_AGENT_PEER);
    assert!(s.body["data"][&key_ref.key].is_string());
    // the agent reads the key from the mounted Secret, at the file the config names
    assert_eq!(
        peer.private_key_file.as_deref(),
        Some(format!("/etc/hcp-olm/peer/{}", key_ref.key).as_str())
    );
    assert!(peer.private_key.is_none(), "no key inline in the config");
    // it relays only to the guest's networks and forwards DNS to the guest cluster DNS
    assert!(!peer.allowed_cidrs.is_empty());
    assert_eq!(peer.guest_dns.len(), 1);
    assert!(
        peer.guest_dns[0].ends_with(".10:53"),
        "{:?}",
        peer.guest_dns
    );
    assert_eq!(peer.exposed_services.len(), 3);
    let wg = find(&d.hcp, "Service", names::TUNNEL_GATEWAY_WG);
    assert_eq!(wg.body["spec"]["type"], "NodePort");
    assert_eq!(wg.body["spec"]["ports"][0]["protocol"], "UDP");
}

/// Issue 19: an IPv6-only and a dual-stack guest get a tunnel that carries their IPv6 ranges:
/// the IPv6 pair inside the tunnel on both ends, the guest DNS at the 10th address of an IPv6
/// Service range in `[ip]:53` form, and the agent listening on `::` (a guest Service of
/// either family reaches it); an IPv4-only guest keeps the IPv4-only documents it had.
#[test]
fn ipv6_and_dual_stack_guests_get_ipv6_inside_the_tunnel() {
    use base64::Engine;
    let b64 = |v: &Value| {
        base64::engine::general_purpose::STANDARD
            .decode(v.as_str().unwrap())
            .unwrap()
    };
    let desired = |networking: Option<Value>| {
        let mut hc = common::load_hc("none-minimal.yaml");
        if let Some(n) = networking {
            hc.spec.networking = Some(serde_json::from_value(n).unwrap());
        }
        render::desired(&common::with_live_facts(common::input(
            common::valid(&hc, None),
            true,
        )))
        .unwrap()
    };
    let docs = |networking: Option<Value>| {
        let d = desired(networking);
        let peer: render::AgentPeerConfig =
            serde_json::from_slice(&b64(
                &find(&d.guest, "Secret", names::GUEST_AGENT_PEER).body["data"]["peer.json"]
            ))
            .unwrap();
        let gw: render::GatewayConfig =
            serde_json::from_slice(&b64(
                &find(&d.hcp, "Secret", names::TUNNEL_GATEWAY).body["data"]["config.json"],
            ))
            .unwrap();
        (peer, gw)
    };
    let (peer, gw) = docs(Some(serde_json::json!({
        "serviceNetwork": [{"cidr": "fd02::/112"}],
        "clusterNetwork": [{"cidr": "fd01::/48"}]
    })));
    assert_eq!(peer.allowed_cidrs, ["fd02::/112", "fd01::/48"]);
    assert_eq!(gw.guest_cidrs, peer.allowed_cidrs);
    assert_eq!(peer.guest_dns, ["[fd02::a]:53"]);
    assert_eq!(
        peer.tunnel_address6.as_deref(),
        Some(hcp_olm_tunnel_api::AGENT_TUNNEL_ADDRESS6)
    );
    assert_eq!(
        peer.gateway_tunnel_address6.as_deref(),
        Some(hcp_olm_tunnel_api::GATEWAY_TUNNEL_ADDRESS6)
    );
    assert_eq!(gw.tunnel_address6, peer.gateway_tunnel_address6);
    assert_eq!(gw.agent_tunnel_address6, peer.tunnel_address6);
    assert_eq!(peer.exposed_listen_address.as_deref(), Some("::"));
    let health: std::net::SocketAddr = peer.health_listen.as_deref().unwrap().parse().unwrap();
    assert!(health.ip().is_unspecified() && health.is_ipv6(), "{health}");
    // The WireGuard Service takes both families where the management cluster has both, so
    // the guest's IPv6 nodes can reach its node port or load balancer (a single-stack
    // management cluster gives it its one family).
    let wg_policy = |networking: Option<Value>| {
        let d = desired(networking);
        find(&d.hcp, "Service", names::TUNNEL_GATEWAY_WG).body["spec"]["ipFamilyPolicy"].clone()
    };
    let v6 = serde_json::json!({
        "serviceNetwork": [{"cidr": "fd02::/112"}],
        "clusterNetwork": [{"cidr": "fd01::/48"}]
    });
    let dual = serde_json::json!({
        "serviceNetwork": [{"cidr": "172.30.0.0/16"}, {"cidr": "fd02::/112"}],
        "clusterNetwork": [{"cidr": "10.128.0.0/14"}, {"cidr": "fd01::/48"}]
    });
    assert_eq!(wg_policy(Some(v6)), "PreferDualStack");
    assert_eq!(wg_policy(Some(dual)), "PreferDualStack");
    assert_eq!(wg_policy(None), Value::Null, "IPv4 guests render as before");

    let (peer, gw) = docs(Some(serde_json::json!({
        "serviceNetwork": [{"cidr": "172.30.0.0/16"}, {"cidr": "fd02::/112"}],
        "clusterNetwork": [{"cidr": "10.128.0.0/14"}, {"cidr": "fd01::/48"}]
    })));
    assert_eq!(
        peer.allowed_cidrs,
        ["172.30.0.0/16", "fd02::/112", "10.128.0.0/14", "fd01::/48"]
    );
    assert_eq!(
        peer.guest_dns,
        ["172.30.0.10:53"],
        "the first Service range's family"
    );
    assert!(peer.tunnel_address6.is_some() && gw.tunnel_address6.is_some());
    assert_eq!(peer.exposed_listen_address.as_deref(), Some("::"));

    // IPv4 only: no IPv6 inside, listeners as before
    let (peer, gw) = docs(None);
    assert!(peer.tunnel_address6.is_none() && peer.gateway_tunnel_address6.is_none());
    assert!(gw.tunnel_address6.is_none() && gw.agent_tunnel_address6.is_none());
    assert_eq!(peer.exposed_listen_address.as_deref(), Some("0.0.0.0"));
}

#[test]
fn render_is_deterministic() {
    for (what, input) in all_inputs() {
        let a = render::to_yaml(&render::desired(&input).unwrap()).unwrap();
        let b = render::to_yaml(&render::desired(&input).unwrap()).unwrap();
        assert_eq!(a, b, "{what}");
    }
}

#[test]
fn catalog_status_reads_back_connection_state() {
    use hcp_olm_controlplane::operatorhub::{HubSource, OperatorHubSpec};
    use hcp_olm_controlplane::status::catalog_statuses;
    let mut hc = common::load_hc("none-minimal.yaml");
    hc.spec.configuration = Some(hcp_olm_controlplane::hostedcluster::ClusterConfiguration {
        operatorhub: Some(OperatorHubSpec {
            disable_all_default_sources: None,
            sources: vec![HubSource {
                name: "certified-operators".into(),
                disabled: true,
            }],
        }),
        api_server: None,
    });
    let input = common::input(common::valid(&hc, None), true);
    let d = render::desired(&input).unwrap();
    let mut live = std::collections::BTreeMap::new();
    live.insert(
        "redhat-operators".to_string(),
        serde_json::json!({"status": {"connectionState": {"lastObservedState": "READY", "lastConnect": "2026-11-22T06:00:00Z"}}}),
    );
    let st = catalog_statuses(&input, &d, &live);
    assert_eq!(st.len(), 3);
    assert_eq!(st[0].name, "redhat-operators");
    assert_eq!(st[0].connection_state.as_deref(), Some("READY"));
    assert_eq!(
        st[0].source.as_deref(),
        Some("hcp-olm-redhat-operators:50051")
    );
    assert!(st[0].image.as_deref().unwrap().contains("@sha256:"));
    assert_eq!(st[0].version.as_deref(), Some("4.18"));
    assert!(!st[1].enabled);
    assert_eq!(st[1].message, "disabled");
    assert_eq!(st[2].connection_state, None);
    assert_eq!(st[2].version.as_deref(), Some("4.17"));
    assert!(st[2].message.contains("not observed"));
}

#[test]
fn catalog_server_choice_changes_only_the_server_container() {
    use hcp_olm_controlplane::hostedolm::{CatalogServerKind, HostedOLMSpec};
    let hc = common::load_hc("none-minimal.yaml");
    let ov = HostedOLMSpec {
        catalog_server: Some(CatalogServerKind::HcpOlm),
        ..Default::default()
    };
    let input = common::input(common::valid(&hc, Some(&ov)), true);
    let d = render::desired(&input).unwrap();
    let c = container(&d, "hcp-olm-redhat-operators", "catalog-server");
    assert_eq!(c["image"], "quay.io/hcp-olm/hcp-olm-catalog-server:test");
    assert!(args(c).contains(&"--catalog=/extracted-catalog/catalog".to_string()));
    assert!(args(c).contains(&"--listen=0.0.0.0:50051".to_string()));
    let pod =
        &find(&d.hcp, "Deployment", "hcp-olm-redhat-operators").body["spec"]["template"]["spec"];
    let init = pod["initContainers"].as_array().unwrap();
    assert!(
        init[1]["image"]
            .as_str()
            .unwrap()
            .starts_with("registry.redhat.io/redhat/redhat-operator-index@sha256:")
    );
    assert!(!args(&init[1]).iter().any(|a| a.starts_with("--cache")));
    assert_eq!(pod["terminationGracePeriodSeconds"], 15);
}

#[test]
fn key_rotation_renders_extra_keys_and_rolls_no_pod() {
    use base64::Engine as _;
    let b64 = base64::engine::general_purpose::STANDARD;
    let hc = common::load_hc("none-minimal.yaml");
    let input = common::input(common::valid(&hc, None), true);
    let secret_data = |d: &Desired, objs: fn(&Desired) -> &Vec<Object>, name: &str, key: &str| {
        find(objs(d), "Secret", name).body["data"][key]
            .as_str()
            .map(|v| String::from_utf8(b64.decode(v).unwrap()).unwrap())
    };
    let hash = |d: &Desired| {
        (
            find(&d.hcp, "Deployment", names::TUNNEL_GATEWAY).body["spec"]["template"]["metadata"]
                ["annotations"][labels::CONFIG_HASH_ANNOTATION]
                .clone(),
            find(&d.guest, "Deployment", names::GUEST_AGENT).body["spec"]["template"]["metadata"]
                ["annotations"][labels::CONFIG_HASH_ANNOTATION]
                .clone(),
        )
    };
    let before = render::desired(&input).unwrap();
    assert_eq!(
        secret_data(
            &before,
            |d| &d.hcp,
            names::TUNNEL_GATEWAY,
            "extra-private-key"
        ),
        None
    );
    // Phase 1: the gateway also accepts new keys; the agent keeps its own.
    let mut rot = input.clone();
    rot.tunnel.gateway_extra_private_key =
        Some("TkVYVC1HQVRFV0FZLUtFWS0wMDAwMDAwMDAwMDAwMDA=".into());
    rot.tunnel.agent_extra_public_key = Some("TkVYVC1BR0VOVC1QVUJMSUMtMDAwMDAwMDAwMDAwMDA=".into());
    let during = render::desired(&rot).unwrap();
    let gw: Value = serde_json::from_str(
        &secret_data(&during, |d| &d.hcp, names::TUNNEL_GATEWAY, "config.json").unwrap(),
    )
    .unwrap();
    assert_eq!(
        gw["previous_private_key_files"],
        serde_json::json!(["/etc/hcp-olm/tunnel/extra-private-key"])
    );
    assert_eq!(
        gw["previous_agent_public_keys"],
        serde_json::json!(["TkVYVC1BR0VOVC1QVUJMSUMtMDAwMDAwMDAwMDAwMDA="])
    );
    assert_eq!(
        secret_data(
            &during,
            |d| &d.hcp,
            names::TUNNEL_GATEWAY,
            "extra-private-key"
        )
        .as_deref(),
        Some("TkVYVC1HQVRFV0FZLUtFWS0wMDAwMDAwMDAwMDAwMDA=")
    );
    // Phase 2: the agent's keys change too.
    let mut moved = rot.clone();
    moved.tunnel.agent_private_key = "TkVXLUFHRU5ULVBSSVZBVEUtMDAwMDAwMDAwMDAwMDA=".into();
    moved.tunnel.gateway_public_key = "TkVXLUdBVEVXQVktUFVCTElDLTAwMDAwMDAwMDAwMDA=".into();
    let after = render::desired(&moved).unwrap();
    assert_eq!(
        secret_data(&after, |d| &d.guest, names::GUEST_AGENT_PEER, "private-key").as_deref(),
        Some("TkVXLUFHRU5ULVBSSVZBVEUtMDAwMDAwMDAwMDAwMDA=")
    );
    // Keys are re-read by the running daemons: no pod template changes.
    assert_eq!(hash(&before), hash(&during));
    assert_eq!(hash(&before), hash(&after));
    // Something the daemons do not re-read still rolls them.
    let mut other = input.clone();
    other.tunnel.gateway_endpoint = Some("198.18.7.7:31000".into());
    assert_ne!(hash(&before).1, hash(&render::desired(&other).unwrap()).1);
}

/// Security (issue 12, hole 9): after a CA re-issue the guest APIService trusts the old and
/// the new CA, and the CA Secret keeps the old certificate (never its key), so packageserver
/// pods still serving the old certificate keep the packages API available; without a previous
/// CA the bundle is the current CA alone. Retiring the old CA does not roll packageserver.
#[test]
fn ca_bundle_holds_the_previous_ca_while_one_is_set() {
    use base64::Engine;
    let b64 = |v: &Value| {
        String::from_utf8(
            base64::engine::general_purpose::STANDARD
                .decode(v.as_str().unwrap())
                .unwrap(),
        )
        .unwrap()
    };
    let hc = common::load_hc("none-minimal.yaml");
    let mut input = common::with_live_facts(common::input(common::valid(&hc, None), true));
    let d = render::desired(&input).unwrap();
    let bundle = |d: &Desired| {
        b64(&find(&d.guest, "APIService", names::APISERVICE).body["spec"]["caBundle"])
    };
    assert_eq!(bundle(&d), input.pki.ca.cert_pem);
    assert!(find(&d.hcp, "Secret", names::CA).body["data"]["previous-ca.crt"].is_null());

    let old = "-----BEGIN CERTIFICATE-----\nT0xELUNB\n-----END CERTIFICATE-----\n".to_string();
    input.pki.previous_ca_pem = Some(old.clone());
    let overlap = render::desired(&input).unwrap();
    let b = bundle(&overlap);
    assert!(
        b.starts_with(&input.pki.ca.cert_pem) && b.ends_with(&old),
        "{b}"
    );
    assert_eq!(b.matches("BEGIN CERTIFICATE").count(), 2);
    let ca_secret = &find(&overlap.hcp, "Secret", names::CA).body["data"];
    assert_eq!(b64(&ca_secret["previous-ca.crt"]), old);
    assert_eq!(
        b64(&ca_secret["tls.key"]),
        input.pki.ca.key_pem,
        "only the current key"
    );
    let hash = |d: &Desired| {
        find(&d.hcp, "Deployment", names::PACKAGESERVER).body["spec"]["template"]["metadata"]
            ["annotations"][labels::CONFIG_HASH_ANNOTATION]
            .clone()
    };
    assert_eq!(hash(&d), hash(&overlap));
}

/// As HyperShift gives its OLM pods the HCP namespace's pull secret (issue 13, item 5): every
/// ServiceAccount our HCP pods run as carries it; catalog pods get a writable `/tmp` and Linux
/// nodes (item 8).
#[test]
fn hcp_pods_pull_with_the_hcp_pull_secret_and_catalogs_render_as_hypershift() {
    let hc = common::load_hc("none-minimal.yaml");
    let input = common::with_live_facts(common::input(common::valid(&hc, None), true));
    let d = render::desired(&input).unwrap();
    let sas: Vec<&Object> = d
        .hcp
        .iter()
        .filter(|o| o.kind == "ServiceAccount")
        .collect();
    assert!(sas.len() >= 4);
    for sa in sas {
        assert_eq!(
            sa.body["imagePullSecrets"],
            serde_json::json!([{"name": input.valid.pull_secret}]),
            "{}",
            sa.name
        );
    }
    let catalog = find(&d.hcp, "Deployment", "hcp-olm-redhat-operators");
    let pod = &catalog.body["spec"]["template"]["spec"];
    assert_eq!(pod["nodeSelector"]["kubernetes.io/os"], "linux");
    assert!(
        pod["volumes"]
            .as_array()
            .unwrap()
            .iter()
            .any(|v| v["name"] == "tmp")
    );
    for c in pod["containers"].as_array().unwrap() {
        assert!(
            c["volumeMounts"]
                .as_array()
                .unwrap()
                .iter()
                .any(|m| m["mountPath"] == "/tmp"),
            "{}",
            c["name"]
        );
        assert_eq!(c["securityContext"]["readOnlyRootFilesystem"], true);
    }
    for c in pod["initContainers"].as_array().unwrap() {
        assert!(
            !c["volumeMounts"]
                .as_array()
                .unwrap()
                .iter()
                .any(|m| m["mountPath"] == "/tmp"),
            "init container {} must keep the image's /tmp (opm cache)",
            c["name"]
        );
    }
}

/// packageserver as HyperShift renders it (issue 13, item 6): highly available replicas are
/// required on different nodes and zones (zones preferred on KubeVirt), and the guest API
/// server's TLS profile becomes its TLS flags; a bad profile is a reason naming the field.
#[test]
fn packageserver_spreads_and_follows_the_tls_profile() {
    let hc = common::load_hc("kubevirt-complex-flags.yaml");
    let mut v = common::valid(&hc, None);
    let anti = |v: &hcp_olm_controlplane::validate::ValidInput| {
        let d = render::desired(&common::input(v.clone(), true)).unwrap();
        find(&d.hcp, "Deployment", names::PACKAGESERVER).body["spec"]["template"]["spec"]
            ["affinity"]["podAntiAffinity"]
            .clone()
    };
    // KubeVirt: hostname required, zone preferred
    let a = anti(&v);
    let req = a["requiredDuringSchedulingIgnoredDuringExecution"]
        .as_array()
        .unwrap();
    assert_eq!(req.len(), 1);
    assert_eq!(req[0]["topologyKey"], "kubernetes.io/hostname");
    assert_eq!(
        a["preferredDuringSchedulingIgnoredDuringExecution"][0]["podAffinityTerm"]["topologyKey"],
        "topology.kubernetes.io/zone"
    );
    v.zone_spread_required = true;
    let a = anti(&v);
    let keys: Vec<&str> = a["requiredDuringSchedulingIgnoredDuringExecution"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["topologyKey"].as_str().unwrap())
        .collect();
    assert_eq!(
        keys,
        ["topology.kubernetes.io/zone", "kubernetes.io/hostname"]
    );
    // single replica: no spread
    let single = common::valid(&common::load_hc("none-minimal.yaml"), None);
    assert!(anti(&single).is_null());

    // TLS: Intermediate by default, Modern from the HostedCluster
    let d = render::desired(&common::input(single.clone(), true)).unwrap();
    let a = args(container(&d, names::PACKAGESERVER, "packageserver"));
    assert!(
        a.contains(&"--tls-min-version=VersionTLS12".to_string()),
        "{a:?}"
    );
    assert!(
        a.iter()
            .any(|x| x.starts_with("--tls-cipher-suites=TLS_ECDHE_"))
    );
    let mut modern = common::load_hc("none-minimal.yaml");
    modern.spec.configuration.get_or_insert_default().api_server = Some(
        serde_json::from_value(serde_json::json!({"tlsSecurityProfile": {"type": "Modern"}}))
            .unwrap(),
    );
    let d = render::desired(&common::input(common::valid(&modern, None), true)).unwrap();
    let a = args(container(&d, names::PACKAGESERVER, "packageserver"));
    assert!(
        a.contains(&"--tls-min-version=VersionTLS13".to_string()),
        "{a:?}"
    );
    assert!(!a.iter().any(|x| x.starts_with("--tls-cipher-suites")));
    modern.spec.configuration.get_or_insert_default().api_server = Some(
        serde_json::from_value(serde_json::json!({"tlsSecurityProfile": {"type": "Paranoid"}}))
            .unwrap(),
    );
    let err = hcp_olm_controlplane::validate::validate(
        &modern,
        None,
        &common::facts(),
        &common::defaults(),
    )
    .unwrap_err();
    assert!(
        err.iter()
            .any(|r| r.code.as_str() == "InvalidTLSSecurityProfile"
                && r.to_string().contains("tlsSecurityProfile")),
        "{err:?}"
    );
}

/// Metrics as HyperShift serves them (issue 13, item 7): catalog-operator and olm-operator
/// on 8443 over TLS with `--tls-cert`/`--tls-key`/`--client-ca`, HTTPS probes, metrics
/// Services on `https-metrics`, ServiceMonitors only where the management cluster serves
/// them, and none of it with `hypershift.openshift.io/disable-monitoring-services`.
#[test]
fn olm_metrics_over_tls_with_service_monitors_unless_disabled() {
    let hc = common::load_hc("none-minimal.yaml");
    let mut input = common::with_live_facts(common::input(common::valid(&hc, None), true));
    let d = render::desired(&input).unwrap();
    for (deploy, cname, secret) in [
        (
            names::CATALOG_OPERATOR,
            "catalog-operator",
            names::CATALOG_OPERATOR_METRICS_CERT,
        ),
        (
            names::OLM_OPERATOR,
            "olm-operator",
            names::OLM_OPERATOR_METRICS_CERT,
        ),
    ] {
        let c = container(&d, deploy, cname);
        let a = args(c);
        for (flag, file) in [
            ("--tls-cert", "/srv-cert/tls.crt"),
            ("--tls-key", "/srv-cert/tls.key"),
            ("--client-ca", "/srv-cert/ca.crt"),
        ] {
            let at = a
                .iter()
                .position(|x| x == flag)
                .unwrap_or_else(|| panic!("{cname} {flag}"));
            assert_eq!(a[at + 1], file);
        }
        assert_eq!(c["ports"][0]["containerPort"], 8443);
        assert_eq!(c["readinessProbe"]["httpGet"]["scheme"], "HTTPS");
        let pod = &find(&d.hcp, "Deployment", deploy).body["spec"]["template"]["spec"];
        assert!(
            pod["volumes"]
                .as_array()
                .unwrap()
                .iter()
                .any(|v| v["secret"]["secretName"] == secret)
        );
        find(&d.hcp, "Secret", secret);
        let svc = find(&d.hcp, "Service", &format!("{deploy}-metrics"));
        assert_eq!(svc.body["spec"]["ports"][0]["name"], "https-metrics");
        let sm = find(&d.hcp, "ServiceMonitor", deploy);
        assert_eq!(
            sm.body["spec"]["selector"]["matchLabels"]["app.kubernetes.io/name"],
            format!("{deploy}-metrics")
        );
        assert_eq!(
            sm.body["spec"]["endpoints"][0]["tlsConfig"]["serverName"],
            format!("{deploy}-metrics")
        );
    }
    find(&d.hcp, "Secret", names::METRICS_CLIENT);
    // a new metrics certificate rolls its operator only
    let hash = |d: &Desired, n: &str| {
        find(&d.hcp, "Deployment", n).body["spec"]["template"]["metadata"]["annotations"]
            [labels::CONFIG_HASH_ANNOTATION]
            .clone()
    };
    let mut rotated = input.clone();
    rotated
        .pki
        .metrics
        .as_mut()
        .unwrap()
        .catalog_operator
        .cert_pem
        .push('\n');
    let r = render::desired(&rotated).unwrap();
    assert_ne!(
        hash(&d, names::CATALOG_OPERATOR),
        hash(&r, names::CATALOG_OPERATOR)
    );
    assert_eq!(hash(&d, names::OLM_OPERATOR), hash(&r, names::OLM_OPERATOR));

    // no ServiceMonitor CRD: no ServiceMonitors, Services stay
    input.service_monitors_served = false;
    let d = render::desired(&input).unwrap();
    assert!(!d.hcp.iter().any(|o| o.kind == "ServiceMonitor"));
    find(
        &d.hcp,
        "Service",
        &format!("{}-metrics", names::CATALOG_OPERATOR),
    );
    // HyperShift's disable-monitoring-services: neither
    input.service_monitors_served = true;
    input.valid.monitoring_disabled = true;
    let d = render::desired(&input).unwrap();
    assert!(
        !d.hcp
            .iter()
            .any(|o| o.kind == "ServiceMonitor" || o.name.ends_with("-metrics"))
    );
    // the annotation is read from the HostedCluster
    let mut hc2 = common::load_hc("none-minimal.yaml");
    hc2.metadata.annotations.get_or_insert_default().insert(
        "hypershift.openshift.io/disable-monitoring-services".into(),
        "true".into(),
    );
    assert!(common::valid(&hc2, None).monitoring_disabled);
    assert!(!common::valid(&hc, None).monitoring_disabled);
}

/// TakeOver (issue 13, item 13): ours runs behind HyperShift's objects — packageserver pods
/// labelled for HyperShift's `packageserver` Service and serving its `packageserver-cert`,
/// HyperShift's catalog Services dialled directly, no default catalogs of ours — and none of
/// the guest objects HyperShift's config operator writes is rendered. Without HyperShift's
/// certificate Secret, packageserver waits with a reason naming it.
#[test]
fn take_over_renders_behind_hypershifts_objects() {
    let hc = common::load_hc("none-minimal.yaml");
    let spec = hcp_olm_controlplane::hostedolm::HostedOLMSpec {
        hyper_shift_olm: Some(hcp_olm_controlplane::hostedolm::HyperShiftOLMMode::TakeOver),
        ..Default::default()
    };
    let valid = common::valid(&hc, Some(&spec));
    assert!(valid.hypershift_take_over && valid.enabled_catalogs.is_empty());
    let mut input = common::with_live_facts(common::input(valid, true));
    let d = render::desired(&input).unwrap();
    for kind in ["OperatorHub", "CatalogSource", "APIService", "Endpoints"] {
        assert!(
            !d.guest.iter().any(|o| o.kind == kind),
            "{kind} rendered beside HyperShift's config operator"
        );
    }
    assert!(
        !d.guest
            .iter()
            .any(|o| o.kind == "Service" && o.name == "packageserver")
    );
    assert!(!d.hcp.iter().any(|o| o.name.ends_with("-operators")));
    let ps = find(&d.hcp, "Deployment", names::PACKAGESERVER);
    let tpl = &ps.body["spec"]["template"];
    assert_eq!(tpl["metadata"]["labels"]["app"], "packageserver");
    assert_eq!(
        tpl["metadata"]["labels"]["hypershift.openshift.io/control-plane-component"],
        "packageserver"
    );
    let vols = tpl["spec"]["volumes"].as_array().unwrap();
    assert!(
        vols.iter()
            .any(|v| v["name"] == "serving-cert"
                && v["secret"]["secretName"] == "packageserver-cert"),
        "{vols:?}"
    );
    let no_proxy = env(
        container(&d, names::CATALOG_OPERATOR, "catalog-operator"),
        "NO_PROXY",
    )
    .unwrap();
    assert!(no_proxy.contains("redhat-operators,"), "{no_proxy}");
    assert!(
        d.pending
            .iter()
            .any(|p| p.reason == "WaitingForHyperShiftPackageServerCert"
                && p.message.contains("packageserver-cert")),
        "{:?}",
        d.pending
    );
    input
        .external_secret_hashes
        .insert("packageserver-cert".into(), "h1".into());
    let d = render::desired(&input).unwrap();
    assert!(
        !d.pending
            .iter()
            .any(|p| p.reason == "WaitingForHyperShiftPackageServerCert")
    );
}

/// On a management cluster without SecurityContextConstraints, every HCP pod runs as
/// HyperShift's default user with that fsGroup (so a non-root user reads the 0440 Secret
/// volumes); where SCCs are served, neither is set (the SCC assigns them). Every container's
/// termination message falls back to its log, which HostedOLM shows for a crash loop.
/// The guest agent runs as its image's user with no fsGroup (nothing may be assumed of the
/// guest's admission: a fixed user or group is refused where an SCC assigns them, and a plain
/// Kubernetes guest assigns none), so its Secret volume must be readable by any user: on a
/// real guest node the agent crash-looped with "cannot read /etc/hcp-olm/peer/peer.json:
/// Permission denied" (mode 0440, owner root).
#[test]
fn the_guest_agent_reads_its_secret_as_any_user() {
    let hc = common::load_hc("none-minimal.yaml");
    let input = common::with_live_facts(common::input(common::valid(&hc, None), true));
    let d = render::desired(&input).unwrap();
    let agent = d
        .guest
        .iter()
        .find(|o| o.kind == "Deployment")
        .expect("agent Deployment");
    // and no EndpointSlice: the guest's controller-manager mirrors the packageserver
    // Endpoints (a real guest showed both, ours and its mirror, before ours went)
    assert!(
        d.guest.iter().all(|o| o.kind != "EndpointSlice"),
        "an EndpointSlice is rendered into the guest"
    );
    let pod = &agent.body["spec"]["template"]["spec"];
    assert!(pod["securityContext"].get("fsGroup").is_none(), "{pod}");
    assert!(pod["securityContext"].get("runAsUser").is_none(), "{pod}");
    for v in pod["volumes"].as_array().expect("volumes") {
        if let Some(secret) = v.get("secret") {
            let mode = secret["defaultMode"].as_u64().unwrap_or(0o644);
            assert_eq!(mode & 0o004, 0o004, "{v}: not readable without an fsGroup");
            assert_eq!(mode & 0o222, 0, "{v}: writable");
        }
    }
}

#[test]
fn hcp_pods_run_as_hypershifts_default_user_without_sccs() {
    let hc = common::load_hc("none-minimal.yaml");
    let mut input = common::with_live_facts(common::input(common::valid(&hc, None), true));
    for scc in [false, true] {
        input.management_has_scc = scc;
        let d = render::desired(&input).unwrap();
        let deployments: Vec<&Object> = d.hcp.iter().filter(|o| o.kind == "Deployment").collect();
        assert!(deployments.len() >= 5, "{deployments:?}");
        for o in deployments {
            let pod = &o.body["spec"]["template"]["spec"];
            // and every container says why it failed
            for c in pod["containers"]
                .as_array()
                .into_iter()
                .chain(pod["initContainers"].as_array())
                .flatten()
            {
                assert_eq!(
                    c["terminationMessagePolicy"], "FallbackToLogsOnError",
                    "{}",
                    o.name
                );
            }
            let sc = &pod["securityContext"];
            assert_eq!(sc["runAsNonRoot"], true, "{}", o.name);
            if scc {
                assert!(
                    sc.get("runAsUser").is_none() && sc.get("fsGroup").is_none(),
                    "{}: {sc}",
                    o.name
                );
            } else {
                assert_eq!(
                    (&sc["runAsUser"], &sc["fsGroup"]),
                    (&1001.into(), &1001.into()),
                    "{}",
                    o.name
                );
            }
        }
    }
}

/// Issue 37 item 3: one PodDisruptionBudget per pod. Under TakeOver our packageserver pods
/// carry HyperShift's `app: packageserver` labels, which its `packageserver-pdb` selects: a
/// second PDB of ours makes the Eviction API answer 500 for them, and management node drains
/// stall. A single replica gets no PDB (as HyperShift renders it now: `minAvailable: 1` on
/// one pod allows no eviction ever, so a drain would never finish); highly available gets
/// `maxUnavailable: 1`.
#[test]
fn one_pdb_per_pod_in_every_mode() {
    use hcp_olm_controlplane::hostedolm::{HostedOLMSpec, HyperShiftOLMMode};
    let pdbs = |hc: &hcp_olm_controlplane::hostedcluster::HostedCluster,
                spec: Option<&HostedOLMSpec>| {
        let input = common::with_live_facts(common::input(common::valid(hc, spec), true));
        render::desired(&input)
            .unwrap()
            .hcp
            .into_iter()
            .filter(|o| o.kind == "PodDisruptionBudget")
            .map(|o| (o.name.clone(), o.body["spec"].clone()))
            .collect::<Vec<_>>()
    };
    let take_over = HostedOLMSpec {
        hyper_shift_olm: Some(HyperShiftOLMMode::TakeOver),
        ..Default::default()
    };
    let mut ha = common::load_hc("none-minimal.yaml");
    ha.spec.controller_availability_policy = Some("HighlyAvailable".into());
    let mut single = ha.clone();
    single.spec.controller_availability_policy = Some("SingleReplica".into());

    let got = pdbs(&ha, None);
    let ps: Vec<_> = got
        .iter()
        .filter(|(n, _)| n == names::PACKAGESERVER_PDB)
        .collect();
    assert_eq!(ps.len(), 1, "{got:?}");
    assert_eq!(ps[0].1["maxUnavailable"], 1, "{got:?}");
    for (hc, spec, what) in [
        (&ha, Some(&take_over), "TakeOver, highly available"),
        (&single, Some(&take_over), "TakeOver, single replica"),
        (&single, None, "single replica"),
    ] {
        let got = pdbs(hc, spec);
        assert!(
            !got.iter().any(|(n, _)| n == names::PACKAGESERVER_PDB),
            "{what}: packageserver PDB of ours rendered: {got:?}"
        );
    }
}

/// Issue 37 item 4: HyperShift's control-plane knobs, honoured as its control-plane-operator
/// honours them: priority-class overrides (control-plane and API-critical), the restart date
/// on every pod template, resource request overrides named by HyperShift's Deployment and
/// container names, and the autoscaler's safe-to-evict-local-volumes annotation naming every
/// emptyDir.
#[test]
fn hypershift_control_plane_knobs_are_honoured() {
    use hcp_olm_controlplane::knobs;
    let mut hc = common::load_hc("none-minimal.yaml");
    let a = hc.metadata.annotations.get_or_insert_default();
    for (k, v) in [
        (knobs::CONTROL_PLANE_PRIORITY_CLASS, "tenant-control-plane"),
        (knobs::API_CRITICAL_PRIORITY_CLASS, "tenant-api-critical"),
        (knobs::RESTART_DATE, "2026-11-29T06:00:00Z"),
        (
            "resource-request-override.hypershift.openshift.io/packageserver.packageserver",
            "memory=1Gi,cpu=300m",
        ),
        (
            "resource-request-override.hypershift.openshift.io/redhat-operators-catalog.registry",
            "memory=900Mi",
        ),
        (
            "resource-request-override.hypershift.openshift.io/catalog-operator.catalog-operator",
            "cpu=50m",
        ),
    ] {
        a.insert(k.into(), v.into());
    }
    let valid = common::valid(&hc, None);
    assert!(valid.knob_warnings.is_empty(), "{:?}", valid.knob_warnings);
    let d = render::desired(&common::with_live_facts(common::input(valid, true))).unwrap();
    let deployments: Vec<&Object> = d.hcp.iter().filter(|o| o.kind == "Deployment").collect();
    assert!(deployments.len() >= 5, "{deployments:?}");
    for dep in &deployments {
        let tpl = &dep.body["spec"]["template"];
        let class = tpl["spec"]["priorityClassName"].as_str().unwrap();
        let want = if dep.name == names::PACKAGESERVER {
            "tenant-api-critical"
        } else {
            "tenant-control-plane"
        };
        assert_eq!(class, want, "{}", dep.name);
        assert_eq!(
            tpl["metadata"]["annotations"][knobs::RESTART_DATE],
            "2026-11-29T06:00:00Z",
            "{}",
            dep.name
        );
        let local: Vec<&str> = tpl["spec"]["volumes"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|v| v.get("emptyDir").is_some())
            .map(|v| v["name"].as_str().unwrap())
            .collect();
        if !local.is_empty() {
            assert_eq!(
                tpl["metadata"]["annotations"][knobs::SAFE_TO_EVICT_LOCAL_VOLUMES],
                local.join(","),
                "{}",
                dep.name
            );
        }
    }
    let ps = container(&d, names::PACKAGESERVER, "packageserver");
    assert_eq!(ps["resources"]["requests"]["memory"], "1Gi");
    assert_eq!(ps["resources"]["requests"]["cpu"], "300m");
    let co = container(&d, names::CATALOG_OPERATOR, "catalog-operator");
    assert_eq!(co["resources"]["requests"]["cpu"], "50m");
    // The catalog's serving container, whichever server runs it; its memory limit follows.
    let cat = find(&d.hcp, "Deployment", "hcp-olm-redhat-operators").body["spec"]["template"]
        ["spec"]["containers"][0]
        .clone();
    assert_eq!(cat["resources"]["requests"]["memory"], "900Mi", "{cat}");
    if cat["resources"]["limits"].get("memory").is_some() {
        assert_eq!(cat["resources"]["limits"]["memory"], "900Mi");
    }
    // Not set: HyperShift's defaults, and no restart annotation.
    let plain = common::load_hc("none-minimal.yaml");
    let d = render::desired(&common::with_live_facts(common::input(
        common::valid(&plain, None),
        true,
    )))
    .unwrap();
    let ps = find(&d.hcp, "Deployment", names::PACKAGESERVER);
    assert_eq!(
        ps.body["spec"]["template"]["spec"]["priorityClassName"],
        "hypershift-api-critical"
    );
    assert!(
        ps.body["spec"]["template"]["metadata"]["annotations"]
            .get(knobs::RESTART_DATE)
            .is_none()
    );
}

/// Issue 39 item 4: the tunnel gateways are scraped where ServiceMonitors are served: a
/// metrics Service on the gateway's health port, a ServiceMonitor selecting it, and the
/// gateway's NetworkPolicy opening that port to the monitoring namespaces only; none of it
/// with HyperShift's disable-monitoring-services annotation.
#[test]
fn tunnel_gateways_are_scraped_unless_monitoring_is_disabled() {
    let hc = common::load_hc("none-minimal.yaml");
    let mut input = common::with_live_facts(common::input(common::valid(&hc, None), true));
    input.service_monitors_served = true;
    let d = render::desired(&input).unwrap();
    let svc = find(&d.hcp, "Service", names::TUNNEL_GATEWAY_METRICS);
    assert_eq!(svc.body["spec"]["type"], "ClusterIP");
    assert_eq!(svc.body["spec"]["ports"][0]["port"], 8081);
    assert_eq!(svc.body["spec"]["ports"][0]["targetPort"], "health");
    let gw = find(&d.hcp, "Deployment", names::TUNNEL_GATEWAY);
    let ports = gw.body["spec"]["template"]["spec"]["containers"][0]["ports"]
        .as_array()
        .unwrap();
    assert!(
        ports
            .iter()
            .any(|p| p["name"] == "health" && p["containerPort"] == 8081),
        "{ports:?}"
    );
    // The Service selects the gateway pods.
    for (k, v) in svc.body["spec"]["selector"].as_object().unwrap() {
        assert_eq!(
            gw.body["spec"]["template"]["metadata"]["labels"][k], *v,
            "{k}"
        );
    }
    let sm = find(&d.hcp, "ServiceMonitor", names::TUNNEL_GATEWAY);
    for (k, v) in sm.body["spec"]["selector"]["matchLabels"]
        .as_object()
        .unwrap()
    {
        assert_eq!(svc.body["metadata"]["labels"][k], *v, "{k}");
    }
    assert_eq!(sm.body["spec"]["endpoints"][0]["port"], "http-metrics");
    let np = find(&d.hcp, "NetworkPolicy", names::TUNNEL_GATEWAY);
    let monitoring = np.body["spec"]["ingress"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["ports"][0]["port"] == 8081)
        .expect("an ingress rule for the metrics port");
    assert_eq!(
        monitoring["from"],
        serde_json::json!([{"namespaceSelector": {"matchLabels": {"network.openshift.io/policy-group": "monitoring"}}}])
    );
    // Not served: the Service stays, no ServiceMonitor.
    input.service_monitors_served = false;
    let d = render::desired(&input).unwrap();
    assert!(
        d.hcp
            .iter()
            .any(|o| o.kind == "Service" && o.name == names::TUNNEL_GATEWAY_METRICS)
    );
    assert!(!d.hcp.iter().any(|o| o.kind == "ServiceMonitor"));
    // Disabled: nothing of it, and the port stays closed.
    let mut hc = common::load_hc("none-minimal.yaml");
    hc.metadata
        .annotations
        .get_or_insert_with(Default::default)
        .insert(
            "hypershift.openshift.io/disable-monitoring-services".into(),
            "true".into(),
        );
    let mut input = common::with_live_facts(common::input(common::valid(&hc, None), true));
    input.service_monitors_served = true;
    let d = render::desired(&input).unwrap();
    assert!(
        !d.hcp
            .iter()
            .any(|o| o.name == names::TUNNEL_GATEWAY_METRICS)
    );
    assert!(!d.hcp.iter().any(|o| o.kind == "ServiceMonitor"));
    let np = find(&d.hcp, "NetworkPolicy", names::TUNNEL_GATEWAY);
    assert!(
        !np.body["spec"]["ingress"]
            .as_array()
            .unwrap()
            .iter()
            .any(|r| r["ports"][0]["port"] == 8081)
    );
}

/// Issue 37 item 4: metrics carry the cluster's ID as `_id`, as HyperShift's ServiceMonitors
/// label them (a malformed ID is left out), and on IBM Cloud a highly available
/// packageserver runs 2 replicas, as HyperShift renders it there.
#[test]
fn metrics_carry_the_cluster_id_and_ibm_cloud_runs_two_packageservers() {
    let mut hc = common::load_hc("none-minimal.yaml");
    hc.spec.cluster_id = Some("5c1a7d1e-1b7e-4f5e-9f3a-0c1d2e3f4a5b".into());
    let mut input = common::with_live_facts(common::input(common::valid(&hc, None), true));
    input.service_monitors_served = true;
    let d = render::desired(&input).unwrap();
    let monitors: Vec<&Object> = d
        .hcp
        .iter()
        .filter(|o| o.kind == "ServiceMonitor")
        .collect();
    assert_eq!(
        monitors.len(),
        3,
        "{:?}",
        d.hcp.iter().map(Object::id).collect::<Vec<_>>()
    );
    for m in monitors {
        assert_eq!(
            m.body["spec"]["endpoints"][0]["relabelings"],
            serde_json::json!([{"action": "replace", "targetLabel": "_id",
                "replacement": "5c1a7d1e-1b7e-4f5e-9f3a-0c1d2e3f4a5b"}]),
            "{}",
            m.name
        );
    }
    hc.spec.cluster_id = Some("bad id\"} injected".into());
    assert_eq!(common::valid(&hc, None).cluster_id, None);

    let mut ibm = common::load_hc("none-minimal.yaml");
    ibm.spec.controller_availability_policy = Some("HighlyAvailable".into());
    ibm.spec.platform.get_or_insert_default().type_ = Some("IBMCloud".into());
    let d = render::desired(&common::input(common::valid(&ibm, None), true)).unwrap();
    assert_eq!(
        find(&d.hcp, "Deployment", names::PACKAGESERVER).body["spec"]["replicas"],
        2
    );
}

/// Issue 37 item 6: under HyperShift's `management-kas` NetworkPolicy (egress only to the
/// same namespace, DNS and addresses off the management pod network) the shared-catalog
/// readers get an egress policy for the shared catalogs' port, rendered before the
/// Deployments; without such a policy, for pods it does not select, or without shared
/// catalogs, none (a policy of ours alone would isolate the readers).
#[test]
fn shared_catalog_readers_get_egress_only_where_another_policy_isolates_them() {
    use hcp_olm_controlplane::hostedolm::{CatalogSharing, HostedOLMSpec};
    use hcp_olm_controlplane::netpol::EgressIsolation;
    use serde_json::json;
    let hc = common::load_hc("aws-default-flags.yaml");
    let shared = |sharing: CatalogSharing, isolation: Vec<EgressIsolation>| {
        let ov = HostedOLMSpec {
            catalog_sharing: Some(sharing),
            ..Default::default()
        };
        let mut v = common::valid(&hc, Some(&ov));
        v.lookup_credentials_are_own = true;
        let mut i = common::with_live_facts(common::input(v, true));
        i.egress_isolation = isolation;
        render::desired(&i).expect("render")
    };
    // HyperShift's management-kas (openshift/hypershift 3ee9615, network_policies.go)
    let management_kas = EgressIsolation {
        policy: "management-kas".into(),
        pod_selector: json!({"matchExpressions": [
            {"key": "hypershift.openshift.io/need-management-kas-access", "operator": "DoesNotExist"},
            {"key": "name", "operator": "NotIn", "values": ["aws-ebs-csi-driver-operator"]},
        ]}),
    };
    let egress = |d: &Desired| {
        d.hcp
            .iter()
            .find(|o| o.kind == "NetworkPolicy" && o.name == names::SHARED_CATALOG_EGRESS)
            .cloned()
    };

    let d = shared(CatalogSharing::Shared, vec![management_kas.clone()]);
    let np = egress(&d).expect("the egress policy under management-kas");
    let spec = &np.body["spec"];
    assert_eq!(spec["policyTypes"], json!(["Egress"]));
    assert_eq!(
        spec["podSelector"]["matchExpressions"][0]["values"],
        json!([
            names::CATALOG_OPERATOR,
            names::PACKAGESERVER,
            names::TUNNEL_GATEWAY
        ])
    );
    let to = &spec["egress"][0]["to"][0];
    assert_eq!(
        to["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"],
        "hcp-olm-catalogs"
    );
    assert_eq!(
        spec["egress"][0]["ports"],
        json!([{"protocol": "TCP", "port": render::ports::CATALOG_GRPC}])
    );
    assert_eq!(
        spec["egress"].as_array().map(Vec::len),
        Some(1),
        "nothing else"
    );
    // applied with the NetworkPolicies, before any Deployment
    let at = |pred: &dyn Fn(&Object) -> bool| d.hcp.iter().position(pred).expect("present");
    assert!(at(&|o| o.name == names::SHARED_CATALOG_EGRESS) < at(&|o| o.kind == "Deployment"));
    assert!(
        at(&|o| o.name == names::SHARED_CATALOG_EGRESS)
            > d.hcp
                .iter()
                .rposition(|o| o.kind == "NetworkPolicy" && o.name != names::SHARED_CATALOG_EGRESS)
                .expect("others")
    );
    // its selector really selects the rendered readers' pods, and only those
    for o in d.hcp.iter().filter(|o| o.kind == "Deployment") {
        let labels = o.body["spec"]["template"]["metadata"]["labels"]
            .as_object()
            .expect("pod labels");
        assert_eq!(
            hcp_olm_controlplane::netpol::selects(&spec["podSelector"], labels),
            [
                names::CATALOG_OPERATOR,
                names::PACKAGESERVER,
                names::TUNNEL_GATEWAY
            ]
            .contains(&o.name.as_str()),
            "{}",
            o.name
        );
    }

    assert!(
        egress(&shared(CatalogSharing::Shared, vec![])).is_none(),
        "not isolated"
    );
    let not_ours = EgressIsolation {
        policy: "kas-only".into(),
        pod_selector: json!({"matchLabels": {"app": "kube-apiserver"}}),
    };
    assert!(
        egress(&shared(CatalogSharing::Shared, vec![not_ours])).is_none(),
        "a policy that selects none of the readers"
    );
    assert!(
        egress(&shared(CatalogSharing::Own, vec![management_kas])).is_none(),
        "own catalogs are in the same namespace, which management-kas allows"
    );
}

/// Issue 39 item 2: our images are indexes for amd64 and arm64, so nothing we render pins an
/// architecture: the guest agent (on whatever node pools the guest has, arm64 ones included)
/// and the gateways, catalogs and OLM pods schedule on either.
#[test]
fn no_rendered_pod_is_pinned_to_an_architecture() {
    for file in [
        "none-minimal.yaml",
        "aws-default-flags.yaml",
        "kubevirt-complex-flags.yaml",
    ] {
        let hc = common::load_hc(file);
        let input = common::with_live_facts(common::input(common::valid(&hc, None), true));
        let d = render::desired(&input).unwrap();
        let mut pods = 0;
        for o in d.hcp.iter().chain(&d.guest) {
            if o.kind != "Deployment" && o.kind != "DaemonSet" {
                continue;
            }
            pods += 1;
            let spec = serde_json::to_string(&o.body["spec"]["template"]["spec"]).unwrap();
            assert!(
                !spec.contains("kubernetes.io/arch"),
                "{file}: {} pins an architecture: {spec}",
                o.id()
            );
        }
        assert!(
            d.guest
                .iter()
                .any(|o| o.kind == "Deployment" && o.name == names::GUEST_AGENT),
            "{file}: no guest agent rendered"
        );
        assert!(pods >= 5, "{file}: {pods} pod templates");
    }
}
