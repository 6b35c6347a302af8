//! Python-style call lists (Liquid's LFM2 and LFM2.5 templates): the calls are a Python list
//! of function calls with keyword arguments between two tags,
//! `<|tool_call_start|>[get_weather(city="Paris", days=3), add(a=1, b=[2, 'x'])]<|tool_call_end|>`,
//! after the reply's text if any.
//!
//! An argument's value is a Python literal: a string in double or single quotes, a number,
//! `True`, `False`, `None`, a list or a dict of them; JSON's `true`, `false` and `null` are
//! read too, as llama.cpp reads them. Reading turns the literals into JSON text as it goes
//! (single quotes into double, `\'` into `'`, `True` into `true`, ...), so that streaming can
//! send the arguments of a call as far as they are written (`partial::read`).
//!
//! The chat template shows the tools itself. The grammar writes the list as the templates
//! render a call in their history (LFM2.5's): `[` right after the tag, `, ` between calls and
//! between arguments, no other whitespace; each argument `KEY=VALUE`, the value JSON of the
//! property's schema (muser-jsonschema's, a valid Python literal once its `true`, `false` and
//! `null` are written `True`, `False` and `None`, which the grammar does), the required
//! properties first, then the optional ones, each group in declaration order. Reading is
//! lenient: whitespace anywhere between tokens, the closing tag missing at the end of the text.

use serde_json::Value;

use super::xml_args::{child_ptr, object_schema};
use super::{
    allowed_tools, parse_blocks, parse_blocks_partial, partial, BlockStep, Blocks, LazyStart,
    Parsed, Plan, Tool, ToolCall, ToolRequest,
};
use muser_jsonschema::gbnf_literal as lit;

/// The tag before the list of calls.
pub(super) const OPEN: &str = "<|tool_call_start|>";
/// The tag after it.
pub(super) const CLOSE: &str = "<|tool_call_end|>";

/// The markup llama-server preserves for the format (the templates' reasoning tags are
/// `think`'s).
pub(super) const MARKUP: &[&str] = &[OPEN, CLOSE];

pub(super) const LAZY_START: LazyStart = LazyStart::Word(OPEN);

/// Whether a template teaches the format: LFM2's tool list between `<|tool_list_start|>` and
/// `<|tool_list_end|>`, or LFM2.5's plain `List of tools: [`.
pub(super) fn detect(t: &str) -> bool {
    (t.contains("<|tool_list_start|>") && t.contains("<|tool_list_end|>"))
        || t.contains("List of tools: [")
}

/// Characters that end a parameter's name in a call (and that the grammar's names may not
/// have): the name is the text before `=`.
const NAME_STOPS: &[char] = &['=', ',', '(', ')', '[', ']', '{', '}', '\'', '"'];

fn bad_key(k: &str) -> bool {
    k.is_empty()
        || k.chars()
            .any(|c| c.is_whitespace() || NAME_STOPS.contains(&c))
}

/// The list of one call (or, with `req.parallel`, of one or more) of the allowed tools.
pub(super) fn plan(req: &ToolRequest) -> Result<Option<Plan>, String> {
    let Some(tools) = allowed_tools(req)? else {
        return Ok(None);
    };
    let mut rules = String::new();
    let mut alts = Vec::with_capacity(tools.len());
    for (i, tool) in tools.iter().enumerate() {
        let args = tool_args(i, tool, &mut rules)?;
        let rule = format!("lfm-t{i}");
        rules.push_str(&format!(
            "{rule} ::= {} {args} \")\"\n",
            lit(&format!("{}(", tool.name))
        ));
        alts.push(rule);
    }
    let more = if req.parallel {
        " ( \", \" lfm-call )*"
    } else {
        ""
    };
    let gbnf = format!(
        "root ::= {} lfm-call{more} {}\nlfm-call ::= {}\n{rules}",
        lit(&format!("{OPEN}[")),
        lit(&format!("]{CLOSE}")),
        alts.join(" | ")
    );
    Ok(Some(Plan::calls(gbnf, &req.choice, LAZY_START)))
}

