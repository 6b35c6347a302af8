//! The multi-column prefill kernels (4 and 8 columns) against muser-quant's scalar reference
//! dots, and bit for bit against its AVX-512 one-column kernels, for several block counts; the
//! register-tiled kernels bit for bit too (Q8_0: against the scalar reference dot, whose order
//! every Q8_0 kernel keeps).
#![cfg(target_arch = "x86_64")]

mod common;
use common::quantize;
use muser_engine::backend::cpu::gemm;
use muser_gguf::GgmlType;
use muser_quant::dot::vec_dot_q8_0_q8_0;
use muser_quant::quantize::quantize_row_q8_k_ref;
use muser_quant::simd::Kernels;
use muser_quant::{BlockQ4K, BlockQ5K, BlockQ6K, BlockQ8K, BlockQ8_0};
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

/// `check` at 4 and 8 columns.
fn check_4_and_8<W: bytemuck::Pod>(
    ty: GgmlType,
    k: (Option<gemm::DotN<W, 4>>, Option<gemm::DotN<W, 8>>),
    dot: fn(&[W], &[BlockQ8K]) -> f32,
    bitwise: bool,
) {
    check::<W, 4>(ty, k.0.unwrap(), dot, bitwise);
    check::<W, 8>(ty, k.1.unwrap(), dot, bitwise);
}

/// The Q4_K, Q5_K and Q6_K multi-column kernels at 4 and 8 columns against `k`'s dots.
fn check_k_quants(k: &Kernels, bitwise: bool) {
    let q4 = (gemm::q4_k_cols(), gemm::q4_k_cols());
    check_4_and_8::<BlockQ4K>(GgmlType::Q4_K, q4, k.dot_q4_k_q8_k, bitwise);
    let q5 = (gemm::q5_k_cols(), gemm::q5_k_cols());
    check_4_and_8::<BlockQ5K>(GgmlType::Q5_K, q5, k.dot_q5_k_q8_k, bitwise);
    let q6 = (gemm::q6_k_cols(), gemm::q6_k_cols());
    check_4_and_8::<BlockQ6K>(GgmlType::Q6_K, q6, k.dot_q6_k_q8_k, bitwise);
}

#[test]
fn multi_column_kernels_match_scalar_reference() {
    if gemm::q4_k_cols::<4>().is_none() {
        return eprintln!("no AVX-512 VNNI: skipped");
    }
    check_k_quants(&Kernels::scalar(), false);
}

/// Prefill uses the multi-column kernels and decode the one-column ones: with the same lanes
/// and reduction they agree to the bit, so prefill and decode logits do too.
#[test]
fn multi_column_kernels_equal_the_avx512_one_column_kernels_bitwise() {
    let Some(k) = Kernels::avx512().filter(|_| gemm::q4_k_cols::<4>().is_some()) else {
        return eprintln!("no AVX-512 VNNI: skipped");
    };
    check_k_quants(&k, true);
}

/// out[t * rows + r] has the bits of want(r, t) for every row r and column t < n.
fn assert_bitwise(
    out: &[f32],
    rows: usize,
    n: usize,
    what: &str,
    want: impl Fn(usize, usize) -> f32,
) {
    for t in 0..n {
        for r in 0..rows {
            let (got, want) = (out[t * rows + r], want(r, t));
            assert_eq!(
                got.to_bits(),
                want.to_bits(),
                "{what} rows={rows} n={n}: row {r} column {t}: {got} vs {want}"
            );
        }
    }
}

/// `count` Q8_0 blocks quantized from random non-zero values.
fn random_q8_0_blocks(count: usize, rng: &mut StdRng) -> Vec<BlockQ8_0> {
    let v: Vec<f32> = (0..count * 32)
        .map(|_| rng.gen_range(-1.0f32..1.0) + 0.01)
        .collect();
    bytemuck::cast_slice::<u8, BlockQ8_0>(&quantize(GgmlType::Q8_0, &v, 32)).to_vec()
}

