//! Where the grammar is meant to be exact (numbers within the digit limits, lengths, patterns,
//! formats, enums, objects in canonical property order, arrays), random instances — valid and
//! invalid — are accepted exactly when the independent validator accepts them.

mod common;

use common::validator;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use serde_json::{json, Map, Value};

/// Checks `accepts == valid` on every instance (compact layout); returns how many were valid.
fn check_exact(schema: &Value, instances: &[Value]) -> usize {
    let val = validator(schema);
    let converted = muser_jsonschema::schema_to_gbnf(schema);
    let Ok(gbnf) = converted else {
        // the converter may only refuse when nothing is valid
        for v in instances {
            assert!(
                !val.is_valid(v),
                "{schema}: conversion failed ({converted:?}) but {v} is valid"
            );
        }
        return 0;
    };
    let g =
        muser_grammar::Grammar::parse(&gbnf).unwrap_or_else(|e| panic!("{schema}: {e}\n{gbnf}"));
    let mut n_valid = 0;
    for v in instances {
        let text = serde_json::to_string(v).unwrap();
        let valid = val.is_valid(v);
        n_valid += valid as usize;
        assert_eq!(
            g.accepts_str(&text),
            valid,
            "{schema}: instance {text} (valid: {valid})\n{gbnf}"
        );
    }
    n_valid
}

fn bound(rng: &mut StdRng, ints: bool) -> Option<Value> {
    if rng.gen_bool(0.25) {
        return None;
    }
    Some(if ints || rng.gen_bool(0.4) {
        let m: i64 = *[10, 100, 1000, 100_000].choose(rng).unwrap();
        json!(rng.gen_range(-m..=m))
    } else {
        let k: i64 = rng.gen_range(-50_000..=50_000);
        json!(k as f64 / 1000.0)
    })
}

#[test]
fn integer_ranges_exact() {
    let mut rng = StdRng::seed_from_u64(11);
    let mut valid = 0;
    let mut total = 0;
    for _ in 0..300 {
        let mut s = Map::new();
        s.insert("type".into(), json!("integer"));
        for kw in ["minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"] {
            if rng.gen_bool(0.5) {
                let ints = rng.gen_bool(0.7);
                if let Some(b) = bound(&mut rng, ints) {
                    s.insert(kw.into(), b);
                }
            }
        }
        let schema = Value::Object(s);
        let mut inst: Vec<Value> = (-300..=300).map(|i| json!(i)).collect();
        for _ in 0..200 {
            let mag = 10i64.pow(rng.gen_range(1..16));
            inst.push(json!(rng.gen_range(-mag..=mag)));
        }
        for kw in ["minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"] {
            if let Some(b) = schema.get(kw).and_then(Value::as_f64) {
                for d in -2..=2 {
                    inst.push(json!(b.round() as i64 + d));
                }
            }
        }
        total += inst.len();
        valid += check_exact(&schema, &inst);
    }
    eprintln!("integer ranges: {total} instances, {valid} valid");
    assert!(valid > total / 10 && valid < total);
}

#[test]
fn number_ranges_exact() {
    let mut rng = StdRng::seed_from_u64(12);
    let mut valid = 0;
    let mut total = 0;
    for _ in 0..300 {
        let mut s = Map::new();
        s.insert("type".into(), json!("number"));
        for kw in ["minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"] {
            if rng.gen_bool(0.5) {
                if let Some(b) = bound(&mut rng, false) {
                    s.insert(kw.into(), b);
                }
            }
        }
        let schema = Value::Object(s);
        let mut inst: Vec<Value> = Vec::new();
        for _ in 0..300 {
            let scale = *[1.0, 10.0, 100.0, 1000.0].choose(&mut rng).unwrap();
            let k: i64 = rng.gen_range(-60_000..=60_000);
            let x = (k as f64 / scale * 1000.0).round() / 1000.0;
            // serde writes integral floats as "3.0" and integers as "3": both forms
            if rng.gen_bool(0.2) && x.fract() == 0.0 {
                inst.push(json!(x as i64));
            } else if x != 0.0 && x.abs() < 1e-5 {
                continue; // written with an exponent, which bounded numbers do not use
            } else {
                inst.push(json!(x));
            }
        }
        for kw in ["minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"] {
            if let Some(b) = schema.get(kw).and_then(Value::as_f64) {
                for d in [-0.001, 0.0, 0.001] {
                    let x = ((b + d) * 1000.0).round() / 1000.0;
                    if x == 0.0 || x.abs() >= 1e-5 {
                        inst.push(json!(x));
                    }
                }
            }
        }
        total += inst.len();
        valid += check_exact(&schema, &inst);
    }
    eprintln!("number ranges: {total} instances, {valid} valid");
    assert!(valid > total / 10 && valid < total);
}

const ALPHABET: &[char] = &[
    'a', 'b', 'é', '😀', '"', '\\', '\n', '\u{1}', ' ', '\u{7f}', '/',
];

fn random_string(rng: &mut StdRng, alphabet: &[char], max_len: usize) -> String {
    let n = rng.gen_range(0..=max_len);
    (0..n).map(|_| *alphabet.choose(rng).unwrap()).collect()
}

