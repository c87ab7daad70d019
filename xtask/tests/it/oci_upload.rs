//! `cargo xtask oci-upload` against a fake `oci` on PATH that records every call and answers
//! with canned JSON in the CLI's shapes: the exact argument lists, the OCID printed, and the
//! errors when the CLI is missing or unconfigured or the image is not there.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// A scratch directory, removed on drop.
struct Scratch(PathBuf);

impl Scratch {
    fn new(name: &str) -> Scratch {
        let dir =
            std::env::temp_dir().join(format!("xtask-oci-upload-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Scratch(dir)
    }

    fn path(&self, rel: &str) -> PathBuf {
        self.0.join(rel)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

const IMAGE_ID: &str = "ocid1.image.oc1.eu-frankfurt-1.aaaatest";
const COMPARTMENT: &str = "ocid1.compartment.oc1..aaaatest";

/// A fake `oci` in `dir/bin` that appends its arguments, one per line and a `--end--` line per
/// call, to `dir/calls`, and answers as the real CLI does (`--version` included).
fn fake_oci(dir: &Scratch) -> PathBuf {
    let bin = dir.path("bin");
    std::fs::create_dir_all(&bin).unwrap();
    let script = format!(
        r#"#!/bin/sh
for a in "$@"; do printf '%s\n' "$a"; done >> '{log}'
echo --end-- >> '{log}'
case "$1 $2 $3" in
  "--version  ") echo 3.52.0 ;;
  "os ns get") echo '{{"data": "axtestns"}}' ;;
  "os object put") echo '{{"etag": "5b6d", "opc-multipart-md5": "x-2"}}' ;;
  "compute image import") echo '{{"data": {{"id": "{IMAGE_ID}", "lifecycle-state": "AVAILABLE"}}}}' ;;
  "compute global-image-capability-schema list")
    echo '{{"data": [{{"id": "ocid1.computeglobalimgcapschema.oc1..g", "current-version-name": "c8b2-v3"}}]}}' ;;
  "compute image-capability-schema create") echo '{{"data": {{"id": "ocid1.computeimgcapschema.oc1..s"}}}}' ;;
  "compute image-shape-compatibility-entry add")
    echo '{{"data": {{"image-id": "{IMAGE_ID}", "shape": "VM.Standard.E2.1.Micro"}}}}' ;;
  *) echo "fake oci: unexpected call: $*" >&2; exit 2 ;;
esac
"#,
        log = dir.path("calls").display()
    );
    let oci = bin.join("oci");
    std::fs::write(&oci, script).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&oci, std::fs::Permissions::from_mode(0o755)).unwrap();
    bin
}

/// The calls the fake recorded, each as its argument list.
fn calls(dir: &Scratch) -> Vec<Vec<String>> {
    let log = std::fs::read_to_string(dir.path("calls")).unwrap_or_default();
    let mut calls = Vec::new();
    let mut call = Vec::new();
    for line in log.lines() {
        if line == "--end--" {
            calls.push(std::mem::take(&mut call));
        } else {
            call.push(line.to_owned());
        }
    }
    calls
}

/// A file that starts like a qcow2.
fn image(dir: &Scratch, name: &str) -> PathBuf {
    let path = dir.path(name);
    std::fs::write(&path, b"QFI\xfb\x00\x00\x00\x03 rest of the image").unwrap();
    path
}

fn configure(dir: &Scratch) {
    std::fs::create_dir_all(dir.path("home/.oci")).unwrap();
    std::fs::write(
        dir.path("home/.oci/config"),
        "[DEFAULT]\nregion=eu-frankfurt-1\n",
    )
    .unwrap();
}

/// `cargo xtask oci-upload ARGS` with `path` as PATH and the scratch home as HOME.
fn oci_upload(dir: &Scratch, path: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_xtask"))
        .arg("oci-upload")
        .args(args)
        .env("PATH", path)
        .env("HOME", dir.path("home"))
        .env_remove("OCI_CLI_AUTH")
        .env_remove("OCI_CLI_CONFIG_FILE")
        .output()
        .unwrap()
}

/// `oci_upload` with the arguments every call needs (compartment, `bucket`, `image`), then `extra`.
fn upload(dir: &Scratch, path: &Path, bucket: &str, image: &Path, extra: &[&str]) -> Output {
    let image = image.to_str().unwrap();
    let args = [
        "--compartment",
        COMPARTMENT,
        "--bucket",
        bucket,
        "--image",
        image,
    ];
    oci_upload(dir, path, &[&args[..], extra].concat())
}

