//! Template values as text, as llama-server's template engine writes them where it keeps the
//! value, else as jinja2 (Python, what transformers renders with) writes them.
//!
//! Where the two engines differ (measured through llama-server's `/apply-template` and
//! jinja2 with transformers' options):
//! - A float printed (`{{ x }}`, `~`, `+`, inside a list's text) is C's `%f` without its
//!   trailing zeros in llama-server (`2.0`, `1.5`, `3.141593`, `0.0` for 1e-07), Python's
//!   `repr` in jinja2 (`3.14159265358979`, `1e-07`). A float as JSON (`tojson`) or through
//!   `|string` is C++'s `<<` in llama-server (6 significant digits: `2`, `1e+06`,
//!   `3.14159`), `repr` in jinja2 (`2.0`, `1000000.0`). Muser writes llama-server's text
//!   where it reads back as the same number (`2`, `1e+06`, `1.5`), and Python's where
//!   llama-server's would change the number (`3.14159265358979`, not `3.14159`; `1e-07`, not
//!   `0.0`): a prompt must not show the model another value than the request gave.
//! - None printed or joined with `~` is "" in llama-server (a null field writes nothing; `none
//!   ~ 'a'` is `a`), `None` in jinja2: Muser writes "".
//! - A list or mapping printed (`{{ args }}`, MiniCPM5's `{{ param_value }}`) is its items run
//!   together (`2x` for `[2, "x"]`) or nothing (a mapping) in llama-server, plainly broken:
//!   Muser writes jinja2's text, `[2, 'x']`, `{'k': 1}`. Through `|string` (Seed-OSS's
//!   arguments) both engines write that text; strings in it are quoted as llama-server
//!   quotes them (`'…'`, or JSON's `"…"` where the string holds a `'`; jinja2 escapes a
//!   newline in them as `\n`, llama-server writes it as it is).

use minijinja::value::{Value, ValueKind};

