//! Muser's side of the grammar comparison with llama.cpp (tests/python/test_grammar_llamacpp.py;
//! llama.cpp's side is tests/python/llamacpp_grammar.cpp, whose header describes the format).
//!
//! `grammar_io --vocab PIECES [--tokens TOKENS]` where PIECES is the harness's `--pieces` output
//! (`HEX EOG` per token) and TOKENS its `--tokenize` output (`HEX ID`, the token a `<text>`
//! reference names). Reads scenarios `seed=S steps=N grammar=HEX [verbose=1] [limits=none]` on
//! stdin and prints, per line, `refused\tMESSAGE` or the step records `COUNT:HASH:PICK[:IDS]`.
//! PICK is a token id, `end` (an end-of-generation token picked), `none` (nothing allowed),
//! `err:ID` (the pick not accepted) or `failed` (the state exceeded its limits: the default
//! ones, or none with `limits=none`).

use muser_grammar::{Grammar, GrammarState, Limits, Vocab};
use std::collections::HashMap;
use std::io::{BufRead, Write};
use std::sync::Arc;

struct SplitMix(u64);

impl SplitMix {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
}

fn fnv(ids: &[u32]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &v in ids {
        for k in 0..4 {
            h ^= ((v >> (8 * k)) & 0xff) as u64;
            h = h.wrapping_mul(0x100_0000_01b3);
        }
    }
    h
}

fn unhex(h: &str) -> Vec<u8> {
    if h == "-" {
        return Vec::new();
    }
    (0..h.len() / 2)
        .map(|i| u8::from_str_radix(&h[2 * i..2 * i + 2], 16).expect("hex"))
        .collect()
}

fn run(vocab: &Vocab, tokens: &HashMap<Vec<u8>, u32>, line: &str) -> String {
    let kv: HashMap<&str, &str> = line
        .split_whitespace()
        .filter_map(|t| t.split_once('='))
        .collect();
    let seed: u64 = kv["seed"].parse().expect("seed");
    let steps: usize = kv["steps"].parse().expect("steps");
    let src = String::from_utf8_lossy(&unhex(kv["grammar"])).into_owned();
    let verbose = kv.get("verbose") == Some(&"1");
    let limits = match kv.get("limits") {
        Some(&"none") => Limits::UNLIMITED,
        _ => Limits::default(),
    };
    let lookup = |t: &str| tokens.get(t.as_bytes()).copied();
    let grammar = match Grammar::parse_with_limits(&src, Some(&lookup), limits) {
        Ok(g) => Arc::new(g),
        Err(e) => return format!("refused\t{:?}", e.to_string()),
    };
    let mut state = GrammarState::new(grammar).with_limits(limits);
    let mut rng = SplitMix(seed);
    let mut out = Vec::new();
    let mut logits = vec![0.0f32; vocab.len()];
    for _ in 0..steps {
        logits.iter_mut().for_each(|l| *l = 0.0);
        state.mask_logits(vocab, &mut logits);
        let allowed: Vec<u32> = (0..vocab.len() as u32)
            .filter(|&t| logits[t as usize].is_finite())
            .collect();
        let mut rec = format!("{}:{:016x}:", allowed.len(), fnv(&allowed));
        let list = || {
            allowed
                .iter()
                .map(|t| t.to_string())
                .collect::<Vec<_>>()
                .join(",")
        };
        if state.failure().is_some() {
            rec += if verbose { "failed:" } else { "failed" };
            out.push(rec);
            break;
        }
        if allowed.is_empty() {
            rec += if verbose { "none:" } else { "none" };
            out.push(rec);
            break;
        }
        let pick = allowed[(rng.next() % allowed.len() as u64) as usize];
        let mut stop = false;
        if vocab.is_eog(pick) {
            rec += "end";
            stop = true;
        } else if state.accept(vocab, pick).is_ok() {
            rec += &pick.to_string();
        } else if state.failure().is_some() {
            rec += "failed";
            stop = true;
        } else {
            rec += &format!("err:{pick}");
            stop = true;
        }
        if verbose {
            rec += &format!(":{}", list());
        }
        out.push(rec);
        if stop {
            break;
        }
    }
    out.join(" ")
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let mut vocab_path = None;
    let mut tokens_path = None;
    let mut i = 1;
    while i < args.len() {
        match args[i].as_str() {
            "--vocab" if i + 1 < args.len() => {
                vocab_path = Some(args[i + 1].clone());
                i += 1;
            }
            "--tokens" if i + 1 < args.len() => {
                tokens_path = Some(args[i + 1].clone());
                i += 1;
            }
            _ => {
                eprintln!("usage: grammar_io --vocab PIECES [--tokens TOKENS]");
                std::process::exit(2);
            }
        }
        i += 1;
    }
    let Some(vocab_path) = vocab_path else {
        eprintln!("grammar_io: --vocab PIECES is required");
        std::process::exit(2);
    };
    let text = std::fs::read_to_string(&vocab_path).expect("read the vocabulary file");
    let (mut pieces, mut eog) = (Vec::new(), Vec::new());
    for line in text.lines() {
        let (h, e) = line.split_once(' ').expect("`HEX EOG` lines");
        pieces.push(unhex(h));
        eog.push(e == "1");
    }
    let vocab = Vocab::new(pieces, eog);
    let mut tokens = HashMap::new();
    if let Some(p) = tokens_path {
        for line in std::fs::read_to_string(p)
            .expect("read the tokens file")
            .lines()
        {
            let (h, id) = line.split_once(' ').expect("`HEX ID` lines");
            if let Ok(id) = id.parse::<u32>() {
                tokens.insert(unhex(h), id);
            }
        }
    }
    let stdin = std::io::stdin();
    let mut stdout = std::io::stdout().lock();
    for line in stdin.lock().lines() {
        let line = line.expect("stdin");
        writeln!(stdout, "{}", run(&vocab, &tokens, &line)).expect("stdout");
        stdout.flush().expect("stdout");
    }
}
