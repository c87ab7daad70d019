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
  # A fixed size in MiB: the OCI image module sets `virtualisation.diskSizeAutoSupported = false`
  # (nixos/modules/virtualisation/oci-image.nix), so "auto" and make-disk-image's
  # `additionalSpace` are not on offer. Out of this size make-disk-image.nix takes the ESP
  # (`bootSize`, 256 MiB) and ext4 keeps about 5 % in reserve; the rest holds the system closure,
  # the model in the store and the nixpkgs channel (`copyChannel`, on by default). The module's
  # own default, 8 GiB, is its size for a NixOS OCI image: keep it and put the model on top. Too
  # small a size fails the build ("cptofs failed. diskSize might be too small for closure"); a
  # larger one costs little in the qcow2, which `qemu-img convert` writes without the unused
  # (zero) space. OCI grows the root partition to the boot volume's size at first boot.
  virtualisation.diskSize = 8 * 1024 + mib v.model.sizeBytes;

  # The appliance's own key fetcher (oci-ssh-keys, from the profile) replaces the image
  # module's, which saves an HTTP error page as authorized_keys and never fetches again.
  systemd.services.fetch-ssh-keys.enable = false;

  # The initrd holds the drivers OCI boots with. nixpkgs gives them today (oci-common.nix
  # imports profiles/qemu-guest.nix: virtio_net, virtio_blk, virtio_scsi among its
  # availableKernelModules; sd_mod is in the kernel module's default list); this fails the build
  # if a nixpkgs update drops one.
  assertions =
    let
      missing = import ./initrd-modules.nix {
        inherit (config.boot.initrd) availableKernelModules kernelModules;
      };
    in
    [
      {
        assertion = missing == [ ];
        message = "the initrd lacks ${toString missing}: add them to boot.initrd.availableKernelModules";
      }
    ];

  # RAM is the scarce resource: no manual pages or info in the image.
  documentation.enable = false;

  system.stateVersion = "26.05";
}
