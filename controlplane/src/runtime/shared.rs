//! The shared-catalog pass (issue 18): makes the objects of [`crate::sharing::SHARED_NAMESPACE`]
//! match what the hosted clusters use, and deletes a shared catalog when its last user goes.
//!
//! Who uses what is derived from state on every pass, never stored as a counter: each
//! HostedOLM's `status.catalogs[]` says `sharing: shared` and the `servingDeployment`. The
//! digest a shared catalog serves is the one its users' reconciles resolved (at the default
//! repository, with each cluster's own pull secret), held in memory by this process
//! ([`SharedDigests`]). A status alone never chooses what a catalog serves, and never adds a
//! namespace to a catalog's NetworkPolicy: a use counts only when this process's reconcile
//! of that cluster decided it, or, for clusters not reconciled yet since this process
//! started, when the live NetworkPolicy already admitted that namespace when the process
//! first looked ([`confirmed_users`]). So whoever can write a HostedOLM's status cannot
//! reach a catalog its own cluster's pull secret could not read. A catalog whose users' digests are not known yet (just
//! after a restart, before their reconciles ran) is left as it is: neither applied nor
//! deleted. Two controllers computing from the same state write the same objects with the
//! same field manager, so they converge.
//!
//! Runs every [`INTERVAL`] while the controller loop runs, which also restores a shared
//! namespace deleted by hand and a shared Deployment scaled to 0 (server-side apply of
//! `replicas: 2`).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hcp_olm_apply::{Applier, Policy, Target};
use kube::Api;
use kube::api::ListParams;
use serde_json::json;

use super::kinds::api_resource;
use super::reconcile::target;
use super::{Context, FIELD_MANAGER};
use crate::catalogs::DefaultCatalog;
use crate::hostedolm::HostedOLM;
use crate::render::shared::{self as render_shared, SharedSettings};
use crate::sharing::{self, SHARED_NAMESPACE, SharedKey, Use};

/// How often the pass runs.
pub const INTERVAL: Duration = Duration::from_secs(10);

/// Default image of the init container that copies the catalog out of its image (OLM's
/// `copy-content`), when the controller names none (`--shared-catalog-utilities-image`).
pub const DEFAULT_UTILITIES_IMAGE: &str = "quay.io/operator-framework/olm:v0.46.0";

/// How long one reconcile's decision to use a shared catalog counts (issue 35, item 6): a
/// cluster whose passes stop before the catalog lookups (a dead guest API server, a
/// HyperShift OLM in the way, a pause) loses its shared uses this long after its last
/// complete pass, and the catalog answers that admit a cluster are looked up again at
/// least this often (see [`crate::sharing::ENTITLEMENT_REFRESH`]).
pub const USE_LIFETIME: Duration = crate::sharing::ENTITLEMENT_REFRESH;

/// What one hosted cluster's last complete reconcile decided.
#[derive(Clone, Debug)]
struct Recorded {
    /// `namespace/name` of the HostedCluster that owns the HCP namespace (and recorded it).
    owner: String,
    /// When it was recorded.
    at: Instant,
    /// The shared catalogs it uses and the digest reference it resolved for each.
    uses: BTreeMap<SharedKey, String>,
}

/// Per HCP namespace, what its owner's last reconcile decided: the shared catalogs it uses
/// and the digest reference resolved for each. In memory only (see the module
/// documentation). Only the HostedCluster that recorded a namespace can make it forget
/// (issue 35, item 3: a colliding HostedCluster's cleanup must not cut its victim off).
#[derive(Clone, Debug)]
pub struct SharedDigests(Arc<Mutex<BTreeMap<String, Recorded>>>, Duration);

impl Default for SharedDigests {
    fn default() -> Self {
        Self::with_lifetime(USE_LIFETIME)
    }
}

impl SharedDigests {
    /// Recorded uses count for `lifetime` ([`USE_LIFETIME`] by default; tests shorten it).
    pub fn with_lifetime(lifetime: Duration) -> Self {
        Self(Arc::default(), lifetime)
    }

