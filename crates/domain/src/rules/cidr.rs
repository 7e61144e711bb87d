//! CIDR blocks (`10.0.0.0/8`, `fd00::/8`) as AddressMatch `cird` and policy `ipBlocks` carry
//! them. std has no CIDR type and the parse is a few lines, so no extra crate.

use std::fmt;
use std::net::IpAddr;
use std::str::FromStr;

/// An IP network: an address and a prefix length. Host bits after the prefix are allowed in the
/// text (`10.1.2.3/8`, as Go's `net.ParseCIDR` accepts) and ignored when matching.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Cidr {
    address: IpAddr,
    prefix: u8,
}

impl Cidr {
    pub fn parse(text: &str) -> Result<Cidr, String> {
        let Some((address, prefix)) = text.split_once('/') else {
            return Err(
                "must be a CIDR block such as 10.0.0.0/8 (a single address is 10.0.0.1/32)".into(),
            );
        };
        let address: IpAddr = address
            .parse()
            .map_err(|_| format!("{address:?} is not an IPv4 or IPv6 address"))?;
        let max = if address.is_ipv4() { 32 } else { 128 };
        // Digits only: `u8::from_str` would also take a leading `+`.
        let prefix = if !prefix.is_empty() && prefix.bytes().all(|b| b.is_ascii_digit()) {
            prefix.parse::<u8>().ok().filter(|p| *p <= max)
        } else {
            None
        };
        let Some(prefix) = prefix else {
            return Err(format!(
                "the prefix length must be a number from 0 to {max}"
            ));
        };
        Ok(Cidr { address, prefix })
    }

    pub fn prefix(&self) -> u8 {
        self.prefix
    }

    /// The network's address, host bits cleared (`10.1.2.3/8` is `10.0.0.0`).
    pub fn network(&self) -> IpAddr {
        let keep = |bits: u32| {
            u128::MAX
                .checked_shl(bits.saturating_sub(u32::from(self.prefix)))
                .unwrap_or(0)
        };
        match self.address {
            IpAddr::V4(v4) => {
                let mask = u32::try_from(keep(32) & u128::from(u32::MAX)).unwrap_or(0);
                IpAddr::V4((v4.to_bits() & mask).into())
            }
            IpAddr::V6(v6) => IpAddr::V6((v6.to_bits() & keep(128)).into()),
        }
    }

    /// Whether `ip` lies in this network. An IPv4-mapped IPv6 address (`::ffff:10.0.0.1`) counts
    /// as its IPv4 address, since dual-stack sockets report IPv4 peers that way.
    pub fn contains(&self, ip: IpAddr) -> bool {
        let ip = match ip {
            IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
            v4 => v4,
        };
        match (self.address, ip) {
            (IpAddr::V4(net), IpAddr::V4(ip)) => same_prefix(
                u128::from(net.to_bits()) << 96,
                u128::from(ip.to_bits()) << 96,
                self.prefix,
            ),
            (IpAddr::V6(net), IpAddr::V6(ip)) => {
                same_prefix(net.to_bits(), ip.to_bits(), self.prefix)
            }
            _ => false,
        }
    }
}

/// Whether the first `prefix` bits of two left-aligned addresses agree.
fn same_prefix(a: u128, b: u128, prefix: u8) -> bool {
    match u32::from(prefix) {
        0 => true,
        p => (a ^ b) >> (128 - p) == 0,
    }
}

impl FromStr for Cidr {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        Cidr::parse(text)
    }
}

impl fmt::Display for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.address, self.prefix)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_network_address_clears_host_bits() {
        for (text, network) in [
            ("10.1.2.3/8", "10.0.0.0"),
            ("10.1.2.3/32", "10.1.2.3"),
            ("10.1.2.3/0", "0.0.0.0"),
            ("fd00::1/8", "fd00::"),
            ("fd00::1/128", "fd00::1"),
        ] {
            let cidr = Cidr::parse(text).unwrap();
            assert_eq!(cidr.network().to_string(), network, "{text}");
        }
    }

    fn ip(text: &str) -> IpAddr {
        text.parse().unwrap()
    }

    #[test]
    fn ipv4_blocks_contain_their_addresses_only() {
        let block = Cidr::parse("10.1.0.0/16").unwrap();
        assert!(block.contains(ip("10.1.0.0")));
        assert!(block.contains(ip("10.1.255.7")));
        assert!(!block.contains(ip("10.2.0.1")));
        assert!(!block.contains(ip("fd00::1")));
        assert!(block.contains(ip("::ffff:10.1.2.3")));
        let host = Cidr::parse("192.168.0.7/32").unwrap();
        assert!(host.contains(ip("192.168.0.7")));
        assert!(!host.contains(ip("192.168.0.8")));
        assert!(Cidr::parse("0.0.0.0/0").unwrap().contains(ip("8.8.8.8")));
        // Host bits are ignored, as Go's net.ParseCIDR does.
        assert!(
            Cidr::parse("10.1.2.3/8")
                .unwrap()
                .contains(ip("10.200.0.1"))
        );
    }

    #[test]
    fn ipv6_blocks_contain_their_addresses_only() {
        let block = Cidr::parse("fd00:1::/32").unwrap();
        assert!(block.contains(ip("fd00:1::5")));
        assert!(block.contains(ip("fd00:1:ffff::5")));
        assert!(!block.contains(ip("fd00:2::5")));
        assert!(!block.contains(ip("10.0.0.1")));
        assert!(Cidr::parse("::/0").unwrap().contains(ip("2001:db8::1")));
        assert!(
            Cidr::parse("2001:db8::1/128")
                .unwrap()
                .contains(ip("2001:db8::1"))
        );
        assert!(
            !Cidr::parse("2001:db8::1/128")
                .unwrap()
                .contains(ip("2001:db8::2"))
        );
    }

    #[test]
    fn malformed_blocks_are_refused_with_the_reason() {
        for (text, reason) in [
            ("10.0.0.1", "must be a CIDR block"),
            ("10.0.0/8", "not an IPv4 or IPv6 address"),
            ("10.0.0.0/33", "from 0 to 32"),
            ("fd00::/129", "from 0 to 128"),
            ("10.0.0.0/", "from 0 to 32"),
            ("10.0.0.0/+8", "from 0 to 32"),
            ("10.0.0.0/8/8", "from 0 to 32"),
            ("/8", "not an IPv4 or IPv6 address"),
            ("", "must be a CIDR block"),
        ] {
            let err = Cidr::parse(text).unwrap_err();
            assert!(err.contains(reason), "{text}: {err}");
        }
        assert_eq!(Cidr::parse("10.0.0.0/8").unwrap().to_string(), "10.0.0.0/8");
        assert_eq!(Cidr::parse("10.0.0.0/08").unwrap().prefix(), 8);
    }
}
