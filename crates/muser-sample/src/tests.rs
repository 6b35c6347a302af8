use super::*;

/// Random logits: sums of uniforms, roughly normal with spread `scale`, never all equal.
fn random_logits(rng: &mut Mt, n: usize, scale: f32) -> Vec<f32> {
    (0..n)
        .map(|_| {
            let s: f64 = (0..4).map(|_| uniform_f64(rng)).sum::<f64>() - 2.0;
            (s as f32) * scale
        })
        .collect()
}

/// Softmax in f64 over (id, logit) pairs.
fn softmax_f64(logits: &[f32]) -> Vec<f64> {
    let max = logits.iter().cloned().fold(f32::NEG_INFINITY, f32::max) as f64;
    let e: Vec<f64> = logits.iter().map(|&l| (l as f64 - max).exp()).collect();
    let s: f64 = e.iter().sum();
    e.iter().map(|x| x / s).collect()
}

fn ids(c: &[Candidate]) -> Vec<u32> {
    c.iter().map(|c| c.id).collect()
}

/// Ids sorted by logit descending, then id ascending.
fn ranked_ids(logits: &[f32]) -> Vec<u32> {
    let mut v: Vec<u32> = (0..logits.len() as u32).collect();
    v.sort_by(|&a, &b| {
        logits[b as usize]
            .partial_cmp(&logits[a as usize])
            .unwrap()
            .then(a.cmp(&b))
    });
    v
}

#[test]
fn mt19937_matches_std_mt19937() {
    // The C++ standard fixes these: std::mt19937 default-seeded (5489) yields 3499211612
    // first and 4123659995 as its 10000th output.
    let mut rng = Mt::new(5489);
    assert_eq!(rng.next_u32(), 3499211612);
    let mut rng = Mt::new(5489);
    let mut x = 0;
    for _ in 0..10000 {
        x = rng.next_u32();
    }
    assert_eq!(x, 4123659995);
}

#[test]
fn uniform_is_in_unit_interval_and_spread() {
    let mut rng = Mt::new(7);
    let n = 100_000;
    let mut sum = 0.0;
    let mut below_tenth = 0;
    for _ in 0..n {
        let u = uniform_f64(&mut rng);
        assert!((0.0..1.0).contains(&u));
        sum += u;
        if u < 0.1 {
            below_tenth += 1;
        }
    }
    assert!((sum / n as f64 - 0.5).abs() < 0.005);
    assert!((below_tenth as f64 / n as f64 - 0.1).abs() < 0.005);
}

#[test]
fn greedy_is_argmax_lowest_id_on_ties() {
    let mut rng = Mt::new(1);
    for n in [1usize, 2, 17, 1000] {
        let l = random_logits(&mut rng, n, 3.0);
        assert_eq!(greedy(&l), Some(ranked_ids(&l)[0]));
    }
    assert_eq!(greedy(&[1.0, 3.0, 2.0, 3.0]), Some(1));
    assert_eq!(greedy(&[f32::NAN, 1.0, f32::NAN, 2.0]), Some(3));
    assert_eq!(greedy(&[f32::NAN, f32::NAN]), None);
    assert_eq!(greedy(&[]), None);
}

#[test]
fn temperature_zero_sampler_is_argmax() {
    let mut rng = Mt::new(2);
    let mut s = Sampler::new(SamplerParams {
        seed: 99,
        ..SamplerParams::greedy()
    });
    for _ in 0..50 {
        let l = random_logits(&mut rng, 300, 2.0);
        assert_eq!(s.sample(&l), greedy(&l).unwrap());
    }
    assert_eq!(s.sample(&[0.5, 2.0, 2.0, -1.0]), 1);
}

