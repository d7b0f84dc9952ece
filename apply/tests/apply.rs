//! The applier against a real kube-apiserver. Writes are counted from the API server's own
//! `apiserver_request_total` metric, not from our report.

use std::collections::BTreeMap;

use anyhow::{Result, ensure};
use hcp_olm_apply::cache::Limits;
use hcp_olm_apply::{Applier, Policy, Target};
use hcp_olm_e2e::tools::fixtures_dir;
use hcp_olm_e2e::{Cluster, ClusterOptions};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, ApiResource, Patch, PatchParams, PostParams};
use serde_json::json;

const RESOURCES: &[&str] = &[
    "configmaps",
    "secrets",
    "services",
    "deployments",
    "catalogsources",
];

fn labels() -> serde_json::Value {
    json!({ "app.kubernetes.io/managed-by": "apply-test" })
}

fn targets(replicas: i32) -> Vec<Target> {
    let ns = "apply-test";
    vec![
        Target::new(
            "v1",
            "ConfigMap",
            "configmaps",
            Policy::Apply,
            json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": { "name": "cfg", "namespace": ns, "labels": labels() },
            "data": { "a": "1" } }),
        ),
        Target::new(
            "v1",
            "Secret",
            "secrets",
            Policy::Apply,
            json!({
            "apiVersion": "v1", "kind": "Secret",
            "metadata": { "name": "sec", "namespace": ns, "labels": labels() },
            "type": "Opaque", "stringData": { "kubeconfig": "not-a-real-one" } }),
        ),
        Target::new(
            "v1",
            "Service",
            "services",
            Policy::Apply,
            json!({
            "apiVersion": "v1", "kind": "Service",
            "metadata": { "name": "svc", "namespace": ns, "labels": labels() },
            "spec": { "selector": { "app": "x" },
                      "ports": [{ "name": "grpc", "port": 50051, "targetPort": 50051 }] } }),
        ),
        Target::new(
            "apps/v1",
            "Deployment",
            "deployments",
            Policy::Apply,
            json!({
            "apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": { "name": "dep", "namespace": ns, "labels": labels(),
                          "annotations": { "hcp-olm.io/config-hash": "abc" } },
            "spec": { "replicas": replicas, "selector": { "matchLabels": { "app": "x" } },
                      "template": { "metadata": { "labels": { "app": "x" } },
                        "spec": { "containers": [{ "name": "c", "image": "registry.example/x:1",
                          "args": ["--port=50051"],
                          "resources": { "requests": { "cpu": "10m", "memory": "80Mi" } } }] } } } }),
        ),
        Target::new(
            "operators.coreos.com/v1alpha1",
            "CatalogSource",
            "catalogsources",
            Policy::Apply,
            json!({
            "apiVersion": "operators.coreos.com/v1alpha1", "kind": "CatalogSource",
            "metadata": { "name": "cat", "namespace": ns, "labels": labels() },
            "spec": { "sourceType": "grpc", "address": "redhat-operators:50051",
                      "displayName": "Red Hat Operators" } }),
        ),
    ]
}

/// A real API server with the CatalogSource CRD and the `apply-test` namespace.
/// A kind no API server here serves.
fn missing_kind() -> ApiResource {
    ApiResource {
        group: "example.com".into(),
        version: "v1".into(),
        api_version: "example.com/v1".into(),
        kind: "Missing".into(),
        plural: "missings".into(),
    }
}

async fn test_cluster(name: &str) -> Result<Cluster> {
    let cluster = Cluster::start(ClusterOptions::new(name)).await?;
    cluster
        .install_crds(&[fixtures_dir().join("crds/olm/operators.coreos.com_catalogsources.yaml")])
        .await?;
    cluster.ensure_namespace("apply-test").await?;
    Ok(cluster)
}

