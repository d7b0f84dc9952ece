//! Writing kubeconfig files and turning them into `kube::Client`s.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use kube::config::{KubeConfigOptions, Kubeconfig};

/// How a kubeconfig user authenticates.
pub enum Credentials<'a> {
    /// A client certificate and key (PEM).
    ClientCert { cert_pem: &'a str, key_pem: &'a str },
    /// A bearer token.
    Token(&'a str),
}

/// Renders a single-context kubeconfig as YAML.
pub fn render(
    cluster: &str,
    server: &str,
    ca_pem: &str,
    user: &str,
    creds: Credentials<'_>,
) -> String {
    let user_body = match creds {
        Credentials::ClientCert { cert_pem, key_pem } => serde_json::json!({
            "client-certificate-data": STANDARD.encode(cert_pem),
            "client-key-data": STANDARD.encode(key_pem),
        }),
        Credentials::Token(token) => serde_json::json!({ "token": token }),
    };
    let doc = serde_json::json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{ "name": cluster, "cluster": {
            "server": server,
            "certificate-authority-data": STANDARD.encode(ca_pem),
        }}],
        "users": [{ "name": user, "user": user_body }],
        "contexts": [{ "name": cluster, "context": { "cluster": cluster, "user": user } }],
        "current-context": cluster,
    });
    serde_yaml_ng::to_string(&doc).expect("a JSON value always serializes to YAML")
}

/// A client for a kubeconfig document.
pub async fn client(yaml: &str) -> Result<kube::Client, kube::Error> {
    let kc = Kubeconfig::from_yaml(yaml).map_err(kube::Error::InferKubeconfig)?;
    let config = kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
        .await
        .map_err(kube::Error::InferKubeconfig)?;
    kube::Client::try_from(config)
}