    /// How long a recorded use counts, and the longest a catalog answer that admits a
    /// cluster to a shared catalog is reused.
    pub fn lifetime(&self) -> Duration {
        self.1
    }

    /// Records what one hosted cluster's reconcile decided: the shared catalogs it uses and
    /// the digest reference it resolved for each. `owner` is the HostedCluster
    /// (`namespace/name`) whose reconcile found it owns `hcp_namespace`. Replaces everything
    /// recorded for the namespace. A reserved namespace ([`crate::sharing::reserved`]) is
    /// never recorded.
    pub fn record(&self, hcp_namespace: &str, owner: &str, uses: &[(SharedKey, String)]) {
        if crate::sharing::reserved(hcp_namespace) {
            return;
        }
        self.0.lock().unwrap_or_else(|p| p.into_inner()).insert(
            hcp_namespace.to_string(),
            Recorded {
                owner: owner.to_string(),
                at: Instant::now(),
                uses: uses.iter().cloned().collect(),
            },
        );
    }

    /// Forgets a hosted cluster (its HostedOLM is gone): only when `owner` is the
    /// HostedCluster that recorded `hcp_namespace`. Returns whether anything was forgotten.
    pub fn forget(&self, hcp_namespace: &str, owner: &str) -> bool {
        let mut m = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if m.get(hcp_namespace).is_some_and(|r| r.owner == owner) {
            m.remove(hcp_namespace);
            true
        } else {
            false
        }
    }

    /// Whether this process has reconciled the cluster of `hcp_namespace` (and recorded
    /// what it uses, possibly nothing) since it started.
    pub fn reconciled(&self, hcp_namespace: &str) -> bool {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .contains_key(hcp_namespace)
    }

    /// The digest reference `hcp_namespace` resolved for `key`, while its record is younger
    /// than [`SharedDigests::lifetime`].
    fn get(&self, key: &SharedKey, hcp_namespace: &str) -> Option<String> {
        self.get_within(key, hcp_namespace, self.1)
    }

    fn get_within(
        &self,
        key: &SharedKey,
        hcp_namespace: &str,
        lifetime: Duration,
    ) -> Option<String> {
        let m = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let r = m.get(hcp_namespace)?;
        if r.at.elapsed() >= lifetime {
            tracing::debug!(namespace = %hcp_namespace, catalog = %key.name(), "shared catalog use not confirmed by a complete pass within its lifetime: not counted");
            return None;
        }
        r.uses.get(key).cloned()
    }
}

/// Per shared catalog name, the HCP namespaces its live NetworkPolicy admitted when this
/// process first looked (read once, by the first pass).
#[derive(Clone, Debug, Default)]
pub struct AdmittedAtStart(Arc<tokio::sync::OnceCell<BTreeMap<String, BTreeSet<String>>>>);

/// The namespaces a shared catalog NetworkPolicy (as rendered by
/// [`render_shared::catalog`]) admits (pure; anything else in it is ignored).
pub fn admitted(np: &serde_json::Value) -> BTreeSet<String> {
    np["spec"]["ingress"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|rule| rule["from"].as_array().into_iter().flatten())
        .flat_map(|peer| {
            peer["namespaceSelector"]["matchExpressions"]
                .as_array()
                .into_iter()
                .flatten()
        })
        .filter(|e| e["key"] == "kubernetes.io/metadata.name" && e["operator"] == "In")
        .flat_map(|e| e["values"].as_array().into_iter().flatten())
        .filter_map(|v| v.as_str().map(str::to_string))
        .collect()
}

