//! Test catalogs: small file-based catalogs whose bundles carry their manifests inline
//! (`olm.bundle.object`, `image: ""`), so OLM needs no unpack Job, and images (directories)
//! serving them with the real `opm`.

use std::path::Path;

use anyhow::{Result, bail};

use crate::imagetree::Image;
use crate::tools;

/// Writes package `<pkg>` (channel `stable`, one bundle `<pkg>.v0.1.0` owning a CRD
/// `widgets.<pkg>.example.com` and installing Deployment `<pkg>-controller`) under `dir/<pkg>`.
pub fn write_catalog(dir: &Path, pkg: &str) -> Result<()> {
    write_catalog_with(dir, pkg, None)
}

/// [`write_catalog`]; with `bundle_image`, the bundle is that image and the catalog carries
/// no copy of its objects, so OLM runs its bundle-unpack Job to read them.
pub fn write_catalog_with(dir: &Path, pkg: &str, bundle_image: Option<&str>) -> Result<()> {
    use base64::Engine as _;
    let b64 = |v: &serde_json::Value| -> Result<String> {
        Ok(base64::engine::general_purpose::STANDARD.encode(serde_json::to_vec(v)?))
    };
    let (csv, crd) = bundle_objects(pkg);
    let group = format!("{pkg}.example.com");
    let csv_name = format!("{pkg}.v0.1.0");
    let mut properties = vec![
        serde_json::json!({"type": "olm.package", "value": {"packageName": pkg, "version": "0.1.0"}}),
        serde_json::json!({"type": "olm.gvk", "value": {"group": group, "kind": "Widget", "version": "v1"}}),
    ];
    if bundle_image.is_some() {
        // What `opm render` writes for a bundle image: the CSV's metadata, from which opm
        // answers `csvJson` (packageserver builds PackageManifests from it); the objects
        // themselves stay in the image.
        let spec = &csv["spec"];
        properties.push(serde_json::json!({"type": "olm.csv.metadata", "value": {
            "annotations": csv["metadata"]["annotations"],
            "crdDescriptions": spec["customresourcedefinitions"],
            "displayName": spec["displayName"],
            "installModes": spec["installModes"],
            "provider": spec["provider"],
        }}));
    } else {
        properties
            .push(serde_json::json!({"type": "olm.bundle.object", "value": {"data": b64(&csv)?}}));
        properties
            .push(serde_json::json!({"type": "olm.bundle.object", "value": {"data": b64(&crd)?}}));
    }
    let docs = [
        serde_json::json!({"schema": "olm.package", "name": pkg, "defaultChannel": "stable"}),
        serde_json::json!({"schema": "olm.channel", "package": pkg, "name": "stable", "entries": [{"name": csv_name}]}),
        serde_json::json!({"schema": "olm.bundle", "package": pkg, "name": csv_name,
            "image": bundle_image.unwrap_or_default(), "properties": properties}),
    ];
    let pdir = dir.join(pkg);
    std::fs::create_dir_all(&pdir)?;
    let text: Vec<String> = docs.iter().map(|d| d.to_string()).collect();
    std::fs::write(pdir.join("catalog.json"), text.join("\n"))?;
    Ok(())
}

/// The image the widget operators' CSVs run unless told otherwise.
pub const WIDGET_OPERATOR_IMAGE: &str = "registry.test/widget-operator:v0.1.0";

/// The ClusterServiceVersion `<pkg>.v0.1.0` and the CRD it owns of package `pkg` (the
/// operator's image: [`WIDGET_OPERATOR_IMAGE`]).
pub fn bundle_objects(pkg: &str) -> (serde_json::Value, serde_json::Value) {
    bundle_objects_with(pkg, WIDGET_OPERATOR_IMAGE)
}

/// [`bundle_objects`] whose operator runs `operator_image`, as a non-root user that a
/// namespace enforcing the `restricted` Pod Security level admits.
pub fn bundle_objects_with(
    pkg: &str,
    operator_image: &str,
) -> (serde_json::Value, serde_json::Value) {
    let group = format!("{pkg}.example.com");
    let crd = serde_json::json!({
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": format!("widgets.{group}")},
        "spec": {"group": group, "scope": "Namespaced",
                 "names": {"plural": "widgets", "singular": "widget", "kind": "Widget", "listKind": "WidgetList"},
                 "versions": [{"name": "v1", "served": true, "storage": true,
                               "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}}]}
    });
    let csv_name = format!("{pkg}.v0.1.0");
    let csv = serde_json::json!({
        "apiVersion": "operators.coreos.com/v1alpha1", "kind": "ClusterServiceVersion",
        "metadata": {"name": csv_name, "annotations": {"alm-examples": "[]", "capabilities": "Basic Install"}},
        "spec": {
            "displayName": pkg, "version": "0.1.0", "provider": {"name": "hcp-olm tests"},
            "installModes": [
                {"type": "OwnNamespace", "supported": true}, {"type": "SingleNamespace", "supported": true},
                {"type": "MultiNamespace", "supported": false}, {"type": "AllNamespaces", "supported": true}],
            "customresourcedefinitions": {"owned": [{"name": format!("widgets.{group}"), "version": "v1", "kind": "Widget", "displayName": "Widget", "description": "a widget"}]},
            "install": {"strategy": "deployment", "spec": {"deployments": [{
                "name": format!("{pkg}-controller"),
                "spec": {"replicas": 1, "selector": {"matchLabels": {"app": pkg}},
                         "template": {"metadata": {"labels": {"app": pkg}},
                                      "spec": {
                                          "securityContext": {"runAsNonRoot": true, "seccompProfile": {"type": "RuntimeDefault"}},
                                          "containers": [{"name": "manager", "image": operator_image,
                                              "securityContext": {"allowPrivilegeEscalation": false, "capabilities": {"drop": ["ALL"]}}}]}}}}],
                "permissions": [], "clusterPermissions": []}}
        }
    });
    (csv, crd)
}

/// An index image as a tree of files: opm, `/configs` with package `pkg` (its bundle the image
/// `bundle_image`, else its objects inline; see [`write_catalog_with`]), and the cache opm
/// built for it in `/tmp/cache`.
pub fn index_image_with(
    work: &Path,
    name: &str,
    pkg: &str,
    bundle_image: Option<&str>,
) -> Result<Image> {
    let configs = work.join(format!("{name}-configs"));
    write_catalog_with(&configs, pkg, bundle_image)?;
    let cache = work.join(format!("{name}-cache"));
    let opm = tools::bin("opm")?;
    let out = std::process::Command::new(&opm)
        .arg("serve")
        .arg(&configs)
        .args(["--cache-only", "--pprof-addr=127.0.0.1:0", "--cache-dir"])
        .arg(&cache)
        .output()?;
    if !out.status.success() {
        bail!(
            "opm cache for {name}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(Image::new()
        .file("/bin/opm", &opm)
        .tree("/configs", configs)
        .tree("/tmp/cache", cache)
        .entrypoint(&["/bin/opm"]))
}

/// The OLM image: catalog-operator, olm-operator, package-server, copy-content, cpb (the
/// bundle-unpack Job's copier) and `cp`.
pub fn olm_image() -> Result<Image> {
    let mut img = Image::new().with_host_libraries();
    for b in ["catalog", "olm", "package-server", "copy-content", "cpb"] {
        img = img.file(&format!("/bin/{b}"), tools::bin(b)?);
    }
    Ok(img.file("/bin/cp", "/usr/bin/cp"))
}
