//! One reconcile of one HostedCluster, and the finalizer cleanup.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use hcp_olm_apply::{Applier, Policy, Report, Target};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Secret, Service};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::api::{Api, ApiResource, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use time::OffsetDateTime;

use super::guest;
use super::kinds::api_resource;
pub use super::kinds::{
    DEPRECATED_MARKETPLACE, GUEST_OLM_CRD, HCP_NAMESPACE_LABEL, HOSTED_CLUSTER_ANNOTATION,
};
use super::stores::{self, Lookup};
use super::{
    ADMIN_KUBECONFIG_KEY, Context, Error, FIELD_MANAGER, FINALIZER, facts, kube_err, secrets,
};
use crate::catalogs::{CatalogImage, CatalogImageError, DefaultCatalog};
use crate::hostedcluster::HostedCluster;
use crate::hostedolm::{
    CatalogPlacement, ComponentStatus, HostedClusterRef, HostedOLM, HostedOLMSpec, HostedOLMStatus,
    HyperShiftOLMMode,
};
use crate::render::{self, ApplyPolicy, Desired, Object, Owner, RenderInput, labels, names};
use crate::status::{self, AVAILABLE, DEGRADED, InstalledOperator, PROGRESSING, UPGRADEABLE};
use crate::takeover;
use crate::validate;

/// What a reconcile ended with.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum State {
    /// Everything applied; nothing left to wait for on our side.
    Applied,
    /// Waiting for something outside our control (reason code).
    Waiting(String),
    /// Validation failed; status says why.
    Invalid(String),
    /// `pausedUntil` is in effect; nothing was written.
    Paused,
    /// The HostedCluster is being deleted and our objects are gone.
    CleanedUp,
    /// Outside `--hosted-cluster-selector`: untouched (or, when it left the selector,
    /// cleaned up and released).
    OutOfScope,
}

/// The result of [`reconcile_one`].
#[derive(Clone, Debug)]
pub struct Outcome {
    pub state: State,
    /// Writes (creates, updates, deletes) in the management cluster's HCP namespace.
    pub hcp_writes: usize,
    /// Writes in the guest cluster.
    pub guest_writes: usize,
    pub status_written: bool,
    /// `Kind/namespace/name` of every object created, updated or deleted.
    pub changed: Vec<String>,
    /// When to look again.
    pub requeue: Duration,
    /// Cleanup only: why the guest's objects were left (its API server did not answer).
    pub guest_left: Option<&'static str>,
}

impl Outcome {
    fn new(state: State, requeue: Duration) -> Self {
        Self {
            state,
            hcp_writes: 0,
            guest_writes: 0,
            status_written: false,
            changed: Vec::new(),
            requeue,
            guest_left: None,
        }
    }

    /// This outcome, counting `n` management-cluster writes made before its step.
    fn with_hcp_writes(mut self, n: usize) -> Self {
        self.hcp_writes += n;
        self
    }
}

const SOON: Duration = Duration::from_secs(2);
const GUEST_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
const GUEST_READ_TIMEOUT: Duration = Duration::from_secs(60);

/// The kinds we ever render into the HCP namespace (all namespaced).
pub fn hcp_kinds() -> Vec<(ApiResource, bool)> {
    [
        ("apps/v1", "Deployment", "deployments"),
        ("v1", "Service", "services"),
        ("v1", "ServiceAccount", "serviceaccounts"),
        ("v1", "Secret", "secrets"),
        ("networking.k8s.io/v1", "NetworkPolicy", "networkpolicies"),
        ("policy/v1", "PodDisruptionBudget", "poddisruptionbudgets"),
        // not served everywhere: prune passes over a kind the cluster does not serve
        (
            "monitoring.coreos.com/v1",
            "ServiceMonitor",
            "servicemonitors",
        ),
    ]
    .into_iter()
    .map(|(a, k, p)| (api_resource(a, k, p), true))
    .collect()
}

/// The kinds we ever render into the guest (namespaced flag).
pub fn guest_kinds() -> Vec<(ApiResource, bool)> {
    [
        (
            "operators.coreos.com/v1alpha1",
            "CatalogSource",
            "catalogsources",
            true,
        ),
        (
            "apiregistration.k8s.io/v1",
            "APIService",
            "apiservices",
            false,
        ),
        ("v1", "Endpoints", "endpoints", true),
        (
            "discovery.k8s.io/v1",
            "EndpointSlice",
            "endpointslices",
            true,
        ),
        ("v1", "Service", "services", true),
        ("apps/v1", "Deployment", "deployments", true),
        ("v1", "Secret", "secrets", true),
        ("v1", "ServiceAccount", "serviceaccounts", true),
        (
            "config.openshift.io/v1",
            "OperatorHub",
            "operatorhubs",
            false,
        ),
        ("v1", "Namespace", "namespaces", false),
    ]
    .into_iter()
    .map(|(a, k, p, n)| (api_resource(a, k, p), n))
    .collect()
}

/// The prune selector of a HostedCluster (identical to
/// [`labels::prune_selector`], but available without a valid input).
pub fn selector_for(namespace: &str, name: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        (
            labels::MANAGED_BY_KEY.to_string(),
            labels::MANAGED_BY.to_string(),
        ),
        (
            labels::CLUSTER_NAMESPACE_KEY.to_string(),
            namespace.to_string(),
        ),
        (labels::CLUSTER_NAME_KEY.to_string(), name.to_string()),
    ])
}

/// A render object as an applier target.
pub fn target(o: &Object) -> Target {
    let policy = match o.policy {
        ApplyPolicy::Apply => Policy::Apply,
        ApplyPolicy::CreateOnly => Policy::CreateOnly,
    };
    Target::new(&o.api_version, &o.kind, &o.plural, policy, o.body.clone())
}

fn now_time(now: OffsetDateTime) -> Time {
    Time(
        k8s_openapi::jiff::Timestamp::from_second(now.unix_timestamp())
            .unwrap_or(k8s_openapi::jiff::Timestamp::UNIX_EPOCH),
    )
}

/// `namespace/name` of a HostedCluster (the guest sessions' key).
fn cluster_key(hc: &HostedCluster) -> String {
    format!(
        "{}/{}",
        hc.metadata.namespace.as_deref().unwrap_or_default(),
        hc.metadata.name.as_deref().unwrap_or_default()
    )
}

pub(super) fn identity(hc: &HostedCluster) -> Result<(String, String, String), Error> {
    match (
        hc.metadata.namespace.clone(),
        hc.metadata.name.clone(),
        hc.hcp_namespace(),
    ) {
        (Some(ns), Some(name), Some(hcp)) => Ok((ns, name, hcp)),
        _ => Err(Error::Identity(format!("{:?}", hc.metadata.name))),
    }
}

/// Why there is no guest client.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum GuestAccess {
    /// `status.kubeconfig` is not set yet.
    NotPublished,
    /// The Secret it names does not exist.
    SecretMissing(String),
    /// The Secret exists but holds no usable kubeconfig.
    Invalid(String),
    /// The kubeconfig asks for something other than inline material (exec, files, proxy).
    Unsafe(String),
    /// The guest API server did not answer (connection refused, timeout, TLS).
    Unreachable(String),
    /// The kubeconfig's server is at an address the controller does not dial
    /// ([`guest::ServerPolicy`]).
    ServerRefused(String),
    /// An answer of the guest API server crossed its bound in bytes or time (see
    /// [`guest::RESPONSE_BOUNDS`]); the message names the bound and the request.
    ResponseBound(hcp_olm_apply::bounded::BoundError),
}

/// The status reason for an answer that crossed `b`.
pub fn bound_reason(b: &hcp_olm_apply::bounded::BoundError) -> &'static str {
    match b {
        hcp_olm_apply::bounded::BoundError::TooLarge { .. } => "GuestResponseTooLarge",
        hcp_olm_apply::bounded::BoundError::Timeout { .. } => "GuestResponseTimeout",
    }
}

/// The bound a guest read crossed, if that is why it failed.
fn guest_bound(
    e: &(dyn std::error::Error + 'static),
) -> Option<hcp_olm_apply::bounded::BoundError> {
    hcp_olm_apply::bounded::find(e).cloned()
}

impl GuestAccess {
    fn conditions(&self, generation: Option<i64>, now: &Time) -> Vec<Condition> {
        let c = |t: &str, ok: bool, reason: &str, msg: String| Condition {
            type_: t.to_string(),
            status: if ok { "True" } else { "False" }.to_string(),
            reason: reason.to_string(),
            message: msg,
            observed_generation: generation,
            last_transition_time: now.clone(),
        };
        let (p, d) = match self {
            GuestAccess::NotPublished => (
                c(
                    PROGRESSING,
                    true,
                    "WaitingForGuestKubeconfig",
                    "HostedCluster status.kubeconfig is not set yet".into(),
                ),
                c(DEGRADED, false, "AsExpected", String::new()),
            ),
            GuestAccess::SecretMissing(what) => (
                c(
                    PROGRESSING,
                    true,
                    "WaitingForGuestKubeconfig",
                    format!("waiting for the guest admin kubeconfig Secret {what}"),
                ),
                c(
                    DEGRADED,
                    true,
                    "GuestKubeconfigMissing",
                    format!(
                        "the guest admin kubeconfig Secret {what} (HostedCluster status.kubeconfig) does not exist"
                    ),
                ),
            ),
            GuestAccess::Invalid(msg) => (
                c(PROGRESSING, false, "AsExpected", String::new()),
                c(DEGRADED, true, "GuestKubeconfigInvalid", msg.clone()),
            ),
            GuestAccess::Unsafe(msg) => (
                c(PROGRESSING, false, "AsExpected", String::new()),
                c(DEGRADED, true, "GuestKubeconfigUnsafe", msg.clone()),
            ),
            GuestAccess::Unreachable(msg) => (
                c(PROGRESSING, false, "AsExpected", String::new()),
                c(DEGRADED, true, "GuestUnreachable", msg.clone()),
            ),
            GuestAccess::ServerRefused(msg) => (
                c(PROGRESSING, false, "AsExpected", String::new()),
                c(DEGRADED, true, "GuestServerRefused", msg.clone()),
            ),
            GuestAccess::ResponseBound(b) => (
                c(PROGRESSING, false, "AsExpected", String::new()),
                c(
                    DEGRADED,
                    true,
                    bound_reason(b),
                    format!("guest API server: {b}"),
                ),
            ),
        };
        vec![
            c(
                AVAILABLE,
                false,
                "GuestUnreachable",
                match self {
                    GuestAccess::Unreachable(_) => "the guest API server does not answer".into(),
                    GuestAccess::ServerRefused(_) => {
                        "the guest API server's address is refused".into()
                    }
                    GuestAccess::ResponseBound(_) => {
                        "the guest API server's answers cross their bounds".into()
                    }
                    _ => "no usable guest admin kubeconfig".into(),
                },
            ),
            p,
            d,
        ]
    }

    pub(super) fn reason(&self) -> &'static str {
        match self {
            GuestAccess::NotPublished => "WaitingForGuestKubeconfig",
            GuestAccess::SecretMissing(_) => "GuestKubeconfigMissing",
            GuestAccess::Invalid(_) => "GuestKubeconfigInvalid",
            GuestAccess::Unsafe(_) => "GuestKubeconfigUnsafe",
            GuestAccess::Unreachable(_) => "GuestUnreachable",
            GuestAccess::ServerRefused(_) => "GuestServerRefused",
            GuestAccess::ResponseBound(b) => bound_reason(b),
        }
    }
}

/// The guest's session (client and, while the controller loop runs, cache) from the
/// HostedCluster's admin kubeconfig Secret: the open one while the Secret's bytes are the
/// same, else a new one (see [`super::guest`]).
/// `keep`: false for a last use (cleanup): the open session, else a client that is not
/// kept and starts no cache.
pub async fn guest_client(
    ctx: &Context,
    hc: &HostedCluster,
    keep: bool,
) -> Result<Result<Arc<guest::Session>, GuestAccess>, Error> {
    let cluster = cluster_key(hc);
    let access = guest_access(ctx, hc, &cluster, keep).await;
    if !keep || !matches!(access, Ok(Ok(_))) {
        ctx.guests.close(&cluster);
    }
    access
}

