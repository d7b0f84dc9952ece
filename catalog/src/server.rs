//! `api.Registry` and `grpc.health.v1.Health` over a loaded [`Catalog`],
//! answering like `opm serve`.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use hcp_olm_proto::api::registry_server::{Registry, RegistryServer};
use hcp_olm_proto::api::{self, Bundle, ChannelEntry};
use hcp_olm_proto::health::health_check_response::ServingStatus;
use hcp_olm_proto::health::health_server::{Health, HealthServer};
use hcp_olm_proto::health::{
    HealthCheckRequest, HealthCheckResponse, HealthListRequest, HealthListResponse,
};
use tokio_stream::Stream;
use tonic::{Request, Response, Status};

use crate::blob::Blobs;
use crate::limits::{CallLimitLayer, Fair, Limits, PeerInfo};
use crate::model::{BundleData, Catalog, Entry, Gvk};

type BoxStream<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send + 'static>>;

fn stream_of<T: Send + 'static>(items: Vec<T>) -> BoxStream<T> {
    Box::pin(tokio_stream::iter(items.into_iter().map(Ok)))
}

/// The Registry service.
#[derive(Debug, Clone)]
pub struct RegistryService {
    catalog: Arc<Catalog>,
    fair: Option<Arc<Fair>>,
}

impl RegistryService {
    /// Serves `catalog` with no CPU fairness (every call computes at once).
    pub fn new(catalog: Arc<Catalog>) -> Self {
        RegistryService {
            catalog,
            fair: None,
        }
    }

    /// Serves `catalog`; handlers that render bundles or scan the catalog
    /// take a CPU slot of `fair` while they compute.
    pub fn with_fairness(catalog: Arc<Catalog>, fair: Arc<Fair>) -> Self {
        RegistryService {
            catalog,
            fair: Some(fair),
        }
    }

