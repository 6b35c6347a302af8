//! Row kernels per weight format: `dequantize_row` and the dot of every SIMD level this CPU runs
//! (scalar, avx2, avx512), over a matrix of rows of 4096 values that fits in L2 (512 KB of
//! weights) and one that streams from DRAM (64 MB, twice the L3 here). One iteration walks every
//! row once against one activation row (in L1), as a decode matvec does; criterion's
//! throughput is bytes of weights consumed per second.
//!
//! `cargo bench -p muser-quant` (all), or e.g. `cargo bench -p muser-quant -- q4_k/dram`.

use criterion::{black_box, criterion_group, criterion_main, Criterion, SamplingMode, Throughput};
use half::{bf16, f16};
use muser_quant::dequant::*;
use muser_quant::simd::Kernels;
use muser_quant::*;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::time::Duration;

/// Values per row.
const ROW: usize = 4096;
/// (name, bytes of weights) of the two matrices.
const SETS: [(&str, usize); 2] = [("l2", 512 << 10), ("dram", 64 << 20)];

fn f16_scale(rng: &mut StdRng) -> f16 {
    f16::from_f32(rng.gen_range(1e-4..1e-2))
}

fn bytes<const N: usize>(rng: &mut StdRng) -> [u8; N] {
    std::array::from_fn(|_| rng.gen())
}

/// Random blocks of any format: random bytes, then the f16 scales made finite and positive.
trait Random: Sized {
    fn random(rng: &mut StdRng) -> Self;
}
impl Random for f32 {
    fn random(rng: &mut StdRng) -> Self {
        rng.gen_range(-1.0..1.0)
    }
}
impl Random for f16 {
    fn random(rng: &mut StdRng) -> Self {
        f16::from_f32(rng.gen_range(-1.0..1.0))
    }
}
impl Random for bf16 {
    fn random(rng: &mut StdRng) -> Self {
        bf16::from_f32(rng.gen_range(-1.0..1.0))
    }
}
impl Random for BlockQ8_0 {
    fn random(rng: &mut StdRng) -> Self {
        BlockQ8_0 {
            d: f16_scale(rng),
            qs: bytes::<32>(rng).map(|b| (b as i8).max(-127)),
        }
    }
}
impl Random for BlockQ4K {
    fn random(rng: &mut StdRng) -> Self {
        BlockQ4K {
            d: f16_scale(rng),
            dmin: f16_scale(rng),
            scales: bytes(rng),
            qs: bytes(rng),
        }
    }
}
impl Random for BlockQ5K {
    fn random(rng: &mut StdRng) -> Self {
        let (d, dmin) = (f16_scale(rng), f16_scale(rng));
        BlockQ5K {
            d,
            dmin,
            scales: bytes(rng),
            qh: bytes(rng),
            qs: bytes(rng),
        }
    }
}
impl Random for BlockQ6K {
    fn random(rng: &mut StdRng) -> Self {
        let scales = bytes::<16>(rng).map(|b| b as i8);
        BlockQ6K {
            ql: bytes(rng),
            qh: bytes(rng),
            scales,
            d: f16_scale(rng),
        }
    }
}
impl Random for BlockQ8K {
    fn random(rng: &mut StdRng) -> Self {
        let qs: [i8; QK_K] = std::array::from_fn(|_| rng.gen_range(-127..=127));
        let bsums =
            std::array::from_fn(|j| qs[16 * j..16 * j + 16].iter().map(|&q| q as i16).sum());
        BlockQ8K {
            d: rng.gen_range(1e-3..1e-1),
            qs,
            bsums,
        }
    }
}

fn random_vec<T: Random>(rng: &mut StdRng, n: usize) -> Vec<T> {
    (0..n).map(|_| T::random(rng)).collect()
}

/// A row dequantizer, and the dot a kernel table holds for one format.
type Dequantize<W> = fn(&[W], &mut [f32]);
type DotOf<W, A> = fn(&Kernels) -> fn(&[W], &[A]) -> f32;

/// Benchmarks one weight format `W` (blocks of `per_block` values) against activations `A`.
fn bench_format<W: Random + Copy, A: Random>(
    c: &mut Criterion,
    name: &str,
    per_block: usize,
    dequantize: Option<Dequantize<W>>,
    dot: DotOf<W, A>,
) {
    let mut rng = StdRng::seed_from_u64(0xbe7c);
    let row_blocks = ROW / per_block;
    let row_bytes = row_blocks * std::mem::size_of::<W>();
    let act: Vec<A> = random_vec(&mut rng, row_blocks);
    let mut out = vec![0f32; ROW];
    for (set, target) in SETS {
        let rows = target / row_bytes;
        let w: Vec<W> = random_vec(&mut rng, rows * row_blocks);
        let mut g = c.benchmark_group(format!("{name}/{set}"));
        g.throughput(Throughput::Bytes((rows * row_bytes) as u64));
        g.warm_up_time(Duration::from_millis(500))
            .measurement_time(Duration::from_secs(1));
        if set == "dram" {
            g.sample_size(10).sampling_mode(SamplingMode::Flat);
        }
        if let Some(deq) = dequantize {
            g.bench_function("dequantize", |b| {
                b.iter(|| {
                    for r in w.chunks_exact(row_blocks) {
                        deq(r, &mut out);
                        black_box(&out);
                    }
                })
            });
        }
        for k in Kernels::all_available() {
            let f = dot(&k);
            g.bench_function(format!("dot/{}", k.isa), |b| {
                b.iter(|| w.chunks_exact(row_blocks).map(|r| f(r, &act)).sum::<f32>())
            });
        }
        g.finish();
    }
}

fn kernels(c: &mut Criterion) {
    bench_format::<f32, f32>(c, "f32", 1, None, |k| k.dot_f32);
    bench_format::<f16, f32>(c, "f16", 1, Some(dequantize_row_f16), |k| k.dot_f16_f32);
    bench_format::<bf16, f32>(c, "bf16", 1, Some(dequantize_row_bf16), |k| k.dot_bf16_f32);
    bench_format::<BlockQ8_0, BlockQ8_0>(c, "q8_0", QK8_0, Some(dequantize_row_q8_0), |k| {
        k.dot_q8_0_q8_0
    });
    bench_format::<BlockQ4K, BlockQ8K>(c, "q4_k", QK_K, Some(dequantize_row_q4_k), |k| {
        k.dot_q4_k_q8_k
    });
    bench_format::<BlockQ5K, BlockQ8K>(c, "q5_k", QK_K, Some(dequantize_row_q5_k), |k| {
        k.dot_q5_k_q8_k
    });
    bench_format::<BlockQ6K, BlockQ8K>(c, "q6_k", QK_K, Some(dequantize_row_q6_k), |k| {
        k.dot_q6_k_q8_k
    });
}

criterion_group!(benches, kernels);
criterion_main!(benches);
