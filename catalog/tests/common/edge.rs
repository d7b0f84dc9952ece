//! A generated catalog of edge cases: skipRange, skips (in and out of the
//! channel, duplicating replaces), several channels sharing bundles with
//! different edges, replaces chains with gaps, several bundles replacing one,
//! deprecations of package/channel/bundle, inline objects (JSON and YAML),
//! stub CSVs from olm.csv.metadata, bundles with neither, non-string
//! property values, and one API provided by two packages.

use std::path::Path;

use base64::Engine as _;
use serde_json::json;

fn b64(s: &str) -> String {
    base64::engine::general_purpose::STANDARD.encode(s)
}

fn pkg_prop(p: &str, v: &str) -> serde_json::Value {
    json!({"type": "olm.package", "value": {"packageName": p, "version": v}})
}

fn gvk(g: &str, v: &str, k: &str) -> serde_json::Value {
    json!({"type": "olm.gvk", "value": {"group": g, "version": v, "kind": k}})
}

/// Writes the catalog into `dir`.
pub fn write(dir: &Path) {
    let a_csv = json!({
        "apiVersion": "operators.coreos.com/v1alpha1",
        "kind": "ClusterServiceVersion",
        "metadata": {"name": "a.v1.2.0", "annotations": {"capabilities": "Basic Install"}},
        "spec": {"version": "1.2.0", "displayName": "A <edge>", "install": {"strategy": "deployment", "spec": {"deployments": []}}}
    });
    let a_crd_yaml = "apiVersion: apiextensions.k8s.io/v1\nkind: CustomResourceDefinition\nmetadata:\n  name: alphas.a.example.com\nspec:\n  group: a.example.com\n  names:\n    kind: Alpha\n    plural: alphas\n  scope: Namespaced\n  versions:\n  - name: v1\n    served: true\n    storage: true\n";
    let meta_full = json!({
        "type": "olm.csv.metadata",
        "value": {
            "annotations": {"alm-examples": "[{\"kind\":\"Alpha\",\"spec\":{\"x\":\"<&>\"}}]", "capabilities": "Seamless Upgrades"},
            "apiServiceDefinitions": {},
            "crdDescriptions": {"owned": [{
                "name": "alphas.a.example.com", "version": "v1", "kind": "Alpha", "displayName": "Alpha",
                "description": "An alpha", "resources": [{"kind": "Deployment", "name": "", "version": "v1"}],
                "specDescriptors": [{"path": "size", "displayName": "Size", "x-descriptors": ["urn:alm:descriptor:com.tectonic.ui:podCount"], "value": 3}],
                "statusDescriptors": [{"path": "nodes"}]
            }]},
            "displayName": "Edge A",
            "installModes": [{"type": "OwnNamespace", "supported": true}, {"type": "AllNamespaces", "supported": false}],
            "keywords": ["edge", "test"],
            "labels": {"operatorframework.io/arch.amd64": "supported"},
            "links": [{"name": "Docs", "url": "https://example.com/docs"}],
            "maintainers": [{"name": "Team", "email": "team@example.com"}],
            "maturity": "stable",
            "minKubeVersion": "1.25.0",
            "nativeAPIs": [{"group": "", "version": "v1", "kind": "ConfigMap"}],
            "provider": {"name": "Example Inc."},
            "unknownField": "dropped"
        }
    });
    let meta_min = json!({"type": "olm.csv.metadata", "value": {"displayName": "Edge A minimal"}});
    let edge_a = vec![
        json!({"schema": "olm.package", "name": "edge-a", "defaultChannel": "stable",
               "description": "Package-level description",
               "icon": {"base64data": b64("<svg xmlns=\"http://www.w3.org/2000/svg\"/>"), "mediatype": "image/svg+xml"}}),
        json!({"schema": "olm.channel", "package": "edge-a", "name": "stable", "entries": [
            {"name": "a.v1.0.0"},
            {"name": "a.v1.1.0", "replaces": "a.v1.0.0"},
            {"name": "a.v1.2.0", "replaces": "a.v1.1.0", "skips": ["a.v1.0.0", "a.v0.5.0"]}
        ]}),
        json!({"schema": "olm.channel", "package": "edge-a", "name": "fast", "entries": [
            {"name": "a.v1.2.0", "replaces": "a.v1.1.0"},
            {"name": "a.v2.0.0", "replaces": "a.v1.2.0", "skips": ["a.v1.2.0", "a.v1.1.0"], "skipRange": ">=1.0.0 <2.0.0"}
        ]}),
        json!({"schema": "olm.channel", "package": "edge-a", "name": "candidate", "entries": [
            {"name": "a.v1.0.0"},
            {"name": "a.v1.1.0", "replaces": "a.v1.0.0"},
            {"name": "a.v2.0.0", "replaces": "a.v1.0.0", "skips": ["a.v1.1.0"], "skipRange": "<2.0.0"}
        ]}),
        json!({"schema": "olm.bundle", "package": "edge-a", "name": "a.v1.0.0", "image": "quay.io/example/a-bundle:1.0.0",
               "properties": [pkg_prop("edge-a", "1.0.0"), gvk("a.example.com", "v1", "Alpha"), meta_full],
               "relatedImages": [{"name": "operator", "image": "quay.io/example/a:1.0.0"}, {"name": "", "image": "quay.io/example/a-bundle:1.0.0"}]}),
        json!({"schema": "olm.bundle", "package": "edge-a", "name": "a.v1.1.0", "image": "quay.io/example/a-bundle:1.1.0",
        "properties": [
            pkg_prop("edge-a", "1.1.0"), gvk("a.example.com", "v1", "Alpha"),
            {"type": "olm.gvk.required", "value": {"group": "b.example.com", "version": "v1", "kind": "Beta"}},
            {"type": "olm.package.required", "value": {"packageName": "edge-b", "versionRange": ">=1.0.0 <2.0.0"}},
            {"type": "olm.maxOpenShiftVersion", "value": 4.10},
            {"type": "example.com/custom", "value": {"z": [1, 2.50, {"b": true, "a": null}], "a": "x&y"}},
            meta_min
        ]}),
        json!({"schema": "olm.bundle", "package": "edge-a", "name": "a.v1.2.0", "image": "",
        "properties": [
            pkg_prop("edge-a", "1.2.0"), gvk("a.example.com", "v1", "Alpha"),
            {"type": "olm.bundle.object", "value": {"data": b64(&a_csv.to_string())}},
            {"type": "olm.bundle.object", "value": {"data": b64(a_crd_yaml)}}
        ]}),
        json!({"schema": "olm.bundle", "package": "edge-a", "name": "a.v2.0.0", "image": "quay.io/example/a-bundle:2.0.0",
               "properties": [pkg_prop("edge-a", "2.0.0-rc.1+build.5"), gvk("a.example.com", "v2", "Alpha"), gvk("a.example.com", "v1", "Alpha")]}),
        json!({"schema": "olm.deprecations", "package": "edge-a", "entries": [
            {"reference": {"schema": "olm.channel", "name": "fast"}, "message": "fast is going away"},
            {"reference": {"schema": "olm.bundle", "name": "a.v1.0.0"}, "message": "a.v1.0.0 has a CVE"}
        ]}),
    ];
    let mut yaml = String::new();
    for d in &edge_a {
        yaml.push_str("---\n");
        yaml.push_str(&serde_yaml_ng::to_string(d).expect("yaml"));
    }
    std::fs::create_dir_all(dir.join("edge-a")).expect("mkdir");
    std::fs::write(dir.join("edge-a/catalog.yaml"), yaml).expect("write");

    let edge_b = vec![
        json!({"schema": "olm.package", "name": "edge-b", "defaultChannel": "v1"}),
        json!({"schema": "olm.channel", "package": "edge-b", "name": "v1", "entries": [
            {"name": "b.v1.0.0"}, {"name": "b.v1.1.0", "replaces": "b.v1.0.0", "skips": ["b.v1.0.0"]}
        ]}),
        json!({"schema": "olm.channel", "package": "edge-b", "name": "v2", "entries": [
            {"name": "b.v2.0.0", "replaces": "b.v1.1.0"}
        ]}),
        json!({"schema": "olm.bundle", "package": "edge-b", "name": "b.v1.0.0", "image": "quay.io/example/b-bundle:1.0.0",
               "properties": [pkg_prop("edge-b", "1.0.0"), gvk("b.example.com", "v1", "Beta")]}),
        json!({"schema": "olm.bundle", "package": "edge-b", "name": "b.v1.1.0", "image": "quay.io/example/b-bundle:1.1.0",
               "properties": [gvk("b.example.com", "v1", "Beta"), gvk("a.example.com", "v1", "Alpha"), pkg_prop("edge-b", "1.1.0")]}),
        json!({"schema": "olm.bundle", "package": "edge-b", "name": "b.v2.0.0", "image": "quay.io/example/b-bundle:2.0.0",
               "properties": [pkg_prop("edge-b", "2.0.0"), gvk("c.example.com", "v1", "Gamma")]}),
        json!({"schema": "olm.deprecations", "package": "edge-b", "entries": [
            {"reference": {"schema": "olm.package"}, "message": "edge-b is deprecated; use edge-a"},
            {"reference": {"schema": "olm.bundle", "name": "b.v1.0.0"}, "message": "old"}
        ]}),
    ];
    let mut jsons = String::new();
    for d in &edge_b {
        jsons.push_str(&serde_json::to_string_pretty(d).expect("json"));
        jsons.push('\n');
    }
    std::fs::create_dir_all(dir.join("nested/edge-b")).expect("mkdir");
    std::fs::write(dir.join("nested/edge-b/catalog.json"), jsons).expect("write");
}
