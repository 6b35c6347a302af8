//! JSON read as far as it has been written, for streaming a tool call's arguments while the
//! model writes them, and the reader of every call's JSON (`value`, `whole`), so that what is
//! streamed and what is read at the end agree.
//!
//! A call's final arguments are the compact JSON of the value the model wrote (`call_of`).
//! `Json::stable` gives, for text that ends inside that value, the longest text that begins
//! the final arguments whatever the model writes next: strings as far as their characters are
//! known (an escape is held until it is whole), numbers and literals only once they end, and
//! an object's key once it is whole. A key repeated in an object keeps its first value (the
//! repeat is read, checked and left out), here and in the final value alike; numbers and
//! literals are read by serde_json from their own text, strings by `unescape`, containers are
//! built from their children, so a reading costs time linear in the text.
//!
//! A `\u` escape of a lone surrogate (`"\ud800"`: JSON text that the call grammars allow, as
//! JSON's grammar does, but no Unicode character) reads as U+FFFD, the replacement character,
//! as Go's and browsers' JSON readers read it: the call is kept, and its arguments stay valid
//! JSON of valid UTF-8 for every client. (serde_json refuses such a string; llama-server passes
//! the model's arguments text through with the escape as written.) A leading surrogate is held
//! until what follows shows whether it is half of a pair.
//!
//! Streaming reads a call's text again after every token. A long string (a file's text as an
//! argument) would make each reading as long as the text, and the whole stream quadratic, so a
//! `Memo` kept between the readings of one block (`read_on`) remembers the long strings read so
//! far: a later reading that finds one of them at the same place, its text grown or closed, reads
//! on from where the last reading stopped. What it remembers is checked against the text, never
//! trusted, so a memo of another text only costs the time it saves.

use serde_json::Value;

/// Deeper nesting is not read (serde_json refuses past 128 levels too).
const MAX_DEPTH: usize = 128;

/// A JSON value read from the start of a text.
#[derive(Clone, Debug, PartialEq)]
pub(super) enum Json {
    /// A whole value, and the offset in the text where it ends.
    Whole(Value, usize),
    /// The text ends (or stops being JSON) inside the value: what it holds so far.
    Open(Open),
}

/// An unfinished JSON value.
#[derive(Clone, Debug, PartialEq)]
pub(super) enum Open {
    /// Nothing but whitespace yet, or an unfinished number or literal.
    Pending,
    /// A string and its characters so far.
    Str(String),
    /// An object and its members so far, each with its whole key (a member whose key or colon
    /// is unfinished is not listed); only the last member's value may be open.
    Obj(Vec<(String, Json)>),
    /// An array and its items so far; only the last may be open.
    Arr(Vec<Json>),
}

/// What `read` found at the start of a text.
#[derive(Clone, Debug, PartialEq)]
pub(super) struct Read {
    pub json: Json,
    /// The text stops being JSON where the value is open (nothing more will be read of it).
    pub broken: bool,
}

/// Reads the JSON value at the start of `s` (after whitespace), `s` being the text so far: a
/// number at its very end may go on. A text that is not JSON reads as far as it is: the value
/// open where it breaks, `broken` set.
pub(super) fn read(s: &str) -> Read {
    Reader::new(s, false, None).read()
}

/// Strings shorter than this are read again at every reading (remembering them costs more).
/// The tests remember nearly every string, so that every format's streaming tests go through
/// the memo.
const MEMO_MIN: usize = if cfg!(test) { 2 } else { 256 };
/// At most this many strings (and as many texts) are remembered, the first ones met; the rest
/// are read again. (Few in the tests, which then meet the limit too.)
const MEMO_MAX: usize = if cfg!(test) { 3 } else { 64 };

/// The long strings earlier readings of a text found (`read_on`), for the readings of that text
/// grown.
#[derive(Clone, Debug, Default)]
pub(super) struct Memo {
    /// The text the readings are of (`anchor`): its address and length, only compared with the
    /// texts read, never followed.
    block: (usize, usize),
    strings: Vec<Seen>,
    /// Long texts written into JSON strings (`push_text`), with their JSON text.
    texts: Vec<(String, String)>,
}

/// A string read before: where its opening quote was in the anchored text, its text after the
/// quote as far as it was read (whole escapes only), the characters that text makes, and their
/// compact JSON text (`push_str_text`'s, for the stable text).
#[derive(Clone, Debug)]
struct Seen {
    at: usize,
    src: String,
    chars: String,
    json: String,
}

impl Memo {
    /// The readings until the next `anchor` are of `block` grown, or of texts inside it: the
    /// strings they find are remembered by their place in `block`.
    pub(super) fn anchor(&mut self, block: &str) {
        self.block = (block.as_ptr() as usize, block.len());
    }

