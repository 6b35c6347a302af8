"""Constrained decoding through `muser serve` and `muser run`: llama-server's `grammar` (GBNF)
and `json_schema` fields, and OpenAI's `response_format` (`json_object`, `json_schema`) through
the real `openai` client. Every answer must be in the grammar's language (a Python regex that
says the same) or parse as JSON and validate against its schema (the `jsonschema` package, an
independent validator), at random seeds and temperatures; streamed answers must equal the
unstreamed ones, and concurrent requests their solo runs.

The server runs models/muse-default.gguf (a small model that knows nothing of JSON: whatever it
writes comes from the grammar's choices). The grammar engine itself is compared with llama.cpp's,
token by token, in test_grammar_llamacpp.py.
"""

from __future__ import annotations

import json
import random
import re
import subprocess
import threading
from concurrent.futures import ThreadPoolExecutor

import jsonschema
import openai
import pytest

from test_server import MODEL, MODEL_ID, ServerProcess, completion_native, muser_bin, post

# A grammar and a regex with the same language.
GRAMMAR = r'''root ::= answer (" " word){1,3} "."
answer ::= "yes" | "no" | "maybe"
word ::= [a-z]{2,6} ("-" [a-z]{2,4})?
'''
GRAMMAR_RE = re.compile(r"(yes|no|maybe)( [a-z]{2,6}(-[a-z]{2,4})?){1,3}\.")

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "minLength": 1, "maxLength": 12},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "tags": {"type": "array", "items": {"enum": ["red", "green", "blue"]}, "maxItems": 3},
        "ok": {"type": "boolean"},
    },
    "required": ["name", "age"],
    "additionalProperties": False,
}
SCHEMAS = {
    "person": PERSON,
    "choice": {"type": "object", "properties": {"pick": {"enum": ["a", "b", 3, None]}},
               "required": ["pick"]},
    "numbers": {"type": "array", "items": {"type": "number"}, "minItems": 1, "maxItems": 4},
    "nested": {"type": "object",
               "properties": {"point": {"type": "object",
                                        "properties": {"x": {"type": "integer"},
                                                       "y": {"type": "integer"}},
                                        "required": ["x", "y"]},
                              "label": {"anyOf": [{"type": "string", "maxLength": 8},
                                                  {"type": "null"}]}},
               "required": ["point", "label"]},
}


@pytest.fixture(scope="module")
def server():
    s = ServerProcess("--parallel", "8", "--ctx-size", "2048", "--threads", "2")
    yield s
    s.stop()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0)


def test_a_gbnf_grammar_holds_every_answer(server):
    rng = random.Random()
    for i in range(8):
        seed = rng.randrange(1 << 30)
        body = {"prompt": "Question: is it raining?", "n_predict": 64, "seed": seed,
                "temperature": rng.choice([0.0, 0.7, 1.5]), "grammar": GRAMMAR}
        a = completion_native(server, body)
        assert GRAMMAR_RE.fullmatch(a["content"]), (seed, a["content"])
        # The grammar ended the text: the next token could only be the end of generation.
        assert a["stop_type"] == "eos", (seed, a["stop_type"], a["content"])
        assert a["generation_settings"]["grammar"] == GRAMMAR
        # Streamed, the same text.
        events = completion_native(server, body, stream=True)
        assert "".join(e["content"] for e in events) == a["content"], seed
        # With ignore_eos, the request ends where the grammar does (nothing else can follow),
        # with the same text and no end-of-generation tokens.
        b = completion_native(server, dict(body, ignore_eos=True, return_tokens=True))
        assert (b["content"], b["stop_type"]) == (a["content"], "eos"), seed
        assert b["tokens_predicted"] == len(b["tokens"]) == a["tokens_predicted"], seed


