//! The scheduler on the shipped default model, stepped by hand: concurrent requests get what
//! they get alone (bit for bit), prefill is chunked so running streams keep their pace, a
//! cached prefix is reused and reported, a client that goes away frees its slot within a step,
//! and more requests than slots wait their turn.

use muser_engine::{LoadOptions, Model};
use muser_sample::SamplerParams;
use muser_server::api::Generation;
use muser_server::metrics::Metrics;
use muser_server::scheduler::{scored_chunk, Engine, Event, Finish, FinishReason, Job, CHUNK_IDLE};
use muser_tokenizer::Tokenizer;
use std::sync::atomic::Ordering::Relaxed;
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver};

fn model() -> (Model, Tokenizer) {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../models/muse-default.gguf"
    );
    let m = Model::load(
        path,
        &LoadOptions {
            threads: Some(2),
            ..Default::default()
        },
    )
    .unwrap();
    let t = Tokenizer::from_gguf(m.gguf()).unwrap();
    (m, t)
}

fn greedy(max_tokens: usize) -> Generation {
    Generation {
        params: SamplerParams::greedy(),
        max_tokens: Some(max_tokens),
        stop: Vec::new(),
        logprobs: Some(2),
        echo: false,
        stream: true,
        include_usage: false,
        ignore_eos: false,
        grammar: None,
        preserved: Vec::new(),
    }
}

/// A job as a handler makes it (counted as queued).
fn submit(
    e: &mut Engine<'_, muser_engine::CpuBackend>,
    m: &Metrics,
    prompt: Vec<u32>,
    gen: Generation,
) -> UnboundedReceiver<Event> {
    let (tx, rx) = unbounded_channel();
    m.queued.fetch_add(1, Relaxed);
    e.push(Job {
        prompt,
        max_tokens: gen.max_tokens.unwrap(),
        gen,
        events: tx,
        ticket: Default::default(),
    });
    rx
}

/// A token's id, its logprob's bits, and the (id, logprob bits) of the alternatives.
type TokenBits = (u32, u32, Vec<(u32, u32)>);

/// What a request got: its text, every logprob's bits, and how it ended.
#[derive(Debug, PartialEq)]
struct Answer {
    text: String,
    logprobs: Vec<TokenBits>,
    finish: Option<(FinishReason, usize, usize)>,
    /// An echo's text and its tokens' logprobs (the first none).
    echo: Option<(String, Vec<Option<TokenBits>>)>,
}

fn bits(l: &muser_server::scheduler::Logprob) -> TokenBits {
    let top = l.top.iter().map(|&(i, p)| (i, p.to_bits())).collect();
    (l.id, l.logprob.to_bits(), top)
}

fn drain(rx: &mut UnboundedReceiver<Event>, a: &mut Answer) -> usize {
    let mut tokens = 0;
    while let Ok(ev) = rx.try_recv() {
        match ev {
            Event::Token {
                id, text, logprob, ..
            } => {
                a.text.push_str(&text);
                if let Some(l) = logprob {
                    assert_eq!(id, Some(l.id), "a token's event names the token it carries");
                    tokens += 1;
                    a.logprobs.push(bits(&l));
                }
            }
            Event::Done(Finish {
                reason,
                prompt_tokens,
                completion_tokens,
                ..
            }) => a.finish = Some((reason, prompt_tokens, completion_tokens)),
            Event::Error(e) => panic!("engine error: {e}"),
            Event::Prompt(e) => {
                assert!(
                    a.echo.is_none() && a.text.is_empty(),
                    "the echo comes first, once"
                );
                let lps = e.lps.unwrap_or_default();
                assert!(lps
                    .iter()
                    .zip(&e.ids)
                    .all(|(l, &id)| l.as_ref().is_none_or(|l| l.id == id)));
                a.echo = Some((e.text, lps.iter().map(|l| l.as_ref().map(bits)).collect()));
            }
        }
    }
    tokens
}

fn answer() -> Answer {
    Answer {
        text: String::new(),
        logprobs: Vec::new(),
        finish: None,
        echo: None,
    }
}