fn kinds() -> Vec<(ApiResource, bool)> {
    targets(1).into_iter().map(|t| (t.resource, true)).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn converged_pass_writes_nothing_changes_write_once_prune_removes_only_ours() -> Result<()> {
    let cluster = test_cluster("apply").await?;
    let client = cluster.client();
    let applier = Applier::new(client.clone(), "hcp-olm-test");

    let first = applier.apply(&targets(1)).await;
    ensure!(first.errors.is_empty(), "{:?}", first.errors);
    assert_eq!(first.created.len(), 5);

    // Second pass: nothing to write, and the API server agrees.
    let before = cluster.api_writes(RESOURCES).await?;
    let second = applier.apply(&targets(1)).await;
    ensure!(second.errors.is_empty(), "{:?}", second.errors);
    assert_eq!((second.writes(), second.unchanged), (0, 5));
    assert_eq!(
        cluster.api_writes(RESOURCES).await? - before,
        0,
        "API writes on a converged pass"
    );

    // One changed field: one write.
    let before = cluster.api_writes(RESOURCES).await?;
    let third = applier.apply(&targets(3)).await;
    assert_eq!(third.updated, ["Deployment/apply-test/dep"]);
    assert_eq!(cluster.api_writes(RESOURCES).await? - before, 1);
    let dep = Api::<Deployment>::namespaced(client.clone(), "apply-test")
        .get("dep")
        .await?;
    assert_eq!(dep.spec.and_then(|s| s.replicas), Some(3));

    // Someone else's field on our object survives our apply (server-side apply ownership).
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "apply-test");
    cms.patch(
        "cfg",
        &PatchParams::apply("someone-else"),
        &Patch::Apply(json!({ "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": { "name": "cfg" }, "data": { "theirs": "kept" } })),
    )
    .await?;
    let again = applier.apply(&targets(3)).await;
    assert_eq!(again.writes(), 0);
    let cm = cms.get("cfg").await?.data.unwrap_or_default();
    assert_eq!(cm.get("theirs").map(String::as_str), Some("kept"));

    // An unlabelled ConfigMap is not ours; a dropped desired object is pruned.
    let foreign: ConfigMap = serde_json::from_value(json!({ "metadata": { "name": "foreign" } }))?;
    cms.create(&PostParams::default(), &foreign).await?;
    let keep: Vec<Target> = targets(3).into_iter().filter(|t| t.name != "cfg").collect();
    let selector = BTreeMap::from([(
        "app.kubernetes.io/managed-by".to_string(),
        "apply-test".to_string(),
    )]);
    let pruned = applier
        .prune(&kinds(), Some("apply-test"), &selector, &keep)
        .await;
    ensure!(pruned.errors.is_empty(), "{:?}", pruned.errors);
    assert_eq!(pruned.deleted, ["ConfigMap/apply-test/cfg"]);
    ensure!(
        cms.get_opt("foreign").await?.is_some(),
        "foreign ConfigMap was pruned"
    );
    let pruned_again = applier
        .prune(&kinds(), Some("apply-test"), &selector, &keep)
        .await;
    assert_eq!(pruned_again.writes(), 0);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn create_only_is_left_alone_and_one_bad_object_does_not_stop_the_rest() -> Result<()> {
    let cluster = Cluster::start(ClusterOptions::new("apply2")).await?;
    cluster.ensure_namespace("apply-test").await?;
    let client = cluster.client();
    let applier = Applier::new(client.clone(), "hcp-olm-test");
    let cm = |value: &str| {
        Target::new(
            "v1",
            "ConfigMap",
            "configmaps",
            Policy::CreateOnly,
            json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": { "name": "once", "namespace": "apply-test" }, "data": { "v": value } }),
        )
    };
    // CatalogSource is not served here (no CRD): that object fails, the ConfigMap is created.
    let catalog = targets(1).pop().expect("a catalog target");
    let report = applier.apply(&[catalog, cm("first")]).await;
    assert_eq!(report.created, ["ConfigMap/apply-test/once"]);
    assert_eq!(report.errors.len(), 1);
    assert_eq!(report.errors[0].code(), Some(404));
    assert!(
        report.errors[0]
            .to_string()
            .contains("CatalogSource/apply-test/cat")
    );

    let report = applier.apply(&[cm("second")]).await;
    assert_eq!((report.writes(), report.unchanged), (0, 1));
    let live = Api::<ConfigMap>::namespaced(client, "apply-test")
        .get("once")
        .await?;
    assert_eq!(
        live.data.unwrap_or_default().get("v").map(String::as_str),
        Some("first")
    );
    Ok(())
}

/// A field we stop rendering (a label, a nodeSelector entry, an env var, a whole list item)
/// disappears from the live object; fields of other managers stay; a second pass writes
/// nothing. A misspelled field is refused by strict field validation.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fields_we_stop_rendering_are_removed_and_typos_are_refused() -> Result<()> {
    let cluster = Cluster::start(ClusterOptions::new("apply3")).await?;
    cluster.ensure_namespace("apply-test").await?;
    let client = cluster.client();
    let applier = Applier::new(client.clone(), "hcp-olm-test");
    // 2: everything; 1: without the map entries (label, nodeSelector); 0: also without the
    // list items (env var, sidecar container).
    let dep = |level: u8| {
        let mut labels = labels();
        let mut node_selector = json!({ "kubernetes.io/os": "linux" });
        let mut env = vec![json!({ "name": "A", "value": "1" })];
        let mut containers = vec![json!({ "name": "c", "image": "registry.example/x:1" })];
        if level >= 2 {
            labels["extra"] = "yes".into();
            node_selector["pool"] = "infra".into();
        }
        if level >= 1 {
            env.push(json!({ "name": "B", "value": "2" }));
            containers.push(json!({ "name": "side", "image": "registry.example/y:1" }));
        }
        containers[0]["env"] = env.into();
        Target::new(
            "apps/v1",
            "Deployment",
            "deployments",
            Policy::Apply,
            json!({
            "apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": { "name": "shrink", "namespace": "apply-test", "labels": labels },
            "spec": { "replicas": 1, "selector": { "matchLabels": { "app": "s" } },
                      "template": { "metadata": { "labels": { "app": "s" } },
                        "spec": { "nodeSelector": node_selector, "containers": containers } } } }),
        )
    };
    let r = applier.apply(&[dep(2)]).await;
    ensure!(r.errors.is_empty() && r.created.len() == 1, "{r:?}");
    // Another manager's label on the same object is not ours to remove.
    let deps: Api<Deployment> = Api::namespaced(client.clone(), "apply-test");
    deps.patch(
        "shrink",
        &PatchParams::apply("someone-else"),
        &Patch::Apply(json!({ "apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": { "name": "shrink", "labels": { "theirs": "kept" } } })),
    )
    .await?;

    // Map entries dropped: the desired object is still contained in the live one, so only
    // our managed fields show that an apply is needed.
    let r = applier.apply(&[dep(1)]).await;
    ensure!(r.errors.is_empty(), "{:?}", r.errors);
    assert_eq!(r.updated, ["Deployment/apply-test/shrink"], "{r:?}");
    let live = deps.get("shrink").await?;
    let labels = live.metadata.labels.clone().unwrap_or_default();
    ensure!(!labels.contains_key("extra"), "label left: {labels:?}");
    ensure!(
        labels.get("theirs").map(String::as_str) == Some("kept"),
        "another manager's label was removed: {labels:?}"
    );
    let pod = live.spec.and_then(|s| s.template.spec).expect("pod spec");
    let ns = pod.node_selector.unwrap_or_default();
    ensure!(!ns.contains_key("pool"), "nodeSelector entry left: {ns:?}");

    // List items dropped.
    let r = applier.apply(&[dep(0)]).await;
    ensure!(r.errors.is_empty(), "{:?}", r.errors);
    assert_eq!(r.updated, ["Deployment/apply-test/shrink"], "{r:?}");
    let live = deps.get("shrink").await?;
    let pod = live.spec.and_then(|s| s.template.spec).expect("pod spec");
    ensure!(
        pod.containers.len() == 1,
        "container left: {:?}",
        pod.containers
    );
    let env: Vec<String> = pod.containers[0]
        .env
        .clone()
        .unwrap_or_default()
        .into_iter()
        .map(|e| e.name)
        .collect();
    ensure!(env == ["A"], "env left: {env:?}");

    let before = cluster.api_writes(&["deployments"]).await?;
    let r = applier.apply(&[dep(0)]).await;
    assert_eq!((r.writes(), r.unchanged), (0, 1), "{r:?}");
    assert_eq!(cluster.api_writes(&["deployments"]).await? - before, 0);

    // A typo in a rendered object fails instead of being dropped silently.
    let mut typo = dep(0);
    typo.body["spec"]["template"]["spec"]["nodeSelectr"] = json!({ "a": "b" });
    let r = applier.apply(&[typo]).await;
    ensure!(
        r.errors.len() == 1 && r.errors[0].to_string().contains("nodeSelectr"),
        "typo accepted: {r:?}"
    );
    Ok(())
}

