//! GBNF text -> rules, then the checks (undefined rules, root, left recursion) and the flat
//! element layout the runtime walks.
//!
//! The parser is a recursive descent over the bytes of the source. It reproduces llama.cpp's
//! grammar language: the same tokens, the same places where a newline may appear, the same
//! rewriting of repetitions into generated rules (so the same element sequences, which matter
//! for partial UTF-8 and token matching), the same limits, and the same rule-name bookkeeping
//! (generated rules are named `<rule>_<n>` in the same symbol table as user rules).

use crate::GrammarError;
use std::collections::HashMap;

/// llama.cpp's repetition limit: a count above it is refused (`{m}` with m over it) or, as a
/// maximum, means "no maximum"; the product of nested repetition counts is capped at it too.
pub(crate) const MAX_REPETITION: u64 = 2000;
/// Nesting depth of parentheses (llama.cpp has none; ours keeps recursion bounded).
pub(crate) const MAX_NESTING: usize = 256;
/// Total number of grammar elements after expanding repetitions (parsing stays within some
/// tens of milliseconds and tens of MB).
pub(crate) const MAX_ELEMENTS: usize = 1 << 19;
/// Total bytes of rule names, generated ones (`<rule>_<n>`, one per group and repetition
/// copy) included.
pub(crate) const MAX_NAME_BYTES: usize = 1 << 24;
/// Number of parse stacks one step may produce before the grammar counts as too ambiguous
/// (llama.cpp's own grammars need a few dozen at most).
pub(crate) const MAX_STACKS: usize = 1 << 12;

/// One item of an alternative while parsing.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub(crate) enum Item {
    Class(u32),
    Ref(u32),
    Token(u32),
    TokenNot(u32),
}

/// One element of the flat layout: every alternative of every rule is a run of elements ended
/// by `End`. A parse stack holds indices into this layout.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub(crate) enum Elem {
    End,
    Class(u32),
    Ref(u32),
    Token(u32),
    TokenNot(u32),
}

/// A character class: `"x"` (one char), `[...]`, `[^...]` or `.`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct Class {
    pub negated: bool,
    pub any: bool,
    /// The ranges as written, inverted ones (`[z-a]`) included: partial UTF-8 tests use them.
    pub raw: Vec<(u32, u32)>,
    /// The non-empty ranges, sorted and merged: for matching a whole code point.
    pub norm: Vec<(u32, u32)>,
}

impl Class {
    fn new(negated: bool, any: bool, raw: Vec<(u32, u32)>) -> Class {
        let mut norm: Vec<(u32, u32)> = raw.iter().copied().filter(|&(a, b)| a <= b).collect();
        norm.sort_unstable();
        let mut merged: Vec<(u32, u32)> = Vec::with_capacity(norm.len());
        for (a, b) in norm {
            match merged.last_mut() {
                Some(last) if a <= last.1.saturating_add(1) => last.1 = last.1.max(b),
                _ => merged.push((a, b)),
            }
        }
        Class {
            negated,
            any,
            raw,
            norm: merged,
        }
    }

    /// Whether the whole code point `c` is in the class.
    #[inline]
    pub fn matches(&self, c: u32) -> bool {
        if self.any {
            return true;
        }
        let inside = if self.norm.len() <= 8 {
            self.norm.iter().any(|&(a, b)| a <= c && c <= b)
        } else {
            // Sorted, disjoint ranges: the last one starting at or below c decides.
            let k = self.norm.partition_point(|&(a, _)| a <= c);
            k > 0 && c <= self.norm[k - 1].1
        };
        inside != self.negated
    }

    /// Whether a code point of the class may start with the partial UTF-8 sequence `p` (llama.cpp's
    /// test: any range meeting the interval of completions decides, so a negated class refuses
    /// as soon as one of its ranges meets it).
    pub fn matches_partial(&self, p: crate::vocab::Partial) -> bool {
        let (value, remain) = (p.value, p.remain);
        if remain < 0 || (remain == 1 && value < 2) {
            return false;
        }
        let shift = 6 * remain as u32;
        let mut low = value << shift;
        let high = low | ((1u32 << shift) - 1);
        if low == 0 {
            if remain == 2 {
                low = 1 << 11;
            } else if remain == 3 {
                low = 1 << 16;
            }
        }
        if self.any {
            return true;
        }
        let meets = self.raw.iter().any(|&(a, b)| a <= high && low <= b);
        meets != self.negated
    }

