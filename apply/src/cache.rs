//! A watch-fed cache of the **metadata** of the objects we manage on one cluster, so a
//! converged apply or prune pass asks the API server nothing.
//!
//! One metadata watch per kind, cluster-wide, selected by our label: memory grows with the
//! objects we made (metadata only: names, labels, annotations, managedFields; never a spec
//! or a Secret's data), not with the cluster. A kind counts as known only once its first
//! list is complete; until then (and for a kind the server does not serve) the applier falls
//! back to a GET or LIST, so the cache can only save requests, never answer wrongly from an
//! empty store.
//!
//! The store keeps a **trimmed**, compact entry per object (not kube's reflector store; see
//! `Entry`): names, labels, uid, resourceVersion, deletion timestamp, our desired-hash
//! annotation and a digest of our field manager's managed fields ([`compare::fields_digest`])
//! instead of the managedFields themselves (a Deployment's fieldsV1 tree is tens of
//! kilobytes in memory; at 1,000 hosted clusters they were most of the controller's memory). Whether our fields are all still
//! ours is checked once on the full object (a GET) and remembered as the (desired hash,
//! fields digest) pair seen then ([`WatchCache::verified`]); while the cached pair is the
//! same, nothing needs to be read again. After a restart that costs one GET per object.
//!
//! A watch lags our own writes by a few milliseconds; what we wrote is kept in an overlay
//! until the store has caught up (its resourceVersion is at least ours) or for
//! [`OVERLAY_TTL`] at most, so a pass right after an apply does not write the object again.
//! resourceVersions are opaque to clients in general; the kube-apiserver's are etcd
//! revisions, compared as integers here, and anything unparseable defers to the store.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::ApiResource;
use kube::core::ObjectMeta;
use kube::runtime::watcher;
use serde_json::Value;

use crate::compare;

/// Called with each changed object's metadata once the store holds the change (not for the
/// first list): a controller maps it to what to reconcile, so that reconcile reads a store
/// that already has the change.
pub type OnChange = Arc<dyn Fn(&ObjectMeta) + Send + Sync>;

/// How long what we wrote overrides the store at most.
pub const OVERLAY_TTL: Duration = Duration::from_secs(30);

/// Bounds of a cache where someone else decides what matches (a guest's users can label
/// anything as ours). A kind that crosses one gives up its watch and store for the cache's
/// lifetime and is read from the API server instead (as without a cache).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Objects held per kind.
    pub objects_per_kind: usize,
    /// Bytes of all entries of the cache together (names, labels, annotations we keep).
    pub bytes: usize,
    /// Bytes of one entry: metadata larger than this (long labels) is refused before any
    /// of it is kept.
    pub entry_bytes: usize,
    /// Changes per kind per minute after the first list (each one is decoded and hashed).
    pub events_per_minute: u32,
    /// Sizes of what the watches read (list pages, events).
    pub watch: crate::watch::Options,
}

impl Limits {
    /// No bound (the management cluster's cache: only we and HyperShift write there).
    pub const NONE: Self = Self {
        objects_per_kind: usize::MAX,
        bytes: usize::MAX,
        entry_bytes: usize::MAX,
        events_per_minute: u32::MAX,
        watch: crate::watch::Options::DEFAULT,
    };
}

/// Why a kind gave up.
fn exceeded(what: &'static str, kind: &str, limits: &Limits) {
    tracing::warn!(kind = %kind, limit = what, ?limits, "a cache bound was crossed; this kind is read from the API server instead");
}

/// Backoff between a failed watch and the next list: doubles from 1 s to 60 s, reset once
/// a watch has lasted longer than 60 s.
const RETRY_MIN: Duration = Duration::from_secs(1);
const RETRY_MAX: Duration = Duration::from_secs(60);

/// The pause before listing again after a watch ended ([`RETRY_MIN`] to [`RETRY_MAX`]). It
/// grows unless the watch had lasted, so a server that answers the list and then ends every
/// watch at once is not listed every second. Shared with [`crate::projected`].
pub(crate) struct Backoff(Duration);

impl Backoff {
    pub(crate) fn new() -> Self {
        Self(RETRY_MIN)
    }

