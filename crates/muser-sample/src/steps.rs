//! The individual sampling steps, each a pure function on a candidate list.
//!
//! Each step reproduces the behaviour of the llama.cpp sampler of the same name (2025-2026
//! `src/llama-sampler.cpp`), with two deliberate differences, both only at the edges:
//! - ties are broken deterministically (equal logits: the lower token id ranks first), where
//!   llama.cpp's partial sort leaves the order of equal logits unspecified;
//! - NaN logits never enter a candidate list (`candidates_from_logits` drops them), where
//!   llama.cpp would let a NaN poison its sums.
//!
//! Steps that llama.cpp implements by sorting (top-k, top-p, softmax) sort here too, and steps
//! that preserve order there (penalties, min-p, temperature) preserve it here, so the list
//! the final draw walks is in the same order as llama.cpp's and a seeded draw picks the same
//! token.

use rand_mt::Mt;
use std::cmp::Ordering;

/// One entry of the candidate list: a token id, its (possibly modified) logit and, once a
/// step has computed it, its probability within the current list.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Candidate {
    pub id: u32,
    pub logit: f32,
    pub p: f32,
}

/// Every token whose logit is a number, in id order, with p = 0.
pub fn candidates_from_logits(logits: &[f32]) -> Vec<Candidate> {
    logits
        .iter()
        .enumerate()
        .filter(|(_, l)| !l.is_nan())
        .map(|(i, &logit)| Candidate {
            id: i as u32,
            logit,
            p: 0.0,
        })
        .collect()
}

/// The ranking every sorting step uses: larger logit first, then lower id first.
fn rank(a: &Candidate, b: &Candidate) -> Ordering {
    b.logit.total_cmp(&a.logit).then(a.id.cmp(&b.id))
}

/// Sorts the first `k` ranks into place (the rest follow in unspecified order).
fn sort_prefix(cands: &mut [Candidate], k: usize) {
    let k = k.min(cands.len());
    if k == 0 {
        return;
    }
    if k < cands.len() {
        cands.select_nth_unstable_by(k - 1, rank);
    }
    cands[..k].sort_unstable_by(rank);
}

/// Index of the largest logit, the first one on ties (lowest id when in id order).
pub(crate) fn argmax_index(cands: &[Candidate]) -> Option<usize> {
    let mut best: Option<usize> = None;
    for (i, c) in cands.iter().enumerate() {
        match best {
            Some(b) if cands[b].logit >= c.logit => {}
            _ => best = Some(i),
        }
    }
    best
}

/// exp(logit - max), with the infinite cases made well defined: when the maximum is +inf the
/// +inf logits share the mass, when every logit is -inf they share it uniformly.
fn exp_shifted(logit: f32, max: f32) -> f32 {
    if max.is_infinite() {
        if logit == max {
            1.0
        } else {
            0.0
        }
    } else {
        (logit - max).exp()
    }
}

/// Greedy choice: the token with the largest logit, the lowest id among equals; `None` when no
/// token can be picked: every logit NaN or -inf (a banned token), or the row empty. That is the
/// first logit equal (`==`: -0.0 and +0.0 alike) to the maximum of those that are numbers
/// (`f32::max` passes NaN over): two passes the compiler vectorizes, instead of one with a
/// branch per logit (`argmax_index` over `candidates_from_logits`, the same pick).
pub fn greedy(logits: &[f32]) -> Option<u32> {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    if max == f32::NEG_INFINITY {
        return None;
    }
    logits.iter().position(|&l| l == max).map(|i| i as u32)
}

/// Whether a list holds a candidate that can be picked: one whose logit is above -inf (NaN
/// never enters a list). A list of none is what every token banned, or a row of NaN, leaves.
pub(crate) fn any_pickable(cands: &[Candidate]) -> bool {
    cands.iter().any(|c| c.logit > f32::NEG_INFINITY)
}

