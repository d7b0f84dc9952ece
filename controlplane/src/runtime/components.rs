//! The observe step: each rendered component's status read back from its Deployment, its
//! pods and the Secrets they mount (HCP namespace from the controller's stores, the guest
//! from the session's). One reader for every component, as a generic driver: a component
//! is a Deployment in the desired set, and what it renders decides what is read.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Secret;
use kube::api::Api;
use serde_json::Value;

use super::{Context, Error, kube_err, pods};
use crate::hostedolm::ComponentStatus;
use crate::render::{Desired, Object, labels};

/// Whether the live Deployment runs only pods of the rendered template (its config hash),
/// all of them ready: the controller has seen the current spec, every replica is updated,
/// no old pod is left, and the desired number is ready. Pure.
pub fn rolled_out(rendered: &Value, live: &Deployment) -> bool {
    let hash_of = |template_annotations: Option<&Value>| {
        template_annotations.and_then(|a| {
            a[labels::CONFIG_HASH_ANNOTATION]
                .as_str()
                .map(str::to_owned)
        })
    };
    let want = hash_of(rendered["spec"]["template"]["metadata"].get("annotations"));
    let have = live
        .spec
        .as_ref()
        .and_then(|s| s.template.metadata.as_ref())
        .and_then(|m| m.annotations.as_ref())
        .and_then(|a| a.get(labels::CONFIG_HASH_ANNOTATION).cloned());
    let Some(status) = live.status.as_ref() else {
        return false;
    };
    let replicas = live.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1);
    want.is_some()
        && want == have
        && status.observed_generation >= live.metadata.generation
        && status.updated_replicas.unwrap_or(0) == replicas
        && status.replicas.unwrap_or(0) == replicas
        && status.ready_replicas.unwrap_or(0) >= replicas
}

/// Availability of a rendered Deployment from its live status (pure).
fn component_status(name: &str, body: &Value, live: Option<&Deployment>) -> ComponentStatus {
    let desired_replicas = body["spec"]["replicas"].as_i64().map(|r| r as i32);
    let ready = live
        .and_then(|d| d.status.as_ref()?.ready_replicas)
        .unwrap_or(0);
    let (available, reason) = match desired_replicas {
        Some(0) => (false, "ScaledToZero"),
        Some(n) if ready >= n => (true, ""),
        _ if live.is_none() => (false, "NotCreated"),
        _ => (false, "PodsNotReady"),
    };
    let mut c = ComponentStatus {
        name: name.to_string(),
        available,
        ready_replicas: Some(ready),
        desired_replicas,
        reason: reason.to_string(),
        message: String::new(),
    };
    // Pods that cannot even be created (admission refused them: a missing PriorityClass, a
    // quota): the ReplicaSet's ReplicaFailure condition, which the Deployment carries.
    if reason == "PodsNotReady"
        && let Some(f) = live
            .and_then(|d| d.status.as_ref()?.conditions.as_ref())
            .and_then(|cs| {
                cs.iter()
                    .find(|c| c.type_ == "ReplicaFailure" && c.status == "True")
            })
    {
        c.reason = f
            .reason
            .clone()
            .filter(|r| pods::valid_reason(r))
            .unwrap_or_else(|| "ReplicaFailure".into());
        c.message = pods::bounded(f.message.clone().unwrap_or_default());
    }
    c
}

/// Whether a rendered Deployment's selector (`spec.selector.matchLabels`) selects `labels`.
fn selects(body: &Value, labels: Option<&BTreeMap<String, String>>) -> bool {
    let Some(want) = body["spec"]["selector"]["matchLabels"].as_object() else {
        return false;
    };
    !want.is_empty()
        && want
            .iter()
            .all(|(k, v)| labels.and_then(|l| l.get(k)).map(String::as_str) == v.as_str())
}

