//! `pattern` (an ECMA-262 regular expression, matched anywhere in the string) to grammar.
//!
//! Supported: literals, `.`, character classes with ranges and negation, the class escapes
//! `\d \D \w \W \s \S` (ECMA-262 meaning: ASCII digits/word characters), character escapes
//! (`\n \r \t \v \f \0 \cX \xHH \uHHHH \u{H..}` and escaped punctuation), groups (plain,
//! `(?:...)`, `(?<name>...)`), alternation, the quantifiers `* + ? {n} {n,} {n,m}` (greedy or
//! lazy), and `^`/`$` at the start/end of a top-level alternative. A side without an anchor
//! matches any characters there. Everything else (lookaround, backreferences, word
//! boundaries, Unicode properties, anchors in the middle) is rejected.

use crate::charset::{self, encoded_char, CharSet};
use crate::grammar::{repeat, Rules};
use crate::{SchemaError, MAX_PATTERN_NESTING};

/// Largest repetition count accepted in a pattern or length keyword.
pub(crate) const MAX_REPEAT: u64 = 2_000;
const MAX_GROUP_DEPTH: usize = 50;
const MAX_PATTERN_LEN: usize = 10_000;

#[derive(Clone)]
enum Node {
    Set(CharSet),
    Seq(Vec<Node>),
    Alt(Vec<Node>),
    Rep(Box<Node>, u64, Option<u64>),
    Start,
    End,
}

struct Parser<'a> {
    chars: Vec<char>,
    pos: usize,
    depth: usize,
    ptr: &'a str,
}

type PResult<T> = Result<T, SchemaError>;