/// Runs the prompts together on an engine of `parallel` slots until all are done.
fn run_together(
    m: &Model,
    tok: &Tokenizer,
    parallel: usize,
    prompts: &[Vec<u32>],
    max_tokens: usize,
) -> Vec<Answer> {
    let gens = prompts.iter().map(|_| greedy(max_tokens)).collect();
    run_gens(m, tok, parallel, prompts, gens)
}

/// `run_together` with each request's own generation settings.
fn run_gens(
    m: &Model,
    tok: &Tokenizer,
    parallel: usize,
    prompts: &[Vec<u32>],
    gens: Vec<Generation>,
) -> Vec<Answer> {
    run_counted(m, tok, parallel, prompts, gens).0
}

/// `run_gens`, with the engine's metrics at the end.
fn run_counted(
    m: &Model,
    tok: &Tokenizer,
    parallel: usize,
    prompts: &[Vec<u32>],
    gens: Vec<Generation>,
) -> (Vec<Answer>, Metrics) {
    let metrics = Metrics::default();
    let mut e = Engine::new(m, tok, &metrics, parallel, 512).unwrap();
    let mut rxs: Vec<_> = prompts
        .iter()
        .zip(gens)
        .map(|(p, g)| submit(&mut e, &metrics, p.clone(), g))
        .collect();
    let mut answers: Vec<Answer> = prompts.iter().map(|_| answer()).collect();
    let mut steps = 0;
    while e.busy() {
        e.step();
        steps += 1;
        assert!(metrics.running.load(Relaxed) as usize <= parallel);
        assert!(steps < 10_000, "the engine does not finish");
        for (rx, a) in rxs.iter_mut().zip(&mut answers) {
            drain(rx, a);
        }
    }
    drop(e);
    assert_eq!(metrics.queued.load(Relaxed), 0);
    assert_eq!(
        metrics.requests_finished.load(Relaxed) as usize,
        prompts.len()
    );
    (answers, metrics)
}

const TEXTS: [&str; 16] = [
    "Once upon a time",
    "The meaning of life is",
    "A penny saved",
    "You will",
    "Q: Why did the chicken cross the road?\nA:",
    "Never",
    "It is a truth universally acknowledged",
    "Love",
    "In the beginning",
    "The best way to predict the future",
    "He who laughs last",
    "Today",
    "There are two kinds of people",
    "If at first you don't succeed,",
    "Beware of",
    "Your lucky number is",
];

#[test]
fn sixteen_concurrent_requests_match_their_solo_runs() {
    let (m, tok) = model();
    let prompts: Vec<Vec<u32>> = TEXTS.iter().map(|t| tok.encode(t, true, true)).collect();
    let together = run_together(&m, &tok, 16, &prompts, 24);
    for (p, got) in prompts.iter().zip(&together) {
        let alone = run_together(&m, &tok, 1, std::slice::from_ref(p), 24);
        assert_eq!(got, &alone[0]);
        assert!(got.finish.is_some());
    }
    // More requests than slots: the same answers again, four at a time.
    assert_eq!(run_together(&m, &tok, 4, &prompts, 24), together);
}

#[test]
fn prompts_arriving_together_share_one_prefill_pass() {
    let (m, tok) = model();
    let metrics = Metrics::default();
    let mut e = Engine::new(&m, &tok, &metrics, 16, 512).unwrap();
    let mut rxs: Vec<_> = TEXTS
        .iter()
        .map(|t| submit(&mut e, &metrics, tok.encode(t, true, true), greedy(4)))
        .collect();
    e.step();
    // One pass for all 16 prompts, and each request has its first token.
    assert_eq!(metrics.prefill_passes.load(Relaxed), 1);
    for (i, rx) in rxs.iter_mut().enumerate() {
        let mut a = answer();
        assert_eq!(drain(rx, &mut a), 1, "request {i}");
    }
}

