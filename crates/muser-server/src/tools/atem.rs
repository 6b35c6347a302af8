//! Muse Glimmer's ATEM format (the `muse-glimmer.jinja` template; llama.cpp's
//! `common/parsers/muse-glimmer.cpp` handler).
//!
//! The generation prompt ends with `<|start|>assistant`; the model's output is one or more
//! messages, each a header and a body, separated by `<|eom|><|start|>assistant`:
//!
//! * ` to=self<|message|>` REASONING, ended by `<|eom|>` (or `<|eot|>`, or the end of output);
//! * `<|message|>` or ` to=user<|message|>` ANSWER, ended by `<|eot|>`, `<|eom|>` or the end;
//! * ` to=NAME<|message|>` and an ATEM block, a tool call:
//!   `<atem:function_calls>\n<atem:invoke name="NAME">\n`
//!   (`<atem:parameter name="K">` V `</atem:parameter>\n`)* `</atem:invoke>\n</atem:function_calls>`.
//!   A string value V is its raw text; other values are JSON (the template's `render_atem`).
//!
//! # Plan (grammar)
//!
//! * `Auto`: lazy, from a trigger (`trigger`: ` to=NAME<|message|>` at the start of the output or
//!   after `<|start|>assistant`, NAME one of the tools': llama.cpp's pattern, which takes any NAME
//!   but `self` and `user`, narrowed); the grammar is
//!   one call (parallel: calls separated by `<|eom|><|start|>assistant`), each call one of the
//!   tools with its own name after `to=` and in `invoke name`.
//! * `Required` / `Function(N)`: the whole output: reasoning messages
//!   (` to=self<|message|>` text without `<|eom|>`/`<|eot|>` `<|eom|><|start|>assistant`), then
//!   the call(s) (only N's for `Function`).
//!
//! The parameters of a call are the schema's `properties` in their order, required ones
//! mandatory, optional ones optional, no others (stricter than llama.cpp). A value is raw text
//! without `</atem:parameter>` when the property's schema admits strings (a string-only `enum`
//! or `const`: one of its values, raw), else JSON per the schema (muser-jsonschema); the
//! grammar and the reading of values are `xml_args`', shared with the Qwen XML format.
//!
//! # Parse
//!
//! Messages are read left to right. Reasoning messages are joined with `"\n"`, answer messages
//! too; tool calls are ATEM blocks (several `invoke`s in one block are read as several calls).
//! The `<|eot|>`/`<|eom|>` ending the last message, and a trailing unfinished separator or
//! header (`<|eom|><|start|>assist`, ` to=get_w`), are dropped. Where the text stops following
//! the format (a random model's output from its first character; a message end followed by
//! something other than `<|start|>assistant` and a header; a malformed or unfinished call
//! block), the rest of the text, from that message's end token (or the output's start) on, is
//! appended verbatim to the content: nothing read before it changes, so what was streamed stays
//! valid. Everything after a call header is held back from the content while streaming; its
//! calls are streamed as they are written: each once its `invoke` name is whole (a tool
//! offered), its arguments (`xml_args::StreamedArgs`) growing by whole parameters, a
//! string-only parameter's characters as they come, and `}` at `</atem:invoke>`; a parameter
//! given again is read past (`parse` keeps its first value) and the ones after it stream on.

use super::partial::Memo;
use super::xml_args::{arguments, tail_len, text_without, ws_len, Params, StreamedArgs, Syntax};
use super::{allowed_tools, Parsed, Plan, Tool, ToolCall, ToolChoice, ToolRequest, Trigger};
use muser_jsonschema::gbnf_literal as literal;

const START: &str = "<|start|>assistant";
const MESSAGE: &str = "<|message|>";
const EOM: &str = "<|eom|>";
const EOT: &str = "<|eot|>";
const TO: &str = " to=";
const CALLS_OPEN: &str = "<atem:function_calls>";
const CALLS_CLOSE: &str = "</atem:function_calls>";
const INVOKE_OPEN: &str = "<atem:invoke name=\"";
const INVOKE_CLOSE: &str = "</atem:invoke>";
const PARAM_OPEN: &str = "<atem:parameter name=\"";
const PARAM_CLOSE: &str = "</atem:parameter>";
const ATTR_END: &str = "\">";

/// `<atem:parameter name="K">V</atem:parameter>`, the whitespace rule after it.
const SYNTAX: Syntax = Syntax {
    format: "ATEM",
    prefix: "atem",
    open: |k, _, _| format!("{PARAM_OPEN}{k}{ATTR_END}"),
    close: PARAM_CLOSE,
    end_tag: PARAM_CLOSE,
    name_stops: &['"'],
    python: false,
    sep: None,
    required_first: false,
};

/// llama.cpp's trigger for this format (the grammar starts at the capture group,
/// ` to=NAME<|message|>`), which `trigger` narrows; kept to compare with in the tests.
#[cfg(test)]
pub(super) const TRIGGER: &str = r"(?:^|<\|start\|>assistant)( to=(?!self<\|message\|>)(?!user<\|message\|>)[^<]*?<\|message\|>)";

/// The trigger of a lazy plan: llama.cpp's pattern narrowed to the request's tool names,
/// so that a header naming no tool (a namespaced or made-up name) leaves the text free instead
/// of starting a grammar that cannot follow it.
pub(super) fn trigger(names: &[&str]) -> String {
    let names: Vec<String> = names
        .iter()
        .map(|n| fancy_regex::escape(n).into_owned())
        .collect();
    format!(
        r"(?:^|<\|start\|>assistant)( to=(?:{})<\|message\|>)",
        names.join("|")
    )
}

// ---------------------------------------------------------------------------------------------
// Plan

pub(super) fn plan(req: &ToolRequest) -> Result<Option<Plan>, String> {
    let Some(tools) = allowed_tools(req)? else {
        return Ok(None);
    };
    let lazy = req.choice == ToolChoice::Auto;
    let mut params = Params::new(&SYNTAX);
    let mut rules = String::new();
    let mut alts = Vec::new();
    for (i, tool) in tools.iter().enumerate() {
        alts.push(tool_rule(i, tool, &mut params, &mut rules)?);
    }
    let sep = literal(&format!("{EOM}{START}"));
    let calls = if req.parallel {
        format!("atem-call ( {sep} atem-call )*")
    } else {
        "atem-call".to_string()
    };
    let mut gbnf = if lazy {
        format!("root ::= {calls}\n")
    } else {
        let think_open = literal(&format!("{TO}self{MESSAGE}"));
        let mut g = format!("root ::= ( {think_open} atem-think {sep} )* {calls}\n");
        g.push_str(&text_without("atem-think", &[EOM, EOT]));
        g
    };
    gbnf.push_str(&format!("atem-call ::= {}\n", alts.join(" | ")));
    gbnf.push_str(&params.finish());
    gbnf.push_str(&rules);
    Ok(Some(Plan {
        gbnf,
        lazy,
        triggers: if lazy {
            let names: Vec<&str> = tools.iter().map(|t| t.name.as_str()).collect();
            vec![Trigger::Pattern(trigger(&names))]
        } else {
            Vec::new()
        },
        system: None,
    }))
}

/// Checks a tool name: it must be a recipient the parser reads back.
fn check_name(name: &str) -> Result<(), String> {
    if name.is_empty() {
        return Err("a tool has an empty name".to_string());
    }
    if let Some(c) = name.chars().find(|&c| !is_name_char(c)) {
        return Err(format!(
            "tool `{name}`: the ATEM format cannot carry {c:?} in a tool name"
        ));
    }
    if name == "self" || name == "user" {
        return Err(format!(
            "tool `{name}`: the name is an ATEM recipient of its own (reasoning or answer)"
        ));
    }
    Ok(())
}

/// Adds the rule of a call of tool `i` to `rules` (its parameters' to `params`); returns its
/// name.
fn tool_rule(
    i: usize,
    tool: &Tool,
    params: &mut Params,
    rules: &mut String,
) -> Result<String, String> {
    let name = &tool.name;
    check_name(name)?;
    let seq = params.tool(i, tool)?;
    let ws = params.ws();
    let rule = format!("atem-t{i}");
    rules.push_str(&format!(
        "{rule} ::= {} {ws} {} {ws} {seq} {} {ws} {}\n",
        literal(&format!("{TO}{name}{MESSAGE}{CALLS_OPEN}")),
        literal(&format!("{INVOKE_OPEN}{name}{ATTR_END}")),
        literal(INVOKE_CLOSE),
        literal(CALLS_CLOSE)
    ));
    Ok(rule)
}

// ---------------------------------------------------------------------------------------------
// Parse

/// One call as written: the invoke name and the parameters' raw texts.
#[derive(Debug)]
struct RawCall {
    name: String,
    args: Vec<(String, String)>,
}

#[derive(Default)]
struct Scan<'r> {
    content: String,
    reasoning: String,
    n_reasoning: usize,
    n_answers: usize,
    calls: Vec<RawCall>,
    /// The calls as streaming reads them.
    begun: Begun<'r>,
}

