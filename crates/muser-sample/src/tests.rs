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
fn top_p_sums_the_probabilities_in_the_order_it_finds_the_list() {
    // llama.cpp's top-p takes its softmax before it sorts (`llama_sampler_softmax_impl(cur_p,
    // false)`), so on a list that is not sorted (the id order of a row without top-k, or
    // typical-p's order) the f32 sum, and every p, are those of that order; sorted first, they
    // can differ in the last bit and move the cut.
    let mut rng = Mt::new(41);
    let mut differing = 0;
    for _ in 0..50 {
        let l = random_logits(&mut rng, 1500, 1.3);
        let max = l.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let e: Vec<f32> = l.iter().map(|&x| (x - max).exp()).collect();
        let sum_in_order = e.iter().fold(0.0f32, |s, &x| s + x);
        let mut sorted = e.clone();
        sorted.sort_by(|a, b| b.total_cmp(a));
        let sum_sorted = sorted.iter().fold(0.0f32, |s, &x| s + x);
        differing += usize::from(sum_in_order != sum_sorted);
        let mut c = candidates_from_logits(&l);
        top_p(&mut c, 0.6, 1);
        for k in &c {
            assert_eq!(k.p, e[k.id as usize] / sum_in_order);
        }
    }
    assert!(differing > 0, "no row where the two orders' sums differ");
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
    draw_sequence_with(&mut Sampler::new(params.clone()), rows)
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
            ..Default::default()
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

/// Shannon entropy (nats) of a probability vector.
fn entropy_f64(probs: &[f64]) -> f64 {
    -probs
        .iter()
        .filter(|&&q| q > 0.0)
        .map(|&q| q * q.ln())
        .sum::<f64>()
}

#[test]
fn typical_keeps_the_tokens_closest_to_the_entropy_until_the_mass_exceeds_p() {
    let mut rng = Mt::new(40);
    for (n, p, min_keep) in [
        (300usize, 0.5f32, 0usize),
        (300, 0.9, 0),
        (50, 0.2, 0),
        (1000, 0.95, 0),
        (40, 0.05, 7),
    ] {
        let l = random_logits(&mut rng, n, 2.0);
        let probs = softmax_f64(&l);
        let h = entropy_f64(&probs);
        let distance = |i: u32| (-probs[i as usize].ln() - h).abs();
        let mut c = candidates_from_logits(&l);
        typical(&mut c, p, min_keep);
        let kept = ids(&c);
        // Closest to the entropy first...
        for w in kept.windows(2) {
            assert!(distance(w[0]) <= distance(w[1]) + 1e-5, "n={n} p={p}");
        }
        // ...and exactly the closest: no token left out is closer than the farthest kept.
        let farthest = kept.iter().map(|&i| distance(i)).fold(0.0, f64::max);
        for i in (0..n as u32).filter(|i| !kept.contains(i)) {
            assert!(distance(i) >= farthest - 1e-5, "n={n} p={p}: {i} left out");
        }
        // The shortest such run whose mass exceeds p, unless min_keep asks for more.
        let mass: f64 = kept.iter().map(|&i| probs[i as usize]).sum();
        let last = probs[*kept.last().unwrap() as usize];
        assert!(mass > p as f64 - 1e-5, "n={n} p={p}: mass {mass}");
        assert!(kept.len() >= min_keep);
        assert!(
            kept.len() == min_keep || mass - last <= p as f64 + 1e-5,
            "n={n} p={p}: not the shortest run"
        );
        assert!(kept.len() < n);
    }
    // A token of zero probability (banned, or masked by top-n-sigma) adds nothing to the entropy
    // and ranks last, where llama.cpp's sum turns NaN (0 * ln 0) and its sort of NaN distances
    // leaves an arbitrary order.
    let l = random_logits(&mut rng, 30, 2.0);
    let mut banned = l.clone();
    banned[ranked_ids(&l)[0] as usize] = f32::NEG_INFINITY;
    let mut with = candidates_from_logits(&banned);
    let mut without: Vec<Candidate> = candidates_from_logits(&banned)
        .into_iter()
        .filter(|c| c.logit.is_finite())
        .collect();
    typical(&mut with, 0.999_999, 0);
    typical(&mut without, 0.999_999, 0);
    assert_eq!(ids(&with[..without.len()]), ids(&without));
    assert!(with.iter().all(|c| c.p.is_finite()));
    // p >= 1 is off: the list as it was, order included.
    for p in [1.0, 1.5] {
        let mut c = candidates_from_logits(&l);
        typical(&mut c, p, 0);
        assert_eq!(c, candidates_from_logits(&l));
    }
}

#[test]
fn top_n_sigma_keeps_exactly_the_logits_within_n_std_of_the_max() {
    let mut rng = Mt::new(41);
    for (n, sigma) in [(300usize, 1.0f32), (300, 2.0), (1000, 0.5), (50, 3.0)] {
        let mut l = random_logits(&mut rng, n, 2.0);
        // A banned token: masked already, and left out of the mean and the deviation.
        l[3] = f32::NEG_INFINITY;
        let finite: Vec<f64> = l
            .iter()
            .filter(|x| x.is_finite())
            .map(|&x| x as f64)
            .collect();
        let mean = finite.iter().sum::<f64>() / finite.len() as f64;
        let std =
            (finite.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / finite.len() as f64).sqrt();
        let max = finite.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let floor = max - sigma as f64 * std;
        let mut c = candidates_from_logits(&l);
        top_n_sigma(&mut c, sigma);
        // Every candidate stays, in order; those below the floor are -inf, the rest untouched.
        assert_eq!(ids(&c), (0..n as u32).collect::<Vec<u32>>());
        let mut survivors = 0;
        for (c, &x) in c.iter().zip(&l) {
            if (x as f64 - floor).abs() < 1e-4 {
                continue; // too close to the floor to call in f32
            }
            if x as f64 >= floor {
                assert_eq!(c.logit, x, "n={n} sigma={sigma}");
                survivors += 1;
            } else {
                assert_eq!(c.logit, f32::NEG_INFINITY, "n={n} sigma={sigma}");
            }
        }
        assert!(survivors >= 1 && survivors < n - 1, "n={n} sigma={sigma}");
    }
    // n <= 0 is off, and a list of one is left alone.
    let l = random_logits(&mut rng, 30, 2.0);
    for sigma in [0.0, -1.0] {
        let mut c = candidates_from_logits(&l);
        top_n_sigma(&mut c, sigma);
        assert_eq!(c, candidates_from_logits(&l));
    }
    let mut one = candidates_from_logits(&[-7.0]);
    top_n_sigma(&mut one, 0.1);
    assert_eq!(one[0].logit, -7.0);
}

#[test]
fn xtc_removes_every_top_choice_but_the_least_likely() {
    let mut rng = Mt::new(42);
    let mut gen = Mt::new(1);
    let (mut removed, mut kept_all) = (0, 0);
    for case in 0..90 {
        let n = [5usize, 20, 100][case % 3];
        let t = [0.05f32, 0.1, 0.2, 0.3][case % 4];
        let l = random_logits(&mut rng, n, [1.0, 2.0, 4.0][(case / 3) % 3]);
        let probs = softmax_f64(&l);
        if probs.iter().any(|&q| (q - t as f64).abs() < 1e-6) {
            continue; // too close to the threshold to call in f32
        }
        let ranked = ranked_ids(&l);
        let above = ranked
            .iter()
            .take_while(|&&i| probs[i as usize] >= t as f64)
            .count();
        let mut c = candidates_from_logits(&l);
        xtc(&mut c, 1.0, t, 0, &mut gen);
        if above >= 2 {
            // Sorted, the likelier top choices gone, the least likely of them first.
            assert_eq!(ids(&c), ranked[above - 1..].to_vec(), "case {case}");
            removed += 1;
        } else {
            // Fewer than two above the threshold: nothing removed (the list sorted).
            assert_eq!(ids(&c), ranked, "case {case}");
            kept_all += 1;
        }
    }
    assert!(removed > 10 && kept_all > 10, "{removed} {kept_all}");
    // min_keep: no removal when fewer than min_keep candidates would remain.
    let l = [5.0f32, 4.9, 4.8, 0.0, -1.0];
    let mut c = candidates_from_logits(&l);
    xtc(&mut c, 1.0, 0.1, 3, &mut gen);
    assert_eq!(ids(&c), vec![2, 3, 4]);
    let mut c = candidates_from_logits(&l);
    xtc(&mut c, 1.0, 0.1, 4, &mut gen);
    assert_eq!(ids(&c), vec![0, 1, 2, 3, 4]);
    // Off (probability <= 0, threshold > 0.5) and a list of one: no change and no draw.
    let before = gen.clone();
    for (prob, t, row) in [
        (0.0f32, 0.1f32, &l[..]),
        (1.0, 0.6, &l[..]),
        (1.0, 0.1, &l[..1]),
    ] {
        let mut c = candidates_from_logits(row);
        xtc(&mut c, prob, t, 0, &mut gen);
        assert_eq!(c, candidates_from_logits(row));
    }
    assert_eq!(gen.next_u32(), before.clone().next_u32());
}

#[test]
fn xtc_draws_one_f32_from_its_own_generator_whenever_two_candidates_remain() {
    // By hand: two generators seeded alike, as llama.cpp's xtc and dist samplers. XTC's chance is
    // one 32-bit output / 2^32 (in f32) for every list of two or more, and the step applies when
    // it is at most the probability; dist draws its two outputs from the other generator.
    let mut rng = Mt::new(43);
    let (prob, t, seed) = (0.4f32, 0.05f32, 77u64);
    let mut s = Sampler::new(SamplerParams {
        temperature: 1.0,
        top_k: 0,
        top_p: 1.0,
        min_p: 0.0,
        xtc_probability: prob,
        xtc_threshold: t,
        seed,
        ..Default::default()
    });
    let (mut xtc_gen, mut dist_gen) = (Mt::new(seed as u32), Mt::new(seed as u32));
    let (mut applied, mut removed) = (0, 0);
    for step in 0..300 {
        // Every tenth row has one token: no XTC draw, but still dist's.
        let l = random_logits(&mut rng, if step % 10 == 9 { 1 } else { 30 }, 3.0);
        let mut c = candidates_from_logits(&l);
        if l.len() >= 2 && (xtc_gen.next_u32() as f32 / 4294967296.0) <= prob {
            let probs = softmax_f64(&l);
            let ranked = ranked_ids(&l);
            let above = ranked
                .iter()
                .take_while(|&&i| probs[i as usize] >= t as f64)
                .count();
            let drop = if above >= 2 { above - 1 } else { 0 };
            c = ranked[drop..]
                .iter()
                .map(|&i| Candidate {
                    id: i,
                    logit: l[i as usize],
                    p: 0.0,
                })
                .collect();
            applied += 1;
            removed += (drop > 0) as usize;
        }
        let i = dist(&mut c, &mut dist_gen).unwrap();
        assert_eq!(s.sample(&l), c[i].id, "step {step}");
    }
    assert!(
        applied > 70 && applied < 150 && removed > 30,
        "{applied} {removed}"
    );
}

#[test]
fn dynamic_temperature_follows_the_entropy_within_the_range() {
    let mut rng = Mt::new(44);
    for (t, r, e) in [
        (0.8f32, 0.5f32, 1.0f32),
        (1.0, 1.5, 2.0),
        (0.0, 1.0, 0.5),
        (1.2, 0.3, 1.0),
    ] {
        for scale in [0.1f32, 1.0, 4.0] {
            let n = 200;
            let l = random_logits(&mut rng, n, scale);
            let normalized = entropy_f64(&softmax_f64(&l)) / (n as f64).ln();
            let (lo, hi) = ((t - r).max(0.0) as f64, (t + r) as f64);
            let want = lo + (hi - lo) * normalized.powf(e as f64);
            let mut c = candidates_from_logits(&l);
            let got = temperature_ext(&mut c, t, r, e).unwrap();
            assert!(
                (got as f64 - want).abs() < 1e-4 * (1.0 + want),
                "t={t} r={r} e={e} scale={scale}: {got} vs {want}"
            );
            assert!(got >= (t - r).max(0.0) - 1e-6 && got <= t + r + 1e-6);
            // Sorted best first, each logit divided by that temperature.
            assert_eq!(ids(&c), ranked_ids(&l));
            for c in &c {
                assert_eq!(c.logit, l[c.id as usize] / got);
            }
        }
    }
    // A flat row has the largest entropy: the top of the range.
    let mut c = candidates_from_logits(&[0.5; 64]);
    let got = temperature_ext(&mut c, 1.0, 0.5, 1.0).unwrap();
    assert!((got - 1.5).abs() < 1e-5, "{got}");
    // range <= 0 is plain temperature (bit for bit, order kept); one candidate is left alone.
    let l = random_logits(&mut rng, 50, 2.0);
    for r in [0.0, -1.0] {
        let (mut a, mut b) = (candidates_from_logits(&l), candidates_from_logits(&l));
        assert_eq!(temperature_ext(&mut a, 0.7, r, 2.0), Some(0.7));
        temperature(&mut b, 0.7);
        assert_eq!(a, b);
    }
    let mut one = candidates_from_logits(&[3.0]);
    assert_eq!(temperature_ext(&mut one, 0.7, 0.5, 1.0), None);
    assert_eq!(one[0].logit, 3.0);
}

#[test]
fn mirostat_v2_truncates_by_surprise_and_moves_mu_by_the_error() {
    let mut rng = Mt::new(45);
    let (tau, eta) = (3.0f32, 0.2f32);
    let mut mu = 2.0 * tau;
    let mut gen = Mt::new(5);
    let mut surprises = Vec::new();
    let mut sizes = std::collections::HashSet::new();
    for step in 0..400 {
        let l = random_logits(&mut rng, 300, 1.0 + (step % 5) as f32);
        let probs = softmax_f64(&l);
        let ranked = ranked_ids(&l);
        let bits = |i: u32| -probs[i as usize].log2();
        if ranked.iter().any(|&i| (bits(i) - mu as f64).abs() < 1e-4) {
            continue; // too close to mu to call in f32
        }
        // The best-ranked tokens up to the first whose surprise exceeds mu, at least one.
        let keep = ranked
            .iter()
            .take_while(|&&i| bits(i) <= mu as f64)
            .count()
            .max(1);
        let before = mu;
        let mut c = candidates_from_logits(&l);
        let i = mirostat_v2(&mut c, tau, eta, &mut mu, &mut gen).unwrap();
        assert_eq!(ids(&c), ranked[..keep].to_vec(), "step {step}");
        sizes.insert(keep);
        // mu moves by eta times the pick's surprise within the kept set, less tau.
        let kept_mass: f64 = ranked[..keep].iter().map(|&j| probs[j as usize]).sum();
        let surprise = -(probs[c[i].id as usize] / kept_mass).log2();
        let want = before as f64 - eta as f64 * (surprise - tau as f64);
        assert!(
            (mu as f64 - want).abs() < 1e-4,
            "step {step}: {mu} vs {want}"
        );
        surprises.push(surprise);
    }
    assert!(sizes.len() > 20, "{} kept sizes", sizes.len());
    // The feedback holds the observed surprise near tau.
    let tail = &surprises[surprises.len() / 2..];
    let mean = tail.iter().sum::<f64>() / tail.len() as f64;
    assert!((mean - tau as f64).abs() < 0.5, "mean surprise {mean}");
}

#[test]
fn mirostat_v1_keeps_the_k_of_its_zipf_estimate() {
    let mut rng = Mt::new(46);
    let (tau, eta, n) = (5.0f32, 0.1f32, 2000usize);
    let mut mu = 2.0 * tau;
    let mut gen = Mt::new(6);
    let mut sizes = std::collections::HashSet::new();
    for step in 0..200 {
        let l = random_logits(&mut rng, n, 2.0 + (step % 4) as f32);
        let probs = softmax_f64(&l);
        let ranked = ranked_ids(&l);
        // s from the m = 100 most likely, then k = (e 2^mu / (1 - N^-e))^(1/s), e = s - 1.
        let (mut tb, mut tt) = (0.0f64, 0.0f64);
        for i in 0..MIROSTAT_M - 1 {
            let ti = ((i + 2) as f64 / (i + 1) as f64).ln();
            let bi = (probs[ranked[i] as usize] / probs[ranked[i + 1] as usize]).ln();
            tb += ti * bi;
            tt += ti * ti;
        }
        let s = tb / tt;
        let e = s - 1.0;
        let k = (e * 2f64.powf(mu as f64) / (1.0 - (n as f64).powf(-e))).powf(1.0 / s);
        if (k - k.round()).abs() < 1e-3 * k.max(1.0) {
            continue; // too close to an integer to call in f32
        }
        let keep = (k.floor() as usize).clamp(1, n);
        let before = mu;
        let mut c = candidates_from_logits(&l);
        let i = mirostat(&mut c, n, tau, eta, MIROSTAT_M, &mut mu, &mut gen).unwrap();
        assert_eq!(ids(&c), ranked[..keep].to_vec(), "step {step}: k {k}");
        sizes.insert(keep);
        let kept_mass: f64 = ranked[..keep].iter().map(|&j| probs[j as usize]).sum();
        let surprise = -(probs[c[i].id as usize] / kept_mass).log2();
        let want = before as f64 - eta as f64 * (surprise - tau as f64);
        assert!((mu as f64 - want).abs() < 1e-4, "step {step}");
    }
    assert!(sizes.len() > 10, "{} kept sizes", sizes.len());
    // A flat list has no Zipf slope (s = 0, k not a number): one candidate, and with one
    // candidate no draw.
    let mut c = candidates_from_logits(&[1.0; 8]);
    let mut a = Mt::new(3);
    let mut mu = 10.0;
    assert_eq!(
        mirostat(&mut c, 8, 5.0, 0.1, MIROSTAT_M, &mut mu, &mut a),
        Some(0)
    );
    assert_eq!((c.len(), c[0].id), (1, 0));
    assert_eq!(a.next_u32(), Mt::new(3).next_u32());
}

/// Mirostat's picks by hand: temperature, then the mirostat step, with `dist`'s generator.
fn mirostat_by_hand(p: &SamplerParams, rows: &[Vec<f32>]) -> (Vec<u32>, f32) {
    let mut gen = Mt::new(p.seed as u32);
    let mut mu = 2.0 * p.mirostat_tau;
    let picks = rows
        .iter()
        .map(|l| {
            let mut c = candidates_from_logits(l);
            temperature(&mut c, p.temperature);
            let (tau, eta) = (p.mirostat_tau, p.mirostat_eta);
            let i = match p.mirostat {
                1 => mirostat(&mut c, l.len(), tau, eta, MIROSTAT_M, &mut mu, &mut gen),
                _ => mirostat_v2(&mut c, tau, eta, &mut mu, &mut gen),
            };
            c[i.unwrap()].id
        })
        .collect();
    (picks, mu)
}

#[test]
fn mirostat_replaces_the_chain_and_its_mu_lives_in_the_sampler() {
    let mut rng = Mt::new(47);
    let rows: Vec<Vec<f32>> = (0..40).map(|_| random_logits(&mut rng, 500, 2.0)).collect();
    for version in [1u32, 2] {
        let params = SamplerParams {
            mirostat: version,
            mirostat_tau: 4.0,
            mirostat_eta: 0.3,
            temperature: 0.9,
            // None of these run under mirostat.
            repeat_penalty: 1.5,
            top_k: 3,
            top_p: 0.5,
            typical_p: 0.5,
            xtc_probability: 1.0,
            seed: 9,
            ..Default::default()
        };
        let mut s = Sampler::new(params.clone());
        assert_eq!(s.mirostat_mu(), 8.0);
        let first = draw_sequence_with(&mut s, &rows);
        let (want, mu) = mirostat_by_hand(&params, &rows);
        assert_eq!(first, want, "mirostat {version}");
        assert_eq!(s.mirostat_mu().to_bits(), mu.to_bits());
        assert_ne!(s.mirostat_mu(), 8.0);
        // reset: mu back to 2 tau and the generator reseeded: the same picks again.
        s.reset();
        assert_eq!(s.mirostat_mu(), 8.0);
        assert_eq!(draw_sequence_with(&mut s, &rows), first);
        assert!(first.iter().collect::<std::collections::HashSet<_>>().len() > 5);
        // Neither the whole row's argmax nor the backend's top-k stand in for it.
        assert!(!s.is_argmax() && s.top_k_of(500).is_none());
    }
}

fn draw_sequence_with(s: &mut Sampler, rows: &[Vec<f32>]) -> Vec<u32> {
    rows.iter()
        .map(|l| {
            let t = s.sample(l);
            s.accept(t);
            t
        })
        .collect()
}

#[test]
fn mirostat_at_temperature_zero_picks_the_argmax_of_the_biased_logits() {
    let mut rng = Mt::new(48);
    for version in [1u32, 2] {
        let bias = vec![(7u32, 2.5f32), (11, -1.0)];
        let params = SamplerParams {
            temperature: 0.0,
            mirostat: version,
            repeat_penalty: 3.0,
            logit_bias: bias.clone(),
            ..Default::default()
        };
        let mut s = Sampler::new(params.clone());
        for step in 0..30 {
            let l = random_logits(&mut rng, 100, 1.0);
            let mut biased = l.clone();
            for &(id, b) in &bias {
                biased[id as usize] += b;
            }
            // The penalties are not in mirostat's chain: a token picked before can win again.
            let t = s.sample(&l);
            assert_eq!(
                t,
                greedy(&biased).unwrap(),
                "mirostat {version} step {step}"
            );
            s.accept(t);
            // Each pick has probability 1: mu moves by eta * tau.
            let want = 10.0 + (step + 1) as f32 * 0.5;
            assert!((s.mirostat_mu() - want).abs() < 1e-3);
        }
        assert!(!s.is_argmax());
        let plain = Sampler::new(SamplerParams {
            logit_bias: Vec::new(),
            ..params
        });
        assert!(plain.is_argmax());
    }
}

#[test]
fn a_greedy_pick_is_the_argmax_of_what_typical_and_xtc_leave() {
    // At temperature 0 llama.cpp's temperature keeps the first maximum of the list as typical-p
    // and XTC left it; they can drop the row's argmax. A dynamic range samples instead.
    let mut rng = Mt::new(49);
    let mut moved = 0;
    for step in 0..100 {
        let l = random_logits(&mut rng, 200, 2.0);
        let base = SamplerParams {
            temperature: 0.0,
            seed: step,
            ..Default::default()
        };
        for p in [
            SamplerParams {
                typical_p: 0.3,
                ..base.clone()
            },
            SamplerParams {
                xtc_probability: 1.0,
                xtc_threshold: 0.05,
                ..base.clone()
            },
        ] {
            let mut c = top_k_logits(&l, p.top_k);
            typical(&mut c, p.typical_p, 0);
            top_p(&mut c, p.top_p, 1);
            min_p(&mut c, p.min_p, 1);
            xtc(
                &mut c,
                p.xtc_probability,
                p.xtc_threshold,
                0,
                &mut Mt::new(p.seed as u32),
            );
            let want = c[steps::argmax_index(&c).unwrap()].id;
            let mut s = Sampler::new(p);
            assert!(!s.is_argmax());
            assert_eq!(s.sample(&l), want, "step {step}");
            moved += (want != greedy(&l).unwrap()) as usize;
        }
    }
    assert!(moved > 50, "{moved}");
    let mut s = Sampler::new(SamplerParams {
        temperature: 0.0,
        dynatemp_range: 1.5,
        top_k: 0,
        ..Default::default()
    });
    let l = random_logits(&mut rng, 50, 0.5);
    let picks: std::collections::HashSet<u32> = (0..50).map(|_| s.sample(&l)).collect();
    assert!(picks.len() > 1 && !s.is_argmax());
}

#[test]
fn the_new_samplers_at_their_off_values_leave_the_chain_as_it_was() {
    // `reference_pick` is the chain before these samplers: every off value picks what it picks,
    // with the same draws, step after step.
    let offs: [fn(&mut SamplerParams); 10] = [
        |p| p.typical_p = 1.0,
        |p| p.typical_p = 1.5,
        |p| p.top_n_sigma = 0.0,
        |p| p.top_n_sigma = -2.0,
        |p| p.xtc_probability = 0.0,
        |p| {
            p.xtc_probability = 1.0;
            p.xtc_threshold = 0.6
        },
        |p| p.dynatemp_range = 0.0,
        |p| {
            p.dynatemp_range = -1.0;
            p.dynatemp_exponent = 3.0
        },
        |p| p.min_keep = 1,
        |p| {
            p.mirostat = 0;
            p.mirostat_tau = 1.0;
            p.mirostat_eta = 0.9
        },
    ];
    let mut rng = Mt::new(50);
    for case in 0..80 {
        let n = [7usize, 50, 400][case % 3];
        let logits = if case % 4 == 0 {
            awkward_logits(&mut rng, n)
        } else {
            random_logits(&mut rng, n, 2.0)
        };
        let mut p = SamplerParams {
            temperature: [0.0, 0.8, 1.5][case % 3],
            top_k: [40, 0, 5, n][case % 4],
            top_p: [0.95, 1.0][case % 2],
            min_p: [0.05, 0.0, 0.2][(case / 2) % 3],
            repeat_penalty: [1.0, 1.3][(case / 3) % 2],
            seed: case as u64,
            ..Default::default()
        };
        offs[case % offs.len()](&mut p);
        let mut s = Sampler::new(p.clone());
        let mut reference = Mt::new(p.seed as u32);
        let mut history = Vec::new();
        for step in 0..6 {
            let want = reference_pick(&p, &history, &logits, &mut reference);
            let got = s.try_sample(&logits);
            assert_eq!(got, want, "case {case} step {step}: {p:?}");
            if let Some(t) = got {
                s.accept(t);
                history.push(t);
            }
        }
    }
}

/// The whole ordinary chain with every step, as every candidate goes through it: what
/// `try_sample` must pick, with `dist`'s and XTC's generators.
fn reference_pick_all(
    p: &SamplerParams,
    history: &[u32],
    logits: &[f32],
    rng: &mut Mt,
    xtc_rng: &mut Mt,
) -> Option<u32> {
    let mut cands = candidates_from_logits(logits);
    p.penalize(&mut cands, history);
    if cands.iter().all(|c| c.logit == f32::NEG_INFINITY) {
        return None;
    }
    top_n_sigma(&mut cands, p.top_n_sigma);
    top_k(&mut cands, p.top_k);
    let keep = p.min_keep.max(1);
    typical(&mut cands, p.typical_p, p.min_keep);
    top_p(&mut cands, p.top_p, keep);
    min_p(&mut cands, p.min_p, keep);
    xtc(
        &mut cands,
        p.xtc_probability,
        p.xtc_threshold,
        p.min_keep,
        xtc_rng,
    );
    if p.temperature <= 0.0 && p.dynatemp_range <= 0.0 {
        return steps::argmax_index(&cands).map(|i| cands[i].id);
    }
    temperature_ext(
        &mut cands,
        p.temperature,
        p.dynatemp_range,
        p.dynatemp_exponent,
    );
    dist(&mut cands, rng).map(|i| cands[i].id)
}

#[test]
fn one_pass_paths_pick_what_the_whole_chain_picks_with_every_step_on() {
    // The greedy shortcut (top-n-sigma never masks the maximum), top-n-sigma's mask on the row
    // before the one-pass top-k, and the backend's top-k candidates all pick what the chain
    // with a candidate for every token picks.
    let mut rng = Mt::new(2025);
    let mut picks = std::collections::HashSet::new();
    for case in 0..300 {
        let n = [2usize, 7, 50, 333, 3000][case % 5];
        let logits = if case % 3 == 0 {
            awkward_logits(&mut rng, n)
        } else {
            random_logits(&mut rng, n, 3.0)
        };
        let p = SamplerParams {
            temperature: [0.0, 0.8, 1.5, 0.0][case % 4],
            top_k: [40, 0, 5, n + 1, 1][case % 5],
            top_p: [1.0, 0.9][(case / 2) % 2],
            min_p: [0.0, 0.05][(case / 3) % 2],
            repeat_penalty: [1.0, 1.3][(case / 5) % 2],
            typical_p: [1.0, 0.7, 0.3][(case / 7) % 3],
            top_n_sigma: [-1.0, 1.0, 2.5][(case / 4) % 3],
            xtc_probability: [0.0, 0.5, 1.0][(case / 6) % 3],
            xtc_threshold: [0.05, 0.2][(case / 11) % 2],
            dynatemp_range: [0.0, 0.6][(case / 8) % 2],
            dynatemp_exponent: [1.0, 2.0][(case / 13) % 2],
            min_keep: [0, 3][(case / 9) % 2],
            seed: case as u64,
            ..Default::default()
        };
        let mut s = Sampler::new(p.clone());
        let mut top = Sampler::new(p.clone());
        let (mut reference, mut reference_xtc) = (Mt::new(case as u32), Mt::new(case as u32));
        let mut history = Vec::new();
        for step in 0..4 {
            let want =
                reference_pick_all(&p, &history, &logits, &mut reference, &mut reference_xtc);
            let got = s.try_sample(&logits);
            assert_eq!(got, want, "case {case} step {step}: n {n} {p:?}");
            if let Some(k) = top.top_k_of(n) {
                assert_eq!(top.try_sample_top_k(top_k_logits(&logits, k)), want);
            } else {
                assert_eq!(top.try_sample(&logits), want);
            }
            if let Some(t) = got {
                s.accept(t);
                top.accept(t);
                history.push(t);
                picks.insert(t);
            }
        }
    }
    assert!(picks.len() > 100, "{} distinct picks", picks.len());
}

#[test]
fn the_backend_top_k_stands_in_unless_a_step_reads_the_whole_row() {
    let of = |f: &dyn Fn(&mut SamplerParams)| {
        let mut p = SamplerParams::default();
        f(&mut p);
        Sampler::new(p).top_k_of(1000)
    };
    // After top-k: typical-p, XTC, dynamic temperature (at temperature 0 too, where they move
    // the pick), min_keep.
    assert_eq!(of(&|p| p.typical_p = 0.5), Some(40));
    assert_eq!(of(&|p| p.xtc_probability = 0.5), Some(40));
    assert_eq!(of(&|p| p.dynatemp_range = 0.5), Some(40));
    assert_eq!(of(&|p| p.min_keep = 5), Some(40));
    assert_eq!(
        of(&|p| {
            p.temperature = 0.0;
            p.typical_p = 0.5
        }),
        Some(40)
    );
    // Before top-k, or in place of the chain: the whole row.
    assert_eq!(of(&|p| p.top_n_sigma = 1.0), None);
    assert_eq!(of(&|p| p.mirostat = 1), None);
    assert_eq!(of(&|p| p.mirostat = 2), None);
    // Greedy with only top-n-sigma on is still the raw argmax (it never masks the maximum).
    let s = Sampler::new(SamplerParams {
        top_n_sigma: 1.0,
        ..SamplerParams::greedy()
    });
    assert!(s.is_argmax());
}

#[test]
fn check_names_the_field_and_its_value() {
    assert_eq!(SamplerParams::default().check(), Ok(()));
    assert_eq!(SamplerParams::greedy().check(), Ok(()));
    let bad = |f: &dyn Fn(&mut SamplerParams)| {
        let mut p = SamplerParams::default();
        f(&mut p);
        p.check().unwrap_err()
    };
    assert_eq!(
        bad(&|p| p.typical_p = f32::NAN),
        "typical_p must be a finite number, got NaN"
    );
    assert_eq!(
        bad(&|p| p.xtc_probability = f32::INFINITY),
        "xtc_probability must be a finite number, got inf"
    );
    assert_eq!(
        bad(&|p| p.temperature = f32::NEG_INFINITY),
        "temperature must be a finite number, got -inf"
    );
    assert!(bad(&|p| p.mirostat_eta = f32::NAN).starts_with("mirostat_eta"));
    assert!(bad(&|p| p.dynatemp_exponent = f32::NAN).starts_with("dynatemp_exponent"));
    assert!(bad(&|p| p.top_n_sigma = f32::NAN).starts_with("top_n_sigma"));
    assert_eq!(
        bad(&|p| p.mirostat = 3),
        "mirostat must be 0 (off), 1 (mirostat 1.0) or 2 (mirostat 2.0), got 3"
    );
    assert_eq!(
        bad(&|p| p.logit_bias = vec![(4, 1.0), (9, f32::NAN)]),
        "logit_bias for token 9 is NaN"
    );
    // Bans and forced picks are values, as are llama.cpp's off values of every sampler.
    let mut p = SamplerParams {
        logit_bias: vec![(1, f32::NEG_INFINITY), (2, f32::INFINITY)],
        top_n_sigma: -1.0,
        xtc_threshold: 0.9,
        typical_p: 1.0,
        mirostat: 2,
        ..Default::default()
    };
    assert_eq!(p.check(), Ok(()));
    p.mirostat = 0;
    assert_eq!(p.check(), Ok(()));
}

// DRY.

/// DRY's penalties by brute force: for every earlier position, the longest run ending there
/// that equals the history's end, capped at the tokens after the most recent complete breaker.
fn dry_reference(h: &[u32], p: &DryParams, breakers: &DryBreakers) -> Vec<(u32, f32)> {
    let n = h.len();
    if n <= p.allowed_length {
        return Vec::new();
    }
    let mut limit = n;
    'scan: for pos in (0..n).rev() {
        let mut best: Option<usize> = None;
        for tail in breakers.tails(h[pos]) {
            if pos + tail.len() < n && h[pos + 1..pos + 1 + tail.len()] == tail[..] {
                best = best.max(Some(tail.len()));
            }
        }
        if let Some(len) = best {
            limit = n - 1 - pos - len;
            break 'scan;
        }
    }
    if limit < p.allowed_length {
        return Vec::new();
    }
    let mut longest = std::collections::BTreeMap::new();
    for end in 0..n - 1 {
        let mut len = 0;
        while len <= end && h[end - len] == h[n - 1 - len] {
            len += 1;
        }
        let len = len.min(limit);
        if len >= p.allowed_length {
            let e = longest.entry(h[end + 1]).or_insert(len);
            *e = (*e).max(len);
        }
    }
    longest
        .into_iter()
        .filter(|&(t, _)| !breakers.is_single_token(t))
        .map(|(t, len)| {
            let e = (len - p.allowed_length) as f64;
            (t, (p.multiplier as f64 * (p.base as f64).powf(e)) as f32)
        })
        .collect()
}

