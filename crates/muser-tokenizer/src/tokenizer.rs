//! The tokenizer: lookup tables built once from [`TokenizerData`], then `encode` and `decode`.

use crate::bpe::{BpeEncoder, PreTokenizer};
use crate::special::{Fragment, SpecialMatcher};
use crate::spm::{parse_byte_token, SpmEncoder, SPACE};
use crate::{TokenType, TokenizerData, TokenizerError, TokenizerModel};
use muser_gguf::GgufFile;
use std::collections::HashMap;

/// Both boxed: each holds 256-entry byte tables.
enum Encoder {
    Bpe(Box<BpeEncoder>),
    Spm(Box<SpmEncoder>),
}

pub struct Tokenizer {
    model: TokenizerModel,
    /// (n_vocab) token texts as stored in the file.
    tokens: Vec<String>,
    /// (n_vocab) token types.
    types: Vec<TokenType>,
    /// Token text -> id; a text listed twice maps to its last id, as in llama.cpp.
    vocab: HashMap<String, u32>,
    /// Every token's decoded bytes, concatenated; token i is `pieces[piece_ends[i-1]..piece_ends[i]]`.
    pieces: Vec<u8>,
    /// (n_vocab) end offsets into `pieces`.
    piece_ends: Vec<u32>,
    special: SpecialMatcher,
    encoder: Encoder,
    bos: Option<u32>,
    eos: Option<u32>,
    eot: Option<u32>,
    eom: Option<u32>,
    /// Every token that ends generation, ascending.
    eog: Vec<u32>,
    fim: Fim,
    unk: Option<u32>,
    pad: Option<u32>,
    add_bos: bool,
    add_eos: bool,
    /// Whether encoding prepends a space (`tokenizer.ggml.add_space_prefix`; SentencePiece's
    /// default is true, byte-level BPE's false), which llama.cpp's detokenize takes back off.
    add_space_prefix: bool,
}

impl Tokenizer {
    /// Validates the description and builds the lookup tables.
    pub fn new(data: TokenizerData) -> Result<Tokenizer, TokenizerError> {
        let n_vocab = data.tokens.len();
        if n_vocab == 0 {
            return Err(TokenizerError::EmptyVocab);
        }
        if n_vocab > u32::MAX as usize {
            return Err(TokenizerError::LengthMismatch {
                key: "tokenizer.ggml.tokens",
                found: n_vocab,
                n_vocab: u32::MAX as usize,
            });
        }
        let check_len = |key, found: usize| {
            if found != 0 && found != n_vocab {
                Err(TokenizerError::LengthMismatch {
                    key,
                    found,
                    n_vocab,
                })
            } else {
                Ok(())
            }
        };
        check_len("tokenizer.ggml.scores", data.scores.len())?;
        check_len("tokenizer.ggml.token_type", data.token_types.len())?;
        let mut types = if data.token_types.is_empty() {
            vec![TokenType::Normal; n_vocab]
        } else {
            data.token_types
        };
        let check_id = |key, id: Option<u32>| match id {
            Some(id) if id as usize >= n_vocab => Err(TokenizerError::SpecialIdOutOfRange {
                key,
                id: id as u64,
                n_vocab,
            }),
            _ => Ok(id),
        };
        let bos = check_id("tokenizer.ggml.bos_token_id", data.bos)?;
        let eos = check_id("tokenizer.ggml.eos_token_id", data.eos)?;
        let eot = check_id("tokenizer.ggml.eot_token_id", data.eot)?;
        let eom = check_id("tokenizer.ggml.eom_token_id", data.eom)?;
        let fim = [
            check_id("tokenizer.ggml.fim_pre_token_id", data.fim_pre)?,
            check_id("tokenizer.ggml.fim_suf_token_id", data.fim_suf)?,
            check_id("tokenizer.ggml.fim_mid_token_id", data.fim_mid)?,
            check_id("tokenizer.ggml.fim_pad_token_id", data.fim_pad)?,
            check_id("tokenizer.ggml.fim_rep_token_id", data.fim_rep)?,
            check_id("tokenizer.ggml.fim_sep_token_id", data.fim_sep)?,
        ];
        let unk = check_id("tokenizer.ggml.unknown_token_id", data.unk)?;
        let pad = check_id("tokenizer.ggml.padding_token_id", data.pad)?;

        let mut vocab = HashMap::with_capacity(n_vocab);
        for (id, text) in data.tokens.iter().enumerate() {
            vocab.insert(text.clone(), id as u32);
        }

        // llama's defaults are SentencePiece's conventional ids, used only where they exist.
        let in_vocab = |id: u32| ((id as usize) < n_vocab).then_some(id);
        let add_space_prefix = data
            .add_space_prefix
            .unwrap_or(data.model == TokenizerModel::Llama);
        let (encoder, bos, eos, unk, add_bos) = match data.model {
            TokenizerModel::Gpt2 => {
                let pre = PreTokenizer::for_name(data.pre.as_deref())?;
                let add_bos = data.add_bos.unwrap_or(pre.default_add_bos);
                let bpe = BpeEncoder::new(&pre, &vocab, &data.merges)?;
                (Encoder::Bpe(Box::new(bpe)), bos, eos, unk, add_bos)
            }
            TokenizerModel::Llama => {
                let unk = unk.or_else(|| in_vocab(0));
                let scores = if data.scores.is_empty() {
                    vec![0.0; n_vocab]
                } else {
                    data.scores
                };
                let spm = SpmEncoder::new(&vocab, scores, unk, add_space_prefix);
                let (bos, eos) = (bos.or_else(|| in_vocab(1)), eos.or_else(|| in_vocab(2)));
                (
                    Encoder::Spm(Box::new(spm)),
                    bos,
                    eos,
                    unk,
                    data.add_bos.unwrap_or(true),
                )
            }
        };

        let found = find_special_tokens(&data.tokens, &vocab, &mut types, [eos, eot, eom], fim);
        let (eot, eom) = (found.eot, found.eom);

        let mut pieces = Vec::new();
        let mut piece_ends = Vec::with_capacity(n_vocab);
        for (text, &ty) in data.tokens.iter().zip(&types) {
            append_piece(&mut pieces, &encoder, text, ty);
            piece_ends.push(pieces.len() as u32);
        }
        Ok(Tokenizer {
            model: data.model,
            special: SpecialMatcher::new(&data.tokens, &types),
            tokens: data.tokens,
            types,
            vocab,
            pieces,
            piece_ends,
            encoder,
            bos,
            eos,
            eot,
            eom,
            eog: found.eog,
            fim: found.fim,
            unk,
            pad,
            add_bos,
            add_eos: data.add_eos.unwrap_or(false),
            add_space_prefix,
        })
    }

