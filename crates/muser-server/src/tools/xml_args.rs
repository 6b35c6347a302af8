//! The parameters of the XML-like call formats (ATEM's `<atem:parameter name="K">V</atem:parameter>`,
//! Qwen XML's `<parameter=K>\nV\n</parameter>`): their grammar, built per tool from the
//! arguments' schema, and the reading of their values back by the schema's types.
//!
//! The grammar takes the schema's `properties` in their order, required ones mandatory,
//! optional ones optional, no others. A value is raw text without the format's closing tag when
//! the property's schema admits strings (a string-only `enum` or `const`: one of its values,
//! raw; a string with `minLength`/`maxLength`: that many characters, none `<`), else JSON per
//! the schema (muser-jsonschema). What raw text cannot carry (a `pattern`, a `format`, ...) is
//! refused: a value the schema rejects must never come back.

use std::collections::HashSet;

use serde_json::{Map, Value};

use super::partial::{push_compact, push_key, Memo};
use super::{Tool, ToolRequest, WS_BODY};
use muser_jsonschema::gbnf_literal as literal;

/// How a format writes a parameter.
pub(super) struct Syntax {
    /// The format's name in messages ("ATEM").
    pub format: &'static str,
    /// The start of the shared rules' names (`{prefix}-ws`, `{prefix}-str`, `{prefix}-t0-p0`).
    pub prefix: &'static str,
    /// The text before the value of parameter `key`, given whether its schema admits strings
    /// (DeepSeek's DSML says so in the tag) and the schema itself (Kimi K3 writes its type).
    pub open: fn(&str, bool, &Value) -> String,
    /// The text after a value.
    pub close: &'static str,
    /// The closing tag, which a raw value cannot contain.
    pub end_tag: &'static str,
    /// Characters a parameter name cannot carry.
    pub name_stops: &'static [char],
    /// Python's `True`, `False` and `None` (jinja2's `| string`) are read as `true`, `false`
    /// and `null` where the schema admits that type and no string.
    pub python: bool,
    /// What the grammar writes between tags (after each parameter, and between the call's own
    /// tags where the format says so): exactly this text where the template's layout is all
    /// its model's reader takes (llama.cpp reads no Qwen3-Coder call with a blank line between
    /// its tags), else (None) any JSON whitespace.
    pub sep: Option<&'static str>,
    /// The required parameters first (in the schema's order), then the optional ones: the
    /// order DSML's reader in llama.cpp insists on; else the schema's order.
    pub required_first: bool,
}

/// The length of the whitespace (JSON's) at the start of `s`, which the XML formats' readers
/// skip between tags.
pub(super) fn ws_len(s: &str) -> usize {
    s.len() - s.trim_start_matches([' ', '\t', '\n', '\r']).len()
}

/// The parameter rules of a format's tools, collected for one grammar.
pub(super) struct Params<'s> {
    syntax: &'s Syntax,
    rules: String,
    raw_strings: bool,
}

impl<'s> Params<'s> {
    pub fn new(syntax: &'s Syntax) -> Self {
        Params {
            syntax,
            rules: String::new(),
            raw_strings: false,
        }
    }

    /// The name of the whitespace rule (after each parameter; the formats use it between
    /// their own tags too).
    pub fn ws(&self) -> String {
        format!("{}-ws", self.syntax.prefix)
    }

    /// What follows a tag: the syntax's separator as a literal, or the whitespace rule.
    pub fn sep(&self) -> String {
        self.syntax.sep.map_or_else(|| self.ws(), literal)
    }