#[test]
fn dry_counts_llama_cpp_example() {
    // llama.cpp's comment: a b c c b c y a b c. The end (a b c) repeats before c (length 3),
    // (b c) before y (2), (c) before b (1).
    let h = [0, 1, 2, 2, 1, 2, 9, 0, 1, 2];
    let p = DryParams {
        multiplier: 0.5,
        base: 2.0,
        allowed_length: 2,
    };
    let none = DryBreakers::default();
    assert_eq!(dry_penalties(&h, &p, &none), vec![(2, 1.0), (9, 0.5)]);
    let p1 = DryParams {
        allowed_length: 1,
        ..p
    };
    assert_eq!(
        dry_penalties(&h, &p1, &none),
        vec![(1, 0.5), (2, 2.0), (9, 1.0)]
    );
    // y as a breaker: only the tokens after it count (a b c), and y itself is never penalised.
    let y = DryBreakers::from_token_sequences(&[vec![9]]);
    assert_eq!(dry_penalties(&h, &p, &y), vec![(2, 1.0)]);
    // A breaker at the very end leaves nothing to repeat.
    let c = DryBreakers::from_token_sequences(&[vec![2]]);
    assert_eq!(dry_penalties(&h, &p1, &c), vec![]);
}

#[test]
fn dry_matches_llama_cpp_test_sampling() {
    // llama.cpp's tests/test-sampling.cpp: history 0 1 2 0 1, multiplier 1, base 1.1, allowed
    // 2: token 2 extends (0 1) and loses exactly 1; with 3 a breaker, nothing in 0 1 3 4 0 1.
    let p = DryParams {
        multiplier: 1.0,
        base: 1.1,
        allowed_length: 2,
    };
    assert_eq!(
        dry_penalties(&[0, 1, 2, 0, 1], &p, &DryBreakers::default()),
        vec![(2, 1.0)]
    );
    let three = DryBreakers::from_token_sequences(&[vec![3]]);
    assert_eq!(dry_penalties(&[0, 1, 3, 4, 0, 1], &p, &three), vec![]);
    let four = DryParams {
        allowed_length: 4,
        ..p
    };
    assert_eq!(
        dry_penalties(&[0, 1, 2, 3, 4, 0, 1], &four, &DryBreakers::default()),
        vec![]
    );
}

