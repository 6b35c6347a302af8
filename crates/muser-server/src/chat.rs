//! Chat messages to a prompt: the GGUF's `tokenizer.chat_template` (a Hugging Face Jinja
//! template) rendered with minijinja and Python-compatible string methods, or a plain
//! "Role: text" template when the file has none.
//!
//! The template sees what transformers' `apply_chat_template` gives it: `messages` (role,
//! content, and the name / tool-call / reasoning fields the request gave),
//! `add_generation_prompt`, `bos_token`, `eos_token`, the request's `chat_template_kwargs`,
//! `raise_exception`, `strftime_now`, and `tojson` as transformers defines it (Python's
//! `json.dumps`). A template that reads reasoning from content blocks (Ministral 3's) gets a
//! system or assistant message's `reasoning_content` and text as `thinking` and `text` blocks,
//! and one that reads a `thinking` field (LFM2.5's) gets it there, as llama-server gives them.
//!
//! Undefined values behave as in llama-server's template engine where jinja2 would refuse
//! them: an attribute or item of an undefined value is undefined (FireFunction v2's template
//! reads `functions`, which no request defines), and `+` takes an undefined or null operand
//! beside a string as "" (`ADD`); its methods and filters that llama-server gives an
//! undefined value (`nothing.items()`, `nothing.strip()`, `nothing|first`) give an empty value
//! (`of_undefined`). Printing, iterating and testing an undefined value are as in jinja2
//! (empty, false).
//!
//! Lists the template writes (`[]`, `x|list`) can change, as in jinja2 and llama-server:
//! `append`, `pop`, `extend`... (`list`).
//!
//! Values become text as llama-server writes them where it keeps the value, else as jinja2
//! does (`text`: floats, None, lists and mappings printed, `~`, `|string`, `tojson`'s
//! floats); a string added to another value (`'a' + 5`) is joined as text, and None's
//! `items()`, a list's `sort()` and `reverse()`, a string's `rsplit()` work as in
//! llama-server, where jinja2 or minijinja refuse them (`methods`).

mod list;
mod methods;
mod text;

use crate::error::ApiError;
use crate::tools::gemma4;
use crate::tools::think::Tags;
use minijinja::machinery::{self, ast, CompiledTemplate, Instruction, Span, TemplateConfig, Vm};
use minijinja::value::{Kwargs, ValueKind};
use minijinja::{AutoEscape, Environment, Error, ErrorKind, UndefinedBehavior};
use serde_json::{Map, Value};

/// Used when the model has no `tokenizer.chat_template`.
pub const FALLBACK_TEMPLATE: &str = "{%- for m in messages -%}\
{{ m.role | capitalize }}: {{ m.content }}\n\
{% endfor -%}\
{%- if add_generation_prompt %}Assistant:{% endif -%}";

/// Template instructions one render may run. A chat template's work grows with the messages
/// (a ChatML template spent 46,016 on 2,000 messages, ~23 a message); a template that runs
/// away (nested loops in a hostile or broken GGUF) stops here with an error instead of holding
/// the server and growing its memory without end.
pub const TEMPLATE_FUEL: u64 = 20_000_000;

pub struct ChatTemplate {
    env: Environment<'static>,
    /// The template's source and its compiled form (`compile`), made once at load.
    compiled: Compiled,
    bos: String,
    eos: String,
    /// The template reads a tool call's `arguments` as an object (`object_arguments`).
    object_arguments: bool,
    /// The template writes an assistant message's calls only when its content is null
    /// (`null_call_content`).
    null_call_content: bool,
    /// How the template writes reasoning, where it writes reasoning tags.
    reasoning: Option<Reasoning>,
    /// Gemma 4's template: a prompt that ends with a finished model turn gets a new one
    /// opened (`gemma4::REOPENED_TURN`), as llama.cpp opens it.
    gemma4: bool,
    /// Gemma 4's older template, which reads tool results merged into the assistant message
    /// (`gemma4::merge_tool_responses`).
    merge_tool_responses: bool,
    /// The template writes gpt-oss's harmony channels (`tools::Format::Harmony`): a message's
    /// reasoning is its `thinking`, and a continued message is written in channels.
    harmony: bool,
    /// The template writes Kimi K3's sections (`tools::Format::KimiK3`): a continued message
    /// is written in them (`kimi3::continued`).
    kimi3: bool,
}

/// How a template writes a message's reasoning: its tags, the text before and after the
/// reasoning as it renders a message's (`<think>\n`, `\n</think>\n\n` for Qwen 3; the bare
/// tags where it renders none), which a continued message's block copies, as llama-server's
/// template analysis finds them; and where it reads a message's reasoning from.
#[derive(Debug, Clone, PartialEq)]
struct Reasoning {
    tags: Tags,
    start: String,
    end: String,
    carrier: Carrier,
}

/// Where a template reads a message's reasoning from; the request's `reasoning_content` is
/// handed to it there, as llama-server hands it.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Carrier {
    /// `reasoning_content`, as the request gives it.
    Field,
    /// Content blocks (`{"type": "thinking"}` then `{"type": "text"}`: Ministral 3's).
    Blocks,
    /// A `thinking` field (LFM2's).
    Thinking,
    /// A `thinking` field, the content of a message with calls dropped (gpt-oss's template
    /// refuses both: `harmony_thinking`).
    Harmony,
}

/// A value no template writes by itself, for `object_arguments`' probe.
const PROBE_VALUE: &str = "muser-probe-argument-value";

impl ChatTemplate {
    /// Compiles `source` (None: the fallback). A template minijinja cannot parse is an error
    /// naming the line.
    pub fn new(source: Option<&str>, bos: &str, eos: &str) -> anyhow::Result<ChatTemplate> {
        let mut env = Environment::new();
        env.set_unknown_method_callback(|state, value, method, args| {
            let empty = match value.kind() {
                ValueKind::Undefined => of_undefined(method),
                ValueKind::None => of_none(method),
                _ => return methods::call(state, value, method, args),
            };
            empty.ok_or_else(|| Error::from(ErrorKind::UnknownMethod))
        });
        methods::add_filters(&mut env);
        env.add_function(CONCAT, |a: &minijinja::Value, b: &minijinja::Value| {
            text::printed(a) + &text::printed(b)
        });
        env.add_function("raise_exception", |msg: String| -> Result<String, Error> {
            Err(Error::new(ErrorKind::InvalidOperation, msg))
        });
        // transformers: `datetime.now().strftime(format)`, the local date and time.
        env.add_function("strftime_now", |fmt: String| -> Result<String, Error> {
            strftime(&chrono::Local::now(), &fmt)
        });
        env.add_filter("tojson", tojson);
        // Jinja2's undefined has length 0, so templates test `tools|length > 0` with no tools
        // passed; minijinja's own filter refuses an undefined value.
        let length = |v: &minijinja::Value| -> Result<usize, Error> {
            if v.is_undefined() {
                Ok(0)
            } else {
                minijinja::filters::length(v)
            }
        };
        env.add_filter("length", length);
        env.add_filter("count", length);
        // llama-server's: the items, first and last of an undefined value (minijinja's refuse it).
        env.add_filter("items", |v: &minijinja::Value| {
            match of_undefined("items") {
                Some(empty) if v.is_undefined() || v.is_none() => Ok(empty),
                _ => minijinja::filters::items(v),
            }
        });
        env.add_filter("first", |v: &minijinja::Value| {
            match of_undefined("first") {
                Some(empty) if v.is_undefined() => Ok(empty),
                _ => minijinja::filters::first(v),
            }
        });
        env.add_filter("last", |v: minijinja::Value| match of_undefined("last") {
            Some(empty) if v.is_undefined() => Ok(empty),
            _ => minijinja::filters::last(v),
        });
        env.add_function(ADD, add);
        env.add_filter("list", list::filter);
        // llama-server: an attribute or item of an undefined value is undefined.
        env.set_undefined_behavior(UndefinedBehavior::Chainable);
        env.set_fuel(Some(TEMPLATE_FUEL));
        // Jinja2 reads "\r\n" and a lone "\r" as "\n" wherever they are in the source.
        let source = source.map_or_else(
            || FALLBACK_TEMPLATE.to_string(),
            |s| without_generation_tags(&s.replace("\r\n", "\n").replace('\r', "\n")),
        );
        let mut constants = Vec::new();
        let compiled = Compiled::try_new(source, |src| compile(src, &mut constants))
            .map_err(|e| anyhow::anyhow!("the chat template does not parse: {e:#}"))?;
        env.add_function(list::BUILD, list::build);
        for (k, items) in constants.into_iter().enumerate() {
            env.add_function(list::constant(k), move || list::List::value(items.clone()));
        }
        let mut t = ChatTemplate {
            env,
            compiled,
            bos: bos.to_string(),
            eos: eos.to_string(),
            object_arguments: false,
            null_call_content: false,
            reasoning: None,
            gemma4: false,
            merge_tool_responses: false,
            harmony: false,
            kimi3: false,
        };
        let src = t.compiled.borrow_owner();
        t.gemma4 = gemma4::detect(src);
        t.merge_tool_responses = gemma4::reads_tool_responses(src);
        t.harmony = crate::tools::Format::detect(Some(src)) == crate::tools::Format::Harmony;
        t.kimi3 = crate::tools::Format::detect(Some(src)) == crate::tools::Format::KimiK3;
        t.object_arguments = t.object_arguments();
        t.null_call_content = t.null_call_content();
        t.reasoning = t.reasoning(t.compiled.borrow_owner());
        Ok(t)
    }

    /// How the template writes reasoning (None where its source lacks a pair of reasoning
    /// tags): a conversation whose assistant message has a probe reasoning is rendered with
    /// thinking on, with the reasoning in `reasoning_content`, else in a `thinking` content
    /// block; where the probe comes out between the tags (and whitespace), that is how the
    /// template writes it, unless llama.cpp fixes the text around the reasoning for the
    /// template's family ([`fixed_delimiters`]).
    fn reasoning(&self, source: &str) -> Option<Reasoning> {
        let tags = Tags::of_template(source)?;
        let (fixed, tags) = match fixed_delimiters(source, tags) {
            Some(f) if xml_thinking_family(source) => (Some(f), tags.trimming_reasoning()),
            f => (f, tags),
        };
        let mut thinking = Map::new();
        thinking.insert("enable_thinking".into(), Value::Bool(true));
        let around = |assistant: Value| -> Option<(String, String)> {
            let messages = [
                serde_json::json!({"role": "user", "content": "User message"}),
                assistant,
            ];
            let p = self.render_with(&messages, false, None, &thinking).ok()?;
            let at = p.find(PROBE_VALUE)?;
            let (before, after) = (&p[..at], &p[at + PROBE_VALUE.len()..]);
            let start = &before[before.trim_end().strip_suffix(tags.open)?.len()..];
            let gap = after.len() - after.trim_start().len();
            let rest = after[gap..].strip_prefix(tags.close)?;
            let end = &after[..after.len() - rest.trim_start().len()];
            Some((start.to_string(), end.to_string()))
        };
        let field = serde_json::json!({"role": "assistant", "content": "Assistant message",
                                       "reasoning_content": PROBE_VALUE});
        let blocks = serde_json::json!({"role": "assistant", "content": [
            {"type": "thinking", "thinking": PROBE_VALUE},
            {"type": "text", "text": "Assistant message"}]});
        let thinking_field = serde_json::json!({"role": "assistant",
                                                "content": "Assistant message",
                                                "thinking": PROBE_VALUE});
        let (found, carrier) = [
            (field, Carrier::Field),
            (blocks, Carrier::Blocks),
            (thinking_field, Carrier::Thinking),
        ]
        .into_iter()
        .find_map(|(message, carrier)| Some((Some(around(message)?), carrier)))
        .unwrap_or((None, Carrier::Field));
        let (start, end) = fixed
            .or(found)
            .unwrap_or_else(|| (tags.open.to_string(), tags.close.to_string()));
        Some(Reasoning {
            tags,
            start,
            end,
            carrier,
        })
    }

    /// The tags the template writes reasoning in, if any.
    pub fn reasoning_tags(&self) -> Option<Tags> {
        self.reasoning.as_ref().map(|r| r.tags)
    }

    /// What of its final message a request continues, settled for this template (None: it
    /// continues none): `Auto` continues the reasoning of a message that has reasoning and no
    /// content where the template writes reasoning tags, else the content. Continuing the
    /// reasoning where the template has no reasoning tags is an error. An empty message
    /// (`Prefill::empty`) is not continued, as in llama-server.
    pub fn continued(&self, req: &ChatRequest) -> Result<Option<Continue>, ApiError> {
        let Some(p) = &req.prefill else {
            return Ok(None);
        };
        let thinks = self.reasoning.is_some() || self.harmony || self.kimi3;
        if p.what == Continue::Reasoning && !thinks {
            return Err(ApiError::param(
                "continue_final_message",
                "continue_final_message \"reasoning_content\": the chat template writes no \
                 reasoning tags (<think> and </think>, [THINK] and [/THINK], or its family's \
                 own), so there is no reasoning to continue",
            ));
        }
        if p.empty {
            return Ok(None);
        }
        Ok(Some(match p.what {
            Continue::Auto if thinks && !p.reasoning.is_empty() && p.content.is_empty() => {
                Continue::Reasoning
            }
            Continue::Auto => Continue::Content,
            what => what,
        }))
    }

    /// Whether the template writes an assistant message's tool calls only when its content is
    /// null (DeepSeek R1 Distill Llama's tests `content is none`). A request's null content
    /// reaches templates as "" (as llama.cpp gives it, since many templates cannot add a null to
    /// a string); such a template gets null back for a message with calls and no text, so that
    /// its calls are not dropped from the prompt.
    fn null_call_content(&self) -> bool {
        let shows_calls = |content: Value| {
            let messages = [
                serde_json::json!({"role": "user", "content": "User message"}),
                serde_json::json!({"role": "assistant", "content": content, "tool_calls": [{
                    "id": "call00001", "type": "function",
                    "function": {"name": PROBE_VALUE, "arguments": "{}"}}]}),
                serde_json::json!({"role": "tool", "content": "Tool response",
                                   "tool_call_id": "call00001"}),
                serde_json::json!({"role": "user", "content": "User message"}),
            ];
            self.render_with(&messages, true, None, &Map::new())
                .is_ok_and(|p| p.contains(PROBE_VALUE))
        };
        !shows_calls(Value::from("")) && shows_calls(Value::Null)
    }

    /// Whether the template reads a tool call's `arguments` as an object, as llama.cpp probes
    /// it: a conversation whose call has object arguments is rendered, and the template reads
    /// them when the argument's value is in the prompt, but not where it writes the whole
    /// mapping as text (Functionary v3.2's `'\n' + arguments`, `{{ arguments }}`): llama.cpp
    /// counts only a read into the arguments (an item, `items()`, `tojson`). Such a template
    /// is then given OpenAI's JSON-string arguments as the object they hold (as llama.cpp gives
    /// them); another gets the string.
    fn object_arguments(&self) -> bool {
        let messages = [
            serde_json::json!({"role": "user", "content": "User message"}),
            serde_json::json!({"role": "assistant", "content": "", "tool_calls": [{
                "id": "call00001", "type": "function",
                "function": {"name": "tool1", "arguments": {"arg": PROBE_VALUE}}}]}),
            serde_json::json!({"role": "tool", "content": "Tool response",
                               "tool_call_id": "call00001"}),
            serde_json::json!({"role": "assistant", "content": "The tool response was 'x'"}),
            serde_json::json!({"role": "user", "content": "User message"}),
        ];
        let as_text = text::repr(&minijinja::Value::from_serialize(
            serde_json::json!({ "arg": PROBE_VALUE }),
        ));
        self.render_with(&messages, true, None, &Map::new())
            .is_ok_and(|p| p.contains(PROBE_VALUE) && !p.contains(&as_text))
    }

