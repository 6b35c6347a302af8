//! Every SIMD level this CPU runs (`Kernels::all_available`) against the scalar reference dots of
//! `muser_quant::dot`, and against an f64 sum of the individual terms, on random non-zero blocks:
//! random bytes for the quants and packed scales, random positive f16 scales, Q8_K activations
//! with qs in -127..=127 and consistent bsums; row lengths from 256 to 20,480 (the model's 6656
//! and 19968 included), odd block counts and odd float lengths to reach every tail.
//! Tolerance: |simd - reference| <= 1e-4 * sum |terms| (the integer sums are exact, only the f32
//! accumulation order differs). The Q8_0 dots (every level) and the AVX-512 K-quant dots keep the
//! reference's order and are checked bit for bit too.

use half::{bf16, f16};
use muser_quant::blocks::scale_min_k4;
use muser_quant::dot::*;
use muser_quant::simd::Kernels;
use muser_quant::*;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const K_LENGTHS: [usize; 9] = [256, 512, 768, 4096, 4352, 6656, 11008, 19968, 20480];
const Q8_0_LENGTHS: [usize; 8] = [32, 64, 96, 4096, 6656, 6688, 19968, 20480];
const FLOAT_LENGTHS: [usize; 16] = [
    1, 7, 15, 16, 17, 63, 64, 65, 100, 256, 1000, 4096, 6656, 19968, 20479, 20480,
];

/// The f64 sum of the terms and the sum of their absolute values.
struct Terms {
    exact: f64,
    scale: f64,
}

impl Terms {
    fn new() -> Terms {
        Terms {
            exact: 0.0,
            scale: 0.0,
        }
    }
    fn add(&mut self, t: f64) {
        self.exact += t;
        self.scale += t.abs();
    }
}

fn check(what: &str, isa: &str, n: usize, got: f32, reference: f32, terms: &Terms) {
    let tol = 1e-4 * terms.scale;
    assert!(got.is_finite(), "{what} [{isa}] n={n}: {got}");
    assert!(terms.scale > 0.0, "{what} n={n}: all-zero test data");
    assert!(
        (got as f64 - reference as f64).abs() <= tol,
        "{what} [{isa}] n={n}: simd {got} vs scalar {reference} (tolerance {tol:e})"
    );
    assert!(
        (got as f64 - terms.exact).abs() <= tol,
        "{what} [{isa}] n={n}: simd {got} vs exact {} (tolerance {tol:e})",
        terms.exact
    );
}

fn levels() -> Vec<Kernels> {
    let all = Kernels::all_available();
    eprintln!(
        "levels tested: {:?}",
        all.iter().map(|k| k.isa).collect::<Vec<_>>()
    );
    all
}

fn f16_scale(rng: &mut StdRng, lo: f32, hi: f32) -> f16 {
    f16::from_f32(rng.gen_range(lo..hi))
}

fn bytes<const N: usize>(rng: &mut StdRng) -> [u8; N] {
    std::array::from_fn(|_| rng.gen())
}

fn random_q8_k(rng: &mut StdRng, nb: usize) -> Vec<BlockQ8K> {
    (0..nb)
        .map(|_| {
            let qs: [i8; QK_K] = std::array::from_fn(|_| rng.gen_range(-127..=127));
            let bsums =
                std::array::from_fn(|j| qs[16 * j..16 * j + 16].iter().map(|&q| q as i16).sum());
            BlockQ8K {
                d: rng.gen_range(1e-3..1e-1),
                qs,
                bsums,
            }
        })
        .collect()
}

fn random_q4_k(rng: &mut StdRng, nb: usize) -> Vec<BlockQ4K> {
    (0..nb)
        .map(|_| BlockQ4K {
            d: f16_scale(rng, 1e-4, 1e-2),
            dmin: f16_scale(rng, 1e-4, 1e-2),
            scales: bytes(rng),
            qs: bytes(rng),
        })
        .collect()
}

fn random_q5_k(rng: &mut StdRng, nb: usize) -> Vec<BlockQ5K> {
    (0..nb)
        .map(|_| BlockQ5K {
            d: f16_scale(rng, 1e-4, 1e-2),
            dmin: f16_scale(rng, 1e-4, 1e-2),
            scales: bytes(rng),
            qh: bytes(rng),
            qs: bytes(rng),
        })
        .collect()
}

