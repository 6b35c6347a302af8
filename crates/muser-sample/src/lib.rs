//! Sampling: pure functions on a logits slice (greedy, temperature, dynamic temperature, top-k,
//! top-p, min-p, typical-p, top-n-sigma, XTC, mirostat 1 and 2, repetition penalties) chained in
//! llama.cpp's default order, with seeded MT19937 generators.
//!
//! This crate owns the choice of the next token from a row of logits, and nothing else: it
//! never sees the model, the tokenizer or a backend.
//!
//! The chain follows llama.cpp's common sampler (common/sampling.cpp, with the
//! `common_params_sampling` defaults and sampler order of common/common.h, 2025-2026): the logit
//! biases, then penalties -> dry -> top_n_sigma -> top_k -> typical_p -> top_p -> min_p -> xtc
//! -> temperature (dynamic when `dynatemp_range > 0`), then `dist` (the seeded draw). DRY's
//! sequence breakers are strings matched against the vocabulary's text, which this crate never
//! sees: the caller turns them into token sequences once (`DryBreakers::new`) and hands them to
//! the sampler (`Sampler::set_dry_breakers`). Every step but the penalties, top-k and min-p is
//! off at llama.cpp's defaults. With `mirostat` 1 or 2 llama.cpp replaces everything after the biases
//! (the penalties included) by plain temperature and the mirostat draw, and so does this crate.
//!
//! Temperature 0 is greedy: the argmax of the penalised logits (lowest id on ties), the same
//! token llama.cpp's chain picks at temperature 0, but without drawing from the generator. With
//! typical-p or XTC on, which can drop the argmax, it is the argmax of what they leave (XTC still
//! draws its chance); with a dynamic range it is not greedy (llama.cpp samples at a temperature
//! up to the range); with mirostat it is the argmax of the biased logits, the penalties not
//! applied, as in llama.cpp.
//!
//! The generators are MT19937 (`std::mt19937`) seeded with the low 32 bits of `seed`, and a
//! draw turns outputs into a uniform the way libstdc++ does, so a given seed, parameter set and
//! logits row picks the same token as llama.cpp (ties aside, see `steps`). As in llama.cpp, XTC
//! has a generator of its own (seeded alike) and mirostat draws from the one `dist` would use.
//!
//! A grammar (`Sampler::set_grammar`: GBNF from muser-grammar, with the vocabulary's text made
//! by the caller, as for DRY) constrains the generated tokens the way llama.cpp's common sampler
//! applies its grammar sampler: the chain picks, the pick stands if the grammar allows it, else
//! the grammar's rejects go to -inf and the chain picks again from the row. A lazy grammar
//! (`Sampler::set_lazy_grammar`, llama.cpp's grammar triggers) constrains nothing, and leaves
//! the sampler's fast paths on, until a trigger token is generated or a trigger pattern is
//! found in the text generated so far; it then starts at the trigger, is fed the text from
//! there, and constrains the rest as a grammar does.
//!
//! Top-n-sigma, DRY and mirostat read the whole row (its standard deviation; mirostat's softmax over
//! every token and its vocabulary size; DRY can push a token of the top k below one outside
//! it): with any of them on, a backend's top-k candidates cannot
//! stand in for the row (`Sampler::top_k_of` says None). Typical-p, XTC and dynamic temperature
//! come after top-k and can.

mod dry;
mod lazy;
mod steps;

pub use dry::{
    dry, dry_penalties, DryBreakers, DryParams, DRY_MAX_BREAKER_BYTES, DRY_MAX_BREAKER_TAIL,
};

pub use steps::{
    apply_penalties, candidates_from_logits, dist, greedy, min_p, mirostat, mirostat_v2, softmax,
    temperature, temperature_ext, token_logprobs, top_k, top_k_logits, top_logprobs, top_n_sigma,
    top_p, typical, uniform_f32, uniform_f64, xtc, Candidate,
};

pub use lazy::{TriggerKind, Triggers};
pub use muser_grammar::{Grammar, GrammarError, GrammarState, Vocab as GrammarVocab};

use rand_mt::Mt;
use std::collections::VecDeque;
use std::sync::Arc;