async fn guest_access(
    ctx: &Context,
    hc: &HostedCluster,
    cluster: &str,
    keep: bool,
) -> Result<Result<Arc<guest::Session>, GuestAccess>, Error> {
    let Some((ns, name)) = hc.admin_kubeconfig_secret() else {
        return Ok(Err(GuestAccess::NotPublished));
    };
    let Some(secret) = ctx
        .read_secret(&ns, &name)
        .await
        .map_err(kube_err(format!("reading Secret {ns}/{name}")))?
    else {
        return Ok(Err(GuestAccess::SecretMissing(format!("{ns}/{name}"))));
    };
    let Some(bytes) = secret
        .data
        .as_ref()
        .and_then(|d| d.get(ADMIN_KUBECONFIG_KEY))
    else {
        return Ok(Err(GuestAccess::Invalid(format!(
            "Secret {ns}/{name} has no key {ADMIN_KUBECONFIG_KEY:?}"
        ))));
    };
    let digest = guest::digest(&bytes.0);
    if let Some(open) = ctx.guests.get(cluster, &digest) {
        return Ok(Ok(open));
    }
    let invalid = |e: String| GuestAccess::Invalid(format!("Secret {ns}/{name}: {e}"));
    // Untrusted: only inline material, checked before anything is dialled or run.
    match hcp_olm_kubeconfig_check::check(&bytes.0) {
        Ok(()) => {}
        Err(hcp_olm_kubeconfig_check::Refused::Invalid(e)) => return Ok(Err(invalid(e))),
        Err(e @ hcp_olm_kubeconfig_check::Refused::Unsafe { .. }) => {
            return Ok(Err(GuestAccess::Unsafe(format!("Secret {ns}/{name}: {e}"))));
        }
    }
    let kc = match std::str::from_utf8(&bytes.0)
        .map_err(|e| e.to_string())
        .and_then(|t| Kubeconfig::from_yaml(t).map_err(|e| e.to_string()))
    {
        Ok(kc) => kc,
        Err(e) => return Ok(Err(invalid(e))),
    };
    let config = match kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default()).await
    {
        Ok(c) => c,
        Err(e) => return Ok(Err(invalid(e.to_string()))),
    };
    // A guest API server that does not answer must not hold a reconcile slot for
    // minutes.
    let client = match guest::client(
        &config,
        GUEST_CONNECT_TIMEOUT,
        GUEST_READ_TIMEOUT,
        &ctx.config.guest_servers,
        hc.hcp_namespace().as_deref(),
    ) {
        Ok(c) => c,
        Err(guest::ClientError::Refused(r)) => {
            tracing::warn!(cluster, error = %r, "guest API server refused");
            return Ok(Err(GuestAccess::ServerRefused(format!(
                "Secret {ns}/{name}: {r}"
            ))));
        }
        Err(guest::ClientError::Invalid(e)) => return Ok(Err(invalid(e))),
    };
    if !keep {
        return Ok(Ok(guest::Sessions::detached(digest, client)));
    }
    let kinds: Vec<ApiResource> = guest_kinds().into_iter().map(|(r, _)| r).collect();
    Ok(Ok(ctx.guests.open(
        cluster,
        digest,
        client,
        &kinds,
        &format!("{}={}", labels::MANAGED_BY_KEY, labels::MANAGED_BY),
        FIELD_MANAGER,
    )))
}

async fn ensure_finalizer(ctx: &Context, hc: &HostedCluster, add: bool) -> Result<bool, Error> {
    let (ns, name, _) = identity(hc)?;
    let api: Api<HostedCluster> = Api::namespaced(ctx.client.clone(), &ns);
    let mut hc = std::borrow::Cow::Borrowed(hc);
    // Twice at most: an earlier write of this pass (HyperShift's debug-deployments
    // annotation) may have moved the resourceVersion; then it is read again.
    for attempt in 0..2 {
        let current = hc.metadata.finalizers.clone().unwrap_or_default();
        let has = current.iter().any(|f| f == FINALIZER);
        let next: Vec<String> = if add {
            if has {
                return Ok(false);
            }
            current.into_iter().chain([FINALIZER.to_string()]).collect()
        } else {
            if !has {
                return Ok(false);
            }
            current.into_iter().filter(|f| f != FINALIZER).collect()
        };
        let patch = json!({"metadata": {
            "finalizers": next,
            "resourceVersion": hc.metadata.resource_version,
        }});
        match api
            .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => return Ok(true),
            Err(kube::Error::Api(e)) if e.code == 409 && attempt == 0 => {
                hc = std::borrow::Cow::Owned(
                    api.get(&name)
                        .await
                        .map_err(kube_err(format!("reading HostedCluster {ns}/{name}")))?,
                );
            }
            Err(e) => {
                return Err(kube_err(format!(
                    "updating finalizers of HostedCluster {ns}/{name}"
                ))(e));
            }
        }
    }
    Ok(false)
}

/// Reason (state, Event) of a HostedCluster whose HCP namespace is one of ours.
pub const RESERVED_REASON: &str = "ControlPlaneNamespaceReserved";

/// Why a HostedCluster whose HCP namespace is one of ours is refused.
pub fn reserved_message(ns: &str, name: &str, hcp_ns: &str) -> String {
    format!(
        "the HCP namespace {hcp_ns} of HostedCluster {ns}/{name} is one of hcp-olm's own namespaces (the shared catalogs' or the controller's): hcp-olm serves no hosted cluster there, writes and prunes nothing there; recreate the HostedCluster under another namespace or name"
    )
}

/// Whether the computed HCP namespace is this HostedCluster's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ownership {
    Owned,
    /// No such namespace (yet).
    NoNamespace,
    /// HyperShift has not created the HostedControlPlane in it yet.
    WaitingForHostedControlPlane,
    /// Someone else's: the message says why.
    NotOwned(String),
}

/// `<namespace>-<name>` is ambiguous (`team-a/b` and `team/a-b`; `openshift/config` is
/// `openshift-config`): a namespace is this HostedCluster's only when it carries HyperShift's
/// HCP label and, where the HostedControlPlane kind is served, holds a HostedControlPlane
/// annotated with this HostedCluster.
pub async fn hcp_namespace_ownership(
    client: &kube::Client,
    ns: &str,
    name: &str,
    hcp_ns: &str,
) -> Result<Ownership, Error> {
    hcp_namespace_ownership_with(client, None, None, ns, name, hcp_ns).await
}

/// [`hcp_namespace_ownership`], reading the namespace and HostedControlPlanes from `stores`
/// when they have them; `hcp_served` is discovery's answer whether the HostedControlPlane
/// kind is served (None: not known, the list tells).
async fn hcp_namespace_ownership_with(
    client: &kube::Client,
    stores: Option<&super::stores::ManagementStores>,
    hcp_served: Option<bool>,
    ns: &str,
    name: &str,
    hcp_ns: &str,
) -> Result<Ownership, Error> {
    let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(client.clone());
    // The store answers only the steady state (the namespace is there and labelled);
    // anything else is confirmed by the API server, since the namespace watch that woke
    // this pass may be ahead of the store.
    let cached = stores
        .and_then(|s| s.namespaces.get(None, hcp_ns))
        .flatten()
        .filter(|n| {
            n.metadata
                .labels
                .as_ref()
                .is_some_and(|l| l.contains_key(HCP_NAMESPACE_LABEL))
        })
        .map(|n| Some(n.as_ref().clone()));
    let live = match cached {
        Some(live) => live,
        None => namespaces
            .get_metadata_opt(hcp_ns)
            .await
            .map_err(kube_err(format!("reading Namespace {hcp_ns}")))?,
    };
    let Some(live) = live else {
        return Ok(Ownership::NoNamespace);
    };
    let labelled = live
        .metadata
        .labels
        .as_ref()
        .is_some_and(|l| l.contains_key(HCP_NAMESPACE_LABEL));
    if !labelled {
        return Ok(Ownership::NotOwned(format!(
            "namespace {hcp_ns} (computed from HostedCluster {ns}/{name}) does not carry HyperShift's label {HCP_NAMESPACE_LABEL}: it is not a hosted control plane namespace, so nothing is written there"
        )));
    }
    if hcp_served == Some(false) {
        // The kind is not served: the label is all there is to check.
        return Ok(Ownership::Owned);
    }
    let want = format!("{ns}/{name}");
    // Again the store answers the steady state only (a HostedControlPlane annotated with
    // this HostedCluster is there); waiting for one, or another's, is confirmed live.
    if let Some(stores) = stores
        && stores.hosted_control_planes.any(|h| {
            h.metadata.namespace.as_deref() == Some(hcp_ns)
                && h.metadata
                    .annotations
                    .as_ref()
                    .and_then(|a| a.get(HOSTED_CLUSTER_ANNOTATION))
                    == Some(&want)
        })
    {
        return Ok(Ownership::Owned);
    }
    let hcps: Api<DynamicObject> = Api::namespaced_with(
        client.clone(),
        hcp_ns,
        &api_resource(
            "hypershift.openshift.io/v1beta1",
            "HostedControlPlane",
            "hostedcontrolplanes",
        ),
    );
    let list = match hcps.list_metadata(&ListParams::default().limit(50)).await {
        Ok(l) => l,
        // The kind is not served: the label is all there is to check.
        Err(kube::Error::Api(s)) if s.code == 404 => return Ok(Ownership::Owned),
        Err(e) => {
            return Err(kube_err(format!("listing HostedControlPlanes in {hcp_ns}"))(e));
        }
    };
    let owners: Vec<String> = list
        .items
        .iter()
        .filter_map(|h| {
            h.metadata
                .annotations
                .as_ref()?
                .get(HOSTED_CLUSTER_ANNOTATION)
                .cloned()
        })
        .collect();
    if owners.contains(&want) {
        Ok(Ownership::Owned)
    } else if list.items.is_empty() {
        Ok(Ownership::WaitingForHostedControlPlane)
    } else {
        Ok(Ownership::NotOwned(format!(
            "namespace {hcp_ns} (computed from HostedCluster {want}) holds the hosted control plane of {}: nothing is written there",
            owners
                .first()
                .map(String::as_str)
                .unwrap_or("another HostedCluster")
        )))
    }
}

async fn ensure_hosted_olm(
    ctx: &Context,
    ns: &str,
    name: &str,
    hcp_ns: &str,
) -> Result<Option<(HostedOLM, bool)>, Error> {
    let api: Api<HostedOLM> = Api::namespaced(ctx.client.clone(), hcp_ns);
    let what = || format!("HostedOLM {hcp_ns}/{name}");
    // From the store (its watch wakes the pass after it holds an edit) unless it does not
    // have our last status write yet.
    if let Some(stores) = ctx.stores()
        && let Lookup::Found(h) = stores.hosted_olms.ours(hcp_ns, name)
        && ctx.status_seen(
            &format!("{hcp_ns}/{name}"),
            h.metadata.resource_version.as_deref(),
        )
    {
        return Ok(Some((h.as_ref().clone(), false)));
    }
    if let Some(h) = api.get_opt(name).await.map_err(kube_err(what()))? {
        return Ok(Some((h, false)));
    }
    let mut obj = HostedOLM::new(
        name,
        HostedOLMSpec {
            hosted_cluster: Some(HostedClusterRef {
                namespace: ns.to_string(),
                name: name.to_string(),
            }),
            ..Default::default()
        },
    );
    obj.metadata.namespace = Some(hcp_ns.to_string());
    obj.metadata.labels = Some(selector_for(ns, name));
    match api.create(&PostParams::default(), &obj).await {
        Ok(h) => {
            tracing::info!(namespace = %hcp_ns, %name, "created HostedOLM");
            Ok(Some((h, true)))
        }
        // The HCP namespace does not exist (yet).
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(None),
        Err(kube::Error::Api(s)) if s.code == 409 => Ok(Some((
            api.get(name).await.map_err(kube_err(what()))?,
            false,
        ))),
        Err(e) => Err(kube_err(what())(e)),
    }
}

/// Keep a condition's `lastTransitionTime` when its status did not change.
fn keep_transition_times(old: &[Condition], new: &mut [Condition]) {
    for c in new {
        if let Some(o) = old.iter().find(|o| o.type_ == c.type_)
            && o.status == c.status
        {
            c.last_transition_time = o.last_transition_time.clone();
        }
    }
}

/// Server-side apply of the status subresource, only when it differs from the live one.
async fn write_status(
    ctx: &Context,
    hc: &HostedCluster,
    holm: &HostedOLM,
    mut new: HostedOLMStatus,
) -> Result<bool, Error> {
    let old = holm.status.clone().unwrap_or_default();
    keep_transition_times(&old.conditions, &mut new.conditions);
    if old == new {
        return Ok(false);
    }
    let ns = holm.metadata.namespace.clone().unwrap_or_default();
    let name = holm.metadata.name.clone().unwrap_or_default();
    let api: Api<HostedOLM> = Api::namespaced(ctx.client.clone(), &ns);
    let patch = json!({
        "apiVersion": "olm.hcp-olm.io/v1alpha1",
        "kind": "HostedOLM",
        "status": new,
    });
    let written = api
        .patch_status(
            &name,
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(&patch),
        )
        .await
        .map_err(kube_err(format!("writing status of HostedOLM {ns}/{name}")))?;
    ctx.status_written(
        &format!("{ns}/{name}"),
        written.metadata.resource_version.as_deref(),
    );
    if let Some(events) = &ctx.events {
        let t = super::events::transitions(&old.conditions, &new.conditions);
        if !t.is_empty() {
            events.publish(hc, holm, &t).await;
        }
    }
    Ok(true)
}

fn report_error(cluster: &'static str, r: &Report) -> Option<Error> {
    r.errors.first().map(|e| Error::Apply {
        cluster,
        count: r.errors.len(),
        first: e.to_string(),
    })
}

/// Every request of `r` failed without an answer from the API server (connect, TLS,
/// timeout): it is unreachable, not refusing.
pub(super) fn no_answer(r: &Report) -> bool {
    !r.errors.is_empty()
        && r.errors
            .iter()
            .all(|e| !matches!(e.source, kube::Error::Api(_)))
}

fn writes(r: &Report) -> usize {
    r.created.len() + r.updated.len() + r.deleted.len()
}

/// Reconcile one HostedCluster: everything of ours in its HCP namespace and its guest.
pub async fn reconcile_one(ctx: &Context, hc: &HostedCluster) -> Result<Outcome, Error> {
    // On the heap: the whole pass is a large state machine (debug builds especially), and
    // whoever awaits it (a test's block_on, a 2 MiB worker thread) keeps only a pointer.
    // Bounded as a whole: a guest API server (the tenant's, or one the kubeconfig points
    // at) that sends a response head and then stalls the body while answering HTTP/2 PINGs
    // would otherwise hold a reconcile slot for ever. The guest session goes with it.
    match tokio::time::timeout(PASS_TIMEOUT, Box::pin(reconcile_pass(ctx, hc))).await {
        Ok(r) => r,
        Err(_) => {
            ctx.guests.close(&cluster_key(hc));
            Err(Error::PassTimeout(PASS_TIMEOUT))
        }
    }
}

