use super::*;
use crate::kubelet::image::Image;
use serde_json::json;

fn spec(v: serde_json::Value) -> PodSpec {
    serde_json::from_value(v).unwrap()
}

fn store() -> ImageStore {
    let mut s = ImageStore::new();
    s.insert(
        "olm@sha256:aa",
        Image::new()
            .file("/bin/catalog", "/x/catalog")
            .file("/bin/olm", "/x/olm")
            .file("/bin/cp", "/x/cp"),
    );
    s.insert(
        "index:v4.18",
        Image::new()
            .file("/bin/opm", "/x/opm")
            .entrypoint(&["/bin/opm"]),
    );
    s
}

fn node() -> NodeFacts {
    NodeFacts {
        api_host: "198.18.0.1".into(),
        api_port: 6443,
        pod_ip: "198.18.1.2".into(),
        node_name: "node-a".into(),
        service_account: Some(ServiceAccountFiles {
            token: "tok".into(),
            ca_crt: b"CA".to_vec(),
        }),
    }
}

fn objects() -> Objects {
    let mut o = Objects::default();
    o.secrets.insert(
        ("hcp".into(), "kubeconfig".into()),
        [("kubeconfig".to_string(), b"apiVersion: v1".to_vec())].into(),
    );
    o.config_maps.insert(
        ("hcp".into(), "settings".into()),
        [("level".to_string(), b"debug".to_vec())].into(),
    );
    o
}

fn run(s: &PodSpec) -> Result<PodPlan, PlanError> {
    let labels = [("app".to_string(), "olm".to_string())].into();
    plan(
        &PodInput {
            namespace: "hcp",
            name: "olm-0",
            labels: &labels,
            spec: s,
        },
        &objects(),
        &store(),
        &node(),
    )
}

