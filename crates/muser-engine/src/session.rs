//! The public API: `Model` (a checked, loaded GGUF on a backend) and `Session` (one sequence:
//! its KV cache, position, and the prefill/decode calls the CLI and the server use).

use crate::backend::cpu::CpuBackend;
use crate::backend::{Backend, KvHost, KvLayerSpec};
use crate::config::ModelConfig;
use crate::error::{EngineError, Result};
use crate::graph::{self, Scratch};
use crate::weights::ModelWeights;
use muser_gguf::GgufFile;
use std::path::Path;
use std::sync::Arc;

/// Prefill runs in chunks of this many tokens.
pub const PREFILL_CHUNK: usize = 512;

#[derive(Debug, Clone, Default)]
pub struct LoadOptions {
    /// CPU worker threads (None: one per core).
    pub threads: Option<usize>,
    /// A progress bar (on a terminal) while the weights load.
    pub progress: bool,
}

/// A model whose every tensor was checked, resident in a backend.
pub struct Model<B: Backend = CpuBackend> {
    pub config: ModelConfig,
    file: Arc<GgufFile>,
    pub(crate) weights: ModelWeights<B::Weight>,
    pub(crate) backend: B,
}

impl Model<CpuBackend> {
    /// Opens `path`, reads the architecture, checks every tensor and maps the weights on the CPU.
    pub fn load(path: impl AsRef<Path>, opts: &LoadOptions) -> Result<Model<CpuBackend>> {
        let file = Arc::new(GgufFile::open(path)?);
        let mut be = CpuBackend::new(opts.threads)?;
        if opts.progress {
            be = be.with_load_progress(file.tensors.iter().map(|t| t.n_bytes).sum());
        }
        Model::from_gguf(file, be)
    }
}

impl<B: Backend> Model<B> {
    pub fn from_gguf(file: Arc<GgufFile>, backend: B) -> Result<Model<B>> {
        let config = ModelConfig::from_gguf(&file)?;
        let weights = ModelWeights::load(&file, &config, &backend)?;
        Ok(Model {
            config,
            file,
            weights,
            backend,
        })
    }

    pub fn gguf(&self) -> &GgufFile {
        &self.file
    }
    pub fn backend(&self) -> &B {
        &self.backend
    }

    /// Names of the tensors the model uses.
    fn used_tensors(&self) -> impl Iterator<Item = &muser_gguf::TensorInfo> {
        // Every tensor the checker accepted has one of these prefixes; extra tensors (e.g.
        // rope_freqs) are not read.
        self.file.tensors.iter().filter(|t| {
            t.name.starts_with("blk.")
                || t.name.starts_with("token_embd")
                || t.name.starts_with("output")
        })
    }

    /// Parameters (values) of all weights.
    pub fn n_params(&self) -> u64 {
        self.used_tensors().map(|t| t.n_elements()).sum()
    }
    /// Bytes of all weights.
    pub fn weight_bytes(&self) -> u64 {
        self.used_tensors().map(|t| t.n_bytes).sum()
    }

    /// Bytes a decode step reads at `depth` positions of context: every weight once except the
    /// embedding (one row; all of it when the LM head is tied to it), plus the K/V it attends.
    pub fn decode_bytes(&self, depth: usize) -> u64 {
        let c = &self.config;
        let embd = self
            .file
            .tensor("token_embd.weight")
            .map_or(0, |t| t.n_bytes);
        let row = embd / c.n_vocab.max(1) as u64;
        let weights = self.weight_bytes() - if c.tied_output { 0 } else { embd - row };
        let kv: u64 = c
            .layers
            .iter()
            .map(|l| {
                let seen = match (l.sliding, c.sliding_window) {
                    (true, Some(w)) => depth.min(w),
                    _ => depth,
                };
                (seen * c.kv_width() * 2 * 2) as u64
            })
            .sum();
        weights + kv
    }
}

impl<B: Backend> Model<B> {
    /// The K/V layers of a session of `n_ctx` positions.
    fn kv_specs(&self, n_ctx: usize) -> Vec<KvLayerSpec> {
        let c = &self.config;
        c.layers
            .iter()
            .map(|l| {
                let window = if l.sliding { c.sliding_window } else { None };
                // A ring must also hold the positions a batch row still sees while later rows of
                // the same batch are stored.
                let slots =
                    window.map_or(n_ctx, |w| n_ctx.min(w.saturating_add(PREFILL_CHUNK - 1)));
                KvLayerSpec {
                    n_head: c.n_head,
                    n_head_kv: c.n_head_kv,
                    head_dim: c.head_dim,
                    window,
                    slots,
                }
            })
            .collect()
    }