/// The longest one pass may take (a pass that converges takes well under a second; one that
/// creates everything, seconds; registry lookups are bounded separately).
pub const PASS_TIMEOUT: Duration = Duration::from_secs(300);

/// What a step of a pass hands on: the next step's input, or the pass's outcome (an
/// early exit: not ours, waiting, HyperShift's OLM active, guest unreachable, paused).
enum Step<T> {
    Next(T),
    Done(Outcome),
}

/// The pass's first step's result: the HostedCluster is ours to serve.
struct Admitted {
    ns: String,
    name: String,
    hcp_ns: String,
    holm: HostedOLM,
    /// Writes to the management cluster so far (finalizer, HostedOLM, TakeOver).
    hcp_writes: usize,
}

/// Step admit: the HCP namespace is not one of ours and is this HostedCluster's, the
/// finalizer is set, and the HostedOLM exists (created with defaults when absent). Before
/// any write anywhere.
async fn admit(ctx: &Context, hc: &HostedCluster) -> Result<Step<Admitted>, Error> {
    let (ns, name, hcp_ns) = identity(hc)?;
    // Our own namespaces are never an HCP namespace, whoever labels them (issue 35, item 9).
    if crate::sharing::reserved(&hcp_ns) {
        let why = reserved_message(&ns, &name, &hcp_ns);
        tracing::warn!(cluster = %format!("{ns}/{name}"), namespace = %hcp_ns, "{why}");
        if let Some(events) = &ctx.events {
            events.warn_hosted_cluster(hc, RESERVED_REASON, &why).await;
        }
        return Ok(Step::Done(Outcome::new(
            State::Invalid(RESERVED_REASON.into()),
            ctx.schedule.resync,
        )));
    }
    // Before any write anywhere: is the computed HCP namespace this HostedCluster's?
    let stores = ctx.stores();
    let hcp_served = ctx
        .served("hypershift.openshift.io/v1beta1", "hostedcontrolplanes")
        .await?;
    match hcp_namespace_ownership_with(
        &ctx.client,
        stores.as_deref(),
        Some(hcp_served),
        &ns,
        &name,
        &hcp_ns,
    )
    .await?
    {
        Ownership::Owned => {}
        // Nothing is written into the namespace until a pass has seen it labelled: one
        // created between this check and a write could be anybody's. Its creation (or
        // labelling) wakes this HostedCluster.
        Ownership::NoNamespace => {
            tracing::info!(cluster = %format!("{ns}/{name}"), namespace = %hcp_ns, "HCP namespace does not exist yet");
            return Ok(Step::Done(Outcome::new(
                State::Waiting("WaitingForHCPNamespace".into()),
                ctx.schedule.waiting,
            )));
        }
        Ownership::WaitingForHostedControlPlane => {
            return Ok(Step::Done(Outcome::new(
                State::Waiting("WaitingForHostedControlPlane".into()),
                ctx.schedule.waiting,
            )));
        }
        Ownership::NotOwned(why) => {
            tracing::warn!(cluster = %format!("{ns}/{name}"), namespace = %hcp_ns, "{why}");
            if let Some(events) = &ctx.events {
                events
                    .warn_hosted_cluster(hc, "ControlPlaneNamespaceNotOwned", &why)
                    .await;
            }
            // a lasting condition: look again at the resync interval, not every 30 s
            return Ok(Step::Done(Outcome::new(
                State::Invalid("ControlPlaneNamespaceNotOwned".into()),
                ctx.schedule.resync,
            )));
        }
    }
    // No finalizer yet: what is written so far lives in the HCP namespace and goes with it.
    // It is added once a pass goes on to write outside it (`reconcile_pass`, after coexist).
    let mut hcp_writes = 0;

    let Some((mut holm, created)) = ensure_hosted_olm(ctx, &ns, &name, &hcp_ns).await? else {
        tracing::info!(cluster = %format!("{ns}/{name}"), namespace = %hcp_ns, "HCP namespace does not exist yet");
        let mut o = Outcome::new(
            State::Waiting("WaitingForHCPNamespace".into()),
            ctx.schedule.waiting,
        );
        o.hcp_writes = hcp_writes;
        return Ok(Step::Done(o));
    };
    hcp_writes += usize::from(created);
    // The fleet default (`--hypershift-olm`) where the HostedOLM does not say.
    holm.spec
        .hyper_shift_olm
        .get_or_insert(ctx.config.hypershift_olm);
    Ok(Step::Next(Admitted {
        ns,
        name,
        hcp_ns,
        holm,
        hcp_writes,
    }))
}

/// Step coexist: HyperShift runs its own OLM in every HCP namespace, and its hosted-cluster-
/// config-operator writes the same guest objects. Two OLMs on one guest fight over its
/// Subscriptions, CatalogSources and packageserver APIService, so while HyperShift's OLM
/// runs nothing of ours is applied or pruned, our own OLM operators (if an earlier pass
/// started them) are scaled to 0, and status says so, with the remedy. Checked before the
/// guest is contacted or any registry is asked. TakeOver (or handing back): HyperShift's
/// debug-deployments annotation first. Adds its writes to `a.hcp_writes`.
async fn coexist(
    ctx: &Context,
    hc: &HostedCluster,
    a: &mut Admitted,
    now_t: &Time,
) -> Result<Step<()>, Error> {
    let (ns, name, hcp_ns, holm) = (&a.ns, &a.name, &a.hcp_ns, &a.holm);
    let generation = holm.metadata.generation;
    let hcp_writes = &mut a.hcp_writes;
    let stores = ctx.stores();
    let take_over = holm.spec.hyper_shift_olm == Some(HyperShiftOLMMode::TakeOver);
    let debug_deployments = match sync_debug_deployments(ctx, hc, take_over).await? {
        Ok((n, value)) => {
            *hcp_writes += n;
            value
        }
        Err(e) => {
            let msg = format!(
                "cannot {} HyperShift's OLM: {e}",
                if take_over {
                    "take over from"
                } else {
                    "hand back to"
                }
            );
            tracing::warn!(cluster = %format!("{ns}/{name}"), "{msg}");
            let mut st = holm.status.clone().unwrap_or_default();
            st.observed_generation = generation;
            crate::status::set_blocked(
                &mut st.conditions,
                TAKE_OVER_BLOCKED,
                &msg,
                generation,
                now_t,
            );
            let mut o = Outcome::new(
                State::Invalid(TAKE_OVER_BLOCKED.into()),
                ctx.schedule.resync,
            );
            o.status_written = write_status(ctx, hc, holm, st).await?;
            o.hcp_writes = *hcp_writes;
            return Ok(Step::Done(o));
        }
    };
    let mut active = hypershift_olm_active(
        &ctx.client,
        stores.as_deref(),
        hcp_ns,
        debug_deployments.as_deref(),
    )
    .await?;
    if take_over {
        // HyperShift's catalogs keep serving; only its operators must be at 0.
        active.retain(|n| takeover::TAKEN_OVER.contains(&n.as_str()));
    }
    if take_over && !active.is_empty() {
        let msg = format!(
            "waiting for HyperShift's control-plane-operator to scale {} in {hcp_ns} to 0 (annotation {} on the HostedCluster); hcp-olm's OLM starts then",
            active.join(", "),
            takeover::DEBUG_DEPLOYMENTS
        );
        tracing::info!(cluster = %format!("{ns}/{name}"), "{msg}");
        *hcp_writes += stop_our_olm_operators(&ctx.client, hcp_ns).await?;
        let mut st = holm.status.clone().unwrap_or_default();
        st.observed_generation = generation;
        crate::status::set_waiting(
            &mut st.conditions,
            WAITING_FOR_HYPERSHIFT_OLM,
            &msg,
            generation,
            now_t,
        );
        let mut o = Outcome::new(
            State::Waiting(WAITING_FOR_HYPERSHIFT_OLM.into()),
            ctx.schedule.waiting,
        );
        o.status_written = write_status(ctx, hc, holm, st).await?;
        o.hcp_writes = *hcp_writes;
        return Ok(Step::Done(o));
    }
    if !active.is_empty() {
        let msg = hypershift_olm_message(hcp_ns, name, &active);
        tracing::warn!(cluster = %format!("{ns}/{name}"), "{msg}");
        *hcp_writes += stop_our_olm_operators(&ctx.client, hcp_ns).await?;
        let mut st = holm.status.clone().unwrap_or_default();
        st.observed_generation = generation;
        crate::status::set_blocked(
            &mut st.conditions,
            HYPERSHIFT_OLM_ACTIVE,
            &msg,
            generation,
            now_t,
        );
        let mut o = Outcome::new(
            State::Invalid(HYPERSHIFT_OLM_ACTIVE.into()),
            ctx.schedule.resync,
        );
        o.status_written = write_status(ctx, hc, holm, st).await?;
        o.hcp_writes = *hcp_writes;
        return Ok(Step::Done(o));
    }
    Ok(Step::Next(()))
}

/// Step connect: a session with the guest API server (its kubeconfig read and checked),
/// or status saying why there is none.
async fn connect(
    ctx: &Context,
    hc: &HostedCluster,
    holm: &HostedOLM,
    now_t: &Time,
) -> Result<Step<Arc<guest::Session>>, Error> {
    let generation = holm.metadata.generation;
    match guest_client(ctx, hc, true).await? {
        Ok(s) => Ok(Step::Next(s)),
        Err(access) => {
            tracing::info!(cluster = %cluster_key(hc), reason = access.reason(), "no guest access");
            let st = HostedOLMStatus {
                observed_generation: generation,
                conditions: access.conditions(generation, now_t),
                ..holm.status.clone().unwrap_or_default()
            };
            let mut o = Outcome::new(State::Waiting(access.reason().into()), ctx.schedule.waiting);
            o.status_written = write_status(ctx, hc, holm, st).await?;
            Ok(Step::Done(o))
        }
    }
}

/// Step validate: the release facts (registry answers, cached) and the validated input,
/// with the pull secret lookups use; status says what is invalid. Paused clusters stop
/// here.
async fn validated(
    ctx: &Context,
    hc: &HostedCluster,
    holm: &HostedOLM,
    now: OffsetDateTime,
) -> Result<Step<(validate::ValidInput, Option<hcp_olm_oci::PullSecret>)>, Error> {
    let (ns, name, hcp_ns) = identity(hc)?;
    let hcp_ns = hcp_ns.as_str();
    let generation = holm.metadata.generation;
    let now_t = now_time(now);
    let olm_overridden = holm.spec.images.as_ref().is_some_and(|i| i.olm.is_some());
    // Registry lookups use this HostedCluster's pull secret (HyperShift's copy in the
    // HCP namespace), never the controller's when it is there.
    let pull_secret = if ctx.config.oci.is_some() {
        read_pull_secret(ctx, hcp_ns).await?
    } else {
        None
    };
    let facts = facts::release_facts_cached(
        hc,
        &ctx.config,
        pull_secret.as_ref(),
        olm_overridden,
        &ctx.lookups,
        ctx.schedule.catalog_refresh,
    )
    .await;
    let mut valid = match validate::validate(hc, Some(&holm.spec), &facts, &ctx.config.defaults) {
        Ok(v) => v,
        Err(reasons) => {
            let first = reasons
                .first()
                .map(|r| r.code.as_str().to_string())
                .unwrap_or_default();
            tracing::info!(cluster = %format!("{ns}/{name}"), problems = ?reasons.iter().map(|r| r.to_string()).collect::<Vec<_>>(), "invalid input");
            let st = HostedOLMStatus {
                observed_generation: generation,
                conditions: status::conditions_from_validation(&reasons, generation, &now_t),
                ..holm.status.clone().unwrap_or_default()
            };
            let mut o = Outcome::new(State::Invalid(first), ctx.schedule.resync);
            o.status_written = write_status(ctx, hc, holm, st).await?;
            return Ok(Step::Done(o));
        }
    };
    // A lookup proves this cluster may read a catalog only when it used the cluster's own
    // pull secret, or no credentials at all (the controller has none of its own).
    valid.lookup_credentials_are_own =
        pull_secret.is_some() || !ctx.config.controller_registry_credentials;
    // Skipped registry overrides are warnings, not Degraded: an Event when they change.
    let key = format!("{ns}/{name}");
    if ctx.warnings_changed(&key, &valid.registry_override_warnings) {
        tracing::warn!(cluster = %key, warnings = ?valid.registry_override_warnings, "registry overrides skipped");
        if let Some(events) = &ctx.events {
            events
                .warn_hosted_cluster(
                    hc,
                    "RegistryOverrideSkipped",
                    &valid.registry_override_warnings.join("; "),
                )
                .await;
        }
    }
    // Values HyperShift would also ignore: an Event when they change.
    let paused_warning: Vec<String> = valid.paused_until_warning.iter().cloned().collect();
    for (what, reason, warnings) in [
        ("pausedUntil", "InvalidPausedUntil", &paused_warning),
        ("knobs", "HyperShiftKnobSkipped", &valid.knob_warnings),
    ] {
        if ctx.warnings_changed(&format!("{key}#{what}"), warnings)
            && let Some(events) = &ctx.events
        {
            tracing::warn!(cluster = %key, ?warnings, "{what} values skipped");
            events
                .warn_hosted_cluster(hc, reason, &warnings.join("; "))
                .await;
        }
    }
    if valid.paused_until.is_paused(now) {
        tracing::info!(cluster = %valid.cluster.key(), "reconciliation paused");
        return Ok(Step::Done(Outcome::new(State::Paused, ctx.schedule.resync)));
    }

    Ok(Step::Next((valid, pull_secret)))
}

