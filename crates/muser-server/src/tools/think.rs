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

/// The trigger patterns (for `Trigger::Pattern`, tried in order) that find a call's opening
/// `start` (their capture group) only after the reasoning block: after the first `</think>`
/// when the prompt opened the block, after the block when the output starts with one, in the
/// reply otherwise (anywhere in it for a `Word`, at its start after whitespace for a
/// `ReplyStart`). A tool call's lazy grammar then never starts inside the reasoning.
///
/// No pattern has a look-around: the regex crate's automata run them (fancy-regex hands such a
/// pattern over whole), in time linear in the text and without a backtracking limit, which
/// matters since a lazy trigger is searched over the whole output after every token. "Not a
/// block" and "the block's first `</think>`" are spelled out as automata instead.
pub fn after_block(start: LazyStart, opened: bool) -> Vec<String> {
    let body = without_close();
    match start {
        LazyStart::Word(w) => {
            let w = fancy_regex::escape(w);
            if opened {
                return vec![format!(r"^{body}</think>[\s\S]*?({w})")];
            }
            // A reply that does not start with `<think>`: the word at once, right after a
            // start of `<think>` that stops there, or after one that turns into something
            // else.
            let partial = (1..OPEN.len())
                .map(|n| fancy_regex::escape(&OPEN[..n]).into_owned())
                .collect::<Vec<_>>()
                .join("|");
            let broken = (0..OPEN.len())
                .map(|n| {
                    let next = &OPEN[n..n + 1];
                    let not = if n == 0 { r"\s<" } else { next };
                    format!("{}[^{not}]", fancy_regex::escape(&OPEN[..n]))
                })
                .collect::<Vec<_>>()
                .join("|");
            vec![
                format!(r"^\s*<think>{body}</think>[\s\S]*?({w})"),
                format!(r"^\s*({w})"),
                format!(r"^\s*(?:{partial})({w})"),
                format!(r"^\s*(?:{broken})[\s\S]*?({w})"),
            ]
        }
        LazyStart::ReplyStart(re) if opened => vec![format!(r"^{body}</think>\s*({re})")],
        LazyStart::ReplyStart(re) => vec![
            format!(r"^\s*<think>{body}</think>\s*({re})"),
            format!(r"^\s*({re})"),
        ],
    }
}

/// A regex (no look-around) of the texts without `</think>`: text without `<`, then runs of
/// `<` each followed by a start of `/think>` that stops short of it, or turns into another
/// character that is not `<` (and text without `<`).
fn without_close() -> String {
    let rest = &CLOSE[1..]; // "/think>"
    let last = rest.len() - 1;
    // What may follow `<` and `rest[..j]`, from j = last (only not `>`) down to 0.
    let mut level = format!("(?:[^{}<][^<]*)?", &rest[last..]);
    for j in (0..last).rev() {
        let c = &rest[j..j + 1];
        level = format!("(?:[^{c}<][^<]*|{c}{level})?");
    }
    format!("[^<]*(?:<+{level})*")
}

use super::LazyStart;

#[cfg(test)]
mod trigger_tests {
    use super::*;

    /// Where the patterns put the grammar's start: the first pattern that matches, at its
    /// capture group.
    fn at(patterns: &[String], text: &str) -> Option<usize> {
        at_compiled(&compiled(patterns), text)
    }

    fn compiled(patterns: &[String]) -> Vec<fancy_regex::Regex> {
        patterns
            .iter()
            .map(|p| fancy_regex::Regex::new(p).unwrap())
            .collect()
    }

    fn at_compiled(patterns: &[fancy_regex::Regex], text: &str) -> Option<usize> {
        patterns.iter().find_map(|re| {
            re.captures(text)
                .unwrap()
                .map(|c| c.get(1).unwrap().start())
        })
    }

    /// The same, read as `split` reads the block: the reply after the first `</think>` (or the
    /// whole text, when it does not start with a block; undecided while it may still become
    /// one), then the word anywhere in it or the regex at its start.
    fn reference(start: LazyStart, opened: bool, text: &str) -> Option<usize> {
        let lead = text.len() - text.trim_start().len();
        let reply = if opened || text[lead..].starts_with(OPEN) {
            text.find(CLOSE)? + CLOSE.len()
        } else if OPEN.starts_with(&text[lead..]) {
            return None;
        } else {
            0
        };
        match start {
            LazyStart::Word(w) => text[reply..].find(w).map(|i| reply + i),
            LazyStart::ReplyStart(re) => {
                let gap = text[reply..].len() - text[reply..].trim_start().len();
                let re = fancy_regex::Regex::new(&format!("^(?:{re})")).unwrap();
                re.is_match(&text[reply + gap..])
                    .unwrap()
                    .then_some(reply + gap)
            }
        }
    }

