//! The `hcp-olm catalog` CLI against a catalog served by our server (run in
//! process on a loopback port), including several catalogs, JSON/YAML, an
//! HTTP CONNECT proxy, an unreachable address and a catalog that never answers.

use std::path::Path;
use std::process::{Command, Output};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

/// A fixture catalog (or file) of this repository's `fixtures/catalogs`.
fn fixture(name: &str) -> std::path::PathBuf {
    hcp_olm_e2e::tools::fixtures_dir()
        .join("catalogs")
        .join(name)
}

/// A catalog server on a background runtime; stops when dropped.
struct Served {
    addr: String,
    _stop: tokio::sync::oneshot::Sender<()>,
    _rt: tokio::runtime::Runtime,
}

fn serve(dir: &Path) -> Served {
    let catalog = hcp_olm_catalog::Catalog::load_dir(dir).expect("load catalog");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("rt");
    let listener = rt.block_on(TcpListener::bind("127.0.0.1:0")).expect("bind");
    let addr = listener.local_addr().expect("addr").to_string();
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    rt.spawn(hcp_olm_catalog::serve(listener, Arc::new(catalog), async {
        let _ = rx.await;
    }));
    Served {
        addr,
        _stop: tx,
        _rt: rt,
    }
}

fn hcp_olm(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_hcp-olm"))
        .args(args)
        .env_remove("HCP_OLM_CATALOG_ADDR")
        .env_remove("HCP_OLM_CATALOG_PROXY")
        .output()
        .expect("run hcp-olm")
}