    /// Runs `f` on this service for the caller of `req`: at once without
    /// fairness; else once the caller has a CPU slot (round-robin over
    /// peers), on a render thread (see [`crate::render_pool`]).
    async fn compute<T, R: Send + 'static>(
        &self,
        req: &Request<T>,
        f: impl FnOnce(&RegistryService) -> Result<R, Status> + Send + 'static,
    ) -> Result<R, Status> {
        match &self.fair {
            None => f(self),
            Some(fair) => {
                let me = self.clone();
                fair.compute(PeerInfo::peer_of(req), move || f(&me))
                    .await
                    .map_err(|e| Status::internal(e.to_string()))?
            }
        }
    }

    fn bundle(&self, pkg: &str, channel: &str, name: &str) -> Result<Bundle, Status> {
        let p = self
            .catalog
            .packages
            .get(pkg)
            .ok_or_else(|| Status::unknown(format!("package {pkg:?} not found")))?;
        let c = p.channels.get(channel).ok_or_else(|| {
            Status::unknown(format!("package {pkg:?}, channel {channel:?} not found"))
        })?;
        let e = c.entries.get(name).ok_or_else(|| {
            Status::unknown(format!(
                "package {pkg:?}, channel {channel:?}, bundle {name:?} not found"
            ))
        })?;
        Ok(trimmed(to_api(
            &self.catalog.blobs,
            &p.bundles[name],
            channel,
            e,
            true,
        )))
    }

    fn entries_for(
        &self,
        pkg: &str,
        channel: &str,
        name: &str,
        ignore_channel: bool,
    ) -> Vec<ChannelEntry> {
        let c = &self.catalog.packages[pkg].channels[channel];
        let e = &c.entries[name];
        let mk = |replaces: &str| ChannelEntry {
            package_name: pkg.to_string(),
            channel_name: channel.to_string(),
            bundle_name: name.to_string(),
            replaces: replaces.to_string(),
        };
        let mut out = vec![mk(&e.replaces)];
        for s in &e.skips {
            if *s != e.replaces && (ignore_channel || c.entries.contains_key(s)) {
                out.push(mk(s));
            }
        }
        out
    }

    fn latest_providing(&self, gvk: &Gvk) -> Vec<ChannelEntry> {
        let mut out = Vec::new();
        for (p, c, e) in self.catalog.providers(gvk) {
            if c.head == e.name {
                out.extend(self.entries_for(&p.name, &c.name, &e.name, false));
            }
        }
        out
    }

    fn channel_head(&self, r: api::GetBundleInChannelRequest) -> Result<Bundle, Status> {
        let p = self
            .catalog
            .packages
            .get(&r.pkg_name)
            .ok_or_else(|| Status::unknown(format!("package {:?} not found", r.pkg_name)))?;
        let c = p.channels.get(&r.channel_name).ok_or_else(|| {
            Status::unknown(format!(
                "package {:?}, channel {:?} not found",
                r.pkg_name, r.channel_name
            ))
        })?;
        self.bundle(&r.pkg_name, &r.channel_name, &c.head)
    }

    fn replacing(&self, name: &str) -> Result<Vec<ChannelEntry>, Status> {
        let mut out = Vec::new();
        for p in self.catalog.packages.values() {
            for c in p.channels.values() {
                for e in c.entries.values() {
                    let mk = || ChannelEntry {
                        package_name: p.name.clone(),
                        channel_name: c.name.clone(),
                        bundle_name: e.name.clone(),
                        replaces: e.replaces.clone(),
                    };
                    if e.replaces == name {
                        out.push(mk());
                    }
                    for s in &e.skips {
                        if *s == name && *s != e.replaces {
                            out.push(mk());
                        }
                    }
                }
            }
        }
        if out.is_empty() {
            return Err(Status::unknown(format!(
                "no channel entries found that replace {name}"
            )));
        }
        Ok(out)
    }

    fn replacement(&self, r: api::GetReplacementRequest) -> Result<Bundle, Status> {
        let p = self
            .catalog
            .packages
            .get(&r.pkg_name)
            .ok_or_else(|| Status::unknown(format!("package {} not found", r.pkg_name)))?;
        let c = p.channels.get(&r.channel_name).ok_or_else(|| {
            Status::unknown(format!(
                "package {:?}, channel {:?} not found",
                r.pkg_name, r.channel_name
            ))
        })?;
        let found = c
            .entries
            .values()
            .find(|e| e.replaces == r.csv_name || e.skips.contains(&r.csv_name))
            .ok_or_else(|| {
                Status::unknown(format!(
                    "no entry found for package {:?}, channel {:?}",
                    r.pkg_name, r.channel_name
                ))
            })?;
        self.bundle(&r.pkg_name, &r.channel_name, &found.name)
    }

    fn providing(&self, r: api::GetAllProvidersRequest) -> Result<Vec<ChannelEntry>, Status> {
        let gvk = Gvk {
            group: r.group,
            version: r.version,
            kind: r.kind,
        };
        let mut out = Vec::new();
        for (p, c, e) in self.catalog.providers(&gvk) {
            out.extend(self.entries_for(&p.name, &c.name, &e.name, true));
        }
        if out.is_empty() {
            return Err(no_provider(&gvk));
        }
        Ok(out)
    }

    fn latest_entries(
        &self,
        r: api::GetLatestProvidersRequest,
    ) -> Result<Vec<ChannelEntry>, Status> {
        let gvk = Gvk {
            group: r.group,
            version: r.version,
            kind: r.kind,
        };
        let out = self.latest_providing(&gvk);
        if out.is_empty() {
            return Err(no_provider(&gvk));
        }
        Ok(out)
    }

    fn default_provider(&self, r: api::GetDefaultProviderRequest) -> Result<Bundle, Status> {
        let gvk = Gvk {
            group: r.group,
            version: r.version,
            kind: r.kind,
        };
        let mut latest = self.latest_providing(&gvk);
        if latest.is_empty() {
            return Err(no_provider(&gvk));
        }
        latest.sort_by(|a, b| a.package_name.cmp(&b.package_name));
        for e in latest {
            if self.catalog.packages[&e.package_name].default_channel == e.channel_name {
                return self.bundle(&e.package_name, &e.channel_name, &e.bundle_name);
            }
        }
        Err(Status::unknown(format!(
            "no entry found that provides group:{:?} version:{:?} kind:{:?}",
            gvk.group, gvk.version, gvk.kind
        )))
    }
}

