//! `make release` (issue 39 item 8), as `scripts/release.sh` runs it, on binaries already
//! built (`RELEASE_SKIP_BUILD=1`: the amd64 ones are copies of a small host binary, the arm64
//! ones the real static builds of `make cross-arm64`; a real release builds both with the
//! dist profile, about 16 minutes cold), with the real helm and kustomize of `make tools`.
//! Checks what a release promises: both architectures' archives with every binary and
//! matching SHA256SUMS, the chart and the manifests pinning every image of ours by the digest
//! of its index, SBOMs and provenance beside them, a CHANGELOG entry inserted once, and the
//! bad inputs refused (a VERSION that is not the workspace's, or not a version).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use anyhow::{Context, Result, ensure};
use hcp_olm_images::IMAGES;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

fn release(bins: &Path, out: &Path, changelog: &Path, version: &str) -> Result<Output> {
    let helm = hcp_olm_e2e::tools::bin("helm")?;
    let tools = helm.parent().context("tools dir")?;
    let home = out.with_extension("home");
    Ok(Command::new("bash")
        .arg(repo().join("scripts/release.sh"))
        .current_dir(repo())
        .env("VERSION", version)
        .env_remove("REGISTRY")
        .env("RELEASE_SKIP_BUILD", "1")
        .env("RELEASE_ALLOW_DIRTY", "1")
        .env("RELEASE_BIN_DIR", bins.join("{target}"))
        .env("RELEASE_OUT", out)
        .env("RELEASE_CHANGELOG", changelog)
        .env("SOURCE_DATE_EPOCH", "1764028800")
        .env("HCP_OLM_IMAGES", env!("CARGO_BIN_EXE_hcp-olm-images"))
        .env("HELM_CACHE_HOME", home.join("cache"))
        .env("HELM_CONFIG_HOME", home.join("config"))
        .env("HELM_DATA_HOME", home.join("data"))
        .env(
            "PATH",
            format!(
                "{}:{}",
                tools.display(),
                std::env::var("PATH").unwrap_or_default()
            ),
        )
        .output()?)
}

