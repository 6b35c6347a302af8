//! Splits text at special tokens before any BPE sees it: a control token (`<|eot_id|>`) or a
//! user-defined (added) token found in the text becomes that one token id.
//!
//! Control tokens are matched only when the caller asks (`parse_special`), so user text cannot
//! forge them; user-defined tokens are always matched, as llama.cpp and HF tokenizers do. At each
//! position the longest token that matches wins.

use crate::TokenType;

/// A piece of input: raw bytes still to be tokenized, or a special token already found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fragment<'a> {
    Text(&'a [u8]),
    Token(u32),
}

struct Special {
    bytes: Vec<u8>,
    id: u32,
    control: bool,
}

pub struct SpecialMatcher {
    /// Indexed by a token's first byte; each list longest first.
    by_first_byte: Vec<Vec<Special>>,
}

impl SpecialMatcher {
    pub fn new(tokens: &[String], types: &[TokenType]) -> SpecialMatcher {
        let mut by_first_byte: Vec<Vec<Special>> = (0..256).map(|_| Vec::new()).collect();
        for (id, (text, &ty)) in tokens.iter().zip(types).enumerate() {
            let control = match ty {
                TokenType::Control => true,
                TokenType::UserDefined => false,
                _ => continue,
            };
            if let Some(&first) = text.as_bytes().first() {
                let bytes = text.as_bytes().to_vec();
                by_first_byte[first as usize].push(Special {
                    bytes,
                    id: id as u32,
                    control,
                });
            }
        }
        for list in &mut by_first_byte {
            list.sort_by(|a, b| b.bytes.len().cmp(&a.bytes.len()).then(a.id.cmp(&b.id)));
        }
        SpecialMatcher { by_first_byte }
    }

    /// Splits `text` into raw-text fragments and special tokens, in order. Empty text fragments
    /// are never produced.
    pub fn split<'a>(&self, text: &'a [u8], parse_special: bool) -> Vec<Fragment<'a>> {
        let mut out = Vec::new();
        let (mut pos, mut text_start) = (0, 0);
        while pos < text.len() {
            let rest = &text[pos..];
            let found = self.by_first_byte[rest[0] as usize]
                .iter()
                .find(|s| (parse_special || !s.control) && rest.starts_with(&s.bytes));
            match found {
                Some(s) => {
                    if text_start < pos {
                        out.push(Fragment::Text(&text[text_start..pos]));
                    }
                    out.push(Fragment::Token(s.id));
                    pos += s.bytes.len();
                    text_start = pos;
                }
                None => pos += 1,
            }
        }
        if text_start < text.len() {
            out.push(Fragment::Text(&text[text_start..]));
        }
        out
    }
}
