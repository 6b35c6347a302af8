//! Anthropic's Messages API, as llama-server serves it to clients such as Claude Code:
//! `POST /v1/messages` and `POST /v1/messages/count_tokens`. A request is translated into a
//! chat-completions request and run by the same machinery (http.rs `prepare`: the chat template,
//! tools and their grammar, the reasoning split, sampling, stop strings, the streaming of
//! partial tool calls); the chat stream's chunks (http.rs `chunks`) are translated into
//! Anthropic's named server-sent events (`message_start`, `content_block_start`,
//! `content_block_delta`, `content_block_stop`, `message_delta`, `message_stop`), and a message
//! that does not stream is what those events add up to: content blocks (`thinking`, `text`,
//! `tool_use`) in the order the model wrote them, `stop_reason`, `stop_sequence` and `usage`.
//! Errors take Anthropic's shape, `{"type": "error", "error": {"type", "message"}}`.

use crate::api::{show, type_name, Fields, MAX_STOPS};
use crate::error::ApiError;
use crate::http::{self, Chunk, Prepare};
use crate::scheduler::{Event, Finish, FinishReason};
use crate::Shared;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::sse::{Event as SseEvent, Sse};
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures_util::stream::{self, StreamExt};
use serde_json::{json, Map, Value};
use std::convert::Infallible;
use std::sync::Arc;
use tokio::sync::mpsc::unbounded_channel;

/// Whether `path` is one of this API's routes (their refusals take Anthropic's shape).
pub(crate) fn is_anthropic_path(path: &str) -> bool {
    path == "/v1/messages" || path.starts_with("/v1/messages/")
}

/// Anthropic's error type for a refusal's HTTP status.
fn error_type(status: StatusCode) -> &'static str {
    match status.as_u16() {
        401 => "authentication_error",
        403 => "permission_error",
        404 => "not_found_error",
        413 => "request_too_large",
        429 => "rate_limit_error",
        503 | 529 => "overloaded_error",
        s if s >= 500 => "api_error",
        _ => "invalid_request_error",
    }
}

/// A refusal in Anthropic's shape: `{"type": "error", "error": {"type", "message"}}`.
fn error_body(e: &ApiError) -> Value {
    json!({"type": "error", "error": {"type": error_type(e.status), "message": e.message}})
}

/// A refusal as this API answers it: Anthropic's shape, with the refusal's HTTP status.
pub(crate) fn error_response(e: ApiError) -> Response {
    (e.status, Json(error_body(&e))).into_response()
}

/// Another method than POST on one of this API's routes.
pub(crate) async fn method_not_allowed(req: Request) -> Response {
    error_response(ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        "invalid_request_error",
        format!(
            "{} is not allowed on {} (POST it)",
            req.method(),
            req.uri().path()
        ),
    ))
}

/// `POST /v1/messages`: a message generated for the conversation, whole or streamed.
pub(crate) async fn messages(
    State(sh): State<Arc<Shared>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    generate(sh, headers, body)
        .await
        .unwrap_or_else(error_response)
}

/// `POST /v1/messages/count_tokens`: `{"input_tokens": N}`, the tokens of the prompt the same
/// request would run on (`max_tokens` may be left out), without generating.
pub(crate) async fn count_tokens(
    State(sh): State<Arc<Shared>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let count = async {
        let (m, obj) = sh.request(&headers, body).await?;
        let chat = to_chat(&obj, false)?;
        Ok::<_, ApiError>(
            json!({"input_tokens": http::chat_tokens(&m, &http::render_chat(&m, &chat)?).len()}),
        )
    };
    match count.await {
        Ok(v) => Json(v).into_response(),
        Err(e) => error_response(e),
    }
}

async fn generate(sh: Arc<Shared>, headers: HeaderMap, body: Body) -> Result<Response, ApiError> {
    let (m, obj) = sh.request(&headers, body).await?;
    let chat = to_chat(&obj, true)?;
    let how = Prepare {
        chat: true,
        id_prefix: "msg_",
        cap_max_tokens: true,
    };
    let p = http::prepare(&sh, m.clone(), &chat, how)
        .await
        .map_err(too_long)?;
    let asked = chat["max_tokens"].as_u64().unwrap_or(0) as usize;
    let (prompt_tokens, max_tokens) = (p.choices[0].0.len(), p.choices[0].2);
    let info = Info {
        id: p.reply.id.clone(),
        model: m.id.clone(),
        capped: max_tokens < asked,
    };
    let start = info.start(prompt_tokens);
    let mut st = Streamer::new(info);
    let mut rxs = sh.run_choices(p.choices)?;
    if p.stream {
        let events = http::chunks(p.reply, rxs).flat_map(move |c| stream::iter(st.on(c)));
        let all = stream::iter([start])
            .chain(events)
            .map(|e| Ok::<_, Infallible>(sse_event(e)));
        return Ok(Sse::new(all).into_response());
    }
    // The engine's events, once the answer is whole, read as a stream reads them: the message
    // is what the stream's events add up to, its blocks in the order the model wrote them.
    let mut rx = rxs.remove(0);
    let (tx, replay) = unbounded_channel();
    loop {
        match rx.recv().await {
            Some(Event::Error(e)) => return Err(e),
            Some(ev @ Event::Done(_)) => {
                let _ = tx.send(ev);
                break;
            }
            Some(ev) => {
                let _ = tx.send(ev);
            }
            None => {
                return Err(ApiError::internal(
                    "the engine stopped before the answer was complete",
                ))
            }
        }
    }
    drop(tx);
    let events: Vec<Named> = http::chunks(p.reply, vec![replay])
        .flat_map(|c| stream::iter(st.on(c)))
        .collect()
        .await;
    Ok(Json(assemble(std::iter::once(&start).chain(&events))).into_response())
}

