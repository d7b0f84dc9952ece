//! Deterministic fixtures for render tests: fixed clock, fixed key material.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::PathBuf;

use hcp_olm_controlplane::catalogs::{self, DefaultCatalog, LookupResult, StaticLookup};
use hcp_olm_controlplane::certs::CertMaterial;
use hcp_olm_controlplane::hostedcluster::HostedCluster;
use hcp_olm_controlplane::hostedolm::HostedOLMSpec;
use hcp_olm_controlplane::render::{Owner, PkiInput, RenderInput, TunnelKeys};
use hcp_olm_controlplane::validate::{self, ControllerDefaults, ReleaseFacts, ValidInput};
use time::OffsetDateTime;

pub fn examples_dir() -> PathBuf {
    hcp_olm_e2e::tools::fixtures_dir().join("hypershift/examples")
}

pub fn load_hc(file: &str) -> HostedCluster {
    let text = std::fs::read_to_string(examples_dir().join(file)).expect("fixture readable");
    let mut hcs = HostedCluster::from_yaml_stream(&text).expect("fixture parses");
    assert_eq!(hcs.len(), 1, "{file} has one HostedCluster");
    hcs.remove(0)
}

pub fn facts() -> ReleaseFacts {
    ReleaseFacts {
        version: Some("4.18.3".into()),
        olm_image: Some(format!(
            "quay.io/openshift-release-dev/ocp-v4.0-art-dev@sha256:{}",
            "a".repeat(64)
        )),
        operator_registry_image: Some(format!(
            "quay.io/openshift-release-dev/ocp-v4.0-art-dev@sha256:{}",
            "b".repeat(64)
        )),
        payload_problem: None,
    }
}

pub fn defaults() -> ControllerDefaults {
    ControllerDefaults {
        catalog_server_image: "quay.io/hcp-olm/hcp-olm-catalog-server:test".into(),
        tunnel_gateway_image: "quay.io/hcp-olm/hcp-olm-tunnel-gateway:test".into(),
        guest_agent_image: "quay.io/hcp-olm/hcp-olm-guest-agent:test".into(),
        // each cluster's own catalogs (the goldens of shared catalogs set Shared)
        catalog_sharing: hcp_olm_controlplane::hostedolm::CatalogSharing::Own,
        ..ControllerDefaults::default()
    }
}

pub fn valid(hc: &HostedCluster, ov: Option<&HostedOLMSpec>) -> ValidInput {
    validate::validate(hc, ov, &facts(), &defaults()).expect("valid input")
}

fn t(secs: i64) -> OffsetDateTime {
    OffsetDateTime::from_unix_timestamp(secs).unwrap()
}

fn pem(label: &str, body: &str) -> String {
    format!("-----BEGIN {label}-----\n{body}\n-----END {label}-----\n")
}

/// Registry answers: 4.18 exists for redhat and certified; community only has 4.17.
pub fn lookup() -> StaticLookup {
    let mut m = BTreeMap::new();
    for (c, digest) in [
        (DefaultCatalog::RedhatOperators, Some("1")),
        (DefaultCatalog::CertifiedOperators, Some("2")),
        (DefaultCatalog::CommunityOperators, None),
    ] {
        let repo = c.repository();
        match digest {
            Some(d) => {
                m.insert(
                    format!("{repo}:v4.18"),
                    LookupResult::Exists {
                        digest: Some(format!("sha256:{}", d.repeat(64))),
                    },
                );
            }
            None => {
                m.insert(format!("{repo}:v4.18"), LookupResult::Missing);
                m.insert(
                    format!("{repo}:v4.17"),
                    LookupResult::Exists {
                        digest: Some(format!("sha256:{}", "3".repeat(64))),
                    },
                );
            }
        }
    }
    StaticLookup(m)
}

/// A complete, deterministic render input.
pub fn input(v: ValidInput, ready: bool) -> RenderInput {
    let l = lookup();
    let catalog_images = v
        .enabled_catalogs
        .iter()
        .map(|c| {
            (
                *c,
                catalogs::select_image(
                    *c,
                    v.catalog_minor(),
                    None,
                    v.catalog_candidates,
                    &v.registry_overrides,
                    &l,
                ),
            )
        })
        .collect();
    let mut external = BTreeMap::new();
    external.insert(v.kubeconfig_secret.clone(), "kubeconfig-v1".to_string());
    RenderInput {
        catalog_images,
        held_catalogs: Vec::new(),
        pki: PkiInput {
            ca: CertMaterial {
                cert_pem: pem("CERTIFICATE", "TEST-CA"),
                key_pem: pem("PRIVATE KEY", "TEST-CA-KEY"),
                not_before: t(1_800_000_000),
                not_after: t(2_100_000_000),
            },
            packageserver: CertMaterial {
                cert_pem: pem("CERTIFICATE", "TEST-PACKAGESERVER"),
                key_pem: pem("PRIVATE KEY", "TEST-PACKAGESERVER-KEY"),
                not_before: t(1_800_000_000),
                not_after: t(1_830_000_000),
            },
            packageserver_sans_fingerprint: "0011223344556677".into(),
            previous_ca_pem: None,
            metrics: None,
        },
        tunnel: TunnelKeys {
            gateway_private_key: "R0FURVdBWS1QUklWQVRFLUtFWS1URVNULTAwMDAwMDA=".into(),
            gateway_public_key: "R0FURVdBWS1QVUJMSUMtS0VZLVRFU1QtMDAwMDAwMDA=".into(),
            agent_private_key: "QUdFTlQtUFJJVkFURS1LRVktVEVTVC0wMDAwMDAwMDA=".into(),
            agent_public_key: "QUdFTlQtUFVCTElDLUtFWS1URVNULTAwMDAwMDAwMDA=".into(),
            rotation_phase: "Idle",
            ..TunnelKeys::default()
        },
        packageserver_cluster_ip: None,
        service_monitors_served: false,
        management_has_scc: false,
        egress_isolation: Vec::new(),
        guest_olm_crds_ready: ready,
        external_secret_hashes: external,
        owner: None,
        valid: v,
    }
}

pub fn with_live_facts(mut i: RenderInput) -> RenderInput {
    i.packageserver_cluster_ip = Some("172.30.12.34".into());
    // the runtime always has metrics certificates; the cluster serves ServiceMonitors
    let leaf = |n: &str| CertMaterial {
        cert_pem: pem("CERTIFICATE", n),
        key_pem: pem("PRIVATE KEY", &format!("{n}-KEY")),
        not_before: t(1_800_000_000),
        not_after: t(1_830_000_000),
    };
    i.pki.metrics = Some(hcp_olm_controlplane::render::MetricsPki {
        catalog_operator: leaf("TEST-CATALOG-OPERATOR-METRICS"),
        olm_operator: leaf("TEST-OLM-OPERATOR-METRICS"),
        client: leaf("TEST-METRICS-CLIENT"),
    });
    i.service_monitors_served = true;
    i.tunnel.gateway_endpoint = Some("203.0.113.10:31820".into());
    i.owner = Some(Owner {
        api_version: "olm.hcp-olm.io/v1alpha1".into(),
        kind: "HostedOLM".into(),
        name: "olm".into(),
        uid: "00000000-0000-0000-0000-000000000001".into(),
    });
    i
}
