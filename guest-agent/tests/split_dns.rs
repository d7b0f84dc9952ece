//! Integration tests against real dnsmasq upstreams standing in for guest DNS and
//! management DNS. All traffic stays on 127.0.0.1.

mod common;

use std::time::{Duration, Instant};

use common::*;
use hcp_olm_guest_agent::server::metrics::{
    MalformedAction, MalformedLabels, OwnerLabel, UpstreamLabels, UpstreamResultLabel,
};
use hickory_proto::op::ResponseCode;
use hickory_proto::rr::{RData, RecordType};
use tokio::net::TcpStream;

const GUEST_SVC: &str = "cat.openshift-marketplace.svc.cluster.local.";
const HCP_SVC: &str = "cat.clusters-hc1.svc.cluster.local.";

/// Guest and management dnsmasq with deliberately overlapping names and different IPs,
/// so every answer tells which side produced it.
async fn upstreams(extra_guest: &[String]) -> (Dnsmasq, Dnsmasq) {
    let mut g = vec![
        "--local-ttl=1".to_string(),
        host("cat.openshift-marketplace.svc.cluster.local", "198.18.1.1"),
        host("cat.clusters-hc1.svc.cluster.local", "198.18.1.2"),
    ];
    g.extend_from_slice(extra_guest);
    let guest = Dnsmasq::start(&g).await;
    let local = Dnsmasq::start(&[
        "--local-ttl=1".to_string(),
        host("cat.openshift-marketplace.svc.cluster.local", "198.18.2.1"),
        host("cat.clusters-hc1.svc.cluster.local", "198.18.2.2"),
        host(
            "only-local.openshift-marketplace.svc.cluster.local",
            "198.18.2.3",
        ),
        host("registry.mgmt.example", "198.18.2.4"),
    ])
    .await;
    (guest, local)
}

#[tokio::test]
async fn names_resolve_on_the_side_that_owns_them() {
    let (guest, local) = upstreams(&[]).await;
    let s = start_server(&split_config(local.addr, guest.addr, "")).await;

    let m = udp(s.addr, GUEST_SVC, RecordType::A, None).await;
    assert_eq!(m.metadata.response_code, ResponseCode::NoError);
    assert_eq!(
        a_records(&m)[0].0,
        "198.18.1.1",
        "guest svc name must come from guest DNS"
    );

    let m = udp(s.addr, HCP_SVC, RecordType::A, None).await;
    assert_eq!(
        a_records(&m)[0].0,
        "198.18.2.2",
        "HCP namespace name must come from local DNS"
    );

    let m = udp(s.addr, "registry.mgmt.example.", RecordType::A, Some(1232)).await;
    assert_eq!(a_records(&m)[0].0, "198.18.2.4");
    assert_eq!(m.edns.as_ref().map(|e| e.max_payload()), Some(1232));
}

#[tokio::test]
async fn owner_nxdomain_is_final_not_retried_on_the_other_side() {
    let (guest, local) = upstreams(&[]).await;
    let s = start_server(&split_config(local.addr, guest.addr, "")).await;
    // Exists only in management DNS, but the guest owns *.svc.cluster.local outside the HCP
    // namespace: the guest's NXDOMAIN is the answer.
    let m = udp(
        s.addr,
        "only-local.openshift-marketplace.svc.cluster.local.",
        RecordType::A,
        None,
    )
    .await;
    assert_eq!(m.metadata.response_code, ResponseCode::NXDomain);
    assert!(m.answers.is_empty());
}

#[tokio::test]
async fn search_path_expansion_is_answered_without_forwarding() {
    // Upstreams that would answer REFUSED for anything: any forwarded query would not be
    // NXDOMAIN, so an NXDOMAIN proves the table answered.
    let guest = Dnsmasq::start(&["--local=/nothing.invalid/".to_string()]).await;
    let local = Dnsmasq::start(&[]).await;
    let s = start_server(&split_config(local.addr, guest.addr, "")).await;
    let name =
        "redhat-operators.openshift-marketplace.svc.cluster.local.clusters-hc1.svc.cluster.local.";
    let t = Instant::now();
    let m = udp(s.addr, name, RecordType::A, None).await;
    assert_eq!(m.metadata.response_code, ResponseCode::NXDomain);
    assert!(t.elapsed() < Duration::from_secs(1));
    let soa = m
        .authorities
        .iter()
        .any(|r| matches!(r.data, RData::SOA(_)));
    assert!(soa, "synthetic SOA for client negative caching");
}

