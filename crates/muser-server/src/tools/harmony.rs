//! OpenAI's harmony format (gpt-oss: the `openai-gpt-oss-120b.jinja` template; llama.cpp's
//! `common/parsers/gpt-oss.cpp` handler).
//!
//! The generation prompt ends with `<|start|>assistant`; the model's output is one or more
//! messages, each a header, `<|message|>` and a body, ended by `<|end|>` (then
//! `<|start|>assistant` and the next message), `<|call|>` or `<|return|>` (the model's stop
//! tokens), or the end of the output. A header names a channel, `<|channel|>analysis`,
//! `commentary` or `final`, and may name a recipient, ` to=functions.NAME`, before the channel
//! (in the role header) or after it; a call's header may end with a content type
//! (` json`, ` <|constrain|>json`). A message's body:
//!
//! * `analysis` without a recipient: reasoning (`reasoning_content`);
//! * `final`, and `commentary` without a recipient (a preamble before calls): content;
//! * `commentary` or `analysis` to `functions.NAME`: a call of NAME, its body the arguments
//!   as a JSON object.
//!
//! gpt-oss now and then writes a stray `<|channel|>commentary` (or `<|channel|>commentary
//! to=assistant`) before the channel it means; it is skipped, as llama.cpp skips it.
//!
//! # Plan (grammar)
//!
//! * `Auto`: lazy, from llama.cpp's triggers (a call's header: ` to` at the output's start or
//!   after `<|start|>assistant`, or `<|channel|>commentary to` / `analysis to` there); the
//!   grammar is one call, or with parallel calls several, each closed by `<|call|>` and the next
//!   opened by `<|start|>assistant` (gpt-oss stops at `<|call|>`, so it writes one).
//! * `Required` / `Function(N)`: the whole output: analysis messages and commentary preambles
//!   (each ended by `<|end|><|start|>assistant`), then the call(s).
//! * A response format beside tools under `auto` (`plan_with_response`): the messages before,
//!   then the calls or a final message whose body is the response's JSON.
//!
//! * A response format without tools (or with `tool_choice` none): the same, with the final
//!   message only (`Format::reply_grammar`).
//!
//! A call's arguments are held by the tool's schema (muser-jsonschema). A content type after a
//! call's recipient or channel must follow whitespace or `<|constrain|>` (llama.cpp's grammar
//! lets a random model run a type on from the name, `analysisjsonjson...`, without end).
//!
//! # Parse
//!
//! Messages are read left to right: reasoning bodies joined as they come, content bodies too,
//! calls in order. Where the text stops following the format (a random model's output from its
//! first character, a header with an unknown channel or recipient, a call of a tool not
//! offered or with `tool_choice` none, arguments that are not a JSON object, a message end
//! followed by something other than `<|start|>assistant`), the rest of the text, from that
//! message's start (the end token of the message before) on, is appended verbatim to the
//! content: nothing read before changes, so what was streamed stays valid. A function's name is
//! the longest offered name the recipient starts with (a content type may follow it without a
//! space, as llama.cpp reads it). A piece of an end token, or of a header after a message, that
//! ends the output is dropped, as llama.cpp drops it. Streaming holds those back, and sends a call once its header
//! is whole and its arguments' object has begun, the arguments as far as they are sure
//! (`partial::Json::stable_object`). A prompt that continues a message leaves its header open:
//! the output is read after it (`Format::continued_header`).

use super::atem::{lit, take, Step};
use super::partial::{self, Json};
use super::xml_args::text_without;
use super::{
    allowed_tools, arguments_schema, call_of, fresh_rule, json_prefix, rename_rule, rule_names,
    tool_rules, Parsed, Plan, ToolCall, ToolChoice, ToolRequest, Trigger,
};
use muser_jsonschema::gbnf_literal;
use serde_json::Value;

const START: &str = "<|start|>assistant";
const CHANNEL: &str = "<|channel|>";
const MESSAGE: &str = "<|message|>";
const CONSTRAIN: &str = "<|constrain|>";
const END: &str = "<|end|>";
const CALL: &str = "<|call|>";
const RETURN: &str = "<|return|>";
const TO: &str = " to=";
const FUNCTIONS: &str = "functions.";
/// The tokens that end a message.
const ENDS: [&str; 3] = [END, CALL, RETURN];

/// The markup llama.cpp preserves for gpt-oss (its message framing), and `<|call|>`, which
/// closes a call before a parallel one.
pub(super) const MARKUP: &[&str] = &[
    "<|channel|>",
    "<|constrain|>",
    "<|message|>",
    "<|start|>",
    "<|end|>",
    "<|call|>",
];

