//! The DeepSeek formats, and Kimi K2's of the same shape: calls in a block
//! (`<｜tool▁calls▁begin｜>` ... `<｜tool▁calls▁end｜>`) after the reply's text if any, one
//! `<｜tool▁call▁begin｜>` ... `<｜tool▁call▁end｜>` each. R1 (and its Qwen and Llama distills)
//! writes a call as `function<｜tool▁sep｜>NAME\n```json\n{...}\n```` and puts `\n` between
//! calls; V3.1 writes `NAME<｜tool▁sep｜>{...}` with nothing between them. Kimi K2 writes V3.1's
//! shape in its own markup, its call's name as the call's id `functions.NAME:IDX` (IDX counts
//! the conversation's calls; the templates write it back as the id of the call and of its
//! result):
//! `<|tool_calls_section_begin|><|tool_call_begin|>functions.NAME:IDX<|tool_call_argument_begin|>{...}<|tool_call_end|><|tool_calls_section_end|>`.
//! Solar Open writes Kimi's shape with the id the model makes up before the name:
//! `<|tool_calls|><|tool_call:begin|>ID<|tool_call:name|>NAME<|tool_call:args|>{...}<|tool_call:end|><|calls|>`
//! (ID: 10 lowercase letters and digits, as its system prompt asks; the template writes it back
//! as the id of the call and of its result).
//! The chat template shows the tools itself. Reasoning in `<think>` tags is split off before
//! `parse` sees the text.
//!
//! Streaming begins each call once its name is whole (R1: at the newline after it, V3.1 and
//! Kimi: at the separator) and streams its arguments as they are written; the block is whole at
//! its closing markup.
//!
//! Kimi's reading is as lenient as llama.cpp's handler for it: a call may come without the
//! section's opening (at a bare `<|tool_call_begin|>`), and without its `<|tool_call_end|>`
//! where the next call or the section's end follows.

use serde_json::Value;

use super::partial::{self, Json};
use super::{
    allowed_tools, arguments_schema, call_of, json_prefix, parse_blocks, parse_blocks_partial,
    tool_rules, BlockStep, Blocks, Format, LazyStart, Parsed, Plan, Tool, ToolCall, ToolRequest,
};

use muser_jsonschema::gbnf_literal as lit;

/// Which layout of a call: R1's (`function<｜tool▁sep｜>NAME` and a fenced JSON), V3.1's,
/// Kimi K2's or Solar Open's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Flavor {
    R1,
    V31,
    Kimi,
    Solar,
}

const CALLS_BEGIN: &str = "<｜tool▁calls▁begin｜>";
const CALLS_END: &str = "<｜tool▁calls▁end｜>";
const CALL_BEGIN: &str = "<｜tool▁call▁begin｜>";
const CALL_END: &str = "<｜tool▁call▁end｜>";
const SEP: &str = "<｜tool▁sep｜>";

/// The block's opening and the misspellings of it that the R1 distills are known to write
/// (read back as the opening; the grammar writes the right one). None is a prefix of another,
/// and each has its `<` only at its start.
const OPENINGS: &[&str] = &[
    CALLS_BEGIN,
    "<｜tool_calls_begin｜>",
    "<｜tool calls begin｜>",
    "<｜tool\\_calls\\_begin｜>",
    "<｜tool▁calls｜>",
];

const KIMI_CALLS_BEGIN: &str = "<|tool_calls_section_begin|>";
const KIMI_CALLS_END: &str = "<|tool_calls_section_end|>";
const KIMI_CALL_BEGIN: &str = "<|tool_call_begin|>";
const KIMI_CALL_END: &str = "<|tool_call_end|>";
const KIMI_SEP: &str = "<|tool_call_argument_begin|>";
/// What starts a Kimi call's name (and id).
const KIMI_PREFIX: &str = "functions.";

const SOLAR_CALLS_BEGIN: &str = "<|tool_calls|>";
const SOLAR_CALLS_END: &str = "<|calls|>";
const SOLAR_CALL_BEGIN: &str = "<|tool_call:begin|>";
const SOLAR_CALL_END: &str = "<|tool_call:end|>";
const SOLAR_SEP: &str = "<|tool_call:args|>";
/// What ends a Solar call's id and starts its name.
const SOLAR_NAME: &str = "<|tool_call:name|>";

/// The markup of a flavour.
pub(super) struct Marks {
    calls_begin: &'static str,
    calls_end: &'static str,
    call_begin: &'static str,
    call_end: &'static str,
    sep: &'static str,
    /// What opens a block (`parse_blocks`'s openings).
    openings: &'static [&'static str],
    /// A call may end without its `call_end` where the next call or the block's end follows.
    call_end_optional: bool,
}

const DEEPSEEK: Marks = Marks {
    calls_begin: CALLS_BEGIN,
    calls_end: CALLS_END,
    call_begin: CALL_BEGIN,
    call_end: CALL_END,
    sep: SEP,
    openings: OPENINGS,
    call_end_optional: false,
};

const KIMI: Marks = Marks {
    calls_begin: KIMI_CALLS_BEGIN,
    calls_end: KIMI_CALLS_END,
    call_begin: KIMI_CALL_BEGIN,
    call_end: KIMI_CALL_END,
    sep: KIMI_SEP,
    openings: &[KIMI_CALLS_BEGIN, KIMI_CALL_BEGIN],
    call_end_optional: true,
};

const SOLAR: Marks = Marks {
    calls_begin: SOLAR_CALLS_BEGIN,
    calls_end: SOLAR_CALLS_END,
    call_begin: SOLAR_CALL_BEGIN,
    call_end: SOLAR_CALL_END,
    sep: SOLAR_SEP,
    openings: &[SOLAR_CALLS_BEGIN],
    call_end_optional: false,
};

impl Flavor {
    fn marks(self) -> &'static Marks {
        match self {
            Flavor::R1 | Flavor::V31 => &DEEPSEEK,
            Flavor::Kimi => &KIMI,
            Flavor::Solar => &SOLAR,
        }
    }
}

pub(super) const LAZY_START: LazyStart = LazyStart::Word(CALLS_BEGIN);
pub(super) const MARKUP: &[&str] = &[CALLS_BEGIN, CALL_BEGIN, SEP, CALL_END, CALLS_END];
pub(super) const KIMI_LAZY_START: LazyStart = LazyStart::Word(KIMI_CALLS_BEGIN);
/// What ends Kimi K2's reasoning block left open, as llama.cpp's handler reads it: the calls'
/// section, or a call without one.
pub(super) const KIMI_REASONING_ENDS: &[&str] = &[KIMI_CALLS_BEGIN, KIMI_CALL_BEGIN];
pub(super) const KIMI_MARKUP: &[&str] = &[
    KIMI_CALLS_BEGIN,
    KIMI_CALL_BEGIN,
    KIMI_SEP,
    KIMI_CALL_END,
    KIMI_CALLS_END,
];
pub(super) const SOLAR_LAZY_START: LazyStart = LazyStart::Word(SOLAR_CALLS_BEGIN);
pub(super) const SOLAR_MARKUP: &[&str] = &[
    SOLAR_CALLS_BEGIN,
    SOLAR_CALL_BEGIN,
    SOLAR_NAME,
    SOLAR_SEP,
    SOLAR_CALL_END,
    SOLAR_CALLS_END,
];

/// The flavour of a template that renders a past call in the block: R1 when the call's
/// arguments are in a ```` ```json ```` fence (after `function<｜tool▁sep｜>NAME`), V3.1 when
/// they follow `NAME<｜tool▁sep｜>` bare, Kimi K2 for its markup. None for other templates, the
/// DSML ones (V3.2, V4) among them.
pub(super) fn detect(t: &str) -> Option<Format> {
    if t.contains(KIMI_CALLS_BEGIN) && t.contains(KIMI_CALL_BEGIN) {
        return Some(Format::KimiK2);
    }
    if t.contains(SOLAR_CALL_BEGIN) && t.contains(SOLAR_NAME) && t.contains(SOLAR_SEP) {
        return Some(Format::SolarOpen);
    }
    if !t.contains(CALLS_BEGIN) || !t.contains(SEP) || t.contains("DSML") {
        return None;
    }
    let mut bare = false;
    for (i, _) in t.match_indices(CALL_BEGIN) {
        let call = &t[i..];
        let call = &call[..call.find(CALL_END).unwrap_or(call.len())];
        if call.contains(SEP) {
            if call.contains("```json") {
                return Some(Format::DeepSeekR1);
            }
            bare = true;
        }
    }
    bare.then_some(Format::DeepSeekV31)
}

