//! The routes: request bodies are read under the size limit, parsed (`api`, `chat`), checked
//! against the context, handed to the engine, and the engine's events are answered as one
//! OpenAI response object or as server-sent events ending in `data: [DONE]` (llama-server's own
//! `/completion` in its own shape: native.rs; Anthropic's Messages API translated onto the chat
//! answers: anthropic.rs). llama-server's read-only `/props` and `/slots` (slots.rs) describe
//! the server and its slots.

use crate::anthropic;
use crate::api::{self, fit_context, parse_generation, parse_object, parse_prompt, Fields};
use crate::chat::{ChatRequest, ChatTemplate, Continue};
use crate::constrain;
use crate::error::ApiError;
use crate::metrics::Metrics;
use crate::native::{self, NativeReply};
use crate::responses;
use crate::scheduler::{
    Echo, Event, Finish, FinishReason, Job, Logprob, SlotAction, SlotRequest, Ticket, Work,
};
use crate::slots::slots_json;
use crate::tools::{self, kimi3, think, Format, Parsed, Resume, ToolCall, ToolRequest};
use crate::{ModelInfo, Shared};
use axum::body::{Body, Bytes};
use axum::extract::{Path, Request, State};
use axum::http::{header, HeaderMap, StatusCode, Uri};
use axum::middleware::{self, Next};
use axum::response::sse::{Event as SseEvent, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use futures_util::stream::{self, Stream, StreamExt};
use muser_sample::DEFAULT_SEED;
use serde_json::{json, Map, Value};
use std::convert::Infallible;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver};

type AppState = State<Arc<Shared>>;

pub(crate) fn router(shared: Arc<Shared>) -> Router {
    Router::new()
        .route("/health", get(health))
        .route("/v1/health", get(health))
        .route("/v1/models", get(models))
        .route("/models", get(models))
        .route("/v1/models/{id}", get(model))
        .route("/models/{id}", get(model))
        .route("/completion", post(completion_native))
        .route("/infill", post(infill))
        .route("/v1/completions", post(completions))
        .route("/completions", post(completions))
        .route("/v1/chat/completions", post(chat_completions))
        .route("/chat/completions", post(chat_completions))
        .route("/v1/responses", post(responses::create))
        .route("/responses", post(responses::create))
        .route("/v1/responses/input_tokens", post(responses::input_tokens))
        .route("/responses/input_tokens", post(responses::input_tokens))
        .route(
            "/v1/messages",
            post(anthropic::messages).fallback(anthropic::method_not_allowed),
        )
        .route(
            "/v1/messages/count_tokens",
            post(anthropic::count_tokens).fallback(anthropic::method_not_allowed),
        )
        .route("/apply-template", post(apply_template))
        .route("/v1/embeddings", post(embeddings_openai))
        .route("/embeddings", post(embeddings_native))
        .route("/embedding", post(embeddings_native))
        .route("/tokenize", post(tokenize))
        .route("/detokenize", post(detokenize))
        .route("/metrics", get(metrics))
        .route("/props", get(props).post(set_props))
        .route("/slots", get(slots))
        .route("/slots/{id}", post(slot_action))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(middleware::from_fn_with_state(shared.clone(), auth))
        .with_state(shared)
}

/// `--api-key`: every route but /health and the model list needs `Authorization: Bearer KEY`
/// or, as Anthropic's clients send it, `x-api-key: KEY` (llama-server takes either).
async fn auth(State(sh): AppState, req: Request, next: Next) -> Response {
    let Some(key) = &sh.config.api_key else {
        return next.run(req).await;
    };
    let path = req.uri().path();
    let model_list = ["/v1/models", "/models"].iter().any(|p| {
        path.strip_prefix(p)
            .is_some_and(|r| r.is_empty() || r.starts_with('/'))
    });
    if model_list || matches!(path, "/health" | "/v1/health") {
        return next.run(req).await;
    }
    // The scheme's name is case-insensitive (RFC 9110, 11.1).
    let given = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().split_once(' '))
        .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
        .map(|(_, token)| token.trim());
    let x_api_key = req
        .headers()
        .get("x-api-key")
        .and_then(|v| v.to_str().ok())
        .map(str::trim);
    if given == Some(key.as_str()) || x_api_key == Some(key.as_str()) {
        return next.run(req).await;
    }
    let e = ApiError::new(
        StatusCode::UNAUTHORIZED,
        "authentication_error",
        "invalid or missing API key (Authorization: Bearer <key>, or x-api-key: <key>)",
    )
    .with_code("invalid_api_key");
    if anthropic::is_anthropic_path(path) {
        return anthropic::error_response(e);
    }
    e.into_response()
}

/// A known path asked with the wrong method: 405 as OpenAI-shaped JSON, not an empty body.
async fn method_not_allowed(req: Request) -> ApiError {
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        "invalid_request_error",
        format!("{} is not allowed on {}", req.method(), req.uri().path()),
    )
    .with_code("method_not_allowed")
}

async fn not_found(req: Request) -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        "invalid_request_error",
        format!("no route for {} {}", req.method(), req.uri().path()),
    )
    .with_code("not_found")
}

impl Shared {
    /// The model, or 503 while it loads (500 if it failed to).
    pub(crate) fn ready(&self) -> Result<Arc<ModelInfo>, ApiError> {
        if let Some(m) = self.model.get() {
            return Ok(m.clone());
        }
        match self.load_error.get() {
            Some(e) => Err(ApiError::internal(format!("the model failed to load: {e}"))),
            None => Err(ApiError::unavailable("the model is loading").with_code("loading")),
        }
    }

    pub(crate) fn next_id(&self) -> u64 {
        self.counter.fetch_add(1, Relaxed)
    }

    /// The seed of a request that gives none: 32 bits, as llama-server's, so that the
    /// `generation_settings.seed` a client reads back is exact in JavaScript too.
    fn next_seed(&self) -> u64 {
        self.next_id() & 0xFFFF_FFFF
    }

    /// Hands a request to the engine, whose events come back on the receiver; 503 when every
    /// slot is taken and `max_queue` requests already wait for one.
    fn run(
        &self,
        prompt: Vec<u32>,
        gen: api::Generation,
        max_tokens: usize,
    ) -> Result<UnboundedReceiver<Event>, ApiError> {
        let mut rx = self.run_choices(vec![(prompt, gen, max_tokens)])?;
        Ok(rx.remove(0))
    }

    /// `run` of the choices of one request (each its prompt, its settings and its most
    /// tokens), admitted together or not at all; their receivers in order.
    pub(crate) fn run_choices(
        &self,
        choices: Vec<(Vec<u32>, api::Generation, usize)>,
    ) -> Result<Vec<UnboundedReceiver<Event>>, ApiError> {
        let m = &self.metrics;
        let limit = self.config.parallel.saturating_add(self.max_queue);
        let Some(tickets) = Ticket::admit_many(&self.admitted, limit, choices.len()) else {
            Metrics::add(&m.requests_rejected, 1);
            return Err(ApiError::unavailable(format!(
                "the server is busy: all {} slots are in use and {} requests are waiting; retry later",
                self.config.parallel, self.max_queue
            ))
            .with_code("server_overloaded"));
        };
        let mut rxs = Vec::with_capacity(choices.len());
        for ((prompt, gen, max_tokens), ticket) in choices.into_iter().zip(tickets) {
            m.queued.fetch_add(1, Relaxed);
            let (events, rx) = unbounded_channel();
            let job = Job {
                prompt,
                gen,
                max_tokens,
                events,
                ticket,
            };
            // (the choices sent before are dropped with their receivers: the engine ends them)
            self.jobs.send(Work::Job(Box::new(job))).map_err(|_| {
                m.queued.fetch_sub(1, Relaxed);
                ApiError::internal("the engine has stopped")
            })?;
            rxs.push(rx);
        }
        Ok(rxs)
    }

    /// A request's JSON object, once the model is ready (503 before), with the model.
    pub(crate) async fn request(
        &self,
        headers: &HeaderMap,
        body: Body,
    ) -> Result<(Arc<ModelInfo>, Map<String, Value>), ApiError> {
        let m = self.ready()?;
        Ok((
            m,
            parse_object(&read_body(headers, body, self.config.body_limit).await?)?,
        ))
    }
}

/// The body, at most `limit` bytes: 413 above it (by Content-Length or while reading).
async fn read_body(headers: &HeaderMap, body: Body, limit: usize) -> Result<Bytes, ApiError> {
    let too_large = || {
        ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "invalid_request_error",
            format!("the request body is larger than the limit of {limit} bytes"),
        )
        .with_code("request_too_large")
    };
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit as u64) {
        return Err(too_large());
    }
    axum::body::to_bytes(body, limit).await.map_err(|e| {
        let mut src: Option<&(dyn std::error::Error + 'static)> = Some(&e);
        while let Some(s) = src {
            if s.is::<http_body_util::LengthLimitError>() {
                return too_large();
            }
            src = s.source();
        }
        ApiError::bad_request(format!("could not read the request body: {e}"))
    })
}

async fn health(State(sh): AppState) -> Response {
    match sh.ready() {
        Ok(_) => Json(json!({"status": "ok"})).into_response(),
        Err(e) => e.into_response(),
    }
}

async fn models(State(sh): AppState) -> Result<Json<Value>, ApiError> {
    let m = sh.ready()?;
    Ok(Json(
        json!({ "object": "list", "data": [model_object(&m)] }),
    ))
}

/// `GET /v1/models/{id}`: the model object (OpenAI's retrieve), 404 for another name.
async fn model(State(sh): AppState, Path(id): Path<String>) -> Result<Json<Value>, ApiError> {
    let m = sh.ready()?;
    if !m.knows(&id) {
        return Err(unknown_model(&id, &m));
    }
    Ok(Json(model_object(&m)))
}

fn model_object(m: &ModelInfo) -> Value {
    json!({
        "id": m.id,
        "aliases": m.aliases,
        "tags": [],
        "object": "model",
        "created": m.created,
        "owned_by": "muser",
        "meta": {
            "n_ctx": m.n_ctx,
            "n_ctx_train": m.n_ctx_train,
            "n_vocab": m.n_vocab,
            "n_embd": m.n_embd,
            "n_params": m.n_params,
            "size": m.size,
            "backend": m.backend,
            "chat_template": m.template_origin,
        }
    })
}

fn unknown_model(name: &str, m: &ModelInfo) -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        "invalid_request_error",
        format!(
            "the model '{name}' does not exist; this server has '{}'",
            m.id
        ),
    )
    .with_code("model_not_found")
}

async fn metrics(State(sh): AppState) -> Response {
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        sh.metrics.render(),
    )
        .into_response()
}

/// llama-server's `GET /props`: the server's settings. `default_generation_settings` holds
/// the settings a request that sets none runs with (its `params` as /completion's
/// `generation_settings` writes them; the seed is llama.cpp's marker of a fresh random seed per
/// request, as llama-server's) and a slot's context. llama-server's fields that Muser has no
/// value for (the file type's llama.cpp name, the media marker, llama.cpp's probe of the
/// template's capabilities) are left out.
async fn props(State(sh): AppState) -> Result<Json<Value>, ApiError> {
    let m = sh.ready()?;
    let defaults = parse_generation(&Fields(&Map::new()), false, DEFAULT_SEED, m.n_vocab)?;
    Ok(Json(json!({
        "default_generation_settings": {
            "params": native::generation_settings(&defaults),
            "n_ctx": m.n_ctx,
        },
        "total_slots": sh.config.parallel,
        "model_alias": m.id,
        "model_path": sh.config.model_path.display().to_string(),
        "modalities": {"vision": false, "video": false, "audio": false},
        // /slots and /metrics are always on; there is no POST /props and no web UI.
        "endpoint_slots": true,
        "endpoint_props": false,
        "endpoint_metrics": true,
        "ui": false,
        "ui_settings": {},
        "chat_template": m.template_source,
        // The tool-call format the template teaches (Muser's own field).
        "chat_format": m.chat_format.name(),
        "bos_token": m.bos_token,
        "eos_token": m.eos_token,
        "build_info": concat!("muser ", env!("CARGO_PKG_VERSION")),
        "is_sleeping": false,
        "cors_proxy_enabled": false,
    })))
}

/// `POST /props`: llama-server changes settings there only when started with `--props`. Muser
/// has no such option, so it answers as llama-server does without it: 501, not supported.
async fn set_props() -> ApiError {
    ApiError::new(
        StatusCode::NOT_IMPLEMENTED,
        "not_supported_error",
        "this server does not support changing global properties (POST /props)",
    )
    .with_code("not_supported")
}

/// llama-server's `GET /slots`: each slot's state from the engine's board (slots.rs), read
/// without waiting on the engine. With `?fail_on_no_slot=1` (any value), 503 when every slot is
/// busy, as llama-server.
async fn slots(State(sh): AppState, uri: Uri) -> Result<Json<Value>, ApiError> {
    let m = sh.ready()?;
    let board = sh.metrics.slots.snapshot();
    let fail_on_no_slot = uri
        .query()
        .unwrap_or("")
        .split('&')
        .filter_map(|kv| kv.split_once('='))
        .any(|(k, v)| k == "fail_on_no_slot" && !v.is_empty());
    if fail_on_no_slot && board.iter().all(|s| s.processing) {
        return Err(ApiError::unavailable("no slot available").with_code("no_slot_available"));
    }
    Ok(Json(slots_json(&board, m.n_ctx)))
}