    /// Sleeps after a watch that was opened at `started`.
    pub(crate) async fn pause(&mut self, started: Instant) {
        if started.elapsed() > RETRY_MAX {
            self.0 = RETRY_MIN;
        }
        tokio::time::sleep(self.0).await;
        self.0 = (self.0 * 2).min(RETRY_MAX);
    }
}

fn read(objects: &std::sync::RwLock<Objects>) -> std::sync::RwLockReadGuard<'_, Objects> {
    objects.read().unwrap_or_else(|p| p.into_inner())
}

fn write(objects: &std::sync::RwLock<Objects>) -> std::sync::RwLockWriteGuard<'_, Objects> {
    objects.write().unwrap_or_else(|p| p.into_inner())
}

/// What the cache keeps of one object (see the module docs). Not kube's reflector store:
/// its key repeats the kind's `ApiResource` (five strings) for every object and its values
/// are whole `ObjectMeta`s with two `BTreeMap`s, which at 1,000 hosted clusters made this
/// cache about 80 KiB per cluster; an entry here is a few hundred bytes, and namespaces and
/// label strings, repeated across a cluster's objects, are shared ([`Interner`]).
struct Entry {
    uid: Option<Box<str>>,
    resource_version: Option<Box<str>>,
    deletion_timestamp: Option<Time>,
    labels: Box<[(Arc<str>, Arc<str>)]>,
    /// Our desired-hash annotation.
    hash: Option<Box<str>>,
    /// [`compare::fields_digest`] of our field manager's managed fields.
    digest: Box<str>,
}

/// (namespace, name).
type EntryKey = (Option<Arc<str>>, Box<str>);
type Objects = HashMap<EntryKey, Entry>;

/// Shares equal strings (namespaces, label keys and values) between entries. Strings no
/// entry uses any more are dropped whenever a kind completes a (re)list.
#[derive(Default)]
struct Interner(Mutex<std::collections::HashSet<Arc<str>>>);

impl Interner {
    fn get(&self, s: &str) -> Arc<str> {
        let mut set = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(a) = set.get(s) {
            return a.clone();
        }
        let a: Arc<str> = Arc::from(s);
        set.insert(a.clone());
        a
    }

    fn purge(&self) {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .retain(|a| Arc::strong_count(a) > 1);
    }
}

impl Entry {
    /// The entry for `meta` (full metadata, with managedFields) and its key.
    fn of(meta: &ObjectMeta, field_manager: &str, strings: &Interner) -> (EntryKey, Self) {
        let full = serde_json::json!({ "metadata": meta });
        let digest = compare::fields_digest(&full, field_manager).into_boxed_str();
        let hash = compare::hash_annotation(&full).map(Box::from);
        let labels = meta
            .labels
            .iter()
            .flatten()
            .map(|(k, v)| (strings.get(k), strings.get(v)))
            .collect();
        let key = (
            meta.namespace.as_deref().map(|n| strings.get(n)),
            Box::from(meta.name.as_deref().unwrap_or_default()),
        );
        let entry = Self {
            uid: meta.uid.as_deref().map(Box::from),
            resource_version: meta.resource_version.as_deref().map(Box::from),
            deletion_timestamp: meta.deletion_timestamp.clone(),
            labels,
            hash,
            digest,
        };
        (key, entry)
    }

    /// Bytes this entry keeps (an estimate: strings plus a fixed overhead).
    fn bytes(&self, key: &EntryKey) -> usize {
        footprint(
            [
                Some(key.1.as_ref()),
                key.0.as_deref(),
                self.uid.as_deref(),
                self.resource_version.as_deref(),
                self.hash.as_deref(),
                Some(self.digest.as_ref()),
            ],
            self.labels.iter().map(|(k, v)| (k.as_ref(), v.as_ref())),
        )
    }

    /// What an entry for `meta` would keep ([`Self::bytes`]), before anything is kept or
    /// interned (the digest counted at its SHA-256 hex length).
    fn would_keep(meta: &ObjectMeta) -> usize {
        footprint(
            [
                meta.name.as_deref(),
                meta.namespace.as_deref(),
                meta.uid.as_deref(),
                meta.resource_version.as_deref(),
                meta.annotations
                    .as_ref()
                    .and_then(|a| a.get(compare::DESIRED_HASH_ANNOTATION))
                    .map(String::as_str),
                Some(DIGEST_SIZED),
            ],
            meta.labels
                .iter()
                .flatten()
                .map(|(k, v)| (k.as_str(), v.as_str())),
        )
    }

