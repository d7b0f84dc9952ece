//! Validation reasons and fixture parsing.

mod common;

use std::collections::BTreeMap;

use hcp_olm_controlplane::hostedolm::{
    CatalogPlacement, CatalogServerKind, HostedOLMSpec, ImageOverrides,
};
use hcp_olm_controlplane::validate::{
    self, AvailabilityPolicy, ReasonCode, ReleaseFacts, Severity,
};

fn codes(
    r: Result<validate::ValidInput, Vec<validate::ConditionReason>>,
) -> Vec<(ReasonCode, String)> {
    r.expect_err("must be invalid")
        .into_iter()
        .map(|c| (c.code, c.field))
        .collect()
}

#[test]
fn all_fixtures_parse_and_validate() {
    let kv = common::valid(&common::load_hc("kubevirt-complex-flags.yaml"), None);
    assert_eq!(kv.cluster.hcp_namespace, "clusters-test1");
    assert_eq!(kv.availability, AvailabilityPolicy::HighlyAvailable);
    assert_eq!(kv.tolerations.len(), 2);
    let aws = common::valid(&common::load_hc("aws-default-flags.yaml"), None);
    assert_eq!(aws.cluster.hcp_namespace, "clusters-cesar");
    assert_eq!(aws.placement, CatalogPlacement::Management);
    assert_eq!(aws.enabled_catalogs.len(), 3);
    let none = common::valid(&common::load_hc("none-minimal.yaml"), None);
    assert_eq!(none.release_version, semver::Version::new(4, 18, 3));
}

#[test]
fn release_without_version_is_degraded_naming_the_field() {
    let hc = common::load_hc("aws-default-flags.yaml");
    let r = validate::validate(
        &hc,
        None,
        &ReleaseFacts {
            version: None,
            ..common::facts()
        },
        &common::defaults(),
    );
    let errs = r.expect_err("no version");
    assert_eq!(errs.len(), 1);
    assert_eq!(errs[0].code, ReasonCode::MissingReleaseVersion);
    assert_eq!(errs[0].code.severity(), Severity::Degraded);
    assert_eq!(errs[0].field, "HostedCluster.spec.release.image");
    assert!(errs[0].message.contains("fakeReleaseImage"));

    let r = validate::validate(
        &hc,
        None,
        &ReleaseFacts {
            version: Some("four".into()),
            ..common::facts()
        },
        &common::defaults(),
    );
    assert_eq!(codes(r)[0].0, ReasonCode::InvalidReleaseVersion);

    // HyperShift's status.version.desired.version is a fallback.
    let mut hc2 = hc.clone();
    hc2.status = Some(
        serde_json::from_value(serde_json::json!({"version": {"desired": {"version": "4.19.1"}}}))
            .unwrap(),
    );
    let v = validate::validate(
        &hc2,
        None,
        &ReleaseFacts {
            version: None,
            ..common::facts()
        },
        &common::defaults(),
    )
    .unwrap();
    assert_eq!(v.release_version, semver::Version::new(4, 19, 1));
}

#[test]
fn unknown_olm_image_is_progressing() {
    let hc = common::load_hc("none-minimal.yaml");
    let errs = validate::validate(
        &hc,
        None,
        &ReleaseFacts {
            olm_image: None,
            ..common::facts()
        },
        &common::defaults(),
    )
    .unwrap_err();
    assert_eq!(errs.len(), 1);
    assert_eq!(errs[0].code, ReasonCode::WaitingForReleaseInfo);
    assert_eq!(errs[0].code.severity(), Severity::Progressing);
}

#[test]
fn unreadable_payload_is_degraded_unless_overridden() {
    use hcp_olm_controlplane::validate::PayloadProblem;
    let hc = common::load_hc("none-minimal.yaml");
    for (problem, code) in [
        (
            PayloadProblem::Unreadable("no image-references".into()),
            ReasonCode::ReleasePayloadUnreadable,
        ),
        (
            PayloadProblem::OLMImageMissing("names no operator-lifecycle-manager".into()),
            ReasonCode::OLMImageNotInPayload,
        ),
    ] {
        let facts = ReleaseFacts {
            olm_image: None,
            operator_registry_image: None,
            payload_problem: Some(problem),
            ..common::facts()
        };
        let errs = validate::validate(&hc, None, &facts, &common::defaults()).unwrap_err();
        assert_eq!(errs.len(), 1, "{errs:?}");
        assert_eq!(errs[0].code, code);
        assert_eq!(errs[0].code.severity(), Severity::Degraded);
        assert!(
            errs[0].message.contains("spec.images.olm"),
            "{}",
            errs[0].message
        );
        // An override wins over the payload.
        let ov: hcp_olm_controlplane::hostedolm::HostedOLMSpec = serde_json::from_value(
            serde_json::json!({"images": {"olm": "quay.io/x/olm@sha256:".to_string() + &"c".repeat(64)}}),
        )
        .unwrap();
        let v = validate::validate(&hc, Some(&ov), &facts, &common::defaults()).unwrap();
        assert!(v.images.olm.starts_with("quay.io/x/olm@"));
        assert_eq!(v.images.operator_registry, v.images.olm);
    }
}