/// The register-tiled Q8_0 matmul against the scalar reference dot (whose bits every one-column
/// Q8_0 dot gives), bit for bit, at every (row, column) of shapes that use each tile width and
/// pad the last 8-row tile, with odd and even block counts (its steps take two blocks).
#[test]
fn q8_0_matmul_equals_the_scalar_reference_bitwise() {
    let Some(mm) = gemm::q8_0_matmul() else {
        return eprintln!("no AVX-512 VNNI: skipped");
    };
    let mut rng = StdRng::seed_from_u64(8);
    let q8 = random_q8_0_blocks;
    for (rows, nb, n) in [
        (1, 1, 1),
        (7, 2, 2),
        (9, 3, 3),
        (1, 1, 4),
        (3, 5, 5),
        (8, 4, 16),
        (9, 3, 17),
        (17, 8, 31),
        (18, 13, 40),
    ] {
        let w = q8(rows * nb, &mut rng);
        let y = q8(n * nb, &mut rng);
        let mut out = vec![f32::NAN; n * rows];
        mm(&w, rows, &y, n, &mut out);
        assert_bitwise(&out, rows, n, "q8_0_matmul", |r, t| {
            vec_dot_q8_0_q8_0(&w[r * nb..(r + 1) * nb], &y[t * nb..(t + 1) * nb])
        });
    }
}

/// Random blocks with finite scales: every quant and packed scale byte random.
fn random_blocks<W: bytemuck::Pod>(
    count: usize,
    rng: &mut StdRng,
    fix: impl Fn(&mut W, &mut StdRng),
) -> Vec<W> {
    let mut v: Vec<W> = vec![bytemuck::Zeroable::zeroed(); count];
    rng.fill(bytemuck::cast_slice_mut::<W, u8>(&mut v));
    for b in &mut v {
        fix(b, rng);
    }
    v
}

fn small_f16(rng: &mut StdRng) -> half::f16 {
    half::f16::from_f32(rng.gen_range(-1.0f32..1.0) * 1e-2)
}

fn q4_k_blocks(count: usize, rng: &mut StdRng) -> Vec<BlockQ4K> {
    random_blocks(count, rng, |b: &mut BlockQ4K, rng| {
        b.d = small_f16(rng);
        b.dmin = small_f16(rng);
    })
}

fn q5_k_blocks(count: usize, rng: &mut StdRng) -> Vec<BlockQ5K> {
    random_blocks(count, rng, |b: &mut BlockQ5K, rng| {
        b.d = small_f16(rng);
        b.dmin = small_f16(rng);
    })
}

fn q6_k_blocks(count: usize, rng: &mut StdRng) -> Vec<BlockQ6K> {
    random_blocks(count, rng, |b: &mut BlockQ6K, rng| b.d = small_f16(rng))
}

fn q8_k_columns(n: usize, nb: usize, rng: &mut StdRng) -> Vec<BlockQ8K> {
    let x: Vec<f32> = (0..n * nb * 256)
        .map(|_| rng.gen_range(-2.0f32..2.0) + 0.01)
        .collect();
    let mut y = vec![bytemuck::Zeroable::zeroed(); n * nb];
    quantize_row_q8_k_ref(&x, &mut y);
    y
}

/// The tiled matmul against the one-column kernel, bit for bit, at every (row, column) of
/// shapes whose row and column counts are and are not multiples of the tile.
fn check_tiled<W: bytemuck::Pod>(
    name: &str,
    gemm: muser_engine::backend::cpu::tile::GemmFn<W>,
    dot: fn(&[W], &[BlockQ8K]) -> f32,
    blocks: fn(usize, &mut StdRng) -> Vec<W>,
) {
    let shapes = [
        (1, 1, 1),
        (3, 2, 5),
        (4, 1, 4),
        (5, 8, 9),
        (7, 3, 13),
        (13, 2, 31),
        (16, 8, 64),
        (67, 1, 127),
        (9, 28, 70),
        (33, 4, 512),
    ];
    check_shapes(name, gemm, dot, blocks, &shapes)
}

/// `gemm` against the one-column kernel, bit for bit, at every (row, column) of the (rows,
/// blocks, columns) shapes.
fn check_shapes<W: bytemuck::Pod>(
    name: &str,
    gemm: muser_engine::backend::cpu::tile::GemmFn<W>,
    dot: fn(&[W], &[BlockQ8K]) -> f32,
    blocks: fn(usize, &mut StdRng) -> Vec<W>,
    shapes: &[(usize, usize, usize)],
) {
    let mut rng = StdRng::seed_from_u64(42);
    for &(rows, nb, n) in shapes {
        let w = blocks(rows * nb, &mut rng);
        let y = q8_k_columns(n, nb, &mut rng);
        let mut out = vec![f32::NAN; rows * n];
        gemm(&w, rows, &y, n, &mut out);
        assert_bitwise(&out, rows, n, &format!("{name} nb={nb}"), |r, t| {
            dot(&w[r * nb..(r + 1) * nb], &y[t * nb..(t + 1) * nb])
        });
    }
}

