//! Chat messages to a prompt: the GGUF's `tokenizer.chat_template` (a Hugging Face Jinja
//! template) rendered with minijinja and Python-compatible string methods, or a plain
//! "Role: text" template when the file has none.

use crate::error::ApiError;
use minijinja::{context, Environment, Error, ErrorKind};
use serde_json::Value;

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
    bos: String,
    eos: String,
}

impl ChatTemplate {
    /// Compiles `source` (None: the fallback). A template minijinja cannot parse is an error
    /// naming the line.
    pub fn new(source: Option<&str>, bos: &str, eos: &str) -> anyhow::Result<ChatTemplate> {
        let mut env = Environment::new();
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", |msg: String| -> Result<String, Error> {
            Err(Error::new(ErrorKind::InvalidOperation, msg))
        });
        env.add_function("strftime_now", |_fmt: String| -> String {
            // Templates use it for a "today is" line; a fixed date keeps prompts reproducible.
            "01 Jan 2026".to_string()
        });
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
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_fuel(Some(TEMPLATE_FUEL));
        let source = source.map_or_else(|| FALLBACK_TEMPLATE.to_string(), without_generation_tags);
        env.add_template_owned("chat", source)
            .map_err(|e| anyhow::anyhow!("the chat template does not parse: {e:#}"))?;
        Ok(ChatTemplate {
            env,
            bos: bos.to_string(),
            eos: eos.to_string(),
        })
    }

    /// The prompt text for `messages`, ending where the assistant's reply begins.
    pub fn render(&self, messages: &[Value]) -> Result<String, ApiError> {
        let tmpl = self
            .env
            .get_template("chat")
            .map_err(|e| ApiError::internal(format!("chat template: {e}")))?;
        tmpl.render(context! {
            messages => messages,
            add_generation_prompt => true,
            bos_token => &self.bos,
            eos_token => &self.eos,
        })
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

/// Checks `messages` (a non-empty array of {role, content}) and returns them with content
/// flattened to a string (text parts joined), the form templates expect.
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
            None | Some(Value::Null) if role == "assistant" => String::new(),
            Some(Value::Array(parts)) => {
                let mut text = String::new();
                for (j, p) in parts.iter().enumerate() {
                    match (p.get("type").and_then(Value::as_str), p.get("text")) {
                        (Some("text"), Some(Value::String(t))) => text.push_str(t),
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
                text
            }
            _ => {
                return Err(param(format!(
                    "messages[{i}].content must be a string or an array of text parts"
                )))
            }
        };
        out.push(serde_json::json!({ "role": role, "content": content }));
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
        assert_eq!(
            t.render(&m).unwrap(),
            "System: Be brief.\nUser: Hi!\nAssistant:"
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
