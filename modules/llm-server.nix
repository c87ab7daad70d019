# services.llm-server: llm-server's OpenAI-compatible API as a confined systemd service that is
# ready (Type=notify) only once the model is loaded. Its defaults are the shipped appliance
# profile's; the appliance policy (./appliance.nix) adds the memory limits sized for the box.
{
  config,
  lib,
  pkgs,
  utils,
  ...
}:
let
  cfg = config.services.llm-server;
  inherit (lib)
    literalExpression
    mkEnableOption
    mkIf
    mkOption
    optionalString
    types
    ;

  shipped = import ./profile.nix (
    builtins.fromTOML (builtins.readFile ../appliance/profiles/e2-micro.toml)
  );
  serveArgs = import ./serve-args.nix;

  # systemd hands the key and certificate files to the unit's dynamic user in its credentials
  # directory (%d), so the files themselves can stay root-only. Names and flags: ./credentials.nix.
  names = import ./credentials.nix;
  credentials = builtins.filter (c: c.file != null) [
    (names.apiKeys // { file = cfg.apiKeyFile; })
    (names.tlsCert // { file = cfg.tlsCertFile; })
    (names.tlsKey // { file = cfg.tlsKeyFile; })
  ];
  inStore = f: f != null && lib.hasPrefix builtins.storeDir (toString f);
in
{
  options.services.llm-server = {
    enable = mkEnableOption "llm-server, an OpenAI-compatible LLM inference server for GGUF models";

    package = mkOption {
      type = types.package;
      default = pkgs.callPackage ../nix/package.nix { crate = "server"; };
      defaultText = literalExpression ''pkgs.callPackage ./nix/package.nix { crate = "server"; }'';
      description = "The llm-server package (built for x86-64-v3).";
    };

    model = mkOption {
      type = types.path;
      default = pkgs.callPackage ../nix/model.nix { };
      defaultText = literalExpression "pkgs.callPackage ./nix/model.nix { } # the profile's model, SmolLM2-135M-Instruct Q4_1";
      example = "/var/lib/models/qwen2.5-0.5b-instruct-q4_k_m.gguf";
      description = ''
        The GGUF model file to serve. It is memory-mapped read-only, so a file in the Nix store
        works and its pages stay shared, reclaimable page cache.
      '';
    };

    host = mkOption {
      type = types.str;
      default = "127.0.0.1";
      example = "0.0.0.0";
      description = "Address to listen on. Loopback by default: opening the API is a decision.";
    };

    port = mkOption {
      type = types.port;
      default = shipped.server.port;
      description = "TCP port of the HTTP API.";
    };

    contextSize = mkOption {
      type = types.either types.ints.positive (types.enum [ "auto" ]);
      default = shipped.server.contextSize;
      example = "auto";
      description = ''
        Tokens of context per slot (`--ctx-size`), or `"auto"` for the largest context whose
        KV cache fits the unit's memory limits.
      '';
    };

    parallel = mkOption {
      type = types.ints.between 1 256;
      default = shipped.server.parallel;
      description = ''
        Requests generated at the same time (`--parallel`); each slot has its own KV cache,
        allocated at start.
      '';
    };

    apiKeyFile = mkOption {
      type = types.nullOr types.path;
      default = null;
      example = "/run/secrets/llm-api-keys";
      description = ''
        File of API keys, one per line; requests then need `Authorization: Bearer <key>`.
        Passed to the service as a systemd credential, so it may be readable by root only.
        Give it as a string: a path literal would be copied into the world-readable Nix store.
      '';
    };

    tlsCertFile = mkOption {
      type = types.nullOr types.path;
      default = null;
      example = "/var/lib/llm-secrets/tls-cert.pem";
      description = ''
        PEM certificate (chain) to serve the API over HTTPS; needs {option}`tlsKeyFile`. Passed
        as a systemd credential. Give it as a string.
      '';
    };

    tlsKeyFile = mkOption {
      type = types.nullOr types.path;
      default = null;
      example = "/var/lib/llm-secrets/tls-key.pem";
      description = ''
        PEM private key of {option}`tlsCertFile`, passed as a systemd credential so it may be
        readable by root only. Give it as a string: a path literal would be copied into the
        world-readable Nix store.
      '';
    };

    limits = mkOption {
      type = types.attrs;
      default = shipped.server.limits;
      defaultText = literalExpression "the shipped profile's [server.limits]";
      description = ''
        Rate limits, connection limits (in all and per client address), header, body, idle,
        write and lifetime timeouts, grammar and tokenize caps, default `max_tokens` and CORS
        origins, keyed as the profile's `[server.limits]` (see appliance/profiles/e2-micro.toml).
      '';
    };

    openFirewall = mkOption {
      type = types.bool;
      default = false;
      description = "Open {option}`services.llm-server.port` in the NixOS firewall.";
    };

    extraArgs = mkOption {
      type = types.listOf types.str;
      default = [ ];
      example = [
        "--threads"
        "2"
        "--queue"
        "4"
      ];
      description = "More arguments for `llm-server serve`, one word each (see `llm-server serve --help`).";
    };
  };

  config = mkIf cfg.enable {
    assertions = [
      {
        assertion = !(inStore cfg.apiKeyFile || inStore cfg.tlsKeyFile);
        message = ''
          services.llm-server.apiKeyFile or tlsKeyFile is in the Nix store, which every user can
          read: keep secrets outside it (e.g. /run/secrets) and give the path as a string.
        '';
      }
      {
        assertion = (cfg.tlsCertFile == null) == (cfg.tlsKeyFile == null);
        message = "services.llm-server: give both tlsCertFile and tlsKeyFile, or neither.";
      }
    ];

    networking.firewall.allowedTCPPorts = mkIf cfg.openFirewall [ cfg.port ];

    systemd.services.llm-server = {
      inherit (shipped.serverUnit)
        description
        after
        wantedBy
        startLimitIntervalSec
        ;
      # Defaults, so the appliance policy (another profile) or the user can change any of them.
      serviceConfig = lib.mapAttrs (_: lib.mkDefault) shipped.serverUnit.serviceConfig // {
        ExecStart =
          utils.escapeSystemdExecArgs (
            [ (lib.getExe cfg.package) ]
            ++ serveArgs {
              inherit (cfg)
                model
                host
                port
                contextSize
                parallel
                limits
                ;
            }
            ++ cfg.extraArgs
          )
          + lib.concatMapStrings (c: " ${c.flag} %d/${c.name}") credentials;
        LoadCredential = mkIf (credentials != [ ]) (map (c: "${c.name}:${toString c.file}") credentials);
      };
    };
  };
}