def test_a_grammar_on_the_openai_endpoints(client):
    seed = random.randrange(1 << 30)
    r = client.completions.create(model=MODEL_ID, prompt="Answer:", max_tokens=64, seed=seed,
                                  temperature=1.0, extra_body={"grammar": GRAMMAR})
    assert GRAMMAR_RE.fullmatch(r.choices[0].text), (seed, r.choices[0].text)
    assert r.choices[0].finish_reason == "stop"
    # Cut short by max_tokens: a prefix of an answer, finish_reason "length".
    r = client.completions.create(model=MODEL_ID, prompt="Answer:", max_tokens=2, seed=seed,
                                  temperature=1.0, extra_body={"grammar": GRAMMAR})
    assert r.choices[0].finish_reason == "length"
    assert re.fullmatch(r"(y|ye|yes|n|no|m|ma|may|mayb|maybe)( [a-z-]*)?", r.choices[0].text)


@pytest.mark.parametrize("name", list(SCHEMAS))
def test_json_schema_answers_validate(client, name):
    schema = SCHEMAS[name]
    rng = random.Random()
    for _ in range(4):
        seed = rng.randrange(1 << 30)
        r = client.chat.completions.create(
            model=MODEL_ID, messages=[{"role": "user", "content": "Describe someone."}],
            max_tokens=200, seed=seed, temperature=rng.choice([0.0, 0.8, 1.2]),
            response_format={"type": "json_schema",
                             "json_schema": {"name": name, "schema": schema, "strict": True}})
        text = r.choices[0].message.content
        assert r.choices[0].finish_reason == "stop", (seed, text)
        jsonschema.validate(json.loads(text), schema)


def test_json_object_and_llama_server_json_schema(server, client):
    seed = random.randrange(1 << 30)
    r = client.chat.completions.create(
        model=MODEL_ID, messages=[{"role": "user", "content": "JSON please"}], max_tokens=200,
        seed=seed, temperature=0.8, response_format={"type": "json_object"})
    assert isinstance(json.loads(r.choices[0].message.content), dict), seed
    # json_object with a schema of its own, as llama-server reads it.
    r = client.chat.completions.create(
        model=MODEL_ID, messages=[{"role": "user", "content": "JSON please"}], max_tokens=200,
        seed=seed, temperature=0.8, response_format={"type": "json_object", "schema": PERSON})
    jsonschema.validate(json.loads(r.choices[0].message.content), PERSON)
    # llama-server's own field, on /completion and the OpenAI endpoints.
    a = completion_native(server, {"prompt": "{", "n_predict": 200, "seed": seed,
                                   "temperature": 0.8, "json_schema": SCHEMAS["numbers"]})
    jsonschema.validate(json.loads(a["content"]), SCHEMAS["numbers"])
    assert "::=" in a["generation_settings"]["grammar"]
    r = post(server, "/v1/completions", {"prompt": "x", "max_tokens": 200, "seed": seed,
                                         "json_schema": SCHEMAS["choice"]})
    assert r.status_code == 200, r.text
    jsonschema.validate(json.loads(r.json()["choices"][0]["text"]), SCHEMAS["choice"])
    # /completion reads response_format too.
    a = completion_native(server, {"prompt": "{", "n_predict": 200, "seed": seed,
                                   "response_format": {"type": "json_schema",
                                                       "json_schema": {"schema": PERSON}}})
    jsonschema.validate(json.loads(a["content"]), PERSON)
    # `{"type": "text"}` constrains nothing.
    r = post(server, "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}],
                                              "max_tokens": 3, "temperature": 0,
                                              "response_format": {"type": "text"}})
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["finish_reason"] == "length"


def test_constrained_requests_in_a_group_match_their_solo_runs(server):
    bodies = [{"prompt": f"Item {i}:", "n_predict": 80, "temperature": 0.9, "seed": 100 + i,
               "json_schema": SCHEMAS[list(SCHEMAS)[i % len(SCHEMAS)]] if i % 2 else None,
               "grammar": GRAMMAR if i % 2 == 0 else None} for i in range(8)]
    bodies = [{k: v for k, v in b.items() if v is not None} for b in bodies]
    solo = [completion_native(server, b)["content"] for b in bodies]
    barrier = threading.Barrier(len(bodies))

    def together(b):
        barrier.wait(timeout=30)
        return completion_native(server, b)["content"]

    with ThreadPoolExecutor(len(bodies)) as ex:
        concurrent = list(ex.map(together, bodies))
    assert concurrent == solo


