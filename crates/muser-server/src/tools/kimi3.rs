//! Kimi K3's XTML messages (llama.cpp's `common/parsers/kimi-k3.cpp`). Its tags are
//! `<|open|>TAG ATTRS<|sep|>` and `<|close|>TAG<|sep|>`; an assistant message is
//! `<|open|>message role="assistant"<|sep|>`, then its reasoning in a `think` section, its reply
//! in a `response` section, its calls in a `tools` section, then
//! `<|close|>message<|sep|><|end_of_msg|>`. The calls, all in one section:
//! `<|open|>tools<|sep|>`, per call `<|open|>call tool="NAME" index="N"<|sep|>` (N from 1), then
//! per argument `<|open|>argument key="K" type="T"<|sep|>V<|close|>argument<|sep|>`, then
//! `<|close|>call<|sep|>`, and `<|close|>tools<|sep|>`, no whitespace between the tags. T is the
//! value's JSON type (`string`, `number`, `boolean`, `null`, `array`, `object`), V the string
//! raw, another value as JSON. The calls are read by `xml_calls` ([`SHAPE`]); this module reads
//! the sections around them.
//!
//! The generation prompt opens the assistant's message and its `think` section (the
//! template's `thinking`, true unless the request's `chat_template_kwargs` turn it off), else
//! its `response` section. The output is read after that opening, as llama.cpp reads its
//! generation prompt and the output together: `Format::section_lead` gives the opening, which
//! the server puts before the output it reads (`lead`).
//!
//! # Parse
//!
//! After the message's opening (optional), a `think` section's text is the reasoning, up to
//! its closing tag or a `response` opening (or the end). The reply follows, after a `response`
//! opening at its very start: its content runs to the first `response` closing, `tools`
//! opening or message closing, and that `response` closing is not part of it; the message's
//! closing and `<|end_of_msg|>` at the end of the output are not either. The reply is then read
//! as the XML call formats read theirs (`xml_calls::parse`): well-formed `tools` sections of
//! offered tools are the calls, the rest is content (its trailing whitespace trimmed).
//! llama.cpp reads the same where the output follows the layout (text after the message's
//! end, or a second `tools` section, it refuses to read at all). A value is read by its
//! schema's types (`xml_args`): raw where strings are admitted, else JSON; llama.cpp reads it
//! as JSON only where the schema's `type` is one name other than `string`, so a value of a
//! schema without one (`anyOf` of non-strings, a list of types) that it reads raw, as a
//! string, Muser reads as the JSON its grammar wrote.
//!
//! Streaming holds back what may still become one of those tags, and reads the reply's calls
//! as `xml_calls::parse_partial` does.
//!
//! # Plan
//!
//! Under `auto` the grammar is lazy, from the `tools` opening (where the prompt opened the
//! `think` section, only after the reasoning's end: [`lazy_patterns`]); under `required` or a
//! named function it holds the whole output ([`reply_first`]): after the reasoning and its
//! closing tag (an empty `response` section may follow), or the `response` closing where the
//! prompt opened that section, the `tools` section, then the message's closing, optional. The
//! arguments follow `xml_args`, each with its type.

use serde_json::Value;

use super::xml_args::Syntax;
use super::xml_calls::{self, Shape};
use super::{Blocks, Format, Parsed, ToolRequest};
use muser_jsonschema::gbnf_literal as literal;

const MSG_START: &str = "<|open|>message role=\"assistant\"<|sep|>";
const THINK_START: &str = "<|open|>think<|sep|>";
const THINK_END: &str = "<|close|>think<|sep|>";
const RESP_START: &str = "<|open|>response<|sep|>";
const RESP_END: &str = "<|close|>response<|sep|>";
const TOOLS_START: &str = "<|open|>tools<|sep|>";
const ARG_END: &str = "<|close|>argument<|sep|>";
const MSG_END: &str = "<|close|>message<|sep|>";
const END_OF_MSG: &str = "<|end_of_msg|>";

/// The markers llama.cpp preserves (the tag names are plain words).
pub(super) const MARKUP: &[&str] = &["<|open|>", "<|close|>", "<|sep|>", END_OF_MSG];

