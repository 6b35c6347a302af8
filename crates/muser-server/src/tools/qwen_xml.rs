//! The Qwen3-Coder XML format (Qwen3-Coder, Qwen 3.5, Nemotron Nano 3, StepFun 3.5; llama.cpp's
//! `common/parsers/qwen3-coder.cpp` handler): calls are blocks
//! `<tool_call>\n<function=NAME>\n` (`<parameter=K>\nV\n</parameter>\n`)* `</function>\n</tool_call>`
//! after the reply's text if any, one block a call. A string value V is its raw text; the
//! templates write mappings and sequences with `tojson`, other values with `| string`
//! (Python's `True`, `False`, `None`). The chat template shows the tools itself.
//!
//! # Plan (grammar)
//!
//! `Auto`: lazy from `<tool_call>`; `Required` / `Function(N)`: the whole output, no text
//! before the first block. One block, or with `parallel` one or more. The parameters follow
//! `xml_args` (schema order, raw strings, JSON otherwise: the grammar makes the model write
//! `true`, `false` and `null` as JSON). Whitespace: each value is framed by exactly the
//! template's newlines (`>\n` before, `\n</parameter>` after); between the other tags, between
//! blocks and after the last one, nothing, a space, or one or two newlines and an indentation
//! (the templates write `\n`; StepFun writes nothing between blocks, Nemotron a newline after
//! the last). A tool name with `>` or a line break, or a parameter name with one, cannot be
//! written in a tag: the plan refuses it.
//!
//! # Parse
//!
//! A block is read where `<tool_call>` is followed by `<function=NAME>`, parameters and
//! `</function>` (any whitespace between tags), then `</tool_call>` or the end of the output,
//! and NAME is a tool of the request; else `<tool_call>` stays in the content and the text
//! after it is read on. A value is the text up to the first `</parameter>` followed by another
//! parameter or `</function>`, less one newline at each end; it is read by its schema's types
//! (raw where strings are admitted, JSON otherwise, and Python's `True`/`False`/`None` where
//! the schema admits the type and no string). The parameters are taken in any order.
//!
//! Streaming sends the content before the first `<tool_call>`, and the calls as they are
//! written: each once its `<function=NAME>` is whole, its arguments
//! (`xml_args::StreamedArgs`) growing by whole parameters, each once its end is sure whatever
//! follows (`value_len_partial`), a string-only parameter's characters as they come, and `}` at
//! `</function>`. A parameter given again is read past (its first value is the one `parse`
//! keeps) and the parameters after it stream on.

use super::xml_args::{arguments, tail_len, ws_len, Params, StreamedArgs, Syntax};
use super::{
    allowed_tools, json_prefix, offered, parse_blocks, parse_blocks_partial, BlockStep, Blocks,
    LazyStart, Parsed, Plan, ToolCall, ToolRequest,
};
use muser_jsonschema::gbnf_literal as literal;

const OPEN: &str = "<tool_call>";
const CLOSE: &str = "</tool_call>";
const FUNCTION: &str = "<function=";
const FUNCTION_CLOSE: &str = "</function>";
const PARAM: &str = "<parameter=";
const PARAM_CLOSE: &str = "</parameter>";

pub(super) const LAZY_START: LazyStart = LazyStart::Word(OPEN);
/// llama.cpp preserves the first two; the tags are there for vocabularies that make them
/// tokens.
pub(super) const MARKUP: &[&str] = &[OPEN, CLOSE, FUNCTION, FUNCTION_CLOSE, PARAM, PARAM_CLOSE];

/// Characters a tag cannot carry in a name.
const NAME_STOPS: &[char] = &['>', '\n', '\r'];

/// `<parameter=K>\nV\n</parameter>`, the whitespace rule after it.
const SYNTAX: Syntax = Syntax {
    format: "Qwen XML",
    prefix: "qwen",
    open: |k| format!("{PARAM}{k}>\n"),
    close: "\n</parameter>",
    end_tag: PARAM_CLOSE,
    name_stops: NAME_STOPS,
    python: true,
};

/// llama.cpp's test: the three tags, and not the variant without newlines between them.
pub(super) fn detect(template: &str) -> bool {
    template.contains(OPEN)
        && template.contains(FUNCTION)
        && template.contains(PARAM)
        && !template.contains("'<tool_call><function=' ~ tool_call.name ~ '>'")
}

pub(super) fn plan(req: &ToolRequest) -> Result<Option<Plan>, String> {
    let Some(tools) = allowed_tools(req)? else {
        return Ok(None);
    };
    let mut params = Params::new(&SYNTAX);
    let ws = params.ws();
    let mut rules = String::new();
    let mut alts = Vec::new();
    for (i, tool) in tools.iter().enumerate() {
        let name = &tool.name;
        if name.is_empty() {
            return Err("a tool has an empty name".into());
        }
        if let Some(c) = name.chars().find(|c| NAME_STOPS.contains(c)) {
            return Err(format!(
                "tool `{name}`: the Qwen XML format cannot carry {c:?} in a tool name"
            ));
        }
        let seq = params.tool(i, tool)?;
        let rule = format!("qwen-t{i}");
        rules.push_str(&format!(
            "{rule} ::= {} {ws} {seq} {} {ws}\n",
            literal(&format!("{FUNCTION}{name}>")),
            literal(FUNCTION_CLOSE)
        ));
        alts.push(rule);
    }
    let mut gbnf = if req.parallel {
        "root ::= qwen-call ( qwen-call )*\n".to_string()
    } else {
        "root ::= qwen-call\n".to_string()
    };
    gbnf.push_str(&format!(
        "qwen-call ::= {} {ws} ( {} ) {} {ws}\n",
        literal(OPEN),
        alts.join(" | "),
        literal(CLOSE)
    ));
    gbnf.push_str(&params.finish());
    gbnf.push_str(&rules);
    Ok(Some(Plan::calls(gbnf, &req.choice, LAZY_START)))
}