/// llama.cpp's triggers of a lazy call grammar: ` to` (the role header's recipient) or a
/// commentary or analysis channel's ` to=functions` as the whole output so far, or either
/// after `<|start|>assistant` (the grammar starts at the capture group).
pub(super) const TRIGGERS: [&str; 4] = [
    r"^\s+to$",
    r"^<\|channel\|>(?:commentary|analysis)\s+to=functions$",
    r"<\|start\|>assistant(\s+to)",
    r"<\|start\|>assistant(<\|channel\|>(?:commentary|analysis)\s+to)",
];

/// Whether a template writes harmony's channels (llama.cpp's test for gpt-oss).
pub(super) fn detect(template: &str) -> bool {
    template.contains(CHANNEL)
}

// ---------------------------------------------------------------------------------------------
// Plan

/// The rules every harmony grammar shares: the channels a call may go in, the content type
/// after a call's recipient, and the messages that may come before the calls (analysis, with
/// gpt-oss's stray commentary header before it, and commentary preambles).
fn shared_rules() -> String {
    let before_end = gbnf_literal(&format!("{END}{START}"));
    let mut g = format!(
        "harmony-channel ::= {} ( \"commentary\" | \"analysis\" )\n\
         harmony-constraint ::= [ \\t\\n]* {} [A-Za-z0-9_-]+ | [ \\t\\n]+ [A-Za-z0-9_-]+\n\
         harmony-before ::= ( ( {} ( {} )? )? {} | {} ) harmony-text {before_end}\n",
        gbnf_literal(CHANNEL),
        gbnf_literal(CONSTRAIN),
        gbnf_literal(&format!("{CHANNEL}commentary")),
        gbnf_literal(" to=assistant"),
        gbnf_literal(&format!("{CHANNEL}analysis{MESSAGE}")),
        gbnf_literal(&format!("{CHANNEL}commentary{MESSAGE}")),
    );
    g.push_str(&text_without("harmony-text", &[END]));
    g
}

/// The calls' rule (`harmony-calls`) and the rules of each tool's call.
fn call_rules(req: &ToolRequest) -> Result<Option<String>, String> {
    let Some(tools) = allowed_tools(req)? else {
        return Ok(None);
    };
    let mut alts = Vec::with_capacity(tools.len());
    let mut rules = String::new();
    for (i, t) in tools.iter().enumerate() {
        let (args, r) = tool_rules(t, &arguments_schema(t), &format!("harmony-tool{i}-"))?;
        let to = gbnf_literal(&format!("{TO}{FUNCTIONS}{}", t.name));
        rules.push_str(&format!(
            "harmony-call-{i} ::= ( {to} harmony-channel | harmony-channel {to} ) \
             harmony-constraint? {} {args}\n",
            gbnf_literal(MESSAGE)
        ));
        rules.push_str(r.trim_end());
        rules.push('\n');
        alts.push(format!("harmony-call-{i}"));
    }
    let more = if req.parallel {
        format!(
            " ( {} harmony-call )*",
            gbnf_literal(&format!("{CALL}{START}"))
        )
    } else {
        String::new()
    };
    Ok(Some(format!(
        "harmony-calls ::= harmony-call{more}\nharmony-call ::= {}\n{rules}",
        alts.join(" | ")
    )))
}

pub(super) fn plan(req: &ToolRequest) -> Result<Option<Plan>, String> {
    let Some(calls) = call_rules(req)? else {
        return Ok(None);
    };
    let lazy = req.choice == ToolChoice::Auto;
    let root = if lazy {
        "root ::= harmony-calls\n"
    } else {
        "root ::= harmony-before* harmony-calls\n"
    };
    Ok(Some(Plan {
        gbnf: format!("{root}{calls}{}", shared_rules()),
        lazy,
        triggers: if lazy {
            TRIGGERS
                .iter()
                .map(|t| Trigger::Pattern(t.to_string()))
                .collect()
        } else {
            Vec::new()
        },
        system: None,
    }))
}

/// Under `auto` with a response format: the whole output, the messages before, then the calls
/// or a final message whose body is the response (in llama.cpp's layout:
/// `<|channel|>final`, an optional content type, `<|message|>`, the JSON).
pub(super) fn plan_with_response(req: &ToolRequest, response: &Value) -> Result<Plan, String> {
    let forced = ToolRequest {
        choice: ToolChoice::Required,
        response: None,
        ..req.clone()
    };
    let calls = call_rules(&forced)?.ok_or_else(|| "no tools".to_string())?;
    let shared = shared_rules();
    let mut taken = rule_names(&calls);
    taken.extend(rule_names(&shared));
    taken.insert("root".into());
    let prefix = fresh_rule(&mut taken, "response-format");
    let (top, rules) = muser_jsonschema::schema_to_gbnf_rules(response, &format!("{prefix}-"))
        .map_err(|e| format!("the response format cannot be made a grammar: {e}"))?;
    if let Some(clash) = rule_names(&rules).intersection(&taken).next() {
        return Err(format!(
            "the response format's grammar and the calls' share the rule `{clash}`"
        ));
    }
    let gbnf = format!(
        "root ::= harmony-before* ( harmony-calls | {} harmony-constraint? {} {top} )\n\
         {calls}{shared}{}",
        gbnf_literal(&format!("{CHANNEL}final")),
        gbnf_literal(MESSAGE),
        rename_rule(&rules, "root", &prefix),
    );
    Ok(Plan {
        gbnf,
        lazy: false,
        triggers: Vec::new(),
        system: None,
    })
}

