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

/// Sources each per-source meter tracks at most, which bounds the kernel memory an attacker
/// with many addresses can make the meters take. A source beyond it is not metered (the set is
/// full, so the rule does not match) and meets the server's own caps.
const METER_SOURCES: u32 = 65535;
/// The part of an IPv6 source the meters key on: its /64, the smallest network a host is
/// usually given, so an attacker does not get a fresh budget per address.
const V6_SOURCE: &str = "ip6 saddr and ffff:ffff:ffff:ffff::";

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
    sets.push_str(&meter_sets());
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
{meters}\t\ttcp dport {api} ip saddr @api_v4 accept
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
        meters = meter_rules(profile),
    )
}

/// The dynamic sets the API port's meters keep per source: a token bucket for new connections
/// (forgotten a minute after the source's last one) and a count of its tracked connections
/// (an element goes once its connections are gone).
fn meter_sets() -> String {
    let mut sets = String::new();
    for (name, kind) in [("v4", "ipv4_addr"), ("v6", "ipv6_addr")] {
        sets.push_str(&format!(
            "\tset api_syn_{name} {{\n\t\ttype {kind}\n\t\tsize {METER_SOURCES}\n\t\t\
             flags dynamic,timeout\n\t\ttimeout 1m\n\t}}\n\
             \tset api_conns_{name} {{\n\t\ttype {kind}\n\t\tsize {METER_SOURCES}\n\t\t\
             flags dynamic\n\t}}\n"
        ));
    }
    sets
}

/// Per source, on the API port, for the sources the allowlist admits: new connections beyond
/// the SYN rate, then beyond the open-connection count, are dropped (counted) before the
/// server's accept queue. Dropped, not rejected: a reset would need its own way out through the
/// output chain, and a client that retries its SYN gets in once it is back under the limits.
fn meter_rules(profile: &Profile) -> String {
    let n = &profile.network;
    let api = profile.server.api_port;
    let rate = format!(
        "limit rate over {}/second burst {} packets",
        n.api_syn_per_source_per_sec, n.api_syn_burst
    );
    let count = format!("ct count over {}", n.api_connections_per_source);
    let mut rules = String::from(
        "\t\t# The API's per-source meters (an IPv4 address, an IPv6 /64): SYN rate, open connections.\n",
    );
    for (family, source, admitted) in [
        ("v4", "ip saddr", "ip saddr @api_v4"),
        ("v6", V6_SOURCE, "ip6 saddr @api_v6"),
    ] {
        for (op, set, bound) in [("update", "syn", &rate), ("add", "conns", &count)] {
            rules.push_str(&format!(
                "\t\ttcp dport {api} {admitted} ct state new \
                 {op} @api_{set}_{family} {{ {source} {bound} }} counter drop\n"
            ));
        }
    }
    rules
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