async fn read_admitted(ctx: &Context) -> Result<BTreeMap<String, BTreeSet<String>>, kube::Error> {
    let api: Api<kube::api::DynamicObject> = Api::namespaced_with(
        ctx.client.clone(),
        SHARED_NAMESPACE,
        &api_resource("networking.k8s.io/v1", "NetworkPolicy", "networkpolicies"),
    );
    let selector = render_shared::shared_labels()
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(",");
    let list = match api.list(&ListParams::default().labels(&selector)).await {
        Ok(l) => l.items,
        Err(kube::Error::Api(s)) if s.code == 404 => Vec::new(),
        Err(e) => return Err(e),
    };
    Ok(list
        .into_iter()
        .filter_map(|np| {
            let name = np.metadata.name.clone()?;
            Some((name, admitted(&np.data)))
        })
        .collect())
}

/// The users of each shared catalog that count (pure): a status's claim counts when this
/// process's reconcile of that cluster decided the same use (`known`), or, for a cluster
/// not reconciled since this process started (`reconciled` false), when the live
/// NetworkPolicy admitted the namespace then (`at_start`). Anything else (a status written
/// by someone else) is ignored.
pub fn confirmed_users(
    claims: impl IntoIterator<Item = (String, SharedKey)>,
    known: impl Fn(&SharedKey, &str) -> bool,
    reconciled: impl Fn(&str) -> bool,
    at_start: &BTreeMap<String, BTreeSet<String>>,
) -> BTreeMap<SharedKey, BTreeSet<String>> {
    let mut users: BTreeMap<SharedKey, BTreeSet<String>> = BTreeMap::new();
    for (ns, key) in claims {
        let admitted_before = !reconciled(&ns)
            && at_start
                .get(&key.name())
                .is_some_and(|set| set.contains(&ns));
        if known(&key, &ns) || admitted_before {
            users.entry(key).or_default().insert(ns);
        } else {
            tracing::debug!(namespace = %ns, catalog = %key.name(), "a status claims a shared catalog this controller did not decide: ignored");
        }
    }
    users
}

/// The shared catalogs a HostedOLM's status says its cluster uses.
pub fn status_uses(holm: &HostedOLM) -> Vec<(String, SharedKey)> {
    let Some(ns) = holm.metadata.namespace.as_deref() else {
        return Vec::new();
    };
    // A HostedOLM in one of our own namespaces (HostedCluster `hcp-olm/catalogs`) is
    // never a user (issue 35, item 9).
    if holm.metadata.deletion_timestamp.is_some() || sharing::reserved(ns) {
        return Vec::new();
    }
    holm.status
        .iter()
        .flat_map(|s| s.catalogs.iter())
        .filter(|c| c.enabled && c.sharing.as_deref() == Some("shared"))
        .filter_map(|c| {
            let catalog = DefaultCatalog::from_name(&c.name)?;
            let key = SharedKey::from_deployment_ref(catalog, c.serving_deployment.as_deref()?)?;
            Some((ns.to_string(), key))
        })
        .collect()
}

/// What one pass did.
#[derive(Debug, Default)]
pub struct PassReport {
    /// Shared catalogs applied.
    pub applied: usize,
    /// Shared catalogs with users whose digest is not known yet (left as they are).
    pub unknown: usize,
    pub writes: usize,
    pub errors: Vec<String>,
}

fn settings(ctx: &Context, management_has_scc: bool) -> SharedSettings {
    SharedSettings {
        catalog_server_image: ctx.config.defaults.catalog_server_image.clone(),
        utilities_image: ctx
            .config
            .shared_utilities_image
            .clone()
            .unwrap_or_else(|| DEFAULT_UTILITIES_IMAGE.to_string()),
        image_pull_secret: ctx.config.shared_pull_secret.clone(),
        management_has_scc,
    }
}

async fn hosted_olms(ctx: &Context) -> Result<Vec<Arc<HostedOLM>>, kube::Error> {
    if let Some(stores) = ctx.stores()
        && stores.hosted_olms.synced()
    {
        return Ok(stores.hosted_olms.all());
    }
    let api: Api<HostedOLM> = Api::all(ctx.client.clone());
    Ok(api
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .map(Arc::new)
        .collect())
}