#[test]
fn bad_hosted_cluster_fields_are_each_reported() {
    let mut hc = common::load_hc("none-minimal.yaml");
    hc.spec.olm_catalog_placement = Some("elsewhere".into());
    hc.spec.controller_availability_policy = Some("Sometimes".into());
    let mut ann = BTreeMap::new();
    ann.insert(
        "hypershift.openshift.io/olm-catalogs-is-registry-overrides".to_string(),
        "broken".to_string(),
    );
    ann.insert(
        "hypershift.openshift.io/redhat-operators-catalog-image".to_string(),
        "quay.io/x:latest".to_string(),
    );
    hc.metadata.annotations = Some(ann);
    let c = codes(validate::validate(
        &hc,
        None,
        &common::facts(),
        &common::defaults(),
    ));
    let got: Vec<ReasonCode> = c.iter().map(|(c, _)| *c).collect();
    for want in [
        ReasonCode::InvalidCatalogPlacement,
        ReasonCode::InvalidAvailabilityPolicy,
        ReasonCode::InvalidCatalogPin,
    ] {
        assert!(got.contains(&want), "missing {want:?} in {c:?}");
    }
}

/// Issue 37 item 4: `spec.pausedUntil` as HyperShift reads it (support/util
/// pausereconcile: Go's `strconv.ParseBool`, then RFC 3339; anything else is
/// "not paused", never an error that stops the cluster).
#[test]
fn paused_until_is_read_as_hypershift_reads_it() {
    let t = |s: &str| {
        time::OffsetDateTime::parse(s, &time::format_description::well_known::Rfc3339).unwrap()
    };
    let now = t("2029-06-01T00:00:00Z");
    for (value, paused, warned) in [
        ("true", true, false),
        ("True", true, false),
        ("TRUE", true, false),
        ("t", true, false),
        ("T", true, false),
        ("1", true, false),
        ("false", false, false),
        ("False", false, false),
        ("FALSE", false, false),
        ("f", false, false),
        ("0", false, false),
        ("2030-01-01T00:00:00Z", true, false),
        ("2020-01-01T00:00:00+02:00", false, false),
        ("tomorrow", false, true),
        ("yes", false, true),
        ("", false, true),
    ] {
        let mut hc = common::load_hc("none-minimal.yaml");
        hc.spec.paused_until = Some(value.into());
        let v = validate::validate(&hc, None, &common::facts(), &common::defaults())
            .unwrap_or_else(|e| panic!("pausedUntil {value:?} refused the cluster: {e:?}"));
        assert_eq!(
            v.paused_until.is_paused(now),
            paused,
            "pausedUntil {value:?}"
        );
        assert_eq!(
            v.paused_until_warning.is_some(),
            warned,
            "pausedUntil {value:?}: warning {:?}",
            v.paused_until_warning
        );
    }
}

#[test]
fn invalid_overrides_are_reported() {
    let hc = common::load_hc("none-minimal.yaml");
    let ov = HostedOLMSpec {
        images: Some(ImageOverrides {
            olm: Some("has space".into()),
            catalogs: BTreeMap::from([
                (
                    "redhat-marketplace".to_string(),
                    format!("r@sha256:{}", "a".repeat(64)),
                ),
                (
                    "community-operators".to_string(),
                    "quay.io/c:v4.18".to_string(),
                ),
            ]),
            ..Default::default()
        }),
        max_catalog_version: Some("latest".into()),
        catalog_fallback_minors: Some(99),
        ..Default::default()
    };
    let c = codes(validate::validate(
        &hc,
        Some(&ov),
        &common::facts(),
        &common::defaults(),
    ));
    let fields: Vec<&str> = c.iter().map(|(_, f)| f.as_str()).collect();
    for f in [
        "HostedOLM.spec.images.olm",
        "HostedOLM.spec.images.catalogs[redhat-marketplace]",
        "HostedOLM.spec.images.catalogs[community-operators]",
        "HostedOLM.spec.maxCatalogVersion",
        "HostedOLM.spec.catalogFallbackMinors",
    ] {
        assert!(fields.contains(&f), "missing {f} in {fields:?}");
    }
}

