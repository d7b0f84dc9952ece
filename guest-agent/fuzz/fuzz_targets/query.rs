//! Client bytes → engine query handling (UDP and TCP limits), then the upstream side of
//! whatever got forwarded.
#![no_main]

use std::sync::OnceLock;
use std::time::Instant;

use hcp_olm_guest_agent::dns::{Action, Engine, Transport};
use libfuzzer_sys::fuzz_target;

#[path = "common.rs"]
mod common;

static ENGINE: OnceLock<Engine> = OnceLock::new();

fuzz_target!(|data: &[u8]| {
    let e = ENGINE.get_or_init(common::engine);
    let now = Instant::now();
    for t in [Transport::Udp, Transport::Tcp] {
        match e.handle_query(data, t, now) {
            Action::Reply(r) => {
                if t == Transport::Udp {
                    // Never more than the largest UDP limit we may use.
                    assert!(
                        r.bytes.len() <= 4096,
                        "udp reply of {} bytes",
                        r.bytes.len()
                    );
                }
                assert!(r.bytes.len() >= 12, "reply shorter than a header");
            }
            Action::Drop => {}
            Action::Forward(f) => {
                let q = e.upstream_query(&f.query, 1, true);
                assert!(!q.is_empty());
                let _ = e.check_upstream_reply(&f.query, 1, data, t, true);
                let _ = e.fail(&f.query, now);
            }
        }
    }
});