/// Repetition, frequency and presence penalties (llama.cpp's `penalties` sampler) over the
/// tokens in `history` (the caller passes the last N). For each candidate that occurs `c > 0`
/// times: a positive logit is divided by `repeat`, a non-positive one multiplied by it, then
/// `c * frequency + presence` is subtracted. Order is preserved.
pub fn apply_penalties(
    cands: &mut [Candidate],
    history: &[u32],
    repeat: f32,
    frequency: f32,
    presence: f32,
) {
    if !penalties_apply(history, repeat, frequency, presence) {
        return;
    }
    let counts = history_counts(history);
    for c in cands.iter_mut() {
        if let Some(&n) = counts.get(&c.id) {
            c.logit = penalized(c.logit, n, repeat, frequency, presence);
        }
    }
}

/// Whether `apply_penalties` changes anything: a history and a penalty in effect.
fn penalties_apply(history: &[u32], repeat: f32, frequency: f32, presence: f32) -> bool {
    !(history.is_empty() || repeat == 1.0 && frequency == 0.0 && presence == 0.0)
}

/// How many times each token occurs in `history`.
fn history_counts(history: &[u32]) -> std::collections::HashMap<u32, u32> {
    let mut counts = std::collections::HashMap::new();
    for &t in history {
        *counts.entry(t).or_insert(0) += 1;
    }
    counts
}

/// The logit of a token seen `n` times in the history, after the penalties.
fn penalized(logit: f32, n: u32, repeat: f32, frequency: f32, presence: f32) -> f32 {
    let l = if logit <= 0.0 {
        logit * repeat
    } else {
        logit / repeat
    };
    l - (n as f32 * frequency + presence)
}

/// `logits` with each (id, bias) of `bias` added to logit `id` (ids past the row skipped): the
/// logits themselves when there is no bias, else a copy.
pub(crate) fn biased_logits<'a>(
    logits: &'a [f32],
    bias: &[(u32, f32)],
) -> std::borrow::Cow<'a, [f32]> {
    if bias.is_empty() {
        return std::borrow::Cow::Borrowed(logits);
    }
    let mut out = logits.to_vec();
    for &(id, b) in bias {
        if let Some(l) = out.get_mut(id as usize) {
            *l += b;
        }
    }
    std::borrow::Cow::Owned(out)
}

/// `logits` with `apply_penalties`' changes: the logits themselves when no penalty is in effect,
/// else a copy in which only the history's tokens change, each found once (not a lookup per
/// vocabulary entry).
pub(crate) fn penalized_logits<'a>(
    logits: &'a [f32],
    history: &[u32],
    repeat: f32,
    frequency: f32,
    presence: f32,
) -> std::borrow::Cow<'a, [f32]> {
    if !penalties_apply(history, repeat, frequency, presence) {
        return std::borrow::Cow::Borrowed(logits);
    }
    let mut out = logits.to_vec();
    for (id, n) in history_counts(history) {
        if let Some(l) = out.get_mut(id as usize) {
            *l = penalized(*l, n, repeat, frequency, presence);
        }
    }
    std::borrow::Cow::Owned(out)
}

/// The `k` best-ranked tokens of a row of logits (the highest logit first, the lower id first
/// on ties, NaN never), with p = 0: what a sampler's top-k keeps when no penalty is in effect
/// (`Sampler::top_k_of`), and what a backend computes in its place.
pub fn top_k_logits(logits: &[f32], k: usize) -> Vec<Candidate> {
    if k == 0 {
        return Vec::new();
    }
    top_k_of_logits(logits, k)
}

