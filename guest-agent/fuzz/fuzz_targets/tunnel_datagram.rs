//! Arbitrary datagrams into an established tunnel peer (gateway side): every input must be
//! dropped and counted or handled, never panic, and never move the endpoint unless it
//! authenticated (which random bytes cannot).
#![no_main]

use std::net::SocketAddr;
use std::sync::Mutex;
use std::time::Instant;

use hcp_olm_guest_agent::tunnel::packet;
use hcp_olm_guest_agent::tunnel::{Output, Peer, PeerConfig, PrivateKey};
use libfuzzer_sys::fuzz_target;

struct State {
    gw: Peer,
    guest_addr: SocketAddr,
}

fn establish() -> State {
    let guest_key = PrivateKey::from_base64("YFnXL3fFDhpV1fsXh7Ui4t9zqDdgDTBgc0qnPJAsJ0o=").unwrap();
    let gw_key = PrivateKey::from_base64("eNFM3Hjtk0V8g0ZcEzbkPl6HqZXFzqqz9+hM2U0CRFc=").unwrap();
    let gw_addr: SocketAddr = "198.18.40.1:51820".parse().unwrap();
    let guest_addr: SocketAddr = "198.18.40.2:40000".parse().unwrap();
    let mut guest = Peer::new(PeerConfig {
        private_key: guest_key.clone(),
        peer_public_key: gw_key.public_key(),
        preshared_key: None,
        endpoint: Some(gw_addr),
        persistent_keepalive: None,
        dead_peer_timeout: None,
        allowed_ips: vec!["0.0.0.0/0".parse().unwrap()],
        index: 1,
        previous_private_keys: Vec::new(),
        previous_peer_public_keys: Vec::new(),
        solicit_after: None,
    });
    let mut gw = Peer::new(PeerConfig {
        private_key: gw_key,
        peer_public_key: guest_key.public_key(),
        preshared_key: None,
        endpoint: None,
        persistent_keepalive: None,
        dead_peer_timeout: None,
        allowed_ips: vec!["0.0.0.0/0".parse().unwrap()],
        index: 2,
        previous_private_keys: Vec::new(),
        previous_peer_public_keys: Vec::new(),
        solicit_after: None,
    });
    let now = Instant::now();
    let p = packet::udp_packet(
        [198, 18, 41, 2].into(),
        1,
        [198, 18, 41, 1].into(),
        2,
        b"x",
    );
    let mut to_gw = Vec::new();
    guest.send_packet(&p, &mut to_gw).unwrap();
    for _ in 0..8 {
        let mut to_guest = Vec::new();
        for o in to_gw.drain(..) {
            if let Output::Send { datagram, .. } = o {
                let _ = gw.handle_datagram(guest_addr, &datagram, now, &mut to_guest);
            }
        }
        for o in to_guest.drain(..) {
            if let Output::Send { datagram, .. } = o {
                let _ = guest.handle_datagram(gw_addr, &datagram, now, &mut to_gw);
            }
        }
    }
    assert!(gw.handshake_age().is_some(), "fuzz setup: no session");
    State { gw, guest_addr }
}

static STATE: Mutex<Option<State>> = Mutex::new(None);

fuzz_target!(|data: &[u8]| {
    let mut guard = STATE.lock().unwrap_or_else(|p| p.into_inner());
    let st = guard.get_or_insert_with(establish);
    let from: SocketAddr = "198.18.40.66:1234".parse().unwrap();
    let before = st.gw.counters().dropped.iter().sum::<u64>();
    let mut out = Vec::new();
    let r = st.gw.handle_datagram(from, data, Instant::now(), &mut out);
    let after = st.gw.counters().dropped.iter().sum::<u64>();
    match r {
        Err(_) => assert_eq!(after, before + 1, "drop not counted"),
        Ok(()) => panic!("random bytes authenticated: {data:?}"),
    }
    assert_eq!(st.gw.endpoint(), Some(st.guest_addr), "endpoint moved");
    let mut tick = Vec::new();
    st.gw.tick(Instant::now(), &mut tick);
    let mut p = Vec::new();
    let _ = st.gw.send_packet(data, &mut p);
    // The packet parser too.
    if let Ok(ip) = packet::Ipv4::parse(data) {
        let _ = packet::Udp::parse(&ip);
        let _ = packet::IcmpEcho::parse(ip.payload);
    }
});
