//! OCI / Docker v2 manifests and image indexes, parsed from registry bytes (untrusted).
//! Only what the lookups need: an index's entries (digest, platform), an image's
//! config and layer descriptors. Digests are checked for form, so a hostile manifest
//! cannot put a path into a blob URL.

use serde::Deserialize;

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

#[derive(Deserialize)]
struct Raw {
    #[serde(default)]
    manifests: Option<Vec<RawEntry>>,
    #[serde(default)]
    config: Option<RawDescriptor>,
    #[serde(default)]
    layers: Option<Vec<RawDescriptor>>,
}

#[derive(Deserialize)]
struct RawEntry {
    digest: String,
    #[serde(default)]
    platform: Option<RawPlatform>,
}

#[derive(Deserialize)]
struct RawPlatform {
    #[serde(default)]
    os: Option<String>,
    #[serde(default)]
    architecture: Option<String>,
}

#[derive(Deserialize)]
struct RawDescriptor {
    digest: String,
    #[serde(default)]
    size: Option<u64>,
}

impl Manifest {
    /// Parses manifest bytes. The message of an error says what is wrong, never echoing
    /// more than a digest.
    pub fn parse(bytes: &[u8]) -> Result<Self, String> {
        if bytes.len() as u64 > MAX_MANIFEST_BYTES {
            return Err(format!(
                "manifest is larger than {MAX_MANIFEST_BYTES} bytes"
            ));
        }
        let raw: Raw = serde_json::from_slice(bytes).map_err(|e| {
            format!(
                "manifest is not JSON of a manifest (line {}, column {})",
                e.line(),
                e.column()
            )
        })?;
        let check = |d: String| {
            if valid_digest(&d) {
                Ok(d)
            } else {
                Err("manifest names a digest that is not sha256:<64 hex>".to_string())
            }
        };
        if let Some(list) = raw.manifests {
            if list.is_empty() {
                return Err("image index has no manifests".into());
            }
            return list
                .into_iter()
                .map(|e| {
                    let (os, architecture) = e
                        .platform
                        .map(|p| (p.os, p.architecture))
                        .unwrap_or_default();
                    Ok(IndexEntry {
                        digest: check(e.digest)?,
                        os,
                        architecture,
                    })
                })
                .collect::<Result<_, String>>()
                .map(Manifest::Index);
        }
        let config = raw
            .config
            .ok_or_else(|| "manifest has no config digest".to_string())?;
        let desc = |d: RawDescriptor| {
            Ok::<_, String>(Descriptor {
                digest: check(d.digest)?,
                size: d.size.unwrap_or(0),
            })
        };
        Ok(Manifest::Image {
            config: desc(config)?,
            layers: raw
                .layers
                .unwrap_or_default()
                .into_iter()
                .map(desc)
                .collect::<Result<_, _>>()?,
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
        let idx = serde_json::json!({"manifests": [
            {"digest": d('a'), "platform": {"os": "linux", "architecture": "arm64"}},
            {"digest": d('b'), "platform": {"os": "linux", "architecture": "amd64"}},
        ]});
        let m = Manifest::parse(&serde_json::to_vec(&idx).unwrap()).unwrap();
        assert_eq!(m.pick_platform(), Some(d('b').as_str()));
        let img = serde_json::json!({"config": {"digest": d('c'), "size": 3},
            "layers": [{"digest": d('e')}]});
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
        assert!(Manifest::parse(b"{\"manifests\": []}").is_err());
        assert!(Manifest::parse(b"[").is_err());
        assert!(Manifest::parse(b"{}").is_err());
    }
}
