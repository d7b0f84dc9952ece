//! The Helm chart `charts/hcp-olm` (issue 39 item 3), with the real `helm` built from its Go
//! module like the other upstream tools (`make tools`): `helm lint`, `helm template` against
//! golden files, every rendered controller argument accepted by the controller's own flag
//! check, the chart's copies of `manifests/` unchanged, and `helm install` / `upgrade` /
//! `uninstall` against a real kube-apiserver. Fails, never skips, when helm is missing.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::rbac::v1::ClusterRole;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::Api;
use serde_yaml_ng::Value;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn chart() -> PathBuf {
    repo().join("charts/hcp-olm")
}

fn helm_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/helm")
}

/// `helm` with its cache, config and data in `home` (never the user's).
fn helm(home: &Path, args: &[&str]) -> Output {
    let bin = hcp_olm_e2e::tools::bin("helm").unwrap_or_else(|e| panic!("{e}"));
    Command::new(bin)
        .args(args)
        .env("HELM_CACHE_HOME", home.join("cache"))
        .env("HELM_CONFIG_HOME", home.join("config"))
        .env("HELM_DATA_HOME", home.join("data"))
        .env_remove("KUBECONFIG")
        .current_dir(repo())
        .output()
        .expect("running helm")
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

fn ok(home: &Path, args: &[&str]) -> String {
    let out = helm(home, args);
    assert!(out.status.success(), "helm {args:?}:\n{}", text(&out));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The Kubernetes version of the test clusters (`e2e/tools/versions.env`): `helm template`
/// assumes v1.20 unless told, below the chart's `kubeVersion`.
fn kube_version() -> String {
    let env = std::fs::read_to_string(repo().join("e2e/tools/versions.env")).expect("versions.env");
    env.lines()
        .find_map(|l| l.strip_prefix("KUBE_VERSION="))
        .expect("KUBE_VERSION")
        .trim()
        .to_string()
}

fn template(home: &Path, extra: &[&str]) -> String {
    let chart = chart();
    let kube = kube_version();
    let mut args = vec![
        "template",
        "hcp-olm",
        chart.to_str().expect("utf-8 path"),
        "--namespace",
        "hcp-olm-system",
        "--kube-version",
        &kube,
    ];
    args.extend_from_slice(extra);
    ok(home, &args)
}

fn docs(stream: &str) -> Vec<Value> {
    serde_yaml_ng::Deserializer::from_str(stream)
        .map(|d| serde::Deserialize::deserialize(d).expect("rendered YAML"))
        .filter(|v: &Value| !v.is_null())
        .collect()
}

fn golden(name: &str, actual: &str) {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/golden")
        .join(name);
    if std::env::var("UPDATE_GOLDEN").as_deref() == Ok("1") {
        std::fs::write(&path, actual).expect("writing golden");
        return;
    }
    let want = std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!(
            "{}: {e}; run with UPDATE_GOLDEN=1 to create it",
            path.display()
        )
    });
    assert!(
        want == actual,
        "golden file {} differs (UPDATE_GOLDEN=1 rewrites):\n{}",
        path.display(),
        first_difference(&want, actual)
    );
}

fn first_difference(a: &str, b: &str) -> String {
    for (i, (x, y)) in a.lines().zip(b.lines()).enumerate() {
        if x != y {
            return format!("line {}: want {x:?}, got {y:?}", i + 1);
        }
    }
    format!(
        "lengths {} and {} lines",
        a.lines().count(),
        b.lines().count()
    )
}

fn deployment(objects: &[Value]) -> &Value {
    objects
        .iter()
        .find(|o| o["kind"] == "Deployment")
        .expect("a Deployment")
}

fn args(objects: &[Value]) -> Vec<String> {
    deployment(objects)["spec"]["template"]["spec"]["containers"][0]["args"]
        .as_sequence()
        .expect("args")
        .iter()
        .map(|a| a.as_str().expect("string arg").to_string())
        .collect()
}