#[test]
fn greedy_requests_without_logprobs_get_the_same_tokens() {
    // Requests with no logprobs take their picks from the backend (decode_picks) while the
    // others in the same decode groups read their logits: every text and ending is the one the
    // request gets with logprobs on.
    let (m, tok) = model();
    let prompts: Vec<Vec<u32>> = TEXTS.iter().map(|t| tok.encode(t, true, true)).collect();
    let want = run_together(&m, &tok, 16, &prompts, 24);
    let gens = (0..prompts.len())
        .map(|i| {
            let mut g = greedy(24);
            if i % 3 != 1 {
                g.logprobs = None;
            }
            g
        })
        .collect();
    let got = run_gens(&m, &tok, 16, &prompts, gens);
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        assert_eq!((&g.text, g.finish), (&w.text, w.finish), "request {i}");
        if i % 3 == 1 {
            assert_eq!(g.logprobs, w.logprobs, "request {i}");
        } else {
            assert!(g.logprobs.is_empty(), "request {i}");
        }
    }
}

#[test]
fn sampled_requests_without_logprobs_get_the_same_tokens() {
    // Sampling with top-k and no logprobs takes the backend's top-k candidates (decode_rows),
    // with logprobs the whole row: the same seeded draws either way, alone or together.
    let (m, tok) = model();
    let prompts: Vec<Vec<u32>> = TEXTS.iter().map(|t| tok.encode(t, true, true)).collect();
    let sampled = |i: usize, logprobs: bool| {
        let mut g = greedy(24);
        g.params = SamplerParams {
            seed: 1000 + i as u64,
            top_k: [40, 5, 64, 12][i % 4],
            ..Default::default()
        };
        g.logprobs = logprobs.then_some(2);
        g
    };
    let with = run_gens(
        &m,
        &tok,
        16,
        &prompts,
        (0..16).map(|i| sampled(i, true)).collect(),
    );
    let without = run_gens(
        &m,
        &tok,
        16,
        &prompts,
        (0..16).map(|i| sampled(i, i % 3 != 1)).collect(),
    );
    for (i, (a, b)) in with.iter().zip(&without).enumerate() {
        assert_eq!((&a.text, a.finish), (&b.text, b.finish), "request {i}");
    }
    let alone = run_gens(&m, &tok, 1, &prompts[5..6], vec![sampled(5, false)]);
    assert_eq!(alone[0].text, with[5].text);
    // Sampled, not greedy: the texts are not all the greedy ones.
    let greedy_texts = run_together(&m, &tok, 16, &prompts, 24);
    assert!(with
        .iter()
        .zip(&greedy_texts)
        .any(|(a, g)| a.text != g.text));
}

#[test]
fn grammar_requests_follow_their_grammar_alone_or_together() {
    // Half the requests hold to a grammar (sampled, with and without logprobs), a quarter to a
    // lazy one (from its trigger on), a quarter to none: each constrained answer is in its
    // grammar's language and ends where it does, and every request gets what it gets alone.
    let (m, tok) = model();
    let prompts: Vec<Vec<u32>> = TEXTS[..8]
        .iter()
        .map(|t| tok.encode(t, true, true))
        .collect();
    let text = r#"root ::= ("yes" | "no") (" " [a-z]{2,6}){1,3} "."
"#;
    let grammar = muser_server::constrain::parse_gbnf(text, &tok).unwrap();
    let constraint = muser_server::constrain::Constraint {
        gbnf: text.into(),
        grammar: std::sync::Arc::new(grammar),
        vocab: std::sync::Arc::new(muser_server::constrain::grammar_vocab(&tok)),
        triggers: None,
        triggers_json: Vec::new(),
        field: "grammar",
    };
    // A lazy grammar: free text up to the first "e", then "e", up to 30 characters that are
    // not "!", and "!".
    let lazy_text = r#"root ::= "e" [^!]{0,30} "!""#;
    let lazy = muser_server::constrain::Constraint {
        gbnf: lazy_text.into(),
        grammar: std::sync::Arc::new(muser_server::constrain::parse_gbnf(lazy_text, &tok).unwrap()),
        vocab: constraint.vocab.clone(),
        triggers: Some(std::sync::Arc::new(
            muser_sample::Triggers::new(vec![], &[(muser_sample::TriggerKind::Word, "e".into())])
                .unwrap(),
        )),
        triggers_json: Vec::new(),
        field: "grammar",
    };
    let gen = |i: usize| {
        let mut g = greedy(48);
        g.params = SamplerParams {
            seed: 77 + i as u64,
            temperature: [0.0, 0.9, 1.5][i % 3],
            ..Default::default()
        };
        g.logprobs = (i % 4 == 1).then_some(2);
        g.grammar = match i % 4 {
            0 | 2 => Some(constraint.clone()),
            3 => Some(lazy.clone()),
            _ => None,
        };
        g
    };
    let together = run_gens(&m, &tok, 8, &prompts, (0..8).map(gen).collect());
    let re = fancy_regex::Regex::new(r"^(yes|no)( [a-z]{2,6}){1,3}\.$").unwrap();
    let lazy_re = fancy_regex::Regex::new(r"^[^e]*e[^!]{0,30}!$").unwrap();
    for (i, a) in together.iter().enumerate() {
        let alone = run_gens(&m, &tok, 1, &prompts[i..i + 1], vec![gen(i)]);
        assert_eq!(alone[0], *a, "request {i}");
        if i.is_multiple_of(2) {
            assert!(re.is_match(&a.text).unwrap(), "request {i}: {:?}", a.text);
            assert_eq!(a.finish.unwrap().0, FinishReason::Stop, "request {i}");
        } else if i % 4 == 3 {
            assert!(
                lazy_re.is_match(&a.text).unwrap(),
                "request {i}: {:?}",
                a.text
            );
            assert_eq!(a.finish.unwrap().0, FinishReason::Stop, "request {i}");
        } else {
            assert!(!re.is_match(&a.text).unwrap(), "request {i}: {:?}", a.text);
        }
    }
}

