//! Real control planes (etcd + kube-apiserver as processes) for tests and the demo.
//!
//! Each [`Cluster`] has RBAC authorization, service-account signing keys and the
//! aggregation-layer (front-proxy) flags and certificates that APIServices need.
//! Dropping it kills kube-apiserver and etcd by PID, waits for them, and removes its directory.

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{Namespace, ServiceAccount};
use kube::api::{Api, ObjectMeta, PostParams};

use crate::kubeconfig::{self, Credentials};
use crate::pki::{self, Ca, Usage};
use crate::process::{self, ManagedProcess};
use crate::{ports, tools};

/// Errors starting or using a test control plane.
#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    #[error(transparent)]
    Tool(#[from] tools::ToolError),
    #[error(transparent)]
    Pki(#[from] pki::PkiError),
    #[error(transparent)]
    Process(#[from] process::ProcessError),
    #[error("{what}: {source}")]
    Io {
        what: String,
        source: std::io::Error,
    },
    #[error("{what}: {source}")]
    Kube { what: String, source: kube::Error },
    #[error("{0}")]
    Setup(String),
    #[error("{component} of cluster `{cluster}` {problem}; last log lines:\n{log}")]
    NotReady {
        cluster: String,
        component: String,
        problem: String,
        log: String,
    },
}

fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> ClusterError {
    let what = what.into();
    move |source| ClusterError::Io { what, source }
}

fn kube_err(what: impl Into<String>) -> impl FnOnce(kube::Error) -> ClusterError {
    let what = what.into();
    move |source| ClusterError::Kube { what, source }
}

/// Options for [`Cluster::start`].
#[derive(Debug, Clone)]
pub struct ClusterOptions {
    /// A short name, used in kubeconfigs, logs and error messages.
    pub name: String,
    /// Address kube-apiserver binds to (and advertises). Default 127.0.0.1.
    pub bind_address: IpAddr,
    /// The Service ClusterIP range. Never routed; addresses are only allocated.
    pub service_cidr: String,
    /// Extra SANs for the serving certificate (names or IPs).
    pub extra_sans: Vec<String>,
    /// Extra kube-apiserver flags (`--flag=value`).
    pub extra_apiserver_args: Vec<String>,
    /// Whether the ServiceAccount admission plugin runs (it is on in every real cluster): it
    /// gives a pod its ServiceAccount's `imagePullSecrets` and token volume, and refuses a
    /// pod whose ServiceAccount does not exist. Off by default: without a
    /// kube-controller-manager ([`crate::realnode::ClusterControllers`]) no namespace has its
    /// `default` ServiceAccount.
    pub service_account_admission: bool,
    /// How long to wait for `/readyz`.
    pub ready_timeout: Duration,
    /// Use this etcd (under its own key prefix) instead of starting one.
    pub shared_etcd: Option<SharedEtcd>,
}

/// One etcd that several API servers share, each under its own `--etcd-prefix`
/// (used by the controller benchmark to run many guest API servers).
#[derive(Clone, Debug)]
pub struct SharedEtcd {
    process: ManagedProcess,
    url: String,
    prefix: String,
    _dir: std::sync::Arc<tempfile::TempDir>,
}

impl SharedEtcd {
    /// Starts an etcd for API servers to share.
    pub fn start(name: &str) -> Result<Self, ClusterError> {
        let dir = tempfile::Builder::new()
            .prefix(&format!("hcp-olm-{name}-"))
            .tempdir()
            .map_err(io("creating the etcd directory"))?;
        let (process, url) = spawn_etcd(name, dir.path())?;
        Ok(Self {
            process,
            url,
            prefix: "/registry".into(),
            _dir: std::sync::Arc::new(dir),
        })
    }

    /// The same etcd, for an API server storing under `/<prefix>`.
    pub fn with_prefix(&self, prefix: &str) -> Self {
        Self {
            prefix: format!("/{}", prefix.trim_start_matches('/')),
            ..self.clone()
        }
    }

    /// The etcd process id.
    pub fn pid(&self) -> u32 {
        self.process.pid()
    }
}

fn spawn_etcd(name: &str, d: &Path) -> Result<(ManagedProcess, String), ClusterError> {
    let etcd_bin = tools::bin("etcd")?;
    let client_port = ports::free_port().map_err(io("finding a port for etcd"))?;
    let peer_port = ports::free_port().map_err(io("finding a port for etcd peers"))?;
    let etcd_url = format!("http://127.0.0.1:{client_port}");
    let peer_url = format!("http://127.0.0.1:{peer_port}");
    let mut cmd = process::command(&etcd_bin);
    cmd.args([
        "--name=default",
        &format!("--data-dir={}", d.join("etcd").display()),
        &format!("--listen-client-urls={etcd_url}"),
        &format!("--advertise-client-urls={etcd_url}"),
        &format!("--listen-peer-urls={peer_url}"),
        &format!("--initial-advertise-peer-urls={peer_url}"),
        &format!("--initial-cluster=default={peer_url}"),
        "--unsafe-no-fsync=true",
        "--log-level=warn",
    ]);
    let etcd = ManagedProcess::spawn(&format!("{name}-etcd"), cmd, &d.join("etcd.log"))?;
    Ok((etcd, etcd_url))
}

impl ClusterOptions {
    /// Defaults for a cluster called `name`.
    pub fn new(name: &str) -> Self {
        Self {
            name: name.to_string(),
            bind_address: IpAddr::from([127, 0, 0, 1]),
            service_cidr: "198.19.255.0/24".to_string(),
            extra_sans: Vec::new(),
            extra_apiserver_args: Vec::new(),
            service_account_admission: false,
            ready_timeout: Duration::from_secs(90),
            shared_etcd: None,
        }
    }
}

/// A client and kubeconfig for one identity.
#[derive(Clone)]
pub struct Identity {
    /// A client authenticating as this identity.
    pub client: kube::Client,
    /// A kubeconfig file for this identity.
    pub kubeconfig: PathBuf,
    /// The bearer token, for identities that use one.
    pub token: Option<String>,
}

impl std::fmt::Debug for Identity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Identity")
            .field("kubeconfig", &self.kubeconfig)
            .finish_non_exhaustive()
    }
}