    /// Bytes of K/V cache (f16 K and V of every layer) a session of `n_ctx` positions
    /// reserves, or None when the count overflows: lets a caller check a memory budget before
    /// it makes sessions.
    pub fn kv_cache_bytes(&self, n_ctx: usize) -> Option<u64> {
        self.kv_specs(n_ctx).iter().try_fold(0u64, |sum, s| {
            let values = (s.slots as u64)
                .checked_mul(s.n_head_kv as u64)?
                .checked_mul(s.head_dim as u64)?;
            sum.checked_add(values.checked_mul(2 * 2)?)
        })
    }
}

/// A session's first positions' cache entries in host memory (`Session::save`), to be taken
/// back by a session of the same model and context (`Session::restore`): a server keeps the
/// prompts its slots had to give up.
pub struct Snapshot {
    /// The address of the model it came from (which it only goes back to); None for one made
    /// from its parts (a file), which goes to any session of the same layers.
    model: Option<usize>,
    specs: Vec<KvLayerSpec>,
    n: usize,
    host: KvHost,
}

impl Snapshot {
    /// A snapshot of `n` positions of a cache of these layers (a file's: `specs`, `n` and
    /// `host` as another snapshot's accessors gave them). `restore` takes it into a session
    /// whose layers have the same heads, windows and ring sizes, and room for n positions;
    /// that it came from the same model is the caller's to know.
    pub fn from_parts(specs: Vec<KvLayerSpec>, n: usize, host: KvHost) -> Snapshot {
        Snapshot {
            model: None,
            specs,
            n,
            host,
        }
    }
    pub fn specs(&self) -> &[KvLayerSpec] {
        &self.specs
    }
    pub fn host(&self) -> &KvHost {
        &self.host
    }
    /// The positions it holds.
    pub fn len(&self) -> usize {
        self.n
    }
    pub fn is_empty(&self) -> bool {
        self.n == 0
    }
    /// Its host memory.
    pub fn bytes(&self) -> usize {
        self.host.bytes()
    }
}

/// One sequence on a model: KV cache, position, logits.
pub struct Session<'m, B: Backend = CpuBackend> {
    pub(crate) model: &'m Model<B>,
    pub(crate) kv: B::Kv,
    specs: Vec<KvLayerSpec>,
    n_ctx: usize,
    pub(crate) pos: usize,
    one: Scratch<B>,
    /// The recorded decode step of `one` (see `Backend::decode_step`).
    rec: Option<B::Recording>,
    batch: Option<Scratch<B>>,
    pub(crate) logits: crate::backend::HostBuf,
}

impl<'m, B: Backend> Session<'m, B> {
    /// A session holding up to `n_ctx` positions.
    pub fn new(model: &'m Model<B>, n_ctx: usize) -> Result<Session<'m, B>> {
        if n_ctx == 0 {
            return Err(EngineError::Invalid("n_ctx must be at least 1".into()));
        }
        let c = &model.config;
        let specs = model.kv_specs(n_ctx);
        let be = &model.backend;
        Ok(Session {
            model,
            kv: be.kv_cache(&specs)?,
            specs,
            n_ctx,
            pos: 0,
            one: Scratch::new(be, c, 1, 1),
            rec: None,
            batch: None,
            logits: be.host_buf(c.n_vocab),
        })
    }

    /// Positions processed so far.
    pub fn pos(&self) -> usize {
        self.pos
    }
    pub fn n_ctx(&self) -> usize {
        self.n_ctx
    }
    pub fn model(&self) -> &'m Model<B> {
        self.model
    }
    /// Forgets the sequence (the cache is overwritten from position 0).
    pub fn reset(&mut self) {
        self.pos = 0;
    }

    /// Goes back to position `n` (<= pos), keeping the cached positions before it so a prompt
    /// that shares them can continue from there. Returns false, and resets to position 0, when
    /// a sliding layer's ring has already overwritten positions that position n still sees.
    pub fn rewind(&mut self, n: usize) -> bool {
        let n = n.min(self.pos);
        // A ring of `slots` keeps positions pos - slots .. pos - 1; position n (and a chunk
        // after it, which the ring's size allows for) sees positions from n - window + 1 on.
        let kept = self.keeps(n);
        self.pos = if kept { n } else { 0 };
        kept
    }

    /// Whether going back to position `n` (<= pos) keeps what position n sees: a sliding
    /// layer's ring still holds the positions before n within its window.
    fn keeps(&self, n: usize) -> bool {
        self.specs.iter().all(|s| match s.window {
            Some(w) => (n + 1).saturating_sub(w) >= self.pos.saturating_sub(s.slots),
            None => true,
        })
    }