/// Step credentials: the CA and serving certificates, the tunnel keys (status says why
/// stored keys are unusable; nothing is applied then) and the gateway's endpoint as far
/// as the live Service tells (checked again after the HCP objects are applied, so a new
/// Service's node port reaches the guest at once).
async fn credentials(
    ctx: &Context,
    hc: &HostedCluster,
    holm: &HostedOLM,
    valid: &validate::ValidInput,
    now: OffsetDateTime,
    now_t: &Time,
) -> Result<Step<(render::PkiInput, render::TunnelKeys, Option<Value>)>, Error> {
    let generation = holm.metadata.generation;
    let (pki, _issued) = secrets::pki(ctx, valid, now).await?;
    let (mut tunnel, new_keys) =
        match secrets::tunnel_keys(ctx, valid, now, ctx.schedule.key_propagation).await {
            Ok(k) => k,
            Err(Error::Keys(msg)) => {
                // Nothing is applied: the live tunnel configs keep the last good keys.
                tracing::warn!(cluster = %valid.cluster.key(), "{msg}");
                let mut st = holm.status.clone().unwrap_or_default();
                st.observed_generation = generation;
                crate::status::set_degraded(
                    &mut st.conditions,
                    "TunnelKeysInvalid",
                    &msg,
                    generation,
                    now_t,
                );
                let mut o = Outcome::new(
                    State::Invalid("TunnelKeysInvalid".into()),
                    ctx.schedule.resync,
                );
                o.status_written = write_status(ctx, hc, holm, st).await?;
                return Ok(Step::Done(o));
            }
            Err(e) => return Err(e),
        };
    set_endpoint(
        &mut tunnel,
        read_gateway_endpoint(ctx, &valid.cluster.hcp_namespace, valid).await?,
    );

    Ok(Step::Next((pki, tunnel, new_keys)))
}

/// Step guest: the first request to the guest (are the OLM CRDs served?) and, for guest
/// placement, its live OperatorHub, which `valid` follows. When the guest does not
/// answer, status says so and everything is left as it is. True: the OLM CRDs are served.
async fn guest_ready(
    ctx: &Context,
    hc: &HostedCluster,
    holm: &HostedOLM,
    session: &guest::Session,
    valid: &mut validate::ValidInput,
    now_t: &Time,
) -> Result<Step<bool>, Error> {
    let generation = holm.metadata.generation;
    // Known from the session's watch while it is whole (which also says the guest answers;
    // see guest_reads), else asked.
    let reads = session.reads.clone();
    let guest = &session.client;
    let known_crd = reads.as_ref().and_then(|r| r.crd.get(None, GUEST_OLM_CRD));
    let crds: Api<CustomResourceDefinition> = Api::all(guest.clone());
    let crd = match known_crd {
        Some(c) => Ok(c.is_some()),
        None => crds.get_opt(GUEST_OLM_CRD).await.map(|c| c.is_some()),
    };
    let (guest_olm_crds_ready, failed) = match crd {
        Ok(ready) => (ready, None),
        Err(kube::Error::Api(s)) => {
            return Err(kube_err(format!("reading guest CRD {GUEST_OLM_CRD}"))(
                kube::Error::Api(s),
            ));
        }
        Err(e) => {
            tracing::info!(cluster = %valid.cluster.key(), error = %e, "guest unreachable");
            let refused = guest::find_source::<guest::ServerRefused>(&e);
            let access = match guest_bound(&e) {
                Some(b) => GuestAccess::ResponseBound(b),
                None if refused.is_some() => {
                    GuestAccess::ServerRefused(refused.map(ToString::to_string).unwrap_or_default())
                }
                None => {
                    GuestAccess::Unreachable(format!("the guest API server does not answer: {e}"))
                }
            };
            (false, Some(access))
        }
    };

    // Guest placement: HyperShift creates OperatorHub/cluster once and then leaves it to the
    // guest's admins, so which default CatalogSources exist follows the guest's live
    // OperatorHub (never reverted by us). Read once the guest has answered; an error now
    // fails the pass (retried) rather than briefly restoring sources the guest disabled,
    // and an answer over its bound is said in status as the CRD read's is.
    let mut failed = failed;
    if failed.is_none() && valid.placement == CatalogPlacement::Guest && !valid.hypershift_take_over
    {
        match live_operator_hub(&session.client).await {
            Ok(Some(live)) if live != valid.operator_hub => {
                valid.follow_operator_hub(live, holm.spec.default_catalogs.as_deref());
            }
            Ok(_) => {}
            Err(e) => match guest_bound(&e) {
                Some(b) => failed = Some(GuestAccess::ResponseBound(b)),
                None => return Err(e),
            },
        }
    }
    if let Some(access) = failed {
        // Its watches would only retry: a new session once it answers again.
        ctx.guests.close(&cluster_key(hc));
        let st = HostedOLMStatus {
            observed_generation: generation,
            conditions: access.conditions(generation, now_t),
            ..holm.status.clone().unwrap_or_default()
        };
        let mut o = Outcome::new(State::Waiting(access.reason().into()), ctx.schedule.waiting);
        o.status_written = write_status(ctx, hc, holm, st).await?;
        return Ok(Step::Done(o));
    }
    Ok(Step::Next(guest_olm_crds_ready))
}

/// The images of the enabled catalogs (registry answers cached and shared), each held at
/// its last good image while its registry fails, and whether this cluster is entitled to
/// the shared copies (issue 35 item 6, issue 38 item 3). Sets
/// `valid.entitlement_unproven`.
async fn catalog_images(
    ctx: &Context,
    hc: &HostedCluster,
    holm: &HostedOLM,
    valid: &mut validate::ValidInput,
    pull_secret: Option<&hcp_olm_oci::PullSecret>,
) -> (
    BTreeMap<DefaultCatalog, Result<CatalogImage, CatalogImageError>>,
    Vec<crate::last_good::Held>,
) {
    // The catalog images, once the enabled catalogs are final (registry answers cached and
    // shared; none asked while the guest does not answer, since nothing is rendered then).
    // An answer that may admit this cluster to a shared catalog is looked up again at least
    // every ENTITLEMENT_REFRESH (credentials revoked at the registry; issue 35, item 6).
    let lookup_ttl = if crate::sharing::may_share(valid) {
        ctx.schedule
            .catalog_refresh
            .min(ctx.shared_digests.lifetime())
    } else {
        ctx.schedule.catalog_refresh
    };
    let mut catalog_images = facts::catalog_images_cached(
        hc,
        valid,
        &ctx.config,
        pull_secret,
        &ctx.lookups,
        lookup_ttl,
    )
    .await;
    // A registry that failed, or has not answered yet, is no answer: each such catalog
    // keeps the image its status records (issue 38, item 3).
    let held_catalogs = crate::last_good::hold(valid, holm.status.as_ref(), &mut catalog_images);
    if held_catalogs.iter().any(|h| h.failure.is_some()) {
        tracing::info!(cluster = %cluster_key(hc), held = ?held_catalogs, "registry lookups failed: catalogs keep their last good image");
    }
    // A mirror's anonymous answer admits nobody: the default registry must grant this
    // cluster's pull secret (issue 35, item 6); without an answer the recorded decision
    // stands.
    if crate::sharing::may_share(valid) {
        let e = facts::entitlement(
            hc,
            valid,
            &ctx.config,
            pull_secret,
            &catalog_images,
            &ctx.lookups,
            lookup_ttl,
        )
        .await;
        valid.entitlement_unproven =
            crate::last_good::entitlement(e.unproven, &e.unknown, holm.status.as_ref());
    }

    (catalog_images, held_catalogs)
}

/// The ClusterIP of the Service the guest's packageserver APIService points at (ours, or
/// HyperShift's under TakeOver): from the store once it has one, else asked.
async fn packageserver_cluster_ip(
    ctx: &Context,
    stores: Option<&stores::ManagementStores>,
    hcp_ns: &str,
    valid: &validate::ValidInput,
) -> Result<Option<String>, Error> {
    let svcs: Api<Service> = Api::namespaced(ctx.client.clone(), hcp_ns);
    // TakeOver: the guest reaches ours through HyperShift's Service (its hosted-cluster-
    // config-operator points the guest Endpoints at that ClusterIP).
    let ps_service = if valid.hypershift_take_over {
        names::HYPERSHIFT_PACKAGESERVER
    } else {
        names::PACKAGESERVER
    };
    // From the store only once it has a ClusterIP (otherwise the API server says).
    let cached = stores
        .and_then(|s| match s.services.ours(hcp_ns, ps_service) {
            Lookup::Found(svc) => Some(svc.as_ref().clone()),
            Lookup::Ask => None,
        })
        .filter(|svc| {
            svc.spec
                .as_ref()
                .and_then(|s| s.cluster_ip.as_deref())
                .is_some_and(|ip| !ip.is_empty() && ip != "None")
        });
    let live = match cached {
        Some(svc) => Some(svc),
        None => svcs
            .get_opt(ps_service)
            .await
            .map_err(kube_err(format!("reading Service {hcp_ns}/{ps_service}")))?,
    };
    Ok(live
        .and_then(|s| s.spec?.cluster_ip)
        .filter(|ip| !ip.is_empty() && ip != "None"))
}

/// Step apply (guest side): the guest's objects applied and pruned, subscription defaults,
/// and the deprecated marketplace CatalogSource removed. The report and the writes.
async fn apply_guest(
    session: &guest::Session,
    input: &RenderInput,
    desired: &Desired,
    selector: &BTreeMap<String, String>,
    guest_olm_crds_ready: bool,
) -> (Report, usize) {
    let guest_applier = Applier::new(session.client.clone(), FIELD_MANAGER)
        .with_cache(session.cache.clone())
        .with_list_options(hcp_olm_apply::watch::Options::UNTRUSTED);
    let guest_targets: Vec<Target> = desired.guest.iter().map(target).collect();
    let mut guest_report = guest_applier.apply(&guest_targets).await;
    guest_report.merge(
        guest_applier
            .prune(&guest_kinds(), None, selector, &guest_targets)
            .await,
    );
    // subscriptionDefaults: guest Subscriptions without a placement of their own get it.
    let mut subscription_writes = 0;
    if guest_olm_crds_ready {
        match apply_subscription_defaults(&session.client, &input.valid.subscription_defaults).await
        {
            Ok(n) => subscription_writes = n,
            Err(e) => {
                tracing::warn!(cluster = %input.valid.cluster.key(), error = %e, "subscription defaults")
            }
        }
    }
    // HyperShift deletes the deprecated redhat-marketplace CatalogSource left by older
    // releases; so do we (its image is no longer published, so it only fails).
    let guest_writes = writes(&guest_report)
        + subscription_writes
        + usize::from(
            delete_deprecated_marketplace(
                &session.client,
                session.reads.as_ref().and_then(|r| {
                    r.deprecated
                        .get(Some(names::MARKETPLACE_NAMESPACE), DEPRECATED_MARKETPLACE)
                        .map(|o| o.is_some())
                }),
            )
            .await
                .inspect_err(|e| tracing::warn!(cluster = %input.valid.cluster.key(), error = %e, "deleting the deprecated redhat-marketplace CatalogSource"))
                .unwrap_or(false),
        );
    (guest_report, guest_writes)
}

/// Step report: reads back what status reports (guest CatalogSources, installed
/// operators, every component) and writes status. Whether it was written, and whether
/// every component is available.
#[allow(clippy::too_many_arguments)]
async fn report(
    ctx: &Context,
    hc: &HostedCluster,
    holm: &HostedOLM,
    session: &guest::Session,
    input: &RenderInput,
    desired: &Desired,
    selector: &BTreeMap<String, String>,
    reports: (&Report, &Report),
    apply_error: Option<&Error>,
    now_t: &Time,
) -> Result<(bool, bool, Option<Duration>), Error> {
    let (hcp_report, guest_report) = reports;
    let generation = holm.metadata.generation;
    // Read back what status reports.
    let guest_sources = match session.reads.as_ref().and_then(|r| r.sources.list()) {
        Some(kept) => sources_from(kept, selector),
        None => read_guest_catalog_sources(&session.client, selector).await,
    };
    let installed = match session.reads.as_ref().and_then(|r| r.csvs.list()) {
        Some(kept) => operators_from(kept),
        None => read_installed_operators(&session.client).await,
    };
    let components = super::components::read_components(
        ctx,
        &session.client,
        session.reads.as_deref(),
        &input.valid.cluster.hcp_namespace,
        desired,
    )
    .await?;
    let all_available = components.iter().all(|c| c.available);
    let previous = holm
        .status
        .as_ref()
        .map(|s| s.catalogs.as_slice())
        .unwrap_or_default();
    let (mut st, catalog_recheck) = build_status(
        input,
        desired,
        &guest_sources,
        &installed,
        components,
        apply_error,
        generation,
        now_t,
        previous,
    );
    // A guest answer over its bound is named as such (not a plain ApplyFailed).
    if hcp_report.errors.is_empty()
        && let Some(b) = guest_report.errors.first().and_then(|e| guest_bound(e))
        && let Some(d) = st.conditions.iter_mut().find(|c| c.type_ == DEGRADED)
    {
        d.reason = bound_reason(&b).into();
    }
    let status_written = write_status(ctx, hc, holm, st).await?;
    Ok((status_written, all_available, catalog_recheck))
}

