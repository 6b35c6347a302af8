//! The XML call formats: calls in tagged blocks after the reply's text, each call a name and
//! its parameters, each parameter a name and a raw text. Their tags differ (`Shape`), their
//! parameters' grammar and values are `xml_args`':
//!
//! - Qwen3-Coder XML (Qwen3-Coder, Qwen 3.5, Nemotron Nano 3, StepFun 3.5; llama.cpp's
//!   `common/parsers/qwen3-coder.cpp`): one call a block,
//!   `<tool_call>\n<function=NAME>\n` (`<parameter=K>\nV\n</parameter>\n`)* `</function>\n</tool_call>`,
//!   the value framed by a newline at each end. The templates write mappings and sequences with
//!   `tojson`, other values with `| string` (Python's `True`, `False`, `None`).
//! - Seed-OSS (ByteDance): one call a block,
//!   `<seed:tool_call>\n<function=NAME>\n` (`<parameter=K>V</parameter>\n`)* `</function>\n</seed:tool_call>`,
//!   the value unframed; non-strings written with `| string` (Python's spellings).
//! - MiniMax M2: all the calls in one block, `<minimax:tool_call>\n` then per call
//!   `<invoke name="NAME">\n` (`<parameter name="K">V</parameter>\n`)* `</invoke>\n`, then
//!   `</minimax:tool_call>`; non-strings as JSON (`tojson`).
//! - GLM 4.5 to 4.7: one call a block, `<tool_call>NAME` then
//!   (`<arg_key>K</arg_key><arg_value>V</arg_value>`)* and `</tool_call>`, no closing tag of
//!   the call's own; GLM 4.6 writes a newline after the name and after each tag pair (`newlines`),
//!   GLM 4.7 none. Non-strings as JSON.
//! - DeepSeek V3.2 and V4's DSML (llama.cpp's `common/parsers/deepseek.cpp`): all the calls in
//!   one block, `<｜DSML｜function_calls>\n` (V4: `tool_calls`) then per call
//!   `<｜DSML｜invoke name="NAME">\n` (`<｜DSML｜parameter name="K" string="B">V</｜DSML｜parameter>\n`)*
//!   `</｜DSML｜invoke>\n`, then the closing tag, nothing after it; `B` is `true` where the
//!   schema admits strings (the value raw), else `false` (JSON).
//! - MiniCPM5 (`common/parsers/minicpm5.cpp`): one call a block, no whitespace in it,
//!   `<function name="NAME">` (`<param name="K">V</param>`)* `</function>`; non-strings
//!   written with jinja's `{{ }}` (Python's spellings), strings holding `<`, `&` or a line
//!   break in `<![CDATA[...]]>`, which the reading takes off.
//! - Ling 3 (Bailing V3): GLM's tags, `<tool_call>NAME\n` (`<arg_key>K</arg_key>\n<arg_value>V</arg_value>`)*
//!   `\n</tool_call>`: a newline after the name and before the end, none between parameters.
//! - Tencent Hy3: all the calls in one block, `<tool_calls:opensource>\n`, then per call
//!   `<tool_call:opensource>NAME<tool_sep:opensource>\n` and GLM 4.6's parameters in
//!   `:opensource` tags, each followed by a newline, `</tool_call:opensource>\n`, then
//!   `</tool_calls:opensource>`. Non-strings as JSON.
//!
//! The chat templates show the tools themselves.
//!
//! # Plan (grammar)
//!
//! `Auto`: lazy from the block's opening tag; `Required` / `Function(N)`: the whole output, no
//! text before the first block. One call, or with `parallel` one or more (more blocks, or more
//! calls in MiniMax's one block). The parameters follow `xml_args` (schema order, raw strings,
//! JSON otherwise: the grammar makes the model write `true`, `false` and `null` as JSON).
//! Whitespace: a value is framed by exactly the template's text (Qwen's newlines, GLM 4.6's
//! newline between its tags); between the other tags, exactly the template's text where
//! llama.cpp's reader takes only that (`Syntax::sep`: Qwen, GLM, Ling 3, Hy3, DSML, MiniCPM5;
//! nothing after DSML's block), else nothing, a space, or one or two newlines and an
//! indentation; between blocks and after the last one, any of those (GLM's name follows its
//! opening tag right away). A tool or parameter name with a character its tag cannot carry is refused
//! by the plan.
//!
//! # Parse
//!
//! A block is read where its opening tag is followed by a call's tag and name, parameters and
//! the call's end (any whitespace between tags), then the block's closing tag (or, where the
//! call has a closing tag of its own, the end of the output), and every NAME is a tool of the
//! request; else the opening tag stays in the content and the text after it is read on. A
//! value is the text up to the first parameter closing tag followed by another parameter or
//! the call's end, less the template's framing; it is read by its schema's types (raw where
//! strings are admitted, JSON otherwise, and, where the format writes Python's spellings,
//! `True`/`False`/`None` where the schema admits the type and no string). The parameters are
//! taken in any order.
//!
//! Streaming sends the content before the first block, and the calls as they are written: each
//! once its name is whole, its arguments (`xml_args::StreamedArgs`) growing by whole
//! parameters, each once its end is sure whatever follows (`value_len_partial`), a string-only
//! parameter's characters as they come, and `}` at the call's end. A parameter given again is
//! read past (its first value is the one `parse` keeps) and the parameters after it stream on.

use super::partial;
use super::xml_args::{arguments, tail_len, ws_len, Params, StreamedArgs, Syntax};
use super::{
    allowed_tools, json_prefix, offered, parse_blocks, parse_blocks_partial, BlockStep, Blocks,
    Format, LazyStart, Parsed, Plan, ToolCall, ToolRequest,
};
use memchr::memmem;
use muser_jsonschema::gbnf_literal as literal;

/// The tags of one format of the family.
pub(super) struct Shape {
    /// How a parameter is written (and the format's name in messages).
    pub syntax: Syntax,
    /// The block's opening and closing tags.
    pub open: &'static str,
    pub close: &'static str,
    /// The text before a call's name; empty where the name follows `open` right away (GLM).
    pub function: &'static str,
    /// The text after a call's name; empty where the name ends at whitespace or `<` (GLM).
    pub name_end: &'static str,
    /// Attributes a call's tag carries after its name (Kimi K3's ` index="N"`): their GBNF,
    /// which the grammar writes after `name_end`, and the text that ends the tag, up to which
    /// the reading passes over them (any text without a line break); both empty for the others.
    pub call_attrs: &'static str,
    pub tag_end: &'static str,
    /// What the grammar writes after the call's name (and `name_end`) where it is not the
    /// separator written after each parameter (Ling 3 writes a newline there and none between
    /// its parameters); None: that separator.
    pub after_name: Option<&'static str>,
    /// What the grammar writes after the last parameter, before the call's end (Ling 3's
    /// newline before `</tool_call>`).
    pub before_end: &'static str,
    /// A call's closing tag; empty where the block's closing tag ends the call (GLM).
    pub function_close: &'static str,
    /// The text before a parameter's name, and after it.
    pub param: &'static str,
    pub param_name_end: &'static str,
    /// The tags, one of which opens a value after its name's end and optional whitespace
    /// (GLM's `<arg_value>`, DSML's `string="true">` or `string="false">`); none where the
    /// value follows the name's end right away.
    pub value_open: &'static [&'static str],
    /// A value's closing tag.
    pub param_close: &'static str,
    /// One newline at each end of a value is the template's framing, not the value's (Qwen).
    pub framed: bool,
    /// A value wholly in `<![CDATA[` and `]]>` is the text between them (MiniCPM5's template
    /// writes a string with `<`, `&` or a line break so).
    pub cdata: bool,
    /// All the calls of a reply in one block (MiniMax), not one block a call.
    pub many: bool,
    /// The grammar ends the output at the block's closing tag, no whitespace after it (DSML:
    /// llama.cpp's reader takes none).
    pub ends_at_close: bool,
    /// The markup llama.cpp preserves and the vocabularies may make tokens.
    pub markup: &'static [&'static str],
}

impl Shape {
    /// The tag that ends a call's parameters: its own closing tag, or the block's.
    fn call_end(&self) -> &'static str {
        if self.function_close.is_empty() {
            self.close
        } else {
            self.function_close
        }
    }

    /// Where a lazy grammar starts: the block's opening tag.
    pub fn lazy_start(&self) -> LazyStart {
        LazyStart::Word(self.open)
    }
}

/// Characters the tags with `>` after a name cannot carry in it.
const ANGLE_STOPS: &[char] = &['>', '\n', '\r'];
/// Characters a quoted name (`name="K"`) cannot carry.
const QUOTE_STOPS: &[char] = &['"', '\n', '\r'];
/// Characters a name between tags (GLM's `<arg_key>K</arg_key>`) cannot carry.
const TAG_STOPS: &[char] = &['<', '\n', '\r'];

/// Qwen3-Coder's `<parameter=K>\nV\n</parameter>`.
pub(super) const QWEN: Shape = Shape {
    syntax: Syntax {
        format: "Qwen XML",
        prefix: "qwen",
        open: |k, _, _| format!("<parameter={k}>\n"),
        close: "\n</parameter>",
        end_tag: "</parameter>",
        name_stops: ANGLE_STOPS,
        python: true,
        sep: Some("\n"),
        required_first: false,
    },
    open: "<tool_call>",
    close: "</tool_call>",
    function: "<function=",
    name_end: ">",
    call_attrs: "",
    tag_end: "",
    after_name: None,
    before_end: "",
    function_close: "</function>",
    param: "<parameter=",
    param_name_end: ">",
    value_open: &[],
    param_close: "</parameter>",
    framed: true,
    cdata: false,
    many: false,
    ends_at_close: false,
    // llama.cpp preserves the first two; the tags are there for vocabularies that make them
    // tokens.
    markup: &[
        "<tool_call>",
        "</tool_call>",
        "<function=",
        "</function>",
        "<parameter=",
        "</parameter>",
    ],
};

/// Seed-OSS's `<parameter=K>V</parameter>`.
pub(super) const SEED: Shape = Shape {
    syntax: Syntax {
        format: "Seed-OSS",
        prefix: "seed",
        open: |k, _, _| format!("<parameter={k}>"),
        close: "</parameter>",
        sep: None,
        // (llama.cpp's reader refuses an optional parameter before a required one)
        required_first: true,
        ..QWEN.syntax
    },
    open: "<seed:tool_call>",
    close: "</seed:tool_call>",
    framed: false,
    markup: &[
        "<seed:tool_call>",
        "</seed:tool_call>",
        "<function=",
        "</function>",
        "<parameter=",
        "</parameter>",
    ],
    ..QWEN
};

/// MiniMax M2's `<invoke name="NAME">` calls and `<parameter name="K">V</parameter>`, each tag on
/// its own line.
pub(super) const MINIMAX_M2: Shape = Shape {
    syntax: Syntax {
        format: "MiniMax M2",
        prefix: "minimax",
        open: |k, _, _| format!("<parameter name=\"{k}\">"),
        close: "</parameter>",
        end_tag: "</parameter>",
        name_stops: QUOTE_STOPS,
        python: false,
        // (each tag on its own line, exactly as the template writes them: llama.cpp reads no
        // call with other whitespace between them)
        sep: Some("\n"),
        // (llama.cpp's reader refuses an optional parameter before a required one)
        required_first: true,
    },
    open: "<minimax:tool_call>",
    close: "</minimax:tool_call>",
    function: "<invoke name=\"",
    name_end: "\">",
    call_attrs: "",
    tag_end: "",
    after_name: None,
    before_end: "",
    function_close: "</invoke>",
    param: "<parameter name=\"",
    param_name_end: "\">",
    value_open: &[],
    param_close: "</parameter>",
    framed: false,
    cdata: false,
    many: true,
    // (nothing after the block: llama.cpp's reader takes no whitespace there)
    ends_at_close: true,
    markup: &[
        "<minimax:tool_call>",
        "</minimax:tool_call>",
        "<invoke name=",
        "</invoke>",
        "<parameter name=",
        "</parameter>",
    ],
};

const GLM_MARKUP: &[&str] = &[
    "<tool_call>",
    "</tool_call>",
    "<arg_key>",
    "</arg_key>",
    "<arg_value>",
    "</arg_value>",
];

