//! The release payload's component images: `release-manifests/image-references` in a
//! layer of the release image, an ImageStream whose `spec.tags[].name` maps a component
//! (`operator-lifecycle-manager`, `operator-registry`, ...) to `from.name`, a pinned
//! image reference.
//!
//! Layers are (gzip-compressed) tar archives; this module reads just enough of the tar
//! format (ustar, GNU long names, PAX `path`) to find one file, with every size bounded.

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

fn octal(field: &[u8]) -> Result<u64, LayerError> {
    // GNU base-256 encoding for large sizes.
    if field.first().is_some_and(|b| b & 0x80 != 0) {
        let mut v: u64 = u64::from(field[0] & 0x7f);
        for b in &field[1..] {
            v = v
                .checked_mul(256)
                .and_then(|v| v.checked_add(u64::from(*b)))
                .ok_or_else(|| LayerError::NotTar("size field overflows".into()))?;
        }
        return Ok(v);
    }
    let s: String = field
        .iter()
        .take_while(|b| **b != 0)
        .map(|b| *b as char)
        .collect();
    let s = s.trim();
    if s.is_empty() {
        return Ok(0);
    }
    u64::from_str_radix(s, 8).map_err(|_| LayerError::NotTar(format!("bad octal field {s:?}")))
}

fn cstr(field: &[u8]) -> String {
    let end = field.iter().position(|b| *b == 0).unwrap_or(field.len());
    String::from_utf8_lossy(&field[..end]).into_owned()
}

fn normalize(p: &str) -> &str {
    let p = p.trim_start_matches("./").trim_start_matches('/');
    p.trim_end_matches('/')
}

/// A reader that refuses to yield more than `limit` bytes in total.
struct Bounded<R> {
    inner: R,
    left: u64,
    limit: u64,
}

impl<R: Read> Read for Bounded<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        if self.left == 0 {
            // One more byte means the stream is longer than allowed.
            let mut probe = [0u8; 1];
            return match self.inner.read(&mut probe)? {
                0 => Ok(0),
                _ => Err(std::io::Error::other(format!(
                    "more than {} bytes",
                    self.limit
                ))),
            };
        }
        let n = buf.len().min(self.left.min(usize::MAX as u64) as usize);
        let got = self.inner.read(&mut buf[..n])?;
        self.left -= got as u64;
        Ok(got)
    }
}

fn read_exact_or_eof(r: &mut impl Read, buf: &mut [u8]) -> Result<bool, LayerError> {
    let mut filled = 0;
    while filled < buf.len() {
        match r.read(&mut buf[filled..]) {
            Ok(0) if filled == 0 => return Ok(false),
            Ok(0) => return Err(LayerError::NotTar("archive ends inside a header".into())),
            Ok(n) => filled += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(io_err(e)),
        }
    }
    Ok(true)
}

fn io_err(e: std::io::Error) -> LayerError {
    if e.to_string().starts_with("more than") {
        LayerError::TooLarge(MAX_UNCOMPRESSED_BYTES)
    } else {
        LayerError::NotTar(e.to_string())
    }
}

fn read_n(r: &mut impl Read, n: u64) -> Result<Vec<u8>, LayerError> {
    let mut out = Vec::with_capacity(n.min(1 << 20) as usize);
    r.take(n).read_to_end(&mut out).map_err(io_err)?;
    if (out.len() as u64) < n {
        return Err(LayerError::NotTar("archive ends inside an entry".into()));
    }
    Ok(out)
}

fn skip(r: &mut impl Read, n: u64) -> Result<(), LayerError> {
    let copied = std::io::copy(&mut r.take(n), &mut std::io::sink()).map_err(io_err)?;
    if copied < n {
        return Err(LayerError::NotTar("archive ends inside an entry".into()));
    }
    Ok(())
}

fn padded(n: u64) -> u64 {
    n.div_ceil(512) * 512
}

