//! MiniMax M3's calls: namespaced XML whose argument values are nested XML, driven by the
//! tool's JSON schema (llama.cpp's `common/parsers/minimax-m3.cpp`, `peg-minimax-m3`).
//!
//! Every tag starts with the namespace token `]<]minimax[>[` (`NS`). All the calls of a reply
//! are in one block after its text, and nothing follows the block:
//!
//! `NS<tool_call>\n` (`NS<invoke name="NAME">` parameters `NS</invoke>\n`)* `NS</tool_call>`
//!
//! A parameter is `NS<K>` value `NS</K>`, its value by the schema of `K` as the template's
//! `to_xml` macro writes it: an object (with `properties`) as its members, nested elements of
//! the same form; an array as its items, each `NS<item>` value `NS</item>`; a value whose
//! schema may be a string as raw text; any other value as JSON (numbers, booleans, null, and
//! what the schema leaves open: an object without `properties`, items without a schema, a
//! `$ref`, `allOf`, a tuple). An `anyOf` / `oneOf` whose branches are all JSON is JSON; else
//! its branches are tried in order. A schema may be a string where it says `string`, a
//! string `const` or `enum` member, or a string-only keyword (`pattern`, `minLength`, ...), in
//! a branch, a `$ref`'s target or every constrained `allOf` member: llama.cpp's reading, which
//! takes such a value as its text whatever it spells (`12` is "12"). (Where the schema
//! leaves a value open, the template's `to_xml` would still nest a mapping or a list, but
//! llama.cpp's reader takes only JSON there, and so do the grammar and the reading here.)
//!
//! # Plan (grammar)
//!
//! `Auto`: lazy from `NS<tool_call>`; `Required` / `Function(N)`: the whole output. The block
//! exactly as the template writes it (a newline after its opening tag and after each call, no
//! whitespace elsewhere, one call or with `parallel` one or more); an object's required
//! members first, in the schema's order, then the optional ones (llama.cpp's reader takes the
//! required ones first), no others; an array's items within `minItems` / `maxItems`; raw text
//! never holds `NS` (so it never holds its closing tag), an `enum` / `const` one of its string
//! members (one of another type would read back a string), a string with lengths that many
//! characters but `<`; JSON per the schema
//! (muser-jsonschema). What the XML cannot carry (a raw string's `pattern`, an array's
//! `uniqueItems`, an object's `minProperties`, a member name with `<`, `>` or `/`) is refused.
//!
//! # Parse
//!
//! A block is read where it follows the layout (any whitespace between tags and around a JSON
//! value, members in any order, a repeated member keeping its first value: more than
//! llama.cpp's reader takes, which refuses whitespace around JSON and passes a repeated
//! member's values on) and every call names a tool offered with
//! members its schema declares; values are read by the schema as above (raw text up to the
//! first closing tag of its element; JSON, then the closing tag). Else the opening tag stays
//! in the content and the text after it is read on.
//!
//! Streaming sends the calls as they are written: each once its name is whole, its arguments
//! growing by whole parameters (a nested value once its element is closed), a raw text
//! parameter's characters as they come, and `}` at the call's end.

use serde_json::{Map, Value};

use super::partial::{self, Json};
use super::xml_args::{child_ptr, raw_string_rule, tail_len, text_without, ws_len, ANNOTATIONS};
use super::xml_calls::starts;
use super::{
    allowed_tools, parse_blocks, parse_blocks_partial, BlockStep, Blocks, LazyStart, Parsed, Plan,
    ToolCall, ToolRequest,
};
use muser_jsonschema::gbnf_literal as literal;

/// The namespace token every tag of the format starts with.
const NS: &str = "]<]minimax[>[";
/// The block's opening and closing tags.
const OPEN: &str = "]<]minimax[>[<tool_call>";
const CLOSE: &str = "]<]minimax[>[</tool_call>";
/// A call's opening (before its name) and closing tags.
const INVOKE: &str = "]<]minimax[>[<invoke name=\"";
const INVOKE_END: &str = "]<]minimax[>[</invoke>";
/// The start of an element's opening tag.
const ELEMENT: &str = "]<]minimax[>[<";
/// An array item's tags.
const ITEM: &str = "]<]minimax[>[<item>";
const ITEM_END: &str = "]<]minimax[>[</item>";

pub(super) const LAZY_START: LazyStart = LazyStart::Word(OPEN);

/// What llama.cpp preserves for the template: the namespace token, the block's tags and the
/// reasoning tags.
pub(super) const MARKUP: &[&str] = &[
    NS,
    "<tool_call>",
    "</tool_call>",
    "<mm:think>",
    "</mm:think>",
];

/// llama.cpp's test for MiniMax M3's template: the namespace token and the call tags.
pub(super) fn detect(t: &str) -> bool {
    t.contains(NS) && t.contains("<tool_call>") && t.contains("<invoke name=")
}

// ---------------------------------------------------------------------------------------------
// The values' shapes, by schema

/// How a value is written, from its schema (at `ptr` in the tool's parameters).
#[derive(Debug)]
enum Node {
    /// Raw text: the schema may be a string.
    Text(String),
    /// JSON of the schema at the pointer; None: any JSON (items without a schema).
    Json(Option<String>),
    /// The members, nested elements, in the grammar's order (the required ones first).
    Object(String, Vec<Member>),
    /// The items, nested `item` elements (the array's schema at the pointer).
    Array(String, Box<Node>),
    /// The first of the branches that reads.
    Choice(Vec<Node>),
}

#[derive(Debug)]
struct Member {
    name: String,
    required: bool,
    node: Node,
}

/// Deeper `$ref` chains and nesting are not followed.
const MAX_DEPTH: usize = 32;

/// The schema at `ptr` (`#` or `#/...`) in `doc`.
fn at<'d>(doc: &'d Value, ptr: &str) -> Option<&'d Value> {
    doc.pointer(ptr.strip_prefix('#')?)
}

/// Whether a schema declares an object's members (llama.cpp's test for an object schema).
fn has_properties(o: &Map<String, Value>) -> bool {
    o.contains_key("properties")
        || o.get("additionalProperties")
            .is_some_and(|a| a != &Value::Bool(true))
}

/// Keywords that make a schema other than "anything" (llama.cpp's any schema has none).
const SHAPING: &[&str] = &[
    "$ref",
    "anyOf",
    "oneOf",
    "allOf",
    "type",
    "const",
    "enum",
    "properties",
    "additionalProperties",
    "items",
    "prefixItems",
    "pattern",
    "minLength",
    "maxLength",
    "format",
];