/// `top_k(candidates_from_logits(logits), k)` (k > 0) in one pass over the logits: candidates
/// gather in a buffer of 2k, pruned to the k best whenever it fills; once pruned, a logit that
/// does not rank above the k-th best kept cannot (every later id is larger, so it would lose the
/// tie too) and is skipped with one comparison. The same k candidates, sorted best first.
pub(crate) fn top_k_of_logits(logits: &[f32], k: usize) -> Vec<Candidate> {
    let mut buf: Vec<Candidate> = Vec::with_capacity(2 * k);
    let mut floor: Option<f32> = None;
    for (i, &l) in logits.iter().enumerate() {
        if l.is_nan() {
            continue;
        }
        if let Some(f) = floor {
            if l < f || l.total_cmp(&f) != Ordering::Greater {
                continue;
            }
        }
        buf.push(Candidate {
            id: i as u32,
            logit: l,
            p: 0.0,
        });
        if buf.len() == 2 * k {
            buf.select_nth_unstable_by(k - 1, rank);
            buf.truncate(k);
            floor = Some(buf[k - 1].logit);
        }
    }
    top_k(&mut buf, k);
    buf
}

/// Top-k: keeps the `k` best-ranked candidates, sorted best first. `k == 0` is off (no-op).
pub fn top_k(cands: &mut Vec<Candidate>, k: usize) {
    if k == 0 {
        return;
    }
    let k = k.min(cands.len());
    sort_prefix(cands, k);
    cands.truncate(k);
}

/// Sorts best first and sets each `p` to its softmax probability within the list.
pub fn softmax(cands: &mut [Candidate]) {
    if cands.is_empty() {
        return;
    }
    let n = cands.len();
    sort_prefix(cands, n);
    let max = cands[0].logit;
    let mut sum = 0.0f64;
    for c in cands.iter_mut() {
        c.p = exp_shifted(c.logit, max);
        sum += c.p as f64;
    }
    for c in cands.iter_mut() {
        c.p = (c.p as f64 / sum) as f32;
    }
}

/// Top-p (nucleus): sorts best first, computes probabilities within the list, and keeps the
/// shortest prefix whose mass reaches `p` (at least `min_keep`). `p >= 1` is off (no-op).
pub fn top_p(cands: &mut Vec<Candidate>, p: f32, min_keep: usize) {
    if p >= 1.0 || cands.is_empty() {
        return;
    }
    softmax(cands);
    let mut cum = 0.0f64;
    let mut keep = cands.len();
    for (i, c) in cands.iter().enumerate() {
        cum += c.p as f64;
        if cum >= p as f64 && i + 1 >= min_keep {
            keep = i + 1;
            break;
        }
    }
    cands.truncate(keep);
}

/// Min-p: keeps the candidates whose probability is at least `p` times the largest one, i.e.
/// `logit >= max_logit + ln(p)`, preserving order. When fewer than `min_keep` pass, keeps the
/// `min_keep` best-ranked instead, sorted (llama.cpp's fallback). `p <= 0` is off (no-op).
pub fn min_p(cands: &mut Vec<Candidate>, p: f32, min_keep: usize) {
    if p <= 0.0 || cands.is_empty() {
        return;
    }
    let max = cands
        .iter()
        .map(|c| c.logit)
        .fold(f32::NEG_INFINITY, f32::max);
    let threshold = max + p.ln();
    let kept = cands.iter().filter(|c| c.logit >= threshold).count();
    if kept >= min_keep {
        cands.retain(|c| c.logit >= threshold);
    } else {
        top_k(cands, min_keep);
    }
}

/// Temperature: divides every logit by `t`. `t <= 0` keeps only the best candidate's logit
/// finite (the first one among equals) and sets the others to -inf, as llama.cpp does.
pub fn temperature(cands: &mut [Candidate], t: f32) {
    if t <= 0.0 {
        if let Some(best) = argmax_index(cands) {
            for (i, c) in cands.iter_mut().enumerate() {
                if i != best {
                    c.logit = f32::NEG_INFINITY;
                }
            }
        }
        return;
    }
    for c in cands.iter_mut() {
        c.logit /= t;
    }
}

