//! Which resolved addresses a job's request may not reach unless the host runs with
//! `--http-allow-private`: everything that is not a global unicast address.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// Why `ip` is forbidden without `--http-allow-private` (e.g. "a loopback address"), or `None`
/// for a global unicast address.
pub fn forbidden(ip: IpAddr) -> Option<&'static str> {
    match ip {
        IpAddr::V4(v4) => forbidden_v4(v4),
        IpAddr::V6(v6) => {
            if let Some(v4) = v6.to_ipv4_mapped() {
                return forbidden_v4(v4);
            }
            forbidden_v6(v6)
        }
    }
}

fn forbidden_v4(ip: Ipv4Addr) -> Option<&'static str> {
    let [a, b, ..] = ip.octets();
    Some(if ip.is_loopback() {
        "a loopback address"
    } else if ip.is_private() {
        "a private address"
    } else if ip.is_link_local() {
        "a link-local address (cloud metadata services live here)"
    } else if ip.is_unspecified() || a == 0 {
        "an unspecified address"
    } else if a == 100 && (64..128).contains(&b) {
        "a shared (carrier-grade NAT) address"
    } else if ip.is_multicast() || ip.is_broadcast() || a >= 240 {
        "a multicast, broadcast or reserved address"
    } else if ip.is_documentation() || (a == 198 && (b == 18 || b == 19)) {
        "a documentation or benchmarking address"
    } else {
        return None;
    })
}

fn forbidden_v6(ip: Ipv6Addr) -> Option<&'static str> {
    let first = ip.segments()[0];
    Some(if ip.is_loopback() {
        "a loopback address"
    } else if ip.is_unspecified() {
        "an unspecified address"
    } else if first & 0xfe00 == 0xfc00 {
        "a unique local (private) address"
    } else if first & 0xffc0 == 0xfe80 {
        "a link-local address"
    } else if ip.is_multicast() {
        "a multicast address"
    } else if first == 0x2001 && ip.segments()[1] == 0x0db8 {
        "a documentation address"
    } else if first == 0x0064 && ip.segments()[1] == 0xff9b {
        // NAT64 embeds an IPv4 address: judge that one.
        let s = ip.segments();
        let v4 = Ipv4Addr::new((s[6] >> 8) as u8, s[6] as u8, (s[7] >> 8) as u8, s[7] as u8);
        return forbidden_v4(v4);
    } else {
        return None;
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_global_unicast_addresses_are_allowed() {
        for (ip, why) in [
            ("127.0.0.1", "loopback"),
            ("10.1.2.3", "private"),
            ("172.16.0.1", "private"),
            ("192.168.1.1", "private"),
            ("169.254.169.254", "link-local"),
            ("0.0.0.0", "unspecified"),
            ("100.64.0.1", "carrier-grade"),
            ("224.0.0.1", "multicast"),
            ("::1", "loopback"),
            ("fd00::1", "unique local"),
            ("fe80::1", "link-local"),
            ("::ffff:127.0.0.1", "loopback"),
            ("::ffff:10.0.0.1", "private"),
            ("64:ff9b::a00:1", "private"),
        ] {
            let got = forbidden(ip.parse().unwrap());
            assert!(got.is_some_and(|g| g.contains(why)), "{ip}: {got:?}");
        }
        for ip in [
            "93.184.216.34",
            "8.8.8.8",
            "2606:4700::1111",
            "::ffff:8.8.8.8",
        ] {
            assert_eq!(forbidden(ip.parse().unwrap()), None, "{ip}");
        }
    }
}
