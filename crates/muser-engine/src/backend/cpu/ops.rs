//! Row-level elementwise ops of the CPU backend: short, scalar and obviously right (they are a
//! small share of the time; the matmuls and attention are elsewhere).

use crate::config::{RopeParams, RopeStyle};

/// out = x / sqrt(mean(x^2) + eps) * w (w None: ones). Sums in f64 so long rows stay exact.
pub fn rmsnorm_row(x: &[f32], w: Option<&[f32]>, eps: f32, out: &mut [f32]) {
    let ss: f64 = x.iter().map(|&v| (v as f64) * (v as f64)).sum();
    let inv = (1.0 / (ss / x.len() as f64 + eps as f64).sqrt()) as f32;
    match w {
        Some(w) => out
            .iter_mut()
            .zip(x)
            .zip(w)
            .for_each(|((o, &v), &g)| *o = v * inv * g),
        None => out.iter_mut().zip(x).for_each(|(o, &v)| *o = v * inv),
    }
}

/// x * sigmoid(x).
pub fn silu(x: f32) -> f32 {
    x / (1.0 + (-x).exp())
}

pub fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

/// (cos, sin) of theta_i = pos * base^(-2i/n_rot), i in 0..n_rot/2, computed in f64.
pub fn rope_angles(pos: usize, rope: &RopeParams, cs: &mut Vec<(f32, f32)>) {
    cs.clear();
    let half = rope.n_rot / 2;
    for i in 0..half {
        let theta = pos as f64 * (rope.freq_base as f64).powf(-2.0 * i as f64 / rope.n_rot as f64);
        cs.push((theta.cos() as f32, theta.sin() as f32));
    }
}

/// Rotates one head in place with precomputed angles.
pub fn rope_head(x: &mut [f32], cs: &[(f32, f32)], style: RopeStyle) {
    let half = cs.len();
    for (i, &(c, s)) in cs.iter().enumerate() {
        let (a, b) = match style {
            RopeStyle::Interleaved => (2 * i, 2 * i + 1),
            RopeStyle::Neox => (i, i + half),
        };
        let (x0, x1) = (x[a], x[b]);
        x[a] = x0 * c - x1 * s;
        x[b] = x0 * s + x1 * c;
    }
}

/// c * tanh(x * scale / c), or x * scale without a cap.
pub fn scale_softcap(x: &mut [f32], scale: f32, softcap: Option<f32>) {
    match softcap {
        Some(c) => x.iter_mut().for_each(|v| *v = c * (*v * scale / c).tanh()),
        None if scale != 1.0 => x.iter_mut().for_each(|v| *v *= scale),
        None => {}
    }
}