/// A uniform double in [0, 1) from two MT19937 outputs, as libstdc++'s
/// `std::uniform_real_distribution<double>(0, 1)` on a `std::mt19937` makes it
/// (`generate_canonical<double, 53>`: 53 bits need two 32-bit draws, the first the low word).
pub fn uniform_f64(rng: &mut Mt) -> f64 {
    let lo = rng.next_u32() as f64;
    let hi = rng.next_u32() as f64;
    // lo + hi * 2^32 is rounded to 53 bits and can round up to 2^64; clamp below 1 as the
    // library does.
    let r = (lo + hi * 4294967296.0) / 18446744073709551616.0;
    if r >= 1.0 {
        1.0 - f64::EPSILON / 2.0
    } else {
        r
    }
}

/// The final draw (llama.cpp's `dist` sampler): sets each `p` to its softmax probability and
/// returns the index of the drawn candidate. One uniform `u` is drawn (always, even for a
/// single candidate, so the generator advances the same way whatever the list); the chosen
/// index is the first whose running sum of exp(logit - max), walked in list order, reaches
/// `u` times the total. `None` only for an empty list (no draw is made).
pub fn dist(cands: &mut [Candidate], rng: &mut Mt) -> Option<usize> {
    if cands.is_empty() {
        return None;
    }
    let u = uniform_f64(rng);
    if cands.len() == 1 {
        cands[0].p = 1.0;
        return Some(0);
    }
    let max = cands
        .iter()
        .map(|c| c.logit)
        .fold(f32::NEG_INFINITY, f32::max);
    let mut total = 0.0f64;
    for c in cands.iter_mut() {
        c.p = exp_shifted(c.logit, max);
        total += c.p as f64;
    }
    let target = total * u;
    let mut running = 0.0f64;
    let mut chosen = None;
    for (i, c) in cands.iter_mut().enumerate() {
        if chosen.is_none() {
            running += c.p as f64;
            // A zero-mass candidate is never chosen, even when u == 0.
            if running >= target && c.p > 0.0 {
                chosen = Some(i);
            }
        }
        c.p = (c.p as f64 / total) as f32;
    }
    // Rounding can leave the running sum a hair below the target: take the last candidate
    // with mass.
    chosen.or_else(|| cands.iter().rposition(|c| c.p > 0.0))
}

/// The `n` most likely tokens under log-softmax of `logits` (NaN logits excluded), best
/// first, as (token id, natural-log probability). For a server's `logprobs`.
pub fn top_logprobs(logits: &[f32], n: usize) -> Vec<(u32, f32)> {
    if n == 0 {
        return Vec::new();
    }
    token_logprobs(logits, None, n).1
}

/// The log-softmax of token `id` (when given; NaN for a NaN logit) and the `n` most likely
/// tokens' (as `top_logprobs`), from one normalization, so `id`'s value is the one it has in
/// the top list when it is there.
pub fn token_logprobs(logits: &[f32], id: Option<u32>, n: usize) -> (f32, Vec<(u32, f32)>) {
    if logits.iter().all(|l| l.is_nan()) {
        return (f32::NAN, Vec::new());
    }
    // Over the logits that are numbers, in id order, without a candidate for each.
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let sum: f64 = logits
        .iter()
        .filter(|l| !l.is_nan())
        .map(|&l| exp_shifted(l, max) as f64)
        .sum();
    let log_sum = sum.ln();
    let lp = |logit: f32| -> f32 {
        let v = if max.is_infinite() {
            if logit == max {
                -log_sum
            } else {
                f64::NEG_INFINITY
            }
        } else {
            (logit - max) as f64 - log_sum
        };
        v as f32
    };
    let own = id.map_or(f32::NAN, |i| {
        let l = logits[i as usize];
        if l.is_nan() {
            f32::NAN
        } else {
            lp(l)
        }
    });
    let top = if n == 0 {
        Vec::new()
    } else {
        top_k_of_logits(logits, n)
            .iter()
            .map(|c| (c.id, lp(c.logit)))
            .collect()
    };
    (own, top)
}