#[test]
fn dry_penalises_a_repeated_ngram_by_its_length() {
    let mut rng = Mt::new(41);
    for _ in 0..300 {
        // P (L distinct tokens), x, noise (distinct, unseen elsewhere), P again: x extends a
        // repeat of exactly L tokens, and nothing else repeats.
        let l = 1 + rng.next_u32() as usize % 12;
        let allowed = 1 + rng.next_u32() as usize % 6;
        let p = DryParams {
            multiplier: 0.1 + uniform_f32(&mut rng) * 3.0,
            base: 1.0 + uniform_f32(&mut rng) * 2.0,
            allowed_length: allowed,
        };
        let pattern: Vec<u32> = (0..l as u32).collect();
        let x = 500;
        let noise: Vec<u32> = (1000..1000 + rng.next_u32() % 20).collect();
        let h: Vec<u32> = [&pattern[..], &[x], &noise, &pattern].concat();
        let want = if l >= allowed {
            let e = (l - allowed) as i32;
            vec![(x, (p.multiplier as f64 * (p.base as f64).powi(e)) as f32)]
        } else {
            vec![]
        };
        let got = dry_penalties(&h, &p, &DryBreakers::default());
        assert_eq!(got.len(), want.len(), "L {l} allowed {allowed}");
        for ((gt, gp), (wt, wp)) in got.iter().zip(&want) {
            assert_eq!(gt, wt);
            // powf against powi: the same up to the last bit of the f32.
            assert!((gp - wp).abs() <= wp * 1e-6, "{gp} vs {wp}");
        }
        // On the chain: x's logit alone moves, by that much.
        let logits: Vec<f32> = (0..1100).map(|i| (i % 7) as f32 * 0.25).collect();
        let mut cands = candidates_from_logits(&logits);
        dry(&mut cands, &h, &p, &DryBreakers::default());
        for c in &cands {
            let d = got.iter().find(|g| g.0 == c.id).map_or(0.0, |g| g.1);
            assert_eq!(c.logit, logits[c.id as usize] - d);
        }
    }
}