    /// Adds the rules of the parameters of tool `i`; returns their sequence (rule names, `?`
    /// after the optional ones), each parameter followed by the separator (`sep`).
    pub fn tool(&mut self, i: usize, tool: &Tool) -> Result<String, String> {
        let name = &tool.name;
        let (props, required) = object_schema(tool)?;
        let params = &tool.parameters;
        let sx = self.syntax;
        let mut seq = Vec::new();
        for (j, (k, schema)) in props.iter().enumerate() {
            if let Some(c) = k.chars().find(|c| sx.name_stops.contains(c)) {
                return Err(format!(
                    "tool `{name}`: the {} format cannot carry {c:?} in a parameter name \
                     (`{k}`)",
                    sx.format
                ));
            }
            let may_str = admits_string(schema, params);
            let value = match string_choices(schema) {
                Some(choices) => {
                    let ok: Vec<String> = choices
                        .iter()
                        .filter(|c| !c.contains(sx.end_tag))
                        .map(|c| literal(c))
                        .collect();
                    if ok.is_empty() {
                        return Err(format!(
                            "tool `{name}`: parameter `{k}`: no allowed value can be written \
                             in the {} format",
                            sx.format
                        ));
                    }
                    format!("( {} )", ok.join(" | "))
                }
                None if may_str => {
                    match raw_string_rule(schema, params, sx.format)
                        .map_err(|e| format!("tool `{name}`: parameter `{k}`: {e}"))?
                    {
                        None => {
                            self.raw_strings = true;
                            format!("{}-str", sx.prefix)
                        }
                        Some(rule) => rule,
                    }
                }
                None => {
                    let ptr = child_ptr("#/properties", k);
                    let (top, r) = muser_jsonschema::subschema_to_gbnf_rules(
                        params,
                        &ptr,
                        &format!("j{i}-{j}-"),
                    )
                    .map_err(|e| format!("tool `{name}`: parameter `{k}`: {e}"))?;
                    self.rules.push_str(&r);
                    top
                }
            };
            let kv = format!("{}-t{i}-p{j}", sx.prefix);
            self.rules.push_str(&format!(
                "{kv} ::= {} {value} {} {}\n",
                literal(&(sx.open)(k, may_str, schema)),
                literal(sx.close),
                self.sep()
            ));
            seq.push(if required.contains(&k.as_str()) {
                kv
            } else {
                format!("{kv}?")
            });
        }
        if sx.required_first {
            // (a stable sort: each kind keeps the schema's order)
            seq.sort_by_key(|kv| kv.ends_with('?'));
        }
        Ok(seq.join(" "))
    }

    /// The rules collected, the whitespace rule and (when used) the raw text rule.
    pub fn finish(self) -> String {
        let mut out = format!("{} ::= {WS_BODY}\n", self.ws());
        if self.raw_strings {
            out.push_str(&text_without(
                &format!("{}-str", self.syntax.prefix),
                &[self.syntax.end_tag],
            ));
        }
        out.push_str(&self.rules);
        out
    }
}

/// A tool's `parameters` as an object schema: its `properties` and its `required` names.
pub(super) fn object_schema(tool: &Tool) -> Result<(Map<String, Value>, Vec<&str>), String> {
    let name = &tool.name;
    let Some(obj) = tool.parameters.as_object() else {
        return Err(format!(
            "tool `{name}`: `parameters` must be a JSON schema object"
        ));
    };
    let is_object_type = match obj.get("type") {
        None => true,
        Some(Value::String(t)) => t == "object",
        Some(Value::Array(ts)) => ts.iter().any(|t| t == "object"),
        Some(_) => false,
    };
    if !is_object_type {
        return Err(format!(
            "tool `{name}`: `parameters` must be an object schema (its `type` is {})",
            obj["type"]
        ));
    }
    for kw in ["$ref", "anyOf", "oneOf", "allOf", "not", "if"] {
        if obj.contains_key(kw) {
            return Err(format!(
                "tool `{name}`: `{kw}` in `parameters` is not supported (give an object schema \
                 with `properties`)"
            ));
        }
    }
    let props = match obj.get("properties") {
        None => Map::new(),
        Some(Value::Object(m)) => m.clone(),
        Some(_) => {
            return Err(format!(
                "tool `{name}`: `parameters.properties` must be an object"
            ))
        }
    };
    let required: Vec<&str> = match obj.get("required") {
        None => Vec::new(),
        Some(Value::Array(a)) => a
            .iter()
            .map(|v| {
                v.as_str().ok_or_else(|| {
                    format!("tool `{name}`: `parameters.required` must list strings")
                })
            })
            .collect::<Result<_, _>>()?,
        Some(_) => {
            return Err(format!(
                "tool `{name}`: `parameters.required` must be an array"
            ))
        }
    };
    if let Some(r) = required.iter().find(|r| !props.contains_key(**r)) {
        return Err(format!(
            "tool `{name}`: required parameter `{r}` is not in `properties`"
        ));
    }
    Ok((props, required))
}