/// Looks for `path` in a layer blob (gzip-compressed or plain tar). `Ok(None)`: the
/// layer is a valid archive without that file.
pub fn find_in_layer(blob: &[u8], path: &str) -> Result<Option<Vec<u8>>, LayerError> {
    let gz = blob.starts_with(&[0x1f, 0x8b]);
    let inner: Box<dyn Read + '_> = if gz {
        Box::new(flate2::read::MultiGzDecoder::new(blob))
    } else {
        Box::new(blob)
    };
    let mut r = Bounded {
        inner,
        left: MAX_UNCOMPRESSED_BYTES,
        limit: MAX_UNCOMPRESSED_BYTES,
    };
    let want = normalize(path);
    let mut long_name: Option<String> = None;
    let mut header = [0u8; 512];
    loop {
        if !read_exact_or_eof(&mut r, &mut header)? {
            return Ok(None);
        }
        if header.iter().all(|b| *b == 0) {
            return Ok(None);
        }
        let stored = octal(&header[148..156])?;
        let sum: u64 = header
            .iter()
            .enumerate()
            .map(|(i, b)| {
                if (148..156).contains(&i) {
                    32
                } else {
                    u64::from(*b)
                }
            })
            .sum();
        if stored != sum {
            return Err(LayerError::NotTar("header checksum mismatch".into()));
        }
        let size = octal(&header[124..136])?;
        let kind = header[156];
        let mut name = cstr(&header[0..100]);
        if &header[257..262] == b"ustar" {
            let prefix = cstr(&header[345..500]);
            if !prefix.is_empty() {
                name = format!("{prefix}/{name}");
            }
        }
        match kind {
            // GNU long name, PAX extended header: the next entry's name.
            b'L' | b'x' => {
                if size > 1 << 20 {
                    return Err(LayerError::NotTar("oversized extended header".into()));
                }
                let data = read_n(&mut r, size)?;
                skip(&mut r, padded(size) - size)?;
                if kind == b'L' {
                    long_name = Some(cstr(&data));
                } else if let Some(p) = pax_path(&data) {
                    long_name = Some(p);
                }
                continue;
            }
            _ => {}
        }
        if let Some(n) = long_name.take() {
            name = n;
        }
        let regular = kind == b'0' || kind == 0 || kind == b'7';
        if regular && normalize(&name) == want {
            if size > MAX_FILE_BYTES {
                return Err(LayerError::FileTooLarge {
                    path: want.to_string(),
                    size,
                    max: MAX_FILE_BYTES,
                });
            }
            return Ok(Some(read_n(&mut r, size)?));
        }
        // Only regular files (and the types carrying data) have a body.
        let body = match kind {
            b'1' | b'2' | b'3' | b'4' | b'5' | b'6' => 0,
            _ => size,
        };
        skip(&mut r, padded(body))?;
    }
}

fn pax_path(data: &[u8]) -> Option<String> {
    // Records: "<len> <key>=<value>\n".
    let text = String::from_utf8_lossy(data);
    text.lines().find_map(|line| {
        let (_, kv) = line.split_once(' ')?;
        kv.strip_prefix("path=").map(str::to_string)
    })
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

/// A tar archive of regular files (mode 0644), gzip-compressed: test and demo layers.
pub fn tar_gz(files: &[(&str, &[u8])]) -> Vec<u8> {
    let mut tar = Vec::new();
    for (path, data) in files {
        let mut h = [0u8; 512];
        let name = path.as_bytes();
        let n = name.len().min(100);
        h[..n].copy_from_slice(&name[..n]);
        let field = |h: &mut [u8; 512], at: usize, len: usize, v: u64| {
            let s = format!("{v:0w$o}\0", w = len - 1);
            h[at..at + len].copy_from_slice(s.as_bytes());
        };
        field(&mut h, 100, 8, 0o644);
        field(&mut h, 108, 8, 0);
        field(&mut h, 116, 8, 0);
        field(&mut h, 124, 12, data.len() as u64);
        field(&mut h, 136, 12, 0);
        h[156] = b'0';
        h[257..263].copy_from_slice(b"ustar\0");
        h[263..265].copy_from_slice(b"00");
        h[148..156].copy_from_slice(b"        ");
        let sum: u64 = h.iter().map(|b| u64::from(*b)).sum();
        let s = format!("{sum:06o}\0 ");
        h[148..156].copy_from_slice(s.as_bytes());
        tar.extend_from_slice(&h);
        tar.extend_from_slice(data);
        tar.resize(padded(tar.len() as u64) as usize, 0);
    }
    tar.resize(tar.len() + 1024, 0);
    let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    std::io::Write::write_all(&mut enc, &tar).expect("writing to a Vec");
    enc.finish().expect("writing to a Vec")
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
    fn oversized_file_is_refused() {
        let big = vec![b' '; (MAX_FILE_BYTES + 1) as usize];
        let blob = tar_gz(&[(IMAGE_REFERENCES_PATH, &big)]);
        assert!(matches!(
            find_in_layer(&blob, IMAGE_REFERENCES_PATH),
            Err(LayerError::FileTooLarge { .. })
        ));
    }
}
