//! Why a component's pods are not ready, in the kubelet's and the scheduler's own words: a
//! Deployment says only how many replicas are ready; its pods say `ImagePullBackOff` (and
//! which image), `Unschedulable` (and why), `CrashLoopBackOff`. Pure.

use k8s_openapi::api::core::v1::{ContainerStatus, Pod};

/// Longest message kept (pod status text comes from the kubelet, the scheduler and the
/// registry, and ends up in HostedOLM status).
pub const MAX_MESSAGE: usize = 512;

/// Container waiting reasons that explain an unready pod. `ContainerCreating` and
/// `PodInitializing` are progress, not problems.
const WAITING_PROBLEMS: &[&str] = &[
    "ErrImagePull",
    "ImagePullBackOff",
    "InvalidImageName",
    "ErrImageNeverPull",
    "CreateContainerConfigError",
    "CreateContainerError",
    "RunContainerError",
    "CrashLoopBackOff",
];

/// A pod problem: the reason as Kubernetes names it and a message naming the pod, the
/// container and its image.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Problem {
    pub reason: String,
    pub message: String,
}

/// A reason as Kubernetes writes them (`CamelCase`, at most 64 characters); anything else (a
/// guest's pod status is the guest's to write) is not passed on.
pub fn valid_reason(r: &str) -> bool {
    let mut chars = r.chars();
    chars.next().is_some_and(|c| c.is_ascii_alphabetic())
        && r.len() <= 64
        && chars.all(|c| c.is_ascii_alphanumeric())
}

/// `s` made fit for status: control characters dropped, URL query strings (signed blob
/// URLs of a registry's redirects) cut, at most [`MAX_MESSAGE`] bytes plus an ellipsis. One
/// pass that stops at the bound: pod text can be a guest's, of any length.
pub fn bounded(s: String) -> String {
    let mut out = String::with_capacity(s.len().min(MAX_MESSAGE + 4));
    let mut in_query = false;
    let mut seen_scheme = false;
    for c in s.chars() {
        if out.len() > MAX_MESSAGE {
            break;
        }
        if c.is_control() {
            continue;
        }
        if in_query {
            if c.is_whitespace() || c == '"' || c == '\'' {
                in_query = false;
            } else {
                continue;
            }
        } else if c == '?' && seen_scheme {
            in_query = true;
            out.push_str("?…");
            continue;
        }
        out.push(c);
        seen_scheme = seen_scheme || out.ends_with("://");
    }
    let mut s = out;
    if s.len() > MAX_MESSAGE {
        let mut cut = MAX_MESSAGE;
        while !s.is_char_boundary(cut) {
            cut -= 1;
        }
        s.truncate(cut);
        s.push('…');
    }
    s
}

/// The most a termination message is looked at (the kubelet writes at most 4 KiB).
const MAX_TERMINATION_MESSAGE: usize = 4096;

/// `text` with credentials a log line may carry cut: the word after `Bearer`, and the value
/// after `token=`, `password=` or `secret=` (any case).
pub fn redact_credentials(text: &str) -> String {
    let lower = text.to_ascii_lowercase();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    while i < text.len() {
        let rest = &lower[i..];
        let key = ["bearer ", "token=", "password=", "secret="]
            .into_iter()
            .find(|k| rest.starts_with(k));
        match key {
            Some(k) => {
                out.push_str(&text[i..i + k.len()]);
                out.push('…');
                i += k.len();
                // the value: up to white space, a quote, `&` or `,`
                while let Some(c) = text[i..].chars().next() {
                    if c.is_whitespace() || matches!(c, '"' | '\'' | '&' | ',') {
                        break;
                    }
                    i += c.len_utf8();
                }
            }
            None => {
                let c = text[i..].chars().next().unwrap_or_default();
                out.push(c);
                i += c.len_utf8().max(1);
            }
        }
    }
    out
}

