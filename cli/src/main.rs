//! hcp-olm: the user CLI. Wiring only: each subcommand lives in the library.

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// Exit code for flag errors (EX_USAGE).
const EXIT_USAGE: u8 = 64;

#[derive(Debug, Parser)]
#[command(
    name = "hcp-olm",
    version,
    about = "hcp-olm: OLM for HyperShift hosted clusters"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Browse operator catalogs (packages, channels, bundles, upgrade paths).
    Catalog(hcp_olm_cli::catalog::CatalogArgs),
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        Err(e) => {
            let _ = e.print();
            return match e.kind() {
                clap::error::ErrorKind::DisplayHelp | clap::error::ErrorKind::DisplayVersion => {
                    ExitCode::SUCCESS
                }
                _ => ExitCode::from(EXIT_USAGE),
            };
        }
    };
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
