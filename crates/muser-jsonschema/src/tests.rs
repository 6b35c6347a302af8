//! Unit tests: grammar text shape, helpers, and brute-force checks of the numeric and key
//! grammars against the GBNF engine.

use serde_json::json;

use crate::charset::{self, CharSet};
use crate::grammar::Rules;
use crate::numeric::{self, test_decimal, Bound};
use crate::{schema_to_gbnf, SchemaError};

fn engine(gbnf: &str) -> muser_grammar::Grammar {
    muser_grammar::Grammar::parse(gbnf).unwrap_or_else(|e| panic!("{e}\n{gbnf}"))
}

fn with_fixed(root: &str, fixed: &[&'static str]) -> String {
    let mut r = Rules::default();
    for f in fixed {
        r.fixed(f);
    }
    r.render(root)
}

#[test]
fn root_first_and_deterministic() {
    let s = json!({"type": "object", "properties": {"b": {"type": "integer"}, "a": {"type": "string"}},
                   "required": ["a"], "$defs": {"x": {"type": "null"}}});
    let g1 = schema_to_gbnf(&s).unwrap();
    let g2 = schema_to_gbnf(&s).unwrap();
    assert_eq!(g1, g2);
    assert!(g1.starts_with("root ::= "));
    // every rule is defined exactly once and every referenced name is defined
    let defined: Vec<&str> = g1
        .lines()
        .map(|l| l.split(" ::= ").next().unwrap())
        .collect();
    let mut sorted = defined.clone();
    sorted.sort_unstable();
    sorted.dedup();
    assert_eq!(sorted.len(), defined.len(), "{g1}");
}

#[test]
fn required_members_come_first() {
    let s = json!({"type": "object",
                   "properties": {"opt1": {"type": "integer"}, "req1": {"type": "integer"},
                                  "opt2": {"type": "integer"}, "req2": {"type": "integer"}},
                   "required": ["req2", "req1"]});
    let g = schema_to_gbnf(&s).unwrap();
    let body = g.lines().find(|l| l.contains("\"{\"")).unwrap();
    let pos = |n: &str| {
        body.find(&format!("-{n}-kv"))
            .unwrap_or_else(|| panic!("{n} in {body}"))
    };
    // required in `properties` order, then optional in `properties` order
    assert!(
        pos("req1") < pos("req2") && pos("req2") < pos("opt1") && pos("opt1") < pos("opt2"),
        "{body}"
    );
    let e = engine(&g);
    assert!(e.accepts_str(r#"{"req1":1,"req2":2,"opt2":4}"#));
    assert!(!e.accepts_str(r#"{"req2":2,"req1":1}"#));
}

#[test]
fn keys_are_literal_json() {
    let s = json!({"type": "object", "properties": {"a\"b\\c\n": {"const": "\u{1}"}}, "required": ["a\"b\\c\n"]});
    let g = schema_to_gbnf(&s).unwrap();
    let e = engine(&g);
    assert!(e.accepts_str(r#"{"a\"b\\c\n":"\u0001"}"#), "{g}");
    assert!(!e.accepts_str(r#"{"a\"b\\c\n":"\u0002"}"#));
}

#[test]
fn decimals() {
    let d = |x: serde_json::Value| numeric::Decimal::from_number(x.as_number().unwrap()).unwrap();
    assert_eq!(d(json!(1e-7)), test_decimal("0.0000001"));
    assert_eq!(d(json!(-0.0)), test_decimal("0"));
    assert_eq!(d(json!(2.50)), test_decimal("2.5"));
    assert_eq!(d(json!(-12)), test_decimal("-12"));
    assert!(test_decimal("-1.5").cmp(&test_decimal("-1.25")).is_lt());
    assert!(test_decimal("0.10").cmp(&test_decimal("0.1")).is_eq());
    assert!(test_decimal("10").cmp(&test_decimal("9.99")).is_gt());
}

#[test]
fn charsets() {
    let dot = charset::dot();
    assert!(!dot.contains('\n' as u32) && !dot.contains(0x2028) && dot.contains('a' as u32));
    assert!(!dot.contains(0xD800), "no surrogates");
    let w = charset::word();
    assert_eq!(w.complement().complement(), w);
    assert!(w.minus(&charset::digit()).contains('_' as u32));
    assert!(!w.minus(&charset::digit()).contains('5' as u32));
    let s = CharSet::from_ranges(&[(5, 3), (10, 20), (15, 30), (31, 31)]);
    assert_eq!(s.ranges(), &[(10, 31)]);
}

/// Every integer range agrees with arithmetic on a window of values.
#[test]
fn int_ranges_brute_force() {
    let bounds = [
        None,
        Some(-1000),
        Some(-101),
        Some(-100),
        Some(-9),
        Some(-1),
        Some(0),
        Some(1),
        Some(9),
        Some(10),
        Some(99),
        Some(100),
        Some(101),
        Some(909),
        Some(1000),
    ];
    for lo in bounds {
        for hi in bounds {
            let body = numeric::int_range(lo.map(i128::from), hi.map(i128::from));
            let expect_empty = matches!((lo, hi), (Some(a), Some(b)) if a > b);
            assert_eq!(body.is_none(), expect_empty, "{lo:?}..{hi:?}");
            let Some(body) = body else { continue };
            let g = engine(&format!("root ::= {body}\n"));
            for v in -1100i64..=1100 {
                let want = lo.is_none_or(|l| v >= l) && hi.is_none_or(|h| v <= h);
                assert_eq!(
                    g.accepts_str(&v.to_string()),
                    want,
                    "{v} in {lo:?}..{hi:?}: {body}"
                );
            }
            assert!(!g.accepts_str("-0") && !g.accepts_str("007") && !g.accepts_str(""));
        }
    }
}

/// Bounded decimals agree with exact comparison on every number with up to 3 decimals.
#[test]
fn number_ranges_brute_force() {
    let vals = [
        "-2.5", "-1", "-0.05", "0", "0.001", "0.5", "0.55", "1", "1.25", "2",
    ];
    let mut values: Vec<String> = Vec::new();
    for k in -3000i32..=3000 {
        let x = format!(
            "{}{}.{:03}",
            if k < 0 { "-" } else { "" },
            k.abs() / 1000,
            k.abs() % 1000
        );
        values.push(x);
        if k % 1000 == 0 {
            values.push(format!("{}", k / 1000));
        }
    }
    for (i, lo) in vals.iter().enumerate() {
        for hi in &vals[i..] {
            for (le, he) in [(false, false), (true, false), (false, true), (true, true)] {
                let lb = Bound {
                    v: test_decimal(lo),
                    excl: le,
                };
                let hb = Bound {
                    v: test_decimal(hi),
                    excl: he,
                };
                let body = numeric::number_range(Some(&lb), Some(&hb));
                let (l, h): (f64, f64) = (lo.parse().unwrap(), hi.parse().unwrap());
                let Some(body) = body else {
                    assert!(l == h && (le || he), "{lo} {hi} wrongly empty");
                    continue;
                };
                let g = engine(&format!("root ::= {body}\n"));
                for x in &values {
                    let v: f64 = x.parse().unwrap();
                    let want =
                        (if le { v > l } else { v >= l }) && (if he { v < h } else { v <= h });
                    // -0.000 and the like are spelled with a minus only for negatives
                    let want = want && !(x.starts_with('-') && v == 0.0);
                    assert_eq!(
                        g.accepts_str(x),
                        want,
                        "{x} in {lo}{}..{hi}{}: {body}",
                        if le { "(excl)" } else { "" },
                        if he { "(excl)" } else { "" }
                    );
                }
            }
        }
    }
}

/// Keys offered for additional properties: every key but the declared ones, spelled once.
#[test]
fn key_exclusion_brute_force() {
    let names = ["a", "ab", "b\"", "\n", "é"];
    let one = json!({"const": 1});
    let s = json!({"type": "object",
                   "properties": {"a": one, "ab": one, "b\"": one, "\n": one, "é": one},
                   "additionalProperties": {"const": 0}});
    let g = engine(&schema_to_gbnf(&s).unwrap());
    let alphabet = ["a", "b", "\"", "\n", "é", "c"];
    let mut keys = vec![String::new()];
    for _ in 0..3 {
        let mut next = Vec::new();
        for k in &keys {
            for c in alphabet {
                next.push(format!("{k}{c}"));
            }
        }
        keys.extend(next);
        keys.sort();
        keys.dedup();
    }
    for k in &keys {
        let text = format!("{{{}:0}}", serde_json::to_string(k).unwrap());
        assert_eq!(g.accepts_str(&text), !names.contains(&k.as_str()), "{text}");
    }
    // a declared key spelled with a \u escape is not offered as an additional key
    assert!(!g.accepts_str(r#"{"\u0061":0}"#));
}

#[test]
fn fixed_rules_parse() {
    let g = with_fixed(
        "json-value",
        &[
            "json-value",
            "json-integer",
            "fmt-date-time",
            "fmt-uuid",
            "fmt-ipv4",
            "fmt-email",
            "fmt-uri",
            "key-char",
        ],
    );
    let e = engine(&g);
    assert!(e.accepts_str("[1,{\"a\":\"\\ud83d\\ude00\"}]"));
    assert!(!e.accepts_str("\"\\udc00\""), "lone low surrogate");
    assert!(!e.accepts_str("\"\\ud83dx\""), "lone high surrogate");
    assert!(e.accepts_str("1.5e299") && !e.accepts_str("1.5e300") && !e.accepts_str("12e299"));
}

#[test]
fn error_accessors() {
    let e = schema_to_gbnf(&json!({"properties": {"x": {"type": "string", "pattern": "(?!a)"}}}))
        .unwrap_err();
    assert!(matches!(e, SchemaError::Unsupported { .. }));
    assert_eq!((e.keyword(), e.pointer()), ("pattern", "#/properties/x"));
    assert!(e.to_string().contains("lookaround"), "{e}");
}

#[test]
fn prefix_refs_skips_literals_classes_and_counts() {
    let body = r#"a-1 "x\"y z" [^"\]a-z] ( b | "[" c-d{0,20} )? [\\] e "\\" f"#;
    let mut out = String::new();
    crate::grammar::prefix_refs(body, "p-", &mut out);
    assert_eq!(
        out,
        r#"p-a-1 "x\"y z" [^"\]a-z] ( p-b | "[" p-c-d{0,20} )? [\\] p-e "\\" p-f"#
    );
}

#[test]
fn prefixed_rules_are_the_same_rules_renamed() {
    let s = json!({"type": "object", "properties": {"b": {"type": "integer", "minimum": 3},
                   "a": {"type": "string", "format": "date"}, "c": {"$ref": "#/$defs/x"}},
                   "required": ["a"], "$defs": {"x": {"type": "array", "items": {"$ref": "#"}}}});
    let full = schema_to_gbnf(&s).unwrap();
    let (top0, rules0) = crate::schema_to_gbnf_rules(&s, "").unwrap();
    assert_eq!(full, format!("root ::= {top0}\n{rules0}"));
    let (top, rules) = crate::schema_to_gbnf_rules(&s, "q7-").unwrap();
    assert_eq!(top, format!("q7-{top0}"));
    for line in rules.lines() {
        assert!(line.starts_with("q7-"), "{line}");
    }
    // undoing the prefix gives the unprefixed rules back
    assert_eq!(rules.replace("q7-", ""), rules0.replace("q7-", ""));
    assert!(rules.matches("q7-").count() > rules.lines().count());
}

#[test]
fn subschema_refs_resolve_against_the_document() {
    let doc = json!({"type": "object", "properties": {"a%20b/c": {"$ref": "#/$defs/n"}},
                     "$defs": {"n": {"type": "integer", "maximum": 5}}});
    let (top, rules) = crate::subschema_to_gbnf_rules(&doc, "#/properties/a%20b~1c", "x-").unwrap();
    let e = engine(&format!("root ::= {top}\n{rules}"));
    assert!(e.accepts_str("5") && e.accepts_str("-3"));
    assert!(!e.accepts_str("6") && !e.accepts_str("\"5\""));
    let err = crate::subschema_to_gbnf_rules(&doc, "#/properties/nope", "x-").unwrap_err();
    assert_eq!(err.keyword(), "pointer");
    let err = crate::subschema_to_gbnf_rules(
        &json!({"properties": {"a": {"type": "string", "pattern": "(?=a)"}}}),
        "#/properties/a",
        "x-",
    )
    .unwrap_err();
    assert_eq!(
        (err.keyword(), err.pointer()),
        ("pattern", "#/properties/a")
    );
}