impl Parser<'_> {
    fn unsupported(&self, what: impl Into<String>) -> SchemaError {
        SchemaError::unsupported("pattern", self.ptr, what)
    }

    fn invalid(&self, what: impl Into<String>) -> SchemaError {
        SchemaError::invalid("pattern", self.ptr, what)
    }

    fn peek(&self) -> Option<char> {
        self.chars.get(self.pos).copied()
    }

    fn peek_at(&self, off: usize) -> Option<char> {
        self.chars.get(self.pos + off).copied()
    }

    fn next(&mut self) -> Option<char> {
        let c = self.peek();
        if c.is_some() {
            self.pos += 1;
        }
        c
    }

    fn alt(&mut self) -> PResult<Node> {
        let mut alts = vec![self.seq()?];
        while self.peek() == Some('|') {
            self.pos += 1;
            alts.push(self.seq()?);
        }
        Ok(if alts.len() == 1 {
            alts.remove(0)
        } else {
            Node::Alt(alts)
        })
    }

    fn seq(&mut self) -> PResult<Node> {
        let mut items = Vec::new();
        while let Some(c) = self.peek() {
            if c == '|' || c == ')' {
                break;
            }
            let atom = self.atom()?;
            let atom = self.quantified(atom)?;
            items.push(atom);
        }
        Ok(Node::Seq(items))
    }

    /// Tries to read `{n}`, `{n,}` or `{n,m}` at the current position.
    fn braces(&mut self) -> PResult<Option<(u64, Option<u64>)>> {
        let save = self.pos;
        if self.next() != Some('{') {
            self.pos = save;
            return Ok(None);
        }
        let num = |p: &mut Self| -> Option<String> {
            let mut s = String::new();
            while let Some(c) = p.peek().filter(|c| c.is_ascii_digit()) {
                s.push(c);
                p.pos += 1;
            }
            (!s.is_empty()).then_some(s)
        };
        let Some(a) = num(self) else {
            self.pos = save;
            return Ok(None);
        };
        let b = if self.peek() == Some(',') {
            self.pos += 1;
            num(self).map(Some)
        } else {
            Some(Some(a.clone()))
        };
        // b: None = "{n,}", Some(x) = bound
        if self.next() != Some('}') {
            self.pos = save;
            return Ok(None);
        }
        let parse = |s: &str| -> PResult<u64> {
            match s.parse::<u64>() {
                Ok(v) if v <= MAX_REPEAT => Ok(v),
                _ => Err(self.unsupported(format!(
                    "repetition count {s} exceeds the limit of {MAX_REPEAT}"
                ))),
            }
        };
        let min = parse(&a)?;
        let max = match b {
            None => None,
            Some(Some(s)) => Some(parse(&s)?),
            Some(None) => None,
        };
        if let Some(m) = max {
            if m < min {
                return Err(self.invalid(format!("numbers out of order in {{{min},{m}}}")));
            }
        }
        Ok(Some((min, max)))
    }

    fn quantified(&mut self, atom: Node) -> PResult<Node> {
        let q = match self.peek() {
            Some('*') => {
                self.pos += 1;
                Some((0, None))
            }
            Some('+') => {
                self.pos += 1;
                Some((1, None))
            }
            Some('?') => {
                self.pos += 1;
                Some((0, Some(1)))
            }
            Some('{') => self.braces()?,
            _ => None,
        };
        let Some((min, max)) = q else {
            return Ok(atom);
        };
        if matches!(atom, Node::Start | Node::End) {
            return Err(self.invalid("nothing to repeat"));
        }
        if self.peek() == Some('?') {
            self.pos += 1; // lazy: same set of matching strings
        }
        if matches!(self.peek(), Some('*' | '+' | '?')) {
            return Err(self.invalid("nothing to repeat"));
        }
        if self.peek() == Some('{') {
            let save = self.pos;
            if self.braces()?.is_some() {
                return Err(self.invalid("nothing to repeat"));
            }
            self.pos = save;
        }
        Ok(Node::Rep(Box::new(atom), min, max))
    }

    fn atom(&mut self) -> PResult<Node> {
        let Some(c) = self.next() else {
            return Err(self.invalid("unexpected end"));
        };
        match c {
            '^' => Ok(Node::Start),
            '$' => Ok(Node::End),
            '.' => Ok(Node::Set(charset::dot())),
            '(' => {
                if self.peek() == Some('?') {
                    match (self.peek_at(1), self.peek_at(2)) {
                        (Some(':'), _) => self.pos += 2,
                        (Some('<'), Some(n)) if n != '=' && n != '!' => {
                            self.pos += 2;
                            while let Some(c) = self.next() {
                                if c == '>' {
                                    break;
                                }
                                if !(c.is_alphanumeric() || c == '_' || c == '$') {
                                    return Err(self.invalid("bad group name"));
                                }
                            }
                        }
                        (Some('=' | '!'), _) | (Some('<'), _) => {
                            return Err(self.unsupported("lookaround assertions"))
                        }
                        _ => return Err(self.unsupported("this `(?` group syntax")),
                    }
                }
                self.depth += 1;
                if self.depth > MAX_GROUP_DEPTH {
                    return Err(
                        self.unsupported(format!("groups nested deeper than {MAX_GROUP_DEPTH}"))
                    );
                }
                let inner = self.alt()?;
                self.depth -= 1;
                if self.next() != Some(')') {
                    return Err(self.invalid("missing `)`"));
                }
                Ok(inner)
            }
            ')' => Err(self.invalid("unbalanced `)`")),
            '[' => self.class(),
            '\\' => self.escape(false),
            '*' | '+' | '?' => Err(self.invalid("nothing to repeat")),
            '{' => {
                self.pos -= 1;
                if self.braces()?.is_some() {
                    Err(self.invalid("nothing to repeat"))
                } else {
                    Err(self.unsupported("a literal `{` (escape it as `\\{`)"))
                }
            }
            c => Ok(Node::Set(CharSet::single(c as u32))),
        }
    }

    fn hex(&mut self, n: usize) -> Option<u32> {
        let mut v = 0u32;
        for i in 0..n {
            let d = self.peek_at(i)?.to_digit(16)?;
            v = v * 16 + d;
        }
        self.pos += n;
        Some(v)
    }

    /// Reads an escape after `\`; returns a set (one character, or a class escape).
    fn escape(&mut self, in_class: bool) -> PResult<Node> {
        let Some(c) = self.next() else {
            return Err(self.invalid("trailing backslash"));
        };
        let one = |c: u32| Ok(Node::Set(CharSet::single(c)));
        match c {
            'd' => Ok(Node::Set(charset::digit())),
            'D' => Ok(Node::Set(charset::digit().complement())),
            'w' => Ok(Node::Set(charset::word())),
            'W' => Ok(Node::Set(charset::word().complement())),
            's' => Ok(Node::Set(charset::space())),
            'S' => Ok(Node::Set(charset::space().complement())),
            'b' if in_class => one(0x08),
            'b' | 'B' => Err(self.unsupported("word boundary assertions (`\\b`, `\\B`)")),
            'n' => one(0x0A),
            'r' => one(0x0D),
            't' => one(0x09),
            'v' => one(0x0B),
            'f' => one(0x0C),
            '0' => {
                if self.peek().is_some_and(|d| d.is_ascii_digit()) {
                    Err(self.unsupported("octal escapes"))
                } else {
                    one(0)
                }
            }
            '1'..='9' => Err(self.unsupported("backreferences")),
            'k' => Err(self.unsupported("named backreferences")),
            'p' | 'P' => Err(self.unsupported("Unicode property escapes (`\\p{..}`)")),
            'c' => match self.peek() {
                Some(l) if l.is_ascii_alphabetic() => {
                    self.pos += 1;
                    one(l as u32 % 32)
                }
                _ => Err(self.unsupported("`\\c` without a control letter")),
            },
            'x' => match self.hex(2) {
                Some(v) => one(v),
                None => Err(self.invalid("`\\x` needs two hex digits")),
            },
            'u' => {
                if self.peek() == Some('{') {
                    self.pos += 1;
                    let mut v = 0u32;
                    let mut n = 0;
                    while let Some(d) = self.peek().and_then(|c| c.to_digit(16)) {
                        v = v.saturating_mul(16).saturating_add(d);
                        n += 1;
                        self.pos += 1;
                    }
                    if n == 0 || self.next() != Some('}') || v > charset::MAX_SCALAR {
                        return Err(self.invalid("bad `\\u{..}` escape"));
                    }
                    if (0xD800..=0xDFFF).contains(&v) {
                        return Err(self.unsupported("escapes of lone surrogates"));
                    }
                    return one(v);
                }
                let Some(v) = self.hex(4) else {
                    return Err(self.invalid("`\\u` needs four hex digits"));
                };
                if (0xD800..=0xDBFF).contains(&v)
                    && self.peek() == Some('\\')
                    && self.peek_at(1) == Some('u')
                {
                    let save = self.pos;
                    self.pos += 2;
                    match self.hex(4) {
                        Some(lo) if (0xDC00..=0xDFFF).contains(&lo) => {
                            return one(0x10000 + ((v - 0xD800) << 10) + (lo - 0xDC00));
                        }
                        _ => self.pos = save,
                    }
                }
                if (0xD800..=0xDFFF).contains(&v) {
                    return Err(self.unsupported("escapes of lone surrogates"));
                }
                one(v)
            }
            c if c.is_ascii_alphanumeric() => Err(self.unsupported(format!("the escape `\\{c}`"))),
            c => one(c as u32),
        }
    }

    fn class(&mut self) -> PResult<Node> {
        let negate = self.peek() == Some('^');
        if negate {
            self.pos += 1;
        }
        let mut set = CharSet::empty();
        loop {
            let Some(c) = self.next() else {
                return Err(self.invalid("unterminated character class"));
            };
            if c == ']' {
                break;
            }
            let first = self.class_atom(c)?;
            if self.peek() == Some('-') && self.peek_at(1).is_some_and(|n| n != ']') {
                self.pos += 1;
                let Some(c2) = self.next() else {
                    return Err(self.invalid("unterminated character class"));
                };
                let second = self.class_atom(c2)?;
                let (Some(a), Some(b)) = (single(&first), single(&second)) else {
                    return Err(self.unsupported("a range with a class escape as an end"));
                };
                if a > b {
                    return Err(self.invalid("range out of order in character class"));
                }
                set = set.union(&CharSet::from_ranges(&[(a, b)]));
            } else {
                set = set.union(&first);
            }
        }
        if negate {
            set = set.complement();
        }
        if set.is_empty() {
            return Err(self.unsupported("a character class that matches nothing"));
        }
        Ok(Node::Set(set))
    }

    fn class_atom(&mut self, c: char) -> PResult<CharSet> {
        if c == '\\' {
            match self.escape(true)? {
                Node::Set(s) => Ok(s),
                _ => Err(self.invalid("bad escape in character class")),
            }
        } else {
            Ok(CharSet::single(c as u32))
        }
    }
}

