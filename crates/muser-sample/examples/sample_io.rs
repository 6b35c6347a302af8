//! Muser's picks on seeded random rows of logits, for the llama.cpp oracle test
//! (tests/python/test_sampler_llamacpp.py), whose other side is tests/python/llamacpp_sampler.cpp.
//!
//! Reads one scenario a line on stdin, `key=value` pairs separated by spaces (every key but
//! logit_bias required), and prints one line per scenario: the token `Sampler::try_sample` picks
//! at each step, accepted before the next, comma-separated (`-` where it picks none).
//!
//! The rows are llamacpp_sampler.cpp's: `row_seed` seeds an MT19937 (`std::mt19937`), each logit
//! is (the sum of 4 `uniform_f64` draws - 2) as f32, times `scale`; with `neg_inf` > 0 one more
//! draw per logit, which makes it -inf when below `neg_inf`. A row whose finite logits are not all
//! distinct, or of which fewer than a quarter are finite, is drawn again.
//!
//! DRY (optional keys, off without them): `dry_multiplier`, `dry_base`, `dry_allowed_length`,
//! `dry_penalty_last_n`, `dry_breakers` (the breaker strings, each as hex bytes, comma-separated)
//! and `prefix` (token ids accepted before the first step, comma-separated). The breakers need
//! the vocabulary: `--vocab FILE`, a file of `piece HEX` lines (token i's text, i in order; `-`
//! for an empty text) and `tokenize HEX IDS` lines (the tokenization of a text the breakers
//! need, ids comma-separated), which the test writes from llama.cpp's vocabulary.
//!
//!   echo "row_seed=1 n_vocab=300 scale=2 steps=20 neg_inf=0 temperature=0.8 ..." |
//!       cargo run -p muser-sample --example sample_io [-- --vocab FILE]

use muser_sample::{uniform_f64, DryBreakers, Sampler, SamplerParams};
use rand_mt::Mt;
use std::collections::HashMap;
use std::io::{BufRead, Write};
use std::sync::Arc;

/// One line: the rows to make and the sampler's parameters.
struct Scenario {
    row_seed: u32,
    n_vocab: usize,
    scale: f32,
    steps: usize,
    neg_inf: f64,
    params: SamplerParams,
    /// Accepted before the first step.
    prefix: Vec<u32>,
}

/// A vocabulary's token texts and the tokenizations DRY's breakers need (`--vocab`).
#[derive(Default)]
struct Vocab {
    pieces: Vec<Vec<u8>>,
    tokenized: HashMap<Vec<u8>, Vec<u32>>,
}

fn unhex(h: &str) -> Result<Vec<u8>, String> {
    if h == "-" {
        return Ok(Vec::new());
    }
    (0..h.len())
        .step_by(2)
        .map(|i| {
            h.get(i..i + 2)
                .and_then(|b| u8::from_str_radix(b, 16).ok())
                .ok_or_else(|| format!("not hex: {h}"))
        })
        .collect()
}

fn ids(list: &str) -> Result<Vec<u32>, String> {
    list.split(',')
        .filter(|t| !t.is_empty())
        .map(|t| t.parse().map_err(|_| format!("not a token id: {t}")))
        .collect()
}

fn read_vocab(path: &str) -> Result<Vocab, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{path}: {e}"))?;
    let mut v = Vocab::default();
    for line in text.lines() {
        let mut f = line.split(' ');
        match (f.next(), f.next(), f.next()) {
            (Some("piece"), Some(h), None) => v.pieces.push(unhex(h)?),
            (Some("tokenize"), Some(h), Some(list)) => {
                v.tokenized.insert(unhex(h)?, ids(list)?);
            }
            _ => return Err(format!("{path}: bad line {line:?}")),
        }
    }
    Ok(v)
}

