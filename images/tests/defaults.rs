//! The image references the controller renders by default and the one `manifests/` installs
//! are exactly what `make images` names (a drifted name is an ImagePullBackOff for users).

use hcp_olm_controlplane::validate::ControllerDefaults;
use hcp_olm_images::{DEFAULT_REGISTRY, IMAGES, reference};

fn produced(name: &str) -> String {
    let def = IMAGES
        .iter()
        .find(|d| d.name == name)
        .unwrap_or_else(|| panic!("make images builds no {name}"));
    reference(DEFAULT_REGISTRY, def, env!("CARGO_PKG_VERSION"))
}

#[test]
fn controller_defaults_and_manifests_name_the_images_we_build() {
    let d = ControllerDefaults::default();
    assert_eq!(d.catalog_server_image, produced("hcp-olm-catalog-server"));
    assert_eq!(d.tunnel_gateway_image, produced("hcp-olm-tunnel-gateway"));
    assert_eq!(d.guest_agent_image, produced("hcp-olm-guest-agent"));
    let deployment = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../manifests/controller/deployment.yaml"
    ))
    .expect("manifests/controller/deployment.yaml");
    let images: Vec<&str> = deployment
        .lines()
        .filter_map(|l| l.trim().strip_prefix("image: "))
        .collect();
    assert_eq!(images, [produced("hcp-olm-controller").as_str()]);
}
