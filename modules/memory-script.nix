# The build step that resolves the profile's memory policy against the real model file, as a
# shell script (builtins only, so appliance/tests/it/nix_profile.rs evaluates it and runs it
# with bash): the server plans the file (`llm-server plan --json`, ./plan-args.nix), and
# `appliance memory` turns the profile's [server.memory] margins over that plan into the server
# unit's MemoryMin/Low/High/Max drop-in. The arithmetic is the Rust side's alone
# (`Profile::memory_limits`), the same `cargo xtask image` runs. The output is a package for
# `systemd.packages`, whose `lib/systemd/system/<unit>.d/` NixOS links into
# /etc/systemd/system, and the plan for `appliance doctor`.
{
  # The two programs, as paths.
  server,
  appliance,
  profile,
  planArgs,
}:
let
  # A path is interpolated, not `toString`ed, so that it is copied to the store and the builder
  # can read it.
  text = s: if builtins.isPath s then "${s}" else toString s;
  q = s: "'${builtins.replaceStrings [ "'" ] [ "'\\''" ] (text s)}'";
  words = ws: builtins.concatStringsSep " " (map q ws);
  # The planner's own table (its arguments without --json), printed when the model cannot fit.
  tableArgs = builtins.filter (a: a != "--json") planArgs;
in
''
  set -eu
  # Status 2 only says the plan does not fit the builder's own memory, which is not the box's.
  ${q server} ${words planArgs} > plan.json || [ $? -eq 2 ]
  if ! ${q appliance} memory --profile ${q profile} --plan plan.json > memory.conf; then
    ${q server} ${words tableArgs} >&2 || true
    exit 1
  fi
  mkdir -p "$out/lib/systemd/system/llm-server.service.d" "$out/share/llm-appliance"
  mv memory.conf "$out/lib/systemd/system/llm-server.service.d/memory.conf"
  mv plan.json "$out/share/llm-appliance/plan.json"
''