fn container_problem(pod: &str, c: &ContainerStatus) -> Option<Problem> {
    let w = c.state.as_ref()?.waiting.as_ref()?;
    let reason = w.reason.as_deref()?;
    if !WAITING_PROBLEMS.contains(&reason) {
        return None;
    }
    let detail = w.message.as_deref().unwrap_or_default().trim();
    let mut message = format!("pod {pod}, container {} (image {})", c.name, c.image);
    // A crash loop: how the container last ended comes first (the rendered containers'
    // `FallbackToLogsOnError` makes that the tail of its log), the back-off after it.
    let last = c.last_state.as_ref().and_then(|l| l.terminated.as_ref());
    if let Some(t) = last.filter(|_| reason == "CrashLoopBackOff") {
        message.push_str(&format!(" exited {}", t.exit_code));
        if let Some(r) = t.reason.as_deref().filter(|r| valid_reason(r)) {
            message.push_str(&format!(" ({r})"));
        }
        if let Some(m) = t
            .message
            .as_deref()
            .map(str::trim)
            .filter(|m| !m.is_empty())
        {
            message.push_str(": ");
            // the last lines say why; only the end of a long text is looked at
            let mut from = m.len().saturating_sub(MAX_TERMINATION_MESSAGE);
            while !m.is_char_boundary(from) {
                from += 1;
            }
            let tail: Vec<&str> = m[from..].lines().rev().take(3).collect();
            let tail = tail.into_iter().rev().collect::<Vec<_>>().join(" | ");
            message.push_str(&redact_credentials(&tail));
        }
        if !detail.is_empty() {
            message.push_str("; ");
            message.push_str(detail);
        }
    } else if !detail.is_empty() {
        message.push_str(": ");
        message.push_str(detail);
    }
    Some(Problem {
        reason: reason.to_string(),
        message: bounded(message),
    })
}

