//! The Hermes format (Hermes 2 Pro / 3, Qwen 2.5 / 3): calls are JSON objects in
//! `<tool_call>` tags, `<tool_call>\n{"name": N, "arguments": {...}}\n</tool_call>`, after the
//! reply's text if any. The chat template shows the tools itself.

use std::collections::HashSet;

use serde_json::{json, Value};

use super::partial::{self, Json};
use super::{
    allowed_tools, begun_call, call_schema, check_tools_convert, fresh_rule, json_prefix,
    parse_blocks, parse_blocks_partial, read_call, rename_rule, rule_names, BlockStep, Blocks,
    LazyStart, Parsed, Plan, ToolCall, ToolRequest, WS_BODY,
};

const OPEN: &str = "<tool_call>";
const CLOSE: &str = "</tool_call>";

pub(super) const LAZY_START: LazyStart = LazyStart::Word(OPEN);

pub(super) fn plan(req: &ToolRequest) -> Result<Option<Plan>, String> {
    let Some(tools) = allowed_tools(req)? else {
        return Ok(None);
    };
    check_tools_convert(&tools)?;
    let calls: Vec<Value> = tools
        .iter()
        .enumerate()
        .map(|(i, t)| call_schema(t, &format!("#/anyOf/{i}")))
        .collect();
    let schema = json!({ "anyOf": calls });
    let json_gbnf = muser_jsonschema::schema_to_gbnf(&schema)
        .map_err(|e| format!("the tools cannot be made a grammar: {e}"))?;
    let mut taken: HashSet<String> = rule_names(&json_gbnf);
    let call = fresh_rule(&mut taken, "tool-call");
    let block = fresh_rule(&mut taken, "tool-call-block");
    let mut gbnf = String::new();
    if req.parallel {
        gbnf.push_str(&format!("root ::= {block} ( ws {block} )*\n"));
    } else {
        gbnf.push_str(&format!("root ::= {block}\n"));
    }
    // The block as the templates write it: a line break after the opening tag and before the
    // closing one (llama.cpp reads no call from `<tool_call>{`).
    gbnf.push_str(&format!(
        "{block} ::= \"{OPEN}\\n\" {call} \"\\n{CLOSE}\"\n"
    ));
    if !taken.contains("ws") {
        gbnf.push_str(&format!("ws ::= {WS_BODY}\n"));
    }
    gbnf.push_str(&rename_rule(&json_gbnf, "root", &call));
    Ok(Some(Plan::calls(gbnf, &req.choice, LAZY_START)))
}

/// The call block whose `<tool_call>` ends right before `rest`: the call and the length of
/// `rest` it spans (through `</tool_call>`, or to the end for an unclosed final block). None
/// when the block is malformed.
fn read_block(rest: &str) -> Option<(ToolCall, usize)> {
    let (v, end) = json_prefix(rest)?;
    end_block(rest, &v, end)
}

/// The call block of `read_block` whose JSON `v`, at the start of `rest`, ends at `end`.
fn end_block(rest: &str, v: &Value, end: usize) -> Option<(ToolCall, usize)> {
    let call = read_call(v)?;
    let tail = &rest[end..];
    let after_ws = tail.trim_start();
    let skipped = end + (tail.len() - after_ws.len());
    if after_ws.starts_with(CLOSE) {
        Some((call, skipped + CLOSE.len()))
    } else if after_ws.is_empty() {
        Some((call, rest.len()))
    } else {
        None
    }
}

/// Content is the text with the well-formed call blocks taken out, its trailing whitespace
/// trimmed; malformed blocks stay in it.
pub(super) fn parse(text: &str, req: Option<&ToolRequest>) -> Parsed {
    parse_blocks(text, req, &[OPEN], |after| {
        read_block(after).map(|(call, used)| (vec![call], used))
    })
}

/// How far streaming has read the call block whose `<tool_call>` ends right before `rest`.
fn read_block_partial(rest: &str, memo: &mut partial::Memo) -> BlockStep {
    let r = partial::read_on(rest, memo);
    let Some(call) = begun_call(&r.json, "arguments", Some(memo)) else {
        // no call yet; a whole object without a name is none (`parse` leaves it in the content)
        return if r.broken || matches!(r.json, Json::Whole(..)) {
            BlockStep::Broken(Vec::new())
        } else {
            BlockStep::Open(Vec::new())
        };
    };
    match r.json {
        Json::Whole(v, end) => {
            let after_ws = rest[end..].trim_start();
            if after_ws.starts_with(CLOSE) {
                match end_block(rest, &v, end) {
                    Some((call, used)) => BlockStep::Whole(vec![call], used),
                    None => BlockStep::Broken(vec![call]),
                }
            } else if CLOSE.starts_with(after_ws) {
                BlockStep::Open(vec![call])
            } else {
                BlockStep::Broken(vec![call])
            }
        }
        Json::Open(_) if r.broken => BlockStep::Broken(vec![call]),
        Json::Open(_) => BlockStep::Open(vec![call]),
    }
}

