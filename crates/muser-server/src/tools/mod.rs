//! Tool calling: the request's `tools` and `tool_choice`, the output format the chat template
//! teaches its model (`Format::detect`), the grammar that keeps the model's calls well formed
//! (`Format::plan`), and the reading of the model's text back into content, reasoning and calls
//! (`Format::parse`).
//!
//! The formats: `generic` (any other template: one JSON object, described in the system
//! prompt), `hermes` (`<tool_call>` JSON blocks: Qwen 2.5 / 3, Hermes), `qwen3-coder`
//! (`<tool_call><function=NAME><parameter=K>` XML: Qwen3-Coder, Qwen 3.5, Nemotron Nano 3),
//! `llama3` (Llama 3.x: the reply is one `{"name": ..., "parameters": ...}` object),
//! `mistral-nemo` (`[TOOL_CALLS][{...}]`), `mistral` (`[TOOL_CALLS]NAME[ARGS]{...}`: Mistral
//! Small 3.2, Devstral), `deepseek-r1` and `deepseek-v3.1` (`<｜tool▁calls▁begin｜>` blocks) and
//! `atem` (Muse Glimmer's channels, whose reasoning is split from the reply with or without
//! tools) and `harmony` (gpt-oss's channels, likewise).

use serde_json::{Map, Value};

use crate::api::show;
use crate::error::ApiError;

mod atem;
mod deepseek;
mod functionary;
pub(crate) mod gemma4;
mod generic;
mod harmony;
mod hermes;
mod json_list;
pub(crate) mod kimi3;
mod llama3;
mod minimax_m3;
mod mistral;
mod partial;
mod pythonic;
pub mod think;
mod xml_args;
mod xml_calls;

/// One function the model may call (OpenAI's `tools[i].function`).
#[derive(Clone, Debug, PartialEq)]
pub struct Tool {
    pub name: String,
    pub description: Option<String>,
    /// The arguments' JSON schema (`{"type": "object", "properties": {}}` when the request gave
    /// none).
    pub parameters: Value,
}

/// OpenAI's `tool_choice`.
#[derive(Clone, Debug, PartialEq)]
pub enum ToolChoice {
    /// The model may not call a tool (no grammar; the tools are still shown to the template).
    None,
    /// The model answers or calls tools, as it likes.
    Auto,
    /// The model must call at least one tool.
    Required,
    /// The model must call this function (`{"type": "function", "function": {"name": ...}}`).
    Function(String),
}

/// What a chat request asks of tool calling.
#[derive(Clone, Debug, PartialEq)]
pub struct ToolRequest {
    pub tools: Vec<Tool>,
    pub choice: ToolChoice,
    /// `parallel_tool_calls`: more than one call in a reply (default false, as llama-server).
    pub parallel: bool,
    /// The JSON schema of a reply that calls no tool (the request's `response_format` or
    /// `json_schema`), under `auto`: the model answers in it or calls tools. None: free text.
    pub response: Option<Value>,
}

/// A text trigger of a lazy grammar (llama.cpp's word, pattern and full pattern triggers).
#[derive(Clone, Debug, PartialEq)]
pub enum Trigger {
    /// The grammar starts where this text first appears in the output.
    Word(String),
    /// The grammar starts where this regex (fancy-regex syntax) matches, at its first
    /// non-empty capture group (the whole match when none).
    Pattern(String),
    /// As `Pattern`, but the regex must match the whole output so far.
    PatternFull(String),
}

/// How one request's generation is constrained and prompted.
#[derive(Clone, Debug, PartialEq)]
pub struct Plan {
    /// GBNF (root rule `root`) for the model's output: from its start when `lazy` is false,
    /// else from the first trigger on.
    pub gbnf: String,
    pub lazy: bool,
    /// Non-empty when `lazy`.
    pub triggers: Vec<Trigger>,
    /// Text the format adds to the system prompt (the generic format describes its JSON
    /// there); None when the template shows the tools itself.
    pub system: Option<String>,
}

/// One call read from the model's output.
#[derive(Clone, Debug, PartialEq)]
pub struct ToolCall {
    /// The id the model wrote, when its format has one (the caller makes one otherwise).
    pub id: Option<String>,
    pub name: String,
    /// The arguments as JSON text (an object).
    pub arguments: String,
}

/// The model's output read back.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Parsed {
    /// The reply's text, with the calls' markup taken out.
    pub content: String,
    /// The reasoning the format keeps apart from the reply, if any.
    pub reasoning: Option<String>,
    pub tool_calls: Vec<ToolCall>,
}

/// The tool-call formats Muser knows, told apart by markers in the chat template's source.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// Any other template: the generic format, whose JSON output is described in the system
    /// prompt and enforced by the grammar.
    Generic,
    /// `<tool_call>{"name": ..., "arguments": ...}</tool_call>` (Hermes 2 Pro, Qwen 2.5, Qwen 3).
    Hermes,
    /// Muse Glimmer's ATEM channels and `<atem:function_calls>` blocks.
    Atem,
    /// `<tool_call>\n<function=NAME>\n<parameter=K>\nV\n</parameter>\n</function>\n</tool_call>`
    /// (Qwen3-Coder, Qwen 3.5, Nemotron Nano 3, StepFun 3.5).
    QwenXml,
    /// Llama 3.x: a call is the whole reply, `{"name": NAME, "parameters": {...}}`; where the
    /// template has Llama 3.1's built-in tools (`builtin_tools`: it writes `<|python_tag|>`),
    /// also `<|python_tag|>NAME.call(K=V)` or raw code for the request's built-ins.
    Llama3 { builtin_tools: bool },
    /// Mistral Nemo: `[TOOL_CALLS][{"name": ..., "arguments": {...}, "id": "<9 alphanumerics>"}]`.
    MistralNemo,
    /// Mistral's later tokenizers (Small 3.2, Devstral):
    /// `[TOOL_CALLS]NAME[CALL_ID]ID[ARGS]{...}`, `[CALL_ID]` only where the template writes it.
    Mistral { call_id: bool },
    /// DeepSeek R1: `<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME\n```json\n{...}\n```<｜tool▁call▁end｜>...<｜tool▁calls▁end｜>`.
    DeepSeekR1,
    /// DeepSeek V3.1: `<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>NAME<｜tool▁sep｜>{...}<｜tool▁call▁end｜>...<｜tool▁calls▁end｜>`.
    DeepSeekV31,
    /// Gemma 4: `<|tool_call>call:NAME{key:<|"|>text<|"|>,...}<tool_call|>`, and thought
    /// channels in the reply.
    Gemma4,
    /// Kimi K2: `<|tool_calls_section_begin|><|tool_call_begin|>functions.NAME:IDX<|tool_call_argument_begin|>{...}<|tool_call_end|>...<|tool_calls_section_end|>`.
    KimiK2,
    /// JSON call objects after a tag (Nemotron Nano v2, Command R7B, Cohere2MoE, Granite 3.3,
    /// Apriel, FireFunction v2, MiniMax M1, GigaChat 3 and 3.1).
    JsonList(&'static json_list::Shape),
    /// OpenAI's harmony (gpt-oss): `<|channel|>analysis<|message|>...<|end|>` messages, calls
    /// ` to=functions.NAME<|channel|>commentary json<|message|>{...}`.
    Harmony,
    /// Seed-OSS: `<seed:tool_call>\n<function=NAME>\n<parameter=K>V</parameter>\n</function>\n</seed:tool_call>`.
    SeedOss,
    /// MiniMax M2: `<minimax:tool_call>\n<invoke name="NAME">\n<parameter name="K">V</parameter>\n</invoke>\n</minimax:tool_call>`.
    MiniMaxM2,
    /// MiniMax M3: `]<]minimax[>[<tool_call>\n]<]minimax[>[<invoke name="NAME">]<]minimax[>[<K>V]<]minimax[>[</K>...`,
    /// values nested XML by the tool's schema.
    MiniMaxM3,
    /// GLM 4.5 to 4.7: `<tool_call>NAME<arg_key>K</arg_key><arg_value>V</arg_value></tool_call>`,
    /// with a newline after the name and after each tag pair where the template writes them.
    Glm { newlines: bool },
    /// Liquid's LFM2 and LFM2.5: a Python list of calls with keyword arguments,
    /// `<|tool_call_start|>[NAME(K=V, ...), ...]<|tool_call_end|>`.
    Lfm2,
    /// DeepSeek V3.2 and V4's DSML: `<｜DSML｜function_calls>` (V4: `tool_calls`) blocks of
    /// `<｜DSML｜invoke name="NAME">` calls, `<｜DSML｜parameter name="K" string="true|false">V</｜DSML｜parameter>`.
    DeepSeekDsml { v4: bool },
    /// MiniCPM5: `<function name="NAME"><param name="K">V</param></function>`.
    MiniCpm5,
    /// Solar Open: `<|tool_calls|><|tool_call:begin|>ID<|tool_call:name|>NAME<|tool_call:args|>{...}<|tool_call:end|>...<|calls|>`.
    SolarOpen,
    /// Functionary v3.1 (`<function=NAME>{...}</function>`) and v3.2 (`>>>NAME\n{...}`
    /// messages, `>>>all\n` for the reply).
    Functionary(functionary::Flavor),
    /// Ling 3 (Bailing V3): GLM's `<tool_call>NAME\n<arg_key>K</arg_key>\n<arg_value>V</arg_value>...\n</tool_call>`
    /// in `<role>` sections.
    Ling3,
    /// Tencent Hy3: `<tool_calls:opensource>\n<tool_call:opensource>NAME<tool_sep:opensource>\n<arg_key:opensource>K</arg_key:opensource>\n<arg_value:opensource>V</arg_value:opensource>\n</tool_call:opensource>\n</tool_calls:opensource>`.
    Hy3,
    /// Kimi K3: `<|open|>tools<|sep|><|open|>call tool="NAME" index="N"<|sep|><|open|>argument key="K" type="T"<|sep|>V<|close|>argument<|sep|>...<|close|>call<|sep|><|close|>tools<|sep|>`,
    /// after `think` and `response` sections.
    KimiK3,
}