#[test]
fn valid_overrides_apply() {
    let mut hc = common::load_hc("none-minimal.yaml");
    hc.spec.paused_until = Some("2030-01-01T00:00:00Z".into());
    let pin = format!("mirror.example/community@sha256:{}", "c".repeat(64));
    let ov = HostedOLMSpec {
        catalog_placement: Some(CatalogPlacement::Guest),
        default_catalogs: Some(vec![
            hcp_olm_controlplane::catalogs::DefaultCatalog::CommunityOperators,
        ]),
        images: Some(ImageOverrides {
            catalogs: BTreeMap::from([("community-operators".to_string(), pin.clone())]),
            ..Default::default()
        }),
        max_catalog_version: Some("4.16".into()),
        catalog_server: Some(CatalogServerKind::HcpOlm),
        ..Default::default()
    };
    let v = validate::validate(&hc, Some(&ov), &common::facts(), &common::defaults()).unwrap();
    assert_eq!(v.placement, CatalogPlacement::Guest);
    assert_eq!(v.catalog_server, CatalogServerKind::HcpOlm);
    assert_eq!(
        v.enabled_catalogs,
        vec![hcp_olm_controlplane::catalogs::DefaultCatalog::CommunityOperators]
    );
    assert_eq!(v.catalog_pins.values().next(), Some(&pin));
    assert_eq!(v.catalog_minor().to_string(), "4.16");
    let t = |s: &str| {
        time::OffsetDateTime::parse(s, &time::format_description::well_known::Rfc3339).unwrap()
    };
    assert!(v.paused_until.is_paused(t("2029-12-31T23:59:59Z")));
    assert!(!v.paused_until.is_paused(t("2030-01-01T00:00:01Z")));
}

#[test]
fn admin_kubeconfig_comes_from_status() {
    let mut hc = common::load_hc("none-minimal.yaml");
    assert_eq!(hc.admin_kubeconfig_secret(), None);
    hc.status = Some(
        serde_json::from_value(
            serde_json::json!({"kubeconfig": {"name": "example-admin-kubeconfig"}}),
        )
        .unwrap(),
    );
    assert_eq!(
        hc.admin_kubeconfig_secret(),
        Some((
            "clusters".to_string(),
            "example-admin-kubeconfig".to_string()
        ))
    );
}

