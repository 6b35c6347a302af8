//! DRY, "don't repeat yourself" (llama.cpp's `dry` sampler, from koboldcpp): a token that would
//! extend a sequence already seen in the recent history is penalised by
//! `multiplier * base^(length - allowed_length)`, the length that of the longest such repeat
//! (counted without the token itself) when it is at least `allowed_length`. Sequence breakers
//! (by default a newline, `:`, `"` and `*`) stop a repeat: the search never looks past the most
//! recent breaker in the history, and a token that is a breaker on its own is never penalised.
//!
//! Breakers are strings, matched against token texts: this module never sees a tokenizer, so
//! the caller turns the strings into token sequences once (`DryBreakers::new`, from every
//! token's text and a tokenize function) and the sampler then works on token ids only.

use crate::Candidate;
use std::collections::HashMap;

/// llama.cpp cuts each breaker string to this many bytes.
pub const DRY_MAX_BREAKER_BYTES: usize = 40;
/// llama.cpp cuts the token sequence that follows a breaker's first token to this many tokens.
pub const DRY_MAX_BREAKER_TAIL: usize = 20;

/// The sequence breakers as token sequences, by first ("head") token: each head maps to the
/// tails that complete a breaker after it. An empty tail means the head token's text holds a
/// whole breaker; a non-empty one that the head's text ends with a breaker's beginning, and the
/// tail is the tokenization of the rest.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct DryBreakers {
    heads: HashMap<u32, Vec<Vec<u32>>>,
}

impl DryBreakers {
    /// The breakers as llama.cpp's `llama_sampler_init_dry` prepares them for a vocabulary.
    ///
    /// - `pieces[id]`: token `id`'s text as llama.cpp's `detokenize({id}, special = true)` gives
    ///   it: the token's bytes (byte tokens decoded, special tokens' text included), with the
    ///   leading space removed where the vocabulary adds a space prefix (SentencePiece), and
    ///   the vocabulary's space clean-up applied. For a byte-level BPE vocabulary it is the
    ///   token decoded to bytes.
    /// - `breakers`: the breaker strings (bytes); empty ones are skipped, longer ones cut to
    ///   `DRY_MAX_BREAKER_BYTES`.
    /// - `tokenize(text)`: the vocabulary's tokenization of `text` without special tokens and
    ///   without parsing special-token text (llama.cpp's `tokenize(text, false, false)`); it is
    ///   called for the rest of a breaker after a token whose text ends with its beginning.
    ///
    /// A token whose text contains a breaker becomes a single-token breaker. Else, for every
    /// position where the text's end equals a breaker's beginning, the token heads a breaker
    /// whose tail is `tokenize(the rest of the breaker)`, cut to `DRY_MAX_BREAKER_TAIL` tokens.
    pub fn new<P, B>(
        pieces: &[P],
        breakers: &[B],
        mut tokenize: impl FnMut(&[u8]) -> Vec<u32>,
    ) -> Self
    where
        P: AsRef<[u8]>,
        B: AsRef<[u8]>,
    {
        let mut out = DryBreakers::default();
        // A breaker's rest after a head: many heads share one (every token ending in the
        // breaker's first character), so each rest is tokenized once.
        let mut tails: HashMap<Vec<u8>, Vec<u32>> = HashMap::new();
        for breaker in breakers {
            let b = breaker.as_ref();
            let b = &b[..b.len().min(DRY_MAX_BREAKER_BYTES)];
            if b.is_empty() {
                continue;
            }
            for (id, piece) in pieces.iter().enumerate() {
                let word = piece.as_ref();
                if contains(word, b) {
                    out.add(id as u32, Vec::new());
                    continue;
                }
                // Each suffix of the text that is a proper prefix of the breaker (a suffix as
                // long as the breaker would be a containment, handled above).
                for start in 0..word.len() {
                    let end = &word[start..];
                    if end.len() < b.len() && b.starts_with(end) {
                        let rest = &b[end.len()..];
                        let tail = tails.entry(rest.to_vec()).or_insert_with(|| {
                            let mut t = tokenize(rest);
                            t.truncate(DRY_MAX_BREAKER_TAIL);
                            t
                        });
                        out.add(id as u32, tail.clone());
                    }
                }
            }
        }
        out
    }

    /// Breakers given as token sequences (each one's first token the head, the rest, cut to
    /// `DRY_MAX_BREAKER_TAIL`, its tail), as llama.cpp's `llama_sampler_init_dry_testing`
    /// takes them. Empty sequences are skipped.
    pub fn from_token_sequences(sequences: &[Vec<u32>]) -> Self {
        let mut out = DryBreakers::default();
        for seq in sequences {
            if let Some((&head, rest)) = seq.split_first() {
                out.add(head, rest[..rest.len().min(DRY_MAX_BREAKER_TAIL)].to_vec());
            }
        }
        out
    }

    /// Adds a tail for `head` unless the head already has it.
    fn add(&mut self, head: u32, tail: Vec<u32>) {
        let tails = self.heads.entry(head).or_default();
        if !tails.contains(&tail) {
            tails.push(tail);
        }
    }

    /// The tails completing a breaker after `head` (empty when it heads none).
    pub fn tails(&self, head: u32) -> &[Vec<u32>] {
        self.heads.get(&head).map_or(&[], Vec::as_slice)
    }

    /// Whether `token` is a breaker on its own (its text contains a whole breaker).
    pub fn is_single_token(&self, token: u32) -> bool {
        self.tails(token).iter().any(Vec::is_empty)
    }

