//! Checks that relate several sections of the profile, and the memory rule, which relates the
//! server's limits to the server's own plan of the model file (`llm-server plan --json`).
//! Each problem names the keys and the fix.

use std::path::Path;

use crate::plan::{self, ServerPlan, MIB};

use super::schema::Profile;

/// What the server's process holds beyond its plan: its code and static data, thread stacks and
/// the allocator's slack. The planner counts the weights, the KV cache, the scratch buffers and
/// the vocabulary; this margin covers the rest.
pub const RUNTIME_ALLOWANCE_BYTES: u64 = 32 * MIB;

/// The problems between sections: machine and limits, earlyoom and the server's protected
/// memory, ports, egress and the metadata service.
pub(super) fn across_sections(profile: &Profile, p: &mut Vec<String>) {
    let ram = profile.machine.ram_mib;
    let memory = &profile.server.memory;
    if memory.max_mib >= ram {
        p.push(format!(
            "server.memory.max_mib = {} leaves nothing of machine.ram_mib = {ram} for the OS: \
             lower it",
            memory.max_mib
        ));
    }
    let zram = &profile.zram;
    if zram.max_mib == 0 || zram.max_mib > ram {
        p.push(format!(
            "zram.max_mib = {} must be 1 to machine.ram_mib ({ram})",
            zram.max_mib
        ));
    }

    let e = &profile.earlyoom;
    // MemAvailable counts the server's page cache as available although MemoryMin keeps it from
    // being reclaimed, so below this share earlyoom would never see memory running short. A
    // tenth of RAM on top covers MemTotal being below the RAM size and the kernel's own
    // reserves. In u128, which no product of two u64 overflows: the values may be absurd here
    // (their sections report that), and must give an error, not a wrap or a panic.
    let ram_wide = u128::from(ram.max(1));
    let floor_mib = u128::from(memory.min_mib) + ram_wide / 10;
    let floor_percent = (floor_mib * 100).div_ceil(ram_wide);
    if u128::from(e.mem_kill_percent) * ram_wide < floor_mib * 100 {
        p.push(format!(
            "earlyoom.mem_kill_percent = {} would never fire: MemAvailable counts the server's \
             protected {} MiB (server.memory.min_mib) as available; raise it (and \
             mem_term_percent) to at least {floor_percent}",
            e.mem_kill_percent, memory.min_mib
        ));
    }
    // An idle box below earlyoom's term line would have earlyoom killing at rest.
    let term_line_mib = u128::from(e.mem_term_percent) * ram_wide / 100;
    let headroom = profile.machine.headroom_mib;
    if u128::from(headroom) <= term_line_mib || headroom >= ram {
        p.push(format!(
            "machine.headroom_mib = {headroom} must lie between earlyoom's term line \
             ({term_line_mib} MiB: earlyoom.mem_term_percent = {} of machine.ram_mib) and \
             machine.ram_mib = {ram}: an idle box must not be where earlyoom starts killing",
            e.mem_term_percent
        ));
    }

    let n = &profile.network;
    if n.ssh_port == profile.server.api_port {
        p.push(format!(
            "network.ssh_port and server.api_port are both {}: pick different ports",
            n.ssh_port
        ));
    }
    // The server sheds a source's connections beyond its own cap with an answer naming the
    // limit; the kernel's meter drops silently. It is the backstop, so it must not bind first.
    let per_ip = profile.server.limits.max_connections_per_ip;
    if n.api_connections_per_source < per_ip {
        p.push(format!(
            "network.api_connections_per_source = {} is below \
             server.limits.max_connections_per_ip = {per_ip}: nftables would drop a client's \
             connections before the server can answer it naming the limit; raise it to at \
             least {per_ip}",
            n.api_connections_per_source
        ));
    }
    keys_and_tls(profile, p);

    let metadata = profile.oci.metadata_address;
    if !n.egress_cidrs.iter().any(|c| c.contains(metadata)) {
        p.push(format!(
            "network.egress_cidrs does not include oci.metadata_address {metadata}: the box \
             could not fetch its SSH keys; add `{metadata}/32`"
        ));
    }
}

