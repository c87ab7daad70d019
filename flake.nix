{
  description = "A 1 GB LLM appliance: llm-server and the NixOS image for Oracle Cloud's VM.Standard.E2.1.Micro";

  # One stable release commit: nixos-26.05 as of 2026-09-11 (26.05.20260911.21a67dc), with
  # rustc 1.95. The first `nix build` records it with its narHash in flake.lock; commit that.
  inputs.nixpkgs.url = "github:NixOS/nixpkgs/21a67dc470149f337cecafbe965d8d252a390518";

  outputs =
    { self, nixpkgs }:
    let
      # x86-64-v3 binaries for an AMD EPYC: one system only.
      system = "x86_64-linux";
      pkgs = nixpkgs.legacyPackages.${system};
    in
    {
      packages.${system} = {
        llm-server = pkgs.callPackage ./nix/package.nix { crate = "server"; };
        appliance = pkgs.callPackage ./nix/package.nix { crate = "appliance"; };
        model = pkgs.callPackage ./nix/model.nix { };
        # result/e2-micro.qcow2, for `cargo xtask oci-upload --image`.
        e2-micro-image = self.nixosConfigurations.e2-micro.config.system.build.OCIImage;
        # Gemma 3 1B instruct: stops at once with the pin command while its profile is unpinned.
        e2-micro-1b-image = self.nixosConfigurations.e2-micro-1b.config.system.build.OCIImage;
        default = self.packages.${system}.e2-micro-image;
      };

      nixosModules.default = ./modules;

      nixosConfigurations = {
        e2-micro = nixpkgs.lib.nixosSystem {
          modules = [
            self.nixosModules.default
            ./nix/e2-micro.nix
            { nixpkgs.hostPlatform = system; }
          ];
        };
        e2-micro-1b = nixpkgs.lib.nixosSystem {
          modules = [
            self.nixosModules.default
            ./nix/e2-micro.nix
            {
              nixpkgs.hostPlatform = system;
              llm-appliance.profile = ./appliance/profiles/e2-micro-1b.toml;
            }
          ];
        };
      };

      checks.${system} = {
        vm-test = pkgs.testers.runNixOSTest (import ./nix/vm-test.nix { module = self.nixosModules.default; });
        inherit (self.packages.${system}) llm-server appliance;
      };

      devShells.${system}.default = pkgs.mkShell {
        inputsFrom = [ self.packages.${system}.llm-server ];
        packages = with pkgs; [
          clippy
          rustfmt
          nftables
          qemu
          oci-cli
          nixfmt
        ];
      };

      # `nix fmt`: nixfmt over every .nix file in the tree (treefmt with nixfmt configured).
      formatter.${system} = pkgs.nixfmt-tree;
    };
}
