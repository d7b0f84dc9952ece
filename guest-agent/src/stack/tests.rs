use super::*;

fn cfg(addr: &str, any_ip: bool, accept: AcceptPolicy) -> StackConfig {
    StackConfig {
        addresses: vec![(addr.parse().unwrap(), 30)],
        any_ip,
        mtu: 1420,
        accept,
        dial_first: None,
    }
}

/// Two stacks wired back to back (no WireGuard): A (100.127.255.1 and fd9c:…::1) dials; B
/// (.2, ::2; dual stack) accepts in any-IP mode connections to `allowed`. Returns A, B, B's accepted connections and the
/// largest packet seen on the wire.
fn wired_pair(
    allowed: SocketAddr,
    cancel: &CancellationToken,
) -> (Stack, Stack, mpsc::Receiver<TcpConn>, Arc<AtomicU64>) {
    wired_pair_with(allowed, None, cancel)
}

fn wired_pair_with(
    allowed: SocketAddr,
    dial_first: Option<mpsc::Sender<(SocketAddr, SocketAddr)>>,
    cancel: &CancellationToken,
) -> (Stack, Stack, mpsc::Receiver<TcpConn>, Arc<AtomicU64>) {
    let (a_out, mut wire_a) = mpsc::channel::<Vec<u8>>(1024);
    let (b_out, mut wire_b) = mpsc::channel::<Vec<u8>>(1024);
    let (to_a, a_in) = mpsc::channel::<Vec<u8>>(1024);
    let (to_b, b_in) = mpsc::channel::<Vec<u8>>(1024);
    let max_len = Arc::new(AtomicU64::new(0));
    let m1 = Arc::clone(&max_len);
    tokio::spawn(async move {
        while let Some(p) = wire_a.recv().await {
            m1.fetch_max(p.len() as u64, Ordering::Relaxed);
            let _ = to_b.send(p).await;
        }
    });
    let m2 = Arc::clone(&max_len);
    tokio::spawn(async move {
        while let Some(p) = wire_b.recv().await {
            m2.fetch_max(p.len() as u64, Ordering::Relaxed);
            let _ = to_a.send(p).await;
        }
    });
    let mut a_cfg = cfg("100.127.255.1", false, Arc::new(|_, _| false));
    a_cfg
        .addresses
        .push(("fd9c:4f1e:7a2b:ffff::1".parse().unwrap(), 126));
    let (a, _a_acc) = spawn(a_cfg, a_in, a_out, cancel.clone());
    let mut b_cfg = cfg(
        "100.127.255.2",
        true,
        Arc::new(move |dst, _| dst == allowed),
    );
    b_cfg
        .addresses
        .push(("fd9c:4f1e:7a2b:ffff::2".parse().unwrap(), 126));
    b_cfg.dial_first = dial_first;
    let (b, b_acc) = spawn(b_cfg, b_in, b_out, cancel.clone());
    (a, b, b_acc, max_len)
}

/// A dials, B accepts in any-IP mode when the policy allows, packets larger than the MTU
/// never appear.
#[tokio::test]
async fn connect_accept_echo_and_refuse() {
    let cancel = CancellationToken::new();
    let allowed: SocketAddr = "198.18.9.9:50051".parse().unwrap();
    let (a, b, mut b_acc, max_len) = wired_pair(allowed, &cancel);
    // Echo server on B's accepted connections.
    tokio::spawn(async move {
        while let Some(mut c) = b_acc.recv().await {
            assert_eq!(c.local, allowed);
            tokio::spawn(async move {
                while let Some(d) = c.rx.recv().await {
                    c.notify.notify_one();
                    if c.tx.send(d).await.is_err() {
                        break;
                    }
                    c.notify.notify_one();
                }
            });
        }
    });
    let mut c = tokio::time::timeout(Duration::from_secs(5), a.connect(allowed))
        .await
        .unwrap()
        .unwrap();
    let payload: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
    let p2 = payload.clone();
    let tx = c.tx.clone();
    let n = Arc::clone(&c.notify);
    let writer = tokio::spawn(async move {
        for chunk in p2.chunks(10_000) {
            tx.send(Bytes::copy_from_slice(chunk)).await.unwrap();
            n.notify_one();
        }
    });
    let mut got = Vec::new();
    while got.len() < payload.len() {
        let d = tokio::time::timeout(Duration::from_secs(10), c.rx.recv())
            .await
            .unwrap()
            .unwrap();
        c.notify.notify_one();
        got.extend_from_slice(&d);
    }
    writer.await.unwrap();
    assert_eq!(got, payload);
    assert!(max_len.load(Ordering::Relaxed) <= 1420);
    assert!(
        max_len.load(Ordering::Relaxed) > 1000,
        "segments use the MSS"
    );
    // Not allowed: refused (RST), counted on B.
    let e = tokio::time::timeout(
        Duration::from_secs(5),
        a.connect("198.18.9.9:22".parse().unwrap()),
    )
    .await
    .unwrap()
    .unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::ConnectionRefused);
    assert_eq!(b.counters.tcp_refused.load(Ordering::Relaxed), 1);
    assert_eq!(b.counters.tcp_accepted.load(Ordering::Relaxed), 1);
    cancel.cancel();
}