/// GLM's `<tool_call>NAME<arg_key>K</arg_key><arg_value>V</arg_value></tool_call>`, with the
/// newlines of GLM 4.5 / 4.6 (`newlines`) or without them (GLM 4.7).
pub(super) const fn glm(newlines: bool) -> &'static Shape {
    if newlines {
        &GLM_NEWLINES
    } else {
        &GLM_TIGHT
    }
}

const GLM_TIGHT: Shape = Shape {
    syntax: Syntax {
        format: "GLM",
        prefix: "glm",
        open: |k, _, _| format!("<arg_key>{k}</arg_key><arg_value>"),
        close: "</arg_value>",
        end_tag: "</arg_value>",
        name_stops: TAG_STOPS,
        python: false,
        // (no whitespace between the tags: llama.cpp reads no call with a line break there)
        sep: Some(""),
        // (llama.cpp's reader refuses an optional parameter before a required one)
        required_first: true,
    },
    open: "<tool_call>",
    close: "</tool_call>",
    function: "",
    name_end: "",
    call_attrs: "",
    tag_end: "",
    after_name: None,
    before_end: "",
    function_close: "",
    param: "<arg_key>",
    param_name_end: "</arg_key>",
    value_open: &["<arg_value>"],
    param_close: "</arg_value>",
    framed: false,
    cdata: false,
    many: false,
    ends_at_close: false,
    markup: GLM_MARKUP,
};

/// GLM 4.6's: a newline after the name and after each parameter, exactly (llama.cpp reads no
/// call with a space there).
const GLM_NEWLINES: Shape = Shape {
    syntax: Syntax {
        open: |k, _, _| format!("<arg_key>{k}</arg_key>\n<arg_value>"),
        sep: Some("\n"),
        ..GLM_TIGHT.syntax
    },
    ..GLM_TIGHT
};

/// DeepSeek V3.2's DSML: `<｜DSML｜function_calls>` blocks of `<｜DSML｜invoke name="NAME">`
/// calls, `<｜DSML｜parameter name="K" string="true|false">V</｜DSML｜parameter>` (`true` where
/// the schema admits strings: the value raw, else JSON), each tag on its own line.
pub(super) const DSML_V32: Shape = Shape {
    syntax: Syntax {
        format: "DeepSeek DSML",
        prefix: "dsml",
        open: |k, s, _| format!("<｜DSML｜parameter name=\"{k}\" string=\"{s}\">"),
        close: "</｜DSML｜parameter>",
        end_tag: "</｜DSML｜parameter>",
        name_stops: QUOTE_STOPS,
        python: false,
        sep: Some("\n"),
        required_first: true,
    },
    open: "<｜DSML｜function_calls>",
    close: "</｜DSML｜function_calls>",
    function: "<｜DSML｜invoke name=\"",
    name_end: "\">",
    call_attrs: "",
    tag_end: "",
    after_name: None,
    before_end: "",
    function_close: "</｜DSML｜invoke>",
    param: "<｜DSML｜parameter name=\"",
    param_name_end: "\"",
    value_open: &["string=\"true\">", "string=\"false\">"],
    param_close: "</｜DSML｜parameter>",
    framed: false,
    cdata: false,
    many: true,
    ends_at_close: true,
    markup: &[
        "<｜DSML｜function_calls>",
        "</｜DSML｜function_calls>",
        "<｜DSML｜invoke",
        "</｜DSML｜invoke>",
        "<｜DSML｜parameter",
        "</｜DSML｜parameter>",
    ],
};

/// DeepSeek V4's DSML: V3.2's, its blocks `<｜DSML｜tool_calls>`.
pub(super) const DSML_V4: Shape = Shape {
    open: "<｜DSML｜tool_calls>",
    close: "</｜DSML｜tool_calls>",
    markup: &[
        "<｜DSML｜tool_calls>",
        "</｜DSML｜tool_calls>",
        "<｜DSML｜invoke",
        "</｜DSML｜invoke>",
        "<｜DSML｜parameter",
        "</｜DSML｜parameter>",
    ],
    ..DSML_V32
};

/// DeepSeek V3.2's DSML shape, or V4's (`v4`).
pub(super) const fn dsml(v4: bool) -> &'static Shape {
    if v4 {
        &DSML_V4
    } else {
        &DSML_V32
    }
}

/// MiniCPM5's `<function name="NAME"><param name="K">V</param></function>`, one call a block,
/// no whitespace between its tags; non-strings written with jinja's `{{ }}` (Python's
/// spellings), strings with `<`, `&` or a line break in CDATA.
pub(super) const MINICPM5: Shape = Shape {
    syntax: Syntax {
        format: "MiniCPM5",
        prefix: "minicpm",
        open: |k, _, _| format!("<param name=\"{k}\">"),
        close: "</param>",
        end_tag: "</param>",
        name_stops: QUOTE_STOPS,
        python: true,
        sep: Some(""),
        required_first: false,
    },
    open: "<function name=\"",
    close: "</function>",
    function: "",
    name_end: "\">",
    call_attrs: "",
    tag_end: "",
    after_name: None,
    before_end: "",
    function_close: "",
    param: "<param name=\"",
    param_name_end: "\">",
    value_open: &[],
    param_close: "</param>",
    framed: false,
    cdata: true,
    many: false,
    ends_at_close: false,
    markup: &["<function", "<param", "</function>", "</param>"],
};

/// Ling 3's (Bailing V3): GLM's tags, a newline after the name, none between the parameters,
/// a newline before `</tool_call>`.
pub(super) const LING3: Shape = Shape {
    syntax: Syntax {
        format: "Ling 3",
        prefix: "ling",
        sep: Some(""),
        ..GLM_NEWLINES.syntax
    },
    after_name: Some("\n"),
    before_end: "\n",
    markup: &[
        "<think>",
        "</think>",
        "<tool_call>",
        "</tool_call>",
        "<arg_key>",
        "</arg_key>",
        "<arg_value>",
        "</arg_value>",
        "<|role_end|>",
    ],
    ..GLM_TIGHT
};

/// Tencent Hy3's: all the calls in one block, `<tool_calls:opensource>\n`, then per call
/// `<tool_call:opensource>NAME<tool_sep:opensource>\n` (`<arg_key:opensource>K</arg_key:opensource>\n<arg_value:opensource>V</arg_value:opensource>\n`)*
/// `</tool_call:opensource>\n`, then `</tool_calls:opensource>` (MiniMax M2's one block, GLM's
/// tags).
pub(super) const HY3: Shape = Shape {
    syntax: Syntax {
        format: "Hy3",
        prefix: "hy",
        open: |k, _, _| {
            format!("<arg_key:opensource>{k}</arg_key:opensource>\n<arg_value:opensource>")
        },
        close: "</arg_value:opensource>",
        end_tag: "</arg_value:opensource>",
        name_stops: TAG_STOPS,
        sep: Some("\n"),
        ..MINIMAX_M2.syntax
    },
    open: "<tool_calls:opensource>",
    close: "</tool_calls:opensource>",
    function: "<tool_call:opensource>",
    name_end: "<tool_sep:opensource>",
    function_close: "</tool_call:opensource>",
    param: "<arg_key:opensource>",
    param_name_end: "</arg_key:opensource>",
    value_open: &["<arg_value:opensource>"],
    param_close: "</arg_value:opensource>",
    markup: &[
        "<think:opensource>",
        "</think:opensource>",
        "<tool_calls:opensource>",
        "</tool_calls:opensource>",
        "<tool_call:opensource>",
        "</tool_call:opensource>",
        "<tool_sep:opensource>",
        "<arg_key:opensource>",
        "</arg_key:opensource>",
        "<arg_value:opensource>",
        "</arg_value:opensource>",
    ],
    ..MINIMAX_M2
};

/// The XML call format a template teaches, other than Qwen's (`detect_qwen`): DeepSeek's DSML,
/// MiniCPM5's (by llama.cpp's tests for them), Seed-OSS's, MiniMax M2's, Ling 3's (GLM's tags in
/// `<role>` sections), Hy3's, GLM's (MiniMax M3's nested values are not these).
pub(super) fn detect(t: &str) -> Option<Format> {
    let has = |ms: &[&str]| ms.iter().all(|m| t.contains(m));
    // (the templates spell DSML's tags with a variable, `dsml_token`; V3.2's blocks are
    // `function_calls`, V4's `tool_calls`)
    if has(&["dsml_token", "DSML"]) && (t.contains("function_calls") || t.contains("tool_calls")) {
        Some(Format::DeepSeekDsml {
            v4: !t.contains("function_calls"),
        })
    } else if has(&[
        "Tool usage guidelines:",
        "<function name=\"",
        "<param name=\"",
    ]) {
        Some(Format::MiniCpm5)
    } else if has(&["<seed:tool_call>", "<function=", "<parameter="]) {
        Some(Format::SeedOss)
    } else if has(&["<minimax:tool_call>", "<invoke name=", "<parameter name="]) {
        Some(Format::MiniMaxM2)
    } else if has(&[
        "<tool_call>",
        "<arg_key>",
        "<arg_value>",
        "<role>ASSISTANT</role>",
    ]) {
        Some(Format::Ling3)
    } else if has(&[
        "<tool_calls{}>",
        "<tool_sep{}>",
        "<arg_key{}>",
        "':opensource'",
    ]) {
        // (Hy3 builds its tags when rendering: `'<tool_sep{}>'.format(HYTK)`)
        Some(Format::Hy3)
    } else if has(&["<tool_call>", "<arg_key>", "<arg_value>"]) {
        // a newline after `</arg_key>`, as the template writes it or in a string literal
        Some(Format::Glm {
            newlines: t.contains("</arg_key>\n") || t.contains("</arg_key>\\n"),
        })
    } else {
        None
    }
}

/// llama.cpp's test for Qwen3-Coder's: the three tags, and not the variant without newlines
/// between them.
pub(super) fn detect_qwen(template: &str) -> bool {
    template.contains("<tool_call>")
        && template.contains("<function=")
        && template.contains("<parameter=")
        && !template.contains("'<tool_call><function=' ~ tool_call.name ~ '>'")
}

/// Why `name` cannot be written as a call's name in `sh`'s tag, if it cannot.
fn bad_name(sh: &Shape, name: &str) -> Option<String> {
    if name.is_empty() {
        return Some("a tool has an empty name".into());
    }
    let stop = |c: char| {
        sh.syntax.name_stops.contains(&c) || (sh.name_end.is_empty() && c.is_whitespace())
    };
    let c = name.chars().find(|&c| stop(c))?;
    Some(format!(
        "tool `{name}`: the {} format cannot carry {c:?} in a tool name",
        sh.syntax.format
    ))
}

pub(super) fn plan(sh: &Shape, req: &ToolRequest) -> Result<Option<Plan>, String> {
    let Some(tools) = allowed_tools(req)? else {
        return Ok(None);
    };
    let mut params = Params::new(&sh.syntax);
    let ws = params.ws();
    // (between the call's own tags: exactly what the template writes, where that is all its
    // model's reader takes)
    let sep = params.sep();
    let pre = sh.syntax.prefix;
    let mut rules = String::new();
    let mut alts = Vec::new();
    for (i, tool) in tools.iter().enumerate() {
        if let Some(e) = bad_name(sh, &tool.name) {
            return Err(e);
        }
        let seq = params.tool(i, tool)?;
        let rule = format!("{pre}-t{i}");
        // (GLM's call ends at the block's closing tag, after the last parameter's whitespace)
        let end = if sh.function_close.is_empty() {
            String::new()
        } else {
            format!("{} {sep}", literal(sh.function_close))
        };
        let after_name = sh.after_name.map_or_else(|| sep.clone(), literal);
        rules.push_str(&format!(
            "{rule} ::= {} {} {after_name} {seq} {} {end}\n",
            literal(&format!("{}{}{}", sh.function, tool.name, sh.name_end)),
            sh.call_attrs,
            literal(sh.before_end),
        ));
        alts.push(rule);
    }
    let call = format!("( {} )", alts.join(" | "));
    let calls = if sh.many && req.parallel {
        format!("{call} {call}*")
    } else {
        call
    };
    // GLM's name follows the opening tag right away.
    let after_open = if sh.function.is_empty() { "" } else { &sep };
    let mut gbnf = if req.parallel && !sh.many {
        format!("root ::= {pre}-call ( {pre}-call )*\n")
    } else {
        format!("root ::= {pre}-call\n")
    };
    let after = if sh.ends_at_close { "" } else { &ws };
    gbnf.push_str(&format!(
        "{pre}-call ::= {} {after_open} {calls} {} {after}\n",
        literal(sh.open),
        literal(sh.close)
    ));
    gbnf.push_str(&params.finish());
    gbnf.push_str(&rules);
    Ok(Some(Plan::calls(gbnf, &req.choice, sh.lazy_start())))
}

