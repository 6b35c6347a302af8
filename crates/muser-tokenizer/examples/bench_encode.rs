//! Encoding speed on a synthetic 200k-token byte-level vocabulary (word tokens built by chains
//! of prefix merges), for each pre-tokenizer: `cargo run --release -p muser-tokenizer --example
//! bench_encode`. Prints load time, then time for a 10 KB prompt and throughput on 1 MB.

use muser_tokenizer::{ByteUnicode, TokenType, Tokenizer, TokenizerData, TokenizerModel};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::collections::HashSet;
use std::time::Instant;

const SYLLABLES: &[&str] = &[
    "ka", "lo", "mi", "ne", "su", "ta", "ri", "po", "the", "ing", "ion", "er", "an", "st", "qu",
    "é", "ß", "日", "本", "ch", "sh", "th", "ou", "ea",
];

fn word(rng: &mut StdRng) -> String {
    let space = if rng.gen_bool(0.8) { " " } else { "" };
    let n = rng.gen_range(1..5);
    space.to_string()
        + &(0..n)
            .map(|_| SYLLABLES[rng.gen_range(0..SYLLABLES.len())])
            .collect::<String>()
}

fn main() {
    let bu = ByteUnicode::new();
    let enc = |s: &str| s.bytes().map(|b| bu.char_of(b)).collect::<String>();
    let mut rng = StdRng::seed_from_u64(1);
    let mut tokens: Vec<String> = (0..=255u8).map(|b| bu.char_of(b).to_string()).collect();
    let mut seen: HashSet<String> = tokens.iter().cloned().collect();
    let mut merges = Vec::new();
    while tokens.len() < 200_000 {
        let w = enc(&word(&mut rng));
        let chars: Vec<char> = w.chars().collect();
        let mut prefix = chars[0].to_string();
        for &c in &chars[1..] {
            let merged = format!("{prefix}{c}");
            if seen.insert(merged.clone()) {
                merges.push(format!("{prefix} {c}"));
                tokens.push(merged.clone());
            }
            prefix = merged;
        }
    }
    let n_normal = tokens.len();
    tokens.push("<|eot_id|>".into());
    let mut types = vec![TokenType::Normal; n_normal];
    types.push(TokenType::Control);

    let mut prompt = String::new();
    while prompt.len() < 1 << 20 {
        prompt += &word(&mut rng);
        if rng.gen_bool(0.05) {
            prompt += &format!(" {}, ", rng.gen_range(0..1_000_000));
        }
        if rng.gen_bool(0.02) {
            prompt += ".\n\n";
        }
    }
    let cut = (0..=10_000)
        .rev()
        .find(|&i| prompt.is_char_boundary(i))
        .unwrap_or(0);
    let small = &prompt[..cut];

    for pre in ["default", "llama-bpe", "qwen2"] {
        let mut d = TokenizerData::new(TokenizerModel::Gpt2, tokens.clone());
        d.token_types = types.clone();
        d.merges = merges.clone();
        d.pre = Some(pre.into());
        let t0 = Instant::now();
        let tok = Tokenizer::new(d).expect("valid synthetic vocabulary");
        let load = t0.elapsed();
        let t0 = Instant::now();
        let ids = tok.encode(small, false, false);
        let t_small = t0.elapsed();
        let t0 = Instant::now();
        let big = tok.encode(&prompt, false, false);
        let t_big = t0.elapsed();
        println!(
            "{pre:>10}: n_vocab {}, {} merges, load {:.0} ms; 10 KB -> {} tokens in {:.2} ms; 1 MB -> {} tokens at {:.1} MB/s",
            tok.n_vocab(),
            merges.len(),
            load.as_secs_f64() * 1e3,
            ids.len(),
            t_small.as_secs_f64() * 1e3,
            big.len(),
            prompt.len() as f64 / t_big.as_secs_f64() / 1e6,
        );
    }
}
