//! Grammars for bounded integers and bounded decimal numbers.
//!
//! Everything works on canonical decimal digit strings: integers have no leading zeros,
//! bounds are exact decimals. Ranges of equal-length digit strings are split at the first
//! digit where the two ends differ.

use std::cmp::Ordering;

/// Digits allowed on an unbounded side of an integer range.
pub(crate) const INT_OPEN_DIGITS: usize = 16;
/// Digits allowed at most for an integer (keeps every value inside i64).
pub(crate) const INT_MAX_DIGITS: usize = 18;
/// Total digits (integral + fractional) of a bounded number; 15 significant digits survive a
/// round trip through a double, so exclusive bounds stay exclusive after parsing.
pub(crate) const NUM_DIGITS: usize = 15;

fn digit_class(lo: u8, hi: u8) -> String {
    if lo == hi {
        format!("\"{}\"", lo as char)
    } else {
        format!("[{}-{}]", lo as char, hi as char)
    }
}

fn any_digits(n: usize) -> String {
    match n {
        0 => String::new(),
        1 => "[0-9]".to_string(),
        n => format!("[0-9]{{{n}}}"),
    }
}

fn join_seq(parts: &[String]) -> String {
    parts
        .iter()
        .filter(|p| !p.is_empty())
        .cloned()
        .collect::<Vec<_>>()
        .join(" ")
}

fn alt(alts: Vec<String>) -> String {
    if alts.len() == 1 {
        alts.into_iter().next().unwrap_or_default()
    } else {
        format!("( {} )", alts.join(" | "))
    }
}

/// Digit strings of the same length between `a` and `b` inclusive (`a <= b`).
fn same_len(a: &[u8], b: &[u8]) -> String {
    let n = a.len();
    let mut i = 0;
    while i < n && a[i] == b[i] {
        i += 1;
    }
    let prefix = if i > 0 {
        format!("\"{}\"", String::from_utf8_lossy(&a[..i]))
    } else {
        String::new()
    };
    if i == n {
        return prefix;
    }
    let (da, db) = (a[i], b[i]);
    let rest_len = n - i - 1;
    let (ar, br) = (&a[i + 1..], &b[i + 1..]);
    let a_zeros = ar.iter().all(|&c| c == b'0');
    let b_nines = br.iter().all(|&c| c == b'9');
    let mut alts = Vec::new();
    if !a_zeros {
        let nines = vec![b'9'; rest_len];
        alts.push(join_seq(&[digit_class(da, da), same_len(ar, &nines)]));
    }
    let mid_lo = if a_zeros { da } else { da + 1 };
    let mid_hi = if b_nines { db } else { db - 1 };
    if mid_lo <= mid_hi {
        alts.push(join_seq(&[
            digit_class(mid_lo, mid_hi),
            any_digits(rest_len),
        ]));
    }
    if !b_nines {
        let zeros = vec![b'0'; rest_len];
        alts.push(join_seq(&[digit_class(db, db), same_len(&zeros, br)]));
    }
    join_seq(&[prefix, alt(alts)])
}

fn cmp_digits(a: &[u8], b: &[u8]) -> Ordering {
    a.len().cmp(&b.len()).then_with(|| a.cmp(b))
}

fn inc(s: &[u8]) -> Vec<u8> {
    let mut v = s.to_vec();
    let mut i = v.len();
    loop {
        if i == 0 {
            v.insert(0, b'1');
            return v;
        }
        i -= 1;
        if v[i] == b'9' {
            v[i] = b'0';
        } else {
            v[i] += 1;
            return v;
        }
    }
}

/// `s - 1` for `s >= 1`.
fn dec(s: &[u8]) -> Vec<u8> {
    let mut v = s.to_vec();
    let mut i = v.len();
    while i > 0 {
        i -= 1;
        if v[i] == b'0' {
            v[i] = b'9';
        } else {
            v[i] -= 1;
            break;
        }
    }
    while v.len() > 1 && v[0] == b'0' {
        v.remove(0);
    }
    v
}

/// Canonical non-negative integers in `[lo, hi]` with at most `max_len` digits, grouped by
/// length. `lo`/`hi` are canonical digit strings.
fn uint_segments(lo: &[u8], hi: Option<&[u8]>, max_len: usize) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    if let Some(h) = hi {
        if cmp_digits(lo, h) == Ordering::Greater {
            return out;
        }
    }
    let top = hi.map_or(max_len, |h| h.len().min(max_len));
    for k in lo.len()..=top {
        let a: Vec<u8> = if k == lo.len() {
            lo.to_vec()
        } else {
            let mut v = vec![b'0'; k];
            v[0] = b'1';
            v
        };
        let b: Vec<u8> = match hi {
            Some(h) if h.len() == k => h.to_vec(),
            _ => vec![b'9'; k],
        };
        if cmp_digits(&a, &b) != Ordering::Greater {
            out.push((k, same_len(&a, &b)));
        }
    }
    out
}