/// The register-tiled prefill kernels equal the AVX-512 one-column kernels bit for bit.
#[test]
fn tiled_kernels_equal_the_avx512_one_column_kernels_bitwise() {
    use muser_engine::backend::cpu::tile;
    let (Some(k), Some(g4), Some(g5), Some(g6)) = (
        Kernels::avx512(),
        tile::q4_k_gemm(),
        tile::q5_k_gemm(),
        tile::q6_k_gemm(),
    ) else {
        return eprintln!("no AVX-512 VNNI: skipped");
    };
    check_tiled("q4_k", g4, k.dot_q4_k_q8_k, q4_k_blocks);
    check_tiled("q5_k", g5, k.dot_q5_k_q8_k, q5_k_blocks);
    check_tiled("q6_k", g6, k.dot_q6_k_q8_k, q6_k_blocks);
}

/// The 4-column-group kernels (4 to 15 columns) equal the AVX-512 one-column kernels bit for
/// bit, at every column count up to 16 and row counts that are and are not multiples of the
/// row groups (4) and passes (32).
#[test]
fn four_column_kernels_equal_the_avx512_one_column_kernels_bitwise() {
    use muser_engine::backend::cpu::tile4;
    let (Some(k), Some(g4), Some(g5), Some(g6)) = (
        Kernels::avx512(),
        tile4::q4_k_gemm(),
        tile4::q5_k_gemm(),
        tile4::q6_k_gemm(),
    ) else {
        return eprintln!("no AVX-512 VNNI: skipped");
    };
    let mut shapes = vec![(1, 1, 1), (70, 3, 4), (33, 28, 8), (64, 2, 15)];
    shapes.extend((1..=16).map(|n| (3 + 5 * n, 1 + n % 3, n)));
    check_shapes("tile4 q4_k", g4, k.dot_q4_k_q8_k, q4_k_blocks, &shapes);
    check_shapes("tile4 q5_k", g5, k.dot_q5_k_q8_k, q5_k_blocks, &shapes);
    check_shapes("tile4 q6_k", g6, k.dot_q6_k_q8_k, q6_k_blocks, &shapes);
}

/// The tiled Q8_0 kernel equals the scalar reference dot (and so every one-column Q8_0 dot) bit
/// for bit at every (row, column): rows and columns that are and are not multiples of the tile
/// (16) and of the row passes (8), block counts below and above the one-column kernels' 8-block
/// steps, weights over the whole i8 range (-128 included) and quantized ones.
#[test]
fn tiled_q8_0_kernel_equals_the_scalar_reference_bitwise() {
    use muser_engine::backend::cpu::tile_q8_0;
    let Some(gemm) = tile_q8_0::q8_0_gemm() else {
        return eprintln!("no AVX-512 VNNI: skipped");
    };
    let mut rng = StdRng::seed_from_u64(80);
    let quantized = random_q8_0_blocks;
    let shapes = [
        (1, 1, 1),
        (3, 2, 5),
        (4, 4, 16),
        (5, 7, 17),
        (16, 8, 16),
        (17, 5, 33),
        (31, 13, 40),
        (64, 64, 64),
        (67, 3, 127),
        (40, 9, 512),
    ];
    for (i, &(rows, nb, n)) in shapes.iter().enumerate() {
        let w = if i % 2 == 0 {
            random_blocks(rows * nb, &mut rng, |b: &mut BlockQ8_0, rng| {
                b.d = small_f16(rng)
            })
        } else {
            quantized(rows * nb, &mut rng)
        };
        let y = quantized(n * nb, &mut rng);
        let mut out = vec![f32::NAN; rows * n];
        gemm(&w, rows, &y, n, &mut out);
        assert_bitwise(&out, rows, n, &format!("tile_q8_0 nb={nb}"), |r, t| {
            vec_dot_q8_0_q8_0(&w[r * nb..(r + 1) * nb], &y[t * nb..(t + 1) * nb])
        });
    }
}