fn single(s: &CharSet) -> Option<u32> {
    match s.ranges() {
        [(a, b)] if a == b => Some(*a),
        _ => None,
    }
}

/// Grammar text with its precedence class.
#[derive(Clone)]
enum Frag {
    Empty,
    Atom(String),
    Seq(String),
    Alt(String),
}

impl Frag {
    fn atomic(self) -> Option<String> {
        match self {
            Frag::Empty => None,
            Frag::Atom(s) => Some(s),
            Frag::Seq(s) | Frag::Alt(s) => Some(format!("( {s} )")),
        }
    }

    fn in_seq(self) -> Option<String> {
        match self {
            Frag::Empty => None,
            Frag::Atom(s) | Frag::Seq(s) => Some(s),
            Frag::Alt(s) => Some(format!("( {s} )")),
        }
    }
}

/// Length range in characters.
fn lengths(n: &Node) -> (u64, Option<u64>) {
    match n {
        Node::Set(_) => (1, Some(1)),
        Node::Start | Node::End => (0, Some(0)),
        Node::Seq(v) => v.iter().fold((0, Some(0)), |(a, b), x| {
            let (c, d) = lengths(x);
            (
                a.saturating_add(c),
                b.zip(d).map(|(b, d)| b.saturating_add(d)),
            )
        }),
        Node::Alt(v) => {
            let mut lo = u64::MAX;
            let mut hi = Some(0u64);
            for x in v {
                let (c, d) = lengths(x);
                lo = lo.min(c);
                hi = hi.zip(d).map(|(h, d)| h.max(d));
            }
            (if v.is_empty() { 0 } else { lo }, hi)
        }
        Node::Rep(x, min, max) => {
            let (c, d) = lengths(x);
            let hi = match (max, d) {
                (Some(0), _) | (_, Some(0)) => Some(0),
                (Some(m), Some(d)) => Some(m.saturating_mul(d)),
                _ => None,
            };
            (c.saturating_mul(*min), hi)
        }
    }
}

