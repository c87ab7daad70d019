# The arguments of `llm-server serve` (server/src/cli/serve.rs) for the `services.llm-server`
# settings, one word each. Builtins only: appliance/tests/it/nix_profile.rs checks them against the
# Debian image's ExecStart. (The key and certificate files are added by the module: their paths
# are systemd specifiers, which must not be escaped.) `limits` is the profile's [server.limits].
{
  model,
  host,
  port,
  contextSize,
  parallel,
  limits,
  ...
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
  "--slot-save-path"
  "/var/lib/llm-server/slots"
  "--wait-for-memory"
  "120"
  "--rate-limit-key"
  (toString limits.rate_per_key_per_min)
  "--rate-limit-ip"
  (toString limits.rate_per_ip_per_min)
  "--rate-burst"
  (toString limits.burst)
  "--max-connections"
  (toString limits.max_connections)
  "--header-timeout"
  (toString limits.header_timeout_sec)
  "--body-timeout"
  (toString limits.body_timeout_sec)
  "--default-max-tokens"
  (toString limits.default_max_tokens)
  "--engine-stall-timeout"
  (toString limits.engine_stall_sec)
  "--max-connections-per-ip"
  (toString limits.max_connections_per_ip)
  "--idle-timeout"
  (toString limits.idle_timeout_sec)
  "--write-timeout"
  (toString limits.write_timeout_sec)
  "--max-connection-age"
  (toString limits.max_connection_age_sec)
  "--max-grammar-bytes"
  (toString limits.max_grammar_bytes)
  "--max-tokenize-bytes"
  (toString limits.max_tokenize_bytes)
  "--grammar-timeout"
  (toString limits.grammar_timeout_sec)
  "--grammar-compiles"
  (toString limits.grammar_compiles)
]
++ builtins.concatLists (
  map (origin: [
    "--cors-origin"
    origin
  ]) limits.cors_origins
)
