//! Hand-written valid instances are accepted in the usual layouts; invalid ones are rejected.

mod common;

use common::{corpus, grammar_for, layouts, validator};

#[test]
fn valid_instances_accepted_invalid_rejected() {
    let mut accepted = 0;
    let mut rejected = 0;
    for case in corpus() {
        let (gbnf, g) = grammar_for(&case.schema);
        let val = validator(&case.schema);
        for v in &case.valid {
            assert!(
                val.is_valid(v),
                "[{}] test data: {v} should be valid",
                case.name
            );
            for text in layouts(v) {
                assert!(
                    g.accepts_str(&text),
                    "[{}] rejects valid {text:?}\n{gbnf}",
                    case.name
                );
                accepted += 1;
            }
        }
        for v in &case.invalid {
            assert!(
                !val.is_valid(v),
                "[{}] test data: {v} should be invalid",
                case.name
            );
            for text in layouts(v) {
                assert!(
                    !g.accepts_str(&text),
                    "[{}] accepts invalid {text:?}\n{gbnf}",
                    case.name
                );
                rejected += 1;
            }
        }
    }
    eprintln!("completeness: {accepted} layouts accepted, {rejected} rejected");
}

/// `{}` is any JSON value, `{"type":"object"}` (response_format json_object) any object.
#[test]
fn json_object_and_any_value_modes() {
    let (_, any) = grammar_for(&serde_json::json!({}));
    let (_, obj) = grammar_for(&serde_json::json!({"type": "object"}));
    for text in [
        "1",
        "-0.5e+10",
        "\"a\\u00e9\\ud83d\\ude00\\/\"",
        "null",
        "true",
        "[]",
        "[1, [2, {\"a\": null}]]",
        "{}",
        "{\"k\": {\"j\": [1.5, \"x\"]}}",
        "{\n  \"a\": 1\n}",
    ] {
        assert!(any.accepts_str(text), "any rejects {text:?}");
        assert_eq!(
            obj.accepts_str(text),
            text.starts_with('{'),
            "object mode on {text:?}"
        );
    }
    for text in [
        "",
        " 1",
        "1 ",
        "[1,]",
        "{\"a\"}",
        "\"\\ud800\"",
        "01",
        "1.",
        "\"a\nb\"",
        "nul",
    ] {
        assert!(!any.accepts_str(text), "any accepts {text:?}");
        assert!(!obj.accepts_str(text), "object accepts {text:?}");
    }
}
