//! A watch-fed store of a few fields of some objects, so a converged pass can read what it
//! reports (a status, whether an object exists) without asking the API server.
//!
//! [`crate::cache::WatchCache`] keeps what the applier compares (metadata of our objects);
//! this keeps what a pass *reads*: for each selected object, a small JSON projection that the
//! caller's `keep` function makes (e.g. a Deployment's ready replicas), or nothing for an
//! object `keep` does not want. Like the cache, it answers only once its first list is
//! complete and while its watch is whole; until then (and after it gave up) the caller reads
//! the API server as without it. It never answers wrongly from an empty store.
//!
//! Bounds, for a watched cluster whose users are hostile (a guest): kept objects, bytes of
//! one projection, changes per minute, and the watch's own page and event sizes
//! ([`crate::watch::Options`]). Crossing one ends the watch and empties the store for its
//! lifetime.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use futures::StreamExt;
use kube::api::ApiResource;
use kube::runtime::watcher;
use serde_json::Value;

use crate::cache::{Backoff, over_budget};
use crate::watch::{self, Selector};

/// Makes the projection kept of an object (`None`: keep nothing for it).
pub type Keep = fn(&Value) -> Option<Value>;

/// Bounds of one store.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Objects kept.
    pub objects: usize,
    /// Bytes of one projection (as JSON).
    pub entry_bytes: usize,
    /// Bytes of all projections together.
    pub bytes: usize,
    /// Changes per minute after the first list.
    pub events_per_minute: u32,
    /// Sizes of what the watch reads (list pages, events).
    pub watch: watch::Options,
}

/// (namespace, name).
pub type Key = (Option<String>, String);

/// The kept projections and their sizes as JSON.
type Store = BTreeMap<Key, (Value, usize)>;