/// Builds the full API bundle of `data` as listed in `channel`; `content`
/// says whether `csvJson` and `object` are filled in (from `blobs`).
pub fn to_api(blobs: &Blobs, data: &BundleData, channel: &str, e: &Entry, content: bool) -> Bundle {
    let gvk = |g: &Gvk| api::GroupVersionKind {
        group: g.group.clone(),
        version: g.version.clone(),
        kind: g.kind.clone(),
        plural: String::new(),
    };
    let (csv_json, object) = if content {
        let mut reader = blobs.reader();
        (
            data.csv_json.render(&mut reader),
            data.objects.iter().map(|t| t.render(&mut reader)).collect(),
        )
    } else {
        (String::new(), Vec::new())
    };
    Bundle {
        csv_name: data.name.clone(),
        package_name: data.package.clone(),
        channel_name: channel.to_string(),
        csv_json,
        object,
        bundle_path: data.image.clone(),
        provided_apis: data.provided.iter().map(gvk).collect(),
        required_apis: data.required.iter().map(gvk).collect(),
        version: data.version.clone(),
        skip_range: e.skip_range.clone(),
        dependencies: data
            .dependencies
            .iter()
            .map(|(t, v)| api::Dependency {
                r#type: t.clone(),
                value: v.clone(),
            })
            .collect(),
        properties: data
            .properties
            .iter()
            .map(|(t, v)| api::Property {
                r#type: t.clone(),
                value: v.clone(),
            })
            .collect(),
        replaces: e.replaces.clone(),
        skips: e.skips.clone(),
        deprecation: data
            .deprecation
            .as_ref()
            .map(|m| api::Deprecation { message: m.clone() }),
    }
}

fn no_provider(gvk: &Gvk) -> Status {
    Status::unknown(format!(
        "no channel entries found that provide group:{:?} version:{:?} kind:{:?}",
        gvk.group, gvk.version, gvk.kind
    ))
}

fn trimmed(mut b: Bundle) -> Bundle {
    b.replaces.clear();
    b.skips.clear();
    b
}

fn deprecation(m: Option<&String>) -> Option<api::Deprecation> {
    m.map(|m| api::Deprecation { message: m.clone() })
}

#[tonic::async_trait]
impl Registry for RegistryService {
    type ListPackagesStream = BoxStream<api::PackageName>;
    type GetChannelEntriesThatReplaceStream = BoxStream<ChannelEntry>;
    type GetChannelEntriesThatProvideStream = BoxStream<ChannelEntry>;
    type GetLatestChannelEntriesThatProvideStream = BoxStream<ChannelEntry>;
    type ListBundlesStream = BoxStream<Bundle>;

    async fn list_packages(
        &self,
        _req: Request<api::ListPackageRequest>,
    ) -> Result<Response<Self::ListPackagesStream>, Status> {
        let names = self
            .catalog
            .packages
            .keys()
            .map(|n| api::PackageName { name: n.clone() })
            .collect();
        Ok(Response::new(stream_of(names)))
    }

    async fn get_package(
        &self,
        req: Request<api::GetPackageRequest>,
    ) -> Result<Response<api::Package>, Status> {
        let name = req.into_inner().name;
        let p = self
            .catalog
            .packages
            .get(&name)
            .ok_or_else(|| Status::unknown(format!("package {name:?} not found")))?;
        Ok(Response::new(api::Package {
            name: p.name.clone(),
            channels: p
                .channels
                .values()
                .map(|c| api::Channel {
                    name: c.name.clone(),
                    csv_name: c.head.clone(),
                    deprecation: deprecation(c.deprecation.as_ref()),
                })
                .collect(),
            default_channel_name: p.default_channel.clone(),
            deprecation: deprecation(p.deprecation.as_ref()),
        }))
    }