/// Adds the rules of tool `i`'s arguments to `rules`; returns the expression of its argument
/// list (empty for a tool without properties). Rule `lfm-t{i}-a{j}f` writes the arguments from
/// the `j`th on as the first of the list, `...n` after an argument written (a `, ` first).
fn tool_args(i: usize, tool: &Tool, rules: &mut String) -> Result<String, String> {
    let (props, required) = object_schema(tool)?;
    let is_req = |k: &str| required.contains(&k);
    let order: Vec<&String> = props
        .keys()
        .filter(|k| is_req(k))
        .chain(props.keys().filter(|k| !is_req(k)))
        .collect();
    let n = order.len();
    let rule = |j: usize, first: bool| {
        if j == n {
            String::new()
        } else {
            format!("lfm-t{i}-a{j}{}", if first { "f" } else { "n" })
        }
    };
    for (j, k) in order.iter().enumerate().rev() {
        if bad_key(k) {
            return Err(format!(
                "tool `{}`: a parameter name in a Python-style call cannot be empty nor have \
                 whitespace or any of {NAME_STOPS:?} (`{k}`)",
                tool.name
            ));
        }
        let prefix = format!("lfm{i}-{j}-");
        let (top, r) = muser_jsonschema::subschema_to_gbnf_rules(
            &tool.parameters,
            &child_ptr("#/properties", k),
            &prefix,
        )
        .map_err(|e| format!("tool `{}`: parameter `{k}`: {e}", tool.name))?;
        rules.push_str(&python_literals(&r, &prefix));
        let kv = format!("{} {top}", lit(&format!("{k}=")));
        for first in [true, false] {
            let sep = if first { "" } else { "\", \" " };
            let take = format!("{sep}{kv} {}", rule(j + 1, false));
            let body = match (is_req(k), rule(j + 1, first)) {
                (true, _) => take,
                (false, skip) if skip.is_empty() => format!("( {take} )?"),
                (false, skip) => format!("{take} | {skip}"),
            };
            rules.push_str(&format!("{} ::= {body}\n", rule(j, first)));
        }
    }
    Ok(rule(0, true))
}

/// The JSON value rules of one conversion (names starting with `prefix`) with JSON's `true`,
/// `false` and `null` written as Python's (muser-jsonschema writes them in these two rules
/// only; a `const` or `enum` of them stays JSON, which the readers take too).
fn python_literals(rules: &str, prefix: &str) -> String {
    let bool_rule = format!("{prefix}json-bool ::= ");
    let null_rule = format!("{prefix}json-null ::= ");
    rules
        .lines()
        .map(|l| {
            if l.starts_with(&bool_rule) {
                format!("{bool_rule}\"True\" | \"False\"\n")
            } else if l.starts_with(&null_rule) {
                format!("{null_rule}\"None\"\n")
            } else {
                format!("{l}\n")
            }
        })
        .collect()
}

/// Why reading a literal stopped.
#[derive(Debug, PartialEq)]
enum Stop {
    /// The text ends inside it.
    End,
    /// It is not a literal.
    Bad,
}

/// Deeper nesting is not read (as `partial`'s JSON).
const MAX_DEPTH: usize = 100;

/// Reads Python literals from `s` and writes them as JSON text in `out`: whole tokens only
/// (a number, a word, an escape), but a string's characters as they come, so that what is
/// written for a text grown starts with what was written for it before.
struct Reader<'a> {
    s: &'a str,
    i: usize,
    out: String,
}