/// llama-server's `POST /slots/{id}?action=save|restore|erase`: slot id's cache saved to the
/// file `filename` (a plain name) under `--slot-save-path`, taken back from one, or emptied.
/// Without `--slot-save-path`, 501.
async fn slot_action(
    State(sh): AppState,
    Path(id): Path<String>,
    uri: Uri,
    headers: HeaderMap,
    body: Body,
) -> Result<Json<Value>, ApiError> {
    let action = uri
        .query()
        .unwrap_or("")
        .split('&')
        .filter_map(|kv| kv.split_once('='))
        .find(|(k, _)| *k == "action")
        .map(|(_, v)| v.to_string())
        .unwrap_or_default();
    let Some(dir) = sh.config.slot_save_path.clone() else {
        return Err(ApiError::new(
            StatusCode::NOT_IMPLEMENTED,
            "not_supported_error",
            "this server keeps no slot files: start it with --slot-save-path DIR",
        )
        .with_code("not_supported"));
    };
    let slot: usize = id
        .parse()
        .map_err(|_| ApiError::param("id_slot", format!("slot id {id:?} is not a number")))?;
    let (_, obj) = if action == "erase" {
        (sh.ready()?, Map::new())
    } else {
        sh.request(&headers, body).await?
    };
    let file = |obj: &Map<String, Value>| -> Result<(std::path::PathBuf, String), ApiError> {
        let name = Fields(obj)
            .string("filename")?
            .ok_or_else(|| ApiError::param("filename", "filename is required"))?;
        if !crate::slot_file::valid_name(name) {
            return Err(ApiError::param(
                "filename",
                format!("{name:?} is not a plain file name (no path, not hidden)"),
            ));
        }
        Ok((dir.join(name), name.to_string()))
    };
    let action = match action.as_str() {
        "save" => file(&obj).map(|(path, filename)| SlotAction::Save { path, filename })?,
        "restore" => file(&obj).map(|(path, filename)| SlotAction::Restore { path, filename })?,
        "erase" => SlotAction::Erase,
        other => {
            return Err(ApiError::param(
                "action",
                format!("action must be save, restore or erase, got {other:?}"),
            ))
        }
    };
    let (reply, rx) = tokio::sync::oneshot::channel();
    sh.jobs
        .send(Work::Slot(SlotRequest {
            slot,
            action,
            reply,
        }))
        .map_err(|_| ApiError::internal("the engine has stopped"))?;
    let v = rx
        .await
        .map_err(|_| ApiError::internal("the engine has stopped"))??;
    Ok(Json(v))
}

/// OpenAI's `POST /v1/embeddings` (`crate::embed`): one pooled vector a text.
async fn embeddings_openai(
    State(sh): AppState,
    headers: HeaderMap,
    body: Body,
) -> Result<Json<Value>, ApiError> {
    embeddings(sh, headers, body, true).await
}

/// llama-server's `POST /embedding` and `/embeddings`: each text's vectors (one a token with
/// pooling `none`).
async fn embeddings_native(
    State(sh): AppState,
    headers: HeaderMap,
    body: Body,
) -> Result<Json<Value>, ApiError> {
    embeddings(sh, headers, body, false).await
}

async fn embeddings(
    sh: Arc<Shared>,
    headers: HeaderMap,
    body: Body,
    openai: bool,
) -> Result<Json<Value>, ApiError> {
    if !sh.config.embeddings {
        return Err(ApiError::new(
            StatusCode::NOT_IMPLEMENTED,
            "not_supported_error",
            "this server does not serve embeddings: start it with --embeddings",
        )
        .with_code("not_supported"));
    }
    let (m, obj) = sh.request(&headers, body).await?;
    let f = Fields(&obj);
    if let Some(name) = f.string("model")? {
        if !name.is_empty() && !m.knows(name) {
            return Err(unknown_model(name, &m).with_param("model"));
        }
    }
    let (inputs, field) = crate::embed::parse_inputs(&obj, &m.tokenizer, m.n_vocab, m.n_ctx)?;
    // llama-server's `content` is its own field: the answer takes its own shape.
    let openai = openai && field == "input";
    if openai && m.pooling == crate::embed::Pooling::None {
        return Err(ApiError::bad_request(
            "the server's pooling is none (one vector a token), which OpenAI's embeddings do              not have: start it with --pooling mean, cls or last, or ask /embedding",
        ));
    }
    let (normalize, base64) = crate::embed::parse_options(&f)?;
    let (reply, rx) = tokio::sync::oneshot::channel();
    let job = crate::embed::EmbedJob {
        inputs,
        normalize,
        pooling: m.pooling,
    };
    sh.jobs
        .send(Work::Embed(crate::embed::EmbedRequest { job, reply }))
        .map_err(|_| ApiError::internal("the engine has stopped"))?;
    let got = rx
        .await
        .map_err(|_| ApiError::internal("the engine has stopped"))??;
    Ok(Json(if openai {
        crate::embed::openai_json(&m.id, &got, base64)
    } else {
        crate::embed::native_json(&got)
    }))
}

async fn tokenize(
    State(sh): AppState,
    headers: HeaderMap,
    body: Body,
) -> Result<Json<Value>, ApiError> {
    let (m, obj) = sh.request(&headers, body).await?;
    let f = Fields(&obj);
    let content = f
        .string("content")?
        .ok_or_else(|| ApiError::param("content", "content is required"))?;
    let add_special = f.boolean("add_special")?.unwrap_or(false);
    let parse_special = f.boolean("parse_special")?.unwrap_or(true);
    let ids = m.tokenizer.encode(content, add_special, parse_special);
    let tokens: Vec<Value> = if f.boolean("with_pieces")?.unwrap_or(false) {
        ids.iter()
            .map(|&id| {
                // As llama-server: the text when the bytes are whole characters, else the bytes.
                let raw = m.piece_bytes(id);
                let piece = match std::str::from_utf8(raw) {
                    Ok(text) => json!(text),
                    Err(_) => json!(raw),
                };
                json!({"id": id, "piece": piece})
            })
            .collect()
    } else {
        ids.iter().map(|&id| json!(id)).collect()
    };
    Ok(Json(json!({ "tokens": tokens })))
}

async fn detokenize(
    State(sh): AppState,
    headers: HeaderMap,
    body: Body,
) -> Result<Json<Value>, ApiError> {
    let (m, obj) = sh.request(&headers, body).await?;
    let ids = match Fields(&obj).get("tokens") {
        Some(Value::Array(a)) => api::token_ids(a, m.tokenizer.n_vocab())
            .map_err(|e| ApiError::param("tokens", format!("tokens{e}")))?,
        Some(v) => {
            return Err(ApiError::param(
                "tokens",
                format!(
                    "tokens must be an array of token ids, got {}",
                    api::type_name(v)
                ),
            ))
        }
        None => return Err(ApiError::param("tokens", "tokens is required")),
    };
    let bytes = m
        .tokenizer
        .decode(&ids)
        .map_err(|e| ApiError::param("tokens", e.to_string()))?;
    Ok(Json(json!({ "content": String::from_utf8_lossy(&bytes) })))
}

/// llama-server's `POST /apply-template`: the prompt text the chat template makes of a
/// request's `messages`, without running the model.
async fn apply_template(
    State(sh): AppState,
    headers: HeaderMap,
    body: Body,
) -> Result<Json<Value>, ApiError> {
    let (m, obj) = sh.request(&headers, body).await?;
    Ok(Json(json!({ "prompt": render_chat(&m, &obj)? })))
}

/// The prompt text the chat template makes of a chat request (its messages, tools, response
/// format ...), as /v1/chat/completions renders it, without running the model.
pub(crate) fn render_chat(m: &ModelInfo, obj: &Map<String, Value>) -> Result<String, ApiError> {
    // The response format matters to the prompt where the generic tool format describes it.
    let f = Fields(obj);
    let preserved = constrain::preserved_tokens(&f, &m.tokenizer)?;
    let spec = constrain::read(&f, &m.tokenizer, &preserved)?;
    let (response, _) = tools_response(spec.as_ref(), obj)?;
    let (req, _, _) = chat_request(&m.template, m.chat_format, obj, response.as_ref())?;
    m.template.render_request(&req)
}

/// The tokens of a rendered chat prompt: BOS first where the model asks for it, unless the
/// template wrote it itself; control tokens parsed.
pub(crate) fn chat_tokens(m: &ModelInfo, text: &str) -> Vec<u32> {
    let bos_written = m
        .tokenizer
        .bos()
        .and_then(|b| m.tokenizer.token_text(b).ok())
        .is_some_and(|b| !b.is_empty() && text.starts_with(b));
    m.tokenizer.encode(text, !bos_written, true)
}

/// The JSON schema of the reply that calls no tool, when a request gives tools and a JSON
/// response format (`response_format` or `json_schema`), and the field it came from.
fn tools_response(
    spec: Option<&constrain::Spec>,
    obj: &Map<String, Value>,
) -> Result<(Option<Value>, Option<constrain::Source>), ApiError> {
    match spec {
        Some(constrain::Spec {
            kind: constrain::SpecKind::Schema(s, source),
            lazy: None,
            ..
        }) if obj.get("tools").is_some_and(|t| !t.is_null()) => {
            // Checked here, so that an error names the response format's field.
            constrain::schema_grammar(s, *source)?;
            Ok((Some(constrain::any_object_if_empty(s)), Some(*source)))
        }
        _ => Ok((None, None)),
    }
}

/// The `arguments` of the assistant messages' tool calls: a JSON string (OpenAI's) or an
/// object; for a template that reads them as an object, a string must hold a JSON object (a 400
/// naming the call otherwise, rather than the template's own refusal or a prompt with the
/// arguments missing).
fn check_call_arguments(messages: &[Value], objects: bool) -> Result<(), ApiError> {
    for (i, msg) in messages.iter().enumerate() {
        let calls = msg.get("tool_calls").and_then(Value::as_array);
        for (j, call) in calls.into_iter().flatten().enumerate() {
            let field = format!("messages[{i}].tool_calls[{j}].function.arguments");
            match call.get("function").and_then(|f| f.get("arguments")) {
                None | Some(Value::Object(_)) => {}
                Some(Value::String(s)) => {
                    let object = matches!(serde_json::from_str::<Value>(s), Ok(Value::Object(_)));
                    if objects && !object {
                        return Err(ApiError::param(
                            "messages",
                            format!("{field} must be a JSON object (as a string), got {s:?}"),
                        ));
                    }
                }
                Some(v) => {
                    return Err(ApiError::param(
                        "messages",
                        format!(
                            "{field} must be a JSON string or an object, got {}",
                            crate::api::type_name(v)
                        ),
                    ))
                }
            }
        }
    }
    Ok(())
}

/// The request's tools as templates see them, as llama.cpp gives them: each
/// `{"type": "function", "function": {"name", "description", "parameters"}}`, a missing
/// description "" and missing parameters `{}` (templates write them with `tojson`).
fn template_tools(obj: &Map<String, Value>) -> Value {
    let tools = obj.get("tools").and_then(Value::as_array);
    tools
        .into_iter()
        .flatten()
        .map(|t| {
            let f = &t["function"];
            let params = match f.get("parameters") {
                None | Some(Value::Null) => json!({}),
                Some(p) => p.clone(),
            };
            json!({"type": "function", "function": {
                "name": f["name"],
                "description": f.get("description").cloned().unwrap_or(json!("")),
                "parameters": params,
            }})
        })
        .collect()
}

/// A chat request's messages and template inputs, with its tools (checked, shown to the
/// template as `tools`, with the format's own variables: Llama 3.1's `builtin_tools`) and their
/// plan in the model's format (whose system text, the generic format's, is added to the system
/// prompt).
pub(crate) fn chat_request(
    template: &ChatTemplate,
    format: Format,
    obj: &Map<String, Value>,
    response: Option<&Value>,
) -> Result<(ChatRequest, Option<ToolRequest>, Option<tools::Plan>), ApiError> {
    let mut req = ChatRequest::parse(obj)?;
    thinking_variables(&mut req, template.reasoning_tags().is_some(), obj)?;
    req.add_dates(&chrono::Local::now());
    check_call_arguments(&req.messages, template.reads_object_arguments())?;
    let mut tools = tools::parse_tools(obj)?;
    let mut plan = None;
    if let Some(t) = &mut tools {
        t.response = response.cloned();
        req.tools = Some(template_tools(obj));
        for (name, value) in format.template_variables(t) {
            req.add_variable(name, value);
        }
        plan = format.plan(t).map_err(|e| ApiError::param("tools", e))?;
        if let Some(text) = plan.as_ref().and_then(|p| p.system.as_deref()) {
            req.add_system(text);
        }
    }
    Ok((req, tools, plan))
}

