//! HTTP/1.1 CONNECT request parsing (RFC 9110 §9.3.6). Incremental: feed the bytes read so
//! far; `Ok(None)` means "need more".

use super::{Target, parse_authority};

/// Largest request head accepted (request line + headers).
pub const MAX_HEAD: usize = 8 * 1024;
const MAX_HEADERS: usize = 64;

/// Why a request was rejected, with the status to answer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConnectError {
    #[error("request head larger than {MAX_HEAD} bytes")]
    TooLarge,
    #[error("malformed request: {0}")]
    Malformed(&'static str),
    #[error("method not allowed (only CONNECT)")]
    Method,
    #[error("bad CONNECT target")]
    BadTarget,
}

impl ConnectError {
    /// The HTTP status line to answer with.
    pub fn status(&self) -> &'static str {
        match self {
            ConnectError::TooLarge => "431 Request Header Fields Too Large",
            ConnectError::Malformed(_) | ConnectError::BadTarget => "400 Bad Request",
            ConnectError::Method => "405 Method Not Allowed",
        }
    }
}

/// A parsed CONNECT request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnectRequest {
    pub target: Target,
    /// Bytes of the head (everything up to and including the blank line); any bytes after
    /// it are tunnel payload the client sent early.
    pub head_len: usize,
}

/// Parses a CONNECT request head from `buf`.
pub fn parse_connect(buf: &[u8]) -> Result<Option<ConnectRequest>, ConnectError> {
    let Some(end) = find_head_end(buf) else {
        if buf.len() >= MAX_HEAD {
            return Err(ConnectError::TooLarge);
        }
        return Ok(None);
    };
    if end > MAX_HEAD {
        return Err(ConnectError::TooLarge);
    }
    let head =
        std::str::from_utf8(&buf[..end]).map_err(|_| ConnectError::Malformed("not UTF-8"))?;
    let mut lines = head.split("\r\n");
    let request_line = lines.next().ok_or(ConnectError::Malformed("empty"))?;
    let mut parts = request_line.split(' ');
    let (Some(method), Some(authority), Some(version), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(ConnectError::Malformed("request line"));
    };
    if !(version == "HTTP/1.1" || version == "HTTP/1.0") {
        return Err(ConnectError::Malformed("version"));
    }
    if method.is_empty() || !method.bytes().all(|b| b.is_ascii_uppercase()) {
        return Err(ConnectError::Malformed("method"));
    }
    if method != "CONNECT" {
        return Err(ConnectError::Method);
    }
    let target = parse_authority(authority).ok_or(ConnectError::BadTarget)?;
    let mut n = 0;
    for line in lines {
        if line.is_empty() {
            continue;
        }
        n += 1;
        if n > MAX_HEADERS {
            return Err(ConnectError::TooLarge);
        }
        let Some((name, _value)) = line.split_once(':') else {
            return Err(ConnectError::Malformed("header line"));
        };
        if name.is_empty() || !name.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(ConnectError::Malformed("header name"));
        }
    }
    Ok(Some(ConnectRequest {
        target,
        head_len: end,
    }))
}

fn find_head_end(buf: &[u8]) -> Option<usize> {
    buf.windows(4).position(|w| w == b"\r\n\r\n").map(|p| p + 4)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proxy::Host;

    #[test]
    fn good_request_and_early_data() {
        let r = b"CONNECT cat.ns.svc.cluster.local:50051 HTTP/1.1\r\nHost: cat.ns.svc.cluster.local:50051\r\n\r\nPRI";
        let c = parse_connect(r).unwrap().unwrap();
        assert_eq!(c.target.host, Host::Name("cat.ns.svc.cluster.local".into()));
        assert_eq!(c.target.port, 50051);
        assert_eq!(&r[c.head_len..], b"PRI");
    }

    #[test]
    fn partial_then_errors() {
        assert_eq!(parse_connect(b"CONNECT a:1 HTTP/1.1\r\n"), Ok(None));
        assert_eq!(
            parse_connect(b"GET / HTTP/1.1\r\n\r\n"),
            Err(ConnectError::Method)
        );
        assert_eq!(
            parse_connect(b"CONNECT a HTTP/1.1\r\n\r\n"),
            Err(ConnectError::BadTarget)
        );
        assert!(matches!(
            parse_connect(b"\x00\x01garbage\r\n\r\n"),
            Err(ConnectError::Malformed(_))
        ));
        let big = vec![b'a'; MAX_HEAD];
        assert_eq!(parse_connect(&big), Err(ConnectError::TooLarge));
        let mut many = b"CONNECT a:1 HTTP/1.1\r\n".to_vec();
        for _ in 0..100 {
            many.extend_from_slice(b"X: y\r\n");
        }
        many.extend_from_slice(b"\r\n");
        assert_eq!(parse_connect(&many), Err(ConnectError::TooLarge));
    }
}