#[test]
fn is_argmax_exactly_when_the_pick_is_the_raw_first_maximum() {
    let mut rng = Mt::new(3);
    let greedy_params = SamplerParams::greedy();
    assert!(Sampler::new(greedy_params.clone()).is_argmax());
    // Any penalty, or a temperature, can move the pick off the raw maximum.
    let others = [
        SamplerParams {
            repeat_penalty: 1.3,
            ..greedy_params.clone()
        },
        SamplerParams {
            presence_penalty: 0.5,
            ..greedy_params.clone()
        },
        SamplerParams {
            frequency_penalty: 0.5,
            ..greedy_params.clone()
        },
        SamplerParams::default(),
    ];
    for p in others {
        assert!(!Sampler::new(p).is_argmax());
    }
    // Penalties with an empty window change nothing: still the raw maximum.
    let mut s = Sampler::new(SamplerParams {
        repeat_penalty: 1.3,
        repeat_last_n: 0,
        ..greedy_params
    });
    assert!(s.is_argmax());
    for _ in 0..50 {
        let l = random_logits(&mut rng, 500, 2.0);
        let pick = s.sample(&l);
        s.accept(pick);
        assert_eq!(pick, greedy(&l).unwrap());
    }
}

#[test]
fn top_k_keeps_exactly_the_k_largest_sorted() {
    let mut rng = Mt::new(3);
    for (n, k) in [(100usize, 1usize), (100, 7), (1000, 40), (50, 50), (10, 40)] {
        let l = random_logits(&mut rng, n, 2.0);
        let mut c = candidates_from_logits(&l);
        top_k(&mut c, k);
        let want: Vec<u32> = ranked_ids(&l).into_iter().take(k.min(n)).collect();
        assert_eq!(ids(&c), want, "n={n} k={k}");
    }
    // k = 0 is off.
    let l = random_logits(&mut rng, 20, 2.0);
    let mut c = candidates_from_logits(&l);
    top_k(&mut c, 0);
    assert_eq!(ids(&c), (0..20).collect::<Vec<u32>>());
}

#[test]
fn top_p_keeps_smallest_prefix_reaching_p() {
    let mut rng = Mt::new(4);
    for (n, p) in [
        (200usize, 0.5f32),
        (200, 0.9),
        (1000, 0.95),
        (30, 0.1),
        (64, 0.999),
    ] {
        let l = random_logits(&mut rng, n, 3.0);
        let mut c = candidates_from_logits(&l);
        top_p(&mut c, p, 1);
        let probs = softmax_f64(&l);
        let kept = ids(&c);
        let want_order = ranked_ids(&l);
        assert_eq!(
            kept[..],
            want_order[..kept.len()],
            "kept set is the best-ranked prefix"
        );
        let mass: f64 = kept.iter().map(|&i| probs[i as usize]).sum();
        let mass_without_last = mass - probs[*kept.last().unwrap() as usize];
        assert!(mass >= p as f64 - 1e-6, "mass {mass} < p {p}");
        assert!(mass_without_last < p as f64 + 1e-6, "prefix not minimal");
        // probabilities within the list were computed
        let psum: f32 = c.iter().map(|c| c.p).sum();
        assert!(psum > 0.0 && psum <= 1.0 + 1e-5);
    }
    // p >= 1 is off.
    let l = random_logits(&mut rng, 20, 2.0);
    let mut c = candidates_from_logits(&l);
    top_p(&mut c, 1.0, 1);
    assert_eq!(c.len(), 20);
    // min_keep wins over p.
    let mut c = candidates_from_logits(&l);
    top_p(&mut c, 1e-6, 5);
    assert_eq!(c.len(), 5);
}

#[test]
fn min_p_keeps_tokens_within_ratio_of_best() {
    let mut rng = Mt::new(5);
    for (n, p) in [(300usize, 0.05f32), (300, 0.3), (50, 0.9)] {
        let l = random_logits(&mut rng, n, 3.0);
        let mut c = candidates_from_logits(&l);
        min_p(&mut c, p, 1);
        let probs = softmax_f64(&l);
        let pmax = probs.iter().cloned().fold(0.0, f64::max);
        let want: Vec<u32> = (0..n as u32)
            .filter(|&i| probs[i as usize] >= p as f64 * pmax)
            .collect();
        assert_eq!(ids(&c), want, "order preserved, ratio rule");
        assert!(!c.is_empty() && c.len() < n);
    }
    let l = random_logits(&mut rng, 20, 2.0);
    let mut c = candidates_from_logits(&l);
    min_p(&mut c, 0.0, 1);
    assert_eq!(c.len(), 20);
    // min_keep wins over p: the best-ranked min_keep survive, sorted
    let mut c = candidates_from_logits(&l);
    min_p(&mut c, 0.999, 6);
    assert_eq!(ids(&c), ranked_ids(&l)[..6].to_vec());
}

