//! Upstream bytes → reply validation, caching and the client reply built from the cache.
#![no_main]

use std::sync::OnceLock;
use std::time::{Duration, Instant};

use hcp_olm_guest_agent::dns::{Action, Engine, Forward, Transport, UpstreamVerdict};
use libfuzzer_sys::fuzz_target;

#[path = "common.rs"]
mod common;

static STATE: OnceLock<(Engine, Forward)> = OnceLock::new();

/// `a.b.svc.cluster.local. IN A`, id 0x1234, no EDNS.
const QUERY: &[u8] = &[
    0x12, 0x34, 0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0, 1, b'a', 1, b'b', 3, b's', b'v', b'c', 7, b'c',
    b'l', b'u', b's', b't', b'e', b'r', 5, b'l', b'o', b'c', b'a', b'l', 0, 0, 1, 0, 1,
];

fn init() -> (Engine, Forward) {
    let e = common::engine();
    match e.handle_query(QUERY, Transport::Udp, Instant::now()) {
        Action::Forward(f) => (e, f),
        other => panic!("seed query not forwarded: {other:?}"),
    }
}

fuzz_target!(|data: &[u8]| {
    let (e, f) = STATE.get_or_init(init);
    let now = Instant::now();
    // The txid is taken from the data so that matching replies are reachable.
    let txid = match data {
        [a, b, ..] => u16::from_be_bytes([*a, *b]),
        _ => 0,
    };
    for via in [Transport::Udp, Transport::Tcp] {
        if let UpstreamVerdict::Answer(m) = e.check_upstream_reply(&f.query, txid, data, via, true)
        {
            let r = e.complete(&f.query, *m, now);
            assert!(
                r.bytes.len() <= 512,
                "no-EDNS UDP client got {} bytes",
                r.bytes.len()
            );
            // Served from cache now, stale or forwarded later. None may panic.
            let _ = e.handle_query(QUERY, Transport::Udp, now);
            let later = now + Duration::from_secs(4000);
            let _ = e.handle_query(QUERY, Transport::Tcp, later);
            let _ = e.stale_reply(&f.query, later);
        }
    }
});
