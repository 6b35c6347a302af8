//! The formats whose calls are JSON call objects after an opening tag (a JSON array of them,
//! or bare objects: [`Items`]), closed by a tag or not, after the reply's text if any; the
//! tags and the call objects' keys are data (a [`Shape`]):
//!
//! * Nemotron Nano v2: `<TOOLCALL>[{"name": ..., "arguments": {...}}, ...]</TOOLCALL>`.
//! * Command R7B: `<|START_ACTION|>[{"tool_call_id": "0", "tool_name": ..., "parameters":
//!   {...}}, ...]<|END_ACTION|>`, its reply wrapped in `<|START_RESPONSE|>` ...
//!   `<|END_RESPONSE|>`; Cohere2MoE the same, its reply in `<|START_TEXT|>` ... `<|END_TEXT|>`.
//!   The templates number the calls themselves (`tool_call_id`), so the number the model
//!   writes is not the call's id.
//! * Granite 3.3: `<|tool_call|>[{"name": ..., "arguments": {...}}, ...]`, no closing tag.
//! * Apriel 1.5 and 1.6: `<tool_calls>[{"name": ..., "arguments": {...}}, ...]</tool_calls>`
//!   (the template adds an `id` to past calls; llama.cpp reads no call the model writes one
//!   in, so the grammar writes none).
//! * FireFunction v2: ` functools[{"name": ..., "arguments": {...}}, ...]`, no closing tag.
//! * MiniMax M1: `<tool_calls>\n{...}\n{...}\n</tool_calls>`, an object a line.
//! * GigaChat 3: one object in a `function call` message,
//!   `<|message_sep|>\n\nfunction call<|role_sep|>\n{...}`; GigaChat 3.1: `<|function_call|>{...}`.
//!
//! Mistral Nemo's `[TOOL_CALLS][...]` array is read here too (`read_array`, `read_array_partial`),
//! its items' ids by `mistral`.
//!
//! The chat template shows the tools itself. The grammar writes one array (of one call without
//! `parallel`), the keys in the order the template writes them; reading is lenient (whitespace,
//! keys in any order, the closing tag missing at the end of the text). A reply wrapped in the
//! shape's reply tags is unwrapped, with or without tools, as llama.cpp's handlers read it: the
//! text inside the tags, and whatever follows the closing one. Streaming begins a call once its
//! name is whole and streams its arguments as they are written.

use serde_json::{json, Value};

use super::partial::{self, Json, Open};
use super::{
    allowed_tools, begun_call_keyed, call_of, call_schema_keyed, check_tools_convert, json_prefix,
    parse_blocks, parse_blocks_partial, tool_rules, BlockStep, Blocks, LazyStart, Parsed, Plan,
    ToolCall, ToolChoice, ToolRequest, WS_BODY,
};
use muser_jsonschema::gbnf_literal as lit;

/// One format of calls in a JSON array.
#[derive(Debug, PartialEq, Eq)]
pub struct Shape {
    /// The format's name.
    pub name: &'static str,
    /// The tag before the array.
    pub open: &'static str,
    /// The tag after it, if any.
    pub close: Option<&'static str>,
    /// The key of a call's function name.
    pub name_key: &'static str,
    /// The key of a call's arguments.
    pub args_key: &'static str,
    /// A key the grammar has the model write first in every call, a number in a string
    /// (Cohere's `tool_call_id`); not read back.
    pub number_key: Option<&'static str>,
    /// The tags a reply is wrapped in (Cohere's).
    pub reply: Option<(&'static str, &'static str)>,
    /// How the calls follow the opening tag.
    pub items: Items,
    /// The markup llama-server preserves for the format.
    pub markup: &'static [&'static str],
}

/// How a shape's call objects follow its opening tag.
#[derive(Debug, PartialEq, Eq)]
pub enum Items {
    /// A JSON array of one or more calls.
    Array,
    /// Bare call objects, each on its own line (MiniMax M1). The template writes them one
    /// after the other; llama.cpp reads no more than one without a comma between them, so
    /// the grammar writes `,` at the end of each line but the last, and the reader takes
    /// both.
    Lines,
    /// One bare call object (GigaChat's function call message).
    One,
}

pub(super) const NEMOTRON_V2: Shape = Shape {
    name: "nemotron-v2",
    open: "<TOOLCALL>",
    close: Some("</TOOLCALL>"),
    name_key: "name",
    args_key: "arguments",
    number_key: None,
    reply: None,
    items: Items::Array,
    markup: &["<TOOLCALL>", "</TOOLCALL>"],
};

const ACTION: &str = "<|START_ACTION|>";
const ACTION_END: &str = "<|END_ACTION|>";

pub(super) const COMMAND_R7B: Shape = Shape {
    name: "command-r7b",
    open: ACTION,
    close: Some(ACTION_END),
    name_key: "tool_name",
    args_key: "parameters",
    number_key: Some("tool_call_id"),
    reply: Some(("<|START_RESPONSE|>", "<|END_RESPONSE|>")),
    items: Items::Array,
    markup: &[ACTION, ACTION_END, "<|START_RESPONSE|>", "<|END_RESPONSE|>"],
};

pub(super) const COHERE2MOE: Shape = Shape {
    name: "cohere2moe",
    reply: Some(("<|START_TEXT|>", "<|END_TEXT|>")),
    markup: &[ACTION, ACTION_END, "<|START_TEXT|>", "<|END_TEXT|>"],
    ..COMMAND_R7B
};