/// Hashes of the Secrets our pods mount or pull with (HyperShift's, in the HCP namespace):
/// a changed Secret changes the config-hash annotation and rolls pods.
async fn external_secret_hashes(
    ctx: &Context,
    hcp_ns: &str,
    valid: &validate::ValidInput,
) -> Result<BTreeMap<String, String>, Error> {
    let mut external_secret_hashes = BTreeMap::new();
    let mut mounted = vec![valid.kubeconfig_secret.clone(), valid.pull_secret.clone()];
    if valid.hypershift_take_over {
        mounted.push(names::HYPERSHIFT_PACKAGESERVER_CERT.to_string());
    }
    for secret_name in &mounted {
        if let Some(s) = ctx
            .read_secret(hcp_ns, secret_name)
            .await
            .map_err(kube_err(format!("reading Secret {hcp_ns}/{secret_name}")))?
        {
            external_secret_hashes.insert(secret_name.clone(), secret_hash(&s));
        }
    }

    Ok(external_secret_hashes)
}

/// A replaced CA stays in the guest's caBundle until every packageserver pod serves a
/// certificate of the new one, i.e. the live Deployment has rolled out the rendered
/// template; then it leaves (`input` and `desired` rendered again). Reads only while a
/// previous CA is held (a converged pass reads nothing more).
async fn ca_rollover(
    ctx: &Context,
    input: &mut RenderInput,
    desired: &mut Desired,
) -> Result<(), Error> {
    let hcp_ns = input.valid.cluster.hcp_namespace.clone();
    let hcp_ns = hcp_ns.as_str();
    if input.pki.previous_ca_pem.is_some() {
        let live = Api::<Deployment>::namespaced(ctx.client.clone(), hcp_ns)
            .get_opt(names::PACKAGESERVER)
            .await
            .map_err(kube_err(format!(
                "reading Deployment {hcp_ns}/{}",
                names::PACKAGESERVER
            )))?;
        let rendered = desired
            .hcp
            .iter()
            .find(|o| o.kind == "Deployment" && o.name == names::PACKAGESERVER);
        if let (Some(live), Some(rendered)) = (live, rendered)
            && super::components::rolled_out(&rendered.body, &live)
        {
            tracing::info!(cluster = %input.valid.cluster.key(), "every packageserver pod serves the new CA's certificate: the previous CA leaves the caBundle");
            input.pki.previous_ca_pem = None;
            *desired = render::desired(input)?;
        }
    }

    Ok(())
}

/// Step apply (management side): the HCP namespace's objects applied (new tunnel keys
/// first, create-only) and what is no longer wanted pruned.
async fn apply_management(
    ctx: &Context,
    input: &RenderInput,
    desired: &Desired,
    new_keys: Option<Value>,
    selector: &BTreeMap<String, String>,
) -> Report {
    let hcp_ns = input.valid.cluster.hcp_namespace.as_str();
    let mgmt = Applier::new(ctx.client.clone(), FIELD_MANAGER)
        .with_cache(ctx.mgmt_cache())
        .keep_written(&["Secret"]);
    let mut hcp_targets: Vec<Target> = desired.hcp.iter().map(target).collect();
    let keys_target = Target::new(
        "v1",
        "Secret",
        "secrets",
        Policy::CreateOnly,
        new_keys.clone().unwrap_or_else(
            || json!({"metadata": {"name": secrets::TUNNEL_KEYS_SECRET, "namespace": hcp_ns}}),
        ),
    );
    if new_keys.is_some() {
        hcp_targets.insert(0, keys_target.clone());
    }
    let mut hcp_report = mgmt.apply(&hcp_targets).await;
    // The Secrets just written, as the API server answered: the next pass's reads of them
    // (certificates, keys) are answered from memory instead of a GET each.
    ctx.remember_written_secrets(std::mem::take(&mut hcp_report.written))
        .await;
    let mut keep = hcp_targets.clone();
    if new_keys.is_none() {
        keep.push(keys_target);
    }
    // A kind the management cluster does not serve holds nothing of ours: not listed.
    let mut prune_kinds = hcp_kinds();
    if !input.service_monitors_served {
        prune_kinds.retain(|(r, _)| r.kind != "ServiceMonitor");
    }
    hcp_report.merge(
        mgmt.prune(&prune_kinds, Some(hcp_ns), selector, &keep)
            .await,
    );

    hcp_report
}

async fn reconcile_pass(ctx: &Context, hc: &HostedCluster) -> Result<Outcome, Error> {
    if !ctx.config.scope.contains(hc.metadata.labels.as_ref()) {
        // Untouched; one we served before (our finalizer) is cleaned up and released.
        let mut o = Box::pin(cleanup(ctx, hc)).await?;
        o.state = State::OutOfScope;
        return Ok(o);
    }
    if hc.metadata.deletion_timestamp.is_some() {
        return Box::pin(cleanup(ctx, hc)).await;
    }
    let mut admitted = match admit(ctx, hc).await? {
        Step::Next(a) => a,
        Step::Done(o) => return Ok(o),
    };
    let now = OffsetDateTime::now_utc();
    let now_t = now_time(now);
    if let Step::Done(o) = coexist(ctx, hc, &mut admitted, &now_t).await? {
        return Ok(o);
    }
    // From here on the pass writes outside the HCP namespace (the guest, shared catalogs):
    // our finalizer first, so none of it outlives the HostedCluster unnoticed.
    admitted.hcp_writes += usize::from(ensure_finalizer(ctx, hc, true).await?);
    let Admitted {
        ns,
        name,
        hcp_ns: _,
        holm,
        mut hcp_writes,
    } = admitted;

    let session = match connect(ctx, hc, &holm, &now_t).await? {
        Step::Next(s) => s,
        Step::Done(o) => return Ok(o.with_hcp_writes(hcp_writes)),
    };
    let (valid, pull_secret) = match validated(ctx, hc, &holm, now).await? {
        Step::Next(v) => v,
        Step::Done(o) => return Ok(o.with_hcp_writes(hcp_writes)),
    };

    let (pki, tunnel, new_keys) = match credentials(ctx, hc, &holm, &valid, now, &now_t).await? {
        Step::Next(k) => k,
        Step::Done(o) => return Ok(o.with_hcp_writes(hcp_writes)),
    };
    let mut valid = valid;
    let guest_olm_crds_ready =
        match guest_ready(ctx, hc, &holm, &session, &mut valid, &now_t).await? {
            Step::Next(r) => r,
            Step::Done(o) => return Ok(o.with_hcp_writes(hcp_writes)),
        };
    let (catalog_images, held_catalogs) =
        catalog_images(ctx, hc, &holm, &mut valid, pull_secret.as_ref()).await;
    let rotation_recheck = tunnel.rotation_recheck;
    let mut input = gather(
        ctx,
        &name,
        &holm,
        RenderInput {
            valid,
            catalog_images,
            held_catalogs,
            pki,
            tunnel,
            packageserver_cluster_ip: None,
            service_monitors_served: false,
            management_has_scc: false,
            egress_isolation: Vec::new(),
            guest_olm_crds_ready,
            external_secret_hashes: BTreeMap::new(),
            owner: None,
        },
    )
    .await?;
    let mut desired = render::desired(&input)?;
    // The digests of the shared catalogs this cluster points at (the shared pass serves them).
    ctx.shared_digests.record(
        &input.valid.cluster.hcp_namespace,
        &format!("{ns}/{name}"),
        &crate::sharing::shared_uses(&input.valid, &input.catalog_images),
    );
    ca_rollover(ctx, &mut input, &mut desired).await?;

    // Apply and prune, management then guest.
    let selector = labels::prune_selector(&input.valid);
    let hcp_report = apply_management(ctx, &input, &desired, new_keys, &selector).await;
    endpoint_after_apply(ctx, &mut input, &mut desired).await?;

    hcp_writes += writes(&hcp_report);
    yield_taken_names(&session, &mut desired).await;
    let (guest_report, guest_writes) =
        apply_guest(&session, &input, &desired, &selector, guest_olm_crds_ready).await;
    tracing::info!(
        cluster = %input.valid.cluster.key(),
        hcp_created = hcp_report.created.len(), hcp_updated = hcp_report.updated.len(),
        hcp_deleted = hcp_report.deleted.len(), guest_created = guest_report.created.len(),
        guest_updated = guest_report.updated.len(), guest_deleted = guest_report.deleted.len(),
        errors = hcp_report.errors.len() + guest_report.errors.len(),
        "applied"
    );
    let apply_error =
        report_error("management", &hcp_report).or_else(|| report_error("guest", &guest_report));

    let (status_written, all_available, catalog_recheck) = report(
        ctx,
        hc,
        &holm,
        &session,
        &input,
        &desired,
        &selector,
        (&hcp_report, &guest_report),
        apply_error.as_ref(),
        &now_t,
    )
    .await?;
    if let Some(e) = apply_error {
        return Err(e);
    }
    let mut outcome = outcome(
        ctx,
        &input,
        all_available,
        [&hcp_report, &guest_report],
        // a catalog not READY is looked at again when it would cross its grace period
        [rotation_recheck, catalog_recheck]
            .into_iter()
            .flatten()
            .min(),
    );
    outcome.hcp_writes = hcp_writes;
    outcome.guest_writes = guest_writes;
    outcome.status_written = status_written;
    Ok(outcome)
}

/// Reason of a default CatalogSource whose name the guest already uses for one of its own.
pub const NAME_TAKEN: &str = "CatalogSourceNameTaken";

/// Step yield (issue 37 item 5): a guest CatalogSource we would write whose name a guest
/// user (or HyperShift's config operator) already uses for one of theirs is left alone:
/// never applied over, never pruned (pruning selects our labels only), and reported
/// (`CatalogSourceNameTaken`, Degraded, naming it). Only names not already ours are read:
/// a converged pass asks nothing.
async fn yield_taken_names(session: &super::guest::Session, desired: &mut Desired) {
    // Ours: written by hcp-olm (its managed-by label). In a real guest only its own hosted
    // cluster writes there; the cluster labels are not compared, so test set-ups that give
    // several HostedClusters one guest API server keep their earlier behaviour.
    let carries_ours = |l: Option<&BTreeMap<String, String>>| {
        l.and_then(|l| l.get(labels::MANAGED_BY_KEY))
            .is_some_and(|v| v == labels::MANAGED_BY)
    };
    // The watch-fed store holds exactly the CatalogSources with that label.
    let ours: Option<BTreeSet<(Option<String>, String)>> = session
        .reads
        .as_ref()
        .and_then(|r| r.sources.list())
        .map(|kept| kept.into_iter().map(|(k, _)| k).collect());
    let mut taken = Vec::new();
    for o in desired.guest.iter().filter(|o| o.kind == "CatalogSource") {
        let key = (o.namespace.clone(), o.name.clone());
        if ours.as_ref().is_some_and(|s| s.contains(&key)) {
            continue;
        }
        let ar = super::kinds::api_resource(&o.api_version, &o.kind, &o.plural);
        let api: Api<DynamicObject> = match &o.namespace {
            Some(ns) => Api::namespaced_with(session.client.clone(), ns, &ar),
            None => continue,
        };
        match api.get_opt(&o.name).await {
            Ok(Some(live)) if !carries_ours(live.metadata.labels.as_ref()) => taken.push(key),
            Ok(_) => {}
            // Unread: the apply that follows meets the same guest and reports it.
            Err(e) => {
                tracing::debug!(name = %o.name, error = %e, "reading a guest CatalogSource before applying it")
            }
        }
    }
    if taken.is_empty() {
        return;
    }
    desired.guest.retain(|o| {
        !(o.kind == "CatalogSource" && taken.contains(&(o.namespace.clone(), o.name.clone())))
    });
    for (ns, name) in taken {
        let ns = ns.unwrap_or_default();
        desired.pending.push(crate::render::Pending {
            component: format!("catalogsource/{name}"),
            reason: NAME_TAKEN,
            severity: crate::validate::Severity::Degraded,
            message: format!(
                "CatalogSource {ns}/{name} in the guest is not hcp-olm's (created by a guest user or HyperShift's config operator): hcp-olm leaves it as it is and serves no catalog under that name; delete or rename it to get hcp-olm's"
            ),
        });
    }
}

/// Gathers the facts rendering needs besides validation and credentials (the "gather
/// facts" step): packageserver's ClusterIP, the hashes of Secrets we do not write, which
/// management-cluster kinds are served, and the owner (the HostedOLM).
async fn gather(
    ctx: &Context,
    name: &str,
    holm: &HostedOLM,
    mut input: RenderInput,
) -> Result<RenderInput, Error> {
    let hcp_ns = input.valid.cluster.hcp_namespace.clone();
    let stores = ctx.stores();
    input.packageserver_cluster_ip =
        packageserver_cluster_ip(ctx, stores.as_deref(), &hcp_ns, &input.valid).await?;
    input.external_secret_hashes = external_secret_hashes(ctx, &hcp_ns, &input.valid).await?;
    input.owner = Some(Owner {
        api_version: "olm.hcp-olm.io/v1alpha1".into(),
        kind: "HostedOLM".into(),
        name: name.to_string(),
        uid: holm.metadata.uid.clone().unwrap_or_default(),
    });
    input.service_monitors_served = ctx
        .served("monitoring.coreos.com/v1", "servicemonitors")
        .await?;
    input.management_has_scc = ctx
        .served("security.openshift.io/v1", "securitycontextconstraints")
        .await?;
    input.egress_isolation = egress_isolation(ctx, &hcp_ns).await?;
    Ok(input)
}