/// Where a lazy call grammar of a format starts, so that it can be made to wait for the end of
/// a reasoning block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LazyStart {
    /// The first occurrence of this text anywhere in the reply.
    Word(&'static str),
    /// This regex (fancy-regex syntax, no capture groups) at the start of the reply, after
    /// optional whitespace.
    ReplyStart(&'static str),
}

impl LazyStart {
    /// The trigger of a lazy plan when no reasoning block comes first (`think::after_block`
    /// makes the one that waits for it): the word itself, or the regex at the reply's start
    /// as the capture group of a pattern.
    pub fn trigger(self) -> Trigger {
        match self {
            LazyStart::Word(w) => Trigger::Word(w.to_string()),
            LazyStart::ReplyStart(re) => Trigger::Pattern(format!(r"^\s*({re})")),
        }
    }
}

impl Format {
    /// The format a chat template teaches (None: the fallback template, generic).
    pub fn detect(template: Option<&str>) -> Format {
        let Some(t) = template else {
            return Format::Generic;
        };
        if t.contains("<atem:function_calls>") && t.contains("<|eom|>") {
            Format::Atem
        } else if kimi3::detect(t) {
            Format::KimiK3
        } else if harmony::detect(t) {
            Format::Harmony
        } else if gemma4::detect(t) {
            Format::Gemma4
        } else if minimax_m3::detect(t) {
            Format::MiniMaxM3
        } else if xml_calls::detect_qwen(t) {
            Format::QwenXml
        } else if let Some(f) = xml_calls::detect(t) {
            f
        } else if t.contains("<tool_call>")
            && !["<function=", "<arg_key>", "<invoke name=", "<tool_calls>["]
                .iter()
                .any(|m| t.contains(m))
        {
            // Those are XML calls inside `<tool_call>` (Qwen3-Coder's, GLM's, MiniMax's), or
            // Apriel's JSON list in `<tool_calls>`: not Hermes JSON.
            Format::Hermes
        } else if let Some(f) = deepseek::detect(t) {
            f
        } else if let Some(flavor) = functionary::detect(t) {
            Format::Functionary(flavor)
        } else if let Some(f) = mistral::detect(t) {
            f
        } else if pythonic::detect(t) {
            Format::Lfm2
        } else if let Some(shape) = json_list::detect(t) {
            Format::JsonList(shape)
        } else if llama3::detect(t) {
            Format::Llama3 {
                builtin_tools: llama3::detect_builtin_tools(t),
            }
        } else {
            Format::Generic
        }
    }

    /// "generic", "hermes" or "atem" (llama-server's `chat_format` names where it has them).
    pub fn name(self) -> &'static str {
        match self {
            Format::Generic => "generic",
            Format::Hermes => "hermes",
            Format::Atem => "atem",
            Format::QwenXml => "qwen3-coder",
            Format::Llama3 { .. } => "llama3",
            Format::MistralNemo => "mistral-nemo",
            Format::Mistral { .. } => "mistral",
            Format::DeepSeekR1 => "deepseek-r1",
            Format::DeepSeekV31 => "deepseek-v3.1",
            Format::Gemma4 => "gemma4",
            Format::KimiK2 => "kimi-k2",
            Format::JsonList(shape) => shape.name,
            Format::Harmony => "harmony",
            Format::SeedOss => "seed-oss",
            Format::MiniMaxM2 => "minimax-m2",
            Format::MiniMaxM3 => "minimax-m3",
            Format::Glm { .. } => "glm-4.5",
            Format::Lfm2 => "lfm2",
            Format::DeepSeekDsml { v4 } => ["deepseek-v3.2", "deepseek-v4"][usize::from(v4)],
            Format::MiniCpm5 => "minicpm5",
            Format::SolarOpen => "solar-open",
            Format::Functionary(functionary::Flavor::V31) => "functionary-v3.1",
            Format::Functionary(functionary::Flavor::V32) => "functionary-v3.2",
            Format::Ling3 => "ling-3",
            Format::Hy3 => "hy3",
            Format::KimiK3 => "kimi-k3",
        }
    }

    /// The text a lazy call grammar of this format starts at, when its trigger is a word (so
    /// that it can be made to wait for the end of a reasoning block).
    pub fn lazy_start(self) -> Option<LazyStart> {
        match self {
            Format::Generic | Format::Atem | Format::Harmony => None,
            Format::Functionary(functionary::Flavor::V32) => None,
            Format::Hermes => Some(hermes::LAZY_START),
            Format::QwenXml
            | Format::SeedOss
            | Format::MiniMaxM2
            | Format::Glm { .. }
            | Format::DeepSeekDsml { .. }
            | Format::MiniCpm5
            | Format::Ling3
            | Format::Hy3
            | Format::KimiK3 => Some(self.xml_shape().lazy_start()),
            Format::MiniMaxM3 => Some(minimax_m3::LAZY_START),
            Format::Llama3 { .. } => Some(llama3::LAZY_START),
            Format::MistralNemo | Format::Mistral { .. } => Some(mistral::LAZY_START),
            Format::DeepSeekR1 | Format::DeepSeekV31 => Some(deepseek::LAZY_START),
            Format::Gemma4 => Some(gemma4::LAZY_START),
            Format::KimiK2 => Some(deepseek::KIMI_LAZY_START),
            Format::SolarOpen => Some(deepseek::SOLAR_LAZY_START),
            Format::Functionary(functionary::Flavor::V31) => Some(functionary::V31_LAZY_START),
            Format::JsonList(shape) => Some(shape.lazy_start()),
            Format::Lfm2 => Some(pythonic::LAZY_START),
        }
    }

    /// The template's reasoning tags as this format's reading takes them. Where llama.cpp's
    /// handler for the format ends a block left open at a call's opening (or Cohere2MoE's at
    /// its reply's) and reads the call, so does Muser (`Tags::ends`): the Qwen3-Coder family,
    /// Ling 3, Kimi K2 and Cohere2MoE with or without calls to read (`calls`), DeepSeek's DSML
    /// when it reads calls. The handlers of LFM2, Kimi K2 and Ministral 3 open a block only
    /// as the output's first text (`Tags::open_first`). Other formats keep a call written before the closing tag as
    /// reasoning, as llama.cpp does.
    pub fn reasoning_tags(self, tags: think::Tags, calls: bool) -> think::Tags {
        let ends: &'static [&'static str] = match self {
            Format::QwenXml | Format::Ling3 => std::slice::from_ref(&self.xml_shape().open),
            Format::DeepSeekDsml { .. } if calls => std::slice::from_ref(&self.xml_shape().open),
            Format::KimiK2 => deepseek::KIMI_REASONING_ENDS,
            Format::JsonList(s) if *s == json_list::COHERE2MOE => {
                json_list::COHERE2MOE_REASONING_ENDS
            }
            _ => &[],
        };
        think::Tags {
            ends,
            // (MiniMax M3's tags read a block only at the output's start whatever the format)
            open_first: tags.open_first
                || matches!(
                    self,
                    Format::Lfm2 | Format::KimiK2 | Format::Mistral { .. } | Format::MistralNemo
                ),
            ..tags
        }
    }

    /// The texts of the format's markup (llama-server's preserved tokens: output, and
    /// triggering, even where the vocabulary makes them control tokens).
    pub fn markup(self) -> &'static [&'static str] {
        match self {
            Format::Generic => &[],
            Format::Hermes => &["<tool_call>", "</tool_call>"],
            // The markup llama.cpp preserves for Muse Glimmer: its message framing and the
            // ATEM tags.
            Format::QwenXml
            | Format::SeedOss
            | Format::MiniMaxM2
            | Format::Glm { .. }
            | Format::DeepSeekDsml { .. }
            | Format::MiniCpm5
            | Format::Ling3
            | Format::Hy3
            | Format::KimiK3 => self.xml_shape().markup,
            Format::MiniMaxM3 => minimax_m3::MARKUP,
            Format::Llama3 {
                builtin_tools: false,
            } => llama3::MARKUP,
            Format::Llama3 {
                builtin_tools: true,
            } => llama3::MARKUP_BUILTIN,
            Format::MistralNemo => mistral::MARKUP_NEMO,
            Format::Mistral { .. } => mistral::MARKUP,
            Format::DeepSeekR1 | Format::DeepSeekV31 => deepseek::MARKUP,
            Format::Gemma4 => gemma4::MARKUP,
            Format::KimiK2 => deepseek::KIMI_MARKUP,
            Format::SolarOpen => deepseek::SOLAR_MARKUP,
            Format::Functionary(functionary::Flavor::V31) => functionary::V31_MARKUP,
            Format::Functionary(functionary::Flavor::V32) => functionary::V32_MARKUP,
            Format::JsonList(shape) => shape.markup,
            Format::Harmony => harmony::MARKUP,
            Format::Lfm2 => pythonic::MARKUP,
            Format::Atem => &[
                "<|start|>",
                "<|message|>",
                "<|eom|>",
                "<|eot|>",
                "<atem:function_calls>",
                "<atem:invoke",
                "<atem:parameter",
                "</atem:parameter>",
                "</atem:invoke>",
                "</atem:function_calls>",
            ],
        }
    }

    /// Variables the chat template gets for `req` besides `tools` (a request's own
    /// `chat_template_kwargs` win over them): Llama 3.1's `builtin_tools`, the names of the
    /// request's built-in tools, where the template has them and the request offers any.
    pub fn template_variables(self, req: &ToolRequest) -> Vec<(&'static str, Value)> {
        match self {
            Format::Llama3 {
                builtin_tools: true,
            } => {
                let names = llama3::builtin_names(req);
                if names.is_empty() {
                    Vec::new()
                } else {
                    vec![("builtin_tools", Value::from(names))]
                }
            }
            Format::JsonList(shape) => json_list::template_variables(req, shape),
            _ => Vec::new(),
        }
    }

    /// The grammar and prompt additions for `req`; None when `req.choice` is `None` (no
    /// grammar, nothing added). An Err names what is wrong in the request (a tool's schema that
    /// cannot be made a grammar, a `Function` choice naming no tool).
    ///
    /// With a `response` schema under `auto` the grammar holds the whole output from its first
    /// token: either a reply in that schema or the calls (a reasoning block may come first,
    /// `think::block_first`). Under `required` or a named function the response schema has no
    /// reply to hold and is left out.
    pub fn plan(self, req: &ToolRequest) -> Result<Option<Plan>, String> {
        match (&req.response, &req.choice) {
            (Some(resp), ToolChoice::Auto) if !req.tools.is_empty() => {
                self.plan_with_response(req, resp).map(Some)
            }
            _ => self.plan_calls(req),
        }
    }

    /// A reply in the `response` schema, or the calls.
    fn plan_with_response(self, req: &ToolRequest, response: &Value) -> Result<Plan, String> {
        match self {
            // The generic reply's `response` is held by the schema.
            Format::Generic => generic::plan(req)?.ok_or_else(|| "no tools".to_string()),
            Format::Atem => Err(
                "a JSON response format together with tools is not supported in the ATEM chat \
                 format (Muse Glimmer's): give tool_choice \"none\", or leave out \
                 response_format"
                    .to_string(),
            ),
            Format::Harmony => harmony::plan_with_response(req, response),
            _ => {
                let forced = ToolRequest {
                    choice: ToolChoice::Required,
                    response: None,
                    ..req.clone()
                };
                let calls = self
                    .plan_calls(&forced)?
                    .ok_or_else(|| "no tools".to_string())?;
                let mut taken = rule_names(&calls.gbnf);
                let prefix = fresh_rule(&mut taken, "response-format");
                let (top, rules) =
                    muser_jsonschema::schema_to_gbnf_rules(response, &format!("{prefix}-"))
                        .map_err(|e| {
                            format!("the response format cannot be made a grammar: {e}")
                        })?;
                if let Some(clash) = rule_names(&rules).intersection(&taken).next() {
                    return Err(format!(
                        "the response format's grammar and the calls' share the rule `{clash}`"
                    ));
                }
                let calls_root = fresh_rule(&mut taken, "tool-calls");
                let mut gbnf = format!("root ::= {top} | {calls_root}\n");
                gbnf.push_str(&rename_rule(&calls.gbnf, "root", &calls_root));
                gbnf.push_str(&rules);
                Ok(Plan {
                    gbnf,
                    lazy: false,
                    triggers: Vec::new(),
                    system: calls.system,
                })
            }
        }
    }

    /// The calls' plan, `req.response` aside.
    fn plan_calls(self, req: &ToolRequest) -> Result<Option<Plan>, String> {
        match self {
            Format::Atem => atem::plan(req),
            Format::Generic => generic::plan(req),
            Format::Hermes => hermes::plan(req),
            Format::QwenXml
            | Format::SeedOss
            | Format::MiniMaxM2
            | Format::Glm { .. }
            | Format::DeepSeekDsml { .. }
            | Format::MiniCpm5
            | Format::Ling3
            | Format::Hy3 => xml_calls::plan(self.xml_shape(), req),
            Format::KimiK3 => kimi3::plan(req),
            Format::MiniMaxM3 => minimax_m3::plan(req),
            Format::Llama3 { builtin_tools } => llama3::plan(req, builtin_tools),
            Format::MistralNemo => mistral::plan(req, mistral::Flavor::Nemo),
            Format::Mistral { call_id } => mistral::plan(req, mistral::Flavor::Args { call_id }),
            Format::DeepSeekR1 => deepseek::plan(req, deepseek::Flavor::R1),
            Format::DeepSeekV31 => deepseek::plan(req, deepseek::Flavor::V31),
            Format::Gemma4 => gemma4::plan(req),
            Format::KimiK2 => deepseek::plan(req, deepseek::Flavor::Kimi),
            Format::SolarOpen => deepseek::plan(req, deepseek::Flavor::Solar),
            Format::Functionary(flavor) => functionary::plan(req, flavor),
            Format::JsonList(shape) => json_list::plan(req, shape),
            Format::Harmony => harmony::plan(req),
            Format::Lfm2 => pythonic::plan(req),
        }
    }

    /// Reads a finished output. Never fails: what does not follow the format is content.
    /// `req` is None when the request gave no tools (a format with reasoning still splits it).
    pub fn parse(self, text: &str, req: Option<&ToolRequest>) -> Parsed {
        match self {
            Format::Atem => atem::parse(text, req),
            Format::Generic => generic::parse(text, req),
            Format::Hermes => hermes::parse(text, req),
            Format::QwenXml
            | Format::SeedOss
            | Format::MiniMaxM2
            | Format::Glm { .. }
            | Format::DeepSeekDsml { .. }
            | Format::MiniCpm5
            | Format::Ling3
            | Format::Hy3 => xml_calls::parse(self.xml_shape(), text, req),
            Format::KimiK3 => kimi3::parse(text, req),
            Format::MiniMaxM3 => minimax_m3::parse(text, req),
            Format::Llama3 { builtin_tools } => llama3::parse(text, req, builtin_tools),
            Format::MistralNemo => mistral::parse(text, req, mistral::Flavor::Nemo),
            Format::Mistral { call_id } => {
                mistral::parse(text, req, mistral::Flavor::Args { call_id })
            }
            Format::DeepSeekR1 => deepseek::parse(text, req, deepseek::Flavor::R1),
            Format::DeepSeekV31 => deepseek::parse(text, req, deepseek::Flavor::V31),
            Format::Gemma4 => gemma4::parse(text, req),
            Format::KimiK2 => deepseek::parse(text, req, deepseek::Flavor::Kimi),
            Format::SolarOpen => deepseek::parse(text, req, deepseek::Flavor::Solar),
            Format::Functionary(flavor) => functionary::parse(text, req, flavor),
            Format::JsonList(shape) => json_list::parse(text, req, shape),
            Format::Harmony => harmony::parse(text, req),
            Format::Lfm2 => pythonic::parse(text, req),
        }
    }

    /// What streaming may already send of an unfinished output: `content` and `reasoning` that
    /// are prefixes of what `parse` gives for every continuation of `text`, and the calls begun
    /// so far: each with the name and id `parse_final` gives it, its arguments a prefix of
    /// `parse_final`'s. What it gives never shrinks as `text` grows (calls are never taken
    /// back: `parse_final` keeps them where `parse` would not).
    pub fn parse_partial(self, text: &str, req: Option<&ToolRequest>) -> Parsed {
        self.parse_partial_on(text, req, &mut Resume::default())
    }

    /// `parse_partial` of `text`, read on from what the readings before it with `resume`
    /// settled: `text` must start with the text of the last reading with `resume` (the same
    /// output, grown; a new output takes a new `Resume`). It gives exactly what
    /// `parse_partial` gives, parsing only the text after the last whole call block (what it
    /// settled before is copied into the reading, not read again). Inside the block being
    /// written, the JSON formats' long strings are read on from where the last reading left
    /// them, and the XML formats' and ATEM's long values are escaped into the arguments once
    /// (`partial::Memo`), so that a call with a long argument (a file's text) streams in time
    /// about linear in its length.
    ///
    /// Only the formats whose call blocks are read one after another, each on its own
    /// (`parse_blocks_partial`: hermes, qwen3-coder, mistral, mistral-nemo, deepseek-r1 and
    /// deepseek-v3.1), settle anything: each whole block, and the text before an opening or
    /// one that no opening can start in. Nemo's array is one block, so its calls settle only
    /// once it closes. The others read all of `text` again: llama3's call and generic's JSON
    /// are the whole reply, read at its end, and atem's and harmony's messages are read as one
    /// scan.
    pub fn parse_partial_on(
        self,
        text: &str,
        req: Option<&ToolRequest>,
        resume: &mut Resume,
    ) -> Parsed {
        let from = &mut resume.blocks;
        match self {
            Format::Atem => atem::parse_partial_on(text, req, &mut from.memo),
            Format::Generic => generic::parse_partial(text, req),
            Format::Hermes => hermes::parse_partial(text, req, from),
            Format::QwenXml
            | Format::SeedOss
            | Format::MiniMaxM2
            | Format::Glm { .. }
            | Format::DeepSeekDsml { .. }
            | Format::MiniCpm5
            | Format::Ling3
            | Format::Hy3 => xml_calls::parse_partial(self.xml_shape(), text, req, from),
            Format::KimiK3 => kimi3::parse_partial(text, req),
            Format::MiniMaxM3 => minimax_m3::parse_partial(text, req, from),
            Format::Llama3 { builtin_tools } => llama3::parse_partial(text, req, builtin_tools),
            Format::MistralNemo => mistral::parse_partial(text, req, mistral::Flavor::Nemo, from),
            Format::Mistral { call_id } => {
                mistral::parse_partial(text, req, mistral::Flavor::Args { call_id }, from)
            }
            Format::DeepSeekR1 => deepseek::parse_partial(text, req, deepseek::Flavor::R1, from),
            Format::DeepSeekV31 => deepseek::parse_partial(text, req, deepseek::Flavor::V31, from),
            Format::Gemma4 => gemma4::parse_partial(text, req),
            Format::KimiK2 => deepseek::parse_partial(text, req, deepseek::Flavor::Kimi, from),
            Format::SolarOpen => deepseek::parse_partial(text, req, deepseek::Flavor::Solar, from),
            Format::Functionary(flavor) => functionary::parse_partial(text, req, flavor, from),
            Format::JsonList(shape) => json_list::parse_partial(text, req, shape, from),
            Format::Harmony => harmony::parse_partial(text, req),
            Format::Lfm2 => pythonic::parse_partial(text, req, from),
        }
    }
}

impl Format {
    /// The tags of an XML call format (`xml_calls`); Qwen's for the others, which never ask.
    fn xml_shape(self) -> &'static xml_calls::Shape {
        match self {
            Format::SeedOss => &xml_calls::SEED,
            Format::MiniMaxM2 => &xml_calls::MINIMAX_M2,
            Format::Glm { newlines } => xml_calls::glm(newlines),
            Format::DeepSeekDsml { v4 } => xml_calls::dsml(v4),
            Format::MiniCpm5 => &xml_calls::MINICPM5,
            Format::Ling3 => &xml_calls::LING3,
            Format::Hy3 => &xml_calls::HY3,
            Format::KimiK3 => &kimi3::SHAPE,
            _ => &xml_calls::QWEN,
        }
    }
}

/// What streaming's readings of one output have settled, for the next reading of the same
/// output grown (`Format::parse_partial_on`). A new output starts with `Resume::default()`.
#[derive(Clone, Debug, Default)]
pub struct Resume {
    blocks: Blocks,
}

impl Format {
    /// A finished output's reading (`Parsed::settle` of `parse` and `parse_partial`).
    pub fn parse_final(self, text: &str, req: Option<&ToolRequest>) -> Parsed {
        Parsed::settle(self.parse(text, req), self.parse_partial(text, req)).0
    }
}

impl Plan {
    /// The plan of a format whose template shows the tools itself (nothing is added to the
    /// system prompt): under `auto` the grammar is lazy, from `start`; else it holds the whole
    /// output.
    fn calls(gbnf: String, choice: &ToolChoice, start: LazyStart) -> Plan {
        let lazy = *choice == ToolChoice::Auto;
        Plan {
            gbnf,
            lazy,
            triggers: if lazy {
                vec![start.trigger()]
            } else {
                Vec::new()
            },
            system: None,
        }
    }
}

