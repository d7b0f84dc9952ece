//! `hcp-olm-images` end to end: every image built twice from the same binaries has the same
//! digest; an image's root file system runs its binary on its own (chroot: the libraries
//! `ldd` found are all there); `--push` to a real registry that requires auth serves every
//! tag at the built digest, and wrong credentials fail with a clear error.
//!
//! The binaries packed are copies of a real dynamically linked ELF under each image's binary
//! names: `/usr/bin/ls` where every image is built, this crate's own `hcp-olm-images` (a Rust
//! binary like ours) where one image's file system is run; `make images` packs the real
//! ones from `target/release`.

use std::path::Path;
use std::process::Command;

use anyhow::{Context as _, Result, ensure};
use base64::Engine as _;
use hcp_olm_e2e::registry::{Registry, TEST_USER_HASH, TEST_USER_PASSWORD};
use hcp_olm_images::IMAGES;
use hcp_olm_oci::{Client, ClientOptions, Lookup, PullSecret};

const BIN: &str = env!("CARGO_BIN_EXE_hcp-olm-images");

/// Every image's amd64 binaries as copies of `source` in `<dir>/x86_64-unknown-linux-gnu`,
/// and the real arm64 ones (`make cross-arm64`) in `<dir>/aarch64-unknown-linux-gnu`; pass
/// `<dir>/{target}` as `--bin-dir`.
fn bin_dir(source: &str) -> Result<tempfile::TempDir> {
    let dir = tempfile::tempdir()?;
    let amd = dir.path().join("x86_64-unknown-linux-gnu");
    std::fs::create_dir(&amd)?;
    for def in IMAGES {
        for b in def.binaries {
            std::fs::copy(source, amd.join(b))?;
        }
    }
    let arm = hcp_olm_e2e::tools::arm64_bin("hcp-olm-controller")?;
    std::os::unix::fs::symlink(
        arm.parent().context("arm64 dir")?,
        dir.path().join("aarch64-unknown-linux-gnu"),
    )?;
    Ok(dir)
}

/// A small dynamically linked system binary, so building all images twice stays quick
/// (this crate's debug binary is over 100 MB).
const SMALL: &str = "/usr/bin/ls";

fn build(bins: &Path, out: &Path, extra: &[&str]) -> Result<std::process::Output> {
    Ok(Command::new(BIN)
        .arg("--bin-dir")
        .arg(bins.join("{target}"))
        .arg("--out")
        .arg(out)
        .args(["--revision", "0123abc", "--source-date-epoch", "1764028800"])
        .args(extra)
        .env_remove("REGISTRY")
        .env_remove("REGISTRY_AUTH_FILE")
        .output()?)
}