/// What one watch keeps.
pub struct Projected {
    what: String,
    objects: Arc<RwLock<Store>>,
    synced: Arc<AtomicBool>,
    gave_up: Arc<AtomicBool>,
    /// The server answered 404 for the kind (not served, e.g. a CRD not installed yet):
    /// the pass reads the API server, and [`Projected::wait_settled`] does not wait.
    unserved: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Projected {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl std::fmt::Debug for Projected {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Projected")
            .field("what", &self.what)
            .field("synced", &self.synced.load(Ordering::Relaxed))
            .field("gave_up", &self.gave_up.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

fn key_of(meta: &kube::core::ObjectMeta) -> Key {
    (
        meta.namespace.clone(),
        meta.name.clone().unwrap_or_default(),
    )
}

impl Projected {
    /// Starts the watch of `resource` objects selected by `selector` (whole objects, or
    /// metadata only when `metadata_only`), keeping `keep` of each. Must be called within a
    /// tokio runtime.
    pub fn start(
        client: &kube::Client,
        resource: &ApiResource,
        selector: Selector,
        metadata_only: bool,
        keep: Keep,
        limits: Limits,
    ) -> Self {
        let objects: Arc<RwLock<Store>> = Arc::default();
        let synced = Arc::new(AtomicBool::new(false));
        let gave_up = Arc::new(AtomicBool::new(false));
        let unserved = Arc::new(AtomicBool::new(false));
        let what = format!(
            "{} {}{}{}",
            resource.kind,
            selector.namespace.as_deref().unwrap_or("*"),
            if selector.labels.is_empty() { "" } else { " " },
            selector.labels
        );
        let task = tokio::spawn(run(
            client.clone(),
            resource.clone(),
            selector,
            metadata_only,
            keep,
            limits,
            objects.clone(),
            [synced.clone(), gave_up.clone(), unserved.clone()],
            what.clone(),
        ));
        Self {
            what,
            objects,
            synced,
            gave_up,
            unserved,
            task,
        }
    }

    /// True once the first list is complete and while the watch is whole.
    pub fn synced(&self) -> bool {
        self.synced.load(Ordering::Acquire)
    }

    /// True when a bound was crossed: the store answers nothing for its lifetime.
    pub fn gave_up(&self) -> bool {
        self.gave_up.load(Ordering::Acquire)
    }

    /// The projection of one object: `Some(None)` when it does not exist (or `keep` kept
    /// nothing of it), `None` when the store does not know (ask the API server).
    pub fn get(&self, namespace: Option<&str>, name: &str) -> Option<Option<Value>> {
        if !self.synced() {
            return None;
        }
        let objects = self.objects.read().unwrap_or_else(|p| p.into_inner());
        Some(
            objects
                .get(&(namespace.map(str::to_string), name.to_string()))
                .map(|(v, _)| v.clone()),
        )
    }

    /// Every kept projection, or `None` when the store does not know.
    pub fn list(&self) -> Option<Vec<(Key, Value)>> {
        if !self.synced() {
            return None;
        }
        let objects = self.objects.read().unwrap_or_else(|p| p.into_inner());
        Some(
            objects
                .iter()
                .map(|(k, (v, _))| (k.clone(), v.clone()))
                .collect(),
        )
    }

    /// True when the server does not serve the kind (its last list answered 404).
    pub fn unserved(&self) -> bool {
        self.unserved.load(Ordering::Acquire)
    }

    /// True once the store is synced, has given up, or its kind is not served.
    pub fn settled(&self) -> bool {
        self.synced() || self.gave_up() || self.unserved()
    }

    /// Waits until the store is [settled](Self::settled), at most `timeout`.
    pub async fn wait_settled(&self, timeout: Duration) -> bool {
        let until = Instant::now() + timeout;
        while !self.settled() && Instant::now() < until {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        self.settled()
    }
}

/// The projection of `object` (as JSON) and its size, if `keep` keeps one within the bound.
fn project(
    object: Value,
    keep: Keep,
    limits: &Limits,
) -> Result<Option<(Value, usize)>, &'static str> {
    let Some(p) = keep(&object) else {
        return Ok(None);
    };
    let size = serde_json::to_vec(&p).map_or(usize::MAX, |b| b.len());
    if size > limits.entry_bytes {
        return Err("entry_bytes");
    }
    Ok(Some((p, size)))
}

/// Bytes an entry counts (the projection as JSON and its key).
fn weight(k: &Key, size: usize) -> usize {
    size + k.1.len() + k.0.as_ref().map_or(0, String::len)
}

#[allow(clippy::too_many_arguments)]
async fn run(
    client: kube::Client,
    resource: ApiResource,
    selector: Selector,
    metadata_only: bool,
    keep: Keep,
    limits: Limits,
    objects: Arc<RwLock<Store>>,
    [synced, gave_up, unserved]: [Arc<AtomicBool>; 3],
    what: String,
) {
    let mut backoff = Backoff::new();
    // Bytes of the store (see `weight`).
    let mut used = 0usize;
    let crossed: &'static str = 'watch: loop {
        let started = Instant::now();
        // Both kinds of stream as one: (key, object as JSON) per event.
        let mut stream: futures::stream::BoxStream<'static, Result<Ev, watch::WatchError>> =
            if metadata_only {
                watch::metadata(client.clone(), &resource, selector.clone(), limits.watch)
                    .map(|r| {
                        r.map(|e| as_json(e, |m| (key_of(&m.metadata), serde_json::to_value(m))))
                    })
                    .boxed()
            } else {
                watch::objects(client.clone(), &resource, selector.clone(), limits.watch)
                    .map(|r| {
                        r.map(|e| as_json(e, |o| (key_of(&o.metadata), serde_json::to_value(o))))
                    })
                    .boxed()
            };
        let mut relist: Option<(Store, usize)> = None;
        let mut window = (Instant::now(), 0u32);
        while let Some(ev) = stream.next().await {
            match ev {
                Ok(Ev::Init) => relist = Some((Store::new(), 0)),
                Ok(Ev::InitApply(k, o)) => {
                    let (list, bytes) = relist.get_or_insert_with(|| (Store::new(), 0));
                    match project(o, keep, &limits) {
                        Ok(Some((p, size))) => {
                            *bytes += weight(&k, size);
                            if let Some((_, old)) = list.insert(k.clone(), (p, size)) {
                                *bytes -= weight(&k, old);
                            }
                        }
                        Ok(None) => {}
                        Err(bound) => break 'watch bound,
                    }
                    if list.len() > limits.objects {
                        break 'watch "objects";
                    }
                    if *bytes > limits.bytes {
                        break 'watch "bytes";
                    }
                }
                Ok(Ev::InitDone) => {
                    let (list, bytes) = relist.take().unwrap_or_default();
                    *objects.write().unwrap_or_else(|p| p.into_inner()) = list;
                    used = bytes;
                    unserved.store(false, Ordering::Release);
                    synced.store(true, Ordering::Release);
                    window = (Instant::now(), 0);
                }
                Ok(Ev::Apply(k, o)) => {
                    if over_budget(&mut window, limits.events_per_minute) {
                        break 'watch "events_per_minute";
                    }
                    let p = match project(o, keep, &limits) {
                        Ok(p) => p,
                        Err(bound) => break 'watch bound,
                    };
                    let mut g = objects.write().unwrap_or_else(|p| p.into_inner());
                    let old = match p {
                        Some((p, size)) => {
                            used += weight(&k, size);
                            g.insert(k.clone(), (p, size))
                        }
                        // No longer kept (e.g. a CSV that lost its property).
                        None => g.remove(&k),
                    };
                    if let Some((_, size)) = old {
                        used -= weight(&k, size);
                    }
                    if g.len() > limits.objects {
                        break 'watch "objects";
                    }
                    if used > limits.bytes {
                        break 'watch "bytes";
                    }
                }
                Ok(Ev::Delete(k)) => {
                    if over_budget(&mut window, limits.events_per_minute) {
                        break 'watch "events_per_minute";
                    }
                    let old = objects
                        .write()
                        .unwrap_or_else(|p| p.into_inner())
                        .remove(&k);
                    if let Some((_, size)) = old {
                        used -= weight(&k, size);
                    }
                }
                Ok(Ev::Undecodable) => {}
                Err(watch::WatchError::TooLarge { what, .. }) => break 'watch what,
                Err(e) => {
                    // Changes may have been missed: nothing is answered until a new list.
                    synced.store(false, Ordering::Release);
                    if e.not_served() {
                        unserved.store(true, Ordering::Release);
                    }
                    tracing::debug!(what = %what, error = %e, "projected watch");
                    break;
                }
            }
        }
        synced.store(false, Ordering::Release);
        backoff.pause(started).await;
    };
    synced.store(false, Ordering::Release);
    gave_up.store(true, Ordering::Release);
    objects.write().unwrap_or_else(|p| p.into_inner()).clear();
    tracing::warn!(what = %what, limit = crossed, ?limits, "a bound was crossed; this store is read from the API server instead");
}

/// A watch event with the object as JSON.
enum Ev {
    Init,
    InitApply(Key, Value),
    InitDone,
    Apply(Key, Value),
    Delete(Key),
    /// An object that does not serialize back to JSON (cannot happen for what was decoded
    /// from JSON; skipped rather than trusted).
    Undecodable,
}

fn as_json<T>(
    e: watcher::Event<T>,
    split: impl Fn(T) -> (Key, Result<Value, serde_json::Error>),
) -> Ev {
    match e {
        watcher::Event::Init => Ev::Init,
        watcher::Event::InitDone => Ev::InitDone,
        watcher::Event::InitApply(o) => match split(o) {
            (k, Ok(v)) => Ev::InitApply(k, v),
            _ => Ev::Undecodable,
        },
        watcher::Event::Apply(o) => match split(o) {
            (k, Ok(v)) => Ev::Apply(k, v),
            _ => Ev::Undecodable,
        },
        watcher::Event::Delete(o) => Ev::Delete(split(o).0),
    }
}