/// Whether a value of `schema` may be a string (then it is written raw), as llama.cpp decides.
fn may_be_string(doc: &Value, schema: &Value, depth: usize) -> bool {
    let Some(o) = schema.as_object() else {
        return false;
    };
    if depth > MAX_DEPTH {
        return false;
    }
    let deeper = |s: &Value| may_be_string(doc, s, depth + 1);
    if let Some(r) = o.get("$ref") {
        return r.as_str().and_then(|r| at(doc, r)).is_some_and(deeper);
    }
    if let Some(Value::Array(alts)) = o.get("oneOf").or_else(|| o.get("anyOf")) {
        return alts.iter().any(deeper);
    }
    let all_of = || {
        let Some(Value::Array(all)) = o.get("allOf") else {
            return false;
        };
        let constrained: Vec<&Value> = all
            .iter()
            .filter(|s| {
                s.as_object()
                    .is_some_and(|m| m.keys().any(|k| SHAPING.contains(&k.as_str())))
            })
            .collect();
        !constrained.is_empty() && constrained.into_iter().all(deeper)
    };
    match o.get("type") {
        Some(Value::Array(types)) => types.iter().any(|t| {
            let mut alt = o.clone();
            alt.insert("type".into(), t.clone());
            deeper(&Value::Object(alt))
        }),
        _ if o.contains_key("const") => o["const"].is_string(),
        _ if o.contains_key("enum") => o["enum"]
            .as_array()
            .is_some_and(|e| e.iter().any(Value::is_string)),
        None if has_properties(o) => false,
        None if o.contains_key("allOf") => all_of(),
        None if o.contains_key("items") || o.contains_key("prefixItems") => false,
        None => ["pattern", "minLength", "maxLength", "format"]
            .iter()
            .any(|k| o.contains_key(*k)),
        Some(Value::String(t)) if t == "object" => !has_properties(o) && all_of(),
        Some(Value::String(t)) if t == "string" => !o.contains_key("allOf") || all_of(),
        Some(_) => false,
    }
}

/// The shape of the value of the schema at `ptr` in `doc`.
fn node(doc: &Value, ptr: String, depth: usize) -> Node {
    let schema = at(doc, &ptr).unwrap_or(&Value::Bool(true));
    let Some(o) = schema.as_object() else {
        return Node::Json(Some(ptr));
    };
    if depth > MAX_DEPTH {
        return Node::Json(Some(ptr));
    }
    if may_be_string(doc, schema, 0) {
        return Node::Text(ptr);
    }
    if o.contains_key("$ref") {
        return Node::Json(Some(ptr));
    }
    let kw = if o.contains_key("oneOf") {
        "oneOf"
    } else {
        "anyOf"
    };
    if let Some(Value::Array(alts)) = o.get(kw) {
        let alts: Vec<Node> = (0..alts.len())
            .map(|i| {
                node(
                    doc,
                    child_ptr(&child_ptr(&ptr, kw), &i.to_string()),
                    depth + 1,
                )
            })
            .collect();
        return if alts.iter().all(|a| matches!(a, Node::Json(_))) {
            Node::Json(Some(ptr))
        } else {
            Node::Choice(alts)
        };
    }
    if o.contains_key("const") || o.contains_key("enum") {
        return Node::Json(Some(ptr));
    }
    match o.get("type") {
        None if has_properties(o) => object(doc, ptr, o, depth),
        None if o.contains_key("allOf") => Node::Json(Some(ptr)),
        None if o.contains_key("items") || o.contains_key("prefixItems") => {
            array(doc, ptr, o, depth)
        }
        Some(Value::String(t)) if t == "object" => {
            if !has_properties(o) && o.contains_key("allOf") {
                Node::Json(Some(ptr))
            } else {
                object(doc, ptr, o, depth)
            }
        }
        Some(Value::String(t)) if t == "array" => array(doc, ptr, o, depth),
        _ => Node::Json(Some(ptr)),
    }
}

/// An object's shape: its members (the required ones first), or JSON where it declares none.
fn object(doc: &Value, ptr: String, o: &Map<String, Value>, depth: usize) -> Node {
    match o.get("properties") {
        Some(Value::Object(p)) if !p.is_empty() => {
            let members = members_of(doc, &ptr, o, depth);
            Node::Object(ptr, members)
        }
        _ => Node::Json(Some(ptr)),
    }
}

/// The members of an object schema `o` (at `ptr`): the required ones first, each kind in the
/// schema's order.
fn members_of(doc: &Value, ptr: &str, o: &Map<String, Value>, depth: usize) -> Vec<Member> {
    let required = |k: &str| {
        o.get("required")
            .and_then(Value::as_array)
            .is_some_and(|r| r.iter().any(|x| x == k))
    };
    let Some(Value::Object(props)) = o.get("properties") else {
        return Vec::new();
    };
    let props_ptr = child_ptr(ptr, "properties");
    let mut members: Vec<Member> = props
        .keys()
        .map(|k| Member {
            name: k.clone(),
            required: required(k),
            node: node(doc, child_ptr(&props_ptr, k), depth + 1),
        })
        .collect();
    // (a stable sort: each kind keeps the schema's order)
    members.sort_by_key(|m| !m.required);
    members
}

/// An array's shape: its items by their schema (any JSON without one); a tuple is JSON.
fn array(doc: &Value, ptr: String, o: &Map<String, Value>, depth: usize) -> Node {
    let key = if o.contains_key("items") {
        "items"
    } else {
        "prefixItems"
    };
    let item = match o.get(key) {
        None => Node::Json(None),
        Some(Value::Array(_)) => return Node::Json(Some(ptr)),
        Some(_) => node(doc, child_ptr(&ptr, key), depth + 1),
    };
    Node::Array(ptr, Box::new(item))
}

/// The members of a tool's arguments.
fn tool_members(params: &Value) -> Vec<Member> {
    match params.as_object() {
        Some(o) => members_of(params, "#", o, 0),
        None => Vec::new(),
    }
}

// ---------------------------------------------------------------------------------------------
// Plan

/// The grammar's rules for one plan.
struct Rules<'d> {
    doc: &'d Value,
    /// Which tool (for the rules' names).
    tool: usize,
    rules: String,
    /// Rules made so far (for the names).
    n: usize,
    /// Whether any text without `NS` is used (`mm3-str`).
    text: bool,
}