    /// The trimmed metadata this entry stands for (as [`trim`] leaves it).
    fn meta(&self, key: &EntryKey) -> ObjectMeta {
        let mut annotations = BTreeMap::new();
        if let Some(h) = &self.hash {
            annotations.insert(compare::DESIRED_HASH_ANNOTATION.to_string(), h.to_string());
        }
        annotations.insert(
            compare::FIELDS_DIGEST_ANNOTATION.to_string(),
            self.digest.to_string(),
        );
        ObjectMeta {
            name: Some(key.1.to_string()),
            namespace: key.0.as_deref().map(str::to_string),
            uid: self.uid.as_deref().map(str::to_string),
            resource_version: self.resource_version.as_deref().map(str::to_string),
            deletion_timestamp: self.deletion_timestamp.clone(),
            labels: (!self.labels.is_empty()).then(|| {
                self.labels
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect()
            }),
            annotations: Some(annotations),
            ..Default::default()
        }
    }

    fn matches(&self, selector: &BTreeMap<String, String>) -> bool {
        selector.iter().all(|(k, v)| {
            self.labels
                .iter()
                .any(|(lk, lv)| lk.as_ref() == k.as_str() && lv.as_ref() == v.as_str())
        })
    }
}

struct Kind {
    resource: ApiResource,
    objects: Arc<std::sync::RwLock<Objects>>,
    /// The first list completed: the store is authoritative.
    synced: Arc<AtomicBool>,
    /// The server answered 404 for the kind (not served, e.g. a CRD not installed): it
    /// is read from the API server, and [`WatchCache::settled`] does not wait for it.
    unserved: Arc<AtomicBool>,
    /// More objects matched than the cache's limit: the watch stopped, the store was
    /// emptied, and the kind is read from the API server for the cache's lifetime.
    overflowed: Arc<AtomicBool>,
}

enum Overlay {
    Written { rv: u64, meta: Box<ObjectMeta> },
    Deleted { uid: Option<String> },
}

/// Metadata of our objects on one cluster, kept by watches. Dropping it stops the watches.
pub struct WatchCache {
    kinds: Vec<Kind>,
    overlay: Mutex<HashMap<String, (Instant, Overlay)>>,
    /// Per object id: the (desired hash, fields digest) last confirmed up to date.
    verified: Mutex<HashMap<String, (String, String)>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl std::fmt::Debug for WatchCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WatchCache")
            .field(
                "kinds",
                &self
                    .kinds
                    .iter()
                    .map(|k| (&k.resource.kind, k.synced.load(Ordering::Relaxed)))
                    .collect::<Vec<_>>(),
            )
            .finish_non_exhaustive()
    }
}

impl Drop for WatchCache {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

fn key(kind: &str, namespace: Option<&str>, name: &str) -> String {
    match namespace {
        Some(ns) => format!("{kind}/{ns}/{name}"),
        None => format!("{kind}/{name}"),
    }
}

/// The key of the object `meta` describes.
fn id_of(resource: &ApiResource, meta: &ObjectMeta) -> String {
    key(
        &resource.kind,
        meta.namespace.as_deref(),
        meta.name.as_deref().unwrap_or_default(),
    )
}

/// Keeps what the applier and pruner need of `meta` (see the module docs).
pub fn trim(meta: &mut ObjectMeta, field_manager: &str) {
    let full = serde_json::json!({ "metadata": &*meta });
    let digest = compare::fields_digest(&full, field_manager);
    let hash = compare::hash_annotation(&full).map(str::to_string);
    let mut annotations = std::collections::BTreeMap::new();
    if let Some(h) = hash {
        annotations.insert(compare::DESIRED_HASH_ANNOTATION.to_string(), h);
    }
    annotations.insert(compare::FIELDS_DIGEST_ANNOTATION.to_string(), digest);
    meta.annotations = Some(annotations);
    meta.managed_fields = None;
    meta.owner_references = None;
    meta.finalizers = None;
}

fn rv(meta: &ObjectMeta) -> Option<u64> {
    meta.resource_version.as_deref()?.parse().ok()
}

/// A string as long as a fields digest (SHA-256 in hex), for estimates before one exists.
const DIGEST_SIZED: &str = "0000000000000000000000000000000000000000000000000000000000000000";

/// The estimate behind [`Entry::bytes`]: the strings, 32 bytes per label, 96 per entry.
fn footprint<'a>(
    strings: [Option<&str>; 6],
    labels: impl Iterator<Item = (&'a str, &'a str)>,
) -> usize {
    96 + strings.iter().flatten().map(|s| s.len()).sum::<usize>()
        + labels.map(|(k, v)| 32 + k.len() + v.len()).sum::<usize>()
}

