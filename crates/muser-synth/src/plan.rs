//! The byte plan of a preset: every tensor's name, dims, type and the statistics its weights are
//! drawn with, in file order. Computing it writes nothing, so sizes can be checked up front.

use crate::preset::{Arch, Preset};
use muser_gguf::{GgmlType, TensorSpec};

/// How a tensor's values are drawn.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Init {
    /// Zero-mean, roughly Gaussian values with this standard deviation.
    Gaussian { std: f32 },
    /// Norm weights: 1 plus small Gaussian noise (std 0.05).
    NearOne,
    /// The LM head (`weights.rs`, `Bigram`): every row has values of standard deviation `std`;
    /// the row of a token `succ(t)` is `alpha` times the normalised embedding row of `t` plus
    /// Gaussian noise of standard deviation `sqrt(std^2 - alpha^2)`, so a residual stream that
    /// carries `t`'s embedding favours `succ(t)`.
    Head { std: f32, alpha: f32 },
}

/// One tensor of the plan.
#[derive(Debug, Clone, PartialEq)]
pub struct PlannedTensor {
    pub spec: TensorSpec,
    pub init: Init,
}

impl PlannedTensor {
    /// Bytes of one row (`dims[0]` values).
    pub fn row_bytes(&self) -> u64 {
        self.spec
            .ggml_type
            .row_bytes(self.spec.dims[0])
            .expect("plan rows are whole blocks")
    }
    pub fn n_rows(&self) -> u64 {
        self.spec.dims[1..].iter().product()
    }
    pub fn n_bytes(&self) -> u64 {
        self.row_bytes() * self.n_rows()
    }
}

/// llama.cpp's `use_more_bits`: the first and last eighth of the layers and every third layer
/// in between get more bits in the Q4_K_M mix.
pub fn use_more_bits(i: u32, n: u32) -> bool {
    i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2
}

/// The tensor specs of a preset, in file order (what the GGUF header will list).
pub fn plan(p: &Preset) -> Vec<TensorSpec> {
    layout(p).into_iter().map(|t| t.spec).collect()
}

/// Total bytes of tensor data (without alignment padding).
pub fn weight_bytes(p: &Preset) -> u64 {
    layout(p).iter().map(PlannedTensor::n_bytes).sum()
}

/// Number of weights (values) of a preset.
pub fn parameter_count(p: &Preset) -> u64 {
    layout(p)
        .iter()
        .map(|t| t.spec.dims.iter().product::<u64>())
        .sum()
}

/// Standard deviation of the LM head's logits over the vocabulary, for an output-normalised
/// input (the random part; the favourite of `Init::Head` comes on top).
pub const HEAD_LOGIT_STD: f32 = 1.5;

/// Share of the input token's embedding in the direction of the last hidden state (its cosine),
/// as the architecture's residual stream leaves it. Llama and qwen3 add each branch's output
/// (standard deviations 1/sqrt(2 L) of `layout`) to the raw embedding: measured with `muser
/// logits` on llama-tiny, qwen3-tiny and llama-1b (2026-11-29), the stream keeps a cosine of
/// about 0.8 whatever the depth. Muse normalises the embedding and adds 2 L post-normed branches
/// of unit RMS, so the embedding keeps 1/sqrt(1 + 2 L) of the stream.
fn embedding_cosine(p: &Preset) -> f32 {
    match p.arch {
        Arch::Llama | Arch::Qwen3 => EMBEDDING_COSINE_LLAMA,
        Arch::Muse => 1.0 / (1.0 + 2.0 * p.block_count as f32).sqrt(),
    }
}
const EMBEDDING_COSINE_LLAMA: f32 = 0.9;

