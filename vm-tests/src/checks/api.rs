//! The model answers from the host: `/v1/models`, and the golden greedy answer at temperature 0
//! to a question through the chat API (an instruct model's golden asks one) or to a prompt
//! through `/v1/completions` after a short chat (a base model's).

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use appliance::Profile;
use serde_json::{json, Value};

use super::pace::Pace;
use super::GENERATION_TIMEOUT;
use crate::http::{self, Api};

/// The golden prompt: short (prefill is slow under TCG) and its greedy continuation has no near
/// tie in its first tokens. For the instruct default, a question whose greedy answer is whole
/// within [`GOLDEN_CHAT_TOKENS`].
const GOLDEN_PROMPT: &str = "capital";
/// Tokens asked of each completion: enough to compare, few enough for TCG.
const GOLDEN_TOKENS: usize = 4;
/// The most a golden chat answer may take, its end-of-turn token included.
const GOLDEN_CHAT_TOKENS: usize = 12;
const CHAT_TOKENS: usize = 3;

/// What the API check measured.
pub struct Answers {
    pub detail: String,
    /// The chat completion's round trip: the first answer the model gives after boot.
    pub first_answer: Duration,
    /// Seconds per token of that chat, prompt included, to size later generations by.
    pub pace: Option<Pace>,
}

/// The golden greedy continuation of one prompt.
pub struct Golden {
    pub prompt: Prompt,
    pub tokens: Vec<u64>,
    pub text: String,
    /// Tokens of the prompt as llama.cpp read it (for a chat: rendered by the model's template).
    pub prompt_tokens: usize,
}

/// What the golden asks: a text to continue, or a conversation to answer.
pub enum Prompt {
    Text(String),
    Chat(Value),
}

impl Golden {
    /// Reads the prompt `name` from `<dir>/<model stem>.golden.json` and its text or messages
    /// from the cases file it was made from.
    pub fn load(dir: &Path, profile: &Profile, name: &str) -> Result<Golden> {
        let stem = golden_stem(&profile.model.file);
        let stem = stem.as_str();
        let read = |file: &str| -> Result<Value> {
            let path = dir.join(file);
            let text = std::fs::read_to_string(&path).with_context(|| {
                format!(
                    "read {} (the repository's testdata/ holds the golden data; --golden or LLM_GOLDEN_DIR point elsewhere)",
                    path.display()
                )
            })?;
            serde_json::from_str(&text).with_context(|| format!("parse {}", path.display()))
        };
        let golden = read(&format!("{stem}.golden.json"))?;
        let cases = read(&cases_file(stem))?;
        // A cases file lists texts under `prompts` and conversations under `chats`; the golden
        // file has both under `prompts`.
        let find = |v: &Value| -> Option<Value> {
            ["prompts", "chats"]
                .iter()
                .filter_map(|key| v[key].as_array())
                .flatten()
                .find(|p| p["name"] == name)
                .cloned()
        };
        let (Some(result), Some(case)) = (find(&golden), find(&cases)) else {
            bail!(
                "the golden data in {} has no prompt `{name}`",
                dir.display()
            );
        };
        let prompt = match (case["text"].as_str(), &case["messages"]) {
            (Some(text), _) => Prompt::Text(text.to_owned()),
            (None, messages @ Value::Array(_)) => Prompt::Chat(messages.clone()),
            _ => bail!("the case `{name}` has neither text nor messages"),
        };
        Ok(Golden {
            prompt,
            prompt_tokens: result["prompt_tokens"].as_array().map_or(0, Vec::len),
            tokens: result["greedy_tokens"]
                .as_array()
                .context("no greedy_tokens")?
                .iter()
                .filter_map(Value::as_u64)
                .collect(),
            text: result["greedy_text"]
                .as_str()
                .context("no greedy_text")?
                .to_owned(),
        })
    }
}

/// `SmolLM2-135M-Instruct.Q4_1.gguf` → `smollm2-135m-instruct-q4_1`: the golden files' names.
fn golden_stem(file: &str) -> String {
    file.trim_end_matches(".gguf")
        .to_lowercase()
        .replace('.', "-")
}

