//! Pure unit tests for the engine: no sockets, time passed in.

use std::net::{Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};

use hickory_proto::op::{Edns, Message, MessageType, OpCode, Query, ResponseCode};
use hickory_proto::rr::rdata::{A, SOA};
use hickory_proto::rr::{DNSClass, Name, RData, Record, RecordType};

use super::config::DnsConfigSpec;
use super::engine::*;
use super::table::Owner;

const LOCAL: &str = "127.0.0.1:1053";
const GUEST: &str = "127.0.0.2:2053";

fn engine() -> Engine {
    let yaml = r#"
cluster_domain: cluster.local
upstreams:
  local: ["127.0.0.1:1053"]
  guest: ["127.0.0.2:2053"]
rules:
  - { suffix: svc.cluster.local, owner: guest }
  - { suffix: svc.cluster.local, namespace: clusters-hc1, owner: local }
  - { suffix: cluster.local, owner: local }
  - { suffix: blocked.test, owner: refuse }
  - { suffix: ".", owner: local }
cache: { max_entries: 1000, min_ttl: 0, max_ttl: 3600, max_negative_ttl: 1800, max_stale: 3600, failure_ttl: 5 }
limits: { upstream_fail_threshold: 2, upstream_recheck_ms: 5000 }
"#;
    let spec: DnsConfigSpec = serde_yaml_ng::from_str(yaml).unwrap();
    Engine::new(spec.validate().unwrap())
}

fn n(s: &str) -> Name {
    Name::from_ascii(s).unwrap()
}

fn query_bytes(id: u16, name: &str, rtype: RecordType, edns: Option<u16>) -> Vec<u8> {
    let mut m = Message::new(id, MessageType::Query, OpCode::Query);
    m.metadata.recursion_desired = true;
    m.add_query(Query::query(n(name), rtype));
    if let Some(p) = edns {
        let mut e = Edns::new();
        e.set_max_payload(p);
        m.set_edns(e);
    }
    m.to_vec().unwrap()
}

fn forward(a: Action) -> Forward {
    match a {
        Action::Forward(f) => f,
        other => panic!("expected Forward, got {other:?}"),
    }
}

fn reply(a: Action) -> Reply {
    match a {
        Action::Reply(r) => r,
        other => panic!("expected Reply, got {other:?}"),
    }
}

fn parse(r: &Reply) -> Message {
    Message::from_vec(&r.bytes).unwrap()
}

fn soa(ttl: u32, minimum: u32) -> Record {
    Record::from_rdata(
        n("cluster.local."),
        ttl,
        RData::SOA(SOA::new(
            n("ns.dns.cluster.local."),
            n("hostmaster.cluster.local."),
            1,
            7200,
            1800,
            86400,
            minimum,
        )),
    )
}

/// An upstream answer to `q` as the upstream would send it.
fn upstream_answer(
    q: &PendingQuery,
    txid: u16,
    rcode: ResponseCode,
    answers: Vec<Record>,
    authorities: Vec<Record>,
) -> Vec<u8> {
    let mut m = Message::response(txid, OpCode::Query);
    m.metadata.response_code = rcode;
    m.add_query(Query::query(q.key.name.clone(), q.key.rtype));
    m.answers = answers;
    m.authorities = authorities;
    m.to_vec().unwrap()
}

fn a_rec(name: &str, ttl: u32, last: u8) -> Record {
    Record::from_rdata(n(name), ttl, RData::A(A(Ipv4Addr::new(198, 18, 0, last))))
}

/// Drive one forward through check_upstream_reply + complete.
fn answer(
    e: &Engine,
    f: &Forward,
    bytes_for: impl Fn(&PendingQuery, u16) -> Vec<u8>,
    now: Instant,
) -> Reply {
    let txid = 0x4242;
    let up = bytes_for(&f.query, txid);
    match e.check_upstream_reply(&f.query, txid, &up, Transport::Udp, true) {
        UpstreamVerdict::Answer(m) => e.complete(&f.query, *m, now),
        other => panic!("expected Answer, got {other:?}"),
    }
}

#[test]
fn guest_service_forwards_to_guest_and_hcp_namespace_to_local() {
    let e = engine();
    let t = Instant::now();
    let f = forward(e.handle_query(
        &query_bytes(
            1,
            "redhat-operators.openshift-marketplace.svc.cluster.local.",
            RecordType::A,
            None,
        ),
        Transport::Udp,
        t,
    ));
    assert_eq!(f.query.owner, Owner::Guest);
    assert_eq!(f.upstreams, vec![GUEST.parse::<SocketAddr>().unwrap()]);

    let f = forward(e.handle_query(
        &query_bytes(
            2,
            "redhat-operators.clusters-hc1.svc.cluster.local.",
            RecordType::A,
            None,
        ),
        Transport::Udp,
        t,
    ));
    assert_eq!(f.query.owner, Owner::Local);
    assert_eq!(f.upstreams, vec![LOCAL.parse::<SocketAddr>().unwrap()]);

    let f = forward(e.handle_query(
        &query_bytes(3, "quay.io.", RecordType::AAAA, None),
        Transport::Tcp,
        t,
    ));
    assert_eq!(f.query.owner, Owner::Local);
}