impl super::Format {
    /// The grammar `gbnf` (a request's JSON response format, without tools to call) as gpt-oss
    /// writes a reply in it, as llama.cpp holds it: analysis messages and preambles, then a
    /// final message whose body `gbnf` holds. Another format's grammar is returned as it is.
    pub fn reply_grammar(self, gbnf: &str) -> String {
        if self != super::Format::Harmony {
            return gbnf.to_string();
        }
        let mut taken = rule_names(gbnf);
        let shared = shared_rules();
        taken.extend(rule_names(&shared));
        let reply = fresh_rule(&mut taken, "harmony-reply");
        format!(
            "root ::= harmony-before* {} harmony-constraint? {} {reply}\n{shared}{}",
            gbnf_literal(&format!("{CHANNEL}final")),
            gbnf_literal(MESSAGE),
            rename_rule(gbnf, "root", &reply)
        )
    }
}

impl super::Format {
    /// The header of the message a prompt leaves open when it continues a final assistant
    /// message (`continued`), which the output goes on from, for gpt-oss: its analysis when
    /// the reasoning is continued, else its final message (`ChatTemplate::render_request`
    /// writes them). "" for other formats, and where nothing is continued.
    pub fn continued_header(self, continued: Option<crate::chat::Continue>) -> &'static str {
        use crate::chat::Continue;
        match (self, continued) {
            (super::Format::Harmony, Some(Continue::Reasoning)) => "<|channel|>analysis<|message|>",
            (super::Format::Harmony, Some(_)) => "<|channel|>final<|message|>",
            _ => "",
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Parse

/// What a message's header makes of its body.
#[derive(Debug, PartialEq)]
enum Kind {
    Reasoning,
    Content,
    /// A call of the function named.
    Call(String),
}

/// The length of the run of characters at the start of `s` that `keep` takes.
fn run_len(s: &str, keep: impl Fn(char) -> bool) -> usize {
    s.char_indices()
        .find(|&(_, c)| !keep(c))
        .map_or(s.len(), |(i, _)| i)
}

fn is_name_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-')
}

/// ` to=NAME` at the start of `s` (None: `s` does not start with ` to=`). A function's name
/// is the longest of `names` (the tools offered) that the text after `functions.` starts with,
/// as llama.cpp's grammar knows the names (a content type may follow a name without a space);
/// another recipient is the run of name characters.
fn recipient<'s>(s: &'s str, names: &[&str]) -> Option<Step<&'s str>> {
    match lit(s, TO) {
        Step::Done(..) => {}
        Step::More => return Some(Step::More),
        Step::Broken => return None,
    }
    let rest = &s[TO.len()..];
    if let Some(f) = rest.strip_prefix(FUNCTIONS) {
        if names.iter().any(|n| n.starts_with(f)) {
            // the text may go on into a name
            return Some(Step::More);
        }
        if let Some(n) = names
            .iter()
            .filter(|n| f.starts_with(**n))
            .max_by_key(|n| n.len())
        {
            let at = TO.len() + FUNCTIONS.len() + n.len();
            return Some(Step::Done(&s[TO.len()..at], at));
        }
    }
    let n = run_len(rest, is_name_char);
    Some(if n == rest.len() {
        Step::More
    } else if n == 0 {
        Step::Broken
    } else {
        Step::Done(&rest[..n], TO.len() + n)
    })
}

/// A content type before `<|message|>`, as llama.cpp's grammar takes it: optional whitespace,
/// optional `<|constrain|>`, then a type name. Done(()) with no bytes where there is none.
fn constraint(s: &str) -> Step<()> {
    let ws = run_len(s, char::is_whitespace);
    let mut p = ws;
    match lit(&s[p..], CONSTRAIN) {
        Step::Done(..) => p += CONSTRAIN.len(),
        Step::More if p < s.len() => return Step::More,
        _ => {}
    }
    let n = run_len(&s[p..], |c| {
        c.is_ascii_alphanumeric() || matches!(c, '_' | '-')
    });
    if p + n == s.len() {
        Step::More
    } else if n == 0 && p > 0 {
        // whitespace (or `<|constrain|>`) with no type after it
        Step::Broken
    } else {
        Step::Done((), p + n)
    }
}

