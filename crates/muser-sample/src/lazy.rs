//! Lazy grammars: llama.cpp's grammar triggers (`llama_sampler_init_grammar_lazy_patterns`, as
//! its common sampler builds the patterns from `common_grammar_trigger`s).
//!
//! A lazy grammar constrains nothing until the generated text triggers it: a trigger token is
//! generated, or a trigger pattern is found in the text generated so far (the trigger
//! buffer). The grammar then starts at the trigger (a pattern's first non-empty capture group,
//! else its whole match), is fed the text from there on, and constrains every later token.

use crate::{GrammarError, GrammarState, GrammarVocab};
use fancy_regex::Regex;

/// How a trigger pattern is given (llama.cpp's `common_grammar_trigger_type`, less the token
/// kind, which is `Triggers::new`'s `tokens`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TriggerKind {
    /// A literal word, found anywhere in the text (llama.cpp regex-escapes it).
    Word,
    /// A regex searched anywhere in the text; one that starts with `^` and ends with `$` is
    /// first tried against the whole text.
    Pattern,
    /// A regex the whole text must match: `^` and `$` are added where it lacks them (an
    /// empty pattern is `^$`).
    PatternFull,
}

/// What triggers a lazy grammar: token ids and patterns (regexes, in `fancy_regex` syntax,
/// which has the look-arounds llama.cpp's chat formats use). Built once per request and shared
/// (`Sampler::set_lazy_grammar`).
#[derive(Clone, Debug)]
pub struct Triggers {
    tokens: Vec<u32>,
    patterns: Vec<Trigger>,
}

/// One trigger pattern.
#[derive(Clone, Debug)]
struct Trigger {
    /// The regex as llama.cpp compiles it (a word escaped, a full pattern anchored).
    source: String,
    find: Find,
}

#[derive(Clone, Debug)]
enum Find {
    /// A word: a literal search (what its escaped regex finds, without a regex).
    Word(String),
    /// A regex searched anywhere; `full` is it wrapped as `^(?:...)$`, tried first when the
    /// regex starts with `^` and ends with `$` (llama.cpp's `regex_match`, then `regex_search`).
    Regex {
        search: Box<Regex>,
        full: Option<Box<Regex>>,
    },
}

impl Triggers {
    /// The trigger tokens and patterns. Errs when there is no trigger at all ("a lazy grammar
    /// needs at least one trigger") and when a pattern does not compile (the message names the
    /// pattern, as compiled, and the regex error).
    pub fn new(tokens: Vec<u32>, patterns: &[(TriggerKind, String)]) -> Result<Triggers, String> {
        if tokens.is_empty() && patterns.is_empty() {
            return Err("a lazy grammar needs at least one trigger".to_string());
        }
        let patterns = patterns
            .iter()
            .map(|(kind, p)| Trigger::new(*kind, p))
            .collect::<Result<_, _>>()?;
        Ok(Triggers { tokens, patterns })
    }

    /// The trigger token ids.
    pub fn tokens(&self) -> &[u32] {
        &self.tokens
    }

    /// The trigger patterns as regexes, in order (a word escaped, a full pattern anchored).
    pub fn patterns(&self) -> Vec<&str> {
        self.patterns.iter().map(|t| t.source.as_str()).collect()
    }

    /// Where the grammar starts in `text` (a byte offset, on a char boundary) by the first
    /// pattern that matches it; `searched` is the length of the text at the previous search
    /// (None for the first), which found nothing. Err names the pattern whose regex failed at
    /// run time (fancy-regex's backtracking limit).
    fn find(&self, text: &str, searched: Option<usize>) -> Result<Option<usize>, String> {
        for t in &self.patterns {
            if let Some(start) = t.find(text, searched)? {
                return Ok(Some(start));
            }
        }
        Ok(None)
    }
}

