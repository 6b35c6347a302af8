//! Properties of the reference quantizers, dequantizers and dots: ggml's test-quantize-fns bounds
//! on its synthetic data, round-trip bounds on random data, each dot against the dot of the
//! dequantized rows, and typed errors from the byte-level row functions.

use half::{bf16, f16};
use muser_quant::dequant::*;
use muser_quant::dot::*;
use muser_quant::quantize::*;
use muser_quant::*;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const WEIGHT_TYPES: [GgmlType; 7] = [
    GgmlType::F32,
    GgmlType::F16,
    GgmlType::BF16,
    GgmlType::Q8_0,
    GgmlType::Q4_K,
    GgmlType::Q5_K,
    GgmlType::Q6_K,
];

/// ggml test-quantize-fns `generate_data`: 0.1 + 2 cos(i + offset), in f32.
fn ggml_data(offset: f32, n: usize) -> Vec<f32> {
    (0..n)
        .map(|i| 0.1 + 2.0 * (i as f32 + offset).cos())
        .collect()
}

/// Gaussian values (Box-Muller) with a random per-256 scale and offset, never all zero.
fn random_data(rng: &mut StdRng, n: usize) -> Vec<f32> {
    let mut x = Vec::with_capacity(n);
    while x.len() < n {
        let scale = 10f32.powf(rng.gen_range(-3.0..2.0));
        let shift = if rng.gen_bool(0.3) {
            rng.gen_range(-2.0..2.0) * scale
        } else {
            0.0
        };
        for _ in 0..256.min(n - x.len()) {
            let (u1, u2): (f32, f32) = (rng.gen_range(1e-7..1.0), rng.gen());
            let g = (-2.0 * u1.ln()).sqrt() * (std::f32::consts::TAU * u2).cos();
            x.push(g * scale + shift);
        }
    }
    x
}

fn quant(ty: GgmlType, x: &[f32]) -> Vec<u8> {
    let mut q = vec![0u8; ty.row_bytes(x.len() as u64).unwrap() as usize];
    quantize_row(ty, x, &mut q).unwrap();
    q
}

fn dequant(ty: GgmlType, q: &[u8], n: usize) -> Vec<f32> {
    let mut y = vec![0f32; n];
    dequantize_row(ty, q, &mut y).unwrap();
    y
}

/// Copies bytes (a whole number of `T`s) into an aligned `Vec<T>`.
fn blocks<T: bytemuck::Pod>(b: &[u8]) -> Vec<T> {
    let mut v = vec![T::zeroed(); b.len() / std::mem::size_of::<T>()];
    bytemuck::cast_slice_mut::<T, u8>(&mut v).copy_from_slice(b);
    v
}

fn nmse(a: &[f32], b: &[f32]) -> f64 {
    let num: f64 = a
        .iter()
        .zip(b)
        .map(|(&x, &y)| (x as f64 - y as f64).powi(2))
        .sum();
    let den: f64 = b.iter().map(|&y| (y as f64).powi(2)).sum();
    num / den
}

fn dot_f64(a: &[f32], b: &[f32]) -> f64 {
    a.iter().zip(b).map(|(&x, &y)| x as f64 * y as f64).sum()
}

// ---------------------------------------------------------------- ggml's test-quantize-fns

#[test]
fn ggml_quantize_fns_bounds() {
    // test-quantize-fns: 32 * 128 values; "absolute quantization error" is
    // sqrt(sum (x - y)^2) / n < 0.002; "dot product error" is |dot_q - dot_f32| / n < 0.02,
    // with the second vector quantized to the weight type's activation type.
    let n = 32 * 128;
    let (a, b) = (ggml_data(0.0, n), ggml_data(1.0, n));
    let ref_dot = a.iter().zip(&b).map(|(&x, &y)| (x * y) as f64).sum::<f64>() as f32;
    for ty in [
        GgmlType::Q8_0,
        GgmlType::Q4_K,
        GgmlType::Q5_K,
        GgmlType::Q6_K,
    ] {
        let q = quant(ty, &a);
        let y = dequant(ty, &q, n);
        let sum2: f64 = a
            .iter()
            .zip(&y)
            .map(|(&p, &r)| (p as f64 - r as f64).powi(2))
            .sum();
        let err = sum2.sqrt() as f32 / n as f32;
        assert!(
            err < 0.002,
            "{ty}: absolute quantization error {err} >= 0.002"
        );
        assert!(err > 0.0, "{ty}: lossless on cos data is suspicious");

        let act = quantize_activation(ty, &b).unwrap();
        let got = dot_row(ty, &q, &act).unwrap();
        let dot_err = (got - ref_dot).abs() / n as f32;
        assert!(dot_err < 0.02, "{ty}: dot product error {dot_err} >= 0.02");
    }
}