/// The LM head's initialisation: a bigram-like favourite on top of Gaussian logits of standard
/// deviation `HEAD_LOGIT_STD`.
///
/// Logits of independent Gaussians (std s) over a vocabulary of n tokens put one token's
/// probability at about one half when it stands ln n + s^2/2 above their mean (the sum of the
/// others' exp is n exp(s^2/2)). The favourite succ(t) gets that boost,
/// `b = alpha * logit_scale * <e_t, x>` with `<e_t, x> = d * cosine` (`embedding_cosine`, e_t
/// normalised to RMS 1); its
/// probability then varies around 0.5 with the noise and the layers, yet the gap to the
/// runner-up is rarely below a few hundredths of a nat. Muse's softcap is undone on the target.
/// Where the geometry asks for more (alpha above 0.9 std: the embedding is a small share of the
/// stream, as in muse-tiny), alpha is capped and the favourite is weaker.
pub fn head_init(p: &Preset) -> Init {
    let (ls, cap) = if p.arch == Arch::Muse {
        (p.logit_scale, p.final_logit_softcapping)
    } else {
        (1.0, 0.0)
    };
    let d = p.embedding_length as f32;
    let s = HEAD_LOGIT_STD;
    let mut boost = (p.vocab_size as f32).ln() + s * s / 2.0;
    if cap > 0.0 {
        boost = cap * (boost / cap).min(0.9).atanh();
    }
    let std = s / (ls * d.sqrt());
    let alpha = (boost / (ls * d * embedding_cosine(p))).min(0.9 * std);
    Init::Head { std, alpha }
}