/// Counts one change in the (start, changes) window of a minute; true when it is one more
/// than `limit` allows.
pub(crate) fn over_budget(window: &mut (Instant, u32), limit: u32) -> bool {
    if window.0.elapsed() >= Duration::from_secs(60) {
        *window = (Instant::now(), 0);
    }
    window.1 = window.1.saturating_add(1);
    window.1 > limit
}

/// Sets this kind's share of the cache's bytes (`mine`) to `now`, keeping `used` (every
/// kind's shares) in step.
fn account(used: &std::sync::atomic::AtomicUsize, mine: &mut usize, now: usize) {
    if now >= *mine {
        used.fetch_add(now - *mine, Ordering::AcqRel);
    } else {
        used.fetch_sub(*mine - now, Ordering::AcqRel);
    }
    *mine = now;
}

/// Drops unused interned strings every 256 changes (labels replaced by a change stay
/// interned until then; between lists that would grow with every relabelling).
fn purge_now(strings: &Interner, since: &mut u32) {
    *since += 1;
    if *since >= 256 {
        strings.purge();
        *since = 0;
    }
}

impl WatchCache {
    /// Starts one metadata watch per kind in `kinds` over all namespaces, selecting
    /// `label_selector`. Must be called within a tokio runtime.
    pub fn start(
        client: &kube::Client,
        kinds: &[ApiResource],
        label_selector: &str,
        field_manager: &str,
    ) -> Self {
        Self::start_with(client, kinds, label_selector, field_manager, None)
    }

    /// [`Self::start`], calling `on_change` for every change after the store has it.
    pub fn start_with(
        client: &kube::Client,
        kinds: &[ApiResource],
        label_selector: &str,
        field_manager: &str,
        on_change: Option<OnChange>,
    ) -> Self {
        Self::start_limited(
            client,
            kinds,
            label_selector,
            field_manager,
            on_change,
            Limits::NONE,
        )
    }

