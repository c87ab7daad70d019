//! `cargo xtask oci-upload`: the appliance's qcow2 into Oracle Cloud as a custom image that
//! boots on the Always-Free VM.Standard.E2.1.Micro, through the OCI CLI (`oci`).
//!
//! Steps: upload to Object Storage (multipart, parts in parallel); import the object as a
//! QCOW2 image in PARAVIRTUALIZED launch mode, the only one OCI supports for imported images on
//! AMD shapes; poll the image until it is AVAILABLE (`import from-object` has no wait options:
//! oci-cli's compute_cli_extended.py excludes them from the command); set its firmware
//! capability to UEFI_64 (both builders make UEFI-only disks, and an import defaults to BIOS);
//! mark it compatible with the E2.1.Micro shape, which imported images are not by default;
//! delete the uploaded object (it counts against the free tier's 20 GB of Object Storage)
//! unless `--keep-object`. The image's OCID goes to stdout.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use serde_json::Value;
use xshell::{cmd, Shell};

use crate::util::step;

#[derive(clap::Args)]
pub struct OciUpload {
    /// OCID of the compartment to create the image in.
    #[arg(long)]
    compartment: String,
    /// Object Storage bucket to upload the image to (it must exist).
    #[arg(long)]
    bucket: String,
    /// The qcow2 to upload: `cargo xtask image` writes target/appliance/e2-micro.qcow2,
    /// `nix build .#e2-micro-image` result/e2-micro.qcow2.
    #[arg(long, default_value = "target/appliance/e2-micro.qcow2")]
    image: PathBuf,
    /// The image's display name, also the object's name (with `.qcow2`) [default: the file's
    /// name without `.qcow2`].
    #[arg(long)]
    name: Option<String>,
    /// OCI region, e.g. eu-frankfurt-1 [default: the CLI configuration's].
    #[arg(long)]
    region: Option<String>,
    /// Keep the uploaded object in the bucket after a successful import [default: delete it].
    #[arg(long)]
    keep_object: bool,
    /// Seconds between two looks at the importing image's state.
    #[arg(long, default_value_t = 30)]
    poll_interval: u64,
    /// Give up waiting for the import after this many seconds.
    #[arg(long, default_value_t = 7200)]
    import_deadline: u64,
}

/// The Always-Free AMD shape the appliance is sized for.
const SHAPE: &str = "VM.Standard.E2.1.Micro";
/// Multipart upload: 128 MiB parts, four at a time.
const PART_SIZE_MIB: &str = "128";
const PARALLEL_PARTS: &str = "4";
/// The image capability that makes OCI boot the image with UEFI firmware.
const UEFI_FIRMWARE: &str = r#"{"Compute.Firmware":{"descriptorType":"enumstring","source":"IMAGE","defaultValue":"UEFI_64","values":["UEFI_64"]}}"#;
/// The first bytes of every qcow2 file.
const QCOW2_MAGIC: &[u8] = b"QFI\xfb";

