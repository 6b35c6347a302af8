//! The Llama 3.x format (Llama 3.1, 3.2, 3.3): a call is the whole reply, the JSON object
//! `{"name": NAME, "parameters": {...}}`, which the model ends with `<|eom_id|>` or
//! `<|eot_id|>` (end tokens, where the engine stops). The chat template shows the tools itself.
//!
//! The templates take one call per assistant message, so a reply holds one call even when
//! `parallel_tool_calls` asks for more. Llama 3.1's built-in tools (`<|python_tag|>` code,
//! `brave_search`, `wolfram_alpha`) are not supported: only the JSON calls of the request's
//! functions are read.
//!
//! Streaming begins the call once the reply is an object whose `name` is whole and whose keys
//! so far are a call's; its arguments grow as they are written.

use serde_json::Value;

use super::generic::reply_members;
use super::partial::{self, Json, Open};
use super::{
    allowed_tools, arguments_schema, begun_call, call_of, calls_wanted, offered, tool_rules,
    verbatim, LazyStart, Parsed, Plan, ToolCall, ToolRequest, WS_BODY,
};

use muser_jsonschema::gbnf_literal as lit;

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
        let (args, r) = tool_rules(t, &arguments_schema(t), &format!("tool{i}-"))?;
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
    Ok(Some(Plan::calls(gbnf, &req.choice, LAZY_START)))
}

/// The call a whole reply is, if it is one: a JSON object with a string `name`, an object
/// `parameters` (or `arguments`), an optional `"type": "function"`, and no other key.
fn read_reply(text: &str) -> Option<ToolCall> {
    let t = text.trim();
    if !t.starts_with('{') {
        return None;
    }
    let v = partial::whole(t)?;
    let o = v.as_object()?;
    if o.keys().any(|k| !KEYS.contains(&k.as_str())) {
        return None;
    }
    if o.get("type").is_some_and(|t| t != "function") {
        return None;
    }
    let name = o.get("name")?.as_str()?;
    match (o.get("parameters"), o.get("arguments")) {
        (Some(a), None) | (None, Some(a)) => call_of(name, a),
        _ => None,
    }
}

