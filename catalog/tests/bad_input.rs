//! A malformed or inconsistent catalog is refused with file, document and
//! rule named; the server binary exits non-zero without serving.

use std::path::Path;

use hcp_olm_catalog::{Catalog, Rule};

const PKG: &str = "---\nschema: olm.package\nname: p\ndefaultChannel: stable\n";
const CHANNEL: &str =
    "---\nschema: olm.channel\npackage: p\nname: stable\nentries:\n- name: p.v1.0.0\n";
const BUNDLE: &str = "---\nschema: olm.bundle\npackage: p\nname: p.v1.0.0\nimage: quay.io/x/p:1\nproperties:\n- type: olm.package\n  value: {packageName: p, version: 1.0.0}\n";

fn write(dir: &Path, files: &[(&str, &str)]) {
    for (name, text) in files {
        let path = dir.join(name);
        std::fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
        std::fs::write(path, text).expect("write");
    }
}

/// Loads `files`, expects refusal by `rule`, and checks the message names
/// the file, the document and the rule, plus `needle`.
fn refused(files: &[(&str, &str)], rule: Rule, file: &str, doc: usize, needle: &str) {
    let dir = tempfile::tempdir().expect("tempdir");
    write(dir.path(), files);
    let err = Catalog::load_dir(dir.path()).expect_err("catalog must be refused");
    let msg = err.to_string();
    assert_eq!(err.rule, rule, "wrong rule: {msg}");
    assert!(
        msg.contains(file),
        "message does not name file {file}: {msg}"
    );
    assert!(
        msg.contains(&format!("document {doc}")),
        "message does not name document {doc}: {msg}"
    );
    assert!(
        msg.contains(&format!("rule {}", rule.name())),
        "message does not name the rule: {msg}"
    );
    assert!(
        msg.contains(needle),
        "message does not contain {needle:?}: {msg}"
    );
}

#[test]
fn valid_minimal_catalog_loads() {
    let dir = tempfile::tempdir().expect("tempdir");
    write(
        dir.path(),
        &[("p/catalog.yaml", &format!("{PKG}{CHANNEL}{BUNDLE}"))],
    );
    let c = Catalog::load_dir(dir.path()).expect("valid catalog");
    assert_eq!(c.packages["p"].channels["stable"].head, "p.v1.0.0");
}

#[test]
fn duplicate_package_names_both_places() {
    refused(
        &[
            ("a/catalog.yaml", &format!("{PKG}{CHANNEL}{BUNDLE}")),
            ("b/catalog.yaml", PKG),
        ],
        Rule::DuplicatePackage,
        "b/catalog.yaml",
        1,
        "a/catalog.yaml: document 1",
    );
}

#[test]
fn channel_entry_naming_missing_bundle() {
    let ch = "---\nschema: olm.channel\npackage: p\nname: stable\nentries:\n- name: p.v1.0.0\n- name: p.v2.0.0\n  replaces: p.v1.0.0\n";
    refused(
        &[("c.yaml", &format!("{PKG}{ch}{BUNDLE}"))],
        Rule::MissingBundle,
        "c.yaml",
        2,
        "p.v2.0.0",
    );
}

#[test]
fn bundle_without_package_property() {
    let b = "---\nschema: olm.bundle\npackage: p\nname: p.v1.0.0\nimage: quay.io/x/p:1\nproperties:\n- type: olm.gvk\n  value: {group: g, version: v1, kind: K}\n";
    refused(
        &[("c.yaml", &format!("{PKG}{CHANNEL}{b}"))],
        Rule::PackageProperty,
        "c.yaml",
        3,
        "no olm.package property",
    );
}

#[test]
fn broken_base64_in_bundle_object() {
    let b = "---\nschema: olm.bundle\npackage: p\nname: p.v1.0.0\nimage: \"\"\nproperties:\n- type: olm.package\n  value: {packageName: p, version: 1.0.0}\n- type: olm.bundle.object\n  value: {data: \"not*base64!\"}\n";
    refused(
        &[("c.yaml", &format!("{PKG}{CHANNEL}{b}"))],
        Rule::BundleObject,
        "c.yaml",
        3,
        "base64",
    );
}

#[test]
fn malformed_json_document() {
    let text = "{\"schema\":\"olm.package\",\"name\":\"p\",\"defaultChannel\":\"stable\"}\n{\"schema\": \"olm.channel\", \"package\": ";
    refused(
        &[("p/catalog.json", text)],
        Rule::Syntax,
        "p/catalog.json",
        2,
        "invalid JSON",
    );
}

#[test]
fn malformed_yaml_document() {
    refused(
        &[("c.yaml", &format!("{PKG}---\nschema: [unclosed\n"))],
        Rule::Syntax,
        "c.yaml",
        2,
        "invalid YAML",
    );
}

#[test]
fn missing_schema() {
    refused(
        &[("c.yaml", &format!("{PKG}---\nname: x\n"))],
        Rule::MissingSchema,
        "c.yaml",
        2,
        "schema",
    );
}