    /// Some(m) when every code point from 128 up matches (m = true) or none does (m = false).
    pub fn uniform_above_ascii(&self) -> Option<bool> {
        if self.any {
            return Some(true);
        }
        let mut any_meet = false;
        let mut covers = false;
        for &(a, b) in &self.norm {
            if b >= 128 {
                any_meet = true;
                if a <= 128 && b == u32::MAX {
                    covers = true;
                }
            }
        }
        let m = if covers {
            true
        } else if !any_meet {
            false
        } else {
            return None;
        };
        Some(m != self.negated)
    }
}

/// The checked grammar in its flat layout.
pub(crate) struct Compiled {
    pub elems: Vec<Elem>,
    pub classes: Vec<Class>,
    /// For each rule, where each of its alternatives starts in `elems`.
    pub rule_alts: Vec<Vec<u32>>,
    pub rule_names: Vec<String>,
    pub root: u32,
}

struct Parser<'a> {
    src: &'a [u8],
    pos: usize,
    lookup: Option<Lookup<'a>>,
    symbols: HashMap<String, u32>,
    rules: Vec<Option<Vec<Vec<Item>>>>,
    classes: Vec<Class>,
    class_ids: HashMap<Class, u32>,
    n_items: usize,
    name_bytes: usize,
    depth: usize,
}

type PResult<T> = Result<T, GrammarError>;

/// Resolves a `<text>` token reference to the one token it is.
/// Resolves a `<text>` token reference (the text with its angle brackets) to the single token it is.
pub type Lookup<'a> = &'a dyn Fn(&str) -> Option<u32>;

fn is_word(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'-'
}

fn describe(src: &[u8], at: usize) -> String {
    if at >= src.len() {
        return "end of input".to_string();
    }
    let rest = &src[at..];
    let end = rest
        .iter()
        .position(|&b| b == b'\n' || b == b'\r')
        .unwrap_or(rest.len())
        .min(24);
    let mut s = String::from_utf8_lossy(&rest[..end]).into_owned();
    if s.is_empty() {
        s = "end of line".to_string();
        return s;
    }
    format!("'{s}'")
}

impl<'a> Parser<'a> {
    fn at(&self, i: usize) -> u8 {
        self.src.get(i).copied().unwrap_or(0)
    }

    fn cur(&self) -> u8 {
        self.at(self.pos)
    }

    fn error_at(&self, at: usize, msg: impl Into<String>) -> GrammarError {
        let at = at.min(self.src.len());
        let before = &self.src[..at];
        let line = before.iter().filter(|&&b| b == b'\n').count() + 1;
        let line_start = before
            .iter()
            .rposition(|&b| b == b'\n')
            .map_or(0, |p| p + 1);
        let col = String::from_utf8_lossy(&before[line_start..])
            .chars()
            .count()
            + 1;
        GrammarError::Parse {
            line,
            col,
            msg: format!("{}, found {}", msg.into(), describe(self.src, at)),
        }
    }

    fn error(&self, msg: impl Into<String>) -> GrammarError {
        self.error_at(self.pos, msg)
    }

    fn charge(&mut self, n: usize) -> PResult<()> {
        self.n_items += n;
        if self.n_items > MAX_ELEMENTS {
            return Err(GrammarError::TooComplex(format!(
                "the grammar expands to more than {MAX_ELEMENTS} elements (repetitions counted as their copies)"
            )));
        }
        Ok(())
    }

    fn charge_name(&mut self, len: usize) -> PResult<()> {
        self.name_bytes += len;
        if self.name_bytes > MAX_NAME_BYTES {
            return Err(GrammarError::TooComplex(format!(
                "rule names take more than {MAX_NAME_BYTES} bytes (each group and repetition copy \
                 makes a rule named after its rule: shorten long rule names)"
            )));
        }
        Ok(())
    }