/// The values of a string-only `enum` or `const` (the schema's only constraint on strings
/// then), None for any other schema.
fn string_choices(schema: &Value) -> Option<Vec<String>> {
    let m = schema.as_object()?;
    let values: Vec<&Value> = if let Some(c) = m.get("const") {
        vec![c]
    } else {
        m.get("enum")?.as_array()?.iter().collect()
    };
    if values.is_empty() {
        return None;
    }
    // A string is written raw, another value as its JSON.
    Some(
        values
            .iter()
            .map(|v| match v {
                Value::String(s) => s.clone(),
                other => other.to_string(),
            })
            .collect(),
    )
}

/// Annotations: keywords that constrain nothing.
pub(super) const ANNOTATIONS: &[&str] = &[
    "description",
    "title",
    "examples",
    "default",
    "$comment",
    "deprecated",
    "readOnly",
    "writeOnly",
];

/// Longest `minLength` / `maxLength` a raw string parameter may ask for (muser-jsonschema's
/// repetition bound for JSON strings is of the same order).
const MAX_RAW_LENGTH: u64 = 2000;

/// The grammar of a parameter whose value may be a string (written raw): None for any text
/// without the closing tag, when the schema constrains nothing more than its type;
/// `[^<]{min,max}` (no `<` in the value) for a plain string with lengths; anything else (a
/// `pattern`, a `format`, a reference or a combination that may constrain the string) is
/// refused, since raw text cannot carry it and a value the schema rejects must never come back.
pub(super) fn raw_string_rule(
    schema: &Value,
    doc: &Value,
    format: &str,
) -> Result<Option<String>, String> {
    // A schema that is only a local reference is its target's (a few levels deep).
    let mut schema = schema;
    for _ in 0..8 {
        let only_ref = schema.as_object().is_some_and(|o| {
            o.contains_key("$ref") && o.keys().all(|k| k == "$ref" || ANNOTATIONS.contains(&&**k))
        });
        match schema["$ref"].as_str().and_then(|r| resolve_local(doc, r)) {
            Some(target) if only_ref => schema = target,
            _ => break,
        }
    }
    fn keys(v: &Value) -> Vec<&str> {
        v.as_object()
            .map(|o| {
                o.keys()
                    .map(String::as_str)
                    .filter(|k| !ANNOTATIONS.contains(k))
                    .collect()
            })
            .unwrap_or_default()
    }
    let k = keys(schema);
    if k.iter().all(|k| *k == "type") {
        return Ok(None);
    }
    let plain_string = schema.get("type").and_then(Value::as_str) == Some("string");
    if plain_string
        && k.iter()
            .all(|k| matches!(*k, "type" | "minLength" | "maxLength"))
    {
        let bound = |key: &str| -> Result<Option<u64>, String> {
            match schema.get(key) {
                None => Ok(None),
                Some(v) => match v.as_u64() {
                    Some(n) if n <= MAX_RAW_LENGTH => Ok(Some(n)),
                    _ => Err(format!(
                        "`{key}` must be a count from 0 to {MAX_RAW_LENGTH} for a raw string, \
                         got {v}"
                    )),
                },
            }
        };
        let min = bound("minLength")?.unwrap_or(0);
        return Ok(Some(match bound("maxLength")? {
            Some(max) if max < min => {
                return Err(format!("`maxLength` {max} is below `minLength` {min}"))
            }
            Some(max) => format!("[^<]{{{min},{max}}}"),
            None => format!("[^<]{{{min},}}"),
        }));
    }
    // anyOf / oneOf of branches that constrain only their type are raw text too.
    let branches_plain = k.iter().all(|k| matches!(*k, "type" | "anyOf" | "oneOf"))
        && ["anyOf", "oneOf"].iter().all(|c| {
            schema.get(*c).is_none_or(|b| {
                b.as_array()
                    .is_some_and(|a| a.iter().all(|x| keys(x).iter().all(|k| *k == "type")))
            })
        });
    if branches_plain {
        return Ok(None);
    }
    Err(format!(
        "a value that may be a string is written as raw text in the {format} format, which \
         cannot carry its {} (give `type` alone, `minLength`/`maxLength` on a string, or an \
         `enum`)",
        k.iter()
            .filter(|k| **k != "type")
            .map(|k| format!("`{k}`"))
            .collect::<Vec<_>>()
            .join(", ")
    ))
}

/// Whether a property's `schema` (in the tool's parameters `doc`) admits strings, so that its
/// value is written raw.
pub(super) fn admits_string(schema: &Value, doc: &Value) -> bool {
    value_types(schema, doc, 0) & T_STR != 0
}