#[test]
fn default_channel_must_exist() {
    let pkg = "---\nschema: olm.package\nname: p\ndefaultChannel: beta\n";
    refused(
        &[("c.yaml", &format!("{pkg}{CHANNEL}{BUNDLE}"))],
        Rule::DefaultChannel,
        "c.yaml",
        1,
        "\"beta\"",
    );
}

#[test]
fn channel_for_unknown_package() {
    let ch = "---\nschema: olm.channel\npackage: q\nname: stable\nentries:\n- name: q.v1\n";
    refused(
        &[("c.yaml", &format!("{PKG}{CHANNEL}{BUNDLE}{ch}"))],
        Rule::UnknownPackage,
        "c.yaml",
        4,
        "\"q\"",
    );
}

#[test]
fn two_channel_heads() {
    let ch = "---\nschema: olm.channel\npackage: p\nname: stable\nentries:\n- name: p.v1.0.0\n- name: p.v2.0.0\n";
    let b2 = BUNDLE
        .replace("p.v1.0.0", "p.v2.0.0")
        .replace("1.0.0}", "2.0.0}");
    refused(
        &[("c.yaml", &format!("{PKG}{ch}{BUNDLE}{b2}"))],
        Rule::ChannelGraph,
        "c.yaml",
        2,
        "multiple channel heads",
    );
}

#[test]
fn stranded_bundle() {
    let ch = "---\nschema: olm.channel\npackage: p\nname: stable\nentries:\n- name: p.v1.0.0\n- name: p.v2.0.0\n  replaces: p.v0.0.1\n  skips: [p.v0.0.2]\n- name: p.v3.0.0\n  replaces: p.v2.0.0\n  skips: [p.v1.0.0]\n- name: p.v0.5.0\n- name: p.v4.0.0\n  replaces: p.v3.0.0\n  skips: [p.v0.5.0]\n- name: p.v0.6.0\n";
    let mut text = format!("{PKG}{ch}");
    for v in ["1.0.0", "2.0.0", "3.0.0", "0.5.0", "4.0.0", "0.6.0"] {
        text.push_str(
            &BUNDLE
                .replace("p.v1.0.0", &format!("p.v{v}"))
                .replace("1.0.0}", &format!("{v}}}")),
        );
    }
    // p.v0.6.0 is neither on the replaces chain nor skipped: a second head.
    refused(
        &[("c.yaml", &text)],
        Rule::ChannelGraph,
        "c.yaml",
        2,
        "p.v0.6.0",
    );
    let text = text.replace(
        "- name: p.v0.6.0\n",
        "- name: p.v0.6.0\n  replaces: p.v4.0.0\n",
    );
    let dir = tempfile::tempdir().expect("tempdir");
    write(dir.path(), &[("c.yaml", &text)]);
    Catalog::load_dir(dir.path()).expect("skipped bundles are not stranded");

    // One head, but the replaces walk stops at a skipped bundle, so the
    // bundle below it is stranded (the rule opm v1.73 applies).
    let ch = "---\nschema: olm.channel\npackage: p\nname: stable\nentries:\n- name: p.v1.0.0\n- name: p.v2.0.0\n  replaces: p.v1.0.0\n- name: p.v3.0.0\n  replaces: p.v2.0.0\n  skips: [p.v2.0.0]\n";
    let mut text = format!("{PKG}{ch}");
    for v in ["1.0.0", "2.0.0", "3.0.0"] {
        text.push_str(
            &BUNDLE
                .replace("p.v1.0.0", &format!("p.v{v}"))
                .replace("1.0.0}", &format!("{v}}}")),
        );
    }
    refused(
        &[("c.yaml", &text)],
        Rule::ChannelGraph,
        "c.yaml",
        2,
        "stranded bundles",
    );
}

#[test]
fn replaces_cycle() {
    let ch = "---\nschema: olm.channel\npackage: p\nname: stable\nentries:\n- name: p.v1.0.0\n  replaces: p.v2.0.0\n- name: p.v2.0.0\n  replaces: p.v1.0.0\n";
    let b2 = BUNDLE
        .replace("p.v1.0.0", "p.v2.0.0")
        .replace("1.0.0}", "2.0.0}");
    refused(
        &[("c.yaml", &format!("{PKG}{ch}{BUNDLE}{b2}"))],
        Rule::ChannelGraph,
        "c.yaml",
        2,
        "no channel head",
    );
}

#[test]
fn bad_skip_range() {
    let ch = "---\nschema: olm.channel\npackage: p\nname: stable\nentries:\n- name: p.v1.0.0\n  skipRange: '>=1.0 <banana'\n";
    refused(
        &[("c.yaml", &format!("{PKG}{ch}{BUNDLE}"))],
        Rule::SkipRange,
        "c.yaml",
        2,
        "banana",
    );
}

#[test]
fn bad_version() {
    let b = BUNDLE.replace("version: 1.0.0", "version: v1");
    refused(
        &[("c.yaml", &format!("{PKG}{CHANNEL}{b}"))],
        Rule::Version,
        "c.yaml",
        3,
        "\"v1\"",
    );
}

