//! The node stand-in against a real API server: a Deployment becomes a running pod whose
//! readiness lands in the Deployment's status, its Service routes to it, a crashed container
//! is restarted, an in-cluster client in a pod reaches the API server with its mounted
//! ServiceAccount token, and a pod the node cannot run is reported with the reason.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use hcp_olm_e2e::kubelet::node::{Node, NodeConfig};
use hcp_olm_e2e::kubelet::plan::{ProbeAction, ProbePlan};
use hcp_olm_e2e::kubelet::probe::{self, Dialer, ProbeResult};
use hcp_olm_e2e::kubelet::{Image, ImageStore};
use hcp_olm_e2e::podnet::PodNetwork;
use hcp_olm_e2e::{Cluster, ClusterOptions, tools};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Service;
use kube::api::{Api, PostParams};

const NS: &str = "hcp";
const INDEX: &str = "registry.test/catalog/index:v1";
const TOOLS: &str = "registry.test/tools:v1";

fn images(work: &std::path::Path) -> ImageStore {
    let opm = tools::bin("opm").unwrap();
    let configs = tools::fixtures_dir().join("catalogs/small");
    let mut s = ImageStore::new();
    s.insert(
        INDEX,
        Image::new()
            .file("/bin/opm", &opm)
            .tree("/configs", configs)
            .entrypoint(&["/bin/opm"]),
    );
    let _ = work;
    s.insert(
        TOOLS,
        Image::new()
            .with_host_libraries()
            .file("/bin/sh", "/usr/bin/dash")
            .file("/bin/cat", "/usr/bin/cat")
            .file("/bin/sleep", "/usr/bin/sleep")
            .file("/bin/curl", "/usr/bin/curl"),
    );
    s
}

async fn create<T>(c: &kube::Client, v: serde_json::Value) -> T
where
    T: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + serde::de::DeserializeOwned
        + serde::Serialize
        + std::fmt::Debug,
    T::DynamicType: Default,
{
    let obj: T = serde_json::from_value(v).unwrap();
    Api::<T>::namespaced(c.clone(), NS)
        .create(&PostParams::default(), &obj)
        .await
        .unwrap()
}

