//! The status of our Deployments in the management cluster, kept by a watch so a
//! converged reconcile reads component availability without a GET per component.
//!
//! Only what status needs is kept (name, namespace, generation, `spec.replicas`, the pod
//! template's annotations, `status`); managedFields and the rest of the spec are dropped
//! as events arrive, so memory stays at a few hundred bytes per Deployment we made.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use futures::StreamExt;
use k8s_openapi::api::apps::v1::{Deployment, DeploymentSpec};
use k8s_openapi::api::core::v1::PodTemplateSpec;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Api;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};

use crate::render::labels;

/// Our Deployments' status, watched. Dropping it stops the watch.
pub struct DeploymentCache {
    store: Store<Deployment>,
    synced: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<()>,
}

impl std::fmt::Debug for DeploymentCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeploymentCache")
            .field("synced", &self.synced.load(Ordering::Relaxed))
            .field("deployments", &self.store.state().len())
            .finish()
    }
}

impl Drop for DeploymentCache {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// What status reads of a Deployment, nothing else (pure).
pub fn trim(d: &mut Deployment) {
    let template_annotations = d
        .spec
        .as_ref()
        .and_then(|s| s.template.metadata.as_ref())
        .and_then(|m| m.annotations.clone());
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
}

impl DeploymentCache {
    /// Starts the watch of Deployments carrying our managed-by label, in all namespaces.
    pub fn start(client: &kube::Client) -> Self {
        let (store, writer) = reflector::store::<Deployment>();
        let synced = Arc::new(AtomicBool::new(false));
        let flag = synced.clone();
        let api: Api<Deployment> = Api::all(client.clone());
        let stream = watcher(
            api,
            watcher::Config::default().labels(&format!(
                "{}={}",
                labels::MANAGED_BY_KEY,
                labels::MANAGED_BY
            )),
        )
        .default_backoff()
        .modify(trim)
        .reflect(writer);
        let task = tokio::spawn(async move {
            futures::pin_mut!(stream);
            while let Some(ev) = stream.next().await {
                match ev {
                    Ok(watcher::Event::InitDone) => flag.store(true, Ordering::Release),
                    Ok(_) => {}
                    Err(e) => tracing::debug!(error = %e, "Deployment status watch"),
                }
            }
        });
        Self {
            store,
            synced,
            task,
        }
    }

    /// True once the first list completed.
    pub fn synced(&self) -> bool {
        self.synced.load(Ordering::Acquire)
    }

    /// The (trimmed) Deployment: `Some(None)` when absent, `None` when not synced yet.
    pub fn get(&self, namespace: &str, name: &str) -> Option<Option<Arc<Deployment>>> {
        self.synced()
            .then(|| self.store.get(&ObjectRef::new(name).within(namespace)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trimming_keeps_what_status_reads() {
        let mut d: Deployment = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "a", "namespace": "n", "generation": 3,
                "labels": {"x": "y"}, "managedFields": [{"manager": "m"}]},
            "spec": {"replicas": 2, "selector": {"matchLabels": {"a": "b"}},
                "template": {"metadata": {"annotations": {"hcp-olm.io/config-hash": "h"},
                                          "labels": {"a": "b"}},
                             "spec": {"containers": [{"name": "c", "image": "i"}]}}},
            "status": {"readyReplicas": 2, "observedGeneration": 3}
        }))
        .unwrap();
        trim(&mut d);
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
}