#[test]
fn temperature_scales_logits_and_zero_keeps_one() {
    let mut rng = Mt::new(6);
    let l = random_logits(&mut rng, 100, 2.0);
    let mut c = candidates_from_logits(&l);
    temperature(&mut c, 0.5);
    for (c, &x) in c.iter().zip(&l) {
        assert_eq!(c.logit, x / 0.5);
    }
    let mut c = candidates_from_logits(&l);
    temperature(&mut c, 0.0);
    let finite: Vec<u32> = c
        .iter()
        .filter(|c| c.logit.is_finite())
        .map(|c| c.id)
        .collect();
    assert_eq!(finite, vec![greedy(&l).unwrap()]);
}

#[test]
fn penalties_divide_positive_multiply_negative() {
    let l = vec![2.0f32, -1.0, 0.5, 3.0, -2.0];
    let mut c = candidates_from_logits(&l);
    apply_penalties(&mut c, &[0, 1, 1, 4], 2.0, 0.0, 0.0);
    let got: Vec<f32> = c.iter().map(|c| c.logit).collect();
    assert_eq!(got, vec![1.0, -2.0, 0.5, 3.0, -4.0]);

    let mut c = candidates_from_logits(&l);
    apply_penalties(&mut c, &[0, 1, 1, 4], 1.0, 0.25, 0.5);
    let got: Vec<f32> = c.iter().map(|c| c.logit).collect();
    assert_eq!(got, vec![2.0 - 0.75, -1.0 - 1.0, 0.5, 3.0, -2.0 - 0.75]);
}

#[test]
fn penalties_see_only_the_last_n_accepted_tokens() {
    let params = SamplerParams {
        repeat_penalty: 2.0,
        repeat_last_n: 2,
        ..SamplerParams::greedy()
    };
    let mut logits = vec![0.0f32; 8];
    logits[5] = 2.0;
    logits[1] = 1.9;
    logits[3] = 1.5;
    let mut s = Sampler::new(params.clone());
    for t in [5, 1, 2] {
        s.accept(t);
    }
    // 5 has left the window of 2: it is not penalised and wins.
    assert_eq!(s.sample(&logits), 5);
    let mut s = Sampler::new(params);
    for t in [1, 5] {
        s.accept(t);
    }
    // 5 -> 1.0 and 1 -> 0.95: token 3 wins.
    assert_eq!(s.sample(&logits), 3);
}

fn draw_sequence(params: &SamplerParams, rows: &[Vec<f32>]) -> Vec<u32> {
    let mut s = Sampler::new(params.clone());
    rows.iter()
        .map(|l| {
            let t = s.sample(l);
            s.accept(t);
            t
        })
        .collect()
}

#[test]
fn same_seed_same_sequence_different_seeds_differ() {
    let mut rng = Mt::new(8);
    let rows: Vec<Vec<f32>> = (0..64).map(|_| random_logits(&mut rng, 500, 1.0)).collect();
    let p = |seed| SamplerParams {
        seed,
        temperature: 1.5,
        top_k: 0,
        ..Default::default()
    };
    let a = draw_sequence(&p(42), &rows);
    let b = draw_sequence(&p(42), &rows);
    let c = draw_sequence(&p(43), &rows);
    assert_eq!(a, b);
    assert_ne!(a, c);
    // and the draws are not all the argmax
    let greedy_seq: Vec<u32> = rows.iter().map(|l| greedy(l).unwrap()).collect();
    assert_ne!(a, greedy_seq);
}

#[test]
fn dist_frequencies_match_softmax() {
    let mut rng = Mt::new(9);
    let l = random_logits(&mut rng, 12, 1.5);
    let probs = softmax_f64(&l);
    let params = SamplerParams {
        temperature: 1.0,
        top_k: 0,
        top_p: 1.0,
        min_p: 0.0,
        seed: 1234,
        ..Default::default()
    };
    let mut s = Sampler::new(params);
    let n = 200_000;
    let mut counts = vec![0usize; l.len()];
    for _ in 0..n {
        counts[s.sample(&l) as usize] += 1;
    }
    for (i, &c) in counts.iter().enumerate() {
        let f = c as f64 / n as f64;
        let sigma = (probs[i] * (1.0 - probs[i]) / n as f64).sqrt();
        assert!(
            (f - probs[i]).abs() < 5.0 * sigma + 1e-4,
            "token {i}: {f} vs {}",
            probs[i]
        );
    }
}

