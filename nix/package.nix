# One binary of the Cargo workspace (`crate` is its directory: server, appliance), built for
# x86-64-v3 as the appliance targets.
{
  lib,
  rustPlatform,
  crate,
}:
let
  manifest = (builtins.fromTOML (builtins.readFile (../. + "/${crate}/Cargo.toml"))).package;
in
rustPlatform.buildRustPackage {
  pname = manifest.name;
  version = manifest.version;

  # Only what cargo reads: every workspace member must be present for the manifest to load.
  src = lib.fileset.toSource {
    root = ../.;
    fileset = lib.fileset.unions [
      ../Cargo.toml
      ../Cargo.lock
      ../server
      ../appliance
      ../xtask
    ];
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
