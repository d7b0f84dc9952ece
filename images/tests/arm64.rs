//! The arm64 binaries (issue 39 item 2), as `make cross-arm64` builds them for the images
//! (static, `aarch64-unknown-linux-gnu`), run under qemu-user (Debian's `qemu-aarch64`): each
//! is an aarch64 ELF without a dynamic loader, prints its version, and refuses a bad
//! configuration with exit 64 naming what is wrong; the controller accepts a good one
//! (`run --check-config`). Fails, never skips, when the binaries or qemu are missing.

use std::process::{Command, Output};

use anyhow::{Context, Result, ensure};
use hcp_olm_images::IMAGES;
use hcp_olm_images::multiarch::{Arch, elf_info};

fn qemu(bin: &std::path::Path, args: &[&str]) -> Result<Output> {
    Command::new("qemu-aarch64")
        .arg(bin)
        .args(args)
        .env_remove("CI")
        .env_remove("KUBECONFIG")
        .output()
        .context(
            "running qemu-aarch64 (Debian package qemu-user; scripts/prereqs.sh test installs it)",
        )
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

#[test]
fn every_arm64_binary_runs_under_qemu_and_checks_its_configuration() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let bad_yaml = dir.path().join("bad.yaml");
    std::fs::write(&bad_yaml, "no_such_field: 1\n")?;
    let bad = bad_yaml.to_str().context("utf-8")?;
    let mut ran = 0;
    for def in IMAGES {
        for b in def.binaries {
            let bin = hcp_olm_e2e::tools::arm64_bin(b)?;
            let info = elf_info(&std::fs::read(&bin)?).map_err(anyhow::Error::msg)?;
            ensure!(
                info.machine == Arch::Arm64.elf_machine() && !info.dynamic,
                "{b}: {info:?} (want a static aarch64 ELF)"
            );
            let v = qemu(&bin, &["--version"])?;
            ensure!(
                v.status.success() && text(&v).contains(env!("CARGO_PKG_VERSION")),
                "{b} --version under qemu: {} {}",
                v.status,
                text(&v)
            );
            // A configuration it must refuse: exit 64, naming what is wrong.
            let (args, names): (Vec<&str>, &str) = match *b {
                "hcp-olm-controller" => (
                    vec!["run", "--check-config", "--concurrency=lots"],
                    "--concurrency",
                ),
                // Each daemon's own config format: the error names the file's problem.
                "hcp-olm-gateway" | "hcp-olm-agent" | "hcp-olm-dns" | "hcp-olm-tunnel" => {
                    (vec!["--config", bad], "invalid configuration")
                }
                "hcp-olm-catalog-server" => (vec!["--no-such-flag"], "--no-such-flag"),
                "hcp-olm" | "kubectl-hcp_olm" => {
                    (vec!["status", "--no-such-flag"], "--no-such-flag")
                }
                other => anyhow::bail!("no configuration case for {other}"),
            };
            let o = qemu(&bin, &args)?;
            ensure!(
                o.status.code() == Some(64) && text(&o).contains(names),
                "{b} {args:?} under qemu: {} {}",
                o.status,
                text(&o)
            );
            ran += 1;
        }
    }
    // And one it accepts.
    let controller = hcp_olm_e2e::tools::arm64_bin("hcp-olm-controller")?;
    let o = qemu(
        &controller,
        &[
            "run",
            "--check-config",
            "--leader-elect=true",
            "--secure-metrics-addr=0.0.0.0:8443",
        ],
    )?;
    ensure!(o.status.success(), "{}", text(&o));
    ensure!(ran == IMAGES.iter().map(|d| d.binaries.len()).sum::<usize>());
    Ok(())
}
