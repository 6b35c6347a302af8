//! The backend's Q8_K activation quantizer gives the reference quantizer's bytes.

use muser_engine::backend::cpu::quant::quantize_row_q8_k;
use muser_quant::quantize::quantize_row_q8_k_ref;
use muser_quant::BlockQ8K;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

#[test]
fn q8_k_quantizer_equals_the_reference_bytewise() {
    let mut rng = StdRng::seed_from_u64(11);
    let mut rows: Vec<Vec<f32>> = Vec::new();
    for scale in [1e-39f32, 1e-30, 1e-3, 1.0, 300.0, 1e30] {
        rows.push(
            (0..1024)
                .map(|_| rng.gen_range(-1.0f32..1.0) * scale)
                .collect(),
        );
    }
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

trait Zeroed {
    fn default_zeroed() -> Self;
}
impl Zeroed for BlockQ8K {
    fn default_zeroed() -> Self {
        bytemuck::Zeroable::zeroed()
    }
}
