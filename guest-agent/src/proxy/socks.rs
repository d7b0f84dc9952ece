//! SOCKS5 (RFC 1928) greeting and request parsing, no-auth only, CONNECT only. Incremental:
//! `Ok(None)` means "need more bytes".

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use super::{Host, Target, valid_name};

/// SOCKS5 reply codes we send.
pub const REP_SUCCEEDED: u8 = 0x00;
pub const REP_GENERAL_FAILURE: u8 = 0x01;
pub const REP_NOT_ALLOWED: u8 = 0x02;
pub const REP_HOST_UNREACHABLE: u8 = 0x04;
pub const REP_CONNECTION_REFUSED: u8 = 0x05;
pub const REP_COMMAND_NOT_SUPPORTED: u8 = 0x07;
pub const REP_ADDRESS_NOT_SUPPORTED: u8 = 0x08;

/// Why a greeting or request was rejected.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum SocksError {
    #[error("not SOCKS version 5")]
    Version,
    #[error("no acceptable authentication method (only no-auth)")]
    NoAcceptableMethod,
    #[error("malformed message")]
    Malformed,
    #[error("command not supported (only CONNECT)")]
    Command,
    #[error("address type not supported")]
    AddressType,
}

impl SocksError {
    /// The reply code for request errors (greeting errors answer `05 FF`).
    pub fn reply_code(self) -> u8 {
        match self {
            SocksError::Command => REP_COMMAND_NOT_SUPPORTED,
            SocksError::AddressType => REP_ADDRESS_NOT_SUPPORTED,
            _ => REP_GENERAL_FAILURE,
        }
    }
}

/// Parses the method-selection greeting; returns its length when no-auth (0x00) is offered.
pub fn parse_greeting(buf: &[u8]) -> Result<Option<usize>, SocksError> {
    let Some(&ver) = buf.first() else {
        return Ok(None);
    };
    if ver != 5 {
        return Err(SocksError::Version);
    }
    let Some(&n) = buf.get(1) else {
        return Ok(None);
    };
    if n == 0 {
        return Err(SocksError::Malformed);
    }
    let len = 2 + usize::from(n);
    let Some(methods) = buf.get(2..len) else {
        return Ok(None);
    };
    if methods.contains(&0x00) {
        Ok(Some(len))
    } else {
        Err(SocksError::NoAcceptableMethod)
    }
}

/// Parses a request; returns the target and the request's length.
pub fn parse_request(buf: &[u8]) -> Result<Option<(Target, usize)>, SocksError> {
    if buf.len() < 4 {
        if buf.first().is_some_and(|&v| v != 5) {
            return Err(SocksError::Version);
        }
        return Ok(None);
    }
    if buf[0] != 5 {
        return Err(SocksError::Version);
    }
    if buf[2] != 0 {
        return Err(SocksError::Malformed);
    }
    let (host, at) = match buf[3] {
        0x01 => {
            let Some(a) = buf.get(4..8) else {
                return Ok(None);
            };
            (
                Host::Ip(IpAddr::V4(Ipv4Addr::new(a[0], a[1], a[2], a[3]))),
                8,
            )
        }
        0x04 => {
            let Some(a) = buf.get(4..20) else {
                return Ok(None);
            };
            let mut o = [0u8; 16];
            o.copy_from_slice(a);
            (Host::Ip(IpAddr::V6(Ipv6Addr::from(o))), 20)
        }
        0x03 => {
            let Some(&n) = buf.get(4) else {
                return Ok(None);
            };
            let end = 5 + usize::from(n);
            let Some(name) = buf.get(5..end) else {
                return Ok(None);
            };
            let name = std::str::from_utf8(name).map_err(|_| SocksError::Malformed)?;
            (
                Host::Name(valid_name(name).ok_or(SocksError::Malformed)?),
                end,
            )
        }
        _ => return Err(SocksError::AddressType),
    };
    let Some(p) = buf.get(at..at + 2) else {
        return Ok(None);
    };
    // The command is checked after the whole request is known to be well formed.
    if buf[1] != 0x01 {
        return Err(SocksError::Command);
    }
    let port = u16::from_be_bytes([p[0], p[1]]);
    if port == 0 {
        return Err(SocksError::Malformed);
    }
    Ok(Some((Target { host, port }, at + 2)))
}

/// A reply with an all-zero IPv4 bound address.
pub fn reply(code: u8) -> [u8; 10] {
    [5, code, 0, 1, 0, 0, 0, 0, 0, 0]
}

/// Client side (a gateway replica forwarding to another): the greeting (no-auth) and a
/// CONNECT request for `name:port`, sent together. `None` for a name over 255 bytes.
pub fn client_connect(name: &str, port: u16) -> Option<Vec<u8>> {
    let n = u8::try_from(name.len()).ok()?;
    let mut out = vec![5, 1, 0, 5, 1, 0, 3, n];
    out.extend_from_slice(name.as_bytes());
    out.extend_from_slice(&port.to_be_bytes());
    Some(out)
}

