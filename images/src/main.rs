//! hcp-olm-images: builds hcp-olm's container images from release binaries (no container
//! engine), writes them as an OCI layout and, with `--push`, pushes them. Wiring only: the
//! images are made by the library.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context as _, bail};
use clap::Parser;
use hcp_olm_images::{IMAGES, Meta, build, files_for, reference, write_layout};
use hcp_olm_oci::{Client, ClientOptions, Lookup, PullSecret};

#[derive(Parser, Debug)]
#[command(
    name = "hcp-olm-images",
    version,
    about = "Build hcp-olm's container images"
)]
struct Args {
    /// Directory holding the release binaries (cargo build --profile dist).
    #[arg(long, default_value = "target/dist")]
    bin_dir: PathBuf,
    /// Where the OCI image layout is written (replaced).
    #[arg(long, default_value = "target/images")]
    out: PathBuf,
    /// Registry and organisation the images are named in (and pushed to with --push).
    #[arg(long, default_value = hcp_olm_images::DEFAULT_REGISTRY, env = "REGISTRY")]
    registry: String,
    /// Push every image to --registry after building.
    #[arg(long)]
    push: bool,
    /// Docker config JSON with credentials for --registry (REGISTRY_AUTH_FILE; default
    /// ~/.docker/config.json when it exists).
    #[arg(long, env = "REGISTRY_AUTH_FILE")]
    auth_file: Option<PathBuf>,
    /// Reach the registry over plain HTTP (a local test registry on loopback).
    #[arg(long)]
    plain_http: bool,
    /// Image version (tags are v<version>).
    #[arg(long, default_value = env!("CARGO_PKG_VERSION"))]
    image_version: String,
    /// Commit the binaries were built from (org.opencontainers.image.revision).
    #[arg(long, default_value = "unknown", env = "HCP_OLM_REVISION")]
    revision: String,
    /// Seconds since 1970 used for every time stamp (the commit's time, for reproducibility).
    #[arg(long, default_value_t = 0, env = "SOURCE_DATE_EPOCH")]
    source_date_epoch: u64,
    /// Build only these images (by name, e.g. hcp-olm-controller); all when unset.
    #[arg(long = "image")]
    only: Vec<String>,
    /// CA bundle put in every image.
    #[arg(long, default_value = "/etc/ssl/certs/ca-certificates.crt")]
    ca_bundle: PathBuf,
    #[command(flatten)]
    log: hcp_olm_binkit::LogArgs,
}

fn main() -> ExitCode {
    let args: Args = match hcp_olm_binkit::parse_args() {
        Ok(a) => a,
        Err(code) => return code,
    };
    args.log.init();
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("hcp-olm-images: cannot start runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match rt.block_on(run(args)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("hcp-olm-images: {e:#}");
            ExitCode::FAILURE
        }
    }
}

async fn run(a: Args) -> anyhow::Result<()> {
    for name in &a.only {
        if !IMAGES.iter().any(|d| d.name == name) {
            bail!(
                "--image {name}: no such image (one of {})",
                IMAGES.iter().map(|d| d.name).collect::<Vec<_>>().join(", ")
            );
        }
    }
    let ca = std::fs::read(&a.ca_bundle).with_context(|| {
        format!(
            "reading the CA bundle {} (Debian package ca-certificates)",
            a.ca_bundle.display()
        )
    })?;
    let meta = Meta {
        version: a.image_version.clone(),
        revision: a.revision.clone(),
        created: a.source_date_epoch,
    };
    let mut built = Vec::new();
    for def in IMAGES
        .iter()
        .filter(|d| a.only.is_empty() || a.only.iter().any(|n| n == d.name))
    {
        let files = files_for(def, &a.bin_dir, &ca)?;
        let img = build(def, &files, &meta)?;
        let r = reference(&a.registry, def, &a.image_version);
        println!(
            "image {r} {} {:.1} MiB compressed",
            img.digest(),
            img.size() as f64 / (1024.0 * 1024.0)
        );
        built.push((r, img));
    }
    if a.out.exists() {
        std::fs::remove_dir_all(&a.out)
            .with_context(|| format!("removing the old layout {}", a.out.display()))?;
    }
    write_layout(&a.out, &built)?;
    println!("OCI layout: {}", a.out.display());
    if !a.push {
        return Ok(());
    }
    let auth = match &a.auth_file {
        Some(p) => Some(p.clone()),
        None => std::env::var_os("HOME")
            .map(|h| PathBuf::from(h).join(".docker/config.json"))
            .filter(|p| p.is_file()),
    };
    let pull_secret = match &auth {
        Some(p) => PullSecret::parse(
            &std::fs::read(p).with_context(|| format!("reading {}", p.display()))?,
        )
        .with_context(|| format!("{} is not a docker config", p.display()))?,
        None => PullSecret::default(),
    };
    let host = a.registry.split('/').next().unwrap_or_default().to_string();
    let client = Client::new(ClientOptions {
        pull_secret,
        plain_http: if a.plain_http { vec![host] } else { vec![] },
        timeout: Some(Duration::from_secs(120)),
        ..Default::default()
    })?;
    for (r, img) in &built {
        let digest = client
            .push_built(r, &img.layers, img.config.clone(), img.manifest.clone())
            .await
            .with_context(|| format!("pushing {r}"))?;
        // The registry must serve the tag at our digest.
        match client.resolve(r).await? {
            Lookup::Found { digest: d, .. } if d == digest => {
                println!("pushed {r}@{digest}");
            }
            other => bail!("{r}: pushed {digest}, the registry answers {other:?}"),
        }
    }
    Ok(())
}

hcp_olm_binkit::every_flag_has_help_test!(Args);