#[test]
fn owner_nxdomain_is_final_and_negatively_cached_with_soa_ttl() {
    let e = engine();
    let t0 = Instant::now();
    let name = "missing.openshift-marketplace.svc.cluster.local.";
    let f = forward(e.handle_query(
        &query_bytes(7, name, RecordType::A, None),
        Transport::Udp,
        t0,
    ));
    let r = answer(
        &e,
        &f,
        |q, id| upstream_answer(q, id, ResponseCode::NXDomain, vec![], vec![soa(60, 10)]),
        t0,
    );
    assert_eq!(r.outcome.rcode, ResponseCode::NXDomain);
    assert_eq!(r.outcome.source, Source::Upstream);
    let m = parse(&r);
    assert_eq!(m.metadata.id, 7);
    assert_eq!(m.metadata.response_code, ResponseCode::NXDomain);
    assert_eq!(m.authorities.len(), 1, "SOA is passed to the client");

    // Within min(SOA TTL 60, MINIMUM 10): answered from cache, not forwarded.
    let r = reply(e.handle_query(
        &query_bytes(8, name, RecordType::A, None),
        Transport::Udp,
        t0 + Duration::from_secs(9),
    ));
    assert_eq!(r.outcome.source, Source::Cache);
    assert_eq!(r.outcome.rcode, ResponseCode::NXDomain);
    assert_eq!(parse(&r).authorities[0].ttl, 1);
    // After 10 s: forwarded again (to the same owner only).
    let f = forward(e.handle_query(
        &query_bytes(9, name, RecordType::A, None),
        Transport::Udp,
        t0 + Duration::from_secs(10),
    ));
    assert_eq!(f.query.owner, Owner::Guest);
    assert_eq!(f.upstreams.len(), 1);
}

#[test]
fn positive_cache_counts_down_ttl_and_is_case_insensitive_but_preserves_case() {
    let e = engine();
    let t0 = Instant::now();
    let name = "cat.openshift-marketplace.svc.cluster.local.";
    let f = forward(e.handle_query(
        &query_bytes(1, name, RecordType::A, None),
        Transport::Udp,
        t0,
    ));
    answer(
        &e,
        &f,
        |q, id| {
            upstream_answer(
                q,
                id,
                ResponseCode::NoError,
                vec![a_rec(name, 30, 1)],
                vec![],
            )
        },
        t0,
    );
    let r = reply(e.handle_query(
        &query_bytes(
            2,
            "CAT.openshift-marketplace.svc.cluster.local.",
            RecordType::A,
            None,
        ),
        Transport::Udp,
        t0 + Duration::from_secs(12),
    ));
    assert_eq!(r.outcome.source, Source::Cache);
    let m = parse(&r);
    assert_eq!(m.answers[0].ttl, 18);
    assert_eq!(
        m.queries[0].name().to_ascii(),
        "CAT.openshift-marketplace.svc.cluster.local."
    );
    // Other type is a different key.
    forward(e.handle_query(
        &query_bytes(3, name, RecordType::AAAA, None),
        Transport::Udp,
        t0,
    ));
}

#[test]
fn serve_stale_after_expiry_when_owner_fails_and_servfail_for_unknown() {
    let e = engine();
    let t0 = Instant::now();
    let name = "cat.openshift-marketplace.svc.cluster.local.";
    let f = forward(e.handle_query(
        &query_bytes(1, name, RecordType::A, None),
        Transport::Udp,
        t0,
    ));
    answer(
        &e,
        &f,
        |q, id| {
            upstream_answer(
                q,
                id,
                ResponseCode::NoError,
                vec![a_rec(name, 5, 9)],
                vec![],
            )
        },
        t0,
    );

    let t1 = t0 + Duration::from_secs(100);
    let f = forward(e.handle_query(
        &query_bytes(2, name, RecordType::A, None),
        Transport::Udp,
        t1,
    ));
    // Client timer fires before the upstream answers.
    let stale = e.stale_reply(&f.query, t1).expect("stale available");
    assert_eq!(stale.outcome.source, Source::Stale);
    let m = parse(&stale);
    assert_eq!(m.answers[0].ttl, 30);
    assert_eq!(m.metadata.id, 2);
    // Upstream finally fails: still stale.
    let r = e.fail(&f.query, t1);
    assert_eq!(r.outcome.source, Source::Stale);
    assert_eq!(r.outcome.rcode, ResponseCode::NoError);

    // Unknown name: SERVFAIL.
    let f = forward(e.handle_query(
        &query_bytes(
            3,
            "new.openshift-marketplace.svc.cluster.local.",
            RecordType::A,
            None,
        ),
        Transport::Udp,
        t1,
    ));
    assert!(e.stale_reply(&f.query, t1).is_none());
    let r = e.fail(&f.query, t1);
    assert_eq!(r.outcome.rcode, ResponseCode::ServFail);
    // The failure is remembered (RFC 9520): answered at once without forwarding.
    let r = reply(e.handle_query(
        &query_bytes(
            4,
            "new.openshift-marketplace.svc.cluster.local.",
            RecordType::A,
            None,
        ),
        Transport::Udp,
        t1 + Duration::from_secs(1),
    ));
    assert_eq!(r.outcome.rcode, ResponseCode::ServFail);

    // Past max_stale (3600 s after expiry) nothing stale remains.
    let t2 = t0 + Duration::from_secs(5 + 3600);
    let f = forward(e.handle_query(
        &query_bytes(5, name, RecordType::A, None),
        Transport::Udp,
        t2,
    ));
    assert!(e.stale_reply(&f.query, t2).is_none());
}