    /// Where `s` starts in the anchored text, if it lies inside it.
    fn base(&self, s: &str) -> Option<usize> {
        let (at, len) = self.block;
        let p = s.as_ptr() as usize;
        (p >= at && p + s.len() <= at + len).then(|| p - at)
    }

    /// Where reading the string whose opening quote is at `at` in `s` goes on (`base` being
    /// where `s` starts in the anchored text): after the text remembered of it, if `s` still
    /// has that text there; else None.
    fn find(&self, s: &str, base: usize, at: usize) -> Option<usize> {
        let seen = self.strings.iter().find(|m| m.at == base + at)?;
        let from = at + 1;
        s.as_bytes()[from..]
            .starts_with(seen.src.as_bytes())
            .then_some(from + seen.src.len())
    }

    /// The characters of the string at `at` of `s` read as far as `end` (not into an escape),
    /// `new` being those of its text from `from`: from `find`'s place (`resumed`) the
    /// remembered ones and `new`, else `new` alone. The memo learns them.
    fn grow(
        &mut self,
        s: &str,
        base: usize,
        at: usize,
        from: usize,
        end: usize,
        new: String,
    ) -> String {
        let i = self.strings.iter().position(|m| m.at == base + at);
        let resumed =
            i.is_some_and(|i| from == at + 1 + self.strings[i].src.len()) && from > at + 1;
        let full = self.strings.len() == MEMO_MAX;
        match i.map(|i| &mut self.strings[i]) {
            Some(seen) if resumed => {
                seen.src.push_str(&s[from..end]);
                push_str_text(&mut seen.json, &new);
                seen.chars.push_str(&new);
                seen.chars.clone()
            }
            _ if end - at < MEMO_MIN || (i.is_none() && full) => new,
            _ => {
                let mut json = String::new();
                push_str_text(&mut json, &new);
                let seen = Seen {
                    at: base + at,
                    src: s[at + 1..end].to_string(),
                    chars: new.clone(),
                    json,
                };
                match i {
                    Some(i) => self.strings[i] = seen,
                    None => self.strings.push(seen),
                }
                new
            }
        }
    }

    /// Appends `push_str_text` of `chars`, a text that grows from one reading to the next (a
    /// raw parameter value being written): the part remembered from the last reading is
    /// copied, only the rest escaped, and the memo learns the whole.
    pub(super) fn push_text(&mut self, out: &mut String, chars: &str) {
        if chars.len() < MEMO_MIN {
            push_str_text(out, chars);
            return;
        }
        let grown = self
            .texts
            .iter_mut()
            .filter(|(known, _)| chars.starts_with(known.as_str()))
            .max_by_key(|(known, _)| known.len());
        match grown {
            Some((known, json)) => {
                push_str_text(json, &chars[known.len()..]);
                known.push_str(&chars[known.len()..]);
                out.push_str(json);
            }
            None => {
                let at = out.len();
                push_str_text(out, chars);
                if self.texts.len() < MEMO_MAX {
                    self.texts.push((chars.to_string(), out[at..].to_string()));
                }
            }
        }
    }

    /// The JSON text of the longest string remembered whose characters begin `chars`, and how
    /// many bytes of `chars` it writes.
    fn json_of(&self, chars: &str) -> Option<(&str, usize)> {
        self.strings
            .iter()
            .filter(|m| chars.starts_with(m.chars.as_str()))
            .max_by_key(|m| m.chars.len())
            .map(|m| (m.json.as_str(), m.chars.len()))
    }
}

/// `read(s)`, `s` being the text `memo` was last anchored to, or a text inside it, which
/// earlier readings with `memo` read shorter (the same text grown): the long strings they read
/// are not read again, only what was written after them. It gives exactly what `read` gives.
pub(super) fn read_on(s: &str, memo: &mut Memo) -> Read {
    match memo.base(s) {
        Some(base) => Reader::new(s, false, Some((memo, base))).read(),
        None => read(s),
    }
}

/// The whole JSON value at the start of `s` (after whitespace) and the offset where it ends,
/// `s` being finished; None when it is not a whole value there.
pub(super) fn value(s: &str) -> Option<(Value, usize)> {
    match Reader::new(s, true, None).read().json {
        Json::Whole(v, end) => Some((v, end)),
        Json::Open(_) => None,
    }
}

/// The JSON value `s` is (whitespace around it allowed), as `serde_json::from_str` reads it
/// but for a repeated key, which keeps its first value.
pub(super) fn whole(s: &str) -> Option<Value> {
    let (v, end) = value(s)?;
    s[end..]
        .bytes()
        .all(|b| matches!(b, b' ' | b'\t' | b'\n' | b'\r'))
        .then_some(v)
}

