//! The backend's Q8_K and Q8_0 activation quantizers give the reference quantizers' bytes.

use muser_engine::backend::cpu::quant::{quantize_row_q8_0, quantize_row_q8_k};
use muser_quant::quantize::{quantize_row_q8_0_ref, quantize_row_q8_k_ref};
use muser_quant::{BlockQ8K, BlockQ8_0};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// Rows of 1024 random values at scales from subnormal to 1e30.
fn scaled_rows(rng: &mut StdRng) -> Vec<Vec<f32>> {
    [1e-39f32, 1e-30, 1e-3, 1.0, 300.0, 1e30]
        .iter()
        .map(|&scale| {
            (0..1024)
                .map(|_| rng.gen_range(-1.0f32..1.0) * scale)
                .collect()
        })
        .collect()
}

#[test]
fn q8_k_quantizer_equals_the_reference_bytewise() {
    let mut rng = StdRng::seed_from_u64(11);
    let mut rows = scaled_rows(&mut rng);
    // Ties in magnitude of both signs (the first one sets the scale), zeros, a zero block,
    // exact halves (rounding ties), NaN and infinities.
    let mut r: Vec<f32> = (0..1024).map(|i| ((i % 7) as f32 - 3.0) * 0.5).collect();
    r[5] = -4.0;
    r[9] = 4.0;
    r[300] = 4.0;
    r[301] = -4.0;
    r[512..768].fill(0.0);
    r[800] = f32::NAN;
    rows.push(r);
    let mut r: Vec<f32> = (0..512)
        .map(|i| (i as f32 - 256.0) / 254.0 * 127.5)
        .collect();
    r[3] = f32::INFINITY;
    r[300] = -0.0;
    rows.push(r);
    for x in rows {
        let nb = x.len() / 256;
        let mut want = vec![BlockQ8K::default_zeroed(); nb];
        let mut got = vec![BlockQ8K::default_zeroed(); nb];
        quantize_row_q8_k_ref(&x, &mut want);
        quantize_row_q8_k(&x, &mut got);
        let (w, g): (&[u8], &[u8]) = (bytemuck::cast_slice(&want), bytemuck::cast_slice(&got));
        assert_eq!(w, g, "first values {:?}", &x[..4]);
    }
}

#[test]
fn q8_0_quantizer_equals_the_reference_bytewise() {
    let mut rng = StdRng::seed_from_u64(12);
    let mut rows = scaled_rows(&mut rng);
    // Exact halves of both signs after scaling (amax 127: d = 1; roundf's ties go away from
    // zero), zeros, a zero block, NaN and infinities, -0.0.
    let mut r: Vec<f32> = (0..1024)
        .map(|i| ((i % 11) as f32 - 5.0) * 0.5 + 0.5 * (i % 3) as f32)
        .collect();
    for b in 0..32 {
        r[32 * b + b % 32] = if b % 2 == 0 { 127.0 } else { -127.0 };
    }
    r[512..544].fill(0.0);
    r[600] = f32::NAN;
    r[700] = f32::INFINITY;
    r[701] = -0.0;
    rows.push(r);
    rows.push(
        (0..512)
            .map(|i| (i as f32 - 256.0) / 254.0 * 127.5)
            .collect(),
    );
    for x in rows {
        let nb = x.len() / 32;
        let mut want: Vec<BlockQ8_0> = vec![bytemuck::Zeroable::zeroed(); nb];
        let mut got: Vec<BlockQ8_0> = vec![bytemuck::Zeroable::zeroed(); nb];
        quantize_row_q8_0_ref(&x, &mut want);
        quantize_row_q8_0(&x, &mut got);
        let (w, g): (&[u8], &[u8]) = (bytemuck::cast_slice(&want), bytemuck::cast_slice(&got));
        assert_eq!(w, g, "first values {:?}", &x[..4]);
    }
}

trait Zeroed {
    fn default_zeroed() -> Self;
}
impl Zeroed for BlockQ8K {
    fn default_zeroed() -> Self {
        bytemuck::Zeroable::zeroed()
    }
}