/// The node's language without the empty string; None if nothing is left.
fn nonempty(n: &Node) -> Option<Node> {
    if lengths(n).0 > 0 {
        return Some(n.clone());
    }
    match n {
        Node::Set(_) => Some(n.clone()),
        Node::Start | Node::End => None,
        Node::Alt(v) => {
            let v: Vec<Node> = v.iter().filter_map(nonempty).collect();
            if v.is_empty() {
                None
            } else {
                Some(Node::Alt(v))
            }
        }
        Node::Rep(x, _, max) => {
            if *max == Some(0) {
                return None;
            }
            nonempty(x).map(|y| Node::Rep(Box::new(y), 1, *max))
        }
        Node::Seq(v) => {
            // every item is nullable: the first non-empty item decides
            let mut alts = Vec::new();
            for (i, x) in v.iter().enumerate() {
                if let Some(y) = nonempty(x) {
                    let mut seq = vec![y];
                    seq.extend(v[i + 1..].iter().cloned());
                    alts.push(Node::Seq(seq));
                }
            }
            if alts.is_empty() {
                None
            } else {
                Some(Node::Alt(alts))
            }
        }
    }
}

/// Merges directly nested repetitions that mean one repetition: `(x*)*`, `(x+)*`, `(x*)+`,
/// `(x?)*`, `(x*)?` and the like.
fn simplify(n: Node) -> Node {
    match n {
        Node::Seq(v) => Node::Seq(v.into_iter().map(simplify).collect()),
        Node::Alt(v) => Node::Alt(v.into_iter().map(simplify).collect()),
        Node::Rep(x, min, max) => {
            let mut x = simplify(*x);
            if let Node::Seq(v) = &mut x {
                if v.len() == 1 {
                    x = v.remove(0);
                }
            }
            match (x, min, max) {
                // (y{a,}){min,} with a <= 1: y{0,} if a = 0, y{min,} if a = 1
                (Node::Rep(y, a, None), min, None) if a <= 1 => {
                    Node::Rep(y, if a == 0 { 0 } else { min }, None)
                }
                // (y{a,})? and (y?){min,}: y*
                (Node::Rep(y, a, None), 0, Some(1)) if a <= 1 => Node::Rep(y, 0, None),
                (Node::Rep(y, 0, Some(1)), _, None) => Node::Rep(y, 0, None),
                // (y?)? = y?
                (Node::Rep(y, 0, Some(1)), 0, Some(1)) => Node::Rep(y, 0, Some(1)),
                (x, min, max) => Node::Rep(Box::new(x), min, max),
            }
        }
        other => other,
    }
}