fn index_digests(out: &Path) -> Result<Vec<(String, String)>> {
    let index: serde_json::Value = serde_json::from_slice(&std::fs::read(out.join("index.json"))?)?;
    Ok(index["manifests"]
        .as_array()
        .context("manifests")?
        .iter()
        .map(|m| {
            (
                m["annotations"]["org.opencontainers.image.ref.name"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string(),
                m["digest"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect())
}

fn blob(out: &Path, digest: &str) -> Result<Vec<u8>> {
    Ok(std::fs::read(
        out.join("blobs/sha256")
            .join(digest.trim_start_matches("sha256:")),
    )?)
}

#[test]
fn images_are_reproducible_self_contained_and_non_root() -> Result<()> {
    let small = bin_dir(SMALL)?;
    let work = tempfile::tempdir()?;
    let (a, b) = (work.path().join("a"), work.path().join("b"));
    for out in [&a, &b] {
        let o = build(small.path(), out, &["--arch", "amd64"])?;
        ensure!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    }
    let da = index_digests(&a)?;
    ensure!(da.len() == IMAGES.len(), "{da:?}");
    ensure!(da == index_digests(&b)?, "two builds differ");
    for (r, _) in &da {
        ensure!(
            r.starts_with("quay.io/hcp-olm/hcp-olm-")
                && r.ends_with(&format!(":v{}", env!("CARGO_PKG_VERSION"))),
            "{r}"
        );
    }
    // One image with a Rust binary like ours, twice: same digest; then run from its files.
    let bins = bin_dir(BIN)?;
    let (a, b) = (work.path().join("ra"), work.path().join("rb"));
    for out in [&a, &b] {
        let o = build(bins.path(), out, &["--image", "hcp-olm-controller"])?;
        ensure!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    }
    let da = index_digests(&a)?;
    ensure!(
        da == index_digests(&b)?,
        "two builds of the controller image differ"
    );
    // The controller's image index: one image per architecture.
    let (_, digest) = da
        .iter()
        .find(|(r, _)| r.contains("/hcp-olm-controller:"))
        .context("controller image")?;
    let index: serde_json::Value = serde_json::from_slice(&blob(&a, digest)?)?;
    ensure!(
        index["mediaType"] == "application/vnd.oci.image.index.v1+json",
        "{index}"
    );
    let platforms: Vec<String> = index["manifests"]
        .as_array()
        .context("manifests")?
        .iter()
        .map(|m| {
            m["platform"]["architecture"]
                .as_str()
                .unwrap_or_default()
                .to_string()
        })
        .collect();
    ensure!(platforms == ["amd64", "arm64"], "{platforms:?}");
    let provenance: serde_json::Value =
        serde_json::from_slice(&std::fs::read(a.join("provenance.intoto.json"))?)?;
    ensure!(
        provenance["subject"][0]["digest"]["sha256"] == digest.trim_start_matches("sha256:"),
        "{provenance}"
    );
    for m in index["manifests"].as_array().context("manifests")? {
        let arch = m["platform"]["architecture"].as_str().unwrap_or_default();
        let manifest: serde_json::Value =
            serde_json::from_slice(&blob(&a, m["digest"].as_str().context("digest")?)?)?;
        let config: serde_json::Value = serde_json::from_slice(&blob(
            &a,
            manifest["config"]["digest"].as_str().context("config")?,
        )?)?;
        ensure!(config["architecture"] == arch, "{config}");
        ensure!(config["config"]["User"] == "65532:65532", "{config}");
        ensure!(
            config["config"]["Entrypoint"] == serde_json::json!(["/usr/bin/hcp-olm-controller"]),
            "{config}"
        );
        ensure!(config["config"]["Labels"]["org.opencontainers.image.revision"] == "0123abc");
        let layer = blob(
            &a,
            manifest["layers"][0]["digest"].as_str().context("layer")?,
        )?;
        let root = work.path().join(format!("root-{arch}"));
        tar::Archive::new(flate2::read::GzDecoder::new(&layer[..])).unpack(&root)?;
        ensure!(root.join("etc/ssl/certs/ca-certificates.crt").is_file());
        // The image's SBOM, the same as the one beside the layout.
        let sbom = std::fs::read(root.join(hcp_olm_images::SBOM_PATH.trim_start_matches('/')))?;
        ensure!(
            sbom == std::fs::read(a.join(format!("sbom/hcp-olm-controller-{arch}.spdx.json")))?,
            "the {arch} image's SBOM differs from the one beside the layout"
        );
        let doc: serde_json::Value = serde_json::from_slice(&sbom)?;
        let names: Vec<&str> = doc["packages"]
            .as_array()
            .context("packages")?
            .iter()
            .filter_map(|p| p["name"].as_str())
            .collect();
        for want in [
            "hcp-olm-controller",
            "hcp-olm-controlplane",
            "kube-client",
            "tokio",
            "ca-certificates",
        ] {
            ensure!(names.contains(&want), "{arch} SBOM lacks {want}: {names:?}");
        }
        // Its file system runs its binary on its own: amd64 under chroot (the libraries ldd
        // found are all there, each named in the SBOM by its Debian package), arm64 static
        // under qemu.
        let o = match arch {
            "amd64" => {
                ensure!(names.contains(&"libc6"), "{names:?}");
                Command::new("chroot")
                    .arg(&root)
                    .args(["/usr/bin/hcp-olm-controller", "--help"])
                    .output()?
            }
            _ => {
                ensure!(
                    !names.contains(&"libc6"),
                    "a static image names libc6: {names:?}"
                );
                Command::new("qemu-aarch64")
                    .arg(root.join("usr/bin/hcp-olm-controller"))
                    .arg("--version")
                    .output()?
            }
        };
        ensure!(
            o.status.success(),
            "the {arch} binary does not run from its image alone: {} {}",
            o.status,
            String::from_utf8_lossy(&o.stderr)
        );
    }
    // Bad input: a missing binary names itself and the build command.
    let empty = tempfile::tempdir()?;
    let o = build(empty.path(), &work.path().join("c"), &[])?;
    let err = String::from_utf8_lossy(&o.stderr);
    ensure!(
        !o.status.success()
            && err.contains("hcp-olm-controller")
            && err.contains("cargo build --profile dist"),
        "{err}"
    );
    let o = build(bins.path(), &work.path().join("c"), &["--image", "nope"])?;
    ensure!(!o.status.success() && String::from_utf8_lossy(&o.stderr).contains("--image nope"));
    Ok(())
}

fn auth_file(dir: &Path, registry: &str, password: &str) -> Result<std::path::PathBuf> {
    let auth = base64::engine::general_purpose::STANDARD.encode(format!("reader:{password}"));
    let p = dir.join(format!("auth-{password}.json"));
    std::fs::write(
        &p,
        serde_json::to_vec(&serde_json::json!({"auths": {registry: {"auth": auth}}}))?,
    )?;
    Ok(p)
}

#[tokio::test]
async fn push_to_a_registry_with_auth() -> Result<()> {
    let reg = Registry::start_with_htpasswd(&[("reader", TEST_USER_HASH)])?;
    let bins = bin_dir(SMALL)?;
    let work = tempfile::tempdir()?;
    let out = work.path().join("layout");
    let registry = format!("{}/hcp-olm", reg.addr());
    let good = auth_file(work.path(), reg.addr(), TEST_USER_PASSWORD)?;
    let o = build(
        bins.path(),
        &out,
        &[
            "--push",
            "--plain-http",
            "--registry",
            &registry,
            "--auth-file",
            good.to_str().context("path")?,
            "--image",
            "hcp-olm-guest-agent",
            "--image",
            "hcp-olm-tunnel-gateway",
        ],
    )?;
    let stdout = String::from_utf8_lossy(&o.stdout);
    ensure!(
        o.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let built = index_digests(&out)?;
    ensure!(built.len() == 2, "{built:?}");
    let client = Client::new(ClientOptions {
        pull_secret: PullSecret::parse(&std::fs::read(&good)?)?,
        plain_http: vec![reg.addr().to_string()],
        ..Default::default()
    })?;
    for (r, digest) in &built {
        ensure!(stdout.contains(&format!("pushed {r}@{digest}")), "{stdout}");
        match client.resolve(r).await? {
            Lookup::Found { digest: d, .. } => ensure!(&d == digest, "{r}: {d} != {digest}"),
            other => anyhow::bail!("{r}: {other:?}"),
        }
    }
    // Wrong credentials: a clear failure, nothing claimed pushed.
    let bad = auth_file(work.path(), reg.addr(), "wrong")?;
    let o = build(
        bins.path(),
        &work.path().join("layout2"),
        &[
            "--push",
            "--plain-http",
            "--registry",
            &registry,
            "--auth-file",
            bad.to_str().context("path")?,
            "--image",
            "hcp-olm-dns",
        ],
    )?;
    let err = String::from_utf8_lossy(&o.stderr);
    ensure!(!o.status.success(), "pushed with a wrong password");
    ensure!(err.contains("pushing") && err.contains("401"), "{err}");
    ensure!(!String::from_utf8_lossy(&o.stdout).contains("pushed "));
    Ok(())
}
