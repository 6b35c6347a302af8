//! The engine thread: it owns the model and the slots (one `Session`, so one KV cache, each)
//! and runs requests that arrive over a channel. Every step:
//!
//! 1. drops requests whose client went away (their receiver is gone), freeing the slot;
//! 2. gives waiting requests idle slots, preferring the slot whose cache shares the longest
//!    prefix with the prompt (those positions are not computed again: "cached tokens"). Where
//!    another slot's cache shares a longer one (`MIN_SHARED` positions more), it is copied into
//!    the slot (`Session::copy_prefix_from`); and a request whose prompt shares such a prefix
//!    with a prompt being prefilled waits for that prefill, then copies it: the choices of one
//!    request (`n`), and requests with one long system prompt, compute it once. Where the
//!    backend computes a prompt position's cache entries with other bits than a decoded
//!    position's (`Backend::prefill_matches_decode`: CUDA's f16 prefill tiles), only the
//!    prefilled part of a cache is reused, so a request gets the bits it would get in a fresh
//!    slot. A slot's computed prefix that its new request gives up is saved to host memory first
//!    (`HostCache`, `with_host_cache`), and a request whose prompt shares `MIN_SHARED` positions
//!    more with a saved prefix than with any slot's cache takes it back (`Session::restore`);
//! 3. advances every decoding slot by one token in one decode group (one forward pass);
//! 4. prefills waiting prompts, oldest first, up to 512 tokens when no slot is decoding and 64
//!    when one is, so running streams keep their pace while a long prompt comes in; the parts
//!    of one step share one forward pass (`prefill_runs`, whose matmuls compute each column as
//!    alone, so a prompt's bits do not depend on how it was cut or what it shared a pass with).
//!
//! A request with DRY on gets its sequence breakers as token sequences (`DryBreakers`): the
//! default list's are built with the engine, a request's own list's when first seen (the last
//! few lists kept).
//!
//! Tokens go back to the request's handler as `Event`s; text is released through the stop
//! buffer and streaming UTF-8 decoder, so a client never sees half a character or a stop string.
//! Each slot's request and progress go on the slot board (`Metrics::slots`, GET /slots): when a
//! request takes a slot, when it ends (before its client hears the end) and, for the running
//! ones, at the end of every step.

use crate::api::Generation;
use crate::host_cache::HostCache;
use crate::metrics::Metrics;
use crate::slots::{SlotBoard, SlotInfo, SlotTask};
use crate::text::StopBuffer;
use muser_engine::{prefill_runs, Backend, DecodeGroup, Model, RowGot, RowNeed, Session};
use muser_sample::{Candidate, DryBreakers, Sampler};
use muser_tokenizer::{StreamDecoder, Tokenizer};
use std::collections::VecDeque;
use std::sync::atomic::AtomicUsize;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::mpsc::{Receiver, TryRecvError};
use std::sync::Arc;
use std::time::Instant;
use tokio::sync::mpsc::UnboundedSender;

/// A slot's next token as drawn, with its logprob when asked for; None when no token could be
/// picked.
type Pick = Option<(u32, Option<Logprob>)>;

/// Positions another slot's cache must share with a prompt beyond what the slot taking it
/// holds for them to be copied, or waited for while they are prefilled (shorter prefixes, a
/// chat template's header, are computed again).
pub const MIN_SHARED: usize = 32;

/// Prefill chunk when no decode waits, and when one does.
pub const CHUNK_IDLE: usize = 512;
pub const CHUNK_BUSY: usize = 64;

/// Logits a scoring pass reads back at most (`Job` with echo and logprobs: every position's),
/// 64 MB of f32: 512 positions a pass for a vocabulary of 32,768, 64 for 262,144
/// (`scored_chunk`).
pub const SCORED_FLOATS: usize = 1 << 24;

/// Prompt positions a scoring pass takes when no decode waits: `SCORED_FLOATS` worth of logits,
/// from `CHUNK_BUSY` to `CHUNK_IDLE` positions.
pub fn scored_chunk(n_vocab: usize) -> usize {
    (SCORED_FLOATS / n_vocab.max(1)).clamp(CHUNK_BUSY, CHUNK_IDLE)
}

/// A checked request, ready to run: the prompt fits the context with `max_tokens` after it.
pub struct Job {
    pub prompt: Vec<u32>,
    pub gen: Generation,
    pub max_tokens: usize,
    pub events: UnboundedSender<Event>,
    /// Its place among the requests the server has admitted, given back when the engine
    /// drops the job (answered, failed or cancelled).
    pub ticket: Ticket,
}

/// What the engine thread is sent: a request, or an action on a slot's cache.
pub enum Work {
    Job(Box<Job>),
    Slot(SlotRequest),
    Embed(crate::embed::EmbedRequest),
}

/// `POST /slots/{id}?action=...`: slot `slot`'s cache saved to a file, taken from one, or
/// emptied, answered on `reply` (llama-server's JSON, or an error).
pub struct SlotRequest {
    pub slot: usize,
    pub action: SlotAction,
    pub reply: tokio::sync::oneshot::Sender<Result<serde_json::Value, crate::error::ApiError>>,
}

#[derive(Debug, Clone)]
pub enum SlotAction {
    /// To this file (`filename` is its name as the request gave it).
    Save {
        path: std::path::PathBuf,
        filename: String,
    },
    Restore {
        path: std::path::PathBuf,
        filename: String,
    },
    Erase,
}

/// One admitted request, counted in a shared total from `admit` until dropped; the default
/// ticket counts nowhere.
#[derive(Default)]
pub struct Ticket(Option<Arc<AtomicUsize>>);

impl Ticket {
    /// A ticket if fewer than `limit` are out, else None (the total is left as it was).
    pub fn admit(total: &Arc<AtomicUsize>, limit: usize) -> Option<Ticket> {
        Ticket::admit_many(total, limit, 1).map(|mut t| t.remove(0))
    }

    /// `k` tickets at once if the total stays within `limit` with them, else None (the total
    /// is left as it was): the choices of one request are admitted together or not at all.
    pub fn admit_many(total: &Arc<AtomicUsize>, limit: usize, k: usize) -> Option<Vec<Ticket>> {
        total
            .fetch_update(Relaxed, Relaxed, |n| (n + k <= limit).then_some(n + k))
            .ok()
            .map(|_| (0..k).map(|_| Ticket(Some(total.clone()))).collect())
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        if let Some(total) = &self.0 {
            total.fetch_sub(1, Relaxed);
        }
    }
}

#[derive(Debug, Clone)]
pub enum Event {
    /// One generated token: its id, the text it released (maybe empty) and, when asked, its
    /// logprob. At the end, text held back (by the stop strings or an incomplete character)
    /// comes as a Token without an id. `offset` is the byte length of the text decoded before
    /// this token, held-back text included (a logprob's `text_offset`). `slot`: the slot that
    /// runs the request (llama-server's `id_slot` in each streamed event).
    Token {
        id: Option<u32>,
        text: String,
        logprob: Option<Logprob>,
        offset: usize,
        slot: usize,
    },
    /// The prompt of a request with `echo`, once prefilled, before any token.
    Prompt(Echo),
    Done(Finish),
    /// The request ended without an answer: a 500 for what went wrong in the engine, a 400 for
    /// what the request asked that cannot be done (a grammar past the engine's bounds).
    Error(crate::error::ApiError),
}

/// The prompt as an echoing request's answer starts with it: `text` its tokens' text as the
/// generated text is decoded (control tokens give none), `offsets[i]` the bytes of it before
/// token i, and with `logprobs` asked for, each token's logprob given the tokens before it (the
/// first has none).
#[derive(Debug, Clone)]
pub struct Echo {
    pub ids: Vec<u32>,
    pub text: String,
    pub offsets: Vec<usize>,
    pub lps: Option<Vec<Option<Logprob>>>,
}

