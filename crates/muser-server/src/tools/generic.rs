//! The generic format, for any chat template: the whole reply is one JSON object, described in
//! the system prompt and forced by the grammar from the first token.
//!
//! - `{"tool_call": {"name": N, "arguments": {...}}}` calls one tool (`{"tool_calls": [...]}`,
//!   at least one call, when parallel calls are allowed);
//! - `{"response": "..."}` answers (only when `tool_choice` is "auto").

use serde_json::{json, Map, Value};

use super::{
    allowed_tools, call_schema, calls_wanted, check_tools_convert, offered, placed_schema,
    read_call, verbatim, Parsed, Plan, Tool, ToolCall, ToolChoice, ToolRequest,
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
    let Ok(Value::Object(o)) = serde_json::from_str::<Value>(text.trim()) else {
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

/// Nothing of a reply that asks for calls is known before its JSON is complete; a reply
/// without tools is plain text.
pub(super) fn parse_partial(text: &str, req: Option<&ToolRequest>) -> Parsed {
    if calls_wanted(req) {
        Parsed::default()
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
            Parsed::default()
        );
    }

    /// Streaming sends nothing that the finished text would not start with.
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
            "a",
            " ",
            "{",
            "\n",
        ];
        let mut rng = Rng(7);
        for _ in 0..300 {
            let t: String = (0..rng.below(4))
                .map(|_| frags[rng.below(frags.len())])
                .collect();
            for req in [None, Some(&r)] {
                check_partial_prefixes(Format::Generic, &t, req);
            }
        }
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