/// A name in a tag at the start of `s`, up to `end` (no line break in it), and the bytes
/// through `end`; where `end` is empty (GLM's call name), the name runs to whitespace or `<`,
/// which must follow it.
fn tag_name<'s>(s: &'s str, end: &str) -> Option<(&'s str, usize)> {
    if end.is_empty() {
        let n = s.find(|c: char| c.is_whitespace() || c == '<')?;
        return (n > 0).then_some((&s[..n], n));
    }
    let at = s.find(end)?;
    let name = &s[..at];
    (!name.contains(['\n', '\r'])).then_some((name, at + end.len()))
}

/// The length of the attributes after a call's name and of the text that ends its tag
/// (`Shape::tag_end`; 0 where the shape has none); None where the tag does not end before a
/// line break or the text's end.
fn attrs_len(sh: &Shape, s: &str) -> Option<usize> {
    if sh.tag_end.is_empty() {
        return Some(0);
    }
    let at = s.find(sh.tag_end)?;
    (!s[..at].contains(['\n', '\r'])).then_some(at + sh.tag_end.len())
}

/// Whether text after a name's opening that `tag_name` does not read yet may still become a
/// name and its end.
fn name_open(s: &str, end: &str) -> bool {
    if end.is_empty() {
        !s.contains(|c: char| c.is_whitespace() || c == '<')
    } else {
        !s.contains(['\n', '\r'])
    }
}

/// Where a value starts in `s` (the text after a parameter's name): right there, or after
/// whitespace and the shape's value tag.
fn value_start(sh: &Shape, s: &str) -> Option<usize> {
    if sh.value_open.is_empty() {
        return Some(0);
    }
    let w = ws_len(s);
    let tag = sh.value_open.iter().find(|t| s[w..].starts_with(**t))?;
    Some(w + tag.len())
}

const CDATA_OPEN: &str = "<![CDATA[";
const CDATA_CLOSE: &str = "]]>";

/// A value's raw text less the template's framing (Qwen's newlines, MiniCPM5's CDATA).
fn unframed<'v>(sh: &Shape, raw: &'v str) -> &'v str {
    if sh.cdata {
        if let Some(inner) = raw
            .strip_prefix(CDATA_OPEN)
            .and_then(|r| r.strip_suffix(CDATA_CLOSE))
        {
            return inner;
        }
    }
    if !sh.framed {
        return raw;
    }
    let raw = raw.strip_prefix('\n').unwrap_or(raw);
    raw.strip_suffix('\n').unwrap_or(raw)
}

/// The length of a parameter's raw text in `s` (which follows the value's opening): where a
/// JSON value that opens it ends, when the closing tag follows (after the framing newline; a
/// JSON string may hold the closing tag, a raw one never does, the grammar keeps it out), else
/// up to the first closing tag followed, after whitespace, by another parameter or the call's
/// end.
fn value_len(sh: &Shape, s: &str) -> Option<usize> {
    let closes_at = |at: usize| {
        s[at..].strip_prefix(sh.param_close).is_some_and(|after| {
            let next = &after[ws_len(after)..];
            next.starts_with(sh.param) || next.starts_with(sh.call_end())
        })
    };
    if let Some((_, n)) = json_prefix(s) {
        let at = n + usize::from(sh.framed && s[n..].starts_with('\n'));
        if closes_at(at) {
            return Some(at);
        }
    }
    let mut from = 0;
    loop {
        let at = from + memmem::find(&s.as_bytes()[from..], sh.param_close.as_bytes())?;
        if closes_at(at) {
            return Some(at);
        }
        from = at + sh.param_close.len();
    }
}

/// One call as written: its name and its parameters' names and raw texts.
type RawCall<'t> = (&'t str, Vec<(String, String)>);

/// The call block whose opening tag ends right before `rest`: its calls and the length of
/// `rest` it spans (through the closing tag, or to the end for an unclosed final block whose
/// calls are closed). None when the block is malformed.
pub(super) fn read_block<'t>(sh: &Shape, rest: &'t str) -> Option<(Vec<RawCall<'t>>, usize)> {
    let mut p = 0;
    let mut calls = Vec::new();
    loop {
        if !sh.function.is_empty() {
            p += ws_len(&rest[p..]);
        }
        p += rest[p..]
            .starts_with(sh.function)
            .then_some(sh.function.len())?;
        let (name, n) = tag_name(&rest[p..], sh.name_end)?;
        p += n;
        p += attrs_len(sh, &rest[p..])?;
        let mut args = Vec::new();
        loop {
            p += ws_len(&rest[p..]);
            let s = &rest[p..];
            if let Some(after) = s.strip_prefix(sh.param) {
                let (key, n) = tag_name(after, sh.param_name_end)?;
                let v = n + value_start(sh, &after[n..])?;
                let len = value_len(sh, &after[v..])?;
                let raw = unframed(sh, &after[v..v + len]);
                args.push((key.to_string(), raw.to_string()));
                p += sh.param.len() + v + len + sh.param_close.len();
            } else if s.starts_with(sh.call_end()) {
                p += sh.function_close.len();
                break;
            } else {
                return None;
            }
        }
        calls.push((name, args));
        p += ws_len(&rest[p..]);
        if !(sh.many && rest[p..].starts_with(sh.function)) {
            break;
        }
    }
    if rest[p..].starts_with(sh.close) {
        Some((calls, p + sh.close.len()))
    } else if p == rest.len() && !sh.function_close.is_empty() {
        Some((calls, p))
    } else {
        None
    }
}

/// The calls of a block read, their arguments by `req`'s schemas.
fn calls_of(sh: &Shape, raw: Vec<RawCall<'_>>, req: Option<&ToolRequest>) -> Vec<ToolCall> {
    raw.into_iter()
        .map(|(name, args)| ToolCall {
            id: None,
            name: name.to_string(),
            arguments: arguments(&sh.syntax, name, &args, req),
        })
        .collect()
}

/// Content is the text with the calls' blocks taken out, its trailing whitespace trimmed;
/// malformed blocks, and blocks calling a tool the request does not offer, stay in it.
pub(super) fn parse(sh: &Shape, text: &str, req: Option<&ToolRequest>) -> Parsed {
    parse_blocks(text, req, &[sh.open], |after| {
        let (raw, used) = read_block(sh, after)?;
        if !raw.iter().all(|(name, _)| offered(req, name)) {
            return None;
        }
        Some((calls_of(sh, raw, req), used))
    })
}

/// How `s` starts against the literal `lit`: with it (Some(true)), with a proper prefix of it
/// (None: what follows decides), or otherwise (Some(false)).
pub(super) fn starts(s: &str, lit: &str) -> Option<bool> {
    if s.starts_with(lit) {
        Some(true)
    } else if lit.starts_with(s) {
        None
    } else {
        Some(false)
    }
}

/// Whether the closing tag at `at` in the text `s` of a value ends it (it is followed, after
/// whitespace, by another parameter or the call's end, as `value_len` asks), whatever follows
/// `s`; None while what follows decides.
fn closes_at(sh: &Shape, s: &str, at: usize) -> Option<bool> {
    let after = &s[at..];
    let Some(rest) = after.strip_prefix(sh.param_close) else {
        return starts(after, sh.param_close);
    };
    let next = &rest[ws_len(rest)..];
    match (starts(next, sh.param), starts(next, sh.call_end())) {
        (Some(true), _) | (_, Some(true)) => Some(true),
        (None, _) | (_, None) => None,
        _ => Some(false),
    }
}

/// `value_len` of the text of a value as far as `s` tells: Some where every text that starts
/// with `s` gives that length, None while what follows may change it.
fn value_len_partial(sh: &Shape, s: &str) -> Option<usize> {
    // The JSON reading first, as `value_len`: it wins where its value ends, after the framing
    // newline, at a closing tag.
    let mut it = serde_json::Deserializer::from_str(s).into_iter::<serde_json::Value>();
    match it.next() {
        None => return None,
        // at the end a value may still come; another error is at a character of `s` and
        // stays whatever follows (where that is the end, a number out of range, no closing
        // tag follows it yet and the raw reading below says None)
        Some(Err(e)) if e.is_eof() => return None,
        Some(Err(_)) => {}
        Some(Ok(_)) => {
            // (a number or a literal at the very end, which may go on, has no closing tag
            // after it yet: None)
            let n = it.byte_offset();
            let at = n + usize::from(sh.framed && s[n..].starts_with('\n'));
            match closes_at(sh, s, at) {
                Some(true) => return Some(at),
                None => return None,
                Some(false) => {}
            }
        }
    }
    // then the first closing tag that closes
    let mut from = 0;
    loop {
        let at = from + memmem::find(&s.as_bytes()[from..], sh.param_close.as_bytes())?;
        if closes_at(sh, s, at)? {
            return Some(at);
        }
        from = at + sh.param_close.len();
    }
}

/// The start of a value's raw text that every text beginning with `v` (the value's text so
/// far) gives: the value ends at a closing tag, so not before the first one (or a tail that
/// may become one), and loses its framing.
fn known_raw<'v>(sh: &Shape, v: &'v str) -> &'v str {
    // (a value that opens as CDATA may or may not be wrapped whole: known at its end only)
    if sh.cdata && (v.starts_with(CDATA_OPEN) || CDATA_OPEN.starts_with(v)) {
        return "";
    }
    let limit = memmem::find(v.as_bytes(), sh.param_close.as_bytes())
        .unwrap_or_else(|| v.len() - tail_len(v, sh.param_close));
    if !sh.framed {
        return &v[..limit];
    }
    let lead = usize::from(v.starts_with('\n')).min(limit);
    let known = &v[lead..limit];
    known.strip_suffix('\n').unwrap_or(known)
}

/// How far streaming has read the call block whose opening tag ends right before `rest`: a
/// call is begun once its name is whole, and its arguments grow by whole parameters
/// (`StreamedArgs`), a parameter whose schema admits strings only by its characters too. A
/// repeated parameter name's value is read past and left out (`arguments` keeps the first
/// value), and the parameters after it go on streaming.
pub(super) fn read_block_partial(
    sh: &Shape,
    rest: &str,
    req: Option<&ToolRequest>,
    memo: &mut partial::Memo,
) -> BlockStep {
    let mut p = 0;
    let mut done: Vec<ToolCall> = Vec::new();
    loop {
        if !sh.function.is_empty() {
            p += ws_len(&rest[p..]);
        }
        match starts(&rest[p..], sh.function) {
            Some(true) => p += sh.function.len(),
            None => return BlockStep::Open(done),
            Some(false) => return BlockStep::Broken(done),
        }
        let Some((name, n)) = tag_name(&rest[p..], sh.name_end) else {
            return if name_open(&rest[p..], sh.name_end) {
                BlockStep::Open(done)
            } else {
                BlockStep::Broken(done)
            };
        };
        p += n;
        match attrs_len(sh, &rest[p..]) {
            Some(n) => p += n,
            None if name_open(&rest[p..], sh.tag_end) => return BlockStep::Open(done),
            None => return BlockStep::Broken(done),
        }
        let mut args = StreamedArgs::new(&sh.syntax, name, req);
        let begun = |mut done: Vec<ToolCall>, args: StreamedArgs| {
            done.push(ToolCall {
                id: None,
                name: name.to_string(),
                arguments: args.into_text(),
            });
            done
        };
        loop {
            p += ws_len(&rest[p..]);
            let s = &rest[p..];
            if let Some(after) = s.strip_prefix(sh.param) {
                let Some((key, n)) = tag_name(after, sh.param_name_end) else {
                    return if name_open(after, sh.param_name_end) {
                        BlockStep::Open(begun(done, args))
                    } else {
                        BlockStep::Broken(begun(done, args))
                    };
                };
                let Some(v) = value_start(sh, &after[n..]) else {
                    let t = &after[n..];
                    let t = &t[ws_len(t)..];
                    return if sh.value_open.iter().any(|o| o.starts_with(t)) {
                        BlockStep::Open(begun(done, args))
                    } else {
                        BlockStep::Broken(begun(done, args))
                    };
                };
                let v = n + v;
                // a repeated name's value is read past and left out, as `arguments` leaves it
                let new = args.is_new(key);
                let value = &after[v..];
                let Some(len) = value_len_partial(sh, value) else {
                    if new {
                        args.push_open(key, known_raw(sh, value), memo);
                    }
                    return BlockStep::Open(begun(done, args));
                };
                if new {
                    args.push(key, unframed(sh, &value[..len]));
                }
                p += sh.param.len() + v + len + sh.param_close.len();
            } else if s.starts_with(sh.call_end()) {
                p += sh.function_close.len();
                args.close();
                break;
            } else if sh.param.starts_with(s) || sh.call_end().starts_with(s) {
                return BlockStep::Open(begun(done, args));
            } else {
                return BlockStep::Broken(begun(done, args));
            }
        }
        done = begun(done, args);
        p += ws_len(&rest[p..]);
        if sh.many && rest[p..].starts_with(sh.function) {
            continue;
        }
        let more = sh.many && sh.function.starts_with(&rest[p..]);
        return match starts(&rest[p..], sh.close) {
            Some(true) => match read_block(sh, rest) {
                Some((raw, used)) => BlockStep::Whole(calls_of(sh, raw, req), used),
                None => BlockStep::Broken(done),
            },
            None => BlockStep::Open(done),
            Some(false) if more => BlockStep::Open(done),
            Some(false) => BlockStep::Broken(done),
        };
    }
}