    fn skip_space(&mut self, newline_ok: bool) {
        loop {
            match self.cur() {
                b' ' | b'\t' => self.pos += 1,
                b'\r' | b'\n' if newline_ok => self.pos += 1,
                b'#' => {
                    while !matches!(self.cur(), 0 | b'\r' | b'\n') {
                        self.pos += 1;
                    }
                }
                _ => return,
            }
        }
    }

    fn symbol(&mut self, name: &str) -> PResult<u32> {
        if let Some(&id) = self.symbols.get(name) {
            return Ok(id);
        }
        self.charge_name(name.len())?;
        let next = self.symbols.len() as u32;
        self.symbols.insert(name.to_string(), next);
        Ok(next)
    }

    /// A new rule id named after `base` (llama.cpp's scheme: `base_<id>`; a user's rule name
    /// cannot hold '_', so it never clashes).
    fn generate(&mut self, base: &str) -> PResult<u32> {
        self.charge_name(base.len() + 8)?;
        let next = self.symbols.len() as u32;
        self.symbols.insert(format!("{base}_{next}"), next);
        Ok(next)
    }

    fn add_rule(&mut self, id: u32, alts: Vec<Vec<Item>>) {
        let id = id as usize;
        if self.rules.len() <= id {
            self.rules.resize(id + 1, None);
        }
        self.rules[id] = Some(alts);
    }

    fn class(&mut self, class: Class) -> u32 {
        if let Some(&id) = self.class_ids.get(&class) {
            return id;
        }
        let id = self.classes.len() as u32;
        self.classes.push(class.clone());
        self.class_ids.insert(class, id);
        id
    }

    fn parse_name(&mut self) -> PResult<String> {
        let start = self.pos;
        while is_word(self.cur()) {
            self.pos += 1;
        }
        if self.pos == start {
            return Err(self.error("expected a rule name"));
        }
        Ok(String::from_utf8_lossy(&self.src[start..self.pos]).into_owned())
    }

    fn parse_int(&mut self, what: &str) -> PResult<u64> {
        let start = self.pos;
        let mut value: u64 = 0;
        let mut overflow = false;
        while self.cur().is_ascii_digit() {
            let d = (self.cur() - b'0') as u64;
            match value.checked_mul(10).and_then(|v| v.checked_add(d)) {
                Some(v) => value = v,
                None => overflow = true,
            }
            self.pos += 1;
        }
        if self.pos == start {
            return Err(self.error(format!("expected {what}")));
        }
        if overflow {
            return Err(self.error_at(start, format!("{what} is too large")));
        }
        Ok(value)
    }

    fn parse_hex(&mut self, digits: usize) -> PResult<u32> {
        let start = self.pos;
        let mut value: u32 = 0;
        for _ in 0..digits {
            let d = match self.cur() {
                c @ b'0'..=b'9' => c - b'0',
                c @ b'a'..=b'f' => c - b'a' + 10,
                c @ b'A'..=b'F' => c - b'A' + 10,
                _ => {
                    return Err(self.error_at(
                        start,
                        format!("expected {digits} hexadecimal digits in escape"),
                    ))
                }
            };
            value = (value << 4) | d as u32;
            self.pos += 1;
        }
        Ok(value)
    }

