//! MeetKai's Functionary formats, on Llama 3.1's chat markup. The chat template shows the
//! tools itself.
//!
//! v3.1 writes each call as `<function=NAME>{...}</function>`, the calls back to back after the
//! reply's text if any. Its template writes a past call of a tool named `python` as
//! `<|python_tag|>` and the arguments, but teaches the model only the `<function=` form, and
//! llama.cpp reads `<|python_tag|>` as text: so does Muser.
//!
//! v3.2 writes messages to recipients, each opened by `>>>`: `all\nTEXT` for the reply,
//! `NAME\n{...}` for a call. Its generation prompt ends in the first `>>>`, so the output
//! starts at the first recipient: `all\nLet me check.>>>get_weather\n{"city": "Paris"}`, or a
//! call right away, `get_weather\n{"city": "Paris"}>>>add\n{"a": 1}`. A message that is
//! neither (an unknown recipient, arguments that are not a JSON object) is content, with its
//! `>>>`.
//!
//! Streaming begins a call once its name is whole (v3.1: at the `>` after it, v3.2: at the line
//! break after it) and streams its arguments as they are written.

use serde_json::Value;

use super::deepseek::{call_rules, read_name};
use super::partial::{self, Json};
use super::{
    allowed_tools, call_of, calls_wanted, json_prefix, offered, parse_blocks, parse_blocks_partial,
    BlockStep, Blocks, LazyStart, Parsed, Plan, ToolCall, ToolChoice, ToolRequest, Trigger,
};

use muser_jsonschema::gbnf_literal as lit;

/// Which Functionary: v3.1's `<function=` calls or v3.2's recipients.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Flavor {
    V31,
    V32,
}

const OPEN: &str = "<function=";
const CLOSE: &str = "</function>";
/// What opens a v3.2 message, before its recipient.
const TO: &str = ">>>";
/// The v3.2 recipient of the reply's text.
const ALL: &str = "all";

pub(super) const V31_LAZY_START: LazyStart = LazyStart::Word(OPEN);
pub(super) const V31_MARKUP: &[&str] = &[OPEN, CLOSE];
/// llama.cpp preserves `>>>all` for v3.2.
pub(super) const V32_MARKUP: &[&str] = &[">>>all"];

/// The flavour a template teaches: v3.2's `>>>${recipient}` description of its messages, or
/// v3.1's `<function=` calls on Llama 3's headers. None for other templates (Qwen3-Coder's
/// `<function=` calls have `<parameter=` tags).
pub(super) fn detect(t: &str) -> Option<Flavor> {
    if t.contains(">>>all") && t.contains(">>>${recipient}") {
        Some(Flavor::V32)
    } else if t.contains("'<function=' + ")
        && t.contains("</function>")
        && t.contains("<|start_header_id|>")
        && !t.contains("<parameter=")
    {
        Some(Flavor::V31)
    } else {
        None
    }
}

/// One call (or, with `req.parallel`, one or more) of the allowed tools, the arguments held by
/// each tool's schema, in the template's layout exactly: v3.1's calls back to back, v3.2's
/// calls each after its recipient line, `>>>` between them. Under `auto` v3.1's grammar starts
/// at `<function=`, v3.2's at the recipient line of a call, at the output's start or after a
/// `>>>` (the reply's text, in its `all` message, comes first).
pub(super) fn plan(req: &ToolRequest, flavor: Flavor) -> Result<Option<Plan>, String> {
    let Some((alts, rules)) = call_rules(req, |t, args| match flavor {
        Flavor::V31 => format!(
            "{} {args} {}",
            lit(&format!("{OPEN}{}>", t.name)),
            lit(CLOSE)
        ),
        Flavor::V32 => format!("{} {args}", lit(&format!("{}\n", t.name))),
    })?
    else {
        return Ok(None);
    };
    let sep = match flavor {
        Flavor::V31 => String::new(),
        Flavor::V32 => format!("{} ", lit(TO)),
    };
    let more = if req.parallel {
        format!(" ( {sep}call )*")
    } else {
        String::new()
    };
    let gbnf = format!("root ::= call{more}\ncall ::= {alts}\n{rules}");
    Ok(Some(match flavor {
        Flavor::V31 => Plan::calls(gbnf, &req.choice, V31_LAZY_START),
        Flavor::V32 => {
            let lazy = req.choice == ToolChoice::Auto;
            let names: Vec<String> = allowed_tools(req)?
                .into_iter()
                .flatten()
                .map(|t| fancy_regex::escape(&t.name).into_owned())
                .collect();
            let trigger = format!(r"(?:^|{TO})((?:{})\n)", names.join("|"));
            Plan {
                gbnf,
                lazy,
                triggers: if lazy {
                    vec![Trigger::Pattern(trigger)]
                } else {
                    Vec::new()
                },
                system: None,
            }
        }
    }))
}