    async fn get_bundle(
        &self,
        req: Request<api::GetBundleRequest>,
    ) -> Result<Response<Bundle>, Status> {
        let r = req.get_ref().clone();
        self.compute(&req, move |s| {
            s.bundle(&r.pkg_name, &r.channel_name, &r.csv_name)
        })
        .await
        .map(Response::new)
    }

    async fn get_bundle_for_channel(
        &self,
        req: Request<api::GetBundleInChannelRequest>,
    ) -> Result<Response<Bundle>, Status> {
        let r = req.get_ref().clone();
        self.compute(&req, move |s| s.channel_head(r))
            .await
            .map(Response::new)
    }

    async fn get_channel_entries_that_replace(
        &self,
        req: Request<api::GetAllReplacementsRequest>,
    ) -> Result<Response<Self::GetChannelEntriesThatReplaceStream>, Status> {
        let name = req.get_ref().csv_name.clone();
        let out = self.compute(&req, move |s| s.replacing(&name)).await?;
        Ok(Response::new(stream_of(out)))
    }

    async fn get_bundle_that_replaces(
        &self,
        req: Request<api::GetReplacementRequest>,
    ) -> Result<Response<Bundle>, Status> {
        let r = req.get_ref().clone();
        self.compute(&req, move |s| s.replacement(r))
            .await
            .map(Response::new)
    }

    async fn get_channel_entries_that_provide(
        &self,
        req: Request<api::GetAllProvidersRequest>,
    ) -> Result<Response<Self::GetChannelEntriesThatProvideStream>, Status> {
        let r = req.get_ref().clone();
        let out = self.compute(&req, move |s| s.providing(r)).await?;
        Ok(Response::new(stream_of(out)))
    }

    async fn get_latest_channel_entries_that_provide(
        &self,
        req: Request<api::GetLatestProvidersRequest>,
    ) -> Result<Response<Self::GetLatestChannelEntriesThatProvideStream>, Status> {
        let r = req.get_ref().clone();
        let out = self.compute(&req, move |s| s.latest_entries(r)).await?;
        Ok(Response::new(stream_of(out)))
    }

    async fn get_default_bundle_that_provides(
        &self,
        req: Request<api::GetDefaultProviderRequest>,
    ) -> Result<Response<Bundle>, Status> {
        let r = req.get_ref().clone();
        self.compute(&req, move |s| s.default_provider(r))
            .await
            .map(Response::new)
    }

    async fn list_bundles(
        &self,
        req: Request<api::ListBundlesRequest>,
    ) -> Result<Response<Self::ListBundlesStream>, Status> {
        // Produced by a task of its own into a channel of one: it waits for room
        // before it asks for a CPU slot, so a client that does not read holds a
        // cursor and at most one batch of rendered views (see
        // `list_bundles_into`), never the listing and never a slot. The slot is taken in that task because the task is always
        // polled: taken in the response body instead, a slot granted to a
        // stream whose window is closed was never picked up (the transport
        // polls a body only when it can send), and every heavy call of every
        // tenant waited behind it (tests/dos.rs
        // zero_window_streams_cannot_strand_the_work_slot).
        let (tx, rx) = tokio::sync::mpsc::channel(1);
        tokio::spawn(list_bundles_into(
            tx,
            Arc::clone(&self.catalog),
            self.fair.clone(),
            PeerInfo::peer_of(&req),
        ));
        let stream = tokio_stream::wrappers::ReceiverStream::new(rx);
        Ok(Response::new(Box::pin(stream)))
    }
}

/// At most this many list views are rendered per work slot (one trip to a
/// render thread) and held while the client takes them one at a time...
pub const LIST_BATCH_ENTRIES: usize = 32;
/// ...and at most about this many encoded bytes (one more view may cross it):
/// a client that does not read holds one batch, never the listing...
pub const LIST_BATCH_BYTES: usize = 32 << 10;
/// ...and for no longer than about this: another tenant's call waits for the
/// work slot at most this long behind a batch (`make bench-tenancy`).
pub const LIST_BATCH_TIME: std::time::Duration = std::time::Duration::from_micros(100);