    /// How many head tokens there are.
    pub fn len(&self) -> usize {
        self.heads.len()
    }

    pub fn is_empty(&self) -> bool {
        self.heads.is_empty()
    }
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

/// DRY's parameters (llama.cpp's `dry_*` sampling parameters).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct DryParams {
    pub multiplier: f32,
    pub base: f32,
    pub allowed_length: usize,
}

/// The penalty DRY subtracts from each token's logit, given the window of history it looks at
/// (`history`, oldest first: the last `dry_penalty_last_n` accepted tokens). Empty when the
/// step changes nothing: a window not longer than `allowed_length`, or a breaker closer to the
/// end than `allowed_length` tokens.
///
/// The repeat length of a token t is the longest n (at least `allowed_length`) such that the
/// last n tokens of the window also occur, ending just before an earlier occurrence of t; n is
/// capped at the number of tokens after the most recent breaker (the breaker whose head is
/// nearest the end and whose tail, if any, follows it in full; among the breakers of that head,
/// the longest that fits). The penalty is `multiplier * base^(n - allowed_length)`, computed in
/// f64 and rounded to f32 as llama.cpp does (`std::pow(float, int)` is a double), the exponent
/// capped where `base^e` would overflow an f32. Single-token breakers get none.
pub fn dry_penalties(history: &[u32], p: &DryParams, breakers: &DryBreakers) -> Vec<(u32, f32)> {
    let n = history.len();
    if n <= p.allowed_length {
        return Vec::new();
    }
    // Newest first: rev[i] is the token i places before the last.
    let rev: Vec<u32> = history.iter().rev().copied().collect();

    // The cap: how many tokens follow the most recent complete breaker.
    let mut limit = n;
    for i in 0..n {
        let longest = breakers
            .tails(rev[i])
            .iter()
            .filter(|tail| {
                tail.len() <= i && tail.iter().zip(rev[..i].iter().rev()).all(|(a, b)| a == b)
            })
            .map(Vec::len)
            .max();
        if let Some(len) = longest {
            limit = i - len;
            break;
        }
    }
    if limit < p.allowed_length {
        return Vec::new();
    }

    // z[k]: how many of the newest tokens the run that ends k tokens before the last repeats.
    // The token after that run (rev[k - 1]) would extend the repeat.
    let z = z_function(&rev);
    let mut longest: HashMap<u32, usize> = HashMap::new();
    for k in 1..n {
        let len = z[k].min(limit);
        if len >= p.allowed_length {
            let e = longest.entry(rev[k - 1]).or_insert(len);
            *e = (*e).max(len);
        }
    }

    // Past this exponent base^e overflows an f32 (llama.cpp: log(FLT_MAX) / log(base), in f32,
    // truncated; no cap for a base within 1e-6 of 1).
    let max_exponent = if p.base > 1.000001 {
        (88.722_84_f32 / p.base.ln()) as i64
    } else {
        0
    };
    let mut out: Vec<(u32, f32)> = longest
        .into_iter()
        .filter(|&(t, _)| !breakers.is_single_token(t))
        .map(|(t, len)| {
            let mut e = len as i64 - p.allowed_length as i64;
            if max_exponent > 0 && e > max_exponent {
                e = max_exponent;
            }
            let penalty = (p.multiplier as f64 * (p.base as f64).powf(e as f64)) as f32;
            (t, penalty)
        })
        .collect();
    out.sort_unstable_by_key(|&(t, _)| t);
    out
}

/// The Z-array of `s`: z[k] is the length of the longest common prefix of `s` and `s[k..]`
/// (z[0] = 0 by convention). Linear time: inside the rightmost match found so far, z[k] starts
/// from the value at the mirrored position.
fn z_function(s: &[u32]) -> Vec<usize> {
    let n = s.len();
    let mut z = vec![0usize; n];
    let (mut left, mut right) = (0usize, 0usize); // s[left..right] == s[..right - left]
    for k in 1..n {
        let mut len = if k < right {
            z[k - left].min(right - k)
        } else {
            0
        };
        while k + len < n && s[len] == s[k + len] {
            len += 1;
        }
        if k + len > right {
            left = k;
            right = k + len;
        }
        z[k] = len;
    }
    z
}

/// DRY on a candidate list: subtracts each token's `dry_penalties` from its logit. Order is
/// preserved.
pub fn dry(cands: &mut [Candidate], history: &[u32], p: &DryParams, breakers: &DryBreakers) {
    let penalties = dry_penalties(history, p, breakers);
    if penalties.is_empty() {
        return;
    }
    let by_id: HashMap<u32, f32> = penalties.into_iter().collect();
    for c in cands.iter_mut() {
        if let Some(&d) = by_id.get(&c.id) {
            c.logit -= d;
        }
    }
}

/// `logits` after `dry` when it changes any (a copy), `None` when it changes none.
pub(crate) fn dry_logits(
    logits: &[f32],
    history: &[u32],
    p: &DryParams,
    breakers: &DryBreakers,
) -> Option<Vec<f32>> {
    let penalties = dry_penalties(history, p, breakers);
    if penalties.iter().all(|&(t, _)| t as usize >= logits.len()) {
        return None;
    }
    let mut out = logits.to_vec();
    for (t, d) in penalties {
        if let Some(l) = out.get_mut(t as usize) {
            *l -= d;
        }
    }
    Some(out)
}