/// What ends Cohere2MoE's reasoning block left open, as llama.cpp's handler reads it: the
/// calls' opening, or the reply's.
pub(super) const COHERE2MOE_REASONING_ENDS: &[&str] = &[ACTION, "<|START_TEXT|>"];

pub(super) const GRANITE: Shape = Shape {
    name: "granite",
    open: "<|tool_call|>",
    close: None,
    name_key: "name",
    args_key: "arguments",
    number_key: None,
    reply: None,
    items: Items::Array,
    markup: &["<|tool_call|>"],
};

const TOOL_CALLS: &str = "<tool_calls>";
const TOOL_CALLS_END: &str = "</tool_calls>";

/// Apriel 1.5 and 1.6 (ServiceNow): `<tool_calls>[{...}, ...]</tool_calls>`.
pub(super) const APRIEL: Shape = Shape {
    name: "apriel",
    open: TOOL_CALLS,
    close: Some(TOOL_CALLS_END),
    name_key: "name",
    args_key: "arguments",
    number_key: None,
    reply: None,
    items: Items::Array,
    markup: &[TOOL_CALLS, TOOL_CALLS_END],
};

/// FireFunction v2: ` functools[{...}, ...]`, no closing tag.
pub(super) const FIREFUNCTION_V2: Shape = Shape {
    name: "firefunction-v2",
    open: "functools",
    close: None,
    markup: &["functools"],
    ..APRIEL
};

/// MiniMax M1: `<tool_calls>\n{...}\n{...}\n</tool_calls>`, a call object a line.
pub(super) const MINIMAX_M1: Shape = Shape {
    name: "minimax-m1",
    open: "<tool_calls>\n",
    items: Items::Lines,
    ..APRIEL
};

/// GigaChat 3: one call, in a message of the `function call` role after the reply's:
/// `<|message_sep|>\n\nfunction call<|role_sep|>\n{...}`.
pub(super) const GIGACHAT_V3: Shape = Shape {
    name: "gigachat-v3",
    open: "<|message_sep|>\n\nfunction call<|role_sep|>\n",
    close: None,
    items: Items::One,
    markup: &["<|message_sep|>", "<|role_sep|>"],
    ..APRIEL
};

/// GigaChat 3.1: one call after the reply, `<|function_call|>{...}`.
pub(super) const GIGACHAT_V31: Shape = Shape {
    name: "gigachat-v3.1",
    open: "<|function_call|>",
    markup: &["<|function_call|>"],
    ..GIGACHAT_V3
};

/// The shape a template teaches, if any: Cohere's action tags (Cohere2MoE's where it writes
/// `<|START_TEXT|>`, Command R7B's where it writes `<|START_RESPONSE|>`), Nemotron Nano v2's
/// `<TOOLCALL>`, Granite 3.3's `<|tool_call|>`, Apriel's `<tool_calls>[` (MiniMax M1's
/// `<tool_calls>` without the bracket), FireFunction's `functools[`, GigaChat's
/// `<|role_sep|>` messages (3.1's where it writes `<|function_call|>`).
pub(super) fn detect(t: &str) -> Option<&'static Shape> {
    if t.contains("<tool_calls>[") {
        Some(&APRIEL)
    } else if t.contains(TOOL_CALLS) && t.contains(TOOL_CALLS_END) {
        Some(&MINIMAX_M1)
    } else if t.contains("functools[") {
        Some(&FIREFUNCTION_V2)
    } else if t.contains("<|role_sep|>") && t.contains("<|message_sep|>") {
        if t.contains("<|function_call|>") {
            Some(&GIGACHAT_V31)
        } else {
            t.contains("function call").then_some(&GIGACHAT_V3)
        }
    } else if t.contains(ACTION) && t.contains(ACTION_END) {
        if t.contains("<|START_TEXT|>") {
            Some(&COHERE2MOE)
        } else {
            t.contains("<|START_RESPONSE|>").then_some(&COMMAND_R7B)
        }
    } else if t.contains("<TOOLCALL>[") {
        Some(&NEMOTRON_V2)
    } else if t.contains("<|tool_call|>") {
        Some(&GRANITE)
    } else {
        None
    }
}

impl Shape {
    pub(super) fn lazy_start(&'static self) -> LazyStart {
        LazyStart::Word(self.open)
    }

    /// A block of call objects `items` (as written) in this shape's layout: the template's
    /// (the objects back to back for `Items::One`, which the grammar refuses for more than
    /// one), but for MiniMax M1's comma at the end of each line
    /// but the last (as the grammar writes them).
    #[cfg(test)]
    pub(super) fn block(&self, items: &[String]) -> String {
        let close = self.close.unwrap_or("");
        match self.items {
            Items::Array => format!("{}[{}]{close}", self.open, items.join(", ")),
            Items::Lines => format!("{}{}\n{close}", self.open, items.join(",\n")),
            Items::One => format!("{}{}{close}", self.open, items.concat()),
        }
    }

    /// The call a whole item of the array makes: its name and arguments (an object).
    fn call(&self, item: &Value) -> Option<ToolCall> {
        call_of(item.get(self.name_key)?.as_str()?, item.get(self.args_key)?)
    }
}