/// The m of mirostat 1.0: how many of the most likely tokens estimate the Zipf exponent
/// (llama.cpp's common sampler passes 100).
pub const MIROSTAT_M: usize = 100;

/// llama.cpp's `LLAMA_DEFAULT_SEED`. llama.cpp replaces it with a random seed; here it is an
/// ordinary, fixed seed, so runs are reproducible unless the caller picks a seed.
pub const DEFAULT_SEED: u64 = 0xFFFF_FFFF;

/// Sampling parameters, with llama.cpp's defaults.
#[derive(Clone, Debug, PartialEq)]
pub struct SamplerParams {
    /// 0 (or below) = greedy.
    pub temperature: f32,
    /// 0 = off.
    pub top_k: usize,
    /// >= 1 = off.
    pub top_p: f32,
    /// <= 0 = off.
    pub min_p: f32,
    /// 1 = off.
    pub repeat_penalty: f32,
    /// How many of the most recent accepted tokens the penalties look at; 0 = off.
    pub repeat_last_n: usize,
    /// Subtracted once per occurrence in the window; 0 = off.
    pub frequency_penalty: f32,
    /// Subtracted once if the token occurs in the window; 0 = off.
    pub presence_penalty: f32,
    /// MT19937 seed; only the low 32 bits are used (llama.cpp's seed is a u32).
    pub seed: u64,
    /// (token id, bias) pairs added to those tokens' logits before everything else (llama.cpp's
    /// `logit_bias` sampler, first in its chain; OpenAI's `logit_bias`). Ids past the row are
    /// ignored; empty = off.
    pub logit_bias: Vec<(u32, f32)>,
    /// Typical-p (locally typical sampling): keeps the tokens whose surprise is closest to the
    /// entropy until their mass exceeds it; >= 1 = off.
    pub typical_p: f32,
    /// Top-n-sigma: masks the logits below max - n * std of the row; <= 0 = off (llama.cpp's
    /// default is -1).
    pub top_n_sigma: f32,
    /// XTC: the chance of removing the likelier tokens above `xtc_threshold`; <= 0 = off.
    pub xtc_probability: f32,
    /// XTC: the probability at or above which a token counts as a top choice; > 0.5 = off.
    pub xtc_threshold: f32,
    /// Dynamic temperature: the temperature ranges over temperature +- this, by the entropy;
    /// <= 0 = off (plain temperature).
    pub dynatemp_range: f32,
    /// Dynamic temperature: the power of the normalised entropy that maps it to the range.
    pub dynatemp_exponent: f32,
    /// 0 = off, 1 = mirostat 1.0, 2 = mirostat 2.0 (then only the biases, temperature and the
    /// mirostat draw run; other values are refused by `check` and leave the ordinary chain).
    pub mirostat: u32,
    /// Mirostat: the target surprise (entropy) tau, in bits; `mu` starts at 2 tau.
    pub mirostat_tau: f32,
    /// Mirostat: the learning rate eta of `mu`.
    pub mirostat_eta: f32,
    /// The fewest candidates top-p, min-p, typical-p and XTC leave (llama.cpp's common
    /// `min_keep`); 0 = no floor (each leaves at least one anyway).
    pub min_keep: usize,
    /// DRY: the penalty for extending a repeat of `dry_allowed_length` tokens; 0 = off.
    pub dry_multiplier: f32,
    /// DRY: the penalty grows by this factor per token of repeat past `dry_allowed_length`;
    /// below 1 = off (llama.cpp's server puts its default, 1.75, in its place).
    pub dry_base: f32,
    /// DRY: the longest repeat that goes unpenalised.
    pub dry_allowed_length: usize,
    /// DRY: how many of the most recent accepted tokens it searches for repeats; 0 = off (a
    /// caller that wants the whole context passes its size).
    pub dry_penalty_last_n: usize,
    /// DRY: the sequence breakers, strings that end a repeat. The sampler uses the token
    /// sequences the caller makes of them (`DryBreakers::new`, `Sampler::set_dry_breakers`);
    /// this list is what the caller makes them from.
    pub dry_sequence_breakers: Vec<String>,
}