/// The kinds of a shared catalog (deleted with its last user).
fn shared_kinds() -> Vec<(kube::api::ApiResource, bool)> {
    catalog_kinds()
        .into_iter()
        // the pods' ServiceAccount: deleted once no shared catalog is left
        .chain([(
            api_resource("v1", "ServiceAccount", "serviceaccounts"),
            true,
        )])
        .collect()
}

/// The kinds of one shared catalog's objects.
fn catalog_kinds() -> Vec<(kube::api::ApiResource, bool)> {
    [
        ("apps/v1", "Deployment", "deployments"),
        ("v1", "Service", "services"),
        ("policy/v1", "PodDisruptionBudget", "poddisruptionbudgets"),
        ("networking.k8s.io/v1", "NetworkPolicy", "networkpolicies"),
    ]
    .into_iter()
    .map(|(a, k, p)| (api_resource(a, k, p), true))
    .collect()
}

/// Targets naming a shared catalog's objects without changing them (kept by the prune).
fn keep_as_is(key: &SharedKey) -> Vec<Target> {
    catalog_kinds()
        .into_iter()
        .map(|(r, _)| {
            Target::new(
                &r.api_version,
                &r.kind,
                &r.plural,
                Policy::CreateOnly,
                json!({"metadata": {"name": key.name(), "namespace": SHARED_NAMESPACE}}),
            )
        })
        .collect()
}

/// One pass: read every HostedOLM, apply the shared catalogs in use, delete the rest.
pub async fn pass(ctx: &Context) -> PassReport {
    let mut report = PassReport::default();
    let holms = match hosted_olms(ctx).await {
        Ok(h) => h,
        Err(e) => {
            report.errors.push(format!("listing HostedOLMs: {e}"));
            return report;
        }
    };
    let at_start = match ctx
        .shared_admitted
        .0
        .get_or_try_init(|| read_admitted(ctx))
        .await
    {
        Ok(a) => a,
        Err(e) => {
            report
                .errors
                .push(format!("reading the shared NetworkPolicies: {e}"));
            return report;
        }
    };
    let users = confirmed_users(
        holms.iter().flat_map(|h| status_uses(h)),
        |key, ns| ctx.shared_digests.get(key, ns).is_some(),
        |ns| ctx.shared_digests.reconciled(ns),
        at_start,
    );
    let mut uses = Vec::new();
    for (key, namespaces) in &users {
        for ns in namespaces {
            if let Some(image) = ctx.shared_digests.get(key, ns) {
                uses.push(Use {
                    namespace: ns.clone(),
                    key: key.clone(),
                    image,
                });
            }
        }
    }
    // Users whose digest is unknown still count, so their namespaces stay admitted.
    let (mut plan, errs) = sharing::plan(&uses);
    for c in &mut plan {
        if let Some(all) = users.get(&c.key) {
            c.users.extend(all.iter().cloned());
        }
    }
    report.errors.extend(errs.iter().map(ToString::to_string));
    let planned: BTreeSet<&SharedKey> = plan.iter().map(|c| &c.key).collect();
    let mut keep: Vec<Target> = Vec::new();
    for key in users.keys().filter(|k| !planned.contains(k)) {
        report.unknown += 1;
        keep.extend(keep_as_is(key));
    }
    // Discovery only when something is rendered (no shared catalog: no request at all).
    let has_scc = if plan.is_empty() {
        false
    } else {
        match ctx
            .served("security.openshift.io/v1", "securitycontextconstraints")
            .await
        {
            Ok(v) => v,
            Err(e) => {
                report.errors.push(e.to_string());
                return report;
            }
        }
    };
    let s = settings(ctx, has_scc);
    let applier = Applier::new(ctx.client.clone(), FIELD_MANAGER).with_cache(ctx.mgmt_cache());
    let mut targets: Vec<Target> = Vec::new();
    // Namespace and ServiceAccount while any shared catalog is in use (also one left as it
    // is: its pods need the ServiceAccount).
    if !plan.is_empty() || !keep.is_empty() {
        targets.push(target(&render_shared::namespace()));
        targets.push(target(&render_shared::service_account()));
    }
    for c in &plan {
        targets.extend(render_shared::catalog(c, &s).iter().map(target));
    }
    report.applied = plan.len();
    let applied = applier.apply(&targets).await;
    keep.extend(targets);
    let pruned = applier
        .prune(
            &shared_kinds(),
            Some(SHARED_NAMESPACE),
            &render_shared::shared_labels(),
            &keep,
        )
        .await;
    for r in [applied, pruned] {
        report.writes += r.writes();
        for c in &r.created {
            tracing::info!(object = %c, "shared catalog: created");
        }
        for d in &r.deleted {
            tracing::info!(object = %d, "shared catalog: deleted (no user left)");
        }
        report
            .errors
            .extend(r.errors.iter().map(ToString::to_string));
    }
    report
}