#[test]
fn guest_networks_come_from_spec_networking_and_bad_cidrs_are_named() {
    let mut hc = common::load_hc("none-minimal.yaml");
    let v = common::valid(&hc, None);
    assert_eq!(v.guest_service_cidrs, ["172.31.0.0/16"]);
    assert_eq!(v.guest_pod_cidrs, ["10.132.0.0/14"]);
    assert_eq!(
        validate::guest_dns_address(&v.guest_service_cidrs),
        Some("172.31.0.10".parse().unwrap())
    );
    // absent: OpenShift's defaults
    hc.spec.networking = None;
    let v = common::valid(&hc, None);
    assert_eq!(v.guest_service_cidrs, [validate::DEFAULT_SERVICE_CIDR]);
    assert_eq!(v.guest_pod_cidrs, [validate::DEFAULT_POD_CIDR]);
    let networking_codes = |hc: &mut hcp_olm_controlplane::hostedcluster::HostedCluster,
                            networking: serde_json::Value| {
        hc.spec.networking = Some(serde_json::from_value(networking).unwrap());
        codes(validate::validate(
            hc,
            None,
            &common::facts(),
            &common::defaults(),
        ))
    };
    // garbage is refused with the field; IPv6 entries are kept (dual-stack)
    let got = networking_codes(
        &mut hc,
        serde_json::json!({
            "serviceNetwork": [{"cidr": "fd02::/112"}, {"cidr": "172.30.0.0/16"}],
            "clusterNetwork": [{"cidr": "10.128.0.0/33"}]
        }),
    );
    assert_eq!(
        got,
        [(
            ReasonCode::InvalidNetworking,
            "HostedCluster.spec.networking.clusterNetwork[0].cidr".to_string()
        )]
    );
    // Issue 19: IPv6-only and dual-stack guests are served on their own ranges (before:
    // IPv6-only was refused as InvalidNetworking, dual-stack served over IPv4 alone)
    hc.spec.networking = Some(
        serde_json::from_value(serde_json::json!({
            "serviceNetwork": [{"cidr": "fd02::/112"}],
            "clusterNetwork": [{"cidr": "fd01::/48"}]
        }))
        .unwrap(),
    );
    let v = common::valid(&hc, None);
    assert_eq!(v.guest_service_cidrs, ["fd02::/112"]);
    assert_eq!(v.guest_pod_cidrs, ["fd01::/48"]);
    assert_eq!(
        validate::guest_dns_address(&v.guest_service_cidrs),
        Some("fd02::a".parse().unwrap())
    );
    hc.spec.networking = Some(
        serde_json::from_value(serde_json::json!({
            "serviceNetwork": [{"cidr": "fd02::/112"}, {"cidr": "172.30.0.0/16"}],
            "clusterNetwork": [{"cidr": "10.128.0.0/14"}, {"cidr": "fd01::/48"}]
        }))
        .unwrap(),
    );
    let v = common::valid(&hc, None);
    assert_eq!(v.guest_service_cidrs, ["fd02::/112", "172.30.0.0/16"]);
    assert_eq!(v.guest_pod_cidrs, ["10.128.0.0/14", "fd01::/48"]);
    // a HostedCluster owner does not get to size the tunnel's routes and DNS zones
    let many: Vec<serde_json::Value> = (0..17)
        .map(|i| serde_json::json!({"cidr": format!("10.{i}.0.0/16")}))
        .collect();
    let got = networking_codes(
        &mut hc,
        serde_json::json!({"serviceNetwork": [{"cidr": "172.30.0.0/16"}], "clusterNetwork": many}),
    );
    assert_eq!(
        got,
        [(
            ReasonCode::InvalidNetworking,
            "HostedCluster.spec.networking.clusterNetwork".to_string()
        )]
    );
    let got = networking_codes(
        &mut hc,
        serde_json::json!({
            "serviceNetwork": [{"cidr": "fd02::/129"}],
            "clusterNetwork": [{"cidr": "fd01::/48"}]
        }),
    );
    assert_eq!(
        got,
        [(
            ReasonCode::InvalidNetworking,
            "HostedCluster.spec.networking.serviceNetwork[0].cidr".to_string()
        )]
    );
}

/// HyperShift skips a malformed `olm-catalogs-is-registry-overrides` pair and keeps the rest;
/// so do we, with a warning naming the field, never Degraded (issue 13, item 3).
#[test]
fn malformed_registry_override_pairs_are_skipped_with_a_warning() {
    let mut hc = common::load_hc("none-minimal.yaml");
    hc.metadata.annotations.get_or_insert_default().insert(
        "hypershift.openshift.io/olm-catalogs-is-registry-overrides".to_string(),
        "broken,registry.redhat.io=quay.io/org,quay.io=elsewhere.example".to_string(),
    );
    let v = common::valid(&hc, None);
    assert_eq!(v.registry_overrides.len(), 2, "{:?}", v.registry_overrides);
    assert_eq!(
        v.registry_override_warnings.len(),
        2,
        "{:?}",
        v.registry_override_warnings
    );
    assert!(v.registry_override_warnings[0].contains("\"broken\""));
    assert!(v.registry_override_warnings[0].contains("olm-catalogs-is-registry-overrides"));
    assert!(v.registry_override_warnings[1].contains("\"quay.io\" does not apply"));
    assert_eq!(
        hcp_olm_controlplane::catalogs::catalog_registries(&v.registry_overrides),
        ["quay.io/org"]
    );
    // a flood of junk is bounded
    hc.metadata.annotations.get_or_insert_default().insert(
        "hypershift.openshift.io/olm-catalogs-is-registry-overrides".to_string(),
        "x,".repeat(10_000),
    );
    let v = common::valid(&hc, None);
    assert!(v.registry_override_warnings.len() <= 6);
    assert!(
        v.registry_override_warnings
            .iter()
            .map(String::len)
            .sum::<usize>()
            < 2_000
    );
}

/// Catalog minors are capped as HyperShift caps them (4.22) unless the HostedOLM says
/// otherwise (issue 13, item 4).
#[test]
fn catalog_minor_is_capped_at_hypershifts_newest() {
    use hcp_olm_controlplane::catalogs::MinorVersion;
    let hc = common::load_hc("none-minimal.yaml");
    let mut v = common::valid(&hc, None);
    v.release_version = semver::Version::new(4, 23, 1);
    assert_eq!(v.catalog_minor(), MinorVersion::new(4, 22));
    v.release_version = semver::Version::new(5, 0, 0);
    assert_eq!(v.catalog_minor(), MinorVersion::new(4, 22));
    v.release_version = semver::Version::new(4, 18, 3);
    assert_eq!(v.catalog_minor(), MinorVersion::new(4, 18));
}