impl Trigger {
    fn new(kind: TriggerKind, pattern: &str) -> Result<Trigger, String> {
        let source = match kind {
            TriggerKind::Word => {
                return Ok(Trigger {
                    source: fancy_regex::escape(pattern).into_owned(),
                    find: Find::Word(pattern.to_string()),
                })
            }
            TriggerKind::Pattern => pattern.to_string(),
            TriggerKind::PatternFull if pattern.is_empty() => "^$".to_string(),
            TriggerKind::PatternFull => {
                let head = if pattern.starts_with('^') { "" } else { "^" };
                let tail = if pattern.ends_with('$') { "" } else { "$" };
                format!("{head}{pattern}{tail}")
            }
        };
        let compile = |re: &str| {
            Regex::new(re).map_err(|e| format!("trigger pattern {source:?} does not compile: {e}"))
        };
        let search = Box::new(compile(&source)?);
        let full = if source.starts_with('^') && source.ends_with('$') {
            Some(Box::new(compile(&format!("^(?:{source})$"))?))
        } else {
            None
        };
        Ok(Trigger {
            find: Find::Regex { search, full },
            source,
        })
    }

    /// Where the grammar starts by this pattern in `text`, if it matches: the start of the
    /// first capture group that matched a non-empty string, else of the whole match.
    fn find(&self, text: &str, searched: Option<usize>) -> Result<Option<usize>, String> {
        let (search, full) = match &self.find {
            Find::Word(w) => {
                // The text only grows and the previous search found no match: a match now ends
                // in the new text, so it starts at most len - 1 bytes before it.
                let mut from = searched.map_or(0, |n| n.saturating_sub(w.len().saturating_sub(1)));
                while !text.is_char_boundary(from) {
                    from -= 1;
                }
                return Ok(text[from..].find(w.as_str()).map(|i| from + i));
            }
            Find::Regex { search, full } => (search, full),
        };
        let failed = |e: fancy_regex::Error| {
            format!(
                "trigger pattern {:?} failed on the generated text: {e}",
                self.source
            )
        };
        // A cheap test first (the regex crate's automata when the pattern has no look-around
        // or back-reference): nearly every search finds nothing.
        for re in full.iter().chain([search]) {
            let re: &Regex = re;
            if !re.is_match(text).map_err(failed)? {
                continue;
            }
            if let Some(caps) = re.captures(text).map_err(failed)? {
                let start = (1..caps.len())
                    .filter_map(|i| caps.get(i))
                    .find(|m| !m.as_str().is_empty())
                    .or_else(|| caps.get(0))
                    .map(|m| m.start());
                if start.is_some() {
                    return Ok(start);
                }
            }
        }
        Ok(None)
    }
}

/// A lazy grammar's own state: whether it awaits its trigger, and the text generated while it
/// does.
#[derive(Clone, Debug)]
pub(crate) struct Lazy {
    pub triggers: std::sync::Arc<Triggers>,
    pub awaiting: bool,
    /// Why a trigger pattern could not be searched (the grammar then refuses every token).
    pub failure: Option<GrammarError>,
    buffer: Buffer,
}

/// The trigger buffer: the generated bytes while awaiting, each token's range in them, and
/// their text for the regexes.
#[derive(Clone, Debug, Default)]
struct Buffer {
    bytes: Vec<u8>,
    /// (token, start, end) in `bytes`, in order.
    tokens: Vec<(u32, usize, usize)>,
    /// `bytes[..decoded]` as text: each invalid UTF-8 sequence replaced by U+FFFD; an
    /// unfinished sequence at the end waits for its next bytes.
    text: String,
    decoded: usize,
    /// (text offset, byte offset) after each replaced sequence, where the two stop being at
    /// a fixed distance.
    shifts: Vec<(usize, usize)>,
    /// The text's length at the last search, which found nothing.
    searched: Option<usize>,
}

