//! Tokenizers built from GGUF metadata: `gpt2` byte-level BPE and `llama` SentencePiece, special
//! tokens, and streaming detokenization that never splits a UTF-8 character.
