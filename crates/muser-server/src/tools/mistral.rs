//! Mistral's formats, both opened by the `[TOOL_CALLS]` control token after the reply's text
//! if any. The chat template shows the tools itself (`[AVAILABLE_TOOLS]`).
//!
//! * Nemo (`mistral-nemo`, Mistral Nemo 2407): one JSON array of calls,
//!   `[TOOL_CALLS][{"name": "f", "arguments": {...}, "id": "abcDEF123"}, ...]`. The template
//!   raises an exception when a call in the history has an id other than 9 characters, so the
//!   grammar has the model write one (`[a-zA-Z0-9]{9}`) and `parse` returns it.
//! * Args (`mistral`, Mistral Small 3.2, Devstral, Ministral 3): one `[TOOL_CALLS]` per call,
//!   `[TOOL_CALLS]NAME[CALL_ID]ID[ARGS]{...}`, the calls one after another; `[CALL_ID]ID` (9
//!   letters and digits) only where the template writes it (Small 3.2).
//!
//! # Plan (grammar)
//!
//! `Auto`: lazy from `[TOOL_CALLS]`; `Required` / `Function(N)`: the whole output, no text
//! before the call(s). The grammar writes what the templates render: no whitespace around the
//! markup, the Nemo keys in the order name, arguments, id (the JSON layout inside is free);
//! parallel calls may be separated by whitespace. Without `parallel`, one call (Nemo: an array
//! of one).
//!
//! # Parse
//!
//! Content is the text with the well-formed calls taken out (trailing whitespace trimmed);
//! `[TOOL_CALLS]` followed by anything else stays in it, as do the text between and after
//! calls (an Args call ends where its JSON does). Reading is lenient where the grammar is
//! strict: whitespace around the markup and the JSON, the Nemo keys in any order, a missing
//! `[CALL_ID]` or `"id"` and an id that is not 9 letters and digits (the id is None then, and
//! the caller makes one).
//!
//! # Streaming
//!
//! `parse_partial` begins an Args call once its name and id are final (at `[ARGS]`, or with
//! `[CALL_ID]` at the `[` that ends the id) and streams its arguments as they are written; a
//! Nemo call once its item of the array is whole (the id comes after the arguments).
//!
//! Ministral 3's reasoning, `[THINK]...[/THINK]` before the reply, is split off before `parse`
//! sees the text (`think`, which also keeps a lazy call grammar from starting inside it), and
//! a message's `reasoning_content` reaches its template as the `thinking` / `text` content
//! blocks it reads (`chat`).

use serde_json::{json, Value};

use super::partial::{self, Json};
use super::{
    allowed_tools, arguments_schema, call_of, call_schema, check_tools_convert, json_list,
    json_prefix, parse_blocks, parse_blocks_partial, read_call, tool_rules, BlockStep, Blocks,
    Format, LazyStart, Parsed, Plan, Tool, ToolCall, ToolRequest, WS_BODY,
};
use muser_jsonschema::gbnf_literal as literal;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Flavor {
    /// `[TOOL_CALLS][{"name": ..., "arguments": {...}, "id": ...}]`.
    Nemo,
    /// `[TOOL_CALLS]NAME[CALL_ID]ID[ARGS]{...}`, `[CALL_ID]ID` only when `call_id`.
    Args { call_id: bool },
}

const OPEN: &str = "[TOOL_CALLS]";
const ARGS: &str = "[ARGS]";
const CALL_ID: &str = "[CALL_ID]";
/// The length of a call id the templates accept (letters and digits).
const ID_LEN: usize = 9;

pub(super) const LAZY_START: LazyStart = LazyStart::Word(OPEN);
pub(super) const MARKUP: &[&str] = &[OPEN, ARGS, CALL_ID];
pub(super) const MARKUP_NEMO: &[&str] = &[OPEN];

/// `[TOOL_CALLS]` in the template: Args where it writes `[ARGS]` (with ids where it writes
/// `[CALL_ID]`), else Nemo.
pub(super) fn detect(template: &str) -> Option<Format> {
    if !template.contains(OPEN) {
        None
    } else if template.contains(ARGS) {
        Some(Format::Mistral {
            call_id: template.contains(CALL_ID),
        })
    } else {
        Some(Format::MistralNemo)
    }
}

/// The schema of one Nemo call: `call_schema`'s name and arguments, then the id.
fn nemo_call_schema(tool: &Tool) -> Value {
    let mut s = call_schema(tool, "#");
    s["properties"]["id"] = json!({"type": "string", "pattern": "^[a-zA-Z0-9]{9}$"});
    s["required"] = json!(["name", "arguments", "id"]);
    s
}

pub(super) fn plan(req: &ToolRequest, flavor: Flavor) -> Result<Option<Plan>, String> {
    let Some(tools) = allowed_tools(req)? else {
        return Ok(None);
    };
    check_tools_convert(&tools)?;
    // Each tool's rules under its own prefix `tI-`; the rules below start otherwise.
    let mut rules = String::new();
    let mut alts = Vec::with_capacity(tools.len());
    for (i, t) in tools.iter().enumerate() {
        let schema = match flavor {
            Flavor::Nemo => nemo_call_schema(t),
            Flavor::Args { .. } => arguments_schema(t),
        };
        let (top, r) = tool_rules(t, &schema, &format!("t{i}-"))?;
        rules.push_str(&r);
        alts.push(match flavor {
            Flavor::Nemo => top,
            Flavor::Args { call_id } => format!(
                "{}{} {} {top}",
                literal(&t.name),
                if call_id {
                    format!(" {} call-id", literal(CALL_ID))
                } else {
                    String::new()
                },
                literal(ARGS)
            ),
        });
    }
    let open = literal(OPEN);
    let mut gbnf = match (flavor, req.parallel) {
        (Flavor::Nemo, false) => format!("root ::= {open} \"[\" ws call ws \"]\"\n"),
        (Flavor::Nemo, true) => {
            format!("root ::= {open} \"[\" ws call ( ws \",\" ws call )* ws \"]\"\n")
        }
        (Flavor::Args { .. }, false) => "root ::= call\n".to_string(),
        // Calls back to back, as the templates write them (llama.cpp reads no call after
        // whitespace in Devstral's and Ministral 3's formats).
        (Flavor::Args { .. }, true) => "root ::= call ( call )*\n".to_string(),
    };
    match flavor {
        Flavor::Nemo => gbnf.push_str(&format!("call ::= {}\n", alts.join(" | "))),
        Flavor::Args { call_id } => {
            gbnf.push_str(&format!("call ::= {open} ( {} )\n", alts.join(" | ")));
            if call_id {
                gbnf.push_str(&format!("call-id ::= [a-zA-Z0-9]{{{ID_LEN}}}\n"));
            }
        }
    }
    gbnf.push_str(&format!("ws ::= {WS_BODY}\n"));
    gbnf.push_str(&rules);
    Ok(Some(Plan::calls(gbnf, &req.choice, LAZY_START)))
}

