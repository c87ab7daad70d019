//! The prompt cache across a restart of the unit: the slots' tokens and KV rows are saved on the
//! graceful stop (`serve --slot-save-path`, under the unit's `StateDirectory=`) and restored
//! before READY, so a long prompt asked before `systemctl restart llm-server` is read from the
//! cache when it is asked again after it.

use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use appliance::paths;
use serde_json::{json, Value};

use super::api::ok_json;
use super::GENERATION_TIMEOUT;
use crate::http::Api;
use crate::ssh::Ssh;

/// How long the restarted server may take to answer `/health` 200: the model loads again, as
/// at boot, under TCG.
const RESTART_BUDGET: Duration = Duration::from_secs(900);

/// A prompt of about a hundred tokens: long enough that reading it dwarfs one token of
/// evaluation, short enough for TCG's pace (seconds per token).
fn long_prompt() -> String {
    let sentence = "The appliance keeps each conversation in its slot and writes the slots to \
                    its state directory when it stops, so that a restart costs no reading. ";
    format!("{}Summary:", sentence.repeat(4))
}

fn complete(api: &Api, prompt: &str) -> Result<(Value, Duration)> {
    let body = json!({"prompt": prompt, "max_tokens": 1, "temperature": 0});
    let asked = Instant::now();
    let answer = ok_json(api.post("/v1/completions", &body, GENERATION_TIMEOUT)?)?;
    Ok((answer, asked.elapsed()))
}

fn usage(answer: &Value, field: &str) -> Result<u64> {
    let value = match field {
        "cached_tokens" => &answer["usage"]["prompt_tokens_details"]["cached_tokens"],
        _ => &answer["usage"][field],
    };
    value
        .as_u64()
        .with_context(|| format!("no usage {field} in {answer}"))
}

pub fn run(ssh: &Ssh, api: &Api) -> Result<String> {
    let prompt = long_prompt();
    let (cold, cold_time) = complete(api, &prompt)?;
    let n = usage(&cold, "prompt_tokens")?;
    ssh.check(&format!("systemctl restart {}", paths::SERVER_UNIT))?;
    let restarted = Instant::now();
    loop {
        match api.get("/health", Duration::from_secs(30)) {
            Ok(r) if r.status == 200 => break,
            _ if restarted.elapsed() > RESTART_BUDGET => {
                bail!("/health did not answer 200 within {RESTART_BUDGET:?} of `systemctl restart`")
            }
            _ => std::thread::sleep(Duration::from_secs(2)),
        }
    }
    let ready_after = restarted.elapsed();
    let (warm, warm_time) = complete(api, &prompt)?;
    let cached = usage(&warm, "cached_tokens")?;
    ensure!(
        cached + 1 >= n,
        "after the restart {cached} of the prompt's {n} tokens came from the cache (the slot was \
         not saved or not restored: `journalctl -u {}`)",
        paths::SERVER_UNIT
    );
    ensure!(
        warm["choices"][0]["text"] == cold["choices"][0]["text"],
        "the restored slot answered {} where the cold one answered {}",
        warm["choices"][0]["text"],
        cold["choices"][0]["text"]
    );
    Ok(format!(
        "{n}-token prompt in {:.1} s cold; restart, ready after {:.0} s; again in {:.1} s \
         ({:.0} % of cold) with {cached} tokens cached",
        cold_time.as_secs_f64(),
        ready_after.as_secs_f64(),
        warm_time.as_secs_f64(),
        100.0 * warm_time.as_secs_f64() / cold_time.as_secs_f64()
    ))
}
