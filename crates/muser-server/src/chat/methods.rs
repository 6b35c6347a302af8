//! Methods, filters and tests of template values where minijinja lacks them or differs, as
//! llama-server and Python have them (`ChatTemplate::new` adds the filters, and hands [`call`]
//! the methods minijinja does not know).

use super::list::List;
use super::text;
use minijinja::value::{from_args, Rest, Value, ValueKind};
use minijinja::{Environment, Error, ErrorKind, State};

/// Adds to `env` how values print (its formatter) and the filters and tests whose results
/// differ from minijinja's, as llama-server and jinja2 have them: `string`, `default`,
/// `int`, `float`, `join`, `wordcount` and the test `callable`.
pub fn add_filters(env: &mut Environment<'static>) {
    // How values are printed, `~` and `|string`: as llama-server writes them where it
    // keeps the value, else as jinja2 (`text`).
    env.set_formatter(|out, _state, value| {
        match value.as_str() {
            Some(s) => out.write_str(s),
            None => out.write_str(&text::printed(value)),
        }
        .map_err(|_| Error::new(ErrorKind::WriteFailure, "formatting failed"))
    });
    env.add_filter("string", |v: &Value| text::string(v));
    // llama-server: None takes the default as undefined does (jinja2 keeps None).
    env.add_filter(
        "default",
        |state: &State, v: &Value, args: Rest<Value>| match args.first() {
            Some(d) if v.is_none() && args.len() == 1 => Ok(d.clone()),
            None if v.is_none() => Ok(Value::from("")),
            _ => minijinja::filters::default(state, v, args),
        },
    );
    // jinja2 and llama-server: a value that is not a number gives the default (0).
    env.add_filter("int", |state: &State, v: &Value, default: Option<Value>| {
        minijinja::filters::int(state, v).or_else(|_| Ok::<_, Error>(default.unwrap_or(0.into())))
    });
    env.add_filter(
        "float",
        |state: &State, v: &Value, default: Option<Value>| {
            minijinja::filters::float(state, v)
                .or_else(|_| Ok::<_, Error>(default.unwrap_or(0.0.into())))
        },
    );
    // jinja2's: each item as `str()` writes it (floats as they print, `text::str_of`).
    env.add_filter(
        "join",
        |v: &Value, joiner: Option<String>| -> Result<String, Error> {
            let joiner = joiner.unwrap_or_default();
            Ok(match v.kind() {
                ValueKind::Undefined | ValueKind::None => String::new(),
                ValueKind::String => {
                    let chars: Vec<String> =
                        v.as_str().unwrap_or("").chars().map(String::from).collect();
                    chars.join(&joiner)
                }
                _ => v
                    .try_iter()?
                    .map(|item| text::str_of(&item))
                    .collect::<Vec<_>>()
                    .join(&joiner),
            })
        },
    );
    env.add_filter("wordcount", |v: &str| {
        v.split(|c: char| !(c.is_alphanumeric() || c == '_'))
            .filter(|w| !w.is_empty())
            .count()
    });
    env.add_test("callable", |v: &Value| v.kind() == ValueKind::Plain);
}

/// The method `method` of a value minijinja has no such method for: a list's `sort` and
/// `reverse` as llama-server's (its filters: a new list, sorted or reversed; the list stays
/// as it was; jinja2's sandbox refuses both), a string's `rsplit` as Python's, its `format`
/// with plain fields (`{}`, `{0}`) as Python's with values as they print (`text::str_of`:
/// floats as llama-server writes them where that keeps the number), and the rest as
/// `minijinja_contrib`'s Python methods.
pub fn call(state: &State, value: &Value, method: &str, args: &[Value]) -> Result<Value, Error> {
    match (value.kind(), method) {
        (ValueKind::Seq | ValueKind::Iterable, "sort" | "reverse") => {
            let all: Vec<Value> = std::iter::once(value.clone())
                .chain(args.iter().cloned())
                .collect();
            let done = state.apply_filter(method, &all)?;
            Ok(List::value(done.try_iter()?.collect()))
        }
        (ValueKind::String, "format") if simple_format(value.as_str().unwrap_or("")) => {
            format(value.as_str().unwrap_or(""), args)
        }
        (ValueKind::String, "rsplit") => {
            let (sep, max): (Option<&str>, Option<i64>) = from_args(args)?;
            rsplit(value.as_str().unwrap_or(""), sep, max.unwrap_or(-1))
        }
        _ => minijinja_contrib::pycompat::unknown_method_callback(state, value, method, args),
    }
}