/// The variables a shape's template reads beside `tools`: FireFunction v2's `functions`,
/// the JSON text of the tools' specs (name, description, parameters; indented) that its
/// system prompt shows after "Available functions as JSON spec:" (where
/// the request lets the model call one: llama.cpp gives the template none, so its model
/// sees no tool).
pub(super) fn template_variables(req: &ToolRequest, shape: &Shape) -> Vec<(&'static str, Value)> {
    if shape != &FIREFUNCTION_V2 || req.choice == ToolChoice::None || req.tools.is_empty() {
        return Vec::new();
    }
    let specs: Vec<Value> = req
        .tools
        .iter()
        .map(|t| {
            let mut o = serde_json::Map::new();
            o.insert("name".into(), Value::from(t.name.as_str()));
            if let Some(d) = &t.description {
                o.insert("description".into(), Value::from(d.as_str()));
            }
            o.insert("parameters".into(), t.parameters.clone());
            Value::Object(o)
        })
        .collect();
    let text = serde_json::to_string_pretty(&specs).unwrap_or_default();
    vec![("functions", Value::String(text))]
}

/// The array of one call (or, with `req.parallel`, of one or more) of the allowed tools, each
/// call's keys in the shape's order, the arguments held by the tool's schema.
pub(super) fn plan(req: &ToolRequest, shape: &'static Shape) -> Result<Option<Plan>, String> {
    let Some(tools) = allowed_tools(req)? else {
        return Ok(None);
    };
    check_tools_convert(&tools)?;
    let mut rules = String::new();
    let mut alts = Vec::with_capacity(tools.len());
    for (i, t) in tools.iter().enumerate() {
        let mut schema = call_schema_keyed(t, "#", shape.name_key, shape.args_key);
        if let Some(k) = shape.number_key {
            let mut props = serde_json::Map::new();
            props.insert(
                k.to_string(),
                json!({"type": "string", "pattern": "^[0-9]{1,4}$"}),
            );
            props.extend(
                schema["properties"]
                    .as_object()
                    .cloned()
                    .unwrap_or_default(),
            );
            schema["properties"] = Value::Object(props);
            schema["required"] = json!([k, shape.name_key, shape.args_key]);
        }
        let (top, r) = tool_rules(t, &schema, &format!("t{i}-"))?;
        rules.push_str(&r);
        alts.push(top);
    }
    let (sep, last) = match shape.items {
        Items::Array => (" ws \",\" ws ", " ws "),
        Items::Lines => (" \",\\n\" ", " \"\\n\" "),
        Items::One => ("", " "),
    };
    let more = if req.parallel && shape.items != Items::One {
        format!(" ({sep}call )*")
    } else {
        String::new()
    };
    let close = shape
        .close
        .map(|c| format!("{last}{}", lit(c)))
        .unwrap_or_default();
    // The list right after its tag, as the templates write it (llama.cpp reads no Granite
    // call with whitespace between them).
    let body = match shape.items {
        Items::Array => format!("\"[\" ws call{more} ws \"]\"{close}"),
        Items::Lines | Items::One => format!("call{more}{close}"),
    };
    let gbnf = format!(
        "root ::= {} {body}\n\
         call ::= {}\n\
         ws ::= {WS_BODY}\n{rules}",
        lit(shape.open),
        alts.join(" | "),
    );
    Ok(Some(Plan::calls(gbnf, &req.choice, shape.lazy_start())))
}

/// The array of calls at the start of `rest` (after whitespace): its calls (one or more, each
/// item's by `item`) and the length of `rest` it spans. None when it is not an array of calls.
pub(super) fn read_array(
    rest: &str,
    item: impl Fn(&Value) -> Option<ToolCall>,
) -> Option<(Vec<ToolCall>, usize)> {
    let (v, used) = json_prefix(rest)?;
    let items = v.as_array().filter(|a| !a.is_empty())?;
    let calls = items.iter().map(item).collect::<Option<Vec<_>>>()?;
    Some((calls, used))
}

/// How far streaming has read the array of calls at the start of `rest`: the calls of its
/// whole items (`item`'s) and, after them, the call an item still open makes so far
/// (`open_item`'s: None where a call is begun only once its item is whole). Whole when the
/// array is (`read_array`'s reading).
pub(super) fn read_array_partial(
    rest: &str,
    item: impl Fn(&Value) -> Option<ToolCall>,
    open_item: impl Fn(&Json, Option<&partial::Memo>) -> Option<ToolCall>,
    memo: &mut partial::Memo,
) -> BlockStep {
    let r = partial::read_on(rest, memo);
    let (whole, last): (Vec<&Value>, Option<&Json>) = match &r.json {
        Json::Whole(Value::Array(a), _) => (a.iter().collect(), None),
        Json::Open(Open::Arr(items)) => {
            let whole: Vec<&Value> = items
                .iter()
                .map_while(|i| match i {
                    Json::Whole(v, _) => Some(v),
                    _ => None,
                })
                .collect();
            (whole, items.get(items.len().max(1) - 1))
        }
        _ => (Vec::new(), None),
    };
    let mut begun: Vec<ToolCall> = whole.iter().map_while(|v| item(v)).collect();
    if begun.len() < whole.len() {
        // an item that is not a call: the array will not be read. The call streaming began
        // for it while it was open (its name whole, its arguments not an object or not the
        // tool's) stays, so that nothing sent is taken back.
        let bad = whole[begun.len()];
        begun.extend(open_item(&partial::read(&bad.to_string()).json, None));
        return BlockStep::Broken(begun);
    }
    if let Json::Whole(..) = r.json {
        return match read_array(rest, item) {
            Some((calls, used)) => BlockStep::Whole(calls, used),
            None => BlockStep::Broken(begun),
        };
    }
    if let Some(open) = last.filter(|j| !matches!(j, Json::Whole(..))) {
        begun.extend(open_item(open, Some(memo)));
    }
    if r.broken {
        BlockStep::Broken(begun)
    } else {
        BlockStep::Open(begun)
    }
}