/// The block of one call (or, with `req.parallel`, of one or more) of the allowed tools, the
/// arguments held by each tool's schema, in the template's layout. Kimi's call
/// index is any number (the model counts the conversation's calls); Solar's id is 10 lowercase
/// letters and digits, as its system prompt asks.
pub(super) fn plan(req: &ToolRequest, flavor: Flavor) -> Result<Option<Plan>, String> {
    let m = flavor.marks();
    let Some((alts, rules)) = call_rules(req, |t, args| match flavor {
        Flavor::R1 => format!(
            "{} {args} {}",
            lit(&format!("{}\n```json\n", t.name)),
            lit("\n```")
        ),
        Flavor::V31 => format!("{} {args}", lit(&format!("{}{SEP}", t.name))),
        Flavor::Kimi => format!(
            "{} [0-9]{{1,6}} {} {args}",
            lit(&format!("{KIMI_PREFIX}{}:", t.name)),
            lit(KIMI_SEP)
        ),
        Flavor::Solar => format!(
            "[a-z0-9]{{10}} {} {args}",
            lit(&format!("{SOLAR_NAME}{}{SOLAR_SEP}", t.name))
        ),
    })?
    else {
        return Ok(None);
    };
    let head = match flavor {
        Flavor::R1 => format!("{CALL_BEGIN}function{SEP}"),
        Flavor::V31 | Flavor::Kimi | Flavor::Solar => m.call_begin.to_string(),
    };
    // The markup as the templates write it: back to back, R1's calls one a line (llama.cpp
    // reads no call with other whitespace between the tags).
    let more = match (req.parallel, flavor) {
        (false, _) => "",
        (true, Flavor::R1) => " ( \"\\n\" call )*",
        (true, _) => " ( call )*",
    };
    let gbnf = format!(
        "root ::= {} call{more} {}\n\
         call ::= {} ( {} ) {}\n{rules}",
        lit(m.calls_begin),
        lit(m.calls_end),
        lit(&head),
        alts,
        lit(m.call_end),
    );
    let start = match flavor {
        Flavor::Kimi => KIMI_LAZY_START,
        Flavor::Solar => SOLAR_LAZY_START,
        _ => LAZY_START,
    };
    Ok(Some(Plan::calls(gbnf, &req.choice, start)))
}

/// The GBNF rules of one call of each tool `req` allows, `call-I ::= BODY`, `body` laying out
/// the call of a tool around `args` (the rule of its arguments, held by its schema), with the
/// rules of the arguments; and the alternatives, `call-0 | call-1 | ...`. None where `req` asks
/// for no call.
pub(super) fn call_rules(
    req: &ToolRequest,
    body: impl Fn(&Tool, &str) -> String,
) -> Result<Option<(String, String)>, String> {
    let Some(tools) = allowed_tools(req)? else {
        return Ok(None);
    };
    let mut alts = Vec::with_capacity(tools.len());
    let mut rules = String::new();
    for (i, t) in tools.iter().enumerate() {
        let (args, r) = tool_rules(t, &arguments_schema(t), &format!("tool{i}-"))?;
        rules.push_str(&format!(
            "call-{i} ::= {}\n{}\n",
            body(t, &args),
            r.trim_end()
        ));
        alts.push(format!("call-{i}"));
    }
    Ok(Some((alts.join(" | "), rules)))
}

/// A function name as written in a call: no whitespace, no markup.
pub(super) fn read_name(s: &str) -> Option<&str> {
    let s = s.trim();
    (!s.is_empty() && !s.contains(|c: char| c.is_whitespace() || c == '<' || c == '`')).then_some(s)
}

/// The name of a call as its `head` (the text before the separator) gives it, and the id the
/// model wrote: Kimi's `functions.NAME:IDX` is both (NAME alone where the model left out the
/// prefix or the index; then no id). Solar's `ID<|tool_call:name|>NAME` gives the id before
/// the name (none where it is empty).
fn call_name(head: &str, flavor: Flavor) -> Option<(&str, Option<String>)> {
    if flavor == Flavor::Solar {
        let (id, name) = head.split_once(SOLAR_NAME)?;
        let id = id.trim();
        let id = (!id.is_empty()).then(|| id.to_string());
        return Some((read_name(name)?, id));
    }
    if flavor != Flavor::Kimi {
        return Some((read_name(head)?, None));
    }
    let h = head.trim();
    let body = h.strip_prefix(KIMI_PREFIX);
    let (name, index) = match body.unwrap_or(h).rsplit_once(':') {
        Some((n, i)) if !i.is_empty() && i.bytes().all(|b| b.is_ascii_digit()) => (n, true),
        _ => (body.unwrap_or(h), false),
    };
    let id = (body.is_some() && index).then(|| h.to_string());
    Some((read_name(name)?, id))
}

/// Whether a call of flavour `m` may end at the start of `rest` without its closing markup
/// (the next call or the block's end follows).
fn ends_unclosed(rest: &str, m: &Marks) -> bool {
    m.call_end_optional && (rest.starts_with(m.call_begin) || rest.starts_with(m.calls_end))
}

/// A call of `name` with its arguments (a JSON object, in a ```` ```json ```` fence or not) up
/// to the call's end (its closing markup, or the end of the text), and the text after the
/// call.
fn read_args<'t>(name: &str, s: &'t str, m: &Marks) -> Option<(ToolCall, &'t str)> {
    let s = s.trim_start();
    let (fenced, s) = match s.strip_prefix("```json").or_else(|| s.strip_prefix("```")) {
        Some(rest) => (true, rest),
        None => (false, s),
    };
    let (v, used) = json_prefix(s)?;
    let call = call_of(name, &v)?;
    let mut rest = s[used..].trim_start();
    if fenced {
        rest = rest.strip_prefix("```")?.trim_start();
    }
    let rest = match rest.strip_prefix(m.call_end) {
        Some(r) => r,
        None if rest.is_empty() || ends_unclosed(rest, m) => rest,
        None => return None,
    };
    Some((call, rest))
}

/// One call at the start of `s` (its opening markup may be missing): the call and the text
/// after it.
fn read_one(s: &str, flavor: Flavor) -> Option<(ToolCall, &str)> {
    let m = flavor.marks();
    let s = s.strip_prefix(m.call_begin).unwrap_or(s);
    let (head, after) = match flavor {
        Flavor::R1 => {
            let s = s.strip_prefix("function")?.strip_prefix(SEP)?;
            let nl = s.find('\n')?;
            (&s[..nl], &s[nl + 1..])
        }
        Flavor::V31 | Flavor::Kimi | Flavor::Solar => s.split_once(m.sep)?,
    };
    let (name, id) = call_name(head, flavor)?;
    let (call, rest) = read_args(name, after, m)?;
    Some((ToolCall { id, ..call }, rest))
}

/// The calls of the block whose opening ends right before `s`, and the text after the block
/// (after its closing markup, or at the end of the text for an unclosed block). None when the
/// block is malformed or has no call.
fn read_block(s: &str, flavor: Flavor) -> Option<(Vec<ToolCall>, &str)> {
    let mut calls = Vec::new();
    let mut rest = s;
    loop {
        let t = rest.trim_start();
        if let Some(after) = t.strip_prefix(flavor.marks().calls_end) {
            return (!calls.is_empty()).then_some((calls, after));
        }
        if t.is_empty() {
            return (!calls.is_empty()).then_some((calls, t));
        }
        let (call, after) = read_one(t, flavor)?;
        calls.push(call);
        rest = after;
    }
}

/// Content is the text with the well-formed blocks taken out, its trailing whitespace
/// trimmed; malformed blocks stay in it.
pub(super) fn parse(text: &str, req: Option<&ToolRequest>, flavor: Flavor) -> Parsed {
    parse_blocks(text, req, flavor.marks().openings, |after| {
        let (calls, rest) = read_block(after, flavor)?;
        Some((calls, after.len() - rest.len()))
    })
}

/// How a text goes on at a piece of markup.
enum Markup<'s> {
    /// It has the markup: the text after it.
    Past(&'s str),
    /// It is a start of the markup (or empty): the markup may be coming.
    Inside,
    /// It is something else.
    Not,
}

