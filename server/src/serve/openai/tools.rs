//! Tool calling: the grammar that forces a valid call (`tool_choice` "required" or a named
//! function), and the model's call syntax read back into OpenAI's `tool_calls`.

use serde_json::{json, Value};

use crate::engine::chat_template::ToolSyntax;
use crate::grammar::{json_lark, GrammarError};

/// What `tools` and `tool_choice` ask for, checked.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolRequest {
    /// OpenAI's `tools` list, as given (templates read it as is).
    pub tools: Vec<Value>,
    pub choice: ToolChoice,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToolChoice {
    /// The model decides; calls it writes are parsed back.
    Auto,
    /// Decoding is constrained to a call of one of the tools.
    Required,
    /// Decoding is constrained to a call of this tool.
    Named(String),
}

/// One parsed call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Call {
    pub name: String,
    /// The arguments as JSON text, as OpenAI sends them.
    pub arguments: String,
}

const OPEN: &str = "<tool_call>";
const CLOSE: &str = "</tool_call>";

/// The function's name and parameter schema of a checked `tools` entry.
fn function(tool: &Value) -> (&str, Value) {
    let f = &tool["function"];
    let params = match f.get("parameters") {
        Some(p @ Value::Object(_)) => p.clone(),
        _ => json!({"type": "object"}),
    };
    (f["name"].as_str().unwrap_or_default(), params)
}

/// The Lark grammar of exactly one call, in `syntax`, of one of `tools` (or of `named`).
pub fn call_grammar(syntax: ToolSyntax, request: &ToolRequest) -> Result<String, GrammarError> {
    let args_key = match syntax {
        ToolSyntax::Hermes => "arguments",
        ToolSyntax::Llama3 => "parameters",
    };
    let choices: Vec<Value> = request
        .tools
        .iter()
        .map(function)
        .filter(|(name, _)| match &request.choice {
            ToolChoice::Named(n) => n == name,
            _ => true,
        })
        .map(|(name, params)| {
            json!({"type": "object", "properties": {"name": {"const": name}, args_key: params},
                "required": ["name", args_key], "additionalProperties": false})
        })
        .collect();
    let schema = match choices.len() {
        1 => choices.into_iter().next().unwrap_or_default(),
        _ => json!({"anyOf": choices}),
    };
    let call = json_lark(&schema)?;
    Ok(match syntax {
        ToolSyntax::Hermes => format!("start: \"{OPEN}\\n\" {call} \"\\n{CLOSE}\""),
        ToolSyntax::Llama3 => format!("start: {call}"),
    })
}

/// Reads the calls out of a finished answer: the text before them (if any) and the calls.
/// Text that is not wholly valid call syntax is content, never half a call.
pub fn parse(syntax: ToolSyntax, text: &str) -> (Option<String>, Vec<Call>) {
    let as_content = || (Some(text.to_owned()), Vec::new());
    let call_of = |v: &Value, args_key: &str| -> Option<Call> {
        let name = v.get("name")?.as_str()?.to_owned();
        let args = v.get(args_key).or_else(|| v.get("arguments"))?;
        args.is_object().then(|| Call {
            name,
            arguments: args.to_string(),
        })
    };
    match syntax {
        ToolSyntax::Hermes => {
            let Some(first) = text.find(OPEN) else {
                return as_content();
            };
            let mut calls = Vec::new();
            for block in text[first..].split(OPEN).skip(1) {
                let body = block.split(CLOSE).next().unwrap_or(block).trim();
                let Some(call) = serde_json::from_str::<Value>(body)
                    .ok()
                    .and_then(|v| call_of(&v, "arguments"))
                else {
                    return as_content();
                };
                calls.push(call);
            }
            let before = text[..first].trim();
            ((!before.is_empty()).then(|| before.to_owned()), calls)
        }
        ToolSyntax::Llama3 => {
            let body = text.trim_start();
            let body = body.strip_prefix("<|python_tag|>").unwrap_or(body).trim();
            match serde_json::from_str::<Value>(body)
                .ok()
                .and_then(|v| call_of(&v, "parameters"))
            {
                Some(call) => (None, vec![call]),
                None => as_content(),
            }
        }
    }
}

/// Whether streamed text that starts with `held` may still turn out to be a call (and so must
/// be held back rather than sent as content).
pub fn may_be_call(syntax: ToolSyntax, held: &str) -> bool {
    let t = held.trim_start();
    match syntax {
        ToolSyntax::Hermes => OPEN.starts_with(t) || t.starts_with(OPEN),
        ToolSyntax::Llama3 => {
            t.is_empty()
                || t.starts_with('{')
                || "<|python_tag|>".starts_with(t)
                || t.starts_with("<|python_tag|>")
        }
    }
}

/// OpenAI's `tool_calls` entries for `calls`; `id` makes the call ids unique.
pub fn tool_calls_json(calls: &[Call], id: &str) -> Vec<Value> {
    calls
        .iter()
        .enumerate()
        .map(|(i, c)| {
            json!({"index": i, "id": format!("call_{id}_{i}"), "type": "function",
                "function": {"name": c.name, "arguments": c.arguments}})
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hermes_calls_are_parsed_and_broken_ones_are_content() {
        let text = "Let me look.\n<tool_call>\n{\"name\": \"weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>";
        let (content, calls) = parse(ToolSyntax::Hermes, text);
        assert_eq!(content.as_deref(), Some("Let me look."));
        assert_eq!(
            calls,
            vec![Call {
                name: "weather".into(),
                arguments: r#"{"city":"Paris"}"#.into()
            }]
        );
        let broken = "<tool_call>\n{\"name\": \"weather\", \"argu";
        assert_eq!(
            parse(ToolSyntax::Hermes, broken),
            (Some(broken.into()), vec![])
        );
        assert_eq!(parse(ToolSyntax::Hermes, "Hi"), (Some("Hi".into()), vec![]));
    }

    #[test]
    fn llama3_calls_are_parsed() {
        let (content, calls) = parse(
            ToolSyntax::Llama3,
            "<|python_tag|>{\"name\": \"f\", \"parameters\": {\"x\": 1}}",
        );
        assert_eq!(content, None);
        assert_eq!(calls[0].arguments, r#"{"x":1}"#);
    }

    #[test]
    fn held_text_may_be_a_call() {
        assert!(may_be_call(ToolSyntax::Hermes, "  <tool"));
        assert!(may_be_call(ToolSyntax::Hermes, "<tool_call>\n{"));
        assert!(!may_be_call(ToolSyntax::Hermes, "Hello"));
        assert!(may_be_call(ToolSyntax::Llama3, "{\"na"));
        assert!(!may_be_call(ToolSyntax::Llama3, "Sure"));
    }

    #[test]
    fn the_call_grammar_names_the_tools() {
        let request = ToolRequest {
            tools: vec![
                json!({"type": "function", "function": {"name": "a", "parameters": {"type": "object", "properties": {"x": {"type": "integer"}}}}}),
                json!({"type": "function", "function": {"name": "b"}}),
            ],
            choice: ToolChoice::Named("b".into()),
        };
        let g = call_grammar(ToolSyntax::Hermes, &request).unwrap();
        assert!(g.starts_with("start: \"<tool_call>\\n\" %json"), "{g}");
        assert!(
            g.contains(r#"{"const":"b"}"#) && !g.contains(r#"{"const":"a"}"#),
            "{g}"
        );
    }
}