/// Sends every bundle's list view, in name order, into `tx` until it is
/// closed (the stream went) or the catalog is done. Views are rendered in
/// batches ([`LIST_BATCH_ENTRIES`], [`LIST_BATCH_BYTES`], [`LIST_BATCH_TIME`]): one hand-off to a
/// render thread per bundle cost about 40 µs, and ListBundles of the large
/// catalog took 104–173 ms instead of about 40 (`make bench-catalog`).
async fn list_bundles_into(
    tx: tokio::sync::mpsc::Sender<Result<Bundle, Status>>,
    catalog: Arc<Catalog>,
    fair: Option<Arc<Fair>>,
    peer: std::net::IpAddr,
) {
    let mut last: Option<Ref> = None;
    loop {
        let next = match &last {
            None => first_ref(&catalog),
            Some((p, c, e)) => ref_after(&catalog, p, c, e),
        };
        let Some(next) = next else { return };
        // Room first: a client that does not read gets no batch rendered.
        let Ok(room) = tx.reserve().await else { return };
        let batch = match &fair {
            Some(f) => {
                let catalog = Arc::clone(&catalog);
                f.compute(peer, move || list_batch(&catalog, next))
                    .await
                    .map_err(|e| Status::internal(e.to_string()))
            }
            None => Ok(list_batch(&catalog, next)),
        };
        let (views, at) = match batch {
            Ok(b) => b,
            Err(e) => {
                room.send(Err(e));
                return;
            }
        };
        let mut views = views.into_iter();
        let Some(first) = views.next() else { return };
        room.send(Ok(first));
        for v in views {
            if tx.send(Ok(v)).await.is_err() {
                return;
            }
        }
        last = Some(at);
    }
}

/// The list views from `from` on, in name order, up to the batch bounds; and
/// the last entry rendered.
fn list_batch(cat: &Catalog, from: Ref) -> (Vec<Bundle>, Ref) {
    use prost::Message as _;
    let started = std::time::Instant::now();
    let mut out = Vec::new();
    let mut bytes = 0;
    let mut at = from;
    loop {
        let v = list_view(cat, &at.0, &at.1, &at.2);
        bytes += v.encoded_len();
        out.push(v);
        if out.len() >= LIST_BATCH_ENTRIES
            || bytes >= LIST_BATCH_BYTES
            || started.elapsed() >= LIST_BATCH_TIME
        {
            return (out, at);
        }
        match ref_after(cat, &at.0, &at.1, &at.2) {
            Some(n) => at = n,
            None => return (out, at),
        }
    }
}

type Ref = (String, String, String);

/// The first channel entry with a package, channel or entry name after the
/// given ones, in name order (packages, then channels, then entries).
fn first_in<'a>(
    packages: impl Iterator<Item = (&'a String, &'a crate::model::Package)>,
) -> Option<Ref> {
    for (pn, p) in packages {
        for (cn, c) in &p.channels {
            if let Some(en) = c.entries.keys().next() {
                return Some((pn.clone(), cn.clone(), en.clone()));
            }
        }
    }
    None
}

fn first_ref(cat: &Catalog) -> Option<Ref> {
    first_in(cat.packages.iter())
}

fn ref_after(cat: &Catalog, p: &str, c: &str, e: &str) -> Option<Ref> {
    use std::ops::Bound::{Excluded, Unbounded};
    if let Some(pkg) = cat.packages.get(p) {
        if let Some(ch) = pkg.channels.get(c)
            && let Some(en) = ch.entries.range::<str, _>((Excluded(e), Unbounded)).next()
        {
            return Some((p.to_string(), c.to_string(), en.0.clone()));
        }
        for (cn, ch) in pkg.channels.range::<str, _>((Excluded(c), Unbounded)) {
            if let Some(en) = ch.entries.keys().next() {
                return Some((p.to_string(), cn.clone(), en.clone()));
            }
        }
    }
    first_in(cat.packages.range::<str, _>((Excluded(p), Unbounded)))
}

