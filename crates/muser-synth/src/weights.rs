//! Random weights written directly as ggml blocks: random quants from a discretised Gaussian
//! and per-block scales chosen so that the dequantized values have the target standard
//! deviation and zero mean. No floats are quantized, so a 16.75 GB model is generated at memory
//! speed. Every row has its own RNG seeded from (seed, tensor name, row), so the bytes do not
//! depend on how rows are spread over threads.
//!
//! The one exception is the LM head's structure (`Bigram`): the rows of the vocabulary's
//! normal tokens (about 2,000 in every preset) are built in f32 from the embedding rows they
//! point to and quantized with muser-quant's reference quantizer; every other row (reserved
//! and control tokens) is generated as blocks like the rest.

use crate::metadata::vocab;
use crate::plan::{layout, Init, PlannedTensor};
use crate::preset::Preset;
use half::f16;
use muser_gguf::GgmlType;
use rayon::prelude::*;

/// The bigram table of the LM head: a random permutation `succ` of the normal (learned) tokens.
/// The head row of `succ(t)` carries `t`'s embedding (`Init::Head`), so after reading `t` the
/// model favours `succ(t)` by a few nats, as a trained model has a clear favourite at most
/// positions. Control and reserved tokens are neither favoured nor favour anything.
pub struct Bigram {
    /// `succ[t]` for every normal token `t < succ.len()`.
    pub succ: Vec<u32>,
    /// `pred[v] = t` where `succ[t] = v`, for `v < succ.len()`.
    pred: Vec<u32>,
    /// `token_embd`, whose rows are regenerated where the head needs them.
    embd: PlannedTensor,
}

impl Bigram {
    /// The table for `n_normal` normal tokens (ids 0..n_normal) and the embedding `embd`.
    pub fn new(n_normal: usize, embd: PlannedTensor, seed: u64) -> Bigram {
        // Fisher-Yates with its own stream (the name is no tensor's).
        let mut rng = Rng::new(mix(seed ^ mix(name_hash("bigram succ"))));
        let mut succ: Vec<u32> = (0..n_normal as u32).collect();
        for i in (1..n_normal).rev() {
            let j = (rng.next_u64() % (i as u64 + 1)) as usize;
            succ.swap(i, j);
        }
        let mut pred = vec![0u32; n_normal];
        for (t, &v) in succ.iter().enumerate() {
            pred[v as usize] = t as u32;
        }
        Bigram { succ, pred, embd }
    }

    /// The table of preset `p`: its normal tokens are those the BPE trainer learned (ids below
    /// BOS), its embedding `token_embd`.
    pub fn for_preset(p: &Preset, seed: u64) -> Bigram {
        let embd = layout(p)
            .into_iter()
            .find(|t| t.spec.name == "token_embd.weight")
            .expect("every preset has an embedding");
        Bigram::new(vocab(p).bos as usize, embd, seed)
    }

    /// Row `t` of the embedding, dequantized and scaled to RMS 1.
    pub fn embedding_row(&self, t: usize, seed: u64) -> Vec<f32> {
        let mut bytes = vec![0u8; self.embd.row_bytes() as usize];
        fill_row(&self.embd, &mut row_rng(&self.embd, seed, t), &mut bytes);
        let mut e = vec![0f32; self.embd.spec.dims[0] as usize];
        muser_quant::dequantize_row(self.embd.spec.ggml_type, &bytes, &mut e)
            .expect("the embedding is a K-quant of whole blocks");
        let rms = (e.iter().map(|x| x * x).sum::<f32>() / e.len() as f32).sqrt();
        e.iter_mut().for_each(|x| *x /= rms);
        e
    }
}

/// wyrand: a small, fast 64-bit generator (Wang Yi's); statistically fine for weights.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0xa076_1d64_78bd_642f);
        let t = (self.0 as u128) * ((self.0 ^ 0xe703_7ed1_a0b4_28db) as u128);
        ((t >> 64) as u64) ^ (t as u64)
    }
    /// Uniform in [0, 1).
    pub fn uniform(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 24) as f32
    }
    /// Standard normal (Box-Muller).
    pub fn gaussian(&mut self) -> f32 {
        let u1 = 1.0 - self.uniform();
        let u2 = self.uniform();
        (-2.0 * u1.ln()).sqrt() * (std::f32::consts::TAU * u2).cos()
    }
}