fn parse(line: &str) -> Result<Scenario, String> {
    let mut kv: HashMap<&str, &str> = HashMap::new();
    for tok in line.split_whitespace() {
        let (k, v) = tok
            .split_once('=')
            .ok_or_else(|| format!("not key=value: {tok}"))?;
        kv.insert(k, v);
    }
    let mut take = |key: &str| kv.remove(key).ok_or_else(|| format!("missing {key}"));
    fn num<T: std::str::FromStr>(key: &str, v: &str) -> Result<T, String> {
        v.parse().map_err(|_| format!("{key}={v} is not a number"))
    }
    macro_rules! get {
        ($key:literal) => {
            num($key, take($key)?)?
        };
    }
    let row_seed = get!("row_seed");
    let n_vocab = get!("n_vocab");
    let scale = get!("scale");
    let steps = get!("steps");
    let neg_inf = get!("neg_inf");
    let mut params = SamplerParams {
        temperature: get!("temperature"),
        top_k: get!("top_k"),
        top_p: get!("top_p"),
        min_p: get!("min_p"),
        typical_p: get!("typical_p"),
        top_n_sigma: get!("top_n_sigma"),
        xtc_probability: get!("xtc_probability"),
        xtc_threshold: get!("xtc_threshold"),
        dynatemp_range: get!("dynatemp_range"),
        dynatemp_exponent: get!("dynatemp_exponent"),
        mirostat: get!("mirostat"),
        mirostat_tau: get!("mirostat_tau"),
        mirostat_eta: get!("mirostat_eta"),
        min_keep: get!("min_keep"),
        repeat_last_n: get!("repeat_last_n"),
        repeat_penalty: get!("repeat_penalty"),
        frequency_penalty: get!("frequency_penalty"),
        presence_penalty: get!("presence_penalty"),
        seed: get!("seed"),
        logit_bias: Vec::new(),
        dry_sequence_breakers: Vec::new(),
        ..Default::default()
    };
    if let Ok(v) = take("dry_multiplier") {
        params.dry_multiplier = num("dry_multiplier", v)?;
        params.dry_base = get!("dry_base");
        params.dry_allowed_length = get!("dry_allowed_length");
        params.dry_penalty_last_n = get!("dry_penalty_last_n");
    }
    if let Ok(list) = take("dry_breakers") {
        for h in list.split(',') {
            let b = unhex(h)?;
            params
                .dry_sequence_breakers
                .push(String::from_utf8(b).map_err(|_| format!("breaker {h} is not UTF-8"))?);
        }
    }
    let prefix = match take("prefix") {
        Ok(list) => ids(list)?,
        Err(_) => Vec::new(),
    };
    if let Ok(list) = take("logit_bias") {
        for pair in list.split(',') {
            let (id, bias) = pair
                .split_once(':')
                .ok_or_else(|| format!("logit_bias entry not id:bias: {pair}"))?;
            params
                .logit_bias
                .push((num("logit_bias id", id)?, num("logit_bias", bias)?));
        }
    }
    if let Some(key) = kv.keys().next() {
        return Err(format!("unknown key {key}"));
    }
    params.check()?;
    Ok(Scenario {
        row_seed,
        n_vocab,
        scale,
        steps,
        neg_inf,
        params,
        prefix,
    })
}

/// Whether the finite values are all distinct.
fn finite_distinct(row: &[f32]) -> bool {
    let mut v: Vec<f32> = row.iter().copied().filter(|x| x.is_finite()).collect();
    v.sort_by(f32::total_cmp);
    // `==`, not the total order: -0.0 and +0.0 are a tie.
    v.windows(2).all(|w| w[0] != w[1])
}

fn random_row(rng: &mut Mt, s: &Scenario) -> Vec<f32> {
    loop {
        let row: Vec<f32> = (0..s.n_vocab)
            .map(|_| {
                let sum: f64 = (0..4).map(|_| uniform_f64(rng)).sum();
                let x = (sum - 2.0) as f32 * s.scale;
                if s.neg_inf > 0.0 && uniform_f64(rng) < s.neg_inf {
                    f32::NEG_INFINITY
                } else {
                    x
                }
            })
            .collect();
        let finite = row.iter().filter(|x| x.is_finite()).count();
        if 4 * finite >= s.n_vocab && finite_distinct(&row) {
            return row;
        }
    }
}

fn run(s: &Scenario, vocab: &Vocab) -> Result<String, String> {
    let mut rows = Mt::new(s.row_seed);
    let mut sampler = Sampler::new(s.params.clone());
    if !s.params.dry_sequence_breakers.is_empty() {
        let mut missing = None;
        let breakers = DryBreakers::new(&vocab.pieces, &s.params.dry_sequence_breakers, |t| {
            vocab.tokenized.get(t).cloned().unwrap_or_else(|| {
                missing = Some(t.to_vec());
                Vec::new()
            })
        });
        if let Some(t) = missing {
            return Err(format!("the vocabulary file has no tokenization of {t:?}"));
        }
        sampler.set_dry_breakers(Arc::new(breakers));
    }
    for &t in &s.prefix {
        sampler.accept(t);
    }
    let picks: Vec<String> = (0..s.steps)
        .map(|_| match sampler.try_sample(&random_row(&mut rows, s)) {
            Some(t) => {
                sampler.accept(t);
                t.to_string()
            }
            None => "-".into(),
        })
        .collect();
    Ok(picks.join(","))
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let vocab = match args.as_slice() {
        [] => Vocab::default(),
        [flag, path] if flag == "--vocab" => read_vocab(path).unwrap_or_else(|e| {
            eprintln!("sample_io: {e}");
            std::process::exit(1)
        }),
        _ => {
            eprintln!("usage: sample_io [--vocab FILE] < scenarios");
            std::process::exit(2)
        }
    };
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    for (i, line) in std::io::stdin().lock().lines().enumerate() {
        let line = line.unwrap_or_else(|e| {
            eprintln!("sample_io: stdin: {e}");
            std::process::exit(1)
        });
        match parse(&line).and_then(|s| run(&s, &vocab)) {
            Ok(picks) => writeln!(out, "{picks}").expect("stdout"),
            Err(e) => {
                eprintln!("sample_io: line {}: {e}", i + 1);
                std::process::exit(1);
            }
        }
    }
}
