//! OpenAI's Responses API (`POST /v1/responses`, and `/v1/responses/input_tokens` for the
//! prompt's token count), as llama-server serves it: a translation onto chat completions. The
//! request's `input` items (messages, function calls and their outputs, reasoning) become chat
//! messages, `instructions` a system message first, its flat function tools and `tool_choice`
//! the chat shapes, `text.format` a `response_format`, `max_output_tokens` `max_tokens` and
//! `reasoning.effort` `reasoning_effort`; the chat machinery (`http::prepare`: template, tools,
//! reasoning split, grammar, sampling) runs it, and its readings of the output become the
//! Responses API's output items: a `reasoning` item, a `message` with `output_text`, and a
//! `function_call` item a call. A streamed answer is the API's typed events (each with its
//! `sequence_number`); the answer that does not stream is built by the same run over the same
//! events, so the two always agree. Nothing is stored: `previous_response_id` and the other
//! features that need stored responses, and built-in tools, are 400s naming the field.

use crate::api::{show, type_name, Fields};
use crate::error::ApiError;
use crate::http::{self, Ids, Output, Settled};
use crate::scheduler::{Event, Finish, FinishReason};
use crate::tools::Parsed;
use crate::Shared;
use axum::body::Body;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::sse::{Event as SseEvent, Sse};
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures_util::stream::{self, StreamExt};
use serde_json::{json, Map, Value};
use std::convert::Infallible;
use std::sync::Arc;
use tokio::sync::mpsc::UnboundedReceiver;

/// `POST /v1/responses`: one answer, as a `response` object or its stream of events.
pub(crate) async fn create(
    State(sh): State<Arc<Shared>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    respond(sh, headers, body)
        .await
        .unwrap_or_else(IntoResponse::into_response)
}

async fn respond(sh: Arc<Shared>, headers: HeaderMap, body: Body) -> Result<Response, ApiError> {
    let (m, obj) = sh.request(&headers, body).await?;
    let (chat, echo) = translate(&obj)?;
    let p = http::prepare(&sh, m, &chat, http::Prepare::openai(true))
        .await
        .map_err(responses_param)?;
    let created = now();
    let params = &p.choices[0].1.params;
    let head = Head {
        id: format!(
            "resp_{:016x}{:08x}",
            sh.next_id() ^ created.rotate_left(40),
            created
        ),
        created,
        model: p.reply.model.clone(),
        temperature: params.temperature,
        top_p: params.top_p,
        echo,
    };
    let run = Run::new(head, p.reply.output_of(0));
    let mut rxs = sh.run_choices(p.choices)?;
    let rx = rxs.remove(0);
    if p.stream {
        Ok(Sse::new(events(run, rx)).into_response())
    } else {
        whole(run, rx).await.map(|v| Json(v).into_response())
    }
}

/// `POST /v1/responses/input_tokens`: the number of tokens of the prompt the request would
/// run, as llama-server counts it (`{"object": "response.input_tokens", "input_tokens"}`).
pub(crate) async fn input_tokens(
    State(sh): State<Arc<Shared>>,
    headers: HeaderMap,
    body: Body,
) -> Result<Json<Value>, ApiError> {
    let (m, obj) = sh.request(&headers, body).await?;
    let (chat, _) = translate(&obj)?;
    let text = http::render_chat(&m, &chat).map_err(responses_param)?;
    let n = http::chat_tokens(&m, &text).len();
    Ok(Json(
        json!({"object": "response.input_tokens", "input_tokens": n}),
    ))
}

fn now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// The request's own fields that its answer repeats (OpenAI's response object echoes them).
#[derive(Default, Clone)]
struct Echoed {
    instructions: Value,
    max_output_tokens: Value,
    tools: Value,
    tool_choice: Value,
    parallel_tool_calls: Value,
    text: Value,
    reasoning: Value,
    metadata: Value,
    user: Value,
}

/// Fields of the Responses API that need what Muser does not have (stored responses and
/// conversations, background runs, stored prompt templates, built-in tools, compaction of the
/// context), and why: a value other than null, false or "" is a 400.
const REFUSED: &[(&str, &str)] = &[
    (
        "previous_response_id",
        "this server keeps no stored responses",
    ),
    ("conversation", "this server keeps no stored conversations"),
    ("background", "this server runs no background responses"),
    ("prompt", "this server keeps no stored prompt templates"),
    (
        "max_tool_calls",
        "this server has no built-in tools to limit",
    ),
    (
        "context_management",
        "this server never compacts the context",
    ),
];

/// Chat-completions fields that have a Responses API field of their own: a 400 pointing to it
/// rather than two fields for one setting.
const CHAT_ONLY: &[(&str, &str)] = &[
    ("messages", "input"),
    ("max_tokens", "max_output_tokens"),
    ("max_completion_tokens", "max_output_tokens"),
    ("response_format", "text.format"),
    ("reasoning_effort", "reasoning.effort"),
    ("functions", "tools"),
    ("function_call", "tool_choice"),
];