#[test]
fn owner_down_fails_fast_then_probes() {
    let e = engine();
    let t0 = Instant::now();
    let guest: SocketAddr = GUEST.parse().unwrap();
    let cached = "cat.openshift-marketplace.svc.cluster.local.";
    let f = forward(e.handle_query(
        &query_bytes(1, cached, RecordType::A, None),
        Transport::Udp,
        t0,
    ));
    answer(
        &e,
        &f,
        |q, id| {
            upstream_answer(
                q,
                id,
                ResponseCode::NoError,
                vec![a_rec(cached, 1, 9)],
                vec![],
            )
        },
        t0,
    );

    e.record_upstream(guest, false, t0);
    assert!(!e.upstream_down(guest));
    e.record_upstream(guest, false, t0);
    assert!(e.upstream_down(guest));

    let t1 = t0 + Duration::from_secs(2);
    let r = reply(e.handle_query(
        &query_bytes(
            2,
            "x.openshift-marketplace.svc.cluster.local.",
            RecordType::A,
            None,
        ),
        Transport::Udp,
        t1,
    ));
    assert_eq!(r.outcome.rcode, ResponseCode::ServFail);
    let r = reply(e.handle_query(
        &query_bytes(3, cached, RecordType::A, None),
        Transport::Udp,
        t1,
    ));
    assert_eq!(r.outcome.source, Source::Stale);
    // The local owner is unaffected.
    forward(e.handle_query(
        &query_bytes(4, "x.clusters-hc1.svc.cluster.local.", RecordType::A, None),
        Transport::Udp,
        t1,
    ));

    // After the recheck interval exactly one probe goes through.
    let t2 = t0 + Duration::from_secs(6);
    forward(e.handle_query(
        &query_bytes(
            5,
            "y.openshift-marketplace.svc.cluster.local.",
            RecordType::A,
            None,
        ),
        Transport::Udp,
        t2,
    ));
    let r = reply(e.handle_query(
        &query_bytes(
            6,
            "z.openshift-marketplace.svc.cluster.local.",
            RecordType::A,
            None,
        ),
        Transport::Udp,
        t2,
    ));
    assert_eq!(r.outcome.rcode, ResponseCode::ServFail);
    // The probe succeeded: healthy again.
    e.record_upstream(guest, true, t2);
    forward(e.handle_query(
        &query_bytes(
            7,
            "z.openshift-marketplace.svc.cluster.local.",
            RecordType::A,
            None,
        ),
        Transport::Udp,
        t2,
    ));
}

fn big_answer_engine_run(transport: Transport, edns: Option<u16>) -> (Reply, Message) {
    let e = engine();
    let t0 = Instant::now();
    let name = "big.openshift-marketplace.svc.cluster.local.";
    let f = forward(e.handle_query(&query_bytes(1, name, RecordType::A, edns), transport, t0));
    let answers: Vec<Record> = (0..100).map(|i| a_rec(name, 60, i)).collect();
    let r = answer(
        &e,
        &f,
        |q, id| upstream_answer(q, id, ResponseCode::NoError, answers.clone(), vec![]),
        t0,
    );
    let m = parse(&r);
    (r, m)
}

#[test]
fn udp_without_edns_truncates_at_512() {
    let (r, m) = big_answer_engine_run(Transport::Udp, None);
    assert!(r.bytes.len() <= 512);
    assert!(r.outcome.truncated);
    assert!(m.metadata.truncation);
    assert!(m.answers.is_empty());
    assert_eq!(m.queries.len(), 1);
    assert!(m.edns.is_none(), "no OPT to a client that sent none");
}

