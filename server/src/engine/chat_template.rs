//! Chat messages to prompt text: the model's own Jinja template (`tokenizer.chat_template`)
//! rendered with minijinja, or llama.cpp's built-in Gemma turn format when the file has none
//! (the default model has none).
//!
//! When the tokenizer adds BOS, the rendered text never starts with it: templates write
//! `{{ bos_token }}` themselves, which would give two (a known Gemma 270M pitfall). As llama.cpp
//! does, a leading BOS is then stripped from the rendering so that tokenization adds exactly
//! one. A tokenizer that adds none keeps the rendering whole: SmolLM2's BOS is `<|im_start|>`,
//! which its template writes to open the first turn.

use minijinja::{Environment, ErrorKind, Value};
use serde::Serialize;

use super::PromptError;
use crate::model::Model;
use crate::tokenizer::Tokenizer;

/// One chat turn after validation.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Turn {
    pub role: String,
    pub content: String,
    /// An assistant turn's calls, as chat templates read them: `[{"type": "function",
    /// "function": {"name": ..., "arguments": {...}}}]`, arguments as an object.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<serde_json::Value>,
    /// A `tool` turn's answer is to this call.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
}

/// How a model writes a tool call, and so how one is parsed back and constrained.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ToolSyntax {
    /// `<tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>`: Qwen2.5, Qwen3 and the
    /// Hermes/ChatML templates, and the prompt format given to templates without tools (Gemma).
    Hermes,
    /// A bare `{"name": ..., "parameters": {...}}`: Llama 3.1-3.3's JSON tool calling.
    Llama3,
}

impl ToolSyntax {
    /// The syntax of the model whose chat template is `source`.
    pub fn for_template(source: Option<&str>) -> ToolSyntax {
        match source {
            Some(s) if !s.contains("<tool_call>") && s.contains("<|python_tag|>") => {
                ToolSyntax::Llama3
            }
            _ => ToolSyntax::Hermes,
        }
    }
}

/// Whether a template renders `tools` itself (else [`tools_prompt`] goes into the system turn).
fn template_reads_tools(source: &str) -> bool {
    source.contains("tools")
}

/// The documented tool prompt for templates that have none (Gemma 3, the built-in format):
/// the functions as JSON, one per line, and how to call them, in the system text.
pub fn tools_prompt(tools: &[serde_json::Value]) -> String {
    let mut out = String::from(
        "You can call functions. Their definitions, one JSON object per line:\n<tools>\n",
    );
    for tool in tools {
        out.push_str(&tool.to_string());
        out.push('\n');
    }
    out.push_str(
        "</tools>\nTo call a function, reply with only\n<tool_call>\n{\"name\": <function name>, \"arguments\": <arguments as a JSON object>}\n</tool_call>\nOtherwise answer normally. A function's result comes back in a turn that starts with <tool_response>.",
    );
    out
}

pub enum ChatTemplate {
    Jinja {
        /// Boxed: an environment is large, and the built-in variant is a unit.
        env: Box<Environment<'static>>,
        bos: String,
        eos: String,
        /// Whether tokenization adds BOS, so a leading one in the rendering is stripped.
        strip_bos: bool,
    },
    /// `<start_of_turn>{role}\n{content}<end_of_turn>\n`, roles user/model.
    Gemma,
}

#[derive(Debug, thiserror::Error)]
pub enum TemplateError {
    #[error("the model's tokenizer.chat_template is not valid Jinja: {0:#}")]
    Syntax(minijinja::Error),
    /// The template refused the conversation (`raise_exception`) or failed on it.
    #[error("the model's chat template rejected the messages: {0}")]
    Render(String),
}

const TEMPLATE_NAME: &str = "tokenizer.chat_template";

impl ChatTemplate {
    /// The template of `model`, with the texts of its BOS and EOS tokens.
    pub fn for_model(model: &Model) -> Result<ChatTemplate, TemplateError> {
        let tokenizer = model.tokenizer();
        let text_of = |id: Option<u32>| {
            id.map(|id| String::from_utf8_lossy(tokenizer.piece(id, true)).into_owned())
                .unwrap_or_default()
        };
        ChatTemplate::new(
            model.chat_template(),
            &text_of(tokenizer.bos()),
            &text_of(tokenizer.eos()),
            tokenizer.add_bos(),
        )
    }