impl Format {
    /// The id of a call the model wrote none for: OpenAI's `call_` ids (`tool_call_id`), or the
    /// 9 letters and digits Mistral's templates insist on when the call comes back in the
    /// history.
    pub fn call_id(self, seed: u64, index: usize) -> String {
        match self {
            Format::MistralNemo | Format::Mistral { .. } => id_chars(seed, index, 9),
            _ => tool_call_id(seed, index),
        }
    }
}

/// Longest function name OpenAI accepts.
const MAX_NAME_LEN: usize = 64;

/// Reads OpenAI's `tools`, `tool_choice` and `parallel_tool_calls` from a chat request. None
/// when `tools` is absent, null or empty (then `tool_choice` may only be absent, null, "none"
/// or "auto"). The legacy `functions` and `function_call` fields are refused by name (an
/// empty `functions` and a `function_call` of "none" or "auto", which change nothing, pass).
pub fn parse_tools(body: &Map<String, Value>) -> Result<Option<ToolRequest>, ApiError> {
    match body.get("functions") {
        None | Some(Value::Null) => {}
        Some(Value::Array(a)) if a.is_empty() => {}
        Some(_) => {
            return Err(ApiError::param(
                "functions",
                "functions (the legacy function calling API) is not supported: use tools",
            ))
        }
    }
    match body.get("function_call") {
        None | Some(Value::Null) => {}
        Some(Value::String(s)) if s == "none" || s == "auto" => {}
        Some(_) => {
            return Err(ApiError::param(
                "function_call",
                "function_call (the legacy function calling API) is not supported: use \
                 tool_choice",
            ))
        }
    }
    let parallel = match body.get("parallel_tool_calls") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(v) => {
            return Err(ApiError::param(
                "parallel_tool_calls",
                format!("parallel_tool_calls must be a boolean, got {}", show(v)),
            ))
        }
    };
    let tools = match body.get("tools") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(a)) => {
            let mut tools: Vec<Tool> = Vec::with_capacity(a.len());
            for (i, t) in a.iter().enumerate() {
                let tool = read_tool(i, t)?;
                if tools.iter().any(|o| o.name == tool.name) {
                    return Err(ApiError::param(
                        &format!("tools[{i}].function.name"),
                        format!(
                            "tools[{i}].function.name: the function name `{}` is given twice",
                            tool.name
                        ),
                    ));
                }
                tools.push(tool);
            }
            tools
        }
        Some(v) => {
            return Err(ApiError::param(
                "tools",
                format!("tools must be an array of tools, got {}", show(v)),
            ))
        }
    };
    let choice = match body.get("tool_choice") {
        None | Some(Value::Null) => ToolChoice::Auto,
        Some(Value::String(s)) => match s.as_str() {
            "none" => ToolChoice::None,
            "auto" => ToolChoice::Auto,
            "required" => ToolChoice::Required,
            _ => {
                return Err(ApiError::param(
                    "tool_choice",
                    format!(
                        "tool_choice must be \"none\", \"auto\", \"required\" or \
                         {{\"type\": \"function\", \"function\": {{\"name\": ...}}}}, got {}",
                        show(&Value::String(s.clone()))
                    ),
                ))
            }
        },
        Some(Value::Object(o)) => {
            match o.get("type") {
                Some(Value::String(t)) if t == "function" => {}
                Some(v) => {
                    return Err(ApiError::param(
                        "tool_choice.type",
                        format!(
                            "tool_choice.type must be \"function\", got {} (only functions \
                             can be chosen)",
                            show(v)
                        ),
                    ))
                }
                None => {
                    return Err(ApiError::param(
                        "tool_choice.type",
                        "tool_choice.type is missing (it must be \"function\")",
                    ))
                }
            }
            let name = match o.get("function") {
                Some(Value::Object(f)) => match f.get("name") {
                    Some(Value::String(n)) => n.clone(),
                    Some(v) => {
                        return Err(ApiError::param(
                            "tool_choice.function.name",
                            format!(
                                "tool_choice.function.name must be a string, got {}",
                                show(v)
                            ),
                        ))
                    }
                    None => {
                        return Err(ApiError::param(
                            "tool_choice.function.name",
                            "tool_choice.function.name is missing",
                        ))
                    }
                },
                Some(v) => {
                    return Err(ApiError::param(
                        "tool_choice.function",
                        format!(
                            "tool_choice.function must be an object with the function's name, \
                             got {}",
                            show(v)
                        ),
                    ))
                }
                None => {
                    return Err(ApiError::param(
                        "tool_choice.function",
                        "tool_choice.function is missing (an object with the function's name)",
                    ))
                }
            };
            if tools.is_empty() {
                return Err(ApiError::param(
                    "tool_choice",
                    format!("tool_choice names the function `{name}` but no tools are given"),
                ));
            }
            if !tools.iter().any(|t| t.name == name) {
                return Err(ApiError::param(
                    "tool_choice.function.name",
                    format!("tool_choice names the function `{name}`, which is not in tools"),
                ));
            }
            ToolChoice::Function(name)
        }
        Some(v) => {
            return Err(ApiError::param(
                "tool_choice",
                format!(
                    "tool_choice must be a string or an object naming a function, got {}",
                    show(v)
                ),
            ))
        }
    };
    if tools.is_empty() {
        return match choice {
            ToolChoice::None | ToolChoice::Auto => Ok(None),
            _ => Err(ApiError::param(
                "tool_choice",
                "tool_choice \"required\" needs tools, and none are given",
            )),
        };
    }
    Ok(Some(ToolRequest {
        tools,
        choice,
        parallel,
        response: None,
    }))
}

/// One element of `tools`.
fn read_tool(i: usize, t: &Value) -> Result<Tool, ApiError> {
    let Value::Object(t) = t else {
        return Err(ApiError::param(
            &format!("tools[{i}]"),
            format!(
                "tools[{i}] must be an object {{\"type\": \"function\", \"function\": {{...}}}}, \
                 got {}",
                show(t)
            ),
        ));
    };
    let p = |field: &str| format!("tools[{i}].{field}");
    match t.get("type") {
        Some(Value::String(s)) if s == "function" => {}
        Some(v) => {
            return Err(ApiError::param(
                &p("type"),
                format!(
                    "{} must be \"function\", got {} (only function tools are supported)",
                    p("type"),
                    show(v)
                ),
            ))
        }
        None => {
            return Err(ApiError::param(
                &p("type"),
                format!("{} is missing (it must be \"function\")", p("type")),
            ))
        }
    }
    let f = match t.get("function") {
        Some(Value::Object(f)) => f,
        Some(v) => {
            return Err(ApiError::param(
                &p("function"),
                format!("{} must be an object, got {}", p("function"), show(v)),
            ))
        }
        None => {
            return Err(ApiError::param(
                &p("function"),
                format!("{} is missing", p("function")),
            ))
        }
    };
    let name = match f.get("name") {
        Some(Value::String(n)) => n.clone(),
        Some(v) => {
            return Err(ApiError::param(
                &p("function.name"),
                format!("{} must be a string, got {}", p("function.name"), show(v)),
            ))
        }
        None => {
            return Err(ApiError::param(
                &p("function.name"),
                format!("{} is missing", p("function.name")),
            ))
        }
    };
    if let Err(why) = check_name(&name) {
        return Err(ApiError::param(
            &p("function.name"),
            format!("{}: {why}", p("function.name")),
        ));
    }
    let description = match f.get("description") {
        None | Some(Value::Null) => None,
        Some(Value::String(d)) => Some(d.clone()),
        Some(v) => {
            return Err(ApiError::param(
                &p("function.description"),
                format!(
                    "{} must be a string, got {}",
                    p("function.description"),
                    show(v)
                ),
            ))
        }
    };
    let parameters = match f.get("parameters") {
        None | Some(Value::Null) => serde_json::json!({"type": "object", "properties": {}}),
        Some(Value::Object(o)) => {
            match o.get("type") {
                None => {}
                Some(Value::String(s)) if s == "object" => {}
                Some(v) => {
                    return Err(ApiError::param(
                        &p("function.parameters"),
                        format!(
                            "{} must be a JSON schema of type \"object\", got type {}",
                            p("function.parameters"),
                            show(v)
                        ),
                    ))
                }
            }
            Value::Object(o.clone())
        }
        Some(v) => {
            return Err(ApiError::param(
                &p("function.parameters"),
                format!(
                    "{} must be a JSON schema (an object), got {}",
                    p("function.parameters"),
                    show(v)
                ),
            ))
        }
    };
    match f.get("strict") {
        None | Some(Value::Null) | Some(Value::Bool(_)) => {}
        Some(v) => {
            return Err(ApiError::param(
                &p("function.strict"),
                format!(
                    "{} must be a boolean, got {}",
                    p("function.strict"),
                    show(v)
                ),
            ))
        }
    }
    Ok(Tool {
        name,
        description,
        parameters,
    })
}

/// Why a function name is not one OpenAI accepts (`[A-Za-z0-9_.-]{1,64}`).
fn check_name(name: &str) -> Result<(), String> {
    if name.is_empty() {
        return Err("the function name is empty".into());
    }
    if let Some(c) = name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-')))
    {
        return Err(format!(
            "the function name {} has the character {c:?}; names may have only letters, \
             digits, '_', '.' and '-'",
            show(&Value::String(name.to_string()))
        ));
    }
    if name.len() > MAX_NAME_LEN {
        return Err(format!(
            "the function name `{name}` is {} characters long; at most {MAX_NAME_LEN} are \
             allowed",
            name.len()
        ));
    }
    Ok(())
}

/// A call id like OpenAI's: "call_" and 24 letters and digits, a function of `seed` (one per
/// request) and the call's `index`.
pub fn tool_call_id(seed: u64, index: usize) -> String {
    let mut id = String::with_capacity(29);
    id.push_str("call_");
    id.push_str(&id_chars(seed, index, 24));
    id
}

/// `n` letters and digits drawn from `seed` and `index`.
fn id_chars(seed: u64, index: usize, n: usize) -> String {
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
    // splitmix64 steps from a state mixing both inputs
    let mut state = seed ^ (index as u64).wrapping_mul(0xD1B5_4A32_D192_ED03);
    let mut next = || {
        state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    };
    (0..n)
        .map(|_| ALPHABET[(next() >> 32) as usize % ALPHABET.len()] as char)
        .collect()
}

// ---- shared by the generic and Hermes formats ----

/// Whether `req` asks for calls at all (a request without tools, or with `tool_choice`
/// "none", gets its text back verbatim: no grammar was applied and nothing is read as a call).
fn calls_wanted(req: Option<&ToolRequest>) -> bool {
    matches!(req, Some(r) if r.choice != ToolChoice::None && !r.tools.is_empty())
}

/// The tools the model may call under `req.choice`: None where no call is to be constrained
/// (`none`, or `auto` with no tools), an Err where a call is asked of no tool or of a tool not
/// given. Every format's plan starts here.
fn allowed_tools(req: &ToolRequest) -> Result<Option<Vec<&Tool>>, String> {
    match &req.choice {
        ToolChoice::None => Ok(None),
        // Nothing the model could call: no grammar.
        ToolChoice::Auto if req.tools.is_empty() => Ok(None),
        ToolChoice::Required if req.tools.is_empty() => {
            Err("tool_choice asks for a tool call but no tools are given".into())
        }
        ToolChoice::Function(n) => match req.tools.iter().find(|t| &t.name == n) {
            Some(t) => Ok(Some(vec![t])),
            None => Err(format!(
                "tool_choice names the function `{n}`, which is not in tools"
            )),
        },
        _ => Ok(Some(req.tools.iter().collect())),
    }
}

/// A tool's parameters as the schema of its `arguments` (`"type": "object"` added where the
/// schema has no type: the arguments are always an object).
fn arguments_schema(tool: &Tool) -> Value {
    let mut p = tool.parameters.clone();
    if let Value::Object(o) = &mut p {
        o.entry("type").or_insert_with(|| Value::from("object"));
    }
    p
}

/// Checks that every tool's arguments schema converts on its own, so that an error names the
/// tool (a combined schema's error would name a pointer into it).
fn check_tools_convert(tools: &[&Tool]) -> Result<(), String> {
    for t in tools {
        if let Err(e) = muser_jsonschema::schema_to_gbnf(&arguments_schema(t)) {
            return Err(unconvertible(t, e));
        }
    }
    Ok(())
}

/// The error of a tool whose parameters cannot be made a grammar.
fn unconvertible(tool: &Tool, e: impl std::fmt::Display) -> String {
    format!(
        "the parameters of tool `{}` cannot be made a grammar: {e}",
        tool.name
    )
}

/// The GBNF of `schema` (a tool's arguments, or a whole call of it), its rules' names starting
/// with `prefix`: the top rule's name and the rules. An Err names the tool.
fn tool_rules(tool: &Tool, schema: &Value, prefix: &str) -> Result<(String, String), String> {
    muser_jsonschema::schema_to_gbnf_rules(schema, prefix).map_err(|e| unconvertible(tool, e))
}

/// The GBNF body of the JSON grammar's optional whitespace (muser-jsonschema's `ws`), for
/// grammars of their own: a space, or one or two newlines and an indentation.
const WS_BODY: &str = r#"( " " | "\n" "\n"? [ \t]{0,20} )?"#;

/// The schema of one call of `tool`, `{"name": <const>, "arguments": <parameters>}`, for a
/// place `at` (a JSON pointer, "#/...") of a larger schema: the parameters' own `$ref`s
/// (relative to the parameters' root) are rewritten to point into that place.
fn call_schema(tool: &Tool, at: &str) -> Value {
    call_schema_keyed(tool, at, "name", "arguments")
}

/// `call_schema` with the name and the arguments under the keys `name_key` and `args_key`.
fn call_schema_keyed(tool: &Tool, at: &str, name_key: &str, args_key: &str) -> Value {
    let args = placed_schema(
        arguments_schema(tool),
        &format!("{at}/properties/{args_key}"),
    );
    let mut props = Map::new();
    props.insert(
        name_key.to_string(),
        serde_json::json!({"const": tool.name}),
    );
    props.insert(args_key.to_string(), args);
    serde_json::json!({
        "type": "object",
        "properties": props,
        "required": [name_key, args_key],
    })
}

/// A schema moved into a larger document at the pointer `at`: its same-document `$ref`s
/// rewritten to point there, its root `$id` dropped (the converter reads `$id` only at the
/// document's root).
fn placed_schema(mut schema: Value, at: &str) -> Value {
    let id = schema
        .get("$id")
        .and_then(Value::as_str)
        .map(|s| s.strip_suffix('#').unwrap_or(s).to_string())
        .filter(|s| !s.is_empty());
    rebase_refs(&mut schema, at, id.as_deref());
    if let Value::Object(o) = &mut schema {
        o.remove("$id");
    }
    schema
}

/// Rewrites the same-document `$ref`s in a schema (`#...`, or `<id>#...` when the schema's
/// root has `$id`) to be relative to `base` (a JSON pointer "#/..." of the schema's new place).
/// The values of keywords that hold data, not schemas, are left alone.
fn rebase_refs(v: &mut Value, base: &str, id: Option<&str>) {
    match v {
        Value::Object(o) => {
            for (k, x) in o.iter_mut() {
                match k.as_str() {
                    "const" | "enum" | "default" | "examples" => {}
                    "$ref" => {
                        if let Value::String(r) = x {
                            let frag = match r.strip_prefix('#') {
                                Some(f) => Some(f),
                                None => id.and_then(|id| {
                                    let rest = r.strip_prefix(id)?;
                                    if rest.is_empty() {
                                        Some("")
                                    } else {
                                        rest.strip_prefix('#')
                                    }
                                }),
                            };
                            if let Some(f) = frag {
                                // a plain-name fragment (an anchor) is left as is (refused)
                                if f.is_empty() || f.starts_with('/') {
                                    *r = format!("{base}{f}");
                                }
                            }
                        } else {
                            rebase_refs(x, base, id);
                        }
                    }
                    _ => rebase_refs(x, base, id),
                }
            }
        }
        Value::Array(a) => {
            for x in a {
                rebase_refs(x, base, id);
            }
        }
        _ => {}
    }
}