#[test]
fn ignore_eos_runs_to_max_tokens() {
    // Greedy requests that end on an end-of-generation token run on to max_tokens with
    // ignore_eos, their text up to that token unchanged, and no end token is ever picked
    // (llama-server bans them).
    let (m, tok) = model();
    let prompts: Vec<Vec<u32>> = TEXTS.iter().map(|t| tok.encode(t, true, true)).collect();
    let plain = run_together(&m, &tok, 16, &prompts, 96);
    let ended: Vec<usize> = (0..prompts.len())
        .filter(|&i| plain[i].finish.is_some_and(|f| f.0 == FinishReason::Stop))
        .collect();
    assert!(!ended.is_empty(), "no request ended on its own: {plain:?}");
    let gens = (0..prompts.len())
        .map(|_| {
            let mut g = greedy(96);
            g.ignore_eos = true;
            g
        })
        .collect();
    let got = run_gens(&m, &tok, 16, &prompts, gens);
    for (i, (g, p)) in got.iter().zip(&plain).enumerate() {
        let f = g.finish.unwrap();
        assert_eq!((f.0, f.2), (FinishReason::Length, 96), "request {i}");
        assert!(g.text.starts_with(&p.text), "request {i}");
        assert!(g.logprobs.iter().all(|l| !tok.is_eog(l.0)), "request {i}");
        if ended.contains(&i) {
            assert!(p.finish.unwrap().2 < 96, "request {i}");
        }
    }
}

#[test]
fn prefill_is_chunked_so_decodes_keep_their_pace() {
    let (m, tok) = model();
    let metrics = Metrics::default();
    let mut e = Engine::new(&m, &tok, &metrics, 2, 1024).unwrap();
    let mut rx_a = submit(
        &mut e,
        &metrics,
        tok.encode("Once", true, true),
        greedy(200),
    );
    let mut a = answer();
    e.step();
    assert_eq!(drain(&mut rx_a, &mut a), 1);

    // A 300-token prompt arrives while A decodes: 64-token chunks, one per step, and A gets a
    // token every step.
    let long = long_prompt(&tok, 300);
    let mut rx_b = submit(&mut e, &metrics, long, greedy(4));
    let mut b = answer();
    for step in 1..=5 {
        let before = metrics.prompt_tokens.load(Relaxed);
        e.step();
        assert_eq!(drain(&mut rx_a, &mut a), 1, "step {step}");
        let chunk = metrics.prompt_tokens.load(Relaxed) - before;
        assert_eq!(chunk, if step < 5 { 64 } else { 300 - 256 });
        drain(&mut rx_b, &mut b);
        // The first token (or an end-of-generation token at once) after the last chunk only.
        let answered = !b.logprobs.is_empty() || b.finish.is_some();
        assert_eq!(answered, step == 5, "step {step}");
    }

    // Alone, a prompt is prefilled in chunks of 512.
    let metrics = Metrics::default();
    let mut e = Engine::new(&m, &tok, &metrics, 2, 1024).unwrap();
    let mut rx = submit(&mut e, &metrics, long_prompt(&tok, 600), greedy(4));
    let mut c = answer();
    e.step();
    assert_eq!(metrics.prompt_tokens.load(Relaxed), 512);
    drain(&mut rx, &mut c);
    assert!(c.logprobs.is_empty() && c.finish.is_none());
    e.step();
    assert_eq!(metrics.prompt_tokens.load(Relaxed), 600);
    drain(&mut rx, &mut c);
    assert!(!c.logprobs.is_empty() || c.finish.is_some());
}