    /// The template for a model: its Jinja source if it has one, else the Gemma format.
    /// `bos`/`eos` are the texts of those tokens, offered to templates as `bos_token`/`eos_token`;
    /// `adds_bos`: whether the tokenizer prepends BOS to the rendering.
    pub fn new(
        source: Option<&str>,
        bos: &str,
        eos: &str,
        adds_bos: bool,
    ) -> Result<ChatTemplate, TemplateError> {
        let Some(source) = source else {
            return Ok(ChatTemplate::Gemma);
        };
        let mut env = Environment::new();
        // Templates are written for Python's Jinja: `.strip()`, `.startswith()`, `.items()`.
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function(
            "raise_exception",
            |msg: String| -> Result<Value, minijinja::Error> {
                Err(minijinja::Error::new(ErrorKind::InvalidOperation, msg))
            },
        );
        env.add_function("strftime_now", |format: String| {
            // Used by Llama 3 templates for "Today Date"; UTC is a fine answer for a server.
            strftime_now_utc(&format)
        });
        env.add_template_owned(TEMPLATE_NAME, source.to_owned())
            .map_err(TemplateError::Syntax)?;
        Ok(ChatTemplate::Jinja {
            env: Box::new(env),
            bos: bos.to_owned(),
            eos: eos.to_owned(),
            strip_bos: adds_bos && !bos.is_empty(),
        })
    }

    /// The prompt's tokens for `turns` and `tools` (see [`ChatTemplate::render_with_tools`]).
    /// The template's own markup is read for control tokens; what the client wrote (contents,
    /// roles, calls, tools) is plain text unless `parse_special_in_content` (llama.cpp's way,
    /// under which `<end_of_turn>` in a user's text ends the turn).
    /// Refused past `max_tokens` ([`Tokenizer::encode_within`]).
    pub fn tokens(
        &self,
        tokenizer: &Tokenizer,
        turns: &[Turn],
        tools: &[serde_json::Value],
        parse_special_in_content: bool,
        max_tokens: usize,
    ) -> Result<Vec<u32>, PromptError> {
        // The rendering starts without BOS; the tokenizer adds exactly one.
        if parse_special_in_content {
            let text = self.render_with_tools(turns, tools)?;
            return Ok(tokenizer.encode_within(&text, true, true, max_tokens)?);
        }
        let turns: Vec<Turn> = turns.iter().map(|t| plain_turn(tokenizer, t)).collect();
        let tools: Vec<serde_json::Value> =
            tools.iter().map(|t| plain_json(tokenizer, t)).collect();
        let text = self.render_with_tools(&turns, &tools)?;
        Ok(tokenizer.encode_marked_within(&text, true, max_tokens)?)
    }

    /// The prompt text for `turns`, ending with the opening of the assistant's turn.
    pub fn render(&self, turns: &[Turn]) -> Result<String, TemplateError> {
        self.render_with_tools(turns, &[])
    }

    /// As [`ChatTemplate::render`], offering the functions `tools` (OpenAI's `tools` list):
    /// templates that read `tools` get them as is; for the others (Gemma 3, the built-in
    /// format) [`tools_prompt`] opens the system text, calls are written back as
    /// `<tool_call>` text and tool results as `<tool_response>` user turns.
    pub fn render_with_tools(
        &self,
        turns: &[Turn],
        tools: &[serde_json::Value],
    ) -> Result<String, TemplateError> {
        let native = match self {
            ChatTemplate::Gemma => false,
            ChatTemplate::Jinja { env, .. } => env
                .get_template(TEMPLATE_NAME)
                .is_ok_and(|t| template_reads_tools(t.source())),
        };
        let prompted;
        let (turns, tools) = if native || (tools.is_empty() && !has_tool_turns(turns)) {
            (turns, tools)
        } else {
            prompted = as_plain_turns(turns, tools);
            (&prompted[..], &[][..])
        };
        match self {
            ChatTemplate::Gemma => Ok(gemma(turns)),
            ChatTemplate::Jinja {
                env,
                bos,
                eos,
                strip_bos,
            } => {
                let template = env
                    .get_template(TEMPLATE_NAME)
                    .map_err(|e| TemplateError::Render(e.to_string()))?;
                let text = template
                    .render(minijinja::context! {
                        messages => turns,
                        tools => (!tools.is_empty()).then_some(tools),
                        add_generation_prompt => true,
                        bos_token => bos,
                        eos_token => eos,
                    })
                    .map_err(|e| TemplateError::Render(render_error_message(&e)))?;
                Ok(match text.strip_prefix(bos.as_str()) {
                    Some(rest) if *strip_bos => rest.to_owned(),
                    _ => text,
                })
            }
        }
    }
}

