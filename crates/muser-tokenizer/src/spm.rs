//! `llama` SentencePiece BPE: spaces become `▁` (with one `▁` prepended to a text fragment that
//! starts the input or follows a special token, as llama.cpp does), the text starts as one
//! symbol per character, and the adjacent pair whose concatenation is the token of highest
//! score is merged (leftmost first among equal scores) until no concatenation is a token. A
//! final symbol that is not a token falls back to its bytes' `<0xXX>` tokens, or to `unk`.

use std::cmp::Ordering;
use std::collections::{BinaryHeap, HashMap};

pub struct SpmEncoder {
    /// (n_vocab) token scores; all zero when the file has none.
    scores: Vec<f32>,
    /// The `<0xXX>` token of each byte, where the vocabulary has one.
    byte_tokens: [Option<u32>; 256],
    unk: Option<u32>,
    add_space_prefix: bool,
}

/// The SentencePiece space.
pub const SPACE: char = '\u{2581}';

struct Symbol {
    /// Byte range of this symbol in the escaped text.
    start: u32,
    len: u32,
    prev: u32,
    next: u32,
}

const NONE: u32 = u32::MAX;

/// A candidate merge: highest score first, then leftmost.
struct Bigram {
    score: f32,
    left: u32,
    right: u32,
    /// Bytes of the merged text, to recognise a stale entry.
    len: u32,
}

impl PartialEq for Bigram {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}
impl Eq for Bigram {}
impl PartialOrd for Bigram {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Bigram {
    fn cmp(&self, other: &Self) -> Ordering {
        self.score
            .total_cmp(&other.score)
            .then(other.left.cmp(&self.left))
    }
}

/// Parses a byte-fallback token text `<0xXX>`.
pub fn parse_byte_token(text: &str) -> Option<u8> {
    let hex = text.strip_prefix("<0x")?.strip_suffix('>')?;
    if hex.len() != 2 {
        return None;
    }
    u8::from_str_radix(hex, 16).ok()
}

impl SpmEncoder {
    pub fn new(
        vocab: &HashMap<String, u32>,
        scores: Vec<f32>,
        unk: Option<u32>,
        add_space_prefix: bool,
    ) -> SpmEncoder {
        let mut byte_tokens = [None; 256];
        for (b, slot) in byte_tokens.iter_mut().enumerate() {
            *slot = vocab.get(&format!("<0x{b:02X}>")).copied();
        }
        SpmEncoder {
            scores,
            byte_tokens,
            unk,
            add_space_prefix,
        }
    }

    /// Tokenizes raw text (no special tokens in it); `at_start` is true for a fragment that
    /// starts the input or follows a special token. Invalid UTF-8 bytes go straight to byte
    /// fallback.
    pub fn encode(
        &self,
        text: &[u8],
        at_start: bool,
        vocab: &HashMap<String, u32>,
        out: &mut Vec<u32>,
    ) {
        let mut escaped = String::with_capacity(text.len() + 3);
        if self.add_space_prefix && at_start {
            escaped.push(SPACE);
        }
        for chunk in text.utf8_chunks() {
            for c in chunk.valid().chars() {
                escaped.push(if c == ' ' { SPACE } else { c });
            }
            if !chunk.invalid().is_empty() {
                self.encode_escaped(&escaped, vocab, out);
                escaped.clear();
                self.byte_fallback(chunk.invalid(), out);
            }
        }
        self.encode_escaped(&escaped, vocab, out);
    }

    fn byte_fallback(&self, bytes: &[u8], out: &mut Vec<u32>) {
        for &b in bytes {
            if let Some(id) = self.byte_tokens[b as usize].or(self.unk) {
                out.push(id);
            }
        }
    }

    fn encode_escaped(&self, text: &str, vocab: &HashMap<String, u32>, out: &mut Vec<u32>) {
        if text.is_empty() {
            return;
        }
        let mut syms: Vec<Symbol> = Vec::with_capacity(text.len());
        for (start, c) in text.char_indices() {
            let i = syms.len() as u32;
            syms.push(Symbol {
                start: start as u32,
                len: c.len_utf8() as u32,
                prev: i.wrapping_sub(1),
                next: i + 1,
            });
        }
        if let Some(last) = syms.last_mut() {
            last.next = NONE;
        }
        let mut heap = BinaryHeap::new();
        let try_push = |heap: &mut BinaryHeap<Bigram>, syms: &[Symbol], left: u32, right: u32| {
            let (l, r) = (&syms[left as usize], &syms[right as usize]);
            let len = l.len + r.len;
            let piece = &text[l.start as usize..(l.start + len) as usize];
            if let Some(&id) = vocab.get(piece) {
                let score = self.scores.get(id as usize).copied().unwrap_or(0.0);
                heap.push(Bigram {
                    score,
                    left,
                    right,
                    len,
                });
            }
        };
        for i in 1..syms.len() as u32 {
            try_push(&mut heap, &syms, i - 1, i);
        }
        while let Some(b) = heap.pop() {
            let (l, r) = (&syms[b.left as usize], &syms[b.right as usize]);
            // Stale if either side has been merged away or grown since the entry was made.
            if l.len == 0 || r.len == 0 || l.next != b.right || l.len + r.len != b.len {
                continue;
            }
            let next = r.next;
            syms[b.left as usize].len = b.len;
            syms[b.left as usize].next = next;
            syms[b.right as usize].len = 0;
            if next != NONE {
                syms[next as usize].prev = b.left;
                try_push(&mut heap, &syms, b.left, next);
            }
            let prev = syms[b.left as usize].prev;
            if prev != NONE {
                try_push(&mut heap, &syms, prev, b.left);
            }
        }
        let mut i = 0;
        while i != NONE {
            let s = &syms[i as usize];
            let piece = &text[s.start as usize..(s.start + s.len) as usize];
            match vocab.get(piece) {
                Some(&id) => out.push(id),
                None => self.byte_fallback(piece.as_bytes(), out),
            }
            i = s.next;
        }
    }
}