fn random_q6_k(rng: &mut StdRng, nb: usize) -> Vec<BlockQ6K> {
    (0..nb)
        .map(|_| BlockQ6K {
            ql: bytes(rng),
            qh: bytes(rng),
            scales: bytes::<16>(rng).map(|b| b as i8),
            d: f16_scale(rng, 1e-4, 1e-2),
        })
        .collect()
}

fn random_q8_0(rng: &mut StdRng, nb: usize) -> Vec<BlockQ8_0> {
    (0..nb)
        .map(|_| BlockQ8_0 {
            d: f16_scale(rng, 1e-3, 1e-1),
            qs: bytes::<32>(rng).map(|b| b as i8),
        })
        .collect()
}

fn terms_q4_k(x: &[BlockQ4K], y: &[BlockQ8K], fifth_bit: impl Fn(usize, usize) -> u8) -> Terms {
    let mut t = Terms::new();
    for (b, (bx, by)) in x.iter().zip(y).enumerate() {
        for i in 0..QK_K {
            let (sc, m) = scale_min_k4(i / 32, &bx.scales);
            let a = by.d as f64 * by.qs[i] as f64;
            let q = (bx.quant(i) | fifth_bit(b, i)) as f64;
            t.add(bx.d.to_f64() * sc as f64 * q * a);
            t.add(-bx.dmin.to_f64() * m as f64 * a);
        }
    }
    t
}

fn as_q4_k(x: &[BlockQ5K]) -> Vec<BlockQ4K> {
    x.iter()
        .map(|b| BlockQ4K {
            d: b.d,
            dmin: b.dmin,
            scales: b.scales,
            qs: b.qs,
        })
        .collect()
}

#[test]
fn q4_k_matches_scalar_at_every_level() {
    let mut rng = StdRng::seed_from_u64(0x5134_0001);
    for &n in &K_LENGTHS {
        let (x, y) = (
            random_q4_k(&mut rng, n / QK_K),
            random_q8_k(&mut rng, n / QK_K),
        );
        let (reference, terms) = (vec_dot_q4_k_q8_k(&x, &y), terms_q4_k(&x, &y, |_, _| 0));
        for k in levels() {
            check(
                "q4_k x q8_k",
                k.isa,
                n,
                (k.dot_q4_k_q8_k)(&x, &y),
                reference,
                &terms,
            );
        }
    }
}

#[test]
fn q5_k_matches_scalar_at_every_level() {
    let mut rng = StdRng::seed_from_u64(0x5134_0002);
    for &n in &K_LENGTHS {
        let (x, y) = (
            random_q5_k(&mut rng, n / QK_K),
            random_q8_k(&mut rng, n / QK_K),
        );
        let terms = terms_q4_k(&as_q4_k(&x), &y, |b, i| x[b].quant(i) & 16);
        let reference = vec_dot_q5_k_q8_k(&x, &y);
        for k in levels() {
            check(
                "q5_k x q8_k",
                k.isa,
                n,
                (k.dot_q5_k_q8_k)(&x, &y),
                reference,
                &terms,
            );
        }
    }
}

fn terms_q6_k(x: &[BlockQ6K], y: &[BlockQ8K]) -> Terms {
    let mut t = Terms::new();
    for (bx, by) in x.iter().zip(y) {
        for i in 0..QK_K {
            let w = bx.d.to_f64() * bx.scales[i / 16] as f64 * (bx.quant(i) as f64 - 32.0);
            t.add(w * by.d as f64 * by.qs[i] as f64);
        }
    }
    t
}

#[test]
fn q6_k_matches_scalar_at_every_level() {
    let mut rng = StdRng::seed_from_u64(0x5134_0003);
    for &n in &K_LENGTHS {
        let (x, y) = (
            random_q6_k(&mut rng, n / QK_K),
            random_q8_k(&mut rng, n / QK_K),
        );
        let (reference, terms) = (vec_dot_q6_k_q8_k(&x, &y), terms_q6_k(&x, &y));
        for k in levels() {
            check(
                "q6_k x q8_k",
                k.isa,
                n,
                (k.dot_q6_k_q8_k)(&x, &y),
                reference,
                &terms,
            );
        }
    }
}

fn terms_q8_0(x: &[BlockQ8_0], y: &[BlockQ8_0]) -> Terms {
    let mut t = Terms::new();
    for (bx, by) in x.iter().zip(y) {
        for i in 0..QK8_0 {
            t.add(bx.d.to_f64() * bx.qs[i] as f64 * by.d.to_f64() * by.qs[i] as f64);
        }
    }
    t
}