def run_cli(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    p = subprocess.run([str(muser_bin()), "run", "-m", str(MODEL), "-t", "2", *args],
                       capture_output=True, text=True, timeout=120)
    if check:
        assert p.returncode == 0, p.stderr
    return p


def test_muser_run_takes_llama_cli_grammar_flags(tmp_path):
    seed = str(random.randrange(1 << 30))
    prompt = "Q:"
    out = run_cli("-p", prompt, "-n", "64", "--seed", seed, "--temp", "1.0",
                  "--grammar", GRAMMAR).stdout
    assert GRAMMAR_RE.fullmatch(out[len(prompt):].rstrip("\n")), (seed, out)
    f = tmp_path / "g.gbnf"
    f.write_text(GRAMMAR)
    assert run_cli("-p", prompt, "-n", "64", "--seed", seed, "--temp", "1.0",
                   "--grammar-file", str(f)).stdout == out
    s = tmp_path / "s.json"
    s.write_text(json.dumps(PERSON))
    for flag, value in [("--json-schema", json.dumps(PERSON)), ("--json-schema-file", str(s))]:
        out = run_cli("-p", "{", "-n", "200", "--seed", seed, "--temp", "0.8",
                      flag, value).stdout
        jsonschema.validate(json.loads(out[1:]), PERSON)
    # Bad input: a clear error, nothing generated.
    for args, what in [(["--grammar", 'root ::= "a'], "grammar"),
                       (["--grammar", "root ::= undefined-rule"], "undefined-rule"),
                       (["--json-schema", "{not json"], "--json-schema"),
                       (["--grammar-file", str(tmp_path / "missing.gbnf")], "missing.gbnf"),
                       (["--grammar", "root ::= x", "--json-schema", "{}"], "cannot be used")]:
        p = run_cli("-p", prompt, "-n", "4", *args, check=False)
        assert p.returncode != 0 and what in p.stderr, (args, p.stderr)
        assert p.stdout == "", (args, p.stdout)


def test_grammars_past_the_engines_bounds_fail_cleanly(server):
    # An ambiguous grammar (every letter pair opens two ways to close: the parse doubles with
    # each letter) and a schema whose pattern nests stars 20 deep: each request ends (a 400
    # naming the grammar, or an answer in the language), while a plain request beside it is
    # served as usual.
    letters = "abcdefghijklmnopqrstuvwxyz"
    alts = " | ".join(f'"{c}" x "{c}" | "{c}" x "{c.upper()}"' for c in letters)
    palindromes = f'root ::= x\nx ::= {alts} | "."\n'
    nested = "^" + "(?:" * 20 + "ab?" + ")*" * 20 + "$"
    bodies = [{"prompt": "x", "n_predict": 64, "temperature": 1.5, "seed": 3,
               "grammar": palindromes},
              {"prompt": "x", "n_predict": 64, "temperature": 1.5, "seed": 3,
               "json_schema": {"type": "string", "pattern": nested}}]

    def send(body):
        return post(server, "/completion", body)

    with ThreadPoolExecutor(3) as ex:
        hard = [ex.submit(send, b) for b in bodies]
        plain = ex.submit(send, {"prompt": "Once upon a time", "n_predict": 8, "temperature": 0})
        assert plain.result(timeout=60).status_code == 200
        for f in hard:
            r = f.result(timeout=60)
            if r.status_code != 200:
                # The request's own doing: a 400 naming the grammar, not a server error.
                assert r.status_code == 400, r.text
                err = r.json()["error"]
                assert err["param"] == "grammar" and "grammar" in err["message"], r.text
            else:
                text = r.json()["content"]
                assert re.fullmatch(r"[a-zA-Z]*\.[a-zA-Z]*", text) or text.startswith('"'), text
