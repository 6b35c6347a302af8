//! Reasoning in a block of tags, split from the reply as llama-server's default
//! `reasoning_format` splits it, into `reasoning_content`, before the reply goes to its
//! tool-call format. The tags are the template's ([`Tags::of_template`]): `<think>` /
//! `</think>` (DeepSeek R1, Qwen 3, QwQ, GLM, Nemotron and the other templates that write
//! them), `[THINK]` / `[/THINK]` (Ministral 3, whose calls then follow in the `mistral`
//! format), `<seed:think>` / `</seed:think>` (ByteDance Seed-OSS), `<mm:think>` /
//! `</mm:think>` (MiniMax M3), `<think:opensource>` / `</think:opensource>` (Tencent Hy3),
//! `<|START_THINKING|>` / `<|END_THINKING|>` (Cohere) or Gemma 4's
//! thought channel, `<|channel>thought` / `<channel|>` (whose calls then follow in the `gemma4`
//! format, which also reads the thought channels later in the reply).
//!
//! The reasoning is the text of a block at the start of the output (after optional
//! whitespace), or, when the prompt itself ends inside an opened block (a template that writes
//! `<think>` in its generation prompt, a continued reasoning), the output up to the closing
//! tag; where llama.cpp's handler for the family skips the whitespace that starts it (the
//! Qwen3-Coder family, MiniCPM5, MiniMax M3, Gemma 4: [`Tags::trim_reasoning`]), from its first
//! non-whitespace character. An output whose block never closes is all reasoning, unless the
//! template's format writes a call there that llama.cpp's handler for it reads: a marker of
//! [`Tags::ends`] (the call's opening, set by `Format::reasoning_tags`) then ends the reasoning
//! and starts the reply, as a closing tag would. Whitespace may come before a block, except in
//! the families whose handler reads a block only at the output's start ([`Tags::open_first`]:
//! LFM2, Kimi K2, Ministral 3, MiniMax M3). The reply after the block starts at its first
//! non-whitespace character; MiniMax M3's reply without reasoning follows a bare closing tag
//! ([`Tags::bare_close`]), which is not part of it.
//! (llama-server keeps whitespace after a closing tag beyond what its analysis of the template
//! puts in the tag, and, where a template's generation prompt has whitespace after an opening
//! tag, that whitespace in the reasoning; Muser's reply and reasoning start as above.)

use super::LazyStart;
use muser_jsonschema::gbnf_literal as literal;

/// A pair of reasoning tags, and how a family reads what is around them. Each tag is ASCII,
/// and the closing tag's first character occurs in it only there (what [`Tags::after_block`]'s
/// automata rely on; the markers of `ends` may be anything).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Tags {
    pub open: &'static str,
    pub close: &'static str,
    /// The reasoning starts at its first non-whitespace character (the Qwen3-Coder family's
    /// handler in llama.cpp skips the whitespace after `<think>`; its other templates keep it).
    pub trim_reasoning: bool,
    /// An output that starts with a bare closing tag has no reasoning, and its reply follows
    /// the tag (MiniMax M3 writes `</mm:think>` before a reply it did not think about).
    pub bare_close: bool,
    /// The reasoning of a block the prompt opened starts with the opening itself and a line
    /// break (llama.cpp reads Apriel 1.6's so: its analysis of the template takes the
    /// generation prompt's `Here are my reasoning steps:` line for the reasoning's first).
    pub lead_in_reasoning: bool,
    /// Markers that also end the reasoning, the reply starting at the first of them (with it):
    /// a tool call's opening written before the closing tag, where llama.cpp's handler for
    /// the template's format ends the reasoning there and reads the call
    /// (`Format::reasoning_tags` sets them). None by default: the call is reasoning.
    pub ends: &'static [&'static str],
    /// The opening tag (or a bare closing tag, `bare_close`) starts a block only as the
    /// output's very first text: after whitespace it is the reply's (as llama.cpp's LFM2 and
    /// MiniMax M3 handlers read it). Otherwise whitespace may come before the block.
    pub open_first: bool,
}

/// A pair of tags read as most templates' are.
const fn pair(open: &'static str, close: &'static str) -> Tags {
    Tags {
        open,
        close,
        trim_reasoning: false,
        bare_close: false,
        lead_in_reasoning: false,
        ends: &[],
        open_first: false,
    }
}

/// DeepSeek R1's, Qwen 3's, QwQ's.
pub const THINK: Tags = pair("<think>", "</think>");

/// Ministral 3's (and Magistral's).
pub const BRACKETS: Tags = pair("[THINK]", "[/THINK]");

/// ByteDance Seed-OSS's.
pub const SEED: Tags = pair("<seed:think>", "</seed:think>");

/// MiniMax M3's, whose replies without reasoning start with a bare closing tag (and whose
/// handler in llama.cpp skips the whitespace that starts the reasoning, and reads a block or
/// a bare closing tag only at the output's very start).
pub const MINIMAX: Tags = Tags {
    bare_close: true,
    trim_reasoning: true,
    open_first: true,
    ..pair("<mm:think>", "</mm:think>")
};

/// Cohere's (Command R7B, Command A Reasoning).
pub const COHERE: Tags = pair("<|START_THINKING|>", "<|END_THINKING|>");

/// Gemma 4's thought channel (whose reasoning llama.cpp's handler reads from its first
/// non-whitespace character).
pub const GEMMA: Tags = Tags {
    trim_reasoning: true,
    ..pair("<|channel>thought", "<channel|>")
};

