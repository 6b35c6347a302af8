//! The OpenAI-compatible HTTP server and its scheduler.
//!
//! `Server::start` binds the port and answers at once (GET /health is 503 until the model is
//! ready); `Server::serve_model` then takes a model on any `muser_engine::Backend` and runs the
//! engine loop (`scheduler`) on the calling thread, while axum on a small tokio runtime parses
//! requests (`api`, `chat`), hands them to the engine over a channel and streams the tokens it
//! sends back (`http`).
//!
//! ```ignore
//! let server = Server::start(ServerConfig { port: 8080, ..Default::default() })?;
//! let model = Model::load("m.gguf", &LoadOptions::default())?;
//! server.serve_model(model)?; // runs until the process ends
//! ```

mod anthropic;
pub mod api;
pub mod chat;
pub mod constrain;
pub mod embed;
pub mod error;
pub mod host_cache;
mod http;
pub mod infill;
pub use http::read_chat_output;
pub mod metrics;
mod native;
mod responses;
pub mod scheduler;
pub mod slot_file;
pub mod slots;
pub mod text;
pub mod tools;

use anyhow::Context;
use chat::ChatTemplate;
use metrics::Metrics;
use muser_engine::{Backend, Model};
use muser_tokenizer::Tokenizer;
use scheduler::{Engine, Work};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, AtomicUsize};
use std::sync::{mpsc, Arc, OnceLock};

#[derive(Debug, Clone)]
pub struct ServerConfig {
    pub host: String,
    /// 0: any free port (the bound address is `Server::addr`).
    pub port: u16,
    /// Slots: sequences decoded together.
    pub parallel: usize,
    /// Context of each slot (None: the model's training context).
    pub n_ctx: Option<usize>,
    /// Requests that may wait for a slot; more get 503 (None: 4 x parallel).
    pub max_queue: Option<usize>,
    /// Requests must carry `Authorization: Bearer <key>` (except /health and /v1/models).
    pub api_key: Option<String>,
    /// Largest request body, bytes (413 above).
    pub body_limit: usize,
    /// The model file, for its id.
    pub model_path: PathBuf,
    /// A chat template to use instead of the GGUF's `tokenizer.chat_template` (its Jinja
    /// source, as llama-server's `--chat-template-file` reads it).
    pub chat_template: Option<String>,
    /// Bytes of host memory for the prefixes the slots give up (`HostCache`; 0: none).
    pub cache_ram: usize,
    /// Where `POST /slots/{id}?action=save|restore` keeps its files (None: those actions are
    /// not served), llama-server's `--slot-save-path`.
    pub slot_save_path: Option<PathBuf>,
    /// Serve `/v1/embeddings` and `/embedding(s)` (llama-server's `--embeddings`).
    pub embeddings: bool,
    /// How a text's token states make its embedding (None: as the GGUF's
    /// `{arch}.pooling_type` says; none where it says nothing).
    pub pooling: Option<embed::Pooling>,
    /// `/infill` lays out suffix, prefix, middle instead of prefix, suffix, middle
    /// (llama-server's `--spm-infill`).
    pub spm_infill: bool,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            host: "127.0.0.1".into(),
            port: 8080,
            parallel: 8,
            n_ctx: None,
            max_queue: None,
            api_key: None,
            body_limit: 8 << 20,
            model_path: PathBuf::from("model.gguf"),
            chat_template: None,
            cache_ram: 8192 << 20,
            slot_save_path: None,
            embeddings: false,
            pooling: None,
            spm_infill: false,
        }
    }
}

/// What the handlers know of the loaded model.
pub struct ModelInfo {
    /// The model's id in the API: the file name without `.gguf`.
    pub id: String,
    /// Other names a request's `model` may use: the file name, the path, `general.name`.
    pub aliases: Vec<String>,
    pub tokenizer: Tokenizer,
    pub template: ChatTemplate,
    /// Where the template came from: "file" (`--chat-template-file`), "model" (the GGUF) or
    /// "fallback" (neither: the plain "Role: text" template).
    pub template_origin: &'static str,
    /// The template's Jinja source as read (`chat::FALLBACK_TEMPLATE` for the fallback).
    pub template_source: String,
    /// The tool-call (and reasoning) format the template teaches its model.
    pub chat_format: tools::Format,
    /// The texts of the BOS and EOS tokens ("" where the model has none).
    pub bos_token: String,
    pub eos_token: String,
    /// Context of each slot.
    pub n_ctx: usize,
    pub n_ctx_train: usize,
    pub n_vocab: usize,
    pub n_embd: usize,
    /// The embeddings' pooling (`ServerConfig::pooling`, else the model's).
    pub pooling: embed::Pooling,
    pub n_params: u64,
    pub size: u64,
    /// Unix time the model became ready.
    pub created: u64,
    pub backend: String,
    /// The vocabulary as grammars see it (`constrain::grammar_vocab`), made by the first request
    /// that brings a grammar (~0.1 s on a 200k vocabulary, on its handler, not the engine).
    pub grammar_vocab: std::sync::OnceLock<std::sync::Arc<muser_sample::GrammarVocab>>,
}

impl ModelInfo {
    pub fn knows(&self, name: &str) -> bool {
        name == self.id || self.aliases.iter().any(|a| a == name)
    }

    /// A token's own bytes (part of a character for some; none for an id past the vocabulary).
    pub fn piece_bytes(&self, id: u32) -> &[u8] {
        self.tokenizer.token_to_piece_bytes(id).unwrap_or(b"")
    }
}

