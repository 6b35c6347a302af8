//! Gemma 4's calls: `<|tool_call>call:NAME{key:value,...}<tool_call|>`, written back to back
//! after the reply's text, their arguments in Gemma's own notation: keys bare, strings between
//! `<|"|>` marks (raw text, nothing escaped), numbers, `true`, `false` and `null` as in JSON,
//! objects in braces and lists in brackets.
//!
//! The reply may also hold thought channels, `<|channel>thought ... <channel|>`: the one that
//! starts the output is split off as reasoning ahead of this format (`think::GEMMA`); one later
//! in the reply is read here, its text added to the reasoning, as llama-server reads it. A
//! stray channel marker (a `<channel|>` that closes nothing, a `<|channel>` that opens no
//! thought; Gemma 4 may write one at the end of its reply) ends the reply's text: what follows
//! is not content, though calls after it are still read (llama-server drops it likewise).
//!
//! The grammar holds each tool's arguments to its schema in Gemma's notation, the keys in the
//! order the template writes them in the history (sorted as Jinja's `dictsort` sorts them).

use std::collections::HashMap;

use serde_json::Value;

use super::{
    allowed_tools, arguments_schema, calls_wanted, find_opening, offered, LazyStart, Parsed, Plan,
    Tool, ToolCall, ToolRequest,
};
use muser_jsonschema::gbnf_literal as literal;

/// The opening of a call (llama-server's trigger word), then `call:` and the tool's name.
const CALL_OPEN: &str = "<|tool_call>";
const CALL_NAME: &str = "call:";
const CALL_CLOSE: &str = "<tool_call|>";
/// The mark around a string.
const QUOTE: &str = "<|\"|>";
const CHANNEL_OPEN: &str = "<|channel>";
const CHANNEL_CLOSE: &str = "<channel|>";
const THOUGHT: &str = "thought";

pub(super) const LAZY_START: LazyStart = LazyStart::Word(CALL_OPEN);

/// The markup llama.cpp preserves for Gemma 4, and the string mark.
pub(super) const MARKUP: &[&str] = &[
    CHANNEL_OPEN,
    CHANNEL_CLOSE,
    CALL_OPEN,
    CALL_CLOSE,
    "<|turn>",
    QUOTE,
];

/// Most nesting of lists and objects an argument value is read to.
const MAX_DEPTH: usize = 128;

/// Whether a template teaches Gemma 4's calls (it writes `'<|tool_call>call:'`, as llama.cpp
/// detects it).
pub(crate) fn detect(template: &str) -> bool {
    template.contains("'<|tool_call>call:'")
}

// ---- the prompt ----

/// Whether a Gemma 4 template is of the older kind, which reads a turn's tool results from a
/// `tool_responses` field of its assistant message rather than from the `tool` messages after
/// it (it lacks the newer one's forward scan of them): its messages are then merged as
/// llama.cpp merges them for it ([`merge_tool_responses`]).
pub(crate) fn reads_tool_responses(template: &str) -> bool {
    detect(template) && !template.contains("{#- OpenAI Chat Completions:")
}

/// The messages as Gemma 4's older template reads them: each assistant message with calls
/// takes the `tool` messages after it as its `tool_responses` (`{"name", "response"}`: the
/// name of the call at the same place, else the result's `tool_call_id`; the response the
/// JSON its content holds, else the content), and the next assistant message's content where
/// that message has content and no calls (the turn's final answer).
pub(crate) fn merge_tool_responses(messages: &[Value]) -> Vec<Value> {
    let role = |m: &Value| {
        m.get("role")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string()
    };
    let calls = |m: &Value| {
        m.get("tool_calls")
            .and_then(Value::as_array)
            .filter(|c| !c.is_empty())
            .cloned()
    };
    let has_content = |m: &Value| match m.get("content") {
        Some(Value::String(s)) => !s.is_empty(),
        Some(Value::Array(a)) => !a.is_empty(),
        _ => false,
    };
    let mut out = Vec::new();
    let mut i = 0;
    while i < messages.len() {
        let m = &messages[i];
        let Some(tool_calls) = calls(m).filter(|_| role(m) == "assistant") else {
            out.push(m.clone());
            i += 1;
            continue;
        };
        let mut merged = serde_json::Map::new();
        merged.insert("role".into(), Value::from("assistant"));
        merged.insert("tool_calls".into(), Value::Array(tool_calls.clone()));
        i += 1;
        let mut responses = Vec::new();
        while i < messages.len() && role(&messages[i]) == "tool" {
            let t = &messages[i];
            let response = match t.get("content") {
                Some(Value::String(s)) => {
                    serde_json::from_str(s).unwrap_or_else(|_| Value::from(s.as_str()))
                }
                Some(v) => v.clone(),
                None => Value::Null,
            };
            let name = tool_calls
                .get(responses.len())
                .and_then(|c| c.pointer("/function/name"))
                .and_then(Value::as_str)
                .filter(|n| !n.is_empty())
                .or_else(|| t.get("tool_call_id").and_then(Value::as_str))
                .unwrap_or("");
            responses.push(serde_json::json!({"name": name, "response": response}));
            i += 1;
        }
        if let Some(next) = messages.get(i) {
            if role(next) == "assistant" && calls(next).is_none() && has_content(next) {
                merged.insert("content".into(), next["content"].clone());
                i += 1;
            }
        }
        if !responses.is_empty() {
            merged.insert("tool_responses".into(), Value::Array(responses));
        }
        if let Some(r @ Value::String(_)) = m.get("reasoning_content") {
            merged.insert("reasoning_content".into(), r.clone());
        }
        out.push(Value::Object(merged));
    }
    out
}

/// The turn a prompt that ends with a finished model turn (`<turn|>\n`) opens where the
/// template opens none (after a turn's tool results and answer), as llama.cpp opens it.
pub(crate) const REOPENED_TURN: (&str, &str) = ("<turn|>\n", "<|turn>model\n");

// ---- reading ----

/// How far the reading of a value (or of a call) got.
#[derive(Debug, PartialEq)]
enum Read {
    /// Whole, spanning this many bytes.
    Done(usize),
    /// The text ends before it does.
    Open,
    /// It stopped being well formed.
    Bad,
}

/// The length of the whitespace at the start of `s` (llama.cpp's grammar's space).
fn ws(s: &str) -> usize {
    s.len() - s.trim_start_matches([' ', '\t', '\n', '\r']).len()
}

/// `s` as a JSON string.
fn json_string(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_default()
}

/// `s` as the start of a JSON string that goes on (no closing quote).
fn open_json_string(s: &str) -> String {
    let mut j = json_string(s);
    j.pop();
    j
}

/// The length of the longest tail of `s` that is a proper prefix of `tag`.
fn held(s: &str, tags: &[&str]) -> usize {
    tags.iter()
        .flat_map(|t| (1..t.len()).filter(|&n| t.is_char_boundary(n) && s.ends_with(&t[..n])))
        .max()
        .unwrap_or(0)
}