/// The repacked K-quant kernels (`x16`: every matmul over Q4_K, Q5_K and Q6_K, 16-row groups
/// on AVX-512 VNNI, 8-row groups on AVX2) equal the scalar reference dots bit for bit (so the
/// AVX-512 one-column kernels too; the AVX2 ones differ in the f32 order across blocks) at every
/// (row, column): row counts that are and are not multiples of the groups, every column count up to 9
/// (passes of 4 or 2 and the rest) and wider ones, and row ranges that start inside the matrix
/// (the matmul's tasks).
/// Rows 32..67 of the 70-row matrix `w` repacked in groups of r, against the n columns of y, equal
/// the scalar reference `dot` bitwise, for every [`x16::Ahead`] pattern.
fn x16_row_range<W: bytemuck::Pod>(
    ty: GgmlType,
    w: &[W],
    dot: fn(&[W], &[BlockQ8K]) -> f32,
    r: usize,
    y: &[BlockQ8K],
    n: usize,
) {
    use muser_engine::backend::cpu::x16::{Ahead, AheadPlan, X16};
    let (rows, r0, r1) = (70, 32, 67);
    let nb = w.len() / rows;
    let mut x = X16::with_rows(ty, bytemuck::cast_slice(w), rows, nb, r).expect("a K-quant type");
    for ahead in [Ahead::None, Ahead::Block, Ahead::Spread] {
        x.set_ahead(AheadPlan::all(ahead));
        let mut out = vec![f32::NAN; (r1 - r0) * n];
        // SAFETY: out holds n rows of r1 - r0 outputs.
        unsafe { x.gemm_into(y, n, r0, r1, out.as_mut_ptr(), r1 - r0) };
        for t in 0..n {
            for row in r0..r1 {
                let want = dot(&w[row * nb..(row + 1) * nb], &y[t * nb..(t + 1) * nb]);
                assert_eq!(
                    out[t * (r1 - r0) + row - r0].to_bits(),
                    want.to_bits(),
                    "x16 {ty} r={r} rows {r0}..{r1}, {n} columns, {ahead:?} ahead: row {row} column {t}"
                );
            }
        }
    }
}

#[test]
fn repacked_k_quant_kernels_equal_the_scalar_reference_bitwise() {
    use muser_engine::backend::cpu::x16;
    use muser_quant::dot;
    let mut ran = 0;
    for r in [16, 8] {
        let (Some(g4), Some(g5), Some(g6)) = (
            x16::gemm::<BlockQ4K>(GgmlType::Q4_K, r),
            x16::gemm::<BlockQ5K>(GgmlType::Q5_K, r),
            x16::gemm::<BlockQ6K>(GgmlType::Q6_K, r),
        ) else {
            eprintln!("no kernels of {r}-row groups on this CPU: skipped");
            continue;
        };
        ran += 1;
        let mut shapes = vec![(1, 1, 1), (16, 2, 1), (17, 3, 2), (40, 26, 3), (33, 4, 33)];
        shapes.extend((1..=9).map(|n| (5 + 7 * n, 1 + n % 4, n)));
        check_shapes(
            &format!("x16 r={r} q4_k"),
            g4,
            dot::vec_dot_q4_k_q8_k,
            q4_k_blocks,
            &shapes,
        );
        check_shapes(
            &format!("x16 r={r} q5_k"),
            g5,
            dot::vec_dot_q5_k_q8_k,
            q5_k_blocks,
            &shapes,
        );
        check_shapes(
            &format!("x16 r={r} q6_k"),
            g6,
            dot::vec_dot_q6_k_q8_k,
            q6_k_blocks,
            &shapes,
        );

        // Rows 32..67 of 70 (a range that starts inside the matrix and ends inside a group), one
        // column (the one-column pattern) and 3 to 40: every pass width of 16-row groups (up to
        // 8 columns a pass for up to 32 columns, 4 past that; 8-row groups take 2), and several
        // passes (11, 16, 20, 40), with every way of asking for the weight lines ahead (which
        // CPU does which: `ahead_plan`).
        let mut rng = StdRng::seed_from_u64(16);
        let (rows, nb) = (70, 5);
        let w4 = q4_k_blocks(rows * nb, &mut rng);
        let w5 = q5_k_blocks(rows * nb, &mut rng);
        let w6 = q6_k_blocks(rows * nb, &mut rng);
        for n in [1, 3, 5, 6, 7, 8, 11, 16, 20, 40] {
            let y = q8_k_columns(n, nb, &mut rng);
            x16_row_range(GgmlType::Q4_K, &w4, dot::vec_dot_q4_k_q8_k, r, &y, n);
            x16_row_range(GgmlType::Q5_K, &w5, dot::vec_dot_q5_k_q8_k, r, &y, n);
            x16_row_range(GgmlType::Q6_K, &w6, dot::vec_dot_q6_k_q8_k, r, &y, n);
        }
    }
    eprintln!("x16 kernels checked at {ran} levels");
}
