//! mask_logits on a synthetic 202,048-token vocabulary with a JSON grammar, at the states a JSON
//! generation spends its time in; plus building the Vocab.

use criterion::{black_box, criterion_group, criterion_main, Criterion};
use muser_grammar::{Grammar, GrammarState, Vocab};
use rand::rngs::StdRng;
use rand::{Rng as _, SeedableRng};
use std::sync::Arc;

const JSON: &str = r#"
root   ::= ws value ws
value  ::= object | array | string | number | "true" | "false" | "null"
object ::= "{" ws ( member ( ws "," ws member )* )? ws "}"
member ::= string ws ":" ws value
array  ::= "[" ws ( value ( ws "," ws value )* )? ws "]"
string ::= "\"" ( [^"\\\x00-\x1f] | "\\" ( ["\\/bfnrt] | "u" [0-9a-fA-F]{4} ) )* "\""
number ::= "-"? ( "0" | [1-9] [0-9]* ) ( "." [0-9]+ )? ( [eE] [+-]? [0-9]+ )?
ws     ::= [ \t\n]*
"#;

/// A seeded generator.
struct Rng(StdRng);

impl Rng {
    fn below(&mut self, n: usize) -> usize {
        self.0.gen_range(0..n)
    }
}

/// A vocabulary shaped like a large multilingual BPE one: the 256 bytes, English-like words
/// with and without a leading space, punctuation and JSON-ish runs, digits, accented Latin,
/// Cyrillic, CJK, emoji, whitespace runs, a few special tokens (two of them EOG).
fn synthetic_vocab(n: usize) -> Vocab {
    let mut rng = Rng(StdRng::seed_from_u64(42));
    let mut pieces: Vec<Vec<u8>> = (0..=255u8).map(|b| vec![b]).collect();
    let mut eog = vec![false; 256];
    for s in [
        "<|endoftext|>",
        "<|im_end|>",
        "<|im_start|>",
        "<think>",
        "</think>",
    ] {
        eog.push(s.ends_with("end|>") || s == "<|endoftext|>");
        pieces.push(s.as_bytes().to_vec());
    }
    let latin = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ";
    let accented: Vec<char> = "àáâãäåæçèéêëìíîïñòóôõöøùúûüýÿßœ".chars().collect();
    let cyr: Vec<char> = ('а'..='я').collect();
    let punct = [
        "{", "}", "[", "]", "\"", ":", ",", "\":", "\",", "\"}", "},", "{\"", "\\n", "\\\"", ".",
        "-", "(", ")", ";", "'", "!", "?", "/", "\\",
    ];
    while pieces.len() < n {
        let kind = rng.below(100);
        let mut s = String::new();
        if kind < 55 {
            if rng.below(2) == 0 {
                s.push(' ');
            }
            for _ in 0..1 + rng.below(10) {
                let upper = rng.below(5) == 0;
                s.push(latin.as_bytes()[rng.below(if upper { 52 } else { 26 })] as char);
            }
        } else if kind < 65 {
            for _ in 0..1 + rng.below(3) {
                s.push_str(punct[rng.below(punct.len())]);
            }
        } else if kind < 70 {
            for _ in 0..1 + rng.below(4) {
                s.push(char::from(b'0' + rng.below(10) as u8));
            }
        } else if kind < 78 {
            if rng.below(2) == 0 {
                s.push(' ');
            }
            for _ in 0..1 + rng.below(6) {
                s.push(if rng.below(3) == 0 {
                    accented[rng.below(accented.len())]
                } else {
                    latin.as_bytes()[rng.below(26)] as char
                });
            }
        } else if kind < 86 {
            if rng.below(2) == 0 {
                s.push(' ');
            }
            for _ in 0..1 + rng.below(7) {
                s.push(cyr[rng.below(cyr.len())]);
            }
        } else if kind < 95 {
            for _ in 0..1 + rng.below(3) {
                s.push(char::from_u32(0x4e00 + rng.below(0x5000) as u32).unwrap());
            }
        } else if kind < 97 {
            s.push(char::from_u32(0x1f600 + rng.below(0x50) as u32).unwrap());
        } else {
            for _ in 0..1 + rng.below(8) {
                s.push([' ', '\n', '\t'][rng.below(3)]);
            }
        }
        let mut bytes = s.into_bytes();
        // Some tokens end inside a UTF-8 sequence, as byte-level BPE merges do.
        if bytes.len() > 2 && bytes.last().is_some_and(|&b| b >= 0x80) && rng.below(10) == 0 {
            bytes.pop();
        }
        pieces.push(bytes);
        eog.push(false);
    }
    Vocab::new(pieces, eog)
}

fn state_after(grammar: &Arc<Grammar>, text: &str) -> GrammarState {
    let mut st = GrammarState::new(grammar.clone());
    st.accept_str(text).expect("prefix in the grammar");
    st
}

fn bench(c: &mut Criterion) {
    const N: usize = 202_048;
    let t = std::time::Instant::now();
    let vocab = synthetic_vocab(N);
    eprintln!(
        "Vocab::new({N}): {:.0} ms, {} trie nodes",
        t.elapsed().as_secs_f64() * 1e3,
        vocab.trie_nodes()
    );
    let grammar = Arc::new(Grammar::parse(JSON).unwrap());
    let mut logits = vec![0.0f32; N];

    let mut group = c.benchmark_group("mask_logits_202k_json");
    let states = [
        ("start", ""),
        ("in_string", "{\"name\": \"Jo"),
        ("value", "{\"name\": "),
        ("after_value", "{\"a\": [1, 2"),
        ("in_number", "{\"a\": -12"),
        ("key", "{\"a\": true, "),
    ];
    for (name, prefix) in states {
        let st = state_after(&grammar, prefix);
        let mut probe = vec![0.0f32; N];
        st.mask_logits(&vocab, &mut probe);
        let n_allowed = probe.iter().filter(|l| l.is_finite()).count();
        eprintln!("state {name}: {n_allowed} of {N} tokens allowed");
        // Warm: the state's memo is kept across calls, as in a generation.
        group.bench_function(format!("{name}_warm"), |b| {
            b.iter(|| {
                st.mask_logits(&vocab, black_box(&mut logits));
            })
        });
        // Cold: a fresh state each time (first mask of a generation).
        group.bench_function(format!("{name}_cold"), |b| {
            b.iter(|| {
                let fresh = state_after(&grammar, prefix);
                fresh.mask_logits(&vocab, black_box(&mut logits));
            })
        });
    }
    group.finish();

    c.bench_function("vocab_new_202k", |b| {
        b.iter(|| black_box(synthetic_vocab(N)))
    });
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(10).measurement_time(std::time::Duration::from_secs(3));
    targets = bench
}
criterion_main!(benches);