/// `kustomize` (built from its Go module like helm), run in the repository.
fn kustomize(args: &[&str]) -> String {
    let bin = hcp_olm_e2e::tools::bin("kustomize").unwrap_or_else(|e| panic!("{e}"));
    let out = Command::new(bin)
        .args(args)
        .current_dir(repo())
        .output()
        .expect("running kustomize");
    assert!(out.status.success(), "kustomize {args:?}:\n{}", text(&out));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Runs the controller binary on `args` plus `--check-config`.
fn check_config(args: &[String]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_hcp-olm-controller"))
        .args(args)
        .arg("--check-config")
        .env_remove("HCP_OLM_OLM_IMAGE")
        .env_remove("HCP_OLM_OPERATOR_REGISTRY_IMAGE")
        .output()
        .expect("running hcp-olm-controller")
}

#[test]
fn the_chart_carries_unchanged_copies_of_the_manifests_and_the_workspace_version() {
    let pairs = [
        ("crds/hostedolm.yaml", "manifests/crds/hostedolm.yaml"),
        (
            "files/serviceaccount.yaml",
            "manifests/controller/serviceaccount.yaml",
        ),
        (
            "files/clusterrole.yaml",
            "manifests/controller/clusterrole.yaml",
        ),
        (
            "files/clusterrolebinding.yaml",
            "manifests/controller/clusterrolebinding.yaml",
        ),
        (
            "files/auth-delegator.yaml",
            "manifests/controller/auth-delegator.yaml",
        ),
        (
            "files/leader-election-role.yaml",
            "manifests/controller/leader-election-role.yaml",
        ),
        (
            "files/admission-policy.yaml",
            "manifests/controller/admission-policy.yaml",
        ),
        (
            "files/prometheusrule.yaml",
            "manifests/monitoring/prometheusrule.yaml",
        ),
        (
            "files/dashboard.json",
            "manifests/monitoring/dashboards/hcp-olm.json",
        ),
    ];
    for (copy, source) in pairs {
        let a = std::fs::read_to_string(chart().join(copy)).expect(copy);
        let b = std::fs::read_to_string(repo().join(source)).expect(source);
        assert!(
            a == b,
            "charts/hcp-olm/{copy} differs from {source}: copy it again (`make chart-sync`)"
        );
    }
    let meta: Value = serde_yaml_ng::from_str(
        &std::fs::read_to_string(chart().join("Chart.yaml")).expect("Chart.yaml"),
    )
    .expect("Chart.yaml");
    let v = env!("CARGO_PKG_VERSION");
    assert_eq!(meta["version"].as_str(), Some(v), "Chart.yaml version");
    assert_eq!(
        meta["appVersion"].as_str(),
        Some(v),
        "Chart.yaml appVersion"
    );
}

#[test]
fn helm_lint_and_template_golden() {
    let home = tempfile::tempdir().expect("tempdir");
    let chart = chart();
    let chart = chart.to_str().expect("utf-8 path");
    let out = ok(
        home.path(),
        &["lint", "--strict", chart, "--namespace", "hcp-olm-system"],
    );
    assert!(out.contains("0 chart(s) failed"), "{out}");
    let all = helm_dir().join("all-values.yaml");
    let out = ok(
        home.path(),
        &[
            "lint",
            "--strict",
            chart,
            "--namespace",
            "hcp-olm-system",
            "-f",
            all.to_str().expect("utf-8"),
        ],
    );
    assert!(out.contains("0 chart(s) failed"), "{out}");

    let default = template(home.path(), &["--include-crds"]);
    golden("helm-default.yaml", &default);
    let every = template(
        home.path(),
        &["--include-crds", "-f", all.to_str().expect("utf-8")],
    );
    golden("helm-all-values.yaml", &every);

    // The default chart installs what `kubectl apply -k manifests/` does, but the Namespace
    // (Helm's release namespace, created beforehand).
    let kinds = |objects: &[Value]| {
        let mut v: Vec<String> = objects
            .iter()
            .map(|o| {
                format!(
                    "{} {} {}",
                    o["kind"].as_str().unwrap_or_default(),
                    o["metadata"]["namespace"].as_str().unwrap_or("-"),
                    o["metadata"]["name"].as_str().unwrap_or_default()
                )
            })
            .collect();
        v.sort();
        v
    };
    let from_manifests: Vec<Value> = docs(&kustomize(&["build", "manifests"]))
        .into_iter()
        .filter(|o| o["kind"] != "Namespace")
        .collect();
    assert_eq!(kinds(&docs(&default)), kinds(&from_manifests));
    // Monitoring on: the ServiceMonitor scrapes a port the Service has, and the
    // PrometheusRule is the one of manifests/monitoring.
    let with_monitoring = docs(&template(
        home.path(),
        &["--set", "monitoring.enabled=true"],
    ));
    let service = with_monitoring
        .iter()
        .find(|o| o["kind"] == "Service")
        .expect("Service");
    let monitor = with_monitoring
        .iter()
        .find(|o| o["kind"] == "ServiceMonitor")
        .expect("ServiceMonitor");
    let port = monitor["spec"]["endpoints"][0]["port"]
        .as_str()
        .expect("port");
    assert!(
        service["spec"]["ports"]
            .as_sequence()
            .expect("ports")
            .iter()
            .any(|p| p["name"].as_str() == Some(port)),
        "the ServiceMonitor scrapes port {port:?}, which the Service has not"
    );
    assert!(
        with_monitoring
            .iter()
            .any(|o| o["kind"] == "PrometheusRule")
    );
    let dashboard =
        std::fs::read_to_string(repo().join("manifests/monitoring/dashboards/hcp-olm.json"))
            .expect("dashboard");
    let cm = with_monitoring
        .iter()
        .find(|o| o["kind"] == "ConfigMap" && o["metadata"]["name"] == "hcp-olm-dashboard")
        .expect("the dashboard ConfigMap");
    assert_eq!(
        cm["data"]["hcp-olm.json"].as_str(),
        Some(dashboard.trim_end())
    );
}

/// Every flag of `hcp-olm-controller run` is listed in values.yaml, and the arguments the
/// chart renders (defaults, and every flag set) pass the controller's own flag check.
#[test]
fn every_controller_flag_is_settable_and_the_rendered_arguments_parse() {
    let help = Command::new(env!("CARGO_BIN_EXE_hcp-olm-controller"))
        .args(["run", "--help"])
        .output()
        .expect("run --help");
    let help = String::from_utf8_lossy(&help.stdout);
    let mut flags: Vec<&str> = help
        .split_whitespace()
        .filter_map(|w| w.trim_start_matches(['`', '(']).strip_prefix("--"))
        .map(|w| {
            let end = w
                .find(|c: char| !(c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-'))
                .unwrap_or(w.len());
            &w[..end]
        })
        .filter(|w| !w.is_empty() && !["help", "check-config", "log-format"].contains(w))
        .collect();
    flags.sort();
    flags.dedup();
    assert!(flags.len() > 30, "flags read from run --help: {flags:?}");
    let values = std::fs::read_to_string(chart().join("values.yaml")).expect("values.yaml");
    let all = std::fs::read_to_string(helm_dir().join("all-values.yaml")).expect("all-values");
    for f in &flags {
        assert!(
            values.contains(&format!(" {f} ")) || values.contains(&format!(" {f}\n")),
            "--{f} is not listed in charts/hcp-olm/values.yaml"
        );
        // The all-values test file sets it, directly or through the chart's own key.
        assert!(
            all.contains(&format!("{f}:")) || all.contains(&format!("# sets --{f}")),
            "--{f} is not set by controlplane/tests/helm/all-values.yaml"
        );
    }

    let home = tempfile::tempdir().expect("tempdir");
    let allf = helm_dir().join("all-values.yaml");
    for extra in [vec![], vec!["-f", allf.to_str().expect("utf-8")]] {
        let rendered = args(&docs(&template(home.path(), &extra)));
        let out = check_config(&rendered);
        assert!(
            out.status.success(),
            "{rendered:?} with --check-config:\n{}",
            text(&out)
        );
        for f in &flags {
            if !extra.is_empty() {
                assert!(
                    rendered.iter().any(|a| a.starts_with(&format!("--{f}="))),
                    "--{f} not rendered from all-values.yaml: {rendered:?}"
                );
            }
        }
    }
    // A bad value reaches the controller's check, which exits 64 naming the flag.
    let rendered = args(&docs(&template(
        home.path(),
        &["--set", "flags.concurrency=lots"],
    )));
    let out = check_config(&rendered);
    assert_eq!(out.status.code(), Some(64), "{}", text(&out));
    assert!(text(&out).contains("--concurrency"), "{}", text(&out));
}

/// The kustomize side: `manifests/` and `manifests/monitoring` build, and the example overlay
/// sets our images by digest, flags the controller accepts, resources and replicas.
#[test]
fn kustomize_builds_the_manifests_and_the_example_overlay() {
    let base = docs(&kustomize(&["build", "manifests"]));
    assert!(base.iter().any(|o| o["kind"] == "Deployment"));
    let monitoring = docs(&kustomize(&["build", "manifests/monitoring"]));
    let monitor = monitoring
        .iter()
        .find(|o| o["kind"] == "ServiceMonitor")
        .expect("ServiceMonitor");
    let port = monitor["spec"]["endpoints"][0]["port"]
        .as_str()
        .expect("port");
    let service = base
        .iter()
        .find(|o| o["kind"] == "Service" && o["metadata"]["name"] == "hcp-olm-controller-metrics")
        .expect("the metrics Service in manifests/");
    assert!(
        service["spec"]["ports"]
            .as_sequence()
            .expect("ports")
            .iter()
            .any(|p| p["name"].as_str() == Some(port)),
        "manifests/monitoring's ServiceMonitor scrapes port {port:?}, which the Service has not"
    );

    let dashboard =
        std::fs::read_to_string(repo().join("manifests/monitoring/dashboards/hcp-olm.json"))
            .expect("dashboard");
    let cm = monitoring
        .iter()
        .find(|o| o["kind"] == "ConfigMap" && o["metadata"]["name"] == "hcp-olm-dashboard")
        .expect("the dashboard ConfigMap in manifests/monitoring");
    assert_eq!(
        cm["data"]["hcp-olm.json"].as_str(),
        Some(dashboard.as_str())
    );
    assert_eq!(
        cm["metadata"]["labels"]["grafana_dashboard"].as_str(),
        Some("1")
    );

    let overlay = docs(&kustomize(&["build", "overlays/example"]));
    let d = deployment(&overlay);
    let c = &d["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(
        c["image"].as_str(),
        Some(
            "mirror.example:5000/hcp-olm/hcp-olm-controller@sha256:1111111111111111111111111111111111111111111111111111111111111111"
        )
    );
    assert_eq!(d["spec"]["replicas"].as_u64(), Some(3));
    assert_eq!(c["resources"]["limits"]["memory"].as_str(), Some("2Gi"));
    let rendered = args(&overlay);
    for want in [
        "--hosted-cluster-selector=hcp-olm.io/managed=true",
        "--catalog-sharing=Own",
        "--leader-elect=true",
    ] {
        assert!(
            rendered.iter().any(|a| a == want),
            "{want} not in {rendered:?}"
        );
    }
    for image in ["catalog-server", "tunnel-gateway", "guest-agent"] {
        assert!(
            rendered
                .iter()
                .any(|a| a.starts_with(&format!("--{image}-image=")) && a.contains("@sha256:")),
            "--{image}-image by digest not in {rendered:?}"
        );
    }
    let out = check_config(&rendered);
    assert!(out.status.success(), "{rendered:?}:\n{}", text(&out));
    // The overlay keeps everything else of manifests/.
    let names = |v: &[Value]| {
        let mut n: Vec<String> = v
            .iter()
            .map(|o| {
                format!(
                    "{} {}",
                    o["kind"].as_str().unwrap_or_default(),
                    o["metadata"]["name"].as_str().unwrap_or_default()
                )
            })
            .collect();
        n.sort();
        n
    };
    assert_eq!(names(&overlay), names(&base));
}

/// Values the chart itself refuses, each with a message naming the value.
#[test]
fn bad_values_are_refused_with_the_value_named() {
    let home = tempfile::tempdir().expect("tempdir");
    let chart = chart();
    let chart = chart.to_str().expect("utf-8 path");
    let kube = kube_version();
    for (mut args, says) in [
        (
            vec!["template", "x", chart, "--namespace", "default"],
            "hcp-olm-system only",
        ),
        (
            vec![
                "template",
                "x",
                chart,
                "--namespace",
                "hcp-olm-system",
                "--set",
                "image.controller.digest=latest",
            ],
            "image digest \"latest\"",
        ),
        (
            vec![
                "template",
                "x",
                chart,
                "--namespace",
                "hcp-olm-system",
                "--set",
                "flags.Bad_Flag=1",
            ],
            "\"Bad_Flag\" is not a flag name",
        ),
        (
            vec![
                "template",
                "x",
                chart,
                "--namespace",
                "hcp-olm-system",
                "--set",
                "replicas=0",
            ],
            "replicas: 0",
        ),
        (
            vec![
                "template",
                "x",
                chart,
                "--namespace",
                "hcp-olm-system",
                "--set",
                "catalogSharing=Everywhere",
            ],
            "catalogSharing",
        ),
    ] {
        args.extend(["--kube-version", &kube]);
        let out = helm(home.path(), &args);
        assert!(!out.status.success(), "helm {args:?} succeeded");
        assert!(text(&out).contains(says), "helm {args:?}: {}", text(&out));
    }
}

/// `helm install`, `upgrade` and `uninstall` against a real kube-apiserver (the demo's kind of
/// management cluster): the objects appear, an upgrade moves the controller to an image by
/// digest with a changed flag, and an uninstall removes everything but the CRD (Helm keeps
/// `crds/`, so HostedOLM objects survive; `hcp-olm uninstall` removes hcp-olm's own objects).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn helm_install_upgrade_and_uninstall_on_a_real_api_server() {
    let cluster = hcp_olm_e2e::Cluster::start(hcp_olm_e2e::ClusterOptions::new("helm"))
        .await
        .expect("cluster");
    cluster
        .ensure_namespace("hcp-olm-system")
        .await
        .expect("namespace");
    let home = tempfile::tempdir().expect("tempdir");
    let kubeconfig = cluster.kubeconfig().to_str().expect("utf-8").to_string();
    let chart = chart();
    let chart = chart.to_str().expect("utf-8 path").to_string();
    let base = |verb: &'static str| {
        vec![
            verb.to_string(),
            "hcp-olm".to_string(),
            chart.clone(),
            "--namespace".into(),
            "hcp-olm-system".into(),
            "--kubeconfig".into(),
            kubeconfig.clone(),
        ]
    };
    let run = |args: Vec<String>| {
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        ok(home.path(), &refs)
    };
    run(base("install"));
    let client = cluster.client();
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), "hcp-olm-system");
    let d = deployments
        .get("hcp-olm-controller")
        .await
        .expect("Deployment");
    let image = |d: &Deployment| {
        d.spec
            .as_ref()
            .expect("spec")
            .template
            .spec
            .as_ref()
            .expect("pod")
            .containers[0]
            .image
            .clone()
            .unwrap_or_default()
    };
    let version = env!("CARGO_PKG_VERSION");
    assert_eq!(
        image(&d),
        format!("quay.io/hcp-olm/hcp-olm-controller:v{version}")
    );
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    crds.get("hostedolms.olm.hcp-olm.io")
        .await
        .expect("CRD installed");
    let roles: Api<ClusterRole> = Api::all(client.clone());
    roles.get("hcp-olm-controller").await.expect("ClusterRole");

    let digest = format!("sha256:{}", "ab".repeat(32));
    let mut up = base("upgrade");
    up.extend([
        "--set".into(),
        format!("image.controller.digest={digest}"),
        "--set".into(),
        "flags.concurrency=8".into(),
        "--set".into(),
        "hostedClusterSelector=hcp-olm.io/managed=true".into(),
    ]);
    run(up);
    let d = deployments
        .get("hcp-olm-controller")
        .await
        .expect("Deployment");
    assert_eq!(
        image(&d),
        format!("quay.io/hcp-olm/hcp-olm-controller@{digest}")
    );
    let args = d
        .spec
        .as_ref()
        .expect("spec")
        .template
        .spec
        .as_ref()
        .expect("pod")
        .containers[0]
        .args
        .clone()
        .unwrap_or_default();
    assert!(args.contains(&"--concurrency=8".to_string()), "{args:?}");
    assert!(
        args.contains(&"--hosted-cluster-selector=hcp-olm.io/managed=true".to_string()),
        "{args:?}"
    );
    let history = run(vec![
        "history".into(),
        "hcp-olm".into(),
        "--namespace".into(),
        "hcp-olm-system".into(),
        "--kubeconfig".into(),
        kubeconfig.clone(),
    ]);
    assert!(history.lines().count() >= 3, "{history}");

    run(vec![
        "uninstall".into(),
        "hcp-olm".into(),
        "--namespace".into(),
        "hcp-olm-system".into(),
        "--kubeconfig".into(),
        kubeconfig.clone(),
        "--wait".into(),
        "--timeout".into(),
        "60s".into(),
    ]);
    assert!(
        deployments
            .get_opt("hcp-olm-controller")
            .await
            .expect("get")
            .is_none(),
        "Deployment left after helm uninstall"
    );
    assert!(
        roles
            .get_opt("hcp-olm-controller")
            .await
            .expect("get")
            .is_none(),
        "ClusterRole left after helm uninstall"
    );
    assert!(
        crds.get_opt("hostedolms.olm.hcp-olm.io")
            .await
            .expect("get")
            .is_some(),
        "Helm keeps crds/: the HostedOLM CRD (and every HostedOLM) stays"
    );
}
