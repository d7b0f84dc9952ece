//! OCI registry lookups for the controller: does a tag exist, what is its manifest digest,
//! what labels does an image config carry (the release image's version). Honours pull-secret
//! credentials (basic and bearer-token auth) and repository mirrors (`imageContentSources`).

pub mod auth;
pub mod payload;
pub mod reference;

use std::collections::BTreeMap;
use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request, StatusCode, header};
use http_body_util::{BodyExt as _, Full};
use hyper_util::client::legacy::Client as HttpClient;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use sha2::{Digest as _, Sha256};

pub use auth::{Credentials, PullSecret, PullSecretError};
pub use reference::{Reference, ReferenceError};

/// The label OpenShift release images carry their version in.
pub const RELEASE_VERSION_LABEL: &str = "io.openshift.release";

const MANIFEST_TYPES: &str = "application/vnd.oci.image.index.v1+json, \
application/vnd.docker.distribution.manifest.list.v2+json, \
application/vnd.oci.image.manifest.v1+json, \
application/vnd.docker.distribution.manifest.v2+json";

/// Errors from registry lookups. Messages never contain credentials.
#[derive(Debug, thiserror::Error)]
pub enum OciError {
    #[error(transparent)]
    Reference(#[from] ReferenceError),
    #[error("{url}: {message}")]
    Transport { url: String, message: String },
    #[error("{url}: unexpected HTTP {status}")]
    Status { url: String, status: u16 },
    #[error("{image}: {message}")]
    Manifest { image: String, message: String },
    #[error("{image} not found ({reason})")]
    NotFound { image: String, reason: String },
    #[error("release image {image} has no version label ({RELEASE_VERSION_LABEL})")]
    NoVersionLabel { image: String },
    #[error(
        "release image {image} has no {} in any layer",
        payload::IMAGE_REFERENCES_PATH
    )]
    NoImageReferences { image: String },
    #[error(
        "release image {image}: {} is unreadable: {message}",
        payload::IMAGE_REFERENCES_PATH
    )]
    InvalidImageReferences { image: String, message: String },
    #[error("release image {image}: layer {digest}: {message}")]
    Layer {
        image: String,
        digest: String,
        message: String,
    },
}

/// A repository mirror: references under `source` are looked up under each mirror first.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mirror {
    /// `registry/repository` prefix, e.g. `quay.io/openshift-release-dev/ocp-release`.
    pub source: String,
    /// Replacement prefixes, tried in order before the source.
    pub mirrors: Vec<String>,
}

/// Options for [`Client::new`].
#[derive(Clone, Debug, Default)]
pub struct ClientOptions {
    /// Credentials per registry.
    pub pull_secret: PullSecret,
    /// Mirrors (HyperShift `imageContentSources`).
    pub mirrors: Vec<Mirror>,
    /// Registries reached over plain HTTP (test registries on loopback).
    pub plain_http: Vec<String>,
    /// Timeout per HTTP request (default 10 s).
    pub timeout: Option<Duration>,
}

/// What the registry said about a tag or digest.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Lookup {
    /// It exists: its manifest digest and the reference that answered (a mirror or the source).
    Found { digest: String, via: String },
    /// No such manifest, or not authorized: `reason` says which, per candidate.
    Missing { reason: String },
}

type Body = Full<Bytes>;

/// A registry client.
#[derive(Clone)]
pub struct Client {
    http: HttpClient<hyper_rustls::HttpsConnector<HttpConnector>, Body>,
    opts: ClientOptions,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("mirrors", &self.opts.mirrors)
            .finish_non_exhaustive()
    }
}

struct Response {
    status: StatusCode,
    headers: http::HeaderMap,
    body: Bytes,
}

