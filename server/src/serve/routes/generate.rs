//! `POST /v1/chat/completions` and `POST /v1/completions`: check, tokenize, submit to the
//! engine, then answer ([`answer`](super::answer)).

use std::time::Instant;

use axum::extract::State;
use axum::response::Response;

use super::answer::{self, Kind, OpenAi, Wire};
use super::blocking;
use crate::engine::chat_template::{ToolSyntax, Turn};
use crate::engine::{Engine, Generation, PromptError, Refused};
use crate::grammar::{Constraint, Spec};
use crate::serve::error::ApiError;
use crate::serve::extract::JsonBody;
use crate::serve::openai::tools::{self, ToolChoice};
use crate::serve::openai::{ChatRequest, Checked, CompletionRequest, Delivery, PromptInput};
use crate::serve::AppState;

/// How long a client should wait before retrying when the queue is full.
const RETRY_AFTER_SECS: u64 = 1;

pub async fn chat(
    State(state): State<AppState>,
    JsonBody(req): JsonBody<ChatRequest>,
) -> Result<Response, ApiError> {
    // While the model loads, 503 comes before any complaint about the request's values.
    state.engine()?;
    let prepared = prepare_chat(&state, req.check(&state.http().input.args)?, "messages").await?;
    let ready = state.ready()?;
    let wire = OpenAi::new(
        &ready.model_id,
        ready.engine.shared_model(),
        Kind::Chat,
        &prepared.delivery,
    );
    generate(&state, prepared, wire, "messages").await
}

/// A chat, ready to submit.
pub(super) struct Prepared {
    pub prompt: Vec<u32>,
    pub generation: Generation,
    pub delivery: Delivery,
}

/// What every chat-shaped API (chat completions, Responses, Anthropic's messages) does once
/// its request is read as turns and parameters: the tools offered in the model's own call
/// syntax (a required call becomes a grammar), the output's form compiled for the vocabulary,
/// the turns through the model's template. `input` names the request's turns in errors.
pub(super) async fn prepare_chat(
    state: &AppState,
    checked: Checked<Vec<Turn>>,
    input: &'static str,
) -> Result<Prepared, ApiError> {
    let Checked {
        input: turns,
        mut generation,
        mut delivery,
        mut constraint,
        tools,
    } = checked;
    if let Some(tools) = &tools {
        let syntax = ToolSyntax::for_template(state.engine()?.model().chat_template());
        delivery.tools = Some(syntax);
        if tools.choice != ToolChoice::Auto {
            let lark = tools::call_grammar(syntax, tools)
                .map_err(|e| ApiError::bad_param("tools", e.to_string()))?;
            constraint = Some(("tools", Spec::Lark(lark)));
        }
    }
    let special = state.http().input.args.parse_special_in_content;
    let compiled = compile(state, constraint).await?;
    let prompt = blocking(state, "tokenizer", move |engine| {
        let tools = tools.as_ref().map_or(&[][..], |t| &t.tools[..]);
        engine
            .chat_prompt(&turns, tools, special)
            .map_err(|e| prompt_error(e, engine.n_ctx(), input))
    })
    .await?;
    generation.constraint = compiled;
    Ok(Prepared {
        prompt,
        generation,
        delivery,
    })
}

pub async fn completions(
    State(state): State<AppState>,
    JsonBody(req): JsonBody<CompletionRequest>,
) -> Result<Response, ApiError> {
    state.engine()?;
    let Checked {
        input,
        mut generation,
        delivery,
        constraint,
        tools: _,
    } = req.check(&state.http().input.args)?;
    let n_vocab = state.engine()?.model().tokenizer().n_vocab();
    let compiled = compile(&state, constraint).await?;
    let prompt = blocking(&state, "tokenizer", move |engine| {
        Ok(match input {
            PromptInput::Tokens(ids) => {
                check_token_ids(&ids, n_vocab, "prompt")?;
                ids
            }
            PromptInput::Text(text) => engine
                .text_prompt(&text)
                .map_err(|e| prompt_error(e, engine.n_ctx(), "prompt"))?,
        })
    })
    .await?;
    generation.constraint = compiled;
    let ready = state.ready()?;
    let wire = OpenAi::new(
        &ready.model_id,
        ready.engine.shared_model(),
        Kind::Completion,
        &delivery,
    );
    let prepared = Prepared {
        prompt,
        generation,
        delivery,
    };
    generate(&state, prepared, wire, "prompt").await
}