/// Apriel 1.6's: no tags, but a generation prompt that ends with `Here are my reasoning
/// steps:\n`, and the reply after `[BEGIN FINAL RESPONSE]` (the reasoning starting with the
/// prompt's line, as llama.cpp reads it).
pub const APRIEL: Tags = Tags {
    lead_in_reasoning: true,
    ..pair("Here are my reasoning steps:", "[BEGIN FINAL RESPONSE]")
};

/// Tencent Hy3's.
pub const HY3: Tags = pair("<think:opensource>", "</think:opensource>");

/// Every pair, in the order a template's source is searched for them (Apriel 1.6's before
/// `<think>`, which its template mentions).
pub const ALL: [Tags; 8] = [APRIEL, THINK, BRACKETS, SEED, MINIMAX, COHERE, GEMMA, HY3];

impl Tags {
    /// The tags a chat template writes reasoning in: the first pair of [`ALL`] whose both
    /// tags its source writes, else None.
    pub fn of_template(template: &str) -> Option<Tags> {
        // Hy3 builds its tags when rendering (`'<think{}>'.format(HYTK)`, HYTK ':opensource').
        let hy3 = ["<think{}>", "</think{}>", "':opensource'"]
            .iter()
            .all(|m| template.contains(m));
        ALL.into_iter()
            .find(|t| template.contains(t.open) && template.contains(t.close))
            .or(hy3.then_some(HY3))
    }

    /// Whether a rendered prompt leaves its output inside an opened block.
    pub fn prompt_opens(self, prompt: &str) -> bool {
        prompt.trim_end().ends_with(self.open)
    }

    /// Whether the prompt ends with a closed, empty-or-not block (`<think></think>`: Qwen 3
    /// with `enable_thinking` false, DeepSeek V3.1's non-thinking mode): the reply comes
    /// without reasoning, and none is read or allowed.
    pub fn prompt_closes(self, prompt: &str) -> bool {
        prompt.trim_end().ends_with(self.close)
    }

    /// Where a generation prompt's own block starts when the prompt ends with one that is
    /// open or empty (`<think>\n`, `<think>\n\n</think>\n\n`): a continued message's block
    /// takes its place, as llama-server cuts its generation prompt at the reasoning's start.
    pub fn open_tail(self, prompt: &str) -> Option<usize> {
        let at = prompt.rfind(self.open)?;
        let after = prompt[at + self.open.len()..].trim();
        (after.is_empty() || after == self.close).then_some(at)
    }

    /// These tags read as the Qwen3-Coder family's handler reads them (`trim_reasoning`).
    pub const fn trimming_reasoning(self) -> Tags {
        Tags {
            trim_reasoning: true,
            ..self
        }
    }

    /// A finished output: its reasoning (None when it has no block) and the reply after it.
    pub fn split(self, text: &str, opened: bool) -> (Option<String>, &str) {
        if let Some(reply) = self.after_bare_close(text, opened) {
            return (None, reply);
        }
        let Some(body) = self.body_start(text, opened) else {
            return (None, text);
        };
        match self.block_end(body) {
            Some((end, reply)) => (
                Some(self.reasoning(&body[..end], opened)),
                body[reply..].trim_start(),
            ),
            None => (Some(self.reasoning(body, opened)), ""),
        }
    }

    /// Where the reasoning `body` ends, and where its reply starts: at the first closing tag
    /// (the reply after it) or marker of `ends` (the reply with it), whichever comes first;
    /// None while the block is open.
    fn block_end(self, body: &str) -> Option<(usize, usize)> {
        let close = body.find(self.close).map(|at| (at, at + self.close.len()));
        let ends = self
            .ends
            .iter()
            .filter_map(|e| body.find(e).map(|at| (at, at)));
        close.into_iter().chain(ends).min()
    }

    /// The longest end of `body` that may be the start of the closing tag or of a marker of
    /// `ends` (0 when none).
    fn held(self, body: &str) -> usize {
        std::iter::once(self.close)
            .chain(self.ends.iter().copied())
            .flat_map(|tag| {
                (1..tag.len())
                    .filter(|&n| tag.is_char_boundary(n))
                    .map(move |n| &tag[..n])
            })
            .filter(|start| body.ends_with(start))
            .map(str::len)
            .max()
            .unwrap_or(0)
    }

    /// The reasoning read as `body`: with the opening line before it where the family reads
    /// it so (`lead_in_reasoning`).
    fn reasoning(self, body: &str, opened: bool) -> String {
        if self.lead_in_reasoning && opened {
            format!("{}\n{body}", self.open)
        } else {
            body.to_string()
        }
    }

    /// An unfinished output: the reasoning so far (less a tail that may be the start of the
    /// closing tag), and the reply after the block once the block is closed (None while it is
    /// open or while the text may still become a block). Both are prefixes of what `split`
    /// gives for every continuation of `text`.
    pub fn split_partial(self, text: &str, opened: bool) -> (Option<String>, Option<&str>) {
        if !opened {
            let t = self.lead(text);
            let starts = |tag: &str| t.len() < tag.len() && tag.starts_with(t);
            if starts(self.open) || self.bare_close && starts(self.close) {
                // Nothing yet, or the start of a block (or of a bare closing tag): wait.
                return (None, None);
            }
        }
        if let Some(reply) = self.after_bare_close(text, opened) {
            return (None, Some(reply));
        }
        let Some(body) = self.body_start(text, opened) else {
            return (None, Some(text));
        };
        match self.block_end(body) {
            Some((end, reply)) => {
                let rest = body[reply..].trim_start();
                (Some(self.reasoning(&body[..end], opened)), Some(rest))
            }
            None => {
                let so_far = &body[..body.len() - self.held(body)];
                (Some(self.reasoning(so_far, opened)), None)
            }
        }
    }