#[test]
fn dist_with_temperature_matches_scaled_softmax() {
    let mut rng = Mt::new(10);
    let l = random_logits(&mut rng, 6, 1.0);
    let t = 0.5f32;
    let scaled: Vec<f32> = l.iter().map(|x| x / t).collect();
    let probs = softmax_f64(&scaled);
    let mut gen = Mt::new(11);
    let n = 100_000;
    let mut counts = vec![0usize; l.len()];
    for _ in 0..n {
        let mut c = candidates_from_logits(&l);
        temperature(&mut c, t);
        let i = dist(&mut c, &mut gen).unwrap();
        counts[c[i].id as usize] += 1;
        let psum: f32 = c.iter().map(|c| c.p).sum();
        assert!((psum - 1.0).abs() < 1e-5);
    }
    for (i, &c) in counts.iter().enumerate() {
        let f = c as f64 / n as f64;
        let sigma = (probs[i] * (1.0 - probs[i]) / n as f64).sqrt();
        assert!((f - probs[i]).abs() < 5.0 * sigma + 1e-4);
    }
}

#[test]
fn full_chain_only_draws_from_the_truncated_set() {
    let mut rng = Mt::new(12);
    let params = SamplerParams {
        top_k: 5,
        seed: 3,
        temperature: 2.0,
        ..Default::default()
    };
    let mut s = Sampler::new(params);
    for _ in 0..200 {
        let l = random_logits(&mut rng, 400, 1.0);
        let t = s.sample(&l);
        assert!(ranked_ids(&l)[..5].contains(&t));
    }
}

#[test]
fn nan_logits_never_chosen_and_never_panic() {
    let mut rng = Mt::new(13);
    let configs = [
        SamplerParams::default(),
        SamplerParams::greedy(),
        SamplerParams {
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            temperature: 1.0,
            ..Default::default()
        },
        SamplerParams {
            repeat_penalty: 1.3,
            frequency_penalty: 0.2,
            ..Default::default()
        },
    ];
    for params in configs {
        let mut s = Sampler::new(params);
        for _ in 0..100 {
            let mut l = random_logits(&mut rng, 64, 2.0);
            // poison the best few and some random ones
            for &i in &ranked_ids(&l)[..3] {
                l[i as usize] = f32::NAN;
            }
            l[(rng.next_u32() % 64) as usize] = f32::NAN;
            let t = s.sample(&l);
            assert!(!l[t as usize].is_nan());
            s.accept(t);
        }
        assert_eq!(s.try_sample(&[f32::NAN; 5]), None);
        assert_eq!(s.sample(&[f32::NAN; 5]), 0);
        assert_eq!(s.try_sample(&[]), None);
        assert_eq!(s.sample(&[]), 0);
    }
}

#[test]
fn infinities_are_handled() {
    let mut s = Sampler::new(SamplerParams {
        top_k: 0,
        top_p: 1.0,
        min_p: 0.0,
        ..Default::default()
    });
    let l = [0.0, f32::NEG_INFINITY, 1.0, f32::NEG_INFINITY];
    for _ in 0..200 {
        let t = s.sample(&l);
        assert!(t == 0 || t == 2);
    }
    for _ in 0..50 {
        assert_eq!(s.sample(&[0.0, f32::INFINITY, 5.0]), 1);
    }
    // all -inf (every token banned): no token can be picked, and no draw is made
    let mut a = Sampler::new(s.params().clone());
    let mut b = Sampler::new(s.params().clone());
    assert_eq!(a.try_sample(&[f32::NEG_INFINITY; 4]), None);
    assert_eq!(a.try_sample(&[f32::NEG_INFINITY, f32::NAN]), None);
    assert_eq!(a.sample(&[f32::NEG_INFINITY; 4]), 0);
    let spread = [0.0, 0.3, 0.1, 0.2, 0.25];
    let (pa, pb): (Vec<u32>, Vec<u32>) = (0..40)
        .map(|_| (a.sample(&spread), b.sample(&spread)))
        .unzip();
    assert_eq!(pa, pb);
    assert!(pa.iter().any(|&t| t != pa[0]));
}