/// Reads the value at the start of `s` (Gemma's notation), writing it to `out` as JSON text.
/// Whatever the outcome, `out` has the JSON of the longest well-formed start of it read (a
/// string less a tail that may be the start of its closing mark), so that the text written for
/// a longer `s` goes on from it.
fn value(s: &str, out: &mut String, depth: usize) -> Read {
    if depth > MAX_DEPTH {
        return Read::Bad;
    }
    if let Some(body) = s.strip_prefix(QUOTE) {
        return match body.find(QUOTE) {
            Some(end) => {
                out.push_str(&json_string(&body[..end]));
                Read::Done(QUOTE.len() + end + QUOTE.len())
            }
            None => {
                out.push_str(&open_json_string(
                    &body[..body.len() - held(body, &[QUOTE])],
                ));
                Read::Open
            }
        };
    }
    if QUOTE.starts_with(s) {
        return Read::Open;
    }
    match s.as_bytes()[0] {
        b'{' => object(s, out, depth),
        b'[' => list(s, out, depth),
        b'-' | b'0'..=b'9' => number(s, out),
        _ => {
            for word in ["true", "false", "null"] {
                if s.starts_with(word) {
                    out.push_str(word);
                    return Read::Done(word.len());
                }
                if word.starts_with(s) {
                    return Read::Open;
                }
            }
            Read::Bad
        }
    }
}

/// A JSON number at the start of `s` (JSON's syntax; Gemma writes numbers as JSON does).
fn number(s: &str, out: &mut String) -> Read {
    let b = s.as_bytes();
    let digits = |i: usize| b[i..].iter().take_while(|c| c.is_ascii_digit()).count();
    let mut i = usize::from(b[0] == b'-');
    let r = 'read: {
        match b.get(i) {
            None => break 'read Read::Open,
            Some(b'0') => i += 1,
            Some(b'1'..=b'9') => i += digits(i),
            _ => break 'read Read::Bad,
        }
        if b.get(i) == Some(&b'.') {
            i += 1;
            match digits(i) {
                0 if i == b.len() => break 'read Read::Open,
                0 => break 'read Read::Bad,
                n => i += n,
            }
        }
        if matches!(b.get(i), Some(b'e' | b'E')) {
            i += 1;
            if matches!(b.get(i), Some(b'+' | b'-')) {
                i += 1;
            }
            match digits(i) {
                0 if i == b.len() => break 'read Read::Open,
                0 => break 'read Read::Bad,
                n => i += n,
            }
        }
        // (a number at the end of the text may go on)
        if i == b.len() {
            Read::Open
        } else {
            Read::Done(i)
        }
    };
    out.push_str(&s[..i]);
    r
}

/// An object or a list at the start of `s`, opened by `open` and closed by `close`, its members
/// (each read by `member`, which reads no whitespace before it) separated by `,` right after
/// one; whitespace after the opening, after each `,` and before the closing.
fn members(
    s: &str,
    out: &mut String,
    (open, close): (char, char),
    mut member: impl FnMut(&str, &mut String) -> Read,
) -> Read {
    out.push(open);
    let mut i = 1 + ws(&s[1..]);
    if i == s.len() {
        return Read::Open;
    }
    if s[i..].starts_with(close) {
        out.push(close);
        return Read::Done(i + 1);
    }
    loop {
        match member(&s[i..], out) {
            Read::Done(n) => i += n,
            r => return r,
        }
        let w = ws(&s[i..]);
        match s[i + w..].chars().next() {
            None => return Read::Open,
            Some(c) if c == close => {
                out.push(close);
                return Read::Done(i + w + 1);
            }
            Some(',') if w == 0 => {
                out.push(',');
                i += 1 + ws(&s[i + 1..]);
                if i == s.len() {
                    return Read::Open;
                }
            }
            _ => return Read::Bad,
        }
    }
}

/// An object, `{key:value,...}` (whitespace also after `:`); a key is the text up to its `:`,
/// without `:` and `}`.
fn object(s: &str, out: &mut String, depth: usize) -> Read {
    members(s, out, ('{', '}'), |rest, out| {
        let k = match rest.find([':', '}']) {
            None => {
                out.push_str(&open_json_string(rest));
                return Read::Open;
            }
            Some(k) if k == 0 || rest.as_bytes()[k] == b'}' => {
                if k > 0 {
                    out.push_str(&open_json_string(&rest[..k]));
                }
                return Read::Bad;
            }
            Some(k) => k,
        };
        out.push_str(&json_string(&rest[..k]));
        out.push(':');
        let i = k + 1 + ws(&rest[k + 1..]);
        if i == rest.len() {
            return Read::Open;
        }
        match value(&rest[i..], out, depth + 1) {
            Read::Done(n) => Read::Done(i + n),
            r => r,
        }
    })
}

/// A list, `[value,...]`.
fn list(s: &str, out: &mut String, depth: usize) -> Read {
    members(s, out, ('[', ']'), |rest, out| value(rest, out, depth + 1))
}

/// How far a call is read: the call begun (once its name is whole and offered) with its
/// arguments as far as they are known, and how its text went.
struct CallRead {
    call: Option<ToolCall>,
    /// `Done(n)`: the call is whole, `n` bytes after its `<|tool_call>` (through its
    /// `<tool_call|>`).
    read: Read,
}

/// The call whose `<|tool_call>` ends right before `rest`.
fn read_call(rest: &str, req: Option<&ToolRequest>) -> CallRead {
    let none = |read| CallRead { call: None, read };
    let Some(after) = rest.strip_prefix(CALL_NAME) else {
        return none(if CALL_NAME.starts_with(rest) {
            Read::Open
        } else {
            Read::Bad
        });
    };
    let Some(brace) = after.find('{') else {
        let may_be_name = req.is_some_and(|r| r.tools.iter().any(|t| t.name.starts_with(after)));
        return none(if may_be_name { Read::Open } else { Read::Bad });
    };
    let name = &after[..brace];
    if !offered(req, name) {
        return none(Read::Bad);
    }
    let mut arguments = String::new();
    let args = &after[brace..];
    let read = match object(args, &mut arguments, 0) {
        Read::Done(n) => {
            let tail = &args[n..];
            if tail.starts_with(CALL_CLOSE) {
                Read::Done(CALL_NAME.len() + brace + n + CALL_CLOSE.len())
            } else if CALL_CLOSE.starts_with(tail) {
                Read::Open
            } else {
                Read::Bad
            }
        }
        r => r,
    };
    CallRead {
        call: Some(ToolCall {
            id: None,
            name: name.to_string(),
            arguments,
        }),
        read,
    }
}

