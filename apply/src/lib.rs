//! Applies desired objects to one cluster with server-side apply under our field manager,
//! and prunes objects we made that are no longer desired.
//!
//! - An object unchanged since our last apply of it (see [`compare`]) is not written, so a
//!   converged reconcile makes no API writes, while a field we stop rendering is removed by
//!   the next apply.
//! - With a [`cache::WatchCache`] the comparison and the prune listing read the cache, so a
//!   converged pass makes no API request at all; without one (or for a kind it has not
//!   listed yet) each object is read with a GET and each kind listed.
//! - Applies use strict field validation: an unknown field is an error.
//! - Errors are collected per object; one failing object does not stop the rest.
//! - Pruning lists each given kind by label selector and deletes what is not desired.

pub mod bounded;
pub mod cache;
pub mod compare;
pub mod projected;
pub mod watch;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, ApiResource, DeleteParams, DynamicObject, Patch, PatchParams};
use serde_json::Value;

/// How an object is written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Policy {
    /// Server-side apply whenever the live object differs.
    Apply,
    /// Create when absent; never touch it afterwards.
    CreateOnly,
}

/// One object to apply.
#[derive(Clone, Debug, PartialEq)]
pub struct Target {
    /// The resource (group, version, kind, plural).
    pub resource: ApiResource,
    /// Namespace, for namespaced resources.
    pub namespace: Option<String>,
    /// Object name.
    pub name: String,
    /// How to write it.
    pub policy: Policy,
    /// The full object (apiVersion, kind, metadata, ...).
    pub body: Value,
}

impl Target {
    /// Builds a target from an apiVersion, kind and plural.
    pub fn new(api_version: &str, kind: &str, plural: &str, policy: Policy, body: Value) -> Self {
        let (group, version) = match api_version.split_once('/') {
            Some((g, v)) => (g.to_string(), v.to_string()),
            None => (String::new(), api_version.to_string()),
        };
        let s = |p: &str| body.pointer(p).and_then(Value::as_str).map(str::to_string);
        Self {
            resource: ApiResource {
                group,
                version,
                api_version: api_version.to_string(),
                kind: kind.to_string(),
                plural: plural.to_string(),
            },
            namespace: s("/metadata/namespace"),
            name: s("/metadata/name").unwrap_or_default(),
            policy,
            body,
        }
    }

    /// `Kind/namespace/name`.
    pub fn id(&self) -> String {
        object_id(&self.resource.kind, self.namespace.as_deref(), &self.name)
    }
}

fn object_id(kind: &str, namespace: Option<&str>, name: &str) -> String {
    match namespace {
        Some(ns) => format!("{kind}/{ns}/{name}"),
        None => format!("{kind}/{name}"),
    }
}

/// A failure on one object.
#[derive(Debug, thiserror::Error)]
#[error("{verb} {id}: {}", describe(source))]
pub struct ObjectError {
    /// What we tried (`get`, `apply`, `list`, `delete`).
    pub verb: &'static str,
    /// `Kind/namespace/name`.
    pub id: String,
    /// The API error.
    #[source]
    pub source: kube::Error,
}

/// The API server's own message for an API error (kube's Display adds the whole `Status`
/// in Debug form); other errors as they are.
fn describe(e: &kube::Error) -> String {
    match e {
        kube::Error::Api(s) => format!("{} (HTTP {} {})", s.message, s.code, s.reason),
        other => other.to_string(),
    }
}

impl ObjectError {
    /// The HTTP status code, when the API server answered.
    pub fn code(&self) -> Option<u16> {
        match &self.source {
            kube::Error::Api(s) => Some(s.code),
            _ => None,
        }
    }
}