/// A tag's name up to `>` (no line break in it), and the bytes through `>`.
fn tag_name(s: &str) -> Option<(&str, usize)> {
    let end = s.find('>')?;
    let name = &s[..end];
    (!name.contains(['\n', '\r'])).then_some((name, end + 1))
}

/// The length of a parameter's raw text in `s` (which follows `<parameter=K>`): where a JSON
/// value that opens it ends, when `</parameter>` follows (a JSON string may hold
/// `</parameter>`; a raw one never does, the grammar keeps it out), else up to the first
/// `</parameter>` followed, after whitespace, by `<parameter=` or `</function>`.
fn value_len(s: &str) -> Option<usize> {
    let closes_at = |at: usize| {
        s[at..].strip_prefix(PARAM_CLOSE).is_some_and(|after| {
            let next = &after[ws_len(after)..];
            next.starts_with(PARAM) || next.starts_with(FUNCTION_CLOSE)
        })
    };
    if let Some((_, n)) = json_prefix(s) {
        let at = n + usize::from(s[n..].starts_with('\n'));
        if closes_at(at) {
            return Some(at);
        }
    }
    let mut from = 0;
    loop {
        let at = from + s[from..].find(PARAM_CLOSE)?;
        if closes_at(at) {
            return Some(at);
        }
        from = at + PARAM_CLOSE.len();
    }
}

/// One call as written: its name and its parameters' names and raw texts.
type RawCall<'t> = (&'t str, Vec<(String, String)>);

/// The call block whose `<tool_call>` ends right before `rest`: the call and the length of
/// `rest` it spans (through `</tool_call>`, or to the end for an unclosed final block). None
/// when the block is malformed.
fn read_block(rest: &str) -> Option<(RawCall<'_>, usize)> {
    let mut p = ws_len(rest);
    p += rest[p..].starts_with(FUNCTION).then_some(FUNCTION.len())?;
    let (name, n) = tag_name(&rest[p..])?;
    p += n;
    let mut args = Vec::new();
    loop {
        p += ws_len(&rest[p..]);
        let s = &rest[p..];
        if let Some(after) = s.strip_prefix(PARAM) {
            let (key, n) = tag_name(after)?;
            let len = value_len(&after[n..])?;
            let raw = &after[n..n + len];
            let raw = raw.strip_prefix('\n').unwrap_or(raw);
            let raw = raw.strip_suffix('\n').unwrap_or(raw);
            args.push((key.to_string(), raw.to_string()));
            p += PARAM.len() + n + len + PARAM_CLOSE.len();
        } else if s.starts_with(FUNCTION_CLOSE) {
            p += FUNCTION_CLOSE.len();
            break;
        } else {
            return None;
        }
    }
    p += ws_len(&rest[p..]);
    if rest[p..].starts_with(CLOSE) {
        Some(((name, args), p + CLOSE.len()))
    } else if p == rest.len() {
        Some(((name, args), p))
    } else {
        None
    }
}

/// Content is the text with the calls' blocks taken out, its trailing whitespace trimmed;
/// malformed blocks, and blocks calling a tool the request does not offer, stay in it.
pub(super) fn parse(text: &str, req: Option<&ToolRequest>) -> Parsed {
    parse_blocks(text, req, &[OPEN], |after| {
        let ((name, args), used) = read_block(after).filter(|((name, _), _)| offered(req, name))?;
        let call = ToolCall {
            id: None,
            name: name.to_string(),
            arguments: arguments(&SYNTAX, name, &args, req),
        };
        Some((vec![call], used))
    })
}

/// How `s` starts against the literal `lit`: with it (Some(true)), with a proper prefix of it
/// (None: what follows decides), or otherwise (Some(false)).
fn starts(s: &str, lit: &str) -> Option<bool> {
    if s.starts_with(lit) {
        Some(true)
    } else if lit.starts_with(s) {
        None
    } else {
        Some(false)
    }
}

/// Whether `</parameter>` at `at` in the text `s` after `<parameter=K>` ends the value (it is
/// followed, after whitespace, by `<parameter=` or `</function>`, as `value_len` asks),
/// whatever follows `s`; None while what follows decides.
fn closes_at(s: &str, at: usize) -> Option<bool> {
    let after = &s[at..];
    let Some(rest) = after.strip_prefix(PARAM_CLOSE) else {
        return starts(after, PARAM_CLOSE);
    };
    let next = &rest[ws_len(rest)..];
    match (starts(next, PARAM), starts(next, FUNCTION_CLOSE)) {
        (Some(true), _) | (_, Some(true)) => Some(true),
        (None, _) | (_, None) => None,
        _ => Some(false),
    }
}

/// `value_len` of the text after `<parameter=K>` as far as `s` tells: Some where every text
/// that starts with `s` gives that length, None while what follows may change it.
fn value_len_partial(s: &str) -> Option<usize> {
    // The JSON reading first, as `value_len`: it wins where its value ends, after at most a
    // newline, at a closing `</parameter>`.
    let mut it = serde_json::Deserializer::from_str(s).into_iter::<serde_json::Value>();
    match it.next() {
        None => return None,
        // at the end a value may still come; another error is at a character of `s` and
        // stays whatever follows (where that is the end, a number out of range, no
        // `</parameter>` follows it yet and the raw reading below says None)
        Some(Err(e)) if e.is_eof() => return None,
        Some(Err(_)) => {}
        Some(Ok(_)) => {
            // (a number or a literal at the very end, which may go on, has no `</parameter>`
            // after it yet: None)
            let n = it.byte_offset();
            let at = n + usize::from(s[n..].starts_with('\n'));
            match closes_at(s, at) {
                Some(true) => return Some(at),
                None => return None,
                Some(false) => {}
            }
        }
    }
    // then the first `</parameter>` that closes
    let mut from = 0;
    loop {
        let at = from + s[from..].find(PARAM_CLOSE)?;
        if closes_at(s, at)? {
            return Some(at);
        }
        from = at + PARAM_CLOSE.len();
    }
}

