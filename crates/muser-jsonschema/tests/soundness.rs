//! Every string generated through the grammar (random walks over a one-character-per-token
//! vocabulary) is JSON that the independent validator (`jsonschema` crate, formats checked)
//! accepts.

mod common;

use common::{char_vocab, corpus, grammar_for, random_walk, validator, Walk};
use muser_grammar::Grammar;
use rand::rngs::StdRng;
use rand::SeedableRng;

const WALKS: usize = 150;

#[test]
fn random_generations_validate() {
    let cv = char_vocab();
    let mut total = 0usize;
    let mut too_long = 0usize;
    for (ci, case) in corpus().iter().enumerate() {
        let (gbnf, g) = grammar_for(&case.schema);
        let val = validator(&case.schema);
        let mut rng = StdRng::seed_from_u64(0x5eed_0000 + ci as u64);
        let mut distinct = std::collections::HashSet::new();
        for w in 0..WALKS {
            // alternate between short and longer generations
            let (p_end, soft) = if w % 2 == 0 { (0.5, 40) } else { (0.1, 120) };
            match random_walk(
                &g,
                &cv,
                &mut rng,
                p_end,
                soft,
                2000,
                &case.schema.to_string(),
            ) {
                Walk::TooLong => too_long += 1,
                Walk::Done(s) => {
                    total += 1;
                    let v: serde_json::Value = serde_json::from_str(&s).unwrap_or_else(|e| {
                        panic!(
                            "[{}] generated text is not JSON ({e}): {s:?}\n{gbnf}",
                            case.name
                        )
                    });
                    if !val.is_valid(&v) {
                        let errs: Vec<String> =
                            val.iter_errors(&v).map(|e| e.to_string()).collect();
                        panic!(
                            "[{}] generated instance fails validation: {s:?}\nerrors: {errs:?}\n{gbnf}",
                            case.name
                        );
                    }
                    assert!(
                        g.accepts_str(&s),
                        "[{}] accepts_str disagrees on {s:?}",
                        case.name
                    );
                    distinct.insert(s);
                }
            }
        }
        // the walks explore: schemas with more than a handful of instances give variety
        assert!(
            !distinct.is_empty(),
            "[{}] no generation finished",
            case.name
        );
    }
    eprintln!("soundness: {total} generated instances validated, {too_long} walks over the cap");
    assert!(
        too_long * 20 < total,
        "too many walks ran past the cap: {too_long}"
    );
}

/// Generated instances, re-serialized by serde_json (compact, pretty, Python layout), are
/// accepted again: the grammar covers the canonical layouts of what it generates.
#[test]
fn regenerated_layouts_accepted() {
    let cv = char_vocab();
    let mut checked = 0;
    for (ci, case) in corpus().iter().enumerate() {
        let (gbnf, g) = grammar_for(&case.schema);
        let mut rng = StdRng::seed_from_u64(0xabc0_0000 + ci as u64);
        for _ in 0..20 {
            let Walk::Done(s) =
                random_walk(&g, &cv, &mut rng, 0.3, 60, 2000, &case.schema.to_string())
            else {
                continue;
            };
            let v: serde_json::Value = serde_json::from_str(&s).unwrap();
            for text in common::layouts(&v) {
                // serde writes 1e-7 for a number the bounded-number grammar spells 0.0000001
                if text.contains("e-") && case.schema.get("type") == Some(&"number".into()) {
                    continue;
                }
                assert!(
                    g.accepts_str(&text),
                    "[{}] layout of generated {s:?} rejected: {text:?}\n{gbnf}",
                    case.name
                );
                checked += 1;
            }
        }
    }
    eprintln!("regenerated layouts checked: {checked}");
    assert!(checked > 500);
}

#[test]
fn every_corpus_grammar_parses() {
    for case in corpus() {
        let gbnf = muser_jsonschema::schema_to_gbnf(&case.schema).unwrap();
        assert!(gbnf.starts_with("root ::= "), "[{}]", case.name);
        Grammar::parse(&gbnf).unwrap_or_else(|e| panic!("[{}] {e}\n{gbnf}", case.name));
    }
}