/// Reads a finished output. Never fails: what does not follow the format is content.
pub(super) fn parse(text: &str, req: Option<&ToolRequest>, flavor: Flavor) -> Parsed {
    match flavor {
        Flavor::V31 => parse_blocks(text, req, &[OPEN], |after| {
            read_call(after).map(|(call, used)| (vec![call], used))
        }),
        Flavor::V32 => read_messages(text, req, true),
    }
}

/// What streaming may send of an unfinished output (`Format::parse_partial`).
pub(super) fn parse_partial(
    text: &str,
    req: Option<&ToolRequest>,
    flavor: Flavor,
    from: &mut Blocks,
) -> Parsed {
    match flavor {
        Flavor::V31 => parse_blocks_partial(text, req, &[OPEN], read_call_partial, from),
        Flavor::V32 => read_messages(text, req, false),
    }
}

/// The v3.1 call whose `<function=` ends right before `s`: the call and the length of `s` it
/// spans (through `</function>`, or to the end for an unclosed final call). None when it is
/// malformed.
fn read_call(s: &str) -> Option<(ToolCall, usize)> {
    let gt = s.find('>')?;
    let name = read_name(&s[..gt])?;
    let body = &s[gt + 1..];
    let (v, used) = json_prefix(body)?;
    let call = call_of(name, &v)?;
    let tail = &body[used..];
    let after = tail.trim_start();
    let end = gt + 1 + used + (tail.len() - after.len());
    if after.starts_with(CLOSE) {
        Some((call, end + CLOSE.len()))
    } else if after.is_empty() {
        Some((call, s.len()))
    } else {
        None
    }
}

/// How far streaming has read the v3.1 call whose `<function=` ends right before `s`: begun
/// once its name is whole, its arguments as far as they are written.
fn read_call_partial(s: &str, memo: &mut partial::Memo) -> BlockStep {
    let Some(gt) = s.find('>') else {
        // the name is not whole yet
        return if s.trim().is_empty() || read_name(s).is_some() {
            BlockStep::Open(Vec::new())
        } else {
            BlockStep::Broken(Vec::new())
        };
    };
    let Some(name) = read_name(&s[..gt]) else {
        return BlockStep::Broken(Vec::new());
    };
    let body = &s[gt + 1..];
    let r = partial::read_on(body, memo);
    let call = ToolCall {
        id: None,
        name: name.to_string(),
        arguments: r.json.stable_object_on(Some(memo)),
    };
    match r.json {
        Json::Whole(Value::Object(_), end) => {
            let after = body[end..].trim_start();
            if after.starts_with(CLOSE) {
                match read_call(s) {
                    Some((whole, used)) => BlockStep::Whole(vec![whole], used),
                    None => BlockStep::Broken(vec![call]),
                }
            } else if CLOSE.starts_with(after) {
                BlockStep::Open(vec![call])
            } else {
                BlockStep::Broken(vec![call])
            }
        }
        Json::Whole(..) => BlockStep::Broken(vec![call]),
        Json::Open(_) if r.broken => BlockStep::Broken(vec![call]),
        Json::Open(_) => BlockStep::Open(vec![call]),
    }
}

/// The length of a tail of `s` that may be the start of `word` (not all of it).
fn held(s: &str, word: &str) -> usize {
    (1..word.len())
        .filter(|&n| s.ends_with(&word[..n]))
        .max()
        .unwrap_or(0)
}

