//! GBNF grammars for constrained decoding, with llama.cpp's semantics.
//!
//! A [`Grammar`] is parsed from GBNF text (llama.cpp's dialect: rules `name ::= ...`,
//! alternatives, groups, string literals and character classes with their escapes, `.`,
//! repetitions `* + ? {m} {m,} {m,n}`, comments, token references `<[id]>`, `<text>` and their
//! negations `!<...>`). A [`GrammarState`] tracks a generation in it the way llama.cpp does: a
//! set of parse stacks plus the UTF-8 sequence a token may have left unfinished. At each step
//! [`GrammarState::mask_logits`] bans every token the grammar does not allow next and
//! [`GrammarState::accept`] advances past the chosen one.
//!
//! ```
//! use muser_grammar::{Grammar, GrammarState, Vocab};
//! use std::sync::Arc;
//!
//! // Token i's bytes as the model's detokenizer renders them, and which tokens end generation.
//! let vocab = Vocab::new(
//!     vec![b"yes".to_vec(), b"no".to_vec(), b"y".to_vec(), b"es".to_vec(), b"</s>".to_vec()],
//!     vec![false, false, false, false, true],
//! );
//! let grammar = Arc::new(Grammar::parse(r#"root ::= "yes" | "no""#).unwrap());
//! let mut state = GrammarState::new(grammar);
//! let mut logits = vec![0.0f32; vocab.len()];
//! state.mask_logits(&vocab, &mut logits);
//! assert_eq!(logits, [0.0, 0.0, 0.0, f32::NEG_INFINITY, f32::NEG_INFINITY]);
//! state.accept(&vocab, 2).unwrap(); // "y"
//! assert!(state.allows(&vocab, 3) && !state.can_end());
//! state.accept(&vocab, 3).unwrap(); // "es"
//! assert!(state.must_end() && state.allows(&vocab, 4));
//! ```
//!
//! What is allowed is exactly what llama.cpp's grammar sampler allows (its own test harness
//! compares the two over whole vocabularies, `tests/python/test_grammar_llamacpp.py`):
//!
//! - a token is allowed when its bytes, decoded after the pending partial sequence, can be
//!   consumed from some stack: every whole code point by the class on top, then, if the token
//!   ends inside a UTF-8 sequence, some completion of it must fit the class on top;
//! - a token element (`<[id]>`, `!<[id]>`) on top of a stack matches by token id, whatever the
//!   token's text; it is tried while the token still has code points to give, as llama.cpp does
//!   (so, like llama.cpp, a token may be allowed whose first characters end a literal and whose
//!   id then matches a `!<[id]>`, and accepting it then fails: see [`GrammarState::accept`]);
//! - an end-of-generation token is allowed exactly when some stack is empty (the grammar can
//!   end here); a token whose piece is empty or starts with a NUL byte never is; a piece is
//!   read up to its first NUL byte;
//! - UTF-8 is decoded as llama.cpp decodes it (bytes after a lead byte inside one token are
//!   taken as continuation bytes unchecked; a sequence continued from an earlier token must go
//!   on with continuation bytes; a stray continuation byte rejects the token).
//!
//! Notes for callers:
//!
//! - build the [`Vocab`] once per model and share it (`Arc`; about 0.1 s and a 470k-node trie
//!   for a 200k vocabulary); a [`Grammar`] is immutable and `Send + Sync`; a [`GrammarState`]
//!   is per generation (`Clone + Send + Sync`);
//! - `mask_logits` on a 202k vocabulary with a JSON grammar takes about 0.25-0.4 ms per step,
//!   about 1 ms inside a JSON string where 95% of the vocabulary is allowed (`benches/mask.rs`);
//!   clones of a state share its memo behind a mutex, so masking two clones from two threads
//!   at once serializes them;
//! - an empty grammar text is an error here ([`GrammarError::Empty`]), while llama.cpp's
//!   sampler takes an empty string as "no grammar": a caller wanting that must check first;
//! - `{,n}` is not GBNF (llama.cpp refuses it too): write `{0,n}`;
//! - `<text>` references are given to the lookup with their brackets (`"<think>"`).
//!
//! Limits (llama.cpp has the first; the others keep untrusted grammars bounded): a repetition
//! count over 2000 is refused (as a maximum it means unbounded), and so are nested repetitions
//! whose counts multiply past 2000; parentheses nest at most 256 deep; a grammar expands to at
//! most 524288 elements (repetitions counted as their copies; parsing stays within some tens of
//! milliseconds) and its rule names, generated ones included, to at most 16 MiB; one step may
//! hold at most 4096 parse stacks, and one call (`allows`, `mask_logits`, `accept`, one char of
//! `accept_str`) may do a fixed budget of work, some tens of milliseconds at most: past these a
//! [`GrammarState`] fails cleanly and stays failed ([`GrammarState::failure`]) rather than drop
//! stacks, which would change the language ([`Limits`] holds these two;
//! [`GrammarState::with_limits`] sets others, or none). `{m,n}` with n < m is
//! refused (llama.cpp loops forever on it), and so is left recursion through rules that derive
//! the empty string without having an empty alternative, when it would make llama.cpp expand
//! stacks forever (llama.cpp only detects left recursion through rules with a literally empty
//! alternative).