fn digits_of(v: i128) -> Vec<u8> {
    v.unsigned_abs().to_string().into_bytes()
}

/// Grammar for the integers in `[lo, hi]` (None = open), or None when there are none within
/// the supported digit counts.
pub(crate) fn int_range(lo: Option<i128>, hi: Option<i128>) -> Option<String> {
    let limit: i128 = 10i128.pow(INT_MAX_DIGITS as u32) - 1;
    let open: i128 = 10i128.pow(INT_OPEN_DIGITS as u32) - 1;
    if let (Some(l), Some(h)) = (lo, hi) {
        if l > h {
            return None;
        }
    }
    let mut alts = Vec::new();
    // non-negative part
    if hi.is_none_or(|h| h >= 0) {
        let l = lo.map_or(0, |l| l.max(0));
        let h = match hi {
            Some(h) => h.min(limit),
            None => {
                if l > open {
                    limit
                } else {
                    open
                }
            }
        };
        if l <= h {
            for (_, s) in uint_segments(&digits_of(l), Some(&digits_of(h)), INT_MAX_DIGITS) {
                alts.push(s);
            }
        }
    }
    // negative part: magnitudes in [max(1, -hi), -lo]
    if lo.is_none_or(|l| l < 0) {
        let m_lo = match hi {
            Some(h) if h < 0 => -h,
            _ => 1,
        };
        let m_hi = match lo {
            Some(l) => (-l).min(limit),
            None => {
                if m_lo > open {
                    limit
                } else {
                    open
                }
            }
        };
        if m_lo <= m_hi {
            let segs: Vec<String> =
                uint_segments(&digits_of(m_lo), Some(&digits_of(m_hi)), INT_MAX_DIGITS)
                    .into_iter()
                    .map(|(_, s)| s)
                    .collect();
            if !segs.is_empty() {
                alts.push(format!("\"-\" {}", alt(segs)));
            }
        }
    }
    if alts.is_empty() {
        None
    } else {
        Some(alts.join(" | "))
    }
}

/// An exact decimal: sign, canonical integral digits, fractional digits without trailing
/// zeros.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Decimal {
    pub neg: bool,
    pub int: Vec<u8>,
    pub frac: Vec<u8>,
}

impl Decimal {
    pub fn from_number(n: &serde_json::Number) -> Option<Decimal> {
        let text = if let Some(u) = n.as_u64() {
            u.to_string()
        } else if let Some(i) = n.as_i64() {
            i.to_string()
        } else {
            let f = n.as_f64()?;
            if !f.is_finite() {
                return None;
            }
            // Display for f64 never uses an exponent and is the shortest round-trip form.
            format!("{f}")
        };
        Some(Self::parse(&text))
    }

    fn parse(text: &str) -> Decimal {
        let (neg, body) = match text.strip_prefix('-') {
            Some(b) => (true, b),
            None => (false, text),
        };
        let (ip, fp) = body.split_once('.').unwrap_or((body, ""));
        let mut int: Vec<u8> = ip.bytes().skip_while(|&c| c == b'0').collect();
        if int.is_empty() {
            int.push(b'0');
        }
        let mut frac: Vec<u8> = fp.bytes().collect();
        while frac.last() == Some(&b'0') {
            frac.pop();
        }
        let zero = int == b"0" && frac.is_empty();
        Decimal {
            neg: neg && !zero,
            int,
            frac,
        }
    }

    fn cmp_mag(&self, other: &Decimal) -> Ordering {
        cmp_digits(&self.int, &other.int).then_with(|| {
            let n = self.frac.len().max(other.frac.len());
            for i in 0..n {
                let a = self.frac.get(i).copied().unwrap_or(b'0');
                let b = other.frac.get(i).copied().unwrap_or(b'0');
                if a != b {
                    return a.cmp(&b);
                }
            }
            Ordering::Equal
        })
    }

    pub fn cmp(&self, other: &Decimal) -> Ordering {
        match (self.neg, other.neg) {
            (false, true) => Ordering::Greater,
            (true, false) => Ordering::Less,
            (false, false) => self.cmp_mag(other),
            (true, true) => other.cmp_mag(self),
        }
    }

    fn magnitude(&self) -> Decimal {
        Decimal {
            neg: false,
            ..self.clone()
        }
    }

    fn zero() -> Decimal {
        Decimal {
            neg: false,
            int: b"0".to_vec(),
            frac: Vec::new(),
        }
    }
}