/// A Responses API request as the chat completions request that runs it (its other fields, such
/// as `temperature`, `top_p`, `stream`, `seed` and llama-server's own samplers, passed on as
/// they are), and what its answer repeats of it.
fn translate(obj: &Map<String, Value>) -> Result<(Map<String, Value>, Echoed), ApiError> {
    let f = Fields(obj);
    for &(k, why) in REFUSED {
        match f.get(k) {
            None | Some(Value::Bool(false)) => {}
            Some(Value::String(s)) if s.is_empty() => {}
            Some(v) => {
                return Err(ApiError::param(
                    k,
                    format!("{k} is not supported: {why} (got {})", show(v)),
                ))
            }
        }
    }
    for &(k, instead) in CHAT_ONLY {
        if f.get(k).is_some() {
            return Err(ApiError::param(
                k,
                format!("{k} is a chat completions field: the Responses API's is {instead}"),
            ));
        }
    }
    for k in ["n", "n_cmpl"] {
        if f.integer(k, i64::MIN, i64::MAX)?.is_some_and(|n| n != 1) {
            return Err(ApiError::param(
                k,
                format!("{k} must be 1: a response has one output"),
            ));
        }
    }
    match f.get("truncation") {
        None => {}
        Some(Value::String(s)) if s == "disabled" => {}
        Some(v) => {
            return Err(ApiError::param(
                "truncation",
                format!(
                    "truncation must be \"disabled\" (a prompt past the context is a 400, never \
                     cut), got {}",
                    show(v)
                ),
            ))
        }
    }
    for k in ["logprobs", "top_logprobs"] {
        match f.get(k) {
            None | Some(Value::Bool(false)) => {}
            Some(v) if v.as_f64() == Some(0.0) => {}
            Some(v) => {
                return Err(ApiError::param(
                    k,
                    format!("{k} is not supported on /v1/responses (got {})", show(v)),
                ))
            }
        }
    }
    if let Some(v) = f.get("include") {
        let Value::Array(a) = v else {
            return Err(ApiError::param(
                "include",
                format!("include must be an array of strings, got {}", type_name(v)),
            ));
        };
        for (i, x) in a.iter().enumerate() {
            // (reasoning is given as text: there is no encrypted form to add)
            if x.as_str() != Some("reasoning.encrypted_content") {
                return Err(ApiError::param(
                    "include",
                    format!(
                        "include[{i}] {} is not supported (only \"reasoning.encrypted_content\", \
                         which adds nothing: reasoning is returned as text)",
                        show(x)
                    ),
                ));
            }
        }
    }
    for k in ["metadata", "stream_options"] {
        if let Some(v) = f.get(k).filter(|v| !v.is_object()) {
            return Err(ApiError::param(
                k,
                format!("{k} must be an object, got {}", type_name(v)),
            ));
        }
    }
    for k in [
        "user",
        "safety_identifier",
        "prompt_cache_key",
        "service_tier",
    ] {
        f.string(k)?;
    }

    let mut chat = obj.clone();
    for k in [
        "input",
        "instructions",
        "max_output_tokens",
        "tools",
        "tool_choice",
        "text",
        "reasoning",
        "include",
        "metadata",
        "store",
        "truncation",
        "user",
        "safety_identifier",
        "prompt_cache_key",
        "service_tier",
        "stream_options",
        "top_logprobs",
        "logprobs",
    ]
    .into_iter()
    .chain(REFUSED.iter().map(|&(k, _)| k))
    {
        chat.remove(k);
    }
    let mut messages = Vec::new();
    if let Some(s) = f.string("instructions")? {
        messages.push(json!({"role": "system", "content": s}));
    }
    match f.get("input") {
        None => return Err(ApiError::param("input", "input is required")),
        Some(Value::String(s)) => messages.push(json!({"role": "user", "content": s})),
        Some(Value::Array(items)) if items.is_empty() => {
            return Err(ApiError::param("input", "input must not be empty"))
        }
        Some(Value::Array(items)) => {
            for (i, item) in items.iter().enumerate() {
                input_item(i, item, &mut messages)?;
            }
        }
        Some(v) => {
            return Err(ApiError::param(
                "input",
                format!(
                    "input must be a string or an array of input items, got {}",
                    type_name(v)
                ),
            ))
        }
    }
    chat.insert("messages".into(), Value::Array(messages));
    if let Some(n) = f.integer("max_output_tokens", 1, i32::MAX as i64)? {
        chat.insert("max_tokens".into(), n.into());
    }
    if let Some(v) = f.get("tools") {
        chat.insert("tools".into(), chat_tools(v)?);
    }
    if let Some(v) = f.get("tool_choice") {
        chat.insert("tool_choice".into(), chat_tool_choice(v)?);
    }
    let text = text_format(f.get("text"), &mut chat)?;
    let reasoning = match f.get("reasoning") {
        None => json!({"effort": null, "summary": null}),
        Some(Value::Object(r)) => {
            let rf = Fields(r);
            let field = |k: &str, e: ApiError| {
                let message = e.message.replacen(k, &format!("reasoning.{k}"), 1);
                ApiError::param(&format!("reasoning.{k}"), message)
            };
            let effort = rf.string("effort").map_err(|e| field("effort", e))?;
            // (the reasoning is given whole: a summary of it is never made)
            let summary = rf.string("summary").map_err(|e| field("summary", e))?;
            rf.string("generate_summary")
                .map_err(|e| field("generate_summary", e))?;
            if let Some(e) = effort {
                chat.insert("reasoning_effort".into(), e.into());
            }
            json!({"effort": effort, "summary": summary})
        }
        Some(v) => {
            return Err(ApiError::param(
                "reasoning",
                format!("reasoning must be an object, got {}", type_name(v)),
            ))
        }
    };
    let given = |k: &str| f.get(k).cloned().unwrap_or(Value::Null);
    let echo = Echoed {
        instructions: given("instructions"),
        max_output_tokens: given("max_output_tokens"),
        tools: f.get("tools").cloned().unwrap_or(json!([])),
        tool_choice: f.get("tool_choice").cloned().unwrap_or(json!("auto")),
        parallel_tool_calls: f
            .get("parallel_tool_calls")
            .cloned()
            .unwrap_or(json!(false)),
        text,
        reasoning,
        metadata: f.get("metadata").cloned().unwrap_or(json!({})),
        user: given("user"),
    };
    Ok((chat, echo))
}

