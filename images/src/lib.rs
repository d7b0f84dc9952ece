//! hcp-olm's container images, built without a container engine (none runs where we build):
//! one OCI image per shipped binary, a single layer holding the binary, the shared libraries
//! it loads (taken from the build host's Debian packages, as `ldd` lists them), CA
//! certificates, a minimal `/etc/passwd` and a world-writable `/tmp`; a numeric non-root
//! `USER`; `org.opencontainers.image.*` labels.
//!
//! Reproducible: entries sorted, owner 0, fixed modes, every time stamp the commit's
//! (`SOURCE_DATE_EPOCH`), gzip without a name or time, JSON with sorted keys — the same
//! binaries give the same digests. Pure but for [`shared_libraries`] (runs `ldd`) and
//! [`write_layout`].

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write as _;
use std::path::{Path, PathBuf};

use bytes::Bytes;

pub mod multiarch;
pub use multiarch::Arch;
use serde_json::json;
use sha2::{Digest as _, Sha256};

/// The non-root user and group every image runs as (numeric, so `runAsNonRoot` can check it).
pub const USER_ID: u32 = 65532;
/// Where binaries go in an image.
pub const BIN_DIR: &str = "/usr/bin";
/// Where the CA bundle goes (Debian's path; `SSL_CERT_FILE` points at it).
pub const CA_BUNDLE: &str = "/etc/ssl/certs/ca-certificates.crt";
/// The registry and organisation the controller and `manifests/` name by default.
pub const DEFAULT_REGISTRY: &str = "quay.io/hcp-olm";
/// The project's source, for the `org.opencontainers.image.source` label.
pub const SOURCE: &str = "https://github.com/hcp-olm/hcp-olm";

/// One image: its name and the binaries in it; the first is the entrypoint.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ImageDef {
    pub name: &'static str,
    pub binaries: &'static [&'static str],
    pub description: &'static str,
}

/// Every image we ship. The names are what the controller renders by default
/// (`validate::Defaults`) and what `manifests/` installs.
pub const IMAGES: &[ImageDef] = &[
    ImageDef {
        name: "hcp-olm-controller",
        binaries: &["hcp-olm-controller"],
        description: "hcp-olm controller: OLM for every HyperShift hosted cluster",
    },
    ImageDef {
        name: "hcp-olm-tunnel-gateway",
        binaries: &["hcp-olm-gateway"],
        description: "hcp-olm tunnel gateway (HCP namespace side of the catalog tunnel)",
    },
    ImageDef {
        name: "hcp-olm-guest-agent",
        binaries: &["hcp-olm-agent"],
        description: "hcp-olm guest agent (guest side of the catalog tunnel, split DNS)",
    },
    ImageDef {
        name: "hcp-olm-dns",
        binaries: &["hcp-olm-dns"],
        description: "hcp-olm split-DNS daemon",
    },
    ImageDef {
        name: "hcp-olm-tunnel",
        binaries: &["hcp-olm-tunnel"],
        description: "hcp-olm WireGuard TUN daemon",
    },
    ImageDef {
        name: "hcp-olm-catalog-server",
        binaries: &["hcp-olm-catalog-server"],
        description: "hcp-olm gRPC catalog server (operator-registry API)",
    },
    ImageDef {
        name: "hcp-olm-cli",
        binaries: &["hcp-olm", "kubectl-hcp_olm"],
        description: "hcp-olm catalog CLI and kubectl plugin",
    },
];

/// Errors building images.
#[derive(Debug, thiserror::Error)]
pub enum ImageError {
    #[error("{what}: {cause}")]
    Io { what: String, cause: std::io::Error },
    #[error("`ldd {binary}` failed: {message}")]
    Ldd { binary: String, message: String },
    #[error("{0}")]
    Invalid(String),
}

fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> ImageError {
    let what = what.into();
    move |cause| ImageError::Io { what, cause }
}

/// A file in an image: absolute path, mode, content.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct File {
    pub path: String,
    pub mode: u32,
    pub data: Vec<u8>,
}