/// What a pass did.
#[derive(Debug, Default)]
pub struct Report {
    /// Objects created.
    pub created: Vec<String>,
    /// Objects changed.
    pub updated: Vec<String>,
    /// Objects already as desired (not written).
    pub unchanged: usize,
    /// Objects pruned.
    pub deleted: Vec<String>,
    /// Reads sent to the API server (GETs and LISTs; answered by the cache: none).
    pub reads: usize,
    /// Per-object failures.
    pub errors: Vec<ObjectError>,
    /// The objects written, as the API server returned them, of the kinds asked for with
    /// [`Applier::keep_written`] (none otherwise).
    pub written: Vec<DynamicObject>,
}

impl Report {
    /// API writes made (creates, updates, deletes).
    pub fn writes(&self) -> usize {
        self.created.len() + self.updated.len() + self.deleted.len()
    }

    /// Merges another pass into this one.
    pub fn merge(&mut self, other: Report) {
        self.created.extend(other.created);
        self.updated.extend(other.updated);
        self.unchanged += other.unchanged;
        self.deleted.extend(other.deleted);
        self.reads += other.reads;
        self.errors.extend(other.errors);
        self.written.extend(other.written);
    }
}

/// Applies objects to one cluster.
#[derive(Clone)]
pub struct Applier {
    client: kube::Client,
    field_manager: String,
    cache: Option<Arc<cache::WatchCache>>,
    keep_written: Vec<String>,
    /// How prune lists are read (pages, items, bytes).
    list: watch::Options,
    /// Prune lists and reports what it would delete, deleting nothing.
    dry_run: bool,
}

impl std::fmt::Debug for Applier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Applier")
            .field("field_manager", &self.field_manager)
            .finish_non_exhaustive()
    }
}

impl Applier {
    /// An applier writing with `field_manager`.
    pub fn new(client: kube::Client, field_manager: &str) -> Self {
        Self {
            client,
            field_manager: field_manager.to_string(),
            cache: None,
            keep_written: Vec::new(),
            list: watch::Options::DEFAULT,
            dry_run: false,
        }
    }

    /// [`Self::prune`] deletes nothing: [`Report::deleted`] lists what it would delete.
    pub fn dry_run(mut self, on: bool) -> Self {
        self.dry_run = on;
        self
    }

    /// Reads prune lists with `options` (e.g. [`watch::Options::UNTRUSTED`] for a guest):
    /// paged, each page bounded in items and bytes as a watch's is, at most
    /// `options.max_pages` pages.
    pub fn with_list_options(mut self, options: watch::Options) -> Self {
        self.list = options;
        self
    }

    /// Returns the written objects of these kinds in [`Report::written`] (e.g. so a caller
    /// can remember a Secret's data it just wrote instead of reading it back).
    pub fn keep_written(mut self, kinds: &[&str]) -> Self {
        self.keep_written = kinds.iter().map(|k| k.to_string()).collect();
        self
    }

    /// Reads live objects from `cache` where it knows them (see [`cache::WatchCache`]).
    pub fn with_cache(mut self, cache: Option<Arc<cache::WatchCache>>) -> Self {
        self.cache = cache;
        self
    }

    /// Every page of a metadata list, bounded as [`Self::with_list_options`] says. A 404
    /// comes back as kube's `Api` error, so callers tell "not served" apart.
    async fn list_all(
        &self,
        resource: &ApiResource,
        selector: &watch::Selector,
        report: &mut Report,
    ) -> Result<Vec<ObjectMeta>, kube::Error> {
        type Meta = kube::core::PartialObjectMeta<DynamicObject>;
        let mut out = Vec::new();
        let mut token: Option<String> = None;
        for _ in 0..self.list.max_pages {
            report.reads += 1;
            let (meta, items) = watch::list_page::<Meta>(
                &self.client,
                resource,
                selector,
                true,
                self.list,
                token.as_deref(),
            )
            .await
            .map_err(|e| match e {
                watch::WatchError::Status { code, message, .. } => kube::Error::Api(
                    kube::core::Status::failure(&message, "")
                        .with_code(code)
                        .boxed(),
                ),
                other => kube::Error::Service(Box::new(other)),
            })?;
            out.extend(items.into_iter().map(|o| o.metadata));
            match meta.continue_.filter(|c| !c.is_empty()) {
                Some(c) => token = Some(c),
                None => return Ok(out),
            }
        }
        Err(kube::Error::Service(Box::new(
            watch::WatchError::TooLarge {
                what: "list (pages)",
                limit: self.list.max_pages as usize,
            },
        )))
    }

