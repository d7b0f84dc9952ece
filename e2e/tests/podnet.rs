//! The pod network: Service names resolve, ClusterIPs and NodePorts reach pods (hairpin
//! included), the host reaches pods and pods reach the host only through explicit forwarders,
//! and a linked guest site reaches the management node's NodePort but nothing routes back.

use std::net::{Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};

use hcp_olm_e2e::netns::Netns;
use hcp_olm_e2e::podnet::{self, PodNetwork, Protocol, ServiceEntry, ServicePort};

fn http_server(ns: &Netns, dir: &std::path::Path, port: u16) {
    std::fs::write(
        dir.join("index.html"),
        format!("hello from {}\n", ns.name()),
    )
    .unwrap();
    let mut cmd = ns.command("python3");
    cmd.args(["-m", "http.server", &port.to_string(), "--directory"])
        .arg(dir);
    ns.spawn("http", cmd).unwrap();
}

/// `curl` inside `ns`; Ok(body) or Err(stderr). Bounded by `--max-time`.
fn curl(ns: &Netns, url: &str) -> Result<String, String> {
    let out = ns
        .output(
            "curl",
            &["-sS", "--connect-timeout", "2", "--max-time", "4", url],
        )
        .unwrap();
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

fn eventually(what: &str, mut f: impl FnMut() -> Result<String, String>) -> String {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        match f() {
            Ok(v) => return v,
            Err(e) if Instant::now() >= deadline => panic!("{what}: {e}"),
            Err(_) => std::thread::sleep(Duration::from_millis(200)),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn services_dns_hairpin_and_host_forwarders() {
    let dir = tempfile::tempdir().unwrap();
    let net = PodNetwork::create("mgmt", [198, 18, 16], "cluster.local")
        .await
        .unwrap();
    let a = net.add_pod("pa", "hcp").unwrap();
    let b = net.add_pod("pb", "other").unwrap();
    http_server(&a.netns, dir.path(), 8000);
    net.set_services(&[ServiceEntry {
        namespace: "hcp".into(),
        name: "web".into(),
        cluster_ip: Some(Ipv4Addr::new(198, 19, 16, 10)),
        ports: vec![ServicePort {
            protocol: Protocol::Tcp,
            port: 80,
            node_port: None,
            endpoints: vec![(a.ip, 8000)],
        }],
    }])
    .unwrap();
    // full name from another namespace; short name (search path) from the Service's own
    let body = eventually("pod b → web.hcp.svc", || {
        curl(&b.netns, "http://web.hcp.svc.cluster.local/")
    });
    assert!(body.contains(&format!("hello from {}", a.netns.name())));
    eventually("pod a → web (hairpin, short name)", || {
        curl(&a.netns, "http://web/")
    });
    // unknown names under the cluster domain are NXDOMAIN, fast
    let err = curl(&b.netns, "http://nope.hcp.svc.cluster.local/").unwrap_err();
    assert!(err.contains("resolve"), "{err}");

    // host → pod, through a loopback forwarder into the network
    let local = net
        .forward_from_host(SocketAddr::new(a.ip.into(), 8000))
        .await
        .unwrap();
    let text = reqwest_like_get(local).await;
    assert!(text.contains("hello from"), "{text}");

    // pod → host, through a forwarder on the router's address
    let host = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let host_addr = host.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = host.accept().await {
            use tokio::io::AsyncWriteExt;
            let _ = s
                .write_all(
                    b"HTTP/1.1 200 OK\r\nContent-Length: 8\r\nConnection: close\r\n\r\nthe host",
                )
                .await;
        }
    });
    net.forward_to_host(6443, host_addr).await.unwrap();
    let gw = net.gateway();
    let body = tokio::task::spawn_blocking(move || curl(&b.netns, &format!("http://{gw}:6443/")))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(body, "the host");
}

async fn reqwest_like_get(addr: SocketAddr) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.write_all(b"GET / HTTP/1.0\r\n\r\n").await.unwrap();
    let mut out = String::new();
    tokio::time::timeout(Duration::from_secs(5), s.read_to_string(&mut out))
        .await
        .unwrap()
        .unwrap();
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn linked_guest_site_reaches_node_ports_only() {
    let dir = tempfile::tempdir().unwrap();
    let mgmt = PodNetwork::create("mgmt", [198, 18, 16], "cluster.local")
        .await
        .unwrap();
    let guest = PodNetwork::create("guest", [198, 18, 32], "cluster.local")
        .await
        .unwrap();
    podnet::link(&guest, &mgmt, [198, 18, 250]).unwrap();
    let gw_pod = mgmt.add_pod("pg", "hcp").unwrap();
    http_server(&gw_pod.netns, dir.path(), 8000);
    mgmt.set_services(&[ServiceEntry {
        namespace: "hcp".into(),
        name: "gateway".into(),
        cluster_ip: Some(Ipv4Addr::new(198, 19, 16, 20)),
        ports: vec![ServicePort {
            protocol: Protocol::Tcp,
            port: 80,
            node_port: Some(30080),
            endpoints: vec![(gw_pod.ip, 8000)],
        }],
    }])
    .unwrap();
    let agent = guest.add_pod("pag", "hcp-olm").unwrap();
    let node = mgmt.node_address();
    eventually("guest pod → management NodePort", || {
        curl(&agent.netns, &format!("http://{node}:30080/"))
    });
    // nothing else of the management network is reachable from the guest
    assert!(curl(&agent.netns, &format!("http://{}:8000/", gw_pod.ip)).is_err());
    assert!(curl(&agent.netns, "http://198.19.16.20:80/").is_err());
    // and the management side has no route into guest pods
    let guest_dir = tempfile::tempdir().unwrap();
    http_server(&agent.netns, guest_dir.path(), 8000);
    eventually("guest server up", || {
        curl(&agent.netns, "http://127.0.0.1:8000/")
    });
    let err = curl(&gw_pod.netns, &format!("http://{}:8000/", agent.ip)).unwrap_err();
    assert!(!err.is_empty());
}