#[test]
fn dry_matches_brute_force_with_breakers() {
    let mut rng = Mt::new(42);
    for case in 0..3000 {
        let alphabet = 2 + rng.next_u32() % 5;
        let n = rng.next_u32() as usize % 40;
        let h: Vec<u32> = (0..n).map(|_| rng.next_u32() % alphabet).collect();
        let seqs: Vec<Vec<u32>> = (0..rng.next_u32() % 3)
            .map(|_| {
                let len = 1 + rng.next_u32() as usize % 3;
                (0..len).map(|_| rng.next_u32() % (alphabet + 2)).collect()
            })
            .collect();
        let breakers = DryBreakers::from_token_sequences(&seqs);
        let p = DryParams {
            multiplier: 0.8,
            base: 1.75,
            allowed_length: rng.next_u32() as usize % 5,
        };
        assert_eq!(
            dry_penalties(&h, &p, &breakers),
            dry_reference(&h, &p, &breakers),
            "case {case}: history {h:?} breakers {seqs:?} allowed {}",
            p.allowed_length
        );
    }
}

#[test]
fn dry_exponent_is_capped_before_f32_overflow() {
    // base 1.75: log(FLT_MAX) / log(1.75) = 158.5, so exponents stop at 158 (finite penalty).
    let h = vec![7u32; 400];
    let p = DryParams {
        multiplier: 1.0,
        base: 1.75,
        allowed_length: 2,
    };
    let got = dry_penalties(&h, &p, &DryBreakers::default());
    assert_eq!(got, vec![(7, (1.75f64.powf(158.0)) as f32)]);
    assert!(got[0].1.is_finite());
    assert_eq!(88.722_84_f32, "88.7228391".parse::<f32>().unwrap());
}