#[test]
fn ggml_vec_dot_f32_bound() {
    // test-quantize-fns test_vec_dot_f32: |dot - ref| / n < 1e-4 for odd sizes.
    for n in [
        1, 2, 3, 5, 7, 8, 15, 16, 17, 31, 33, 63, 67, 127, 129, 193, 255, 1023,
    ] {
        let (a, b) = (ggml_data(0.0, n), ggml_data(1.0, n));
        let r = a.iter().zip(&b).map(|(&x, &y)| (x * y) as f64).sum::<f64>() as f32;
        let err = (vec_dot_f32(&a, &b) - r).abs() / n as f32;
        assert!(err < 1e-4, "n={n}: {err}");
    }
}

// ---------------------------------------------------------------- helpers of the quantizers

#[test]
fn nearest_int_rounds_half_to_even() {
    for (x, want) in [
        (0.5, 0),
        (1.5, 2),
        (2.5, 2),
        (-0.5, 0),
        (-1.5, -2),
        (-2.5, -2),
        (3.49, 3),
    ] {
        assert_eq!(nearest_int(x), want, "{x}");
    }
    let mut rng = StdRng::seed_from_u64(1);
    for _ in 0..100_000 {
        let x: f32 = rng.gen_range(-4_194_303.0..4_194_303.0) * rng.gen::<f32>().powi(8);
        assert_eq!(nearest_int(x), x.round_ties_even() as i32, "{x}");
    }
}

#[test]
fn f16_bf16_conversions_follow_ggml() {
    let mut rng = StdRng::seed_from_u64(2);
    for _ in 0..100_000 {
        let x = f32::from_bits(rng.gen());
        let h = fp32_to_fp16(x);
        let b = fp32_to_bf16(x);
        if x.is_nan() {
            assert!(h.is_nan() && b.is_nan());
            assert_eq!(h.to_bits() & 0x7fff, 0x7e00, "ggml's fp16 NaN is canonical");
            assert_eq!(b.to_bits() & 0x40, 0x40, "bf16 NaN is quiet");
            assert_eq!(b.to_bits() | 0x40, (x.to_bits() >> 16) as u16 | 0x40);
            continue;
        }
        assert_eq!(h, f16::from_f32(x));
        // bf16: the nearest bf16, ties to even (checked against f64 arithmetic).
        let (lo, hi) = ((x.to_bits() >> 16) as u16, (x.to_bits() >> 16) as u16 + 1);
        let xf = x as f64;
        let dlo = (bf16::from_bits(lo).to_f64() - xf).abs();
        // Past the largest bf16 the next step up is 2^128 (infinity).
        let hi_value = match bf16::from_bits(hi).to_f64() {
            v if v.is_infinite() => v.signum() * 2f64.powi(128),
            v => v,
        };
        let dhi = if x.is_infinite() {
            f64::INFINITY
        } else {
            (hi_value - xf).abs()
        };
        let want = if dlo < dhi || (dlo == dhi && lo % 2 == 0) {
            lo
        } else {
            hi
        };
        assert_eq!(b.to_bits(), want, "{x:e}");
    }
    // Rounding a tie to even, and overflow to infinity.
    assert_eq!(fp32_to_bf16(f32::from_bits(0x3f80_8000)).to_bits(), 0x3f80);
    assert_eq!(fp32_to_bf16(f32::from_bits(0x3f81_8000)).to_bits(), 0x3f82);
    assert_eq!(fp32_to_bf16(f32::MAX).to_bits(), 0x7f80);
}

// ---------------------------------------------------------------- round trips on random data

#[test]
fn q8_0_round_trip_within_half_a_step() {
    let mut rng = StdRng::seed_from_u64(3);
    let x = random_data(&mut rng, 32 * 1000);
    let mut q = vec![bytemuck::Zeroable::zeroed(); 1000];
    quantize_row_q8_0_ref(&x, &mut q);
    let mut y = vec![0f32; x.len()];
    dequantize_row_q8_0(&q, &mut y);
    for (b, (xs, ys)) in q.iter().zip(x.chunks(32).zip(y.chunks(32))) {
        let amax = xs.iter().fold(0f32, |m, v| m.max(v.abs()));
        let d = amax / 127.0;
        let d16 = b.d.to_f32();
        assert!(
            b.qs.iter().any(|&v| v.unsigned_abs() == 127),
            "the max maps to +-127"
        );
        for (&xv, &yv) in xs.iter().zip(ys) {
            let bound = 0.5001 * d + 127.0 * (d - d16).abs();
            assert!((xv - yv).abs() <= bound, "x {xv} y {yv} d {d}");
        }
    }
}

