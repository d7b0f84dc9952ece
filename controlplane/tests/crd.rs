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

/// What `kubectl explain hostedolm` and `kubectl get hcp-olm` rely on, and the validation the
/// real API server applies to the checked-in CRD: a malformed `maxCatalogVersion` or an empty
/// `keyRotation` is refused at admission, naming the field; conditions are a map keyed by type.
#[tokio::test]
async fn the_api_server_enforces_the_schema() -> anyhow::Result<()> {
    use hcp_olm_controlplane::hostedolm::HostedOLM;
    use kube::api::{Api, PostParams};
    let crd: serde_json::Value =
        serde_yaml_ng::from_str(&hcp_olm_controlplane::hostedolm::crd_yaml()?)?;
    let schema = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"];
    anyhow::ensure!(
        schema["description"]
            .as_str()
            .is_some_and(|d| d.starts_with("HostedOLM: OLM for one HyperShift hosted cluster")),
        "top-level description"
    );
    let conditions = &schema["properties"]["status"]["properties"]["conditions"];
    assert_eq!(conditions["x-kubernetes-list-type"], "map");
    assert_eq!(conditions["x-kubernetes-list-map-keys"][0], "type");
    assert_eq!(crd["spec"]["names"]["categories"][0], "hcp-olm");

    let cluster = hcp_olm_e2e::Cluster::start(hcp_olm_e2e::ClusterOptions::new("crd")).await?;
    cluster
        .install_crds(&[
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../manifests/crds/hostedolm.yaml")
        ])
        .await?;
    cluster.ensure_namespace("hcp").await?;
    let api: Api<HostedOLM> = Api::namespaced(cluster.client(), "hcp");
    let make = |name: &str, spec: serde_json::Value| -> anyhow::Result<HostedOLM> {
        Ok(serde_json::from_value(serde_json::json!({
            "apiVersion": "olm.hcp-olm.io/v1alpha1", "kind": "HostedOLM",
            "metadata": {"name": name}, "spec": spec,
        }))?)
    };
    for (name, spec, field) in [
        (
            "bad-minor",
            serde_json::json!({"maxCatalogVersion": "four"}),
            "spec.maxCatalogVersion",
        ),
        (
            "bad-rotation",
            serde_json::json!({"tunnel": {"keyRotation": ""}}),
            "spec.tunnel.keyRotation",
        ),
    ] {
        let err = api
            .create(&PostParams::default(), &make(name, spec)?)
            .await
            .expect_err("invalid spec accepted");
        let msg = err.to_string();
        anyhow::ensure!(msg.contains(field), "{name}: {msg}");
    }
    api.create(
        &PostParams::default(),
        &make("good", serde_json::json!({"maxCatalogVersion": "4.22", "tunnel": {"keyRotation": "2026-11-23"}}))?,
    )
    .await?;
    Ok(())
}