/// `text`: its `format` (`text`, `json_object`, or `json_schema` with `name`, `schema`,
/// `strict`) as chat's `response_format`; `verbosity` only "medium" (the model's own). Returns
/// the `text` object the answer repeats.
fn text_format(v: Option<&Value>, chat: &mut Map<String, Value>) -> Result<Value, ApiError> {
    let plain = json!({"format": {"type": "text"}});
    let Some(v) = v else {
        return Ok(plain);
    };
    let Value::Object(t) = v else {
        return Err(ApiError::param(
            "text",
            format!(
                "text must be an object such as {{\"format\": {{...}}}}, got {}",
                type_name(v)
            ),
        ));
    };
    match t.get("verbosity") {
        None | Some(Value::Null) => {}
        Some(Value::String(s)) if s == "medium" => {}
        Some(v) => {
            return Err(ApiError::param(
                "text.verbosity",
                format!(
                    "text.verbosity {} is not supported (only \"medium\")",
                    show(v)
                ),
            ))
        }
    }
    let param = |m: String| ApiError::param("text.format", m);
    let format = match t.get("format") {
        None | Some(Value::Null) => return Ok(plain),
        Some(Value::Object(o)) => o,
        Some(v) => {
            return Err(param(format!(
                "text.format must be an object, got {}",
                type_name(v)
            )))
        }
    };
    match format.get("type").and_then(Value::as_str) {
        Some("text") => {}
        Some("json_object") => {
            chat.insert("response_format".into(), json!({"type": "json_object"}));
        }
        Some("json_schema") => {
            let schema = match format.get("schema") {
                Some(s @ Value::Object(_)) => s.clone(),
                Some(v) => {
                    return Err(param(format!(
                        "text.format.schema must be an object (a JSON schema), got {}",
                        type_name(v)
                    )))
                }
                None => {
                    return Err(param(
                        "text.format.schema is required for json_schema".into(),
                    ))
                }
            };
            let mut js = json!({"schema": schema});
            for k in ["name", "strict", "description"] {
                if let Some(x) = format.get(k) {
                    js[k] = x.clone();
                }
            }
            chat.insert(
                "response_format".into(),
                json!({"type": "json_schema", "json_schema": js}),
            );
        }
        _ => {
            return Err(param(format!(
                "text.format.type must be \"text\", \"json_object\" or \"json_schema\", got {}",
                show(format.get("type").unwrap_or(&Value::Null))
            )))
        }
    }
    Ok(v.clone())
}

/// The Responses API's function tools, `{"type": "function", "name", "description",
/// "parameters", "strict"}`, as chat's `{"type": "function", "function": {...}}` (a tool
/// already in chat's shape is taken as it is); a built-in tool (web search, file search ...) is a
/// 400 naming it.
fn chat_tools(v: &Value) -> Result<Value, ApiError> {
    let Value::Array(tools) = v else {
        return Err(ApiError::param(
            "tools",
            format!("tools must be an array of tools, got {}", type_name(v)),
        ));
    };
    let mut out = Vec::with_capacity(tools.len());
    for (i, t) in tools.iter().enumerate() {
        let Value::Object(o) = t else {
            return Err(ApiError::param(
                "tools",
                format!("tools[{i}] must be an object, got {}", type_name(t)),
            ));
        };
        match o.get("type").and_then(Value::as_str) {
            Some("function") => {}
            other => {
                return Err(ApiError::param(
                    &format!("tools[{i}].type"),
                    format!(
                        "tools[{i}].type {} is not supported: only function tools \
                         ({{\"type\": \"function\", \"name\", \"parameters\"}}) are",
                        show(&other.map_or(Value::Null, Value::from))
                    ),
                ))
            }
        }
        if o.contains_key("function") {
            out.push(t.clone());
            continue;
        }
        let function: Map<String, Value> = o
            .iter()
            .filter(|(k, _)| k.as_str() != "type")
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        out.push(json!({"type": "function", "function": function}));
    }
    Ok(Value::Array(out))
}

/// `tool_choice`: "none", "auto", "required", or `{"type": "function", "name"}` (chat's
/// `{"type": "function", "function": {"name"}}`); other kinds (allowed tools, built-in tools)
/// are a 400.
fn chat_tool_choice(v: &Value) -> Result<Value, ApiError> {
    let Value::Object(o) = v else {
        // (a string is read, and checked, as chat reads it)
        return Ok(v.clone());
    };
    match o.get("type").and_then(Value::as_str) {
        Some("function") if o.contains_key("function") => Ok(v.clone()),
        Some("function") => match o.get("name") {
            Some(Value::String(n)) => Ok(json!({"type": "function", "function": {"name": n}})),
            other => Err(ApiError::param(
                "tool_choice.name",
                format!(
                    "tool_choice.name must be the function's name (a string), got {}",
                    show(other.unwrap_or(&Value::Null))
                ),
            )),
        },
        other => Err(ApiError::param(
            "tool_choice.type",
            format!(
                "tool_choice.type {} is not supported: give \"none\", \"auto\", \"required\" \
                 or {{\"type\": \"function\", \"name\": ...}}",
                show(&other.map_or(Value::Null, Value::from))
            ),
        )),
    }
}