impl Reader<'_> {
    fn ws(&mut self) {
        let rest = &self.s[self.i..];
        self.i += rest.len() - rest.trim_start().len();
    }

    fn peek(&self) -> Result<char, Stop> {
        self.s[self.i..].chars().next().ok_or(Stop::End)
    }

    fn expect(&mut self, c: char) -> Result<(), Stop> {
        if self.peek()? != c {
            return Err(Stop::Bad);
        }
        self.i += 1;
        self.out.push(c);
        Ok(())
    }

    /// One value, after whitespace.
    fn value(&mut self, depth: usize) -> Result<(), Stop> {
        if depth > MAX_DEPTH {
            return Err(Stop::Bad);
        }
        self.ws();
        match self.peek()? {
            '[' => self.items(']', |r| r.value(depth + 1)),
            '{' => self.items('}', |r| {
                r.ws();
                if !matches!(r.peek()?, '"' | '\'') {
                    return Err(Stop::Bad);
                }
                r.string()?;
                r.ws();
                r.expect(':')?;
                r.value(depth + 1)
            }),
            '"' | '\'' => self.string(),
            '-' | '0'..='9' => self.number(),
            c if c.is_ascii_alphabetic() => self.word(),
            _ => Err(Stop::Bad),
        }
    }

    /// A list or a dict: the opening bracket, then `item`s separated by commas until `close`.
    fn items(
        &mut self,
        close: char,
        mut item: impl FnMut(&mut Self) -> Result<(), Stop>,
    ) -> Result<(), Stop> {
        let open = self.peek()?;
        self.expect(open)?;
        self.ws();
        if self.peek()? == close {
            return self.expect(close);
        }
        loop {
            item(self)?;
            self.ws();
            match self.peek()? {
                ',' => self.expect(',')?,
                c if c == close => return self.expect(close),
                _ => return Err(Stop::Bad),
            }
        }
    }

    /// A string in double or single quotes, as a JSON string.
    fn string(&mut self) -> Result<(), Stop> {
        let q = self.peek()?;
        self.i += 1;
        self.out.push('"');
        loop {
            let c = self.peek()?;
            self.i += c.len_utf8();
            match c {
                _ if c == q => {
                    self.out.push('"');
                    return Ok(());
                }
                '\\' => {
                    // (at the end of the text the escape is not begun)
                    let Ok(e) = self.peek() else {
                        return Err(Stop::End);
                    };
                    match e {
                        '\'' => self.out.push('\''),
                        '"' | '\\' | '/' | 'b' | 'f' | 'n' | 'r' | 't' => {
                            self.out.push('\\');
                            self.out.push(e);
                        }
                        'u' => {
                            let hex = self.s.get(self.i + 1..self.i + 5);
                            match hex {
                                Some(h) if h.chars().all(|c| c.is_ascii_hexdigit()) => {
                                    self.out.push_str("\\u");
                                    self.out.push_str(h);
                                    self.i += 4;
                                }
                                _ if self.s[self.i + 1..]
                                    .chars()
                                    .all(|c| c.is_ascii_hexdigit()) =>
                                {
                                    return Err(Stop::End);
                                }
                                _ => return Err(Stop::Bad),
                            }
                        }
                        _ => return Err(Stop::Bad),
                    }
                    self.i += 1;
                }
                '"' => self.out.push_str("\\\""),
                c if (c as u32) < 0x20 => self.out.push_str(&format!("\\u{:04x}", c as u32)),
                c => self.out.push(c),
            }
        }
    }

    /// A number as JSON writes it, whole once a character that cannot go on with it follows.
    fn number(&mut self) -> Result<(), Stop> {
        let rest = &self.s[self.i..];
        let b = rest.as_bytes();
        let mut j = usize::from(b[0] == b'-');
        let digits = |j: usize| {
            b[j.min(b.len())..]
                .iter()
                .take_while(|c| c.is_ascii_digit())
                .count()
        };
        let int = digits(j);
        if int == 0 || (int > 1 && b[j] == b'0') {
            return Err(if j + int == b.len() {
                Stop::End
            } else {
                Stop::Bad
            });
        }
        j += int;
        if b.get(j) == Some(&b'.') {
            let frac = digits(j + 1);
            if frac == 0 {
                return Err(if j + 1 == b.len() {
                    Stop::End
                } else {
                    Stop::Bad
                });
            }
            j += 1 + frac;
        }
        if matches!(b.get(j), Some(b'e' | b'E')) {
            j += 1;
            if matches!(b.get(j), Some(b'+' | b'-')) {
                j += 1;
            }
            let exp = digits(j);
            if exp == 0 {
                return Err(if j == b.len() { Stop::End } else { Stop::Bad });
            }
            j += exp;
        }
        match b.get(j) {
            None => Err(Stop::End),
            Some(c) if c.is_ascii_alphanumeric() || matches!(c, b'.' | b'_' | b'+' | b'-') => {
                Err(Stop::Bad)
            }
            Some(_) => {
                self.out.push_str(&rest[..j]);
                self.i += j;
                Ok(())
            }
        }
    }

    /// `True`, `False`, `None` (or JSON's `true`, `false`, `null`), whole once a character
    /// that cannot go on with it follows.
    fn word(&mut self) -> Result<(), Stop> {
        let rest = &self.s[self.i..];
        let n = rest
            .bytes()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == b'_')
            .count();
        if n == rest.len() {
            return Err(Stop::End);
        }
        let json = match &rest[..n] {
            "True" | "true" => "true",
            "False" | "false" => "false",
            "None" | "null" => "null",
            _ => return Err(Stop::Bad),
        };
        self.out.push_str(json);
        self.i += n;
        Ok(())
    }

    /// The keyword arguments of a call, after its `(`, through its `)`: as a JSON object.
    fn arguments(&mut self) -> Result<(), Stop> {
        self.out.push('{');
        self.ws();
        if self.peek()? == ')' {
            self.i += 1;
            self.out.push('}');
            return Ok(());
        }
        loop {
            self.ws();
            let rest = &self.s[self.i..];
            let Some(eq) = rest.find(|c: char| NAME_STOPS.contains(&c)) else {
                return Err(if bad_key(rest.trim_end()) && !rest.trim().is_empty() {
                    Stop::Bad
                } else {
                    Stop::End
                });
            };
            let key = rest[..eq].trim_end();
            if !rest[eq..].starts_with('=') || bad_key(key) {
                return Err(Stop::Bad);
            }
            self.out
                .push_str(&Value::String(key.to_string()).to_string());
            self.out.push(':');
            self.i += eq + 1;
            self.value(0)?;
            self.ws();
            match self.peek()? {
                ',' => {
                    self.i += 1;
                    self.out.push(',');
                }
                ')' => {
                    self.i += 1;
                    self.out.push('}');
                    return Ok(());
                }
                _ => return Err(Stop::Bad),
            }
        }
    }
}