/// `gemma-3-270m-q4_k_m` → `gemma-3-270m-cases.json`: the cases are shared by a model's
/// quantisations.
fn cases_file(stem: &str) -> String {
    let base = stem.rsplit_once(['-', '.']).map_or(stem, |(base, _)| base);
    format!("{base}-cases.json")
}

/// For a model whose output cannot be golden (synthetic weights): `/v1/models` lists it, and a
/// streamed chat completion sends its tokens back as events that `usage` counts.
pub fn run_streamed(api: &Api, profile: &Profile) -> Result<Answers> {
    let ids = listed_models(api, profile)?;
    let body = json!({
        "messages": [{"role": "user", "content": "Say hello."}],
        "max_tokens": CHAT_TOKENS,
        "temperature": 0,
    });
    let chat = super::stream::generate(api, "/v1/chat/completions", body)?;
    let first_answer = chat.done.duration_since(chat.asked);
    Ok(Answers {
        detail: format!(
            "models {ids:?}; streamed chat {:?}: {} events, usage {} completion tokens ({} \
             prompt) in {:.0} s (synthetic weights: no golden text)",
            chat.text().chars().take(40).collect::<String>(),
            chat.pieces.len(),
            chat.completion_tokens,
            chat.prompt_tokens,
            first_answer.as_secs_f64()
        ),
        first_answer,
        pace: Pace::of(first_answer, chat.prompt_tokens, chat.completion_tokens),
    })
}