/// `turn` with every text the client wrote marked plain ([`Tokenizer::mark_plain`]).
fn plain_turn(tokenizer: &Tokenizer, turn: &Turn) -> Turn {
    Turn {
        role: tokenizer.mark_plain(&turn.role).into_owned(),
        content: tokenizer.mark_plain(&turn.content).into_owned(),
        tool_calls: turn.tool_calls.as_ref().map(|c| plain_json(tokenizer, c)),
        tool_call_id: turn
            .tool_call_id
            .as_ref()
            .map(|id| tokenizer.mark_plain(id).into_owned()),
    }
}

/// `value` with every string in it (keys too) marked plain. Recursion is bounded: the value
/// was read from a request body, which serde_json reads at most 128 levels deep.
fn plain_json(tokenizer: &Tokenizer, value: &serde_json::Value) -> serde_json::Value {
    use serde_json::Value;
    match value {
        Value::String(s) => Value::String(tokenizer.mark_plain(s).into_owned()),
        Value::Array(items) => {
            Value::Array(items.iter().map(|v| plain_json(tokenizer, v)).collect())
        }
        Value::Object(map) => Value::Object(
            map.iter()
                .map(|(k, v)| {
                    (
                        tokenizer.mark_plain(k).into_owned(),
                        plain_json(tokenizer, v),
                    )
                })
                .collect(),
        ),
        other => other.clone(),
    }
}

fn has_tool_turns(turns: &[Turn]) -> bool {
    turns
        .iter()
        .any(|t| t.role == "tool" || t.tool_calls.is_some())
}

/// The conversation for a template that knows no tools: the tool prompt first in the system
/// text, calls as `<tool_call>` text, tool results as user turns in `<tool_response>`.
fn as_plain_turns(turns: &[Turn], tools: &[serde_json::Value]) -> Vec<Turn> {
    let mut out: Vec<Turn> = Vec::with_capacity(turns.len() + 1);
    if !tools.is_empty() {
        let prompt = tools_prompt(tools);
        match turns.first() {
            Some(first) if first.role == "system" => out.push(Turn {
                role: "system".into(),
                content: format!("{prompt}\n\n{}", first.content),
                ..Turn::default()
            }),
            _ => out.push(Turn {
                role: "system".into(),
                content: prompt,
                ..Turn::default()
            }),
        }
    }
    let skip = usize::from(!tools.is_empty() && turns.first().is_some_and(|t| t.role == "system"));
    for turn in &turns[skip..] {
        let mut content = turn.content.clone();
        if let Some(serde_json::Value::Array(calls)) = &turn.tool_calls {
            for call in calls {
                let f = &call["function"];
                let call = serde_json::json!({"name": f["name"], "arguments": f["arguments"]});
                content.push_str(&format!("<tool_call>\n{call}\n</tool_call>"));
            }
        }
        let role = if turn.role == "tool" {
            content = format!("<tool_response>\n{content}\n</tool_response>");
            "user"
        } else {
            &turn.role
        };
        // Consecutive tool results (parallel calls) share one user turn.
        match out.last_mut() {
            Some(last)
                if role == "user"
                    && turn.role == "tool"
                    && last.role == "user"
                    && last.content.ends_with("</tool_response>") =>
            {
                last.content.push('\n');
                last.content.push_str(&content);
            }
            _ => out.push(Turn {
                role: role.into(),
                content,
                ..Turn::default()
            }),
        }
    }
    out
}

/// `raise_exception("...")` reads best as its own message; other errors with their context.
fn render_error_message(e: &minijinja::Error) -> String {
    match (e.kind(), e.detail()) {
        (ErrorKind::InvalidOperation, Some(detail)) => detail.to_owned(),
        _ => format!("{e:#}"),
    }
}

