# The appliance's NixOS modules: `services.llm-server` and the `llm-appliance` policy, both
# taking their values from the profile through ./profile.nix.
{
  imports = [
    ./llm-server.nix
    ./appliance.nix
  ];
}
