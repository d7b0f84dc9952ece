//! The release payload's component images: `release-manifests/image-references` in a
//! layer of the release image, an ImageStream whose `spec.tags[].name` maps a component
//! (`operator-lifecycle-manager`, `operator-registry`, ...) to `from.name`, a pinned
//! image reference.
//!
//! Layers are (gzip-compressed) tar archives, read with the `tar` crate; every size is bounded.

use std::collections::BTreeMap;
use std::io::Read;

/// Path of the component map inside the release image.
pub const IMAGE_REFERENCES_PATH: &str = "release-manifests/image-references";
/// Component holding the OLM binaries (catalog-operator, olm-operator, packageserver).
pub const OLM_COMPONENT: &str = "operator-lifecycle-manager";
/// Component holding opm (bundle unpack).
pub const OPERATOR_REGISTRY_COMPONENT: &str = "operator-registry";

/// Largest layer blob downloaded while looking for the file (compressed size).
pub const MAX_LAYER_BYTES: u64 = 256 << 20;
/// Layers searched for [`IMAGE_REFERENCES_PATH`] per lookup, newest first. OpenShift release
/// images carry it in their newest layer and have fewer than ten; a manifest listing
/// thousands must not cost thousands of downloads.
pub const MAX_LAYERS_SEARCHED: usize = 8;
/// Layer bytes downloaded per lookup in all (compressed).
pub const MAX_PAYLOAD_BYTES: u64 = 512 << 20;
/// Largest uncompressed stream read from one layer.
pub const MAX_UNCOMPRESSED_BYTES: u64 = 2 << 30;
/// Largest `image-references` accepted.
pub const MAX_FILE_BYTES: u64 = 16 << 20;

/// Why a layer could not be searched.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum LayerError {
    #[error("layer is not a tar archive: {0}")]
    NotTar(String),
    #[error("layer is larger than {0} bytes uncompressed")]
    TooLarge(u64),
    #[error("{path} is {size} bytes, more than the {max} allowed")]
    FileTooLarge { path: String, size: u64, max: u64 },
}

fn normalize(p: &str) -> &str {
    let p = p.trim_start_matches("./").trim_start_matches('/');
    p.trim_end_matches('/')
}

/// A reader that refuses to yield more than `limit` bytes in total (the tar crate reads
/// whatever its source gives; a gzip bomb must end as an error, not fill memory or time).
struct Bounded<R> {
    inner: R,
    left: u64,
}

/// The error [`Bounded`] returns when its limit is passed.
const OVER_LIMIT: &str = "uncompressed layer over its limit";

impl<R: Read> Read for Bounded<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        if self.left == 0 {
            // One more byte means the stream is longer than allowed.
            let mut probe = [0u8; 1];
            return match self.inner.read(&mut probe)? {
                0 => Ok(0),
                _ => Err(std::io::Error::other(OVER_LIMIT)),
            };
        }
        let n = buf.len().min(self.left.min(usize::MAX as u64) as usize);
        let got = self.inner.read(&mut buf[..n])?;
        self.left -= got as u64;
        Ok(got)
    }
}

fn io_err(e: std::io::Error) -> LayerError {
    if e.to_string().contains(OVER_LIMIT) {
        LayerError::TooLarge(MAX_UNCOMPRESSED_BYTES)
    } else {
        LayerError::NotTar(e.to_string())
    }
}

/// Looks for `path` in a layer blob (gzip-compressed or plain tar), reading it with the
/// `tar` crate (ustar, GNU long names and PAX paths). `Ok(None)`: the layer is a valid
/// archive without that file.
pub fn find_in_layer(blob: &[u8], path: &str) -> Result<Option<Vec<u8>>, LayerError> {
    find_bounded(blob, path, MAX_UNCOMPRESSED_BYTES)
}

fn find_bounded(blob: &[u8], path: &str, limit: u64) -> Result<Option<Vec<u8>>, LayerError> {
    let gz = blob.starts_with(&[0x1f, 0x8b]);
    let inner: Box<dyn Read + '_> = if gz {
        Box::new(flate2::read::MultiGzDecoder::new(blob))
    } else {
        Box::new(blob)
    };
    let mut archive = tar::Archive::new(Bounded { inner, left: limit });
    let want = normalize(path);
    for entry in archive.entries().map_err(io_err)? {
        let mut entry = entry.map_err(io_err)?;
        let kind = entry.header().entry_type();
        if !(kind.is_file() || kind.is_contiguous()) {
            continue;
        }
        let name = entry.path().map_err(io_err)?;
        if normalize(&name.to_string_lossy()) != want {
            continue;
        }
        let size = entry.size();
        if size > MAX_FILE_BYTES {
            return Err(LayerError::FileTooLarge {
                path: want.to_string(),
                size,
                max: MAX_FILE_BYTES,
            });
        }
        let mut out = Vec::with_capacity(size as usize);
        entry.read_to_end(&mut out).map_err(io_err)?;
        if (out.len() as u64) < size {
            return Err(LayerError::NotTar("archive ends inside an entry".into()));
        }
        return Ok(Some(out));
    }
    Ok(None)
}