impl SamplerParams {
    /// Why the chain cannot run with these parameters: a parameter that is NaN or infinite (a
    /// NaN logit bias too; -inf and +inf biases are bans and forced picks), or a mirostat other
    /// than 0, 1 or 2. Each message names the field and its value.
    pub fn check(&self) -> Result<(), String> {
        let numbers = [
            ("temperature", self.temperature),
            ("top_p", self.top_p),
            ("min_p", self.min_p),
            ("repeat_penalty", self.repeat_penalty),
            ("frequency_penalty", self.frequency_penalty),
            ("presence_penalty", self.presence_penalty),
            ("typical_p", self.typical_p),
            ("top_n_sigma", self.top_n_sigma),
            ("xtc_probability", self.xtc_probability),
            ("xtc_threshold", self.xtc_threshold),
            ("dynatemp_range", self.dynatemp_range),
            ("dynatemp_exponent", self.dynatemp_exponent),
            ("mirostat_tau", self.mirostat_tau),
            ("mirostat_eta", self.mirostat_eta),
            ("dry_multiplier", self.dry_multiplier),
            ("dry_base", self.dry_base),
        ];
        for (name, v) in numbers {
            if !v.is_finite() {
                return Err(format!("{name} must be a finite number, got {v}"));
            }
        }
        if let Some(&(id, _)) = self.logit_bias.iter().find(|(_, b)| b.is_nan()) {
            return Err(format!("logit_bias for token {id} is NaN"));
        }
        if self.mirostat > 2 {
            return Err(format!(
                "mirostat must be 0 (off), 1 (mirostat 1.0) or 2 (mirostat 2.0), got {}",
                self.mirostat
            ));
        }
        Ok(())
    }

    /// Whether mirostat replaces the chain after the biases.
    fn mirostat_on(&self) -> bool {
        matches!(self.mirostat, 1 | 2)
    }

    /// Whether a penalty changes logits once the window holds tokens.
    fn penalties_on(&self) -> bool {
        self.repeat_last_n != 0
            && !(self.repeat_penalty == 1.0
                && self.frequency_penalty == 0.0
                && self.presence_penalty == 0.0)
    }

    /// Whether a step after top-k can move the pick off the argmax at temperature 0 (typical-p
    /// and XTC can drop it; a dynamic range samples).
    fn moves_greedy(&self) -> bool {
        self.typical_p < 1.0
            || (self.xtc_probability > 0.0 && self.xtc_threshold <= 0.5)
            || self.dynatemp_on()
    }

    /// Whether DRY is in the chain (llama.cpp's `llama_sampler_init_dry` leaves it out
    /// otherwise): a multiplier, a base of at least 1 and a window. The caller prepares its
    /// breakers (`Sampler::set_dry_breakers`) only then.
    pub fn dry_on(&self) -> bool {
        self.dry_multiplier != 0.0 && self.dry_base >= 1.0 && self.dry_penalty_last_n != 0
    }

    /// DRY's numbers.
    fn dry_params(&self) -> DryParams {
        DryParams {
            multiplier: self.dry_multiplier,
            base: self.dry_base,
            allowed_length: self.dry_allowed_length,
        }
    }

    /// Whether the temperature is dynamic (llama.cpp's `temp_ext` with a range).
    fn dynatemp_on(&self) -> bool {
        self.dynatemp_range > 0.0
    }

    /// Whether the ordinary chain's pick is the first maximum of the penalised logits:
    /// temperature 0 with nothing after top-k that moves it.
    fn picks_argmax(&self) -> bool {
        self.temperature <= 0.0 && !self.moves_greedy()
    }

    /// `apply_penalties` with these parameters' penalties.
    pub fn penalize(&self, cands: &mut [Candidate], history: &[u32]) {
        apply_penalties(
            cands,
            history,
            self.repeat_penalty,
            self.frequency_penalty,
            self.presence_penalty,
        );
    }
}

