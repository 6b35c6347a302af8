#!/usr/bin/env python3
"""Every sampler setting through `muser serve` on one backend: the tokens a request draws without
logprobs (where the sampler allows it, from the backend's argmax or top-k candidates) equal those
drawn from the whole logits row (with `n_probs`, which reads the row), and a seed reproduces them.
Requests with a grammar or a JSON schema (which read the row while the grammar applies) must
also give text in the grammar's language. Every request has `ignore_eos` (end tokens banned: the
backend's top-k hands over as many more candidates as there are end tokens).

    python3 scripts/sampler_paths.py MUSER_BIN MODEL [--backend cuda]

Standard library only (the GPU machine has no pip). Prints one line per setting and exits 1 on
any difference.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
import urllib.request

SETTINGS = {
    "greedy": {"temperature": 0},
    "default chain": {"temperature": 0.8},
    "top-k 5": {"temperature": 1.0, "top_k": 5, "top_p": 1.0, "min_p": 0.0},
    "top-k off": {"temperature": 1.0, "top_k": 0},
    "penalties": {"temperature": 0.7, "repeat_penalty": 1.3, "presence_penalty": 0.5},
    "logit bias": {"temperature": 0.7, "logit_bias": [[5, -100.0], [17, 3.0]]},
    "typical_p": {"temperature": 0.9, "typical_p": 0.5},
    "top_n_sigma": {"temperature": 0.9, "top_n_sigma": 1.0},
    "xtc": {"temperature": 0.9, "xtc_probability": 0.5, "xtc_threshold": 0.05},
    "xtc greedy": {"temperature": 0, "xtc_probability": 1.0, "xtc_threshold": 0.05},
    "dynatemp": {"temperature": 0.9, "dynatemp_range": 0.5, "dynatemp_exponent": 1.5},
    "mirostat 1": {"temperature": 0.9, "mirostat": 1, "mirostat_tau": 4.0, "mirostat_eta": 0.2},
    "mirostat 2": {"temperature": 0.9, "mirostat": 2, "mirostat_tau": 3.0, "mirostat_eta": 0.1},
    "min_keep": {"temperature": 0.9, "min_keep": 5, "top_p": 0.2},
    "dry": {"temperature": 0.9, "dry_multiplier": 1.5, "dry_sequence_breakers": ["\n", ":"]},
    "dry greedy": {"temperature": 0, "dry_multiplier": 2.0},
    "grammar": {"temperature": 1.0, "grammar": 'root ::= ("yes" | "no") (" " [a-z]{2,6}){1,3} "."'},
    "json schema": {"temperature": 0.9, "json_schema": {
        "type": "object", "properties": {"n": {"type": "integer"}, "s": {"type": "string",
                                                                          "maxLength": 6}},
        "required": ["n", "s"]}},
    # A lazy grammar: the backend's fast paths until the trigger ("e"), the row after it.
    "lazy grammar": {"temperature": 0.9, "grammar": 'root ::= "e" [^!]{0,30} "!"',
                     "grammar_lazy": True, "grammar_triggers": [{"type": 2, "value": "e"}]},
}


def in_language(name: str, text: str) -> bool:
    """Whether a constrained setting's text is a whole sentence of its grammar."""
    if name == "grammar":
        return re.fullmatch(r"(yes|no)( [a-z]{2,6}){1,3}\.", text) is not None
    if name == "lazy grammar":
        # At most 30 characters between "e" and "!", as the grammar counts them: bytes that
        # are not UTF-8 come back as U+FFFD each, where the grammar (as llama.cpp's) may read
        # several as one code point, so those are not counted.
        m = re.fullmatch(r"[^e]*e([^!]*)!", text, re.S)
        return m is not None and len(m.group(1).replace("\ufffd", "")) <= 30
    if name == "json schema":
        try:
            v = json.loads(text)
        except ValueError:
            return False
        return isinstance(v.get("n"), int) and isinstance(v.get("s"), str) and len(v["s"]) <= 6
    return True


def post(url: str, body: dict) -> dict:
    req = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        return json.loads(r.read())


def main() -> int:
    muser, model, *rest = sys.argv[1:]
    proc = subprocess.Popen([muser, "serve", "-m", model, "--port", "0", "--parallel", "4", *rest],
                            stderr=subprocess.PIPE, text=True)
    try:
        first = proc.stderr.readline()
        m = re.search(r"listening on (http://[\d.:]+)", first)
        if not m:
            print("the server did not start:", first, proc.stderr.read()[-2000:])
            return 1
        url = m.group(1)
        for _ in range(600):
            try:
                with urllib.request.urlopen(url + "/health", timeout=10) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            time.sleep(0.2)
        bad = 0
        for name, extra in SETTINGS.items():
            # A constrained request ends with its grammar (ignore_eos or not), given room for a
            # JSON answer's whitespace; the others run 24 tokens.
            constrained = "grammar" in extra or "json_schema" in extra
            n = 128 if constrained else 24
            body = {"prompt": "Once upon a time", "n_predict": n, "seed": 7, "ignore_eos": True,
                    "return_tokens": True, **extra}
            answer = post(url + "/completion", body)
            fast = answer["tokens"]
            again = post(url + "/completion", body)["tokens"]
            row = post(url + "/completion", dict(body, n_probs=1))["tokens"]
            ok = fast == again == row and (constrained or len(fast) == n) and in_language(name, answer["content"])
            bad += not ok
            print(f"{name:<14} {'same' if ok else 'DIFFERENT'}  {fast[:8]}"
                  + ("" if ok or in_language(name, answer["content"])
                     else f"\n    not in the grammar: {answer['content']!r}")
                  + ("" if ok else f"\n    again {again[:8]}\n    row   {row[:8]}"))
        print(f"{len(SETTINGS) - bad} of {len(SETTINGS)} settings draw the same tokens on every path")
        return 1 if bad else 0
    finally:
        proc.terminate()
        proc.wait()


if __name__ == "__main__":
    sys.exit(main())