/// Whether `s` may still grow into a recipient whose message `read_messages` reads as more than
/// text: `all`, or a tool that `req` offers.
fn may_be_recipient(s: &str, req: Option<&ToolRequest>) -> bool {
    ALL.starts_with(s) || req.is_some_and(|r| r.tools.iter().any(|t| t.name.starts_with(s)))
}

/// Reads v3.2's messages one after another: `all` messages' text is content, a message to an
/// offered tool whose body is a JSON object (and whitespace) is a call, any other message is
/// content as written (with its `>>>`). Finished (`done`), content's trailing whitespace is
/// trimmed. Streaming (not `done`), it reads as far as the text is settled: a recipient line
/// is read once whole (held while it may still name `all` or a tool), a call is begun at it
/// and stays begun (a call that stops being well formed ends the reading), and a tail that
/// may start a `>>>` is held. Without calls asked for, the output less the `all\n` it starts
/// with is the content.
fn read_messages(text: &str, req: Option<&ToolRequest>, done: bool) -> Parsed {
    if !calls_wanted(req) {
        let lead = format!("{ALL}\n");
        let content = match text.strip_prefix(&lead) {
            Some(rest) => rest,
            None if !done && lead.starts_with(text) => "",
            None => text,
        };
        return Parsed {
            content: content.to_string(),
            ..Parsed::default()
        };
    }
    let mut content = String::new();
    let mut tool_calls = Vec::new();
    let mut at = 0;
    // what opened the message at `at`: nothing for the first (the prompt has its `>>>`)
    let mut opening = "";
    loop {
        let rest = &text[at..];
        let next = rest.find(TO);
        let line = rest.find('\n').filter(|&nl| next.is_none_or(|n| nl < n));
        // the end of this message if it is text: the next `>>>`, or the text's end (less a
        // tail that may start a `>>>` while streaming)
        let text_end = |from: usize| match rest[from..].find(TO) {
            Some(n) => (from + n, true),
            None if done => (rest.len(), false),
            None => (rest.len() - held(rest, TO), false),
        };
        let Some(nl) = line else {
            // no whole recipient line in this message
            match next {
                Some(n) => {
                    content.push_str(opening);
                    content.push_str(&rest[..n]);
                    at += n + TO.len();
                    opening = TO;
                    continue;
                }
                None if !done && may_be_recipient(rest, req) => {}
                None => {
                    content.push_str(opening);
                    content.push_str(&rest[..text_end(0).0]);
                }
            }
            break;
        };
        let recipient = &rest[..nl];
        let body = &rest[nl + 1..];
        if recipient == ALL {
            let (end, more) = text_end(nl + 1);
            content.push_str(&rest[nl + 1..end]);
            if !more {
                break;
            }
            at += end + TO.len();
            opening = TO;
            continue;
        }
        if offered(req, recipient) {
            match read_call_body(recipient, body, done) {
                CallRead::Whole(call, used) => {
                    tool_calls.push(call);
                    if nl + 1 + used == rest.len() {
                        break;
                    }
                    at += nl + 1 + used + TO.len();
                    opening = TO;
                    continue;
                }
                CallRead::Begun(call) => {
                    tool_calls.push(call);
                    break;
                }
                CallRead::Not => {}
            }
        }
        // a message that is neither text nor a call: text, as written
        let (end, more) = text_end(nl + 1);
        content.push_str(opening);
        content.push_str(&rest[..end]);
        if !more {
            break;
        }
        at += end + TO.len();
        opening = TO;
    }
    content.truncate(content.trim_end().len());
    Parsed {
        content,
        reasoning: None,
        tool_calls,
    }
}

/// A v3.2 call's body read.
enum CallRead {
    /// A whole call, and the length of the body it spans: its JSON object and the whitespace
    /// after it, up to the next `>>>` or the text's end.
    Whole(ToolCall, usize),
    /// Streaming: the call begun, the text ending in it (or it stopped being well formed).
    Begun(ToolCall),
    /// Not a call.
    Not,
}