/// How far the text after an opening tag is read: the calls begun (the last one's arguments
/// as far as they are known) and where the reading stands.
struct Scan {
    calls: Vec<ToolCall>,
    state: State,
}

enum State {
    /// The list and its closing tag are whole: the length of the text they span.
    Whole(usize),
    /// The list is whole and the text after it (whitespace, then the start of the closing tag
    /// or nothing) ends; true where nothing but whitespace follows the list.
    ListEnd(bool),
    /// The text ends inside the list.
    Open,
    /// The text stops being a list of calls.
    Broken,
}

/// Reads the list of calls at the start of `rest` (after whitespace).
fn scan(rest: &str) -> Scan {
    let mut calls = Vec::new();
    let state = scan_into(rest, &mut calls);
    Scan { calls, state }
}

fn scan_into(rest: &str, calls: &mut Vec<ToolCall>) -> State {
    let mut r = Reader {
        s: rest,
        i: 0,
        out: String::new(),
    };
    r.ws();
    match r.peek() {
        Err(_) => return State::Open,
        Ok('[') => r.i += 1,
        Ok(_) => return State::Broken,
    }
    loop {
        r.ws();
        let tail = &rest[r.i..];
        let Some(paren) = tail.find(|c: char| c.is_whitespace() || NAME_STOPS.contains(&c)) else {
            return State::Open;
        };
        if paren == 0 || !tail[paren..].starts_with('(') {
            return State::Broken;
        }
        let name = tail[..paren].to_string();
        r.i += paren + 1;
        r.out.clear();
        let args = r.arguments();
        let whole = match args {
            Ok(()) => partial::whole(&r.out).map(|v| v.to_string()),
            Err(_) => None,
        };
        let done = whole.is_some();
        let arguments = whole.unwrap_or_else(|| partial::read(&r.out).json.stable_object());
        calls.push(ToolCall {
            id: None,
            name,
            arguments,
        });
        match args {
            Ok(()) if done => {}
            Err(Stop::End) => return State::Open,
            _ => return State::Broken,
        }
        r.ws();
        match r.peek() {
            Err(_) => return State::Open,
            Ok(',') => r.i += 1,
            Ok(']') => {
                r.i += 1;
                break;
            }
            Ok(_) => return State::Broken,
        }
    }
    r.ws();
    let after = &rest[r.i..];
    if after.starts_with(CLOSE) {
        State::Whole(r.i + CLOSE.len())
    } else if CLOSE.starts_with(after) {
        State::ListEnd(after.is_empty())
    } else {
        State::Broken
    }
}

/// The block whose opening ends right before `rest`: its calls and the length of `rest`
/// through the closing tag (or to the end of the text, where it is missing).
fn read_block(rest: &str) -> Option<(Vec<ToolCall>, usize)> {
    let s = scan(rest);
    match s.state {
        State::Whole(used) => Some((s.calls, used)),
        State::ListEnd(true) => Some((s.calls, rest.len())),
        _ => None,
    }
}

