//! The test tools' command lines: a flag error exits 64 naming the flag, `--help` exits 0;
//! `hcp-olm-tunnel-ping` takes `--log-format` like the daemons.

use std::process::Command;

#[test]
fn tool_flag_errors_exit_64_naming_the_flag() {
    let impair = env!("CARGO_BIN_EXE_hcp-olm-udp-impair");
    let ping = env!("CARGO_BIN_EXE_hcp-olm-tunnel-ping");
    for (bin, args) in [
        (
            impair,
            &["--listen", "127.0.0.1:0", "--server", "nowhere"][..],
        ),
        (impair, &["--no-such-flag"][..]),
        (ping, &["--no-such-flag"][..]),
        (ping, &["--log-format", "xml"][..]),
    ] {
        let out = Command::new(bin).args(args).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(64), "{bin} {args:?}: {err}");
        let flag = if args[0] == "--listen" {
            "--server"
        } else {
            args[0]
        };
        assert!(err.contains(flag), "{bin} {args:?}: {err}");
    }
    for bin in [impair, ping] {
        let out = Command::new(bin).arg("--help").output().unwrap();
        assert_eq!(out.status.code(), Some(0), "{bin}");
    }
    let out = Command::new(ping).arg("--help").output().unwrap();
    assert!(String::from_utf8_lossy(&out.stdout).contains("--log-format"));
}
