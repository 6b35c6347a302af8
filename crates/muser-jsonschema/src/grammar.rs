//! Rule table for the GBNF being generated, GBNF escaping helpers and the fixed rules
//! (generic JSON values, whitespace, string formats).

use std::collections::{HashMap, HashSet};

use crate::{MAX_GRAMMAR_BYTES, MAX_RULES};

/// Fixed rules: (name, body, rules it refers to).
const FIXED: &[(&str, &str, &[&str])] = &[
    // Optional whitespace between tokens: a single space, or one or two line breaks followed
    // by an indentation of at most 20 spaces/tabs. Bounded, so generation cannot stall in it.
    ("ws", r#"( " " | "\n" "\n"? [ \t]{0,20} )?"#, &[]),
    (
        "json-value",
        r#"json-object | json-array | json-string | json-number | json-bool | json-null"#,
        &[
            "json-object",
            "json-array",
            "json-string",
            "json-number",
            "json-bool",
            "json-null",
        ],
    ),
    (
        "json-object",
        r#""{" ws ( json-member ( "," ws json-member )* ws )? "}""#,
        &["ws", "json-member"],
    ),
    (
        "json-member",
        r#"json-string ws ":" ws json-value"#,
        &["json-string", "ws", "json-value"],
    ),
    (
        "json-array",
        r#""[" ws ( json-value ( "," ws json-value )* ws )? "]""#,
        &["ws", "json-value"],
    ),
    ("json-string", r#""\"" json-char* "\"""#, &["json-char"]),
    // One character of a JSON string body: any raw character except '"', '\\' and the control
    // characters, or an escape. `\u` escapes never encode a lone
    // surrogate, which JSON parsers reject.
    (
        "json-char",
        r#"[^"\\\x00-\x1F] | "\\" ( ["\\/bfnrt] | "u" json-hex4 )"#,
        &["json-hex4"],
    ),
    (
        "json-hex4",
        r#"[0-9a-cA-Ce-fE-F] [0-9a-fA-F]{3} | [dD] [0-7] [0-9a-fA-F]{2} | [dD] [89abAB] [0-9a-fA-F]{2} "\\u" [dD] [c-fC-F] [0-9a-fA-F]{2}"#,
        &[],
    ),
    // Up to 16 integral and 24 fractional digits and a two-digit exponent, or one integral
    // digit and an exponent up to 299: every number stays a finite double, and every double
    // as serde_json writes it (except beyond 1e300 and below 1e-299) fits.
    (
        "json-number",
        r#""-"? ( ( "0" | [1-9] [0-9]{0,15} ) ( "." [0-9]{1,24} )? ( [eE] [-+]? [0-9]{1,2} )? | [0-9] ( "." [0-9]{1,24} )? [eE] [-+]? [12] [0-9]{2} )"#,
        &[],
    ),
    ("json-integer", r#""0" | "-"? [1-9] [0-9]{0,15}"#, &[]),
    ("json-bool", r#""true" | "false""#, &[]),
    ("json-null", r#""null""#, &[]),
    // Key of an additional property: every decoded key has exactly one spelling here (the one
    // serde_json writes), so excluding the declared names cannot be bypassed with escapes.
    ("key-char", r#"[^"\\\x00-\x1F] | key-esc"#, &["key-esc"]),
    (
        "key-esc",
        r#""\\" ( ["\\bfnrt] | "u00" ( "0" [0-7be-f] | "1" [0-9a-f] ) )"#,
        &[],
    ),
    // RFC 3339 full-date with the real month lengths and leap years.
    (
        "fmt-date",
        r#"fmt-year "-" ( ( "0" [13578] | "1" [02] ) "-" ( "0" [1-9] | [12] [0-9] | "3" [01] ) | ( "0" [469] | "11" ) "-" ( "0" [1-9] | [12] [0-9] | "30" ) | "02-" ( "0" [1-9] | "1" [0-9] | "2" [0-8] ) ) | fmt-leap-year "-02-29""#,
        &["fmt-year", "fmt-leap-year"],
    ),
    ("fmt-year", r#"[0-9]{4}"#, &[]),
    (
        "fmt-leap-year",
        r#"[0-9] [0-9] ( [02468] [48] | [2468] "0" | [13579] [26] ) | ( [02468] [048] | [13579] [26] ) "00""#,
        &[],
    ),
    // RFC 3339 full-time (no leap second), upper-case `Z`.
    (
        "fmt-time",
        r#"( [01] [0-9] | "2" [0-3] ) ":" [0-5] [0-9] ":" [0-5] [0-9] ( "." [0-9]{1,9} )? ( "Z" | [+-] ( [01] [0-9] | "2" [0-3] ) ":" [0-5] [0-9] )"#,
        &[],
    ),
    (
        "fmt-date-time",
        r#"fmt-date "T" fmt-time"#,
        &["fmt-date", "fmt-time"],
    ),
    (
        "fmt-uuid",
        r#"[0-9a-fA-F]{8} "-" [0-9a-fA-F]{4} "-" [0-9a-fA-F]{4} "-" [0-9a-fA-F]{4} "-" [0-9a-fA-F]{12}"#,
        &[],
    ),
    (
        "fmt-ipv4",
        r#"fmt-octet "." fmt-octet "." fmt-octet "." fmt-octet"#,
        &["fmt-octet"],
    ),
    (
        "fmt-octet",
        r#""25" [0-5] | "2" [0-4] [0-9] | "1" [0-9] [0-9] | [1-9] [0-9] | [0-9]"#,
        &[],
    ),
    // A safe subset of RFC 1123 host names: up to 4 labels of at most 53 characters, no
    // leading, trailing or doubled hyphen.
    (
        "fmt-hostname",
        r#"fmt-label ( "." fmt-label ){0,3}"#,
        &["fmt-label"],
    ),
    (
        "fmt-label",
        r#"[a-zA-Z0-9]{1,20} ( "-" [a-zA-Z0-9]{1,10} ){0,3}"#,
        &[],
    ),
    // A safe subset of RFC 5321 mailboxes (dot-atom local part).
    (
        "fmt-email",
        r#"[a-zA-Z0-9_%+-]{1,20} ( "." [a-zA-Z0-9_%+-]{1,20} ){0,2} "@" fmt-hostname"#,
        &["fmt-hostname"],
    ),
    // A safe subset of absolute http(s) URIs.
    (
        "fmt-uri",
        r#""http" "s"? "://" fmt-hostname ( ":" [1-9] [0-9]{0,3} )? ( "/" [a-zA-Z0-9._~-]{0,20} ){0,8}"#,
        &["fmt-hostname"],
    ),
];

pub(crate) fn is_fixed(name: &str) -> bool {
    FIXED.iter().any(|(n, _, _)| *n == name)
}

/// The grammar under construction.
#[derive(Default)]
pub(crate) struct Rules {
    rules: Vec<(String, String)>,
    index: HashMap<String, usize>,
    by_body: HashMap<String, String>,
    /// Rules each rule may start with without consuming input (used to detect left recursion).
    leads: HashMap<String, Vec<String>>,
    /// base name -> next numeric suffix to try (every smaller one is taken)
    suffixes: HashMap<String, usize>,
    /// bytes of all rule bodies and names (the size of the rendered grammar, roughly)
    bytes: usize,
    /// bytes of all bodies passed to [`Rules::add`], reused or not (work spent on them)
    touched: usize,
}

impl Rules {
    /// Adds a fixed rule (and what it needs) if missing; returns its name.
    pub fn fixed(&mut self, name: &'static str) -> String {
        let mut todo = vec![name];
        while let Some(n) = todo.pop() {
            if self.index.contains_key(n) {
                continue;
            }
            let Some((_, body, deps)) = FIXED.iter().find(|(f, _, _)| *f == n) else {
                continue;
            };
            self.push(n.to_string(), body.to_string());
            todo.extend(deps.iter().copied());
        }
        name.to_string()
    }

    fn push(&mut self, name: String, body: String) {
        self.bytes += name.len() + body.len() + 5;
        self.index.insert(name.clone(), self.rules.len());
        self.rules.push((name, body));
    }

    /// Bytes of rule bodies built so far, including those that matched an existing rule.
    pub fn touched(&self) -> usize {
        self.touched
    }

    /// Why the grammar is over the size limits, if it is.
    pub fn over_limit(&self) -> Option<String> {
        if self.rules.len() > MAX_RULES {
            Some(format!(
                "the grammar would have more than {MAX_RULES} rules"
            ))
        } else if self.bytes > MAX_GRAMMAR_BYTES {
            Some(format!(
                "the grammar would be larger than {MAX_GRAMMAR_BYTES} bytes"
            ))
        } else {
            None
        }
    }

    fn fresh_name(&mut self, hint: &str) -> String {
        let mut base = String::new();
        for c in hint.chars() {
            let c = c.to_ascii_lowercase();
            if c.is_ascii_alphanumeric() {
                base.push(c);
            } else if !base.ends_with('-') && !base.is_empty() {
                base.push('-');
            }
            if base.len() >= 32 {
                break;
            }
        }
        while base.ends_with('-') {
            base.pop();
        }
        if base.is_empty() || base.starts_with(|c: char| c.is_ascii_digit()) {
            base.insert_str(0, "s-");
        }
        let taken = |r: &Rules, n: &str| r.index.contains_key(n) || is_fixed(n) || n == "root";
        if !taken(self, &base) {
            return base;
        }
        // names are never released: every suffix below the stored one is still taken
        let mut i = self.suffixes.get(&base).copied().unwrap_or(2);
        let cand = loop {
            let cand = format!("{base}-{i}");
            i += 1;
            if !taken(self, &cand) {
                break cand;
            }
        };
        self.suffixes.insert(base, i);
        cand
    }

    /// Adds a rule with the given body, reusing an existing rule with the same body. A body
    /// that is just a rule name is returned as is.
    pub fn add(&mut self, hint: &str, body: String) -> String {
        self.touched += body.len();
        if is_rule_name(&body) {
            return body;
        }
        if let Some(n) = self.by_body.get(&body) {
            return n.clone();
        }
        let name = self.fresh_name(hint);
        self.by_body.insert(body.clone(), name.clone());
        self.push(name.clone(), body);
        name
    }

    /// Adds an alternation of rules.
    pub fn add_union(&mut self, hint: &str, alts: &[String]) -> String {
        let mut seen = HashSet::new();
        let mut uniq: Vec<String> = Vec::new();
        for a in alts {
            if seen.insert(a.as_str()) {
                uniq.push(a.clone());
            }
        }
        if uniq.len() == 1 {
            return uniq.remove(0);
        }
        let name = self.add(hint, uniq.join(" | "));
        self.leads.entry(name.clone()).or_insert(uniq);
        name
    }

    /// Reserves a rule name whose body is set later with [`Rules::define_alias`].
    pub fn reserve(&mut self, hint: &str) -> String {
        let name = self.fresh_name(hint);
        self.push(name.clone(), String::new());
        name
    }

    /// Sets the body of a reserved rule to a reference to `target`.
    pub fn define_alias(&mut self, name: &str, target: &str) {
        if let Some(&i) = self.index.get(name) {
            self.bytes += target.len();
            self.rules[i].1 = target.to_string();
        }
        self.leads
            .entry(name.to_string())
            .or_default()
            .push(target.to_string());
    }

    /// Finds a cycle of rules that reach themselves without consuming input. Only unions and
    /// aliases start with a rule reference; every other generated rule starts with a terminal.
    pub fn left_recursive_rule(&self) -> Option<String> {
        // iterative DFS with colors
        let mut state: HashMap<&str, u8> = HashMap::new();
        // creation order keeps the reported rule deterministic
        for start in self
            .rules
            .iter()
            .map(|r| &r.0)
            .filter(|n| self.leads.contains_key(*n))
        {
            if state.get(start.as_str()).copied().unwrap_or(0) != 0 {
                continue;
            }
            let mut stack: Vec<(&str, usize)> = vec![(start.as_str(), 0)];
            state.insert(start.as_str(), 1);
            while let Some(&mut (node, ref mut i)) = stack.last_mut() {
                let next = self.leads.get(node).and_then(|v| v.get(*i));
                *i += 1;
                match next {
                    Some(n) => match state.get(n.as_str()).copied().unwrap_or(0) {
                        0 => {
                            state.insert(n.as_str(), 1);
                            stack.push((n.as_str(), 0));
                        }
                        1 => return Some(n.clone()),
                        _ => {}
                    },
                    None => {
                        state.insert(node, 2);
                        stack.pop();
                    }
                }
            }
        }
        None
    }

    /// Renders the grammar: `root ::= <root>` first, then every rule in creation order.
    pub fn render(&self, root: &str) -> String {
        let mut out = format!("root ::= {root}\n");
        out.push_str(&self.render_rules(""));
        out
    }

    /// Renders every rule in creation order (no `root` rule), with `prefix` put before every
    /// rule name, defined or referenced.
    pub fn render_rules(&self, prefix: &str) -> String {
        let mut out = String::new();
        let mut seen = HashSet::new();
        for (name, body) in &self.rules {
            if seen.insert(name) {
                out.push_str(prefix);
                out.push_str(name);
                out.push_str(" ::= ");
                if prefix.is_empty() {
                    out.push_str(body);
                } else {
                    prefix_refs(body, prefix, &mut out);
                }
                out.push('\n');
            }
        }
        out
    }
}

/// Copies a rule body to `out` with `prefix` put before every rule reference: every run of
/// name characters outside string literals, character classes and repetition braces.
pub(crate) fn prefix_refs(body: &str, prefix: &str, out: &mut String) {
    let mut chars = body.chars().peekable();
    let mut in_name = false;
    while let Some(c) = chars.next() {
        let name_char = c.is_ascii_alphanumeric() || c == '-' || c == '_';
        if name_char && !in_name {
            out.push_str(prefix);
        }
        in_name = name_char;
        out.push(c);
        let close = match c {
            '"' => '"',
            '[' => ']',
            '{' => '}',
            _ => continue,
        };
        // copy up to and including the closing character; `\` escapes the next character
        while let Some(d) = chars.next() {
            out.push(d);
            if d == '\\' && close != '}' {
                if let Some(e) = chars.next() {
                    out.push(e);
                }
            } else if d == close {
                break;
            }
        }
    }
}

pub(crate) fn is_rule_name(s: &str) -> bool {
    !s.is_empty() && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
}

/// A GBNF string literal matching exactly `s`.
pub fn literal(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 || c as u32 == 0x7f => {
                out.push_str(&format!("\\x{:02X}", c as u32));
            }
            c if (0x80..0xa0).contains(&(c as u32)) => {
                out.push_str(&format!("\\u{:04X}", c as u32));
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// One code point written for use inside a GBNF character class.
pub(crate) fn class_char(c: u32) -> String {
    match char::from_u32(c) {
        Some(ch) if ch.is_ascii_alphanumeric() => ch.to_string(),
        Some(ch) if ch.is_ascii_graphic() && !matches!(ch, ']' | '[' | '\\' | '-' | '^' | '"') => {
            ch.to_string()
        }
        Some(' ') => " ".to_string(),
        _ if c < 0x80 => format!("\\x{c:02X}"),
        Some(ch) if c >= 0xa0 && !ch.is_whitespace() && !ch.is_control() => ch.to_string(),
        _ if c <= 0xffff => format!("\\u{c:04X}"),
        _ => format!("\\U{c:08X}"),
    }
}

/// `item` repeated between `min` and `max` (None = unbounded) times. `item` must be atomic.
pub(crate) fn repeat(item: &str, min: u64, max: Option<u64>) -> String {
    match (min, max) {
        (0, Some(0)) => String::new(),
        (1, Some(1)) => item.to_string(),
        (0, Some(1)) => format!("{item}?"),
        (0, None) => format!("{item}*"),
        (1, None) => format!("{item}+"),
        (n, None) => format!("{item}{{{n},}}"),
        (n, Some(m)) if n == m => format!("{item}{{{n}}}"),
        (n, Some(m)) => format!("{item}{{{n},{m}}}"),
    }
}
