//! `cargo xtask oci-upload` against a strict fake `oci` on PATH (fake_oci.py): it accepts only
//! the options the real CLI's commands have (exit 2, "No such option", as click does), records
//! every call, and answers the import with IMPORTING, then PROVISIONING, then AVAILABLE after
//! a few `image get` calls. The tests drive the whole flow and its errors: the CLI missing or
//! unconfigured, the image not there, an import that fails or outlasts its deadline.

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
const FAKE: &str = include_str!("fake_oci.py");

/// The Python interpreter itself (not a pyenv shim, which needs a PATH the tests take away).
fn python() -> String {
    let out = Command::new("python3")
        .args(["-c", "import sys; print(sys.executable)"])
        .output()
        .expect("python3 runs the fake OCI CLI: install it (apt-get install python3)");
    assert!(out.status.success(), "python3 -c failed");
    String::from_utf8(out.stdout).unwrap().trim().to_owned()
}

/// The fake `oci` in `dir/bin`; its log and state files are in `dir` (see `oci_upload`).
fn fake_oci(dir: &Scratch) -> PathBuf {
    let bin = dir.path("bin");
    std::fs::create_dir_all(&bin).unwrap();
    let oci = bin.join("oci");
    test_support::write_executable(&oci, &format!("#!{}\n{FAKE}", python()));
    bin
}

/// Runs the fake directly with `args`.
fn fake(dir: &Scratch, args: &[&str]) -> Output {
    Command::new(fake_oci(dir).join("oci"))
        .args(args)
        .env("FAKE_OCI_LOG", dir.path("calls"))
        .env("FAKE_OCI_STATE", dir.path("state.json"))
        .output()
        .unwrap()
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

/// `cargo xtask oci-upload ARGS --poll-interval 0` with `path` as PATH, the scratch home as
/// HOME and the fake's files in the scratch directory; `env` goes to the fake.
fn oci_upload(dir: &Scratch, path: &Path, args: &[&str], env: &[(&str, &str)]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_xtask"))
        .arg("oci-upload")
        .args(args)
        .args(["--poll-interval", "0"])
        .envs(env.iter().copied())
        .env("FAKE_OCI_LOG", dir.path("calls"))
        .env("FAKE_OCI_STATE", dir.path("state.json"))
        .env("PATH", path)
        .env("HOME", dir.path("home"))
        .env_remove("OCI_CLI_AUTH")
        .env_remove("OCI_CLI_CONFIG_FILE")
        .output()
        .unwrap()
}

/// `oci_upload` with the arguments every call needs (compartment, `bucket`, `image`), then `extra`.
fn upload(dir: &Scratch, path: &Path, bucket: &str, image: &Path, extra: &[&str]) -> Output {
    upload_env(dir, path, bucket, image, extra, &[])
}

fn upload_env(
    dir: &Scratch,
    path: &Path,
    bucket: &str,
    image: &Path,
    extra: &[&str],
    env: &[(&str, &str)],
) -> Output {
    let image = image.to_str().unwrap();
    let args = [
        "--compartment",
        COMPARTMENT,
        "--bucket",
        bucket,
        "--image",
        image,
    ];
    oci_upload(dir, path, &[&args[..], extra].concat(), env)
}

fn words(s: &str) -> Vec<String> {
    s.split_whitespace().map(str::to_owned).collect()
}

#[test]
fn uploads_imports_waits_for_available_then_sets_firmware_and_shape_and_deletes_the_object() {
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
    // The progress lines while it imports.
    let imp = stderr.find("IMPORTING after").expect(&stderr);
    let prov = stderr.find("PROVISIONING after").expect(&stderr);
    assert!(imp < prov, "{stderr}");

    // Every call asks for JSON explicitly, then names the region.
    let tail = "--output json --region eu-frankfurt-1";
    let firmware = r#"{"Compute.Firmware":{"descriptorType":"enumstring","source":"IMAGE","defaultValue":"UEFI_64","values":["UEFI_64"]}}"#;
    let mut schema_call = words(&format!(
        "compute image-capability-schema create --compartment-id {COMPARTMENT} \
         --image-id {IMAGE_ID} --global-image-capability-schema-version-name c8b2-v3 \
         --schema-data"
    ));
    schema_call.push(firmware.to_owned());
    schema_call.extend(words(tail));
    let get = words(&format!("compute image get --image-id {IMAGE_ID} {tail}"));
    let expected = vec![
        words("--version"),
        words(&format!("os ns get {tail}")),
        words(&format!(
            "os object put --namespace axtestns --bucket-name images --name e2-micro.qcow2 \
             --file {image} --part-size 128 --parallel-upload-count 4 --force {tail}"
        )),
        words(&format!(
            "compute image import from-object --compartment-id {COMPARTMENT} \
             --namespace axtestns --bucket-name images --name e2-micro.qcow2 \
             --display-name e2-micro --source-image-type QCOW2 --launch-mode PARAVIRTUALIZED \
             {tail}"
        )),
        get.clone(),
        get.clone(),
        get,
        words(&format!(
            "compute global-image-capability-schema list --all {tail}"
        )),
        schema_call,
        words(&format!(
            "compute image-shape-compatibility-entry add --image-id {IMAGE_ID} \
             --shape-name VM.Standard.E2.1.Micro {tail}"
        )),
        words(&format!(
            "os object delete --namespace axtestns --bucket-name images --name e2-micro.qcow2 \
             --force {tail}"
        )),
    ];
    assert_eq!(calls(&dir), expected);
}

#[test]
fn the_fake_refuses_what_the_real_cli_refuses() {
    let dir = Scratch::new("strict");
    // The wait options that import from-object lacks (oci-cli issue #399).
    let out = fake(
        &dir,
        &words(&format!(
            "compute image import from-object --compartment-id {COMPARTMENT} --namespace n \
             --bucket-name b --name o --wait-for-state AVAILABLE"
        ))
        .iter()
        .map(String::as_str)
        .collect::<Vec<_>>(),
    );
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("No such option: --wait-for-state"),
        "{stderr}"
    );
    // A required option left out, and the generated name the extended command replaced.
    let out = fake(&dir, &["compute", "image", "get"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("Missing option '--image-id'"));
    let out = fake(
        &dir,
        &[
            "compute",
            "image-capability-schema",
            "create",
            "--compute-global-image-capability-schema-version-name",
            "v",
        ],
    );
    assert_eq!(out.status.code(), Some(2));
    // Root options go anywhere; a valued option needs its value.
    let out = fake(
        &dir,
        &["os", "ns", "get", "--output", "json", "--region", "r"],
    );
    assert!(out.status.success());
    let out = fake(&dir, &["os", "ns", "get", "--region"]);
    assert_eq!(out.status.code(), Some(2));
}

#[test]
fn a_failed_import_names_its_state_and_the_image() {
    let dir = Scratch::new("failed");
    let bin = fake_oci(&dir);
    configure(&dir);
    let image = image(&dir, "e2-micro.qcow2");
    let env = [("FAKE_OCI_IMPORT_END", "FAILED")];
    let out = upload_env(&dir, &bin, "b", &image, &[], &env);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains(&format!("the import of image {IMAGE_ID} ended FAILED")),
        "{stderr}"
    );
    // Nothing after the wait, and the object stays for a look.
    let calls = calls(&dir);
    assert_eq!(calls.last().unwrap()[..3], words("compute image get"));
}

