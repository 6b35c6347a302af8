//! `muser synth`: synthetic GGUF models (Muse Glimmer at full size, tiny test presets, llama and
//! qwen3 presets) with sane weight statistics and a real byte-level BPE vocabulary.
