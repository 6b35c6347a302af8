//! `gpt2` byte-level BPE: a regex pre-tokenizer cuts text into words, each word's bytes become
//! the tokens of their GPT-2 alphabet characters, and adjacent tokens are merged, lowest merge
//! rank first (leftmost first among equal ranks), until no listed merge applies.

use crate::byte_unicode::ByteUnicode;
use crate::TokenizerError;
use fancy_regex::Regex;
use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};

/// GPT-2's pattern (also HF's `ByteLevel` pre-tokenizer): `"default"`, `"gpt2"`, and any `pre`
/// name we do not know.
const PATTERN_GPT2: &str =
    r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+";
/// Llama 3's pattern (`"llama-bpe"`): case-insensitive contractions, numbers in groups of three.
const PATTERN_LLAMA3: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// Qwen 2's pattern (`"qwen2"`): like Llama 3's with single digits.
const PATTERN_QWEN2: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// What a `tokenizer.ggml.pre` name selects.
pub struct PreTokenizer {
    pub pattern: &'static str,
    /// A word that is itself a token is emitted whole, without merging (HF's `ignore_merges`).
    pub ignore_merges: bool,
    /// Whether BOS is prepended when the file does not say (`add_bos_token` absent).
    pub default_add_bos: bool,
}

impl PreTokenizer {
    pub fn for_name(pre: Option<&str>) -> PreTokenizer {
        let (pattern, ignore_merges, default_add_bos) = match pre.unwrap_or("default") {
            "llama-bpe" | "llama3" | "llama-v3" => (PATTERN_LLAMA3, true, true),
            "qwen2" => (PATTERN_QWEN2, false, false),
            _ => (PATTERN_GPT2, false, false),
        };
        PreTokenizer {
            pattern,
            ignore_merges,
            default_add_bos,
        }
    }
}

pub struct BpeEncoder {
    regex: Regex,
    ignore_merges: bool,
    pub bytes: ByteUnicode,
    /// The token of each byte's single alphabet character.
    byte_tokens: [u32; 256],
    /// (left, right) -> (rank, merged token).
    merges: HashMap<(u32, u32), (u32, u32)>,
}

const NONE: u32 = u32::MAX;

struct Symbol {
    id: u32,
    prev: u32,
    next: u32,
    alive: bool,
}

impl BpeEncoder {
    pub fn new(
        pre: &PreTokenizer,
        vocab: &HashMap<String, u32>,
        merges: &[String],
    ) -> Result<BpeEncoder, TokenizerError> {
        let regex = Regex::new(pre.pattern).map_err(|e| TokenizerError::Regex(e.to_string()))?;
        let bytes = ByteUnicode::new();
        let mut byte_tokens = [0u32; 256];
        for b in 0..=255u8 {
            let text = bytes.char_of(b).to_string();
            byte_tokens[b as usize] = *vocab
                .get(&text)
                .ok_or(TokenizerError::MissingByteToken { byte: b, text })?;
        }
        let mut merge_map = HashMap::with_capacity(merges.len());
        for (index, merge) in merges.iter().enumerate() {
            let bad = |reason: String| TokenizerError::BadMerge {
                index,
                merge: merge.clone(),
                reason,
            };
            // The separator is the first space after the first character, so that a left part
            // beginning with a space still parses.
            let first_len = merge.chars().next().map_or(0, char::len_utf8);
            let split = merge[first_len..]
                .find(' ')
                .map(|i| i + first_len)
                .ok_or_else(|| bad("no space separates the two parts".into()))?;
            let (left, right) = (&merge[..split], &merge[split + 1..]);
            let lookup = |part: &str, what: &str| {
                vocab
                    .get(part)
                    .copied()
                    .ok_or_else(|| bad(format!("{what} {part:?} is not a token")))
            };
            let l = lookup(left, "left part")?;
            let r = lookup(right, "right part")?;
            let m = lookup(&format!("{left}{right}"), "merged text")?;
            // A repeated merge keeps its first (highest-priority) rank.
            merge_map.entry((l, r)).or_insert((index as u32, m));
        }
        Ok(BpeEncoder {
            regex,
            ignore_merges: pre.ignore_merges,
            bytes,
            byte_tokens,
            merges: merge_map,
        })
    }

