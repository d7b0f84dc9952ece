//! Tier 3 plumbing: network namespaces joined by veth, with per-namespace resolv.conf.
//! Needs root, iproute2, python3 and dnsmasq (installed by `.ci/run`).

use std::time::{Duration, Instant};

use anyhow::{Result, bail, ensure};
use hcp_olm_e2e::netns::{Netns, connect};

/// Waits until `ns` has something listening on TCP `port`.
fn wait_listening(ns: &Netns, port: u16, bound: Duration) -> Result<()> {
    let start = Instant::now();
    loop {
        let out = ns.output("ss", &["-Hltn", &format!("sport = :{port}")])?;
        if String::from_utf8_lossy(&out.stdout).contains(&format!(":{port}")) {
            return Ok(());
        }
        ensure!(
            start.elapsed() < bound,
            "nothing listening on {port} in {} after {bound:?}",
            ns.name()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn namespaces_reach_each_other_over_veth_and_nothing_else() -> Result<()> {
    let a = Netns::create("a")?;
    let b = Netns::create("b")?;
    let c = Netns::create("c")?;
    connect(&a, "198.18.0.1/30", &b, "198.18.0.2/30")?;

    // A TCP echo server in b.
    let mut server = b.command("python3");
    server.args([
        "-c",
        "import socket\ns=socket.socket()\ns.setsockopt(socket.SOL_SOCKET,socket.SO_REUSEADDR,1)\n\
         s.bind(('198.18.0.2',7000))\ns.listen()\n\
         while True:\n c,_=s.accept()\n c.sendall(b'echo:'+c.recv(100))\n c.close()",
    ]);
    let _srv = b.spawn("echo", server)?;
    wait_listening(&b, 7000, Duration::from_secs(10))?;

    let client = "import socket,sys\ns=socket.create_connection((sys.argv[1],7000),timeout=3)\n\
                  s.sendall(b'ping')\nprint(s.recv(100).decode())";
    let out = a.output("python3", &["-c", client, "198.18.0.2"])?;
    ensure!(
        out.status.success(),
        "a -> b failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "echo:ping");

    // c has no link to b: the same connection fails (no route).
    let out = c.output("python3", &["-c", client, "198.18.0.2"])?;
    ensure!(!out.status.success(), "c must not reach b");
    Ok(())
}

#[test]
fn a_process_in_a_namespace_uses_that_namespace_resolv_conf() -> Result<()> {
    let client = Netns::create("r")?;
    let dns = Netns::create("d")?;
    connect(&client, "198.18.1.1/30", &dns, "198.18.1.2/30")?;

    // A real DNS server in `dns` answering one test zone.
    let mut cmd = dns.command("dnsmasq");
    cmd.args([
        "--no-daemon",
        "--conf-file=/dev/null",
        "--no-resolv",
        "--no-hosts",
        "--bind-interfaces",
        "--listen-address=198.18.1.2",
        "--port=53",
        "--address=/svc.hcp-olm.test/198.18.9.9",
        "--pid-file=",
    ]);
    let _dnsmasq = dns.spawn("dnsmasq", cmd)?;
    wait_listening(&dns, 53, Duration::from_secs(10))?;

    client.set_resolv_conf("nameserver 198.18.1.2\noptions timeout:1 attempts:1\n")?;
    let out = client.output("getent", &["ahostsv4", "catalog.svc.hcp-olm.test"])?;
    let text = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() || !text.contains("198.18.9.9") {
        bail!(
            "resolution through the namespace resolv.conf failed: status {:?}, stdout {text}",
            out.status
        );
    }
    // The dns namespace has no resolv.conf of its own: it sees the host's, which does not know
    // the test zone (and cannot reach any resolver from inside the namespace).
    let out = dns.output("getent", &["ahostsv4", "catalog.svc.hcp-olm.test"])?;
    ensure!(!String::from_utf8_lossy(&out.stdout).contains("198.18.9.9"));
    Ok(())
}

#[test]
fn teardown_kills_processes_and_deletes_the_namespace() -> Result<()> {
    let ns = Netns::create("t")?;
    let name = ns.name().to_string();
    let mut cmd = ns.command("sleep");
    cmd.arg("600");
    let p = ns.spawn("sleeper", cmd)?;
    let pid = p.pid();
    ns.set_resolv_conf("nameserver 198.18.0.53\n")?;
    drop(p); // a clone is kept by the namespace
    ensure!(
        std::path::Path::new(&format!("/proc/{pid}")).exists(),
        "still running while ns lives"
    );
    drop(ns);
    ensure!(
        !std::path::Path::new(&format!("/proc/{pid}")).exists(),
        "process {pid} survived"
    );
    let list = std::process::Command::new("ip")
        .args(["netns", "list"])
        .output()?;
    ensure!(
        !String::from_utf8_lossy(&list.stdout).contains(&name),
        "namespace {name} left behind"
    );
    ensure!(
        !std::path::Path::new(&format!("/etc/netns/{name}")).exists(),
        "/etc/netns/{name} left behind"
    );
    Ok(())
}