/// A running etcd + kube-apiserver pair.
pub struct Cluster {
    // Field order is drop order: the API server stops before etcd, both before the directory goes.
    apiserver: ManagedProcess,
    etcd: ManagedProcess,
    name: String,
    url: String,
    port: u16,
    ca: Ca,
    front_proxy_ca_pem: String,
    service_cidr: String,
    admin: Identity,
    dir: tempfile::TempDir,
}

impl std::fmt::Debug for Cluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cluster")
            .field("name", &self.name)
            .field("url", &self.url)
            .finish_non_exhaustive()
    }
}

impl Cluster {
    /// Starts etcd and kube-apiserver and waits until `/readyz` answers ok.
    pub async fn start(opts: ClusterOptions) -> Result<Self, ClusterError> {
        let apiserver_bin = tools::bin("kube-apiserver")?;
        let dir = tempfile::Builder::new()
            .prefix(&format!("hcp-olm-{}-", opts.name))
            .tempdir()
            .map_err(io("creating the cluster directory"))?;
        let d = dir.path();
        let write = |name: &str, contents: &str| -> Result<PathBuf, ClusterError> {
            let p = d.join(name);
            std::fs::write(&p, contents).map_err(io(format!("writing {}", p.display())))?;
            Ok(p)
        };

        // PKI: one CA for serving and client certs, one front-proxy CA, a service-account key pair.
        let ca = Ca::new(&format!("{}-ca", opts.name))?;
        let bind = opts.bind_address.to_string();
        let mut sans: Vec<&str> = vec![
            "127.0.0.1",
            "localhost",
            &bind,
            "kubernetes",
            "kubernetes.default",
            "kubernetes.default.svc",
            "kubernetes.default.svc.cluster.local",
        ];
        // The `kubernetes` Service's ClusterIP (the range's first address), as every API
        // server's certificate has: pods' in-cluster clients dial it.
        // (of the first range: a dual-stack `v4,v6` list has its IPv4 range first)
        let first_range = opts.service_cidr.split(',').next().unwrap_or_default();
        let service_ip = kubernetes_service_ip(first_range).ok_or_else(|| {
            ClusterError::Setup(format!(
                "service CIDR {:?} is not an IPv4 or IPv6 CIDR",
                opts.service_cidr
            ))
        })?;
        sans.push(&service_ip);
        sans.extend(opts.extra_sans.iter().map(String::as_str));
        let serving = ca.issue("kube-apiserver", &[], &sans, Usage::Server)?;
        let admin_cert = ca.issue("hcp-olm-admin", &["system:masters"], &[], Usage::Client)?;
        let front_proxy_ca = Ca::new(&format!("{}-front-proxy-ca", opts.name))?;
        let front_proxy_client =
            front_proxy_ca.issue("front-proxy-client", &[], &[], Usage::Client)?;
        let (sa_key, sa_pub) = pki::signing_key_pair()?;
        let ca_file = write("ca.crt", ca.cert_pem())?;
        let serving_crt = write("apiserver.crt", &serving.cert_pem)?;
        let serving_key = write("apiserver.key", &serving.key_pem)?;
        let fp_ca_file = write("front-proxy-ca.crt", front_proxy_ca.cert_pem())?;
        let fp_crt = write("front-proxy-client.crt", &front_proxy_client.cert_pem)?;
        let fp_key = write("front-proxy-client.key", &front_proxy_client.key_pem)?;
        let sa_key_file = write("sa.key", &sa_key)?;
        let sa_pub_file = write("sa.pub", &sa_pub)?;

        // etcd: our own, or a shared one under a key prefix
        let (etcd, etcd_url, etcd_prefix) = match &opts.shared_etcd {
            Some(shared) => (
                shared.process.clone(),
                shared.url.clone(),
                shared.prefix.clone(),
            ),
            None => {
                let (p, url) = spawn_etcd(&opts.name, d)?;
                (p, url, "/registry".to_string())
            }
        };

        // kube-apiserver
        let port = ports::free_port().map_err(io("finding a port for kube-apiserver"))?;
        let host = match opts.bind_address {
            IpAddr::V6(a) => format!("[{a}]"),
            IpAddr::V4(a) => a.to_string(),
        };
        let url = format!("https://{host}:{port}");
        let p = |path: &Path| path.display().to_string();
        let mut args = vec![
            format!("--etcd-servers={etcd_url}"),
            format!("--etcd-prefix={etcd_prefix}"),
            format!("--bind-address={bind}"),
            format!("--advertise-address={bind}"),
            format!("--secure-port={port}"),
            format!("--cert-dir={}", p(&d.join("certs"))),
            format!("--tls-cert-file={}", p(&serving_crt)),
            format!("--tls-private-key-file={}", p(&serving_key)),
            format!("--client-ca-file={}", p(&ca_file)),
            "--authorization-mode=RBAC".to_string(),
            format!("--service-cluster-ip-range={}", opts.service_cidr),
            "--allow-privileged=true".to_string(),
            format!("--service-account-issuer={url}"),
            format!("--service-account-key-file={}", p(&sa_pub_file)),
            format!("--service-account-signing-key-file={}", p(&sa_key_file)),
            format!("--api-audiences={url}"),
            // Aggregation layer.
            format!("--requestheader-client-ca-file={}", p(&fp_ca_file)),
            "--requestheader-allowed-names=front-proxy-client".to_string(),
            "--requestheader-username-headers=X-Remote-User".to_string(),
            "--requestheader-group-headers=X-Remote-Group".to_string(),
            "--requestheader-extra-headers-prefix=X-Remote-Extra-".to_string(),
            format!("--proxy-client-cert-file={}", p(&fp_crt)),
            format!("--proxy-client-key-file={}", p(&fp_key)),
            "--enable-priority-and-fairness=false".to_string(),
            "--profiling=false".to_string(),
            "--v=1".to_string(),
        ];
        // The endpoint reconciler rejects loopback addresses; on any other address (a real
        // node's cluster) it publishes the `kubernetes` Service's endpoints, so pods reach the
        // API server through its ClusterIP as in a real cluster.
        if opts.bind_address.is_loopback() {
            args.push("--endpoint-reconciler-type=none".to_string());
        }
        if !opts.service_account_admission {
            args.push("--disable-admission-plugins=ServiceAccount".to_string());
        }
        args.extend(opts.extra_apiserver_args.iter().cloned());
        let mut cmd = process::command(&apiserver_bin);
        cmd.args(&args);
        let apiserver = ManagedProcess::spawn(
            &format!("{}-kube-apiserver", opts.name),
            cmd,
            &d.join("kube-apiserver.log"),
        )?;

        let admin_yaml = kubeconfig::render(
            &opts.name,
            &url,
            ca.cert_pem(),
            "admin",
            Credentials::ClientCert {
                cert_pem: &admin_cert.cert_pem,
                key_pem: &admin_cert.key_pem,
            },
        );
        let admin_path = write("admin.kubeconfig", &admin_yaml)?;
        let client = kubeconfig::client(&admin_yaml)
            .await
            .map_err(kube_err("building the admin client"))?;
        wait_ready(&opts, &client, &etcd, &apiserver).await?;

        Ok(Self {
            apiserver,
            etcd,
            name: opts.name,
            url,
            port,
            ca,
            front_proxy_ca_pem: front_proxy_ca.cert_pem().to_string(),
            service_cidr: opts.service_cidr,
            admin: Identity {
                client,
                kubeconfig: admin_path,
                token: None,
            },
            dir,
        })
    }

