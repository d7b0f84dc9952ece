//! Locating the pinned upstream binaries built by `e2e/tools/build.sh` (`make tools`).

use std::path::{Path, PathBuf};

/// Errors locating upstream tools.
#[derive(Debug, thiserror::Error)]
pub enum ToolError {
    /// The binary is not in the tools directory.
    #[error("upstream tool `{name}` not found at {path}: run `make tools` first")]
    Missing { name: String, path: PathBuf },
    /// A binary of this workspace is not built next to the running test.
    #[error(
        "`{name}` not found at {path}: build it first with `cargo build -p {package}` (`make test` and `cargo test --workspace` do)"
    )]
    NotBuilt {
        name: String,
        package: String,
        path: PathBuf,
    },
}

/// The cargo profile directory the running executable is in (`target/debug` for a test in
/// `target/debug/deps` or a binary in `target/debug`).
pub fn current_target_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap_or_default();
    let mut dir = exe.parent().map(Path::to_path_buf).unwrap_or_default();
    if dir.ends_with("deps") {
        dir.pop();
    }
    dir
}

/// Path of a binary of this workspace built into the same target directory as the running
/// test (`target/debug`), for binaries of another package than the test's (cargo gives a
/// test `CARGO_BIN_EXE_*` only for its own package's binaries), checked to exist.
pub fn workspace_bin(name: &str, package: &str) -> Result<PathBuf, ToolError> {
    let path = current_target_dir().join(name);
    if path.is_file() {
        Ok(path)
    } else {
        Err(ToolError::NotBuilt {
            name: name.to_string(),
            package: package.to_string(),
            path,
        })
    }
}

/// The directory holding the upstream binaries: `$HCP_OLM_TOOLS_DIR`, else
/// `$HCP_OLM_CACHE/bin`, else `$HOME/.cache/hcp-olm/bin` (what `build.sh --bin-dir` prints).
pub fn tools_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("HCP_OLM_TOOLS_DIR") {
        return PathBuf::from(d);
    }
    let cache = std::env::var_os("HCP_OLM_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            let home = std::env::var_os("HOME").unwrap_or_else(|| "/root".into());
            Path::new(&home).join(".cache/hcp-olm")
        });
    cache.join("bin")
}

/// Path of an upstream binary (`kube-apiserver`, `etcd`, `catalog`, `olm`, `package-server`, `opm`),
/// checked to exist.
pub fn bin(name: &str) -> Result<PathBuf, ToolError> {
    let path = tools_dir().join(name);
    if path.is_file() {
        Ok(path)
    } else {
        Err(ToolError::Missing {
            name: name.to_string(),
            path,
        })
    }
}

/// A file of this repository (`p` relative to its root).
pub fn repo_file(p: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(p)
}

/// The shared fixtures directory: `$HCP_OLM_SHARED/fixtures`, else `shared/fixtures` beside the
/// repository checkout (CI clones the repository with `shared/` next to it).
pub fn fixtures_dir() -> PathBuf {
    let shared = std::env::var_os("HCP_OLM_SHARED")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared"));
    shared.join("fixtures")
}