#[test]
fn udp_with_edns_is_capped_at_1232_and_advertises_1232() {
    // 100 A records with compression ~ 1.6 KB: more than 1232 even if the client offers 4096.
    let (r, m) = big_answer_engine_run(Transport::Udp, Some(4096));
    assert!(r.bytes.len() <= 1232);
    assert!(m.metadata.truncation);
    assert_eq!(m.edns.as_ref().map(|e| e.max_payload()), Some(1232));
}

#[test]
fn tcp_gets_the_whole_answer() {
    let (r, m) = big_answer_engine_run(Transport::Tcp, None);
    assert!(!r.outcome.truncated);
    assert!(!m.metadata.truncation);
    assert_eq!(m.answers.len(), 100);
    assert!(r.bytes.len() > 1232);
}

#[test]
fn small_edns_payload_below_512_is_treated_as_512() {
    let e = engine();
    let t0 = Instant::now();
    let name = "mid.openshift-marketplace.svc.cluster.local.";
    // The client says 200 (invalid, < 512): RFC 6891 says treat as 512.
    let f = forward(e.handle_query(
        &query_bytes(1, name, RecordType::A, Some(200)),
        Transport::Udp,
        t0,
    ));
    assert_eq!(f.query.edns.map(|x| x.payload), Some(512));
}

#[test]
fn client_opt_is_not_forwarded_upstream() {
    let e = engine();
    let f = forward(e.handle_query(
        &query_bytes(
            1,
            "Mixed.Case.svc.cluster.local.",
            RecordType::A,
            Some(4096),
        ),
        Transport::Udp,
        Instant::now(),
    ));
    let up = Message::from_vec(&e.upstream_query(&f.query, 99, true)).unwrap();
    assert_eq!(up.metadata.id, 99);
    assert!(up.metadata.recursion_desired);
    assert_eq!(up.edns.as_ref().unwrap().max_payload(), 1232);
    assert_eq!(
        up.queries[0].name().to_ascii(),
        "mixed.case.svc.cluster.local."
    );
    let up = Message::from_vec(&e.upstream_query(&f.query, 99, false)).unwrap();
    assert!(up.edns.is_none());
}

#[test]
fn upstream_reply_checks() {
    let e = engine();
    let f = forward(e.handle_query(
        &query_bytes(1, "a.b.svc.cluster.local.", RecordType::A, None),
        Transport::Udp,
        Instant::now(),
    ));
    let q = &f.query;
    let ok = upstream_answer(
        q,
        5,
        ResponseCode::NoError,
        vec![a_rec("a.b.svc.cluster.local.", 5, 1)],
        vec![],
    );
    assert!(matches!(
        e.check_upstream_reply(q, 5, &ok, Transport::Udp, true),
        UpstreamVerdict::Answer(_)
    ));
    // Wrong txid.
    assert!(matches!(
        e.check_upstream_reply(q, 6, &ok, Transport::Udp, true),
        UpstreamVerdict::Mismatch
    ));
    // Wrong question.
    let mut other = q.clone();
    other.key.name = n("other.b.svc.cluster.local.");
    let wrong = upstream_answer(&other, 5, ResponseCode::NoError, vec![], vec![]);
    assert!(matches!(
        e.check_upstream_reply(q, 5, &wrong, Transport::Udp, true),
        UpstreamVerdict::Mismatch
    ));
    // Garbage.
    assert!(matches!(
        e.check_upstream_reply(q, 5, &[1, 2, 3], Transport::Udp, true),
        UpstreamVerdict::Mismatch
    ));
    // A query (QR=0) echoed back.
    let echoed = e.upstream_query(q, 5, true);
    assert!(matches!(
        e.check_upstream_reply(q, 5, &echoed, Transport::Udp, true),
        UpstreamVerdict::Mismatch
    ));
    // SERVFAIL / REFUSED: try next upstream of the same owner.
    let sf = upstream_answer(q, 5, ResponseCode::ServFail, vec![], vec![]);
    assert!(matches!(
        e.check_upstream_reply(q, 5, &sf, Transport::Udp, true),
        UpstreamVerdict::ServerFailure(ResponseCode::ServFail)
    ));
    // FORMERR to our EDNS query: retry without.
    let fe = upstream_answer(q, 5, ResponseCode::FormErr, vec![], vec![]);
    assert!(matches!(
        e.check_upstream_reply(q, 5, &fe, Transport::Udp, true),
        UpstreamVerdict::RetryWithoutEdns
    ));
    assert!(matches!(
        e.check_upstream_reply(q, 5, &fe, Transport::Udp, false),
        UpstreamVerdict::ServerFailure(_)
    ));
    // Truncated over UDP: retry TCP.
    let mut m = Message::from_vec(&ok).unwrap();
    m.metadata.truncation = true;
    let tc = m.to_vec().unwrap();
    assert!(matches!(
        e.check_upstream_reply(q, 5, &tc, Transport::Udp, true),
        UpstreamVerdict::Truncated
    ));
    assert!(matches!(
        e.check_upstream_reply(q, 5, &tc, Transport::Tcp, true),
        UpstreamVerdict::ServerFailure(_)
    ));
}