/// Client side: parses the server's method selection and CONNECT reply (as answered to
/// [`client_connect`]); returns the reply code and the bytes used. `Ok(None)`: need more.
pub fn parse_client_reply(buf: &[u8]) -> Result<Option<(u8, usize)>, SocksError> {
    match buf.first() {
        None => return Ok(None),
        Some(5) => {}
        Some(_) => return Err(SocksError::Version),
    }
    match buf.get(1) {
        None => return Ok(None),
        Some(0) => {}
        Some(_) => return Err(SocksError::NoAcceptableMethod),
    }
    let r = &buf[2..];
    if r.len() < 4 {
        return Ok(None);
    }
    if r[0] != 5 {
        return Err(SocksError::Version);
    }
    let addr_len = match r[3] {
        0x01 => 4,
        0x04 => 16,
        0x03 => match r.get(4) {
            Some(&n) => 1 + usize::from(n),
            None => return Ok(None),
        },
        _ => return Err(SocksError::AddressType),
    };
    let len = 4 + addr_len + 2;
    if r.len() < len {
        return Ok(None);
    }
    Ok(Some((r[1], 2 + len)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn client_messages_round_trip_through_our_parsers() {
        let m = client_connect("cat.team-a.svc.cluster.local", 50051).unwrap();
        let used = parse_greeting(&m).unwrap().unwrap();
        let (t, n) = parse_request(&m[used..]).unwrap().unwrap();
        assert_eq!(t.to_string(), "cat.team-a.svc.cluster.local:50051");
        assert_eq!(used + n, m.len());
        assert_eq!(client_connect(&"a".repeat(256), 1), None);

        let mut answer = vec![5, 0];
        answer.extend_from_slice(&reply(REP_SUCCEEDED));
        answer.extend_from_slice(b"early");
        assert_eq!(parse_client_reply(&answer), Ok(Some((0, 12))));
        for cut in 0..12 {
            assert_eq!(parse_client_reply(&answer[..cut]), Ok(None), "{cut}");
        }
        let mut refused = vec![5, 0];
        refused.extend_from_slice(&reply(REP_HOST_UNREACHABLE));
        assert_eq!(
            parse_client_reply(&refused),
            Ok(Some((REP_HOST_UNREACHABLE, 12)))
        );
        let mut v6 = vec![5, 0, 5, 0, 0, 4];
        v6.extend_from_slice(&[0; 18]);
        assert_eq!(parse_client_reply(&v6), Ok(Some((0, 24))));
        assert_eq!(
            parse_client_reply(&[5, 0xff]),
            Err(SocksError::NoAcceptableMethod)
        );
        assert_eq!(parse_client_reply(&[4, 0]), Err(SocksError::Version));
        assert_eq!(
            parse_client_reply(&[5, 0, 5, 0, 0, 9]),
            Err(SocksError::AddressType)
        );
    }

    #[test]
    fn greeting() {
        assert_eq!(parse_greeting(&[5]), Ok(None));
        assert_eq!(parse_greeting(&[5, 2, 2]), Ok(None));
        assert_eq!(parse_greeting(&[5, 2, 2, 0]), Ok(Some(4)));
        assert_eq!(
            parse_greeting(&[5, 1, 2]),
            Err(SocksError::NoAcceptableMethod)
        );
        assert_eq!(parse_greeting(&[4, 1, 0]), Err(SocksError::Version));
        assert_eq!(parse_greeting(&[5, 0]), Err(SocksError::Malformed));
    }

    #[test]
    fn requests() {
        let mut r = vec![5, 1, 0, 3, 5];
        r.extend_from_slice(b"a.b.c");
        r.extend_from_slice(&50051u16.to_be_bytes());
        let (t, n) = parse_request(&r).unwrap().unwrap();
        assert_eq!((t.to_string(), n), ("a.b.c:50051".to_string(), r.len()));
        assert_eq!(parse_request(&r[..r.len() - 1]), Ok(None));
        let v4 = [5, 1, 0, 1, 198, 18, 0, 1, 0, 80];
        assert_eq!(
            parse_request(&v4).unwrap().unwrap().0.to_string(),
            "198.18.0.1:80"
        );
        let mut v6 = vec![5, 1, 0, 4];
        v6.extend_from_slice(&"fd00::1".parse::<Ipv6Addr>().unwrap().octets());
        v6.extend_from_slice(&[1, 187]);
        assert_eq!(
            parse_request(&v6).unwrap().unwrap().0.to_string(),
            "[fd00::1]:443"
        );
        assert_eq!(
            parse_request(&[5, 2, 0, 1, 1, 2, 3, 4, 0, 80]),
            Err(SocksError::Command)
        );
        assert_eq!(
            parse_request(&[5, 1, 0, 9, 0]),
            Err(SocksError::AddressType)
        );
        assert_eq!(parse_request(&[4, 1, 0, 1]), Err(SocksError::Version));
    }
}