    /// Reads `tokenizer.ggml.*` from the file's metadata and builds the tokenizer.
    pub fn from_gguf(file: &GgufFile) -> Result<Tokenizer, TokenizerError> {
        Tokenizer::new(TokenizerData::from_gguf(file)?)
    }

    /// Tokenizes `text`. `add_special` prepends BOS (and appends EOS) where the file asks for
    /// them; `parse_special` lets control tokens written in the text become those tokens.
    pub fn encode(&self, text: &str, add_special: bool, parse_special: bool) -> Vec<u32> {
        self.encode_bytes(text.as_bytes(), add_special, parse_special)
    }

    /// As [`Tokenizer::encode`], for any bytes: byte-level BPE encodes each maximal invalid
    /// UTF-8 sequence from its bytes; SentencePiece sends invalid bytes to byte fallback.
    pub fn encode_bytes(&self, text: &[u8], add_special: bool, parse_special: bool) -> Vec<u32> {
        let mut out = Vec::with_capacity(text.len() / 3 + 2);
        if add_special && self.add_bos {
            out.extend(self.bos);
        }
        let mut after_special = true;
        for fragment in self.special.split(text, parse_special) {
            match fragment {
                Fragment::Token(id) => {
                    out.push(id);
                    after_special = true;
                }
                Fragment::Text(t) => {
                    match &self.encoder {
                        Encoder::Bpe(bpe) => bpe.encode(t, &self.vocab, &mut out),
                        Encoder::Spm(spm) => spm.encode(t, after_special, &self.vocab, &mut out),
                    }
                    after_special = false;
                }
            }
        }
        if add_special && self.add_eos {
            out.extend(self.eos);
        }
        out
    }

    /// The concatenated bytes of the tokens' pieces. Control tokens render as their text. For
    /// SentencePiece the `▁` prepended at encode time comes back as a leading space.
    pub fn decode(&self, ids: &[u32]) -> Result<Vec<u8>, TokenizerError> {
        let mut out = Vec::with_capacity(ids.len() * 4);
        for &id in ids {
            out.extend_from_slice(self.token_to_piece_bytes(id)?);
        }
        Ok(out)
    }

    /// The bytes token `id` stands for (possibly part of a UTF-8 character).
    pub fn token_to_piece_bytes(&self, id: u32) -> Result<&[u8], TokenizerError> {
        let i = self.check(id)?;
        let start = if i == 0 {
            0
        } else {
            self.piece_ends[i - 1] as usize
        };
        Ok(&self.pieces[start..self.piece_ends[i] as usize])
    }