impl Default for SamplerParams {
    fn default() -> Self {
        SamplerParams {
            temperature: 0.8,
            top_k: 40,
            top_p: 0.95,
            min_p: 0.05,
            repeat_penalty: 1.0,
            repeat_last_n: 64,
            frequency_penalty: 0.0,
            presence_penalty: 0.0,
            seed: DEFAULT_SEED,
            logit_bias: Vec::new(),
            typical_p: 1.0,
            top_n_sigma: -1.0,
            xtc_probability: 0.0,
            xtc_threshold: 0.1,
            dynatemp_range: 0.0,
            dynatemp_exponent: 1.0,
            mirostat: 0,
            mirostat_tau: 5.0,
            mirostat_eta: 0.1,
            min_keep: 0,
            dry_multiplier: 0.0,
            dry_base: 1.75,
            dry_allowed_length: 2,
            dry_penalty_last_n: 64,
            dry_sequence_breakers: ["\n", ":", "\"", "*"].map(String::from).to_vec(),
        }
    }
}

impl SamplerParams {
    /// Greedy decoding: temperature 0, everything else default.
    pub fn greedy() -> Self {
        SamplerParams {
            temperature: 0.0,
            ..Default::default()
        }
    }
}

/// A sampler: the parameters, the generator states and the recent-token history.
pub struct Sampler {
    params: SamplerParams,
    /// `dist`'s generator (mirostat's when mirostat is on).
    rng: Mt,
    /// XTC's own generator, seeded alike.
    xtc_rng: Mt,
    /// Mirostat's running target surprise, 2 tau at the start.
    mu: f32,
    /// The last `repeat_last_n` accepted tokens, oldest first.
    history: VecDeque<u32>,
    /// DRY's window: the last `dry_penalty_last_n` accepted tokens, oldest first (empty while
    /// DRY is off).
    dry_history: VecDeque<u32>,
    /// DRY's sequence breakers as token sequences (none until `set_dry_breakers`).
    dry_breakers: Arc<DryBreakers>,
    /// The grammar the generated tokens must follow (`set_grammar`), with the vocabulary as it
    /// sees it.
    grammar: Option<Constrained>,
    /// Tokens never picked, sorted (`set_banned`).
    banned: Arc<[u32]>,
}

/// A grammar's state in a generation, with what it starts from and the vocabulary's text.
struct Constrained {
    grammar: Arc<Grammar>,
    vocab: Arc<GrammarVocab>,
    state: GrammarState,
    /// A lazy grammar's triggers and buffer (`set_lazy_grammar`).
    lazy: Option<lazy::Lazy>,
}

impl Constrained {
    /// Whether a lazy grammar still awaits its trigger (and constrains nothing).
    fn awaiting(&self) -> bool {
        self.lazy.as_ref().is_some_and(|l| l.awaiting)
    }

    /// Why the grammar can no longer be followed: its state failed, or a lazy grammar's
    /// trigger pattern failed at run time.
    fn failure(&self) -> Option<&GrammarError> {
        self.lazy
            .as_ref()
            .and_then(|l| l.failure.as_ref())
            .or_else(|| self.state.failure())
    }

    fn allows(&self, token: u32) -> bool {
        self.failure().is_none() && self.state.allows(&self.vocab, token)
    }

    fn mask_logits(&self, logits: &mut [f32]) {
        if self.failure().is_some() {
            logits.fill(f32::NEG_INFINITY);
        } else {
            self.state.mask_logits(&self.vocab, logits);
        }
    }

    fn accept(&mut self, token: u32) -> Result<(), GrammarError> {
        if let Some(e) = self.failure() {
            return Err(e.clone());
        }
        match &mut self.lazy {
            Some(l) if l.awaiting => l.accept(&mut self.state, &self.vocab, token),
            _ => self.state.accept(&self.vocab, token),
        }
    }
}

impl Sampler {
    pub fn new(params: SamplerParams) -> Self {
        let seed = params.seed as u32;
        Sampler {
            rng: Mt::new(seed),
            xtc_rng: Mt::new(seed),
            mu: 2.0 * params.mirostat_tau,
            params,
            history: VecDeque::new(),
            dry_history: VecDeque::new(),
            dry_breakers: Arc::default(),
            grammar: None,
            banned: Arc::from([]),
        }
    }