    /// Whether the template reads tool-call arguments as objects (`object_arguments`).
    pub fn reads_object_arguments(&self) -> bool {
        self.object_arguments
    }

    /// The prompt text for `messages`, ending where the assistant's reply begins.
    pub fn render(&self, messages: &[Value]) -> Result<String, ApiError> {
        self.render_with(messages, true, None, &Map::new())
    }

    /// The prompt for a chat request: its messages rendered with its options, or, when the
    /// request continues its last (assistant) message, the conversation before that message
    /// with the assistant's turn opened (the generation prompt), then the message: where the
    /// template writes reasoning tags, as llama-server writes it, the block of its reasoning
    /// (in place of one the generation prompt opens), left open when the reasoning is
    /// continued, else closed and followed by the message's text; otherwise the text. An empty
    /// message (`Prefill::empty`) gets the conversation before it without a generation prompt,
    /// as llama-server renders it (its prefill adds nothing for a message that has nothing).
    /// (llama-server appends to the rendering *without* a generation prompt what the one with it
    /// adds after their common prefix; where a template writes something else when no
    /// generation prompt is asked, e.g. `{% else %}{{ eos_token }}`, that splices the two
    /// inside a marker. Here the opened turn is taken whole: the same prompt wherever the
    /// rendering without is a prefix of the one with.)
    pub fn render_request(&self, req: &ChatRequest) -> Result<String, ApiError> {
        let Some(prefill) = &req.prefill else {
            let mut prompt = self.render_with(
                &req.messages,
                req.add_generation_prompt,
                req.tools.as_ref(),
                &req.kwargs,
            )?;
            if req.add_generation_prompt {
                self.reopen_turn(&mut prompt);
            }
            return Ok(self.harmony_unreturned(prompt, req.add_generation_prompt));
        };
        let continued = self.continued(req)?;
        let before = &req.messages[..req.messages.len() - 1];
        if self.harmony {
            return self.harmony_continued(req, before, prefill, continued);
        }
        if self.kimi3 {
            let prompt = self.render_with(before, false, req.tools.as_ref(), &req.kwargs)?;
            return Ok(crate::tools::kimi3::continued(prompt, prefill, continued));
        }
        let mut prompt =
            self.render_with(before, continued.is_some(), req.tools.as_ref(), &req.kwargs)?;
        if continued.is_some() {
            self.reopen_turn(&mut prompt);
        }
        if continued.is_none() {
            // An empty message is not continued: no assistant turn is opened for it.
            return Ok(prompt);
        }
        if let Some(r) = &self.reasoning {
            if let Some(at) = r.tags.open_tail(&prompt) {
                prompt.truncate(at);
            }
            prompt.push_str(&r.start);
            prompt.push_str(&prefill.reasoning);
            if continued == Some(Continue::Reasoning) {
                return Ok(prompt);
            }
            prompt.push_str(&r.end);
        }
        prompt.push_str(&prefill.content);
        Ok(prompt)
    }

    /// Opens a model turn after a prompt that ends with a finished one, where the template is
    /// Gemma 4's (which opens none after a turn's tool results and answer).
    fn reopen_turn(&self, prompt: &mut String) {
        let (finished, opened) = gemma4::REOPENED_TURN;
        if self.gemma4 && prompt.ends_with(finished) {
            prompt.push_str(opened);
        }
    }

    /// A harmony prompt rendered without a generation prompt, its last `<|return|>` (which
    /// the template writes after a final assistant message, for training) made `<|end|>`, as
    /// llama-server makes it, so that the model does not read the conversation as finished.
    fn harmony_unreturned(&self, mut prompt: String, add_generation_prompt: bool) -> String {
        if self.harmony && !add_generation_prompt {
            if let Some(at) = prompt.rfind("<|return|>") {
                prompt.replace_range(at..at + "<|return|>".len(), "<|end|>");
            }
        }
        prompt
    }

    /// A harmony prompt that continues its final message, as llama-server writes it: the
    /// conversation before it (without a generation prompt), then the message's reasoning in an
    /// analysis message, left open when the reasoning is continued, else ended and followed by
    /// a final message of its text, left open.
    fn harmony_continued(
        &self,
        req: &ChatRequest,
        before: &[Value],
        prefill: &Prefill,
        continued: Option<Continue>,
    ) -> Result<String, ApiError> {
        let prompt = self.render_with(before, false, req.tools.as_ref(), &req.kwargs)?;
        let mut prompt = self.harmony_unreturned(prompt, false);
        let Some(what) = continued else {
            return Ok(prompt);
        };
        prompt.push_str("<|start|>assistant<|channel|>analysis<|message|>");
        prompt.push_str(&prefill.reasoning);
        if what != Continue::Reasoning {
            prompt.push_str("<|end|><|start|>assistant<|channel|>final<|message|>");
            prompt.push_str(&prefill.content);
        }
        Ok(prompt)
    }

    fn render_with(
        &self,
        messages: &[Value],
        add_generation_prompt: bool,
        tools: Option<&Value>,
        kwargs: &Map<String, Value>,
    ) -> Result<String, ApiError> {
        let compiled = self.compiled.borrow_dependent();
        let merged;
        let messages = if self.merge_tool_responses {
            merged = gemma4::merge_tool_responses(messages);
            &merged[..]
        } else {
            messages
        };
        let carrier = match &self.reasoning {
            _ if self.harmony => Carrier::Harmony,
            Some(r) => r.carrier,
            None => Carrier::Field,
        };
        let mut ctx: Vec<(&str, minijinja::Value)> = vec![
            (
                "messages",
                messages
                    .iter()
                    .map(|m| {
                        let m = match carrier {
                            Carrier::Field => std::borrow::Cow::Borrowed(m),
                            Carrier::Blocks => std::borrow::Cow::Owned(as_blocks(m)),
                            Carrier::Thinking => std::borrow::Cow::Owned(with_thinking(m)),
                            Carrier::Harmony => std::borrow::Cow::Owned(harmony_thinking(m)),
                        };
                        message_value(&m, self.object_arguments, self.null_call_content)
                    })
                    .collect::<minijinja::Value>(),
            ),
            ("add_generation_prompt", add_generation_prompt.into()),
            ("bos_token", self.bos.as_str().into()),
            ("eos_token", self.eos.as_str().into()),
        ];
        if let Some(t) = tools {
            ctx.push(("tools", minijinja::Value::from_serialize(t)));
        }
        // The request's own variables come last and win, as in llama-server. (One named `ADD`
        // or as a list's function, which no template can name, would replace `+` or a list.)
        for (k, v) in kwargs
            .iter()
            .filter(|(k, _)| *k != ADD && *k != CONCAT && !list::is_internal(k))
        {
            ctx.retain(|(name, _)| name != k);
            ctx.push((k, minijinja::Value::from_serialize(v)));
        }
        let mut prompt = String::new();
        Vm::new(&self.env)
            .eval(
                &compiled.instructions,
                minijinja::Value::from_iter(ctx),
                &compiled.blocks,
                &mut machinery::make_string_output(&mut prompt),
                AutoEscape::None,
            )
            .map(|_| prompt)
            .map_err(|e| match e.kind() {
                // The model's template, not the request, is at fault.
                ErrorKind::OutOfFuel => ApiError::internal(format!(
                    "the model's chat template ran past {TEMPLATE_FUEL} instructions without \
                     finishing (a runaway loop?)"
                )),
                _ => ApiError::bad_request(format!("the chat template refused the messages: {e}")),
            })
    }
}

/// Whether llama.cpp reads the template's replies with the handler of the Qwen3-Coder XML
/// family (Qwen 3.5, Nemotron 3 Nano, StepFun 3.5) or MiniCPM5's, which write a continued
/// message's block as `<think>\n`...`\n</think>\n\n` and skip the whitespace that starts the
/// reasoning.
fn xml_thinking_family(source: &str) -> bool {
    crate::tools::Format::detect(Some(source)) == crate::tools::Format::QwenXml
        || [
            "Tool usage guidelines:",
            "<function name=\"",
            "<param name=\"",
        ]
        .iter()
        .all(|m| source.contains(m))
}

/// The text before and after a continued message's reasoning where llama.cpp fixes it for
/// the template's family rather than reading it from the template's rendering: the
/// [`xml_thinking_family`], Nemotron Nano v2 (`<think>\n`, `</think>`), poolside's Laguna,
/// whose rendered whitespace llama.cpp trims off the bare tags, and Cohere's Command A
/// Reasoning (Cohere2MoE), whose text follows the block in `<|START_TEXT|>`, and Gemma 4, whose
/// template writes a message's thought channel only beside its calls (`<|channel>thought\n`,
/// `<channel|>`), and Apriel 1.6, whose template writes a message's reasoning bare, then
/// `\n[BEGIN FINAL RESPONSE]\n` (its generation prompt's `Here are my reasoning steps:` line
/// is not written before it).
fn fixed_delimiters(source: &str, tags: Tags) -> Option<(String, String)> {
    use crate::tools::think::{APRIEL, COHERE, GEMMA, THINK};
    let fixed = |start: &str, end: &str| Some((start.to_string(), end.to_string()));
    if tags == APRIEL {
        fixed("", "\n[BEGIN FINAL RESPONSE]\n")
    } else if tags == GEMMA {
        fixed("<|channel>thought\n", GEMMA.close)
    } else if tags == COHERE && source.contains("<|START_TEXT|>") {
        fixed(COHERE.open, &format!("{}<|START_TEXT|>", COHERE.close))
    } else if tags != THINK {
        None
    } else if xml_thinking_family(source) {
        fixed("<think>\n", "\n</think>\n\n")
    } else if [
        "<SPECIAL_10>",
        "<SPECIAL_11>",
        "<SPECIAL_12>",
        "<TOOL_RESPONSE>",
    ]
    .iter()
    .all(|m| source.contains(m))
    {
        fixed("<think>\n", "</think>")
    } else if source.contains("laguna_glm_thinking") {
        fixed(THINK.open, THINK.close)
    } else {
        None
    }
}

/// A system or assistant message with its reasoning and text as content blocks, for a
/// template that reads them so (Ministral 3's), as llama-server gives them: a `thinking` block
/// of its `reasoning_content` where that is not empty, then a `text` block of its content.
/// Other messages as they are.
fn as_blocks(msg: &Value) -> Value {
    let role = msg.get("role").and_then(Value::as_str);
    let (Some("system" | "assistant"), Value::Object(m)) = (role, msg) else {
        return msg.clone();
    };
    let mut m = m.clone();
    let mut content = Vec::new();
    match m.remove("reasoning_content") {
        Some(Value::String(r)) if !r.is_empty() => {
            content.push(serde_json::json!({"type": "thinking", "thinking": r}));
        }
        _ => {}
    }
    match m.get("content") {
        Some(Value::String(t)) => content.push(serde_json::json!({"type": "text", "text": t})),
        Some(Value::Array(parts)) => content.extend(parts.iter().cloned()),
        _ => {}
    }
    m.insert("content".into(), Value::Array(content));
    Value::Object(m)
}

/// A message with its `reasoning_content` (a string) also as `thinking`, for a template that
/// reads it there (LFM2's), as llama-server gives it.
fn with_thinking(msg: &Value) -> Value {
    let mut m = msg.clone();
    if let Some(r @ Value::String(_)) = msg.get("reasoning_content") {
        m["thinking"] = r.clone();
    }
    m
}

/// A message with a `reasoning_content` (a non-empty string) also as `thinking`, and without
/// its `content` where it has tool calls, for gpt-oss's template, as llama-server gives it (the
/// template writes the analysis of a message with calls from one or the other).
fn harmony_thinking(msg: &Value) -> Value {
    let mut m = msg.clone();
    if let Some(r @ Value::String(s)) = msg.get("reasoning_content") {
        if !s.is_empty() {
            m["thinking"] = r.clone();
            let calls = msg.get("tool_calls").and_then(Value::as_array);
            if let (Some(c), Value::Object(o)) = (calls, &mut m) {
                if !c.is_empty() {
                    o.remove("content");
                }
            }
        }
    }
    m
}

/// A message as the template sees it, its keys in llama-server's order (what a template
/// writes with `tojson`): role, content, reasoning_content, name, tool_call_id, tool_calls;
/// each tool call as id, type, function {name, arguments}. Keys beyond those follow, and
/// every nested object (an `arguments` object, ...) keeps its keys, in the request's order
/// (serde_json's `preserve_order`, as llama-server's ordered_json).
fn message_value(msg: &Value, object_arguments: bool, null_call_content: bool) -> minijinja::Value {
    const MESSAGE: &[&str] = &[
        "role",
        "content",
        "reasoning_content",
        "name",
        "tool_call_id",
        "tool_calls",
    ];
    const CALL: &[&str] = &["id", "type", "function"];
    const FUNCTION: &[&str] = &["name", "arguments"];
    fn ordered(
        obj: &Map<String, Value>,
        order: &[&str],
        inner: impl Fn(&str, &Value) -> minijinja::Value,
    ) -> minijinja::Value {
        let first = order
            .iter()
            .filter_map(|k| obj.get_key_value(*k))
            .map(|(k, v)| (k.as_str(), inner(k, v)));
        let rest = obj
            .iter()
            .filter(|(k, _)| !order.contains(&k.as_str()))
            .map(|(k, v)| (k.as_str(), minijinja::Value::from_serialize(v)));
        first.chain(rest).collect()
    }
    // A call's `arguments` is a JSON string in OpenAI's API; a template that reads it as an
    // object (`arguments.items()`, `arguments | tojson`) gets the object, as llama.cpp gives
    // it. A string that is not a JSON object stays a string.
    let argument = |k: &str, v: &Value| match (k, v) {
        ("arguments", Value::String(s)) if object_arguments => {
            match serde_json::from_str::<Value>(s) {
                Ok(o @ Value::Object(_)) => minijinja::Value::from_serialize(&o),
                _ => minijinja::Value::from_serialize(v),
            }
        }
        _ => minijinja::Value::from_serialize(v),
    };
    let function = |v: &Value| match v {
        Value::Object(f) => ordered(f, FUNCTION, argument),
        other => minijinja::Value::from_serialize(other),
    };
    let call = |v: &Value| match v {
        Value::Object(c) => ordered(c, CALL, |k, v| {
            if k == "function" {
                function(v)
            } else {
                minijinja::Value::from_serialize(v)
            }
        }),
        other => minijinja::Value::from_serialize(other),
    };
    let calls_only = null_call_content
        && msg["role"] == "assistant"
        && msg["content"] == ""
        && msg["tool_calls"].as_array().is_some_and(|c| !c.is_empty());
    match msg {
        Value::Object(m) => ordered(m, MESSAGE, |k, v| match (k, v) {
            ("tool_calls", Value::Array(calls)) => calls.iter().map(call).collect(),
            ("content", _) if calls_only => minijinja::Value::from(()),
            _ => minijinja::Value::from_serialize(v),
        }),
        other => minijinja::Value::from_serialize(other),
    }
}

/// What llama-server's template engine gives for the filter or method `name` of an undefined
/// value (`nothing.items()`, `nothing.strip()`, `nothing|first`): an empty string, list or
/// count, or undefined; None for a name it has none for (an error there too).
fn of_undefined(name: &str) -> Option<minijinja::Value> {
    Some(match name {
        "capitalize" | "join" | "lower" | "replace" | "safe" | "string" | "strip" | "title"
        | "truncate" | "upper" => minijinja::Value::from(""),
        "items" | "list" | "map" | "reject" | "rejectattr" | "reverse" | "select"
        | "selectattr" | "sort" | "unique" => {
            minijinja::Value::from(Vec::<minijinja::Value>::new())
        }
        "length" | "sum" | "wordcount" => minijinja::Value::from(0),
        "first" | "last" | "max" | "min" => minijinja::Value::UNDEFINED,
        _ => return None,
    })
}

