//! `muser serve`: the OpenAI-compatible server (crates/muser-server). The port answers at once
//! (GET /health is 503 while the model loads), then the model is loaded on the chosen backend
//! and the engine loop runs on this thread until the process is stopped.

use super::backend::{BackendKind, CliBackend, ModelJob};
use anyhow::Context;
use muser_engine::Model;
use muser_server::{Server, ServerConfig};
use std::path::PathBuf;

#[derive(clap::Args)]
pub struct Args {
    /// GGUF model (default: models/muse-default.gguf next to the repository or the cwd).
    #[arg(short = 'm', long)]
    pub model: Option<PathBuf>,
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    /// Port (0: any free port; the address is printed when the model is ready).
    #[arg(long, default_value_t = 8080)]
    pub port: u16,
    /// Slots: requests decoded together in one batch.
    #[arg(long = "parallel", short = 'n', default_value_t = 8)]
    pub parallel: usize,
    /// Context of each slot, tokens (default: the model's training context).
    #[arg(short = 'c', long = "ctx-size")]
    pub ctx_size: Option<usize>,
    /// Requests that may wait for a slot; more are refused with 503 (default: 4 x parallel).
    #[arg(long = "max-queue")]
    pub max_queue: Option<usize>,
    /// Require `Authorization: Bearer KEY` (GET /health and /v1/models stay open).
    #[arg(long = "api-key")]
    pub api_key: Option<String>,
    /// Largest request body, bytes (413 above).
    #[arg(long = "body-limit", default_value_t = 8 << 20)]
    pub body_limit: usize,
    /// Backend: auto (CUDA when a GPU is usable), cpu or cuda.
    #[arg(long, value_enum, default_value_t = BackendKind::Auto)]
    pub backend: BackendKind,
    /// CPU threads (default: one per core).
    #[arg(short = 't', long)]
    pub threads: Option<usize>,
    /// Host memory for the prompts the slots give up, MiB (0: none): a later request whose
    /// prompt shares a longer prefix with one of them than with any slot's cache takes its
    /// KV cache entries back instead of computing them (llama-server's --cache-ram).
    #[arg(long = "cache-ram", default_value_t = 8192)]
    pub cache_ram: usize,
    /// A directory for slot files: `POST /slots/{id}?action=save|restore` with a `filename`
    /// keeps a slot's cache there and takes it back (llama-server's --slot-save-path).
    #[arg(long = "slot-save-path")]
    pub slot_save_path: Option<PathBuf>,
    /// Serve embeddings: `POST /v1/embeddings` (OpenAI's) and `/embedding` (llama-server's).
    #[arg(long)]
    pub embeddings: bool,
    /// How a text's token states make its embedding: mean, cls (the first token's), last, or
    /// none (every token's, `/embedding` only). Default: the model's `{arch}.pooling_type`,
    /// none where the model names none.
    #[arg(long)]
    pub pooling: Option<muser_server::embed::Pooling>,
    /// `POST /infill` writes the suffix before the prefix (suffix-prefix-middle, for models
    /// trained so), as llama-server's --spm-infill.
    #[arg(long = "spm-infill")]
    pub spm_infill: bool,
    /// A Jinja chat template to use instead of the model's `tokenizer.chat_template`.
    #[arg(long = "chat-template-file")]
    pub chat_template_file: Option<PathBuf>,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let path = super::run::resolve_model(args.model.as_deref())?;
    // The template file is read and compiled before the model loads, so a bad one fails fast.
    let chat_template = match &args.chat_template_file {
        Some(f) => {
            let src = std::fs::read_to_string(f)
                .with_context(|| format!("cannot read the chat template file {}", f.display()))?;
            muser_server::chat::ChatTemplate::new(Some(&src), "", "")
                .with_context(|| format!("the chat template file {}", f.display()))?;
            Some(src)
        }
        None => None,
    };
    if let Some(dir) = &args.slot_save_path {
        if !dir.is_dir() {
            anyhow::bail!("--slot-save-path {}: not a directory", dir.display());
        }
    }
    let server = Server::start(ServerConfig {
        host: args.host.clone(),
        port: args.port,
        parallel: args.parallel,
        n_ctx: args.ctx_size,
        max_queue: args.max_queue,
        api_key: args.api_key.clone(),
        body_limit: args.body_limit,
        model_path: path.clone(),
        chat_template,
        cache_ram: args.cache_ram.saturating_mul(1 << 20),
        slot_save_path: args.slot_save_path.clone(),
        embeddings: args.embeddings,
        pooling: args.pooling,
        spm_infill: args.spm_infill,
    })?;
    eprintln!(
        "muser serve: listening on http://{} (loading {})",
        server.addr(),
        path.display()
    );
    // A model that fails to load ends the process with the error.
    super::backend::with_model(&path, args.backend, args.threads, Job { server })
}

struct Job {
    server: Server,
}

impl ModelJob for Job {
    fn run<B: CliBackend>(self, model: Model<B>) -> anyhow::Result<()> {
        self.server.serve_model(model)
    }
}