/// IPv6 inside: A dials an IPv6 guest address from its IPv6 tunnel address, B accepts it in
/// any-IP mode and answers from that address; a port the policy refuses gets a reset. The
/// largest packet stays within the MTU (IPv6 headers are 20 bytes longer).
#[tokio::test]
async fn ipv6_connect_accept_and_refuse_in_any_ip_mode() {
    let cancel = CancellationToken::new();
    let allowed: SocketAddr = "[fd00:52::10]:50051".parse().unwrap();
    let (a, b, mut b_acc, max_len) = wired_pair(allowed, &cancel);
    tokio::spawn(async move {
        while let Some(mut c) = b_acc.recv().await {
            assert_eq!(c.local, allowed);
            assert_eq!(
                c.remote.ip(),
                "fd9c:4f1e:7a2b:ffff::1".parse::<IpAddr>().unwrap()
            );
            tokio::spawn(async move {
                while let Some(d) = c.recv().await {
                    if c.send(d).await.is_err() {
                        break;
                    }
                }
            });
        }
    });
    let mut c = tokio::time::timeout(Duration::from_secs(5), a.connect(allowed))
        .await
        .unwrap()
        .unwrap();
    let payload = Bytes::from(vec![6u8; 100_000]);
    c.send(payload.clone()).await.unwrap();
    let mut got = 0;
    while got < payload.len() {
        got += tokio::time::timeout(Duration::from_secs(10), c.recv())
            .await
            .unwrap()
            .unwrap()
            .len();
    }
    assert_eq!(got, payload.len());
    assert!(max_len.load(Ordering::Relaxed) <= 1420);
    let e = tokio::time::timeout(
        Duration::from_secs(5),
        a.connect("[fd00:52::10]:22".parse().unwrap()),
    )
    .await
    .unwrap()
    .unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::ConnectionRefused);
    assert_eq!(b.counters.tcp_refused.load(Ordering::Relaxed), 1);
    cancel.cancel();
}

#[test]
fn syn_parse() {
    assert_eq!(syn_of(&[]), None);
    assert_eq!(syn_of(&[0x45; 30]), None);
}

/// The accepting side pushes a large answer at once (a catalog's ListBundles): all of it
/// arrives, the window reopening as the reader drains (no call may wait 30 s; the time and the
/// longest gap between reads are printed, not asserted).
#[tokio::test]
async fn bulk_push_from_the_accepting_side_arrives_whole() {
    let cancel = CancellationToken::new();
    let allowed: SocketAddr = "198.18.9.9:50051".parse().unwrap();
    let (a, _b, mut b_acc, _) = wired_pair(allowed, &cancel);
    const TOTAL: usize = 4 << 20;
    tokio::spawn(async move {
        let c = b_acc.recv().await.unwrap();
        let chunk = Bytes::from(vec![7u8; 64 * 1024]);
        for _ in 0..TOTAL / chunk.len() {
            if c.send(chunk.clone()).await.is_err() {
                return;
            }
        }
        drop(c);
    });
    let mut c = a.connect(allowed).await.unwrap();
    let t = std::time::Instant::now();
    let mut got = 0usize;
    let mut gaps = Vec::new();
    let mut last = std::time::Instant::now();
    while let Some(d) = tokio::time::timeout(Duration::from_secs(30), c.recv())
        .await
        .unwrap()
    {
        got += d.len();
        gaps.push(last.elapsed());
        last = std::time::Instant::now();
    }
    let worst = gaps.iter().max().copied().unwrap_or_default();
    eprintln!(
        "bulk: {got} bytes in {:?}, worst gap {worst:?}",
        t.elapsed()
    );
    assert_eq!(got, TOTAL);
    cancel.cancel();
}

/// Dial first: B holds A's SYN until told; a refused dial resets A's connect (a refusal,
/// not an accepted connection that then closes), an answered one completes it. The SYN's
/// retransmissions while held are not shown twice.
#[tokio::test]
async fn dial_first_holds_the_syn_until_the_dial_answers() {
    let cancel = CancellationToken::new();
    let allowed: SocketAddr = "198.18.9.9:50051".parse().unwrap();
    let (dials_tx, mut dials) = mpsc::channel(8);
    let (a, b, mut b_acc, _) = wired_pair_with(allowed, Some(dials_tx), &cancel);
    // refused
    let a2 = a.clone();
    let refused = tokio::spawn(async move { a2.connect(allowed).await });
    let (src, dst) = tokio::time::timeout(Duration::from_secs(5), dials.recv())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(dst, allowed);
    // while held, nothing is accepted and no second request comes for retransmissions
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(b_acc.try_recv().is_err());
    assert!(
        dials.try_recv().is_err(),
        "a retransmitted SYN was shown again"
    );
    b.dial_done(src, dst, false).await.unwrap();
    let r = tokio::time::timeout(Duration::from_secs(5), refused)
        .await
        .unwrap()
        .unwrap();
    assert!(
        r.is_err(),
        "connect succeeded although the destination refused"
    );
    // answered
    let a3 = a.clone();
    let ok = tokio::spawn(async move { a3.connect(allowed).await });
    let (src, dst) = tokio::time::timeout(Duration::from_secs(5), dials.recv())
        .await
        .unwrap()
        .unwrap();
    b.dial_done(src, dst, true).await.unwrap();
    let c = tokio::time::timeout(Duration::from_secs(5), ok)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    let accepted = tokio::time::timeout(Duration::from_secs(5), b_acc.recv())
        .await
        .unwrap()
        .unwrap();
    assert_eq!((accepted.remote, accepted.local), (c.local, c.remote));
    cancel.cancel();
}