/// llama.cpp's `LLM_CHAT_TEMPLATE_GEMMA`: system text goes at the start of the first user
/// turn, "assistant" is called "model", contents are trimmed.
fn gemma(turns: &[Turn]) -> String {
    let mut out = String::new();
    let mut system = String::new();
    for turn in turns {
        let content = turn.content.trim();
        if turn.role == "system" {
            system.push_str(content);
            system.push_str("\n\n");
            continue;
        }
        let role = if turn.role == "assistant" {
            "model"
        } else {
            &turn.role
        };
        out.push_str("<start_of_turn>");
        out.push_str(role);
        out.push('\n');
        if role == "user" {
            out.push_str(&system);
            system.clear();
        }
        out.push_str(content);
        out.push_str("<end_of_turn>\n");
    }
    out.push_str("<start_of_turn>model\n");
    out
}

/// A small strftime for `strftime_now`: the conversions chat templates use.
fn strftime_now_utc(format: &str) -> String {
    const MONTHS: [&str; 12] = [
        "January",
        "February",
        "March",
        "April",
        "May",
        "June",
        "July",
        "August",
        "September",
        "October",
        "November",
        "December",
    ];
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let (y, m, d) = civil_from_days((secs / 86_400) as i64);
    let mut out = String::new();
    let mut chars = format.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('d') => out.push_str(&format!("{d:02}")),
            Some('m') => out.push_str(&format!("{m:02}")),
            Some('Y') => out.push_str(&y.to_string()),
            Some('b') => out.push_str(&MONTHS[m as usize - 1][..3]),
            Some('B') => out.push_str(MONTHS[m as usize - 1]),
            Some(other) => {
                out.push('%');
                out.push(other);
            }
            None => out.push('%'),
        }
    }
    out
}

