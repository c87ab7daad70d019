# One binary of the Cargo workspace (`crate` is its directory: server, appliance), built for
# x86-64-v3 as the appliance targets.
{
  lib,
  rustPlatform,
  crate,
}:
let
  manifest = (builtins.fromTOML (builtins.readFile (../. + "/${crate}/Cargo.toml"))).package;

  # Cargo loads the whole workspace to build one package: the root manifest, the lock file and
  # every member of the root Cargo.toml's `[workspace] members` (nix/workspace-src.nix), and
  # nothing else (no testdata/, bench/ or fuzz/).
  root = ../.;
  workspace = lib.fileset.unions (import ./workspace-src.nix { inherit root; }).paths;
  # `nix build .#…` evaluates the flake's copy of the repository in the store, which holds the
  # git-tracked files only and no .git: there the members are already what git tracks, and
  # `lib.fileset.gitTracked` would add nothing (on a store path without .git it takes the whole
  # path; on a store path with .git, as `path:` flakes give, it throws). In a working tree
  # (`nix-build` on a checkout), intersecting with git's files keeps untracked files out.
  inWorkingTree =
    builtins.pathExists (root + "/.git") && !lib.hasPrefix "${builtins.storeDir}/" (toString root);
in
rustPlatform.buildRustPackage {
  pname = manifest.name;
  version = manifest.version;

  src = lib.fileset.toSource {
    inherit root;
    fileset =
      if inWorkingTree then
        lib.fileset.intersection (lib.fileset.gitTracked root) workspace
      else
        workspace;
  };
  cargoLock.lockFile = ../Cargo.lock;
  cargoBuildFlags = [
    "--package"
    manifest.name
  ];

  # AVX2, FMA, F16C, BMI2: the E2.1.Micro's EPYC has them and the server checks for them at
  # start. Applies to the binaries only; build scripts still run on any x86-64 builder.
  RUSTFLAGS = "-C target-cpu=x86-64-v3";

  # The tests need the golden reference data and the 253 MB model, which the sandbox has
  # neither of, and x86-64-v3 test binaries would die of SIGILL on an older builder. They run
  # in CI instead (`cargo xtask test`).
  doCheck = false;

  meta = {
    inherit (manifest) description;
    license = lib.licenses.mit;
    mainProgram = manifest.name;
    platforms = [ "x86_64-linux" ];
  };
}
