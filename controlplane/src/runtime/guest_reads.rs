//! What a pass reads back from a guest to report status, kept by watches so that a
//! converged pass asks the guest nothing (issue 16: zero-read resyncs).
//!
//! The guest's [`WatchCache`](hcp_olm_apply::cache::WatchCache) answers the applier and the
//! pruner (metadata of our objects). A pass also reads, each time:
//! - whether the OLM CatalogSource CRD exists (and so whether the guest answers);
//! - our CatalogSources' connection state (per-catalog status);
//! - whether the deprecated `redhat-marketplace` CatalogSource exists (it is deleted);
//! - installed operators that declare `olm.maxOpenShiftVersion` (`Upgradeable`);
//! - our Deployments' ready replicas and ReplicaFailure condition (component status).
//!
//! One watch each ([`Projected`]), keeping only those fields. Each answers once its first
//! list is complete and while its watch is whole; otherwise the pass reads the guest as
//! before. A watch stays whole only while its connection does (HTTP/2 PINGs end a dead one
//! within 30 s; over HTTP/1.1 TCP keep-alive takes minutes), so "the CRD is in the store"
//! also says the guest's connection is alive: an unreachable guest is still reported, that
//! much later. A guest that serves watches while its reads fail is not seen until its
//! watches end (docs/controller.md).
//!
//! Bounds per guest (a hostile tenant's cluster): [`LIMITS`] per watch, so at most 5 ×
//! 64 KiB of projections; a store that crosses one gives up and the pass reads the guest.

use hcp_olm_apply::projected::{Limits, Projected};
use hcp_olm_apply::watch::Selector;
use serde_json::{Value, json};

use super::kinds::{DEPRECATED_MARKETPLACE, GUEST_OLM_CRD, api_resource};
use crate::render::{labels, names};

/// Bounds of each store.
pub const LIMITS: Limits = Limits {
    objects: 500,
    entry_bytes: 8 * 1024,
    bytes: 64 * 1024,
    events_per_minute: 600,
    watch: hcp_olm_apply::watch::Options::UNTRUSTED,
};

/// The CSV annotation that lists an operator's properties.
pub const PROPERTIES_ANNOTATION: &str = "operatorframework.io/properties";

/// The stores of one guest.
#[derive(Debug)]
pub struct GuestReads {
    /// The OLM CatalogSource CRD (existence).
    pub crd: Projected,
    /// Our CatalogSources in the marketplace namespace: labels and connection state.
    pub sources: Projected,
    /// The deprecated marketplace CatalogSource (existence).
    pub deprecated: Projected,
    /// CSVs that declare `olm.maxOpenShiftVersion` (not copies): that value.
    pub csvs: Projected,
    /// Our Deployments: ready replicas and conditions.
    pub deployments: Projected,
}

fn ours() -> String {
    format!("{}={}", labels::MANAGED_BY_KEY, labels::MANAGED_BY)
}

fn by_name(namespace: Option<&str>, name: &str) -> Selector {
    Selector {
        namespace: namespace.map(str::to_string),
        labels: String::new(),
        fields: format!("metadata.name={name}"),
    }
}

/// Existence only.
fn exists(_: &Value) -> Option<Value> {
    Some(json!({}))
}

/// A CatalogSource's labels, connection state, and the first characters of the
/// catalog-operator's reason and message (status carries no more of them; the guest can
/// write any length).
pub fn keep_source(o: &Value) -> Option<Value> {
    let state = &o["status"]["connectionState"];
    let text = |v: &Value| crate::status::guest_text(v).map_or(Value::Null, Value::String);
    Some(json!({
        "metadata": { "labels": o["metadata"]["labels"] },
        "status": {
            "connectionState": {
                "lastObservedState": state["lastObservedState"],
                "lastConnect": state["lastConnect"],
            },
            "reason": text(&o["status"]["reason"]),
            "message": text(&o["status"]["message"]),
        },
    }))
}

/// The `olm.maxOpenShiftVersion` a CSV declares (as a string) in its
/// [`PROPERTIES_ANNOTATION`], if any.
pub fn max_openshift_version(properties: &str) -> Option<String> {
    let props: Value = serde_json::from_str(properties).ok()?;
    props["properties"].as_array()?.iter().find_map(|prop| {
        (prop["type"] == "olm.maxOpenShiftVersion").then(|| match &prop["value"] {
            Value::String(s) => s.clone(),
            other => other.to_string(),
        })
    })
}

/// A CSV's `olm.maxOpenShiftVersion`; nothing for a copy (not a separate install).
fn keep_csv(o: &Value) -> Option<Value> {
    let meta = &o["metadata"];
    if meta["labels"].get("olm.copiedFrom").is_some() {
        return None;
    }
    max_openshift_version(meta["annotations"][PROPERTIES_ANNOTATION].as_str()?)
        .map(|m| json!({ "max": m }))
}

