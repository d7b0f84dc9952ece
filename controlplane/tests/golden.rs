//! Golden-file tests: render fixtures and variants, compare with tests/golden/*.yaml.
//! `UPDATE_GOLDEN=1 cargo test -p hcp-olm-controlplane --test golden` rewrites them.

mod common;

use std::path::PathBuf;

use hcp_olm_controlplane::hostedcluster::{ClusterConfiguration, HostedCluster};
use hcp_olm_controlplane::hostedolm::{CatalogServerKind, CatalogSharing, HostedOLMSpec};
use hcp_olm_controlplane::operatorhub::{HubSource, OperatorHubSpec};
use hcp_olm_controlplane::render::{self, RenderInput};

fn golden(name: &str, input: &RenderInput) {
    let d = render::desired(input).expect("render");
    let mut text = render::to_yaml(&d).expect("yaml");
    text.push_str("---\n# pending:\n");
    for p in &d.pending {
        text.push_str(&format!(
            "#   {:?} {} {}: {}\n",
            p.severity, p.component, p.reason, p.message
        ));
    }
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/golden")
        .join(format!("{name}.yaml"));
    if std::env::var("UPDATE_GOLDEN").as_deref() == Ok("1") {
        std::fs::write(&path, &text).expect("write golden");
        return;
    }
    let want = std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!(
            "{}: {e}; run with UPDATE_GOLDEN=1 to create it",
            path.display()
        )
    });
    pretty_assertions::assert_eq!(
        want,
        text,
        "golden file {} differs (UPDATE_GOLDEN=1 rewrites)",
        path.display()
    );
}

fn hub(hc: &mut HostedCluster, h: OperatorHubSpec) {
    hc.spec.configuration = Some(ClusterConfiguration {
        operatorhub: Some(h),
        api_server: None,
    });
}

#[test]
fn aws_default_flags_live() {
    let hc = common::load_hc("aws-default-flags.yaml");
    golden(
        "aws-default-live",
        &common::with_live_facts(common::input(common::valid(&hc, None), true)),
    );
}

#[test]
fn kubevirt_highly_available() {
    let hc = common::load_hc("kubevirt-complex-flags.yaml");
    golden(
        "kubevirt-ha",
        &common::with_live_facts(common::input(common::valid(&hc, None), true)),
    );
}

#[test]
fn none_minimal_waiting() {
    let hc = common::load_hc("none-minimal.yaml");
    golden(
        "none-minimal-waiting",
        &common::input(common::valid(&hc, None), false),
    );
}

#[test]
fn none_guest_placement() {
    let mut hc = common::load_hc("none-minimal.yaml");
    hc.spec.olm_catalog_placement = Some("guest".into());
    golden(
        "none-guest",
        &common::with_live_facts(common::input(common::valid(&hc, None), true)),
    );
}

#[test]
fn none_disable_all_default_sources() {
    let mut hc = common::load_hc("none-minimal.yaml");
    hub(
        &mut hc,
        OperatorHubSpec {
            disable_all_default_sources: Some(true),
            sources: vec![],
        },
    );
    golden(
        "none-disable-all",
        &common::with_live_facts(common::input(common::valid(&hc, None), true)),
    );
}

#[test]
fn none_one_source_disabled() {
    let mut hc = common::load_hc("none-minimal.yaml");
    hub(
        &mut hc,
        OperatorHubSpec {
            disable_all_default_sources: None,
            sources: vec![HubSource {
                name: "certified-operators".into(),
                disabled: true,
            }],
        },
    );
    golden(
        "none-one-disabled",
        &common::with_live_facts(common::input(common::valid(&hc, None), true)),
    );
}

#[test]
fn none_hcp_olm_catalog_server() {
    let hc = common::load_hc("none-minimal.yaml");
    let ov = HostedOLMSpec {
        catalog_server: Some(CatalogServerKind::HcpOlm),
        ..Default::default()
    };
    golden(
        "none-hcp-olm-catalog-server",
        &common::with_live_facts(common::input(common::valid(&hc, Some(&ov)), true)),
    );
}

/// Issue 18: with catalog sharing on, the HCP namespace has no catalog Deployment, Service
/// or NetworkPolicy of its own; the guest CatalogSources, the tunnel's exposed catalogs and
/// NO_PROXY name the shared Services in hcp-olm-catalogs.
#[test]
fn aws_default_shared_catalogs() {
    let hc = common::load_hc("aws-default-flags.yaml");
    let ov = HostedOLMSpec {
        catalog_sharing: Some(CatalogSharing::Shared),
        ..Default::default()
    };
    let mut v = common::valid(&hc, Some(&ov));
    v.lookup_credentials_are_own = true;
    golden(
        "aws-default-shared",
        &common::with_live_facts(common::input(v, true)),
    );
}

/// Issue 18: the objects of the shared namespace for one catalog used by two HCP namespaces.
#[test]
fn shared_catalog_objects() {
    use hcp_olm_controlplane::catalogs::DefaultCatalog;
    use hcp_olm_controlplane::render::shared::{self, SharedSettings};
    use hcp_olm_controlplane::sharing::{SharedCatalog, SharedKey};
    let c = SharedCatalog {
        key: SharedKey::new(DefaultCatalog::RedhatOperators, "4.18").expect("key"),
        image: format!(
            "registry.redhat.io/redhat/redhat-operator-index@sha256:{}",
            "c".repeat(64)
        ),
        users: ["clusters-b", "clusters-a"]
            .into_iter()
            .map(String::from)
            .collect(),
    };
    let s = SharedSettings {
        catalog_server_image: "quay.io/hcp-olm/hcp-olm-catalog-server:test".into(),
        utilities_image: "quay.io/operator-framework/olm:v0.46.0".into(),
        image_pull_secret: None,
        management_has_scc: false,
    };
    let mut objs = vec![shared::namespace(), shared::service_account()];
    objs.extend(shared::catalog(&c, &s));
    let d = render::Desired {
        hcp: objs,
        ..Default::default()
    };
    let text = render::to_yaml(&d).expect("yaml");
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/golden/shared-catalogs.yaml");
    if std::env::var("UPDATE_GOLDEN").as_deref() == Ok("1") {
        std::fs::write(&path, &text).expect("write golden");
        return;
    }
    let want = std::fs::read_to_string(&path).expect("golden file (UPDATE_GOLDEN=1 creates it)");
    pretty_assertions::assert_eq!(want, text, "golden file {} differs", path.display());
}
