# The arguments of `llm-server serve` (server/src/cli/serve.rs) for the `services.llm-server`
# settings, one word each. Builtins only: appliance/tests/nix_profile.rs checks them against the
# Debian image's ExecStart. (The API key file is added by the module: its path is a systemd
# specifier, which must not be escaped.)
{
  model,
  host,
  port,
  contextSize,
  parallel,
}:
[
  "serve"
  "--model"
  (toString model)
  "--host"
  host
  "--port"
  (toString port)
  "--ctx-size"
  (toString contextSize)
  "--parallel"
  (toString parallel)
]