    /// Token `id` alone as llama.cpp's `detokenize({id}, special = true)` gives it (what its DRY
    /// sampler matches sequence breakers against): the piece, control tokens' text included,
    /// less one leading space where the vocabulary adds a space prefix (SentencePiece's `▁`).
    /// llama.cpp's space clean-up of some BPE vocabularies (" ," to ",", " 's" to "'s") is not
    /// applied: it changes no token's match against DRY's default breakers.
    pub fn detokenized_piece(&self, id: u32) -> Result<&[u8], TokenizerError> {
        let piece = self.token_to_piece_bytes(id)?;
        Ok(match piece {
            [b' ', rest @ ..] if self.add_space_prefix => rest,
            _ => piece,
        })
    }

    /// The token's text as stored in the file.
    pub fn token_text(&self, id: u32) -> Result<&str, TokenizerError> {
        Ok(&self.tokens[self.check(id)?])
    }

    pub fn token_type(&self, id: u32) -> Result<TokenType, TokenizerError> {
        Ok(self.types[self.check(id)?])
    }

    /// The id of the token whose stored text is exactly `text`.
    pub fn token_id(&self, text: &str) -> Option<u32> {
        self.vocab.get(text).copied()
    }

    fn check(&self, id: u32) -> Result<usize, TokenizerError> {
        if (id as usize) < self.tokens.len() {
            Ok(id as usize)
        } else {
            Err(TokenizerError::IdOutOfRange {
                id,
                n_vocab: self.tokens.len(),
            })
        }
    }

    pub fn model(&self) -> TokenizerModel {
        self.model
    }
    pub fn n_vocab(&self) -> usize {
        self.tokens.len()
    }
    pub fn bos(&self) -> Option<u32> {
        self.bos
    }
    pub fn eos(&self) -> Option<u32> {
        self.eos
    }
    pub fn eot(&self) -> Option<u32> {
        self.eot
    }
    pub fn eom(&self) -> Option<u32> {
        self.eom
    }
    pub fn unk(&self) -> Option<u32> {
        self.unk
    }
    pub fn pad(&self) -> Option<u32> {
        self.pad
    }
    /// Whether `encode(.., add_special = true, ..)` prepends BOS.
    pub fn add_bos(&self) -> bool {
        self.add_bos && self.bos.is_some()
    }
    pub fn add_eos(&self) -> bool {
        self.add_eos && self.eos.is_some()
    }

    /// End of generation: EOS, EOT, EOM, and (as in llama.cpp) every token whose text is a
    /// known end-of-turn marker, and the FIM pad, repo and file-separator tokens.
    pub fn is_eog(&self, id: u32) -> bool {
        self.eog.binary_search(&id).is_ok()
    }

    /// The tokens that end generation, ascending.
    pub fn eog_ids(&self) -> &[u32] {
        &self.eog
    }

    /// The fill-in-the-middle tokens the model has.
    pub fn fim(&self) -> Fim {
        self.fim
    }
}

// llama.cpp finds special tokens a file does not name by their text (its `llama_vocab` load,
// "auto-detect special tokens by text"); the lists are its lists.

/// End-of-turn texts, tried in this order when the file has no `eot_token_id`.
const EOT_TEXTS: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|end_of_text|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "<｜end▁of▁sentence｜>",
    "<end_of_utterance>",
];
const EOM_TEXTS: &[&str] = &["<|eom_id|>"];
/// FIM prefix, suffix, middle, pad, repo and file-separator texts, for ids the file lacks.
const FIM_TEXTS: [&[&str]; 6] = [
    &[
        "<|fim_prefix|>",
        "<fim-prefix>",
        "<fim_prefix>",
        "<｜fim▁begin｜>",
        "<PRE>",
        "▁<PRE>",
        "<|code_prefix|>",
        "<|prefix|>",
    ],
    &[
        "<|fim_suffix|>",
        "<fim-suffix>",
        "<fim_suffix>",
        "<｜fim▁hole｜>",
        "<SUF>",
        "▁<SUF>",
        "<|code_suffix|>",
        "<|suffix|>",
    ],
    &[
        "<|fim_middle|>",
        "<fim-middle>",
        "<fim_middle>",
        "<｜fim▁end｜>",
        "<MID>",
        "▁<MID>",
        "<|code_middle|>",
        "<|middle|>",
    ],
    &["<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"],
    &[
        "<|fim_repo|>",
        "<|repo_name|>",
        "<fim-repo>",
        "<REPO>",
        "<reponame>",
    ],
    &["<|file_sep|>"],
];
/// Texts of tokens that end generation wherever they are in the vocabulary.
const EOG_TEXTS: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<|return|>",
    "<|call|>",
    "<|flush|>",
    "<|calls|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "</s>",
    "<|eom_id|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "[EOS]",
    "<|end_of_text|>",
    "<end_of_utterance>",
    "<eos>",
    "<turn|>",
    "<|tool_response>",
    "<｜end▁of▁sentence｜>",
    "[e~[",
];