impl Rules<'_> {
    fn fresh(&mut self, kind: &str) -> String {
        self.n += 1;
        format!("mm3-{kind}{}-{}", self.tool, self.n)
    }

    /// Checks that a schema (at `ptr`) has no keyword but `allowed` and the annotations: the
    /// others the XML cannot carry.
    fn only(&self, ptr: &str, what: &str, allowed: &[&str]) -> Result<(), String> {
        let Some(Value::Object(o)) = at(self.doc, ptr) else {
            return Ok(());
        };
        match o
            .keys()
            .find(|k| !allowed.contains(&k.as_str()) && !ANNOTATIONS.contains(&k.as_str()))
        {
            Some(k) => Err(format!(
                "`{ptr}`: the MiniMax M3 format writes {what} as nested XML, which cannot carry \
                 its `{k}`"
            )),
            None => Ok(()),
        }
    }

    /// The members of an object, each an element, the optional ones optional.
    fn members(&mut self, ms: &[Member]) -> Result<String, String> {
        let mut seq = Vec::new();
        for m in ms {
            if m.name.is_empty()
                || m.name.starts_with('/')
                || m.name.contains(['<', '>', '\n', '\r'])
            {
                return Err(format!(
                    "the MiniMax M3 format cannot carry the member name {:?} (in a tag)",
                    m.name
                ));
            }
            let v = self.value(&m.node)?;
            let el = format!(
                "{} {v} {}",
                literal(&format!("{ELEMENT}{}>", m.name)),
                literal(&format!("{NS}</{}>", m.name))
            );
            seq.push(if m.required {
                format!("( {el} )")
            } else {
                format!("( {el} )?")
            });
        }
        Ok(seq.join(" "))
    }

    /// The grammar of a value (an expression).
    fn value(&mut self, node: &Node) -> Result<String, String> {
        match node {
            Node::Text(ptr) => self.text(ptr),
            Node::Json(ptr) => {
                let prefix = format!("{}-", self.fresh("j"));
                let any = Value::Object(Map::new());
                let (doc, ptr) = match ptr {
                    Some(p) => (self.doc, p.as_str()),
                    None => (&any, "#"),
                };
                let (top, rules) = muser_jsonschema::subschema_to_gbnf_rules(doc, ptr, &prefix)
                    .map_err(|e| format!("`{ptr}`: {e}"))?;
                self.rules.push_str(&rules);
                Ok(top)
            }
            Node::Object(ptr, ms) => {
                self.only(
                    ptr,
                    "an object",
                    &["type", "properties", "required", "additionalProperties"],
                )?;
                if let Some(Value::Array(req)) = at(self.doc, ptr).and_then(|s| s.get("required")) {
                    if let Some(r) = req
                        .iter()
                        .find(|r| !ms.iter().any(|m| r.as_str() == Some(m.name.as_str())))
                    {
                        return Err(format!(
                            "`{ptr}`: required member {r} is not in `properties`"
                        ));
                    }
                }
                let body = self.members(ms)?;
                let rule = self.fresh("o");
                self.rules.push_str(&format!("{rule} ::= {body}\n"));
                Ok(rule)
            }
            Node::Array(ptr, item) => {
                self.only(ptr, "an array", &["type", "items", "minItems", "maxItems"])?;
                let schema = at(self.doc, ptr);
                let count = |k: &str| -> Result<Option<u64>, String> {
                    match schema.and_then(|s| s.get(k)) {
                        None => Ok(None),
                        Some(v) => match v.as_u64() {
                            Some(n) if n <= 1000 => Ok(Some(n)),
                            _ => Err(format!("`{ptr}`: `{k}` must be a count up to 1000")),
                        },
                    }
                };
                let min = count("minItems")?.unwrap_or(0);
                let reps = match count("maxItems")? {
                    Some(max) if max < min => {
                        return Err(format!("`{ptr}`: `maxItems` is below `minItems`"))
                    }
                    Some(max) => format!("{{{min},{max}}}"),
                    None => format!("{{{min},}}"),
                };
                let v = self.value(item)?;
                let rule = self.fresh("a");
                self.rules.push_str(&format!(
                    "{rule} ::= {} {v} {}\n",
                    literal(ITEM),
                    literal(ITEM_END)
                ));
                Ok(format!("{rule}{reps}"))
            }
            Node::Choice(alts) => {
                let alts = alts
                    .iter()
                    .map(|a| self.value(a))
                    .collect::<Result<Vec<_>, _>>()?;
                Ok(format!("( {} )", alts.join(" | ")))
            }
        }
    }

    /// Raw text for a schema that may be a string: one of a string `enum` / `const`'s members,
    /// else as `xml_args` writes raw strings (any text without `NS` where nothing more is
    /// constrained).
    fn text(&mut self, ptr: &str) -> Result<String, String> {
        let schema = at(self.doc, ptr).unwrap_or(&Value::Null);
        let members: Option<Vec<&Value>> = match (schema.get("const"), schema.get("enum")) {
            (Some(c), _) => Some(vec![c]),
            (None, Some(Value::Array(e))) => Some(e.iter().collect()),
            _ => None,
        };
        let leaf = ["$ref", "anyOf", "oneOf"]
            .iter()
            .all(|k| schema.get(k).is_none());
        if let Some(members) = members.filter(|_| leaf) {
            // (read as text, a member of another type would come back a string)
            let ok: Vec<String> = members
                .iter()
                .filter_map(|m| m.as_str())
                .filter(|m| !m.contains(NS))
                .map(literal)
                .collect();
            if ok.is_empty() {
                return Err(format!("`{ptr}`: no allowed value can be written raw"));
            }
            return Ok(format!("( {} )", ok.join(" | ")));
        }
        match raw_string_rule(schema, self.doc, "MiniMax M3")
            .map_err(|e| format!("`{ptr}`: {e}"))?
        {
            Some(rule) => Ok(rule),
            None => {
                self.text = true;
                Ok("mm3-str".into())
            }
        }
    }
}

pub(super) fn plan(req: &ToolRequest) -> Result<Option<Plan>, String> {
    let Some(tools) = allowed_tools(req)? else {
        return Ok(None);
    };
    let mut rules = String::new();
    let mut text = false;
    let mut alts = Vec::new();
    for (i, tool) in tools.iter().enumerate() {
        // (validates the arguments' schema: an object with `properties`)
        super::xml_args::object_schema(tool)?;
        let name = &tool.name;
        let mut r = Rules {
            doc: &tool.parameters,
            tool: i,
            rules: String::new(),
            n: 0,
            text: false,
        };
        let body = r
            .members(&tool_members(&tool.parameters))
            .map_err(|e| format!("tool `{name}`: {e}"))?;
        rules.push_str(&r.rules);
        text |= r.text;
        rules.push_str(&format!(
            "mm3-t{i} ::= {} {body} {}\n",
            literal(&format!("{INVOKE}{name}\">")),
            literal(INVOKE_END)
        ));
        alts.push(format!("mm3-t{i}"));
    }
    let call = format!("( {} ) \"\\n\"", alts.join(" | "));
    let calls = if req.parallel {
        format!("( {call} )+")
    } else {
        call
    };
    let mut gbnf = format!(
        "root ::= {} {calls} {}\n",
        literal(&format!("{OPEN}\n")),
        literal(CLOSE)
    );
    if text {
        gbnf.push_str(&text_without("mm3-str", &[NS]));
    }
    gbnf.push_str(&rules);
    Ok(Some(Plan::calls(gbnf, &req.choice, LAZY_START)))
}

// ---------------------------------------------------------------------------------------------
// Reading

/// What reading a piece of text found.
enum Got<T> {
    /// A whole piece and the length of the text it spans.
    Done(T, usize),
    /// The text ends before the piece does, and may still go on into one.
    More,
    /// No text that starts so is the piece.
    Bad,
}

/// A member of an object being read: its name, and where its value starts.
type OpenMember<'m> = Option<(&'m Member, usize)>;