#[test]
fn dry_breakers_from_token_texts() {
    let pieces: Vec<&[u8]> = vec![b"a", b"x:", b"\n", b"ab", b"b:c", b"zz", b"<", b"<a"];
    // A fake tokenizer: one token per byte, the token being the byte value.
    let tokenize = |t: &[u8]| t.iter().map(|&b| b as u32).collect::<Vec<u32>>();
    let b = DryBreakers::new(&pieces, &["\n", ":", "<ab>", ""], tokenize);
    // Containment: x: (1), \n (2), b:c (4) hold a whole breaker.
    for id in [1, 2, 4] {
        assert!(b.is_single_token(id), "{id}");
    }
    // Overlap with <ab>: "<" then "ab>", "<a" then "b>"; "a" and "ab" are not its beginning.
    assert_eq!(b.tails(6), &[tokenize(b"ab>")]);
    assert_eq!(b.tails(7), &[tokenize(b"b>")]);
    assert!(b.tails(0).is_empty() && b.tails(3).is_empty() && b.tails(5).is_empty());
    assert_eq!(b.len(), 5);
    // Long breakers are cut to 40 bytes, tails to 20 tokens.
    let long = "<".to_string() + &"y".repeat(60);
    let b = DryBreakers::new(&pieces, &[long], tokenize);
    assert_eq!(b.tails(6), &[vec![b'y' as u32; 20]]);
}

#[test]
fn dry_off_leaves_the_chain_bit_identical() {
    let mut rng = Mt::new(43);
    let rows: Vec<Vec<f32>> = (0..48).map(|_| random_logits(&mut rng, 300, 2.0)).collect();
    for base in [
        SamplerParams {
            seed: 5,
            ..Default::default()
        },
        SamplerParams {
            seed: 6,
            top_k: 0,
            repeat_penalty: 1.3,
            ..Default::default()
        },
        SamplerParams::greedy(),
    ] {
        let want = draw_sequence(&base, &rows);
        for off in [
            SamplerParams {
                dry_multiplier: 0.0,
                dry_allowed_length: 0,
                ..base.clone()
            },
            SamplerParams {
                dry_multiplier: 2.0,
                dry_penalty_last_n: 0,
                ..base.clone()
            },
            SamplerParams {
                dry_multiplier: 2.0,
                dry_base: 0.9,
                ..base.clone()
            },
        ] {
            assert_eq!(draw_sequence(&off, &rows), want);
            let s = Sampler::new(off.clone());
            let b = Sampler::new(base.clone());
            assert_eq!(s.is_argmax(), b.is_argmax());
            assert_eq!(s.top_k_of(300), b.top_k_of(300));
        }
    }
}

#[test]
fn dry_on_reads_the_whole_row() {
    let p = SamplerParams {
        dry_multiplier: 0.8,
        ..Default::default()
    };
    assert_eq!(Sampler::new(p.clone()).top_k_of(1000), None);
    let g = SamplerParams {
        dry_multiplier: 0.8,
        ..SamplerParams::greedy()
    };
    assert!(!Sampler::new(g).is_argmax());
    assert_eq!(p.check(), Ok(()));
    let bad = SamplerParams {
        dry_base: f32::NAN,
        ..p
    };
    assert!(bad.check().unwrap_err().starts_with("dry_base"));
}

#[test]
fn dry_window_is_the_last_penalty_last_n_tokens() {
    // History 1 2 3 then 40 fillers then 1 2: token 3 extends (1 2). Its logit leads by 0.5;
    // DRY (multiplier 1) pushes it below token 4 only when the window reaches back to 1 2 3.
    let mut logits = vec![0.0f32; 100];
    logits[3] = 1.5;
    logits[4] = 1.0;
    let mut history = vec![1, 2, 3];
    history.extend(50..90);
    history.extend([1, 2]);
    for (last_n, top_k, want) in [(45, 40, 4), (44, 40, 3), (45, 0, 4), (44, 0, 3), (0, 40, 3)] {
        let mut s = Sampler::new(SamplerParams {
            temperature: 0.0,
            top_k,
            dry_multiplier: 1.0,
            dry_penalty_last_n: last_n,
            ..Default::default()
        });
        for &t in &history {
            s.accept(t);
        }
        assert_eq!(s.sample(&logits), want, "last_n {last_n} top_k {top_k}");
        s.reset();
        assert_eq!(s.sample(&logits), 3);
    }
}

/// A small vocabulary for grammar tests: letters, words, punctuation, the two bytes of "é" as
/// tokens of their own and "é" whole, and an end-of-generation token (the last).
fn grammar_vocab() -> (Vec<Vec<u8>>, Arc<GrammarVocab>) {
    let mut pieces: Vec<Vec<u8>> = ["a", "b", "c", "ab", "abc", "ba", ".", " ", "x", "é", "a."]
        .iter()
        .map(|s| s.as_bytes().to_vec())
        .collect();
    pieces.push(vec![0xC3]);
    pieces.push(vec![0xA9]);
    pieces.push(b"</s>".to_vec());
    let n = pieces.len();
    let eog = (0..n).map(|i| i == n - 1).collect();
    (pieces.clone(), Arc::new(GrammarVocab::new(pieces, eog)))
}

/// Sampler settings for the grammar tests: greedy, and sampling with and without top-k.
fn grammar_settings(seed: u64) -> Vec<SamplerParams> {
    vec![
        SamplerParams {
            seed,
            ..SamplerParams::greedy()
        },
        SamplerParams {
            seed,
            temperature: 1.5,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            ..Default::default()
        },
        SamplerParams {
            seed,
            temperature: 0.9,
            top_k: 5,
            repeat_penalty: 1.3,
            ..Default::default()
        },
    ]
}

