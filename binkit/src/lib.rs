//! What every hcp-olm binary shares, so each `main.rs` stays wiring:
//! - [`parse_args`]: flag errors print clap's message (it names the flag) and exit 64
//!   (EX_USAGE); `--help` and `--version` exit 0.
//! - [`LogArgs`] + [`init_logging`]: `--log-format=text|json` on every binary, level from
//!   `RUST_LOG`, `info` when unset; logs go to stderr.
//! - [`parse_duration`]: one duration syntax for every flag and config field (humantime:
//!   `500ms`, `10s`, `5m`, `1h30m`; a bare number is seconds).
//! - [`admin`]: the `/healthz`, `/readyz` and `/metrics` endpoints and the `hcp_olm_`
//!   metrics registry with `hcp_olm_build_info`.
//! - [`flags_without_help`]: for each binary's test that every flag is documented.

pub mod admin;

use std::process::ExitCode;
use std::time::Duration;

/// Exit status for flag and config errors (sysexits EX_USAGE).
pub const EX_USAGE: u8 = 64;

/// Parses the process arguments; `Err` holds the exit code to return from `main` (64 for a
/// flag error, 0 for `--help`/`--version`), after clap has printed its message.
pub fn parse_args<T: clap::Parser>() -> Result<T, ExitCode> {
    parse_from(std::env::args_os())
}

/// [`parse_args`] over given arguments (the first is the program name).
pub fn parse_from<T, I, A>(args: I) -> Result<T, ExitCode>
where
    T: clap::Parser,
    I: IntoIterator<Item = A>,
    A: Into<std::ffi::OsString> + Clone,
{
    T::try_parse_from(args).map_err(|e| {
        let _ = e.print();
        if e.use_stderr() {
            ExitCode::from(EX_USAGE)
        } else {
            ExitCode::SUCCESS
        }
    })
}

/// Log output format.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    #[default]
    Text,
    /// One JSON object per line.
    Json,
}

/// The logging flags every binary takes (`#[command(flatten)]`).
#[derive(Debug, Clone, Default, clap::Args)]
pub struct LogArgs {
    /// Log format: text or json (level from RUST_LOG, info when unset).
    #[arg(
        long = "log-format",
        value_enum,
        default_value_t,
        env = "HCP_OLM_LOG_FORMAT",
        global = true
    )]
    pub log_format: LogFormat,
}

impl LogArgs {
    /// Installs the global subscriber (see [`init_logging`]).
    pub fn init(&self) {
        init_logging(self.log_format);
    }
}

/// Installs the global tracing subscriber: stderr, `RUST_LOG` or `info`, in `format`.
/// A second call (tests) is ignored.
pub fn init_logging(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let _ = match format {
        LogFormat::Json => builder.json().try_init(),
        LogFormat::Text => builder.try_init(),
    };
}

/// Parses a duration: humantime syntax (`500ms`, `10s`, `5m`, `1h30m`), or a bare number of
/// seconds. Zero is refused: every duration we take is a timeout or an interval.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let t = s.trim();
    let d = if !t.is_empty() && t.bytes().all(|b| b.is_ascii_digit()) {
        t.parse::<u64>()
            .map(Duration::from_secs)
            .map_err(|e| format!("{s:?}: {e}"))?
    } else {
        humantime::parse_duration(t).map_err(|e| format!("{s:?}: {e} (e.g. 500ms, 10s, 5m, 1h)"))?
    };
    if d.is_zero() {
        return Err(format!("{s:?}: must be positive"));
    }
    Ok(d)
}

/// The unit test every binary has: each flag of the clap parser `$cli` has help text.
/// `hcp_olm_binkit::every_flag_has_help_test!(Cli);` at the binary's top level.
#[macro_export]
macro_rules! every_flag_has_help_test {
    ($cli:ty) => {
        #[cfg(test)]
        #[test]
        fn every_flag_has_help() {
            use clap::CommandFactory as _;
            assert_eq!(
                $crate::flags_without_help(&<$cli>::command()),
                Vec::<String>::new()
            );
        }
    };
}

/// The flags and positional arguments of `cmd` and its subcommands that have no help text
/// (`subcommand --flag` or `--flag`); clap's own `--help`/`--version` are not counted.
pub fn flags_without_help(cmd: &clap::Command) -> Vec<String> {
    fn walk(cmd: &clap::Command, path: &str, out: &mut Vec<String>) {
        for a in cmd.get_arguments() {
            let id = a.get_id().as_str();
            if a.is_hide_set() || id == "help" || id == "version" {
                continue;
            }
            if a.get_help().is_none() && a.get_long_help().is_none() {
                let name = match (a.get_long(), a.get_short()) {
                    (Some(l), _) => format!("--{l}"),
                    (None, Some(s)) => format!("-{s}"),
                    (None, None) => format!("<{id}>"),
                };
                out.push(format!("{path}{name}"));
            }
        }
        for sub in cmd.get_subcommands() {
            if sub.get_name() == "help" {
                continue;
            }
            walk(sub, &format!("{path}{} ", sub.get_name()), out);
        }
    }
    let mut out = Vec::new();
    walk(cmd, "", &mut out);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, clap::Parser)]
    struct Demo {
        /// A timeout.
        #[arg(long, value_parser = parse_duration)]
        timeout: Duration,
        #[command(flatten)]
        log: LogArgs,
    }

    fn code(r: Result<Demo, ExitCode>) -> Option<ExitCode> {
        r.err()
    }

    #[test]
    fn flag_errors_exit_64_help_exits_0() {
        assert_eq!(
            code(parse_from(["x", "--nope"])),
            Some(ExitCode::from(EX_USAGE))
        );
        assert_eq!(
            code(parse_from(["x", "--timeout", "soon"])),
            Some(ExitCode::from(EX_USAGE))
        );
        assert_eq!(code(parse_from(["x", "--help"])), Some(ExitCode::SUCCESS));
        let ok = parse_from::<Demo, _, _>(["x", "--timeout", "2m", "--log-format", "json"])
            .expect("valid flags");
        assert_eq!(ok.timeout, Duration::from_secs(120));
        assert_eq!(ok.log.log_format, LogFormat::Json);
    }

    #[test]
    fn undocumented_flags_are_found() {
        use clap::CommandFactory;
        #[derive(Debug, clap::Parser)]
        struct Sloppy {
            /// Documented.
            #[arg(long)]
            fine: bool,
            #[arg(short = 'o', long)]
            output: Option<String>,
            #[command(subcommand)]
            sub: Option<Sub>,
        }
        #[derive(Debug, clap::Subcommand)]
        enum Sub {
            /// A subcommand.
            Run {
                #[arg(long)]
                image: Option<String>,
                /// Documented.
                name: Option<String>,
            },
        }
        assert_eq!(
            flags_without_help(&Sloppy::command()),
            vec!["--output".to_string(), "run --image".to_string()]
        );
        assert!(flags_without_help(&Demo::command()).is_empty());
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("10"), Ok(Duration::from_secs(10)));
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("1h30m"), Ok(Duration::from_secs(5400)));
        assert_eq!(parse_duration("6h"), Ok(Duration::from_secs(6 * 3600)));
        assert!(parse_duration("0s").is_err());
        assert!(parse_duration("").is_err());
        assert!(parse_duration("-1s").is_err());
        assert!(parse_duration("5 parsecs").is_err());
    }
}