/// Whether an answer's calls are read: the request gives tools, and `tool_choice` is not none.
fn reads_calls(tools: Option<&ToolRequest>) -> bool {
    tools.is_some_and(|t| t.choice != tools::ToolChoice::None)
}

/// The reasoning block an answer's output starts with, where it is split from the reply: the
/// template's tags as its format reads them (`Format::reasoning_tags`: with the markers that
/// end an unclosed block when calls are read), and whether the prompt opened the block. None
/// where the request turns the split off (`reasoning_format` none), the prompt closes the
/// block or continues a message's content after it.
fn reasoning_block(
    template: &ChatTemplate,
    format: Format,
    req: &ChatRequest,
    prompt: &str,
    reasoning: bool,
    calls: bool,
) -> Result<Option<(think::Tags, bool)>, ApiError> {
    let continued = template.continued(req)?;
    let Some(tags) = template
        .reasoning_tags()
        .filter(|t| reasoning && !t.prompt_closes(prompt) && continued != Some(Continue::Content))
    else {
        return Ok(None);
    };
    // A message's reasoning goes on as written: whitespace that starts its continuation is
    // the reasoning's, even where a family skips it at a block's start.
    let goes_on = continued == Some(Continue::Reasoning)
        && req
            .prefill
            .as_ref()
            .is_some_and(|p| !p.reasoning.is_empty());
    let tags = think::Tags {
        trim_reasoning: tags.trim_reasoning && !goes_on,
        ..format.reasoning_tags(tags, calls)
    };
    let opened = continued == Some(Continue::Reasoning) || tags.prompt_opens(prompt);
    Ok(Some((tags, opened)))
}

/// What the output of a chat prompt is read after: the opening of the section Kimi K3's
/// prompt leaves it in, else the header of a continued message (`Format::continued_header`).
fn output_lead(format: Format, prompt: &str, continued: Option<Continue>) -> &'static str {
    kimi3::section_lead(format, prompt, continued)
        .unwrap_or_else(|| format.continued_header(continued))
}

/// Muser's reading of `text` as the output of the chat request `body` (its messages, tools,
/// `tool_choice`, `reasoning_format`, `chat_template_kwargs` ...) under the chat template
/// `source`, as `muser serve` reads an answer: `{"content", "reasoning_content", "tool_calls":
/// [{"name", "arguments"}]}`, the final reading of the answer (streamed or not), or `{"error"}`
/// where the request is refused. Every prefix of the text is also read as streaming reads it,
/// and `"stream_error"` says where that took back what it had sent or ended elsewhere. (For
/// tests that compare readings with llama.cpp's: `examples/chat_read.rs`.)
pub fn read_chat_output(source: &str, body: &Map<String, Value>, text: &str) -> Value {
    let read = || -> Result<Value, ApiError> {
        let template = ChatTemplate::new(Some(source), "", "")
            .map_err(|e| ApiError::param("template", e.to_string()))?;
        let format = Format::detect(Some(source));
        let (req, tools, _) = chat_request(&template, format, body, None)?;
        let calls = reads_calls(tools.as_ref());
        let prompt = template.render_request(&req)?;
        let reasoning = reasoning_format(&Fields(body))?;
        let o = Output {
            format,
            lead: output_lead(format, &prompt, template.continued(&req)?),
            think: reasoning_block(&template, format, &req, &prompt, reasoning, calls)?,
            tools,
            call_seed: 0,
            past_ids: Default::default(),
        };
        let (p, _) = o.parse_final(text);
        let calls: Vec<Value> = p
            .tool_calls
            .iter()
            .map(|c| json!({"name": c.name, "arguments": c.arguments}))
            .collect();
        let mut out = json!({
            "content": p.content,
            "reasoning_content": p.reasoning.clone().unwrap_or_default(),
            "tool_calls": calls,
        });
        if let Err(e) = o.check_stream(text, &p) {
            out["stream_error"] = e.into();
        }
        Ok(out)
    };
    read().unwrap_or_else(|e| json!({"error": e.to_string()}))
}

/// The template variables of reasoning, as llama-server sets them: `enable_thinking` true for a
/// template that writes reasoning tags (where Muser splits the reasoning off) and false for the
/// others, unless `chat_template_kwargs` sets it; OpenAI's `reasoning_effort` "none" turns it
/// off, and another effort reaches the template as `reasoning_effort` and `reasoning_strength`
/// (gpt-oss's and Muse Glimmer's templates read them). `preserve_reasoning` (true unless the
/// request sets it) keeps the reasoning of past turns in the prompt, as llama-server keeps it
/// by default, through the variables templates name it by (`preserve_thinking`, and the
/// negated `clear_thinking` of GLM 4.7, `truncate_history_thinking` of Nemotron 3,
/// `drop_thinking` of DeepSeek V4), each unless the request sets it.
fn thinking_variables(
    req: &mut ChatRequest,
    reasons: bool,
    obj: &Map<String, Value>,
) -> Result<(), ApiError> {
    match req.kwargs.get("enable_thinking") {
        None | Some(Value::Bool(_)) => {}
        Some(v) => {
            return Err(ApiError::param(
                "chat_template_kwargs",
                format!(
                    "chat_template_kwargs.enable_thinking must be a boolean, got {}",
                    crate::api::type_name(v)
                ),
            ))
        }
    }
    req.add_variable("enable_thinking", Value::Bool(reasons));
    match Fields(obj).string("reasoning_effort")? {
        None => {}
        Some("none") => {
            req.kwargs
                .insert("enable_thinking".into(), Value::Bool(false));
            req.kwargs.remove("reasoning_effort");
        }
        // (an empty effort sets nothing, as in llama-server)
        Some("") => {}
        Some(effort) => {
            req.kwargs
                .insert("reasoning_effort".into(), Value::from(effort));
        }
    }
    // Any string effort, even an empty one the template's variables give (llama.cpp's
    // test of it, `json::empty`, is false for every string).
    if let Some(effort @ Value::String(_)) = req.kwargs.get("reasoning_effort") {
        req.add_variable("reasoning_strength", effort.clone());
    }
    req.add_variable("preserve_reasoning", Value::Bool(true));
    if let Some(&Value::Bool(keep)) = req.kwargs.get("preserve_reasoning") {
        req.add_variable("preserve_thinking", Value::Bool(keep));
        for name in [
            "clear_thinking",
            "truncate_history_thinking",
            "drop_thinking",
        ] {
            req.add_variable(name, Value::Bool(!keep));
        }
    }
    Ok(())
}

/// llama-server's own `POST /completion` (native.rs).
async fn completion_native(
    State(sh): AppState,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let (m, obj) = sh.request(&headers, body).await?;
    native_answer(sh, m, obj).await
}

/// llama-server's `POST /infill` (`crate::infill`): the fill-in-the-middle prompt made from
/// `input_prefix`, `input_suffix` and `input_extra`, then answered as `/completion` answers.
async fn infill(State(sh): AppState, headers: HeaderMap, body: Body) -> Result<Response, ApiError> {
    let (m, mut obj) = sh.request(&headers, body).await?;
    let prompt = crate::infill::prompt(&m.tokenizer, &obj, m.n_ctx, sh.config.spm_infill)?;
    for key in crate::infill::FIELDS {
        obj.remove(key);
    }
    obj.insert("prompt".into(), json!(prompt));
    native_answer(sh, m, obj).await
}

/// `/completion`'s answer to a request's fields.
async fn native_answer(
    sh: Arc<Shared>,
    m: Arc<ModelInfo>,
    obj: Map<String, Value>,
) -> Result<Response, ApiError> {
    let (obj, native) = native::translate(obj)?;
    let f = Fields(&obj);
    // (llama-server answers several completions here as an array of answers; Muser's
    // /completion gives one: several choices are asked of the OpenAI endpoints)
    if api::parse_choices(&f, usize::MAX)? != 1 {
        let key = if f.get("n_cmpl").is_some() {
            "n_cmpl"
        } else {
            "n"
        };
        return Err(ApiError::param(
            key,
            format!(
                "{key} above 1 is not supported on /completion (one completion a request): \
                 ask /v1/completions or /v1/chat/completions for several choices"
            ),
        ));
    }
    let mut gen = parse_generation(&f, false, sh.next_seed(), m.n_vocab)?;
    gen.preserved = constrain::preserved_tokens(&f, &m.tokenizer)?;
    gen.grammar = constrain::build(constrain::read(&f, &m.tokenizer, &gen.preserved)?, &m).await?;
    let prompt = parse_prompt(f.get("prompt"), &m.tokenizer, m.n_vocab)?;
    // llama-server's n_predict is a maximum: generation stops when the context is full
    // (`stop_type` "limit", `truncated`), rather than a 400 as OpenAI's max_tokens.
    let room = fit_context(prompt.len(), None, m.n_ctx)?;
    let max_tokens = gen.max_tokens.map_or(room, |n| n.min(room));
    let reply = NativeReply::new(m.clone(), native, &gen, &prompt);
    let stream = gen.stream;
    let rx = sh.run(prompt, gen, max_tokens)?;
    if stream {
        Ok(Sse::new(native::sse(reply, rx)).into_response())
    } else {
        native::collect(reply, rx)
            .await
            .map(|v| Json(v).into_response())
    }
}

async fn completions(State(sh): AppState, headers: HeaderMap, body: Body) -> Response {
    generate(sh, headers, body, false)
        .await
        .unwrap_or_else(IntoResponse::into_response)
}

async fn chat_completions(State(sh): AppState, headers: HeaderMap, body: Body) -> Response {
    generate(sh, headers, body, true)
        .await
        .unwrap_or_else(IntoResponse::into_response)
}

async fn generate(
    sh: Arc<Shared>,
    headers: HeaderMap,
    body: Body,
    chat: bool,
) -> Result<Response, ApiError> {
    let (m, obj) = sh.request(&headers, body).await?;
    let p = prepare(&sh, m, &obj, Prepare::openai(chat)).await?;
    let rxs = sh.run_choices(p.choices)?;
    if p.stream {
        Ok(Sse::new(sse_stream(p.reply, rxs)).into_response())
    } else {
        collect(p.reply, rxs).await.map(|v| Json(v).into_response())
    }
}

/// How `prepare` takes a request: as a chat or a completions request, the start of its
/// answer's id, and whether `max_tokens` past the context is cut to the room left (as
/// llama-server's n_predict, where another API translated onto this one expects it) rather
/// than refused.
pub(crate) struct Prepare {
    pub chat: bool,
    pub id_prefix: &'static str,
    pub cap_max_tokens: bool,
}

impl Prepare {
    /// As OpenAI's own endpoints take a request: `chatcmpl-` or `cmpl-` ids, `max_tokens` past
    /// the context refused.
    pub(crate) fn openai(chat: bool) -> Prepare {
        Prepare {
            chat,
            id_prefix: if chat { "chatcmpl-" } else { "cmpl-" },
            cap_max_tokens: false,
        }
    }
}

/// A chat or completion request made ready for the engine: how to write its answer, and its
/// choices (each its prompt, settings and most tokens), not yet admitted.
pub(crate) struct Prepared {
    pub(crate) reply: Reply,
    pub(crate) choices: Vec<(Vec<u32>, api::Generation, usize)>,
    pub(crate) stream: bool,
}

