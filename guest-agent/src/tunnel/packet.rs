//! A minimal IPv4 packet builder and parser: enough to look at a decapsulated packet's source
//! address and to build/parse ICMP echo and UDP datagrams in tests and health probes.
//! Options are skipped, fragments are not reassembled.

use std::net::Ipv4Addr;

/// IP protocol numbers used here.
pub const PROTO_ICMP: u8 = 1;
/// UDP.
pub const PROTO_UDP: u8 = 17;

/// Errors from parsing a packet.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum PacketError {
    /// Shorter than its headers say.
    #[error("truncated packet")]
    Truncated,
    /// Not IPv4.
    #[error("not an IPv4 packet")]
    NotIpv4,
    /// A header field is inconsistent.
    #[error("bad header: {0}")]
    BadHeader(&'static str),
}

/// The Internet checksum (RFC 1071) over `data`, starting from `initial`.
pub fn checksum(initial: u32, data: &[u8]) -> u16 {
    let mut sum = initial;
    let mut chunks = data.chunks_exact(2);
    for c in &mut chunks {
        sum += u32::from(u16::from_be_bytes([c[0], c[1]]));
    }
    if let [last] = chunks.remainder() {
        sum += u32::from(*last) << 8;
    }
    while sum >> 16 != 0 {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

/// A parsed IPv4 packet, borrowing its payload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ipv4<'a> {
    /// Source address.
    pub src: Ipv4Addr,
    /// Destination address.
    pub dst: Ipv4Addr,
    /// Protocol number.
    pub protocol: u8,
    /// Time to live.
    pub ttl: u8,
    /// The payload (bounded by the total-length field).
    pub payload: &'a [u8],
}

impl<'a> Ipv4<'a> {
    /// Parses an IPv4 header (checking version, lengths and header checksum).
    pub fn parse(p: &'a [u8]) -> Result<Self, PacketError> {
        if p.is_empty() {
            return Err(PacketError::Truncated);
        }
        if p[0] >> 4 != 4 {
            return Err(PacketError::NotIpv4);
        }
        if p.len() < 20 {
            return Err(PacketError::Truncated);
        }
        let ihl = usize::from(p[0] & 0x0f) * 4;
        if ihl < 20 {
            return Err(PacketError::BadHeader("ihl < 5"));
        }
        let total = usize::from(u16::from_be_bytes([p[2], p[3]]));
        if total < ihl {
            return Err(PacketError::BadHeader("total length < header length"));
        }
        if p.len() < total {
            return Err(PacketError::Truncated);
        }
        if checksum(0, &p[..ihl]) != 0 {
            return Err(PacketError::BadHeader("header checksum"));
        }
        Ok(Self {
            src: Ipv4Addr::new(p[12], p[13], p[14], p[15]),
            dst: Ipv4Addr::new(p[16], p[17], p[18], p[19]),
            protocol: p[9],
            ttl: p[8],
            payload: &p[ihl..total],
        })
    }
}

/// Builds an IPv4 packet (no options, DF set) around `payload`.
pub fn ipv4(src: Ipv4Addr, dst: Ipv4Addr, protocol: u8, payload: &[u8]) -> Vec<u8> {
    let total = 20 + payload.len();
    let total16 = u16::try_from(total).unwrap_or(u16::MAX);
    let mut p = Vec::with_capacity(total);
    p.extend_from_slice(&[0x45, 0]);
    p.extend_from_slice(&total16.to_be_bytes());
    p.extend_from_slice(&[0, 0, 0x40, 0, 64, protocol, 0, 0]);
    p.extend_from_slice(&src.octets());
    p.extend_from_slice(&dst.octets());
    let c = checksum(0, &p[..20]);
    p[10..12].copy_from_slice(&c.to_be_bytes());
    p.extend_from_slice(payload);
    p
}

/// An ICMP echo request or reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IcmpEcho<'a> {
    /// true for a reply (type 0), false for a request (type 8).
    pub reply: bool,
    /// Identifier.
    pub id: u16,
    /// Sequence number.
    pub seq: u16,
    /// Payload.
    pub data: &'a [u8],
}

impl<'a> IcmpEcho<'a> {
    /// Parses an ICMP echo message (checksum verified). Other ICMP types are errors.
    pub fn parse(icmp: &'a [u8]) -> Result<Self, PacketError> {
        if icmp.len() < 8 {
            return Err(PacketError::Truncated);
        }
        if checksum(0, icmp) != 0 {
            return Err(PacketError::BadHeader("icmp checksum"));
        }
        let reply = match (icmp[0], icmp[1]) {
            (0, 0) => true,
            (8, 0) => false,
            _ => return Err(PacketError::BadHeader("not an icmp echo")),
        };
        Ok(Self {
            reply,
            id: u16::from_be_bytes([icmp[4], icmp[5]]),
            seq: u16::from_be_bytes([icmp[6], icmp[7]]),
            data: &icmp[8..],
        })
    }

    /// Serialises the ICMP message (without the IP header).
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut m = vec![if self.reply { 0 } else { 8 }, 0, 0, 0];
        m.extend_from_slice(&self.id.to_be_bytes());
        m.extend_from_slice(&self.seq.to_be_bytes());
        m.extend_from_slice(self.data);
        let c = checksum(0, &m);
        m[2..4].copy_from_slice(&c.to_be_bytes());
        m
    }
}