/// Reads the members of an object from `s` up to `close` (whitespace before each member and
/// before `close`) into `out`, a repeated member keeping its first value; the length read
/// through `close`. Where the text ends inside a member's value, `open` is that member and
/// where its value starts.
fn members<'m>(
    s: &str,
    ms: &'m [Member],
    close: &str,
    out: &mut Map<String, Value>,
    open: &mut OpenMember<'m>,
) -> Got<()> {
    let mut p = 0;
    loop {
        p += ws_len(&s[p..]);
        let t = &s[p..];
        match starts(t, close) {
            Some(true) => return Got::Done((), p + close.len()),
            None => return Got::More,
            Some(false) => {}
        }
        let Some(after) = t.strip_prefix(ELEMENT) else {
            return if ELEMENT.starts_with(t) {
                Got::More
            } else {
                Got::Bad
            };
        };
        let Some(end) = after.find('>') else {
            return if after.contains(['<', '\n', '\r']) {
                Got::Bad
            } else {
                Got::More
            };
        };
        let Some(m) = ms.iter().find(|m| m.name == after[..end]) else {
            return Got::Bad;
        };
        let start = p + ELEMENT.len() + end + 1;
        match value(&s[start..], &m.node, &format!("{NS}</{}>", m.name)) {
            Got::Done(v, n) => {
                out.entry(m.name.clone()).or_insert(v);
                p = start + n;
            }
            Got::More => {
                *open = Some((m, start));
                return Got::More;
            }
            Got::Bad => return Got::Bad,
        }
    }
}

/// Reads a value of shape `node` from `s`, through its element's closing tag `close`.
fn value(s: &str, node: &Node, close: &str) -> Got<Value> {
    match node {
        Node::Text(_) => match s.find(close) {
            Some(i) => Got::Done(Value::String(s[..i].to_string()), i + close.len()),
            None => Got::More,
        },
        Node::Json(_) => {
            let r = partial::read(s);
            match r.json {
                Json::Whole(v, end) => {
                    let w = end + ws_len(&s[end..]);
                    match starts(&s[w..], close) {
                        Some(true) => Got::Done(v, w + close.len()),
                        None => Got::More,
                        Some(false) => Got::Bad,
                    }
                }
                Json::Open(_) if r.broken => Got::Bad,
                Json::Open(_) => Got::More,
            }
        }
        Node::Object(_, ms) => {
            let mut out = Map::new();
            match members(s, ms, close, &mut out, &mut None) {
                Got::Done((), n) => Got::Done(Value::Object(out), n),
                Got::More => Got::More,
                Got::Bad => Got::Bad,
            }
        }
        Node::Array(_, item) => {
            let mut items = Vec::new();
            let mut p = 0;
            loop {
                p += ws_len(&s[p..]);
                let t = &s[p..];
                match starts(t, close) {
                    Some(true) => return Got::Done(Value::Array(items), p + close.len()),
                    None => return Got::More,
                    Some(false) => {}
                }
                match starts(t, ITEM) {
                    Some(true) => {}
                    None => return Got::More,
                    Some(false) => return Got::Bad,
                }
                match value(&t[ITEM.len()..], item, ITEM_END) {
                    Got::Done(v, n) => {
                        items.push(v);
                        p += ITEM.len() + n;
                    }
                    Got::More => return Got::More,
                    Got::Bad => return Got::Bad,
                }
            }
        }
        Node::Choice(alts) => {
            // the first branch that reads; one that may still read decides nothing yet
            for a in alts {
                match value(s, a, close) {
                    Got::Bad => continue,
                    got => return got,
                }
            }
            Got::Bad
        }
    }
}

/// The arguments read so far of a call (`done` members), as compact JSON: whole with `}` once
/// the call is closed (`closed`), else without it, and with the start of an open member's raw
/// text, if any (`open`: its name and its characters so far).
fn arguments_text(done: &Map<String, Value>, closed: bool, open: Option<(&str, &str)>) -> String {
    let mut s = Value::Object(done.clone()).to_string();
    if closed {
        return s;
    }
    s.pop();
    if let Some((k, known)) = open.filter(|(k, _)| !done.contains_key(*k)) {
        if !done.is_empty() {
            s.push(',');
        }
        s.push_str(&Value::from(k).to_string());
        s.push(':');
        let v = Value::from(known).to_string();
        s.push_str(&v[..v.len() - 1]);
    }
    s
}

/// Reads the call block whose opening tag ends right before `rest`: whole (the length of
/// `rest` it spans through its closing tag), unfinished or broken, with the calls begun (an
/// unfinished call's arguments as far as they are known, `arguments_text`).
fn read_block(rest: &str, req: Option<&ToolRequest>) -> (Got<()>, Vec<ToolCall>) {
    let mut calls = Vec::new();
    let mut p = 0;
    loop {
        p += ws_len(&rest[p..]);
        match starts(&rest[p..], INVOKE) {
            Some(true) => p += INVOKE.len(),
            None => return (Got::More, calls),
            Some(false) => return (Got::Bad, calls),
        }
        let Some(end) = rest[p..].find("\">") else {
            let more = !rest[p..].contains(['"', '\n', '\r']);
            return (if more { Got::More } else { Got::Bad }, calls);
        };
        let name = &rest[p..p + end];
        let Some(tool) = req.and_then(|r| r.tools.iter().find(|t| t.name == name)) else {
            return (Got::Bad, calls);
        };
        p += end + 2;
        let ms = tool_members(&tool.parameters);
        let mut done = Map::new();
        let mut open = None;
        let got = members(&rest[p..], &ms, INVOKE_END, &mut done, &mut open);
        let call = |arguments| ToolCall {
            id: None,
            name: name.to_string(),
            arguments,
        };
        match got {
            Got::Done((), n) => {
                calls.push(call(arguments_text(&done, true, None)));
                p += n;
            }
            Got::More => {
                // a raw text member's characters so far (up to a tail that may be its
                // closing tag)
                let known = open.and_then(|(m, start)| match m.node {
                    Node::Text(_) => {
                        let v = &rest[p + start..];
                        let close = format!("{NS}</{}>", m.name);
                        Some((m.name.as_str(), &v[..v.len() - tail_len(v, &close)]))
                    }
                    _ => None,
                });
                calls.push(call(arguments_text(&done, false, known)));
                return (Got::More, calls);
            }
            Got::Bad => {
                calls.push(call(arguments_text(&done, false, None)));
                return (Got::Bad, calls);
            }
        }
        p += ws_len(&rest[p..]);
        let t = &rest[p..];
        if t.starts_with(INVOKE) {
            continue;
        }
        return match starts(t, CLOSE) {
            Some(true) => (Got::Done((), p + CLOSE.len()), calls),
            None => (Got::More, calls),
            Some(false) if INVOKE.starts_with(t) => (Got::More, calls),
            Some(false) => (Got::Bad, calls),
        };
    }
}

/// Content is the text with the call blocks taken out, its trailing whitespace trimmed;
/// malformed blocks, and blocks calling a tool the request does not offer, stay in it.
pub(super) fn parse(text: &str, req: Option<&ToolRequest>) -> Parsed {
    parse_blocks(text, req, &[OPEN], |after| match read_block(after, req) {
        (Got::Done((), used), calls) => Some((calls, used)),
        _ => None,
    })
}