fn ok(out: &Output) -> String {
    assert!(
        out.status.success(),
        "hcp-olm failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn stats() -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(fixture("STATS.json")).expect("STATS.json"))
        .expect("json")
}

#[test]
fn packages_table_lists_every_package() {
    let s = serve(&fixture("small"));
    let out = ok(&hcp_olm(&["catalog", "--addr", &s.addr, "packages"]));
    let lines: Vec<&str> = out.lines().collect();
    assert!(
        lines[0].starts_with("CATALOG") && lines[0].contains("DEFAULT CHANNEL"),
        "{out}"
    );
    let expected = stats()["small"]["packages"]
        .as_object()
        .expect("packages")
        .len();
    assert_eq!(lines.len() - 1, expected, "{out}");
    for l in &lines[1..] {
        assert!(l.starts_with(&s.addr), "{l}");
    }
    assert!(out.contains("tigera-operator"), "{out}");
}

#[test]
fn bundles_json_matches_fixture_counts() {
    let s = serve(&fixture("small"));
    let totals = &stats()["small"]["totals"];
    let out = ok(&hcp_olm(&[
        "catalog", "-a", &s.addr, "-o", "json", "bundles",
    ]));
    let rows: Vec<serde_json::Value> = serde_json::from_str(&out).expect("json output");
    let key = |r: &serde_json::Value, f: &str| {
        (
            r["package"].as_str().expect("package").to_string(),
            r[f].as_str().expect(f).to_string(),
        )
    };
    let bundles: std::collections::BTreeSet<_> = rows.iter().map(|r| key(r, "name")).collect();
    let channels: std::collections::BTreeSet<_> = rows.iter().map(|r| key(r, "channel")).collect();
    assert_eq!(
        bundles.len() as u64,
        totals["bundles"].as_u64().expect("bundles")
    );
    assert_eq!(
        channels.len() as u64,
        totals["channels"].as_u64().expect("channels")
    );

    let pkg = "tigera-operator";
    let out = ok(&hcp_olm(&[
        "catalog", "-a", &s.addr, "-o", "json", "bundles", pkg,
    ]));
    let rows: Vec<serde_json::Value> = serde_json::from_str(&out).expect("json output");
    let distinct: std::collections::BTreeSet<&str> = rows
        .iter()
        .map(|r| r["name"].as_str().expect("name"))
        .collect();
    assert_eq!(
        distinct.len() as u64,
        stats()["small"]["packages"][pkg]["bundles"]
            .as_u64()
            .expect("bundles")
    );
    assert!(rows.iter().all(|r| r["package"] == pkg));
}

#[test]
fn channels_yaml_and_upgrade_path() {
    let s = serve(&fixture("small"));
    let st = stats();
    let pkg = "tigera-operator";
    let want = &st["small"]["packages"][pkg];
    let out = ok(&hcp_olm(&[
        "catalog", "-a", &s.addr, "-o", "yaml", "channels", pkg,
    ]));
    let rows: Vec<serde_json::Value> = serde_yaml_ng::from_str(&out).expect("yaml output");
    let names: Vec<&str> = rows
        .iter()
        .map(|r| r["name"].as_str().expect("name"))
        .collect();
    let want_channels: Vec<&str> = want["channels"]
        .as_array()
        .expect("channels")
        .iter()
        .map(|c| c.as_str().expect("str"))
        .collect();
    assert_eq!(names.len(), want_channels.len(), "{out}");
    for c in &want_channels {
        assert!(names.contains(c), "{c} missing: {out}");
    }
    let default: Vec<&serde_json::Value> = rows.iter().filter(|r| r["default"] == true).collect();
    assert_eq!(default.len(), 1);
    assert_eq!(default[0]["name"], want["defaultChannel"]);

    // Upgrade path of the default channel ends at its head; each step replaces the previous one.
    let ch = want["defaultChannel"].as_str().expect("default");
    let head = default[0]["head"].as_str().expect("head").to_string();
    let out = ok(&hcp_olm(&[
        "catalog",
        "-a",
        &s.addr,
        "-o",
        "json",
        "upgrade-path",
        pkg,
        ch,
    ]));
    let steps: Vec<serde_json::Value> = serde_json::from_str(&out).expect("json");
    assert!(!steps.is_empty());
    assert_eq!(steps.last().expect("last")["name"], head.as_str());
    for w in steps.windows(2) {
        assert_eq!(w[1]["replaces"], w[0]["name"], "{out}");
    }
}

#[test]
fn search_by_name_and_gvk_over_two_catalogs() {
    let a = serve(&fixture("small"));
    let b = serve(&fixture("small"));
    let out = ok(&hcp_olm(&[
        "catalog", "-a", &a.addr, "-a", &b.addr, "-o", "json", "search", "--name", "tigera",
    ]));
    let rows: Vec<serde_json::Value> = serde_json::from_str(&out).expect("json");
    assert!(!rows.is_empty());
    assert!(rows.iter().all(|r| r["package"] == "tigera-operator"));
    let catalogs: std::collections::BTreeSet<&str> = rows
        .iter()
        .map(|r| r["catalog"].as_str().expect("catalog"))
        .collect();
    assert_eq!(catalogs.len(), 2, "both catalogs answer");

    // Pick a GVK a channel head provides and find it again by group/version/kind.
    let heads = ok(&hcp_olm(&[
        "catalog",
        "-a",
        &a.addr,
        "-o",
        "json",
        "bundles",
        "tigera-operator",
    ]));
    let rows: Vec<serde_json::Value> = serde_json::from_str(&heads).expect("json");
    let gvk = rows
        .iter()
        .flat_map(|r| r["provides"].as_array().expect("provides").iter())
        .map(|g| g.as_str().expect("gvk").to_string())
        .next()
        .expect("some provided api");
    let out = ok(&hcp_olm(&[
        "catalog", "-a", &a.addr, "search", "--gvk", &gvk,
    ]));
    assert!(out.contains("tigera-operator"), "{gvk}: {out}");
    let out = ok(&hcp_olm(&[
        "catalog",
        "-a",
        &a.addr,
        "search",
        "--gvk",
        "nothing.example.com/v1/Nope",
    ]));
    assert_eq!(out.lines().count(), 1, "header only: {out}");
}

#[test]
fn unreachable_address_fails_naming_it() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .expect("bind")
        .local_addr()
        .expect("addr")
        .port();
    // The listener is dropped: nothing listens there now.
    let addr = format!("127.0.0.1:{port}");
    let started = Instant::now();
    let out = hcp_olm(&["catalog", "-a", &addr, "--timeout", "3s", "packages"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains(&addr), "{err}");
    assert!(err.contains("unreachable"), "{err}");
    assert!(started.elapsed() < Duration::from_secs(30));
}

#[test]
fn silent_catalog_times_out_naming_it() {
    // Accepts TCP connections but never speaks HTTP/2.
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = l.local_addr().expect("addr").to_string();
    let held = std::thread::spawn(move || {
        let mut conns = Vec::new();
        l.set_nonblocking(true).expect("nonblocking");
        let until = Instant::now() + Duration::from_secs(20);
        while Instant::now() < until && conns.len() < 16 {
            if let Ok((c, _)) = l.accept() {
                conns.push(c);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    });
    let started = Instant::now();
    let out = hcp_olm(&["catalog", "-a", &addr, "--timeout", "1s", "packages"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains(&addr), "{err}");
    assert!(
        started.elapsed() < Duration::from_secs(15),
        "took {:?}",
        started.elapsed()
    );
    drop(held);
}

#[test]
fn bad_flags_exit_64() {
    let out = hcp_olm(&[
        "catalog",
        "--addr",
        "127.0.0.1:1",
        "--timeout",
        "soon",
        "packages",
    ]);
    assert_eq!(
        out.status.code(),
        Some(64),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = hcp_olm(&["catalog", "packages"]);
    assert_eq!(out.status.code(), Some(64));
}

#[test]
fn browses_through_http_connect_proxy() {
    let s = serve(&fixture("small"));
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("rt");
    let listener = rt.block_on(TcpListener::bind("127.0.0.1:0")).expect("bind");
    let proxy = listener.local_addr().expect("addr").to_string();
    let tunnels = Arc::new(AtomicUsize::new(0));
    let seen = Arc::clone(&tunnels);
    rt.spawn(async move {
        for _ in 0..16 {
            let Ok((c, _)) = listener.accept().await else {
                return;
            };
            tokio::spawn(connect_proxy_session(c, Arc::clone(&seen)));
        }
    });
    let out = ok(&hcp_olm(&[
        "catalog",
        "-a",
        &s.addr,
        "--proxy",
        &format!("http://{proxy}"),
        "packages",
    ]));
    assert!(out.contains("tigera-operator"), "{out}");
    assert!(
        tunnels.load(Ordering::SeqCst) >= 1,
        "no tunnel went through the proxy"
    );

    // A proxy that refuses the target: the error names the catalog.
    let out = hcp_olm(&[
        "catalog",
        "-a",
        "10.255.255.1:50051",
        "--proxy",
        &proxy,
        "--timeout",
        "3s",
        "packages",
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("10.255.255.1:50051"), "{err}");

    // The same proxy on a Unix socket (`unix:/path`, as Konnectivity's proxy-server offers).
    let dir = tempfile::tempdir().expect("tempdir");
    let sock = dir.path().join("proxy.sock");
    let ul = {
        let _g = rt.enter();
        tokio::net::UnixListener::bind(&sock).expect("bind unix")
    };
    let before = tunnels.load(Ordering::SeqCst);
    let seen = Arc::clone(&tunnels);
    rt.spawn(async move {
        for _ in 0..16 {
            let Ok((c, _)) = ul.accept().await else {
                return;
            };
            tokio::spawn(connect_proxy_session(c, Arc::clone(&seen)));
        }
    });
    let out = ok(&hcp_olm(&[
        "catalog",
        "-a",
        &s.addr,
        "--proxy",
        &format!("unix:{}", sock.display()),
        "packages",
    ]));
    assert!(out.contains("tigera-operator"), "{out}");
    assert!(
        tunnels.load(Ordering::SeqCst) > before,
        "no tunnel went through the Unix-socket proxy"
    );
}

/// A minimal CONNECT proxy session on `c`: loopback targets only, counted in `seen`.
async fn connect_proxy_session<S>(mut c: S, seen: Arc<AtomicUsize>)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    let mut head = Vec::new();
    let mut b = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") && head.len() < 4096 {
        if c.read(&mut b).await.unwrap_or(0) == 0 {
            return;
        }
        head.push(b[0]);
    }
    let text = String::from_utf8_lossy(&head).into_owned();
    let target = text
        .split_whitespace()
        .nth(1)
        .unwrap_or_default()
        .to_string();
    // Loopback targets only.
    if !text.starts_with("CONNECT ") || !target.starts_with("127.0.0.1:") {
        let _ = c.write_all(b"HTTP/1.1 403 Forbidden\r\n\r\n").await;
        return;
    }
    let Ok(mut up) = tokio::net::TcpStream::connect(&target).await else {
        let _ = c.write_all(b"HTTP/1.1 502 Bad Gateway\r\n\r\n").await;
        return;
    };
    seen.fetch_add(1, Ordering::SeqCst);
    let _ = c
        .write_all(b"HTTP/1.1 200 Connection established\r\n\r\n")
        .await;
    let _ = tokio::io::copy_bidirectional(&mut c, &mut up).await;
}

#[test]
fn probe_reports_latency_and_fails_when_the_catalog_goes_away() {
    let s = serve(&fixture("small"));
    let out = ok(&hcp_olm(&[
        "catalog",
        "-a",
        &s.addr,
        "-o",
        "json",
        "probe",
        "--count",
        "5",
        "--interval",
        "10ms",
    ]));
    let rows: serde_json::Value = serde_json::from_str(&out).expect("json");
    assert_eq!(rows[0]["calls"], 5, "{out}");
    assert_eq!(rows[0]["failures"], 0, "{out}");
    assert!(rows[0]["max_ms"].as_f64().unwrap() > 0.0, "{out}");

    // The server stops while the probe runs: the probe counts failures and exits 1.
    let child = Command::new(env!("CARGO_BIN_EXE_hcp-olm"))
        .args([
            "catalog",
            "-a",
            &s.addr,
            "--timeout",
            "1s",
            "probe",
            "--count",
            "20",
            "--interval",
            "100ms",
        ])
        .env_remove("HCP_OLM_CATALOG_PROXY")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn");
    std::thread::sleep(Duration::from_millis(700));
    drop(s);
    let out = child.wait_with_output().expect("wait");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("calls failed"), "{err}");
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(table.starts_with("CATALOG"), "{table}");

    let out = hcp_olm(&["catalog", "-a", "127.0.0.1:1", "probe", "--count", "0"]);
    assert_eq!(out.status.code(), Some(64));
}

/// A catalog whose strings carry terminal escapes (OSC window title, clear screen, colour,
/// the 8-bit CSI, carriage return, newline, a bidi override), served by our real server.
fn hostile_catalog() -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("tempdir");
    let pkg = "evil\u{1b}]0;pwned\u{7}";
    let ch = "stable\u{1b}[2J";
    let bundle = "evil.v1.0.0\u{1b}[31m\u{9b}1m";
    let msg = "deprecated\u{1b}]0;owned\u{7}\u{1b}[2J\r\nfake row\u{202e}gnp.exe";
    let docs = [
        serde_json::json!({"schema": "olm.package", "name": pkg, "defaultChannel": ch,
            "description": "desc \u{1b}]0;title\u{7}\u{1b}[2J"}),
        serde_json::json!({"schema": "olm.channel", "name": ch, "package": pkg,
            "entries": [{"name": bundle}]}),
        serde_json::json!({"schema": "olm.bundle", "name": bundle, "package": pkg,
            "image": "quay.io/evil/evil:v1",
            "properties": [{"type": "olm.package", "value": {"packageName": pkg, "version": "1.0.0"}}]}),
        serde_json::json!({"schema": "olm.deprecations", "package": pkg,
            "entries": [{"reference": {"schema": "olm.package"}, "message": msg}]}),
    ];
    let text: String = docs.iter().map(|d| format!("{d}\n")).collect();
    std::fs::write(dir.path().join("catalog.json"), text).expect("write catalog");
    dir
}

/// What a terminal would act on: any control character but the newlines of the format,
/// or a bidi override.
fn terminal_controls(s: &str) -> Vec<char> {
    s.chars()
        .filter(|c| (c.is_control() && *c != '\n') || ('\u{202a}'..='\u{202e}').contains(c))
        .collect()
}

#[test]
fn security_catalog_strings_reach_the_terminal_without_control_characters() {
    let dir = hostile_catalog();
    let s = serve(dir.path());
    let channels = ["channels", "evil\u{1b}]0;pwned\u{7}"];
    for (output, cmd) in [
        ("table", &["packages"][..]),
        ("json", &["packages"][..]),
        ("yaml", &["packages"][..]),
        ("table", &channels[..]),
        ("table", &["bundles"][..]),
        ("json", &["bundles"][..]),
        ("yaml", &["bundles"][..]),
    ] {
        let args = (output, cmd);
        let mut all = vec!["catalog", "-a", &s.addr, "-o", output];
        all.extend_from_slice(cmd);
        let out = hcp_olm(&all);
        let text = ok(&out);
        let bad = terminal_controls(&text);
        assert!(
            bad.is_empty(),
            "{args:?}: control characters {bad:?} reach the terminal:\n{text:?}"
        );
        // The visible text is kept.
        assert!(text.contains("pwned"), "{args:?}: {text}");
        if output == "table" {
            // Table: a header and exactly one row per package/channel/bundle.
            assert_eq!(text.lines().count(), 2, "{args:?}: {text:?}");
        }
    }
}

#[test]
fn security_catalog_answer_size_and_total_time_are_bounded() {
    let s = serve(&fixture("small"));
    // Size: the small catalog's bundles are far more than 4 KiB of answers.
    let out = hcp_olm(&[
        "catalog",
        "-a",
        &s.addr,
        "--max-answer-bytes",
        "4KiB",
        "bundles",
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("--max-answer-bytes"), "{err}");
    assert!(err.contains(&s.addr), "{err}");
    assert!(out.stdout.is_empty(), "partial output: {:?}", out.stdout);
    ok(&hcp_olm(&["catalog", "-a", &s.addr, "bundles"]));

    // Time: a catalog that trickles its answers (stand-in: a relay in front of the real
    // server passing at most 64 bytes of answer every 20 ms). Every call answers within
    // --timeout, the whole command cannot.
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("rt");
    let relay = rt.block_on(TcpListener::bind("127.0.0.1:0")).expect("bind");
    let relay_addr = relay.local_addr().expect("addr").to_string();
    let target = s.addr.clone();
    rt.spawn(async move {
        for _ in 0..64 {
            let Ok((mut c, _)) = relay.accept().await else {
                return;
            };
            let target = target.clone();
            tokio::spawn(async move {
                let Ok(u) = tokio::net::TcpStream::connect(&target).await else {
                    return;
                };
                let (mut ur, mut uw) = u.into_split();
                let (mut cr, mut cw) = c.split();
                let up = tokio::io::copy(&mut cr, &mut uw);
                let down = async {
                    let mut buf = [0u8; 64];
                    let until = Instant::now() + Duration::from_secs(60);
                    while Instant::now() < until {
                        let n = ur.read(&mut buf).await?;
                        if n == 0 {
                            break;
                        }
                        cw.write_all(&buf[..n]).await?;
                        tokio::time::sleep(Duration::from_millis(20)).await;
                    }
                    std::io::Result::Ok(())
                };
                let _ = tokio::join!(up, down);
            });
        }
    });
    let started = Instant::now();
    let out = hcp_olm(&[
        "catalog",
        "-a",
        &relay_addr,
        "--timeout",
        "10s",
        "--total-timeout",
        "3s",
        "bundles",
    ]);
    let took = started.elapsed();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("--total-timeout"), "{err}");
    assert!(err.contains(&relay_addr), "{err}");
    assert!(took < Duration::from_secs(10), "took {took:?}");
    assert!(out.stdout.is_empty(), "partial output");
}
