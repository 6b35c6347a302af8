"""The grammar engine against llama.cpp's: the same allowed tokens, step after step, over a whole
vocabulary (crates/muser-grammar).

Scenarios: llama.cpp's own grammars (grammars/*.gbnf of its source tree), grammars made of
multibyte characters, and random grammars (literals made of the vocabulary's pieces, character
classes with ranges, negations and multibyte ends, `.`, groups, alternatives, every repetition
form, rules referenced and right-recursive, token references by id and by text, negated ones,
comments and newlines). At each step both sides compute the set of tokens the grammar allows
over the whole vocabulary (end-of-generation tokens included): the sets must be equal. Both then
pick the same token (the k-th allowed, k from a splitmix64 seeded by the scenario) and accept
it, 30 to 60 steps or until an end-of-generation token is picked. Then a few hundred broken
grammars (a list of each error llama.cpp reports, and random grammars mutated by inserting and
deleting pieces): llama.cpp refuses a grammar exactly when Muser does.

llama.cpp's side is tests/python/llamacpp_grammar.cpp, compiled here against libllama (its public
C API: llama_sampler_init_grammar, llama_sampler_apply, llama_sampler_accept); Muser's is the
example crates/muser-grammar/examples/grammar_io.rs. The vocabulary is the shipped model's
(models/muse-default.gguf, a byte-level BPE whose byte tokens split UTF-8 sequences), copied into
a vocabulary-only GGUF that llama.cpp loads; the harness writes each token's text as llama.cpp's
grammar sees it (llama_token_to_piece, special tokens as text) and Muser builds its Vocab from
exactly those bytes.

Kept out by construction, where llama.cpp does not answer: `{m,n}` with n < m (llama.cpp loops
forever on it; Muser refuses it) and left recursion through rules that derive the empty string
without an empty alternative (llama.cpp expands stacks forever; Muser refuses it): random rules
only reference later rules, or themselves after a terminal.

The seed changes every run (MUSER_GRAMMAR_SEED sets it, MUSER_GRAMMAR_SCENARIOS the number of
random grammars); a failure prints a line that replays on its own:
`echo LINE | grammar_io --vocab ... --tokens ...` against `echo LINE | llamacpp_grammar --vocab ...`.

Needs llama.cpp built from source: MUSER_GGML_SRC (its source directory) and LLAMA_CPP_BIN (the
directory of libllama.so); skipped otherwise.
"""

from __future__ import annotations

import os
import random
import re
import subprocess
import time
from pathlib import Path

import pytest

from libllama_harness import cargo_example, compile_harness, vocab_only_gguf

REPO = Path(__file__).resolve().parents[2]
HARNESS = Path(__file__).with_name("llamacpp_grammar.cpp")
MODEL = REPO / "models" / "muse-default.gguf"
# Texts a grammar may reference as <text>: special tokens (one token each) and others (not).
TOKEN_TEXTS = ["<|bos|>", "<|eos|>", "<the>", "<a>", "<|nope|>"]


@pytest.fixture(scope="session")
def llamacpp_grammar(tmp_path_factory) -> Path:
    """The harness, compiled against libllama."""
    return compile_harness(tmp_path_factory, HARNESS)


@pytest.fixture(scope="session")
def grammar_io() -> Path:
    """Builds the example once (release: the masks run over the whole vocabulary)."""
    return cargo_example("muser-grammar", "grammar_io", release=True)


@pytest.fixture(scope="session")
def vocab(tmp_path_factory, llamacpp_grammar) -> dict:
    """The GGUF llama.cpp loads, the pieces and token files grammar_io reads, the pieces."""
    tmp = tmp_path_factory.mktemp("vocab")
    model = tmp / "vocab.gguf"
    vocab_only_gguf(MODEL, model)
    run = lambda *args, stdin="": subprocess.run(  # noqa: E731
        [str(llamacpp_grammar), "--vocab", str(model), *args], input=stdin, capture_output=True, text=True,
        check=True).stdout
    pieces_text = run("--pieces")
    (tmp / "pieces.txt").write_text(pieces_text)
    pieces = []
    for ln in pieces_text.splitlines():
        h, e = ln.split()
        pieces.append((b"" if h == "-" else bytes.fromhex(h), e == "1"))
    tokens_text = run("--tokenize", stdin="".join(t.encode().hex() + "\n" for t in TOKEN_TEXTS))
    (tmp / "tokens.txt").write_text(tokens_text)
    return {"model": model, "pieces_file": tmp / "pieces.txt", "tokens_file": tmp / "tokens.txt", "pieces": pieces}