/// The content up to the first block's opening tag, less a tail that may start one, less
/// trailing whitespace; the calls begun (`read_block`).
pub(super) fn parse_partial(text: &str, req: Option<&ToolRequest>, from: &mut Blocks) -> Parsed {
    parse_blocks_partial(
        text,
        req,
        &[OPEN],
        |rest, _| match read_block(rest, req) {
            (Got::Done((), used), calls) => BlockStep::Whole(calls, used),
            (Got::More, calls) => BlockStep::Open(calls),
            (Got::Bad, calls) => BlockStep::Broken(calls),
        },
        from,
    )
}

/// A value as the template's `to_xml` writes it (a string raw, a boolean and a number as
/// JSON), for the tests.
#[cfg(test)]
pub(super) fn to_xml(v: &Value) -> String {
    match v {
        Value::Object(o) => o
            .iter()
            .filter(|(_, x)| !x.is_null())
            .map(|(k, x)| format!("{NS}<{k}>{}{NS}</{k}>", to_xml(x)))
            .collect(),
        Value::Array(a) => a
            .iter()
            .map(|x| format!("{ITEM}{}{ITEM_END}", to_xml(x)))
            .collect(),
        Value::String(s) => s.clone(),
        Value::Null => String::new(),
        other => other.to_string(),
    }
}

/// One call as the template writes it, for the tests.
#[cfg(test)]
pub(super) fn render_call(name: &str, args: &Value) -> String {
    format!("{INVOKE}{name}\">{}{INVOKE_END}", to_xml(args))
}

#[cfg(test)]
/// A value as the template writes it by its schema's shape `node` (JSON where the shape
/// is JSON, unlike `to_xml`; the branch of a choice by the value's type).
fn write(node: &Node, v: &Value) -> String {
    match (node, v) {
        (Node::Text(_), Value::String(s)) => s.clone(),
        (Node::Object(_, ms), Value::Object(o)) => ms
            .iter()
            .filter_map(|m| {
                let x = o.get(&m.name)?;
                Some(format!(
                    "{NS}<{}>{}{NS}</{}>",
                    m.name,
                    write(&m.node, x),
                    m.name
                ))
            })
            .collect(),
        (Node::Array(_, item), Value::Array(a)) => a
            .iter()
            .map(|x| format!("{ITEM}{}{ITEM_END}", write(item, x)))
            .collect(),
        (Node::Choice(alts), v) => {
            let fits = |a: &&Node| match a {
                Node::Object(..) => v.is_object(),
                Node::Array(..) => v.is_array(),
                Node::Text(_) => v.is_string(),
                Node::Json(_) => !v.is_object() && !v.is_array(),
                Node::Choice(_) => false,
            };
            write(alts.iter().find(fits).unwrap(), v)
        }
        (_, v) => v.to_string(),
    }
}

/// A call of `t` as the template writes it, its values by their schemas' shapes (`write`),
/// for the tests.
#[cfg(test)]
pub(super) fn render_tool_call(t: &super::Tool, args: &Value) -> String {
    let root = Node::Object("#".into(), tool_members(&t.parameters));
    format!("{INVOKE}{}\">{}{INVOKE_END}", t.name, write(&root, args))
}

/// Calls (`render_call`'s, `render_tool_call`'s) in a block as the template writes it, for the tests.
#[cfg(test)]
pub(super) fn render_block(calls: &[String]) -> String {
    let mut s = format!("{OPEN}\n");
    for c in calls {
        s.push_str(c);
        s.push('\n');
    }
    s + CLOSE
}

#[cfg(test)]
mod tests {
    use super::super::test_util::*;
    use super::super::{Format, Tool, ToolChoice, Trigger};
    use super::*;
    use serde_json::json;

    const F: Format = Format::MiniMaxM3;

    /// A random schema: a string, an integer, a number, a boolean, a string enum, a string or
    /// an integer, an object without properties (JSON), and, shallow enough, an array, an
    /// object with members, or an object or array that may be null.
    fn random_schema(rng: &mut Rng, depth: usize) -> Value {
        match rng.below(if depth < 3 { 11 } else { 7 }) {
            0 => json!({"type": "string", "description": "text"}),
            1 => json!({"type": "integer"}),
            2 => json!({"type": "number"}),
            3 => json!({"type": "boolean"}),
            4 => {
                let members = ["a b", "12", "<x>", "é"];
                json!({"enum": members[..1 + rng.below(4)].to_vec()})
            }
            5 => json!({"anyOf": [{"type": "integer"}, {"type": "string"}]}),
            6 => json!({"type": "object"}),
            7 => {
                let mut a = json!({"type": "array", "items": random_schema(rng, depth + 1)});
                if rng.coin() {
                    a["minItems"] = json!(1);
                    a["maxItems"] = json!(3);
                }
                a
            }
            8 => json!({"anyOf": [random_object(rng, depth + 1), {"type": "null"}]}),
            9 => json!({"anyOf": [
                {"type": "array", "items": {"type": "integer"}}, {"type": "boolean"}]}),
            _ => random_object(rng, depth + 1),
        }
    }

    fn random_object(rng: &mut Rng, depth: usize) -> Value {
        let mut props = Map::new();
        let mut required = Vec::new();
        for i in 0..1 + rng.below(4) {
            let k = format!("{}{i}", ["k", "city", "item", "a_b", "x-y"][rng.below(5)]);
            if rng.coin() {
                required.push(k.clone());
            }
            props.insert(k, random_schema(rng, depth));
        }
        json!({"type": "object", "properties": props, "required": required})
    }

    fn random_tools(rng: &mut Rng) -> Vec<Tool> {
        (0..1 + rng.below(3))
            .map(|i| tool(&format!("tool_{i}.x"), random_object(rng, 0)))
            .collect()
    }

    fn random_string(rng: &mut Rng) -> String {
        const PIECES: &[&str] = &[
            "a", "Z", " ", "\"", "\\", "\n", "é", "😀", "{", "}", "<", "/", "0", "]", "[", ">",
            "<a>",
        ];
        (0..rng.below(8))
            .map(|_| PIECES[rng.below(PIECES.len())])
            .collect()
    }

    /// A random JSON value of any type (small).
    fn random_json(rng: &mut Rng, depth: usize) -> Value {
        match rng.below(if depth < 2 { 6 } else { 4 }) {
            0 => json!(rng.below(1000) as i64 - 500),
            1 => Value::from(random_string(rng)),
            2 => json!(rng.coin()),
            3 => json!(null),
            4 => Value::Array(
                (0..rng.below(3))
                    .map(|_| random_json(rng, depth + 1))
                    .collect(),
            ),
            _ => {
                let mut o = Map::new();
                for i in 0..rng.below(3) {
                    o.insert(format!("j{i}"), random_json(rng, depth + 1));
                }
                Value::Object(o)
            }
        }
    }