/// Polls `check` (the cache catching up with a change made behind the applier's back).
async fn eventually(what: &str, mut check: impl FnMut() -> bool) -> Result<()> {
    let until = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while !check() {
        ensure!(std::time::Instant::now() < until, "timed out: {what}");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    Ok(())
}

/// With a watch-fed metadata cache a converged pass (even right after the writes, before
/// the watch has delivered them) and a converged prune send no request at all; changes made
/// behind our back (an Update of a field we set, a deleted object) are still repaired.
/// Reads and writes are counted by the API server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_cache_answers_converged_passes_without_requests() -> Result<()> {
    let cluster = test_cluster("apply4").await?;
    let client = cluster.client();
    let resources: Vec<ApiResource> = kinds().into_iter().map(|(r, _)| r).collect();
    let cache = std::sync::Arc::new(hcp_olm_apply::cache::WatchCache::start(
        &client,
        &resources,
        "app.kubernetes.io/managed-by=apply-test",
        "hcp-olm-test",
    ));
    ensure!(
        cache.wait_settled(std::time::Duration::from_secs(30)).await,
        "cache not synced: {cache:?}"
    );
    let applier = Applier::new(client.clone(), "hcp-olm-test").with_cache(Some(cache.clone()));
    let reads = || cluster.api_requests(&["GET", "LIST"], RESOURCES);

    let first = applier.apply(&targets(1)).await;
    ensure!(first.errors.is_empty(), "{:?}", first.errors);
    assert_eq!((first.created.len(), first.reads), (5, 0));

    // At once: the overlay of our own writes answers.
    let (r0, w0) = (reads().await?, cluster.api_writes(RESOURCES).await?);
    let second = applier.apply(&targets(1)).await;
    ensure!(second.errors.is_empty(), "{:?}", second.errors);
    assert_eq!((second.writes(), second.unchanged, second.reads), (0, 5, 0));
    // Once the watch has caught up: the store answers.
    eventually("cache holds the five objects", || cache.len() == 5).await?;
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    let third = applier.apply(&targets(1)).await;
    assert_eq!((third.writes(), third.reads), (0, 0));
    assert_eq!(
        (
            reads().await? - r0,
            cluster.api_writes(RESOURCES).await? - w0
        ),
        (0, 0),
        "API reads and writes on converged passes"
    );

    // `kubectl edit` of a field we set (an Update) moves its ownership away from us: the
    // next pass puts it back.
    let deps: Api<Deployment> = Api::namespaced(client.clone(), "apply-test");
    let mut live = deps.get("dep").await?;
    if let Some(pod) = live.spec.as_mut().and_then(|s| s.template.spec.as_mut()) {
        pod.containers[0].image = Some("registry.example/evil:1".into());
    }
    let edited = deps
        .replace("dep", &PostParams::default(), &live)
        .await?
        .metadata
        .resource_version
        .unwrap_or_default();
    let dep_target = targets(1).into_iter().find(|t| t.name == "dep").unwrap();
    eventually("cache sees the edit", || {
        cache
            .get(&dep_target.resource, Some("apply-test"), "dep")
            .flatten()
            .and_then(|m| {
                m["metadata"]["resourceVersion"]
                    .as_str()
                    .map(str::to_string)
            })
            == Some(edited.clone())
    })
    .await?;
    // The cache keeps a digest of our managed fields, not the fields: a changed digest
    // under an unchanged desired hash is read in full once (1 GET), then applied.
    let r = applier.apply(&targets(1)).await;
    assert_eq!(
        (r.updated.as_slice(), r.reads),
        (&["Deployment/apply-test/dep".to_string()][..], 1)
    );
    let image = deps
        .get("dep")
        .await?
        .spec
        .and_then(|s| s.template.spec)
        .map(|p| p.containers[0].image.clone());
    assert_eq!(image, Some(Some("registry.example/x:1".into())));

    // A deleted object is created again.
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "apply-test");
    cms.delete("cfg", &Default::default()).await?;
    let cfg_target = targets(1).into_iter().find(|t| t.name == "cfg").unwrap();
    eventually("cache sees the deletion", || {
        cache.get(&cfg_target.resource, Some("apply-test"), "cfg") == Some(None)
    })
    .await?;
    let r = applier.apply(&targets(1)).await;
    assert_eq!(r.created, ["ConfigMap/apply-test/cfg"]);

    // Prune from the cache: the dropped object goes, a second prune at once writes nothing.
    let keep: Vec<Target> = targets(1).into_iter().filter(|t| t.name != "svc").collect();
    let selector = BTreeMap::from([(
        "app.kubernetes.io/managed-by".to_string(),
        "apply-test".to_string(),
    )]);
    let (r0, w0) = (reads().await?, cluster.api_writes(RESOURCES).await?);
    let pruned = applier
        .prune(&kinds(), Some("apply-test"), &selector, &keep)
        .await;
    ensure!(pruned.errors.is_empty(), "{:?}", pruned.errors);
    assert_eq!(
        (pruned.deleted.as_slice(), pruned.reads),
        (&["Service/apply-test/svc".to_string()][..], 0)
    );
    let again = applier
        .prune(&kinds(), Some("apply-test"), &selector, &keep)
        .await;
    assert_eq!((again.writes(), again.reads), (0, 0));
    assert_eq!(
        (
            reads().await? - r0,
            cluster.api_writes(RESOURCES).await? - w0
        ),
        (0, 1),
        "API reads and writes of two prunes"
    );
    Ok(())
}