mod parse;
mod state;
mod vocab;

#[cfg(test)]
mod tests;

pub use parse::Lookup;
use parse::{Compiled, Elem};
use state::{Cache, DEAD};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
pub use vocab::Vocab;
use vocab::{cut_at_nul, decode, Kind, Partial};

/// Why a grammar was refused or a token or text was not accepted.
#[derive(Debug, Clone, thiserror::Error)]
pub enum GrammarError {
    /// The text is not GBNF: where (1-based line and column, in chars) and what was expected.
    #[error("grammar parse error at {line}:{col}: {msg}")]
    Parse {
        /// 1-based line.
        line: usize,
        /// 1-based column, in chars.
        col: usize,
        /// What was expected and what was found.
        msg: String,
    },
    /// The grammar has no rule at all.
    #[error("empty grammar: no rule is defined")]
    Empty,
    /// A rule is used but never defined.
    #[error("undefined rule '{0}'")]
    UndefinedRule(String),
    /// A rule can derive itself without consuming input first.
    #[error("left recursion: rule '{0}' can start with itself")]
    LeftRecursion(String),
    /// No rule named `root`.
    #[error("the grammar has no 'root' rule")]
    MissingRoot,
    /// The grammar or a step of it exceeds a size limit (the grammar's size, the parse stacks
    /// one step makes, or the work one call may do). A state that hit a limit stays failed:
    /// see [`GrammarState::failure`].
    #[error("grammar too complex: {0}")]
    TooComplex(String),
    /// The token may not come next.
    #[error("token {id} ({text:?}) is not allowed by the grammar here")]
    TokenRejected {
        /// The token id.
        id: u32,
        /// Its text (lossy UTF-8).
        text: String,
    },
    /// An end-of-generation token while the grammar cannot end.
    #[error("end-of-generation token {id} is not allowed: the grammar is not complete")]
    EndNotAllowed {
        /// The token id.
        id: u32,
    },
    /// A token id past the vocabulary.
    #[error("token {id} is not in the vocabulary ({len} tokens)")]
    UnknownToken {
        /// The token id.
        id: u32,
        /// The vocabulary's size.
        len: usize,
    },
    /// Text the grammar does not accept here.
    #[error("text {text:?} is not allowed by the grammar here (rejected at char {at})")]
    TextRejected {
        /// The text.
        text: String,
        /// Index (in chars) of the first char rejected.
        at: usize,
    },
}

/// How much one call may do before a [`GrammarState`] fails (see its documentation). The
/// default bounds every call to some tens of milliseconds; a caller that trusts its grammars
/// may lift the limits ([`Limits::UNLIMITED`]), and one that serves many clients may tighten
/// them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Units of work one call may do (a rule expanded, a stack node made, a token element
    /// tested: roughly 10-25 ns each).
    pub work: u64,
    /// Parse stacks one step may make.
    pub stacks: usize,
}

impl Limits {
    /// No limit to the work or the stacks of a step: as llama.cpp, which computes every step
    /// however long it takes.
    pub const UNLIMITED: Limits = Limits {
        work: u64::MAX,
        stacks: usize::MAX,
    };
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            work: state::WORK_BUDGET,
            stacks: parse::MAX_STACKS,
        }
    }
}