/// Appends an RFC 6901 reference token to a pointer.
pub(super) fn child_ptr(ptr: &str, token: &str) -> String {
    format!("{ptr}/{}", token.replace('~', "~0").replace('/', "~1"))
}

/// JSON types as bits.
const T_NULL: u8 = 1;
const T_BOOL: u8 = 2;
const T_INT: u8 = 4;
/// Numbers that are not integers.
const T_FRAC: u8 = 8;
const T_STR: u8 = 16;
const T_ARR: u8 = 32;
const T_OBJ: u8 = 64;
const T_ALL: u8 = 127;

fn type_bits(name: &str) -> u8 {
    match name {
        "null" => T_NULL,
        "boolean" => T_BOOL,
        "integer" => T_INT,
        "number" => T_INT | T_FRAC,
        "string" => T_STR,
        "array" => T_ARR,
        "object" => T_OBJ,
        _ => T_ALL,
    }
}

fn type_of(v: &Value) -> u8 {
    match v {
        Value::Null => T_NULL,
        Value::Bool(_) => T_BOOL,
        Value::Number(n) => {
            if n.is_i64() || n.is_u64() || n.as_f64().is_some_and(|f| f.fract() == 0.0) {
                T_INT
            } else {
                T_FRAC
            }
        }
        Value::String(_) => T_STR,
        Value::Array(_) => T_ARR,
        Value::Object(_) => T_OBJ,
    }
}

/// The JSON types a schema admits, as far as `type`, `const`, `enum`, local `$ref`s,
/// `anyOf`/`oneOf` and `allOf` tell (an over-approximation; `$ref` cycles admit nothing).
fn value_types(schema: &Value, doc: &Value, depth: usize) -> u8 {
    if depth > 32 {
        return 0;
    }
    let m = match schema {
        Value::Bool(false) => return 0,
        Value::Object(m) => m,
        _ => return T_ALL,
    };
    let mut t = T_ALL;
    match m.get("type") {
        Some(Value::String(s)) => t &= type_bits(s),
        Some(Value::Array(a)) => {
            t &= a
                .iter()
                .filter_map(Value::as_str)
                .fold(0, |acc, s| acc | type_bits(s))
        }
        _ => {}
    }
    if let Some(c) = m.get("const") {
        t &= type_of(c);
    } else if let Some(Value::Array(e)) = m.get("enum") {
        t &= e.iter().fold(0, |acc, v| acc | type_of(v));
    }
    if let Some(target) = m
        .get("$ref")
        .and_then(Value::as_str)
        .and_then(|r| resolve_local(doc, r))
    {
        t &= value_types(target, doc, depth + 1);
    }
    for kw in ["anyOf", "oneOf"] {
        if let Some(Value::Array(a)) = m.get(kw) {
            t &= a
                .iter()
                .fold(0, |acc, s| acc | value_types(s, doc, depth + 1));
        }
    }
    if let Some(Value::Array(a)) = m.get("allOf") {
        for s in a {
            t &= value_types(s, doc, depth + 1);
        }
    }
    t
}

/// The target of a `#/...` reference in `doc`.
fn resolve_local<'v>(doc: &'v Value, r: &str) -> Option<&'v Value> {
    let path = r.strip_prefix('#')?;
    if path.is_empty() {
        return Some(doc);
    }
    let mut cur = doc;
    for raw in path.strip_prefix('/')?.split('/') {
        let tok = raw.replace("~1", "/").replace("~0", "~");
        cur = match cur {
            Value::Object(m) => m.get(&tok)?,
            Value::Array(a) => a.get(tok.parse::<usize>().ok()?)?,
            _ => return None,
        };
    }
    Some(cur)
}

fn escape_code(c: char) -> String {
    let u = c as u32;
    if u < 0x80 {
        format!("\\x{u:02X}")
    } else if u <= 0xffff {
        format!("\\u{u:04X}")
    } else {
        format!("\\U{u:08X}")
    }
}

/// One character inside a GBNF character class.
fn class_char(c: char) -> String {
    if c.is_ascii_alphanumeric() {
        c.to_string()
    } else {
        escape_code(c)
    }
}