    fn api(&self, resource: &ApiResource, namespace: Option<&str>) -> Api<DynamicObject> {
        match namespace {
            Some(ns) => Api::namespaced_with(self.client.clone(), ns, resource),
            None => Api::all_with(self.client.clone(), resource),
        }
    }

    /// Applies `targets` in order. An object already as desired is not written.
    pub async fn apply(&self, targets: &[Target]) -> Report {
        let mut report = Report::default();
        for t in targets {
            let api = self.api(&t.resource, t.namespace.as_deref());
            let cached = self
                .cache
                .as_ref()
                .and_then(|c| c.get(&t.resource, t.namespace.as_deref(), &t.name));
            let from_cache = cached.is_some();
            let live = match cached {
                Some(live) => live,
                None => match read_full(&api, t, &mut report).await {
                    Ok(live) => live,
                    Err(()) => continue,
                },
            };
            let exists = live.is_some();
            let body = compare::with_hash(&t.body);
            let hash = compare::hash_annotation(&body)
                .unwrap_or_default()
                .to_string();
            match (&live, t.policy) {
                (Some(_), Policy::CreateOnly) => {
                    report.unchanged += 1;
                    continue;
                }
                // From the cache (trimmed: no managed fields): confirmed before for this
                // hash and these fields, or read in full once to confirm.
                (Some(live), Policy::Apply) if from_cache => {
                    let c = self.cache.as_ref().expect("cached implies a cache");
                    if compare::hash_annotation(live) == Some(hash.as_str()) {
                        if c.is_verified(&t.resource, live, &hash) {
                            report.unchanged += 1;
                            continue;
                        }
                        match read_full(&api, t, &mut report).await {
                            Ok(Some(full)) => {
                                if compare::up_to_date(&body, &full, &self.field_manager) {
                                    c.verify(&t.resource, &full, &self.field_manager);
                                    report.unchanged += 1;
                                    continue;
                                }
                            }
                            Ok(None) => {}
                            Err(()) => continue,
                        }
                    }
                }
                (Some(live), Policy::Apply) => {
                    if compare::up_to_date(&body, live, &self.field_manager) {
                        report.unchanged += 1;
                        continue;
                    }
                }
                (None, _) => {}
            }
            // Strict: a field the server does not know (a typo in what we render) is an
            // error, not a warning with the field silently dropped.
            let params = PatchParams::apply(&self.field_manager)
                .force()
                .validation_strict();
            match api.patch(&t.name, &params, &Patch::Apply(&body)).await {
                Ok(written) => {
                    tracing::debug!(object = %t.id(), created = !exists, "applied");
                    if let Some(c) = &self.cache {
                        c.wrote(&t.resource, &written.metadata, &self.field_manager);
                    }
                    if self.keep_written.contains(&t.resource.kind) {
                        report.written.push(written);
                    }
                    if exists {
                        report.updated.push(t.id());
                    } else {
                        report.created.push(t.id());
                    }
                }
                Err(source) => report.errors.push(ObjectError {
                    verb: "apply",
                    id: t.id(),
                    source,
                }),
            }
        }
        report
    }

