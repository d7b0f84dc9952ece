//! Free TCP ports on loopback, never handed out twice by one process.

use std::collections::HashSet;
use std::net::{Ipv4Addr, TcpListener};
use std::sync::Mutex;

static GIVEN: Mutex<Option<HashSet<u16>>> = Mutex::new(None);

/// A TCP port that is free on 127.0.0.1 now and was not returned before by this process.
pub fn free_port() -> std::io::Result<u16> {
    for _ in 0..64 {
        let port = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?
            .local_addr()?
            .port();
        let mut guard = GIVEN.lock().unwrap_or_else(|p| p.into_inner());
        if guard.get_or_insert_with(HashSet::new).insert(port) {
            return Ok(port);
        }
    }
    Err(std::io::Error::new(
        std::io::ErrorKind::AddrNotAvailable,
        "no fresh free port found after 64 tries",
    ))
}