/// The id the model wrote, kept when the templates would take it back (9 letters and digits).
fn valid_id(id: &str) -> Option<String> {
    (id.len() == ID_LEN && id.bytes().all(|b| b.is_ascii_alphanumeric())).then(|| id.to_string())
}

/// The call one item of a Nemo array makes: `read_call`'s, with the id the model wrote where
/// it is valid.
fn nemo_call(item: &Value) -> Option<ToolCall> {
    let mut call = read_call(item)?;
    call.id = item.get("id").and_then(Value::as_str).and_then(valid_id);
    Some(call)
}

/// The Nemo array whose `[TOOL_CALLS]` ends right before `rest`: its calls (one or more) and
/// the length of `rest` it spans. None when it is not an array of calls.
fn read_nemo(rest: &str) -> Option<(Vec<ToolCall>, usize)> {
    json_list::read_array(rest, nemo_call)
}

/// Whether `c` may be part of an Args call's name (letters, digits, `_`, `.`, `-`).
fn name_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-')
}

/// The Args call whose `[TOOL_CALLS]` ends right before `rest`: `NAME([CALL_ID]ID)?[ARGS]{...}`
/// and the length of `rest` it spans (through the arguments' JSON). None when malformed.
fn read_args(rest: &str) -> Option<(ToolCall, usize)> {
    let name_start = rest.len() - rest.trim_start().len();
    let after_ws = &rest[name_start..];
    let name_len = after_ws
        .find(|c: char| !name_char(c))
        .unwrap_or(after_ws.len());
    if name_len == 0 {
        return None;
    }
    let name = &after_ws[..name_len];
    let mut tail = after_ws[name_len..].trim_start();
    let mut id = None;
    if let Some(t) = tail.strip_prefix(CALL_ID) {
        // the id runs to the next markup; `[ARGS]` must follow it
        let end = t.find('[')?;
        id = valid_id(t[..end].trim());
        tail = &t[end..];
    }
    let args = tail.strip_prefix(ARGS)?;
    let (v, used) = json_prefix(args)?;
    let call = call_of(name, &v)?;
    Some((ToolCall { id, ..call }, rest.len() - args.len() + used))
}

/// Content is the text with the well-formed calls taken out, its trailing whitespace trimmed;
/// `[TOOL_CALLS]` followed by anything else stays in it.
pub(super) fn parse(text: &str, req: Option<&ToolRequest>, flavor: Flavor) -> Parsed {
    parse_blocks(text, req, &[OPEN], |after| match flavor {
        Flavor::Nemo => read_nemo(after),
        Flavor::Args { .. } => read_args(after).map(|(c, used)| (vec![c], used)),
    })
}

/// How far streaming has read the Nemo array whose `[TOOL_CALLS]` ends right before `rest`. A
/// call is begun once its item is whole: its id may come after its arguments, so only then
/// are its name and id final (its arguments come whole with them).
fn read_nemo_partial(rest: &str, memo: &mut partial::Memo) -> BlockStep {
    json_list::read_array_partial(rest, nemo_call, |_, _| None, memo)
}

/// How far streaming has read the Args call whose `[TOOL_CALLS]` ends right before `rest`. The
/// call is begun once its name and id are final (as `read_args` reads them): at the `[ARGS]`
/// after its name, or with `[CALL_ID]` at the `[` that ends its id. Its arguments then grow as
/// the JSON after `[ARGS]` is written.
fn read_args_partial(rest: &str, memo: &mut partial::Memo) -> BlockStep {
    let s = rest.trim_start();
    let name_len = match s.find(|c: char| !name_char(c)) {
        Some(0) => return BlockStep::Broken(Vec::new()),
        Some(n) => n,
        // the name may go on
        None => return BlockStep::Open(Vec::new()),
    };
    let tail = s[name_len..].trim_start();
    let (id, markup) = match tail.strip_prefix(CALL_ID) {
        Some(t) => match t.find('[') {
            Some(end) => (valid_id(t[..end].trim()), &t[end..]),
            None => return BlockStep::Open(Vec::new()),
        },
        None if tail.starts_with(ARGS) => (None, tail),
        // `[ARGS]` or `[CALL_ID]` may be coming
        None if ARGS.starts_with(tail) || CALL_ID.starts_with(tail) => {
            return BlockStep::Open(Vec::new())
        }
        None => return BlockStep::Broken(Vec::new()),
    };
    let mut call = ToolCall {
        id,
        name: s[..name_len].to_string(),
        arguments: String::new(),
    };
    let Some(json) = markup.strip_prefix(ARGS) else {
        return if ARGS.starts_with(markup) {
            BlockStep::Open(vec![call])
        } else {
            BlockStep::Broken(vec![call])
        };
    };
    let r = partial::read_on(json, memo);
    call.arguments = r.json.stable_object_on(Some(memo));
    match r.json {
        Json::Whole(..) => match read_args(rest) {
            Some((call, used)) => BlockStep::Whole(vec![call], used),
            None => BlockStep::Broken(vec![call]),
        },
        Json::Open(_) if r.broken => BlockStep::Broken(vec![call]),
        Json::Open(_) => BlockStep::Open(vec![call]),
    }
}

/// Content up to the first `[TOOL_CALLS]`, less a tail that may be the start of one, and less
/// trailing whitespace (which `parse` trims when a call follows it); the calls begun.
pub(super) fn parse_partial(
    text: &str,
    req: Option<&ToolRequest>,
    flavor: Flavor,
    from: &mut Blocks,
) -> Parsed {
    let read = |after: &str, memo: &mut partial::Memo| match flavor {
        Flavor::Nemo => read_nemo_partial(after, memo),
        Flavor::Args { .. } => read_args_partial(after, memo),
    };
    parse_blocks_partial(text, req, &[OPEN], read, from)
}