/// The reading of a reply (after a thought channel that starts the output, which
/// `think::GEMMA` splits off): content, the reasoning of later thought channels, and the calls.
/// Finished (`partial` false), a call that is not whole and well formed stays in the content.
/// Unfinished, the reading stops at the first call not yet whole (that call begun, when its
/// name is), and holds back a tail that may be the start of a marker.
fn read(text: &str, req: Option<&ToolRequest>, partial: bool) -> Parsed {
    let calls_on = calls_wanted(req);
    let markers: &[&str] = if calls_on {
        &[CALL_OPEN, CHANNEL_OPEN, CHANNEL_CLOSE]
    } else {
        &[CHANNEL_OPEN, CHANNEL_CLOSE]
    };
    let mut content = String::new();
    let mut reasoning: Option<String> = None;
    let mut tool_calls = Vec::new();
    // After a stray channel marker the reply's text has ended: only calls are read.
    let mut ended = false;
    let mut rest = text;
    loop {
        let found = if ended {
            rest.find(CALL_OPEN)
                .filter(|_| calls_on)
                .map(|i| (i, CALL_OPEN))
        } else {
            find_opening(rest, markers)
        };
        let Some((i, marker)) = found else {
            if !ended {
                let keep = rest.len() - if partial { held(rest, markers) } else { 0 };
                content.push_str(&rest[..keep]);
            }
            break;
        };
        if !ended {
            content.push_str(&rest[..i]);
        }
        let after = &rest[i + marker.len()..];
        match marker {
            CALL_OPEN => {
                let c = read_call(after, req);
                match c.read {
                    Read::Done(n) => {
                        tool_calls.extend(c.call);
                        rest = &after[n..];
                    }
                    _ if partial => {
                        tool_calls.extend(c.call);
                        break;
                    }
                    _ => {
                        if !ended {
                            content.push_str(CALL_OPEN);
                        }
                        rest = after;
                    }
                }
            }
            CHANNEL_CLOSE => {
                ended = true;
                rest = after;
            }
            _ => {
                // empty channels, then a thought
                let mut at = &rest[i..];
                while let Some(a) = at.strip_prefix(CHANNEL_OPEN) {
                    if a.starts_with(THOUGHT) || partial && THOUGHT.starts_with(a) {
                        break;
                    }
                    at = a;
                }
                if partial && CHANNEL_OPEN.starts_with(at) {
                    break;
                }
                let Some(body) = at
                    .strip_prefix(CHANNEL_OPEN)
                    .and_then(|a| a.strip_prefix(THOUGHT))
                else {
                    if partial && at.starts_with(CHANNEL_OPEN) {
                        // (the start of `thought`)
                        break;
                    }
                    ended = true;
                    rest = at;
                    continue;
                };
                let body = &body[ws(body)..];
                let r = reasoning.get_or_insert_with(String::new);
                match body.find(CHANNEL_CLOSE) {
                    Some(end) => {
                        r.push_str(&body[..end]);
                        rest = &body[end + CHANNEL_CLOSE.len()..];
                    }
                    None if partial => {
                        r.push_str(&body[..body.len() - held(body, &[CHANNEL_CLOSE])]);
                        break;
                    }
                    None => {
                        r.push_str(body);
                        break;
                    }
                }
            }
        }
    }
    if calls_on {
        // (as the other formats trim the text before their calls)
        content.truncate(content.trim_end().len());
    }
    Parsed {
        content,
        reasoning,
        tool_calls,
    }
}

/// Reads a finished reply. Never fails: what does not follow the format is content.
pub(super) fn parse(text: &str, req: Option<&ToolRequest>) -> Parsed {
    read(text, req, false)
}

/// What streaming may send of an unfinished reply (`Format::parse_partial`).
pub(super) fn parse_partial(text: &str, req: Option<&ToolRequest>) -> Parsed {
    read(text, req, true)
}

// ---- the grammar ----

/// The calls' grammar: `<|tool_call>call:NAME{...}<tool_call|>`, once, or back to back where
/// parallel calls are allowed, each tool's arguments held by its schema.
pub(super) fn plan(req: &ToolRequest) -> Result<Option<Plan>, String> {
    let Some(tools) = allowed_tools(req)? else {
        return Ok(None);
    };
    let mut shared = Shared::default();
    let mut rules = String::new();
    let mut alts = Vec::new();
    for (i, t) in tools.iter().enumerate() {
        let mut c = Conv::new(t, i, &mut shared);
        let doc = c.doc.clone();
        let args = c.value(&doc, "#", 0)?;
        if !matches!(c.kind_of(&doc), Some(Kind::Object)) {
            return Err(c.error("#", "the arguments must be an object"));
        }
        rules.push_str(&c.rules);
        alts.push(format!("{} {args}", literal(&t.name)));
    }
    let mut gbnf = format!(
        "root ::= gemma4-call{}\ngemma4-call ::= {} ( {} ) {}\n",
        if req.parallel { "+" } else { "" },
        literal(&format!("{CALL_OPEN}{CALL_NAME}")),
        alts.join(" | "),
        literal(CALL_CLOSE)
    );
    gbnf.push_str(&rules);
    gbnf.push_str(&shared.rules());
    Ok(Some(Plan::calls(gbnf, &req.choice, LAZY_START)))
}

/// The rules the tools' grammars share: any value (for a schema that allows anything) and
/// free text inside a string.
#[derive(Default)]
struct Shared {
    any: bool,
    text: bool,
}

impl Shared {
    fn rules(&self) -> String {
        let mut out = String::new();
        if self.any {
            let q = literal(QUOTE);
            out.push_str(&format!(
                "gemma4-any ::= gemma4-str | gemma4-obj | gemma4-list | gemma4-num | \"true\" | \
                 \"false\" | \"null\"\n\
                 gemma4-str ::= {q} gemma4-text {q}\n\
                 gemma4-obj ::= \"{{\" ( gemma4-key \":\" gemma4-any ( \",\" gemma4-key \":\" \
                 gemma4-any )* )? \"}}\"\n\
                 gemma4-key ::= [A-Za-z_] [A-Za-z0-9_]{{0,63}}\n\
                 gemma4-list ::= \"[\" ( gemma4-any ( \",\" gemma4-any )* )? \"]\"\n\
                 gemma4-num ::= \"-\"? ( \"0\" | [1-9] [0-9]{{0,15}} ) ( \".\" [0-9]{{1,15}} )? \
                 ( [eE] [-+]? [0-9]{{1,3}} )?\n"
            ));
        }
        if self.any || self.text {
            out.push_str(&super::xml_args::text_without("gemma4-text", &[QUOTE]));
        }
        out
    }
}

/// What kind of value a schema's `type` (or, without one, its keywords) asks for.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Kind {
    String,
    Number,
    Integer,
    Boolean,
    Null,
    List,
    Object,
}

/// Keywords that constrain a value in ways Gemma's notation or this grammar cannot hold (a
/// value the schema rejects must never come back): a schema that has one is refused.
const UNSUPPORTED: &[&str] = &[
    "pattern",
    "format",
    "allOf",
    "oneOf",
    "not",
    "if",
    "then",
    "else",
    "patternProperties",
    "propertyNames",
    "minProperties",
    "maxProperties",
    "dependentRequired",
    "dependentSchemas",
    "dependencies",
    "unevaluatedProperties",
    "prefixItems",
    "contains",
    "minContains",
    "maxContains",
    "uniqueItems",
    "unevaluatedItems",
    "$dynamicRef",
    "$recursiveRef",
];

/// The keywords that only annotate a schema (beside `$ref`, `anyOf`, `const` and `enum`).
const ANNOTATIONS: &[&str] = &[
    "description",
    "title",
    "default",
    "examples",
    "$comment",
    "$id",
    "$schema",
    "$defs",
    "definitions",
    "deprecated",
    "readOnly",
    "writeOnly",
    "nullable",
];

/// One tool's arguments schema made a grammar in Gemma's notation.
struct Conv<'a> {
    tool: &'a Tool,
    /// The arguments' schema, which `$ref`s point into.
    doc: Value,
    /// The start of this tool's rules' names.
    prefix: String,
    rules: String,
    count: usize,
    /// The rule of each `$ref` target made so far (recursive schemas refer to it).
    refs: HashMap<String, String>,
    shared: &'a mut Shared,
}