/// Kimi K3's `tools` section, read and planned by `xml_calls`.
pub(super) const SHAPE: Shape = Shape {
    syntax: Syntax {
        format: "Kimi K3",
        prefix: "kimi",
        open: |k, may_str, schema| {
            format!(
                "<|open|>argument key=\"{k}\" type=\"{}\"<|sep|>",
                value_type(may_str, schema)
            )
        },
        close: ARG_END,
        end_tag: ARG_END,
        name_stops: &['"', '\n', '\r'],
        python: false,
        sep: Some(""),
        required_first: false,
    },
    open: TOOLS_START,
    close: "<|close|>tools<|sep|>",
    function: "<|open|>call tool=\"",
    name_end: "\"",
    call_attrs: r#"" index=\"" [1-9] [0-9]{0,3} "\"<|sep|>""#,
    tag_end: "<|sep|>",
    after_name: None,
    before_end: "",
    function_close: "<|close|>call<|sep|>",
    param: "<|open|>argument key=\"",
    param_name_end: "\"",
    value_open: &[
        "type=\"string\"<|sep|>",
        "type=\"number\"<|sep|>",
        "type=\"integer\"<|sep|>",
        "type=\"boolean\"<|sep|>",
        "type=\"null\"<|sep|>",
        "type=\"array\"<|sep|>",
        "type=\"object\"<|sep|>",
    ],
    param_close: ARG_END,
    framed: false,
    cdata: false,
    many: true,
    ends_at_close: true,
    markup: MARKUP,
};

/// llama.cpp's test for Kimi K3's template: its three markers.
pub(super) fn detect(t: &str) -> bool {
    ["<|open|>", "<|close|>", "<|end_of_msg|>"]
        .iter()
        .all(|m| t.contains(m))
}

/// The `type` attribute the grammar writes for a parameter: `string` where its schema admits
/// strings (the value is then raw text), else the JSON type its schema names first.
fn value_type(may_str: bool, schema: &Value) -> &'static str {
    if may_str {
        return "string";
    }
    let named = match schema.get("type") {
        Some(Value::String(t)) => Some(t.as_str()),
        Some(Value::Array(ts)) => ts.iter().filter_map(Value::as_str).find(|t| *t != "null"),
        _ => None,
    };
    match named {
        Some("integer" | "number") => "number",
        Some("boolean") => "boolean",
        Some("null") => "null",
        Some("array") => "array",
        Some("object") => "object",
        _ => {
            let first = schema
                .get("const")
                .or_else(|| schema.get("enum").and_then(|e| e.get(0)));
            if let Some(v) = first {
                return match v {
                    Value::Number(_) => "number",
                    Value::Bool(_) => "boolean",
                    Value::Null => "null",
                    Value::Array(_) => "array",
                    _ => "object",
                };
            }
            ["anyOf", "oneOf"]
                .iter()
                .find_map(|k| schema.get(k).and_then(|b| b.get(0)))
                .map_or("object", |b| value_type(false, b))
        }
    }
}

/// The opening the section a prompt leaves its output in, where the template is Kimi K3's: a
/// continued message's reasoning or text, else the `think` or `response` opening the prompt
/// ends with. None for the other formats, and where the prompt opens neither.
pub fn section_lead(
    format: Format,
    prompt: &str,
    continued: Option<crate::chat::Continue>,
) -> Option<&'static str> {
    use crate::chat::Continue;
    if format != Format::KimiK3 {
        return None;
    }
    match continued {
        Some(Continue::Reasoning) => Some(THINK_START),
        Some(_) => Some(RESP_START),
        None => [THINK_START, RESP_START]
            .into_iter()
            .find(|o| prompt.ends_with(o)),
    }
}

/// A prompt that continues its final message, as llama-server writes it for Kimi K3: the
/// conversation before it (`prompt`, without a generation prompt), then the message opened
/// with its `think` section and its reasoning, left open when the reasoning is continued, else
/// closed and followed by the `response` section with the message's text, left open. (The
/// `think` section is written whatever the template's `thinking`.) An empty message gets the
/// conversation alone.
pub fn continued(
    mut prompt: String,
    prefill: &crate::chat::Prefill,
    continued: Option<crate::chat::Continue>,
) -> String {
    let Some(what) = continued else {
        return prompt;
    };
    prompt.push_str(MSG_START);
    prompt.push_str(THINK_START);
    prompt.push_str(&prefill.reasoning);
    if what != crate::chat::Continue::Reasoning {
        prompt.push_str(THINK_END);
        prompt.push_str(RESP_START);
        prompt.push_str(&prefill.content);
    }
    prompt
}

