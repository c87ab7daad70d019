# llm-appliance: the appliance policy from its profile (appliance/profiles/*.toml), the same
# files the Debian image installs, as NixOS options: the server's service and memory limits,
# zram, sysctls, earlyoom, the nftables allowlist, SSH keys from OCI's metadata service, and
# the profile itself for `appliance doctor`. ./profile.nix does the mapping. The memory limits
# are resolved against the server's own plan of the model at build time by `appliance memory`
# (./memory-script.nix), as for the Debian image.
{
  config,
  lib,
  pkgs,
  utils,
  ...
}:
let
  cfg = config.llm-appliance;
  inherit (lib)
    concatStringsSep
    literalExpression
    mapAttrsToList
    mkDefault
    mkEnableOption
    mkForce
    mkIf
    mkOption
    types
    ;
  v = cfg.values;

  # The programs the profile's commands name, from the store.
  programs = {
    curl = "${pkgs.curl}/bin/curl";
    ssh-keygen = "${config.programs.ssh.package}/bin/ssh-keygen";
    install = "${pkgs.coreutils}/bin/install";
    free = "${pkgs.procps}/bin/free";
    appliance = lib.getExe cfg.package;
  };
  command =
    words: utils.escapeSystemdExecArgs ([ programs.${builtins.head words} ] ++ builtins.tail words);

  # The profile's memory policy, resolved at build time as `cargo xtask image` resolves it: the
  # server plans the real model file and `appliance memory` turns the profile's margins over
  # that plan into the unit's MemoryMin/Low/High/Max drop-in (./memory-script.nix), so a model
  # that cannot fit the machine fails the build with the reason and the planner's table. Both
  # programs run on the builder, which needs x86-64-v3 like the box (the server refuses an older
  # CPU with exit status 3).
  server = config.services.llm-server;
  planArgs = import ./plan-args.nix {
    inherit (server) model;
    inherit (v.server) contextSize parallel;
  };
  memory = pkgs.runCommand "llm-appliance-${v.name}-memory" { } (
    import ./memory-script.nix {
      server = lib.getExe server.package;
      appliance = lib.getExe cfg.package;
      inherit (cfg) profile;
      inherit planArgs;
    }
  );