#[test]
fn string_lengths_exact() {
    let mut rng = StdRng::seed_from_u64(13);
    let mut total = 0;
    for _ in 0..100 {
        let mut s = Map::new();
        s.insert("type".into(), json!("string"));
        if rng.gen_bool(0.7) {
            s.insert("minLength".into(), json!(rng.gen_range(0..5)));
        }
        if rng.gen_bool(0.7) {
            s.insert("maxLength".into(), json!(rng.gen_range(0..7)));
        }
        let schema = Value::Object(s);
        let inst: Vec<Value> = (0..200)
            .map(|_| json!(random_string(&mut rng, ALPHABET, 8)))
            .collect();
        total += inst.len();
        check_exact(&schema, &inst);
    }
    eprintln!("string lengths: {total} instances");
}

#[test]
fn patterns_exact() {
    let patterns = [
        "^[a-c]{2,3}$",
        "^(ab|c)*d?$",
        "a.c",
        "^\\d+(\\.\\d{1,2})?$",
        "^[^a]b*$",
        "x(y|z){2}",
        "^(?:a|b?)*$",
        "^\\s?\\S$",
        "^\\w\\W$",
        "^[\\-a]+$",
        "^é|\\n$",
        "^\"[\\\\/]?$",
        "^(a+)+b$",
        "^(?:ab?){2,}c{0,2}$",
        "b$",
        "^a",
        "",
        "^$",
        "^[\\u0000-\\u001f]$",
        "^[😀-😂]x*?$",
        "^\\x61\\u{62}\\cJ?$",
        "^(a|)(b|)$",
    ];
    let alphabet: Vec<char> = "abcdxyz.01\n é\"\\/-_\u{1}😀😁\t".chars().collect();
    let mut rng = StdRng::seed_from_u64(14);
    let mut total = 0;
    let mut valid = 0;
    for p in patterns {
        let schema = json!({"type": "string", "pattern": p});
        let mut inst: Vec<Value> = (0..600)
            .map(|_| json!(random_string(&mut rng, &alphabet, 6)))
            .collect();
        // strings built from the pattern's own characters hit the interesting cases
        let own: Vec<char> = p
            .chars()
            .filter(|c| c.is_alphanumeric() || "\n\"é😀".contains(*c))
            .collect();
        if !own.is_empty() {
            for _ in 0..600 {
                inst.push(json!(random_string(&mut rng, &own, 6)));
            }
        }
        total += inst.len();
        valid += check_exact(&schema, &inst);
    }
    eprintln!("patterns: {total} instances, {valid} valid");
    assert!(valid > 500);
}

fn two(rng: &mut StdRng, lo: u32, hi: u32) -> String {
    format!("{:02}", rng.gen_range(lo..=hi))
}

fn random_date(rng: &mut StdRng) -> String {
    let year = match rng.gen_range(0..4) {
        0 => format!(
            "{:04}",
            *[0, 1900, 2000, 2100, 2400, 2023, 2024].choose(rng).unwrap()
        ),
        _ => format!("{:04}", rng.gen_range(0..10000)),
    };
    format!("{year}-{}-{}", two(rng, 0, 13), two(rng, 0, 32))
}

fn random_time(rng: &mut StdRng) -> String {
    let mut t = format!(
        "{}:{}:{}",
        two(rng, 0, 25),
        two(rng, 0, 61),
        two(rng, 0, 59)
    );
    if rng.gen_bool(0.3) {
        let n = rng.gen_range(1..=9);
        t.push('.');
        for _ in 0..n {
            t.push(char::from(b'0' + rng.gen_range(0..10)));
        }
    }
    match rng.gen_range(0..3) {
        0 => t.push('Z'),
        1 => t.push_str(&format!("+{}:{}", two(rng, 0, 25), two(rng, 0, 61))),
        _ => t.push_str(&format!("-{}:{}", two(rng, 0, 25), two(rng, 0, 61))),
    }
    t
}

#[test]
fn formats_exact() {
    let mut rng = StdRng::seed_from_u64(15);
    let dates: Vec<Value> = (0..4000).map(|_| json!(random_date(&mut rng))).collect();
    let n = check_exact(&json!({"type": "string", "format": "date"}), &dates);
    assert!(n > 500, "{n} valid dates");
    let times: Vec<Value> = (0..3000).map(|_| json!(random_time(&mut rng))).collect();
    let n = check_exact(&json!({"type": "string", "format": "time"}), &times);
    assert!(n > 300, "{n} valid times");
    let dts: Vec<Value> = (0..3000)
        .map(|_| {
            json!(format!(
                "{}T{}",
                random_date(&mut rng),
                random_time(&mut rng)
            ))
        })
        .collect();
    check_exact(&json!({"type": "string", "format": "date-time"}), &dts);
    let ips: Vec<Value> = (0..3000)
        .map(|_| {
            let parts: Vec<String> = (0..4)
                .map(|_| {
                    let o = rng.gen_range(0..300);
                    if rng.gen_bool(0.05) {
                        format!("0{o}")
                    } else {
                        o.to_string()
                    }
                })
                .collect();
            json!(parts.join("."))
        })
        .collect();
    let n = check_exact(&json!({"type": "string", "format": "ipv4"}), &ips);
    assert!(n > 300, "{n} valid addresses");
    let hex = b"0123456789abcdefABCDEFg";
    let uuids: Vec<Value> = (0..2000)
        .map(|_| {
            let mut s = String::new();
            for (i, len) in [8, 4, 4, 4, 12].iter().enumerate() {
                if i > 0 {
                    s.push(if rng.gen_bool(0.97) { '-' } else { '_' });
                }
                let len = if rng.gen_bool(0.97) { *len } else { len + 1 };
                for _ in 0..len {
                    s.push(char::from(hex[rng.gen_range(0..hex.len())]));
                }
            }
            json!(s)
        })
        .collect();
    let n = check_exact(&json!({"type": "string", "format": "uuid"}), &uuids);
    assert!(n > 100, "{n} valid uuids");
}

