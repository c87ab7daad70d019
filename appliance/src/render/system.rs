//! The rest of the base system: SSH daemon policy, host names, network and journal.

use crate::profile::Profile;

use super::header;

/// Keys only; root logs in with the keys OCI hands out (see the key-fetching unit).
pub fn sshd(profile: &Profile) -> String {
    format!(
        "{}\nPort {}\nPermitRootLogin prohibit-password\nPasswordAuthentication no\n\
         KbdInteractiveAuthentication no\n",
        header(profile, "#"),
        profile.network.ssh_port
    )
}

pub fn hosts(profile: &Profile) -> String {
    format!(
        "{}\n127.0.0.1\tlocalhost\n127.0.1.1\t{}\n::1\tlocalhost ip6-localhost ip6-loopback\n",
        header(profile, "#"),
        profile.machine.hostname
    )
}

/// DHCP on the first Ethernet interface, whatever the hypervisor calls it.
pub fn network(profile: &Profile) -> String {
    format!(
        "{}\n[Match]\nName=en* eth*\n\n[Network]\nDHCP=yes\n",
        header(profile, "#")
    )
}

/// The journal lives on disk: the default for a system without /var/log/journal keeps it in
/// /run, a tmpfs, which is RAM the server could use.
pub fn journald(profile: &Profile) -> String {
    format!(
        "{}\n[Journal]\nStorage=persistent\nSystemMaxUse=128M\nRuntimeMaxUse=8M\n",
        header(profile, "#")
    )
}