impl<'a> Conv<'a> {
    fn new(tool: &'a Tool, i: usize, shared: &'a mut Shared) -> Conv<'a> {
        Conv {
            tool,
            doc: arguments_schema(tool),
            prefix: format!("gemma4-t{i}"),
            rules: String::new(),
            count: 0,
            refs: HashMap::new(),
            shared,
        }
    }

    fn error(&self, at: &str, why: &str) -> String {
        format!(
            "the parameters of tool `{}` cannot be made a grammar of Gemma 4's calls: {why} \
             (at {at})",
            self.tool.name
        )
    }

    /// A new rule of this tool's.
    fn rule(&mut self, body: &str) -> String {
        let name = format!("{}-{}", self.prefix, self.count);
        self.count += 1;
        self.rules.push_str(&format!("{name} ::= {body}\n"));
        name
    }

    /// The kinds of value a schema's `type` names (None: any), or, without one, that its
    /// keywords imply.
    fn kinds(
        &self,
        s: &serde_json::Map<String, Value>,
        at: &str,
    ) -> Result<Option<Vec<Kind>>, String> {
        let of = |t: &str| match t {
            "string" => Ok(Kind::String),
            "number" => Ok(Kind::Number),
            "integer" => Ok(Kind::Integer),
            "boolean" => Ok(Kind::Boolean),
            "null" => Ok(Kind::Null),
            "array" => Ok(Kind::List),
            "object" => Ok(Kind::Object),
            _ => Err(self.error(at, &format!("unknown type `{t}`"))),
        };
        match s.get("type") {
            Some(Value::String(t)) => Ok(Some(vec![of(t)?])),
            Some(Value::Array(ts)) => {
                let mut kinds = Vec::new();
                for t in ts {
                    let t = t
                        .as_str()
                        .ok_or_else(|| self.error(at, "a type is not a string"))?;
                    kinds.push(of(t)?);
                }
                Ok(Some(kinds))
            }
            Some(_) => Err(self.error(at, "`type` is neither a string nor a list")),
            None => {
                let has = |ks: &[&str]| ks.iter().any(|k| s.contains_key(*k));
                Ok(
                    if has(&["properties", "required", "additionalProperties"]) {
                        Some(vec![Kind::Object])
                    } else if has(&["items", "minItems", "maxItems"]) {
                        Some(vec![Kind::List])
                    } else if has(&["minLength", "maxLength"]) {
                        Some(vec![Kind::String])
                    } else if has(&[
                        "minimum",
                        "maximum",
                        "exclusiveMinimum",
                        "exclusiveMaximum",
                        "multipleOf",
                    ]) {
                        Some(vec![Kind::Number])
                    } else {
                        None
                    },
                )
            }
        }
    }

    /// The one kind of the arguments' schema, for the check that they are an object.
    fn kind_of(&self, s: &Value) -> Option<Kind> {
        match s {
            Value::Object(o) => match self.kinds(o, "#") {
                Ok(Some(k)) if k.len() == 1 => Some(k[0]),
                _ => None,
            },
            _ => None,
        }
    }

    /// The grammar (an expression) of the values `s`, at the pointer `at`, admits.
    fn value(&mut self, s: &Value, at: &str, depth: usize) -> Result<String, String> {
        if depth > muser_jsonschema::MAX_DEPTH {
            return Err(self.error(at, "the schema nests too deep"));
        }
        let o = match s {
            Value::Bool(true) => return Ok(self.any()),
            Value::Object(o) => o,
            _ => return Err(self.error(at, "not a schema that admits values")),
        };
        if let Some(k) = UNSUPPORTED.iter().find(|k| o.contains_key(**k)) {
            return Err(self.error(at, &format!("`{k}` cannot be held")));
        }
        let only = |keys: &[&str]| {
            o.keys()
                .all(|k| keys.contains(&k.as_str()) || ANNOTATIONS.contains(&k.as_str()))
        };
        if let Some(r) = o.get("$ref") {
            if !only(&["$ref"]) {
                return Err(self.error(at, "`$ref` beside other keywords cannot be held"));
            }
            return self.reference(r, at, depth);
        }
        if let Some(alts) = o.get("anyOf") {
            let Value::Array(alts) = alts else {
                return Err(self.error(at, "`anyOf` is not a list"));
            };
            if !only(&["anyOf"]) || alts.is_empty() {
                return Err(self.error(at, "`anyOf` beside other keywords cannot be held"));
            }
            let mut out = Vec::new();
            for (i, a) in alts.iter().enumerate() {
                out.push(self.value(a, &format!("{at}/anyOf/{i}"), depth + 1)?);
            }
            return Ok(format!("( {} )", out.join(" | ")));
        }
        let kinds = self.kinds(o, at)?;
        let fits = |v: &Value| {
            kinds.as_ref().is_none_or(|ks| {
                ks.iter().any(|k| match k {
                    Kind::String => v.is_string(),
                    Kind::Number => v.is_number(),
                    Kind::Integer => v.is_i64() || v.is_u64(),
                    Kind::Boolean => v.is_boolean(),
                    Kind::Null => v.is_null(),
                    Kind::List => v.is_array(),
                    Kind::Object => v.is_object(),
                })
            })
        };
        if o.contains_key("const") || o.contains_key("enum") {
            if !only(&["const", "enum", "type"]) {
                return Err(
                    self.error(at, "`enum` or `const` beside other keywords cannot be held")
                );
            }
            let values: Vec<&Value> = match (o.get("const"), o.get("enum")) {
                (Some(c), _) => vec![c],
                (None, Some(Value::Array(e))) => e.iter().collect(),
                _ => return Err(self.error(at, "`enum` is not a list")),
            };
            let mut out = Vec::new();
            for v in values.into_iter().filter(|v| fits(v)) {
                let text = render(v).ok_or_else(|| {
                    self.error(
                        at,
                        "a value of `enum` or `const` has a string with `<|\"|>`",
                    )
                })?;
                out.push(literal(&text));
            }
            if out.is_empty() {
                return Err(self.error(at, "no value of `enum` or `const` fits the type"));
            }
            return Ok(format!("( {} )", out.join(" | ")));
        }
        let Some(kinds) = kinds else {
            return Ok(self.any());
        };
        let mut out = Vec::new();
        for k in kinds {
            out.push(match k {
                Kind::String => self.string(o, at)?,
                Kind::Number | Kind::Integer => self.number(o, k, at)?,
                Kind::Boolean => "( \"true\" | \"false\" )".to_string(),
                Kind::Null => "\"null\"".to_string(),
                Kind::List => self.list(o, at, depth)?,
                Kind::Object => self.object(o, at, depth)?,
            });
        }
        Ok(format!("( {} )", out.join(" | ")))
    }

    /// Any value (a schema that admits all).
    fn any(&mut self) -> String {
        self.shared.any = true;
        "gemma4-any".to_string()
    }

    /// A same-document `$ref`, made once (its rule named before it is made, for recursion).
    fn reference(&mut self, r: &Value, at: &str, depth: usize) -> Result<String, String> {
        let Some(ptr) = r.as_str().and_then(|r| r.strip_prefix('#')) else {
            return Err(self.error(at, "only `$ref`s into the same schema (`#...`) can be held"));
        };
        if let Some(name) = self.refs.get(ptr) {
            return Ok(name.clone());
        }
        let Some(target) = self.doc.pointer(ptr).cloned() else {
            return Err(self.error(at, &format!("`$ref` {ptr:?} points nowhere")));
        };
        let name = format!("{}-{}", self.prefix, self.count);
        self.count += 1;
        self.refs.insert(ptr.to_string(), name.clone());
        let body = self.value(&target, &format!("#{ptr}"), depth + 1)?;
        self.rules.push_str(&format!("{name} ::= {body}\n"));
        Ok(name)
    }

    /// A string between `<|"|>` marks: free text without the mark, or, with `minLength` or
    /// `maxLength`, that many characters, none `<`.
    fn string(&mut self, o: &serde_json::Map<String, Value>, at: &str) -> Result<String, String> {
        let len = |k: &str| -> Result<Option<u64>, String> {
            match o.get(k) {
                None => Ok(None),
                Some(v) => v
                    .as_u64()
                    .map(Some)
                    .ok_or_else(|| self.error(at, &format!("`{k}` is not a whole number"))),
            }
        };
        let (min, max) = (len("minLength")?.unwrap_or(0), len("maxLength")?);
        let q = literal(QUOTE);
        if min == 0 && max.is_none() {
            self.shared.text = true;
            return Ok(format!("{q} gemma4-text {q}"));
        }
        if max.is_some_and(|m| m < min) {
            return Err(self.error(at, "`maxLength` is below `minLength`"));
        }
        let max = max.map_or(String::new(), |m| m.to_string());
        Ok(format!("{q} [^<]{{{min},{max}}} {q}"))
    }

    /// A number: muser-jsonschema's rules of the number keywords (Gemma writes numbers as
    /// JSON does).
    fn number(
        &mut self,
        o: &serde_json::Map<String, Value>,
        kind: Kind,
        at: &str,
    ) -> Result<String, String> {
        let mut sub = serde_json::Map::new();
        sub.insert(
            "type".into(),
            Value::from(if kind == Kind::Integer {
                "integer"
            } else {
                "number"
            }),
        );
        for k in [
            "minimum",
            "maximum",
            "exclusiveMinimum",
            "exclusiveMaximum",
            "multipleOf",
        ] {
            if let Some(v) = o.get(k) {
                sub.insert(k.into(), v.clone());
            }
        }
        let prefix = format!("{}-n{}-", self.prefix, self.count);
        self.count += 1;
        let (top, rules) = muser_jsonschema::schema_to_gbnf_rules(&Value::Object(sub), &prefix)
            .map_err(|e| self.error(at, &e.to_string()))?;
        self.rules.push_str(&rules);
        if !rules.ends_with('\n') {
            self.rules.push('\n');
        }
        Ok(top)
    }

    /// A list of `items` (any values without), `minItems` to `maxItems` of them.
    fn list(
        &mut self,
        o: &serde_json::Map<String, Value>,
        at: &str,
        depth: usize,
    ) -> Result<String, String> {
        let item = match o.get("items") {
            None => self.any(),
            Some(Value::Array(_)) => {
                return Err(self.error(at, "`items` as a list (tuples) cannot be held"))
            }
            Some(s) => {
                let body = self.value(s, &format!("{at}/items"), depth + 1)?;
                self.rule(&body)
            }
        };
        let count = |k: &str| o.get(k).and_then(Value::as_u64);
        let (min, max) = (count("minItems").unwrap_or(0), count("maxItems"));
        if max.is_some_and(|m| m < min) {
            return Err(self.error(at, "`maxItems` is below `minItems`"));
        }
        let more = |n: u64| match max {
            Some(m) => format!("{{{n},{}}}", m.saturating_sub(1)),
            None => format!("{{{n},}}"),
        };
        Ok(match (min, max) {
            (_, Some(0)) => "\"[]\"".to_string(),
            (0, _) => format!("\"[\" ( {item} ( \",\" {item} ){} )? \"]\"", more(0)),
            (n, _) => format!("\"[\" {item} ( \",\" {item} ){} \"]\"", more(n - 1)),
        })
    }

    /// An object: its `properties` sorted as the template sorts keys, the required ones
    /// mandatory, no others.
    fn object(
        &mut self,
        o: &serde_json::Map<String, Value>,
        at: &str,
        depth: usize,
    ) -> Result<String, String> {
        let required: Vec<&str> = match o.get("required") {
            None => Vec::new(),
            Some(Value::Array(r)) => r.iter().filter_map(Value::as_str).collect(),
            Some(_) => return Err(self.error(at, "`required` is not a list")),
        };
        // Without `properties`, any keys (of `additionalProperties`' values, where it is a
        // schema); with them (even none), no others, as llama.cpp's JSON grammars narrow it.
        let props = match o.get("properties") {
            Some(Value::Object(p)) => p.clone(),
            Some(_) => return Err(self.error(at, "`properties` is not an object")),
            None if !required.is_empty() => {
                return Err(self.error(at, "`required` names properties that are not declared"))
            }
            None => {
                return match o.get("additionalProperties") {
                    Some(Value::Bool(false)) => Ok("\"{}\"".to_string()),
                    None | Some(Value::Bool(true)) => {
                        self.any();
                        Ok("gemma4-obj".to_string())
                    }
                    Some(s) => {
                        let at = format!("{at}/additionalProperties");
                        let v = self.value(s, &at, depth + 1)?;
                        let member = self.rule(&format!("gemma4-key \":\" {v}"));
                        self.any();
                        Ok(format!("\"{{\" ( {member} ( \",\" {member} )* )? \"}}\""))
                    }
                };
            }
        };
        if props.is_empty() {
            return match required.first() {
                Some(r) => {
                    Err(self.error(at, &format!("the required property `{r}` is not declared")))
                }
                None => Ok("\"{}\"".to_string()),
            };
        }
        if let Some(r) = required.iter().find(|r| !props.contains_key(**r)) {
            return Err(self.error(at, &format!("the required property `{r}` is not declared")));
        }
        // Jinja's `dictsort`: case-insensitive, stable
        let mut keys: Vec<&String> = props.keys().collect();
        keys.sort_by_key(|k| k.to_lowercase());
        let mut members = Vec::new();
        for k in keys {
            if k.is_empty() || k.contains([':', '}']) || ws(k) > 0 {
                return Err(self.error(
                    at,
                    &format!(
                        "the property name {k:?} cannot be written bare (empty, starting \
                              with whitespace, or with `:` or `}}`)"
                    ),
                ));
            }
            let v = self.value(&props[k], &format!("{at}/properties/{k}"), depth + 1)?;
            let m = self.rule(&format!("{} {v}", literal(&format!("{k}:"))));
            members.push((m, required.contains(&k.as_str())));
        }
        // The members from `j` on, after one before them: `,` before each.
        let tail = |j: usize| {
            members[j..]
                .iter()
                .map(|(m, req)| match req {
                    true => format!("\",\" {m}"),
                    false => format!("( \",\" {m} )?"),
                })
                .collect::<Vec<_>>()
                .join(" ")
        };
        // The first member written is any up to the first required one (or none, when all
        // are optional).
        let mut alts = Vec::new();
        for (j, (m, req)) in members.iter().enumerate() {
            alts.push(format!("{m} {}", tail(j + 1)));
            if *req {
                break;
            }
        }
        let body = self.rule(&alts.join(" | "));
        Ok(if members.iter().all(|(_, req)| !req) {
            format!("\"{{\" {body}? \"}}\"")
        } else {
            format!("\"{{\" {body} \"}}\"")
        })
    }
}