    /// Constrains the generated tokens to `grammar` (llama.cpp's grammar sampler, as its common
    /// sampler runs it): a pick is made by the chain as usual and kept when the grammar allows
    /// it; otherwise every token the grammar rejects is set to -inf in the row and the chain
    /// picks again (drawing again from its generators, as llama.cpp does). `vocab` is each
    /// token's text and whether it ends generation; an end-of-generation token is allowed only
    /// where the grammar may end. Generated tokens advance the grammar through
    /// `accept_generated`; prompt tokens (`accept`) do not.
    pub fn set_grammar(&mut self, grammar: Arc<Grammar>, vocab: Arc<GrammarVocab>) {
        self.grammar = Some(Constrained {
            state: GrammarState::new(grammar.clone()),
            grammar,
            vocab,
            lazy: None,
        });
    }

    /// As `set_grammar`, but lazy (llama.cpp's lazy grammar sampler, with its trigger tokens
    /// and patterns): until `triggers` fire the grammar constrains nothing, and every pick,
    /// `is_argmax` and `top_k_of` are what they are without a grammar. The generated tokens
    /// (`accept_generated`) fire it: a trigger token, fed to the grammar; or a pattern found in
    /// the text generated since the start (or `reset`), the first that matches in the order
    /// given: the grammar is then fed that text from the pattern's first non-empty capture
    /// group (else its whole match) on, the token the start falls inside only its bytes from
    /// there. From then on it constrains the picks as `set_grammar`'s does. Patterns are
    /// searched in the text's complete characters (an invalid UTF-8 sequence reads as U+FFFD);
    /// a pattern that fails at run time (fancy-regex's backtracking limit) fails the grammar
    /// (`grammar_failure`, and the error from `accept_generated`). While it awaits, each
    /// generated token searches the patterns in all the text generated so far, as llama.cpp
    /// does: O(n) per token after n bytes (a word only looks at the new bytes).
    pub fn set_lazy_grammar(
        &mut self,
        grammar: Arc<Grammar>,
        vocab: Arc<GrammarVocab>,
        triggers: Arc<Triggers>,
    ) {
        self.grammar = Some(Constrained {
            state: GrammarState::new(grammar.clone()),
            grammar,
            vocab,
            lazy: Some(lazy::Lazy::new(triggers)),
        });
    }

    /// Whether a grammar is attached (constraining, or lazy and awaiting its trigger).
    pub fn has_grammar(&self) -> bool {
        self.grammar.is_some()
    }

    /// Whether a lazy grammar awaits its trigger: the picks are then unconstrained.
    pub fn grammar_awaiting_trigger(&self) -> bool {
        self.grammar.as_ref().is_some_and(|g| g.awaiting())
    }

    /// The grammar while it constrains the picks (not a lazy one awaiting its trigger).
    fn constraining(&self) -> Option<&Constrained> {
        self.grammar.as_ref().filter(|g| !g.awaiting())
    }

    /// Why the grammar can no longer be followed, when it cannot: a grammar whose parse grew
    /// past the engine's bounds (`GrammarState::failure`), or a lazy grammar's trigger pattern
    /// that failed at run time. Every pick is then refused.
    pub fn grammar_failure(&self) -> Option<String> {
        self.grammar
            .as_ref()
            .and_then(|g| g.failure())
            .map(|e| e.to_string())
    }

    /// Whether the grammar (if any, and not awaiting its trigger) leaves nothing to generate
    /// but an end of generation.
    pub fn grammar_must_end(&self) -> bool {
        self.constraining()
            .is_some_and(|g| g.failure().is_none() && g.state.must_end())
    }

    /// DRY's sequence breakers, made by the caller from the vocabulary and
    /// `params().dry_sequence_breakers` (`DryBreakers::new`); without them DRY runs with none,
    /// as llama.cpp does with an empty breaker list. They can be shared by every sampler of the
    /// same vocabulary and breaker list.
    pub fn set_dry_breakers(&mut self, breakers: Arc<DryBreakers>) {
        self.dry_breakers = breakers;
    }

    pub fn params(&self) -> &SamplerParams {
        &self.params
    }

    /// Mirostat's current `mu` (2 tau until a mirostat pick moves it).
    pub fn mirostat_mu(&self) -> f32 {
        self.mu
    }

