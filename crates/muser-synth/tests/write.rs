//! Writes small presets to disk and reads them back with the GGUF reader.

use muser_gguf::{GgufFile, MetaValue};
use muser_synth::{find_preset, layout, synthesize};
use std::path::PathBuf;

fn temp(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("muser-synth-test-{}-{name}", std::process::id()))
}

fn write(preset: &str, seed: u64, tag: &str) -> (PathBuf, Vec<u8>) {
    let path = temp(&format!("{preset}-{seed}-{tag}.gguf"));
    synthesize(find_preset(preset).unwrap(), &path, seed, false).unwrap();
    let bytes = std::fs::read(&path).unwrap();
    (path, bytes)
}

#[test]
fn every_preset_tensor_reads_back_with_its_dims_and_type() {
    for name in ["muse-tiny", "llama-tiny", "qwen3-tiny"] {
        let p = find_preset(name).unwrap();
        let (path, _) = write(name, 1, "layout");
        let f = GgufFile::open(&path).unwrap();
        let plan = layout(p);
        assert_eq!(f.tensors.len(), plan.len());
        for t in &plan {
            let info = f
                .tensor(&t.spec.name)
                .unwrap_or_else(|| panic!("{name}: {} missing", t.spec.name));
            assert_eq!(info.dims, t.spec.dims, "{}", t.spec.name);
            assert_eq!(info.ggml_type, t.spec.ggml_type, "{}", t.spec.name);
            assert_eq!(info.n_bytes, t.n_bytes());
        }
        let arch = p.arch.name();
        assert_eq!(f.get_str("general.architecture").unwrap(), arch);
        assert_eq!(
            f.get_u32(&format!("{arch}.block_count")).unwrap(),
            p.block_count
        );
        assert_eq!(
            f.get_u32(&format!("{arch}.embedding_length")).unwrap() as u64,
            p.embedding_length
        );
        assert_eq!(
            f.get_u32(&format!("{arch}.vocab_size")).unwrap() as u64,
            p.vocab_size
        );
        let tokens = f.get_str_array("tokenizer.ggml.tokens").unwrap();
        assert_eq!(tokens.len() as u64, p.vocab_size);
        assert_eq!(
            f.get_i64_array("tokenizer.ggml.token_type").unwrap().len(),
            tokens.len()
        );
        let bos = f.get_u32("tokenizer.ggml.bos_token_id").unwrap() as usize;
        assert_eq!(tokens[bos], "<|begin_of_text|>");
        assert_eq!(
            tokens[f.get_u32("tokenizer.ggml.eot_token_id").unwrap() as usize],
            "<|eot_id|>"
        );
        let merges = f.get_str_array("tokenizer.ggml.merges").unwrap();
        assert_eq!(
            merges.len(),
            bos - 256,
            "one token per merge after the 256 byte tokens"
        );
        // Each merge's two halves are tokens, and their join is the token the merge makes.
        for (i, m) in merges.iter().enumerate() {
            let (a, b) = m.split_once(' ').unwrap();
            assert!(
                tokens[..256 + i].contains(&a) && tokens[..256 + i].contains(&b),
                "{m}"
            );
            assert_eq!(format!("{a}{b}"), tokens[256 + i]);
        }
        std::fs::remove_file(&path).unwrap();
    }
}

#[test]
fn muse_tiny_has_every_muse_key() {
    let (path, _) = write("muse-tiny", 3, "keys");
    let f = GgufFile::open(&path).unwrap();
    for key in [
        "muse.context_length",
        "muse.feed_forward_length",
        "muse.attention.head_count",
        "muse.attention.head_count_kv",
        "muse.attention.key_length",
        "muse.attention.value_length",
        "muse.attention.sliding_window",
        "muse.attention.full_attention_interval",
        "muse.attention.layer_norm_rms_epsilon",
        "muse.attention.post_norm_rms_epsilon",
        "muse.rope.freq_base",
        "muse.rope.dimension_count",
        "muse.logit_scale",
        "muse.final_logit_softcapping",
        "general.file_type",
        "general.quantization_version",
        "tokenizer.ggml.model",
        "tokenizer.ggml.pre",
        "tokenizer.ggml.add_bos_token",
    ] {
        assert!(f.get(key).is_some(), "{key} missing");
    }
    assert_eq!(
        f.get("muse.attention.sliding_window"),
        Some(&MetaValue::U32(32))
    );
    assert_eq!(f.get_str("tokenizer.ggml.model").unwrap(), "gpt2");
    std::fs::remove_file(&path).unwrap();
}

