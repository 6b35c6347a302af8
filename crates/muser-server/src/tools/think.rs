//! Reasoning in `<think>` tags (DeepSeek R1, Qwen 3, QwQ and the templates that write them):
//! split from the reply as llama-server's default `reasoning_format` splits it, into
//! `reasoning_content`, before the reply goes to its tool-call format.
//!
//! The reasoning is the text of a `<think>` block at the start of the output (after optional
//! whitespace), or, when the prompt itself ends inside an opened block (a template that writes
//! `<think>` in its generation prompt), the output up to `</think>`. An output whose block never
//! closes is all reasoning. The reply after the block starts at its first non-whitespace
//! character.

pub const OPEN: &str = "<think>";
pub const CLOSE: &str = "</think>";

/// Whether a chat template writes reasoning in `<think>` tags.
pub fn template_thinks(template: &str) -> bool {
    template.contains(OPEN) && template.contains(CLOSE)
}

/// Whether a rendered prompt leaves its output inside an opened `<think>` block.
pub fn prompt_opens(prompt: &str) -> bool {
    let p = prompt.trim_end();
    p.ends_with(OPEN)
}

/// Whether the prompt ends with a closed, empty-or-not block (`<think></think>`: Qwen 3 with
/// `enable_thinking` false, DeepSeek V3.1's non-thinking mode): the reply comes without
/// reasoning, and none is read or allowed.
pub fn prompt_closes(prompt: &str) -> bool {
    prompt.trim_end().ends_with(CLOSE)
}

/// A finished output: its reasoning (None when it has no block) and the reply after it.
pub fn split(text: &str, opened: bool) -> (Option<String>, &str) {
    let Some(body) = body_start(text, opened) else {
        return (None, text);
    };
    match body.find(CLOSE) {
        Some(end) => (
            Some(body[..end].to_string()),
            body[end + CLOSE.len()..].trim_start(),
        ),
        None => (Some(body.to_string()), ""),
    }
}

/// An unfinished output: the reasoning so far (less a tail that may be the start of `</think>`),
/// and the reply after the block once the block is closed (None while it is open or while the
/// text may still become a block). Both are prefixes of what `split` gives for every
/// continuation of `text`.
pub fn split_partial(text: &str, opened: bool) -> (Option<String>, Option<&str>) {
    if !opened {
        let t = text.trim_start();
        if t.len() < OPEN.len() && OPEN.starts_with(t) {
            // Nothing yet, or the start of a block: wait.
            return (None, None);
        }
    }
    let Some(body) = body_start(text, opened) else {
        return (None, Some(text));
    };
    match body.find(CLOSE) {
        Some(end) => {
            let rest = body[end + CLOSE.len()..].trim_start();
            (Some(body[..end].to_string()), Some(rest))
        }
        None => {
            let held = (1..CLOSE.len())
                .rev()
                .find(|&n| body.ends_with(&CLOSE[..n]))
                .unwrap_or(0);
            (Some(body[..body.len() - held].to_string()), None)
        }
    }
}

/// Where the reasoning starts: at once when the prompt opened the block, after `<think>` when
/// the output starts with one (after whitespace), else nowhere.
fn body_start(text: &str, opened: bool) -> Option<&str> {
    if opened {
        return Some(text);
    }
    text.trim_start().strip_prefix(OPEN)
}

#[cfg(test)]
mod tests {
    use super::super::test_util::{prefixes, Rng};
    use super::*;

    #[test]
    fn blocks_split_from_the_reply() {
        assert_eq!(
            split("<think>a b</think>\n\nHi", false),
            (Some("a b".into()), "Hi")
        );
        assert_eq!(split("  <think>x</think>", false), (Some("x".into()), ""));
        assert_eq!(
            split("Hi <think>x</think>", false),
            (None, "Hi <think>x</think>")
        );
        assert_eq!(
            split("<think>never closed", false),
            (Some("never closed".into()), "")
        );
        assert_eq!(
            split("reasons</think> reply", true),
            (Some("reasons".into()), "reply")
        );
        assert_eq!(split("no close", true), (Some("no close".into()), ""));
        assert_eq!(split("", false), (None, ""));
        assert!(prompt_opens("<|im_start|>assistant\n<think>\n"));
        assert!(!prompt_opens("<think>\n\n</think>\n\n"));
        assert!(template_thinks("{{ '<think>' }}...{{ '</think>' }}"));
        assert!(!template_thinks("<tool_call>"));
    }