/// Parses `image-references` (an `image.openshift.io/v1` ImageStream) into
/// component name → image reference.
pub fn parse_image_references(data: &[u8]) -> Result<BTreeMap<String, String>, String> {
    let v: serde_json::Value =
        serde_json::from_slice(data).map_err(|e| format!("not JSON: {e}"))?;
    if v["kind"].as_str().is_some_and(|k| k != "ImageStream") {
        return Err(format!("kind is {}, not ImageStream", v["kind"]));
    }
    let tags = v
        .pointer("/spec/tags")
        .and_then(|t| t.as_array())
        .ok_or("no spec.tags list")?;
    let mut out = BTreeMap::new();
    for t in tags {
        let (Some(name), Some(from)) = (t["name"].as_str(), t.pointer("/from/name")) else {
            continue;
        };
        if let Some(from) = from.as_str().filter(|f| !f.is_empty()) {
            out.insert(name.to_string(), from.to_string());
        }
    }
    Ok(out)
}

/// A tar archive of regular files (mode 0644, owner 0, time 0), gzip-compressed: test and
/// demo layers.
pub fn tar_gz(files: &[(&str, &[u8])]) -> Vec<u8> {
    let enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    let mut b = tar::Builder::new(enc);
    for (path, data) in files {
        let mut h = tar::Header::new_ustar();
        h.set_mode(0o644);
        h.set_uid(0);
        h.set_gid(0);
        h.set_mtime(0);
        h.set_size(data.len() as u64);
        h.set_entry_type(tar::EntryType::Regular);
        b.append_data(&mut h, path, *data)
            .expect("writing to a Vec");
    }
    b.into_inner()
        .and_then(|enc| enc.finish())
        .expect("writing to a Vec")
}

#[cfg(test)]
mod tests {
    use super::*;

    const REFS: &str = r#"{"kind":"ImageStream","apiVersion":"image.openshift.io/v1",
      "spec":{"tags":[
        {"name":"operator-lifecycle-manager","from":{"kind":"DockerImage","name":"q.io/art@sha256:01"}},
        {"name":"operator-registry","from":{"kind":"DockerImage","name":"q.io/art@sha256:02"}},
        {"name":"broken"}]}}"#;

    #[test]
    fn finds_the_file_in_a_gzip_tar_and_parses_it() {
        let blob = tar_gz(&[
            ("release-manifests/0000_50_olm.yaml", b"kind: x\n"),
            ("./release-manifests/image-references", REFS.as_bytes()),
        ]);
        let data = find_in_layer(&blob, IMAGE_REFERENCES_PATH)
            .unwrap()
            .unwrap();
        let m = parse_image_references(&data).unwrap();
        assert_eq!(m[OLM_COMPONENT], "q.io/art@sha256:01");
        assert_eq!(m[OPERATOR_REGISTRY_COMPONENT], "q.io/art@sha256:02");
        assert!(!m.contains_key("broken"));
        assert_eq!(find_in_layer(&blob, "nope").unwrap(), None);
    }

    #[test]
    fn garbage_is_an_error_not_a_miss() {
        assert!(matches!(
            find_in_layer(&[0x1f, 0x8b, 1, 2, 3], IMAGE_REFERENCES_PATH),
            Err(LayerError::NotTar(_))
        ));
        assert!(matches!(
            find_in_layer(&[7u8; 600], IMAGE_REFERENCES_PATH),
            Err(LayerError::NotTar(_))
        ));
        assert!(parse_image_references(b"{not json").is_err());
        assert!(parse_image_references(br#"{"kind":"Pod"}"#).is_err());
        assert!(parse_image_references(br#"{"spec":{}}"#).is_err());
    }

    #[test]
    fn long_names_and_the_uncompressed_bound() {
        let long = format!("{}/image-references", "d".repeat(150));
        let blob = tar_gz(&[(long.as_str(), b"x")]);
        assert_eq!(
            find_in_layer(&blob, &long).unwrap().as_deref(),
            Some(&b"x"[..])
        );
        // a layer that inflates past the bound before the file is an error, not a miss
        let filler = vec![0u8; 2 << 20];
        let blob = tar_gz(&[("filler", &filler), (IMAGE_REFERENCES_PATH, b"{}")]);
        assert!(blob.len() < 64 << 10, "compresses well: {}", blob.len());
        assert!(matches!(
            find_bounded(&blob, IMAGE_REFERENCES_PATH, 1 << 20),
            Err(LayerError::TooLarge(_))
        ));
        assert!(
            find_bounded(&blob, IMAGE_REFERENCES_PATH, 4 << 20)
                .unwrap()
                .is_some()
        );
    }

    #[test]
    fn oversized_file_is_refused() {
        let big = vec![b' '; (MAX_FILE_BYTES + 1) as usize];
        let blob = tar_gz(&[(IMAGE_REFERENCES_PATH, &big)]);
        assert!(matches!(
            find_in_layer(&blob, IMAGE_REFERENCES_PATH),
            Err(LayerError::FileTooLarge { .. })
        ));
    }
}