    /// [`Self::start_with`] within `limits`. Where someone else decides what matches (a
    /// guest's users can label anything as ours), this bounds the memory and the work: a
    /// kind that crosses a bound gives up its watch and store at once and is read from the
    /// API server instead (as without a cache), for as long as this cache lives.
    pub fn start_limited(
        client: &kube::Client,
        kinds: &[ApiResource],
        label_selector: &str,
        field_manager: &str,
        on_change: Option<OnChange>,
        limits: Limits,
    ) -> Self {
        let mut out = Self {
            kinds: Vec::new(),
            overlay: Mutex::new(HashMap::new()),
            verified: Mutex::new(HashMap::new()),
            tasks: Vec::new(),
        };
        let strings = Arc::new(Interner::default());
        let used = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        for resource in kinds {
            let objects: Arc<std::sync::RwLock<Objects>> = Arc::default();
            let store = objects.clone();
            let synced = Arc::new(AtomicBool::new(false));
            let unserved = Arc::new(AtomicBool::new(false));
            let not_served = unserved.clone();
            let overflowed = Arc::new(AtomicBool::new(false));
            let overflow = overflowed.clone();
            let client = client.clone();
            let resource_ = resource.clone();
            let flag = synced.clone();
            let kind = resource.kind.clone();
            let on_change = on_change.clone();
            let manager = field_manager.to_string();
            let strings = strings.clone();
            let used = used.clone();
            let selector = label_selector.to_string();
            out.tasks.push(tokio::spawn(async move {
                // This kind's share of `used`.
                let mut mine = 0usize;
                let mut backoff = Backoff::new();
                let mut window = (Instant::now(), 0u32);
                let mut since_purge = 0u32;
                // A bound crossed ends both loops.
                let crossed: &'static str = 'watch: loop {
                    let started = Instant::now();
                    let stream = crate::watch::metadata(
                        client.clone(),
                        &resource_,
                        crate::watch::Selector::labels(&selector),
                        limits.watch,
                    );
                    futures::pin_mut!(stream);
                    // A (re)list is collected here and replaces the store once complete.
                    let mut relist: Option<(Objects, usize)> = None;
                    while let Some(ev) = stream.next().await {
                        match ev {
                            Ok(watcher::Event::Init) => relist = Some((Objects::new(), 0)),
                            Ok(watcher::Event::InitApply(m)) => {
                                let size = Entry::would_keep(&m.metadata);
                                if size > limits.entry_bytes {
                                    break 'watch "entry_bytes";
                                }
                                let (k, e) = Entry::of(&m.metadata, &manager, &strings);
                                let (objects, bytes) =
                                    relist.get_or_insert_with(|| (Objects::new(), 0));
                                *bytes += e.bytes(&k);
                                if let Some(old) = objects.insert(k.clone(), e) {
                                    *bytes -= old.bytes(&k);
                                }
                                if objects.len() > limits.objects_per_kind {
                                    break 'watch "objects_per_kind";
                                }
                                // Others' share plus this list so far.
                                let others = used.load(Ordering::Acquire) - mine;
                                if others.saturating_add(*bytes) > limits.bytes {
                                    break 'watch "bytes";
                                }
                            }
                            Ok(watcher::Event::InitDone) => {
                                let (objects, bytes) = relist.take().unwrap_or_default();
                                *write(&store) = objects;
                                account(&used, &mut mine, bytes);
                                strings.purge();
                                since_purge = 0;
                                window = (Instant::now(), 0);
                                not_served.store(false, Ordering::Release);
                                if !flag.swap(true, Ordering::AcqRel) {
                                    tracing::debug!(kind = %kind, "metadata cache synced");
                                }
                            }
                            Ok(watcher::Event::Apply(m)) => {
                                if over_budget(&mut window, limits.events_per_minute) {
                                    break 'watch "events_per_minute";
                                }
                                if Entry::would_keep(&m.metadata) > limits.entry_bytes {
                                    break 'watch "entry_bytes";
                                }
                                let (k, e) = Entry::of(&m.metadata, &manager, &strings);
                                let added = e.bytes(&k);
                                let (len, removed) = {
                                    let mut objects = write(&store);
                                    let removed =
                                        objects.insert(k.clone(), e).map_or(0, |o| o.bytes(&k));
                                    (objects.len(), removed)
                                };
                                let now = mine + added - removed;
                                account(&used, &mut mine, now);
                                if len > limits.objects_per_kind {
                                    break 'watch "objects_per_kind";
                                }
                                if used.load(Ordering::Acquire) > limits.bytes {
                                    break 'watch "bytes";
                                }
                                purge_now(&strings, &mut since_purge);
                                // A watch that failed and resumed is whole again once it
                                // delivers.
                                flag.store(true, Ordering::Release);
                                if let Some(f) = &on_change {
                                    f(&m.metadata);
                                }
                            }
                            Ok(watcher::Event::Delete(m)) => {
                                if over_budget(&mut window, limits.events_per_minute) {
                                    break 'watch "events_per_minute";
                                }
                                let k: EntryKey = (
                                    m.metadata.namespace.as_deref().map(Arc::from),
                                    Box::from(m.metadata.name.as_deref().unwrap_or_default()),
                                );
                                if let Some(old) = write(&store).remove(&k) {
                                    let now = mine - old.bytes(&k);
                                    account(&used, &mut mine, now);
                                }
                                purge_now(&strings, &mut since_purge);
                                flag.store(true, Ordering::Release);
                                if let Some(f) = &on_change {
                                    f(&m.metadata);
                                }
                            }
                            Err(crate::watch::WatchError::TooLarge { what, .. }) => {
                                break 'watch what;
                            }
                            Err(e) => {
                                // Events may have been missed: nothing is answered from
                                // this kind until a new list is complete.
                                flag.store(false, Ordering::Release);
                                if e.not_served() {
                                    not_served.store(true, Ordering::Release);
                                } else {
                                    tracing::debug!(kind = %kind, error = %e, "metadata watch");
                                }
                                break;
                            }
                        }
                    }
                    // Nothing is answered from a stream that ended until a new list.
                    flag.store(false, Ordering::Release);
                    // The watch failed (or its stream ended): list again after a pause.
                    backoff.pause(started).await;
                };
                flag.store(false, Ordering::Release);
                overflow.store(true, Ordering::Release);
                *write(&store) = Objects::new();
                account(&used, &mut mine, 0);
                strings.purge();
                exceeded(crossed, &kind, &limits);
            }));
            out.kinds.push(Kind {
                resource: resource.clone(),
                objects,
                synced,
                unserved,
                overflowed,
            });
        }
        out
    }