/// A UDP datagram.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Udp<'a> {
    /// Source port.
    pub src_port: u16,
    /// Destination port.
    pub dst_port: u16,
    /// Payload.
    pub data: &'a [u8],
}

fn pseudo_header_sum(src: Ipv4Addr, dst: Ipv4Addr, protocol: u8, len: usize) -> u32 {
    let s = src.octets();
    let d = dst.octets();
    let words = [
        u16::from_be_bytes([s[0], s[1]]),
        u16::from_be_bytes([s[2], s[3]]),
        u16::from_be_bytes([d[0], d[1]]),
        u16::from_be_bytes([d[2], d[3]]),
        u16::from(protocol),
        u16::try_from(len).unwrap_or(u16::MAX),
    ];
    words.iter().map(|w| u32::from(*w)).sum()
}

impl<'a> Udp<'a> {
    /// Parses the UDP payload of `ip` (checksum verified unless zero).
    pub fn parse(ip: &Ipv4<'a>) -> Result<Self, PacketError> {
        if ip.protocol != PROTO_UDP {
            return Err(PacketError::BadHeader("not udp"));
        }
        let u = ip.payload;
        if u.len() < 8 {
            return Err(PacketError::Truncated);
        }
        let len = usize::from(u16::from_be_bytes([u[4], u[5]]));
        if len < 8 {
            return Err(PacketError::BadHeader("udp length < 8"));
        }
        if len > u.len() {
            return Err(PacketError::Truncated);
        }
        let u = &u[..len];
        if u16::from_be_bytes([u[6], u[7]]) != 0
            && checksum(pseudo_header_sum(ip.src, ip.dst, PROTO_UDP, len), u) != 0
        {
            return Err(PacketError::BadHeader("udp checksum"));
        }
        Ok(Self {
            src_port: u16::from_be_bytes([u[0], u[1]]),
            dst_port: u16::from_be_bytes([u[2], u[3]]),
            data: &u[8..],
        })
    }
}

/// Builds a complete IPv4/UDP packet with a correct UDP checksum.
pub fn udp_packet(
    src: Ipv4Addr,
    src_port: u16,
    dst: Ipv4Addr,
    dst_port: u16,
    data: &[u8],
) -> Vec<u8> {
    let len = 8 + data.len();
    let mut u = Vec::with_capacity(len);
    u.extend_from_slice(&src_port.to_be_bytes());
    u.extend_from_slice(&dst_port.to_be_bytes());
    u.extend_from_slice(&u16::try_from(len).unwrap_or(u16::MAX).to_be_bytes());
    u.extend_from_slice(&[0, 0]);
    u.extend_from_slice(data);
    let mut c = checksum(pseudo_header_sum(src, dst, PROTO_UDP, len), &u);
    if c == 0 {
        c = 0xffff;
    }
    u[6..8].copy_from_slice(&c.to_be_bytes());
    ipv4(src, dst, PROTO_UDP, &u)
}

/// Builds a complete IPv4/ICMP echo request.
pub fn icmp_echo_request(src: Ipv4Addr, dst: Ipv4Addr, id: u16, seq: u16, data: &[u8]) -> Vec<u8> {
    let m = IcmpEcho {
        reply: false,
        id,
        seq,
        data,
    }
    .to_bytes();
    ipv4(src, dst, PROTO_ICMP, &m)
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: Ipv4Addr = Ipv4Addr::new(198, 18, 40, 1);
    const B: Ipv4Addr = Ipv4Addr::new(198, 18, 40, 2);

    #[test]
    fn udp_round_trip() {
        let p = udp_packet(A, 1234, B, 7, b"hello");
        let ip = Ipv4::parse(&p).unwrap();
        assert_eq!((ip.src, ip.dst, ip.protocol), (A, B, PROTO_UDP));
        let u = Udp::parse(&ip).unwrap();
        assert_eq!((u.src_port, u.dst_port, u.data), (1234, 7, &b"hello"[..]));
    }

    #[test]
    fn icmp_round_trip_and_checksums_detect_corruption() {
        let mut p = icmp_echo_request(A, B, 9, 3, b"ping");
        let ip = Ipv4::parse(&p).unwrap();
        let e = IcmpEcho::parse(ip.payload).unwrap();
        assert_eq!((e.reply, e.id, e.seq, e.data), (false, 9, 3, &b"ping"[..]));
        let last = p.len() - 1;
        p[last] ^= 1;
        let ip = Ipv4::parse(&p).unwrap();
        assert_eq!(
            IcmpEcho::parse(ip.payload),
            Err(PacketError::BadHeader("icmp checksum"))
        );
        p[15] ^= 1; // source address: header checksum now wrong
        assert_eq!(
            Ipv4::parse(&p),
            Err(PacketError::BadHeader("header checksum"))
        );
    }

    #[test]
    fn rejects_short_and_foreign_packets() {
        assert_eq!(Ipv4::parse(&[]), Err(PacketError::Truncated));
        assert_eq!(Ipv4::parse(&[0x60; 40]), Err(PacketError::NotIpv4));
        let p = udp_packet(A, 1, B, 2, b"x");
        assert_eq!(Ipv4::parse(&p[..p.len() - 1]), Err(PacketError::Truncated));
    }
}
