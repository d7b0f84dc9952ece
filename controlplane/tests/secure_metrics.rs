//! The controller's `/metrics` over TLS for authorized readers only (issue 39 item 4), with
//! the real binary as shipped (`run --secure-metrics-addr`), authenticating as its
//! ServiceAccount with the ClusterRole and the `system:auth-delegator` binding of
//! manifests/controller, against a real kube-apiserver that reviews the tokens:
//! - no token, a bad token, a token over 8 KiB: 401; a valid token of an identity without
//!   `get /metrics`: 403 naming it; Prometheus's ServiceAccount bound as
//!   manifests/monitoring/metrics-reader.yaml binds it: 200 with our metrics;
//! - repeated scrapes reuse the decision (at most one TokenReview per token a minute);
//! - the plain admin port answers the probes, and 404 for /metrics;
//! - the serving certificate is the one in `--metrics-cert-dir`, verified against its CA.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use hcp_olm_e2e::{Cluster, ClusterOptions};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
use kube::Api;
use kube::api::PostParams;
use rustls::pki_types::pem::PemObject;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn repo_file(p: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..").join(p)
}

fn docs(path: &str) -> Result<Vec<serde_json::Value>> {
    let text = std::fs::read_to_string(repo_file(path))?;
    serde_yaml_ng::Deserializer::from_str(&text)
        .map(|d| serde::Deserialize::deserialize(d).map_err(anyhow::Error::from))
        .collect()
}

async fn create_rbac(cluster: &Cluster, path: &str) -> Result<()> {
    for v in docs(path)? {
        match v["kind"].as_str() {
            Some("ClusterRole") => {
                let r: ClusterRole = serde_json::from_value(v)?;
                Api::<ClusterRole>::all(cluster.client())
                    .create(&PostParams::default(), &r)
                    .await?;
            }
            Some("ClusterRoleBinding") => {
                let r: ClusterRoleBinding = serde_json::from_value(v)?;
                Api::<ClusterRoleBinding>::all(cluster.client())
                    .create(&PostParams::default(), &r)
                    .await?;
            }
            other => bail!("unexpected {other:?} in {path}"),
        }
    }
    Ok(())
}

struct Controller(Child);