/// The trigger patterns of a lazy grammar where the output starts in the section `lead` opened:
/// after the reasoning's end where it is the `think` section (a `tools` opening in the
/// reasoning is reasoning); None where the plan's own trigger serves.
pub fn lazy_patterns(lead: &str) -> Option<Vec<String>> {
    let e = |s: &str| fancy_regex::escape(s).into_owned();
    (lead == THINK_START).then(|| {
        vec![format!(
            r"^[\s\S]*?(?:{}|{})[\s\S]*?({})",
            e(THINK_END),
            e(RESP_START),
            e(TOOLS_START)
        )]
    })
}

/// A grammar of the whole output (`gbnf`, root `root`) with room for what comes before it in
/// the section `lead` opened: the reasoning (no closing tag or `response` opening in it), its
/// closing tag and an optional empty `response` section, where the `think` section is open;
/// an optional `response` closing where the `response` section is. Another lead leaves it as
/// it is.
pub fn reply_first(gbnf: &str, lead: &str) -> String {
    let before = if lead == THINK_START {
        format!(
            "kimi-reasoning {} ( {} )?",
            literal(THINK_END),
            literal(&format!("{RESP_START}{RESP_END}"))
        )
    } else if lead == RESP_START {
        format!("( {} )?", literal(RESP_END))
    } else {
        return gbnf.to_string();
    };
    format!(
        "root ::= {before} kimi-reply\n{}{}",
        super::rename_rule(gbnf, "root", "kimi-reply"),
        super::xml_args::text_without("kimi-reasoning", &[THINK_END, RESP_START])
    )
}

/// The plan of the `tools` section (`xml_calls::plan`), the message's closing allowed after it.
pub(super) fn plan(req: &ToolRequest) -> Result<Option<super::Plan>, String> {
    Ok(xml_calls::plan(&SHAPE, req)?.map(|mut p| {
        p.gbnf = p.gbnf.replacen(
            "root ::= kimi-call\n",
            &format!("root ::= kimi-call ( {} )?\n", literal(MSG_END)),
            1,
        );
        p
    }))
}

/// The reasoning of a finished output (None where it has no `think` section or an empty one)
/// and its reply, less the `response` opening at its start.
fn sections(text: &str) -> (Option<&str>, &str) {
    let s = text.strip_prefix(MSG_START).unwrap_or(text);
    let Some(body) = s.strip_prefix(THINK_START) else {
        return (None, s.strip_prefix(RESP_START).unwrap_or(s));
    };
    let end = first_of(body, &[THINK_END, RESP_START]).unwrap_or(body.len());
    let rest = &body[end..];
    let rest = rest.strip_prefix(THINK_END).unwrap_or(rest);
    let reasoning = Some(&body[..end]).filter(|r| !r.is_empty());
    (reasoning, rest.strip_prefix(RESP_START).unwrap_or(rest))
}

/// Where the first of `tags` starts in `s`.
fn first_of(s: &str, tags: &[&str]) -> Option<usize> {
    tags.iter().filter_map(|t| s.find(t)).min()
}

/// The reply as the calls' reader takes it: the `response` closing that ends its content left
/// out (where it comes before a `tools` opening and a message closing), and `end` bytes of
/// the reply (its message closing and `<|end_of_msg|>`) cut off.
fn reply_text(reply: &str, end: usize) -> String {
    let reply = &reply[..end];
    let at = first_of(reply, &[RESP_END, TOOLS_START, MSG_END]);
    match at {
        Some(at) if reply[at..].starts_with(RESP_END) => {
            format!("{}{}", &reply[..at], &reply[at + RESP_END.len()..])
        }
        _ => reply.to_string(),
    }
}