impl Client {
    /// A client trusting the system's root certificates.
    pub fn new(opts: ClientOptions) -> Result<Self, OciError> {
        let provider = std::sync::Arc::new(rustls_ring_provider());
        let https = hyper_rustls::HttpsConnectorBuilder::new()
            .with_provider_and_native_roots(provider)
            .map_err(|e| OciError::Transport {
                url: "(tls setup)".into(),
                message: e.to_string(),
            })?
            .https_or_http()
            .enable_http1()
            .enable_http2()
            .build();
        Ok(Self {
            http: HttpClient::builder(TokioExecutor::new()).build(https),
            opts,
        })
    }

    /// This client with `extra` mirrors tried after its own (a HostedCluster's
    /// `imageContentSources`); shares the connection pool.
    pub fn with_mirrors(&self, extra: &[Mirror]) -> Self {
        let mut c = self.clone();
        for m in extra {
            if !c.opts.mirrors.contains(m) {
                c.opts.mirrors.push(m.clone());
            }
        }
        c
    }

    fn base(&self, registry: &str) -> String {
        let scheme = if self.opts.plain_http.iter().any(|r| r == registry) {
            "http"
        } else {
            "https"
        };
        // Docker Hub's API lives on registry-1.docker.io.
        let host = if registry == "docker.io" {
            "registry-1.docker.io"
        } else {
            registry
        };
        format!("{scheme}://{host}")
    }

    async fn send_once(
        &self,
        method: &Method,
        url: &str,
        headers: &[(header::HeaderName, String)],
        body: &Bytes,
    ) -> Result<Response, OciError> {
        let mut req = Request::builder().method(method.clone()).uri(url);
        for (k, v) in headers {
            req = req.header(k, v);
        }
        let req = req
            .body(Full::new(body.clone()))
            .map_err(|e| OciError::Transport {
                url: url.to_string(),
                message: e.to_string(),
            })?;
        let timeout = self.opts.timeout.unwrap_or(Duration::from_secs(10));
        let transport = |message: String| OciError::Transport {
            url: url.to_string(),
            message,
        };
        let resp = tokio::time::timeout(timeout, self.http.request(req))
            .await
            .map_err(|_| transport(format!("no answer within {timeout:?}")))?
            .map_err(|e| transport(format!("{e}")))?;
        let (parts, body) = resp.into_parts();
        let body = tokio::time::timeout(timeout, body.collect())
            .await
            .map_err(|_| transport(format!("body not received within {timeout:?}")))?
            .map_err(|e| transport(e.to_string()))?
            .to_bytes();
        Ok(Response {
            status: parts.status,
            headers: parts.headers,
            body,
        })
    }

    /// Sends a request; on 401 answers the registry's challenge once (basic or bearer token
    /// with the pull-secret credentials for that registry) and retries.
    async fn send(
        &self,
        registry: &str,
        method: Method,
        url: &str,
        mut headers: Vec<(header::HeaderName, String)>,
        body: Bytes,
    ) -> Result<Response, OciError> {
        let resp = self.send_once(&method, url, &headers, &body).await?;
        if resp.status != StatusCode::UNAUTHORIZED {
            return Ok(resp);
        }
        let creds = self.opts.pull_secret.for_registry(registry);
        let challenge = resp
            .headers
            .get(header::WWW_AUTHENTICATE)
            .and_then(|v| v.to_str().ok())
            .and_then(auth::parse_challenge);
        let authorization = match challenge {
            Some(auth::Challenge::Basic) => match creds {
                Some(c) => c.basic(),
                None => return Ok(resp),
            },
            Some(auth::Challenge::Bearer {
                realm,
                service,
                scope,
            }) => {
                let mut token_url = realm.clone();
                let mut sep = if realm.contains('?') { '&' } else { '?' };
                for (k, v) in [("service", service), ("scope", scope)] {
                    if let Some(v) = v {
                        token_url.push_str(&format!("{sep}{k}={}", encode_query(&v)));
                        sep = '&';
                    }
                }
                let mut th = Vec::new();
                if let Some(c) = creds {
                    th.push((header::AUTHORIZATION, c.basic()));
                }
                let tr = self
                    .send_once(&Method::GET, &token_url, &th, &Bytes::new())
                    .await?;
                if !tr.status.is_success() {
                    return Ok(resp);
                }
                let v: serde_json::Value =
                    serde_json::from_slice(&tr.body).map_err(|_| OciError::Transport {
                        url: realm.clone(),
                        message: "token response is not JSON".into(),
                    })?;
                let token = v
                    .get("token")
                    .or_else(|| v.get("access_token"))
                    .and_then(|t| t.as_str())
                    .unwrap_or_default();
                format!("Bearer {token}")
            }
            None => return Ok(resp),
        };
        headers.push((header::AUTHORIZATION, authorization));
        self.send_once(&method, url, &headers, &body).await
    }