/// Reads a /v1/completions or /v1/chat/completions request (`how`): its model and settings
/// checked, the chat template rendered with the tools and the reasoning block, the grammar
/// built, the prompts tokenized and fitted to the context. Other APIs over chat (the
/// Responses API: responses.rs; Anthropic's Messages: anthropic.rs) translate their requests
/// into a chat request's object and come here too.
pub(crate) async fn prepare(
    sh: &Shared,
    m: Arc<ModelInfo>,
    obj: &Map<String, Value>,
    how: Prepare,
) -> Result<Prepared, ApiError> {
    let Prepare {
        chat,
        id_prefix,
        cap_max_tokens,
    } = how;
    let f = Fields(obj);
    if let Some(name) = f.string("model")? {
        if !name.is_empty() && !m.knows(name) {
            return Err(unknown_model(name, &m).with_param("model"));
        }
    }
    // llama-server reads its own fields on its OpenAI endpoints too: its samplers are read here
    // as on /completion (`parse_generation`), and what Muser lacks is refused by name, never
    // silently ignored.
    native::refuse_unsupported(&f)?;
    let mut gen = parse_generation(&f, chat, sh.next_seed(), m.n_vocab)?;
    let n = api::parse_choices(&f, sh.config.parallel)?;
    gen.preserved = constrain::preserved_tokens(&f, &m.tokenizer)?;
    let mut spec = constrain::read(&f, &m.tokenizer, &gen.preserved)?;
    let mut output = None;
    let prompts = if chat {
        // A JSON response format beside tools holds the reply that calls no tool (the calls
        // have their own grammar); a raw or lazy grammar cannot be combined with them.
        let (response, response_source) = tools_response(spec.as_ref(), obj)?;
        if let (Some(_), Format::Atem, Some(source)) = (&response, m.chat_format, response_source) {
            let t = tools::parse_tools(obj)?;
            if t.is_some_and(|t| t.choice == tools::ToolChoice::Auto) {
                let field = source.field();
                return Err(ApiError::param(
                    field,
                    format!(
                        "a JSON {field} together with tools is not supported in the ATEM chat \
                         format (Muse Glimmer's): give tool_choice \"none\", or leave out {field}"
                    ),
                ));
            }
        }
        let (req, tools, plan) = chat_request(&m.template, m.chat_format, obj, response.as_ref())?;
        let format = m.chat_format;
        let calls = reads_calls(tools.as_ref());
        if let (Some(t), Some(_)) = (&tools, &spec) {
            if response.is_none() && t.choice != tools::ToolChoice::None {
                return Err(ApiError::param(
                    "tools",
                    "tools cannot be used with grammar or a lazy grammar (the tool calls have \
                     their own grammar): give one of them, or a JSON response_format or \
                     json_schema for the reply that calls no tool",
                ));
            }
        }
        let reasoning = reasoning_format(&f)?;
        // (ATEM's, harmony's and Gemma 4's readings split their reasoning with or without tools)
        if tools.is_some()
            || (matches!(
                format,
                Format::Atem | Format::Harmony | Format::Gemma4 | Format::KimiK3
            ) && reasoning)
        {
            // The format's markup is output (and triggers on its tokens) even where the
            // vocabulary makes it control tokens, as llama-server preserves it.
            preserve(&mut gen.preserved, &m, format.markup());
            if let Some(plan) = &plan {
                spec = Some(constrain::Spec::tools(plan, gen.preserved.clone()));
            }
            output = Some(Output {
                format,
                tools,
                call_seed: sh.next_id() ^ gen.params.seed.rotate_left(32),
                think: None,
                lead: "",
                past_ids: req
                    .messages
                    .iter()
                    .filter_map(|msg| msg["tool_calls"].as_array())
                    .flatten()
                    .filter_map(|c| c["id"].as_str().map(str::to_string))
                    .collect(),
            });
        }
        let text = m.template.render_request(&req)?;
        let continued = m.template.continued(&req)?;
        // Kimi K3's output is read after the opening of the section its prompt leaves it in.
        let section = kimi3::section_lead(format, &text, continued);
        if let Some(o) = &mut output {
            o.lead = output_lead(format, &text, continued);
        }
        if let (Some(lead), Some(sp)) = (section, &mut spec) {
            around_reply(sp, kimi3::lazy_patterns(lead), |g| {
                kimi3::reply_first(g, lead)
            })?;
        }
        let block = reasoning_block(&m.template, format, &req, &text, reasoning, calls)?;
        if let Some((tags, opened)) = block {
            let o = output.get_or_insert_with(|| Output {
                format,
                tools: None,
                call_seed: 0,
                think: None,
                lead: "",
                past_ids: Default::default(),
            });
            o.think = Some((tags, opened));
            // A lazy call grammar starts only after the reasoning block, never inside it; a
            // grammar of the whole reply made here (forced calls, a JSON response format) lets
            // the block come first. A request's own GBNF applies as given.
            if let Some(sp) = &mut spec {
                let patterns = format.lazy_start().map(|s| tags.after_block(s, opened));
                around_reply(sp, patterns, |g| tags.block_first(g, opened))?;
            }
            preserve(&mut gen.preserved, &m, &[tags.open, tags.close]);
        }
        // gpt-oss writes a reply in a response format as a final message, after its analysis.
        if let (Some(sp), Some(_), Format::Harmony) = (&mut spec, &output, format) {
            if let (constrain::SpecKind::Schema(s, source), None) = (&sp.kind, &sp.lazy) {
                let g = format.reply_grammar(&constrain::schema_grammar(s, *source)?);
                sp.kind = constrain::SpecKind::Made(g, *source);
            }
        }
        // A template that writes BOS itself gets no second one.
        let p = chat_tokens(&m, &text);
        if p.is_empty() {
            return Err(ApiError::param("messages", "the messages have no tokens"));
        }
        vec![p]
    } else {
        api::parse_prompts(f.get("prompt"), &m.tokenizer, m.n_vocab)?
    };
    // Each prompt's choices, as llama-server runs them (choice `p * n + i`: prompt p's i-th).
    let room = sh.config.parallel.saturating_add(sh.max_queue);
    if prompts.len() * n > room {
        return Err(ApiError::param(
            "prompt",
            format!(
                "{} prompts x n = {n} asks for {} choices, more than the server takes at once \
                 ({} slots and {} waiting): send fewer per request",
                prompts.len(),
                prompts.len() * n,
                sh.config.parallel,
                sh.max_queue
            ),
        ));
    }
    gen.grammar = constrain::build(spec, &m).await?;
    let max_tokens = prompts
        .iter()
        .map(|p| match cap_max_tokens {
            true => fit_context(p.len(), None, m.n_ctx)
                .map(|room| gen.max_tokens.map_or(room, |n| n.min(room))),
            false => fit_context(p.len(), gen.max_tokens, m.n_ctx),
        })
        .collect::<Result<Vec<usize>, ApiError>>()?;
    let prompt = &prompts[0];

    // llama-server's `verbose`: the answer also carries `__verbose`, what its own /completion
    // answers for the same generation (the raw generated text in `content`, the prompt, the
    // settings ...).
    let verbose = f
        .boolean("verbose")?
        .unwrap_or(false)
        .then(|| NativeReply::new(m.clone(), native::Native::default(), &gen, prompt));
    let reply = Reply {
        id: format!("{id_prefix}{:016x}", sh.next_id()),
        created: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
        model: m.id.clone(),
        chat,
        logprobs: gen.logprobs.is_some(),
        include_usage: gen.include_usage,
        info: m.clone(),
        output,
        verbose,
        n,
    };
    let stream = gen.stream;
    // The choices: each prompt's n, each with a seed of its own (`api::choice_seed`).
    let choices = prompts
        .into_iter()
        .zip(max_tokens)
        .flat_map(|(p, max)| (0..n).map(move |i| (p.clone(), i, max)))
        .map(|(p, i, max)| {
            let mut g = gen.clone();
            g.params.seed = api::choice_seed(&f, gen.params.seed, i, || sh.next_seed());
            (p, g, max)
        })
        .collect();
    Ok(Prepared {
        reply,
        choices,
        stream,
    })
}

/// Makes a grammar made here wait for what comes before the reply (a reasoning block): a lazy
/// tool-call grammar triggers on `patterns` (where given) instead of its own words, and a
/// grammar of the whole output becomes `first` of it. A request's own GBNF applies as given.
fn around_reply(
    sp: &mut constrain::Spec,
    patterns: Option<Vec<String>>,
    first: impl Fn(&str) -> String,
) -> Result<(), ApiError> {
    use constrain::{Source, SpecKind};
    let tools_plan = matches!(sp.kind, SpecKind::Made(_, Source::Tools));
    match (&mut sp.kind, sp.lazy.is_some()) {
        (_, true) if tools_plan => {
            if let Some(patterns) = patterns {
                sp.lazy = Some(
                    patterns
                        .into_iter()
                        .map(constrain::TriggerSpec::Pattern)
                        .collect(),
                );
            }
        }
        (SpecKind::Made(g, _), false) => *g = first(g),
        (SpecKind::Schema(s, source), false) => {
            let g = constrain::schema_grammar(s, *source)?;
            sp.kind = SpecKind::Made(first(&g), *source);
        }
        _ => {}
    }
    Ok(())
}

/// How to write the answer to one request.
pub(crate) struct Reply {
    pub id: String,
    created: u64,
    pub(crate) model: String,
    chat: bool,
    logprobs: bool,
    include_usage: bool,
    info: Arc<ModelInfo>,
    /// A chat answer read back through its format (tool calls, reasoning); None: plain text.
    output: Option<Output>,
    /// `verbose`: how to write the `__verbose` object of an answer that does not stream.
    verbose: Option<NativeReply>,
    /// The choices of each prompt (`n`): choice `p * n + i` is prompt p's i-th.
    n: usize,
}

/// How a chat answer's text is read: its format, the request's tools, the seed of the ids its
/// tool calls get, and whether reasoning in a block of tags comes first (Some: the template's
/// tags, and whether the prompt opened the block).
#[derive(Clone)]
pub(crate) struct Output {
    format: Format,
    tools: Option<ToolRequest>,
    call_seed: u64,
    think: Option<(think::Tags, bool)>,
    /// Text the format reads before the output: the header of a message the prompt opened
    /// (gpt-oss's continued analysis or final message, `Format::continued_header`), so that
    /// the output is read as that message's body; "" for others.
    lead: &'static str,
    /// The ids of the calls in the request's messages: a model that copies one (Mistral's
    /// write their ids) gets a new one, so that a client never sees an id twice.
    past_ids: std::collections::HashSet<String>,
}

impl Output {
    /// A reading of `format` with `tools` and a reasoning block first or not (for other
    /// modules' tests).
    #[cfg(test)]
    pub(crate) fn for_test(
        format: Format,
        tools: Option<ToolRequest>,
        think: Option<(think::Tags, bool)>,
    ) -> Output {
        Output {
            format,
            tools,
            call_seed: 1,
            think,
            lead: "",
            past_ids: Default::default(),
        }
    }

    /// The text the format reads: `lead`, then the output.
    fn led<'t>(&self, text: &'t str) -> std::borrow::Cow<'t, str> {
        if self.lead.is_empty() {
            text.into()
        } else {
            format!("{}{text}", self.lead).into()
        }
    }

    fn parse(&self, text: &str) -> Parsed {
        let led = self.led(text);
        let text: &str = &led;
        let Some((tags, opened)) = self.think else {
            return self.format.parse(text, self.tools.as_ref());
        };
        let (reasoning, rest) = tags.split(text, opened);
        let mut p = self.format.parse(rest, self.tools.as_ref());
        p.reasoning = joined(reasoning, p.reasoning);
        p
    }

    /// What streaming may send of an unfinished answer (`Format::parse_partial` of the reply
    /// after the reasoning).
    fn parse_partial(&self, text: &str) -> Parsed {
        self.read_on(text, &mut Settled::default())
    }

    /// `parse_partial` of `text`, an answer streamed so far, read on from what the readings
    /// before settled in `s` (`text` starts with the text they read): the reasoning block once
    /// it is closed and its reply has begun (neither changes after that), and what the
    /// format's reading settled of the reply (`Format::parse_partial_on`), kept while the reply
    /// starts where it did (a reply of whitespace so far moves on as it grows).
    pub(crate) fn read_on(&self, text: &str, s: &mut Settled) -> Parsed {
        let led = self.led(text);
        let text: &str = &led;
        let (reasoning, reply) = match (self.think, &s.split) {
            (None, _) => (None, Some(text)),
            (Some(_), Some((reasoning, at))) => (reasoning.clone(), Some(&text[*at..])),
            (Some((tags, opened)), None) => {
                let (reasoning, reply) = tags.split_partial(text, opened);
                if let Some(r) = reply.filter(|r| !r.is_empty()) {
                    // (a reply that has begun starts at a character that is not whitespace)
                    s.split = Some((reasoning.clone(), text.len() - r.len()));
                }
                (reasoning, reply)
            }
        };
        let mut p = reply.map_or_else(Parsed::default, |r| {
            let at = text.len() - r.len();
            if at != s.reply_at {
                s.reply_at = at;
                s.resume = Resume::default();
            }
            let tools = self.tools.as_ref();
            self.format.parse_partial_on(r, tools, &mut s.resume)
        });
        p.reasoning = joined(reasoning, p.reasoning);
        p
    }

    /// A finished answer's reading: `parse`'s, unless the output ended or broke inside a call
    /// (then the calls as streaming read them: `Parsed::settle`), so that a streamed answer and
    /// the same answer whole agree; and whether it is `parse`'s (its calls whole: only then is
    /// the finish reason `tool_calls`).
    pub(crate) fn parse_final(&self, text: &str) -> (Parsed, bool) {
        Parsed::settle(self.parse(text), self.parse_partial(text))
    }

    /// Checks streaming `text` as `sse_stream` reads it, a prefix a character longer each
    /// time: the content and the reasoning only grow, the calls only go on, and the final
    /// reading `fin` goes on from the last prefix's. Says where that fails.
    fn check_stream(&self, text: &str, fin: &Parsed) -> Result<(), String> {
        let mut settled = Settled::default();
        let mut sent = Parsed::default();
        let ends = text.char_indices().map(|(i, _)| i).skip(1);
        for at in ends.chain([text.len()]) {
            let part = self.read_on(&text[..at], &mut settled);
            let reasoning = |p: &Parsed| p.reasoning.clone().unwrap_or_default();
            let grows = part.content.starts_with(&sent.content)
                && reasoning(&part).starts_with(&reasoning(&sent))
                && part.continues(&sent);
            if !grows {
                return Err(format!("at {:?}: {part:?} after {sent:?}", &text[..at]));
            }
            sent = part;
        }
        let ends = fin.content.starts_with(&sent.content)
            && fin
                .reasoning
                .clone()
                .unwrap_or_default()
                .starts_with(sent.reasoning.as_deref().unwrap_or(""))
            && fin.continues(&sent);
        match ends {
            true => Ok(()),
            false => Err(format!("final {fin:?} after streaming {sent:?}")),
        }
    }

    /// OpenAI's `tool_calls` entries of a whole answer.
    fn calls(&self, p: &Parsed) -> Vec<Value> {
        let mut ids = Ids::new(self);
        p.tool_calls
            .iter()
            .enumerate()
            .map(|(i, c)| {
                json!({
                    "id": ids.next(i, c),
                    "type": "function",
                    "function": {"name": c.name, "arguments": c.arguments},
                })
            })
            .collect()
    }
}