    /// Takes `src`'s first `n` positions (a session of the same model and context): this
    /// session's cache holds their entries, as `src` computed them, and it stands at position
    /// n, as if it had processed them itself (the same bits: a cache entry depends only on the
    /// positions up to its own). Another sequence's shared prefix (a prompt many requests
    /// begin with) is then copied instead of computed again. False, with nothing changed, where
    /// `src` holds fewer than n positions, is of another model or shape, or its sliding
    /// layers no longer hold what position n sees.
    pub fn copy_prefix_from(&mut self, src: &Session<'_, B>, n: usize) -> bool {
        let fits = std::ptr::eq(self.model, src.model)
            && self.specs == src.specs
            && n <= src.pos
            && n <= self.n_ctx
            && src.keeps(n);
        if fits {
            self.model.backend.kv_copy_prefix(&src.kv, &mut self.kv, n);
            self.pos = n;
        }
        fits
    }

    /// Its first `n` positions' cache entries copied to host memory, for `restore` into a
    /// session of the same model and context; None where it holds fewer than n positions or
    /// its sliding layers no longer hold what position n sees.
    pub fn save(&self, n: usize) -> Option<Snapshot> {
        (n <= self.pos && self.keeps(n)).then(|| Snapshot {
            model: Some(self.model as *const Model<B> as usize),
            specs: self.specs.clone(),
            n,
            host: self.model.backend.kv_save(&self.kv, n),
        })
    }

    /// Takes back a snapshot's positions (`save`): the session then stands at its position n
    /// with the entries its source computed for them, the same bits. False, with nothing
    /// changed, for a snapshot of another model or cache shape (one made from parts: of other
    /// layers, or more positions than this session holds).
    pub fn restore(&mut self, snap: &Snapshot) -> bool {
        let same_layers = |a: &KvLayerSpec, b: &KvLayerSpec| {
            (a.n_head, a.n_head_kv, a.head_dim, a.window)
                == (b.n_head, b.n_head_kv, b.head_dim, b.window)
                && (if a.is_ring() {
                    a.slots == b.slots
                } else {
                    snap.n <= b.slots
                })
        };
        let fits = snap.n <= self.n_ctx
            && match snap.model {
                Some(m) => m == self.model as *const Model<B> as usize && snap.specs == self.specs,
                None => {
                    snap.specs.len() == self.specs.len()
                        && snap
                            .specs
                            .iter()
                            .zip(&self.specs)
                            .all(|(a, b)| same_layers(a, b))
                        && snap.host.layers.len() == self.specs.len()
                        && snap
                            .host
                            .layers
                            .iter()
                            .zip(&self.specs)
                            .all(|([k, v], sp)| {
                                k.len() == v.len()
                                    && k.len()
                                        == sp.prefix_slots(snap.n) * sp.n_head_kv * sp.head_dim
                            })
                }
            };
        if fits {
            self.model.backend.kv_load(&snap.host, &mut self.kv);
            self.pos = snap.n;
        }
        fits
    }

    pub(crate) fn check(&self, tokens: &[u32]) -> Result<()> {
        if tokens.is_empty() {
            return Err(EngineError::Invalid("no tokens to process".into()));
        }
        if self.pos + tokens.len() > self.n_ctx {
            return Err(EngineError::ContextOverflow {
                n_past: self.pos,
                n_new: tokens.len(),
                n_ctx: self.n_ctx,
            });
        }
        let n_vocab = self.model.config.n_vocab;
        if let Some(&token) = tokens.iter().find(|&&t| t as usize >= n_vocab) {
            return Err(EngineError::BadToken { token, n_vocab });
        }
        Ok(())
    }

    /// Runs one chunk (<= PREFILL_CHUNK tokens) and copies the logits of its last `n_out` tokens
    /// to `dst` (`[n_out, n_vocab]`).
    fn run_chunk(&mut self, chunk: &[u32], n_out: usize, dst: &mut [f32]) {
        let m = self.model;
        let s = if chunk.len() == 1 && n_out == 1 {
            &mut self.one
        } else {
            if !matches!(&self.batch, Some(b) if b.n == chunk.len() && b.n_out == n_out) {
                self.batch = None; // free before allocating the next
                self.batch = Some(Scratch::new(&m.backend, &m.config, chunk.len(), n_out));
            }
            self.batch.as_mut().unwrap()
        };
        let (kv, pos) = (&mut self.kv, self.pos);
        m.backend
            .run(|| graph::forward(&m.backend, &m.config, &m.weights, s, kv, chunk, pos));
        self.pos += chunk.len();
        if n_out > 0 {
            m.backend.read(&s.logits, dst);
        }
    }

