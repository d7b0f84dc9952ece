//! Kubernetes Events (events.k8s.io/v1) on the HostedOLM and on its HostedCluster (where
//! admins look: `kubectl describe hostedcluster`), emitted only when a reported condition
//! changes (status or reason), so an idle controller writes nothing.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::Resource;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};

use crate::hostedcluster::HostedCluster;
use crate::hostedolm::HostedOLM;
use crate::status::{AVAILABLE, DEGRADED};

/// Name of the reporting controller in events.
pub const REPORTING_CONTROLLER: &str = "hcp-olm-controller";

/// The reporter of this process: the controller name and the pod name (`POD_NAME`,
/// else `HOSTNAME`) as instance.
pub fn reporter() -> Reporter {
    Reporter {
        controller: REPORTING_CONTROLLER.into(),
        instance: std::env::var("POD_NAME")
            .ok()
            .or_else(|| std::env::var("HOSTNAME").ok())
            .filter(|s| !s.is_empty()),
    }
}

/// A condition change worth an event.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Transition {
    pub type_: String,
    pub status: String,
    /// Event reason (the condition reason, or a word for "back to normal").
    pub reason: String,
    pub note: String,
    pub warning: bool,
}

/// The condition types that get events.
const REPORTED: &[&str] = &[AVAILABLE, DEGRADED];

/// Transitions from `old` to `new` of the reported condition types: a condition that
/// appears, or whose status or reason changed. Pure.
pub fn transitions(old: &[Condition], new: &[Condition]) -> Vec<Transition> {
    new.iter()
        .filter(|c| REPORTED.contains(&c.type_.as_str()))
        .filter(|c| {
            !old.iter()
                .any(|o| o.type_ == c.type_ && o.status == c.status && o.reason == c.reason)
        })
        .map(|c| {
            let healthy = (c.type_ == AVAILABLE) == (c.status == "True");
            let reason = if c.reason.is_empty() || c.reason == "AsExpected" {
                match (c.type_.as_str(), healthy) {
                    (AVAILABLE, true) => "Available".to_string(),
                    (DEGRADED, true) => "NotDegraded".to_string(),
                    (t, _) => format!("{t}{}", c.status),
                }
            } else {
                c.reason.clone()
            };
            let mut note = format!("{}={}", c.type_, c.status);
            if !c.message.is_empty() {
                note.push_str(": ");
                note.push_str(&c.message);
            }
            truncate_note(&mut note);
            Transition {
                type_: c.type_.clone(),
                status: c.status.clone(),
                reason,
                note,
                warning: c.type_ == DEGRADED && c.status == "True",
            }
        })
        .collect()
}

/// Publishes transitions as Events regarding a HostedOLM and its HostedCluster.
#[derive(Clone)]
pub struct Events {
    recorder: Recorder,
}

impl Events {
    pub fn new(client: kube::Client, reporter: Reporter) -> Self {
        Self {
            recorder: Recorder::new(client, reporter),
        }
    }

    /// Publish one event per transition on the HostedOLM and one on the HostedCluster
    /// (its note names the HostedOLM). Failures are logged, never fatal: events are a
    /// courtesy, status is the truth.
    pub async fn publish(
        &self,
        hc: &HostedCluster,
        holm: &HostedOLM,
        transitions: &[Transition],
    ) -> usize {
        let on_holm = holm.object_ref(&());
        let on_hc = hc.object_ref(&());
        let holm_name = format!(
            "HostedOLM {}/{}",
            holm.metadata.namespace.as_deref().unwrap_or(""),
            holm.metadata.name.as_deref().unwrap_or("")
        );
        let mut published = 0;
        for (t, reference) in transitions.iter().flat_map(|t| {
            [
                (t.clone(), &on_holm),
                (for_hosted_cluster(t, &holm_name), &on_hc),
            ]
        }) {
            let ev = Event {
                type_: if t.warning {
                    EventType::Warning
                } else {
                    EventType::Normal
                },
                reason: t.reason.clone(),
                note: Some(t.note.clone()),
                action: "Reconcile".into(),
                secondary: None,
            };
            match self.recorder.publish(&ev, reference).await {
                Ok(()) => published += 1,
                Err(e) => tracing::warn!(
                    hostedolm = %format!(
                        "{}/{}",
                        holm.metadata.namespace.as_deref().unwrap_or(""),
                        holm.metadata.name.as_deref().unwrap_or("")
                    ),
                    reason = %t.reason,
                    error = %e,
                    "cannot publish event"
                ),
            }
        }
        published
    }
}

