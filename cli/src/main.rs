//! hcp-olm: the user CLI. Wiring only: each subcommand lives in the library.

use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(
    name = "hcp-olm",
    version,
    about = "hcp-olm: OLM for HyperShift hosted clusters"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
    #[command(flatten)]
    log: hcp_olm_binkit::LogArgs,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Browse operator catalogs (packages, channels, bundles, upgrade paths).
    Catalog(hcp_olm_cli::catalog::CatalogArgs),
}

fn main() -> ExitCode {
    let cli: Cli = match hcp_olm_binkit::parse_args() {
        Ok(c) => c,
        Err(code) => return code,
    };
    cli.log.init();
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = rt.block_on(async {
        match &cli.command {
            Command::Catalog(args) => {
                hcp_olm_cli::catalog::run(args, &mut std::io::stdout().lock()).await
            }
        }
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
