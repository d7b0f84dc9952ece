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
    /// Whether the host's shared libraries (`/usr`, read-only) are visible, for dynamically
    /// linked tools such as `cp`. Static Go and Rust binaries do not need it.
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

    /// Makes the host's `/usr` libraries visible.
    pub fn with_host_libraries(mut self) -> Self {
        self.host_libraries = true;
        self
    }

    /// Whether the image has a file (or a file inside a tree) at `path`.
    pub fn has_path(&self, path: &str) -> bool {
        self.entries.iter().any(|(p, e)| match e {
            ImageEntry::File { .. } => p == path,
            ImageEntry::Tree { source } => path
                .strip_prefix(p.as_str())
                .and_then(|rest| rest.strip_prefix('/'))
                .is_some_and(|rest| source.join(rest).exists()),
        })
    }

    /// The image's PATH.
    pub fn path_var(&self) -> &str {
        self.env
            .iter()
            .find(|(k, _)| k == "PATH")
            .map(|(_, v)| v.as_str())
            .unwrap_or("/usr/local/bin:/usr/bin:/bin")
    }

    /// Resolves `program` as `execve` via PATH would inside the image: an absolute path is
    /// returned if the image has it; a bare name is searched in PATH.
    pub fn resolve(&self, program: &str) -> Option<String> {
        if program.starts_with('/') {
            return self.has_path(program).then(|| program.to_string());
        }
        self.path_var()
            .split(':')
            .map(|dir| format!("{}/{program}", dir.trim_end_matches('/')))
            .find(|p| self.has_path(p))
    }

    /// Writes the image's root filesystem into `root` (which must exist): the directories
    /// every base image has (`/tmp` and `/var/tmp` world-writable, sticky), then the entries.
    pub fn materialize(&self, root: &Path) -> std::io::Result<()> {
        use std::os::unix::fs::PermissionsExt;
        for dir in ["tmp", "var/tmp", "etc", "root", "proc", "dev"] {
            let d = root.join(dir);
            std::fs::create_dir_all(&d)?;
            if dir.ends_with("tmp") {
                std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o1777))?;
            }
        }
        for (path, entry) in &self.entries {
            let dest = root.join(path.trim_start_matches('/'));
            if let Some(parent) = dest.parent() {
                std::fs::create_dir_all(parent)?;
            }
            match entry {
                ImageEntry::File { source } => {
                    // links (the tools directory holds symlinks) are resolved: the root must
                    // not point outside itself
                    let source = std::fs::canonicalize(source)?;
                    if std::fs::hard_link(&source, &dest).is_err() {
                        std::fs::copy(&source, &dest)?;
                    }
                }
                ImageEntry::Tree { source } => copy_tree(source, &dest)?,
            }
        }
        Ok(())
    }
}

fn copy_tree(from: &Path, to: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(to)?;
    for entry in std::fs::read_dir(from)? {
        let entry = entry?;
        let target = to.join(entry.file_name());
        let kind = entry.file_type()?;
        if kind.is_dir() {
            copy_tree(&entry.path(), &target)?;
        } else if kind.is_file() {
            std::fs::copy(entry.path(), &target)?;
        } else if kind.is_symlink() {
            let resolved = std::fs::canonicalize(entry.path())?;
            if resolved.is_dir() {
                copy_tree(&resolved, &target)?;
            } else {
                std::fs::copy(&resolved, &target)?;
            }
        }
    }
    Ok(())
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
        };
        Ok((config, files))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resolve_follows_path_and_absolute_names() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("configs/pkg")).unwrap();
        std::fs::write(dir.path().join("configs/pkg/catalog.json"), "{}").unwrap();
        let img = Image::new()
            .file("/bin/opm", "/nonexistent/opm")
            .tree("/configs", dir.path().join("configs"));
        assert_eq!(img.resolve("opm").as_deref(), Some("/bin/opm"));
        assert_eq!(img.resolve("/bin/opm").as_deref(), Some("/bin/opm"));
        assert_eq!(img.resolve("/usr/bin/opm"), None);
        assert_eq!(img.resolve("cp"), None);
        assert!(img.has_path("/configs/pkg/catalog.json"));
        assert!(!img.has_path("/configs/pkg/missing.json"));
        assert!(!img.has_path("/configsx/pkg/catalog.json"));
    }

    #[test]
    fn materialize_links_files_and_copies_trees() {
        let src = tempfile::tempdir().unwrap();
        std::fs::write(src.path().join("tool"), "#!/bin/true\n").unwrap();
        std::fs::create_dir_all(src.path().join("cfg/a")).unwrap();
        std::fs::write(src.path().join("cfg/a/x.yaml"), "x: 1\n").unwrap();
        let root = tempfile::tempdir().unwrap();
        Image::new()
            .file("/bin/tool", src.path().join("tool"))
            .tree("/configs", src.path().join("cfg"))
            .materialize(root.path())
            .unwrap();
        assert!(root.path().join("bin/tool").is_file());
        assert_eq!(
            std::fs::read_to_string(root.path().join("configs/a/x.yaml")).unwrap(),
            "x: 1\n"
        );
    }
}