/// How many repetitions (`?` aside) are nested inside each other.
fn rep_nesting(n: &Node) -> usize {
    match n {
        Node::Seq(v) | Node::Alt(v) => v.iter().map(rep_nesting).max().unwrap_or(0),
        Node::Rep(x, _, Some(1)) => rep_nesting(x),
        Node::Rep(x, _, _) => 1 + rep_nesting(x),
        _ => 0,
    }
}

fn has_anchor(n: &Node) -> bool {
    match n {
        Node::Start | Node::End => true,
        Node::Set(_) => false,
        Node::Seq(v) | Node::Alt(v) => v.iter().any(has_anchor),
        Node::Rep(x, _, _) => has_anchor(x),
    }
}

struct Emitter<'r> {
    rules: &'r mut Rules,
    hint: String,
}

impl Emitter<'_> {
    fn emit(&mut self, n: &Node) -> Frag {
        match n {
            Node::Start | Node::End => Frag::Empty, // removed before emission
            Node::Set(s) => {
                let (text, atomic) = encoded_char(s);
                if atomic && !text.starts_with('(') {
                    Frag::Atom(text)
                } else {
                    Frag::Atom(self.rules.add(&self.hint, text))
                }
            }
            Node::Seq(v) => {
                let mut frags: Vec<Frag> = v
                    .iter()
                    .map(|x| self.emit(x))
                    .filter(|f| !matches!(f, Frag::Empty))
                    .collect();
                match frags.len() {
                    0 => Frag::Empty,
                    1 => frags.remove(0),
                    _ => Frag::Seq(
                        frags
                            .into_iter()
                            .filter_map(Frag::in_seq)
                            .collect::<Vec<_>>()
                            .join(" "),
                    ),
                }
            }
            Node::Alt(v) => {
                let mut empty = false;
                let mut parts: Vec<String> = Vec::new();
                for x in v {
                    match self.emit(x) {
                        Frag::Empty => empty = true,
                        f => {
                            let s = match f {
                                Frag::Alt(s) => format!("( {s} )"),
                                Frag::Atom(s) | Frag::Seq(s) => s,
                                Frag::Empty => String::new(),
                            };
                            if !parts.contains(&s) {
                                parts.push(s);
                            }
                        }
                    }
                }
                match (parts.len(), empty) {
                    (0, _) => Frag::Empty,
                    (1, true) => Frag::Seq(format!("( {} )?", parts[0])),
                    (_, true) => Frag::Seq(format!("( {} )?", parts.join(" | "))),
                    (1, false) => Frag::Seq(parts.remove(0)),
                    (_, false) => Frag::Alt(parts.join(" | ")),
                }
            }
            Node::Rep(x, min, max) => {
                if *max == Some(0) {
                    return Frag::Empty;
                }
                if lengths(x).0 == 0 {
                    // x{n,m} with a nullable x is (x minus ""){0,m}; repeating something
                    // that can be empty would make the grammar left-recursive.
                    return match nonempty(x) {
                        None => Frag::Empty,
                        Some(y) => self.emit(&Node::Rep(Box::new(y), 0, *max)),
                    };
                }
                match self.emit(x).atomic() {
                    None => Frag::Empty,
                    Some(a) => {
                        // a repetition inside a repetition gets its own rule, so that the
                        // counts do not multiply when the grammar is expanded
                        let a = if a.contains('{') || a.contains('*') || a.contains('+') {
                            self.rules.add(&self.hint, a)
                        } else {
                            a
                        };
                        let r = repeat(&a, *min, *max);
                        if r.is_empty() {
                            Frag::Empty
                        } else {
                            Frag::Atom(r)
                        }
                    }
                }
            }
        }
    }
}

