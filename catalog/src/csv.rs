//! The stub ClusterServiceVersion opm synthesises from an `olm.csv.metadata`
//! property when a bundle carries no CSV object. Field order, omission rules
//! and defaults follow the Go types the upstream server marshals.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

fn is_empty_str(s: &str) -> bool {
    s.is_empty()
}

/// `olm.csv.metadata` property value.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct CsvMetadata {
    annotations: Option<BTreeMap<String, String>>,
    #[serde(rename = "apiServiceDefinitions")]
    api_service_definitions: ApiServiceDefinitions,
    #[serde(rename = "crdDescriptions")]
    crd_descriptions: CustomResourceDefinitions,
    description: String,
    #[serde(rename = "displayName")]
    display_name: String,
    #[serde(rename = "installModes")]
    install_modes: Option<Vec<InstallMode>>,
    keywords: Option<Vec<String>>,
    labels: Option<BTreeMap<String, String>>,
    links: Option<Vec<AppLink>>,
    maintainers: Option<Vec<Maintainer>>,
    maturity: String,
    #[serde(rename = "minKubeVersion")]
    min_kube_version: String,
    #[serde(rename = "nativeAPIs")]
    native_apis: Option<Vec<Gvk>>,
    provider: AppLink,
}

#[derive(Debug, Default, Deserialize, Serialize)]
#[serde(default)]
struct ApiServiceDefinitions {
    #[serde(skip_serializing_if = "vec_empty")]
    owned: Option<Vec<ApiServiceDescription>>,
    #[serde(skip_serializing_if = "vec_empty")]
    required: Option<Vec<ApiServiceDescription>>,
}

#[derive(Debug, Default, Deserialize, Serialize)]
#[serde(default)]
struct CustomResourceDefinitions {
    #[serde(skip_serializing_if = "vec_empty")]
    owned: Option<Vec<CrdDescription>>,
    #[serde(skip_serializing_if = "vec_empty")]
    required: Option<Vec<CrdDescription>>,
}

#[allow(clippy::ref_option)]
fn vec_empty<T>(v: &Option<Vec<T>>) -> bool {
    v.as_ref().is_none_or(Vec::is_empty)
}

#[allow(clippy::ref_option)]
fn map_empty<K, V>(v: &Option<BTreeMap<K, V>>) -> bool {
    v.as_ref().is_none_or(BTreeMap::is_empty)
}

#[derive(Debug, Default, Deserialize, Serialize)]
#[serde(default)]
struct CrdDescription {
    name: String,
    version: String,
    kind: String,
    #[serde(rename = "displayName", skip_serializing_if = "is_empty_str")]
    display_name: String,
    #[serde(skip_serializing_if = "is_empty_str")]
    description: String,
    #[serde(skip_serializing_if = "vec_empty")]
    resources: Option<Vec<ApiResourceReference>>,
    #[serde(rename = "statusDescriptors", skip_serializing_if = "vec_empty")]
    status_descriptors: Option<Vec<Descriptor>>,
    #[serde(rename = "specDescriptors", skip_serializing_if = "vec_empty")]
    spec_descriptors: Option<Vec<Descriptor>>,
    #[serde(rename = "actionDescriptors", skip_serializing_if = "vec_empty")]
    action_descriptors: Option<Vec<Descriptor>>,
}

#[derive(Debug, Default, Deserialize, Serialize)]
#[serde(default)]
struct ApiServiceDescription {
    name: String,
    group: String,
    version: String,
    kind: String,
    #[serde(rename = "deploymentName", skip_serializing_if = "is_empty_str")]
    deployment_name: String,
    #[serde(rename = "containerPort", skip_serializing_if = "is_zero")]
    container_port: i32,
    #[serde(rename = "displayName", skip_serializing_if = "is_empty_str")]
    display_name: String,
    #[serde(skip_serializing_if = "is_empty_str")]
    description: String,
    #[serde(skip_serializing_if = "vec_empty")]
    resources: Option<Vec<ApiResourceReference>>,
    #[serde(rename = "statusDescriptors", skip_serializing_if = "vec_empty")]
    status_descriptors: Option<Vec<Descriptor>>,
    #[serde(rename = "specDescriptors", skip_serializing_if = "vec_empty")]
    spec_descriptors: Option<Vec<Descriptor>>,
    #[serde(rename = "actionDescriptors", skip_serializing_if = "vec_empty")]
    action_descriptors: Option<Vec<Descriptor>>,
}