#[test]
fn command_args_env_and_mounts_follow_kubernetes_rules() {
    let s = spec(json!({
        "automountServiceAccountToken": false,
        "containers": [{
            "name": "olm", "image": "olm@sha256:aa",
            "command": ["/bin/olm"],
            "args": ["--namespace", "$(NS)", "--level=$(LEVEL)", "$$(NS)", "$(UNDEFINED)"],
            "env": [
                {"name": "NS", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
                {"name": "LEVEL", "valueFrom": {"configMapKeyRef": {"name": "settings", "key": "level"}}},
                {"name": "APP", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['app']"}}},
                {"name": "DERIVED", "value": "$(NS)-x"}
            ],
            "volumeMounts": [{"name": "kubeconfig", "mountPath": "/etc/kc"}, {"name": "tmp", "mountPath": "/tmp"}],
            "securityContext": {"readOnlyRootFilesystem": true}
        }],
        "volumes": [
            {"name": "kubeconfig", "secret": {"secretName": "kubeconfig", "defaultMode": 288}},
            {"name": "tmp", "emptyDir": {}}
        ]
    }));
    let p = run(&s).unwrap();
    let c = &p.containers[0];
    assert_eq!(
        c.argv,
        [
            "/bin/olm",
            "--namespace",
            "hcp",
            "--level=debug",
            "$(NS)",
            "$(UNDEFINED)"
        ]
    );
    let env: BTreeMap<_, _> = c.env.iter().cloned().collect();
    assert_eq!(env["APP"], "olm");
    assert_eq!(env["DERIVED"], "hcp-x");
    assert_eq!(env["KUBERNETES_SERVICE_HOST"], "198.18.0.1");
    assert_eq!(env["KUBERNETES_SERVICE_PORT"], "6443");
    assert_eq!(env["HOSTNAME"], "olm-0");
    assert_eq!(env["HOME"], "/", "runtimes set HOME");
    assert!(env["PATH"].contains("/bin"));
    assert!(c.read_only_root);
    assert_eq!(
        c.mounts.len(),
        2,
        "no service-account mount: {:?}",
        c.mounts
    );
    assert!(c.mounts[0].read_only, "secret volumes are read-only");
    assert!(!c.mounts[1].read_only);
    assert_eq!(
        p.volumes["kubeconfig"],
        VolumePlan::Files(vec![VolumeFile {
            path: "kubeconfig".into(),
            data: b"apiVersion: v1".to_vec(),
            mode: 0o440
        }])
    );
    assert_eq!(p.volumes["tmp"], VolumePlan::EmptyDir);
}

#[test]
fn image_entrypoint_and_path_lookup() {
    let s = spec(json!({
        "automountServiceAccountToken": false,
        "initContainers": [{"name": "copy", "image": "olm@sha256:aa", "command": ["cp"], "args": ["/bin/olm", "/u/olm"],
                            "volumeMounts": [{"name": "u", "mountPath": "/u"}]}],
        "containers": [
            {"name": "serve", "image": "index:v4.18", "args": ["serve", "/configs"]},
            {"name": "default", "image": "index:v4.18"},
            {"name": "from-volume", "image": "index:v4.18", "command": ["/u/olm"],
             "volumeMounts": [{"name": "u", "mountPath": "/u"}]}
        ],
        "volumes": [{"name": "u", "emptyDir": {}}]
    }));
    let p = run(&s).unwrap();
    assert_eq!(p.init_containers[0].argv, ["/bin/cp", "/bin/olm", "/u/olm"]);
    assert_eq!(p.containers[0].argv, ["/bin/opm", "serve", "/configs"]);
    assert_eq!(p.containers[1].argv, ["/bin/opm"]);
    assert_eq!(p.containers[2].argv, ["/u/olm"]);
}

#[test]
fn service_account_token_is_mounted_unless_disabled() {
    let s = spec(
        json!({"containers": [{"name": "c", "image": "olm@sha256:aa", "command": ["/bin/olm"]}]}),
    );
    let p = run(&s).unwrap();
    let m = p.containers[0].mounts.last().unwrap();
    assert_eq!(m.dest, SERVICE_ACCOUNT_DIR);
    let VolumePlan::Files(files) = &p.volumes[&m.volume] else {
        panic!("files")
    };
    let names: Vec<_> = files.iter().map(|f| f.path.as_str()).collect();
    assert_eq!(names, ["token", "ca.crt", "namespace"]);

    let labels = BTreeMap::new();
    let mut n = node();
    n.service_account = None;
    let err = plan(
        &PodInput {
            namespace: "hcp",
            name: "p",
            labels: &labels,
            spec: &s,
        },
        &objects(),
        &store(),
        &n,
    )
    .unwrap_err();
    assert_eq!(err, PlanError::NoServiceAccountCredentials);
}

#[test]
fn strict_errors_name_the_container_and_field() {
    let cases = [
        (
            json!({"containers": [{"name": "c", "image": "quay.io/unknown:1", "command": ["/x"]}]}),
            "container c: image quay.io/unknown:1 is not known to the runner",
        ),
        (
            json!({"containers": [{"name": "c", "image": "olm@sha256:aa", "command": ["/bin/package-server"]}]}),
            "container c: command /bin/package-server is not in image olm@sha256:aa",
        ),
        (
            json!({"containers": [{"name": "c", "image": "olm@sha256:aa"}]}),
            "container c: neither the pod nor image olm@sha256:aa sets a command",
        ),
        (
            json!({"containers": [{"name": "c", "image": "olm@sha256:aa", "command": ["/bin/olm"],
                   "volumeMounts": [{"name": "nope", "mountPath": "/etc/x"}]}]}),
            "container c: volumeMount /etc/x names volume nope, which the pod does not define",
        ),
        (
            json!({"containers": [{"name": "c", "image": "olm@sha256:aa", "command": ["/bin/olm"]}],
                   "volumes": [{"name": "v", "secret": {"secretName": "absent"}}]}),
            "volume v: Secret hcp/absent does not exist",
        ),
        (
            json!({"containers": [{"name": "c", "image": "olm@sha256:aa", "command": ["/bin/olm"]}],
                   "volumes": [{"name": "v", "secret": {"secretName": "kubeconfig", "items": [{"key": "other", "path": "p"}]}}]}),
            "volume v: Secret hcp/kubeconfig has no key other",
        ),
        (
            json!({"containers": [{"name": "c", "image": "olm@sha256:aa", "command": ["/bin/olm"]}],
                   "volumes": [{"name": "v", "hostPath": {"path": "/"}}]}),
            "volume v: kind hostPath is not supported by the runner",
        ),
        (
            json!({"containers": [{"name": "c", "image": "olm@sha256:aa", "command": ["/bin/olm"],
                   "env": [{"name": "X", "valueFrom": {"secretKeyRef": {"name": "kubeconfig", "key": "nokey"}}}]}]}),
            "container c env X: Secret hcp/kubeconfig has no key nokey",
        ),
        (
            json!({"containers": [{"name": "c", "image": "olm@sha256:aa", "command": ["/bin/olm"],
                   "env": [{"name": "X", "valueFrom": {"resourceFieldRef": {"resource": "limits.cpu"}}}]}]}),
            "container c: env X: only fieldRef",
        ),
        (
            json!({"containers": [{"name": "c", "image": "olm@sha256:aa", "command": ["/bin/olm"],
                   "readinessProbe": {"httpGet": {"port": "metrics", "path": "/healthz"}}}]}),
            "container c: readiness probe: named port metrics is not declared",
        ),
    ];
    for (mut s, want) in cases {
        s["automountServiceAccountToken"] = json!(false);
        let err = run(&spec(s.clone())).unwrap_err().to_string();
        assert!(err.starts_with(want), "{s}\n got: {err}\nwant: {want}");
    }
}

#[test]
fn optional_sources_may_be_missing() {
    let s = spec(json!({
        "automountServiceAccountToken": false,
        "containers": [{"name": "c", "image": "olm@sha256:aa", "command": ["/bin/olm"],
            "env": [{"name": "X", "valueFrom": {"secretKeyRef": {"name": "absent", "key": "k", "optional": true}}}],
            "volumeMounts": [{"name": "v", "mountPath": "/v"}]}],
        "volumes": [{"name": "v", "configMap": {"name": "absent", "optional": true}}]
    }));
    let p = run(&s).unwrap();
    assert!(!p.containers[0].env.iter().any(|(k, _)| k == "X"));
    assert_eq!(p.volumes["v"], VolumePlan::Files(vec![]));
}

#[test]
fn probes_get_kubelet_defaults_and_named_ports() {
    let s = spec(json!({
        "automountServiceAccountToken": false,
        "containers": [{"name": "c", "image": "olm@sha256:aa", "command": ["/bin/olm"],
            "ports": [{"name": "https", "containerPort": 5443}],
            "readinessProbe": {"httpGet": {"port": "https", "path": "/healthz", "scheme": "HTTPS"}},
            "livenessProbe": {"grpc": {"port": 50051}, "periodSeconds": 5, "failureThreshold": 10},
            "startupProbe": {"tcpSocket": {"port": 8080}}}]
    }));
    let c = &run(&s).unwrap().containers[0];
    assert_eq!(
        c.readiness.as_ref().unwrap().action,
        ProbeAction::Http {
            https: true,
            port: 5443,
            path: "/healthz".into()
        }
    );
    let l = c.liveness.as_ref().unwrap();
    assert_eq!((l.period_s, l.failure_threshold, l.timeout_s), (5, 10, 1));
    assert_eq!(
        c.startup.as_ref().unwrap().action,
        ProbeAction::Tcp { port: 8080 }
    );
}

#[test]
fn expand_handles_edge_cases() {
    let env = vec![("A".to_string(), "1".to_string())];
    assert_eq!(expand("$(A)$(A)", &env), "11");
    assert_eq!(expand("$$(A)", &env), "$(A)");
    assert_eq!(expand("$(A", &env), "$(A");
    assert_eq!(expand("$", &env), "$");
    assert_eq!(expand("é$(A)ü", &env), "é1ü");
}

#[test]
fn rendered_catalog_operator_plans_unchanged() {
    // The controller's own golden output: the runner must take it as rendered.
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../controlplane/tests/golden/aws-default-live.yaml");
    let text = std::fs::read_to_string(path).unwrap();
    let dep = serde_yaml_ng::Deserializer::from_str(&text)
        .map(|d| serde_yaml_ng::Value::deserialize(d).unwrap())
        .find(|d| d["kind"] == "Deployment" && d["metadata"]["name"] == "hcp-olm-catalog-operator")
        .unwrap();
    let dep: k8s_openapi::api::apps::v1::Deployment = serde_yaml_ng::from_value(dep).unwrap();
    let tmpl = dep.spec.unwrap().template;
    let pod_spec = tmpl.spec.unwrap();
    let c = &pod_spec.containers[0];
    let image = c.image.clone().unwrap();
    let mut images = ImageStore::new();
    images.insert(&image, Image::new().file("/bin/catalog", "/x/catalog"));
    let mut objs = Objects::default();
    objs.secrets.insert(
        (
            "clusters-cesar".into(),
            "service-network-admin-kubeconfig".into(),
        ),
        [("kubeconfig".to_string(), b"k".to_vec())].into(),
    );
    // its metrics serving certificate (--tls-cert/--tls-key/--client-ca)
    objs.secrets.insert(
        (
            "clusters-cesar".into(),
            "hcp-olm-catalog-operator-metrics-cert".into(),
        ),
        [
            ("tls.crt".to_string(), b"c".to_vec()),
            ("tls.key".to_string(), b"k".to_vec()),
            ("ca.crt".to_string(), b"a".to_vec()),
        ]
        .into(),
    );
    let labels = tmpl.metadata.unwrap().labels.unwrap_or_default();
    let p = plan(
        &PodInput {
            namespace: "clusters-cesar",
            name: "catalog-operator-0",
            labels: &labels,
            spec: &pod_spec,
        },
        &objs,
        &images,
        &node(),
    )
    .unwrap();
    let want: Vec<String> = c
        .command
        .iter()
        .flatten()
        .chain(c.args.iter().flatten())
        .cloned()
        .collect();
    assert_eq!(p.containers[0].argv, want);
    assert!(
        p.containers[0]
            .mounts
            .iter()
            .any(|m| m.dest == "/etc/openshift/kubeconfig" && m.read_only)
    );
    // without the Secret the same pod is refused, naming it
    let err = plan(
        &PodInput {
            namespace: "clusters-cesar",
            name: "catalog-operator-0",
            labels: &labels,
            spec: &pod_spec,
        },
        &Objects::default(),
        &images,
        &node(),
    )
    .unwrap_err();
    assert_eq!(
        err.to_string(),
        "volume kubeconfig: Secret clusters-cesar/service-network-admin-kubeconfig does not exist"
    );
}

use serde::Deserialize as _;
