//! Watch-fed stores of management objects a reconcile reads, so a converged pass does not
//! GET them: our Deployments (status, for component availability) and Services (ClusterIP,
//! node port, load-balancer ingress), HostedOLMs, namespaces (metadata) and HyperShift's own OLM
//! Deployments (one watch per name, by field selector: the same few names in every HCP
//! namespace, nothing else).
//!
//! Each watch wakes the HostedCluster a change belongs to only after its store holds the
//! change ([`Wake`]), so the pass a change starts reads it. Where a store cannot know yet
//! (an object we created in this pass; a namespace not labelled, where missing and unlabelled
//! must be told apart) and where the answer stops our OLM (HyperShift's running), the API
//! server is asked.
//!
//! Each store keeps only what the reads need ([`trim_deployment`], managedFields dropped
//! everywhere), so memory is a few hundred bytes per object. A store answers only once its
//! first list completed.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use futures::StreamExt;
use k8s_openapi::api::apps::v1::{Deployment, DeploymentSpec};
use k8s_openapi::api::core::v1::{
    Namespace, Pod, PodSpec, PodTemplateSpec, Secret, Service, ServicePort, ServiceSpec,
};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Api;
use kube::core::PartialObjectMeta;
use kube::runtime::reflector::{ObjectRef, Store, store::Writer};
use kube::runtime::{WatchStreamExt, watcher};
use serde::de::DeserializeOwned;

use crate::hostedolm::HostedOLM;
use crate::render::labels;

/// HyperShift's HostedControlPlane, as a type for a metadata watch only (the HCP namespace
/// ownership check reads its annotations; nothing reads its spec or status).
#[derive(Clone, Debug, Default, serde::Deserialize, serde::Serialize)]
pub struct HostedControlPlane {
    pub metadata: ObjectMeta,
}

impl kube::Resource for HostedControlPlane {
    type DynamicType = ();
    type Scope = kube::core::NamespaceResourceScope;

    fn kind(_: &()) -> std::borrow::Cow<'_, str> {
        "HostedControlPlane".into()
    }
    fn group(_: &()) -> std::borrow::Cow<'_, str> {
        "hypershift.openshift.io".into()
    }
    fn version(_: &()) -> std::borrow::Cow<'_, str> {
        "v1beta1".into()
    }
    fn plural(_: &()) -> std::borrow::Cow<'_, str> {
        "hostedcontrolplanes".into()
    }
    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

/// Called with a changed object after its store holds the change.
pub type OnChange<K> = Arc<dyn Fn(&K) + Send + Sync>;

/// One watched kind. Dropping it stops the watch.
pub struct Watched<K>
where
    K: kube::Resource<DynamicType = ()> + Clone + 'static,
{
    store: Store<K>,
    synced: Arc<AtomicBool>,
    /// Failed list or watch requests so far (each is retried with backoff): a store whose
    /// watch the RBAC refuses keeps relisting, so this is what tests check.
    errors: Arc<std::sync::atomic::AtomicU64>,
    what: &'static str,
    task: tokio::task::JoinHandle<()>,
}