#[derive(Debug, Clone)]
pub struct Logprob {
    pub id: u32,
    pub logprob: f32,
    /// The most likely tokens, most likely first.
    pub top: Vec<(u32, f32)>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FinishReason {
    /// An end-of-generation token or a stop string.
    Stop,
    /// max_tokens, or the context is full.
    Length,
}

impl FinishReason {
    pub fn as_str(self) -> &'static str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
        }
    }
}

#[derive(Debug, Clone)]
pub struct Finish {
    pub reason: FinishReason,
    /// The stop string that ended the request (reason Stop without one: an end-of-generation
    /// token).
    pub stop_word: Option<String>,
    /// The slot that ran it.
    pub slot: usize,
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    pub cached_tokens: usize,
    /// Milliseconds from the start of the prompt's first prefill part to the end of its last
    /// (the prompt positions not reused from the cache; shared passes count whole).
    pub prompt_ms: f64,
    /// Milliseconds from the end of the prefill to the end of the request: the decode steps
    /// after the first token (which the prefill's logits give), and their sampling.
    pub predicted_ms: f64,
}

/// The log-probability of `id` under `logits` (natural log of the softmax) and the `n` most
/// likely tokens'.
pub fn logprob(logits: &[f32], id: u32, n: usize) -> Logprob {
    // One normalization for the token and its alternatives (the token's value is the one it has
    // among them).
    let (logprob, top) = muser_sample::token_logprobs(logits, Some(id), n);
    Logprob { id, logprob, top }
}

/// A request in a slot.
struct Task {
    job: Job,
    sampler: Sampler,
    decoder: StreamDecoder,
    /// Bytes of text the decoder has given so far.
    decoded: usize,
    stop: StopBuffer,
    n_gen: usize,
    n_cached: usize,
    /// Prompt positions computed for it so far (the rest of the prompt after `n_cached`).
    n_processed: usize,
    /// Its released text has a newline.
    has_new_line: bool,
    /// `job.gen`, shared with the slot board.
    gen: Arc<Generation>,
    /// The token sampled last, to be fed by the next decode step; None while prefilling.
    next: Option<u32>,
    /// Order of arrival: the oldest prefilling request gets the next chunk.
    seq: u64,
    /// Its slot's index.
    slot: usize,
    /// When its first prefill part started, and when its last one ended.
    prefill_start: Option<Instant>,
    prefill_end: Option<Instant>,
    /// An echo with logprobs: the logprobs of the prompt tokens scored so far, from the second.
    scored: Vec<Logprob>,
}

impl Job {
    /// Whether its prompt is scored: every position's logits give the next prompt token's
    /// logprob (echo with logprobs), so no position can come from a cache.
    fn scored(&self) -> bool {
        self.gen.echo && self.gen.logprobs.is_some()
    }
}

impl Task {
    /// The slot board's entry for this request (`running`: it still holds its slot).
    fn shown(&self, running: bool) -> SlotInfo {
        SlotInfo {
            processing: running,
            task: Some(SlotTask {
                id: self.seq,
                gen: self.gen.clone(),
                n_prompt: self.job.prompt.len(),
                n_prompt_processed: self.n_processed,
                n_cached: self.n_cached,
                n_decoded: self.n_gen,
                n_remain: self.job.max_tokens.saturating_sub(self.n_gen),
                has_new_line: self.has_new_line,
                has_next_token: running,
            }),
        }
    }
}

struct Slot<'m, B: Backend> {
    session: Session<'m, B>,
    /// The tokens whose K/V the session holds (len = session.pos()).
    cached: Vec<u32>,
    /// How many of them (from the first) a prefill computed; the rest were decoded.
    prefilled: usize,
    task: Option<Task>,
    /// When the slot last took a request (least recently used slots are taken first).
    used: u64,
}

impl<B: Backend> Slot<'_, B> {
    /// Takes the slot's request off it, leaving it on the board as ended.
    fn end_task(&mut self, board: &SlotBoard) -> Option<Task> {
        let t = self.task.take()?;
        board.set(t.slot, t.shown(false));
        Some(t)
    }
}

/// What became of a request after a token was sampled.
enum Outcome {
    Continue,
    Finished,
    /// The client went away.
    Gone,
}

pub struct Engine<'m, B: Backend> {
    model: &'m Model<B>,
    tok: &'m Tokenizer,
    metrics: &'m Metrics,
    slots: Vec<Slot<'m, B>>,
    queue: VecDeque<Job>,
    group: DecodeGroup<B>,
    n_ctx: usize,
    clock: u64,
    /// DRY's breakers by breaker list, built when a DRY request first brings the list, most
    /// recently used first (`MAX_DRY_LISTS` in all).
    dry: Vec<(Vec<String>, Arc<DryBreakers>)>,
    /// Prefixes the slots gave up, in host memory (`with_host_cache`).
    host: HostCache,
}

/// How many breaker lists `Engine::dry` keeps.
const MAX_DRY_LISTS: usize = 4;

/// DRY's sequence breakers as token sequences for `tok`'s vocabulary, as llama.cpp's
/// `llama_sampler_init_dry` makes them: each token's text is its piece as llama.cpp's
/// detokenize of it alone gives it (`Tokenizer::detokenized_piece`), and a breaker's rest is
/// tokenized without special tokens.
pub fn dry_breakers(tok: &Tokenizer, breakers: &[String]) -> DryBreakers {
    let pieces: Vec<&[u8]> = (0..tok.n_vocab() as u32)
        .map(|id| tok.detokenized_piece(id).unwrap_or(b""))
        .collect();
    DryBreakers::new(&pieces, breakers, |text| {
        tok.encode_bytes(text, false, false)
    })
}

/// The breakers of `list` from the cache, built when absent; the least recently used list is
/// dropped.
fn dry_breakers_of(
    cache: &mut Vec<(Vec<String>, Arc<DryBreakers>)>,
    tok: &Tokenizer,
    list: &[String],
) -> Arc<DryBreakers> {
    let entry = match cache.iter().position(|(l, _)| l.as_slice() == list) {
        Some(i) => cache.remove(i),
        None => (list.to_vec(), Arc::new(dry_breakers(tok, list))),
    };
    let breakers = entry.1.clone();
    cache.insert(0, entry);
    cache.truncate(MAX_DRY_LISTS);
    breakers
}

