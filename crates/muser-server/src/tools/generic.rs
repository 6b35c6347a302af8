//! The generic format, for any chat template: the whole reply is one JSON object, described in
//! the system prompt and forced by the grammar from the first token.
//!
//! - `{"tool_call": {"name": N, "arguments": {...}}}` calls one tool (`{"tool_calls": [...]}`,
//!   at least one call, when parallel calls are allowed);
//! - `{"response": "..."}` answers (only when `tool_choice` is "auto").
//!
//! Streaming begins each call once its name is whole, its arguments growing as they are
//! written; the `response` is not streamed (it comes with the finished reply).

use serde_json::{json, Map, Value};

use super::partial::{self, Json, Open};
use super::{
    allowed_tools, begun_call, call_schema, calls_wanted, check_tools_convert, offered,
    placed_schema, read_call, verbatim, Parsed, Plan, Tool, ToolCall, ToolChoice, ToolRequest,
};

pub(super) fn plan(req: &ToolRequest) -> Result<Option<Plan>, String> {
    let Some(tools) = allowed_tools(req)? else {
        return Ok(None);
    };
    check_tools_convert(&tools)?;
    let schema = schema(req, &tools);
    let gbnf = muser_jsonschema::schema_to_gbnf(&schema)
        .map_err(|e| format!("the tools cannot be made a grammar: {e}"))?;
    Ok(Some(Plan {
        gbnf,
        lazy: false,
        triggers: Vec::new(),
        system: Some(system_prompt(req, &tools)),
    }))
}

/// The key of the call form: "tool_calls" (an array) when parallel calls are allowed.
fn call_key(req: &ToolRequest) -> &'static str {
    if req.parallel {
        "tool_calls"
    } else {
        "tool_call"
    }
}

/// The schema of the whole reply.
fn schema(req: &ToolRequest, tools: &[&Tool]) -> Value {
    let key = call_key(req);
    let calls_at = if req.parallel {
        format!("#/anyOf/0/properties/{key}/items/anyOf")
    } else {
        format!("#/anyOf/0/properties/{key}/anyOf")
    };
    let calls: Vec<Value> = tools
        .iter()
        .enumerate()
        .map(|(i, t)| call_schema(t, &format!("{calls_at}/{i}")))
        .collect();
    let call = if req.parallel {
        json!({"type": "array", "items": {"anyOf": calls}, "minItems": 1})
    } else {
        json!({"anyOf": calls})
    };
    let mut alts = vec![json!({
        "type": "object",
        "properties": {key: call},
        "required": [key],
    })];
    if req.choice == ToolChoice::Auto {
        let response = match &req.response {
            Some(r) => placed_schema(r.clone(), "#/anyOf/1/properties/response"),
            None => json!({"type": "string"}),
        };
        alts.push(json!({
            "type": "object",
            "properties": {"response": response},
            "required": ["response"],
        }));
    }
    json!({ "anyOf": alts })
}