/// The content up to the first block's opening tag, less a tail that may start one, less
/// trailing whitespace; the calls begun (`read_block_partial`).
pub(super) fn parse_partial(
    sh: &Shape,
    text: &str,
    req: Option<&ToolRequest>,
    from: &mut Blocks,
) -> Parsed {
    parse_blocks_partial(
        text,
        req,
        &[sh.open],
        |rest, memo| read_block_partial(sh, rest, req, memo),
        from,
    )
}

#[cfg(test)]
pub(super) mod tests {
    use super::super::test_util::*;
    use super::super::{think, Format, Tool, ToolChoice, Trigger};
    use super::*;
    use serde_json::{json, Map, Value};

    /// A value as the templates write it: a string raw, a mapping or sequence as JSON in
    /// layout `json` of `layouts`, another value as JSON (the grammar's spelling).
    fn render_value(v: &Value, json: usize) -> String {
        match v {
            Value::String(s) => s.clone(),
            Value::Object(_) | Value::Array(_) => {
                let l = layouts(v);
                l[json % l.len()].clone()
            }
            other => other.to_string(),
        }
    }

    /// One block with `ws` between the tags (the templates write "\n").
    fn render_call(name: &str, args: &Map<String, Value>, ws: &str, json: usize) -> String {
        let mut s = format!("<tool_call>{ws}<function={name}>{ws}");
        for (k, v) in args {
            s.push_str(&format!(
                "<parameter={k}>\n{}\n</parameter>{ws}",
                render_value(v, json)
            ));
        }
        s.push_str(&format!("</function>{ws}</tool_call>"));
        s
    }

    /// The arguments in the order of the schema's properties (the grammar's), others after.
    pub(in super::super) fn ordered(schema: &Value, args: &Value) -> Map<String, Value> {
        let args = args.as_object().unwrap();
        let props = schema["properties"].as_object().unwrap();
        let mut m: Map<String, Value> = props
            .keys()
            .filter_map(|k| Some((k.clone(), args.get(k)?.clone())))
            .collect();
        for (k, v) in args {
            if !props.contains_key(k) {
                m.insert(k.clone(), v.clone());
            }
        }
        m
    }

    /// The arguments in the order `format`'s grammar writes them: `ordered`'s, the required
    /// ones first where the format asks (DSML).
    fn ordered_for(format: Format, schema: &Value, args: &Value) -> Map<String, Value> {
        let m = ordered(schema, args);
        if !format.xml_shape().syntax.required_first {
            return m;
        }
        let req = |k: &String| {
            schema["required"]
                .as_array()
                .is_some_and(|r| r.contains(&Value::from(k.as_str())))
        };
        let (mut first, rest): (Map<String, Value>, Map<String, Value>) =
            m.into_iter().partition(|(k, _)| req(k));
        first.extend(rest);
        first
    }

    /// (between tags, between blocks, after the last block)
    const LAYOUTS: &[(&str, &str, &str)] = &[
        // Qwen3-Coder, Qwen 3.5
        ("\n", "\n", ""),
        // StepFun 3.5
        ("\n", "", ""),
        // Nemotron Nano 3
        ("\n", "\n", "\n"),
        ("", "", ""),
        (" ", "\n\n", "\n"),
        ("\n  ", " ", " "),
    ];

    /// Random tools and calls: the grammar takes the rendered blocks in several layouts,
    /// `parse` gives the calls back; unknown and other tools, broken arguments, a second
    /// call without `parallel` and broken markup are refused.
    #[test]
    fn qwen_xml_grammar_accepts_calls_and_refuses_wrong_ones() {
        let mut rng = Rng(0x5EED_0011);
        let mut refused_args = 0;
        for round in 0..60 {
            let parallel = round % 2 == 1;
            let r = random_req(&mut rng, round, parallel);
            let (p, g) = checked_plan(Format::QwenXml, &r, Trigger::Word("<tool_call>".into()));
            let calls: Vec<(&Tool, Map<String, Value>)> = random_calls(&mut rng, &r)
                .into_iter()
                .map(|(t, a)| (t, ordered(&t.parameters, &a)))
                .collect();
            for (li, (ws, between, after)) in LAYOUTS.iter().enumerate() {
                let blocks: Vec<String> = calls
                    .iter()
                    .map(|(t, a)| render_call(&t.name, a, ws, li))
                    .collect();
                let text = format!("{}{after}", blocks.join(between));
                // The grammar writes a line break between the tags, as the templates do (and
                // llama.cpp's reader insists); the reading takes the other layouts too.
                let templated = *ws == "\n";
                assert_eq!(
                    g.accepts_str(&text),
                    templated,
                    "round {round}: {text:?}\n{}",
                    p.gbnf
                );
                let parsed = Format::QwenXml.parse(&text, Some(&r));
                assert_eq!(parsed.content, "");
                assert_eq!(parsed.reasoning, None);
                assert_eq!(parsed.tool_calls.len(), calls.len(), "{text:?}");
                for (c, (t, a)) in parsed.tool_calls.iter().zip(&calls) {
                    assert_call(c, &t.name, &Value::Object(a.clone()), None);
                }
                if templated {
                    check_text_around(Format::QwenXml, &r, &g, &text, calls.len());
                }
                check_stream_calls(Format::QwenXml, &text, &r);
                // ... and sent whole by the end
                let end = Format::QwenXml.parse_partial(&text, Some(&r));
                assert_eq!(end.tool_calls, parsed.tool_calls, "{text:?}");
            }
            assert!(!g.accepts_str(""));
            assert!(!g.accepts_str("Hello"));
            let (t, a) = &calls[0];
            let n = &t.name;
            let one = render_call(n, a, "\n", 0);
            assert_eq!(g.accepts_str(&format!("{one}\n{one}")), parallel);
            // a tool that is not allowed
            assert!(!g.accepts_str(&render_call("no_such_tool", &Map::new(), "\n", 0)));
            if let Some((o, a)) = other_tool(&mut rng, &r) {
                let b = render_call(&o.name, &ordered(&o.parameters, &a), "\n", 0);
                assert!(!g.accepts_str(&b), "other tool taken: {b}");
            }
            // Broken arguments: those the format carries as they are (read back unchanged;
            // a wrong-typed string may spell a right value, `"12"` for an integer) are refused.
            let good = Value::Object(a.clone());
            for bad in broken_args(&mut rng, &t.parameters, &good) {
                if !bad.is_object() {
                    continue;
                }
                let bad = ordered(&t.parameters, &bad);
                let b = render_call(n, &bad, "\n", 0);
                let back = Format::QwenXml.parse(&b, Some(&r)).tool_calls;
                if back.len() == 1 && back[0].arguments == serde_json::to_string(&bad).unwrap() {
                    assert!(!g.accepts_str(&b), "round {round}: took {b:?}");
                    refused_args += 1;
                }
            }
            // unclosed or wrongly closed
            assert!(!g.accepts_str(one.strip_suffix("</tool_call>").unwrap()));
            assert!(!g.accepts_str(&one.replace("</tool_call>", "</tool_cal>")));
            assert!(!g.accepts_str(&one.replace("</function>\n", "")));
        }
        assert!(refused_args > 100, "{refused_args}");
    }

    /// Qwen3-Coder's template (jinja2 as transformers sets it up: `trim_blocks`,
    /// `lstrip_blocks`, `tojson` as `json.dumps` with `ensure_ascii=False`) rendering an
    /// assistant message with content and two calls; Qwen 3.5's writes the same.
    const TEMPLATE_TEXT: &str = "Let me check.\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\nPa\"ris <x>\nline 2\n</parameter>\n<parameter=days>\n3\n</parameter>\n<parameter=t>\n1.5\n</parameter>\n<parameter=xs>\n[1, 2]\n</parameter>\n<parameter=o>\n{\"b\": \"<&'é>\", \"a\": [true, null]}\n</parameter>\n</function>\n</tool_call>\n<tool_call>\n<function=ping>\n</function>\n</tool_call>";
    /// The same message by Nemotron Nano 3's template.
    const NEMOTRON_TEXT: &str = "Let me check.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nPa\"ris <x>\nline 2\n</parameter>\n<parameter=days>\n3\n</parameter>\n<parameter=t>\n1.5\n</parameter>\n<parameter=xs>\n[1, 2]\n</parameter>\n<parameter=o>\n{\"b\": \"<&'é>\", \"a\": [true, null]}\n</parameter>\n</function>\n</tool_call>\n<tool_call>\n<function=ping>\n</function>\n</tool_call>\n";
    /// The same message by StepFun 3.5's template.
    const STEPFUN_TEXT: &str = "Let me check.<tool_call>\n<function=get_weather>\n<parameter=city>\nPa\"ris <x>\nline 2\n</parameter>\n<parameter=days>\n3\n</parameter>\n<parameter=t>\n1.5\n</parameter>\n<parameter=xs>\n[1, 2]\n</parameter>\n<parameter=o>\n{\"b\": \"<&'é>\", \"a\": [true, null]}\n</parameter>\n</function>\n</tool_call><tool_call>\n<function=ping>\n</function>\n</tool_call>";
    /// Qwen3-Coder's template with a boolean and a null argument (`| string`: Python's
    /// spellings).
    const TEMPLATE_TEXT_PYTHON: &str = "Let me check.\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\nRome\n</parameter>\n<parameter=ok>\nTrue\n</parameter>\n<parameter=n>\nNone\n</parameter>\n</function>\n</tool_call>\n<tool_call>\n<function=ping>\n</function>\n</tool_call>";

    fn weather_tools() -> Vec<Tool> {
        vec![
            tool(
                "get_weather",
                json!({"type": "object", "properties": {
                    "city": {"type": "string"}, "days": {"type": "integer"},
                    "t": {"type": "number"}, "ok": {"type": "boolean"}, "n": {"type": "null"},
                    "xs": {"type": "array", "items": {"type": "integer"}},
                    "o": {"type": "object"}}, "required": ["city"]}),
            ),
            tool("ping", json!({"type": "object", "properties": {}})),
        ]
    }