#[test]
fn no_pick_when_every_token_is_banned_or_nan() {
    let row = [0.5f32, f32::NAN, 2.0, -1.0];
    let ban_all: Vec<(u32, f32)> = (0..4).map(|i| (i, f32::NEG_INFINITY)).collect();
    for (temperature, top_k) in [(0.0, 40), (0.8, 40), (0.8, 2), (0.8, 0), (1.0, 4)] {
        let base = SamplerParams {
            temperature,
            top_k,
            top_p: 1.0,
            min_p: 0.0,
            ..Default::default()
        };
        let mut banned = Sampler::new(SamplerParams {
            logit_bias: ban_all.clone(),
            ..base.clone()
        });
        assert_eq!(banned.try_sample(&row), None, "{base:?}");
        // Every token banned but one: that one, whatever the temperature.
        let mut one_left = Sampler::new(SamplerParams {
            logit_bias: ban_all[1..].to_vec(),
            ..base.clone()
        });
        for _ in 0..20 {
            assert_eq!(one_left.try_sample(&row), Some(0), "{base:?}");
        }
        let mut plain = Sampler::new(base.clone());
        assert_eq!(plain.try_sample(&[f32::NEG_INFINITY; 5]), None, "{base:?}");
        assert_eq!(plain.try_sample(&[f32::NAN; 5]), None, "{base:?}");
        // The backend's top-k of such a row holds only -inf candidates (NaN never).
        let top = top_k_logits(&[f32::NEG_INFINITY, f32::NAN, f32::NEG_INFINITY], 2);
        assert_eq!(top.len(), 2);
        assert_eq!(plain.try_sample_top_k(top), None, "{base:?}");
        assert_eq!(plain.try_sample_top_k(Vec::new()), None, "{base:?}");
    }
    assert_eq!(greedy(&[f32::NEG_INFINITY; 3]), None);
    assert_eq!(greedy(&[f32::NEG_INFINITY, f32::NAN, -3.0e38]), Some(2));
    assert_eq!(greedy(&[]), None);
}

#[test]
fn len_one_and_empty_inputs() {
    let mut s = Sampler::new(SamplerParams::default());
    for _ in 0..10 {
        assert_eq!(s.sample(&[-3.5]), 0);
    }
    let mut c: Vec<Candidate> = Vec::new();
    top_k(&mut c, 3);
    top_p(&mut c, 0.5, 1);
    min_p(&mut c, 0.1, 1);
    temperature(&mut c, 0.7);
    softmax(&mut c);
    assert_eq!(dist(&mut c, &mut Mt::new(1)), None);
    assert!(top_logprobs(&[], 5).is_empty());
}

#[test]
fn single_candidate_still_advances_the_generator() {
    // llama.cpp draws once per call even for one candidate; the sequence after it must match
    // a generator that drew once.
    let mut a = Mt::new(77);
    let mut c = candidates_from_logits(&[1.0]);
    assert_eq!(dist(&mut c, &mut a), Some(0));
    let mut b = Mt::new(77);
    uniform_f64(&mut b);
    assert_eq!(a.next_u32(), b.next_u32());
}

#[test]
fn top_logprobs_are_log_softmax_sorted() {
    let mut rng = Mt::new(14);
    let l = random_logits(&mut rng, 300, 3.0);
    let probs = softmax_f64(&l);
    let top = top_logprobs(&l, 10);
    assert_eq!(top.len(), 10);
    let want = ranked_ids(&l);
    for (k, &(id, lp)) in top.iter().enumerate() {
        assert_eq!(id, want[k]);
        assert!((lp as f64 - probs[id as usize].ln()).abs() < 1e-4);
        assert!(lp <= 0.0);
    }
    let all = top_logprobs(&l, 1000);
    assert_eq!(all.len(), 300);
    let total: f64 = all.iter().map(|&(_, lp)| (lp as f64).exp()).sum();
    assert!((total - 1.0).abs() < 1e-4);
    let mut with_nan = l.clone();
    with_nan[want[0] as usize] = f32::NAN;
    assert_eq!(top_logprobs(&with_nan, 1)[0].0, want[1]);
}