/// The full plan: specs and initialisation. The type mix is Q4_K_M as SPEC section 2 gives it:
/// token_embd Q4_K, output Q5_K, attn_v Q6_K, ffn_down Q6_K on `use_more_bits` layers, every
/// other matrix Q4_K, norm weights F32.
pub fn layout(p: &Preset) -> Vec<PlannedTensor> {
    use GgmlType::{F32, Q4_K, Q5_K, Q6_K};
    let (d, ff, q, kv, hd) = (
        p.embedding_length,
        p.feed_forward_length,
        p.q_dim(),
        p.kv_dim(),
        p.head_dim,
    );
    let two_l = 2.0 * p.block_count as f32;
    let proj = Init::Gaussian {
        std: 1.0 / (d as f32).sqrt(),
    };
    let attn_out = Init::Gaussian {
        std: 1.0 / (q as f32 * two_l).sqrt(),
    };
    let ffn_down = Init::Gaussian {
        std: 1.0 / (ff as f32 * two_l).sqrt(),
    };
    let head = head_init(p);

    let mut out = Vec::new();
    let mut add = |name: String, dims: Vec<u64>, ggml_type: GgmlType, init: Init| {
        out.push(PlannedTensor {
            spec: TensorSpec {
                name,
                dims,
                ggml_type,
            },
            init,
        });
    };
    add(
        "token_embd.weight".into(),
        vec![d, p.vocab_size],
        Q4_K,
        Init::Gaussian { std: 1.0 },
    );
    for i in 0..p.block_count {
        let n = |s: &str| format!("blk.{i}.{s}.weight");
        let down_type = if use_more_bits(i, p.block_count) {
            Q6_K
        } else {
            Q4_K
        };
        add(n("attn_norm"), vec![d], F32, Init::NearOne);
        add(n("attn_q"), vec![d, q], Q4_K, proj);
        add(n("attn_k"), vec![d, kv], Q4_K, proj);
        add(n("attn_v"), vec![d, kv], Q6_K, proj);
        if p.arch == Arch::Muse {
            add(n("attn_gate"), vec![d, q], Q4_K, proj);
        }
        if matches!(p.arch, Arch::Muse | Arch::Qwen3) {
            add(n("attn_q_norm"), vec![hd], F32, Init::NearOne);
            add(n("attn_k_norm"), vec![hd], F32, Init::NearOne);
        }
        add(n("attn_output"), vec![q, d], Q4_K, attn_out);
        if p.arch == Arch::Muse {
            add(n("post_attention_norm"), vec![d], F32, Init::NearOne);
        }
        add(n("ffn_norm"), vec![d], F32, Init::NearOne);
        add(n("ffn_gate"), vec![d, ff], Q4_K, proj);
        add(n("ffn_up"), vec![d, ff], Q4_K, proj);
        add(n("ffn_down"), vec![ff, d], down_type, ffn_down);
        if p.arch == Arch::Muse {
            add(n("post_ffw_norm"), vec![d], F32, Init::NearOne);
        }
    }
    add("output_norm.weight".into(), vec![d], F32, Init::NearOne);
    add("output.weight".into(), vec![d, p.vocab_size], Q5_K, head);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::preset::{preset, PRESETS};

    #[test]
    fn muse_glimmer_weighs_what_the_spec_says() {
        let p = preset("muse-glimmer").unwrap();
        assert_eq!(weight_bytes(p), 16_754_989_056);
        let specs = plan(p);
        assert_eq!(specs.len(), 2 + 52 * 14 + 1);
        let t = |name: &str| specs.iter().find(|s| s.name == name).unwrap().clone();
        assert_eq!(t("token_embd.weight").dims, [6656, 202_048]);
        assert_eq!(t("blk.0.attn_gate.weight").dims, [6656, 4096]);
        assert_eq!(t("blk.7.attn_output.weight").dims, [4096, 6656]);
        assert_eq!(t("blk.7.attn_k.weight").dims, [6656, 256]);
        assert_eq!(t("blk.7.attn_q_norm.weight").dims, [128]);
        assert_eq!(t("blk.7.ffn_down.weight").dims, [19968, 6656]);
        assert_eq!(t("output.weight").ggml_type, GgmlType::Q5_K);
        assert_eq!(t("blk.51.attn_v.weight").ggml_type, GgmlType::Q6_K);
        let q6_downs = specs
            .iter()
            .filter(|s| s.name.ends_with("ffn_down.weight") && s.ggml_type == GgmlType::Q6_K)
            .count();
        assert_eq!(q6_downs, 26);
        assert!(specs
            .iter()
            .filter(|s| s.name.contains("norm"))
            .all(|s| s.ggml_type == GgmlType::F32));
    }

    #[test]
    fn full_attention_layer_counts() {
        let full = |name: &str| {
            let p = preset(name).unwrap();
            (0..p.block_count)
                .filter(|&i| p.is_full_attention_layer(i))
                .collect::<Vec<_>>()
        };
        assert_eq!(full("muse-glimmer").len(), 13);
        assert_eq!(full("muse-tiny"), [3, 7]);
        assert!(full("llama-tiny").is_empty());
        let tiny = preset("muse-tiny").unwrap();
        assert!(tiny.sliding_window < tiny.context_length);
    }

    #[test]
    fn more_bits_layers_match_the_spec_rule() {
        let spec_rule = |i: u32| !(6..45).contains(&i) || (i - 6) % 3 == 2;
        for i in 0..52 {
            assert_eq!(use_more_bits(i, 52), spec_rule(i), "layer {i}");
        }
    }

    #[test]
    fn llama_glimmer_reads_15_2_gb_per_token() {
        let p = preset("llama-glimmer").unwrap();
        let total = weight_bytes(p);
        assert_eq!(total, 15_954_724_864);
        let embd = layout(p)[0].n_bytes();
        assert_eq!(total - embd, 15_198_257_152);
    }

    #[test]
    fn preset_sizes() {
        let expect: &[(&str, u64, u64)] = &[
            // (preset, weight bytes, parameters), computed independently with a short script
            ("muse-tiny", 4_797_440, 7_873_792),
            ("muse-mid", 329_433_088, 545_329_152),
            ("llama-tiny", 2_569_216, 4_196_608),
            ("qwen3-tiny", 2_866_176, 4_721_408),
            ("llama-1b", 609_492_992, 1_006_700_544),
            ("muse-glimmer", 16_754_989_056, 27_854_794_240),
            ("llama-glimmer", 15_954_724_864, 26_436_413_952),
        ];
        for &(name, bytes, params) in expect {
            let p = preset(name).unwrap();
            assert_eq!(
                (weight_bytes(p), parameter_count(p)),
                (bytes, params),
                "{name}"
            );
        }
        for p in PRESETS {
            for t in layout(p) {
                let ok = t.spec.ggml_type == GgmlType::F32 || t.spec.dims[0] % 256 == 0;
                assert!(ok, "{}: rows of {} values", t.spec.name, t.spec.dims[0]);
            }
        }
    }
}