/// A call read from a JSON value `{"name": <string>, "arguments": <object>}` (more keys are
/// ignored); the arguments as compact JSON, their keys in the model's order.
fn read_call(v: &Value) -> Option<ToolCall> {
    call_of(v.get("name")?.as_str()?, v.get("arguments")?)
}

/// A call of `name` (no id) with the arguments `args`, which must be an object, as compact
/// JSON, their keys in the model's order.
fn call_of(name: &str, args: &Value) -> Option<ToolCall> {
    if !args.is_object() {
        return None;
    }
    Some(ToolCall {
        id: None,
        name: name.to_string(),
        arguments: serde_json::to_string(args).ok()?,
    })
}

/// The JSON value at the start of `s` (after whitespace) and the length of `s` it spans.
fn json_prefix(s: &str) -> Option<(Value, usize)> {
    partial::value(s)
}

/// The text as it came: what a request that asks for no calls gets back.
fn verbatim(text: &str) -> Parsed {
    Parsed {
        content: text.to_string(),
        ..Parsed::default()
    }
}

/// The first of `openings` in `text`: its offset and which one.
fn find_opening<'o>(text: &str, openings: &[&'o str]) -> Option<(usize, &'o str)> {
    openings
        .iter()
        .filter_map(|o| text.find(o).map(|i| (i, *o)))
        .min_by_key(|(i, _)| *i)
}

/// Whether `req` offers a tool of this name: a call of another stays in the content as text
/// (no grammar held it, and the client could not run it).
fn offered(req: Option<&ToolRequest>, name: &str) -> bool {
    req.is_some_and(|r| r.tools.iter().any(|t| t.name == name))
}

/// Reads the output of a format whose calls come in blocks after the reply's text, each opened
/// by one of `openings`. `read` takes the text right after an opening and gives the block's
/// calls and the length of that text the block spans, or None when the block is malformed:
/// then the opening stays in the content and the text after it is read on. Content is the text
/// with the blocks taken out, its trailing whitespace trimmed.
fn parse_blocks(
    text: &str,
    req: Option<&ToolRequest>,
    openings: &[&str],
    mut read: impl FnMut(&str) -> Option<(Vec<ToolCall>, usize)>,
) -> Parsed {
    if !calls_wanted(req) {
        return verbatim(text);
    }
    let mut content = String::new();
    let mut tool_calls = Vec::new();
    let mut rest = text;
    while let Some((i, open)) = find_opening(rest, openings) {
        content.push_str(&rest[..i]);
        let after = &rest[i + open.len()..];
        match read(after).filter(|(calls, _)| calls.iter().all(|c| offered(req, &c.name))) {
            Some((calls, used)) => {
                tool_calls.extend(calls);
                rest = &after[used..];
            }
            None => {
                content.push_str(open);
                rest = after;
            }
        }
    }
    content.push_str(rest);
    content.truncate(content.trim_end().len());
    Parsed {
        content,
        reasoning: None,
        tool_calls,
    }
}

/// How far streaming has read a call block of a format `parse_blocks` reads.
pub(super) enum BlockStep {
    /// The block is whole: what `parse_blocks`'s reader gives for it (its calls and the length
    /// of the text it spans), the same for every continuation of the text (the readers read
    /// no further than the block's end), so that streaming settles it (`Blocks`).
    Whole(Vec<ToolCall>, usize),
    /// The text ends inside the block: the calls begun in it, the last one's arguments as far
    /// as they are known (`partial::Json::stable_object`).
    Open(Vec<ToolCall>),
    /// The block stopped being well formed: the calls begun in it before that; nothing after
    /// it is read.
    Broken(Vec<ToolCall>),
}

/// Where `parse_blocks_partial` stands in a text: what `parse_blocks` builds of the text
/// before `at`, which is the end of a whole call block or a place in the text between blocks
/// before which no opening can start, whatever follows. The readings of a text grown go on from
/// there: a whole block reads the same whatever follows it (its reader reads no further than
/// its end, as `BlockStep::Whole` says), an opening found stays the first, and text that no
/// opening can start in stays content.
#[derive(Clone, Debug, Default)]
pub(super) struct Blocks {
    /// The offset in the text where reading goes on.
    at: usize,
    /// The content before `at`, as `parse_blocks` builds it (not trimmed).
    content: String,
    /// The calls of the whole blocks before `at`.
    tool_calls: Vec<ToolCall>,
    /// A whole block before `at` was passed over (its first call is of a tool not offered):
    /// `parse_blocks` reads what follows differently, and the content grows no more.
    passed: bool,
    /// The long strings read so far in the block being written (its reader's `partial::read_on`).
    memo: partial::Memo,
}

impl Blocks {
    /// The reading so far: the content settled less trailing whitespace (which `parse_blocks`
    /// trims when a block follows it), the calls settled, and `open`'s (those begun in the
    /// block being written).
    fn reading(&self, open: impl IntoIterator<Item = ToolCall>) -> Parsed {
        let mut tool_calls = self.tool_calls.clone();
        tool_calls.extend(open);
        Parsed {
            content: self.content.trim_end().to_string(),
            reasoning: None,
            tool_calls,
        }
    }

    /// The text `rest[..n]` (from `at`) is read: content while it grows.
    fn take(&mut self, rest: &str, n: usize) {
        if !self.passed {
            self.content.push_str(&rest[..n]);
        }
        self.at += n;
    }
}

/// What streaming may send of an output `parse_blocks` reads: the content as `parse_blocks`
/// builds it up to the first block not yet whole, less a tail that may be the start of an
/// opening, and less trailing whitespace (which `parse_blocks` trims when a block follows it);
/// and the calls begun so far, block by block
/// (`read` takes the text right after an opening, and a memo for its JSON readings,
/// `partial::read_on`, anchored to that text). A call of a tool not offered is never
/// begun: a whole block that starts with one is passed over (it is content to
/// `parse_blocks`), and one after a call begun ends the reading.
///
/// The reading goes on from `from`, what the last reading of a text that `text` starts with
/// settled, and settles in it what no continuation of `text` changes (`Blocks`).
fn parse_blocks_partial(
    text: &str,
    req: Option<&ToolRequest>,
    openings: &[&str],
    mut read: impl FnMut(&str, &mut partial::Memo) -> BlockStep,
    from: &mut Blocks,
) -> Parsed {
    if !calls_wanted(req) {
        return verbatim(text);
    }
    // the length of a tail of `t` that may be the start of an opening
    let held = |t: &str| {
        openings
            .iter()
            .flat_map(|o| (1..o.len()).filter(|&n| o.is_char_boundary(n) && t.ends_with(&o[..n])))
            .max()
            .unwrap_or(0)
    };
    let st = from;
    if !text.is_char_boundary(st.at) {
        // not the text read before grown: read it all
        *st = Blocks::default();
    }
    loop {
        let rest = &text[st.at..];
        let Some((i, open)) = find_opening(rest, openings) else {
            // No opening starts before the held tail, whatever follows.
            st.take(rest, rest.len() - held(rest));
            return st.reading([]);
        };
        // The opening at `i` is the first, whatever follows.
        st.take(rest, i);
        let after = &rest[i + open.len()..];
        st.memo.anchor(after);
        let step = read(after, &mut st.memo);
        let (BlockStep::Whole(calls, _) | BlockStep::Open(calls) | BlockStep::Broken(calls)) =
            &step;
        let begun = calls.iter().take_while(|c| offered(req, &c.name)).count();
        match step {
            // A whole block of calls of tools offered is read as `parse_blocks` reads it.
            BlockStep::Whole(calls, used) if begun == calls.len() => {
                st.tool_calls.extend(calls);
                st.at += open.len() + used;
                st.memo = partial::Memo::default();
            }
            // One whose first call is of a tool not offered is passed over (`parse_blocks`
            // leaves it in the content).
            BlockStep::Whole(_, used) if begun == 0 => {
                st.passed = true;
                st.at += open.len() + used;
                st.memo = partial::Memo::default();
            }
            // A block with a call of a tool not offered after one that is offered is content
            // to `parse_blocks`, but the calls before it were begun while the block was open:
            // they stay, and `parse_final` keeps them.
            BlockStep::Whole(calls, _) | BlockStep::Open(calls) | BlockStep::Broken(calls) => {
                return st.reading(calls.into_iter().take(begun));
            }
        }
    }
}

/// The call a JSON object begun so far makes, once its `name` is whole: its arguments (the
/// member `args_key`) as far as they are known.
fn begun_call(
    call: &partial::Json,
    args_key: &str,
    memo: Option<&partial::Memo>,
) -> Option<ToolCall> {
    begun_call_keyed(call, "name", args_key, memo)
}

/// `begun_call` of a call whose name is the member `name_key`.
fn begun_call_keyed(
    call: &partial::Json,
    name_key: &str,
    args_key: &str,
    memo: Option<&partial::Memo>,
) -> Option<ToolCall> {
    let name = call.get(name_key)?.whole_str()?.to_string();
    let arguments = call
        .get(args_key)
        .map(|a| a.stable_object_on(memo))
        .unwrap_or_default();
    Some(ToolCall {
        id: None,
        name,
        arguments,
    })
}

impl Parsed {
    /// Whether this reading of a finished output goes on from `begun`, what streaming read of
    /// it: the calls `begun` has, in order, with the same names and ids, each one's arguments
    /// starting with what was streamed.
    pub fn continues(&self, begun: &Parsed) -> bool {
        begun.tool_calls.len() <= self.tool_calls.len()
            && begun.tool_calls.iter().zip(&self.tool_calls).all(|(b, f)| {
                b.name == f.name && b.id == f.id && f.arguments.starts_with(&b.arguments)
            })
    }

    /// The reading an answer gets, from `parse`'s (`full`) and streaming's (`part`) readings of
    /// the whole output: `full` when it goes on from `part`; else (the output ended, or broke,
    /// inside a call: `max_tokens`, a stop string, no grammar) the calls as streaming read
    /// them, with streaming's content and `full`'s reasoning, so that a streamed answer and the
    /// same answer whole always agree. With it, whether `full` was kept (its calls whole).
    pub fn settle(full: Parsed, part: Parsed) -> (Parsed, bool) {
        if full.continues(&part) {
            (full, true)
        } else {
            let p = Parsed {
                content: part.content,
                reasoning: full.reasoning,
                tool_calls: part.tool_calls,
            };
            (p, false)
        }
    }
}

/// Renames rule `from` of a GBNF text to `to`: its definition at the start of a line and every
/// reference to it as a whole rule name (outside string literals, character classes and
/// comments).
fn rename_rule(gbnf: &str, from: &str, to: &str) -> String {
    let mut out = String::with_capacity(gbnf.len() + 16);
    let b = gbnf.as_bytes();
    let word = |c: u8| c.is_ascii_alphanumeric() || c == b'-' || c == b'_';
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        match c {
            b'"' | b'[' => {
                let close = if c == b'"' { b'"' } else { b']' };
                let start = i;
                i += 1;
                while i < b.len() && b[i] != close {
                    i += if b[i] == b'\\' { 2 } else { 1 };
                }
                i = (i + 1).min(b.len());
                out.push_str(&gbnf[start..i]);
            }
            b'#' => {
                let start = i;
                while i < b.len() && b[i] != b'\n' {
                    i += 1;
                }
                out.push_str(&gbnf[start..i]);
            }
            c if word(c) => {
                let start = i;
                while i < b.len() && word(b[i]) {
                    i += 1;
                }
                let w = &gbnf[start..i];
                out.push_str(if w == from { to } else { w });
            }
            _ => {
                // one whole UTF-8 character
                let ch = gbnf[i..].chars().next().unwrap_or('\u{FFFD}');
                out.push(ch);
                i += ch.len_utf8();
            }
        }
    }
    out
}