/// A prompt that leaves no room in the context, said as Anthropic says it ("prompt is too long:
/// N tokens > M maximum"), which clients such as Claude Code read to compact the conversation;
/// other errors as they are.
fn too_long(e: ApiError) -> ApiError {
    let count = |k: &str| e.extra.get(k).and_then(Value::as_u64);
    match (e.code, count("n_prompt_tokens"), count("n_ctx")) {
        (Some("context_length_exceeded"), Some(n), Some(ctx)) => {
            let message = format!(
                "prompt is too long: {n} tokens > {} maximum ({})",
                ctx.saturating_sub(1),
                e.message
            );
            ApiError { message, ..e }
        }
        _ => e,
    }
}

// ---------------------------------------------------------------------------------------------
// The request

fn param(field: &str, message: impl Into<String>) -> ApiError {
    ApiError::param(field, message)
}

/// A tool call's id as Anthropic clients see it: OpenAI's `call_` ids become `toolu_` ids
/// (others, such as Mistral's nine characters, stay as they are); `from_tool_use_id` undoes it
/// for the ids a conversation brings back, so the prompt is the one the chat endpoint renders.
fn tool_use_id(id: &str) -> String {
    id.strip_prefix("call_")
        .map_or_else(|| id.to_string(), |rest| format!("toolu_{rest}"))
}

fn from_tool_use_id(id: &str) -> String {
    id.strip_prefix("toolu_")
        .map_or_else(|| id.to_string(), |rest| format!("call_{rest}"))
}

/// The string field `key` of a content block, required.
fn block_string<'a>(
    block: &'a Map<String, Value>,
    at: &str,
    key: &str,
) -> Result<&'a str, ApiError> {
    match block.get(key) {
        Some(Value::String(s)) => Ok(s),
        Some(v) => Err(param(
            "messages",
            format!("{at}.{key} must be a string, got {}", type_name(v)),
        )),
        None => Err(param("messages", format!("{at}.{key} is required"))),
    }
}

/// A content block: where it is (for errors: "messages[2].content[0]"), its type, its fields.
type Located<'a> = (String, &'a str, &'a Map<String, Value>);

/// The blocks of an array of content blocks, each an object with a string `type`.
fn blocks<'a>(a: &'a [Value], at: &str) -> Result<Vec<Located<'a>>, ApiError> {
    a.iter()
        .enumerate()
        .map(|(j, b)| {
            let at = format!("{at}[{j}]");
            let Some(o) = b.as_object() else {
                return Err(param(
                    "messages",
                    format!(
                        "{at} must be a content block (an object), got {}",
                        type_name(b)
                    ),
                ));
            };
            let ty = block_string(o, &at, "type")?;
            Ok((at, ty, o))
        })
        .collect()
}

/// A refusal of an image (or a document): Muser's models read text only.
fn no_media(at: &str, ty: &str) -> ApiError {
    param(
        "messages",
        format!("{at}: {ty} blocks are not supported: this server's model reads text only"),
    )
}

/// Text blocks (`field` names them in errors) as OpenAI's text parts, which the chat machinery
/// joins with a newline; images and documents are refused, and so is any other block.
fn text_parts(a: &[Value], at: &str) -> Result<Vec<Value>, ApiError> {
    let mut parts = Vec::new();
    for (at, ty, b) in blocks(a, at)? {
        match ty {
            "text" => parts.push(json!({"type": "text", "text": block_string(b, &at, "text")?})),
            "image" | "document" => return Err(no_media(&at, ty)),
            other => {
                return Err(param(
                    "messages",
                    format!(
                        "{at}.type {}: only text blocks are supported here",
                        show(&json!(other))
                    ),
                ))
            }
        }
    }
    Ok(parts)
}

/// Claude Code starts its system prompt with a line `x-anthropic-billing-header: ...; cch=XXXXX;`
/// whose `cch` value changes with every request; it means nothing to a local model, and it
/// would keep the slot's cache from reusing the prompt past it. Its value is made constant (as
/// llama-server makes it).
fn steady_billing_header(text: &str) -> String {
    const HEADER: &str = "x-anthropic-billing-header:";
    let Some(rest) = text.strip_prefix(HEADER) else {
        return text.to_string();
    };
    let line_end = rest.find('\n').unwrap_or(rest.len());
    let Some(at) = rest[..line_end].find("cch=") else {
        return text.to_string();
    };
    let value = at + "cch=".len();
    let Some(len) = rest[value..line_end].find(';') else {
        return text.to_string();
    };
    format!(
        "{HEADER}{}{}{}",
        &rest[..value],
        "f".repeat(rest[value..value + len].chars().count()),
        &rest[value + len..]
    )
}

/// The top-level `system`: a string or text blocks, as a system message (None when empty).
fn system_message(v: Option<&Value>) -> Result<Option<Value>, ApiError> {
    let content = match v {
        None => return Ok(None),
        Some(Value::String(s)) if s.is_empty() => return Ok(None),
        Some(Value::String(s)) => json!(steady_billing_header(s)),
        Some(Value::Array(a)) => {
            let mut parts = text_parts(a, "system").map_err(|e| e.with_param("system"))?;
            if let Some(first) = parts.first_mut() {
                first["text"] = json!(steady_billing_header(first["text"].as_str().unwrap_or("")));
            }
            if parts.is_empty() {
                return Ok(None);
            }
            Value::Array(parts)
        }
        Some(v) => {
            return Err(param(
                "system",
                format!(
                    "system must be a string or an array of text blocks, got {}",
                    type_name(v)
                ),
            ))
        }
    };
    Ok(Some(json!({"role": "system", "content": content})))
}

