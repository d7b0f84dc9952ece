//! Arbitrary bytes as a SOCKS5 greeting followed by a request: never panic; lengths returned
//! lie inside the input; a domain target is a valid lower-case host name.
#![no_main]

use hcp_olm_guest_agent::proxy::socks::{parse_greeting, parse_request};
use hcp_olm_guest_agent::proxy::{Host, valid_name};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let rest = match parse_greeting(data) {
        Ok(Some(n)) => {
            assert!(n <= data.len());
            &data[n..]
        }
        _ => data,
    };
    if let Ok(Some((t, n))) = parse_request(rest) {
        assert!(n <= rest.len());
        assert_ne!(t.port, 0);
        if let Host::Name(name) = &t.host {
            assert_eq!(valid_name(name).as_deref(), Some(name.as_str()));
        }
    }
});