    /// The cluster's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The Service ClusterIP range (`--service-cluster-ip-range`).
    pub fn service_cidr(&self) -> &str {
        &self.service_cidr
    }

    /// The API server URL (`https://127.0.0.1:<port>`).
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The API server port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// An admin (`system:masters`) client.
    pub fn client(&self) -> kube::Client {
        self.admin.client.clone()
    }

    /// The admin kubeconfig file.
    pub fn kubeconfig(&self) -> &Path {
        &self.admin.kubeconfig
    }

    /// The cluster CA (serving and client certificates) as PEM.
    pub fn ca_pem(&self) -> &str {
        self.ca.cert_pem()
    }

    /// The front-proxy CA that signs the aggregator's client certificate, as PEM.
    pub fn front_proxy_ca_pem(&self) -> &str {
        &self.front_proxy_ca_pem
    }

    /// The cluster's working directory (certificates, logs, kubeconfigs).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The process ids of kube-apiserver and etcd.
    pub fn pids(&self) -> [u32; 2] {
        [self.apiserver.pid(), self.etcd.pid()]
    }

    /// Issues a client certificate for `user` in `groups` and returns a client and kubeconfig.
    pub async fn user(&self, user: &str, groups: &[&str]) -> Result<Identity, ClusterError> {
        let cert = self.ca.issue(user, groups, &[], Usage::Client)?;
        let yaml = kubeconfig::render(
            &self.name,
            &self.url,
            self.ca.cert_pem(),
            user,
            Credentials::ClientCert {
                cert_pem: &cert.cert_pem,
                key_pem: &cert.key_pem,
            },
        );
        self.identity(&format!("user-{user}"), yaml, None).await
    }