/// A user message's blocks: each `tool_result` becomes a tool message (in order), then the
/// text, if any, a user message after them.
fn user_blocks(a: &[Value], at: &str, out: &mut Vec<Value>) -> Result<(), ApiError> {
    if a.is_empty() {
        return Err(param("messages", format!("{at} must not be empty")));
    }
    let mut texts = Vec::new();
    for (at, ty, b) in blocks(a, at)? {
        match ty {
            "text" => texts.push(json!({"type": "text", "text": block_string(b, &at, "text")?})),
            "tool_result" => {
                let id = block_string(b, &at, "tool_use_id")?;
                match b.get("is_error") {
                    None | Some(Value::Null | Value::Bool(_)) => {}
                    Some(v) => {
                        return Err(param(
                            "messages",
                            format!("{at}.is_error must be a boolean, got {}", type_name(v)),
                        ))
                    }
                }
                let content = match b.get("content") {
                    None | Some(Value::Null) => json!(""),
                    Some(Value::String(s)) => json!(s),
                    Some(Value::Array(parts)) => {
                        Value::Array(text_parts(parts, &format!("{at}.content"))?)
                    }
                    Some(v) => {
                        return Err(param(
                            "messages",
                            format!(
                                "{at}.content must be a string or an array of text blocks, got {}",
                                type_name(v)
                            ),
                        ))
                    }
                };
                let tool_call_id = from_tool_use_id(id);
                out.push(json!({"role": "tool", "tool_call_id": tool_call_id, "content": content}));
            }
            "image" | "document" => return Err(no_media(&at, ty)),
            other => {
                return Err(param(
                    "messages",
                    format!(
                        "{at}.type {} is not a block of a user message (text, tool_result)",
                        show(&json!(other))
                    ),
                ))
            }
        }
    }
    if !texts.is_empty() {
        out.push(json!({"role": "user", "content": texts}));
    }
    Ok(())
}

/// An assistant message's blocks as one assistant message: its text, its `tool_use` blocks as
/// tool calls, its `thinking` as the reasoning the template may show (`redacted_thinking`,
/// encrypted, shows nothing). A message with none of them is left out.
fn assistant_blocks(a: &[Value], at: &str, out: &mut Vec<Value>) -> Result<(), ApiError> {
    let (mut texts, mut calls, mut reasoning) = (Vec::new(), Vec::new(), String::new());
    for (at, ty, b) in blocks(a, at)? {
        match ty {
            "text" => texts.push(json!({"type": "text", "text": block_string(b, &at, "text")?})),
            "thinking" => reasoning.push_str(block_string(b, &at, "thinking")?),
            "redacted_thinking" => {}
            "tool_use" => {
                let id = block_string(b, &at, "id")?;
                let name = block_string(b, &at, "name")?;
                let input = match b.get("input") {
                    Some(v @ Value::Object(_)) => v.to_string(),
                    Some(v) => {
                        return Err(param(
                            "messages",
                            format!("{at}.input must be an object, got {}", type_name(v)),
                        ))
                    }
                    None => return Err(param("messages", format!("{at}.input is required"))),
                };
                calls.push(json!({
                    "id": from_tool_use_id(id),
                    "type": "function",
                    "function": {"name": name, "arguments": input},
                }));
            }
            "image" | "document" => return Err(no_media(&at, ty)),
            other => {
                return Err(param(
                    "messages",
                    format!(
                        "{at}.type {} is not a block of an assistant message (text, thinking, \
                         redacted_thinking, tool_use)",
                        show(&json!(other))
                    ),
                ))
            }
        }
    }
    if texts.is_empty() && calls.is_empty() && reasoning.is_empty() {
        return Ok(());
    }
    let content = match texts.is_empty() {
        true => json!(""),
        false => Value::Array(texts),
    };
    let mut msg = json!({"role": "assistant", "content": content});
    if !calls.is_empty() {
        msg["tool_calls"] = Value::Array(calls);
    }
    if !reasoning.is_empty() {
        msg["reasoning_content"] = json!(reasoning);
    }
    out.push(msg);
    Ok(())
}

/// The system prompt and `messages` as OpenAI's chat messages.
fn chat_messages(f: &Fields) -> Result<Vec<Value>, ApiError> {
    let mut out: Vec<Value> = system_message(f.get("system"))?.into_iter().collect();
    let msgs = match f.get("messages") {
        Some(Value::Array(a)) if !a.is_empty() => a,
        Some(Value::Array(_)) => {
            return Err(param("messages", "messages must hold at least one message"))
        }
        Some(v) => {
            return Err(param(
                "messages",
                format!(
                    "messages must be an array of messages, got {}",
                    type_name(v)
                ),
            ))
        }
        None => return Err(param("messages", "messages is required")),
    };
    for (i, m) in msgs.iter().enumerate() {
        let at = format!("messages[{i}]");
        let Some(o) = m.as_object() else {
            return Err(param(
                "messages",
                format!("{at} must be an object, got {}", type_name(m)),
            ));
        };
        let role = match o.get("role") {
            Some(Value::String(r)) if r == "user" || r == "assistant" => r.as_str(),
            Some(Value::String(r)) if r == "system" => {
                return Err(param(
                    "messages",
                    format!(
                        "{at}.role \"system\" is not a message role here: give the system \
                         prompt in the top-level system field"
                    ),
                ))
            }
            Some(v) => {
                return Err(param(
                    "messages",
                    format!(
                        "{at}.role must be \"user\" or \"assistant\", got {}",
                        show(v)
                    ),
                ))
            }
            None => return Err(param("messages", format!("{at}.role is required"))),
        };
        let at = format!("{at}.content");
        match o.get("content") {
            Some(Value::String(s)) => out.push(json!({"role": role, "content": s})),
            Some(Value::Array(a)) if role == "user" => user_blocks(a, &at, &mut out)?,
            Some(Value::Array(a)) => assistant_blocks(a, &at, &mut out)?,
            Some(v) => {
                return Err(param(
                    "messages",
                    format!(
                        "{at} must be a string or an array of content blocks, got {}",
                        type_name(v)
                    ),
                ))
            }
            None => return Err(param("messages", format!("{at} is required"))),
        }
    }
    Ok(out)
}

