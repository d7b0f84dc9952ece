//! `kubectl hcp-olm …`: the same CLI as `hcp-olm`, installed as a kubectl plugin (kubectl runs
//! `kubectl-hcp_olm` for `kubectl hcp-olm`). Wiring only.

fn main() -> std::process::ExitCode {
    hcp_olm_cli::main_as("kubectl hcp-olm")
}