/// An API without keys or without TLS is refused when the firewall admits the public internet:
/// anyone who finds the address would get free compute (or read every prompt).
fn keys_and_tls(profile: &Profile, p: &mut Vec<String>) {
    let s = &profile.server;
    let public: Vec<String> = profile
        .network
        .api_cidrs
        .iter()
        .filter(|c| c.is_public())
        .map(ToString::to_string)
        .collect();
    if public.is_empty() {
        return;
    }
    if !s.api_keys.enabled() {
        p.push(format!(
            "server.api_keys = \"none\" leaves the API open to the public internet \
             (network.api_cidrs has {}): use \"metadata\" or \"generate\", or admit only \
             private networks in network.api_cidrs",
            public.join(", ")
        ));
    }
    if !s.tls.enabled() {
        p.push(format!(
            "server.tls = \"none\" sends keys and prompts in clear text across the public \
             internet (network.api_cidrs has {}): use \"self-signed\" or \"metadata\", or \
             admit only private networks in network.api_cidrs",
            public.join(", ")
        ));
    }
}

/// The server's limits against `plan`, which must be the server's plan of the profile's model
/// at its context and slots: MemoryMin protects the weights, MemoryLow the whole plan, and
/// MemoryHigh holds the whole plan plus [`RUNTIME_ALLOWANCE_BYTES`].
pub(super) fn memory(profile: &Profile, plan: &ServerPlan) -> Vec<String> {
    let s = &profile.server;
    let planned_file = Path::new(&plan.model)
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or_default();
    // A store path is `<hash>-<name>`: the profile's file name ends it.
    let same_model = planned_file.ends_with(&profile.model.file);
    if !same_model || plan.ctx_size != s.ctx_size || plan.parallel != s.parallel {
        return vec![format!(
            "the plan is of `{}` at {} tokens x {} slots, but the profile serves `{}` at {} x {} \
             (server.ctx_size x server.parallel): plan the profile's own with `llm-server {}`",
            plan.model,
            plan.ctx_size,
            plan.parallel,
            profile.model.file,
            s.ctx_size,
            s.parallel,
            plan::args(&profile.model.file, s.ctx_size, s.parallel).join(" ")
        )];
    }

    let mut p = Vec::new();
    let m = &s.memory;
    let mib = |bytes: u64| bytes.div_ceil(MIB);
    let weights_mib = mib(plan.weights_bytes);
    if m.min_mib < weights_mib {
        p.push(format!(
            "server.memory.min_mib = {} does not protect the model's {weights_mib} MiB of \
             weights from reclaim: raise it to at least {weights_mib}",
            m.min_mib
        ));
    }
    let plan_mib = mib(plan.total_bytes);
    if m.low_mib < plan_mib {
        p.push(format!(
            "server.memory.low_mib = {} protects less than the server's {plan_mib} MiB plan \
             (weights, KV cache, scratch, vocabulary): raise it to at least {plan_mib}",
            m.low_mib
        ));
    }
    let need_mib = mib(plan.total_bytes.saturating_add(RUNTIME_ALLOWANCE_BYTES));
    if need_mib > m.high_mib {
        p.push(format!(
            "server.memory.high_mib = {} cannot hold the model: the server needs {need_mib} MiB \
             (weights {} + KV cache {} + scratch {} + vocabulary {} MiB as llm-server plans them, \
             + {} MiB for the process itself); raise high_mib/max_mib or lower \
             server.ctx_size/server.parallel",
            m.high_mib,
            weights_mib,
            mib(plan.kv_cache_bytes),
            mib(plan.scratch_bytes),
            mib(plan.vocabulary_bytes),
            mib(RUNTIME_ALLOWANCE_BYTES),
        ));
    }
    p
}