fn is_zero(v: &i32) -> bool {
    *v == 0
}

#[derive(Debug, Default, Deserialize, Serialize)]
#[serde(default)]
struct ApiResourceReference {
    name: String,
    kind: String,
    version: String,
}

#[derive(Debug, Default, Deserialize, Serialize)]
#[serde(default)]
struct Descriptor {
    path: String,
    #[serde(rename = "displayName", skip_serializing_if = "is_empty_str")]
    display_name: String,
    #[serde(skip_serializing_if = "is_empty_str")]
    description: String,
    #[serde(rename = "x-descriptors", skip_serializing_if = "vec_empty")]
    x_descriptors: Option<Vec<String>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    value: Option<Value>,
}

#[derive(Debug, Default, Deserialize, Serialize)]
#[serde(default)]
struct InstallMode {
    #[serde(rename = "type")]
    kind: String,
    supported: bool,
}

#[derive(Debug, Default, Deserialize, Serialize)]
#[serde(default)]
struct AppLink {
    #[serde(skip_serializing_if = "is_empty_str")]
    name: String,
    #[serde(skip_serializing_if = "is_empty_str")]
    url: String,
}

#[derive(Debug, Default, Deserialize, Serialize)]
#[serde(default)]
struct Maintainer {
    #[serde(skip_serializing_if = "is_empty_str")]
    name: String,
    #[serde(skip_serializing_if = "is_empty_str")]
    email: String,
}

#[derive(Debug, Default, Deserialize, Serialize)]
#[serde(default)]
struct Gvk {
    group: String,
    version: String,
    kind: String,
}

/// Package icon as the CSV carries it.
#[derive(Debug, Clone, Serialize)]
pub struct Icon {
    /// Standard base64 of the image.
    pub base64data: String,
    /// Media type.
    pub mediatype: String,
}

/// A related image of a bundle.
#[derive(Debug, Clone, Serialize)]
pub struct RelatedImage {
    /// Name (may be empty).
    pub name: String,
    /// Image reference.
    pub image: String,
}

#[derive(Serialize)]
struct Csv<'a> {
    kind: &'static str,
    #[serde(rename = "apiVersion")]
    api_version: &'static str,
    metadata: ObjectMeta<'a>,
    spec: Spec<'a>,
    status: Status,
}

#[derive(Serialize)]
struct ObjectMeta<'a> {
    name: &'a str,
    #[serde(skip_serializing_if = "map_empty")]
    labels: &'a Option<BTreeMap<String, String>>,
    #[serde(skip_serializing_if = "map_empty")]
    annotations: &'a Option<BTreeMap<String, String>>,
}

