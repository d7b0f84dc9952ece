//! The binary: exit codes and output of `render` and `crd`.

mod common;

use std::process::Command;

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_hcp-olm-controller"))
}

#[test]
fn render_without_version_exits_64_naming_the_field() {
    let out = bin()
        .args(["render", "--hosted-cluster"])
        .arg(common::examples_dir().join("none-minimal.yaml"))
        .args(["--olm-image", "quay.io/x/olm:1"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(64));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("HostedCluster.spec.release.image"), "{err}");
}

#[test]
fn render_missing_file_exits_64() {
    let out = bin()
        .args(["render", "--hosted-cluster", "/nonexistent.yaml"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(64));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--hosted-cluster"));
}

#[test]
fn render_prints_both_clusters() {
    for fmt in ["yaml", "json"] {
        let out = bin()
            .args(["render", "--hosted-cluster"])
            .arg(common::examples_dir().join("kubevirt-complex-flags.yaml"))
            .args([
                "--release-version",
                "4.18.2",
                "--olm-image",
                "quay.io/x/olm:1",
                "-o",
                fmt,
            ])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let text = String::from_utf8(out.stdout).unwrap();
        assert!(text.contains("hcp-olm-packageserver"));
        assert!(text.contains("CatalogSource"));
        assert!(text.contains("clusters-test1"));
        if fmt == "json" {
            let v: serde_json::Value = serde_json::from_str(&text).unwrap();
            assert!(!v["hcp"].as_array().unwrap().is_empty());
            assert!(!v["guest"].as_array().unwrap().is_empty());
        } else {
            assert!(text.contains("# cluster: guest"));
        }
    }
}

#[test]
fn render_invalid_override_exits_64() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("ov.yaml");
    std::fs::write(&p, "maxCatalogVersion: latest\n").unwrap();
    let out = bin()
        .args(["render", "--hosted-cluster"])
        .arg(common::examples_dir().join("none-minimal.yaml"))
        .args([
            "--release-version",
            "4.18.2",
            "--olm-image",
            "quay.io/x/olm:1",
            "--overrides",
        ])
        .arg(&p)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(64));
    assert!(String::from_utf8_lossy(&out.stderr).contains("HostedOLM.spec.maxCatalogVersion"));
}

#[test]
fn crd_subcommand_prints_the_crd() {
    let out = bin().arg("crd").output().unwrap();
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains("hostedolms.olm.hcp-olm.io"));
}

#[test]
fn run_flag_errors_exit_64_naming_the_flag() {
    let out = bin()
        .args(["run", "--catalog-refresh-interval", "5x"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(64));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--catalog-refresh-interval"), "{err}");
    for bad in [
        "registry.redhat.io/redhat",
        "=m/x",
        "a=https://m/x",
        "a=m/x:tag",
        "a=m/x/",
    ] {
        let out = bin()
            .args(["run", "--registry-mirror", bad])
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(64), "{bad}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("--registry-mirror"), "{bad}: {err}");
    }
    // Scope and fleet default (issue 37 item 1).
    for (flag, bad) in [
        ("--hosted-cluster-selector", "pilot in (a"),
        ("--hosted-cluster-selector", "Bad Key=x"),
        ("--hypershift-olm", "Takeover"),
    ] {
        let out = bin().args(["run", flag, bad]).output().unwrap();
        assert_eq!(out.status.code(), Some(64), "{flag} {bad}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(flag), "{flag} {bad}: {err}");
    }
    // The guest server address flags (issue 35) take CIDRs, for `run` and `uninstall`.
    for (sub, flag) in [
        ("run", "--guest-server-refused-cidrs"),
        ("run", "--guest-server-allowed-cidrs"),
        ("uninstall", "--guest-server-allowed-cidrs"),
    ] {
        let out = bin()
            .args([sub, flag, "10.0.0.0/8,nonsense"])
            .env("KUBECONFIG", "/nonexistent")
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(64), "{sub} {flag}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(flag) && err.contains("nonsense"), "{err}");
    }
    // Leader-election durations are checked before any cluster is contacted.
    let out = bin()
        .args([
            "run",
            "--leader-elect=true",
            "--leader-elect-lease-duration",
            "5s",
            "--leader-elect-renew-deadline",
            "10s",
        ])
        .env("KUBECONFIG", "/nonexistent")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(64));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--leader-elect") && err.contains("renew deadline"),
        "{err}"
    );
}

#[test]
fn every_flag_has_help_text() {
    // (the binary's unit test checks every flag through clap; this checks what users see)
    let out = bin().args(["run", "--help"]).output().unwrap();
    assert_eq!(out.status.code(), Some(0));
    let help = String::from_utf8_lossy(&out.stdout);
    for want in [
        "hcp-olm-catalog-server image",
        "Tunnel gateway image",
        "Guest agent image",
    ] {
        assert!(help.contains(want), "{want} missing in\n{help}");
    }
    let out = bin().args(["render", "--help"]).output().unwrap();
    let help = String::from_utf8_lossy(&out.stdout);
    assert!(help.contains("Output format"), "{help}");
}