    /// The pick is the first maximum of the raw logits: greedy with no penalty in effect, so
    /// a backend's own argmax may stand in for `sample`. With mirostat, temperature 0 and no
    /// bias (its chain has no penalties); `mu` then stays as it is, which changes no pick while
    /// the temperature is 0.
    pub fn is_argmax(&self) -> bool {
        self.banned.is_empty() && self.argmax_unbanned()
    }

    /// Never picks `ids`: their logits count as -inf, as llama-server bans the end-of-generation
    /// tokens with a -inf bias for `ignore_eos`. Unlike a bias it keeps the backend's fast
    /// paths: `top_k_of` asks for as many more candidates as there are banned tokens (the
    /// k best of the others are among them), and `try_sample_top_k` drops the banned ones.
    pub fn set_banned(&mut self, mut ids: Vec<u32>) {
        ids.sort_unstable();
        ids.dedup();
        self.banned = ids.into();
    }

    /// `is_argmax` without the banned tokens.
    fn argmax_unbanned(&self) -> bool {
        let p = &self.params;
        if self.constraining().is_some() {
            return false;
        }
        if p.mirostat_on() {
            return p.temperature <= 0.0 && p.logit_bias.is_empty();
        }
        p.picks_argmax() && p.logit_bias.is_empty() && !p.penalties_on() && !p.dry_on()
    }

    /// Some(k) when the pick depends only on the `k` best-ranked raw logits of a vocabulary of
    /// `vocab` entries (`top_k_logits`): sampling (temperature above 0, or a step after top-k that
    /// moves a greedy pick) with top-k below the vocabulary, no penalty in effect, and none of
    /// top-n-sigma, DRY and mirostat (they read the whole row; DRY's penalties can move a token
    /// of the raw top k below one outside it). A backend may then hand over those
    /// candidates instead of the row, and `sample_top_k` picks what `sample` would.
    pub fn top_k_of(&self, vocab: usize) -> Option<usize> {
        let p = &self.params;
        let raw = !p.penalties_on() && p.logit_bias.is_empty();
        let whole_row = p.mirostat_on() || p.top_n_sigma > 0.0 || p.dry_on();
        let sampled = p.temperature > 0.0 || p.moves_greedy();
        let whole_row = whole_row || self.constraining().is_some();
        let k = (sampled && p.top_k > 0 && p.top_k < vocab && raw && !whole_row).then_some(p.top_k);
        if self.banned.is_empty() {
            return k;
        }
        // The best k that are not banned are among the best k + banned of the row.
        k.or(self.banned_argmax().then_some(1))
            .map(|k| k + self.banned.len())
            .filter(|&k| k < vocab)
    }

    /// The pick is the first maximum of the row once the banned tokens are out (mirostat's
    /// temperature-0 argmax aside: its `mu` update reads the row).
    fn banned_argmax(&self) -> bool {
        self.argmax_unbanned() && !self.params.mirostat_on()
    }

    /// The pick from a row's `top_k_logits(row, k)` when `top_k_of` gave k: the same token
    /// (and generator state) as `sample(row)`. Returns 0 when no candidate can be picked;
    /// `try_sample_top_k` reports that case instead.
    pub fn sample_top_k(&mut self, cands: Vec<Candidate>) -> u32 {
        self.try_sample_top_k(cands).unwrap_or(0)
    }

    /// As `sample_top_k`, but `None` when no candidate can be picked (as `try_sample`).
    pub fn try_sample_top_k(&mut self, mut cands: Vec<Candidate>) -> Option<u32> {
        if !self.banned.is_empty() {
            // `top_k_of` asked for the banned tokens' number more: the rest, cut back.
            cands.retain(|c| self.banned.binary_search(&c.id).is_err());
            let keep = if self.banned_argmax() {
                1
            } else {
                self.params.top_k
            };
            if keep > 0 {
                cands.truncate(keep);
            }
        }
        if self.constraining().is_none() {
            return self.sample_top(cands);
        }
        // Not reached through `top_k_of` (None with a grammar), but kept right: the grammar's
        // check, then its mask on the candidates and a second pick.
        let first = self.sample_top(cands.clone());
        if first.is_some_and(|id| self.grammar_allows(id)) {
            return first;
        }
        let g = self.constraining().unwrap();
        let cands = cands
            .into_iter()
            .map(|mut c| {
                if !g.allows(c.id) {
                    c.logit = f32::NEG_INFINITY;
                }
                c
            })
            .collect();
        self.sample_top(cands)
    }