/// How `s` goes on at the markup `m`.
fn markup<'s>(s: &'s str, m: &str) -> Markup<'s> {
    match s.strip_prefix(m) {
        Some(rest) => Markup::Past(rest),
        None if m.starts_with(s) => Markup::Inside,
        None => Markup::Not,
    }
}

/// How far streaming has read one call of a block.
enum CallStep<'s> {
    /// Read through its end: the call (as `read_one` reads it), and the text after it.
    Done(ToolCall, &'s str),
    /// The text ends inside the call: the call, once begun.
    Open(Option<ToolCall>),
    /// The call stopped being well formed: the call, if it was begun.
    Broken(Option<ToolCall>),
}

/// The call of `name` (with the id the model wrote), begun: its arguments (a JSON object, in a
/// ```` ```json ```` fence or not, as `read_args` reads them) as far as they are written in
/// `s`.
fn read_args_partial<'s>(
    name: &str,
    id: Option<String>,
    s: &'s str,
    m: &Marks,
    memo: &mut partial::Memo,
) -> CallStep<'s> {
    let mut call = ToolCall {
        id,
        name: name.to_string(),
        arguments: String::new(),
    };
    let s = s.trim_start();
    let (fenced, body) = match markup(s, "```json") {
        Markup::Past(rest) => (true, rest),
        // a fence may be coming (```` ``` ```` alone is read as one once something else follows)
        Markup::Inside => return CallStep::Open(Some(call)),
        Markup::Not => match s.strip_prefix("```") {
            Some(rest) => (true, rest),
            None => (false, s),
        },
    };
    let r = partial::read_on(body, memo);
    call.arguments = r.json.stable_object_on(Some(memo));
    let end = match r.json {
        Json::Whole(Value::Object(_), end) => end,
        Json::Whole(..) => return CallStep::Broken(Some(call)),
        Json::Open(_) if r.broken => return CallStep::Broken(Some(call)),
        Json::Open(_) => return CallStep::Open(Some(call)),
    };
    let mut rest = body[end..].trim_start();
    if fenced {
        rest = match markup(rest, "```") {
            Markup::Past(after) => after.trim_start(),
            Markup::Inside => return CallStep::Open(Some(call)),
            Markup::Not => return CallStep::Broken(Some(call)),
        };
    }
    match markup(rest, m.call_end) {
        Markup::Past(after) => CallStep::Done(call, after),
        // the call's end may be coming (a call unclosed at the end of the text is read too)
        Markup::Inside => CallStep::Open(Some(call)),
        Markup::Not if ends_unclosed(rest, m) => CallStep::Done(call, rest),
        Markup::Not
            if m.call_end_optional
                && [m.call_begin, m.calls_end]
                    .iter()
                    .any(|k| k.starts_with(rest)) =>
        {
            CallStep::Open(Some(call))
        }
        Markup::Not => CallStep::Broken(Some(call)),
    }
}

/// How far streaming has read the call at the start of `t` (not empty; its opening markup may
/// be missing, as `read_one` reads it). The call is begun once its name is whole: R1's at the
/// newline after it, V3.1's and Kimi's at the separator after it.
fn read_one_partial<'t>(t: &'t str, flavor: Flavor, memo: &mut partial::Memo) -> CallStep<'t> {
    let m = flavor.marks();
    let s = match markup(t, m.call_begin) {
        Markup::Past(rest) => rest,
        Markup::Inside => return CallStep::Open(None),
        Markup::Not => t,
    };
    let (head, after) = match flavor {
        Flavor::R1 => {
            let mut s = s;
            for m in ["function", SEP] {
                s = match markup(s, m) {
                    Markup::Past(rest) => rest,
                    Markup::Inside => return CallStep::Open(None),
                    Markup::Not => return CallStep::Broken(None),
                };
            }
            match s.find('\n') {
                Some(nl) => (&s[..nl], &s[nl + 1..]),
                None => return CallStep::Open(None),
            }
        }
        Flavor::V31 | Flavor::Kimi | Flavor::Solar => match s.split_once(m.sep) {
            Some(split) => split,
            None => return CallStep::Open(None),
        },
    };
    match call_name(head, flavor) {
        Some((name, id)) => read_args_partial(name, id, after, m, memo),
        None => CallStep::Broken(None),
    }
}

/// How far streaming has read the block whose opening ends right before `s`: its calls one by
/// one, each begun once its name is whole and its arguments growing as they are written; the
/// block is whole at its closing markup (an unclosed block stays open: more calls may come).
fn read_block_partial(s: &str, flavor: Flavor, memo: &mut partial::Memo) -> BlockStep {
    let mut calls = Vec::new();
    let mut rest = s;
    loop {
        let t = rest.trim_start();
        match markup(t, flavor.marks().calls_end) {
            Markup::Past(_) => {
                return match read_block(s, flavor) {
                    Some((whole, after)) => BlockStep::Whole(whole, s.len() - after.len()),
                    None => BlockStep::Broken(calls),
                }
            }
            Markup::Inside => return BlockStep::Open(calls),
            Markup::Not => {}
        }
        match read_one_partial(t, flavor, memo) {
            CallStep::Done(call, after) => {
                calls.push(call);
                rest = after;
            }
            CallStep::Open(call) => {
                calls.extend(call);
                return BlockStep::Open(calls);
            }
            CallStep::Broken(call) => {
                calls.extend(call);
                return BlockStep::Broken(calls);
            }
        }
    }
}

/// Content up to the first block opening, less a tail that may be the start of one, and less
/// trailing whitespace (which `parse` trims when a block follows it); the calls begun.
pub(super) fn parse_partial(
    text: &str,
    req: Option<&ToolRequest>,
    flavor: Flavor,
    from: &mut Blocks,
) -> Parsed {
    let read = |after: &str, memo: &mut partial::Memo| read_block_partial(after, flavor, memo);
    parse_blocks_partial(text, req, flavor.marks().openings, read, from)
}

#[cfg(test)]
mod tests {
    use super::super::test_util::*;
    use super::super::{ToolChoice, Trigger};
    use super::*;
    use muser_sample::Grammar;
    use serde_json::{json, Value};

    const FLAVORS: [(Flavor, Format); 2] = [
        (Flavor::R1, Format::DeepSeekR1),
        (Flavor::V31, Format::DeepSeekV31),
    ];