    fn kind(&self, resource: &ApiResource) -> Option<&Kind> {
        self.kinds.iter().find(|k| {
            k.resource.group == resource.group
                && k.resource.kind == resource.kind
                && k.synced.load(Ordering::Acquire)
        })
    }

    /// True when every kind has completed its first list.
    pub fn synced(&self) -> bool {
        self.kinds.iter().all(|k| k.synced.load(Ordering::Acquire))
    }

    /// True when every kind has completed its first list, is not served, or holds more
    /// objects than the limit.
    pub fn settled(&self) -> bool {
        self.kinds.iter().all(|k| {
            k.synced.load(Ordering::Acquire)
                || k.unserved.load(Ordering::Acquire)
                || k.overflowed.load(Ordering::Acquire)
        })
    }

    /// The kinds that gave up for holding more objects than the limit.
    pub fn overflowed(&self) -> Vec<String> {
        self.kinds
            .iter()
            .filter(|k| k.overflowed.load(Ordering::Acquire))
            .map(|k| k.resource.kind.clone())
            .collect()
    }

    /// The metadata of one object as `{"metadata": ...}`: `Some(None)` when it does not
    /// exist, `None` when the cache does not know (kind unsynced: ask the API server).
    pub fn get(
        &self,
        resource: &ApiResource,
        namespace: Option<&str>,
        name: &str,
    ) -> Option<Option<Value>> {
        let kind = self.kind(resource)?;
        let k: EntryKey = (namespace.map(Arc::from), Box::from(name));
        let stored = read(&kind.objects).get(&k).map(|e| e.meta(&k));
        let id = key(&resource.kind, namespace, name);
        let mut overlay = self.overlay.lock().unwrap_or_else(|p| p.into_inner());
        let meta = match overlay.get(&id) {
            Some((at, _)) if at.elapsed() > OVERLAY_TTL => {
                overlay.remove(&id);
                stored
            }
            Some((_, Overlay::Written { rv: ours, meta })) => match &stored {
                Some(s) if rv(s).is_none_or(|theirs| theirs >= *ours) => {
                    overlay.remove(&id);
                    stored
                }
                _ => Some(meta.as_ref().clone()),
            },
            Some((_, Overlay::Deleted { uid })) => match &stored {
                Some(s) if s.uid == *uid => None,
                _ => {
                    overlay.remove(&id);
                    stored
                }
            },
            None => stored,
        };
        Some(meta.map(|m| serde_json::json!({ "metadata": m })))
    }

    /// The metadata of every object of `resource` (in `namespace`, or all) carrying all
    /// `selector` labels; `None` when the cache does not know the kind.
    pub fn list(
        &self,
        resource: &ApiResource,
        namespace: Option<&str>,
        selector: &BTreeMap<String, String>,
    ) -> Option<Vec<ObjectMeta>> {
        let kind = self.kind(resource)?;
        let overlay = self.overlay.lock().unwrap_or_else(|p| p.into_inner());
        Some(
            read(&kind.objects)
                .iter()
                .filter(|((ns, _), e)| {
                    namespace.is_none_or(|want| ns.as_deref() == Some(want)) && e.matches(selector)
                })
                .map(|(k, e)| e.meta(k))
                .filter(|md| {
                    let id = key(
                        &resource.kind,
                        md.namespace.as_deref(),
                        md.name.as_deref().unwrap_or_default(),
                    );
                    !matches!(overlay.get(&id), Some((at, Overlay::Deleted { uid }))
                        if at.elapsed() <= OVERLAY_TTL && *uid == md.uid)
                })
                .collect(),
        )
    }

