//! The individual sampling steps, each a pure function on a candidate list.
//!
//! Each step reproduces the behaviour of the llama.cpp sampler of the same name (2025-2026
//! `src/llama-sampler.cpp`), with two deliberate differences, both only at the edges:
//! - ties are broken deterministically (equal logits: the lower token id ranks first), where
//!   llama.cpp's partial sort leaves the order of equal logits unspecified;
//! - NaN logits never enter a candidate list (`candidates_from_logits` drops them), where
//!   llama.cpp would let a NaN poison its sums.
//!
//! Steps that llama.cpp implements by sorting (top-k, top-p, softmax, and XTC, dynamic
//! temperature and mirostat through their softmax) sort here too, typical-p leaves the list in
//! its own order (closest to the entropy first) as llama.cpp does, and steps that preserve order
//! there (penalties, top-n-sigma, min-p, temperature) preserve it here, so the list the final
//! draw walks is in the same order as llama.cpp's and a seeded draw picks the same token.
//!
//! Probabilities are computed in f32 where llama.cpp computes them so (its softmax sums and
//! divides in f32, in list order: sorted first where it sorts, `softmax`, and in the order the
//! list is in where it does not, top-p's `probabilities`), so the probabilities top-p, typical-p,
//! XTC, dynamic temperature and mirostat compare with a threshold are the same floats. The
//! steps' own edge differences, all where llama.cpp's arithmetic breaks down: a zero
//! probability adds nothing to typical-p's and dynamic temperature's entropy (llama.cpp's
//! typical-p sum turns NaN on 0 * ln 0), a token of zero probability never counts as above XTC's
//! threshold, and mirostat never picks a token of zero probability.

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

/// Sorts best first and sets each `p` to its softmax probability within the list, summed and
/// divided in f32 in that (sorted) order, as llama.cpp's softmax does when it sorts
/// (`llama_sampler_softmax_impl(cur_p, true)`, the one typical-p, XTC, dynamic temperature and
/// mirostat call): so the probabilities they compare with a threshold are the same floats.
pub fn softmax(cands: &mut [Candidate]) {
    let n = cands.len();
    sort_prefix(cands, n);
    probabilities(cands);
}

/// Sets each `p` to its softmax probability within the list, leaving the order as it is: the
/// exponentials summed and divided in f32 in list order, as llama.cpp's softmax does when it does
/// not sort (`llama_sampler_softmax_impl(cur_p, false)`, top-p's). f32 addition is not
/// associative, so on a list that is not sorted (what typical-p leaves) the sum, and every `p`,
/// can differ in the last bit from `softmax`'s.
fn probabilities(cands: &mut [Candidate]) {
    let Some(max) = cands.iter().map(|c| c.logit).reduce(f32::max) else {
        return;
    };
    let mut sum = 0.0f32;
    for c in cands.iter_mut() {
        c.p = exp_shifted(c.logit, max);
        sum += c.p;
    }
    for c in cands.iter_mut() {
        c.p /= sum;
    }
}