impl OciUpload {
    pub fn run(self, sh: &Shell) -> Result<()> {
        let image = sh.current_dir().join(&self.image);
        check_qcow2(&image)?;
        let name = match self.name {
            Some(name) => name,
            None => default_name(&image)?,
        };
        let oci = Oci::new(sh, self.region)?;
        let compartment = &self.compartment;
        let bucket = &self.bucket;
        let object = format!("{name}.qcow2");

        step("Object Storage namespace");
        let namespace = oci.json(&["os", "ns", "get"])?;
        let namespace = field(&namespace, &["data"])?;

        step(&format!(
            "upload {} to {bucket}/{object}",
            self.image.display()
        ));
        let file = image.to_str().context("the image path is not UTF-8")?;
        oci.json(&[
            "os",
            "object",
            "put",
            "--namespace",
            &namespace,
            "--bucket-name",
            bucket,
            "--name",
            &object,
            "--file",
            file,
            "--part-size",
            PART_SIZE_MIB,
            "--parallel-upload-count",
            PARALLEL_PARTS,
            "--force",
        ])?;

        step("import it as a QCOW2 custom image (PARAVIRTUALIZED)");
        let imported = oci.json(&[
            "compute",
            "image",
            "import",
            "from-object",
            "--compartment-id",
            compartment,
            "--namespace",
            &namespace,
            "--bucket-name",
            bucket,
            "--name",
            &object,
            "--display-name",
            &name,
            "--source-image-type",
            "QCOW2",
            "--launch-mode",
            "PARAVIRTUALIZED",
        ])?;
        let image_id = field(&imported, &["data", "id"])?;

        step(&format!("wait until {image_id} is AVAILABLE"));
        let wait = Wait {
            interval: Duration::from_secs(self.poll_interval),
            deadline: Duration::from_secs(self.import_deadline),
        };
        wait.until_available(&oci, &image_id)?;

        step("firmware UEFI_64");
        let schemas = oci.json(&["compute", "global-image-capability-schema", "list", "--all"])?;
        let version = field(&schemas, &["data", "0", "current-version-name"])?;
        oci.json(&[
            "compute",
            "image-capability-schema",
            "create",
            "--compartment-id",
            compartment,
            "--image-id",
            &image_id,
            "--global-image-capability-schema-version-name",
            &version,
            "--schema-data",
            UEFI_FIRMWARE,
        ])?;

        step(&format!("shape compatibility: {SHAPE}"));
        oci.json(&[
            "compute",
            "image-shape-compatibility-entry",
            "add",
            "--image-id",
            &image_id,
            "--shape-name",
            SHAPE,
        ])?;

        if self.keep_object {
            eprintln!("\nkept {bucket}/{object} (--keep-object)");
        } else {
            step(&format!(
                "delete {bucket}/{object}: the image no longer needs it"
            ));
            oci.json(&[
                "os",
                "object",
                "delete",
                "--namespace",
                &namespace,
                "--bucket-name",
                bucket,
                "--name",
                &object,
                "--force",
            ])?;
        }

        eprintln!("\nimported {name}: launch a {SHAPE} from it (see the README)");
        println!("{image_id}");
        Ok(())
    }
}

fn check_qcow2(image: &Path) -> Result<()> {
    let mut magic = [0u8; 4];
    let read = std::fs::File::open(image).and_then(|mut f| {
        use std::io::Read;
        f.read_exact(&mut magic)
    });
    match read {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => bail!(
            "no image at {}: build it with `cargo xtask image` or `nix build .#e2-micro-image` \
             (then pass --image result/e2-micro.qcow2)",
            image.display()
        ),
        Err(e) => Err(e).with_context(|| format!("read {}", image.display())),
        Ok(()) if magic != QCOW2_MAGIC => bail!(
            "{} is not a qcow2 image; OCI imports it as QCOW2 (`qemu-img info` shows the format)",
            image.display()
        ),
        Ok(()) => Ok(()),
    }
}

fn default_name(image: &Path) -> Result<String> {
    let file = image
        .file_name()
        .and_then(|n| n.to_str())
        .with_context(|| format!("{} has no file name: pass --name", image.display()))?;
    Ok(file.strip_suffix(".qcow2").unwrap_or(file).to_owned())
}

/// How `oci-upload` waits for an import: OCI answers the import at once with the image in
/// IMPORTING (then PROVISIONING), and it becomes AVAILABLE minutes later.
struct Wait {
    interval: Duration,
    deadline: Duration,
}

impl Wait {
    fn until_available(&self, oci: &Oci, image_id: &str) -> Result<()> {
        let start = Instant::now();
        loop {
            let image = oci.json(&["compute", "image", "get", "--image-id", image_id])?;
            let state = field(&image, &["data", "lifecycle-state"])?;
            let waited = start.elapsed();
            match state.as_str() {
                "AVAILABLE" => return Ok(()),
                "IMPORTING" | "PROVISIONING" if waited < self.deadline => {
                    eprintln!("    {state} after {} s", waited.as_secs());
                    std::thread::sleep(self.interval);
                }
                "IMPORTING" | "PROVISIONING" => bail!(
                    "image {image_id} is still {state} after {} s (--import-deadline): OCI may \
                     still finish it; watch it with `oci compute image get --image-id \
                     {image_id}`, then set its firmware and shape by running oci-upload again \
                     or by hand (see the README)",
                    waited.as_secs()
                ),
                other => bail!(
                    "the import of image {image_id} ended {other}, not AVAILABLE: see the work \
                     request in the console (Compute > Custom images > {image_id}); a disk that \
                     is not a valid qcow2 or exceeds the size limit fails this way"
                ),
            }
        }
    }
}