impl Events {
    /// One Warning event on the HostedCluster (for problems that leave no HostedOLM to
    /// report on, such as an HCP namespace that is not this HostedCluster's).
    pub async fn warn_hosted_cluster(&self, hc: &HostedCluster, reason: &str, note: &str) {
        self.on_hosted_cluster(hc, EventType::Warning, reason, note)
            .await
    }

    /// One Normal event on the HostedCluster (a change we made to it).
    pub async fn normal_hosted_cluster(&self, hc: &HostedCluster, reason: &str, note: &str) {
        self.on_hosted_cluster(hc, EventType::Normal, reason, note)
            .await
    }

    async fn on_hosted_cluster(
        &self,
        hc: &HostedCluster,
        type_: EventType,
        reason: &str,
        note: &str,
    ) {
        let mut note = note.to_string();
        truncate_note(&mut note);
        let ev = Event {
            type_,
            reason: reason.into(),
            note: Some(note),
            action: "Reconcile".into(),
            secondary: None,
        };
        if let Err(e) = self.recorder.publish(&ev, &hc.object_ref(&())).await {
            tracing::warn!(%reason, error = %e, "cannot publish event");
        }
    }
}

/// The HostedCluster's copy of a transition: the note says which HostedOLM it is about,
/// within the 1 kB limit.
pub fn for_hosted_cluster(t: &Transition, holm: &str) -> Transition {
    let mut note = format!("{holm}: {}", t.note);
    truncate_note(&mut note);
    Transition { note, ..t.clone() }
}

fn truncate_note(note: &mut String) {
    // events.k8s.io limits the note to 1 kB.
    if note.len() > 1000 {
        let mut cut = 1000;
        while !note.is_char_boundary(cut) {
            cut -= 1;
        }
        note.truncate(cut);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    fn c(t: &str, s: &str, r: &str) -> Condition {
        Condition {
            type_: t.into(),
            status: s.into(),
            reason: r.into(),
            message: String::new(),
            observed_generation: None,
            last_transition_time: Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH),
        }
    }

    #[test]
    fn only_changes_of_reported_conditions() {
        let old = vec![
            c(AVAILABLE, "False", "ComponentsNotReady"),
            c(DEGRADED, "False", "AsExpected"),
            c("Progressing", "True", "X"),
        ];
        assert!(transitions(&old, &old).is_empty());
        let new = vec![
            c(AVAILABLE, "True", "AsExpected"),
            c(DEGRADED, "False", "AsExpected"),
            c("Progressing", "False", "AsExpected"),
        ];
        let t = transitions(&old, &new);
        assert_eq!(t.len(), 1, "{t:?}");
        assert_eq!((t[0].reason.as_str(), t[0].warning), ("Available", false));
        let bad = vec![
            c(AVAILABLE, "False", "Degraded"),
            c(DEGRADED, "True", "ApplyFailed"),
        ];
        let t = transitions(&new, &bad);
        assert_eq!(t.len(), 2);
        assert!(t.iter().any(|t| t.reason == "ApplyFailed" && t.warning));
        // Same status, new reason: a transition.
        let other = vec![c(DEGRADED, "True", "GuestKubeconfigMissing")];
        assert_eq!(transitions(&bad, &other).len(), 1);
        // First status: every reported condition is new.
        assert_eq!(transitions(&[], &new).len(), 2);
    }
}