    #[test]
    fn qwen_xml_template_rendering_is_accepted_and_read_back() {
        let want_args = r#"{"city":"Pa\"ris <x>\nline 2","days":3,"t":1.5,"xs":[1,2],"o":{"b":"<&'é>","a":[true,null]}}"#;
        for text in [TEMPLATE_TEXT, NEMOTRON_TEXT, STEPFUN_TEXT] {
            let calls = &text[text.find("<tool_call>").unwrap()..];
            for choice in [ToolChoice::Auto, ToolChoice::Required] {
                let r = req(weather_tools(), choice, true);
                let g = grammar(&Format::QwenXml.plan(&r).unwrap().unwrap());
                assert!(g.accepts_str(calls), "{calls:?}");
                // no text before a forced call
                assert!(!g.accepts_str(text));
                let p = Format::QwenXml.parse(text, Some(&r));
                assert_eq!(p.content, "Let me check.");
                assert_eq!(
                    p.tool_calls,
                    vec![
                        ToolCall {
                            id: None,
                            name: "get_weather".into(),
                            arguments: want_args.into(),
                        },
                        ToolCall {
                            id: None,
                            name: "ping".into(),
                            arguments: "{}".into(),
                        }
                    ]
                );
            }
            // two calls where one is allowed
            let r = req(weather_tools(), ToolChoice::Auto, false);
            let g = grammar(&Format::QwenXml.plan(&r).unwrap().unwrap());
            assert!(!g.accepts_str(calls));
        }
        // Python's True and None: read back by the schema's types, but the grammar has the
        // model write JSON.
        let r = req(weather_tools(), ToolChoice::Auto, true);
        let g = grammar(&Format::QwenXml.plan(&r).unwrap().unwrap());
        let calls = &TEMPLATE_TEXT_PYTHON[TEMPLATE_TEXT_PYTHON.find("<tool_call>").unwrap()..];
        assert!(!g.accepts_str(calls));
        assert!(g.accepts_str(&calls.replace("True", "true").replace("None", "null")));
        let p = Format::QwenXml.parse(TEMPLATE_TEXT_PYTHON, Some(&r));
        assert_eq!(p.content, "Let me check.");
        assert_eq!(p.tool_calls.len(), 2);
        assert_eq!(
            p.tool_calls[0].arguments,
            r#"{"city":"Rome","ok":true,"n":null}"#
        );
    }