/// State shared by the handlers and the engine.
pub(crate) struct Shared {
    pub config: ServerConfig,
    pub max_queue: usize,
    /// Requests admitted and not yet ended (running or waiting): at most `parallel +
    /// max_queue`.
    pub admitted: Arc<AtomicUsize>,
    pub model: OnceLock<Arc<ModelInfo>>,
    pub load_error: OnceLock<String>,
    pub metrics: Metrics,
    pub jobs: mpsc::Sender<Work>,
    /// Seeds for requests that give none, and response ids.
    pub counter: AtomicU64,
}

pub struct Server {
    shared: Arc<Shared>,
    jobs: mpsc::Receiver<Work>,
    addr: SocketAddr,
    _runtime: tokio::runtime::Runtime,
}

impl Server {
    /// Binds `host:port` and starts answering (503 until `serve_model`).
    pub fn start(config: ServerConfig) -> anyhow::Result<Server> {
        if config.parallel == 0 {
            anyhow::bail!("--parallel must be at least 1");
        }
        let listener = std::net::TcpListener::bind((config.host.as_str(), config.port))
            .with_context(|| format!("cannot listen on {}:{}", config.host, config.port))?;
        listener.set_nonblocking(true)?;
        let addr = listener.local_addr()?;
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("muser-http")
            .enable_all()
            .build()?;
        let (tx, rx) = mpsc::channel();
        let seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        let shared = Arc::new(Shared {
            max_queue: config
                .max_queue
                .unwrap_or(config.parallel.saturating_mul(4)),
            admitted: Arc::new(AtomicUsize::new(0)),
            config,
            model: OnceLock::new(),
            load_error: OnceLock::new(),
            metrics: Metrics::default(),
            jobs: tx,
            counter: AtomicU64::new(seed),
        });
        let app = http::router(shared.clone());
        runtime.spawn(async move {
            let listener = tokio::net::TcpListener::from_std(listener).expect("tokio listener");
            if let Err(e) = axum::serve(listener, app).await {
                eprintln!("server error: {e}");
            }
        });
        Ok(Server {
            shared,
            jobs: rx,
            addr,
            _runtime: runtime,
        })
    }

    /// The address the server listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The model could not be loaded: /health says so with a 500.
    pub fn fail(&self, message: &str) {
        let _ = self.shared.load_error.set(message.to_string());
    }

    /// Serves `model` until the process ends: builds the tokenizer and chat template, marks the
    /// server ready and runs the engine loop on this thread.
    pub fn serve_model<B: Backend>(self, model: Model<B>) -> anyhow::Result<()> {
        let sh = &self.shared;
        let info = match model_info(&model, &sh.config) {
            Ok(i) => i,
            Err(e) => {
                self.fail(&format!("{e:#}"));
                return Err(e);
            }
        };
        let info = Arc::new(info);
        let mut engine = Engine::new(
            &model,
            &info.tokenizer,
            &sh.metrics,
            sh.config.parallel,
            info.n_ctx,
        )?
        .with_host_cache(sh.config.cache_ram);
        eprintln!(
            "muser serve: {} ready on http://{} ({} slots of {} tokens, {})",
            info.id, self.addr, sh.config.parallel, info.n_ctx, info.backend
        );
        let _ = sh.model.set(info.clone());
        engine.run(self.jobs);
        Ok(())
    }
}

fn model_info<B: Backend>(model: &Model<B>, config: &ServerConfig) -> anyhow::Result<ModelInfo> {
    let gguf = model.gguf();
    let tokenizer = Tokenizer::from_gguf(gguf).context("reading the tokenizer")?;
    let text = |id: Option<u32>| {
        id.and_then(|i| tokenizer.token_text(i).ok())
            .unwrap_or("")
            .to_string()
    };
    let (template_src, template_origin) = match (
        &config.chat_template,
        gguf.get_str("tokenizer.chat_template"),
    ) {
        (Some(src), _) => (Some(src.as_str()), "file"),
        (None, Ok(src)) => (Some(src), "model"),
        (None, Err(_)) => (None, "fallback"),
    };
    let (bos_token, eos_token) = (text(tokenizer.bos()), text(tokenizer.eos()));
    let template = ChatTemplate::new(template_src, &bos_token, &eos_token).with_context(|| {
        match template_origin {
            "file" => "the template of --chat-template-file",
            _ => "the model's tokenizer.chat_template",
        }
    })?;
    let template_source = template_src.unwrap_or(chat::FALLBACK_TEMPLATE).to_string();
    let pooling = match config.pooling {
        Some(p) => p,
        None if config.embeddings => embed::Pooling::of_model(gguf).map_err(anyhow::Error::msg)?,
        None => embed::Pooling::of_model(gguf).unwrap_or(embed::Pooling::None),
    };
    let c = &model.config;
    let n_ctx = config.n_ctx.unwrap_or(c.n_ctx_train);
    if n_ctx == 0 {
        anyhow::bail!("the context size must be at least 1");
    }
    let path = &config.model_path;
    let file_name = path
        .file_name()
        .map(|f| f.to_string_lossy().into_owned())
        .unwrap_or_default();
    let id = file_name
        .strip_suffix(".gguf")
        .unwrap_or(&file_name)
        .to_string();
    let mut aliases = vec![file_name.clone(), path.display().to_string()];
    if let Ok(name) = gguf.get_str("general.name") {
        aliases.push(name.to_string());
    }
    Ok(ModelInfo {
        id,
        aliases,
        template,
        template_origin,
        chat_format: tools::Format::detect(Some(&template_source)),
        template_source,
        bos_token,
        eos_token,
        n_ctx,
        n_ctx_train: c.n_ctx_train,
        n_vocab: c.n_vocab,
        n_embd: c.n_embd,
        pooling,
        n_params: model.n_params(),
        size: model.weight_bytes(),
        created: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
        backend: format!(
            "{}, {} threads",
            model.backend().name(),
            model.backend().threads()
        ),
        tokenizer,
        grammar_vocab: std::sync::OnceLock::new(),
    })
}