/// The start of a value's raw text that every text beginning with `v` (the text after
/// `<parameter=K>`) gives: the value ends at a `</parameter>`, so not before the first one
/// (or a tail that may become one), and loses one newline at each end.
fn known_raw(v: &str) -> &str {
    let limit = v
        .find(PARAM_CLOSE)
        .unwrap_or_else(|| v.len() - tail_len(v, PARAM_CLOSE));
    let lead = usize::from(v.starts_with('\n')).min(limit);
    let known = &v[lead..limit];
    known.strip_suffix('\n').unwrap_or(known)
}

/// Whether text after `<function=` or `<parameter=` that `tag_name` does not read yet may
/// still become a name and its `>`: it has neither `>` nor a line break.
fn name_open(s: &str) -> bool {
    !s.contains(['>', '\n', '\r'])
}

/// How far streaming has read the call block whose `<tool_call>` ends right before `rest`: the
/// call is begun once its `<function=NAME>` is whole, and its arguments grow by whole
/// parameters (`StreamedArgs`), a parameter whose schema admits strings only by its
/// characters too. A repeated parameter name's value is read past and left out (`arguments`
/// keeps the first value), and the parameters after it go on streaming.
fn read_block_partial(rest: &str, req: Option<&ToolRequest>) -> BlockStep {
    let mut p = ws_len(rest);
    match starts(&rest[p..], FUNCTION) {
        Some(true) => p += FUNCTION.len(),
        None => return BlockStep::Open(Vec::new()),
        Some(false) => return BlockStep::Broken(Vec::new()),
    }
    let Some((name, n)) = tag_name(&rest[p..]) else {
        return if name_open(&rest[p..]) {
            BlockStep::Open(Vec::new())
        } else {
            BlockStep::Broken(Vec::new())
        };
    };
    p += n;
    let mut args = StreamedArgs::new(&SYNTAX, name, req);
    let begun = |args: StreamedArgs| {
        vec![ToolCall {
            id: None,
            name: name.to_string(),
            arguments: args.into_text(),
        }]
    };
    loop {
        p += ws_len(&rest[p..]);
        let s = &rest[p..];
        if let Some(after) = s.strip_prefix(PARAM) {
            let Some((key, n)) = tag_name(after) else {
                return if name_open(after) {
                    BlockStep::Open(begun(args))
                } else {
                    BlockStep::Broken(begun(args))
                };
            };
            // a repeated name's value is read past and left out, as `arguments` leaves it
            let new = args.is_new(key);
            let v = &after[n..];
            let Some(len) = value_len_partial(v) else {
                if new {
                    args.push_open(key, known_raw(v));
                }
                return BlockStep::Open(begun(args));
            };
            if new {
                let raw = &v[..len];
                let raw = raw.strip_prefix('\n').unwrap_or(raw);
                args.push(key, raw.strip_suffix('\n').unwrap_or(raw));
            }
            p += PARAM.len() + n + len + PARAM_CLOSE.len();
        } else if s.starts_with(FUNCTION_CLOSE) {
            p += FUNCTION_CLOSE.len();
            args.close();
            break;
        } else if PARAM.starts_with(s) || FUNCTION_CLOSE.starts_with(s) {
            return BlockStep::Open(begun(args));
        } else {
            return BlockStep::Broken(begun(args));
        }
    }
    p += ws_len(&rest[p..]);
    match starts(&rest[p..], CLOSE) {
        Some(true) => match read_block(rest) {
            Some(((name, raw), used)) => BlockStep::Whole(
                vec![ToolCall {
                    id: None,
                    name: name.to_string(),
                    arguments: arguments(&SYNTAX, name, &raw, req),
                }],
                used,
            ),
            None => BlockStep::Broken(begun(args)),
        },
        None => BlockStep::Open(begun(args)),
        Some(false) => BlockStep::Broken(begun(args)),
    }
}

/// As Hermes's, whose calls start with `<tool_call>` too: the content up to the first
/// `<tool_call>`, less a tail that may start one, less trailing whitespace; the calls begun
/// (`read_block_partial`).
pub(super) fn parse_partial(text: &str, req: Option<&ToolRequest>, from: &mut Blocks) -> Parsed {
    parse_blocks_partial(
        text,
        req,
        &[OPEN],
        |rest| read_block_partial(rest, req),
        from,
    )
}

#[cfg(test)]
mod tests {
    use super::super::test_util::*;
    use super::super::{think, Format, Tool, ToolChoice, Trigger};
    use super::*;
    use serde_json::{json, Map, Value};

    /// A value as the templates write it: a string raw, a mapping or sequence as JSON in
    /// layout `json` of `layouts`, another value as JSON (the grammar's spelling).
    fn render_value(v: &Value, json: usize) -> String {
        match v {
            Value::String(s) => s.clone(),
            Value::Object(_) | Value::Array(_) => {
                let l = layouts(v);
                l[json % l.len()].clone()
            }
            other => other.to_string(),
        }
    }

    /// One block with `ws` between the tags (the templates write "\n").
    fn render_call(name: &str, args: &Map<String, Value>, ws: &str, json: usize) -> String {
        let mut s = format!("<tool_call>{ws}<function={name}>{ws}");
        for (k, v) in args {
            s.push_str(&format!(
                "<parameter={k}>\n{}\n</parameter>{ws}",
                render_value(v, json)
            ));
        }
        s.push_str(&format!("</function>{ws}</tool_call>"));
        s
    }

    /// The arguments in the order of the schema's properties (the grammar's), others after.
    fn ordered(schema: &Value, args: &Value) -> Map<String, Value> {
        let args = args.as_object().unwrap();
        let props = schema["properties"].as_object().unwrap();
        let mut m: Map<String, Value> = props
            .keys()
            .filter_map(|k| Some((k.clone(), args.get(k)?.clone())))
            .collect();
        for (k, v) in args {
            if !props.contains_key(k) {
                m.insert(k.clone(), v.clone());
            }
        }
        m
    }