    /// The references to try for `r`: its mirrors in order, then `r` itself.
    pub fn candidates(&self, r: &Reference) -> Vec<Reference> {
        let name = r.name();
        let mut out = Vec::new();
        for m in &self.opts.mirrors {
            let Some(rest) = name.strip_prefix(&m.source) else {
                continue;
            };
            if !(rest.is_empty() || rest.starts_with('/')) {
                continue;
            }
            for mirror in &m.mirrors {
                let mut s = format!("{mirror}{rest}");
                if let Some(t) = &r.tag {
                    s.push_str(&format!(":{t}"));
                }
                if let Some(d) = &r.digest {
                    s.push_str(&format!("@{d}"));
                }
                if let Ok(mr) = Reference::parse(&s) {
                    out.push(mr);
                }
            }
        }
        out.push(r.clone());
        out
    }

    /// Does `image` (a tag or digest reference) exist, and what is its manifest digest?
    /// Mirrors are tried first. `Missing` covers "manifest unknown" and "not authorized"
    /// (try another tag); transport errors and 5xx are errors (decide later, not now).
    pub async fn resolve(&self, image: &str) -> Result<Lookup, OciError> {
        let r = Reference::parse(image)?;
        let mut reasons = Vec::new();
        let mut last_error = None;
        for c in self.candidates(&r) {
            let url = format!(
                "{}/v2/{}/manifests/{}",
                self.base(&c.registry),
                c.repository,
                c.manifest_ref()
            );
            let resp = match self
                .send(
                    &c.registry,
                    Method::HEAD,
                    &url,
                    vec![(header::ACCEPT, MANIFEST_TYPES.into())],
                    Bytes::new(),
                )
                .await
            {
                Ok(r) => r,
                Err(e) => {
                    tracing::debug!(candidate = %c, error = %e, "registry lookup failed");
                    last_error = Some(e);
                    continue;
                }
            };
            match resp.status {
                s if s.is_success() => {
                    let digest = match resp
                        .headers
                        .get("docker-content-digest")
                        .and_then(|v| v.to_str().ok())
                    {
                        Some(d) => d.to_string(),
                        None => self.manifest(&c).await?.0,
                    };
                    return Ok(Lookup::Found {
                        digest,
                        via: c.to_string(),
                    });
                }
                StatusCode::NOT_FOUND => reasons.push(format!("{c}: manifest unknown")),
                StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN => {
                    reasons.push(format!("{c}: not authorized"))
                }
                s => {
                    last_error = Some(OciError::Status {
                        url,
                        status: s.as_u16(),
                    })
                }
            }
        }
        match last_error {
            Some(e) if reasons.is_empty() => Err(e),
            _ => Ok(Lookup::Missing {
                reason: reasons.join("; "),
            }),
        }
    }

    /// GETs a manifest; returns (digest, JSON).
    async fn manifest(&self, r: &Reference) -> Result<(String, serde_json::Value), OciError> {
        let url = format!(
            "{}/v2/{}/manifests/{}",
            self.base(&r.registry),
            r.repository,
            r.manifest_ref()
        );
        let resp = self
            .send(
                &r.registry,
                Method::GET,
                &url,
                vec![(header::ACCEPT, MANIFEST_TYPES.into())],
                Bytes::new(),
            )
            .await?;
        match resp.status {
            s if s.is_success() => {}
            StatusCode::NOT_FOUND | StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN => {
                return Err(OciError::NotFound {
                    image: r.to_string(),
                    reason: format!("HTTP {}", resp.status.as_u16()),
                });
            }
            s => {
                return Err(OciError::Status {
                    url,
                    status: s.as_u16(),
                });
            }
        }
        let digest = format!("sha256:{:x}", Sha256::digest(&resp.body));
        let json = serde_json::from_slice(&resp.body).map_err(|_| OciError::Manifest {
            image: r.to_string(),
            message: "manifest is not JSON".into(),
        })?;
        Ok((digest, json))
    }