/// What the labels and time stamps say.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Meta {
    pub version: String,
    /// The commit (`git rev-parse HEAD`), or `unknown`.
    pub revision: String,
    /// `SOURCE_DATE_EPOCH`: seconds since 1970, used for every time stamp.
    pub created: u64,
}

/// A built image: its blobs and manifest, ready to push or to write as an OCI layout.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Built {
    pub name: String,
    pub layers: Vec<Bytes>,
    pub config: Bytes,
    pub manifest: Bytes,
}

impl Built {
    /// The manifest digest (`sha256:…`): the image's identity.
    pub fn digest(&self) -> String {
        sha256(&self.manifest)
    }

    /// Compressed size: layers, config and manifest.
    pub fn size(&self) -> usize {
        self.layers.iter().map(Bytes::len).sum::<usize>() + self.config.len() + self.manifest.len()
    }
}

fn sha256(b: &[u8]) -> String {
    format!("sha256:{:x}", Sha256::digest(b))
}

/// The tag reference of `def` in `registry` at `version` (`<registry>/<name>:v<version>`).
pub fn reference(registry: &str, def: &ImageDef, version: &str) -> String {
    format!("{}/{}:v{version}", registry.trim_end_matches('/'), def.name)
}

/// RFC 3339 (UTC) of `secs` since 1970 (civil-from-days; no calendar crate needed for one
/// formatting).
pub fn rfc3339(secs: u64) -> String {
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// The base files every image has besides its binaries and libraries.
pub fn base_files(ca_bundle: Vec<u8>) -> Vec<File> {
    vec![
        File {
            path: CA_BUNDLE.into(),
            mode: 0o644,
            data: ca_bundle,
        },
        File {
            path: "/etc/passwd".into(),
            mode: 0o644,
            data: format!(
                "root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:{USER_ID}:{USER_ID}:nonroot:/tmp:/sbin/nologin\n"
            )
            .into_bytes(),
        },
        File {
            path: "/etc/group".into(),
            mode: 0o644,
            data: format!("root:x:0:\nnonroot:x:{USER_ID}:\n").into_bytes(),
        },
    ]
}

/// One gzip-compressed tar layer of `files` (with every parent directory and `/tmp`), and
/// its diff ID (digest of the uncompressed tar). Deterministic.
pub fn layer(files: &[File], mtime: u64) -> Result<(Bytes, String), ImageError> {
    layer_owned(files, mtime, &[], 0, 0)
}

/// [`layer`] with the files and directories at or under the `owned` paths (absolute, not
/// `/`) owned by `uid`:`gid` instead of root: what the image's user must write (opm's cache).
pub fn layer_owned(
    files: &[File],
    mtime: u64,
    owned: &[String],
    uid: u32,
    gid: u32,
) -> Result<(Bytes, String), ImageError> {
    if let Some(o) = owned.iter().find(|o| o.trim_matches('/').is_empty()) {
        return Err(ImageError::Invalid(format!(
            "owned path {o:?}: the whole image cannot be the user's"
        )));
    }
    let owner = |rel: &str| -> (u64, u64) {
        let hit = owned.iter().any(|o| {
            let o = o.trim_matches('/');
            rel == o || rel.strip_prefix(o).is_some_and(|r| r.starts_with('/'))
        });
        if hit {
            (u64::from(uid), u64::from(gid))
        } else {
            (0, 0)
        }
    };
    let mut by_path: BTreeMap<String, &File> = BTreeMap::new();
    let mut dirs: BTreeSet<String> = BTreeSet::from(["tmp".to_string()]);
    for f in files {
        let rel = f.path.trim_start_matches('/').to_string();
        if rel.is_empty()
            || rel
                .split('/')
                .any(|c| c.is_empty() || c == "." || c == "..")
        {
            return Err(ImageError::Invalid(format!(
                "bad path in image: {:?}",
                f.path
            )));
        }
        let mut parent = Path::new(&rel).parent();
        while let Some(p) = parent.filter(|p| !p.as_os_str().is_empty()) {
            dirs.insert(p.to_string_lossy().into_owned());
            parent = p.parent();
        }
        if by_path.insert(rel.clone(), f).is_some() {
            return Err(ImageError::Invalid(format!(
                "{} twice in one image",
                f.path
            )));
        }
    }
    let mut b = tar::Builder::new(Vec::new());
    let header = |kind: tar::EntryType, mode: u32, size: u64, (uid, gid): (u64, u64)| {
        let mut h = tar::Header::new_ustar();
        h.set_entry_type(kind);
        h.set_mode(mode);
        h.set_uid(uid);
        h.set_gid(gid);
        h.set_mtime(mtime);
        h.set_size(size);
        h
    };
    // Directories first (sorted, so parents precede children), then files (sorted).
    for d in &dirs {
        let mode = if d == "tmp" { 0o1777 } else { 0o755 };
        let mut h = header(tar::EntryType::Directory, mode, 0, owner(d));
        b.append_data(&mut h, format!("{d}/"), std::io::empty())
            .map_err(io(format!("adding directory {d}")))?;
    }
    for (path, f) in &by_path {
        let mut h = header(
            tar::EntryType::Regular,
            f.mode,
            f.data.len() as u64,
            owner(path),
        );
        b.append_data(&mut h, path, f.data.as_slice())
            .map_err(io(format!("adding {path}")))?;
    }
    let tar = b.into_inner().map_err(io("finishing the layer"))?;
    let diff_id = sha256(&tar);
    // No file name and time 0 in the gzip header (flate2's defaults), fixed level.
    let mut gz = flate2::GzBuilder::new()
        .mtime(0)
        .write(Vec::new(), flate2::Compression::new(6));
    gz.write_all(&tar).map_err(io("compressing the layer"))?;
    let gz = gz.finish().map_err(io("compressing the layer"))?;
    Ok((Bytes::from(gz), diff_id))
}

/// What an image's config says besides its files: how it runs and what it is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ImageConfig {
    /// `org.opencontainers.image.title`.
    pub title: String,
    pub description: String,
    pub entrypoint: Vec<String>,
    pub cmd: Vec<String>,
    /// `NAME=value` entries.
    pub env: Vec<String>,
    /// `uid[:gid]`, numeric.
    pub user: String,
    /// Labels besides the `org.opencontainers.image.*` ones.
    pub labels: BTreeMap<String, String>,
    /// Paths (absolute) whose files and directories the image's user owns.
    pub owned_by_user: Vec<String>,
    /// The CPU architecture the files are for.
    pub architecture: Arch,
}