/// Content up to the first `<tool_call>`, less a tail that may be the start of one, and less
/// trailing whitespace (which `parse` trims when a call follows it); the calls begun.
pub(super) fn parse_partial(text: &str, req: Option<&ToolRequest>, from: &mut Blocks) -> Parsed {
    parse_blocks_partial(text, req, &[OPEN], read_block_partial, from)
}

#[cfg(test)]
mod tests {
    use super::super::test_util::*;
    use super::super::{Format, Tool, ToolChoice, Trigger};
    use super::*;
    use muser_sample::Grammar;

    fn block(call_json: &str) -> String {
        format!("<tool_call>\n{call_json}\n</tool_call>")
    }

    /// Random tools and calls: the grammar takes the rendered blocks (compact, pretty, and
    /// Qwen 2.5's template layout `{"name": "f", "arguments": {...}}`), `parse` gives the calls
    /// back; wrong names, missing arguments and wrong types are refused.
    #[test]
    fn hermes_grammar_accepts_calls_and_refuses_wrong_ones() {
        let mut rng = Rng(0x5EED_0002);
        for round in 0..60 {
            let parallel = round % 2 == 1;
            let r = random_req(&mut rng, round, parallel);
            let (p, g) = checked_plan(Format::Hermes, &r, Trigger::Word("<tool_call>".into()));
            let calls = random_calls(&mut rng, &r);
            for layout in 0..4 {
                let blocks: Vec<String> = calls
                    .iter()
                    .map(|(t, a)| {
                        let c = json!({"name": t.name, "arguments": a});
                        let l = layouts(&c);
                        block(&l[layout % l.len()])
                    })
                    .collect();
                let sep = ["\n", "", " ", "\n\n"][layout];
                let text = blocks.join(sep);
                assert!(
                    g.accepts_str(&text),
                    "round {round}: refused {text}\n{}",
                    p.gbnf
                );
                let parsed = Format::Hermes.parse(&text, Some(&r));
                assert_eq!(parsed.content, "");
                assert_eq!(parsed.reasoning, None);
                assert_eq!(parsed.tool_calls.len(), calls.len());
                for (c, (t, a)) in parsed.tool_calls.iter().zip(&calls) {
                    assert_call(c, &t.name, a, None);
                }
                check_text_around(Format::Hermes, &r, &g, &text, calls.len());
                check_stream_calls(Format::Hermes, &text, &r);
            }
            // no block, or a single block when parallel is off
            assert!(!g.accepts_str(""));
            assert!(!g.accepts_str("Hello"));
            let (t, a) = &calls[0];
            let render = |a: &Value| block(&json!({"name": t.name, "arguments": a}).to_string());
            let one = render(a);
            assert_eq!(g.accepts_str(&format!("{one}\n{one}")), parallel);
            // a tool that is not allowed
            assert!(!g.accepts_str(&block(r#"{"name": "no_such_tool", "arguments": {}}"#)));
            if let Some((o, a)) = other_tool(&mut rng, &r) {
                let b = block(&json!({"name": o.name, "arguments": a}).to_string());
                assert!(!g.accepts_str(&b), "other tool taken: {b}");
            }
            // missing required argument / wrong type
            check_broken_args(&mut rng, &g, t, a, render);
            // unclosed or wrongly closed
            assert!(!g.accepts_str(one.strip_suffix("</tool_call>").unwrap()));
            assert!(!g.accepts_str(&one.replace("</tool_call>", "</tool_cal>")));
        }
    }

    /// The exact text Qwen 2.5's template renders for a call in the history.
    #[test]
    fn hermes_grammar_accepts_qwen_template_rendering() {
        let tools = vec![
            Tool {
                name: "get_current_weather".into(),
                description: Some("Get the weather".into()),
                parameters: json!({
                    "type": "object",
                    "properties": {
                        "location": {"type": "string"},
                        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                        "days": {"type": "integer"},
                        "detail": {"type": "object", "properties": {"hourly": {"type": "boolean"}}, "required": ["hourly"]}
                    },
                    "required": ["location"]
                }),
            },
            tool("ping", json!({"type": "object", "properties": {}})),
        ];
        let text = "<tool_call>\n{\"name\": \"get_current_weather\", \"arguments\": {\"location\": \"San Francisco, CA\", \"unit\": \"celsius\", \"days\": 3, \"detail\": {\"hourly\": true}}}\n</tool_call>\n<tool_call>\n{\"name\": \"ping\", \"arguments\": {}}\n</tool_call>";
        for choice in [ToolChoice::Auto, ToolChoice::Required] {
            let r = req(tools.clone(), choice, true);
            let p = Format::Hermes.plan(&r).unwrap().unwrap();
            let g = Grammar::parse(&p.gbnf).unwrap();
            assert!(g.accepts_str(text), "{}", p.gbnf);
            let parsed = Format::Hermes.parse(text, Some(&r));
            assert_eq!(parsed.content, "");
            assert_eq!(
                parsed.tool_calls,
                vec![
                    ToolCall {
                        id: None,
                        name: "get_current_weather".into(),
                        arguments: r#"{"location":"San Francisco, CA","unit":"celsius","days":3,"detail":{"hourly":true}}"#.into(),
                    },
                    ToolCall {
                        id: None,
                        name: "ping".into(),
                        arguments: "{}".into(),
                    }
                ]
            );
        }
        // the same from the rendered template's own source layout, one call, no parallel
        let r = req(tools, ToolChoice::Auto, false);
        let g = Grammar::parse(&Format::Hermes.plan(&r).unwrap().unwrap().gbnf).unwrap();
        assert!(g.accepts_str("<tool_call>\n{\"name\": \"ping\", \"arguments\": {}}\n</tool_call>"));
        assert!(!g.accepts_str(text));
    }

    #[test]
    fn hermes_grammar_root_rename() {
        // a tool whose parameters recurse to their own root, and a const "root" string
        let t = tool(
            "tree",
            json!({"type": "object", "properties": {"label": {"const": "root"}, "kids": {"type": "array", "items": {"$ref": "#"}}}, "required": ["label"]}),
        );
        let r = req(vec![t], ToolChoice::Required, false);
        let p = Format::Hermes.plan(&r).unwrap().unwrap();
        assert!(
            p.gbnf.starts_with("root ::= tool-call-block\n"),
            "{}",
            p.gbnf
        );
        assert_eq!(p.gbnf.matches("\nroot ::=").count(), 0, "{}", p.gbnf);
        let g = Grammar::parse(&p.gbnf).unwrap();
        let ok = "<tool_call>\n{\"name\": \"tree\", \"arguments\": {\"label\": \"root\", \"kids\": [{\"label\": \"root\"}, {\"label\": \"root\", \"kids\": []}]}}\n</tool_call>";
        assert!(g.accepts_str(ok), "{}", p.gbnf);
        let bad = ok.replace(r#"{"label": "root"},"#, r#"{"label": "leaf"},"#);
        assert_ne!(bad, ok);
        assert!(!g.accepts_str(&bad));
    }

    #[test]
    fn hermes_parse_cases() {
        let r = f_req(true);
        let call = |args: &str| ToolCall {
            id: None,
            name: "f".into(),
            arguments: args.into(),
        };
        let cases: &[(&str, &str, Vec<ToolCall>)] = &[
            ("Hello", "Hello", vec![]),
            ("Hello \n", "Hello", vec![]),
            (
                "Hi\n<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": 1}}\n</tool_call>",
                "Hi",
                vec![call("{\"a\":1}")],
            ),
            // unclosed final block with valid JSON
            (
                "<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n",
                "",
                vec![call("{}")],
            ),
            // unclosed, JSON incomplete: content
            (
                "<tool_call>\n{\"name\": \"f\", \"argu",
                "<tool_call>\n{\"name\": \"f\", \"argu",
                vec![],
            ),
            // malformed blocks stay; good ones after them are read
            (
                "<tool_call>oops</tool_call>\n<tool_call>{\"name\": \"f\", \"arguments\": {}}</tool_call>",
                "<tool_call>oops</tool_call>",
                vec![call("{}")],
            ),
            (
                "<tool_call>{\"name\": \"f\", \"arguments\": \"{}\"}</tool_call>",
                "<tool_call>{\"name\": \"f\", \"arguments\": \"{}\"}</tool_call>",
                vec![],
            ),
            (
                "<tool_call>{\"name\": 1, \"arguments\": {}}</tool_call> x",
                "<tool_call>{\"name\": 1, \"arguments\": {}}</tool_call> x",
                vec![],
            ),
            // text after the JSON but before the closing tag: malformed
            (
                "<tool_call>{\"name\": \"f\", \"arguments\": {}} x</tool_call>",
                "<tool_call>{\"name\": \"f\", \"arguments\": {}} x</tool_call>",
                vec![],
            ),
            // the closing tag inside a string argument
            (
                "<tool_call>{\"name\": \"f\", \"arguments\": {\"s\": \"</tool_call>\"}}</tool_call>",
                "",
                vec![call("{\"s\":\"</tool_call>\"}")],
            ),
            // text between and after calls
            (
                "A <tool_call>{\"name\": \"f\", \"arguments\": {}}</tool_call> B\n<tool_call>{\"name\": \"g\", \"arguments\": {\"x\": [true]}}</tool_call>\n",
                "A  B",
                vec![
                    call("{}"),
                    ToolCall {
                        id: None,
                        name: "g".into(),
                        arguments: "{\"x\":[true]}".into(),
                    },
                ],
            ),
        ];
        for (text, content, calls) in cases {
            check_parsed(&Format::Hermes.parse(text, Some(&r)), content, calls, text);
        }
        // no tools or tool_choice none: the text as is
        let t = "Hi <tool_call>{\"name\": \"f\", \"arguments\": {}}</tool_call>\n";
        check_verbatim(Format::Hermes, t, &r.tools);
        // partial
        for (t, c) in [
            ("Hi <tool", "Hi"),
            ("Hi <", "Hi"),
            ("Hi <tool_call", "Hi"),
            ("Hi <tool_call>", "Hi"),
            ("Hi <tool_call>{\"na", "Hi"),
            ("Hi <toolbox", "Hi <toolbox"),
            ("a < b", "a < b"),
            ("a\n\n", "a"),
            ("", ""),
        ] {
            let p = Format::Hermes.parse_partial(t, Some(&r));
            check_parsed(&p, c, &[], t);
        }
        // calls streamed as they are written: the name once whole, the arguments so far
        let open = "Hi <tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": [1, \"P\\u00e9";
        for (t, calls) in [
            ("Hi <tool_call>\n{\"name\": \"f", vec![]),
            (
                "Hi <tool_call>\n{\"name\": \"f\"",
                vec![super::super::test_util::call("f", "")],
            ),
            (
                open,
                vec![super::super::test_util::call("f", "{\"a\":[1,\"Pé")],
            ),
            (
                &format!("{open}\"]}}}}\n</tool_call>\n<tool_call>{{\"name\": \"f\""),
                vec![
                    super::super::test_util::call("f", "{\"a\":[1,\"Pé\"]}"),
                    super::super::test_util::call("f", ""),
                ],
            ),
        ] {
            let p = Format::Hermes.parse_partial(t, Some(&r));
            check_parsed(&p, "Hi", &calls, t);
        }
        // cut inside a later call: the text between the calls stays content
        let t = "Intro <tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": \"1\"}}\n</tool_call>\nBetween\n<tool_call>\n{\"name\": \"g\", \"arguments\": {\"a\": \"x";
        let calls = [
            super::super::test_util::call("f", r#"{"a":"1"}"#),
            super::super::test_util::call("g", r#"{"a":"x"#),
        ];
        check_parsed(
            &Format::Hermes.parse_partial(t, Some(&r)),
            "Intro \nBetween",
            &calls,
            t,
        );
        check_parsed(
            &Format::Hermes.parse_final(t, Some(&r)),
            "Intro \nBetween",
            &calls,
            t,
        );
    }

    /// For every text built from the format's pieces and every prefix of it, what streaming
    /// sends (content and reasoning) is a prefix of what the finished text gives.
    #[test]
    fn hermes_partial_is_prefix_of_parse() {
        let r = f_req(true);
        let frags = [
            "a",
            "b c",
            " ",
            "\n",
            "<",
            "<tool",
            "<tool_call>",
            "</tool_call>",
            "{\"name\": \"f\", \"arguments\": {}}",
            "{\"name\": \"f\", \"arguments\": {\"s\": \"</tool_call>\"}}",
            "{\"name\": \"f\", \"arguments\": {\"a\": 1, \"b\": {\"c\": 2, \"c\": 3}, \"a\": 3}}",
            "{\"name\": \"f\"}",
            "{\"name\": \"f\", \"arguments\": [1]}",
            "{\"name\": \"f\", \"argu",
            "{",
            "}",
            "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": 1}}\n</tool_call>",
            "é",
        ];
        let mut rng = Rng(11);
        let mut checked = 0usize;
        for _ in 0..3000 {
            let t: String = (0..rng.below(7))
                .map(|_| frags[rng.below(frags.len())])
                .collect();
            for req in [Some(&r), None] {
                checked += check_partial_prefixes(Format::Hermes, &t, req).1;
            }
        }
        assert!(checked > 10_000);
    }
}
