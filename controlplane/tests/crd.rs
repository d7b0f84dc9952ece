//! CI drift check: manifests/crds/hostedolm.yaml must equal the generated CRD.
//! Regenerate with `cargo run -p hcp-olm-controlplane --bin hcp-olm-controller -- crd > manifests/crds/hostedolm.yaml`.

use std::path::PathBuf;

#[test]
fn checked_in_crd_matches_generated() {
    let generated = hcp_olm_controlplane::hostedolm::crd_yaml().unwrap();
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../manifests/crds/hostedolm.yaml");
    let checked_in =
        std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    pretty_assertions::assert_eq!(
        checked_in,
        generated,
        "manifests/crds/hostedolm.yaml is stale; regenerate it with the `crd` subcommand"
    );
}

#[test]
fn crd_has_status_subresource_and_printer_columns() {
    let crd: serde_json::Value =
        serde_yaml_ng::from_str(&hcp_olm_controlplane::hostedolm::crd_yaml().unwrap()).unwrap();
    let v = &crd["spec"]["versions"][0];
    assert_eq!(crd["spec"]["group"], "olm.hcp-olm.io");
    assert_eq!(crd["spec"]["scope"], "Namespaced");
    assert!(v["subresources"]["status"].is_object());
    let cols: Vec<&str> = v["additionalPrinterColumns"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    for c in ["Placement", "Version", "Available", "Degraded", "Age"] {
        assert!(cols.contains(&c), "{c} missing in {cols:?}");
    }
}