/// The block whose opening ends right before `rest`: its calls and the length of `rest`
/// through the closing tag (or to the end of the text, where it is missing).
fn read_block(rest: &str, shape: &Shape) -> Option<(Vec<ToolCall>, usize)> {
    let (calls, used) = match shape.items {
        Items::Array => read_array(rest, |v| shape.call(v))?,
        Items::Lines | Items::One => read_objects(rest, shape)?,
    };
    let Some(close) = shape.close else {
        return Some((calls, used));
    };
    let after_ws = rest[used..].trim_start();
    if let Some(after) = after_ws.strip_prefix(close) {
        Some((calls, rest.len() - after.len()))
    } else if after_ws.is_empty() {
        Some((calls, rest.len()))
    } else {
        None
    }
}

/// Where the call object after `tail` (the text after one) starts in it, for a shape whose
/// calls are bare objects: after whitespace and a comma or not (`Ok(None)`: no object comes
/// next; `Err`: a comma that no object follows).
fn next_object(tail: &str, shape: &Shape) -> Result<Option<usize>, ()> {
    if shape.items != Items::Lines {
        return Ok(None);
    }
    let a = tail.trim_start();
    let comma = a.strip_prefix(',').map(str::trim_start);
    let next = comma.unwrap_or(a);
    if next.starts_with('{') {
        Ok(Some(tail.len() - next.len()))
    } else if comma.is_some() {
        Err(())
    } else {
        Ok(None)
    }
}

/// The bare call objects at the start of `rest` (one, or for `Items::Lines` one or more) and
/// the length of `rest` they span. None when they are not calls.
fn read_objects(rest: &str, shape: &Shape) -> Option<(Vec<ToolCall>, usize)> {
    let mut calls = Vec::new();
    let mut at = 0;
    loop {
        let (v, used) = json_prefix(&rest[at..])?;
        calls.push(shape.call(&v)?);
        at += used;
        match next_object(&rest[at..], shape).ok()? {
            Some(skip) => at += skip,
            None => return Some((calls, at)),
        }
    }
}

/// How far streaming has read the bare call objects at the start of `rest` (`read_objects`'s
/// reading once whole); the closing tag after them is `closed`'s to read.
fn read_objects_partial(rest: &str, shape: &Shape, memo: &mut partial::Memo) -> BlockStep {
    let begun = |j: &Json, memo| begun_call_keyed(j, shape.name_key, shape.args_key, memo);
    let mut calls = Vec::new();
    let mut at = 0;
    loop {
        let r = partial::read_on(&rest[at..], memo);
        let Json::Whole(v, used) = &r.json else {
            calls.extend(begun(&r.json, Some(memo)));
            return if r.broken {
                BlockStep::Broken(calls)
            } else {
                BlockStep::Open(calls)
            };
        };
        let Some(call) = shape.call(v) else {
            // not a call: the call streaming began for it while it was open stays
            calls.extend(begun(&partial::read(&v.to_string()).json, None));
            return BlockStep::Broken(calls);
        };
        calls.push(call);
        at += used;
        let tail = &rest[at..];
        let a = tail.trim_start();
        if shape.items == Items::Lines && a.strip_prefix(',').unwrap_or(a).trim_start().is_empty() {
            // a comma or an object may come yet
            return BlockStep::Open(calls);
        }
        match next_object(tail, shape) {
            Ok(Some(skip)) => at += skip,
            Err(()) => return BlockStep::Broken(calls),
            Ok(None) => return BlockStep::Whole(calls, at),
        }
    }
}

/// Content is the text with the well-formed blocks taken out (its trailing whitespace
/// trimmed; malformed blocks stay in it), unwrapped from the shape's reply tags.
pub(super) fn parse(text: &str, req: Option<&ToolRequest>, shape: &Shape) -> Parsed {
    let mut p = parse_blocks(text, req, &[shape.open], |after| read_block(after, shape));
    if let Some(tags) = shape.reply {
        p.content = unwrap_reply(&p.content, tags, false);
    }
    p
}

/// How far streaming has read the block whose opening ends right before `rest`.
fn read_block_partial(rest: &str, shape: &Shape, memo: &mut partial::Memo) -> BlockStep {
    let step = match shape.items {
        Items::Array => read_array_partial(
            rest,
            |v| shape.call(v),
            |open, memo| begun_call_keyed(open, shape.name_key, shape.args_key, memo),
            memo,
        ),
        Items::Lines | Items::One => read_objects_partial(rest, shape, memo),
    };
    match (step, shape.close) {
        (BlockStep::Whole(calls, used), Some(close)) => {
            let after_ws = rest[used..].trim_start();
            if after_ws.starts_with(close) {
                match read_block(rest, shape) {
                    Some((calls, used)) => BlockStep::Whole(calls, used),
                    None => BlockStep::Broken(calls),
                }
            } else if close.starts_with(after_ws) {
                BlockStep::Open(calls)
            } else {
                BlockStep::Broken(calls)
            }
        }
        (step, _) => step,
    }
}

