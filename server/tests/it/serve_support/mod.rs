//! Helpers for the `serve_*` tests. Request shapes are tested in process ([`app`]); the real
//! `llm-server` binary is started on a free loopback port only for what needs a process of its
//! own (signals, sd_notify, disconnects, its RSS, its exit status), and talked to in HTTP/1.1
//! over plain sockets, so every byte on the wire is under the test's control.

pub mod app;
pub mod hostile;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

/// The tiny Gemma 3 model of the golden data: loads in milliseconds, decodes fast.
pub fn synth_model() -> PathBuf {
    test_support::synth("synth-gemma3-q8_0.gguf")
}

pub fn binary() -> &'static str {
    env!("CARGO_BIN_EXE_llm-server")
}

/// The binary for a server started with `env`: the tests' build with hooks
/// (`llm-server-test-hooks`, see server/src/hooks.rs) when `env` sets an `LLM_SERVER_TEST_*`
/// variable, the shipped one otherwise.
fn binary_for(env: &[(&str, &Path)]) -> &'static str {
    if env.iter().any(|(k, _)| k.starts_with("LLM_SERVER_TEST_")) {
        env!("CARGO_BIN_EXE_llm-server-test-hooks")
    } else {
        binary()
    }
}

/// A running `llm-server serve`, stopped (SIGKILL) when dropped.
pub struct Server {
    child: Child,
    pub addr: SocketAddr,
    log: PathBuf,
}

impl Server {
    /// Starts `serve --model <model> <args>` on a free port and waits until `/health` is 200.
    pub fn start(model: &Path, args: &[&str]) -> Server {
        let server = Server::spawn(model, args);
        server.wait_ready();
        server
    }

    /// Starts the server without waiting for it.
    pub fn spawn(model: &Path, args: &[&str]) -> Server {
        Server::spawn_with_env(model, args, &[])
    }

    /// Starts the server with extra environment variables and waits until it is ready.
    pub fn start_with_env(model: &Path, args: &[&str], env: &[(&str, &Path)]) -> Server {
        let server = Server::spawn_with_env(model, args, env);
        server.wait_ready();
        server
    }