/// Days since 1970-01-01 to (year, month, day), Howard Hinnant's `civil_from_days`.
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn turns(list: &[(&str, &str)]) -> Vec<Turn> {
        list.iter()
            .map(|(role, content)| Turn {
                role: role.to_string(),
                content: content.to_string(),
                ..Turn::default()
            })
            .collect()
    }

    #[test]
    fn gemma_builtin_matches_llama_cpp() {
        let text = ChatTemplate::Gemma
            .render(&turns(&[
                ("system", " Be brief. "),
                ("user", "Hi\n"),
                ("assistant", "Hello."),
                ("user", "Bye"),
            ]))
            .unwrap();
        assert_eq!(
            text,
            "<start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n\
             <start_of_turn>model\nHello.<end_of_turn>\n\
             <start_of_turn>user\nBye<end_of_turn>\n\
             <start_of_turn>model\n"
        );
    }

    /// The shape of Gemma 3's own template: BOS first, roles alternate, `raise_exception`.
    const GEMMA_LIKE: &str = "{{ bos_token }}{% for m in messages %}\
        {% if (m['role'] == 'user') != (loop.index0 % 2 == 0) %}\
        {{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}\
        {{ '<start_of_turn>' + ('model' if m['role'] == 'assistant' else m['role']) + '\n' + m['content'] | trim + '<end_of_turn>\n' }}\
        {% endfor %}{% if add_generation_prompt %}{{ '<start_of_turn>model\n' }}{% endif %}";

    #[test]
    fn jinja_leading_bos_is_stripped() {
        let t = ChatTemplate::new(Some(GEMMA_LIKE), "<bos>", "<eos>", true).unwrap();
        let text = t.render(&turns(&[("user", "Hi")])).unwrap();
        assert_eq!(
            text,
            "<start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\n"
        );
        assert_eq!(
            text,
            ChatTemplate::Gemma
                .render(&turns(&[("user", "Hi")]))
                .unwrap()
        );
    }

    /// SmolLM2's BOS is `<|im_start|>` and its tokenizer adds none: the template's own opening
    /// `<|im_start|>` is the first turn's, and stays (llama.cpp strips only a BOS it would add).
    #[test]
    fn a_leading_bos_stays_when_the_tokenizer_adds_none() {
        let chatml = "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\n' + m['content'] \
            + '<|im_end|>\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";
        let rendered = |adds_bos| {
            ChatTemplate::new(Some(chatml), "<|im_start|>", "<|im_end|>", adds_bos)
                .unwrap()
                .render(&turns(&[("user", "Hi")]))
                .unwrap()
        };
        assert_eq!(
            rendered(false),
            "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
        );
        assert_eq!(
            rendered(true),
            "user\nHi<|im_end|>\n<|im_start|>assistant\n"
        );
    }

    #[test]
    fn raise_exception_becomes_the_message() {
        let t = ChatTemplate::new(Some(GEMMA_LIKE), "<bos>", "<eos>", true).unwrap();
        let err = t.render(&turns(&[("assistant", "x")])).unwrap_err();
        assert_eq!(
            err.to_string(),
            "the model's chat template rejected the messages: Conversation roles must alternate user/assistant/user/assistant/..."
        );
    }

    #[test]
    fn python_methods_work() {
        let src = "{% for m in messages %}{{ m.content.strip() }}|{% endfor %}";
        let t = ChatTemplate::new(Some(src), "", "", true).unwrap();
        assert_eq!(t.render(&turns(&[("user", "  a  ")])).unwrap(), "a|");
    }

    #[test]
    fn syntax_errors_are_reported() {
        let err = ChatTemplate::new(Some("{% for %}"), "", "", true)
            .err()
            .unwrap();
        assert!(err.to_string().contains("not valid Jinja"), "{err}");
    }

    fn weather_tool() -> Vec<serde_json::Value> {
        vec![
            serde_json::json!({"type": "function", "function": {"name": "weather",
            "description": "Weather of a city", "parameters": {"type": "object",
            "properties": {"city": {"type": "string"}}, "required": ["city"]}}}),
        ]
    }

    /// A Qwen-style template reads `tools` and `tool_calls` itself.
    #[test]
    fn templates_with_tools_get_them() {
        let src = "{% if tools %}<tools>{% for t in tools %}{{ t.function.name }}{% endfor %}</tools>{% endif %}\
            {% for m in messages %}[{{ m.role }}:{{ m.content }}{% if m.tool_calls %}{% for c in m.tool_calls %}<tool_call>{{ c.function.name }}{{ c.function.arguments | tojson }}</tool_call>{% endfor %}{% endif %}]{% endfor %}";
        let t = ChatTemplate::new(Some(src), "", "", true).unwrap();
        let mut conv = turns(&[("user", "Paris?"), ("assistant", ""), ("tool", "sunny")]);
        conv[1].tool_calls = Some(
            serde_json::json!([{"type": "function", "function": {"name": "weather", "arguments": {"city": "Paris"}}}]),
        );
        let text = t.render_with_tools(&conv, &weather_tool()).unwrap();
        assert_eq!(
            text,
            "<tools>weather</tools>[user:Paris?][assistant:<tool_call>weather{\"city\":\"Paris\"}</tool_call>][tool:sunny]"
        );
        assert_eq!(ToolSyntax::for_template(Some(src)), ToolSyntax::Hermes);
        assert_eq!(
            ToolSyntax::for_template(Some("{{ '<|python_tag|>' }}{{ tools }}")),
            ToolSyntax::Llama3
        );
    }

    /// Gemma 3 has no tool tokens: the documented prompt goes into the first user turn, calls
    /// and results are written as text.
    #[test]
    fn gemma_gets_the_tool_prompt() {
        let mut conv = turns(&[
            ("system", "Be brief."),
            ("user", "Paris?"),
            ("assistant", ""),
            ("tool", "sunny"),
        ]);
        conv[2].tool_calls = Some(
            serde_json::json!([{"type": "function", "function": {"name": "weather", "arguments": {"city": "Paris"}}}]),
        );
        let text = ChatTemplate::Gemma
            .render_with_tools(&conv, &weather_tool())
            .unwrap();
        assert!(
            text.starts_with("<start_of_turn>user\nYou can call functions."),
            "{text}"
        );
        assert!(text.contains("\"name\":\"weather\""), "{text}");
        assert!(text.contains("Be brief.\n\nParis?<end_of_turn>"), "{text}");
        assert!(text.contains("<start_of_turn>model\n<tool_call>\n{\"name\":\"weather\",\"arguments\":{\"city\":\"Paris\"}}\n</tool_call><end_of_turn>"), "{text}");
        assert!(
            text.contains(
                "<start_of_turn>user\n<tool_response>\nsunny\n</tool_response><end_of_turn>"
            ),
            "{text}"
        );
        assert!(text.ends_with("<start_of_turn>model\n"), "{text}");
    }

    #[test]
    fn calendar() {
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(civil_from_days(19_782), (2024, 2, 29));
        assert_eq!(civil_from_days(-1), (1969, 12, 31));
    }
}