#[test]
fn sampling_from_the_top_k_candidates_picks_what_sample_picks() {
    // A backend hands over top_k_logits(row, k) instead of the row when top_k_of says so: the
    // same tokens from the same generator, step after step, for several parameter sets.
    let mut rng = Mt::new(5);
    for (i, &(t, k, tp, mp)) in [
        (0.8f32, 40usize, 0.95f32, 0.05f32),
        (1.0, 5, 1.0, 0.0),
        (1.7, 64, 0.5, 0.2),
        (0.3, 1, 0.9, 0.1),
    ]
    .iter()
    .enumerate()
    {
        let params = SamplerParams {
            temperature: t,
            top_k: k,
            top_p: tp,
            min_p: mp,
            seed: 100 + i as u64,
            ..Default::default()
        };
        let (mut a, mut b) = (Sampler::new(params.clone()), Sampler::new(params));
        assert_eq!(b.top_k_of(1000), Some(k));
        for step in 0..60 {
            let mut l = random_logits(&mut rng, 1000, 2.0 + step as f32 * 0.05);
            if step % 7 == 3 {
                l[10] = f32::NAN;
                l[20] = l[30]; // a tie
            }
            let want = a.sample(&l);
            let got = b.sample_top_k(top_k_logits(&l, k));
            assert_eq!(got, want, "set {i} step {step}");
            a.accept(want);
            b.accept(got);
        }
    }
    // Not for greedy, top-k off or past the vocabulary, or with a penalty in effect.
    let off = |f: &dyn Fn(&mut SamplerParams)| {
        let mut p = SamplerParams::default();
        f(&mut p);
        Sampler::new(p).top_k_of(1000)
    };
    assert_eq!(off(&|_| {}), Some(40));
    assert_eq!(off(&|p| p.temperature = 0.0), None);
    assert_eq!(off(&|p| p.top_k = 0), None);
    assert_eq!(off(&|p| p.top_k = 1000), None);
    assert_eq!(off(&|p| p.repeat_penalty = 1.1), None);
    assert_eq!(off(&|p| p.presence_penalty = 0.5), None);
    assert_eq!(
        off(&|p| {
            p.repeat_penalty = 1.1;
            p.repeat_last_n = 0
        }),
        Some(40)
    );
}

#[test]
fn a_tokens_logprob_is_its_entry_among_the_top() {
    let mut rng = Mt::new(31);
    let l = random_logits(&mut rng, 500, 2.5);
    let probs = softmax_f64(&l);
    let ranked = ranked_ids(&l);
    for &id in &[ranked[0], ranked[3], ranked[7], ranked[400]] {
        let (own, top) = token_logprobs(&l, Some(id), 8);
        assert_eq!(top, top_logprobs(&l, 8));
        assert!((own as f64 - probs[id as usize].ln()).abs() < 1e-4, "{id}");
        if let Some(&(_, lp)) = top.iter().find(|&&(t, _)| t == id) {
            assert_eq!(own.to_bits(), lp.to_bits(), "{id}");
        }
    }
    let mut with_nan = l.clone();
    with_nan[5] = f32::NAN;
    assert!(token_logprobs(&with_nan, Some(5), 2).0.is_nan());
    assert!(token_logprobs(&[f32::NAN; 3], Some(1), 2).1.is_empty());
}

/// The chain as every candidate goes through it (no one-pass paths): what `try_sample` must
/// pick, with the same generator.
fn reference_pick(p: &SamplerParams, history: &[u32], logits: &[f32], rng: &mut Mt) -> Option<u32> {
    let mut cands = candidates_from_logits(logits);
    p.penalize(&mut cands, history);
    // Nothing above -inf: nothing to pick (and no draw).
    if cands.iter().all(|c| c.logit == f32::NEG_INFINITY) {
        return None;
    }
    if p.temperature <= 0.0 {
        return steps::argmax_index(&cands).map(|i| cands[i].id);
    }
    top_k(&mut cands, p.top_k);
    top_p(&mut cands, p.top_p, 1);
    min_p(&mut cands, p.min_p, 1);
    temperature(&mut cands, p.temperature);
    dist(&mut cands, rng).map(|i| cands[i].id)
}

