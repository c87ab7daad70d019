# The appliance in a NixOS test VM with the profile's RAM: the model loads and answers, and the
# memory and network policy is in force on the running system. The same assertions as the
# Debian image's VM tests, where they apply to a VM the test driver boots (its kernel and store
# are the host's; the OCI disk image itself is booted by `cargo xtask vm-test --image`).
{ module }:
let
  profile = builtins.fromTOML (builtins.readFile ../appliance/profiles/e2-micro.toml);
  v = import ../modules/profile.nix profile;
  port = toString v.server.port;
  # The test driver kills the whole test after `globalTimeout` seconds, 3600 by default
  # (nixpkgs nixos/lib/testing/driver.nix). The script's waits add up to more under TCG: the
  # model load (wait_for_unit, 1800 s), the completion (curl --max-time 1200) and three waits at
  # the driver's default 900 s (zram, earlyoom, nftables), 5700 s in all; two hours leaves
  # 1500 s for the boot, the other commands and the shutdown.
  timeout = 2 * 60 * 60;
in
{
  name = "llm-appliance-${v.name}";

  globalTimeout = timeout;
  # The test derivation's meta.timeout (nixos/lib/testing/meta.nix, 3600 by default), for
  # builders such as Hydra that enforce it: no shorter than the driver's own limit.
  meta.timeout = timeout;

  nodes.machine =
    { lib, ... }:
    {
      imports = [ module ];
      llm-appliance.enable = true;
      # The test instrumentation (nixos/modules/testing/test-instrumentation.nix) sets
      # vm.panic_on_oom to 2 with mkDefault, so an out-of-memory kernel panics. The appliance
      # under test must behave as it does in production, where earlyoom and the kernel's OOM
      # killer act and the kernel's default 0 holds; mkForce also wins over a plain definition.
      boot.kernel.sysctl."vm.panic_on_oom" = lib.mkForce 0;
      virtualisation = {
        memorySize = v.ramMiB;
        cores = 2;
        # The store's writable overlay would otherwise live in a tmpfs, in the 1 GB under test.
        writableStoreUseTmpfs = false;
      };
    };

  # Under TCG a token takes seconds: ask for two.
  testScript = ''
    import json
    import shlex

    start_all()

    with subtest("the server is ready once the model is loaded"):
        # Type=notify: the unit is active only after READY=1.
        machine.wait_for_unit("llm-server.service", timeout=1800)
        machine.succeed("curl --fail --silent http://127.0.0.1:${port}/health")

    with subtest("a completion"):
        body = json.dumps({"prompt": "The capital of France is", "max_tokens": 2, "temperature": 0})
        out = machine.succeed(
            "curl --fail --silent --max-time 1200 -H 'Content-Type: application/json' "
            + f"-d {shlex.quote(body)} http://127.0.0.1:${port}/v1/completions"
        )
        text = json.loads(out)["choices"][0]["text"]
        assert text.strip(), f"empty completion: {out}"

    with subtest("zram"):
        machine.wait_for_unit("systemd-zram-setup@zram0.service")
        machine.succeed("grep -q '^/dev/zram0 ' /proc/swaps")
        algorithm = machine.succeed("cat /sys/block/zram0/comp_algorithm")
        assert "[${v.zramGenerator.zram0.compression-algorithm}]" in algorithm, algorithm

    with subtest("sysctls"):
        for key, want in json.loads('${builtins.toJSON v.sysctl}').items():
            have = machine.succeed(f"sysctl --values {key}").strip()
            assert have == str(want), f"{key} = {have}, the profile says {want}"

    with subtest("earlyoom runs with the profile's arguments"):
        pid = machine.wait_until_succeeds("pgrep -x earlyoom").split()[0]
        args = machine.succeed(f"cat /proc/{pid}/cmdline").split("\0")[1:-1]
        want = json.loads('${builtins.toJSON v.earlyoomArgs}')
        assert args == want, f"earlyoom runs with {args}, the profile says {want}"

    with subtest("nftables: the appliance's ruleset and nothing else"):
        machine.wait_for_unit("nftables.service")
        table = machine.succeed("nft list table inet appliance")
        assert "policy drop" in table, table
        assert "tcp dport ${port} ip saddr @api_v4 accept" in table, table
        tables = machine.succeed("nft list tables").split("\n")
        assert [t for t in tables if t] == ["table inet appliance"], tables
        # The API port's per-source meters (appliance/src/render/nftables.rs), with the
        # profile's numbers, before the API's accept rules.
        meters = [l.strip() for l in table.splitlines() if "@api_syn_" in l or "@api_conns_" in l]
        assert len(meters) == 4, table
        for line in meters:
            assert line.startswith("tcp dport ${port} ") and line.endswith(" drop"), line
        assert "ct count over ${toString profile.network.api_connections_per_source} }" in table, table
        assert table.index("@api_conns_v6 {") < table.index("tcp dport ${port} ip saddr @api_v4 accept"), table

    with subtest("the server cannot reach the metadata service"):
        deny = machine.succeed("systemctl show llm-server --property=IPAddressDeny --value").split()
        assert "169.254.0.0/16" in deny, deny

    with subtest("the server's unit limits"):
        limits = json.loads('${builtins.toJSON v.serverUnit.limits}')
        for key, want in limits.items():
            have = machine.succeed(f"systemctl show llm-server --property={key} --value").strip()
            if isinstance(want, str) and want.endswith("M"):
                want = int(want[:-1]) * 1024 * 1024
            assert have == str(want), f"{key} = {have}, the profile says {want}"

    with subtest("appliance doctor"):
        print(machine.succeed("appliance doctor"))
        print(machine.succeed("free --mebi"))
  '';
}