/// Deletes every shared catalog object (`hcp-olm-controller uninstall`; the namespace stays).
pub async fn remove_all(ctx: &Context, dry_run: bool) -> hcp_olm_apply::Report {
    Applier::new(ctx.client.clone(), FIELD_MANAGER)
        .dry_run(dry_run)
        .prune(
            &shared_kinds(),
            Some(SHARED_NAMESPACE),
            &render_shared::shared_labels(),
            &[],
        )
        .await
}

/// Runs [`pass`] every [`INTERVAL`] until `shutdown` resolves.
pub async fn run(ctx: Arc<Context>, shutdown: impl std::future::Future<Output = ()>) {
    let mut shutdown = std::pin::pin!(shutdown);
    let mut tick = tokio::time::interval(INTERVAL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            () = &mut shutdown => return,
            _ = tick.tick() => {}
        }
        let r = pass(&ctx).await;
        for e in &r.errors {
            tracing::warn!(error = %e, "shared catalogs");
        }
        tracing::debug!(
            applied = r.applied,
            unknown = r.unknown,
            writes = r.writes,
            "shared catalog pass"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hostedolm::{CatalogStatus, HostedOLMSpec, HostedOLMStatus};

    fn holm(ns: &str, catalogs: Vec<CatalogStatus>) -> HostedOLM {
        let mut h = HostedOLM::new("x", HostedOLMSpec::default());
        h.metadata.namespace = Some(ns.into());
        h.status = Some(HostedOLMStatus {
            catalogs,
            ..Default::default()
        });
        h
    }

    fn cat(name: &str, sharing: &str, serving: &str) -> CatalogStatus {
        CatalogStatus {
            name: name.into(),
            enabled: true,
            sharing: Some(sharing.into()),
            serving_deployment: Some(serving.into()),
            ..Default::default()
        }
    }

    #[test]
    fn a_status_alone_never_admits_a_namespace() {
        let key = SharedKey::new(DefaultCatalog::RedhatOperators, "4.18").expect("key");
        let claims = vec![
            ("clusters-known".to_string(), key.clone()),
            ("clusters-before".to_string(), key.clone()),
            ("clusters-forged".to_string(), key.clone()),
        ];
        let at_start =
            BTreeMap::from([(key.name(), BTreeSet::from(["clusters-before".to_string()]))]);
        let users = confirmed_users(
            claims.clone(),
            |_, ns| ns == "clusters-known",
            |ns| ns == "clusters-known",
            &at_start,
        );
        assert_eq!(
            users.get(&key).expect("users").iter().collect::<Vec<_>>(),
            ["clusters-before", "clusters-known"]
        );
        // Once reconciled here (and found not to use it), admission at start no longer counts.
        let users = confirmed_users(claims, |_, ns| ns == "clusters-known", |_| true, &at_start);
        assert_eq!(
            users.get(&key).expect("users").iter().collect::<Vec<_>>(),
            ["clusters-known"]
        );
    }

    #[test]
    fn admitted_reads_back_what_the_render_lists() {
        let c = crate::sharing::SharedCatalog {
            key: SharedKey::new(DefaultCatalog::RedhatOperators, "4.18").expect("key"),
            image: format!(
                "registry.redhat.io/redhat/redhat-operator-index@sha256:{}",
                "a".repeat(64)
            ),
            users: ["clusters-a", "clusters-b"]
                .iter()
                .map(|s| s.to_string())
                .collect(),
        };
        let s = SharedSettings {
            catalog_server_image: "i".into(),
            utilities_image: "u".into(),
            image_pull_secret: None,
            management_has_scc: false,
        };
        let np = render_shared::catalog(&c, &s)
            .into_iter()
            .find(|o| o.body["kind"] == "NetworkPolicy")
            .expect("a NetworkPolicy");
        assert_eq!(admitted(&np.body), c.users);
        assert!(admitted(&json!({"spec": {"ingress": []}})).is_empty());
    }

    #[test]
    fn uses_come_from_status_and_ignore_what_does_not_parse() {
        let h = holm(
            "clusters-a",
            vec![
                cat(
                    "redhat-operators",
                    "shared",
                    "hcp-olm-catalogs/hcp-olm-redhat-operators-v4-18",
                ),
                cat(
                    "certified-operators",
                    "own",
                    "clusters-a/hcp-olm-certified-operators",
                ),
                // a status naming another catalog's Deployment, or one elsewhere: ignored
                cat(
                    "community-operators",
                    "shared",
                    "hcp-olm-catalogs/hcp-olm-redhat-operators-v4-18",
                ),
                cat("no-such-catalog", "shared", "hcp-olm-catalogs/x"),
            ],
        );
        let u = status_uses(&h);
        assert_eq!(u.len(), 1);
        assert_eq!(u[0].0, "clusters-a");
        assert_eq!(u[0].1.name(), "hcp-olm-redhat-operators-v4-18");
        let mut gone = h.clone();
        gone.metadata.deletion_timestamp =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
            ));
        assert!(status_uses(&gone).is_empty());
    }

    #[test]
    fn digests_are_replaced_per_cluster_and_only_their_owner_forgets_them() {
        let d = SharedDigests::default();
        let k = SharedKey::new(DefaultCatalog::RedhatOperators, "4.18").expect("key");
        d.record("a", "clusters/a", &[(k.clone(), "img1".into())]);
        d.record("b", "clusters/b", &[(k.clone(), "img2".into())]);
        assert_eq!(d.get(&k, "a").as_deref(), Some("img1"));
        d.record("a", "clusters/a", &[]);
        assert_eq!(d.get(&k, "a"), None);
        assert!(d.reconciled("a"));
        // A colliding HostedCluster (team/a-b for team-a/b's team-a-b) cannot make it forget.
        assert!(!d.forget("b", "clusters/not-b"));
        assert_eq!(d.get(&k, "b").as_deref(), Some("img2"));
        assert!(d.forget("b", "clusters/b"));
        assert!(!d.reconciled("b"));
        // Our own namespaces are never recorded.
        d.record(
            SHARED_NAMESPACE,
            "hcp-olm/catalogs",
            &[(k.clone(), "x".into())],
        );
        assert!(!d.reconciled(SHARED_NAMESPACE));
    }

    #[test]
    fn a_use_not_confirmed_within_its_lifetime_does_not_count() {
        let d = SharedDigests::default();
        let k = SharedKey::new(DefaultCatalog::RedhatOperators, "4.18").expect("key");
        d.record("a", "clusters/a", &[(k.clone(), "img1".into())]);
        assert_eq!(
            d.get_within(&k, "a", Duration::from_secs(60)).as_deref(),
            Some("img1")
        );
        std::thread::sleep(Duration::from_millis(20));
        assert_eq!(d.get_within(&k, "a", Duration::from_millis(10)), None);
        // still reconciled: an admission seen at start does not bring it back
        assert!(d.reconciled("a"));
    }
}