/// `tools` (custom tools: `name`, `description`, `input_schema`) as OpenAI's function tools;
/// Anthropic's server tools (a `type` such as "web_search_20250305") are refused.
fn chat_tools(a: &[Value]) -> Result<Vec<Value>, ApiError> {
    a.iter()
        .enumerate()
        .map(|(i, t)| {
            let at = format!("tools[{i}]");
            let Some(o) = t.as_object() else {
                return Err(param(
                    "tools",
                    format!("{at} must be an object, got {}", type_name(t)),
                ));
            };
            match o.get("type") {
                None | Some(Value::Null) => {}
                Some(Value::String(s)) if s == "custom" => {}
                Some(v) => {
                    return Err(param(
                        "tools",
                        format!(
                            "{at}.type {}: only custom tools (name, description, input_schema) \
                             are supported, not the tools Anthropic runs itself",
                            show(v)
                        ),
                    ))
                }
            }
            let name = match o.get("name") {
                Some(Value::String(n)) => n,
                Some(v) => {
                    return Err(param(
                        "tools",
                        format!("{at}.name must be a string, got {}", type_name(v)),
                    ))
                }
                None => return Err(param("tools", format!("{at}.name is required"))),
            };
            let description = match o.get("description") {
                None | Some(Value::Null) => "",
                Some(Value::String(d)) => d,
                Some(v) => {
                    return Err(param(
                        "tools",
                        format!("{at}.description must be a string, got {}", type_name(v)),
                    ))
                }
            };
            let schema = match o.get("input_schema") {
                Some(s @ Value::Object(_)) => s,
                Some(v) => {
                    return Err(param(
                        "tools",
                        format!(
                            "{at}.input_schema must be a JSON schema (an object), got {}",
                            type_name(v)
                        ),
                    ))
                }
                None => return Err(param("tools", format!("{at}.input_schema is required"))),
            };
            Ok(json!({"type": "function", "function": {
                "name": name, "description": description, "parameters": schema,
            }}))
        })
        .collect()
}

/// `tool_choice` (`{"type": "auto" | "any" | "tool" | "none"}`, a tool's `name` with "tool",
/// `disable_parallel_tool_use`) as OpenAI's `tool_choice`, and whether several calls may come
/// in one reply (Anthropic's default: yes).
fn chat_tool_choice(v: Option<&Value>) -> Result<(Value, bool), ApiError> {
    let o = match v {
        None => return Ok((json!("auto"), true)),
        Some(Value::Object(o)) => o,
        Some(v) => {
            return Err(param(
                "tool_choice",
                format!(
                    "tool_choice must be an object such as {{\"type\": \"auto\"}}, got {}",
                    show(v)
                ),
            ))
        }
    };
    let parallel = match o.get("disable_parallel_tool_use") {
        None | Some(Value::Null) => true,
        Some(Value::Bool(b)) => !b,
        Some(v) => {
            return Err(param(
                "tool_choice",
                format!(
                    "tool_choice.disable_parallel_tool_use must be a boolean, got {}",
                    type_name(v)
                ),
            ))
        }
    };
    let choice = match o.get("type").and_then(Value::as_str) {
        Some("auto") => json!("auto"),
        Some("any") => json!("required"),
        Some("none") => json!("none"),
        Some("tool") => match o.get("name") {
            Some(Value::String(n)) => json!({"type": "function", "function": {"name": n}}),
            _ => {
                return Err(param(
                    "tool_choice",
                    "tool_choice.name (a string) is required with type \"tool\"",
                ))
            }
        },
        _ => {
            return Err(param(
                "tool_choice",
                format!(
                    "tool_choice.type must be \"auto\", \"any\", \"tool\" or \"none\", got {}",
                    o.get("type").map_or("nothing".to_string(), show)
                ),
            ))
        }
    };
    Ok((choice, parallel))
}

/// `thinking` (`{"type": "enabled", "budget_tokens": N}`, "adaptive" or "disabled") as the
/// chat machinery's reasoning switch: "disabled" is `reasoning_effort` "none" (the template's
/// `enable_thinking` false); the others leave the template's default, which thinks where the
/// template can. `budget_tokens` is checked but not enforced.
fn chat_thinking(v: Option<&Value>, out: &mut Map<String, Value>) -> Result<(), ApiError> {
    let Some(v) = v else { return Ok(()) };
    let Some(o) = v.as_object() else {
        return Err(param(
            "thinking",
            format!("thinking must be an object, got {}", type_name(v)),
        ));
    };
    match o.get("type").and_then(Value::as_str) {
        Some("enabled") => match o.get("budget_tokens") {
            Some(b) if b.as_u64().is_some_and(|b| b >= 1) => {}
            Some(b) => {
                return Err(param(
                    "thinking",
                    format!(
                        "thinking.budget_tokens must be a positive integer, got {}",
                        show(b)
                    ),
                ))
            }
            None => {
                return Err(param(
                    "thinking",
                    "thinking.budget_tokens is required with type \"enabled\"",
                ))
            }
        },
        Some("adaptive") => {}
        Some("disabled") => {
            out.insert("reasoning_effort".into(), json!("none"));
        }
        _ => {
            return Err(param(
                "thinking",
                format!(
                    "thinking.type must be \"enabled\", \"adaptive\" or \"disabled\", got {}",
                    o.get("type").map_or("nothing".to_string(), show)
                ),
            ))
        }
    }
    Ok(())
}