#[test]
fn timings_cover_the_prefill_then_the_decode() {
    // A 600-token prompt alone: step 1 prefills 512 tokens, step 2 the other 88 and samples the
    // first token, steps 3-9 decode the other 7 (ignore_eos). The request's prompt time spans
    // both prefill parts, its decode time the steps after them.
    let (m, tok) = model();
    let metrics = Metrics::default();
    let mut e = Engine::new(&m, &tok, &metrics, 2, 1024).unwrap();
    let mut g = greedy(8);
    g.ignore_eos = true;
    let mut rx = submit(&mut e, &metrics, long_prompt(&tok, 600), g);
    let mut steps_ms = Vec::new();
    while e.busy() {
        let t = std::time::Instant::now();
        e.step();
        steps_ms.push(t.elapsed().as_secs_f64() * 1e3);
    }
    assert_eq!(steps_ms.len(), 9);
    let mut f = None;
    while let Ok(ev) = rx.try_recv() {
        if let Event::Done(d) = ev {
            f = Some(d);
        }
    }
    let f = f.expect("the request finished");
    assert_eq!(
        (f.prompt_tokens, f.cached_tokens, f.completion_tokens),
        (600, 0, 8)
    );
    let (first, second) = (steps_ms[0], steps_ms[1]);
    let decode: f64 = steps_ms[2..].iter().sum();
    assert!(
        f.prompt_ms >= 0.5 * first && f.prompt_ms <= first + second,
        "prompt {} ms, steps {steps_ms:?}",
        f.prompt_ms
    );
    assert!(
        f.predicted_ms >= 0.5 * (decode - steps_ms[8]) && f.predicted_ms <= second + decode,
        "decode {} ms, steps {steps_ms:?}",
        f.predicted_ms
    );
}

/// `n` tokens of text.
fn long_prompt(tok: &Tokenizer, n: usize) -> Vec<u32> {
    let text = TEXTS.join(" ").repeat(1 + n / 50);
    let t = tok.encode(&text, true, true);
    assert!(t.len() >= n);
    t[..n].to_vec()
}

#[test]
fn a_cached_prefix_is_reused_and_reported() {
    let (m, tok) = model();
    let metrics = Metrics::default();
    let mut e = Engine::new(&m, &tok, &metrics, 1, 512).unwrap();
    let p = tok.encode(
        "A journey of a thousand miles begins with a single step, and then another",
        true,
        true,
    );
    let mut q = p[..p.len() - 4].to_vec();
    q.extend(tok.encode(" and ends with a nap", false, false));
    let cached = |e: &mut Engine<'_, _>, prompt: &Vec<u32>| {
        let mut rx = submit(e, &metrics, prompt.clone(), greedy(6));
        while e.busy() {
            e.step();
        }
        let mut out = None;
        while let Ok(ev) = rx.try_recv() {
            if let Event::Done(f) = ev {
                out = Some(f.cached_tokens);
            }
        }
        out.unwrap()
    };
    assert_eq!(cached(&mut e, &p), 0);
    assert_eq!(cached(&mut e, &q), p.len() - 4);
    // The same prompt again: all but the last token (it must run to give logits).
    assert_eq!(cached(&mut e, &q), q.len() - 1);
    assert_eq!(
        metrics.cached_tokens.load(Relaxed) as usize,
        p.len() - 4 + q.len() - 1
    );

    // A reused prefix changes nothing in the answer.
    let reused = {
        let mut rx = submit(&mut e, &metrics, q.clone(), greedy(6));
        let mut a = answer();
        while e.busy() {
            e.step();
            drain(&mut rx, &mut a);
        }
        a
    };
    let fresh = run_together(&m, &tok, 1, std::slice::from_ref(&q), 6);
    assert_eq!(reused, fresh[0]);
}

