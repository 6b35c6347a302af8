//! Tiny hand-built models for the engine tests: random weights of every supported matrix type,
//! written to an in-memory GGUF.
#![allow(dead_code)]

use muser_engine::{CpuBackend, Model};
use muser_gguf::{GgmlType, GgufFile, MetaValue, TensorSpec};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::sync::Arc;

#[derive(Clone)]
pub struct Tiny {
    pub arch: &'static str,
    pub n_layer: usize,
    pub n_embd: usize,
    pub n_ff: usize,
    pub n_head: usize,
    pub n_head_kv: usize,
    pub head_dim: usize,
    pub n_vocab: usize,
    pub window: usize,
    pub full_interval: usize,
    pub tied: bool,
    pub seed: u64,
}

impl Tiny {
    pub fn new(arch: &'static str) -> Tiny {
        Tiny {
            arch,
            n_layer: 3,
            n_embd: 256,
            n_ff: 512,
            n_head: 4,
            n_head_kv: 2,
            head_dim: 64,
            n_vocab: 320,
            window: 16,
            full_interval: 2,
            tied: arch != "muse",
            seed: 7,
        }
    }

    pub fn metadata(&self) -> Vec<(String, MetaValue)> {
        let a = self.arch;
        let k = |s: &str| format!("{a}.{s}");
        let mut m = vec![
            (
                "general.architecture".to_string(),
                MetaValue::String(a.to_string()),
            ),
            (k("block_count"), MetaValue::U32(self.n_layer as u32)),
            (k("embedding_length"), MetaValue::U32(self.n_embd as u32)),
            (k("feed_forward_length"), MetaValue::U32(self.n_ff as u32)),
            (
                k("attention.head_count"),
                MetaValue::U32(self.n_head as u32),
            ),
            (
                k("attention.head_count_kv"),
                MetaValue::U32(self.n_head_kv as u32),
            ),
            (
                k("attention.key_length"),
                MetaValue::U32(self.head_dim as u32),
            ),
            (
                k("attention.value_length"),
                MetaValue::U32(self.head_dim as u32),
            ),
            (k("vocab_size"), MetaValue::U32(self.n_vocab as u32)),
            (k("context_length"), MetaValue::U32(4096)),
            (k("attention.layer_norm_rms_epsilon"), MetaValue::F32(1e-5)),
            (k("rope.freq_base"), MetaValue::F32(10000.0)),
        ];
        if a == "muse" {
            m.push((k("attention.post_norm_rms_epsilon"), MetaValue::F32(1e-8)));
            m.push((
                k("attention.sliding_window"),
                MetaValue::U32(self.window as u32),
            ));
            m.push((
                k("attention.full_attention_interval"),
                MetaValue::U32(self.full_interval as u32),
            ));
            m.push((k("logit_scale"), MetaValue::F32(0.5)));
            m.push((k("final_logit_softcapping"), MetaValue::F32(20.0)));
        }
        m
    }

