//! hcp-olm: the user CLI. Wiring only: each subcommand lives in the library.

fn main() -> std::process::ExitCode {
    hcp_olm_cli::main_as("hcp-olm")
}
