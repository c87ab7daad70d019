//! The memory stack: zram, sysctls, earlyoom, and the server unit's limits.

use crate::profile::{MemoryLimits, Profile};

use super::header;

/// `zram-generator.conf`: one zstd device, a share of RAM but capped (`ram` is in MiB).
pub fn zram_generator(profile: &Profile) -> String {
    let z = &profile.zram;
    format!(
        "{}\n[zram0]\nzram-size = min(ram * {} / 100, {})\ncompression-algorithm = {}\nswap-priority = {}\n",
        header(profile, "#"),
        z.percent_of_ram,
        z.max_mib,
        z.algorithm,
        z.swap_priority
    )
}

/// A `sysctl.d` file, keys in sorted order.
pub fn sysctl(profile: &Profile) -> String {
    let mut out = header(profile, "#");
    out.push('\n');
    for (key, value) in &profile.sysctl {
        out.push_str(&format!("{key} = {value}\n"));
    }
    out
}

/// earlyoom's command-line arguments, one word each (as `/proc/PID/cmdline` shows them).
pub fn earlyoom_args(profile: &Profile) -> Vec<String> {
    let e = &profile.earlyoom;
    let mut args = vec![
        "-m".to_owned(),
        format!("{},{}", e.mem_term_percent, e.mem_kill_percent),
        "-s".to_owned(),
        format!("{},{}", e.swap_term_percent, e.swap_kill_percent),
        "--avoid".to_owned(),
        any_of(e.avoided()),
    ];
    if !e.prefer.is_empty() {
        args.push("--prefer".to_owned());
        args.push(any_of(e.prefer.iter().map(String::as_str)));
    }
    args
}

/// An anchored regex matching exactly these names. Profile names are letters, digits, `-` and
/// `_`, none special in a regex, and contain no spaces: systemd splits `$EARLYOOM_ARGS` at
/// whitespace without honouring quotes, so the words must need none.
fn any_of<'a>(names: impl Iterator<Item = &'a str>) -> String {
    format!("^({})$", names.collect::<Vec<_>>().join("|"))
}

/// `/etc/default/earlyoom`, read by Debian's `earlyoom.service` as `$EARLYOOM_ARGS`.
pub fn earlyoom_defaults(profile: &Profile) -> String {
    format!(
        "{}\nEARLYOOM_ARGS='{}'\n",
        header(profile, "#"),
        earlyoom_args(profile).join(" ")
    )
}

/// The server unit's drop-in with its memory limits, resolved from the profile's policy against
/// the server's plan of the model ([`Profile::memory_limits`]). The one text both builders
/// install: `cargo xtask image` through [`super::planned`], the NixOS module by running
/// `appliance memory`.
pub fn server_limits(profile: &Profile, limits: &MemoryLimits) -> String {
    format!(
        "# Rendered by `appliance memory` from the profile `{}` and the server's plan of its model.\n\
         # Do not edit: change the profile's [server.memory] and build the image again.\n\
         # The memory-mapped weights are page cache charged to the unit: MemoryMin keeps them\n\
         # resident whatever else runs.\n\
         [Service]\n\
         MemoryMin={}M\n\
         MemoryLow={}M\n\
         MemoryHigh={}M\n\
         MemoryMax={}M\n",
        profile.machine.name, limits.min_mib, limits.low_mib, limits.high_mib, limits.max_mib
    )
}
