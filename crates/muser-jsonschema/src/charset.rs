//! Sets of Unicode scalar values and their encoding as JSON string characters.

use crate::grammar::{class_char, literal};

pub(crate) const MAX_SCALAR: u32 = 0x10_FFFF;
const SURROGATES: (u32, u32) = (0xD800, 0xDFFF);

/// A set of Unicode scalar values as sorted, disjoint, non-adjacent inclusive ranges.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub(crate) struct CharSet {
    ranges: Vec<(u32, u32)>,
}

impl CharSet {
    pub fn empty() -> Self {
        CharSet { ranges: Vec::new() }
    }

    pub fn single(c: u32) -> Self {
        Self::from_ranges(&[(c, c)])
    }

    pub fn from_ranges(r: &[(u32, u32)]) -> Self {
        let mut v: Vec<(u32, u32)> = r
            .iter()
            .filter(|(a, b)| a <= b)
            .map(|&(a, b)| (a, b.min(MAX_SCALAR)))
            .filter(|(a, b)| a <= b)
            .collect();
        v.sort_unstable();
        let mut out: Vec<(u32, u32)> = Vec::with_capacity(v.len());
        for (a, b) in v {
            match out.last_mut() {
                Some(last) if a <= last.1.saturating_add(1) => last.1 = last.1.max(b),
                _ => out.push((a, b)),
            }
        }
        // drop surrogates
        let mut cleaned = Vec::with_capacity(out.len() + 1);
        for (a, b) in out {
            if b < SURROGATES.0 || a > SURROGATES.1 {
                cleaned.push((a, b));
            } else {
                if a < SURROGATES.0 {
                    cleaned.push((a, SURROGATES.0 - 1));
                }
                if b > SURROGATES.1 {
                    cleaned.push((SURROGATES.1 + 1, b));
                }
            }
        }
        CharSet { ranges: cleaned }
    }

    pub fn ranges(&self) -> &[(u32, u32)] {
        &self.ranges
    }

    pub fn is_empty(&self) -> bool {
        self.ranges.is_empty()
    }

    pub fn contains(&self, c: u32) -> bool {
        self.ranges.iter().any(|&(a, b)| a <= c && c <= b)
    }

    pub fn union(&self, other: &CharSet) -> CharSet {
        let mut all = self.ranges.clone();
        all.extend_from_slice(&other.ranges);
        Self::from_ranges(&all)
    }

    /// Complement within the Unicode scalar values.
    pub fn complement(&self) -> CharSet {
        let mut out = Vec::new();
        let mut next = 0u32;
        for &(a, b) in &self.ranges {
            if a > next {
                out.push((next, a - 1));
            }
            next = b.saturating_add(1);
        }
        if next <= MAX_SCALAR {
            out.push((next, MAX_SCALAR));
        }
        Self::from_ranges(&out)
    }

    pub fn minus(&self, other: &CharSet) -> CharSet {
        self.intersect(&other.complement())
    }

    pub fn intersect(&self, other: &CharSet) -> CharSet {
        let mut out = Vec::new();
        for &(a, b) in &self.ranges {
            for &(c, d) in &other.ranges {
                let lo = a.max(c);
                let hi = b.min(d);
                if lo <= hi {
                    out.push((lo, hi));
                }
            }
        }
        Self::from_ranges(&out)
    }

    /// GBNF character class (possibly negated, whichever is shorter). Must not be empty.
    pub fn to_class(&self) -> String {
        let comp = self.complement();
        let (neg, set) = if comp.ranges.len() < self.ranges.len() && !comp.is_empty() {
            (true, &comp)
        } else {
            (false, self)
        };
        let mut s = String::from(if neg { "[^" } else { "[" });
        for &(a, b) in &set.ranges {
            s.push_str(&class_char(a));
            if b > a {
                if b > a + 1 {
                    s.push('-');
                }
                s.push_str(&class_char(b));
            }
        }
        s.push(']');
        s
    }
}

/// ECMA-262 `\d`.
pub(crate) fn digit() -> CharSet {
    CharSet::from_ranges(&[(0x30, 0x39)])
}

/// ECMA-262 `\w`.
pub(crate) fn word() -> CharSet {
    CharSet::from_ranges(&[(0x30, 0x39), (0x41, 0x5A), (0x5F, 0x5F), (0x61, 0x7A)])
}

/// ECMA-262 `\s` (WhiteSpace and LineTerminator).
pub(crate) fn space() -> CharSet {
    CharSet::from_ranges(&[
        (0x09, 0x0D),
        (0x20, 0x20),
        (0xA0, 0xA0),
        (0x1680, 0x1680),
        (0x2000, 0x200A),
        (0x2028, 0x2029),
        (0x202F, 0x202F),
        (0x205F, 0x205F),
        (0x3000, 0x3000),
        (0xFEFF, 0xFEFF),
    ])
}

/// ECMA-262 `.` without the `s` flag: everything but line terminators.
pub(crate) fn dot() -> CharSet {
    CharSet::from_ranges(&[(0x0A, 0x0A), (0x0D, 0x0D), (0x2028, 0x2029)]).complement()
}

/// Grammar fragment matching the JSON string encoding of exactly one character of `set`.
/// Characters that must be escaped in JSON get their serde_json spelling (`\"`, `\\`, `\n`,
/// `\u001f`, with either hex case). Returns (text, is_atomic). `set` must not be empty.
pub(crate) fn encoded_char(set: &CharSet) -> (String, bool) {
    let specials = CharSet::from_ranges(&[(0x00, 0x1F), (0x22, 0x22), (0x5C, 0x5C)]);
    let raw = set.minus(&specials);
    // (text, atomic)
    let mut parts: Vec<(String, bool)> = Vec::new();
    if !raw.is_empty() {
        let r = raw.ranges();
        if r.len() == 1 && r[0].0 == r[0].1 {
            let c = char::from_u32(r[0].0).unwrap_or('?');
            parts.push((literal(&c.to_string()), true));
        } else {
            parts.push((raw.to_class(), true));
        }
    }
    if set.contains(0x22) {
        parts.push((r#""\\\"""#.to_string(), true));
    }
    if set.contains(0x5C) {
        parts.push((r#""\\\\""#.to_string(), true));
    }
    let controls: Vec<u32> = (0u32..0x20).filter(|&c| set.contains(c)).collect();
    if controls.len() == 32 {
        parts.push((
            r#""\\" ( [bfnrt] | "u00" [01] [0-9a-fA-F] )"#.to_string(),
            false,
        ));
    } else {
        for c in controls {
            let short = match c {
                0x08 => Some('b'),
                0x09 => Some('t'),
                0x0A => Some('n'),
                0x0C => Some('f'),
                0x0D => Some('r'),
                _ => None,
            };
            match short {
                Some(s) => parts.push((format!("\"\\\\{s}\""), true)),
                None => {
                    let lo = c & 0xF;
                    let lo_class = if lo < 10 {
                        format!("\"{lo}\"")
                    } else {
                        let l = char::from_digit(lo, 16).unwrap_or('0');
                        format!("[{l}{}]", l.to_ascii_uppercase())
                    };
                    parts.push((format!("\"\\\\u00{}\" {lo_class}", c >> 4), false));
                }
            }
        }
    }
    if parts.len() == 1 {
        parts.remove(0)
    } else {
        let texts: Vec<String> = parts.into_iter().map(|p| p.0).collect();
        (format!("( {} )", texts.join(" | ")), true)
    }
}