/// `/v1/models`' ids, which must include the profile's model.
fn listed_models(api: &Api, profile: &Profile) -> Result<Vec<String>> {
    let models = ok_json(api.get("/v1/models", Duration::from_secs(30))?)?;
    let ids: Vec<String> = models["data"]
        .as_array()
        .map(|d| {
            d.iter()
                .filter_map(|m| m["id"].as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default();
    let file = profile.model.file.as_str();
    let stem = file.trim_end_matches(".gguf");
    ensure!(
        ids.iter().any(|id| id == file || id == stem),
        "/v1/models lists {ids:?}, not the profile's model {file}"
    );
    Ok(ids)
}

pub fn run(api: &Api, profile: &Profile, golden_dir: &Path) -> Result<Answers> {
    let golden = Golden::load(golden_dir, profile, GOLDEN_PROMPT)?;
    let ids = listed_models(api, profile)?;
    match &golden.prompt {
        Prompt::Chat(messages) => golden_chat(api, &golden, messages, ids),
        Prompt::Text(prompt) => golden_completion(api, &golden, prompt, ids),
    }
}

/// The golden question through the chat API: the whole answer, as llama.cpp gave it with the
/// same template, is the first answer the box gives after boot.
fn golden_chat(api: &Api, golden: &Golden, messages: &Value, ids: Vec<String>) -> Result<Answers> {
    ensure!(
        golden.tokens.len() <= GOLDEN_CHAT_TOKENS,
        "the golden answer takes {} tokens, more than the {GOLDEN_CHAT_TOKENS} asked under TCG",
        golden.tokens.len()
    );
    let (chat, reply, first_answer) = greedy_chat(api, messages, GOLDEN_CHAT_TOKENS)?;
    let reply = reply.as_str();
    let question = messages[messages.as_array().map_or(0, Vec::len).saturating_sub(1)]["content"]
        .as_str()
        .unwrap_or_default();
    let prompt_tokens = chat["usage"]["prompt_tokens"].as_u64().unwrap_or(0);
    ensure!(
        reply == golden.text && chat["choices"][0]["finish_reason"] == "stop",
        "{question:?} at temperature 0 was answered {reply:?} ({}); llama.cpp's greedy answer \
         with the model's chat template is {:?}",
        chat["choices"][0]["finish_reason"],
        golden.text
    );
    ensure!(
        prompt_tokens == golden.prompt_tokens as u64,
        "the chat template gave {prompt_tokens} prompt tokens, llama.cpp's rendering {}",
        golden.prompt_tokens
    );
    Ok(Answers {
        detail: format!(
            "models {ids:?}; {question:?} → {reply:?} = golden, in {:.0} s",
            first_answer.as_secs_f64()
        ),
        first_answer,
        pace: Pace::of(
            first_answer,
            prompt_tokens,
            chat["usage"]["completion_tokens"].as_u64().unwrap_or(0),
        ),
    })
}

/// A chat completion of `messages` at temperature 0: the answer, its text and its round trip.
fn greedy_chat(
    api: &Api,
    messages: &Value,
    max_tokens: usize,
) -> Result<(Value, String, Duration)> {
    let asked = Instant::now();
    let chat = ok_json(api.post(
        "/v1/chat/completions",
        &json!({"messages": messages, "max_tokens": max_tokens, "temperature": 0}),
        GENERATION_TIMEOUT,
    )?)?;
    let reply = chat["choices"][0]["message"]["content"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    Ok((chat, reply, asked.elapsed()))
}

/// A short chat (its round trip is the first answer), then the golden prompt's greedy
/// continuation through `/v1/completions`, token for token.
fn golden_completion(
    api: &Api,
    golden: &Golden,
    prompt: &str,
    ids: Vec<String>,
) -> Result<Answers> {
    ensure!(
        golden.tokens.len() >= GOLDEN_TOKENS,
        "the golden continuation has fewer than {GOLDEN_TOKENS} tokens"
    );
    let messages = json!([{"role": "user", "content": "Say hello."}]);
    let (chat, reply, first_answer) = greedy_chat(api, &messages, CHAT_TOKENS)?;
    let generated = chat["usage"]["completion_tokens"].as_u64().unwrap_or(0);
    ensure!(
        !reply.trim().is_empty() && generated > 0,
        "the chat completion has no text: {chat}"
    );

    let completion = ok_json(api.post(
        "/v1/completions",
        &json!({
            "prompt": prompt,
            "max_tokens": GOLDEN_TOKENS,
            "temperature": 0,
        }),
        GENERATION_TIMEOUT,
    )?)?;
    let text = completion["choices"][0]["text"]
        .as_str()
        .unwrap_or_default();
    let count = completion["usage"]["completion_tokens"].as_u64();
    ensure!(
        count == Some(GOLDEN_TOKENS as u64),
        "/v1/completions generated {count:?} tokens, asked for {GOLDEN_TOKENS}: {completion}"
    );
    // The text is what the client sees; its ids say it is exactly the golden tokens.
    let token_ids = ok_json(api.post(
        "/tokenize",
        &json!({"content": text, "add_special": false, "parse_special": false}),
        Duration::from_secs(60),
    )?)?;
    let token_ids: Vec<u64> = token_ids["tokens"]
        .as_array()
        .map(|t| t.iter().filter_map(Value::as_u64).collect())
        .unwrap_or_default();
    let want = &golden.tokens[..GOLDEN_TOKENS];
    ensure!(
        golden.text.starts_with(text) && token_ids == want,
        "{:?} at temperature 0 continued with {text:?} (ids {token_ids:?}); the golden greedy text \
         starts {:?} (ids {want:?})",
        prompt,
        golden.text.chars().take(40).collect::<String>()
    );
    Ok(Answers {
        detail: format!(
            "models {ids:?}; chat {reply:?} in {:.0} s; {:?} → {text:?} = golden {want:?}",
            first_answer.as_secs_f64(),
            prompt,
        ),
        first_answer,
        pace: Pace::of(
            first_answer,
            chat["usage"]["prompt_tokens"].as_u64().unwrap_or(0),
            generated,
        ),
    })
}

/// The API's door from the host: no key, a wrong key of the key's length and of another
/// length are 401; plain HTTP on the port is refused naming https (400) or redirected, never
/// served; the key over HTTPS pinned to the box's certificate is 200. `api` carries the key.
pub fn auth(api: &Api) -> Result<String> {
    let key = api
        .key
        .clone()
        .context("the suite read no API key from the guest")?;
    let fingerprint = api
        .tls
        .context("the suite read no certificate from the guest")?;
    let same_length: String = key
        .chars()
        .map(|c| if c == '0' { '1' } else { '0' })
        .collect();
    let timeout = Duration::from_secs(30);
    let mut problems = Vec::new();
    for (what, attempt) in [
        ("no key", api.with_key(None)),
        (
            "a wrong key of the same length",
            api.with_key(Some(&same_length)),
        ),
        (
            "a wrong, shorter key",
            api.with_key(Some(&key[..key.len() / 2])),
        ),
    ] {
        let r = attempt.get("/v1/models", timeout)?;
        if r.status != 401 {
            problems.push(format!("{what}: {} {}", r.status, r.body.trim()));
        }
    }
    let plain = api.without_tls().get("/v1/models", timeout)?;
    let refused = (plain.status == 400 && plain.body.to_lowercase().contains("https"))
        || (300..400).contains(&plain.status);
    if !refused || plain.body.contains("\"data\"") {
        problems.push(format!(
            "plain HTTP got {} {} (want 400 naming https, or a redirect)",
            plain.status,
            plain.body.trim()
        ));
    }
    let r = api.get("/v1/models", timeout)?;
    if r.status != 200 {
        problems.push(format!(
            "the key over HTTPS: {} {}",
            r.status,
            r.body.trim()
        ));
    }
    super::verdict(
        problems,
        format!(
            "401 without a key and with wrong keys of both lengths; plain HTTP {}; 200 with the \
             key over HTTPS pinned to {fingerprint}",
            plain.status
        ),
    )
}

/// The JSON body of a 200 answer; any other status fails with the body.
pub fn ok_json(response: http::Response) -> Result<Value> {
    if response.status != 200 {
        bail!("HTTP {}: {}", response.status, response.body.trim());
    }
    response.json()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cases_are_named_without_the_quantisation() {
        assert_eq!(cases_file("gemma-3-270m-q4_k_m"), "gemma-3-270m-cases.json");
    }

    #[test]
    fn golden_files_are_named_by_the_models_lowercase_stem() {
        assert_eq!(
            golden_stem("SmolLM2-135M-Instruct.Q4_1.gguf"),
            "smollm2-135m-instruct-q4_1"
        );
        assert_eq!(
            golden_stem("gemma-3-270m-q4_k_m.gguf"),
            "gemma-3-270m-q4_k_m"
        );
    }

    /// The shipped profile's instruct model is asked a question through the chat API, and its
    /// golden answer is whole within what the check asks for under TCG.
    #[test]
    fn reads_the_capital_question_from_the_golden_data() {
        let dir = test_support::testdata_dir();
        let profile = Profile::load(&test_support::default_profile()).unwrap();
        let golden = Golden::load(&dir, &profile, GOLDEN_PROMPT).unwrap();
        let Prompt::Chat(messages) = &golden.prompt else {
            panic!("the default profile's golden prompt is not a chat");
        };
        assert_eq!(
            messages[0]["content"], "Which city is the capital of France?",
            "{messages}"
        );
        assert_eq!(golden.text, "The capital of France is Paris.");
        assert!(golden.tokens.len() <= GOLDEN_CHAT_TOKENS);
        assert!(golden.prompt_tokens > 0);
    }

    /// A base model's golden prompt is a text to continue.
    #[test]
    fn reads_the_capital_prompt_of_a_base_model() {
        let dir = test_support::testdata_dir();
        let text = std::fs::read_to_string(test_support::default_profile())
            .unwrap()
            .replace(
                test_support::SMOLLM2_MODEL_FILE,
                test_support::DEFAULT_MODEL_FILE,
            );
        let profile = Profile::parse(&text, Path::new("base.toml")).unwrap();
        let golden = Golden::load(&dir, &profile, GOLDEN_PROMPT).unwrap();
        let Prompt::Text(prompt) = &golden.prompt else {
            panic!("the base model's golden prompt is not a text");
        };
        assert_eq!(prompt, "The capital of France is");
        assert!(golden.text.starts_with(" the capital"), "{}", golden.text);
        assert!(golden.tokens.len() >= GOLDEN_TOKENS);
    }
}