/// splitmix64's finaliser: mixes seeds so nearby inputs give unrelated streams.
pub fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// FNV-1a of a tensor name, so a tensor's bytes depend on its name, not its place in the file.
fn name_hash(name: &str) -> u64 {
    name.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ b as u64).wrapping_mul(0x0100_0000_01b3)
    })
}

/// A discretised Gaussian over quant levels 0..n: a random byte indexes `table` to give a level.
/// The extreme levels are forced into the table so that kernels see them.
struct QuantDist {
    table: [u8; 256],
    /// Mean and standard deviation of the table's levels, exactly.
    mean: f32,
    std: f32,
}

impl QuantDist {
    fn new(levels: u32, center: f64, sigma: f64) -> QuantDist {
        let weight: Vec<f64> = (0..levels)
            .map(|k| (-((k as f64 - center).powi(2)) / (2.0 * sigma * sigma)).exp())
            .collect();
        let total: f64 = weight.iter().sum();
        let mut table = [0u8; 256];
        let mut cum = 0.0;
        let mut k = 0;
        for (i, slot) in table.iter_mut().enumerate() {
            let u = (i as f64 + 0.5) / 256.0;
            while k + 1 < levels as usize && cum + weight[k] / total < u {
                cum += weight[k] / total;
                k += 1;
            }
            *slot = k as u8;
        }
        table[0] = 0;
        table[255] = (levels - 1) as u8;
        let mean = table.iter().map(|&q| q as f64).sum::<f64>() / 256.0;
        let var = table
            .iter()
            .map(|&q| (q as f64 - mean).powi(2))
            .sum::<f64>()
            / 256.0;
        QuantDist {
            table,
            mean: mean as f32,
            std: var.sqrt() as f32,
        }
    }
}

/// Draws quant levels 32 at a time from one generator call per 8.
struct Quants<'r> {
    rng: &'r mut Rng,
    dist: &'static QuantDist,
}

impl Quants<'_> {
    fn fill(&mut self, out: &mut [u8]) {
        for chunk in out.chunks_mut(8) {
            let bits = self.rng.next_u64().to_le_bytes();
            for (o, b) in chunk.iter_mut().zip(bits) {
                *o = self.dist.table[b as usize];
            }
        }
    }
}

fn q4_dist() -> &'static QuantDist {
    static D: std::sync::OnceLock<QuantDist> = std::sync::OnceLock::new();
    D.get_or_init(|| QuantDist::new(16, 7.5, 3.0))
}
fn q5_dist() -> &'static QuantDist {
    static D: std::sync::OnceLock<QuantDist> = std::sync::OnceLock::new();
    D.get_or_init(|| QuantDist::new(32, 15.5, 6.0))
}
fn q6_dist() -> &'static QuantDist {
    static D: std::sync::OnceLock<QuantDist> = std::sync::OnceLock::new();
    D.get_or_init(|| QuantDist::new(64, 32.0, 12.0))
}

/// Rounds to f16, never to zero (the smallest subnormal instead).
fn f16_nonzero(x: f32) -> f16 {
    let h = f16::from_f32(x);
    if h.to_f32() > 0.0 {
        h
    } else {
        f16::from_bits(1)
    }
}

/// Per-sub-block scales and mins of a Q4_K/Q5_K super-block for a target std: `d` and `dmin`
/// (f16) and 6-bit `sc[j]`, `m[j]` such that `d*sc_j*(q - mean) ~ d*sc_j*q - dmin*m_j` has
/// std `std` (sub-block scales vary +-25% around a mean of 48 of 63).
fn k_scales(rng: &mut Rng, std: f32, dist: &QuantDist) -> (f16, f16, [u8; 8], [u8; 8]) {
    let d = f16_nonzero(std / (dist.std * 48.0));
    let step = std / (dist.std * d.to_f32()); // the sc that gives exactly `std`, ~48
                                              // dmin so that the largest offset, mean*d*63, needs m = 56 at most (f16 error included).
    let dmin = f16_nonzero(dist.mean * d.to_f32() * 63.0 / 56.0);
    let (mut sc, mut m) = ([0u8; 8], [0u8; 8]);
    for j in 0..8 {
        let s = (step * (0.75 + 0.5 * rng.uniform()))
            .round()
            .clamp(1.0, 63.0);
        sc[j] = s as u8;
        m[j] = (dist.mean * d.to_f32() * s / dmin.to_f32())
            .round()
            .clamp(0.0, 63.0) as u8;
    }
    (d, dmin, sc, m)
}