async fn until<F, Fut>(what: &str, secs: u64, mut f: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<(), String>>,
{
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        match f().await {
            Ok(()) => return,
            Err(e) if Instant::now() >= deadline => panic!("{what}: {e}"),
            Err(_) => tokio::time::sleep(Duration::from_millis(300)).await,
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deployments_become_pods_with_status_services_restarts_and_in_cluster_credentials() {
    let net = Arc::new(
        PodNetwork::create("node", [198, 18, 16], "cluster.local")
            .await
            .unwrap(),
    );
    let gateway = net.gateway();
    let mut opts = ClusterOptions::new("mgmt");
    opts.extra_sans.push(gateway.to_string());
    opts.service_cidr = "198.19.16.0/24".into();
    let cluster = Cluster::start(opts).await.unwrap();
    net.forward_to_host(6443, SocketAddr::from(([127, 0, 0, 1], cluster.port())))
        .await
        .unwrap();
    cluster.ensure_namespace(NS).await.unwrap();
    let client = cluster.client();
    let work = tempfile::tempdir().unwrap();
    let node = Node::start(NodeConfig {
        client: client.clone(),
        namespaces: vec![NS.into()],
        network: net.clone(),
        images: images(work.path()),
        api_host: gateway.to_string(),
        api_port: 6443,
        ca_pem: cluster.ca_pem().as_bytes().to_vec(),
        work_dir: work.path().to_path_buf(),
        interval: Duration::from_millis(500),
        init_timeout: Duration::from_secs(60),
    });

    // 1. a catalog Deployment and its Service
    let _: Deployment = create(
        &client,
        serde_json::json!({
            "apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "catalog", "namespace": NS},
            "spec": {
                "replicas": 1,
                "selector": {"matchLabels": {"app": "catalog"}},
                "template": {
                    "metadata": {"labels": {"app": "catalog"}},
                    "spec": {
                        "automountServiceAccountToken": false,
                        "containers": [{
                            "name": "registry", "image": INDEX,
                            "args": ["serve", "/configs", "--port", "50051"],
                            "ports": [{"name": "grpc", "containerPort": 50051}],
                            "readinessProbe": {"grpc": {"port": 50051}, "periodSeconds": 1}
                        }]
                    }
                }
            }
        }),
    )
    .await;
    let svc: Service = create(
        &client,
        serde_json::json!({
            "apiVersion": "v1", "kind": "Service",
            "metadata": {"name": "catalog", "namespace": NS},
            "spec": {"selector": {"app": "catalog"}, "ports": [{"name": "grpc", "port": 50051, "targetPort": "grpc"}]}
        }),
    )
    .await;
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), NS);
    until("catalog Deployment readyReplicas=1", 90, || async {
        let d = deployments
            .get("catalog")
            .await
            .map_err(|e| e.to_string())?;
        let ready = d.status.and_then(|s| s.ready_replicas).unwrap_or(0);
        if ready == 1 {
            Ok(())
        } else {
            Err(format!("ready {ready}; node: {:?}", node.view()))
        }
    })
    .await;
    // the Service's ClusterIP answers gRPC health from inside the network
    let cluster_ip = svc.spec.unwrap().cluster_ip.unwrap().parse().unwrap();
    let dialer = Dialer::Netns {
        netns: net.router().name().to_string(),
        ip: cluster_ip,
    };
    let health = ProbePlan {
        action: ProbeAction::Grpc {
            port: 50051,
            service: None,
        },
        initial_delay_s: 0,
        period_s: 1,
        timeout_s: 2,
        failure_threshold: 1,
        success_threshold: 1,
    };
    until("ClusterIP → pod", 30, || async {
        match probe::run(&dialer, &health).await {
            ProbeResult::Success => Ok(()),
            r => Err(r.to_string()),
        }
    })
    .await;

    // 2. a crash is restarted and readiness comes back
    let key = (NS.to_string(), "catalog".to_string());
    let pid = node.view().pids[&key][0];
    assert!(
        std::process::Command::new("kill")
            .args(["-KILL", &pid.to_string()])
            .status()
            .unwrap()
            .success()
    );
    until("restart counted and pod ready again", 60, || async {
        let v = node.view();
        match (v.restarts.get(&key), v.ready.get(&key)) {
            (Some(r), Some(1)) if *r >= 1 => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;

    // 3. in-cluster credentials: a pod reads /version with its mounted token
    let _: k8s_openapi::api::core::v1::ServiceAccount = create(
        &client,
        serde_json::json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "reader", "namespace": NS}}),
    )
    .await;
    let _: Deployment = create(
        &client,
        serde_json::json!({
            "apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "in-cluster", "namespace": NS},
            "spec": {
                "selector": {"matchLabels": {"app": "in-cluster"}},
                "template": {
                    "metadata": {"labels": {"app": "in-cluster"}},
                    "spec": {
                        "serviceAccountName": "reader",
                        "containers": [{
                            "name": "client", "image": TOOLS,
                            "command": ["/bin/sh", "-c",
                                "D=/var/run/secrets/kubernetes.io/serviceaccount; curl -sSf --cacert $D/ca.crt -H \"Authorization: Bearer $(cat $D/token)\" https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT/version > /tmp/version && sleep 600"],
                            "readinessProbe": {"exec": {"command": ["true"]}}
                        }]
                    }
                }
            }
        }),
    )
    .await;
    // exec probes are not supported: the node must say so rather than report it ready
    until("exec probe reported", 60, || async {
        let v = node.view();
        if v.ready.get(&(NS.to_string(), "in-cluster".to_string())) == Some(&0) {
            Ok(())
        } else {
            Err(format!("{:?}", v.ready))
        }
    })
    .await;
    until("the pod read /version with its token", 30, || async {
        let dir = work.path().join(NS);
        let pod_dir = std::fs::read_dir(&dir)
            .map_err(|e| e.to_string())?
            .filter_map(|e| e.ok())
            .find(|e| e.file_name().to_string_lossy().starts_with("in-cluster-"))
            .ok_or("no pod directory")?;
        let text = std::fs::read_to_string(pod_dir.path().join("rootfs-client/tmp/version"))
            .map_err(|e| e.to_string())?;
        if text.contains("v1.36") {
            Ok(())
        } else {
            Err(text)
        }
    })
    .await;

    // 4. a pod the node cannot run: unknown image → error naming it, status says why
    let _: Deployment = create(
        &client,
        serde_json::json!({
            "apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "unknown-image", "namespace": NS},
            "spec": {
                "selector": {"matchLabels": {"app": "x"}},
                "template": {
                    "metadata": {"labels": {"app": "x"}},
                    "spec": {"automountServiceAccountToken": false,
                             "containers": [{"name": "c", "image": "quay.io/nope:1", "command": ["/x"]}]}
                }
            }
        }),
    )
    .await;
    until("unknown image reported in status", 30, || async {
        let d = deployments
            .get("unknown-image")
            .await
            .map_err(|e| e.to_string())?;
        let conds = d.status.and_then(|s| s.conditions).unwrap_or_default();
        match conds.iter().find(|c| c.type_ == "Progressing") {
            Some(c)
                if c.message
                    .as_deref()
                    .unwrap_or("")
                    .contains("image quay.io/nope:1 is not known") =>
            {
                Ok(())
            }
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    // `errors` holds the last pass only, and a failed start is retried every 5 s: a pass
    // between the status write and this check leaves it empty (seen once in a CI-like run)
    assert!(
        node.view()
            .history
            .iter()
            .any(|e| e.deployment == "unknown-image"),
        "{:?}",
        node.view().history
    );
    node.stop().await;
}
