//! The Llama 3.x format (Llama 3.1, 3.2, 3.3): a call is the whole reply, the JSON object
//! `{"name": NAME, "parameters": {...}}`, which the model ends with `<|eom_id|>` or
//! `<|eot_id|>` (end tokens, where the engine stops). The chat template shows the tools itself.
//! Text before the object is read as llama.cpp reads it: the content up to the reply's first
//! `{`, and a call if the object from there is one and ends the reply (the grammar writes
//! the object alone).
//!
//! The templates take one call per assistant message, so a reply holds one call even when
//! `parallel_tool_calls` asks for more.
//!
//! Llama 3.1's (and 3.3's) built-in tools, where the template knows them (it writes
//! `<|python_tag|>`, as llama.cpp tells them apart): a request's function named `wolfram_alpha`,
//! `web_search` or `brave_search` whose only parameter is `query`, or `python` or
//! `code_interpreter` whose only parameter is `code`, is a built-in. The template gets their
//! names as `builtin_tools` (its system prompt then says "Environment: ipython" and "Tools:
//! ..."), and renders a past call of one as `<|python_tag|>NAME.call(query="...")`. The model
//! calls one as `<|python_tag|>NAME.call(K=V, ...)`, each V a JSON value (the call is read as
//! `{"K": V, ...}`), or, with a code tool offered, writes `<|python_tag|>` then raw code: a
//! call of `python` (else `code_interpreter`; the one a named `tool_choice` names) with
//! `{"code": CODE}` (the text after the tag less the spaces, tabs and line ends around it:
//! the grammar's code starts at another character). Told "Environment: ipython", Llama 3.1
//! also writes the tag before a JSON call (as Meta's llama-models documents), which is read as
//! that call. Under a named `tool_choice` only that tool is read after the tag (raw code the
//! grammar took stays its code, even where it looks like another tool's call). Text may come
//! before the tag (content); nothing but whitespace after the call. The grammar takes each
//! form, besides the JSON call, and under `auto` also starts at the tag.
//!
//! Streaming begins the call once the reply from its first `{` (or the text after the tag)
//! is an object whose `name` is whole and whose keys so far are a call's; its arguments grow
//! as they are written.
//! A built-in call begins once `NAME.call(` is whole (its arguments grow member by member, as
//! JSON's), and raw code once the text after the tag cannot become a `NAME.call(` of an
//! offered built-in or a JSON call (the code grows as written, its trailing whitespace held
//! back). Whichever begins first is the reply's call.

use serde_json::{Map, Value};

use super::generic::reply_members;
use super::partial::{self, Json, Open};
use super::{
    allowed_tools, arguments_schema, begun_call, call_of, calls_wanted, offered, parse_blocks,
    parse_blocks_partial, tool_rules, verbatim, BlockStep, Blocks, LazyStart, Parsed, Plan, Tool,
    ToolCall, ToolChoice, ToolRequest, Trigger, WS_BODY,
};

use muser_jsonschema::gbnf_literal as lit;

/// A call opens the reply: `{`, the grammar's optional whitespace, then its first key (`"type"`
/// or `"name"`), so that the grammar takes the matched text from the `{` on.
pub(super) const LAZY_START: LazyStart =
    LazyStart::ReplyStart(r#"\{(?: |\n\n?[ \t]{0,20})?"(?:type|name)""#);

/// No markers: a call is plain JSON (the end tokens are the engine's).
pub(super) const MARKUP: &[&str] = &[];

/// The token that opens a built-in call (output, and triggering, where the template has
/// built-in tools).
pub(super) const PYTHON_TAG: &str = "<|python_tag|>";

/// The markup where the template has built-in tools.
pub(super) const MARKUP_BUILTIN: &[&str] = &[PYTHON_TAG];

/// Llama 3.1's built-in tools, as llama.cpp knows them, each with its one parameter.
const BUILTINS: &[(&str, &str)] = &[
    ("wolfram_alpha", "query"),
    ("web_search", "query"),
    ("brave_search", "query"),
    ("python", "code"),
    ("code_interpreter", "code"),
];

/// The tools raw code after the tag calls, the first offered one.
const CODE_TOOLS: &[&str] = &["python", "code_interpreter"];

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

/// Whether a Llama 3.x template has the built-in tools: it writes `<|python_tag|>` (llama.cpp's
/// test; Llama 3.1's and 3.3's do, 3.2's does not).
pub(super) fn detect_builtin_tools(t: &str) -> bool {
    t.contains(PYTHON_TAG)
}

/// The parameter of `tool` if it is a built-in: its name is one of `BUILTINS` and its
/// parameters' only property is that built-in's.
fn builtin_key(tool: &Tool) -> Option<&'static str> {
    let (_, key) = BUILTINS.iter().find(|(n, _)| *n == tool.name)?;
    let props = tool.parameters.get("properties")?.as_object()?;
    (props.len() == 1 && props.contains_key(*key)).then_some(*key)
}

/// The names of the request's built-in tools, in its order: the template's `builtin_tools`.
pub(super) fn builtin_names(req: &ToolRequest) -> Vec<String> {
    req.tools
        .iter()
        .filter(|t| builtin_key(t).is_some())
        .map(|t| t.name.clone())
        .collect()
}

/// One call object (an optional `"type": "function"`, then `"name"` and `"parameters"` of an
/// allowed tool, in that order); where the template has built-in tools (`builtin`), or after
/// `<|python_tag|>` that call object or a built-in call of an allowed built-in:
/// `NAME.call(K=V)`, V in the parameter's schema, or raw code for a code tool.
pub(super) fn plan(req: &ToolRequest, builtin: bool) -> Result<Option<Plan>, String> {
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
    let mut builtins = if builtin {
        builtin_rules(&tools, &mut rules)?
    } else {
        Vec::new()
    };
    // the template's prompt says "Environment: ipython" wherever there are tools: the model
    // writes the tag before a JSON call too
    if builtin {
        builtins.insert(0, format!("{} json-call", lit(PYTHON_TAG)));
    }
    let gbnf = format!(
        "root ::= json-call{}\n\
         json-call ::= \"{{\" ws call-type? ( {} ) ws \"}}\"\n\
         call-type ::= {} ws \":\" ws {} ws \",\" ws\n\
         ws ::= {WS_BODY}\n{rules}",
        builtins
            .iter()
            .map(|b| format!(" | {b}"))
            .collect::<String>(),
        alts.join(" | "),
        lit("\"type\""),
        lit("\"function\""),
    );
    let mut plan = Plan::calls(gbnf, &req.choice, LAZY_START);
    if plan.lazy && builtin {
        plan.triggers.push(Trigger::Word(PYTHON_TAG.to_string()));
    }
    Ok(Some(plan))
}

