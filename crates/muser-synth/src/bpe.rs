//! A small byte-level BPE trainer and encoder (GPT-2 style tokens), used to give every synthetic
//! model a real vocabulary whose merges reproduce English text.
//!
//! Tokens are strings over GPT-2's byte-to-unicode alphabet: token id `b` (0..256) is the single
//! byte `b`, every learned merge adds one token, in merge order. Merges are learned inside
//! pre-tokens (the same regex the model's `tokenizer.ggml.pre` names), so a tokenizer that
//! pre-splits the same way reproduces the trainer's segmentation.
//!
//! Every learned token encodes to itself: a merge whose joined string would not be rebuilt by
//! the merges learned before it is skipped. So llama.cpp's `ignore_merges` (whole-word lookup,
//! on for `llama-bpe`) and plain merge-by-rank tokenize identically.

use std::collections::{BTreeMap, HashMap, HashSet};

/// llama.cpp's `LLAMA_VOCAB_PRE_TYPE_LLAMA3` split (pre-tokenizer name "llama-bpe").
pub const REGEX_LLAMA_BPE: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// llama.cpp's `LLAMA_VOCAB_PRE_TYPE_QWEN2` split (pre-tokenizer name "qwen2"): digits one by one.
pub const REGEX_QWEN2: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// The English training text (written for this crate; no third-party text).
pub const CORPUS: &str = include_str!("corpus.txt");

/// A trained byte-level BPE: token byte strings and merges (pairs of token ids), in rank order.
#[derive(Debug, Clone)]
pub struct Bpe {
    /// Bytes of each token; `tokens[b] == [b]` for b < 256, then one token per merge.
    pub tokens: Vec<Vec<u8>>,
    /// Merge i joins `merges[i]` into token `256 + i`.
    pub merges: Vec<(u32, u32)>,
    ranks: HashMap<(u32, u32), u32>,
}

/// GPT-2's byte-to-unicode table: printable Latin-1 bytes map to themselves, the other 68 bytes
/// to U+0100 onwards in byte order, so every token is a printable string without spaces.
pub fn byte_to_unicode() -> [char; 256] {
    let printable = |b: u32| {
        (0x21..=0x7e).contains(&b) || (0xa1..=0xac).contains(&b) || (0xae..=0xff).contains(&b)
    };
    let mut table = ['\0'; 256];
    let mut next = 256u32;
    for b in 0..256u32 {
        let c = if printable(b) {
            b
        } else {
            next += 1;
            next - 1
        };
        table[b as usize] = char::from_u32(c).expect("code points below 0x200 are chars");
    }
    table
}

/// Splits `text` into pre-tokens with `pattern` (one of the `REGEX_*` constants).
pub fn pre_tokenize<'t>(pattern: &str, text: &'t str) -> Vec<&'t str> {
    let re = fancy_regex::Regex::new(pattern).expect("the pre-tokenizer regexes are valid");
    re.find_iter(text)
        .map(|m| m.expect("no backtracking limit on these patterns").as_str())
        .collect()
}

impl Bpe {
    fn empty() -> Bpe {
        Bpe {
            tokens: (0..=255u8).map(|b| vec![b]).collect(),
            merges: Vec::new(),
            ranks: HashMap::new(),
        }
    }

    /// Learns up to `max_merges` merges from `text` split by `pattern`. Pairs are chosen by
    /// frequency (ties: smallest ids first), so training is deterministic.
    pub fn train(text: &str, pattern: &str, max_merges: usize) -> Bpe {
        let mut counts: BTreeMap<&[u8], u64> = BTreeMap::new();
        for w in pre_tokenize(pattern, text) {
            *counts.entry(w.as_bytes()).or_default() += 1;
        }
        let mut words: Vec<(Vec<u32>, u64)> = counts
            .into_iter()
            .map(|(w, c)| (w.iter().map(|&b| b as u32).collect(), c))
            .collect();
        let mut bpe = Bpe::empty();
        let mut refused: HashSet<(u32, u32)> = HashSet::new();
        while bpe.merges.len() < max_merges {
            let mut pairs: HashMap<(u32, u32), u64> = HashMap::new();
            for (w, c) in &words {
                for p in w.windows(2) {
                    *pairs.entry((p[0], p[1])).or_default() += c;
                }
            }
            let mut candidates: Vec<((u32, u32), u64)> = pairs
                .into_iter()
                .filter(|(p, _)| !refused.contains(p))
                .collect();
            candidates.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
            let Some(pair) = candidates.into_iter().map(|(p, _)| p).find(|&p| {
                let ok = bpe.joins_to_pair(p);
                if !ok {
                    refused.insert(p);
                }
                ok
            }) else {
                break;
            };
            let id = bpe.push_merge(pair);
            for (w, _) in &mut words {
                merge_in_place(w, pair, id);
            }
        }
        bpe
    }

    /// Whether the string of `a` followed by `b`, encoded with the current merges, comes out as
    /// exactly `[a, b]` (so a new merge `(a, b)` would make it encode to the joined token).
    fn joins_to_pair(&self, (a, b): (u32, u32)) -> bool {
        let mut joined = self.tokens[a as usize].clone();
        joined.extend_from_slice(&self.tokens[b as usize]);
        self.encode_word(&joined) == [a, b]
    }

    fn push_merge(&mut self, pair: (u32, u32)) -> u32 {
        let id = self.tokens.len() as u32;
        let mut bytes = self.tokens[pair.0 as usize].clone();
        bytes.extend_from_slice(&self.tokens[pair.1 as usize]);
        self.tokens.push(bytes);
        self.ranks.insert(pair, self.merges.len() as u32);
        self.merges.push(pair);
        id
    }

