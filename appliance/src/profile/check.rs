//! Checks that relate several sections of the profile, and the memory rule, which relates the
//! server's limits to the server's own plan of the model file (`llm-server plan --json`).
//! Each problem names the keys and the fix.

use std::path::Path;

use crate::plan::{self, ServerPlan, MIB};

use super::schema::{MemoryLimits, Profile};

/// Whole MiB holding `bytes`.
fn mib(bytes: u64) -> u64 {
    bytes.div_ceil(MIB)
}

/// What the server's process holds beyond its plan: its code and static data, thread stacks and
/// the allocator's slack. The planner counts the weights, the KV cache, the scratch buffers and
/// the vocabulary; this margin covers the rest.
pub const RUNTIME_ALLOWANCE_BYTES: u64 = 32 * MIB;

/// The problems between sections: machine and limits, earlyoom and the server's protected
/// memory, ports, egress and the metadata service.
pub(super) fn across_sections(profile: &Profile, p: &mut Vec<String>) {
    let ram = profile.machine.ram_mib;
    let policy = &profile.server.memory;
    for (key, margin) in policy.margins() {
        if margin >= ram {
            p.push(format!(
                "server.memory.{key} = {margin} is not below machine.ram_mib = {ram}: a margin \
                 is a few MiB over the plan's figure, not a machine's worth"
            ));
        }
    }
    // MemoryMax of a model of no size at all: the process's allowance and the two margins above
    // it. Saturating: a margin may be absurd (reported above), and that must stay an error.
    let max_floor = mib(RUNTIME_ALLOWANCE_BYTES)
        .saturating_add(policy.high_over_need_mib)
        .saturating_add(policy.max_over_high_mib);
    if max_floor >= ram {
        p.push(format!(
            "server.memory: MemoryMax would be at least {max_floor} MiB ({} MiB for the process \
             itself + high_over_need_mib + max_over_high_mib) even for a model of no size, and \
             machine.ram_mib is {ram}: lower the margins",
            mib(RUNTIME_ALLOWANCE_BYTES)
        ));
    }
    if policy.low_over_plan_mib > mib(RUNTIME_ALLOWANCE_BYTES) + policy.high_over_need_mib {
        p.push(format!(
            "server.memory.low_over_plan_mib = {} would put MemoryLow above MemoryHigh (the plan \
             + {} MiB for the process + high_over_need_mib = {}): lower it or raise \
             high_over_need_mib",
            policy.low_over_plan_mib,
            mib(RUNTIME_ALLOWANCE_BYTES),
            policy.high_over_need_mib
        ));
    }
    let zram = &profile.zram;
    if zram.max_mib == 0 || zram.max_mib > ram {
        p.push(format!(
            "zram.max_mib = {} must be 1 to machine.ram_mib ({ram})",
            zram.max_mib
        ));
    }

    // MemoryMin is the weights plus a margin: whatever the model, at least the margin.
    if let Some(problem) = earlyoom_blind(profile, policy.min_over_weights_mib, None) {
        p.push(problem);
    }
    // An idle box below earlyoom's term line would have earlyoom killing at rest.
    let e = &profile.earlyoom;
    let total = profile.machine.mem_total_mib;
    let term_line_mib = e.term_line(total);
    let headroom = profile.machine.headroom_mib;
    if u128::from(headroom) <= term_line_mib || headroom >= total {
        p.push(format!(
            "machine.headroom_mib = {headroom} must lie between earlyoom's term line \
             ({term_line_mib} MiB: earlyoom.mem_term_percent = {} of machine.mem_total_mib) and \
             machine.mem_total_mib = {total}: an idle box must not be where earlyoom starts \
             killing",
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

/// How far above the protected memory earlyoom's kill line must sit: what is still free or
/// reclaimable besides the protected weights when earlyoom acts. earlyoom polls up to ten times
/// a second near its lines, so this is room for an allocation burst between two polls before
/// the kernel runs out and its OOM killer (which stalls the box while it reclaims) acts first.
/// The VM test's memory-pressure check proves it on each profile: earlyoom, not the kernel,
/// kills the hog.
pub const EARLYOOM_CUSHION_MIB: u64 = 48;

/// Why earlyoom's kill line could never fire in time with `min_mib` protected (None if it can):
/// MemAvailable counts the server's page cache as available although MemoryMin keeps it from
/// being reclaimed, so the line (a share of MemTotal, as earlyoom takes it) must sit
/// [`EARLYOOM_CUSHION_MIB`] above it. `weights_mib` is the plan's, once there is one.
fn earlyoom_blind(profile: &Profile, min_mib: u64, weights_mib: Option<u64>) -> Option<String> {
    let e = &profile.earlyoom;
    let total = profile.machine.mem_total_mib;
    let kill_line = e.kill_line(total);
    let floor_mib = u128::from(min_mib) + u128::from(EARLYOOM_CUSHION_MIB);
    if kill_line >= floor_mib {
        return None;
    }
    let floor_percent = (floor_mib * 100).div_ceil(u128::from(total.max(1)));
    let protected = match weights_mib {
        Some(w) => format!(
            "MemoryMin: the model's {w} MiB of weights + server.memory.min_over_weights_mib"
        ),
        None => "at least server.memory.min_over_weights_mib, whatever the model".to_owned(),
    };
    Some(format!(
        "earlyoom.mem_kill_percent = {kill} would never fire in time: its line is {kill_line} \
         MiB ({kill} % of machine.mem_total_mib = {total}) and MemAvailable counts the server's \
         protected {min_mib} MiB ({protected}) as available, so the line must sit \
         {EARLYOOM_CUSHION_MIB} MiB above it, at {floor_mib} MiB; raise it (and \
         mem_term_percent, and machine.headroom_mib above the term line) to at least \
         {floor_percent}, or serve a smaller model",
        kill = e.mem_kill_percent
    ))
}

/// The server's limits resolved against `plan`, which must be the server's plan of the
/// profile's model at its context and slots: MemoryMin protects the weights, MemoryLow the
/// whole plan, MemoryHigh holds the whole plan plus [`RUNTIME_ALLOWANCE_BYTES`], MemoryMax sits
/// above it, each by the profile's margin. Refused when the limits leave the OS nothing, or
/// earlyoom could not see memory running short beside the protected weights.
pub(super) fn memory(profile: &Profile, plan: &ServerPlan) -> Result<MemoryLimits, Vec<String>> {
    let s = &profile.server;
    let planned_file = Path::new(&plan.model)
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or_default();
    // A store path is `<hash>-<name>`: the profile's file name ends it.
    let same_model = planned_file.ends_with(&profile.model.file);
    if !same_model || plan.ctx_size != s.ctx_size || plan.parallel != s.parallel {
        return Err(vec![format!(
            "the plan is of `{}` at {} tokens x {} slots, but the profile serves `{}` at {} x {} \
             (server.ctx_size x server.parallel): plan the profile's own with `llm-server {}`",
            plan.model,
            plan.ctx_size,
            plan.parallel,
            profile.model.file,
            s.ctx_size,
            s.parallel,
            plan::args(&profile.model.file, s.ctx_size, s.parallel).join(" ")
        )]);
    }

    // Margins are below machine.ram_mib (checked on load) and MiB of a u64 byte count are
    // below 2^44, so these sums cannot overflow.
    let m = &s.memory;
    let weights_mib = mib(plan.weights_bytes);
    let plan_mib = mib(plan.total_bytes);
    let need_mib = mib(plan.total_bytes.saturating_add(RUNTIME_ALLOWANCE_BYTES));
    let limits = MemoryLimits {
        min_mib: weights_mib + m.min_over_weights_mib,
        low_mib: plan_mib + m.low_over_plan_mib,
        high_mib: need_mib + m.high_over_need_mib,
        max_mib: need_mib + m.high_over_need_mib + m.max_over_high_mib,
    };

    let mut p = Vec::new();
    let ram = profile.machine.ram_mib;
    if limits.max_mib >= ram {
        p.push(format!(
            "the model does not fit machine.ram_mib = {ram}: MemoryMax would be {} MiB = the \
             server's {need_mib} MiB (weights {weights_mib} + KV cache {} + scratch {} + \
             vocabulary {} MiB as llm-server plans them, + {} MiB for the process itself) + \
             server.memory.high_over_need_mib {} + max_over_high_mib {}, leaving the OS nothing; \
             serve a smaller model or lower server.ctx_size/server.parallel (or the margins)",
            limits.max_mib,
            mib(plan.kv_cache_bytes),
            mib(plan.scratch_bytes),
            mib(plan.vocabulary_bytes),
            mib(RUNTIME_ALLOWANCE_BYTES),
            m.high_over_need_mib,
            m.max_over_high_mib,
        ));
    }
    if limits.min_mib > limits.low_mib {
        p.push(format!(
            "server.memory.min_over_weights_mib = {} puts MemoryMin ({} MiB) above MemoryLow \
             ({} MiB: the plan's {plan_mib} + low_over_plan_mib {}): lower it or raise \
             low_over_plan_mib",
            m.min_over_weights_mib, limits.min_mib, limits.low_mib, m.low_over_plan_mib
        ));
    }
    if let Some(problem) = earlyoom_blind(profile, limits.min_mib, Some(weights_mib)) {
        p.push(problem);
    }
    if p.is_empty() {
        Ok(limits)
    } else {
        Err(p)
    }
}