# ------------------------------------------------------------------------------------------------
# Grammars

def gbnf_str(s: str) -> str:
    out = []
    for ch in s:
        if ch == '"':
            out.append('\\"')
        elif ch == "\\":
            out.append("\\\\")
        elif ch == "\n":
            out.append("\\n")
        elif ch == "\t":
            out.append("\\t")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def class_char(rng: random.Random, ch: str) -> str:
    if ch in "]\\-^[\"":
        return "\\" + ch
    if ch == "\n":
        return "\\n"
    if ord(ch) > 127 and rng.random() < 0.3:
        return f"\\u{ord(ch):04x}" if ord(ch) < 0x10000 else f"\\U{ord(ch):08x}"
    return ch


class Gen:
    """Random grammars over the vocabulary's words."""

    RANGES = [("a", "z"), ("0", "9"), ("A", "Z"), ("à", "ÿ"), ("一", "龥"), (" ", "/"), ("\n", "\n"),
              ("é", "é"), ("ぁ", "ゟ"), ("\x80", "\u07ff"), ("\U0001F600", "\U0001F64F"), ("z", "a")]

    def __init__(self, rng: random.Random, words: list[str], n_vocab: int, token_ids: list[int]):
        self.rng, self.words, self.n_vocab, self.token_ids = rng, words, n_vocab, token_ids

    def ws(self, nested: bool) -> str:
        """Space between items; a newline or a comment only inside parentheses."""
        r = self.rng.random()
        if not nested or r < 0.8:
            return " " if r < 0.9 else "  "
        return " # note\n  " if r < 0.9 else "\n  "

    def literal(self) -> str:
        rng = self.rng
        n = rng.choice([1, 1, 1, 2, 3])
        parts = [rng.choice(self.words) for _ in range(n)]
        if rng.random() < 0.15:
            parts.append(rng.choice(["é", "日本", "ñ", "\n", "ü", "😀", "\t"]))
        return gbnf_str("".join(parts))

    def char_class(self) -> str:
        rng = self.rng
        body = ""
        for _ in range(rng.randint(1, 3)):
            a, b = rng.choice(self.RANGES)
            if rng.random() < 0.4:
                body += class_char(rng, a)
            else:
                body += class_char(rng, a) + "-" + class_char(rng, b)
        return "[" + ("^" if rng.random() < 0.3 else "") + body + "]"

    def token(self) -> str:
        rng = self.rng
        neg = "!" if rng.random() < 0.5 else ""
        if rng.random() < 0.25:
            return neg + rng.choice(["<|bos|>", "<|eos|>"])
        return neg + f"<[{rng.choice(self.token_ids)}]>"

    def atom(self, depth: int, rule: int, n_rules: int) -> str:
        rng = self.rng
        r = rng.random()
        if depth <= 0 or r < 0.3:
            r2 = rng.random()
            if r2 < 0.45:
                return self.literal()
            if r2 < 0.75:
                return self.char_class()
            if r2 < 0.82:
                return "."
            if r2 < 0.9 and rule + 1 < n_rules:
                return f"rule-{chr(97 + rng.randint(rule + 1, n_rules - 1))}"
            if r2 < 0.95 and self.tokens_on:
                return self.token()
            return self.literal()
        if r < 0.55:
            return "(" + self.alts(depth - 1, rule, n_rules, nested=True) + ")"
        return self.atom(depth - 1, rule, n_rules)

    def repeat(self) -> str:
        rng = self.rng
        r = rng.random()
        if r < 0.5:
            return ""
        if r < 0.51:
            return "{0}"  # empties the item: a group of it repeated is left recursion to llama.cpp
        m = rng.randint(0, 3)
        n = max(m, 1) + rng.randint(0, 3)
        return rng.choice(["*", "+", "?", f"{{{max(m, 1)}}}", f"{{{m},}}", f"{{{m},{n}}}", f"{{ {m} , {n} }}"])

    def seq(self, depth: int, rule: int, n_rules: int, nested: bool) -> str:
        items = []
        for _ in range(self.rng.randint(1, 3)):
            a = self.atom(depth, rule, n_rules)
            rep = self.repeat()
            if rep and a.startswith(("<", "!")) and self.rng.random() < 0.5:
                rep = ""
            items.append(a + rep)
        return "".join(a + self.ws(nested) for a in items[:-1]) + items[-1]

    def alts(self, depth: int, rule: int, n_rules: int, nested: bool = False) -> str:
        n = self.rng.choice([1, 1, 2, 3])
        sep = " |\n    " if self.rng.random() < 0.2 else " | "
        body = sep.join(self.seq(depth, rule, n_rules, nested) for _ in range(n))
        if nested and self.rng.random() < 0.2:
            body = "\n  " + body + "\n"
        return body

    def grammar(self) -> str:
        rng = self.rng
        self.tokens_on = rng.random() < 0.35
        n_rules = rng.randint(0, 4)
        lines = [f"root ::= {self.alts(3, -1, n_rules)}"]
        for i in range(n_rules):
            name = f"rule-{chr(97 + i)}"
            if rng.random() < 0.3:
                # Right recursion: the rule comes back after a terminal.
                lines.append(f"{name} ::= {self.literal()} {name} | {self.alts(2, i, n_rules)}")
            else:
                lines.append(f"{name} ::= {self.alts(2, i, n_rules)}")
        if rng.random() < 0.2:
            lines.insert(0, "# a random grammar")
        return "\n".join(lines) + ("\n" if rng.random() < 0.7 else "")