    /// A random value of the shape `node` (of the schemas `random_schema` makes), its members
    /// in the grammar's order.
    fn random_value(rng: &mut Rng, doc: &Value, node: &Node) -> Value {
        match node {
            Node::Text(ptr) => match at(doc, ptr).and_then(|s| s.get("enum")) {
                Some(Value::Array(e)) => e[rng.below(e.len())].clone(),
                _ => Value::from(random_string(rng)),
            },
            Node::Json(None) => random_json(rng, 0),
            Node::Json(Some(ptr)) => {
                let s = at(doc, ptr).unwrap();
                match s.get("type").and_then(Value::as_str) {
                    Some("integer") => json!(rng.below(100_000) as i64 - 50_000),
                    Some("number") => json!((rng.below(2000) as f64 - 1000.0) / 8.0),
                    Some("boolean") => json!(rng.coin()),
                    Some("null") => json!(null),
                    _ => {
                        let mut o = Map::new();
                        for i in 0..rng.below(3) {
                            o.insert(format!("o{i}"), random_json(rng, 1));
                        }
                        Value::Object(o)
                    }
                }
            }
            Node::Object(_, ms) => {
                let mut o = Map::new();
                for m in ms {
                    if m.required || rng.coin() {
                        o.insert(m.name.clone(), random_value(rng, doc, &m.node));
                    }
                }
                Value::Object(o)
            }
            Node::Array(ptr, item) => {
                let min = at(doc, ptr)
                    .and_then(|s| s["minItems"].as_u64())
                    .unwrap_or(0);
                let n = min as usize + rng.below(3);
                Value::Array((0..n).map(|_| random_value(rng, doc, item)).collect())
            }
            Node::Choice(alts) => {
                let i = rng.below(alts.len());
                random_value(rng, doc, &alts[i])
            }
        }
    }

    fn random_req(rng: &mut Rng, round: usize) -> ToolRequest {
        let tools = random_tools(rng);
        let choice = match round % 3 {
            0 => ToolChoice::Auto,
            1 => ToolChoice::Required,
            _ => ToolChoice::Function(tools[rng.below(tools.len())].name.clone()),
        };
        req(tools, choice, round % 2 == 1)
    }

    /// Random schemas with nested objects and arrays: the grammar takes the calls as the
    /// template writes them, `parse` gives the same arguments back (streaming too); a second
    /// call without `parallel`, another tool, an object written as JSON, a missing required
    /// member and text after the block are refused.
    #[test]
    fn minimax_m3_random_schemas_round_trip() {
        let mut rng = Rng(0x5EED_3303);
        let (mut nested, mut refused) = (0, 0);
        for round in 0..240 {
            let r = random_req(&mut rng, round);
            let (p, g) = checked_plan(F, &r, Trigger::Word(OPEN.into()));
            let n = if r.parallel { 1 + rng.below(3) } else { 1 };
            let calls: Vec<(&Tool, Value)> = (0..n)
                .map(|_| {
                    let a = allowed(&r);
                    let t = a[rng.below(a.len())];
                    let root = Node::Object("#".into(), tool_members(&t.parameters));
                    (t, random_value(&mut rng, &t.parameters, &root))
                })
                .collect();
            let written: Vec<String> = calls.iter().map(|(t, a)| render_tool_call(t, a)).collect();
            let text = render_block(&written);
            assert!(g.accepts_str(&text), "round {round}: {text:?}\n{}", p.gbnf);
            let parsed = F.parse(&text, Some(&r));
            assert_eq!(parsed.content, "");
            assert_eq!(parsed.tool_calls.len(), calls.len(), "{text:?}");
            for (c, (t, a)) in parsed.tool_calls.iter().zip(&calls) {
                assert_call(c, &t.name, a, None);
                nested += usize::from(a.to_string().contains(['[', ':']));
            }
            check_text_around(F, &r, &g, &text, calls.len());
            check_stream_calls(F, &text, &r);
            let (t, a) = &calls[0];
            let one = render_block(&[render_tool_call(t, a)]);
            let two = render_block(&[render_tool_call(t, a), render_tool_call(t, a)]);
            assert_eq!(g.accepts_str(&two), r.parallel);
            assert!(!g.accepts_str(&format!("{one}\n")));
            assert!(!g.accepts_str(&render_block(&[render_call("no_such", &json!({}))])));
            let other = match &r.choice {
                ToolChoice::Function(f) => r.tools.iter().find(|t| &t.name != f),
                _ => None,
            };
            if let Some(o) = other {
                let root = Node::Object("#".into(), tool_members(&o.parameters));
                let oa = random_value(&mut rng, &o.parameters, &root);
                assert!(!g.accepts_str(&render_block(&[render_tool_call(o, &oa)])));
            }
            // broken arguments: a required member left out, a nested object or array written
            // as JSON
            for (k, v) in a.as_object().unwrap() {
                let m = &t.parameters;
                let mut b = a.as_object().unwrap().clone();
                if m["required"].as_array().unwrap().contains(&json!(k)) {
                    b.shift_remove(k);
                    let bad = render_block(&[render_tool_call(t, &Value::Object(b))]);
                    assert!(!g.accepts_str(&bad), "took {bad:?}");
                    refused += 1;
                }
                // (an object without properties is JSON)
                let xml = m["properties"][k].get("properties").is_some()
                    || m["properties"][k].get("type") == Some(&json!("array"));
                if xml && v.to_string().len() > 2 {
                    let ms = tool_members(m);
                    let node = &ms.iter().find(|x| &x.name == k).unwrap().node;
                    let elem = format!("{NS}<{k}>{}{NS}</{k}>", write(node, v));
                    let bad = one.replacen(&elem, &format!("{NS}<{k}>{v}{NS}</{k}>"), 1);
                    assert!(!g.accepts_str(&bad), "took {bad:?}");
                    refused += 1;
                }
            }
        }
        assert!(nested > 100 && refused > 100, "{nested} {refused}");
    }

    /// llama.cpp's rendering of an assistant message with two calls (`/tmp/fmt/r`): a string,
    /// an integer, an integer and an array.
    const TEMPLATE_TEXT: &str = "Sure.]<]minimax[>[<tool_call>\n]<]minimax[>[<invoke name=\"get_weather\">]<]minimax[>[<city>Paris]<]minimax[>[</city>]<]minimax[>[<days>3]<]minimax[>[</days>]<]minimax[>[</invoke>\n]<]minimax[>[<invoke name=\"add\">]<]minimax[>[<a>1]<]minimax[>[</a>]<]minimax[>[<b>]<]minimax[>[<item>2]<]minimax[>[</item>]<]minimax[>[<item>x]<]minimax[>[</item>]<]minimax[>[</b>]<]minimax[>[</invoke>\n]<]minimax[>[</tool_call>";