/// A bound on a number: value and whether it is exclusive.
#[derive(Clone, Debug)]
pub(crate) struct Bound {
    pub v: Decimal,
    pub excl: bool,
}

#[derive(Clone, Copy)]
struct FracBound<'a> {
    digits: &'a [u8],
    excl: bool,
}

fn all_zero(d: &[u8]) -> bool {
    d.iter().all(|&c| c == b'0')
}

/// Whether an empty remainder (value 0) satisfies the bounds on the remaining digits.
fn empty_ok(lo: Option<FracBound>, hi: Option<FracBound>) -> bool {
    lo.is_none_or(|l| all_zero(l.digits) && !l.excl)
        && hi.is_none_or(|h| !all_zero(h.digits) || !h.excl)
}

/// Grammar for non-empty digit strings `s` of length <= budget such that `0.s` lies within
/// the bounds `0.lo` .. `0.hi` (lexicographic comparison with zero padding).
fn nonempty_digits(lo: Option<FracBound>, hi: Option<FracBound>, budget: usize) -> Option<String> {
    if budget == 0 {
        return None;
    }
    // a lower bound of zero, inclusive, bounds nothing
    let lo = lo.filter(|l| !all_zero(l.digits) || l.excl);
    let l0 = lo.map(|l| l.digits.first().copied().unwrap_or(b'0'));
    let h0 = hi.map(|h| h.digits.first().copied().unwrap_or(b'0'));
    let mut alts = Vec::new();
    // digits that leave both bounds behind
    let free_lo = l0.map_or(b'0', |d| d + 1);
    let free_hi = match h0 {
        Some(b'0') => None,
        Some(d) => Some(d - 1),
        None => Some(b'9'),
    };
    if let Some(fh) = free_hi {
        if free_lo <= fh {
            alts.push(join_seq(&[
                digit_class(free_lo, fh),
                if budget > 1 {
                    format!("[0-9]{{0,{}}}", budget - 1)
                } else {
                    String::new()
                },
            ]));
        }
    }
    let mut tight: Vec<u8> = Vec::new();
    for d in [l0, h0].into_iter().flatten() {
        if !tight.contains(&d) {
            tight.push(d);
        }
    }
    tight.sort_unstable();
    for d in tight {
        let lo_next = match (lo, l0) {
            (Some(l), Some(ld)) => match d.cmp(&ld) {
                Ordering::Less => continue,
                Ordering::Equal => Some(FracBound {
                    digits: l.digits.get(1..).unwrap_or(&[]),
                    excl: l.excl,
                }),
                Ordering::Greater => None,
            },
            _ => None,
        };
        let hi_next = match (hi, h0) {
            (Some(h), Some(hd)) => match d.cmp(&hd) {
                Ordering::Greater => continue,
                Ordering::Equal => Some(FracBound {
                    digits: h.digits.get(1..).unwrap_or(&[]),
                    excl: h.excl,
                }),
                Ordering::Less => None,
            },
            _ => None,
        };
        if lo_next.is_none() && hi_next.is_none() {
            continue; // covered by the free range
        }
        let end = empty_ok(lo_next, hi_next);
        let more = nonempty_digits(lo_next, hi_next, budget - 1);
        let head = digit_class(d, d);
        match (end, more) {
            (true, None) => alts.push(head),
            (true, Some(m)) => alts.push(format!("{head} ( {m} )?")),
            (false, Some(m)) => alts.push(format!("{head} {m}")),
            (false, None) => {}
        }
    }
    if alts.is_empty() {
        None
    } else {
        Some(alt(alts))
    }
}

/// Optional fraction (`"." digits`) satisfying the bounds; None when no fraction, not even an
/// absent one, fits. Some("") means only "no fraction".
fn fraction(lo: Option<FracBound>, hi: Option<FracBound>, budget: usize) -> Option<String> {
    let end = empty_ok(lo, hi);
    match (end, nonempty_digits(lo, hi, budget)) {
        (true, None) => Some(String::new()),
        (false, None) => None,
        (true, Some(m)) => Some(format!("( \".\" {m} )?")),
        (false, Some(m)) => Some(format!("\".\" {m}")),
    }
}

fn any_fraction(budget: usize) -> String {
    match budget {
        0 => String::new(),
        1 => "( \".\" [0-9] )?".to_string(),
        b => format!("( \".\" [0-9]{{1,{b}}} )?"),
    }
}