    #[test]
    fn partial_splits_are_prefixes_of_the_final_split() {
        // Random outputs from fragments near the tags; for every prefix, the partial reasoning
        // is a prefix of the final one, and so is the partial reply once there is one.
        let frags = [
            "<think>",
            "</think>",
            "<",
            "</",
            "</th",
            "<th",
            "a",
            " ",
            "\n",
            "é",
            "think>",
            "reply",
            "<tool_call>",
        ];
        let mut rng = Rng(0x7417_2026);
        let (mut with_reasoning, mut with_reply) = (0, 0);
        for _ in 0..4000 {
            let n = 1 + rng.below(9);
            let text: String = (0..n).map(|_| frags[rng.below(frags.len())]).collect();
            for opened in [false, true] {
                let (r, rest) = split(&text, opened);
                with_reasoning += r.as_ref().is_some_and(|r| !r.is_empty()) as usize;
                with_reply += !rest.is_empty() as usize;
                for p in prefixes(&text) {
                    let (pr, prest) = split_partial(p, opened);
                    if let Some(pr) = &pr {
                        let r = r.as_deref().unwrap_or_else(|| {
                            panic!("{text:?} (opened {opened}): prefix {p:?} has reasoning {pr:?}")
                        });
                        assert!(r.starts_with(pr.as_str()), "{text:?} {p:?}: {pr:?} / {r:?}");
                    }
                    if let Some(prest) = prest {
                        assert!(
                            rest.starts_with(prest),
                            "{text:?} {p:?}: {prest:?} / {rest:?}"
                        );
                    }
                }
            }
        }
        assert!(
            with_reasoning > 500 && with_reply > 500,
            "{with_reasoning} {with_reply}"
        );
    }
}

/// A trigger pattern (for `Trigger::Pattern`, fancy-regex) that finds a call's opening `start`
/// (its capture group) only after the reasoning block: after `</think>` when the prompt opened
/// the block, after the block when the output starts with one, at the reply's start otherwise
/// (anywhere in the reply for a `Word`, after whitespace for a `ReplyStart`). A tool call's lazy
/// grammar then never starts inside the reasoning.
pub fn after_block(start: LazyStart, opened: bool) -> String {
    // What may come between the block (or the reply's start) and the call's opening.
    let (gap, call) = match start {
        LazyStart::Word(w) => (r"[\s\S]*?", fancy_regex::escape(w).into_owned()),
        LazyStart::ReplyStart(re) => (r"\s*", re.to_string()),
    };
    // The block ends at its first `</think>`, as `split` reads it.
    let body = r"(?:(?!</think>)[\s\S])*";
    if opened {
        format!(r"^{body}</think>{gap}({call})")
    } else {
        format!(r"^(?:\s*<think>{body}</think>|(?!\s*<think>)){gap}({call})")
    }
}

use super::LazyStart;

#[cfg(test)]
mod trigger_tests {
    use super::*;