    /// (between tags, between blocks, after the last block)
    const LAYOUTS: &[(&str, &str, &str)] = &[
        // Qwen3-Coder, Qwen 3.5
        ("\n", "\n", ""),
        // StepFun 3.5
        ("\n", "", ""),
        // Nemotron Nano 3
        ("\n", "\n", "\n"),
        ("", "", ""),
        (" ", "\n\n", "\n"),
        ("\n  ", " ", " "),
    ];

    /// Random tools and calls: the grammar takes the rendered blocks in several layouts,
    /// `parse` gives the calls back; unknown and other tools, broken arguments, a second
    /// call without `parallel` and broken markup are refused.
    #[test]
    fn qwen_xml_grammar_accepts_calls_and_refuses_wrong_ones() {
        let mut rng = Rng(0x5EED_0011);
        let mut refused_args = 0;
        for round in 0..60 {
            let parallel = round % 2 == 1;
            let r = random_req(&mut rng, round, parallel);
            let (p, g) = checked_plan(Format::QwenXml, &r, Trigger::Word("<tool_call>".into()));
            let calls: Vec<(&Tool, Map<String, Value>)> = random_calls(&mut rng, &r)
                .into_iter()
                .map(|(t, a)| (t, ordered(&t.parameters, &a)))
                .collect();
            for (li, (ws, between, after)) in LAYOUTS.iter().enumerate() {
                let blocks: Vec<String> = calls
                    .iter()
                    .map(|(t, a)| render_call(&t.name, a, ws, li))
                    .collect();
                let text = format!("{}{after}", blocks.join(between));
                assert!(
                    g.accepts_str(&text),
                    "round {round}: refused {text:?}\n{}",
                    p.gbnf
                );
                let parsed = Format::QwenXml.parse(&text, Some(&r));
                assert_eq!(parsed.content, "");
                assert_eq!(parsed.reasoning, None);
                assert_eq!(parsed.tool_calls.len(), calls.len(), "{text:?}");
                for (c, (t, a)) in parsed.tool_calls.iter().zip(&calls) {
                    assert_call(c, &t.name, &Value::Object(a.clone()), None);
                }
                check_text_around(Format::QwenXml, &r, &g, &text, calls.len());
                check_stream_calls(Format::QwenXml, &text, &r);
                // ... and sent whole by the end
                let end = Format::QwenXml.parse_partial(&text, Some(&r));
                assert_eq!(end.tool_calls, parsed.tool_calls, "{text:?}");
            }
            assert!(!g.accepts_str(""));
            assert!(!g.accepts_str("Hello"));
            let (t, a) = &calls[0];
            let n = &t.name;
            let one = render_call(n, a, "\n", 0);
            assert_eq!(g.accepts_str(&format!("{one}\n{one}")), parallel);
            // a tool that is not allowed
            assert!(!g.accepts_str(&render_call("no_such_tool", &Map::new(), "\n", 0)));
            if let Some((o, a)) = other_tool(&mut rng, &r) {
                let b = render_call(&o.name, &ordered(&o.parameters, &a), "\n", 0);
                assert!(!g.accepts_str(&b), "other tool taken: {b}");
            }
            // Broken arguments: those the format carries as they are (read back unchanged;
            // a wrong-typed string may spell a right value, `"12"` for an integer) are refused.
            let good = Value::Object(a.clone());
            for bad in broken_args(&mut rng, &t.parameters, &good) {
                if !bad.is_object() {
                    continue;
                }
                let bad = ordered(&t.parameters, &bad);
                let b = render_call(n, &bad, "\n", 0);
                let back = Format::QwenXml.parse(&b, Some(&r)).tool_calls;
                if back.len() == 1 && back[0].arguments == serde_json::to_string(&bad).unwrap() {
                    assert!(!g.accepts_str(&b), "round {round}: took {b:?}");
                    refused_args += 1;
                }
            }
            // unclosed or wrongly closed
            assert!(!g.accepts_str(one.strip_suffix("</tool_call>").unwrap()));
            assert!(!g.accepts_str(&one.replace("</tool_call>", "</tool_cal>")));
            assert!(!g.accepts_str(&one.replace("</function>\n", "")));
        }
        assert!(refused_args > 100, "{refused_args}");
    }

    /// Qwen3-Coder's template (jinja2 as transformers sets it up: `trim_blocks`,
    /// `lstrip_blocks`, `tojson` as `json.dumps` with `ensure_ascii=False`) rendering an
    /// assistant message with content and two calls; Qwen 3.5's writes the same.
    const TEMPLATE_TEXT: &str = "Let me check.\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\nPa\"ris <x>\nline 2\n</parameter>\n<parameter=days>\n3\n</parameter>\n<parameter=t>\n1.5\n</parameter>\n<parameter=xs>\n[1, 2]\n</parameter>\n<parameter=o>\n{\"b\": \"<&'é>\", \"a\": [true, null]}\n</parameter>\n</function>\n</tool_call>\n<tool_call>\n<function=ping>\n</function>\n</tool_call>";
    /// The same message by Nemotron Nano 3's template.
    const NEMOTRON_TEXT: &str = "Let me check.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nPa\"ris <x>\nline 2\n</parameter>\n<parameter=days>\n3\n</parameter>\n<parameter=t>\n1.5\n</parameter>\n<parameter=xs>\n[1, 2]\n</parameter>\n<parameter=o>\n{\"b\": \"<&'é>\", \"a\": [true, null]}\n</parameter>\n</function>\n</tool_call>\n<tool_call>\n<function=ping>\n</function>\n</tool_call>\n";
    /// The same message by StepFun 3.5's template.
    const STEPFUN_TEXT: &str = "Let me check.<tool_call>\n<function=get_weather>\n<parameter=city>\nPa\"ris <x>\nline 2\n</parameter>\n<parameter=days>\n3\n</parameter>\n<parameter=t>\n1.5\n</parameter>\n<parameter=xs>\n[1, 2]\n</parameter>\n<parameter=o>\n{\"b\": \"<&'é>\", \"a\": [true, null]}\n</parameter>\n</function>\n</tool_call><tool_call>\n<function=ping>\n</function>\n</tool_call>";
    /// Qwen3-Coder's template with a boolean and a null argument (`| string`: Python's
    /// spellings).
    const TEMPLATE_TEXT_PYTHON: &str = "Let me check.\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\nRome\n</parameter>\n<parameter=ok>\nTrue\n</parameter>\n<parameter=n>\nNone\n</parameter>\n</function>\n</tool_call>\n<tool_call>\n<function=ping>\n</function>\n</tool_call>";

