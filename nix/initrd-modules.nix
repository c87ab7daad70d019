# The boot drivers the NixOS initrd must hold, as the Debian builder checks its initrd with
# lsinitramfs: one list for both, appliance/initrd-modules.json. OCI boots from a virtio-scsi
# disk (virtio_scsi, sd_mod) on a virtio network (virtio_net); virtio_blk for other attachments.
# Given the configuration's boot.initrd module lists, returns the required drivers they lack.
{ availableKernelModules, kernelModules }:
let
  required = builtins.fromJSON (builtins.readFile ../appliance/initrd-modules.json);
  present = availableKernelModules ++ kernelModules;
in
builtins.filter (m: !(builtins.elem m present)) required