/// The reasoning of the block that starts an answer, then the reasoning its format reads in the
/// reply (Gemma 4's later thought channels).
fn joined(first: Option<String>, then: Option<String>) -> Option<String> {
    match (first, then) {
        (Some(a), Some(b)) => Some(a + &b),
        (a, b) => a.or(b),
    }
}

/// What `Output::read_on`'s readings of one streamed answer settled.
#[derive(Default)]
pub(crate) struct Settled {
    /// The reasoning (None: no block) and where the reply after it starts in `text`, once both
    /// are final (`think::split_partial` gives the same for all that follows).
    split: Option<(Option<String>, usize)>,
    /// Where the reply read by the format starts in `text`, and what its readings settled.
    reply_at: usize,
    resume: Resume,
}

/// Hands out the ids of an answer's calls, in order. A call gets the id its model wrote unless
/// an earlier call of the answer or of the conversation has it (a client tells the results
/// apart by id); otherwise one made from the request's seed and the call's index, or, when
/// that one is taken too, from indices no call has. The same calls in the same order get the
/// same ids, streamed or whole.
pub(crate) struct Ids {
    format: Format,
    seed: u64,
    seen: std::collections::HashSet<String>,
    spare: usize,
}

impl Ids {
    pub(crate) fn new(o: &Output) -> Ids {
        Ids {
            format: o.format,
            seed: o.call_seed,
            seen: o.past_ids.clone(),
            spare: 1 << 16,
        }
    }

    /// The id of call `i`.
    fn next(&mut self, i: usize, c: &ToolCall) -> String {
        let mut id = match &c.id {
            Some(id) if !self.seen.contains(id) => id.clone(),
            _ => self.format.call_id(self.seed, i),
        };
        while self.seen.contains(&id) {
            id = self.format.call_id(self.seed, self.spare);
            self.spare += 1;
        }
        self.seen.insert(id.clone());
        id
    }
}

/// llama-server's `reasoning_format`: whether a chat answer's reasoning (`<think>` or
/// `[THINK]` blocks, Muse Glimmer's `to=self` messages) is split into `reasoning_content`
/// ("auto", the default, and "deepseek") or left in the content ("none").
fn reasoning_format(f: &Fields) -> Result<bool, ApiError> {
    match f.string("reasoning_format")? {
        None | Some("auto") | Some("deepseek") => Ok(true),
        Some("none") => Ok(false),
        Some(other) => Err(ApiError::param(
            "reasoning_format",
            format!("reasoning_format must be \"auto\", \"deepseek\" or \"none\", got {other:?}"),
        )),
    }
}

/// Adds to the (sorted) preserved tokens each of `texts` that is one token in the vocabulary.
fn preserve(preserved: &mut Vec<u32>, m: &ModelInfo, texts: &[&str]) {
    preserved.extend(
        texts
            .iter()
            .filter_map(|t| constrain::one_token(&m.tokenizer, t)),
    );
    preserved.sort_unstable();
    preserved.dedup();
}

fn piece(m: &ModelInfo, id: u32) -> String {
    String::from_utf8_lossy(m.piece_bytes(id)).into_owned()
}

/// A completion's `logprobs` object for tokens given as (id, logprob if any, text offset): a
/// token without one (an echoed prompt's first) has null for its logprob and alternatives.
fn completion_logprobs<'a>(
    m: &ModelInfo,
    entries: impl Iterator<Item = (u32, Option<&'a Logprob>, usize)>,
) -> Value {
    let (mut tokens, mut token_logprobs, mut top, mut offsets) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for (id, l, o) in entries {
        tokens.push(piece(m, id));
        token_logprobs.push(l.map_or(Value::Null, |l| json!(l.logprob)));
        top.push(l.map_or(Value::Null, |l| {
            let alts: Map<String, Value> = l
                .top
                .iter()
                .map(|&(id, lp)| (piece(m, id), json!(lp)))
                .collect();
            Value::Object(alts)
        }));
        offsets.push(o);
    }
    json!({
        "tokens": tokens,
        "token_logprobs": token_logprobs,
        "top_logprobs": top,
        "text_offset": offsets,
    })
}

/// llama-server's `timings` of a request: the prompt positions computed (`prompt_n`, those
/// reused from the slot's cache are `cache_n`) and the tokens generated (`predicted_n`), each
/// with its milliseconds, per token and per second (null where a count or a time is zero).
pub(crate) fn timings(f: &Finish) -> Value {
    let per = |n: usize, ms: f64| {
        let ok = n > 0 && ms > 0.0;
        (ok.then(|| ms / n as f64), ok.then(|| n as f64 * 1e3 / ms))
    };
    let prompt_n = f.prompt_tokens - f.cached_tokens;
    let (ppt, pps) = per(prompt_n, f.prompt_ms);
    let (gpt, gps) = per(f.completion_tokens, f.predicted_ms);
    json!({
        "cache_n": f.cached_tokens,
        "prompt_n": prompt_n,
        "prompt_ms": f.prompt_ms,
        "prompt_per_token_ms": ppt,
        "prompt_per_second": pps,
        "predicted_n": f.completion_tokens,
        "predicted_ms": f.predicted_ms,
        "predicted_per_token_ms": gpt,
        "predicted_per_second": gps,
    })
}

/// The usage of a request's choices (each one's `Finish`; `n` choices a prompt), as OpenAI
/// counts it: each prompt once (its first choice's count, cached tokens included), the
/// completion tokens of all.
fn usage(fs: &[&Finish], n: usize) -> Value {
    let firsts = || fs.iter().step_by(n.max(1));
    let prompt: usize = firsts().map(|f| f.prompt_tokens).sum();
    let cached: usize = firsts().map(|f| f.cached_tokens).sum();
    let completion: usize = fs.iter().map(|f| f.completion_tokens).sum();
    json!({
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": { "cached_tokens": cached },
    })
}

/// One choice's answer as the engine gave it: its text, generated tokens, logprobs with the
/// offsets of their text, and how it ended.
struct Answer {
    text: String,
    ids: Vec<u32>,
    lps: Vec<Logprob>,
    offsets: Vec<usize>,
    finish: Finish,
    /// The prompt the answer starts with (`echo`).
    echo: Option<Echo>,
}

impl Reply {
    /// How choice `i`'s text is read: the request's `output`, whose call ids for choice i > 0
    /// come from a seed of their own (no id is given twice in one answer).
    pub(crate) fn output_of(&self, i: usize) -> Option<Output> {
        self.output.as_ref().map(|o| Output {
            call_seed: o.call_seed ^ (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15),
            ..o.clone()
        })
    }

    /// `logprobs` of a choice for these tokens; `offsets[i]` is the byte length of the text
    /// released before token i (the same figure whether the answer streams or not).
    fn logprobs(&self, lps: &[Logprob], offsets: &[usize]) -> Value {
        if !self.logprobs {
            return Value::Null;
        }
        let m = &self.info;
        if self.chat {
            let entry = |id: u32, lp: f32| native::token_entry(m, id, lp);
            let content: Vec<Value> = lps
                .iter()
                .map(|l| {
                    let mut e = entry(l.id, l.logprob);
                    e["top_logprobs"] = l.top.iter().map(|&(id, lp)| entry(id, lp)).collect();
                    e
                })
                .collect();
            json!({ "content": content })
        } else {
            let entries = lps.iter().zip(offsets).map(|(l, &o)| (l.id, Some(l), o));
            completion_logprobs(m, entries)
        }
    }

    /// A completion's `logprobs` for its echoed prompt `e` and the generated tokens after it
    /// (their offsets counted from the end of the prompt's text); null unless asked for.
    fn echo_logprobs(&self, e: &Echo, lps: &[Logprob], offsets: &[usize]) -> Value {
        if !self.logprobs {
            return Value::Null;
        }
        let prompt = e
            .ids
            .iter()
            .zip(&e.offsets)
            .enumerate()
            .map(|(k, (&id, &o))| {
                let lp = e.lps.as_ref().and_then(|l| l.get(k)?.as_ref());
                (id, lp, o)
            });
        let shift = e.text.len();
        let generated = lps
            .iter()
            .zip(offsets)
            .map(|(l, &o)| (l.id, Some(l), o + shift));
        completion_logprobs(&self.info, prompt.chain(generated))
    }

    fn object(&self, stream: bool) -> &'static str {
        match (self.chat, stream) {
            (true, true) => "chat.completion.chunk",
            (true, false) => "chat.completion",
            (false, _) => "text_completion",
        }
    }

    fn envelope(&self, stream: bool, choices: Value) -> Value {
        json!({
            "id": self.id,
            "object": self.object(stream),
            "created": self.created,
            "model": self.model,
            "system_fingerprint": "muser",
            "choices": choices,
        })
    }

    /// One streamed chunk of choice `index`: text, the token's logprobs, or the finish reason.
    fn chunk(
        &self,
        index: usize,
        text: Option<&str>,
        lps: &[Logprob],
        offset: usize,
        finish: Option<&str>,
        role: bool,
    ) -> Value {
        let mut delta = Map::new();
        if let Some(t) = text {
            delta.insert("content".into(), json!(t));
        }
        self.delta_chunk(index, delta, lps, offset, finish, role)
    }

    /// A streamed chunk of choice `index` with `delta` (chat; a completion's chunk takes its
    /// `content` as text).
    fn delta_chunk(
        &self,
        index: usize,
        mut delta: Map<String, Value>,
        lps: &[Logprob],
        offset: usize,
        finish: Option<&str>,
        role: bool,
    ) -> Value {
        let mut choice = json!({
            "index": index,
            "logprobs": if lps.is_empty() {
                Value::Null
            } else {
                self.logprobs(lps, &vec![offset; lps.len()])
            },
            "finish_reason": finish,
        });
        if self.chat {
            if role {
                let mut d = Map::new();
                d.insert("role".into(), json!("assistant"));
                d.extend(delta);
                delta = d;
            }
            choice["delta"] = Value::Object(delta);
        } else {
            choice["text"] = delta.remove("content").unwrap_or(json!(""));
        }
        let mut v = self.envelope(true, json!([choice]));
        if self.include_usage {
            // OpenAI: with include_usage every chunk carries `usage`, null until the last.
            v["usage"] = Value::Null;
        }
        v
    }

    /// Choice `index` of the whole answer.
    fn choice(&self, index: usize, a: &Answer) -> Value {
        let f = &a.finish;
        let mut choice = json!({
            "index": index,
            "logprobs": self.logprobs(&a.lps, &a.offsets),
            "finish_reason": f.reason.as_str(),
        });
        if let (true, Some(o)) = (self.chat, &self.output_of(index)) {
            let (p, whole) = o.parse_final(&a.text);
            let mut msg = json!({"role": "assistant", "content": p.content});
            if p.content.is_empty() && !p.tool_calls.is_empty() {
                msg["content"] = Value::Null;
            }
            if let Some(r) = &p.reasoning {
                msg["reasoning_content"] = json!(r);
            }
            if !p.tool_calls.is_empty() {
                msg["tool_calls"] = json!(o.calls(&p));
                // A reply cut by max_tokens or the context still says "length", and one whose
                // last call was cut (a stop string) or broke says "stop".
                if whole && f.reason == FinishReason::Stop {
                    choice["finish_reason"] = json!("tool_calls");
                }
            }
            choice["message"] = msg;
        } else if self.chat {
            choice["message"] = json!({"role": "assistant", "content": a.text});
        } else if let Some(e) = &a.echo {
            choice["text"] = json!(format!("{}{}", e.text, a.text));
            choice["logprobs"] = self.echo_logprobs(e, &a.lps, &a.offsets);
        } else {
            choice["text"] = json!(a.text);
        }
        choice
    }

    /// The whole answer: its choices, the usage of all, and the first choice's `timings` and
    /// `__verbose` (llama-server's answer with several choices is its first one's, with the
    /// others' choices added).
    fn complete(&self, answers: &[Answer]) -> Value {
        let choices: Vec<Value> = answers
            .iter()
            .enumerate()
            .map(|(i, a)| self.choice(i, a))
            .collect();
        let mut v = self.envelope(false, Value::Array(choices));
        v["usage"] = usage(
            &answers.iter().map(|a| &a.finish).collect::<Vec<_>>(),
            self.n,
        );
        if let Some(a) = answers.first() {
            v["timings"] = timings(&a.finish);
            if let Some(n) = &self.verbose {
                let text = &a.text;
                v["__verbose"] =
                    n.last(text, text.contains('\n'), &a.ids, &a.lps, &a.finish, false);
            }
        }
        v
    }
}