/// The channels of harmony.
const CHANNELS: [&str; 3] = ["analysis", "commentary", "final"];

/// A message header, through `<|message|>`: what its body is, and the header's length.
/// `names`: the tools that may be called.
fn header(s: &str, names: &[&str]) -> Step<Kind> {
    let mut p = 0;
    // gpt-oss's stray commentary header before the one it means
    let stray = format!("{CHANNEL}commentary");
    let to_assistant = format!("{TO}assistant{CHANNEL}");
    if let Some(after) = s.strip_prefix(&stray) {
        if after.starts_with(CHANNEL) {
            p = stray.len();
        } else if after.starts_with(&to_assistant) {
            p = stray.len() + to_assistant.len() - CHANNEL.len();
        } else if !after.is_empty()
            && (CHANNEL.starts_with(after) || to_assistant.starts_with(after))
        {
            return Step::More;
        }
    }
    let mut to = None;
    if let Some(r) = recipient(&s[p..], names) {
        to = Some(take!(r, p));
    }
    take!(lit(&s[p..], CHANNEL), p);
    let rest = &s[p..];
    let Some(channel) = CHANNELS.iter().find(|c| rest.starts_with(**c)) else {
        return if CHANNELS.iter().any(|c| c.starts_with(rest)) {
            Step::More
        } else {
            Step::Broken
        };
    };
    p += channel.len();
    if to.is_none() {
        if let Some(r) = recipient(&s[p..], names) {
            to = Some(take!(r, p));
        }
    }
    let kind = match (to, *channel) {
        (None, "analysis") => Kind::Reasoning,
        (None, "commentary" | "final") => Kind::Content,
        (Some(t), "commentary" | "analysis") => match t.strip_prefix(FUNCTIONS) {
            Some(name) if !name.is_empty() => Kind::Call(name.to_string()),
            _ => return Step::Broken,
        },
        _ => return Step::Broken,
    };
    // a call's content type, or a final message's (a response format's)
    if matches!(kind, Kind::Call(_)) || *channel == "final" {
        take!(constraint(&s[p..]), p);
    }
    take!(lit(&s[p..], MESSAGE), p);
    Step::Done(kind, p)
}

/// Whether `req` lets the model call the tool `name` (offered, `tool_choice` not `none`).
fn offered(req: Option<&ToolRequest>, name: &str) -> bool {
    req.is_some_and(|r| r.choice != ToolChoice::None && r.tools.iter().any(|t| t.name == name))
}

/// Length of the longest suffix of `s` that is a proper prefix of a message's end token.
fn held_back(s: &str) -> usize {
    (1..s.len().min(RETURN.len()) + 1)
        .rev()
        .find(|&k| {
            s.is_char_boundary(s.len() - k) && ENDS.iter().any(|e| e.starts_with(&s[s.len() - k..]))
        })
        .unwrap_or(0)
}

#[derive(Default)]
struct Scan {
    content: String,
    reasoning: String,
    /// The whole calls, as `parse` reads them.
    calls: Vec<ToolCall>,
    /// The calls as streaming reads them (the last one's arguments perhaps still open).
    begun: Vec<ToolCall>,
}