    /// Whether the grammar (if any, and not awaiting its trigger) allows `token` next.
    fn grammar_allows(&self, token: u32) -> bool {
        self.constraining().is_none_or(|g| g.allows(token))
    }

    /// Picks the next token from one row of logits (one per vocabulary entry). NaN and -inf
    /// logits are never picked. Returns 0 when no token can be picked; `try_sample` reports
    /// that case instead, and a caller that shows the pick to anyone should use it.
    pub fn sample(&mut self, logits: &[f32]) -> u32 {
        self.try_sample(logits).unwrap_or(0)
    }

    /// As `sample`, but `None` when no token can be picked: after the biases and penalties every
    /// logit is NaN or -inf (every token banned, or a row of NaN), or the row is empty. No draw
    /// is made then.
    pub fn try_sample(&mut self, logits: &[f32]) -> Option<u32> {
        if self.banned.is_empty() {
            return self.try_sample_unbanned(logits);
        }
        let mut row = logits.to_vec();
        for &id in self.banned.iter() {
            if let Some(l) = row.get_mut(id as usize) {
                *l = f32::NEG_INFINITY;
            }
        }
        self.try_sample_unbanned(&row)
    }

    /// `try_sample` once the banned tokens are out of the row.
    fn try_sample_unbanned(&mut self, logits: &[f32]) -> Option<u32> {
        if self.constraining().is_none() {
            return self.try_sample_chain(logits);
        }
        // llama.cpp's common sampler: the chain's pick, kept if the grammar allows it; else the
        // row with the grammar's rejects at -inf, through the chain again.
        let first = self.try_sample_chain(logits);
        if first.is_some_and(|id| self.grammar_allows(id)) {
            return first;
        }
        let g = self.constraining().unwrap();
        let mut masked = logits.to_vec();
        g.mask_logits(&mut masked);
        self.try_sample_chain(&masked)
    }

    /// The chain without the grammar.
    fn try_sample_chain(&mut self, logits: &[f32]) -> Option<u32> {
        let p = &self.params;
        // The biases first, on a copy of the row when there are any.
        let biased = steps::biased_logits(logits, &p.logit_bias);
        let logits = &*biased;
        if p.mirostat_on() {
            return self.sample_mirostat(logits);
        }
        let history = self.history.make_contiguous();
        // Greedy, and top-k from k below the vocabulary, look at the logits once without making a
        // candidate of every token (0.8 MB of logits, 2.4 MB of candidates on a 202k
        // vocabulary), with the same picks: the penalties (and top-n-sigma's mask) on a copy of
        // the logits first. Top-n-sigma never masks the maximum, so greedy skips it.
        if p.picks_argmax() || (p.top_k > 0 && p.top_k < logits.len()) {
            let mut row = steps::penalized_logits(
                logits,
                history,
                p.repeat_penalty,
                p.frequency_penalty,
                p.presence_penalty,
            );
            if p.dry_on() {
                let dry_history = self.dry_history.make_contiguous();
                if let Some(dried) =
                    dry::dry_logits(&row, dry_history, &p.dry_params(), &self.dry_breakers)
                {
                    row = std::borrow::Cow::Owned(dried);
                }
            }
            if p.picks_argmax() {
                return greedy(&row);
            }
            let row = steps::top_n_sigma_logits(&row, p.top_n_sigma);
            let cands = steps::top_k_of_logits(&row, p.top_k);
            return self.sample_top(cands);
        }
        // Top-k off (or past the vocabulary): every token is a candidate.
        let mut cands = candidates_from_logits(logits);
        p.penalize(&mut cands, history);
        if p.dry_on() {
            let dry_history = self.dry_history.make_contiguous();
            dry(&mut cands, dry_history, &p.dry_params(), &self.dry_breakers);
        }
        top_n_sigma(&mut cands, p.top_n_sigma);
        top_k(&mut cands, p.top_k);
        self.sample_top(cands)
    }