#[test]
fn a_grammar_sampler_picks_as_llama_cpp_does_and_only_allowed_tokens() {
    // llama.cpp's common sampler: the chain's pick, kept if the grammar allows it; else a
    // second pass of the chain (a second draw) over the row with the grammar's rejects at -inf.
    // `plain` replays that with a sampler that has no grammar and an independent state.
    let (pieces, vocab) = grammar_vocab();
    let n = pieces.len();
    let grammar =
        Arc::new(Grammar::parse(r##"root ::= ("ab" | "c" | "é")+ ("." | " x")"##).unwrap());
    let mut rng = Mt::new(0x5eed_0001);
    let mut rejected = 0;
    let mut ended = 0;
    for round in 0..60u64 {
        for params in grammar_settings(round) {
            let mut constrained = Sampler::new(params.clone());
            constrained.set_grammar(grammar.clone(), vocab.clone());
            let mut plain = Sampler::new(params.clone());
            let mut state = GrammarState::new(grammar.clone());
            let mut text = Vec::new();
            for _ in 0..20 {
                let row = random_logits(&mut rng, n, 3.0);
                let first = plain.try_sample(&row).unwrap();
                let expected = if state.allows(&vocab, first) {
                    first
                } else {
                    rejected += 1;
                    let mut masked = row.clone();
                    state.mask_logits(&vocab, &mut masked);
                    plain.try_sample(&masked).unwrap()
                };
                let got = constrained.try_sample(&row).unwrap();
                assert_eq!(got, expected, "round {round}, {params:?}");
                assert!(state.allows(&vocab, got));
                constrained.accept_generated(got).unwrap();
                plain.accept(got);
                state.accept(&vocab, got).unwrap();
                if got as usize == n - 1 {
                    ended += 1;
                    let text = String::from_utf8(text.clone()).unwrap();
                    assert!(grammar.accepts_str(&text), "{text:?}");
                    break;
                }
                text.extend_from_slice(&pieces[got as usize]);
            }
        }
    }
    // The rows exercised both paths, and generations reached the end.
    assert!(rejected > 100, "{rejected}");
    assert!(ended > 20, "{ended}");
}

#[test]
fn a_grammar_asks_for_the_whole_row_and_refuses_what_it_cannot_follow() {
    let (_, vocab) = grammar_vocab();
    let grammar = Arc::new(Grammar::parse(r##"root ::= "ab" ".""##).unwrap());
    for params in grammar_settings(3) {
        let mut s = Sampler::new(params.clone());
        assert!(!s.has_grammar());
        s.set_grammar(grammar.clone(), vocab.clone());
        assert!(s.has_grammar());
        assert!(!s.is_argmax(), "{params:?}");
        assert_eq!(s.top_k_of(vocab.len()), None, "{params:?}");
        // "b" cannot start the text: refused, and nothing recorded.
        assert!(s.accept_generated(1).is_err());
        s.accept_generated(3).unwrap();
        assert!(!s.grammar_must_end());
        s.accept_generated(6).unwrap();
        assert!(s.grammar_must_end());
        // Only the end can follow: the pick is it, whatever the row says.
        let mut row = vec![5.0; vocab.len()];
        row[vocab.len() - 1] = -3.0;
        assert_eq!(s.try_sample(&row), Some(vocab.len() as u32 - 1));
        // A row where the end is banned leaves nothing to pick.
        row[vocab.len() - 1] = f32::NEG_INFINITY;
        assert_eq!(s.try_sample(&row), None);
        // reset starts the grammar over.
        s.reset();
        assert!(s.accept_generated(3).is_ok());
    }
}

// Lazy grammars (llama.cpp's grammar triggers).

/// The vocabulary of the lazy grammar tests: the pieces of `LAZY_PIECES`, the two bytes of "é"
/// as tokens of their own, "é"'s second byte before "<to", "a<tool>" and "é"'s first byte, and
/// an end-of-generation token (the last).
fn lazy_vocab() -> (Vec<Vec<u8>>, Arc<GrammarVocab>) {
    let mut pieces: Vec<Vec<u8>> = [
        "a", "b", "c", "x", ".", " ", "ab", "<", "to", "ol", ">", "ab<to", "ol>x", "<tool>", "é",
        "<|call|>", "ol>",
    ]
    .iter()
    .map(|s| s.as_bytes().to_vec())
    .collect();
    pieces.push(vec![0xC3]);
    pieces.push(vec![0xA9]);
    pieces.push(b"\xa9<to".to_vec());
    pieces.push(b"a<tool>\xc3".to_vec());
    pieces.push(b"</s>".to_vec());
    let n = pieces.len();
    let eog = (0..n).map(|i| i == n - 1).collect();
    (pieces.clone(), Arc::new(GrammarVocab::new(pieces, eog)))
}

/// The id of the token whose piece is `piece`.
fn tok(pieces: &[Vec<u8>], piece: &[u8]) -> u32 {
    pieces
        .iter()
        .position(|p| p == piece)
        .expect("a piece of the vocabulary") as u32
}

/// The grammar the "<tool>" triggers start.
fn tool_grammar() -> Arc<Grammar> {
    Arc::new(Grammar::parse(r##"root ::= "<tool>" ("ab" | "c" | "x" | "é")+ ".""##).unwrap())
}

fn triggers(tokens: Vec<u32>, patterns: &[(TriggerKind, &str)]) -> Arc<Triggers> {
    let patterns: Vec<(TriggerKind, String)> =
        patterns.iter().map(|(k, p)| (*k, p.to_string())).collect();
    Arc::new(Triggers::new(tokens, &patterns).unwrap())
}

/// A sampler with a lazy grammar.
fn lazy_sampler(
    grammar: &Arc<Grammar>,
    vocab: &Arc<GrammarVocab>,
    triggers: &Arc<Triggers>,
) -> Sampler {
    let mut s = Sampler::new(SamplerParams::greedy());
    s.set_lazy_grammar(grammar.clone(), vocab.clone(), triggers.clone());
    s
}

/// Feeds `pieces` as generated tokens.
fn feed(s: &mut Sampler, all: &[Vec<u8>], pieces: &[&[u8]]) {
    for p in pieces {
        s.accept_generated(tok(all, p)).unwrap();
    }
}

/// The tokens the sampler's (triggered) grammar allows next.
fn lazy_allowed(s: &Sampler) -> Vec<u32> {
    assert!(!s.grammar_awaiting_trigger());
    let g = s.grammar.as_ref().unwrap();
    g.state.allowed_tokens(&g.vocab)
}

/// The tokens a fresh state of `grammar` allows after `text`.
fn allowed_after(grammar: &Arc<Grammar>, vocab: &GrammarVocab, text: &str) -> Vec<u32> {
    let mut st = GrammarState::new(grammar.clone());
    st.accept_str(text).unwrap();
    st.allowed_tokens(vocab)
}

#[test]
fn a_lazy_grammar_awaiting_its_trigger_picks_as_no_grammar_then_constrains() {
    // Until "<tool>" appears the lazy sampler must pick exactly what a sampler without a
    // grammar picks (same parameters, seed and rows), and offer the same fast paths; from the
    // trigger on, only what the grammar allows, and the text from "<tool>" to the end of
    // generation is in the grammar's language.
    let (pieces, vocab) = lazy_vocab();
    let n = pieces.len();
    let eog = n as u32 - 1;
    let grammar = tool_grammar();
    let trig = triggers(vec![], &[(TriggerKind::Word, "<tool>")]);
    let mut rng = Mt::new(0x1a2e_0001);
    let (mut compared, mut fast_argmax, mut fast_top_k) = (0, 0, 0);
    let (mut triggered, mut ended) = (0, 0);
    for round in 0..40u64 {
        let mut settings = grammar_settings(round);
        settings.push(SamplerParams {
            seed: round,
            temperature: 0.8,
            top_k: 6,
            ..Default::default()
        });
        for params in settings {
            let mut lazy = Sampler::new(params.clone());
            lazy.set_lazy_grammar(grammar.clone(), vocab.clone(), trig.clone());
            let mut plain = Sampler::new(params.clone());
            let mut text = Vec::new();
            let mut fired_at = None;
            for _ in 0..80 {
                let row = random_logits(&mut rng, n, 3.0);
                let got = if lazy.grammar_awaiting_trigger() {
                    assert!(lazy.has_grammar() && !lazy.grammar_must_end());
                    assert_eq!(lazy.is_argmax(), plain.is_argmax(), "{params:?}");
                    assert_eq!(lazy.top_k_of(n), plain.top_k_of(n), "{params:?}");
                    fast_argmax += lazy.is_argmax() as usize;
                    let (got, want) = match plain.top_k_of(n) {
                        Some(k) => {
                            fast_top_k += 1;
                            let cands = top_k_logits(&row, k);
                            (
                                lazy.try_sample_top_k(cands.clone()),
                                plain.try_sample_top_k(cands),
                            )
                        }
                        None => (lazy.try_sample(&row), plain.try_sample(&row)),
                    };
                    assert_eq!(got, want, "round {round}, {params:?}");
                    compared += 1;
                    got.unwrap()
                } else {
                    assert!(!lazy.is_argmax());
                    assert_eq!(lazy.top_k_of(n), None);
                    let got = lazy.try_sample(&row).unwrap();
                    assert!(
                        lazy_allowed(&lazy).contains(&got),
                        "round {round}, {params:?}"
                    );
                    got
                };
                lazy.accept_generated(got).unwrap();
                plain.accept(got);
                if got == eog {
                    if let Some(at) = fired_at {
                        ended += 1;
                        let from: &[u8] = &text[at..];
                        let s = std::str::from_utf8(from).unwrap();
                        assert!(grammar.accepts_str(s), "{s:?}");
                    }
                    break;
                }
                text.extend_from_slice(&pieces[got as usize]);
                if fired_at.is_none() && !lazy.grammar_awaiting_trigger() {
                    triggered += 1;
                    // The first "<tool>" of the text is where the grammar starts.
                    fired_at = text.windows(6).position(|w| w == b"<tool>");
                    assert!(fired_at.is_some(), "{:?}", String::from_utf8_lossy(&text));
                }
            }
        }
    }
    assert!(compared > 1000, "{compared}");
    assert!(
        fast_argmax > 100 && fast_top_k > 100,
        "{fast_argmax} {fast_top_k}"
    );
    assert!(triggered > 60 && ended > 30, "{triggered} {ended}");
}

#[test]
fn a_word_trigger_inside_a_token_feeds_the_grammar_from_the_trigger() {
    let (pieces, vocab) = lazy_vocab();
    let grammar = tool_grammar();
    let trig = triggers(vec![], &[(TriggerKind::Word, "<tool>")]);
    let mut s = lazy_sampler(&grammar, &vocab, &trig);
    assert!(s.grammar_awaiting_trigger() && s.is_argmax());
    feed(&mut s, &pieces, &[b"ab<to"]);
    assert!(s.grammar_awaiting_trigger() && s.is_argmax());
    // "ab<to" + "ol>x": the grammar gets "<tool>x", not "ab<tool>x" (which it rejects).
    feed(&mut s, &pieces, &[b"ol>x"]);
    assert!(!s.grammar_awaiting_trigger() && !s.is_argmax() && s.has_grammar());
    let allowed = lazy_allowed(&s);
    assert_eq!(allowed, allowed_after(&grammar, &vocab, "<tool>x"));
    assert!(allowed.contains(&tok(&pieces, b".")) && !allowed.contains(&tok(&pieces, b"<")));
    // The pick is the best allowed token, whatever the row prefers.
    let mut row = vec![0.0f32; pieces.len()];
    row[tok(&pieces, b"<") as usize] = 9.0;
    row[tok(&pieces, b"ab<to") as usize] = 8.0;
    row[tok(&pieces, b"c") as usize] = 1.0;
    assert_eq!(s.try_sample(&row), Some(tok(&pieces, b"c")));
    // A token the grammar rejects is refused now.
    assert!(s.accept_generated(tok(&pieces, b"<")).is_err());
    feed(&mut s, &pieces, &[b"c", b"."]);
    assert!(s.grammar_must_end());
}

#[test]
fn a_trigger_token_feeds_itself_to_the_grammar() {
    let (pieces, vocab) = lazy_vocab();
    let call = tok(&pieces, b"<|call|>");
    // By its text, or by its id (a token element).
    for src in [
        r##"root ::= "<|call|>" "x"+ ".""##,
        &format!(r##"root ::= <[{call}]> "x"+ ".""##),
    ] {
        let grammar = Arc::new(Grammar::parse(src).unwrap());
        let trig = triggers(vec![call], &[]);
        let mut s = lazy_sampler(&grammar, &vocab, &trig);
        feed(&mut s, &pieces, &[b"a", b"<", b"<tool>", b" "]);
        assert!(s.grammar_awaiting_trigger());
        s.accept_generated(call).unwrap();
        assert!(!s.grammar_awaiting_trigger());
        assert_eq!(lazy_allowed(&s), vec![tok(&pieces, b"x")], "{src}");
        feed(&mut s, &pieces, &[b"x", b"x", b"."]);
        assert!(s.grammar_must_end());
    }
}

#[test]
fn a_pattern_trigger_starts_the_grammar_at_its_first_non_empty_group() {
    let (pieces, vocab) = lazy_vocab();
    let grammar = tool_grammar();
    let want = allowed_after(&grammar, &vocab, "<tool>");
    // The match starts at "c" and the grammar rejects "c <tool>": it must start at the group.
    for pattern in [r"c\s*(<tool>)", r"(z)?c ?(<tool>)", r"()c ?(<tool>)"] {
        let trig = triggers(vec![], &[(TriggerKind::Pattern, pattern)]);
        let mut s = lazy_sampler(&grammar, &vocab, &trig);
        feed(&mut s, &pieces, &[b"a", b"c", b" ", b"<", b"to", b"ol"]);
        assert!(s.grammar_awaiting_trigger(), "{pattern}");
        feed(&mut s, &pieces, &[b">"]);
        assert_eq!(lazy_allowed(&s), want, "{pattern}");
    }
    // The first pattern that matches, in order, decides; one that does not compile is refused.
    let trig = triggers(
        vec![],
        &[
            (TriggerKind::Pattern, "zz(c)"),
            (TriggerKind::Pattern, r"a(<tool>)"),
        ],
    );
    let mut s = lazy_sampler(&grammar, &vocab, &trig);
    feed(&mut s, &pieces, &[b"a<tool>\xc3"]);
    assert_eq!(lazy_allowed(&s), vec![tok(&pieces, &[0xA9])]);
}

#[test]
fn a_full_pattern_must_match_the_whole_text() {
    let (pieces, vocab) = lazy_vocab();
    let grammar = tool_grammar();
    let want = allowed_after(&grammar, &vocab, "<tool>");
    for (kind, pattern) in [
        (TriggerKind::PatternFull, "<tool>"),
        (TriggerKind::PatternFull, "^<tool>"),
        (TriggerKind::Pattern, "^<tool>$"),
    ] {
        let trig = triggers(vec![], &[(kind, pattern)]);
        // A mere substring does not trigger it.
        let mut s = lazy_sampler(&grammar, &vocab, &trig);
        feed(&mut s, &pieces, &[b"a", b"<tool>", b"x"]);
        assert!(s.grammar_awaiting_trigger(), "{pattern}");
        // The whole text does.
        let mut s = lazy_sampler(&grammar, &vocab, &trig);
        feed(&mut s, &pieces, &[b"<"]);
        assert!(s.grammar_awaiting_trigger(), "{pattern}");
        feed(&mut s, &pieces, &[b"to", b"ol>"]);
        assert_eq!(lazy_allowed(&s), want, "{pattern}");
    }
    // llama.cpp's usual form: anything, the trigger as a group, anything.
    let trig = triggers(
        vec![],
        &[(TriggerKind::PatternFull, r"[\s\S]*?(<tool>)[\s\S]*")],
    );
    let mut s = lazy_sampler(&grammar, &vocab, &trig);
    feed(&mut s, &pieces, &[b"ab", b" ", b"ab<to"]);
    assert!(s.grammar_awaiting_trigger());
    feed(&mut s, &pieces, &[b"ol>x"]);
    assert_eq!(lazy_allowed(&s), allowed_after(&grammar, &vocab, "<tool>x"));
    // As in llama.cpp, an anchored pattern that does not match the whole text is still searched:
    // "^ab|<tool>$" (a full "ab|<tool>") finds "<tool>" at the end.
    let trig = triggers(vec![], &[(TriggerKind::PatternFull, "ab|<tool>")]);
    assert_eq!(trig.patterns(), ["^ab|<tool>$"]);
    let mut s = lazy_sampler(&grammar, &vocab, &trig);
    feed(&mut s, &pieces, &[b"x", b"<tool>"]);
    assert_eq!(lazy_allowed(&s), want);
}

#[test]
fn a_lookahead_pattern_triggers_as_in_llama_cpp() {
    // gpt-oss's tool call trigger: a recipient after "<|start|>assistant" (or at the start),
    // but not "self".
    let words = [
        "<|start|>",
        "assistant",
        " to=",
        "self",
        "functions.get",
        "<|message|>",
        "{}",
        "hi",
        "</s>",
    ];
    let pieces: Vec<Vec<u8>> = words.iter().map(|w| w.as_bytes().to_vec()).collect();
    let eog = (0..pieces.len()).map(|i| i == pieces.len() - 1).collect();
    let vocab = Arc::new(GrammarVocab::new(pieces.clone(), eog));
    let grammar =
        Arc::new(Grammar::parse(r##"root ::= " to=" [a-z.]+ "<|message|>" "{}""##).unwrap());
    let pattern = r"(?:^|<\|start\|>assistant)( to=(?!self<\|message\|>)[^<]*?<\|message\|>)";
    let trig = triggers(vec![], &[(TriggerKind::Pattern, pattern)]);
    fn p(w: &str) -> &[u8] {
        w.as_bytes()
    }
    let mut s = lazy_sampler(&grammar, &vocab, &trig);
    feed(
        &mut s,
        &pieces,
        &[
            p("hi"),
            p("<|start|>"),
            p("assistant"),
            p(" to="),
            p("self"),
            p("<|message|>"),
        ],
    );
    assert!(s.grammar_awaiting_trigger());
    feed(
        &mut s,
        &pieces,
        &[p("hi"), p("<|start|>"), p("assistant"), p(" to=")],
    );
    assert!(s.grammar_awaiting_trigger());
    feed(&mut s, &pieces, &[p("functions.get"), p("<|message|>")]);
    assert_eq!(lazy_allowed(&s), vec![tok(&pieces, b"{}")]);
    feed(&mut s, &pieces, &[p("{}")]);
    assert!(s.grammar_must_end());
    // At the start of the text.
    let mut s = lazy_sampler(&grammar, &vocab, &trig);
    feed(&mut s, &pieces, &[p(" to="), p("functions.get")]);
    assert!(s.grammar_awaiting_trigger());
    feed(&mut s, &pieces, &[p("<|message|>")]);
    assert_eq!(lazy_allowed(&s), vec![tok(&pieces, b"{}")]);
    // Not after other text.
    let mut s = lazy_sampler(&grammar, &vocab, &trig);
    feed(
        &mut s,
        &pieces,
        &[p("hi"), p(" to="), p("functions.get"), p("<|message|>")],
    );
    assert!(s.grammar_awaiting_trigger());
}

#[test]
fn a_trigger_split_across_three_tokens() {
    let (pieces, vocab) = lazy_vocab();
    let grammar = tool_grammar();
    let trig = triggers(vec![], &[(TriggerKind::Word, "<tool>")]);
    let want = allowed_after(&grammar, &vocab, "<tool>");
    let splits: [&[&[u8]]; 3] = [
        &[b"ab", b"<", b"to", b"ol>"],
        &[b"ab<to", b"ol", b">"],
        &[b"<", b"to", b"ol", b">"],
    ];
    for split in splits {
        let (last, before) = split.split_last().unwrap();
        let mut s = lazy_sampler(&grammar, &vocab, &trig);
        feed(&mut s, &pieces, before);
        assert!(s.grammar_awaiting_trigger(), "{split:?}");
        feed(&mut s, &pieces, &[last]);
        assert_eq!(lazy_allowed(&s), want, "{split:?}");
    }
}

#[test]
fn utf8_split_across_tokens_around_a_trigger() {
    let (pieces, vocab) = lazy_vocab();
    let grammar = tool_grammar();
    let trig = triggers(vec![], &[(TriggerKind::Word, "<tool>")]);
    let want = allowed_after(&grammar, &vocab, "<tool>");
    // "é" split before the trigger, its second byte in the token the trigger starts inside.
    let mut s = lazy_sampler(&grammar, &vocab, &trig);
    feed(&mut s, &pieces, &[&[0xC3], b"\xa9<to"]);
    assert!(s.grammar_awaiting_trigger());
    feed(&mut s, &pieces, &[b"ol>"]);
    assert_eq!(lazy_allowed(&s), want);
    // Bytes that are not UTF-8 before the trigger (a stray continuation byte, a lead byte
    // with none) do not hide it, nor move its start.
    for bad in [&[0xA9u8] as &[u8], &[0xC3], &[0xC3, 0xC3]] {
        let mut s = lazy_sampler(&grammar, &vocab, &trig);
        for &b in bad {
            feed(&mut s, &pieces, &[&[b]]);
        }
        feed(&mut s, &pieces, &[b"x", b"<", b"to", b"ol>"]);
        assert_eq!(lazy_allowed(&s), want, "{bad:?}");
    }
    // The token the trigger starts inside ends inside "é": the grammar keeps that first byte
    // pending, and only its continuation may follow.
    let mut s = lazy_sampler(&grammar, &vocab, &trig);
    feed(&mut s, &pieces, &[b"a<tool>\xc3"]);
    assert_eq!(lazy_allowed(&s), vec![tok(&pieces, &[0xA9])]);
    feed(&mut s, &pieces, &[&[0xA9]]);
    assert_eq!(lazy_allowed(&s), allowed_after(&grammar, &vocab, "<tool>é"));
    // A trigger ending in a character split across tokens fires once the character is whole.
    let trig = triggers(vec![], &[(TriggerKind::Word, "xé")]);
    let grammar = Arc::new(Grammar::parse(r##"root ::= "xé" "c"+ ".""##).unwrap());
    let mut s = lazy_sampler(&grammar, &vocab, &trig);
    feed(&mut s, &pieces, &[b"a", b"x", &[0xC3]]);
    assert!(s.grammar_awaiting_trigger());
    feed(&mut s, &pieces, &[&[0xA9]]);
    assert_eq!(lazy_allowed(&s), allowed_after(&grammar, &vocab, "xé"));
}

#[test]
fn triggers_refuse_bad_patterns_and_no_triggers() {
    let err = Triggers::new(vec![], &[]).unwrap_err();
    assert_eq!(err, "a lazy grammar needs at least one trigger");
    for (kind, pattern, named) in [
        (TriggerKind::Pattern, "a(b", "\"a(b\""),
        (TriggerKind::PatternFull, "[x", "\"^[x$\""),
        (TriggerKind::Pattern, r"(?<=a+)b", "(?<=a+)b"),
    ] {
        let err = Triggers::new(vec![1], &[(kind, pattern.to_string())]).unwrap_err();
        assert!(
            err.contains(named) && err.contains("does not compile"),
            "{err}"
        );
    }
    // A word is literal; tokens alone are enough.
    let t = Triggers::new(vec![], &[(TriggerKind::Word, "a(b".to_string())]).unwrap();
    assert_eq!(t.patterns(), [r"a\(b"]);
    assert_eq!(Triggers::new(vec![3], &[]).unwrap().tokens(), [3]);
    let t = Triggers::new(vec![], &[(TriggerKind::PatternFull, String::new())]).unwrap();
    assert_eq!(t.patterns(), ["^$"]);
}

#[test]
fn reset_makes_a_lazy_grammar_await_its_trigger_again() {
    let (pieces, vocab) = lazy_vocab();
    let grammar = tool_grammar();
    let trig = triggers(vec![], &[(TriggerKind::Word, "<tool>")]);
    let mut s = lazy_sampler(&grammar, &vocab, &trig);
    feed(&mut s, &pieces, &[b"<tool>", b"x"]);
    assert!(!s.grammar_awaiting_trigger() && !s.is_argmax());
    s.reset();
    assert!(s.grammar_awaiting_trigger() && s.is_argmax() && s.has_grammar());
    // Unconstrained again, with an empty buffer: "ab<to" before the reset is forgotten.
    feed(&mut s, &pieces, &[b"b", b"ab<to"]);
    s.reset();
    feed(&mut s, &pieces, &[b"ol>x"]);
    assert!(s.grammar_awaiting_trigger());
    feed(&mut s, &pieces, &[b"<tool>"]);
    assert_eq!(lazy_allowed(&s), allowed_after(&grammar, &vocab, "<tool>"));
}

#[test]
fn a_trigger_pattern_that_fails_at_run_time_fails_the_grammar() {
    // Catastrophic backtracking past fancy-regex's limit: a grammar failure naming the pattern,
    // no panic, no hang.
    let (pieces, vocab) = lazy_vocab();
    let grammar = tool_grammar();
    let pattern = "(a|b|ab)*(?=c)";
    let trig = triggers(vec![], &[(TriggerKind::Pattern, pattern)]);
    let mut s = lazy_sampler(&grammar, &vocab, &trig);
    let ab = tok(&pieces, b"ab");
    let mut failed = None;
    for i in 0..200 {
        if let Err(e) = s.accept_generated(ab) {
            failed = Some((i, e.to_string()));
            break;
        }
    }
    let (at, msg) = failed.expect("the backtracking limit is reached");
    assert!(at > 5, "{at}");
    assert!(msg.contains(pattern), "{msg}");
    assert_eq!(s.grammar_failure(), Some(msg));
    assert!(!s.grammar_awaiting_trigger() && !s.is_argmax() && !s.grammar_must_end());
    let row = vec![1.0f32; pieces.len()];
    assert_eq!(s.try_sample(&row), None);
    assert!(s.accept_generated(ab).is_err());
    s.reset();
    assert!(s.grammar_awaiting_trigger() && s.grammar_failure().is_none());
    assert_eq!(s.try_sample(&row), Some(0));
}

#[test]
fn samplers_and_triggers_are_send_and_sync() {
    fn send_sync<T: Send + Sync>() {}
    send_sync::<Sampler>();
    send_sync::<Triggers>();
}

#[test]
fn banned_tokens_pick_as_a_minus_infinity_bias_on_every_path() {
    // `set_banned` (ignore_eos's ban of the end tokens) picks what a -inf bias on those tokens
    // picks (llama-server's way), from the whole row and from the backend's top candidates
    // (`top_k_of` asks for k + banned), step after step; rows where a banned token is the
    // maximum are made often.
    let mut rng = Mt::new(77);
    let n = 1000;
    for (i, &(t, k, tp)) in [
        (0.0f32, 40usize, 1.0f32),
        (0.0, 0, 1.0),
        (0.8, 40, 0.95),
        (1.3, 5, 1.0),
        (0.5, 1, 0.9),
        (1.0, 0, 0.9),
    ]
    .iter()
    .enumerate()
    {
        let banned: Vec<u32> = vec![997, 3, 512];
        let params = SamplerParams {
            temperature: t,
            top_k: k,
            top_p: tp,
            seed: 300 + i as u64,
            ..Default::default()
        };
        let mut biased = params.clone();
        biased.logit_bias = banned.iter().map(|&id| (id, f32::NEG_INFINITY)).collect();
        biased.logit_bias.sort_by_key(|&(id, _)| id);
        let mut want_s = Sampler::new(biased);
        let mut row_s = Sampler::new(params.clone());
        let mut top_s = Sampler::new(params.clone());
        row_s.set_banned(banned.clone());
        top_s.set_banned(banned.clone());
        assert!(!row_s.is_argmax(), "set {i}");
        // Greedy and top-k below the vocabulary keep a candidates' path.
        let fast = t <= 0.0 || (k > 0 && k < n);
        assert_eq!(top_s.top_k_of(n).is_some(), fast, "set {i}");
        for step in 0..80 {
            let mut l = random_logits(&mut rng, n, 2.0);
            if step % 3 == 0 {
                // A banned token on top, another second.
                l[banned[step % 3] as usize] = 50.0;
                l[banned[(step + 1) % 3] as usize] = 40.0;
            }
            let want = want_s.try_sample(&l).unwrap();
            assert!(!banned.contains(&want));
            assert_eq!(
                row_s.try_sample(&l),
                Some(want),
                "set {i} step {step} (row)"
            );
            if let Some(kk) = top_s.top_k_of(n) {
                assert_eq!(
                    kk,
                    k.max(1).min(if t <= 0.0 { 1 } else { k }) + banned.len()
                );
                let got = top_s.try_sample_top_k(top_k_logits(&l, kk));
                assert_eq!(got, Some(want), "set {i} step {step} (top {kk})");
            } else {
                top_s.try_sample(&l);
            }
            for s in [&mut want_s, &mut row_s, &mut top_s] {
                s.accept(want);
            }
        }
    }
}