/// The first problem among `pods`, most telling first: a pod the scheduler cannot place;
/// then, pod by pod (by name), its init containers, then its containers that cannot start or
/// keep crashing. `None` when the pods are only on their way (creating, pulling, probing).
pub fn problem<'a>(pods: impl IntoIterator<Item = &'a Pod>) -> Option<Problem> {
    let mut pods: Vec<&Pod> = pods.into_iter().collect();
    // Stable order: the same pods give the same answer (status is written only on change).
    pods.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
    let name = |p: &Pod| p.metadata.name.clone().unwrap_or_default();
    for p in &pods {
        let Some(s) = p.status.as_ref() else { continue };
        if let Some(c) = s.conditions.iter().flatten().find(|c| {
            c.type_ == "PodScheduled"
                && c.status == "False"
                && c.reason.as_deref().is_some_and(valid_reason)
        }) {
            return Some(Problem {
                reason: c.reason.clone().unwrap_or_default(),
                message: bounded(format!(
                    "pod {}: {}",
                    name(p),
                    c.message.as_deref().unwrap_or_default().trim()
                )),
            });
        }
    }
    for p in &pods {
        let Some(s) = p.status.as_ref() else { continue };
        let statuses = s
            .init_container_statuses
            .iter()
            .flatten()
            .chain(s.container_statuses.iter().flatten());
        for c in statuses {
            if let Some(problem) = container_problem(&name(p), c) {
                return Some(problem);
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(name: &str, status: serde_json::Value) -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "namespace": "n"},
            "status": status,
        }))
        .unwrap()
    }

    /// A status as the real kubelet wrote it (hcp-olm's real-node test, wrong pull secret).
    fn image_pull_backoff(name: &str) -> Pod {
        pod(
            name,
            serde_json::json!({
                "phase": "Pending",
                "conditions": [{"type": "PodScheduled", "status": "True"},
                               {"type": "Ready", "status": "False", "reason": "ContainersNotReady"}],
                "containerStatuses": [{
                    "name": "catalog-server", "image": "198.19.200.1:5000/hcp-olm/cs:test",
                    "imageID": "", "ready": false, "restartCount": 0,
                    "state": {"waiting": {"reason": "ImagePullBackOff",
                        "message": "Back-off pulling image \"198.19.200.1:5000/hcp-olm/cs:test\": ErrImagePull: failed to authorize: 401 Unauthorized"}},
                }],
            }),
        )
    }

    #[test]
    fn image_pull_failures_name_the_image_and_why() {
        let p = problem([&image_pull_backoff("a")]).unwrap();
        assert_eq!(p.reason, "ImagePullBackOff");
        assert!(p.message.starts_with(
            "pod a, container catalog-server (image 198.19.200.1:5000/hcp-olm/cs:test): Back-off"
        ));
        assert!(p.message.contains("401 Unauthorized"));
    }

    /// As the real kubelet wrote it for our gateway that could not read its configuration
    /// (real-node test, before pods got fsGroup 1001), with `FallbackToLogsOnError`.
    #[test]
    fn crash_loops_say_how_the_container_last_ended() {
        let p = pod(
            "gw",
            serde_json::json!({"containerStatuses": [{
                "name": "gateway", "image": "reg/gw@sha256:00", "imageID": "", "ready": false,
                "restartCount": 5,
                "lastState": {"terminated": {"exitCode": 64, "reason": "Error",
                    "message": "starting\nhcp-olm-gateway: invalid configuration: config field `--config`: cannot read /etc/hcp-olm/tunnel/config.json: Permission denied (os error 13)\n"}},
                "state": {"waiting": {"reason": "CrashLoopBackOff",
                    "message": "back-off 2m40s restarting failed container=gateway pod=gw"}}}]}),
        );
        let got = problem([&p]).unwrap();
        assert_eq!(got.reason, "CrashLoopBackOff");
        assert_eq!(
            got.message,
            "pod gw, container gateway (image reg/gw@sha256:00) exited 64 (Error): starting | hcp-olm-gateway: invalid configuration: config field `--config`: cannot read /etc/hcp-olm/tunnel/config.json: Permission denied (os error 13); back-off 2m40s restarting failed container=gateway pod=gw"
        );
        // A long log tail: its last three lines, bounded.
        let long = pod(
            "gw2",
            serde_json::json!({"containerStatuses": [{
                "name": "gateway", "image": "i", "imageID": "", "ready": false, "restartCount": 1,
                "lastState": {"terminated": {"exitCode": 1,
                    "message": (0..100).map(|i| format!("line {i}")).collect::<Vec<_>>().join("\n")}},
                "state": {"waiting": {"reason": "CrashLoopBackOff"}}}]}),
        );
        let got = problem([&long]).unwrap();
        assert_eq!(
            got.message,
            "pod gw2, container gateway (image i) exited 1: line 97 | line 98 | line 99"
        );
        // Credentials a log line carries are cut; an old crash does not explain a pull.
        let leaky = pod(
            "gw3",
            serde_json::json!({"containerStatuses": [{
                "name": "gateway", "image": "i", "imageID": "", "ready": false, "restartCount": 1,
                "lastState": {"terminated": {"exitCode": 1, "reason": "made up!",
                    "message": "GET / Authorization: Bearer eyJhbGc.x.y, url?x=1 token=abc&password=hunter2"}},
                "state": {"waiting": {"reason": "CrashLoopBackOff"}}}]}),
        );
        assert_eq!(
            problem([&leaky]).unwrap().message,
            "pod gw3, container gateway (image i) exited 1: GET / Authorization: Bearer …, url?x=1 token=…&password=…"
        );
        let mut pulling = leaky.clone();
        pulling
            .status
            .as_mut()
            .unwrap()
            .container_statuses
            .as_mut()
            .unwrap()[0]
            .state
            .as_mut()
            .unwrap()
            .waiting = Some(k8s_openapi::api::core::v1::ContainerStateWaiting {
            reason: Some("ImagePullBackOff".into()),
            message: Some("Back-off pulling image".into()),
        });
        assert_eq!(
            problem([&pulling]).unwrap().message,
            "pod gw3, container gateway (image i): Back-off pulling image"
        );
    }

    /// Hostile pod status (a guest admin writes the agent pod's): a megabyte of `?` and one
    /// long line are cut at the bound, in one pass over at most the bound.
    #[test]
    fn hostile_text_is_bounded_in_linear_time() {
        let qs = "?".repeat(1 << 20);
        let got = bounded(qs.clone());
        assert!(got.len() <= MAX_MESSAGE + '…'.len_utf8(), "{}", got.len());
        let got = bounded(format!("see https://x{qs}"));
        assert_eq!(got, "see https://x?…");
        let p = pod(
            "agent",
            serde_json::json!({"containerStatuses": [{
                "name": "agent", "image": "i", "imageID": "", "ready": false, "restartCount": 9,
                "lastState": {"terminated": {"exitCode": 2, "reason": "Error",
                    "message": format!("{}\u{1b}[31mred\u{7}", "x".repeat(10_000))}},
                "state": {"waiting": {"reason": "CrashLoopBackOff", "message": qs}}}]}),
        );
        let got = problem([&p]).unwrap();
        assert!(got.message.len() <= MAX_MESSAGE + '…'.len_utf8());
        assert!(
            !got.message.chars().any(char::is_control),
            "{:?}",
            got.message
        );
    }

    #[test]
    fn unschedulable_comes_first_and_progress_is_no_problem() {
        let creating = pod(
            "b",
            serde_json::json!({"containerStatuses": [{"name": "c", "image": "i", "imageID": "",
                "ready": false, "restartCount": 0,
                "state": {"waiting": {"reason": "ContainerCreating"}}}]}),
        );
        assert_eq!(problem([&creating]), None);
        let unschedulable = pod(
            "z",
            serde_json::json!({"phase": "Pending", "conditions": [{"type": "PodScheduled",
                "status": "False", "reason": "Unschedulable",
                "message": "0/1 nodes are available: 1 Insufficient memory."}]}),
        );
        let p = problem([&image_pull_backoff("a"), &creating, &unschedulable]).unwrap();
        assert_eq!(p.reason, "Unschedulable");
        assert_eq!(
            p.message,
            "pod z: 0/1 nodes are available: 1 Insufficient memory."
        );
    }

    #[test]
    fn init_containers_and_crash_loops_count_and_messages_are_bounded() {
        let p = pod(
            "c",
            serde_json::json!({
                "initContainerStatuses": [{"name": "copy", "image": "x", "imageID": "",
                    "ready": false, "restartCount": 3,
                    "state": {"waiting": {"reason": "CrashLoopBackOff", "message": "é".repeat(1000)}}}],
            }),
        );
        let got = problem([&p]).unwrap();
        assert_eq!(got.reason, "CrashLoopBackOff");
        assert!(
            got.message
                .starts_with("pod c, container copy (image x): é")
        );
        assert!(got.message.len() <= MAX_MESSAGE + '…'.len_utf8());
        // Made-up reasons are not passed on; control characters and query strings are cut.
        let odd = pod(
            "d",
            serde_json::json!({"conditions": [{"type": "PodScheduled", "status": "False",
                "reason": "Not a reason\nat all", "message": "m"}]}),
        );
        assert_eq!(problem([&odd]), None);
        assert!(valid_reason("ImagePullBackOff") && !valid_reason("") && !valid_reason("a b"));
        assert!(!valid_reason(&"A".repeat(65)));
        assert_eq!(
            bounded("pull \"https://blob.example/x?X-Sig=secret&e=1\": 403\r\nForbidden".into()),
            "pull \"https://blob.example/x?…\": 403Forbidden"
        );
        // Order does not depend on the order given.
        let a = image_pull_backoff("a");
        assert_eq!(problem([&p, &a]), problem([&a, &p]));
    }
}