    /// Processes a prompt (in chunks of 512) and returns the logits of its last position.
    pub fn prefill(&mut self, tokens: &[u32]) -> Result<&[f32]> {
        self.check(tokens)?;
        let n_chunks = tokens.len().div_ceil(PREFILL_CHUNK);
        for (i, chunk) in tokens.chunks(PREFILL_CHUNK).enumerate() {
            let n_out = usize::from(i + 1 == n_chunks);
            let mut logits = std::mem::take(&mut self.logits);
            self.run_chunk(chunk, n_out, &mut logits);
            self.logits = logits;
        }
        Ok(&self.logits)
    }

    /// Processes tokens (in chunks of 512) without computing logits: a prefill chunk whose last
    /// position is not the end of the prompt.
    pub fn extend(&mut self, tokens: &[u32]) -> Result<()> {
        self.check(tokens)?;
        for chunk in tokens.chunks(PREFILL_CHUNK) {
            self.run_chunk(chunk, 0, &mut []);
        }
        Ok(())
    }

    /// Processes tokens and returns the logits of every position: `[n_tokens, n_vocab]`;
    /// `logits()` then holds the last position's, as after `prefill`.
    pub fn prefill_all(&mut self, tokens: &[u32]) -> Result<Vec<f32>> {
        self.check(tokens)?;
        let nv = self.model.config.n_vocab;
        let mut all = vec![0f32; tokens.len() * nv];
        let mut done = 0;
        for chunk in tokens.chunks(PREFILL_CHUNK) {
            self.run_chunk(
                chunk,
                chunk.len(),
                &mut all[done * nv..(done + chunk.len()) * nv],
            );
            done += chunk.len();
        }
        if let Some(last) = all.chunks_exact(nv).last() {
            self.logits.copy_from_slice(last);
        }
        Ok(all)
    }

    /// Processes tokens (in chunks of 512) and returns every position's last hidden state
    /// with the output norm applied (the LM head's input, no logits computed): `[n_tokens,
    /// n_embd]`, the token embeddings a decoder model gives (`muser serve --embeddings`).
    pub fn embed(&mut self, tokens: &[u32]) -> Result<Vec<f32>> {
        self.check(tokens)?;
        let ne = self.model.config.n_embd;
        let mut all = vec![0f32; tokens.len() * ne];
        let mut done = 0;
        for chunk in tokens.chunks(PREFILL_CHUNK) {
            self.run_chunk(chunk, 0, &mut []);
            // A chunk without logits always runs on the batch scratch (`run_chunk`).
            let s = self.batch.as_ref().expect("run_chunk keeps its scratch");
            let dst = &mut all[done * ne..(done + chunk.len()) * ne];
            self.model.backend.read(s.hidden(), dst);
            done += chunk.len();
        }
        Ok(all)
    }

    /// Appends one token and returns the logits of its position.
    pub fn decode(&mut self, token: u32) -> Result<&[f32]> {
        self.step(token, true)?;
        self.model.backend.read(&self.one.logits, &mut self.logits);
        Ok(&self.logits)
    }

    /// Appends one token and returns the most likely next token (the first on ties), computed
    /// where the logits are: a GPU reads back one index instead of the vocabulary. `logits()`
    /// is not updated.
    pub fn decode_greedy(&mut self, token: u32) -> Result<u32> {
        self.step(token, false)?;
        let mut out = [0u32];
        let m = self.model;
        m.backend
            .argmax(&self.one.logits, m.config.n_vocab, &mut out);
        Ok(out[0])
    }

    /// Appends one token and returns the `k` best-ranked (id, logit) of its position
    /// (`muser_sample::top_k_logits`), computed where the logits are: a GPU reads back k pairs
    /// instead of the vocabulary (for a sampler whose `top_k_of` is k). `logits()` is not
    /// updated.
    pub fn decode_top_k(&mut self, token: u32, k: usize) -> Result<Vec<(u32, f32)>> {
        self.step(token, false)?;
        let mut out = [Vec::new()];
        let m = self.model;
        m.backend
            .top_k(&self.one.logits, m.config.n_vocab, k, &mut out);
        let [top] = out;
        Ok(top)
    }

    /// One decode step (a decode group of one row), logits left in `self.one`; `read`: whether
    /// the host reads them back (`Backend::will_read_logits`) or reduces them where they are.
    fn step(&mut self, token: u32, read: bool) -> Result<()> {
        self.check(&[token])?;
        let m = self.model;
        let (s, rec, pos) = (&mut self.one, &mut self.rec, self.pos);
        let kv = &mut self.kv;
        m.backend.will_read_logits(read);
        m.backend.run(|| {
            graph::decode_step(
                &m.backend,
                &m.config,
                &m.weights,
                s,
                rec,
                &mut [kv],
                &[pos],
                &[token],
            )
        });
        self.pos += 1;
        Ok(())
    }

    /// The logits of the last prefill or decode.
    pub fn logits(&self) -> &[f32] {
        &self.logits
    }
}
