//! The disk: an ext4 root made with `mkfs.ext4 -d`, an EFI system partition written with
//! mtools, both placed in a GPT laid out by sgdisk, then converted to qcow2. No loop devices,
//! no mounts: every step works on plain files.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use xshell::{cmd, Shell};

const MIB: u64 = 1 << 20;
/// Room before the first partition (the protective MBR and the GPT, 1 MiB aligned) and after
/// the last (the backup GPT).
const GPT_MARGIN: u64 = MIB;
/// Holds systemd-boot, the kernel and the initrd (about 30 MiB) with room for a second kernel.
const ESP_BYTES: u64 = 128 * MIB;
/// Free space in the root file system at build time; it grows to the boot volume on first boot.
const ROOT_SLACK: u64 = 128 * MIB;
/// sgdisk's type codes: EFI system partition, and Linux root (x86-64), which systemd-repart
/// matches to grow it.
const ESP_TYPE: &str = "ef00";
const ROOT_TYPE: &str = "8304";

/// Identifiers chosen once per build and written into the manifest.
pub struct Layout {
    pub disk_guid: String,
    pub esp_partuuid: String,
    pub root_partuuid: String,
    pub root_fs_uuid: String,
    /// FAT volume id: 8 hex digits.
    pub esp_volume_id: String,
}

impl Layout {
    pub fn new(sh: &Shell) -> Result<Layout> {
        let uuid = || -> Result<String> {
            Ok(sh
                .read_file("/proc/sys/kernel/random/uuid")?
                .trim()
                .to_owned())
        };
        let esp_volume_id = uuid()?[..8].to_owned();
        Ok(Layout {
            disk_guid: uuid()?,
            esp_partuuid: uuid()?,
            root_partuuid: uuid()?,
            root_fs_uuid: uuid()?,
            esp_volume_id,
        })
    }

    /// The kernel's command line: root by partition UUID; the serial console last, so that it
    /// is /dev/console and boot messages reach OCI's console history; systemd's status lines
    /// name units (`Started llm-server.service`) instead of cutting long descriptions short.
    pub fn command_line(&self) -> String {
        format!(
            "root=PARTUUID={} ro console=tty0 console=ttyS0,115200 systemd.status_unit_format=name",
            self.root_partuuid
        )
    }
}

/// What `build` made, for the manifest.
pub struct Built {
    pub disk_bytes: u64,
    pub command_line: String,
    pub partitions: serde_json::Value,
}

pub fn build(sh: &Shell, root: &Path, work: &Path, layout: &Layout, image: &Path) -> Result<Built> {
    let esp = work.join("esp.img");
    esp_image(sh, root, work, layout, &esp)?;
    let rootfs = work.join("root.img");
    let root_bytes = root_image(sh, root, layout, &rootfs)?;

    let disk = work.join("disk.raw");
    let disk_bytes = GPT_MARGIN + ESP_BYTES + root_bytes + GPT_MARGIN;
    if disk.exists() {
        sh.remove_path(&disk)?;
    }
    let size = disk_bytes.to_string();
    cmd!(sh, "truncate -s {size} {disk}").run()?;
    let (esp_mib, root_mib) = (
        (ESP_BYTES / MIB).to_string(),
        (root_bytes / MIB).to_string(),
    );
    let Layout {
        disk_guid,
        esp_partuuid,
        root_partuuid,
        ..
    } = layout;
    cmd!(
        sh,
        "sgdisk --clear --disk-guid={disk_guid}
            --new=1:1M:+{esp_mib}M --typecode=1:{ESP_TYPE} --change-name=1:ESP --partition-guid=1:{esp_partuuid}
            --new=2:0:+{root_mib}M --typecode=2:{ROOT_TYPE} --change-name=2:root --partition-guid=2:{root_partuuid}
            {disk}"
    )
    .ignore_stdout()
    .run()?;
    // Check the partitions landed where the images will be written.
    let table = cmd!(sh, "sgdisk --print {disk}").read()?;
    let first_sector = |n: u32| {
        table.lines().map(str::split_whitespace).find_map(|mut f| {
            (f.next()? == n.to_string()).then(|| f.next()?.parse::<u64>().ok())?
        })
    };
    let root_offset = GPT_MARGIN + ESP_BYTES;
    if first_sector(1) != Some(GPT_MARGIN / 512) || first_sector(2) != Some(root_offset / 512) {
        bail!("sgdisk placed the partitions unexpectedly:\n{table}");
    }
    place(sh, &esp, &disk, GPT_MARGIN)?;
    place(sh, &rootfs, &disk, root_offset)?;

    cmd!(sh, "qemu-img convert -O qcow2 {disk} {image}").run()?;
    Ok(Built {
        disk_bytes,
        command_line: layout.command_line(),
        partitions: serde_json::json!([
            {"name": "ESP", "partuuid": layout.esp_partuuid, "bytes": ESP_BYTES, "fat_volume_id": layout.esp_volume_id},
            {"name": "root", "partuuid": layout.root_partuuid, "bytes": root_bytes, "ext4_uuid": layout.root_fs_uuid},
        ]),
    })
}