/// The length of a finished reply without the message closing and `<|end_of_msg|>` that end
/// it.
fn without_trailer(reply: &str) -> usize {
    let r = reply.strip_suffix(END_OF_MSG).unwrap_or(reply);
    r.strip_suffix(MSG_END).unwrap_or(r).len()
}

pub(super) fn parse(text: &str, req: Option<&ToolRequest>) -> Parsed {
    let (reasoning, reply) = sections(text);
    let mut p = xml_calls::parse(&SHAPE, &reply_text(reply, without_trailer(reply)), req);
    p.reasoning = reasoning.map(str::to_string);
    p
}

/// The length of the longest tail of `s` that is a proper start of one of `tags`.
fn held(s: &str, tags: &[&str]) -> usize {
    tags.iter()
        .map(|t| super::xml_args::tail_len(s, t))
        .max()
        .unwrap_or(0)
}

/// The length of an unfinished reply that is sure not to be its trailer: less a tail that may
/// become the message closing and `<|end_of_msg|>` (or the `response` closing, while the content
/// has not ended).
fn settled_len(reply: &str) -> usize {
    let mut end = reply.len();
    // (the trailer whole, or a start of it)
    let trailer = format!("{MSG_END}{END_OF_MSG}");
    if let Some(at) = (reply.len().saturating_sub(trailer.len())..=reply.len())
        .filter(|&i| reply.is_char_boundary(i))
        .find(|&i| {
            let t = &reply[i..];
            !t.is_empty() && (trailer.starts_with(t) || END_OF_MSG.starts_with(t))
        })
    {
        end = at;
    }
    if first_of(reply, &[RESP_END, TOOLS_START, MSG_END]).is_none() {
        end = end.min(reply.len() - held(reply, &[RESP_END]));
    }
    end
}

pub(super) fn parse_partial(text: &str, req: Option<&ToolRequest>) -> Parsed {
    let opening = |s: &str| !s.is_empty() && s.len() < THINK_START.len();
    let s = match text.strip_prefix(MSG_START) {
        Some(s) => s,
        None if MSG_START.starts_with(text) => return Parsed::default(),
        None => text,
    };
    if opening(s) && (THINK_START.starts_with(s) || RESP_START.starts_with(s)) {
        return Parsed::default();
    }
    let (reasoning, reply) = match s.strip_prefix(THINK_START) {
        None => (None, s),
        Some(body) => match first_of(body, &[THINK_END, RESP_START]) {
            None => {
                let so_far = &body[..body.len() - held(body, &[THINK_END, RESP_START])];
                return Parsed {
                    reasoning: Some(so_far.to_string()).filter(|r| !r.is_empty()),
                    ..Parsed::default()
                };
            }
            Some(end) => {
                let rest = &body[end..];
                let r = Some(body[..end].to_string()).filter(|r| !r.is_empty());
                (r, rest.strip_prefix(THINK_END).unwrap_or(rest))
            }
        },
    };
    let mut p = if !reply.is_empty() && RESP_START.starts_with(reply) {
        Parsed::default()
    } else {
        let reply = reply.strip_prefix(RESP_START).unwrap_or(reply);
        let text = reply_text(reply, settled_len(reply));
        xml_calls::parse_partial(&SHAPE, &text, req, &mut Blocks::default())
    };
    p.reasoning = reasoning;
    p
}

/// One call as the template writes it (`index` from 1): a string argument raw, another as
/// JSON, each with its JSON type.
#[cfg(test)]
pub(super) fn test_call(name: &str, index: usize, args: &Value) -> String {
    let mut s = format!("<|open|>call tool=\"{name}\" index=\"{index}\"<|sep|>");
    for (k, v) in args.as_object().into_iter().flatten() {
        let raw = match v {
            Value::String(s) => s.clone(),
            v => v.to_string(),
        };
        let t = tests::json_type(v);
        s += &format!("<|open|>argument key=\"{k}\" type=\"{t}\"<|sep|>{raw}{ARG_END}");
    }
    s + "<|close|>call<|sep|>"
}

/// Calls (`test_call`'s) in one `tools` section.
#[cfg(test)]
pub(super) fn test_block(calls: &[String]) -> String {
    format!("{TOOLS_START}{}<|close|>tools<|sep|>", calls.concat())
}