/// The chat-completions request that an Anthropic request asks for. `generating`: for a
/// message (`max_tokens` required), not for count_tokens. Any `model` name is taken (the
/// server has one model; clients such as Claude Code ask for their own names).
pub(crate) fn to_chat(
    obj: &Map<String, Value>,
    generating: bool,
) -> Result<Map<String, Value>, ApiError> {
    let f = Fields(obj);
    let mut out = Map::new();
    f.string("model")?;
    match f.integer("max_tokens", 1, i32::MAX as i64)? {
        Some(n) => {
            out.insert("max_tokens".into(), json!(n));
        }
        None if generating => return Err(param("max_tokens", "max_tokens is required")),
        None => {}
    }
    out.insert("messages".into(), Value::Array(chat_messages(&f)?));
    match f.get("tools") {
        None => {}
        Some(Value::Array(a)) => {
            out.insert("tools".into(), Value::Array(chat_tools(a)?));
        }
        Some(v) => {
            return Err(param(
                "tools",
                format!("tools must be an array, got {}", type_name(v)),
            ))
        }
    }
    let (choice, parallel) = chat_tool_choice(f.get("tool_choice"))?;
    if f.get("tool_choice").is_some() {
        out.insert("tool_choice".into(), choice);
    }
    if out.contains_key("tools") {
        out.insert("parallel_tool_calls".into(), json!(parallel));
    }
    match f.get("stop_sequences") {
        None => {}
        Some(Value::Array(a)) if a.len() > MAX_STOPS => {
            return Err(param(
                "stop_sequences",
                format!(
                    "stop_sequences has {} strings; at most {MAX_STOPS}",
                    a.len()
                ),
            ))
        }
        Some(Value::Array(a)) if a.iter().all(|s| s.as_str().is_some_and(|s| !s.is_empty())) => {
            out.insert("stop".into(), Value::Array(a.clone()));
        }
        Some(v) => {
            return Err(param(
                "stop_sequences",
                format!(
                    "stop_sequences must be an array of non-empty strings, got {}",
                    show(v)
                ),
            ))
        }
    }
    chat_thinking(f.get("thinking"), &mut out)?;
    match f.get("metadata") {
        None | Some(Value::Object(_)) => {}
        Some(v) => {
            return Err(param(
                "metadata",
                format!("metadata must be an object, got {}", type_name(v)),
            ))
        }
    }
    // Sampling as Anthropic names it, and Muser's own `seed` and `chat_template_kwargs`.
    for key in [
        "temperature",
        "top_p",
        "top_k",
        "stream",
        "seed",
        "chat_template_kwargs",
    ] {
        if let Some(v) = f.get(key) {
            out.insert(key.into(), v.clone());
        }
    }
    Ok(out)
}

// ---------------------------------------------------------------------------------------------
// The answer

/// What a message's answer says besides its content.
struct Info {
    id: String,
    model: String,
    /// `max_tokens` was cut to the room left in the context: an answer that runs to it ran
    /// out of context.
    capped: bool,
}

impl Info {
    /// `stop_reason` and `stop_sequence` of an answer that ended as `f`, with OpenAI's
    /// finish reason `reason` ("tool_calls" where the chat machinery read whole calls).
    fn stop(&self, reason: &str, f: &Finish) -> (&'static str, Value) {
        match (reason, f.reason, &f.stop_word) {
            ("tool_calls", _, _) => ("tool_use", Value::Null),
            (_, FinishReason::Length, _) if self.capped => {
                ("model_context_window_exceeded", Value::Null)
            }
            (_, FinishReason::Length, _) => ("max_tokens", Value::Null),
            (_, FinishReason::Stop, Some(w)) => ("stop_sequence", json!(w)),
            (_, FinishReason::Stop, None) => ("end_turn", Value::Null),
        }
    }

    /// `usage` as Anthropic counts it: the prompt tokens read from the slot's cache apart from
    /// the others.
    fn usage(f: &Finish) -> Value {
        json!({
            "input_tokens": f.prompt_tokens - f.cached_tokens,
            "cache_read_input_tokens": f.cached_tokens,
            "output_tokens": f.completion_tokens,
        })
    }

    /// The message before any content, `message_start`'s: the prompt's tokens all counted as
    /// input until the end tells how many came from the cache.
    fn start(&self, prompt_tokens: usize) -> Named {
        event(
            "message_start",
            json!({"type": "message_start", "message": {
                "id": self.id, "type": "message", "role": "assistant", "model": self.model,
                "content": [], "stop_reason": null, "stop_sequence": null,
                "usage": {
                    "input_tokens": prompt_tokens,
                    "cache_read_input_tokens": 0,
                    "output_tokens": 0,
                },
            }}),
        )
    }
}

/// A tool_use block as it starts, from an OpenAI tool call (its input still empty).
fn tool_use_start(call: &Value) -> Value {
    json!({
        "type": "tool_use",
        "id": tool_use_id(call["id"].as_str().unwrap_or("")),
        "name": call["function"]["name"],
        "input": {},
    })
}

