//! Unit and property tests. The live comparison with llama.cpp is
//! tests/python/test_grammar_llamacpp.py.

use crate::parse::Elem;
use crate::vocab::{cut_at_nul, decode, Partial};
use crate::{Grammar, GrammarError, GrammarState, Limits, Vocab};
use rand::rngs::StdRng;
use rand::{RngCore, SeedableRng};
use std::collections::HashSet;
use std::sync::Arc;

/// The property tests' seeded generator.
struct Rng(StdRng);

impl Rng {
    fn new(seed: u64) -> Rng {
        Rng(StdRng::seed_from_u64(seed))
    }
    fn next(&mut self) -> u64 {
        self.0.next_u64()
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
    fn chance(&mut self, p: f64) -> bool {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64 <= p
    }
    fn pick<'a, T>(&mut self, xs: &'a [T]) -> &'a T {
        &xs[self.below(xs.len())]
    }
}

/// The seed of a property test: MUSER_GRAMMAR_SEED or a fixed default, printed for replay.
fn seed(name: &str, default: u64) -> u64 {
    let s = std::env::var("MUSER_GRAMMAR_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default);
    eprintln!("{name}: seed {s} (MUSER_GRAMMAR_SEED={s} replays)");
    s
}

fn g(src: &str) -> Grammar {
    Grammar::parse(src).unwrap_or_else(|e| panic!("{src:?}: {e}"))
}

fn err(src: &str) -> GrammarError {
    match Grammar::parse(src) {
        Ok(_) => panic!("{src:?} parsed but should not"),
        Err(e) => e,
    }
}

fn parse_err(src: &str) -> (usize, usize, String) {
    match err(src) {
        GrammarError::Parse { line, col, msg } => (line, col, msg),
        e => panic!("{src:?}: expected a parse error, got {e}"),
    }
}

// ---------------------------------------------------------------------------------------------
// Parse errors

#[test]
fn parse_errors_name_position_and_expectation() {
    let cases: &[(&str, usize, usize, &str)] = &[
        ("root ::= \"abc", 1, 14, "unterminated string literal"),
        ("root ::= [a-z", 1, 14, "unterminated character class"),
        ("root ::= (\"a\"", 1, 14, "expected ')'"),
        ("root := \"a\"", 1, 6, "expected '::='"),
        (
            "root ::= \"a\" )",
            1,
            14,
            "expected a newline or the end of input",
        ),
        ("root ::= \"\\q\"", 1, 11, "unknown escape"),
        ("root ::= \"\\x4\"", 1, 13, "expected 2 hexadecimal digits"),
        (
            "root ::= \"\\u12G4\"",
            1,
            13,
            "expected 4 hexadecimal digits",
        ),
        (
            "root ::= *",
            1,
            10,
            "expected an item before the repetition operator",
        ),
        (
            "root ::= \"\" +",
            1,
            13,
            "expected an item before the repetition operator",
        ),
        ("root ::= \"a\"{3001}", 1, 13, "exceeds the limit of 2000"),
        ("root ::= \"a\"{100}{100}", 1, 18, "more than 2000 copies"),
        ("root ::= \"a\"{5,3}", 1, 13, "below its minimum"),
        ("root ::= \"a\"{,3}", 1, 14, "expected an integer after '{'"),
        ("root ::= \"a\"{3;}", 1, 15, "expected ',' or '}'"),
        ("root ::= \"a\"{3,4", 1, 17, "expected '}'"),
        (
            "root ::= \"a\"{99999999999999999999999}",
            1,
            14,
            "too large",
        ),
        ("root ::= <think>", 1, 10, "needs a vocabulary"),
        ("root ::= !\"a\"", 1, 11, "expected '<' after '!'"),
        ("root ::= <[12>", 1, 14, "expected ']'"),
        ("root ::= <[12]", 1, 15, "expected '>'"),
        ("root ::= <[99999999999]>", 1, 10, "token id is too large"),
        ("root ::= <[]>", 1, 12, "expected a token id"),
        ("root ::= \"a\"\n  | \"b\"", 2, 3, "expected a rule name"),
        (
            "root ::= \"a\"\nfoo ::= [",
            2,
            10,
            "unterminated character class",
        ),
        ("root ::= \"é\" \"日本\" (", 1, 20, "expected ')'"),
        ("root ::= [a-", 1, 13, "unexpected end of input"),
    ];
    for &(src, line, col, want) in cases {
        let (l, c, msg) = parse_err(src);
        assert!(
            msg.contains(want),
            "{src:?}: message {msg:?} lacks {want:?}"
        );
        assert_eq!((l, c), (line, col), "{src:?}: position of {msg:?}");
        let shown = format!("{}", err(src));
        assert!(shown.contains(&format!("{line}:{col}")), "{shown}");
    }
}

#[test]
fn structural_errors() {
    assert!(matches!(err("root ::= foo"), GrammarError::UndefinedRule(n) if n == "foo"));
    assert!(
        matches!(err("root ::= \"a\" | bar-2 \"b\"\nx ::= \"c\""), GrammarError::UndefinedRule(n) if n == "bar-2")
    );
    assert!(matches!(err("foo ::= \"x\""), GrammarError::MissingRoot));
    assert!(matches!(err(""), GrammarError::Empty));
    assert!(matches!(err("  # only a comment\n\n"), GrammarError::Empty));
    assert!(
        matches!(err("root ::= \"a\" | root \"a\""), GrammarError::LeftRecursion(n) if n == "root")
    );
    let hard = "root ::= asdf\nasdf ::= \"a\" | foo \"b\"\nfoo ::= \"c\" | empty asdf \"d\" | \"e\"\nempty ::= \"blah\" | ";
    assert!(matches!(err(hard), GrammarError::LeftRecursion(_)));
    // Through a repetition: x* has an empty alternative.
    assert!(
        matches!(err("root ::= \"x\"* root \"y\" | \"z\""), GrammarError::LeftRecursion(n) if n == "root")
    );
    // Through a rule that derives "" without an empty alternative, growing the stack: llama.cpp
    // would expand forever; refused.
    let grow = "root ::= b root \"x\" | \"y\"\nb ::= c\nc ::= \"z\" | ";
    assert!(
        matches!(err(grow), GrammarError::LeftRecursion(n) if n == "root"),
        "{}",
        err(grow)
    );
    // The same in last position is finite (llama.cpp accepts it): (b)* "y" in effect.
    let tail = g("root ::= b root | \"y\"\nb ::= c\nc ::= \"z\" | ");
    for (s, ok) in [
        ("y", true),
        ("zy", true),
        ("zzzy", true),
        ("z", false),
        ("yz", false),
    ] {
        assert_eq!(tail.accepts_str(s), ok, "{s}");
    }
    // Deep nesting is refused, not a stack overflow.
    let deep = format!("root ::= {}\"a\"{}", "(".repeat(5000), ")".repeat(5000));
    assert!(parse_err(&deep).2.contains("nested deeper"));
    let ok = format!("root ::= {}\"a\"{}", "(".repeat(200), ")".repeat(200));
    assert!(g(&ok).accepts_str("a"));
}

#[test]
fn token_text_refs_go_through_lookup() {
    let lookup = |t: &str| match t {
        "<think>" => Some(7),
        "</think>" => Some(8),
        _ => None,
    };
    let gr =
        Grammar::parse_with_tokens("root ::= <think> !</think>* </think> \"x\"", &lookup).unwrap();
    assert_eq!(gr.rule_count(), 2);
    let e = Grammar::parse_with_tokens("root ::= <nope>", &lookup).unwrap_err();
    assert!(e.to_string().contains("invalid token <nope>"), "{e}");
    let e = Grammar::parse_with_tokens("root ::= <think", &lookup).unwrap_err();
    assert!(e.to_string().contains("expected '>'"), "{e}");
    // Id refs work without a vocabulary.
    assert!(Grammar::parse("root ::= <[5]> !<[6]>").is_ok());
}

// ---------------------------------------------------------------------------------------------
// Languages

fn check_lang(src: &str, yes: &[&str], no: &[&str]) {
    let gr = g(src);
    for s in yes {
        assert!(gr.accepts_str(s), "{src:?} should accept {s:?}");
    }
    for s in no {
        assert!(!gr.accepts_str(s), "{src:?} should reject {s:?}");
    }
}

#[test]
fn languages_of_small_grammars() {
    check_lang("root ::= \"abc\"", &["abc"], &["", "ab", "abcd", "abd"]);
    check_lang(
        "root ::= \"a\" | \"b\" \"c\" | ",
        &["", "a", "bc"],
        &["b", "c", "ac"],
    );
    check_lang(
        "root ::= [a-c]+ [^a-c]",
        &["ad", "abcx", "c\n"],
        &["a", "d", "abc"],
    );
    check_lang(
        "root ::= [^\\n]* \"\\n\"",
        &["\n", "abc\n", "é\n"],
        &["", "a\nb\n"],
    );
    check_lang("root ::= . .", &["ab", "日本", "\n\t"], &["a", "abc"]);
    check_lang(
        "root ::= \"\\x41\\u00e9\\U0001F600\\t\\r\\n\\\\\\\"\\[\\]\\-\"",
        &["Aé😀\t\r\n\\\"[]-"],
        &["Aé"],
    );
    check_lang("root ::= [\\]\\[-]+", &["[]-", "-"], &["a", ""]);
    check_lang("root ::= [a-]+", &["a-a", "-"], &["b"]);
    check_lang("root ::= \"x\" [] [^] \"y\"", &["xy"], &["x", "xzy"]);
    check_lang("root ::= [z-a] | \"q\"", &["q"], &["a", "z", "m"]);
    // Newlines: inside parentheses anywhere; after '|' even at top level.
    check_lang(
        "root ::= (\n  \"a\"\n  | \"b\"\n)\nother ::= \"c\"",
        &["a", "b"],
        &["c"],
    );
    check_lang("root ::= \"a\" |\n  \"b\"  # comment\n", &["a", "b"], &[""]);
    check_lang(
        "root ::= x-1 Y2\nx-1 ::= \"x\"\nY2 ::= \"y\"",
        &["xy"],
        &["x"],
    );
    check_lang("root ::= \"a\"\r\nroot ::= \"b\"\r\n", &["b"], &["a"]);
    check_lang("root ::= \"a\" # \"b\"\n", &["a"], &["ab"]);
    // Repetition binds to the whole literal and to the last item only.
    check_lang(
        "root ::= \"ab\"{2} \"c\"*",
        &["abab", "ababcc"],
        &["ab", "abb"],
    );
    check_lang("root ::= \"ab\"+*", &["", "ab", "abab"], &["a"]);
    check_lang(
        "root ::= (\"a\" | \"b\"){2,3}",
        &["ab", "bba", "aaa"],
        &["a", "abab"],
    );
    check_lang("root ::= \"a\"{0} \"b\"", &["b"], &["ab"]);
    check_lang("root ::= \"a\"{ 2 , }", &["aa", "aaaaa"], &["a"]);
    // A maximum over 2000 means unbounded (llama.cpp).
    let big = g("root ::= \"a\"{1,2001}");
    assert!(big.accepts_str(&"a".repeat(2500)));
    // Recursion.
    check_lang(
        "root ::= \"(\" root \")\" root | ",
        &["", "()", "(())()", "((()))"],
        &["(", ")(", "(()"],
    );
    // Token elements never match text.
    check_lang("root ::= \"a\" <[3]> | \"b\"", &["b"], &["a"]);
}

#[test]
fn repetition_bounds() {
    let mut rng = Rng::new(seed("repetition_bounds", 11));
    for _ in 0..200 {
        let m = rng.below(6);
        let form = rng.below(4);
        let (src, lo, hi) = match form {
            0 => (format!("root ::= \"x\"{{{m}}}"), m, m),
            1 => (format!("root ::= \"x\"{{{m},}}"), m, usize::MAX),
            2 => {
                let n = m + rng.below(5);
                (format!("root ::= \"x\"{{{m},{n}}}"), m, n)
            }
            _ => {
                // grouped, with an inner literal of two chars
                let n = m + rng.below(3);
                (format!("root ::= (\"y\" \"z\"){{{m},{n}}}"), m, n)
            }
        };
        let gr = g(&src);
        let unit = if form == 3 { "yz" } else { "x" };
        for k in 0..12 {
            let s = unit.repeat(k);
            assert_eq!(
                gr.accepts_str(&s),
                k >= lo && k <= hi,
                "{src} on {k} repeats"
            );
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Random grammars against the regex crate

#[derive(Clone)]
enum Re {
    Lit(String),
    Class(bool, Vec<(char, char)>),
    Any,
    Seq(Vec<Re>),
    Alt(Vec<Re>),
    Rep(Box<Re>, usize, Option<usize>),
    Rule(usize),
}

const ALPHABET: &[char] = &['a', 'b', 'c', 'é', '日', '\n', '"'];

fn gen_re(rng: &mut Rng, depth: usize, rules: &mut Vec<Re>) -> Re {
    let leaf = depth == 0 || rng.chance(0.3);
    if leaf {
        return match rng.below(6) {
            0 | 1 => {
                let n = 1 + rng.below(3);
                Re::Lit((0..n).map(|_| *rng.pick(ALPHABET)).collect())
            }
            2 | 3 => {
                let n = 1 + rng.below(3);
                let ranges = (0..n)
                    .map(|_| {
                        let a = *rng.pick(ALPHABET);
                        let b = if rng.chance(0.3) {
                            *rng.pick(ALPHABET)
                        } else {
                            a
                        };
                        (a.min(b), a.max(b))
                    })
                    .collect();
                Re::Class(rng.chance(0.3), ranges)
            }
            4 => Re::Any,
            _ => {
                if rules.len() < 4 {
                    let body = gen_re(rng, depth.saturating_sub(1), rules);
                    rules.push(body);
                    Re::Rule(rules.len() - 1)
                } else {
                    Re::Rule(rng.below(rules.len()))
                }
            }
        };
    }
    match rng.below(3) {
        0 => Re::Seq(
            (0..1 + rng.below(3))
                .map(|_| gen_re(rng, depth - 1, rules))
                .collect(),
        ),
        1 => Re::Alt(
            (0..2 + rng.below(2))
                .map(|_| gen_re(rng, depth - 1, rules))
                .collect(),
        ),
        _ => {
            let inner = gen_re(rng, depth - 1, rules);
            let (lo, hi) = match rng.below(6) {
                0 => (0, None),
                1 => (1, None),
                2 => (0, Some(1)),
                3 => {
                    let m = rng.below(3);
                    (m, Some(m))
                }
                4 => (rng.below(3), None),
                _ => {
                    let m = rng.below(3);
                    (m, Some(m + rng.below(3)))
                }
            };
            Re::Rep(Box::new(inner), lo, hi)
        }
    }
}

fn gbnf_char(c: char) -> String {
    match c {
        '\n' => "\\n".into(),
        '"' => "\\\"".into(),
        '\\' => "\\\\".into(),
        '[' => "\\[".into(),
        ']' => "\\]".into(),
        '-' => "\\-".into(),
        'é' => "\\u00e9".into(),
        c => c.to_string(),
    }
}

fn to_gbnf(re: &Re) -> String {
    match re {
        Re::Lit(s) => format!("\"{}\"", s.chars().map(gbnf_char).collect::<String>()),
        Re::Class(neg, rs) => {
            let body: String = rs
                .iter()
                .map(|&(a, b)| {
                    if a == b {
                        gbnf_char(a)
                    } else {
                        format!("{}-{}", gbnf_char(a), gbnf_char(b))
                    }
                })
                .collect();
            format!("[{}{}]", if *neg { "^" } else { "" }, body)
        }
        Re::Any => ".".into(),
        Re::Seq(xs) => format!("({})", xs.iter().map(to_gbnf).collect::<Vec<_>>().join(" ")),
        Re::Alt(xs) => format!(
            "({})",
            xs.iter().map(to_gbnf).collect::<Vec<_>>().join(" | ")
        ),
        Re::Rep(x, lo, hi) => {
            let op = match (lo, hi) {
                (0, None) => "*".to_string(),
                (1, None) => "+".to_string(),
                (0, Some(1)) => "?".to_string(),
                (m, None) => format!("{{{m},}}"),
                (m, Some(n)) if m == n => format!("{{{m}}}"),
                (m, Some(n)) => format!("{{{m},{n}}}"),
            };
            format!("({}){op}", to_gbnf(x))
        }
        Re::Rule(i) => format!("r{i}"),
    }
}

fn to_regex(re: &Re, rules: &[Re]) -> String {
    match re {
        Re::Lit(s) => regex::escape(s),
        Re::Class(neg, rs) => {
            let body: String = rs
                .iter()
                .map(|&(a, b)| {
                    let e = |c: char| format!("\\x{{{:x}}}", c as u32);
                    if a == b {
                        e(a)
                    } else {
                        format!("{}-{}", e(a), e(b))
                    }
                })
                .collect();
            format!("[{}{}]", if *neg { "^" } else { "" }, body)
        }
        Re::Any => "(?s:.)".into(),
        Re::Seq(xs) => format!(
            "(?:{})",
            xs.iter().map(|x| to_regex(x, rules)).collect::<String>()
        ),
        Re::Alt(xs) => format!(
            "(?:{})",
            xs.iter()
                .map(|x| to_regex(x, rules))
                .collect::<Vec<_>>()
                .join("|")
        ),
        Re::Rep(x, lo, hi) => {
            let op = match hi {
                None => format!("{{{lo},}}"),
                Some(n) => format!("{{{lo},{n}}}"),
            };
            format!("(?:{}){op}", to_regex(x, rules))
        }
        Re::Rule(i) => to_regex(&rules[*i], rules),
    }
}

fn random_string(rng: &mut Rng, max: usize) -> String {
    (0..rng.below(max + 1))
        .map(|_| *rng.pick(ALPHABET))
        .collect()
}

/// Strings the grammar should accept: generated from the expression itself.
fn sample(rng: &mut Rng, re: &Re, rules: &[Re], out: &mut String) {
    match re {
        Re::Lit(s) => out.push_str(s),
        Re::Class(neg, rs) => {
            let inside = |c: char| rs.iter().any(|&(a, b)| a <= c && c <= b);
            let choices: Vec<char> = ALPHABET
                .iter()
                .copied()
                .filter(|&c| inside(c) != *neg)
                .collect();
            out.push(if choices.is_empty() {
                'z'
            } else {
                *rng.pick(&choices)
            });
        }
        Re::Any => out.push(*rng.pick(ALPHABET)),
        Re::Seq(xs) => xs.iter().for_each(|x| sample(rng, x, rules, out)),
        Re::Alt(xs) => {
            let x = rng_pick_re(rng, xs);
            sample(rng, x, rules, out)
        }
        Re::Rep(x, lo, hi) => {
            let n = lo + rng.below(hi.map_or(3, |h| h - lo) + 1);
            (0..n).for_each(|_| sample(rng, x, rules, out));
        }
        Re::Rule(i) => sample(rng, &rules[*i], rules, out),
    }
}

fn rng_pick_re<'a>(rng: &mut Rng, xs: &'a [Re]) -> &'a Re {
    &xs[rng.below(xs.len())]
}

#[test]
fn random_grammars_match_regex() {
    let mut rng = Rng::new(seed("random_grammars_match_regex", 2024));
    let mut checked = 0;
    let mut accepted = 0;
    let mut refused = 0;
    for case in 0..400 {
        let mut rules = Vec::new();
        let re = gen_re(&mut rng, 4, &mut rules);
        let mut src = format!("root ::= {}\n", to_gbnf(&re));
        for (i, r) in rules.iter().enumerate() {
            src += &format!("r{i} ::= {}\n", to_gbnf(r));
        }
        // A group that can only be empty, repeated ((x{0})*), is left recursion to llama.cpp.
        let gr = match Grammar::parse(&src) {
            Ok(gr) => gr,
            Err(GrammarError::LeftRecursion(_)) => {
                refused += 1;
                continue;
            }
            Err(e) => panic!("case {case}: {src}\n{e}"),
        };
        let rx = regex::Regex::new(&format!("^(?:{})$", to_regex(&re, &rules))).unwrap();
        let mut strings: Vec<String> = (0..30).map(|_| random_string(&mut rng, 6)).collect();
        for _ in 0..30 {
            let mut s = String::new();
            sample(&mut rng, &re, &rules, &mut s);
            strings.push(s);
        }
        for s in strings {
            let want = rx.is_match(&s);
            assert_eq!(
                gr.accepts_str(&s),
                want,
                "case {case}: {s:?}\n{src}\nregex {rx}"
            );
            // The state machine agrees char by char.
            let mut st = GrammarState::new(Arc::new(Grammar::parse(&src).unwrap()));
            let ok = st.accept_str(&s).is_ok() && st.can_end();
            assert_eq!(ok, want, "case {case}: state on {s:?}\n{src}");
            checked += 1;
            accepted += want as usize;
        }
    }
    // Both outcomes are well represented.
    assert!(
        accepted > checked / 10 && accepted < checked * 9 / 10,
        "{accepted} of {checked}"
    );
    assert!(refused < 20, "{refused} grammars refused");
}

// ---------------------------------------------------------------------------------------------
// Tokens, UTF-8 across tokens, EOG

fn vocab(pieces: &[&[u8]], eog: &[usize]) -> Vocab {
    let p: Vec<Vec<u8>> = pieces.iter().map(|p| p.to_vec()).collect();
    let e = (0..p.len()).map(|i| eog.contains(&i)).collect();
    Vocab::new(p, e)
}

fn allowed(st: &GrammarState, v: &Vocab) -> Vec<u32> {
    let set = st.allowed_tokens(v);
    let one_by_one: Vec<u32> = (0..v.len() as u32).filter(|&t| st.allows(v, t)).collect();
    assert_eq!(set, one_by_one, "mask_logits and allows disagree");
    set
}

#[test]
fn utf8_split_across_tokens() {
    // é = C3 A9, 日 = E6 97 A5
    let v = vocab(
        &[
            b"\xc3",
            b"\xa9",
            b"\xe6",
            b"\x97",
            b"\xa5",
            b"\xe6\x97",
            b"x",
            b"\xc3\xa9x",
            b"\xa9x",
            b"",
            b"\x00a",
            b"</s>",
            b"\x97\xa5",
        ],
        &[11],
    );
    let gr = Arc::new(g("root ::= \"é\" \"日\" \"x\""));
    let mut st = GrammarState::new(gr.clone());
    // Lone lead byte of é, or é with x after (rejected: x does not follow é here).
    assert_eq!(allowed(&st, &v), vec![0]);
    st.accept(&v, 0).unwrap();
    // Continuation A9 completes é; A9 followed by x is rejected at x.
    assert_eq!(allowed(&st, &v), vec![1]);
    assert!(matches!(
        st.accept(&v, 8),
        Err(GrammarError::TokenRejected { id: 8, .. })
    ));
    st.accept(&v, 1).unwrap();
    assert_eq!(allowed(&st, &v), vec![2, 5]);
    st.accept(&v, 5).unwrap();
    assert_eq!(allowed(&st, &v), vec![4]);
    assert!(!st.can_end());
    assert!(matches!(
        st.accept(&v, 11),
        Err(GrammarError::EndNotAllowed { id: 11 })
    ));
    st.accept(&v, 4).unwrap();
    assert_eq!(allowed(&st, &v), vec![6]);
    st.accept(&v, 6).unwrap();
    assert!(st.can_end() && st.must_end());
    assert_eq!(allowed(&st, &v), vec![11]);
    st.accept(&v, 11).unwrap();

    // A lead byte the class cannot complete is rejected; [^é] refuses C3 (any completion meeting
    // an excluded range refuses, as llama.cpp), while [^日] takes it.
    let st = GrammarState::new(Arc::new(g("root ::= [^é]")));
    assert!(!st.allows(&v, 0));
    assert!(st.allows(&v, 2));
    let st = GrammarState::new(Arc::new(g("root ::= [a-z]")));
    assert_eq!(allowed(&st, &v), vec![6]);
    // A continuation byte at the start is invalid; an empty piece and a NUL-first piece never.
    let st = GrammarState::new(Arc::new(g("root ::= .*")));
    let a = allowed(&st, &v);
    assert!(
        !a.contains(&1) && !a.contains(&9) && !a.contains(&10) && a.contains(&11),
        "{a:?}"
    );
    // After a lead byte only continuation bytes are candidates.
    let mut st = GrammarState::new(Arc::new(g("root ::= .*")));
    st.accept(&v, 2).unwrap();
    // E6 then A9 is still a valid start (U+6A4x): every continuation byte may come.
    assert_eq!(allowed(&st, &v), vec![1, 3, 4, 12]);
    st.accept(&v, 12).unwrap();
    assert!(st.can_end());
}

#[test]
fn accept_piece_reads_the_bytes_given_and_matches_token_elements_by_id() {
    // é = C3 A9. Token 0 is "xy": fed as "y\xc3" (what a lazy grammar's trigger leaves of a
    // token, here ending inside é) it advances by those bytes, not by its own.
    let v = vocab(&[b"xy", b"\xc3", b"\xa9", b"z", b"</s>"], &[4]);
    let gr = Arc::new(g(r#"root ::= "y" "\u00e9" "z""#));
    let mut st = GrammarState::new(gr);
    assert!(matches!(
        st.accept_piece(0, b"x"),
        Err(GrammarError::TokenRejected { id: 0, .. })
    ));
    st.accept_piece(0, b"y\xc3").unwrap();
    assert_eq!(allowed(&st, &v), vec![2]);
    st.accept(&v, 2).unwrap();
    // An empty piece leaves the character stacks as they are (llama.cpp's accept_token).
    st.accept_piece(0, b"").unwrap();
    assert_eq!(allowed(&st, &v), vec![3]);
    st.accept_piece(0, b"z").unwrap();
    assert!(st.must_end());

    // A token element on top matches the id, whatever the piece.
    let gr = Arc::new(g(r#"root ::= <[3]> "y""#));
    let mut st = GrammarState::new(gr);
    assert!(st.accept_piece(2, b"").is_err());
    st.accept_piece(3, b"").unwrap();
    st.accept_piece(1, b"y").unwrap();
    assert!(st.must_end());
}

#[test]
fn decoding_follows_llama_cpp() {
    let mut out = Vec::new();
    assert_eq!(
        decode("aé日😀".as_bytes(), Partial::NONE, &mut out),
        Partial::NONE
    );
    assert_eq!(out, vec!['a' as u32, 0xe9, 0x65e5, 0x1f600]);
    // Lead byte then an ASCII byte in one token: taken as a continuation, unchecked.
    assert_eq!(decode(b"\xc3A", Partial::NONE, &mut out), Partial::NONE);
    assert_eq!(out, vec![0xc1]);
    // A continuation byte first: invalid.
    assert_eq!(decode(b"a\x80", Partial::NONE, &mut out).remain, -1);
    assert!(out.is_empty());
    // Pending: the next token must continue it with continuation bytes.
    let p = decode(b"\xe6", Partial::NONE, &mut out);
    assert_eq!((p.remain, out.len()), (2, 0));
    let p2 = decode(b"\x97", p, &mut out);
    assert_eq!((p2.remain, out.len()), (1, 0));
    assert_eq!(decode(b"\xa5z", p2, &mut out), Partial::NONE);
    assert_eq!(out, vec![0x65e5, 'z' as u32]);
    assert_eq!(decode(b"z", p2, &mut out).remain, -1);
    assert_eq!(cut_at_nul(b"ab\0c"), b"ab");
}

#[test]
fn eog_rules() {
    let v = vocab(&[b"a", b"b", b"<eos>", b"<eot>"], &[2, 3]);
    let gr = Arc::new(g("root ::= \"a\" \"b\"?"));
    let mut st = GrammarState::new(gr);
    assert!(!st.can_end() && !st.must_end());
    assert_eq!(allowed(&st, &v), vec![0]);
    st.accept(&v, 0).unwrap();
    assert!(st.can_end() && !st.must_end());
    assert_eq!(allowed(&st, &v), vec![1, 2, 3]);
    st.accept(&v, 1).unwrap();
    assert!(st.must_end());
    assert_eq!(allowed(&st, &v), vec![2, 3]);
    assert!(
        matches!(st.accept(&v, 0), Err(GrammarError::TokenRejected { id: 0, ref text }) if text == "a")
    );
    assert!(matches!(
        st.accept(&v, 9),
        Err(GrammarError::UnknownToken { id: 9, len: 4 })
    ));
    st.accept(&v, 3).unwrap();
    // Logits past the vocabulary are banned, shorter logits are fine.
    let mut logits = vec![1.0f32; 6];
    st.mask_logits(&v, &mut logits);
    assert_eq!(
        logits[..4],
        [f32::NEG_INFINITY, f32::NEG_INFINITY, 1.0, 1.0]
    );
    assert!(logits[4..].iter().all(|l| *l == f32::NEG_INFINITY));
    let mut short = vec![0.5f32; 3];
    st.mask_logits(&v, &mut short);
    assert_eq!(short, [f32::NEG_INFINITY, f32::NEG_INFINITY, 0.5]);
}

#[test]
fn token_refs_match_by_id() {
    // 0 "<think>" 1 "</think>" 2 "a" 3 "b" 4 "ab" 5 "</s>"(eog)
    let v = vocab(&[b"<think>", b"</think>", b"a", b"b", b"ab", b"</s>"], &[5]);
    let gr = Arc::new(g("root ::= <[0]> !<[1]>* <[1]> \"a\""));
    let mut st = GrammarState::new(gr);
    assert_eq!(allowed(&st, &v), vec![0]);
    st.accept(&v, 0).unwrap();
    // Any token but 1 (by id, whatever its text), or 1 itself.
    assert_eq!(allowed(&st, &v), vec![0, 1, 2, 3, 4]);
    st.accept(&v, 4).unwrap();
    st.accept(&v, 2).unwrap();
    st.accept(&v, 1).unwrap();
    // "ab" is rejected at 'b': nothing follows "a".
    assert_eq!(allowed(&st, &v), vec![2]);
    let mut st2 = st.clone();
    st2.accept(&v, 2).unwrap();
    assert!(st2.must_end());
    assert!(st.accept(&v, 4).is_err());

    // llama.cpp's quirk: a token element reached inside a token decides by id alone; accepting
    // such a token then fails, as it does in llama.cpp.
    let gr = Arc::new(g("root ::= \"a\" !<[9]> \"z\""));
    let mut st = GrammarState::new(gr);
    assert_eq!(allowed(&st, &v), vec![2, 4]);
    let e = st.accept(&v, 4).unwrap_err();
    assert!(
        matches!(e, GrammarError::TokenRejected { id: 4, ref text } if text == "ab"),
        "{e}"
    );
    st.accept(&v, 2).unwrap();
    assert_eq!(allowed(&st, &v), vec![0, 1, 2, 3, 4]);
}

// ---------------------------------------------------------------------------------------------
// The trie-based mask against a direct per-token, per-stack reference

/// llama.cpp's rule, done the plain way: each stack on its own, each token on its own.
fn reference_allowed(
    gr: &Grammar,
    stacks: &[Vec<u32>],
    partial: Partial,
    v: &Vocab,
    t: u32,
) -> bool {
    fn closure(
        gr: &Grammar,
        stack: Vec<u32>,
        out: &mut Vec<Vec<u32>>,
        seen: &mut HashSet<Vec<u32>>,
    ) {
        if !seen.insert(stack.clone()) {
            return;
        }
        let Some(&top) = stack.last() else {
            out.push(stack);
            return;
        };
        match gr.elems[top as usize] {
            Elem::Ref(r) => {
                let mut base = stack[..stack.len() - 1].to_vec();
                if gr.elems[top as usize + 1] != Elem::End {
                    base.push(top + 1);
                }
                for &a in &gr.rule_alts[r as usize] {
                    let mut s = base.clone();
                    if gr.elems[a as usize] != Elem::End {
                        s.push(a);
                    }
                    closure(gr, s, out, seen);
                }
            }
            _ => out.push(stack),
        }
    }
    fn ok(gr: &Grammar, stack: &[u32], cps: &[u32], end: Partial, t: u32) -> bool {
        let Some(&top) = stack.last() else {
            return cps.is_empty() && end.remain == 0;
        };
        match gr.elems[top as usize] {
            Elem::Token(x) | Elem::TokenNot(x) if !cps.is_empty() => {
                (x == t) == matches!(gr.elems[top as usize], Elem::Token(_))
            }
            Elem::Token(_) | Elem::TokenNot(_) => end.remain == 0,
            Elem::Class(c) => {
                let class = &gr.classes[c as usize];
                let Some((&c0, rest)) = cps.split_first() else {
                    return end.remain == 0 || class.matches_partial(end);
                };
                if !class.matches(c0) {
                    return false;
                }
                let mut next = stack[..stack.len() - 1].to_vec();
                if gr.elems[top as usize + 1] != Elem::End {
                    next.push(top + 1);
                }
                let mut out = Vec::new();
                closure(gr, next, &mut out, &mut HashSet::new());
                out.iter().any(|s| ok(gr, s, rest, end, t))
            }
            _ => unreachable!(),
        }
    }
    if v.is_eog(t) {
        return stacks.iter().any(|s| s.is_empty());
    }
    let piece = v.piece(t);
    if piece.is_empty() || piece[0] == 0 {
        return false;
    }
    let mut cps = Vec::new();
    let end = decode(cut_at_nul(piece), partial, &mut cps);
    if end.remain < 0 {
        return false;
    }
    stacks.iter().any(|s| ok(gr, s, &cps, end, t))
}

fn random_vocab(rng: &mut Rng, n: usize) -> Vocab {
    let atoms: &[&[u8]] = &[
        b"a",
        b"b",
        b"c",
        b"{",
        b"}",
        b"\"",
        b":",
        b",",
        b" ",
        b"\n",
        b"1",
        b"2",
        b"-",
        b".",
        b"[",
        b"]",
        "é".as_bytes(),
        "日".as_bytes(),
        b"\xc3",
        b"\xa9",
        b"\xe6",
        b"\x97",
        b"\xa5",
        b"\xe6\x97",
        b"\\",
        b"\x00",
    ];
    let mut pieces = Vec::new();
    let mut eog = Vec::new();
    for i in 0..n {
        let mut p = Vec::new();
        if i >= 3 {
            for _ in 0..1 + rng.below(4) {
                let a: &[u8] = atoms[rng.below(atoms.len())];
                p.extend_from_slice(a);
            }
        }
        eog.push(i == 1);
        pieces.push(if i == 2 { Vec::new() } else { p });
    }
    pieces[0] = b"<x>".to_vec();
    Vocab::new(pieces, eog)
}

const SMALL_GRAMMARS: &[&str] = &[
    "root ::= \"{\" ws (str \":\" ws val (\",\" ws str \":\" ws val)*)? \"}\"\nval ::= str | [0-9]+ | \"[\" ws (val (\",\" ws val)*)? \"]\" | root\nstr ::= \"\\\"\" ([^\"\\\\] | \"\\\\\" [\"\\\\n])* \"\\\"\"\nws ::= [ \\n]*",
    "root ::= ([a-c] | \"é\" | [日-日])+ \"\\n\"?",
    "root ::= (<[0]> | !<[5]>)* \"a\" [^é]",
    "root ::= \"a\"* \"é\"{1,3} | \"ab\" <[7]> \"c\"",
    "root ::= [^a]+ | .{2} \"日\"",
    "root ::= \"a\" !<[4]> \"b\" | \"ab\"+",
];

#[test]
fn mask_matches_reference_on_random_walks() {
    let mut rng = Rng::new(seed("mask_matches_reference_on_random_walks", 77));
    let mut picks = 0;
    for round in 0..30 {
        // Mostly small vocabularies (many steps), some larger ones (deeper tries).
        let v = random_vocab(&mut rng, if round % 5 == 4 { 3000 } else { 300 });
        let src = SMALL_GRAMMARS[round % SMALL_GRAMMARS.len()];
        let gr = Arc::new(g(src));
        let mut st = GrammarState::new(gr.clone());
        for step in 0..40 {
            let got = allowed(&st, &v);
            let want: Vec<u32> = (0..v.len() as u32)
                .filter(|&t| reference_allowed(&gr, &st.stacks, st.partial, &v, t))
                .collect();
            assert_eq!(got, want, "round {round} step {step}: grammar {src:?}");
            if got.is_empty() {
                break;
            }
            let t = *rng.pick(&got);
            if v.is_eog(t) {
                break;
            }
            // Allowed tokens are accepted, except where llama.cpp's quirk (a token element met
            // inside a token) allows a token that then leaves no stack.
            if st.accept(&v, t).is_err() {
                break;
            }
            picks += 1;
        }
    }
    assert!(picks > 200, "{picks}");
}

// ---------------------------------------------------------------------------------------------
// Robustness

#[test]
fn garbage_grammars_never_panic() {
    let mut rng = Rng::new(seed("garbage_grammars_never_panic", 5));
    let pieces: &[&str] = &[
        "root",
        " ::= ",
        "::=",
        "a",
        "b-1",
        "\"",
        "\"x\"",
        "[",
        "]",
        "^",
        "-",
        "(",
        ")",
        "|",
        "*",
        "+",
        "?",
        "{",
        "}",
        ",",
        "2",
        "0",
        "3000",
        "\\",
        "\\x4",
        "\\u00e9",
        "é",
        "<",
        ">",
        "<[",
        "!",
        ".",
        "#",
        "\n",
        "\r",
        " ",
        "\t",
        "\0",
        "日",
        "<[1]>",
        "root ::= ",
        "x ::= ",
        "x",
        "{1,2}",
    ];
    let v = random_vocab(&mut rng, 200);
    let mut parsed = 0;
    for _ in 0..4000 {
        // A valid grammar, mutated a few times, or pure noise.
        let mut src = if rng.chance(0.8) {
            let mut rules = Vec::new();
            let re = gen_re(&mut rng, 3, &mut rules);
            let mut src = format!("root ::= {}\n", to_gbnf(&re));
            for (i, r) in rules.iter().enumerate() {
                src += &format!("r{i} ::= {}\n", to_gbnf(r));
            }
            src
        } else {
            (0..rng.below(25)).map(|_| *rng.pick(pieces)).collect()
        };
        for _ in 0..rng.below(4) {
            let cuts: Vec<usize> = (0..=src.len())
                .filter(|&i| src.is_char_boundary(i))
                .collect();
            let a = *rng.pick(&cuts);
            if rng.chance(0.5) {
                let piece: &str = pieces[rng.below(pieces.len())];
                src.insert_str(a, piece);
            } else {
                let b = *rng.pick(&cuts);
                src.replace_range(a.min(b)..a.max(b), "");
            }
        }
        let lookup = |t: &str| {
            if t.len() < 4 {
                Some(t.len() as u32)
            } else {
                None
            }
        };
        let Ok(gr) = Grammar::parse_with_tokens(&src, &lookup) else {
            continue;
        };
        parsed += 1;
        let mut st = GrammarState::new(Arc::new(gr));
        for _ in 0..5 {
            let a = st.allowed_tokens(&v);
            if a.is_empty() {
                break;
            }
            let _ = st.accept(&v, *rng.pick(&a));
        }
        let _ = st.accept_str("ab");
    }
    assert!(parsed > 600, "only {parsed} parsed");
}

#[test]
fn pathological_grammars_are_bounded() {
    let t = std::time::Instant::now();
    // A long chain of rules: no recursion in the checks.
    let mut src = String::from("root ::= r0\n");
    for i in 0..50_000 {
        src += &format!("r{i} ::= r{}\n", i + 1);
    }
    src += "r50000 ::= \"z\"\n";
    assert!(g(&src).accepts_str("z"));
    // A long cycle of left references.
    let mut src = String::from("root ::= r0\n");
    for i in 0..50_000 {
        src += &format!("r{i} ::= r{} | \"x\"\n", (i + 1) % 50_000);
    }
    assert!(matches!(err(&src), GrammarError::LeftRecursion(_)));
    // Repetitions multiplying past the limit, and a big literal repeated many times.
    assert!(parse_err("root ::= ((\"a\"{0,50}){0,50})")
        .2
        .contains("more than 2000"));
    let lit = "x".repeat(5000);
    let src: String = (0..300)
        .map(|i| format!("r{i} ::= \"{lit}\"{{2000}}\n"))
        .collect();
    assert!(matches!(
        err(&format!("root ::= r0\n{src}")),
        GrammarError::TooComplex(_)
    ));
    // Exponential ambiguity stays within the stack limit (or is refused, never hangs).
    let src = format!("root ::= {}", "(\"a\" | \"a\" \"a\" | [a-b])* ".repeat(8));
    let gr = Arc::new(g(&src));
    let mut st = GrammarState::new(gr);
    let _ = st.accept_str(&"a".repeat(40));
    assert!(t.elapsed().as_secs() < 20, "took {:?}", t.elapsed());
}

#[test]
fn ambiguous_grammars_stay_bounded() {
    // x? repeated: many stacks, but bounded and correct.
    let src = format!("root ::= {} \"!\"", "\"a\"? ".repeat(60));
    let gr = Arc::new(g(&src));
    let v = vocab(&[b"a", b"!", b"aa", b"</s>"], &[3]);
    let mut st = GrammarState::new(gr);
    for _ in 0..30 {
        st.accept(&v, 2).unwrap();
    }
    assert!(!st.allows(&v, 0) || st.allows(&v, 1));
    st.accept(&v, 1).unwrap();
    assert!(st.must_end());
}

// ---------------------------------------------------------------------------------------------
// llama.cpp's own grammar files (skipped when the source tree is absent)

fn llama_grammars_dir() -> Option<std::path::PathBuf> {
    let src = std::env::var("MUSER_GGML_SRC")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|_| {
            std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("../../target/llamacpp/llama_cpp_python-0.3.36/vendor/llama.cpp")
        });
    let dir = src.join("grammars");
    dir.is_dir().then_some(dir)
}

#[test]
fn llama_cpp_grammar_files() {
    let Some(dir) = llama_grammars_dir() else {
        eprintln!("llama.cpp grammars not found: skipped");
        return;
    };
    let cases: &[(&str, &[&str], &[&str])] = &[
        (
            "json.gbnf",
            &[
                "{}",
                "{\"a\": [1, 2.5, \"x\\n\"], \"b\": {\"c\": null}}",
                "{\"k\":true}",
            ],
            &["[]", "{", "{\"a\" 1}", "{a: 1}"],
        ),
        (
            "json_arr.gbnf",
            &["[\n]", "[\n1,\n{\"a\": \"b\"}]"],
            &["[]", "{}", "[\n1,]"],
        ),
        (
            "arithmetic.gbnf",
            &["1+2*3=x\n", "(a-2)/3 = y\n2=2\n"],
            &["1+2\n", "1=\n"],
        ),
        ("list.gbnf", &["- a\n- b\n"], &["a\n"]),
        ("chess.gbnf", &["1. e4 e5\n2. Nf3 Nc6\n"], &["1. e4\n"]),
    ];
    for &(file, yes, no) in cases {
        let text = std::fs::read_to_string(dir.join(file)).unwrap();
        let gr = Grammar::parse(&text).unwrap_or_else(|e| panic!("{file}: {e}"));
        for s in yes {
            assert!(gr.accepts_str(s), "{file} should accept {s:?}");
        }
        for s in no {
            assert!(!gr.accepts_str(s), "{file} should reject {s:?}");
        }
    }
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "gbnf") {
            let text = std::fs::read_to_string(&path).unwrap();
            Grammar::parse(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Work limits: every call is bounded, and a state past a limit fails cleanly and stays failed

/// Lowercase words of 1 to 12 letters (and their capitalized forms), ".", an EOG token.
fn word_vocab(n: usize) -> Vocab {
    let mut rng = Rng::new(5);
    let mut pieces: Vec<Vec<u8>> = vec![b"</s>".to_vec(), b".".to_vec(), b"q".to_vec()];
    for c in b'a'..=b'z' {
        pieces.push(vec![c]);
    }
    while pieces.len() < n {
        let len = 1 + rng.below(12);
        let w: Vec<u8> = (0..len).map(|_| b'a' + rng.below(26) as u8).collect();
        pieces.push(w);
    }
    let eog = (0..pieces.len()).map(|i| i == 0).collect();
    Vocab::new(pieces, eog)
}

/// Checks that `st` failed with TooComplex and stays failed everywhere.
fn assert_failed(st: &mut GrammarState, v: &Vocab, what: &str) {
    let why = match st.failure() {
        Some(GrammarError::TooComplex(why)) => why.clone(),
        other => panic!("{what}: expected a TooComplex failure, got {other:?}"),
    };
    assert!(!why.is_empty());
    for t in 0..v.len().min(64) as u32 {
        assert!(!st.allows(v, t), "{what}: a failed state allows token {t}");
    }
    let mut logits = vec![1.0f32; v.len()];
    st.mask_logits(v, &mut logits);
    assert!(logits.iter().all(|l| *l == f32::NEG_INFINITY), "{what}");
    assert!(!st.can_end() && !st.must_end(), "{what}");
    assert!(
        matches!(st.accept(v, 0), Err(GrammarError::TooComplex(_))),
        "{what}"
    );
    assert!(
        matches!(st.accept(v, 3), Err(GrammarError::TooComplex(_))),
        "{what}"
    );
    assert!(
        matches!(st.accept_str("a"), Err(GrammarError::TooComplex(_))),
        "{what}"
    );
    // Clones made afterwards are failed too.
    let c = st.clone();
    assert!(c.failure().is_some() && !c.allows(v, 3), "{what}");
}

/// `x ::= "a" x "a" | "a" x "A" | ... | "."`: 2^k stacks after k letters.
fn palindromes() -> String {
    let mut alts = Vec::new();
    for c in 'a'..='z' {
        alts.push(format!("\"{c}\" x \"{c}\""));
        alts.push(format!("\"{c}\" x \"{}\"", c.to_ascii_uppercase()));
    }
    alts.push("\".\"".into());
    format!("root ::= x\nx ::= {}\n", alts.join(" | "))
}

#[test]
fn exponential_stacks_fail_cleanly() {
    let v = word_vocab(20_000);
    let gr = Arc::new(g(&palindromes()));
    // Masking a vocabulary of long words.
    let mut st = GrammarState::new(gr.clone());
    let mut logits = vec![0.0f32; v.len()];
    st.mask_logits(&v, &mut logits);
    assert!(logits.iter().all(|l| *l == f32::NEG_INFINITY));
    assert_failed(&mut st, &v, "palindromes, mask");
    // Accepting text, and one token at a time.
    let mut st = GrammarState::new(gr.clone());
    assert!(matches!(
        st.accept_str(&"ab".repeat(20)),
        Err(GrammarError::TooComplex(_))
    ));
    assert_failed(&mut st, &v, "palindromes, accept_str");
    let mut st = GrammarState::new(gr.clone());
    let a = 3; // "a"
    let mut res = Ok(());
    for _ in 0..20 {
        res = st.accept(&v, a);
        if res.is_err() {
            break;
        }
    }
    assert!(matches!(res, Err(GrammarError::TooComplex(_))), "{res:?}");
    assert_failed(&mut st, &v, "palindromes, accept");
    // Short of the limit, the same grammar works (and matches the language).
    assert!(gr.accepts_str("ab.Ba"));
    assert!(!gr.accepts_str("ab.BA."));
    let mut st = GrammarState::new(gr);
    st.accept_str("abc.").unwrap();
    assert!(st.allows(&v, 5) && st.failure().is_none()); // "c"
}

#[test]
fn exponential_closure_fails_cleanly() {
    // Expanding a0 makes 2^16 stacks at once.
    let mut src = String::from("root ::= \"q\" s\ns ::= a0 s | \"\"\n");
    for i in 0..16 {
        src += &format!("a{i} ::= a{} b | a{} c\n", i + 1, i + 1);
    }
    src += "a16 ::= \"z\"\nb ::= \"x\"?\nc ::= \"y\"?\n";
    let gr = Arc::new(g(&src));
    let v = word_vocab(2000);
    let q = 2;
    let mut st = GrammarState::new(gr.clone());
    assert!(!st.allows(&v, q));
    assert_failed(&mut st, &v, "closure, allows");
    let mut st = GrammarState::new(gr.clone());
    assert!(matches!(st.accept(&v, q), Err(GrammarError::TooComplex(_))));
    assert_failed(&mut st, &v, "closure, accept");
    // Fewer levels: within the stack limit, but far past the work budget.
    let mut src = String::from("root ::= \"q\" s\ns ::= a0 s | \"\"\n");
    for i in 0..10 {
        src += &format!("a{i} ::= a{} b | a{} c\n", i + 1, i + 1);
    }
    src += "a10 ::= \"z\"\nb ::= \"x\"?\nc ::= \"y\"?\n";
    let mut st = GrammarState::new(Arc::new(g(&src)));
    st.accept_str("q").unwrap();
    let v = word_vocab(20_000);
    let _ = st.allowed_tokens(&v);
    match st.failure() {
        Some(GrammarError::TooComplex(why)) => assert!(why.contains("units of work"), "{why}"),
        other => panic!("{other:?}"),
    }
    assert_failed(&mut st, &v, "closure, budget");
}

/// `x_i ::= "a" x_{i+1} "a" | ... | "z" x_{i+1} "z" | [a-z] x_{i+1} "!"`, `levels` deep, then
/// ".": every letter read keeps two ways open.
fn mirrors(levels: usize) -> String {
    let mut src = String::from("root ::= x0\n");
    for i in 0..levels {
        let mut alts: Vec<String> = ('a'..='z')
            .map(|c| format!("\"{c}\" x{} \"{c}\"", i + 1))
            .collect();
        alts.push(format!("[a-z] x{} \"!\"", i + 1));
        src += &format!("x{i} ::= {}\n", alts.join(" | "));
    }
    src + &format!("x{levels} ::= \".\"\n")
}

#[test]
fn work_budget_fails_cleanly_in_mask() {
    // At most 27 * 2^7 stacks (within the limit), but a new big set at nearly every node of
    // the vocabulary's trie.
    let v = word_vocab(60_000);
    let mut st = GrammarState::new(Arc::new(g(&mirrors(7))));
    let mut logits = vec![0.0f32; v.len()];
    st.mask_logits(&v, &mut logits);
    match st.failure() {
        Some(GrammarError::TooComplex(why)) => assert!(why.contains("units of work"), "{why}"),
        other => panic!("{other:?}"),
    }
    assert_failed(&mut st, &v, "budget, mask");
}

#[test]
fn limits_lifted_compute_what_the_default_ones_refuse() {
    // The grammar of work_budget_fails_cleanly_in_mask, 4 levels deep over a smaller
    // vocabulary: past the default budget (a few times over), computed in full without limits,
    // refused by a tight stack limit.
    let gr = Arc::new(g(&mirrors(4)));
    let v = word_vocab(12_000);
    let st = GrammarState::new(gr.clone());
    let _ = allowed(&st, &v);
    assert!(
        st.failure().is_some(),
        "the default budget should refuse this mask"
    );
    let mut rng = Rng::new(seed("limits_lifted", 11));
    let mut st = GrammarState::new(gr.clone()).with_limits(Limits::UNLIMITED);
    for step in 0..2 {
        let got = allowed(&st, &v);
        assert!(st.failure().is_none(), "step {step}: {:?}", st.failure());
        // The reference is slow: every 8th token, from a random offset.
        let off = rng.below(8) as u32;
        let sample = |t: &u32| t % 8 == off;
        let want: Vec<u32> = (0..v.len() as u32)
            .filter(|t| sample(t) && reference_allowed(&gr, &st.stacks, st.partial, &v, *t))
            .collect();
        assert!(!want.is_empty(), "step {step}");
        let got_sampled: Vec<u32> = got.iter().copied().filter(sample).collect();
        assert_eq!(got_sampled, want, "step {step}");
        let t = *rng.pick(&got);
        st.accept(&v, t).unwrap();
    }
    // A stack limit below what the first letter makes (27 alternatives, then 28 after one).
    let tight = Limits {
        stacks: 8,
        ..Limits::default()
    };
    let mut st = GrammarState::new(gr).with_limits(tight);
    let e = st.accept_str("a").unwrap_err();
    assert!(
        matches!(e, GrammarError::TooComplex(ref why) if why.contains("limit of 8")),
        "{e}"
    );
    assert_failed(&mut st, &v, "tight stack limit");
}

#[test]
fn nested_stars_fail_cleanly_or_work() {
    // What a JSON schema pattern `^(?:(?:...(?:ab?)*...)*)*$` becomes: r1 ::= c+,
    // r_k ::= r_{k-1}+, root ::= "\"" r_{d-1}* "\"".
    let v = word_vocab(3000);
    for depth in [6usize, 20, 40] {
        let mut src = format!(
            "root ::= \"\\\"\" r{}* \"\\\"\"\nc ::= \"a\" \"b\"?\nr1 ::= c+\n",
            depth - 1
        );
        for k in 2..depth {
            src += &format!("r{k} ::= r{}+\n", k - 1);
        }
        let gr = Arc::new(g(&src));
        let mut st = GrammarState::new(gr.clone());
        let mut failed = false;
        for (i, text) in ["\"", "a", "a", "b", "a", "a", "b", "a"].iter().enumerate() {
            let _ = st.allowed_tokens(&v);
            match st.accept_str(text) {
                Ok(()) => assert!(st.failure().is_none()),
                Err(GrammarError::TooComplex(_)) => {
                    failed = true;
                    break;
                }
                Err(e) => panic!("depth {depth} step {i}: {e}"),
            }
        }
        if failed {
            assert_failed(&mut st, &v, &format!("nested stars {depth}"));
        } else {
            st.accept_str("\"").unwrap();
            assert!(st.must_end(), "depth {depth}");
        }
        assert_eq!(failed, depth >= 20, "depth {depth}");
    }
}

#[test]
fn failure_is_per_state_and_the_shared_cache_stays_exact() {
    // A clone that fails must not disturb its siblings (they share the memo).
    let mut src = String::from("root ::= \"q\" s | [a-z]+ \".\"\ns ::= a0 s | \"\"\n");
    for i in 0..16 {
        src += &format!("a{i} ::= a{} b | a{} c\n", i + 1, i + 1);
    }
    src += "a16 ::= \"z\"\nb ::= \"x\"?\nc ::= \"y\"?\n";
    let gr = Arc::new(g(&src));
    let v = vocab(&[b"</s>", b"abc", b"ab", b".", b"c.", b"z"], &[0]);
    let mut a = GrammarState::new(gr.clone());
    let mut b = a.clone();
    let before = allowed(&b, &v);
    let r = a.accept_str("q");
    assert!(matches!(r, Err(GrammarError::TooComplex(_))), "{r:?}");
    assert!(a.failure().is_some(), "{a:?}");
    assert!(b.failure().is_none(), "{b:?}");
    assert_eq!(allowed(&b, &v), before);
    b.accept_str("abc").unwrap();
    assert!(!b.can_end());
    b.accept_str(".").unwrap();
    assert!(b.must_end() && b.failure().is_none());
}

#[test]
fn parse_size_is_bounded() {
    // 520 rules each repeating a literal up to 2000 times (4M elements): refused early.
    let mut src = String::from("root ::= r0\n");
    for i in 0..520 {
        src += &format!("r{i} ::= \"x\"{{0,2000}} r{}\n", i + 1);
    }
    src += "r520 ::= \"z\"\n";
    match err(&src) {
        GrammarError::TooComplex(why) => assert!(why.contains("524288 elements"), "{why}"),
        e => panic!("{e}"),
    }
    // Long rule names copied into every generated rule's name.
    let name = "n".repeat(3000);
    let src = format!("root ::= {name}\n{name} ::= \"x\"{{0,2000}}\n");
    assert!(Grammar::parse(&src).is_ok());
    let src =
        format!("root ::= {name}\n{name} ::= \"x\"{{0,2000}} \"y\"{{0,2000}} \"z\"{{0,2000}}\n");
    match err(&src) {
        GrammarError::TooComplex(why) => assert!(why.contains("rule names"), "{why}"),
        e => panic!("{e}"),
    }
    // Big, but within the limits.
    let mut src = String::from("root ::= r0\n");
    for i in 0..50 {
        src += &format!("r{i} ::= \"x\"{{0,2000}} \"y\" r{}\n", i + 1);
    }
    src += "r50 ::= \"z\"\n";
    let gr = g(&src);
    let text = format!("{}y", "x".repeat(1500)).repeat(50) + "z";
    assert!(gr.accepts_str(&text));
}

#[test]
fn llama_cpp_grammar_files_stay_within_the_limits() {
    let Some(dir) = llama_grammars_dir() else {
        eprintln!("llama.cpp grammars not found: skipped");
        return;
    };
    let mut rng = Rng::new(seed("llama_cpp_grammar_files_stay_within_the_limits", 3));
    let v = random_vocab(&mut rng, 3000);
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "gbnf"))
        .collect();
    files.sort();
    let mut steps = 0;
    for path in files {
        let gr = Arc::new(g(&std::fs::read_to_string(&path).unwrap()));
        let mut st = GrammarState::new(gr);
        for _ in 0..40 {
            let ok = st.allowed_tokens(&v);
            assert!(
                st.failure().is_none(),
                "{}: {:?}",
                path.display(),
                st.failure()
            );
            let ok: Vec<u32> = ok.into_iter().filter(|&t| !v.is_eog(t)).collect();
            if ok.is_empty() {
                break;
            }
            if st.accept(&v, *rng.pick(&ok)).is_err() {
                break;
            }
            assert!(st.failure().is_none(), "{}", path.display());
            steps += 1;
        }
    }
    assert!(steps > 50, "{steps}");
}