/// A reply that is one call object gives the call and no content; any other reply is content
/// (its trailing whitespace trimmed).
pub(super) fn parse(text: &str, req: Option<&ToolRequest>) -> Parsed {
    if !calls_wanted(req) {
        return verbatim(text);
    }
    match read_reply(text).filter(|c| offered(req, &c.name)) {
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

/// Whether a member of a call object, its key whole and its value so far `v`, may still be one
/// `read_reply` takes, after the members `before`: a key of a call's, not a second of
/// `parameters` and `arguments`, `type` a string that may be "function", `name` a string, the
/// arguments an object.
fn member_fits(key: &str, v: &Json, before: &[(String, Json)]) -> bool {
    let pending = matches!(v, Json::Open(Open::Pending));
    match key {
        "type" => match v {
            Json::Whole(Value::String(t), _) => t == "function",
            Json::Open(Open::Str(t)) => "function".starts_with(t.as_str()),
            _ => pending,
        },
        "name" => {
            pending
                || matches!(
                    v,
                    Json::Whole(Value::String(_), _) | Json::Open(Open::Str(_))
                )
        }
        "parameters" | "arguments" => {
            !before
                .iter()
                .any(|(k, _)| k == "parameters" || k == "arguments")
                && (pending
                    || matches!(
                        v,
                        Json::Whole(Value::Object(_), _) | Json::Open(Open::Obj(_))
                    ))
        }
        _ => false,
    }
}

/// The call a reply that starts with `text` has begun: once it is a JSON object whose `name`
/// is a whole string and whose members so far may all be a call's (`member_fits`), the call
/// with its arguments as far as they are known. The reading stops growing where the reply
/// stops being a call: at a member that does not fit, where the JSON breaks
/// (`reply_members`), and after the object (`parse` takes no text after it).
fn begun(text: &str) -> Option<ToolCall> {
    let members = reply_members(text)?;
    let mut fit: Vec<(String, Json)> = Vec::with_capacity(members.len());
    for (k, v) in members {
        if !member_fits(&k, &v, &fit) {
            break;
        }
        fit.push((k, v));
    }
    let args_key = if fit.iter().any(|(k, _)| k == "arguments") {
        "arguments"
    } else {
        "parameters"
    };
    begun_call(&Json::Open(Open::Obj(fit)), args_key)
}

/// Nothing while the reply may still be a call, else the reply so far less its trailing
/// whitespace; the call once begun (`begun`), if its tool is offered.
pub(super) fn parse_partial(text: &str, req: Option<&ToolRequest>) -> Parsed {
    if !calls_wanted(req) {
        return verbatim(text);
    }
    let content = if may_be_call(text) {
        String::new()
    } else {
        text.trim_end().to_string()
    };
    Parsed {
        content,
        reasoning: None,
        tool_calls: begun(text)
            .filter(|c| offered(req, &c.name))
            .into_iter()
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_util::*;
    use super::super::{Format, ToolChoice, Trigger};
    use super::*;
    use muser_sample::Grammar;
    use serde_json::json;

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
            let r = random_req(&mut rng, round, round % 2 == 1);
            let (p, g) = checked_plan(Format::Llama3, &r, LAZY_START.trigger());
            let allowed = allowed(&r);
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
                        assert_call(&parsed.tool_calls[0], &t.name, &a, None);
                        check_stream_calls(Format::Llama3, &reply, &r);
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
            if let Some((o, oa)) = other_tool(&mut rng, &r) {
                let b = call_text(&o.name, &oa, 0, false);
                assert!(!g.accepts_str(&b), "other tool taken: {b}");
            }
            // arguments that break the schema
            check_broken_args(&mut rng, &g, t, &a, |bad| call_text(&t.name, bad, 1, false));
        }
    }

    /// What Llama 3.1's template renders for a call in the history (rendered with jinja2 and
    /// transformers' `tojson`; Llama 3.2's and 3.3's render the same), ended by `<|eot_id|>`.
    const TEMPLATE_TEXT: &str = "{\"name\": \"get_weather\", \"parameters\": {\"unit\": \
        \"celsius\", \"city\": \"Pa\\\"ris <x> é\\n\", \"days\": 3, \"detail\": {\"hourly\": \
        true, \"tags\": [\"a\", \"b\"]}}}<|eot_id|>";

    #[test]
    fn llama3_template_rendering_is_accepted_and_read_back() {
        let tools = weather_tools();
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
                    arguments: WEATHER_ARGS.into(),
                }]
            );
        }
        let r = req(tools, ToolChoice::Function("ping".into()), false);
        let g = Grammar::parse(&Format::Llama3.plan(&r).unwrap().unwrap().gbnf).unwrap();
        assert!(!g.accepts_str(body));
    }

    #[test]
    fn llama3_parse_cases() {
        let r = f_req(false);
        let call = |name: &str, args: &str| vec![call(name, args)];
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
            check_parsed(&Format::Llama3.parse(text, Some(&r)), content, calls, text);
        }
        // no tools or tool_choice none: the text as is
        let t = "{\"name\": \"f\", \"parameters\": {}}\n";
        check_verbatim(Format::Llama3, t, &r.tools);
        // partial: held while the reply may be a call
        for (t, c) in [
            ("", ""),
            (" \n", ""),
            ("{", ""),
            ("\n{ ", ""),
            ("{\"", ""),
            ("{\"na", ""),
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
            check_parsed(&p, c, &[], t);
        }
        // the call streamed as it is written: begun once its name is whole, the arguments so
        // far
        let open = r#"{"type": "function", "name": "f", "parameters": {"a": [1, "P\u00e9"#;
        for (t, calls) in [
            (r#"{"name": "f"#, vec![]),
            (r#"{"name": "f""#, call("f", "")),
            (r#"{"name": "f", "par"#, call("f", "")),
            (
                r#"{"name": "f", "parameters": {"a": 1"#,
                call("f", r#"{"a":"#),
            ),
            (open, call("f", r#"{"a":[1,"Pé"#)),
            (
                "\n{\"arguments\": {\"a\": 1}, \"name\": \"f\"",
                call("f", r#"{"a":1}"#),
            ),
            // what rules the call out before its name is whole: no call is begun
            (r#"{"type": "tool", "name": "f""#, vec![]),
            (r#"{"type": "fun", "name": "f""#, vec![]),
            (r#"{"id": 1, "name": "f""#, vec![]),
            (r#"{"parameters": [], "name": "f""#, vec![]),
            (r#"{"arguments": {}, "parameters": {}, "name": "f""#, vec![]),
            (r#"{"name": 1, "parameters": {}}"#, vec![]),
            // a tool not offered
            (r#"{"name": "no_such_tool", "parameters": {}}"#, vec![]),
        ] {
            let p = Format::Llama3.parse_partial(t, Some(&r));
            assert_eq!(p.tool_calls, calls, "{t}");
        }
        // a repeated key keeps its first value, streamed and read alike
        for t in [
            r#"{"name": "f", "parameters": {"a": 1}, "name": "g"}"#,
            r#"{"name": "f", "parameters": {"a": 1}, "parameters": {}}"#,
        ] {
            let streamed = call("f", r#"{"a":1}"#);
            check_parsed(&Format::Llama3.parse_partial(t, Some(&r)), "", &streamed, t);
            check_parsed(&Format::Llama3.parse(t, Some(&r)), "", &streamed, t);
        }
        // proven no call (or another) after it was begun: the call stops growing where the
        // proof starts, and the finished reading is what was streamed (`parse` reads content)
        for t in [
            r#"{"name": "f", "parameters": {"a": 1}} done"#,
            r#"{"name": "f", "parameters": {"a": 1}}{"name": "f", "parameters": {}}"#,
            r#"{"name": "f", "parameters": {"a": 1}, "id": {"b": 2}}"#,
            r#"{"name": "f", "parameters": {"a": 1}, "arguments": {"b": 2}}"#,
            r#"{"name": "f", "parameters": {"a": 1}, "type": "tool"}"#,
            r#"{"name": "f", "parameters": {"a": 1} x"#,
        ] {
            let streamed = call("f", r#"{"a":1}"#);
            let part = Format::Llama3.parse_partial(t, Some(&r));
            check_parsed(&part, "", &streamed, t);
            assert!(!Format::Llama3.parse(t, Some(&r)).continues(&part), "{t}");
            check_parsed(&Format::Llama3.parse_final(t, Some(&r)), "", &streamed, t);
        }
        // a repeated key in the arguments keeps its first value: the repeat adds nothing to
        // what is streamed, and the call ends as streamed
        let t = r#"{"name": "f", "parameters": {"a": 1, "b": 2, "a": 3}}"#;
        let full = Format::Llama3.parse(t, Some(&r));
        assert_eq!(full.tool_calls, call("f", r#"{"a":1,"b":2}"#));
        for p in prefixes(t).skip_while(|p| !p.ends_with("2, ")) {
            let part = Format::Llama3.parse_partial(p, Some(&r));
            let args = if p.len() < t.len() - 1 {
                r#"{"a":1,"b":2"#
            } else {
                r#"{"a":1,"b":2}"#
            };
            check_parsed(&part, "", &call("f", args), p);
        }
    }

    /// For every text built from the format's pieces and every prefix of it, what streaming
    /// sends is a prefix of what the finished text gives, and is never taken back.
    #[test]
    fn llama3_partial_is_prefix_of_parse() {
        let r = f_req(false);
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
                let (full, n) = check_partial_prefixes(Format::Llama3, &t, req);
                calls += full.tool_calls.len();
                checked += n;
            }
        }
        assert!(checked > 10_000 && calls > 300, "{checked} {calls}");
    }

    /// Objects of random members, a call's and others (wrong types, keys not a call's, tools
    /// not offered, repeated keys), closed or not, with text after them or not: for every
    /// prefix, the call streamed never shrinks and the finished reading goes on from it; where
    /// no key repeats and `parse` reads a call, streaming has begun that very call by the end.
    #[test]
    fn llama3_partial_calls_of_random_members() {
        let r = f_req(false);
        // the members of each key (a repeat inside the arguments last)
        let types = [r#""type": "function""#, r#""type": "tool""#, r#""type": 1"#];
        let names = [
            r#""name": "f""#,
            r#""\u006eame": "h""#,
            r#""name": "no_such_tool""#,
            r#""name": 1"#,
        ];
        let args = [
            r#""parameters": {"a": [1, "x\"}"], "b": {"c": null}}"#,
            r#""arguments": {"d": -2.5e3}"#,
            r#""parameters": {}"#,
            r#""parameters": "{}""#,
            r#""parameters": {"a": 1, "a": 2}"#,
        ];
        let mut rng = Rng(0x11A3_0003);
        let (mut read, mut kept) = (0usize, 0usize);
        for round in 0..4000 {
            let mut body: Vec<&str> = Vec::new();
            let repeats = round % 2 == 1;
            for (group, p) in [(&types[..], 2), (&names[..], 1), (&args[..], 1)] {
                for _ in 0..if repeats { rng.below(3) } else { 1 } {
                    if rng.below(p) == 0 {
                        body.push(group[rng.below(group.len())]);
                    }
                }
            }
            if rng.below(8) == 0 {
                body.push(r#""id": 1"#);
            }
            for i in (1..body.len()).rev() {
                body.swap(i, rng.below(i + 1));
            }
            let sep = [", ", ",\n  ", ","][rng.below(3)];
            let t = format!(
                "{}{{{}{}",
                ["", " ", "\n"][rng.below(3)],
                body.join(sep),
                ["}", "}\n", "", "} x", "}}"][rng.below(5)]
            );
            let (full, _) = check_partial_prefixes(Format::Llama3, &t, Some(&r));
            let end = Format::Llama3.parse_partial(&t, Some(&r));
            // never a call of a tool not offered
            assert!(
                end.tool_calls.iter().all(|c| offered(Some(&r), &c.name)),
                "{t}"
            );
            if !repeats && !full.tool_calls.is_empty() && !t.contains(r#""a": 2"#) {
                read += 1;
                assert_eq!(end.tool_calls, full.tool_calls, "{t}");
            } else if full.tool_calls.is_empty() && !end.tool_calls.is_empty() {
                // begun, then proven no call: the finished reading keeps it
                kept += 1;
                let fin = Format::Llama3.parse_final(&t, Some(&r));
                assert_eq!(fin.tool_calls, end.tool_calls, "{t}");
            }
        }
        assert!(read > 100 && kept > 200, "{read} {kept}");
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
        let want = [
            ("meta-llama-Llama-3.1-8B-Instruct.jinja", Format::Llama3),
            ("meta-llama-Llama-3.2-3B-Instruct.jinja", Format::Llama3),
            ("meta-llama-Llama-3.3-70B-Instruct.jinja", Format::Llama3),
        ];
        check_detect_all(|t| detect(t).then_some(Format::Llama3), &want);
    }
}