/// The config of one of our images ([`IMAGES`]): its first binary as the entrypoint, the
/// non-root [`USER_ID`], `SSL_CERT_FILE` and `HOME=/tmp`.
pub fn our_config(def: &ImageDef) -> Result<ImageConfig, ImageError> {
    let entry = def
        .binaries
        .first()
        .ok_or_else(|| ImageError::Invalid(format!("image {} has no binary", def.name)))?;
    Ok(ImageConfig {
        title: def.name.into(),
        description: def.description.into(),
        entrypoint: vec![format!("{BIN_DIR}/{entry}")],
        cmd: Vec::new(),
        env: vec![
            "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".into(),
            format!("SSL_CERT_FILE={CA_BUNDLE}"),
            "HOME=/tmp".into(),
        ],
        user: format!("{USER_ID}:{USER_ID}"),
        labels: BTreeMap::new(),
        owned_by_user: Vec::new(),
        architecture: Arch::Amd64,
    })
}

/// The image of `def` from its `files` (binaries, libraries and [`base_files`]).
pub fn build(def: &ImageDef, files: &[File], meta: &Meta) -> Result<Built, ImageError> {
    build_image(&our_config(def)?, files, meta)
}

/// An image of `files` run as `config` says (one layer; reproducible as [`build`]).
pub fn build_image(config: &ImageConfig, files: &[File], meta: &Meta) -> Result<Built, ImageError> {
    let title = config.title.clone();
    let arch = config.architecture;
    let mut ids = config.user.split(':').map(|v| v.parse::<u32>().ok());
    let uid = ids.next().flatten();
    let gid = match ids.next() {
        None => uid,
        Some(g) => g,
    };
    let (Some(uid), Some(gid), None) = (uid, gid, ids.next()) else {
        return Err(ImageError::Invalid(format!(
            "user {:?} is not numeric uid[:gid]",
            config.user
        )));
    };
    let (layer, diff_id) = layer_owned(files, meta.created, &config.owned_by_user, uid, gid)?;
    let created = rfc3339(meta.created);
    let mut labels: BTreeMap<&str, String> = config
        .labels
        .iter()
        .map(|(k, v)| (k.as_str(), v.clone()))
        .collect();
    labels.extend([
        ("org.opencontainers.image.created", created.clone()),
        (
            "org.opencontainers.image.description",
            config.description.clone(),
        ),
        ("org.opencontainers.image.licenses", "Apache-2.0".into()),
        ("org.opencontainers.image.revision", meta.revision.clone()),
        ("org.opencontainers.image.source", SOURCE.into()),
        ("org.opencontainers.image.title", config.title.clone()),
        ("org.opencontainers.image.version", meta.version.clone()),
    ]);
    let mut run = serde_json::Map::new();
    run.insert("User".into(), json!(config.user));
    run.insert("Entrypoint".into(), json!(config.entrypoint));
    if !config.cmd.is_empty() {
        run.insert("Cmd".into(), json!(config.cmd));
    }
    run.insert("Env".into(), json!(config.env));
    run.insert("WorkingDir".into(), json!("/"));
    run.insert("Labels".into(), json!(labels));
    // serde_json's Map keeps keys sorted (no preserve_order feature): stable bytes.
    let mut config = json!({
        "architecture": config.architecture.oci(),
        "os": "linux",
        "created": created,
        "config": run,
        "rootfs": {"type": "layers", "diff_ids": [diff_id]},
        "history": [{"created": created, "created_by": "hcp-olm-images"}],
    });
    if let Some(v) = arch.variant() {
        config["variant"] = json!(v);
    }
    let config =
        Bytes::from(serde_json::to_vec(&config).map_err(|e| ImageError::Invalid(e.to_string()))?);
    let manifest = json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {
            "mediaType": "application/vnd.oci.image.config.v1+json",
            "digest": sha256(&config),
            "size": config.len(),
        },
        "layers": [{
            "mediaType": "application/vnd.oci.image.layer.v1.tar+gzip",
            "digest": sha256(&layer),
            "size": layer.len(),
        }],
        "annotations": {
            "org.opencontainers.image.created": created,
            "org.opencontainers.image.revision": meta.revision,
            "org.opencontainers.image.version": meta.version,
        },
    });
    let manifest =
        Bytes::from(serde_json::to_vec(&manifest).map_err(|e| ImageError::Invalid(e.to_string()))?);
    Ok(Built {
        name: title,
        layers: vec![layer],
        config,
        manifest,
    })
}