struct Reader<'s, 'm> {
    s: &'s str,
    b: &'s [u8],
    /// The text is finished: a number at its end is whole.
    finished: bool,
    broken: bool,
    /// The memo of `read_on`, and where `s` starts in the text it is anchored to.
    memo: Option<(&'m mut Memo, usize)>,
}

/// The UTF-16 unit that the four hex digits `h` write, if they are four hex digits.
fn hex_unit(h: &[u8]) -> Option<u32> {
    if h.len() != 4 || !h.iter().all(u8::is_ascii_hexdigit) {
        return None;
    }
    std::str::from_utf8(h)
        .ok()
        .and_then(|h| u32::from_str_radix(h, 16).ok())
}

const LEAD: std::ops::RangeInclusive<u32> = 0xD800..=0xDBFF;
const TRAIL: std::ops::RangeInclusive<u32> = 0xDC00..=0xDFFF;

/// The characters of a JSON string's text after its opening quote (its escapes whole and
/// well formed, as `Reader::string` reads them): a surrogate pair's escapes as the character
/// they make, a lone surrogate's as U+FFFD. A malformed escape (which `string` never passes)
/// is read as U+FFFD too, never a panic.
fn unescape(body: &str) -> String {
    let mut out = String::with_capacity(body.len());
    let mut rest = body;
    while let Some(i) = rest.find('\\') {
        out.push_str(&rest[..i]);
        let e = &rest[i + 1..];
        let (c, n) = match e.as_bytes().first() {
            Some(b'"') => ('"', 1),
            Some(b'\\') => ('\\', 1),
            Some(b'/') => ('/', 1),
            Some(b'b') => ('\u{8}', 1),
            Some(b'f') => ('\u{c}', 1),
            Some(b'n') => ('\n', 1),
            Some(b'r') => ('\r', 1),
            Some(b't') => ('\t', 1),
            Some(b'u') => {
                let b = e.as_bytes();
                let unit = |at: usize| b.get(at..at + 4).and_then(hex_unit);
                match (unit(1), b.get(5..7) == Some(b"\\u"), unit(7)) {
                    (Some(hi), true, Some(lo)) if LEAD.contains(&hi) && TRAIL.contains(&lo) => {
                        let c = 0x10000 + ((hi - 0xD800) << 10) + (lo - 0xDC00);
                        (char::from_u32(c).unwrap_or('\u{FFFD}'), 11)
                    }
                    (Some(u), _, _) => (char::from_u32(u).unwrap_or('\u{FFFD}'), 5),
                    (None, _, _) => ('\u{FFFD}', 1),
                }
            }
            _ => ('\u{FFFD}', 0),
        };
        out.push(c);
        rest = &e[n..];
    }
    out.push_str(rest);
    out
}

impl<'s, 'm> Reader<'s, 'm> {
    fn new(s: &'s str, finished: bool, memo: Option<(&'m mut Memo, usize)>) -> Reader<'s, 'm> {
        Reader {
            s,
            b: s.as_bytes(),
            finished,
            broken: false,
            memo,
        }
    }

    fn read(mut self) -> Read {
        let json = self.value(0, 0);
        Read {
            json,
            broken: self.broken,
        }
    }

    fn ws(&self, mut i: usize) -> usize {
        while i < self.b.len() && matches!(self.b[i], b' ' | b'\t' | b'\n' | b'\r') {
            i += 1;
        }
        i
    }

    /// The text stops being JSON: the value is open where it is.
    fn bad(&mut self, open: Open) -> Json {
        self.broken = true;
        Json::Open(open)
    }

    /// The whole value spanning `s[start..end]`, read by serde_json.
    fn whole(&mut self, start: usize, end: usize, open: impl FnOnce() -> Open) -> Json {
        match serde_json::from_str::<Value>(&self.s[start..end]) {
            Ok(v) => Json::Whole(v, end),
            Err(_) => {
                let o = open();
                self.bad(o)
            }
        }
    }

    fn value(&mut self, at: usize, depth: usize) -> Json {
        let i = self.ws(at);
        if i == self.b.len() {
            return Json::Open(Open::Pending);
        }
        if depth >= MAX_DEPTH {
            return self.bad(Open::Pending);
        }
        match self.b[i] {
            b'"' => self.string(i),
            b'{' => self.object(i, depth),
            b'[' => self.array(i, depth),
            b'-' | b'0'..=b'9' => self.number(i),
            b't' | b'f' | b'n' => self.literal(i),
            _ => self.bad(Open::Pending),
        }
    }

    /// The characters of the string at `start` up to `end` (not inside an escape), its text
    /// before `from` being what the memo holds of it (`Reader::from`).
    fn chars(&mut self, start: usize, from: usize, end: usize) -> String {
        let new = unescape(&self.s[from..end]);
        match &mut self.memo {
            Some((m, base)) => m.grow(self.s, *base, start, from, end, new),
            None => new,
        }
    }

