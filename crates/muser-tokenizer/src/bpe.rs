//! `gpt2` byte-level BPE: a regex pre-tokenizer cuts text into words, each word's bytes become
//! the tokens of their GPT-2 alphabet characters, and adjacent tokens are merged, lowest merge
//! rank first (leftmost first among equal ranks), until no listed merge applies.

use crate::byte_unicode::ByteUnicode;
use crate::TokenizerError;
use fancy_regex::Regex;
use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};

// The pre-tokenizer patterns, as the models' `tokenizer.json` files state them where llama.cpp's
// source quotes the original next to its rewrite for its own regex engine (fancy-regex runs the
// original as is); otherwise llama.cpp's pattern.
// A pre-tokenizer is a list of patterns applied in turn: each splits every piece the previous
// one produced into its matches and the text between them (HF's `Split` with "isolated").

/// GPT-2's pattern (also HF's `ByteLevel` pre-tokenizer).
const GPT2: &str = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+";
/// Llama 3's: case-insensitive contractions, numbers in groups of three.
const LLAMA3: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// Qwen 2's: like Llama 3's with single digits.
const QWEN2: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// Qwen 3.5's: Qwen 2's with combining marks kept in words.
const QWEN35: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// Jais 2's: Llama 3's with whitespace runs cut in power-of-two lengths.
const JAIS2: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s{512}(?!\S)|\s{256}(?!\S)|\s{128}(?!\S)|\s{64}(?!\S)|\s{32}(?!\S)|\s{16}(?!\S)|\s{8}(?!\S)|\s{4}(?!\S)|\s{1,2}(?!\S)|\s{1}";
/// Tekken's (Mistral Nemo and later): words split at case changes, single digits.
const TEKKEN: &str = r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// GPT-4o's (o200k; Llama 4, MiniMax M2): Tekken's with contractions and digits in threes.
const GPT4O: &str = r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// Youtu's: CJK runs first, then GPT-4o's word rule with single digits.
const YOUTU: &str = r"[가-힣ㄱ-ㆎ]+|[！…“”‘’—：；，、-〿︰-﹏]+|[ㄅ-ㄯ]+|[一-龥぀-ゟ゠-ヿ]+";
const YOUTU_WORDS: &str = r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// Granite multilingual embedding (97m): GPT-4o's with marks counted as letters.
const GRANITE_EMB_MULTI: &str = r"[^\r\n\p{L}\p{N}]?((?=[\p{L}\p{M}])([^a-z]))*((?=[\p{L}\p{M}])([^A-Z]))+(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|[^\r\n\p{L}\p{N}]?((?=[\p{L}\p{M}])([^a-z]))+((?=[\p{L}\p{M}])([^A-Z]))*(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// Tiny Aya / Cohere 2 MoE: digits grouped in threes from the right, then GPT-4o's words.
const DIGITS_FROM_RIGHT: &str = r"\d{1,3}(?=(?:\d{3})*\b)";
const TINY_AYA: &str = r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// DeepSeek LLM (v1).
const DEEPSEEK_LLM: &[&str] = &[
    "[\r\n]",
    r"\s?[A-Za-zµÀ-ÖØ-öø-ƺƼ-ƿǄ-ʓʕ-ʯͰ-ͳͶͷͻ-ͽͿΆΈ-ΊΌΎ-ΡΣ-ϵϷ-ҁҊ-ԯԱ-ՖႠ-ჅᎠ-Ᏽᏸ-ᏽᲐ-ᲺᲽ-Ჿᴀ-ᴫᵫ-ᵷᵹ-ᶚḀ-ἕἘ-Ἕἠ-ὅὈ-Ὅὐ-ὗὙὛὝὟ-ώᾀ-ᾴᾶ-ᾼιῂ-ῄῆ-ῌῐ-ΐῖ-Ίῠ-Ῥῲ-ῴῶ-ῼℂℇℊ-ℓℕℙ-ℝℤΩℨK-ℭℯ-ℴℹℼ-ℿⅅ-ⅉⅎↃↄⰀ-ⱻⱾ-ⳤⳫ-ⳮⳲⳳꙀ-ꙭꚀ-ꚛꜢ-ꝯꝱ-ꞇꞋ-ꞎꭰ-ꮿﬀ-ﬆﬓ-ﬗＡ-Ｚａ-ｚ𐐀-𐑏𐒰-𐓓𐓘-𐓻𐲀-𐲲𐳀-𐳲𑢠-𑣟𞤀-𞥃]+",
    r"\s?[!-/:-~！-／：-～‘-‟　-。]+",
    r"\s+$",
    r"[一-龥ࠀ-一가-퟿]+",
    r"\p{N}+",
];
/// DeepSeek Coder (v1).
const DEEPSEEK_CODER: &[&str] = &[
    "[\r\n]",
    r"\s?\p{L}+",
    r"\s?\p{P}+",
    r"[一-龥ࠀ-一가-퟿]+",
    r"\p{N}",
];
/// DeepSeek V3 (also Hunyuan dense, JoyAI, HY v4): digits in threes and CJK runs first.
const DEEPSEEK3_WORDS: &str = r##"[!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"##;
const CJK_KANA: &str = r"[一-龥぀-ゟ゠-ヿ]+";
/// Spark 2.5.
const SPARK2_5_WORDS: &str = r##"[!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+|[\r\n]|\s+(?!\S)|\s+"##;
/// Falcon (v1).
const FALCON: &[&str] = &[r"[\p{P}\$\+<=>\^~\|`]+", GPT2, r"[0-9][0-9][0-9]"];
/// StarCoder and its kin (SmolLM, Command R, EXAONE, ...): single digits, then GPT-2's.
const STARCODER: &[&str] = &[r"\p{N}", GPT2];
/// BLOOM, Poro, GPT-3 Finnish.
const BLOOM: &str = r" ?[^(\s|.,!?…。，、।۔،)]+";
/// Chameleon.
const CHAMELEON: &[&str] = &[
    r"<sentinel:[0-9]+>",
    r"(IMGIMG)((A|B|C|D|E|F|G|H|I){1,4})Z",
    r"([\t\n]|    |  )",
    r"\p{N}",
    r"[\p{P}!-/:-@\[-`{-~]",
    GPT2,
];
/// SuperBPE: digit runs, cut in threes from the right.
const SUPERBPE: &[&str] = &[r"\p{N}+", r"(?=(\d{3})+(?!\d))"];
/// Bailing MoE (Ling): the contraction-first Qwen 2 shape with single-newline runs.
const BAILINGMOE: &str = r"'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]|\s+(?!\S)|\s+";
/// Seed-Coder: Qwen 2's without newlines after punctuation.
const SEED_CODER: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1}| ?[^\s\p{L}\p{N}\r\n]+|\s*[\r\n]+|\s+(?!\S)|\s+";
/// Ufakzeka: Qwen 2's without the English contractions.
const UFAKZEKA: &str =
    r"[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// Laguna: lines first, then Qwen 2's.