#[derive(Serialize)]
struct Spec<'a> {
    install: Install,
    version: &'a str,
    #[serde(skip_serializing_if = "is_empty_str")]
    maturity: &'a str,
    customresourcedefinitions: &'a CustomResourceDefinitions,
    apiservicedefinitions: &'a ApiServiceDefinitions,
    #[serde(rename = "nativeAPIs", skip_serializing_if = "vec_empty")]
    native_apis: &'a Option<Vec<Gvk>>,
    #[serde(rename = "minKubeVersion", skip_serializing_if = "is_empty_str")]
    min_kube_version: &'a str,
    #[serde(rename = "displayName")]
    display_name: &'a str,
    #[serde(skip_serializing_if = "is_empty_str")]
    description: &'a str,
    #[serde(skip_serializing_if = "vec_empty")]
    keywords: &'a Option<Vec<String>>,
    #[serde(skip_serializing_if = "vec_empty")]
    maintainers: &'a Option<Vec<Maintainer>>,
    provider: &'a AppLink,
    #[serde(skip_serializing_if = "vec_empty")]
    links: &'a Option<Vec<AppLink>>,
    #[serde(skip_serializing_if = "vec_empty")]
    icon: Option<Vec<Icon>>,
    #[serde(rename = "installModes", skip_serializing_if = "vec_empty")]
    install_modes: &'a Option<Vec<InstallMode>>,
    cleanup: Cleanup,
    #[serde(rename = "relatedImages", skip_serializing_if = "vec_empty")]
    related_images: Option<Vec<RelatedImage>>,
}

#[derive(Serialize)]
struct Install {
    strategy: &'static str,
    spec: InstallSpec,
}

#[derive(Serialize)]
struct InstallSpec {
    deployments: Option<()>,
}

#[derive(Serialize)]
struct Cleanup {
    enabled: bool,
}

#[derive(Serialize)]
struct Status {
    cleanup: Empty,
}

#[derive(Serialize)]
struct Empty {}

/// Inputs of the stub besides the metadata itself.
pub struct StubInputs<'a> {
    /// Bundle (CSV) name.
    pub name: &'a str,
    /// Canonical semver of the bundle.
    pub version: &'a str,
    /// Package icon, if any.
    pub icon: Option<Icon>,
    /// Bundle related images.
    pub related_images: &'a [RelatedImage],
    /// Package description (used when the metadata has none).
    pub package_description: &'a str,
}

/// Builds the stub CSV JSON (Go `json.Marshal` layout, HTML-escaped).
pub fn stub_csv_json(meta: &CsvMetadata, inputs: StubInputs<'_>) -> String {
    let mut out = String::new();
    write_stub_csv_json(meta, inputs, &mut Vec::new(), &mut out);
    out
}

/// [`stub_csv_json`] into `out` (cleared first), with `scratch` as working
/// space: both are reused from bundle to bundle while a catalog loads.
pub fn write_stub_csv_json(
    meta: &CsvMetadata,
    inputs: StubInputs<'_>,
    scratch: &mut Vec<u8>,
    out: &mut String,
) {
    let description = if meta.description.is_empty() {
        inputs.package_description
    } else {
        meta.description.as_str()
    };
    let csv = Csv {
        kind: "ClusterServiceVersion",
        api_version: "operators.coreos.com/v1alpha1",
        metadata: ObjectMeta {
            name: inputs.name,
            labels: &meta.labels,
            annotations: &meta.annotations,
        },
        spec: Spec {
            install: Install {
                strategy: "deployment",
                spec: InstallSpec { deployments: None },
            },
            version: inputs.version,
            maturity: &meta.maturity,
            customresourcedefinitions: &meta.crd_descriptions,
            apiservicedefinitions: &meta.api_service_definitions,
            native_apis: &meta.native_apis,
            min_kube_version: &meta.min_kube_version,
            display_name: &meta.display_name,
            description,
            keywords: &meta.keywords,
            maintainers: &meta.maintainers,
            provider: &meta.provider,
            links: &meta.links,
            icon: inputs.icon.map(|i| vec![i]),
            install_modes: &meta.install_modes,
            cleanup: Cleanup { enabled: false },
            related_images: if inputs.related_images.is_empty() {
                None
            } else {
                Some(inputs.related_images.to_vec())
            },
        },
        status: Status { cleanup: Empty {} },
    };
    scratch.clear();
    out.clear();
    if serde_json::to_writer(&mut *scratch, &csv).is_ok() {
        crate::gojson::escape_html_into(std::str::from_utf8(scratch).unwrap_or_default(), out);
    }
}
