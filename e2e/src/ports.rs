//! Free loopback ports, never handed out twice on this machine while their taker runs.
//!
//! A port from `bind(:0)` is free when asked, but the taker binds its server later (an etcd,
//! an API server a few seconds on), and a test process running beside it can be handed the
//! same port meanwhile: the kernel picks bind ports at random, so with several test processes
//! taking ports at once that happens in a noticeable share of runs. Each port handed out is
//! therefore also reserved for the life of this process by an advisory lock on
//! `/run/hcp-olm/ports/<port>.lock`; another process skips locked ports, and the kernel drops
//! the locks when the process ends, however it ends (the files stay; at most one per port).

use std::collections::HashMap;
use std::net::{Ipv4Addr, TcpListener, UdpSocket};
use std::sync::Mutex;

/// Where the per-port lock files live.
pub const PORT_LOCK_DIR: &str = "/run/hcp-olm/ports";

/// Ports this process took, with the lock that reserves each.
static GIVEN: Mutex<Option<HashMap<u16, std::fs::File>>> = Mutex::new(None);

/// Reserves `port` for this process unless this or another live process has it.
fn reserve(port: u16) -> std::io::Result<bool> {
    let mut guard = GIVEN.lock().unwrap_or_else(|p| p.into_inner());
    let given = guard.get_or_insert_with(HashMap::new);
    if given.contains_key(&port) {
        return Ok(false);
    }
    std::fs::create_dir_all(PORT_LOCK_DIR)?;
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(std::path::Path::new(PORT_LOCK_DIR).join(format!("{port}.lock")))?;
    match file.try_lock() {
        Ok(()) => {
            given.insert(port, file);
            Ok(true)
        }
        Err(std::fs::TryLockError::WouldBlock) => Ok(false),
        Err(std::fs::TryLockError::Error(e)) => Err(e),
    }
}

fn exhausted() -> std::io::Error {
    std::io::Error::new(
        std::io::ErrorKind::AddrNotAvailable,
        "no free, unreserved loopback port found after 256 tries",
    )
}

/// A TCP port free on 127.0.0.1 now and reserved for this process (see the module doc).
pub fn free_port() -> std::io::Result<u16> {
    for _ in 0..256 {
        let port = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?
            .local_addr()?
            .port();
        if reserve(port)? {
            return Ok(port);
        }
    }
    Err(exhausted())
}

/// A port free for both UDP and TCP on 127.0.0.1 now (a DNS server's), reserved likewise.
pub fn free_udp_tcp_port() -> std::io::Result<u16> {
    for _ in 0..256 {
        let port = UdpSocket::bind((Ipv4Addr::LOCALHOST, 0))?
            .local_addr()?
            .port();
        if TcpListener::bind((Ipv4Addr::LOCALHOST, port)).is_ok() && reserve(port)? {
            return Ok(port);
        }
    }
    Err(exhausted())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_are_reserved_within_and_across_processes() {
        let a = free_port().unwrap();
        let b = free_udp_tcp_port().unwrap();
        assert_ne!(a, b);
        assert!(!reserve(a).unwrap(), "handed out twice in one process");
        // Another process cannot take a port this one holds: flock(1) exits 1 when its
        // non-blocking lock of the same file is refused.
        for p in [a, b] {
            let path = format!("{PORT_LOCK_DIR}/{p}.lock");
            let st = std::process::Command::new("flock")
                .args(["-n", "-E", "7", &path, "true"])
                .status()
                .unwrap();
            assert_eq!(
                st.code(),
                Some(7),
                "port {p} not reserved against other processes"
            );
        }
    }
}