/// A JSON value in Gemma's notation (None where a string holds the string mark).
fn render(v: &Value) -> Option<String> {
    Some(match v {
        Value::String(s) if s.contains(QUOTE) => return None,
        Value::String(s) => format!("{QUOTE}{s}{QUOTE}"),
        Value::Array(a) => format!(
            "[{}]",
            a.iter().map(render).collect::<Option<Vec<_>>>()?.join(",")
        ),
        Value::Object(o) => format!(
            "{{{}}}",
            o.iter()
                .map(|(k, x)| Some(format!("{k}:{}", render(x)?)))
                .collect::<Option<Vec<_>>>()?
                .join(",")
        ),
        v => v.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::super::test_util::*;
    use super::super::{Format, ToolChoice, Trigger};
    use super::*;
    use serde_json::json;

    /// A value in Gemma's notation as the template writes a call's arguments: keys bare and
    /// sorted as `dictsort` sorts them, strings between marks.
    fn gemma(v: &Value) -> String {
        match v {
            Value::Object(o) => {
                let mut keys: Vec<&String> = o.keys().collect();
                keys.sort_by_key(|k| k.to_lowercase());
                let members: Vec<String> = keys
                    .iter()
                    .map(|k| format!("{k}:{}", gemma(&o[*k])))
                    .collect();
                format!("{{{}}}", members.join(","))
            }
            Value::Array(a) => format!("[{}]", a.iter().map(gemma).collect::<Vec<_>>().join(",")),
            Value::String(s) => format!("{QUOTE}{s}{QUOTE}"),
            v => v.to_string(),
        }
    }

    /// A whole call of `name` with `args`.
    fn call_text(name: &str, args: &Value) -> String {
        format!("{CALL_OPEN}{CALL_NAME}{name}{}{CALL_CLOSE}", gemma(args))
    }

    /// `v` with its objects' keys in the order `gemma` writes them (the order read back).
    fn sorted(v: &Value) -> Value {
        match v {
            Value::Object(o) => {
                let mut keys: Vec<&String> = o.keys().collect();
                keys.sort_by_key(|k| k.to_lowercase());
                Value::Object(
                    keys.into_iter()
                        .map(|k| (k.clone(), sorted(&o[k])))
                        .collect(),
                )
            }
            Value::Array(a) => Value::Array(a.iter().map(sorted).collect()),
            v => v.clone(),
        }
    }

    /// The end of an output cut inside a marker, or inside a call's opening before its name is
    /// whole: Muser's finished reading keeps it in the content (what does not follow the format
    /// is content), llama.cpp's drops it.
    fn unfinished_tail(text: &str) -> &str {
        if let Some(t) = text.rfind(CALL_OPEN).map(|i| &text[i..]) {
            if !t.contains('{') {
                return t;
            }
        }
        &text[text.len() - held(text, &[CALL_OPEN, CHANNEL_OPEN, CHANNEL_CLOSE])..]
    }

    /// The older template's messages: an assistant turn's calls take the results after them
    /// (named by the call at the same place, else by the result's id; JSON read as JSON) and
    /// the turn's answer; other messages stay as they are.
    #[test]
    fn tool_results_merge_into_their_turn() {
        let call = |id: &str, name: &str| json!({"id": id, "type": "function", "function": {"name": name, "arguments": "{}"}});
        let user = json!({"role": "user", "content": "q"});
        let messages = [
            user.clone(),
            json!({"role": "assistant", "content": "", "reasoning_content": "r",
                   "tool_calls": [call("c1", "f"), call("c2", "")]}),
            json!({"role": "tool", "tool_call_id": "c1", "content": "{\"t\": 1}"}),
            json!({"role": "tool", "tool_call_id": "c2", "content": "plain"}),
            json!({"role": "assistant", "content": "answer"}),
            user.clone(),
            json!({"role": "assistant", "content": "x", "tool_calls": [call("c3", "g")]}),
            json!({"role": "assistant", "content": "y", "tool_calls": [call("c4", "g")]}),
        ];
        let merged = merge_tool_responses(&messages);
        assert_eq!(
            merged,
            [
                user.clone(),
                json!({"role": "assistant", "tool_calls": [call("c1", "f"), call("c2", "")],
                       "content": "answer", "reasoning_content": "r", "tool_responses": [
                           {"name": "f", "response": {"t": 1}},
                           {"name": "c2", "response": "plain"}]}),
                user,
                json!({"role": "assistant", "tool_calls": [call("c3", "g")]}),
                json!({"role": "assistant", "tool_calls": [call("c4", "g")]}),
            ]
        );
        let src = template("google-gemma-4-31B-it-interleaved.jinja");
        if let Some(src) = src {
            assert!(reads_tool_responses(&src));
            let new = template("google-gemma-4-31B-it.jinja").unwrap();
            assert!(detect(&new) && !reads_tool_responses(&new));
        }
    }

    #[test]
    fn llama_cpp_templates_are_detected() {
        check_detect_all(
            |src| detect(src).then_some(Format::Gemma4),
            &[
                ("google-gemma-4-31B-it.jinja", Format::Gemma4),
                ("google-gemma-4-31B-it-interleaved.jinja", Format::Gemma4),
            ],
        );
    }

    /// Random tools and calls (strings with quotes, backslashes, newlines, `<`, braces and
    /// non-ASCII): the grammar takes the calls as the template writes them, one or (parallel)
    /// several back to back, and refuses broken arguments, a tool not chosen, a second call
    /// where parallel calls are not allowed and text after the calls; `parse` gives the calls
    /// back, keeps the text before them as content, and streaming goes on to the same.
    #[test]
    fn random_calls_are_held_by_the_grammar_and_read_back() {
        let mut rng = Rng(0x6E44_2026);
        let mut args_seen = 0;
        for round in 0..240 {
            let parallel = round % 4 >= 2;
            let r = random_req(&mut rng, round, parallel);
            let (p, g) = checked_plan(Format::Gemma4, &r, Trigger::Word(CALL_OPEN.into()));
            let calls = random_calls(&mut rng, &r);
            let text: String = calls.iter().map(|(t, a)| call_text(&t.name, a)).collect();
            assert!(g.accepts_str(&text), "{text}\n{}", p.gbnf);
            let parsed = Format::Gemma4.parse(&text, Some(&r));
            assert_eq!((parsed.content.as_str(), &parsed.reasoning), ("", &None));
            assert_eq!(parsed.tool_calls.len(), calls.len(), "{text}");
            for (c, (t, a)) in parsed.tool_calls.iter().zip(&calls) {
                assert_call(c, &t.name, &sorted(a), None);
                args_seen += a.as_object().is_some_and(|o| !o.is_empty()) as usize;
            }
            check_stream_calls(Format::Gemma4, &text, &r);
            check_text_around(Format::Gemma4, &r, &g, &text, calls.len());
            for (t, a) in &calls {
                check_broken_args(&mut rng, &g, t, a, |b| call_text(&t.name, b));
            }
            if let Some((o, a)) = other_tool(&mut rng, &r) {
                assert!(!g.accepts_str(&call_text(&o.name, &a)));
            }
            if !parallel {
                assert!(!g.accepts_str(&format!("{text}{text}")));
            }
        }
        assert!(args_seen > 100, "{args_seen}");
    }

    /// Values of every kind in a schema-free tool, with the whitespace llama.cpp's reader
    /// allows, read as JSON values.
    #[test]
    fn arguments_read_as_json_values() {
        let r = req(vec![tool("f", json!({}))], ToolChoice::Auto, true);
        for (args, want) in [
            ("{}", json!({})),
            ("{ }", json!({})),
            (
                "{a:1,b:-2.50e+3,c:true,d:null,e:<|\"|>x \"y\"\n\\<|\"|>}",
                json!({"a": 1, "b": -2.50e3, "c": true, "d": null, "e": "x \"y\"\n\\"}),
            ),
            (
                "{ a b : [ 1, [], {}, <|\"|><|\"|> ],x:{y:{z:[false]}} }",
                json!({"a b ": [1, [], {}, ""], "x": {"y": {"z": [false]}}}),
            ),
            ("{k{,\":<|\"|>a<|\"|>}", json!({"k{,\"": "a"})),
        ] {
            let text = format!("{CALL_OPEN}{CALL_NAME}f{args}{CALL_CLOSE}");
            let p = Format::Gemma4.parse(&text, Some(&r));
            assert_eq!(p.tool_calls.len(), 1, "{text}");
            let got: Value = serde_json::from_str(&p.tool_calls[0].arguments).unwrap();
            assert_eq!(got, want, "{text}");
            check_stream_calls(Format::Gemma4, &text, &r);
        }
        // Not well formed: the text stays content.
        for args in [
            "{a:1 ,b:2}",
            "{:1}",
            "{a}",
            "{a:01}",
            "{a:tru}",
            "{a:1.}",
            "[1]",
            "{a:1",
        ] {
            let text = format!("{CALL_OPEN}{CALL_NAME}f{args}{CALL_CLOSE}");
            let p = Format::Gemma4.parse(&text, Some(&r));
            assert_eq!(p.content, text);
            assert!(p.tool_calls.is_empty(), "{text}");
        }
    }

    /// Thought channels later in the reply are reasoning, and a stray channel marker ends the
    /// reply's text (calls after it are still read), as llama-server reads them; a call of a
    /// tool not offered, or one not well formed, stays in the content.
    #[test]
    fn channels_in_the_reply_read_as_llama_server_reads_them() {
        let r = f_req(true);
        let ping = call("f", "{}");
        for (text, content, reasoning, calls) in [
            (
                "x<|channel>thought\nB<channel|>y<channel|>z",
                "xy",
                Some("B"),
                vec![],
            ),
            ("a<channel|>b", "a", None, vec![]),
            ("x<|channel>y", "x", None, vec![]),
            (
                "<|channel><|channel>thought\nr<channel|>x",
                "x",
                Some("r"),
                vec![],
            ),
            ("x<|channel>thought  r \n", "x", Some("r \n"), vec![]),
            (
                "a<channel|>b<|tool_call>call:f{}<tool_call|>",
                "a",
                None,
                vec![ping.clone()],
            ),
            (
                "Hi <|tool_call>call:f{}<tool_call|><|tool_call>call:f{}<tool_call|>",
                "Hi",
                None,
                vec![ping.clone(), ping.clone()],
            ),
            (
                "<|tool_call>call:nope{}<tool_call|>",
                "<|tool_call>call:nope{}<tool_call|>",
                None,
                vec![],
            ),
        ] {
            let p = Format::Gemma4.parse(text, Some(&r));
            assert_eq!(p.content, content, "{text:?}");
            assert_eq!(p.reasoning.as_deref(), reasoning, "{text:?}");
            assert_eq!(p.tool_calls, calls, "{text:?}");
        }
        // Without tools the channels are read the same; calls are text.
        let p = Format::Gemma4.parse("a<|tool_call>call:f{}<tool_call|><channel|>b", None);
        assert_eq!(p.content, "a<|tool_call>call:f{}<tool_call|>");
    }

    /// Random texts of the format's pieces (markers, their starts, values, whitespace): for
    /// every prefix, what streaming sends is never taken back, is a prefix of the final
    /// reading, and the final reading goes on from its calls; nothing panics.
    #[test]
    fn streaming_never_takes_back_what_it_sent() {
        let pieces = [
            CALL_OPEN,
            CALL_NAME,
            "f{",
            "g",
            "{",
            "}",
            CALL_CLOSE,
            QUOTE,
            "<|",
            "<|\"",
            "a",
            " ",
            "\n",
            ",",
            ":",
            "1",
            "-",
            ".5",
            "e",
            "[",
            "]",
            "true",
            "nul",
            CHANNEL_OPEN,
            CHANNEL_CLOSE,
            THOUGHT,
            "<chan",
            "é",
            "<",
            "|",
            "<|channel>thought",
        ];
        let mut rng = Rng(0x6E44_5EED);
        let r = f_req(true);
        let (mut with_calls, mut with_reasoning) = (0, 0);
        for round in 0..3000 {
            let n = 1 + rng.below(14);
            let mut text: String = (0..n).map(|_| pieces[rng.below(pieces.len())]).collect();
            if round % 3 == 0 {
                text = format!("a {}{text}", call_text("f", &json!({"k": "v<", "n": [1]})));
            }
            for q in [Some(&r), None] {
                let full = Format::Gemma4.parse(&text, q);
                let fin = Format::Gemma4.parse_final(&text, q);
                with_calls += !fin.tool_calls.is_empty() as usize;
                with_reasoning += full.reasoning.is_some() as usize;
                let mut sent = Parsed::default();
                for p in prefixes(&text) {
                    let part = Format::Gemma4.parse_partial(p, q);
                    let at = format!("{text:?} / {p:?}");
                    assert!(part.content.starts_with(&sent.content), "{at}");
                    assert!(
                        full.content.starts_with(&part.content),
                        "{at}: {part:?} {full:?}"
                    );
                    let (r0, r1, r2) = (
                        sent.reasoning.as_deref().unwrap_or(""),
                        part.reasoning.as_deref().unwrap_or(""),
                        full.reasoning.as_deref().unwrap_or(""),
                    );
                    assert!(r1.starts_with(r0) && r2.starts_with(r1), "{at}");
                    check_call_step(&sent, &part, &fin, p);
                    sent = part;
                }
            }
        }
        assert!(
            with_calls > 300 && with_reasoning > 300,
            "{with_calls} {with_reasoning}"
        );
    }

    /// Schemas the grammar holds beyond the random tools': bounds, lists, `anyOf`, `$ref`
    /// (recursive), any value; and those it refuses, by name.
    #[test]
    fn schemas_are_held_or_refused_by_name() {
        let t = tool(
            "t",
            json!({"type": "object", "properties": {
                "s": {"type": "string", "maxLength": 3},
                "n": {"type": "integer", "minimum": 1, "maximum": 7},
                "l": {"type": "array", "items": {"type": "number"}, "minItems": 1, "maxItems": 2},
                "u": {"anyOf": [{"type": "null"}, {"$ref": "#/$defs/node"}]},
                "x": {},
            }, "required": ["s", "n"],
            "$defs": {"node": {"type": "object", "properties": {
                "next": {"anyOf": [{"type": "null"}, {"$ref": "#/$defs/node"}]}}}}}),
        );
        let r = req(vec![t], ToolChoice::Required, false);
        let g = grammar(&Format::Gemma4.plan(&r).unwrap().unwrap());
        let call = |args: &str| format!("{CALL_OPEN}{CALL_NAME}t{{{args}}}{CALL_CLOSE}");
        for (args, ok) in [
            ("n:7,s:<|\"|>abc<|\"|>", true),
            ("n:8,s:<|\"|>abc<|\"|>", false),
            ("n:1,s:<|\"|>abcd<|\"|>", false),
            ("s:<|\"|>a<|\"|>,n:1", false),
            ("l:[1.5,-2],n:1,s:<|\"|><|\"|>", true),
            ("l:[],n:1,s:<|\"|><|\"|>", false),
            ("l:[1,2,3],n:1,s:<|\"|><|\"|>", false),
            ("n:1,s:<|\"|><|\"|>,u:{next:{next:null}}", true),
            ("n:1,s:<|\"|><|\"|>,u:{next:{next:1}}", false),
            ("n:1,s:<|\"|><|\"|>,x:[{a:<|\"|>q<|\"|>},true]", true),
        ] {
            assert_eq!(g.accepts_str(&call(args)), ok, "{args}");
        }
        for (schema, word) in [
            (
                json!({"type": "object", "properties": {"a": {"type": "string", "pattern": "x"}}}),
                "pattern",
            ),
            (
                json!({"type": "object", "properties": {"a": {"oneOf": [{}]}}}),
                "oneOf",
            ),
            (json!({"type": "object", "properties": {"a:b": {}}}), "a:b"),
            (json!({"type": "string"}), "object"),
        ] {
            let r = req(vec![tool("t", schema)], ToolChoice::Required, false);
            let e = Format::Gemma4.plan(&r).unwrap_err();
            assert!(e.contains(word) && e.contains("`t`"), "{e}");
        }
    }

    /// Outputs llama.cpp's own parser read (random texts, llama.cpp's reading of each recorded
    /// in the fixture, so that this runs without llama.cpp; the live comparison on fresh
    /// random texts is `test_json_random_outputs_read_as_llama_cpp_reads_them` in
    /// tests/python/test_chat_reading.py): Muser reads the same calls (names, arguments as
    /// JSON values), reasoning and content (up to the whitespace around it, which Muser trims).
    #[test]
    fn outputs_read_as_llama_cpp_reads_them() {
        let fixture: Value =
            serde_json::from_str(include_str!("testdata/gemma4-llama-cpp.json")).unwrap();
        let tools: Vec<Tool> = fixture["tools"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| tool(t["function"]["name"].as_str().unwrap(), json!({})))
            .collect();
        let r = req(tools, ToolChoice::Auto, true);
        let cases = fixture["cases"].as_array().unwrap();
        let mut agree = 0;
        for c in cases {
            let text = c["text"].as_str().unwrap();
            let (first, reply) = super::super::think::GEMMA.split(text, false);
            let p = Format::Gemma4.parse_final(reply, Some(&r));
            let reasoning = [first, p.reasoning]
                .into_iter()
                .flatten()
                .collect::<String>();
            let json = |s: &str| serde_json::from_str::<Value>(s).unwrap();
            let calls: Vec<Value> = p
                .tool_calls
                .iter()
                .map(|c| json!([c.name, json(&c.arguments)]))
                .collect();
            let want: Vec<Value> = c["calls"]
                .as_array()
                .unwrap()
                .iter()
                .map(|c| json!([c[0], json(c[1].as_str().unwrap())]))
                .collect();
            assert_eq!(calls, want, "{text:?}");
            assert_eq!(reasoning, c["reasoning"].as_str().unwrap(), "{text:?}");
            let cut = unfinished_tail(text);
            let content = p.content.strip_suffix(cut).unwrap_or(&p.content);
            assert_eq!(
                content.trim(),
                c["content"].as_str().unwrap().trim(),
                "{text:?}"
            );
            agree += 1;
        }
        assert_eq!(agree, cases.len());
        assert!(cases.len() >= 400);
    }

    /// Raw outputs llama-server's grammar forced from a random tiny model (most cut by
    /// `max_tokens` inside a call), with thinking on (the thought channel split off first) or
    /// off: Muser's final reading gives the same calls, their arguments the same text (also
    /// when cut: JSON as far as it was written), the same reasoning and content.
    #[test]
    fn forced_outputs_read_as_llama_server_reads_them() {
        let fixture: Value =
            serde_json::from_str(include_str!("testdata/gemma4-llama-cpp.json")).unwrap();
        let server = &fixture["server"];
        let tools: Vec<Tool> = server["tools"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| tool(t["function"]["name"].as_str().unwrap(), json!({})))
            .collect();
        let cases = server["cases"].as_array().unwrap();
        let (mut calls_seen, mut same_args, mut cut_openings) = (0, 0, 0);
        for c in cases {
            let text = c["text"].as_str().unwrap();
            let choice = match c["choice"].as_str().unwrap() {
                "auto" => ToolChoice::Auto,
                _ => ToolChoice::Required,
            };
            let r = req(tools.clone(), choice, c["parallel"].as_bool().unwrap());
            let (first, reply) = match c["thinking"].as_bool().unwrap() {
                true => super::super::think::GEMMA.split(text, false),
                false => (None, text),
            };
            let p = Format::Gemma4.parse_final(reply, Some(&r));
            let reasoning = [first, p.reasoning]
                .into_iter()
                .flatten()
                .collect::<String>();
            let want = c["calls"].as_array().unwrap();
            assert_eq!(p.tool_calls.len(), want.len(), "{text:?}");
            for (got, want) in p.tool_calls.iter().zip(want) {
                let (name, args) = (want[0].as_str().unwrap(), want[1].as_str().unwrap());
                assert_eq!(got.name, name, "{text:?}");
                calls_seen += 1;
                if got.arguments == args {
                    same_args += 1;
                    continue;
                }
                // Cut inside a call: llama-server opens a string at a `<` that may start the
                // string mark, Muser once the mark is whole; one is the other's start.
                assert!(
                    args.starts_with(&got.arguments) || got.arguments.starts_with(args),
                    "{text:?}: {got:?} / {args}"
                );
                assert!(serde_json::from_str::<Value>(args).is_err(), "{text:?}");
            }
            assert_eq!(reasoning, c["reasoning"].as_str().unwrap(), "{text:?}");
            let cut = unfinished_tail(text);
            cut_openings += !cut.is_empty() as usize;
            let content = p.content.strip_suffix(cut).unwrap_or(&p.content);
            assert_eq!(
                content.trim(),
                c["content"].as_str().unwrap().trim(),
                "{text:?}"
            );
        }
        assert!(cases.len() >= 200 && calls_seen >= 100, "{calls_seen}");
        assert!(
            same_args * 10 >= calls_seen * 9,
            "{same_args} of {calls_seen}"
        );
        eprintln!("{same_args} of {calls_seen} calls' arguments the same text");
        assert!(cut_openings < cases.len() / 10, "{cut_openings}");
    }
}