/// The `ListBundles` view of one entry: replaces/skips kept, csvJson/object
/// blanked when the bundle has an image.
fn list_view(cat: &Catalog, p: &str, c: &str, b: &str) -> Bundle {
    let pkg = &cat.packages[p];
    let data = &pkg.bundles[b];
    let entry = &pkg.channels[c].entries[b];
    // Bundles with an image come without csvJson and objects (never copied).
    to_api(&cat.blobs, data, c, entry, data.image.is_empty())
}

/// `grpc.health.v1.Health`: SERVING for any service name once the catalog is
/// loaded (the server only starts then); Watch and List are unimplemented, as
/// in opm. Our own rather than `tonic-health`: that crate implements Watch and
/// answers NOT_FOUND for unknown service names, both unlike opm, and the
/// conformance tests hold us to opm's answers.
#[derive(Debug, Clone, Copy, Default)]
pub struct HealthService;

#[tonic::async_trait]
impl Health for HealthService {
    type WatchStream = BoxStream<HealthCheckResponse>;

    async fn check(
        &self,
        _req: Request<HealthCheckRequest>,
    ) -> Result<Response<HealthCheckResponse>, Status> {
        Ok(Response::new(HealthCheckResponse {
            status: ServingStatus::Serving as i32,
        }))
    }

    async fn list(
        &self,
        _req: Request<HealthListRequest>,
    ) -> Result<Response<HealthListResponse>, Status> {
        Err(Status::unimplemented("method List not implemented"))
    }

    async fn watch(
        &self,
        _req: Request<HealthCheckRequest>,
    ) -> Result<Response<Self::WatchStream>, Status> {
        Err(Status::unimplemented("method Watch not implemented"))
    }
}

/// Errors running the server.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// Reflection descriptors could not be registered.
    #[error("reflection: {0}")]
    Reflection(#[from] tonic_reflection::server::Error),
    /// The render threads could not be started.
    #[error("render threads: {0}")]
    RenderThreads(std::io::Error),
    /// The transport failed.
    #[error("transport: {0}")]
    Transport(#[from] tonic::transport::Error),
}

/// Serves `catalog` on an already bound listener with the default
/// [`Limits`] until `shutdown` resolves, then drains in-flight calls.
pub async fn serve(
    listener: tokio::net::TcpListener,
    catalog: Arc<Catalog>,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), ServeError> {
    serve_with(listener, catalog, Limits::default(), shutdown).await
}

/// Serves `catalog` on an already bound listener within `limits` (see
/// [`crate::limits`]) until `shutdown` resolves, then drains in-flight calls.
pub async fn serve_with(
    listener: tokio::net::TcpListener,
    catalog: Arc<Catalog>,
    limits: Limits,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), ServeError> {
    let reflection_v1 = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(hcp_olm_proto::FILE_DESCRIPTOR_SET)
        .build_v1()?;
    let reflection_v1alpha = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(hcp_olm_proto::FILE_DESCRIPTOR_SET)
        .build_v1alpha()?;
    let fair = Fair::new(limits.clone()).map_err(ServeError::RenderThreads)?;
    // Connections over the bounds are closed at accept (dropped here); the
    // rest are counted until closed. Small unary answers must not wait for
    // Nagle + delayed ACK (`accept` sets TCP_NODELAY).
    let accept = Arc::clone(&fair);
    let incoming = tokio_stream::StreamExt::filter_map(
        tokio_stream::wrappers::TcpListenerStream::new(listener),
        move |s| match s {
            Ok(s) => accept.accept(s).map(Ok),
            Err(e) => Some(Err(e)),
        },
    );
    tonic::transport::Server::builder()
        .max_concurrent_streams(limits.max_streams_per_connection)
        .http2_keepalive_interval(Some(limits.keepalive_interval))
        .http2_keepalive_timeout(Some(limits.keepalive_timeout))
        .layer(CallLimitLayer::new(Arc::clone(&fair)))
        .add_service(
            RegistryServer::new(RegistryService::with_fairness(catalog, fair))
                .max_encoding_message_size(usize::MAX),
        )
        .add_service(HealthServer::new(HealthService))
        .add_service(reflection_v1)
        .add_service(reflection_v1alpha)
        .serve_with_incoming_shutdown(incoming, shutdown)
        .await?;
    Ok(())
}