    /// (name, dims innermost first, type) of every tensor, in a fixed order.
    pub fn tensor_specs(&self) -> Vec<TensorSpec> {
        use GgmlType::*;
        let (e, ff, hd) = (self.n_embd as u64, self.n_ff as u64, self.head_dim as u64);
        let qw = (self.n_head * self.head_dim) as u64;
        let kvw = (self.n_head_kv * self.head_dim) as u64;
        let nv = self.n_vocab as u64;
        let muse = self.arch == "muse";
        let qkn = muse || self.arch == "qwen3";
        let mut t = vec![TensorSpec::new("token_embd.weight", &[e, nv], Q4_K)];
        for i in 0..self.n_layer {
            let n = |s: &str| format!("blk.{i}.{s}.weight");
            t.push(TensorSpec::new(n("attn_norm"), &[e], F32));
            t.push(TensorSpec::new(n("attn_q"), &[e, qw], Q4_K));
            t.push(TensorSpec::new(n("attn_k"), &[e, kvw], Q5_K));
            t.push(TensorSpec::new(n("attn_v"), &[e, kvw], Q6_K));
            if muse {
                t.push(TensorSpec::new(n("attn_gate"), &[e, qw], Q8_0));
            }
            if qkn {
                t.push(TensorSpec::new(n("attn_q_norm"), &[hd], F32));
                t.push(TensorSpec::new(n("attn_k_norm"), &[hd], F32));
            }
            t.push(TensorSpec::new(n("attn_output"), &[qw, e], F16));
            if muse {
                t.push(TensorSpec::new(n("post_attention_norm"), &[e], F32));
            }
            t.push(TensorSpec::new(n("ffn_norm"), &[e], F32));
            t.push(TensorSpec::new(n("ffn_gate"), &[e, ff], Q4_K));
            t.push(TensorSpec::new(n("ffn_up"), &[e, ff], BF16));
            t.push(TensorSpec::new(
                n("ffn_down"),
                &[ff, e],
                if i % 2 == 0 { Q6_K } else { F32 },
            ));
            if muse {
                t.push(TensorSpec::new(n("post_ffw_norm"), &[e], F32));
            }
        }
        t.push(TensorSpec::new("output_norm.weight", &[e], F32));
        if !self.tied {
            t.push(TensorSpec::new("output.weight", &[e, nv], Q5_K));
        }
        t
    }

    /// Random data for a spec: norms near 1, matrices ~ U(-1, 1) / sqrt(cols) * 1.7.
    pub fn data(spec: &TensorSpec, rng: &mut StdRng) -> Vec<u8> {
        let n: u64 = spec.dims.iter().product();
        let cols = spec.dims[0] as usize;
        let vals: Vec<f32> = if spec.dims.len() == 1 {
            (0..n).map(|_| 1.0 + rng.gen_range(-0.2..0.2)).collect()
        } else {
            let s = 1.7 / (cols as f32).sqrt();
            (0..n).map(|_| rng.gen_range(-s..s)).collect()
        };
        quantize(spec.ggml_type, &vals, cols)
    }

    pub fn tensors(&self) -> Vec<(TensorSpec, Vec<u8>)> {
        let mut rng = StdRng::seed_from_u64(self.seed);
        self.tensor_specs()
            .into_iter()
            .map(|s| {
                let d = Tiny::data(&s, &mut rng);
                (s, d)
            })
            .collect()
    }

    pub fn bytes(&self) -> Vec<u8> {
        muser_gguf::write_to_vec(&self.metadata(), &self.tensors()).unwrap()
    }

    pub fn model(&self) -> Model {
        load(self.bytes()).unwrap()
    }
}

pub fn load(bytes: Vec<u8>) -> muser_engine::Result<Model> {
    let file = Arc::new(GgufFile::from_bytes(bytes)?);
    Model::from_gguf(file, CpuBackend::new(Some(2))?)
}

/// Quantizes rows of `cols` values to `ty`.
pub fn quantize(ty: GgmlType, vals: &[f32], cols: usize) -> Vec<u8> {
    let rb = ty.row_bytes(cols as u64).unwrap() as usize;
    let mut out = vec![0u8; rb * (vals.len() / cols)];
    for (src, dst) in vals.chunks(cols).zip(out.chunks_mut(rb)) {
        muser_quant::quantize_row(ty, src, dst).unwrap();
    }
    out
}

pub fn nmse(a: &[f32], b: &[f32]) -> f64 {
    assert_eq!(a.len(), b.len());
    assert!(
        a.iter().chain(b).all(|v| v.is_finite()),
        "non-finite values"
    );
    let num: f64 = a.iter().zip(b).map(|(x, y)| ((x - y) as f64).powi(2)).sum();
    let den: f64 = b.iter().map(|y| (*y as f64).powi(2)).sum();
    num / den
}

pub fn random_tokens(n: usize, n_vocab: usize, seed: u64) -> Vec<u32> {
    let mut rng = StdRng::seed_from_u64(seed);
    (0..n).map(|_| rng.gen_range(0..n_vocab as u32)).collect()
}