/// A parsed, checked grammar (immutable; `Send + Sync`).
pub struct Grammar {
    pub(crate) elems: Vec<Elem>,
    pub(crate) classes: Vec<parse::Class>,
    pub(crate) rule_alts: Vec<Vec<u32>>,
    pub(crate) rule_names: Vec<String>,
    /// The stacks a generation starts with.
    pub(crate) initial: Vec<Vec<u32>>,
}

impl std::fmt::Debug for Grammar {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Grammar")
            .field("rules", &self.rule_names.len())
            .field("elements", &self.elems.len())
            .finish()
    }
}

impl Grammar {
    /// GBNF text, start rule "root". Token references by text (`<think>`) are refused here;
    /// use [`Grammar::parse_with_tokens`].
    pub fn parse(src: &str) -> Result<Grammar, GrammarError> {
        Self::parse_with_limits(src, None, Limits::default())
    }

    /// As parse, with `<token>` references resolved by `lookup` (text -> the single token id it
    /// is, or None). The text given to `lookup` includes the angle brackets (`"<think>"`), as
    /// llama.cpp tokenizes it (special tokens parsed). `<[123]>` id refs work in both.
    pub fn parse_with_tokens(
        src: &str,
        lookup: &dyn Fn(&str) -> Option<u32>,
    ) -> Result<Grammar, GrammarError> {
        Self::parse_with_limits(src, Some(lookup), Limits::default())
    }

    /// As parse (`lookup` as in [`Grammar::parse_with_tokens`]), expanding the root rule
    /// within `limits` rather than the default ones.
    pub fn parse_with_limits(
        src: &str,
        lookup: Option<Lookup<'_>>,
        limits: Limits,
    ) -> Result<Grammar, GrammarError> {
        Self::build(parse::compile(src, lookup)?, limits)
    }

    fn build(c: Compiled, limits: Limits) -> Result<Grammar, GrammarError> {
        let mut g = Grammar {
            elems: c.elems,
            classes: c.classes,
            rule_alts: c.rule_alts,
            rule_names: c.rule_names,
            initial: Vec::new(),
        };
        // One stack per alternative of the root, each expanded.
        let starts: Vec<Vec<u32>> = g.rule_alts[c.root as usize]
            .iter()
            .map(|&a| {
                if g.elems[a as usize] == Elem::End {
                    Vec::new()
                } else {
                    vec![a]
                }
            })
            .collect();
        let mut cache = Cache::new(limits);
        cache.begin();
        let set = cache.closed_set(&g, &starts);
        let initial = cache.stacks_of(set);
        if let Some(why) = cache.end() {
            return Err(GrammarError::TooComplex(format!(
                "expanding the root rule: {why}"
            )));
        }
        g.initial = initial;
        Ok(g)
    }

    /// Whether the whole string is in the grammar's language (test helper; char-level; false
    /// also when a step exceeds the work or stack limits).
    pub fn accepts_str(&self, s: &str) -> bool {
        let mut cache = Cache::new(Limits::default());
        cache.begin();
        let mut set = cache.state_set(self, &self.initial);
        for c in s.chars() {
            // Each char is a step of its own, with its own budget.
            cache.new_budget();
            set = cache.step(self, set, c as u32);
            if set == DEAD {
                return false;
            }
        }
        set != DEAD && cache.sets[set as usize].has_empty
    }

    /// Number of rules, generated ones (groups, repetitions) included.
    pub fn rule_count(&self) -> usize {
        self.rule_alts.len()
    }
}

/// The cache, trimmed, with a fresh work budget for one call.
fn lock(cache: &Mutex<Cache>) -> MutexGuard<'_, Cache> {
    let mut c = cache.lock().unwrap_or_else(|e| e.into_inner());
    c.trim();
    c.begin();
    c
}