    /// Where reading the string at `start` goes on: after what the memo holds of it, or right
    /// after its opening quote.
    fn from(&self, start: usize) -> usize {
        self.memo
            .as_ref()
            .and_then(|(m, base)| m.find(self.s, *base, start))
            .unwrap_or(start + 1)
    }

    fn string(&mut self, start: usize) -> Json {
        let b = self.b;
        let from = self.from(start);
        let open = |r: &mut Self, end: usize, broken: bool| {
            let o = Open::Str(r.chars(start, from, end));
            if broken {
                r.bad(o)
            } else {
                Json::Open(o)
            }
        };
        let mut j = from;
        while j < b.len() {
            match b[j] {
                b'"' => {
                    let chars = self.chars(start, from, j);
                    return Json::Whole(Value::String(chars), j + 1);
                }
                b'\\' => {
                    let Some(&e) = b.get(j + 1) else {
                        return open(self, j, false);
                    };
                    match e {
                        b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't' => j += 2,
                        b'u' => {
                            if j + 6 > b.len() {
                                return open(self, j, false);
                            }
                            let Some(unit) = hex_unit(&b[j + 2..j + 6]) else {
                                return open(self, j, true);
                            };
                            if !LEAD.contains(&unit) {
                                j += 6;
                                continue;
                            }
                            // a leading surrogate: held while its trailing half may follow
                            if j + 12 > b.len() {
                                let written = &b[j + 6..];
                                let fits = written.iter().zip(b"\\u").all(|(a, b)| a == b)
                                    && written.iter().skip(2).all(u8::is_ascii_hexdigit);
                                if fits {
                                    return open(self, j, false);
                                }
                            }
                            let pair = j + 12 <= b.len()
                                && &b[j + 6..j + 8] == b"\\u"
                                && hex_unit(&b[j + 8..j + 12]).is_some_and(|u| TRAIL.contains(&u));
                            // (a lone one reads as U+FFFD)
                            j += if pair { 12 } else { 6 };
                        }
                        _ => return open(self, j, true),
                    }
                }
                c if c < 0x20 => return open(self, j, true),
                _ => j += 1,
            }
        }
        open(self, j, false)
    }

    fn number(&mut self, start: usize) -> Json {
        let b = self.b;
        let mut j = start;
        while j < b.len() && matches!(b[j], b'-' | b'+' | b'.' | b'e' | b'E' | b'0'..=b'9') {
            j += 1;
        }
        if j == b.len() && !self.finished {
            return Json::Open(Open::Pending);
        }
        self.whole(start, j, || Open::Pending)
    }

    fn literal(&mut self, start: usize) -> Json {
        let rest = &self.b[start..];
        for lit in [&b"true"[..], b"false", b"null"] {
            if rest.starts_with(lit) {
                return self.whole(start, start + lit.len(), || Open::Pending);
            }
            if lit.starts_with(rest) && !self.finished {
                return Json::Open(Open::Pending);
            }
        }
        self.bad(Open::Pending)
    }

    fn object(&mut self, start: usize, depth: usize) -> Json {
        // the whole members so far, and where each one's value ends
        let mut map = serde_json::Map::new();
        let mut ends = Vec::new();
        let members = |map: serde_json::Map<String, Value>, ends: Vec<usize>| {
            map.into_iter()
                .zip(ends)
                .map(|((k, v), e)| (k, Json::Whole(v, e)))
                .collect::<Vec<_>>()
        };
        let mut j = self.ws(start + 1);
        if j < self.b.len() && self.b[j] == b'}' {
            return Json::Whole(Value::Object(map), j + 1);
        }
        loop {
            if j == self.b.len() {
                return Json::Open(Open::Obj(members(map, ends)));
            }
            if self.b[j] != b'"' {
                return self.bad(Open::Obj(members(map, ends)));
            }
            let key = match self.string(j) {
                Json::Whole(Value::String(k), e) => {
                    j = e;
                    k
                }
                // the key unfinished (or broken): the member is not listed yet
                _ => return Json::Open(Open::Obj(members(map, ends))),
            };
            j = self.ws(j);
            if j == self.b.len() {
                return Json::Open(Open::Obj(members(map, ends)));
            }
            if self.b[j] != b':' {
                return self.bad(Open::Obj(members(map, ends)));
            }
            // a repeated key keeps its first value: the repeat is read and left out
            let repeat = map.contains_key(&key);
            match self.value(j + 1, depth + 1) {
                Json::Whole(v, e) => {
                    if !repeat {
                        map.insert(key, v);
                        ends.push(e);
                    }
                    j = self.ws(e);
                }
                open => {
                    let mut m = members(map, ends);
                    if !repeat {
                        m.push((key, open));
                    }
                    return Json::Open(Open::Obj(m));
                }
            }
            if j == self.b.len() {
                return Json::Open(Open::Obj(members(map, ends)));
            }
            match self.b[j] {
                b',' => j = self.ws(j + 1),
                b'}' => return Json::Whole(Value::Object(map), j + 1),
                _ => return self.bad(Open::Obj(members(map, ends))),
            }
        }
    }