#[test]
fn search_path_expansions_answered_nxdomain_without_forwarding() {
    let e = engine();
    let t = Instant::now();
    for name in [
        "foo.bar.svc.cluster.local.clusters-hc1.svc.cluster.local.",
        "foo.bar.svc.cluster.local.svc.cluster.local.",
        "foo.bar.svc.cluster.local.cluster.local.",
        "example.com.cluster.local.",
        "a.b.c.ns.svc.cluster.local.",
        "a.b.ns.pod.cluster.local.",
    ] {
        let r = reply(e.handle_query(
            &query_bytes(1, name, RecordType::A, None),
            Transport::Udp,
            t,
        ));
        assert_eq!(r.outcome.rcode, ResponseCode::NXDomain, "{name}");
        assert_eq!(r.outcome.source, Source::Table, "{name}");
        let m = parse(&r);
        assert_eq!(m.authorities.len(), 1, "synthetic SOA for negative caching");
    }
    for name in [
        "foo.bar.svc.cluster.local.",
        "host.foo.bar.svc.cluster.local.",
        "_grpc._tcp.foo.bar.svc.cluster.local.",
        "bar.svc.cluster.local.",
        "dns-version.cluster.local.",
        "10-0-0-1.ns.pod.cluster.local.",
        "example.com.",
        // Two labels before the namespace may be `<hostname>.<subdomain>`: not provable.
        "example.com.clusters-hc1.svc.cluster.local.",
    ] {
        forward(e.handle_query(
            &query_bytes(1, name, RecordType::A, None),
            Transport::Udp,
            t,
        ));
    }
}

#[test]
fn refuse_rule_and_non_in_class_are_refused() {
    let e = engine();
    let t = Instant::now();
    let r = reply(e.handle_query(
        &query_bytes(1, "x.blocked.test.", RecordType::A, None),
        Transport::Udp,
        t,
    ));
    assert_eq!(r.outcome.rcode, ResponseCode::Refused);
    assert_eq!(r.outcome.owner, Some(Owner::Refuse));
    let mut m = Message::new(2, MessageType::Query, OpCode::Query);
    let mut q = Query::query(n("version.bind."), RecordType::TXT);
    q.query_class = DNSClass::CH;
    m.add_query(q);
    let r = reply(e.handle_query(&m.to_vec().unwrap(), Transport::Udp, t));
    assert_eq!(r.outcome.rcode, ResponseCode::Refused);
}

#[test]
fn malformed_input_dropped_or_formerr() {
    let e = engine();
    let t = Instant::now();
    // Too short for a header: dropped.
    assert!(matches!(
        e.handle_query(&[], Transport::Udp, t),
        Action::Drop
    ));
    assert!(matches!(
        e.handle_query(&[0xab; 11], Transport::Udp, t),
        Action::Drop
    ));
    // A response (QR=1): dropped.
    let mut resp = query_bytes(1, "a.svc.cluster.local.", RecordType::A, None);
    resp[2] |= 0x80;
    assert!(matches!(
        e.handle_query(&resp, Transport::Udp, t),
        Action::Drop
    ));
    // Header claiming one question but no body: FORMERR with the same id.
    let mut trunc = vec![0x12, 0x34, 0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0];
    let r = reply(e.handle_query(&trunc, Transport::Udp, t));
    assert_eq!(r.outcome.rcode, ResponseCode::FormErr);
    let m = parse(&r);
    assert_eq!(m.metadata.id, 0x1234);
    assert_eq!(m.metadata.message_type, MessageType::Response);
    assert_eq!(m.metadata.response_code, ResponseCode::FormErr);
    // Label pointing forward/looping compression pointer.
    trunc.extend_from_slice(&[0xc0, 0x0c, 0, 1, 0, 1]);
    let r = reply(e.handle_query(&trunc, Transport::Udp, t));
    assert_eq!(r.outcome.rcode, ResponseCode::FormErr);
    // Zero questions.
    let zero = [0, 9, 0x01, 0, 0, 0, 0, 0, 0, 0, 0, 0];
    assert_eq!(
        reply(e.handle_query(&zero, Transport::Udp, t))
            .outcome
            .rcode,
        ResponseCode::FormErr
    );
    // Two questions.
    let mut m = Message::new(3, MessageType::Query, OpCode::Query);
    m.add_query(Query::query(n("a.svc.cluster.local."), RecordType::A));
    m.add_query(Query::query(n("b.svc.cluster.local."), RecordType::A));
    assert_eq!(
        reply(e.handle_query(&m.to_vec().unwrap(), Transport::Udp, t))
            .outcome
            .rcode,
        ResponseCode::FormErr
    );
    // Two OPT records (RFC 6891 §6.1.1).
    let mut two_opt = query_bytes(4, "a.svc.cluster.local.", RecordType::A, Some(1232));
    let opt = [0u8, 0, 41, 4, 0xd0, 0, 0, 0, 0, 0, 0];
    two_opt.extend_from_slice(&opt);
    two_opt[11] = 2;
    assert_eq!(
        reply(e.handle_query(&two_opt, Transport::Udp, t))
            .outcome
            .rcode,
        ResponseCode::FormErr
    );
    // Non-query opcode (NOTIFY = 4): NOTIMP.
    let mut notify = query_bytes(5, "a.svc.cluster.local.", RecordType::SOA, None);
    notify[2] = (notify[2] & 0x87) | (4 << 3);
    assert_eq!(
        reply(e.handle_query(&notify, Transport::Udp, t))
            .outcome
            .rcode,
        ResponseCode::NotImp
    );
    // EDNS version 1: BADVERS.
    let mut m = Message::new(6, MessageType::Query, OpCode::Query);
    m.add_query(Query::query(n("a.svc.cluster.local."), RecordType::A));
    let mut ed = Edns::new();
    ed.set_version(1);
    m.set_edns(ed);
    let r = reply(e.handle_query(&m.to_vec().unwrap(), Transport::Udp, t));
    assert_eq!(r.outcome.rcode, ResponseCode::BADVERS);
    // 16 is shared by BADVERS and BADSIG; compare the number.
    assert_eq!(u16::from(parse(&r).metadata.response_code), 16);
}