/// Content is the text with the well-formed blocks taken out (its trailing whitespace
/// trimmed; malformed blocks stay in it).
pub(super) fn parse(text: &str, req: Option<&ToolRequest>) -> Parsed {
    parse_blocks(text, req, &[OPEN], read_block)
}

/// Content up to the first opening, less a tail that may be the start of one; the calls
/// begun, each once its name is whole (its `(` written), its arguments as far as they are
/// written.
pub(super) fn parse_partial(text: &str, req: Option<&ToolRequest>, from: &mut Blocks) -> Parsed {
    let read = |rest: &str, _: &mut _| {
        let s = scan(rest);
        match s.state {
            State::Whole(used) => BlockStep::Whole(s.calls, used),
            State::ListEnd(_) | State::Open => BlockStep::Open(s.calls),
            State::Broken => BlockStep::Broken(s.calls),
        }
    };
    parse_blocks_partial(text, req, &[OPEN], read, from)
}

/// A JSON value as a Python literal (strings in single quotes when `single`, else as JSON
/// writes them; `True`, `False`, `None`): how a model writes the arguments of a call.
#[cfg(test)]
pub(super) fn python_literal(v: &Value, single: bool) -> String {
    super::test_util::python_layout(v, &|x| match x {
        Value::Null => "None".into(),
        Value::Bool(true) => "True".into(),
        Value::Bool(false) => "False".into(),
        Value::String(s) if single => {
            let mut out = String::from("'");
            for c in s.chars() {
                match c {
                    '\'' => out.push_str("\\'"),
                    '\\' => out.push_str("\\\\"),
                    '\n' => out.push_str("\\n"),
                    '\t' => out.push_str("\\t"),
                    c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
                    c => out.push(c),
                }
            }
            out.push('\'');
            out
        }
        x => x.to_string(),
    })
}

/// One call as a model writes it: `name(k=v, ...)`.
#[cfg(test)]
pub(super) fn python_call(
    name: &str,
    args: &serde_json::Map<String, Value>,
    single: bool,
) -> String {
    let args: Vec<String> = args
        .iter()
        .map(|(k, v)| format!("{k}={}", python_literal(v, single)))
        .collect();
    format!("{name}({})", args.join(", "))
}

#[cfg(test)]
mod tests {
    use super::super::test_util::*;
    use super::super::{Format, ToolChoice, Trigger};
    use super::*;
    use serde_json::json;

    const F: Format = Format::Lfm2;

    fn block(calls: &[String]) -> String {
        format!("{OPEN}[{}]{CLOSE}", calls.join(", "))
    }

    /// The three LFM2 templates, and no other of llama.cpp's.
    #[test]
    fn lfm2_detects_its_templates_only() {
        check_detect_all(
            |t| detect(t).then_some(F),
            &[
                ("LFM2-8B-A1B.jinja", F),
                ("LFM2.5-8B-A1B.jinja", F),
                ("LFM2.5-Instruct.jinja", F),
            ],
        );
    }