/// A string (or number) at `path` in the CLI's JSON output; numeric steps index arrays.
fn field(json: &Value, path: &[&str]) -> Result<String> {
    let mut at = json;
    for key in path {
        at = match key.parse::<usize>() {
            Ok(i) => at.get(i),
            Err(_) => at.get(key),
        }
        .with_context(|| format!("the OCI CLI's answer has no `{}`: {json}", path.join(".")))?;
    }
    match at {
        Value::String(s) => Ok(s.clone()),
        Value::Number(n) => Ok(n.to_string()),
        other => bail!(
            "`{}` in the OCI CLI's answer is {other}, not a string",
            path.join(".")
        ),
    }
}

/// The OCI CLI, checked to be installed and configured.
struct Oci<'a> {
    sh: &'a Shell,
    region: Option<String>,
    /// The configuration file (none with instance or resource principals), for the error hint.
    config: Option<PathBuf>,
}

impl<'a> Oci<'a> {
    fn new(sh: &'a Shell, region: Option<String>) -> Result<Oci<'a>> {
        if cmd!(sh, "oci --version")
            .quiet()
            .ignore_stdout()
            .run()
            .is_err()
        {
            bail!(
                "the OCI CLI (`oci`) is not installed or not on PATH: install it (`pip install \
                 oci-cli`, or https://docs.oracle.com/iaas/Content/API/SDKDocs/cliinstall.htm), \
                 then run `oci setup config`"
            );
        }
        // Instance and resource principals (OCI_CLI_AUTH) need no configuration file.
        let mut checked = None;
        if sh.var_os("OCI_CLI_AUTH").is_none() {
            let config = match sh.var_os("OCI_CLI_CONFIG_FILE") {
                Some(path) => PathBuf::from(path),
                None => {
                    PathBuf::from(sh.var_os("HOME").context("HOME is not set")?).join(".oci/config")
                }
            };
            if !config.is_file() {
                bail!(
                    "the OCI CLI is not configured: there is no {}; run `oci setup config` (it \
                     asks for the user and tenancy OCIDs and the region, and makes an API key)",
                    config.display()
                );
            }
            checked = Some(config);
        }
        Ok(Oci {
            sh,
            region,
            config: checked,
        })
    }

    /// Runs `oci ARGS --output json [--region R]` and parses its JSON answer (`null` when it
    /// prints none). JSON is the CLI's default, but a user's oci_cli_rc can change it. The
    /// CLI's own progress and errors go to stderr as they come.
    fn json(&self, args: &[&str]) -> Result<Value> {
        let region: Vec<&str> = match &self.region {
            Some(r) => vec!["--region", r],
            None => Vec::new(),
        };
        let sh = self.sh;
        let out = cmd!(sh, "oci {args...} --output json {region...}")
            .read()
            .with_context(|| {
                let repair = match &self.config {
                    Some(config) => format!(
                        "`oci setup repair-file-permissions --file {}` (and the same for the \
                         key_file it names)",
                        config.display()
                    ),
                    None => "OCI_CLI_AUTH and the instance's policies".to_owned(),
                };
                format!(
                    "`oci {}` failed (its message is above); if it cannot authenticate, check \
                     the CLI's configuration with {repair} and `oci iam region list`",
                    args[..3.min(args.len())].join(" ")
                )
            })?;
        if out.trim().is_empty() {
            return Ok(Value::Null);
        }
        serde_json::from_str(&out)
            .with_context(|| format!("`oci {}` printed no JSON: {out}", args.join(" ")))
    }
}