#[test]
fn q8_0_matches_scalar_at_every_level() {
    let mut rng = StdRng::seed_from_u64(0x5134_0004);
    for &n in &Q8_0_LENGTHS {
        let (x, y) = (
            random_q8_0(&mut rng, n / QK8_0),
            random_q8_0(&mut rng, n / QK8_0),
        );
        let (reference, terms) = (vec_dot_q8_0_q8_0(&x, &y), terms_q8_0(&x, &y));
        for k in levels() {
            check(
                "q8_0 x q8_0",
                k.isa,
                n,
                (k.dot_q8_0_q8_0)(&x, &y),
                reference,
                &terms,
            );
        }
    }
}

/// The extremes of every integer path: quants, scales and activations drawn only from their
/// limits (-128 included, which the Q8_K quantizer can produce), where a saturating i16 pair sum
/// or a sign trick would show.
#[test]
fn quantized_dots_are_exact_at_the_integer_limits() {
    let mut rng = StdRng::seed_from_u64(0x5134_0005);
    let pick = |rng: &mut StdRng, v: &[u8]| v[rng.gen_range(0..v.len())];
    let nb = 7;
    for _ in 0..20 {
        let mut y = random_q8_k(&mut rng, nb);
        for b in &mut y {
            b.qs = std::array::from_fn(|_| pick(&mut rng, &[0x80, 0x81, 0x7f, 0x00]) as i8);
            b.bsums =
                std::array::from_fn(|j| b.qs[16 * j..16 * j + 16].iter().map(|&q| q as i16).sum());
        }
        let extreme = |rng: &mut StdRng| pick(rng, &[0xff, 0x00, 0xf0, 0x0f, 0x80, 0x7f]);
        let mut x4 = random_q4_k(&mut rng, nb);
        let mut x5 = random_q5_k(&mut rng, nb);
        let mut x6 = random_q6_k(&mut rng, nb);
        let mut x8 = random_q8_0(&mut rng, nb * 8);
        let mut y8 = random_q8_0(&mut rng, nb * 8);
        for b in &mut x4 {
            b.scales = std::array::from_fn(|_| extreme(&mut rng));
            b.qs = std::array::from_fn(|_| extreme(&mut rng));
        }
        for b in &mut x5 {
            b.scales = std::array::from_fn(|_| extreme(&mut rng));
            b.qs = std::array::from_fn(|_| extreme(&mut rng));
            b.qh = std::array::from_fn(|_| extreme(&mut rng));
        }
        for b in &mut x6 {
            b.ql = std::array::from_fn(|_| extreme(&mut rng));
            b.qh = std::array::from_fn(|_| extreme(&mut rng));
            b.scales = std::array::from_fn(|_| extreme(&mut rng) as i8);
        }
        for b in x8.iter_mut().chain(&mut y8) {
            b.qs = std::array::from_fn(|_| extreme(&mut rng) as i8);
        }
        let n = nb * QK_K;
        let t4 = terms_q4_k(&x4, &y, |_, _| 0);
        let t5 = terms_q4_k(&as_q4_k(&x5), &y, |b, i| x5[b].quant(i) & 16);
        let (t6, t8) = (terms_q6_k(&x6, &y), terms_q8_0(&x8, &y8));
        for k in levels() {
            check(
                "q4_k limits",
                k.isa,
                n,
                (k.dot_q4_k_q8_k)(&x4, &y),
                vec_dot_q4_k_q8_k(&x4, &y),
                &t4,
            );
            check(
                "q5_k limits",
                k.isa,
                n,
                (k.dot_q5_k_q8_k)(&x5, &y),
                vec_dot_q5_k_q8_k(&x5, &y),
                &t5,
            );
            check(
                "q6_k limits",
                k.isa,
                n,
                (k.dot_q6_k_q8_k)(&x6, &y),
                vec_dot_q6_k_q8_k(&x6, &y),
                &t6,
            );
            check(
                "q8_0 limits",
                k.isa,
                n,
                (k.dot_q8_0_q8_0)(&x8, &y8),
                vec_dot_q8_0_q8_0(&x8, &y8),
                &t8,
            );
        }
    }
}

fn float_terms(x: impl Iterator<Item = f64>, y: &[f32]) -> Terms {
    let mut t = Terms::new();
    for (a, &b) in x.zip(y) {
        t.add(a * b as f64);
    }
    t
}