#[test]
fn same_seed_same_bytes_different_seed_different_weights() {
    let (pa, a) = write("llama-tiny", 5, "a");
    let (pb, b) = write("llama-tiny", 5, "b");
    let (pc, c) = write("llama-tiny", 6, "c");
    assert_eq!(a, b);
    assert_eq!(a.len(), c.len());
    let fa = GgufFile::open(&pa).unwrap();
    let fc = GgufFile::open(&pc).unwrap();
    for (ta, tc) in fa.tensors.iter().zip(&fc.tensors) {
        assert_ne!(
            fa.tensor_data(ta),
            fc.tensor_data(tc),
            "{} did not change with the seed",
            ta.name
        );
    }
    for p in [pa, pb, pc] {
        std::fs::remove_file(p).unwrap();
    }
}

/// The written vocabulary, read by muser-tokenizer, tokenizes text exactly as the trainer's own
/// encoder does, and round-trips text the trainer never saw.
#[test]
fn the_tokenizer_crate_reproduces_the_trainers_segmentation() {
    use muser_synth::bpe::{Bpe, CORPUS, REGEX_LLAMA_BPE, REGEX_QWEN2};
    for (name, pattern) in [("muse-tiny", REGEX_LLAMA_BPE), ("qwen3-tiny", REGEX_QWEN2)] {
        let p = find_preset(name).unwrap();
        let (path, _) = write(name, 1, "tok");
        let tok = muser_tokenizer::Tokenizer::from_gguf(&GgufFile::open(&path).unwrap()).unwrap();
        let bpe = Bpe::train(CORPUS, pattern, p.max_merges);
        let text = "The keeper's 1887 lamp turned 4,320 times a day; it's still turning!\n  Zebras? naïve 🙂";
        for t in [CORPUS, text] {
            let ids = tok.encode(t, false, false);
            assert_eq!(ids, bpe.encode(pattern, t), "{name}");
            assert_eq!(tok.decode(&ids).unwrap(), t.as_bytes());
        }
        std::fs::remove_file(&path).unwrap();
    }
}

/// Dequantized with muser-quant, every tensor has the statistics the plan asked for.
#[test]
fn dequantized_weights_have_the_planned_statistics() {
    use muser_synth::Init;
    let p = find_preset("muse-tiny").unwrap();
    let (path, _) = write("muse-tiny", 9, "stats");
    let f = GgufFile::open(&path).unwrap();
    for t in layout(p) {
        let info = f.tensor(&t.spec.name).unwrap();
        let mut v = vec![0f32; info.n_elements() as usize];
        muser_quant::dequantize_row(info.ggml_type, f.tensor_data(info), &mut v).unwrap();
        assert!(v.iter().all(|x| x.is_finite()), "{}", t.spec.name);
        let n = v.len() as f64;
        let mean = v.iter().map(|&x| x as f64).sum::<f64>() / n;
        let sd = (v.iter().map(|&x| (x as f64 - mean).powi(2)).sum::<f64>() / n).sqrt();
        let (want_mean, want_sd) = match t.init {
            Init::Gaussian { std } => (0.0, std as f64),
            Init::NearOne => (1.0, 0.05),
        };
        let n_err = want_sd / n.sqrt(); // standard error of the mean
        assert!(
            (mean - want_mean).abs() < 5.0 * n_err + 0.02 * want_sd,
            "{}: mean {mean}",
            t.spec.name
        );
        assert!(
            (sd / want_sd - 1.0).abs() < 0.1 + 3.0 / n.sqrt(),
            "{}: std {sd} vs {want_sd}",
            t.spec.name
        );
    }
    std::fs::remove_file(&path).unwrap();
}