/// Packs eight 6-bit scales and mins into Q4_K/Q5_K's 12 bytes (SPEC section 8).
fn pack_scales(sc: &[u8; 8], m: &[u8; 8]) -> [u8; 12] {
    let mut b = [0u8; 12];
    for j in 0..4 {
        b[j] = sc[j] | (sc[j + 4] >> 4) << 6;
        b[j + 4] = m[j] | (m[j + 4] >> 4) << 6;
        b[j + 8] = (sc[j + 4] & 0xf) | (m[j + 4] & 0xf) << 4;
    }
    b
}

/// One Q4_K block (144 bytes): d, dmin, scales[12], qs[128].
fn block_q4_k(rng: &mut Rng, std: f32, out: &mut [u8]) {
    let dist = q4_dist();
    let (d, dmin, sc, m) = k_scales(rng, std, dist);
    out[0..2].copy_from_slice(&d.to_le_bytes());
    out[2..4].copy_from_slice(&dmin.to_le_bytes());
    out[4..16].copy_from_slice(&pack_scales(&sc, &m));
    let mut q = [0u8; 256];
    Quants { rng, dist }.fill(&mut q);
    // Group g: byte l holds value 64g+l (low nibble) and 64g+32+l (high nibble).
    for g in 0..4 {
        for l in 0..32 {
            out[16 + 32 * g + l] = q[64 * g + l] | q[64 * g + 32 + l] << 4;
        }
    }
}

/// One Q5_K block (176 bytes): d, dmin, scales[12], qh[32], qs[128].
fn block_q5_k(rng: &mut Rng, std: f32, out: &mut [u8]) {
    let dist = q5_dist();
    let (d, dmin, sc, m) = k_scales(rng, std, dist);
    out[0..2].copy_from_slice(&d.to_le_bytes());
    out[2..4].copy_from_slice(&dmin.to_le_bytes());
    out[4..16].copy_from_slice(&pack_scales(&sc, &m));
    let mut q = [0u8; 256];
    Quants { rng, dist }.fill(&mut q);
    let (qh, qs) = out[16..].split_at_mut(32);
    qh.fill(0);
    // Low 4 bits as Q4_K; the 5th bit of value 64n+l is bit 2n of qh[l], of 64n+32+l bit 2n+1.
    for n in 0..4 {
        for l in 0..32 {
            let (a, b) = (q[64 * n + l], q[64 * n + 32 + l]);
            qs[32 * n + l] = (a & 0xf) | (b & 0xf) << 4;
            qh[l] |= (a >> 4) << (2 * n) | (b >> 4) << (2 * n + 1);
        }
    }
}

/// One Q6_K block (210 bytes): ql[128], qh[64], scales i8[16], d. Values d*sc_j*(q - 32).
fn block_q6_k(rng: &mut Rng, std: f32, out: &mut [u8]) {
    let dist = q6_dist();
    let d = f16_nonzero(std / (dist.std * 96.0));
    let step = std / (dist.std * d.to_f32());
    let mut q = [0u8; 256];
    Quants { rng, dist }.fill(&mut q);
    let (ql, rest) = out.split_at_mut(128);
    let (qh, rest) = rest.split_at_mut(64);
    let (scales, d_out) = rest.split_at_mut(16);
    for s in scales.iter_mut() {
        *s = (step * (0.75 + 0.5 * rng.uniform()))
            .round()
            .clamp(1.0, 127.0) as i8 as u8;
    }
    d_out.copy_from_slice(&d.to_le_bytes());
    // Per 128 values c: ql[64c+l] = v[l] | v[l+64] << 4, ql[64c+l+32] = v[l+32] | v[l+96] << 4,
    // qh[32c+l] = high 2 bits of v[l], v[l+32], v[l+64], v[l+96] in bit pairs 0, 2, 4, 6.
    for c in 0..2 {
        let v = &q[128 * c..128 * c + 128];
        for l in 0..32 {
            ql[64 * c + l] = (v[l] & 0xf) | (v[l + 64] & 0xf) << 4;
            ql[64 * c + l + 32] = (v[l + 32] & 0xf) | (v[l + 96] & 0xf) << 4;
            qh[32 * c + l] =
                (v[l] >> 4) | (v[l + 32] >> 4) << 2 | (v[l + 64] >> 4) << 4 | (v[l + 96] >> 4) << 6;
        }
    }
}