    /// Ensures namespace `ns` and ServiceAccount `ns/name` exist, requests a token for it
    /// (valid for `ttl`), and returns a client and kubeconfig authenticating as it.
    pub async fn service_account(
        &self,
        ns: &str,
        name: &str,
        ttl: Duration,
    ) -> Result<Identity, ClusterError> {
        self.ensure_namespace(ns).await?;
        let sas: Api<ServiceAccount> = Api::namespaced(self.client(), ns);
        let sa = ServiceAccount {
            metadata: ObjectMeta {
                name: Some(name.to_string()),
                ..Default::default()
            },
            ..Default::default()
        };
        match sas.create(&PostParams::default(), &sa).await {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 409 => {}
            Err(e) => return Err(kube_err(format!("creating ServiceAccount {ns}/{name}"))(e)),
        }
        let request = TokenRequest {
            spec: Some(TokenRequestSpec {
                audiences: Some(vec![self.url.clone()]),
                expiration_seconds: Some(ttl.as_secs().try_into().unwrap_or(i64::MAX)),
                ..Default::default()
            }),
            ..Default::default()
        };
        let token = sas
            .create_token_request(name, &PostParams::default(), &request)
            .await
            .map_err(kube_err(format!("requesting a token for {ns}/{name}")))?
            .status
            .and_then(|s| s.token)
            .ok_or_else(|| ClusterError::NotReady {
                cluster: self.name.clone(),
                component: format!("TokenRequest for {ns}/{name}"),
                problem: "returned no token".into(),
                log: String::new(),
            })?;
        let yaml = kubeconfig::render(
            &self.name,
            &self.url,
            self.ca.cert_pem(),
            &format!("system:serviceaccount:{ns}:{name}"),
            Credentials::Token(&token),
        );
        self.identity(&format!("sa-{ns}-{name}"), yaml, Some(token))
            .await
    }