/// Where someone else decides how many objects carry our label (a guest's users), a
/// limited cache holds at most `limit` per kind: a kind with more gives up its watch and
/// store (the applier reads it from the API server, as without a cache) while the other
/// kinds are still answered from memory; the same happens when the limit is crossed after
/// the first list. The API server's own counters show which kind is read.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_limited_cache_gives_up_a_kind_with_too_many_objects() -> Result<()> {
    let cluster = test_cluster("apply5").await?;
    let client = cluster.client();
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "apply-test");
    let flood = |i: usize| {
        serde_json::from_value::<ConfigMap>(json!({
            "metadata": { "name": format!("flood-{i}"), "labels": labels() },
            "data": { "a": "1" }
        }))
    };
    // Four ConfigMaps beside ours: over a limit of 4 once ours is there.
    for i in 0..4 {
        cms.create(&PostParams::default(), &flood(i)?).await?;
    }
    let resources: Vec<ApiResource> = kinds().into_iter().map(|(r, _)| r).collect();
    let four = Limits {
        objects_per_kind: 4,
        ..Limits::NONE
    };
    let cache = std::sync::Arc::new(hcp_olm_apply::cache::WatchCache::start_limited(
        &client,
        &resources,
        "app.kubernetes.io/managed-by=apply-test",
        "hcp-olm-test",
        None,
        four,
    ));
    ensure!(
        cache.wait_settled(std::time::Duration::from_secs(30)).await,
        "cache not settled: {cache:?}"
    );
    ensure!(cache.overflowed().is_empty(), "{:?}", cache.overflowed());
    let applier = Applier::new(client.clone(), "hcp-olm-test").with_cache(Some(cache.clone()));
    let first = applier.apply(&targets(1)).await;
    ensure!(first.errors.is_empty(), "{:?}", first.errors);
    // The watch delivers our ConfigMap: five of the kind, over the limit.
    eventually("the ConfigMap kind gives up", || {
        cache.overflowed() == ["ConfigMap"]
    })
    .await?;
    let cm_resource = &targets(1)[0].resource;
    ensure!(
        cache.get(cm_resource, Some("apply-test"), "cfg").is_none(),
        "a given-up kind must not answer"
    );
    // Every other kind still answers from memory; the ConfigMap is read (1 GET) and left.
    eventually("the other kinds hold ours", || cache.len() == 4).await?;
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    let cm_reads = || cluster.api_requests(&["GET", "LIST"], &["configmaps"]);
    let other = &RESOURCES[1..];
    let (c0, o0) = (
        cm_reads().await?,
        cluster.api_requests(&["GET", "LIST"], other).await?,
    );
    let r = applier.apply(&targets(1)).await;
    assert_eq!((r.writes(), r.reads), (0, 1));
    assert_eq!(
        (
            cm_reads().await? - c0,
            cluster.api_requests(&["GET", "LIST"], other).await? - o0
        ),
        (1, 0)
    );

    // Over the limit at the first list: that kind never holds anything.
    let limited = |limits| {
        hcp_olm_apply::cache::WatchCache::start_limited(
            &client,
            &resources,
            "app.kubernetes.io/managed-by=apply-test",
            "hcp-olm-test",
            None,
            limits,
        )
    };
    let fresh = limited(four);
    ensure!(fresh.wait_settled(std::time::Duration::from_secs(30)).await);
    assert_eq!(fresh.overflowed(), ["ConfigMap"]);
    eventually("the others are listed", || fresh.len() == 4).await?;
    // The watch task of a given-up kind has ended: a new ConfigMap changes nothing.
    cms.create(&PostParams::default(), &flood(4)?).await?;
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    assert_eq!(fresh.len(), 4);

    // Long labels: an object whose metadata would take more than `entry_bytes` is refused
    // before any of it is kept, and its kind gives up.
    let mut long = flood(5)?;
    long.metadata
        .labels
        .get_or_insert_default()
        .extend((0..8).map(|i| (format!("example.com/long-{i}"), "v".repeat(63))));
    cms.create(&PostParams::default(), &long).await?;
    let small = limited(Limits {
        entry_bytes: 1024,
        ..Limits::NONE
    });
    ensure!(small.wait_settled(std::time::Duration::from_secs(30)).await);
    assert_eq!(small.overflowed(), ["ConfigMap"]);

    // A stream of changes: more than `events_per_minute` after the first list gives up.
    let busy = limited(Limits {
        events_per_minute: 3,
        ..Limits::NONE
    });
    ensure!(busy.wait_settled(std::time::Duration::from_secs(30)).await);
    ensure!(busy.overflowed().is_empty(), "{:?}", busy.overflowed());
    for i in 0..4 {
        let mut cm = cms.get("flood-0").await?;
        cm.data
            .get_or_insert_default()
            .insert("n".into(), i.to_string());
        cms.replace("flood-0", &PostParams::default(), &cm).await?;
    }
    eventually("a busy kind gives up", || {
        busy.overflowed() == ["ConfigMap"]
    })
    .await?;

    // A byte budget for the whole cache: the kind whose list crosses it gives up.
    let tight = limited(Limits {
        bytes: 2048,
        ..Limits::NONE
    });
    ensure!(tight.wait_settled(std::time::Duration::from_secs(30)).await);
    ensure!(
        tight.overflowed().contains(&"ConfigMap".to_string()),
        "{:?}",
        tight.overflowed()
    );
    Ok(())
}