    /// The manifest of `image` (through mirrors), an index resolved to its linux/amd64
    /// entry (else the first); returns the reference that answered and the manifest.
    async fn image_manifest(
        &self,
        image: &str,
    ) -> Result<(Reference, serde_json::Value), OciError> {
        let r = Reference::parse(image)?;
        let found = match self.resolve(image).await? {
            Lookup::Found { via, .. } => Reference::parse(&via)?,
            Lookup::Missing { reason } => {
                return Err(OciError::NotFound {
                    image: image.to_string(),
                    reason,
                });
            }
        };
        let bad = |message: &str| OciError::Manifest {
            image: r.to_string(),
            message: message.to_string(),
        };
        let (_, mut manifest) = self.manifest(&found).await?;
        if let Some(list) = manifest.get("manifests").and_then(|m| m.as_array()) {
            let pick = list
                .iter()
                .find(|m| {
                    m.pointer("/platform/os").and_then(|v| v.as_str()) == Some("linux")
                        && m.pointer("/platform/architecture").and_then(|v| v.as_str())
                            == Some("amd64")
                })
                .or_else(|| list.first())
                .and_then(|m| m.get("digest"))
                .and_then(|d| d.as_str())
                .ok_or_else(|| bad("image index has no manifests"))?;
            let child = Reference {
                tag: None,
                digest: Some(pick.to_string()),
                ..found.clone()
            };
            manifest = self.manifest(&child).await?.1;
        }
        Ok((found, manifest))
    }

    /// GETs a blob of `r`'s repository, following one redirect (registries hand blobs
    /// to a storage backend), refusing more than `max` bytes, checking its digest.
    async fn blob(&self, r: &Reference, digest: &str, max: u64) -> Result<Bytes, OciError> {
        let url = format!(
            "{}/v2/{}/blobs/{digest}",
            self.base(&r.registry),
            r.repository
        );
        let mut resp = self
            .send(&r.registry, Method::GET, &url, vec![], Bytes::new())
            .await?;
        if resp.status.is_redirection()
            && let Some(loc) = resp
                .headers
                .get(header::LOCATION)
                .and_then(|v| v.to_str().ok())
        {
            let next = if loc.starts_with("http") {
                loc.to_string()
            } else {
                format!("{}{loc}", self.base(&r.registry))
            };
            // No credentials to another host: the location carries its own token.
            resp = self
                .send_once(&Method::GET, &next, &[], &Bytes::new())
                .await?;
        }
        if !resp.status.is_success() {
            return Err(OciError::Status {
                url,
                status: resp.status.as_u16(),
            });
        }
        if resp.body.len() as u64 > max {
            return Err(OciError::Manifest {
                image: r.to_string(),
                message: format!("blob {digest} is larger than {max} bytes"),
            });
        }
        if let Some(hex) = digest.strip_prefix("sha256:")
            && format!("{:x}", Sha256::digest(&resp.body)) != hex
        {
            return Err(OciError::Manifest {
                image: r.to_string(),
                message: format!("blob {digest} does not match its digest"),
            });
        }
        Ok(resp.body)
    }