/// Whether `req` lets the model call the tool `name` (offered, `tool_choice` not `none`).
fn offered(req: Option<&ToolRequest>, name: &str) -> bool {
    req.is_some_and(|r| r.choice != ToolChoice::None && r.tools.iter().any(|t| t.name == name))
}

/// The calls streaming has begun, read along with the blocks: each once its `invoke` name is
/// whole (a tool offered), its arguments as far as they are sure (`StreamedArgs`: whole
/// parameters, a string-only one's characters as they come, `}` at `</atem:invoke>`). A
/// parameter name given twice in a call keeps its first value (as `arguments` keeps it): the
/// repeat is left out and the parameters after it go on. An invoke of a tool not offered stops
/// them: nothing grows after it.
#[derive(Default)]
struct Begun<'r> {
    req: Option<&'r ToolRequest>,
    calls: Vec<(String, StreamedArgs<'r>)>,
    stopped: bool,
    /// The parameter being read repeats a name of its call: its value is left out.
    repeat: bool,
    /// The long values streamed so far (escaped once, `Memo::push_text`).
    memo: Memo,
}

impl<'r> Begun<'r> {
    /// An invoke whose name is whole.
    fn invoke(&mut self, name: &str) {
        if self.stopped {
            return;
        }
        if !offered(self.req, name) {
            self.stopped = true;
            return;
        }
        let args = StreamedArgs::new(&SYNTAX, name, self.req);
        self.calls.push((name.to_string(), args));
    }

    /// The current call's arguments, unless stopped.
    fn args(&mut self) -> Option<&mut StreamedArgs<'r>> {
        if self.stopped {
            return None;
        }
        self.calls.last_mut().map(|(_, a)| a)
    }

    /// A parameter whose name is whole: a repeated one's value is left out.
    fn key(&mut self, key: &str) {
        self.repeat = self.args().is_some_and(|a| !a.is_new(key));
    }

    /// The arguments a parameter's value goes to: the current call's, unless stopped or the
    /// parameter repeats a name.
    fn value_args(&mut self) -> Option<&mut StreamedArgs<'r>> {
        if self.repeat {
            return None;
        }
        self.args()
    }

    /// The parameter `key`, its raw text final.
    fn param(&mut self, key: &str, raw: &str) {
        if let Some(a) = self.value_args() {
            a.push(key, raw);
        }
    }

    /// The parameter `key`, its raw text still open and starting with `known`.
    fn open(&mut self, key: &str, known: &str) {
        if self.repeat || self.stopped {
            return;
        }
        if let Some((_, a)) = self.calls.last_mut() {
            a.push_open(key, known, &mut self.memo);
        }
    }

    /// `</atem:invoke>`.
    fn close(&mut self) {
        if let Some(a) = self.args() {
            a.close();
        }
    }

    fn into_calls(self) -> Vec<ToolCall> {
        self.calls
            .into_iter()
            .map(|(name, a)| ToolCall {
                id: None,
                name,
                arguments: a.into_text(),
            })
            .collect()
    }
}

/// Reads a piece of markup with a reader that gives a `Step`: its value, the bytes it took
/// added to `$p`; returns `Step::More` or `Step::Broken` from the calling function where the
/// piece is not whole.
macro_rules! take {
    ($e:expr, $p:ident) => {
        match $e {
            Step::Done(v, n) => {
                $p += n;
                v
            }
            Step::More => return Step::More,
            Step::Broken => return Step::Broken,
        }
    };
}
pub(super) use take;

/// The result of reading a piece of markup at the start of a text.
pub(super) enum Step<T> {
    /// Read: the value and the bytes it took.
    Done(T, usize),
    /// The text ends before the piece does (it may still become one).
    More,
    /// The text cannot start with the piece, whatever follows.
    Broken,
}

enum Recipient {
    Reasoning,
    Answer,
    Tool,
}

fn is_name_char(c: char) -> bool {
    !c.is_whitespace() && !matches!(c, '<' | '>' | '"')
}

/// A message header: `<|message|>` or ` to=NAME<|message|>`.
fn header(s: &str) -> Step<Recipient> {
    if s.starts_with(MESSAGE) {
        return Step::Done(Recipient::Answer, MESSAGE.len());
    }
    if MESSAGE.starts_with(s) || TO.starts_with(s) {
        return Step::More;
    }
    let Some(rest) = s.strip_prefix(TO) else {
        return Step::Broken;
    };
    let n = rest
        .char_indices()
        .find(|&(_, c)| !is_name_char(c))
        .map_or(rest.len(), |(i, _)| i);
    let (name, after) = rest.split_at(n);
    if after.starts_with(MESSAGE) {
        if name.is_empty() {
            return Step::Broken;
        }
        let r = match name {
            "self" => Recipient::Reasoning,
            "user" => Recipient::Answer,
            _ => Recipient::Tool,
        };
        return Step::Done(r, TO.len() + n + MESSAGE.len());
    }
    if MESSAGE.starts_with(after) {
        Step::More
    } else {
        Step::Broken
    }
}

/// Reads the literal `lit` at the start of `s`.
pub(super) fn lit(s: &str, lit: &str) -> Step<()> {
    if s.starts_with(lit) {
        Step::Done((), lit.len())
    } else if lit.starts_with(s) {
        Step::More
    } else {
        Step::Broken
    }
}

/// An attribute value up to `">` (no `"` inside).
fn attr(s: &str) -> Step<String> {
    match s.find('"') {
        None => Step::More,
        Some(q) => match lit(&s[q..], ATTR_END) {
            Step::Done(..) => Step::Done(s[..q].to_string(), q + ATTR_END.len()),
            Step::More => Step::More,
            Step::Broken => Step::Broken,
        },
    }
}

/// Which of `lits` starts `s`: Done(index), More when `s` is a proper prefix of one of them.
fn one_of(s: &str, lits: &[&str]) -> Step<usize> {
    if let Some(i) = lits.iter().position(|l| s.starts_with(l)) {
        return Step::Done(i, lits[i].len());
    }
    if lits.iter().any(|l| l.starts_with(s)) {
        Step::More
    } else {
        Step::Broken
    }
}

/// An ATEM block (and the whitespace after it): its calls. `begun` reads them as streaming
/// does, as far as `s` goes.
fn call_block(s: &str, begun: &mut Begun) -> Step<Vec<RawCall>> {
    let mut p = 0;
    take!(lit(s, CALLS_OPEN), p);
    p += ws_len(&s[p..]);
    let mut calls = Vec::new();
    loop {
        take!(lit(&s[p..], INVOKE_OPEN), p);
        let name = take!(attr(&s[p..]), p);
        begun.invoke(&name);
        p += ws_len(&s[p..]);
        let mut args = Vec::new();
        while take!(one_of(&s[p..], &[PARAM_OPEN, INVOKE_CLOSE]), p) == 0 {
            let k = take!(attr(&s[p..]), p);
            begun.key(&k);
            let Some(n) = s[p..].find(PARAM_CLOSE) else {
                let v = &s[p..];
                begun.open(&k, &v[..v.len() - tail_len(v, PARAM_CLOSE)]);
                return Step::More;
            };
            begun.param(&k, &s[p..p + n]);
            args.push((k, s[p..p + n].to_string()));
            p += n + PARAM_CLOSE.len();
            p += ws_len(&s[p..]);
        }
        begun.close();
        calls.push(RawCall { name, args });
        p += ws_len(&s[p..]);
        if take!(one_of(&s[p..], &[CALLS_CLOSE, INVOKE_OPEN]), p) == 0 {
            p += ws_len(&s[p..]);
            return Step::Done(calls, p);
        }
        p -= INVOKE_OPEN.len();
    }
}

/// Length of the longest suffix of `s` that is a proper prefix of `<|eom|>` or `<|eot|>`.
fn held_back(s: &str) -> usize {
    (1..EOM.len().min(s.len() + 1))
        .rev()
        .find(|&k| {
            s.is_char_boundary(s.len() - k) && {
                let t = &s[s.len() - k..];
                EOM.starts_with(t) || EOT.starts_with(t)
            }
        })
        .unwrap_or(0)
}