#[test]
fn random_garbage_never_panics() {
    // Deterministic xorshift so failures reproduce.
    let e = engine();
    let t = Instant::now();
    let mut s: u64 = 0x9e37_79b9_7f4a_7c15;
    let base = query_bytes(1, "a.b.svc.cluster.local.", RecordType::A, Some(1232));
    for i in 0..20_000 {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        let mut buf = base.clone();
        if i % 2 == 0 {
            // Mutate a valid query.
            let pos = (s as usize) % buf.len();
            buf[pos] = (s >> 32) as u8;
            buf.truncate(((s >> 40) as usize) % (base.len() + 1));
        } else {
            let len = (s as usize) % 64;
            buf = (0..len).map(|k| (s >> (k % 56)) as u8).collect();
        }
        let _ = e.handle_query(&buf, Transport::Udp, t);
        let _ = e.handle_query(&buf, Transport::Tcp, t);
    }
}

#[test]
fn config_errors_name_the_field() {
    let cases = [
        (
            "upstreams: {local: [nope]}\nrules: [{suffix: '.', owner: local}]",
            "upstreams.local[0]",
        ),
        ("upstreams: {}\nrules: []", "rules"),
        (
            "upstreams: {}\nrules: [{suffix: '.', owner: guest}]",
            "rules[0].owner",
        ),
        (
            "upstreams: {local: ['127.0.0.1']}\nrules: [{suffix: 'svc.cluster.local', namespace: 'Bad_NS', owner: local}]",
            "rules[0].namespace",
        ),
        (
            "upstreams: {local: ['127.0.0.1']}\nrules: [{suffix: 'a.', owner: local}, {suffix: 'A', owner: local}]",
            "rules[1]",
        ),
        (
            "upstreams: {local: ['127.0.0.1']}\nrules: [{suffix: '.', owner: local}]\nlimits: {edns_udp_size: 100}",
            "limits.edns_udp_size",
        ),
        (
            "upstreams: {local: ['127.0.0.1']}\nrules: [{suffix: '.', owner: local}]\ncache: {min_ttl: 10, max_ttl: 5}",
            "cache.min_ttl",
        ),
    ];
    for (yaml, field) in cases {
        let spec: DnsConfigSpec = serde_yaml_ng::from_str(yaml).unwrap();
        let err = spec.validate().unwrap_err();
        assert_eq!(err.field, field, "{yaml}");
    }
    // Bare IP means port 53.
    let spec: DnsConfigSpec = serde_yaml_ng::from_str(
        "upstreams: {local: ['127.0.0.9']}\nrules: [{suffix: '.', owner: local}]",
    )
    .unwrap();
    assert_eq!(spec.validate().unwrap().local_upstreams[0].port(), 53);
}