impl<K> Drop for Watched<K>
where
    K: kube::Resource<DynamicType = ()> + Clone + 'static,
{
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl<K> Watched<K>
where
    K: kube::Resource<DynamicType = ()>
        + Clone
        + DeserializeOwned
        + std::fmt::Debug
        + Send
        + Sync
        + 'static,
{
    /// Starts watching `api` with `config`, keeping each object as `trim` leaves it.
    pub fn start(
        api: Api<K>,
        config: watcher::Config,
        what: &'static str,
        trim: impl FnMut(&mut K) + Send + 'static,
        on_change: Option<OnChange<K>>,
    ) -> Self {
        let writer: Writer<K> = Writer::default();
        let store = writer.as_reader();
        let synced = Arc::new(AtomicBool::new(false));
        let flag = synced.clone();
        let errors = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let failed = errors.clone();
        let stream = watcher(api, config)
            .default_backoff()
            .modify(trim)
            .reflect(writer);
        let task = tokio::spawn(async move {
            futures::pin_mut!(stream);
            while let Some(ev) = stream.next().await {
                match ev {
                    Ok(watcher::Event::InitDone) => flag.store(true, Ordering::Release),
                    // After the store has the change (reflect runs first), so the reconcile
                    // this wakes reads it.
                    Ok(watcher::Event::Apply(o) | watcher::Event::Delete(o)) => {
                        if let Some(f) = &on_change {
                            f(&o);
                        }
                    }
                    Ok(_) => {}
                    Err(e) => {
                        failed.fetch_add(1, Ordering::Relaxed);
                        tracing::debug!(what, error = %e, "watch");
                    }
                }
            }
        });
        Self {
            store,
            synced,
            errors,
            what,
            task,
        }
    }

    /// Failed list or watch requests so far.
    pub fn errors(&self) -> u64 {
        self.errors.load(Ordering::Relaxed)
    }

    /// True once the first list completed.
    pub fn synced(&self) -> bool {
        self.synced.load(Ordering::Acquire)
    }

    /// `Some(None)` when absent, `None` when not synced yet.
    pub fn get(&self, namespace: Option<&str>, name: &str) -> Option<Option<Arc<K>>> {
        let mut r = ObjectRef::new(name);
        if let Some(ns) = namespace {
            r = r.within(ns);
        }
        self.synced().then(|| self.store.get(&r))
    }

    /// An object we create: found in the store, or ask the API server (not synced, or
    /// absent and possibly not delivered yet).
    pub fn ours(&self, namespace: &str, name: &str) -> Lookup<Arc<K>> {
        match self.get(Some(namespace), name) {
            Some(Some(o)) => Lookup::Found(o),
            _ => Lookup::Ask,
        }
    }

    /// Objects held.
    pub fn len(&self) -> usize {
        self.store.state().len()
    }

    /// Every object held (empty until synced).
    pub fn all(&self) -> Vec<Arc<K>> {
        if self.synced() {
            self.store.state()
        } else {
            Vec::new()
        }
    }

    /// Whether a held object matches `predicate` (false until synced); no copy of the store.
    pub fn any(&self, predicate: impl Fn(&K) -> bool) -> bool {
        self.synced() && self.store.find(predicate).is_some()
    }

    /// True when none is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// What a cached lookup of an object we create ourselves may answer.
pub enum Lookup<T> {
    /// In the store.
    Found(T),
    /// Not known here: ask the API server (not synced, or absent and possibly not
    /// delivered yet).
    Ask,
}

/// What status reads of a Deployment, nothing else (pure): of the template only the
/// config-hash annotation ([`super::components::rolled_out`]).
pub fn trim_deployment(d: &mut Deployment) {
    let template_annotations = d
        .spec
        .as_ref()
        .and_then(|s| s.template.metadata.as_ref())
        .and_then(|m| m.annotations.as_ref())
        .and_then(|a| a.get_key_value(labels::CONFIG_HASH_ANNOTATION))
        .map(|(k, v)| std::collections::BTreeMap::from([(k.clone(), v.clone())]));
    let replicas = d.spec.as_ref().and_then(|s| s.replicas);
    d.spec = Some(DeploymentSpec {
        replicas,
        template: PodTemplateSpec {
            metadata: Some(ObjectMeta {
                annotations: template_annotations,
                ..Default::default()
            }),
            spec: None,
        },
        ..Default::default()
    });
    d.metadata.managed_fields = None;
    d.metadata.labels = None;
    d.metadata.annotations = None;
    d.metadata.owner_references = None;
}

/// What the reads of a Service use (pure): its labels (which HostedCluster it belongs to),
/// type, ClusterIP, ports and load-balancer status
/// ([`crate::render::tunnel::gateway_endpoint`]).
pub fn trim_service(s: &mut Service) {
    let m = &mut s.metadata;
    m.managed_fields = None;
    m.annotations = None;
    m.owner_references = None;
    if let Some(spec) = s.spec.take() {
        s.spec = Some(ServiceSpec {
            type_: spec.type_,
            cluster_ip: spec.cluster_ip,
            ports: spec.ports.map(|ps| {
                ps.into_iter()
                    .map(|p| ServicePort {
                        name: p.name,
                        port: p.port,
                        node_port: p.node_port,
                        protocol: p.protocol,
                        ..Default::default()
                    })
                    .collect()
            }),
            ..Default::default()
        });
    }
}

fn ours() -> watcher::Config {
    watcher::Config::default().labels(&format!(
        "{}={}",
        labels::MANAGED_BY_KEY,
        labels::MANAGED_BY
    ))
}

/// Keeps of a pod what [`super::pods::problem`] and the label match read: name, namespace,
/// labels and status (conditions and container states; not the spec).
pub fn trim_pod(p: &mut Pod) {
    let m = &mut p.metadata;
    m.managed_fields = None;
    m.annotations = None;
    m.owner_references = None;
    p.spec = Some(PodSpec::default());
}

/// The Secret data kept at most, in bytes (see [`secret_weight`]). A pass reads about eight
/// Secrets per HostedCluster, a few KiB each (certificates, keys, the admin kubeconfig, the
/// pull secret): about 35 KiB, so this holds a whole pass of about 7,000 HostedClusters.
/// Bounded in bytes, not entries: a HostedCluster's owner decides the size of its pull
/// secret (up to the API server's 1 MiB), and an entry bound let 16,384 of those be kept.
pub const SECRET_DATA_BYTES: u64 = 256 << 20;

/// What one kept Secret counts against [`SECRET_DATA_BYTES`]: its data and metadata strings
/// plus a fixed 256 bytes for the structures around them.
fn secret_weight(_key: &(String, String), s: &Arc<Secret>) -> u32 {
    let map = |m: &Option<std::collections::BTreeMap<String, String>>| -> usize {
        m.iter().flatten().map(|(k, v)| k.len() + v.len()).sum()
    };
    let data: usize = s
        .data
        .iter()
        .flatten()
        .map(|(k, v)| k.len() + v.0.len())
        .sum();
    let string_data = map(&s.string_data);
    let m = &s.metadata;
    let meta = m.name.as_ref().map_or(0, String::len)
        + m.namespace.as_ref().map_or(0, String::len)
        + map(&m.labels)
        + map(&m.annotations);
    u32::try_from(256 + data + string_data + meta).unwrap_or(u32::MAX)
}

/// The Secret data cache of [`ManagementStores::secret_data`].
pub fn secret_data_cache() -> moka::future::Cache<(String, String), Arc<Secret>> {
    moka::future::Cache::builder()
        .weigher(secret_weight)
        .max_capacity(SECRET_DATA_BYTES)
        .build()
}

/// What changed, for the controller to map to HostedClusters.
pub enum Changed<'a> {
    /// An object carrying our labels (names its HostedCluster).
    Labelled(&'a ObjectMeta),
    /// Something in (or the namespace itself) this HCP namespace.
    HcpNamespace(&'a str),
    /// A Secret (any: HostedClusters read HyperShift's by name).
    Secret(&'a ObjectMeta),
}

/// Called after a store holds a change.
pub type Wake = Arc<dyn for<'a> Fn(Changed<'a>) + Send + Sync>;

/// Wakes a pass for the HCP namespace an object lives in.
fn namespace_wake<K: kube::Resource + 'static>(wake: &Option<Wake>) -> Option<OnChange<K>> {
    wake.clone().map(|w| {
        Arc::new(move |o: &K| {
            if let Some(ns) = o.meta().namespace.as_deref() {
                w(Changed::HcpNamespace(ns));
            }
        }) as OnChange<K>
    })
}

/// A NetworkPolicy trimmed to what [`crate::netpol::egress_isolation`] reads: name,
/// namespace, pod selector and policy types (pure). The rules go; a policy stored without
/// `policyTypes` (never, since the API server defaults them) keeps `Egress` if it had egress
/// rules, as the API defines the default.
pub fn trim_network_policy(p: &mut NetworkPolicy) {
    let m = &mut p.metadata;
    m.managed_fields = None;
    m.annotations = None;
    m.owner_references = None;
    m.finalizers = None;
    if let Some(spec) = p.spec.as_mut() {
        if spec.policy_types.is_none() {
            let mut types = vec!["Ingress".to_string()];
            if spec.egress.is_some() {
                types.push("Egress".to_string());
            }
            spec.policy_types = Some(types);
        }
        spec.ingress = None;
        spec.egress = None;
    }
}

/// A Secret's metadata, trimmed to what identifies a version (pure).
fn trim_secret_meta(s: &mut PartialObjectMeta<Secret>) {
    let m = &mut s.metadata;
    m.managed_fields = None;
    m.annotations = None;
    m.owner_references = None;
    m.finalizers = None;
}

/// A HostedControlPlane's name, namespace and HostedCluster annotation (pure).
fn trim_hcp_meta(h: &mut PartialObjectMeta<HostedControlPlane>) {
    let m = &mut h.metadata;
    m.managed_fields = None;
    m.labels = None;
    m.owner_references = None;
    m.finalizers = None;
    if let Some(a) = m.annotations.as_mut() {
        a.retain(|k, _| k == super::kinds::HOSTED_CLUSTER_ANNOTATION);
    }
}

/// HyperShift's OLM Deployments as [`trim_deployment`] leaves ours, with their labels
/// (`hypershift_deployment_runs` tells ours apart by label).
fn trim_hypershift_deployment(d: &mut Deployment) {
    let l = d.metadata.labels.take();
    trim_deployment(d);
    d.metadata.labels = l;
}

/// The stores a reconcile reads from while the controller loop runs.
pub struct ManagementStores {
    pub deployments: Watched<Deployment>,
    /// The pods of our Deployments, trimmed to what says why one is not ready
    /// ([`super::pods::problem`]).
    pub pods: Watched<Pod>,
    pub services: Watched<Service>,
    /// HostedOLMs (ours; their spec is what users edit).
    pub hosted_olms: Watched<HostedOLM>,
    /// Every Secret's name, labels and resourceVersion (no data): which version of a
    /// Secret is current, so [`Self::secret_data`] answers reads of unchanged ones.
    pub secrets: Watched<PartialObjectMeta<Secret>>,
    /// The data of Secrets a pass has read, by (namespace, name), used while the
    /// resourceVersion in [`Self::secrets`] is the one read. Bounded in bytes (see
    /// [`SECRET_DATA_BYTES`]).
    pub secret_data: moka::future::Cache<(String, String), Arc<Secret>>,
    pub namespaces: Watched<PartialObjectMeta<Namespace>>,
    /// HostedControlPlanes (name, namespace and the HostedCluster annotation). Where the kind
    /// is not served this store never syncs and the ownership check asks the API server
    /// (which answers 404 at once); [`Self::synced`] does not wait for it.
    pub hosted_control_planes: Watched<PartialObjectMeta<HostedControlPlane>>,
    /// HyperShift's OLM Deployments, one watch per name.
    pub hypershift: Vec<(&'static str, Watched<Deployment>)>,
    /// NetworkPolicies that are not ours, trimmed to their pod selector and policy types
    /// ([`trim_network_policy`]): which isolate our pods' egress ([`crate::netpol`]).
    pub network_policies: Watched<NetworkPolicy>,
}

impl std::fmt::Debug for ManagementStores {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ManagementStores")
            .field("synced", &self.synced())
            .field("deployments", &self.deployments.len())
            .field("pods", &self.pods.len())
            .field("services", &self.services.len())
            .field("hosted_olms", &self.hosted_olms.len())
            .field("secrets", &self.secrets.len())
            .field("namespaces", &self.namespaces.len())
            .field("hosted_control_planes", &self.hosted_control_planes.len())
            .field("network_policies", &self.network_policies.len())
            .finish_non_exhaustive()
    }
}

impl ManagementStores {
    /// Starts every watch. `wake`, when given, is called after a store holds a change.
    pub fn start(
        client: &kube::Client,
        hypershift_names: &[&'static str],
        wake: Option<Wake>,
    ) -> Self {
        let labelled = wake.clone().map(|w| {
            Arc::new(move |m: &ObjectMeta| w(Changed::Labelled(m))) as OnChange<ObjectMeta>
        });
        let by_meta = |f: Option<OnChange<ObjectMeta>>| {
            f.map(|f| Arc::new(move |d: &Deployment| f(&d.metadata)) as OnChange<Deployment>)
        };
        let pods_wake = labelled.clone().map(|f| {
            Arc::new(move |p: &Pod| {
                if super::pods::problem([p]).is_some() {
                    f(&p.metadata)
                }
            }) as OnChange<Pod>
        });
        let services_wake = labelled
            .clone()
            .map(|f| Arc::new(move |s: &Service| f(&s.metadata)) as OnChange<Service>);
        let namespaces_wake = wake.clone().map(|w| {
            Arc::new(move |n: &PartialObjectMeta<Namespace>| {
                if let Some(name) = n.metadata.name.as_deref() {
                    w(Changed::HcpNamespace(name));
                }
            }) as OnChange<PartialObjectMeta<Namespace>>
        });
        let secrets_wake = wake.clone().map(|w| {
            Arc::new(move |s: &PartialObjectMeta<Secret>| w(Changed::Secret(&s.metadata)))
                as OnChange<PartialObjectMeta<Secret>>
        });
        let holm_wake = namespace_wake::<HostedOLM>(&wake);
        let hcp_wake = namespace_wake::<PartialObjectMeta<HostedControlPlane>>(&wake);
        let hypershift_wake = namespace_wake::<Deployment>(&wake);
        let policies_wake = namespace_wake::<NetworkPolicy>(&wake);
        Self {
            // Others' only (ours are rendered, not read), in every namespace: HyperShift's
            // in HCP namespaces are the ones that matter.
            network_policies: Watched::start(
                Api::all(client.clone()),
                watcher::Config::default().labels(&format!(
                    "{}!={}",
                    labels::MANAGED_BY_KEY,
                    labels::MANAGED_BY
                )),
                "NetworkPolicies (not ours)",
                trim_network_policy,
                policies_wake,
            ),
            deployments: Watched::start(
                Api::all(client.clone()),
                ours(),
                "our Deployments",
                trim_deployment,
                by_meta(labelled.clone()),
            ),
            pods: Watched::start(
                Api::all(client.clone()),
                ours(),
                "our pods",
                trim_pod,
                // Only a pod with a problem wakes its HostedCluster: readiness changes reach
                // the Deployment (watched above), and a pass reads the pods then.
                pods_wake,
            ),
            services: Watched::start(
                Api::all(client.clone()),
                ours(),
                "our Services",
                trim_service,
                services_wake,
            ),
            hosted_olms: Watched::start(
                Api::all(client.clone()),
                watcher::Config::default(),
                "HostedOLMs",
                |h: &mut HostedOLM| h.metadata.managed_fields = None,
                holm_wake,
            ),
            // Metadata only, trimmed to what identifies a version: Secret contents are
            // read (and kept in `secret_data`) only for the Secrets a pass uses.
            secrets: Watched::start(
                Api::all(client.clone()),
                watcher::Config::default(),
                "Secrets (metadata)",
                trim_secret_meta,
                secrets_wake,
            ),
            secret_data: secret_data_cache(),
            // HyperShift's HCP namespaces only (its label): a pass needs nothing else.
            namespaces: Watched::start(
                Api::all(client.clone()),
                watcher::Config::default().labels(super::kinds::HCP_NAMESPACE_LABEL),
                "HCP namespaces",
                |n: &mut PartialObjectMeta<Namespace>| n.metadata.managed_fields = None,
                namespaces_wake,
            ),
            hosted_control_planes: Watched::start(
                Api::all(client.clone()),
                watcher::Config::default(),
                "HostedControlPlanes (metadata)",
                trim_hcp_meta,
                hcp_wake,
            ),
            hypershift: hypershift_names
                .iter()
                .map(|n| {
                    (
                        *n,
                        Watched::start(
                            Api::all(client.clone()),
                            watcher::Config::default().fields(&format!("metadata.name={n}")),
                            "HyperShift's OLM Deployments",
                            trim_hypershift_deployment,
                            hypershift_wake.clone(),
                        ),
                    )
                })
                .collect(),
        }
    }

    /// The stores whose list or watch failed so far, with how often.
    pub fn watch_errors(&self) -> Vec<(&'static str, u64)> {
        let mut out = vec![
            (self.deployments.what, self.deployments.errors()),
            (self.pods.what, self.pods.errors()),
            (self.services.what, self.services.errors()),
            (self.hosted_olms.what, self.hosted_olms.errors()),
            (self.secrets.what, self.secrets.errors()),
            (self.namespaces.what, self.namespaces.errors()),
            (
                self.hosted_control_planes.what,
                self.hosted_control_planes.errors(),
            ),
            (self.network_policies.what, self.network_policies.errors()),
        ];
        out.extend(self.hypershift.iter().map(|(_, w)| (w.what, w.errors())));
        out.retain(|(_, n)| *n > 0);
        out
    }

    /// True when every watch has listed once.
    pub fn synced(&self) -> bool {
        self.deployments.synced()
            && self.pods.synced()
            && self.services.synced()
            && self.hosted_olms.synced()
            && self.secrets.synced()
            && self.namespaces.synced()
            && self.network_policies.synced()
            && self.hypershift.iter().all(|(_, w)| w.synced())
    }

    /// One of HyperShift's OLM Deployments (authoritative when synced).
    pub fn hypershift_deployment(
        &self,
        namespace: &str,
        name: &str,
    ) -> Option<Option<Arc<Deployment>>> {
        self.hypershift
            .iter()
            .find(|(n, _)| *n == name)
            .and_then(|(_, w)| w.get(Some(namespace), name))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data_bytes(s: &Secret) -> u64 {
        s.data
            .iter()
            .flatten()
            .map(|(k, v)| (k.len() + v.0.len()) as u64)
            .sum()
    }

    fn secret(name: &str, bytes: usize) -> Arc<Secret> {
        Arc::new(Secret {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some("clusters-x".into()),
                resource_version: Some("1".into()),
                ..Default::default()
            },
            data: Some(std::collections::BTreeMap::from([(
                "tls.key".to_string(),
                k8s_openapi::ByteString(vec![b'k'; bytes]),
            )])),
            ..Default::default()
        })
    }

    /// Every Secret a pass of 3,000 HostedClusters reads (about 8 each, a few KiB) stays
    /// cached: bounded by 16,384 entries, 1,857 were read again in an idle minute at N=3000
    /// (fails on the entry bound).
    #[tokio::test]
    async fn the_secret_cache_holds_a_pass_of_3000_hosted_clusters() {
        let cache = secret_data_cache();
        for i in 0..3000 * 8 {
            cache
                .insert(("clusters-x".into(), format!("s{i}")), secret("s", 4096))
                .await;
        }
        cache.run_pending_tasks().await;
        assert_eq!(cache.entry_count(), 3000 * 8);
    }

    /// Secrets a HostedCluster's owner writes (its pull secret, up to the API server's 1 MiB
    /// each) cannot grow the cache past its byte bound.
    #[tokio::test]
    async fn the_secret_cache_is_bounded_in_bytes() {
        let cache = secret_data_cache();
        // One allocation shared by every entry; each entry still holds 1 MiB of data.
        let big = secret("s", 1 << 20);
        for i in 0..(SECRET_DATA_BYTES >> 20) * 2 {
            cache
                .insert(("clusters-x".into(), format!("s{i}")), big.clone())
                .await;
        }
        cache.run_pending_tasks().await;
        let held: u64 = cache.iter().map(|(_, s)| data_bytes(&s)).sum();
        assert!(
            held <= SECRET_DATA_BYTES,
            "{held} bytes of Secret data cached"
        );
        assert!(cache.entry_count() > 0);
    }

    #[test]
    fn network_policy_trimming_keeps_what_the_egress_check_reads() {
        let full = serde_json::json!({
            "metadata": {"name": "management-kas", "namespace": "clusters-a",
                "annotations": {"big": "x"}},
            "spec": {"podSelector": {"matchExpressions": [
                    {"key": "k", "operator": "DoesNotExist"}]},
                "policyTypes": ["Egress"],
                "egress": [{"to": [{"ipBlock": {"cidr": "0.0.0.0/0", "except": ["10.0.0.0/8"]}}]}]},
        });
        let mut p: NetworkPolicy = serde_json::from_value(full.clone()).expect("policy");
        trim_network_policy(&mut p);
        let trimmed = serde_json::to_value(&p).expect("json");
        assert_eq!(trimmed["spec"]["egress"], serde_json::Value::Null);
        assert_eq!(trimmed["metadata"]["annotations"], serde_json::Value::Null);
        assert_eq!(
            crate::netpol::egress_isolation(&trimmed),
            crate::netpol::egress_isolation(&full)
        );
        // without policyTypes (the API default): egress rules mean Egress
        let mut old = full.clone();
        old["spec"]
            .as_object_mut()
            .expect("spec")
            .remove("policyTypes");
        let mut p: NetworkPolicy = serde_json::from_value(old).expect("policy");
        trim_network_policy(&mut p);
        assert!(
            crate::netpol::egress_isolation(&serde_json::to_value(&p).expect("json")).is_some()
        );
    }

    #[test]
    fn trimming_keeps_what_status_reads() {
        let mut d: Deployment = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "a", "namespace": "n", "generation": 3,
                "labels": {"x": "y"}, "managedFields": [{"manager": "m"}],
                "annotations": {"hcp-olm.io/desired-hash": "d"},
                "ownerReferences": [{"apiVersion": "v1", "kind": "K", "name": "o", "uid": "u"}]},
            "spec": {"replicas": 2, "selector": {"matchLabels": {"a": "b"}},
                "template": {"metadata": {"annotations": {"hcp-olm.io/config-hash": "h",
                                                          "other": "x"},
                                          "labels": {"a": "b"}},
                             "spec": {"containers": [{"name": "c", "image": "i"}]}}},
            "status": {"readyReplicas": 2, "observedGeneration": 3}
        }))
        .unwrap();
        trim_deployment(&mut d);
        let v = serde_json::to_value(&d).unwrap();
        assert_eq!(
            v,
            serde_json::json!({
                "apiVersion": "apps/v1", "kind": "Deployment",
                "metadata": {"name": "a", "namespace": "n", "generation": 3},
                "spec": {"replicas": 2, "selector": {},
                    "template": {"metadata": {"annotations": {"hcp-olm.io/config-hash": "h"}}}},
                "status": {"readyReplicas": 2, "observedGeneration": 3}
            })
        );
    }

    #[test]
    fn service_trimming_keeps_what_endpoint_reads_use() {
        let mut s: Service = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "a", "namespace": "n", "labels": {"x": "y"},
                "annotations": {"h": "1"}, "managedFields": [{"manager": "m"}]},
            "spec": {"type": "NodePort", "clusterIP": "198.18.0.9", "clusterIPs": ["198.18.0.9"],
                "selector": {"a": "b"}, "ipFamilies": ["IPv4"],
                "ports": [{"name": "wg", "port": 51820, "nodePort": 30000, "protocol": "UDP",
                           "targetPort": 51820}]},
            "status": {"loadBalancer": {"ingress": [{"ip": "198.18.1.1"}]}}
        }))
        .unwrap();
        trim_service(&mut s);
        assert_eq!(
            serde_json::to_value(&s).unwrap(),
            serde_json::json!({
                "apiVersion": "v1", "kind": "Service",
                "metadata": {"name": "a", "namespace": "n", "labels": {"x": "y"}},
                "spec": {"type": "NodePort", "clusterIP": "198.18.0.9",
                    "ports": [{"name": "wg", "port": 51820, "nodePort": 30000, "protocol": "UDP"}]},
                "status": {"loadBalancer": {"ingress": [{"ip": "198.18.1.1"}]}}
            })
        );
    }
}