/// Where a generation stands in a grammar (llama.cpp's set of stacks + partial UTF-8).
/// `Clone + Send` (and `Sync`).
///
/// Each state keeps a cache of interned stacks and memoized steps, shared by its clones (behind
/// a mutex): steps the generation takes again (inside a JSON string, say) cost a lookup.
///
/// Every call does bounded work (grammars come from untrusted clients): a step that would make
/// more than 4096 parse stacks, or need more than a fixed budget of work (about 2M expansions,
/// some tens of milliseconds), fails the state instead ([`Limits`]; [`GrammarState::with_limits`]
/// sets others). A failed state stays failed: it allows
/// no token (`mask_logits` bans them all, EOG included), `accept` and `accept_str` return
/// [`GrammarError::TooComplex`], and [`GrammarState::failure`] says why. Below the limits the
/// allowed tokens are exactly llama.cpp's; no stack is ever dropped.
#[derive(Clone)]
pub struct GrammarState {
    grammar: Arc<Grammar>,
    stacks: Vec<Vec<u32>>,
    partial: Partial,
    cache: Arc<Mutex<Cache>>,
    failure: OnceLock<GrammarError>,
}

impl std::fmt::Debug for GrammarState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GrammarState")
            .field("stacks", &self.stacks.len())
            .field("partial", &self.partial)
            .field("failure", &self.failure.get())
            .finish()
    }
}

impl GrammarState {
    /// The start of a generation.
    pub fn new(grammar: Arc<Grammar>) -> GrammarState {
        let stacks = grammar.initial.clone();
        GrammarState {
            grammar,
            stacks,
            partial: Partial::NONE,
            cache: Arc::new(Mutex::new(Cache::new(Limits::default()))),
            failure: OnceLock::new(),
        }
    }

    /// The state with other limits for its calls (a fresh memo: clones made before do not
    /// share it).
    pub fn with_limits(mut self, limits: Limits) -> GrammarState {
        self.cache = Arc::new(Mutex::new(Cache::new(limits)));
        self
    }

    /// Why the state failed, if a call exceeded a limit (see the type's documentation); the
    /// error is a [`GrammarError::TooComplex`]. Once failed, always failed.
    pub fn failure(&self) -> Option<&GrammarError> {
        self.failure.get()
    }

    /// Records a failure (the first one stays).
    fn fail(&self, why: String) -> GrammarError {
        let _ = self.failure.set(GrammarError::TooComplex(why));
        self.failure.get().expect("just set").clone()
    }

    /// The grammar.
    pub fn grammar(&self) -> &Arc<Grammar> {
        &self.grammar
    }