    /// Where the reasoning starts: at once when the prompt opened the block, after the opening
    /// tag when the output starts with one (after whitespace), else nowhere.
    fn body_start(self, text: &str, opened: bool) -> Option<&str> {
        let body = if opened {
            text
        } else {
            self.lead(text).strip_prefix(self.open)?
        };
        Some(if self.trim_reasoning {
            body.trim_start()
        } else {
            body
        })
    }

    /// The reply after a bare closing tag that starts an output (after whitespace), where the
    /// family writes one (`bare_close`) and the prompt did not open a block.
    fn after_bare_close(self, text: &str, opened: bool) -> Option<&str> {
        if !self.bare_close || opened {
            return None;
        }
        let rest = self.lead(text).strip_prefix(self.close)?;
        Some(rest.trim_start())
    }

    /// Where a block may start in an output: after its whitespace, or at once (`open_first`).
    fn lead(self, text: &str) -> &str {
        if self.open_first {
            text
        } else {
            text.trim_start()
        }
    }

    /// The trigger patterns (for `Trigger::Pattern`, tried in order) that find a call's
    /// opening `start` (their capture group) only after the reasoning block: after the first
    /// closing tag when the prompt opened the block, after the block when the output starts
    /// with one, in the reply otherwise (anywhere in it for a `Word`, at its start after
    /// whitespace for a `ReplyStart`). A tool call's lazy grammar then never starts inside the
    /// reasoning; but where the word is a marker of `ends`, its first occurrence in a block
    /// left open also starts it, as the reading ends the block there. (`ends` are for calls
    /// that start with a word: a `ReplyStart` does not look for them.)
    ///
    /// No pattern has a look-around: the regex crate's automata run them (fancy-regex hands
    /// such a pattern over whole), in time linear in the text and without a backtracking
    /// limit, which matters since a lazy trigger is searched over the whole output after every
    /// token. "Not a block" and "the block's first closing tag" are spelled out as automata
    /// instead.
    pub fn after_block(self, start: LazyStart, opened: bool) -> Vec<String> {
        let body = self.without_close();
        let (open, close) = (
            fancy_regex::escape(self.open),
            fancy_regex::escape(self.close),
        );
        // (whitespace before the opening tag, where the family reads a block after it)
        let lead = if self.open_first { "" } else { r"\s*" };
        match start {
            LazyStart::Word(w) => {
                // Where the word also ends a block left open (`ends`), its first occurrence in
                // the block (before any closing tag) comes first: the lazy body stops at it.
                let in_block = self.ends.contains(&w).then(|| lazy(&body));
                let w = fancy_regex::escape(w);
                if opened {
                    let mut patterns: Vec<String> =
                        in_block.iter().map(|b| format!(r"^{b}({w})")).collect();
                    patterns.push(format!(r"^{body}{close}[\s\S]*?({w})"));
                    return patterns;
                }
                // A reply that does not start with the opening tag: the word at once, right
                // after a start of the tag that stops there, or after one that turns into
                // something else.
                let partial = (1..self.open.len())
                    .map(|n| fancy_regex::escape(&self.open[..n]).into_owned())
                    .collect::<Vec<_>>()
                    .join("|");
                let broken = (0..self.open.len())
                    .map(|n| {
                        let next = class_char(&self.open[n..n + 1]);
                        let not = match n == 0 && !self.open_first {
                            true => format!(r"\s{next}"),
                            false => next,
                        };
                        format!("{}[^{not}]", fancy_regex::escape(&self.open[..n]))
                    })
                    .collect::<Vec<_>>()
                    .join("|");
                let mut patterns: Vec<String> = in_block
                    .iter()
                    .map(|b| format!(r"^{lead}{open}{b}({w})"))
                    .collect();
                patterns.extend([
                    format!(r"^{lead}{open}{body}{close}[\s\S]*?({w})"),
                    format!(r"^{lead}({w})"),
                    format!(r"^{lead}(?:{partial})({w})"),
                ]);
                if self.bare_close {
                    patterns.push(format!(r"^{lead}{close}[\s\S]*?({w})"));
                }
                patterns.push(format!(r"^{lead}(?:{broken})[\s\S]*?({w})"));
                patterns
            }
            LazyStart::ReplyStart(re) if opened => vec![format!(r"^{body}{close}\s*({re})")],
            LazyStart::ReplyStart(re) => {
                let mut patterns = vec![
                    format!(r"^{lead}{open}{body}{close}\s*({re})"),
                    format!(r"^\s*({re})"),
                ];
                if self.bare_close {
                    // (a reply without reasoning after a bare closing tag)
                    patterns.push(format!(r"^{lead}{close}\s*({re})"));
                }
                patterns
            }
        }
    }

    /// A regex (no look-around) of the texts without the closing tag: text without its first
    /// character `c`, then runs of `c` each followed by a start of the tag's rest that stops
    /// short of it, or turns into another character that is not `c` (and text without `c`).
    fn without_close(self) -> String {
        let c = class_char(&self.close[..1]);
        let c_lit = fancy_regex::escape(&self.close[..1]);
        let rest = &self.close[1..]; // "/think>", "/THINK]"
        let last = rest.len() - 1;
        // What may follow `c` and `rest[..j]`, from j = last (only not its last character)
        // down to 0.
        let mut level = format!("(?:[^{}{c}][^{c}]*)?", class_char(&rest[last..]));
        for j in (0..last).rev() {
            let (not, lit) = (
                class_char(&rest[j..j + 1]),
                fancy_regex::escape(&rest[j..j + 1]),
            );
            level = format!("(?:[^{not}{c}][^{c}]*|{lit}{level})?");
        }
        format!("[^{c}]*(?:{c_lit}+{level})*")
    }