/// Reads the output. `complete`: the whole output (else only what no continuation changes).
/// `req`: the request's tools; a call message is read as calls only when it calls offered tools
/// and `tool_choice` is not `none` (else it breaks the format, and from there the text is
/// content, verbatim).
fn scan<'r>(text: &str, complete: bool, req: Option<&'r ToolRequest>, memo: Memo) -> Scan<'r> {
    let mut out = Scan::default();
    out.begun.req = req;
    out.begun.memo = memo;
    // start of the current message's header
    let mut pos = 0;
    // where the verbatim rest starts if the current message breaks the format
    let mut seg = 0;
    loop {
        let e = match header(&text[pos..]) {
            // an unfinished header: trailing markup, or still to come
            Step::More => return out,
            Step::Broken => {
                out.content.push_str(&text[seg..]);
                return out;
            }
            Step::Done(Recipient::Tool, n) => match call_block(&text[pos + n..], &mut out.begun) {
                Step::Done(calls, m) if calls.iter().all(|c| offered(req, &c.name)) => {
                    out.calls.extend(calls);
                    pos + n + m
                }
                Step::Done(..) => {
                    out.content.push_str(&text[seg..]);
                    return out;
                }
                Step::More if !complete => return out,
                Step::More | Step::Broken => {
                    out.content.push_str(&text[seg..]);
                    return out;
                }
            },
            Step::Done(r, n) => {
                let body = &text[pos + n..];
                let (dest, count) = match r {
                    Recipient::Reasoning => (&mut out.reasoning, &mut out.n_reasoning),
                    _ => (&mut out.content, &mut out.n_answers),
                };
                if *count > 0 {
                    dest.push('\n');
                }
                *count += 1;
                let end = [EOM, EOT].iter().filter_map(|t| body.find(t)).min();
                match end {
                    Some(j) => {
                        dest.push_str(&body[..j]);
                        pos + n + j
                    }
                    None => {
                        let keep = if complete {
                            body.len()
                        } else {
                            body.len() - held_back(body)
                        };
                        dest.push_str(&body[..keep]);
                        return out;
                    }
                }
            }
        };
        // a message ended at `e`
        let rest = &text[e..];
        if rest.is_empty() {
            return out;
        }
        if let Some(after) = rest.strip_prefix(EOT) {
            if !after.is_empty() {
                out.content.push_str(rest);
            }
            return out;
        }
        if let Some(after) = rest.strip_prefix(EOM) {
            if after.starts_with(START) {
                seg = e;
                pos = e + EOM.len() + START.len();
                continue;
            }
            if !START.starts_with(after) {
                out.content.push_str(rest);
            }
            return out;
        }
        if !(EOM.starts_with(rest) || EOT.starts_with(rest)) {
            out.content.push_str(rest);
        }
        return out;
    }
}

pub(super) fn parse(text: &str, req: Option<&ToolRequest>) -> Parsed {
    let s = scan(text, true, req, Memo::default());
    Parsed {
        content: s.content,
        reasoning: (!s.reasoning.is_empty()).then_some(s.reasoning),
        tool_calls: s
            .calls
            .iter()
            .map(|c| ToolCall {
                id: None,
                name: c.name.clone(),
                arguments: arguments(&SYNTAX, &c.name, &c.args, req),
            })
            .collect(),
    }
}

/// Content and reasoning as far as no continuation changes them; the calls begun (`Begun`).
#[cfg(test)]
pub(super) fn parse_partial(text: &str, req: Option<&ToolRequest>) -> Parsed {
    parse_partial_on(text, req, &mut Memo::default())
}