    /// Random tools and calls: the grammar takes the list as the template writes it (strings
    /// in double quotes, `True`/`False`), `parse` gives the calls back, streaming begins them
    /// in order; wrong names, broken arguments, extra calls, single quotes (which the grammar
    /// does not write) and a missing closing tag are refused.
    #[test]
    fn lfm2_grammar_accepts_calls_and_refuses_wrong_ones() {
        let mut rng = Rng(0x1F42_0001);
        for round in 0..120 {
            let parallel = round % 2 == 1;
            let r = random_req(&mut rng, round, parallel);
            let (p, g) = checked_plan(F, &r, Trigger::Word(OPEN.into()));
            let calls = random_calls(&mut rng, &r);
            let written: Vec<String> = calls
                .iter()
                .map(|(t, a)| python_call(&t.name, a.as_object().unwrap(), false))
                .collect();
            let text = block(&written);
            assert!(
                g.accepts_str(&text),
                "round {round}: refused {text}\n{}",
                p.gbnf
            );
            for single in [false, true] {
                let text = block(
                    &calls
                        .iter()
                        .map(|(t, a)| python_call(&t.name, a.as_object().unwrap(), single))
                        .collect::<Vec<_>>(),
                );
                let parsed = F.parse(&text, Some(&r));
                assert_eq!(parsed.content, "", "{text}");
                assert_eq!(parsed.tool_calls.len(), calls.len(), "{text}");
                for (c, (t, a)) in parsed.tool_calls.iter().zip(&calls) {
                    assert_call(c, &t.name, a, None);
                }
                check_stream_calls(F, &text, &r);
            }
            check_text_around(F, &r, &g, &text, calls.len());
            assert!(!g.accepts_str(""));
            assert!(!g.accepts_str(&format!("{OPEN}[]{CLOSE}")));
            assert!(!g.accepts_str(text.strip_suffix(CLOSE).unwrap()));
            let one = written[0].clone();
            assert!(g.accepts_str(&block(std::slice::from_ref(&one))));
            assert_eq!(g.accepts_str(&block(&[one.clone(), one.clone()])), parallel);
            // whitespace the template does not write
            assert!(!g.accepts_str(&format!("{OPEN}[ {one}]{CLOSE}")));
            assert!(!g.accepts_str(&format!("{OPEN}[{one}]\n{CLOSE}")));
            assert!(!g.accepts_str(&block(&["no_such_tool()".into()])));
            if let Some((o, a)) = other_tool(&mut rng, &r) {
                let b = block(&[python_call(&o.name, a.as_object().unwrap(), false)]);
                assert!(!g.accepts_str(&b), "other tool taken: {b}");
            }
            let (t, a) = &calls[0];
            let render = |a: &Value| match a.as_object() {
                Some(o) => block(&[python_call(&t.name, o, false)]),
                None => block(&[format!("{}({a})", t.name)]),
            };
            check_broken_args(&mut rng, &g, t, a, render);
            if a.as_object().unwrap().values().any(Value::is_string) {
                let single = block(&[python_call(&t.name, a.as_object().unwrap(), true)]);
                assert!(!g.accepts_str(&single), "{single}");
            }
        }
    }