#[test]
fn float_dots_match_scalar_at_every_level() {
    let mut rng = StdRng::seed_from_u64(0x5134_0006);
    for &n in &FLOAT_LENGTHS {
        let x: Vec<f32> = (0..n).map(|_| rng.gen_range(-2.0..2.0)).collect();
        let y: Vec<f32> = (0..n).map(|_| rng.gen_range(-2.0..2.0)).collect();
        let xh: Vec<f16> = x.iter().map(|&v| f16::from_f32(v)).collect();
        let xb: Vec<bf16> = x.iter().map(|&v| bf16::from_f32(v)).collect();
        let t32 = float_terms(x.iter().map(|&v| v as f64), &y);
        let t16 = float_terms(xh.iter().map(|v| v.to_f64()), &y);
        let tb16 = float_terms(xb.iter().map(|v| v.to_f64()), &y);
        let (r32, r16, rb16) = (
            vec_dot_f32(&x, &y),
            vec_dot_f16_f32(&xh, &y),
            vec_dot_bf16_f32(&xb, &y),
        );
        for k in levels() {
            check("f32 x f32", k.isa, n, (k.dot_f32)(&x, &y), r32, &t32);
            check("f16 x f32", k.isa, n, (k.dot_f16_f32)(&xh, &y), r16, &t16);
            check(
                "bf16 x f32",
                k.isa,
                n,
                (k.dot_bf16_f32)(&xb, &y),
                rb16,
                &tb16,
            );
        }
    }
}

#[test]
fn mismatched_lengths_panic_at_every_level() {
    let mut rng = StdRng::seed_from_u64(0x5134_0007);
    let (x, y) = (random_q4_k(&mut rng, 3), random_q8_k(&mut rng, 2));
    let xf = vec![1.0f32; 17];
    for k in levels() {
        assert!(
            std::panic::catch_unwind(|| (k.dot_q4_k_q8_k)(&x, &y)).is_err(),
            "{}",
            k.isa
        );
        assert!(
            std::panic::catch_unwind(|| (k.dot_f32)(&xf, &xf[1..])).is_err(),
            "{}",
            k.isa
        );
    }
}

#[test]
fn detect_picks_an_available_level() {
    let best = Kernels::detect();
    let names: Vec<_> = Kernels::all_available().iter().map(|k| k.isa).collect();
    assert!(names.contains(&best.isa), "{} not in {names:?}", best.isa);
    if std::env::var_os("MUSER_ISA").is_none() {
        assert_eq!(best.isa, *names.last().unwrap());
    }
}

/// The AVX-512 K-quant dots follow the scalar reference's order (exact integers per block, then
/// one f32 expression per block in block order), so their bits are the reference's: the CPU's
/// multi-column and tiled kernels, which give the one-column kernel's bits, then give them too.
#[test]
fn avx512_k_quant_dots_are_bit_identical_to_scalar() {
    let Some(k) = levels().into_iter().find(|k| k.isa == "avx512") else {
        return; // no AVX-512 VNNI here
    };
    let mut rng = StdRng::seed_from_u64(0x5134_0009);
    for &n in &K_LENGTHS {
        let nb = n / QK_K;
        let y = random_q8_k(&mut rng, nb);
        let (x4, x5, x6) = (
            random_q4_k(&mut rng, nb),
            random_q5_k(&mut rng, nb),
            random_q6_k(&mut rng, nb),
        );
        let pairs = [
            (
                "q4_k",
                (k.dot_q4_k_q8_k)(&x4, &y),
                vec_dot_q4_k_q8_k(&x4, &y),
            ),
            (
                "q5_k",
                (k.dot_q5_k_q8_k)(&x5, &y),
                vec_dot_q5_k_q8_k(&x5, &y),
            ),
            (
                "q6_k",
                (k.dot_q6_k_q8_k)(&x6, &y),
                vec_dot_q6_k_q8_k(&x6, &y),
            ),
        ];
        for (what, got, want) in pairs {
            assert_eq!(
                got.to_bits(),
                want.to_bits(),
                "{what} n={n}: {got} vs {want}"
            );
        }
    }
}