/// What component status reads of a Deployment.
pub fn keep_deployment(o: &Value) -> Option<Value> {
    let s = &o["status"];
    let conditions: Vec<Value> = s["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|c| c["type"] == "ReplicaFailure")
        .cloned()
        .collect();
    Some(json!({
        "status": { "readyReplicas": s["readyReplicas"], "conditions": conditions },
    }))
}

impl GuestReads {
    /// Starts the five watches. Must be called within a tokio runtime.
    pub fn start(client: &kube::Client) -> Self {
        let cs = api_resource(
            "operators.coreos.com/v1alpha1",
            "CatalogSource",
            "catalogsources",
        );
        Self {
            crd: Projected::start(
                client,
                &api_resource(
                    "apiextensions.k8s.io/v1",
                    "CustomResourceDefinition",
                    "customresourcedefinitions",
                ),
                by_name(None, GUEST_OLM_CRD),
                true,
                exists,
                LIMITS,
            ),
            sources: Projected::start(
                client,
                &cs,
                Selector {
                    namespace: Some(names::MARKETPLACE_NAMESPACE.to_string()),
                    labels: ours(),
                    fields: String::new(),
                },
                false,
                keep_source,
                LIMITS,
            ),
            deprecated: Projected::start(
                client,
                &cs,
                by_name(Some(names::MARKETPLACE_NAMESPACE), DEPRECATED_MARKETPLACE),
                true,
                exists,
                LIMITS,
            ),
            csvs: Projected::start(
                client,
                &api_resource(
                    "operators.coreos.com/v1alpha1",
                    "ClusterServiceVersion",
                    "clusterserviceversions",
                ),
                // Copies are not separate installs: the server leaves them out.
                Selector::labels("!olm.copiedFrom"),
                true,
                keep_csv,
                LIMITS,
            ),
            deployments: Projected::start(
                client,
                &api_resource("apps/v1", "Deployment", "deployments"),
                Selector::labels(&ours()),
                false,
                keep_deployment,
                LIMITS,
            ),
        }
    }

    /// The five stores.
    pub fn all(&self) -> [&Projected; 5] {
        [
            &self.crd,
            &self.sources,
            &self.deprecated,
            &self.csvs,
            &self.deployments,
        ]
    }

    /// Waits until every store is synced, has given up or finds its kind not served
    /// (tests).
    pub async fn wait_settled(&self, timeout: std::time::Duration) -> bool {
        let mut all = true;
        for p in self.all() {
            all &= p.wait_settled(timeout).await;
        }
        all
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn projections_keep_only_what_status_reads() {
        let cs = json!({
            "metadata": { "name": "x", "labels": { "a": "b" }, "annotations": { "big": "…" } },
            "spec": { "image": "i" },
            "status": { "connectionState": { "lastObservedState": "READY",
                "lastConnect": "2026-11-27T00:00:00Z", "address": "x:50051" },
                "registryService": { "serviceName": "x" } },
        });
        assert_eq!(
            keep_source(&cs),
            Some(json!({ "metadata": { "labels": { "a": "b" } },
                "status": { "connectionState": { "lastObservedState": "READY",
                    "lastConnect": "2026-11-27T00:00:00Z" }, "reason": null, "message": null } }))
        );
        // the catalog-operator's words: the first characters, printable only
        let mut failing = cs.clone();
        failing["status"]["reason"] = json!("Bad\u{7}");
        failing["status"]["message"] = json!("m".repeat(100_000));
        let kept = keep_source(&failing).expect("kept");
        assert_eq!(kept["status"]["reason"], "Bad");
        assert_eq!(
            kept["status"]["message"].as_str().map(str::len),
            Some(crate::status::MAX_SOURCE_MESSAGE)
        );
        let props = json!({ "properties": [{ "type": "olm.maxOpenShiftVersion", "value": 4.19 }] });
        let csv = |labels: Value| {
            json!({ "metadata": { "labels": labels,
                "annotations": { PROPERTIES_ANNOTATION: props.to_string() } } })
        };
        assert_eq!(keep_csv(&csv(json!({}))), Some(json!({ "max": "4.19" })));
        assert_eq!(keep_csv(&csv(json!({ "olm.copiedFrom": "ns" }))), None);
        assert_eq!(keep_csv(&json!({ "metadata": {} })), None);
        let d = json!({ "spec": { "replicas": 1 }, "status": { "readyReplicas": 1,
            "conditions": [{ "type": "Available", "status": "True" },
                           { "type": "ReplicaFailure", "status": "True", "reason": "FailedCreate" }] } });
        assert_eq!(
            keep_deployment(&d),
            Some(json!({ "status": { "readyReplicas": 1, "conditions": [
                { "type": "ReplicaFailure", "status": "True", "reason": "FailedCreate" }] } }))
        );
    }
}
