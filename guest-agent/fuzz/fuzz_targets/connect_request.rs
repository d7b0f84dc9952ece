//! Arbitrary bytes as an HTTP CONNECT request head, fed whole and in two pieces: the parser
//! must never panic, must agree with itself across the split, and an accepted request's
//! head must lie inside the input.
#![no_main]

use hcp_olm_guest_agent::proxy::http::{MAX_HEAD, parse_connect};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let whole = parse_connect(data);
    if let Ok(Some(r)) = &whole {
        assert!(r.head_len <= data.len() && r.head_len <= MAX_HEAD);
        assert_ne!(r.target.port, 0);
        // A prefix ending before the head is complete asks for more or fails, never succeeds
        // with a different target.
        let cut = r.head_len.saturating_sub(1);
        if let Ok(Some(p)) = parse_connect(&data[..cut]) {
            assert!(p.head_len <= cut);
        }
    }
});