/// Reads the output. `complete`: the whole output (else only what no continuation changes).
fn scan(text: &str, complete: bool, req: Option<&ToolRequest>) -> Scan {
    let mut out = Scan::default();
    let names: Vec<&str> = match req {
        Some(r) if r.choice != ToolChoice::None => {
            r.tools.iter().map(|t| t.name.as_str()).collect()
        }
        _ => Vec::new(),
    };
    // start of the current message's header
    let mut pos = 0;
    // where the verbatim rest starts if the current message breaks the format
    let mut seg = 0;
    loop {
        let broken = |out: &mut Scan| out.content.push_str(&text[seg..]);
        let e = match header(&text[pos..], &names) {
            // an unfinished header: trailing markup, or still to come
            Step::More if !complete => return out,
            Step::More => {
                // a header cut short at the end is dropped, unless nothing was read before it
                if pos == 0 {
                    broken(&mut out);
                }
                return out;
            }
            Step::Broken => {
                broken(&mut out);
                return out;
            }
            Step::Done(Kind::Call(name), _) if !offered(req, &name) => {
                broken(&mut out);
                return out;
            }
            Step::Done(Kind::Call(name), n) => {
                let body = &text[pos + n..];
                let whole = if complete {
                    json_prefix(body)
                } else {
                    match partial::read(body) {
                        partial::Read {
                            json: Json::Whole(v, end),
                            ..
                        } => Some((v, end)),
                        r => {
                            let arguments = r.json.stable_object();
                            // a call is begun once its arguments' object is
                            if arguments.is_empty() && r.broken {
                                broken(&mut out);
                            } else if !arguments.is_empty() {
                                out.begun.push(ToolCall {
                                    id: None,
                                    name,
                                    arguments,
                                });
                            }
                            return out;
                        }
                    }
                };
                let Some(call) = whole.and_then(|(v, end)| Some((call_of(&name, &v)?, end))) else {
                    broken(&mut out);
                    return out;
                };
                let (call, end) = call;
                out.begun.push(call.clone());
                out.calls.push(call);
                let after = &body[end..];
                let ws = run_len(after, char::is_whitespace);
                pos + n + end + ws
            }
            Step::Done(kind, n) => {
                let body = &text[pos + n..];
                let dest = if kind == Kind::Reasoning {
                    &mut out.reasoning
                } else {
                    &mut out.content
                };
                match ENDS.iter().filter_map(|t| body.find(t)).min() {
                    Some(j) => {
                        dest.push_str(&body[..j]);
                        pos + n + j
                    }
                    None => {
                        // (a trailing piece of an end token is dropped at the end too, as
                        // llama.cpp drops it)
                        dest.push_str(&body[..body.len() - held_back(body)]);
                        return out;
                    }
                }
            }
        };
        // a message ended at `e` (after a call, perhaps with no end token)
        let rest = &text[e..];
        if rest.is_empty() {
            return out;
        }
        let after = ENDS
            .iter()
            .find_map(|t| rest.strip_prefix(t))
            .unwrap_or(rest);
        if let Some(next) = after.strip_prefix(START) {
            seg = e;
            pos = text.len() - next.len();
            continue;
        }
        // a message's end and the next one's start cut short are dropped; anything else
        // breaks the format
        if !(START.starts_with(after) || ENDS.iter().any(|x| x.starts_with(rest))) {
            out.content.push_str(rest);
        }
        return out;
    }
}

impl Scan {
    /// The reading: the whole calls, or those begun (`streamed`).
    fn parsed(self, streamed: bool) -> Parsed {
        Parsed {
            content: self.content,
            reasoning: (!self.reasoning.is_empty()).then_some(self.reasoning),
            tool_calls: if streamed { self.begun } else { self.calls },
        }
    }
}

pub(super) fn parse(text: &str, req: Option<&ToolRequest>) -> Parsed {
    scan(text, true, req).parsed(false)
}

/// Content and reasoning as far as no continuation changes them; the calls begun.
pub(super) fn parse_partial(text: &str, req: Option<&ToolRequest>) -> Parsed {
    scan(text, false, req).parsed(true)
}

/// A well-formed output of calls (`test_util::random_output`'s): `text`, if any, as a
/// commentary preamble, then the calls, each in a random header layout, its arguments in a
/// random JSON layout, joined by `<|call|><|start|>assistant`.
#[cfg(test)]
pub(super) fn test_output(
    rng: &mut super::test_util::Rng,
    text: &str,
    calls: &[(&super::Tool, Value)],
) -> String {
    let mut out = String::new();
    if !text.is_empty() {
        out = format!("{CHANNEL}commentary{MESSAGE}{text}{END}{START}");
    }
    let calls: Vec<String> = calls
        .iter()
        .map(|(t, a)| {
            let l = super::test_util::layouts(a);
            format!("{}{}", test_header(rng, &t.name), l[rng.below(l.len())])
        })
        .collect();
    out + &calls.join(&format!("{CALL}{START}"))
}

