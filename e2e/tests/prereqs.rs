//! The README's two commands check their system prerequisites before any build: on a machine
//! without the packages (a PATH without them, standing in for a fresh machine) `make demo` and
//! `make test` stop at once with the exact install command, and never reach cargo or Go.

use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, ensure};

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("e2e lives in the workspace")
        .to_path_buf()
}

fn which(cmd: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .chain(["/usr/sbin".into(), "/sbin".into()])
        .map(|d| d.join(cmd))
        .find(|p| p.is_file())
}

/// A bin directory with the basic tools the script and make use, and none of the packages it checks.
/// `cargo` and `go` are fakes that record that they ran, so the test sees whether a build started.
fn bare_path(dir: &Path, ran: &Path) -> Result<PathBuf> {
    let bin = dir.join("bin");
    std::fs::create_dir_all(&bin)?;
    for t in [
        "bash",
        "sh",
        "env",
        "make",
        "sed",
        "sort",
        "head",
        "tr",
        "id",
        "cat",
        "dirname",
        "grep",
        "sha256sum",
        "cut",
        "mkdir",
        "column",
        "tee",
        "awk",
    ] {
        if let Some(p) = which(t) {
            symlink(p, bin.join(t))?;
        }
    }
    for fake in ["cargo", "go", "rustup"] {
        let script = format!(
            "#!/bin/bash\necho \"{fake} $*\" >> {}\n[ \"$1 $2\" = 'env GOVERSION' ] && echo go1.26.3\nexit 0\n",
            ran.display()
        );
        let p = bin.join(fake);
        std::fs::write(&p, script)?;
        std::fs::set_permissions(&p, std::os::unix::fs::PermissionsExt::from_mode(0o755))?;
    }
    Ok(bin)
}

fn run_make(target: &str) -> Result<(std::process::Output, String)> {
    let tmp = tempfile::tempdir()?;
    let ran = tmp.path().join("ran.log");
    std::fs::write(&ran, "")?;
    let bin = bare_path(tmp.path(), &ran)?;
    let out = Command::new(bin.join("make"))
        .args(["--no-print-directory", target])
        .current_dir(repo_root())
        .env_clear()
        .env("PATH", &bin)
        .env("HOME", tmp.path())
        .env("HCP_OLM_NO_INSTALL", "1")
        .output()
        .context("run make")?;
    let ran = std::fs::read_to_string(&ran)?;
    Ok((out, ran))
}

fn check_stops_before_building(target: &str, pkgs: &[&str]) -> Result<()> {
    let (out, ran) = run_make(target)?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    ensure!(
        !out.status.success(),
        "make {target} succeeded without its packages: {stderr}"
    );
    ensure!(
        stderr.contains("apt-get install -y --no-install-recommends"),
        "make {target} did not print the install command: {stderr}"
    );
    for p in pkgs {
        ensure!(
            stderr.contains(p),
            "make {target} did not name package {p}: {stderr}"
        );
    }
    // the fakes record `go env GOVERSION` (the version check) but no build
    ensure!(
        !ran.contains("cargo build") && !ran.contains("go build") && !ran.contains("cargo test"),
        "make {target} started a build before failing: {ran}"
    );
    Ok(())
}

#[test]
fn make_demo_stops_at_once_naming_the_missing_packages() -> Result<()> {
    check_stops_before_building("demo", &["nftables", "runc", "iproute2"])
}

#[test]
fn make_test_stops_at_once_naming_the_missing_packages() -> Result<()> {
    check_stops_before_building(
        "test",
        &["nftables", "wireguard-tools", "dnsmasq-base", "ipset"],
    )
}

#[test]
fn prereqs_pass_on_this_machine() -> Result<()> {
    // .ci/run installs what `make test` needs before the tests run, so here both checks pass.
    for what in ["demo", "test"] {
        let out = Command::new(repo_root().join("scripts/prereqs.sh"))
            .arg(what)
            .env("HCP_OLM_NO_INSTALL", "1")
            .output()?;
        ensure!(
            out.status.success(),
            "prereqs {what}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(())
}