/// Requests sharing a long prefix (a request's choices, one long system prompt) arriving
/// together: the first computes it, the others wait for that prefill and copy it into their
/// slots instead of computing it again (reported as cached and copied tokens), and each gets
/// what it gets alone, bit for bit.
#[test]
fn a_shared_prefix_is_computed_once_and_copied() {
    let (m, tok) = model();
    for (len, cut) in [(300, 200), (480, 450), (90, 40)] {
        let base = long_prompt(&tok, len);
        let mut other = base[..cut].to_vec();
        other.extend(tok.encode(" and then a nap", false, false));
        let prompts = [base.clone(), base.clone(), other.clone(), base.clone()];
        let metrics = Metrics::default();
        let mut e = Engine::new(&m, &tok, &metrics, 4, 2048).unwrap();
        let mut rxs: Vec<_> = prompts
            .iter()
            .map(|p| submit(&mut e, &metrics, p.clone(), greedy(8)))
            .collect();
        let mut answers: Vec<Answer> = prompts.iter().map(|_| answer()).collect();
        let mut cached = vec![None; prompts.len()];
        while e.busy() {
            e.step();
            for (i, rx) in rxs.iter_mut().enumerate() {
                while let Ok(ev) = rx.try_recv() {
                    match ev {
                        Event::Done(f) => {
                            cached[i] = Some(f.cached_tokens);
                            answers[i].finish =
                                Some((f.reason, f.prompt_tokens, f.completion_tokens));
                        }
                        Event::Token {
                            id, text, logprob, ..
                        } => {
                            answers[i].text.push_str(&text);
                            if let (Some(_), Some(l)) = (id, logprob) {
                                answers[i].logprobs.push(bits(&l));
                            }
                        }
                        Event::Error(e) => panic!("{e:?}"),
                        Event::Prompt(_) => panic!("no echo was asked for"),
                    }
                }
            }
        }
        for (p, got) in prompts.iter().zip(&answers) {
            let alone = run_together(&m, &tok, 1, std::slice::from_ref(p), 8);
            assert_eq!(got, &alone[0], "len {len}");
        }
        let want = [0, len - 1, cut, len - 1];
        assert_eq!(cached, want.map(Some), "len {len}");
        let copied = (len - 1) * 2 + cut;
        assert_eq!(metrics.copied_tokens.load(Relaxed) as usize, copied);
        // each prompt position computed once
        let computed = len + 1 + (other.len() - cut) + 1;
        assert_eq!(
            metrics.prompt_tokens.load(Relaxed) as usize,
            computed,
            "len {len}"
        );
    }
}

#[test]
fn a_client_that_goes_away_frees_its_slot_within_one_step() {
    let (m, tok) = model();
    let metrics = Metrics::default();
    let mut e = Engine::new(&m, &tok, &metrics, 1, 512).unwrap();
    let rx_a = submit(
        &mut e,
        &metrics,
        tok.encode("Once", true, true),
        greedy(400),
    );
    let rx_b = submit(
        &mut e,
        &metrics,
        tok.encode("Twice", true, true),
        greedy(400),
    );
    for _ in 0..3 {
        e.step();
    }
    assert_eq!(metrics.running.load(Relaxed), 1);
    assert_eq!(metrics.queued.load(Relaxed), 1);
    drop(rx_b); // the waiting client goes away
    e.step();
    assert_eq!(metrics.queued.load(Relaxed), 0);
    drop(rx_a); // and the running one
    e.step();
    assert!(!e.busy());
    assert_eq!(metrics.running.load(Relaxed), 0);
    assert_eq!(metrics.requests_cancelled.load(Relaxed), 2);
    assert!(metrics.generated_tokens.load(Relaxed) < 10);
}