    /// One character of a literal or class: an escape or one UTF-8 char.
    fn parse_char(&mut self) -> PResult<u32> {
        let c = self.cur();
        if c == b'\\' {
            let esc = self.at(self.pos + 1);
            let start = self.pos;
            self.pos += 2;
            return match esc {
                b'x' => self.parse_hex(2),
                b'u' => self.parse_hex(4),
                b'U' => self.parse_hex(8),
                b't' => Ok('\t' as u32),
                b'r' => Ok('\r' as u32),
                b'n' => Ok('\n' as u32),
                b'\\' | b'"' | b'[' | b']' | b'-' => Ok(esc as u32),
                _ => Err(self.error_at(
                    start,
                    "unknown escape (expected one of \\x \\u \\U \\t \\r \\n \\\\ \\\" \\[ \\] \\-)",
                )),
            };
        }
        if c == 0 {
            return Err(self.error("unexpected end of input"));
        }
        // The source is a &str cut at a NUL, so a whole UTF-8 char starts here.
        let len = match c {
            0x00..=0x7f => 1,
            0xc0..=0xdf => 2,
            0xe0..=0xef => 3,
            _ => 4,
        };
        let end = (self.pos + len).min(self.src.len());
        let ch = std::str::from_utf8(&self.src[self.pos..end])
            .ok()
            .and_then(|s| s.chars().next())
            .map_or(c as u32, |ch| ch as u32);
        self.pos = end;
        Ok(ch)
    }

    /// `<[id]>` or `<text>` (the text, brackets included, looked up as one token).
    fn parse_token(&mut self) -> PResult<u32> {
        let start = self.pos;
        if self.cur() != b'<' {
            return Err(self.error("expected '<' after '!'"));
        }
        self.pos += 1;
        if self.cur() == b'[' {
            self.pos += 1;
            let id = self.parse_int("a token id")?;
            if id > u32::MAX as u64 {
                return Err(self.error_at(start, "token id is too large"));
            }
            if self.cur() != b']' {
                return Err(self.error("expected ']' after the token id"));
            }
            self.pos += 1;
            if self.cur() != b'>' {
                return Err(self.error("expected '>' after ']'"));
            }
            self.pos += 1;
            return Ok(id as u32);
        }
        let Some(lookup) = self.lookup else {
            return Err(self.error_at(
                start,
                "a token given by its text (<...>) needs a vocabulary (Grammar::parse_with_tokens); expected <[id]>",
            ));
        };
        while !matches!(self.cur(), 0 | b'>') {
            self.pos += 1;
        }
        if self.cur() != b'>' {
            return Err(self.error("expected '>' closing the token"));
        }
        self.pos += 1;
        let text = String::from_utf8_lossy(&self.src[start..self.pos]).into_owned();
        match lookup(&text) {
            Some(id) => Ok(id),
            None => Err(self.error_at(
                start,
                format!("invalid token {text}: expected the text of exactly one token"),
            )),
        }
    }

    fn repeat(
        &mut self,
        items: &mut Vec<Item>,
        last_start: usize,
        n_prev: &mut u64,
        (min, max): (u64, Option<u64>),
        rule_name: &str,
        op_at: usize,
    ) -> PResult<()> {
        if last_start == items.len() {
            return Err(self.error_at(op_at, "expected an item before the repetition operator"));
        }
        let total = match max {
            Some(m) if m > 0 => m,
            _ if min > 0 => min,
            _ => 1,
        };
        if n_prev.saturating_mul(total) > MAX_REPETITION {
            return Err(self.error_at(
                op_at,
                format!("nested repetitions expand to more than {MAX_REPETITION} copies"),
            ));
        }
        if let Some(m) = max {
            if m < min {
                return Err(self.error_at(
                    op_at,
                    format!("repetition maximum {m} is below its minimum {min}"),
                ));
            }
        }
        let prev: Vec<Item> = items[last_start..].to_vec();
        if min == 0 {
            items.truncate(last_start);
        } else {
            self.charge(prev.len() * (min as usize - 1))?;
            for _ in 1..min {
                items.extend_from_slice(&prev);
            }
        }
        let n_opt = match max {
            None => 1,
            Some(m) => m - min,
        };
        let mut last_rec = 0;
        for i in 0..n_opt {
            let id = self.generate(rule_name)?;
            self.charge(prev.len() + 3)?;
            let mut alt = prev.clone();
            if max.is_none() {
                alt.push(Item::Ref(id));
            } else if i > 0 {
                alt.push(Item::Ref(last_rec));
            }
            self.add_rule(id, vec![alt, Vec::new()]);
            last_rec = id;
        }
        if n_opt > 0 {
            items.push(Item::Ref(last_rec));
        }
        *n_prev *= total;
        Ok(())
    }

