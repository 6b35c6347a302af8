//! One draw from a row of 202,048 logits (Muse Glimmer's vocabulary), as the server makes one per
//! sequence per decode step: `Sampler::sample` (one pass over the logits for greedy and top-k)
//! against the same chain with a candidate for every token (what it did before; the same pick).
use criterion::{black_box, criterion_group, criterion_main, Criterion};
use muser_sample::{
    apply_penalties, candidates_from_logits, dist, min_p, temperature, top_k, top_p, Sampler,
    SamplerParams,
};
use rand_mt::Mt;

const VOCAB: usize = 202_048;

fn logits() -> Vec<f32> {
    let mut rng = Mt::new(7);
    (0..VOCAB)
        .map(|_| (rng.next_u32() as f32 / u32::MAX as f32) * 20.0 - 10.0)
        .collect()
}

/// The whole chain, a candidate per token.
fn every_candidate(p: &SamplerParams, logits: &[f32], rng: &mut Mt) -> Option<u32> {
    let mut c = candidates_from_logits(logits);
    apply_penalties(
        &mut c,
        &[],
        p.repeat_penalty,
        p.frequency_penalty,
        p.presence_penalty,
    );
    if p.temperature <= 0.0 {
        // The first maximum, candidate by candidate.
        let mut best: Option<usize> = None;
        for (i, x) in c.iter().enumerate() {
            if best.is_none_or(|b| c[b].logit < x.logit) {
                best = Some(i);
            }
        }
        return best.map(|i| c[i].id);
    }
    top_k(&mut c, p.top_k);
    top_p(&mut c, p.top_p, 1);
    min_p(&mut c, p.min_p, 1);
    temperature(&mut c, p.temperature);
    dist(&mut c, rng).map(|i| c[i].id)
}

fn bench(c: &mut Criterion) {
    let l = logits();
    for (name, p) in [
        ("top_k 40 (defaults)", SamplerParams::default()),
        ("greedy", SamplerParams::greedy()),
    ] {
        let mut s = Sampler::new(p.clone());
        c.bench_function(&format!("sample {name}, one pass"), |b| {
            b.iter(|| s.sample(black_box(&l)))
        });
        let mut rng = Mt::new(p.seed as u32);
        c.bench_function(&format!("sample {name}, every candidate"), |b| {
            b.iter(|| every_candidate(&p, black_box(&l), &mut rng))
        });
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