/// `parse_partial` of `text`, the long values its calls stream escaped once (`memo`, kept
/// between the readings of one output as it grows).
pub(super) fn parse_partial_on(text: &str, req: Option<&ToolRequest>, memo: &mut Memo) -> Parsed {
    let mut s = scan(text, false, req, std::mem::take(memo));
    *memo = std::mem::take(&mut s.begun.memo);
    Parsed {
        content: s.content,
        reasoning: (!s.reasoning.is_empty()).then_some(s.reasoning),
        tool_calls: s.begun.into_calls(),
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_util::{check_call_step, req as request, tool};
    use super::super::Format;
    use super::*;
    use muser_sample::Grammar;
    use serde_json::{json, Map, Value};

    /// SplitMix64: deterministic random inputs without a dependency.
    struct Rng(u64);

    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = self.0;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            z ^ (z >> 31)
        }
        fn below(&mut self, n: usize) -> usize {
            (self.next() % n as u64) as usize
        }
        fn chance(&mut self, percent: u64) -> bool {
            self.next() % 100 < percent
        }
        fn pick<'a, T>(&mut self, xs: &'a [T]) -> &'a T {
            &xs[self.below(xs.len())]
        }
    }

    fn grammar(plan: &Plan) -> Grammar {
        Grammar::parse(&plan.gbnf).unwrap_or_else(|e| panic!("{e}\n{}", plan.gbnf))
    }

    // --- a renderer following the template's `render_atem` ---

    /// Python's `json.dumps` layout (", ", ": "), as Jinja's `tojson` writes.
    fn python_json(v: &Value) -> String {
        match v {
            Value::Array(a) => {
                let items: Vec<String> = a.iter().map(python_json).collect();
                format!("[{}]", items.join(", "))
            }
            Value::Object(m) => {
                let items: Vec<String> = m
                    .iter()
                    .map(|(k, v)| format!("{}: {}", Value::String(k.clone()), python_json(v)))
                    .collect();
                format!("{{{}}}", items.join(", "))
            }
            other => other.to_string(),
        }
    }

    fn render_value(v: &Value, python: bool) -> String {
        match v {
            Value::Bool(b) => b.to_string(),
            Value::Null => "null".to_string(),
            Value::Object(_) | Value::Array(_) if python => python_json(v),
            Value::Object(_) | Value::Array(_) => v.to_string(),
            Value::String(s) => s.clone(),
            Value::Number(n) => n.to_string(),
        }
    }

    /// `" to=NAME<|message|>"` and the block, as the template writes a call.
    fn render_call(to: &str, name: &str, args: &[(String, Value)], python: bool) -> String {
        let mut s =
            format!(" to={to}<|message|><atem:function_calls>\n<atem:invoke name=\"{name}\">\n");
        for (k, v) in args {
            s.push_str(&format!(
                "<atem:parameter name=\"{k}\">{}</atem:parameter>\n",
                render_value(v, python)
            ));
        }
        s.push_str("</atem:invoke>\n</atem:function_calls>");
        s
    }

    fn render_calls(calls: &[(String, Vec<(String, Value)>)], python: bool) -> String {
        let parts: Vec<String> = calls
            .iter()
            .map(|(n, a)| render_call(n, n, a, python))
            .collect();
        parts.join("<|eom|><|start|>assistant")
    }

    fn render_reasoning(msgs: &[String]) -> String {
        msgs.iter()
            .map(|m| format!(" to=self<|message|>{m}<|eom|><|start|>assistant"))
            .collect()
    }

    // --- random tools and arguments ---

    #[derive(Clone, Copy, Debug, PartialEq)]
    enum Kind {
        Str,
        Int,
        Num,
        Bool,
        Enum,
        IntArray,
        Obj,
        StrOrNull,
    }

    const KINDS: &[Kind] = &[
        Kind::Str,
        Kind::Int,
        Kind::Num,
        Kind::Bool,
        Kind::Enum,
        Kind::IntArray,
        Kind::Obj,
        Kind::StrOrNull,
    ];

    const ENUM: &[&str] = &["celsius", "fahr enheit", "a\"b", "x</y", ""];

    fn kind_schema(k: Kind) -> Value {
        match k {
            Kind::Str => json!({"type": "string", "description": "text"}),
            Kind::Int => json!({"type": "integer"}),
            Kind::Num => json!({"type": "number"}),
            Kind::Bool => json!({"type": "boolean"}),
            Kind::Enum => json!({"type": "string", "enum": ENUM}),
            Kind::IntArray => json!({"type": "array", "items": {"type": "integer"}}),
            Kind::Obj => json!({"type": "object",
                                "properties": {"a": {"type": "string"}, "b": {"type": "integer"}},
                                "required": ["a"]}),
            Kind::StrOrNull => json!({"type": ["string", "null"]}),
        }
    }

    const STR_PIECES: &[&str] = &[
        "a",
        "b",
        "Zz",
        " ",
        "\n",
        "<",
        "/",
        "\"",
        "é",
        "{",
        "}",
        "1",
        "true",
        "null",
        "<|eom|>",
        "</atem:param",
        "eter>",
        "<atem:parameter name=\"x\">",
        "\\",
        "[1]",
        "中",
    ];

    fn random_string(rng: &mut Rng) -> String {
        loop {
            let n = rng.below(6);
            let s: String = (0..n).map(|_| *rng.pick(STR_PIECES)).collect();
            if !s.contains(PARAM_CLOSE) {
                return s;
            }
        }
    }

    /// Reasoning text (no message end in it).
    fn random_reasoning(rng: &mut Rng) -> String {
        random_string(rng).replace(EOM, "").replace(EOT, "")
    }

    fn random_value(rng: &mut Rng, k: Kind) -> Value {
        match k {
            Kind::Str => Value::String(random_string(rng)),
            Kind::Int => json!(rng.below(2_000_001) as i64 - 1_000_000),
            Kind::Num => json!((rng.below(4001) as f64 - 2000.0) / 8.0),
            Kind::Bool => json!(rng.chance(50)),
            Kind::Enum => json!(*rng.pick(ENUM)),
            Kind::IntArray => {
                let n = rng.below(4);
                Value::Array((0..n).map(|_| json!(rng.below(100) as i64 - 50)).collect())
            }
            Kind::Obj => {
                let mut m = Map::new();
                m.insert("a".into(), Value::String(random_string(rng)));
                if rng.chance(50) {
                    m.insert("b".into(), json!(rng.below(1000)));
                }
                Value::Object(m)
            }
            Kind::StrOrNull => {
                if rng.chance(30) {
                    Value::Null
                } else {
                    // the text `null` would be read as null
                    Value::String(random_string(rng).replace("null", "nul"))
                }
            }
        }
    }

    struct Spec {
        name: String,
        /// (key, kind, required)
        params: Vec<(String, Kind, bool)>,
    }

    impl Spec {
        fn tool(&self) -> Tool {
            let mut props = Map::new();
            let mut required = Vec::new();
            for (k, kind, req) in &self.params {
                props.insert(k.clone(), kind_schema(*kind));
                if *req {
                    required.push(json!(k));
                }
            }
            tool(
                &self.name,
                json!({"type": "object", "properties": props, "required": required}),
            )
        }

        /// Arguments in schema order: every required one, some optional ones.
        fn args(&self, rng: &mut Rng) -> Vec<(String, Value)> {
            let mut out = Vec::new();
            for (k, kind, req) in &self.params {
                if *req || rng.chance(50) {
                    out.push((k.clone(), random_value(rng, *kind)));
                }
            }
            out
        }
    }

    const WORDS: &[&str] = &[
        "get", "weather", "search", "web", "x", "run_code", "a.b", "calc",
    ];

    fn random_specs(rng: &mut Rng) -> Vec<Spec> {
        let n = 1 + rng.below(4);
        (0..n)
            .map(|i| {
                let name = format!("{}{}_{i}", rng.pick(WORDS), rng.pick(&["", ".v2", "-x"]));
                let np = rng.below(6);
                let params = (0..np)
                    .map(|j| {
                        let key = format!("{}{j}", rng.pick(&["p", "city", "unit_", "Q"]));
                        (key, *rng.pick(KINDS), rng.chance(50))
                    })
                    .collect();
                Spec { name, params }
            })
            .collect()
    }

    fn args_value(args: &[(String, Value)]) -> Value {
        Value::Object(args.iter().cloned().collect())
    }

    // --- the grammar ---

    #[test]
    fn grammar_accepts_rendered_calls_and_rejects_wrong_ones() {
        let mut rng = Rng(11);
        let (mut accepted, mut rejected) = (0, [0usize; 7]);
        for round in 0..40 {
            let specs = random_specs(&mut rng);
            let tools: Vec<Tool> = specs.iter().map(Spec::tool).collect();
            let parallel = round % 2 == 0;
            let target = rng.below(specs.len());
            for choice in [
                ToolChoice::Auto,
                ToolChoice::Required,
                ToolChoice::Function(specs[target].name.clone()),
            ] {
                let req = request(tools.clone(), choice.clone(), parallel);
                let plan = plan(&req).unwrap().unwrap();
                assert_eq!(plan.lazy, choice == ToolChoice::Auto);
                assert!(plan.system.is_none());
                let g = grammar(&plan);
                let allowed: Vec<usize> = match &choice {
                    ToolChoice::Function(_) => vec![target],
                    _ => (0..specs.len()).collect(),
                };
                for _ in 0..6 {
                    let n = if parallel { 1 + rng.below(3) } else { 1 };
                    let calls: Vec<(String, Vec<(String, Value)>)> = (0..n)
                        .map(|_| {
                            let s = &specs[*rng.pick(&allowed)];
                            (s.name.clone(), s.args(&mut rng))
                        })
                        .collect();
                    let python = rng.chance(50);
                    let reasoning: Vec<String> = (0..rng.below(3))
                        .map(|_| random_reasoning(&mut rng))
                        .collect();
                    let prefix = if plan.lazy {
                        String::new()
                    } else {
                        render_reasoning(&reasoning)
                    };
                    let text = format!("{prefix}{}", render_calls(&calls, python));
                    assert!(g.accepts_str(&text), "{text:?}\n{}", plan.gbnf);
                    check_stream(&text, &req);
                    accepted += 1;

                    let bad = |t: String| -> String { format!("{prefix}{t}") };
                    let (name, args) = &calls[0];
                    // a name that is no tool's
                    let t = bad(render_call("nosuch", "nosuch", args, python));
                    assert!(!g.accepts_str(&t), "{t:?}");
                    rejected[0] += 1;
                    // `to=` naming another tool than `invoke`
                    if let Some(other) = specs.iter().find(|s| &s.name != name) {
                        let t = bad(render_call(&other.name, name, args, python));
                        assert!(!g.accepts_str(&t), "{t:?}");
                        rejected[1] += 1;
                    }
                    let spec = specs.iter().find(|s| &s.name == name).unwrap();
                    // a required parameter missing
                    if let Some(req_key) = spec.params.iter().find(|p| p.2).map(|p| &p.0) {
                        let fewer: Vec<_> =
                            args.iter().filter(|(k, _)| k != req_key).cloned().collect();
                        let t = bad(render_call(name, name, &fewer, python));
                        assert!(!g.accepts_str(&t), "{t:?}");
                        rejected[2] += 1;
                    }
                    // an unknown parameter
                    let mut more = args.clone();
                    more.push(("zz_unknown".into(), json!("v")));
                    let t = bad(render_call(name, name, &more, python));
                    assert!(!g.accepts_str(&t), "{t:?}");
                    rejected[3] += 1;
                    // a non-integer for an integer
                    if let Some(pos) = args.iter().position(|(k, _)| {
                        spec.params.iter().any(|p| &p.0 == k && p.1 == Kind::Int)
                    }) {
                        for v in [json!(1.5), json!("x"), json!(true)] {
                            let mut wrong = args.clone();
                            wrong[pos].1 = v;
                            let t = bad(render_call(name, name, &wrong, python));
                            assert!(!g.accepts_str(&t), "{t:?}");
                        }
                        rejected[4] += 1;
                    }
                    // a tool other than the one `Function` names
                    if let ToolChoice::Function(_) = &choice {
                        if let Some(other) = specs.iter().find(|s| s.name != specs[target].name) {
                            let t = bad(render_call(
                                &other.name,
                                &other.name,
                                &other.args(&mut rng),
                                python,
                            ));
                            assert!(!g.accepts_str(&t), "{t:?}");
                            rejected[5] += 1;
                        }
                    }
                    // two calls where only one is allowed
                    if !parallel {
                        let t = bad(render_calls(&[calls[0].clone(), calls[0].clone()], python));
                        assert!(!g.accepts_str(&t), "{t:?}");
                        rejected[6] += 1;
                    }
                }
            }
        }
        assert!(accepted >= 600, "{accepted}");
        assert!(rejected.iter().all(|&n| n >= 10), "{rejected:?}");
    }

    #[test]
    fn grammar_specifics() {
        let weather = tool(
            "get_weather",
            json!({"type": "object",
                   "properties": {"city": {"type": "string"},
                                  "days": {"type": "integer", "minimum": 1, "maximum": 7},
                                  "unit": {"enum": ["c", "f"]}},
                   "required": ["city"]}),
        );
        let req = request(vec![weather], ToolChoice::Required, false);
        let g = grammar(&plan(&req).unwrap().unwrap());
        let call = |body: &str| {
            format!(
                " to=get_weather<|message|><atem:function_calls>\n<atem:invoke \
                 name=\"get_weather\">\n{body}</atem:invoke>\n</atem:function_calls>"
            )
        };
        let p = |k: &str, v: &str| format!("<atem:parameter name=\"{k}\">{v}</atem:parameter>\n");
        assert!(g.accepts_str(&call(&p("city", "Paris"))));
        assert!(g.accepts_str(&call(&(p("city", "") + &p("days", "7") + &p("unit", "f")))));
        // schema bounds, enum values, order, repetition
        assert!(!g.accepts_str(&call(&(p("city", "x") + &p("days", "8")))));
        assert!(!g.accepts_str(&call(&(p("city", "x") + &p("unit", "k")))));
        assert!(!g.accepts_str(&call(&(p("days", "2") + &p("city", "x")))));
        assert!(!g.accepts_str(&call(&(p("city", "x") + &p("city", "y")))));
        // reasoning first, but no answer instead of the call
        let think = " to=self<|message|>hmm <|eo <|eom <|start|>assistant to=user<|message|>\
                     <|eom|><|start|>assistant";
        assert!(g.accepts_str(&format!("{think}{}", call(&p("city", "x")))));
        assert!(!g.accepts_str(" to=user<|message|>hello"));
        assert!(!g.accepts_str(&format!(
            " to=self<|message|>a<|eot|>b<|eom|><|start|>assistant{}",
            call(&p("city", "x"))
        )));
        // the template's layout and llama.cpp's optional spaces
        let spaced = " to=get_weather<|message|><atem:function_calls><atem:invoke \
                      name=\"get_weather\"> <atem:parameter name=\"city\">x</atem:parameter>\n\n  \
                      </atem:invoke> </atem:function_calls>";
        assert!(g.accepts_str(spaced));
    }

    #[test]
    fn text_without_delimiters_is_exact() {
        let mut rng = Rng(5);
        let cases: &[(&[&str], &[&str])] = &[
            (
                &[PARAM_CLOSE],
                &[
                    "<",
                    "/",
                    "a",
                    "t",
                    "e",
                    "m",
                    ":",
                    "p",
                    "r",
                    ">",
                    "x",
                    "</atem:param",
                    "</",
                    "eter>",
                    "<</atem:",
                    PARAM_CLOSE,
                    "é",
                ],
            ),
            (
                &[EOM, EOT],
                &[
                    "<", "|", "e", "o", "m", "t", ">", "y", "<|eo", "m|>", "t|>", EOM, EOT, "<|",
                ],
            ),
            // overlapping and nested delimiters
            (
                &["aab", "ab", "bab", "cabc"],
                &["a", "b", "c", "d", "ca", "ab"],
            ),
            (&["abab", "xaby"], &["a", "b", "x", "y", "ab", "aba"]),
        ];
        for (delims, pieces) in cases {
            let rules = text_without("t", delims);
            let g = Grammar::parse(&format!("root ::= t\n{rules}"))
                .unwrap_or_else(|e| panic!("{e}\n{rules}"));
            let (mut yes, mut no) = (0, 0);
            for _ in 0..3000 {
                let n = rng.below(12);
                let s: String = (0..n).map(|_| *rng.pick(pieces)).collect();
                let free = !delims.iter().any(|d| s.contains(d));
                assert_eq!(g.accepts_str(&s), free, "{s:?} {delims:?}\n{rules}");
                if free {
                    yes += 1
                } else {
                    no += 1
                }
            }
            assert!(yes > 300 && no > 300, "{delims:?}: {yes} {no}");
        }
        // long texts stay cheap (right recursion, no growing stacks)
        let rules = text_without("t", &[PARAM_CLOSE]);
        let g =
            Grammar::parse(&format!("root ::= t \"{}\"\n{rules}", "</atem:parameter>")).unwrap();
        let long = "</atem:parameter <</ atem".repeat(20_000);
        assert!(g.accepts_str(&format!("{long}</atem:parameter>")));
        assert!(!g.accepts_str(&format!("{long}</atem:parameter></atem:parameter>")));
    }

    /// The template's own rendering (jinja2, `tojson` as json.dumps) of an assistant message
    /// with reasoning and two calls, after the generation prompt `<|start|>assistant`.
    const TEMPLATE_TEXT: &str = " to=self<|message|>think<|eom|><|start|>assistant \
        to=get_weather<|message|><atem:function_calls>\n<atem:invoke name=\"get_weather\">\n\
        <atem:parameter name=\"city\">Pa\"ris <x></atem:parameter>\n\
        <atem:parameter name=\"days\">3</atem:parameter>\n\
        <atem:parameter name=\"t\">1.5</atem:parameter>\n\
        <atem:parameter name=\"ok\">true</atem:parameter>\n\
        <atem:parameter name=\"n\">null</atem:parameter>\n\
        <atem:parameter name=\"xs\">[1, 2]</atem:parameter>\n\
        <atem:parameter name=\"o\">{\"a\": \"b\", \"c\": 2}</atem:parameter>\n\
        </atem:invoke>\n</atem:function_calls><|eom|><|start|>assistant to=g<|message|>\
        <atem:function_calls>\n<atem:invoke name=\"g\">\n</atem:invoke>\n</atem:function_calls><|eot|>";

    #[test]
    fn template_rendering_is_accepted_and_read_back() {
        let args = json!({"city": "Pa\"ris <x>", "days": 3, "t": 1.5, "ok": true, "n": null,
                          "xs": [1, 2], "o": {"a": "b", "c": 2}});
        let mut props = Map::new();
        for (k, t) in [
            ("city", json!("string")),
            ("days", json!("integer")),
            ("t", json!("number")),
            ("ok", json!("boolean")),
            ("n", json!("null")),
            ("xs", json!("array")),
            ("o", json!("object")),
        ] {
            props.insert(k.to_string(), json!({"type": t}));
        }
        let tools = vec![
            tool(
                "get_weather",
                json!({"type": "object", "properties": props}),
            ),
            tool("g", json!({"type": "object", "properties": {}})),
        ];
        let req = request(tools, ToolChoice::Required, true);
        let g = grammar(&plan(&req).unwrap().unwrap());
        let body = TEMPLATE_TEXT.strip_suffix(EOT).unwrap();
        assert!(g.accepts_str(body));
        // the test renderer writes the same text
        let mut rendered = render_reasoning(&["think".to_string()]);
        let pairs: Vec<(String, Value)> = args
            .as_object()
            .unwrap()
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        rendered.push_str(&render_calls(
            &[("get_weather".into(), pairs), ("g".into(), vec![])],
            true,
        ));
        assert_eq!(rendered, body);
        let p = parse(TEMPLATE_TEXT, Some(&req));
        assert_eq!(
            (p.content.as_str(), p.reasoning.as_deref()),
            ("", Some("think"))
        );
        let names: Vec<&str> = p.tool_calls.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(names, ["get_weather", "g"]);
        let got: Value = serde_json::from_str(&p.tool_calls[0].arguments).unwrap();
        assert_eq!(got, args);
        assert_eq!(p.tool_calls[1].arguments, "{}");
    }

    // --- plan errors and shapes ---

    #[test]
    fn plan_choices_and_errors() {
        let ok = tool(
            "f",
            json!({"type": "object", "properties": {"a": {"type": "integer"}}}),
        );
        assert_eq!(
            plan(&request(vec![ok.clone()], ToolChoice::None, false)).unwrap(),
            None
        );
        let auto = plan(&request(vec![ok.clone()], ToolChoice::Auto, true))
            .unwrap()
            .unwrap();
        assert_eq!(
            auto.triggers,
            vec![Trigger::Pattern(trigger(&[ok.name.as_str()]))]
        );
        assert!(auto.gbnf.starts_with("root ::= atem-call"));
        assert_eq!(
            plan(&request(vec![], ToolChoice::Auto, false)).unwrap(),
            None
        );
        assert!(plan(&request(vec![], ToolChoice::Required, false)).is_err());
        let e = plan(&request(
            vec![ok.clone()],
            ToolChoice::Function("g".into()),
            false,
        ))
        .unwrap_err();
        assert!(e.contains("`g`"), "{e}");
        // no `properties`: a call without parameters
        let bare = plan(&request(
            vec![tool("ping", json!({"type": "object"}))],
            ToolChoice::Required,
            false,
        ))
        .unwrap()
        .unwrap();
        let g = grammar(&bare);
        assert!(g.accepts_str(&render_call("ping", "ping", &[], false)));
        assert!(!g.accepts_str(&render_call(
            "ping",
            "ping",
            &[("a".into(), json!(1))],
            false
        )));
        let errs = [
            (tool("bad name", json!({})), "bad name"),
            (tool("self", json!({})), "self"),
            (tool("a<b", json!({})), "a<b"),
            (tool("f", json!({"type": "string"})), "`type`"),
            (tool("f", json!([1])), "parameters"),
            (tool("f", json!({"anyOf": [{}]})), "anyOf"),
            (
                tool("f", json!({"properties": {"a": {}}, "required": ["b"]})),
                "`b`",
            ),
            (
                tool(
                    "f",
                    json!({"properties": {"xs": {"type": "array",
                                                 "items": {"type": "string", "pattern": "(?=a)"}}}}),
                ),
                "parameter `xs`",
            ),
            (
                tool(
                    "f",
                    json!({"properties": {"n": {"type": "integer", "minimum": 5, "maximum": 1}}}),
                ),
                "parameter `n`",
            ),
        ];
        for (t, needle) in errs {
            let e = plan(&request(
                vec![ok.clone(), t.clone()],
                ToolChoice::Auto,
                false,
            ))
            .unwrap_err();
            // the problem and the tool
            assert!(e.contains(needle), "{e}");
            assert!(e.contains(&format!("`{}`", t.name)), "{e}");
        }
    }

    #[test]
    fn raw_strings_keep_their_constraints_or_are_refused() {
        // A string parameter's lengths hold in the raw text; what raw text cannot carry (a
        // pattern, a format, a constrained branch) is refused, never dropped; a mixed enum is
        // one of its values (strings raw, others as JSON).
        let one = |p: Value| {
            let t = tool(
                "f",
                json!({"type": "object", "properties": {"s": p}, "required": ["s"]}),
            );
            let req = request(vec![t], ToolChoice::Required, false);
            plan(&req).map(|p| (grammar(&p.unwrap()), req))
        };
        let call = |v: Value| render_call("f", "f", &[("s".into(), v)], false);
        let (g, req) = one(json!({"type": "string", "minLength": 1, "maxLength": 2})).unwrap();
        for (v, ok) in [
            ("a", true),
            ("ab", true),
            ("", false),
            ("abc", false),
            ("a<", false),
        ] {
            assert_eq!(g.accepts_str(&call(json!(v))), ok, "{v:?}");
        }
        let p = parse(&call(json!("ab")), Some(&req));
        assert_eq!(p.tool_calls[0].arguments, r#"{"s":"ab"}"#);
        let (g, req) = one(json!({"enum": ["a", 1, null]})).unwrap();
        for (v, ok) in [
            (json!("a"), true),
            (json!(1), true),
            (json!(null), true),
            (json!("b"), false),
            (json!(2), false),
        ] {
            assert_eq!(g.accepts_str(&call(v.clone())), ok, "{v}");
        }
        let p = parse(&call(json!(1)), Some(&req));
        assert_eq!(p.tool_calls[0].arguments, r#"{"s":1}"#);
        assert!(one(json!({"type": ["string", "null"]})).is_ok());
        assert!(one(json!({"anyOf": [{"type": "string"}, {"type": "integer"}]})).is_ok());
        for (schema, needle) in [
            (json!({"type": "string", "pattern": "^a+$"}), "`pattern`"),
            (json!({"type": "string", "format": "date"}), "`format`"),
            (
                json!({"type": "string", "minLength": 1000000}),
                "`minLength`",
            ),
            (
                json!({"type": "string", "minLength": 3, "maxLength": 2}),
                "below",
            ),
            (
                json!({"type": ["string", "null"], "maxLength": 2}),
                "`maxLength`",
            ),
            (
                json!({"anyOf": [{"type": "string", "maxLength": 2}, {"type": "integer"}]}),
                "`anyOf`",
            ),
        ] {
            let e = one(schema.clone())
                .err()
                .unwrap_or_else(|| panic!("{schema} accepted"));
            assert!(e.contains(needle) && e.contains("`s`"), "{schema}: {e}");
        }
    }

    #[test]
    fn refs_into_the_parameters_schema_resolve() {
        let t = tool(
            "f",
            json!({"type": "object",
                   "properties": {"n": {"$ref": "#/$defs/small"}, "s": {"$ref": "#/$defs/name"}},
                   "required": ["n", "s"],
                   "$defs": {"small": {"type": "integer", "maximum": 3},
                             "name": {"type": "string"}}}),
        );
        let req = request(vec![t], ToolChoice::Required, false);
        let g = grammar(&plan(&req).unwrap().unwrap());
        let call =
            |n: Value, s: Value| render_call("f", "f", &[("n".into(), n), ("s".into(), s)], false);
        assert!(g.accepts_str(&call(json!(3), json!("4"))));
        assert!(!g.accepts_str(&call(json!(4), json!("4"))));
        let p = parse(&call(json!(3), json!("4")), Some(&req));
        assert_eq!(p.tool_calls[0].arguments, r#"{"n":3,"s":"4"}"#);
    }

    // --- the trigger ---

    #[test]
    fn trigger_finds_call_headers_only() {
        // llama.cpp's pattern, and Muser's narrowed to the names offered, find the same headers
        // when every call names an offered tool; the narrowed one ignores another name.
        let names = ["get_weather", "a.b", "selfish", "users", "x y"];
        let ours = fancy_regex::Regex::new(&trigger(&names)).unwrap();
        let re = fancy_regex::Regex::new(TRIGGER).unwrap();
        let first = |t: &str| -> Option<usize> {
            let a = re.captures(t).unwrap().map(|c| c.get(1).unwrap().start());
            let b = ours.captures(t).unwrap().map(|c| c.get(1).unwrap().start());
            assert_eq!(a, b, "{t:?}");
            a
        };
        let only = fancy_regex::Regex::new(&trigger(&["get_weather"])).unwrap();
        assert!(only.is_match(" to=get_weather<|message|>").unwrap());
        assert!(!only.is_match(" to=tools.get_weather<|message|>").unwrap());
        assert!(!only.is_match(" to=get_weather <|message|>").unwrap());
        assert!(!only
            .is_match("x<|start|>assistant to=a.b<|message|>")
            .unwrap());
        let mut rng = Rng(3);
        let words = ["hello", " to", "=", "self", "x < y", "|", "to=user", "\n"];
        for _ in 0..500 {
            let reasoning: Vec<String> = (0..rng.below(3))
                .map(|_| (0..rng.below(5)).map(|_| *rng.pick(&words)).collect())
                .collect();
            let answer: Option<String> = rng
                .chance(50)
                .then(|| (0..rng.below(5)).map(|_| *rng.pick(&words)).collect());
            let name = *rng.pick(&["get_weather", "a.b", "selfish", "users", "x y"]);
            let with_call = rng.chance(70) || answer.is_none();
            let mut text = render_reasoning(&reasoning);
            if let Some(a) = &answer {
                text.push_str(rng.pick::<&str>(&[" to=user<|message|>", "<|message|>"]));
                text.push_str(a);
                if with_call {
                    text.push_str("<|eom|><|start|>assistant");
                }
            }
            let at = text.len();
            if with_call {
                text.push_str(&render_call(name, name, &[("q".into(), json!("z"))], false));
            } else {
                text.push_str("<|eot|>");
            }
            assert_eq!(first(&text), with_call.then_some(at), "{text:?}");
        }
        assert_eq!(first(" to=a.b<|message|>"), Some(0));
        assert_eq!(first(" to=self<|message|>x<|eom|>"), None);
        assert_eq!(first(" to=user<|message|>x"), None);
        assert_eq!(first("x to=a.b<|message|>"), None);
    }

    // --- parse ---

    #[test]
    fn parse_gives_back_rendered_calls() {
        let mut rng = Rng(29);
        let mut n_calls = 0;
        for _ in 0..150 {
            let specs = random_specs(&mut rng);
            let tools: Vec<Tool> = specs.iter().map(Spec::tool).collect();
            let req = request(tools, ToolChoice::Auto, true);
            let calls: Vec<(String, Vec<(String, Value)>)> = (0..1 + rng.below(3))
                .map(|_| {
                    let s = rng.pick(&specs);
                    (s.name.clone(), s.args(&mut rng))
                })
                .collect();
            let reasoning: Vec<String> = (0..rng.below(3))
                .map(|_| random_reasoning(&mut rng))
                .collect();
            let reasoning: Vec<String> = reasoning
                .into_iter()
                .filter(|r| !r.contains(EOM) && !r.contains(EOT))
                .collect();
            let answer = rng
                .chance(30)
                .then(|| random_string(&mut rng).replace(EOM, ""));
            let mut text = render_reasoning(&reasoning);
            if let Some(a) = &answer {
                text.push_str(&format!(" to=user<|message|>{a}<|eom|><|start|>assistant"));
            }
            text.push_str(&render_calls(&calls, rng.chance(50)));
            text.push_str(rng.pick::<&str>(&["", "<|eot|>", "<|eom|>"]));
            check_stream(&text, &req);

            let p = parse(&text, Some(&req));
            assert_eq!(p.content, answer.clone().unwrap_or_default(), "{text:?}");
            let joined = reasoning.join("\n");
            assert_eq!(
                p.reasoning,
                (!joined.is_empty()).then_some(joined),
                "{text:?}"
            );
            assert_eq!(p.tool_calls.len(), calls.len(), "{text:?}");
            for (got, (name, args)) in p.tool_calls.iter().zip(&calls) {
                assert_eq!(&got.name, name);
                assert_eq!(got.id, None);
                let v: Value = serde_json::from_str(&got.arguments).unwrap();
                assert_eq!(v, args_value(args), "{text:?}");
                n_calls += 1;
            }
            // without the request: JSON where the text is a JSON non-string, else the text
            let p = parse(&text, None);
            for (got, (_, args)) in p.tool_calls.iter().zip(&calls) {
                let v: Value = serde_json::from_str(&got.arguments).unwrap();
                let expect: Map<String, Value> = args
                    .iter()
                    .map(|(k, v)| {
                        let raw = render_value(v, false);
                        let back = match serde_json::from_str::<Value>(&raw) {
                            Ok(j) if !j.is_string() => j,
                            _ => Value::String(raw),
                        };
                        (k.clone(), back)
                    })
                    .collect();
                assert_eq!(v, Value::Object(expect), "{text:?}");
            }
        }
        assert!(n_calls > 250, "{n_calls}");
    }

    #[test]
    fn parse_examples() {
        let offered = request(
            vec![tool("f", json!({})), tool("g", json!({}))],
            ToolChoice::Auto,
            true,
        );
        let p = |t: &str| {
            let r = parse(t, Some(&offered));
            (r.content, r.reasoning, r.tool_calls.len())
        };
        let s = |x: &str| x.to_string();
        // a random model's text
        assert_eq!(
            p("Hello <|eom|> world"),
            (s("Hello <|eom|> world"), None, 0)
        );
        assert_eq!(p(" today"), (s(" today"), None, 0));
        assert_eq!(p(""), (s(""), None, 0));
        // channels
        assert_eq!(
            p(" to=self<|message|>think<|eom|><|start|>assistant to=user<|message|>Hi<|eot|>"),
            (s("Hi"), Some(s("think")), 0)
        );
        assert_eq!(p("<|message|>Hi<|eom|>"), (s("Hi"), None, 0));
        assert_eq!(
            p(" to=self<|message|>a<|eom|><|start|>assistant to=self<|message|>b<|eom|><|start|>assistant<|message|>c"),
            (s("c"), Some(s("a\nb")), 0)
        );
        // truncated reasoning; trailing separators and headers
        assert_eq!(p(" to=self<|message|>thin"), (s(""), Some(s("thin")), 0));
        assert_eq!(
            p(" to=self<|message|>t<|eom|><|start|>assistant to=us"),
            (s(""), Some(s("t")), 0)
        );
        assert_eq!(p(" to=sel"), (s(""), None, 0));
        // the format broken after a message: the rest verbatim
        assert_eq!(
            p(" to=self<|message|>R<|eom|>junk"),
            (s("<|eom|>junk"), Some(s("R")), 0)
        );
        assert_eq!(p("<|message|>Hi<|eot|>more"), (s("Hi<|eot|>more"), None, 0));
        // an answer, then a call
        let call = render_call("f", "f", &[("x".into(), json!(1))], false);
        assert_eq!(
            p(&format!(
                "<|message|>Hi<|eom|><|start|>assistant{call}<|eot|>"
            )),
            (s("Hi"), None, 1)
        );
        // a malformed or unfinished call: verbatim
        assert_eq!(
            p(" to=f<|message|>{\"x\": 1}"),
            (s(" to=f<|message|>{\"x\": 1}"), None, 0)
        );
        let cut = &call[..call.len() - 5];
        assert_eq!(
            p(&format!("<|message|>Hi<|eom|><|start|>assistant{cut}")),
            (format!("Hi<|eom|><|start|>assistant{cut}"), None, 0)
        );
        // several invokes in one block
        let two = " to=f<|message|><atem:function_calls><atem:invoke name=\"f\"></atem:invoke>\
                   <atem:invoke name=\"g\"><atem:parameter name=\"k\">v</atem:parameter></atem:invoke>\
                   </atem:function_calls>";
        let r = parse(two, Some(&offered));
        assert_eq!(
            r.tool_calls
                .iter()
                .map(|c| c.name.as_str())
                .collect::<Vec<_>>(),
            ["f", "g"]
        );
        assert_eq!(r.tool_calls[1].arguments, r#"{"k":"v"}"#);
        // Calls are read only of offered tools, and not under tool_choice "none": else the
        // call message is text, verbatim from the end of the message before it.
        let answered = format!("<|message|>Hi<|eom|><|start|>assistant{call}<|eot|>");
        let verbatim = format!("Hi<|eom|><|start|>assistant{call}<|eot|>");
        let none = request(offered.tools.clone(), ToolChoice::None, false);
        let other = request(vec![tool("g", json!({}))], ToolChoice::Auto, false);
        for req in [None, Some(&none), Some(&other)] {
            let r = parse(&answered, req);
            assert_eq!(
                (r.content.as_str(), r.tool_calls.len()),
                (verbatim.as_str(), 0)
            );
            assert!(verbatim.starts_with(&parse_partial(&answered, req).content));
        }
        let r = parse(two, Some(&other));
        assert_eq!((r.content.as_str(), r.tool_calls.len()), (two, 0));
    }

    #[test]
    fn argument_types_follow_the_schema() {
        let t = tool(
            "f",
            json!({"properties": {"s": {"type": "string"}, "n": {"type": "integer"},
                                  "sn": {"type": ["string", "integer"]}, "any": {},
                                  "o": {"type": "object"}}}),
        );
        let req = request(vec![t], ToolChoice::Auto, false);
        let args = |pairs: &[(&str, &str)]| {
            let mut body = String::new();
            for (k, v) in pairs {
                body.push_str(&format!(
                    "<atem:parameter name=\"{k}\">{v}</atem:parameter>\n"
                ));
            }
            let text = format!(
                " to=f<|message|><atem:function_calls>\n<atem:invoke name=\"f\">\n{body}</atem:invoke>\n</atem:function_calls>"
            );
            let p = parse(&text, Some(&req));
            serde_json::from_str::<Value>(&p.tool_calls[0].arguments).unwrap()
        };
        assert_eq!(args(&[("s", "12")]), json!({"s": "12"}));
        assert_eq!(args(&[("s", "\"q\"")]), json!({"s": "\"q\""}));
        assert_eq!(args(&[("n", "12")]), json!({"n": 12}));
        assert_eq!(args(&[("n", "twelve")]), json!({"n": "twelve"}));
        assert_eq!(args(&[("sn", "12")]), json!({"sn": 12}));
        assert_eq!(args(&[("sn", "true")]), json!({"sn": "true"}));
        assert_eq!(args(&[("any", "[1]")]), json!({"any": [1]}));
        assert_eq!(args(&[("any", "\"q\"")]), json!({"any": "\"q\""}));
        assert_eq!(args(&[("o", "{\"a\": 1}")]), json!({"o": {"a": 1}}));
        assert_eq!(args(&[("other", "null")]), json!({"other": null}));
        assert_eq!(args(&[("other", "a b")]), json!({"other": "a b"}));
    }

    // --- streaming ---

    #[test]
    fn partial_is_a_prefix_of_every_continuation() {
        let call = render_call(
            "get_weather",
            "get_weather",
            &[("city".into(), json!("Paris"))],
            false,
        );
        let block = call.split_once("<|message|>").unwrap().1.to_string();
        let fragments: Vec<&str> = vec![
            " to=self",
            " to=user",
            " to=get_weather",
            "<|message|>",
            "<|eom|>",
            "<|eot|>",
            "<|start|>assistant",
            "<atem:function_calls>\n",
            &call,
            &block,
            "hello",
            " world",
            "to",
            "=",
            "\n",
            "<",
            "|",
            "é",
            "<|eo",
            "</atem:function_calls>",
            "<atem:invoke name=\"get_weather\">",
            "<atem:invoke name=\"h\">",
            "<atem:parameter name=\"city\">",
            "<atem:parameter name=\"n\">",
            "12",
            "</atem:parameter>",
            "</atem:invoke>",
        ];
        let req = request(
            vec![tool(
                "get_weather",
                json!({"properties": {"city": {"type": "string"}, "n": {"type": "integer"}}}),
            )],
            ToolChoice::Auto,
            true,
        );
        let mut rng = Rng(17);
        let (mut prefixes, mut with_reasoning, mut with_content) = (0, 0, 0);
        let (mut with_calls, mut begun_only) = (0, 0);
        for _ in 0..4000 {
            let n = 1 + rng.below(10);
            let mut text = String::new();
            // mostly texts that start the way the format does
            if rng.chance(70) {
                text.push_str(rng.pick::<&str>(&[
                    " to=self<|message|>",
                    "<|message|>",
                    " to=user<|message|>",
                ]));
            }
            let pieces: String = (0..n).map(|_| *rng.pick(&fragments)).collect();
            if rng.chance(50) {
                text.push_str(&pieces);
            } else {
                // a call, with the pieces written into it, or cut there
                if rng.chance(50) {
                    text = render_reasoning(&[random_reasoning(&mut rng)]);
                }
                let mut args = vec![("city".to_string(), json!(random_string(&mut rng)))];
                if rng.chance(50) {
                    args.push(("n".into(), json!(rng.below(1000))));
                }
                if rng.chance(50) {
                    args.reverse();
                }
                let c = render_call("get_weather", "get_weather", &args, false);
                let at = (0..=rng.below(c.len() + 1).min(c.len()))
                    .rfind(|&i| c.is_char_boundary(i))
                    .unwrap_or(0);
                text.push_str(&c[..at]);
                if rng.chance(50) {
                    text.push_str(&pieces);
                }
                if rng.chance(50) {
                    text.push_str(&c[at..]);
                }
            }
            let (full, n) = check_prefixes(&text, Some(&req));
            with_reasoning += full.reasoning.is_some() as usize;
            with_content += !full.content.is_empty() as usize;
            with_calls += !full.tool_calls.is_empty() as usize;
            // calls begun in a block that broke or was cut: the final reading is streaming's
            begun_only += (parse_final(&text, &req) != full) as usize;
            prefixes += n;
            check_prefixes(&text, None);
        }
        assert!(
            prefixes > 100_000
                && with_reasoning > 500
                && with_content > 500
                && with_calls > 300
                && begun_only > 300,
            "{prefixes} {with_reasoning} {with_content} {with_calls} {begun_only}"
        );
    }

    fn parse_final(text: &str, req: &ToolRequest) -> Parsed {
        Format::Atem.parse_final(text, Some(req))
    }

    /// Checks streaming `text`: for every prefix, the content and reasoning `parse_partial`
    /// gives are prefixes of what `parse` gives for the whole text and are never taken back,
    /// its calls never shrink (the same names, the arguments only growing) and `parse_final`
    /// goes on from them. Returns what `parse` gives and the number of prefixes checked.
    fn check_prefixes(text: &str, req: Option<&ToolRequest>) -> (Parsed, usize) {
        let full = parse(text, req);
        let fin = Format::Atem.parse_final(text, req);
        let (content, reasoning) = (&full.content, full.reasoning.clone().unwrap_or_default());
        let mut sent = Parsed::default();
        let mut checked = 0;
        for (i, _) in text.char_indices().chain([(text.len(), ' ')]) {
            let p = parse_partial(&text[..i], req);
            let at = &text[..i];
            assert!(
                content.starts_with(&p.content) && p.content.starts_with(&sent.content),
                "content: {:?} of {at:?} vs {content:?} of {text:?}",
                p.content,
            );
            let r = p.reasoning.clone().unwrap_or_default();
            let r_sent = sent.reasoning.clone().unwrap_or_default();
            assert!(
                reasoning.starts_with(&r) && r.starts_with(&r_sent),
                "reasoning: {r:?} of {at:?} vs {reasoning:?} of {text:?}",
            );
            check_call_step(&sent, &p, &fin, at);
            assert!(p.tool_calls.iter().all(|c| offered(req, &c.name)), "{at:?}");
            sent = p;
            checked += 1;
        }
        (full, checked)
    }

    /// Checks streaming a well-formed output (one the grammar takes): `check_prefixes`, and
    /// `parse`'s own reading goes on from every prefix's calls (`parse_final` is `parse`), and
    /// the calls are all sent whole by the end.
    fn check_stream(text: &str, req: &ToolRequest) {
        let (full, _) = check_prefixes(text, Some(req));
        assert_eq!(parse_final(text, req), full, "{text:?}");
        let end = parse_partial(text, Some(req));
        assert_eq!(end.tool_calls, full.tool_calls, "{text:?}");
    }

    #[test]
    fn partial_streams_text_as_it_comes() {
        let pp = |t: &str| {
            let p = parse_partial(t, None);
            (p.content, p.reasoning.unwrap_or_default())
        };
        let s = |x: &str| x.to_string();
        assert_eq!(pp(" to=self<|message|>abc<|e"), (s(""), s("abc")));
        assert_eq!(
            pp(" to=self<|message|>abc<|eom|><|start|>assistant<|message|>He"),
            (s("He"), s("abc"))
        );
        assert_eq!(pp("Hello <|eo"), (s("Hello <|eo"), s("")));
        assert_eq!(pp("<|message|>Hello <|eo"), (s("Hello "), s("")));
        assert_eq!(
            pp(" to=get_weather<|message|><atem:function_calls>"),
            (s(""), s(""))
        );
        assert_eq!(pp(" to=us"), (s(""), s("")));
    }

    #[test]
    fn partial_streams_calls_as_they_come() {
        let req = request(
            vec![
                tool(
                    "get_weather",
                    json!({"properties": {"city": {"type": "string"}, "days": {"type": "integer"}}}),
                ),
                tool("g", json!({})),
            ],
            ToolChoice::Auto,
            true,
        );
        let call = |name: &str, args: &str| ToolCall {
            id: None,
            name: name.into(),
            arguments: args.into(),
        };
        let pp = |t: &str| parse_partial(t, Some(&req));
        let head = " to=self<|message|>hm<|eom|><|start|>assistant to=get_weather<|message|>\
                    <atem:function_calls>\n<atem:invoke name=\"get_wea";
        let city = format!("{head}ther\">\n<atem:parameter name=\"city\">Pa\"ris </atem:par");
        let days = format!("{city}ameter>\n<atem:parameter name=\"days\">1");
        let done = format!("{days}2</atem:parameter>\n</atem:invoke>");
        let next = format!(
            "{done}\n</atem:function_calls><|eom|><|start|>assistant to=g<|message|>\
             <atem:function_calls><atem:invoke name=\"g\">"
        );
        let weather = r#"{"city":"Pa\"ris ","days":12}"#;
        for (t, calls) in [
            (head.to_string(), vec![]),
            (format!("{head}ther\">"), vec![call("get_weather", "{")]),
            // a string's characters as they come, less a tail that may close it
            (
                city.clone(),
                vec![call("get_weather", r#"{"city":"Pa\"ris "#)],
            ),
            // an integer once closed
            (days, vec![call("get_weather", r#"{"city":"Pa\"ris ""#)]),
            (done.clone(), vec![call("get_weather", weather)]),
            (next, vec![call("get_weather", weather), call("g", "{")]),
        ] {
            let p = pp(&t);
            assert_eq!(p.tool_calls, calls, "{t:?}");
            // the reasoning and the content stream as they did
            assert_eq!(
                (p.content.as_str(), p.reasoning.as_deref()),
                ("", Some("hm"))
            );
        }
        // The final reading of a call cut short is streaming's; no call of a tool not offered,
        // nor any after it, nor without tools or under tool_choice "none".
        let fin = Format::Atem.parse_final(&city, Some(&req));
        assert_eq!(
            fin.tool_calls,
            [call("get_weather", r#"{"city":"Pa\"ris "#)]
        );
        assert_eq!(fin.reasoning.as_deref(), Some("hm"));
        let other = done.replace("invoke name=\"get_weather\"", "invoke name=\"h\"");
        assert_eq!(
            pp(&format!("{other}<atem:invoke name=\"g\">")).tool_calls,
            []
        );
        let none = request(req.tools.clone(), ToolChoice::None, false);
        assert_eq!(parse_partial(&done, Some(&none)).tool_calls, []);
        assert_eq!(parse_partial(&done, None).tool_calls, []);
        // A parameter given twice keeps its first value, streamed and finished; the call
        // streams on after it.
        let twice = " to=g<|message|><atem:function_calls><atem:invoke name=\"g\">\
                     <atem:parameter name=\"k\">1</atem:parameter>\
                     <atem:parameter name=\"k\">2</atem:parameter></atem:invoke>\
                     </atem:function_calls>";
        let cut = twice.find("2</atem").unwrap() + 1;
        assert_eq!(pp(&twice[..cut]).tool_calls, [call("g", r#"{"k":1"#)]);
        assert_eq!(pp(twice).tool_calls, [call("g", r#"{"k":1}"#)]);
        assert_eq!(
            parse(twice, Some(&req)).tool_calls,
            [call("g", r#"{"k":1}"#)]
        );
        assert_eq!(
            Format::Atem.parse_final(twice, Some(&req)).tool_calls,
            [call("g", r#"{"k":1}"#)]
        );
    }

    /// Random calls whose parameters are given again (a new value, after the first), after
    /// random reasoning: `parse` keeps each name's first value, streaming agrees with it at
    /// every prefix, and the parameters after a repeat stream on: at each call's
    /// `</atem:invoke>` (its block not yet closed) the streamed arguments are the final ones.
    #[test]
    fn streams_past_a_repeated_parameter() {
        let mut rng = Rng(0xA7E4_2026);
        let mut repeats = 0;
        for round in 0..80 {
            let specs = random_specs(&mut rng);
            let tools: Vec<Tool> = specs.iter().map(Spec::tool).collect();
            let req = request(tools, ToolChoice::Auto, true);
            let mut calls = Vec::new();
            let mut want = Vec::new();
            for _ in 0..1 + rng.below(3) {
                let spec = rng.pick(&specs);
                let first = spec.args(&mut rng);
                let mut args = first.clone();
                for _ in 0..rng.below(4) {
                    if args.is_empty() {
                        break;
                    }
                    let k = args[rng.below(args.len())].0.clone();
                    let kind = spec.params.iter().find(|p| p.0 == k).unwrap().1;
                    let at = args.iter().position(|(p, _)| *p == k).unwrap() + 1;
                    let at = at + rng.below(args.len() - at + 1);
                    args.insert(at, (k, random_value(&mut rng, kind)));
                    repeats += 1;
                }
                calls.push((spec.name.clone(), args));
                want.push((spec.name.clone(), args_value(&first)));
            }
            let reasoning: Vec<String> =
                (0..round % 2).map(|_| random_reasoning(&mut rng)).collect();
            let text = render_reasoning(&reasoning) + &render_calls(&calls, false);
            let parsed = parse(&text, Some(&req));
            assert_eq!(parsed.tool_calls.len(), want.len(), "{text:?}");
            for (c, (name, a)) in parsed.tool_calls.iter().zip(&want) {
                assert_eq!(&c.name, name);
                assert_eq!(c.arguments, a.to_string(), "{text:?}");
            }
            check_stream(&text, &req);
            for (i, (end, t)) in text.match_indices("</atem:invoke>").enumerate() {
                let p = parse_partial(&text[..end + t.len()], Some(&req));
                assert_eq!(p.tool_calls[i], parsed.tool_calls[i], "{text:?}");
            }
        }
        assert!(repeats > 80, "{repeats}");
    }
}