    /// The labels of an image's config (`config.Labels`). A multi-arch index resolves to its
    /// linux/amd64 entry (else the first).
    pub async fn labels(&self, image: &str) -> Result<BTreeMap<String, String>, OciError> {
        let (found, manifest) = self.image_manifest(image).await?;
        let bad = |message: &str| OciError::Manifest {
            image: image.to_string(),
            message: message.to_string(),
        };
        let config = manifest
            .pointer("/config/digest")
            .and_then(|d| d.as_str())
            .ok_or_else(|| bad("manifest has no config digest"))?;
        let body = self.blob(&found, config, 4 << 20).await?;
        let cfg: serde_json::Value =
            serde_json::from_slice(&body).map_err(|_| bad("image config is not JSON"))?;
        Ok(cfg
            .pointer("/config/Labels")
            .and_then(|l| l.as_object())
            .map(|l| {
                l.iter()
                    .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_string())))
                    .collect()
            })
            .unwrap_or_default())
    }

    /// The component images of a release payload: `release-manifests/image-references`
    /// from the release image's layers (newest layer first), parsed into component
    /// name → image reference. Layer and file sizes are bounded (see [`payload`]).
    pub async fn release_image_references(
        &self,
        image: &str,
    ) -> Result<BTreeMap<String, String>, OciError> {
        let (found, manifest) = self.image_manifest(image).await?;
        let layers: Vec<(String, u64)> = manifest
            .get("layers")
            .and_then(|l| l.as_array())
            .map(|l| {
                l.iter()
                    .filter_map(|l| {
                        Some((
                            l.get("digest")?.as_str()?.to_string(),
                            l.get("size").and_then(|s| s.as_u64()).unwrap_or(0),
                        ))
                    })
                    .collect()
            })
            .unwrap_or_default();
        let mut first_error = None;
        for (digest, size) in layers.into_iter().rev() {
            let layer_err = |message: String| OciError::Layer {
                image: image.to_string(),
                digest: digest.clone(),
                message,
            };
            if size > payload::MAX_LAYER_BYTES {
                first_error.get_or_insert(layer_err(format!(
                    "{size} bytes, more than the {} searched",
                    payload::MAX_LAYER_BYTES
                )));
                continue;
            }
            let blob = self.blob(&found, &digest, payload::MAX_LAYER_BYTES).await?;
            let found_file = tokio::task::spawn_blocking(move || {
                payload::find_in_layer(&blob, payload::IMAGE_REFERENCES_PATH)
            })
            .await
            .map_err(|e| layer_err(e.to_string()))?;
            match found_file {
                Ok(Some(data)) => {
                    return payload::parse_image_references(&data).map_err(|message| {
                        OciError::InvalidImageReferences {
                            image: image.to_string(),
                            message,
                        }
                    });
                }
                Ok(None) => {}
                Err(e @ payload::LayerError::FileTooLarge { .. }) => {
                    return Err(OciError::InvalidImageReferences {
                        image: image.to_string(),
                        message: e.to_string(),
                    });
                }
                Err(e) => {
                    first_error.get_or_insert(layer_err(e.to_string()));
                }
            }
        }
        Err(first_error.unwrap_or(OciError::NoImageReferences {
            image: image.to_string(),
        }))
    }

    /// The OpenShift version of a release image, from its `io.openshift.release` label.
    pub async fn release_version(&self, image: &str) -> Result<String, OciError> {
        self.labels(image)
            .await?
            .remove(RELEASE_VERSION_LABEL)
            .filter(|v| !v.is_empty())
            .ok_or_else(|| OciError::NoVersionLabel {
                image: image.to_string(),
            })
    }

    /// Pushes a minimal image (no layers, a config with `labels`) as `image` (a tag reference)
    /// and returns its manifest digest. Used by tests and the demo to fill a local registry.
    pub async fn push_image(
        &self,
        image: &str,
        labels: &BTreeMap<String, String>,
    ) -> Result<String, OciError> {
        self.push_image_with_layers(image, labels, &[]).await
    }

    /// Uploads one blob to `r`'s repository; returns its digest.
    async fn push_blob(&self, r: &Reference, data: Bytes) -> Result<String, OciError> {
        let base = self.base(&r.registry);
        let digest = format!("sha256:{:x}", Sha256::digest(&data));
        let start = format!("{base}/v2/{}/blobs/uploads/", r.repository);
        let resp = self
            .send(&r.registry, Method::POST, &start, vec![], Bytes::new())
            .await?;
        if resp.status != StatusCode::ACCEPTED {
            return Err(OciError::Status {
                url: start,
                status: resp.status.as_u16(),
            });
        }
        let location = resp
            .headers
            .get(header::LOCATION)
            .and_then(|v| v.to_str().ok())
            .ok_or_else(|| OciError::Manifest {
                image: r.to_string(),
                message: "upload has no Location".into(),
            })?;
        let mut put = if location.starts_with("http") {
            location.to_string()
        } else {
            format!("{base}{location}")
        };
        put.push(if put.contains('?') { '&' } else { '?' });
        put.push_str(&format!("digest={digest}"));
        let resp = self
            .send(
                &r.registry,
                Method::PUT,
                &put,
                vec![(header::CONTENT_TYPE, "application/octet-stream".into())],
                data,
            )
            .await?;
        if resp.status != StatusCode::CREATED {
            return Err(OciError::Status {
                url: put,
                status: resp.status.as_u16(),
            });
        }
        Ok(digest)
    }

    /// Pushes an image with `layers` (gzip-compressed tar blobs, e.g. from
    /// [`payload::tar_gz`]) and a config with `labels` as `image`; returns its manifest
    /// digest. Used by tests and the demo (release images carrying image-references).
    pub async fn push_image_with_layers(
        &self,
        image: &str,
        labels: &BTreeMap<String, String>,
        layers: &[Vec<u8>],
    ) -> Result<String, OciError> {
        let r = Reference::parse(image)?;
        let base = self.base(&r.registry);
        let mut descriptors = Vec::new();
        let mut diff_ids = Vec::new();
        for l in layers {
            // diff_id: digest of the uncompressed tar.
            let mut plain = Vec::new();
            let uncompressed = if l.starts_with(&[0x1f, 0x8b]) {
                std::io::Read::read_to_end(
                    &mut flate2::read::MultiGzDecoder::new(&l[..]),
                    &mut plain,
                )
                .map(|_| plain.as_slice())
                .unwrap_or(l.as_slice())
            } else {
                l.as_slice()
            };
            diff_ids.push(format!("sha256:{:x}", Sha256::digest(uncompressed)));
            let digest = self.push_blob(&r, Bytes::from(l.clone())).await?;
            descriptors.push(serde_json::json!({
                "mediaType": "application/vnd.oci.image.layer.v1.tar+gzip",
                "digest": digest, "size": l.len(),
            }));
        }
        let config = serde_json::json!({
            "architecture": "amd64", "os": "linux",
            "config": { "Labels": labels },
            "rootfs": { "type": "layers", "diff_ids": diff_ids },
        });
        let config = Bytes::from(serde_json::to_vec(&config).unwrap_or_default());
        let config_len = config.len();
        let config_digest = self.push_blob(&r, config).await?;
        let manifest = serde_json::json!({
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": { "mediaType": "application/vnd.oci.image.config.v1+json",
                        "digest": config_digest, "size": config_len },
            "layers": descriptors,
        });
        let manifest = Bytes::from(serde_json::to_vec(&manifest).unwrap_or_default());
        let url = format!("{base}/v2/{}/manifests/{}", r.repository, r.manifest_ref());
        let resp = self
            .send(
                &r.registry,
                Method::PUT,
                &url,
                vec![(
                    header::CONTENT_TYPE,
                    "application/vnd.oci.image.manifest.v1+json".into(),
                )],
                manifest.clone(),
            )
            .await?;
        if resp.status != StatusCode::CREATED {
            return Err(OciError::Status {
                url,
                status: resp.status.as_u16(),
            });
        }
        Ok(format!("sha256:{:x}", Sha256::digest(&manifest)))
    }
}

fn rustls_ring_provider() -> rustls::crypto::CryptoProvider {
    rustls::crypto::ring::default_provider()
}

fn encode_query(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}