    #[test]
    fn the_text_without_a_close_is_exact() {
        let re = fancy_regex::Regex::new(&format!("^(?:{})$", without_close())).unwrap();
        let mut rng = super::super::test_util::Rng(0x5EED_7417);
        let pieces = [
            "<", "/", "t", "h", "i", "n", "k", ">", "x", "</think>", "</thin", "<<",
        ];
        for _ in 0..20_000 {
            let n = rng.below(9);
            let text: String = (0..n).map(|_| pieces[rng.below(pieces.len())]).collect();
            assert_eq!(
                re.is_match(&text).unwrap(),
                !text.contains(CLOSE),
                "{text:?}"
            );
        }
    }

    /// The patterns agree with `reference` on random texts of the pieces that matter, and
    /// none has a look-around (the regex crate compiles them).
    #[test]
    fn a_call_trigger_waits_for_the_end_of_the_reasoning() {
        let mut rng = super::super::test_util::Rng(0x5EED_7418);
        let pieces = [
            "<think>",
            "</think>",
            "<tool_call>",
            "<",
            "<t",
            "<thi",
            "<think",
            "</",
            "x",
            " ",
            "\n",
            "{",
            "\"name\"",
            "</think",
        ];
        for start in [
            LazyStart::Word("<tool_call>"),
            LazyStart::ReplyStart(r#"\{\s*"name""#),
        ] {
            for opened in [false, true] {
                let patterns = after_block(start, opened);
                for p in &patterns {
                    assert!(!p.contains("(?=") && !p.contains("(?!"), "{p}");
                }
                let res = compiled(&patterns);
                for _ in 0..6_000 {
                    let n = rng.below(8);
                    let text: String = (0..n).map(|_| pieces[rng.below(pieces.len())]).collect();
                    assert_eq!(
                        at_compiled(&res, &text),
                        reference(start, opened, &text),
                        "{start:?} opened {opened}: {text:?}"
                    );
                }
            }
        }
        // Examples.
        let word = after_block(LazyStart::Word("<tool_call>"), false);
        assert_eq!(at(&word, "<tool_call>"), Some(0));
        assert_eq!(at(&word, "Sure. <tool_call>"), Some(6));
        assert_eq!(at(&word, "<think>use <tool_call></think>"), None);
        assert_eq!(
            at(&word, "<think>a <tool_call> b</think>\n<tool_call>"),
            Some(31)
        );
        assert_eq!(at(&word, "<t<tool_call>"), Some(2));
        let opened = after_block(LazyStart::Word("<tool_call>"), true);
        assert_eq!(at(&opened, "a <tool_call> b</think> <tool_call>"), Some(24));
        let json = after_block(LazyStart::ReplyStart(r"\{"), false);
        assert_eq!(at(&json, " \n{"), Some(2));
        assert_eq!(at(&json, "Sure: {"), None);
        assert_eq!(at(&json, "<think>a</think> b </think>{"), None);
    }
}

/// A forced call grammar (`root`, from the start of the output) with room for the reasoning
/// block first: when the prompt opened it, its text and `</think>`; otherwise an optional
/// `<think>` block. The calls' own rules are unchanged (`root` becomes `think-calls`).
pub fn block_first(gbnf: &str, opened: bool) -> String {
    // A prefix no rule of the grammar has (a user's schema may name its definitions anything).
    let taken = super::rule_names(gbnf);
    let p = (1..)
        .map(|i| match i {
            1 => "think".to_string(),
            i => format!("think{i}"),
        })
        .find(|p| {
            !taken
                .iter()
                .any(|r| r == p || r.starts_with(&format!("{p}-")))
        })
        .expect("a free prefix");
    let calls = gbnf
        .lines()
        .map(|l| match l.strip_prefix("root ::=") {
            Some(rest) => format!("{p}-calls ::={rest}"),
            None => l.to_string(),
        })
        .collect::<Vec<_>>()
        .join("\n");
    let block = if opened {
        format!("{p}-text \"</think>\" {p}-ws")
    } else {
        format!("( [ \\t\\n]{{0,4}} \"<think>\" {p}-text \"</think>\" {p}-ws )?")
    };
    format!(
        "root ::= {block} {p}-calls\n{p}-ws ::= [ \\t\\n]{{0,4}}\n{}{calls}\n",
        super::xml_args::text_without(&format!("{p}-text"), &[CLOSE])
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
        // A grammar whose rules have the names the block would take keeps its own.
        let taken = "root ::= think-calls think-ws think-text\nthink-calls ::= \"a\"\n\
                     think-ws ::= \"b\"\nthink-text ::= \"c\"\n";
        let g = block_first(taken, true);
        let g = Grammar::parse(&g).unwrap_or_else(|e| panic!("{e:?}\n{g}"));
        assert!(g.accepts_str("x y</think>\nabc"));
        assert!(!g.accepts_str("x y</think>\na"));
    }
}