/// What llama-server's template engine gives for the filter or method `name` of None
/// (`none.items()`, a null field's `items()`): an empty list; None for a name it has none
/// for. (jinja2 refuses them: a template that reads a null this way works in llama-server.)
fn of_none(name: &str) -> Option<minijinja::Value> {
    match name {
        "items" | "map" | "reject" | "rejectattr" | "select" | "selectattr" | "unique" => {
            Some(minijinja::Value::from(Vec::<minijinja::Value>::new()))
        }
        _ => None,
    }
}

self_cell::self_cell!(
    /// A template's source and its compiled instructions, which borrow from it.
    struct Compiled {
        owner: String,
        #[covariant]
        dependent: CompiledTemplate,
    }
);

/// The template compiled (trimming blocks, stripping their leading space, as transformers
/// does), each `+` made a call of `ADD`, and each list it writes a new changeable list
/// ([`list`]): a constant one (`[]`, `[1, 2]`) a call of a function of its own that makes
/// it afresh, its items pushed to `constants`, any other a call of `list::BUILD` with its
/// items. (minijinja has no hook for an operator or a literal: the instruction is swapped
/// one for one, so that every jump keeps its target.)
fn compile<'s>(
    source: &'s str,
    constants: &mut Vec<Vec<minijinja::Value>>,
) -> Result<CompiledTemplate<'s>, Error> {
    let config = TemplateConfig {
        syntax_config: Default::default(),
        ws_config: machinery::WhitespaceConfig {
            keep_trailing_newline: false,
            lstrip_blocks: true,
            trim_blocks: true,
        },
        default_auto_escape: std::sync::Arc::new(|_: &str| AutoEscape::None),
    };
    let mut c = CompiledTemplate::new("chat", source, &config)?;
    // (each `{% block %}`'s instructions are kept apart from the template's)
    for code in std::iter::once(&mut c.instructions).chain(c.blocks.values_mut()) {
        for i in 0..code.len() as u32 {
            // (a macro's argument names are a constant list too, read by `BuildMacro`)
            let macro_arguments = matches!(code.get(i + 1), Some(Instruction::BuildMacro(..)));
            let Some(op) = code.get_mut(i) else { break };
            match op {
                Instruction::Add => *op = Instruction::CallFunction(ADD, Some(2)),
                Instruction::StringConcat => *op = Instruction::CallFunction(CONCAT, Some(2)),
                Instruction::BuildList(Some(n)) => {
                    if let Ok(n) = u16::try_from(*n) {
                        *op = Instruction::CallFunction(list::BUILD, Some(n));
                    }
                }
                Instruction::LoadConst(v) if v.kind() == ValueKind::Seq && !macro_arguments => {
                    constants.push(v.try_iter()?.collect());
                    *op = Instruction::CallFunction(list::constant(constants.len() - 1), Some(0));
                }
                _ => {}
            }
        }
    }
    Ok(c)
}

/// The function every `+` of a template calls (`compile`): a name that no
/// template can write, so that none reads or replaces it.
const ADD: &str = "+";

/// The function every `~` of a template calls (`compile`): its operands as they print
/// (`text::printed`: None as "", as llama-server joins it; jinja2 writes `None`).
const CONCAT: &str = "~";

/// `a + b` as llama-server's template engine adds them: an undefined or null operand beside a
/// string is "" (FireFunction v2's `system_prompt_suffix + "\n" + functions` with no
/// `functions`), where jinja2 and minijinja refuse the sum; a string and another value are
/// joined as they print (`'a' + 5` is `a5`, `'a' + [1]` is `a[1]`: llama-server's, where
/// jinja2 refuses them, so that a template that adds them works in Muser as in llama-server);
/// any other sum as minijinja's `+` (two undefined values, or one beside a number, are still
/// an error, as in llama-server), but two lists make a new list (`list::concat`).
fn add(a: minijinja::Value, b: minijinja::Value) -> Result<minijinja::Value, Error> {
    if a.kind() == ValueKind::Seq && b.kind() == ValueKind::Seq {
        return list::concat(&a, &b);
    }
    let blank = |v: &minijinja::Value| v.is_undefined() || v.is_none();
    match (a.as_str(), b.as_str()) {
        (Some(x), Some(y)) => return Ok(minijinja::Value::from([x, y].concat())),
        (Some(_), None) if blank(&b) => return Ok(a),
        (None, Some(_)) if blank(&a) => return Ok(b),
        (Some(_), None) | (None, Some(_)) => {
            return Ok(minijinja::Value::from(
                text::printed(&a) + &text::printed(&b),
            ))
        }
        _ => {}
    }
    // minijinja's own sum, as its compiler folds `a + b` of constants (an error gives none):
    // `+` costs about what `-` does, and the template's fuel bounds its time as before.
    let constant =
        |value| ast::Expr::Const(ast::Spanned::new(ast::Const { value }, Span::default()));
    let folded = ast::Expr::BinOp(ast::Spanned::new(
        ast::BinOp {
            op: ast::BinOpKind::Add,
            left: constant(a.clone()),
            right: constant(b.clone()),
        },
        Span::default(),
    ));
    if let Some(sum) = folded.as_const() {
        return Ok(sum);
    }
    // The error, with minijinja's words for it.
    static ENV: std::sync::OnceLock<Environment<'static>> = std::sync::OnceLock::new();
    static SUM: std::sync::OnceLock<Option<minijinja::Expression<'static, 'static>>> =
        std::sync::OnceLock::new();
    let sum = SUM.get_or_init(|| {
        let env = ENV.get_or_init(Environment::new);
        env.compile_expression("a + b").ok()
    });
    let sum = sum.as_ref().ok_or_else(|| {
        Error::new(
            ErrorKind::InvalidOperation,
            "minijinja cannot compile `a + b`",
        )
    })?;
    sum.eval(minijinja::context! {a, b})
        // The sum's own error, which the template's line is added to, not the expression's.
        .map_err(|e| Error::new(e.kind(), e.detail().unwrap_or("+ failed").to_string()))
}

/// `datetime.strftime` for the codes chrono shares with C's strftime (%Y %m %d %B %b %A %a %H
/// %M %S %p %j %y %e ...). A code chrono does not know is an error, not a panic.
fn strftime<Tz: chrono::TimeZone>(now: &chrono::DateTime<Tz>, fmt: &str) -> Result<String, Error>
where
    Tz::Offset: std::fmt::Display,
{
    use chrono::format::{Item, StrftimeItems};
    use std::fmt::Write;
    let items: Vec<Item> = StrftimeItems::new(fmt).collect();
    let bad = || {
        Error::new(
            ErrorKind::InvalidOperation,
            format!("strftime_now: cannot format the date with {fmt:?}"),
        )
    };
    if items.iter().any(|i| matches!(i, Item::Error)) {
        return Err(bad());
    }
    let mut out = String::new();
    write!(out, "{}", now.format_with_items(items.into_iter())).map_err(|_| bad())?;
    Ok(out)
}

/// transformers' `tojson`: `json.dumps(value, ensure_ascii=False, indent=None,
/// separators=None, sort_keys=False)`, each option also by position in that order. Python's
/// output exactly: `", "` and `": "` between items (`","` when indenting), no HTML escaping,
/// keys in the map's order; but floats as llama-server writes them where that keeps the
/// number (`text::json_float`: `1` for 1.0, `1e+16`; Python's `repr` where llama-server's 6
/// digits would change it).
fn tojson(
    value: &minijinja::Value,
    ensure_ascii: Option<minijinja::Value>,
    indent: Option<minijinja::Value>,
    separators: Option<minijinja::Value>,
    kwargs: Kwargs,
) -> Result<String, Error> {
    let bad = |msg: String| Error::new(ErrorKind::InvalidOperation, format!("tojson: {msg}"));
    let option = |name: &str, positional: Option<minijinja::Value>| {
        let named: Option<minijinja::Value> = kwargs.get(name)?;
        match (positional, named) {
            (Some(_), Some(_)) => Err(bad(format!("{name} given twice"))),
            (p, n) => Ok(p.or(n).filter(|v| !v.is_none() && !v.is_undefined())),
        }
    };
    let ensure_ascii = option("ensure_ascii", ensure_ascii)?.is_some_and(|v| v.is_true());
    let indent = option("indent", indent)?;
    let separators = option("separators", separators)?;
    let sort_keys = option("sort_keys", None)?.is_some_and(|v| v.is_true());
    kwargs.assert_all_used()?;
    let indent = match indent {
        None => None,
        Some(v) if v.kind() == ValueKind::String => Some(v.as_str().unwrap_or("").to_string()),
        // Python: `' ' * indent` (a negative count gives no spaces; True is 1).
        Some(v) => match i64::try_from(v.clone()) {
            Ok(n) => Some(" ".repeat(n.max(0) as usize)),
            Err(_) => {
                return Err(bad(format!(
                    "indent must be an integer or a string, got {v}"
                )))
            }
        },
    };
    let (item_sep, key_sep) = match separators {
        None if indent.is_some() => (",".to_string(), ": ".to_string()),
        None => (", ".to_string(), ": ".to_string()),
        Some(v) => {
            let parts: Vec<minijinja::Value> = v.try_iter()?.collect();
            match parts.as_slice() {
                [a, b] if a.as_str().is_some() && b.as_str().is_some() => {
                    (a.to_string(), b.to_string())
                }
                _ => return Err(bad("separators must be two strings".into())),
            }
        }
    };
    let w = JsonWriter {
        ensure_ascii,
        indent,
        item_sep,
        key_sep,
        sort_keys,
    };
    let mut out = String::new();
    w.value(value, 0, &mut out)?;
    Ok(out)
}

struct JsonWriter {
    ensure_ascii: bool,
    indent: Option<String>,
    item_sep: String,
    key_sep: String,
    sort_keys: bool,
}

impl JsonWriter {
    fn value(&self, v: &minijinja::Value, depth: usize, out: &mut String) -> Result<(), Error> {
        let not_json = || {
            Error::new(
                ErrorKind::InvalidOperation,
                format!(
                    "tojson: a value of type {} is not JSON serializable",
                    v.kind()
                ),
            )
        };
        if depth > 512 {
            return Err(Error::new(
                ErrorKind::InvalidOperation,
                "tojson: the value is nested too deeply",
            ));
        }
        match v.kind() {
            ValueKind::None => out.push_str("null"),
            ValueKind::Bool => out.push_str(if v.is_true() { "true" } else { "false" }),
            ValueKind::Number => out.push_str(&text::number(v, text::json_float)),
            ValueKind::String => self.string(v.as_str().unwrap_or(""), out),
            ValueKind::Seq | ValueKind::Iterable => {
                let items: Vec<minijinja::Value> = v.try_iter()?.collect();
                self.container('[', ']', items.len(), depth, out, |i, out| {
                    self.value(&items[i], depth + 1, out)
                })?;
            }
            ValueKind::Map => {
                let mut entries = Vec::new();
                for key in v.try_iter()? {
                    let value = v.get_item(&key)?;
                    entries.push((self.key(&key)?, value));
                }
                if self.sort_keys {
                    entries.sort_by(|a, b| a.0.cmp(&b.0));
                }
                self.container('{', '}', entries.len(), depth, out, |i, out| {
                    self.string(&entries[i].0, out);
                    out.push_str(&self.key_sep);
                    self.value(&entries[i].1, depth + 1, out)
                })?;
            }
            _ => return Err(not_json()),
        }
        Ok(())
    }

    /// `[a, b]` / `{..}`, or with an indent each item on its own line.
    fn container(
        &self,
        open: char,
        close: char,
        n: usize,
        depth: usize,
        out: &mut String,
        mut item: impl FnMut(usize, &mut String) -> Result<(), Error>,
    ) -> Result<(), Error> {
        out.push(open);
        if n > 0 {
            let line = |out: &mut String, level: usize| {
                if let Some(ind) = &self.indent {
                    out.push('\n');
                    for _ in 0..level {
                        out.push_str(ind);
                    }
                }
            };
            line(out, depth + 1);
            for i in 0..n {
                if i > 0 {
                    out.push_str(&self.item_sep);
                    line(out, depth + 1);
                }
                item(i, out)?;
            }
            line(out, depth);
        }
        out.push(close);
        Ok(())
    }

    /// A map key as Python's json writes it: strings as they are, numbers, booleans and None
    /// as their JSON text.
    fn key(&self, k: &minijinja::Value) -> Result<String, Error> {
        Ok(match k.kind() {
            ValueKind::String => k.as_str().unwrap_or("").to_string(),
            ValueKind::Number => text::number(k, text::json_float),
            ValueKind::Bool => (if k.is_true() { "true" } else { "false" }).to_string(),
            ValueKind::None => "null".to_string(),
            other => {
                return Err(Error::new(
                    ErrorKind::InvalidOperation,
                    format!("tojson: keys must be str, int, float, bool or None, not {other}"),
                ))
            }
        })
    }

    fn string(&self, s: &str, out: &mut String) {
        text::json_string(s, self.ensure_ascii, out);
    }
}

/// `source` with Hugging Face's `{% generation %}` / `{% endgeneration %}` tags (they mark the
/// assistant's tokens for training masks and render nothing themselves) turned into an
/// always-true `if` block, keeping their whitespace control, so that minijinja parses them.
fn without_generation_tags(source: &str) -> String {
    static TAG: std::sync::OnceLock<fancy_regex::Regex> = std::sync::OnceLock::new();
    let tag = TAG.get_or_init(|| {
        fancy_regex::Regex::new(r"\{%(-?)\s*(end)?generation\s*(-?)%\}").expect("a valid pattern")
    });
    tag.replace_all(source, |c: &fancy_regex::Captures| {
        let body = if c.get(2).is_some() {
            "endif"
        } else {
            "if true"
        };
        format!("{{%{} {body} {}%}}", &c[1], &c[3])
    })
    .into_owned()
}

/// What of its final assistant message a request continues (`continue_final_message`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Continue {
    /// `true`, or llama-server's assistant prefill: the reasoning when the message has
    /// reasoning and no content (no text, no parts; and the template writes reasoning), else
    /// the content; nothing for a message with neither (`Prefill::empty`).
    /// [`ChatTemplate::continued`] settles it as one of the others.
    Auto,
    /// `"content"`: the message's content, after its reasoning block (where the template
    /// writes reasoning tags).
    Content,
    /// `"reasoning_content"`: the message's reasoning, in a block left open.
    Reasoning,
}

/// The final assistant message a request continues.
#[derive(Debug, Clone, PartialEq)]
pub struct Prefill {
    pub what: Continue,
    /// Its content's text (text parts joined with a blank line, as llama-server joins them).
    pub content: String,
    /// Its `reasoning_content`, "" when it has none.
    pub reasoning: String,
    /// It holds nothing to continue: no text, no content parts, no reasoning, no `name` and
    /// no `tool_call_id` (llama-server's empty message). llama-server continues no such
    /// message: the prompt is the conversation before it, without a generation prompt.
    pub empty: bool,
}