/// Logits with the cases the one-pass paths must rank as the chain does: ties (coarse values),
/// NaN, +-0.0, infinities.
fn awkward_logits(rng: &mut Mt, n: usize) -> Vec<f32> {
    (0..n)
        .map(|_| match rng.next_u32() % 50 {
            0 => f32::NAN,
            1 => 0.0,
            2 => -0.0,
            3 => f32::NEG_INFINITY,
            4 if rng.next_u32().is_multiple_of(20) => f32::INFINITY,
            _ => ((rng.next_u32() % 64) as f32 - 40.0) * 0.25,
        })
        .collect()
}

#[test]
fn one_pass_greedy_and_top_k_pick_what_the_whole_chain_picks() {
    let mut rng = Mt::new(2024);
    let mut picks = std::collections::HashSet::new();
    for case in 0..400 {
        let n = [1usize, 2, 7, 50, 333, 5000][case % 6];
        let logits = if case % 5 == 0 {
            random_logits(&mut rng, n, 3.0)
        } else {
            awkward_logits(&mut rng, n)
        };
        let k = [1usize, 2, 5, 40, n.saturating_sub(1).max(1), n, n + 3][case % 7];
        let p = SamplerParams {
            temperature: [0.0, 0.8, 1.5][case % 3],
            top_k: k,
            top_p: [1.0, 0.95, 0.5][(case / 3) % 3],
            min_p: [0.0, 0.05][(case / 9) % 2],
            repeat_penalty: [1.0, 1.3][(case / 2) % 2],
            repeat_last_n: 64,
            frequency_penalty: [0.0, 0.2][(case / 4) % 2],
            presence_penalty: [0.0, 0.5][(case / 8) % 2],
            seed: case as u64,
            logit_bias: Vec::new(),
        };
        let mut s = Sampler::new(p.clone());
        let mut reference = Mt::new(p.seed as u32);
        let mut history = Vec::new();
        for step in 0..4 {
            let want = reference_pick(&p, &history, &logits, &mut reference);
            let got = s.try_sample(&logits);
            assert_eq!(got, want, "case {case} step {step}: n {n} {p:?}");
            if let Some(t) = got {
                s.accept(t);
                history.push(t);
                picks.insert(t);
            }
        }
    }
    // The cases reach many different tokens (not one answer every time).
    assert!(picks.len() > 100, "{} distinct picks", picks.len());
}

#[test]
fn logit_bias_is_added_to_the_row_before_the_chain() {
    let mut rng = Mt::new(17);
    for (round, top_k) in [(0, 40usize), (1, 0), (2, 5), (3, 40)] {
        let l = random_logits(&mut rng, 400, 3.0);
        // A few biases of both signs, and one past the row (ignored).
        let ids: Vec<u32> = (0..6).map(|_| rng.next_u32() % 400).collect();
        let mut bias: Vec<(u32, f32)> = ids
            .iter()
            .enumerate()
            .map(|(i, &id)| (id, if i % 2 == 0 { 7.5 } else { -50.0 }))
            .collect();
        bias.push((400 + round, 100.0));
        let mut biased = l.clone();
        for &(id, b) in &bias {
            if let Some(x) = biased.get_mut(id as usize) {
                *x += b;
            }
        }
        for temperature in [0.0, 0.9] {
            let base = SamplerParams {
                temperature,
                top_k,
                seed: 5 + round as u64,
                ..Default::default()
            };
            let mut with = Sampler::new(SamplerParams {
                logit_bias: bias.clone(),
                ..base.clone()
            });
            let mut plain = Sampler::new(base);
            assert!(!with.is_argmax() && with.top_k_of(400).is_none());
            for _ in 0..8 {
                let (a, b) = (with.sample(&l), plain.sample(&biased));
                assert_eq!(a, b, "top_k {top_k}, temperature {temperature}");
                with.accept(a);
                plain.accept(b);
            }
        }
    }
    // A greedy pick banned by -100 falls to the next best; +100 makes a token the pick.
    let l = [0.5f32, 3.0, 2.0, -1.0];
    let pick = |bias: Vec<(u32, f32)>| {
        Sampler::new(SamplerParams {
            logit_bias: bias,
            ..SamplerParams::greedy()
        })
        .sample(&l)
    };
    assert_eq!(pick(vec![]), 1);
    assert_eq!(pick(vec![(1, -100.0)]), 2);
    assert_eq!(pick(vec![(3, 100.0)]), 3);
}