    fn parse_sequence(&mut self, rule_name: &str, nested: bool) -> PResult<Vec<Item>> {
        let mut items: Vec<Item> = Vec::new();
        let mut last_start = 0usize;
        let mut n_prev: u64 = 1;
        loop {
            let c = self.cur();
            let op_at = self.pos;
            match c {
                b'"' => {
                    self.pos += 1;
                    last_start = items.len();
                    n_prev = 1;
                    while self.cur() != b'"' {
                        if self.cur() == 0 {
                            return Err(self.error("unterminated string literal: expected '\"'"));
                        }
                        let ch = self.parse_char()?;
                        let id = self.class(Class::new(false, false, vec![(ch, ch)]));
                        self.charge(1)?;
                        items.push(Item::Class(id));
                    }
                    self.pos += 1;
                    self.skip_space(nested);
                }
                b'[' => {
                    self.pos += 1;
                    let negated = self.cur() == b'^';
                    if negated {
                        self.pos += 1;
                    }
                    last_start = items.len();
                    n_prev = 1;
                    let mut ranges = Vec::new();
                    while self.cur() != b']' {
                        if self.cur() == 0 {
                            return Err(self.error("unterminated character class: expected ']'"));
                        }
                        let lo = self.parse_char()?;
                        let mut hi = lo;
                        if self.cur() == b'-' && self.at(self.pos + 1) != b']' {
                            if self.at(self.pos + 1) == 0 {
                                self.pos += 1;
                                return Err(self.error("unexpected end of input in a range"));
                            }
                            self.pos += 1;
                            hi = self.parse_char()?;
                        }
                        ranges.push((lo, hi));
                    }
                    self.pos += 1;
                    // `[]` and `[^]` add nothing, as in llama.cpp.
                    if !ranges.is_empty() {
                        let id = self.class(Class::new(negated, false, ranges));
                        self.charge(1)?;
                        items.push(Item::Class(id));
                    }
                    self.skip_space(nested);
                }
                b'<' | b'!' => {
                    let negated = c == b'!';
                    if negated {
                        self.pos += 1;
                    }
                    let id = self.parse_token()?;
                    last_start = items.len();
                    n_prev = 1;
                    self.charge(1)?;
                    items.push(if negated {
                        Item::TokenNot(id)
                    } else {
                        Item::Token(id)
                    });
                    self.skip_space(nested);
                }
                c if is_word(c) => {
                    let name = self.parse_name()?;
                    let id = self.symbol(&name)?;
                    self.skip_space(nested);
                    last_start = items.len();
                    n_prev = 1;
                    self.charge(1)?;
                    items.push(Item::Ref(id));
                }
                b'(' => {
                    self.pos += 1;
                    self.skip_space(true);
                    if self.depth >= MAX_NESTING {
                        return Err(self.error_at(
                            op_at,
                            format!("parentheses nested deeper than {MAX_NESTING}"),
                        ));
                    }
                    let before = self.symbols.len();
                    let sub = self.generate(rule_name)?;
                    self.depth += 1;
                    self.parse_alternates(rule_name, sub, true)?;
                    self.depth -= 1;
                    n_prev = (self.symbols.len() - before).max(1) as u64;
                    last_start = items.len();
                    self.charge(1)?;
                    items.push(Item::Ref(sub));
                    if self.cur() != b')' {
                        return Err(self.error("expected ')'"));
                    }
                    self.pos += 1;
                    self.skip_space(nested);
                }
                b'.' => {
                    self.pos += 1;
                    last_start = items.len();
                    n_prev = 1;
                    let id = self.class(Class::new(false, true, Vec::new()));
                    self.charge(1)?;
                    items.push(Item::Class(id));
                    self.skip_space(nested);
                }
                b'*' | b'+' | b'?' => {
                    self.pos += 1;
                    self.skip_space(nested);
                    let (min, max) = match c {
                        b'*' => (0, None),
                        b'+' => (1, None),
                        _ => (0, Some(1)),
                    };
                    self.repeat(
                        &mut items,
                        last_start,
                        &mut n_prev,
                        (min, max),
                        rule_name,
                        op_at,
                    )?;
                }
                b'{' => {
                    self.pos += 1;
                    self.skip_space(nested);
                    if !self.cur().is_ascii_digit() {
                        return Err(self.error("expected an integer after '{'"));
                    }
                    let min = self.parse_int("an integer")?;
                    self.skip_space(nested);
                    let mut max = Some(min);
                    if self.cur() == b'}' {
                        self.pos += 1;
                        self.skip_space(nested);
                    } else if self.cur() == b',' {
                        self.pos += 1;
                        self.skip_space(nested);
                        max = None;
                        if self.cur().is_ascii_digit() {
                            max = Some(self.parse_int("an integer")?);
                            self.skip_space(nested);
                        }
                        if self.cur() != b'}' {
                            return Err(self.error("expected '}'"));
                        }
                        self.pos += 1;
                        self.skip_space(nested);
                    } else {
                        return Err(self.error("expected ',' or '}'"));
                    }
                    if min > MAX_REPETITION {
                        return Err(self.error_at(
                            op_at,
                            format!("repetition count {min} exceeds the limit of {MAX_REPETITION}"),
                        ));
                    }
                    if matches!(max, Some(m) if m > MAX_REPETITION) {
                        max = None;
                    }
                    self.repeat(
                        &mut items,
                        last_start,
                        &mut n_prev,
                        (min, max),
                        rule_name,
                        op_at,
                    )?;
                }
                _ => break,
            }
        }
        Ok(items)
    }