#[test]
fn repeated_identical_queries_reuse_reply_but_patch_id_and_ttl() {
    let e = engine();
    let t0 = Instant::now();
    let name = "memo.openshift-marketplace.svc.cluster.local.";
    let f = forward(e.handle_query(
        &query_bytes(1, name, RecordType::A, Some(1232)),
        Transport::Udp,
        t0,
    ));
    answer(
        &e,
        &f,
        |q, id| {
            upstream_answer(
                q,
                id,
                ResponseCode::NoError,
                vec![a_rec(name, 30, 1)],
                vec![],
            )
        },
        t0,
    );
    let at = |id: u16, secs: u64, millis: u64| {
        let r = reply(e.handle_query(
            &query_bytes(id, name, RecordType::A, Some(1232)),
            Transport::Udp,
            t0 + Duration::from_secs(secs) + Duration::from_millis(millis),
        ));
        assert_eq!(r.outcome.source, Source::Cache);
        let m = parse(&r);
        assert_eq!(m.metadata.id, id);
        (m.answers[0].ttl, m.edns.is_some(), r.bytes)
    };
    let (ttl_a, edns_a, bytes_a) = at(10, 2, 0);
    let (ttl_b, edns_b, bytes_b) = at(11, 2, 500);
    assert_eq!((ttl_a, ttl_b), (28, 28));
    assert!(edns_a && edns_b);
    assert_eq!(bytes_a[2..], bytes_b[2..]);
    let (ttl_c, _, _) = at(12, 3, 0);
    assert_eq!(ttl_c, 27);
    // Same bytes over TCP are a different memo (different size limit), and still correct.
    let r = reply(e.handle_query(
        &query_bytes(13, name, RecordType::A, Some(1232)),
        Transport::Tcp,
        t0 + Duration::from_secs(3),
    ));
    assert_eq!(parse(&r).metadata.id, 13);
    // A newer entry replaces the memoized one: the new data is served, not the memo.
    let f2 = Forward {
        query: f.query.clone(),
        upstreams: f.upstreams.clone(),
    };
    answer(
        &e,
        &f2,
        |q, id| {
            upstream_answer(
                q,
                id,
                ResponseCode::NoError,
                vec![a_rec(name, 30, 2)],
                vec![],
            )
        },
        t0 + Duration::from_secs(3),
    );
    let r = reply(e.handle_query(
        &query_bytes(14, name, RecordType::A, Some(1232)),
        Transport::Udp,
        t0 + Duration::from_secs(3),
    ));
    match &parse(&r).answers[0].data {
        RData::A(a) => assert_eq!(a.0, Ipv4Addr::new(198, 18, 0, 2)),
        other => panic!("{other:?}"),
    }
    // Expired: not served from the memo.
    forward(e.handle_query(
        &query_bytes(15, name, RecordType::A, Some(1232)),
        Transport::Udp,
        t0 + Duration::from_secs(40),
    ));
}

// Issue 19: reverse zones of the guest ranges.

#[test]
fn reverse_zones_on_and_between_boundaries() {
    use super::reverse::reverse_zones;
    let z = |s: &str| {
        let (a, p) = s.split_once('/').unwrap();
        reverse_zones(a.parse().unwrap(), p.parse().unwrap())
    };
    assert_eq!(z("172.30.0.0/16"), ["30.172.in-addr.arpa"]);
    assert_eq!(z("198.18.52.7/32"), ["7.52.18.198.in-addr.arpa"]);
    assert_eq!(z("198.18.52.0/24"), ["52.18.198.in-addr.arpa"]);
    // /12: the 16 /16 zones 96..=111 (host bits ignored)
    let v = z("10.100.1.2/12");
    assert_eq!(v.len(), 16);
    assert_eq!(v[0], "96.10.in-addr.arpa");
    assert_eq!(v[15], "111.10.in-addr.arpa");
    // the bound: at most 2^7 zones for IPv4, 2^3 for IPv6
    assert_eq!(z("10.0.0.0/9").len(), 128);
    assert_eq!(z("10.128.0.0/14").len(), 4);
    assert_eq!(z("fd00::/8"), ["d.f.ip6.arpa"]);
    assert_eq!(
        z("fd00:52::/64"),
        ["0.0.0.0.0.0.0.0.2.5.0.0.0.0.d.f.ip6.arpa"]
    );
    // /62: the four /64 zones
    assert_eq!(
        z("fd00:10:96::/62"),
        [
            "0.0.0.0.6.9.0.0.0.1.0.0.0.0.d.f.ip6.arpa",
            "1.0.0.0.6.9.0.0.0.1.0.0.0.0.d.f.ip6.arpa",
            "2.0.0.0.6.9.0.0.0.1.0.0.0.0.d.f.ip6.arpa",
            "3.0.0.0.6.9.0.0.0.1.0.0.0.0.d.f.ip6.arpa",
        ]
    );
    assert_eq!(z("fd00:10:96::/125").len(), 8);
    assert_eq!(z("fd00:10:96::/108").len(), 1);
    assert_eq!(z("fd00:10:96::/105").len(), 8);
    assert_eq!(z("fd00::a/128")[0].split('.').count(), 34);
    assert!(z("fd00::a/128")[0].starts_with("a.0.0.0."));
    // /0 (refused by validation, but the function stands alone): the family's root zone,
    // no overflow (the IPv6 case shifted by 128 and panicked in debug builds)
    assert_eq!(z("::/0"), ["ip6.arpa"]);
    assert_eq!(z("0.0.0.0/0"), ["in-addr.arpa"]);
}