/// Adds input item `i` to the chat messages: a message (`type` "message" or none, with its
/// role and content), a `function_call` (a call of the assistant's), a `function_call_output`
/// (a tool message) or a `reasoning` item (the assistant's reasoning). Consecutive items of the
/// assistant (reasoning, its message, its calls) make one assistant message, as llama-server
/// joins them.
fn input_item(i: usize, item: &Value, messages: &mut Vec<Value>) -> Result<(), ApiError> {
    let err = |m: String| ApiError::param("input", m);
    let Value::Object(o) = item else {
        return Err(err(format!(
            "input[{i}] must be an object (an input item), got {}",
            type_name(item)
        )));
    };
    let string = |k: &str| -> Result<&str, ApiError> {
        match o.get(k) {
            Some(Value::String(s)) => Ok(s),
            Some(v) => Err(err(format!(
                "input[{i}].{k} must be a string, got {}",
                type_name(v)
            ))),
            None => Err(err(format!("input[{i}].{k} is required"))),
        }
    };
    let kind = match o.get("type") {
        None | Some(Value::Null) => "message",
        Some(Value::String(t)) => t.as_str(),
        Some(v) => {
            return Err(err(format!(
                "input[{i}].type must be a string, got {}",
                type_name(v)
            )))
        }
    };
    // The assistant message that an item of the assistant's joins: the last message when it
    // is the assistant's, else a new one.
    let assistant = |messages: &mut Vec<Value>| -> usize {
        if messages.last().and_then(|m| m["role"].as_str()) != Some("assistant") {
            messages.push(json!({"role": "assistant", "content": []}));
        }
        messages.len() - 1
    };
    match kind {
        "message" => {
            let role = string("role")?;
            let (wanted, part_kinds): (&str, &[&str]) = match role {
                "user" | "system" | "developer" => ("input_text", &["input_text"]),
                "assistant" => ("output_text", &["output_text", "input_text", "refusal"]),
                other => {
                    return Err(err(format!(
                        "input[{i}].role {other:?} is not one of user, system, developer, \
                         assistant"
                    )))
                }
            };
            let parts = match o.get("content") {
                Some(Value::String(s)) => vec![json!({"type": "text", "text": s})],
                Some(Value::Array(a)) => a
                    .iter()
                    .enumerate()
                    .map(|(j, p)| text_part(i, j, p, part_kinds))
                    .collect::<Result<_, _>>()?,
                Some(v) => {
                    return Err(err(format!(
                        "input[{i}].content must be a string or an array of {wanted} parts, \
                         got {}",
                        type_name(v)
                    )))
                }
                None => return Err(err(format!("input[{i}].content is required"))),
            };
            if role == "assistant" {
                let at = assistant(messages);
                content_parts(&mut messages[at]).extend(parts);
            } else {
                messages.push(json!({"role": role, "content": parts}));
            }
        }
        "function_call" => {
            let call = json!({
                "id": string("call_id")?,
                "type": "function",
                "function": {"name": string("name")?, "arguments": string("arguments")?},
            });
            let at = assistant(messages);
            let calls = messages[at]
                .as_object_mut()
                .expect("a message is an object")
                .entry("tool_calls")
                .or_insert_with(|| json!([]));
            if let Value::Array(a) = calls {
                a.push(call);
            }
        }
        "function_call_output" => {
            let call_id = string("call_id")?;
            let content = match o.get("output") {
                Some(Value::String(s)) => json!(s),
                Some(Value::Array(a)) => Value::Array(
                    a.iter()
                        .enumerate()
                        .map(|(j, p)| text_part(i, j, p, &["input_text"]))
                        .collect::<Result<_, _>>()?,
                ),
                Some(v) => {
                    return Err(err(format!(
                        "input[{i}].output must be a string or an array of input_text parts, \
                         got {}",
                        type_name(v)
                    )))
                }
                None => return Err(err(format!("input[{i}].output is required"))),
            };
            messages.push(json!({"role": "tool", "tool_call_id": call_id, "content": content}));
        }
        "reasoning" => {
            // Its text: the `reasoning_text` content (what Muser's answers give), else the
            // summary's texts; an item with neither (only encrypted content) adds nothing.
            let texts = |k: &str| -> Result<Vec<String>, ApiError> {
                match o.get(k) {
                    None | Some(Value::Null) => Ok(Vec::new()),
                    Some(Value::Array(a)) => a
                        .iter()
                        .enumerate()
                        .map(|(j, p)| match p.get("text") {
                            Some(Value::String(s)) => Ok(s.clone()),
                            _ => Err(err(format!(
                                "input[{i}].{k}[{j}] must be an object with a string text"
                            ))),
                        })
                        .collect(),
                    Some(v) => Err(err(format!(
                        "input[{i}].{k} must be an array, got {}",
                        type_name(v)
                    ))),
                }
            };
            let content = texts("content")?;
            let summary = texts("summary")?;
            let text = if content.is_empty() { summary } else { content }.join("\n");
            if !text.is_empty() {
                let at = assistant(messages);
                let msg = &mut messages[at];
                let before = msg["reasoning_content"].as_str().unwrap_or("").to_string();
                msg["reasoning_content"] = json!(before + &text);
            }
        }
        other => {
            return Err(ApiError::param(
                &format!("input[{i}].type"),
                format!(
                    "input[{i}].type {other:?} is not supported: input items are messages, \
                     function_call, function_call_output and reasoning"
                ),
            ))
        }
    }
    Ok(())
}

/// The content parts of a message made here (always an array).
fn content_parts(msg: &mut Value) -> &mut Vec<Value> {
    if !msg["content"].is_array() {
        msg["content"] = json!([]);
    }
    msg["content"].as_array_mut().expect("made an array above")
}

/// Content part `j` of input item `i` as chat's text part, when its type is one of `kinds`
/// (`refusal` gives its text); images, files and audio are a 400.
fn text_part(i: usize, j: usize, p: &Value, kinds: &[&str]) -> Result<Value, ApiError> {
    let at = format!("input[{i}].content[{j}]");
    let kind = p.get("type").and_then(Value::as_str).unwrap_or("");
    if !kinds.contains(&kind) {
        let why = if matches!(kind, "input_image" | "input_file" | "input_audio") {
            "is not supported (text only)".to_string()
        } else {
            format!("must be one of {}", kinds.join(", "))
        };
        return Err(ApiError::param(
            "input",
            format!("{at}.type {kind:?} {why}"),
        ));
    }
    let key = if kind == "refusal" { "refusal" } else { "text" };
    match p.get(key) {
        Some(Value::String(s)) => Ok(json!({"type": "text", "text": s})),
        _ => Err(ApiError::param(
            "input",
            format!("{at}.{key} must be a string"),
        )),
    }
}

/// A chat request's error as the Responses API names its fields: `messages` is `input`,
/// `max_tokens` `max_output_tokens`, `response_format` `text.format`, a tool's
/// `function.name` its `name`.
fn responses_param(mut e: ApiError) -> ApiError {
    let Some(p) = e.param.clone() else {
        return e;
    };
    let renamed = match p.as_str() {
        "messages" => "input".to_string(),
        "max_tokens" => {
            e.message = e.message.replace("max_tokens", "max_output_tokens");
            "max_output_tokens".to_string()
        }
        "response_format" => "text.format".to_string(),
        "reasoning_effort" => "reasoning.effort".to_string(),
        "tool_choice.function.name" => "tool_choice.name".to_string(),
        p if p.starts_with("tools[") && p.contains("].function.") => {
            let q = p.replacen("].function.", "].", 1);
            e.message = e.message.replace(p, &q);
            q
        }
        _ => return e,
    };
    e.param = Some(renamed);
    e
}