/// Fills one row of tensor `t` (its bytes in `out`). `Init::Head` rows here are plain Gaussian
/// rows (those of tokens outside the bigram table).
fn fill_row(t: &PlannedTensor, rng: &mut Rng, out: &mut [u8]) {
    let init = match t.init {
        Init::Head { std, .. } => Init::Gaussian { std },
        init => init,
    };
    match (t.spec.ggml_type, init) {
        (GgmlType::F32, init) => {
            for v in out.chunks_exact_mut(4) {
                let x = match init {
                    Init::NearOne => 1.0 + 0.05 * rng.gaussian(),
                    Init::Gaussian { std } | Init::Head { std, .. } => std * rng.gaussian(),
                };
                v.copy_from_slice(&x.to_le_bytes());
            }
        }
        (ty @ (GgmlType::Q4_K | GgmlType::Q5_K | GgmlType::Q6_K), Init::Gaussian { std }) => {
            let block = match ty {
                GgmlType::Q4_K => block_q4_k,
                GgmlType::Q5_K => block_q5_k,
                _ => block_q6_k,
            };
            for b in out.chunks_exact_mut(ty.type_size()) {
                block(rng, std, b);
            }
        }
        (ty, init) => unreachable!("the plan never asks for {ty} with {init:?}"),
    }
}

/// Row `row` of tensor `t`, under `seed`, has its own generator.
fn row_rng(t: &PlannedTensor, seed: u64, row: usize) -> Rng {
    let base = mix(seed ^ mix(name_hash(&t.spec.name)));
    Rng::new(mix(base ^ mix(row as u64)))
}

/// Fills head row `v` (the token `succ(t)` of the bigram table): `alpha` times `t`'s normalised
/// embedding plus Gaussian noise, so that the row's values have standard deviation `std`,
/// quantized with the reference quantizer of the head's type.
fn fill_head_row(
    t: &PlannedTensor,
    bigram: &Bigram,
    seed: u64,
    v: usize,
    rng: &mut Rng,
    out: &mut [u8],
) {
    let Init::Head { std, alpha } = t.init else {
        unreachable!("only the head has a bigram row")
    };
    let noise = (std * std - alpha * alpha).max(0.0).sqrt();
    let e = bigram.embedding_row(bigram.pred[v] as usize, seed);
    let row: Vec<f32> = e
        .iter()
        .map(|&x| alpha * x + noise * rng.gaussian())
        .collect();
    muser_quant::quantize_row(t.spec.ggml_type, &row, out).expect("head rows are whole blocks");
}

/// Generates the whole tensor `t`, rows in parallel. `bigram` shapes the LM head
/// (`Init::Head`); other tensors ignore it.
pub fn generate(t: &PlannedTensor, seed: u64, bigram: &Bigram) -> Vec<u8> {
    let row_bytes = t.row_bytes() as usize;
    let mut data = vec![0u8; t.n_bytes() as usize];
    let is_head = matches!(t.init, Init::Head { .. });
    data.par_chunks_mut(row_bytes)
        .enumerate()
        .for_each(|(row, out)| {
            let mut rng = row_rng(t, seed, row);
            if is_head && row < bigram.succ.len() {
                fill_head_row(t, bigram, seed, row, &mut rng, out);
            } else {
                fill_row(t, &mut rng, out);
            }
        });
    data
}

#[cfg(test)]
mod tests {
    use super::*;
    use muser_gguf::TensorSpec;

    fn no_bigram(t: &PlannedTensor) -> Bigram {
        Bigram::new(0, t.clone(), 0)
    }

    fn tensor(ty: GgmlType, std: f32) -> PlannedTensor {
        PlannedTensor {
            spec: TensorSpec {
                name: "blk.0.test.weight".into(),
                dims: vec![1024, 64],
                ggml_type: ty,
            },
            init: Init::Gaussian { std },
        }
    }

