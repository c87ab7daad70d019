//! A restart while other processes hold the memory the server plans: the server must wait for
//! it ("waiting for memory" in the unit's status, `serve --wait-for-memory`) and come up once it
//! is freed, not refuse for good. A hog of a fixed size leaves the box less free memory than the
//! plan but more than earlyoom's lines, so nothing kills it until the check does.

use anyhow::{Context, Result};
use appliance::paths;
use appliance::plan::{self, ServerPlan, MIB};
use appliance::Profile;
use serde_json::json;

use super::api::ok_json;
use super::{properties, section, sections, verdict, GENERATION_TIMEOUT};
use crate::http::Api;
use crate::ssh::Ssh;

/// What the hog leaves free, below the plan: far enough under it that the server's own start
/// (binary, mapping the file) does not close the gap.
const SHORT_BY: u64 = 96 * MIB;

pub fn run(ssh: &Ssh, api: &Api, profile: &Profile) -> Result<String> {
    let s = &profile.server;
    let mut command = vec![paths::SERVER_BINARY.to_owned()];
    command.extend(plan::args(&profile.model_path(), s.ctx_size, s.parallel));
    // Status 2: the plan does not fit what is free with the server running, which is not asked.
    let json = ssh.check(&format!("{} || [ $? -eq 2 ]", command.join(" ")))?;
    let plan = ServerPlan::parse(&json).context("the guest's plan")?;
    let target_kib = (plan.total_bytes - SHORT_BY) / 1024;

    let out = ssh.check(&format!(
        "since=$(date +%s)
         systemctl stop llm-server
         avail=$(awk '/^MemAvailable/{{print $2}}' /proc/meminfo)
         hog=$((avail - {target_kib}))
         # tail keeps the one endless line it reads; the sleep holds the pipe open.
         setsid sh -c \"{{ head -c ${{hog}}K /dev/zero; sleep 900; }} | tail\" >/dev/null 2>&1 &
         for i in $(seq 1 120); do
             now=$(awk '/^MemAvailable/{{print $2}}' /proc/meminfo)
             [ \"$now\" -le $(({target_kib} + 16384)) ] && break
             sleep 1
         done
         echo '## short'; grep -E '^(MemAvailable|SwapFree)' /proc/meminfo
         systemctl start --no-block llm-server
         for i in $(seq 1 300); do
             status=$(systemctl show -p StatusText --value llm-server)
             case \"$status\" in *'waiting for memory'*) break;; esac
             sleep 1
         done
         echo '## waiting'; systemctl show -p StatusText,ActiveState llm-server
         pkill -x tail; pkill -x sleep
         for i in $(seq 1 900); do
             [ \"$(systemctl show -p ActiveState --value llm-server)\" = active ] && break
             sleep 1
         done
         echo '## after'; systemctl show -p ActiveState,NRestarts llm-server
         echo '## server'; journalctl -u llm-server --since @$since -o cat | grep -v '^ ' | tail -n 12"
    ))?;
    let parts = sections(&out);
    let waiting = properties(section(&parts, "waiting")?);
    let after = properties(section(&parts, "after")?);
    let journal = section(&parts, "server")?;
    let mut problems = Vec::new();
    let status = waiting.get("StatusText").copied().unwrap_or_default();
    if !status.contains("waiting for memory") || waiting.get("ActiveState") != Some(&"activating") {
        problems.push(format!(
            "with {} free the restarted server did not wait for memory: {waiting:?}",
            section(&parts, "short")?.trim().replace('\n', ", ")
        ));
    }
    if after.get("ActiveState") != Some(&"active") || !journal.contains("waited") {
        problems.push(format!(
            "once the hog was gone the server did not come up: {after:?}; its journal:\n{journal}"
        ));
    }
    if !problems.is_empty() {
        return verdict(problems, String::new());
    }
    let answer = ok_json(api.post(
        "/v1/completions",
        &json!({"prompt": "Hello", "max_tokens": 1, "temperature": 0}),
        GENERATION_TIMEOUT,
    )?)?;
    if answer["usage"]["completion_tokens"] != 1 {
        problems.push(format!("after the wait the server answers {answer}"));
    }
    verdict(
        problems,
        format!(
            "plan {} MiB; {}; unit status \"{status}\", then active and answering ({})",
            plan.total_bytes / MIB,
            section(&parts, "short")?.trim().replace('\n', ", "),
            journal
                .lines()
                .find(|l| l.contains("waited"))
                .unwrap_or_default()
                .trim()
        ),
    )
}