    /// A forced call grammar (`root`, from the start of the output) with room for the
    /// reasoning block first: when the prompt opened it, its text and the closing tag;
    /// otherwise an optional block. The calls' own rules are unchanged (`root` becomes
    /// `think-calls`).
    pub fn block_first(self, gbnf: &str, opened: bool) -> String {
        // A prefix no rule of the grammar has (a user's schema may name its definitions
        // anything).
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
        let (open, close) = (literal(self.open), literal(self.close));
        // (whitespace before the opening tag, where the family reads a block after it)
        let lead = if self.open_first {
            ""
        } else {
            "[ \\t\\n]{0,4}"
        };
        let block = if opened {
            format!("{p}-text {close} {p}-ws")
        } else if self.bare_close {
            // (or a bare closing tag, before a reply without reasoning)
            format!("( {lead} ( {open} {p}-text {close} | {close} ) {p}-ws )?")
        } else {
            format!("( {lead} {open} {p}-text {close} {p}-ws )?")
        };
        // The reasoning's text has none of the markers that would end it.
        let mut delims = vec![self.close];
        delims.extend(self.ends);
        format!(
            "root ::= {block} {p}-calls\n{p}-ws ::= [ \\t\\n]{{0,4}}\n{}{calls}\n",
            super::xml_args::text_without(&format!("{p}-text"), &delims)
        )
    }
}

/// `re` with every quantifier lazy (`*?`, `+?`, `??`): of the texts it matches, a pattern
/// takes the shortest one that lets the rest match. For regexes of `Tags::without_close`'s,
/// whose `*`, `+` and `?` are all quantifiers.
fn lazy(re: &str) -> String {
    let mut out = String::new();
    let mut chars = re.chars();
    let mut in_class = false;
    while let Some(c) = chars.next() {
        let after_group = out.ends_with('(');
        out.push(c);
        match c {
            // (an escaped character is a literal)
            '\\' => out.extend(chars.next()),
            '[' if !in_class => in_class = true,
            ']' if in_class => in_class = false,
            '*' | '+' | '?' if !in_class && !after_group => out.push('?'),
            _ => {}
        }
    }
    out
}

