//! An IP network in CIDR notation (`10.0.0.0/8`, `::/0`), as the firewall and the profile use it.

use std::fmt;
use std::net::IpAddr;

/// A network: an address whose bits past `prefix` are all zero.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Deserialize)]
#[serde(try_from = "String")]
pub struct Cidr {
    addr: IpAddr,
    prefix: u8,
}

impl Cidr {
    pub fn is_ipv4(&self) -> bool {
        self.addr.is_ipv4()
    }

    /// Whether `ip` lies inside this network.
    pub fn contains(&self, ip: IpAddr) -> bool {
        match (self.addr, ip) {
            (IpAddr::V4(net), IpAddr::V4(ip)) => {
                let mask = mask_u32(self.prefix);
                u32::from(net) & mask == u32::from(ip) & mask
            }
            (IpAddr::V6(net), IpAddr::V6(ip)) => {
                let mask = mask_u128(self.prefix);
                u128::from(net) & mask == u128::from(ip) & mask
            }
            _ => false,
        }
    }
}

/// Networks not routed on the public internet: private (RFC 1918, RFC 4193), shared
/// carrier-grade NAT (RFC 6598), loopback and link-local.
const NOT_PUBLIC: [&str; 9] = [
    "10.0.0.0/8",
    "172.16.0.0/12",
    "192.168.0.0/16",
    "100.64.0.0/10",
    "127.0.0.0/8",
    "169.254.0.0/16",
    "fc00::/7",
    "fe80::/10",
    "::1/128",
];

impl Cidr {
    /// Whether every address of this network lies inside `other`.
    pub fn within(&self, other: &Cidr) -> bool {
        self.prefix >= other.prefix && other.contains(self.addr)
    }

    /// Whether the network reaches beyond private, shared, loopback and link-local addresses,
    /// i.e. admits clients from the public internet.
    pub fn is_public(&self) -> bool {
        !NOT_PUBLIC
            .iter()
            .any(|n| self.within(&n.parse().expect("a valid CIDR")))
    }
}

fn mask_u32(prefix: u8) -> u32 {
    u32::MAX.checked_shl(32 - u32::from(prefix)).unwrap_or(0)
}

fn mask_u128(prefix: u8) -> u128 {
    u128::MAX.checked_shl(128 - u32::from(prefix)).unwrap_or(0)
}

/// Why a text is not a network, with the fix.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CidrError {
    #[error("`{text}` is not a CIDR: write the prefix length too, e.g. `{text}/32`")]
    NoPrefix { text: String },
    #[error("`{text}` is not a CIDR: `{addr}` is not an IP address")]
    NotAnAddress { text: String, addr: String },
    #[error("`{text}` is not a CIDR: the prefix length must be a number from 0 to {max}")]
    BadPrefix { text: String, max: u8 },
    #[error(
        "`{text}` has bits set past its /{prefix} prefix: write the network, `{network}/{prefix}`"
    )]
    HostBits {
        text: String,
        network: IpAddr,
        prefix: u8,
    },
}

impl std::str::FromStr for Cidr {
    type Err = CidrError;

    fn from_str(s: &str) -> Result<Self, CidrError> {
        let text = || s.to_owned();
        let (addr, prefix) = s
            .split_once('/')
            .ok_or_else(|| CidrError::NoPrefix { text: text() })?;
        let addr: IpAddr = addr.parse().map_err(|_| CidrError::NotAnAddress {
            text: text(),
            addr: addr.to_owned(),
        })?;
        let max = if addr.is_ipv4() { 32 } else { 128 };
        let prefix: u8 = prefix
            .parse()
            .ok()
            .filter(|p| *p <= max)
            .ok_or_else(|| CidrError::BadPrefix { text: text(), max })?;
        let network = match addr {
            IpAddr::V4(a) => IpAddr::from((u32::from(a) & mask_u32(prefix)).to_be_bytes()),
            IpAddr::V6(a) => IpAddr::from((u128::from(a) & mask_u128(prefix)).to_be_bytes()),
        };
        if network != addr {
            return Err(CidrError::HostBits {
                text: text(),
                network,
                prefix,
            });
        }
        Ok(Cidr { addr, prefix })
    }
}

impl TryFrom<String> for Cidr {
    type Error = CidrError;

    fn try_from(s: String) -> Result<Self, CidrError> {
        s.parse()
    }
}

impl fmt::Display for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.prefix)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_prints_networks() {
        for s in [
            "0.0.0.0/0",
            "10.0.0.0/8",
            "169.254.169.254/32",
            "::/0",
            "2001:db8::/32",
        ] {
            assert_eq!(s.parse::<Cidr>().unwrap().to_string(), s);
        }
    }

    #[test]
    fn rejects_malformed_input_naming_the_fix() {
        let err = |s: &str| s.parse::<Cidr>().unwrap_err().to_string();
        assert!(err("10.0.0.1").contains("`10.0.0.1/32`"));
        assert!(err("10.0.0.300/8").contains("not an IP address"));
        assert!(err("10.0.0.0/33").contains("from 0 to 32"));
        assert!(err("::/129").contains("from 0 to 128"));
        assert!(err("10.1.2.3/8").contains("`10.0.0.0/8`"));
    }

    #[test]
    fn containment_respects_family_and_prefix() {
        let net: Cidr = "169.254.0.0/16".parse().unwrap();
        assert!(net.contains("169.254.169.254".parse().unwrap()));
        assert!(!net.contains("169.255.0.1".parse().unwrap()));
        assert!(!net.contains("::1".parse().unwrap()));
        let all: Cidr = "0.0.0.0/0".parse().unwrap();
        assert!(all.contains("8.8.8.8".parse().unwrap()));
    }

    #[test]
    fn only_networks_inside_private_ranges_are_not_public() {
        let public = |s: &str| s.parse::<Cidr>().unwrap().is_public();
        for s in [
            "0.0.0.0/0",
            "::/0",
            "8.8.8.0/24",
            "10.0.0.0/7",
            "2001:db8::/32",
        ] {
            assert!(public(s), "{s}");
        }
        for s in [
            "10.1.0.0/16",
            "192.168.1.7/32",
            "172.16.0.0/12",
            "fd00::/8",
            "127.0.0.1/32",
        ] {
            assert!(!public(s), "{s}");
        }
    }
}