    fn array(&mut self, start: usize, depth: usize) -> Json {
        // the whole items so far, and where each one ends
        let mut values = Vec::new();
        let mut ends = Vec::new();
        let items = |values: Vec<Value>, ends: Vec<usize>| {
            values
                .into_iter()
                .zip(ends)
                .map(|(v, e)| Json::Whole(v, e))
                .collect::<Vec<_>>()
        };
        let mut j = self.ws(start + 1);
        if j < self.b.len() && self.b[j] == b']' {
            return Json::Whole(Value::Array(values), j + 1);
        }
        loop {
            match self.value(j, depth + 1) {
                Json::Whole(v, e) => {
                    values.push(v);
                    ends.push(e);
                    j = self.ws(e);
                }
                open => {
                    let mut all = items(values, ends);
                    all.push(open);
                    return Json::Open(Open::Arr(all));
                }
            }
            if j == self.b.len() {
                return Json::Open(Open::Arr(items(values, ends)));
            }
            match self.b[j] {
                b',' => j += 1,
                b']' => return Json::Whole(Value::Array(values), j + 1),
                _ => return self.bad(Open::Arr(items(values, ends))),
            }
        }
    }
}

/// Appends `v`'s compact JSON text (serde_json's, as `Value::to_string` writes it); long
/// strings that `memo` remembers are not escaped again.
pub(super) fn push_compact(out: &mut String, v: &Value, memo: Option<&Memo>) {
    match v {
        Value::String(t) => {
            out.push('"');
            push_string(out, t, memo);
            out.push('"');
        }
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                push_compact(out, item, memo);
            }
            out.push(']');
        }
        Value::Object(members) => {
            out.push('{');
            for (i, (k, item)) in members.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                push_key(out, k);
                push_compact(out, item, memo);
            }
            out.push('}');
        }
        other => out.push_str(&other.to_string()),
    }
}

/// Appends an object member's key and colon, `"k":`.
pub(super) fn push_key(out: &mut String, k: &str) {
    out.push('"');
    push_str_text(out, k);
    out.push_str("\":");
}

/// `push_str_text` of `t`, the part of it that `memo` remembers copied.
fn push_string(out: &mut String, t: &str, memo: Option<&Memo>) {
    let known = match memo
        .filter(|_| t.len() >= MEMO_MIN)
        .and_then(|m| m.json_of(t))
    {
        Some((json, n)) => {
            out.push_str(json);
            n
        }
        None => 0,
    };
    push_str_text(out, &t[known..]);
}

/// Appends the text of a JSON string of the characters `s`, without its quotes, escaped as
/// serde_json escapes it: `"` and `\` by a backslash, the control characters below U+0020 as
/// `\b \t \n \f \r` or `\u00xx`, the rest as it is. Runs that need no escape are copied
/// a block at a time, so a long string costs about a copy.
pub(super) fn push_str_text(out: &mut String, s: &str) {
    const BLOCK: usize = 32;
    let needs = |c: u8| c < 0x20 || c == b'"' || c == b'\\';
    let b = s.as_bytes();
    out.reserve(b.len());
    let mut run = 0;
    for (k, block) in b.chunks(BLOCK).enumerate() {
        // (an `any` of every byte of the block, which vectorizes)
        if !block.iter().fold(false, |a, &c| a | needs(c)) {
            continue;
        }
        for (i, &c) in block.iter().enumerate() {
            if !needs(c) {
                continue;
            }
            let i = k * BLOCK + i;
            out.push_str(&s[run..i]);
            match c {
                b'"' => out.push_str("\\\""),
                b'\\' => out.push_str("\\\\"),
                0x08 => out.push_str("\\b"),
                0x09 => out.push_str("\\t"),
                0x0a => out.push_str("\\n"),
                0x0c => out.push_str("\\f"),
                0x0d => out.push_str("\\r"),
                _ => {
                    const HEX: &[u8; 16] = b"0123456789abcdef";
                    out.push_str("\\u00");
                    out.push(HEX[usize::from(c >> 4)] as char);
                    out.push(HEX[usize::from(c & 15)] as char);
                }
            }
            run = i + 1;
        }
    }
    out.push_str(&s[run..]);
}

impl Json {
    /// The compact JSON text that begins this value's final compact text whatever follows.
    pub(super) fn stable(&self) -> String {
        let mut out = String::new();
        self.stable_into(&mut out, None);
        out
    }