    /// Dequantizes with straightforward code written from SPEC section 8 (independent of
    /// muser-quant, so these tests do not wait on it).
    fn dequant(ty: GgmlType, bytes: &[u8]) -> Vec<f32> {
        let h = |b: &[u8]| f16::from_le_bytes([b[0], b[1]]).to_f32();
        let mut out = Vec::new();
        for blk in bytes.chunks_exact(ty.type_size()) {
            match ty {
                GgmlType::Q4_K | GgmlType::Q5_K => {
                    let (d, dmin, s) = (h(&blk[0..2]), h(&blk[2..4]), &blk[4..16]);
                    let (qh, qs) = if ty == GgmlType::Q5_K {
                        (&blk[16..48], &blk[48..])
                    } else {
                        (&[][..], &blk[16..])
                    };
                    for i in 0..256 {
                        let (g, l, hi) = (i / 64, i % 32, (i / 32) % 2);
                        let j = i / 32;
                        let (sc, m) = if j < 4 {
                            (s[j] & 63, s[j + 4] & 63)
                        } else {
                            (
                                (s[j + 4] & 0xf) | (s[j - 4] >> 6) << 4,
                                (s[j + 4] >> 4) | (s[j] >> 6) << 4,
                            )
                        };
                        let mut q = (qs[32 * g + l] >> (4 * hi)) & 0xf;
                        if ty == GgmlType::Q5_K {
                            q |= ((qh[l] >> (2 * g + hi)) & 1) << 4;
                        }
                        out.push(d * sc as f32 * q as f32 - dmin * m as f32);
                    }
                }
                GgmlType::Q6_K => {
                    let (ql, qh, sc, d) = (
                        &blk[0..128],
                        &blk[128..192],
                        &blk[192..208],
                        h(&blk[208..210]),
                    );
                    for i in 0..256 {
                        let (c, k) = (i / 128, i % 128);
                        let (l, quarter) = (k % 32, k / 32);
                        let low = match quarter {
                            0 => ql[64 * c + l] & 0xf,
                            1 => ql[64 * c + l + 32] & 0xf,
                            2 => ql[64 * c + l] >> 4,
                            _ => ql[64 * c + l + 32] >> 4,
                        };
                        let high = (qh[32 * c + l] >> (2 * quarter)) & 3;
                        let q = (low | high << 4) as i32 - 32;
                        out.push(d * sc[i / 16] as i8 as f32 * q as f32);
                    }
                }
                _ => unreachable!(),
            }
        }
        out
    }

    #[test]
    fn blocks_have_the_target_statistics() {
        for ty in [GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K] {
            for std in [1.0f32, 0.0123, 6.9e-4, 3e-5] {
                let t = tensor(ty, std);
                let v = dequant(ty, &generate(&t, 7, &no_bigram(&t)));
                let n = v.len() as f64;
                let mean = v.iter().map(|&x| x as f64).sum::<f64>() / n;
                let sd = (v.iter().map(|&x| (x as f64 - mean).powi(2)).sum::<f64>() / n).sqrt();
                assert!(v.iter().all(|x| x.is_finite()));
                assert!(
                    (sd / std as f64 - 1.0).abs() < 0.05,
                    "{ty} std {std}: got {sd}"
                );
                assert!(
                    mean.abs() < 0.02 * std as f64,
                    "{ty} std {std}: mean {mean}"
                );
            }
        }
    }

    #[test]
    fn quant_tables_reach_both_extremes() {
        for (dist, max) in [(q4_dist(), 15), (q5_dist(), 31), (q6_dist(), 63)] {
            assert!(dist.table.contains(&0) && dist.table.contains(&max));
            assert!(dist.table.windows(2).all(|w| w[0] <= w[1]));
        }
    }

    #[test]
    fn rows_do_not_depend_on_threading_and_seeds_differ() {
        let t = tensor(GgmlType::Q4_K, 0.02);
        let none = no_bigram(&t);
        let a = generate(&t, 1, &none);
        let b = rayon::ThreadPoolBuilder::new()
            .num_threads(1)
            .build()
            .unwrap()
            .install(|| generate(&t, 1, &none));
        assert_eq!(a, b);
        assert_ne!(a, generate(&t, 2, &none));
    }
}