    /// Encodes one pre-token: repeatedly joins the adjacent pair of lowest merge rank (the
    /// leftmost one on ties), as llama.cpp and Hugging Face do.
    pub fn encode_word(&self, word: &[u8]) -> Vec<u32> {
        let mut ids: Vec<u32> = word.iter().map(|&b| b as u32).collect();
        loop {
            let best = ids
                .windows(2)
                .enumerate()
                .filter_map(|(i, p)| self.ranks.get(&(p[0], p[1])).map(|&r| (r, i)))
                .min();
            let Some((rank, i)) = best else { return ids };
            ids[i] = 256 + rank;
            ids.remove(i + 1);
        }
    }

    /// Encodes text: pre-tokenize with `pattern`, then BPE within each pre-token.
    pub fn encode(&self, pattern: &str, text: &str) -> Vec<u32> {
        pre_tokenize(pattern, text)
            .into_iter()
            .flat_map(|w| self.encode_word(w.as_bytes()))
            .collect()
    }

    /// The bytes of a token sequence.
    pub fn decode(&self, ids: &[u32]) -> Vec<u8> {
        ids.iter()
            .flat_map(|&i| self.tokens[i as usize].iter().copied())
            .collect()
    }

    /// Token strings in GPT-2's byte-to-unicode alphabet (`tokenizer.ggml.tokens`).
    pub fn token_strings(&self) -> Vec<String> {
        let table = byte_to_unicode();
        self.tokens
            .iter()
            .map(|t| t.iter().map(|&b| table[b as usize]).collect())
            .collect()
    }

    /// Merges as "left right" in the byte-to-unicode alphabet (`tokenizer.ggml.merges`).
    pub fn merge_strings(&self) -> Vec<String> {
        let s = self.token_strings();
        self.merges
            .iter()
            .map(|&(a, b)| format!("{} {}", s[a as usize], s[b as usize]))
            .collect()
    }
}

/// Replaces every non-overlapping occurrence of `pair` in `w` (left to right) by `id`.
fn merge_in_place(w: &mut Vec<u32>, pair: (u32, u32), id: u32) {
    let mut out = 0;
    let mut i = 0;
    while i < w.len() {
        if i + 1 < w.len() && (w[i], w[i + 1]) == pair {
            w[out] = id;
            i += 2;
        } else {
            w[out] = w[i];
            i += 1;
        }
        out += 1;
    }
    w.truncate(out);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merges_reproduce_the_training_words() {
        let bpe = Bpe::train(CORPUS, REGEX_LLAMA_BPE, 100_000);
        assert!(
            bpe.merges.len() > 1500,
            "only {} merges learned",
            bpe.merges.len()
        );
        // With every merge learned and count >= 1 allowed, each training word ends as one token.
        let words = pre_tokenize(REGEX_LLAMA_BPE, CORPUS);
        for w in &words {
            let ids = bpe.encode_word(w.as_bytes());
            assert_eq!(bpe.decode(&ids), w.as_bytes());
            assert_eq!(ids.len(), 1, "{w:?} -> {ids:?}");
        }
    }

    #[test]
    fn a_truncated_merge_list_still_round_trips_and_compresses() {
        let bpe = Bpe::train(CORPUS, REGEX_LLAMA_BPE, 1000);
        assert_eq!(bpe.merges.len(), 1000);
        let ids = bpe.encode(REGEX_LLAMA_BPE, CORPUS);
        assert_eq!(bpe.decode(&ids), CORPUS.as_bytes());
        assert!(
            ids.len() * 3 < CORPUS.len(),
            "{} tokens for {} bytes",
            ids.len(),
            CORPUS.len()
        );
        // Text never seen in training, with bytes outside ASCII, round-trips through byte tokens.
        let novel = "Zebras quizzically juxtapose 12345 — naïve façades! 🙂\n\tend";
        assert_eq!(
            bpe.decode(&bpe.encode(REGEX_LLAMA_BPE, novel)),
            novel.as_bytes()
        );
    }

    #[test]
    fn every_token_encodes_to_itself() {
        for pattern in [REGEX_LLAMA_BPE, REGEX_QWEN2] {
            let bpe = Bpe::train(CORPUS, pattern, 100_000);
            for (id, t) in bpe.tokens.iter().enumerate() {
                assert_eq!(bpe.encode_word(t), [id as u32]);
            }
        }
    }

    #[test]
    fn training_segmentation_matches_rank_order_encoding() {
        // Stop early so words are still split; the trainer's segmentation of each word must be
        // what merge-by-rank encoding gives.
        let bpe = Bpe::train(CORPUS, REGEX_QWEN2, 300);
        let mut words: Vec<Vec<u32>> = pre_tokenize(REGEX_QWEN2, CORPUS)
            .iter()
            .map(|w| w.bytes().map(u32::from).collect())
            .collect();
        for (i, &p) in bpe.merges.iter().enumerate() {
            for w in &mut words {
                merge_in_place(w, p, 256 + i as u32);
            }
        }
        let texts = pre_tokenize(REGEX_QWEN2, CORPUS);
        for (w, t) in words.iter().zip(&texts) {
            assert_eq!(&bpe.encode_word(t.as_bytes()), w, "{t:?}");
        }
        assert!(pre_tokenize(REGEX_QWEN2, "1887").len() == 4);
        assert!(pre_tokenize(REGEX_LLAMA_BPE, "1887").len() == 2);
    }

    #[test]
    fn byte_alphabet_is_gpt2s() {
        let t = byte_to_unicode();
        assert_eq!(t[b' ' as usize], 'Ġ');
        assert_eq!(t[b'\n' as usize], 'Ċ');
        assert_eq!(t[b'a' as usize], 'a');
        let distinct: HashSet<char> = t.iter().copied().collect();
        assert_eq!(distinct.len(), 256);
    }
}
