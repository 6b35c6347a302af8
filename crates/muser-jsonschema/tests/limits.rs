//! Inputs that used to take exponential time or memory convert, or fail with
//! `SchemaError::TooComplex`, quickly. Outcomes are asserted, times are only printed.

use std::time::Instant;

use muser_jsonschema::{schema_to_gbnf, SchemaError, MAX_ALTERNATIVES};
use serde_json::{json, Map, Value};

fn timed(name: &str, schema: &Value) -> Result<String, SchemaError> {
    let t = Instant::now();
    let r = schema_to_gbnf(schema);
    let outcome = match &r {
        Ok(g) => format!("Ok ({} bytes, {} rules)", g.len(), g.lines().count()),
        Err(e) => format!("Err({e})"),
    };
    eprintln!("{name}: {:?} -> {outcome}", t.elapsed());
    r
}

fn ok_or_too_complex(r: &Result<String, SchemaError>) {
    match r {
        Ok(g) => {
            if let Err(e) = muser_grammar::Grammar::parse(g) {
                panic!("grammar does not parse: {e}");
            }
        }
        Err(e) => {
            assert!(matches!(e, SchemaError::TooComplex { .. }), "{e}");
            assert!(e.pointer().starts_with('#') && !e.keyword().is_empty());
        }
    }
}

/// (a) `allOf` of `n` two-way `anyOf`s: 2^n combinations.
fn all_of_any_ofs(n: usize, distinct: bool) -> Value {
    let parts: Vec<Value> = (0..n)
        .map(|i| {
            let (p, q) = if distinct {
                (format!("p{i}"), format!("q{i}"))
            } else {
                ("pI".to_string(), "qI".to_string())
            };
            json!({"anyOf": [
                {"properties": {p: {"type": "integer"}}},
                {"properties": {q: {"type": "string"}}}
            ]})
        })
        .collect();
    json!({"type": "object", "allOf": parts})
}

#[test]
fn all_of_any_of_products_are_bounded() {
    for n in [4, 8, 9, 12, 14, 30] {
        let r = timed(
            &format!("(a) allOf x anyOf n={n}"),
            &all_of_any_ofs(n, true),
        );
        ok_or_too_complex(&r);
        if 1usize << n <= MAX_ALTERNATIVES {
            assert!(r.is_ok(), "{r:?}");
        } else {
            let e = r.unwrap_err();
            assert!(matches!(e, SchemaError::TooComplex { .. }), "{e}");
            assert_eq!((e.keyword(), e.pointer()), ("allOf", "#"));
        }
        // the same alternatives in every part collapse
        let r = timed(&format!("(a) same names n={n}"), &all_of_any_ofs(n, false));
        assert!(r.is_ok(), "{r:?}");
    }
}

/// (b) "billion laughs": each level refers to the next one twice.
fn ref_doubling(n: usize, leaf: Value) -> Value {
    let mut defs = Map::new();
    for i in 0..n {
        let next = format!("#/$defs/d{}", i + 1);
        defs.insert(
            format!("d{i}"),
            json!({"allOf": [{"$ref": next}, {"$ref": next}]}),
        );
    }
    defs.insert(format!("d{n}"), leaf);
    json!({"$defs": defs, "$ref": "#/$defs/d0"})
}