#[test]
fn q8_k_round_trip_and_bsums() {
    let mut rng = StdRng::seed_from_u64(4);
    let x = random_data(&mut rng, 256 * 200);
    let mut q = vec![bytemuck::Zeroable::zeroed(); 200];
    quantize_row_q8_k_ref(&x, &mut q);
    let mut y = vec![0f32; x.len()];
    dequantize_row_q8_k(&q, &mut y);
    for (b, (xs, ys)) in q.iter().zip(x.chunks(256).zip(y.chunks(256))) {
        for j in 0..16 {
            let s: i32 = b.qs[16 * j..16 * j + 16].iter().map(|&v| v as i32).sum();
            assert_eq!(b.bsums[j] as i32, s);
        }
        assert!(b.qs.contains(&-127), "the signed max maps to -127");
        for (&xv, &yv) in xs.iter().zip(ys) {
            assert!(
                (xv - yv).abs() <= 0.5001 * b.d.abs(),
                "x {xv} y {yv} d {}",
                b.d
            );
        }
    }
}

#[test]
fn k_quant_round_trips_on_random_data() {
    // Gaussian data: the expected NMSE of a uniform quantizer with the step each format reaches
    // is about 0.01 (Q4_K), 0.0025 (Q5_K), 0.0006 (Q6_K); the bounds leave 1.5-2x.
    let mut rng = StdRng::seed_from_u64(5);
    let x = random_data(&mut rng, 256 * 400);
    for (ty, bound) in [
        (GgmlType::Q4_K, 1.5e-2),
        (GgmlType::Q5_K, 4e-3),
        (GgmlType::Q6_K, 1.2e-3),
    ] {
        let q = quant(ty, &x);
        let y = dequant(ty, &q, x.len());
        assert!(y.iter().all(|v| v.is_finite()), "{ty}");
        for (xs, ys) in x.chunks(256).zip(y.chunks(256)) {
            let e = nmse(ys, xs);
            assert!(e < bound, "{ty}: block NMSE {e} >= {bound}");
        }
        // Quantizing the dequantized values again loses (almost) nothing more.
        let y2 = dequant(ty, &quant(ty, &y), x.len());
        assert!(
            nmse(&y2, &y) < bound / 4.0,
            "{ty}: requantization NMSE {}",
            nmse(&y2, &y)
        );
    }
}

#[test]
fn float_formats_round_trip() {
    let mut rng = StdRng::seed_from_u64(6);
    let x = random_data(&mut rng, 4096);
    for (ty, rel) in [
        (GgmlType::F32, 0.0),
        (GgmlType::F16, 1.0 / 2048.0),
        (GgmlType::BF16, 1.0 / 256.0),
    ] {
        let y = dequant(ty, &quant(ty, &x), x.len());
        for (&a, &b) in x.iter().zip(&y) {
            // Values here are normal in f16 except tiny ones, whose absolute error is < 2^-25.
            assert!((a - b).abs() <= rel * a.abs() + 3e-8, "{ty}: {a} -> {b}");
        }
    }
}

#[test]
fn zero_and_constant_blocks() {
    for ty in [
        GgmlType::Q8_0,
        GgmlType::Q4_K,
        GgmlType::Q5_K,
        GgmlType::Q6_K,
        GgmlType::Q8_K,
    ] {
        let zeros = vec![0f32; 512];
        let q = quant(ty, &zeros);
        assert!(
            dequant(ty, &q, 512).iter().all(|&v| v == 0.0),
            "{ty}: zeros"
        );
        for c in [1.5f32, -0.75] {
            let x = vec![c; 512];
            let y = dequant(ty, &quant(ty, &x), 512);
            for &v in &y {
                assert!((v - c).abs() <= 0.02 * c.abs(), "{ty}: constant {c} -> {v}");
            }
        }
    }
}

// ---------------------------------------------------------------- dots

