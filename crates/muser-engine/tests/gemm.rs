//! The multi-column prefill kernels (4 and 8 columns) against muser-quant's scalar reference
//! dots, and bit for bit against its AVX-512 one-column kernels, for several block counts.
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

fn columns<const C: usize>(nb: usize, rng: &mut StdRng) -> [Vec<BlockQ8K>; C] {
    std::array::from_fn(|_| {
        let x: Vec<f32> = (0..nb * 256)
            .map(|_| rng.gen_range(-2.0f32..2.0) + 0.01)
            .collect();
        let mut y = vec![bytemuck::Zeroable::zeroed(); nb];
        quantize_row_q8_k_ref(&x, &mut y);
        y
    })
}

/// The C-column kernel against the one-column `dot`: within 1e-4 relative, or bit for bit.
fn check<W: bytemuck::Pod, const C: usize>(
    ty: GgmlType,
    dotn: gemm::DotN<W, C>,
    dot: fn(&[W], &[BlockQ8K]) -> f32,
    bitwise: bool,
) {
    let mut rng = StdRng::seed_from_u64(ty as u64 + C as u64);
    for nb in [1usize, 2, 7, 16, 22] {
        let w: Vec<f32> = (0..nb * 256)
            .map(|_| rng.gen_range(-1.0f32..1.0) + 0.01)
            .collect();
        let bytes = quantize(ty, &w, nb * 256);
        let wb: &[W] = bytemuck::cast_slice(&bytes);
        let ys = columns::<C>(nb, &mut rng);
        let got = dotn(wb, std::array::from_fn(|c| ys[c].as_slice()));
        for c in 0..C {
            let want = dot(wb, &ys[c]);
            if bitwise {
                assert_eq!(
                    got[c].to_bits(),
                    want.to_bits(),
                    "{ty} x{C} nb={nb} column {c}"
                );
            } else {
                let err = (got[c] - want).abs() / want.abs().max(1.0);
                assert!(
                    err < 1e-4,
                    "{ty} x{C} nb={nb} column {c}: {} vs {want}",
                    got[c]
                );
            }
        }
    }
}

#[test]
fn multi_column_kernels_match_scalar_reference() {
    let Some(k4) = gemm::q4_k_cols::<4>() else {
        return eprintln!("no AVX-512 VNNI: skipped");
    };
    let s = Kernels::scalar();
    check::<BlockQ4K, 4>(GgmlType::Q4_K, k4, s.dot_q4_k_q8_k, false);
    check::<BlockQ4K, 8>(
        GgmlType::Q4_K,
        gemm::q4_k_cols::<8>().unwrap(),
        s.dot_q4_k_q8_k,
        false,
    );
    check::<BlockQ6K, 4>(
        GgmlType::Q6_K,
        gemm::q6_k_cols::<4>().unwrap(),
        s.dot_q6_k_q8_k,
        false,
    );
    check::<BlockQ6K, 8>(
        GgmlType::Q6_K,
        gemm::q6_k_cols::<8>().unwrap(),
        s.dot_q6_k_q8_k,
        false,
    );
}

/// Prefill uses the multi-column kernels and decode the one-column ones: with the same lanes
/// and reduction they agree to the bit, so prefill and decode logits do too.
#[test]
fn multi_column_kernels_equal_the_avx512_one_column_kernels_bitwise() {
    let (Some(k), Some(k4)) = (Kernels::avx512(), gemm::q4_k_cols::<4>()) else {
        return eprintln!("no AVX-512 VNNI: skipped");
    };
    check::<BlockQ4K, 4>(GgmlType::Q4_K, k4, k.dot_q4_k_q8_k, true);
    check::<BlockQ4K, 8>(
        GgmlType::Q4_K,
        gemm::q4_k_cols::<8>().unwrap(),
        k.dot_q4_k_q8_k,
        true,
    );
    check::<BlockQ6K, 4>(
        GgmlType::Q6_K,
        gemm::q6_k_cols::<4>().unwrap(),
        k.dot_q6_k_q8_k,
        true,
    );
    check::<BlockQ6K, 8>(
        GgmlType::Q6_K,
        gemm::q6_k_cols::<8>().unwrap(),
        k.dot_q6_k_q8_k,
        true,
    );
}