/// The call of `name` whose arguments start `body`.
fn read_call_body(name: &str, body: &str, done: bool) -> CallRead {
    let whole = |v: &Value, end: usize| -> Option<(ToolCall, usize)> {
        let tail = &body[end..];
        let after = tail.trim_start();
        let used = end + (tail.len() - after.len());
        (after.is_empty() || after.starts_with(TO)).then_some((call_of(name, v)?, used))
    };
    if done {
        return match json_prefix(body).and_then(|(v, end)| whole(&v, end)) {
            Some((call, used)) => CallRead::Whole(call, used),
            None => CallRead::Not,
        };
    }
    let r = partial::read(body);
    let begun = ToolCall {
        id: None,
        name: name.to_string(),
        arguments: r.json.stable_object(),
    };
    match &r.json {
        Json::Whole(v, end) => match whole(v, *end) {
            // more text may still follow the call's whitespace
            Some((call, used)) if body[used..].starts_with(TO) => CallRead::Whole(call, used),
            _ => CallRead::Begun(begun),
        },
        Json::Open(_) => CallRead::Begun(begun),
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_util::*;
    use super::super::Format;
    use super::*;

    const V31: Format = Format::Functionary(Flavor::V31);
    const V32: Format = Format::Functionary(Flavor::V32);

    /// Calls as the templates render them: v3.1's back to back, v3.2's after their recipient
    /// lines with `>>>` between them (the first `>>>` is the prompt's).
    fn render(flavor: Flavor, calls: &[(&str, String)]) -> String {
        let calls = calls.iter().map(|(n, a)| match flavor {
            Flavor::V31 => format!("{OPEN}{n}>{a}{CLOSE}"),
            Flavor::V32 => format!("{n}\n{a}"),
        });
        match flavor {
            Flavor::V31 => calls.collect(),
            Flavor::V32 => calls.collect::<Vec<_>>().join(TO),
        }
    }

    /// Random tools and calls, both flavours: the grammar takes the rendered calls (several
    /// argument layouts), `parse` gives them back and streaming agrees; wrong names, broken
    /// arguments, extra calls, other layouts and text after the calls are refused.
    #[test]
    fn functionary_grammar_accepts_calls_and_refuses_wrong_ones() {
        let mut rng = Rng(0xF0C7_0001);
        for round in 0..80 {
            let (flavor, format) = [(Flavor::V31, V31), (Flavor::V32, V32)][round % 2];
            let r = random_req(&mut rng, round, round % 4 >= 2);
            let p = format.plan(&r).unwrap().unwrap();
            let g = grammar(&p);
            assert_eq!(p.lazy, r.choice == ToolChoice::Auto);
            let calls = random_calls(&mut rng, &r);
            for layout in 0..4 {
                let laid: Vec<(&str, String)> = calls
                    .iter()
                    .map(|(t, a)| (t.name.as_str(), layouts(a)[layout].clone()))
                    .collect();
                let text = render(flavor, &laid);
                assert!(
                    g.accepts_str(&text),
                    "round {round}: refused {text:?}\n{}",
                    p.gbnf
                );
                let parsed = format.parse(&text, Some(&r));
                assert_eq!(parsed.content, "", "{text:?}");
                assert_eq!(parsed.reasoning, None);
                assert_eq!(parsed.tool_calls.len(), calls.len(), "{text:?}");
                for (c, (t, a)) in parsed.tool_calls.iter().zip(&calls) {
                    assert_call(c, &t.name, a, None);
                }
                check_stream_calls(format, &text, &r);
                // the reply's text before the calls is kept, nothing may follow them
                let before = match flavor {
                    Flavor::V31 => format!("Let me check.\n\n{text}"),
                    Flavor::V32 => format!("all\nLet me check.\n\n>>>{text}"),
                };
                let parsed = format.parse(&before, Some(&r));
                assert_eq!(parsed.content, "Let me check.");
                assert_eq!(parsed.tool_calls.len(), calls.len());
                check_stream_calls(format, &before, &r);
                assert!(!g.accepts_str(&format!("{text}\nMore")));
                assert!(!g.accepts_str(&format!("{text}>>>all\nMore")));
            }
            assert!(!g.accepts_str(""));
            assert!(!g.accepts_str("all\nHello"));
            let (t, a) = &calls[0];
            let one = (t.name.as_str(), a.to_string());
            let single = render(flavor, std::slice::from_ref(&one));
            assert!(g.accepts_str(&single));
            let two = render(flavor, &[one.clone(), one.clone()]);
            assert_eq!(g.accepts_str(&two), r.parallel);
            // whitespace between the calls, the other flavour's layout
            let spaced = match flavor {
                Flavor::V31 => format!("{single}\n{single}"),
                Flavor::V32 => format!("{single}\n>>>{single}"),
            };
            assert!(!g.accepts_str(&spaced));
            let other = if flavor == Flavor::V31 {
                Flavor::V32
            } else {
                Flavor::V31
            };
            assert!(!g.accepts_str(&render(other, std::slice::from_ref(&one))));
            // a tool that is not allowed
            assert!(!g.accepts_str(&render(flavor, &[("no_such_tool", "{}".into())])));
            if let Some((o, oa)) = other_tool(&mut rng, &r) {
                let b = render(flavor, &[(o.name.as_str(), oa.to_string())]);
                assert!(!g.accepts_str(&b), "other tool taken: {b}");
            }
            check_broken_args(&mut rng, &g, t, a, |bad| {
                render(flavor, &[(t.name.as_str(), bad.to_string())])
            });
        }
        check_detect_all(
            |t| detect(t).map(Format::Functionary),
            &[
                ("meetkai-functionary-medium-v3.1.jinja", V31),
                ("meetkai-functionary-medium-v3.2.jinja", V32),
            ],
        );
    }

    /// v3.2's lazy trigger finds a call's recipient line of an offered tool at the output's
    /// start or after a `>>>`, never the reply's `all` nor another name; the grammar takes the
    /// text from the match on.
    #[test]
    fn functionary_v32_trigger_finds_call_lines() {
        let r = req(weather_tools(), ToolChoice::Auto, true);
        let p = V32.plan(&r).unwrap().unwrap();
        let [Trigger::Pattern(re)] = p.triggers.as_slice() else {
            panic!("{:?}", p.triggers)
        };
        let re = fancy_regex::Regex::new(re).unwrap();
        let g = grammar(&p);
        let call = "ping\n{}";
        for (text, at) in [
            (call.to_string(), Some(0)),
            (format!("all\nSure.>>>{call}"), Some(12)),
            ("all\nSure.>>>all\nMore".to_string(), None),
            ("all\nping\n".to_string(), None),
            ("all\nA>>>get_weatherX\n".to_string(), None),
            ("pingpong\n".to_string(), None),
        ] {
            let found = re
                .captures(&text)
                .unwrap()
                .map(|c| c.get(1).unwrap().start());
            assert_eq!(found, at, "{text:?}");
            if let Some(at) = found {
                assert!(g.accepts_str(&text[at..]), "{text:?}");
            }
        }
    }

    /// v3.2's messages read: text to `all`, calls to offered tools, anything else text with
    /// its `>>>`; streaming holds what may still become a recipient or a `>>>`.
    #[test]
    fn functionary_v32_parse_cases() {
        let r = f_req(true);
        let cases: &[(&str, &str, Vec<ToolCall>)] = &[
            ("all\nHello", "Hello", vec![]),
            ("Hello", "Hello", vec![]),
            (
                "all\nHi>>>f\n{\"a\": 1}",
                "Hi",
                vec![call("f", r#"{"a":1}"#)],
            ),
            (
                "f\n{}>>>g\n{\"b\": [2]}\n",
                "",
                vec![call("f", "{}"), call("g", r#"{"b":[2]}"#)],
            ),
            // a string argument with the markup in it
            (
                "f\n{\"s\": \">>>all\\n\"}",
                "",
                vec![call("f", r#"{"s":">>>all\n"}"#)],
            ),
            // a tool not offered, arguments that are no object, text after the JSON
            ("all\nHi>>>nosuch\n{}", "Hi>>>nosuch\n{}", vec![]),
            ("f\n[1]>>>g\n{}", "f\n[1]", vec![call("g", "{}")]),
            ("f\n{} x>>>all\nOk", "f\n{} xOk", vec![]),
            ("all\nA>>>all\nB", "AB", vec![]),
            ("all\nA>>>f", "A>>>f", vec![]),
        ];
        for (text, content, calls) in cases {
            check_parsed(&V32.parse(text, Some(&r)), content, calls, text);
            check_partial_prefixes(V32, text, Some(&r));
        }
        // without tools: the text less its `all\n`
        for q in [None, Some(&req(r.tools.clone(), ToolChoice::None, false))] {
            assert_eq!(V32.parse("all\nHi>>>f\n{}", q).content, "Hi>>>f\n{}");
            assert_eq!(V32.parse_partial("al", q).content, "");
            assert_eq!(V32.parse("Hi", q).content, "Hi");
        }
        // streaming: a recipient that may still come is held, a call begun at its line break
        for (t, c, calls) in [
            ("al", "", vec![]),
            ("oth", "", vec![]),
            ("Hel", "Hel", vec![]),
            ("all\nHi>", "Hi", vec![]),
            ("all\nHi>>>g", "Hi", vec![]),
            ("all\nHi>>>x", "Hi>>>x", vec![]),
            (
                "all\nHi>>>f\n{\"a\": \"x",
                "Hi",
                vec![call("f", r#"{"a":"x"#)],
            ),
        ] {
            check_parsed(&V32.parse_partial(t, Some(&r)), c, &calls, t);
        }
    }

    /// v3.1's calls read: back to back or apart, unclosed at the end; malformed ones and
    /// `<|python_tag|>` stay text.
    #[test]
    fn functionary_v31_parse_cases() {
        let r = f_req(true);
        let cases: &[(&str, &str, Vec<ToolCall>)] = &[
            ("Hello", "Hello", vec![]),
            (
                "Hi <function=f>{\"a\": 1}</function><function=g>{}</function>",
                "Hi",
                vec![call("f", r#"{"a":1}"#), call("g", "{}")],
            ),
            ("<function=f>{}\n</function>\n", "", vec![call("f", "{}")]),
            ("<function=f>{\"a\": 1}", "", vec![call("f", r#"{"a":1}"#)]),
            (
                "<function=f x>{}</function>",
                "<function=f x>{}</function>",
                vec![],
            ),
            (
                "<function=nosuch>{}</function>",
                "<function=nosuch>{}</function>",
                vec![],
            ),
            (
                "<function=f>[]</function> ok",
                "<function=f>[]</function> ok",
                vec![],
            ),
            (
                "<|python_tag|>{\"code\": \"1\"}",
                "<|python_tag|>{\"code\": \"1\"}",
                vec![],
            ),
        ];
        for (text, content, calls) in cases {
            check_parsed(&V31.parse(text, Some(&r)), content, calls, text);
            check_partial_prefixes(V31, text, Some(&r));
        }
        check_verbatim(V31, "Hi <function=f>{}</function>", &r.tools);
        let t = "Hi <function=f>{\"a\": [1, \"x";
        check_parsed(
            &V31.parse_partial(t, Some(&r)),
            "Hi",
            &[call("f", r#"{"a":[1,"x"#)],
            t,
        );
        let t = "Hi <function=f";
        check_parsed(&V31.parse_partial(t, Some(&r)), "Hi", &[], t);
    }

    /// Both flavours' pieces in random texts: what streaming sends is a prefix of what the
    /// finished text gives, and is never taken back.
    #[test]
    fn functionary_partial_is_prefix_of_parse() {
        let r = f_req(true);
        let frags = [
            "a",
            " ",
            "\n",
            "<",
            ">",
            ">>",
            TO,
            "all",
            "all\n",
            "f",
            "g\n",
            "f\n",
            "nosuch\n",
            OPEN,
            CLOSE,
            "f>",
            "{}",
            "{\"a\": 1}",
            "{\"s\": \">>>\"}",
            "{",
            "é",
            "[1]",
            "f\n{}",
            ">>>g\n{\"a\": 1}",
            "<function=f>{}</function>",
            "<function=g>{\"b\": 2}",
        ];
        let mut rng = Rng(0xF0C7_0002);
        let (mut checked, mut calls) = (0usize, 0usize);
        for _ in 0..3000 {
            let t: String = (0..rng.below(9))
                .map(|_| frags[rng.below(frags.len())])
                .collect();
            for format in [V31, V32] {
                for q in [Some(&r), None] {
                    let (full, n) = check_partial_prefixes(format, &t, q);
                    calls += full.tool_calls.len();
                    checked += n;
                }
            }
        }
        assert!(checked > 20_000 && calls > 300, "{checked} {calls}");
    }
}