const LINES: &str = r"[^\n]+|[\n]+";
/// EXAONE MoE: letters joined across single spaces.
const EXAONE_MOE: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?(?:\p{L}\p{M}*(?: \p{L}\p{M}*)*)+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]?|\s*[\r\n]|\s+(?!\S)|\s+";
/// MiniCPM 5: digits in threes first.
const MINICPM5: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}+| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// What a `tokenizer.ggml.pre` name selects.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PreTokenizer {
    /// Applied in turn, each to every piece the previous one made.
    pub patterns: &'static [&'static str],
    /// A word that is itself a token is emitted whole, without merging (HF's `ignore_merges`).
    pub ignore_merges: bool,
    /// Whether BOS is prepended when the file does not say (`add_bos_token` absent).
    pub default_add_bos: bool,
}

/// `tokenizer.ggml.pre` names llama.cpp knows whose tokenizers Muser cannot run (a custom
/// splitter in llama.cpp's code, or a BPE over raw UTF-8 rather than GPT-2's byte alphabet).
const UNSUPPORTED: &[&str] = &[
    "kimi-k2",
    "afmoe",
    "gemma4",
    "granite-embed-multi-311m",
    "sarvam-moe",
    "whitespace",
];

impl PreTokenizer {
    /// The pre-tokenizer `pre` names: every name llama.cpp maps (its `llama_vocab::load`), to
    /// the same patterns and settings, but for a missing name, `""` and `"default"`: those
    /// select GPT-2's own pattern (HF's `ByteLevel`), as `"gpt2"` does, where llama.cpp's
    /// "default" is a list of its own. Any other name is refused, naming it.
    pub fn for_name(pre: Option<&str>) -> Result<PreTokenizer, TokenizerError> {
        let name = pre.unwrap_or("");
        let p = |patterns, ignore_merges, default_add_bos| PreTokenizer {
            patterns,
            ignore_merges,
            default_add_bos,
        };
        Ok(match name {
            "" | "default" | "gpt2" | "gpt-2" | "phi-2" | "jina-es" | "jina-de" | "gigachat"
            | "jina-v2-es" | "jina-v2-de" | "a.x-4.0" | "mellum" | "modern-bert" | "mpt"
            | "olmo" | "jais" | "trillion" | "granite-docling" | "exaone4" | "jina-v1-en"
            | "jina-v2-code" | "roberta-bpe" => p(&[GPT2], false, false),
            "llama3" | "llama-v3" | "llama-bpe" | "falcon3" | "falcon-h1" | "pixtral"
            | "midm-2.0" | "lfm2" | "jina-v5-nano" => p(&[LLAMA3], true, true),
            "dbrx" | "smaug-bpe" | "chatglm-bpe" => p(&[LLAMA3], false, false),
            "glm4" | "glm5" => p(&[LLAMA3], true, false),
            "jais-2" => p(&[JAIS2], false, false),
            "qwen2" | "deepseek-r1-qwen" | "kormo" | "f2llmv2" | "megrez" | "stablelm2"
            | "hunyuan" | "solar-open" | "grok-2" => p(&[QWEN2], false, false),
            "qwen35" => p(&[QWEN35], false, false),
            "laguna" => p(&[LINES, QWEN2], false, false),
            "deepseek-llm" => p(DEEPSEEK_LLM, false, false),
            "deepseek-coder" => p(DEEPSEEK_CODER, false, false),
            "deepseek-v3" | "hunyuan-dense" | "joyai-llm" | "hy_v4" => {
                p(&[r"\p{N}{1,3}", CJK_KANA, DEEPSEEK3_WORDS], false, false)
            }
            "spark2_5" => p(
                &[r"\p{N}{1,3}", CJK_KANA, SPARK2_5_WORDS, r"\p{N}"],
                false,
                false,
            ),
            "youtu" => p(&[YOUTU, YOUTU_WORDS], true, false),
            "falcon" => p(FALCON, false, false),
            "starcoder" | "refact" | "command-r" | "smollm" | "codeshell" | "exaone"
            | "minerva-7b" | "mellum2" => p(STARCODER, false, false),
            "poro-chat" | "bloom" | "gpt3-finnish" => p(&[BLOOM], false, false),
            "viking" => p(&[BLOOM, r"\p{N}"], false, false),
            "tekken" => p(&[TEKKEN], true, true),
            "chameleon" => p(CHAMELEON, false, true),
            "gpt-4o" | "llama4" | "kanana2" | "talkie" | "minimax-m2" => p(&[GPT4O], false, false),
            "granite-embed-multi-97m" => p(&[GRANITE_EMB_MULTI], true, false),
            "tiny_aya" | "cohere2moe" => p(&[DIGITS_FROM_RIGHT, TINY_AYA], false, false),
            "superbpe" => p(SUPERBPE, false, false),
            "bailingmoe" | "bailingmoe2" | "llada-moe" => p(&[BAILINGMOE], false, false),
            "seed-coder" => p(&[SEED_CODER], false, false),
            "ufakzeka" => p(&[UFAKZEKA], false, false),
            "exaone-moe" => p(&[EXAONE_MOE], false, false),
            "minicpm5" => p(&[r"\p{N}{1,3}", MINICPM5], true, false),
            other => {
                let found = if UNSUPPORTED.contains(&other) {
                    format!(
                        "{other:?}, which llama.cpp knows but Muser does not implement (a \
                         splitter of its own, or BPE over raw UTF-8)"
                    )
                } else {
                    format!("{other:?}, a name neither llama.cpp nor Muser knows")
                };
                return Err(TokenizerError::WrongType {
                    key: "tokenizer.ggml.pre",
                    expected: "a known pre-tokenizer type",
                    found,
                });
            }
        })
    }
}