    /// Creates namespace `ns` if it does not exist.
    pub async fn ensure_namespace(&self, ns: &str) -> Result<(), ClusterError> {
        let nss: Api<Namespace> = Api::all(self.client());
        let obj = Namespace {
            metadata: ObjectMeta {
                name: Some(ns.to_string()),
                ..Default::default()
            },
            ..Default::default()
        };
        match nss.create(&PostParams::default(), &obj).await {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(s)) if s.code == 409 => Ok(()),
            Err(e) => Err(kube_err(format!("creating namespace {ns}"))(e)),
        }
    }

    /// Creates the ValidatingAdmissionPolicies and bindings in the YAML file at `path`
    /// (`manifests/controller/admission-policy.yaml`).
    pub async fn create_admission_policies(&self, path: &Path) -> Result<(), ClusterError> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| ClusterError::Setup(format!("{}: {e}", path.display())))?;
        for doc in serde_yaml_ng::Deserializer::from_str(&text) {
            let v: serde_json::Value = serde::Deserialize::deserialize(doc)
                .map_err(|e| ClusterError::Setup(format!("{}: {e}", path.display())))?;
            let kind = v["kind"].as_str().unwrap_or_default().to_string();
            let plural = match kind.as_str() {
                "ValidatingAdmissionPolicy" => "validatingadmissionpolicies",
                "ValidatingAdmissionPolicyBinding" => "validatingadmissionpolicybindings",
                other => {
                    return Err(ClusterError::Setup(format!(
                        "{}: unexpected kind {other:?}",
                        path.display()
                    )));
                }
            };
            let ar = kube::api::ApiResource::from_gvk_with_plural(
                &kube::api::GroupVersionKind::gvk("admissionregistration.k8s.io", "v1", &kind),
                plural,
            );
            let obj: kube::api::DynamicObject = serde_json::from_value(v)
                .map_err(|e| ClusterError::Setup(format!("{}: {e}", path.display())))?;
            Api::<kube::api::DynamicObject>::all_with(self.client(), &ar)
                .create(&PostParams::default(), &obj)
                .await
                .map_err(kube_err(format!("creating {kind} from {}", path.display())))?;
        }
        Ok(())
    }

    /// A hosted control plane namespace as HyperShift makes it: `ns` with the label
    /// `hypershift.openshift.io/hosted-control-plane` (the controller writes only into
    /// namespaces that carry it).
    pub async fn ensure_hcp_namespace(&self, ns: &str) -> Result<(), ClusterError> {
        self.ensure_namespace(ns).await?;
        let nss: Api<Namespace> = Api::all(self.client());
        nss.patch(
            ns,
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(serde_json::json!({"metadata": {"labels": {
                "hypershift.openshift.io/hosted-control-plane": "true"}}})),
        )
        .await
        .map_err(kube_err(format!("labelling namespace {ns}")))?;
        Ok(())
    }

    /// Write requests (POST, PUT, PATCH, server-side APPLY, DELETE) the API server itself has
    /// counted so far for the given resources (plural names), from `apiserver_request_total`.
    /// Take the difference of two calls to count the writes of a piece of work.
    pub async fn api_writes(&self, resources: &[&str]) -> Result<u64, ClusterError> {
        self.api_requests(&["POST", "PUT", "PATCH", "APPLY", "DELETE"], resources)
            .await
    }

    /// Requests with one of `verbs` (as the API server labels them: `GET`, `LIST`,
    /// `WATCH`, `APPLY`, ...) on `resources` so far, from `apiserver_request_total`.
    pub async fn api_requests(
        &self,
        verbs: &[&str],
        resources: &[&str],
    ) -> Result<u64, ClusterError> {
        let req = http::Request::get("/metrics")
            .body(Vec::new())
            .expect("static request is valid");
        let text = self
            .client()
            .request_text(req)
            .await
            .map_err(kube_err("reading /metrics"))?;
        Ok(count_requests(&text, verbs, resources))
    }

    /// Creates (or replaces) the CustomResourceDefinitions in the given YAML files and waits
    /// until each is Established. Returns the CRD names.
    pub async fn install_crds(&self, files: &[PathBuf]) -> Result<Vec<String>, ClusterError> {
        use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
        use kube::api::{Patch, PatchParams};
        use kube::runtime::wait::{await_condition, conditions};

        let crds: Api<CustomResourceDefinition> = Api::all(self.client());
        let mut names = Vec::new();
        for file in files {
            let text =
                std::fs::read_to_string(file).map_err(io(format!("reading {}", file.display())))?;
            for doc in serde_yaml_ng::Deserializer::from_str(&text) {
                let value: serde_json::Value =
                    serde::Deserialize::deserialize(doc).map_err(|e| {
                        io(format!("parsing {}", file.display()))(std::io::Error::other(e))
                    })?;
                if value.is_null() {
                    continue;
                }
                let crd: CustomResourceDefinition = serde_json::from_value(value).map_err(|e| {
                    io(format!("reading a CRD from {}", file.display()))(std::io::Error::other(e))
                })?;
                let name = crd.metadata.name.clone().unwrap_or_default();
                crds.patch(
                    &name,
                    &PatchParams::apply("hcp-olm-e2e").force(),
                    &Patch::Apply(&crd),
                )
                .await
                .map_err(kube_err(format!("applying CRD {name}")))?;
                names.push(name);
            }
        }
        for name in &names {
            tokio::time::timeout(
                Duration::from_secs(30),
                await_condition(crds.clone(), name, conditions::is_crd_established()),
            )
            .await
            .map_err(|_| ClusterError::NotReady {
                cluster: self.name.clone(),
                component: format!("CRD {name}"),
                problem: "not Established within 30s".into(),
                log: String::new(),
            })?
            .map_err(|e| ClusterError::Kube {
                what: format!("waiting for CRD {name}"),
                source: kube::Error::Service(Box::new(e)),
            })?;
        }
        Ok(names)
    }

    async fn identity(
        &self,
        file: &str,
        yaml: String,
        token: Option<String>,
    ) -> Result<Identity, ClusterError> {
        let path = self.dir.path().join(format!("{file}.kubeconfig"));
        std::fs::write(&path, &yaml).map_err(io(format!("writing {}", path.display())))?;
        let client = kubeconfig::client(&yaml)
            .await
            .map_err(kube_err(format!("building a client for {file}")))?;
        Ok(Identity {
            client,
            kubeconfig: path,
            token,
        })
    }
}