/// Pods of a rendered Deployment looked up with a list (the guest's, or the management
/// cluster's before its pod store has synced): at most [`POD_LIST_LIMIT`]. A failed read
/// explains nothing (the component stays `PodsNotReady`).
async fn pod_problem_listed(
    client: &kube::Client,
    ns: &str,
    body: &Value,
) -> Option<pods::Problem> {
    let selector: Vec<String> = body["spec"]["selector"]["matchLabels"]
        .as_object()?
        .iter()
        .map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or_default()))
        .collect();
    if selector.is_empty() {
        return None;
    }
    // Read as the guest's watches read their pages (bounded in items and bytes): the
    // guest's pods are the guest's, and so is its API server.
    let page = hcp_olm_apply::watch::list_page::<k8s_openapi::api::core::v1::Pod>(
        client,
        &kube::api::ApiResource::erase::<k8s_openapi::api::core::v1::Pod>(&()),
        &hcp_olm_apply::watch::Selector {
            namespace: Some(ns.to_string()),
            labels: selector.join(","),
            fields: String::new(),
        },
        false,
        hcp_olm_apply::watch::Options {
            page: POD_LIST_LIMIT,
            ..super::guest_reads::LIMITS.watch
        },
        None,
    )
    .await;
    match page {
        Ok((_, items)) => pods::problem(items.iter()),
        Err(e) => {
            tracing::debug!(namespace = ns, error = %e, "listing a component's pods");
            None
        }
    }
}

/// The Secrets a rendered Deployment's pods mount and cannot start without (volume name,
/// Secret name), in volume order. Pure.
fn mounted_secrets(body: &Value) -> Vec<(String, String)> {
    body["spec"]["template"]["spec"]["volumes"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|v| v["secret"]["optional"].as_bool() != Some(true))
        .filter_map(|v| {
            Some((
                v["name"].as_str()?.to_string(),
                v["secret"]["secretName"].as_str()?.to_string(),
            ))
        })
        .collect()
}

/// Pods read per component when its pods are listed.
const POD_LIST_LIMIT: u32 = 20;

/// Replaces `PodsNotReady` with what the pods say, when they say something.
fn explain(c: &mut ComponentStatus, problem: Option<pods::Problem>) {
    if let Some(p) = problem {
        c.reason = p.reason;
        c.message = p.message;
    }
}

/// Every rendered Deployment's availability: the HCP ones, then the guest ones (the guest
/// agent). A guest that cannot be read leaves its components unavailable with the reason.
/// Every component is read the same way, from its Deployment, its pods and the Secrets
/// they mount: a component declares nothing of its own here.
pub(super) async fn read_components(
    ctx: &Context,
    guest: &kube::Client,
    reads: Option<&super::guest_reads::GuestReads>,
    hcp_ns: &str,
    desired: &Desired,
) -> Result<Vec<ComponentStatus>, Error> {
    let mut out = Vec::new();
    for o in desired.hcp.iter().filter(|o| o.kind == "Deployment") {
        out.push(management_component(ctx, hcp_ns, o).await?);
    }
    for o in desired.guest.iter().filter(|o| o.kind == "Deployment") {
        out.push(guest_component(guest, reads, o).await);
    }
    Ok(out)
}

/// One HCP-namespace Deployment's status, from the controller's stores where they know.
async fn management_component(
    ctx: &Context,
    hcp_ns: &str,
    o: &Object,
) -> Result<ComponentStatus, Error> {
    let api: Api<Deployment> = Api::namespaced(ctx.client.clone(), hcp_ns);
    let stores = ctx.stores();
    // The controller's store of our Deployments wakes a pass only after it holds the
    // change, so its answer is current for the pass a change starts.
    let cached = stores
        .as_ref()
        .and_then(|c| c.deployments.get(Some(hcp_ns), &o.name))
        .flatten();
    let live = match cached {
        Some(d) => Some(d.as_ref().clone()),
        None => api
            .get_opt(&o.name)
            .await
            .map_err(kube_err(format!("reading Deployment {hcp_ns}/{}", o.name)))?,
    };
    let mut c = component_status(&o.name, &o.body, live.as_ref());
    if c.reason == "PodsNotReady" {
        let from_store = stores.as_ref().filter(|s| s.pods.synced()).map(|s| {
            s.pods
                .all()
                .into_iter()
                .filter(|p| {
                    p.metadata.namespace.as_deref() == Some(hcp_ns)
                        && selects(&o.body, p.metadata.labels.as_ref())
                })
                .collect::<Vec<_>>()
        });
        let problem = match from_store {
            Some(pods) => pods::problem(pods.iter().map(|p| p.as_ref())),
            None => pod_problem_listed(&ctx.client, hcp_ns, &o.body).await,
        };
        explain(&mut c, problem);
    }
    if c.reason == "PodsNotReady" {
        missing_secret(ctx, hcp_ns, o, &mut c).await;
    }
    Ok(c)
}

