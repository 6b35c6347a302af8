//! Shared helpers for the integration tests: the schema corpus, the independent validator,
//! a one-character-per-token vocabulary and random generation through the grammar.
#![allow(dead_code)]

use std::sync::Arc;

use muser_grammar::{Grammar, GrammarState, Vocab};
use rand::rngs::StdRng;
use rand::Rng;
use serde_json::{json, Value};

pub struct Case {
    pub name: &'static str,
    pub schema: Value,
    /// valid instances the grammar must accept (in compact, pretty and ", "/": " layouts)
    pub valid: Vec<Value>,
    /// instances the schema rejects; the grammar must reject them too
    pub invalid: Vec<Value>,
}

fn case(name: &'static str, schema: Value, valid: Vec<Value>, invalid: Vec<Value>) -> Case {
    Case {
        name,
        schema,
        valid,
        invalid,
    }
}

pub const DRAFT7: &str = "http://json-schema.org/draft-07/schema#";
pub const DRAFT4: &str = "http://json-schema.org/draft-04/schema#";

/// Schemas covering every supported keyword.
pub fn corpus() -> Vec<Case> {
    vec![
        case(
            "any",
            json!({}),
            vec![
                json!(1),
                json!("x"),
                json!(null),
                json!([1, {"a": []}]),
                json!({"k": true, "n": -1.5e-3}),
            ],
            vec![],
        ),
        case(
            "object_any",
            json!({"type": "object"}),
            vec![json!({}), json!({"a": 1, "b": [null, "x"], "c": {"d": {}}})],
            vec![json!([]), json!("x"), json!(1)],
        ),
        case(
            "person",
            json!({
                "type": "object",
                "properties": {
                    "name": {"type": "string", "minLength": 1, "maxLength": 10},
                    "age": {"type": "integer", "minimum": 0, "maximum": 150},
                    "email": {"type": "string", "format": "email"},
                    "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 3}
                },
                "required": ["name", "age"],
                "additionalProperties": false
            }),
            vec![
                json!({"name": "Al", "age": 30}),
                json!({"name": "Bo", "age": 0, "email": "a.b@ex-ample.co", "tags": ["x", ""]}),
                json!({"name": "Çé😀", "age": 150, "tags": []}),
            ],
            vec![
                json!({"name": "", "age": 3}),
                json!({"age": 3}),
                json!({"name": "x", "age": 151}),
                json!({"name": "x", "age": 3, "extra": 1}),
                json!({"name": "x", "age": 3, "tags": ["a", "b", "c", "d"]}),
                json!({"name": "x", "age": 3.5}),
            ],
        ),
        case(
            "additional_schema",
            json!({"type": "object", "properties": {"a": {"type": "string"}},
                   "additionalProperties": {"type": "integer"}}),
            vec![
                json!({"a": "x", "zz": 1, "q": -2}),
                json!({"b": 3}),
                json!({}),
            ],
            vec![json!({"b": "s"}), json!({"a": 1})],
        ),
        case(
            "odd_keys",
            json!({"type": "object",
                   "properties": {"we\"ird": {"type": "integer"}, "ü-ß": {"type": "boolean"},
                                  "a\\b\n": {"type": "null"}, "a": {"type": "string"}},
                   "additionalProperties": true}),
            vec![
                json!({"we\"ird": 1, "zzz": [1]}),
                json!({"other": "x", "a\\b": 1, "ü": 2, "a\\b\n\n": 3}),
                json!({"ü-ß": false, "a\\b\n": null}),
            ],
            vec![
                json!({"we\"ird": "s"}),
                json!({"ü-ß": 1}),
                json!({"a": 1}),
                json!({"a\\b\n": 0}),
            ],
        ),
        case(
            "closed_empty_object",
            json!({"type": "object", "additionalProperties": false}),
            vec![json!({})],
            vec![json!({"a": 1}), json!([])],
        ),
        case(
            "required_undeclared",
            json!({"type": "object", "required": ["id"], "additionalProperties": {"type": "integer"}}),
            vec![json!({"id": 1}), json!({"id": 2, "x": 3})],
            vec![json!({}), json!({"id": "s"}), json!({"id": 1, "x": "y"})],
        ),
        case(
            "nested",
            json!({"type": "object",
                   "properties": {"points": {"type": "array", "minItems": 1, "maxItems": 4,
                        "items": {"type": "object",
                                  "properties": {"x": {"type": "number"}, "y": {"type": "number"}},
                                  "required": ["x", "y"]}}},
                   "required": ["points"]}),
            vec![
                json!({"points": [{"x": 1, "y": 2.5}]}),
                json!({"points": [{"x": -0.5, "y": 1e20}, {"x": 0, "y": 0}]}),
            ],
            vec![
                json!({"points": []}),
                json!({"points": [{"x": 1}]}),
                json!({}),
            ],
        ),
        case(
            "int_array",
            json!({"type": "array", "items": {"type": "integer", "minimum": -3, "maximum": 3},
                   "minItems": 2, "maxItems": 5}),
            vec![json!([0, 0]), json!([-3, 3, 1, 2, -1])],
            vec![
                json!([1]),
                json!([1, 2, 3, 4, 5, 6]),
                json!([4, 0]),
                json!([1, 1.5]),
            ],
        ),
        case(
            "any_array",
            json!({"type": "array"}),
            vec![json!([]), json!([1, "a", [null], {"b": false}])],
            vec![json!({}), json!(1)],
        ),
        case(
            "tuple",
            json!({"type": "array", "prefixItems": [{"type": "string"}, {"type": "integer"}, {"type": "boolean"}]}),
            vec![json!(["a", 1, true])],
            vec![json!([1, "a", true]), json!(["a", "b"])],
        ),
        case(
            "tuple_tail",
            json!({"type": "array", "prefixItems": [{"const": "cmd"}], "items": {"type": "number"},
                   "minItems": 1, "maxItems": 4}),
            vec![
                json!(["cmd"]),
                json!(["cmd", 1.5, 2]),
                json!(["cmd", 1, 2, 3]),
            ],
            vec![
                json!(["x"]),
                json!(["cmd", "y"]),
                json!([]),
                json!(["cmd", 1, 2, 3, 4]),
            ],
        ),
        case(
            "tuple_draft7",
            json!({"$schema": DRAFT7, "type": "array", "items": [{"type": "integer"}, {"type": "string"}],
                   "additionalItems": false, "minItems": 1}),
            vec![json!([1]), json!([1, "a"])],
            vec![json!([1, "a", 2]), json!(["a"]), json!([])],
        ),
        case(
            "string_len",
            json!({"type": "string", "minLength": 2, "maxLength": 5}),
            vec![json!("ab"), json!("é😀\"\n\\"), json!("\u{1}\u{7f}a")],
            vec![json!("a"), json!("abcdef"), json!(1)],
        ),
        case(
            "pattern_anchored",
            json!({"type": "string", "pattern": "^[A-Z]{2}-\\d{3,4}$"}),
            vec![json!("AB-123"), json!("ZZ-0000")],
            vec![
                json!("ab-123"),
                json!("AB-12"),
                json!("AB-12345"),
                json!(" AB-123"),
            ],
        ),
        case(
            "pattern_unanchored",
            json!({"type": "string", "pattern": "foo|ba?r"}),
            vec![
                json!("xfoo"),
                json!("br!"),
                json!("bar"),
                json!("\"foo\"\n"),
            ],
            vec![json!("fo"), json!(""), json!("baar")],
        ),
        case(
            "pattern_email_like",
            json!({"type": "string", "pattern": "^(?:\\w+\\.)*\\w+@[a-z]+\\.(com|org)$"}),
            vec![json!("a.b_c@x.com"), json!("Z9@yy.org")],
            vec![json!("a@b.net"), json!("@x.com"), json!("a..b@x.com")],
        ),
        case(
            "pattern_escapes",
            json!({"type": "string", "pattern": "^a[\"\\\\\\n\\u00e9]b(?<tail>\\t|\\x41)?$"}),
            vec![
                json!("a\"b"),
                json!("a\\b"),
                json!("a\nb"),
                json!("aéb\t"),
                json!("a\"bA"),
            ],
            vec![json!("axb"), json!("ab"), json!("a\"bB")],
        ),
        case(
            "pattern_negated",
            json!({"type": "string", "pattern": "^[^\\s\"\\\\]{1,8}$"}),
            vec![json!("abc"), json!("é😀!")],
            vec![
                json!("a b"),
                json!("a\"b"),
                json!(""),
                json!("123456789"),
                json!("a\u{3000}"),
            ],
        ),
        case(
            "pattern_dot",
            json!({"type": "string", "pattern": "^.{2}é+$"}),
            vec![json!("xyé"), json!("\"\\éé")],
            vec![json!("x\né"), json!("xé"), json!("xy")],
        ),
        case(
            "date",
            json!({"type": "string", "format": "date"}),
            vec![
                json!("2024-02-29"),
                json!("1999-12-31"),
                json!("2000-02-29"),
            ],
            vec![
                json!("2023-02-29"),
                json!("1900-02-29"),
                json!("2024-04-31"),
                json!("2024-13-01"),
            ],
        ),
        case(
            "time",
            json!({"type": "string", "format": "time"}),
            vec![json!("23:59:59Z"), json!("00:00:00.123+05:30")],
            vec![json!("24:00:00Z"), json!("12:00:00")],
        ),
        case(
            "date_time",
            json!({"type": "string", "format": "date-time"}),
            vec![
                json!("2024-01-15T10:20:30Z"),
                json!("2024-01-15T10:20:30.5-01:00"),
            ],
            vec![json!("2024-01-15 10:20:30Z"), json!("2024-01-32T10:20:30Z")],
        ),
        case(
            "uuid_ipv4",
            json!({"type": "object",
                   "properties": {"id": {"type": "string", "format": "uuid"},
                                  "ip": {"type": "string", "format": "ipv4"}},
                   "required": ["id", "ip"]}),
            vec![json!({"id": "123e4567-e89b-12d3-a456-426614174000", "ip": "192.168.0.255"})],
            vec![
                json!({"id": "123e4567e89b12d3a456426614174000", "ip": "1.2.3.4"}),
                json!({"id": "123e4567-e89b-12d3-a456-426614174000", "ip": "256.1.1.1"}),
            ],
        ),
        case(
            "hosts",
            json!({"type": "object",
                   "properties": {"host": {"type": "string", "format": "hostname"},
                                  "mail": {"type": "string", "format": "email"},
                                  "link": {"type": "string", "format": "uri"}},
                   "required": ["host", "mail", "link"]}),
            vec![
                json!({"host": "api.example-1.com", "mail": "x_y+z@mail.example.org",
                        "link": "https://example.com:8080/a/b.c"}),
            ],
            vec![json!({"host": "-bad.com", "mail": "a@b.c", "link": "https://x.y"})],
        ),
        case(
            "int_negative",
            json!({"type": "integer", "minimum": -120, "maximum": -7}),
            vec![json!(-120), json!(-7), json!(-99)],
            vec![json!(-6), json!(-121), json!(0), json!(5)],
        ),
        case(
            "int_exclusive",
            json!({"type": "integer", "exclusiveMinimum": 99, "exclusiveMaximum": 1001}),
            vec![json!(100), json!(1000), json!(555)],
            vec![json!(99), json!(1001), json!(-100)],
        ),
        case(
            "int_frac_min",
            json!({"type": "integer", "minimum": 1.5}),
            vec![json!(2), json!(123456789i64)],
            vec![json!(1), json!(0), json!(-3)],
        ),
        case(
            "int_max_only",
            json!({"type": "integer", "maximum": -10}),
            vec![json!(-10), json!(-123456)],
            vec![json!(-9), json!(0), json!(10)],
        ),
        case(
            "num_range",
            json!({"type": "number", "minimum": -2.5, "exclusiveMaximum": 3.25}),
            vec![json!(-2.5), json!(3.24), json!(0), json!(-1), json!(3.2499)],
            vec![json!(-2.51), json!(3.25), json!(4)],
        ),
        case(
            "num_positive",
            json!({"type": "number", "exclusiveMinimum": 0}),
            vec![json!(0.001), json!(5), json!(123.5)],
            vec![json!(0), json!(-0.5)],
        ),
        case(
            "num_tiny_range",
            json!({"type": "number", "minimum": 0.001, "maximum": 0.002}),
            vec![json!(0.001), json!(0.0015), json!(0.002)],
            vec![json!(0.0021), json!(0.0009), json!(0)],
        ),
        case(
            "number",
            json!({"type": "number"}),
            vec![
                json!(0),
                json!(-1.5),
                json!(1e20),
                json!(1.2345678901234567e-200),
                json!(123456789012i64),
            ],
            vec![json!("1"), json!(null)],
        ),
        case(
            "enum_mixed",
            json!({"enum": ["red", 1, null, {"a": [1, 2]}, [true], "qu\"ote\n"]}),
            vec![
                json!("red"),
                json!(1),
                json!(null),
                json!({"a": [1, 2]}),
                json!([true]),
                json!("qu\"ote\n"),
            ],
            vec![json!("blue"), json!(2), json!([false])],
        ),
        case(
            "enum_typed",
            json!({"type": "string", "enum": ["a", "b", 3]}),
            vec![json!("a"), json!("b")],
            vec![json!(3), json!("c")],
        ),
        case(
            "const",
            json!({"const": {"k": "v", "n": [1, 2.5]}}),
            vec![json!({"k": "v", "n": [1, 2.5]})],
            vec![json!({"k": "v"}), json!("v")],
        ),
        case(
            "any_of",
            json!({"anyOf": [{"type": "string", "maxLength": 3}, {"type": "integer", "minimum": 10}]}),
            vec![json!("abc"), json!(10), json!("")],
            vec![json!("abcd"), json!(9), json!(null)],
        ),
        case(
            "one_of_tagged",
            json!({"oneOf": [
                {"type": "object", "properties": {"kind": {"const": "circle"}, "r": {"type": "number"}},
                 "required": ["kind", "r"]},
                {"type": "object", "properties": {"kind": {"const": "rect"}, "w": {"type": "number"},
                 "h": {"type": "number"}}, "required": ["kind", "w", "h"]}]}),
            vec![
                json!({"kind": "circle", "r": 1}),
                json!({"kind": "rect", "w": 1, "h": 2}),
            ],
            vec![json!({"kind": "circle", "w": 1}), json!({"kind": "tri"})],
        ),
        case(
            "one_of_types",
            json!({"oneOf": [{"type": "string"}, {"type": "null"}, {"type": "array", "items": {"type": "boolean"}}]}),
            vec![json!("s"), json!(null), json!([true, false])],
            vec![json!(1), json!([1])],
        ),
        case(
            "all_of_ref",
            json!({"allOf": [{"$ref": "#/$defs/base"},
                             {"properties": {"extra": {"type": "boolean"}}, "required": ["extra"]}],
                   "$defs": {"base": {"type": "object", "properties": {"id": {"type": "integer", "minimum": 1}},
                                      "required": ["id"]}}}),
            vec![json!({"id": 1, "extra": true})],
            vec![
                json!({"id": 0, "extra": true}),
                json!({"id": 1}),
                json!({"extra": false}),
            ],
        ),
        case(
            "required_any_of",
            json!({"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                   "anyOf": [{"required": ["a"]}, {"required": ["b"]}]}),
            vec![json!({"a": 1}), json!({"b": 2}), json!({"a": 1, "b": 2})],
            vec![json!({}), json!({"a": "x"})],
        ),
        case(
            "definitions_draft7",
            json!({"$schema": DRAFT7, "definitions": {"pos": {"type": "integer", "minimum": 0}},
                   "type": "array", "items": {"$ref": "#/definitions/pos"}}),
            vec![json!([]), json!([0, 5, 100])],
            vec![json!([-1]), json!(["a"])],
        ),
        case(
            "tree",
            json!({"$defs": {"node": {"type": "object",
                     "properties": {"value": {"type": "integer"},
                                    "children": {"type": "array", "items": {"$ref": "#/$defs/node"}, "maxItems": 2}},
                     "required": ["value"]}},
                   "$ref": "#/$defs/node"}),
            vec![
                json!({"value": 1}),
                json!({"value": 1, "children": [{"value": 2, "children": []}, {"value": 3}]}),
            ],
            vec![
                json!({"value": 1, "children": [{}]}),
                json!({"children": []}),
            ],
        ),
        case(
            "linked_list",
            json!({"type": "object",
                   "properties": {"v": {"type": "string", "maxLength": 2},
                                  "next": {"anyOf": [{"$ref": "#"}, {"type": "null"}]}},
                   "required": ["v", "next"]}),
            vec![
                json!({"v": "a", "next": null}),
                json!({"v": "a", "next": {"v": "bc", "next": null}}),
            ],
            vec![
                json!({"v": "a"}),
                json!({"v": "a", "next": {"v": "abc", "next": null}}),
            ],
        ),
        case(
            "nullable",
            json!({"type": ["string", "null"], "maxLength": 4}),
            vec![json!("abcd"), json!(null)],
            vec![json!("abcde"), json!(1)],
        ),
        case(
            "bool_null",
            json!({"type": "object", "properties": {"b": {"type": "boolean"}, "n": {"type": "null"}},
                   "required": ["b", "n"]}),
            vec![json!({"b": true, "n": null})],
            vec![json!({"b": 1, "n": null}), json!({"b": true, "n": 0})],
        ),
        case(
            "inferred_types",
            json!({"minimum": 5, "maxLength": 2}),
            vec![json!(5), json!("ab"), json!(7.5)],
            vec![json!(4), json!("abc")],
        ),
        case(
            "unevaluated_closed",
            json!({"allOf": [{"properties": {"a": {"type": "string"}}}],
                   "properties": {"b": {"type": "integer"}}, "unevaluatedProperties": false}),
            vec![json!({"a": "x", "b": 1}), json!({}), json!({"b": 2})],
            vec![json!({"c": 1}), json!({"a": 1})],
        ),
        case(
            "false_property",
            json!({"type": "object", "properties": {"a": false, "b": {"type": "integer"}},
                   "additionalProperties": true}),
            vec![json!({"b": 1, "c": 2}), json!({})],
            vec![json!({"a": 1}), json!({"b": "x"})],
        ),
        case(
            "draft4_exclusive",
            json!({"$schema": DRAFT4, "type": "number", "minimum": 1, "exclusiveMinimum": true, "maximum": 2}),
            vec![json!(1.5), json!(2), json!(1.0001)],
            vec![json!(1), json!(2.5)],
        ),
        case(
            "nested_enum_arrays",
            json!({"type": "array", "maxItems": 3,
                   "items": {"type": "array", "items": {"enum": ["x", "y"]}, "minItems": 1, "maxItems": 2}}),
            vec![json!([]), json!([["x"], ["y", "x"]])],
            vec![
                json!([[]]),
                json!([["z"]]),
                json!([["x"], ["x"], ["x"], ["x"]]),
            ],
        ),
        case(
            "max_properties",
            json!({"type": "object", "properties": {"a": {"type": "integer"}}, "additionalProperties": true,
                   "maxProperties": 1}),
            vec![json!({"a": 1}), json!({})],
            vec![json!({"a": 1, "b": 2}), json!({"a": "x"})],
        ),
        case(
            "unique_single",
            json!({"type": "array", "uniqueItems": true, "maxItems": 1}),
            vec![json!([]), json!([{"a": 1}])],
            vec![json!([1, 2])],
        ),
        case(
            "number_multiple_of_one",
            json!({"type": "number", "multipleOf": 1, "minimum": -3, "maximum": 3}),
            vec![json!(-3), json!(0), json!(3)],
            vec![json!(1.5), json!(4)],
        ),
        case(
            "control_pattern",
            json!({"type": "string", "pattern": "^\\t[\\x00-\\x1f]?$"}),
            vec![json!("\t"), json!("\t\u{1}"), json!("\t\n")],
            vec![json!("\t "), json!(" ")],
        ),
        case(
            "openai_strict",
            json!({"type": "object",
                   "properties": {
                       "steps": {"type": "array", "items": {"type": "object",
                           "properties": {"explanation": {"type": "string"}, "output": {"type": "string"}},
                           "required": ["explanation", "output"], "additionalProperties": false}},
                       "final_answer": {"type": "string"}},
                   "required": ["steps", "final_answer"], "additionalProperties": false}),
            vec![json!({"steps": [{"explanation": "e", "output": "o"}], "final_answer": "42"})],
            vec![
                json!({"steps": [{"explanation": "e"}], "final_answer": "42"}),
                json!({"final_answer": "x"}),
            ],
        ),
        case(
            "pydantic_like",
            json!({"properties": {
                       "name": {"title": "Name", "type": "string", "description": "the name"},
                       "nick": {"anyOf": [{"type": "string"}, {"type": "null"}], "default": null, "title": "Nick"},
                       "kind": {"$ref": "#/$defs/Kind"}},
                   "required": ["name", "kind"], "title": "User", "type": "object",
                   "$defs": {"Kind": {"enum": ["admin", "user"], "title": "Kind", "type": "string"}}}),
            vec![
                json!({"name": "n", "kind": "user"}),
                json!({"name": "n", "kind": "admin", "nick": null}),
            ],
            vec![json!({"name": "n", "kind": "root"}), json!({"name": "n"})],
        ),
    ]
}

pub fn validator(schema: &Value) -> jsonschema::Validator {
    jsonschema::options()
        .should_validate_formats(true)
        .build(schema)
        .unwrap_or_else(|e| panic!("validator rejects schema {schema}: {e}"))
}

pub fn grammar_for(schema: &Value) -> (String, Arc<Grammar>) {
    let gbnf = muser_jsonschema::schema_to_gbnf(schema)
        .unwrap_or_else(|e| panic!("conversion failed for {schema}: {e}"));
    let g = Grammar::parse(&gbnf)
        .unwrap_or_else(|e| panic!("grammar does not parse for {schema}: {e}\n{gbnf}"));
    (gbnf, Arc::new(g))
}

/// Python's `json.dumps` default layout (", " and ": ").
pub fn python_layout(v: &Value) -> String {
    match v {
        Value::Array(a) => {
            let items: Vec<String> = a.iter().map(python_layout).collect();
            format!("[{}]", items.join(", "))
        }
        Value::Object(m) => {
            let items: Vec<String> = m
                .iter()
                .map(|(k, v)| format!("{}: {}", Value::String(k.clone()), python_layout(v)))
                .collect();
            format!("{{{}}}", items.join(", "))
        }
        other => other.to_string(),
    }
}

pub fn layouts(v: &Value) -> Vec<String> {
    vec![
        serde_json::to_string(v).unwrap(),
        serde_json::to_string_pretty(v).unwrap(),
        python_layout(v),
    ]
}

/// Single-character pieces (printable ASCII, whitespace, a few multi-byte characters) and
/// one end-of-generation token (the last id).
pub struct CharVocab {
    pub vocab: Vocab,
    pub chars: Vec<char>,
    pub eog: u32,
}

pub fn char_vocab() -> CharVocab {
    let mut chars: Vec<char> = (0x20u8..0x7f).map(char::from).collect();
    chars.extend([
        '\n', '\t', '\r', '\u{1}', 'é', 'ß', '中', '😀', '\u{2028}', '\u{3000}',
    ]);
    let mut pieces: Vec<Vec<u8>> = chars.iter().map(|c| c.to_string().into_bytes()).collect();
    let mut eog = vec![false; pieces.len()];
    pieces.push(b"</s>".to_vec());
    eog.push(true);
    let eog_id = (pieces.len() - 1) as u32;
    CharVocab {
        vocab: Vocab::new(pieces, eog),
        chars,
        eog: eog_id,
    }
}

pub enum Walk {
    Done(String),
    /// ran past the length cap
    TooLong,
}

/// A random generation through the grammar: at each step one of the allowed characters is
/// picked uniformly; the end token is taken with probability `p_end` when allowed (always once
/// past `soft` characters, where closing characters are also preferred, then characters that
/// occur in `hint` — the schema's text — so that patterns get completed).
pub fn random_walk(
    g: &Arc<Grammar>,
    cv: &CharVocab,
    rng: &mut StdRng,
    p_end: f64,
    soft: usize,
    hard: usize,
    hint: &str,
) -> Walk {
    let mut st = GrammarState::new(g.clone());
    let mut out = String::new();
    let n = cv.chars.len() as u32;
    loop {
        let len = out.chars().count();
        if len >= hard {
            if std::env::var("WALK_DEBUG").is_ok() {
                eprintln!("too long: {out:?}");
            }
            return Walk::TooLong;
        }
        let can_end = st.allows(&cv.vocab, cv.eog);
        assert_eq!(
            can_end,
            st.can_end(),
            "allows(EOG) and can_end disagree after {out:?}"
        );
        if can_end && (len >= soft || rng.gen_bool(p_end)) {
            st.accept(&cv.vocab, cv.eog)
                .expect("EOG allowed but not accepted");
            return Walk::Done(out);
        }
        let allowed: Vec<u32> = (0..n).filter(|&t| st.allows(&cv.vocab, t)).collect();
        if allowed.is_empty() {
            assert!(can_end, "dead end: nothing allowed after {out:?}");
            return Walk::Done(out);
        }
        let pick = if len >= soft {
            let pref = |set: &[char]| -> Vec<u32> {
                allowed
                    .iter()
                    .copied()
                    .filter(|&t| set.contains(&cv.chars[t as usize]))
                    .collect()
            };
            let closing = pref(&[']', '}']);
            let quote = pref(&['"']);
            let calm: Vec<u32> = allowed
                .iter()
                .copied()
                .filter(|&t| {
                    !matches!(
                        cv.chars[t as usize],
                        '[' | '{' | ',' | ' ' | '\n' | '\t' | '\\' | ':'
                    )
                })
                .collect();
            let hinted: Vec<u32> = calm
                .iter()
                .copied()
                .filter(|&t| hint.contains(cv.chars[t as usize]))
                .collect();
            // inside a JSON string (by a lexical scan of the prefix), `]`/`}` are just text
            let mut in_string = false;
            let mut escaped = false;
            for c in out.chars() {
                if escaped {
                    escaped = false;
                } else if in_string && c == '\\' {
                    escaped = true;
                } else if c == '"' {
                    in_string = !in_string;
                }
            }
            let from = if !closing.is_empty() && !in_string {
                closing
            } else if !quote.is_empty() && rng.gen_bool(0.5) {
                quote
            } else if !hinted.is_empty() && rng.gen_bool(0.7) {
                hinted
            } else if !calm.is_empty() {
                calm
            } else {
                allowed.clone()
            };
            from[rng.gen_range(0..from.len())]
        } else {
            allowed[rng.gen_range(0..allowed.len())]
        };
        st.accept(&cv.vocab, pick)
            .unwrap_or_else(|e| panic!("allowed token {pick} not accepted after {out:?}: {e}"));
        out.push(cv.chars[pick as usize]);
    }
}
