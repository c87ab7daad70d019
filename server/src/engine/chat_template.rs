//! Chat messages to prompt text: the model's own Jinja template (`tokenizer.chat_template`)
//! rendered with minijinja, or llama.cpp's built-in Gemma turn format when the file has none
//! (the default model has none).
//!
//! The rendered text never starts with BOS: templates write `{{ bos_token }}` themselves and the
//! tokenizer adds BOS too, which would give two (a known Gemma 270M pitfall). As llama.cpp does,
//! a leading BOS is stripped from the rendering so that tokenization adds exactly one.

use minijinja::{Environment, ErrorKind, Value};
use serde::Serialize;

use crate::model::Model;

/// One chat turn after validation.
#[derive(Debug, Clone, Serialize)]
pub struct Turn {
    pub role: String,
    pub content: String,
}

pub enum ChatTemplate {
    Jinja {
        /// Boxed: an environment is large, and the built-in variant is a unit.
        env: Box<Environment<'static>>,
        bos: String,
        eos: String,
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
        )
    }

    /// The template for a model: its Jinja source if it has one, else the Gemma format.
    /// `bos`/`eos` are the texts of those tokens, offered to templates as `bos_token`/`eos_token`.
    pub fn new(source: Option<&str>, bos: &str, eos: &str) -> Result<ChatTemplate, TemplateError> {
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
        })
    }

    /// The prompt text for `turns`, ending with the opening of the assistant's turn.
    pub fn render(&self, turns: &[Turn]) -> Result<String, TemplateError> {
        match self {
            ChatTemplate::Gemma => Ok(gemma(turns)),
            ChatTemplate::Jinja { env, bos, eos } => {
                let template = env
                    .get_template(TEMPLATE_NAME)
                    .map_err(|e| TemplateError::Render(e.to_string()))?;
                let text = template
                    .render(minijinja::context! {
                        messages => turns,
                        add_generation_prompt => true,
                        bos_token => bos,
                        eos_token => eos,
                    })
                    .map_err(|e| TemplateError::Render(render_error_message(&e)))?;
                Ok(match text.strip_prefix(bos.as_str()) {
                    Some(rest) if !bos.is_empty() => rest.to_owned(),
                    _ => text,
                })
            }
        }
    }
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
        let t = ChatTemplate::new(Some(GEMMA_LIKE), "<bos>", "<eos>").unwrap();
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

    #[test]
    fn raise_exception_becomes_the_message() {
        let t = ChatTemplate::new(Some(GEMMA_LIKE), "<bos>", "<eos>").unwrap();
        let err = t.render(&turns(&[("assistant", "x")])).unwrap_err();
        assert_eq!(
            err.to_string(),
            "the model's chat template rejected the messages: Conversation roles must alternate user/assistant/user/assistant/..."
        );
    }

    #[test]
    fn python_methods_work() {
        let src = "{% for m in messages %}{{ m.content.strip() }}|{% endfor %}";
        let t = ChatTemplate::new(Some(src), "", "").unwrap();
        assert_eq!(t.render(&turns(&[("user", "  a  ")])).unwrap(), "a|");
    }

    #[test]
    fn syntax_errors_are_reported() {
        let err = ChatTemplate::new(Some("{% for %}"), "", "").err().unwrap();
        assert!(err.to_string().contains("not valid Jinja"), "{err}");
    }

    #[test]
    fn calendar() {
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(civil_from_days(19_782), (2024, 2, 29));
        assert_eq!(civil_from_days(-1), (1969, 12, 31));
    }
}
