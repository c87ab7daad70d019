# The appliance profile (appliance/profiles/*.toml, as `builtins.fromTOML` reads it) mapped to
# the values the NixOS modules set. Builtins only, so it evaluates without nixpkgs; the test
# appliance/tests/it/nix_profile.rs evaluates it and compares every value with what
# `appliance render` writes for the Debian image, so the two builders cannot drift apart.
#
# The profile holds the numbers; what is fixed here (the hardening, the ICMP types, the unit's
# restart policy) is the same policy the Rust renderer fixes, and the test holds them equal.
profile:
let
  inherit (profile)
    machine
    model
    server
    zram
    earlyoom
    network
    oci
    ;

  join = builtins.concatStringsSep;

  # The server's process name, always first in earlyoom's avoid list (`SERVER_PROCESS` in
  # appliance/src/paths.rs).
  serverProcess = "llm-server";

  # An anchored regex matching exactly these process names. They are letters, digits, `-` and
  # `_` (the profile loader refuses others), so none needs escaping, and no word has a space:
  # systemd splits $EARLYOOM_ARGS at whitespace.
  anyOf = names: "^(${join "|" names})$";

  isIPv4 = cidr: builtins.match ".*:.*" cidr == null;

  # ICMP that IPv4 needs (path MTU discovery, errors) plus ping; ICMPv6 without which IPv6
  # breaks: errors, packet-too-big, neighbour and router discovery.
  icmpTypes = "echo-request, destination-unreachable, time-exceeded, parameter-problem";
  icmpv6Types = join ", " [
    "echo-request"
    "destination-unreachable"
    "packet-too-big"
    "time-exceeded"
    "parameter-problem"
    "nd-router-advert"
    "nd-neighbor-solicit"
    "nd-neighbor-advert"
  ];

  # A named interval set of one family's networks, declared even when empty so the rules that
  # use it are the same for every profile.
  addressSet =
    name: kind: cidrs:
    let
      elements = if cidrs == [ ] then "" else "\t\telements = { ${join ", " cidrs} }\n";
    in
    "\tset ${name} {\n\t\ttype ${kind}\n\t\tflags interval\n${elements}\t}\n";

  addressSets = join "" (
    map
      (
        { name, cidrs }:
        addressSet "${name}_v4" "ipv4_addr" (builtins.filter isIPv4 cidrs)
        + addressSet "${name}_v6" "ipv6_addr" (builtins.filter (c: !isIPv4 c) cidrs)
      )
      [
        {
          name = "ssh";
          cidrs = network.ssh_cidrs;
        }
        {
          name = "api";
          cidrs = network.api_cidrs;
        }
        {
          name = "egress";
          cidrs = network.egress_cidrs;
        }
      ]
  );

  ssh = toString network.ssh_port;
  api = toString server.api_port;

  # The API port's per-source meters (appliance/src/render/nftables.rs): a token bucket for new
  # connections and a count of open ones, per IPv4 address and per IPv6 /64, for the sources
  # the allowlist admits; beyond them new connections are dropped (and counted) before the
  # server's accept queue. Sets hold at most 65535 sources each.
  meterSources = "65535";
  meterSets = join "" (
    map (
      { family, kind }:
      "\tset api_syn_${family} {\n\t\ttype ${kind}\n\t\tsize ${meterSources}\n\t\tflags dynamic,timeout\n\t\ttimeout 1m\n\t}\n"
      + "\tset api_conns_${family} {\n\t\ttype ${kind}\n\t\tsize ${meterSources}\n\t\tflags dynamic\n\t}\n"
    ) [
      { family = "v4"; kind = "ipv4_addr"; }
      { family = "v6"; kind = "ipv6_addr"; }
    ]
  );
  synBound = "limit rate over ${toString network.api_syn_per_source_per_sec}/second burst ${toString network.api_syn_burst} packets";
  connsBound = "ct count over ${toString network.api_connections_per_source}";
  meterRules = join "" (
    map (
      { family, source, admitted }:
      "\t\ttcp dport ${api} ${admitted} ct state new update @api_syn_${family} { ${source} ${synBound} } counter drop\n"
      + "\t\ttcp dport ${api} ${admitted} ct state new add @api_conns_${family} { ${source} ${connsBound} } counter drop\n"
    ) [
      { family = "v4"; source = "ip saddr"; admitted = "ip saddr @api_v4"; }
      { family = "v6"; source = "ip6 saddr and ffff:ffff:ffff:ffff::"; admitted = "ip6 saddr @api_v6"; }
    ]
  );

  # What the server may not reach (IPAddressDeny=; appliance/src/render/units.rs): the
  # metadata service, which hands out the box's secrets; its address alone, since the filter
  # also silences every client inside a denied network.
  serverIpDeny = [
    "${oci.metadata_address}/${if isIPv4 oci.metadata_address then "32" else "128"}"
  ];

  # The box's secrets (appliance/src/paths.rs), root-only, provisioned by llm-secrets.service.
  secretsDir = "/var/lib/llm-secrets";
  keysOn = server.api_keys != "none";
  tlsOn = server.tls != "none";
  # The systemd credentials the server loads and the flag naming each (./credentials.nix).
  names = import ./credentials.nix;
  credentials =
    (if keysOn then [ (names.apiKeys // { file = "${secretsDir}/api-keys"; }) ] else [ ])
    ++ (
      if tlsOn then
        [
          (names.tlsCert // { file = "${secretsDir}/tls-cert.pem"; })
          (names.tlsKey // { file = "${secretsDir}/tls-key.pem"; })
        ]
      else
        [ ]
    );

  # What every unit of the appliance's own is denied: capabilities, privilege changes, writes
  # outside its own directories, kernel knobs, namespaces, W^X violations, exotic syscalls. The
  # units add what differs (appliance/src/render/units.rs keeps the same three lists; the
  # render tests hold them equal).
  baseConfinement = {
    ProtectSystem = "strict";
    PrivateTmp = true;
    PrivateDevices = true;
    NoNewPrivileges = true;
    CapabilityBoundingSet = "";
    ProtectKernelTunables = true;
    ProtectKernelModules = true;
    ProtectKernelLogs = true;
    ProtectControlGroups = true;
    ProtectClock = true;
    ProtectHostname = true;
    ProtectProc = "invisible";
    RestrictNamespaces = true;
    RestrictRealtime = true;
    RestrictSUIDSGID = true;
    LockPersonality = true;
    MemoryDenyWriteExecute = true;
    SystemCallArchitectures = "native";
    SystemCallFilter = [ "@system-service" ];
    SystemCallErrorNumber = "EPERM";
    UMask = "0077";
  };

  # The server: an unprivileged dynamic user with no home, sockets for its clients and for
  # sd_notify. It keeps /proc/meminfo and its own cgroup files readable (no ProcSubset=pid;
  # ProtectControlGroups is read-only): it sizes itself against them.
  serverConfinement = baseConfinement // {
    DynamicUser = true;
    # /var/lib/llm-server: the slots' caches (serve-args.nix's --slot-save-path).
    StateDirectory = "llm-server";
    ProtectHome = true;
    RestrictAddressFamilies = [
      "AF_INET"
      "AF_INET6"
      "AF_UNIX"
    ];
    IPAddressDeny = serverIpDeny;
  };

  # The jobs that talk to the metadata service: root, but without capabilities, nothing
  # writable beyond their own directories, and no address but the metadata service's.
  metadataJobConfinement = baseConfinement // {
    PrivateMounts = true;
    ProcSubset = "pid";
    RestrictAddressFamilies = [
      "AF_INET"
      "AF_INET6"
    ];
    IPAddressDeny = "any";
    IPAddressAllow = "${oci.metadata_address}/32";
  };
in
{
  inherit (machine) name;
  hostName = machine.hostname;
  ramMiB = machine.ram_mib;

  # The model file baked into the image, checked against this hash when it is fetched.
  model = {
    inherit (model) file sha256;
    sizeBytes = model.size_bytes;
  };

  # `services.llm-server` settings: the appliance serves on every address of both families
  # (`::` takes IPv4 too, as v4-mapped addresses: net.ipv6.bindv6only is 0), the allowlist in
  # `nftablesRuleset` decides who may connect.
  server = {
    host = "::";
    port = server.api_port;
    contextSize = server.ctx_size;
    parallel = server.parallel;
    # [server.limits] as the profile spells them; ./serve-args.nix turns them into flags.
    inherit (server) limits;
    apiKeyFile = if keysOn then "${secretsDir}/api-keys" else null;
    tlsCertFile = if tlsOn then "${secretsDir}/tls-cert.pem" else null;
    tlsKeyFile = if tlsOn then "${secretsDir}/tls-key.pem" else null;
  };

  # The credentials' flags, with systemd's %d (the credentials directory), appended unescaped
  # after the escaped arguments; and the LoadCredential= values.
  credentialArgs = builtins.concatLists (map (c: [ c.flag "%d/${c.name}" ]) credentials);
  loadCredentials = map (c: "${c.name}:${c.file}") credentials;

  # `systemd.services.llm-server`: ready once the model is loaded (Type=notify), restarted
  # forever, protected in memory and confined. The confinement leaves /proc/meminfo and the
  # unit's own cgroup files readable (no ProcSubset=pid; ProtectControlGroups is read-only):
  # the server sizes itself against them.
  serverUnit = {
    description = "LLM inference server (OpenAI-compatible API)";
    after = [
      "network.target"
      "llm-secrets.service"
    ];
    # The API keys and the certificate must exist before the server reads them.
    requires = [ "llm-secrets.service" ];
    wantedBy = [ "multi-user.target" ];
    # Restart=always means forever: never give up after a burst of failures.
    startLimitIntervalSec = 0;
    serviceConfig = {
      Type = "notify";
      NotifyAccess = "main";
      Restart = "always";
      RestartSec = server.restart_sec;
      # The server's exit statuses that a restart cannot fix (server/src/exit.rs, NO_RESTART);
      # held to the renderer's copy by appliance/tests/it/nix_profile.rs.
      RestartPreventExitStatus = [
        1
        2
        3
      ];
      TimeoutStartSec = server.start_timeout_sec;
      # The server pings the watchdog at half this period while it is healthy. Always set, as
      # 0 (off) when the profile says so, so that it replaces the service module's default.
      WatchdogSec = server.watchdog_sec;
    }
    // serverConfinement;

    # Set by the appliance policy rather than the service module. The memory limits are not
    # here: they depend on the model file, so `appliance memory` resolves them at build time
    # into a drop-in (./memory-script.nix).
    limits = {
      OOMScoreAdjust = server.oom_score_adjust;
    };
  };

  # `services.zram-generator.settings`: one device, a share of RAM but capped (`ram` is in
  # MiB). Written with the generator's own keys, not through `zramSwap`, whose size expression
  # takes the cap in bytes: this way the file on the box is the Debian image's, word for word.
  zramGenerator.zram0 = {
    zram-size = "min(ram * ${toString zram.percent_of_ram} / 100, ${toString zram.max_mib})";
    compression-algorithm = zram.algorithm;
    swap-priority = zram.swap_priority;
  };

  # `boot.kernel.sysctl`, as the profile writes them.
  inherit (profile) sysctl;

  # earlyoom's arguments, one word each, as /proc/PID/cmdline shows them and `appliance
  # doctor` expects them.
  earlyoomArgs = [
    "-m"
    "${toString earlyoom.mem_term_percent},${toString earlyoom.mem_kill_percent}"
    "-s"
    "${toString earlyoom.swap_term_percent},${toString earlyoom.swap_kill_percent}"
    "--avoid"
    (anyOf ([ serverProcess ] ++ earlyoom.avoid))
  ]
  ++ (if earlyoom.prefer == [ ] then [ ] else [ "--prefer" (anyOf earlyoom.prefer) ]);

  # The whole nftables ruleset: default drop in both directions, with an allowlist.
  nftablesRuleset = ''
    # From the appliance profile `${machine.name}` by modules/profile.nix.
    flush ruleset

    table inet appliance {
    ${addressSets}${meterSets}
    	chain input {
    		type filter hook input priority filter; policy drop;
    		iif "lo" accept
    		ct state established,related accept
    		ct state invalid drop
    		icmp type { ${icmpTypes} } accept
    		icmpv6 type { ${icmpv6Types} } accept
    		# DHCP answers: renewals over a UDP socket, which conntrack does not always pair.
    		udp sport 67 udp dport 68 accept
    		ip6 saddr fe80::/10 udp sport 547 udp dport 546 accept
    		tcp dport ${ssh} ip saddr @ssh_v4 accept
    		tcp dport ${ssh} ip6 saddr @ssh_v6 accept
    ${meterRules}		tcp dport ${api} ip saddr @api_v4 accept
    		tcp dport ${api} ip6 saddr @api_v6 accept
    	}

    	chain forward {
    		type filter hook forward priority filter; policy drop;
    	}

    	chain output {
    		type filter hook output priority filter; policy drop;
    		oif "lo" accept
    		ct state established,related accept
    		icmp type { ${icmpTypes} } accept
    		icmpv6 type { ${icmpv6Types} } accept
    		# Ask for and renew a DHCP lease.
    		udp sport 68 udp dport 67 accept
    		udp sport 546 udp dport 547 accept
    		ip daddr @egress_v4 accept
    		ip6 daddr @egress_v6 accept
    	}
    }
  '';

  # `services.openssh`: keys only; root logs in with the keys OCI hands out.
  openssh = {
    ports = [ network.ssh_port ];
    settings = {
      PermitRootLogin = "prohibit-password";
      PasswordAuthentication = false;
      KbdInteractiveAuthentication = false;
    };
  };

  # Root's SSH keys from OCI's metadata service (IMDS v2) at every boot: fetched into a private
  # runtime directory, parsed by ssh-keygen, and only then installed, so an error page or an
  # unreachable service never locks the owner out. Commands by program name; the module puts
  # the store paths in.
  sshKeys = {
    description = "Fetch root's SSH keys from the OCI instance metadata service";
    runtimeDirectory = "oci-ssh-keys";
    commands = [
      [
        "curl"
        "--fail"
        "--silent"
        "--show-error"
        "--retry"
        "10"
        "--retry-delay"
        "3"
        "--retry-all-errors"
        "--connect-timeout"
        "5"
        "--max-time"
        "20"
        "-H"
        "Authorization: Bearer Oracle"
        "-o"
        "/run/oci-ssh-keys/authorized_keys"
        "http://${oci.metadata_address}/opc/v2/instance/metadata/ssh_authorized_keys"
      ]
      [
        "ssh-keygen"
        "-l"
        "-f"
        "/run/oci-ssh-keys/authorized_keys"
      ]
      [
        "install"
        "-d"
        "-m"
        "0700"
        "/root/.ssh"
      ]
      [
        "install"
        "-m"
        "0600"
        "/run/oci-ssh-keys/authorized_keys"
        "/root/.ssh/authorized_keys"
      ]
    ];
  };

  # llm-secrets.service: the API keys and the TLS certificate from the metadata when the launch
  # gives them (and the profile allows it), else made at first boot and kept (`appliance
  # secrets`, which reads the profile installed at /etc/llm-appliance/profile.toml).
  secrets = {
    description = "Provision the LLM API's keys and TLS certificate";
    wants = [ "network-online.target" ];
    after = [ "network-online.target" ];
    before = [ "llm-server.service" ];
    stateDirectory = "llm-secrets";
    command = [
      "appliance"
      "secrets"
      "--profile"
      "/etc/llm-appliance/profile.toml"
    ];
    serviceConfig = metadataJobConfinement // {
      ProtectHome = true;
      StandardOutput = "journal+console";
    };
  };

  # The SSH key job's confinement: it writes root's keys and nothing else.
  sshKeysConfinement = metadataJobConfinement // {
    ReadWritePaths = "/root";
  };

  # The memory the OS uses once its own services are up and before the server starts, printed
  # to the journal and the serial console (OCI's console history, the VM tests).
  memoryBaseline = {
    description = "Record the memory the OS uses before the LLM server starts";
    after = [
      "sshd.service"
      "earlyoom.service"
      "nftables.service"
      "systemd-networkd.service"
      "systemd-logind.service"
    ];
    before = [ "llm-server.service" ];
    command = [
      "free"
      "--mebi"
    ];
  };

  # `services.journald`: on disk, not in /run (a tmpfs: RAM the server could use).
  journald = {
    Storage = "persistent";
    SystemMaxUse = "128M";
    RuntimeMaxUse = "8M";
  };
}