#[test]
fn stop_strings_and_lengths_end_requests() {
    let (m, tok) = model();
    let prompt = tok.encode("Once upon a time", true, true);
    let full = run_together(&m, &tok, 1, std::slice::from_ref(&prompt), 30).remove(0);
    assert_eq!(full.finish, Some((FinishReason::Length, prompt.len(), 30)));
    // Stop at a word the greedy text contains: the text ends right before it.
    let word = full.text.split_whitespace().nth(2).unwrap().to_string();
    let at = full.text.find(&word).unwrap();
    let metrics = Metrics::default();
    let mut e = Engine::new(&m, &tok, &metrics, 1, 512).unwrap();
    let mut gen = greedy(30);
    gen.stop = vec![word.clone()];
    let mut rx = submit(&mut e, &metrics, prompt.clone(), gen);
    let mut a = answer();
    while e.busy() {
        e.step();
        drain(&mut rx, &mut a);
    }
    assert_eq!(a.text, full.text[..at], "stop {word:?}");
    assert_eq!(a.finish.unwrap().0, FinishReason::Stop);
}

/// A request whose every token is banned has nothing to be given: it ends with an error, not
/// with a token it never allowed, and the request beside it gets what it gets alone.
#[test]
fn a_request_with_no_token_to_pick_ends_with_an_error() {
    let (m, tok) = model();
    let metrics = Metrics::default();
    let mut e = Engine::new(&m, &tok, &metrics, 2, 512).unwrap();
    let n_vocab = m.config.n_vocab as u32;
    let mut banned = greedy(8);
    banned.params.temperature = 0.8;
    banned.params.logit_bias = (0..n_vocab).map(|id| (id, f32::NEG_INFINITY)).collect();
    let p = tok.encode(TEXTS[0], true, true);
    let mut rx_banned = submit(&mut e, &metrics, p.clone(), banned);
    let mut rx_plain = submit(&mut e, &metrics, p.clone(), greedy(8));
    let mut plain = answer();
    let (mut error, mut tokens) = (None, 0);
    let mut steps = 0;
    while e.busy() {
        e.step();
        steps += 1;
        assert!(steps < 1_000, "the engine does not finish");
        drain(&mut rx_plain, &mut plain);
        while let Ok(ev) = rx_banned.try_recv() {
            match ev {
                Event::Token { id: Some(_), .. } => tokens += 1,
                Event::Error(e) => error = Some(e.message),
                _ => {}
            }
        }
    }
    assert_eq!(tokens, 0, "no token is handed out");
    assert!(
        error
            .as_deref()
            .is_some_and(|m| m.contains("no token can be sampled")),
        "{error:?}"
    );
    assert_eq!(plain, run_together(&m, &tok, 1, &[p], 8).remove(0));
    assert_eq!(metrics.running.load(Relaxed), 0);
}

#[test]
fn a_scored_prompt_gets_the_logprobs_its_tokens_get_when_generated() {
    // Echo with logprobs and max_tokens 0: each prompt token's logprob given the tokens before
    // it, scored in passes (one of `scored_chunk` alone, of `CHUNK_BUSY` beside decodes); those
    // of a greedy request's own output are, bit for bit, the logprobs it got generating them,
    // alone or beside decoding requests.
    let (m, tok) = model();
    let p = long_prompt(&tok, 150);
    let to_40 = Generation {
        ignore_eos: true,
        ..greedy(40)
    };
    let solo = run_gens(&m, &tok, 1, std::slice::from_ref(&p), vec![to_40]);
    let generated: Vec<u32> = solo[0].logprobs.iter().map(|t| t.0).collect();
    assert_eq!(generated.len(), 40);
    let full: Vec<u32> = p.iter().chain(&generated).copied().collect();
    let scored = Generation {
        echo: true,
        ..greedy(0)
    };
    let alone = run_gens(
        &m,
        &tok,
        1,
        std::slice::from_ref(&full),
        vec![scored.clone()],
    );
    let (text, lps) = alone[0].echo.clone().expect("an echo");
    assert_eq!(lps.len(), full.len());
    assert!(lps[0].is_none() && lps[1..].iter().all(Option::is_some));
    let tail: Vec<TokenBits> = lps[p.len()..].iter().flatten().cloned().collect();
    assert_eq!(tail, solo[0].logprobs);
    assert_eq!(alone[0].finish, Some((FinishReason::Length, full.len(), 0)));
    assert!(alone[0].text.is_empty() && alone[0].logprobs.is_empty());
    // (the prompt's BOS, a control token, gives no text, as in generated text)
    assert_eq!(Some(full[0]), tok.bos());
    assert_eq!(text.as_bytes(), tok.decode(&full[1..]).unwrap());
    // alone: the 190 positions in one pass (a vocabulary small enough for 512 a pass)
    assert_eq!(scored_chunk(m.config.n_vocab), CHUNK_IDLE);
    let (again, metrics) = run_counted(
        &m,
        &tok,
        1,
        std::slice::from_ref(&full),
        vec![scored.clone()],
    );
    assert_eq!(again[0], alone[0]);
    assert_eq!(metrics.prefill_passes.load(Relaxed), 1);
    // Beside eight decoding requests that came first: the same echo, and their own answers.
    let mut prompts: Vec<Vec<u32>> = TEXTS[..8]
        .iter()
        .map(|t| tok.encode(t, true, true))
        .collect();
    prompts.push(full);
    let mut gens: Vec<Generation> = (0..8).map(|_| greedy(30)).collect();
    gens.push(scored);
    let together = run_gens(&m, &tok, 9, &prompts, gens);
    assert_eq!(together[8], alone[0]);
    for (p, got) in prompts[..8].iter().zip(&together) {
        assert_eq!(
            got,
            &run_together(&m, &tok, 1, std::slice::from_ref(p), 30)[0]
        );
    }
}