/// Pods whose Secret volume does not exist wait in ContainerCreating with no reason of
/// their own (the kubelet says it only in Events): name the first missing Secret.
async fn missing_secret(ctx: &Context, hcp_ns: &str, o: &Object, c: &mut ComponentStatus) {
    let stores = ctx.stores();
    for (volume, secret) in mounted_secrets(&o.body) {
        // A synced store's answer stands, so a resync reads nothing: a Secret written
        // a moment ago and not delivered yet shows as missing for at most one pass,
        // as its arrival wakes the next (the Secret watch). Without a store, read.
        let exists = match stores
            .as_ref()
            .and_then(|s| s.secrets.get(Some(hcp_ns), &secret))
        {
            Some(found) => found.is_some(),
            None => Api::<Secret>::namespaced(ctx.client.clone(), hcp_ns)
                .get_metadata_opt(&secret)
                .await
                .map(|m| m.is_some())
                // unknown: say nothing rather than something wrong
                .unwrap_or(true),
        };
        if !exists {
            c.reason = "SecretMissing".into();
            c.message = format!(
                "pods cannot start: Secret {hcp_ns}/{secret} (volume {volume}) does not exist"
            );
            break;
        }
    }
}

/// One guest Deployment's status (the guest agent), from the session's store while it
/// knows (only the status fields it keeps); a projection that does not decode is asked
/// for instead.
async fn guest_component(
    guest: &kube::Client,
    reads: Option<&super::guest_reads::GuestReads>,
    o: &Object,
) -> ComponentStatus {
    let ns = o.namespace.as_deref().unwrap_or_default();
    let api: Api<Deployment> = Api::namespaced(guest.clone(), ns);
    let known = match reads.and_then(|r| r.deployments.get(Some(ns), &o.name)) {
        Some(Some(v)) => serde_json::from_value::<Deployment>(v).ok().map(Some),
        Some(None) => Some(None),
        None => None,
    };
    let live = match known {
        Some(d) => Ok(d),
        None => api.get_opt(&o.name).await,
    };
    match live {
        Ok(live) => {
            let mut c = component_status(&o.name, &o.body, live.as_ref());
            if c.reason == "PodsNotReady" {
                explain(&mut c, pod_problem_listed(guest, ns, &o.body).await);
            }
            c
        }
        Err(e) => {
            let mut c = component_status(&o.name, &o.body, None);
            c.reason = "GuestUnreadable".into();
            c.message = format!("reading Deployment {ns}/{} in the guest: {e}", o.name);
            c
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn live(hash: &str, generation: i64, status: serde_json::Value) -> Deployment {
        serde_json::from_value(json!({
            "metadata": {"name": "p", "generation": generation},
            "spec": {
                "replicas": 3,
                "selector": {},
                "template": {"metadata": {"annotations": {labels::CONFIG_HASH_ANNOTATION: hash}}},
            },
            "status": status,
        }))
        .unwrap()
    }

    /// The condition as the real kube-controller-manager wrote it (real-node runtime test, a
    /// management cluster without HyperShift's PriorityClasses).
    #[test]
    fn pods_that_cannot_be_created_say_why_and_selectors_match_labels() {
        let rendered = json!({"spec": {"replicas": 3,
            "selector": {"matchLabels": {"app.kubernetes.io/name": "p"}}}});
        let failing = live(
            "h",
            1,
            json!({"replicas": 0, "conditions": [
                {"type": "Available", "status": "False", "reason": "MinimumReplicasUnavailable"},
                {"type": "ReplicaFailure", "status": "True", "reason": "FailedCreate",
                 "message": "pods \"p-6948fb9fcf-\" is forbidden: no PriorityClass with name hypershift-control-plane was found"}]}),
        );
        let c = component_status("p", &rendered, Some(&failing));
        assert!(!c.available);
        assert_eq!(c.reason, "FailedCreate");
        assert!(
            c.message
                .contains("no PriorityClass with name hypershift-control-plane")
        );
        // A ready Deployment is available whatever an old condition says.
        let ready = live(
            "h",
            1,
            json!({"readyReplicas": 3, "conditions": [
                {"type": "ReplicaFailure", "status": "True", "reason": "FailedCreate"}]}),
        );
        let c = component_status("p", &rendered, Some(&ready));
        assert!(c.available && c.reason.is_empty(), "{c:?}");
        // No ReplicaFailure: the pods are asked (PodsNotReady until they say more).
        let c = component_status("p", &rendered, Some(&live("h", 1, json!({"replicas": 3}))));
        assert_eq!(c.reason, "PodsNotReady");

        let labels = |kv: &[(&str, &str)]| -> BTreeMap<String, String> {
            kv.iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        assert!(selects(
            &rendered,
            Some(&labels(&[("app.kubernetes.io/name", "p"), ("x", "y")]))
        ));
        assert!(!selects(
            &rendered,
            Some(&labels(&[("app.kubernetes.io/name", "q")]))
        ));
        assert!(!selects(&rendered, None));
        let body = json!({"spec": {"template": {"spec": {"volumes": [
            {"name": "kubeconfig", "secret": {"secretName": "service-network-admin-kubeconfig"}},
            {"name": "tmp", "emptyDir": {}},
            {"name": "maybe", "secret": {"secretName": "x", "optional": true}},
            {"name": "cert", "secret": {"secretName": "serving"}}]}}}});
        assert_eq!(
            mounted_secrets(&body),
            [
                (
                    "kubeconfig".to_string(),
                    "service-network-admin-kubeconfig".to_string()
                ),
                ("cert".to_string(), "serving".to_string())
            ]
        );
        // An empty selector selects nothing here (never every pod of the namespace).
        assert!(!selects(
            &json!({"spec": {"selector": {"matchLabels": {}}}}),
            Some(&labels(&[]))
        ));
    }

    #[test]
    fn rolled_out_only_when_every_pod_runs_the_rendered_template() {
        let rendered = json!({"spec": {"template": {"metadata": {"annotations": {
            labels::CONFIG_HASH_ANNOTATION: "new"}}}}});
        let done = json!({"observedGeneration": 2, "replicas": 3, "updatedReplicas": 3,
            "readyReplicas": 3, "availableReplicas": 3});
        assert!(rolled_out(&rendered, &live("new", 2, done.clone())));
        // the template has not been applied yet
        assert!(!rolled_out(&rendered, &live("old", 2, done.clone())));
        // the Deployment controller has not seen the new spec
        assert!(!rolled_out(&rendered, &live("new", 3, done.clone())));
        // an old pod is still there (4 pods: 3 updated + 1 old)
        let mut surge = done.clone();
        surge["replicas"] = json!(4);
        assert!(!rolled_out(&rendered, &live("new", 2, surge)));
        let mut partial = done.clone();
        partial["updatedReplicas"] = json!(2);
        assert!(!rolled_out(&rendered, &live("new", 2, partial)));
        let mut unready = done;
        unready["readyReplicas"] = json!(2);
        assert!(!rolled_out(&rendered, &live("new", 2, unready)));
        assert!(!rolled_out(&rendered, &live("new", 2, json!(null))));
        assert!(!rolled_out(&json!({}), &live("new", 2, json!({}))));
    }
}