/// A call's header in one of the layouts gpt-oss writes: the recipient in the role header or
/// the channel header, commentary or analysis, with or without a content type.
#[cfg(test)]
fn test_header(rng: &mut super::test_util::Rng, name: &str) -> String {
    let channel = ["commentary", "analysis"][rng.below(2)];
    let constraint = [
        "",
        " json",
        " <|constrain|>json",
        "<|constrain|>json",
        "\n  code",
    ][rng.below(5)];
    if rng.coin() {
        format!("{TO}{FUNCTIONS}{name}{CHANNEL}{channel}{constraint}{MESSAGE}")
    } else {
        format!("{CHANNEL}{channel}{TO}{FUNCTIONS}{name}{constraint}{MESSAGE}")
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_util::*;
    use super::super::{Format, ToolChoice};
    use super::*;

    const F: Format = Format::Harmony;

    #[test]
    fn detects_the_gpt_oss_template_only() {
        let all = check_detect_all(
            |t| detect(t).then_some(Format::Harmony),
            &[("openai-gpt-oss-120b.jinja", Format::Harmony)],
        );
        if let Some((_, src)) = all.iter().find(|(f, _)| f == "openai-gpt-oss-120b.jinja") {
            assert_eq!(Format::detect(Some(src)).name(), "harmony");
        }
    }

    /// Random text of a message body: markup characters, never an end token.
    fn body(rng: &mut Rng) -> String {
        let mut t = markup_text(rng, 0, 12);
        for piece in ["<|start|>", "<|channel|>", "to=", " json", "{"] {
            if rng.below(4) == 0 {
                t.push_str(piece);
                t.push_str(&markup_text(rng, 0, 3));
            }
        }
        t
    }

    /// Checks streaming `text`: for every prefix, the content and reasoning `parse_partial`
    /// gives are prefixes of `parse`'s and never taken back, and its calls go on from those
    /// before and `parse_final` goes on from them. Returns `parse`'s reading.
    fn check_prefixes(text: &str, req: Option<&ToolRequest>) -> Parsed {
        let full = F.parse(text, req);
        let fin = F.parse_final(text, req);
        let mut sent = Parsed::default();
        for p in prefixes(text) {
            let part = F.parse_partial(p, req);
            assert!(part.content.starts_with(&sent.content), "{text:?} / {p:?}");
            assert!(full.content.starts_with(&part.content), "{text:?} / {p:?}");
            let r = |x: &Parsed| x.reasoning.clone().unwrap_or_default();
            assert!(r(&part).starts_with(&r(&sent)), "{text:?} / {p:?}");
            assert!(r(&full).starts_with(&r(&part)), "{text:?} / {p:?}");
            check_call_step(&sent, &part, &fin, p);
            sent = part;
        }
        full
    }

    /// Analysis, preambles and final messages, with and without tools: reasoning and content
    /// are the bodies joined in order, streamed as they grow.
    #[test]
    fn channels_split_reasoning_from_content() {
        let mut rng = Rng(0x5EED_0A55);
        let tools = f_req(false);
        let mut checked = 0;
        for round in 0..300 {
            let (mut reasoning, mut content) = (None::<String>, String::new());
            let mut msgs = Vec::new();
            let end = ["", "<|end|>", "<|return|>", "<|end|><|start|>assistant"][rng.below(4)];
            let n = 1 + rng.below(4);
            for i in 0..n {
                let mut b = body(&mut rng);
                let written = b.clone();
                if i == n - 1 && end.is_empty() {
                    // a piece of an end token that ends the output is dropped
                    b.truncate(b.len() - held_back(&b));
                }
                match rng.below(4) {
                    0 | 1 => {
                        let stray = [
                            "",
                            "<|channel|>commentary",
                            "<|channel|>commentary to=assistant",
                        ][rng.below(3)];
                        msgs.push(format!("{stray}<|channel|>analysis<|message|>{written}"));
                        reasoning.get_or_insert_with(String::new).push_str(&b);
                    }
                    2 => {
                        msgs.push(format!("<|channel|>commentary<|message|>{written}"));
                        content.push_str(&b);
                    }
                    _ => {
                        msgs.push(format!("<|channel|>final<|message|>{written}"));
                        content.push_str(&b);
                    }
                }
            }
            let text = msgs.join("<|end|><|start|>assistant") + end;
            let req = (round % 2 == 0).then_some(&tools);
            let p = check_prefixes(&text, req);
            assert_eq!(p.content, content, "{text:?}");
            assert_eq!(p.reasoning, reasoning.filter(|r| !r.is_empty()), "{text:?}");
            assert!(p.tool_calls.is_empty());
            checked += 1;
        }
        assert_eq!(checked, 300);
    }

    /// What does not follow the format is content, from the message that breaks it on; what
    /// was read before stays.
    #[test]
    fn text_that_breaks_the_format_is_content() {
        let r = f_req(false);
        let a = "<|channel|>analysis<|message|>think<|end|>";
        let call = "<|start|>assistant to=functions.f<|channel|>commentary";
        let cases: &[(&str, &str, &str, usize)] = &[
            ("Hello there", "", "Hello there", 0),
            (
                "<|channel|>bogus<|message|>x",
                "",
                "<|channel|>bogus<|message|>x",
                0,
            ),
            // an unknown recipient (a built-in tool), a tool not offered
            (
                "<|start|>assistant to=browser.search<|channel|>commentary<|message|>{}",
                "think",
                "",
                0,
            ),
            (
                "<|start|>assistant<|channel|>commentary to=functions.nosuch json<|message|>{}",
                "think",
                "",
                0,
            ),
            // arguments that are no object
            (&format!("{call}<|message|>[1]"), "think", "", 0),
            // text after a message's end
            ("junk", "think", "", 0),
            // a call, then junk
            (
                &format!("{call} json<|message|>{{}}<|call|>x"),
                "think",
                "<|call|>x",
                1,
            ),
        ];
        for (i, (tail, reasoning, content, n)) in cases.iter().enumerate() {
            let (text, content) = if i < 2 {
                (tail.to_string(), content.to_string())
            } else if content.is_empty() {
                (format!("{a}{tail}"), format!("<|end|>{tail}"))
            } else {
                (format!("{a}{tail}"), content.to_string())
            };
            let p = check_prefixes(&text, Some(&r));
            assert_eq!(p.content, content, "{text:?}");
            assert_eq!(p.reasoning.as_deref().unwrap_or(""), *reasoning, "{text:?}");
            assert_eq!(p.tool_calls.len(), *n, "{text:?}");
        }
        // no tools, or tool_choice none: a call is text
        let call = "<|channel|>commentary to=functions.f <|constrain|>json<|message|>{}";
        let mut none = r.clone();
        none.choice = ToolChoice::None;
        for q in [None, Some(&none)] {
            let p = check_prefixes(call, q);
            assert_eq!((p.content.as_str(), p.tool_calls.len()), (call, 0));
        }
        assert_eq!(F.plan(&none).unwrap(), None);
    }

    /// Random tools and calls: the grammar takes the calls in every header layout (after
    /// analysis messages and preambles where it holds the whole output), `parse` gives them
    /// back, streaming sends them as they grow; calls of other tools, broken arguments and text
    /// after the calls are refused.
    #[test]
    fn grammar_takes_calls_and_parse_reads_them() {
        let mut rng = Rng(0x5EED_6055);
        let mut accepted = 0;
        for round in 0..60 {
            let parallel = round % 2 == 1;
            let r = random_req(&mut rng, round, parallel);
            let p = F.plan(&r).unwrap().unwrap();
            assert_eq!(p.system, None);
            assert_eq!(p.lazy, r.choice == ToolChoice::Auto);
            if p.lazy {
                let want: Vec<Trigger> = TRIGGERS
                    .iter()
                    .map(|t| Trigger::Pattern(t.to_string()))
                    .collect();
                assert_eq!(p.triggers, want);
            }
            let g = grammar(&p);
            for _ in 0..4 {
                let calls = random_calls(&mut rng, &r);
                let mut text = String::new();
                let mut reasoning = None::<String>;
                if !p.lazy {
                    for _ in 0..rng.below(3) {
                        let b = body(&mut rng).replace('<', "[");
                        reasoning.get_or_insert_with(String::new).push_str(&b);
                        text +=
                            &format!("<|channel|>analysis<|message|>{b}<|end|><|start|>assistant");
                    }
                }
                let rendered: Vec<String> = calls
                    .iter()
                    .map(|(t, a)| {
                        let l = layouts(a);
                        format!(
                            "{}{}",
                            test_header(&mut rng, &t.name),
                            l[rng.below(l.len())]
                        )
                    })
                    .collect();
                text += &rendered.join("<|call|><|start|>assistant");
                assert!(g.accepts_str(&text), "{text:?}\n{}", p.gbnf);
                accepted += 1;
                let parsed = F.parse(&text, Some(&r));
                assert_eq!(parsed.reasoning, reasoning.filter(|r| !r.is_empty()));
                assert_eq!(parsed.content, "");
                assert_eq!(parsed.tool_calls.len(), calls.len());
                for (c, (t, a)) in parsed.tool_calls.iter().zip(&calls) {
                    assert_call(c, &t.name, a, None);
                }
                check_prefixes(&text, Some(&r));
                let end = F.parse_partial(&text, Some(&r));
                assert_eq!(end.tool_calls, parsed.tool_calls);
                // a `<|call|>` after the last call reads the same
                assert_eq!(F.parse(&format!("{text}<|call|>"), Some(&r)), parsed);
                assert!(!g.accepts_str(&format!("{text}<|end|>More")));
                let (t, a) = &calls[0];
                check_broken_args(&mut rng, &g, t, a, |b| {
                    format!("{}{b}", test_header(&mut Rng(7), &t.name))
                });
                if let Some((o, oa)) = other_tool(&mut rng, &r) {
                    let t = format!("{}{oa}", test_header(&mut rng, &o.name));
                    assert!(!g.accepts_str(&t), "took {t}");
                }
            }
        }
        assert_eq!(accepted, 240);
    }

    /// A response format beside tools under `auto`: the reply in the schema in a final
    /// message (after analysis), or the calls; raw JSON without a header is refused.
    #[test]
    fn a_response_format_comes_in_the_final_channel() {
        let mut rng = Rng(0x5EED_F1A1);
        for _ in 0..30 {
            let mut r = random_req(&mut rng, 0, false);
            let response = random_tools(&mut rng)[0].parameters.clone();
            let good = random_args(&mut rng, &response);
            r.response = Some(response.clone());
            let p = F.plan(&r).unwrap().unwrap();
            assert!(!p.lazy && p.triggers.is_empty());
            let g = grammar(&p);
            let ct = ["", " json", " <|constrain|>json"][rng.below(3)];
            let reply = format!(
                "<|channel|>analysis<|message|>hm<|end|><|start|>assistant<|channel|>final{ct}<|message|>{good}"
            );
            assert!(g.accepts_str(&reply), "{reply}\n{}", p.gbnf);
            assert!(!g.accepts_str(&good.to_string()));
            let parsed = F.parse(&reply, Some(&r));
            assert_eq!(
                serde_json::from_str::<Value>(&parsed.content).unwrap(),
                good
            );
            assert_eq!(parsed.reasoning.as_deref(), Some("hm"));
            for b in broken_args(&mut rng, &response, &good) {
                let t = format!("<|channel|>final<|message|>{b}");
                assert!(!g.accepts_str(&t), "took {t}");
            }
            let (t, a) = &random_calls(&mut rng, &r)[0];
            assert!(g.accepts_str(&format!("{}{a}", test_header(&mut rng, &t.name))));
        }
    }

    /// Random outputs slipped as a model without a grammar may: streaming never takes back
    /// what it sent, and the final reading goes on from it.
    #[test]
    fn slipped_outputs_stream_without_taking_back() {
        let pieces = [
            "<|end|>",
            "<|start|>assistant",
            "<|channel|>",
            "analysis",
            "final",
            " to=functions.",
            "<|message|>",
            "<|call|>",
            "<|constrain|>",
            "{",
            "}",
            "\"",
            " ",
        ];
        let mut rng = Rng(0x5EED_511B);
        for round in 0..200 {
            let r = random_req(&mut rng, round, true);
            let mut text = random_output(&mut rng, F, &r);
            if rng.coin() {
                text = format!(
                    "<|channel|>analysis<|message|>{}<|end|><|start|>assistant{text}",
                    body(&mut rng)
                );
            }
            for _ in 0..1 + rng.below(3) {
                mutate(&mut rng, &mut text, &pieces, 24);
            }
            check_prefixes(&text, Some(&r));
            check_prefixes(&text, None);
        }
    }

    /// llama-server's readings of raw gpt-oss outputs its grammar forced (a JSON list of
    /// `{"body", "raw", "content", "reasoning", "calls": [[name, arguments]]}`, collected with a
    /// tiny random model; the file named by `HARMONY_PAIRS`): Muser's final reading of each raw
    /// text, under the same request's tools, gives the same content, reasoning and calls (the
    /// arguments as JSON values). Run by hand: `HARMONY_PAIRS=... cargo test -p muser-server
    /// harmony_reads_as_llama_server -- --ignored --nocapture`.
    #[test]
    #[ignore]
    fn harmony_reads_as_llama_server() {
        let path = std::env::var("HARMONY_PAIRS").expect("HARMONY_PAIRS names the readings");
        let pairs: Vec<Value> =
            serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
        let (mut same, mut calls, mut differ) = (0, 0, Vec::new());
        // (an output cut inside a character: llama-server drops its bytes, its verbose text
        // shows U+FFFD, which Muser would keep)
        let whole_chars = |p: &&Value| {
            p.get("raw")
                .and_then(Value::as_str)
                .is_some_and(|r| !r.ends_with('\u{FFFD}'))
        };
        for p in pairs.iter().filter(whole_chars) {
            let body = p["body"].as_object().unwrap();
            let req = super::super::parse_tools(body).unwrap();
            let raw = p["raw"].as_str().unwrap();
            let got = F.parse_final(raw, req.as_ref());
            let args = |a: &str| serde_json::from_str::<Value>(a).ok();
            let want_calls: Vec<(String, Option<Value>)> = p["calls"]
                .as_array()
                .unwrap()
                .iter()
                .map(|c| (c[0].as_str().unwrap().into(), args(c[1].as_str().unwrap())))
                .collect();
            let got_calls: Vec<(String, Option<Value>)> = got
                .tool_calls
                .iter()
                .map(|c| (c.name.clone(), args(&c.arguments)))
                .collect();
            let ok = got.content == p["content"].as_str().unwrap()
                && got.reasoning.as_deref().unwrap_or("") == p["reasoning"].as_str().unwrap()
                && got_calls == want_calls;
            if ok {
                same += 1;
                calls += got_calls.len();
            } else {
                differ.push((raw.to_string(), p.clone(), got));
            }
        }
        for (raw, want, got) in &differ {
            let (c, r) = (&want["content"], &want["reasoning"]);
            println!(
                "raw {raw:?}\n  llama {c} / {r} / {}\n  muser {got:?}",
                want["calls"]
            );
        }
        println!(
            "{same} read the same ({calls} calls), {} differ",
            differ.len()
        );
        assert!(differ.is_empty());
    }
}