/// The names of the rules a GBNF text defines.
fn rule_names(gbnf: &str) -> std::collections::HashSet<String> {
    gbnf.lines()
        .filter_map(|l| {
            let (name, _) = l.split_once("::=")?;
            let name = name.trim();
            (!name.is_empty()
                && name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_'))
            .then(|| name.to_string())
        })
        .collect()
}

/// `base`, or `base-2`, `base-3`, ...: the first not in `taken` (which it joins).
fn fresh_rule(taken: &mut std::collections::HashSet<String>, base: &str) -> String {
    let mut name = base.to_string();
    let mut i = 2;
    while taken.contains(&name) {
        name = format!("{base}-{i}");
        i += 1;
    }
    taken.insert(name.clone());
    name
}

/// Random tools, arguments and layouts for the formats' tests, and the checks they share.
#[cfg(test)]
pub(crate) mod test_util {
    use super::{Format, Parsed, Plan, Resume, Tool, ToolCall, ToolChoice, ToolRequest, Trigger};
    use muser_sample::Grammar;
    use serde_json::{json, Map, Value};

    /// llama.cpp's chat templates, relative to the crate.
    const TEMPLATES: &str =
        "../../target/llamacpp/llama_cpp_python-0.3.36/vendor/llama.cpp/models/templates";

    /// The folder of llama.cpp's chat templates; None where its sources are not at hand.
    pub fn templates_dir() -> Option<std::path::PathBuf> {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(TEMPLATES);
        dir.exists().then_some(dir)
    }

    /// The source of llama.cpp's template `file`; None where its sources are not at hand.
    pub fn template(file: &str) -> Option<String> {
        Some(std::fs::read_to_string(templates_dir()?.join(file)).unwrap())
    }

    /// Checks a format's own `detect` (`Some` of its format, or None) over every template of
    /// llama.cpp: it finds exactly the files of `want`, each of which `Format::detect` takes
    /// for the format named. Returns the templates read (file name and source): none where
    /// llama.cpp's sources are not at hand.
    pub fn check_detect_all(
        detect: impl Fn(&str) -> Option<Format>,
        want: &[(&str, Format)],
    ) -> Vec<(String, String)> {
        let Some(dir) = templates_dir() else {
            return Vec::new();
        };
        let mut all = Vec::new();
        let mut seen = 0;
        for e in std::fs::read_dir(&dir).unwrap() {
            let path = e.unwrap().path();
            let file = path.file_name().unwrap().to_str().unwrap().to_string();
            if !file.ends_with(".jinja") {
                continue;
            }
            let src = std::fs::read_to_string(&path).unwrap();
            let w = want.iter().find(|(f, _)| *f == file).map(|(_, f)| *f);
            assert_eq!(detect(&src), w, "{file}");
            if let Some(f) = w {
                assert_eq!(Format::detect(Some(&src)), f, "{file}");
                seen += 1;
            }
            all.push((file, src));
        }
        assert_eq!(seen, want.len());
        all
    }

    /// The request of round `round` of a format's random test: 1 to 4 random tools, and
    /// `tool_choice` auto, required or one of the tools in turn.
    pub fn random_req(rng: &mut Rng, round: usize, parallel: bool) -> ToolRequest {
        let tools = random_tools(rng);
        let choice = match round % 3 {
            0 => ToolChoice::Auto,
            1 => ToolChoice::Required,
            _ => ToolChoice::Function(tools[rng.below(tools.len())].name.clone()),
        };
        req(tools, choice, parallel)
    }

    /// The tools `r.choice` lets the model call.
    pub fn allowed(r: &ToolRequest) -> Vec<&Tool> {
        match &r.choice {
            ToolChoice::Function(n) => r.tools.iter().filter(|t| &t.name == n).collect(),
            _ => r.tools.iter().collect(),
        }
    }

    /// Calls of the tools `r` allows, with random arguments: one, or one to three when
    /// `r.parallel`.
    pub fn random_calls<'r>(rng: &mut Rng, r: &'r ToolRequest) -> Vec<(&'r Tool, Value)> {
        let allowed = allowed(r);
        let n = if r.parallel { 1 + rng.below(3) } else { 1 };
        (0..n)
            .map(|_| {
                let t = allowed[rng.below(allowed.len())];
                (t, random_args(rng, &t.parameters))
            })
            .collect()
    }

    /// Where `r.choice` names a function: another of the tools, if any, with random arguments
    /// (a call the grammar must refuse).
    pub fn other_tool<'r>(rng: &mut Rng, r: &'r ToolRequest) -> Option<(&'r Tool, Value)> {
        let ToolChoice::Function(f) = &r.choice else {
            return None;
        };
        let o = r.tools.iter().find(|t| &t.name != f)?;
        Some((o, random_args(rng, &o.parameters)))
    }

    /// The grammar of a plan (a panic shows the GBNF where it does not parse).
    pub fn grammar(p: &Plan) -> Grammar {
        Grammar::parse(&p.gbnf).unwrap_or_else(|e| panic!("{e:?}\n{}", p.gbnf))
    }

    /// The plan of `format` for `r`, checked as every format's whose template shows the tools
    /// (nothing for the system prompt; lazy, from `trigger`, exactly under `auto`), and its
    /// grammar.
    pub fn checked_plan(format: Format, r: &ToolRequest, trigger: Trigger) -> (Plan, Grammar) {
        let p = format.plan(r).unwrap().unwrap();
        assert_eq!(p.system, None);
        assert_eq!(p.lazy, r.choice == ToolChoice::Auto);
        if p.lazy {
            assert_eq!(p.triggers, vec![trigger]);
        } else {
            assert!(p.triggers.is_empty());
        }
        let g = grammar(&p);
        (p, g)
    }

    /// Checks a call read back against the one written: its name, its id, and its arguments
    /// (compact JSON, their keys in the written order).
    pub fn assert_call(c: &ToolCall, name: &str, args: &Value, id: Option<&str>) {
        assert_eq!(c.name, name);
        assert_eq!(c.id.as_deref(), id);
        let got: Value = serde_json::from_str(&c.arguments).unwrap();
        assert_eq!(&got, args);
        assert_eq!(c.arguments, serde_json::to_string(args).unwrap());
    }

    /// Checks `text`, `n` calls the grammar `g` of `format`'s plan for `r` takes, with text
    /// around it: the reply's text before the calls (what a lazy grammar does not see) is
    /// kept as content, and nothing may follow the last call.
    pub fn check_text_around(format: Format, r: &ToolRequest, g: &Grammar, text: &str, n: usize) {
        let with_text = format!("Let me check.\n\n{text}");
        let parsed = format.parse(&with_text, Some(r));
        assert_eq!(parsed.content, "Let me check.");
        assert_eq!(parsed.tool_calls.len(), n);
        assert!(!g.accepts_str(&format!("{text}\nMore")));
    }

    /// Checks that `g` refuses a call of `t` with each of `broken_args` (those of the good
    /// arguments `good`), as `render` writes it.
    pub fn check_broken_args(
        rng: &mut Rng,
        g: &Grammar,
        t: &Tool,
        good: &Value,
        render: impl Fn(&Value) -> String,
    ) {
        for bad in broken_args(rng, &t.parameters, good) {
            let b = render(&bad);
            assert!(!g.accepts_str(&b), "took {b}");
        }
    }

    /// A call as `parse` gives it: `name`, `args` (compact JSON) and no id.
    pub fn call(name: &str, args: &str) -> ToolCall {
        ToolCall {
            id: None,
            name: name.into(),
            arguments: args.into(),
        }
    }

    /// A request offering tools `f`, `g`, `h`, `i`, `other` and `f.x-y_2` without parameters,
    /// `tool_choice` auto (`parse` reads calls of offered tools only).
    pub fn f_req(parallel: bool) -> ToolRequest {
        req(
            ["f", "g", "h", "i", "other", "f.x-y_2"]
                .iter()
                .map(|n| tool(n, json!({"type": "object", "properties": {}})))
                .collect(),
            ToolChoice::Auto,
            parallel,
        )
    }

    /// Checks what `parse` gave for `text`: `content`, `calls`, and no reasoning.
    pub fn check_parsed(p: &Parsed, content: &str, calls: &[ToolCall], text: &str) {
        assert_eq!(p.content, content, "{text:?}");
        assert_eq!(p.tool_calls, calls, "{text:?}");
        assert_eq!(p.reasoning, None);
    }

    /// Checks that `format` leaves `text` as it is (content, no calls, also while streaming)
    /// without tools and with `tool_choice` none for `tools`, and plans no grammar for the
    /// latter.
    pub fn check_verbatim(format: Format, text: &str, tools: &[Tool]) {
        let none = req(tools.to_vec(), ToolChoice::None, false);
        for q in [None, Some(&none)] {
            let p = format.parse(text, q);
            assert_eq!(p.content, text);
            assert!(p.tool_calls.is_empty());
            assert_eq!(format.parse_partial(text, q).content, text);
        }
        assert_eq!(format.plan(&none).unwrap(), None);
    }

    /// Checks streaming `text` in `format` (without reasoning): for every prefix of it, the
    /// content `parse_partial` gives is a prefix of what `parse` gives for the whole text and is
    /// never taken back, its calls never shrink (the same names and ids, the arguments only
    /// growing) and `parse_final` goes on from them, and there is no reasoning. Returns what
    /// `parse` gives and the number of prefixes checked.
    pub fn check_partial_prefixes(
        format: Format,
        text: &str,
        req: Option<&ToolRequest>,
    ) -> (Parsed, usize) {
        let full = format.parse(text, req);
        let fin = format.parse_final(text, req);
        assert_eq!(full.reasoning, None);
        let mut sent = Parsed::default();
        let mut checked = 0;
        for p in prefixes(text) {
            let part = format.parse_partial(p, req);
            assert!(part.content.starts_with(&sent.content), "{text:?} / {p:?}");
            assert!(
                full.content.starts_with(&part.content),
                "{format:?} text {text:?}, prefix {p:?}: {:?} is not a prefix of {:?}",
                part.content,
                full.content
            );
            check_call_step(&sent, &part, &fin, p);
            assert_eq!(part.reasoning, None);
            sent = part;
            checked += 1;
        }
        (full, checked)
    }

    /// The calls of one streamed prefix `at`: they go on from those `sent` for the prefix
    /// before, and the final reading `fin` goes on from them.
    pub fn check_call_step(sent: &Parsed, part: &Parsed, fin: &Parsed, at: &str) {
        assert!(
            part.continues(sent),
            "prefix {at:?}: {:?} after {:?}",
            part.tool_calls,
            sent.tool_calls
        );
        assert!(
            fin.continues(part),
            "prefix {at:?}: final {:?}, streamed {:?}",
            fin.tool_calls,
            part.tool_calls
        );
    }

    /// Checks streaming a well-formed output (one the format's grammar takes): every prefix's
    /// calls are continued by `parse`'s own reading of the whole text (so `parse_final` is
    /// `parse`), and the calls are all begun by the end.
    pub fn check_stream_calls(format: Format, text: &str, req: &ToolRequest) {
        let (full, _) = check_partial_prefixes(format, text, Some(req));
        assert_eq!(format.parse_final(text, Some(req)), full, "{text:?}");
        let end = format.parse_partial(text, Some(req));
        assert_eq!(
            end.tool_calls.len(),
            full.tool_calls.len(),
            "{format:?} {text:?}: {:?}",
            end.tool_calls
        );
    }

    /// `get_weather` (an enum, a string, an integer and an object of a boolean and an array)
    /// and `ping` (no parameters), as the Llama 3 and DeepSeek tests render them.
    pub fn weather_tools() -> Vec<Tool> {
        vec![
            tool(
                "get_weather",
                json!({
                    "type": "object",
                    "properties": {
                        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                        "city": {"type": "string"},
                        "days": {"type": "integer"},
                        "detail": {
                            "type": "object",
                            "properties": {
                                "hourly": {"type": "boolean"},
                                "tags": {"type": "array", "items": {"type": "string"}}
                            }
                        }
                    },
                    "required": ["unit", "city"]
                }),
            ),
            tool("ping", json!({"type": "object"})),
        ]
    }

    /// The arguments of the `get_weather` call the template renderings hold, as `parse` gives
    /// them.
    pub const WEATHER_ARGS: &str = r#"{"unit":"celsius","city":"Pa\"ris <x> é\n","days":3,"detail":{"hourly":true,"tags":["a","b"]}}"#;

    pub fn req(tools: Vec<Tool>, choice: ToolChoice, parallel: bool) -> ToolRequest {
        ToolRequest {
            tools,
            choice,
            parallel,
            response: None,
        }
    }

    /// xorshift64*: deterministic randomness without a dependency.
    pub struct Rng(pub u64);

    impl Rng {
        pub fn next(&mut self) -> u64 {
            let mut x = self.0 | 1;
            x ^= x >> 12;
            x ^= x << 25;
            x ^= x >> 27;
            self.0 = x;
            x.wrapping_mul(0x2545_F491_4F6C_DD1D)
        }

        pub fn below(&mut self, n: usize) -> usize {
            (self.next() >> 33) as usize % n.max(1)
        }

        pub fn coin(&mut self) -> bool {
            self.next() >> 63 == 1
        }

        fn word(&mut self, alphabet: &[u8], min: usize, max: usize) -> String {
            let n = min + self.below(max - min + 1);
            (0..n)
                .map(|_| alphabet[self.below(alphabet.len())] as char)
                .collect()
        }
    }

    pub fn tool(name: &str, parameters: Value) -> Tool {
        Tool {
            name: name.into(),
            description: None,
            parameters,
        }
    }

    /// A property schema: string, integer, boolean, enum of strings, or (at depth 0) a nested
    /// object.
    fn random_prop(rng: &mut Rng, depth: usize) -> Value {
        match rng.below(if depth == 0 { 5 } else { 4 }) {
            0 => json!({"type": "string", "description": "some text"}),
            1 => json!({"type": "integer"}),
            2 => json!({"type": "boolean"}),
            3 => {
                let n = 1 + rng.below(3);
                let vals: Vec<String> = (0..n)
                    .map(|i| format!("{}{i}", rng.word(b"abcxyz_", 1, 6)))
                    .collect();
                json!({"type": "string", "enum": vals})
            }
            _ => random_object(rng, depth + 1),
        }
    }

    fn random_object(rng: &mut Rng, depth: usize) -> Value {
        let n = rng.below(if depth == 0 { 5 } else { 3 });
        let mut props = Map::new();
        let mut required = Vec::new();
        for i in 0..n {
            let name = format!("{}{i}", rng.word(b"abcdefghijklmnopqrstuvwxyz_", 1, 8));
            if rng.coin() {
                required.push(Value::from(name.clone()));
            }
            props.insert(name, random_prop(rng, depth));
        }
        let mut o = Map::new();
        // sometimes without `"type": "object"` (the arguments are an object anyway)
        if depth > 0 || rng.below(4) != 0 {
            o.insert("type".into(), "object".into());
        }
        o.insert("properties".into(), Value::Object(props));
        if !required.is_empty() {
            o.insert("required".into(), Value::Array(required));
        }
        Value::Object(o)
    }

    /// 1 to 4 tools with distinct random names (`[A-Za-z0-9_.-]`).
    pub fn random_tools(rng: &mut Rng) -> Vec<Tool> {
        let n = 1 + rng.below(4);
        (0..n)
            .map(|i| {
                let name = format!(
                    "{}{i}",
                    rng.word(
                        b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.-",
                        1,
                        12
                    )
                );
                Tool {
                    name,
                    description: Some("does something".into()),
                    parameters: random_object(rng, 0),
                }
            })
            .collect()
    }

    fn random_string(rng: &mut Rng) -> String {
        const PIECES: &[&str] = &[
            "a", "Z", " ", "\"", "\\", "\n", "\t", "é", "€", "😀", "{", "}", "<", "/", "0", "'",
        ];
        (0..rng.below(8))
            .map(|_| PIECES[rng.below(PIECES.len())])
            .collect()
    }

    /// A value of a schema made by `random_object`: the required properties first, then
    /// some optional ones, each group in declaration order (the grammar's order).
    pub fn random_args(rng: &mut Rng, schema: &Value) -> Value {
        if let Some(vals) = schema.get("enum").and_then(Value::as_array) {
            return vals[rng.below(vals.len())].clone();
        }
        match schema.get("type").and_then(Value::as_str) {
            Some("string") => Value::from(random_string(rng)),
            Some("integer") => {
                Value::from(rng.next() as i64 % 100_000 * if rng.coin() { 1 } else { -1 })
            }
            Some("boolean") => Value::from(rng.coin()),
            _ => {
                let props = schema["properties"].as_object().unwrap();
                let req = |k: &str| {
                    schema
                        .get("required")
                        .and_then(Value::as_array)
                        .is_some_and(|r| r.iter().any(|x| x == k))
                };
                let mut o = Map::new();
                for (k, s) in props.iter().filter(|(k, _)| req(k)) {
                    o.insert(k.clone(), random_args(rng, s));
                }
                for (k, s) in props.iter().filter(|(k, _)| !req(k)) {
                    if rng.coin() {
                        o.insert(k.clone(), random_args(rng, s));
                    }
                }
                Value::Object(o)
            }
        }
    }

    /// Arguments that break the schema: a required property left out, a value of the wrong
    /// type, a property that is not declared, not an object.
    pub fn broken_args(rng: &mut Rng, schema: &Value, good: &Value) -> Vec<Value> {
        let mut out = vec![json!([]), json!("x"), json!(null)];
        let good = good.as_object().unwrap();
        let mut extra = good.clone();
        extra.insert("zz_undeclared".into(), json!(1));
        out.push(Value::Object(extra));
        let required: Vec<&str> = schema
            .get("required")
            .and_then(Value::as_array)
            .map(|r| r.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        if let Some(k) = required.first() {
            let mut o = good.clone();
            o.shift_remove(*k);
            out.push(Value::Object(o));
        }
        let props = schema["properties"].as_object().unwrap();
        for (k, v) in good {
            let s = &props[k];
            let wrong = if s.get("enum").is_some() {
                vec![json!("ZZ_not_listed"), json!(1)]
            } else {
                match s.get("type").and_then(Value::as_str) {
                    Some("string") => vec![json!(12345), json!(true)],
                    Some("integer") => vec![json!("12"), json!(1.5)],
                    Some("boolean") => vec![json!("true"), json!(0)],
                    _ => vec![json!("x"), json!([])],
                }
            };
            let mut o = good.clone();
            o.insert(k.clone(), wrong[rng.below(wrong.len())].clone());
            out.push(Value::Object(o));
            // a nested object's own breakage
            if v.is_object() && s.get("properties").is_some() {
                for b in broken_args(rng, s, v).into_iter().skip(3) {
                    let mut o = good.clone();
                    o.insert(k.clone(), b);
                    out.push(Value::Object(o));
                }
            }
        }
        out
    }

    /// Python's `json.dumps` layout (`", "` and `": "` separators), non-ASCII escaped when
    /// `ascii` (its default `ensure_ascii`).
    pub fn python_json(v: &Value, ascii: bool) -> String {
        python_layout(v, &|x| match x {
            Value::String(s) if ascii => {
                let mut out = String::new();
                for c in serde_json::to_string(s).unwrap().chars() {
                    if c.is_ascii() {
                        out.push(c);
                    } else {
                        let mut buf = [0u16; 2];
                        for u in c.encode_utf16(&mut buf) {
                            out.push_str(&format!("\\u{u:04x}"));
                        }
                    }
                }
                out
            }
            x => x.to_string(),
        })
    }

    /// `v` in Python's layout (`", "` and `": "` separators), its scalars (and keys, as
    /// strings) written by `leaf`.
    pub fn python_layout(v: &Value, leaf: &dyn Fn(&Value) -> String) -> String {
        match v {
            Value::Object(o) => {
                let items: Vec<String> = o
                    .iter()
                    .map(|(k, x)| {
                        format!(
                            "{}: {}",
                            leaf(&Value::from(k.clone())),
                            python_layout(x, leaf)
                        )
                    })
                    .collect();
                format!("{{{}}}", items.join(", "))
            }
            Value::Array(a) => {
                let items: Vec<String> = a.iter().map(|x| python_layout(x, leaf)).collect();
                format!("[{}]", items.join(", "))
            }
            v => leaf(v),
        }
    }

    /// The layouts a model may write JSON in: compact, Python's (both ASCII modes), pretty.
    pub fn layouts(v: &Value) -> Vec<String> {
        vec![
            python_json(v, false),
            v.to_string(),
            python_json(v, true),
            serde_json::to_string_pretty(v).unwrap(),
        ]
    }

    /// A random edit of `t` at character boundaries, as a model without a grammar may slip: one
    /// of `pieces` inserted, a short span cut out, or a span of up to `twice` bytes written
    /// twice (which repeats keys, items, calls and markup).
    pub fn mutate(rng: &mut Rng, t: &mut String, pieces: &[&str], twice: usize) {
        let cuts: Vec<usize> = (0..=t.len()).filter(|&i| t.is_char_boundary(i)).collect();
        let i = cuts[rng.below(cuts.len())];
        let upto = |n: usize| *cuts.iter().find(|&&c| c >= (i + n).min(t.len())).unwrap();
        match rng.below(3) {
            0 => t.insert_str(i, pieces[rng.below(pieces.len())]),
            1 => {
                let end = upto(1 + rng.below(12));
                t.replace_range(i..end, "");
            }
            _ => {
                let end = upto(1 + rng.below(twice));
                let span = t[i..end].to_string();
                t.insert_str(end, &span);
            }
        }
    }

    /// A random output of `format` for `r`: text, then one to four rounds of random calls (a
    /// tool not offered now and then), the block formats' calls in one or more blocks with
    /// text between them, in random layouts. What a model writes with or without a grammar.
    pub fn random_output(rng: &mut Rng, format: Format, r: &ToolRequest) -> String {
        let texts = ["", "Sure.", "Let me check.\n\n", " a < b ", "x\n", "é 😀 "];
        let mut out = texts[rng.below(texts.len())].to_string();
        let mut calls = Vec::new();
        for _ in 0..1 + rng.below(4) {
            calls.extend(random_calls(rng, r));
        }
        let nosuch = tool("nosuch", json!({"type": "object", "properties": {}}));
        if rng.below(6) == 0 {
            let at = rng.below(calls.len() + 1);
            calls.insert(at, (&nosuch, json!({"a": 1})));
        }
        match format {
            Format::Llama3 { .. } => {
                let (t, a) = &calls[0];
                let l = layouts(&json!({"name": t.name, "parameters": a}));
                out = l[rng.below(l.len())].clone();
            }
            Format::Generic => {
                let all: Vec<Value> = calls
                    .iter()
                    .map(|(t, a)| json!({"name": t.name, "arguments": a}))
                    .collect();
                let v = match all.len() {
                    1 => json!({"tool_call": all[0]}),
                    _ => json!({"tool_calls": all}),
                };
                let l = layouts(&v);
                out = l[rng.below(l.len())].clone();
            }
            Format::Harmony => {
                out = super::harmony::test_output(rng, &out, &calls);
            }
            Format::Functionary(super::functionary::Flavor::V32) => {
                // the reply's text to `all` (now and then without it), the calls after it
                if !out.is_empty() && rng.below(4) > 0 {
                    out = format!("all\n{out}>>>");
                }
                let calls: Vec<String> = calls
                    .iter()
                    .map(|(t, a)| render_one(rng, format, &t.name, a))
                    .collect();
                let between = [">>>", ">>>", "\n>>>", ""];
                out += &calls.join(between[rng.below(between.len())]);
            }
            Format::MistralNemo => {
                let all: Vec<Value> = calls
                    .iter()
                    .map(|(t, a)| json!({"name": t.name, "arguments": a, "id": "abcDEF123"}))
                    .collect();
                let l = layouts(&Value::Array(all));
                out += &format!("[TOOL_CALLS]{}", l[rng.below(l.len())]);
            }
            _ => {
                let mut blocks: Vec<Vec<String>> = vec![Vec::new()];
                for (t, a) in &calls {
                    if !blocks.last().unwrap().is_empty() && rng.coin() {
                        blocks.push(Vec::new());
                    }
                    // (MiniMax M3's values by their schemas)
                    let one = match format {
                        Format::MiniMaxM3 => super::minimax_m3::render_tool_call(t, a),
                        _ => render_one(rng, format, &t.name, a),
                    };
                    blocks.last_mut().unwrap().push(one);
                }
                let between = ["", "\n", " ok ", "\n\nThen "];
                let blocks: Vec<String> =
                    blocks.into_iter().map(|b| wrap_block(format, b)).collect();
                out += &blocks.join(between[rng.below(between.len())]);
            }
        }
        out
    }

    /// One call of `name` with the arguments `args` as `format` writes it in a block.
    fn render_one(rng: &mut Rng, format: Format, name: &str, args: &Value) -> String {
        let l = layouts(args);
        let json = l[rng.below(l.len())].clone();
        // an XML parameter's value: a string raw, another value as JSON
        let raw = |v: &Value| match v {
            Value::String(s) => s.clone(),
            v => v.to_string(),
        };
        let params = args.as_object().into_iter().flatten();
        match format {
            Format::QwenXml => {
                let mut s = format!("<function={name}>\n");
                for (k, v) in params {
                    s += &format!("<parameter={k}>\n{}\n</parameter>\n", raw(v));
                }
                s + "</function>"
            }
            Format::SeedOss => {
                let mut s = format!("<function={name}>\n");
                for (k, v) in params {
                    s += &format!("<parameter={k}>{}</parameter>\n", raw(v));
                }
                s + "</function>"
            }
            Format::MiniMaxM2 => {
                let mut s = format!("<invoke name=\"{name}\">\n");
                for (k, v) in params {
                    s += &format!("<parameter name=\"{k}\">{}</parameter>\n", raw(v));
                }
                s + "</invoke>"
            }
            Format::DeepSeekDsml { .. } => {
                let mut s = format!("<｜DSML｜invoke name=\"{name}\">\n");
                for (k, v) in params {
                    s += &format!(
                        "<｜DSML｜parameter name=\"{k}\" string=\"{}\">{}</｜DSML｜parameter>\n",
                        v.is_string(),
                        raw(v)
                    );
                }
                s + "</｜DSML｜invoke>"
            }
            Format::MiniCpm5 => {
                let mut s = format!("<function name=\"{name}\">");
                for (k, v) in params {
                    s += &format!("<param name=\"{k}\">{}</param>", raw(v));
                }
                s + "</function>"
            }
            Format::Glm { newlines } => {
                let nl = if newlines { "\n" } else { "" };
                let mut s = format!("{name}{nl}");
                for (k, v) in params {
                    s += &format!("<arg_key>{k}</arg_key>{nl}<arg_value>{}</arg_value>{nl}", raw(v));
                }
                s
            }
            Format::Ling3 => {
                let mut s = format!("{name}\n");
                for (k, v) in params {
                    s += &format!("<arg_key>{k}</arg_key>\n<arg_value>{}</arg_value>", raw(v));
                }
                s + "\n"
            }
            Format::Hy3 => {
                let mut s = format!("<tool_call:opensource>{name}<tool_sep:opensource>\n");
                for (k, v) in params {
                    s += &format!(
                        "<arg_key:opensource>{k}</arg_key:opensource>\n<arg_value:opensource>{}</arg_value:opensource>\n",
                        raw(v)
                    );
                }
                s + "</tool_call:opensource>"
            }
            Format::KimiK3 => super::kimi3::test_call(name, 1 + rng.below(9), args),
            Format::Atem => {
                let mut s = format!("<atem:invoke name=\"{name}\">\n");
                for (k, v) in params {
                    s += &format!("<atem:parameter name=\"{k}\">{}</atem:parameter>\n", raw(v));
                }
                s + "</atem:invoke>"
            }
            Format::Hermes => {
                let l = layouts(&json!({"name": name, "arguments": args}));
                l[rng.below(l.len())].clone()
            }
            Format::Mistral { call_id: true } => format!("{name}[CALL_ID]abcDEF123[ARGS]{json}"),
            Format::Mistral { .. } => format!("{name}[ARGS]{json}"),
            Format::DeepSeekR1 => format!(
                "<｜tool▁call▁begin｜>function<｜tool▁sep｜>{name}\n```json\n{json}\n```<｜tool▁call▁end｜>"
            ),
            Format::KimiK2 => format!(
                "<|tool_call_begin|>functions.{name}:{}<|tool_call_argument_begin|>{json}<|tool_call_end|>",
                rng.below(12)
            ),
            Format::Lfm2 => match args.as_object() {
                Some(o) => super::pythonic::python_call(name, o, rng.coin()),
                None => format!("{name}({json})"),
            },
            Format::SolarOpen => format!(
                "<|tool_call:begin|>{}<|tool_call:name|>{name}<|tool_call:args|>{json}<|tool_call:end|>",
                ["a1b2c3d4e5", "", "x"][rng.below(3)]
            ),
            Format::Functionary(super::functionary::Flavor::V31) => {
                format!("<function={name}>{json}</function>")
            }
            Format::Functionary(_) => format!("{name}\n{json}"),
            Format::JsonList(shape) => {
                let mut o = Map::new();
                if let Some(k) = shape.number_key {
                    o.insert(k.into(), Value::from(rng.below(5).to_string()));
                }
                o.insert(shape.name_key.into(), Value::from(name));
                o.insert(shape.args_key.into(), args.clone());
                let l = layouts(&Value::Object(o));
                l[rng.below(l.len())].clone()
            }
            _ => format!("<｜tool▁call▁begin｜>{name}<｜tool▁sep｜>{json}<｜tool▁call▁end｜>"),
        }
    }

    /// The calls `calls` (`render_one`'s) as one block of `format`.
    fn wrap_block(format: Format, calls: Vec<String>) -> String {
        match format {
            Format::Hermes | Format::QwenXml => calls
                .iter()
                .map(|c| format!("<tool_call>\n{c}\n</tool_call>"))
                .collect::<Vec<_>>()
                .join("\n"),
            Format::SeedOss => calls
                .iter()
                .map(|c| format!("<seed:tool_call>\n{c}\n</seed:tool_call>"))
                .collect::<Vec<_>>()
                .join("\n"),
            Format::MiniMaxM2 => format!(
                "<minimax:tool_call>\n{}\n</minimax:tool_call>",
                calls.join("\n")
            ),
            Format::DeepSeekDsml { v4 } => {
                let sh = super::xml_calls::dsml(v4);
                format!("{}\n{}\n{}", sh.open, calls.join("\n"), sh.close)
            }
            Format::MiniCpm5 => calls.join("\n"),
            Format::Glm { .. } => calls
                .iter()
                .map(|c| format!("<tool_call>{c}</tool_call>"))
                .collect(),
            Format::Ling3 => calls
                .iter()
                .map(|c| format!("<tool_call>{c}</tool_call>"))
                .collect::<Vec<_>>()
                .join("\n"),
            Format::Hy3 => format!(
                "<tool_calls:opensource>\n{}\n</tool_calls:opensource>",
                calls.join("\n")
            ),
            Format::MiniMaxM3 => super::minimax_m3::render_block(&calls),
            Format::Mistral { .. } => calls.iter().map(|c| format!("[TOOL_CALLS]{c}")).collect(),
            Format::Atem => {
                let name = calls[0].split('"').nth(1).unwrap_or_default().to_string();
                format!(
                    " to={name}<|message|><atem:function_calls>\n{}\n</atem:function_calls>",
                    calls.join("\n")
                )
            }
            Format::DeepSeekR1 => format!(
                "<｜tool▁calls▁begin｜>{}<｜tool▁calls▁end｜>",
                calls.join("\n")
            ),
            Format::KimiK2 => format!(
                "<|tool_calls_section_begin|>{}<|tool_calls_section_end|>",
                calls.concat()
            ),
            Format::SolarOpen => format!("<|tool_calls|>{}<|calls|>", calls.concat()),
            Format::KimiK3 => super::kimi3::test_block(&calls),
            Format::Functionary(_) => calls.concat(),
            Format::JsonList(shape) => shape.block(&calls),
            Format::Lfm2 => format!(
                "{}[{}]{}",
                super::pythonic::OPEN,
                calls.join(", "),
                super::pythonic::CLOSE
            ),
            _ => format!(
                "<｜tool▁calls▁begin｜>{}<｜tool▁calls▁end｜>",
                calls.concat()
            ),
        }
    }

    /// Checks reading `text` on (`Format::parse_partial_on`) against reading it all again
    /// (`parse_partial`): at every prefix in turn, and at the ends of random pieces. Returns
    /// the number of readings compared.
    pub fn check_read_on(
        rng: &mut Rng,
        format: Format,
        text: &str,
        req: Option<&ToolRequest>,
    ) -> usize {
        let every: Vec<usize> = prefixes(text).map(str::len).collect();
        let mut n = 0;
        for cuts in [every, piece_ends(rng, text, 16)] {
            let mut resume = Resume::default();
            for at in cuts {
                let p = &text[..at];
                let on = format.parse_partial_on(p, req, &mut resume);
                assert_eq!(
                    on,
                    format.parse_partial(p, req),
                    "{format:?} {text:?} at {p:?}"
                );
                n += 1;
            }
        }
        n
    }

    /// The ends of random pieces of `text` (1 to `most` bytes, whole characters), as tokens
    /// bring it; the last is the text's end.
    pub fn piece_ends(rng: &mut Rng, text: &str, most: usize) -> Vec<usize> {
        let mut ends = Vec::new();
        let mut at = 0;
        while at < text.len() {
            at = (at + 1 + rng.below(most)).min(text.len());
            while !text.is_char_boundary(at) {
                at += 1;
            }
            ends.push(at);
        }
        ends
    }

    /// A random text of `min` to `max` pieces: letters, spaces, newlines, the characters of
    /// markup (`<`, `[`, `/`, `]`, `>`, `{`) and non-ASCII ones; it holds no tag of more than
    /// one character.
    pub fn markup_text(rng: &mut Rng, min: usize, max: usize) -> String {
        const PIECES: [&str; 12] = [
            "a",
            "Q",
            " ",
            "\n",
            "é",
            "<",
            "[",
            "/",
            "]",
            ">",
            "{",
            "\u{1F600}",
        ];
        let n = min + rng.below(max - min + 1);
        (0..n).map(|_| PIECES[rng.below(PIECES.len())]).collect()
    }

    /// Every format, for the tests that go through them all.
    pub const FORMATS: &[Format] = &[
        Format::Generic,
        Format::Hermes,
        Format::Atem,
        Format::QwenXml,
        Format::Llama3 {
            builtin_tools: false,
        },
        Format::Llama3 {
            builtin_tools: true,
        },
        Format::MistralNemo,
        Format::Mistral { call_id: true },
        Format::Mistral { call_id: false },
        Format::DeepSeekR1,
        Format::DeepSeekV31,
        Format::KimiK2,
        Format::JsonList(&super::json_list::NEMOTRON_V2),
        Format::JsonList(&super::json_list::COMMAND_R7B),
        Format::JsonList(&super::json_list::COHERE2MOE),
        Format::JsonList(&super::json_list::GRANITE),
        Format::JsonList(&super::json_list::APRIEL),
        Format::JsonList(&super::json_list::FIREFUNCTION_V2),
        Format::JsonList(&super::json_list::MINIMAX_M1),
        Format::JsonList(&super::json_list::GIGACHAT_V3),
        Format::JsonList(&super::json_list::GIGACHAT_V31),
        Format::Harmony,
        Format::SeedOss,
        Format::MiniMaxM2,
        Format::Glm { newlines: true },
        Format::Glm { newlines: false },
        Format::Lfm2,
        Format::DeepSeekDsml { v4: false },
        Format::DeepSeekDsml { v4: true },
        Format::MiniCpm5,
        Format::SolarOpen,
        Format::Functionary(super::functionary::Flavor::V31),
        Format::Functionary(super::functionary::Flavor::V32),
        Format::Ling3,
        Format::Hy3,
        Format::KimiK3,
        Format::MiniMaxM3,
    ];

    /// Every prefix of `s` at a character boundary, "" and `s` included.
    pub fn prefixes(s: &str) -> impl Iterator<Item = &str> {
        (0..=s.len())
            .filter(|&i| s.is_char_boundary(i))
            .map(move |i| &s[..i])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use muser_sample::Grammar;
    use serde_json::json;

    use super::test_util::template;

    /// One call of tool `name` with no arguments, as each marked format writes it.
    fn one_call(format: Format, name: &str) -> String {
        match format {
            Format::Hermes => format!("<tool_call>\n{{\"name\": \"{name}\", \"arguments\": {{}}}}\n</tool_call>"),
            Format::Llama3 { .. } => format!("{{\"name\": \"{name}\", \"parameters\": {{}}}}"),
            Format::MistralNemo => format!(
                "[TOOL_CALLS][{{\"name\": \"{name}\", \"arguments\": {{}}, \"id\": \"abcDEF123\"}}]"
            ),
            Format::Mistral { .. } => format!("[TOOL_CALLS]{name}[ARGS]{{}}"),
            Format::DeepSeekV31 => format!(
                "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>{name}<｜tool▁sep｜>{{}}<｜tool▁call▁end｜><｜tool▁calls▁end｜>"
            ),
            Format::QwenXml => {
                format!("<tool_call>\n<function={name}>\n</function>\n</tool_call>")
            }
            Format::KimiK2 => format!(
                "<|tool_calls_section_begin|><|tool_call_begin|>functions.{name}:0<|tool_call_argument_begin|>{{}}<|tool_call_end|><|tool_calls_section_end|>"
            ),
            Format::JsonList(s) => s.block(&[format!(
                "{{{}\"{}\": \"{name}\", \"{}\": {{}}}}",
                s.number_key.map(|k| format!("\"{k}\": \"0\", ")).unwrap_or_default(),
                s.name_key,
                s.args_key,
            )]),
            Format::SeedOss => {
                format!("<seed:tool_call>\n<function={name}>\n</function>\n</seed:tool_call>")
            }
            Format::MiniMaxM2 => format!(
                "<minimax:tool_call>\n<invoke name=\"{name}\">\n</invoke>\n</minimax:tool_call>"
            ),
            Format::Glm { newlines } => {
                let nl = if newlines { "\n" } else { "" };
                format!("<tool_call>{name}{nl}</tool_call>")
            }
            Format::Ling3 => format!("<tool_call>{name}\n\n</tool_call>"),
            Format::KimiK3 => kimi3::test_block(&[kimi3::test_call(name, 1, &Value::Null)]),
            Format::Hy3 => format!(
                "<tool_calls:opensource>\n<tool_call:opensource>{name}<tool_sep:opensource>\n</tool_call:opensource>\n</tool_calls:opensource>"
            ),
            Format::Lfm2 => format!("<|tool_call_start|>[{name}()]<|tool_call_end|>"),
            Format::DeepSeekDsml { v4 } => {
                let sh = xml_calls::dsml(v4);
                format!(
                    "{}\n<｜DSML｜invoke name=\"{name}\">\n</｜DSML｜invoke>\n{}",
                    sh.open, sh.close
                )
            }
            Format::MiniCpm5 => format!("<function name=\"{name}\"></function>"),
            Format::SolarOpen => format!(
                "<|tool_calls|><|tool_call:begin|>a1b2c3d4e5<|tool_call:name|>{name}<|tool_call:args|>{{}}<|tool_call:end|><|calls|>"
            ),
            Format::Functionary(functionary::Flavor::V31) => {
                format!("<function={name}>{{}}</function>")
            }
            Format::Functionary(_) => format!("{name}\n{{}}"),
            Format::MiniMaxM3 => {
                minimax_m3::render_block(&[minimax_m3::render_call(name, &json!({}))])
            }
            other => unreachable!("{other:?}"),
        }
    }

    /// Every format, random outputs (well formed, and slipped as a model without a grammar
    /// may: `test_util::mutate` with the formats' markup), with and without tools asked for:
    /// reading on from what the readings before settled gives exactly what reading the whole
    /// text again gives, at every prefix and at the ends of random pieces.
    /// A number in a call's arguments keeps the value the model wrote: the double nearest to
    /// its decimal text (what a client's JSON reader makes of the same text), whatever its
    /// digits and exponent.
    #[test]
    fn argument_numbers_are_read_correctly_rounded() {
        let mut rng = test_util::Rng(0x5eed_f10a7);
        for _ in 0..2000 {
            let digits = |rng: &mut test_util::Rng, n: usize| -> String {
                (0..n)
                    .map(|_| char::from(b'0' + rng.below(10) as u8))
                    .collect()
            };
            let (lead, n) = (1 + rng.below(9), rng.below(24));
            let mut num = format!("{lead}{}", digits(&mut rng, n));
            if rng.coin() {
                let n = 1 + rng.below(20);
                num = format!("{num}.{}", digits(&mut rng, n));
            }
            if rng.coin() {
                let e = rng.below(560) as i64 - 280;
                num = format!("{num}e{e}");
            }
            let text = format!(
                "<tool_call>\n{{\"name\": \"f\", \"arguments\": {{\"a\": {num}}}}}\n</tool_call>"
            );
            let p = Format::Hermes.parse(&text, Some(&test_util::f_req(false)));
            assert_eq!(p.tool_calls.len(), 1, "{text}");
            let args: Value = serde_json::from_str(&p.tool_calls[0].arguments).unwrap();
            let want: f64 = num.parse().unwrap();
            let got = args["a"].as_f64().unwrap();
            assert_eq!(got.to_bits(), want.to_bits(), "{num}: {got} != {want}");
        }
    }

    #[test]
    fn reading_on_equals_reading_all_again() {
        let pieces = [
            "<tool_call>",
            "</tool_call>",
            "[TOOL_CALLS]",
            "[ARGS]",
            "<｜tool▁calls▁begin｜>",
            "<｜tool▁calls▁end｜>",
            "<｜tool▁call▁end｜>",
            "</function>",
            "</parameter>",
            "</seed:tool_call>",
            "</invoke>",
            "</minimax:tool_call>",
            "<arg_key>",
            "</arg_value>",
            "<|eom|><|start|>assistant",
            "<|python_tag|>",
            "brave_search.call(query=\"",
            "{",
            "}",
            "\"",
            " ",
            "\n",
            "é",
        ];
        let mut rng = test_util::Rng(0x5EED_4E5D);
        let (mut readings, mut settled_calls) = (0, 0);
        for round in 0..300 {
            let f = test_util::FORMATS[round % test_util::FORMATS.len()];
            let r = test_util::random_req(&mut rng, round / test_util::FORMATS.len(), true);
            let mut text = test_util::random_output(&mut rng, f, &r);
            settled_calls += f.parse(&text, Some(&r)).tool_calls.len();
            if round % 3 == 2 {
                for _ in 0..1 + rng.below(3) {
                    test_util::mutate(&mut rng, &mut text, &pieces, 24);
                }
            }
            readings += test_util::check_read_on(&mut rng, f, &text, Some(&r));
            if round % 8 == 0 {
                readings += test_util::check_read_on(&mut rng, f, &text, None);
            }
        }
        assert!(
            readings > 50_000 && settled_calls > 400,
            "{readings} {settled_calls}"
        );
    }

    /// Every format, random outputs whose argument strings hold lone surrogate escapes
    /// (`\ud800`..`\udfff` not in a pair: JSON text by JSON's grammar, but no character; Muser's
    /// call grammars refuse them, but a model writes them where no grammar holds it): each call
    /// is read, streamed as it grows, and its arguments are valid JSON, as the same output with
    /// `\ufffd` in their place reads (a JSON string's lone surrogate is U+FFFD; an XML
    /// parameter's raw text keeps what the model wrote).
    #[test]
    fn lone_surrogate_escapes_in_arguments_read_as_the_replacement_character() {
        let mut rng = test_util::Rng(0x5EED_D800);
        let (mut calls, mut replaced) = (0, 0);
        for round in 0..264 {
            let f = test_util::FORMATS[round % test_util::FORMATS.len()];
            let r = test_util::random_req(&mut rng, round / test_util::FORMATS.len(), true);
            // "€" is written only in argument strings: raw, or `\u20ac` in ASCII layouts.
            let text = test_util::random_output(&mut rng, f, &r);
            // (not half of "😀", whose pair the ASCII layouts write)
            let unit = if rng.coin() { 0xD800 } else { 0xDC00 } + rng.below(0x3ff);
            let unit = if [0xD83D, 0xDE00].contains(&unit) {
                unit + 1
            } else {
                unit
            };
            let lone = format!("\\u{unit:04x}");
            let with = |esc: &str| text.replace("\\u20ac", esc).replace('€', esc);
            let (got_text, want_text) = (with(&lone), with("\\ufffd"));
            let want = f.parse_final(&want_text, Some(&r));
            let mut got = f.parse_final(&got_text, Some(&r));
            // the content is the text as written
            got.content = got.content.replace(&lone, "\\ufffd");
            for c in &mut got.tool_calls {
                assert!(serde_json::from_str::<Value>(&c.arguments).is_ok(), "{c:?}");
                replaced += c.arguments.matches('\u{FFFD}').count();
                // an XML parameter's raw text, as written (a JSON string's escaped backslash)
                c.arguments = c.arguments.replace(&format!("\\{lone}"), "\\\\ufffd");
            }
            assert_eq!(got, want, "{f:?} {got_text:?}");
            test_util::check_partial_prefixes(f, &got_text, Some(&r));
            calls += got.tool_calls.len();
        }
        assert!(calls > 300 && replaced > 40, "{calls} {replaced}");
    }

    const MARKED: &[Format] = &[
        Format::Hermes,
        Format::Llama3 {
            builtin_tools: false,
        },
        Format::Llama3 {
            builtin_tools: true,
        },
        Format::MistralNemo,
        Format::Mistral { call_id: false },
        Format::DeepSeekV31,
        Format::QwenXml,
        Format::KimiK2,
        Format::JsonList(&json_list::NEMOTRON_V2),
        Format::JsonList(&json_list::COMMAND_R7B),
        Format::JsonList(&json_list::COHERE2MOE),
        Format::JsonList(&json_list::GRANITE),
        Format::JsonList(&json_list::APRIEL),
        Format::JsonList(&json_list::FIREFUNCTION_V2),
        Format::JsonList(&json_list::MINIMAX_M1),
        Format::JsonList(&json_list::GIGACHAT_V3),
        Format::JsonList(&json_list::GIGACHAT_V31),
        Format::SeedOss,
        Format::MiniMaxM2,
        Format::Glm { newlines: true },
        Format::Glm { newlines: false },
        Format::Lfm2,
        Format::DeepSeekDsml { v4: false },
        Format::DeepSeekDsml { v4: true },
        Format::MiniCpm5,
        Format::SolarOpen,
        Format::Functionary(functionary::Flavor::V31),
        Format::Functionary(functionary::Flavor::V32),
        Format::Ling3,
        Format::Hy3,
        Format::KimiK3,
        Format::MiniMaxM3,
    ];

    /// A call of a tool the request does not offer is text: no grammar held it, and the client
    /// could not run it.
    #[test]
    fn calls_of_tools_not_offered_stay_content() {
        let r = test_util::req(
            vec![test_util::tool(
                "f",
                json!({"type": "object", "properties": {}}),
            )],
            ToolChoice::Auto,
            false,
        );
        for f in MARKED {
            let p = f.parse(&one_call(*f, "f"), Some(&r));
            assert_eq!(p.tool_calls.len(), 1, "{f:?}");
            assert_eq!(
                (p.tool_calls[0].name.as_str(), p.content.as_str()),
                ("f", "")
            );
            let other = one_call(*f, "nosuch");
            let p = f.parse(&other, Some(&r));
            assert!(p.tool_calls.is_empty(), "{f:?}");
            assert_eq!(p.content, other.trim_end(), "{f:?}");
        }
    }

    /// With a response schema under `auto`, the grammar takes a reply in the schema or the
    /// calls, from the output's first token; under `required` only the calls.
    #[test]
    fn a_response_schema_holds_the_reply_that_calls_no_tool() {
        let mut rng = test_util::Rng(0x5EED_00F0);
        for round in 0..24 {
            let tools = vec![test_util::tool(
                "f",
                json!({"type": "object", "properties": {}}),
            )];
            let response = test_util::random_tools(&mut rng)[0].parameters.clone();
            let good = test_util::random_args(&mut rng, &response);
            let broken = test_util::broken_args(&mut rng, &response, &good);
            for f in MARKED.iter().copied().chain([Format::Generic]) {
                let mut r = test_util::req(tools.clone(), ToolChoice::Auto, false);
                r.response = Some(response.clone());
                let p = f.plan(&r).unwrap().unwrap();
                assert!(!p.lazy && p.triggers.is_empty(), "{f:?}");
                let g = Grammar::parse(&p.gbnf).unwrap_or_else(|e| panic!("{e:?}\n{}", p.gbnf));
                let (reply, call) = if f == Format::Generic {
                    (
                        json!({"response": good}).to_string(),
                        r#"{"tool_call": {"name": "f", "arguments": {}}}"#.to_string(),
                    )
                } else {
                    (good.to_string(), one_call(f, "f"))
                };
                assert!(
                    g.accepts_str(&reply),
                    "{f:?} round {round}: {reply}\n{}",
                    p.gbnf
                );
                assert!(g.accepts_str(&call), "{f:?}: {call}");
                assert!(!g.accepts_str(&format!("Sure. {call}")), "{f:?}");
                let parsed = f.parse(&reply, Some(&r));
                assert!(parsed.tool_calls.is_empty(), "{f:?}");
                let content: Value = serde_json::from_str(&parsed.content).unwrap();
                assert_eq!(content, good, "{f:?}");
                assert_eq!(f.parse(&call, Some(&r)).tool_calls.len(), 1, "{f:?}");
                for b in &broken {
                    let t = if f == Format::Generic {
                        json!({"response": b}).to_string()
                    } else {
                        b.to_string()
                    };
                    assert!(!g.accepts_str(&t), "{f:?} took {t}");
                }
                // Under `required` the calls only.
                r.choice = ToolChoice::Required;
                let g = Grammar::parse(&f.plan(&r).unwrap().unwrap().gbnf).unwrap();
                assert!(g.accepts_str(&call) && !g.accepts_str(&reply), "{f:?}");
            }
        }
        let mut r = test_util::req(
            vec![test_util::tool(
                "f",
                json!({"type": "object", "properties": {}}),
            )],
            ToolChoice::Auto,
            false,
        );
        r.response = Some(json!({"type": "object"}));
        assert!(Format::Atem.plan(&r).is_err());
    }

    #[test]
    fn detect_and_name() {
        assert_eq!(Format::detect(None), Format::Generic);
        assert_eq!(Format::detect(Some("{{ messages }}")), Format::Generic);
        assert_eq!(Format::detect(Some("x <tool_call> y")), Format::Hermes);
        assert_eq!(
            Format::detect(Some("<tool_call>\n<function=f>")),
            Format::Generic
        );
        assert_eq!(
            Format::detect(Some("<atem:function_calls> <|eom|> <tool_call>")),
            Format::Atem
        );
        assert_eq!(
            Format::detect(Some("<atem:function_calls>")),
            Format::Generic
        );
        assert_eq!(Format::Generic.name(), "generic");
        assert_eq!(Format::Hermes.name(), "hermes");
        assert_eq!(Format::Atem.name(), "atem");
        // real templates, where the llama.cpp sources are at hand
        for (file, want) in [
            ("Qwen-Qwen2.5-7B-Instruct.jinja", Format::Hermes),
            ("Qwen-Qwen3-0.6B.jinja", Format::Hermes),
            (
                "NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use.jinja",
                Format::Hermes,
            ),
            (
                "NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja",
                Format::Hermes,
            ),
            ("Qwen3-Coder.jinja", Format::QwenXml),
            ("Qwen3.5-4B.jinja", Format::QwenXml),
            ("NVIDIA-Nemotron-3-Nano-30B-A3B-BF16.jinja", Format::QwenXml),
            (
                "meta-llama-Llama-3.1-8B-Instruct.jinja",
                Format::Llama3 {
                    builtin_tools: true,
                },
            ),
            (
                "meta-llama-Llama-3.2-3B-Instruct.jinja",
                Format::Llama3 {
                    builtin_tools: false,
                },
            ),
            (
                "meta-llama-Llama-3.3-70B-Instruct.jinja",
                Format::Llama3 {
                    builtin_tools: true,
                },
            ),
            (
                "mistralai-Mistral-Nemo-Instruct-2407.jinja",
                Format::MistralNemo,
            ),
            (
                "Mistral-Small-3.2-24B-Instruct-2506.jinja",
                Format::Mistral { call_id: true },
            ),
            (
                "unsloth-mistral-Devstral-Small-2507.jinja",
                Format::Mistral { call_id: false },
            ),
            (
                "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja",
                Format::DeepSeekR1,
            ),
            (
                "deepseek-ai-DeepSeek-R1-Distill-Llama-8B.jinja",
                Format::DeepSeekR1,
            ),
            ("deepseek-ai-DeepSeek-V3.1.jinja", Format::DeepSeekV31),
            (
                "deepseek-ai-DeepSeek-V3.2.jinja",
                Format::DeepSeekDsml { v4: false },
            ),
            (
                "deepseek-ai-DeepSeek-V4.jinja",
                Format::DeepSeekDsml { v4: true },
            ),
            ("openbmb-MiniCPM5-1B.jinja", Format::MiniCpm5),
            ("GLM-4.6.jinja", Format::Glm { newlines: true }),
            ("GLM-4.7-Flash.jinja", Format::Glm { newlines: false }),
            ("MiniMax-M2.jinja", Format::MiniMaxM2),
            ("ByteDance-Seed-OSS.jinja", Format::SeedOss),
            ("inclusionai-ling-3.0-flash.jinja", Format::Ling3),
            ("tencent-Hy3.jinja", Format::Hy3),
            ("MiniMax-M3.jinja", Format::MiniMaxM3),
            (
                "poolside-Laguna-S-2.1.jinja",
                Format::Glm { newlines: false },
            ),
            ("google-gemma-2-2b-it.jinja", Format::Generic),
            ("muse-glimmer.jinja", Format::Atem),
            ("Kimi-K2-Instruct.jinja", Format::KimiK2),
            ("Kimi-K2-Thinking.jinja", Format::KimiK2),
            ("moonshotai-Kimi-K2.jinja", Format::KimiK2),
            ("Kimi-K3.jinja", Format::KimiK3),
            (
                "NVIDIA-Nemotron-Nano-v2.jinja",
                Format::JsonList(&json_list::NEMOTRON_V2),
            ),
            (
                "CohereForAI-c4ai-command-r7b-12-2024-tool_use.jinja",
                Format::JsonList(&json_list::COMMAND_R7B),
            ),
            ("Cohere2MoE.jinja", Format::JsonList(&json_list::COHERE2MOE)),
            (
                "ibm-granite-granite-3.3-2B-Instruct.jinja",
                Format::JsonList(&json_list::GRANITE),
            ),
            (
                "unsloth-Apriel-1.5.jinja",
                Format::JsonList(&json_list::APRIEL),
            ),
            (
                "Apriel-1.6-15b-Thinker-fixed.jinja",
                Format::JsonList(&json_list::APRIEL),
            ),
            (
                "fireworks-ai-llama-3-firefunction-v2.jinja",
                Format::JsonList(&json_list::FIREFUNCTION_V2),
            ),
            ("MiniMax-M1.jinja", Format::JsonList(&json_list::MINIMAX_M1)),
            (
                "GigaChat3-10B-A1.8B.jinja",
                Format::JsonList(&json_list::GIGACHAT_V3),
            ),
            (
                "GigaChat3.1-10B-A1.8B.jinja",
                Format::JsonList(&json_list::GIGACHAT_V31),
            ),
            ("ibm-granite-granite-4.0.jinja", Format::Hermes),
            ("LFM2-8B-A1B.jinja", Format::Lfm2),
            ("LFM2.5-8B-A1B.jinja", Format::Lfm2),
            ("LFM2.5-Instruct.jinja", Format::Lfm2),
            ("ibm-granite-granite-4.1.jinja", Format::Hermes),
            ("upstage-Solar-Open-100B.jinja", Format::SolarOpen),
            (
                "meetkai-functionary-medium-v3.1.jinja",
                Format::Functionary(functionary::Flavor::V31),
            ),
            (
                "meetkai-functionary-medium-v3.2.jinja",
                Format::Functionary(functionary::Flavor::V32),
            ),
        ] {
            // (where llama.cpp's sources are at hand)
            let Some(src) = template(file) else { return };
            assert_eq!(Format::detect(Some(&src)), want, "{file}");
        }
    }

    fn body(v: Value) -> Map<String, Value> {
        v.as_object().unwrap().clone()
    }

    fn err(v: Value) -> ApiError {
        parse_tools(&body(v.clone())).expect_err(&v.to_string())
    }

    fn f(name: &str) -> Value {
        json!({"type": "function", "function": {"name": name}})
    }

    #[test]
    fn parse_tools_reads_requests() {
        assert_eq!(parse_tools(&body(json!({}))).unwrap(), None);
        for b in [
            json!({"tools": null}),
            json!({"tools": []}),
            json!({"tools": [], "tool_choice": "none"}),
            json!({"tools": [], "tool_choice": "auto"}),
            json!({"tool_choice": null, "parallel_tool_calls": true}),
            json!({"functions": [], "function_call": "none"}),
            json!({"function_call": "auto", "functions": null}),
        ] {
            assert_eq!(parse_tools(&body(b.clone())).unwrap(), None, "{b}");
        }
        let r = parse_tools(&body(json!({"tools": [
            {"type": "function", "function": {"name": "get_weather", "description": "Weather",
             "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
             "strict": true}},
            f("a.b-c_9"),
        ]})))
        .unwrap()
        .unwrap();
        assert_eq!(r.choice, ToolChoice::Auto);
        assert!(!r.parallel);
        assert_eq!(
            r.tools,
            vec![
                Tool {
                    name: "get_weather".into(),
                    description: Some("Weather".into()),
                    parameters: json!({"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}),
                },
                Tool {
                    name: "a.b-c_9".into(),
                    description: None,
                    parameters: json!({"type": "object", "properties": {}}),
                }
            ]
        );
        for (choice, want) in [
            (json!("none"), ToolChoice::None),
            (json!("auto"), ToolChoice::Auto),
            (json!(null), ToolChoice::Auto),
            (json!("required"), ToolChoice::Required),
            (
                json!({"type": "function", "function": {"name": "g"}}),
                ToolChoice::Function("g".into()),
            ),
        ] {
            let r = parse_tools(&body(json!({
                "tools": [f("f"), f("g")], "tool_choice": choice, "parallel_tool_calls": true
            })))
            .unwrap()
            .unwrap();
            assert_eq!(r.choice, want);
            assert!(r.parallel);
        }
        let long = "x".repeat(64);
        assert!(parse_tools(&body(json!({"tools": [f(&long)]}))).is_ok());
    }

    #[test]
    fn parse_tools_refuses_bad_requests() {
        let long = "x".repeat(65);
        for (b, param, says) in [
            (json!({"tools": {}}), "tools", "array"),
            (json!({"tools": [1]}), "tools[0]", "object"),
            (
                json!({"tools": [{"function": {"name": "f"}}]}),
                "tools[0].type",
                "missing",
            ),
            (
                json!({"tools": [{"type": "code_interpreter"}]}),
                "tools[0].type",
                "\"function\"",
            ),
            (
                json!({"tools": [{"type": "function"}]}),
                "tools[0].function",
                "missing",
            ),
            (
                json!({"tools": [{"type": "function", "function": "f"}]}),
                "tools[0].function",
                "object",
            ),
            (
                json!({"tools": [f("f"), {"type": "function", "function": {}}]}),
                "tools[1].function.name",
                "missing",
            ),
            (
                json!({"tools": [{"type": "function", "function": {"name": 3}}]}),
                "tools[0].function.name",
                "string",
            ),
            (json!({"tools": [f("")]}), "tools[0].function.name", "empty"),
            (
                json!({"tools": [f("a b")]}),
                "tools[0].function.name",
                "' '",
            ),
            (
                json!({"tools": [f("f(x)")]}),
                "tools[0].function.name",
                "'('",
            ),
            (json!({"tools": [f(&long)]}), "tools[0].function.name", "64"),
            (
                json!({"tools": [f("f"), f("g"), f("f")]}),
                "tools[2].function.name",
                "twice",
            ),
            (
                json!({"tools": [{"type": "function", "function": {"name": "f", "description": 1}}]}),
                "tools[0].function.description",
                "string",
            ),
            (
                json!({"tools": [{"type": "function", "function": {"name": "f", "parameters": []}}]}),
                "tools[0].function.parameters",
                "object",
            ),
            (
                json!({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "string"}}}]}),
                "tools[0].function.parameters",
                "\"object\"",
            ),
            (
                json!({"tools": [{"type": "function", "function": {"name": "f", "strict": "yes"}}]}),
                "tools[0].function.strict",
                "boolean",
            ),
            (
                json!({"tools": [f("f")], "tool_choice": "any"}),
                "tool_choice",
                "\"required\"",
            ),
            (
                json!({"tools": [f("f")], "tool_choice": 1}),
                "tool_choice",
                "string",
            ),
            (
                json!({"tools": [f("f")], "tool_choice": {"function": {"name": "f"}}}),
                "tool_choice.type",
                "missing",
            ),
            (
                json!({"tools": [f("f")], "tool_choice": {"type": "allowed_tools"}}),
                "tool_choice.type",
                "\"function\"",
            ),
            (
                json!({"tools": [f("f")], "tool_choice": {"type": "function"}}),
                "tool_choice.function",
                "missing",
            ),
            (
                json!({"tools": [f("f")], "tool_choice": {"type": "function", "function": {}}}),
                "tool_choice.function.name",
                "missing",
            ),
            (
                json!({"tools": [f("f")], "tool_choice": {"type": "function", "function": {"name": "g"}}}),
                "tool_choice.function.name",
                "`g`",
            ),
            (
                json!({"tool_choice": "required"}),
                "tool_choice",
                "needs tools",
            ),
            (
                json!({"tools": [], "tool_choice": "required"}),
                "tool_choice",
                "needs tools",
            ),
            (
                json!({"tool_choice": {"type": "function", "function": {"name": "g"}}}),
                "tool_choice",
                "no tools",
            ),
            (
                json!({"tools": [f("f")], "parallel_tool_calls": "yes"}),
                "parallel_tool_calls",
                "boolean",
            ),
            (
                json!({"functions": [{"name": "f"}]}),
                "functions",
                "use tools",
            ),
            (
                json!({"function_call": {"name": "f"}}),
                "function_call",
                "use tool_choice",
            ),
            (
                json!({"function_call": "required"}),
                "function_call",
                "use tool_choice",
            ),
        ] {
            let e = err(b.clone());
            assert_eq!(e.status, axum::http::StatusCode::BAD_REQUEST, "{b}");
            assert_eq!(e.param.as_deref(), Some(param), "{b}: {}", e.message);
            assert!(e.message.contains(says), "{b}: {}", e.message);
        }
    }

    #[test]
    fn tool_call_ids() {
        let a = tool_call_id(42, 0);
        assert_eq!(a.len(), 29);
        assert!(a.starts_with("call_"));
        assert!(a[5..].chars().all(|c| c.is_ascii_alphanumeric()));
        assert_eq!(a, tool_call_id(42, 0));
        let mut seen = std::collections::HashSet::new();
        for seed in 0..50u64 {
            for i in 0..20 {
                assert!(seen.insert(tool_call_id(seed, i)));
            }
        }
    }

    #[test]
    fn rename_rule_only_renames_the_rule() {
        let g = "root ::= a \"root\" [root] root-ref\nroot-ref ::= root # root\nx ::= ( root )*\n";
        assert_eq!(
            rename_rule(g, "root", "call"),
            "call ::= a \"root\" [root] root-ref\nroot-ref ::= call # root\nx ::= ( call )*\n"
        );
        assert_eq!(
            rename_rule("r ::= \"\\\"root\\\\\" root é", "root", "c"),
            "r ::= \"\\\"root\\\\\" c é"
        );
        let names = rule_names(g);
        assert!(names.contains("root") && names.contains("root-ref") && names.contains("x"));
        let mut names = names;
        assert_eq!(fresh_rule(&mut names, "x"), "x-2");
        assert_eq!(fresh_rule(&mut names, "x"), "x-3");
        assert_eq!(fresh_rule(&mut names, "y"), "y");
    }

    #[test]
    fn rebase_refs_rewrites_same_document_refs() {
        let mut v = json!({
            "$id": "https://x/s.json",
            "properties": {
                "a": {"$ref": "#/$defs/a"},
                "b": {"$ref": "https://x/s.json#/$defs/b"},
                "c": {"$ref": "#"},
                "d": {"const": {"$ref": "#/keep"}},
                "e": {"$ref": "other.json#/x"},
                "f": {"$ref": "#anchor"},
                "$ref": {"type": "string"}
            }
        });
        rebase_refs(&mut v, "#/anyOf/1", Some("https://x/s.json"));
        assert_eq!(v["properties"]["a"]["$ref"], "#/anyOf/1/$defs/a");
        assert_eq!(v["properties"]["b"]["$ref"], "#/anyOf/1/$defs/b");
        assert_eq!(v["properties"]["c"]["$ref"], "#/anyOf/1");
        assert_eq!(v["properties"]["d"]["const"]["$ref"], "#/keep");
        assert_eq!(v["properties"]["e"]["$ref"], "other.json#/x");
        assert_eq!(v["properties"]["f"]["$ref"], "#anchor");
        assert_eq!(v["properties"]["$ref"], json!({"type": "string"}));
    }
}