/// The shared libraries `binary` loads, as `ldd` lists them (the dynamic loader included;
/// the vDSO left out). Empty for a static binary.
pub fn shared_libraries(binary: &Path) -> Result<Vec<PathBuf>, ImageError> {
    let out = std::process::Command::new("ldd")
        .arg(binary)
        .output()
        .map_err(io("running ldd (Debian package libc-bin)"))?;
    let text = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        if text.contains("not a dynamic executable") || err.contains("not a dynamic executable") {
            return Ok(Vec::new());
        }
        return Err(ImageError::Ldd {
            binary: binary.display().to_string(),
            message: err.trim().to_string(),
        });
    }
    parse_ldd(&text).map_err(|message| ImageError::Ldd {
        binary: binary.display().to_string(),
        message,
    })
}

/// The library paths in `ldd` output. Pure.
pub fn parse_ldd(text: &str) -> Result<Vec<PathBuf>, String> {
    let mut out = Vec::new();
    for line in text.lines().map(str::trim).filter(|l| !l.is_empty()) {
        if line.contains("statically linked") || line.starts_with("linux-vdso") {
            continue;
        }
        if line.contains("=> not found") {
            return Err(format!("missing library: {line}"));
        }
        let path = match line.split_once("=>") {
            Some((_, rest)) => rest.trim(),
            None => line,
        };
        let path = path.split(" (").next().unwrap_or("").trim();
        if path.starts_with('/') {
            out.push(PathBuf::from(path));
        }
    }
    out.sort();
    out.dedup();
    Ok(out)
}