/// The response's own settings: its id, when it was made, and what it repeats of the request.
struct Head {
    id: String,
    created: u64,
    model: String,
    temperature: f32,
    top_p: f32,
    echo: Echoed,
}

#[derive(Clone, Copy, PartialEq, Debug)]
enum Kind {
    Reasoning,
    Message,
    Call,
}

/// One output item: its kind, id, text (the reasoning, the message's text, or the call's
/// arguments), a call's `call_id` and name, and whether it is still open.
#[derive(Debug)]
struct Item {
    kind: Kind,
    id: String,
    text: String,
    call_id: String,
    name: String,
    open: bool,
    /// "in_progress" while open, then "completed", or "incomplete" for the item the output
    /// was cut in.
    status: &'static str,
}

/// One response as its output comes: the chat reading of the text so far (`Output::read_on`,
/// as chat streaming reads it), what of it has been sent, and the output items made of it. Each
/// reading's news (`http::news`) goes to the open item of its kind, or opens a new item after
/// closing the others: items are written one after the other, as OpenAI writes them, and
/// reasoning or text that comes after a call starts an item of its own.
struct Run {
    head: Head,
    output: Option<Output>,
    text: String,
    settled: Settled,
    sent: Parsed,
    ids: Option<Ids>,
    items: Vec<Item>,
    /// The item of each call, by the call's index in the reading.
    calls: Vec<usize>,
    seq: u64,
    /// Tokens generated, and those up to the last that added reasoning before the reply began.
    tokens: usize,
    reasoning_tokens: usize,
}

impl Run {
    fn new(head: Head, output: Option<Output>) -> Run {
        Run {
            head,
            ids: output.as_ref().map(Ids::new),
            output,
            text: String::new(),
            settled: Settled::default(),
            sent: Parsed::default(),
            items: Vec::new(),
            calls: Vec::new(),
            seq: 0,
            tokens: 0,
            reasoning_tokens: 0,
        }
    }

    /// An event of type `kind` with `fields` and the next sequence number.
    fn event(&mut self, out: &mut Vec<Value>, kind: &str, fields: Value) {
        let mut v = json!({"type": kind, "sequence_number": self.seq});
        if let (Value::Object(o), Value::Object(f)) = (&mut v, fields) {
            o.extend(f);
        }
        self.seq += 1;
        out.push(v);
    }

    /// The response object: `status` "in_progress", "completed", "incomplete" or "failed",
    /// with the items so far and, once done, the usage.
    fn response(&self, status: &str, finish: Option<&Finish>, error: Option<&ApiError>) -> Value {
        let h = &self.head;
        let e = &h.echo;
        let incomplete = (status == "incomplete").then(|| json!({"reason": "max_output_tokens"}));
        let usage = finish.map(|f| {
            json!({
                "input_tokens": f.prompt_tokens,
                "input_tokens_details": {"cached_tokens": f.cached_tokens},
                "output_tokens": f.completion_tokens,
                "output_tokens_details": {"reasoning_tokens": self.reasoning_tokens},
                "total_tokens": f.prompt_tokens + f.completion_tokens,
            })
        });
        let done = matches!(status, "completed" | "incomplete");
        json!({
            "id": h.id,
            "object": "response",
            "created_at": h.created,
            "status": status,
            "background": false,
            "completed_at": if done { json!(now()) } else { Value::Null },
            "error": error.map(|e| json!({"code": e.code.unwrap_or(e.kind), "message": e.message})),
            "incomplete_details": incomplete,
            "instructions": e.instructions,
            "max_output_tokens": e.max_output_tokens,
            "metadata": e.metadata,
            "model": h.model,
            "output": self.items.iter().map(Run::item_json).collect::<Vec<_>>(),
            "parallel_tool_calls": e.parallel_tool_calls,
            "previous_response_id": null,
            "reasoning": e.reasoning,
            "store": false,
            "temperature": h.temperature,
            "text": e.text,
            "tool_choice": e.tool_choice,
            "tools": e.tools,
            "top_p": h.top_p,
            "truncation": "disabled",
            "usage": usage,
            "user": e.user,
        })
    }

    /// Item `it` as the API writes it.
    fn item_json(it: &Item) -> Value {
        let status = it.status;
        match it.kind {
            Kind::Reasoning => json!({
                "id": it.id,
                "type": "reasoning",
                "summary": [],
                "content": [part(Kind::Reasoning, &it.text)],
                "status": status,
            }),
            Kind::Message => json!({
                "id": it.id,
                "type": "message",
                "role": "assistant",
                "status": status,
                "content": [part(Kind::Message, &it.text)],
            }),
            Kind::Call => json!({
                "id": it.id,
                "type": "function_call",
                "status": status,
                "call_id": it.call_id,
                "name": it.name,
                "arguments": it.text,
            }),
        }
    }

    /// The first events: the response created, and in progress.
    fn start(&mut self) -> Vec<Value> {
        let mut out = Vec::new();
        let r = self.response("in_progress", None, None);
        self.event(&mut out, "response.created", json!({"response": r}));
        let r = self.response("in_progress", None, None);
        self.event(&mut out, "response.in_progress", json!({"response": r}));
        out
    }

    /// The events of a token's text.
    fn token(&mut self, id: Option<u32>, text: &str) -> Vec<Value> {
        self.tokens += usize::from(id.is_some());
        self.text.push_str(text);
        let now = match &self.output {
            Some(o) => o.read_on(&self.text, &mut self.settled),
            None => Parsed {
                content: self.text.clone(),
                ..Parsed::default()
            },
        };
        self.take(now)
    }