#[test]
fn ref_chains_are_linear() {
    let leaves = [
        json!({"type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]}),
        json!({"type": "integer", "minimum": 3}),
        json!({"anyOf": [{"type": "string"}, {"type": "null"}]}),
        json!({"type": "object", "anyOf": [{"properties": {"a": {"type": "null"}}}, {"properties": {"b": {"type": "null"}}}]}),
    ];
    for (k, leaf) in leaves.iter().enumerate() {
        for n in [16, 20, 30] {
            let r = timed(
                &format!("(b) $ref doubling n={n} leaf {k}"),
                &ref_doubling(n, leaf.clone()),
            );
            ok_or_too_complex(&r);
            // the small leaves all fold to a handful of alternatives
            assert!(r.is_ok(), "{r:?}");
        }
    }
    // beyond the nesting limit it is still an error, not a long computation
    let r = timed(
        "(b) $ref doubling n=40",
        &ref_doubling(40, leaves[0].clone()),
    );
    assert!(matches!(r, Err(SchemaError::TooDeep { .. })), "{r:?}");
}

/// (c) `oneOf` over a wide, deep DAG of `anyOf`s of `$ref`s.
fn wide_dag(w: usize, levels: usize) -> Value {
    let mut defs = Map::new();
    for i in 0..levels {
        let alts: Vec<Value> = (0..w)
            .map(|_| json!({"$ref": format!("#/$defs/d{}", i + 1)}))
            .collect();
        defs.insert(format!("d{i}"), json!({"anyOf": alts}));
    }
    defs.insert(format!("d{levels}"), json!({"type": "integer"}));
    json!({"$defs": defs, "oneOf": [{"$ref": "#/$defs/d0"}, {"type": "string"}]})
}

#[test]
fn one_of_analysis_is_memoized() {
    for (w, levels) in [(8, 7), (12, 7), (20, 8), (64, 12)] {
        let r = timed(
            &format!("(c) oneOf dag w={w} depth={levels}"),
            &wide_dag(w, levels),
        );
        ok_or_too_complex(&r);
        assert!(r.is_ok(), "{r:?}");
    }
    // the same DAG folded into a combined schema
    let mut s = wide_dag(20, 8);
    s["minimum"] = json!(0);
    let r = timed("(c) dag with sibling keyword", &s);
    ok_or_too_complex(&r);
}

fn nested_stars(levels: usize) -> String {
    let mut p = String::from("^");
    for i in 0..levels {
        p.push_str(&format!("(?:{}", (b'a' + (i % 26) as u8) as char));
    }
    for _ in 0..levels {
        p.push_str(")*");
    }
    p.push('$');
    p
}

#[test]
fn nested_pattern_repetitions_are_limited() {
    let r = timed(
        "(d) 20 nested star groups",
        &json!({"type": "string", "pattern": nested_stars(20)}),
    );
    let e = r.unwrap_err();
    assert!(matches!(e, SchemaError::TooComplex { .. }), "{e}");
    assert_eq!((e.keyword(), e.pointer()), ("pattern", "#"));
    // a few levels are fine
    assert!(schema_to_gbnf(&json!({"type": "string", "pattern": nested_stars(4)})).is_ok());
    assert!(
        schema_to_gbnf(&json!({"type": "string", "pattern": "^(?:(?:\\w+\\.)*\\w+)+$"})).is_ok()
    );
    // directly nested repetitions are one repetition
    let r = timed(
        "(d) (((a*)*)*)... 20 deep",
        &json!({"type": "string", "pattern": format!("^{}a{}$", "(?:".repeat(20), ")*".repeat(20))}),
    );
    let g = r.unwrap();
    let g = muser_grammar::Grammar::parse(&g).unwrap();
    for (s, ok) in [("\"\"", true), ("\"aaaa\"", true), ("\"ab\"", false)] {
        assert_eq!(g.accepts_str(s), ok, "{s}");
    }
}

#[test]
fn many_rules_with_one_name() {
    // thousands of rules share the hint `root`: naming stays linear
    let alts: Vec<Value> = (0..5000)
        .map(|i| json!({"type": "integer", "minimum": i * 10, "maximum": i * 10 + 5}))
        .collect();
    let r = timed("5000 alternatives", &json!({"anyOf": alts}));
    // (too ambiguous for the grammar engine to load, but the conversion itself is fine)
    let g = r.unwrap();
    assert!(g.lines().count() > 5000 && g.contains("root-5001 ::= "));
    // more rules than the limit
    let props: Map<String, Value> = (0..12_000)
        .map(|i| (format!("p{i}"), json!({"type": "integer", "minimum": i})))
        .collect();
    let r = timed(
        "12000 properties",
        &json!({"type": "object", "properties": props}),
    );
    ok_or_too_complex(&r);
}

#[test]
fn wide_one_of_of_tagged_objects_still_converts() {
    let alts: Vec<Value> = (0..200)
        .map(|i| {
            json!({"type": "object", "properties": {"kind": {"const": format!("k{i}")}, "v": {"type": "integer"}},
                   "required": ["kind"]})
        })
        .collect();
    let r = timed("oneOf 200 tagged objects", &json!({"oneOf": alts}));
    assert!(r.is_ok(), "{r:?}");
}