/// Where an image carries its own SBOM (SPDX 2.3 JSON).
pub const SBOM_PATH: &str = "/usr/share/doc/hcp-olm/sbom.spdx.json";

/// `sha256:<hex>` of `b`.
pub fn sha256_digest(b: &[u8]) -> String {
    sha256(b)
}

/// The files of `def` for the build host's architecture (see [`files_for_arch`]).
pub fn files_for(
    def: &ImageDef,
    bin_dir: &Path,
    ca_bundle: &[u8],
) -> Result<Vec<File>, ImageError> {
    let arch = Arch::host()
        .ok_or_else(|| ImageError::Invalid("the build host is neither amd64 nor arm64".into()))?;
    files_for_arch(def, bin_dir, ca_bundle, arch).map(|(f, _)| f)
}

/// The files of `def` for `arch`: its binaries from `bin_dir` (0755 in [`BIN_DIR`]; each
/// must be an ELF for `arch`, and static unless `arch` is the build host's), the shared
/// libraries a dynamic one loads at the paths the loader looks them up by (returned too,
/// for the SBOM), and [`base_files`].
pub fn files_for_arch(
    def: &ImageDef,
    bin_dir: &Path,
    ca_bundle: &[u8],
    arch: Arch,
) -> Result<(Vec<File>, Vec<PathBuf>), ImageError> {
    let mut files = base_files(ca_bundle.to_vec());
    let mut libs = BTreeSet::new();
    for b in def.binaries {
        let path = bin_dir.join(b);
        let data = std::fs::read(&path).map_err(io(format!(
            "reading {} (build it: make images, or cargo build --profile dist --target {} -p <its package>)",
            path.display(),
            arch.rust_target()
        )))?;
        let info = multiarch::check_binary(&path.display().to_string(), &data, arch)?;
        files.push(File {
            path: format!("{BIN_DIR}/{b}"),
            mode: 0o755,
            data,
        });
        if info.dynamic {
            libs.extend(shared_libraries(&path)?);
        }
    }
    for lib in &libs {
        let data = std::fs::read(lib).map_err(io(format!("reading {}", lib.display())))?;
        files.push(File {
            path: lib.to_string_lossy().into_owned(),
            mode: 0o755,
            data,
        });
    }
    Ok((files, libs.into_iter().collect()))
}

/// One component's images: its tag reference, an image per architecture, and their index.
pub type MultiArch = (String, Vec<(Arch, Built)>, Bytes);

/// Writes multi-architecture images as one OCI image layout in `dir`: every image's blobs,
/// each component's image index, and `index.json` naming each index by its tag reference.
pub fn write_multi_layout(dir: &Path, images: &[MultiArch]) -> Result<(), ImageError> {
    let entries = images.iter().map(|(reference, per_arch, index)| {
        let blobs: Vec<&[u8]> = per_arch
            .iter()
            .flat_map(|(_, img)| {
                img.layers
                    .iter()
                    .map(|l| &l[..])
                    .chain([&img.config[..], &img.manifest[..]])
            })
            .chain([&index[..]])
            .collect();
        (
            reference,
            blobs,
            "application/vnd.oci.image.index.v1+json",
            &index[..],
        )
    });
    layout(dir, entries)
}