#[test]
fn enums_exact() {
    let mut rng = StdRng::seed_from_u64(16);
    let pool = vec![
        json!("a"),
        json!("b\"c"),
        json!(1),
        json!(2.5),
        json!(null),
        json!(true),
        json!([1, "x"]),
        json!({"k": [null]}),
        json!(""),
        json!(-7),
    ];
    for _ in 0..100 {
        let k = rng.gen_range(1..=5);
        let members: Vec<Value> = pool.choose_multiple(&mut rng, k).cloned().collect();
        let schema = if k == 1 && rng.gen_bool(0.5) {
            json!({"const": members[0]})
        } else {
            json!({"enum": members})
        };
        check_exact(&schema, &pool);
    }
}

#[test]
fn objects_exact_in_canonical_order() {
    let mut rng = StdRng::seed_from_u64(17);
    let names = ["id", "name", "score", "tags", "ok", "note"];
    let kinds = [
        json!({"type": "integer", "minimum": 0}),
        json!({"type": "string", "maxLength": 3}),
        json!({"type": "number"}),
        json!({"type": "array", "items": {"type": "boolean"}, "maxItems": 2}),
        json!({"type": "boolean"}),
        json!({"enum": ["x", "y"]}),
    ];
    let sample_ok = [
        json!(3),
        json!("abc"),
        json!(-1.5),
        json!([true]),
        json!(false),
        json!("y"),
    ];
    let sample_bad = [
        json!(-3),
        json!("abcd"),
        json!("1"),
        json!([1]),
        json!(0),
        json!("z"),
    ];
    let mut total = 0;
    let mut valid = 0;
    for _ in 0..60 {
        let mut props = Map::new();
        let mut required = Vec::new();
        let mut order: Vec<usize> = (0..names.len()).collect();
        order.shuffle(&mut rng);
        let order: Vec<usize> = order
            .into_iter()
            .take(rng.gen_range(1..=names.len()))
            .collect();
        for &i in &order {
            props.insert(names[i].into(), kinds[i].clone());
            if rng.gen_bool(0.5) {
                required.push(names[i]);
            }
        }
        let schema = json!({"type": "object", "properties": props, "required": required,
                            "additionalProperties": false});
        // instances list required members first, then optional ones, in `properties` order
        let mut inst = Vec::new();
        for _ in 0..150 {
            let mut m = Map::new();
            for pass in [true, false] {
                for &i in &order {
                    let is_req = required.contains(&names[i]);
                    if is_req != pass {
                        continue;
                    }
                    let present = if is_req {
                        rng.gen_bool(0.95)
                    } else {
                        rng.gen_bool(0.5)
                    };
                    if present {
                        let v = if rng.gen_bool(0.9) {
                            &sample_ok[i]
                        } else {
                            &sample_bad[i]
                        };
                        m.insert(names[i].into(), v.clone());
                    }
                }
            }
            if rng.gen_bool(0.05) {
                m.insert("zz".into(), json!(1));
            }
            inst.push(Value::Object(m));
        }
        total += inst.len();
        valid += check_exact(&schema, &inst);
    }
    eprintln!("objects: {total} instances, {valid} valid");
    assert!(valid > total / 5 && valid < total);
}

#[test]
fn arrays_exact() {
    let mut rng = StdRng::seed_from_u64(18);
    for _ in 0..100 {
        let mut s =
            json!({"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 9}});
        if rng.gen_bool(0.7) {
            s["minItems"] = json!(rng.gen_range(0..4));
        }
        if rng.gen_bool(0.7) {
            s["maxItems"] = json!(rng.gen_range(0..6));
        }
        if rng.gen_bool(0.3) {
            s["prefixItems"] = json!([{"const": 1}, {"type": "integer", "minimum": 5}]);
        }
        let inst: Vec<Value> = (0..200)
            .map(|_| {
                let n = rng.gen_range(0..8);
                json!((0..n).map(|_| rng.gen_range(-1..12)).collect::<Vec<i32>>())
            })
            .collect();
        if s.get("prefixItems").is_some() && s.get("minItems").is_none() {
            // without minItems the converter requires the whole tuple: not exact by design
            continue;
        }
        check_exact(&s, &inst);
    }
}
