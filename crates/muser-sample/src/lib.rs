//! Sampling: pure functions on a logits slice (greedy, temperature, top-k, top-p, min-p,
//! repetition penalty) chained in llama.cpp's default order, with a seeded MT19937.
//!
//! This crate owns the choice of the next token from a row of logits, and nothing else: it
//! never sees the model, the tokenizer or a backend.
//!
//! The chain follows llama.cpp's `common_params_sampling::samplers` default (common/common.h,
//! 2025-2026): penalties -> dry -> top_n_sigma -> top_k -> typical_p -> top_p -> min_p -> xtc
//! -> temperature, then `dist` (the seeded draw). DRY, top-n-sigma, typical-p and XTC are off
//! at llama.cpp's defaults and are not implemented here, so the chain is
//! penalties -> top_k -> top_p -> min_p -> temperature -> dist.
//!
//! Temperature 0 is greedy: the argmax of the penalised logits (lowest id on ties), the same
//! token llama.cpp's chain picks at temperature 0, but without drawing from the generator.
//!
//! The generator is MT19937 (`std::mt19937`) seeded with the low 32 bits of `seed`, and a
//! draw turns two outputs into a uniform double the way libstdc++ does, so a given seed,
//! parameter set and logits row picks the same token as llama.cpp (ties aside, see `steps`).

mod steps;

pub use steps::{
    apply_penalties, candidates_from_logits, dist, greedy, min_p, softmax, temperature,
    token_logprobs, top_k, top_k_logits, top_logprobs, top_p, uniform_f64, Candidate,
};

use rand_mt::Mt;
use std::collections::VecDeque;

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
}

impl SamplerParams {
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

/// A sampler: the parameters, the generator state and the recent-token history.
pub struct Sampler {
    params: SamplerParams,
    rng: Mt,
    /// The last `repeat_last_n` accepted tokens, oldest first.
    history: VecDeque<u32>,
}

impl Sampler {
    pub fn new(params: SamplerParams) -> Self {
        let rng = Mt::new(params.seed as u32);
        Sampler {
            params,
            rng,
            history: VecDeque::new(),
        }
    }

    pub fn params(&self) -> &SamplerParams {
        &self.params
    }

    /// The pick is the first maximum of the raw logits: greedy with no penalty in effect, so
    /// a backend's own argmax may stand in for `sample`.
    pub fn is_argmax(&self) -> bool {
        let p = &self.params;
        p.temperature <= 0.0
            && p.logit_bias.is_empty()
            && (p.repeat_last_n == 0
                || p.repeat_penalty == 1.0
                    && p.frequency_penalty == 0.0
                    && p.presence_penalty == 0.0)
    }

    /// Some(k) when the pick depends only on the `k` best-ranked raw logits of a vocabulary of
    /// `vocab` entries (`top_k_logits`): sampling (temperature above 0) with top-k below the
    /// vocabulary and no penalty in effect. A backend may then hand over those candidates
    /// instead of the row, and `sample_top_k` picks what `sample` would.
    pub fn top_k_of(&self, vocab: usize) -> Option<usize> {
        let p = &self.params;
        let no_penalty = p.repeat_last_n == 0
            || p.repeat_penalty == 1.0 && p.frequency_penalty == 0.0 && p.presence_penalty == 0.0;
        let raw = no_penalty && p.logit_bias.is_empty();
        (p.temperature > 0.0 && p.top_k > 0 && p.top_k < vocab && raw).then_some(p.top_k)
    }

    /// The pick from a row's `top_k_logits(row, k)` when `top_k_of` gave k: the same token
    /// (and generator state) as `sample(row)`. Returns 0 when no candidate can be picked;
    /// `try_sample_top_k` reports that case instead.
    pub fn sample_top_k(&mut self, cands: Vec<Candidate>) -> u32 {
        self.try_sample_top_k(cands).unwrap_or(0)
    }

    /// As `sample_top_k`, but `None` when no candidate can be picked (as `try_sample`).
    pub fn try_sample_top_k(&mut self, cands: Vec<Candidate>) -> Option<u32> {
        self.sample_top(cands)
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
        let p = &self.params;
        let history = self.history.make_contiguous();
        // The biases first, on a copy of the row when there are any.
        let biased = steps::biased_logits(logits, &p.logit_bias);
        let logits = &*biased;
        // Greedy, and top-k from k below the vocabulary, look at the logits once without making a
        // candidate of every token (0.8 MB of logits, 2.4 MB of candidates on a 202k
        // vocabulary), with the same picks: the penalties on a copy of the logits first.
        if p.temperature <= 0.0 || (p.top_k > 0 && p.top_k < logits.len()) {
            let row = steps::penalized_logits(
                logits,
                history,
                p.repeat_penalty,
                p.frequency_penalty,
                p.presence_penalty,
            );
            if p.temperature <= 0.0 {
                return greedy(&row);
            }
            let cands = steps::top_k_of_logits(&row, p.top_k);
            return self.sample_top(cands);
        }
        // Top-k off (or past the vocabulary): every token is a candidate.
        let mut cands = candidates_from_logits(logits);
        p.penalize(&mut cands, history);
        top_k(&mut cands, p.top_k);
        self.sample_top(cands)
    }

    /// The chain after top-k: top-p, min-p, temperature, then the draw; `None` (no draw) when no
    /// candidate is above -inf.
    fn sample_top(&mut self, mut cands: Vec<Candidate>) -> Option<u32> {
        if !steps::any_pickable(&cands) {
            return None;
        }
        let p = &self.params;
        top_p(&mut cands, p.top_p, 1);
        min_p(&mut cands, p.min_p, 1);
        temperature(&mut cands, p.temperature);
        dist(&mut cands, &mut self.rng).map(|i| cands[i].id)
    }

    /// Records a token that was emitted (or fed as prompt) for the penalties' window.
    pub fn accept(&mut self, token: u32) {
        if self.params.repeat_last_n == 0 {
            return;
        }
        if self.history.len() == self.params.repeat_last_n {
            self.history.pop_front();
        }
        self.history.push_back(token);
    }

    /// Forgets the history and reseeds the generator from the parameters.
    pub fn reset(&mut self) {
        self.history.clear();
        self.rng = Mt::new(self.params.seed as u32);
    }
}

#[cfg(test)]
mod tests;