    /// The literals a model writes, read as llama.cpp reads them: quotes of both kinds and
    /// their escapes, Python's and JSON's words, numbers, nested lists and dicts, whitespace.
    #[test]
    fn lfm2_reads_python_literals() {
        let r = f_req(true);
        let cases: &[(&str, &str)] = &[
            (r#"f(a="Paris", b=3)"#, r#"{"a":"Paris","b":3}"#),
            (
                r#"f(a='it\'s "x"', b="it's \"y\"")"#,
                r#"{"a":"it's \"x\"","b":"it's \"y\""}"#,
            ),
            (r#"f(a='\n\t\\ \u00e9 é')"#, r#"{"a":"\n\t\\ é é"}"#),
            (
                "f(a=True, b=False, c=None, d=true, e=false, g=null)",
                r#"{"a":true,"b":false,"c":null,"d":true,"e":false,"g":null}"#,
            ),
            (
                "f(a=-1.5e3, b=0, c=[1, [2, 'x'], {'k': None}])",
                r#"{"a":-1500.0,"b":0,"c":[1,[2,"x"],{"k":null}]}"#,
            ),
            ("f( a = 1 ,b={\"x\" : [ ] } )", r#"{"a":1,"b":{"x":[]}}"#),
            ("f()", "{}"),
        ];
        for (call, args) in cases {
            for text in [
                block(&[call.to_string()]),
                format!("{OPEN} [\n{call} ] \n{CLOSE}"),
            ] {
                let p = F.parse(&text, Some(&r));
                check_parsed(&p, "", &[super::super::test_util::call("f", args)], &text);
                check_stream_calls(F, &text, &r);
            }
        }
        // not calls: content as written
        for bad in [
            "[f(a=1,)]",
            "[f(a=01)]",
            "[f(a=1.)]",
            "[f(a=Yes)]",
            "[f(a='x\\q')]",
            "[f(1)]",
            "[f(a b=1)]",
            "[f(a=(1, 2))]",
            "f(a=1)",
            "[]",
            "[f(a=1) g()]",
            "[f(a=1)] x",
        ] {
            let text = format!("Hi {OPEN}{bad}{CLOSE}");
            check_parsed(&F.parse(&text, Some(&r)), &text, &[], &text);
            check_partial_prefixes(F, &text, Some(&r));
        }
        // LFM2.5's own rendering of two calls in its history
        let text = format!("Sure.{OPEN}[f(city='Paris', days=3), g(a=1, b=[2, 'x'])]{CLOSE}");
        let want = [
            super::super::test_util::call("f", r#"{"city":"Paris","days":3}"#),
            super::super::test_util::call("g", r#"{"a":1,"b":[2,"x"]}"#),
        ];
        check_parsed(&F.parse(&text, Some(&r)), "Sure.", &want, &text);
        check_stream_calls(F, &text, &r);
        // the closing tag missing at the end of the text
        let text = format!("{OPEN}[f(a=1), g()]\n");
        let p = F.parse(&text, Some(&r));
        assert_eq!(p.tool_calls.len(), 2);
        assert_eq!(p.content, "");
        check_verbatim(F, &format!("Hi {OPEN}[f(a=1)]{CLOSE}"), &r.tools);
    }

    /// Calls stream as they are written: a call once its `(` is written, its arguments as
    /// far as whole tokens go.
    #[test]
    fn lfm2_streams_arguments_as_written() {
        let r = f_req(true);
        for (text, calls) in [
            (format!("Hi {OPEN}[f"), vec![]),
            (format!("Hi {OPEN}[f("), vec![("f", "{")]),
            (format!("Hi {OPEN}[f(a"), vec![("f", "{")]),
            (format!("Hi {OPEN}[f(a=Tr"), vec![("f", "{\"a\":")]),
            (
                format!("Hi {OPEN}[f(a=True, b='P\\"),
                vec![("f", "{\"a\":true,\"b\":\"P")],
            ),
            (format!("Hi {OPEN}[f(a=12"), vec![("f", "{\"a\":")]),
            (format!("Hi {OPEN}[f(a=12)"), vec![("f", "{\"a\":12}")]),
            (
                format!("Hi {OPEN}[f(a=12), g("),
                vec![("f", "{\"a\":12}"), ("g", "{")],
            ),
        ] {
            let want: Vec<ToolCall> = calls
                .iter()
                .map(|(n, a)| super::super::test_util::call(n, a))
                .collect();
            check_parsed(&F.parse_partial(&text, Some(&r)), "Hi", &want, &text);
        }
    }

    /// Random outputs of the format (text, calls in one or more blocks, literals in both
    /// quotes), whole and slipped: streaming never takes back what it sent.
    #[test]
    fn lfm2_random_outputs_stream_without_taking_back() {
        let mut rng = Rng(0x1F42_0002);
        let pieces = [
            OPEN, CLOSE, "[", "]", "(", ")", "=", ",", "'", "\"", "\\", " ", "True",
        ];
        let mut calls = 0;
        for round in 0..200 {
            let r = random_req(&mut rng, round, round % 2 == 0);
            let mut text = random_output(&mut rng, F, &r);
            if round % 3 == 2 {
                mutate(&mut rng, &mut text, &pieces, 16);
            }
            calls += check_partial_prefixes(F, &text, Some(&r))
                .0
                .tool_calls
                .len();
        }
        assert!(calls > 150, "{calls}");
    }

    /// A tool whose parameters are all optional may be called without arguments; a schema's
    /// `true`, `false` and `null` are written the Python way.
    #[test]
    fn lfm2_grammar_optional_arguments_and_python_words() {
        let t = tool(
            "f",
            json!({"type": "object", "properties": {
                "a": {"type": "boolean"}, "b": {"type": ["null", "integer"]}, "c": {"type": "string"}
            }}),
        );
        let r = req(vec![t], ToolChoice::Required, false);
        let g = grammar(&F.plan(&r).unwrap().unwrap());
        for ok in [
            "f()",
            "f(a=True)",
            "f(b=None)",
            "f(a=False, b=3, c=\"x\")",
            "f(c=\"x\")",
        ] {
            assert!(g.accepts_str(&block(&[ok.into()])), "{ok}");
        }
        for bad in [
            "f(a=true)",
            "f(b=null)",
            "f(, a=True)",
            "f(b=1, a=True)",
            "f(a=True,b=1)",
        ] {
            assert!(!g.accepts_str(&block(&[bad.into()])), "{bad}");
        }
        let weird = tool(
            "g",
            json!({"type": "object", "properties": {"a b": {"type": "string"}}}),
        );
        assert!(F
            .plan(&req(vec![weird], ToolChoice::Required, false))
            .is_err());
    }
}