/// The grammar of a pattern-constrained string body (between the quotes).
#[derive(Clone)]
pub(crate) struct PatternGrammar {
    pub body: String,
    pub min_len: u64,
    pub max_len: Option<u64>,
}

/// Converts `pattern` to a grammar for the JSON string body (without quotes).
pub(crate) fn pattern_grammar(
    pattern: &str,
    rules: &mut Rules,
    hint: &str,
    ptr: &str,
) -> Result<PatternGrammar, SchemaError> {
    if pattern.chars().count() > MAX_PATTERN_LEN {
        return Err(SchemaError::unsupported(
            "pattern",
            ptr,
            format!("patterns longer than {MAX_PATTERN_LEN} characters"),
        ));
    }
    let mut p = Parser {
        chars: pattern.chars().collect(),
        pos: 0,
        depth: 0,
        ptr,
    };
    let tree = p.alt()?;
    if p.pos != p.chars.len() {
        return Err(p.invalid("unbalanced `)`"));
    }
    let tree = simplify(tree);
    if rep_nesting(&tree) > MAX_PATTERN_NESTING {
        // each level multiplies the ways a grammar engine can split the same text
        return Err(SchemaError::too_complex(
            "pattern",
            ptr,
            format!(
                "repetitions (`*`, `+`, `{{n,m}}`) nested more than {MAX_PATTERN_NESTING} deep"
            ),
        ));
    }
    let alts = match tree {
        Node::Alt(v) => v,
        other => vec![other],
    };
    let any_char = rules.fixed("json-char");
    let any = format!("{any_char}*");
    let mut min_len = u64::MAX;
    let mut max_len = Some(0u64);
    let mut bodies: Vec<String> = Vec::new();
    let mut has_empty = false;
    let mut em = Emitter {
        rules,
        hint: format!("{hint}-char"),
    };
    for a in alts {
        let mut items = match a {
            Node::Seq(v) => v,
            other => vec![other],
        };
        let mut start = false;
        while matches!(items.first(), Some(Node::Start)) {
            items.remove(0);
            start = true;
        }
        let mut end = false;
        while matches!(items.last(), Some(Node::End)) {
            items.pop();
            end = true;
        }
        if items.iter().any(has_anchor) {
            return Err(SchemaError::unsupported(
                "pattern",
                ptr,
                "`^`/`$` anywhere but at the start/end of a top-level alternative",
            ));
        }
        let node = Node::Seq(items);
        let (lo, hi) = lengths(&node);
        min_len = min_len.min(lo);
        max_len = if start && end {
            max_len.zip(hi).map(|(a, b)| a.max(b))
        } else {
            None
        };
        let mut parts = Vec::new();
        if !start {
            parts.push(any.clone());
        }
        if let Some(s) = em.emit(&node).in_seq() {
            parts.push(s);
        }
        if !end {
            parts.push(any.clone());
        }
        if parts.is_empty() {
            has_empty = true;
        } else {
            let s = parts.join(" ");
            if !bodies.contains(&s) {
                bodies.push(s);
            }
        }
    }
    let body = match (bodies.len(), has_empty) {
        (0, _) => String::new(),
        (1, false) => bodies.remove(0),
        (_, false) => format!("( {} )", bodies.join(" | ")),
        (_, true) => format!("( {} )?", bodies.join(" | ")),
    };
    Ok(PatternGrammar {
        body,
        min_len: if min_len == u64::MAX { 0 } else { min_len },
        max_len,
    })
}