/// GBNF rules for any text in which none of `delims` (non-empty) occurs: rule `name` and
/// helper rules `name-K`. A right-linear grammar of the Aho-Corasick automaton of `delims`:
/// one rule per reachable proper prefix of a delimiter (the longest one the text ends with),
/// one alternative per next state, so the text is read deterministically.
pub(super) fn text_without(name: &str, delims: &[&str]) -> String {
    let delims: Vec<Vec<char>> = delims.iter().map(|d| d.chars().collect()).collect();
    let mut alphabet: Vec<char> = delims.iter().flatten().copied().collect();
    alphabet.sort_unstable();
    alphabet.dedup();
    let is_prefix = |s: &[char]| delims.iter().any(|d| d.len() > s.len() && d.starts_with(s));
    // the state after reading `c` in `s`: None when a delimiter ends there
    let step = |s: &[char], c: char| -> Option<Vec<char>> {
        let mut w = s.to_vec();
        w.push(c);
        if delims.iter().any(|d| w.ends_with(d)) {
            return None;
        }
        (0..=w.len())
            .map(|k| w[k..].to_vec())
            .find(|suffix| is_prefix(suffix))
    };
    let mut states: Vec<Vec<char>> = vec![Vec::new()];
    let mut out = String::new();
    let mut i = 0;
    while i < states.len() {
        let s = states[i].clone();
        // next state -> the characters of the alphabet leading there
        let mut dests: Vec<(usize, Vec<char>)> = Vec::new();
        // characters that leave the start state or end a delimiter
        let mut special = Vec::new();
        for &c in &alphabet {
            let Some(next) = step(&s, c) else {
                special.push(c);
                continue;
            };
            if next.is_empty() {
                continue;
            }
            special.push(c);
            let k = match states.iter().position(|x| *x == next) {
                Some(k) => k,
                None => {
                    states.push(next);
                    states.len() - 1
                }
            };
            match dests.iter_mut().find(|(d, _)| *d == k) {
                Some((_, cs)) => cs.push(c),
                None => dests.push((k, vec![c])),
            }
        }
        let rule = |k: usize| {
            if k == 0 {
                name.to_string()
            } else {
                format!("{name}-{k}")
            }
        };
        let class = |neg: bool, cs: &[char]| {
            let body: String = cs.iter().map(|&c| class_char(c)).collect();
            format!("[{}{body}]", if neg { "^" } else { "" })
        };
        let mut alts = vec![format!("{} {}", class(true, &special), rule(0))];
        for (k, cs) in &dests {
            alts.push(format!("{} {}", class(false, cs), rule(*k)));
        }
        out.push_str(&format!("{} ::= ( {} )?\n", rule(i), alts.join(" | ")));
        i += 1;
    }
    out
}

// ---------------------------------------------------------------------------------------------
// Reading values back

/// The value of a parameter from its raw text, by the JSON types its schema admits: the text
/// itself where only strings are; else JSON where the text is JSON (of an admitted type other
/// than string, where strings are admitted too: a JSON string literal is text with quotes);
/// else, with `python`, Python's spellings of an admitted type where no string is; else the
/// text as a string. The JSON is read as a call's JSON is (`partial::whole`: a repeated key
/// keeps its first value, a lone surrogate's escape is U+FFFD).
fn read_value(raw: &str, types: u8, python: bool) -> Value {
    if types == T_STR {
        return Value::String(raw.to_string());
    }
    match super::partial::whole(raw) {
        Some(v) if types & T_STR == 0 || (!v.is_string() && type_of(&v) & types != 0) => v,
        _ => {
            let py = match raw.trim() {
                "True" => Some(Value::Bool(true)),
                "False" => Some(Value::Bool(false)),
                "None" => Some(Value::Null),
                _ => None,
            };
            match py {
                Some(v) if python && types & T_STR == 0 && type_of(&v) & types != 0 => v,
                _ => Value::String(raw.to_string()),
            }
        }
    }
}

/// The tool named `name` in `req`, if any.
fn find_tool<'r>(name: &str, req: Option<&'r ToolRequest>) -> Option<&'r Tool> {
    req.and_then(|r| r.tools.iter().find(|t| t.name == name))
}

/// The schema of parameter `key` of `tool`, if it declares one.
fn param_schema<'t>(tool: Option<&'t Tool>, key: &str) -> Option<&'t Value> {
    tool?.parameters.get("properties")?.get(key)
}

