# The e2-micro appliance as an Oracle Cloud custom image: nixpkgs' OCI image module (UEFI,
# GPT, GRUB on the removable path, serial console, growing root) plus the appliance policy.
# `nix build .#e2-micro-image` writes result/e2-micro.qcow2.
{
  config,
  lib,
  modulesPath,
  ...
}:
let
  v = config.llm-appliance.values;
  mib = bytes: (bytes + 1048575) / 1048576;
in
{
  imports = [ "${modulesPath}/virtualisation/oci-image.nix" ];

  llm-appliance.enable = true;

  image.baseName = v.name;
  # UEFI: `cargo xtask oci-upload` sets the image's firmware to UEFI_64 to match.
  oci.efi = true;
  # The NixOS closure with its nixpkgs channel fits in 3 GiB; the model comes on top. OCI grows
  # the root partition to the boot volume's size at first boot.
  virtualisation.diskSize = 3072 + mib v.model.sizeBytes;

  # The appliance's own key fetcher (oci-ssh-keys, from the profile) replaces the image
  # module's, which saves an HTTP error page as authorized_keys and never fetches again.
  systemd.services.fetch-ssh-keys.enable = false;

  # RAM is the scarce resource: no manual pages or info in the image.
  documentation.enable = false;

  system.stateVersion = "26.05";
}
