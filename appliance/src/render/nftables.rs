//! The nftables ruleset: default drop both ways, with an allowlist from the profile.

use crate::cidr::Cidr;
use crate::profile::Profile;

use super::header;

/// ICMP that IPv4 needs to work (path MTU discovery, errors) plus ping.
const ICMP_TYPES: &str = "echo-request, destination-unreachable, time-exceeded, parameter-problem";
/// ICMPv6 without which IPv6 breaks: errors, packet-too-big, and neighbour/router discovery.
const ICMPV6_TYPES: &str = "echo-request, destination-unreachable, packet-too-big, \
     time-exceeded, parameter-problem, nd-router-advert, nd-neighbor-solicit, \
     nd-neighbor-advert";

pub fn ruleset(profile: &Profile) -> String {
    let n = &profile.network;
    let mut sets = String::new();
    for (name, cidrs) in [
        ("ssh", &n.ssh_cidrs),
        ("api", &n.api_cidrs),
        ("egress", &n.egress_cidrs),
    ] {
        sets.push_str(&address_set(
            &format!("{name}_v4"),
            "ipv4_addr",
            cidrs,
            true,
        ));
        sets.push_str(&address_set(
            &format!("{name}_v6"),
            "ipv6_addr",
            cidrs,
            false,
        ));
    }
    format!(
        "#!/usr/sbin/nft -f\n{header}
flush ruleset

table inet appliance {{
{sets}
\tchain input {{
\t\ttype filter hook input priority filter; policy drop;
\t\tiif \"lo\" accept
\t\tct state established,related accept
\t\tct state invalid drop
\t\ticmp type {{ {ICMP_TYPES} }} accept
\t\ticmpv6 type {{ {ICMPV6_TYPES} }} accept
\t\t# DHCP answers: renewals over a UDP socket, which conntrack does not always pair.
\t\tudp sport 67 udp dport 68 accept
\t\tip6 saddr fe80::/10 udp sport 547 udp dport 546 accept
\t\ttcp dport {ssh} ip saddr @ssh_v4 accept
\t\ttcp dport {ssh} ip6 saddr @ssh_v6 accept
\t\ttcp dport {api} ip saddr @api_v4 accept
\t\ttcp dport {api} ip6 saddr @api_v6 accept
\t}}

\tchain forward {{
\t\ttype filter hook forward priority filter; policy drop;
\t}}

\tchain output {{
\t\ttype filter hook output priority filter; policy drop;
\t\toif \"lo\" accept
\t\tct state established,related accept
\t\ticmp type {{ {ICMP_TYPES} }} accept
\t\ticmpv6 type {{ {ICMPV6_TYPES} }} accept
\t\t# Ask for and renew a DHCP lease.
\t\tudp sport 68 udp dport 67 accept
\t\tudp sport 546 udp dport 547 accept
\t\tip daddr @egress_v4 accept
\t\tip6 daddr @egress_v6 accept
\t}}
}}
",
        header = header(profile, "#"),
        ssh = n.ssh_port,
        api = profile.server.api_port,
    )
}

/// A named interval set with the networks of one family (declared even when empty, so the
/// rules that use it stay the same for every profile).
fn address_set(name: &str, kind: &str, cidrs: &[Cidr], v4: bool) -> String {
    let elements: Vec<String> = cidrs
        .iter()
        .filter(|c| c.is_ipv4() == v4)
        .map(Cidr::to_string)
        .collect();
    let mut set = format!("\tset {name} {{\n\t\ttype {kind}\n\t\tflags interval\n");
    if !elements.is_empty() {
        set.push_str(&format!("\t\telements = {{ {} }}\n", elements.join(", ")));
    }
    set.push_str("\t}\n");
    set
}