#[tokio::test]
async fn tcp_queries_and_pipelining() {
    let (guest, local) = upstreams(&[]).await;
    let s = start_server(&split_config(local.addr, guest.addr, "")).await;
    let m = tcp(s.addr, GUEST_SVC, RecordType::A).await;
    assert_eq!(a_records(&m)[0].0, "198.18.1.1");

    // Three queries on one connection without waiting (RFC 7766 §6.2.1.1).
    let mut c = TcpStream::connect(s.addr).await.unwrap();
    let names = [GUEST_SVC, HCP_SVC, "registry.mgmt.example."];
    for (i, n) in names.iter().enumerate() {
        tcp_send(&mut c, &query(100 + i as u16, n, RecordType::A, None)).await;
    }
    let mut got = std::collections::HashMap::new();
    for _ in 0..3 {
        let m = tcp_recv(&mut c).await;
        got.insert(m.metadata.id, a_records(&m)[0].0.clone());
    }
    assert_eq!(got[&100], "198.18.1.1");
    assert_eq!(got[&101], "198.18.2.2");
    assert_eq!(got[&102], "198.18.2.4");
}

#[tokio::test]
async fn big_answer_truncated_over_udp_then_complete_over_tcp() {
    // 8 TXT records of 200 bytes: ~1.7 KB, more than 512 and more than our 1232 EDNS size,
    // so dnsmasq truncates to us too and we must retry it over TCP upstream.
    let txt: Vec<String> = (0..8)
        .map(|i| {
            format!(
                "--txt-record=big.openshift-marketplace.svc.cluster.local,{}",
                format!("{i}").repeat(200)
            )
        })
        .collect();
    let (guest, local) = upstreams(&txt).await;
    let s = start_server(&split_config(local.addr, guest.addr, "")).await;
    let name = "big.openshift-marketplace.svc.cluster.local.";

    let m = udp(s.addr, name, RecordType::TXT, None).await;
    assert!(
        m.metadata.truncation,
        "UDP answer over 512 bytes must set TC"
    );
    assert!(m.answers.is_empty());
    let m = udp(s.addr, name, RecordType::TXT, Some(4096)).await;
    assert!(m.metadata.truncation, "EDNS clients are capped at 1232");

    // The client retries over TCP, as a stub resolver does on TC.
    let m = tcp(s.addr, name, RecordType::TXT).await;
    assert!(!m.metadata.truncation);
    assert_eq!(m.answers.len(), 8);
    // dnsmasq truncated its UDP answer to us, so we must have retried upstream over TCP.
    let retried = s
        .server
        .metrics()
        .upstream
        .get_or_create(&UpstreamLabels {
            owner: OwnerLabel::guest,
            result: UpstreamResultLabel::truncated,
        })
        .get();
    assert!(retried >= 1);
}

#[tokio::test]
async fn upstream_killed_cached_names_answer_stale_unknown_fail_fast() {
    let (mut guest, local) = upstreams(&[]).await;
    let s = start_server(&split_config(local.addr, guest.addr, "")).await;
    let m = udp(s.addr, GUEST_SVC, RecordType::A, None).await;
    assert_eq!(a_records(&m), vec![("198.18.1.1".to_string(), 1)]);

    guest.kill();
    // Let the 1 s TTL expire so the next answer cannot be a fresh cache hit.
    tokio::time::sleep(Duration::from_millis(1100)).await;

    let m = udp(s.addr, GUEST_SVC, RecordType::A, None).await;
    assert_eq!(m.metadata.response_code, ResponseCode::NoError);
    assert_eq!(
        a_records(&m),
        vec![("198.18.1.1".to_string(), 30)],
        "stale answer, TTL 30"
    );

    // Unknown guest name: SERVFAIL, and fast (the port is closed, so the kernel reports
    // ECONNREFUSED at once). Bound: 1 s, below the 1.5 s upstream timeout.
    let t = Instant::now();
    let m = udp(
        s.addr,
        "unknown.openshift-marketplace.svc.cluster.local.",
        RecordType::A,
        None,
    )
    .await;
    assert_eq!(m.metadata.response_code, ResponseCode::ServFail);
    assert!(
        t.elapsed() < Duration::from_secs(1),
        "took {:?}",
        t.elapsed()
    );

    // The local side still works.
    let m = udp(s.addr, HCP_SVC, RecordType::A, None).await;
    assert_eq!(a_records(&m)[0].0, "198.18.2.2");
}