/// The answers of a request's choices, gathered side by side: the first error ends them all
/// (the others' receivers dropped, the engine ends them).
async fn collect(reply: Reply, rxs: Vec<UnboundedReceiver<Event>>) -> Result<Value, ApiError> {
    let answers = futures_util::future::try_join_all(rxs.into_iter().map(answer)).await?;
    Ok(reply.complete(&answers))
}

/// One choice's answer, once its events end.
async fn answer(mut rx: UnboundedReceiver<Event>) -> Result<Answer, ApiError> {
    let mut text = String::new();
    let (mut ids, mut lps, mut echo) = (Vec::new(), Vec::new(), None);
    while let Some(ev) = rx.recv().await {
        match ev {
            Event::Prompt(e) => echo = Some(e),
            Event::Token {
                id,
                text: t,
                logprob,
                offset,
                ..
            } => {
                ids.extend(id);
                lps.extend(logprob.map(|l| (l, offset)));
                text.push_str(&t);
            }
            Event::Done(f) => {
                let mut offsets: Vec<usize> = lps.iter().map(|&(_, o)| o).collect();
                let lps = crate::scheduler::before_stop(lps, &text, &f);
                offsets.truncate(lps.len());
                return Ok(Answer {
                    text,
                    ids,
                    lps,
                    offsets,
                    finish: f,
                    echo,
                });
            }
            Event::Error(e) => return Err(e),
        }
    }
    Err(ApiError::internal(
        "the engine stopped before the answer was complete",
    ))
}

/// What `now` adds to the content and reasoning already `sent` (as a chunk's delta), which
/// `sent` then becomes. A format's partial reads only grow, so the new text is the tail; a
/// read that is not an extension of what was sent (which the formats rule out) sends nothing
/// rather than text twice.
pub(crate) fn news(sent: &mut Parsed, ids: &mut Option<Ids>, now: Parsed) -> Map<String, Value> {
    let mut delta = Map::new();
    let sent_reasoning = sent.reasoning.as_deref().unwrap_or("");
    if let Some(r) = &now.reasoning {
        if r.len() > sent_reasoning.len() && r.starts_with(sent_reasoning) {
            delta.insert(
                "reasoning_content".into(),
                json!(&r[sent_reasoning.len()..]),
            );
            sent.reasoning = Some(r.clone());
        }
    }
    if now.content.len() > sent.content.len() && now.content.starts_with(&sent.content) {
        delta.insert("content".into(), json!(&now.content[sent.content.len()..]));
        sent.content = now.content;
    }
    let calls = call_news(&mut sent.tool_calls, ids, now.tool_calls);
    if !calls.is_empty() {
        delta.insert("tool_calls".into(), Value::Array(calls));
    }
    delta
}

/// OpenAI's streamed `tool_calls` entries that bring the calls `sent` up to `now`: a call new
/// in `now` with its index, id, type, name and its arguments so far; a call sent before with
/// the text its arguments gained. A call `now` does not continue is left as it was sent
/// (streaming's readings never take back, so this does not happen).
fn call_news(sent: &mut Vec<ToolCall>, ids: &mut Option<Ids>, now: Vec<ToolCall>) -> Vec<Value> {
    let mut out = Vec::new();
    for (i, c) in now.into_iter().enumerate() {
        match sent.get_mut(i) {
            Some(s) => {
                if s.name == c.name
                    && s.id == c.id
                    && c.arguments.len() > s.arguments.len()
                    && c.arguments.starts_with(&s.arguments)
                {
                    out.push(json!({
                        "index": i,
                        "function": {"arguments": &c.arguments[s.arguments.len()..]},
                    }));
                    s.arguments = c.arguments;
                }
            }
            None => {
                let Some(ids) = ids.as_mut() else { break };
                out.push(json!({
                    "index": i,
                    "id": ids.next(i, &c),
                    "type": "function",
                    "function": {"name": c.name, "arguments": c.arguments},
                }));
                sent.push(c);
            }
        }
    }
    out
}

/// One piece of a streamed answer, as `chunks` gives them.
pub(crate) enum Chunk {
    /// A chunk as OpenAI streams it.
    Data(Value),
    /// The last chunk of a choice (its finish reason and `timings`), and how it ended.
    End(Value, Finish),
    /// The error that ends the stream.
    Error(ApiError),
    /// Every choice has ended (`[DONE]`).
    Done,
}

/// Server-sent events: `chunks` as OpenAI streams them, ending in `data: [DONE]` (or an
/// error's object).
fn sse_stream(
    reply: Reply,
    rxs: Vec<UnboundedReceiver<Event>>,
) -> impl Stream<Item = Result<SseEvent, Infallible>> {
    chunks(reply, rxs).map(|c| {
        Ok(match c {
            Chunk::Data(v) | Chunk::End(v, _) => SseEvent::default().data(v.to_string()),
            Chunk::Error(e) => SseEvent::default().data(e.body().to_string()),
            Chunk::Done => SseEvent::default().data("[DONE]"),
        })
    })
}