/// One ASCII character as a member of a regex character class, escaped where the class
/// syntax would read it otherwise.
fn class_char(c: &str) -> String {
    if c.len() == 1 && "[]\\^-&~".contains(c) {
        format!("\\{c}")
    } else {
        c.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_util::{markup_text, prefixes, Rng};
    use super::*;

    /// Every pair of tags (and `<think>` read as the Qwen3-Coder family reads it), and the word
    /// a tool call of their models opens with.
    const PAIRS: [(Tags, &str); 12] = [
        (THINK, "<tool_call>"),
        (APRIEL, "<tool_calls>"),
        (BRACKETS, "[TOOL_CALLS]"),
        (SEED, "<seed:tool_call>"),
        (MINIMAX, "<tool_call>"),
        (COHERE, "<|START_ACTION|>"),
        (THINK.trimming_reasoning(), "<tool_call>"),
        (GEMMA, "<|tool_call>"),
        // Blocks that a call's opening also ends (the Qwen3-Coder family's, DSML's, with a
        // marker that is not ASCII, Cohere2MoE's of two markers), and LFM2's.
        (QWEN_XML, "<tool_call>"),
        (DSML, "<｜DSML｜function_calls>"),
        (COHERE2MOE, "<|START_ACTION|>"),
        (FIRST, "<|tool_call_start|>"),
    ];

    /// `<think>` read as the Qwen3-Coder family's handler reads it, a call's opening ending it.
    const QWEN_XML: Tags = Tags {
        ends: &["<tool_call>"],
        ..THINK.trimming_reasoning()
    };
    const DSML: Tags = Tags {
        ends: &["<｜DSML｜function_calls>"],
        ..THINK
    };
    const COHERE2MOE: Tags = Tags {
        ends: &["<|START_ACTION|>", "<|START_TEXT|>"],
        ..COHERE
    };
    /// `<think>` opening a block only at the output's start (LFM2's).
    const FIRST: Tags = Tags {
        open_first: true,
        ..THINK
    };

    /// `s` with `<think>` tags written as `t`'s.
    fn with(t: Tags, s: &str) -> String {
        s.replace(THINK.close, t.close).replace(THINK.open, t.open)
    }

    #[test]
    fn blocks_split_from_the_reply() {
        for (t, _) in PAIRS {
            let w = |s: &str| with(t, s);
            assert_eq!(
                t.split(&w("<think>a b</think>\n\nHi"), false),
                (Some("a b".into()), "Hi")
            );
            // (after whitespace, a block only where the family reads one there)
            let spaced = w("  <think>x</think>");
            let want = match t.open_first {
                true => (None, spaced.as_str()),
                false => (Some("x".into()), ""),
            };
            assert_eq!(t.split(&spaced, false), want);
            let inside = w("Hi <think>x</think>");
            assert_eq!(t.split(&inside, false), (None, inside.as_str()));
            assert_eq!(
                t.split(&w("<think>never closed"), false),
                (Some("never closed".into()), "")
            );
            // (Apriel's reasoning in a block its prompt opened starts with the prompt's line)
            let lead = if t.lead_in_reasoning {
                format!("{}\n", t.open)
            } else {
                String::new()
            };
            assert_eq!(
                t.split(&w("reasons</think> reply"), true),
                (Some(format!("{lead}reasons")), "reply")
            );
            assert_eq!(
                t.split("no close", true),
                (Some(format!("{lead}no close")), "")
            );
            assert_eq!(t.split("", false), (None, ""));
            assert!(t.prompt_opens(&w("<|im_start|>assistant\n<think>\n")));
            assert!(!t.prompt_opens(&w("<think>\n\n</think>\n\n")));
            assert!(t.prompt_closes(&w("<think>\n\n</think>\n\n")));
            let tail = w("A: x</think>y B: ").len();
            assert_eq!(t.open_tail(&w("A: x</think>y B: <think>\n")), Some(tail));
            assert_eq!(t.open_tail(&w("B: <think>\n\n</think>\n\n")), Some(3));
            assert_eq!(t.open_tail(&w("<think>a</think>b")), None);
            assert_eq!(t.open_tail("B: "), None);
        }
        // The other pair's tags are text.
        assert_eq!(
            THINK.split("[THINK]x[/THINK]y", false),
            (None, "[THINK]x[/THINK]y")
        );
        assert_eq!(
            BRACKETS.split("<think>x</think>y", false),
            (None, "<think>x</think>y")
        );
    }

    /// Each real template of llama.cpp that writes both tags of a pair gets that pair (Seed-OSS
    /// and MiniMax M3 their own); the `<think>` one wins where a template writes two pairs
    /// (none does).
    #[test]
    fn templates_get_their_tags() {
        assert_eq!(
            Tags::of_template("{{ '<think>' }}...{{ '</think>' }}"),
            Some(THINK)
        );
        assert_eq!(
            Tags::of_template("'[THINK]' + t + '[/THINK]'"),
            Some(BRACKETS)
        );
        assert_eq!(Tags::of_template("<tool_call> <think>"), None);
        let Some(dir) = super::super::test_util::templates_dir() else {
            return;
        };
        let mut brackets = Vec::new();
        for e in std::fs::read_dir(dir).unwrap() {
            let path = e.unwrap().path();
            let src = std::fs::read_to_string(&path).unwrap_or_default();
            if Tags::of_template(&src) == Some(BRACKETS) {
                brackets.push(path.file_name().unwrap().to_string_lossy().into_owned());
            }
        }
        assert_eq!(brackets, ["mistralai-Ministral-3-14B-Reasoning-2512.jinja"]);
        for (file, tags) in [
            ("Qwen-Qwen3-0.6B.jinja", THINK),
            ("deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja", THINK),
            ("ByteDance-Seed-OSS.jinja", SEED),
            ("MiniMax-M3.jinja", MINIMAX),
            ("google-gemma-4-31B-it.jinja", GEMMA),
            ("google-gemma-4-31B-it-interleaved.jinja", GEMMA),
            ("tencent-Hy3.jinja", HY3),
        ] {
            let src = super::super::test_util::template(file).unwrap();
            assert_eq!(Tags::of_template(&src), Some(tags), "{file}");
        }
    }

    /// Random outputs of random reasoning and reply texts, the tags, and fragments near them:
    /// for every prefix, the partial reasoning is a prefix of the final one, and so is the
    /// partial reply once there is one.
    #[test]
    fn partial_splits_are_prefixes_of_the_final_split() {
        for (t, call) in PAIRS {
            let frags = [
                t.open,
                t.close,
                &t.open[..1],
                &t.close[..2],
                &t.close[..4],
                &t.open[..3],
                &t.open[1..],
                "a",
                " ",
                "\n",
                "é",
                "reply",
                call,
            ];
            let mut rng = Rng(0x7417_2026);
            let (mut with_reasoning, mut with_reply) = (0, 0);
            for _ in 0..4000 {
                let n = 1 + rng.below(9);
                let text: String = (0..n).map(|_| frags[rng.below(frags.len())]).collect();
                for opened in [false, true] {
                    let (r, rest) = t.split(&text, opened);
                    with_reasoning += r.as_ref().is_some_and(|r| !r.is_empty()) as usize;
                    with_reply += !rest.is_empty() as usize;
                    for p in prefixes(&text) {
                        let (pr, prest) = t.split_partial(p, opened);
                        if let Some(pr) = &pr {
                            let r = r.as_deref().unwrap_or_else(|| {
                                panic!("{text:?} (opened {opened}): {p:?} has reasoning {pr:?}")
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
                "{t:?}: {with_reasoning} {with_reply}"
            );
        }
    }

    /// A block of random reasoning then a random reply, written whole: the split gives both
    /// back exactly, opened by the prompt or not.
    #[test]
    fn random_reasoning_and_replies_come_back() {
        let mut rng = Rng(0x7417_2027);
        for (t, call) in PAIRS {
            for _ in 0..2000 {
                let reasoning = markup_text(&mut rng, 0, 12);
                let mut reply = markup_text(&mut rng, 1, 12).trim_start().to_string();
                if rng.coin() {
                    reply.push_str(call);
                }
                let gap = [" ", "\n\n", ""][rng.below(3)];
                let opened = rng.coin();
                let before = if t.open_first { "" } else { gap };
                let text = if opened {
                    format!("{reasoning}{}{gap}{reply}", t.close)
                } else {
                    format!("{before}{}{reasoning}{}{gap}{reply}", t.open, t.close)
                };
                let reasoning = match t.trim_reasoning {
                    true => reasoning.trim_start(),
                    false => &reasoning,
                };
                let reasoning = match t.lead_in_reasoning && opened {
                    true => format!("{}\n{reasoning}", t.open),
                    false => reasoning.to_string(),
                };
                assert_eq!(
                    t.split(&text, opened),
                    (Some(reasoning.clone()), reply.as_str()),
                    "{text:?}"
                );
                let (last_r, last_rest) = t.split_partial(&text, opened);
                assert_eq!(
                    (last_r.as_deref(), last_rest),
                    (Some(reasoning.as_str()), Some(reply.as_str()))
                );
                // A reply after a bare closing tag: no reasoning where the family writes one
                // so, else all of it is the reply.
                let lead = if t.open_first { "" } else { gap };
                let bare = format!("{lead}{}{gap}{reply}", t.close);
                let want = match t.bare_close {
                    true => (None, reply.as_str()),
                    false => (None, bare.as_str()),
                };
                assert_eq!(t.split(&bare, false), want, "{t:?} {bare:?}");
                assert_eq!(t.split_partial(&bare, false), (want.0, Some(want.1)));
            }
        }
    }

    /// A block left open up to a marker of `ends`: the reasoning stops there and the reply
    /// starts with the marker, whole and while streaming (the reasoning held back while the
    /// text may be the start of a marker); the first of the closing tag and the markers ends
    /// it. Without `ends` the marker is reasoning.
    #[test]
    fn a_block_left_open_ends_at_a_marker() {
        let mut rng = Rng(0x7417_2028);
        for (t, call) in [(QWEN_XML, "<tool_call>"), (DSML, DSML.ends[0])]
            .into_iter()
            .chain(COHERE2MOE.ends.iter().map(|&e| (COHERE2MOE, e)))
        {
            for _ in 0..500 {
                let reasoning = markup_text(&mut rng, 0, 12);
                let rest = format!("{call}{}", markup_text(&mut rng, 0, 12));
                let opened = rng.coin();
                let open = if opened { "" } else { t.open };
                let text = format!("{open}{reasoning}{rest}");
                let want = match t.trim_reasoning {
                    true => reasoning.trim_start(),
                    false => &reasoning,
                };
                assert_eq!(
                    t.split(&text, opened),
                    (Some(want.to_string()), rest.as_str()),
                    "{text:?}"
                );
                // Without the markers, all of it is reasoning.
                let plain = Tags { ends: &[], ..t };
                assert_eq!(plain.split(&text, opened).1, "", "{text:?}");
                // Streaming: the reasoning so far is the final one's start; once the marker is
                // whole, the reasoning is final and the reply starts with it.
                for p in prefixes(&text) {
                    let (r, reply) = t.split_partial(p, opened);
                    let r = r.unwrap_or_default();
                    assert!(want.starts_with(&r), "{p:?}: {r:?} / {want:?}");
                    if p.len() >= open.len() + reasoning.len() + call.len() {
                        assert_eq!(
                            (r.as_str(), reply),
                            (want, Some(&rest[..p.len() + rest.len() - text.len()]))
                        );
                    } else {
                        assert_eq!(reply, None, "{p:?}");
                    }
                }
                // A closing tag before the marker ends the block there.
                let closed = format!("{open}{reasoning}{}{rest}", t.close);
                assert_eq!(
                    t.split(&closed, opened),
                    (Some(want.to_string()), rest.as_str())
                );
            }
        }
        assert_eq!(
            QWEN_XML.split("<think>\nLet me look.\n<tool_call>\n<function=f>", false),
            (Some("Let me look.\n".into()), "<tool_call>\n<function=f>")
        );
        assert_eq!(
            QWEN_XML.split("a <tool_call> b</think>c", true),
            (Some("a ".into()), "<tool_call> b</think>c")
        );
        assert_eq!(
            QWEN_XML.split_partial("a <tool_", true),
            (Some("a ".into()), None)
        );
        assert_eq!(
            DSML.split_partial("a <｜DSML", true),
            (Some("a ".into()), None)
        );
    }

    /// Where the opening tag counts only as the output's first text (LFM2's), whitespace
    /// before it makes the whole output the reply; at the start it opens a block as usual.
    #[test]
    fn an_opening_after_whitespace_is_the_reply_where_the_family_reads_it_so() {
        let mut rng = Rng(0x7417_2029);
        for _ in 0..500 {
            let reasoning = markup_text(&mut rng, 0, 12);
            let reply = markup_text(&mut rng, 1, 12).trim_start().to_string();
            let gap = [" ", "\n", " \n "][rng.below(3)];
            let text = format!("{gap}<think>{reasoning}</think>{reply}");
            assert_eq!(FIRST.split(&text, false), (None, text.as_str()));
            assert_eq!(
                FIRST.split_partial(&text, false),
                (None, Some(text.as_str()))
            );
            assert_eq!(
                THINK.split(&text, false),
                (Some(reasoning.clone()), reply.as_str())
            );
            assert_eq!(
                FIRST.split(&text[gap.len()..], false),
                (Some(reasoning.clone()), reply.as_str())
            );
            for p in prefixes(&text).filter(|p| !p.is_empty()) {
                assert_eq!(FIRST.split_partial(p, false), (None, Some(p)));
            }
        }
        // (the start of an opening tag waits, as for other families)
        assert_eq!(FIRST.split_partial("<thi", false), (None, None));
    }
}

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

    /// The same, read as `split` reads the block: the reply after the first closing tag (or
    /// the whole text, when it does not start with a block; undecided while it may still
    /// become one), then the word anywhere in it or the regex at its start.
    fn reference(t: Tags, start: LazyStart, opened: bool, text: &str) -> Option<usize> {
        let lead = match t.open_first {
            true => 0,
            false => text.len() - text.trim_start().len(),
        };
        let reply = if opened || text[lead..].starts_with(t.open) {
            let body = if opened { 0 } else { lead + t.open.len() };
            body + t.block_end(&text[body..])?.1
        } else if t.open.starts_with(&text[lead..]) {
            return None;
        } else if t.bare_close && text[lead..].starts_with(t.close) {
            // (a bare closing tag before a reply without reasoning)
            lead + t.close.len()
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

    /// Single characters of `s`, and its prefixes.
    fn pieces_of(s: &'static str) -> Vec<&'static str> {
        (0..s.len())
            .map(|i| &s[i..i + 1])
            .chain((1..s.len()).map(|n| &s[..n]))
            .collect()
    }

    #[test]
    fn the_text_without_a_close_is_exact() {
        for t in ALL {
            let re = fancy_regex::Regex::new(&format!("^(?:{})$", t.without_close())).unwrap();
            let mut rng = super::super::test_util::Rng(0x5EED_7417);
            let mut pieces = pieces_of(t.close);
            pieces.extend(["x", t.close, &t.close[..1], t.open]);
            for _ in 0..20_000 {
                let n = rng.below(9);
                let text: String = (0..n).map(|_| pieces[rng.below(pieces.len())]).collect();
                assert_eq!(
                    re.is_match(&text).unwrap(),
                    !text.contains(t.close),
                    "{text:?}"
                );
            }
        }
    }

    /// The patterns agree with `reference` on random texts of the pieces that matter, and
    /// none has a look-around (the regex crate compiles them).
    #[test]
    fn a_call_trigger_waits_for_the_end_of_the_reasoning() {
        let mut rng = super::super::test_util::Rng(0x5EED_7418);
        let first = Tags {
            open_first: true,
            ..THINK
        };
        let calls = [
            "<tool_calls>",
            "<tool_call>",
            "[TOOL_CALLS]",
            "<x>",
            "<tool_call>",
            "<|x|>",
            "<|tool_call>",
            "<tool_calls:opensource>",
        ];
        // (and `<think>` opening a block only at the output's start, LFM2's; blocks that a
        // call's opening also ends, where the call starts with it or not)
        let ending = |ends| Tags { ends, ..THINK };
        let more = [
            (first, "<|tool_call_start|>"),
            (ending(&["<tool_call>"]), "<tool_call>"),
            (ending(&["<tool_call>", "<x>"]), "<x>"),
            (
                Tags {
                    ends: &["<|START_ACTION|>", "<|START_TEXT|>"],
                    ..COHERE
                },
                "<|START_ACTION|>",
            ),
        ];
        for (t, call) in ALL.into_iter().zip(calls).chain(more) {
            let mut pieces = vec![t.open, t.close, call, "x", " ", "\n", "{", "\"name\""];
            pieces.extend(t.ends);
            pieces.extend(pieces_of(t.open).into_iter().skip(t.open.len()));
            pieces.extend(pieces_of(t.close).into_iter().skip(t.close.len()));
            // (a block's `ends` are the openings of calls that start with a word)
            let starts = [
                LazyStart::Word(call),
                LazyStart::ReplyStart(r#"\{\s*"name""#),
            ];
            for start in &starts[..if t.ends.is_empty() { 2 } else { 1 }] {
                let start = *start;
                for opened in [false, true] {
                    let patterns = t.after_block(start, opened);
                    for p in &patterns {
                        assert!(!p.contains("(?=") && !p.contains("(?!"), "{p}");
                    }
                    let res = compiled(&patterns);
                    for _ in 0..6_000 {
                        let n = rng.below(8);
                        let text: String =
                            (0..n).map(|_| pieces[rng.below(pieces.len())]).collect();
                        assert_eq!(
                            at_compiled(&res, &text),
                            reference(t, start, opened, &text),
                            "{t:?} {start:?} opened {opened}: {text:?}"
                        );
                    }
                }
            }
        }
        // Examples.
        let word = THINK.after_block(LazyStart::Word("<tool_call>"), false);
        assert_eq!(at(&word, "<tool_call>"), Some(0));
        assert_eq!(at(&word, "Sure. <tool_call>"), Some(6));
        assert_eq!(at(&word, "<think>use <tool_call></think>"), None);
        assert_eq!(
            at(&word, "<think>a <tool_call> b</think>\n<tool_call>"),
            Some(31)
        );
        assert_eq!(at(&word, "<t<tool_call>"), Some(2));
        let opened = THINK.after_block(LazyStart::Word("<tool_call>"), true);
        assert_eq!(at(&opened, "a <tool_call> b</think> <tool_call>"), Some(24));
        let json = THINK.after_block(LazyStart::ReplyStart(r"\{"), false);
        assert_eq!(at(&json, " \n{"), Some(2));
        assert_eq!(at(&json, "Sure: {"), None);
        assert_eq!(at(&json, "<think>a</think> b </think>{"), None);
        let mistral = BRACKETS.after_block(LazyStart::Word("[TOOL_CALLS]"), false);
        assert_eq!(
            at(&mistral, "[THINK]a [TOOL_CALLS] b[/THINK][TOOL_CALLS]"),
            Some(31)
        );
        assert_eq!(at(&mistral, "[THINK]a [TOOL_CALLS] b"), None);
        assert_eq!(at(&mistral, "Hi[TOOL_CALLS]"), Some(2));
        // MiniMax M3's reply without reasoning, after a bare closing tag.
        let json = MINIMAX.after_block(LazyStart::ReplyStart(r"\{"), false);
        assert_eq!(at(&json, "</mm:think>\n{"), Some(12));
        // (MiniMax M3's bare closing tag only at the very start)
        assert_eq!(at(&json, " </mm:think>{"), None);
        assert_eq!(at(&json, "</mm:think>a{"), None);
        assert_eq!(at(&json, "</mm:think></mm:think>{"), None);
        let json = THINK.after_block(LazyStart::ReplyStart(r"\{"), false);
        assert_eq!(at(&json, "</think>{"), None);
        // A call's opening that ends a block left open: its first one there.
        let qwen = Tags {
            ends: &["<tool_call>"],
            ..THINK
        };
        let word = qwen.after_block(LazyStart::Word("<tool_call>"), false);
        assert_eq!(
            at(&word, "<think>a <tool_call> b</think> <tool_call>"),
            Some(9)
        );
        assert_eq!(at(&word, "<think>a</think> b <tool_call>"), Some(19));
        let opened = qwen.after_block(LazyStart::Word("<tool_call>"), true);
        assert_eq!(at(&opened, "a <tool_call> <tool_call></think>"), Some(2));
        // LFM2's: a block after whitespace is the reply's text.
        let word = first.after_block(LazyStart::Word("<|tool_call_start|>"), false);
        assert_eq!(at(&word, " <think>a <|tool_call_start|>"), Some(10));
        assert_eq!(at(&word, "<think>a <|tool_call_start|>"), None);
        assert_eq!(at(&word, "<think>a</think> <|tool_call_start|>"), Some(17));
    }
}

#[cfg(test)]
mod grammar_tests {
    use super::*;
    use muser_sample::Grammar;

    #[test]
    fn a_forced_call_may_follow_a_reasoning_block() {
        for t in ALL {
            let w = |s: &str| s.replace("</think>", t.close).replace("<think>", t.open);
            let calls = "root ::= \"<tool_call>\" [a-z]+ \"</tool_call>\"\n";
            let closed = Grammar::parse(&t.block_first(calls, false)).unwrap();
            for (text, ok) in [
                ("<tool_call>f</tool_call>", true),
                (
                    "<think>why <tool_call> not</think>\n<tool_call>f</tool_call>",
                    true,
                ),
                ("\n<think></think><tool_call>f</tool_call>", !t.open_first),
                ("<think>never closed <tool_call>f</tool_call>", false),
                ("text<tool_call>f</tool_call>", false),
                ("<think>a</think>b</think><tool_call>f</tool_call>", false),
            ] {
                assert_eq!(closed.accepts_str(&w(text)), ok, "{t:?} {text:?}");
            }
            let opened = Grammar::parse(&t.block_first(calls, true)).unwrap();
            for (text, ok) in [
                ("reasons</think>\n\n<tool_call>f</tool_call>", true),
                ("</think><tool_call>f</tool_call>", true),
                ("<tool_call>f</tool_call>", false),
                ("a</think>b</think><tool_call>f</tool_call>", false),
            ] {
                assert_eq!(opened.accepts_str(&w(text)), ok, "{t:?} {text:?}");
            }
            // A grammar whose rules have the names the block would take keeps its own.
            let taken = "root ::= think-calls think-ws think-text\nthink-calls ::= \"a\"\n\
                         think-ws ::= \"b\"\nthink-text ::= \"c\"\n";
            let g = t.block_first(taken, true);
            let g = Grammar::parse(&g).unwrap_or_else(|e| panic!("{e:?}\n{g}"));
            assert!(g.accepts_str(&w("x y</think>\nabc")));
            assert!(!g.accepts_str(&w("x y</think>\na")));
            // A bare closing tag before the calls, where the family writes one (MiniMax M3
            // without reasoning, as llama.cpp's grammar for it takes), and only there.
            // (after whitespace where the block may start there)
            for (text, spaced) in [
                ("</think><tool_call>f</tool_call>", false),
                (" </think>\n<tool_call>f</tool_call>", true),
            ] {
                let ok = t.bare_close && !(spaced && t.open_first);
                assert_eq!(closed.accepts_str(&w(text)), ok, "{t:?} {text:?}");
            }
            assert!(!closed.accepts_str(&w("</think></think><tool_call>f</tool_call>")));
        }
        // The markers that end a block are not the reasoning's text; LFM2's block starts the
        // output.
        let calls = "root ::= \"<tool_call>\" [a-z]+ \"</tool_call>\"\n";
        let ends = Tags {
            ends: &["<tool_call>", "<｜DSML｜x>"],
            ..THINK
        };
        for opened in [false, true] {
            let g = Grammar::parse(&ends.block_first(calls, opened)).unwrap();
            let open = if opened { "" } else { "<think>" };
            for (text, ok) in [
                ("why</think><tool_call>f</tool_call>", true),
                ("why <tool_call></think><tool_call>f</tool_call>", false),
                ("why <｜DSML｜x></think><tool_call>f</tool_call>", false),
                ("why <｜DSML｜y></think><tool_call>f</tool_call>", true),
            ] {
                assert_eq!(g.accepts_str(&format!("{open}{text}")), ok, "{text:?}");
            }
        }
        let first = Tags {
            open_first: true,
            ..THINK
        };
        let g = Grammar::parse(&first.block_first(calls, false)).unwrap();
        assert!(g.accepts_str("<think>a</think>\n<tool_call>f</tool_call>"));
        assert!(!g.accepts_str(" <think>a</think>\n<tool_call>f</tool_call>"));
        assert!(g.accepts_str("<tool_call>f</tool_call>"));
    }
}