#[cfg(test)]
mod tests {
    use super::super::test_util::*;
    use super::super::{ToolChoice, Trigger};
    use super::*;
    use muser_sample::Grammar;
    use serde_json::{json, Value};

    const FLAVORS: [Flavor; 3] = [
        Flavor::Nemo,
        Flavor::Args { call_id: true },
        Flavor::Args { call_id: false },
    ];

    fn format(flavor: Flavor) -> Format {
        match flavor {
            Flavor::Nemo => Format::MistralNemo,
            Flavor::Args { call_id } => Format::Mistral { call_id },
        }
    }

    fn random_id(rng: &mut Rng) -> String {
        const ALNUM: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
        (0..ID_LEN)
            .map(|_| ALNUM[rng.below(ALNUM.len())] as char)
            .collect()
    }

    /// (name, arguments, id) per call.
    type Call = (String, Value, String);

    /// The calls as the model writes them: the Nemo array in `layout` (one of `layouts`), or
    /// one `[TOOL_CALLS]` per call, its arguments in `layout`, the calls joined by `sep`.
    fn render(flavor: Flavor, calls: &[Call], layout: usize, sep: &str) -> String {
        match flavor {
            Flavor::Nemo => {
                let a: Vec<Value> = calls
                    .iter()
                    .map(|(n, a, id)| json!({"name": n, "arguments": a, "id": id}))
                    .collect();
                format!("[TOOL_CALLS]{}", layouts(&Value::Array(a))[layout])
            }
            Flavor::Args { call_id } => calls
                .iter()
                .map(|(n, a, id)| {
                    let id = if call_id {
                        format!("[CALL_ID]{id}")
                    } else {
                        String::new()
                    };
                    format!("[TOOL_CALLS]{n}{id}[ARGS]{}", layouts(a)[layout])
                })
                .collect::<Vec<_>>()
                .join(sep),
        }
    }

    /// Random tools and calls, each flavor: the grammar takes the rendered calls (several JSON
    /// layouts and separators), `parse` gives the calls and their ids back; unknown or other
    /// tools, broken arguments, bad ids, missing or extra markup, unclosed calls and a second
    /// call without `parallel` are refused.
    #[test]
    fn mistral_grammar_accepts_calls_and_refuses_wrong_ones() {
        let mut rng = Rng(0x5EED_0007);
        for flavor in FLAVORS {
            let fmt = format(flavor);
            for round in 0..40 {
                let parallel = round % 2 == 1;
                let r = random_req(&mut rng, round, parallel);
                let (p, g) = checked_plan(fmt, &r, Trigger::Word("[TOOL_CALLS]".into()));
                let calls: Vec<Call> = random_calls(&mut rng, &r)
                    .into_iter()
                    .map(|(t, a)| (t.name.clone(), a, random_id(&mut rng)))
                    .collect();
                // the id is read back where the format has one
                let ids = flavor != Flavor::Args { call_id: false };
                for layout in 0..4 {
                    let sep = ["", "\n", " ", "\n\n"][layout];
                    let text = render(flavor, &calls, layout, sep);
                    // The grammar writes [TOOL_CALLS] calls back to back; the reading takes
                    // them with whitespace between too.
                    let spaced = flavor != Flavor::Nemo && !sep.is_empty() && calls.len() > 1;
                    assert_eq!(
                        g.accepts_str(&text),
                        !spaced,
                        "{flavor:?} round {round}: {text}\n{}",
                        p.gbnf
                    );
                    let parsed = fmt.parse(&text, Some(&r));
                    assert_eq!(parsed.content, "", "{text}");
                    assert_eq!(parsed.reasoning, None);
                    assert_eq!(parsed.tool_calls.len(), calls.len(), "{text}");
                    for (c, (n, a, id)) in parsed.tool_calls.iter().zip(&calls) {
                        assert_call(c, n, a, ids.then_some(id.as_str()));
                    }
                    if !spaced {
                        check_text_around(fmt, &r, &g, &text, calls.len());
                    }
                    check_stream_calls(fmt, &text, &r);
                    assert!(!g.accepts_str(&format!("Let me check.\n\n{text}")));
                }
                assert!(!g.accepts_str(""));
                assert!(!g.accepts_str("Hello"));
                assert!(!g.accepts_str("[TOOL_CALLS]"));
                // one call, or more when parallel
                let one = render(flavor, &calls[..1], 0, "");
                let (n, a, id) = &calls[0];
                let two = render(flavor, &[calls[0].clone(), calls[0].clone()], 0, "");
                assert_eq!(g.accepts_str(&two), parallel, "{two}");
                // a tool that is not allowed
                let stranger = (String::from("no_such_tool"), json!({}), id.clone());
                assert!(!g.accepts_str(&render(flavor, &[stranger], 0, "")));
                if let Some((o, a)) = other_tool(&mut rng, &r) {
                    let b = render(flavor, &[(o.name.clone(), a, id.clone())], 0, "");
                    assert!(!g.accepts_str(&b), "other tool taken: {b}");
                }
                // broken arguments
                let t = allowed(&r).into_iter().find(|t| t.name == *n).unwrap();
                check_broken_args(&mut rng, &g, t, a, |bad| {
                    render(flavor, &[(n.clone(), bad.clone(), id.clone())], 0, "")
                });
                // unclosed
                assert!(!g.accepts_str(&one[..one.len() - 1]), "{one}");
                // whitespace after the opening markup (the templates write none)
                assert!(!g.accepts_str(&one.replacen("[TOOL_CALLS]", "[TOOL_CALLS] ", 1)));
                // ids other than 9 letters and digits, a missing id, markup out of place
                for bad_id in ["abcDEF12", "abcDEF1234", "abc_EF123", "abcDEF12é"] {
                    let b = render(flavor, &[(n.clone(), a.clone(), bad_id.into())], 0, "");
                    let takes = flavor == Flavor::Args { call_id: false };
                    assert_eq!(g.accepts_str(&b), takes, "{b}");
                }
                match flavor {
                    Flavor::Nemo => {
                        let no_id = format!("[TOOL_CALLS][{}]", json!({"name": n, "arguments": a}));
                        assert!(!g.accepts_str(&no_id), "{no_id}");
                        assert!(fmt.parse(&no_id, Some(&r)).tool_calls[0].id.is_none());
                        let bare = format!(
                            "[TOOL_CALLS]{}",
                            json!({"name": n, "arguments": a, "id": id})
                        );
                        assert!(!g.accepts_str(&bare), "{bare}");
                        assert!(!g.accepts_str(&one.replace("[TOOL_CALLS]", "")));
                    }
                    Flavor::Args { call_id } => {
                        let without = format!("[TOOL_CALLS]{n}[ARGS]{a}");
                        let with = format!("[TOOL_CALLS]{n}[CALL_ID]{id}[ARGS]{a}");
                        assert_eq!(g.accepts_str(&without), !call_id, "{without}");
                        assert_eq!(g.accepts_str(&with), call_id, "{with}");
                        assert!(!g.accepts_str(&one.replace("[ARGS]", "")));
                        assert!(!g.accepts_str(&one.replace("[TOOL_CALLS]", "")));
                        assert!(!g.accepts_str(&one.replace("[ARGS]", "[ARGS] ")));
                    }
                }
            }
        }
    }