/// An unset `controllerAvailabilityPolicy` is HyperShift's default, HighlyAvailable
/// (issue 13, item 9).
#[test]
fn availability_defaults_to_highly_available_as_in_hypershift() {
    use hcp_olm_controlplane::validate::AvailabilityPolicy;
    let mut hc = common::load_hc("none-minimal.yaml");
    hc.spec.controller_availability_policy = None;
    assert_eq!(
        common::valid(&hc, None).availability,
        AvailabilityPolicy::HighlyAvailable
    );
    hc.spec.controller_availability_policy = Some("SingleReplica".into());
    assert_eq!(
        common::valid(&hc, None).availability,
        AvailabilityPolicy::SingleReplica
    );
}

/// A HostedOLM override whose source does not apply to the default catalogs is a warning
/// too (review finding: it was accepted and silently ignored).
#[test]
fn hosted_olm_overrides_that_do_not_apply_are_warned_about() {
    let hc = common::load_hc("none-minimal.yaml");
    let ov: hcp_olm_controlplane::hostedolm::HostedOLMSpec = serde_json::from_value(serde_json::json!({
        "registryOverrides": [
            {"source": "registry.redhat.io/redhat/redhat-operator-index", "mirror": "m.example/x"},
            {"source": "registry.redhat.io", "mirror": "m.example"},
        ]
    }))
    .unwrap();
    let v = common::valid(&hc, Some(&ov));
    assert_eq!(
        v.registry_override_warnings.len(),
        1,
        "{:?}",
        v.registry_override_warnings
    );
    assert!(v.registry_override_warnings[0].starts_with("HostedOLM.spec.registryOverrides"));
    assert_eq!(
        hcp_olm_controlplane::catalogs::catalog_registries(&v.registry_overrides),
        ["m.example/redhat"]
    );
}

/// Issue 19, bad input: a guest range of /0 (every address would be routed into the tunnel),
/// a guest range overlapping the tunnel's own 100.127.255.0/30 or its IPv6 pair
/// fd9c:4f1e:7a2b:ffff::/126, and a tunnel address that is
/// link-local, unspecified or multicast are each refused naming the field.
#[test]
fn catch_all_or_overlapping_ranges_and_unusable_tunnel_addresses_are_refused() {
    let mut hc = common::load_hc("none-minimal.yaml");
    for (cidr, what) in [
        ("0.0.0.0/0", "a /0"),
        ("100.127.0.0/16", "overlaps the tunnel"),
        ("100.127.255.2/32", "overlaps the tunnel"),
        ("::/0", "an IPv6 /0"),
        (
            "fd9c:4f1e:7a2b:ffff::/64",
            "overlaps the tunnel's IPv6 pair",
        ),
        (
            "fd9c:4f1e:7a2b:ffff::2/128",
            "overlaps the tunnel's IPv6 pair",
        ),
    ] {
        hc.spec.networking = Some(
            serde_json::from_value(serde_json::json!({
                "serviceNetwork": [{"cidr": "172.30.0.0/16"}],
                "clusterNetwork": [{"cidr": cidr}]
            }))
            .unwrap(),
        );
        let got = codes(validate::validate(
            &hc,
            None,
            &common::facts(),
            &common::defaults(),
        ));
        assert_eq!(
            got,
            [(
                ReasonCode::InvalidNetworking,
                "HostedCluster.spec.networking.clusterNetwork[0].cidr".to_string()
            )],
            "{cidr}: {what}"
        );
    }
    let hc = common::load_hc("none-minimal.yaml");
    for a in ["169.254.10.1", "fe80::1", "0.0.0.0", "224.0.0.1", "::"] {
        let ov = HostedOLMSpec {
            tunnel: Some(hcp_olm_controlplane::hostedolm::TunnelSpec {
                address: Some(a.into()),
                ..Default::default()
            }),
            ..Default::default()
        };
        let got = codes(validate::validate(
            &hc,
            Some(&ov),
            &common::facts(),
            &common::defaults(),
        ));
        assert_eq!(
            got,
            [(
                ReasonCode::InvalidOverride,
                "HostedOLM.spec.tunnel.address".to_string()
            )],
            "{a}"
        );
    }
}
