//! Unsupported or malformed schemas give a SchemaError naming the keyword and its JSON pointer;
//! random garbage never panics; whatever converts parses and generates valid instances.

mod common;

use common::{char_vocab, random_walk, Walk};
use muser_jsonschema::{schema_to_gbnf, SchemaError};
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use serde_json::{json, Map, Value};

#[derive(Debug, PartialEq)]
enum Kind {
    Unsupported,
    Invalid,
    Unsat,
    Deep,
    Complex,
}

fn kind(e: &SchemaError) -> Kind {
    match e {
        SchemaError::Unsupported { .. } => Kind::Unsupported,
        SchemaError::Invalid { .. } => Kind::Invalid,
        SchemaError::Unsatisfiable { .. } => Kind::Unsat,
        SchemaError::TooDeep { .. } => Kind::Deep,
        SchemaError::TooComplex { .. } => Kind::Complex,
    }
}

#[test]
fn errors_name_keyword_and_pointer() {
    use Kind::*;
    let cases: Vec<(Value, Kind, &str, &str)> = vec![
        (json!({"not": {}}), Unsupported, "not", "#"),
        (
            json!({"type": "object", "properties": {"a": {"if": {}, "then": {}}}}),
            Unsupported,
            "if",
            "#/properties/a",
        ),
        (
            json!({"$ref": "http://example.com/s.json"}),
            Unsupported,
            "$ref",
            "#",
        ),
        (json!({"$ref": "other.json#/a"}), Unsupported, "$ref", "#"),
        (
            json!({"items": {"$ref": "#/$defs/missing"}}),
            Invalid,
            "$ref",
            "#/items",
        ),
        (json!({"$ref": "#foo"}), Unsupported, "$ref", "#"),
        (
            json!({"type": "string", "pattern": "(?=a)b"}),
            Unsupported,
            "pattern",
            "#",
        ),
        (
            json!({"type": "string", "pattern": "(a)\\1"}),
            Unsupported,
            "pattern",
            "#",
        ),
        (
            json!({"type": "string", "pattern": "\\bword"}),
            Unsupported,
            "pattern",
            "#",
        ),
        (
            json!({"type": "string", "pattern": "\\p{L}"}),
            Unsupported,
            "pattern",
            "#",
        ),
        (
            json!({"type": "string", "pattern": "a^b"}),
            Unsupported,
            "pattern",
            "#",
        ),
        (
            json!({"type": "string", "pattern": "(ab"}),
            Invalid,
            "pattern",
            "#",
        ),
        (
            json!({"type": "string", "pattern": "a{3,2}"}),
            Invalid,
            "pattern",
            "#",
        ),
        (
            json!({"type": "string", "pattern": "*a"}),
            Invalid,
            "pattern",
            "#",
        ),
        (
            json!({"type": "string", "pattern": "a{99999}"}),
            Unsupported,
            "pattern",
            "#",
        ),
        (
            json!({"type": "string", "format": "ipv6"}),
            Unsupported,
            "format",
            "#",
        ),
        (
            json!({"type": "array", "uniqueItems": true}),
            Unsupported,
            "uniqueItems",
            "#",
        ),
        (
            json!({"type": "array", "contains": {"type": "integer"}}),
            Unsupported,
            "contains",
            "#",
        ),
        (
            json!({"type": "number", "multipleOf": 0.5}),
            Unsupported,
            "multipleOf",
            "#",
        ),
        (
            json!({"patternProperties": {"^x": {}}}),
            Unsupported,
            "patternProperties",
            "#",
        ),
        (
            json!({"type": "object", "propertyNames": {"maxLength": 3}}),
            Unsupported,
            "propertyNames",
            "#",
        ),
        (
            json!({"dependentRequired": {"a": ["b"]}}),
            Unsupported,
            "dependentRequired",
            "#",
        ),
        (
            json!({"unevaluatedProperties": {"type": "string"}}),
            Unsupported,
            "unevaluatedProperties",
            "#",
        ),
        (json!({"type": "kaboom"}), Invalid, "type", "#"),
        (json!({"type": 123}), Invalid, "type", "#"),
        (
            json!({"type": "integer", "minimum": 10, "maximum": 5}),
            Unsat,
            "minimum",
            "#",
        ),
        (
            json!({"type": "number", "exclusiveMinimum": 1, "maximum": 1}),
            Unsat,
            "minimum",
            "#",
        ),
        (
            json!({"oneOf": [{"type": "number"}, {"type": "integer"}]}),
            Unsupported,
            "oneOf",
            "#",
        ),
        (
            json!({"type": "string", "minLength": 5000}),
            Unsupported,
            "minLength",
            "#",
        ),
        (
            json!({"type": "string", "maxLength": -1}),
            Invalid,
            "maxLength",
            "#",
        ),
        (
            json!({"type": "string", "minLength": 3, "maxLength": 2}),
            Unsat,
            "maxLength",
            "#",
        ),
        (
            json!({"type": "array", "minItems": 3, "maxItems": 2}),
            Unsat,
            "minItems",
            "#",
        ),
        (
            json!({"anyOf": [{"$ref": "#"}]}),
            Unsupported,
            "$ref",
            "#/anyOf/0",
        ),
        (
            json!({"$ref": "#/$defs/a", "$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}}}),
            Unsupported,
            "$ref",
            "#",
        ),
        (
            json!({"type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x", "y"],
                   "additionalProperties": false}),
            Unsat,
            "required",
            "#",
        ),
        (
            json!({"allOf": [{"type": "string"}, {"type": "integer"}]}),
            Unsat,
            "type",
            "#",
        ),
        (
            json!({"allOf": [{"pattern": "a"}, {"pattern": "b"}]}),
            Unsupported,
            "pattern",
            "#",
        ),
        (
            json!({"enum": ["a"], "minLength": 1}),
            Unsupported,
            "minLength",
            "#",
        ),
        (
            json!({"type": "integer", "enum": ["a"]}),
            Unsat,
            "enum",
            "#",
        ),
        (json!({"enum": []}), Invalid, "enum", "#"),
        (json!(false), Unsat, "false", "#"),
        (json!(42), Invalid, "schema", "#"),
        (
            json!({"properties": {"a": 1}}),
            Invalid,
            "schema",
            "#/properties/a",
        ),
        (
            json!({"type": "object", "properties": {"a": {"type": "string", "format": "date", "pattern": "^x$"}}}),
            Unsupported,
            "pattern",
            "#/properties/a",
        ),
        (
            json!({"$defs": {"x": {"type": "integer", "$id": "foo"}}, "$ref": "#/$defs/x"}),
            Unsupported,
            "$id",
            "#/$defs/x",
        ),
        (
            json!({"properties": {"a/b~c": {"not": {}}}}),
            Unsupported,
            "not",
            "#/properties/a~1b~0c",
        ),
        (
            json!({"items": [{"type": "integer"}], "prefixItems": [{}]}),
            Invalid,
            "items",
            "#",
        ),
        (
            json!({"type": "object", "minProperties": 1}),
            Unsupported,
            "minProperties",
            "#",
        ),
        (json!({"$ref": 5}), Invalid, "$ref", "#"),
        (json!({"allOf": []}), Invalid, "allOf", "#"),
        (json!({"anyOf": [false, false]}), Unsat, "anyOf", "#"),
        (
            json!({"type": "string", "maxLength": 1e300}),
            Unsupported,
            "maxLength",
            "#",
        ),
    ];
    for (schema, k, kw, ptr) in cases {
        let err = schema_to_gbnf(&schema).expect_err(&format!("{schema} should fail"));
        assert_eq!(kind(&err), k, "{schema}: {err}");
        assert_eq!(err.keyword(), kw, "{schema}: {err}");
        assert_eq!(err.pointer(), ptr, "{schema}: {err}");
        let msg = err.to_string();
        assert!(
            msg.contains(kw) && msg.contains(ptr),
            "message lacks keyword/pointer: {msg}"
        );
    }
}

fn nest(depth: usize, key: &str) -> Value {
    let mut v = json!({"type": "integer"});
    for _ in 0..depth {
        let mut m = Map::new();
        m.insert(key.to_string(), v);
        v = Value::Object(m);
    }
    v
}

#[test]
fn deep_nesting_is_an_error_not_a_crash() {
    // runs on a small stack to catch unbounded recursion
    std::thread::Builder::new()
        .stack_size(1 << 20)
        .spawn(|| {
            for key in ["items", "allOf-like", "not-a-keyword"] {
                let v = if key == "allOf-like" {
                    let mut v = json!({"type": "integer"});
                    for _ in 0..300 {
                        v = json!({"allOf": [v]});
                    }
                    v
                } else {
                    nest(300, key)
                };
                let r = schema_to_gbnf(&v);
                if key == "not-a-keyword" {
                    assert!(r.is_ok(), "unknown keywords are ignored");
                } else {
                    let e = r.expect_err("too deep");
                    assert!(matches!(e, SchemaError::TooDeep { .. }), "{e}");
                }
            }
            // moderate nesting is fine
            assert!(schema_to_gbnf(&nest(40, "items")).is_ok());
            // a chain of $refs longer than the limit
            let mut defs = Map::new();
            for i in 0..200 {
                defs.insert(
                    format!("d{i}"),
                    json!({"allOf": [{"$ref": format!("#/$defs/d{}", i + 1)}]}),
                );
            }
            defs.insert("d200".into(), json!({"type": "null"}));
            let e = schema_to_gbnf(&json!({"$defs": defs, "$ref": "#/$defs/d0"})).unwrap_err();
            assert!(matches!(e, SchemaError::TooDeep { .. }), "{e}");
        })
        .unwrap()
        .join()
        .unwrap();
}

// ---- fuzzing -----------------------------------------------------------------------------

const NAMES: &[&str] = &["a", "b", "c d", "\"q\"", "é", "x/y"];
const PATTERNS: &[&str] = &[
    "^a+$",
    "b",
    "^[0-9]{2}$",
    "(x|y)*",
    "^\\w+@\\w+$",
    "(?=x)",
    "[",
    "a{2,1}",
    "\\d\\D",
    "^$",
    ".*",
    "(a|)+",
];
const FORMATS: &[&str] = &[
    "date",
    "time",
    "date-time",
    "uuid",
    "ipv4",
    "email",
    "hostname",
    "uri",
    "ipv6",
    "color",
    "int32",
];
const TYPES: &[&str] = &[
    "null", "boolean", "integer", "number", "string", "array", "object",
];

fn random_value(rng: &mut StdRng, depth: usize) -> Value {
    match rng.gen_range(0..if depth > 2 { 6 } else { 8 }) {
        0 => Value::Null,
        1 => json!(rng.gen_bool(0.5)),
        2 => json!(rng.gen_range(-20..20)),
        3 => json!(rng.gen_range(-200..200) as f64 / 8.0),
        4 => json!(*NAMES.choose(rng).unwrap()),
        5 => json!(""),
        6 => Value::Array(
            (0..rng.gen_range(0..3))
                .map(|_| random_value(rng, depth + 1))
                .collect(),
        ),
        _ => {
            let mut m = Map::new();
            for _ in 0..rng.gen_range(0..3) {
                m.insert(
                    NAMES.choose(rng).unwrap().to_string(),
                    random_value(rng, depth + 1),
                );
            }
            Value::Object(m)
        }
    }
}

fn random_count(rng: &mut StdRng) -> Value {
    match rng.gen_range(0..10) {
        0 => json!(-1),
        1 => json!(2.5),
        2 => json!("3"),
        _ => json!(rng.gen_range(0..5)),
    }
}

fn random_schema(rng: &mut StdRng, depth: usize) -> Value {
    if depth > 3 || rng.gen_bool(0.15) {
        return match rng.gen_range(0..8) {
            0 => json!(true),
            1 => json!(false),
            2 => json!({}),
            3 => random_value(rng, 2),
            _ => json!({"type": *TYPES.choose(rng).unwrap()}),
        };
    }
    let mut m = Map::new();
    for _ in 0..rng.gen_range(1..5) {
        let (k, v): (&str, Value) = match rng.gen_range(0..30) {
            0..=3 => (
                "type",
                if rng.gen_bool(0.8) {
                    json!(*TYPES.choose(rng).unwrap())
                } else if rng.gen_bool(0.8) {
                    json!(TYPES.choose_multiple(rng, 2).cloned().collect::<Vec<_>>())
                } else {
                    random_value(rng, 2)
                },
            ),
            4 | 5 => {
                let mut p = Map::new();
                for _ in 0..rng.gen_range(0..3) {
                    p.insert(
                        NAMES.choose(rng).unwrap().to_string(),
                        random_schema(rng, depth + 1),
                    );
                }
                ("properties", Value::Object(p))
            }
            6 => {
                let n = rng.gen_range(0..3);
                (
                    "required",
                    json!(NAMES.choose_multiple(rng, n).cloned().collect::<Vec<_>>()),
                )
            }
            7 => (
                "additionalProperties",
                if rng.gen_bool(0.5) {
                    json!(rng.gen_bool(0.5))
                } else {
                    random_schema(rng, depth + 1)
                },
            ),
            8 => ("items", random_schema(rng, depth + 1)),
            9 => (
                "prefixItems",
                json!([random_schema(rng, depth + 1), random_schema(rng, depth + 1)]),
            ),
            10 => ("minItems", random_count(rng)),
            11 => ("maxItems", random_count(rng)),
            12 => ("minLength", random_count(rng)),
            13 => ("maxLength", random_count(rng)),
            14 => ("minimum", random_value(rng, 3)),
            15 => ("maximum", random_value(rng, 3)),
            16 => ("exclusiveMinimum", random_value(rng, 3)),
            17 => ("exclusiveMaximum", random_value(rng, 3)),
            18 => (
                "enum",
                Value::Array(
                    (0..rng.gen_range(0..4))
                        .map(|_| random_value(rng, 1))
                        .collect(),
                ),
            ),
            19 => ("const", random_value(rng, 1)),
            20 | 21 => {
                let kw = *["anyOf", "oneOf", "allOf"].choose(rng).unwrap();
                (
                    kw,
                    Value::Array(
                        (0..rng.gen_range(1..4))
                            .map(|_| random_schema(rng, depth + 1))
                            .collect(),
                    ),
                )
            }
            22 => (
                "$ref",
                json!(*[
                    "#",
                    "#/properties/a",
                    "#/$defs/x",
                    "#/nope",
                    "http://x/y",
                    "#/$defs/x/items"
                ]
                .choose(rng)
                .unwrap()),
            ),
            23 => ("$defs", json!({"x": random_schema(rng, depth + 1)})),
            24 => ("pattern", json!(*PATTERNS.choose(rng).unwrap())),
            25 => ("format", json!(*FORMATS.choose(rng).unwrap())),
            26 => (
                *["not", "if", "contains", "uniqueItems", "multipleOf"]
                    .choose(rng)
                    .unwrap(),
                random_value(rng, 2),
            ),
            27 => ("minProperties", random_count(rng)),
            28 => ("title", random_value(rng, 2)),
            _ => ("description", json!("d")),
        };
        m.insert(k.to_string(), v);
    }
    Value::Object(m)
}

#[test]
fn fuzz_no_panic_and_sound() {
    let cv = char_vocab();
    // FUZZ_N / FUZZ_SEED allow longer runs
    let env = |k: &str, d: u64| {
        std::env::var(k)
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(d)
    };
    let mut rng = StdRng::seed_from_u64(env("FUZZ_SEED", 0xf022));
    let (mut ok, mut err, mut walked) = (0, 0, 0);
    for i in 0..env("FUZZ_N", 4000) {
        let schema = random_schema(&mut rng, 0);
        let gbnf = match schema_to_gbnf(&schema) {
            Ok(g) => g,
            Err(e) => {
                err += 1;
                assert!(
                    !e.keyword().is_empty() && e.pointer().starts_with('#'),
                    "{e}"
                );
                continue;
            }
        };
        ok += 1;
        let g = muser_grammar::Grammar::parse(&gbnf)
            .unwrap_or_else(|e| panic!("schema {schema}: grammar does not parse: {e}\n{gbnf}"));
        let g = std::sync::Arc::new(g);
        let Ok(val) = jsonschema::options()
            .should_validate_formats(true)
            .build(&schema)
        else {
            continue;
        };
        let mut wrng = StdRng::seed_from_u64(i);
        for _ in 0..4 {
            if let Walk::Done(s) =
                random_walk(&g, &cv, &mut wrng, 0.5, 30, 400, &schema.to_string())
            {
                walked += 1;
                let v: Value = serde_json::from_str(&s)
                    .unwrap_or_else(|e| panic!("schema {schema}: {s:?} is not JSON: {e}\n{gbnf}"));
                if !val.is_valid(&v) {
                    let errs: Vec<String> = val.iter_errors(&v).map(|e| e.to_string()).collect();
                    panic!("schema {schema}: generated {s:?} is invalid: {errs:?}\n{gbnf}");
                }
            }
        }
    }
    eprintln!("fuzz: {ok} converted, {err} refused, {walked} generated instances validated");
    assert!(
        ok > 500 && err > 500,
        "fuzzer should exercise both outcomes"
    );
}