    /// `stable`, with the long strings `memo` remembers (`read_on`'s) not escaped again.
    fn stable_into(&self, out: &mut String, memo: Option<&Memo>) {
        match self {
            Json::Whole(v, _) => push_compact(out, v, memo),
            Json::Open(Open::Pending) => {}
            Json::Open(Open::Str(t)) => {
                out.push('"');
                push_string(out, t, memo);
            }
            Json::Open(Open::Obj(members)) => {
                out.push('{');
                for (i, (k, v)) in members.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    push_key(out, k);
                    v.stable_into(out, memo);
                }
            }
            Json::Open(Open::Arr(items)) => {
                out.push('[');
                for (i, v) in items.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    v.stable_into(out, memo);
                }
            }
        }
    }

    /// The value of `key` in an object, whole or open (a repeated key was left out as it was
    /// read: its first value is the one there).
    pub(super) fn get(&self, key: &str) -> Option<Json> {
        match self {
            Json::Whole(Value::Object(o), end) => o.get(key).map(|v| Json::Whole(v.clone(), *end)),
            Json::Open(Open::Obj(members)) => members
                .iter()
                .find(|(k, _)| k == key)
                .map(|(_, v)| v.clone()),
            _ => None,
        }
    }

    /// A string's value once whole.
    pub(super) fn whole_str(&self) -> Option<&str> {
        match self {
            Json::Whole(Value::String(s), _) => Some(s),
            _ => None,
        }
    }

    /// What a call's arguments stream so far: the stable text of an object (whole or open),
    /// nothing for a value not begun, and nothing for any other value (then `parse` reads no
    /// call, and what streaming sent stands as the call's arguments).
    pub(super) fn stable_object(&self) -> String {
        self.stable_object_on(None)
    }

    /// `stable_object`, with the long strings `memo` remembers not escaped again.
    pub(super) fn stable_object_on(&self, memo: Option<&Memo>) -> String {
        let mut out = String::new();
        if let Json::Whole(Value::Object(_), _) | Json::Open(Open::Obj(_)) = self {
            self.stable_into(&mut out, memo);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_util::{layouts, prefixes, Rng};
    use super::*;
    use serde_json::json;

    fn random_value(rng: &mut Rng, depth: usize) -> Value {
        let strings = [
            "",
            "a",
            "Paris, FR",
            "é\"\\/\n\t\u{1}",
            "😀 x",
            "</tool_call>",
            "\u{7f}",
        ];
        match rng.below(if depth > 3 { 5 } else { 7 }) {
            0 => json!(strings[rng.below(strings.len())]),
            1 => json!(rng.below(1000) as i64 - 500),
            2 => json!((rng.below(100_000) as f64) / 64.0 - 700.5),
            3 => [json!(true), json!(false), Value::Null][rng.below(3)].clone(),
            4 => json!(rng.next()),
            5 => Value::Array(
                (0..rng.below(4))
                    .map(|_| random_value(rng, depth + 1))
                    .collect(),
            ),
            _ => {
                let mut m = serde_json::Map::new();
                for i in 0..rng.below(4) {
                    m.insert(
                        format!("k{i}{}", strings[rng.below(3)]),
                        random_value(rng, depth + 1),
                    );
                }
                Value::Object(m)
            }
        }
    }

    /// Checks every prefix `p` of `text`, whose value's compact text is `fin`: it reads without
    /// breaking, its stable text `s` begins `fin` and begins the next prefix's; `each(p, s)`
    /// checks more. Returns the number of prefixes.
    fn check_prefixes(text: &str, fin: &str, mut each: impl FnMut(&str, &str)) -> usize {
        let mut last = String::new();
        let mut n = 0;
        for p in prefixes(text) {
            let r = read(p);
            assert!(!r.broken, "{p:?}");
            let s = r.json.stable();
            assert!(fin.starts_with(&s), "{text:?} at {p:?}: {s:?} vs {fin:?}");
            assert!(s.starts_with(&last), "{p:?}: {s:?} after {last:?}");
            each(p, &s);
            last = s;
            n += 1;
        }
        n
    }

    /// Every prefix of every layout of random values (compact, pretty, Python's spacing and
    /// \u escapes) reads without breaking, gives a stable text that begins the value's compact
    /// text and never shrinks, and the whole text reads as the value itself.
    #[test]
    fn stable_text_is_a_prefix_of_the_final_one() {
        let mut rng = Rng(0x5EED_9A27);
        let mut checked = 0;
        for _ in 0..400 {
            let v = random_value(&mut rng, 0);
            let fin = v.to_string();
            for text in layouts(&v) {
                checked += check_prefixes(&text, &fin, |_, _| {});
                // (a number at the very end may go on: one space ends it)
                let r = read(&format!("{text} ")).json;
                assert_eq!(r, Json::Whole(v.clone(), text.len()), "{text:?}");
                assert_eq!(r.stable(), fin);
            }
        }
        assert!(checked > 20_000, "{checked}");
    }

    /// Strings of random pieces with lone surrogate escapes (a leading or trailing half, with
    /// other escapes and characters around, pairs among them): every prefix reads without
    /// breaking, its stable text never shrinks and begins the final text, a leading half is
    /// held while its trailing half may follow, and the whole reads with U+FFFD for each
    /// lone half.
    #[test]
    fn lone_surrogates_read_as_the_replacement_character() {
        const PIECES: &[(&str, &str)] = &[
            ("a", "a"),
            ("é", "é"),
            ("\\n", "\n"),
            ("\\\\", "\\"),
            ("\\u0041", "A"),
            ("\\ud83d\\ude00", "😀"),
            ("\\ud800", "\u{FFFD}"),
            ("\\uDBFF", "\u{FFFD}"),
            ("\\udc00", "\u{FFFD}"),
            ("\\uDFFF", "\u{FFFD}"),
        ];
        let mut rng = Rng(0x5EED_DC00);
        let mut lone = 0;
        for _ in 0..300 {
            let (mut body, mut chars) = (String::new(), String::new());
            let mut after_lead = false;
            for _ in 0..rng.below(8) {
                let (text, c) = PIECES[rng.below(PIECES.len())];
                let trail = text.starts_with("\\udc") || text.starts_with("\\uDF");
                if after_lead && trail {
                    continue; // (it would make a pair)
                }
                after_lead = text == "\\ud800" || text == "\\uDBFF";
                lone += usize::from(c == "\u{FFFD}");
                body.push_str(text);
                chars.push_str(c);
            }
            let text = format!(r#"{{"k": ["{body}", 1]}}"#);
            let fin = json!({"k": [chars, 1]}).to_string();
            check_prefixes(&text, &fin, |p, s| {
                if p.ends_with("\\ud800") || p.ends_with("\\uDBFF") {
                    // held until what follows shows it lone
                    let on = read(&format!("{p}x")).json.stable();
                    assert_eq!(on, format!("{s}\u{FFFD}x"), "{p:?}");
                }
            });
            assert_eq!(whole(&text), Some(json!({"k": [chars, 1]})), "{text}");
        }
        assert!(lone > 200, "{lone}");
    }

    /// Text that stops being JSON breaks where it stops, keeping what it held before; a
    /// repeated key breaks the reading; a surrogate pair is held until whole.
    #[test]
    fn broken_text_and_repeats() {
        for (text, stable) in [
            (r#"{"a": 1 x"#, r#"{"a":1"#),
            (r#"{"a": [1, 2}"#, r#"{"a":[1,2"#),
            (r#"{"a": "x\q"#, r#"{"a":"x"#),
            (r#"{"a": tru "#, r#"{"a":"#),
            (r#"{"a": 01,"#, r#"{"a":"#),
            ("{\"a\": \"x\u{1}", r#"{"a":"x"#),
            (r#"{1"#, r#"{"#),
            (r#"x"#, ""),
        ] {
            let r = read(text);
            assert!(r.broken, "{text}");
            assert_eq!(r.json.stable(), stable, "{text}");
        }
        // a repeated key keeps its first value, open or whole, here as in `whole`
        for (text, stable) in [
            (r#"{"a": 1, "b": 2, "a": 3"#, r#"{"a":1,"b":2"#),
            (r#"{"a": 1, "b": 2, "a": [3, "#, r#"{"a":1,"b":2"#),
            (r#"{"a": {"b": 2, "b""#, r#"{"a":{"b":2"#),
            (
                r#"{"a": 1, "b": 2, "a": 3, "c": 4}"#,
                r#"{"a":1,"b":2,"c":4}"#,
            ),
            (r#"{"a": {"b": 2, "b": 1}}"#, r#"{"a":{"b":2}}"#),
        ] {
            let r = read(text);
            assert!(!r.broken, "{text}");
            assert_eq!(r.json.stable(), stable, "{text}");
        }
        assert_eq!(
            whole(r#" {"a": 1, "\u0061": [2], "b": {"c": 3, "c": 4}} "#),
            Some(json!({"a": 1, "b": {"c": 3}}))
        );
        assert_eq!(whole(r#"{"a": 1} x"#), None);
        assert_eq!(whole("12"), Some(json!(12)));
        assert_eq!(value("[1, 2] x"), Some((json!([1, 2]), 6)));
        assert!(read(r#"{"a": 1, "a": x"#).broken);
        for (text, stable) in [
            (r#"{"a": "\ud83d"#, r#"{"a":""#),
            (r#"{"a": "\ud83d\u"#, r#"{"a":""#),
            (r#"{"a": "\ud83d\ude0"#, r#"{"a":""#),
            (r#"{"a": "\ud83d\ude00"#, r#"{"a":"😀"#),
            (r#"{"a": -1.5e"#, r#"{"a":"#),
            (r#"{"a": -1.5e3,"#, r#"{"a":-1500.0"#),
            (r#"{"a": nul"#, r#"{"a":"#),
            (r#"{"a""#, r#"{"#),
        ] {
            let r = read(text);
            assert!(!r.broken, "{text}");
            assert_eq!(r.json.stable(), stable, "{text}");
        }
        let deep = "[".repeat(200);
        assert!(read(&deep).broken);
        let r = read(r#"{"a": 1, "b": {"c": [2,"#);
        assert_eq!(r.json.get("a"), Some(Json::Whole(json!(1), 7)));
        assert_eq!(r.json.get("b").unwrap().stable_object(), r#"{"c":[2,"#);
        assert_eq!(r.json.get("x"), None);
    }

    /// Random texts of long strings (escapes, surrogate pairs and lone halves, non-ASCII)
    /// in objects and arrays, read on with one memo at every prefix and at random pieces'
    /// ends: each reading equals `read`'s, and its stable text (`stable_object_on` with the
    /// memo) equals `stable`'s. The memo, fed other texts between (another value, the same
    /// text shifted, a string changed behind what was read), still reads each as `read` does.
    #[test]
    fn reading_on_with_a_memo_equals_reading_again() {
        const PIECES: &[&str] = &[
            "a",
            "é",
            "😀",
            " ",
            "\\n",
            "\\\\",
            "\\\"",
            "\\u0041",
            "\\ud83d\\ude00",
            "\\ud800",
            "\\udc00",
            "\\/",
            "\\t",
            "<x>",
            "{",
            "]",
        ];
        let mut rng = Rng(0x5EED_3E30);
        let mut long = || -> String {
            (0..rng.below(40))
                .map(|_| PIECES[rng.below(PIECES.len())])
                .collect()
        };
        let mut checked = 0;
        for round in 0..120 {
            let (a, b, c) = (long(), long(), long());
            let text = match round % 4 {
                0 => format!(r#"{{"path": "{a}", "text": "{b}"}}"#),
                1 => format!(r#"{{"k": ["{a}", {{"x": "{b}", "y": 12}}, "{c}"], "z": "{a}"}}"#),
                2 => format!(r#"["{a}", "{b}", "{c}", "{a}{b}"]"#),
                _ => format!(r#"{{"a": "{a}", "a": "{b}", "b": "{c}""#),
            };
            let other = format!(r#"{{"q": "{c}{a}"}}"#);
            let mut memo = Memo::default();
            for (i, p) in prefixes(&text).enumerate() {
                memo.anchor(p);
                let on = read_on(p, &mut memo);
                let again = read(p);
                assert_eq!(on, again, "{p:?}");
                assert_eq!(
                    on.json.stable_object_on(Some(&memo)),
                    again.json.stable_object(),
                    "{p:?}"
                );
                assert_eq!(on.json.stable(), again.json.stable(), "{p:?}");
                checked += 1;
                if i % 17 == 5 {
                    // other texts read with the same memo between
                    for t in [other.as_str(), &format!(" {p}"), &p.replacen('a', "b", 1)] {
                        memo.anchor(t);
                        assert_eq!(read_on(t, &mut memo), read(t), "{t:?}");
                    }
                }
            }
        }
        assert!(checked > 10_000, "{checked}");
    }

    /// A text written into a JSON string as it grows (`Memo::push_text`) gives
    /// `push_str_text`'s JSON text at every length, with others between; and `push_str_text`
    /// escapes as serde_json does, every control character included.
    #[test]
    fn texts_pushed_on_are_escaped_as_serde_json_escapes_them() {
        let mut rng = Rng(0x5EED_7E47);
        let chars: Vec<char> = (0u32..0x30)
            .chain([0x7f, 0x80, 0xe9, 0x2028, 0x1f600])
            .filter_map(char::from_u32)
            .chain("\"\\/abc <>".chars())
            .collect();
        let mut memo = Memo::default();
        for _ in 0..200 {
            let text: String = (0..rng.below(300))
                .map(|_| chars[rng.below(chars.len())])
                .collect();
            let q = serde_json::to_string(&text).unwrap();
            let mut plain = String::new();
            push_str_text(&mut plain, &text);
            assert_eq!(plain, q[1..q.len() - 1]);
            for cut in (0..=text.len())
                .filter(|&c| text.is_char_boundary(c))
                .step_by(7)
            {
                let (mut got, mut want) = (String::new(), String::new());
                memo.push_text(&mut got, &text[..cut]);
                push_str_text(&mut want, &text[..cut]);
                assert_eq!(got, want);
            }
        }
    }
}