/// Others' NetworkPolicies in the HCP namespace that isolate egress (see [`crate::netpol`]):
/// from the watch-fed store while the controller loop runs (a change wakes the cluster's
/// pass), else listed; at most [`crate::netpol::MAX_POLICIES`] are read.
async fn egress_isolation(
    ctx: &Context,
    hcp_ns: &str,
) -> Result<Vec<crate::netpol::EgressIsolation>, Error> {
    use k8s_openapi::api::networking::v1::NetworkPolicy;
    if let Some(stores) = ctx.stores()
        && stores.network_policies.synced()
    {
        return Ok(stores
            .network_policies
            .all()
            .iter()
            .filter(|p| p.metadata.namespace.as_deref() == Some(hcp_ns))
            .take(crate::netpol::MAX_POLICIES)
            .filter_map(|p| serde_json::to_value(p.as_ref()).ok())
            .filter_map(|p| crate::netpol::egress_isolation(&p))
            .collect());
    }
    let api: Api<NetworkPolicy> = Api::namespaced(ctx.client.clone(), hcp_ns);
    let list = api
        .list(&ListParams::default().limit(crate::netpol::MAX_POLICIES as u32))
        .await
        .map_err(kube_err(format!("listing NetworkPolicies in {hcp_ns}")))?;
    Ok(list
        .items
        .iter()
        .filter_map(|p| serde_json::to_value(p).ok())
        .filter_map(|p| crate::netpol::egress_isolation(&p))
        .collect())
}

/// The gateway's endpoint, read again after the management apply when it was not known
/// (its Service may have just got its address); a change re-renders (only the guest peer
/// config and the pending notes depend on it).
async fn endpoint_after_apply(
    ctx: &Context,
    input: &mut RenderInput,
    desired: &mut Desired,
) -> Result<(), Error> {
    if input.tunnel.gateway_endpoint.is_some() {
        return Ok(());
    }
    let hcp_ns = input.valid.cluster.hcp_namespace.clone();
    let again = read_gateway_endpoint(ctx, &hcp_ns, &input.valid).await?;
    if again.as_ref().ok() != input.tunnel.gateway_endpoint.as_ref()
        || again.as_ref().err() != input.tunnel.gateway_endpoint_wait.as_ref()
    {
        set_endpoint(&mut input.tunnel, again);
        *desired = render::desired(input)?;
    }
    Ok(())
}

/// The pass's outcome once everything applied (writes are filled in by the caller): what
/// it still waits for, what changed, and when to look again.
fn outcome(
    ctx: &Context,
    input: &RenderInput,
    all_available: bool,
    reports: [&Report; 2],
    rotation_recheck: Option<Duration>,
) -> Outcome {
    let no_cluster_ip = input.packageserver_cluster_ip.is_none();
    let waiting = if no_cluster_ip {
        Some("WaitingForPackageserverClusterIP")
    } else if !input.guest_olm_crds_ready {
        Some("WaitingForGuestOLMCRDs")
    } else {
        input
            .tunnel
            .gateway_endpoint_wait
            .as_ref()
            .map(|w| w.reason)
    };
    let requeue = if no_cluster_ip {
        SOON
    } else if waiting.is_some() || !all_available {
        // Pods coming up (or a guest agent away): look again soon, so status follows.
        // Management Deployments also trigger through their watch; the guest's do not.
        ctx.schedule.waiting
    } else {
        // Registry answers expire after catalog_refresh; look again by then so a
        // moved tag rolls the catalog.
        ctx.schedule.resync.min(ctx.schedule.catalog_refresh)
    };
    let mut o = Outcome::new(
        waiting.map_or(State::Applied, |w| State::Waiting(w.into())),
        requeue.min(rotation_recheck.unwrap_or(Duration::MAX)),
    );
    o.changed = reports
        .iter()
        .flat_map(|r| {
            r.created
                .iter()
                .chain(&r.updated)
                .chain(&r.deleted)
                .cloned()
        })
        .collect();
    o
}

/// The HostedCluster's pull secret (`.dockerconfigjson` of the `pull-secret` Secret
/// HyperShift keeps in the HCP namespace). Absent: None. Unparseable: logged naming the
/// Secret, and lookups go without credentials (never with another cluster's).
async fn read_pull_secret(
    ctx: &Context,
    hcp_ns: &str,
) -> Result<Option<hcp_olm_oci::PullSecret>, Error> {
    let name = &ctx.config.defaults.pull_secret;
    let Some(s) = ctx
        .read_secret(hcp_ns, name)
        .await
        .map_err(kube_err(format!("reading Secret {hcp_ns}/{name}")))?
    else {
        return Ok(None);
    };
    let Some(data) = s.data.as_ref().and_then(|d| d.get(".dockerconfigjson")) else {
        tracing::warn!(secret = %format!("{hcp_ns}/{name}"), "pull secret has no .dockerconfigjson; registry lookups go without credentials");
        return Ok(Some(hcp_olm_oci::PullSecret::default()));
    };
    match hcp_olm_oci::PullSecret::parse(&data.0) {
        Ok(p) => Ok(Some(p)),
        Err(e) => {
            tracing::warn!(secret = %format!("{hcp_ns}/{name}"), error = %e, "pull secret .dockerconfigjson is unusable; registry lookups go without credentials");
            Ok(Some(hcp_olm_oci::PullSecret::default()))
        }
    }
}

/// A short hash of a Secret's data (keys and values).
fn secret_hash(s: &Secret) -> String {
    let mut h = Sha256::new();
    for (k, v) in s.data.iter().flatten() {
        h.update(k.as_bytes());
        h.update(b"=");
        h.update(&v.0);
        h.update(b"\n");
    }
    h.finalize()[..16]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

async fn read_guest_catalog_sources(
    guest: &kube::Client,
    selector: &BTreeMap<String, String>,
) -> BTreeMap<String, Value> {
    let ar = api_resource(
        "operators.coreos.com/v1alpha1",
        "CatalogSource",
        "catalogsources",
    );
    let sel = selector
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(",");
    // One page, read as the watches read theirs (bounded in items and bytes): we render a
    // handful of CatalogSources.
    let page = hcp_olm_apply::watch::list_page::<DynamicObject>(
        guest,
        &ar,
        &hcp_olm_apply::watch::Selector {
            namespace: Some(names::MARKETPLACE_NAMESPACE.to_string()),
            labels: sel,
            fields: String::new(),
        },
        false,
        super::guest_reads::LIMITS.watch,
        None,
    )
    .await;
    match page {
        Ok((_, items)) => items
            .into_iter()
            .filter_map(|o| {
                let name = o.metadata.name.clone()?;
                Some((name, serde_json::to_value(o).ok()?))
            })
            .collect(),
        Err(e) => {
            tracing::debug!(error = %e, "cannot list guest CatalogSources");
            BTreeMap::new()
        }
    }
}

/// Our CatalogSources carrying every `selector` label, from the session's store.
fn sources_from(
    kept: Vec<(hcp_olm_apply::projected::Key, Value)>,
    selector: &BTreeMap<String, String>,
) -> BTreeMap<String, Value> {
    kept.into_iter()
        .filter(|(_, v)| {
            selector
                .iter()
                .all(|(k, want)| v["metadata"]["labels"][k].as_str() == Some(want.as_str()))
        })
        .map(|((_, name), v)| (name, v))
        .collect()
}

/// Installed operators from the session's CSV store (at most [`MAX_TRACKED_OPERATORS`]).
fn operators_from(kept: Vec<(hcp_olm_apply::projected::Key, Value)>) -> Vec<InstalledOperator> {
    kept.into_iter()
        .filter_map(|((ns, csv), v)| {
            Some(InstalledOperator {
                namespace: ns.unwrap_or_default(),
                csv,
                max_openshift_version: Some(v["max"].as_str()?.to_string()),
            })
        })
        .take(MAX_TRACKED_OPERATORS)
        .collect()
}

/// Installed CSVs and their `olm.maxOpenShiftVersion` property.
/// CSVs read per page, and the most installed operators tracked for `Upgradeable` (a guest
/// user can create any number of CSVs; only metadata is read, a page at a time, and at most
/// this many entries of ~100 bytes are kept: CSVs past them are not examined).
const MAX_TRACKED_OPERATORS: usize = 50_000;
/// Pages of CSVs read at most ([`super::guest_reads::LIMITS`]' page of 100 each).
const MAX_CSV_PAGES: usize = MAX_TRACKED_OPERATORS / 100 + 1;

/// Installed operators that declare `olm.maxOpenShiftVersion` (the others cannot block an
/// upgrade), from the guest's CSV metadata, paged; at most [`MAX_TRACKED_OPERATORS`].
async fn read_installed_operators(guest: &kube::Client) -> Vec<InstalledOperator> {
    let ar = api_resource(
        "operators.coreos.com/v1alpha1",
        "ClusterServiceVersion",
        "clusterserviceversions",
    );
    let options = super::guest_reads::LIMITS.watch;
    let mut out = Vec::new();
    let mut token: Option<String> = None;
    // Pages read as the watches read theirs (bounded in items and bytes), and at most
    // enough of them for MAX_TRACKED_OPERATORS (a server can send empty pages with a
    // continue token for ever).
    for _ in 0..MAX_CSV_PAGES {
        let page = hcp_olm_apply::watch::list_page::<kube::core::PartialObjectMeta<DynamicObject>>(
            guest,
            &ar,
            &hcp_olm_apply::watch::Selector::default(),
            true,
            options,
            token.as_deref(),
        )
        .await;
        let Ok((metadata, items)) = page else {
            return out;
        };
        for o in items {
            // Copied CSVs (olm.copiedFrom) are not separate installs.
            if o.metadata
                .labels
                .as_ref()
                .is_some_and(|l| l.contains_key("olm.copiedFrom"))
            {
                continue;
            }
            let max = o
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(super::guest_reads::PROPERTIES_ANNOTATION))
                .and_then(|p| super::guest_reads::max_openshift_version(p));
            if max.is_none() {
                continue;
            }
            if out.len() == MAX_TRACKED_OPERATORS {
                return out;
            }
            out.push(InstalledOperator {
                namespace: o.metadata.namespace.clone().unwrap_or_default(),
                csv: o.metadata.name.clone().unwrap_or_default(),
                max_openshift_version: max,
            });
        }
        match metadata.continue_.filter(|c| !c.is_empty()) {
            Some(c) => token = Some(c),
            None => return out,
        }
    }
    out
}

/// Subscriptions examined per pass for `subscriptionDefaults` (guest users can create any
/// number), and defaults written per pass (the rest follow on later passes).
const MAX_SUBSCRIPTIONS_EXAMINED: usize = 10_000;
const SUBSCRIPTION_PAGE: u32 = 25;
const MAX_SUBSCRIPTION_PATCHES: usize = 200;

/// The merge patch giving one guest Subscription the HostedOLM's `subscriptionDefaults`:
/// only the fields it does not set itself (`spec.config.nodeSelector`,
/// `spec.config.tolerations`), so a user's own choice always wins and a second pass finds
/// nothing to do. None when nothing is missing. Pure.
pub fn subscription_defaults_patch(
    subscription: &Value,
    defaults: &crate::hostedolm::SubscriptionDefaults,
) -> Option<Value> {
    let config = &subscription["spec"]["config"];
    let unset = |field: &str| match &config[field] {
        Value::Null => true,
        Value::Object(m) => m.is_empty(),
        Value::Array(a) => a.is_empty(),
        _ => false,
    };
    let mut patch = serde_json::Map::new();
    if !defaults.node_selector.is_empty() && unset("nodeSelector") {
        patch.insert("nodeSelector".into(), json!(defaults.node_selector));
    }
    if !defaults.tolerations.is_empty() && unset("tolerations") {
        patch.insert("tolerations".into(), json!(defaults.tolerations));
    }
    (!patch.is_empty()).then(|| json!({"spec": {"config": patch}}))
}

/// Give guest Subscriptions that set no placement of their own the HostedOLM's
/// `subscriptionDefaults` (OLM copies `spec.config` to the operator's Deployment, so the
/// operator lands on the chosen nodes). Returns the number of Subscriptions written.
async fn apply_subscription_defaults(
    guest: &kube::Client,
    defaults: &crate::hostedolm::SubscriptionDefaults,
) -> Result<usize, Error> {
    if defaults.node_selector.is_empty() && defaults.tolerations.is_empty() {
        return Ok(0);
    }
    let ar = api_resource(
        "operators.coreos.com/v1alpha1",
        "Subscription",
        "subscriptions",
    );
    // Whole objects are needed (spec.config), and a guest user decides their size (up to
    // the API server's 1.5 MiB each): small pages bound what one answer can hold. Read as
    // the watches read theirs (bounded in items and bytes), and at most enough pages for
    // MAX_SUBSCRIPTIONS_EXAMINED (a server can send empty pages with a continue token).
    let options = hcp_olm_apply::watch::Options {
        page: SUBSCRIPTION_PAGE,
        ..super::guest_reads::LIMITS.watch
    };
    let (mut examined, mut written, mut refused) = (0usize, 0usize, 0usize);
    let mut token: Option<String> = None;
    for _ in 0..MAX_SUBSCRIPTIONS_EXAMINED / SUBSCRIPTION_PAGE as usize + 1 {
        let (metadata, items) = hcp_olm_apply::watch::list_page::<DynamicObject>(
            guest,
            &ar,
            &hcp_olm_apply::watch::Selector::default(),
            false,
            options,
            token.as_deref(),
        )
        .await
        .map_err(|e| {
            kube_err("listing guest Subscriptions".to_string())(kube::Error::Service(Box::new(e)))
        })?;
        let page_continue = metadata.continue_;
        for s in items {
            examined += 1;
            let Some(patch) = subscription_defaults_patch(&s.data, defaults) else {
                continue;
            };
            let (Some(ns), Some(name)) =
                (s.metadata.namespace.as_deref(), s.metadata.name.as_deref())
            else {
                continue;
            };
            // One Subscription a guest webhook refuses must not hold back the others.
            match Api::<DynamicObject>::namespaced_with(guest.clone(), ns, &ar)
                .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
            {
                Ok(_) => written += 1,
                Err(e) => {
                    refused += 1;
                    if refused == 1 {
                        tracing::warn!(subscription = %format!("{ns}/{name}"), error = %e, "cannot give a guest Subscription the defaults");
                    }
                }
            }
            if written == MAX_SUBSCRIPTION_PATCHES {
                return Ok(written);
            }
        }
        match page_continue.filter(|c| !c.is_empty()) {
            Some(c) if examined < MAX_SUBSCRIPTIONS_EXAMINED => token = Some(c),
            _ => break,
        }
    }
    if refused > 0 {
        tracing::warn!(refused, "guest Subscriptions refused the defaults");
    }
    Ok(written)
}