/// `x` as Python's `repr` writes a float: the shortest digits that read back as `x`, in
/// exponent form below 1e-4 and from 1e16 (`1e-05`, `1.5e+16`), `inf`, `nan`.
pub fn python_float(x: f64) -> String {
    if x.is_nan() {
        return "nan".into();
    }
    if x.is_infinite() {
        return if x > 0.0 { "inf" } else { "-inf" }.into();
    }
    // `{:e}` gives the shortest round-trip digits: "-1.2345e-5".
    let sci = format!("{x:e}");
    let (mantissa, exp) = sci.split_once('e').unwrap_or((&sci, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    let (sign, mantissa) = match mantissa.strip_prefix('-') {
        Some(m) => ("-", m),
        None => ("", mantissa),
    };
    let digits: String = mantissa.chars().filter(|c| *c != '.').collect();
    if (-4..16).contains(&exp) {
        if exp < 0 {
            format!("{sign}0.{}{digits}", "0".repeat((-exp - 1) as usize))
        } else {
            let point = exp as usize + 1;
            let (int, frac) = if digits.len() > point {
                (digits[..point].to_string(), digits[point..].to_string())
            } else {
                (format!("{digits:0<point$}"), "0".to_string())
            };
            format!("{sign}{int}.{frac}")
        }
    } else {
        let (first, rest) = digits.split_at(1);
        let rest = if rest.is_empty() {
            String::new()
        } else {
            format!(".{rest}")
        };
        let esign = if exp < 0 { '-' } else { '+' };
        format!("{sign}{first}{rest}e{esign}{:02}", exp.abs())
    }
}

/// `llama`, llama-server's text for `x`, where it reads back as `x`; else Python's.
fn kept_or_python(llama: String, x: f64) -> String {
    if x.is_finite() && llama.parse::<f64>().ok() == Some(x) {
        llama
    } else {
        python_float(x)
    }
}

/// `s` without the zeros that end its fraction (and the point, where nothing is left of it).
fn trim_fraction(s: &str) -> &str {
    if s.contains('.') {
        s.trim_end_matches('0').trim_end_matches('.')
    } else {
        s
    }
}

/// A float printed (`{{ x }}`, `~`, `+`, an item of a list's text): llama-server's `%f`
/// without trailing zeros (`2.0`, `1.5`, `100000000000000000000.0`) where that is `x`, else
/// Python's `repr` (`3.14159265358979`, `1e-07`).
pub fn printed_float(x: f64) -> String {
    let fixed = format!("{x:.6}");
    let mut s = trim_fraction(&fixed).to_string();
    if !s.contains('.') {
        s.push_str(".0");
    }
    kept_or_python(s, x)
}

/// A float as JSON (`tojson`) and through `|string`: llama-server's 6 significant digits
/// (C's `%g`: `2`, `1.5`, `1e+06`, `-0`) where that is `x`, else Python's `repr`
/// (`3.14159265358979`, `1234567.0`). Not finite: as Python's `json` writes it.
pub fn json_float(x: f64) -> String {
    if x.is_nan() {
        return "NaN".into();
    }
    if x.is_infinite() {
        return if x > 0.0 { "Infinity" } else { "-Infinity" }.into();
    }
    kept_or_python(general6(x), x)
}

/// C's `%g` with 6 significant digits.
fn general6(x: f64) -> String {
    if x == 0.0 {
        return if x.is_sign_negative() { "-0" } else { "0" }.into();
    }
    // The exponent after rounding to 6 digits decides the form, as in C.
    let sci = format!("{x:.5e}");
    let (mantissa, exp) = sci.split_once('e').unwrap_or((&sci, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    if !(-4..6).contains(&exp) {
        let esign = if exp < 0 { '-' } else { '+' };
        format!("{}e{esign}{:02}", trim_fraction(mantissa), exp.abs())
    } else {
        trim_fraction(&format!("{x:.*}", (5 - exp) as usize)).to_string()
    }
}

/// A value printed by `{{ }}`, joined by `~`, or added to a string by `+`: None and undefined
/// as "", floats as [`printed_float`], lists and mappings as their [`repr`], the rest as
/// minijinja writes it (`True`, `42`, a string as it is).
pub fn printed(v: &Value) -> String {
    match v.kind() {
        ValueKind::Undefined | ValueKind::None => String::new(),
        ValueKind::Seq | ValueKind::Map | ValueKind::Iterable => repr(v),
        ValueKind::Number => number(v, printed_float),
        _ => v.to_string(),
    }
}

/// The `string` filter: a string as it is, None as `None`, floats as [`json_float`] (as
/// llama-server writes them: `2` for 2.0), lists and mappings as their [`repr`], undefined as
/// "" (llama-server's).
pub fn string(v: &Value) -> Value {
    match v.kind() {
        ValueKind::String => v.clone(),
        ValueKind::Undefined => Value::from(""),
        ValueKind::None => Value::from("None"),
        ValueKind::Seq | ValueKind::Map | ValueKind::Iterable => Value::from(repr(v)),
        ValueKind::Number => Value::from(number(v, json_float)),
        _ => Value::from(v.to_string()),
    }
}

/// A number: an integer in full, a float as `float` writes it.
pub fn number(v: &Value, float: fn(f64) -> String) -> String {
    if v.is_integer() {
        return v.to_string();
    }
    float(f64::try_from(v.clone()).unwrap_or(f64::NAN))
}

/// A value as it is written inside a list's or mapping's text (Python's `repr`, as both
/// engines write it): `None`, `True`, numbers (floats as [`printed_float`]), strings quoted as
/// llama-server quotes them ([`quoted`]), `[a, b]`, `{k: v}`.
pub fn repr(v: &Value) -> String {
    let mut out = String::new();
    write_repr(v, &mut out, 0);
    out
}

fn write_repr(v: &Value, out: &mut String, depth: usize) {
    // (a list that holds itself cannot be built: this bounds a deep one)
    if depth > 512 {
        out.push_str("...");
        return;
    }
    match v.kind() {
        ValueKind::Undefined => out.push_str("Undefined"),
        ValueKind::None => out.push_str("None"),
        ValueKind::String => quoted(v.as_str().unwrap_or(""), out),
        ValueKind::Number => out.push_str(&number(v, printed_float)),
        ValueKind::Seq | ValueKind::Iterable => {
            out.push('[');
            for (i, item) in v.try_iter().into_iter().flatten().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                write_repr(&item, out, depth + 1);
            }
            out.push(']');
        }
        ValueKind::Map => {
            out.push('{');
            for (i, key) in v.try_iter().into_iter().flatten().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                write_repr(&key, out, depth + 1);
                out.push_str(": ");
                let item = v.get_item(&key).unwrap_or_default();
                write_repr(&item, out, depth + 1);
            }
            out.push('}');
        }
        _ => out.push_str(&v.to_string()),
    }
}

/// A string in a list's text, as llama-server quotes it: between single quotes as it is, or,
/// where it holds a single quote, as a JSON string (`"it's"`; `"`, `\` and control characters
/// escaped). Python writes the same for strings without control characters or backslashes.
fn quoted(s: &str, out: &mut String) {
    if !s.contains('\'') {
        out.push('\'');
        out.push_str(s);
        out.push('\'');
        return;
    }
    json_string(s, false, out);
}

/// `s` as a JSON string, as Python's `json.dumps` writes it: `"`, `\` and control characters
/// escaped (`\n`, `\u0001`), and with `ensure_ascii` every character past ASCII (as UTF-16
/// `\uXXXX` units); else those as they are.
pub fn json_string(s: &str, ensure_ascii: bool, out: &mut String) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 || (ensure_ascii && !(' '..='~').contains(&c)) => {
                let mut units = [0u16; 2];
                for u in c.encode_utf16(&mut units) {
                    out.push_str(&format!("\\u{u:04x}"));
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// A value as Python's `str()` writes it, with floats as they print: as [`printed`], but
/// None as `None`.
pub fn str_of(v: &Value) -> String {
    if v.is_none() {
        "None".into()
    } else {
        printed(v)
    }
}
