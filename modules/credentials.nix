# The systemd credentials the server loads (`LoadCredential=NAME:FILE`, read back as %d/NAME)
# and the server flag naming each: one list for both modules (./llm-server.nix, ./profile.nix).
# appliance/src/render/units.rs writes the same for the Debian image, and
# appliance/tests/it/nix_profile.rs holds the two equal.
{
  apiKeys = {
    name = "api-keys";
    flag = "--api-key-file";
  };
  tlsCert = {
    name = "tls-cert";
    flag = "--tls-cert";
  };
  tlsKey = {
    name = "tls-key";
    flag = "--tls-key";
  };
}