impl Buffer {
    /// Appends a token's piece and decodes what it completes.
    fn push(&mut self, token: u32, piece: &[u8]) {
        let start = self.bytes.len();
        self.bytes.extend_from_slice(piece);
        self.tokens.push((token, start, self.bytes.len()));
        while self.decoded < self.bytes.len() {
            let rest = &self.bytes[self.decoded..];
            match std::str::from_utf8(rest) {
                Ok(s) => {
                    self.text.push_str(s);
                    self.decoded = self.bytes.len();
                }
                Err(e) => {
                    let valid = e.valid_up_to();
                    let s = std::str::from_utf8(&rest[..valid]).expect("valid prefix");
                    self.text.push_str(s);
                    self.decoded += valid;
                    // None: an unfinished sequence at the end, for the next piece to complete.
                    let Some(bad) = e.error_len() else { break };
                    self.text.push(char::REPLACEMENT_CHARACTER);
                    self.decoded += bad;
                    self.shifts.push((self.text.len(), self.decoded));
                }
            }
        }
    }

    /// The byte offset of a char boundary of the text.
    fn byte_at(&self, text_pos: usize) -> usize {
        match self.shifts.partition_point(|&(t, _)| t <= text_pos) {
            0 => text_pos,
            i => {
                let (t, b) = self.shifts[i - 1];
                b + (text_pos - t)
            }
        }
    }
}

impl Lazy {
    pub fn new(triggers: std::sync::Arc<Triggers>) -> Lazy {
        Lazy {
            triggers,
            awaiting: true,
            failure: None,
            buffer: Buffer::default(),
        }
    }

    /// Back to awaiting the trigger, with an empty buffer.
    pub fn reset(&mut self) {
        self.awaiting = true;
        self.failure = None;
        self.buffer = Buffer::default();
    }

    /// A generated token while awaiting (llama.cpp's `llama_grammar_accept_impl` with
    /// `awaiting_trigger`): a trigger token ends the wait and is fed to `state`; any other is
    /// added to the buffer, which the patterns are then searched in, in order. On the first
    /// match the wait ends and every buffered token that ends after the trigger's start is fed
    /// to `state` (the one the start falls inside, its bytes from there), through
    /// `GrammarState::accept_piece` as llama.cpp does. A grammar error there is returned. A
    /// pattern that fails at run time fails the grammar (`failure`), and is returned too.
    ///
    /// Cost while awaiting: each token whose piece completes characters runs every pattern
    /// over the whole buffer (a word only over its last bytes), so a generation of n bytes
    /// that never triggers costs O(n) per token, O(n^2) in all, as in llama.cpp. A pattern
    /// without look-around or back-reference is tested by the regex crate's automata (some
    /// hundreds of MB/s: `^[\s\S]*?(<tool_call>)[\s\S]*$` takes 0.5 ms on 256 KB); one with
    /// them runs fancy-regex's backtracking VM (some tens of MB/s: gpt-oss's look-ahead
    /// trigger takes 2 ms on 64 KB, 8 ms on 256 KB) and, on a buffer of some hundreds of KB,
    /// may reach its backtracking limit, which fails the grammar. A token that completes no
    /// character (an empty piece, a lead byte) searches nothing.
    pub fn accept(
        &mut self,
        state: &mut GrammarState,
        vocab: &GrammarVocab,
        token: u32,
    ) -> Result<(), GrammarError> {
        if self.triggers.tokens.contains(&token) {
            self.awaiting = false;
            self.buffer = Buffer::default();
            return state.accept_piece(token, vocab.piece(token));
        }
        let buf = &mut self.buffer;
        buf.push(token, vocab.piece(token));
        if buf.searched == Some(buf.text.len()) {
            return Ok(());
        }
        let found = self.triggers.find(&buf.text, buf.searched);
        buf.searched = Some(buf.text.len());
        let at = match found {
            Ok(None) => return Ok(()),
            Ok(Some(at)) => at,
            Err(why) => {
                self.awaiting = false;
                self.buffer = Buffer::default();
                let e = GrammarError::TooComplex(why);
                self.failure = Some(e.clone());
                return Err(e);
            }
        };
        self.awaiting = false;
        let buf = std::mem::take(&mut self.buffer);
        let start = buf.byte_at(at);
        for &(tok, s, e) in &buf.tokens {
            if e > start {
                state.accept_piece(tok, &buf.bytes[s.max(start)..e])?;
            }
        }
        Ok(())
    }
}
