//! Locating the pinned upstream binaries built by `e2e/tools/build.sh` (`make tools`).

use std::path::{Path, PathBuf};

/// Errors locating upstream tools.
#[derive(Debug, thiserror::Error)]
pub enum ToolError {
    /// The binary is not in the tools directory.
    #[error("upstream tool `{name}` not found at {path}: run `make tools` first")]
    Missing { name: String, path: PathBuf },
    /// A workspace binary built for another architecture is missing.
    #[error(
        "`{name}` for arm64 not found at {path}: build it first with `make cross-arm64` (`make test` does)"
    )]
    NotCrossBuilt { name: String, path: PathBuf },
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

/// Where `make cross-arm64` (part of `make test`) puts the workspace's binaries built for
/// arm64 (static, `aarch64-unknown-linux-gnu`, profile `cross`), checked to hold `name`.
pub fn arm64_bin(name: &str) -> Result<PathBuf, ToolError> {
    let dir = current_target_dir();
    let path = dir
        .parent()
        .unwrap_or(&dir)
        .join("aarch64-unknown-linux-gnu/cross")
        .join(name);
    if path.is_file() {
        Ok(path)
    } else {
        Err(ToolError::NotCrossBuilt {
            name: name.to_string(),
            path,
        })
    }
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

/// The fixtures directory of this repository (`fixtures/`: real public catalogs, CRDs and
/// HostedCluster examples; provenance in `fixtures/README.md`). A plain clone has everything
/// the tests, the demo and the benchmarks read; nothing beside the checkout is looked at.
pub fn fixtures_dir() -> PathBuf {
    repo_file("fixtures")
}

/// Errors unpacking a fixture catalog.
#[derive(Debug, thiserror::Error)]
pub enum FixtureError {
    #[error("fixture catalog `{name}`: neither {dir} nor {archive} exists")]
    Missing {
        name: String,
        dir: PathBuf,
        archive: PathBuf,
    },
    #[error("unpacking fixture catalog {archive} into {into}: {source}")]
    Unpack {
        archive: PathBuf,
        into: PathBuf,
        source: std::io::Error,
    },
}

/// The directory of fixture catalog `name` (`small`, `large`, `large-bundle-object`). Small
/// catalogs are kept as directories; the large ones as `fixtures/catalogs/<name>.tar.gz`,
/// unpacked once into `<target dir>/fixtures/<name>-<sha256 prefix of the archive>` and reused
/// (concurrent test processes each unpack into a temporary directory and the first rename
/// wins, so nobody reads a half-written catalog).
pub fn fixture_catalog(name: &str) -> Result<PathBuf, FixtureError> {
    use sha2::{Digest, Sha256};
    let catalogs = fixtures_dir().join("catalogs");
    let dir = catalogs.join(name);
    if dir.is_dir() {
        return Ok(dir);
    }
    let archive = catalogs.join(format!("{name}.tar.gz"));
    let bytes = std::fs::read(&archive).map_err(|_| FixtureError::Missing {
        name: name.to_string(),
        dir: dir.clone(),
        archive: archive.clone(),
    })?;
    let digest = Sha256::digest(&bytes);
    let short: String = digest[..6].iter().map(|b| format!("{b:02x}")).collect();
    let root = current_target_dir().join("fixtures");
    let into = root.join(format!("{name}-{short}"));
    let unpacked = into.join(name);
    if unpacked.is_dir() {
        return Ok(unpacked);
    }
    let err = |source| FixtureError::Unpack {
        archive: archive.clone(),
        into: into.clone(),
        source,
    };
    std::fs::create_dir_all(&root).map_err(err)?;
    let tmp = tempfile::tempdir_in(&root).map_err(err)?;
    tar::Archive::new(flate2::read::GzDecoder::new(bytes.as_slice()))
        .unpack(tmp.path())
        .map_err(err)?;
    if !tmp.path().join(name).is_dir() {
        return Err(err(std::io::Error::other(format!(
            "the archive holds no top-level directory `{name}`"
        ))));
    }
    match std::fs::rename(tmp.path(), &into) {
        // the directory is ours now: not removed when `tmp` would be dropped
        Ok(()) => drop(tmp.keep()),
        // another process renamed its copy first; ours is removed with `tmp`
        Err(_) if unpacked.is_dir() => {}
        Err(e) => return Err(err(e)),
    }
    Ok(unpacked)
}
