# The Cargo workspace as cargo needs it to load: the root manifest, the lock file and every
# member directory named by the root Cargo.toml's `[workspace] members`, so a new member needs
# no edit here. Pure (no nixpkgs): `xtask/tests/it/nix_package.rs` evaluates it with plain
# `nix-instantiate` and checks `members` against Cargo.toml. nix/package.nix makes the source
# from `paths`; what is not listed (testdata/, bench/, fuzz/, modules/, nix/) stays out.
{
  root ? ../.,
}:
let
  workspace = (builtins.fromTOML (builtins.readFile (root + "/Cargo.toml"))).workspace;
  # Cargo also takes globs ("crates/*"); this file would need to list directories to expand one,
  # so a glob fails the evaluation instead of leaving its members out of the source.
  checked =
    member:
    if builtins.match ".*[*?[].*" member != null then
      throw "nix/workspace-src.nix: the workspace member \"${member}\" is a glob; name the directories in Cargo.toml"
    else
      member;
  members = map checked workspace.members;
in
{
  # As Cargo.toml spells them, in its order.
  inherit members;
  paths = [
    (root + "/Cargo.toml")
    (root + "/Cargo.lock")
  ]
  ++ map (member: root + "/${member}") members;
}