#[test]
fn an_import_past_its_deadline_names_the_state_and_the_image() {
    let dir = Scratch::new("deadline");
    let bin = fake_oci(&dir);
    configure(&dir);
    let image = image(&dir, "e2-micro.qcow2");
    let env = [("FAKE_OCI_GETS_BEFORE_END", "never")];
    let out = upload_env(&dir, &bin, "b", &image, &["--import-deadline", "0"], &env);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains(&format!("image {IMAGE_ID} is still IMPORTING after 0 s")),
        "{stderr}"
    );
    assert_eq!(calls(&dir).last().unwrap()[..3], words("compute image get"));
}

#[test]
fn a_cli_that_cannot_authenticate_gets_the_repair_hint_with_the_config_file() {
    let dir = Scratch::new("auth");
    let bin = fake_oci(&dir);
    configure(&dir);
    let image = image(&dir, "e2-micro.qcow2");
    let env = [("FAKE_OCI_NOT_AUTHENTICATED", "1")];
    let out = upload_env(&dir, &bin, "b", &image, &[], &env);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    let config = dir.path("home/.oci/config");
    assert!(
        stderr.contains(&format!(
            "oci setup repair-file-permissions --file {}",
            config.display()
        )),
        "{stderr}"
    );
}

#[test]
fn name_sets_object_and_display_name_and_no_region_means_the_configured_one_and_keep_object_keeps_it(
) {
    let dir = Scratch::new("named");
    let bin = fake_oci(&dir);
    configure(&dir);
    let image = image(&dir, "result.qcow2");
    let out = upload(
        &dir,
        &bin,
        "b",
        &image,
        &["--name", "llm-appliance-2026-11-30", "--keep-object"],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let calls = calls(&dir);
    assert!(calls.iter().all(|c| !c.contains(&"--region".to_owned())));
    assert!(!calls
        .iter()
        .any(|c| c.starts_with(&words("os object delete"))));
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