/// The instruction added to the system prompt: the reply's JSON and the tools.
fn system_prompt(req: &ToolRequest, tools: &[&Tool]) -> String {
    let call_form = if req.parallel {
        r#"{"tool_calls": [{"name": "<tool name>", "arguments": {<arguments>}}, ...]}"#
    } else {
        r#"{"tool_call": {"name": "<tool name>", "arguments": {<arguments>}}}"#
    };
    let what = if req.parallel {
        "to call one or more tools"
    } else {
        "to call a tool"
    };
    let mut s = String::new();
    match &req.choice {
        ToolChoice::Auto => {
            s.push_str(
                "You can call tools. Your reply must be one JSON object and nothing else: \
                 either\n",
            );
            s.push_str(call_form);
            s.push_str(&format!("\n{what}, or\n"));
            match &req.response {
                None => {
                    s.push_str(r#"{"response": "<your answer>"}"#);
                    s.push_str("\nto answer directly.");
                }
                Some(r) => {
                    s.push_str(r#"{"response": <your answer>}"#);
                    s.push_str(&format!(
                        "\nto answer directly, your answer a JSON value of this schema: {r}"
                    ));
                }
            }
        }
        ToolChoice::Function(n) => {
            s.push_str(&format!(
                "You must call the tool `{n}`. Your reply must be one JSON object and nothing \
                 else:\n"
            ));
            s.push_str(call_form);
        }
        _ => {
            s.push_str(
                "You must call a tool. Your reply must be one JSON object and nothing else:\n",
            );
            s.push_str(call_form);
        }
    }
    s.push_str(
        "\n\nThe results of the calls are given to you in later messages.\n\nThe tools (name, \
         description and the JSON schema of the arguments):",
    );
    for t in tools {
        let mut o = Map::new();
        o.insert("name".into(), Value::from(t.name.clone()));
        if let Some(d) = &t.description {
            o.insert("description".into(), Value::from(d.clone()));
        }
        o.insert("parameters".into(), t.parameters.clone());
        s.push('\n');
        s.push_str(&Value::Object(o).to_string());
    }
    s
}

pub(super) fn parse(text: &str, req: Option<&ToolRequest>) -> Parsed {
    if calls_wanted(req) {
        let json_response = req.is_some_and(|r| r.response.is_some());
        if let Some(p) = read_reply(text, json_response)
            .filter(|p| p.tool_calls.iter().all(|c| offered(req, &c.name)))
        {
            return p;
        }
    }
    verbatim(text)
}

/// The reply's JSON read, if it is one of the format's objects; `response` is the content (its
/// JSON text when `json_response`, the answer being held by a response format).
fn read_reply(text: &str, json_response: bool) -> Option<Parsed> {
    let Some(Value::Object(o)) = partial::whole(text) else {
        return None;
    };
    if o.is_empty() {
        return None;
    }
    let mut out = Parsed::default();
    for (k, v) in &o {
        match k.as_str() {
            "response" if json_response => out.content = v.to_string(),
            "response" => out.content = v.as_str()?.to_string(),
            "tool_call" => out.tool_calls.push(read_call(v)?),
            "tool_calls" => {
                let calls = v
                    .as_array()?
                    .iter()
                    .map(read_call)
                    .collect::<Option<Vec<ToolCall>>>()?;
                if calls.is_empty() {
                    return None;
                }
                out.tool_calls.extend(calls);
            }
            _ => return None,
        }
    }
    Some(out)
}

/// The members of the JSON object a reply that starts with `text` begins, as far as they are
/// read (a repeated key keeps its first value); None when the reply is no object.
pub(super) fn reply_members(text: &str) -> Option<Vec<(String, Json)>> {
    let t = text.trim_start();
    if !t.starts_with('{') {
        return None;
    }
    match partial::read(t).json {
        Json::Whole(Value::Object(o), end) => Some(
            o.into_iter()
                .map(|(k, v)| (k, Json::Whole(v, end)))
                .collect(),
        ),
        Json::Open(Open::Obj(members)) => Some(members),
        _ => None,
    }
}

/// Adds the call that `v`, a call object so far (`tool_call`'s value or an item of
/// `tool_calls`), has begun to `calls`, unless its tool is not offered; whether `v` may still
/// be a call `parse` reads (an object, its `name` a string of an offered tool, its `arguments`
/// an object).
fn call_step(v: &Json, req: Option<&ToolRequest>, calls: &mut Vec<ToolCall>) -> bool {
    let fits = match v {
        Json::Open(Open::Pending) => return true,
        Json::Whole(o @ Value::Object(_), _) => read_call(o).is_some(),
        Json::Open(Open::Obj(_)) => {
            let name = v.get("name");
            let args = v.get("arguments");
            name.is_none_or(|n| {
                matches!(
                    n,
                    Json::Open(Open::Pending | Open::Str(_)) | Json::Whole(Value::String(_), _)
                )
            }) && args.is_none_or(|a| {
                matches!(
                    a,
                    Json::Open(Open::Pending | Open::Obj(_)) | Json::Whole(Value::Object(_), _)
                )
            })
        }
        _ => return false,
    };
    match begun_call(v, "arguments", None) {
        Some(c) if !offered(req, &c.name) => false,
        Some(c) => {
            calls.push(c);
            fits
        }
        None => fits,
    }
}

/// The calls a reply that starts with `text` has begun, in order (those of `tool_call` and of
/// `tool_calls`'s items, each once its `name` is a whole string), the last one's arguments as
/// far as they are known. The reading stops growing where the reply stops being one of the
/// format's objects (a key not the format's, a `response` that is not a string where it must
/// be, an item that is not a call `parse` reads, a call of a tool not offered), where its JSON
/// breaks, and after the object.
fn begun_calls(text: &str, req: Option<&ToolRequest>) -> Vec<ToolCall> {
    let json_response = req.is_some_and(|r| r.response.is_some());
    let mut calls = Vec::new();
    for (k, v) in reply_members(text).unwrap_or_default() {
        let fits = match k.as_str() {
            "response" => {
                json_response
                    || matches!(
                        v,
                        Json::Open(Open::Pending | Open::Str(_)) | Json::Whole(Value::String(_), _)
                    )
            }
            "tool_call" => call_step(&v, req, &mut calls),
            "tool_calls" => match v {
                Json::Open(Open::Pending) => true,
                Json::Open(Open::Arr(items)) => {
                    items.iter().all(|item| call_step(item, req, &mut calls))
                }
                Json::Whole(Value::Array(items), end) => {
                    !items.is_empty()
                        && items
                            .into_iter()
                            .all(|item| call_step(&Json::Whole(item, end), req, &mut calls))
                }
                _ => false,
            },
            _ => false,
        };
        if !fits {
            break;
        }
    }
    calls
}

/// A reply that asks for calls: no content before its JSON is complete, and the calls begun
/// (`begun_calls`); a reply without tools is plain text.
pub(super) fn parse_partial(text: &str, req: Option<&ToolRequest>) -> Parsed {
    if calls_wanted(req) {
        Parsed {
            tool_calls: begun_calls(text, req),
            ..Parsed::default()
        }
    } else {
        verbatim(text)
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_util::*;
    use super::super::{Format, ToolChoice, ToolRequest};
    use super::*;
    use muser_sample::Grammar;

    fn plan_of(r: &ToolRequest) -> (super::Plan, Grammar) {
        let p = Format::Generic.plan(r).unwrap().unwrap();
        assert!(!p.lazy && p.triggers.is_empty());
        let g = Grammar::parse(&p.gbnf).unwrap_or_else(|e| panic!("{e:?}\n{}", p.gbnf));
        (p, g)
    }

    fn call_text(name: &str, args: &Value) -> Value {
        json!({"name": name, "arguments": args})
    }

    /// Random tools and calls: the grammar takes the rendered calls (every layout) and `parse`
    /// gives them back; wrong names, missing arguments and wrong types are refused.
    #[test]
    fn generic_grammar_accepts_calls_and_refuses_wrong_ones() {
        let mut rng = Rng(0x5EED_0001);
        for round in 0..60 {
            let parallel = round % 2 == 1;
            let r = random_req(&mut rng, round, parallel);
            let choice = r.choice.clone();
            let (_, g) = plan_of(&r);
            let calls: Vec<(String, Value)> = random_calls(&mut rng, &r)
                .into_iter()
                .map(|(t, a)| (t.name.clone(), a))
                .collect();
            let reply = if parallel {
                json!({"tool_calls": calls.iter().map(|(n, a)| call_text(n, a)).collect::<Vec<_>>()})
            } else {
                json!({"tool_call": call_text(&calls[0].0, &calls[0].1)})
            };
            for text in layouts(&reply) {
                assert!(g.accepts_str(&text), "round {round}: refused {text}");
                let p = Format::Generic.parse(&text, Some(&r));
                assert_eq!(p.content, "");
                assert_eq!(p.reasoning, None);
                assert_eq!(p.tool_calls.len(), calls.len());
                for (c, (n, a)) in p.tool_calls.iter().zip(&calls) {
                    assert_call(c, n, a, None);
                }
                check_stream_calls(Format::Generic, &text, &r);
            }
            // a tool that is not allowed
            let wrong = json!({"tool_call": call_text("no_such_tool", &json!({}))});
            assert!(!g.accepts_str(&wrong.to_string()));
            let wrong = json!({"tool_calls": [call_text("no_such_tool", &json!({}))]});
            assert!(!g.accepts_str(&wrong.to_string()));
            let reply_of = |n: &str, a: &Value| {
                let c = call_text(n, a);
                if parallel {
                    json!({ "tool_calls": [c] }).to_string()
                } else {
                    json!({ "tool_call": c }).to_string()
                }
            };
            if let Some((o, a)) = other_tool(&mut rng, &r) {
                let w = reply_of(&o.name, &a);
                assert!(!g.accepts_str(&w), "other tool taken: {w}");
            }
            // the other form (single vs parallel) is refused
            let (n, a) = &calls[0];
            let other = if parallel {
                json!({"tool_call": call_text(n, a)})
            } else {
                json!({"tool_calls": [call_text(n, a)]})
            };
            assert!(!g.accepts_str(&other.to_string()));
            if parallel {
                assert!(!g.accepts_str(r#"{"tool_calls": []}"#));
            }
            // missing required argument / wrong type
            let t = allowed(&r).into_iter().find(|t| t.name == *n).unwrap();
            check_broken_args(&mut rng, &g, t, a, |bad| reply_of(n, bad));
            // a response only under auto
            let resp = r#"{"response": "Hello, \"world\"\n"}"#;
            assert_eq!(g.accepts_str(resp), choice == ToolChoice::Auto);
            if choice == ToolChoice::Auto {
                let p = Format::Generic.parse(resp, Some(&r));
                assert_eq!(p.content, "Hello, \"world\"\n");
                assert!(p.tool_calls.is_empty());
                check_stream_calls(Format::Generic, resp, &r);
            }
            assert!(!g.accepts_str("Hello"));
            assert!(!g.accepts_str(""));
        }
    }

    #[test]
    fn generic_plan_none_and_errors() {
        let tools = vec![tool("f", json!({"type": "object", "properties": {}}))];
        assert_eq!(
            Format::Generic
                .plan(&req(tools.clone(), ToolChoice::None, false))
                .unwrap(),
            None
        );
        let e = Format::Generic
            .plan(&req(tools.clone(), ToolChoice::Function("g".into()), false))
            .unwrap_err();
        assert!(e.contains("`g`"), "{e}");
        let bad = vec![
            tools[0].clone(),
            tool(
                "bad_tool",
                json!({"type": "object", "properties": {"x": {"type": "string", "format": "ipv6"}}}),
            ),
        ];
        let e = Format::Generic
            .plan(&req(bad, ToolChoice::Auto, false))
            .unwrap_err();
        assert!(e.contains("`bad_tool`") && e.contains("format"), "{e}");
    }

    /// Parameters with `$ref`s into their own `$defs` keep working inside the combined schema.
    #[test]
    fn generic_refs_into_parameters() {
        let params = json!({
            "type": "object",
            "$defs": {"unit": {"enum": ["c", "f"]}, "node": {"type": "object", "properties": {"next": {"anyOf": [{"$ref": "#/$defs/node"}, {"type": "null"}]}}, "required": ["next"]}},
            "properties": {"unit": {"$ref": "#/$defs/unit"}, "list": {"$ref": "#/$defs/node"}},
            "required": ["unit", "list"],
        });
        let tools = vec![
            tool(
                "other",
                json!({"type": "object", "properties": {"q": {"type": "string"}}}),
            ),
            tool("weather", params),
        ];
        for parallel in [false, true] {
            let r = req(tools.clone(), ToolChoice::Auto, parallel);
            let (_, g) = plan_of(&r);
            let call = r#"{"name": "weather", "arguments": {"unit": "c", "list": {"next": {"next": null}}}}"#;
            let text = if parallel {
                format!(r#"{{"tool_calls": [{call}]}}"#)
            } else {
                format!(r#"{{"tool_call": {call}}}"#)
            };
            assert!(g.accepts_str(&text), "{text}");
            assert!(!g.accepts_str(&text.replace("\"c\"", "\"k\"")));
        }
    }

    #[test]
    fn generic_parse_other_text_is_content() {
        let r = f_req(false);
        for t in [
            "Hello",
            "",
            "{\"tool_call\": {\"name\": \"f\"}}",
            "{\"tool_call\": {\"name\": \"f\", \"arguments\": []}}",
            "{\"tool_calls\": []}",
            "{\"response\": 3}",
            "{\"other\": 1}",
            "{\"response\": \"a\", \"x\": 1}",
            "[1]",
            "{\"response\": \"a\"",
        ] {
            let p = Format::Generic.parse(t, Some(&r));
            assert_eq!(p.content, t);
            assert!(p.tool_calls.is_empty());
        }
        let p = Format::Generic.parse(
            " \n{\"tool_call\": {\"name\": \"f\", \"arguments\": {\"b\": 1, \"a\": [1, 2]}}}\n",
            Some(&r),
        );
        assert_eq!(
            p.tool_calls,
            vec![ToolCall {
                id: None,
                name: "f".into(),
                arguments: r#"{"b":1,"a":[1,2]}"#.into()
            }]
        );
        // without tools (or with tool_choice none) the text is the content as is
        let t = "{\"tool_call\": {\"name\": \"f\", \"arguments\": {}}}";
        assert_eq!(Format::Generic.parse(t, None).content, t);
        let none = req(r.tools.clone(), ToolChoice::None, false);
        assert_eq!(Format::Generic.parse(t, Some(&none)).content, t);
        assert_eq!(Format::Generic.parse_partial(t, Some(&none)).content, t);
        assert_eq!(
            Format::Generic.parse_partial(t, Some(&r)),
            Parsed {
                tool_calls: vec![call("f", "{}")],
                ..Parsed::default()
            }
        );
    }

    /// The calls streamed as they are written: each once its name is whole, the arguments so
    /// far; nothing more once the reply can no longer be one of the format's objects.
    #[test]
    fn generic_partial_streams_calls() {
        let r = f_req(true);
        let mut json_r = f_req(true);
        json_r.response = Some(json!({"type": "object"}));
        for (t, calls) in [
            (r#"{"tool_calls": [{"name": "f"#, vec![]),
            (r#"{"tool_calls": [{"name": "f""#, vec![call("f", "")]),
            (
                r#"{"tool_call": {"name": "f", "arguments": {"a": [1, "P\u00e9"#,
                vec![call("f", r#"{"a":[1,"Pé"#)],
            ),
            (
                r#"{"tool_calls": [{"name": "f", "arguments": {"a": 1}}, {"arguments": {"b": 2}, "name": "g""#,
                vec![call("f", r#"{"a":1}"#), call("g", r#"{"b":2}"#)],
            ),
            (
                "\n{\"tool_calls\": [{\"name\": \"f\", \"arguments\": {}},\n{\"name\": \"g\", \"arguments\": {\"b\"",
                vec![call("f", "{}"), call("g", "{")],
            ),
            // a response, and keys of a call other than its name and arguments, are read over
            (
                r#"{"response": "hi", "tool_call": {"name": "f", "arguments": {}, "x": 1"#,
                vec![call("f", "{}")],
            ),
            // what rules the reply out: no call begun after it
            (r#"{"x": 1, "tool_call": {"name": "f""#, vec![]),
            (r#"{"response": 1, "tool_call": {"name": "f""#, vec![]),
            (r#"{"tool_calls": [], "tool_call": {"name": "f""#, vec![]),
            (r#"{"tool_calls": {"name": "f""#, vec![]),
            (r#"{"tool_call": [{"name": "f""#, vec![]),
            (
                r#"{"tool_calls": [{"name": "f", "arguments": {}}, 1, {"name": "g""#,
                vec![call("f", "{}")],
            ),
            (
                r#"{"tool_calls": [{"name": "no_such_tool", "arguments": {}}, {"name": "g""#,
                vec![],
            ),
            (
                r#"{"tool_calls": [{"name": "f", "arguments": []}, {"name": "g""#,
                vec![call("f", "")],
            ),
            (
                r#"{"tool_calls": [{"name": "f"}, {"name": "g""#,
                vec![call("f", "")],
            ),
            (
                r#"{"tool_calls": [{"name": 1, "arguments": {}}, {"name": "g""#,
                vec![],
            ),
            (
                r#"{"tool_call": {"name": "f", "arguments": {"a": 1}}} {"tool_call": {"name": "g""#,
                vec![call("f", r#"{"a":1}"#)],
            ),
            (
                r#"{"tool_calls": [{"name": "f", "arguments": {"a": 1, "a": 2}}, {"name": "g""#,
                vec![call("f", r#"{"a":1}"#), call("g", "")],
            ),
            (
                r#"{"tool_call": {"name": "f", "arguments": {}}, "tool_call": {"name": "g""#,
                vec![call("f", "{}")],
            ),
        ] {
            let p = Format::Generic.parse_partial(t, Some(&r));
            check_parsed(&p, "", &calls, t);
        }
        // a response format's answer may be any JSON value
        let t = r#"{"response": {"x": [1]}, "tool_call": {"name": "f""#;
        let p = Format::Generic.parse_partial(t, Some(&json_r));
        check_parsed(&p, "", &[call("f", "")], t);
        // begun, then proven no call: the finished reading is what was streamed
        for t in [
            r#"{"tool_calls": [{"name": "f", "arguments": {"a": 1}}, 1]}"#,
            r#"{"tool_calls": [{"name": "f", "arguments": {"a": 1}}, {"name": "zz", "arguments": {}}]}"#,
            r#"{"tool_call": {"name": "f", "arguments": {"a": 1}}} x"#,
            r#"{"tool_call": {"name": "f", "arguments": {"a": 1}}, "other": 2}"#,
        ] {
            let streamed = [call("f", r#"{"a":1}"#)];
            let part = Format::Generic.parse_partial(t, Some(&r));
            check_parsed(&part, "", &streamed, t);
            assert!(!Format::Generic.parse(t, Some(&r)).continues(&part), "{t}");
            check_parsed(&Format::Generic.parse_final(t, Some(&r)), "", &streamed, t);
        }
        // a repeated key keeps its first value, streamed and read alike
        let t = r#"{"tool_call": {"name": "f", "arguments": {"a": 1}}, "tool_call": {"name": "g", "arguments": {}}}"#;
        let streamed = [call("f", r#"{"a":1}"#)];
        check_parsed(
            &Format::Generic.parse_partial(t, Some(&r)),
            "",
            &streamed,
            t,
        );
        check_parsed(&Format::Generic.parse(t, Some(&r)), "", &streamed, t);
    }

    /// Streaming sends nothing that the finished text would not start with, and its calls are
    /// never taken back and go on into the finished reading.
    #[test]
    fn generic_partial_is_prefix_of_parse() {
        let r = req(
            vec![tool(
                "f",
                json!({"type": "object", "properties": {"a": {"type": "integer"}}}),
            )],
            ToolChoice::Auto,
            true,
        );
        let frags = [
            "{\"response\": \"hi\"}",
            "{\"tool_calls\": [{\"name\": \"f\", \"arguments\": {\"a\": 1}}]}",
            "{\"tool_call\": ",
            "{\"tool_calls\": [",
            "{\"name\": \"f\", \"arguments\": {\"a\": 1}}",
            "{\"name\": \"g\", \"arguments\": {}}",
            "{\"a\": 1, \"a\": 2}",
            "\"arguments\": ",
            ", ",
            "]",
            "}",
            "a",
            " ",
            "{",
            "\n",
        ];
        let mut rng = Rng(7);
        let (mut checked, mut calls) = (0usize, 0usize);
        for _ in 0..2000 {
            let t: String = (0..rng.below(6))
                .map(|_| frags[rng.below(frags.len())])
                .collect();
            for req in [None, Some(&r)] {
                checked += check_partial_prefixes(Format::Generic, &t, req).1;
                calls += Format::Generic.parse_final(&t, req).tool_calls.len();
            }
        }
        assert!(checked > 20_000 && calls > 100, "{checked} {calls}");
    }

    /// Replies of random members and call items, right and wrong (keys not the format's,
    /// items not calls, tools not offered, repeated keys), closed or not, with text after them
    /// or not: for every prefix, the calls streamed never shrink and the finished reading goes
    /// on from them; where no key repeats and `parse` reads calls, streaming has begun those
    /// very calls by the end.
    #[test]
    fn generic_partial_calls_of_random_members() {
        let r = f_req(true);
        let items = [
            r#"{"name": "f", "arguments": {"a": [1, "x\"}]"], "b": {"c": null}}}"#,
            r#"{"arguments": {"d": -2.5e3}, "name": "g"}"#,
            r#"{"name": "h", "arguments": {}, "id": "x"}"#,
            r#"{"name": "no_such_tool", "arguments": {}}"#,
            r#"{"name": "f", "arguments": "{}"}"#,
            r#"{"name": "f"}"#,
            r#"{"name": 1, "arguments": {}}"#,
            r#"[]"#,
            r#"{"name": "g", "arguments": {"a": 1, "a": 2}}"#,
        ];
        let mut rng = Rng(0x5EED_0003);
        let (mut read, mut kept) = (0usize, 0usize);
        for round in 0..4000 {
            // mostly good items; a repeated key only in odd rounds
            let repeats = round % 2 == 1;
            let item = |rng: &mut Rng| {
                let n = if repeats {
                    items.len()
                } else {
                    items.len() - 1
                };
                items[if rng.below(2) == 0 {
                    rng.below(3)
                } else {
                    rng.below(n)
                }]
            };
            let mut members: Vec<String> = Vec::new();
            for _ in 0..1 + rng.below(if repeats { 3 } else { 1 }) {
                members.push(match rng.below(8) {
                    0 => r#""response": "hi""#.to_string(),
                    1 => r#""response": 1"#.to_string(),
                    2 => r#""other": 1"#.to_string(),
                    3 | 4 => format!(r#""tool_call": {}"#, item(&mut rng)),
                    _ => {
                        let calls: Vec<&str> = (0..rng.below(4)).map(|_| item(&mut rng)).collect();
                        format!(r#""tool_calls": [{}]"#, calls.join(", "))
                    }
                });
            }
            let t = format!(
                "{}{{{}{}",
                ["", " ", "\n"][rng.below(3)],
                members.join([", ", ",\n  ", ","][rng.below(3)]),
                ["}", "}\n", "", "} x", "}}"][rng.below(5)]
            );
            let (full, _) = check_partial_prefixes(Format::Generic, &t, Some(&r));
            let end = Format::Generic.parse_partial(&t, Some(&r));
            // never a call of a tool not offered
            assert!(
                end.tool_calls.iter().all(|c| offered(Some(&r), &c.name)),
                "{t}"
            );
            if !repeats && !full.tool_calls.is_empty() {
                read += 1;
                assert_eq!(end.tool_calls, full.tool_calls, "{t}");
            } else if !full.continues(&end) {
                // begun, then proven no (such) call: the finished reading keeps them
                kept += 1;
                let fin = Format::Generic.parse_final(&t, Some(&r));
                assert_eq!(fin.tool_calls, end.tool_calls, "{t}");
            }
        }
        assert!(read > 200 && kept > 200, "{read} {kept}");
    }

    #[test]
    fn generic_system_prompt() {
        let tools = vec![
            Tool {
                name: "get_weather".into(),
                description: Some("The weather in a city".into()),
                parameters: json!({"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}),
            },
            tool("noop", json!({"type": "object", "properties": {}})),
        ];
        let p = Format::Generic
            .plan(&req(tools.clone(), ToolChoice::Auto, false))
            .unwrap()
            .unwrap();
        let s = p.system.unwrap();
        assert!(s.contains(r#"{"tool_call": {"name": "<tool name>""#), "{s}");
        assert!(s.contains(r#"{"response": "<your answer>"}"#), "{s}");
        assert!(s.contains(
            r#"{"name":"get_weather","description":"The weather in a city","parameters":{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}}"#
        ));
        assert!(s.contains(r#"{"name":"noop","parameters":"#));
        let p = Format::Generic
            .plan(&req(tools.clone(), ToolChoice::Required, true))
            .unwrap()
            .unwrap();
        let s = p.system.unwrap();
        assert!(s.starts_with("You must call a tool."), "{s}");
        assert!(s.contains(r#"{"tool_calls": ["#) && !s.contains("response"));
        let p = Format::Generic
            .plan(&req(tools, ToolChoice::Function("noop".into()), false))
            .unwrap()
            .unwrap();
        let s = p.system.unwrap();
        assert!(s.starts_with("You must call the tool `noop`."), "{s}");
        assert!(!s.contains("get_weather"));
    }
}