    /// The chain after top-k: typical-p, top-p, min-p, XTC, temperature (dynamic or plain), then
    /// the draw; `None` (no draw) when no candidate is above -inf. At temperature 0 without a
    /// dynamic range, the first maximum of what XTC leaves, without a draw from `dist`'s
    /// generator.
    fn sample_top(&mut self, mut cands: Vec<Candidate>) -> Option<u32> {
        if !steps::any_pickable(&cands) {
            return None;
        }
        let p = &self.params;
        // llama.cpp passes min_keep 0 to top-p and min-p, which keep one all the same.
        let keep = p.min_keep.max(1);
        typical(&mut cands, p.typical_p, p.min_keep);
        top_p(&mut cands, p.top_p, keep);
        min_p(&mut cands, p.min_p, keep);
        xtc(
            &mut cands,
            p.xtc_probability,
            p.xtc_threshold,
            p.min_keep,
            &mut self.xtc_rng,
        );
        if p.temperature <= 0.0 && !p.dynatemp_on() {
            return steps::argmax_index(&cands).map(|i| cands[i].id);
        }
        temperature_ext(
            &mut cands,
            p.temperature,
            p.dynatemp_range,
            p.dynatemp_exponent,
        );
        dist(&mut cands, &mut self.rng).map(|i| cands[i].id)
    }

    /// llama.cpp's chain with mirostat on, after the biases: temperature, then mirostat 1.0 or
    /// 2.0 (its draw from `dist`'s generator, and `mu`'s update). `None` (no draw) when no
    /// candidate is above -inf.
    fn sample_mirostat(&mut self, logits: &[f32]) -> Option<u32> {
        let mut cands = candidates_from_logits(logits);
        if !steps::any_pickable(&cands) {
            return None;
        }
        let p = &self.params;
        temperature(&mut cands, p.temperature);
        let (tau, eta) = (p.mirostat_tau, p.mirostat_eta);
        let i = if p.mirostat == 1 {
            mirostat(
                &mut cands,
                logits.len(),
                tau,
                eta,
                MIROSTAT_M,
                &mut self.mu,
                &mut self.rng,
            )
        } else {
            mirostat_v2(&mut cands, tau, eta, &mut self.mu, &mut self.rng)
        };
        i.map(|i| cands[i].id)
    }

    /// Records a generated token: the penalties' window (`accept`) and the grammar, which must
    /// allow it (an error names the token otherwise, and nothing is recorded). A lazy grammar
    /// awaiting its trigger takes any token, and errs only when the token fires it and the
    /// grammar rejects the text from the trigger on, or a trigger pattern fails at run time
    /// (the window is then not updated either).
    pub fn accept_generated(&mut self, token: u32) -> Result<(), GrammarError> {
        if let Some(g) = &mut self.grammar {
            g.accept(token)?;
        }
        self.accept(token);
        Ok(())
    }

    /// Records a token that was emitted (or fed as prompt) for the penalties' window; the
    /// grammar does not see it (`accept_generated` does both).
    pub fn accept(&mut self, token: u32) {
        push_window(&mut self.history, self.params.repeat_last_n, token);
        if self.params.dry_on() {
            push_window(&mut self.dry_history, self.params.dry_penalty_last_n, token);
        }
    }

    /// Forgets the history, reseeds the generators from the parameters, sets mirostat's `mu`
    /// back to 2 tau and starts the grammar over (a lazy one awaits its trigger again).
    pub fn reset(&mut self) {
        self.history.clear();
        self.dry_history.clear();
        self.rng = Mt::new(self.params.seed as u32);
        self.xtc_rng = Mt::new(self.params.seed as u32);
        self.mu = 2.0 * self.params.mirostat_tau;
        if let Some(g) = &mut self.grammar {
            g.state = GrammarState::new(g.grammar.clone());
            if let Some(l) = &mut g.lazy {
                l.reset();
            }
        }
    }
}

/// Appends `token` to a window of the last `n` tokens (n = 0: keeps none).
fn push_window(window: &mut VecDeque<u32>, n: usize, token: u32) {
    if n == 0 {
        return;
    }
    if window.len() == n {
        window.pop_front();
    }
    window.push_back(token);
}

#[cfg(test)]
mod tests;