#[test]
fn bundle_without_image_or_objects() {
    let b = BUNDLE.replace("image: quay.io/x/p:1", "image: \"\"");
    refused(
        &[("c.yaml", &format!("{PKG}{CHANNEL}{b}"))],
        Rule::BundleImage,
        "c.yaml",
        3,
        "no image",
    );
}

#[test]
fn duplicate_bundle_and_channel_and_entry() {
    refused(
        &[("c.yaml", &format!("{PKG}{CHANNEL}{BUNDLE}{BUNDLE}"))],
        Rule::DuplicateBundle,
        "c.yaml",
        4,
        "p.v1.0.0",
    );
    refused(
        &[("c.yaml", &format!("{PKG}{CHANNEL}{CHANNEL}{BUNDLE}"))],
        Rule::DuplicateChannel,
        "c.yaml",
        3,
        "stable",
    );
    let ch = format!("{CHANNEL}- name: p.v1.0.0\n");
    refused(
        &[("c.yaml", &format!("{PKG}{ch}{BUNDLE}"))],
        Rule::DuplicateEntry,
        "c.yaml",
        2,
        "twice",
    );
}

#[test]
fn bundle_in_no_channel() {
    let b2 = BUNDLE
        .replace("p.v1.0.0", "p.v2.0.0")
        .replace("1.0.0}", "2.0.0}");
    refused(
        &[("c.yaml", &format!("{PKG}{CHANNEL}{BUNDLE}{b2}"))],
        Rule::BundleNotInChannel,
        "c.yaml",
        4,
        "p.v2.0.0",
    );
}

#[test]
fn deprecation_of_unknown_bundle() {
    let d = "---\nschema: olm.deprecations\npackage: p\nentries:\n- reference: {schema: olm.bundle, name: p.v9}\n  message: gone\n";
    refused(
        &[("c.yaml", &format!("{PKG}{CHANNEL}{BUNDLE}{d}"))],
        Rule::Deprecation,
        "c.yaml",
        4,
        "p.v9",
    );
}

#[test]
fn server_binary_refuses_bad_catalog_and_never_serves() {
    let dir = tempfile::tempdir().expect("tempdir");
    write(
        dir.path(),
        &[
            ("a/catalog.yaml", &format!("{PKG}{CHANNEL}{BUNDLE}")),
            ("b/catalog.yaml", PKG),
        ],
    );
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("port");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_hcp-olm-catalog-server"))
        .arg("--catalog")
        .arg(dir.path())
        .arg("--listen")
        .arg(format!("127.0.0.1:{port}"))
        .output()
        .expect("run server");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(65), "stderr: {stderr}");
    assert!(
        stderr.contains("b/catalog.yaml: document 1"),
        "stderr: {stderr}"
    );
    assert!(
        stderr.contains("rule duplicate-package"),
        "stderr: {stderr}"
    );
}

#[test]
fn server_binary_flag_errors_exit_64() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_hcp-olm-catalog-server"))
        .args(["--catalog", "/nonexistent", "--listen", "not-an-address"])
        .output()
        .expect("run server");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(64), "stderr: {stderr}");
    assert!(stderr.contains("--listen"), "stderr: {stderr}");
}

/// Symlinks pointing back at an ancestor: the load ends at the first repetition with a read error
/// that says so. (Before walkdir the loader followed them 40 levels deep, until the kernel's
/// ELOOP, and reported "Too many levels of symbolic links" on a path like p/b/p/b/…/p/b.)
/// A symlink to a directory that is not an ancestor is followed as before.
#[test]
fn symlink_cycle_is_refused_not_walked() {
    let dir = tempfile::tempdir().expect("tempdir");
    write(
        dir.path(),
        &[("p/catalog.yaml", &format!("{PKG}{CHANNEL}{BUNDLE}"))],
    );
    std::os::unix::fs::symlink(".", dir.path().join("p/a")).expect("symlink");
    std::os::unix::fs::symlink("..", dir.path().join("p/b")).expect("symlink");
    let root = dir.path().to_path_buf();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(Catalog::load_dir(&root).map(|_| ()));
    });
    // generous: the load itself takes milliseconds; the old walk never ends
    let res = rx
        .recv_timeout(std::time::Duration::from_secs(30))
        .expect("loading a catalog with a symlink cycle did not finish within 30 s");
    let err = res.expect_err("a symlink cycle must be refused");
    let msg = err.to_string();
    assert_eq!(err.rule, Rule::Read, "wrong rule: {msg}");
    assert!(
        msg.contains("symlink loop"),
        "message does not say loop: {msg}"
    );
    assert!(msg.len() < 200, "message names a short path: {msg}");

    let ok = tempfile::tempdir().expect("tempdir");
    write(
        ok.path(),
        &[("real/p/catalog.yaml", &format!("{PKG}{CHANNEL}{BUNDLE}"))],
    );
    std::os::unix::fs::symlink(ok.path().join("real/p"), ok.path().join("linked"))
        .expect("symlink");
    let c = Catalog::load_dir(&ok.path().join("linked")).expect("a symlinked directory loads");
    assert_eq!(c.packages["p"].channels["stable"].head, "p.v1.0.0");
}