    /// Starts the server with extra environment variables, without waiting for it.
    pub fn spawn_with_env(model: &Path, args: &[&str], env: &[(&str, &Path)]) -> Server {
        let port = free_port();
        let log =
            std::env::temp_dir().join(format!("llm-serve-test-{}-{port}.log", std::process::id()));
        let stderr = std::fs::File::create(&log).unwrap();
        let child = Command::new(binary_for(env))
            .arg("serve")
            .arg("--model")
            .arg(model)
            .args(["--port", &port.to_string()])
            .args(args)
            .envs(env.iter().copied())
            .stdout(Stdio::null())
            .stderr(stderr)
            .spawn()
            .expect("start llm-server");
        Server {
            child,
            addr: SocketAddr::from(([127, 0, 0, 1], port)),
            log,
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The server's log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn wait_ready(&self) {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Ok(r) = try_request(self.addr, "GET", "/health", &[], b"") {
                if r.status == 200 {
                    return;
                }
            }
            assert!(
                Instant::now() < deadline,
                "server not ready in 60 s:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// One sample of `/metrics` (a series without labels).
    pub fn metric(&self, name: &str) -> f64 {
        metric(&self.get("/metrics").body, name)
    }

    /// The exit status if the process has exited, without waiting.
    pub fn exited(&mut self) -> Option<ExitStatus> {
        self.child.try_wait().unwrap()
    }

    /// Waits up to `within` for the process to exit by itself.
    pub fn wait_exit(&mut self, within: Duration) -> ExitStatus {
        let deadline = Instant::now() + within;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "still running after {within:?}:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Sends SIGTERM and waits up to `within` for the process to exit.
    pub fn terminate(mut self, within: Duration) -> ExitStatus {
        let status = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .unwrap();
        assert!(status.success());
        self.wait_exit(within)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_file(&self.log);
    }
}

/// The sample of the series `name` (without labels) in the `/metrics` text.
pub fn metric(text: &str, name: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or_else(|| panic!("metric {name} missing from:\n{text}"))
}

/// A port nobody listens on now (the kernel's pick for an ephemeral bind).
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// One request and its whole response, to a spawned [`Server`] or an in-process
/// [`app::App`]: the tests read the same either way.
pub trait Requests {
    fn request(&self, method: &str, path: &str, headers: &[(&str, &str)], body: &[u8]) -> Response;

    fn get(&self, path: &str) -> Response {
        self.request("GET", path, &[], b"")
    }

    fn post_json(&self, path: &str, body: &Value) -> Response {
        self.request(
            "POST",
            path,
            &[("Content-Type", "application/json")],
            body.to_string().as_bytes(),
        )
    }
}

impl Requests for Server {
    fn request(&self, method: &str, path: &str, headers: &[(&str, &str)], body: &[u8]) -> Response {
        try_request(self.addr, method, path, headers, body)
            .unwrap_or_else(|e| panic!("{method} {path}: {e}\nserver log:\n{}", self.log()))
    }
}

#[derive(Debug)]
pub struct Response {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: String,
}

impl Response {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    pub fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("not JSON ({e}): {self:?}"))
    }

    /// The `data:` payloads of a server-sent-events body.
    pub fn sse_data(&self) -> Vec<String> {
        self.body
            .lines()
            .filter_map(|l| l.strip_prefix("data: "))
            .map(str::to_owned)
            .collect()
    }

    /// The OpenAI error message, asserting the error shape.
    pub fn error_message(&self) -> String {
        let v = self.json();
        let e = &v["error"];
        assert!(
            e["type"].is_string() && e.get("param").is_some() && e.get("code").is_some(),
            "{v}"
        );
        e["message"].as_str().unwrap().to_owned()
    }
}

/// One request on its own connection (`Connection: close`), read to the end.
pub fn try_request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> std::io::Result<Response> {
    let mut stream = TcpStream::connect(addr)?;
    stream.set_read_timeout(Some(Duration::from_secs(120)))?;
    write_request(&mut stream, method, path, headers, body)?;
    let mut reader = BufReader::new(stream);
    let (status, headers) = read_head(&mut reader)?;
    let mut raw = Vec::new();
    reader.read_to_end(&mut raw)?;
    let chunked = headers
        .iter()
        .any(|(k, v)| k.eq_ignore_ascii_case("transfer-encoding") && v.contains("chunked"));
    let body = if chunked { dechunk(&raw) } else { raw };
    Ok(Response {
        status,
        headers,
        body: String::from_utf8(body).map_err(|e| std::io::Error::other(e.to_string()))?,
    })
}

pub fn write_request(
    stream: &mut TcpStream,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> std::io::Result<()> {
    // `Host: localhost` unless the test gives its own.
    let host = if headers.iter().any(|(k, _)| k.eq_ignore_ascii_case("host")) {
        ""
    } else {
        "Host: localhost\r\n"
    };
    let mut head = format!(
        "{method} {path} HTTP/1.1\r\n{host}Connection: close\r\nContent-Length: {}\r\n",
        body.len()
    );
    for (k, v) in headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str("\r\n");
    stream.write_all(head.as_bytes())?;
    stream.write_all(body)
}

/// Status line and headers.
pub fn read_head(reader: &mut impl BufRead) -> std::io::Result<(u16, Vec<(String, String)>)> {
    let mut line = String::new();
    reader.read_line(&mut line)?;
    let status = line
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| std::io::Error::other(format!("bad status line {line:?}")))?;
    let mut headers = Vec::new();
    loop {
        line.clear();
        reader.read_line(&mut line)?;
        let l = line.trim_end();
        if l.is_empty() {
            return Ok((status, headers));
        }
        if let Some((k, v)) = l.split_once(':') {
            headers.push((k.trim().to_owned(), v.trim().to_owned()));
        }
    }
}

/// Decodes a complete chunked body.
fn dechunk(mut raw: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    while let Some(eol) = raw.windows(2).position(|w| w == b"\r\n") {
        let size = std::str::from_utf8(&raw[..eol])
            .ok()
            .and_then(|s| usize::from_str_radix(s.trim(), 16).ok());
        let Some(size) = size.filter(|&n| n > 0) else {
            break;
        };
        let start = eol + 2;
        out.extend_from_slice(&raw[start..(start + size).min(raw.len())]);
        raw = raw.get(start + size + 2..).unwrap_or_default();
    }
    out
}

/// Runs `python3 <script> <args>` from `tests/py/`, failing with the install command when a
/// module it needs is missing (CI installs them; a missing one is a setup error, not a skip).
pub fn python(script: &str, modules: &[&str], args: &[&str]) -> String {
    for module in modules {
        let ok = Command::new("python3")
            .args(["-c", &format!("import {module}")])
            .status()
            .is_ok_and(|s| s.success());
        assert!(
            ok,
            "python module `{module}` missing: run `python3 -m pip install {}`",
            module.replace('_', "-")
        );
    }
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/py")
        .join(script);
    let out = Command::new("python3")
        .arg(&path)
        .args(args)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{script} failed ({}):\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// An answer's `usage.prompt_tokens_details.cached_tokens`: prompt tokens read from a slot.
pub fn cached(v: &serde_json::Value) -> u64 {
    v["usage"]["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap_or_else(|| panic!("no cached_tokens in {v}"))
}

/// An answer's `usage.prompt_tokens`.
pub fn prompt_tokens(v: &serde_json::Value) -> u64 {
    v["usage"]["prompt_tokens"].as_u64().unwrap()
}