/// Our list-then-watch against a real kube-apiserver: paged lists, a watch the server ends
/// (`timeoutSeconds`) is resumed from the last version without listing again, deletions
/// arrive, and a list page or an event over its size bound is an error of its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_metadata_watch_pages_resumes_and_bounds_sizes() -> Result<()> {
    use futures::StreamExt;
    use hcp_olm_apply::watch::{self, Options, Selector, WatchError};
    use kube::runtime::watcher::Event;
    let cluster = test_cluster("apply6").await?;
    let client = cluster.client();
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "apply-test");
    let cm = |name: &str, note: usize| {
        serde_json::from_value::<ConfigMap>(json!({
            "metadata": { "name": name, "labels": labels(),
                          "annotations": { "note": "n".repeat(note) } },
        }))
    };
    for i in 0..5 {
        cms.create(&PostParams::default(), &cm(&format!("w-{i}"), 10)?)
            .await?;
    }
    let resource = targets(1)[0].resource.clone();
    let selector = "app.kubernetes.io/managed-by=apply-test";
    let options = Options {
        page: 2,
        timeout_s: 2,
        ..Options::default()
    };
    // Read in the background, as the cache does, so the watch is open (and ended by the
    // server) while nothing happens.
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let reader = tokio::spawn(async move {
        let stream = watch::metadata(client, &resource, Selector::labels(selector), options);
        futures::pin_mut!(stream);
        while let Some(ev) = stream.next().await {
            if tx.send(ev).is_err() {
                break;
            }
        }
    });
    let mut next = async || {
        tokio::time::timeout(std::time::Duration::from_secs(20), rx.recv())
            .await
            .map_err(|_| anyhow::anyhow!("no event within 20 s"))?
            .ok_or_else(|| anyhow::anyhow!("the stream ended"))?
            .map_err(anyhow::Error::from)
    };
    // Three pages of two: Init, five objects, InitDone.
    ensure!(matches!(next().await?, Event::Init));
    let mut listed = Vec::new();
    loop {
        match next().await? {
            Event::InitApply(m) => listed.push(m.metadata.name.unwrap_or_default()),
            Event::InitDone => break,
            e => anyhow::bail!("unexpected during the list: {e:?}"),
        }
    }
    listed.sort();
    assert_eq!(listed, ["w-0", "w-1", "w-2", "w-3", "w-4"]);
    let lists = || cluster.api_requests(&["LIST"], &["configmaps"]);
    let lists0 = lists().await?;
    // Past the server's end of the watch: changes still arrive, with no new list.
    tokio::time::sleep(std::time::Duration::from_secs(5)).await;
    cms.create(&PostParams::default(), &cm("w-5", 10)?).await?;
    match next().await? {
        Event::Apply(m) => assert_eq!(m.metadata.name.as_deref(), Some("w-5")),
        e => anyhow::bail!("expected w-5 added: {e:?}"),
    }
    cms.delete("w-0", &Default::default()).await?;
    match next().await? {
        Event::Delete(m) => assert_eq!(m.metadata.name.as_deref(), Some("w-0")),
        e => anyhow::bail!("expected w-0 deleted: {e:?}"),
    }
    // A LIST with watch=true counts as a WATCH in the server's metrics (once it has ended):
    // no list since, and more than one watch ended by the server (after 2 s each).
    assert_eq!(
        lists().await?,
        lists0,
        "a resumed watch must not list again"
    );
    let watches = cluster.api_requests(&["WATCH"], &["configmaps"]).await?;
    ensure!(
        watches >= 2,
        "the watch was not resumed: {watches} watches ended"
    );
    reader.abort();
    let client = cluster.client();
    let resource = targets(1)[0].resource.clone();

    // An event over its bound.
    let small = Options {
        max_event_bytes: 2048,
        ..Options::default()
    };
    let stream = watch::metadata(client.clone(), &resource, Selector::labels(selector), small);
    futures::pin_mut!(stream);
    loop {
        match stream.next().await {
            Some(Ok(Event::InitDone)) => break,
            Some(Ok(_)) => {}
            other => anyhow::bail!("the list did not complete: {other:?}"),
        }
    }
    cms.create(&PostParams::default(), &cm("big", 4096)?)
        .await?;
    let got = tokio::time::timeout(std::time::Duration::from_secs(20), stream.next()).await?;
    ensure!(
        matches!(got, Some(Err(WatchError::TooLarge { .. }))),
        "{got:?}"
    );
    ensure!(
        stream.next().await.is_none(),
        "the stream ends after an error"
    );
    // A list page over its bound.
    let tiny_page = Options {
        max_page_bytes: 4096,
        ..Options::default()
    };
    let stream = watch::metadata(
        client.clone(),
        &resource,
        Selector::labels(selector),
        tiny_page,
    );
    futures::pin_mut!(stream);
    let got = stream.next().await;
    ensure!(
        matches!(got, Some(Err(WatchError::TooLarge { .. }))),
        "{got:?}"
    );
    // A kind the server does not serve.
    let missing = missing_kind();
    let stream = watch::metadata(
        client.clone(),
        &missing,
        Selector::labels(selector),
        Options::default(),
    );
    futures::pin_mut!(stream);
    let got = stream.next().await;
    ensure!(
        got.as_ref()
            .is_some_and(|r| r.as_ref().is_err_and(|e| e.not_served())),
        "{got:?}"
    );
    Ok(())
}