/// Reason while HyperShift's own OLM runs in the HCP namespace.
pub const HYPERSHIFT_OLM_ACTIVE: &str = "HyperShiftOLMActive";
/// Reason while, taking over, HyperShift's OLM operators are not at 0 replicas yet.
pub const WAITING_FOR_HYPERSHIFT_OLM: &str = "WaitingForHyperShiftOLMToStop";
/// Reason when the debug-deployments annotations cannot be edited safely.
pub const TAKE_OVER_BLOCKED: &str = "HyperShiftOLMTakeOverBlocked";

/// Makes the HostedCluster's `debug-deployments` annotation say what `take_over` wants
/// ([`takeover::edit`]), with a Normal Event on the HostedCluster when it changes. Decided on
/// the cached object (a converged pass reads nothing); a change re-reads the HostedCluster
/// and patches with its resourceVersion, so an edit made meanwhile is never overwritten
/// (a conflict fails the pass, which is retried). Returns the writes made, or why the
/// annotations cannot be edited.
async fn sync_debug_deployments(
    ctx: &Context,
    hc: &HostedCluster,
    take_over: bool,
) -> Result<Result<(usize, Option<String>), takeover::TakeOverError>, Error> {
    fn plan(
        hc: &HostedCluster,
        take_over: bool,
    ) -> Result<Option<takeover::Edit>, takeover::TakeOverError> {
        let get = |k: &str| hc.metadata.annotations.as_ref().and_then(|a| a.get(k));
        takeover::edit(
            get(takeover::DEBUG_DEPLOYMENTS).map(String::as_str),
            get(takeover::RECORD).map(String::as_str),
            take_over,
        )
    }
    let now = |hc: &HostedCluster| {
        hc.metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(takeover::DEBUG_DEPLOYMENTS))
            .cloned()
    };
    match plan(hc, take_over) {
        Ok(None) => return Ok(Ok((0, now(hc)))),
        Err(e) => return Ok(Err(e)),
        Ok(Some(_)) => {}
    }
    let (ns, name, _) = identity(hc)?;
    let api: Api<HostedCluster> = Api::namespaced(ctx.client.clone(), &ns);
    let fresh = api
        .get(&name)
        .await
        .map_err(kube_err(format!("reading HostedCluster {ns}/{name}")))?;
    let edit = match plan(&fresh, take_over) {
        Ok(Some(e)) => e,
        Ok(None) => return Ok(Ok((0, now(&fresh)))),
        Err(e) => return Ok(Err(e)),
    };
    let patch = json!({"metadata": {
        "resourceVersion": fresh.metadata.resource_version,
        "annotations": {
            takeover::DEBUG_DEPLOYMENTS: edit.debug_deployments,
            takeover::RECORD: edit.record,
        },
    }});
    api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .map_err(kube_err(format!(
            "updating annotation {} of HostedCluster {ns}/{name}",
            takeover::DEBUG_DEPLOYMENTS
        )))?;
    let (reason, note) = if take_over {
        (
            "HyperShiftOLMTakenOver",
            format!(
                "{} now lists {}: HyperShift keeps its catalog-operator, olm-operator and packageserver at 0 and hcp-olm runs them",
                takeover::DEBUG_DEPLOYMENTS,
                takeover::TAKEN_OVER.join(",")
            ),
        )
    } else {
        (
            "HyperShiftOLMHandedBack",
            format!(
                "{} restored to {}: HyperShift's OLM runs again",
                takeover::DEBUG_DEPLOYMENTS,
                edit.debug_deployments
                    .as_deref()
                    .map(|v| format!("{v:?}"))
                    .unwrap_or_else(|| "absent".into())
            ),
        )
    };
    tracing::info!(cluster = %format!("{ns}/{name}"), reason, "{note}");
    if let Some(events) = &ctx.events {
        events.normal_hosted_cluster(hc, reason, &note).await;
    }
    Ok(Ok((1, edit.debug_deployments)))
}

/// HyperShift's OLM Deployments in an HCP namespace (control-plane-operator's component
/// names; the catalogs only in management placement).
pub const HYPERSHIFT_OLM_DEPLOYMENTS: &[&str] = &[
    "catalog-operator",
    "olm-operator",
    "packageserver",
    "redhat-operators-catalog",
    "certified-operators-catalog",
    "community-operators-catalog",
];

/// Whether a live Deployment is one of HyperShift's that runs pods or is about to: not ours
/// (no hcp-olm managed-by label), and either not scaled to zero or not listed in the
/// HostedCluster's `debug-deployments` (`debug_listed`), which is what keeps it at 0 — one
/// that is at 0 but not listed is about to be scaled up again by HyperShift. Pure.
pub fn hypershift_deployment_runs(d: &Deployment, debug_listed: &[&str]) -> bool {
    let ours = d
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(labels::MANAGED_BY_KEY))
        .is_some_and(|v| v == labels::MANAGED_BY);
    let listed = d
        .metadata
        .name
        .as_deref()
        .is_some_and(|n| debug_listed.contains(&n));
    !ours && (d.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1) > 0 || !listed)
}

/// The names of HyperShift's OLM Deployments running in `hcp_ns`.
async fn hypershift_olm_active(
    client: &kube::Client,
    stores: Option<&super::stores::ManagementStores>,
    hcp_ns: &str,
    debug_deployments: Option<&str>,
) -> Result<Vec<String>, Error> {
    let listed: Vec<&str> = debug_deployments
        .unwrap_or("")
        .split(',')
        .map(str::trim)
        .collect();
    let api: Api<Deployment> = Api::namespaced(client.clone(), hcp_ns);
    let mut out = Vec::new();
    for name in HYPERSHIFT_OLM_DEPLOYMENTS {
        // The store answers "not running" (the steady state while ours run); "running",
        // which stops ours, is confirmed by the API server.
        let cached = stores
            .and_then(|s| s.hypershift_deployment(hcp_ns, name))
            .map(|d| d.map(|d| d.as_ref().clone()))
            .filter(|d| {
                !d.as_ref()
                    .is_some_and(|d| hypershift_deployment_runs(d, &listed))
            });
        let live = match cached {
            Some(live) => live,
            None => api
                .get_opt(name)
                .await
                .map_err(kube_err(format!("reading Deployment {hcp_ns}/{name}")))?,
        };
        if live
            .as_ref()
            .is_some_and(|d| hypershift_deployment_runs(d, &listed))
        {
            out.push((*name).to_string());
        }
    }
    Ok(out)
}

/// Scale our catalog-operator, olm-operator and packageserver to 0 where they run (a merge patch of
/// `spec.replicas`; the next apply once HyperShift's OLM is gone restores them). Returns the
/// number of Deployments written.
async fn stop_our_olm_operators(client: &kube::Client, hcp_ns: &str) -> Result<usize, Error> {
    let api: Api<Deployment> = Api::namespaced(client.clone(), hcp_ns);
    let mut written = 0;
    for name in [
        names::CATALOG_OPERATOR,
        names::OLM_OPERATOR,
        names::PACKAGESERVER,
    ] {
        let live = api
            .get_opt(name)
            .await
            .map_err(kube_err(format!("reading Deployment {hcp_ns}/{name}")))?;
        if live
            .and_then(|d| d.spec)
            .and_then(|s| s.replicas)
            .is_some_and(|r| r > 0)
        {
            api.patch(
                name,
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"replicas": 0}})),
            )
            .await
            .map_err(kube_err(format!("scaling Deployment {hcp_ns}/{name} to 0")))?;
            written += 1;
        }
    }
    Ok(written)
}

/// What status says while HyperShift's OLM runs, with the remedy. Pure.
pub fn hypershift_olm_message(hcp_ns: &str, holm: &str, running: &[String]) -> String {
    format!(
        "HyperShift's own OLM runs in {hcp_ns} (Deployments {}): two OLMs would fight over the guest's Subscriptions, CatalogSources and packageserver APIService, so hcp-olm applies nothing to this hosted cluster and keeps its own catalog-operator, olm-operator and packageserver at 0 replicas. To keep HyperShift's OLM, nothing needs doing. To use hcp-olm's instead, set spec.hyperShiftOLM: TakeOver on HostedOLM {hcp_ns}/{holm}: hcp-olm then lists {} in the HostedCluster annotation hypershift.openshift.io/debug-deployments (HyperShift keeps them at 0) and hands back when the field goes (docs/controller.md)",
        running.join(", "),
        takeover::TAKEN_OVER.join(",")
    )
}

/// Delete `openshift-marketplace/redhat-marketplace` in the guest when it exists (a read
/// when it does not). True when it was deleted.
/// `known`: whether it exists, when the session's store knows.
async fn delete_deprecated_marketplace(
    guest: &kube::Client,
    known: Option<bool>,
) -> Result<bool, Error> {
    let api: Api<DynamicObject> = Api::namespaced_with(
        guest.clone(),
        names::MARKETPLACE_NAMESPACE,
        &api_resource(
            "operators.coreos.com/v1alpha1",
            "CatalogSource",
            "catalogsources",
        ),
    );
    let what = || {
        format!(
            "CatalogSource {}/{DEPRECATED_MARKETPLACE} in the guest",
            names::MARKETPLACE_NAMESPACE
        )
    };
    let exists = match known {
        Some(e) => Ok(e.then_some(())),
        None => api
            .get_metadata_opt(DEPRECATED_MARKETPLACE)
            .await
            .map(|o| o.map(|_| ())),
    };
    match exists {
        Ok(Some(())) => {}
        Ok(None) => return Ok(false),
        Err(kube::Error::Api(s)) if s.code == 404 => return Ok(false),
        Err(e) => return Err(kube_err(what())(e)),
    }
    match api
        .delete(DEPRECATED_MARKETPLACE, &Default::default())
        .await
    {
        Ok(_) => {
            tracing::info!(
                "deleted the deprecated {DEPRECATED_MARKETPLACE} CatalogSource in the guest"
            );
            Ok(true)
        }
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(false),
        Err(e) => Err(kube_err(what())(e)),
    }
}

/// The guest's `OperatorHub/cluster` spec, if the kind is served and the object exists.
async fn live_operator_hub(
    guest: &kube::Client,
) -> Result<Option<crate::operatorhub::OperatorHubSpec>, Error> {
    let api: Api<DynamicObject> = Api::all_with(
        guest.clone(),
        &api_resource("config.openshift.io/v1", "OperatorHub", "operatorhubs"),
    );
    let live = match api.get_opt("cluster").await {
        Ok(o) => o,
        // the kind is not served in this guest
        Err(kube::Error::Api(s)) if s.code == 404 => None,
        Err(e) => {
            return Err(kube_err(
                "reading the guest's OperatorHub/cluster".to_string(),
            )(e));
        }
    };
    Ok(live.map(|o| {
        // A malformed spec (the guest's admin owns it) reads as "nothing disabled".
        serde_json::from_value(o.data["spec"].clone()).unwrap_or_default()
    }))
}

#[allow(clippy::too_many_arguments)]
fn build_status(
    input: &RenderInput,
    desired: &Desired,
    guest_sources: &BTreeMap<String, Value>,
    installed: &[InstalledOperator],
    components: Vec<ComponentStatus>,
    apply_error: Option<&Error>,
    generation: Option<i64>,
    now: &Time,
    previous: &[crate::hostedolm::CatalogStatus],
) -> (HostedOLMStatus, Option<Duration>) {
    let mut conditions = status::conditions_from_pending(&desired.pending, generation, now);
    let mut catalogs = status::catalog_statuses(input, desired, guest_sources);
    status::track_not_ready(&mut catalogs, guest_sources, previous, now);
    let (late, catalog_recheck) =
        status::catalogs_not_ready(&catalogs, now, status::CATALOG_READY_GRACE);
    if let Some(e) = apply_error
        && let Some(d) = conditions.iter_mut().find(|c| c.type_ == DEGRADED)
    {
        d.status = "True".into();
        d.reason = "ApplyFailed".into();
        d.message = e.to_string();
    }
    // A catalog kept on its last good image while its registry fails is still served:
    // Degraded says so, Available does not move (issue 38 item 3).
    let degraded = apply_error.is_some()
        || desired.pending.iter().any(|p| {
            p.severity == crate::validate::Severity::Degraded
                && p.reason != crate::last_good::HELD_REASON
        });
    // Each with what its pods say when they say more than "not ready" (ImagePullBackOff, ...).
    let not_ready: Vec<String> = components
        .iter()
        .filter(|c| !c.available)
        .map(|c| match c.reason.as_str() {
            "" | "PodsNotReady" => c.name.clone(),
            r => format!("{} ({r})", c.name),
        })
        .collect();
    let (ok, reason, message) = if degraded {
        (false, "Degraded", "see the Degraded condition".to_string())
    } else if !not_ready.is_empty() {
        (
            false,
            "ComponentsNotReady",
            format!("not ready: {}", not_ready.join(", ")),
        )
    } else if !late.is_empty() {
        // Issue 39 item 5: OLM is up but cannot read these catalogs; Subscriptions from them
        // do not resolve.
        (
            false,
            "CatalogsNotReady",
            format!(
                "catalogs not READY for {}s or more: {}",
                status::CATALOG_READY_GRACE.as_secs(),
                late.join("; ")
            ),
        )
    } else {
        (true, "AsExpected", String::new())
    };
    conditions.insert(
        0,
        Condition {
            type_: AVAILABLE.into(),
            status: if ok { "True" } else { "False" }.into(),
            reason: reason.into(),
            message,
            observed_generation: generation,
            last_transition_time: now.clone(),
        },
    );
    conditions.push(status::upgradeable(
        &input.valid.release_version,
        installed,
        generation,
        now,
    ));
    debug_assert!(conditions.iter().any(|c| c.type_ == UPGRADEABLE));
    let st = HostedOLMStatus {
        observed_generation: generation,
        conditions,
        placement: Some(input.valid.placement.as_str().to_string()),
        release_version: Some(input.valid.release_version.to_string()),
        components,
        catalogs,
        tunnel: Some(tunnel_status(input)),
    };
    (st, catalog_recheck)
}

