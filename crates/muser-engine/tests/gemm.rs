//! The four-column prefill kernels against muser-quant's scalar reference dots, on random
//! blocks, for several block counts.
#![cfg(target_arch = "x86_64")]

mod common;
use common::quantize;
use muser_engine::backend::cpu::gemm;
use muser_gguf::GgmlType;
use muser_quant::quantize::quantize_row_q8_k_ref;
use muser_quant::simd::Kernels;
use muser_quant::{BlockQ4K, BlockQ6K, BlockQ8K};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

fn columns(nb: usize, rng: &mut StdRng) -> Vec<Vec<BlockQ8K>> {
    (0..4)
        .map(|_| {
            let x: Vec<f32> = (0..nb * 256)
                .map(|_| rng.gen_range(-2.0f32..2.0) + 0.01)
                .collect();
            let mut y = vec![bytemuck::Zeroable::zeroed(); nb];
            quantize_row_q8_k_ref(&x, &mut y);
            y
        })
        .collect()
}

fn check<W: bytemuck::Pod>(ty: GgmlType, dot4: gemm::Dot4<W>, dot: fn(&[W], &[BlockQ8K]) -> f32) {
    let mut rng = StdRng::seed_from_u64(ty as u64);
    for nb in [1usize, 2, 7, 16] {
        let w: Vec<f32> = (0..nb * 256)
            .map(|_| rng.gen_range(-1.0f32..1.0) + 0.01)
            .collect();
        let bytes = quantize(ty, &w, nb * 256);
        let wb: &[W] = bytemuck::cast_slice(&bytes);
        let ys = columns(nb, &mut rng);
        let got = dot4(wb, [&ys[0], &ys[1], &ys[2], &ys[3]]);
        for c in 0..4 {
            let want = dot(wb, &ys[c]);
            let err = (got[c] - want).abs() / want.abs().max(1.0);
            assert!(
                err < 1e-4,
                "{ty} nb={nb} column {c}: {} vs reference {want}",
                got[c]
            );
        }
    }
}

#[test]
fn q4_k_x4_matches_scalar_reference() {
    let Some(k) = gemm::q4_k_x4() else {
        return eprintln!("no AVX-512 VNNI: skipped");
    };
    check::<BlockQ4K>(GgmlType::Q4_K, k, Kernels::scalar().dot_q4_k_q8_k);
}

#[test]
fn q6_k_x4_matches_scalar_reference() {
    let Some(k) = gemm::q6_k_x4() else {
        return eprintln!("no AVX-512 VNNI: skipped");
    };
    check::<BlockQ6K>(GgmlType::Q6_K, k, Kernels::scalar().dot_q6_k_q8_k);
}

/// Prefill uses the four-column kernels and decode the one-column ones: with the same lanes
/// and reduction they agree to the bit, so prefill and decode logits do too.
#[test]
fn x4_equals_the_avx512_one_column_kernel_bitwise() {
    let Some(k) = Kernels::avx512() else {
        return eprintln!("no AVX-512: skipped");
    };
    let (k4, k6) = (gemm::q4_k_x4().unwrap(), gemm::q6_k_x4().unwrap());
    let mut rng = StdRng::seed_from_u64(99);
    for nb in [1usize, 3, 8, 22] {
        let w: Vec<f32> = (0..nb * 256)
            .map(|_| rng.gen_range(-1.0f32..1.0) + 0.01)
            .collect();
        let ys = columns(nb, &mut rng);
        let (b4, b6) = (
            quantize(GgmlType::Q4_K, &w, nb * 256),
            quantize(GgmlType::Q6_K, &w, nb * 256),
        );
        let (w4, w6): (&[BlockQ4K], &[BlockQ6K]) =
            (bytemuck::cast_slice(&b4), bytemuck::cast_slice(&b6));
        let (g4, g6) = (
            k4(w4, [&ys[0], &ys[1], &ys[2], &ys[3]]),
            k6(w6, [&ys[0], &ys[1], &ys[2], &ys[3]]),
        );
        for c in 0..4 {
            assert_eq!(
                g4[c].to_bits(),
                (k.dot_q4_k_q8_k)(w4, &ys[c]).to_bits(),
                "Q4_K nb {nb} column {c}"
            );
            assert_eq!(
                g6[c].to_bits(),
                (k.dot_q6_k_q8_k)(w6, &ys[c]).to_bits(),
                "Q6_K nb {nb} column {c}"
            );
        }
    }
}