/// A streamed answer: for each choice, a chunk per token (text and logprobs) and a chunk with
/// the finish reason (and llama-server's `timings`), the choices' chunks as their tokens come;
/// once every choice has ended, the usage chunk if asked for, then `Done`. Dropping the
/// stream (the client went away) drops the receivers, which the engine notices at its next
/// step; an error ends the stream (and the other choices).
pub(crate) fn chunks(
    reply: Reply,
    rxs: Vec<UnboundedReceiver<Event>>,
) -> impl Stream<Item = Chunk> {
    /// One choice as it streams: with an `output` format, the text so far (it only grows) and
    /// what its readings settled, how much of its content and reasoning has been sent, and
    /// the ids of the calls sent; its finish once it has ended.
    struct Choice {
        output: Option<Output>,
        text: String,
        settled: Settled,
        sent: Parsed,
        ids: Option<Ids>,
        finish: Option<Finish>,
        /// The bytes of its echoed prompt, which its tokens' offsets count from.
        shift: usize,
    }
    struct St<S> {
        reply: Reply,
        events: S,
        choices: Vec<Choice>,
        first: bool,
        ended: bool,
    }
    let data = Chunk::Data;
    let choices = (0..rxs.len())
        .map(|i| {
            let output = reply.output_of(i);
            Choice {
                ids: output.as_ref().map(Ids::new),
                output,
                text: String::new(),
                settled: Settled::default(),
                sent: Parsed::default(),
                finish: None,
                shift: 0,
            }
        })
        .collect();
    // each choice's events, tagged with its index, and None once its receiver closes
    let events = stream::select_all(rxs.into_iter().enumerate().map(|(i, rx)| {
        Box::pin(stream::unfold(Some(rx), move |rx| async move {
            let mut rx = rx?;
            match rx.recv().await {
                Some(ev) => Some(((i, Some(ev)), Some(rx))),
                None => Some(((i, None), None)),
            }
        }))
    }));
    let st = St {
        reply,
        events,
        choices,
        first: true,
        ended: false,
    };
    stream::unfold(st, move |mut st| async move {
        if st.ended {
            return None;
        }
        let mut out = Vec::new();
        let r = &st.reply;
        if st.first && r.chat {
            for i in 0..st.choices.len() {
                out.push(data(r.chunk(i, Some(""), &[], 0, None, true)));
            }
        }
        st.first = false;
        let Some((i, ev)) = st.events.next().await else {
            // (every choice's events have ended: after their Done, which ends the stream)
            out.push(Chunk::Error(ApiError::internal(
                "the engine stopped before the answer was complete",
            )));
            st.ended = true;
            return Some((stream::iter(out), st));
        };
        let c = &mut st.choices[i];
        match ev {
            Some(Event::Prompt(e)) => {
                // (completions only: the prompt's text and logprobs as the first chunk)
                let mut v = r.chunk(i, Some(&e.text), &[], 0, None, false);
                v["choices"][0]["logprobs"] = r.echo_logprobs(&e, &[], &[]);
                out.push(data(v));
                c.shift = e.text.len();
            }
            Some(Event::Token {
                text,
                logprob,
                offset,
                ..
            }) => {
                let offset = offset + c.shift;
                let lps: Vec<Logprob> = logprob.into_iter().collect();
                if let Some(o) = &c.output {
                    c.text.push_str(&text);
                    let now = o.read_on(&c.text, &mut c.settled);
                    let delta = news(&mut c.sent, &mut c.ids, now);
                    if !delta.is_empty() || !lps.is_empty() {
                        out.push(data(r.delta_chunk(i, delta, &lps, offset, None, false)));
                    }
                } else if !text.is_empty() || !lps.is_empty() {
                    out.push(data(r.chunk(i, Some(&text), &lps, offset, None, false)));
                }
            }
            Some(Event::Done(f)) => {
                let mut reason = f.reason.as_str();
                if let Some(o) = &c.output {
                    // The whole answer read at last: what its content, reasoning and calls
                    // gained since the last token.
                    let (p, whole) = o.parse_final(&c.text);
                    let has_calls = whole && !p.tool_calls.is_empty();
                    let delta = news(&mut c.sent, &mut c.ids, p);
                    if !delta.is_empty() {
                        out.push(data(r.delta_chunk(i, delta, &[], 0, None, false)));
                    }
                    if has_calls && f.reason == FinishReason::Stop {
                        reason = "tool_calls";
                    }
                }
                let mut last = r.chunk(i, None, &[], 0, Some(reason), false);
                last["timings"] = timings(&f);
                out.push(Chunk::End(last, f.clone()));
                c.finish = Some(f);
                if st.choices.iter().all(|c| c.finish.is_some()) {
                    if r.include_usage {
                        let fs: Vec<&Finish> = st.choices.iter().flat_map(|c| &c.finish).collect();
                        let mut u = r.envelope(true, json!([]));
                        u["usage"] = usage(&fs, r.n);
                        out.push(data(u));
                    }
                    out.push(Chunk::Done);
                    st.ended = true;
                }
            }
            Some(Event::Error(e)) => {
                out.push(Chunk::Error(e));
                st.ended = true;
            }
            // a choice's events end after its Done
            None if c.finish.is_some() => {}
            None => {
                out.push(Chunk::Error(ApiError::internal(
                    "the engine stopped before the answer was complete",
                )));
                st.ended = true;
            }
        }
        Some((stream::iter(out), st))
    })
    .flatten()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tools::test_util::{layouts, random_calls, random_req, req, tool, Rng, FORMATS};
    use crate::tools::ToolChoice;

    /// `enable_thinking` is the template's (true where it writes reasoning tags) unless the
    /// request's kwargs set it; `reasoning_effort` "none" turns it off whatever they set, other
    /// efforts reach the template; wrong types are 400s naming the field.
    #[test]
    fn thinking_variables_follow_the_template_and_the_request() {
        let mut rng = Rng(0x7417_3E55);
        for round in 0..64 {
            let reasons = rng.coin();
            let mut obj = Map::new();
            obj.insert(
                "messages".into(),
                json!([{"role": "user", "content": "hi"}]),
            );
            let asked = [None, Some(true), Some(false)][rng.below(3)];
            if let Some(b) = asked {
                obj.insert("chat_template_kwargs".into(), json!({"enable_thinking": b}));
            }
            let effort = [None, Some("none"), Some("low"), Some("high")][rng.below(4)];
            if let Some(e) = effort {
                obj.insert("reasoning_effort".into(), json!(e));
            }
            let mut req = ChatRequest::parse(&obj).unwrap();
            thinking_variables(&mut req, reasons, &obj).unwrap();
            let want = effort != Some("none") && asked.unwrap_or(reasons);
            assert_eq!(req.kwargs["enable_thinking"], json!(want), "round {round}");
            let passed = effort.filter(|e| *e != "none").map(Value::from);
            assert_eq!(req.kwargs.get("reasoning_effort").cloned(), passed);
            assert_eq!(req.kwargs.get("reasoning_strength").cloned(), passed);
        }
        // An empty effort: OpenAI's field leaves the template's (a chat_template_kwargs one)
        // as it is, as llama-server does; the template's own, empty, is passed on as
        // `reasoning_strength` too, as llama-server passes any string effort.
        for round in 0..64 {
            let own = [None, Some(""), Some("medium")][rng.below(3)];
            let top = [None, Some(""), Some("low")][rng.below(3)];
            let mut obj = json!({"messages": [{"role": "user", "content": "hi"}]});
            if let Some(o) = own {
                obj["chat_template_kwargs"] = json!({"reasoning_effort": o});
            }
            if let Some(t) = top {
                obj["reasoning_effort"] = json!(t);
            }
            let obj = obj.as_object().unwrap();
            let mut req = ChatRequest::parse(obj).unwrap();
            thinking_variables(&mut req, rng.coin(), obj).unwrap();
            let want = top.filter(|t| !t.is_empty()).or(own).map(Value::from);
            let k = &req.kwargs;
            assert_eq!(
                k.get("reasoning_effort"),
                want.as_ref(),
                "round {round} {obj:?}"
            );
            assert_eq!(
                k.get("reasoning_strength"),
                want.as_ref(),
                "round {round} {obj:?}"
            );
        }
        // Past reasoning is kept unless the request says otherwise, under each name templates
        // give it; a name the request sets keeps the request's value.
        for round in 0..64 {
            let mut kwargs = Map::new();
            let keep = [None, Some(true), Some(false)][rng.below(3)];
            if let Some(k) = keep {
                kwargs.insert("preserve_reasoning".into(), json!(k));
            }
            let own = rng.coin().then(|| rng.coin());
            if let Some(o) = own {
                kwargs.insert("clear_thinking".into(), json!(o));
            }
            let obj = json!({"messages": [{"role": "user", "content": "hi"}],
                             "chat_template_kwargs": kwargs});
            let obj = obj.as_object().unwrap();
            let mut req = ChatRequest::parse(obj).unwrap();
            thinking_variables(&mut req, rng.coin(), obj).unwrap();
            let keep = keep.unwrap_or(true);
            let k = &req.kwargs;
            assert_eq!(k["preserve_reasoning"], json!(keep), "round {round}");
            assert_eq!(k["preserve_thinking"], json!(keep), "round {round}");
            assert_eq!(
                k["clear_thinking"],
                json!(own.unwrap_or(!keep)),
                "round {round}"
            );
            for name in ["truncate_history_thinking", "drop_thinking"] {
                assert_eq!(k[name], json!(!keep), "round {round}: {name}");
            }
        }
        for (field, bad) in [
            ("chat_template_kwargs", json!({"enable_thinking": "true"})),
            ("reasoning_effort", json!(3)),
        ] {
            let mut obj = Map::new();
            obj.insert(
                "messages".into(),
                json!([{"role": "user", "content": "hi"}]),
            );
            obj.insert(field.into(), bad);
            let mut req = ChatRequest::parse(&obj).unwrap();
            let e = thinking_variables(&mut req, true, &obj).unwrap_err();
            assert!(format!("{e:?}").contains(field), "{e:?}");
        }
    }

    /// What a client rebuilds from a stream's deltas: content, reasoning, and each call's id,
    /// name and arguments (its entries' texts joined, by index).
    #[derive(Debug, Default, PartialEq)]
    struct Rebuilt {
        content: String,
        reasoning: String,
        calls: Vec<(String, String, String)>,
    }

    impl Rebuilt {
        fn take(&mut self, delta: &Map<String, Value>) {
            let text = |k: &str| {
                delta
                    .get(k)
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .to_string()
            };
            self.content += &text("content");
            self.reasoning += &text("reasoning_content");
            for c in delta
                .get("tool_calls")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
            {
                let i = c["index"].as_u64().unwrap() as usize;
                let args = c["function"]["arguments"].as_str().unwrap();
                if i == self.calls.len() {
                    let id = c["id"].as_str().unwrap().to_string();
                    let name = c["function"]["name"].as_str().unwrap().to_string();
                    assert_eq!(c["type"], "function");
                    self.calls.push((id, name, args.to_string()));
                } else {
                    assert!(c.get("id").is_none() && c["function"].get("name").is_none());
                    self.calls[i].2 += args;
                }
            }
        }

        /// What a whole answer gives.
        fn whole(o: &Output, text: &str) -> Rebuilt {
            let (p, _) = o.parse_final(text);
            let calls = o
                .calls(&p)
                .iter()
                .map(|c| {
                    let s = |v: &Value| v.as_str().unwrap().to_string();
                    (
                        s(&c["id"]),
                        s(&c["function"]["name"]),
                        s(&c["function"]["arguments"]),
                    )
                })
                .collect();
            Rebuilt {
                content: p.content,
                reasoning: p.reasoning.unwrap_or_default(),
                calls,
            }
        }
    }

    /// Streams `text` through `o` in random pieces as `sse_stream` does (a reading on after
    /// each piece, which must be the reading of the whole text so far, and the final reading
    /// at the end) and rebuilds what the client gets.
    fn replay(o: &Output, text: &str, rng: &mut Rng) -> Rebuilt {
        let mut sent = Parsed::default();
        let mut ids = Some(Ids::new(o));
        let mut got = Rebuilt::default();
        let mut settled = Settled::default();
        for at in crate::tools::test_util::piece_ends(rng, text, 6) {
            let now = o.read_on(&text[..at], &mut settled);
            assert_eq!(now, o.parse_partial(&text[..at]), "{:?}", &text[..at]);
            got.take(&news(&mut sent, &mut ids, now));
        }
        got.take(&news(&mut sent, &mut ids, o.parse_final(text).0));
        got
    }

    /// Checks the answer `text` that writes `calls`: read whole, it gives back their names and
    /// arguments; streamed, whole or cut anywhere (8 times), it adds up to what the same text
    /// gives whole. Returns how many calls the cut answers hold.
    fn check_calls_streamed(
        o: &Output,
        text: &str,
        calls: &[(&crate::tools::Tool, Value)],
        rng: &mut Rng,
    ) -> usize {
        let whole = Rebuilt::whole(o, text);
        assert_eq!(whole.calls.len(), calls.len(), "{text}");
        for ((_, name, args), (t, a)) in whole.calls.iter().zip(calls) {
            assert_eq!(name, &t.name);
            assert_eq!(&serde_json::from_str::<Value>(args).unwrap(), a);
        }
        assert_eq!(replay(o, text, rng), whole, "{text}");
        let mut cut_calls = 0;
        for _ in 0..8 {
            let mut cut = rng.below(text.len() + 1);
            while !text.is_char_boundary(cut) {
                cut -= 1;
            }
            let part = &text[..cut];
            let whole = Rebuilt::whole(o, part);
            cut_calls += whole.calls.len();
            assert_eq!(replay(o, part, rng), whole, "{part}");
        }
        cut_calls
    }

    /// Random calls of random tools in the Hermes format, with reasoning before them or not,
    /// whole and cut anywhere (`max_tokens`): the client rebuilds from the stream's deltas
    /// exactly the answer it would get whole (content, reasoning, ids, names, arguments), and
    /// the arguments of a whole output's calls are their JSON.
    #[test]
    fn streamed_calls_rebuild_the_whole_answer() {
        let mut rng = Rng(0x5EED_57EA);
        let mut cut_calls = 0;
        for round in 0..120 {
            let r = random_req(&mut rng, round, round % 2 == 0);
            // Either pair of reasoning tags, the block opened by the prompt or not, or none.
            let tags = [think::THINK, think::BRACKETS][round / 3 % 2];
            let block = [None, Some((tags, true)), Some((tags, false))][round % 3];
            let o = Output {
                format: Format::Hermes,
                tools: Some(r.clone()),
                call_seed: rng.next(),
                think: block,
                lead: "",
                past_ids: Default::default(),
            };
            let calls = random_calls(&mut rng, &r);
            let mut text = match block {
                None => String::new(),
                Some((t, true)) => format!("Weighing <tool_call> it.\n{}\n\n", t.close),
                Some((t, false)) => format!("{}Weighing it.{}\n\n", t.open, t.close),
            };
            text += ["", "Let me check.\n"][rng.below(2)];
            for (t, a) in &calls {
                let l = layouts(&json!({"name": t.name, "arguments": a}));
                text += &format!("<tool_call>\n{}\n</tool_call>\n", l[rng.below(l.len())]);
            }
            assert!(o.parse_final(&text).1, "{text}");
            cut_calls += check_calls_streamed(&o, &text, &calls, &mut rng);
        }
        assert!(cut_calls > 100, "{cut_calls}");
    }

    /// Every format's random outputs (text, then random calls of random tools) written inside
    /// a reasoning block left open, after random reasoning, the prompt opening the block or
    /// not. Where llama.cpp's handler for the format ends such a block at a call's opening
    /// (`Tags::ends`: the Qwen3-Coder family, DSML, Ling 3, Kimi K2, Cohere2MoE), the reading,
    /// whole and streamed, is that of the same output with the block closed right before the
    /// first such marker; elsewhere all of it is reasoning, without calls. Where the family
    /// opens a block only at the output's start (LFM2, Kimi K2, Ministral 3), a block after
    /// whitespace is read as the reply's text.
    #[test]
    fn a_call_in_a_block_left_open_reads_as_llama_cpp_reads_it() {
        use crate::tools::test_util::{markup_text, random_output};
        let mut rng = Rng(0x5EED_7417);
        let (mut ended, mut with_calls, mut first) = (0, 0, 0);
        let mut ending = Vec::new();
        for &format in FORMATS {
            let tags = match format {
                Format::Harmony | Format::Atem => continue,
                Format::Gemma4 => think::GEMMA,
                Format::Mistral { .. } | Format::MistralNemo => think::BRACKETS,
                Format::JsonList(s) if s.name.starts_with("co") => think::COHERE,
                _ => think::THINK,
            };
            let t = format.reasoning_tags(tags, true);
            if !t.ends.is_empty() {
                ending.push(format.name());
            }
            for round in 0..24 {
                let r = random_req(&mut rng, round, round % 2 == 0);
                let opened = rng.coin();
                let o = Output {
                    format,
                    tools: Some(r.clone()),
                    call_seed: 1,
                    think: Some((t, opened)),
                    lead: "",
                    past_ids: Default::default(),
                };
                let out = random_output(&mut rng, format, &r);
                let reasoning = markup_text(&mut rng, 0, 12);
                let open = if opened { "" } else { t.open };
                let text = format!("{open}{reasoning}{out}");
                let (fin, _) = o.parse_final(&text);
                o.check_stream(&text, &fin)
                    .unwrap_or_else(|e| panic!("{format:?} {text:?}: {e}"));
                assert_eq!(replay(&o, &text, &mut rng), Rebuilt::whole(&o, &text));
                match t.ends.iter().filter_map(|e| out.find(e)).min() {
                    Some(m) => {
                        let closed =
                            format!("{open}{reasoning}{}{}{}", &out[..m], t.close, &out[m..]);
                        assert_eq!(o.parse(&text), o.parse(&closed), "{format:?} {text:?}");
                        assert_eq!(fin, o.parse_final(&closed).0, "{format:?} {text:?}");
                        ended += 1;
                        with_calls += !fin.tool_calls.is_empty() as usize;
                    }
                    None => {
                        let p = o.parse(&text);
                        assert_eq!((p.content.as_str(), &p.tool_calls[..]), ("", &[][..]));
                        assert!(p.reasoning.is_some_and(|r| r.ends_with(out.trim_end())));
                    }
                }
                // A block after whitespace, closed.
                let spaced = format!(" \n{}{reasoning}{}{out}", t.open, t.close);
                let got = o.parse(&spaced);
                let plain = Output { think: None, ..o };
                if t.open_first && !opened {
                    assert_eq!(got, plain.parse(&spaced), "{format:?} {spaced:?}");
                    first += 1;
                } else {
                    assert!(got.reasoning.is_some(), "{format:?} {spaced:?}");
                }
            }
        }
        assert_eq!(
            ending,
            [
                "qwen3-coder",
                "kimi-k2",
                "cohere2moe",
                "deepseek-v3.2",
                "deepseek-v4",
                "ling-3"
            ]
        );
        assert!(
            ended > 100 && with_calls > 100 && first > 20,
            "{ended} {with_calls} {first}"
        );
        // DSML's calls end a block only where they are read.
        assert!(Format::DeepSeekDsml { v4: true }
            .reasoning_tags(think::THINK, false)
            .ends
            .is_empty());
    }

    /// Random outputs of the formats that read on from their last whole block, after a
    /// reasoning block or not (the reply after it starting after whitespace that grows), with
    /// slips: reading each on, at every prefix, gives what reading it all again gives.
    #[test]
    fn reading_on_after_reasoning_equals_reading_all_again() {
        let mut rng = Rng(0x7E1D_0A11);
        let formats = [
            Format::Hermes,
            Format::QwenXml,
            Format::Mistral { call_id: false },
            Format::DeepSeekR1,
            Format::SeedOss,
            Format::MiniMaxM2,
            Format::Glm { newlines: false },
            Format::DeepSeekDsml { v4: true },
            Format::MiniCpm5,
            Format::Ling3,
            Format::Hy3,
        ];
        let (mut readings, mut reasoned) = (0, 0);
        for round in 0..96 {
            let format = formats[round % formats.len()];
            let r = random_req(&mut rng, round / formats.len(), true);
            let think = [None, Some(true), Some(false)][round % 3];
            let tags = if format == Format::Hy3 {
                think::HY3
            } else {
                think::THINK
            };
            let block = think.map(|opened| (tags, opened));
            let o = Output {
                format,
                tools: Some(r.clone()),
                call_seed: 1,
                think: block,
                lead: "",
                past_ids: Default::default(),
            };
            let ws = ["", "\n", "\n\n  "][rng.below(3)];
            let mut text = match think {
                None => String::new(),
                Some(true) => format!("Weighing <it>.{}{ws}", tags.close),
                Some(false) => format!(
                    "{ws}{}Weighing {} it.{}{ws}",
                    tags.open,
                    &tags.close[..tags.close.len() - 2],
                    tags.close
                ),
            };
            text += &crate::tools::test_util::random_output(&mut rng, format, &r);
            if round % 4 == 3 {
                crate::tools::test_util::mutate(&mut rng, &mut text, &[tags.close, " "], 12);
            }
            let mut settled = Settled::default();
            for p in crate::tools::test_util::prefixes(&text) {
                let now = o.read_on(p, &mut settled);
                reasoned += usize::from(now.reasoning.is_some());
                assert_eq!(now, o.parse_partial(p), "{think:?} {p:?}");
                readings += 1;
            }
        }
        assert!(
            readings > 10_000 && reasoned > 3_000,
            "{readings} {reasoned}"
        );
    }

    /// Ministral 3's answers: random reasoning in `[THINK]` tags (with `[TOOL_CALLS]` and a
    /// call's markup inside it), then text and random calls in the `mistral` format. The
    /// reasoning comes back whole and apart, the calls are only those after the block, and the
    /// stream, whole or cut anywhere, adds up to the whole answer.
    #[test]
    fn ministral_reasoning_is_split_before_its_calls() {
        let mut rng = Rng(0x5EED_3A17);
        let format = Format::Mistral { call_id: false };
        for round in 0..60 {
            let r = random_req(&mut rng, round, round % 2 == 0);
            let opened = round % 3 == 0;
            let o = Output {
                format,
                tools: Some(r.clone()),
                call_seed: rng.next(),
                think: Some((think::BRACKETS, opened)),
                lead: "",
                past_ids: Default::default(),
            };
            let pieces = [
                "Hmm",
                " ",
                "\n",
                "[TOOL_CALLS]",
                "f[ARGS]{}",
                "é",
                "[THINK]",
                "[/THI",
            ];
            let reasoning: String = (0..1 + rng.below(8))
                .map(|_| pieces[rng.below(pieces.len())])
                .collect();
            let calls = random_calls(&mut rng, &r);
            let mut text = if opened {
                format!("{reasoning}[/THINK]")
            } else {
                format!("[THINK]{reasoning}[/THINK]")
            };
            let content = ["", "Let me check."][rng.below(2)];
            text += content;
            for (t, a) in &calls {
                text += &format!("[TOOL_CALLS]{}[ARGS]{a}", t.name);
            }
            let whole = Rebuilt::whole(&o, &text);
            assert_eq!(
                (whole.reasoning.as_str(), whole.content.as_str()),
                (reasoning.as_str(), content),
                "{text}"
            );
            check_calls_streamed(&o, &text, &calls, &mut rng);
        }
    }

    /// Outputs strung together from random pieces of every format's markup (calls whole and
    /// half-written, openings, closings, JSON and XML fragments, reasoning tags, multi-byte
    /// characters), as a model without a grammar may write them, in every format, after a
    /// reasoning block or not, with `tool_choice` auto, required or none: reading on gives
    /// what reading all again gives at every prefix, and the client rebuilds from the stream's
    /// deltas exactly the answer it would get whole.
    #[test]
    fn streamed_markup_soup_rebuilds_the_whole_answer() {
        let pieces = [
            "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": 1}}\n</tool_call>",
            "<tool_call>\n<function=g>\n<parameter=b>\nx\n</parameter>\n</function>\n</tool_call>",
            "[TOOL_CALLS]f[ARGS]{\"a\":1}",
            "[TOOL_CALLS]g[CALL_ID]abcDEF123[ARGS]{\"b\":\"y\"}",
            "[TOOL_CALLS][{\"name\":\"f\",\"arguments\":{\"a\":3},\"id\":\"abcDEF123\"}]",
            "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>f\n```json\n{\"a\":1}\n```\
             <｜tool▁call▁end｜><｜tool▁calls▁end｜>",
            "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>g<｜tool▁sep｜>{\"b\":\"z\"}<｜tool▁call▁end｜>\
             <｜tool▁calls▁end｜>",
            " to=g<|message|><atem:function_calls>\n<atem:invoke name=\"g\">\n\
             <atem:parameter name=\"b\">v</atem:parameter>\n</atem:invoke>\n</atem:function_calls>",
            "<|tool_call>call:f{a:1}<tool_call|>",
            "<|channel|>commentary to=functions.g <|constrain|>json<|message|>{\"b\":\"x\"}",
            "<tool_call>",
            "</tool_call>",
            "{\"name\":\"g\",\"arguments\":{\"b\":\"x\"}}",
            "{\"name\":\"f\",\"parameters\":{}}",
            "[TOOL_CALLS]",
            "[ARGS]",
            "[CALL_ID]abcDEF123",
            "[{\"name\":\"f\",\"arguments\":{},\"id\":\"abcDEF123\"}]",
            "f",
            "g",
            "nosuch",
            "{}",
            "{\"a\":2}",
            "<｜tool▁calls▁begin｜>",
            "<｜tool▁calls▁end｜>",
            "<｜tool▁call▁begin｜>",
            "<｜tool▁call▁end｜>",
            "<｜tool▁sep｜>",
            "function",
            "```json",
            "```",
            "<function=f>",
            "<function=g>",
            "</function>",
            "<parameter=a>",
            "<parameter=b>",
            "</parameter>",
            "<seed:tool_call>",
            "</seed:tool_call>",
            "<minimax:tool_call>",
            "</minimax:tool_call>",
            "<invoke name=\"f\">",
            "<parameter name=\"a\">",
            "</invoke>",
            "<tool_call>g",
            "<arg_key>b</arg_key>",
            "<arg_value>",
            "</arg_value>",
            "<tool_calls:opensource>",
            "<tool_call:opensource>g<tool_sep:opensource>",
            "<arg_key:opensource>b</arg_key:opensource>",
            "<arg_value:opensource>",
            "</arg_value:opensource>",
            "</tool_call:opensource>",
            "</tool_calls:opensource>",
            " to=f<|message|><atem:function_calls>",
            "<atem:invoke name=\"g\">",
            "<atem:parameter name=\"b\">",
            "</atem:parameter>",
            "</atem:invoke>",
            "</atem:function_calls>",
            "<|eom|><|start|>assistant",
            " to=self<|message|>",
            "<think>",
            "</think>",
            "[THINK]",
            "[/THINK]",
            "<|python_tag|>",
            "brave_search.call(query=\"a\")",
            "python.call(code=\"1\")",
            "<|tool_calls_section_begin|>",
            "<|tool_call_begin|>functions.f:0<|tool_call_argument_begin|>",
            "<|tool_call_end|>",
            "<|tool_calls_section_end|>",
            "<TOOLCALL>[{\"name\": \"g\", \"arguments\": ",
            "<|START_ACTION|>[{\"tool_name\": \"f\", \"parameters\": ",
            "<|tool_call|>[{\"name\": \"f\", \"arguments\": ",
            "<tool_calls>[{\"name\": \"g\", \"arguments\": ",
            " functools[{\"name\": \"f\", \"arguments\": ",
            "<tool_calls>\n{\"name\": \"f\", \"arguments\": ",
            "<|message_sep|>\n\nfunction call<|role_sep|>\n{\"name\": \"g\", \"arguments\": ",
            "<|function_call|>{\"name\": \"f\", \"arguments\": ",
            "}}",
            "</tool_calls>",
            "}]",
            "</TOOLCALL>",
            "<|END_ACTION|>",
            "<|START_TEXT|>",
            "<|END_RESPONSE|>",
            "<|tool_call_start|>[f(a=1)]<|tool_call_end|>",
            "<|tool_call_start|>[g(b='x",
            "'), f(a=1",
            ")]<|tool_call_end|>",
            "<｜DSML｜function_calls>\n",
            "<｜DSML｜tool_calls>\n",
            "<｜DSML｜invoke name=\"g\">\n",
            "<｜DSML｜parameter name=\"b\" string=\"true\">",
            "</｜DSML｜parameter>\n",
            "</｜DSML｜invoke>\n",
            "</｜DSML｜function_calls>",
            "</｜DSML｜tool_calls>",
            "<function name=\"g\">",
            "<param name=\"b\">",
            "</param>",
            "</function>",
            "<|tool_calls|><|tool_call:begin|>a1b2c3d4e5<|tool_call:name|>f<|tool_call:args|>",
            "<|tool_call:end|><|calls|>",
            "<function=g>{\"b\":\"y\"}</function>",
            ">>>",
            "all\n",
            "f\n{\"a\":3}",
            "\n",
            " ",
            "é",
            "😀",
            "{",
            "}",
            "\"",
            "1",
            "<",
        ];
        let tools = vec![
            tool(
                "f",
                json!({"type": "object", "properties": {"a": {"type": "integer"}}}),
            ),
            tool(
                "g",
                json!({"type": "object", "properties": {"b": {"type": "string"}}}),
            ),
            // Llama 3.1's built-in tools (other formats take them as plain functions)
            tool(
                "brave_search",
                json!({"type": "object", "properties": {"query": {"type": "string"}}}),
            ),
            tool(
                "python",
                json!({"type": "object", "properties": {"code": {"type": "string"}}}),
            ),
        ];
        let choices = [ToolChoice::Auto, ToolChoice::Required, ToolChoice::None];
        let mut rng = Rng(0x50_4B5E);
        let mut calls = 0;
        for round in 0..100 * FORMATS.len() {
            let r = req(tools.clone(), choices[rng.below(3)].clone(), rng.coin());
            let o = Output {
                format: FORMATS[round % FORMATS.len()],
                tools: Some(r),
                call_seed: 1,
                think: [None, Some(true), Some(false)][rng.below(3)]
                    .map(|opened| ([think::THINK, think::BRACKETS][rng.below(2)], opened)),
                lead: "",
                past_ids: Default::default(),
            };
            let text: String = (0..1 + rng.below(24))
                .map(|_| pieces[rng.below(pieces.len())])
                .collect();
            let mut settled = Settled::default();
            for p in crate::tools::test_util::prefixes(&text) {
                assert_eq!(o.read_on(p, &mut settled), o.parse_partial(p), "{p:?}");
            }
            let whole = Rebuilt::whole(&o, &text);
            calls += whole.calls.len();
            assert_eq!(
                replay(&o, &text, &mut rng),
                whole,
                "{:?} {text:?}",
                o.format
            );
        }
        assert!(calls > 100, "{calls}");
    }

    /// An answer cut inside a call's JSON (a stop string, max_tokens) keeps the call as far as
    /// it was written, and is not `parse`'s own reading (its finish reason is not
    /// "tool_calls"); the whole call is.
    #[test]
    fn a_call_cut_short_is_not_whole() {
        let r = crate::tools::test_util::f_req(false);
        let o = Output {
            format: Format::Hermes,
            tools: Some(r),
            call_seed: 7,
            think: None,
            lead: "",
            past_ids: Default::default(),
        };
        let whole =
            "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": \"see it\"}}\n</tool_call>";
        let (p, is_whole) = o.parse_final(whole);
        assert!(is_whole);
        assert_eq!(p.tool_calls[0].arguments, r#"{"a":"see it"}"#);
        let cut = &whole[..whole.find(" it").unwrap()];
        let (p, is_whole) = o.parse_final(cut);
        assert!(!is_whole);
        assert_eq!((p.content.as_str(), p.tool_calls.len()), ("", 1));
        assert_eq!(p.tool_calls[0].arguments, r#"{"a":"see"#);
    }

    /// Every call of an answer gets an id no other call of the answer or of the conversation
    /// has; the model's own id is kept where it is new, and ids have the format's shape.
    #[test]
    fn call_ids_are_unique_in_the_conversation() {
        for (format, shape) in [
            (Format::MistralNemo, r"^[A-Za-z0-9]{9}$"),
            (Format::Hermes, r"^call_[A-Za-z0-9]{24}$"),
        ] {
            let shape = fancy_regex::Regex::new(shape).unwrap();
            for seed in [1u64, 0xDEAD_BEEF, u64::MAX] {
                let o = Output {
                    format,
                    tools: None,
                    call_seed: seed,
                    think: None,
                    lead: "",
                    past_ids: ["abcDEF123".to_string(), format.call_id(seed, 1)].into(),
                };
                let call = |id: Option<&str>| ToolCall {
                    id: id.map(str::to_string),
                    name: "f".into(),
                    arguments: "{}".into(),
                };
                let p = Parsed {
                    tool_calls: vec![
                        call(Some("abcDEF123")),
                        call(Some("newID4567")),
                        call(Some("newID4567")),
                        call(None),
                        call(None),
                    ],
                    ..Parsed::default()
                };
                let ids: Vec<String> = o
                    .calls(&p)
                    .iter()
                    .map(|c| c["id"].as_str().unwrap().to_string())
                    .collect();
                assert_eq!(ids[1], "newID4567");
                let distinct: std::collections::HashSet<&String> = ids.iter().collect();
                assert_eq!(distinct.len(), ids.len(), "{ids:?}");
                for (i, id) in ids.iter().enumerate() {
                    assert!(!o.past_ids.contains(id), "{id}");
                    if i != 1 {
                        assert!(shape.is_match(id).unwrap(), "{format:?} {id}");
                    }
                }
            }
        }
    }
}