    /// The events of the end: the whole text's final reading, every open item closed, and the
    /// response completed (or incomplete, when the output was cut by `max_output_tokens` or
    /// the context).
    fn finish(&mut self, f: &Finish) -> Vec<Value> {
        let now = match &self.output {
            Some(o) => o.parse_final(&self.text).0,
            None => Parsed {
                content: self.text.clone(),
                ..Parsed::default()
            },
        };
        let mut out = self.take(now);
        let status = match f.reason {
            FinishReason::Length => "incomplete",
            FinishReason::Stop => "completed",
        };
        out.extend(self.close_all(status));
        let r = self.response(status, Some(f), None);
        self.event(
            &mut out,
            &format!("response.{status}"),
            json!({"response": r}),
        );
        out
    }

    /// The events of a failure: the error, then the response failed.
    fn fail(&mut self, e: &ApiError) -> Vec<Value> {
        let mut out = Vec::new();
        let fields = json!({
            "code": e.code.unwrap_or(e.kind),
            "message": e.message,
            "param": e.param,
        });
        self.event(&mut out, "error", fields);
        let r = self.response("failed", None, Some(e));
        self.event(&mut out, "response.failed", json!({"response": r}));
        out
    }

    /// The events that bring the items up to the reading `now`.
    fn take(&mut self, now: Parsed) -> Vec<Value> {
        let began = !self.sent.content.is_empty() || !self.sent.tool_calls.is_empty();
        let delta = http::news(&mut self.sent, &mut self.ids, now);
        let mut out = Vec::new();
        if let Some(r) = delta.get("reasoning_content").and_then(Value::as_str) {
            if !began {
                self.reasoning_tokens = self.tokens;
            }
            let at = self.open(&mut out, Kind::Reasoning, None);
            self.add(&mut out, at, r);
        }
        if let Some(c) = delta.get("content").and_then(Value::as_str) {
            let at = self.open(&mut out, Kind::Message, None);
            self.add(&mut out, at, c);
        }
        for c in delta
            .get("tool_calls")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            let index = c["index"].as_u64().unwrap_or(0) as usize;
            let args = c["function"]["arguments"].as_str().unwrap_or("");
            let at = match self.calls.get(index) {
                Some(&at) => at,
                None => {
                    let call = (
                        c["id"].as_str().unwrap_or("").to_string(),
                        c["function"]["name"].as_str().unwrap_or("").to_string(),
                    );
                    let at = self.open(&mut out, Kind::Call, Some(call));
                    self.calls.push(at);
                    at
                }
            };
            self.add(&mut out, at, args);
        }
        out
    }

    /// The item new text of `kind` goes to: the last item when it is open and of that kind (a
    /// call: never, each call opens its own), else a new one, after the open ones close.
    fn open(&mut self, out: &mut Vec<Value>, kind: Kind, call: Option<(String, String)>) -> usize {
        if let Some(last) = self.items.last() {
            if last.open && last.kind == kind && kind != Kind::Call {
                return self.items.len() - 1;
            }
        }
        out.extend(self.close_all("completed"));
        let at = self.items.len();
        let prefix = match kind {
            Kind::Reasoning => "rs",
            Kind::Message => "msg",
            Kind::Call => "fc",
        };
        let (call_id, name) = call.unwrap_or_default();
        let suffix = self.head.id.trim_start_matches("resp_");
        self.items.push(Item {
            kind,
            id: format!("{prefix}_{suffix}{at:02x}"),
            text: String::new(),
            call_id,
            name,
            open: true,
            status: "in_progress",
        });
        let item = Run::item_json(&self.items[at]);
        let item = match kind {
            // (added with empty content: the part is added next)
            Kind::Reasoning | Kind::Message => {
                let mut i = item;
                i["content"] = json!([]);
                i
            }
            Kind::Call => item,
        };
        self.event(
            out,
            "response.output_item.added",
            json!({"output_index": at, "item": item}),
        );
        if kind != Kind::Call {
            let id = self.items[at].id.clone();
            self.event(
                out,
                "response.content_part.added",
                json!({"item_id": id, "output_index": at, "content_index": 0, "part": part(kind, "")}),
            );
        }
        at
    }

    /// Adds `text` to item `at`, with its delta event.
    fn add(&mut self, out: &mut Vec<Value>, at: usize, text: &str) {
        if text.is_empty() {
            return;
        }
        self.items[at].text.push_str(text);
        let (kind, id) = (self.items[at].kind, self.items[at].id.clone());
        let (ty, mut fields) = match kind {
            Kind::Reasoning => ("response.reasoning_text.delta", json!({"content_index": 0})),
            Kind::Message => (
                "response.output_text.delta",
                json!({"content_index": 0, "logprobs": []}),
            ),
            Kind::Call => ("response.function_call_arguments.delta", json!({})),
        };
        fields["item_id"] = json!(id);
        fields["output_index"] = json!(at);
        fields["delta"] = json!(text);
        self.event(out, ty, fields);
    }

    /// Closes the open items, in `status`: each one's done events.
    fn close_all(&mut self, status: &'static str) -> Vec<Value> {
        let mut out = Vec::new();
        for at in 0..self.items.len() {
            if !self.items[at].open {
                continue;
            }
            self.items[at].open = false;
            self.items[at].status = status;
            let it = &self.items[at];
            let (kind, id, text) = (it.kind, it.id.clone(), it.text.clone());
            let base = json!({"item_id": id, "output_index": at});
            let with = |extra: Value| {
                let mut v = base.clone();
                if let (Value::Object(o), Value::Object(e)) = (&mut v, extra) {
                    o.extend(e);
                }
                v
            };
            match kind {
                Kind::Reasoning | Kind::Message => {
                    let ty = if kind == Kind::Message {
                        "response.output_text.done"
                    } else {
                        "response.reasoning_text.done"
                    };
                    let mut done = with(json!({"content_index": 0, "text": text}));
                    if kind == Kind::Message {
                        done["logprobs"] = json!([]);
                    }
                    self.event(&mut out, ty, done);
                    let p = with(json!({"content_index": 0, "part": part(kind, &text)}));
                    self.event(&mut out, "response.content_part.done", p);
                }
                Kind::Call => {
                    let name = self.items[at].name.clone();
                    let done = with(json!({"name": name, "arguments": text}));
                    self.event(&mut out, "response.function_call_arguments.done", done);
                }
            }
            let item = Run::item_json(&self.items[at]);
            self.event(
                &mut out,
                "response.output_item.done",
                json!({"output_index": at, "item": item}),
            );
        }
        out
    }
}

