//! Golden-file tests: render fixtures and variants, compare with tests/golden/*.yaml.
//! `UPDATE_GOLDEN=1 cargo test -p hcp-olm-controlplane --test golden` rewrites them.

mod common;

use std::path::PathBuf;

use hcp_olm_controlplane::hostedcluster::{ClusterConfiguration, HostedCluster};
use hcp_olm_controlplane::hostedolm::{CatalogServerKind, HostedOLMSpec};
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