/// Every level's Q8_0 dot follows the scalar reference's order (per block the exact integer dot,
/// then `sum += float(dot) * (d_x * d_y)`, blocks in order), so its bits are the reference's:
/// random blocks at lengths that do and do not fill the 8-block steps, and blocks at the limits
/// (quants only -128, -127, 127, 0, -1, 1; scales from 6e-8, the smallest f16, to 65504) where
/// a wrong sign trick, a lost integer or an fma instead of two roundings would show.
#[test]
fn q8_0_dots_are_bit_identical_to_scalar_at_every_level() {
    let mut rng = StdRng::seed_from_u64(0x5134_000a);
    let limits = [-128i8, -127, 127, 0, -1, 1];
    let scales = [6e-8f32, 1e-5, 0.37, 1.0, 3.3, 700.0, 65504.0];
    for round in 0..40 {
        let nb = [1, 7, 8, 9, 15, 16, 17, 64, 131, 209][round % 10];
        let (mut x, mut y) = (random_q8_0(&mut rng, nb), random_q8_0(&mut rng, nb));
        if round >= 10 {
            for b in x.iter_mut().chain(&mut y) {
                if round % 2 == 0 {
                    b.qs = std::array::from_fn(|_| limits[rng.gen_range(0..limits.len())]);
                }
                if round >= 20 {
                    let s = scales[rng.gen_range(0..scales.len())];
                    b.d = f16::from_f32(if rng.gen() { s } else { -s });
                }
            }
        }
        let want = vec_dot_q8_0_q8_0(&x, &y);
        for k in levels() {
            let got = (k.dot_q8_0_q8_0)(&x, &y);
            assert_eq!(
                got.to_bits(),
                want.to_bits(),
                "[{}] round {round}, {nb} blocks: {got} vs {want}",
                k.isa
            );
        }
    }
}

/// Each column of a level's multi-column K-quant dots (`Kernels::cols`: 2, 4 and 8 columns) has
/// the bits of that level's one-column dot on the same column, whatever its place among the
/// others (decode groups are batch-invariant on the CPU through this), and mismatched columns
/// panic.
#[test]
fn multi_column_k_quant_dots_give_each_column_the_one_column_bits() {
    let mut rng = StdRng::seed_from_u64(0x5134_000c);
    let with_cols: Vec<Kernels> = levels().into_iter().filter(|k| k.cols.is_some()).collect();
    if with_cols.is_empty() {
        eprintln!("no level with multi-column dots on this CPU: nothing to check");
        return;
    }
    fn check_cols<W, const C: usize>(
        what: &str,
        dot: fn(&[W], &[BlockQ8K]) -> f32,
        cols: muser_quant::simd::DotCols<W, C>,
        x: &[W],
        ys: &[Vec<BlockQ8K>],
    ) {
        let got = cols(x, std::array::from_fn(|c| ys[c].as_slice()));
        for (c, g) in got.iter().enumerate() {
            let want = dot(x, &ys[c]);
            assert_eq!(
                g.to_bits(),
                want.to_bits(),
                "{what} x{C} column {c}: {g} vs {want}"
            );
        }
    }
    for k in with_cols {
        let kc = k.cols.unwrap();
        for &n in &[256usize, 768, 6656, 19968] {
            let nb = n / QK_K;
            let ys: Vec<Vec<BlockQ8K>> = (0..8).map(|_| random_q8_k(&mut rng, nb)).collect();
            let (x4, x5, x6) = (
                random_q4_k(&mut rng, nb),
                random_q5_k(&mut rng, nb),
                random_q6_k(&mut rng, nb),
            );
            // The columns in another order too (each column's bits must not depend on its place).
            let rev: Vec<Vec<BlockQ8K>> = ys.iter().rev().cloned().collect();
            for y in [&ys, &rev] {
                check_cols(k.isa, k.dot_q4_k_q8_k, kc.q4_k2, &x4, y);
                check_cols(k.isa, k.dot_q4_k_q8_k, kc.q4_k4, &x4, y);
                check_cols(k.isa, k.dot_q4_k_q8_k, kc.q4_k8, &x4, y);
                check_cols(k.isa, k.dot_q5_k_q8_k, kc.q5_k2, &x5, y);
                check_cols(k.isa, k.dot_q5_k_q8_k, kc.q5_k4, &x5, y);
                check_cols(k.isa, k.dot_q5_k_q8_k, kc.q5_k8, &x5, y);
                check_cols(k.isa, k.dot_q6_k_q8_k, kc.q6_k2, &x6, y);
                check_cols(k.isa, k.dot_q6_k_q8_k, kc.q6_k4, &x6, y);
                check_cols(k.isa, k.dot_q6_k_q8_k, kc.q6_k8, &x6, y);
            }
        }
        let (x, short) = (random_q4_k(&mut rng, 3), random_q8_k(&mut rng, 2));
        let long = random_q8_k(&mut rng, 3);
        assert!(
            std::panic::catch_unwind(|| (kc.q4_k2)(&x, [&long, &short])).is_err(),
            "{}: a short column must panic",
            k.isa
        );
    }
}