/// A projected store against a real kube-apiserver: whole objects or metadata, selected by
/// namespace, labels (`!key` included) and fields; keeps only the projection; follows
/// changes and deletions; answers nothing before its first list; and gives up (answers
/// nothing) once a bound is crossed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_projected_store_keeps_selected_fields_within_bounds() -> Result<()> {
    use hcp_olm_apply::projected::{Limits, Projected};
    use hcp_olm_apply::watch::Selector;
    let cluster = test_cluster("apply7").await?;
    let client = cluster.client();
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "apply-test");
    let cm = |name: &str, labels: serde_json::Value, data: &str| {
        serde_json::from_value::<ConfigMap>(json!({
            "metadata": { "name": name, "labels": labels },
            "data": { "v": data, "other": "x".repeat(100) }
        }))
    };
    cms.create(
        &PostParams::default(),
        &cm("a", json!({ "k": "1" }), "one")?,
    )
    .await?;
    cms.create(
        &PostParams::default(),
        &cm("b", json!({ "k": "1", "copy": "y" }), "two")?,
    )
    .await?;
    let resource = targets(1)[0].resource.clone();
    let limits = Limits {
        objects: 10,
        entry_bytes: 1024,
        bytes: 4096,
        events_per_minute: 100,
        watch: hcp_olm_apply::watch::Options::UNTRUSTED,
    };
    fn keep_v(o: &serde_json::Value) -> Option<serde_json::Value> {
        o["data"]["v"].as_str().map(|v| json!({ "v": v }))
    }
    let selector = Selector {
        namespace: Some("apply-test".into()),
        labels: "k=1,!copy".into(),
        fields: String::new(),
    };
    let store = Projected::start(&client, &resource, selector, false, keep_v, limits);
    ensure!(
        store.get(Some("apply-test"), "a").is_none(),
        "answers before its list"
    );
    ensure!(store.wait_settled(std::time::Duration::from_secs(30)).await);
    assert_eq!(
        store.get(Some("apply-test"), "a"),
        Some(Some(json!({ "v": "one" })))
    );
    assert_eq!(store.get(Some("apply-test"), "b"), Some(None), "!copy");
    let mut a = cms.get("a").await?;
    a.data
        .get_or_insert_default()
        .insert("v".into(), "uno".into());
    cms.replace("a", &PostParams::default(), &a).await?;
    eventually("a change arrives", || {
        store.get(Some("apply-test"), "a") == Some(Some(json!({ "v": "uno" })))
    })
    .await?;
    cms.delete("a", &Default::default()).await?;
    eventually("a deletion arrives", || {
        store.get(Some("apply-test"), "a") == Some(None)
    })
    .await?;
    // By name, metadata only: existence.
    fn exists(_: &serde_json::Value) -> Option<serde_json::Value> {
        Some(json!({}))
    }
    let by_name = Projected::start(
        &client,
        &resource,
        Selector {
            namespace: Some("apply-test".into()),
            labels: String::new(),
            fields: "metadata.name=b".into(),
        },
        true,
        exists,
        limits,
    );
    ensure!(
        by_name
            .wait_settled(std::time::Duration::from_secs(30))
            .await
    );
    assert_eq!(by_name.list().map(|l| l.len()), Some(1));
    assert_eq!(by_name.get(Some("apply-test"), "b"), Some(Some(json!({}))));
    // Bounds: a projection over entry_bytes, and more objects than allowed.
    fn keep_all(o: &serde_json::Value) -> Option<serde_json::Value> {
        Some(o["data"].clone())
    }
    let all = Selector {
        namespace: Some("apply-test".into()),
        ..Selector::default()
    };
    let small = Projected::start(
        &client,
        &resource,
        all.clone(),
        false,
        keep_all,
        Limits {
            entry_bytes: 64,
            ..limits
        },
    );
    ensure!(small.wait_settled(std::time::Duration::from_secs(30)).await);
    ensure!(small.gave_up() && small.get(Some("apply-test"), "b").is_none());
    let few = Projected::start(
        &client,
        &resource,
        all,
        true,
        exists,
        Limits {
            objects: 2,
            ..limits
        },
    );
    ensure!(few.wait_settled(std::time::Duration::from_secs(30)).await);
    ensure!(!few.gave_up(), "{few:?}");
    for i in 0..2 {
        cms.create(
            &PostParams::default(),
            &cm(&format!("n{i}"), json!({}), "n")?,
        )
        .await?;
    }
    eventually("too many objects give up", || few.gave_up()).await?;
    ensure!(few.list().is_none());
    // A kind the server does not serve: settled (nothing to wait for), answering nothing.
    let missing = missing_kind();
    let unserved = Projected::start(&client, &missing, Selector::default(), true, exists, limits);
    ensure!(
        unserved
            .wait_settled(std::time::Duration::from_secs(30))
            .await
    );
    ensure!(unserved.unserved() && unserved.get(None, "x").is_none());
    Ok(())
}
