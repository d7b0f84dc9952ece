//! Reverse-lookup zones of address ranges (`in-addr.arpa` for IPv4, `ip6.arpa` for IPv6), so
//! that PTR names of the guest's Service and pod ranges can be owned by the guest side.
//! Pure functions, no I/O.

use std::net::IpAddr;

/// The reverse zones covering `addr/prefix`. Reverse names delegate on octet (IPv4) and
/// nibble (IPv6) boundaries, so a prefix between two boundaries expands to every zone at the
/// next boundary: at most 2^7 = 128 zones for IPv4 and 2^3 = 8 for IPv6. Host bits of `addr`
/// are ignored; a prefix longer than the family allows is clamped. Zones are returned in
/// address order, without the trailing dot.
pub fn reverse_zones(addr: IpAddr, prefix: u8) -> Vec<String> {
    match addr {
        IpAddr::V4(a) => {
            let (bits, raw) = (32u32, u128::from(u32::from(a)));
            zones(
                raw,
                bits,
                u32::from(prefix).min(bits),
                8,
                "in-addr.arpa",
                |v| v.to_string(),
            )
        }
        IpAddr::V6(a) => zones(
            u128::from(a),
            128,
            u32::from(prefix).min(128),
            4,
            "ip6.arpa",
            |v| format!("{v:x}"),
        ),
    }
}

/// `raw`: the address as an integer of `bits` bits; `step`: bits per label (8 or 4).
fn zones(
    raw: u128,
    bits: u32,
    prefix: u32,
    step: u32,
    suffix: &str,
    label: impl Fn(u128) -> String,
) -> Vec<String> {
    let boundary = prefix.div_ceil(step) * step;
    let mask = |p: u32| -> u128 {
        if p == 0 {
            0
        } else {
            (u128::MAX << (128 - p)) >> (128 - bits)
        }
    };
    let base = raw & mask(prefix);
    let count = 1u128 << (boundary - prefix);
    let labels = boundary / step;
    // (a /0 of IPv6 would shift by 128: one zone, so the unit is never used)
    let unit = 1u128.checked_shl(bits - boundary).unwrap_or(0);
    (0..count)
        .map(|k| {
            let net = base + k * unit;
            let mut parts: Vec<String> = (0..labels)
                .map(|i| {
                    let shift = bits - step * (i + 1);
                    label((net >> shift) & ((1u128 << step) - 1))
                })
                .collect();
            parts.reverse();
            parts.push(suffix.to_string());
            parts.join(".")
        })
        .collect()
}