#[test]
fn a_release_pins_every_image_by_digest_and_checksums_its_files() -> Result<()> {
    let version = env!("CARGO_PKG_VERSION");
    // amd64: copies of a small host binary; arm64: the real static builds.
    let bins = tempfile::tempdir()?;
    let amd = bins.path().join("x86_64-unknown-linux-gnu");
    std::fs::create_dir(&amd)?;
    for def in IMAGES {
        for b in def.binaries {
            std::fs::copy("/usr/bin/ls", amd.join(b))?;
        }
    }
    let arm = hcp_olm_e2e::tools::arm64_bin("hcp-olm-controller")?;
    std::os::unix::fs::symlink(
        arm.parent().context("arm64 dir")?,
        bins.path().join("aarch64-unknown-linux-gnu"),
    )?;
    let work = tempfile::tempdir()?;
    let out = work.path().join("release");
    let changelog = work.path().join("CHANGELOG.md");
    std::fs::write(
        &changelog,
        "# Changelog\n\n## v0.0.1 (2026-01-01)\n\nolder\n",
    )?;

    let o = release(bins.path(), &out, &changelog, version)?;
    ensure!(o.status.success(), "release.sh: {}", text(&o));

    // Checksums of everything shipped.
    let sums = Command::new("sha256sum")
        .args(["-c", "SHA256SUMS"])
        .current_dir(&out)
        .output()?;
    ensure!(sums.status.success(), "sha256sum -c: {}", text(&sums));
    let listed = std::fs::read_to_string(out.join("SHA256SUMS"))?;
    for f in [
        format!("hcp-olm-{version}-linux-amd64.tar.gz"),
        format!("hcp-olm-{version}-linux-arm64.tar.gz"),
        format!("hcp-olm-{version}.tgz"),
        format!("hcp-olm-{version}.yaml"),
        "images.txt".to_string(),
        "provenance.intoto.json".to_string(),
    ] {
        ensure!(listed.contains(&f), "{f} not in SHA256SUMS:\n{listed}");
    }
    // Each archive holds every binary, for its architecture.
    for (arch, machine) in [("amd64", 62u16), ("arm64", 183u16)] {
        let unpack = work.path().join(format!("unpack-{arch}"));
        std::fs::create_dir(&unpack)?;
        let t = Command::new("tar")
            .arg("-xzf")
            .arg(out.join(format!("hcp-olm-{version}-linux-{arch}.tar.gz")))
            .arg("-C")
            .arg(&unpack)
            .output()?;
        ensure!(t.status.success(), "{}", text(&t));
        for def in IMAGES {
            for b in def.binaries {
                let p = unpack
                    .join(format!("hcp-olm-{version}-linux-{arch}"))
                    .join(b);
                let info = hcp_olm_images::multiarch::elf_info(&std::fs::read(&p)?)
                    .map_err(anyhow::Error::msg)?;
                ensure!(
                    info.machine == machine,
                    "{arch}/{b}: machine {}",
                    info.machine
                );
            }
        }
    }
    // Every image's index digest, and the chart and manifests pinned to them.
    let images = std::fs::read_to_string(out.join("images.txt"))?;
    let digest = |name: &str| -> Result<String> {
        images
            .lines()
            .find_map(|l| {
                l.strip_prefix(&format!("quay.io/hcp-olm/{name}:v{version}@"))
                    .map(str::to_string)
            })
            .with_context(|| format!("{name} not in images.txt:\n{images}"))
    };
    ensure!(images.lines().count() == IMAGES.len(), "{images}");
    let index: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.join("images/index.json"))?)?;
    ensure!(
        index["manifests"][0]["digest"].as_str() == Some(digest("hcp-olm-controller")?.as_str()),
        "images.txt does not match the layout"
    );
    let want = [
        format!(
            "quay.io/hcp-olm/hcp-olm-controller@{}",
            digest("hcp-olm-controller")?
        ),
        format!(
            "--catalog-server-image=quay.io/hcp-olm/hcp-olm-catalog-server@{}",
            digest("hcp-olm-catalog-server")?
        ),
        format!(
            "--tunnel-gateway-image=quay.io/hcp-olm/hcp-olm-tunnel-gateway@{}",
            digest("hcp-olm-tunnel-gateway")?
        ),
        format!(
            "--guest-agent-image=quay.io/hcp-olm/hcp-olm-guest-agent@{}",
            digest("hcp-olm-guest-agent")?
        ),
    ];
    let helm = hcp_olm_e2e::tools::bin("helm")?;
    let home = work.path().join("helm-home");
    let chart = Command::new(&helm)
        .args(["template", "hcp-olm"])
        .arg(out.join(format!("hcp-olm-{version}.tgz")))
        .args(["--namespace", "hcp-olm-system", "--kube-version", "v1.36.3"])
        .env("HELM_CACHE_HOME", home.join("c"))
        .env("HELM_CONFIG_HOME", home.join("cf"))
        .env("HELM_DATA_HOME", home.join("d"))
        .output()?;
    ensure!(chart.status.success(), "{}", text(&chart));
    let rendered = String::from_utf8_lossy(&chart.stdout).into_owned();
    let manifests = std::fs::read_to_string(out.join(format!("hcp-olm-{version}.yaml")))?;
    for w in &want {
        ensure!(
            rendered.contains(w.as_str()),
            "the packaged chart lacks {w}"
        );
        ensure!(
            manifests.contains(w.as_str()),
            "the release manifests lack {w}"
        );
    }
    ensure!(
        !rendered.contains(&format!(":v{version}")) && !manifests.contains(&format!(":v{version}")),
        "an image of ours by tag is left"
    );
    // The krew manifest names both archives by their checksums.
    let krew = std::fs::read_to_string(out.join("krew-hcp-olm.yaml"))?;
    let krew: serde_json::Value = serde_yaml_ng::from_str(&krew)?;
    ensure!(krew["kind"] == "Plugin" && krew["spec"]["version"] == format!("v{version}"));
    for p in krew["spec"]["platforms"].as_array().context("platforms")? {
        let arch = p["selector"]["matchLabels"]["arch"]
            .as_str()
            .context("arch")?;
        let archive = format!("hcp-olm-{version}-linux-{arch}.tar.gz");
        let line = listed
            .lines()
            .find(|l| l.ends_with(&archive))
            .context("archive checksum")?;
        ensure!(Some(line.split_whitespace().next().unwrap_or_default()) == p["sha256"].as_str());
        ensure!(p["bin"] == "kubectl-hcp_olm");
    }
    // SBOMs and provenance beside them.
    for def in IMAGES {
        for arch in ["amd64", "arm64"] {
            ensure!(
                out.join(format!("sbom/{}-{arch}.spdx.json", def.name))
                    .is_file(),
                "no SBOM for {} {arch}",
                def.name
            );
        }
    }
    let prov: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.join("provenance.intoto.json"))?)?;
    ensure!(prov["subject"].as_array().map(Vec::len) == Some(IMAGES.len()));
    // The CHANGELOG entry, above the older one, once.
    let log = std::fs::read_to_string(&changelog)?;
    let entry = format!("## v{version} (2025-11-25)");
    ensure!(
        log.starts_with("# Changelog\n\n") && log.find(&entry) < log.find("## v0.0.1"),
        "{log}"
    );
    ensure!(log.contains(&digest("hcp-olm-guest-agent")?), "{log}");

    // Again: the same archives and images (reproducible), the CHANGELOG left as it is.
    let again = work.path().join("again");
    let o = release(bins.path(), &again, &changelog, version)?;
    ensure!(o.status.success(), "second release.sh: {}", text(&o));
    ensure!(
        std::fs::read_to_string(&changelog)? == log,
        "the entry was added twice"
    );
    for f in [
        format!("hcp-olm-{version}-linux-amd64.tar.gz"),
        format!("hcp-olm-{version}-linux-arm64.tar.gz"),
        "images.txt".to_string(),
        "provenance.intoto.json".to_string(),
        format!("hcp-olm-{version}.yaml"),
    ] {
        ensure!(
            std::fs::read(out.join(&f))? == std::fs::read(again.join(&f))?,
            "{f} differs between two releases of the same binaries"
        );
    }

    // Bad input: a VERSION that is not the workspace's, or not a version at all.
    for (v, says) in [("9.9.9", "workspace version"), ("latest", "not x.y.z")] {
        let o = release(bins.path(), &work.path().join("bad"), &changelog, v)?;
        ensure!(
            o.status.code() == Some(64) && text(&o).contains(says),
            "VERSION={v}: {} {}",
            o.status,
            text(&o)
        );
    }
    Ok(())
}