/// An engine with the gateway's default split plus the guest ranges' reverse zones.
fn engine_with_reverse_zones(ranges: &[&str]) -> Engine {
    use super::reverse::reverse_zones;
    let mut rules = String::from(
        "  - { suffix: svc.cluster.local, owner: guest }\n  - { suffix: svc.cluster.local, namespace: clusters-hc1, owner: local }\n  - { suffix: \".\", owner: local }\n",
    );
    for r in ranges {
        let (a, p) = r.split_once('/').unwrap();
        for zone in reverse_zones(a.parse().unwrap(), p.parse().unwrap()) {
            rules.push_str(&format!("  - {{ suffix: \"{zone}\", owner: guest }}\n"));
        }
    }
    let yaml = format!(
        "cluster_domain: cluster.local\nupstreams:\n  local: [\"{LOCAL}\"]\n  guest: [\"{GUEST}\"]\nrules:\n{rules}"
    );
    let spec: DnsConfigSpec = serde_yaml_ng::from_str(&yaml).unwrap();
    Engine::new(spec.validate().unwrap())
}

#[test]
fn ptr_names_of_guest_ranges_go_to_the_guest_and_others_stay_local() {
    let e = engine_with_reverse_zones(&["10.96.0.0/12", "fd00:10:96::/112"]);
    let t = Instant::now();
    let owner = |name: &str| {
        forward(e.handle_query(
            &query_bytes(7, name, RecordType::PTR, None),
            Transport::Udp,
            t,
        ))
        .query
        .owner
    };
    assert_eq!(owner("10.0.100.10.in-addr.arpa."), Owner::Guest);
    assert_eq!(owner("1.0.111.10.in-addr.arpa."), Owner::Guest);
    assert_eq!(owner("1.0.112.10.in-addr.arpa."), Owner::Local);
    assert_eq!(owner("10.0.30.172.in-addr.arpa."), Owner::Local);
    assert_eq!(
        owner("a.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.6.9.0.0.0.1.0.0.0.0.d.f.ip6.arpa."),
        Owner::Guest
    );
    assert_eq!(
        owner("a.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.7.9.0.0.0.1.0.0.0.0.d.f.ip6.arpa."),
        Owner::Local
    );
    // the forward split is unchanged
    assert_eq!(owner("cat.team-a.svc.cluster.local."), Owner::Guest);
    assert_eq!(owner("cat.clusters-hc1.svc.cluster.local."), Owner::Local);
    assert_eq!(owner("quay.io."), Owner::Local);
}

#[test]
fn aaaa_and_ptr_answers_pass_through() {
    use hickory_proto::rr::rdata::{AAAA, PTR};
    let e = engine_with_reverse_zones(&["fd00:10:96::/112"]);
    let t = Instant::now();
    let name = "cat.team-a.svc.cluster.local.";
    let f = forward(e.handle_query(
        &query_bytes(9, name, RecordType::AAAA, None),
        Transport::Udp,
        t,
    ));
    assert_eq!(f.query.owner, Owner::Guest);
    assert_eq!(f.upstreams, [GUEST.parse::<SocketAddr>().unwrap()]);
    let ip: std::net::Ipv6Addr = "fd00:10:96::a".parse().unwrap();
    let r = answer(
        &e,
        &f,
        |q, id| {
            upstream_answer(
                q,
                id,
                ResponseCode::NoError,
                vec![Record::from_rdata(n(name), 30, RData::AAAA(AAAA(ip)))],
                vec![],
            )
        },
        t,
    );
    let m = parse(&r);
    assert_eq!(m.metadata.id, 9);
    assert!(matches!(&m.answers[0].data, RData::AAAA(a) if a.0 == ip));
    let ptr = "a.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.6.9.0.0.0.1.0.0.0.0.d.f.ip6.arpa.";
    let f = forward(e.handle_query(
        &query_bytes(10, ptr, RecordType::PTR, None),
        Transport::Udp,
        t,
    ));
    assert_eq!(f.query.owner, Owner::Guest);
    let r = answer(
        &e,
        &f,
        |q, id| {
            upstream_answer(
                q,
                id,
                ResponseCode::NoError,
                vec![Record::from_rdata(n(ptr), 30, RData::PTR(PTR(n(name))))],
                vec![],
            )
        },
        t,
    );
    let m = parse(&r);
    assert!(matches!(&m.answers[0].data, RData::PTR(p) if p.0 == n(name)));
}
