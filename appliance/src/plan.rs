//! The server's memory plan for the profile's model, as the server itself computes it:
//! `llm-server plan --json` run on the real model file. The appliance keeps no estimate of its
//! own; the image builders (`cargo xtask image`, the NixOS module) run the planner at build
//! time with [`args`] and hold the profile's limits to the result (`check::memory`).

use serde::Deserialize;

pub const MIB: u64 = 1 << 20;

/// The arguments of `llm-server plan` that plan `model` with `ctx_size` tokens for each of
/// `parallel` slots, as JSON. `modules/plan-args.nix` gives the NixOS module the same words
/// (appliance/tests/it/nix_profile.rs holds them equal).
pub fn args(model: &str, ctx_size: u32, parallel: u32) -> Vec<String> {
    [
        "plan",
        "--json",
        "--model",
        model,
        "--ctx-size",
        &ctx_size.to_string(),
        "--parallel",
        &parallel.to_string(),
    ]
    .map(str::to_owned)
    .to_vec()
}

/// What `llm-server plan --json` prints (server/src/cli/plan.rs), the parts the appliance uses.
/// Other keys (the planning host's own limits and verdict) are ignored: they describe the
/// machine that ran the planner, not the box.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
pub struct ServerPlan {
    /// The model file as the planner was given it.
    pub model: String,
    /// Tokens of context per slot, and slots, as planned.
    pub ctx_size: u32,
    pub parallel: u32,
    /// Tensor bytes: the memory-mapped weights, page cache charged to the server's cgroup.
    pub weights_bytes: u64,
    /// KV caches of every slot (anonymous).
    pub kv_cache_bytes: u64,
    /// Activations, logits and sampler buffers of every slot (anonymous).
    pub scratch_bytes: u64,
    /// The vocabulary and its lookup tables (anonymous).
    pub vocabulary_bytes: u64,
    pub total_bytes: u64,
}

#[derive(Debug, thiserror::Error)]
#[error("not the output of `llm-server plan --json`: {0}")]
pub struct PlanError(#[from] serde_json::Error);

impl ServerPlan {
    pub fn parse(json: &str) -> Result<ServerPlan, PlanError> {
        Ok(serde_json::from_str(json)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_planners_output_parses_and_unknown_keys_are_ignored() {
        let json = r#"{
            "model": "/m/gemma.gguf", "ctx_size": 2048, "parallel": 2, "n_ctx_train": 32768,
            "weights_bytes": 1, "kv_cache_bytes": 2, "scratch_bytes": 3, "vocabulary_bytes": 4,
            "total_bytes": 10, "limits": [{"source": "host", "bytes": 5}], "fits": true
        }"#;
        let plan = ServerPlan::parse(json).unwrap();
        assert_eq!(
            (plan.ctx_size, plan.parallel, plan.total_bytes),
            (2048, 2, 10)
        );
        assert_eq!(plan.model, "/m/gemma.gguf");
        let e = ServerPlan::parse(r#"{"model": "m"}"#)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("llm-server plan --json") && e.contains("ctx_size"),
            "{e}"
        );
    }

    #[test]
    fn args_ask_for_json() {
        assert_eq!(
            args("/m.gguf", 2048, 2).join(" "),
            "plan --json --model /m.gguf --ctx-size 2048 --parallel 2"
        );
    }
}