impl Drop for Controller {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `GET path` over TLS (verifying against `ca_pem` for `127.0.0.1`), HTTP/1.0.
async fn get_tls(
    port: u16,
    ca_pem: &str,
    path: &str,
    token: Option<&str>,
) -> Result<(u16, String)> {
    let mut roots = rustls::RootCertStore::empty();
    roots.add(rustls::pki_types::CertificateDer::from_pem_slice(
        ca_pem.as_bytes(),
    )?)?;
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()?
    .with_root_certificates(roots)
    .with_no_client_auth();
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
    let name = rustls::pki_types::ServerName::try_from("127.0.0.1")?.to_owned();
    let mut tls = connector.connect(name, tcp).await?;
    let auth = token
        .map(|t| format!("Authorization: Bearer {t}\r\n"))
        .unwrap_or_default();
    tls.write_all(format!("GET {path} HTTP/1.0\r\nHost: x\r\n{auth}\r\n").as_bytes())
        .await?;
    let mut out = Vec::new();
    let _ = tls.read_to_end(&mut out).await;
    let out = String::from_utf8_lossy(&out).into_owned();
    let code = out
        .split_whitespace()
        .nth(1)
        .context("no status")?
        .parse()?;
    let body = out
        .split_once("\r\n\r\n")
        .map(|b| b.1)
        .unwrap_or("")
        .to_string();
    Ok((code, body))
}

async fn get_plain(port: u16, path: &str) -> Result<(u16, String)> {
    let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
    s.write_all(format!("GET {path} HTTP/1.0\r\nHost: x\r\n\r\n").as_bytes())
        .await?;
    let mut out = String::new();
    s.read_to_string(&mut out).await?;
    let code = out
        .split_whitespace()
        .nth(1)
        .context("no status")?
        .parse()?;
    Ok((
        code,
        out.split_once("\r\n\r\n")
            .map(|b| b.1)
            .unwrap_or("")
            .to_string(),
    ))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn controller_metrics_are_tls_and_for_authorized_readers_only() -> Result<()> {
    let cluster = Cluster::start(ClusterOptions::new("secure-metrics")).await?;
    cluster
        .install_crds(&[
            hcp_olm_e2e::tools::fixtures_dir()
                .join("hypershift/crds/hostedclusters-Hypershift-Default.crd.yaml"),
            repo_file("manifests/crds/hostedolm.yaml"),
        ])
        .await?;
    // The controller's identity, with the shipped RBAC.
    let controller = cluster
        .service_account(
            "hcp-olm-system",
            "hcp-olm-controller",
            Duration::from_secs(3600),
        )
        .await?;
    create_rbac(&cluster, "manifests/controller/clusterrole.yaml").await?;
    create_rbac(&cluster, "manifests/controller/clusterrolebinding.yaml").await?;
    create_rbac(&cluster, "manifests/controller/auth-delegator.yaml").await?;
    // Prometheus, bound as shipped; and someone else.
    let prometheus = cluster
        .service_account(
            "openshift-monitoring",
            "prometheus-k8s",
            Duration::from_secs(3600),
        )
        .await?;
    create_rbac(&cluster, "manifests/monitoring/metrics-reader.yaml").await?;
    let nosy = cluster
        .service_account("tenant", "nosy", Duration::from_secs(3600))
        .await?;

    // The serving certificate, as OpenShift's service CA would write it.
    let ca = hcp_olm_e2e::pki::Ca::new("metrics test CA")?;
    let cert = ca.issue(
        "hcp-olm-controller-metrics",
        &[],
        &["127.0.0.1"],
        hcp_olm_e2e::pki::Usage::Server,
    )?;
    let certs = tempfile::tempdir()?;
    std::fs::write(certs.path().join("tls.crt"), &cert.cert_pem)?;
    std::fs::write(certs.path().join("tls.key"), &cert.key_pem)?;

    let secure = hcp_olm_e2e::ports::free_port()?;
    let admin = hcp_olm_e2e::ports::free_port()?;
    let logs = tempfile::tempdir()?;
    let log = std::fs::File::create(logs.path().join("controller.log"))?;
    let _c = Controller(
        Command::new(env!("CARGO_BIN_EXE_hcp-olm-controller"))
            .args([
                "run",
                "--registry-lookups=false",
                &format!("--admin-addr=127.0.0.1:{admin}"),
                &format!("--secure-metrics-addr=127.0.0.1:{secure}"),
                &format!("--metrics-cert-dir={}", certs.path().display()),
            ])
            .env("KUBECONFIG", &controller.kubeconfig)
            .env_remove("CI")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()?,
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if get_tls(secure, ca.cert_pem(), "/metrics", None)
            .await
            .is_ok()
        {
            break;
        }
        if Instant::now() > deadline {
            bail!(
                "the TLS metrics endpoint never answered:\n{}",
                std::fs::read_to_string(logs.path().join("controller.log"))?
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    let (code, _) = get_tls(secure, ca.cert_pem(), "/metrics", None).await?;
    ensure!(code == 401, "no token: {code}");
    let (code, _) = get_tls(secure, ca.cert_pem(), "/metrics", Some("not-a-token")).await?;
    ensure!(code == 401, "a bad token: {code}");
    let long = "a".repeat(9 * 1024);
    let (code, _) = get_tls(secure, ca.cert_pem(), "/metrics", Some(&long)).await?;
    ensure!(code == 401, "a token over 8 KiB: {code}");
    let (code, body) = get_tls(secure, ca.cert_pem(), "/metrics", nosy.token.as_deref()).await?;
    ensure!(
        code == 403 && body.contains("system:serviceaccount:tenant:nosy"),
        "a tenant's token: {code} {body}"
    );
    let reviews_before = cluster.api_requests(&["POST"], &["tokenreviews"]).await?;
    let token = prometheus.token.as_deref().context("prometheus token")?;
    for i in 0..5 {
        let (code, body) = get_tls(secure, ca.cert_pem(), "/metrics", Some(token)).await?;
        ensure!(
            code == 200 && body.contains("hcp_olm_build_info"),
            "Prometheus's token, scrape {i}: {code} {body}"
        );
    }
    let reviews = cluster.api_requests(&["POST"], &["tokenreviews"]).await? - reviews_before;
    ensure!(
        reviews <= 1,
        "{reviews} TokenReviews for 5 scrapes with one token"
    );
    let (_, body) = get_tls(secure, ca.cert_pem(), "/metrics", Some(token)).await?;
    for (result, at_least) in [
        ("allowed", 5.0),
        ("forbidden", 1.0),
        ("unauthenticated", 3.0),
    ] {
        let v: f64 = body
            .lines()
            .find(|l| {
                l.starts_with("hcp_olm_metrics_requests_total{")
                    && l.contains(&format!("result=\"{result}\""))
            })
            .and_then(|l| l.rsplit_once(' ')?.1.parse().ok())
            .unwrap_or(0.0);
        ensure!(
            v >= at_least,
            "hcp_olm_metrics_requests_total{{result={result}}} = {v}"
        );
    }

    // The plain port: probes yes, metrics no.
    let (code, _) = get_plain(admin, "/healthz").await?;
    ensure!(code == 200, "/healthz {code}");
    let (code, body) = get_plain(admin, "/metrics").await?;
    ensure!(
        code == 404 && body.contains("TLS"),
        "/metrics on the plain port: {code} {body}"
    );
    // No token ever reaches the log.
    let log = std::fs::read_to_string(logs.path().join("controller.log"))?;
    ensure!(!log.contains(token), "a token in the controller's log");
    Ok(())
}