/// Top-p (nucleus): computes probabilities within the list (summed in the list's order, before
/// sorting, as llama.cpp's top-p does: that order is typical-p's when it ran first), sorts best
/// first, and keeps the shortest prefix whose mass, added in f32, reaches `p` (at least
/// `min_keep`). `p >= 1` is off (no-op).
pub fn top_p(cands: &mut Vec<Candidate>, p: f32, min_keep: usize) {
    if p >= 1.0 || cands.is_empty() {
        return;
    }
    probabilities(cands);
    let n = cands.len();
    sort_prefix(cands, n);
    // The running mass in f32, as llama.cpp's top-p adds it.
    let mut cum = 0.0f32;
    let mut keep = cands.len();
    for (i, c) in cands.iter().enumerate() {
        cum += c.p;
        if cum >= p && i + 1 >= min_keep {
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

/// A uniform float in [0, 1) from one MT19937 output, as libstdc++'s
/// `std::uniform_real_distribution<float>(0, 1)` on a `std::mt19937` makes it
/// (`generate_canonical<float, 24>`: one 32-bit draw, rounded to f32, divided by 2^32). XTC's
/// draw.
pub fn uniform_f32(rng: &mut Mt) -> f32 {
    let r = rng.next_u32() as f32 / 4294967296.0;
    // The rounding to f32 can reach 2^32: clamp below 1 as the library does.
    if r >= 1.0 {
        1.0 - f32::EPSILON / 2.0
    } else {
        r
    }
}

/// The logit below which top-n-sigma masks: max - n * std over the logits above -inf (their
/// mean and standard deviation as llama.cpp computes them: an f32 sum in list order, each
/// square added in f64 and rounded back to f32). `None` when the step is off (`n <= 0`) or sees
/// at most one logit.
fn sigma_floor(logits: impl Iterator<Item = f32> + Clone, n: f32) -> Option<f32> {
    if n.is_nan() || n <= 0.0 || logits.clone().nth(1).is_none() {
        return None;
    }
    let finite = logits.filter(|&l| l != f32::NEG_INFINITY);
    let (mut max, mut sum, mut count) = (f32::NEG_INFINITY, 0.0f32, 0usize);
    for l in finite.clone() {
        max = max.max(l);
        sum += l;
        count += 1;
    }
    if count == 0 {
        return Some(f32::NEG_INFINITY);
    }
    let mean = sum / count as f32;
    let mut acc = 0.0f32;
    for l in finite {
        let d = (l - mean) as f64;
        acc = (acc as f64 + d * d) as f32;
    }
    let std = (acc / count as f32).sqrt();
    Some(max - n * std)
}

/// Top-n-sigma (llama.cpp's `top_n_sigma` sampler): sets to -inf every logit below
/// max - n * std, the standard deviation taken over the logits above -inf; the candidates stay,
/// in order. `n <= 0` is off (no-op), and so is a list of one. It reads every logit of the row,
/// so it runs before top-k and a backend's top-k candidates cannot stand in for the row.
pub fn top_n_sigma(cands: &mut [Candidate], n: f32) {
    if let Some(floor) = sigma_floor(cands.iter().map(|c| c.logit), n) {
        for c in cands.iter_mut() {
            if c.logit < floor {
                c.logit = f32::NEG_INFINITY;
            }
        }
    }
}

/// `logits` after `top_n_sigma(candidates_from_logits(logits), n)`: the logits themselves when
/// the step is off or masks nothing, else a copy with the masked logits -inf (NaN stays NaN).
pub(crate) fn top_n_sigma_logits(logits: &[f32], n: f32) -> std::borrow::Cow<'_, [f32]> {
    let numbers = logits.iter().copied().filter(|l| !l.is_nan());
    match sigma_floor(numbers, n) {
        Some(floor) if logits.iter().any(|&l| l < floor) => std::borrow::Cow::Owned(
            logits
                .iter()
                .map(|&l| if l < floor { f32::NEG_INFINITY } else { l })
                .collect(),
        ),
        _ => std::borrow::Cow::Borrowed(logits),
    }
}

/// Locally typical sampling (llama.cpp's `typical` sampler): with H the entropy of the list's
/// softmax, ranks the candidates by how far their surprise -ln p lies from H (closest first,
/// equal distances in logit rank) and keeps the shortest run of that ranking whose mass exceeds
/// `p` (strictly; at least `min_keep`). The list stays in that order, as llama.cpp leaves it.
/// `p >= 1` is off (no-op).
pub fn typical(cands: &mut Vec<Candidate>, p: f32, min_keep: usize) {
    if p >= 1.0 || cands.is_empty() {
        return;
    }
    softmax(cands);
    let entropy = cands
        .iter()
        .filter(|c| c.p > 0.0)
        .fold(0.0f32, |h, c| h + -c.p * c.p.ln());
    let distance: Vec<f32> = cands.iter().map(|c| (-c.p.ln() - entropy).abs()).collect();
    let mut order: Vec<usize> = (0..cands.len()).collect();
    // Stable: equal distances keep the logit ranking.
    order.sort_by(|&a, &b| distance[a].total_cmp(&distance[b]));
    let mut mass = 0.0f32;
    let mut keep = order.len();
    for (i, &j) in order.iter().enumerate() {
        mass += cands[j].p;
        if mass > p && i + 1 >= min_keep {
            keep = i + 1;
            break;
        }
    }
    *cands = order[..keep].iter().map(|&j| cands[j]).collect();
}

/// XTC, "exclude top choices" (llama.cpp's `xtc` sampler): with chance `probability`, removes
/// every candidate whose probability is at least `threshold` except the least likely of them,
/// when at least two are and at least `min_keep` candidates remain. The chance is one
/// `uniform_f32` from `rng` (llama.cpp gives XTC its own generator, seeded as `dist`'s), drawn
/// whenever the step is on and the list holds two candidates or more, whether or not anything is
/// removed; the step applies when the draw is at most `probability`. Sorted best first when it
/// applies. Off (no-op, no draw) when `probability <= 0` or `threshold > 0.5`.
pub fn xtc(
    cands: &mut Vec<Candidate>,
    probability: f32,
    threshold: f32,
    min_keep: usize,
    rng: &mut Mt,
) {
    if probability <= 0.0 || threshold > 0.5 || cands.len() < 2 {
        return;
    }
    if uniform_f32(rng) > probability {
        return;
    }
    softmax(cands);
    let above = cands
        .iter()
        .take_while(|c| c.p >= threshold && c.p > 0.0)
        .count();
    // The least likely of those above stays.
    if above >= 2 && cands.len() - (above - 1) >= min_keep {
        cands.drain(..above - 1);
    }
}

/// Temperature with llama.cpp's dynamic range (its `temp_ext` sampler): with `range <= 0`, plain
/// `temperature(t)`; with `range > 0`, the temperature is
/// `max(0, t - range) + (t + range - max(0, t - range)) * (H / ln n)^exponent`, H the entropy of
/// the list's softmax and n its length, and the list ends sorted best first. Returns the
/// temperature applied; `None` when `range > 0` and the list holds at most one candidate
/// (left as it is).
pub fn temperature_ext(cands: &mut [Candidate], t: f32, range: f32, exponent: f32) -> Option<f32> {
    if range.is_nan() || range <= 0.0 {
        temperature(cands, t);
        return Some(t);
    }
    if cands.len() <= 1 {
        return None;
    }
    let (low, high) = ((t - range).max(0.0), t + range);
    let max_entropy = -(1.0 / cands.len() as f32).ln();
    softmax(cands);
    let entropy = cands
        .iter()
        .filter(|c| c.p > 0.0)
        .fold(0.0f32, |h, c| h - c.p * c.p.ln());
    let dynamic = low + (high - low) * (entropy / max_entropy).powf(exponent);
    temperature(cands, dynamic);
    Some(dynamic)
}

/// Mirostat 1.0 (llama.cpp's `mirostat` sampler) on a list after temperature: estimates the
/// Zipf exponent s from the `m` most likely candidates, keeps the k best with
/// k = (e * 2^mu / (1 - n_vocab^-e))^(1/s), e = s - 1, draws one (`discrete_pick`), and moves
/// `mu` by `eta` * (observed surprise - `tau`), the surprise -log2 p of the pick within the kept
/// set. Returns the pick's index in the list (sorted best first); `None` for an empty list.
pub fn mirostat(
    cands: &mut Vec<Candidate>,
    n_vocab: usize,
    tau: f32,
    eta: f32,
    m: usize,
    mu: &mut f32,
    rng: &mut Mt,
) -> Option<usize> {
    if cands.is_empty() {
        return None;
    }
    softmax(cands);
    let (mut sum_tb, mut sum_tt) = (0.0f32, 0.0f32);
    for i in 0..m.saturating_sub(1).min(cands.len() - 1) {
        let t = ((i + 2) as f32 / (i + 1) as f32).ln();
        let b = (cands[i].p / cands[i + 1].p).ln();
        sum_tb += t * b;
        sum_tt += t * t;
    }
    let s = sum_tb / sum_tt;
    let e = s - 1.0;
    let k = (e * 2.0f32.powf(*mu) / (1.0 - (n_vocab as f32).powf(-e))).powf(1.0 / s);
    top_k(cands, x86_int(k).max(1) as usize);
    softmax(cands);
    Some(mirostat_pick(cands, tau, eta, mu, rng))
}

/// Mirostat 2.0 (llama.cpp's `mirostat_v2` sampler) on a list after temperature: keeps the
/// candidates, best first, before the first whose surprise -log2 p exceeds `mu` (at least the
/// best one), draws one (`discrete_pick`) and moves `mu` by `eta` * (observed surprise - `tau`),
/// the surprise of the pick within the kept set. Returns the pick's index in the list (sorted
/// best first); `None` for an empty list.
pub fn mirostat_v2(
    cands: &mut Vec<Candidate>,
    tau: f32,
    eta: f32,
    mu: &mut f32,
    rng: &mut Mt,
) -> Option<usize> {
    if cands.is_empty() {
        return None;
    }
    softmax(cands);
    let keep = cands
        .iter()
        .position(|c| -c.p.log2() > *mu)
        .unwrap_or(cands.len());
    cands.truncate(keep.max(1));
    softmax(cands);
    Some(mirostat_pick(cands, tau, eta, mu, rng))
}

/// The draw both mirostats end with, and their update of `mu` from the pick's surprise.
fn mirostat_pick(cands: &[Candidate], tau: f32, eta: f32, mu: &mut f32, rng: &mut Mt) -> usize {
    let i = discrete_pick(cands, rng);
    let surprise = -cands[i].p.log2();
    *mu -= eta * (surprise - tau);
    i
}

/// C++'s `int(x)` for a float as x86-64 computes it (`cvttss2si`): toward zero, and i32::MIN for
/// NaN or a value past i32 (Rust's `as` saturates instead). Mirostat 1.0's k is such a value
/// when the estimate degenerates (a flat or one-candidate list), and llama.cpp then keeps one
/// candidate.
fn x86_int(x: f32) -> i32 {
    if !(-2147483648.0..2147483648.0).contains(&x) {
        i32::MIN
    } else {
        x as i32
    }
}

/// The draw of libstdc++'s `std::discrete_distribution` over the list's `p`, the one mirostat
/// makes: no draw for a list of one (index 0); else one `uniform_f64` u and the first index
/// whose cumulative probability (f64, each p divided by the f64 sum, the last forced to 1)
/// reaches u. A zero-probability pick (only the forced last entry can be one) falls back to the
/// last candidate with mass.
fn discrete_pick(cands: &[Candidate], rng: &mut Mt) -> usize {
    if cands.len() < 2 {
        return 0;
    }
    let sum = cands.iter().fold(0.0f64, |s, c| s + c.p as f64);
    let u = uniform_f64(rng);
    let last = cands.len() - 1;
    let mut cum = 0.0f64;
    let mut pick = last;
    for (i, c) in cands[..last].iter().enumerate() {
        cum += c.p as f64 / sum;
        if cum >= u {
            pick = i;
            break;
        }
    }
    if cands[pick].p > 0.0 {
        pick
    } else {
        cands[..pick]
            .iter()
            .rposition(|c| c.p > 0.0)
            .unwrap_or(pick)
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