/// A chat request's messages and template options.
#[derive(Debug, Clone, PartialEq)]
pub struct ChatRequest {
    /// As [`parse_messages`] gives them.
    pub messages: Vec<Value>,
    /// `add_generation_prompt` (default true).
    pub add_generation_prompt: bool,
    /// The final assistant message when the prompt continues it (llama-server's assistant
    /// prefill; `continue_final_message`): the reply goes on from it.
    pub prefill: Option<Prefill>,
    /// `chat_template_kwargs`: extra template variables (`enable_thinking`, ...), and those the
    /// server adds where the request sets none of that name (`add_variable`): reasoning's
    /// `enable_thinking`, the tool-call format's own.
    pub kwargs: Map<String, Value>,
    /// The request's `tools` (OpenAI's array of `{"type": "function", "function": ...}`), which
    /// the template sees as `tools`; None when it gave none. Set by the caller once
    /// `tools::parse_tools` has checked them.
    pub tools: Option<Value>,
}

impl ChatRequest {
    /// Reads `messages`, `add_generation_prompt`, `continue_final_message` and
    /// `chat_template_kwargs` from a request body.
    ///
    /// A conversation that ends with an assistant message is continued, as llama-server
    /// does by default: its reply goes on from that message's reasoning or text
    /// ([`Continue::Auto`]). `continue_final_message: false` renders it as a finished turn
    /// instead; `true`, `"content"` or `"reasoning_content"` ask for the continuation (then the
    /// last message must be the assistant's, and `add_generation_prompt` may not be true).
    pub fn parse(body: &Map<String, Value>) -> Result<ChatRequest, ApiError> {
        let get = |k: &str| body.get(k).filter(|v| !v.is_null());
        let messages = parse_messages(get("messages"))?;
        let flag = |k: &str| match get(k) {
            None => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(*b)),
            Some(v) => Err(ApiError::param(
                k,
                format!("{k} must be a boolean, got {}", crate::api::type_name(v)),
            )),
        };
        let add_generation_prompt = flag("add_generation_prompt")?;
        let asked = match get("continue_final_message") {
            Some(Value::String(s)) if s == "content" => Some(Some(Continue::Content)),
            Some(Value::String(s)) if s == "reasoning_content" => Some(Some(Continue::Reasoning)),
            Some(Value::String(s)) => {
                return Err(ApiError::param(
                    "continue_final_message",
                    format!(
                        "continue_final_message must be a boolean, \"content\" or \
                         \"reasoning_content\", got {s:?}"
                    ),
                ))
            }
            _ => flag("continue_final_message")?.map(|b| b.then_some(Continue::Auto)),
        };
        let kwargs = match get("chat_template_kwargs") {
            None => Map::new(),
            Some(Value::Object(o)) => {
                for k in ["messages", "add_generation_prompt"] {
                    if o.contains_key(k) {
                        return Err(ApiError::param(
                            "chat_template_kwargs",
                            format!(
                                "chat_template_kwargs may not set {k} (it is a field of the \
                                 request)"
                            ),
                        ));
                    }
                }
                o.clone()
            }
            Some(v) => {
                return Err(ApiError::param(
                    "chat_template_kwargs",
                    format!(
                        "chat_template_kwargs must be an object, got {}",
                        crate::api::type_name(v)
                    ),
                ))
            }
        };
        let role = |m: &Value| m.get("role").and_then(Value::as_str).map(str::to_string);
        let last_is_assistant = messages.last().and_then(role).as_deref() == Some("assistant");
        let continuing = match asked {
            Some(Some(what)) => {
                if add_generation_prompt == Some(true) {
                    return Err(ApiError::bad_request(
                        "Cannot set both add_generation_prompt and continue_final_message to \
                         true.",
                    ));
                }
                if !last_is_assistant {
                    return Err(ApiError::param(
                        "continue_final_message",
                        "continue_final_message needs the last message to be the assistant's",
                    ));
                }
                Some(what)
            }
            Some(None) => None,
            None => last_is_assistant.then_some(Continue::Auto),
        };
        let prefill = match continuing {
            Some(what) => Some(prefill(&messages, get("messages"), what)?),
            None => None,
        };
        Ok(ChatRequest {
            messages,
            add_generation_prompt: add_generation_prompt.unwrap_or(true) && prefill.is_none(),
            prefill,
            kwargs,
            tools: None,
        })
    }

    /// Gives the template the dates llama-server gives every template, at `now` (local time
    /// in the server): `datetime` ("Dec 07 2026") and `date_string` ("07 Dec 2026", Llama
    /// 3.x's "Today Date"), unless the request's `chat_template_kwargs` set them.
    pub fn add_dates<Tz: chrono::TimeZone>(&mut self, now: &chrono::DateTime<Tz>)
    where
        Tz::Offset: std::fmt::Display,
    {
        self.add_variable("datetime", Value::from(now.format("%b %d %Y").to_string()));
        self.add_variable(
            "date_string",
            Value::from(now.format("%d %b %Y").to_string()),
        );
    }

    /// Gives the template the variable `name`, unless the request's `chat_template_kwargs`
    /// set it (they win, as in llama-server).
    pub fn add_variable(&mut self, name: &str, value: Value) {
        self.kwargs.entry(name).or_insert(value);
    }

    /// Adds `text` to the system prompt: after the first message's text (and a blank line)
    /// when that message is the system's, else as a new system message before the others.
    pub fn add_system(&mut self, text: &str) {
        if let Some(Value::Object(first)) = self.messages.first_mut() {
            if first.get("role").and_then(Value::as_str) == Some("system") {
                let old = first.get("content").and_then(Value::as_str).unwrap_or("");
                let joined = if old.is_empty() {
                    text.to_string()
                } else {
                    format!("{old}\n\n{text}")
                };
                first.insert("content".into(), Value::from(joined));
                return;
            }
        }
        self.messages
            .insert(0, serde_json::json!({"role": "system", "content": text}));
    }
}

/// The final assistant message of `messages` (`raw`: as the request gave them), continued as
/// `what` asks; refused where it cannot be (another assistant message before it, tool calls,
/// a reasoning to continue with content after it).
fn prefill(messages: &[Value], raw: Option<&Value>, what: Continue) -> Result<Prefill, ApiError> {
    let n = messages.len();
    if n >= 2 && messages[n - 2].get("role").and_then(Value::as_str) == Some("assistant") {
        return Err(ApiError::param(
            "messages",
            "Cannot have 2 or more assistant messages at the end of the list.",
        ));
    }
    let last = &messages[n - 1];
    if last
        .get("tool_calls")
        .and_then(Value::as_array)
        .is_some_and(|c| !c.is_empty())
    {
        return Err(ApiError::param(
            "messages",
            "Cannot continue an assistant message that contains tool calls.",
        ));
    }
    // llama-server joins a continued message's text parts with a blank line.
    let raw_content = raw
        .and_then(|m| m.get(n - 1))
        .and_then(|m| m.get("content"));
    let content = match raw_content {
        Some(Value::Array(parts)) => join_text_parts(parts, "\n\n"),
        _ => last
            .get("content")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string(),
    };
    let reasoning = last
        .get("reasoning_content")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string();
    // llama-server continues the content of a message whose content is an array of parts, even
    // of empty texts: only a message without text or parts continues its reasoning by default.
    let what = match (what, raw_content) {
        (Continue::Auto, Some(Value::Array(parts))) if !parts.is_empty() => Continue::Content,
        (what, _) => what,
    };
    if what == Continue::Reasoning && !content.is_empty() {
        // llama-server drops the content then; a client that sent it meant something else.
        return Err(ApiError::param(
            "continue_final_message",
            "continue_final_message \"reasoning_content\" continues the reasoning of the last \
             message, which has content after it: leave out its content, or continue the \
             content (\"content\" or true)",
        ));
    }
    let has = |k: &str| {
        last.get(k)
            .and_then(Value::as_str)
            .is_some_and(|s| !s.is_empty())
    };
    let empty = content.is_empty()
        && !matches!(raw_content, Some(Value::Array(parts)) if !parts.is_empty())
        && reasoning.is_empty()
        && !has("name")
        && !has("tool_call_id");
    Ok(Prefill {
        what,
        content,
        reasoning,
        empty,
    })
}

/// The text parts' texts joined as llama-server joins them: `sep` between parts, none before
/// the first non-empty text.
fn join_text_parts(parts: &[Value], sep: &str) -> String {
    let mut text = String::new();
    for t in parts
        .iter()
        .filter_map(|p| p.get("text").and_then(Value::as_str))
    {
        if !text.is_empty() {
            text.push_str(sep);
        }
        text.push_str(t);
    }
    text
}

/// Message fields passed to the template as given, besides `role` and `content`.
const PASSED_FIELDS: &[&str] = &["name", "tool_call_id", "tool_calls", "reasoning_content"];