/// An event of Anthropic's stream: its name and its data.
type Named = (&'static str, Value);

fn event(name: &'static str, data: Value) -> Named {
    (name, data)
}

/// The server-sent event `event: NAME` with `data: JSON`.
fn sse_event((name, data): Named) -> SseEvent {
    SseEvent::default().event(name).data(data.to_string())
}

/// The kinds of content block.
#[derive(Clone, Copy, PartialEq)]
enum Block {
    Thinking,
    Text,
    /// Tool call i of the answer.
    Call(usize),
}

/// A streamed message: the chat machinery's chunks as Anthropic's events. Each block is
/// stopped before the next starts (reasoning, then text, then the calls, as the chat machinery
/// reads them), so their deltas add up to the blocks of the whole message.
struct Streamer {
    info: Info,
    /// The index of the next block.
    next: usize,
    /// The block open now, and its index.
    open: Option<(Block, usize)>,
    /// Each call's block index.
    calls: Vec<usize>,
}

impl Streamer {
    fn new(info: Info) -> Streamer {
        Streamer {
            info,
            next: 0,
            open: None,
            calls: Vec::new(),
        }
    }

    /// The events of one chunk of the chat machinery's stream.
    fn on(&mut self, c: Chunk) -> Vec<Named> {
        let mut out = Vec::new();
        match c {
            Chunk::Data(v) => {
                let delta = &v["choices"][0]["delta"];
                if let Some(r) = delta["reasoning_content"]
                    .as_str()
                    .filter(|r| !r.is_empty())
                {
                    let at = self.begin(
                        Block::Thinking,
                        || json!({"type": "thinking", "thinking": "", "signature": ""}),
                        &mut out,
                    );
                    out.push(block_delta(
                        at,
                        json!({"type": "thinking_delta", "thinking": r}),
                    ));
                }
                if let Some(t) = delta["content"].as_str().filter(|t| !t.is_empty()) {
                    let at = self.begin(
                        Block::Text,
                        || json!({"type": "text", "text": ""}),
                        &mut out,
                    );
                    out.push(block_delta(at, json!({"type": "text_delta", "text": t})));
                }
                for call in delta["tool_calls"].as_array().into_iter().flatten() {
                    let i = call["index"].as_u64().unwrap_or(0) as usize;
                    let at = if call.get("id").is_some() {
                        let at = self.begin(Block::Call(i), || tool_use_start(call), &mut out);
                        self.calls.push(at);
                        at
                    } else {
                        match self.calls.get(i) {
                            Some(&at) => at,
                            None => continue,
                        }
                    };
                    let args = call["function"]["arguments"].as_str().unwrap_or("");
                    if !args.is_empty() {
                        out.push(block_delta(
                            at,
                            json!({"type": "input_json_delta", "partial_json": args}),
                        ));
                    }
                }
            }
            Chunk::End(v, f) => {
                self.close(&mut out);
                let (stop_reason, stop_sequence) = self
                    .info
                    .stop(v["choices"][0]["finish_reason"].as_str().unwrap_or(""), &f);
                out.push(event(
                    "message_delta",
                    json!({"type": "message_delta",
                           "delta": {"stop_reason": stop_reason, "stop_sequence": stop_sequence},
                           "usage": Info::usage(&f)}),
                ));
                out.push(event("message_stop", json!({"type": "message_stop"})));
            }
            Chunk::Error(e) => out.push(event("error", error_body(&e))),
            Chunk::Done => {}
        }
        out
    }

    /// The index of the open block of `kind`, started (after the open one is stopped) where
    /// another is open.
    fn begin(&mut self, kind: Block, block: impl FnOnce() -> Value, out: &mut Vec<Named>) -> usize {
        if let Some((open, at)) = self.open {
            if open == kind {
                return at;
            }
        }
        self.close(out);
        let at = self.next;
        self.next += 1;
        out.push(event(
            "content_block_start",
            json!({"type": "content_block_start", "index": at, "content_block": block()}),
        ));
        self.open = Some((kind, at));
        at
    }

    /// Stops the open block; a thinking block gets its (empty) signature first.
    fn close(&mut self, out: &mut Vec<Named>) {
        if let Some((kind, at)) = self.open.take() {
            if kind == Block::Thinking {
                out.push(block_delta(
                    at,
                    json!({"type": "signature_delta", "signature": ""}),
                ));
            }
            out.push(event(
                "content_block_stop",
                json!({"type": "content_block_stop", "index": at}),
            ));
        }
    }
}

fn block_delta(at: usize, delta: Value) -> Named {
    event(
        "content_block_delta",
        json!({"type": "content_block_delta", "index": at, "delta": delta}),
    )
}

/// The message that a stream's events add up to, as Anthropic's clients add them: the blocks
/// as they started, each with its deltas' text appended (a tool_use block's `input` the object
/// its JSON pieces spell, {} where they spell none: a call cut short), and the stop reason and
/// usage of `message_delta`.
fn assemble<'a>(events: impl IntoIterator<Item = &'a Named>) -> Value {
    fn append(v: &mut Value, more: &Value) {
        if let (Value::String(s), Some(more)) = (v, more.as_str()) {
            s.push_str(more);
        }
    }
    let mut msg = Value::Null;
    let mut inputs: Vec<Option<String>> = Vec::new();
    for (name, d) in events {
        match *name {
            "message_start" => msg = d["message"].clone(),
            "content_block_start" => {
                let block = &d["content_block"];
                inputs.push((block["type"] == "tool_use").then(String::new));
                if let Some(content) = msg["content"].as_array_mut() {
                    content.push(block.clone());
                }
            }
            "content_block_delta" => {
                let at = d["index"].as_u64().unwrap_or(0) as usize;
                let (delta, block) = (&d["delta"], &mut msg["content"][at]);
                match delta["type"].as_str().unwrap_or("") {
                    "text_delta" => append(&mut block["text"], &delta["text"]),
                    "thinking_delta" => append(&mut block["thinking"], &delta["thinking"]),
                    "signature_delta" => block["signature"] = delta["signature"].clone(),
                    "input_json_delta" => {
                        if let Some(Some(json)) = inputs.get_mut(at) {
                            json.push_str(delta["partial_json"].as_str().unwrap_or(""));
                        }
                    }
                    _ => {}
                }
            }
            "message_delta" => {
                msg["stop_reason"] = d["delta"]["stop_reason"].clone();
                msg["stop_sequence"] = d["delta"]["stop_sequence"].clone();
                msg["usage"] = d["usage"].clone();
            }
            _ => {}
        }
    }
    for (at, json) in inputs.iter().enumerate() {
        if let Some(json) = json {
            msg["content"][at]["input"] = match serde_json::from_str(json) {
                Ok(v @ Value::Object(_)) => v,
                _ => json!({}),
            };
        }
    }
    msg
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chat(v: Value) -> Result<Map<String, Value>, ApiError> {
        to_chat(v.as_object().unwrap(), true)
    }

    /// Checks Anthropic's order: message_start, blocks each started, given deltas and stopped
    /// (indices 0, 1, ... in turn, one open at a time), message_delta, message_stop.
    fn check_order(events: &[Named]) {
        let names: Vec<&str> = events.iter().map(|e| e.0).collect();
        assert_eq!(names[0], "message_start");
        assert_eq!(names[names.len() - 2..], ["message_delta", "message_stop"]);
        let (mut open, mut next) = (None, 0);
        for (name, d) in &events[1..events.len() - 2] {
            let at = d["index"].as_u64().unwrap() as usize;
            match *name {
                "content_block_start" => {
                    assert_eq!((open, at), (None, next), "{names:?}");
                    (open, next) = (Some(at), next + 1);
                }
                "content_block_delta" => assert_eq!(open, Some(at), "{names:?}"),
                "content_block_stop" => assert_eq!(open.take(), Some(at), "{names:?}"),
                other => panic!("{other}"),
            }
        }
        assert_eq!(open, None);
    }

    fn finish(reason: FinishReason, stop_word: Option<&str>) -> Finish {
        Finish {
            reason,
            stop_word: stop_word.map(str::to_string),
            slot: 0,
            prompt_tokens: 40,
            completion_tokens: 17,
            cached_tokens: 9,
            prompt_ms: 1.0,
            predicted_ms: 1.0,
        }
    }

    /// Random answers (reasoning, text, calls, each split into random deltas as the chat
    /// stream sends them; the text before the calls or after them): the events come in
    /// Anthropic's order and add up to the message with those blocks in the order they were
    /// written, its stop reason and usage.
    #[test]
    fn streamed_events_add_up_to_the_message() {
        let mut rng = crate::tools::test_util::Rng(0xA27_4B1C);
        let pieces = |rng: &mut crate::tools::test_util::Rng, text: &str| -> Vec<String> {
            let chars: Vec<char> = text.chars().collect();
            let mut out = Vec::new();
            let mut i = 0;
            while i < chars.len() {
                let n = 1 + rng.below(4);
                out.push(chars[i..(i + n).min(chars.len())].iter().collect());
                i += n;
            }
            out
        };
        let chunk = |delta: Value| Chunk::Data(json!({"choices": [{"delta": delta}]}));
        for round in 0..300 {
            let reasoning = ["", "let me think", "héllo wörld"][rng.below(3)];
            let content = ["", "Sure.", "It is \"sunny\"\n"][rng.below(3)];
            let text_last = rng.below(4) == 0;
            let n_calls = rng.below(3);
            let mut thinking = Vec::new();
            let mut text = Vec::new();
            let mut uses = Vec::new();
            let mut chunks = vec![chunk(json!({"role": "assistant", "content": ""}))];
            if !reasoning.is_empty() {
                thinking.push(json!({"type": "thinking", "thinking": reasoning, "signature": ""}));
            }
            for p in pieces(&mut rng, reasoning) {
                chunks.push(chunk(json!({"reasoning_content": p})));
            }
            let mut text_chunks = Vec::new();
            if !content.is_empty() {
                text.push(json!({"type": "text", "text": content}));
            }
            for p in pieces(&mut rng, content) {
                text_chunks.push(chunk(json!({"content": p})));
            }
            if !text_last {
                chunks.append(&mut text_chunks);
            }
            for i in 0..n_calls {
                let input = json!({"city": format!("c{}", rng.below(100)), "n": i});
                let id = format!("call_{i}x{round}");
                uses.push(json!({"type": "tool_use", "id": tool_use_id(&id),
                                 "name": format!("f{i}"), "input": input}));
                let parts = pieces(&mut rng, &input.to_string());
                let function = json!({"name": format!("f{i}"), "arguments": parts[0]});
                let first = json!({"index": i, "id": id, "type": "function",
                                   "function": function});
                chunks.push(chunk(json!({"tool_calls": [first]})));
                for p in &parts[1..] {
                    chunks.push(chunk(
                        json!({"tool_calls": [{"index": i, "function": {"arguments": p}}]}),
                    ));
                }
            }
            chunks.append(&mut text_chunks);
            let capped = rng.below(2) == 0;
            let (reason, f, stop, sequence) = match rng.below(4) {
                0 if n_calls > 0 => ("tool_calls", (FinishReason::Stop, None), "tool_use", None),
                1 if capped => (
                    "length",
                    (FinishReason::Length, None),
                    "model_context_window_exceeded",
                    None,
                ),
                1 => ("length", (FinishReason::Length, None), "max_tokens", None),
                2 => (
                    "stop",
                    (FinishReason::Stop, Some("END")),
                    "stop_sequence",
                    Some("END"),
                ),
                _ => ("stop", (FinishReason::Stop, None), "end_turn", None),
            };
            let f = finish(f.0, f.1);
            let last = json!({"choices": [{"delta": {}, "finish_reason": reason}]});
            chunks.push(Chunk::End(last, f));
            chunks.push(Chunk::Done);
            let info = Info {
                id: "msg_1".into(),
                model: "m".into(),
                capped,
            };
            let mut st = Streamer::new(info);
            let mut events = vec![st.info.start(40)];
            for c in chunks {
                events.extend(st.on(c));
            }
            check_order(&events);
            let blocks: Vec<Value> = match text_last {
                true => [thinking, uses, text].concat(),
                false => [thinking, text, uses].concat(),
            };
            let want = json!({
                "id": "msg_1", "type": "message", "role": "assistant", "model": "m",
                "content": blocks, "stop_reason": stop, "stop_sequence": sequence,
                "usage": {"input_tokens": 31, "cache_read_input_tokens": 9, "output_tokens": 17},
            });
            assert_eq!(assemble(&events), want, "{events:?}");
        }
    }

    #[test]
    fn billing_header_value_is_made_steady() {
        let a = "x-anthropic-billing-header: cc_version=2.1; cch=a5145;You are Claude Code.";
        let b = "x-anthropic-billing-header: cc_version=2.1; cch=07e2c;You are Claude Code.";
        assert_eq!(steady_billing_header(a), steady_billing_header(b));
        assert!(steady_billing_header(a).ends_with("cch=fffff;You are Claude Code."));
        for other in [
            "You are helpful. cch=12345;",
            "x-anthropic-billing-header: cch=12",
            "",
        ] {
            assert_eq!(steady_billing_header(other), other);
        }
    }

    #[test]
    fn blocks_become_chat_messages() {
        let c = chat(json!({
            "max_tokens": 5,
            "system": [{"type": "text", "text": "Be brief."}, {"type": "text", "text": "Be kind."}],
            "messages": [
                {"role": "user", "content": "Weather?"},
                {"role": "assistant", "content": [
                    {"type": "thinking", "thinking": "hmm", "signature": "x"},
                    {"type": "redacted_thinking", "data": "zz"},
                    {"type": "text", "text": "Let me look."},
                    {"type": "tool_use", "id": "toolu_1", "name": "w", "input": {"c": "P"}}]},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_1",
                     "content": [{"type": "text", "text": "sun"}]},
                    {"type": "text", "text": "Thanks", "cache_control": {"type": "ephemeral"}}]},
            ],
            "stop_sequences": ["END"],
            "tools": [{"name": "w", "input_schema": {"type": "object"}}],
            "tool_choice": {"type": "tool", "name": "w", "disable_parallel_tool_use": true},
            "thinking": {"type": "disabled"},
            "metadata": {"user_id": "u"},
            "temperature": 0.5,
        }))
        .unwrap();
        assert_eq!(
            Value::Object(c),
            json!({
                "max_tokens": 5,
                "messages": [
                    {"role": "system", "content": [{"type": "text", "text": "Be brief."},
                                                   {"type": "text", "text": "Be kind."}]},
                    {"role": "user", "content": "Weather?"},
                    {"role": "assistant", "content": [{"type": "text", "text": "Let me look."}],
                     "tool_calls": [{"id": "call_1", "type": "function",
                                     "function": {"name": "w", "arguments": "{\"c\":\"P\"}"}}],
                     "reasoning_content": "hmm"},
                    {"role": "tool", "tool_call_id": "call_1",
                     "content": [{"type": "text", "text": "sun"}]},
                    {"role": "user", "content": [{"type": "text", "text": "Thanks"}]},
                ],
                "tools": [{"type": "function", "function": {
                    "name": "w", "description": "", "parameters": {"type": "object"}}}],
                "tool_choice": {"type": "function", "function": {"name": "w"}},
                "parallel_tool_calls": false,
                "stop": ["END"],
                "reasoning_effort": "none",
                "temperature": 0.5,
            })
        );
        assert_eq!(tool_use_id("call_1"), "toolu_1");
        assert_eq!(tool_use_id("a1B2c3D4e"), "a1B2c3D4e");
    }

    #[test]
    fn bad_requests_name_what_is_wrong() {
        let user = json!([{"role": "user", "content": "hi"}]);
        // A request of one message whose content is this block.
        let one = |role: &str, block: Value| {
            let message = json!({"role": role, "content": [block]});
            json!({"max_tokens": 5, "messages": [message]})
        };
        for (body, field, says) in [
            (
                json!({"messages": user}),
                "max_tokens",
                "max_tokens is required",
            ),
            (
                json!({"max_tokens": 0, "messages": user}),
                "max_tokens",
                "max_tokens must be",
            ),
            (json!({"max_tokens": 5}), "messages", "messages is required"),
            (
                json!({"max_tokens": 5, "messages": []}),
                "messages",
                "at least one",
            ),
            (
                json!({"max_tokens": 5, "messages": [{"role": "tool", "content": "x"}]}),
                "messages",
                "messages[0].role",
            ),
            (
                json!({"max_tokens": 5, "messages": [{"role": "system", "content": "x"}]}),
                "messages",
                "top-level system",
            ),
            (
                one("user", json!({"type": "image", "source": {}})),
                "messages",
                "messages[0].content[0]: image blocks are not supported",
            ),
            (
                one(
                    "user",
                    json!({"type": "tool_use", "id": "a", "name": "b", "input": {}}),
                ),
                "messages",
                "not a block of a user message",
            ),
            (
                one(
                    "assistant",
                    json!({"type": "tool_use", "id": "a", "name": "b", "input": []}),
                ),
                "messages",
                "messages[0].content[0].input must be an object",
            ),
            (
                one("user", json!({"type": "tool_result"})),
                "messages",
                "tool_use_id is required",
            ),
            (
                one("user", json!({"text": "x"})),
                "messages",
                "messages[0].content[0].type is required",
            ),
            (
                json!({"max_tokens": 5, "messages": [{"role": "user", "content": []}]}),
                "messages",
                "must not be empty",
            ),
            (
                json!({"max_tokens": 5, "messages": user, "system": [{"type": "image"}]}),
                "system",
                "image blocks",
            ),
            (
                json!({"max_tokens": 5, "messages": user, "stop_sequences": "END"}),
                "stop_sequences",
                "array of non-empty",
            ),
            (
                json!({"max_tokens": 5, "messages": user, "tools": [{"name": "f"}]}),
                "tools",
                "input_schema is required",
            ),
            (
                json!({"max_tokens": 5, "messages": user,
                        "tools": [{"type": "web_search_20250305", "name": "web_search"}]}),
                "tools",
                "only custom tools",
            ),
            (
                json!({"max_tokens": 5, "messages": user, "tool_choice": {"type": "tool"}}),
                "tool_choice",
                "tool_choice.name",
            ),
            (
                json!({"max_tokens": 5, "messages": user, "tool_choice": "any"}),
                "tool_choice",
                "must be an object",
            ),
            (
                json!({"max_tokens": 5, "messages": user, "thinking": {"type": "enabled"}}),
                "thinking",
                "budget_tokens",
            ),
            (
                json!({"max_tokens": 5, "messages": user, "thinking": {"type": "on"}}),
                "thinking",
                "thinking.type",
            ),
            (
                json!({"max_tokens": 5, "messages": user, "metadata": "x"}),
                "metadata",
                "metadata must be",
            ),
        ] {
            let e = chat(body.clone()).unwrap_err();
            assert_eq!(e.status, 400, "{body}");
            assert_eq!(e.param.as_deref(), Some(field), "{body}: {}", e.message);
            assert!(e.message.contains(says), "{body}: {}", e.message);
            let shaped = error_body(&e);
            assert_eq!(shaped["type"], "error");
            assert_eq!(shaped["error"]["type"], "invalid_request_error");
        }
        // count_tokens takes a request without max_tokens.
        assert!(to_chat(json!({"messages": user}).as_object().unwrap(), false).is_ok());
    }
}
