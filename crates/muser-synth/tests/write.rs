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
            Init::Gaussian { std } | Init::Head { std, .. } => (0.0, std as f64),
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

/// The LM head's bigram structure, read back from the file: fed the output-normalised embedding
/// of a normal token t (a residual stream the layers left alone), the head's favourite is
/// succ(t), by a clear margin, yet with a probability well short of one; succ is a permutation
/// of the normal tokens.
#[test]
fn the_lm_head_favours_the_successor_of_the_input_token() {
    use muser_synth::weights::Bigram;
    for (name, seed) in [("llama-tiny", 11), ("qwen3-tiny", 12)] {
        let p = find_preset(name).unwrap();
        let (path, _) = write(name, seed, "bigram");
        let f = GgufFile::open(&path).unwrap();
        let read = |tensor: &str| {
            let info = f.tensor(tensor).unwrap();
            let mut v = vec![0f32; info.n_elements() as usize];
            muser_quant::dequantize_row(info.ggml_type, f.tensor_data(info), &mut v).unwrap();
            v
        };
        let (embd, head) = (read("token_embd.weight"), read("output.weight"));
        let d = p.embedding_length as usize;
        let bigram = Bigram::for_preset(p, seed);
        let n = bigram.succ.len();
        let bos = f.get_u32("tokenizer.ggml.bos_token_id").unwrap() as usize;
        assert_eq!(n, bos, "{name}: the table covers the learned tokens");
        let mut seen = vec![false; n];
        bigram.succ.iter().for_each(|&v| seen[v as usize] = true);
        assert!(seen.iter().all(|&s| s), "{name}: succ is a permutation");

        let (mut hits, mut p1s, mut gaps) = (0, Vec::new(), Vec::new());
        let tokens: Vec<usize> = (0..200).map(|i| (i * 7919 + seed as usize) % n).collect();
        for &t in &tokens {
            let e = &embd[t * d..(t + 1) * d];
            let rms = (e.iter().map(|x| x * x).sum::<f32>() / d as f32).sqrt();
            let logits: Vec<f64> = head
                .chunks_exact(d)
                .map(|w| w.iter().zip(e).map(|(a, b)| (a * b / rms) as f64).sum())
                .collect();
            let top = (0..logits.len())
                .max_by(|&a, &b| logits[a].total_cmp(&logits[b]))
                .unwrap();
            hits += (top == bigram.succ[t] as usize) as usize;
            let z: f64 = logits.iter().map(|l| (l - logits[top]).exp()).sum();
            p1s.push(1.0 / z);
            let second = (0..logits.len())
                .filter(|&v| v != top)
                .map(|v| logits[v])
                .fold(f64::NEG_INFINITY, f64::max);
            gaps.push(logits[top] - second);
        }
        let median = |v: &mut Vec<f64>| {
            v.sort_by(f64::total_cmp);
            v[v.len() / 2]
        };
        let (p1, gap) = (median(&mut p1s), median(&mut gaps));
        assert!(
            hits >= 190,
            "{name}: succ(t) is top-1 for {hits} of 200 tokens"
        );
        assert!(
            (0.3..0.99).contains(&p1),
            "{name}: median top-1 probability {p1}"
        );
        assert!(gap > 1.0, "{name}: median top-2 gap {gap} nats");
        std::fs::remove_file(&path).unwrap();
    }
}