/// Each weight type's dot against the exact f64 dot of the dequantized weight row and the
/// dequantized activation: the integer sums are exact, so only the f32 scaling and the f32 sum
/// over blocks round.
#[test]
fn dots_equal_dots_of_dequantized_rows() {
    let mut rng = StdRng::seed_from_u64(7);
    for n in [256, 512, 2048, 6656] {
        for ty in WEIGHT_TYPES {
            let (w, a) = (random_data(&mut rng, n), random_data(&mut rng, n));
            let wq = quant(ty, &w);
            let wd = dequant(ty, &wq, n);
            let act = quantize_activation(ty, &a).unwrap();
            let ad: Vec<f32> = match &act {
                Activation::F32(v) => v.clone(),
                Activation::Q8_0(b) => {
                    let mut y = vec![0f32; n];
                    dequantize_row_q8_0(b, &mut y);
                    y
                }
                Activation::Q8K(b) => {
                    let mut y = vec![0f32; n];
                    dequantize_row_q8_k(b, &mut y);
                    y
                }
            };
            let want = dot_f64(&wd, &ad);
            let scale: f64 = wd
                .iter()
                .zip(&ad)
                .map(|(&x, &y)| (x as f64 * y as f64).abs())
                .sum();
            let got = match (ty, &act) {
                (GgmlType::F32, Activation::F32(v)) => vec_dot_f32(&wd, v),
                (GgmlType::F16, Activation::F32(v)) => vec_dot_f16_f32(&blocks::<f16>(&wq), v),
                (GgmlType::BF16, Activation::F32(v)) => vec_dot_bf16_f32(&blocks::<bf16>(&wq), v),
                (GgmlType::Q8_0, Activation::Q8_0(v)) => vec_dot_q8_0_q8_0(&blocks(&wq), v),
                (GgmlType::Q4_K, Activation::Q8K(v)) => vec_dot_q4_k_q8_k(&blocks(&wq), v),
                (GgmlType::Q5_K, Activation::Q8K(v)) => vec_dot_q5_k_q8_k(&blocks(&wq), v),
                (GgmlType::Q6_K, Activation::Q8K(v)) => vec_dot_q6_k_q8_k(&blocks(&wq), v),
                _ => unreachable!(),
            };
            let err = (got as f64 - want).abs() / scale;
            assert!(
                err < 1e-5,
                "{ty} n={n}: got {got} want {want} (relative {err:e})"
            );
            // The dispatched kernel agrees too.
            let row = dot_row(ty, &wq, &act).unwrap();
            assert!(
                (row as f64 - want).abs() / scale < 1e-4,
                "{ty} n={n}: dot_row {row}"
            );
        }
    }
}

/// Blocks from raw random bytes (finite scales): the dot still equals the dequantized dot, so
/// the reference dot reads every bit of the format the same way the dequantizer does.
#[test]
fn dots_on_random_blocks() {
    let mut rng = StdRng::seed_from_u64(8);
    let rand_f16 = |rng: &mut StdRng| f16::from_f32(rng.gen_range(-2.0..2.0));
    let n_blocks = 24;
    let a = random_data(&mut rng, 256 * n_blocks);
    let act = match quantize_activation(GgmlType::Q4_K, &a).unwrap() {
        Activation::Q8K(v) => v,
        _ => unreachable!(),
    };
    let mut ad = vec![0f32; a.len()];
    dequantize_row_q8_k(&act, &mut ad);
    let check = |name: &str, wd: &[f32], got: f32| {
        let want = dot_f64(wd, &ad);
        let scale: f64 = wd
            .iter()
            .zip(&ad)
            .map(|(&x, &y)| (x as f64 * y as f64).abs())
            .sum();
        assert!(
            (got as f64 - want).abs() / scale < 1e-5,
            "{name}: {got} vs {want}"
        );
    };
    let mut bytes = |len: usize| (0..len).map(|_| rng.gen::<u8>()).collect::<Vec<u8>>();
    let mut q4: Vec<BlockQ4K> = blocks(&bytes(144 * n_blocks));
    let mut q5: Vec<BlockQ5K> = blocks(&bytes(176 * n_blocks));
    let mut q6: Vec<BlockQ6K> = blocks(&bytes(210 * n_blocks));
    for b in &mut q4 {
        (b.d, b.dmin) = (rand_f16(&mut rng), rand_f16(&mut rng));
    }
    for b in &mut q5 {
        (b.d, b.dmin) = (rand_f16(&mut rng), rand_f16(&mut rng));
    }
    for b in &mut q6 {
        b.d = rand_f16(&mut rng);
    }
    let mut wd = vec![0f32; a.len()];
    dequantize_row_q4_k(&q4, &mut wd);
    check("Q4_K", &wd, vec_dot_q4_k_q8_k(&q4, &act));
    dequantize_row_q5_k(&q5, &mut wd);
    check("Q5_K", &wd, vec_dot_q5_k_q8_k(&q5, &act));
    dequantize_row_q6_k(&q6, &mut wd);
    check("Q6_K", &wd, vec_dot_q6_k_q8_k(&q6, &act));
}