/// Sums `apiserver_request_total` samples of write verbs for the given resources.
fn count_requests(metrics: &str, verbs: &[&str], resources: &[&str]) -> u64 {
    let label = |line: &str, name: &str| -> Option<String> {
        let start = line.find(&format!("{name}=\""))? + name.len() + 2;
        let end = line[start..].find('"')? + start;
        Some(line[start..end].to_string())
    };
    metrics
        .lines()
        .filter(|l| l.starts_with("apiserver_request_total{"))
        .filter(|l| {
            label(l, "verb").is_some_and(|v| verbs.contains(&v.as_str()))
                && label(l, "resource").is_some_and(|r| resources.contains(&r.as_str()))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .map(|n| n as u64)
        .sum()
}

async fn wait_ready(
    opts: &ClusterOptions,
    client: &kube::Client,
    etcd: &ManagedProcess,
    apiserver: &ManagedProcess,
) -> Result<(), ClusterError> {
    let started = Instant::now();
    let not_ready = |component: &ManagedProcess, problem: String| ClusterError::NotReady {
        cluster: opts.name.clone(),
        component: component.name().to_string(),
        problem,
        log: component.log_tail(25),
    };
    let mut last;
    loop {
        for p in [etcd, apiserver] {
            if let Some(status) = p.exited() {
                return Err(not_ready(p, format!("exited early ({status})")));
            }
        }
        let req = http::Request::get("/readyz")
            .body(Vec::new())
            .expect("static request is valid");
        match client.request_text(req).await {
            Ok(body) if body.trim() == "ok" => return Ok(()),
            Ok(body) => last = body,
            Err(e) => last = e.to_string(),
        }
        if started.elapsed() > opts.ready_timeout {
            return Err(not_ready(
                apiserver,
                format!(
                    "not ready after {:?} (last /readyz answer: {last})",
                    opts.ready_timeout
                ),
            ));
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// The first address of an IPv4 or IPv6 service CIDR (the `kubernetes` Service's ClusterIP).
pub fn kubernetes_service_ip(cidr: &str) -> Option<String> {
    let (net, len) = cidr.split_once('/')?;
    let len: u32 = len.parse().ok()?;
    if let Ok(net) = net.parse::<std::net::Ipv4Addr>() {
        let len = Some(len).filter(|l| (1..=30).contains(l))?;
        let mask = u32::MAX << (32 - len);
        return Some(std::net::Ipv4Addr::from((u32::from(net) & mask) + 1).to_string());
    }
    // IPv6 (issue 19): a range of at least 4 addresses
    let net: std::net::Ipv6Addr = net.parse().ok()?;
    let len = Some(len).filter(|l| (1..=126).contains(l))?;
    let mask = u128::MAX << (128 - len);
    Some(std::net::Ipv6Addr::from((u128::from(net) & mask) + 1).to_string())
}

#[cfg(test)]
mod tests {
    #[test]
    fn counts_only_write_verbs_of_the_given_resources() {
        let m = r#"# HELP apiserver_request_total x
apiserver_request_total{code="201",resource="configmaps",verb="POST"} 2
apiserver_request_total{code="200",resource="configmaps",verb="APPLY"} 3
apiserver_request_total{code="200",resource="configmaps",verb="LIST"} 40
apiserver_request_total{code="200",resource="leases",verb="PUT"} 9
apiserver_request_total{code="200",resource="configmapsx",verb="PUT"} 7
"#;
        let writes = ["POST", "PUT", "PATCH", "APPLY", "DELETE"];
        assert_eq!(super::count_requests(m, &writes, &["configmaps"]), 5);
        assert_eq!(super::count_requests(m, &writes, &["secrets"]), 0);
        assert_eq!(
            super::count_requests(m, &["GET", "LIST"], &["configmaps"]),
            40
        );
    }
}

/// The two clusters of the mission: the management cluster (where HCP namespaces live) and
/// one guest cluster.
#[derive(Debug)]
pub struct Environment {
    /// The management cluster.
    pub management: Cluster,
    /// The guest (hosted) cluster.
    pub guest: Cluster,
}

impl Environment {
    /// Starts both clusters concurrently.
    pub async fn start() -> Result<Self, ClusterError> {
        let (management, guest) = tokio::try_join!(
            Cluster::start(ClusterOptions::new("management")),
            Cluster::start(ClusterOptions::new("guest")),
        )?;
        Ok(Self { management, guest })
    }
}

#[cfg(test)]
mod service_ip_tests {
    use super::kubernetes_service_ip;

    #[test]
    fn the_kubernetes_service_takes_the_first_address() {
        assert_eq!(
            kubernetes_service_ip("198.19.255.0/24").as_deref(),
            Some("198.19.255.1")
        );
        assert_eq!(
            kubernetes_service_ip("198.19.254.77/24").as_deref(),
            Some("198.19.254.1")
        );
        assert_eq!(kubernetes_service_ip("198.19.254.0/31"), None);
        assert_eq!(
            kubernetes_service_ip("fd00:198:254::77/112").as_deref(),
            Some("fd00:198:254::1")
        );
        assert_eq!(kubernetes_service_ip("fd00::/127"), None);
        assert_eq!(kubernetes_service_ip("x"), None);
    }
}