/// The value of parameter `key` of `tool` from its raw text, read by its schema's types (any
/// type where the tool or the parameter is unknown).
fn arg_value(syntax: &Syntax, tool: Option<&Tool>, key: &str, raw: &str) -> Value {
    let schema = param_schema(tool, key);
    // An `enum` / `const` value is the member written so (a string raw, another value as
    // its JSON): `["1", 2]` reads "1" as the string and "2" as the number.
    let member = schema.and_then(|s| {
        string_choices(s)?;
        let values: Vec<&Value> = match s.get("const") {
            Some(c) => vec![c],
            None => s.get("enum")?.as_array()?.iter().collect(),
        };
        values
            .into_iter()
            .find(|v| match v {
                Value::String(text) => text == raw,
                other => other.to_string() == *raw,
            })
            .cloned()
    });
    member.unwrap_or_else(|| {
        let types = match (schema, tool) {
            (Some(s), Some(t)) => value_types(s, &t.parameters, 0),
            _ => T_ALL,
        };
        read_value(raw, types, syntax.python)
    })
}

/// The arguments (compact JSON of an object) of a call of `tool` from its parameters' names
/// and raw texts, each value read by its schema's types in `req` (any type where the tool or
/// the parameter is unknown). A repeated name keeps its first value, as a repeated key of a
/// call's JSON does (`partial`).
pub(super) fn arguments(
    syntax: &Syntax,
    tool: &str,
    args: &[(String, String)],
    req: Option<&ToolRequest>,
) -> String {
    let tool = find_tool(tool, req);
    let mut m = Map::new();
    for (k, raw) in args {
        if !m.contains_key(k) {
            m.insert(k.clone(), arg_value(syntax, tool, k, raw));
        }
    }
    Value::Object(m).to_string()
}

// ---------------------------------------------------------------------------------------------
// Streaming

/// The length of the longest suffix of `s` that is a proper prefix of `tag` (text that may
/// still become `tag`).
pub(super) fn tail_len(s: &str, tag: &str) -> usize {
    (1..tag.len().min(s.len() + 1))
        .rev()
        .find(|&k| s.is_char_boundary(s.len() - k) && tag.starts_with(&s[s.len() - k..]))
        .unwrap_or(0)
}

/// A call's arguments as streaming sends them, built parameter by parameter as `arguments`
/// builds them at the end: `{`, then each parameter as `"key":value` once its raw text is
/// final (comma-separated), then `}` once the call is closed: what `arguments` gives for the
/// parameters so far. A repeated name (`is_new` false) keeps its first value, in `arguments`
/// as here: the reader leaves the repeat out and goes on with the parameters after it.
pub(super) struct StreamedArgs<'r> {
    syntax: &'r Syntax,
    tool: Option<&'r Tool>,
    text: String,
    keys: HashSet<String>,
}

impl<'r> StreamedArgs<'r> {
    /// The arguments of a call of tool `name` (of `req`) just begun: `{`.
    pub fn new(syntax: &'r Syntax, name: &str, req: Option<&'r ToolRequest>) -> Self {
        StreamedArgs {
            syntax,
            tool: find_tool(name, req),
            text: "{".to_string(),
            keys: HashSet::new(),
        }
    }

    /// Whether no parameter named `key` came before.
    pub fn is_new(&self, key: &str) -> bool {
        !self.keys.contains(key)
    }

    /// Appends `"key":` and its comma; the key is taken.
    fn push_key(&mut self, key: &str) {
        if !self.keys.is_empty() {
            self.text.push(',');
        }
        self.keys.insert(key.to_string());
        push_key(&mut self.text, key);
    }

    /// A parameter (a new name) whose raw text is final.
    pub fn push(&mut self, key: &str, raw: &str) {
        let v = arg_value(self.syntax, self.tool, key, raw);
        self.push_key(key);
        push_compact(&mut self.text, &v, None);
    }

    /// The last parameter (a new name), still open, whose raw text starts with `known`: where
    /// its schema admits strings only (its value is then the raw text itself), its key and
    /// the value's start (`"` and the characters so far); else nothing yet.
    pub fn push_open(&mut self, key: &str, known: &str, memo: &mut Memo) {
        let only_strings = match (param_schema(self.tool, key), self.tool) {
            (Some(s), Some(t)) => value_types(s, &t.parameters, 0) == T_STR,
            _ => false,
        };
        if only_strings {
            self.push_key(key);
            self.text.push('"');
            memo.push_text(&mut self.text, known);
        }
    }

    /// The call is closed: `}`.
    pub fn close(&mut self) {
        self.text.push('}');
    }

    /// The text so far.
    pub fn into_text(self) -> String {
        self.text
    }
}