struct FoundSpecials {
    eot: Option<u32>,
    eom: Option<u32>,
    eog: Vec<u32>,
    fim: Fim,
}

/// The fill-in-the-middle tokens (`Tokenizer::fim`): named by the file
/// (`tokenizer.ggml.fim_*_token_id`) or found by their known texts, as llama.cpp finds them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Fim {
    /// Before the code that comes before the gap.
    pub pre: Option<u32>,
    /// Before the code that comes after it.
    pub suf: Option<u32>,
    /// Where the model writes the middle.
    pub mid: Option<u32>,
    pub pad: Option<u32>,
    /// Before a repository's name (repo-level prompts).
    pub rep: Option<u32>,
    /// Before each file's name (repo-level prompts).
    pub sep: Option<u32>,
}

/// Fills in EOT, EOM and the FIM tokens the file does not name from their texts, builds the
/// end-of-generation set, and makes every token found by its text a control token (as
/// llama.cpp does: such tokens are then matched in text only with `parse_special` and give no
/// text when generated). A text listed twice means its last id, as `vocab` keeps it.
fn find_special_tokens(
    tokens: &[String],
    vocab: &HashMap<String, u32>,
    types: &mut [TokenType],
    [eos, eot, eom]: [Option<u32>; 3],
    fim: [Option<u32>; 6],
) -> FoundSpecials {
    let by_text = |given: Option<u32>, texts: &[&str], types: &mut [TokenType]| {
        given.or_else(|| {
            let id = texts.iter().find_map(|t| vocab.get(*t).copied())?;
            types[id as usize] = TokenType::Control;
            Some(id)
        })
    };
    let eot = by_text(eot, EOT_TEXTS, types);
    let eom = by_text(eom, EOM_TEXTS, types);
    let mut fim_found = [None; 6];
    for (i, (given, texts)) in fim.into_iter().zip(FIM_TEXTS).enumerate() {
        fim_found[i] = by_text(given, texts, types);
    }
    // Pad, repo and file separator end generation (a FIM completion stops at them).
    let mut eog: Vec<u32> = fim_found[3..].iter().flatten().copied().collect();
    for text in EOG_TEXTS {
        if let Some(&id) = vocab.get(*text) {
            types[id as usize] = TokenType::Control;
            eog.push(id);
        }
    }
    eog.extend([eos, eot, eom].into_iter().flatten());
    eog.sort_unstable();
    eog.dedup();
    let with_text = |eog: &[u32], texts: &[&str]| {
        eog.iter()
            .copied()
            .find(|&id| texts.contains(&tokens[id as usize].as_str()))
    };
    // gpt-oss (harmony) and Solar Open end a turn with `<|end|>` but the answer goes on after
    // it (`<|return|>`, `<|call|>` end it): there `<|end|>` is an ordinary added token.
    if let Some(end) = with_text(&eog, &["<|end|>"]) {
        let call = with_text(&eog, &["<|call|>", "<|calls|>"]).is_some();
        let ret = with_text(&eog, &["<|return|>"]).is_some();
        let flush = with_text(&eog, &["<|flush|>"]).is_some();
        if call && (ret || flush) {
            eog.retain(|&id| id != end);
            types[end as usize] = TokenType::UserDefined;
        }
    }
    // Gemma 4 and PLaMo have an ordinary `</s>`.
    if let Some(s) = with_text(&eog, &["</s>"]) {
        if with_text(&eog, &["<|tool_response>", "<|plamo:eos|>"]).is_some() {
            eog.retain(|&id| id != s);
            types[s as usize] = TokenType::Normal;
        }
    }
    let [pre, suf, mid, pad, rep, sep] = fim_found;
    FoundSpecials {
        eot,
        eom,
        eog,
        fim: Fim {
            pre,
            suf,
            mid,
            pad,
            rep,
            sep,
        },
    }
}

/// Appends the bytes one token decodes to.
fn append_piece(out: &mut Vec<u8>, encoder: &Encoder, text: &str, ty: TokenType) {
    if matches!(ty, TokenType::Control | TokenType::UserDefined) {
        out.extend_from_slice(text.as_bytes());
        return;
    }
    match encoder {
        Encoder::Bpe(bpe) => out.extend_from_slice(&bpe.bytes.decode_text(text)),
        Encoder::Spm(_) => match (ty, parse_byte_token(text)) {
            (TokenType::Byte, Some(b)) => out.push(b),
            _ => {
                for c in text.chars() {
                    let c = if c == SPACE { ' ' } else { c };
                    out.extend_from_slice(c.encode_utf8(&mut [0; 4]).as_bytes());
                }
            }
        },
    }
}