    /// Deletes every object of the given `kinds` that carries all `selector` labels (in
    /// `namespace`, or in all namespaces when `None`) and is not among `keep`.
    /// A kind the server does not serve (404) is skipped.
    pub async fn prune(
        &self,
        kinds: &[(ApiResource, bool)],
        namespace: Option<&str>,
        selector: &BTreeMap<String, String>,
        keep: &[Target],
    ) -> Report {
        let mut report = Report::default();
        let keep: BTreeSet<String> = keep.iter().map(Target::id).collect();
        let label_selector = selector
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(",");
        for (resource, namespaced) in kinds {
            let cached = self
                .cache
                .as_ref()
                .and_then(|c| c.list(resource, namespace.filter(|_| *namespaced), selector));
            let items = match cached {
                Some(items) => items,
                None => {
                    let selector = watch::Selector {
                        namespace: namespace.filter(|_| *namespaced).map(str::to_string),
                        labels: label_selector.clone(),
                        fields: String::new(),
                    };
                    match self.list_all(resource, &selector, &mut report).await {
                        Ok(items) => items,
                        Err(kube::Error::Api(s)) if s.code == 404 => continue,
                        Err(source) => {
                            report.errors.push(ObjectError {
                                verb: "list",
                                id: resource.kind.clone(),
                                source,
                            });
                            continue;
                        }
                    }
                }
            };
            for meta in items {
                let name = meta.name.clone().unwrap_or_default();
                let ns = meta.namespace.clone();
                let id = object_id(&resource.kind, ns.as_deref(), &name);
                if keep.contains(&id) || meta.deletion_timestamp.is_some() {
                    continue;
                }
                if self.dry_run {
                    report.deleted.push(id);
                    continue;
                }
                let api = self.api(resource, ns.as_deref());
                // Only the object as listed: one changed since (relabelled away from us,
                // or replaced by another of the same name) is left for the next pass to
                // look at again, even when the list came from a cache that lags.
                let mut dp = DeleteParams::background();
                dp.preconditions = Some(kube::api::Preconditions {
                    uid: meta.uid.clone(),
                    resource_version: meta.resource_version.clone(),
                });
                match api.delete(&name, &dp).await {
                    Ok(_) => {
                        tracing::debug!(object = %id, "pruned");
                        if let Some(c) = &self.cache {
                            c.deleted(resource, &meta);
                        }
                        report.deleted.push(id);
                    }
                    Err(kube::Error::Api(s)) if s.code == 404 => {}
                    Err(kube::Error::Api(s)) if s.code == 409 => {
                        tracing::debug!(object = %id, "changed since listed; not pruned this pass");
                    }
                    Err(source) => report.errors.push(ObjectError {
                        verb: "delete",
                        id,
                        source,
                    }),
                }
            }
        }
        report
    }
}
/// Reads the whole live object, counting the read; a failure is recorded in `report`
/// (`Err(())`: skip this target).
async fn read_full(
    api: &Api<DynamicObject>,
    t: &Target,
    report: &mut Report,
) -> Result<Option<Value>, ()> {
    report.reads += 1;
    match api.get_opt(&t.name).await {
        Ok(live) => Ok(live.map(|l| serde_json::to_value(l).unwrap_or(Value::Null))),
        Err(source) => {
            report.errors.push(ObjectError {
                verb: "get",
                id: t.id(),
                source,
            });
            Err(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What the API server said, not kube's Debug of its Status (which ends up in a
    /// HostedOLM's Degraded message).
    #[test]
    fn an_api_error_reads_as_the_servers_message() {
        let status: kube::core::Status = serde_json::from_value(serde_json::json!({
            "status": "Failure",
            "code": 500,
            "reason": "InternalError",
            "message": "Internal error occurred: failed to allocate a nodePort: range is full",
        }))
        .unwrap();
        let e = ObjectError {
            verb: "apply",
            id: "Service/ns/wg".into(),
            source: kube::Error::Api(status.into()),
        };
        assert_eq!(
            e.to_string(),
            "apply Service/ns/wg: Internal error occurred: failed to allocate a nodePort: range is full (HTTP 500 InternalError)"
        );
    }
}
