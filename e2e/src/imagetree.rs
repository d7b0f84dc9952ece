//! Images described as trees of host files (the pinned upstream binaries, catalog content),
//! turned into OCI image parts (`Image::to_oci`) by the test images (`crate::testimages`).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// One entry of an image's root filesystem.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ImageEntry {
    /// A regular file, hard-linked (or copied when linking fails) into the root.
    File { source: PathBuf },
    /// A directory tree, copied into the root.
    Tree { source: PathBuf },
}

/// A runnable image: its files, default command and environment.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Image {
    /// Absolute paths inside the image → where the content comes from on the host.
    pub entries: BTreeMap<String, ImageEntry>,
    /// The image's ENTRYPOINT.
    pub entrypoint: Vec<String>,
    /// The image's CMD.
    pub cmd: Vec<String>,
    /// The image's ENV (PATH first, as container runtimes put it).
    pub env: Vec<(String, String)>,
    /// Whether [`Image::to_oci`] adds the host's shared libraries the image's ELF binaries
    /// link against, for dynamically linked tools such as `cp`. Static Go binaries need none.
    pub host_libraries: bool,
}

impl Image {
    /// An image with `PATH=/usr/local/bin:/usr/bin:/bin` and nothing in it.
    pub fn new() -> Self {
        Self {
            env: vec![(
                "PATH".into(),
                "/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".into(),
            )],
            ..Self::default()
        }
    }

    /// Adds a file at `path` (absolute, inside the image).
    pub fn file(mut self, path: &str, source: impl Into<PathBuf>) -> Self {
        self.entries.insert(
            path.to_string(),
            ImageEntry::File {
                source: source.into(),
            },
        );
        self
    }

    /// Adds a directory tree at `path`.
    pub fn tree(mut self, path: &str, source: impl Into<PathBuf>) -> Self {
        self.entries.insert(
            path.to_string(),
            ImageEntry::Tree {
                source: source.into(),
            },
        );
        self
    }

    /// Sets ENTRYPOINT.
    pub fn entrypoint(mut self, argv: &[&str]) -> Self {
        self.entrypoint = argv.iter().map(|s| s.to_string()).collect();
        self
    }

    /// Adds the host's shared libraries each ELF binary of the image links against.
    pub fn with_host_libraries(mut self) -> Self {
        self.host_libraries = true;
        self
    }
}

/// What [`Image::to_oci`] makes: the config and files of a real (OCI) image.
pub type OciParts = (hcp_olm_images::ImageConfig, Vec<hcp_olm_images::File>);

impl Image {
    /// The same image as a real one, for containerd on a real node
    /// ([`crate::realnode`]): every file (modes kept), trees walked, the shared libraries of
    /// its ELF files (`ldd`) when it uses the host's, the CA bundle, `/etc/passwd` and a
    /// writable `/tmp`; ENTRYPOINT, CMD and ENV as here; runs as `user` (numeric), who owns
    /// `owned_by_user`.
    pub fn to_oci(
        &self,
        title: &str,
        user: &str,
        labels: &[(&str, &str)],
        owned_by_user: &[&str],
    ) -> std::io::Result<OciParts> {
        use std::os::unix::fs::PermissionsExt as _;
        let err = |e: hcp_olm_images::ImageError| std::io::Error::other(e.to_string());
        let mut files = hcp_olm_images::base_files(std::fs::read(hcp_olm_images::CA_BUNDLE)?);
        let mut seen: std::collections::BTreeSet<String> =
            files.iter().map(|f| f.path.clone()).collect();
        let mut libs = std::collections::BTreeSet::new();
        let mut add = |path: String, source: &Path, files: &mut Vec<hcp_olm_images::File>| {
            let data = std::fs::read(source)?;
            let mode = std::fs::metadata(source)?.permissions().mode() & 0o7777;
            if self.host_libraries && data.starts_with(b"\x7fELF") {
                libs.extend(hcp_olm_images::shared_libraries(source).map_err(err)?);
            }
            if seen.insert(path.clone()) {
                files.push(hcp_olm_images::File { path, mode, data });
            }
            Ok::<(), std::io::Error>(())
        };
        for (path, entry) in &self.entries {
            match entry {
                ImageEntry::File { source } => add(path.clone(), source, &mut files)?,
                ImageEntry::Tree { source } => {
                    for e in walkdir::WalkDir::new(source).follow_links(true) {
                        let e = e.map_err(std::io::Error::other)?;
                        if e.file_type().is_file() {
                            let rel = e
                                .path()
                                .strip_prefix(source)
                                .map_err(std::io::Error::other)?;
                            let target =
                                format!("{}/{}", path.trim_end_matches('/'), rel.display());
                            add(target, e.path(), &mut files)?;
                        }
                    }
                }
            }
        }
        for lib in libs {
            let path = lib.to_string_lossy().into_owned();
            if seen.insert(path.clone()) {
                files.push(hcp_olm_images::File {
                    path,
                    mode: 0o755,
                    data: std::fs::read(&lib)?,
                });
            }
        }
        let config = hcp_olm_images::ImageConfig {
            title: title.into(),
            description: format!("{title} (hcp-olm test image)"),
            entrypoint: self.entrypoint.clone(),
            cmd: self.cmd.clone(),
            env: self.env.iter().map(|(k, v)| format!("{k}={v}")).collect(),
            user: user.into(),
            labels: labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            owned_by_user: owned_by_user.iter().map(|p| p.to_string()).collect(),
            architecture: hcp_olm_images::Arch::Amd64,
        };
        Ok((config, files))
    }
}