impl<'m, B: Backend> Engine<'m, B> {
    pub fn new(
        model: &'m Model<B>,
        tok: &'m Tokenizer,
        metrics: &'m Metrics,
        n_parallel: usize,
        n_ctx: usize,
    ) -> muser_engine::Result<Engine<'m, B>> {
        let slots = (0..n_parallel)
            .map(|_| {
                Ok(Slot {
                    session: Session::new(model, n_ctx)?,
                    cached: Vec::new(),
                    prefilled: 0,
                    task: None,
                    used: 0,
                })
            })
            .collect::<muser_engine::Result<_>>()?;
        metrics
            .kv_capacity
            .store((n_parallel * n_ctx) as u64, Relaxed);
        metrics.slots.reset(n_parallel);
        Ok(Engine {
            model,
            tok,
            metrics,
            slots,
            queue: VecDeque::new(),
            group: DecodeGroup::new(),
            n_ctx,
            clock: 0,
            dry: Vec::new(),
            host: HostCache::new(0),
        })
    }

    /// Keeps up to `bytes` of the prefixes slots give up in host memory (`HostCache`; 0, the
    /// default: none).
    pub fn with_host_cache(mut self, bytes: usize) -> Self {
        self.host = HostCache::new(bytes);
        self
    }

    /// Runs until the job channel closes and the last request is done.
    pub fn run(&mut self, jobs: Receiver<Work>) {
        loop {
            if !self.busy() {
                match jobs.recv() {
                    Ok(w) => self.take(w),
                    Err(_) => return,
                }
            }
            loop {
                match jobs.try_recv() {
                    Ok(w) => self.take(w),
                    Err(TryRecvError::Empty) => break,
                    Err(TryRecvError::Disconnected) if self.busy() => break,
                    Err(TryRecvError::Disconnected) => return,
                }
            }
            self.step();
        }
    }

    fn take(&mut self, w: Work) {
        match w {
            Work::Job(j) => self.push(*j),
            Work::Slot(r) => {
                let _ = r.reply.send(self.slot_action(r.slot, &r.action));
            }
            Work::Embed(r) => {
                let _ = r.reply.send(self.embed(&r.job));
            }
        }
    }

    /// Each text of an embeddings request run whole on a session of its own (no slot's cache
    /// is touched), its tokens' states pooled and normalized (`crate::embed`).
    pub fn embed(
        &mut self,
        job: &crate::embed::EmbedJob,
    ) -> Result<Vec<crate::embed::Embedded>, crate::error::ApiError> {
        use crate::embed::{normalize, Embedded, Pooling};
        let n_embd = self.model.config.n_embd;
        job.inputs
            .iter()
            .map(|tokens| {
                let fail = |e: muser_engine::EngineError| {
                    crate::error::ApiError::internal(format!("embedding failed: {e}"))
                };
                let mut session = Session::new(self.model, tokens.len()).map_err(fail)?;
                let states = session.embed(tokens).map_err(fail)?;
                let mut vectors = job.pooling.pool(&states, n_embd);
                if job.pooling != Pooling::None {
                    vectors = vectors
                        .iter()
                        .map(|v| normalize(v, job.normalize))
                        .collect();
                }
                Ok(Embedded {
                    vectors,
                    n_tokens: tokens.len(),
                })
            })
            .collect()
    }

    /// Saves slot `i`'s computed positions to a file, takes them from one, or empties the
    /// slot (llama-server's answers: `n_saved` / `n_restored` with the bytes and milliseconds,
    /// `n_erased`). A slot running a request is busy (503).
    pub fn slot_action(
        &mut self,
        i: usize,
        action: &SlotAction,
    ) -> Result<serde_json::Value, crate::error::ApiError> {
        use crate::error::ApiError;
        use serde_json::json;
        let same = self.model.backend().prefill_matches_decode();
        let n_vocab = self.model.config.n_vocab;
        let n_ctx = self.n_ctx;
        let Some(slot) = self.slots.get_mut(i) else {
            return Err(ApiError::param(
                "id_slot",
                format!("there is no slot {i} (the server has {})", self.slots.len()),
            ));
        };
        if slot.task.is_some() {
            return Err(ApiError::unavailable(format!(
                "slot {i} is running a request: try again when it is done"
            )));
        }
        let t0 = Instant::now();
        let ms = || t0.elapsed().as_secs_f64() * 1e3;
        match action {
            SlotAction::Save { path, filename } => {
                let valid = if same {
                    slot.cached.len()
                } else {
                    slot.prefilled
                };
                let snap = slot.session.save(valid).ok_or_else(|| {
                    ApiError::internal(format!("slot {i}'s cache no longer holds its positions"))
                })?;
                let written = crate::slot_file::write(path, &slot.cached[..valid], &snap, n_vocab)
                    .map_err(|e| ApiError::internal(format!("cannot write {filename}: {e}")))?;
                Ok(json!({"id_slot": i, "filename": filename, "n_saved": valid,
                          "n_written": written, "timings": {"save_ms": ms()}}))
            }
            SlotAction::Restore { path, filename } => {
                let bad = |why: String| ApiError::param("filename", format!("{filename}: {why}"));
                let (snap, tokens, file_vocab, read) = crate::slot_file::read(path).map_err(bad)?;
                if file_vocab != n_vocab || tokens.iter().any(|&t| t as usize >= n_vocab) {
                    return Err(bad(format!(
                        "it was saved for a vocabulary of {file_vocab} tokens, this model has {n_vocab}"
                    )));
                }
                if !slot.session.restore(&snap) {
                    return Err(bad(format!(
                        "its {} positions and layers do not fit this model's cache of {n_ctx} positions",
                        tokens.len()
                    )));
                }
                slot.cached = tokens;
                slot.prefilled = slot.cached.len();
                Ok(
                    json!({"id_slot": i, "filename": filename, "n_restored": slot.cached.len(),
                          "n_read": read, "timings": {"restore_ms": ms()}}),
                )
            }
            SlotAction::Erase => {
                let n = slot.session.pos();
                slot.session.reset();
                slot.cached.clear();
                slot.prefilled = 0;
                Ok(json!({"id_slot": i, "n_erased": n}))
            }
        }
    }

    /// Queues a job (`Metrics::queued` counts it already: the handler added it).
    pub fn push(&mut self, job: Job) {
        self.queue.push_back(job);
    }

    /// Whether a request is waiting or running.
    pub fn busy(&self) -> bool {
        !self.queue.is_empty() || self.slots.iter().any(|s| s.task.is_some())
    }

    /// One scheduling step (see the module header).
    pub fn step(&mut self) {
        self.drop_gone();
        self.assign();
        self.decode_step();
        self.prefill_step();
        let m = self.metrics;
        let running = self.slots.iter().filter(|s| s.task.is_some()).count();
        m.running.store(running as u64, Relaxed);
        let kv: usize = self.slots.iter().map(|s| s.session.pos()).sum();
        m.kv_tokens.store(kv as u64, Relaxed);
        m.slots.set_all(
            self.slots
                .iter()
                .filter_map(|s| s.task.as_ref())
                .map(|t| (t.slot, t.shown(true))),
        );
    }

    fn drop_gone(&mut self) {
        let m = self.metrics;
        for s in &mut self.slots {
            if s.task.as_ref().is_some_and(|t| t.job.events.is_closed()) {
                s.end_task(&m.slots);
                Metrics::add(&m.requests_cancelled, 1);
            }
        }
        self.queue.retain(|j| {
            let gone = j.events.is_closed();
            if gone {
                m.queued.fetch_sub(1, Relaxed);
                Metrics::add(&m.requests_cancelled, 1);
            }
            !gone
        });
    }

    /// Waiting requests into idle slots, oldest first, each into the idle slot sharing the
    /// longest prefix with its prompt (the least recently used among equals), with a longer
    /// prefix copied from another slot where one holds it; a request whose prompt shares a
    /// longer prefix with one being prefilled waits for it (`awaits_prefix`).
    fn assign(&mut self) {
        let same = self.model.backend().prefill_matches_decode();
        loop {
            // (no idle slot: nothing to look for in the queue)
            if self.slots.iter().all(|s| s.task.is_some()) {
                return;
            }
            let Some(k) = (0..self.queue.len()).find(|&k| {
                let job = &self.queue[k];
                job.scored() || !self.awaits_prefix(&job.prompt, same)
            }) else {
                return;
            };
            let job = &self.queue[k];
            let best = self
                .slots
                .iter()
                .enumerate()
                .filter(|(_, s)| s.task.is_none())
                .max_by_key(|(_, s)| (reusable(s, &job.prompt, same), std::cmp::Reverse(s.used)))
                .map(|(i, _)| i);
            let Some(i) = best else { return };
            let job = self.queue.remove(k).expect("a waiting request");
            self.metrics.queued.fetch_sub(1, Relaxed);
            self.clock += 1;
            // (a scored prompt keeps none of the slot's cache)
            let keeps: &[u32] = if job.scored() { &[] } else { &job.prompt };
            self.stash(i, keeps, same);
            if !job.scored() {
                self.copy_shared_prefix(i, &job.prompt, same);
            }
            let slot = &mut self.slots[i];
            slot.used = self.clock;

            // Keep the shared prefix, less one token: the last prompt position must run to
            // give the logits of the first generated token. A scored prompt keeps none.
            let common = if job.scored() {
                0
            } else {
                reusable(slot, &job.prompt, same).min(job.prompt.len() - 1)
            };
            slot.session.rewind(common);
            slot.cached.truncate(slot.session.pos());
            slot.prefilled = slot.prefilled.min(slot.session.pos());
            let n_cached = slot.session.pos();
            Metrics::add(&self.metrics.cached_tokens, n_cached as u64);

            let mut sampler = Sampler::new(job.gen.params.clone());
            // ignore_eos: end tokens are never picked (llama-server bans them), so the text
            // runs on without their markup.
            if job.gen.ignore_eos {
                sampler.set_banned(self.tok.eog_ids().to_vec());
            }
            if job.gen.params.dry_on() {
                let list = &job.gen.params.dry_sequence_breakers;
                sampler.set_dry_breakers(dry_breakers_of(&mut self.dry, self.tok, list));
            }
            if let Some(c) = &job.gen.grammar {
                match &c.triggers {
                    None => sampler.set_grammar(c.grammar.clone(), c.vocab.clone()),
                    Some(t) => {
                        sampler.set_lazy_grammar(c.grammar.clone(), c.vocab.clone(), t.clone())
                    }
                }
            }
            for &t in &job.prompt {
                sampler.accept(t);
            }
            let task = Task {
                stop: StopBuffer::new(&job.gen.stop),
                gen: Arc::new(job.gen.clone()),
                job,
                sampler,
                decoder: StreamDecoder::new(),
                decoded: 0,
                n_gen: 0,
                n_cached,
                n_processed: 0,
                has_new_line: false,
                next: None,
                seq: self.clock,
                slot: i,
                prefill_start: None,
                prefill_end: None,
                scored: Vec::new(),
            };
            self.metrics.slots.set(i, task.shown(true));
            slot.task = Some(task);
        }
    }

    /// The longest prefix of `prompt` (less its last position, which must run) that a slot
    /// other than `except` holds for it, and that slot.
    fn donor(&self, prompt: &[u32], same: bool, except: usize) -> Option<(usize, usize)> {
        self.slots
            .iter()
            .enumerate()
            .filter(|&(d, _)| d != except)
            .map(|(d, s)| (d, reusable(s, prompt, same).min(prompt.len() - 1)))
            .max_by_key(|&(_, c)| c)
    }

    /// Saves slot `i`'s computed prefix to the host cache before a request for `prompt` takes
    /// the slot, where the request keeps `MIN_SHARED` positions fewer of it and neither the
    /// host cache nor another slot holds it.
    fn stash(&mut self, i: usize, prompt: &[u32], same: bool) {
        let slot = &self.slots[i];
        let valid = if same {
            slot.cached.len()
        } else {
            slot.prefilled
        };
        if !self.host.is_on() || valid < reusable(slot, prompt, same) + MIN_SHARED {
            return;
        }
        let tokens = &slot.cached[..valid];
        let elsewhere =
            self.slots.iter().enumerate().any(|(d, s)| {
                d != i && reusable_prefix(&s.cached, s.prefilled, tokens, same) == valid
            });
        if elsewhere || self.host.holds(tokens) {
            return;
        }
        if let Some(snap) = slot.session.save(valid) {
            self.host.insert(tokens.to_vec(), snap, self.clock);
            self.metrics
                .host_bytes
                .store(self.host.bytes() as u64, Relaxed);
            self.metrics
                .host_tokens
                .store(self.host.tokens() as u64, Relaxed);
        }
    }

    /// Gives slot `i`, taking a request for `prompt`, the longest prefix another slot or the
    /// host cache holds for it, where that is `MIN_SHARED` positions more than slot i holds: a
    /// copy of the other slot's cache, or the host cache's entry taken back.
    fn copy_shared_prefix(&mut self, i: usize, prompt: &[u32], same: bool) {
        let own = reusable(&self.slots[i], prompt, same).min(prompt.len() - 1);
        let donor = self.donor(prompt, same, i);
        let host = self.host.best(prompt, prompt.len() - 1);
        let (c, h) = (donor.map_or(0, |d| d.1), host.map_or(0, |h| h.1));
        if let Some((e, h)) = host.filter(|_| h > c && h >= own + MIN_SHARED) {
            let (tokens, snap) = self.host.take(e, self.clock);
            let slot = &mut self.slots[i];
            // (back to the h positions the prompt shares: a ring that no longer holds what
            // position h sees leaves the slot empty, nothing restored)
            if slot.session.restore(snap) && slot.session.rewind(h) {
                slot.cached = tokens[..h].to_vec();
                slot.prefilled = h;
                Metrics::add(&self.metrics.restored_tokens, h as u64);
            } else {
                slot.session.reset();
                slot.cached.clear();
                slot.prefilled = 0;
            }
            return;
        }
        let Some((d, c)) = donor.filter(|_| c >= own + MIN_SHARED) else {
            return;
        };
        let (dst, src) = if i < d {
            let (a, b) = self.slots.split_at_mut(d);
            (&mut a[i], &b[0])
        } else {
            let (a, b) = self.slots.split_at_mut(i);
            (&mut b[0], &a[d])
        };
        if dst.session.copy_prefix_from(&src.session, c) {
            dst.cached = src.cached[..c].to_vec();
            dst.prefilled = c.min(src.prefilled);
            Metrics::add(&self.metrics.copied_tokens, c as u64);
        }
    }

    /// Whether a request for `prompt` should wait: a slot is prefilling a prompt that shares
    /// `MIN_SHARED` positions more with it than any cache holds now, so that they are copied
    /// once computed rather than computed again beside it.
    fn awaits_prefix(&self, prompt: &[u32], same: bool) -> bool {
        let last = prompt.len() - 1;
        let held = self
            .slots
            .iter()
            .map(|s| reusable(s, prompt, same).min(last))
            .chain(self.host.best(prompt, last).map(|h| h.1))
            .max()
            .unwrap_or(0);
        let coming = self
            .slots
            .iter()
            .filter_map(|s| s.task.as_ref().filter(|t| t.next.is_none()))
            .map(|t| shared_len(&t.job.prompt, prompt).min(last))
            .max()
            .unwrap_or(0);
        coming >= held + MIN_SHARED
    }

    fn decode_step(&mut self) {
        let rows: Vec<usize> = (0..self.slots.len())
            .filter(|&i| {
                self.slots[i]
                    .task
                    .as_ref()
                    .is_some_and(|t| t.next.is_some())
            })
            .collect();
        if rows.is_empty() {
            return;
        }
        let tokens: Vec<u32> = rows
            .iter()
            .map(|&i| self.slots[i].task.as_ref().and_then(|t| t.next).unwrap())
            .collect();
        let (nv, k_max) = (self.model.config.n_vocab, self.model.backend().top_k_max());
        let need: Vec<RowNeed> = rows
            .iter()
            .map(|&i| {
                let t = self.slots[i].task.as_ref().unwrap();
                row_need(&t.sampler, t.job.gen.logprobs.is_some(), nv, k_max)
            })
            .collect();
        let t0 = Instant::now();
        let result = {
            let mut sessions: Vec<&mut Session<'m, B>> = self
                .slots
                .iter_mut()
                .filter(|s| s.task.as_ref().is_some_and(|t| t.next.is_some()))
                .map(|s| &mut s.session)
                .collect();
            self.group.decode_rows(&mut sessions, &tokens, &need)
        };
        let m = self.metrics;
        Metrics::add(&m.decode_ns, t0.elapsed().as_nanos() as u64);
        Metrics::add(&m.decode_steps, 1);
        Metrics::add(&m.decode_rows, rows.len() as u64);
        let c = self.model.backend().step_counts();
        m.steps_replayed.store(c.replayed, Relaxed);
        m.steps_recorded.store(c.recorded, Relaxed);
        m.steps_direct.store(c.direct, Relaxed);
        let got = match result {
            Ok(p) => p,
            Err(e) => {
                // The group is checked before anything runs, so no session moved.
                for &i in &rows {
                    self.fail(i, format!("decode failed: {e}"));
                }
                return;
            }
        };
        // Each slot's share of the step (None: not decoded this step). The decoded slots' next
        // tokens are drawn (from their logits or top-k candidates) with the logprobs of those
        // that asked for them, one slot per core (each has its own sampler; a 202k vocabulary
        // takes ~0.2 ms a row to sample, ~1 ms to normalize), then handed out in slot order.
        let mut slot_got: Vec<Option<RowGot>> = vec![None; self.slots.len()];
        for (&i, g) in rows.iter().zip(got) {
            slot_got[i] = Some(g);
        }
        let mut picks: Vec<Option<Pick>> = {
            use rayon::prelude::*;
            self.slots
                .par_iter_mut()
                .zip(slot_got)
                .map(|(s, g)| match (&mut s.task, g) {
                    (Some(t), Some(g)) => {
                        let logits = s.session.logits();
                        let id = match g {
                            RowGot::Argmax(id) => Some(id),
                            RowGot::TopK(top) => t.sampler.try_sample_top_k(
                                top.into_iter()
                                    .map(|(id, logit)| Candidate { id, logit, p: 0.0 })
                                    .collect(),
                            ),
                            RowGot::Logits => t.sampler.try_sample(logits),
                        };
                        Some(id.map(|id| (id, t.job.gen.logprobs.map(|n| logprob(logits, id, n)))))
                    }
                    _ => None,
                })
                .collect()
        };
        for (&i, &t) in rows.iter().zip(&tokens) {
            let slot = &mut self.slots[i];
            slot.cached.push(t);
            slot.task.as_mut().unwrap().next = None;
            self.after_logits(i, picks[i].take());
        }
    }

    /// Prefill within a budget of `CHUNK_IDLE` tokens, `CHUNK_BUSY` while a slot decodes: the
    /// oldest prompt first, then the next ones while budget is left (short prompts arriving
    /// together start together), all their parts in one forward pass (`prefill_runs`). Its
    /// matmuls compute each column as it is computed alone, so a prompt gets the same bits
    /// however it is cut into parts and whatever it shares a pass with.
    fn prefill_step(&mut self) {
        let decoding = self
            .slots
            .iter()
            .any(|s| s.task.as_ref().is_some_and(|t| t.next.is_some()));
        let mut budget = if decoding { CHUNK_BUSY } else { CHUNK_IDLE };
        let mut waiting: Vec<usize> = (0..self.slots.len())
            .filter(|&i| {
                self.slots[i]
                    .task
                    .as_ref()
                    .is_some_and(|t| t.next.is_none())
            })
            .collect();
        waiting.sort_by_key(|&i| self.slots[i].task.as_ref().unwrap().seq);
        // A scored prompt runs alone once it is the oldest, and waits till then.
        let scored = |i: &usize| self.slots[*i].task.as_ref().unwrap().job.scored();
        if let Some(i) = waiting.first().filter(|i| scored(i)) {
            let n_vocab = self.model.config.n_vocab;
            return self.score_step(*i, budget.min(scored_chunk(n_vocab)));
        }
        waiting.retain(|i| !scored(i));
        // (slot, tokens of this part, whether it ends the prompt)
        let mut parts: Vec<(usize, usize, bool)> = Vec::new();
        for i in waiting {
            let slot = &self.slots[i];
            let rest = slot.task.as_ref().unwrap().job.prompt.len() - slot.session.pos();
            let n = rest.min(budget);
            if n > 0 {
                parts.push((i, n, n == rest));
                budget -= n;
            }
            if budget == 0 {
                break;
            }
        }
        if parts.is_empty() {
            return;
        }
        let t0 = Instant::now();
        for &(i, _, _) in &parts {
            let task = self.slots[i].task.as_mut().unwrap();
            task.prefill_start.get_or_insert(t0);
        }
        let result = {
            let mut picked: Vec<(usize, &mut Slot<'m, B>)> = self
                .slots
                .iter_mut()
                .enumerate()
                .filter(|(i, _)| parts.iter().any(|p| p.0 == *i))
                .collect();
            picked.sort_by_key(|(i, _)| parts.iter().position(|p| p.0 == *i));
            let mut sessions = Vec::with_capacity(parts.len());
            let mut prompts = Vec::with_capacity(parts.len());
            for ((_, slot), &(_, n, _)) in picked.iter_mut().zip(&parts) {
                let Slot { session, task, .. } = &mut **slot;
                let at = session.pos();
                prompts.push(&task.as_ref().unwrap().job.prompt[at..at + n]);
                sessions.push(session);
            }
            prefill_runs(&mut sessions, &prompts)
        };
        let m = self.metrics;
        Metrics::add(&m.prefill_ns, t0.elapsed().as_nanos() as u64);
        Metrics::add(&m.prefill_passes, 1);
        for (i, n, last) in parts {
            match &result {
                Ok(()) => self.prefilled(i, n, last),
                // Prompts are checked by the handler (ids, room); this is a bug, not a hang.
                Err(e) => self.prefill_failed(i, e),
            }
        }
    }

    /// Scores the next `n` positions (at most) of slot i's prompt, a request with echo and
    /// logprobs, in a pass of their own that reads back every position's logits: each gives
    /// the next prompt token's logprob (the last, the first generated token's logits).
    fn score_step(&mut self, i: usize, n: usize) {
        use rayon::prelude::*;
        let t0 = Instant::now();
        let nv = self.model.config.n_vocab;
        let slot = &mut self.slots[i];
        let task = slot.task.as_mut().unwrap();
        task.prefill_start.get_or_insert(t0);
        let at = slot.session.pos();
        let prompt = &task.job.prompt;
        let rest = prompt.len() - at;
        let n = n.min(rest);
        let result = slot.session.prefill_all(&prompt[at..at + n]);
        let m = self.metrics;
        Metrics::add(&m.prefill_ns, t0.elapsed().as_nanos() as u64);
        Metrics::add(&m.prefill_passes, 1);
        match result {
            Ok(all) => {
                let top = task.job.gen.logprobs.unwrap_or(0);
                // row j (position at + j) gives token at + j + 1, where the prompt has one
                let next = &prompt[at + 1..(at + n + 1).min(prompt.len())];
                let lps: Vec<Logprob> = all
                    .par_chunks_exact(nv)
                    .zip(next.par_iter())
                    .map(|(row, &id)| logprob(row, id, top))
                    .collect();
                task.scored.extend(lps);
                self.prefilled(i, n, n == rest);
            }
            Err(e) => self.prefill_failed(i, &e),
        }
    }

    /// Books `n` positions of slot i's prompt as computed; `last`: the prompt is done, and its
    /// first token is drawn (after its echo, where asked for).
    fn prefilled(&mut self, i: usize, n: usize, last: bool) {
        Metrics::add(&self.metrics.prompt_tokens, n as u64);
        let slot = &mut self.slots[i];
        let at = slot.session.pos() - n;
        let task = slot.task.as_mut().unwrap();
        task.n_processed += n;
        slot.cached.extend_from_slice(&task.job.prompt[at..at + n]);
        slot.prefilled = slot.session.pos();
        if last {
            task.prefill_end = Some(Instant::now());
            if task.job.gen.echo {
                // (a client gone by now is noticed when its first token or end is sent)
                let e = echo(task, self.tok);
                let _ = task.job.events.send(Event::Prompt(e));
            }
            self.after_logits(i, None);
        }
    }

    fn prefill_failed(&mut self, i: usize, e: &muser_engine::EngineError) {
        let slot = &mut self.slots[i];
        slot.session.reset();
        slot.cached.clear();
        slot.prefilled = 0;
        self.fail(i, format!("prefill failed: {e}"));
    }

    /// Hands slot i's next token to the client: `pick` (already drawn from its session's
    /// logits by its sampler, or on the backend, with its logprob when asked for) or, when
    /// None, drawn now. A request whose logits leave no token to pick (every one -inf or not a
    /// number) ends with an error instead of a token it was never given.
    fn after_logits(&mut self, i: usize, pick: Option<Pick>) {
        let slot = &mut self.slots[i];
        let pos = slot.session.pos();
        let task = slot.task.as_mut().unwrap();
        if task.job.max_tokens == 0 {
            // (echo with max_tokens 0: the prompt was all that was asked for)
            let outcome = finish(task, FinishReason::Length, true, None, self.metrics);
            return self.settle(i, outcome);
        }
        let pick = pick.unwrap_or_else(|| {
            let logits = slot.session.logits();
            let id = task.sampler.try_sample(logits)?;
            Some((id, task.job.gen.logprobs.map(|n| logprob(logits, id, n))))
        });
        let Some((id, lp)) = pick else {
            if let Some(why) = task.sampler.grammar_failure() {
                return self.fail_grammar(i, format!("the grammar cannot be followed: {why}"));
            }
            if task.sampler.has_grammar() {
                return self.fail_grammar(
                    i,
                    "no token can be sampled: no token the grammar allows next has a finite, \
                     non-zero probability after the samplers (check the grammar or JSON schema \
                     against the model's vocabulary, and the sampler settings such as logit_bias)"
                        .into(),
                );
            }
            return self.fail(
                i,
                "no token can be sampled: after the samplers no candidate has a finite, non-zero \
                 probability (every logit -inf or not a number; check the sampler settings, \
                 e.g. dynatemp_exponent or logit_bias)"
                    .into(),
            );
        };
        if let Err(e) = task.sampler.accept_generated(id) {
            return self.fail_grammar(
                i,
                format!("the grammar cannot follow the sampled token: {e}"),
            );
        }
        let outcome = emit(task, lp, id, self.tok, pos, self.n_ctx, self.metrics);
        self.settle(i, outcome);
    }

    /// Frees slot i where its request has ended (`outcome` of its last event).
    fn settle(&mut self, i: usize, outcome: Outcome) {
        let (slot, m) = (&mut self.slots[i], self.metrics);
        match outcome {
            Outcome::Continue => {}
            Outcome::Finished => {
                slot.end_task(&m.slots);
                Metrics::add(&m.requests_finished, 1);
            }
            Outcome::Gone => {
                slot.end_task(&m.slots);
                Metrics::add(&m.requests_cancelled, 1);
            }
        }
    }

    fn fail(&mut self, i: usize, msg: String) {
        self.fail_with(i, crate::error::ApiError::internal(msg));
    }

    /// Ends slot i's request with a 400 naming its grammar.
    /// Ends request i with a 400 naming the field its grammar came from (`grammar`,
    /// `json_schema`, `response_format`, or `tools` for a tool call's grammar).
    fn fail_grammar(&mut self, i: usize, msg: String) {
        let field = self.slots[i]
            .task
            .as_ref()
            .and_then(|t| t.job.gen.grammar.as_ref())
            .map_or("grammar", |c| c.field);
        self.fail_with(i, crate::error::ApiError::param(field, msg));
    }

    fn fail_with(&mut self, i: usize, e: crate::error::ApiError) {
        if let Some(mut t) = self.slots[i].end_task(&self.metrics.slots) {
            drop(std::mem::take(&mut t.job.ticket));
            let _ = t.job.events.send(Event::Error(e));
        }
    }
}