    fn weather_tools() -> Vec<Tool> {
        vec![
            tool(
                "get_weather",
                json!({"type": "object", "properties": {
                    "city": {"type": "string"}, "days": {"type": "integer"},
                    "t": {"type": "number"}, "ok": {"type": "boolean"}, "n": {"type": "null"},
                    "xs": {"type": "array", "items": {"type": "integer"}},
                    "o": {"type": "object"}}, "required": ["city"]}),
            ),
            tool("ping", json!({"type": "object", "properties": {}})),
        ]
    }

    #[test]
    fn qwen_xml_template_rendering_is_accepted_and_read_back() {
        let want_args = r#"{"city":"Pa\"ris <x>\nline 2","days":3,"t":1.5,"xs":[1,2],"o":{"b":"<&'é>","a":[true,null]}}"#;
        for text in [TEMPLATE_TEXT, NEMOTRON_TEXT, STEPFUN_TEXT] {
            let calls = &text[text.find("<tool_call>").unwrap()..];
            for choice in [ToolChoice::Auto, ToolChoice::Required] {
                let r = req(weather_tools(), choice, true);
                let g = grammar(&Format::QwenXml.plan(&r).unwrap().unwrap());
                assert!(g.accepts_str(calls), "{calls:?}");
                // no text before a forced call
                assert!(!g.accepts_str(text));
                let p = Format::QwenXml.parse(text, Some(&r));
                assert_eq!(p.content, "Let me check.");
                assert_eq!(
                    p.tool_calls,
                    vec![
                        ToolCall {
                            id: None,
                            name: "get_weather".into(),
                            arguments: want_args.into(),
                        },
                        ToolCall {
                            id: None,
                            name: "ping".into(),
                            arguments: "{}".into(),
                        }
                    ]
                );
            }
            // two calls where one is allowed
            let r = req(weather_tools(), ToolChoice::Auto, false);
            let g = grammar(&Format::QwenXml.plan(&r).unwrap().unwrap());
            assert!(!g.accepts_str(calls));
        }
        // Python's True and None: read back by the schema's types, but the grammar has the
        // model write JSON.
        let r = req(weather_tools(), ToolChoice::Auto, true);
        let g = grammar(&Format::QwenXml.plan(&r).unwrap().unwrap());
        let calls = &TEMPLATE_TEXT_PYTHON[TEMPLATE_TEXT_PYTHON.find("<tool_call>").unwrap()..];
        assert!(!g.accepts_str(calls));
        assert!(g.accepts_str(&calls.replace("True", "true").replace("None", "null")));
        let p = Format::QwenXml.parse(TEMPLATE_TEXT_PYTHON, Some(&r));
        assert_eq!(p.content, "Let me check.");
        assert_eq!(p.tool_calls.len(), 2);
        assert_eq!(
            p.tool_calls[0].arguments,
            r#"{"city":"Rome","ok":true,"n":null}"#
        );
    }

