//! `make test-images`: every image of the test environment (`hcp_olm_e2e::testimages`: the
//! pinned upstream binaries, our pause, index images shaped like Red Hat's, an operator bundle
//! and the image its operator runs), built without a container engine and written as one OCI
//! layout. Prints each image's reference, digest and compressed size. The real-node tests
//! build and push the images they run themselves; this is for looking at them and for
//! pushing them elsewhere.
//!
//! Usage: `hcp-olm-test-images [--out DIR]` (default `target/test-images`; an existing OCI
//! layout there is replaced, any other directory refused). A bad argument exits 64 naming it.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context as _;

/// The registry name the layout's references carry.
const REGISTRY: &str = "registry.test";

fn main() -> ExitCode {
    let mut out = PathBuf::from("target/test-images");
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--out" => match args.next() {
                Some(d) => out = PathBuf::from(d),
                None => {
                    eprintln!("hcp-olm-test-images: --out needs a directory");
                    return ExitCode::from(64);
                }
            },
            "-h" | "--help" => {
                println!("usage: hcp-olm-test-images [--out DIR]");
                return ExitCode::SUCCESS;
            }
            other => {
                eprintln!("hcp-olm-test-images: unknown argument {other:?} (usage: [--out DIR])");
                return ExitCode::from(64);
            }
        }
    }
    match run(&out) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("hcp-olm-test-images: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(out: &std::path::Path) -> anyhow::Result<()> {
    let work = tempfile::tempdir().context("creating a work directory")?;
    let mut built = Vec::new();
    for img in hcp_olm_e2e::testimages::all(work.path())? {
        let b = img.build()?;
        let r = img.reference(REGISTRY);
        println!(
            "image {r} {} {:.1} MiB compressed",
            b.digest(),
            b.size() as f64 / (1024.0 * 1024.0)
        );
        built.push((r, b));
    }
    if out.exists() {
        // only a layout of ours is replaced, never any other directory
        if !out.join("oci-layout").is_file() {
            anyhow::bail!(
                "--out {}: exists and is not an OCI layout; not replacing it",
                out.display()
            );
        }
        std::fs::remove_dir_all(out)
            .with_context(|| format!("removing the old layout {}", out.display()))?;
    }
    hcp_olm_images::write_layout(out, &built)?;
    println!("OCI layout: {}", out.display());
    Ok(())
}
