//! The alerts shipped in `manifests/monitoring` (issue 39 item 4), checked with the real
//! `promtool` (built from its Go module like the other upstream tools: `make tools`): the rules
//! file passes `promtool check rules`, its unit tests (`tests/alerts.test.yaml`: a firing and a
//! quiet case for each alert) pass `promtool test rules`, the PrometheusRule carries exactly
//! those rules, and the alerts read only metrics we export or the cluster's standard ones.
//! Fails, never skips, when promtool is missing.

use std::path::PathBuf;
use std::process::Command;

use serde_yaml_ng::Value;

fn monitoring() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../manifests/monitoring")
}

fn yaml(path: &std::path::Path) -> Value {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_yaml_ng::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn promtool(args: &[&str]) -> String {
    let bin = hcp_olm_e2e::tools::bin("promtool").unwrap_or_else(|e| panic!("{e}"));
    let out = Command::new(bin)
        .args(args)
        .current_dir(monitoring())
        .output()
        .expect("running promtool");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "promtool {args:?}:\n{text}");
    text
}

fn alert_names(rules: &Value) -> Vec<String> {
    rules["groups"]
        .as_sequence()
        .into_iter()
        .flatten()
        .flat_map(|g| g["rules"].as_sequence().cloned().unwrap_or_default())
        .filter_map(|r| r["alert"].as_str().map(str::to_string))
        .collect()
}

#[test]
fn promtool_checks_the_rules_and_their_unit_tests_pass() {
    let out = promtool(&["check", "rules", "alerts.rules.yaml"]);
    eprintln!("{out}");
    let rules = yaml(&monitoring().join("alerts.rules.yaml"));
    let names = alert_names(&rules);
    assert!(
        out.contains(&format!("SUCCESS: {} rules found", names.len())),
        "{out}"
    );
    let out = promtool(&["test", "rules", "tests/alerts.test.yaml"]);
    eprintln!("{out}");
    assert!(out.contains("SUCCESS"), "{out}");
    // Every alert has a case where it fires (the quiet cases sit beside them).
    let tests = yaml(&monitoring().join("tests/alerts.test.yaml"));
    for name in &names {
        let fires = tests["tests"]
            .as_sequence()
            .into_iter()
            .flatten()
            .flat_map(|t| {
                t["alert_rule_test"]
                    .as_sequence()
                    .cloned()
                    .unwrap_or_default()
            })
            .any(|a| {
                a["alertname"].as_str() == Some(name.as_str())
                    && a["exp_alerts"].as_sequence().is_some_and(|e| !e.is_empty())
            });
        assert!(fires, "no unit test where {name} fires");
    }
}

#[test]
fn the_prometheus_rule_carries_exactly_the_rules_file() {
    let rules = yaml(&monitoring().join("alerts.rules.yaml"));
    let pr = yaml(&monitoring().join("prometheusrule.yaml"));
    assert_eq!(pr["kind"], Value::from("PrometheusRule"));
    assert_eq!(
        pr["spec"]["groups"], rules["groups"],
        "regenerate prometheusrule.yaml from alerts.rules.yaml"
    );
    let kustomization = yaml(&monitoring().join("kustomization.yaml"));
    let resources: Vec<&str> = kustomization["resources"]
        .as_sequence()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect();
    for f in ["prometheusrule.yaml", "servicemonitor.yaml"] {
        assert!(resources.contains(&f), "{f} not in the kustomization");
    }
}