/// The rules of the built-in calls of `tools` (added to `rules`), and their names:
/// `<|python_tag|>NAME.call(K=V)` for each built-in, and raw code where one is a code tool
/// whose `code` may be any string (`any_string`).
fn builtin_rules(tools: &[&Tool], rules: &mut String) -> Result<Vec<String>, String> {
    let mut names = Vec::new();
    let mut code = false;
    for (i, t) in tools.iter().enumerate() {
        let Some(key) = builtin_key(t) else {
            continue;
        };
        let schema = &t.parameters["properties"][key];
        let (value, r) = tool_rules(t, schema, &format!("builtin{i}-"))?;
        rules.push_str(&format!(
            "builtin-{i} ::= {} {value} \")\"\n",
            lit(&format!("{PYTHON_TAG}{}.call({key}=", t.name)),
        ));
        rules.push_str(r.trim_end());
        rules.push('\n');
        names.push(format!("builtin-{i}"));
        code |= key == "code" && any_string(schema);
    }
    if code {
        // any text that starts with a visible character
        rules.push_str(&format!(
            "builtin-code ::= {} [^ \\t\\n\\r] .*\n",
            lit(PYTHON_TAG)
        ));
        names.push("builtin-code".to_string());
    }
    Ok(names)
}

/// Whether a schema takes every string (and only strings): `"type": "string"` and nothing
/// else but annotations. Raw code is allowed only for a `code` of such a schema, the grammar
/// having no hold on it.
fn any_string(schema: &Value) -> bool {
    const ANNOTATIONS: &[&str] = &["description", "title", "examples", "default", "$comment"];
    schema.as_object().is_some_and(|o| {
        o.get("type").is_some_and(|t| t == "string")
            && o.keys()
                .all(|k| k == "type" || ANNOTATIONS.contains(&k.as_str()))
    })
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

/// A reply's text before its first `{` and the rest. llama.cpp reads a call after text: the
/// content up to the first `{`, then one call object to the reply's end.
fn split_reply(text: &str) -> (&str, &str) {
    text.split_at(text.find('{').unwrap_or(text.len()))
}

/// A reply that is one call object gives the call and no content; one whose text before its
/// first `{` is followed by a call object to the end gives the call and that text as content
/// (as llama.cpp reads it). Where the template has built-in tools (`builtin`), a call after
/// `<|python_tag|>` (`Builtins::read`) gives the call and the text before the tag as content;
/// any other reply is content (its trailing whitespace trimmed).
pub(super) fn parse(text: &str, req: Option<&ToolRequest>, builtin: bool) -> Parsed {
    if !calls_wanted(req) {
        return verbatim(text);
    }
    let (before, rest) = split_reply(text);
    let json_call = read_reply(rest).filter(|c| offered(req, &c.name));
    // (a call after the built-ins' tag is theirs)
    if let Some(call) = json_call.filter(|_| !before.contains(PYTHON_TAG)) {
        return Parsed {
            content: before.trim_end().to_string(),
            reasoning: None,
            tool_calls: vec![call],
        };
    }
    match Builtins::offered(req, builtin) {
        Some(b) => parse_blocks(text, req, &[PYTHON_TAG], |after| {
            b.read(after).map(|call| (vec![call], after.len()))
        }),
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
    begun_call(&Json::Open(Open::Obj(fit)), args_key, None)
}

/// The text before the reply's first `{` while the rest may still be a call, else the reply
/// so far, less their trailing whitespace; the call once begun (`begun`), if its tool is
/// offered. Where the template has
/// built-in tools and the JSON call's name was not whole before the first `<|python_tag|>`,
/// the built-in call after the tag instead (`parse_blocks_partial`), the content before the
/// tag (less a tail that may begin the tag) held while the reply may still be a JSON call.
pub(super) fn parse_partial(text: &str, req: Option<&ToolRequest>, builtin: bool) -> Parsed {
    if !calls_wanted(req) {
        return verbatim(text);
    }
    let json_call = |t: &str| begun(t).filter(|c| offered(req, &c.name));
    let builtins = Builtins::offered(req, builtin).filter(|_| {
        // the JSON call is the reply's when its name was whole before the tag
        let before_tag = text.find(PYTHON_TAG).map_or(text, |i| &text[..i]);
        json_call(split_reply(before_tag).1).is_none()
    });
    // the text before the first `{` is content; from the `{` on, the reply may be a call
    let (before, rest) = split_reply(text);
    if let Some(b) = builtins {
        // (a reply holds one call: nothing to read on from)
        let mut fresh = Blocks::default();
        let mut p = parse_blocks_partial(
            text,
            req,
            &[PYTHON_TAG],
            |after, _| b.step(after),
            &mut fresh,
        );
        if may_be_call(text) {
            p.content.clear();
        } else if !rest.is_empty() && !text.contains(PYTHON_TAG) && may_be_call(rest) {
            p.content = before.trim_end().to_string();
        }
        return p;
    }
    let content = if may_be_call(rest) { before } else { text };
    Parsed {
        content: content.trim_end().to_string(),
        reasoning: None,
        tool_calls: json_call(rest).into_iter().collect(),
    }
}

/// What a request lets the model write after `<|python_tag|>`: a JSON call, a built-in call,
/// raw code.
struct Builtins<'r> {
    /// The names a `NAME.call(...)` may have.
    names: Vec<&'r str>,
    /// The tool raw code calls, if one is offered (and the choice allows it).
    code: Option<&'static str>,
    /// The function a named `tool_choice` names: the one tool read after the tag (what the
    /// grammar took as raw code stays that, even where it looks like another tool's call).
    named: Option<&'r str>,
    /// The request.
    req: &'r ToolRequest,
}

/// How far the text after `<|python_tag|>` is a `NAME.call(K=V, ...)`.
#[derive(Debug, PartialEq)]
enum Form {
    /// It may still become one (its `NAME.call(` is unfinished).
    Undecided,
    /// It is none.
    Not,
    /// `NAME.call(` is whole: the members so far (a repeated key keeps its first value), and
    /// where the call's `)` ends, or whether it stopped being a call before that.
    Begun {
        name: String,
        members: Vec<(String, Json)>,
        end: Option<usize>,
        broken: bool,
    },
}

impl<'r> Builtins<'r> {
    /// What `req` lets the model write after the tag where the template has built-in tools
    /// (None elsewhere): the built-ins it offers that the choice allows (none, where it offers
    /// none: a JSON call may still follow the tag).
    fn offered(req: Option<&'r ToolRequest>, builtin: bool) -> Option<Builtins<'r>> {
        let req = req.filter(|_| builtin)?;
        let named = match &req.choice {
            ToolChoice::Function(n) => Some(n.as_str()),
            _ => None,
        };
        let names: Vec<&str> = req
            .tools
            .iter()
            .filter(|t| builtin_key(t).is_some() && named.is_none_or(|n| n == t.name))
            .map(|t| t.name.as_str())
            .collect();
        // the first code tool allowed (the grammar's)
        let code = CODE_TOOLS.iter().copied().find(|c| names.contains(c));
        Some(Builtins {
            names,
            code,
            named,
            req,
        })
    }

    /// Whether a call of `name` may be read after the tag: an offered tool the choice allows
    /// (else the text is raw code, or content).
    fn allows(&self, name: &str) -> bool {
        offered(Some(self.req), name) && self.named.is_none_or(|n| n == name)
    }

    /// The JSON call the text after the tag has begun (`begun`), while it may be one: nothing
    /// while it may still become one, None where it is none.
    fn json_step(&self, after: &str) -> Option<Vec<ToolCall>> {
        (after.trim_start().starts_with('{') && may_be_call(after)).then(|| {
            begun(after)
                .filter(|c| self.allows(&c.name))
                .into_iter()
                .collect()
        })
    }

    /// The call the whole text after the tag is: a JSON call object, or `NAME.call(...)` and
    /// whitespace, else raw code (where a code tool is offered and there is any).
    fn read(&self, after: &str) -> Option<ToolCall> {
        if let Some(call) = read_reply(after).filter(|c| self.allows(&c.name)) {
            return Some(call);
        }
        if let Form::Begun {
            name,
            members,
            end: Some(end),
            broken: false,
        } = self.form(after)
        {
            if after[end..].trim().is_empty() {
                return call_of(&name, &Value::Object(whole_members(members)));
            }
        }
        let code = trim_code(after);
        let tool = self.code.filter(|_| !code.is_empty())?;
        call_of(tool, &serde_json::json!({ "code": code }))
    }

    /// What streaming reads of the text so far after the tag: the JSON call begun while the
    /// text may be one (`json_step`); nothing while it may become a `NAME.call(`, the
    /// built-in call once that is whole (its arguments as far as they are known), else the raw
    /// code so far (less trailing whitespace).
    fn step(&self, after: &str) -> BlockStep {
        if let Some(calls) = self.json_step(after) {
            return BlockStep::Open(calls);
        }
        match self.form(after) {
            Form::Undecided => BlockStep::Open(Vec::new()),
            Form::Begun {
                name,
                members,
                end,
                broken,
            } => {
                // a closed call's members are all whole
                let arguments = match end {
                    Some(_) => Value::Object(whole_members(members)).to_string(),
                    None => Json::Open(Open::Obj(members)).stable(),
                };
                let call = vec![ToolCall {
                    id: None,
                    name,
                    arguments,
                }];
                let whole = end.filter(|&e| !broken && after[e..].trim().is_empty());
                match whole {
                    Some(_) => BlockStep::Whole(call, after.len()),
                    None if broken || end.is_some() => BlockStep::Broken(call),
                    None => BlockStep::Open(call),
                }
            }
            Form::Not => match self.code {
                Some(tool) => {
                    let code = trim_code(after);
                    let open = Json::Open(Open::Obj(vec![(
                        "code".to_string(),
                        Json::Open(Open::Str(code.to_string())),
                    )]));
                    BlockStep::Open(vec![ToolCall {
                        id: None,
                        name: tool.to_string(),
                        arguments: open.stable(),
                    }])
                }
                // not a call: the tag stays in the content (`parse_blocks`), nothing after it
                // is streamed
                None => BlockStep::Broken(Vec::new()),
            },
        }
    }

    /// How far `t` (the text after the tag) is a call `NAME.call(K=V, ...)` of an offered
    /// built-in: whitespace may come between its parts, each V is JSON.
    fn form(&self, t: &str) -> Form {
        let mut undecided = false;
        for name in &self.names {
            let mut at = 0;
            for part in [*name, ".", "call", "("] {
                match expect(t, at, part) {
                    Ok(end) => at = end,
                    Err(more) => {
                        undecided |= more;
                        at = usize::MAX;
                        break;
                    }
                }
            }
            if at != usize::MAX {
                return members(t, at, name);
            }
        }
        if undecided {
            Form::Undecided
        } else {
            Form::Not
        }
    }
}

/// Raw code less the whitespace around it: the grammar's (`builtin-code` starts at a
/// character other than these), so that what it takes is never empty.
fn trim_code(code: &str) -> &str {
    code.trim_matches([' ', '\t', '\n', '\r'])
}

/// The whole members' keys and values (an open one is left out).
fn whole_members(members: Vec<(String, Json)>) -> Map<String, Value> {
    members
        .into_iter()
        .filter_map(|(k, v)| match v {
            Json::Whole(v, _) => Some((k, v)),
            Json::Open(_) => None,
        })
        .collect()
}

/// The offset of `t` after whitespace from `at`.
fn skip_ws(t: &str, at: usize) -> usize {
    at + (t[at..].len() - t[at..].trim_start().len())
}

/// `lit` at `t[at..]`, after whitespace: Ok(where it ends), or Err(whether the text ends before
/// it is whole, so that it may still come).
fn expect(t: &str, at: usize, lit: &str) -> Result<usize, bool> {
    let i = skip_ws(t, at);
    let rest = &t[i..];
    if rest.starts_with(lit) {
        Ok(i + lit.len())
    } else {
        Err(lit.starts_with(rest))
    }
}

/// The members of a built-in call whose `NAME.call(` ends at `at` of `t`.
fn members(t: &str, mut at: usize, name: &str) -> Form {
    let mut members: Vec<(String, Json)> = Vec::new();
    let begun = |members, end, broken| Form::Begun {
        name: name.to_string(),
        members,
        end,
        broken,
    };
    let key_char = |c: char| c.is_alphanumeric() || c == '_';
    at = skip_ws(t, at);
    if t[at..].starts_with(')') {
        return begun(members, Some(at + 1), false);
    }
    loop {
        let rest = &t[at..];
        let key_len = rest.len() - rest.trim_start_matches(key_char).len();
        if key_len == rest.len() {
            return begun(members, None, false);
        }
        if key_len == 0 {
            return begun(members, None, true);
        }
        let key = rest[..key_len].to_string();
        at = match expect(t, at + key_len, "=") {
            Ok(end) => end,
            Err(more) => return begun(members, None, !more),
        };
        let read = partial::read(&t[at..]);
        let repeat = members.iter().any(|(k, _)| *k == key);
        match read.json {
            Json::Whole(v, end) => {
                if !repeat {
                    members.push((key, Json::Whole(v, end)));
                }
                at = skip_ws(t, at + end);
            }
            open => {
                if !repeat {
                    members.push((key, open));
                }
                return begun(members, None, read.broken);
            }
        }
        match t[at..].chars().next() {
            None => return begun(members, None, false),
            Some(',') => at = skip_ws(t, at + 1),
            Some(')') => return begun(members, Some(at + 1), false),
            Some(_) => return begun(members, None, true),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_util::*;
    use super::super::{Format, ToolChoice, Trigger};
    use super::*;
    use muser_sample::Grammar;
    use serde_json::json;

    /// Llama 3.2's: no built-in tools.
    const L3: Format = Format::Llama3 {
        builtin_tools: false,
    };
    /// Llama 3.1's and 3.3's: built-in tools.
    const L31: Format = Format::Llama3 {
        builtin_tools: true,
    };

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
            let (p, g) = checked_plan(L3, &r, LAZY_START.trigger());
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
                        let parsed = L3.parse(&reply, Some(&r));
                        assert_eq!(parsed.content, "");
                        assert_eq!(parsed.reasoning, None);
                        assert_eq!(parsed.tool_calls.len(), 1);
                        assert_call(&parsed.tool_calls[0], &t.name, &a, None);
                        check_stream_calls(L3, &reply, &r);
                    }
                    if p.lazy {
                        // the trigger fires at the reply's start, and the grammar takes the
                        // text from its `{` on
                        let reply = format!(" \n{text}");
                        assert_eq!(triggered(&p, &reply), Some(text.as_str()));
                        // text before the object: no trigger, but the call is read after
                        // the text (as llama.cpp reads it)
                        let late = format!("Sure: {text}");
                        assert_eq!(triggered(&p, &late), None);
                        let parsed = L3.parse(&late, Some(&r));
                        assert_eq!(parsed.content, "Sure:");
                        assert_eq!(parsed.tool_calls.len(), 1);
                        assert_call(&parsed.tool_calls[0], &t.name, &a, None);
                        check_stream_calls(L3, &late, &r);
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
            assert_eq!(L3.parse(&swapped, Some(&r)).tool_calls.len(), 1);
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
            let p = L3.plan(&r).unwrap().unwrap();
            let g = Grammar::parse(&p.gbnf).unwrap();
            assert!(g.accepts_str(body), "{}", p.gbnf);
            if p.lazy {
                assert_eq!(triggered(&p, body), Some(body));
            }
            let parsed = L3.parse(body, Some(&r));
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
        let g = Grammar::parse(&L3.plan(&r).unwrap().unwrap().gbnf).unwrap();
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
            // text before the call is content, as llama.cpp reads it: up to the first `{`,
            // the call from there to the end
            (
                "Sure: {\"name\": \"f\", \"parameters\": {}}",
                "Sure:",
                call("f", "{}"),
            ),
            (
                "Sure } \n{\"type\": \"function\", \"name\": \"f\", \"parameters\": {}}\n",
                "Sure }",
                call("f", "{}"),
            ),
            (
                "a {b} {\"name\": \"f\", \"parameters\": {}}",
                "a {b} {\"name\": \"f\", \"parameters\": {}}",
                vec![],
            ),
            (
                "Sure: {\"name\": \"f\", \"parameters\": {}} done",
                "Sure: {\"name\": \"f\", \"parameters\": {}} done",
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
            check_parsed(&L3.parse(text, Some(&r)), content, calls, text);
        }
        // no tools or tool_choice none: the text as is
        let t = "{\"name\": \"f\", \"parameters\": {}}\n";
        check_verbatim(L3, t, &r.tools);
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
            ("Hi {\"name\"", "Hi"),
            ("Hi \n{\"na", "Hi"),
            ("Hi {\"a\"", "Hi {\"a\""),
            ("Hi {b} {\"name\"", "Hi {b} {\"name\""),
            ("Hi\n\n", "Hi"),
        ] {
            let p = L3.parse_partial(t, Some(&r));
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
                r#"Sure: {"name": "f", "parameters": {"a": 1"#,
                call("f", r#"{"a":"#),
            ),
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
            let p = L3.parse_partial(t, Some(&r));
            assert_eq!(p.tool_calls, calls, "{t}");
        }
        // a repeated key keeps its first value, streamed and read alike
        for t in [
            r#"{"name": "f", "parameters": {"a": 1}, "name": "g"}"#,
            r#"{"name": "f", "parameters": {"a": 1}, "parameters": {}}"#,
        ] {
            let streamed = call("f", r#"{"a":1}"#);
            check_parsed(&L3.parse_partial(t, Some(&r)), "", &streamed, t);
            check_parsed(&L3.parse(t, Some(&r)), "", &streamed, t);
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
            let part = L3.parse_partial(t, Some(&r));
            check_parsed(&part, "", &streamed, t);
            assert!(!L3.parse(t, Some(&r)).continues(&part), "{t}");
            check_parsed(&L3.parse_final(t, Some(&r)), "", &streamed, t);
        }
        // a repeated key in the arguments keeps its first value: the repeat adds nothing to
        // what is streamed, and the call ends as streamed
        let t = r#"{"name": "f", "parameters": {"a": 1, "b": 2, "a": 3}}"#;
        let full = L3.parse(t, Some(&r));
        assert_eq!(full.tool_calls, call("f", r#"{"a":1,"b":2}"#));
        for p in prefixes(t).skip_while(|p| !p.ends_with("2, ")) {
            let part = L3.parse_partial(p, Some(&r));
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
                let (full, n) = check_partial_prefixes(L3, &t, req);
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
            let (full, _) = check_partial_prefixes(L3, &t, Some(&r));
            let end = L3.parse_partial(&t, Some(&r));
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
                let fin = L3.parse_final(&t, Some(&r));
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
        let e = L3
            .plan(&req(vec![bad], ToolChoice::Required, false))
            .unwrap_err();
        assert!(e.contains("`bad`"), "{e}");
        let f = tool("f", json!({"type": "object"}));
        let e = L3
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
            ("meta-llama-Llama-3.1-8B-Instruct.jinja", L31),
            ("meta-llama-Llama-3.2-3B-Instruct.jinja", L3),
            ("meta-llama-Llama-3.3-70B-Instruct.jinja", L31),
        ];
        check_detect_all(
            |t| {
                detect(t).then(|| Format::Llama3 {
                    builtin_tools: detect_builtin_tools(t),
                })
            },
            &want,
        );
    }

    /// A built-in tool as Llama's tools are declared: its one parameter a required string.
    fn builtin_tool(name: &str) -> Tool {
        let key = BUILTINS.iter().find(|(n, _)| *n == name).unwrap().1;
        tool(
            name,
            json!({"type": "object", "properties": {key: {"type": "string"}}, "required": [key]}),
        )
    }

    /// Random tools with a random non-empty set of the built-ins among them, and `tool_choice`
    /// auto, required or one of the built-ins in turn.
    fn builtin_req(rng: &mut Rng, round: usize) -> ToolRequest {
        let mut tools = random_tools(rng);
        let mut names: Vec<&str> = BUILTINS.iter().map(|(n, _)| *n).collect();
        for i in (1..names.len()).rev() {
            names.swap(i, rng.below(i + 1));
        }
        let picked = &names[..1 + rng.below(names.len())];
        for n in picked {
            tools.insert(rng.below(tools.len() + 1), builtin_tool(n));
        }
        let choice = match round % 3 {
            0 => ToolChoice::Auto,
            1 => ToolChoice::Required,
            _ => ToolChoice::Function(picked[rng.below(picked.len())].to_string()),
        };
        req(tools, choice, false)
    }

    /// Random text from pieces that JSON and a call's syntax make much of: quotes,
    /// backslashes, brackets, commas, `=`, control characters, unicode.
    fn random_text(rng: &mut Rng, max: usize) -> String {
        const PIECES: &[&str] = &[
            "a", "Z", " ", "\"", "\\", "\n", "\t", "é", "€", "😀", "(", ")", ",", "=", "'", "{",
            "}", ".call(", "x=1", "\u{1}", "<", "|",
        ];
        (0..rng.below(max))
            .map(|_| PIECES[rng.below(PIECES.len())])
            .collect()
    }

    /// Random code: a first visible character, then random text.
    fn random_code(rng: &mut Rng) -> String {
        const FIRST: &[&str] = &["print(", "x", "import ", "é", "#", "(", "\"", "1"];
        format!("{}{}", FIRST[rng.below(FIRST.len())], random_text(rng, 12))
    }

    /// Random requests with built-ins (Llama 3.1's template): the grammar takes each allowed
    /// built-in's `<|python_tag|>NAME.call(K="...")` with random values, and raw code where a
    /// code tool is allowed; `parse` reads them back (the text before the tag as content),
    /// streaming never takes anything back and begins the call by the end; the lazy grammar
    /// also starts at the tag; what no built-in allows is refused, and Llama 3.2's format
    /// reads none of it.
    #[test]
    fn llama3_builtin_calls_are_planned_read_and_streamed() {
        let mut rng = Rng(0x11A3_0B01);
        let (mut calls, mut code_calls) = (0usize, 0usize);
        for round in 0..150 {
            let r = builtin_req(&mut rng, round);
            let p = L31.plan(&r).unwrap().unwrap();
            assert_eq!(p.system, None);
            assert_eq!(p.lazy, r.choice == ToolChoice::Auto);
            if p.lazy {
                assert_eq!(
                    p.triggers,
                    vec![LAZY_START.trigger(), Trigger::Word(PYTHON_TAG.to_string())]
                );
            }
            let g = grammar(&p);
            let g32 = grammar(&L3.plan(&r).unwrap().unwrap());
            let mut texts = Vec::new();
            for t in allowed(&r) {
                let Some(key) = builtin_key(t) else {
                    continue;
                };
                let value = random_text(&mut rng, 10);
                let text = format!(
                    "{PYTHON_TAG}{}.call({key}={})",
                    t.name,
                    Value::from(value.clone())
                );
                texts.push((text, t.name.clone(), json!({ key: value })));
                if key == "code" {
                    let code = random_code(&mut rng);
                    let name = if r.choice == ToolChoice::Function(t.name.clone()) {
                        t.name.clone()
                    } else {
                        ["python", "code_interpreter"]
                            .into_iter()
                            .find(|n| r.tools.iter().any(|o| o.name == *n))
                            .unwrap()
                            .to_string()
                    };
                    texts.push((
                        format!("{PYTHON_TAG}{code}"),
                        name,
                        json!({ "code": code.trim() }),
                    ));
                }
            }
            assert!(!texts.is_empty());
            for (text, name, args) in &texts {
                assert!(
                    g.accepts_str(text),
                    "round {round}: refused {text}\n{}",
                    p.gbnf
                );
                assert!(!g32.accepts_str(text), "{text}");
                let parsed = L31.parse(text, Some(&r));
                assert_eq!(parsed.content, "", "{text}");
                assert_eq!(parsed.tool_calls.len(), 1, "{text}");
                assert_call(&parsed.tool_calls[0], name, args, None);
                let b = Builtins::offered(Some(&r), true).unwrap();
                let after = &text[PYTHON_TAG.len()..];
                let (_, n) = check_partial_prefixes(L31, text, Some(&r));
                assert!(n > 1);
                if b.form(after) != Form::Undecided {
                    check_stream_calls(L31, text, &r);
                }
                // text before the tag is content
                let before = format!("Sure, {}\n", random_text(&mut rng, 6));
                let with_text = format!("{before}{text}\n");
                let parsed = L31.parse(&with_text, Some(&r));
                assert_eq!(parsed.content, before.trim_end());
                assert_eq!(parsed.tool_calls.len(), 1);
                assert_call(&parsed.tool_calls[0], name, args, None);
                check_partial_prefixes(L31, &with_text, Some(&r));
                // Llama 3.2's format: content, and no grammar takes it
                let l32 = L3.parse(text, Some(&r));
                assert_eq!(
                    (l32.content.as_str(), l32.tool_calls.len()),
                    (text.trim_end(), 0)
                );
                if name == "python" || name == "code_interpreter" {
                    code_calls += 1;
                }
                calls += 1;
            }
            // nothing after the tag, or whitespace only, is no call
            assert!(!g.accepts_str(PYTHON_TAG));
            assert!(!g.accepts_str(&format!("{PYTHON_TAG} ")));
            // where raw code is not allowed: nothing after a call form, a name not offered or
            // not allowed, a value of the wrong type
            let raw = allowed(&r).iter().any(|t| builtin_key(t) == Some("code"));
            if !raw {
                let (first, name, _) = &texts[0];
                assert!(!g.accepts_str(&format!("{first} more")), "{first}");
                let key = r
                    .tools
                    .iter()
                    .find(|t| t.name == *name)
                    .and_then(builtin_key)
                    .unwrap();
                for bad in [
                    format!("{PYTHON_TAG}no_such_tool.call({key}=\"x\")"),
                    format!("{PYTHON_TAG}{name}.call({key}=1)"),
                    format!("{PYTHON_TAG}{name}.call()"),
                    format!("{PYTHON_TAG}{name}.call({key}=\"x\", zz=\"y\")"),
                    format!("{PYTHON_TAG}print(1)"),
                ] {
                    assert!(!g.accepts_str(&bad), "took {bad}");
                }
                for o in r.tools.iter().filter(|o| !allowed(&r).contains(o)) {
                    if let Some(key) = builtin_key(o) {
                        let call = format!("{PYTHON_TAG}{}.call({key}=\"x\")", o.name);
                        assert!(!g.accepts_str(&call), "took {call}");
                    }
                }
            }
        }
        assert!(calls > 300 && code_calls > 80, "{calls} {code_calls}");
    }

    /// `brave_search`, `wolfram_alpha` and `python` as built-ins, `f` and a `web_search` whose
    /// parameters are not the built-in's (a plain function), `tool_choice` auto.
    fn builtin_f_req() -> ToolRequest {
        let mut tools: Vec<Tool> = ["brave_search", "wolfram_alpha", "python"]
            .into_iter()
            .map(builtin_tool)
            .collect();
        tools.push(tool("f", json!({"type": "object", "properties": {}})));
        tools.push(tool(
            "web_search",
            json!({"type": "object", "properties": {"query": {}, "n": {}}}),
        ));
        req(tools, ToolChoice::Auto, false)
    }

    /// Raw code only where `code` may be any string: a schema the grammar could not hold raw
    /// code to takes the call form alone.
    #[test]
    fn llama3_raw_code_only_for_any_string() {
        let mut rng = Rng(0x11A3_0B04);
        for round in 0..40 {
            let code = random_code(&mut rng);
            let short = json!({"type": "string", "maxLength": 3 + rng.below(5)});
            // each schema, whether it takes any raw code, and whether it takes "a"
            let schemas = [
                (
                    json!({"type": "string", "description": "Python code"}),
                    true,
                    true,
                ),
                (json!({"type": "string"}), true, true),
                (short, false, true),
                (json!({"type": "string", "pattern": "^x"}), false, false),
                (json!({"enum": ["a", "b"]}), false, true),
            ];
            for (schema, raw, takes_a) in schemas {
                let t = tool(
                    ["python", "code_interpreter"][round % 2],
                    json!({"type": "object", "properties": {"code": schema}}),
                );
                let r = req(vec![t.clone()], ToolChoice::Required, false);
                let g = grammar(&L31.plan(&r).unwrap().unwrap());
                let text = format!("{PYTHON_TAG}{code}");
                assert_eq!(g.accepts_str(&text), raw, "{schema} {text:?}");
                let call = format!("{PYTHON_TAG}{}.call(code=\"a\")", t.name);
                assert_eq!(g.accepts_str(&call), takes_a, "{schema} {call}");
            }
        }
    }

    #[test]
    fn llama3_builtin_parse_cases() {
        let r = builtin_f_req();
        let mut no_code = r.clone();
        no_code.tools.retain(|t| t.name != "python");
        let call = |name: &str, args: &str| vec![call(name, args)];
        let tag = PYTHON_TAG;
        let cases: Vec<(String, &str, Vec<ToolCall>, Vec<ToolCall>)> = vec![
            // text, content, calls with `python` offered, calls without
            (
                format!("{tag}brave_search.call(query=\"a \\\"b\\\" \\\\ é\")"),
                "",
                call("brave_search", r#"{"query":"a \"b\" \\ é"}"#),
                call("brave_search", r#"{"query":"a \"b\" \\ é"}"#),
            ),
            (
                format!("Let me look.\n{tag} wolfram_alpha . call ( query = \"2+2\" , n = [1, {{}}] ) \n"),
                "Let me look.",
                call("wolfram_alpha", r#"{"query":"2+2","n":[1,{}]}"#),
                call("wolfram_alpha", r#"{"query":"2+2","n":[1,{}]}"#),
            ),
            // a repeated key keeps its first value
            (
                format!("{tag}brave_search.call(query=\"a\", query=\"b\")"),
                "",
                call("brave_search", r#"{"query":"a"}"#),
                call("brave_search", r#"{"query":"a"}"#),
            ),
            (
                format!("{tag}python.call(code=\"print(1)\")"),
                "",
                call("python", r#"{"code":"print(1)"}"#),
                vec![],
            ),
            // raw code: a call of python, trimmed
            (
                format!("{tag}\nprint(\"hi\")\nx = 1\n\n"),
                "",
                call("python", r#"{"code":"print(\"hi\")\nx = 1"}"#),
                vec![],
            ),
            // not a call form: raw code where python is offered, content otherwise
            (
                format!("{tag}brave_search.call(query=abc)"),
                "",
                call("python", r#"{"code":"brave_search.call(query=abc)"}"#),
                vec![],
            ),
            (
                format!("{tag}brave_search.call(query=\"a\") + 1"),
                "",
                call("python", r#"{"code":"brave_search.call(query=\"a\") + 1"}"#),
                vec![],
            ),
            (
                format!("{tag}brave_search.call(query=\"a\""),
                "",
                call("python", r#"{"code":"brave_search.call(query=\"a\""}"#),
                vec![],
            ),
            // a function that is not a built-in, or not offered
            (
                format!("{tag}web_search.call(query=\"a\")"),
                "",
                call("python", r#"{"code":"web_search.call(query=\"a\")"}"#),
                vec![],
            ),
            (
                format!("{tag}f.call()"),
                "",
                call("python", r#"{"code":"f.call()"}"#),
                vec![],
            ),
            // nothing after the tag
            (format!("Hi {tag} \n"), "", vec![], vec![]),
            // the JSON call is read as ever
            (
                "{\"name\": \"brave_search\", \"parameters\": {\"query\": \"q\"}}".to_string(),
                "",
                call("brave_search", r#"{"query":"q"}"#),
                call("brave_search", r#"{"query":"q"}"#),
            ),
        ];
        for (text, content, with_code, without) in &cases {
            let p = L31.parse(text, Some(&r));
            let c = if with_code.is_empty() {
                text.trim_end()
            } else {
                content
            };
            check_parsed(&p, c, with_code, text);
            let p = L31.parse(text, Some(&no_code));
            let c = if without.is_empty() {
                text.trim_end()
            } else {
                content
            };
            check_parsed(&p, c, without, text);
            for q in [&r, &no_code] {
                check_partial_prefixes(L31, text, Some(q));
                // Llama 3.2's format reads no built-in call
                let p = L3.parse(text, Some(q));
                if !text.starts_with('{') {
                    check_parsed(&p, text.trim_end(), &[], text);
                }
            }
        }
        // without tools, or with tool_choice none: the text as is
        check_verbatim(L31, &cases[0].0, &r.tools);
        // without built-ins offered: a built-in call is content, and the grammar refuses it
        // (the tag still triggers, for a JSON call after it)
        let plain = f_req(false);
        let t = &cases[0].0;
        check_parsed(&L31.parse(t, Some(&plain)), t, &[], t);
        let p = L31.plan(&plain).unwrap().unwrap();
        assert_eq!(
            p.triggers,
            vec![LAZY_START.trigger(), Trigger::Word(PYTHON_TAG.to_string())]
        );
        assert!(!grammar(&p).accepts_str(t));
        // streamed: nothing while the call form may come, the call once `NAME.call(` is whole,
        // its arguments member by member; raw code once no call form can come, as written
        // less trailing whitespace
        for (t, calls) in [
            (tag.to_string(), vec![]),
            (format!("{tag}brave_s"), vec![]),
            (format!("{tag}brave_search . ca"), vec![]),
            (
                format!("{tag}brave_search.call("),
                call("brave_search", "{"),
            ),
            (
                format!("{tag}brave_search.call(query=\"a\\\"b"),
                call("brave_search", r#"{"query":"a\"b"#),
            ),
            (
                format!("{tag}brave_search.call(query=\"a\", n=12"),
                call("brave_search", r#"{"query":"a","n":"#),
            ),
            (
                format!("{tag}brave_search.call(query=\"a\") "),
                call("brave_search", r#"{"query":"a"}"#),
            ),
            (format!("{tag}brx"), call("python", r#"{"code":"brx"#)),
            (format!("{tag}pr"), call("python", r#"{"code":"pr"#)),
            (format!("{tag}py"), vec![]),
            (
                format!("{tag} import os\n  "),
                call("python", r#"{"code":"import os"#),
            ),
        ] {
            let p = L31.parse_partial(&t, Some(&r));
            assert_eq!(p.tool_calls, calls, "{t}");
            assert_eq!(p.content, "", "{t}");
        }
        // the content before the tag, less what may begin it
        for (t, c) in [
            ("Hi <|pyth", "Hi"),
            ("Hi <|python_tag|>brave", "Hi"),
            ("{\"name\": \"f\" <|python_tag|>brave_search.call(", ""),
            ("{\"a\": 1} <", "{\"a\": 1}"),
        ] {
            assert_eq!(L31.parse_partial(t, Some(&r)).content, c, "{t}");
        }
        // a JSON call whose name came first stays the reply's call
        let t = "{\"name\": \"f\", \"parameters\": {\"a\": \"<|python_tag|>brave_search.call(";
        assert_eq!(
            L31.parse_partial(t, Some(&r)).tool_calls,
            call("f", r#"{"a":"<|python_tag|>brave_search.call("#)
        );
        // and a call after the tag whose JSON name was not whole before it
        let t = "{\"parameters\": {\"a\": \"<|python_tag|>brave_search.call(query=\"x\")";
        assert_eq!(
            L31.parse_partial(t, Some(&r)).tool_calls,
            call("brave_search", r#"{"query":"x"}"#)
        );
        check_partial_prefixes(L31, &format!("{t}\"}}, \"name\": \"f\"}}"), Some(&r));
    }

    /// For every text built from the format's pieces and the built-ins', and every prefix of
    /// it, with python offered, without, and without built-ins: what streaming sends is a
    /// prefix of what the finished text gives, and is never taken back.
    #[test]
    fn llama3_builtin_partial_is_prefix_of_parse() {
        let r = builtin_f_req();
        let mut no_code = r.clone();
        no_code.tools.retain(|t| t.name != "python");
        let reqs = [r.clone(), no_code, f_req(false)];
        let frags = [
            "a",
            " ",
            "\n",
            PYTHON_TAG,
            "<|py",
            "brave_search",
            "python",
            "f",
            ".call(",
            ".",
            "call",
            "(",
            ")",
            "query=",
            "code=",
            "n=",
            "=",
            ", ",
            "\"x\\\"y\"",
            "\"",
            "\\",
            "12",
            "[1, {\"b\": null}]",
            "{",
            "}",
            "\"name\": \"f\"",
            "\"parameters\": {}",
            "é",
        ];
        let whole = [
            "<|python_tag|>brave_search.call(query=\"a)b\")",
            "<|python_tag|>wolfram_alpha.call(query=\"x\", n=[1, 2])",
            "<|python_tag|>print('hi')\n",
            "<|python_tag|>python.call(code=\"1\")",
            "{\"name\": \"f\", \"parameters\": {}}",
        ];
        let mut rng = Rng(0x11A3_0B02);
        let (mut checked, mut calls) = (0usize, 0usize);
        for _ in 0..2500 {
            let mut t: String = (0..rng.below(9))
                .map(|_| frags[rng.below(frags.len())])
                .collect();
            if rng.below(3) == 0 {
                t = format!(
                    "{}{}{}",
                    ["", "Sure. ", "\n"][rng.below(3)],
                    whole[rng.below(whole.len())],
                    [" \n", "", "x"][rng.below(3)]
                );
                if rng.coin() {
                    mutate(&mut rng, &mut t, &frags, 8);
                }
            }
            for q in &reqs {
                let (full, n) = check_partial_prefixes(L31, &t, Some(q));
                calls += full.tool_calls.len();
                checked += n;
            }
        }
        assert!(checked > 50_000 && calls > 800, "{checked} {calls}");
    }

    /// Llama 3.1's template (llama.cpp's copy) with built-ins offered: the template gets their
    /// names as `builtin_tools` and says "Environment: ipython" and "Tools: ..." (without
    /// `code_interpreter`, which the template leaves out); a past built-in call renders as
    /// `<|python_tag|>NAME.call(query="...")<|eom_id|>`, which `parse` reads back as that call.
    /// Llama 3.2's template, and requests without built-ins, get no `builtin_tools`.
    #[test]
    fn llama3_builtin_tools_reach_the_template() {
        use crate::chat::{ChatRequest, ChatTemplate};
        let Some(src) = template("meta-llama-Llama-3.1-8B-Instruct.jinja") else {
            return;
        };
        let format = Format::detect(Some(&src));
        assert_eq!(format, L31);
        let t = ChatTemplate::new(Some(&src), "<|begin_of_text|>", "<|eot_id|>").unwrap();
        let mut rng = Rng(0x11A3_0B03);
        for round in 0..20 {
            let r = builtin_req(&mut rng, round);
            let names = builtin_names(&r);
            let query: String = (0..1 + rng.below(12))
                .map(|_| ["a", "Z", " ", "é", "😀", "(", ",", "=", "'"][rng.below(9)])
                .collect();
            let brave = r.tools.iter().any(|t| t.name == "brave_search");
            let mut messages = vec![json!({"role": "user", "content": "Search"})];
            if brave {
                messages.push(json!({"role": "assistant", "content": "", "tool_calls": [{
                    "id": "call_1", "type": "function", "function": {
                        "name": "brave_search",
                        "arguments": json!({"query": query}).to_string()}}]}));
                messages.push(json!({"role": "tool", "tool_call_id": "call_1", "content": "r"}));
            }
            let tools: Vec<Value> = r
                .tools
                .iter()
                .map(|t| json!({"type": "function", "function": {"name": t.name, "parameters": t.parameters}}))
                .collect();
            let body = json!({"messages": messages});
            let mut chat = ChatRequest::parse(body.as_object().unwrap()).unwrap();
            chat.tools = Some(Value::from(tools));
            let vars = format.template_variables(&r);
            assert_eq!(vars, vec![("builtin_tools", json!(names))]);
            for (k, v) in vars {
                chat.add_variable(k, v);
            }
            let prompt = t.render_request(&chat).unwrap();
            let listed: Vec<&str> = names
                .iter()
                .map(String::as_str)
                .filter(|n| *n != "code_interpreter")
                .collect();
            let head = format!(
                "<|start_header_id|>system<|end_header_id|>\n\nEnvironment: ipython\nTools: {}\n\n",
                listed.join(", ")
            );
            assert!(prompt.contains(&head), "{prompt}");
            if brave {
                let rendered = format!("{PYTHON_TAG}brave_search.call(query=\"{query}\")");
                let turn = format!(
                    "<|start_header_id|>assistant<|end_header_id|>\n\n{rendered}<|eom_id|>"
                );
                assert!(prompt.contains(&turn), "{prompt}");
                // (read back where the model may call any tool: under a named choice of
                // another, the grammar took it as that tool's raw code)
                let any = req(r.tools.clone(), ToolChoice::Auto, false);
                let back = format.parse(&rendered, Some(&any));
                assert_call(
                    &back.tool_calls[0],
                    "brave_search",
                    &json!({"query": query}),
                    None,
                );
            }
            // a request's own `builtin_tools` wins
            let mut own = chat.clone();
            own.kwargs
                .insert("builtin_tools".into(), json!(["wolfram_alpha"]));
            own.add_variable("builtin_tools", json!(names));
            let prompt = t.render_request(&own).unwrap();
            assert!(prompt.contains("Tools: wolfram_alpha\n\n"), "{prompt}");
        }
        // no built-ins offered, or Llama 3.2's template: no `builtin_tools`
        assert!(L31.template_variables(&f_req(false)).is_empty());
        if let Some(src) = template("meta-llama-Llama-3.2-3B-Instruct.jinja") {
            let r = builtin_req(&mut rng, 0);
            assert!(Format::detect(Some(&src)).template_variables(&r).is_empty());
        }
    }

    /// Random outputs after `<|python_tag|>` (call forms, raw code, JSON calls, whitespace of
    /// every kind, slipped at random) for random requests with built-ins: whatever the grammar
    /// takes, `parse` reads as one call of a tool the choice allows, with no content, and
    /// streaming never takes back what it sent.
    #[test]
    fn llama3_builtin_grammar_and_parse_agree() {
        let ws = [
            " ", "\n", "\u{a0}", "\u{3000}", "\u{b}", "\u{c}", "\u{85}", "\u{2028}",
        ];
        let mut rng = Rng(0x11A3_0B05);
        let (mut taken, mut taken_json) = (0usize, 0usize);
        for round in 0..300 {
            let r = builtin_req(&mut rng, round);
            let g = grammar(&L31.plan(&r).unwrap().unwrap());
            let names: Vec<&str> = r.tools.iter().map(|t| t.name.as_str()).collect();
            let mut frags: Vec<String> = ws.iter().map(|w| w.to_string()).collect();
            frags.extend(names.iter().map(|n| n.to_string()));
            frags.extend(
                [
                    ".call(", "query=", "code=", ")", ", ", "=", "{", "}", "\"", "x",
                ]
                .map(String::from),
            );
            let frags: Vec<&str> = frags.iter().map(String::as_str).collect();
            for _ in 0..30 {
                let t = &r.tools[rng.below(r.tools.len())];
                let value = Value::from(random_text(&mut rng, 8)).to_string();
                let body = match rng.below(5) {
                    0 => format!("{}.call({}={value})", t.name, builtin_key(t).unwrap_or("x")),
                    1 => random_code(&mut rng),
                    2 => (0..1 + rng.below(3))
                        .map(|_| ws[rng.below(ws.len())])
                        .collect(),
                    3 => {
                        let a = random_args(&mut rng, &t.parameters);
                        call_text(&t.name, &a, rng.below(4), rng.coin())
                    }
                    _ => format!("{}{}", ws[rng.below(ws.len())], random_code(&mut rng)),
                };
                let mut text = format!("{PYTHON_TAG}{body}");
                if rng.below(3) == 0 {
                    mutate(&mut rng, &mut text, &frags, 4);
                }
                check_partial_prefixes(L31, &text, Some(&r));
                if !g.accepts_str(&text) {
                    continue;
                }
                let p = L31.parse(&text, Some(&r));
                assert_eq!(p.content, "", "{:?} {text:?}", r.choice);
                assert_eq!(p.tool_calls.len(), 1, "{:?} {text:?}", r.choice);
                let name = &p.tool_calls[0].name;
                assert!(
                    allowed(&r).iter().any(|t| t.name == *name),
                    "{:?} {text:?}: {name}",
                    r.choice
                );
                // the answer: one call of an allowed tool (where the text began a JSON call
                // that broke, the call streamed, as for any call begun)
                let fin = L31.parse_final(&text, Some(&r));
                assert_eq!(fin.content, "", "{text:?}");
                assert_eq!(fin.tool_calls.len(), 1, "{text:?}");
                assert!(allowed(&r).iter().any(|t| t.name == fin.tool_calls[0].name));
                taken += 1;
                taken_json += usize::from(text[PYTHON_TAG.len()..].starts_with('{'));
            }
        }
        assert!(taken > 1000 && taken_json > 100, "{taken} {taken_json}");
    }

    /// Llama 3.1 writes `<|python_tag|>` before a JSON call where its system prompt says
    /// "Environment: ipython" (as its template's does wherever there are tools): random calls
    /// of random tools so written, with built-ins offered or not, are taken by the grammar
    /// (lazily from the tag) and read as that call, the text before the tag content, and
    /// streamed.
    #[test]
    fn llama3_json_call_after_python_tag() {
        let mut rng = Rng(0x11A3_0B06);
        for round in 0..90 {
            let r = if round % 3 == 2 {
                random_req(&mut rng, round, false)
            } else {
                builtin_req(&mut rng, round)
            };
            let p = L31.plan(&r).unwrap().unwrap();
            let g = grammar(&p);
            let allowed = allowed(&r);
            let t = allowed[rng.below(allowed.len())];
            let a = random_args(&mut rng, &t.parameters);
            let json_call = call_text(&t.name, &a, rng.below(4), rng.coin());
            let text = format!("{PYTHON_TAG}{json_call}");
            assert!(g.accepts_str(&text), "{text}\n{}", p.gbnf);
            if p.lazy {
                assert!(p.triggers.contains(&Trigger::Word(PYTHON_TAG.to_string())));
            }
            // Llama 3.2's template (no tag) takes none of it
            assert!(!grammar(&L3.plan(&r).unwrap().unwrap()).accepts_str(&text));
            // after the tag, and without it after text (as llama.cpp reads it)
            let replies = ["", "Let me check.\n"]
                .map(|before| (before, format!("{before}{text}\n")))
                .into_iter()
                .chain(["Sure } ", "Let me check.\n"].map(|b| (b, format!("{b}{json_call}\n"))));
            for (before, reply) in replies {
                let parsed = L31.parse(&reply, Some(&r));
                assert_eq!(parsed.content, before.trim_end(), "{reply}");
                assert_eq!(parsed.tool_calls.len(), 1, "{reply}");
                assert_call(&parsed.tool_calls[0], &t.name, &a, None);
                check_stream_calls(L31, &reply, &r);
            }
        }
    }
}