/// `status.tunnel`: the gateway endpoint the guest agent was given, or why there is
/// none yet.
fn tunnel_status(input: &RenderInput) -> crate::hostedolm::TunnelStatus {
    let service_type = tunnel_service_type(&input.valid).to_string();
    let t = &input.tunnel;
    let key_rotation = (t.rotation_token.is_some() || !matches!(t.rotation_phase, "Idle" | ""))
        .then(|| crate::hostedolm::KeyRotationStatus {
            token: t.rotation_token.clone(),
            phase: t.rotation_phase.to_string(),
        });
    let mut st = match (
        &input.tunnel.gateway_endpoint,
        &input.tunnel.gateway_endpoint_wait,
    ) {
        (Some(e), _) => crate::hostedolm::TunnelStatus {
            service_type,
            endpoint: Some(e.clone()),
            reason: "EndpointKnown".into(),
            message: format!(
                "the guest agent's peer config names the gateway endpoint {e}; whether the WireGuard handshake succeeds is not observed here (the tunnel components report it)"
            ),
            key_rotation: None,
        },
        (None, Some(w)) => crate::hostedolm::TunnelStatus {
            service_type,
            endpoint: None,
            reason: w.reason.into(),
            message: w.message.clone(),
            key_rotation: None,
        },
        (None, None) => crate::hostedolm::TunnelStatus {
            service_type,
            endpoint: None,
            reason: "WaitingForTunnelEndpoint".into(),
            message: String::new(),
            key_rotation: None,
        },
    };
    st.key_rotation = key_rotation;
    st
}

fn tunnel_service_type(v: &validate::ValidInput) -> &'static str {
    match v.tunnel_service_type {
        crate::hostedolm::TunnelServiceType::NodePort => "NodePort",
        crate::hostedolm::TunnelServiceType::LoadBalancer => "LoadBalancer",
    }
}

/// The gateway endpoint from the live WireGuard Service (see
/// [`render::tunnel::gateway_endpoint`]).
async fn read_gateway_endpoint(
    ctx: &Context,
    hcp_ns: &str,
    valid: &validate::ValidInput,
) -> Result<Result<String, render::tunnel::EndpointWait>, Error> {
    let cached =
        ctx.stores().and_then(
            |s| match s.services.ours(hcp_ns, names::TUNNEL_GATEWAY_WG) {
                Lookup::Found(svc) => Some(svc.as_ref().clone()),
                Lookup::Ask => None,
            },
        );
    // From the store when it holds the Service (its watch wakes the pass after the store
    // has a change: a node port, a load-balancer ingress); one we have just created and
    // the store has not seen yet is read from the API server.
    if let Some(svc) = cached {
        return Ok(render::tunnel::gateway_endpoint(
            Some(&svc),
            tunnel_service_type(valid),
            valid.tunnel_address.as_deref(),
            valid.node_port_address.as_deref(),
            validate::guest_ipv6_only(valid),
        ));
    }
    let svc = Api::<Service>::namespaced(ctx.client.clone(), hcp_ns)
        .get_opt(names::TUNNEL_GATEWAY_WG)
        .await
        .map_err(kube_err(format!(
            "reading Service {hcp_ns}/{}",
            names::TUNNEL_GATEWAY_WG
        )))?;
    Ok(render::tunnel::gateway_endpoint(
        svc.as_ref(),
        tunnel_service_type(valid),
        valid.tunnel_address.as_deref(),
        valid.node_port_address.as_deref(),
        validate::guest_ipv6_only(valid),
    ))
}

fn set_endpoint(
    keys: &mut render::tunnel::TunnelKeys,
    e: Result<String, render::tunnel::EndpointWait>,
) {
    match e {
        Ok(e) => {
            keys.gateway_endpoint = Some(e);
            keys.gateway_endpoint_wait = None;
        }
        Err(w) => {
            keys.gateway_endpoint = None;
            keys.gateway_endpoint_wait = Some(w);
        }
    }
}

/// Finalizer work: delete everything of ours in the guest (when reachable) and in the
/// HCP namespace, the HostedOLM, then release the HostedCluster.
pub async fn cleanup(ctx: &Context, hc: &HostedCluster) -> Result<Outcome, Error> {
    cleanup_with(ctx, hc, hc.metadata.deletion_timestamp.is_some()).await
}

/// [`cleanup`]; `give_up_on_silent_guest`: a guest API server that does not answer leaves the
/// guest objects and the cleanup goes on (a HostedCluster being deleted: HyperShift tears
/// that server down; `uninstall --force-unreachable-guests`). Otherwise (a cluster leaving
/// the scope) it is an error and the next pass tries again, so nothing is left in a guest
/// that was only briefly unreachable.
pub async fn cleanup_with(
    ctx: &Context,
    hc: &HostedCluster,
    give_up_on_silent_guest: bool,
) -> Result<Outcome, Error> {
    let (ns, name, hcp_ns) = identity(hc)?;
    ctx.warnings_changed(&format!("{ns}/{name}"), &[]);
    let mut out = Outcome::new(State::CleanedUp, ctx.schedule.resync);
    if !hc
        .metadata
        .finalizers
        .as_ref()
        .is_some_and(|f| f.iter().any(|f| f == FINALIZER))
    {
        return Ok(out);
    }
    // Our own namespaces: nothing of a hosted cluster's was ever written there, so nothing
    // is pruned or forgotten there; only our finalizer (an older controller may have set
    // it) is released (issue 35, item 9).
    if crate::sharing::reserved(&hcp_ns) {
        out.hcp_writes += usize::from(ensure_finalizer(ctx, hc, false).await?);
        tracing::info!(cluster = %format!("{ns}/{name}"), namespace = %hcp_ns, "released; its HCP namespace is one of ours, nothing pruned there");
        return Ok(out);
    }
    let selector = selector_for(&ns, &name);
    match guest_client(ctx, hc, false).await? {
        Ok(session) => {
            let r = Applier::new(session.client.clone(), FIELD_MANAGER)
                .prune(&guest_kinds(), None, &selector, &[])
                .await;
            out.guest_writes = writes(&r);
            if give_up_on_silent_guest && no_answer(&r) {
                // Its API server is gone or does not answer (HyperShift tears the guest's
                // API server down while the HostedCluster is deleted): waiting for it would
                // hold the HostedCluster's deletion for ever.
                tracing::warn!(
                    cluster = %format!("{ns}/{name}"),
                    error = %r.errors[0],
                    "guest API server does not answer during cleanup; leaving guest objects"
                );
                out.guest_left = Some("GuestUnreachable");
            } else if let Some(e) = report_error("guest", &r) {
                return Err(e);
            }
        }
        Err(access) => {
            tracing::warn!(
                cluster = %format!("{ns}/{name}"),
                reason = access.reason(),
                "guest unreachable during cleanup; leaving guest objects"
            );
            out.guest_left = Some(access.reason());
        }
    }
    let ownership = hcp_namespace_ownership(&ctx.client, &ns, &name, &hcp_ns).await?;
    // Shared state changes only for a namespace this HostedCluster owns, and only what it
    // recorded itself (issue 35, item 3: a colliding HostedCluster, `team/a-b` for
    // `team-a/b`'s `team-a-b`, deleted and patched again and again, cut its victim off the
    // shared catalogs when this ran before the ownership check).
    if ownership == Ownership::Owned {
        ctx.shared_digests.forget(&hcp_ns, &format!("{ns}/{name}"));
    }
    let owned = matches!(
        ownership,
        Ownership::Owned | Ownership::WaitingForHostedControlPlane
    );
    if owned {
        // Listed from the API server, not the cache: an object made moments ago that the
        // watch has not delivered yet must not outlive the finalizer.
        let r = Applier::new(ctx.client.clone(), FIELD_MANAGER)
            .prune(&hcp_kinds(), Some(&hcp_ns), &selector, &[])
            .await;
        out.hcp_writes = writes(&r);
        if let Some(e) = report_error("management", &r) {
            return Err(e);
        }
        let holms: Api<HostedOLM> = Api::namespaced(ctx.client.clone(), &hcp_ns);
        match holms.delete(&name, &Default::default()).await {
            Ok(_) => out.hcp_writes += 1,
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(e) => return Err(kube_err(format!("deleting HostedOLM {hcp_ns}/{name}"))(e)),
        }
    }
    // Hand back to HyperShift's OLM (uninstall; harmless while the HostedCluster goes).
    let handed_back = match sync_debug_deployments(ctx, hc, false).await? {
        Ok((n, _)) => n,
        Err(e) => {
            tracing::warn!(cluster = %format!("{ns}/{name}"), error = %e, "cannot hand back to HyperShift's OLM; annotation left");
            0
        }
    };
    out.hcp_writes += handed_back;
    // the patch above changed the resourceVersion the finalizer patch would check
    let hc = if handed_back > 0 {
        Api::<HostedCluster>::namespaced(ctx.client.clone(), &ns)
            .get(&name)
            .await
            .map_err(kube_err(format!("reading HostedCluster {ns}/{name}")))?
    } else {
        hc.clone()
    };
    out.hcp_writes += usize::from(ensure_finalizer(ctx, &hc, false).await?);
    tracing::info!(cluster = %format!("{ns}/{name}"), hcp = out.hcp_writes, guest = out.guest_writes, "cleaned up");
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subscription_defaults_fill_only_what_the_user_left_unset() {
        use crate::hostedolm::SubscriptionDefaults;
        let d: SubscriptionDefaults = serde_json::from_value(json!({
            "nodeSelector": {"node-pool": "operators"},
            "tolerations": [{"key": "operators", "operator": "Exists", "effect": "NoSchedule"}],
        }))
        .unwrap();
        let bare = json!({"spec": {"name": "etcd", "source": "x"}});
        let p = subscription_defaults_patch(&bare, &d).unwrap();
        assert_eq!(
            p["spec"]["config"]["nodeSelector"]["node-pool"],
            "operators"
        );
        assert_eq!(p["spec"]["config"]["tolerations"][0]["key"], "operators");
        // the user's own nodeSelector wins; only tolerations are added
        let own = json!({"spec": {"config": {"nodeSelector": {"zone": "a"}}}});
        let p = subscription_defaults_patch(&own, &d).unwrap();
        assert!(p["spec"]["config"].get("nodeSelector").is_none());
        assert!(p["spec"]["config"]["tolerations"].is_array());
        // after the patch nothing is missing: a second pass writes nothing
        let done = json!({"spec": {"config": {"nodeSelector": {"zone": "a"}, "tolerations": [{"key": "k"}]}}});
        assert_eq!(subscription_defaults_patch(&done, &d), None);
        // empty values count as unset; no defaults, no patch
        let empty = json!({"spec": {"config": {"nodeSelector": {}, "tolerations": []}}});
        assert!(subscription_defaults_patch(&empty, &d).is_some());
        assert_eq!(
            subscription_defaults_patch(&bare, &SubscriptionDefaults::default()),
            None
        );
    }

    #[test]
    fn hypershifts_running_olm_deployments_are_told_apart_from_ours_and_scaled_down_ones() {
        let d = |labels: Value, replicas: Value| -> Deployment {
            serde_json::from_value(json!({
                "metadata": {"name": "catalog-operator", "labels": labels},
                "spec": {"replicas": replicas, "selector": {}, "template": {}},
            }))
            .unwrap()
        };
        let listed = ["konnectivity-agent", "catalog-operator"];
        assert!(hypershift_deployment_runs(
            &d(
                json!({"hypershift.openshift.io/managed-by": "control-plane-operator"}),
                json!(2)
            ),
            &listed
        ));
        // replicas unset means 1
        assert!(hypershift_deployment_runs(&d(json!({}), Value::Null), &[]));
        // scaled to 0 by HyperShift's debug-deployments annotation
        assert!(!hypershift_deployment_runs(
            &d(json!({}), json!(0)),
            &listed
        ));
        // at 0 but no longer listed: HyperShift is about to scale it up
        assert!(hypershift_deployment_runs(&d(json!({}), json!(0)), &[]));
        // ours
        assert!(!hypershift_deployment_runs(
            &d(
                json!({labels::MANAGED_BY_KEY: labels::MANAGED_BY}),
                json!(1)
            ),
            &[]
        ));
        let m = hypershift_olm_message("clusters-a", "a", &["catalog-operator".into()]);
        assert!(
            m.contains("hypershift.openshift.io/debug-deployments")
                && m.contains("clusters-a/a")
                && m.contains("spec.hyperShiftOLM: TakeOver")
        );
    }
}