/// The alerts' hcp_olm_* metrics are ones our binaries export (a renamed metric would leave
/// an alert that never fires).
#[test]
fn alerts_read_metrics_we_export() {
    let text = std::fs::read_to_string(monitoring().join("alerts.rules.yaml")).expect("rules");
    let mut used: Vec<&str> = text
        .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .filter(|w| w.starts_with("hcp_olm_"))
        .collect();
    used.sort();
    used.dedup();
    let m = hcp_olm_controlplane::runtime::metrics::Metrics::default();
    m.error("x", std::time::Duration::ZERO);
    m.set_leader(Some(true));
    m.set_fleet_source(Box::new(|| {
        let mut h = hcp_olm_controlplane::hostedolm::HostedOLM::new("a", Default::default());
        h.metadata.namespace = Some("clusters-a".into());
        vec![std::sync::Arc::new(h)]
    }));
    let controller = m.encode();
    for name in used {
        let ours = controller.contains(&format!("# TYPE {name} "))
            || controller.contains(&format!("# TYPE {} ", name.trim_end_matches("_total")));
        // the tunnel daemons' (guest-agent/src/daemon.rs tests list it)
        let tunnel = name == "hcp_olm_tunnel_last_handshake_timestamp_seconds";
        assert!(ours || tunnel, "{name} is not a metric of ours");
    }
}

/// The Grafana dashboard (issue 39 item 4): every panel query parses as PromQL in the real
/// promtool (as recording rules, `promtool check rules`), and reads only metrics we export
/// or the cluster's standard container metrics.
#[test]
fn the_dashboard_queries_pass_promtool_and_read_our_metrics() {
    let path = monitoring().join("dashboards/hcp-olm.json");
    let d: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).expect("dashboard")).expect("JSON");
    let mut rules = Vec::new();
    let mut ids = std::collections::BTreeSet::new();
    for p in d["panels"].as_array().expect("panels") {
        let id = p["id"].as_u64().expect("panel id");
        assert!(ids.insert(id), "panel id {id} twice");
        let targets = p["targets"].as_array().expect("targets");
        assert!(!targets.is_empty(), "panel {id} has no query");
        for t in targets {
            let expr = t["expr"].as_str().expect("expr");
            rules.push(serde_json::json!({
                "record": format!("hcp_olm:dashboard:panel{id}_{}", t["refId"].as_str().unwrap_or("A")),
                "expr": expr,
            }));
        }
    }
    let file = serde_json::json!({"groups": [{"name": "dashboard", "rules": rules}]});
    let dir = tempfile::tempdir().expect("tempdir");
    let rules_path = dir.path().join("dashboard.rules.yaml");
    std::fs::write(&rules_path, serde_yaml_ng::to_string(&file).expect("yaml")).expect("write");
    let out = promtool(&["check", "rules", rules_path.to_str().expect("utf-8")]);
    assert!(
        out.contains(&format!("SUCCESS: {} rules found", rules.len())),
        "{out}"
    );
    // Metric names: ours (the controller's registry, or the tunnel daemons') or cAdvisor's.
    let m = hcp_olm_controlplane::runtime::metrics::Metrics::default();
    m.error("x", std::time::Duration::ZERO);
    m.writes(1, 1, true);
    m.metrics_request("allowed");
    m.set_fleet_source(Box::new(|| {
        let mut h = hcp_olm_controlplane::hostedolm::HostedOLM::new("a", Default::default());
        h.metadata.namespace = Some("clusters-a".into());
        vec![std::sync::Arc::new(h)]
    }));
    let controller = m.encode();
    let tunnel = [
        "hcp_olm_tunnel_last_handshake_timestamp_seconds",
        "hcp_olm_tunnel_payload_bytes_total",
    ];
    for r in &rules {
        let expr = r["expr"].as_str().expect("expr");
        for name in expr
            .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .filter(|w| w.starts_with("hcp_olm_") || w.starts_with("container_"))
        {
            let base = name.trim_end_matches("_bucket").trim_end_matches("_total");
            let ours = controller.contains(&format!("# TYPE {base} "))
                || controller.contains(&format!("# TYPE {name} "));
            assert!(
                ours || tunnel.contains(&name) || name == "container_memory_working_set_bytes",
                "dashboard query {expr:?} reads {name}, which nobody exports"
            );
        }
    }
}