/// Python's `s.rsplit(sep, maxsplit)`: at most `max` splits (all where negative) from the
/// right, on `sep`, or on runs of whitespace (then no empty parts) where `sep` is None.
fn rsplit(s: &str, sep: Option<&str>, max: i64) -> Result<Value, Error> {
    let max = usize::try_from(max).unwrap_or(usize::MAX);
    let mut parts: Vec<&str> = match sep {
        Some("") => {
            return Err(Error::new(
                ErrorKind::InvalidOperation,
                "rsplit: empty separator",
            ))
        }
        Some(sep) => s.rsplitn(max.saturating_add(1), sep).collect(),
        None => {
            let mut parts = Vec::new();
            let mut rest = s.trim_end();
            while !rest.is_empty() {
                if parts.len() == max {
                    parts.push(rest);
                    break;
                }
                match rest.rfind(char::is_whitespace) {
                    Some(at) => {
                        let ws = rest[at..].chars().next().map_or(1, char::len_utf8);
                        parts.push(&rest[at + ws..]);
                        rest = rest[..at].trim_end();
                    }
                    None => {
                        parts.push(rest);
                        rest = "";
                    }
                }
            }
            parts
        }
    };
    parts.reverse();
    Ok(parts.into_iter().map(Value::from).collect())
}

/// Whether `s`'s replacement fields are all plain (`{}` or `{N}`: no name, conversion or
/// format spec), which [`format`] writes; others are left to `minijinja_contrib`.
fn simple_format(s: &str) -> bool {
    fields(s).is_some()
}

/// `s` cut into its literal text (`{{` and `}}` made single) and its fields' indexes (None:
/// the next one), or None where a field is not plain or a brace is unmatched.
fn fields(s: &str) -> Option<Vec<(String, Option<usize>)>> {
    let mut out = Vec::new();
    let mut lit = String::new();
    let mut chars = s.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '{' if chars.peek() == Some(&'{') => {
                chars.next();
                lit.push('{');
            }
            '}' if chars.peek() == Some(&'}') => {
                chars.next();
                lit.push('}');
            }
            '{' => {
                let mut field = String::new();
                loop {
                    match chars.next()? {
                        '}' => break,
                        c => field.push(c),
                    }
                }
                let index = match field.as_str() {
                    "" => None,
                    f if f.bytes().all(|b| b.is_ascii_digit()) => Some(f.parse().ok()?),
                    _ => return None,
                };
                out.push((std::mem::take(&mut lit), index));
            }
            '}' => return None,
            c => lit.push(c),
        }
    }
    out.push((lit, None));
    Some(out)
}

/// Python's `s.format(*args)` for plain fields: each field the next argument, or the one it
/// numbers, as `str()` writes it ([`text::str_of`]).
fn format(s: &str, args: &[Value]) -> Result<Value, Error> {
    let parts = fields(s).unwrap_or_default();
    let mut out = String::new();
    let mut next = 0;
    for (i, (lit, index)) in parts.iter().enumerate() {
        out.push_str(lit);
        if i + 1 == parts.len() {
            break;
        }
        let at = index.unwrap_or_else(|| {
            next += 1;
            next - 1
        });
        let arg = args.get(at).ok_or_else(|| {
            Error::new(
                ErrorKind::InvalidOperation,
                format!("format: there is no argument {at}"),
            )
        })?;
        out.push_str(&text::str_of(arg));
    }
    Ok(Value::from(out))
}