    #[test]
    fn a_call_trigger_waits_for_the_end_of_the_reasoning() {
        let word = LazyStart::Word("<tool_call>");
        let at = |text: &str, opened: bool| -> Option<usize> {
            let re = fancy_regex::Regex::new(&after_block(word, opened)).unwrap();
            re.captures(text)
                .unwrap()
                .map(|c| c.get(1).unwrap().start())
        };
        // Not opened by the prompt.
        assert_eq!(at("<tool_call>", false), Some(0));
        assert_eq!(at("Sure. <tool_call>", false), Some(6));
        assert_eq!(at("<think>use <tool_call>", false), None);
        assert_eq!(at("<think>use <tool_call></think>", false), None);
        assert_eq!(
            at("<think>a <tool_call> b</think>\n<tool_call>", false),
            Some(31)
        );
        assert_eq!(at(" <think>x</think><tool_call>", false), Some(17));
        assert_eq!(at("<thi", false), None);
        // Opened by the prompt: only after </think>.
        assert_eq!(at("<tool_call>", true), None);
        assert_eq!(at("a <tool_call> b</think> <tool_call>", true), Some(24));
        assert_eq!(at("</think><tool_call>", true), Some(8));
        // A call that must open the reply: right after the block and whitespace, or at the
        // reply's start, never later.
        let start = LazyStart::ReplyStart(r"\{");
        let at = |text: &str, opened: bool| -> Option<usize> {
            let re = fancy_regex::Regex::new(&after_block(start, opened)).unwrap();
            re.captures(text)
                .unwrap()
                .map(|c| c.get(1).unwrap().start())
        };
        assert_eq!(at("{", false), Some(0));
        assert_eq!(at(" \n{", false), Some(2));
        assert_eq!(at("Sure: {", false), None);
        assert_eq!(at("<think>{</think>{", false), Some(16));
        assert_eq!(at("<think>{</think> ok {", false), None);
        assert_eq!(at("{ </think>\n{", true), Some(11));
        assert_eq!(at("{", true), None);
        // The block ends at its first `</think>` (as `split` reads it): a call must follow
        // that one.
        assert_eq!(at("<think>a</think> b </think>{", false), None);
        assert_eq!(at("a</think> b </think>{", true), None);
        assert_eq!(at("a</think>\n{ </think>{", true), Some(10));
    }
}

/// A forced call grammar (`root`, from the start of the output) with room for the reasoning
/// block first: when the prompt opened it, its text and `</think>`; otherwise an optional
/// `<think>` block. The calls' own rules are unchanged (`root` becomes `think-calls`).
pub fn block_first(gbnf: &str, opened: bool) -> String {
    let calls = gbnf
        .lines()
        .map(|l| match l.strip_prefix("root ::=") {
            Some(rest) => format!("think-calls ::={rest}"),
            None => l.to_string(),
        })
        .collect::<Vec<_>>()
        .join("\n");
    let block = if opened {
        "think-text \"</think>\" think-ws".to_string()
    } else {
        "( [ \\t\\n]{0,4} \"<think>\" think-text \"</think>\" think-ws )?".to_string()
    };
    format!(
        "root ::= {block} think-calls\nthink-ws ::= [ \\t\\n]{{0,4}}\n{}{calls}\n",
        super::xml_args::text_without("think-text", &[CLOSE])
    )
}

#[cfg(test)]
mod grammar_tests {
    use super::*;
    use muser_sample::Grammar;

    #[test]
    fn a_forced_call_may_follow_a_reasoning_block() {
        let calls = "root ::= \"<tool_call>\" [a-z]+ \"</tool_call>\"\n";
        let closed = Grammar::parse(&block_first(calls, false)).unwrap();
        for (text, ok) in [
            ("<tool_call>f</tool_call>", true),
            (
                "<think>why <tool_call> not</think>\n<tool_call>f</tool_call>",
                true,
            ),
            ("\n<think></think><tool_call>f</tool_call>", true),
            ("<think>never closed <tool_call>f</tool_call>", false),
            ("text<tool_call>f</tool_call>", false),
            ("<think>a</think>b</think><tool_call>f</tool_call>", false),
        ] {
            assert_eq!(closed.accepts_str(text), ok, "{text:?}");
        }
        let opened = Grammar::parse(&block_first(calls, true)).unwrap();
        for (text, ok) in [
            ("reasons</think>\n\n<tool_call>f</tool_call>", true),
            ("</think><tool_call>f</tool_call>", true),
            ("<tool_call>f</tool_call>", false),
            ("a</think>b</think><tool_call>f</tool_call>", false),
        ] {
            assert_eq!(opened.accepts_str(text), ok, "{text:?}");
        }
    }
}