#[cfg(test)]
mod tests {
    use super::super::test_util::*;
    use super::super::xml_calls::tests::ordered;
    use super::super::{Format, Tool, ToolChoice, Trigger};
    use super::*;
    use muser_sample::Grammar;
    use serde_json::{json, Map};

    fn render_calls(calls: &[(&Tool, Map<String, Value>)]) -> String {
        let calls: Vec<String> = calls
            .iter()
            .enumerate()
            .map(|(i, (t, a))| test_call(&t.name, i + 1, &Value::Object(a.clone())))
            .collect();
        test_block(&calls)
    }

    /// A string argument whose schema admits non-strings too is written with its JSON type
    /// where the grammar writes it, but read raw: such values are kept out of the battery.
    fn plain(t: &Tool, args: &Map<String, Value>) -> bool {
        args.iter().all(|(k, v)| {
            let schema = &t.parameters["properties"][k];
            let may_str = super::super::xml_args::admits_string(schema, &t.parameters);
            v.is_string() == may_str && value_type(may_str, schema) == json_type(v)
        })
    }

    pub(super) fn json_type(v: &Value) -> &'static str {
        match v {
            Value::String(_) => "string",
            Value::Number(_) => "number",
            Value::Bool(_) => "boolean",
            Value::Null => "null",
            Value::Array(_) => "array",
            Value::Object(_) => "object",
        }
    }

    /// Random tools and calls: the grammar takes the template's rendering of the calls (and
    /// the message's closing after them), in each of the sections a prompt may open, and the
    /// reading gives them back, whole and streamed; unknown tools, a second call without
    /// `parallel`, whitespace between the tags and broken markup are refused.
    #[test]
    fn grammar_takes_the_template_layout_and_reads_it_back() {
        let mut rng = Rng(0x5EED_0C33);
        let mut compared = 0;
        for round in 0..90 {
            let parallel = round % 2 == 1;
            let r = random_req(&mut rng, round, parallel);
            let (p, g) = checked_plan(Format::KimiK3, &r, Trigger::Word(TOOLS_START.into()));
            let calls: Vec<(&Tool, Map<String, Value>)> = random_calls(&mut rng, &r)
                .into_iter()
                .map(|(t, a)| (t, ordered(&t.parameters, &a)))
                .filter(|(t, a)| plain(t, a))
                .collect();
            if calls.is_empty() {
                continue;
            }
            let block = render_calls(&calls);
            assert!(
                g.accepts_str(&block),
                "round {round}: {block:?}\n{}",
                p.gbnf
            );
            assert!(g.accepts_str(&format!("{block}{MSG_END}")));
            assert!(!g.accepts_str(&format!("{block}\n")));
            assert!(!g.accepts_str(&block.replacen(
                "<|sep|><|open|>call",
                "<|sep|>\n<|open|>call",
                1
            )));
            assert!(!g.accepts_str(&block.replace("<|close|>tools<|sep|>", "")));
            let one = render_calls(&calls[..1]);
            let two = render_calls(&[calls[0].clone(), calls[0].clone()]);
            assert_eq!(g.accepts_str(&two), parallel, "{two:?}");
            assert!(!g.accepts_str(&render_calls(&[(&tool("no_such", json!({})), Map::new())])));
            // the sections before the calls, where the whole output is held
            if !p.lazy {
                for (lead, before) in [
                    (THINK_START, format!("a < b é{THINK_END}")),
                    (THINK_START, format!("x{THINK_END}{RESP_START}{RESP_END}")),
                    (RESP_START, RESP_END.to_string()),
                    (RESP_START, String::new()),
                ] {
                    let whole = Grammar::parse(&reply_first(&p.gbnf, lead)).unwrap();
                    assert!(
                        whole.accepts_str(&format!("{before}{one}")),
                        "{lead} {before}"
                    );
                    assert!(!whole.accepts_str(&format!("{before}Hi{one}")));
                }
                let think = Grammar::parse(&reply_first(&p.gbnf, THINK_START)).unwrap();
                assert!(!think.accepts_str(&one));
                assert!(!think.accepts_str(&format!("a{RESP_START}b{THINK_END}{one}")));
            }
            for (lead, before, reasoning, content) in [
                (
                    THINK_START,
                    format!("Hmm.{THINK_END}{RESP_START}Sure.{RESP_END}"),
                    Some("Hmm."),
                    "Sure.",
                ),
                (THINK_START, format!("Hmm.{THINK_END}"), Some("Hmm."), ""),
                (RESP_START, format!("Sure.{RESP_END}"), None, "Sure."),
                (RESP_START, String::new(), None, ""),
                ("", String::new(), None, ""),
            ] {
                for after in ["", MSG_END, "<|close|>message<|sep|><|end_of_msg|>"] {
                    let text = format!("{lead}{before}{block}{after}");
                    let got = Format::KimiK3.parse(&text, Some(&r));
                    assert_eq!(got.reasoning.as_deref(), reasoning, "{text:?}");
                    assert_eq!(got.content, content, "{text:?}");
                    assert_eq!(got.tool_calls.len(), calls.len(), "{text:?}");
                    for (c, (t, a)) in got.tool_calls.iter().zip(&calls) {
                        assert_call(c, &t.name, &Value::Object(a.clone()), None);
                    }
                    check_stream(&text, Some(&r));
                    assert_eq!(Format::KimiK3.parse_final(&text, Some(&r)), got);
                    compared += 1;
                }
            }
        }
        assert!(compared > 500, "{compared}");
    }

    /// Checks streaming `text`: at every prefix the content and reasoning are prefixes of the
    /// whole reading's and never taken back, the calls never shrink and the final reading goes
    /// on from them. Returns the number of prefixes.
    fn check_stream(text: &str, req: Option<&ToolRequest>) -> usize {
        let full = Format::KimiK3.parse(text, req);
        let fin = Format::KimiK3.parse_final(text, req);
        let mut sent = Parsed::default();
        let mut n = 0;
        for p in prefixes(text) {
            let part = Format::KimiK3.parse_partial(p, req);
            let r = |x: &Parsed| x.reasoning.clone().unwrap_or_default();
            assert!(part.content.starts_with(&sent.content), "{text:?} / {p:?}");
            assert!(
                full.content.starts_with(&part.content),
                "{text:?} / {p:?}: {part:?}"
            );
            assert!(r(&part).starts_with(&r(&sent)), "{text:?} / {p:?}");
            assert!(
                r(&full).starts_with(&r(&part)),
                "{text:?} / {p:?}: {part:?}"
            );
            check_call_step(&sent, &part, &fin, p);
            sent = part;
            n += 1;
        }
        n
    }

    /// Random outputs with the template's sections and slips (tags cut, doubled, misplaced)
    /// stream as prefixes of their final reading, with tools and without.
    #[test]
    fn random_outputs_stream_as_prefixes() {
        let pieces = [
            MSG_START,
            THINK_START,
            THINK_END,
            RESP_START,
            RESP_END,
            TOOLS_START,
            MSG_END,
            END_OF_MSG,
            ARG_END,
            "<|close|>call<|sep|>",
            "<|close|>tools<|sep|>",
            "<|open|>",
            "<|close|>",
            "<|sep|>",
            "\" index=\"",
            "type=\"string\"",
            "\"",
            "1",
            "\n",
            " ",
            "é",
        ];
        let mut rng = Rng(0x5EED_0C34);
        let (mut checked, mut with_calls) = (0, 0);
        for round in 0..300 {
            let r = random_req(&mut rng, round, true);
            let calls: Vec<(&Tool, Map<String, Value>)> = random_calls(&mut rng, &r)
                .into_iter()
                .map(|(t, a)| (t, ordered(&t.parameters, &a)))
                .collect();
            let lead = [THINK_START, RESP_START, ""][rng.below(3)];
            let mut text = format!("{lead}{}", ["", "Hmm.", " a < b "][rng.below(3)]);
            if lead == THINK_START {
                text += [THINK_END, ""][rng.below(2)];
            }
            text += &format!(
                "{}{}",
                ["", "Sure.", "\n"][rng.below(3)],
                [RESP_END, ""][rng.below(2)]
            );
            text += &render_calls(&calls);
            text += ["", MSG_END, "<|close|>message<|sep|><|end_of_msg|>"][rng.below(3)];
            if round % 3 != 0 {
                for _ in 0..1 + rng.below(3) {
                    mutate(&mut rng, &mut text, &pieces, 24);
                }
            }
            for q in [Some(&r), None] {
                checked += check_stream(&text, q);
                with_calls += usize::from(!Format::KimiK3.parse(&text, q).tool_calls.is_empty());
            }
        }
        assert!(
            checked > 20_000 && with_calls > 60,
            "{checked} {with_calls}"
        );
    }

    /// The template's own rendering of a message with reasoning, text and two calls (as
    /// llama.cpp renders it) is read back; without tools it is all content after the
    /// reasoning.
    #[test]
    fn template_rendering_is_read_back() {
        let text = "<|open|>think<|sep|>Let me see.<|close|>think<|sep|><|open|>response<|sep|>Sure.<|close|>response<|sep|><|open|>tools<|sep|><|open|>call tool=\"get_weather\" index=\"1\"<|sep|><|open|>argument key=\"city\" type=\"string\"<|sep|>Paris<|close|>argument<|sep|><|open|>argument key=\"days\" type=\"number\"<|sep|>3<|close|>argument<|sep|><|close|>call<|sep|><|open|>call tool=\"add\" index=\"2\"<|sep|><|open|>argument key=\"a\" type=\"number\"<|sep|>1<|close|>argument<|sep|><|open|>argument key=\"b\" type=\"array\"<|sep|>[2, \"x\"]<|close|>argument<|sep|><|close|>call<|sep|><|close|>tools<|sep|><|close|>message<|sep|>";
        let tools = vec![
            tool(
                "get_weather",
                json!({"type": "object", "properties": {
                    "city": {"type": "string"}, "days": {"type": "integer"}}}),
            ),
            tool(
                "add",
                json!({"type": "object", "properties": {
                    "a": {"type": "integer"}, "b": {"type": "array"}}}),
            ),
        ];
        let r = req(tools.clone(), ToolChoice::Auto, true);
        let p = Format::KimiK3.parse(text, Some(&r));
        assert_eq!(p.reasoning.as_deref(), Some("Let me see."));
        assert_eq!(p.content, "Sure.");
        assert_eq!(
            p.tool_calls,
            vec![
                call("get_weather", r#"{"city":"Paris","days":3}"#),
                call("add", r#"{"a":1,"b":[2,"x"]}"#)
            ]
        );
        let g = grammar(&Format::KimiK3.plan(&r).unwrap().unwrap());
        let calls = &text[text.find(TOOLS_START).unwrap()..];
        assert!(g.accepts_str(&calls.replace("[2, \"x\"]", "[2,\"x\"]")));
        for q in [None, Some(&req(tools, ToolChoice::None, true))] {
            let p = Format::KimiK3.parse(text, q);
            assert_eq!(p.reasoning.as_deref(), Some("Let me see."));
            assert!(
                p.content.starts_with("Sure.<|open|>tools<|sep|>"),
                "{:?}",
                p.content
            );
            assert!(p.tool_calls.is_empty());
        }
        // the reasoning ends at a `response` opening too, and a reply without one is content
        for (text, reasoning, content) in [
            (
                "<|open|>think<|sep|>a<|open|>response<|sep|>b",
                Some("a"),
                "b",
            ),
            (
                "<|open|>think<|sep|>a<|close|>think<|sep|>b",
                Some("a"),
                "b",
            ),
            (
                "<|open|>think<|sep|>all reasoning",
                Some("all reasoning"),
                "",
            ),
            (
                "<|open|>response<|sep|>x<|close|>think<|sep|>y",
                None,
                "x<|close|>think<|sep|>y",
            ),
        ] {
            let p = Format::KimiK3.parse(text, None);
            assert_eq!(
                (p.reasoning.as_deref(), p.content.as_str()),
                (reasoning, content)
            );
        }
    }

    /// Outputs after a prompt that opened the `think` section, with calls, read as llama.cpp's
    /// Kimi K3 parser reads them (its readings, taken from `tests/python/llamacpp_chat.cpp`):
    /// the reasoning, the reply in its `response` section or bare, the calls.
    #[test]
    fn thinking_outputs_with_calls_read_as_llama_cpp_reads_them() {
        let r = req(
            vec![
                tool(
                    "get_weather",
                    json!({"type": "object", "properties": {"city": {"type": "string"},
                        "days": {"type": "integer"}, "unit": {"enum": ["C", "F"]}}}),
                ),
                tool("ping", json!({"type": "object", "properties": {}})),
            ],
            ToolChoice::Auto,
            true,
        );
        let block = test_block(&[
            test_call(
                "get_weather",
                1,
                &json!({"city": "Pa ris\n<x>", "days": 3, "unit": "C"}),
            ),
            test_call("ping", 2, &json!({})),
        ]);
        let want = vec![
            call(
                "get_weather",
                r#"{"city":"Pa ris\n<x>","days":3,"unit":"C"}"#,
            ),
            call("ping", "{}"),
        ];
        for (text, content) in [
            (
                format!("Hmm.{THINK_END}{RESP_START}Sure.{RESP_END}{block}{MSG_END}"),
                "Sure.",
            ),
            (format!("Hmm.{THINK_END}{block}"), ""),
            (
                format!("Hmm.{RESP_START}{RESP_END}{block}{MSG_END}{END_OF_MSG}"),
                "",
            ),
            (format!("Hmm.{THINK_END}Sure.{block}"), "Sure."),
        ] {
            let p = Format::KimiK3.parse_final(&format!("{THINK_START}{text}"), Some(&r));
            assert_eq!(p.reasoning.as_deref(), Some("Hmm."), "{text:?}");
            assert_eq!(p.content, content, "{text:?}");
            assert_eq!(p.tool_calls, want, "{text:?}");
        }
    }

    /// The lazy trigger waits for the reasoning's end where the prompt opened it.
    #[test]
    fn lazy_trigger_waits_for_the_reasoning() {
        assert_eq!(lazy_patterns(RESP_START), None);
        let re = fancy_regex::Regex::new(&lazy_patterns(THINK_START).unwrap()[0]).unwrap();
        let at = |s: &str| re.captures(s).unwrap().map(|c| c.get(1).unwrap().start());
        assert_eq!(at(&format!("a{TOOLS_START}b")), None);
        let s = format!("a{TOOLS_START}{THINK_END}b{TOOLS_START}");
        assert_eq!(at(&s), Some(s.rfind(TOOLS_START).unwrap()));
        let s = format!("a{RESP_START}{RESP_END}{TOOLS_START}");
        assert_eq!(at(&s), Some(s.find(TOOLS_START).unwrap()));
    }

    #[test]
    fn detect_and_names() {
        check_detect_all(
            |t| detect(t).then_some(Format::KimiK3),
            &[("Kimi-K3.jinja", Format::KimiK3)],
        );
        assert_eq!(Format::KimiK3.name(), "kimi-k3");
        assert_eq!(
            section_lead(Format::KimiK3, "x<|open|>think<|sep|>", None),
            Some(THINK_START)
        );
        assert_eq!(
            section_lead(Format::KimiK3, "x<|open|>response<|sep|>", None),
            Some(RESP_START)
        );
        assert_eq!(
            section_lead(Format::Hermes, "x<|open|>think<|sep|>", None),
            None
        );
        // a name the tag cannot carry
        let e = Format::KimiK3
            .plan(&req(vec![tool("a\"b", json!({}))], ToolChoice::Auto, false))
            .unwrap_err();
        assert!(e.contains("Kimi K3"), "{e}");
        // the types the grammar writes
        for (schema, t) in [
            (json!({"type": "string"}), "string"),
            (json!({"type": "integer"}), "number"),
            (json!({"type": ["boolean", "null"]}), "boolean"),
            (json!({"type": "array"}), "array"),
            (json!({"enum": [1, 2]}), "number"),
            (
                json!({"anyOf": [{"type": "null"}, {"type": "object"}]}),
                "null",
            ),
            (json!({}), "object"),
        ] {
            let may_str = schema["type"] == "string";
            assert_eq!(value_type(may_str, &schema), t, "{schema}");
        }
    }
}