MULTIBYTE = [
    'root ::= [à-ÿ]+ " " [一-龥]{1,3} "\\n"',
    'root ::= ("é" | "日本" | [^a-z\\n])+',
    'root ::= "ñ" [^ñ]* "😀"',
    'root ::= ([\\u0400-\\u04ff] | [\\U0001F600-\\U0001F64F] | " ")* "."',
    'root ::= [^\\x00-\\x7f]{2,5} [a-z]*',
    'root ::= "日本語" (" " [ぁ-ゟ]+)*',
    'root ::= [\\u00ff-\\u0080] | [à-ÿ]+ | .',
]

# Each error llama.cpp reports, and a few it accepts that look wrong.
# (An empty string is left out: llama_sampler_init_grammar takes it as "no grammar".)
BAD = [
    "# nothing", "root ::=", "root ::= \"abc", "root ::= [a-z", "root ::= (\"a\"", "root := \"a\"",
    "root ::= \"a\" )", "root ::= \"\\q\"", "root ::= \"\\x4\"", "root ::= *", "root ::= \"\" +",
    "root ::= \"a\"{3001}", "root ::= \"a\"{2000}", "root ::= \"a\"{100}{100}", "root ::= \"a\"{,3}",
    "root ::= \"a\"{3;}", "root ::= \"a\"{3,4", "root ::= \"a\"{99999999999999999999999}",
    "root ::= <|nope|>", "root ::= <|bos|>", "root ::= !\"a\"", "root ::= <[12>", "root ::= <[12]",
    "root ::= <[99999999999]>", "root ::= <[]>", "root ::= \"a\"\n  | \"b\"", "root ::= foo",
    "foo ::= \"x\"", "root ::= \"a\" | root \"a\"", "root ::= asdf\nasdf ::= \"a\" | asdf \"a\"",
    "root ::= asdf\nasdf ::= \"a\" | foo \"b\"\nfoo ::= \"c\" | empty asdf \"d\" | \"e\"\nempty ::= \"blah\" | ",
    "root ::= \"x\"* root \"y\" | \"z\"", "root ::= (\"a\"{0})* \"b\"", "root ::= [] [^] \"a\"",
    "root ::= \"a\"\x00 garbage", "root ::= \"a\" \x00", "root ::= b root | \"y\"\nb ::= c\nc ::= \"z\" | ",
    "root ::= \"a\"{1,2001}", "root ::= é", "root ::= \"a\"\nroot ::= \"b\"", "ROOT ::= \"a\"",
    "root ::= [a-]", "root ::= [\\-a-\\]]+", "root ::= \"a\" # c\n\n# d\n", "root ::= x\nx ::= \"a\" x?",
    "root ::= (((\"a\")))", "root ::= \"a\"{2}{1000}", "root ::= \"a\"{ 2 , 3 }", "root ::= .{0}",
    "root ::= \"a\"\r\nx ::= \"b\"\r\n", "root ::= \"a\" \\", "1 ::= \"a\"\nroot ::= 1",
]
MUTATIONS = ["(", ")", "[", "]", "\"", "|", "*", "+", "?", "{", "}", "{2}", "{0,", "::=", "\\", "\\x", "<", "!",
             "#", "\n", "{3000}", " ", "^", "-", ".", "<[3]>", "\\u00", "é"]


