# The arguments of `llm-server plan --json` (server/src/cli/plan.rs) that plan the profile's
# model at its context and slots, one word each: the same words `cargo xtask image` runs the
# planner with (appliance/src/plan.rs; appliance/tests/it/nix_profile.rs holds them equal).
# Builtins only.
{
  model,
  contextSize,
  parallel,
}:
[
  "plan"
  "--json"
  "--model"
  (toString model)
  "--ctx-size"
  (toString contextSize)
  "--parallel"
  (toString parallel)
]