/// Writes `part` into `disk` at `offset` bytes, skipping its holes.
fn place(sh: &Shell, part: &Path, disk: &Path, offset: u64) -> Result<()> {
    let seek = (offset / MIB).to_string();
    cmd!(
        sh,
        "dd if={part} of={disk} bs=1M seek={seek} conv=notrunc,sparse status=none"
    )
    .run()
    .with_context(|| format!("write {} into the disk", part.display()))
}

/// The root tree as an ext4 image sized to its contents plus slack; returns its size.
fn root_image(sh: &Shell, root: &Path, layout: &Layout, image: &Path) -> Result<u64> {
    let used: u64 = cmd!(sh, "du -s --block-size=1 {root}")
        .read()?
        .split_whitespace()
        .next()
        .and_then(|n| n.parse().ok())
        .context("du printed no size")?;
    // ext4's own metadata (inode tables, journal) takes roughly a tenth on top.
    let bytes = (used + used / 10 + ROOT_SLACK).div_ceil(MIB) * MIB;
    let uuid = &layout.root_fs_uuid;
    let size_kib = format!("{}k", bytes / 1024);
    if image.exists() {
        sh.remove_path(image)?;
    }
    cmd!(
        sh,
        "mkfs.ext4 -q -F -L root -U {uuid} -d {root} {image} {size_kib}"
    )
    .run()
    .context("mkfs.ext4 -d failed (it needs e2fsprogs 1.43 or newer)")?;
    Ok(bytes)
}

/// The EFI system partition: systemd-boot as the removable-media loader (no NVRAM entries
/// needed, as on a fresh cloud instance), one boot entry, the kernel and the initrd.
fn esp_image(sh: &Shell, root: &Path, work: &Path, layout: &Layout, image: &Path) -> Result<()> {
    let kernel = only_match(&root.join("boot"), "vmlinuz-")?;
    let initrd = only_match(&root.join("boot"), "initrd.img-")?;
    let loader = root.join("usr/lib/systemd/boot/efi/systemd-bootx64.efi");
    let loader_conf = work.join("loader.conf");
    std::fs::write(
        &loader_conf,
        "default appliance.conf\ntimeout 0\neditor no\n",
    )?;
    let entry = work.join("appliance.conf");
    std::fs::write(
        &entry,
        format!(
            "title LLM appliance\nlinux /vmlinuz\ninitrd /initrd.img\noptions {}\n",
            layout.command_line()
        ),
    )?;
    if image.exists() {
        sh.remove_path(image)?;
    }
    let (volume_id, kib) = (&layout.esp_volume_id, (ESP_BYTES / 1024).to_string());
    cmd!(sh, "mkfs.fat -F 32 -n ESP -i {volume_id} -C {image} {kib}")
        .quiet()
        .ignore_stdout()
        .run()?;
    for dir in ["::/EFI", "::/EFI/BOOT", "::/loader", "::/loader/entries"] {
        mtools(sh, "mmd", image, &[dir])?;
    }
    for (from, to) in [
        (loader.as_path(), "::/EFI/BOOT/BOOTX64.EFI"),
        (kernel.as_path(), "::/vmlinuz"),
        (initrd.as_path(), "::/initrd.img"),
        (loader_conf.as_path(), "::/loader/loader.conf"),
        (entry.as_path(), "::/loader/entries/appliance.conf"),
    ] {
        let from = from.to_str().context("non-UTF-8 path")?;
        mtools(sh, "mcopy", image, &[from, to])?;
    }
    Ok(())
}

/// Runs an mtools command on the FAT image (`-i`), without a drive configuration.
fn mtools(sh: &Shell, tool: &str, image: &Path, args: &[&str]) -> Result<()> {
    cmd!(sh, "{tool} -i {image} {args...}")
        .env("MTOOLS_SKIP_CHECK", "1")
        .run()
        .with_context(|| format!("{tool} on the ESP image failed"))
}

/// The one file in `dir` whose name starts with `prefix`.
pub(super) fn only_match(dir: &Path, prefix: &str) -> Result<PathBuf> {
    let matches: Vec<PathBuf> = std::fs::read_dir(dir)
        .with_context(|| format!("read {}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with(prefix))
        })
        .collect();
    match &matches[..] {
        [one] => Ok(one.clone()),
        _ => bail!(
            "expected one {prefix}* in {}, found {}",
            dir.display(),
            matches.len()
        ),
    }
}