/// Checks `messages` (a non-empty array of {role, content, ...}) and returns them as templates
/// expect them: content flattened to a string (text parts joined with a newline, as
/// llama-server does), `developer` as `system`, and `name`, `tool_call_id`, `tool_calls` and
/// `reasoning_content` kept.
pub fn parse_messages(v: Option<&Value>) -> Result<Vec<Value>, ApiError> {
    let param = |m: String| ApiError::param("messages", m);
    let arr = match v {
        Some(Value::Array(a)) => a,
        Some(other) => {
            return Err(param(format!(
                "messages must be an array, got {}",
                crate::api::type_name(other)
            )))
        }
        None => return Err(param("messages is required".into())),
    };
    if arr.is_empty() {
        return Err(param("messages must not be empty".into()));
    }
    let mut out = Vec::with_capacity(arr.len());
    for (i, m) in arr.iter().enumerate() {
        let Some(obj) = m.as_object() else {
            return Err(param(format!("messages[{i}] must be an object")));
        };
        let role = match obj.get("role") {
            Some(Value::String(r)) => r.as_str(),
            _ => return Err(param(format!("messages[{i}].role must be a string"))),
        };
        let role = match role {
            "system" | "user" | "assistant" | "tool" => role,
            "developer" => "system",
            other => {
                return Err(param(format!(
                    "messages[{i}].role '{other}' is not one of system, developer, user, \
                     assistant, tool"
                )))
            }
        };
        let content = match obj.get("content") {
            Some(Value::String(s)) => s.clone(),
            // llama-server takes a null content as "" for every role.
            Some(Value::Null) => String::new(),
            None if role == "assistant" => String::new(),
            Some(Value::Array(parts)) => {
                for (j, p) in parts.iter().enumerate() {
                    match (p.get("type").and_then(Value::as_str), p.get("text")) {
                        (Some("text"), Some(Value::String(_))) => {}
                        (Some("text"), _) => {
                            return Err(param(format!(
                                "messages[{i}].content[{j}].text must be a string"
                            )))
                        }
                        (ty, _) => {
                            return Err(param(format!(
                                "messages[{i}].content[{j}]: only text parts are supported, \
                                 got type {}",
                                ty.unwrap_or("(none)")
                            )))
                        }
                    }
                }
                join_text_parts(parts, "\n")
            }
            _ => {
                return Err(param(format!(
                    "messages[{i}].content must be a string or an array of text parts"
                )))
            }
        };
        let mut msg = Map::new();
        for (k, v) in obj {
            match k.as_str() {
                "role" => {
                    msg.insert(k.clone(), Value::from(role));
                }
                "content" => {
                    msg.insert(k.clone(), Value::from(content.as_str()));
                }
                k if PASSED_FIELDS.contains(&k) && !v.is_null() => {
                    let ok = match k {
                        "tool_calls" => v.is_array(),
                        _ => v.is_string(),
                    };
                    if !ok {
                        let want = if k == "tool_calls" {
                            "an array"
                        } else {
                            "a string"
                        };
                        return Err(param(format!(
                            "messages[{i}].{k} must be {want}, got {}",
                            crate::api::type_name(v)
                        )));
                    }
                    msg.insert(k.to_string(), v.clone());
                }
                _ => {}
            }
        }
        if !msg.contains_key("content") {
            msg.insert("content".into(), Value::from(content));
        }
        out.push(Value::Object(msg));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn fallback_template() {
        let t = ChatTemplate::new(None, "<s>", "</s>").unwrap();
        let m = parse_messages(Some(&json!([
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": [{"type": "text", "text": "Hi"}, {"type": "text", "text": "!"}]}
        ])))
        .unwrap();
        // Text parts are joined with a newline, as llama-server joins them.
        assert_eq!(
            t.render(&m).unwrap(),
            "System: Be brief.\nUser: Hi\n!\nAssistant:"
        );
        // No newline before the first text, so an empty first part adds none.
        let m = parse_messages(Some(&json!([{"role": "user", "content": [
            {"type": "text", "text": ""}, {"type": "text", "text": "a"},
            {"type": "text", "text": ""}, {"type": "text", "text": "b"}]}])))
        .unwrap();
        assert_eq!(m[0]["content"], "a\n\nb");
    }

    fn request(body: Value) -> Result<ChatRequest, ApiError> {
        ChatRequest::parse(body.as_object().unwrap())
    }

    fn render(src: &str, body: Value) -> Result<String, ApiError> {
        let t = ChatTemplate::new(Some(src), "<s>", "</s>").unwrap();
        t.render_request(&request(body)?)
    }

    const CHATML: &str = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}\
                          <|im_end|>\n{% endfor %}{% if add_generation_prompt %}\
                          <|im_start|>assistant\n{% endif %}";

    #[test]
    fn tojson_is_pythons_json_dumps() {
        // Outputs of Python's json.dumps(x, ensure_ascii=False, ...) for the same values.
        let msgs = json!([{"role": "user", "content": "hi <b> it's & \"q\" é\n\t\u{1}"}]);
        for (src, want) in [
            (
                "{{ messages[0].content | tojson }}",
                r#""hi <b> it's & \"q\" é\n\t\u0001""#,
            ),
            (
                "{{ messages | tojson }}",
                r#"[{"role": "user", "content": "hi <b> it's & \"q\" é\n\t\u0001"}]"#,
            ),
            (
                "{{ {'b': 1, 'a': [1, 2.5, none, true], 'c': {}} | tojson }}",
                r#"{"b": 1, "a": [1, 2.5, null, true], "c": {}}"#,
            ),
            (
                "{{ {'a': 1, 'b': [1, 2], 'e': []} | tojson(indent=2) }}",
                "{\n  \"a\": 1,\n  \"b\": [\n    1,\n    2\n  ],\n  \"e\": []\n}",
            ),
            (
                "{{ {'a': 1, 'b': 2} | tojson(separators=(',', ':')) }}",
                r#"{"a":1,"b":2}"#,
            ),
            (
                "{{ {'b': 1, 'a': 2} | tojson(sort_keys=true) }}",
                r#"{"a": 2, "b": 1}"#,
            ),
            (
                "{{ 'é😀' | tojson(ensure_ascii=true) }}",
                r#""\u00e9\ud83d\ude00""#,
            ),
            (
                "{{ [1.0, 0.1, 1e16, 1.5e-05, 0.0001, -0.0, 123456789.0, 2e-7] | tojson }}",
                // (floats as llama-server writes them where that keeps the number: 1.0 as
                // `1`, -0.0 as `-0`; Python's where its 6 digits would not: 123456789.0)
                "[1, 0.1, 1e+16, 1.5e-05, 0.0001, -0, 123456789.0, 2e-07]",
            ),
            (
                "{{ {1: 'x', none: 'y'} | tojson }}",
                r#"{"1": "x", "null": "y"}"#,
            ),
            ("{{ [1, 2] | tojson(indent='\t') }}", "[\n\t1,\n\t2\n]"),
        ] {
            assert_eq!(
                render(src, json!({"messages": msgs})).unwrap(),
                want,
                "{src}"
            );
        }
        // Message fields and tool calls in the order OpenAI clients send them.
        let out = render(
            "{{ messages | tojson }}",
            json!({"continue_final_message": false, "messages": [
                {"name": "bob", "content": "x", "role": "user"},
                {"tool_calls": [{"function": {"arguments": "{}", "name": "f"}, "type": "function",
                                 "id": "c1"}], "role": "assistant", "content": ""}]}),
        )
        .unwrap();
        assert_eq!(
            out,
            r#"[{"role": "user", "content": "x", "name": "bob"}, {"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": {}}}]}]"#
        );
        // What Python cannot serialize is an error, not a panic.
        for src in [
            "{{ nothing | tojson }}",
            "{{ 1 | tojson(bogus=1) }}",
            "{{ 1 | tojson(separators=',') }}",
            "{{ 1 | tojson(indent=[1]) }}",
        ] {
            let e = render(src, json!({"messages": msgs})).unwrap_err();
            assert_eq!(e.status, 400, "{src}");
        }
    }

    #[test]
    fn string_arguments_are_objects_for_templates_that_read_them() {
        // OpenAI's arguments are a JSON string; a template that reads them as an object (here
        // by `items()`, or `tojson` of the object) gets the object, one that does not read
        // them (or prints the string) keeps the string, as llama.cpp probes it.
        let body = json!({"continue_final_message": false, "messages": [
            {"role": "user", "content": "x"},
            {"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "type": "function",
             "function": {"name": "f", "arguments": "{\"b\": 2, \"a\": [1, \"s\"]}"}}]},
            {"role": "assistant", "content": "", "tool_calls": [{"id": "c2", "type": "function",
             "function": {"name": "g", "arguments": "not json"}}]}]});
        let items = "{% for m in messages %}{% for c in m.tool_calls %}\
            {% if c.function.arguments is mapping %}{% for k, v in c.function.arguments.items() %}\
            {{ k }}={{ v | tojson }};{% endfor %}{% else %}{{ c.function.arguments }}{% endif %}|\
            {% endfor %}{% endfor %}";
        assert_eq!(
            render(items, body.clone()).unwrap(),
            r#"b=2;a=[1, "s"];|not json|"#
        );
        let names = "{% for m in messages %}{% for c in m.tool_calls %}{{ c.function.name }}:\
            {{ c.function.arguments is string }}|{% endfor %}{% endfor %}";
        assert_eq!(render(names, body).unwrap(), "f:True|g:True|");
    }

    #[test]
    fn dates_reach_the_template_unless_the_request_sets_them() {
        use chrono::{Datelike, TimeZone};
        let mut rng = 0x000D_A7E5_u64;
        let src = "{{ datetime }}|{{ date_string }}";
        let t = ChatTemplate::new(Some(src), "", "").unwrap();
        for _ in 0..32 {
            rng = rng
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let secs = (rng >> 33) as i64 % 4_000_000_000;
            let now = chrono::Utc.timestamp_opt(secs, 0).unwrap();
            let body = json!({"messages": [{"role": "user", "content": "hi"}]});
            let mut req = ChatRequest::parse(body.as_object().unwrap()).unwrap();
            req.add_dates(&now);
            let (d, m, y) = (now.day(), now.month(), now.year());
            let mon = [
                "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
            ][m as usize - 1];
            let want = format!("{mon} {d:02} {y}|{d:02} {mon} {y}");
            assert_eq!(t.render_request(&req).unwrap(), want);
            let body = json!({"messages": [{"role": "user", "content": "hi"}],
                              "chat_template_kwargs": {"date_string": "26 Jul 2024"}});
            let mut req = ChatRequest::parse(body.as_object().unwrap()).unwrap();
            req.add_dates(&now);
            let got = t.render_request(&req).unwrap();
            assert_eq!(got, format!("{mon} {d:02} {y}|26 Jul 2024"));
        }
    }

    #[test]
    fn strftime_formats_the_given_time() {
        use chrono::TimeZone;
        let t = chrono::Utc.with_ymd_and_hms(2026, 3, 5, 14, 7, 9).unwrap();
        let f = |fmt: &str| strftime(&t, fmt).unwrap();
        assert_eq!(f("%Y-%m-%d"), "2026-03-05");
        assert_eq!(f("%d %b %Y"), "05 Mar 2026");
        assert_eq!(f("%B %d, %Y"), "March 05, 2026");
        assert_eq!(
            f("%A %a %H:%M:%S %p %j %y [%e]"),
            "Thursday Thu 14:07:09 PM 064 26 [ 5]"
        );
        assert_eq!(f("no codes %%"), "no codes %");
        // A format chrono cannot read is an error.
        assert!(strftime(&t, "%Q").is_err());
        assert!(strftime(&t, "%").is_err());
        // The template function gives today's date (checked around the call, for midnight).
        let before = chrono::Local::now().format("%Y-%m-%d").to_string();
        let out = render(
            "{{ strftime_now('%Y-%m-%d') }}",
            json!({"messages": [
            {"role": "user", "content": "x"}]}),
        )
        .unwrap();
        let after = chrono::Local::now().format("%Y-%m-%d").to_string();
        assert!(out == before || out == after, "{out}");
        let e = render(
            "{{ strftime_now('%Q') }}",
            json!({"messages": [
            {"role": "user", "content": "x"}]}),
        )
        .unwrap_err();
        assert!(e.message.contains("%Q"), "{}", e.message);
    }

    #[test]
    fn crlf_in_a_template_is_a_newline() {
        let src = "A\r\n{% if true %}\r\nB\r\n{% endif %}\r\nC\rD";
        let out = render(src, json!({"messages": [{"role": "user", "content": "x"}]})).unwrap();
        assert_eq!(out, "A\nB\nC\nD");
    }

    #[test]
    fn generation_prompt_options_and_template_kwargs() {
        let user = json!([{"role": "user", "content": "Hi"}]);
        assert_eq!(
            render(CHATML, json!({"messages": user})).unwrap(),
            "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
        );
        assert_eq!(
            render(
                CHATML,
                json!({"messages": user, "add_generation_prompt": false})
            )
            .unwrap(),
            "<|im_start|>user\nHi<|im_end|>\n"
        );
        let src = "{{ enable_thinking }} {{ bos_token }} {{ messages|length }}";
        let body = json!({"messages": user,
                          "chat_template_kwargs": {"enable_thinking": false, "bos_token": "B"}});
        assert_eq!(render(src, body).unwrap(), "False B 1");
        for (body, what) in [
            (
                json!({"messages": user, "add_generation_prompt": "yes"}),
                "boolean",
            ),
            (
                json!({"messages": user, "chat_template_kwargs": [1]}),
                "object",
            ),
            (
                json!({"messages": user, "chat_template_kwargs": {"messages": []}}),
                "messages",
            ),
            (
                json!({"messages": user, "continue_final_message": 1}),
                "boolean",
            ),
            (
                json!({"messages": user, "continue_final_message": "reasoning"}),
                "\"reasoning_content\"",
            ),
        ] {
            let e = request(body.clone()).unwrap_err();
            assert_eq!(e.status, 400);
            assert!(e.message.contains(what), "{body}: {}", e.message);
        }
    }

    #[test]
    fn a_final_assistant_message_is_continued() {
        let convo = json!([{"role": "user", "content": "Write a poem."},
                           {"role": "assistant", "content": "Roses are"}]);
        let continued =
            "<|im_start|>user\nWrite a poem.<|im_end|>\n<|im_start|>assistant\nRoses are";
        // By default (llama-server's assistant prefill) and when asked.
        assert_eq!(
            render(CHATML, json!({"messages": convo})).unwrap(),
            continued
        );
        for body in [
            json!({"messages": convo, "continue_final_message": true}),
            json!({"messages": convo, "continue_final_message": true,
                   "add_generation_prompt": false}),
            json!({"messages": convo, "add_generation_prompt": false}),
            json!({"messages": convo, "add_generation_prompt": true}),
        ] {
            assert_eq!(render(CHATML, body.clone()).unwrap(), continued, "{body}");
        }
        // continue_final_message false: a finished turn, then a new one.
        assert_eq!(
            render(
                CHATML,
                json!({"messages": convo, "continue_final_message": false})
            )
            .unwrap(),
            "<|im_start|>user\nWrite a poem.<|im_end|>\n<|im_start|>assistant\nRoses are\
             <|im_end|>\n<|im_start|>assistant\n"
        );
        // A template that writes something else when no generation prompt is asked: the turn
        // opened by the generation prompt, whole (no end-of-text marker, no spliced marker).
        let src = "{% for m in messages %}[{{ m.content }}]{% endfor %}\
                   {% if add_generation_prompt %}<A>{% else %}.{% endif %}";
        assert_eq!(
            render(src, json!({"messages": convo})).unwrap(),
            "[Write a poem.]<A>Roses are"
        );
        let phi3 = "{% for m in messages %}<|{{ m.role }}|>\n{{ m.content }}<|end|>\n{% endfor %}\
                    {% if add_generation_prompt %}<|assistant|>\n{% else %}{{ eos_token }}{% endif %}";
        assert_eq!(
            render(phi3, json!({"messages": convo})).unwrap(),
            "<|user|>\nWrite a poem.<|end|>\n<|assistant|>\nRoses are"
        );
        // A continued message's text parts are joined with a blank line.
        let parts = json!([{"role": "user", "content": "Q"},
                           {"role": "assistant", "content": [{"type": "text", "text": "a"},
                                                             {"type": "text", "text": "b"}]}]);
        assert_eq!(
            render(src, json!({"messages": parts})).unwrap(),
            "[Q]<A>a\n\nb"
        );
        // Refusals, as llama-server's.
        let two = json!([{"role": "user", "content": "Q"}, {"role": "assistant", "content": "a"},
                         {"role": "assistant", "content": "b"}]);
        let calls = json!([{"role": "user", "content": "Q"}, {"role": "assistant", "content": "",
            "tool_calls": [{"id": "1", "type": "function",
                            "function": {"name": "f", "arguments": "{}"}}]}]);
        for (body, what) in [
            (
                json!({"messages": convo, "continue_final_message": true,
                    "add_generation_prompt": true}),
                "Cannot set both",
            ),
            (
                json!({"messages": [{"role": "user", "content": "Q"}],
                    "continue_final_message": true}),
                "assistant",
            ),
            (json!({"messages": two}), "2 or more assistant messages"),
            (json!({"messages": calls}), "tool calls"),
        ] {
            let e = request(body.clone()).unwrap_err();
            assert!(e.message.contains(what), "{body}: {}", e.message);
        }
        // A turn with tool calls is fine when not continued.
        assert!(request(json!({"messages": calls, "continue_final_message": false})).is_ok());
    }

    /// A random text of markup and other characters that neither starts nor ends with
    /// whitespace.
    fn random_text(rng: &mut crate::tools::test_util::Rng) -> String {
        format!("x{}y", crate::tools::test_util::markup_text(rng, 1, 16))
    }

    /// llama.cpp's template `file` with BOS `<s>` and EOS `</s>`; None where its sources
    /// are not at hand.
    fn real(file: &str) -> Option<ChatTemplate> {
        let src = crate::tools::test_util::template(file)?;
        Some(ChatTemplate::new(Some(&src), "<s>", "</s>").unwrap())
    }

    fn render_body(t: &ChatTemplate, body: Value) -> Result<String, ApiError> {
        t.render_request(&request(body)?)
    }

    /// How each real template writes reasoning, as llama-server's analysis finds it (or its
    /// family's handler fixes it): Qwen 3 with its whitespace, DeepSeek R1 (which renders no
    /// reasoning) with the bare tags, Ministral 3 with `[THINK]` tags read from content blocks,
    /// LFM2.5 from a `thinking` field, Seed-OSS and MiniMax M3 with their own tags, the
    /// Qwen3-Coder family (Nemotron 3 Nano) with `<think>\n` and `\n</think>\n\n`, Nemotron
    /// Nano v2 with `<think>\n` and `</think>`, Laguna with the bare tags; templates without
    /// reasoning tags have none.
    #[test]
    fn templates_tell_how_they_write_reasoning() {
        use crate::tools::think::{BRACKETS, COHERE, MINIMAX, SEED, THINK};
        use Carrier::*;
        let xml = THINK.trimming_reasoning();
        let want = [
            (
                "Qwen-Qwen3-0.6B.jinja",
                THINK,
                "<think>\n",
                "\n</think>\n\n",
                Field,
            ),
            (
                "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja",
                THINK,
                "<think>",
                "</think>",
                Field,
            ),
            (
                "mistralai-Ministral-3-14B-Reasoning-2512.jinja",
                BRACKETS,
                "[THINK]",
                "[/THINK]",
                Blocks,
            ),
            (
                "LFM2.5-8B-A1B.jinja",
                THINK,
                "<think>",
                "</think>",
                Thinking,
            ),
            (
                "ByteDance-Seed-OSS.jinja",
                SEED,
                "<seed:think>",
                "</seed:think>\n",
                Field,
            ),
            (
                "MiniMax-M3.jinja",
                MINIMAX,
                "<mm:think>",
                "</mm:think>",
                Field,
            ),
            (
                "NVIDIA-Nemotron-3-Nano-30B-A3B-BF16.jinja",
                xml,
                "<think>\n",
                "\n</think>\n\n",
                Field,
            ),
            (
                "Qwen3.5-4B.jinja",
                xml,
                "<think>\n",
                "\n</think>\n\n",
                Field,
            ),
            (
                "openbmb-MiniCPM5-1B.jinja",
                xml,
                "<think>\n",
                "\n</think>\n\n",
                Field,
            ),
            (
                "NVIDIA-Nemotron-Nano-v2.jinja",
                THINK,
                "<think>\n",
                "</think>",
                Field,
            ),
            (
                "poolside-Laguna-XS.2.jinja",
                THINK,
                "<think>",
                "</think>",
                Field,
            ),
            (
                "Cohere2MoE.jinja",
                COHERE,
                COHERE.open,
                "<|END_THINKING|><|START_TEXT|>",
                Field,
            ),
            (
                "CohereForAI-c4ai-command-r7b-12-2024-tool_use.jinja",
                COHERE,
                COHERE.open,
                COHERE.close,
                Field,
            ),
        ];
        for (file, tags, start, end, carrier) in want {
            let Some(t) = real(file) else { return };
            let r = t.reasoning.clone().unwrap();
            assert_eq!(
                (r.tags, r.start.as_str(), r.end.as_str(), r.carrier),
                (tags, start, end, carrier),
                "{file}"
            );
        }
        let t = ChatTemplate::new(Some(CHATML), "", "").unwrap();
        assert_eq!(t.reasoning, None);
        assert_eq!(
            real("Mistral-Small-3.2-24B-Instruct-2506.jinja")
                .unwrap()
                .reasoning,
            None
        );
    }

    /// Ministral 3's template reads an assistant's (and the system's) reasoning and text from
    /// content blocks: a conversation with random reasoning in its history renders them in
    /// `[THINK]` tags before the text, as llama-server gives them; plain string content (no
    /// reasoning, or an empty one) renders as it did.
    /// gpt-oss's template gets a message's reasoning as `thinking` (and no content beside it
    /// where the message has calls, which the template refuses); a continued message is written
    /// in channels, its analysis left open when its reasoning goes on, else ended and followed
    /// by its final message; a finished final turn ends in `<|end|>`, not `<|return|>`.
    #[test]
    fn gpt_oss_reads_thinking_and_continues_in_channels() {
        let Some(t) = real("openai-gpt-oss-120b.jinja") else {
            return;
        };
        let mut rng = crate::tools::test_util::Rng(0x5EED_6055);
        for _ in 0..20 {
            let (q, r, a) = (
                random_text(&mut rng),
                random_text(&mut rng),
                random_text(&mut rng),
            );
            let user = json!({"role": "user", "content": q});
            let call = json!({"role": "assistant", "content": a, "reasoning_content": r,
                "tool_calls": [{"id": "c1", "type": "function",
                                "function": {"name": "f", "arguments": "{\"x\": 1}"}}]});
            let result = json!({"role": "tool", "tool_call_id": "c1", "content": "ok"});
            let p = render_body(&t, json!({"messages": [user, call, result]})).unwrap();
            let analysis = format!("<|start|>assistant<|channel|>analysis<|message|>{r}<|end|>");
            assert!(
                p.contains(&format!("{analysis}<|start|>assistant to=functions.f")),
                "{p}"
            );
            let head = render_body(
                &t,
                json!({"messages": [user], "add_generation_prompt": false}),
            )
            .unwrap();
            let both = json!({"role": "assistant", "content": a, "reasoning_content": r});
            let p = render_body(&t, json!({"messages": [user, both]})).unwrap();
            assert_eq!(
                p,
                format!("{head}{analysis}<|start|>assistant<|channel|>final<|message|>{a}")
            );
            let only = json!({"role": "assistant", "content": "", "reasoning_content": r});
            let p = render_body(&t, json!({"messages": [user, only]})).unwrap();
            assert_eq!(
                p,
                format!("{head}{}", analysis.strip_suffix("<|end|>").unwrap())
            );
            let p = render_body(
                &t,
                json!({"messages": [user, both], "continue_final_message": false,
                       "add_generation_prompt": false}),
            )
            .unwrap();
            assert!(p.ends_with(&format!("final<|message|>{a}<|end|>")), "{p}");
        }
    }

    #[test]
    fn ministral_reads_reasoning_and_text_as_content_blocks() {
        let Some(t) = real("mistralai-Ministral-3-14B-Reasoning-2512.jinja") else {
            return;
        };
        let mut rng = crate::tools::test_util::Rng(0x7417_0003);
        for _ in 0..50 {
            let [sys, q, r, a, q2] = std::array::from_fn(|_| random_text(&mut rng));
            let body = json!({"messages": [
                {"role": "system", "content": sys},
                {"role": "user", "content": q},
                {"role": "assistant", "content": a, "reasoning_content": r},
                {"role": "user", "content": q2},
                {"role": "assistant", "content": a, "reasoning_content": ""},
                {"role": "user", "content": q},
                {"role": "assistant", "content": a},
                {"role": "user", "content": q2}]});
            assert_eq!(
                render_body(&t, body).unwrap(),
                format!(
                    "<s>[SYSTEM_PROMPT]{sys}[/SYSTEM_PROMPT][INST]{q}[/INST][THINK]{r}[/THINK]\
                     {a}</s>[INST]{q2}[/INST]{a}</s>[INST]{q}[/INST]{a}</s>[INST]{q2}[/INST]"
                )
            );
            // A call with reasoning and no text.
            let body = json!({"messages": [
                {"role": "user", "content": q},
                {"role": "assistant", "content": null, "reasoning_content": r, "tool_calls": [
                    {"id": "abcDEF123", "type": "function",
                     "function": {"name": "f", "arguments": "{\"a\": 1}"}}]},
                {"role": "tool", "tool_call_id": "abcDEF123", "content": a}]});
            let p = render_body(&t, body).unwrap();
            assert!(
                p.ends_with(&format!(
                    "[INST]{q}[/INST][THINK]{r}[/THINK][TOOL_CALLS]f[ARGS]{{\"a\": 1}}</s>\
                     [TOOL_RESULTS]{a}[/TOOL_RESULTS]"
                )),
                "{p}"
            );
        }
    }

    /// `continue_final_message` with reasoning, as llama-server writes the prompt: the block of
    /// the message's reasoning, left open to continue the reasoning, or closed and followed by
    /// the text to continue the text (an empty block where the message has no reasoning), in
    /// place of the block a generation prompt opens; `true` (and the assistant prefill)
    /// continues the reasoning of a message that has no text. Random texts, three templates
    /// (llama-server's prompts for them spell the expected ones).
    #[test]
    fn reasoning_is_continued_as_llama_server_writes_it() {
        let cases = [
            (
                "Qwen-Qwen3-0.6B.jinja",
                "<|im_start|>user\n{q}<|im_end|>\n<|im_start|>assistant\n",
                ("<think>\n", "\n</think>\n\n"),
            ),
            (
                "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja",
                "<s><｜User｜>{q}<｜Assistant｜>",
                ("<think>", "</think>"),
            ),
            (
                "mistralai-Ministral-3-14B-Reasoning-2512.jinja",
                "<s>[SYSTEM_PROMPT]S[/SYSTEM_PROMPT][INST]{q}[/INST]",
                ("[THINK]", "[/THINK]"),
            ),
        ];
        let mut rng = crate::tools::test_util::Rng(0x7417_0004);
        for (file, head, (open, close)) in cases {
            let Some(t) = real(file) else { return };
            for _ in 0..30 {
                let [q, r, a] = std::array::from_fn(|_| random_text(&mut rng));
                let head = head.replace("{q}", &q);
                let convo = |content: &str, reasoning: Option<&str>| {
                    let mut last = json!({"role": "assistant", "content": content});
                    if let Some(r) = reasoning {
                        last["reasoning_content"] = json!(r);
                    }
                    let mut m = vec![json!({"role": "user", "content": q}), last];
                    if file.contains("Ministral") {
                        m.insert(0, json!({"role": "system", "content": "S"}));
                    }
                    Value::from(m)
                };
                let go = |body: Value| render_body(&t, body).unwrap();
                let reasoning = format!("{head}{open}{r}");
                let content = format!("{head}{open}{r}{close}{a}");
                let bare = format!("{head}{open}{close}{a}");
                let kw = json!({"enable_thinking": false});
                for (body, want) in [
                    (json!({"messages": convo("", Some(&r))}), &reasoning),
                    (
                        json!({"messages": convo("", Some(&r)), "continue_final_message": true}),
                        &reasoning,
                    ),
                    (
                        json!({"messages": convo("", Some(&r)),
                               "continue_final_message": "reasoning_content",
                               "chat_template_kwargs": kw}),
                        &reasoning,
                    ),
                    (json!({"messages": convo(&a, Some(&r))}), &content),
                    (
                        json!({"messages": convo(&a, Some(&r)),
                               "continue_final_message": "content",
                               "add_generation_prompt": false}),
                        &content,
                    ),
                    (json!({"messages": convo(&a, None)}), &bare),
                ] {
                    assert_eq!(&go(body.clone()), want, "{file}: {body}");
                    let req = request(body.clone()).unwrap();
                    let within = if want == &content || want == &bare {
                        Continue::Content
                    } else {
                        Continue::Reasoning
                    };
                    assert_eq!(t.continued(&req).unwrap(), Some(within), "{body}");
                }
                // An empty message is not continued, however asked: the conversation before
                // it, no generation prompt.
                let all = convo("", None);
                let earlier = &all.as_array().unwrap()[..all.as_array().unwrap().len() - 1];
                let before = go(json!({"messages": earlier, "add_generation_prompt": false}));
                assert!(
                    before.contains(&q) && head.starts_with(&before),
                    "{file}: {before}"
                );
                for what in [json!(true), json!("content"), json!("reasoning_content")] {
                    let body = json!({"messages": convo("", None),
                                      "continue_final_message": what});
                    assert_eq!(go(body.clone()), before, "{file}: {body}");
                    assert_eq!(t.continued(&request(body).unwrap()).unwrap(), None);
                }
            }
        }
    }

    /// A message with reasoning whose content is an array of parts is continued after its
    /// reasoning block, as llama-server continues it (its content's parts, not its text, tell),
    /// even where the parts' texts are empty; an empty array is no content, and the reasoning
    /// is continued. Random texts, Ministral 3's and Qwen 3's templates.
    #[test]
    fn content_parts_continue_the_content() {
        let cases = [
            (
                "mistralai-Ministral-3-14B-Reasoning-2512.jinja",
                ("[THINK]", "[/THINK]"),
            ),
            ("Qwen-Qwen3-0.6B.jinja", ("<think>\n", "\n</think>\n\n")),
        ];
        let mut rng = crate::tools::test_util::Rng(0x7417_0005);
        for (file, (open, close)) in cases {
            let Some(t) = real(file) else { return };
            for _ in 0..30 {
                let [q, r] = std::array::from_fn(|_| random_text(&mut rng));
                let user = json!({"role": "user", "content": q});
                let head = render_body(&t, json!({"messages": [user]})).unwrap();
                let empty = json!({"type": "text", "text": ""});
                let parts: Vec<Value> = vec![empty; 1 + rng.below(3)];
                for (content, want, what) in [
                    (
                        json!(parts),
                        format!("{head}{open}{r}{close}"),
                        Continue::Content,
                    ),
                    (json!([]), format!("{head}{open}{r}"), Continue::Reasoning),
                ] {
                    let last = json!({"role": "assistant", "content": content,
                                      "reasoning_content": r});
                    for flag in [json!(null), json!(true)] {
                        let body = json!({"messages": [user, last],
                                          "continue_final_message": flag});
                        assert_eq!(render_body(&t, body.clone()).unwrap(), want, "{body}");
                        let req = request(body.clone()).unwrap();
                        assert_eq!(t.continued(&req).unwrap(), Some(what), "{body}");
                    }
                }
            }
        }
    }

    /// Continuing reasoning where it cannot be: a template without reasoning tags, a message
    /// whose reasoning has text after it. Where the template has no tags, `true` continues the
    /// text, and a message's reasoning stays out of the prompt.
    #[test]
    fn reasoning_continuations_that_cannot_be_are_refused() {
        let t = ChatTemplate::new(Some(CHATML), "", "").unwrap();
        let only = json!([{"role": "user", "content": "Q"},
                          {"role": "assistant", "content": "", "reasoning_content": "hm"}]);
        let e = render_body(
            &t,
            json!({"messages": only, "continue_final_message": "reasoning_content"}),
        )
        .unwrap_err();
        assert_eq!(e.param.as_deref(), Some("continue_final_message"));
        assert!(e.message.contains("no reasoning tags"), "{}", e.message);
        let head = "<|im_start|>user\nQ<|im_end|>\n<|im_start|>assistant\n";
        assert_eq!(render_body(&t, json!({"messages": only})).unwrap(), head);
        let both = json!([{"role": "user", "content": "Q"},
                          {"role": "assistant", "content": "A", "reasoning_content": "hm"}]);
        assert_eq!(
            render_body(
                &t,
                json!({"messages": both, "continue_final_message": true})
            )
            .unwrap(),
            format!("{head}A")
        );
        let e = request(json!({"messages": both, "continue_final_message": "reasoning_content"}))
            .unwrap_err();
        assert!(e.message.contains("has content after it"), "{}", e.message);
        let e = request(json!({"messages": [{"role": "user", "content": "Q"}],
                               "continue_final_message": "content"}))
        .unwrap_err();
        assert!(e.message.contains("assistant's"), "{}", e.message);
    }

    #[test]
    fn message_fields_reach_the_template() {
        let src = "{% for m in messages %}{{ m.role }}|{{ m.name }}|{{ m.tool_call_id }}|\
                   {{ m.reasoning_content }}|{% for c in m.tool_calls %}{{ c.function.name }}\
                   ({{ c.function.arguments }}){% endfor %}|{{ m.refusal is defined }};\
                   {% endfor %}";
        let body = json!({"continue_final_message": false, "messages": [
            {"role": "user", "content": "hi", "name": "bob", "refusal": "x"},
            {"role": "assistant", "content": null, "reasoning_content": "think",
             "tool_calls": [{"id": "c1", "type": "function",
                             "function": {"name": "f", "arguments": "{\"a\": 1}"}}]},
            {"role": "tool", "content": "42", "tool_call_id": "c1"}]});
        assert_eq!(
            render(src, body).unwrap(),
            "user|bob||||False;assistant|||think|f({\"a\": 1})|False;tool||c1|||False;"
        );
        for (m, what) in [
            (
                json!({"role": "user", "content": "x", "name": 3}),
                "name must be a string",
            ),
            (
                json!({"role": "assistant", "content": "x", "tool_calls": {}}),
                "tool_calls must be an array",
            ),
        ] {
            let e = parse_messages(Some(&json!([m]))).unwrap_err();
            assert!(e.message.contains(what), "{}", e.message);
        }
    }

    #[test]
    fn nested_objects_keep_the_requests_key_order() {
        // As llama-server (nlohmann's ordered_json): what a template writes with `tojson` has
        // the client's key order below the message fields, not sorted keys. Parsed from text,
        // as a request body is.
        let body: Value = serde_json::from_str(
            r#"{"continue_final_message": false, "messages": [
                {"role": "assistant", "content": "", "tool_calls": [{"function": {
                    "arguments": {"zeta": 1, "alpha": {"y": 2, "b": 3}}, "name": "f",
                    "strict": true}, "type": "function", "id": "c1", "index": 0}]}],
               "chat_template_kwargs": {"tools": [{"type": "function", "function": {
                   "name": "get", "parameters": {"type": "object",
                   "properties": {"zeta": {"type": "string"}, "alpha": {"type": "integer"}},
                   "required": ["zeta"]}}}]}}"#,
        )
        .unwrap();
        let out = render(
            "{{ tools | tojson }}\n{{ messages[0].tool_calls | tojson }}",
            body,
        )
        .unwrap();
        assert_eq!(
            out,
            concat!(
                r#"[{"type": "function", "function": {"name": "get", "parameters": {"type": "#,
                r#""object", "properties": {"zeta": {"type": "string"}, "alpha": {"type": "#,
                r#""integer"}}, "required": ["zeta"]}}}]"#,
                "\n",
                // id, type, function {name, arguments} first (llama-server's message order),
                // then the rest as sent.
                r#"[{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "#,
                r#"{"zeta": 1, "alpha": {"y": 2, "b": 3}}, "strict": true}, "index": 0}]"#
            )
        );
    }

    #[test]
    fn model_template_with_python_methods() {
        let src =
            "{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'].strip() }}\
                   {% if not loop.last %}\n{% endif %}{% endfor %}\
                   {% if add_generation_prompt %}<|assistant|>{% endif %}";
        let t = ChatTemplate::new(Some(src), "<s>", "</s>").unwrap();
        let m = parse_messages(Some(&json!([{"role": "user", "content": "  hello  "}]))).unwrap();
        assert_eq!(t.render(&m).unwrap(), "<s><|user|>hello<|assistant|>");
    }

    #[test]
    fn generation_tags_render_their_body_with_their_whitespace_control() {
        // Hugging Face's training-mask markers, in both spellings of whitespace control.
        let src = "{% for m in messages %}[{{ m.role }}]\n\
                   {%- if m.role == 'assistant' %}  {%- generation -%}  {{ m.content }}  \
                   {%- endgeneration -%}  {% else %}{{ m.content }}{% endif %}|{% endfor %}\
                   {% generation %}{% endgeneration %}";
        let t = ChatTemplate::new(Some(src), "", "").unwrap();
        let m = parse_messages(Some(&json!([
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": "yo"}
        ])))
        .unwrap();
        assert_eq!(t.render(&m).unwrap(), "[user]hi|[assistant]yo|");
        assert_eq!(
            without_generation_tags("a{%- generation %}b{% endgeneration -%}c"),
            "a{%- if true %}b{% endif -%}c"
        );
    }

    #[test]
    fn an_undefined_value_has_length_zero_as_in_jinja2() {
        // `tools` is not passed: Jinja2 gives its length as 0, so templates test it this way.
        let src = "{% if tools is not none and tools|length > 0 %}TOOLS {% endif %}\
                   {{ messages|length }} {{ nothing|count }} {{ 'abc'|length }}";
        let t = ChatTemplate::new(Some(src), "", "").unwrap();
        let m = parse_messages(Some(&json!([{"role": "user", "content": "hi"}]))).unwrap();
        assert_eq!(t.render(&m).unwrap(), "1 0 3");
        // A value that has no length is still an error.
        let t = ChatTemplate::new(Some("{{ 5|length }}"), "", "").unwrap();
        assert!(t.render(&m).is_err());
    }

    /// `src` rendered for a one-message request with `kwargs` as its `chat_template_kwargs`.
    fn render_with_kwargs(src: &str, kwargs: Value) -> Result<String, ApiError> {
        let t = ChatTemplate::new(Some(src), "", "").unwrap();
        let body = json!({"messages": [{"role": "user", "content": "hi"}],
                          "chat_template_kwargs": kwargs});
        t.render_request(&request(body).unwrap())
    }

    /// Undefined values as llama-server's template engine takes them where jinja2 refuses:
    /// `+` of an undefined or null value and a string is the string, an attribute or item of an
    /// undefined value is undefined, its `items()`, `strip()`, `first`... are empty, as
    /// llama-server's undefined value has them (a method it lacks is an error). Other sums are
    /// as before (numbers, lists, strings), a string and a number are joined as text (as in
    /// llama-server; jinja2 refuses it), and those llama-server refuses (undefined beside a
    /// number, two undefined values) are errors.
    /// Random strings and numbers, through `chat_template_kwargs`.
    #[test]
    fn undefined_values_add_and_chain_as_in_llama_server() {
        let mut rng = crate::tools::test_util::Rng(0x7417_0ADD);
        let go = render_with_kwargs;
        for _ in 0..40 {
            let [a, b] = std::array::from_fn(|_| random_text(&mut rng));
            let (n, m) = (rng.below(1000) as i64 - 500, rng.below(1000) as i64);
            let kw = json!({"a": a, "b": b, "n": n, "m": m, "x": null, "l": [n], "k": [m]});
            for (src, want) in [
                ("{{ a + nothing + b }}", format!("{a}{b}")),
                (
                    "{{ nothing + a }}|{{ a + x }}|{{ x + b }}",
                    format!("{a}|{a}|{b}"),
                ),
                ("{{ a + nothing.deeper.still }}", a.clone()),
                ("{{ nothing[0].k ~ b }}", b.clone()),
                (
                    "{% if nothing.k %}no{% else %}{{ a }}{% endif %}",
                    a.clone(),
                ),
                ("{{ nothing|trim }}{{ b|upper }}", b.to_uppercase()),
                (
                    "{% for k, v in nothing.items() %}x{% endfor %}{{ nothing.strip() }}\
                     {{ nothing|first }}{{ nothing|last }}{{ nothing|items|length }}\
                     {{ nothing.upper() ~ a.strip() }}",
                    format!("0{a}"),
                ),
                (
                    "{{ [n, m]|first }} {{ [n, m]|last }} {{ b|first }}\
                     {% for k, v in {'z': n}|items %} {{ k }}{{ v }}{% endfor %}",
                    format!("{n} {m} {} z{n}", &b[..1]),
                ),
                (
                    "{{ n + m }} {{ (l + k)|tojson }} {{ a + b }}",
                    format!("{} [{n}, {m}] {a}{b}", n + m),
                ),
                ("{{ n + 0.5 }}", format!("{}", n as f64 + 0.5)),
                // llama-server joins a string and a number as text (jinja2 refuses it).
                ("{{ a + n }}|{{ m + b }}", format!("{a}{n}|{m}{b}")),
            ] {
                assert_eq!(go(src, kw.clone()).unwrap(), want, "{src} {kw}");
            }
            for src in [
                "{{ nothing.split() }}",
                "{{ nothing + n }}",
                "{{ n + x }}",
                "{{ nothing + nothing }}",
            ] {
                let e = go(src, kw.clone()).unwrap_err();
                assert_eq!(e.status, 400, "{src}");
                assert!(e.message.contains("chat template"), "{src}: {}", e.message);
            }
        }
        // A template's own refusal stays one, in a sum too.
        let e = go("{{ 'x' + raise_exception('no tools here') }}", json!({})).unwrap_err();
        assert!(e.message.contains("no tools here"), "{}", e.message);
    }

    /// A `+` in a `{% block %}` (whose instructions minijinja keeps apart from the template's)
    /// adds as one outside it does: an undefined or null operand beside a string is "", in
    /// nested blocks, in a block in a loop, in a macro called from a block. Random strings.
    #[test]
    fn plus_in_a_block_adds_as_outside_it() {
        let mut rng = crate::tools::test_util::Rng(0xB10C_0ADD);
        let go = render_with_kwargs;
        for _ in 0..20 {
            let [a, b] = std::array::from_fn(|_| random_text(&mut rng));
            let n = rng.below(1000) as i64 + 1;
            let kw = json!({"a": a, "b": b, "x": null, "n": n});
            for (src, want) in [
                ("{{ a + nothing + b }}", format!("{a}{b}")),
                (
                    "{% block m %}{{ a + nothing + b }}{% endblock %}",
                    format!("{a}{b}"),
                ),
                (
                    "{% block o %}[{% block i %}{{ x + a }}{% endblock %}]{% endblock %}",
                    format!("[{a}]"),
                ),
                (
                    "{% for k in [1, 2] %}{% block l %}{{ b + nothing.k }}{% endblock %}\
                     {% endfor %}",
                    format!("{b}{b}"),
                ),
                (
                    "{% macro m(v) %}{{ v + x }}{% endmacro %}\
                     {% block c %}{{ m(a) }}{{ n + 1 }}{% endblock %}",
                    format!("{a}{}", n + 1),
                ),
            ] {
                assert_eq!(go(src, kw.clone()).unwrap(), want, "{src} {kw}");
            }
        }
    }

    /// A request's `chat_template_kwargs` are the template's variables, whatever their names,
    /// and none replaces `+`: `__muser_add` is a variable like any other, and one named as the
    /// function `+` calls (`ADD`, a name no template can write, so none can read it) is not
    /// given to the template (random values).
    #[test]
    fn a_request_variable_does_not_replace_plus() {
        let mut rng = crate::tools::test_util::Rng(0x0ADD_C0DE);
        let t = ChatTemplate::new(
            Some("{{ a + b }}|{{ n + m }}|{{ a + nothing }}|{{ __muser_add }}"),
            "",
            "",
        )
        .unwrap();
        for _ in 0..20 {
            let [a, b] = std::array::from_fn(|_| random_text(&mut rng));
            let (n, m, v) = (
                rng.below(1000) as i64,
                rng.below(1000) as i64,
                rng.below(99),
            );
            for name in ["__muser_add", ADD] {
                let kw = json!({"a": a, "b": b, "n": n, "m": m, name: v});
                let body = json!({"messages": [{"role": "user", "content": "hi"}],
                                  "chat_template_kwargs": kw});
                let got = t.render_request(&request(body).unwrap()).unwrap();
                let shown = if name == "__muser_add" {
                    v.to_string()
                } else {
                    String::new()
                };
                assert_eq!(got, format!("{a}{b}|{}|{a}|{shown}", n + m), "{kw}");
            }
        }
    }

    /// FireFunction v2's template adds `functions`, which no request defines, to its system
    /// prompt: it renders (as llama-server renders it: the undefined value as ""), with and
    /// without tools, the date llama-server gives it, and random messages.
    #[test]
    fn firefunction_v2_renders_without_functions() {
        let Some(t) = real("fireworks-ai-llama-3-firefunction-v2.jinja") else {
            return;
        };
        let mut rng = crate::tools::test_util::Rng(0x7417_0F2F);
        for round in 0..10 {
            let [s, q] = std::array::from_fn(|_| random_text(&mut rng));
            let mut req = request(json!({"messages": [{"role": "system", "content": s},
                                                      {"role": "user", "content": q}]}))
            .unwrap();
            req.add_dates(&chrono::Utc::now());
            if round % 2 == 1 {
                req.tools = Some(json!([{"type": "function", "function": {"name": "f",
                    "parameters": {"type": "object", "properties": {}}}}]));
            }
            let p = t.render_request(&req).unwrap();
            let day = req.kwargs["datetime"].as_str().unwrap();
            let want = format!("Available functions as JSON spec:\n\nToday is {day}.<|eot_id|>");
            assert!(p.contains(&want), "{p}");
            assert!(p.contains(&s) && p.contains(&q), "{p}");
            assert!(
                p.ends_with("<|start_header_id|>assistant<|end_header_id|>\n\n"),
                "{p}"
            );
        }
    }

    #[test]
    fn raise_exception_is_a_400() {
        let t = ChatTemplate::new(
            Some("{{ raise_exception('roles must alternate') }}"),
            "",
            "",
        )
        .unwrap();
        let e = t.render(&[]).unwrap_err();
        assert_eq!(e.status, 400);
        assert!(e.message.contains("roles must alternate"), "{}", e.message);
    }

    #[test]
    fn a_runaway_template_stops_with_an_error_and_long_chats_still_render() {
        let t = ChatTemplate::new(
            Some(
                "{% for i in range(100000) %}{% for j in range(100000) %}x{% endfor %}{% endfor %}",
            ),
            "",
            "",
        )
        .unwrap();
        let e = t.render(&[]).unwrap_err();
        assert_eq!(e.status, 500);
        assert!(e.message.contains("ran past"), "{}", e.message);
        // A ChatML template (Qwen's shape) over 2,000 messages renders whole under the budget.
        let chatml = "{% for message in messages %}{% if loop.first and messages[0]['role'] != \
                      'system' %}{{ '<|im_start|>system\nYou are helpful.<|im_end|>\n' }}{% endif %}\
                      {{ '<|im_start|>' + message['role'] + '\n' + message['content'] + \
                      '<|im_end|>' + '\n' }}{% endfor %}{% if add_generation_prompt %}\
                      {{ '<|im_start|>assistant\n' }}{% endif %}";
        let t = ChatTemplate::new(Some(chatml), "", "").unwrap();
        let msgs: Vec<Value> = (0..2000)
            .map(|i| {
                let role = if i % 2 == 0 { "user" } else { "assistant" };
                json!({"role": role, "content": format!("message {i}")})
            })
            .collect();
        let out = t
            .render(&parse_messages(Some(&Value::Array(msgs))).unwrap())
            .unwrap();
        assert!(out.starts_with("<|im_start|>system\nYou are helpful.<|im_end|>\n"));
        assert!(out.ends_with("message 1999<|im_end|>\n<|im_start|>assistant\n"));
        assert_eq!(out.matches("<|im_start|>").count(), 2002);
    }

    /// A template that writes calls only under a null content (DeepSeek R1 Distill Llama's
    /// shape) gets null for a message with calls and no text; one that writes them beside any
    /// content keeps "" (llama.cpp's null-to-empty), and text stays text.
    #[test]
    fn calls_reach_templates_that_test_for_null_content() {
        let r1 = "{% for m in messages %}{% if m.role == 'assistant' and m.content is none %}\
                  {% for c in m.tool_calls %}CALL {{ c.function.name }};{% endfor %}\
                  {% else %}{{ m.role }}: {{ m.content }};{% endif %}{% endfor %}";
        let any = "{% for m in messages %}{{ m.role }}: {{ m.content }}\
                   {% for c in m.tool_calls or [] %} CALL {{ c.function.name }}{% endfor %};\
                   {% endfor %}";
        let conv = |content: Value| {
            parse_messages(Some(&json!([
                {"role": "user", "content": "hi"},
                {"role": "assistant", "content": content, "tool_calls": [{"id": "c1",
                    "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
                {"role": "tool", "tool_call_id": "c1", "content": "42"},
            ])))
            .unwrap()
        };
        let t = ChatTemplate::new(Some(r1), "", "").unwrap();
        assert!(t.null_call_content);
        for c in [Value::Null, json!("")] {
            let out = t.render(&conv(c)).unwrap();
            assert_eq!(out, "user: hi;CALL f;tool: 42;");
        }
        // A message with text keeps it (the template writes the text, not the calls).
        let out = t.render(&conv(json!("ok"))).unwrap();
        assert_eq!(out, "user: hi;assistant: ok;tool: 42;");
        let t = ChatTemplate::new(Some(any), "", "").unwrap();
        assert!(!t.null_call_content);
        let out = t.render(&conv(Value::Null)).unwrap();
        assert_eq!(out, "user: hi;assistant:  CALL f;tool: 42;");
    }

    /// A random float and the text llama-server writes for it printed (`{{ x }}`, C's `%f`
    /// trimmed) and as JSON (`tojson`, `|string`: C's `%g`), where that text is the number,
    /// else Python's `repr` (Muser's rule, `text`): eighths (exact in both: `-12.375`, and
    /// `3` for 3.0 as JSON), long fractions (`%f` and `%g` round them: Python's), tiny
    /// (`%f` writes `0.0`: Python's `3e-09`; `%g` writes it), millions (`%g`: `1.2e+08`).
    /// The expected texts are built from the digits, not by the code under test.
    fn random_float(rng: &mut crate::tools::test_util::Rng) -> (f64, String, String) {
        match rng.below(4) {
            0 => {
                let k = rng.below(16000) as i64 - 8000;
                let frac = ["0", "125", "25", "375", "5", "625", "75", "875"];
                let sign = if k < 0 { "-" } else { "" };
                let (q, r) = (k.abs() / 8, (k.abs() % 8) as usize);
                let printed = format!("{sign}{q}.{}", frac[r]);
                let json = if r == 0 {
                    format!("{sign}{q}")
                } else {
                    printed.clone()
                };
                (k as f64 / 8.0, printed, json)
            }
            1 => {
                let n = 100_000_000 + rng.next() % 900_000_000 / 10 * 10 + 1 + rng.below(9) as u64;
                let x = n as f64 / 10f64.powi(rng.below(5) as i32 + 7);
                // Python's repr, in this range, is the shortest digits without an exponent.
                (x, x.to_string(), x.to_string())
            }
            2 => {
                let text = format!("{}e-{:02}", rng.below(9) + 1, rng.below(6) + 7);
                (text.parse().unwrap(), text.clone(), text)
            }
            _ => {
                let m = rng.below(999) + 1;
                let digits = m.to_string();
                let mantissa = digits.trim_end_matches('0');
                let mantissa = if mantissa.len() > 1 {
                    format!("{}.{}", &mantissa[..1], &mantissa[1..])
                } else {
                    mantissa.to_string()
                };
                let json = format!("{mantissa}e+{:02}", 6 + digits.len() - 1);
                (m as f64 * 1e6, format!("{m}000000.0"), json)
            }
        }
    }

    /// Floats from a request (`chat_template_kwargs`, and a tool call's arguments in the
    /// history) print, join and turn into JSON as llama-server writes them where its text is
    /// the number, and as Python where llama-server's would change it (a choice: llama-server
    /// writes 3.14159265 as `3.141593` printed and `3.14159` as JSON, 1e-07 printed as `0.0`;
    /// Muser never shows the model another number than the request's). Random floats of each
    /// kind; every text reads back as the number.
    #[test]
    fn floats_are_written_as_llama_server_writes_them_where_it_keeps_them() {
        let mut rng = crate::tools::test_util::Rng(0xF10A_7E57);
        let calls = "{% for m in messages %}{% for c in m.tool_calls or [] %}\
                     {% for k, v in c.function.arguments.items() %}{{ k }}={{ v }}|{{ v|tojson }}|\
                     {{ v|string }};{% endfor %}{% endfor %}{% endfor %}";
        let t = ChatTemplate::new(Some(calls), "", "").unwrap();
        assert!(t.object_arguments);
        for _ in 0..300 {
            let (x, printed, json) = random_float(&mut rng);
            assert_eq!(printed.parse::<f64>().unwrap(), x, "{printed}");
            assert_eq!(json.parse::<f64>().unwrap(), x, "{json}");
            let a = random_text(&mut rng);
            let got = render_with_kwargs(
                "{{ x }}#{{ x|string }}#{{ x|tojson }}#{{ a + x }}#{{ x ~ a }}#{{ [x]|string }}\
                 #{{ {'k': x} }}#{{ [x, x]|tojson }}#{{ '{}'.format(x) }}",
                json!({"x": x, "a": a}),
            )
            .unwrap();
            let want = format!(
                "{printed}#{json}#{json}#{a}{printed}#{printed}{a}#[{printed}]#{{'k': {printed}}}\
                 #[{json}, {json}]#{printed}"
            );
            assert_eq!(got, want, "{x:e}");
            // In a call's arguments (a JSON string the template reads as an object).
            let args = serde_json::to_string(&json!({"x": x})).unwrap();
            let body = json!({"messages": [{"role": "user", "content": "hi"},
                {"role": "assistant", "content": null, "tool_calls": [{"id": "c1",
                 "type": "function", "function": {"name": "f", "arguments": args}}]},
                {"role": "tool", "tool_call_id": "c1", "content": "ok"}]});
            let got = render_body(&t, body).unwrap();
            assert_eq!(got, format!("x={printed}|{json}|{json};"), "{args}");
        }
    }

    /// A value's text in a list or mapping (`|string`, or printed), as both engines write it
    /// (Python's `repr`: `None`, `True`, `[..]`, `{..}`) with strings quoted as llama-server
    /// quotes them: `'…'` as they are, or a JSON string where they hold a `'` (jinja2 would
    /// escape a newline in the first). Values measured through llama-server, and random nested
    /// values from the request against a model of that text (strings quoted by serde_json).
    #[test]
    fn lists_and_mappings_are_written_as_pythons_repr() {
        let go = render_with_kwargs;
        let kw = json!({"l": [1, 2.0, null, "a", true],
                        "d": {"a": 1.5, "b": null, "c": [2.0, "it's"]},
                        "ws": ["a\nb", "it's", "q\"x", "both'\"", "back\\s", "é😀\t"]});
        // llama-server's `|string` of each (b0.3.36); printing a list or mapping, which
        // llama-server writes as its items run together or nothing, writes the same.
        for (src, want) in [
            ("{{ l|string }}", "[1, 2.0, None, 'a', True]"),
            (
                "{{ d|string }}",
                "{'a': 1.5, 'b': None, 'c': [2.0, \"it's\"]}",
            ),
            (
                "{{ ws|string }}",
                "['a\nb', \"it's\", 'q\"x', \"both'\\\"\", 'back\\s', 'é😀\t']",
            ),
            (
                "{{ [[1, 'a'], {'k': none}]|string }}",
                "[[1, 'a'], {'k': None}]",
            ),
            (
                "{{ l }}|{{ d }}",
                "[1, 2.0, None, 'a', True]|{'a': 1.5, 'b': None, 'c': [2.0, \"it's\"]}",
            ),
            ("{{ 'a' + l }}", "a[1, 2.0, None, 'a', True]"),
            ("{{ [] }}{{ {} }}{{ d.keys()|list }}", "[]{}['a', 'b', 'c']"),
        ] {
            assert_eq!(go(src, kw.clone()).unwrap(), want, "{src}");
        }
        fn quoted(s: &str) -> String {
            if s.contains('\'') {
                serde_json::to_string(s).unwrap()
            } else {
                format!("'{s}'")
            }
        }
        fn model(v: &Value, floats: &std::collections::HashMap<String, String>) -> String {
            match v {
                Value::Null => "None".into(),
                Value::Bool(b) => (if *b { "True" } else { "False" }).into(),
                Value::Number(n) if n.is_f64() => floats[&n.to_string()].clone(),
                Value::Number(n) => n.to_string(),
                Value::String(s) => quoted(s),
                Value::Array(a) => {
                    let items: Vec<String> = a.iter().map(|v| model(v, floats)).collect();
                    format!("[{}]", items.join(", "))
                }
                Value::Object(o) => {
                    let items: Vec<String> = o
                        .iter()
                        .map(|(k, v)| format!("{}: {}", quoted(k), model(v, floats)))
                        .collect();
                    format!("{{{}}}", items.join(", "))
                }
            }
        }
        fn random_value(
            rng: &mut crate::tools::test_util::Rng,
            depth: usize,
            floats: &mut std::collections::HashMap<String, String>,
        ) -> Value {
            match rng.below(if depth > 2 { 5 } else { 7 }) {
                0 => Value::Null,
                1 => json!(rng.coin()),
                2 => json!(rng.below(2000) as i64 - 1000),
                3 => {
                    let (x, printed, _) = random_float(rng);
                    let v = json!(x);
                    floats.insert(v.to_string(), printed);
                    v
                }
                4 => {
                    let q = ["", "'", "\"", "\\", "'\"", "\u{1}"][rng.below(6)];
                    json!(format!("{}{q}{}", random_text(rng), random_text(rng)))
                }
                5 => Value::Array(
                    (0..rng.below(4))
                        .map(|_| random_value(rng, depth + 1, floats))
                        .collect(),
                ),
                _ => Value::Object(
                    (0..rng.below(4))
                        .map(|i| {
                            (
                                format!("{}{i}", random_text(rng)),
                                random_value(rng, depth + 1, floats),
                            )
                        })
                        .collect(),
                ),
            }
        }
        let mut rng = crate::tools::test_util::Rng(0x5E3D_0555);
        for _ in 0..200 {
            let mut floats = std::collections::HashMap::new();
            let v = Value::Array(
                (0..rng.below(4) + 1)
                    .map(|_| random_value(&mut rng, 0, &mut floats))
                    .collect(),
            );
            let want = model(&v, &floats);
            assert_eq!(go("{{ v|string }}", json!({ "v": v })).unwrap(), want);
            assert_eq!(go("{{ v }}", json!({ "v": v })).unwrap(), want);
        }
    }

    /// None (a null from the request, `none`) as llama-server takes it: printed or joined with
    /// `~` it is "" (a choice: jinja2 writes `None`; llama-server writes nothing for a null
    /// field), `|string` is `None` (both), `default` replaces it (llama-server's; jinja2 keeps
    /// it), its `items()` and `|items` are empty (llama-server's; jinja2 refuses them), and a
    /// message's null content is "" whatever its role (llama-server's; the request is not
    /// refused). Random strings.
    #[test]
    fn none_is_taken_as_in_llama_server() {
        let mut rng = crate::tools::test_util::Rng(0x0000_90DE);
        for _ in 0..30 {
            let a = random_text(&mut rng);
            let got = render_with_kwargs(
                "[{{ n }}][{{ n ~ a }}][{{ a ~ n }}][{{ n|string }}][{{ [n, a]|string }}]\
                 [{{ n|default(a) }}][{{ n|default(a, true) }}][{{ nothing|default(a) }}]\
                 [{% for k, v in n.items() %}x{% endfor %}{{ n|items|length }}]\
                 [{{ a + n }}][{{ {'k': n}.get('k') }}]",
                json!({"n": null, "a": a}),
            )
            .unwrap();
            assert_eq!(
                got,
                format!("[][{a}][{a}][None][[None, '{a}']][{a}][{a}][{a}][0][{a}][]")
            );
            let body = json!({"messages": [{"role": "system", "content": null},
                {"role": "user", "content": null}, {"role": "tool", "tool_call_id": "c",
                "content": null}, {"role": "user", "content": a}]});
            let src = "{% for m in messages %}{{ m.role }}:{{ m.content }}|{% endfor %}";
            assert_eq!(
                render(src, body).unwrap(),
                format!("system:|user:|tool:|user:{a}|")
            );
        }
        // A missing content is still refused, as llama-server refuses it.
        let e = parse_messages(Some(&json!([{"role": "user"}]))).unwrap_err();
        assert!(e.message.contains("content"), "{}", e.message);
    }

    /// A list's `sort()` and `reverse()` as llama-server's (its filters): a new list, sorted
    /// (by `attribute`, `reverse=true`) or reversed, which the template can change; the list
    /// itself is left as it was (a choice: Python sorts in place and gives None; jinja2's
    /// sandbox, transformers', refuses both). Random lists from the request, and lists the
    /// template writes.
    #[test]
    fn list_sort_and_reverse_are_llama_servers() {
        let mut rng = crate::tools::test_util::Rng(0x5027_11A7);
        for _ in 0..40 {
            let l: Vec<i64> = (0..rng.below(6) + 1)
                .map(|_| rng.below(100) as i64 - 50)
                .collect();
            let mut sorted = l.clone();
            sorted.sort();
            let mut down = sorted.clone();
            down.reverse();
            let reversed: Vec<i64> = l.iter().rev().cloned().collect();
            let objs: Vec<Value> = l.iter().map(|k| json!({ "t": k })).collect();
            let by_t: Vec<Value> = sorted.iter().map(|k| json!({ "t": k })).collect();
            let got = render_with_kwargs(
                "{% set u = l.sort() %}{% set _ = u.append(1000) %}{{ u|tojson }}|{{ l|tojson }}|\
                 {{ l.sort(reverse=true)|tojson }}|{{ l.reverse()|tojson }}|\
                 {{ o.sort(attribute='t')|tojson }}|{% set w = l|list %}\
                 {{ w.sort()|tojson }}{{ w.reverse()|tojson }}{{ w|tojson }}",
                json!({"l": l, "o": objs}),
            )
            .unwrap();
            let mut appended = sorted.clone();
            appended.push(1000);
            // (Python's `json.dumps` of lists of integers and of `{"t": k}`)
            let j = |v: Value| {
                serde_json::to_string(&v)
                    .unwrap()
                    .replace(',', ", ")
                    .replace(':', ": ")
            };
            let want = format!(
                "{}|{}|{}|{}|{}|{}{}{}",
                j(json!(appended)),
                j(json!(l)),
                j(json!(down)),
                j(json!(reversed)),
                j(json!(by_t)),
                j(json!(sorted)),
                j(json!(reversed)),
                j(json!(l))
            );
            assert_eq!(got, want);
        }
    }

    /// String methods and filters minijinja lacks, as Python and llama-server have them:
    /// `rsplit` (random strings against a model of Python's), `format` with plain fields
    /// (floats as they print), `int` and `float` of text that is no number (the default, 0),
    /// `wordcount`, the test `callable`.
    #[test]
    fn python_methods_and_filters_minijinja_lacks() {
        let mut rng = crate::tools::test_util::Rng(0x0025_9117);
        for _ in 0..60 {
            let s: String = (0..rng.below(12))
                .map(|_| ["a", "b", ",", " ", ",,"][rng.below(5)])
                .collect();
            let max = rng.below(4) as i64 - 1;
            // Python: `s.split(',')`, the first parts joined back where `max` limits it.
            let all: Vec<&str> = s.split(',').collect();
            let want: Vec<String> = match usize::try_from(max) {
                Ok(m) if all.len() > m + 1 => std::iter::once(all[..all.len() - m].join(","))
                    .chain(all[all.len() - m..].iter().map(|p| p.to_string()))
                    .collect(),
                _ => all.iter().map(|p| p.to_string()).collect(),
            };
            let got = render_with_kwargs(
                "{{ s.rsplit(',', m)|join('|') }}#{{ s.rsplit(',', m)|length }}#\
                 {{ s.rsplit()|join('|') }}#{{ s.rsplit()|length }}",
                json!({"s": s, "m": max}),
            )
            .unwrap();
            let words: Vec<&str> = s.split_whitespace().collect();
            let want = format!(
                "{}#{}#{}#{}",
                want.join("|"),
                want.len(),
                words.join("|"),
                words.len()
            );
            assert_eq!(got, want, "{s:?} {max}");
        }
        for (src, want) in [
            ("{{ '  a b  c  '.rsplit(none, 1)|tojson }}", r#"["  a b", "c"]"#),
            ("{{ 'a,b,c'.rsplit(',', 1)|tojson }}", r#"["a,b", "c"]"#),
            ("{{ '{}-{}|{1}{0}|{{}}'.format(2.0, none) }}", "2.0-None|None2.0|{}"),
            ("{{ '{:>4}'.format('a') }}", "   a"),
            ("{{ 'x'|int }}|{{ 'x'|int(7) }}|{{ '3'|int }}|{{ 2.5|int }}|{{ 'q'|float }}|{{ '2.5'|float }}", "0|7|3|2|0.0|2.5"),
            ("{{ 'a b_c, d'|wordcount }}", "3"),
            (
                "{{ [2.0, 1e-07, none, 'a', [1]]|join(',') }}|{{ 'ab'|join('-') }}|{{ nothing|join }}",
                "2.0,1e-07,None,a,[1]|a-b|",
            ),
            ("{{ raise_exception is callable }}|{{ 'a' is callable }}", "True|False"),
        ] {
            assert_eq!(render_with_kwargs(src, json!({})).unwrap(), want, "{src}");
        }
    }

    /// A template that writes a call's whole arguments as text (Functionary v3.2's
    /// `'\n' + arguments`, `{{ arguments }}`) gets the request's JSON string, as llama.cpp gives
    /// it (its probe counts only a read into the arguments); one that reads an item gets the
    /// object. Random arguments with floats, through each.
    #[test]
    fn arguments_written_whole_stay_the_requests_string() {
        let mut rng = crate::tools::test_util::Rng(0xA2C5_7E47);
        let whole = [
            "{% for m in messages %}{% for c in m.tool_calls or [] %}\
             {{ '>>>' + c.function.name + '\n' + c.function.arguments }}{% endfor %}{% endfor %}",
            "{% for m in messages %}{% for c in m.tool_calls or [] %}\
             >>>{{ c.function.name }}\n{{ c.function.arguments }}{% endfor %}{% endfor %}",
        ];
        let item = "{% for m in messages %}{% for c in m.tool_calls or [] %}\
                    >>>{{ c.function.name }}\n{% for k, v in c.function.arguments.items() %}\
                    {{ k }}={{ v }};{% endfor %}{% endfor %}{% endfor %}";
        for _ in 0..20 {
            let (x, printed, _) = random_float(&mut rng);
            let a = random_text(&mut rng);
            let args = serde_json::to_string(&json!({"x": x, "a": a, "n": null})).unwrap();
            let body = json!({"messages": [{"role": "user", "content": "hi"},
                {"role": "assistant", "content": null, "tool_calls": [{"id": "c1",
                 "type": "function", "function": {"name": "f", "arguments": args}}]},
                {"role": "user", "content": "ok"}]});
            for src in whole {
                let t = ChatTemplate::new(Some(src), "", "").unwrap();
                assert!(!t.object_arguments, "{src}");
                assert_eq!(
                    render_body(&t, body.clone()).unwrap(),
                    format!(">>>f\n{args}")
                );
            }
            let t = ChatTemplate::new(Some(item), "", "").unwrap();
            assert!(t.object_arguments);
            // (None printed as "", llama-server's)
            assert_eq!(
                render_body(&t, body).unwrap(),
                format!(">>>f\nx={printed};a={a};n=;")
            );
        }
    }

    #[test]
    fn bad_messages() {
        for (v, what) in [
            (json!("hi"), "must be an array"),
            (json!([]), "must not be empty"),
            (json!([{"role": "user"}]), "content"),
            (json!([{"role": "robot", "content": "x"}]), "robot"),
            (
                json!([{"role": 3, "content": "x"}]),
                "role must be a string",
            ),
            (
                json!([{"role": "user", "content": [{"type": "image_url"}]}]),
                "only text",
            ),
        ] {
            let e = parse_messages(Some(&v)).unwrap_err();
            assert!(e.message.contains(what), "{v}: {}", e.message);
        }
        assert!(parse_messages(None).is_err());
        assert!(ChatTemplate::new(Some("{% for %}"), "", "").is_err());
    }
}
