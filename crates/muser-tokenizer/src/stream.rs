//! Streaming detokenization of generated text: tokens arrive one at a time and may end inside a
//! UTF-8 character; only whole characters are handed out, the partial tail waits for the next
//! token. Control and unknown tokens (`<|bos|>`, a chat template's markers) give no text, as
//! llama.cpp's generated text leaves them out unless asked for special tokens.

use crate::{TokenType, Tokenizer, TokenizerError};

#[derive(Debug, Default, Clone)]
pub struct StreamDecoder {
    /// Bytes received but not yet handed out: at most one incomplete character.
    pending: Vec<u8>,
}

impl StreamDecoder {
    pub fn new() -> StreamDecoder {
        StreamDecoder::default()
    }

    /// Adds token `id` and returns the characters completed by it. A byte sequence that can
    /// never become valid UTF-8 comes out as U+FFFD at once rather than blocking the stream.
    /// A control or unknown token adds nothing.
    pub fn push(&mut self, tok: &Tokenizer, id: u32) -> Result<String, TokenizerError> {
        self.push_special(tok, id, false)
    }

    /// As `push`, but a control token gives its text when `special` is set (a chat format's
    /// markup the server must read back, llama-server's `preserved_tokens`).
    pub fn push_special(
        &mut self,
        tok: &Tokenizer,
        id: u32,
        special: bool,
    ) -> Result<String, TokenizerError> {
        match tok.token_type(id)? {
            TokenType::Unknown => return Ok(String::new()),
            TokenType::Control if !special => return Ok(String::new()),
            _ => {}
        }
        self.pending
            .extend_from_slice(tok.token_to_piece_bytes(id)?);
        let mut out = String::new();
        let mut done = 0;
        loop {
            match std::str::from_utf8(&self.pending[done..]) {
                Ok(s) => {
                    out.push_str(s);
                    done = self.pending.len();
                    break;
                }
                Err(e) => {
                    let valid = &self.pending[done..done + e.valid_up_to()];
                    out.push_str(&String::from_utf8_lossy(valid));
                    done += e.valid_up_to();
                    match e.error_len() {
                        Some(n) => {
                            out.push(char::REPLACEMENT_CHARACTER);
                            done += n;
                        }
                        // An incomplete character at the end: keep it for the next token.
                        None => break,
                    }
                }
            }
        }
        self.pending.drain(..done);
        Ok(out)
    }

    /// Bytes held back waiting for the rest of a character.
    pub fn pending(&self) -> &[u8] {
        &self.pending
    }

    /// Ends the stream: whatever is held back, lossily.
    pub fn flush(&mut self) -> String {
        let s = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        s
    }
}