def hangs_llama(text: str) -> bool:
    """`{m,n}` with n < m: llama.cpp loops forever on it."""
    text = text.split("\x00")[0]
    return any(int(b) < int(a) for a, b in re.findall(r"\{\s*(\d+)\s*,\s*(\d+)\s*\}", text))


def mutate(rng: random.Random, text: str) -> str:
    for _ in range(rng.randint(1, 3)):
        i = rng.randint(0, len(text))
        if rng.random() < 0.5:
            text = text[:i] + rng.choice(MUTATIONS) + text[i:]
        else:
            j = rng.randint(0, len(text))
            text = text[:min(i, j)] + text[max(i, j):]
    return text


# ------------------------------------------------------------------------------------------------
# Running both sides

def run_lines(cmd: list[str], lines: list[str]) -> list[str]:
    r = subprocess.run(cmd, input="\n".join(lines) + "\n", capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, f"{Path(cmd[0]).name} failed: {r.stderr[-2000:]}"
    out = r.stdout.splitlines()
    assert len(out) == len(lines), f"{Path(cmd[0]).name} answered {len(out)} lines to {len(lines)}"
    return out


def scenario_line(seed: int, steps: int, grammar: str, verbose: bool = False) -> str:
    return f"seed={seed} steps={steps} grammar={grammar.encode().hex() or '-'}" + (" verbose=1" if verbose else "")


def describe(vocab: dict, ids: set[int]) -> str:
    shown = sorted(ids)[:12]
    return ", ".join(f"{t}={vocab['pieces'][t][0]!r}{'(eog)' if vocab['pieces'][t][1] else ''}" for t in shown) + (
        " ..." if len(ids) > 12 else "")


def test_allowed_sets_match_llama_cpp(llamacpp_grammar, grammar_io, vocab):
    seed = int(os.environ.get("MUSER_GRAMMAR_SEED", time.time_ns() % 2**32))
    count = int(os.environ.get("MUSER_GRAMMAR_SCENARIOS", 200))
    print(f"scenario seed {seed} (MUSER_GRAMMAR_SEED={seed} replays this run)")
    rng = random.Random(seed)

    n_vocab = len(vocab["pieces"])
    words = []
    for p, eog in vocab["pieces"]:
        try:
            w = p.decode()
        except UnicodeDecodeError:
            continue
        if w and not eog and "\x00" not in w and not w.startswith("<|"):
            words.append(w)
    token_ids = [rng.randrange(n_vocab) for _ in range(6)] + [0, 1]
    gen = Gen(rng, words, n_vocab, token_ids)

    grammars: list[tuple[str, str]] = []
    src = os.environ.get("MUSER_GGML_SRC")
    gdir = Path(src) / "grammars" if src else None
    if gdir and gdir.is_dir():
        grammars += [(f"llama.cpp {p.name}", p.read_text()) for p in sorted(gdir.glob("*.gbnf"))]
    grammars += [(f"multibyte {i}", g) for i, g in enumerate(MULTIBYTE)]
    grammars += [(f"random {i}", gen.grammar()) for i in range(count)]

    # Broken grammars, and random ones mutated: compared on refusal (and their first step).
    bad = list(BAD) + [mutate(rng, gen.grammar()) for _ in range(400)]
    bad = [b for b in bad if not hangs_llama(b) and b.split("\x00")[0]]

    lines = [scenario_line(rng.randrange(2**63), rng.randint(30, 60), g) for _, g in grammars]
    lines += [scenario_line(rng.randrange(2**63), 2, b) for b in bad]
    names = [n for n, _ in grammars] + [f"broken {i}" for i in range(len(bad))]
    texts = [g for _, g in grammars] + bad

    t0 = time.time()
    theirs = run_lines([str(llamacpp_grammar), "--vocab", str(vocab["model"])], lines)
    t1 = time.time()
    muser = [str(grammar_io), "--vocab", str(vocab["pieces_file"]), "--tokens", str(vocab["tokens_file"])]
    ours = run_lines(muser, lines)
    t2 = time.time()
    # Where a step went past Muser's default limits (work budget, stack count: the state fails
    # cleanly where llama.cpp computes on, however long), the scenario is compared again with the
    # limits lifted: the language is compared either way, and the give-ups are counted.
    gave_up = [i for i, got in enumerate(ours) if got.endswith(":failed") or ":failed " in got]
    if gave_up:
        for i, got in zip(gave_up, run_lines(muser, [lines[i] + " limits=none" for i in gave_up])):
            lines[i] += " limits=none"
            ours[i] = got

    steps = picks_partial = refused = accepted_broken = refused_good = ends = errs = 0
    for name, text, line, want, got in zip(names, texts, lines, theirs, ours):
        got_head = got.split("\t")[0]
        replay = (f"\n  replay: echo '{line}' | grammar_io --vocab PIECES --tokens TOKENS  vs  "
                  f"llamacpp_grammar --vocab GGUF\n  grammar: {text!r}")
        if want == "refused" or got_head == "refused":
            assert want == got_head, (
                f"{name} (seed {seed}): llama.cpp {'refuses' if want == 'refused' else 'accepts'} the grammar, "
                f"Muser {'refuses' if got_head == 'refused' else 'accepts'} it ({got}){replay}")
            if name.startswith("broken"):
                refused += 1
            else:
                refused_good += 1
            continue
        if name.startswith("broken"):
            accepted_broken += 1
        w, g = want.split(" "), got.split(" ")
        for k, (a, b) in enumerate(zip(w, g)):
            if a == b:
                continue
            # Show the difference: both sides again, listing the allowed ids.
            vline = line.replace(f"steps={line.split('steps=')[1].split()[0]}", f"steps={k + 1}") + " verbose=1"
            wa = run_lines([str(llamacpp_grammar), "--vocab", str(vocab["model"])], [vline])[0].split(" ")[k]
            ga = run_lines(muser, [vline])[0].split(" ")[k]
            ws = {int(t) for t in wa.split(":")[3].split(",") if t}
            gs = {int(t) for t in ga.split(":")[3].split(",") if t}
            picked = [int(r.split(":")[2]) for r in w[:k] if r.split(":")[2].isdigit()]
            raise AssertionError(
                f"{name} (seed {seed}): step {k} differs: llama.cpp {a}, Muser {b}\n"
                f"  after tokens {picked[-20:]} = {b''.join(vocab['pieces'][t][0] for t in picked)!r}\n"
                f"  only llama.cpp allows: {describe(vocab, ws - gs)}\n  only Muser allows: {describe(vocab, gs - ws)}"
                f"{replay}")
        assert len(w) == len(g), f"{name} (seed {seed}): {len(w)} steps vs {len(g)}{replay}"
        steps += len(w)
        for rec in w:
            pick = rec.split(":")[2]
            ends += pick == "end"
            errs += pick.startswith("err")
            if pick.isdigit():
                p = vocab["pieces"][int(pick)][0]
                try:
                    p.decode()
                except UnicodeDecodeError:
                    picks_partial += 1
    print(f"{len(grammars)} grammars ({refused_good} refused by both), {steps} steps compared ({picks_partial} picks "
          f"ending inside a UTF-8 sequence, {ends} ending the generation, {errs} refused on accept); "
          f"{len(bad)} broken grammars ({refused} refused by both, {accepted_broken} accepted by both); "
          f"{len(gave_up)} past Muser's default limits, compared without them; "
          f"llama.cpp {t1 - t0:.1f}s, Muser {t2 - t1:.1f}s")
    # Rare by design: the default limits are far above what these grammars usually need.
    assert len(gave_up) <= len(lines) // 50, f"{len(gave_up)} of {len(lines)} scenarios past Muser's default limits"
    assert steps > 10 * len(grammars) // 2, f"too few steps compared: {steps}"
    assert refused_good < len(grammars) // 10, f"{refused_good} of the {len(grammars)} grammars refused"
    assert refused > len(BAD) // 2, f"too few refusals compared: {refused}"
    assert picks_partial > 0, "no scenario went through a token ending inside a UTF-8 sequence"