/// Alternatives for magnitudes `x` (written without sign, no exponent) with `lo <= x` (or
/// `<`) and `x <= hi` (or `<`), `lo >= 0`.
fn magnitude(lo: &Bound, hi: Option<&Bound>) -> Vec<String> {
    let hi = hi.filter(|h| h.v.int.len() <= NUM_DIGITS);
    let li = &lo.v.int;
    let mut out = Vec::new();
    if li.len() > NUM_DIGITS {
        return out;
    }
    if let Some(h) = hi {
        if cmp_digits(li, &h.v.int) == Ordering::Greater {
            return out;
        }
    }
    let lo_fb = FracBound {
        digits: &lo.v.frac,
        excl: lo.excl,
    };
    let lit = |d: &[u8]| format!("\"{}\"", String::from_utf8_lossy(d));
    let budget = |d: &[u8]| NUM_DIGITS.saturating_sub(d.len());
    if let Some(h) = hi.filter(|h| h.v.int == *li) {
        let hi_fb = FracBound {
            digits: &h.v.frac,
            excl: h.excl,
        };
        if let Some(f) = fraction(Some(lo_fb), Some(hi_fb), budget(li)) {
            out.push(join_seq(&[lit(li), f]));
        }
        return out;
    }
    let lo_any = lo.v.frac.is_empty() && !lo.excl;
    if !lo_any {
        if let Some(f) = fraction(Some(lo_fb), None, budget(li)) {
            out.push(join_seq(&[lit(li), f]));
        }
    }
    let start = if lo_any { li.clone() } else { inc(li) };
    let end = hi.map(|h| dec(&h.v.int));
    for (k, seg) in uint_segments(&start, end.as_deref(), NUM_DIGITS) {
        out.push(join_seq(&[seg, any_fraction(NUM_DIGITS - k)]));
    }
    if let Some(h) = hi {
        let hi_fb = FracBound {
            digits: &h.v.frac,
            excl: h.excl,
        };
        if let Some(f) = fraction(None, Some(hi_fb), budget(&h.v.int)) {
            out.push(join_seq(&[lit(&h.v.int), f]));
        }
    }
    out
}

/// Grammar for decimal numbers (no exponent) within the bounds, or None if none fit.
pub(crate) fn number_range(lo: Option<&Bound>, hi: Option<&Bound>) -> Option<String> {
    if let (Some(l), Some(h)) = (lo, hi) {
        match l.v.cmp(&h.v) {
            Ordering::Greater => return None,
            Ordering::Equal if l.excl || h.excl => return None,
            _ => {}
        }
    }
    let zero_incl = Bound {
        v: Decimal::zero(),
        excl: false,
    };
    let zero_excl = Bound {
        v: Decimal::zero(),
        excl: true,
    };
    let mut alts = Vec::new();
    // x >= 0
    let hi_nonneg = match hi {
        Some(h) if h.v.neg => None,
        Some(h) => Some(Some(h.clone())),
        None => Some(None),
    };
    if let Some(h) = hi_nonneg {
        let l = match lo {
            Some(l) if !l.v.neg => l.clone(),
            _ => zero_incl,
        };
        alts.extend(magnitude(&l, h.as_ref()));
    }
    // x < 0, written as "-" magnitude with magnitude > 0
    let lo_allows_neg = lo.is_none_or(|l| l.v.neg);
    if lo_allows_neg {
        let m_lo = match hi {
            Some(h) if h.v.neg => Bound {
                v: h.v.magnitude(),
                excl: h.excl,
            },
            _ => zero_excl,
        };
        let m_hi = lo.map(|l| Bound {
            v: l.v.magnitude(),
            excl: l.excl,
        });
        let neg = magnitude(&m_lo, m_hi.as_ref());
        if !neg.is_empty() {
            alts.push(format!("\"-\" {}", alt(neg)));
        }
    }
    if alts.is_empty() {
        None
    } else {
        Some(alts.join(" | "))
    }
}

/// The stricter of two lower bounds.
pub(crate) fn stricter_lower(a: Option<Bound>, b: Option<Bound>) -> Option<Bound> {
    match (a, b) {
        (Some(a), Some(b)) => Some(match a.v.cmp(&b.v) {
            Ordering::Greater => a,
            Ordering::Less => b,
            Ordering::Equal => Bound {
                excl: a.excl || b.excl,
                ..a
            },
        }),
        (a, b) => a.or(b),
    }
}

/// The stricter of two upper bounds.
pub(crate) fn stricter_upper(a: Option<Bound>, b: Option<Bound>) -> Option<Bound> {
    match (a, b) {
        (Some(a), Some(b)) => Some(match a.v.cmp(&b.v) {
            Ordering::Less => a,
            Ordering::Greater => b,
            Ordering::Equal => Bound {
                excl: a.excl || b.excl,
                ..a
            },
        }),
        (a, b) => a.or(b),
    }
}

#[cfg(test)]
pub(crate) fn test_decimal(s: &str) -> Decimal {
    Decimal::parse(s)
}
