//! Tier 2: the two-cluster environment is real (CRDs, watches, RBAC, aggregation layer).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use futures::{StreamExt, TryStreamExt};
use hcp_olm_e2e::Environment;
use hcp_olm_e2e::pki::{Ca, Usage};
use hcp_olm_e2e::tools::fixtures_dir;
use k8s_openapi::api::core::v1::{ConfigMap, Pod, Service};
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use k8s_openapi::kube_aggregator::pkg::apis::apiregistration::v1::APIService;
use kube::api::{Api, ListParams, PostParams};
use kube::runtime::{WatchStreamExt, watcher};

fn get(path: &str) -> http::Request<Vec<u8>> {
    http::Request::get(path)
        .body(Vec::new())
        .expect("valid request")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crd_in_one_cluster_is_served_only_there_and_watches_see_objects() -> Result<()> {
    let env = Environment::start().await?;
    let crd = fixtures_dir().join("crds/olm/operators.coreos.com_catalogsources.yaml");
    let names = env.management.install_crds(&[crd]).await?;
    assert_eq!(names, ["catalogsources.operators.coreos.com"]);

    let list = "/apis/operators.coreos.com/v1alpha1/catalogsources";
    let body = env.management.client().request_text(get(list)).await?;
    assert!(
        body.contains("CatalogSourceList"),
        "management serves the CRD: {body}"
    );
    match env.guest.client().request_text(get(list)).await {
        Err(kube::Error::Api(s)) if s.code == 404 => {}
        other => bail!("guest must not serve catalogsources, got {other:?}"),
    }

    // A watch sees an object created through kube::Client.
    env.guest.ensure_namespace("watched").await?;
    let cms: Api<ConfigMap> = Api::namespaced(env.guest.client(), "watched");
    let mut events = watcher(cms.clone(), watcher::Config::default())
        .applied_objects()
        .boxed();
    let cm: ConfigMap = serde_json::from_value(serde_json::json!({
        "metadata": { "name": "hello" }, "data": { "k": "v" }
    }))?;
    cms.create(&PostParams::default(), &cm).await?;
    let seen = tokio::time::timeout(Duration::from_secs(20), async {
        while let Some(obj) = events.try_next().await? {
            if obj.metadata.name.as_deref() == Some("hello") {
                return Ok::<_, anyhow::Error>(obj);
            }
        }
        bail!("watch ended")
    })
    .await
    .context("watch did not deliver the ConfigMap within 20s")??;
    assert_eq!(
        seen.data.unwrap_or_default().get("k").map(String::as_str),
        Some("v")
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rbac_denies_until_a_role_binding_allows() -> Result<()> {
    let env = Environment::start().await?;
    let sa = env
        .guest
        .service_account("rbac-test", "reader", Duration::from_secs(3600))
        .await?;
    let pods: Api<Pod> = Api::namespaced(sa.client.clone(), "rbac-test");
    match pods.list(&ListParams::default()).await {
        Err(kube::Error::Api(s)) if s.code == 403 => {}
        other => bail!("expected 403 without a binding, got {other:?}"),
    }
    // The same SA in the other cluster does not exist at all: 401 there.
    let admin = env.guest.client();
    let role: Role = serde_json::from_value(serde_json::json!({
        "metadata": { "name": "pod-reader", "namespace": "rbac-test" },
        "rules": [{ "apiGroups": [""], "resources": ["pods"], "verbs": ["list"] }],
    }))?;
    Api::<Role>::namespaced(admin.clone(), "rbac-test")
        .create(&PostParams::default(), &role)
        .await?;
    let binding: RoleBinding = serde_json::from_value(serde_json::json!({
        "metadata": { "name": "reader", "namespace": "rbac-test" },
        "roleRef": { "apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "pod-reader" },
        "subjects": [{ "kind": "ServiceAccount", "name": "reader", "namespace": "rbac-test" }],
    }))?;
    Api::<RoleBinding>::namespaced(admin, "rbac-test")
        .create(&PostParams::default(), &binding)
        .await?;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    loop {
        match pods.list(&ListParams::default()).await {
            Ok(_) => break,
            Err(kube::Error::Api(s)) if s.code == 403 && tokio::time::Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(200)).await
            }
            Err(e) => bail!("still denied after binding: {e}"),
        }
    }
    // Rights are scoped: other namespaces stay forbidden.
    let other: Api<Pod> = Api::namespaced(sa.client.clone(), "default");
    match other.list(&ListParams::default()).await {
        Err(kube::Error::Api(s)) if s.code == 403 => {}
        r => bail!("expected 403 in another namespace, got {r:?}"),
    }
    // The management cluster does not know this token.
    let foreign = hcp_olm_e2e::kubeconfig::render(
        "m",
        env.management.url(),
        env.management.ca_pem(),
        "x",
        hcp_olm_e2e::kubeconfig::Credentials::Token(sa.token.as_deref().unwrap_or_default()),
    );
    let foreign = hcp_olm_e2e::kubeconfig::client(&foreign).await?;
    match Api::<Pod>::namespaced(foreign, "default")
        .list(&ListParams::default())
        .await
    {
        Err(kube::Error::Api(s)) if s.code == 401 => {}
        r => bail!("expected 401 from the other cluster, got {r:?}"),
    }
    Ok(())
}

/// A minimal aggregated API server: TLS with client certificates from the front proxy,
/// discovery for `test.hcp-olm.io/v1` and a `widgets` list naming the user it was proxied for.
mod aggregated {
    use super::*;
    use http_body_util::Full;
    use hyper::body::{Bytes, Incoming};
    use hyper::{Request, Response};
    use hyper_util::rt::{TokioExecutor, TokioIo};
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    use tokio::net::TcpListener;

    pub async fn serve(
        listener: TcpListener,
        cert_pem: &str,
        key_pem: &str,
        client_ca_pem: &str,
        users: Arc<Mutex<Vec<String>>>,
    ) -> Result<()> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut roots = rustls::RootCertStore::empty();
        roots.add(CertificateDer::from_pem_slice(client_ca_pem.as_bytes())?)?;
        let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
            Arc::new(roots),
            provider.clone(),
        )
        .build()?;
        let mut config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()?
            .with_client_cert_verifier(verifier)
            .with_single_cert(
                vec![CertificateDer::from_pem_slice(cert_pem.as_bytes())?],
                PrivateKeyDer::from_pem_slice(key_pem.as_bytes())?,
            )?;
        config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        loop {
            let (tcp, _) = listener.accept().await?;
            let acceptor = acceptor.clone();
            let users = users.clone();
            tokio::spawn(async move {
                let Ok(tls) = acceptor.accept(tcp).await else {
                    return;
                };
                let svc = hyper::service::service_fn(move |req| handle(req, users.clone()));
                let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(tls), svc)
                    .await;
            });
        }
    }

    async fn handle(
        req: Request<Incoming>,
        users: Arc<Mutex<Vec<String>>>,
    ) -> Result<Response<Full<Bytes>>, std::convert::Infallible> {
        let user = req
            .headers()
            .get("X-Remote-User")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_string();
        let path = req.uri().path().to_string();
        let body = if path == "/apis/test.hcp-olm.io/v1" {
            Some(serde_json::json!({
                "kind": "APIResourceList", "apiVersion": "v1", "groupVersion": "test.hcp-olm.io/v1",
                "resources": [{ "name": "widgets", "singularName": "widget", "namespaced": true,
                                "kind": "Widget", "verbs": ["get", "list"] }]
            }))
        } else if let Some(ns) = path
            .strip_prefix("/apis/test.hcp-olm.io/v1/namespaces/")
            .and_then(|rest| rest.strip_suffix("/widgets"))
        {
            users
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(user.clone());
            Some(serde_json::json!({
                "apiVersion": "test.hcp-olm.io/v1", "kind": "WidgetList", "metadata": {},
                "items": [{ "apiVersion": "test.hcp-olm.io/v1", "kind": "Widget",
                            "metadata": { "name": format!("for-{user}"), "namespace": ns } }]
            }))
        } else {
            None
        };
        let (status, body) = match body {
            Some(b) => (200, b),
            None => (
                404,
                serde_json::json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 404}),
            ),
        };
        Ok(Response::builder()
            .status(status)
            .header("Content-Type", "application/json")
            .body(Full::new(Bytes::from(body.to_string())))
            .expect("valid response"))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn apiservice_is_served_through_the_guest_aggregation_layer() -> Result<()> {
    let env = Environment::start().await?;
    let guest = &env.guest;

    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let port = listener.local_addr()?.port();
    let ca = Ca::new("widgets-ca")?;
    let cert = ca.issue(
        "widgets-api",
        &[],
        &[
            "widgets-api.default.svc",
            "widgets-api.default.svc.cluster.local",
        ],
        Usage::Server,
    )?;
    let users = Arc::new(Mutex::new(Vec::new()));
    let server = tokio::spawn({
        let (c, k, fp, u) = (
            cert.cert_pem.clone(),
            cert.key_pem.clone(),
            guest.front_proxy_ca_pem().to_string(),
            users.clone(),
        );
        async move { aggregated::serve(listener, &c, &k, &fp, u).await }
    });

    // Routing without kube-proxy: an ExternalName Service to loopback.
    let svc: Service = serde_json::from_value(serde_json::json!({
        "metadata": { "name": "widgets-api", "namespace": "default" },
        "spec": { "type": "ExternalName", "externalName": "localhost",
                  "ports": [{ "name": "https", "port": port, "protocol": "TCP" }] }
    }))?;
    Api::<Service>::namespaced(guest.client(), "default")
        .create(&PostParams::default(), &svc)
        .await?;
    use base64::Engine as _;
    let apisvc: APIService = serde_json::from_value(serde_json::json!({
        "metadata": { "name": "v1.test.hcp-olm.io" },
        "spec": { "group": "test.hcp-olm.io", "version": "v1",
                  "service": { "namespace": "default", "name": "widgets-api", "port": port },
                  "caBundle": base64::engine::general_purpose::STANDARD.encode(ca.cert_pem()),
                  "groupPriorityMinimum": 1000, "versionPriority": 15 }
    }))?;
    let apisvcs: Api<APIService> = Api::all(guest.client());
    apisvcs.create(&PostParams::default(), &apisvc).await?;

    // The APIService becomes Available, and a list goes through the aggregator with the
    // caller's identity in the front-proxy headers.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    let body = loop {
        let available = apisvcs
            .get("v1.test.hcp-olm.io")
            .await?
            .status
            .and_then(|s| s.conditions)
            .unwrap_or_default()
            .iter()
            .any(|c| c.type_ == "Available" && c.status == "True");
        if available {
            match guest
                .client()
                .request_text(get("/apis/test.hcp-olm.io/v1/namespaces/default/widgets"))
                .await
            {
                Ok(body) => break body,
                Err(e) if tokio::time::Instant::now() > deadline => bail!("not served: {e}"),
                Err(_) => {}
            }
        } else if tokio::time::Instant::now() > deadline {
            bail!(
                "APIService never became Available; server: {:?}",
                server.is_finished()
            );
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    };
    assert!(
        body.contains("\"for-hcp-olm-admin\""),
        "proxied identity in {body}"
    );
    assert!(users.lock().unwrap().iter().any(|u| u == "hcp-olm-admin"));
    // The management cluster knows nothing of it.
    match env
        .management
        .client()
        .request_text(get("/apis/test.hcp-olm.io/v1/namespaces/default/widgets"))
        .await
    {
        Err(kube::Error::Api(s)) if s.code == 404 => {}
        r => bail!("management must not serve widgets: {r:?}"),
    }
    server.abort();
    Ok(())
}
