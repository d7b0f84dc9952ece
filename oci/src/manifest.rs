//! OCI / Docker v2 manifests and image indexes, parsed from registry bytes (untrusted).
//! Only what the lookups need: an index's entries (digest, platform), an image's
//! config and layer descriptors. Digests are checked for form, so a hostile manifest
//! cannot put a path into a blob URL.

/// The largest manifest, index or image config read from a registry.
pub const MAX_MANIFEST_BYTES: u64 = 4 << 20;

/// A parsed manifest.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Manifest {
    /// An image index / manifest list.
    Index(Vec<IndexEntry>),
    /// An image manifest.
    Image {
        /// The config blob.
        config: Descriptor,
        /// Layer blobs, base first.
        layers: Vec<Descriptor>,
    },
}

/// A blob reference: digest and declared size.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Descriptor {
    /// `sha256:<64 hex>`.
    pub digest: String,
    /// Declared size in bytes (0 when absent).
    pub size: u64,
}

/// One entry of an image index.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IndexEntry {
    /// The child manifest's digest.
    pub digest: String,
    /// `platform.os`, if given.
    pub os: Option<String>,
    /// `platform.architecture`, if given.
    pub architecture: Option<String>,
}

/// Is `d` a `sha256:` digest of 64 lower-case hex digits?
pub fn valid_digest(d: &str) -> bool {
    d.strip_prefix("sha256:").is_some_and(|hex| {
        hex.len() == 64 && hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
    })
}

impl Manifest {
    /// Parses manifest bytes with `oci-spec`'s types (an image index / Docker manifest list
    /// when there is a `manifests` list, else an image manifest; Docker v2 schema 2 has the
    /// same shape). The message of an error says what is wrong, never echoing more than a
    /// digest; every digest must be `sha256:<64 hex>` (checked again here, so a hostile
    /// manifest cannot put a path into a blob URL).
    pub fn parse(bytes: &[u8]) -> Result<Self, String> {
        use oci_spec::image::{ImageIndex, ImageManifest};
        if bytes.len() as u64 > MAX_MANIFEST_BYTES {
            return Err(format!(
                "manifest is larger than {MAX_MANIFEST_BYTES} bytes"
            ));
        }
        let not_json = |e: serde_json::Error| {
            format!(
                "manifest is not JSON of a manifest (line {}, column {})",
                e.line(),
                e.column()
            )
        };
        let v: serde_json::Value = serde_json::from_slice(bytes).map_err(not_json)?;
        let check = |d: String| {
            if valid_digest(&d) {
                Ok(d)
            } else {
                Err("manifest names a digest that is not sha256:<64 hex>".to_string())
            }
        };
        // Digests are checked before the typed parse, whose error would not say so.
        let digests = v
            .get("manifests")
            .or_else(|| v.get("layers"))
            .and_then(|l| l.as_array())
            .into_iter()
            .flatten()
            .chain(v.get("config"))
            .map(|d| d.get("digest").and_then(|x| x.as_str()).unwrap_or(""));
        for d in digests {
            check(d.to_string())?;
        }
        if v.get("manifests").is_some() {
            let index: ImageIndex = serde_json::from_value(v).map_err(|e| {
                format!("image index is not an OCI image index / Docker manifest list: {e}")
            })?;
            if index.manifests().is_empty() {
                return Err("image index has no manifests".into());
            }
            return index
                .manifests()
                .iter()
                .map(|m| {
                    Ok(IndexEntry {
                        digest: check(m.digest().to_string())?,
                        os: m.platform().as_ref().map(|p| p.os().to_string()),
                        architecture: m.platform().as_ref().map(|p| p.architecture().to_string()),
                    })
                })
                .collect::<Result<_, String>>()
                .map(Manifest::Index);
        }
        if v.get("config").is_none() {
            return Err("manifest has no config digest".to_string());
        }
        let m: ImageManifest = serde_json::from_value(v)
            .map_err(|e| format!("manifest is not an OCI / Docker v2 image manifest: {e}"))?;
        let desc = |d: &oci_spec::image::Descriptor| {
            Ok::<_, String>(Descriptor {
                digest: check(d.digest().to_string())?,
                size: d.size(),
            })
        };
        Ok(Manifest::Image {
            config: desc(m.config())?,
            layers: m.layers().iter().map(desc).collect::<Result<_, _>>()?,
        })
    }

    /// For an index: the linux/amd64 entry, else the first. `None` for an image manifest.
    pub fn pick_platform(&self) -> Option<&str> {
        let Manifest::Index(list) = self else {
            return None;
        };
        list.iter()
            .find(|m| {
                m.os.as_deref() == Some("linux") && m.architecture.as_deref() == Some("amd64")
            })
            .or_else(|| list.first())
            .map(|m| m.digest.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn index_picks_linux_amd64_and_image_lists_layers() {
        let d = |c: char| format!("sha256:{}", c.to_string().repeat(64));
        let mt = "application/vnd.oci.image.manifest.v1+json";
        let idx = serde_json::json!({"schemaVersion": 2, "manifests": [
            {"mediaType": mt, "size": 1, "digest": d('a'), "platform": {"os": "linux", "architecture": "arm64"}},
            {"mediaType": mt, "size": 1, "digest": d('b'), "platform": {"os": "linux", "architecture": "amd64"}},
        ]});
        let m = Manifest::parse(&serde_json::to_vec(&idx).unwrap()).unwrap();
        assert_eq!(m.pick_platform(), Some(d('b').as_str()));
        let img = serde_json::json!({"schemaVersion": 2,
            "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": d('c'), "size": 3},
            "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", "digest": d('e'), "size": 0}]});
        let m = Manifest::parse(&serde_json::to_vec(&img).unwrap()).unwrap();
        assert_eq!(
            m,
            Manifest::Image {
                config: Descriptor {
                    digest: d('c'),
                    size: 3
                },
                layers: vec![Descriptor {
                    digest: d('e'),
                    size: 0
                }],
            }
        );
    }

    #[test]
    fn paths_and_malformed_digests_are_refused() {
        for bad in [
            "sha256:../../../v2/other/manifests/x",
            "sha256:ABC",
            "md5:00",
            "",
        ] {
            let img = serde_json::json!({"config": {"digest": bad}});
            let e = Manifest::parse(&serde_json::to_vec(&img).unwrap()).unwrap_err();
            assert!(e.contains("not sha256"), "{bad}: {e}");
        }
        assert!(Manifest::parse(b"{\"schemaVersion\": 2, \"manifests\": []}").is_err());
        assert!(Manifest::parse(b"[").is_err());
        assert!(Manifest::parse(b"{}").is_err());
    }
}