    const TOOLS_SCHEMA: &str = r#"{"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}, "detail": {"type": "object", "properties": {"hourly": {"type": "boolean"}}, "required": ["hourly"]}}, "required": ["city"]}"#;

    /// What jinja2 renders for an assistant message with the calls `get_weather` (id
    /// `aB3dE6gH9`, arguments `{"city": "Zürich \"old\" <town>", "days": 3, "unit": "celsius",
    /// "detail": {"hourly": true}}`) and `ping` (id `Z0y1X2w3V`, `{}`), the arguments as
    /// objects, `tojson` as transformers defines it; Devstral and Ministral 3 with the content
    /// "Let me check.". `[2]`: both calls, `[1]`: the first.
    const NEMO_TEXT: [&str; 2] = [
        r#"[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Zürich \"old\" <town>", "days": 3, "unit": "celsius", "detail": {"hourly": true}}, "id": "aB3dE6gH9"}, {"name": "ping", "arguments": {}, "id": "Z0y1X2w3V"}]"#,
        r#"[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Zürich \"old\" <town>", "days": 3, "unit": "celsius", "detail": {"hourly": true}}, "id": "aB3dE6gH9"}]"#,
    ];
    const SMALL_TEXT: [&str; 2] = [
        r#"[TOOL_CALLS]get_weather[CALL_ID]aB3dE6gH9[ARGS]{"city": "Zürich \"old\" <town>", "days": 3, "unit": "celsius", "detail": {"hourly": true}}[TOOL_CALLS]ping[CALL_ID]Z0y1X2w3V[ARGS]{}"#,
        r#"[TOOL_CALLS]get_weather[CALL_ID]aB3dE6gH9[ARGS]{"city": "Zürich \"old\" <town>", "days": 3, "unit": "celsius", "detail": {"hourly": true}}"#,
    ];
    const DEVSTRAL_TEXT: [&str; 2] = [
        r#"Let me check.[TOOL_CALLS]get_weather[ARGS]{"city": "Zürich \"old\" <town>", "days": 3, "unit": "celsius", "detail": {"hourly": true}}[TOOL_CALLS]ping[ARGS]{}"#,
        r#"Let me check.[TOOL_CALLS]get_weather[ARGS]{"city": "Zürich \"old\" <town>", "days": 3, "unit": "celsius", "detail": {"hourly": true}}"#,
    ];
    const MINISTRAL_TEXT: [&str; 2] = [
        r#"Let me check.[TOOL_CALLS]get_weather[ARGS]{"city": "Zürich \"old\" <town>", "days": 3, "unit": "celsius", "detail": {"hourly": true}}[TOOL_CALLS]ping[ARGS]{}"#,
        r#"Let me check.[TOOL_CALLS]get_weather[ARGS]{"city": "Zürich \"old\" <town>", "days": 3, "unit": "celsius", "detail": {"hourly": true}}"#,
    ];

    /// The real templates' renderings of calls in the history are accepted by the grammar
    /// (from `[TOOL_CALLS]` on) and parsed back with their ids.
    #[test]
    fn mistral_grammar_accepts_template_renderings() {
        let tools = vec![
            tool("get_weather", serde_json::from_str(TOOLS_SCHEMA).unwrap()),
            tool("ping", json!({"type": "object", "properties": {}})),
        ];
        let weather = r#"{"city":"Zürich \"old\" <town>","days":3,"unit":"celsius","detail":{"hourly":true}}"#;
        for (flavor, texts, content, ids) in [
            (Flavor::Nemo, NEMO_TEXT, "", true),
            (Flavor::Args { call_id: true }, SMALL_TEXT, "", true),
            (
                Flavor::Args { call_id: false },
                DEVSTRAL_TEXT,
                "Let me check.",
                false,
            ),
            (
                Flavor::Args { call_id: false },
                MINISTRAL_TEXT,
                "Let me check.",
                false,
            ),
        ] {
            let fmt = format(flavor);
            let id = |s: &str| ids.then(|| s.to_string());
            let want = [
                ToolCall {
                    id: id("aB3dE6gH9"),
                    name: "get_weather".into(),
                    arguments: weather.into(),
                },
                ToolCall {
                    id: id("Z0y1X2w3V"),
                    name: "ping".into(),
                    arguments: "{}".into(),
                },
            ];
            for parallel in [true, false] {
                for choice in [ToolChoice::Auto, ToolChoice::Required] {
                    let r = req(tools.clone(), choice.clone(), parallel);
                    let g = Grammar::parse(&fmt.plan(&r).unwrap().unwrap().gbnf).unwrap();
                    for (text, n) in [(texts[0], 2), (texts[1], 1)] {
                        let calls = text.strip_prefix(content).unwrap();
                        assert_eq!(
                            g.accepts_str(calls),
                            parallel || n == 1,
                            "{flavor:?} {text}"
                        );
                        // a forced call has no text before it
                        assert_eq!(
                            g.accepts_str(text),
                            content.is_empty() && (parallel || n == 1)
                        );
                        let p = fmt.parse(text, Some(&r));
                        assert_eq!(p.content, content);
                        assert_eq!(p.tool_calls, want[..n]);
                        check_stream_calls(fmt, text, &r);
                    }
                }
            }
            // the ids the caller makes where the model wrote none suit the template
            let r = req(tools.clone(), ToolChoice::Required, true);
            let g = Grammar::parse(&fmt.plan(&r).unwrap().unwrap().gbnf).unwrap();
            let made = fmt.call_id(7, 1);
            let text = texts[0]
                .strip_prefix(content)
                .unwrap()
                .replace("aB3dE6gH9", &made);
            assert!(g.accepts_str(&text), "{text}");
            assert_eq!(fmt.parse(&text, Some(&r)).tool_calls[0].id, id(&made));
        }
    }