    #[test]
    fn qwen_xml_parse_cases() {
        let r = req(
            vec![
                tool(
                    "f",
                    json!({"type": "object", "properties": {
                        "s": {"type": "string"}, "b": {"type": "boolean"},
                        "sn": {"type": ["string", "null"]}, "i": {"type": "integer"},
                        "o": {"type": "object"}, "e": {"enum": ["1", 2, null]}}}),
                ),
                tool("g", json!({})),
            ],
            ToolChoice::Auto,
            true,
        );
        let block = |name: &str, params: &str| {
            format!("<tool_call>\n<function={name}>\n{params}</function>\n</tool_call>")
        };
        let param = |k: &str, v: &str| format!("<parameter={k}>\n{v}\n</parameter>\n");
        let cases: Vec<(String, &str, Vec<ToolCall>)> = vec![
            ("Hello".into(), "Hello", vec![]),
            ("Hello \n".into(), "Hello", vec![]),
            (
                format!("Hi\n{}", block("g", "")),
                "Hi",
                vec![call("g", "{}")],
            ),
            // values by type: Python's spellings where no string is admitted
            (
                block(
                    "f",
                    &(param("b", "True") + &param("sn", "None") + &param("i", "None")),
                ),
                "",
                vec![call("f", r#"{"b":true,"sn":"None","i":"None"}"#)],
            ),
            (
                block(
                    "f",
                    &(param("s", "12") + &param("sn", "null") + &param("i", "twelve")),
                ),
                "",
                vec![call("f", r#"{"s":"12","sn":null,"i":"twelve"}"#)],
            ),
            (
                block("f", &(param("s", "\"q\"") + &param("b", "false"))),
                "",
                vec![call("f", r#"{"s":"\"q\"","b":false}"#)],
            ),
            // an enum's member as written: a string raw, another value as its JSON
            (
                block("f", &(param("e", "1"))),
                "",
                vec![call("f", r#"{"e":"1"}"#)],
            ),
            (
                block("f", &(param("e", "2"))),
                "",
                vec![call("f", r#"{"e":2}"#)],
            ),
            (
                block("f", &(param("e", "null"))),
                "",
                vec![call("f", r#"{"e":null}"#)],
            ),
            // one newline taken off each end, no more
            (
                block("f", &param("s", "\n a \n")),
                "",
                vec![call("f", r#"{"s":"\n a \n"}"#)],
            ),
            // without the newlines, in another order, undeclared, other whitespace
            (
                "<tool_call><function=f> <parameter=i>5</parameter><parameter=s>x</parameter>\n\n<parameter=zz>[1]</parameter></function></tool_call>".into(),
                "",
                vec![call("f", r#"{"i":5,"s":"x","zz":[1]}"#)],
            ),
            // a closing tag inside a JSON string, and in raw text followed by no tag
            (
                block(
                    "f",
                    &(param("o", "{\"a\": \"</parameter>\"}")
                        + &param("s", "a</parameter> b")),
                ),
                "",
                vec![call("f", r#"{"o":{"a":"</parameter>"},"s":"a</parameter> b"}"#)],
            ),
            // ... even where the tag inside the string is followed by another parameter's
            (
                block(
                    "f",
                    &(param("o", "{\"a\": \"x</parameter><parameter=s>\"}") + &param("s", "y")),
                ),
                "",
                vec![call("f", r#"{"o":{"a":"x</parameter><parameter=s>"},"s":"y"}"#)],
            ),
            // an unclosed final block is read once its function is closed
            (
                "<tool_call>\n<function=g>\n</function>\n".into(),
                "",
                vec![call("g", "{}")],
            ),
            (
                "<tool_call>\n<function=g>\n<parameter=x>\n1\n</param".into(),
                "<tool_call>\n<function=g>\n<parameter=x>\n1\n</param",
                vec![],
            ),
            // a tool not offered, a malformed block: content; good blocks after them are read
            (
                format!("{}\n{}", block("h", ""), block("g", "")),
                "<tool_call>\n<function=h>\n</function>\n</tool_call>",
                vec![call("g", "{}")],
            ),
            (
                format!("<tool_call>oops</tool_call> {}", block("g", "")),
                "<tool_call>oops</tool_call>",
                vec![call("g", "{}")],
            ),
            (
                "<tool_call>\n<function=g>\nx</function>\n</tool_call>".into(),
                "<tool_call>\n<function=g>\nx</function>\n</tool_call>",
                vec![],
            ),
            (
                "<tool_call>\n<function=g\n>\n</function>\n</tool_call>".into(),
                "<tool_call>\n<function=g\n>\n</function>\n</tool_call>",
                vec![],
            ),
            (
                format!("{} trailing", block("g", "")),
                " trailing",
                vec![call("g", "{}")],
            ),
            (
                format!("{}x</tool_call>", block("g", "").replace("</tool_call>", "")),
                "<tool_call>\n<function=g>\n</function>\nx</tool_call>",
                vec![],
            ),
            // text between calls
            (
                format!("A {} B\n{}\n", block("g", ""), block("f", &param("i", "1"))),
                "A  B",
                vec![call("g", "{}"), call("f", r#"{"i":1}"#)],
            ),
        ];
        for (text, content, calls) in &cases {
            check_parsed(&Format::QwenXml.parse(text, Some(&r)), content, calls, text);
        }
        // no tools or tool_choice none: the text as is
        let t = format!("Hi {}\n", block("g", ""));
        check_verbatim(Format::QwenXml, &t, &r.tools);
        // partial
        for (t, c) in [
            ("Hi <tool", "Hi"),
            ("Hi <tool_call", "Hi"),
            ("Hi <tool_call>\n<function=g", "Hi"),
            ("Hi <toolbox", "Hi <toolbox"),
            ("a < b", "a < b"),
            ("a\n\n", "a"),
            ("", ""),
        ] {
            let p = Format::QwenXml.parse_partial(t, Some(&r));
            check_parsed(&p, c, &[], t);
        }
        // calls streamed as they are written: the name once whole, then each parameter once
        // its value is sure, a string's characters as they come
        let f = "Hi <tool_call>\n<function=f>\n";
        let i = format!("{f}<parameter=i>\n12");
        let s = format!("{i}\n</parameter>\n<parameter=s>\nPa\"ris\n");
        let o = format!("{f}<parameter=o>\n{{\"a\": \"x</parameter><parameter=s>");
        for (t, calls) in [
            ("Hi <tool_call>\n<function=g>".to_string(), vec![call("g", "{")]),
            (f.to_string(), vec![call("f", "{")]),
            // a number may go on; the closing tag may be the start of the value's text
            (i.clone(), vec![call("f", "{")]),
            (format!("{i}\n</parameter>\n"), vec![call("f", "{")]),
            (format!("{i}\n</parameter>\n<"), vec![call("f", "{")]),
            (
                format!("{i}\n</parameter>\n<parameter=s>"),
                vec![call("f", r#"{"i":12,"s":""#)],
            ),
            // the last newline may be the one before `</parameter>`
            (s.clone(), vec![call("f", r#"{"i":12,"s":"Pa\"ris"#)]),
            (format!("{s}x</para"), vec![call("f", r#"{"i":12,"s":"Pa\"ris\nx"#)]),
            (
                format!("{s}</parameter>\n</function>"),
                vec![call("f", r#"{"i":12,"s":"Pa\"ris"}"#)],
            ),
            (
                format!("{s}</parameter>\n</function>\n</tool_call>\n<tool_call><function=g>"),
                vec![call("f", r#"{"i":12,"s":"Pa\"ris"}"#), call("g", "{")],
            ),
            // a JSON value holding the closing tag waits for its end
            (o.clone(), vec![call("f", "{")]),
            (
                format!("{o}\"}}\n</parameter>\n</function>"),
                vec![call("f", r#"{"o":{"a":"x</parameter><parameter=s>"}}"#)],
            ),
            // a parameter given twice keeps its first value; the call goes on after it
            (
                format!("{f}<parameter=i>\n1\n</parameter>\n<parameter=i>\n2"),
                vec![call("f", r#"{"i":1"#)],
            ),
            (
                format!("{f}<parameter=i>\n1\n</parameter>\n<parameter=i>\n2\n</parameter>\n<parameter=s>\nab"),
                vec![call("f", r#"{"i":1,"s":"ab"#)],
            ),
            (
                format!("{f}<parameter=i>\n1\n</parameter>\n<parameter=i>\n2\n</parameter>\n</function>"),
                vec![call("f", r#"{"i":1}"#)],
            ),
            // a tool not offered is never begun
            ("Hi <tool_call>\n<function=h>\n".to_string(), vec![]),
        ] {
            let p = Format::QwenXml.parse_partial(&t, Some(&r));
            check_parsed(&p, "Hi", &calls, &t);
        }
        // ... and that call's finished reading keeps the first value and goes on from it
        let twice = format!(
            "{f}<parameter=i>\n1\n</parameter>\n<parameter=i>\n2\n</parameter>\n</function>\n</tool_call>"
        );
        assert_eq!(
            Format::QwenXml.parse(&twice, Some(&r)).tool_calls,
            [call("f", r#"{"i":1}"#)]
        );
        assert_eq!(
            Format::QwenXml.parse_final(&twice, Some(&r)).tool_calls,
            [call("f", r#"{"i":1}"#)]
        );
    }

    /// For every text built from the format's pieces and every prefix of it, what streaming
    /// sends is a prefix of what the finished text gives, and is never taken back.
    #[test]
    fn qwen_xml_partial_is_prefix_of_parse() {
        let r = req(
            vec![tool(
                "f",
                json!({"type": "object", "properties": {"x": {"type": "integer"},
                                                        "s": {"type": "string"}}}),
            )],
            ToolChoice::Auto,
            true,
        );
        let frags = [
            "a",
            "b c",
            " ",
            "\n",
            "<",
            "<tool",
            "<tool_call>",
            "</tool_call>",
            "<function=f>",
            "<function=g>",
            "</function>",
            "<parameter=x>",
            "\n1\n",
            "True",
            "</parameter>",
            "<tool_call>\n<function=f>\n<parameter=x>\n1\n</parameter>\n</function>\n</tool_call>",
            "é",
            "<parameter=s>",
            "\"",
            "{\"a\": \"",
            "\"}",
            "[1, 2",
            "12",
            "\nab\n",
        ];
        // well-formed blocks, to be cut into and mixed with the pieces
        let blocks = [
            "<tool_call>\n<function=f>\n<parameter=x>\n1\n</parameter>\n<parameter=s>\nab\n</parameter>\n</function>\n</tool_call>",
            "<tool_call>\n<function=f>\n<parameter=s>\n\"q</parameter>\n</parameter>\n</function>\n</tool_call>",
            "<tool_call>\n<function=f>\n<parameter=s>\n{\"a\": \"</parameter><parameter=x>\"}\n</parameter>\n</function>\n</tool_call>",
        ];
        let mut rng = Rng(23);
        let (mut checked, mut with_calls) = (0usize, 0usize);
        for round in 0..3000 {
            let mut t: String = (0..rng.below(8))
                .map(|_| frags[rng.below(frags.len())])
                .collect();
            if round % 2 == 1 {
                let b = blocks[rng.below(blocks.len())];
                let at = (0..rng.below(b.len()))
                    .rfind(|&i| b.is_char_boundary(i))
                    .unwrap_or(0);
                let at_t = (0..=rng.below(t.len() + 1).min(t.len()))
                    .rfind(|&i| t.is_char_boundary(i))
                    .unwrap_or(0);
                t = format!("{}{}{}{}", &b[..at], &t[..at_t], &b[at..], &t[at_t..]);
            }
            for req in [Some(&r), None] {
                let (full, n) = check_partial_prefixes(Format::QwenXml, &t, req);
                with_calls += !full.tool_calls.is_empty() as usize;
                checked += n;
            }
        }
        assert!(
            checked > 10_000 && with_calls > 200,
            "{checked} {with_calls}"
        );
    }

    #[test]
    fn qwen_xml_detect() {
        assert!(detect("<tool_call>\n<function=f>\n<parameter=k>\n"));
        assert!(!detect("<tool_call>\n<function=f>"));
        assert!(!detect("<function=f><parameter=k>"));
        // the variant without newlines between the tags
        assert!(!detect(
            "{{- '<tool_call><function=' ~ tool_call.name ~ '>' }}<parameter="
        ));
        let ours = [
            ("Qwen3-Coder.jinja", Format::QwenXml),
            ("Qwen3.5-4B.jinja", Format::QwenXml),
            ("NVIDIA-Nemotron-3-Nano-30B-A3B-BF16.jinja", Format::QwenXml),
            ("StepFun3.5-Flash.jinja", Format::QwenXml),
        ];
        if check_detect_all(|t| detect(t).then_some(Format::QwenXml), &ours).is_empty() {
            return;
        }
        // Qwen 3.5 thinks too: the caller splits `<think>` off before `parse`
        let q35 = template("Qwen3.5-4B.jinja").unwrap();
        assert_eq!(think::Tags::of_template(&q35), Some(think::THINK));
    }

    #[test]
    fn qwen_xml_plan_shapes_and_errors() {
        let ok = tool(
            "f",
            json!({"type": "object", "properties": {"a": {"type": "integer"}}}),
        );
        assert_eq!(
            plan(&req(vec![ok.clone()], ToolChoice::None, false)).unwrap(),
            None
        );
        assert_eq!(plan(&req(vec![], ToolChoice::Auto, false)).unwrap(), None);
        assert!(plan(&req(vec![], ToolChoice::Required, false)).is_err());
        let e = plan(&req(
            vec![ok.clone()],
            ToolChoice::Function("g".into()),
            false,
        ))
        .unwrap_err();
        assert!(e.contains("`g`"), "{e}");
        let auto = plan(&req(vec![ok.clone()], ToolChoice::Auto, true))
            .unwrap()
            .unwrap();
        assert!(auto.lazy);
        assert_eq!(auto.triggers, vec![LAZY_START.trigger()]);
        assert_eq!(Format::QwenXml.lazy_start(), Some(LAZY_START));
        assert!(Format::QwenXml.markup().contains(&"<tool_call>"));
        assert!(Format::QwenXml.markup().contains(&"</tool_call>"));
        // the value's framing newlines are the template's, exactly
        let g = grammar(&auto);
        let one =
            "<tool_call>\n<function=f>\n<parameter=a>\n1\n</parameter>\n</function>\n</tool_call>";
        assert!(g.accepts_str(one));
        assert!(!g.accepts_str(&one.replace("<parameter=a>\n", "<parameter=a>")));
        assert!(!g.accepts_str(&one.replace("\n</parameter>", "</parameter>")));
        assert!(!g.accepts_str(&one.replace("1\n", "1 \n")));
        // a raw string: any text without the closing tag; a string with lengths, no `<`
        let s = tool(
            "s",
            json!({"properties": {"t": {"type": "string"},
                                  "u": {"type": "string", "maxLength": 3}},
                   "required": ["t"]}),
        );
        let g = grammar(
            &plan(&req(vec![s], ToolChoice::Required, false))
                .unwrap()
                .unwrap(),
        );
        let call = |t: &str| {
            format!("<tool_call>\n<function=s>\n<parameter=t>\n{t}\n</parameter>\n</function>\n</tool_call>")
        };
        for (t, ok) in [
            ("", true),
            ("\n", true),
            ("a <b> </parameter", true),
            ("</parameter>", false),
            ("a\n</parameter>\nb", false),
        ] {
            assert_eq!(g.accepts_str(&call(t)), ok, "{t:?}");
        }
        let u = |v: &str| {
            call("x").replace(
                "</function>",
                &format!("<parameter=u>\n{v}\n</parameter>\n</function>"),
            )
        };
        assert!(g.accepts_str(&u("abc")));
        assert!(!g.accepts_str(&u("abcd")));
        assert!(!g.accepts_str(&u("a<")));
        // names a tag cannot carry
        let errs = [
            (tool("a>b", json!({})), "'>'"),
            (tool("a\nb", json!({})), "'\\n'"),
            (tool("", json!({})), "empty"),
            (
                tool("p", json!({"properties": {"k>": {"type": "string"}}})),
                "parameter name",
            ),
            (
                tool("p", json!({"properties": {"k\r": {"type": "string"}}})),
                "'\\r'",
            ),
            (
                tool(
                    "p",
                    json!({"properties": {"k": {"type": "string", "pattern": "a+"}}}),
                ),
                "Qwen XML",
            ),
            (tool("p", json!({"type": "string"})), "`type`"),
        ];
        for (t, needle) in errs {
            let e = plan(&req(vec![ok.clone(), t.clone()], ToolChoice::Auto, false)).unwrap_err();
            assert!(e.contains(needle), "{e}");
            if !t.name.is_empty() {
                assert!(e.contains(&format!("`{}`", t.name)), "{e}");
            }
        }
        // names with spaces, `<` and `=` are carried
        let odd = tool(
            "a<b=c d",
            json!({"properties": {"k l=<m": {"type": "integer"}}, "required": ["k l=<m"]}),
        );
        let r = req(vec![odd], ToolChoice::Required, false);
        let g = grammar(&plan(&r).unwrap().unwrap());
        let text = "<tool_call>\n<function=a<b=c d>\n<parameter=k l=<m>\n7\n</parameter>\n</function>\n</tool_call>";
        assert!(g.accepts_str(text));
        let p = parse(text, Some(&r));
        assert_eq!(p.tool_calls[0].name, "a<b=c d");
        assert_eq!(p.tool_calls[0].arguments, r#"{"k l=<m":7}"#);
    }

    /// Random calls whose parameters are given again (a new value, after the first): `parse`
    /// keeps each name's first value, streaming agrees with it at every prefix, and the
    /// parameters after a repeat stream on: at each call's `</function>` (its block not yet
    /// closed) the streamed arguments are the final ones.
    #[test]
    fn qwen_xml_streams_past_a_repeated_parameter() {
        let mut rng = Rng(0x5EED_0C0D);
        let mut repeats = 0;
        for round in 0..80 {
            let r = random_req(&mut rng, round, round % 2 == 0);
            let calls = random_calls(&mut rng, &r);
            let mut text = ["", "Sure.\n"][rng.below(2)].to_string();
            let mut want = Vec::new();
            for (t, a) in &calls {
                let first = ordered(&t.parameters, a);
                let mut params: Vec<(String, Value)> = first.clone().into_iter().collect();
                for _ in 0..rng.below(4) {
                    if params.is_empty() {
                        break;
                    }
                    let (k, _) = params[rng.below(params.len())].clone();
                    let at = params.iter().position(|(p, _)| *p == k).unwrap() + 1;
                    let at = at + rng.below(params.len() - at + 1);
                    let v = random_args(&mut rng, &t.parameters["properties"][&k]);
                    params.insert(at, (k, v));
                    repeats += 1;
                }
                text += &format!("<tool_call>\n<function={}>\n", t.name);
                for (k, v) in &params {
                    let v = render_value(v, rng.below(4));
                    text += &format!("<parameter={k}>\n{v}\n</parameter>\n");
                }
                text += "</function>\n</tool_call>\n";
                want.push((t, Value::Object(first)));
            }
            let parsed = Format::QwenXml.parse(&text, Some(&r));
            assert_eq!(parsed.tool_calls.len(), want.len(), "{text:?}");
            for (c, (t, a)) in parsed.tool_calls.iter().zip(&want) {
                assert_call(c, &t.name, a, None);
            }
            check_stream_calls(Format::QwenXml, &text, &r);
            let ends = text.match_indices("</function>").map(|(i, t)| i + t.len());
            for (i, end) in ends.enumerate() {
                let p = Format::QwenXml.parse_partial(&text[..end], Some(&r));
                assert_eq!(p.tool_calls[i], parsed.tool_calls[i], "{text:?}");
            }
        }
        assert!(repeats > 80, "{repeats}");
    }
}
