//! `schema_to_gbnf_rules`: the rules of several schemas, each with its own prefix, live in one
//! grammar, and each schema's rule accepts there exactly what its grammar accepts alone.

mod common;

use std::sync::Arc;

use common::{char_vocab, corpus, grammar_for, layouts, random_walk, Walk};
use muser_grammar::Grammar;
use rand::rngs::StdRng;
use rand::SeedableRng;

#[test]
fn concatenated_rules_keep_each_language() {
    let cases = corpus();
    let cv = char_vocab();
    let mut rng = StdRng::seed_from_u64(7);
    let mut checked = 0usize;
    // each case next to the following one (and the last next to the first), both orders
    for i in 0..cases.len() {
        let pair = [&cases[i], &cases[(i + 1) % cases.len()]];
        let mut rules = String::new();
        let mut tops = Vec::new();
        for (k, c) in pair.iter().enumerate() {
            let (top, r) = muser_jsonschema::schema_to_gbnf_rules(&c.schema, &format!("s{k}-"))
                .unwrap_or_else(|e| panic!("{}: {e}", c.name));
            rules.push_str(&r);
            tops.push(top);
        }
        for (k, c) in pair.iter().enumerate() {
            let combined = format!("root ::= {}\n{rules}", tops[k]);
            let g = Arc::new(
                Grammar::parse(&combined).unwrap_or_else(|e| panic!("{}: {e}\n{combined}", c.name)),
            );
            let (alone_text, alone) = grammar_for(&c.schema);
            let mut texts: Vec<String> = Vec::new();
            for v in c.valid.iter().chain(&c.invalid) {
                texts.extend(layouts(v));
            }
            // random generations through each grammar, checked against the other
            for (from, other) in [(&alone, &g), (&g, &alone)] {
                for _ in 0..20 {
                    if let Walk::Done(s) =
                        random_walk(from, &cv, &mut rng, 0.2, 40, 400, &alone_text)
                    {
                        assert!(other.accepts_str(&s), "{}: {s:?}\n{combined}", c.name);
                        checked += 1;
                    }
                }
            }
            for t in &texts {
                assert_eq!(
                    g.accepts_str(t),
                    alone.accepts_str(t),
                    "{}: {t}\n{combined}",
                    c.name
                );
                checked += 1;
            }
        }
    }
    assert!(checked > 1000, "{checked}");
}
