# An appliance profile read for Nix (`builtins.fromTOML`), refused at once with the command that
# fixes it when its model is not pinned: a profile such as appliance/profiles/e2-micro-1b.toml
# is committed without the model's sha256 and size until someone who can reach the model's
# source records them, and without this the build would stop deep in the evaluation on a
# missing attribute. `Profile::load` (appliance/src/profile/mod.rs) refuses it with the same
# command; appliance/tests/it/nix_profile.rs evaluates this.
profile:
let
  values = builtins.fromTOML (builtins.readFile profile);
  model = values.model or { };
  shipped = "appliance/profiles/${baseNameOf profile}";
in
if model ? sha256 && model ? size_bytes then
  values
else
  throw "the profile ${baseNameOf profile} does not pin its model (model.sha256 and model.size_bytes are missing), so the model cannot be verified: run `cargo xtask model --profile ${shipped} --pin` once where the model's source is reachable; it writes both keys into the profile, which `nix build` reads too. Check the recorded sha256 against the publisher's and commit the profile."