    fn template_tools() -> Vec<Tool> {
        vec![
            tool(
                "get_weather",
                json!({"type": "object", "properties": {"city": {"type": "string"},
                    "days": {"type": "integer"}}, "required": ["city"]}),
            ),
            tool(
                "add",
                json!({"type": "object", "properties": {"a": {"type": "integer"},
                    "b": {"type": "array", "items": {"type": "string"}}}}),
            ),
        ]
    }

    #[test]
    fn minimax_m3_template_rendering_is_accepted_and_read_back() {
        let calls = &TEMPLATE_TEXT[TEMPLATE_TEXT.find(OPEN).unwrap()..];
        for choice in [ToolChoice::Auto, ToolChoice::Required] {
            let r = req(template_tools(), choice, true);
            let g = grammar(&F.plan(&r).unwrap().unwrap());
            assert!(g.accepts_str(calls), "{calls:?}");
            assert!(!g.accepts_str(TEMPLATE_TEXT));
            let p = F.parse(TEMPLATE_TEXT, Some(&r));
            check_parsed(
                &p,
                "Sure.",
                &[
                    call("get_weather", r#"{"city":"Paris","days":3}"#),
                    call("add", r#"{"a":1,"b":["2","x"]}"#),
                ],
                TEMPLATE_TEXT,
            );
            check_stream_calls(F, TEMPLATE_TEXT, &r);
        }
        let r = req(template_tools(), ToolChoice::Auto, false);
        let g = grammar(&F.plan(&r).unwrap().unwrap());
        assert!(!g.accepts_str(calls));
        // the template writes the values of `to_xml`, as the tests' renderer does
        let args = json!({"a": 1, "b": ["2", "x"]});
        assert!(calls.contains(&render_call("add", &args)));
        check_verbatim(F, TEMPLATE_TEXT, &r.tools);
    }

    fn case_tools() -> Vec<Tool> {
        vec![
            tool(
                "f",
                json!({"type": "object", "properties": {
                    "s": {"type": "string"}, "i": {"type": "integer"},
                    "o": {"type": "object", "properties": {
                        "a": {"type": "integer"},
                        "t": {"type": "array", "items": {"type": "string"}}}},
                    "n": {"anyOf": [{"type": "object", "properties": {"x": {"type": "boolean"}}},
                                    {"type": "null"}]},
                    "j": {"type": "object"},
                    "u": {"type": "array"}}}),
            ),
            tool("g", json!({"type": "object", "properties": {}})),
        ]
    }

    /// An element `NS<k>v NS</k>`.
    fn el(k: &str, v: &str) -> String {
        format!("{NS}<{k}>{v}{NS}</{k}>")
    }

    fn block(name: &str, members: &str) -> String {
        format!("{OPEN}\n{INVOKE}{name}\">{members}{INVOKE_END}\n{CLOSE}")
    }

    #[test]
    fn minimax_m3_parse_cases() {
        let r = req(case_tools(), ToolChoice::Auto, true);
        let item = |v: &str| el("item", v);
        let cases: Vec<(String, String, Vec<ToolCall>)> = vec![
            ("Hello \n".into(), "Hello".into(), vec![]),
            (format!("Hi\n{}", block("g", "")), "Hi".into(), vec![call("g", "{}")]),
            // values by the schema: raw text, JSON, nested members and items, a choice
            (
                block(
                    "f",
                    &(el("s", "12")
                        + &el("i", "12")
                        + &el("o", &(el("a", "1") + &el("t", &(item("x") + &item("")))))
                        + &el("n", "null")
                        + &el("j", "{\"z\": [1]}")
                        + &el("u", &(item("1") + &item("\"q\"") + &item("{}")))),
                ),
                "".into(),
                vec![call(
                    "f",
                    r#"{"s":"12","i":12,"o":{"a":1,"t":["x",""]},"n":null,"j":{"z":[1]},"u":[1,"q",{}]}"#,
                )],
            ),
            (
                block("f", &(el("n", &el("x", "true")) + &el("o", ""))),
                "".into(),
                vec![call("f", r#"{"n":{"x":true},"o":{}}"#)],
            ),
            // whitespace between the tags, members in any order, a repeat keeps the first
            (
                format!(
                    "{OPEN} \n{INVOKE}f\">\n{}\n {}{}\n{INVOKE_END}\n\n{INVOKE}g\">{INVOKE_END}{CLOSE}",
                    el("o", &format!(" {} ", el("t", &format!("\n{}\n", item(" a "))))),
                    el("i", " 5 "),
                    el("i", "6"),
                ),
                "".into(),
                vec![call("f", r#"{"o":{"t":[" a "]},"i":5}"#), call("g", "{}")],
            ),
            // raw text with markup, the namespace token, a closing tag inside JSON
            (
                block(
                    "f",
                    &(el("s", &format!("a<s>{NS}b\n"))
                        + &el("j", &format!("{{\"a\": \"{NS}</j>\"}}"))),
                ),
                "".into(),
                vec![call("f", r#"{"s":"a<s>]<]minimax[>[b\n","j":{"a":"]<]minimax[>[</j>"}}"#)],
            ),
            // not JSON where JSON is due, an undeclared member, a tool not offered, text after
            // the block, an unclosed block: content; good blocks after them are read
            (
                format!("{} {}", block("f", &el("i", "twelve")), block("g", "")),
                block("f", &el("i", "twelve")),
                vec![call("g", "{}")],
            ),
            (
                block("f", &el("zz", "1")),
                block("f", &el("zz", "1")),
                vec![],
            ),
            (
                format!("{}\n{}", block("h", ""), block("g", "")),
                block("h", ""),
                vec![call("g", "{}")],
            ),
            (
                format!("{} trailing", block("g", "")),
                " trailing".into(),
                vec![call("g", "{}")],
            ),
            (
                block("g", "").replace(CLOSE, ""),
                block("g", "").replace(CLOSE, "").trim_end().into(),
                vec![],
            ),
            // JSON is read whatever its type, as llama.cpp reads it
            (
                block("f", &el("o", &el("a", "[1]"))),
                "".into(),
                vec![call("f", r#"{"o":{"a":[1]}}"#)],
            ),
        ];
        for (text, content, calls) in &cases {
            check_parsed(&F.parse(text, Some(&r)), content, calls, text);
            check_partial_prefixes(F, text, Some(&r));
        }
        // streamed as written: the name once whole, each parameter once its element is
        // closed, a raw text's characters as they come
        let f = format!("Hi {OPEN}\n{INVOKE}f\">");
        let i = format!("{f}{NS}<i>12");
        let s = format!("{i}{NS}</i>{NS}<s>Pa\"ris");
        for (t, args) in [
            (format!("Hi {OPEN}\n{INVOKE}f"), None),
            (f.clone(), Some("{")),
            (i.clone(), Some("{")),
            (format!("{i}{NS}</i"), Some("{")),
            (format!("{i}{NS}</i>"), Some(r#"{"i":12"#)),
            (format!("{i}{NS}</i>{NS}<s"), Some(r#"{"i":12"#)),
            (s.clone(), Some(r#"{"i":12,"s":"Pa\"ris"#)),
            (format!("{s}{NS}</"), Some(r#"{"i":12,"s":"Pa\"ris"#)),
            (
                format!("{s}{NS}<x"),
                Some(r#"{"i":12,"s":"Pa\"ris]<]minimax[>[<x"#),
            ),
            (
                format!("{s}{NS}</s>{NS}<o>{NS}<a>1{NS}</a>"),
                Some(r#"{"i":12,"s":"Pa\"ris""#),
            ),
            (
                format!("{s}{NS}</s>{NS}<o>{NS}<a>1{NS}</a>{NS}</o>"),
                Some(r#"{"i":12,"s":"Pa\"ris","o":{"a":1}"#),
            ),
            (format!("{i}{NS}</i>{INVOKE_END}"), Some(r#"{"i":12}"#)),
        ] {
            let p = F.parse_partial(&t, Some(&r));
            let want: Vec<ToolCall> = args.map(|a| call("f", a)).into_iter().collect();
            check_parsed(&p, "Hi", &want, &t);
        }
    }

    /// Values llama.cpp's reader (`peg-minimax-m3`) gives for these texts, read the same: an
    /// array of objects, a mixed enum's member as text, a `$ref`'s value as JSON, a type list
    /// without strings as JSON, an object whose members are all left out.
    #[test]
    fn minimax_m3_reads_as_llama_cpp_reads() {
        let r = req(
            vec![tool(
                "f",
                json!({"type": "object", "properties": {
                    "ao": {"type": "array", "items": {"type": "object",
                                                      "properties": {"k": {"type": "string"}}}},
                    "e": {"enum": ["x", 1]}, "r": {"$ref": "#/$defs/d"},
                    "tn": {"type": ["integer", "null"]},
                    "n": {"anyOf": [{"type": "object", "properties": {"x": {"type": "boolean"}}},
                                    {"type": "null"}]}},
                    "$defs": {"d": {"type": "object", "properties": {"z": {"type": "integer"}}}}}),
            )],
            ToolChoice::Auto,
            true,
        );
        // (the grammar writes them so, but the mixed enum's `1`: it writes its strings only)
        for (members, args, written) in [
            (
                el("ao", &(el("item", &el("k", "v")) + &el("item", ""))),
                r#"{"ao":[{"k":"v"},{}]}"#,
                true,
            ),
            (el("e", "1"), r#"{"e":"1"}"#, false),
            (el("r", "{\"z\": 3}"), r#"{"r":{"z":3}}"#, true),
            (
                el("tn", "null") + &el("n", ""),
                r#"{"tn":null,"n":{}}"#,
                true,
            ),
        ] {
            let text = block("f", &members);
            check_parsed(&F.parse(&text, Some(&r)), "", &[call("f", args)], &text);
            let g = grammar(&F.plan(&r).unwrap().unwrap());
            assert_eq!(g.accepts_str(&text), written, "{text:?}");
        }
    }

    /// Random outputs, well formed or edited as a model without a grammar may slip, with
    /// random schemas: streaming never takes back what it sent, and reading on agrees with
    /// reading again.
    #[test]
    fn minimax_m3_random_outputs_stream_without_taking_back() {
        let pieces = [
            NS,
            OPEN,
            CLOSE,
            INVOKE,
            INVOKE_END,
            ITEM,
            ITEM_END,
            "<i>",
            "</i>",
            "\">",
            "{\"a\": \"",
            "1",
            "\n",
            " ",
            "é",
        ];
        let mut rng = Rng(0x5EED_3304);
        let (mut checked, mut with_calls) = (0usize, 0usize);
        for round in 0..160 {
            let r = super::super::test_util::random_req(&mut rng, round, true);
            let mut text = random_output(&mut rng, F, &r);
            if round % 3 != 0 {
                for _ in 0..1 + rng.below(3) {
                    mutate(&mut rng, &mut text, &pieces, 24);
                }
            }
            for q in [Some(&r), None] {
                let (full, n) = check_partial_prefixes(F, &text, q);
                checked += n;
                with_calls += usize::from(!full.tool_calls.is_empty());
            }
            if round % 4 == 0 {
                checked += check_read_on(&mut rng, F, &text, Some(&r));
            }
        }
        assert!(
            checked > 20_000 && with_calls > 60,
            "{checked} {with_calls}"
        );
    }

    #[test]
    fn minimax_m3_detect_and_plan_refusals() {
        check_detect_all(
            |t| detect(t).then_some(F),
            &[("MiniMax-M3.jinja", Format::MiniMaxM3)],
        );
        assert!(!detect("<minimax:tool_call><invoke name=\"f\">"));
        let plan_err = |props: Value| {
            let r = req(
                vec![tool(
                    "f",
                    json!({"type": "object", "properties": props,
                           "$defs": {"d": {"type": "integer"}}}),
                )],
                ToolChoice::Required,
                false,
            );
            F.plan(&r).err()
        };
        for bad in [
            json!({"s": {"type": "string", "pattern": "^a+$"}}),
            json!({"a": {"type": "array", "items": {"type": "integer"}, "uniqueItems": true}}),
            json!({"o": {"type": "object", "properties": {"x": {}}, "minProperties": 1}}),
            json!({"o": {"type": ["object", "string"], "properties": {"x": {}}}}),
            json!({"o": {"type": "object", "properties": {"a<b": {"type": "integer"}}}}),
            json!({"e": {"enum": [1, 2], "type": ["string", "integer"], "const": 3}}),
        ] {
            assert!(plan_err(bad.clone()).is_some(), "{bad}");
        }
        for good in [
            json!({"s": {"type": "string", "maxLength": 3}}),
            json!({"a": {"type": "array", "items": {"type": "integer"}, "maxItems": 2}}),
            json!({"o": {"type": ["integer", "null"]}}),
            json!({"e": {"enum": ["x", 1]}}),
            json!({"r": {"$ref": "#/$defs/d"}}),
        ] {
            assert_eq!(plan_err(good.clone()), None, "{good}");
        }
        // a mixed enum is read as text, so the grammar writes its strings only
        let r = req(
            vec![tool(
                "f",
                json!({"type": "object", "properties": {"e": {"enum": ["x", 1]}}}),
            )],
            ToolChoice::Required,
            false,
        );
        let g = grammar(&F.plan(&r).unwrap().unwrap());
        assert!(g.accepts_str(&block("f", &el("e", "x"))));
        assert!(!g.accepts_str(&block("f", &el("e", "1"))));
        // a string's lengths
        let r = req(
            vec![tool(
                "f",
                json!({"type": "object", "properties": {"s": {"type": "string", "maxLength": 3}},
                       "required": ["s"]}),
            )],
            ToolChoice::Required,
            false,
        );
        let g = grammar(&F.plan(&r).unwrap().unwrap());
        assert!(g.accepts_str(&block("f", &el("s", "abc"))));
        assert!(!g.accepts_str(&block("f", &el("s", "abcd"))));
        assert!(!g.accepts_str(&block("f", "")));
    }
}