pub struct BpeEncoder {
    /// The pre-tokenizer's patterns, applied in turn.
    regexes: Vec<Regex>,
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
        let regexes = pre
            .patterns
            .iter()
            .map(|p| Regex::new(p).map_err(|e| TokenizerError::Regex(e.to_string())))
            .collect::<Result<Vec<_>, _>>()?;
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
            regexes,
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
        match self.regexes.as_slice() {
            [regex] => split(regex, text, |w| self.encode_word(w.as_bytes(), vocab, out)),
            regexes => {
                let mut words = vec![text];
                let mut next = Vec::new();
                for regex in regexes {
                    for w in words.drain(..) {
                        split(regex, w, |piece| next.push(piece));
                    }
                    std::mem::swap(&mut words, &mut next);
                }
                for w in words {
                    self.encode_word(w.as_bytes(), vocab, out);
                }
            }
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

/// Cuts `text` into the regex's matches and the text between them (each non-empty, in order).
fn split<'t>(regex: &Regex, text: &'t str, mut emit: impl FnMut(&'t str)) {
    let mut end = 0;
    for m in regex.find_iter(text) {
        let Ok(m) = m else {
            // The backtracking limit was hit: the rest is one piece rather than lost.
            break;
        };
        if m.start() > end {
            emit(&text[end..m.start()]);
        }
        // A pattern of lookaheads alone (SuperBPE's) matches empty text: a cut, no piece.
        if m.end() > m.start() {
            emit(m.as_str());
        }
        end = end.max(m.end());
    }
    if end < text.len() {
        emit(&text[end..]);
    }
}