    /// Tokenizes raw text (no special tokens in it). Valid UTF-8 runs are pre-tokenized by the
    /// regex; each maximal invalid sequence is one word of its own.
    pub fn encode(&self, text: &[u8], vocab: &HashMap<String, u32>, out: &mut Vec<u32>) {
        for chunk in text.utf8_chunks() {
            self.encode_str(chunk.valid(), vocab, out);
            if !chunk.invalid().is_empty() {
                self.encode_word(chunk.invalid(), vocab, out);
            }
        }
    }

    fn encode_str(&self, text: &str, vocab: &HashMap<String, u32>, out: &mut Vec<u32>) {
        let mut end = 0;
        for m in self.regex.find_iter(text) {
            let Ok(m) = m else {
                // The backtracking limit was hit: the rest is one word rather than lost.
                break;
            };
            // Text the pattern skipped (none for the patterns above) is a word too.
            if m.start() > end {
                self.encode_word(&text.as_bytes()[end..m.start()], vocab, out);
            }
            self.encode_word(m.as_str().as_bytes(), vocab, out);
            end = m.end();
        }
        if end < text.len() {
            self.encode_word(&text.as_bytes()[end..], vocab, out);
        }
    }

    /// Merges one word's byte tokens. A heap holds candidate pairs as (rank, left position);
    /// entries made stale by an earlier merge are recognised when popped and skipped.
    fn encode_word(&self, word: &[u8], vocab: &HashMap<String, u32>, out: &mut Vec<u32>) {
        if word.len() == 1 {
            out.push(self.byte_tokens[word[0] as usize]);
            return;
        }
        if self.ignore_merges {
            let text: String = word.iter().map(|&b| self.bytes.char_of(b)).collect();
            if let Some(&id) = vocab.get(&text) {
                out.push(id);
                return;
            }
        }
        let n = word.len() as u32;
        let mut syms: Vec<Symbol> = (0..n)
            .map(|i| Symbol {
                id: self.byte_tokens[word[i as usize] as usize],
                prev: if i == 0 { NONE } else { i - 1 },
                next: if i + 1 == n { NONE } else { i + 1 },
                alive: true,
            })
            .collect();
        let mut heap = BinaryHeap::new();
        let push = |heap: &mut BinaryHeap<_>, syms: &[Symbol], l: u32, r: u32| {
            if let Some(&(rank, _)) = self.merges.get(&(syms[l as usize].id, syms[r as usize].id)) {
                heap.push(Reverse((rank, l, r)));
            }
        };
        for i in 1..n {
            push(&mut heap, &syms, i - 1, i);
        }
        while let Some(Reverse((rank, l, r))) = heap.pop() {
            let (ls, rs) = (&syms[l as usize], &syms[r as usize]);
            if !ls.alive || !rs.alive || ls.next != r {
                continue;
            }
            // Both still adjacent; the pair must still be the one ranked `rank`.
            let merged = match self.merges.get(&(ls.id, rs.id)) {
                Some(&(k, m)) if k == rank => m,
                _ => continue,
            };
            let next = rs.next;
            syms[r as usize].alive = false;
            syms[l as usize].id = merged;
            syms[l as usize].next = next;
            if next != NONE {
                syms[next as usize].prev = l;
                push(&mut heap, &syms, l, next);
            }
            let prev = syms[l as usize].prev;
            if prev != NONE {
                push(&mut heap, &syms, prev, l);
            }
        }
        let mut i = 0;
        while i != NONE {
            out.push(syms[i as usize].id);
            i = syms[i as usize].next;
        }
    }
}