#[tokio::test]
async fn tunnel_blackhole_serves_stale_at_client_timer_then_fails_fast() {
    let (mut guest, local) = upstreams(&[]).await;
    let cfg = split_config(
        local.addr,
        guest.addr,
        "limits: { upstream_timeout_ms: 2000, client_timer_ms: 300, upstream_fail_threshold: 1, upstream_recheck_ms: 60000 }",
    );
    let s = start_server(&cfg).await;
    let m = udp(s.addr, GUEST_SVC, RecordType::A, None).await;
    assert_eq!(a_records(&m)[0].0, "198.18.1.1");

    // "Tunnel down": the guest address swallows packets (a bound socket that never answers).
    let port = guest.addr.port();
    guest.kill();
    let _blackhole = tokio::net::UdpSocket::bind(("127.0.0.1", port))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(1100)).await;

    // Stale answer when the 300 ms client timer fires, not after the 2 s upstream timeout.
    let t = Instant::now();
    let m = udp(s.addr, GUEST_SVC, RecordType::A, None).await;
    assert_eq!(a_records(&m), vec![("198.18.1.1".to_string(), 30)]);
    assert!(
        t.elapsed() < Duration::from_millis(1500),
        "took {:?}",
        t.elapsed()
    );

    // The background refresh times out and marks the guest upstream down.
    let deadline = Instant::now() + Duration::from_secs(5);
    while !s.engine().upstream_down(guest.addr) {
        assert!(
            Instant::now() < deadline,
            "guest upstream never marked down"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Unknown names now fail fast: SERVFAIL within 500 ms instead of the 2 s timeout.
    let t = Instant::now();
    let m = udp(
        s.addr,
        "new.openshift-marketplace.svc.cluster.local.",
        RecordType::A,
        None,
    )
    .await;
    assert_eq!(m.metadata.response_code, ResponseCode::ServFail);
    assert!(
        t.elapsed() < Duration::from_millis(500),
        "took {:?}",
        t.elapsed()
    );
}

#[tokio::test]
async fn malformed_datagrams_are_counted_and_do_not_stop_service() {
    let (guest, local) = upstreams(&[]).await;
    let s = start_server(&split_config(local.addr, guest.addr, "")).await;
    // Too short: dropped (no answer).
    let r = udp_query_raw(s.addr, &[1, 2, 3], Duration::from_millis(300))
        .await
        .unwrap();
    assert!(r.is_none());
    // Header + garbage: FORMERR with the same id.
    let r = udp_query_raw(
        s.addr,
        &[0xbe, 0xef, 1, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0xff, 0xff],
        Duration::from_secs(2),
    )
    .await
    .unwrap()
    .expect("FORMERR answer");
    assert_eq!(&r[..2], &[0xbe, 0xef]);
    assert_eq!(r[3] & 0x0f, 1, "rcode FORMERR");

    // Garbage on TCP closes that connection only.
    let mut c = TcpStream::connect(s.addr).await.unwrap();
    tokio::io::AsyncWriteExt::write_all(&mut c, &[0, 3, 1, 2, 3])
        .await
        .unwrap();

    let m = udp(s.addr, GUEST_SVC, RecordType::A, None).await;
    assert_eq!(a_records(&m)[0].0, "198.18.1.1");

    let count = |action| {
        s.server
            .metrics()
            .malformed
            .get_or_create(&MalformedLabels { action })
            .get()
    };
    let dropped = count(MalformedAction::dropped);
    let formerr = count(MalformedAction::formerr);
    assert!(dropped >= 2, "udp short + tcp short frame: {dropped}");
    assert!(formerr >= 1);
}

#[tokio::test]
async fn graceful_shutdown_drains() {
    let (guest, local) = upstreams(&[]).await;
    let s = start_server(&split_config(local.addr, guest.addr, "")).await;
    udp(s.addr, GUEST_SVC, RecordType::A, None).await;
    assert!(
        s.server.shutdown(Duration::from_secs(3)).await,
        "drained within 3 s"
    );
    // After shutdown nothing answers.
    let r = udp_query_raw(
        s.addr,
        &query(9, GUEST_SVC, RecordType::A, None),
        Duration::from_millis(300),
    )
    .await;
    assert!(!matches!(r, Ok(Some(_))), "answered after shutdown");
}

#[tokio::test]
async fn lookup_ip_for_connect_targets_follows_the_table() {
    let (guest, local) = upstreams(&[]).await;
    let s = start_server(&split_config(local.addr, guest.addr, "")).await;
    let ips = s
        .server
        .lookup_ip("cat.openshift-marketplace.svc.cluster.local")
        .await
        .unwrap();
    assert_eq!(ips, vec!["198.18.1.1".parse::<std::net::IpAddr>().unwrap()]);
    let ips = s
        .server
        .lookup_ip("cat.clusters-hc1.svc.cluster.local.")
        .await
        .unwrap();
    assert_eq!(ips, vec!["198.18.2.2".parse::<std::net::IpAddr>().unwrap()]);
    let err = s
        .server
        .lookup_ip("only-local.openshift-marketplace.svc.cluster.local")
        .await
        .unwrap_err();
    assert!(
        matches!(err, hcp_olm_guest_agent::server::LookupError::NxDomain(_)),
        "{err}"
    );
}

/// The UDP listener reads and answers in batches (`recvmmsg`/`sendmmsg`): waves of queries
/// from several clients at once, more than one batch each, are answered whole, each answer to
/// the client that asked, with its own id and the owner's record. A datagram longer than the
/// listener reads whole (4096 bytes) in the middle is dropped and counted as malformed, and
/// costs no other query its answer.
#[tokio::test]
async fn a_burst_from_many_clients_is_answered_whole_and_an_oversized_datagram_is_dropped() {
    const CLIENTS: u16 = 4;
    const PER_CLIENT: u16 = 50;
    // 4 × 10 = 40 queries at once: more than one 32-datagram batch, and far below the server
    // socket's default receive buffer, so the kernel drops none.
    const WAVE: u16 = 10;
    let (guest, local) = upstreams(&[]).await;
    let s = start_server(&split_config(local.addr, guest.addr, "")).await;
    // Cached first, so the queries are answered inline by the batch loop.
    udp(s.addr, GUEST_SVC, RecordType::A, None).await;
    udp(s.addr, HCP_SVC, RecordType::A, None).await;
    let dropped = || {
        s.server
            .metrics()
            .malformed
            .get_or_create(&MalformedLabels {
                action: MalformedAction::dropped,
            })
            .get()
    };
    let dropped_before = dropped();

    let mut clients = Vec::new();
    for _ in 0..CLIENTS {
        let c = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
        c.connect(s.addr).await.unwrap();
        clients.push(c);
    }
    for wave in 0..PER_CLIENT / WAVE {
        let ids = wave * WAVE..(wave + 1) * WAVE;
        for i in ids.clone() {
            for (k, c) in clients.iter().enumerate() {
                let id = k as u16 * 1000 + i;
                c.send(&query(id, name_of(id), RecordType::A, None))
                    .await
                    .unwrap();
            }
            if i == PER_CLIENT / 2 {
                // a valid header and question, then 5000 bytes of trailing junk
                let mut big = query(60_000, GUEST_SVC, RecordType::A, None);
                big.resize(5000, 0);
                clients[0].send(&big).await.unwrap();
            }
        }
        receive_wave(&clients, ids).await;
    }
    // nothing more arrives for the oversized one
    let mut buf = vec![0u8; 65_535];
    assert!(
        tokio::time::timeout(Duration::from_millis(300), clients[0].recv(&mut buf))
            .await
            .is_err(),
        "an answer beyond the queries"
    );
    assert_eq!(
        dropped(),
        dropped_before + 1,
        "the oversized datagram is counted"
    );
}

fn name_of(id: u16) -> &'static str {
    if id.is_multiple_of(2) {
        GUEST_SVC
    } else {
        HCP_SVC
    }
}

/// Every client's answers for the query indexes `range`: each id exactly once, NOERROR, the
/// owner's record.
async fn receive_wave(clients: &[tokio::net::UdpSocket], range: std::ops::Range<u16>) {
    for (k, c) in clients.iter().enumerate() {
        let mut want: std::collections::BTreeSet<u16> =
            range.clone().map(|i| k as u16 * 1000 + i).collect();
        let mut buf = vec![0u8; 65_535];
        while !want.is_empty() {
            let n = tokio::time::timeout(Duration::from_secs(5), c.recv(&mut buf))
                .await
                .unwrap_or_else(|_| panic!("client {k}: no answer for ids {want:?}"))
                .unwrap();
            let m = hickory_proto::op::Message::from_vec(&buf[..n]).unwrap();
            let id = m.metadata.id;
            assert_ne!(id, 60_000, "the oversized datagram was answered");
            assert!(
                want.remove(&id),
                "client {k}: unexpected or repeated id {id}"
            );
            assert_eq!(m.metadata.response_code, ResponseCode::NoError);
            let ip = if name_of(id) == GUEST_SVC {
                "198.18.1.1"
            } else {
                "198.18.2.2"
            };
            assert_eq!(a_records(&m)[0].0, ip, "id {id}");
        }
    }
}