/// Compiles the output's required form for the model's vocabulary, on a blocking thread, at
/// most --grammar-compiles at once (503 when no compile slot frees up in --grammar-timeout)
/// and each within --grammar-timeout. A schema or grammar that cannot be enforced, or takes
/// longer to compile, is the client's 400, named by the parameter that gave it.
async fn compile(
    state: &AppState,
    constraint: Option<(&'static str, Spec)>,
) -> Result<Option<Constraint>, ApiError> {
    let Some((param, spec)) = constraint else {
        return Ok(None);
    };
    let limits = &state.http().input;
    let slot = limits.compile_slot().await?;
    let timeout = limits.grammar_timeout();
    let work = blocking(state, "grammar compile", move |engine: &Engine| {
        // The slot is held until the compile ends, even one whose client has had its answer:
        // a compile cannot be interrupted, and the limit is on compiles running, not waiting.
        let _slot = slot;
        Constraint::new(engine.model().tokenizer(), &spec)
            .map(Some)
            .map_err(|e| ApiError::bad_param(param, e.to_string()))
    });
    match tokio::time::timeout(timeout, work).await {
        Ok(compiled) => compiled,
        Err(_) => Err(ApiError::bad_param(
            param,
            format!(
                "the {param} is too complex: compiling it took longer than {} s (--grammar-timeout); simplify it",
                timeout.as_secs()
            ),
        )),
    }
}

/// Refuses ids the model does not have, naming the first.
pub fn check_token_ids(ids: &[u32], n_vocab: usize, param: &'static str) -> Result<(), ApiError> {
    match ids.iter().find(|&&id| id as usize >= n_vocab) {
        Some(id) => Err(ApiError::bad_param(
            param,
            format!("token id {id} is outside the vocabulary of {n_vocab} tokens"),
        )),
        None => Ok(()),
    }
}

/// Submits the job, then answers as the request asked, in `wire`'s format. `input` names the
/// request's prompt in errors.
pub(super) async fn generate<W: Wire>(
    state: &AppState,
    prepared: Prepared,
    wire: W,
    input: &'static str,
) -> Result<Response, ApiError> {
    let Prepared {
        prompt,
        mut generation,
        delivery,
    } = prepared;
    let ready = state.ready()?;
    generation.max_tokens = generation.max_tokens.or(state.http().default_max_tokens);
    generation.special = state.http().special;
    let timeout = state.http().request_timeout;
    let events = ready
        .engine
        .submit(prompt, generation, Instant::now() + timeout)
        .map_err(|refused| refused_error(refused, input))?;
    answer::answer(wire, delivery, events, timeout.as_secs()).await
}

fn prompt_error(e: PromptError, n_ctx: usize, input: &'static str) -> ApiError {
    match e {
        PromptError::Template(e) => ApiError::bad_param(input, e.to_string()),
        PromptError::TooLong(t) => too_long(t.at_least, true, n_ctx, input),
    }
}

/// A prompt of `tokens` (`at_least`: a bound, counted while it was tokenized) that leaves no
/// room in the context: no silent truncation, at least one token must be generated after it.
fn too_long(tokens: usize, at_least: bool, n_ctx: usize, input: &'static str) -> ApiError {
    let at_least = if at_least { "at least " } else { "" };
    ApiError::bad_param(
        input,
        format!(
            "the prompt is {at_least}{tokens} tokens but the context holds {n_ctx} (the prompt must leave room for at least one generated token); shorten the prompt or start the server with a larger --ctx-size"
        ),
    )
}

fn refused_error(refused: Refused, input: &'static str) -> ApiError {
    match refused {
        Refused::EmptyPrompt => ApiError::bad_param(input, "the prompt is empty"),
        Refused::PromptTooLong { tokens, n_ctx } => too_long(tokens, false, n_ctx, input),
        Refused::QueueFull { queue } => ApiError::Overloaded {
            queue,
            retry_after: RETRY_AFTER_SECS,
        },
        Refused::ShuttingDown => ApiError::ShuttingDown,
    }
}