// ---------------------------------------------------------------- byte-level row functions

#[test]
fn row_functions_report_bad_input() {
    let x = vec![0.5f32; 256];
    let mut y = vec![0f32; 256];
    // Unsupported types.
    for ty in [
        GgmlType::Q4_0,
        GgmlType::Q2_K,
        GgmlType::IQ4_XS,
        GgmlType::I32,
    ] {
        assert!(matches!(activation_type(ty), Err(QuantError::Unsupported(t)) if t == ty));
        assert!(matches!(
            quantize_activation(ty, &x),
            Err(QuantError::Unsupported(_))
        ));
        assert!(matches!(
            dequantize_row(ty, &[0; 144], &mut y),
            Err(QuantError::Unsupported(_))
        ));
        assert!(matches!(
            quantize_row(ty, &x, &mut [0; 144]),
            Err(QuantError::Unsupported(_))
        ));
        let act = Activation::F32(x.clone());
        assert!(matches!(
            dot_row(ty, &[0; 1024], &act),
            Err(QuantError::Unsupported(_))
        ));
    }
    for ty in WEIGHT_TYPES {
        let bytes = ty.row_bytes(256).unwrap() as usize;
        // Row length not a multiple of the block.
        if ty.block_size() > 1 {
            let e = dequantize_row(ty, &vec![0; bytes], &mut y[..100]).unwrap_err();
            assert!(
                matches!(e, QuantError::RowLength { n: 100, .. }),
                "{ty}: {e}"
            );
            let e = quantize_row(ty, &x[..100], &mut vec![0; bytes]).unwrap_err();
            assert!(
                matches!(e, QuantError::RowLength { n: 100, .. }),
                "{ty}: {e}"
            );
            let e = quantize_activation(ty, &x[..100]).unwrap_err();
            assert!(
                matches!(e, QuantError::RowLength { n: 100, .. }),
                "{ty}: {e}"
            );
        }
        // Wrong byte counts, both ways.
        for got in [bytes - 1, bytes + 1, 0] {
            let e = dequantize_row(ty, &vec![0; got], &mut y).unwrap_err();
            assert!(
                matches!(e, QuantError::ByteLength { expected, got: g, .. } if expected == bytes && g == got),
                "{ty}: {e}"
            );
            let e = quantize_row(ty, &x, &mut vec![0; got]).unwrap_err();
            assert!(matches!(e, QuantError::ByteLength { .. }), "{ty}: {e}");
        }
        // Weight row and activation of different lengths.
        let act = quantize_activation(ty, &x).unwrap();
        let e = dot_row(ty, &vec![0; 2 * bytes], &act).unwrap_err();
        assert!(matches!(e, QuantError::ByteLength { .. }), "{ty}: {e}");
        // An activation quantized for another weight type.
        let other = if activation_type(ty).unwrap() == GgmlType::Q8_K {
            GgmlType::F32
        } else {
            GgmlType::Q6_K
        };
        let wrong = quantize_activation(other, &x).unwrap();
        let e = dot_row(ty, &vec![0; bytes], &wrong).unwrap_err();
        assert!(matches!(e, QuantError::ActivationType { .. }), "{ty}: {e}");
    }
}

#[test]
fn misaligned_bytes_give_the_same_results() {
    let mut rng = StdRng::seed_from_u64(9);
    let x = random_data(&mut rng, 512);
    for ty in WEIGHT_TYPES {
        let q = quant(ty, &x);
        // The same bytes at an odd address.
        let mut buf = vec![0u8; q.len() + 1];
        buf[1..].copy_from_slice(&q);
        let odd = &buf[1..];
        assert_eq!(dequant(ty, odd, 512), dequant(ty, &q, 512), "{ty}");
        let act = quantize_activation(ty, &x).unwrap();
        assert_eq!(
            dot_row(ty, odd, &act).unwrap(),
            dot_row(ty, &q, &act).unwrap(),
            "{ty}"
        );
        let mut out = vec![0u8; q.len() + 1];
        quantize_row(ty, &x, &mut out[1..]).unwrap();
        assert_eq!(&out[1..], &q[..], "{ty}");
    }
}

#[test]
fn activation_types() {
    use GgmlType::*;
    for (w, a) in [
        (F32, F32),
        (F16, F32),
        (BF16, F32),
        (Q8_0, Q8_0),
        (Q4_K, Q8_K),
        (Q5_K, Q8_K),
        (Q6_K, Q8_K),
    ] {
        assert_eq!(activation_type(w).unwrap(), a);
    }
}
