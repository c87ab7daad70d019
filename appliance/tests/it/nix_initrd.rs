//! The NixOS image's initrd holds the boot drivers OCI needs: `nix/initrd-modules.nix` (which
//! `nix/e2-micro.nix` asserts on the configuration) evaluated on the module lists NixOS gives an
//! OCI image, and on lists that lack them. NixOS's lists as read in nixpkgs:
//! `nixos/modules/virtualisation/oci-common.nix` imports `../profiles/qemu-guest.nix`, whose
//! `boot.initrd.availableKernelModules` are virtio_net, virtio_pci, virtio_mmio, virtio_blk,
//! virtio_scsi, 9p, 9pnet_virtio and `kernelModules` virtio_balloon, virtio_console, virtio_rng,
//! virtio_gpu; `nixos/modules/system/boot/kernel.nix` adds by default, among others, sd_mod and
//! sr_mod ("Standard SCSI stuff").

use crate::nix_profile::{eval_json, nix_instantiate, repo_root};

const QEMU_GUEST_AVAILABLE: &[&str] = &[
    "virtio_net",
    "virtio_pci",
    "virtio_mmio",
    "virtio_blk",
    "virtio_scsi",
    "9p",
    "9pnet_virtio",
];
const QEMU_GUEST_LOADED: &[&str] = &[
    "virtio_balloon",
    "virtio_console",
    "virtio_rng",
    "virtio_gpu",
];
const KERNEL_DEFAULTS_SCSI: &[&str] = &["ahci", "ata_piix", "sd_mod", "sr_mod"];

/// The drivers `nix/initrd-modules.nix` finds missing from these lists.
fn missing(available: &[&str], loaded: &[&str]) -> Vec<String> {
    let list = |names: &[&str]| {
        let quoted: Vec<String> = names.iter().map(|n| format!("\"{n}\"")).collect();
        format!("[ {} ]", quoted.join(" "))
    };
    let file = repo_root().join("nix/initrd-modules.nix");
    let expr = format!(
        "import {} {{ availableKernelModules = {}; kernelModules = {}; }}",
        file.display(),
        list(available),
        list(loaded)
    );
    eval_json(
        nix_instantiate().args(["--eval", "--strict", "--json", "--expr", &expr]),
        &expr,
    )
}

#[test]
fn nixos_oci_lists_hold_every_boot_driver_and_a_gap_is_named() {
    let available = [QEMU_GUEST_AVAILABLE, KERNEL_DEFAULTS_SCSI].concat();
    assert_eq!(missing(&available, QEMU_GUEST_LOADED), Vec::<String>::new());
    // Without the qemu-guest profile the virtio drivers are missing, sd_mod is not.
    let mut gone = missing(KERNEL_DEFAULTS_SCSI, &[]);
    gone.sort();
    assert_eq!(gone, ["virtio_blk", "virtio_net", "virtio_scsi"]);
    // Loaded modules (boot.initrd.kernelModules) are in the initrd too.
    assert_eq!(
        missing(&[], &["virtio_scsi", "sd_mod", "virtio_blk", "virtio_net"]),
        Vec::<String>::new()
    );
}

#[test]
fn the_oci_configuration_asserts_the_list() {
    let text = std::fs::read_to_string(repo_root().join("nix/e2-micro.nix")).unwrap();
    assert!(
        text.contains("import ./initrd-modules.nix")
            && text.contains("inherit (config.boot.initrd) availableKernelModules kernelModules;")
            && text.contains("assertion = missing == [ ];"),
        "nix/e2-micro.nix no longer asserts the boot drivers"
    );
    // The list both builders check is the four drivers.
    let json = std::fs::read(repo_root().join("appliance/initrd-modules.json")).unwrap();
    let mut list: Vec<String> = serde_json::from_slice(&json).unwrap();
    list.sort();
    assert_eq!(list, ["sd_mod", "virtio_blk", "virtio_net", "virtio_scsi"]);
}