    fn parse_alternates(&mut self, rule_name: &str, rule_id: u32, nested: bool) -> PResult<()> {
        let mut alts = vec![self.parse_sequence(rule_name, nested)?];
        while self.cur() == b'|' {
            self.pos += 1;
            self.skip_space(true);
            alts.push(self.parse_sequence(rule_name, nested)?);
        }
        self.charge(alts.len())?;
        self.add_rule(rule_id, alts);
        Ok(())
    }

    fn parse_rule(&mut self) -> PResult<()> {
        let name = self.parse_name()?;
        self.skip_space(false);
        let id = self.symbol(&name)?;
        if !self.src[self.pos.min(self.src.len())..].starts_with(b"::=") {
            return Err(self.error(format!("expected '::=' after rule name '{name}'")));
        }
        self.pos += 3;
        self.skip_space(true);
        self.parse_alternates(&name, id, false)?;
        match self.cur() {
            b'\r' => self.pos += if self.at(self.pos + 1) == b'\n' { 2 } else { 1 },
            b'\n' => self.pos += 1,
            0 => {}
            _ => return Err(self.error("expected a newline or the end of input")),
        }
        self.skip_space(true);
        Ok(())
    }
}

/// Parses and checks `src`; `lookup` resolves `<text>` token references.
pub(crate) fn compile(src: &str, lookup: Option<Lookup<'_>>) -> Result<Compiled, GrammarError> {
    // llama.cpp reads the grammar as a C string: a NUL ends it.
    let bytes = src.as_bytes();
    let bytes = &bytes[..bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len())];
    let mut p = Parser {
        src: bytes,
        pos: 0,
        lookup,
        symbols: HashMap::new(),
        rules: Vec::new(),
        classes: Vec::new(),
        class_ids: HashMap::new(),
        n_items: 0,
        name_bytes: 0,
        depth: 0,
    };
    p.skip_space(true);
    while p.cur() != 0 {
        p.parse_rule()?;
    }
    let mut names = vec![String::new(); p.symbols.len().max(p.rules.len())];
    // One name per id (generated names hold a '_', which user names cannot).
    let mut sorted: Vec<(&String, &u32)> = p.symbols.iter().collect();
    sorted.sort();
    for (name, &id) in sorted {
        let slot = &mut names[id as usize];
        if slot.is_empty() {
            *slot = name.clone();
        }
    }
    let name_of = |id: u32| -> String {
        names
            .get(id as usize)
            .filter(|n| !n.is_empty())
            .cloned()
            .unwrap_or_else(|| format!("#{id}"))
    };
    if p.rules.is_empty() {
        return Err(GrammarError::Empty);
    }
    for (id, rule) in p.rules.iter().enumerate() {
        let Some(alts) = rule else {
            return Err(GrammarError::UndefinedRule(name_of(id as u32)));
        };
        for item in alts.iter().flatten() {
            if let Item::Ref(r) = *item {
                if p.rules.get(r as usize).is_none_or(|r| r.is_none()) {
                    return Err(GrammarError::UndefinedRule(name_of(r)));
                }
            }
        }
    }
    let Some(&root) = p.symbols.get("root") else {
        return Err(GrammarError::MissingRoot);
    };
    let rules: Vec<Vec<Vec<Item>>> = p.rules.into_iter().map(|r| r.unwrap_or_default()).collect();
    if let Some(r) = left_recursion(&rules) {
        return Err(GrammarError::LeftRecursion(name_of(r)));
    }
    if let Some(r) = endless_expansion(&rules, root) {
        return Err(GrammarError::LeftRecursion(name_of(r)));
    }
    let mut elems = Vec::with_capacity(p.n_items + rules.len());
    let mut rule_alts = Vec::with_capacity(rules.len());
    for alts in &rules {
        let mut starts = Vec::with_capacity(alts.len());
        for alt in alts {
            starts.push(elems.len() as u32);
            elems.extend(alt.iter().map(|it| match *it {
                Item::Class(c) => Elem::Class(c),
                Item::Ref(r) => Elem::Ref(r),
                Item::Token(t) => Elem::Token(t),
                Item::TokenNot(t) => Elem::TokenNot(t),
            }));
            elems.push(Elem::End);
        }
        rule_alts.push(starts);
    }
    let rule_names = (0..rules.len() as u32).map(name_of).collect();
    Ok(Compiled {
        elems,
        classes: p.classes,
        rule_alts,
        rule_names,
        root,
    })
}

