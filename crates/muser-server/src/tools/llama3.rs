//! The Llama 3.x format (Llama 3.1, 3.2, 3.3): a call is the whole reply, the JSON object
//! `{"name": NAME, "parameters": {...}}`, which the model ends with `<|eom_id|>` or
//! `<|eot_id|>` (end tokens, where the engine stops). The chat template shows the tools itself.
//!
//! The templates take one call per assistant message, so a reply holds one call even when
//! `parallel_tool_calls` asks for more. Llama 3.1's built-in tools (`<|python_tag|>` code,
//! `brave_search`, `wolfram_alpha`) are not supported: only the JSON calls of the request's
//! functions are read.

use serde_json::Value;

use super::{
    allowed_tools, arguments_schema, calls_wanted, LazyStart, Parsed, Plan, ToolCall, ToolChoice,
    ToolRequest,
};

use muser_jsonschema::gbnf_literal as lit;

/// The JSON grammar's optional whitespace (muser-jsonschema's `ws`).
const WS_BODY: &str = r#"( " " | "\n" "\n"? [ \t]{0,20} )?"#;

/// A call opens the reply: `{`, the grammar's optional whitespace, then its first key (`"type"`
/// or `"name"`), so that the grammar takes the matched text from the `{` on.
pub(super) const LAZY_START: LazyStart =
    LazyStart::ReplyStart(r#"\{(?: |\n\n?[ \t]{0,20})?"(?:type|name)""#);

/// No markers: a call is plain JSON (the end tokens are the engine's).
pub(super) const MARKUP: &[&str] = &[];

/// The keys a call object may have.
const KEYS: &[&str] = &["type", "name", "parameters", "arguments"];

/// Llama 3.x's templates: the header tokens, the `ipython` role of tool results, and the
/// `"parameters"` of a rendered call (Hermes and Functionary templates on Llama 3 lack one of
/// them; a `<tool_call>` template is Hermes).
pub(super) fn detect(t: &str) -> bool {
    t.contains("<|start_header_id|>")
        && t.contains("ipython")
        && t.contains("\"parameters\"")
        && !t.contains("<tool_call>")
}

/// One call object: an optional `"type": "function"`, then `"name"` and `"parameters"` of an
/// allowed tool, in that order.
pub(super) fn plan(req: &ToolRequest) -> Result<Option<Plan>, String> {
    let Some(tools) = allowed_tools(req)? else {
        return Ok(None);
    };
    let mut alts = Vec::with_capacity(tools.len());
    let mut rules = String::new();
    for (i, t) in tools.iter().enumerate() {
        let (args, r) =
            muser_jsonschema::schema_to_gbnf_rules(&arguments_schema(t), &format!("tool{i}-"))
                .map_err(|e| {
                    format!(
                        "the parameters of tool `{}` cannot be made a grammar: {e}",
                        t.name
                    )
                })?;
        let name = Value::from(t.name.clone()).to_string();
        rules.push_str(&format!(
            "call-{i} ::= {} ws \":\" ws {} ws \",\" ws {} ws \":\" ws {args}\n",
            lit("\"name\""),
            lit(&name),
            lit("\"parameters\""),
        ));
        rules.push_str(r.trim_end());
        rules.push('\n');
        alts.push(format!("call-{i}"));
    }
    let gbnf = format!(
        "root ::= \"{{\" ws call-type? ( {} ) ws \"}}\"\n\
         call-type ::= {} ws \":\" ws {} ws \",\" ws\n\
         ws ::= {WS_BODY}\n{rules}",
        alts.join(" | "),
        lit("\"type\""),
        lit("\"function\""),
    );
    let lazy = req.choice == ToolChoice::Auto;
    Ok(Some(Plan {
        gbnf,
        lazy,
        triggers: if lazy {
            vec![LAZY_START.trigger()]
        } else {
            Vec::new()
        },
        system: None,
    }))
}

/// The call a whole reply is, if it is one: a JSON object with a string `name`, an object
/// `parameters` (or `arguments`), an optional `"type": "function"`, and no other key.
fn read_reply(text: &str) -> Option<ToolCall> {
    let t = text.trim();
    if !t.starts_with('{') {
        return None;
    }
    let v: Value = serde_json::from_str(t).ok()?;
    let o = v.as_object()?;
    if o.keys().any(|k| !KEYS.contains(&k.as_str())) {
        return None;
    }
    if o.get("type").is_some_and(|t| t != "function") {
        return None;
    }
    let name = o.get("name")?.as_str()?;
    let args = match (o.get("parameters"), o.get("arguments")) {
        (Some(a), None) | (None, Some(a)) if a.is_object() => a,
        _ => return None,
    };
    Some(ToolCall {
        id: None,
        name: name.to_string(),
        arguments: serde_json::to_string(args).ok()?,
    })
}

/// A reply that is one call object gives the call and no content; any other reply is content
/// (its trailing whitespace trimmed).
pub(super) fn parse(text: &str, req: Option<&ToolRequest>) -> Parsed {
    if !calls_wanted(req) {
        return Parsed {
            content: text.to_string(),
            ..Parsed::default()
        };
    }
    match read_reply(text) {
        Some(call) => Parsed {
            content: String::new(),
            reasoning: None,
            tool_calls: vec![call],
        },
        None => Parsed {
            content: text.trim_end().to_string(),
            ..Parsed::default()
        },
    }
}

/// Whether a reply that starts with `text` may still be a call: nothing but whitespace yet, or
/// `{` and a first key that is unfinished or one of a call's keys.
fn may_be_call(text: &str) -> bool {
    let t = text.trim_start();
    let Some(rest) = t.strip_prefix('{') else {
        return t.is_empty();
    };
    // JSON's whitespace, as serde_json reads it
    let rest = rest.trim_start_matches([' ', '\t', '\n', '\r']);
    let Some(key) = rest.strip_prefix('"') else {
        return rest.is_empty();
    };
    // the key's closing quote: the first one not escaped
    let mut escaped = false;
    let close = key.char_indices().find_map(|(i, c)| {
        let found = c == '"' && !escaped;
        escaped = c == '\\' && !escaped;
        found.then_some(i)
    });
    match close {
        None => true,
        Some(i) => {
            serde_json::from_str::<String>(&rest[..i + 2]).is_ok_and(|k| KEYS.contains(&k.as_str()))
        }
    }
}

/// Nothing while the reply may still be a call, else the reply so far less its trailing
/// whitespace.
pub(super) fn parse_partial(text: &str, req: Option<&ToolRequest>) -> Parsed {
    if !calls_wanted(req) {
        return Parsed {
            content: text.to_string(),
            ..Parsed::default()
        };
    }
    let content = if may_be_call(text) {
        String::new()
    } else {
        text.trim_end().to_string()
    };
    Parsed {
        content,
        ..Parsed::default()
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_util::*;
    use super::super::{Format, Tool, Trigger};
    use super::*;
    use muser_sample::Grammar;
    use serde_json::json;

    const TEMPLATES: &str =
        "../../target/llamacpp/llama_cpp_python-0.3.36/vendor/llama.cpp/models/templates";

    fn call_text(name: &str, args: &Value, layout: usize, typed: bool) -> String {
        let c = if typed {
            json!({"type": "function", "name": name, "parameters": args})
        } else {
            json!({"name": name, "parameters": args})
        };
        let l = layouts(&c);
        l[layout % l.len()].clone()
    }

    /// The text the trigger hands to the grammar: from the capture group's start (None when
    /// the trigger does not fire).
    fn triggered<'a>(p: &Plan, text: &'a str) -> Option<&'a str> {
        let [Trigger::Pattern(re)] = p.triggers.as_slice() else {
            panic!("{:?}", p.triggers);
        };
        let re = fancy_regex::Regex::new(re).unwrap();
        let c = re.captures(text).unwrap()?;
        Some(&text[c.get(1).unwrap().start()..])
    }

    /// Random tools and calls: the grammar takes the call object in several layouts (with and
    /// without `"type": "function"`), `parse` gives the call back; the lazy trigger fires at
    /// the reply's start and the grammar takes what it replays; wrong calls are refused.
    #[test]
    fn llama3_grammar_accepts_calls_and_refuses_wrong_ones() {
        let mut rng = Rng(0x11A3_0001);
        for round in 0..60 {
            let tools = random_tools(&mut rng);
            let parallel = round % 2 == 1;
            let choice = match round % 3 {
                0 => ToolChoice::Auto,
                1 => ToolChoice::Required,
                _ => ToolChoice::Function(tools[rng.below(tools.len())].name.clone()),
            };
            let r = req(tools.clone(), choice.clone(), parallel);
            let p = Format::Llama3.plan(&r).unwrap().unwrap();
            assert_eq!(p.system, None);
            assert_eq!(p.lazy, choice == ToolChoice::Auto);
            if p.lazy {
                assert_eq!(p.triggers, vec![LAZY_START.trigger()]);
            } else {
                assert!(p.triggers.is_empty());
            }
            let g = Grammar::parse(&p.gbnf).unwrap_or_else(|e| panic!("{e:?}\n{}", p.gbnf));
            let allowed: Vec<&Tool> = match &choice {
                ToolChoice::Function(n) => tools.iter().filter(|t| &t.name == n).collect(),
                _ => tools.iter().collect(),
            };
            let t = allowed[rng.below(allowed.len())];
            let a = random_args(&mut rng, &t.parameters);
            for layout in 0..4 {
                for typed in [false, true] {
                    let text = call_text(&t.name, &a, layout, typed);
                    assert!(
                        g.accepts_str(&text),
                        "round {round}: refused {text}\n{}",
                        p.gbnf
                    );
                    for reply in [text.clone(), format!("\n {text}\n")] {
                        let parsed = Format::Llama3.parse(&reply, Some(&r));
                        assert_eq!(parsed.content, "");
                        assert_eq!(parsed.reasoning, None);
                        assert_eq!(parsed.tool_calls.len(), 1);
                        let c = &parsed.tool_calls[0];
                        assert_eq!((c.name.as_str(), c.id.as_ref()), (t.name.as_str(), None));
                        let got: Value = serde_json::from_str(&c.arguments).unwrap();
                        assert_eq!(&got, &a);
                        assert_eq!(c.arguments, serde_json::to_string(&a).unwrap());
                    }
                    if p.lazy {
                        // the trigger fires at the reply's start, and the grammar takes the
                        // text from its `{` on
                        let reply = format!(" \n{text}");
                        assert_eq!(triggered(&p, &reply), Some(text.as_str()));
                        // text before the object: no trigger, and no call
                        let late = format!("Sure: {text}");
                        assert_eq!(triggered(&p, &late), None);
                        let parsed = Format::Llama3.parse(&late, Some(&r));
                        assert_eq!(parsed.content, late);
                        assert!(parsed.tool_calls.is_empty());
                    }
                    // nothing may follow the object, not even a second call
                    assert!(!g.accepts_str(&format!("{text}\nMore")));
                    assert!(!g.accepts_str(&format!("{text}\n{text}")));
                    assert!(!g.accepts_str(&format!("{text}{text}")));
                }
            }
            assert!(!g.accepts_str(""));
            assert!(!g.accepts_str("Hello"));
            let one = call_text(&t.name, &a, 1, false);
            // unclosed, `arguments` for `parameters`, another `type`, keys out of order
            assert!(!g.accepts_str(one.strip_suffix('}').unwrap()));
            assert!(!g.accepts_str(&one.replacen("\"parameters\"", "\"arguments\"", 1)));
            let typed = call_text(&t.name, &a, 1, true);
            assert!(!g.accepts_str(&typed.replacen("\"function\"", "\"tool\"", 1)));
            let swapped = format!(
                "{{\"parameters\":{},\"name\":{}}}",
                a,
                Value::from(t.name.clone())
            );
            assert!(!g.accepts_str(&swapped));
            assert_eq!(Format::Llama3.parse(&swapped, Some(&r)).tool_calls.len(), 1);
            // a tool that is not allowed
            assert!(!g.accepts_str(r#"{"name": "no_such_tool", "parameters": {}}"#));
            if let ToolChoice::Function(f) = &choice {
                if let Some(o) = tools.iter().find(|t| &t.name != f) {
                    let oa = random_args(&mut rng, &o.parameters);
                    let b = call_text(&o.name, &oa, 0, false);
                    assert!(!g.accepts_str(&b), "other tool taken: {b}");
                }
            }
            // arguments that break the schema
            for bad in broken_args(&mut rng, &t.parameters, &a) {
                let b = call_text(&t.name, &bad, 1, false);
                assert!(!g.accepts_str(&b), "round {round}: took {b}");
            }
        }
    }

    /// What Llama 3.1's template renders for a call in the history (rendered with jinja2 and
    /// transformers' `tojson`; Llama 3.2's and 3.3's render the same), ended by `<|eot_id|>`.
    const TEMPLATE_TEXT: &str = "{\"name\": \"get_weather\", \"parameters\": {\"unit\": \
        \"celsius\", \"city\": \"Pa\\\"ris <x> é\\n\", \"days\": 3, \"detail\": {\"hourly\": \
        true, \"tags\": [\"a\", \"b\"]}}}<|eot_id|>";

    fn weather() -> Tool {
        tool(
            "get_weather",
            json!({
                "type": "object",
                "properties": {
                    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                    "city": {"type": "string"},
                    "days": {"type": "integer"},
                    "detail": {
                        "type": "object",
                        "properties": {
                            "hourly": {"type": "boolean"},
                            "tags": {"type": "array", "items": {"type": "string"}}
                        }
                    }
                },
                "required": ["unit", "city"]
            }),
        )
    }

    #[test]
    fn llama3_template_rendering_is_accepted_and_read_back() {
        let tools = vec![weather(), tool("ping", json!({"type": "object"}))];
        let body = TEMPLATE_TEXT.strip_suffix("<|eot_id|>").unwrap();
        for choice in [
            ToolChoice::Auto,
            ToolChoice::Required,
            ToolChoice::Function("get_weather".into()),
        ] {
            let r = req(tools.clone(), choice.clone(), false);
            let p = Format::Llama3.plan(&r).unwrap().unwrap();
            let g = Grammar::parse(&p.gbnf).unwrap();
            assert!(g.accepts_str(body), "{}", p.gbnf);
            if p.lazy {
                assert_eq!(triggered(&p, body), Some(body));
            }
            let parsed = Format::Llama3.parse(body, Some(&r));
            assert_eq!(parsed.content, "");
            assert_eq!(
                parsed.tool_calls,
                vec![ToolCall {
                    id: None,
                    name: "get_weather".into(),
                    arguments: r#"{"unit":"celsius","city":"Pa\"ris <x> é\n","days":3,"detail":{"hourly":true,"tags":["a","b"]}}"#.into(),
                }]
            );
        }
        let r = req(tools, ToolChoice::Function("ping".into()), false);
        let g = Grammar::parse(&Format::Llama3.plan(&r).unwrap().unwrap().gbnf).unwrap();
        assert!(!g.accepts_str(body));
    }

    #[test]
    fn llama3_parse_cases() {
        let r = req(
            vec![tool("f", json!({"type": "object", "properties": {}}))],
            ToolChoice::Auto,
            false,
        );
        let call = |name: &str, args: &str| {
            vec![ToolCall {
                id: None,
                name: name.into(),
                arguments: args.into(),
            }]
        };
        let cases: Vec<(&str, &str, Vec<ToolCall>)> = vec![
            ("Hello", "Hello", vec![]),
            ("Hello \n", "Hello", vec![]),
            (
                r#"{"name": "f", "parameters": {"a": 1}}"#,
                "",
                call("f", r#"{"a":1}"#),
            ),
            (
                " \n{\"name\": \"f\", \"arguments\": {\"b\": [true]}}\n",
                "",
                call("f", r#"{"b":[true]}"#),
            ),
            (
                r#"{"type": "function", "name": "f", "parameters": {}}"#,
                "",
                call("f", "{}"),
            ),
            // any name is read (the grammar is what keeps to the tools)
            (
                r#"{"name": "other", "parameters": {"x": "y"}}"#,
                "",
                call("other", r#"{"x":"y"}"#),
            ),
            // escaped keys are keys
            (
                r#"{"\u006eame": "f", "parameters": {}}"#,
                "",
                call("f", "{}"),
            ),
            (
                r#"{"type": "tool", "name": "f", "parameters": {}}"#,
                r#"{"type": "tool", "name": "f", "parameters": {}}"#,
                vec![],
            ),
            (
                r#"{"name": "f", "parameters": {}, "id": 1}"#,
                r#"{"name": "f", "parameters": {}, "id": 1}"#,
                vec![],
            ),
            (
                r#"{"name": "f", "parameters": {}, "arguments": {}}"#,
                r#"{"name": "f", "parameters": {}, "arguments": {}}"#,
                vec![],
            ),
            (
                r#"{"name": "f", "parameters": "{}"}"#,
                r#"{"name": "f", "parameters": "{}"}"#,
                vec![],
            ),
            (r#"{"name": "f"}"#, r#"{"name": "f"}"#, vec![]),
            (
                r#"{"name": 1, "parameters": {}}"#,
                r#"{"name": 1, "parameters": {}}"#,
                vec![],
            ),
            (
                r#"{"name": "f", "parameters": {"#,
                r#"{"name": "f", "parameters": {"#,
                vec![],
            ),
            (
                "Sure: {\"name\": \"f\", \"parameters\": {}}",
                "Sure: {\"name\": \"f\", \"parameters\": {}}",
                vec![],
            ),
            (
                "{\"name\": \"f\", \"parameters\": {}} done\n",
                "{\"name\": \"f\", \"parameters\": {}} done",
                vec![],
            ),
            (
                r#"{"name": "f", "parameters": {}}{"name": "f", "parameters": {}}"#,
                r#"{"name": "f", "parameters": {}}{"name": "f", "parameters": {}}"#,
                vec![],
            ),
            (r#"{"a": 1}"#, r#"{"a": 1}"#, vec![]),
            ("", "", vec![]),
        ];
        for (text, content, calls) in &cases {
            let p = Format::Llama3.parse(text, Some(&r));
            assert_eq!(&p.content, content, "{text:?}");
            assert_eq!(&p.tool_calls, calls, "{text:?}");
            assert_eq!(p.reasoning, None);
        }
        // no tools or tool_choice none: the text as is
        let t = "{\"name\": \"f\", \"parameters\": {}}\n";
        assert_eq!(Format::Llama3.parse(t, None).content, t);
        assert_eq!(Format::Llama3.parse_partial(t, None).content, t);
        let none = req(r.tools.clone(), ToolChoice::None, false);
        let p = Format::Llama3.parse(t, Some(&none));
        assert_eq!((p.content.as_str(), p.tool_calls.len()), (t, 0));
        assert_eq!(Format::Llama3.plan(&none).unwrap(), None);
        // partial: held while the reply may be a call
        for (t, c) in [
            ("", ""),
            (" \n", ""),
            ("{", ""),
            ("\n{ ", ""),
            ("{\"", ""),
            ("{\"na", ""),
            ("{\"name\": \"f\", \"par", ""),
            ("{\"\\u006e", ""),
            ("{\"type\"", ""),
            ("{\"arguments\": {}", ""),
            ("{\"a\"", "{\"a\""),
            ("{\"a\": 1} ", "{\"a\": 1}"),
            ("{1", "{1"),
            ("{}", "{}"),
            ("Hi {\"name\"", "Hi {\"name\""),
            ("Hi\n\n", "Hi"),
        ] {
            let p = Format::Llama3.parse_partial(t, Some(&r));
            assert_eq!(p.content, c, "{t:?}");
            assert!(p.tool_calls.is_empty());
            assert_eq!(p.reasoning, None);
        }
    }

    /// For every text built from the format's pieces and every prefix of it, what streaming
    /// sends is a prefix of what the finished text gives, and is never taken back.
    #[test]
    fn llama3_partial_is_prefix_of_parse() {
        let r = req(
            vec![tool("f", json!({"type": "object", "properties": {}}))],
            ToolChoice::Auto,
            false,
        );
        let frags = [
            "a",
            " ",
            "\n",
            "{",
            "}",
            "\"",
            "\\",
            "\"name\"",
            "\"type\": \"function\", ",
            "\"parameters\"",
            "\"arguments\"",
            ": ",
            ", ",
            "\"f\"",
            "{}",
            "\"n\\u0061me\"",
            "{\"name\": \"f\", \"parameters\": {\"a\": 1}}",
            "é",
        ];
        let mut rng = Rng(0x11A3_0002);
        let (mut checked, mut calls) = (0usize, 0usize);
        for _ in 0..3000 {
            let mut t: String = (0..rng.below(8))
                .map(|_| frags[rng.below(frags.len())])
                .collect();
            if rng.below(4) == 0 {
                // a whole call, with whitespace around it
                let calls = [
                    "{\"name\": \"f\", \"parameters\": {\"a\": \"}\"}}",
                    "{ \"type\": \"function\", \"name\": \"f\", \"arguments\": {}}",
                    "{\"parameters\": {}, \"name\": \"g\"}",
                ];
                t = format!(
                    "{}{}{}",
                    [" ", "\n", ""][rng.below(3)],
                    calls[rng.below(calls.len())],
                    [" \n", "", "x"][rng.below(3)]
                );
            }
            for req in [Some(&r), None] {
                let full = Format::Llama3.parse(&t, req);
                calls += full.tool_calls.len();
                let mut sent = String::new();
                for p in prefixes(&t) {
                    let part = Format::Llama3.parse_partial(p, req);
                    assert!(part.content.starts_with(&sent), "{t:?} / {p:?}");
                    sent.clone_from(&part.content);
                    assert!(
                        full.content.starts_with(&part.content),
                        "text {t:?}, prefix {p:?}: {:?} is not a prefix of {:?}",
                        part.content,
                        full.content
                    );
                    assert!(part.tool_calls.is_empty());
                    assert_eq!(part.reasoning, None);
                    checked += 1;
                }
            }
        }
        assert!(checked > 10_000 && calls > 300, "{checked} {calls}");
    }

    #[test]
    fn llama3_plan_errors() {
        let bad = tool(
            "bad",
            json!({"type": "object", "properties": {"x": {"$ref": "#/$defs/missing"}}}),
        );
        let e = Format::Llama3
            .plan(&req(vec![bad], ToolChoice::Required, false))
            .unwrap_err();
        assert!(e.contains("`bad`"), "{e}");
        let f = tool("f", json!({"type": "object"}));
        let e = Format::Llama3
            .plan(&req(vec![f], ToolChoice::Function("g".into()), false))
            .unwrap_err();
        assert!(e.contains("`g`"), "{e}");
    }

    /// Of llama.cpp's templates, exactly Llama 3.1, 3.2 and 3.3 are this format.
    #[test]
    fn llama3_detects_the_llama_templates() {
        assert!(detect(
            "<|start_header_id|>ipython<|end_header_id|> {\"name\": \"' + n + '\", \"parameters\": "
        ));
        assert!(!detect(
            "<|start_header_id|>ipython \"parameters\" <tool_call>"
        ));
        assert!(!detect("<|start_header_id|>ipython"));
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(TEMPLATES);
        if !dir.exists() {
            return;
        }
        let want = [
            "meta-llama-Llama-3.1-8B-Instruct.jinja",
            "meta-llama-Llama-3.2-3B-Instruct.jinja",
            "meta-llama-Llama-3.3-70B-Instruct.jinja",
        ];
        let mut seen = 0;
        for e in std::fs::read_dir(&dir).unwrap() {
            let path = e.unwrap().path();
            let file = path.file_name().unwrap().to_str().unwrap().to_string();
            if !file.ends_with(".jinja") {
                continue;
            }
            let src = std::fs::read_to_string(&path).unwrap();
            let yes = want.contains(&file.as_str());
            assert_eq!(detect(&src), yes, "{file}");
            if yes {
                assert_eq!(Format::detect(Some(&src)), Format::Llama3, "{file}");
                seen += 1;
            }
        }
        assert_eq!(seen, want.len());
    }
}