fn words(s: &str) -> Vec<String> {
    s.split_whitespace().map(str::to_owned).collect()
}

#[test]
fn uploads_imports_and_sets_firmware_and_shape() {
    let dir = Scratch::new("full");
    let bin = fake_oci(&dir);
    configure(&dir);
    let image = image(&dir, "e2-micro.qcow2");
    let out = upload(
        &dir,
        &bin,
        "images",
        &image,
        &["--region", "eu-frankfurt-1"],
    );
    let image = image.to_str().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        format!("{IMAGE_ID}\n")
    );

    let region = "--region eu-frankfurt-1";
    let firmware = r#"{"Compute.Firmware":{"descriptorType":"enumstring","source":"IMAGE","defaultValue":"UEFI_64","values":["UEFI_64"]}}"#;
    let mut schema_call = words(&format!(
        "compute image-capability-schema create --compartment-id {COMPARTMENT} \
         --image-id {IMAGE_ID} --global-image-capability-schema-version-name c8b2-v3 \
         --schema-data"
    ));
    schema_call.push(firmware.to_owned());
    schema_call.extend(words(region));
    let expected = vec![
        words("--version"),
        words(&format!("os ns get {region}")),
        words(&format!(
            "os object put --namespace axtestns --bucket-name images --name e2-micro.qcow2 \
             --file {image} --part-size 128 --parallel-upload-count 4 --force {region}"
        )),
        words(&format!(
            "compute image import from-object --compartment-id {COMPARTMENT} \
             --namespace axtestns --bucket-name images --name e2-micro.qcow2 \
             --display-name e2-micro --source-image-type QCOW2 --launch-mode PARAVIRTUALIZED \
             --wait-for-state AVAILABLE --max-wait-seconds 7200 {region}"
        )),
        words(&format!(
            "compute global-image-capability-schema list --all {region}"
        )),
        schema_call,
        words(&format!(
            "compute image-shape-compatibility-entry add --image-id {IMAGE_ID} \
             --shape-name VM.Standard.E2.1.Micro {region}"
        )),
    ];
    assert_eq!(calls(&dir), expected);
}

#[test]
fn name_sets_object_and_display_name_and_no_region_means_the_configured_one() {
    let dir = Scratch::new("named");
    let bin = fake_oci(&dir);
    configure(&dir);
    let image = image(&dir, "result.qcow2");
    let out = upload(
        &dir,
        &bin,
        "b",
        &image,
        &["--name", "llm-appliance-2026-11-30"],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let calls = calls(&dir);
    assert!(calls.iter().all(|c| !c.contains(&"--region".to_owned())));
    let import = &calls[3];
    let after = |flag: &str| {
        let i = import.iter().position(|a| a == flag).unwrap();
        import[i + 1].as_str()
    };
    assert_eq!(after("--name"), "llm-appliance-2026-11-30.qcow2");
    assert_eq!(after("--display-name"), "llm-appliance-2026-11-30");
}

#[test]
fn a_missing_cli_is_named_with_the_install_command() {
    let dir = Scratch::new("missing");
    configure(&dir);
    let empty = dir.path("empty-bin");
    std::fs::create_dir_all(&empty).unwrap();
    let image = image(&dir, "e2-micro.qcow2");
    let out = upload(&dir, &empty, "b", &image, &[]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains("the OCI CLI (`oci`) is not installed") && stderr.contains("pip install"),
        "{stderr}"
    );
}

#[test]
fn an_unconfigured_cli_is_refused_before_any_call() {
    let dir = Scratch::new("unconfigured");
    let bin = fake_oci(&dir);
    let image = image(&dir, "e2-micro.qcow2");
    let out = upload(&dir, &bin, "b", &image, &[]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains("not configured") && stderr.contains("oci setup config"),
        "{stderr}"
    );
    assert_eq!(calls(&dir), vec![words("--version")]);
}

#[test]
fn a_missing_or_foreign_image_is_refused_before_the_cli_runs() {
    let dir = Scratch::new("image");
    let bin = fake_oci(&dir);
    configure(&dir);
    let args = |image: &Path| upload(&dir, &bin, "b", image, &[]);
    let out = args(&dir.path("nowhere.qcow2"));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains("no image at") && stderr.contains("nix build .#e2-micro-image"),
        "{stderr}"
    );

    let raw = dir.path("disk.raw");
    std::fs::write(&raw, [0u8; 512]).unwrap();
    let out = args(&raw);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.contains("is not a qcow2 image"), "{stderr}");
    assert!(calls(&dir).is_empty());
}