/// Finds a cycle in a directed graph given as adjacency lists (iteratively); returns a node on
/// one, preferring the lowest-numbered such node.
fn find_cycle(adj: &[Vec<(u32, bool)>], only_marked: bool) -> Option<u32> {
    // Tarjan's strongly connected components, iterative.
    let n = adj.len();
    const UNSEEN: u32 = u32::MAX;
    let mut index = vec![UNSEEN; n];
    let mut low = vec![0u32; n];
    let mut on_stack = vec![false; n];
    let mut comp = vec![u32::MAX; n];
    let mut comp_stack: Vec<u32> = Vec::new();
    let mut counter = 0u32;
    let mut best: Option<u32> = None;
    for start in 0..n {
        if index[start] != UNSEEN {
            continue;
        }
        let mut call: Vec<(u32, usize)> = vec![(start as u32, 0)];
        index[start] = counter;
        low[start] = counter;
        counter += 1;
        comp_stack.push(start as u32);
        on_stack[start] = true;
        while let Some(&mut (v, ref mut next)) = call.last_mut() {
            let vu = v as usize;
            if *next < adj[vu].len() {
                let (w, _) = adj[vu][*next];
                *next += 1;
                let wu = w as usize;
                if index[wu] == UNSEEN {
                    index[wu] = counter;
                    low[wu] = counter;
                    counter += 1;
                    comp_stack.push(w);
                    on_stack[wu] = true;
                    call.push((w, 0));
                } else if on_stack[wu] {
                    low[vu] = low[vu].min(index[wu]);
                }
                continue;
            }
            call.pop();
            if let Some(&(parent, _)) = call.last() {
                low[parent as usize] = low[parent as usize].min(low[vu]);
            }
            if low[vu] == index[vu] {
                let mut members = Vec::new();
                loop {
                    let w = comp_stack.pop().expect("component stack");
                    on_stack[w as usize] = false;
                    comp[w as usize] = v;
                    members.push(w);
                    if w == v {
                        break;
                    }
                }
                let cyclic = members.iter().any(|&m| {
                    adj[m as usize]
                        .iter()
                        .any(|&(t, mark)| comp[t as usize] == v && (mark || !only_marked))
                });
                if cyclic {
                    let m = *members.iter().min().expect("non-empty component");
                    best = Some(best.map_or(m, |b| b.min(m)));
                }
            }
        }
    }
    best
}

