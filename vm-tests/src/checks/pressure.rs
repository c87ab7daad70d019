//! Memory pressure: a hog that allocates until memory runs short is killed by earlyoom, not by
//! the kernel, while the server keeps running (no restart) and still answers.

use std::time::Duration;

use anyhow::Result;
use serde_json::json;

use super::api::ok_json;
use super::{properties, section, sections, verdict, GENERATION_TIMEOUT};
use crate::http::Api;
use crate::ssh::Ssh;

/// `tail` keeps the current line in memory and /dev/zero never ends one, so it grows until
/// something kills it. It is in neither of earlyoom's lists: it must be chosen on its size.
const HOG: &str = "tail";
/// Seconds the hog may run before the check gives up on anything killing it.
const HOG_LIMIT_SECS: u64 = 900;

pub fn run(ssh: &Ssh, api: &Api) -> Result<String> {
    let out = ssh.check(&format!(
        "echo '## before'; systemctl show llm-server -p NRestarts,MainPID
         since=$(date +%s)
         timeout {HOG_LIMIT_SECS} {HOG} /dev/zero
         status=$?
         echo '## hog'; echo $status
         sleep 3
         echo '## earlyoom'; journalctl -u earlyoom --since @$since -o cat
         echo '## kernel'; journalctl -k --since @$since -o cat | grep -iE 'out of memory|oom-kill|oom_reaper|killed process' || true
         echo '## after'; systemctl show llm-server -p NRestarts,MainPID,ActiveState
         echo '## server'; journalctl -u llm-server --since @$since -o cat | tail -n 15"
    ))?;
    let parts = sections(&out);
    let before = properties(section(&parts, "before")?);
    let after = properties(section(&parts, "after")?);
    let hog_status = section(&parts, "hog")?.trim().to_owned();
    let earlyoom = section(&parts, "earlyoom")?;
    let kernel = section(&parts, "kernel")?;
    let mut problems = Vec::new();

    // 143 = SIGTERM (earlyoom's first signal), 137 = SIGKILL, 124 = the time limit.
    if !matches!(hog_status.as_str(), "143" | "137") {
        problems.push(format!(
            "the hog `{HOG} /dev/zero` ended with status {hog_status}, not killed by a signal"
        ));
    }
    let by_earlyoom = earlyoom
        .lines()
        .find(|l| l.contains("sending SIG") && l.contains(&format!("\"{HOG}\"")));
    if by_earlyoom.is_none() {
        problems.push(format!(
            "earlyoom did not kill the hog; its log:\n{}",
            earlyoom.trim_end()
        ));
    }
    if !kernel.trim().is_empty() {
        problems.push(format!(
            "the kernel's OOM killer ran:\n{}",
            kernel.trim_end()
        ));
    }
    let restarts = after.get("NRestarts").copied();
    if restarts != Some("0")
        || before.get("MainPID") != after.get("MainPID")
        || after.get("ActiveState") != Some(&"active")
    {
        problems.push(format!(
            "llm-server did not stay up: before {before:?}, after {after:?}; its journal since \
             the hog started:\n{}",
            section(&parts, "server")?.trim_end()
        ));
    }
    if !problems.is_empty() {
        return verdict(problems, String::new());
    }

    let health = api.get("/health", Duration::from_secs(30))?;
    let answer = ok_json(api.post(
        "/v1/completions",
        &json!({"prompt": "Hello", "max_tokens": 1, "temperature": 0}),
        GENERATION_TIMEOUT,
    )?)?;
    if health.status != 200 || answer["usage"]["completion_tokens"] != 1 {
        problems.push(format!(
            "after the hog the server answers /health {} and a completion {answer}",
            health.status
        ));
    }
    verdict(
        problems,
        format!(
            "earlyoom: {}; no kernel OOM kill; llm-server NRestarts=0, same pid, answers",
            by_earlyoom.unwrap_or_default().trim()
        ),
    )
}