/// The content part of a reasoning item or a message with `text`.
fn part(kind: Kind, text: &str) -> Value {
    match kind {
        Kind::Reasoning => json!({"type": "reasoning_text", "text": text}),
        _ => json!({"type": "output_text", "text": text, "annotations": [], "logprobs": []}),
    }
}

/// The answer that does not stream: the run's last response object, built over the same
/// events as a stream's (which are dropped).
async fn whole(mut run: Run, mut rx: UnboundedReceiver<Event>) -> Result<Value, ApiError> {
    while let Some(ev) = rx.recv().await {
        match ev {
            Event::Token { id, text, .. } => {
                run.token(id, &text);
            }
            Event::Done(f) => {
                let last = run.finish(&f).pop().expect("finish ends with the response");
                return Ok(last["response"].clone());
            }
            Event::Error(e) => return Err(e),
            Event::Prompt(_) => {}
        }
    }
    Err(ApiError::internal(
        "the engine stopped before the answer was complete",
    ))
}

/// The answer's server-sent events, each `event: <type>` with its JSON; the stream ends after
/// `response.completed` (or `response.incomplete`, or `response.failed` after an `error`),
/// without OpenAI chat's `[DONE]`, as OpenAI and llama-server end it.
fn events(
    run: Run,
    rx: UnboundedReceiver<Event>,
) -> impl futures_util::Stream<Item = Result<SseEvent, Infallible>> {
    let sse = |v: Value| {
        let kind = v["type"].as_str().unwrap_or("").to_string();
        Ok(SseEvent::default().event(kind).data(v.to_string()))
    };
    stream::unfold(Some((run, rx, true)), move |st| async move {
        let (mut run, mut rx, first) = st?;
        if first {
            // (sent at once, before the prompt is read)
            let out = run.start();
            return Some((
                stream::iter(out.into_iter().map(sse)),
                Some((run, rx, false)),
            ));
        }
        let mut out = Vec::new();
        let end = match rx.recv().await {
            Some(Event::Token { id, text, .. }) => {
                out.extend(run.token(id, &text));
                false
            }
            Some(Event::Prompt(_)) => false,
            Some(Event::Done(f)) => {
                out.extend(run.finish(&f));
                true
            }
            Some(Event::Error(e)) => {
                out.extend(run.fail(&e));
                true
            }
            None => {
                let e = ApiError::internal("the engine stopped before the answer was complete");
                out.extend(run.fail(&e));
                true
            }
        };
        let next = (!end).then_some((run, rx, false));
        Some((stream::iter(out.into_iter().map(sse)), next))
    })
    .flatten()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tools::test_util::{piece_ends, random_output, random_req, Rng};
    use crate::tools::{think, Format};

    fn head() -> Head {
        Head {
            id: "resp_0123".into(),
            created: 1,
            model: "m".into(),
            temperature: 0.8,
            top_p: 0.95,
            echo: Echoed::default(),
        }
    }

    fn finish(reason: FinishReason, n: usize) -> Finish {
        Finish {
            reason,
            stop_word: None,
            slot: 0,
            prompt_tokens: 5,
            completion_tokens: n,
            cached_tokens: 0,
            prompt_ms: 1.0,
            predicted_ms: 1.0,
        }
    }

    /// Random Hermes answers (reasoning in <think> tags first or not, text and calls, some cut
    /// short), streamed in random pieces: the events are numbered in order, each item is added
    /// at the next index and done before the next one is added, its deltas add up to what its
    /// done event and the last response give, and the items together hold the text, reasoning
    /// and calls of chat's final reading of the same text.
    #[test]
    fn events_rebuild_the_items_and_the_chat_reading() {
        let mut rng = Rng(0x2E5_9015);
        let (mut calls_seen, mut reasoned, mut text_after_calls) = (0, 0, 0);
        for round in 0..200 {
            let parallel = rng.coin();
            let r = random_req(&mut rng, round, parallel);
            let think = [None, Some(true), Some(false)][rng.below(3)];
            let output = Output::for_test(
                Format::Hermes,
                Some(r.clone()),
                think.map(|o| (think::THINK, o)),
            );
            let mut text = match think {
                None => String::new(),
                Some(true) => "Weighing it.</think>".to_string(),
                Some(false) => "<think>Weighing it.</think>".to_string(),
            };
            text += &random_output(&mut rng, Format::Hermes, &r);
            if rng.coin() {
                // text after the calls: an item of its own, after theirs
                text += " Then more.";
            }
            if rng.coin() {
                let mut cut = rng.below(text.len() + 1);
                while !text.is_char_boundary(cut) {
                    cut -= 1;
                }
                text.truncate(cut);
            }
            let mut run = Run::new(head(), Some(output.clone()));
            let mut events = run.start();
            let mut last = 0;
            let ends = piece_ends(&mut rng, &text, 7);
            for &at in &ends {
                events.extend(run.token(Some(0), &text[last..at]));
                last = at;
            }
            let reason = [FinishReason::Stop, FinishReason::Length][rng.below(2)];
            events.extend(run.finish(&finish(reason, ends.len())));

            for (i, e) in events.iter().enumerate() {
                assert_eq!(e["sequence_number"], json!(i));
            }
            let (mut items, mut open): (Vec<(Value, String)>, Option<usize>) = (Vec::new(), None);
            for e in &events[2..events.len() - 1] {
                let at = e["output_index"].as_u64().unwrap() as usize;
                match e["type"].as_str().unwrap() {
                    "response.output_item.added" => {
                        assert_eq!((open, at), (None, items.len()), "{text:?}");
                        items.push((e["item"].clone(), String::new()));
                        open = Some(at);
                    }
                    "response.output_item.done" => {
                        assert_eq!(open, Some(at));
                        let (item, sent) = &mut items[at];
                        *item = e["item"].clone();
                        let whole = match item["type"].as_str().unwrap() {
                            "function_call" => &item["arguments"],
                            _ => &item["content"][0]["text"],
                        };
                        assert_eq!(whole, &json!(sent));
                        open = None;
                    }
                    t if t.ends_with(".delta") => {
                        assert_eq!(open, Some(at));
                        assert_eq!(e["item_id"], items[at].0["id"]);
                        items[at].1 += e["delta"].as_str().unwrap();
                    }
                    _ => assert_eq!(open, Some(at)),
                }
            }
            assert_eq!(open, None);
            let end = events.last().unwrap();
            let status = match reason {
                FinishReason::Stop => "completed",
                FinishReason::Length => "incomplete",
            };
            assert_eq!(end["type"], json!(format!("response.{status}")));
            let out: Vec<Value> = items.iter().map(|(i, _)| i.clone()).collect();
            assert_eq!(end["response"]["output"], json!(out));

            let (p, _) = output.parse_final(&text);
            let joined = |kind: &str| -> String {
                out.iter()
                    .filter(|i| i["type"] == kind)
                    .map(|i| i["content"][0]["text"].as_str().unwrap().to_string())
                    .collect()
            };
            assert_eq!(joined("message"), p.content, "{text:?}");
            assert_eq!(joined("reasoning"), p.reasoning.clone().unwrap_or_default());
            let calls: Vec<(String, String)> = out
                .iter()
                .filter(|i| i["type"] == "function_call")
                .map(|i| {
                    let s = |k: &str| i[k].as_str().unwrap().to_string();
                    (s("name"), s("arguments"))
                })
                .collect();
            let want: Vec<(String, String)> = p
                .tool_calls
                .iter()
                .map(|c| (c.name.clone(), c.arguments.clone()))
                .collect();
            assert_eq!(calls, want, "{text:?}");
            let kinds: Vec<&str> = out.iter().map(|i| i["type"].as_str().unwrap()).collect();
            let after = kinds.windows(2).any(|w| w == ["function_call", "message"]);
            text_after_calls += usize::from(after);
            calls_seen += calls.len();
            reasoned += usize::from(p.reasoning.is_some());
        }
        assert!(
            calls_seen > 100 && reasoned > 50 && text_after_calls > 10,
            "{calls_seen} {reasoned} {text_after_calls}"
        );
    }

    /// Every kind of input item becomes its chat message: instructions a system message first,
    /// the assistant's reasoning, text and calls one message, call outputs tool messages.
    #[test]
    fn input_items_become_chat_messages() {
        let body = json!({
            "instructions": "Be brief.",
            "input": [
                {"role": "developer", "content": "Rules."},
                {"type": "message", "role": "user",
                 "content": [{"type": "input_text", "text": "a"}, {"type": "input_text", "text": "b"}]},
                {"type": "reasoning", "summary": [], "content": [{"type": "reasoning_text", "text": "hm"}]},
                {"role": "assistant", "content": "Let me see."},
                {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
                {"type": "function_call", "call_id": "c2", "name": "g", "arguments": "{\"x\":1}"},
                {"type": "function_call_output", "call_id": "c1", "output": "1"},
                {"type": "function_call_output", "call_id": "c2",
                 "output": [{"type": "input_text", "text": "2"}]},
                {"type": "message", "role": "assistant",
                 "content": [{"type": "output_text", "text": "Done."}, {"type": "refusal", "refusal": "No."}]},
            ],
            "max_output_tokens": 7,
            "tools": [{"type": "function", "name": "f", "parameters": {}}],
            "tool_choice": {"type": "function", "name": "f"},
            "text": {"format": {"type": "json_schema", "name": "s", "schema": {"type": "object"}}},
            "reasoning": {"effort": "low"},
            "temperature": 0.5,
        });
        let (chat, _) = translate(body.as_object().unwrap()).unwrap();
        let text = |t: &str| json!({"type": "text", "text": t});
        assert_eq!(
            chat["messages"],
            json!([
                {"role": "system", "content": "Be brief."},
                {"role": "developer", "content": [text("Rules.")]},
                {"role": "user", "content": [text("a"), text("b")]},
                {"role": "assistant", "content": [text("Let me see.")], "reasoning_content": "hm",
                 "tool_calls": [
                    {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}},
                    {"id": "c2", "type": "function", "function": {"name": "g", "arguments": "{\"x\":1}"}}]},
                {"role": "tool", "tool_call_id": "c1", "content": "1"},
                {"role": "tool", "tool_call_id": "c2", "content": [text("2")]},
                {"role": "assistant", "content": [text("Done."), text("No.")]},
            ])
        );
        assert_eq!(chat["max_tokens"], json!(7));
        assert_eq!(
            chat["tools"],
            json!([{"type": "function", "function": {"name": "f", "parameters": {}}}])
        );
        assert_eq!(
            chat["tool_choice"],
            json!({"type": "function", "function": {"name": "f"}})
        );
        assert_eq!(
            chat["response_format"],
            json!({"type": "json_schema", "json_schema": {"name": "s", "schema": {"type": "object"}}})
        );
        assert_eq!(chat["reasoning_effort"], json!("low"));
        assert_eq!(chat["temperature"], json!(0.5));
        for k in [
            "input",
            "instructions",
            "max_output_tokens",
            "text",
            "reasoning",
        ] {
            assert!(!chat.contains_key(k), "{k}");
        }
    }
}