/// llama.cpp's left-recursion test: a rule may start with itself through rule references that
/// come first in an alternative or follow only references to rules having an empty alternative.
fn left_recursion(rules: &[Vec<Vec<Item>>]) -> Option<u32> {
    let may_be_empty: Vec<bool> = rules
        .iter()
        .map(|alts| alts.iter().any(|a| a.is_empty()))
        .collect();
    let adj: Vec<Vec<(u32, bool)>> = rules
        .iter()
        .map(|alts| {
            let mut out = Vec::new();
            for alt in alts {
                for item in alt {
                    match *item {
                        Item::Ref(r) => {
                            out.push((r, true));
                            if !may_be_empty[r as usize] {
                                break;
                            }
                        }
                        _ => break,
                    }
                }
            }
            out
        })
        .collect();
    find_cycle(&adj, false)
}

/// Left recursion that llama.cpp's test misses (through rules that derive the empty string
/// without having an empty alternative) and that makes the stack expansion endless: a cycle of
/// leftmost references, among rules reachable from the root, in which some reference is
/// followed by more of its alternative (so every turn grows the stack). llama.cpp would loop
/// until out of memory on these; cycles of references in last position only are finite and
/// accepted.
fn endless_expansion(rules: &[Vec<Vec<Item>>], root: u32) -> Option<u32> {
    let n = rules.len();
    // Which rules derive the empty string (counter-based fixpoint, linear).
    let mut nullable = vec![false; n];
    let mut uses: Vec<Vec<(usize, usize)>> = vec![Vec::new(); n];
    let mut pending: Vec<Vec<usize>> = Vec::with_capacity(n);
    let mut work: Vec<usize> = Vec::new();
    for (r, alts) in rules.iter().enumerate() {
        let mut counts = Vec::with_capacity(alts.len());
        for (a, alt) in alts.iter().enumerate() {
            let terminal = alt.iter().any(|it| !matches!(it, Item::Ref(_)));
            let count = if terminal { usize::MAX } else { alt.len() };
            if count == 0 && !nullable[r] {
                nullable[r] = true;
                work.push(r);
            }
            if !terminal {
                for it in alt {
                    if let Item::Ref(s) = *it {
                        uses[s as usize].push((r, a));
                    }
                }
            }
            counts.push(count);
        }
        pending.push(counts);
    }
    while let Some(s) = work.pop() {
        for &(r, a) in &uses[s] {
            let c = &mut pending[r][a];
            if *c != usize::MAX && *c > 0 {
                *c -= 1;
                if *c == 0 && !nullable[r] {
                    nullable[r] = true;
                    work.push(r);
                }
            }
        }
    }
    // Rules reachable from the root.
    let mut reach = vec![false; n];
    let mut todo = vec![root as usize];
    reach[root as usize] = true;
    while let Some(r) = todo.pop() {
        for it in rules[r].iter().flatten() {
            if let Item::Ref(s) = *it {
                if !reach[s as usize] {
                    reach[s as usize] = true;
                    todo.push(s as usize);
                }
            }
        }
    }
    let adj: Vec<Vec<(u32, bool)>> = rules
        .iter()
        .enumerate()
        .map(|(r, alts)| {
            let mut out = Vec::new();
            if !reach[r] {
                return out;
            }
            for alt in alts {
                for (k, item) in alt.iter().enumerate() {
                    match *item {
                        Item::Ref(s) => {
                            out.push((s, k + 1 < alt.len()));
                            if !nullable[s as usize] {
                                break;
                            }
                        }
                        _ => break,
                    }
                }
            }
            out
        })
        .collect();
    find_cycle(&adj, true)
}