    /// What the template writes between two calls: R1's a newline, V3.1's nothing.
    fn template_sep(flavor: Flavor) -> &'static str {
        if flavor == Flavor::R1 {
            "\n"
        } else {
            ""
        }
    }

    /// A block as the templates render it: `sep` between the calls, the arguments as given.
    fn render(flavor: Flavor, calls: &[(&str, String)], sep: &str) -> String {
        let calls: Vec<String> = calls
            .iter()
            .map(|(n, a)| match flavor {
                Flavor::R1 => {
                    format!("{CALL_BEGIN}function{SEP}{n}\n```json\n{a}\n```{CALL_END}")
                }
                Flavor::V31 => format!("{CALL_BEGIN}{n}{SEP}{a}{CALL_END}"),
                Flavor::Kimi => format!("{KC}functions.{n}:0{KS}{a}{KX}"),
                Flavor::Solar => format!(
                    "{SOLAR_CALL_BEGIN}abc0123456{SOLAR_NAME}{n}{SOLAR_SEP}{a}{SOLAR_CALL_END}"
                ),
            })
            .collect();
        let m = flavor.marks();
        format!("{}{}{}", m.calls_begin, calls.join(sep), m.calls_end)
    }

    /// Random tools and calls, both flavours: the grammar takes the rendered blocks (several
    /// argument layouts and separators), `parse` gives the calls back; wrong names, broken
    /// arguments, extra calls and unclosed blocks are refused.
    #[test]
    fn deepseek_grammar_accepts_calls_and_refuses_wrong_ones() {
        let mut rng = Rng(0xDEE5_0001);
        for round in 0..80 {
            let (flavor, format) = FLAVORS[round % 2];
            let r = random_req(&mut rng, round, round % 4 >= 2);
            let (p, g) = checked_plan(format, &r, Trigger::Word(CALLS_BEGIN.into()));
            let calls = random_calls(&mut rng, &r);
            for layout in 0..4 {
                let laid: Vec<(&str, String)> = calls
                    .iter()
                    .map(|(t, a)| (t.name.as_str(), layouts(a)[layout].clone()))
                    .collect();
                // (the grammar writes the template's separator only; the reading takes any)
                let sep = ["\n", "", "\n\n", " "][layout];
                let text = render(flavor, &laid, sep);
                let templated = calls.len() < 2 || sep == template_sep(flavor);
                assert_eq!(
                    g.accepts_str(&text),
                    templated,
                    "round {round}: {text}\n{}",
                    p.gbnf
                );
                let parsed = format.parse(&text, Some(&r));
                assert_eq!(parsed.content, "");
                assert_eq!(parsed.reasoning, None);
                assert_eq!(parsed.tool_calls.len(), calls.len());
                for (c, (t, a)) in parsed.tool_calls.iter().zip(&calls) {
                    assert_call(c, &t.name, a, None);
                }
                check_stream_calls(format, &text, &r);
                if !templated {
                    continue;
                }
                // text before the block is kept, nothing may follow it; it must be closed
                check_text_around(format, &r, &g, &text, calls.len());
                assert!(!g.accepts_str(text.strip_suffix(CALLS_END).unwrap()));
                assert!(!g.accepts_str(&format!("Hi {text}")));
            }
            assert!(!g.accepts_str(""));
            assert!(!g.accepts_str("Hello"));
            assert!(!g.accepts_str(&format!("{CALLS_BEGIN}{CALLS_END}")));
            let (t, a) = &calls[0];
            let one = (t.name.as_str(), a.to_string());
            let single = render(flavor, std::slice::from_ref(&one), "");
            assert!(g.accepts_str(&single));
            let two = render(flavor, &[one.clone(), one.clone()], template_sep(flavor));
            assert_eq!(g.accepts_str(&two), r.parallel);
            // whitespace where the template writes none
            let spaced = render(flavor, std::slice::from_ref(&one), "")
                .replace(CALL_END, &format!(" {CALL_END}"));
            assert!(!g.accepts_str(&spaced), "{spaced}");
            // the other flavour's layout
            let other = if flavor == Flavor::R1 {
                Flavor::V31
            } else {
                Flavor::R1
            };
            assert!(!g.accepts_str(&render(other, std::slice::from_ref(&one), "")));
            // the call unclosed, a misspelled opening
            assert!(!g.accepts_str(&single.replacen(CALL_END, "", 1)));
            assert!(!g.accepts_str(&single.replacen(CALLS_BEGIN, OPENINGS[1], 1)));
            // a tool that is not allowed
            let unknown = render(flavor, &[("no_such_tool", "{}".into())], "");
            assert!(!g.accepts_str(&unknown));
            if let Some((o, oa)) = other_tool(&mut rng, &r) {
                let b = render(flavor, &[(o.name.as_str(), oa.to_string())], "");
                assert!(!g.accepts_str(&b), "other tool taken: {b}");
            }
            // arguments that break the schema
            check_broken_args(&mut rng, &g, t, a, |bad| {
                render(flavor, &[(t.name.as_str(), bad.to_string())], "")
            });
        }
    }

    /// What DeepSeek R1 Distill Qwen 32B's template renders for two calls in the history
    /// (rendered with jinja2 and transformers' `tojson`; llama.cpp's `llama-cpp-deepseek-r1`
    /// renders the same), ended by `<｜end▁of▁sentence｜>`.
    const R1_TEMPLATE_TEXT: &str = "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n{\"unit\": \"celsius\", \"city\": \"Pa\\\"ris <x> é\\n\", \"days\": 3, \"detail\": {\"hourly\": true, \"tags\": [\"a\", \"b\"]}}\n```<｜tool▁call▁end｜>\n<｜tool▁call▁begin｜>function<｜tool▁sep｜>ping\n```json\n{}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜><｜end▁of▁sentence｜>";

    /// R1 Distill Llama 8B's template for one call (its arguments given as the JSON string):
    /// it writes no `<｜tool▁calls▁end｜>` after a single call.
    const R1_LLAMA_TEMPLATE_TEXT: &str = "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n{\"unit\": \"celsius\", \"city\": \"Pa\\\"ris <x> \\u00e9\\n\", \"days\": 3, \"detail\": {\"hourly\": true, \"tags\": [\"a\", \"b\"]}}\n```<｜tool▁call▁end｜>";

    /// DeepSeek V3.1's template for the same two calls, and for one call after content.
    const V31_TEMPLATE_TEXT: &str = "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{\"unit\": \"celsius\", \"city\": \"Pa\\\"ris <x> é\\n\", \"days\": 3, \"detail\": {\"hourly\": true, \"tags\": [\"a\", \"b\"]}}<｜tool▁call▁end｜><｜tool▁call▁begin｜>ping<｜tool▁sep｜>{}<｜tool▁call▁end｜><｜tool▁calls▁end｜><｜end▁of▁sentence｜>";
    const V31_CONTENT_TEMPLATE_TEXT: &str = "Let me check.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>ping<｜tool▁sep｜>{}<｜tool▁call▁end｜><｜tool▁calls▁end｜><｜end▁of▁sentence｜>";

    const EOS: &str = "<｜end▁of▁sentence｜>";

    fn calls(names: &[&str]) -> Vec<ToolCall> {
        names
            .iter()
            .map(|n| ToolCall {
                id: None,
                name: n.to_string(),
                arguments: if *n == "ping" { "{}" } else { WEATHER_ARGS }.into(),
            })
            .collect()
    }

    #[test]
    fn deepseek_template_renderings_are_accepted_and_read_back() {
        for (flavor, format, text) in [
            (Flavor::R1, Format::DeepSeekR1, R1_TEMPLATE_TEXT),
            (Flavor::V31, Format::DeepSeekV31, V31_TEMPLATE_TEXT),
        ] {
            let body = text.strip_suffix(EOS).unwrap();
            // the test renderer writes the same text
            let args = serde_json::from_str::<Value>(WEATHER_ARGS).unwrap();
            let laid = [
                ("get_weather", python_json(&args, false)),
                ("ping", "{}".into()),
            ];
            let sep = if flavor == Flavor::R1 { "\n" } else { "" };
            assert_eq!(render(flavor, &laid, sep), body);
            for choice in [ToolChoice::Auto, ToolChoice::Required] {
                let r = req(weather_tools(), choice, true);
                let g = Grammar::parse(&format.plan(&r).unwrap().unwrap().gbnf).unwrap();
                assert!(g.accepts_str(body), "{flavor:?}");
                let p = format.parse(body, Some(&r));
                assert_eq!(p.content, "");
                assert_eq!(p.tool_calls, calls(&["get_weather", "ping"]));
                check_stream_calls(format, body, &r);
            }
            // two calls are refused when parallel calls are off
            let r = req(weather_tools(), ToolChoice::Auto, false);
            let g = Grammar::parse(&format.plan(&r).unwrap().unwrap().gbnf).unwrap();
            assert!(!g.accepts_str(body));
        }
        // V3.1 after content: the content is kept
        let r = req(weather_tools(), ToolChoice::Auto, false);
        let text = V31_CONTENT_TEMPLATE_TEXT.strip_suffix(EOS).unwrap();
        let p = Format::DeepSeekV31.parse(text, Some(&r));
        assert_eq!(p.content, "Let me check.");
        assert_eq!(p.tool_calls, calls(&["ping"]));
        let g = Grammar::parse(&Format::DeepSeekV31.plan(&r).unwrap().unwrap().gbnf).unwrap();
        assert!(g.accepts_str(&text["Let me check.".len()..]));
        // R1 Distill Llama's unclosed block is read, though the grammar closes it
        let p = Format::DeepSeekR1.parse(R1_LLAMA_TEMPLATE_TEXT, Some(&r));
        assert_eq!(
            (p.content.as_str(), p.tool_calls),
            ("", calls(&["get_weather"]))
        );
        // (streamed to the end, where the call's arguments are whole but the block still open)
        check_stream_calls(Format::DeepSeekR1, R1_LLAMA_TEMPLATE_TEXT, &r);
        let g = Grammar::parse(&Format::DeepSeekR1.plan(&r).unwrap().unwrap().gbnf).unwrap();
        assert!(!g.accepts_str(R1_LLAMA_TEMPLATE_TEXT));
        assert!(g.accepts_str(&format!("{R1_LLAMA_TEMPLATE_TEXT}{CALLS_END}")));
    }

    #[test]
    fn deepseek_parse_cases() {
        let r = f_req(true);
        let r1 = |name: &str, args: &str| {
            format!("{CALL_BEGIN}function{SEP}{name}\n```json\n{args}\n```{CALL_END}")
        };
        let v31 = |name: &str, args: &str| format!("{CALL_BEGIN}{name}{SEP}{args}{CALL_END}");
        let block = |calls: &[String]| format!("{CALLS_BEGIN}{}{CALLS_END}", calls.concat());
        let s = |x: &str| x.to_string();
        let mut cases: Vec<(Flavor, String, String, Vec<ToolCall>)> = vec![
            (Flavor::R1, s("Hello \n"), s("Hello"), vec![]),
            (
                Flavor::R1,
                format!("Hi\n{}", block(&[r1("f", r#"{"a": 1}"#)])),
                s("Hi"),
                vec![call("f", r#"{"a":1}"#)],
            ),
            // the call's opening missing, pretty arguments, a newline before the call's end
            (
                Flavor::R1,
                format!(
                    "{CALLS_BEGIN}function{SEP}f\n```json\n{{\n  \"a\": [1]\n}}\n```\n{CALL_END}{CALLS_END}"
                ),
                s(""),
                vec![call("f", r#"{"a":[1]}"#)],
            ),
            // no fence
            (
                Flavor::R1,
                format!("{CALLS_BEGIN}{CALL_BEGIN}function{SEP}f\n{{}}{CALL_END}{CALLS_END}"),
                s(""),
                vec![call("f", "{}")],
            ),
            // unclosed block at the end, unclosed call at the end
            (
                Flavor::R1,
                format!("{CALLS_BEGIN}{}\n", r1("f", "{}")),
                s(""),
                vec![call("f", "{}")],
            ),
            (
                Flavor::V31,
                format!("{CALLS_BEGIN}{CALL_BEGIN}f{SEP}{{\"b\": 2}}"),
                s(""),
                vec![call("f", r#"{"b":2}"#)],
            ),
            // misspelled openings are read
            (
                Flavor::R1,
                format!("<｜tool calls begin｜>{}{CALLS_END}", r1("g", "{}")),
                s(""),
                vec![call("g", "{}")],
            ),
            (
                Flavor::V31,
                format!("A <｜tool▁calls｜>{}{CALLS_END}", v31("g", "{}")),
                s("A"),
                vec![call("g", "{}")],
            ),
            // an empty block, a fence never closed, arguments not an object, no type: content
            (
                Flavor::R1,
                format!("{CALLS_BEGIN}{CALLS_END}"),
                format!("{CALLS_BEGIN}{CALLS_END}"),
                vec![],
            ),
            (
                Flavor::R1,
                format!("{CALLS_BEGIN}{CALL_BEGIN}function{SEP}f\n```json\n{{}}{CALL_END}{CALLS_END}"),
                format!("{CALLS_BEGIN}{CALL_BEGIN}function{SEP}f\n```json\n{{}}{CALL_END}{CALLS_END}"),
                vec![],
            ),
            (
                Flavor::V31,
                block(&[v31("f", "[1]")]),
                block(&[v31("f", "[1]")]),
                vec![],
            ),
            (
                Flavor::R1,
                block(&[v31("f", "{}")]),
                block(&[v31("f", "{}")]),
                vec![],
            ),
            (
                Flavor::V31,
                block(&[r1("f", "{}")]),
                block(&[r1("f", "{}")]),
                vec![],
            ),
            // JSON unfinished
            (
                Flavor::V31,
                format!("{CALLS_BEGIN}{CALL_BEGIN}f{SEP}{{\"a\": "),
                format!("{CALLS_BEGIN}{CALL_BEGIN}f{SEP}{{\"a\":"),
                vec![],
            ),
            // text after the arguments, inside the call
            (
                Flavor::V31,
                block(&[v31("f", "{} x")]),
                block(&[v31("f", "{} x")]),
                vec![],
            ),
            // a bad block stays; a good one after it is read
            (
                Flavor::V31,
                format!("{CALLS_BEGIN}oops{CALLS_END} {}", block(&[v31("f", "{}")])),
                format!("{CALLS_BEGIN}oops{CALLS_END}"),
                vec![call("f", "{}")],
            ),
            // markup inside a string argument; several calls; text after the block
            (
                Flavor::V31,
                format!(
                    "{} and more\n",
                    block(&[
                        v31("f", &format!("{{\"s\": \"{CALL_END}{CALLS_END}\"}}")),
                        v31("g", "{}")
                    ])
                ),
                s(" and more"),
                vec![
                    call("f", &format!("{{\"s\":\"{CALL_END}{CALLS_END}\"}}")),
                    call("g", "{}"),
                ],
            ),
            (
                Flavor::R1,
                block(&[r1("f", "{}"), s("\n"), r1("g", r#"{"x": "```"}"#)]),
                s(""),
                vec![call("f", "{}"), call("g", r#"{"x":"```"}"#)],
            ),
        ];
        // a name with a space is no name
        cases.push((
            Flavor::V31,
            block(&[v31("a b", "{}")]),
            block(&[v31("a b", "{}")]),
            vec![],
        ));
        for (flavor, text, content, calls) in &cases {
            let p = parse(text, Some(&r), *flavor);
            check_parsed(&p, content, calls, &format!("{flavor:?} {text}"));
        }
        // no tools or tool_choice none: the text as is
        let t = format!("Hi {}\n", block(&[v31("f", "{}")]));
        let none = req(r.tools.clone(), ToolChoice::None, false);
        for (flavor, format) in FLAVORS {
            check_verbatim(format, &t, &r.tools);
            assert_eq!(plan(&none, flavor).unwrap(), None);
        }
        // partial
        for (t, c) in [
            ("Hi <", "Hi"),
            ("Hi <｜", "Hi"),
            ("Hi <｜tool", "Hi"),
            ("Hi <｜tool▁calls", "Hi"),
            ("Hi <｜tool calls beg", "Hi"),
            ("Hi <｜tool\\_", "Hi"),
            ("Hi <｜tool▁calls▁begin｜>", "Hi"),
            ("Hi <｜tool▁calls｜>x", "Hi"),
            ("Hi <｜tool▁call▁begin｜>", "Hi <｜tool▁call▁begin｜>"),
            ("Hi <｜User｜>", "Hi <｜User｜>"),
            ("a < b", "a < b"),
            ("a\n\n", "a"),
            ("", ""),
        ] {
            for (_, format) in FLAVORS {
                let p = format.parse_partial(t, Some(&r));
                check_parsed(&p, c, &[], t);
            }
        }
    }

    /// For every text built from the format's pieces and every prefix of it, what streaming
    /// sends is a prefix of what the finished text gives, and is never taken back.
    #[test]
    fn deepseek_partial_is_prefix_of_parse() {
        let r = f_req(true);
        let frags = [
            "a",
            " ",
            "\n",
            "<",
            "<｜",
            "<｜tool",
            "<｜tool▁calls",
            CALLS_BEGIN,
            CALLS_END,
            CALL_BEGIN,
            CALL_END,
            SEP,
            "<｜tool calls begin｜>",
            "<｜tool▁calls｜>",
            "function",
            "f\n",
            "f",
            "```json\n",
            "\n```",
            "{}",
            "{\"a\": 1}",
            "{\"s\": \"<｜tool▁calls▁end｜>\"}",
            "{",
            "é",
            "zz",
            "<｜tool▁call▁begin｜>zz<｜tool▁sep｜>{}<｜tool▁call▁end｜>",
            "<｜tool▁call▁begin｜>function<｜tool▁sep｜>zz\n```json\n{}\n```<｜tool▁call▁end｜>",
            "<｜tool▁call▁begin｜>function<｜tool▁sep｜>g\n```json\n{\"c\": \"\\u00e9\"}\n```<｜tool▁call▁end｜>",
            "<｜tool▁call▁begin｜>g<｜tool▁sep｜>{\"c\": [\"x\", 1.5]}<｜tool▁call▁end｜>",
            "<｜tool▁call▁begin｜>function<｜tool▁sep｜>f\n```json\n{}\n```<｜tool▁call▁end｜>",
            "<｜tool▁call▁begin｜>f<｜tool▁sep｜>{\"b\": [2]}<｜tool▁call▁end｜>",
        ];
        let mut rng = Rng(0xDEE5_0002);
        let (mut checked, mut calls, mut begun) = (0usize, 0usize, 0usize);
        for _ in 0..3000 {
            let mut t: String = (0..rng.below(8))
                .map(|_| frags[rng.below(frags.len())])
                .collect();
            if rng.below(3) == 0 {
                // a whole block of either flavour's calls, closed or not, after the text
                let n = 1 + rng.below(3);
                let calls: String = (0..n)
                    .map(|_| frags[frags.len() - 6 + rng.below(6)])
                    .collect();
                let close = [CALLS_END, "", "\n"][rng.below(3)];
                t = format!("{t}{}{calls}{close}", OPENINGS[rng.below(OPENINGS.len())]);
            }
            for (_, format) in FLAVORS {
                for req in [Some(&r), None] {
                    let (full, n) = check_partial_prefixes(format, &t, req);
                    calls += full.tool_calls.len();
                    begun += format.parse_partial(&t, req).tool_calls.len();
                    checked += n;
                }
            }
        }
        assert!(
            checked > 20_000 && calls > 300 && begun > 500,
            "{checked} {calls} {begun}"
        );
    }

    /// Calls streamed as they are written: each begun once its name is whole (R1: at the
    /// newline, V3.1: at the separator), its arguments as far as they are known; the block
    /// whole at `<｜tool▁calls▁end｜>`.
    #[test]
    fn deepseek_partial_streams_calls() {
        let r = f_req(true);
        let open = format!("Hi {CALLS_BEGIN}{CALL_BEGIN}");
        let pe = "{\"a\": [1, \"P\\u00e9";
        let r1 = |rest: &str| format!("{open}function{SEP}{rest}");
        let v31 = |rest: &str| format!("{open}{rest}");
        let sep = SEP.strip_suffix("｜>").unwrap();
        let cases: Vec<(Flavor, String, Vec<ToolCall>)> = vec![
            (Flavor::R1, r1("f"), vec![]),
            (Flavor::R1, format!("{open}function{sep}"), vec![]),
            (Flavor::R1, r1("f\n"), vec![call("f", "")]),
            (Flavor::R1, r1("f\n```js"), vec![call("f", "")]),
            (
                Flavor::R1,
                r1(&format!("f\n```json\n{pe}")),
                vec![call("f", "{\"a\":[1,\"Pé")],
            ),
            (Flavor::R1, r1("f\n{\"a\": 1"), vec![call("f", "{\"a\":")]),
            // a call unclosed so far has its arguments whole
            (
                Flavor::R1,
                r1("f\n```json\n{\"a\": 1}\n``"),
                vec![call("f", r#"{"a":1}"#)],
            ),
            (
                Flavor::R1,
                r1(&format!(
                    "f\n```json\n{{\"a\": 1}}\n```{CALL_END}\n{CALL_BEGIN}function{SEP}g\n"
                )),
                vec![call("f", r#"{"a":1}"#), call("g", "")],
            ),
            (Flavor::V31, v31("f"), vec![]),
            (Flavor::V31, v31(&format!("f{sep}")), vec![]),
            (Flavor::V31, v31(&format!("f{SEP}")), vec![call("f", "")]),
            (
                Flavor::V31,
                v31(&format!("f{SEP}{pe}")),
                vec![call("f", "{\"a\":[1,\"Pé")],
            ),
            (
                Flavor::V31,
                v31(&format!(
                    "f{SEP}{{}}{CALL_END}{CALL_BEGIN}g{SEP}{{\"c\": tr"
                )),
                vec![call("f", "{}"), call("g", "{\"c\":")],
            ),
            (
                Flavor::V31,
                format!("Hi <｜tool calls begin｜>{CALL_BEGIN}f{SEP}{{\"b\": \"x"),
                vec![call("f", "{\"b\":\"x")],
            ),
            // a tool not offered is not begun, nor anything after it
            (Flavor::V31, v31(&format!("zz{SEP}{{")), vec![]),
            (
                Flavor::V31,
                v31(&format!(
                    "f{SEP}{{}}{CALL_END}{CALL_BEGIN}zz{SEP}{{}}{CALL_END}{CALL_BEGIN}g{SEP}{{"
                )),
                vec![call("f", "{}")],
            ),
            // broken after it was begun: the call stays as far as it was read
            (
                Flavor::V31,
                v31(&format!("f{SEP}{{\"a\": 1}} x{CALL_END}")),
                vec![call("f", r#"{"a":1}"#)],
            ),
            (Flavor::V31, v31(&format!("f{SEP}[1]")), vec![call("f", "")]),
            // a repeated key keeps its first value (as `parse` reads it)
            (
                Flavor::V31,
                v31(&format!(
                    "f{SEP}{{\"a\": 1, \"b\": [{{\"c\": 2, \"c\": 3}}]}}{CALL_END}"
                )),
                vec![call("f", r#"{"a":1,"b":[{"c":2}]}"#)],
            ),
            (Flavor::R1, v31("f\n{}"), vec![]),
        ];
        for (flavor, t, calls) in &cases {
            let p = parse_partial(t, Some(&r), *flavor, &mut Blocks::default());
            check_parsed(&p, "Hi", calls, &format!("{flavor:?} {t}"));
        }
        // A whole block with a tool not offered after one that is: `parse` leaves it in the
        // content, but the call streamed before it stands.
        let t = format!(
            "{CALLS_BEGIN}{CALL_BEGIN}f{SEP}{{}}{CALL_END}{CALL_BEGIN}zz{SEP}{{}}{CALL_END}{CALLS_END}"
        );
        let fmt = Format::DeepSeekV31;
        assert!(fmt.parse(&t, Some(&r)).tool_calls.is_empty());
        assert_eq!(
            fmt.parse_partial(&t, Some(&r)).tool_calls,
            [call("f", "{}")]
        );
        assert_eq!(fmt.parse_final(&t, Some(&r)).tool_calls, [call("f", "{}")]);
        // one not offered first: passed over as `parse` does, the next block read
        let t = format!(
            "{CALLS_BEGIN}{CALL_BEGIN}zz{SEP}{{}}{CALL_END}{CALLS_END}{CALLS_BEGIN}{CALL_BEGIN}g{SEP}{{}}{CALL_END}{CALLS_END}"
        );
        assert_eq!(fmt.parse(&t, Some(&r)).tool_calls, [call("g", "{}")]);
        check_stream_calls(fmt, &t, &r);
    }

    /// Well-formed blocks (calls of offered tools and of one not offered, closed or not) with a
    /// few random edits, as a model without a grammar may slip: streaming never takes back what
    /// it sent, and the final reading goes on from it.
    #[test]
    fn deepseek_partial_mutated_outputs() {
        let r = f_req(true);
        let args = [
            json!({"a": [1, "Pé\"", {"b": null}], "c": -1.5e3, "d": "x"}),
            json!({}),
            json!({"s": format!("```{CALL_END}{CALLS_END}"), "t": true}),
            json!({"n": {"m": {"k": "😀"}}}),
        ];
        let pieces = [
            CALLS_BEGIN,
            CALLS_END,
            CALL_BEGIN,
            CALL_END,
            SEP,
            "<｜tool",
            "▁",
            "｜>",
            "```",
            "`",
            "\n",
            "{",
            "}",
            "\"",
            ",",
            " ",
            "\u{3000}",
            "zz",
            "1",
            "x",
            "é",
            "\\",
            "\"a\": 0, ",
            ", \"c\": [2]",
            "function",
            "<",
        ];
        let mut rng = Rng(0xDEE5_0003);
        let (mut checked, mut begun) = (0usize, 0usize);
        for round in 0..400 {
            let calls: Vec<(&str, String)> = (0..1 + rng.below(3))
                .map(|_| {
                    let n = ["f", "g", "zz", "f.x-y_2"][rng.below(4)];
                    let l = layouts(&args[rng.below(args.len())]);
                    (n, l[rng.below(l.len())].clone())
                })
                .collect();
            for (flavor, format) in FLAVORS {
                let mut t = format!("Hi {}", render(flavor, &calls, ["", "\n", " "][round % 3]));
                if round % 5 == 0 {
                    t.truncate(t.len() - CALLS_END.len());
                }
                if rng.below(4) == 0 {
                    // a repeated key ("c" comes before "d"), in whatever layout
                    t = t.replacen("\"d\"", "\"c\": 0, \"d\"", 1);
                }
                for _ in 0..rng.below(4) {
                    mutate(&mut rng, &mut t, &pieces, 60);
                }
                checked += check_partial_prefixes(format, &t, Some(&r)).1;
                begun += format.parse_partial(&t, Some(&r)).tool_calls.len();
            }
        }
        assert!(checked > 100_000 && begun > 500, "{checked} {begun}");
    }

    #[test]
    fn deepseek_plan_errors() {
        let bad = tool(
            "bad",
            json!({"type": "object", "properties": {"x": {"$ref": "#/$defs/missing"}}}),
        );
        for (flavor, _) in FLAVORS {
            let e = plan(&req(vec![bad.clone()], ToolChoice::Auto, false), flavor).unwrap_err();
            assert!(e.contains("`bad`"), "{e}");
            let f = tool("f", json!({"type": "object"}));
            let e = plan(
                &req(vec![f], ToolChoice::Function("g".into()), false),
                flavor,
            )
            .unwrap_err();
            assert!(e.contains("`g`"), "{e}");
        }
    }

    /// Of llama.cpp's templates, the R1 ones (its distills and llama.cpp's own) are R1, V3.1's
    /// is V3.1, Kimi K2's are Kimi K2 (not K3's), and no other (V3.2's and V4's DSML ones
    /// included) is any of them.
    #[test]
    fn deepseek_detects_the_templates() {
        let want = [
            (
                "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja",
                Format::DeepSeekR1,
            ),
            (
                "deepseek-ai-DeepSeek-R1-Distill-Llama-8B.jinja",
                Format::DeepSeekR1,
            ),
            ("llama-cpp-deepseek-r1.jinja", Format::DeepSeekR1),
            ("deepseek-ai-DeepSeek-V3.1.jinja", Format::DeepSeekV31),
            ("Kimi-K2-Instruct.jinja", Format::KimiK2),
            ("moonshotai-Kimi-K2.jinja", Format::KimiK2),
            ("Kimi-K2-Thinking.jinja", Format::KimiK2),
            ("upstage-Solar-Open-100B.jinja", Format::SolarOpen),
        ];
        for (file, src) in check_detect_all(detect, &want) {
            if file.starts_with("deepseek-ai-DeepSeek-V") && file != want[3].0 {
                assert!(src.contains("DSML"), "{file}");
            }
        }
    }

    const SB: &str = SOLAR_CALLS_BEGIN;
    const SE: &str = SOLAR_CALLS_END;

    /// A Solar block of `calls` (id, name, arguments), as its template renders it.
    fn solar(calls: &[(&str, &str, String)]) -> String {
        let calls: String = calls
            .iter()
            .map(|(id, n, a)| {
                format!("{SOLAR_CALL_BEGIN}{id}{SOLAR_NAME}{n}{SOLAR_SEP}{a}{SOLAR_CALL_END}")
            })
            .collect();
        format!("{SB}{calls}{SE}")
    }

    /// A call as Solar's `parse` gives it: the id the model wrote.
    fn scall(id: &str, name: &str, args: &str) -> ToolCall {
        ToolCall {
            id: Some(id.into()),
            ..call(name, args)
        }
    }

    /// A random Solar call id: 10 lowercase letters and digits.
    fn solar_id(rng: &mut Rng) -> String {
        let chars = b"abcdefghijklmnopqrstuvwxyz0123456789";
        (0..10)
            .map(|_| char::from(chars[rng.below(chars.len())]))
            .collect()
    }

    /// Random tools and calls: the grammar takes Solar's blocks (several argument layouts,
    /// random ids), `parse` gives the calls back with their ids; wrong names, broken arguments,
    /// ids not of 10 lowercase letters and digits, whitespace between the tags, extra calls and
    /// unclosed blocks are refused.
    #[test]
    fn solar_grammar_accepts_calls_and_refuses_wrong_ones() {
        let mut rng = Rng(0x501A_0001);
        for round in 0..60 {
            let r = random_req(&mut rng, round, round % 2 == 1);
            let (p, g) = checked_plan(Format::SolarOpen, &r, Trigger::Word(SB.into()));
            let calls = random_calls(&mut rng, &r);
            for layout in 0..4 {
                let laid: Vec<(String, &str, String)> = calls
                    .iter()
                    .map(|(t, a)| {
                        (
                            solar_id(&mut rng),
                            t.name.as_str(),
                            layouts(a)[layout].clone(),
                        )
                    })
                    .collect();
                let refs: Vec<(&str, &str, String)> = laid
                    .iter()
                    .map(|(i, n, a)| (i.as_str(), *n, a.clone()))
                    .collect();
                let text = solar(&refs);
                assert!(
                    g.accepts_str(&text),
                    "round {round}: refused {text}\n{}",
                    p.gbnf
                );
                let parsed = Format::SolarOpen.parse(&text, Some(&r));
                assert_eq!(parsed.content, "");
                assert_eq!(parsed.tool_calls.len(), calls.len());
                for ((c, (id, _, _)), (t, a)) in parsed.tool_calls.iter().zip(&laid).zip(&calls) {
                    assert_call(c, &t.name, a, Some(id));
                }
                check_text_around(Format::SolarOpen, &r, &g, &text, calls.len());
                check_stream_calls(Format::SolarOpen, &text, &r);
                assert!(!g.accepts_str(text.strip_suffix(SE).unwrap()));
            }
            let (t, a) = &calls[0];
            let one = solar(&[("a1b2c3d4e5", t.name.as_str(), a.to_string())]);
            assert!(g.accepts_str(&one));
            let two = solar(&[
                ("a1b2c3d4e5", t.name.as_str(), a.to_string()),
                ("0000000000", t.name.as_str(), a.to_string()),
            ]);
            assert_eq!(g.accepts_str(&two), r.parallel);
            // ids too short, too long, in capitals; whitespace between the tags
            for bad_id in ["a1b2", "a1b2c3d4e5f", "A1B2C3D4E5"] {
                assert!(!g.accepts_str(&one.replace("a1b2c3d4e5", bad_id)));
            }
            assert!(
                !g.accepts_str(&one.replace(SOLAR_CALL_BEGIN, &format!("\n{SOLAR_CALL_BEGIN}")))
            );
            assert!(!g.accepts_str(&solar(&[("a1b2c3d4e5", "no_such_tool", "{}".into())])));
            check_broken_args(&mut rng, &g, t, a, |bad| {
                solar(&[("a1b2c3d4e5", t.name.as_str(), bad.to_string())])
            });
        }
    }

    /// Solar's reading: the ids as written (none where empty), text around the block kept,
    /// malformed blocks left as content; streaming begins a call at its arguments' tag.
    #[test]
    fn solar_parse_cases() {
        let r = f_req(true);
        let cases: Vec<(String, &str, Vec<ToolCall>)> = vec![
            (
                format!("Hi {}", solar(&[("abc", "f", "{\"a\": 1}".into()), ("def", "g", "{}".into())])),
                "Hi",
                vec![scall("abc", "f", r#"{"a":1}"#), scall("def", "g", "{}")],
            ),
            (solar(&[("", "f", "{}".into())]), "", vec![call("f", "{}")]),
            // unclosed block at the end
            (
                format!("{SB}{SOLAR_CALL_BEGIN}x1{SOLAR_NAME}f{SOLAR_SEP}{{}}{SOLAR_CALL_END}"),
                "",
                vec![scall("x1", "f", "{}")],
            ),
            // no name tag, text after the JSON, a tool not offered: content
            (
                format!("{SB}{SOLAR_CALL_BEGIN}f{SOLAR_SEP}{{}}{SOLAR_CALL_END}{SE}"),
                "<|tool_calls|><|tool_call:begin|>f<|tool_call:args|>{}<|tool_call:end|><|calls|>",
                vec![],
            ),
            (
                solar(&[("x", "f", "{} x".into())]),
                "<|tool_calls|><|tool_call:begin|>x<|tool_call:name|>f<|tool_call:args|>{} x<|tool_call:end|><|calls|>",
                vec![],
            ),
            (
                solar(&[("x", "nosuch", "{}".into())]),
                "<|tool_calls|><|tool_call:begin|>x<|tool_call:name|>nosuch<|tool_call:args|>{}<|tool_call:end|><|calls|>",
                vec![],
            ),
        ];
        for (text, content, calls) in &cases {
            check_parsed(
                &Format::SolarOpen.parse(text, Some(&r)),
                content,
                calls,
                text,
            );
            check_partial_prefixes(Format::SolarOpen, text, Some(&r));
        }
        let t = format!("Hi {SB}{SOLAR_CALL_BEGIN}id{SOLAR_NAME}f{SOLAR_SEP}{{\"a\": \"x");
        check_parsed(
            &Format::SolarOpen.parse_partial(&t, Some(&r)),
            "Hi",
            &[scall("id", "f", r#"{"a":"x"#)],
            &t,
        );
        let t = format!("Hi {SB}{SOLAR_CALL_BEGIN}id{SOLAR_NAME}f");
        check_parsed(
            &Format::SolarOpen.parse_partial(&t, Some(&r)),
            "Hi",
            &[],
            &t,
        );
    }

    const KB: &str = KIMI_CALLS_BEGIN;
    const KE: &str = KIMI_CALLS_END;
    const KC: &str = KIMI_CALL_BEGIN;
    const KX: &str = KIMI_CALL_END;
    const KS: &str = KIMI_SEP;

    /// A Kimi block of `calls` (name, index, arguments), as its templates render it.
    fn kimi(calls: &[(&str, usize, String)]) -> String {
        let calls: String = calls
            .iter()
            .map(|(n, i, a)| format!("{KC}functions.{n}:{i}{KS}{a}{KX}"))
            .collect();
        format!("{KB}{calls}{KE}")
    }

    /// A call as Kimi's `parse` gives it: the id the model wrote.
    fn kcall(name: &str, index: usize, args: &str) -> ToolCall {
        ToolCall {
            id: Some(format!("functions.{name}:{index}")),
            name: name.into(),
            arguments: args.into(),
        }
    }

    /// Random tools and calls: the grammar takes Kimi's blocks (several argument layouts and
    /// call numbers), `parse` gives the calls back with their ids; wrong names, broken
    /// arguments, a missing index, extra calls and unclosed blocks are refused.
    #[test]
    fn kimi_grammar_accepts_calls_and_refuses_wrong_ones() {
        let mut rng = Rng(0x4B1A_0001);
        for round in 0..60 {
            let r = random_req(&mut rng, round, round % 2 == 1);
            let (p, g) = checked_plan(Format::KimiK2, &r, Trigger::Word(KB.into()));
            let calls = random_calls(&mut rng, &r);
            for layout in 0..4 {
                let laid: Vec<(&str, usize, String)> = calls
                    .iter()
                    .enumerate()
                    .map(|(i, (t, a))| {
                        (t.name.as_str(), i + layout * 7, layouts(a)[layout].clone())
                    })
                    .collect();
                let text = kimi(&laid);
                assert!(
                    g.accepts_str(&text),
                    "round {round}: refused {text}\n{}",
                    p.gbnf
                );
                let parsed = Format::KimiK2.parse(&text, Some(&r));
                assert_eq!(parsed.content, "");
                assert_eq!(parsed.tool_calls.len(), calls.len());
                for ((c, (n, i, _)), (t, a)) in parsed.tool_calls.iter().zip(&laid).zip(&calls) {
                    assert_call(c, &t.name, a, Some(&format!("functions.{n}:{i}")));
                }
                check_text_around(Format::KimiK2, &r, &g, &text, calls.len());
                check_stream_calls(Format::KimiK2, &text, &r);
                assert!(!g.accepts_str(text.strip_suffix(KE).unwrap()));
            }
            let (t, a) = &calls[0];
            let one = kimi(&[(t.name.as_str(), 0, a.to_string())]);
            assert!(g.accepts_str(&one));
            assert_eq!(
                g.accepts_str(&kimi(&[
                    (t.name.as_str(), 0, a.to_string()),
                    (t.name.as_str(), 1, a.to_string())
                ])),
                r.parallel
            );
            // no index, DeepSeek's markup, a tool not offered
            assert!(!g.accepts_str(&one.replace(":0", "")));
            assert!(!g.accepts_str(&one.replace("functions.", "")));
            assert!(!g.accepts_str(&kimi(&[("no_such_tool", 0, "{}".into())])));
            check_broken_args(&mut rng, &g, t, a, |bad| {
                kimi(&[(t.name.as_str(), 0, bad.to_string())])
            });
        }
    }

    /// Kimi's lenient reading, as llama.cpp's handler reads it: calls without the section's
    /// opening, calls without their end before the next call or the section's end, the ids as
    /// written, and text that is none of it left as content.
    #[test]
    fn kimi_parse_cases() {
        let r = f_req(true);
        let cases: Vec<(String, &str, Vec<ToolCall>)> = vec![
            (
                format!("Hi {}", kimi(&[("f", 0, "{\"a\": 1}".into()), ("g", 1, "{}".into())])),
                "Hi",
                vec![kcall("f", 0, r#"{"a":1}"#), kcall("g", 1, "{}")],
            ),
            // no section opening; no call end; no section end
            (
                format!("Hi {KC}functions.f:3{KS}{{}}{KX}"),
                "Hi",
                vec![kcall("f", 3, "{}")],
            ),
            (
                format!("{KB}{KC}functions.f:0{KS}{{}}{KC}functions.g:1{KS}{{\"b\": [2]}}{KE}"),
                "",
                vec![kcall("f", 0, "{}"), kcall("g", 1, r#"{"b":[2]}"#)],
            ),
            (
                format!("{KB}{KC}functions.f:0{KS}{{}}"),
                "",
                vec![kcall("f", 0, "{}")],
            ),
            // a name without the prefix or the index: no id
            (
                format!("{KB}{KC}f{KS}{{}}{KX}{KE}"),
                "",
                vec![call("f", "{}")],
            ),
            // text after a call's JSON: malformed, content
            (
                format!("{KB}{KC}functions.f:0{KS}{{}} x{KX}{KE}"),
                "<|tool_calls_section_begin|><|tool_call_begin|>functions.f:0<|tool_call_argument_begin|>{} x<|tool_call_end|><|tool_calls_section_end|>",
                vec![],
            ),
            (
                format!("{KB}{KC}functions.nosuch:0{KS}{{}}{KX}{KE}"),
                "<|tool_calls_section_begin|><|tool_call_begin|>functions.nosuch:0<|tool_call_argument_begin|>{}<|tool_call_end|><|tool_calls_section_end|>",
                vec![],
            ),
        ];
        for (text, content, calls) in &cases {
            check_parsed(&Format::KimiK2.parse(text, Some(&r)), content, calls, text);
            check_partial_prefixes(Format::KimiK2, text, Some(&r));
        }
        // streamed: begun at the separator, with its id
        let t = format!("Hi {KB}{KC}functions.f:2{KS}{{\"a\": \"x");
        check_parsed(
            &Format::KimiK2.parse_partial(&t, Some(&r)),
            "Hi",
            &[kcall("f", 2, r#"{"a":"x"#)],
            &t,
        );
        let t = format!("Hi {KB}{KC}functions.f:2");
        check_parsed(&Format::KimiK2.parse_partial(&t, Some(&r)), "Hi", &[], &t);
    }

    /// Kimi's pieces in random texts: what streaming sends is a prefix of what the finished
    /// text gives, and is never taken back.
    #[test]
    fn kimi_partial_is_prefix_of_parse() {
        let r = f_req(true);
        let frags = [
            "a",
            " ",
            "\n",
            "<",
            "<|tool",
            "<|tool_call",
            KB,
            KE,
            KC,
            KX,
            KS,
            "functions.",
            "f",
            ":1",
            "{}",
            "{\"a\": 1}",
            "{\"s\": \"<|tool_call_end|>\"}",
            "{",
            "é",
            "<|tool_call_begin|>functions.f:0<|tool_call_argument_begin|>{}<|tool_call_end|>",
            "<|tool_call_begin|>functions.g:1<|tool_call_argument_begin|>{\"c\": [1]}",
            "<|tool_call_begin|>functions.zz:2<|tool_call_argument_begin|>{}<|tool_call_end|>",
        ];
        let mut rng = Rng(0x4B1A_0002);
        let (mut checked, mut calls) = (0usize, 0usize);
        for _ in 0..3000 {
            let t: String = (0..rng.below(9))
                .map(|_| frags[rng.below(frags.len())])
                .collect();
            for req in [Some(&r), None] {
                let (full, n) = check_partial_prefixes(Format::KimiK2, &t, req);
                calls += full.tool_calls.len();
                checked += n;
            }
        }
        assert!(checked > 20_000 && calls > 300, "{checked} {calls}");
    }
}