    /// Records an object we just wrote (the API server's answer; `field_manager` wrote it).
    pub fn wrote(&self, resource: &ApiResource, meta: &ObjectMeta, field_manager: &str) {
        let (Some(name), Some(ours)) = (meta.name.as_deref(), rv(meta)) else {
            return;
        };
        if self.kind(resource).is_none() {
            return;
        }
        let id = key(&resource.kind, meta.namespace.as_deref(), name);
        let mut trimmed = meta.clone();
        trim(&mut trimmed, field_manager);
        // What we just applied is up to date by definition.
        if let Some(pair) = Self::pair(&trimmed) {
            self.verified
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(id.clone(), pair);
        }
        let mut overlay = self.overlay.lock().unwrap_or_else(|p| p.into_inner());
        overlay.retain(|_, (at, _)| at.elapsed() <= OVERLAY_TTL);
        overlay.insert(
            id,
            (
                Instant::now(),
                Overlay::Written {
                    rv: ours,
                    meta: Box::new(trimmed),
                },
            ),
        );
    }

    /// Records an object we just deleted.
    pub fn deleted(&self, resource: &ApiResource, meta: &ObjectMeta) {
        let Some(name) = meta.name.as_deref() else {
            return;
        };
        if self.kind(resource).is_none() {
            return;
        }
        let id = key(&resource.kind, meta.namespace.as_deref(), name);
        self.verified
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&id);
        let mut overlay = self.overlay.lock().unwrap_or_else(|p| p.into_inner());
        overlay.retain(|_, (at, _)| at.elapsed() <= OVERLAY_TTL);
        overlay.insert(
            id,
            (
                Instant::now(),
                Overlay::Deleted {
                    uid: meta.uid.clone(),
                },
            ),
        );
    }

    /// (desired hash, fields digest) of a trimmed object.
    fn pair(meta: &ObjectMeta) -> Option<(String, String)> {
        let a = meta.annotations.as_ref()?;
        Some((
            a.get(compare::DESIRED_HASH_ANNOTATION)?.clone(),
            a.get(compare::FIELDS_DIGEST_ANNOTATION)?.clone(),
        ))
    }

    /// Whether the cached (trimmed) object `live` (as returned by [`Self::get`]) was
    /// confirmed up to date for desired hash `hash` with its current managed fields.
    pub fn is_verified(&self, resource: &ApiResource, live: &Value, hash: &str) -> bool {
        let Ok(meta) = serde_json::from_value::<ObjectMeta>(live["metadata"].clone()) else {
            return false;
        };
        let Some(pair) = Self::pair(&meta) else {
            return false;
        };
        let id = id_of(resource, &meta);
        pair.0 == hash
            && self
                .verified
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .get(&id)
                == Some(&pair)
    }

    /// Records that the full object `full` (metadata with managedFields) is up to date.
    pub fn verify(&self, resource: &ApiResource, full: &Value, field_manager: &str) {
        let Ok(mut meta) = serde_json::from_value::<ObjectMeta>(full["metadata"].clone()) else {
            return;
        };
        let id = id_of(resource, &meta);
        trim(&mut meta, field_manager);
        if let Some(pair) = Self::pair(&meta) {
            self.verified
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(id, pair);
        }
    }

    /// Objects held (all kinds), for metrics and tests.
    pub fn len(&self) -> usize {
        self.kinds.iter().map(|k| read(&k.objects).len()).sum()
    }

    /// True when no object is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Waits until [`Self::settled`], or `timeout` passes; returns [`Self::settled`].
    pub async fn wait_settled(&self, timeout: Duration) -> bool {
        let until = Instant::now() + timeout;
        while !self.settled() && Instant::now() < until {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        self.settled()
    }
}