in
{
  options.llm-appliance = {
    enable = mkEnableOption "the LLM appliance's policy (memory stack, firewall, server limits) from its profile";

    profile = mkOption {
      type = types.path;
      default = ../appliance/profiles/e2-micro.toml;
      defaultText = literalExpression "./appliance/profiles/e2-micro.toml";
      description = ''
        The appliance profile: every value of the policy comes from it. `appliance check
        --profile FILE` tells whether its numbers fit together; the build also resolves its
        memory policy against the server's plan of the model (`appliance memory --plan`).
      '';
    };

    package = mkOption {
      type = types.package;
      default = pkgs.callPackage ../nix/package.nix { crate = "appliance"; };
      defaultText = literalExpression ''pkgs.callPackage ./nix/package.nix { crate = "appliance"; }'';
      description = "The `appliance` command, whose `appliance doctor` checks the box against the profile.";
    };

    values = mkOption {
      type = types.raw;
      readOnly = true;
      internal = true;
      description = "The profile mapped to NixOS values by modules/profile.nix.";
    };
  };

  config = lib.mkMerge [
    { llm-appliance.values = import ./profile.nix (import ./read-profile.nix cfg.profile); }

    (mkIf cfg.enable {
      assertions = [
        {
          assertion = !config.services.llm-server.openFirewall;
          message = ''
            services.llm-server.openFirewall does nothing under llm-appliance: the appliance's
            nftables ruleset replaces the NixOS firewall and admits the API from the profile's
            network.api_cidrs. Change those instead.
          '';
        }
      ];

      # The profile's, over the mkDefault of nixpkgs' test driver (the node's name).
      networking.hostName = v.hostName;

      # The server unit's memory limits: the drop-in `appliance memory` wrote, which NixOS links
      # from the package's lib/systemd/system/llm-server.service.d/ into /etc/systemd/system
      # (systemd.packages), where the Debian image installs the same text.
      systemd.packages = [ memory ];

      # The box carries its own policy: `appliance doctor` reads it from here, and resolves the
      # limits it checks from the profile and the build's plan of the model.
      environment.etc."llm-appliance/profile.toml".source = cfg.profile;
      environment.etc."llm-appliance/plan.json".source = "${memory}/share/llm-appliance/plan.json";
      environment.systemPackages = [ cfg.package ];

      services.llm-server = {
        enable = true;
        host = mkDefault v.server.host;
        port = mkDefault v.server.port;
        contextSize = mkDefault v.server.contextSize;
        parallel = mkDefault v.server.parallel;
        limits = mkDefault v.server.limits;
        # Provisioned by llm-secrets.service below, root-only, as the profile says.
        apiKeyFile = mkDefault v.server.apiKeyFile;
        tlsCertFile = mkDefault v.server.tlsCertFile;
        tlsKeyFile = mkDefault v.server.tlsKeyFile;
        model = mkDefault (pkgs.callPackage ../nix/model.nix { inherit (cfg) profile; });
      };
      # This profile's unit settings over the service module's defaults, and OOMScoreAdjust (the
      # memory limits come in the drop-in above).
      systemd.services.llm-server.serviceConfig = v.serverUnit.serviceConfig // v.serverUnit.limits;
      # Its keys and certificate come from llm-secrets.service below (the service module alone
      # has no such unit to require).
      systemd.services.llm-server.requires = v.serverUnit.requires;

      services.zram-generator = {
        enable = true;
        settings = v.zramGenerator;
      };
      boot.kernel.sysctl = v.sysctl;

      services.earlyoom.enable = true;
      # Exactly the profile's arguments, as `appliance doctor` checks them: the NixOS module
      # would add `-r 3600` and shell-quote the regexes, which systemd's word splitting of
      # $EARLYOOM_ARGS does not undo. The words contain no whitespace (see profile.nix).
      systemd.services.earlyoom.environment.EARLYOOM_ARGS = mkForce (concatStringsSep " " v.earlyoomArgs);
      # earlyoom is the one user-space killer: systemd-oomd would be a second daemon in 1 GB,
      # acting on pressure instead of the thresholds the profile sets.
      systemd.oomd.enable = false;

      # The appliance's ruleset is the whole firewall (default drop both ways), so the NixOS
      # firewall, which only filters input, stands down.
      networking.firewall.enable = false;
      networking.nftables = {
        enable = true;
        ruleset = v.nftablesRuleset;
      };

      services.openssh = {
        enable = true;
        inherit (v.openssh) ports settings;
      };

      systemd.services.oci-ssh-keys = {
        inherit (v.sshKeys) description;
        wants = [ "network-online.target" ];
        after = [ "network-online.target" ];
        wantedBy = [ "multi-user.target" ];
        serviceConfig = {
          Type = "oneshot";
          RemainAfterExit = true;
          RuntimeDirectory = v.sshKeys.runtimeDirectory;
          RuntimeDirectoryMode = "0700";
          ExecStart = map command v.sshKeys.commands;
        }
        // v.sshKeysConfinement;
      };

      # The API keys and the TLS certificate, before the server (`appliance secrets`).
      systemd.services.llm-secrets = {
        inherit (v.secrets)
          description
          wants
          after
          before
          ;
        wantedBy = [ "multi-user.target" ];
        serviceConfig = {
          Type = "oneshot";
          RemainAfterExit = true;
          StateDirectory = v.secrets.stateDirectory;
          StateDirectoryMode = "0700";
          ExecStart = command v.secrets.command;
        }
        // v.secrets.serviceConfig;
      };

      # The login banner names the key's file and the certificate's fingerprint on Debian
      # (update-motd.d); NixOS's motd is static, so it points at the doctor instead.
      users.motd = "LLM appliance: `appliance doctor` prints the API key and the TLS certificate's fingerprint.";

      systemd.services.memory-baseline = {
        inherit (v.memoryBaseline) description after before;
        wantedBy = [ "multi-user.target" ];
        serviceConfig = {
          Type = "oneshot";
          ExecStart = command v.memoryBaseline.command;
          StandardOutput = "journal+console";
        };
      };

      services.journald = {
        storage = v.journald.Storage;
        extraConfig = concatStringsSep "\n" (
          mapAttrsToList (key: value: "${key}=${value}") (removeAttrs v.journald [ "Storage" ])
        );
      };
    })
  ];
}