/// Content up to the first opening, less a tail that may be the start of one, and less
/// trailing whitespace (which `parse` trims when a block follows it), unwrapped from the reply
/// tags as far as that is known; the calls begun.
pub(super) fn parse_partial(
    text: &str,
    req: Option<&ToolRequest>,
    shape: &Shape,
    from: &mut Blocks,
) -> Parsed {
    let read = |after: &str, memo: &mut partial::Memo| read_block_partial(after, shape, memo);
    let mut p = parse_blocks_partial(text, req, &[shape.open], read, from);
    if let Some(tags) = shape.reply {
        p.content = unwrap_reply(&p.content, tags, true);
    }
    p
}

/// A reply without its wrapper `(open, close)`: where it starts with `open` (after
/// whitespace), the text after it with the first `close` taken out. `partial`: `reply` is a
/// prefix of the finished reply, and what is given is a prefix of what the finished one gives
/// (whitespace or a start of `open` before the reply, or a tail that may be the start of
/// `close`, is held back).
fn unwrap_reply(reply: &str, (open, close): (&str, &str), partial: bool) -> String {
    let t = reply.trim_start();
    let Some(body) = t.strip_prefix(open) else {
        return if partial && open.starts_with(t) {
            String::new()
        } else {
            reply.to_string()
        };
    };
    match body.find(close) {
        Some(i) => format!("{}{}", &body[..i], &body[i + close.len()..]),
        None if partial => {
            let held = (1..close.len())
                .filter(|&n| body.ends_with(&close[..n]))
                .max()
                .unwrap_or(0);
            body[..body.len() - held].to_string()
        }
        None => body.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_util::*;
    use super::super::{Format, ToolChoice, Trigger};
    use super::*;
    use serde_json::Map;

    const SHAPES: [&Shape; 9] = [
        &NEMOTRON_V2,
        &COMMAND_R7B,
        &COHERE2MOE,
        &GRANITE,
        &APRIEL,
        &FIREFUNCTION_V2,
        &MINIMAX_M1,
        &GIGACHAT_V3,
        &GIGACHAT_V31,
    ];

    /// One call object as a model of `shape` writes it (its number first, where it has one).
    fn object(shape: &Shape, number: usize, name: &str, args: &Value) -> Value {
        let mut o = Map::new();
        if let Some(k) = shape.number_key {
            o.insert(k.into(), Value::from(number.to_string()));
        }
        o.insert(shape.name_key.into(), Value::from(name));
        o.insert(shape.args_key.into(), args.clone());
        Value::Object(o)
    }

    /// A block of the calls' objects, each in the layout `layout` of `layouts`; in an array,
    /// `sep` after the opening, between the items and before the closing bracket (the bare
    /// objects' layout is fixed: `Shape::block`'s).
    fn block(shape: &Shape, items: &[Value], layout: usize, sep: &str) -> String {
        let items: Vec<String> = items.iter().map(|v| layouts(v)[layout].clone()).collect();
        if shape.items != Items::Array {
            return shape.block(&items);
        }
        format!(
            "{}[{sep}{}{sep}]{}",
            shape.open,
            items.join(&format!(",{sep}")),
            shape.close.unwrap_or("")
        )
    }

    /// Random tools and calls, every shape: the grammar takes the blocks (several layouts),
    /// `parse` gives the calls back; wrong names, broken arguments, extra calls, a missing
    /// number or closing tag are refused.
    #[test]
    fn json_list_grammar_accepts_calls_and_refuses_wrong_ones() {
        let mut rng = Rng(0x1157_0001);
        for round in 0..96 {
            let shape = SHAPES[round % SHAPES.len()];
            let format = Format::JsonList(shape);
            let r = random_req(&mut rng, round / SHAPES.len(), round % 8 >= 4);
            let (p, g) = checked_plan(format, &r, Trigger::Word(shape.open.into()));
            let mut calls = random_calls(&mut rng, &r);
            if shape.items == Items::One {
                calls.truncate(1);
            }
            let items: Vec<Value> = calls
                .iter()
                .enumerate()
                .map(|(i, (t, a))| object(shape, i, &t.name, a))
                .collect();
            for layout in 0..4 {
                let sep = ["", "\n    ", " ", "\n"][layout];
                let text = block(shape, &items, layout, sep);
                assert!(
                    g.accepts_str(&text),
                    "round {round}: refused {text}\n{}",
                    p.gbnf
                );
                let parsed = format.parse(&text, Some(&r));
                assert_eq!(parsed.content, "");
                assert_eq!(parsed.tool_calls.len(), calls.len());
                for (c, (t, a)) in parsed.tool_calls.iter().zip(&calls) {
                    assert_call(c, &t.name, a, None);
                }
                check_text_around(format, &r, &g, &text, calls.len());
                check_stream_calls(format, &text, &r);
                if let Some(close) = shape.close {
                    assert!(!g.accepts_str(text.strip_suffix(close).unwrap()));
                }
            }
            assert!(!g.accepts_str(""));
            assert!(!g.accepts_str(&format!("{}[]{}", shape.open, shape.close.unwrap_or(""))));
            let (t, a) = &calls[0];
            let one = object(shape, 0, &t.name, a);
            assert!(g.accepts_str(&block(shape, std::slice::from_ref(&one), 1, "")));
            let two = block(shape, &[one.clone(), one.clone()], 1, "");
            assert_eq!(g.accepts_str(&two), r.parallel && shape.items != Items::One);
            // a call object alone, not in an array; an array where the objects are bare
            let close = shape.close.unwrap_or("");
            if shape.items == Items::Array {
                assert!(!g.accepts_str(&format!("{}{one}{close}", shape.open)));
            } else {
                let listed = Value::Array(vec![one.clone()]).to_string();
                assert!(!g.accepts_str(&shape.block(&[listed])));
            }
            if shape.number_key.is_some() {
                let mut o = one.as_object().unwrap().clone();
                o.shift_remove("tool_call_id");
                assert!(!g.accepts_str(&block(shape, &[Value::Object(o)], 1, "")));
            }
            let unknown = object(shape, 0, "no_such_tool", &json!({}));
            assert!(!g.accepts_str(&block(shape, &[unknown], 1, "")));
            if let Some((o, oa)) = other_tool(&mut rng, &r) {
                let b = block(shape, &[object(shape, 0, &o.name, &oa)], 1, "");
                assert!(!g.accepts_str(&b), "other tool taken: {b}");
            }
            check_broken_args(&mut rng, &g, t, a, |bad| {
                block(shape, &[object(shape, 0, &t.name, bad)], 1, "")
            });
        }
    }

    #[test]
    fn json_list_parse_cases() {
        let r = f_req(true);
        let n = &NEMOTRON_V2;
        let c = &COMMAND_R7B;
        let cases: Vec<(&Shape, &str, &str, Vec<ToolCall>)> = vec![
            (
                n,
                "Hi <TOOLCALL>[{\"name\": \"f\", \"arguments\": {\"a\": 1}}, {\"name\": \"g\", \"arguments\": {}}]</TOOLCALL>",
                "Hi",
                vec![call("f", r#"{"a":1}"#), call("g", "{}")],
            ),
            // unclosed at the end: read
            (n, "<TOOLCALL>[{\"name\": \"f\", \"arguments\": {}}]", "", vec![call("f", "{}")]),
            // keys in any order, more keys
            (
                n,
                "<TOOLCALL>[{\"arguments\": {}, \"id\": 3, \"name\": \"f\"}]</TOOLCALL>",
                "",
                vec![call("f", "{}")],
            ),
            // not an array of calls, text before the closing tag: content
            (
                n,
                "<TOOLCALL>{\"name\": \"f\", \"arguments\": {}}</TOOLCALL>",
                "<TOOLCALL>{\"name\": \"f\", \"arguments\": {}}</TOOLCALL>",
                vec![],
            ),
            (
                n,
                "<TOOLCALL>[{\"name\": \"f\", \"arguments\": {}}] x</TOOLCALL>",
                "<TOOLCALL>[{\"name\": \"f\", \"arguments\": {}}] x</TOOLCALL>",
                vec![],
            ),
            (n, "<TOOLCALL>[]</TOOLCALL>", "<TOOLCALL>[]</TOOLCALL>", vec![]),
            (
                n,
                "<TOOLCALL>[{\"name\": \"f\", \"arguments\": {}}, 1]</TOOLCALL>",
                "<TOOLCALL>[{\"name\": \"f\", \"arguments\": {}}, 1]</TOOLCALL>",
                vec![],
            ),
            // Cohere: the number is not the id; the reply is unwrapped
            (
                c,
                "<|START_ACTION|>[\n    {\"tool_call_id\": \"0\", \"tool_name\": \"f\", \"parameters\": {\"x\": \"y\"}}\n]<|END_ACTION|>",
                "",
                vec![call("f", r#"{"x":"y"}"#)],
            ),
            (c, "<|START_RESPONSE|>Hello <b><|END_RESPONSE|>", "Hello <b>", vec![]),
            (c, " \n<|START_RESPONSE|>Hello", "Hello", vec![]),
            (c, "<|START_RESPONSE|>A<|END_RESPONSE|> B", "A B", vec![]),
            (c, "Hello <|START_RESPONSE|>", "Hello <|START_RESPONSE|>", vec![]),
            (&COHERE2MOE, "<|START_TEXT|>Hi<|END_TEXT|>", "Hi", vec![]),
            (&GRANITE, "<|tool_call|>[{\"name\": \"f\", \"arguments\": {}}] then", " then", vec![call("f", "{}")]),
            (
                &APRIEL,
                "Sure.\n<tool_calls>[{\"name\": \"f\", \"arguments\": {\"a\": 1}, \"id\": \"call_1\"}]</tool_calls>",
                "Sure.",
                vec![call("f", r#"{"a":1}"#)],
            ),
            (
                &FIREFUNCTION_V2,
                "Sure. functools[{\"name\": \"f\", \"arguments\": {}}, {\"name\": \"g\", \"arguments\": {\"b\": \"x\"}}]",
                "Sure.",
                vec![call("f", "{}"), call("g", r#"{"b":"x"}"#)],
            ),
            (&FIREFUNCTION_V2, "import functools", "import functools", vec![]),
            // MiniMax M1: the template's objects a line, or with commas as the grammar writes
            // them; a comma with no object after it, or no line break after the tag: text
            (
                &MINIMAX_M1,
                "Hi<tool_calls>\n{\"name\": \"f\", \"arguments\": {\"a\": 1}}\n{\"name\": \"g\", \"arguments\": {}}\n</tool_calls>",
                "Hi",
                vec![call("f", r#"{"a":1}"#), call("g", "{}")],
            ),
            (
                &MINIMAX_M1,
                "<tool_calls>\n{\"name\": \"f\", \"arguments\": {}},\n{\"name\": \"f\", \"arguments\": {}}\n</tool_calls> ok",
                " ok",
                vec![call("f", "{}"), call("f", "{}")],
            ),
            (
                &MINIMAX_M1,
                "<tool_calls>\n{\"name\": \"f\", \"arguments\": {}},\n</tool_calls>",
                "<tool_calls>\n{\"name\": \"f\", \"arguments\": {}},\n</tool_calls>",
                vec![],
            ),
            (
                &MINIMAX_M1,
                "<tool_calls>{\"name\": \"f\", \"arguments\": {}}</tool_calls>",
                "<tool_calls>{\"name\": \"f\", \"arguments\": {}}</tool_calls>",
                vec![],
            ),
            // GigaChat: one object, then text; an array is no call
            (
                &GIGACHAT_V3,
                "Sure.<|message_sep|>\n\nfunction call<|role_sep|>\n{\"name\": \"f\", \"arguments\": {\"a\": [1]}}",
                "Sure.",
                vec![call("f", r#"{"a":[1]}"#)],
            ),
            (
                &GIGACHAT_V31,
                "<|function_call|>{\"name\": \"f\", \"arguments\": {}} {\"name\": \"g\", \"arguments\": {}}",
                " {\"name\": \"g\", \"arguments\": {}}",
                vec![call("f", "{}")],
            ),
            (
                &GIGACHAT_V31,
                "<|function_call|>[{\"name\": \"f\", \"arguments\": {}}]",
                "<|function_call|>[{\"name\": \"f\", \"arguments\": {}}]",
                vec![],
            ),
        ];
        for (shape, text, content, calls) in &cases {
            let f = Format::JsonList(shape);
            check_parsed(&f.parse(text, Some(&r)), content, calls, text);
            check_partial_prefixes(f, text, Some(&r));
        }
        // without tools the reply is still unwrapped, and the calls' markup left as it is
        let f = Format::JsonList(c);
        let t = "<|START_RESPONSE|>Hi<|END_RESPONSE|>";
        assert_eq!(f.parse(t, None).content, "Hi");
        let t = "<|START_ACTION|>[{\"tool_call_id\": \"0\", \"tool_name\": \"f\", \"parameters\": {}}]<|END_ACTION|>";
        check_verbatim(f, t, &r.tools);
        // streamed: a call begun once its name is whole, its arguments as written; the reply
        // without its wrapper as far as it is known
        for (t, content, calls) in [
            ("<|START_ACTION|>[{\"tool_call_id\": \"0\", \"tool_na", "", vec![]),
            (
                "<|START_ACTION|>[{\"tool_call_id\": \"0\", \"tool_name\": \"f\", \"parameters\": {\"a\": [1, \"x",
                "",
                vec![call("f", r#"{"a":[1,"x"#)],
            ),
            (
                "<|START_ACTION|>[{\"tool_call_id\": \"0\", \"tool_name\": \"f\", \"parameters\": {}}, {\"tool_name\": \"g\"",
                "",
                vec![call("f", "{}"), call("g", "")],
            ),
            ("<|START_RESP", "", vec![]),
            ("<|START_RESPONSE|>Hel", "Hel", vec![]),
            ("<|START_RESPONSE|>Hello<|END_RES", "Hello", vec![]),
            ("<|START_RESPONSE|>Hello<|END_RESPONSE|>", "Hello", vec![]),
        ] {
            check_parsed(&f.parse_partial(t, Some(&r)), content, &calls, t);
        }
    }

    /// The shapes' pieces in random texts: what streaming sends is a prefix of what the
    /// finished text gives, and is never taken back.
    #[test]
    fn json_list_partial_is_prefix_of_parse() {
        let r = f_req(true);
        let mut rng = Rng(0x1157_0002);
        let (mut checked, mut calls) = (0usize, 0usize);
        for round in 0..2400 {
            let shape = SHAPES[round % SHAPES.len()];
            let f = Format::JsonList(shape);
            let (rs, re) = shape.reply.unwrap_or(("<x>", "</x>"));
            let item = |name: &str, args: &str| {
                object(shape, 0, name, &serde_json::from_str(args).unwrap()).to_string()
            };
            let frags = [
                "a".to_string(),
                " ".into(),
                "\n".into(),
                "<".into(),
                "[".into(),
                "]".into(),
                ", ".into(),
                "{".into(),
                "é".into(),
                shape.open.into(),
                shape.close.unwrap_or("").into(),
                rs.into(),
                re.into(),
                shape.open[..3].into(),
                rs[..3].into(),
                item("f", "{}"),
                item("g", r#"{"a": [1, "<TOOLCALL>"]}"#),
                item("zz", "{}"),
                format!("{}[{}]", shape.open, item("f", r#"{"b": true}"#)),
                format!(
                    "{}[{}, {}]{}",
                    shape.open,
                    item("g", "{}"),
                    item("f", r#"{"c": "é"}"#),
                    shape.close.unwrap_or("")
                ),
            ];
            let t: String = (0..rng.below(9))
                .map(|_| frags[rng.below(frags.len())].as_str())
                .collect();
            for req in [Some(&r), None] {
                let (full, n) = check_partial_prefixes(f, &t, req);
                calls += full.tool_calls.len();
                checked += n;
            }
        }
        assert!(checked > 20_000 && calls > 300, "{checked} {calls}");
    }

    /// The bare objects' grammars write the layout llama.cpp reads: MiniMax M1's objects a line
    /// with a comma between them (not the template's bare line breaks, which llama.cpp
    /// refuses), the tag's line break and the one before the closing tag; GigaChat's one
    /// object right after its tag.
    #[test]
    fn json_list_bare_objects_are_written_as_llama_cpp_reads_them() {
        let r = f_req(true);
        let f = r#"{"name": "f", "arguments": {}}"#;
        let g = r#"{"name": "g", "arguments": {}}"#;
        let m1 = grammar(&plan(&r, &MINIMAX_M1).unwrap().unwrap());
        let gc = grammar(&plan(&r, &GIGACHAT_V31).unwrap().unwrap());
        let sep = "<|message_sep|>\n\nfunction call<|role_sep|>\n";
        let g3 = grammar(&plan(&r, &GIGACHAT_V3).unwrap().unwrap());
        for (gr, text, ok) in [
            (&m1, format!("<tool_calls>\n{f},\n{g}\n</tool_calls>"), true),
            (&m1, format!("<tool_calls>\n{f}\n</tool_calls>"), true),
            (&m1, format!("<tool_calls>\n{f}\n{g}\n</tool_calls>"), false),
            (&m1, format!("<tool_calls>{f}\n</tool_calls>"), false),
            (&m1, format!("<tool_calls>\n{f}</tool_calls>"), false),
            (&gc, format!("<|function_call|>{f}"), true),
            (&gc, format!("<|function_call|> {f}"), false),
            (&gc, format!("<|function_call|>{f}, {g}"), false),
            (&g3, format!("{sep}{g}"), true),
            (&g3, format!("{sep}{f}{sep}{g}"), false),
        ] {
            assert_eq!(gr.accepts_str(&text), ok, "{text:?}");
        }
    }

    /// FireFunction's template shows the offered tools' specs (its `functions`) where a call
    /// may be made; no other shape's reads a variable.
    #[test]
    fn json_list_firefunction_shows_its_functions() {
        let mut rng = Rng(0x1157_0003);
        for round in 0..24 {
            let r = random_req(&mut rng, round, round % 2 == 0);
            let vars = template_variables(&r, &FIREFUNCTION_V2);
            let [("functions", Value::String(text))] = vars.as_slice() else {
                panic!("{vars:?}");
            };
            let specs: Value = serde_json::from_str(text).unwrap();
            let specs = specs.as_array().unwrap();
            assert_eq!(specs.len(), r.tools.len());
            for (s, t) in specs.iter().zip(&r.tools) {
                assert_eq!(s["name"], t.name.as_str());
                assert_eq!(s["parameters"], t.parameters);
            }
            for shape in SHAPES.iter().filter(|s| **s != &FIREFUNCTION_V2) {
                assert!(template_variables(&r, shape).is_empty());
            }
            let none = ToolRequest {
                choice: ToolChoice::None,
                ..r
            };
            assert!(template_variables(&none, &FIREFUNCTION_V2).is_empty());
        }
    }

    #[test]
    fn json_list_plan_none_and_errors() {
        let f = tool("f", json!({"type": "object"}));
        for shape in SHAPES {
            let none = req(vec![f.clone()], ToolChoice::None, false);
            assert_eq!(plan(&none, shape).unwrap(), None);
            let e = plan(
                &req(vec![f.clone()], ToolChoice::Function("g".into()), false),
                shape,
            )
            .unwrap_err();
            assert!(e.contains("`g`"), "{e}");
        }
    }

    /// Of llama.cpp's templates, exactly these teach a JSON array of calls in tags.
    #[test]
    fn json_list_detects_the_templates() {
        let want = [
            (
                "NVIDIA-Nemotron-Nano-v2.jinja",
                Format::JsonList(&NEMOTRON_V2),
            ),
            (
                "CohereForAI-c4ai-command-r7b-12-2024-tool_use.jinja",
                Format::JsonList(&COMMAND_R7B),
            ),
            ("Cohere2MoE.jinja", Format::JsonList(&COHERE2MOE)),
            (
                "ibm-granite-granite-3.3-2B-Instruct.jinja",
                Format::JsonList(&GRANITE),
            ),
            ("unsloth-Apriel-1.5.jinja", Format::JsonList(&APRIEL)),
            (
                "Apriel-1.6-15b-Thinker-fixed.jinja",
                Format::JsonList(&APRIEL),
            ),
            (
                "fireworks-ai-llama-3-firefunction-v2.jinja",
                Format::JsonList(&FIREFUNCTION_V2),
            ),
            ("MiniMax-M1.jinja", Format::JsonList(&MINIMAX_M1)),
            ("GigaChat3-10B-A1.8B.jinja", Format::JsonList(&GIGACHAT_V3)),
            (
                "GigaChat3.1-10B-A1.8B.jinja",
                Format::JsonList(&GIGACHAT_V31),
            ),
        ];
        check_detect_all(|t| detect(t).map(Format::JsonList), &want);
    }
}