#[test]
fn a_prefix_given_up_comes_back_from_the_host_cache() {
    // Two slots. A conversation's prompt, then two other prompts that take both slots (the
    // conversation's cache is saved to host memory as its slot is given up), then the
    // conversation's prompt with a new tail: its prefix comes back from the host cache,
    // reported as cached, and the answer is bit for bit the one computed from scratch.
    let (m, tok) = model();
    let a = long_prompt(&tok, 200);
    let other = |i: usize| {
        let text = TEXTS[i..].join(" | ").repeat(3);
        tok.encode(&text, true, true)[..150].to_vec()
    };
    let (b, c) = (other(3), other(7));
    assert!(
        a[1..]
            .iter()
            .zip(&b[1..])
            .take_while(|(x, y)| x == y)
            .count()
            < 4
    );
    let mut a2 = a[..180].to_vec();
    a2.extend(tok.encode(" and so the story ends", false, false));
    let run = |cache: usize| {
        let metrics = Metrics::default();
        let mut e = Engine::new(&m, &tok, &metrics, 2, 512)
            .unwrap()
            .with_host_cache(cache);
        let mut go = |prompts: &[&Vec<u32>]| -> Vec<(Answer, usize)> {
            let mut rxs: Vec<_> = prompts
                .iter()
                .map(|p| submit(&mut e, &metrics, (*p).clone(), greedy(6)))
                .collect();
            let mut got: Vec<(Answer, usize)> = prompts.iter().map(|_| (answer(), 0)).collect();
            while e.busy() {
                e.step();
                for (rx, (a, _)) in rxs.iter_mut().zip(&mut got) {
                    drain(rx, a);
                }
            }
            got
        };
        go(&[&a]);
        go(&[&b, &c]);
        let got = go(&[&a2]).remove(0).0;
        let f = got.finish.unwrap();
        (got, f, metrics)
    };
    let (with, _, mw) = run(64 << 20);
    let (without, _, mo) = run(0);
    assert_eq!(with, without);
    assert_eq!(
        with,
        run_together(&m, &tok, 1, std::slice::from_ref(&a2), 6)[0]
    );
    // a's 200 positions were saved when b or c took its slot, and those a2 shares came back.
    let shared = a.iter().zip(&a2).take_while(|(x, y)| x == y).count();
    assert!(shared >= 180);
    assert_eq!(mw.restored_tokens.load(Relaxed) as usize, shared);
    // (and c's BOS, which b's slot held)
    let cached = mw.cached_tokens.load(Relaxed) as usize;
    assert!(cached >= shared && cached < shared + 4, "{cached}");
    assert_eq!(mo.restored_tokens.load(Relaxed), 0);
    assert!(mo.cached_tokens.load(Relaxed) < 4);
    assert!(mw.host_tokens.load(Relaxed) >= 200);
    assert!(mw.host_bytes.load(Relaxed) > 0);
}