    #[test]
    fn qwen_xml_parse_cases() {
        let r = req(
            vec![
                tool(
                    "f",
                    json!({"type": "object", "properties": {
                        "s": {"type": "string"}, "b": {"type": "boolean"},
                        "sn": {"type": ["string", "null"]}, "i": {"type": "integer"},
                        "o": {"type": "object"}, "e": {"enum": ["1", 2, null]}}}),
                ),
                tool("g", json!({})),
            ],
            ToolChoice::Auto,
            true,
        );
        let block = |name: &str, params: &str| {
            format!("<tool_call>\n<function={name}>\n{params}</function>\n</tool_call>")
        };
        let param = |k: &str, v: &str| format!("<parameter={k}>\n{v}\n</parameter>\n");
        let cases: Vec<(String, &str, Vec<ToolCall>)> = vec![
            ("Hello".into(), "Hello", vec![]),
            ("Hello \n".into(), "Hello", vec![]),
            (
                format!("Hi\n{}", block("g", "")),
                "Hi",
                vec![call("g", "{}")],
            ),
            // values by type: Python's spellings where no string is admitted
            (
                block(
                    "f",
                    &(param("b", "True") + &param("sn", "None") + &param("i", "None")),
                ),
                "",
                vec![call("f", r#"{"b":true,"sn":"None","i":"None"}"#)],
            ),
            (
                block(
                    "f",
                    &(param("s", "12") + &param("sn", "null") + &param("i", "twelve")),
                ),
                "",
                vec![call("f", r#"{"s":"12","sn":null,"i":"twelve"}"#)],
            ),
            (
                block("f", &(param("s", "\"q\"") + &param("b", "false"))),
                "",
                vec![call("f", r#"{"s":"\"q\"","b":false}"#)],
            ),
            // an enum's member as written: a string raw, another value as its JSON
            (
                block("f", &(param("e", "1"))),
                "",
                vec![call("f", r#"{"e":"1"}"#)],
            ),
            (
                block("f", &(param("e", "2"))),
                "",
                vec![call("f", r#"{"e":2}"#)],
            ),
            (
                block("f", &(param("e", "null"))),
                "",
                vec![call("f", r#"{"e":null}"#)],
            ),
            // one newline taken off each end, no more
            (
                block("f", &param("s", "\n a \n")),
                "",
                vec![call("f", r#"{"s":"\n a \n"}"#)],
            ),
            // without the newlines, in another order, undeclared, other whitespace
            (
                "<tool_call><function=f> <parameter=i>5</parameter><parameter=s>x</parameter>\n\n<parameter=zz>[1]</parameter></function></tool_call>".into(),
                "",
                vec![call("f", r#"{"i":5,"s":"x","zz":[1]}"#)],
            ),
            // a closing tag inside a JSON string, and in raw text followed by no tag
            (
                block(
                    "f",
                    &(param("o", "{\"a\": \"</parameter>\"}")
                        + &param("s", "a</parameter> b")),
                ),
                "",
                vec![call("f", r#"{"o":{"a":"</parameter>"},"s":"a</parameter> b"}"#)],
            ),
            // ... even where the tag inside the string is followed by another parameter's
            (
                block(
                    "f",
                    &(param("o", "{\"a\": \"x</parameter><parameter=s>\"}") + &param("s", "y")),
                ),
                "",
                vec![call("f", r#"{"o":{"a":"x</parameter><parameter=s>"},"s":"y"}"#)],
            ),
            // an unclosed final block is read once its function is closed
            (
                "<tool_call>\n<function=g>\n</function>\n".into(),
                "",
                vec![call("g", "{}")],
            ),
            (
                "<tool_call>\n<function=g>\n<parameter=x>\n1\n</param".into(),
                "<tool_call>\n<function=g>\n<parameter=x>\n1\n</param",
                vec![],
            ),
            // a tool not offered, a malformed block: content; good blocks after them are read
            (
                format!("{}\n{}", block("h", ""), block("g", "")),
                "<tool_call>\n<function=h>\n</function>\n</tool_call>",
                vec![call("g", "{}")],
            ),
            (
                format!("<tool_call>oops</tool_call> {}", block("g", "")),
                "<tool_call>oops</tool_call>",
                vec![call("g", "{}")],
            ),
            (
                "<tool_call>\n<function=g>\nx</function>\n</tool_call>".into(),
                "<tool_call>\n<function=g>\nx</function>\n</tool_call>",
                vec![],
            ),
            (
                "<tool_call>\n<function=g\n>\n</function>\n</tool_call>".into(),
                "<tool_call>\n<function=g\n>\n</function>\n</tool_call>",
                vec![],
            ),
            (
                format!("{} trailing", block("g", "")),
                " trailing",
                vec![call("g", "{}")],
            ),
            (
                format!("{}x</tool_call>", block("g", "").replace("</tool_call>", "")),
                "<tool_call>\n<function=g>\n</function>\nx</tool_call>",
                vec![],
            ),
            // text between calls
            (
                format!("A {} B\n{}\n", block("g", ""), block("f", &param("i", "1"))),
                "A  B",
                vec![call("g", "{}"), call("f", r#"{"i":1}"#)],
            ),
        ];
        for (text, content, calls) in &cases {
            check_parsed(&Format::QwenXml.parse(text, Some(&r)), content, calls, text);
        }
        // no tools or tool_choice none: the text as is
        let t = format!("Hi {}\n", block("g", ""));
        check_verbatim(Format::QwenXml, &t, &r.tools);
        // partial
        for (t, c) in [
            ("Hi <tool", "Hi"),
            ("Hi <tool_call", "Hi"),
            ("Hi <tool_call>\n<function=g", "Hi"),
            ("Hi <toolbox", "Hi <toolbox"),
            ("a < b", "a < b"),
            ("a\n\n", "a"),
            ("", ""),
        ] {
            let p = Format::QwenXml.parse_partial(t, Some(&r));
            check_parsed(&p, c, &[], t);
        }
        // calls streamed as they are written: the name once whole, then each parameter once
        // its value is sure, a string's characters as they come
        let f = "Hi <tool_call>\n<function=f>\n";
        let i = format!("{f}<parameter=i>\n12");
        let s = format!("{i}\n</parameter>\n<parameter=s>\nPa\"ris\n");
        let o = format!("{f}<parameter=o>\n{{\"a\": \"x</parameter><parameter=s>");
        for (t, calls) in [
            ("Hi <tool_call>\n<function=g>".to_string(), vec![call("g", "{")]),
            (f.to_string(), vec![call("f", "{")]),
            // a number may go on; the closing tag may be the start of the value's text
            (i.clone(), vec![call("f", "{")]),
            (format!("{i}\n</parameter>\n"), vec![call("f", "{")]),
            (format!("{i}\n</parameter>\n<"), vec![call("f", "{")]),
            (
                format!("{i}\n</parameter>\n<parameter=s>"),
                vec![call("f", r#"{"i":12,"s":""#)],
            ),
            // the last newline may be the one before `</parameter>`
            (s.clone(), vec![call("f", r#"{"i":12,"s":"Pa\"ris"#)]),
            (format!("{s}x</para"), vec![call("f", r#"{"i":12,"s":"Pa\"ris\nx"#)]),
            (
                format!("{s}</parameter>\n</function>"),
                vec![call("f", r#"{"i":12,"s":"Pa\"ris"}"#)],
            ),
            (
                format!("{s}</parameter>\n</function>\n</tool_call>\n<tool_call><function=g>"),
                vec![call("f", r#"{"i":12,"s":"Pa\"ris"}"#), call("g", "{")],
            ),
            // a JSON value holding the closing tag waits for its end
            (o.clone(), vec![call("f", "{")]),
            (
                format!("{o}\"}}\n</parameter>\n</function>"),
                vec![call("f", r#"{"o":{"a":"x</parameter><parameter=s>"}}"#)],
            ),
            // a parameter given twice keeps its first value; the call goes on after it
            (
                format!("{f}<parameter=i>\n1\n</parameter>\n<parameter=i>\n2"),
                vec![call("f", r#"{"i":1"#)],
            ),
            (
                format!("{f}<parameter=i>\n1\n</parameter>\n<parameter=i>\n2\n</parameter>\n<parameter=s>\nab"),
                vec![call("f", r#"{"i":1,"s":"ab"#)],
            ),
            (
                format!("{f}<parameter=i>\n1\n</parameter>\n<parameter=i>\n2\n</parameter>\n</function>"),
                vec![call("f", r#"{"i":1}"#)],
            ),
            // a tool not offered is never begun
            ("Hi <tool_call>\n<function=h>\n".to_string(), vec![]),
        ] {
            let p = Format::QwenXml.parse_partial(&t, Some(&r));
            check_parsed(&p, "Hi", &calls, &t);
        }
        // ... and that call's finished reading keeps the first value and goes on from it
        let twice = format!(
            "{f}<parameter=i>\n1\n</parameter>\n<parameter=i>\n2\n</parameter>\n</function>\n</tool_call>"
        );
        assert_eq!(
            Format::QwenXml.parse(&twice, Some(&r)).tool_calls,
            [call("f", r#"{"i":1}"#)]
        );
        assert_eq!(
            Format::QwenXml.parse_final(&twice, Some(&r)).tool_calls,
            [call("f", r#"{"i":1}"#)]
        );
    }

    /// For every text built from the format's pieces and every prefix of it, what streaming
    /// sends is a prefix of what the finished text gives, and is never taken back.
    #[test]
    fn qwen_xml_partial_is_prefix_of_parse() {
        let r = req(
            vec![tool(
                "f",
                json!({"type": "object", "properties": {"x": {"type": "integer"},
                                                        "s": {"type": "string"}}}),
            )],
            ToolChoice::Auto,
            true,
        );
        let frags = [
            "a",
            "b c",
            " ",
            "\n",
            "<",
            "<tool",
            "<tool_call>",
            "</tool_call>",
            "<function=f>",
            "<function=g>",
            "</function>",
            "<parameter=x>",
            "\n1\n",
            "True",
            "</parameter>",
            "<tool_call>\n<function=f>\n<parameter=x>\n1\n</parameter>\n</function>\n</tool_call>",
            "é",
            "<parameter=s>",
            "\"",
            "{\"a\": \"",
            "\"}",
            "[1, 2",
            "12",
            "\nab\n",
        ];
        // well-formed blocks, to be cut into and mixed with the pieces
        let blocks = [
            "<tool_call>\n<function=f>\n<parameter=x>\n1\n</parameter>\n<parameter=s>\nab\n</parameter>\n</function>\n</tool_call>",
            "<tool_call>\n<function=f>\n<parameter=s>\n\"q</parameter>\n</parameter>\n</function>\n</tool_call>",
            "<tool_call>\n<function=f>\n<parameter=s>\n{\"a\": \"</parameter><parameter=x>\"}\n</parameter>\n</function>\n</tool_call>",
        ];
        let mut rng = Rng(23);
        let (mut checked, mut with_calls) = (0usize, 0usize);
        for round in 0..3000 {
            let mut t: String = (0..rng.below(8))
                .map(|_| frags[rng.below(frags.len())])
                .collect();
            if round % 2 == 1 {
                let b = blocks[rng.below(blocks.len())];
                let at = (0..rng.below(b.len()))
                    .rfind(|&i| b.is_char_boundary(i))
                    .unwrap_or(0);
                let at_t = (0..=rng.below(t.len() + 1).min(t.len()))
                    .rfind(|&i| t.is_char_boundary(i))
                    .unwrap_or(0);
                t = format!("{}{}{}{}", &b[..at], &t[..at_t], &b[at..], &t[at_t..]);
            }
            let (n, calls) = check_with_and_without_tools(Format::QwenXml, &t, &r);
            checked += n;
            with_calls += calls;
        }
        assert!(
            checked > 10_000 && with_calls > 200,
            "{checked} {with_calls}"
        );
    }

    #[test]
    fn qwen_xml_detect() {
        assert!(detect_qwen("<tool_call>\n<function=f>\n<parameter=k>\n"));
        assert!(!detect_qwen("<tool_call>\n<function=f>"));
        assert!(!detect_qwen("<function=f><parameter=k>"));
        // the variant without newlines between the tags
        assert!(!detect_qwen(
            "{{- '<tool_call><function=' ~ tool_call.name ~ '>' }}<parameter="
        ));
        let ours = [
            ("Qwen3-Coder.jinja", Format::QwenXml),
            ("Qwen3.5-4B.jinja", Format::QwenXml),
            ("NVIDIA-Nemotron-3-Nano-30B-A3B-BF16.jinja", Format::QwenXml),
            ("StepFun3.5-Flash.jinja", Format::QwenXml),
        ];
        if check_detect_all(|t| detect_qwen(t).then_some(Format::QwenXml), &ours).is_empty() {
            return;
        }
        // Qwen 3.5 thinks too: the caller splits `<think>` off before `parse`
        let q35 = template("Qwen3.5-4B.jinja").unwrap();
        assert_eq!(think::Tags::of_template(&q35), Some(think::THINK));
    }

    #[test]
    fn qwen_xml_plan_shapes_and_errors() {
        let ok = tool(
            "f",
            json!({"type": "object", "properties": {"a": {"type": "integer"}}}),
        );
        assert_eq!(
            plan(&QWEN, &req(vec![ok.clone()], ToolChoice::None, false)).unwrap(),
            None
        );
        assert_eq!(
            plan(&QWEN, &req(vec![], ToolChoice::Auto, false)).unwrap(),
            None
        );
        assert!(plan(&QWEN, &req(vec![], ToolChoice::Required, false)).is_err());
        let e = plan(
            &QWEN,
            &req(vec![ok.clone()], ToolChoice::Function("g".into()), false),
        )
        .unwrap_err();
        assert!(e.contains("`g`"), "{e}");
        let auto = plan(&QWEN, &req(vec![ok.clone()], ToolChoice::Auto, true))
            .unwrap()
            .unwrap();
        assert!(auto.lazy);
        assert_eq!(auto.triggers, vec![QWEN.lazy_start().trigger()]);
        assert_eq!(Format::QwenXml.lazy_start(), Some(QWEN.lazy_start()));
        assert!(Format::QwenXml.markup().contains(&"<tool_call>"));
        assert!(Format::QwenXml.markup().contains(&"</tool_call>"));
        // the value's framing newlines are the template's, exactly
        let g = grammar(&auto);
        let one =
            "<tool_call>\n<function=f>\n<parameter=a>\n1\n</parameter>\n</function>\n</tool_call>";
        assert!(g.accepts_str(one));
        assert!(!g.accepts_str(&one.replace("<parameter=a>\n", "<parameter=a>")));
        assert!(!g.accepts_str(&one.replace("\n</parameter>", "</parameter>")));
        assert!(!g.accepts_str(&one.replace("1\n", "1 \n")));
        // a raw string: any text without the closing tag; a string with lengths, no `<`
        let s = tool(
            "s",
            json!({"properties": {"t": {"type": "string"},
                                  "u": {"type": "string", "maxLength": 3}},
                   "required": ["t"]}),
        );
        let g = grammar(
            &plan(&QWEN, &req(vec![s], ToolChoice::Required, false))
                .unwrap()
                .unwrap(),
        );
        let call = |t: &str| {
            format!("<tool_call>\n<function=s>\n<parameter=t>\n{t}\n</parameter>\n</function>\n</tool_call>")
        };
        for (t, ok) in [
            ("", true),
            ("\n", true),
            ("a <b> </parameter", true),
            ("</parameter>", false),
            ("a\n</parameter>\nb", false),
        ] {
            assert_eq!(g.accepts_str(&call(t)), ok, "{t:?}");
        }
        let u = |v: &str| {
            call("x").replace(
                "</function>",
                &format!("<parameter=u>\n{v}\n</parameter>\n</function>"),
            )
        };
        assert!(g.accepts_str(&u("abc")));
        assert!(!g.accepts_str(&u("abcd")));
        assert!(!g.accepts_str(&u("a<")));
        // names a tag cannot carry
        let errs = [
            (tool("a>b", json!({})), "'>'"),
            (tool("a\nb", json!({})), "'\\n'"),
            (tool("", json!({})), "empty"),
            (
                tool("p", json!({"properties": {"k>": {"type": "string"}}})),
                "parameter name",
            ),
            (
                tool("p", json!({"properties": {"k\r": {"type": "string"}}})),
                "'\\r'",
            ),
            (
                tool(
                    "p",
                    json!({"properties": {"k": {"type": "string", "pattern": "a+"}}}),
                ),
                "Qwen XML",
            ),
            (tool("p", json!({"type": "string"})), "`type`"),
        ];
        for (t, needle) in errs {
            let e = plan(
                &QWEN,
                &req(vec![ok.clone(), t.clone()], ToolChoice::Auto, false),
            )
            .unwrap_err();
            assert!(e.contains(needle), "{e}");
            if !t.name.is_empty() {
                assert!(e.contains(&format!("`{}`", t.name)), "{e}");
            }
        }
        // names with spaces, `<` and `=` are carried
        let odd = tool(
            "a<b=c d",
            json!({"properties": {"k l=<m": {"type": "integer"}}, "required": ["k l=<m"]}),
        );
        let r = req(vec![odd], ToolChoice::Required, false);
        let g = grammar(&plan(&QWEN, &r).unwrap().unwrap());
        let text = "<tool_call>\n<function=a<b=c d>\n<parameter=k l=<m>\n7\n</parameter>\n</function>\n</tool_call>";
        assert!(g.accepts_str(text));
        let p = parse(&QWEN, text, Some(&r));
        assert_eq!(p.tool_calls[0].name, "a<b=c d");
        assert_eq!(p.tool_calls[0].arguments, r#"{"k l=<m":7}"#);
    }

    /// Random calls whose parameters are given again (a new value, after the first): `parse`
    /// keeps each name's first value, streaming agrees with it at every prefix, and the
    /// parameters after a repeat stream on: at each call's `</function>` (its block not yet
    /// closed) the streamed arguments are the final ones.
    #[test]
    fn qwen_xml_streams_past_a_repeated_parameter() {
        let mut rng = Rng(0x5EED_0C0D);
        let mut repeats = 0;
        for round in 0..80 {
            let r = random_req(&mut rng, round, round % 2 == 0);
            let calls = random_calls(&mut rng, &r);
            let mut text = ["", "Sure.\n"][rng.below(2)].to_string();
            let mut want = Vec::new();
            for (t, a) in &calls {
                let first = ordered(&t.parameters, a);
                let mut params: Vec<(String, Value)> = first.clone().into_iter().collect();
                for _ in 0..rng.below(4) {
                    if params.is_empty() {
                        break;
                    }
                    let (k, _) = params[rng.below(params.len())].clone();
                    let at = params.iter().position(|(p, _)| *p == k).unwrap() + 1;
                    let at = at + rng.below(params.len() - at + 1);
                    let v = random_args(&mut rng, &t.parameters["properties"][&k]);
                    params.insert(at, (k, v));
                    repeats += 1;
                }
                text += &format!("<tool_call>\n<function={}>\n", t.name);
                for (k, v) in &params {
                    let v = render_value(v, rng.below(4));
                    text += &format!("<parameter={k}>\n{v}\n</parameter>\n");
                }
                text += "</function>\n</tool_call>\n";
                want.push((t, Value::Object(first)));
            }
            let parsed = Format::QwenXml.parse(&text, Some(&r));
            assert_eq!(parsed.tool_calls.len(), want.len(), "{text:?}");
            for (c, (t, a)) in parsed.tool_calls.iter().zip(&want) {
                assert_call(c, &t.name, a, None);
            }
            check_stream_calls(Format::QwenXml, &text, &r);
            let ends = text.match_indices("</function>").map(|(i, t)| i + t.len());
            for (i, end) in ends.enumerate() {
                let p = Format::QwenXml.parse_partial(&text[..end], Some(&r));
                assert_eq!(p.tool_calls[i], parsed.tool_calls[i], "{text:?}");
            }
        }
        assert!(repeats > 80, "{repeats}");
    }

    /// `check_partial_prefixes` of `text` with the tools of `r` and without tools: the
    /// prefixes checked, and how many of the two readings had calls.
    fn check_with_and_without_tools(format: Format, text: &str, r: &ToolRequest) -> (usize, usize) {
        let mut out = (0, 0);
        for q in [Some(r), None] {
            let (full, n) = check_partial_prefixes(format, text, q);
            out.0 += n;
            out.1 += usize::from(!full.tool_calls.is_empty());
        }
        out
    }

    /// The formats of the family other than Qwen's.
    const OTHERS: &[Format] = &[
        Format::SeedOss,
        Format::MiniMaxM2,
        Format::Glm { newlines: true },
        Format::Glm { newlines: false },
        Format::DeepSeekDsml { v4: false },
        Format::DeepSeekDsml { v4: true },
        Format::MiniCpm5,
        Format::Ling3,
        Format::Hy3,
    ];

    /// Whether parameter `k` of tool `name` in `r` admits strings (DSML's `string="true"`).
    fn string_param(r: &ToolRequest, name: &str, k: &str) -> bool {
        let t = r.tools.iter().find(|t| t.name == name);
        t.is_some_and(|t| {
            let schema = &t.parameters["properties"][k];
            super::super::xml_args::admits_string(schema, &t.parameters)
        })
    }

    /// The layout between tags that `format`'s grammar writes, where it writes one only.
    fn template_ws(format: Format) -> Option<&'static str> {
        match format {
            // (`render_calls` writes Ling's newlines after the name and before the end as `ws`)
            Format::Ling3 => Some("\n"),
            _ => format.xml_shape().syntax.sep,
        }
    }

    /// Calls as `format`'s template writes them, `ws` between the tags where the template
    /// writes a newline (GLM 4.6's framing newline excepted, which is its own), values as
    /// `render_value` writes them; one block a call, or MiniMax's one block.
    fn render_calls(
        format: Format,
        r: &ToolRequest,
        calls: &[(&str, Map<String, Value>)],
        ws: &str,
        json: usize,
    ) -> String {
        let one = |name: &str, args: &Map<String, Value>| -> String {
            let v = |x: &Value| render_value(x, json);
            match format {
                Format::DeepSeekDsml { .. } => {
                    let mut s = format!("<｜DSML｜invoke name=\"{name}\">{ws}");
                    for (k, x) in args {
                        s += &format!(
                            "<｜DSML｜parameter name=\"{k}\" string=\"{}\">{}</｜DSML｜parameter>{ws}",
                            string_param(r, name, k),
                            v(x)
                        );
                    }
                    s + &format!("</｜DSML｜invoke>{ws}")
                }
                Format::MiniCpm5 => {
                    let mut s = format!("<function name=\"{name}\">{ws}");
                    for (k, x) in args {
                        s += &format!("<param name=\"{k}\">{}</param>{ws}", v(x));
                    }
                    s + "</function>"
                }
                Format::SeedOss => {
                    let mut s = format!("<seed:tool_call>{ws}<function={name}>{ws}");
                    for (k, x) in args {
                        s += &format!("<parameter={k}>{}</parameter>{ws}", v(x));
                    }
                    s + &format!("</function>{ws}</seed:tool_call>")
                }
                Format::MiniMaxM2 => {
                    let mut s = format!("<invoke name=\"{name}\">{ws}");
                    for (k, x) in args {
                        s += &format!("<parameter name=\"{k}\">{}</parameter>{ws}", v(x));
                    }
                    s + &format!("</invoke>{ws}")
                }
                Format::Glm { newlines } => {
                    let nl = if newlines { "\n" } else { "" };
                    let mut s = format!("<tool_call>{name}{ws}");
                    for (k, x) in args {
                        s += &format!(
                            "<arg_key>{k}</arg_key>{nl}<arg_value>{}</arg_value>{ws}",
                            v(x)
                        );
                    }
                    s + "</tool_call>"
                }
                // (no newline between the parameters)
                Format::Ling3 => {
                    let mut s = format!("<tool_call>{name}{ws}");
                    for (k, x) in args {
                        s += &format!("<arg_key>{k}</arg_key>\n<arg_value>{}</arg_value>", v(x));
                    }
                    s + &format!("{ws}</tool_call>")
                }
                Format::Hy3 => {
                    let mut s = format!("<tool_call:opensource>{name}<tool_sep:opensource>{ws}");
                    for (k, x) in args {
                        s += &format!(
                            "<arg_key:opensource>{k}</arg_key:opensource>\n<arg_value:opensource>{}</arg_value:opensource>{ws}",
                            v(x)
                        );
                    }
                    s + &format!("</tool_call:opensource>{ws}")
                }
                other => unreachable!("{other:?}"),
            }
        };
        let all: Vec<String> = calls.iter().map(|(n, a)| one(n, a)).collect();
        let sh = format.xml_shape();
        if sh.many {
            format!("{}{ws}{}{}", sh.open, all.concat(), sh.close)
        } else {
            all.join(ws)
        }
    }

    /// Seed-OSS, MiniMax M2, GLM, DeepSeek's DSML and MiniCPM5: random tools and calls in
    /// several layouts are taken by
    /// the grammar, read back by `parse` and streamed; other tools, broken arguments, a second
    /// call without `parallel` and broken markup are refused.
    #[test]
    fn other_xml_formats_grammar_accepts_calls_and_refuses_wrong_ones() {
        let mut rng = Rng(0x5EED_0A7E);
        let mut refused_args = 0;
        for round in 0..32 * OTHERS.len() {
            let format = OTHERS[round % OTHERS.len()];
            let sh = format.xml_shape();
            let parallel = round % 2 == 1;
            let r = random_req(&mut rng, round / OTHERS.len(), parallel);
            let (p, g) = checked_plan(format, &r, Trigger::Word(sh.open.into()));
            let calls: Vec<(&str, Map<String, Value>)> = random_calls(&mut rng, &r)
                .into_iter()
                .map(|(t, a)| (t.name.as_str(), ordered_for(format, &t.parameters, &a)))
                .collect();
            // (DSML's and MiniCPM5's grammars write their templates' layout only)
            let tw = template_ws(format).unwrap_or("\n");
            for (li, ws) in ["\n", "", " ", "\n\n  "].iter().enumerate() {
                let text = render_calls(format, &r, &calls, ws, li);
                let templated = template_ws(format).is_none_or(|t| t == *ws);
                assert_eq!(
                    g.accepts_str(&text),
                    templated,
                    "{format:?} round {round}: {text:?}\n{}",
                    p.gbnf
                );
                let parsed = format.parse(&text, Some(&r));
                assert_eq!(parsed.content, "");
                assert_eq!(parsed.tool_calls.len(), calls.len(), "{text:?}");
                for (c, (n, a)) in parsed.tool_calls.iter().zip(&calls) {
                    assert_call(c, n, &Value::Object(a.clone()), None);
                }
                if templated {
                    check_text_around(format, &r, &g, &text, calls.len());
                }
                check_stream_calls(format, &text, &r);
                // Streaming has sent the calls by the end, whole but where a raw value opens
                // a JSON string it does not close (more text could close it, and the JSON
                // reading would then win): there a prefix, which the final reading completes.
                let end = format.parse_partial(&text, Some(&r));
                assert_eq!(end.tool_calls.len(), parsed.tool_calls.len(), "{text:?}");
                for (e, c) in end.tool_calls.iter().zip(&parsed.tool_calls) {
                    assert_eq!(e.name, c.name);
                    assert!(c.arguments.starts_with(&e.arguments), "{text:?}");
                }
                assert_eq!(
                    format.parse_final(&text, Some(&r)).tool_calls,
                    parsed.tool_calls
                );
            }
            assert!(!g.accepts_str(""));
            assert!(!g.accepts_str("Hello"));
            let (n, a) = &calls[0];
            let one = render_calls(format, &r, &calls[..1], tw, 0);
            let two = render_calls(format, &r, &[calls[0].clone(), calls[0].clone()], tw, 0);
            assert_eq!(g.accepts_str(&two), parallel, "{two:?}");
            assert!(!g.accepts_str(&render_calls(
                format,
                &r,
                &[("no_such_tool", Map::new())],
                tw,
                0
            )));
            if let Some((o, a)) = other_tool(&mut rng, &r) {
                let b = render_calls(
                    format,
                    &r,
                    &[(&o.name, ordered_for(format, &o.parameters, &a))],
                    tw,
                    0,
                );
                assert!(!g.accepts_str(&b), "other tool taken: {b}");
            }
            let t = r.tools.iter().find(|t| t.name == *n).unwrap();
            for bad in broken_args(&mut rng, &t.parameters, &Value::Object(a.clone())) {
                if !bad.is_object() {
                    continue;
                }
                let bad = ordered_for(format, &t.parameters, &bad);
                let b = render_calls(format, &r, &[(n, bad.clone())], tw, 0);
                let back = format.parse(&b, Some(&r)).tool_calls;
                if back.len() == 1 && back[0].arguments == serde_json::to_string(&bad).unwrap() {
                    assert!(!g.accepts_str(&b), "round {round}: took {b:?}");
                    refused_args += 1;
                }
            }
            assert!(!g.accepts_str(one.strip_suffix(sh.close).unwrap()));
            assert!(!g.accepts_str(&one.replace(sh.close, "</x>")));
        }
        assert!(refused_args > 100, "{refused_args}");
    }

    /// Seed-OSS, MiniMax M2 and GLM: random outputs (text, calls, tools not offered, slips a
    /// model makes without a grammar) stream as prefixes of their final reading.
    #[test]
    fn other_xml_formats_partial_is_prefix_of_parse() {
        let pieces = [
            "<seed:tool_call>",
            "</seed:tool_call>",
            "<minimax:tool_call>",
            "</minimax:tool_call>",
            "<invoke name=\"",
            "</invoke>",
            "<tool_call>",
            "</tool_call>",
            "<arg_key>",
            "</arg_key>",
            "<arg_value>",
            "</arg_value>",
            "</parameter>",
            "<｜DSML｜invoke name=\"",
            "</｜DSML｜parameter>",
            " string=\"true\">",
            "</｜DSML｜function_calls>",
            "<function name=\"",
            "</param>",
            "<![CDATA[",
            "]]>",
            "<tool_calls:opensource>",
            "</tool_calls:opensource>",
            "<tool_call:opensource>",
            "<tool_sep:opensource>",
            "</tool_call:opensource>",
            "<arg_key:opensource>",
            "</arg_key:opensource>",
            "<arg_value:opensource>",
            "</arg_value:opensource>",
            "\">",
            "{\"a\": \"",
            "1",
            "\n",
            " ",
            "é",
        ];
        let mut rng = Rng(0x5EED_0A7F);
        let (mut checked, mut with_calls) = (0usize, 0usize);
        for round in 0..48 * OTHERS.len() {
            let format = OTHERS[round % OTHERS.len()];
            let r = random_req(&mut rng, round / OTHERS.len(), true);
            let mut text = random_output(&mut rng, format, &r);
            if round % 3 != 0 {
                for _ in 0..1 + rng.below(3) {
                    mutate(&mut rng, &mut text, &pieces, 24);
                }
            }
            let (n, calls) = check_with_and_without_tools(format, &text, &r);
            checked += n;
            with_calls += calls;
        }
        assert!(
            checked > 20_000 && with_calls > 150,
            "{checked} {with_calls}"
        );
    }

    #[test]
    fn other_xml_formats_detect_and_plan() {
        assert_eq!(
            detect("<seed:tool_call>\n<function=f>\n<parameter=k>"),
            Some(Format::SeedOss)
        );
        assert_eq!(
            detect("<minimax:tool_call><invoke name=\"f\"><parameter name=\"k\">"),
            Some(Format::MiniMaxM2)
        );
        assert_eq!(
            detect("<tool_call>{{ name }}\n<arg_key>k</arg_key>\n<arg_value>v</arg_value>"),
            Some(Format::Glm { newlines: true })
        );
        assert_eq!(
            detect("<tool_call>{{ name }}<arg_key>k</arg_key><arg_value>v</arg_value>"),
            Some(Format::Glm { newlines: false })
        );
        assert_eq!(
            detect("'<tool_call>' ~ name ~ '<arg_key>' ~ k ~ '</arg_key>\\n<arg_value>'"),
            Some(Format::Glm { newlines: true })
        );
        // Ling 3's: GLM's tags in `<role>` sections
        assert_eq!(
            detect("<role>ASSISTANT</role><tool_call><arg_key><arg_value>"),
            Some(Format::Ling3)
        );
        // Hy3's, built when rendering
        assert_eq!(
            detect("HYTK = ':opensource' '<tool_calls{}>' '<tool_sep{}>' '<arg_key{}>'"),
            Some(Format::Hy3)
        );
        assert_eq!(
            detect("'<tool_calls{}>' '<tool_sep{}>' '<arg_key{}>'"),
            None
        );
        assert_eq!(detect("<tool_call><function=f><parameter=k>"), None);
        let ours = [
            ("ByteDance-Seed-OSS.jinja", Format::SeedOss),
            ("MiniMax-M2.jinja", Format::MiniMaxM2),
            ("GLM-4.6.jinja", Format::Glm { newlines: true }),
            ("GLM-4.7-Flash.jinja", Format::Glm { newlines: false }),
            (
                "poolside-Laguna-XS-2.1.jinja",
                Format::Glm { newlines: true },
            ),
            ("poolside-Laguna-XS.2.jinja", Format::Glm { newlines: true }),
            (
                "poolside-Laguna-S-2.1.jinja",
                Format::Glm { newlines: false },
            ),
            ("Spark2.5.jinja", Format::Glm { newlines: false }),
            (
                "deepseek-ai-DeepSeek-V3.2.jinja",
                Format::DeepSeekDsml { v4: false },
            ),
            (
                "deepseek-ai-DeepSeek-V4.jinja",
                Format::DeepSeekDsml { v4: true },
            ),
            (
                "deepseek-ai-DeepSeek-V4-Flash-0731.jinja",
                Format::DeepSeekDsml { v4: true },
            ),
            ("openbmb-MiniCPM5-1B.jinja", Format::MiniCpm5),
            ("inclusionai-ling-3.0-flash.jinja", Format::Ling3),
            ("tencent-Hy3.jinja", Format::Hy3),
        ];
        check_detect_all(detect, &ours);
        // the shapes' names in errors, the value framing, GLM's name right after its tag
        let ok = tool(
            "f",
            json!({"properties": {"a": {"type": "integer"}}, "required": ["a"]}),
        );
        for (format, bad, needle) in [
            (Format::SeedOss, "a>b", "Seed-OSS"),
            (Format::MiniMaxM2, "a\"b", "MiniMax M2"),
            (Format::Glm { newlines: true }, "a b", "GLM"),
            (Format::Glm { newlines: false }, "a<b", "GLM"),
            (Format::Ling3, "a b", "Ling 3"),
            (Format::Hy3, "a<b", "Hy3"),
        ] {
            let e = format
                .plan(&req(
                    vec![ok.clone(), tool(bad, json!({}))],
                    ToolChoice::Auto,
                    false,
                ))
                .unwrap_err();
            assert!(e.contains(needle) && e.contains(bad), "{e}");
            assert!(format.markup().contains(&format.xml_shape().open));
        }
        let r = req(vec![ok], ToolChoice::Required, false);
        let g = |f: Format| grammar(&f.plan(&r).unwrap().unwrap());
        let glm46 = g(Format::Glm { newlines: true });
        let glm47 = g(Format::Glm { newlines: false });
        let tight = "<tool_call>f<arg_key>a</arg_key><arg_value>1</arg_value></tool_call>";
        let nl = "<tool_call>f\n<arg_key>a</arg_key>\n<arg_value>1</arg_value>\n</tool_call>";
        assert!(glm47.accepts_str(tight) && !glm47.accepts_str(nl));
        assert!(glm46.accepts_str(nl) && !glm46.accepts_str(tight));
        assert!(!glm46.accepts_str(&nl.replace("<tool_call>f", "<tool_call>\nf")));
        // DSML: the required parameters first, as llama.cpp's reader takes them
        let dsml = |v4| {
            let t = tool(
                "f",
                json!({"properties": {"a": {"type": "integer"}, "b": {"type": "string"}},
                       "required": ["b"]}),
            );
            let r = req(vec![t], ToolChoice::Required, false);
            grammar(&Format::DeepSeekDsml { v4 }.plan(&r).unwrap().unwrap())
        };
        let (a, b) = (
            "<｜DSML｜parameter name=\"a\" string=\"false\">1</｜DSML｜parameter>\n",
            "<｜DSML｜parameter name=\"b\" string=\"true\">x</｜DSML｜parameter>\n",
        );
        for v4 in [false, true] {
            let sh = super::dsml(v4);
            let call = |ps: &str| {
                format!(
                    "{}\n<｜DSML｜invoke name=\"f\">\n{ps}</｜DSML｜invoke>\n{}",
                    sh.open, sh.close
                )
            };
            let g = dsml(v4);
            assert!(g.accepts_str(&call(&format!("{b}{a}"))));
            assert!(g.accepts_str(&call(b)));
            assert!(!g.accepts_str(&call(&format!("{a}{b}"))));
            // the string attribute follows the schema, nothing follows the block
            assert!(!g.accepts_str(&call(&b.replace("true", "false"))));
            assert!(!g.accepts_str(&format!("{}\n", call(b))));
        }
        // (the space llama.cpp reads no call with)
        assert!(!glm46.accepts_str(&nl.replace("f\n", "f ")));
        assert!(!glm47.accepts_str(&tight.replace("f<", "f\n<")));
        // Ling 3: no newline between two parameters, one before the call's end
        let two = req(
            vec![tool(
                "f",
                json!({"properties": {"a": {"type": "integer"}, "b": {"type": "string"}},
                       "required": ["a", "b"]}),
            )],
            ToolChoice::Required,
            false,
        );
        let ling = grammar(&Format::Ling3.plan(&two).unwrap().unwrap());
        let l = "<tool_call>f\n<arg_key>a</arg_key>\n<arg_value>1</arg_value><arg_key>b</arg_key>\n<arg_value>x y</arg_value>\n</tool_call>";
        assert!(ling.accepts_str(l));
        assert!(!ling.accepts_str(&l.replace("</arg_value><", "</arg_value>\n<")));
        assert!(!ling.accepts_str(&l.replace("\n</tool_call>", "</tool_call>")));
        let hy = grammar(&Format::Hy3.plan(&two).unwrap().unwrap());
        let h = "<tool_calls:opensource>\n<tool_call:opensource>f<tool_sep:opensource>\n<arg_key:opensource>a</arg_key:opensource>\n<arg_value:opensource>1</arg_value:opensource>\n<arg_key:opensource>b</arg_key:opensource>\n<arg_value:opensource>x y</arg_value:opensource>\n</tool_call:opensource>\n</tool_calls:opensource>";
        assert!(hy.accepts_str(h));
        assert!(!hy.accepts_str(&h.replace(">\n<arg_key", "><arg_key")));
        assert!(!hy.accepts_str(&h.replace("<tool_sep:opensource>\n", "<tool_sep:opensource>")));
        let seed = g(Format::SeedOss);
        let s = "<seed:tool_call>\n<function=f>\n<parameter=a>1</parameter>\n</function>\n</seed:tool_call>";
        assert!(seed.accepts_str(s));
        assert!(!seed.accepts_str(&s.replace(">1<", ">\n1\n<")));
    }

    /// The templates' own renderings of an assistant message with calls (GLM 4.6 writes a
    /// newline after the name and the tags; Seed-OSS's and MiniCPM5's non-strings are
    /// Python's, MiniCPM5's string with a `<` in CDATA; MiniMax M2 and DSML put both calls in
    /// one block) read back as the calls.
    #[test]
    fn other_xml_formats_read_their_templates_renderings() {
        let want = r#"{"city":"Pa\"ris <x>\nline 2","days":3,"o":{"b":"<&'é>","a":[true,null]}}"#;
        let cases = [
            (Format::Glm { newlines: true }, "\n<think></think>\nLet me check.\n<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Pa\"ris <x>\nline 2</arg_value>\n<arg_key>days</arg_key>\n<arg_value>3</arg_value>\n<arg_key>o</arg_key>\n<arg_value>{\"b\": \"<&'é>\", \"a\": [true, null]}</arg_value>\n</tool_call>\n<tool_call>ping\n</tool_call>", want),
            (Format::Glm { newlines: false }, "Let me check.<tool_call>get_weather<arg_key>city</arg_key><arg_value>Pa\"ris <x>\nline 2</arg_value><arg_key>days</arg_key><arg_value>3</arg_value><arg_key>o</arg_key><arg_value>{\"b\": \"<&'é>\", \"a\": [true, null]}</arg_value></tool_call><tool_call>ping</tool_call>", want),
            (Format::Ling3, "Let me check.\n<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Pa\"ris <x>\nline 2</arg_value><arg_key>days</arg_key>\n<arg_value>3</arg_value><arg_key>o</arg_key>\n<arg_value>{\"b\": \"<&'é>\", \"a\": [true, null]}</arg_value>\n</tool_call>\n<tool_call>ping\n\n</tool_call>", want),
            (Format::Hy3, "Let me check.<tool_calls:opensource>\n<tool_call:opensource>get_weather<tool_sep:opensource>\n<arg_key:opensource>city</arg_key:opensource>\n<arg_value:opensource>Pa\"ris <x>\nline 2</arg_value:opensource>\n<arg_key:opensource>days</arg_key:opensource>\n<arg_value:opensource>3</arg_value:opensource>\n<arg_key:opensource>o</arg_key:opensource>\n<arg_value:opensource>{\"b\": \"<&'é>\", \"a\": [true, null]}</arg_value:opensource>\n</tool_call:opensource>\n<tool_call:opensource>ping<tool_sep:opensource>\n</tool_call:opensource>\n</tool_calls:opensource>", want),
            (Format::MiniMaxM2, "Let me check.\n<minimax:tool_call>\n<invoke name=\"get_weather\">\n<parameter name=\"city\">Pa\"ris <x>\nline 2</parameter>\n<parameter name=\"days\">3</parameter>\n<parameter name=\"o\">{\"b\": \"<&'é>\", \"a\": [true, null]}</parameter>\n</invoke>\n<invoke name=\"ping\">\n</invoke>\n</minimax:tool_call>", want),
            (Format::DeepSeekDsml { v4: false }, "Let me check.\n\n<｜DSML｜function_calls>\n<｜DSML｜invoke name=\"get_weather\">\n<｜DSML｜parameter name=\"city\" string=\"true\">Pa\"ris <x>\nline 2</｜DSML｜parameter>\n<｜DSML｜parameter name=\"days\" string=\"false\">3</｜DSML｜parameter>\n<｜DSML｜parameter name=\"o\" string=\"false\">{\"b\": \"<&'é>\", \"a\": [true, null]}</｜DSML｜parameter>\n</｜DSML｜invoke>\n<｜DSML｜invoke name=\"ping\">\n</｜DSML｜invoke>\n</｜DSML｜function_calls>", want),
            (Format::DeepSeekDsml { v4: true }, "Let me check.\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"get_weather\">\n<｜DSML｜parameter name=\"city\" string=\"true\">Pa\"ris <x>\nline 2</｜DSML｜parameter>\n<｜DSML｜parameter name=\"days\" string=\"false\">3</｜DSML｜parameter>\n<｜DSML｜parameter name=\"o\" string=\"false\">{\"b\": \"<&'é>\", \"a\": [true, null]}</｜DSML｜parameter>\n</｜DSML｜invoke>\n<｜DSML｜invoke name=\"ping\">\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>", want),
            (Format::MiniCpm5, "Let me check.\n<function name=\"get_weather\"><param name=\"city\"><![CDATA[Pa\"ris <x>\nline 2]]></param><param name=\"days\">3</param><param name=\"ok\">True</param></function>\n<function name=\"ping\"></function>", r#"{"city":"Pa\"ris <x>\nline 2","days":3,"ok":true}"#),
            (Format::SeedOss, "Let me check.\n\n<seed:tool_call>\n<function=get_weather>\n<parameter=city>Pa\"ris <x>\nline 2</parameter>\n<parameter=days>3</parameter>\n<parameter=ok>True</parameter>\n</function>\n</seed:tool_call>\n<seed:tool_call>\n<function=ping>\n</function>\n</seed:tool_call>", r#"{"city":"Pa\"ris <x>\nline 2","days":3,"ok":true}"#),
        ];
        for (format, text, args) in cases {
            let r = req(weather_tools(), ToolChoice::Auto, true);
            let p = format.parse(text, Some(&r));
            assert!(p.content.ends_with("Let me check."), "{format:?} {p:?}");
            assert_eq!(
                p.tool_calls,
                vec![call("get_weather", args), call("ping", "{}")],
                "{format:?}"
            );
            check_stream_calls(format, text, &r);
        }
    }

    /// Not a check: with `MUSER_XML_DUMP` set to a path, writes random outputs of the XML
    /// formats (text, then calls in their templates' layout) with their requests' tools and
    /// Muser's final reading, one JSON object a line, which
    /// `tests/python/test_chat_reading.py` has llama.cpp's parser read
    /// (`test_xml_random_outputs_read_as_llama_cpp_reads_them`).
    #[test]
    fn dump_outputs_for_the_llama_server_comparison() {
        let Some(path) = std::env::var_os("MUSER_XML_DUMP") else {
            return;
        };
        let n: usize = std::env::var("MUSER_XML_DUMP_N").map_or(50, |v| v.parse().unwrap());
        let mut rng = Rng(std::env::var("MUSER_XML_DUMP_SEED").map_or(7, |v| v.parse().unwrap()));
        let mut out = String::new();
        for (format, file) in [
            (Format::SeedOss, "ByteDance-Seed-OSS.jinja"),
            (Format::MiniMaxM2, "MiniMax-M2.jinja"),
            (Format::Glm { newlines: true }, "GLM-4.6.jinja"),
            (Format::Glm { newlines: false }, "GLM-4.7-Flash.jinja"),
            (
                Format::DeepSeekDsml { v4: false },
                "deepseek-ai-DeepSeek-V3.2.jinja",
            ),
            (
                Format::DeepSeekDsml { v4: true },
                "deepseek-ai-DeepSeek-V4.jinja",
            ),
            (Format::MiniCpm5, "openbmb-MiniCPM5-1B.jinja"),
            (Format::Ling3, "inclusionai-ling-3.0-flash.jinja"),
            (Format::Hy3, "tencent-Hy3.jinja"),
        ] {
            // (the template's own whitespace between the tags; llama.cpp reads one MiniMax M2
            // call a reply)
            let ws = template_ws(format).unwrap_or("\n");
            for round in 0..n {
                let r = random_req(&mut rng, 1 + 3 * round, format != Format::MiniMaxM2);
                let calls: Vec<(&str, Map<String, Value>)> = random_calls(&mut rng, &r)
                    .into_iter()
                    // (in the order the grammar writes them)
                    .map(|(t, a)| (t.name.as_str(), ordered_for(format, &t.parameters, &a)))
                    .collect();
                let before = ["", "Sure.", "Let me check.\n\n", " a < b ", "é 😀 "];
                let text = format!(
                    "{}{}",
                    before[rng.below(before.len())],
                    render_calls(format, &r, &calls, ws, rng.below(4))
                );
                let p = format.parse_final(&text, Some(&r));
                let tools: Vec<Value> = r
                    .tools
                    .iter()
                    .map(|t| {
                        json!({"type": "function", "function": {"name": t.name,
                        "description": t.description, "parameters": t.parameters}})
                    })
                    .collect();
                let calls: Vec<Value> = p
                    .tool_calls
                    .iter()
                    .map(|c| json!({"name": c.name, "arguments": c.arguments}))
                    .collect();
                let line = json!({"template": file, "tools": tools, "text": text,
                                  "content": p.content, "calls": calls});
                out.push_str(&format!("{line}\n"));
            }
        }
        std::fs::write(path, out).unwrap();
    }
}