/// How many leading positions of `slot`'s cache a request for `prompt` can reuse: the shared
/// prefix, within the prefilled part unless prefilled and decoded positions have the same bits
/// (`same`).
fn reusable<B: Backend>(slot: &Slot<'_, B>, prompt: &[u32], same: bool) -> usize {
    reusable_prefix(&slot.cached, slot.prefilled, prompt, same)
}

/// How many leading tokens `a` and `b` share.
pub(crate) fn shared_len(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

/// `reusable` over a cache's tokens, the first `prefilled` of them from a prefill.
fn reusable_prefix(cached: &[u32], prefilled: usize, prompt: &[u32], same: bool) -> usize {
    let common = shared_len(cached, prompt);
    if same {
        common
    } else {
        common.min(prefilled)
    }
}

/// The logprobs of an answer that does not stream, each with its token's text offset, less
/// those of the tokens a stop string ended it inside: a token whose text starts at or past the
/// end of the returned text gave it nothing (as llama-server leaves the stop word's tokens out).
pub fn before_stop(lps: Vec<(Logprob, usize)>, text: &str, f: &Finish) -> Vec<Logprob> {
    let keep = |offset: usize| f.stop_word.is_none() || offset < text.len();
    lps.into_iter()
        .filter(|&(_, o)| keep(o))
        .map(|(l, _)| l)
        .collect()
}

/// Takes the sampled token `id` (its sampler has accepted it), releases its text and decides
/// whether the request goes on.
/// The echo of a request's prompt (`Event::Prompt`): its tokens decoded as generated text is
/// (control tokens the request does not preserve give none), with the scored logprobs.
fn echo(task: &mut Task, tok: &Tokenizer) -> Echo {
    let mut dec = StreamDecoder::new();
    let (mut text, mut offsets) = (String::new(), Vec::new());
    for &id in &task.job.prompt {
        offsets.push(text.len());
        let special = task.job.gen.preserved.binary_search(&id).is_ok();
        text.push_str(&dec.push_special(tok, id, special).unwrap_or_default());
    }
    text.push_str(&dec.flush());
    let lps = task.job.scored().then(|| {
        std::iter::once(None)
            .chain(task.scored.drain(..).map(Some))
            .collect()
    });
    Echo {
        ids: task.job.prompt.clone(),
        text,
        offsets,
        lps,
    }
}

fn emit(
    task: &mut Task,
    logprob: Option<Logprob>,
    id: u32,
    tok: &Tokenizer,
    pos: usize,
    n_ctx: usize,
    m: &Metrics,
) -> Outcome {
    if tok.is_eog(id) && !task.job.gen.ignore_eos {
        return finish(task, FinishReason::Stop, true, None, m);
    }
    task.n_gen += 1;
    Metrics::add(&m.generated_tokens, 1);
    // An id past the tokenizer's vocabulary (a model whose output is wider) gives no text.
    let special = task.job.gen.preserved.binary_search(&id).is_ok();
    let piece = task
        .decoder
        .push_special(tok, id, special)
        .unwrap_or_default();
    let offset = task.decoded;
    task.decoded += piece.len();
    let r = task.stop.push(&piece);
    task.has_new_line |= r.text.contains('\n');
    let token = Event::Token {
        id: Some(id),
        text: r.text,
        logprob,
        offset,
        slot: task.slot,
    };
    if task.job.events.send(token).is_err() {
        return Outcome::Gone;
    }
    if r.stop.is_some() {
        return finish(task, FinishReason::Stop, false, r.stop, m);
    }
    // With ignore_eos an end of generation does not end the request, but once its grammar is
    // complete nothing else can follow: it ends here, as it would on that end.
    if task.job.gen.ignore_eos && task.sampler.grammar_must_end() {
        return finish(task, FinishReason::Stop, true, None, m);
    }
    if task.n_gen >= task.job.max_tokens || pos >= n_ctx {
        return finish(task, FinishReason::Length, true, None, m);
    }
    task.next = Some(id);
    Outcome::Continue
}

/// Ends a request: releases what the decoder and stop buffer hold (unless a stop string ended
/// it: `stop_word`), then sends the usage.
fn finish(
    task: &mut Task,
    mut reason: FinishReason,
    release: bool,
    mut stop_word: Option<String>,
    m: &Metrics,
) -> Outcome {
    let mut text = String::new();
    if release {
        let r = task.stop.push(&task.decoder.flush());
        text = r.text;
        if r.stop.is_some() {
            reason = FinishReason::Stop;
            stop_word = r.stop;
        } else {
            text.push_str(&task.stop.flush());
        }
    }
    let events = &task.job.events;
    task.has_new_line |= text.contains('\n');
    if !text.is_empty()
        && events
            .send(Event::Token {
                id: None,
                text,
                logprob: None,
                offset: task.decoded,
                slot: task.slot,
            })
            .is_err()
    {
        return Outcome::Gone;
    }
    let ms = |a: Option<Instant>, b: Instant| a.map_or(0.0, |a| (b - a).as_secs_f64() * 1e3);
    let end = task.prefill_end.unwrap_or_else(Instant::now);
    let done = Finish {
        reason,
        stop_word,
        slot: task.slot,
        prompt_tokens: task.job.prompt.len(),
        completion_tokens: task.n_gen,
        cached_tokens: task.n_cached,
        prompt_ms: ms(task.prefill_start, end),
        predicted_ms: ms(Some(end), Instant::now()),
    };
    // The request's place is given back, and its slot shown free, before its client hears the
    // end, so a client that sends its next request at once is not refused for the place its
    // last one held, nor sees the slot still busy.
    drop(std::mem::take(&mut task.job.ticket));
    m.slots.set(task.slot, task.shown(false));
    if task.job.events.send(Event::Done(done)).is_err() {
        return Outcome::Gone;
    }
    Outcome::Finished
}

/// What a decoding row takes from the backend. Rows with no logprobs asked for whose pick the
/// sampler says is the row's argmax (greedy, no penalty or bias: `Sampler::is_argmax`) get that
/// index, and rows whose pick depends only on the k best logits (`Sampler::top_k_of`, k within
/// what the backend hands over) get those k pairs: a GPU reads back an index or k pairs for them
/// instead of the vocabulary's logits. Every other row (logprobs, penalties, biases, top-n-sigma,
/// mirostat, top-k off) gets its logits, so each row's pick is the one `Sampler::sample` makes
/// from the whole row.
fn row_need(sampler: &Sampler, logprobs: bool, n_vocab: usize, k_max: usize) -> RowNeed {
    if logprobs {
        RowNeed::Logits
    } else if sampler.is_argmax() {
        RowNeed::Argmax
    } else {
        match sampler.top_k_of(n_vocab) {
            Some(k) if k <= k_max => RowNeed::TopK(k),
            _ => RowNeed::Logits,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use muser_engine::LoadOptions;
    use muser_sample::SamplerParams;
    use tokio::sync::mpsc::unbounded_channel;

    /// DRY's token texts follow llama.cpp's `detokenize({id}, special = true)`: SentencePiece's
    /// leading space (its `▁`) comes off, byte tokens are their byte, control tokens their text;
    /// byte-level BPE tokens are their bytes, a leading space kept.
    #[test]
    fn dry_pieces_are_llama_cpp_detokenized_tokens() {
        use muser_tokenizer::{TokenType, TokenizerData, TokenizerModel};
        let texts = [
            "<unk>",
            "<s>",
            "</s>",
            "<0x0A>",
            "\u{2581}a:",
            "\u{2581}b",
            "<0x20>",
        ];
        let mut d = TokenizerData::new(
            TokenizerModel::Llama,
            texts.iter().map(|t| t.to_string()).collect(),
        );
        d.token_types = vec![TokenType::Unknown, TokenType::Control, TokenType::Control]
            .into_iter()
            .chain([
                TokenType::Byte,
                TokenType::Normal,
                TokenType::Normal,
                TokenType::Byte,
            ])
            .collect();
        let spm = Tokenizer::new(d).unwrap();
        let pieces: Vec<&[u8]> = (0..7)
            .map(|id| spm.detokenized_piece(id).unwrap())
            .collect();
        let want: [&[u8]; 7] = [b"<unk>", b"<s>", b"</s>", b"\n", b"a:", b"b", b""];
        assert_eq!(pieces, want);
        // Breakers: the newline byte token and "a:" hold one; "<s>" holds none of ":" or "\n".
        let b = dry_breakers(&spm, &["\n".into(), ":".into()]);
        assert!(b.is_single_token(3) && b.is_single_token(4));
        assert!(!b.is_single_token(1) && !b.is_single_token(5));

        // Byte-level BPE: GPT-2's alphabet decoded, the leading space ("Ġ") kept.
        let mut tokens: Vec<String> = (0..=255u8)
            .map(|b| muser_tokenizer::ByteUnicode::new().char_of(b).to_string())
            .collect();
        tokens.push("\u{120}x".into());
        tokens.push("<|eot|>".into());
        let mut d = TokenizerData::new(TokenizerModel::Gpt2, tokens);
        d.token_types = vec![TokenType::Normal; 257];
        d.token_types.push(TokenType::Control);
        let bpe = Tokenizer::new(d).unwrap();
        assert_eq!(bpe.detokenized_piece(b'\n' as u32).unwrap(), b"\n");
        assert_eq!(bpe.detokenized_piece(256).unwrap(), b" x");
        assert_eq!(bpe.detokenized_piece(257).unwrap(), b"<|eot|>");
        // A two-byte breaker: "\n" heads it, its tail the tokenization of the rest.
        let b = dry_breakers(&bpe, &["\n*".into()]);
        assert_eq!(b.tails(b'\n' as u32), [vec![b'*' as u32]]);
    }

    /// The shipped default model on two CPU threads, and its tokenizer.
    fn default_model() -> (Model<muser_engine::CpuBackend>, Tokenizer) {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../models/muse-default.gguf"
        );
        let opts = LoadOptions {
            threads: Some(2),
            ..Default::default()
        };
        let model = Model::load(path, &opts).unwrap();
        let tok = Tokenizer::from_gguf(model.gguf()).unwrap();
        (model, tok)
    }

    #[test]
    fn the_slot_board_follows_a_request_and_keeps_it_when_it_ends() {
        let (model, tok) = default_model();
        let metrics = Metrics::default();
        let mut e = Engine::new(&model, &tok, &metrics, 2, 1024).unwrap();
        let shown = |i: usize| metrics.slots.snapshot()[i].clone();
        assert!(metrics
            .slots
            .snapshot()
            .iter()
            .all(|s| !s.processing && s.task.is_none()));

        // 600 prompt tokens: step 1 prefills 512 of them, step 2 the other 88 and samples the
        // first token; 5 tokens whatever they are (ignore_eos).
        let prompt: Vec<u32> = (0..600).map(|i| 10 + i % 200).collect();
        let submit = |e: &mut Engine<'_, _>| {
            let (events, rx) = unbounded_channel();
            metrics.queued.fetch_add(1, Relaxed);
            e.push(Job {
                prompt: prompt.clone(),
                gen: Generation {
                    params: SamplerParams::greedy(),
                    max_tokens: Some(5),
                    stop: Vec::new(),
                    logprobs: None,
                    echo: false,
                    stream: true,
                    include_usage: false,
                    ignore_eos: true,
                    grammar: None,
                    preserved: Vec::new(),
                },
                max_tokens: 5,
                events,
                ticket: Ticket::default(),
            });
            rx
        };
        let mut rx = submit(&mut e);
        e.step();
        let slot = (0..2)
            .find(|&i| shown(i).processing)
            .expect("a slot runs it");
        let t = shown(slot).task.unwrap();
        assert_eq!((t.id, t.n_prompt, t.n_prompt_processed), (1, 600, 512));
        assert_eq!((t.n_decoded, t.n_remain, t.has_next_token), (0, 5, true));
        assert!(t.gen.ignore_eos);
        e.step();
        assert_eq!(shown(slot).task.unwrap().n_decoded, 1);
        while e.busy() {
            e.step();
        }
        assert!(std::iter::from_fn(|| rx.try_recv().ok()).any(|ev| matches!(ev, Event::Done(_))));
        let s = shown(slot);
        let t = s.task.unwrap();
        assert!(!s.processing && !t.has_next_token);
        assert_eq!((t.n_decoded, t.n_remain, t.n_prompt_processed), (5, 0, 600));
        assert!(shown(1 - slot).task.is_none(), "the other slot ran nothing");

        // The same prompt again takes the same slot and its cache: all but the last position.
        let _rx = submit(&mut e);
        e.step();
        let t = shown(slot).task.unwrap();
        assert!(shown(slot).processing);
        assert_eq!((t.id, t.n_cached, t.n_prompt_processed), (2, 599, 1));
    }

    /// llama.cpp's samplers beside the plain ones: (what, parameters).
    fn samplers() -> Vec<(&'static str, SamplerParams)> {
        let sampled = |p: SamplerParams| SamplerParams { seed: 11, ..p };
        let greedy = |p: SamplerParams| SamplerParams {
            temperature: 0.0,
            ..sampled(p)
        };
        let d = SamplerParams::default;
        vec![
            ("greedy", greedy(d())),
            ("top-k", sampled(d())),
            ("top-k off", sampled(SamplerParams { top_k: 0, ..d() })),
            (
                "penalty",
                sampled(SamplerParams {
                    repeat_penalty: 1.3,
                    ..d()
                }),
            ),
            (
                "typical-p",
                sampled(SamplerParams {
                    typical_p: 0.5,
                    ..d()
                }),
            ),
            (
                "greedy typical-p",
                greedy(SamplerParams {
                    typical_p: 0.2,
                    ..d()
                }),
            ),
            (
                "greedy xtc",
                greedy(SamplerParams {
                    xtc_probability: 1.0,
                    xtc_threshold: 0.01,
                    ..d()
                }),
            ),
            (
                "dynatemp",
                sampled(SamplerParams {
                    dynatemp_range: 0.5,
                    ..d()
                }),
            ),
            (
                "top-n-sigma",
                sampled(SamplerParams {
                    top_n_sigma: 1.0,
                    ..d()
                }),
            ),
            ("mirostat 1", sampled(SamplerParams { mirostat: 1, ..d() })),
            (
                "mirostat 2",
                sampled(SamplerParams {
                    mirostat: 2,
                    mirostat_tau: 3.0,
                    ..d()
                }),
            ),
            (
                "greedy mirostat",
                greedy(SamplerParams { mirostat: 2, ..d() }),
            ),
            (
                "min_keep",
                sampled(SamplerParams {
                    min_keep: 5,
                    top_p: 0.1,
                    ..d()
                }),
            ),
        ]
    }

    #[test]
    fn rows_take_the_logits_where_the_sampler_reads_the_whole_row() {
        let (nv, k_max) = (4096, 64);
        for (what, p) in samplers() {
            let need = |logprobs| row_need(&Sampler::new(p.clone()), logprobs, nv, k_max);
            let want = match what {
                "greedy" | "greedy mirostat" => RowNeed::Argmax,
                "top-k" | "typical-p" | "greedy typical-p" | "greedy xtc" | "dynatemp"
                | "min_keep" => RowNeed::TopK(40),
                _ => RowNeed::Logits,
            };
            assert_eq!(need(false), want, "{what}");
            assert_eq!(need(true), RowNeed::Logits, "{what}");
        }
        // A top-k past what the backend hands over reads the logits.
        let p = SamplerParams {
            top_k: 100,
            ..Default::default()
        };
        assert_eq!(
            row_need(&Sampler::new(p), false, nv, k_max),
            RowNeed::Logits
        );
    }

    #[test]
    fn every_sampler_picks_from_the_backends_argmax_or_top_k_what_it_picks_from_the_logits() {
        let (model, tok) = default_model();
        let metrics = Metrics::default();
        let mut e = Engine::new(&model, &tok, &metrics, 1, 256).unwrap();
        let prompt = tok.encode("Once upon a time", true, false);
        // The ids a request generates: with logprobs every row is read as logits, without them
        // each row takes what `row_need` says.
        let mut run = |params: SamplerParams, logprobs: Option<usize>| {
            let (events, mut rx) = unbounded_channel();
            metrics.queued.fetch_add(1, Relaxed);
            e.push(Job {
                prompt: prompt.clone(),
                gen: Generation {
                    params,
                    max_tokens: Some(12),
                    stop: Vec::new(),
                    logprobs,
                    echo: false,
                    stream: true,
                    include_usage: false,
                    ignore_eos: true,
                    grammar: None,
                    preserved: Vec::new(),
                },
                max_tokens: 12,
                events,
                ticket: Ticket::default(),
            });
            while e.busy() {
                e.step();
            }
            std::iter::from_fn(|| rx.try_recv().ok())
                .filter_map(|ev| match ev {
                    Event::Token { id, .. } => id,
                    _ => None,
                })
                .collect::<Vec<u32>>()
        };
        let mut outputs = Vec::new();
        for (what, p) in samplers() {
            let fast = run(p.clone(), None);
            assert_eq!(fast.len(), 12, "{what}");
            assert_eq!(fast, run(p.clone(), Some(0)), "{what}: fast path vs logits");
            assert_eq!(fast, run(p, None), "{what}: same seed, same tokens");
            outputs.push((what, fast));
        }
        // XTC at probability 1 drops the likeliest tokens, so greedy with it is not greedy.
        let of = |w: &str| &outputs.iter().find(|(what, _)| *what == w).unwrap().1;
        assert_ne!(of("greedy xtc"), of("greedy"));
    }

    #[test]
    fn decoded_positions_are_reused_only_when_they_have_the_prefill_bits() {
        // A cache of a 6-token prompt and 3 generated tokens; the next prompt repeats all 9 and
        // adds 2 (a chat's next turn), or diverges at position 4.
        let cached = [11, 12, 13, 14, 15, 16, 90, 91, 92];
        let next: Vec<u32> = cached.iter().copied().chain([7, 8]).collect();
        assert_eq!(reusable_prefix(&cached, 6, &next, true), 9);
        assert_eq!(reusable_prefix(&cached, 6, &next, false), 6);
        let other = [11, 12, 13, 14, 50, 51];
        assert_eq!(reusable_prefix(&cached, 6, &other, true), 4);
        assert_eq!(reusable_prefix(&cached, 6, &other, false), 4);
        assert_eq!(reusable_prefix(&cached, 0, &next, false), 0);
        assert_eq!(reusable_prefix(&[], 0, &next, true), 0);
    }
}