    fn lock(&self) -> MutexGuard<'_, Cache> {
        lock(&self.cache)
    }

    /// Whether `token` may come next (EOG tokens: only when the grammar can end here; a token
    /// with empty bytes or whose first byte is 0: never).
    pub fn allows(&self, vocab: &Vocab, token: u32) -> bool {
        let id = token as usize;
        if id >= vocab.len() || self.failure.get().is_some() {
            return false;
        }
        match vocab.kind[id] {
            Kind::Eog => return self.can_end(),
            Kind::Never => return false,
            Kind::Invalid if self.partial.remain <= 0 => return false,
            _ => {}
        }
        let mut cps = Vec::new();
        let end = decode(cut_at_nul(vocab.piece(token)), self.partial, &mut cps);
        let g = &*self.grammar;
        let mut cache = self.lock();
        let set = cache.state_set(g, &self.stacks);
        let ok = state::token_allowed(&mut cache, g, set, &cps, end, token);
        if let Some(why) = cache.end() {
            drop(cache);
            self.fail(why);
            return false;
        }
        ok
    }

    /// Sets to `f32::NEG_INFINITY` every logit whose token may not come next (`logits.len()`
    /// may be <= `vocab.len()`; index = token id; logits past the vocabulary are banned too).
    ///
    /// Cost: one walk of the vocabulary's code point trie, pruned where the grammar rejects a
    /// prefix and cut short where it loops (inside a string); steps are memoized in the state.
    pub fn mask_logits(&self, vocab: &Vocab, logits: &mut [f32]) {
        if self.failure.get().is_some() {
            logits.fill(f32::NEG_INFINITY);
            return;
        }
        let g = &*self.grammar;
        let mut cache = self.lock();
        let words = vocab.len().div_ceil(64);
        let mut allowed = std::mem::take(&mut cache.allowed);
        allowed.clear();
        allowed.resize(words, 0);
        let set = cache.state_set(g, &self.stacks);
        if set != DEAD {
            if cache.sets[set as usize].has_empty {
                for &t in &vocab.eog_ids {
                    allowed[(t >> 6) as usize] |= 1u64 << (t & 63);
                }
            }
            if self.partial.remain > 0 {
                let mut cps = Vec::new();
                for &t in &vocab.cont_start {
                    let end = decode(cut_at_nul(vocab.piece(t)), self.partial, &mut cps);
                    if state::token_allowed(&mut cache, g, set, &cps, end, t) {
                        allowed[(t >> 6) as usize] |= 1u64 << (t & 63);
                    }
                    if cache.failed() {
                        break;
                    }
                }
            } else {
                cache.allowed = allowed;
                state::mask_trie(&mut cache, g, vocab, set);
                allowed = std::mem::take(&mut cache.allowed);
            }
        }
        if let Some(why) = cache.end() {
            cache.allowed = allowed;
            drop(cache);
            self.fail(why);
            logits.fill(f32::NEG_INFINITY);
            return;
        }
        for (chunk, &bits) in logits.chunks_mut(64).zip(allowed.iter()) {
            match bits {
                u64::MAX => {}
                0 => chunk.fill(f32::NEG_INFINITY),
                _ if bits.count_ones() < 32 => {
                    // Few kept: save them, fill, put them back.
                    let mut saved = [0.0f32; 64];
                    let mut b = bits;
                    while b != 0 {
                        let k = b.trailing_zeros() as usize;
                        if k < chunk.len() {
                            saved[k] = chunk[k];
                        }
                        b &= b - 1;
                    }
                    chunk.fill(f32::NEG_INFINITY);
                    let mut b = bits;
                    while b != 0 {
                        let k = b.trailing_zeros() as usize;
                        if k < chunk.len() {
                            chunk[k] = saved[k];
                        }
                        b &= b - 1;
                    }
                }
                _ => {
                    let mut z = !bits;
                    while z != 0 {
                        let k = z.trailing_zeros() as usize;
                        if k < chunk.len() {
                            chunk[k] = f32::NEG_INFINITY;
                        }
                        z &= z - 1;
                    }
                }
            }
        }
        for l in logits.iter_mut().skip(words * 64) {
            *l = f32::NEG_INFINITY;
        }
        cache.allowed = allowed;
    }

    /// Every token that may come next, in id order (what `mask_logits` leaves finite).
    pub fn allowed_tokens(&self, vocab: &Vocab) -> Vec<u32> {
        let mut logits = vec![0.0f32; vocab.len()];
        self.mask_logits(vocab, &mut logits);
        (0..vocab.len() as u32)
            .filter(|&t| logits[t as usize] == 0.0)
            .collect()
    }

    /// Advances past a generated token. Errors (never panics) if the token is not allowed (EOG
    /// when the grammar cannot end, or bytes that leave no stack); the state is then unchanged.
    /// An allowed EOG token leaves the state as it is.
    pub fn accept(&mut self, vocab: &Vocab, token: u32) -> Result<(), GrammarError> {
        if let Some(e) = self.failure.get() {
            return Err(e.clone());
        }
        let id = token as usize;
        if id >= vocab.len() {
            return Err(GrammarError::UnknownToken {
                id: token,
                len: vocab.len(),
            });
        }
        if vocab.kind[id] == Kind::Eog {
            return if self.can_end() {
                Ok(())
            } else {
                Err(GrammarError::EndNotAllowed { id: token })
            };
        }
        if !self.allows(vocab, token) {
            if let Some(e) = self.failure.get() {
                return Err(e.clone());
            }
            return Err(GrammarError::TokenRejected {
                id: token,
                text: String::from_utf8_lossy(vocab.piece(token)).into_owned(),
            });
        }
        self.advance(token, vocab.piece(token))
    }

    /// Advances past token `token` read as the bytes `piece` in place of its own text:
    /// llama.cpp's `llama_grammar_accept_token`, through which its lazy grammars replay the
    /// tokens that completed a trigger (the token a trigger starts inside is fed its bytes from
    /// there on). Stacks with a token element on top match `token` by id; the others take the
    /// code points of `piece` (read up to a NUL byte) after the pending partial UTF-8 sequence,
    /// and the state keeps the sequence `piece` leaves unfinished. Unlike
    /// [`GrammarState::accept`] nothing is checked first, as in llama.cpp: an end-of-generation
    /// token is read as its bytes, an empty piece leaves the character stacks as they are, invalid
    /// UTF-8 is skipped as llama.cpp skips it, and a piece ending inside a UTF-8 sequence that no
    /// class can complete is taken (every token is rejected after it). Errors if no stack
    /// survives; the state is then unchanged.
    pub fn accept_piece(&mut self, token: u32, piece: &[u8]) -> Result<(), GrammarError> {
        if let Some(e) = self.failure.get() {
            return Err(e.clone());
        }
        self.advance(token, piece)
    }

    /// `accept_piece` without the failure check.
    fn advance(&mut self, token: u32, piece: &[u8]) -> Result<(), GrammarError> {
        let rejected = || GrammarError::TokenRejected {
            id: token,
            text: String::from_utf8_lossy(piece).into_owned(),
        };
        let mut cps = Vec::new();
        let end = decode(cut_at_nul(piece), self.partial, &mut cps);
        let g = &*self.grammar;
        let mut cache = lock(&self.cache);
        let set = cache.state_set(g, &self.stacks);
        // Stacks with a class on top take the code points (all of them, or stay as they are if
        // the token completes none); stacks with a token element on top take the token.
        let mut ids = if set == DEAD {
            // Only when interning the state's stacks ran out of budget (failure set).
            Vec::new()
        } else if cps.is_empty() {
            cache.char_top_stacks(set)
        } else {
            let mut s = set;
            for &c in &cps {
                s = cache.step(g, s, c);
                if s == DEAD {
                    break;
                }
            }
            if s == DEAD {
                Vec::new()
            } else {
                cache.sets[s as usize].stacks.to_vec()
            }
        };
        if set != DEAD {
            ids.extend(cache.token_step(g, set, token));
        }
        ids.sort_unstable();
        ids.dedup();
        let max_stacks = cache.limits().stacks;
        if ids.len() > max_stacks {
            cache.failure.get_or_insert_with(|| {
                format!(
                    "accepting token {token} makes {} parse stacks, more than the limit of {max_stacks}",
                    ids.len()
                )
            });
        }
        let stacks = if ids.is_empty() || cache.failed() {
            Vec::new()
        } else {
            let new_set = cache.set_of(g, &ids);
            cache.stacks_of(new_set)
        };
        if let Some(why) = cache.end() {
            drop(cache);
            return Err(self.fail(why));
        }
        if stacks.is_empty() {
            return Err(rejected());
        }
        self.stacks = stacks;
        self.partial = end;
        Ok(())
    }

    /// Advances past text (chars); errors if rejected (the state is then unchanged).
    pub fn accept_str(&mut self, s: &str) -> Result<(), GrammarError> {
        if let Some(e) = self.failure.get() {
            return Err(e.clone());
        }
        let mut cps = Vec::new();
        let end = decode(s.as_bytes(), self.partial, &mut cps);
        let rejected = |at: usize| GrammarError::TextRejected {
            text: s.to_string(),
            at,
        };
        if end.remain < 0 {
            return Err(rejected(0));
        }
        let g = &*self.grammar;
        let mut cache = lock(&self.cache);
        let mut set = cache.state_set(g, &self.stacks);
        let mut rejected_at = None;
        for (i, &c) in cps.iter().enumerate() {
            if set == DEAD {
                break;
            }
            // Each char is a step of its own, with its own budget.
            cache.new_budget();
            set = cache.step(g, set, c);
            if set == DEAD {
                rejected_at = Some(i);
            }
        }
        let stacks = if set == DEAD {
            Vec::new()
        } else {
            cache.stacks_of(set)
        };
        if let Some(why) = cache.end() {
            drop(cache);
            return Err(self.fail(why));
        }
        if set == DEAD {
            return Err(rejected(rejected_at.unwrap_or(0)));
        }
        self.stacks = stacks;
        self.partial = end;
        Ok(())
    }

    /// Whether the grammar may end here (an EOG token would be allowed).
    pub fn can_end(&self) -> bool {
        self.failure.get().is_none() && self.stacks.iter().any(|s| s.is_empty())
    }

    /// Whether nothing but ending is possible (every stack is finished) — lets a caller stop
    /// early.
    pub fn must_end(&self) -> bool {
        self.failure.get().is_none()
            && !self.stacks.is_empty()
            && self.stacks.iter().all(|s| s.is_empty())
    }
}