/// Writes `images` (tag reference → image) as one OCI image layout in `dir` (`oci-layout`,
/// `index.json` naming each by `org.opencontainers.image.ref.name`, `blobs/sha256/…`).
pub fn write_layout(dir: &Path, images: &[(String, Built)]) -> Result<(), ImageError> {
    let entries = images.iter().map(|(reference, img)| {
        let blobs: Vec<&[u8]> = img
            .layers
            .iter()
            .map(|l| &l[..])
            .chain([&img.config[..], &img.manifest[..]])
            .collect();
        (
            reference,
            blobs,
            "application/vnd.oci.image.manifest.v1+json",
            &img.manifest[..],
        )
    });
    layout(dir, entries)
}

/// Writes an OCI image layout: every blob of each entry under `blobs/sha256`, and
/// `index.json` naming each entry's top manifest (of `media_type`) by its reference.
fn layout<'a>(
    dir: &Path,
    entries: impl Iterator<Item = (&'a String, Vec<&'a [u8]>, &'static str, &'a [u8])>,
) -> Result<(), ImageError> {
    let blob_dir = dir.join("blobs/sha256");
    std::fs::create_dir_all(&blob_dir).map_err(io(format!("creating {}", blob_dir.display())))?;
    let mut manifests = Vec::new();
    for (reference, blobs, media_type, top) in entries {
        for b in blobs {
            let path = blob_dir.join(sha256(b).trim_start_matches("sha256:"));
            std::fs::write(&path, b).map_err(io(format!("writing {}", path.display())))?;
        }
        manifests.push(json!({
            "mediaType": media_type,
            "digest": sha256(top),
            "size": top.len(),
            "annotations": {"org.opencontainers.image.ref.name": reference},
        }));
    }
    let index = json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": manifests,
    });
    let write = |name: &str, v: &serde_json::Value| {
        let path = dir.join(name);
        std::fs::write(&path, serde_json::to_vec_pretty(v).unwrap_or_default())
            .map_err(io(format!("writing {}", path.display())))
    };
    write("oci-layout", &json!({"imageLayoutVersion": "1.0.0"}))?;
    write("index.json", &index)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta() -> Meta {
        Meta {
            version: "0.1.0".into(),
            revision: "abc".into(),
            created: 1_764_028_800,
        }
    }

    #[test]
    fn owned_paths_belong_to_the_images_user_and_nothing_else_does() {
        let f = |path: &str| File {
            path: path.into(),
            mode: 0o644,
            data: b"x".to_vec(),
        };
        let files = [
            f("/tmp/cache/db/a"),
            f("/tmp/cachex"),
            f("/configs/p/c.json"),
        ];
        let (gz, _) = layer_owned(&files, 0, &["/tmp/cache".into()], 1001, 1001).unwrap();
        let mut tar = Vec::new();
        std::io::Read::read_to_end(&mut flate2::read::GzDecoder::new(gz.as_ref()), &mut tar)
            .unwrap();
        let mut owners = BTreeMap::new();
        for e in tar::Archive::new(tar.as_slice()).entries().unwrap() {
            let e = e.unwrap();
            let path = e
                .path()
                .unwrap()
                .to_string_lossy()
                .trim_end_matches('/')
                .to_string();
            owners.insert(path, (e.header().uid().unwrap(), e.header().gid().unwrap()));
        }
        for (p, id) in [
            ("tmp/cache", 1001),
            ("tmp/cache/db", 1001),
            ("tmp/cache/db/a", 1001),
            ("tmp", 0),
            ("tmp/cachex", 0),
            ("configs/p/c.json", 0),
        ] {
            assert_eq!(owners.get(p), Some(&(id, id)), "{p}: {owners:?}");
        }
        // The same without owned paths is `layer`, byte for byte.
        assert_eq!(
            layer_owned(&files, 0, &[], 1001, 1001).unwrap(),
            layer(&files, 0).unwrap()
        );
        assert!(layer_owned(&files, 0, &["/".into()], 1, 1).is_err());
    }

    #[test]
    fn same_input_same_digest_and_every_input_counts() {
        let files = vec![File {
            path: "/usr/bin/x".into(),
            mode: 0o755,
            data: b"\x7fELF".to_vec(),
        }];
        let def = &IMAGES[0];
        let a = build(def, &files, &meta()).unwrap();
        let b = build(def, &files, &meta()).unwrap();
        assert_eq!(a.digest(), b.digest());
        let mut m = meta();
        m.revision = "def".into();
        assert_ne!(build(def, &files, &m).unwrap().digest(), a.digest());
        let mut other = files.clone();
        other[0].data.push(0);
        assert_ne!(build(def, &other, &meta()).unwrap().digest(), a.digest());
        let cfg: serde_json::Value = serde_json::from_slice(&a.config).unwrap();
        assert_eq!(cfg["config"]["User"], "65532:65532");
        assert_eq!(
            cfg["config"]["Entrypoint"][0],
            "/usr/bin/hcp-olm-controller"
        );
        assert_eq!(cfg["created"], "2025-11-25T00:00:00Z");
        assert_eq!(
            cfg["config"]["Labels"]["org.opencontainers.image.version"],
            "0.1.0"
        );
    }

    #[test]
    fn layer_lists_parents_first_with_fixed_owner_and_time() {
        let files = vec![
            File {
                path: "/usr/bin/b".into(),
                mode: 0o755,
                data: b"b".to_vec(),
            },
            File {
                path: "/etc/passwd".into(),
                mode: 0o644,
                data: b"p".to_vec(),
            },
        ];
        let (gz, _) = layer(&files, 7).unwrap();
        let mut a = tar::Archive::new(flate2::read::GzDecoder::new(&gz[..]));
        let entries: Vec<(String, u32, u64, u64)> = a
            .entries()
            .unwrap()
            .map(|e| {
                let e = e.unwrap();
                let h = e.header();
                (
                    e.path().unwrap().to_string_lossy().into_owned(),
                    h.mode().unwrap(),
                    h.uid().unwrap(),
                    h.mtime().unwrap(),
                )
            })
            .collect();
        let names: Vec<&str> = entries.iter().map(|e| e.0.as_str()).collect();
        assert_eq!(
            names,
            [
                "etc/",
                "tmp/",
                "usr/",
                "usr/bin/",
                "etc/passwd",
                "usr/bin/b"
            ]
        );
        assert!(entries.iter().all(|e| e.2 == 0 && e.3 == 7));
        assert_eq!(entries[1].1, 0o1777);
    }

    #[test]
    fn bad_paths_and_duplicates_are_refused() {
        for p in ["/", "/a/../b", "a//b"] {
            let f = File {
                path: p.into(),
                mode: 0o644,
                data: vec![],
            };
            assert!(layer(&[f], 0).is_err(), "{p}");
        }
        let f = File {
            path: "/a".into(),
            mode: 0o644,
            data: vec![],
        };
        assert!(layer(&[f.clone(), f], 0).is_err());
    }

    #[test]
    fn ldd_output_is_parsed() {
        let text = "\tlinux-vdso.so.1 (0x00007ffd)\n\tlibgcc_s.so.1 => /lib/x86_64-linux-gnu/libgcc_s.so.1 (0x00007f)\n\tlibc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x00007f)\n\t/lib64/ld-linux-x86-64.so.2 (0x00007f)\n";
        assert_eq!(
            parse_ldd(text).unwrap(),
            [
                PathBuf::from("/lib/x86_64-linux-gnu/libc.so.6"),
                PathBuf::from("/lib/x86_64-linux-gnu/libgcc_s.so.1"),
                PathBuf::from("/lib64/ld-linux-x86-64.so.2"),
            ]
        );
        assert!(parse_ldd("\tlibfoo.so => not found\n").is_err());
        assert!(parse_ldd("\tstatically linked\n").unwrap().is_empty());
    }

    #[test]
    fn dates() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(rfc3339(1_764_028_800 + 3661), "2025-11-25T01:01:01Z");
    }
}