    /// A tool whose parameters refer to their own root: the `$ref`s point into the arguments
    /// (Nemo: inside the call object), and the rules of several tools do not clash.
    #[test]
    fn mistral_grammar_recursive_schema() {
        let tree = tool(
            "tree",
            json!({"type": "object", "properties": {"label": {"const": "root"}, "kids": {"type": "array", "items": {"$ref": "#"}}}, "required": ["label"]}),
        );
        let other = tool(
            "other",
            json!({"type": "object", "properties": {"label": {"type": "integer"}}, "required": ["label"]}),
        );
        let args =
            r#"{"label": "root", "kids": [{"label": "root"}, {"label": "root", "kids": []}]}"#;
        for flavor in FLAVORS {
            let r = req(
                vec![tree.clone(), other.clone()],
                ToolChoice::Required,
                false,
            );
            let p = format(flavor).plan(&r).unwrap().unwrap();
            assert!(p.gbnf.starts_with("root ::= "), "{}", p.gbnf);
            assert_eq!(p.gbnf.matches("\nroot ::=").count(), 0, "{}", p.gbnf);
            let g = Grammar::parse(&p.gbnf).unwrap();
            let ok = match flavor {
                Flavor::Nemo => {
                    format!(
                        r#"[TOOL_CALLS][{{"name": "tree", "arguments": {args}, "id": "abcDEF123"}}]"#
                    )
                }
                Flavor::Args { call_id: true } => {
                    format!("[TOOL_CALLS]tree[CALL_ID]abcDEF123[ARGS]{args}")
                }
                Flavor::Args { call_id: false } => format!("[TOOL_CALLS]tree[ARGS]{args}"),
            };
            assert!(g.accepts_str(&ok), "{ok}\n{}", p.gbnf);
            let bad = ok.replace(r#"{"label": "root"},"#, r#"{"label": "leaf"},"#);
            assert_ne!(bad, ok);
            assert!(!g.accepts_str(&bad));
            let other_call = ok.replace("tree", "other").replace(args, r#"{"label": 5}"#);
            assert!(g.accepts_str(&other_call), "{other_call}");
            let mixed = ok.replace("tree", "other");
            assert!(!g.accepts_str(&mixed), "{mixed}");
        }
    }

    #[test]
    fn mistral_plan_none_and_errors() {
        let f = tool("f", json!({"type": "object", "properties": {}}));
        let bad = tool(
            "bad_tool",
            json!({"type": "object", "patternProperties": {"^x": {"type": "string"}}}),
        );
        for flavor in FLAVORS {
            let fmt = format(flavor);
            assert_eq!(
                fmt.plan(&req(vec![f.clone()], ToolChoice::None, true)),
                Ok(None)
            );
            assert_eq!(fmt.plan(&req(vec![], ToolChoice::Auto, true)), Ok(None));
            let e = fmt
                .plan(&req(
                    vec![f.clone()],
                    ToolChoice::Function("g".into()),
                    false,
                ))
                .unwrap_err();
            assert!(e.contains("`g`"), "{e}");
            let e = fmt
                .plan(&req(vec![f.clone(), bad.clone()], ToolChoice::Auto, false))
                .unwrap_err();
            assert!(e.contains("`bad_tool`"), "{e}");
            // the bad tool is not asked for: no error
            let r = req(
                vec![f.clone(), bad.clone()],
                ToolChoice::Function("f".into()),
                false,
            );
            assert!(fmt.plan(&r).unwrap().is_some());
        }
    }

    /// A call as `parse` gives it, with the id the model wrote, if any.
    fn call(name: &str, args: &str, id: Option<&str>) -> ToolCall {
        ToolCall {
            id: id.map(str::to_string),
            ..super::super::test_util::call(name, args)
        }
    }

    #[test]
    fn mistral_nemo_parse_cases() {
        let r = f_req(true);
        let cases: Vec<(&str, &str, Vec<ToolCall>)> = vec![
            ("Hello", "Hello", vec![]),
            ("Hello \n", "Hello", vec![]),
            (
                r#"[TOOL_CALLS][{"name": "f", "arguments": {"a": 1}, "id": "abcDEF123"}]"#,
                "",
                vec![call("f", r#"{"a":1}"#, Some("abcDEF123"))],
            ),
            (
                "Hi\n\n[TOOL_CALLS][{\"name\": \"f\", \"arguments\": {}, \"id\": \"abcDEF123\"}, {\"name\": \"g\", \"arguments\": {\"x\": [true]}, \"id\": \"000000000\"}]",
                "Hi",
                vec![
                    call("f", "{}", Some("abcDEF123")),
                    call("g", r#"{"x":[true]}"#, Some("000000000")),
                ],
            ),
            // keys in another order, ids missing or not 9 letters and digits
            (
                r#"[TOOL_CALLS][{"id": "abcDEF123", "arguments": {}, "name": "f"}, {"name": "g", "arguments": {}}, {"name": "h", "arguments": {}, "id": "call_1"}, {"name": "i", "arguments": {}, "id": 123456789}]"#,
                "",
                vec![
                    call("f", "{}", Some("abcDEF123")),
                    call("g", "{}", None),
                    call("h", "{}", None),
                    call("i", "{}", None),
                ],
            ),
            // whitespace around the array
            (
                "[TOOL_CALLS] \n[ {\"name\": \"f\", \"arguments\": {}} ]\n",
                "",
                vec![call("f", "{}", None)],
            ),
            // unfinished, not an array, empty, an element that is not a call: content
            (
                r#"[TOOL_CALLS][{"name": "f", "argu"#,
                r#"[TOOL_CALLS][{"name": "f", "argu"#,
                vec![],
            ),
            (
                r#"[TOOL_CALLS]{"name": "f", "arguments": {}}"#,
                r#"[TOOL_CALLS]{"name": "f", "arguments": {}}"#,
                vec![],
            ),
            ("[TOOL_CALLS][]", "[TOOL_CALLS][]", vec![]),
            (
                r#"[TOOL_CALLS][{"name": "f", "arguments": {}}, {"name": "f", "arguments": "{}"}]"#,
                r#"[TOOL_CALLS][{"name": "f", "arguments": {}}, {"name": "f", "arguments": "{}"}]"#,
                vec![],
            ),
            // an Args call is not a Nemo one
            ("[TOOL_CALLS]f[ARGS]{}", "[TOOL_CALLS]f[ARGS]{}", vec![]),
            // the markup inside a string argument
            (
                r#"[TOOL_CALLS][{"name": "f", "arguments": {"s": "[TOOL_CALLS]"}}]"#,
                "",
                vec![call("f", r#"{"s":"[TOOL_CALLS]"}"#, None)],
            ),
            // text after the array; a malformed opening before a good one
            (
                r#"A [TOOL_CALLS][{"name": "f", "arguments": {}}] B"#,
                "A  B",
                vec![call("f", "{}", None)],
            ),
            (
                r#"[TOOL_CALLS]oops [TOOL_CALLS][{"name": "f", "arguments": {}}]"#,
                "[TOOL_CALLS]oops",
                vec![call("f", "{}", None)],
            ),
        ];
        for (text, content, calls) in &cases {
            check_parsed(
                &Format::MistralNemo.parse(text, Some(&r)),
                content,
                calls,
                text,
            );
        }
    }

    #[test]
    fn mistral_args_parse_cases() {
        let r = f_req(true);
        let cases: Vec<(&str, &str, Vec<ToolCall>)> = vec![
            ("Hello", "Hello", vec![]),
            (
                r#"[TOOL_CALLS]f[ARGS]{"a": 1}"#,
                "",
                vec![call("f", r#"{"a":1}"#, None)],
            ),
            (
                "[TOOL_CALLS]f.x-y_2[CALL_ID]abcDEF123[ARGS]{}",
                "",
                vec![call("f.x-y_2", "{}", Some("abcDEF123"))],
            ),
            (
                "Hi\n[TOOL_CALLS]f[CALL_ID]abcDEF123[ARGS]{\"a\": 1}[TOOL_CALLS]g[CALL_ID]Z0y1X2w3V[ARGS]{}",
                "Hi",
                vec![
                    call("f", r#"{"a":1}"#, Some("abcDEF123")),
                    call("g", "{}", Some("Z0y1X2w3V")),
                ],
            ),
            // an id that is not 9 letters and digits is dropped
            (
                "[TOOL_CALLS]f[CALL_ID]call_1[ARGS]{}",
                "",
                vec![call("f", "{}", None)],
            ),
            // whitespace around the name and the arguments
            (
                "[TOOL_CALLS] f [ARGS] {}\n",
                "",
                vec![call("f", "{}", None)],
            ),
            (
                "[TOOL_CALLS]f[ARGS]{} [TOOL_CALLS]g[ARGS]{}",
                "",
                vec![call("f", "{}", None), call("g", "{}", None)],
            ),
            // unfinished, not an object, no [ARGS], no name, a name with a space: content
            (
                r#"[TOOL_CALLS]f[ARGS]{"a": 1"#,
                r#"[TOOL_CALLS]f[ARGS]{"a": 1"#,
                vec![],
            ),
            ("[TOOL_CALLS]f[ARGS][1]", "[TOOL_CALLS]f[ARGS][1]", vec![]),
            (
                r#"[TOOL_CALLS]f{"a": 1}"#,
                r#"[TOOL_CALLS]f{"a": 1}"#,
                vec![],
            ),
            (
                "[TOOL_CALLS]f[CALL_ID]abcDEF123",
                "[TOOL_CALLS]f[CALL_ID]abcDEF123",
                vec![],
            ),
            ("[TOOL_CALLS][ARGS]{}", "[TOOL_CALLS][ARGS]{}", vec![]),
            (
                "[TOOL_CALLS]my tool[ARGS]{}",
                "[TOOL_CALLS]my tool[ARGS]{}",
                vec![],
            ),
            // a Nemo array is not an Args call
            (
                r#"[TOOL_CALLS][{"name": "f", "arguments": {}}]"#,
                r#"[TOOL_CALLS][{"name": "f", "arguments": {}}]"#,
                vec![],
            ),
            // the markup inside a string argument
            (
                r#"[TOOL_CALLS]f[ARGS]{"s": "[TOOL_CALLS]g[ARGS]{}"}"#,
                "",
                vec![call("f", r#"{"s":"[TOOL_CALLS]g[ARGS]{}"}"#, None)],
            ),
            // text after a call; a malformed opening before a good one
            (
                "A [TOOL_CALLS]f[ARGS]{} B",
                "A  B",
                vec![call("f", "{}", None)],
            ),
            (
                "[TOOL_CALLS]oops [TOOL_CALLS]f[ARGS]{}",
                "[TOOL_CALLS]oops",
                vec![call("f", "{}", None)],
            ),
        ];
        for call_id in [true, false] {
            let fmt = Format::Mistral { call_id };
            for (text, content, calls) in &cases {
                let p = fmt.parse(text, Some(&r));
                check_parsed(&p, content, calls, &format!("{call_id} {text}"));
            }
        }
    }

    #[test]
    fn mistral_verbatim_and_partial_cases() {
        let r = f_req(false);
        for flavor in FLAVORS {
            let fmt = format(flavor);
            // no tools or tool_choice none: the text as is
            for t in [
                "Hi [TOOL_CALLS]f[ARGS]{}\n",
                "Hi [TOOL_CALLS][{\"name\": \"f\", \"arguments\": {}}]\n",
            ] {
                check_verbatim(fmt, t, &r.tools);
            }
            for (t, c) in [
                ("Hi [TOOL", "Hi"),
                ("Hi [", "Hi"),
                ("Hi [TOOL_CALLS", "Hi"),
                ("Hi [TOOL_CALLS]", "Hi"),
                ("Hi [TOOL_CALLS]f[", "Hi"),
                ("Hi [TOOL_CALLS][{\"na", "Hi"),
                ("Hi [TOOLS]", "Hi [TOOLS]"),
                ("a [b]", "a [b]"),
                ("a\n\n", "a"),
                ("", ""),
            ] {
                let p = fmt.parse_partial(t, Some(&r));
                check_parsed(&p, c, &[], t);
            }
        }
    }

    /// For every text built from the formats' pieces and every prefix of it, what streaming
    /// sends is a prefix of what the finished text gives, and is never taken back.
    #[test]
    fn mistral_partial_is_prefix_of_parse() {
        let r = f_req(true);
        let frags = [
            "a",
            "b c",
            " ",
            "\n",
            "[",
            "]",
            "[TOOL",
            "[TOOL_CALLS]",
            "[ARGS]",
            "[CALL_ID]",
            "f",
            "abcDEF123",
            "call_1",
            "{}",
            "{\"a\": 1}",
            "{\"s\": \"[TOOL_CALLS]\"}",
            "[{\"name\": \"f\", \"arguments\": {}, \"id\": \"abcDEF123\"}]",
            "{\"name\": \"f\", \"arguments\": {}}",
            "[1]",
            "{",
            "}",
            "[TOOL_CALLS]f[ARGS]{\"a\": 1}",
            "é",
            // streamed calls: with ids, several items, a tool not offered
            "[TOOL_CALLS]f[CALL_ID]abcDEF123[ARGS]{\"b\": [2, \"x\\u00e9\"], \"c\": -1.5}",
            "[TOOL_CALLS]g [CALL_ID] call_1 [ARGS] {\"a\": {}}",
            "[TOOL_CALLS]zz[ARGS]{}",
            "zz",
            "[{\"name\": \"f\", \"arguments\": {\"a\": [1]}, \"id\": \"abcDEF123\"}, {\"id\": \"Z0y1X2w3V\", \"name\": \"g\", \"arguments\": {}}]",
            "[{\"name\": \"f\", \"arguments\": {}}, {\"name\": \"zz\", \"arguments\": {}}]",
            ", ",
        ];
        let mut rng = Rng(17);
        let (mut checked, mut begun) = (0usize, 0usize);
        for flavor in FLAVORS {
            let fmt = format(flavor);
            for _ in 0..1500 {
                let t: String = (0..rng.below(7))
                    .map(|_| frags[rng.below(frags.len())])
                    .collect();
                for q in [Some(&r), None] {
                    checked += check_partial_prefixes(fmt, &t, q).1;
                    begun += fmt.parse_partial(&t, q).tool_calls.len();
                }
            }
        }
        assert!(checked > 20_000 && begun > 300, "{checked} {begun}");
    }

    /// Calls streamed as they are written: an Args call once its name and id are final, its
    /// arguments as far as they are known; a Nemo call once its item is whole (its id may come
    /// after its arguments).
    #[test]
    fn mistral_partial_streams_calls() {
        let r = f_req(true);
        let f1 = || call("f", r#"{"a":1}"#, None);
        for call_id in [true, false] {
            let fmt = Format::Mistral { call_id };
            for (t, calls) in [
                // the name may go on (`f.x-y_2`), the markup may come, the id may go on
                ("Hi [TOOL_CALLS]f", vec![]),
                ("Hi [TOOL_CALLS]f.x", vec![]),
                ("Hi [TOOL_CALLS]f[", vec![]),
                ("Hi [TOOL_CALLS]f[CALL_ID]abcDEF12", vec![]),
                // the id ends at the next markup's `[`; one that is not 9 letters is None
                (
                    "Hi [TOOL_CALLS]f[CALL_ID]abcDEF123[",
                    vec![call("f", "", Some("abcDEF123"))],
                ),
                (
                    "Hi [TOOL_CALLS]f[CALL_ID]call_1[ARGS]",
                    vec![call("f", "", None)],
                ),
                ("Hi [TOOL_CALLS]f[AR", vec![]),
                ("Hi [TOOL_CALLS]f[ARGS]", vec![call("f", "", None)]),
                (
                    "Hi [TOOL_CALLS]f [ARGS] {\"a\": [1, \"P\\u00e9",
                    vec![call("f", "{\"a\":[1,\"Pé", None)],
                ),
                // a number at the end may go on
                (
                    "Hi [TOOL_CALLS]f[ARGS]{\"a\": 1",
                    vec![call("f", "{\"a\":", None)],
                ),
                ("Hi [TOOL_CALLS]f[ARGS]{\"a\": 1}[TOOL_CALLS]g", vec![f1()]),
                (
                    "Hi [TOOL_CALLS]f[ARGS]{\"a\": 1}\n[TOOL_CALLS]g[ARGS]{",
                    vec![f1(), call("g", "{", None)],
                ),
                // a tool not offered is not begun
                ("Hi [TOOL_CALLS]zz[ARGS]{", vec![]),
                ("Hi [TOOL_CALLS]f{", vec![]),
                // broken after it was begun: the call stays as far as it was read
                (
                    "Hi [TOOL_CALLS]f[ARGS]{\"a\": 1 x",
                    vec![call("f", "{\"a\":1", None)],
                ),
                (
                    "Hi [TOOL_CALLS]f[CALL_ID]abcDEF123[X",
                    vec![call("f", "", Some("abcDEF123"))],
                ),
                // a repeated key keeps its first value (as `parse` reads it)
                (
                    r#"Hi [TOOL_CALLS]f[ARGS]{"a": 1, "b": {"c": [2]}, "a": 3}"#,
                    vec![call("f", r#"{"a":1,"b":{"c":[2]}}"#, None)],
                ),
                (
                    r#"Hi [TOOL_CALLS]f[ARGS]{"a": {"c": 1, "\u0063": 2}}"#,
                    vec![call("f", r#"{"a":{"c":1}}"#, None)],
                ),
            ] {
                check_parsed(&fmt.parse_partial(t, Some(&r)), "Hi", &calls, t);
                // a text cut inside a call (max_tokens) ends with the call as streamed
                let fin = fmt.parse_final(t, Some(&r));
                assert_eq!(fin.tool_calls, calls, "{t}");
            }
        }
        let fmt = Format::MistralNemo;
        let item = r#"{"name": "f", "arguments": {"a": 1}, "id": "abcDEF123"}"#;
        let f_id = || call("f", r#"{"a":1}"#, Some("abcDEF123"));
        for (t, calls) in [
            (
                r#"Hi [TOOL_CALLS][{"name": "f", "arguments": {"a": 1}, "id": "abcDEF123""#
                    .to_string(),
                vec![],
            ),
            (format!("Hi [TOOL_CALLS][{item}"), vec![f_id()]),
            // the id first: still only once whole; a repeated key keeps its first value
            (
                r#"Hi [TOOL_CALLS][{"id": "abcDEF123", "name": "f", "arguments": {}"#.into(),
                vec![],
            ),
            (
                r#"Hi [TOOL_CALLS] [{"id": "abcDEF123", "name": "f", "arguments": {}, "id": "x"}"#
                    .into(),
                vec![call("f", "{}", Some("abcDEF123"))],
            ),
            (
                format!(r#"Hi [TOOL_CALLS][{item}, {{"name": "g", "arguments": {{}}}}"#),
                vec![f_id(), call("g", "{}", None)],
            ),
            // nothing after an item that is not a call
            (format!("Hi [TOOL_CALLS][{item}, 1, {item}"), vec![f_id()]),
        ] {
            check_parsed(&fmt.parse_partial(&t, Some(&r)), "Hi", &calls, &t);
        }
        // A whole array with a tool not offered after one that is: `parse` leaves it in the
        // content, but the call streamed before it stands.
        let t = format!(r#"[TOOL_CALLS][{item}, {{"name": "zz", "arguments": {{}}}}]"#);
        assert!(fmt.parse(&t, Some(&r)).tool_calls.is_empty());
        assert_eq!(fmt.parse_partial(&t, Some(&r)).tool_calls, vec![f_id()]);
        assert_eq!(fmt.parse_final(&t, Some(&r)).tool_calls, vec![f_id()]);
        // one not offered first: passed over as `parse` does, the next array read
        let t =
            format!(r#"[TOOL_CALLS][{{"name": "zz", "arguments": {{}}}}] [TOOL_CALLS][{item}]"#);
        assert_eq!(fmt.parse(&t, Some(&r)).tool_calls, vec![f_id()]);
        check_stream_calls(fmt, &t, &r);
    }

    /// Well-formed outputs (calls of offered tools and of one not offered) with a few random
    /// edits, as a model without a grammar may slip: streaming never takes back what it sent,
    /// and the final reading goes on from it.
    #[test]
    fn mistral_partial_mutated_outputs() {
        let r = f_req(true);
        let args = [
            json!({"a": [1, "Pé\"", {"b": null}], "c": -1.5e3, "d": "x"}),
            json!({}),
            json!({"s": "[TOOL_CALLS]g[ARGS]{}", "t": true}),
            json!({"n": {"m": {"k": "😀"}}}),
        ];
        let pieces = [
            "[TOOL_CALLS]",
            "[ARGS]",
            "[CALL_ID]",
            "[",
            "]",
            "{",
            "}",
            "\"",
            ",",
            " ",
            "\u{a0}",
            "zz",
            "1",
            "x",
            "é",
            "\\",
            "\"a\": 0, ",
            ", \"c\": [2]",
            "\"id\": \"Z0y1X2w3V\", ",
            "\"name\": \"g\", ",
        ];
        let mut rng = Rng(0x5EED_00A7);
        let (mut checked, mut begun) = (0usize, 0usize);
        for round in 0..400 {
            let calls: Vec<Call> = (0..1 + rng.below(3))
                .map(|_| {
                    let n = ["f", "g", "zz", "f.x-y_2"][rng.below(4)];
                    (
                        n.to_string(),
                        args[rng.below(args.len())].clone(),
                        random_id(&mut rng),
                    )
                })
                .collect();
            for flavor in FLAVORS {
                let fmt = format(flavor);
                let sep = ["", "\n", " "][round % 3];
                let mut t = format!("Hi {}", render(flavor, &calls, round % 4, sep));
                if rng.below(4) == 0 {
                    // a repeated key ("c" comes before "d"), in whatever layout
                    t = t.replacen("\"d\"", "\"c\": 0, \"d\"", 1);
                }
                for _ in 0..rng.below(4) {
                    mutate(&mut rng, &mut t, &pieces, 40);
                }
                checked += check_partial_prefixes(fmt, &t, Some(&r)).1;
                begun += fmt.parse_partial(&t, Some(&r)).tool_calls.len();
            }
        }
        assert!(checked > 100_000 && begun > 500, "{checked} {begun}");
    }

    #[test]
    fn mistral_detect() {
        assert_eq!(detect("{{ messages }}"), None);
        assert_eq!(detect("x [TOOL_CALLS] y"), Some(Format::MistralNemo));
        assert_eq!(
            detect("[TOOL_CALLS]{{ n }}[ARGS]"),
            Some(Format::Mistral { call_id: false })
        );
        assert_eq!(
            detect("[TOOL_CALLS]{{ n }}[CALL_ID]{{ i }}[ARGS]"),
            Some(Format::Mistral { call_id: true })
        );
        assert_eq!(detect("[ARGS] [CALL_ID]"), None);
        let want = [
            (
                "mistralai-Mistral-Nemo-Instruct-2407.jinja",
                Format::MistralNemo,
            ),
            (
                "Mistral-Small-3.2-24B-Instruct-2506.jinja",
                Format::Mistral { call_id: true },
            ),
            (
                "unsloth-mistral-Devstral-Small-2507.jinja",
                Format::Mistral { call_id: false },
            ),
            (
                "mistralai-Ministral-3-14B-Reasoning-2512.jinja",
                Format::Mistral { call_id: false },
            ),
        ];
        // no other template (Qwen 2.5's, Llama 3.1's, DeepSeek V3.1's among them) is Mistral's
        for (file, src) in check_detect_all(detect, &want) {
            if want.iter().any(|(f, _)| *f == file) {
                assert_eq!(Format::detect(Some(&src)).lazy_start(), Some(LAZY_START));
            }
        }
        assert_eq!(Format::MistralNemo.markup(), ["[TOOL_CALLS]"]);
        assert_eq!(
            Format::Mistral { call_id: true }.markup(),
            ["[TOOL_CALLS]", "[ARGS]", "[CALL_ID]"]
        );
    }
}
