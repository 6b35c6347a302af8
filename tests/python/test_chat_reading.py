"""Muser's answers read as llama.cpp reads them. For every chat template llama.cpp ships
(models/templates under $MUSER_GGML_SRC) whose tool-call format Muser knows (all but `generic`,
whose JSON reply is Muser's own), `muser serve` answers chat requests with tools on a tiny random
model: `tool_choice` required, a named function or auto, parallel calls or not, thinking on or
off, random seeds. Its grammar makes the model write calls in the template's format, and
`verbose` gives the raw text (`__verbose.content`, as llama-server gives it). llama.cpp's own chat parser
(tests/python/llamacpp_chat.cpp, compiled against libllama-common) then reads that text for the
same request, and both readings must agree: the same calls in the same order (names, and
arguments as JSON values), the same content and the same reasoning, up to whitespace at their
ends (llama.cpp's handlers differ among themselves in what they trim).
"""

from __future__ import annotations

import json
import os
import random
import string
import subprocess
from pathlib import Path

import pytest
import requests

from libllama_harness import REPO, cargo_example
from test_chat_templates import (SRC, TEMPLATES, random_text, reasoning_family_templates,
                                 reasoning_tags_of, tiny_model)
from test_server import ServerProcess
from test_tool_calls import ADD, PING, WEATHER

HARNESS = Path(__file__).with_name("llamacpp_chat.cpp")

# Templates whose readings may differ from llama.cpp's, with why (answers are random: a
# template named here need not differ in every run).
KNOWN_DIFFERENCES: dict[str, str] = {
    "meta-llama-Llama-3.1-8B-Instruct.jinja":
        "llama.cpp reads the call after <|python_tag|> and leaves the tag itself in the content",
    "meta-llama-Llama-3.3-70B-Instruct.jinja": "as meta-llama-Llama-3.1-8B-Instruct.jinja",
    # llama.cpp reads no call of this template, whatever the layout:
    "ibm-granite-granite-3.3-2B-Instruct.jinja":
        "the template never renders a message's calls, so llama.cpp's analysis finds no call "
        "format and reads <|tool_call|>[...] as content; Muser reads the calls its system "
        "prompt teaches",
    # llama.cpp's readers of these two refuse the template's own layout (Muser's grammar
    # writes the template's layout, and reads llama.cpp's too where it differs):
    "upstage-Solar-Open-100B.jinja":
        "llama.cpp's analysis of the template takes its example call's id (call00001) for "
        "fixed text: it reads no call with another id, and the template asks the model for 10 "
        "random lowercase letters and digits (with the ids made call00001, the readings agree)",
    "meetkai-functionary-medium-v3.2.jinja":
        "llama.cpp reads a second call only right after the first's JSON, without the '>>>' "
        "that the template writes between them, and no call after the reply's text (an 'all' "
        "message)",
}

# The template variables that turn thinking off besides `enable_thinking`, by format (asked in
# the requests with thinking off, to both readers).
THINKING_OFF: dict[str, dict] = {
    "kimi-k3": {"thinking": False},
}


@pytest.fixture(scope="module")
def llamacpp_chat(tmp_path_factory) -> Path:
    """The oracle, compiled against llama.cpp's common library."""
    lib = os.environ.get("LLAMA_CPP_BIN")
    if not (SRC and lib):
        pytest.skip("needs llama.cpp's source (MUSER_GGML_SRC) and its libraries (LLAMA_CPP_BIN)")
    exe = tmp_path_factory.mktemp("llamacpp") / "llamacpp_chat"
    src = Path(SRC)
    r = subprocess.run(
        ["g++", "-O1", "-std=c++17", f"-I{src / 'common'}", f"-I{src / 'include'}",
         f"-I{src / 'ggml' / 'include'}", f"-I{src / 'vendor'}", str(HARNESS), f"-L{lib}",
         "-lllama-common", "-lllama", "-lggml", "-lggml-base", f"-Wl,-rpath,{lib}", "-o",
         str(exe)],
        capture_output=True, text=True, cwd=REPO)
    assert r.returncode == 0, r.stderr
    return exe


def read_by_llamacpp(exe: Path, requests_: list[dict]) -> list[dict]:
    """llama.cpp's readings of the requests' texts, one per request."""
    lines = "".join(json.dumps(r) + "\n" for r in requests_)
    out = subprocess.run([str(exe)], input=lines, capture_output=True, text=True, check=True,
                         timeout=600).stdout.splitlines()
    assert len(out) == len(requests_)
    return [json.loads(line) for line in out]


def random_request(rng: random.Random) -> dict:
    """Chat body with 1-3 of the test tools, a tool_choice, parallel calls or not."""
    tools = rng.sample([WEATHER, ADD, PING], rng.randrange(1, 4))
    choice = rng.choice(["required", "auto", "function"])
    if choice == "function":
        choice = {"type": "function", "function": {"name": rng.choice(tools)["function"]["name"]}}
    return {"messages": [{"role": "user", "content": "What is the weather in Paris?"}],
            "tools": tools, "tool_choice": choice,
            "parallel_tool_calls": rng.random() < 0.5}


def json_or_text(arguments: str):
    """A call's arguments as a JSON value; text that is not JSON (llama.cpp's reader can leave
    a value unclosed) as it is, so that it differs from any JSON reading."""
    if not arguments:
        return None
    try:
        return json.loads(arguments)
    except json.JSONDecodeError:
        return ("not JSON", arguments)


def reading(msg: dict) -> tuple:
    """A reading compared: content and reasoning without whitespace at their ends, and the
    calls' names and arguments (as JSON values)."""
    calls = [(c["name"], json_or_text(c["arguments"])) for c in msg.get("tool_calls") or []]
    return ((msg.get("content") or "").strip(), (msg.get("reasoning_content") or "").strip(),
            calls)


def muser_reading(message: dict) -> tuple:
    calls = [{"name": c["function"]["name"], "arguments": c["function"]["arguments"]}
             for c in message.get("tool_calls") or []]
    return reading({**message, "tool_calls": calls})


@pytest.mark.skipif(not TEMPLATES, reason="llama.cpp's source (MUSER_GGML_SRC) is not here")
def test_muser_answers_read_as_llama_cpp_reads_them(llamacpp_chat, tmp_path):
    model = tiny_model(tmp_path)
    # A fixed seed by default, so that CI reads the same answers every run;
    # MUSER_READING_SEED=N draws others.
    seed = int(os.environ.get("MUSER_READING_SEED", "2026"))
    rng = random.Random(seed)
    rounds = int(os.environ.get("MUSER_READING_ROUNDS", "16"))
    # MUSER_READING_TEMPLATES=a,b keeps the templates whose file names contain a or b.
    only = [w for w in os.environ.get("MUSER_READING_TEMPLATES", "").split(",") if w]
    # Half the requests ask with `enable_thinking` false (and the format's own THINKING_OFF;
    # both readers), drawn apart from the rest so that the other draws stay as they were: the
    # tiny model seldom closes a reasoning block the prompt opens, so a thinking template's
    # answers with thinking on are mostly cut by max_tokens and not compared.
    # MUSER_READING_THINKING=on or off asks all one way.
    mode = os.environ.get("MUSER_READING_THINKING", "mixed")
    # MUSER_READING_KWARGS='{"thinking": false}' gives every request (both readers) these
    # template variables too.
    extra = json.loads(os.environ.get("MUSER_READING_KWARGS", "{}"))
    coin = random.Random(seed + 1)
    found: dict[str, tuple] = {}
    counts: dict[str, int] = {}
    compared = refused = 0
    for path in TEMPLATES:
        if only and not any(w in path.name for w in only):
            continue
        server = ServerProcess("--chat-template-file", str(path), "--ctx-size", "4096",
                               model=model)
        try:
            fmt = requests.get(server.url + "/props", timeout=60).json()["chat_format"]
            if fmt == "generic":
                continue
            asked = []
            for _ in range(rounds):
                body = random_request(rng)
                thinking = mode == "on" or (mode == "mixed" and coin.random() < 0.5)
                kwargs = {**extra} if thinking else {**extra, "enable_thinking": False,
                                                     **THINKING_OFF.get(fmt, {})}
                kwargs = {"chat_template_kwargs": kwargs} if kwargs else {}
                r = requests.post(server.url + "/v1/chat/completions", timeout=120, json={
                    **body, **kwargs, "max_tokens": 320, "temperature": 1.0,
                    "seed": rng.randrange(1 << 30), "verbose": True})
                assert r.status_code == 200, (path.name, r.text)
                j = r.json()
                if j["choices"][0]["finish_reason"] == "length":
                    continue  # cut short: not a whole answer
                asked.append(({**body, **kwargs, "enable_thinking": thinking},
                              j["__verbose"]["content"],
                              j["choices"][0]["message"]))
        finally:
            server.stop()
        theirs = read_by_llamacpp(llamacpp_chat, [
            {"template": str(path), **body, "text": text} for body, text, _ in asked])
        counts[path.name] = len(asked)
        for (body, text, message), want in zip(asked, theirs):
            got = muser_reading(message)
            if "error" in want and got == (text.strip(), "", []):
                # Text the tiny model wrote outside any call's markup (no trigger, no grammar)
                # and not in the template's layout: llama.cpp refuses to read it (llama-server
                # answers an error), Muser returns it as the reply. Not compared.
                refused += 1
                continue
            compared += 1
            if "error" in want or reading(want) != got:
                found.setdefault(path.name, (fmt, text, want, got))
    report = "\n".join(f"{n} ({f}): {t!r}\n  llama.cpp: {w}\n  muser: {g}"
                       for n, (f, t, w, g) in sorted(found.items()))
    print(f"{compared} answers compared ({refused} more were text llama.cpp refuses to read):",
          ", ".join(f"{n} {c}" for n, c in counts.items()))
    assert compared > 0
    assert not set(found) - set(KNOWN_DIFFERENCES), report


# Reasoning templates whose crafted outputs (test_calls_in_reasoning_read_as_llama_cpp_reads_them)
# Muser reads otherwise than llama.cpp, with why.
KNOWN_THINKING_DIFFERENCES: dict[str, str] = {}


@pytest.fixture(scope="module")
def muser_chat_read() -> Path:
    """Muser's side: examples/chat_read.rs, the same requests on stdin, Muser's readings."""
    return cargo_example("muser-server", "chat_read")


def crafted_outputs(rng: random.Random, tags: tuple[str, str], call: str) -> list[str]:
    """Outputs of a reasoning model around a call `call` in the template's layout: the call
    written inside a reasoning block left open (with and without the opening tag, which the
    prompt may have written), the block closed before it, whitespace before the opening tag,
    and a block left open without a call."""
    open_, close = tags
    r, a = random_text(rng), random_text(rng)
    ws = lambda: rng.choice(["", " ", "\n", "\n\n"])  # noqa: E731
    lead = rng.choice([" ", "\n", " \n "])
    return [f"{open_}{ws()}{r}{ws()}{call}", f"{r}{ws()}{call}",
            f"{lead}{open_}{r}{close}{ws()}{call}", f"{lead}{open_}{r}{close}{ws()}{a}",
            f"{open_}{r}{close}{ws()}{a}{ws()}{call}", f"{lead}{open_}{r}{ws()}{call}",
            f"{ws()}{open_}{r}"]


@pytest.mark.skipif(not TEMPLATES, reason="llama.cpp's source (MUSER_GGML_SRC) is not here")
def test_calls_in_reasoning_read_as_llama_cpp_reads_them(llamacpp_chat, muser_chat_read,
                                                         tmp_path):
    """Every reasoning template whose format Muser knows: outputs crafted around calls that
    `muser serve` writes in the template's layout (`crafted_outputs`: a call inside a block
    left open, whitespace before the block ...), asked with thinking on, with tools (and a
    third of them without), are read by llama.cpp's parser and by Muser's
    (examples/chat_read.rs, as `muser serve` reads an answer, whole and streamed a character
    at a time) the same way: calls, content and reasoning; and Muser's streaming never takes
    back what it sent. llama.cpp ends a block left open at a call's opening for some formats
    (the Qwen3-Coder family, DeepSeek's DSML, Ling 3, Kimi K2, Cohere2MoE) and keeps the call
    as reasoning in the others; LFM2's, Kimi K2's and Ministral 3's handlers read a block only
    at the output's start, not after whitespace."""
    model = tiny_model(tmp_path)
    seed = int(os.environ.get("MUSER_READING_SEED", "2026"))
    rng = random.Random(seed)
    rounds = int(os.environ.get("MUSER_READING_ROUNDS", "16"))
    only = [w for w in os.environ.get("MUSER_READING_TEMPLATES", "").split(",") if w]
    family = set(reasoning_family_templates())
    found: dict[str, tuple] = {}
    counts: dict[str, int] = {}
    compared = unread = 0
    for path in TEMPLATES:
        if path.name not in family or (only and not any(w in path.name for w in only)):
            continue
        tags = reasoning_tags_of(path.read_text())
        server = ServerProcess("--chat-template-file", str(path), "--ctx-size", "4096",
                               model=model)
        calls = []
        try:
            if requests.get(server.url + "/props", timeout=60).json()["chat_format"] == "generic":
                continue
            for _ in range(rounds):
                body = random_request(rng)
                body["tool_choice"] = rng.choice(["required", "auto"])
                # A call as the template writes it (no reasoning: the grammar forces the calls
                # from the output's start).
                r = requests.post(server.url + "/v1/chat/completions", timeout=120, json={
                    **body, "chat_template_kwargs": {"enable_thinking": False},
                    "reasoning_format": "none", "max_tokens": 320, "temperature": 1.0,
                    "seed": rng.randrange(1 << 30), "verbose": True})
                assert r.status_code == 200, (path.name, r.text)
                j = r.json()
                if j["choices"][0]["finish_reason"] == "length" or \
                        not j["choices"][0]["message"].get("tool_calls"):
                    continue
                call = j["__verbose"]["content"].strip()
                calls.append((body, call, crafted_outputs(rng, tags, call)))
        finally:
            server.stop()
        # Only calls both read alike after a closed block (llama.cpp's readers of some formats
        # are strict about the calls' layout, which is not what this test is about).
        probes = [{"template": str(path), **body, "enable_thinking": True,
                   "text": f"{tags[0]}x{tags[1]}{call}"} for body, call, _ in calls]
        alike = [w.get("tool_calls") and reading(w) == reading(g) for w, g in zip(
            read_by_llamacpp(llamacpp_chat, probes), read_by_llamacpp(muser_chat_read, probes))]
        asked = [{"template": str(path), **body, "enable_thinking": True, "text": t}
                 for (body, _, texts), ok in zip(calls, alike) if ok for t in texts]
        # The same texts without tools: a call's opening ends the block as with them, but for
        # DeepSeek's DSML, and the call is the reply's text.
        asked += [{**a, "tools": [], "tool_choice": "auto"} for a in asked[::3]]
        unread += alike.count(False) + alike.count([])
        theirs = read_by_llamacpp(llamacpp_chat, asked)
        ours = read_by_llamacpp(muser_chat_read, asked)
        counts[path.name] = 0
        for req, want, got in zip(asked, theirs, ours):
            assert "error" not in got, (path.name, req["text"], got)
            assert "stream_error" not in got, (path.name, req["text"], got["stream_error"])
            if "error" in want:
                continue  # llama.cpp refuses to read it
            compared += 1
            counts[path.name] += 1
            if reading(want) != reading(got):
                found.setdefault(path.name, (req["text"], want, got))
    report = "\n".join(f"{n}: {t!r}\n  llama.cpp: {w}\n  muser: {g}"
                       for n, (t, w, g) in sorted(found.items()))
    print(f"{compared} crafted answers compared ({unread} calls not read alike even after a "
          "closed block left out):", ", ".join(f"{n} {c}" for n, c in counts.items()))
    if found:
        print(report)
    assert compared > 0
    assert not set(found) - set(KNOWN_THINKING_DIFFERENCES), report


# A tool whose arguments nest objects and arrays (MiniMax M3 writes them as nested XML, by the
# schema): arrays of objects with arrays in them, a union of an object and null, an object
# left open (JSON), booleans in an array.
NESTED = {"type": "function", "function": {"name": "plan_trip", "parameters": {
    "type": "object", "properties": {
        "stops": {"type": "array", "maxItems": 3, "items": {"type": "object", "properties": {
            "city": {"type": "string", "maxLength": 8},
            "nights": {"type": "integer", "minimum": 0, "maximum": 9},
            "tags": {"type": "array", "maxItems": 2, "items": {"enum": ["sea", "ski", "art"]}}},
            "required": ["city"]}},
        "budget": {"anyOf": [{"type": "object", "properties": {
            "max": {"type": "number"}, "cur": {"enum": ["EUR", "USD"]}}, "required": ["max"]},
            {"type": "null"}]},
        "meta": {"type": "object"},
        "flags": {"type": "array", "maxItems": 3, "items": {"type": "boolean"}},
        "who": {"type": "object", "properties": {
            "name": {"type": "string", "maxLength": 6},
            "age": {"type": "integer", "minimum": 0, "maximum": 99}}}},
    "required": ["stops", "who"]}}}


@pytest.mark.skipif(not TEMPLATES, reason="llama.cpp's source (MUSER_GGML_SRC) is not here")
def test_minimax_m3_nested_values_read_as_llama_cpp_reads_them(llamacpp_chat, tmp_path):
    """MiniMax M3's calls of a tool with nested objects and arrays, forced on the tiny model,
    read as llama.cpp reads them (MUSER_READING_SEED and MUSER_READING_ROUNDS as above)."""
    path = next((p for p in TEMPLATES if p.name == "MiniMax-M3.jinja"), None)
    if path is None:
        pytest.skip("no MiniMax-M3.jinja")
    seed = int(os.environ.get("MUSER_READING_SEED", "2026"))
    rng = random.Random(seed)
    server = ServerProcess("--chat-template-file", str(path), "--ctx-size", "4096",
                           model=tiny_model(tmp_path))
    asked = []
    try:
        for _ in range(int(os.environ.get("MUSER_READING_ROUNDS", "16"))):
            choice = rng.choice(["required", {"type": "function",
                                              "function": {"name": "plan_trip"}}])
            body = {"messages": [{"role": "user", "content": "Plan a trip."}],
                    "tools": [NESTED, PING] if rng.random() < 0.5 else [NESTED],
                    "tool_choice": choice, "parallel_tool_calls": rng.random() < 0.5}
            r = requests.post(server.url + "/v1/chat/completions", timeout=300, json={
                **body, "max_tokens": 1200, "temperature": 1.0,
                "seed": rng.randrange(1 << 30), "verbose": True}).json()
            if r["choices"][0]["finish_reason"] != "length":
                asked.append((body, r["__verbose"]["content"], r["choices"][0]["message"]))
    finally:
        server.stop()
    theirs = read_by_llamacpp(llamacpp_chat, [
        {"template": str(path), **body, "enable_thinking": True, "text": text}
        for body, text, _ in asked])
    nested = 0
    for (body, text, message), want in zip(asked, theirs):
        got = muser_reading(message)
        assert "error" not in want and reading(want) == got, (text, want, got)
        nested += any(isinstance(a, dict) and a.get("stops") for _, a in got[2])
    print(f"{len(asked)} answers compared, {nested} with nested stops")
    assert asked and nested


@pytest.mark.skipif(not TEMPLATES, reason="llama.cpp's source (MUSER_GGML_SRC) is not here")
def test_minimax_m2_calls_read_as_llama_cpp_reads_them(llamacpp_chat, tmp_path):
    """MiniMax M2's template opens a <think> block in every generation prompt, which the tiny
    model never closes, so the test above compares none of its answers. Here the request
    prefills the assistant message with a closed block (llama-server's assistant prefill), the
    grammar forces one call from the reply's start, and llama.cpp reads the reasoning and the
    call as the output after its own prompt. Its reader takes only the template's exact layout
    (each tag on its own line, nothing after the block) and, whatever the layout, one call a
    reply: requests here ask for one."""
    path = next((p for p in TEMPLATES if p.name == "MiniMax-M2.jinja"), None)
    if path is None:
        pytest.skip("no MiniMax-M2.jinja")
    rng = random.Random(int(os.environ.get("MUSER_READING_SEED", "2026")))
    server = ServerProcess("--chat-template-file", str(path), "--ctx-size", "4096",
                           model=tiny_model(tmp_path))
    asked = []
    try:
        for _ in range(int(os.environ.get("MUSER_READING_ROUNDS", "16"))):
            body = {**random_request(rng), "parallel_tool_calls": False}
            if body["tool_choice"] == "auto":
                body["tool_choice"] = "required"
            reason = random_text(rng)
            prefill = {"role": "assistant", "content": f"<think>\n{reason}\n</think>\n\n"}
            r = requests.post(server.url + "/v1/chat/completions", timeout=300, json={
                **body, "messages": body["messages"] + [prefill], "max_tokens": 600,
                "temperature": 1.0, "seed": rng.randrange(1 << 30), "verbose": True}).json()
            if r["choices"][0]["finish_reason"] != "length":
                asked.append((body, reason, r["__verbose"]["content"], r["choices"][0]["message"]))
    finally:
        server.stop()
    theirs = read_by_llamacpp(llamacpp_chat, [
        {"template": str(path), **body, "enable_thinking": True,
         "text": f"{reason}\n</think>\n\n{text}"} for body, reason, text, _ in asked])
    for (body, reason, text, message), want in zip(asked, theirs):
        content, _, calls = muser_reading(message)
        assert "error" not in want and reading(want) == (content, reason.strip(), calls), \
            (text, want, message)
    print(f"{len(asked)} answers compared")
    assert asked


# MiniMax M2's generation prompt always opens a reasoning block: llama.cpp is given its outputs
# after a closed one (`OPENS_BLOCK`), whose reasoning it must read as well.
OPENS_BLOCK = {"MiniMax-M2.jinja": ("ok", "\n</think>\n\n")}


@pytest.mark.skipif(not TEMPLATES, reason="llama.cpp's source (MUSER_GGML_SRC) is not here")
def test_xml_random_outputs_read_as_llama_cpp_reads_them(llamacpp_chat, tmp_path):
    """Random outputs of the XML call formats (Seed-OSS, MiniMax M2, GLM 4.6 and 4.7, DSML,
    MiniCPM5, Ling 3, Hy3: text before the calls, values of every JSON type, strings with markup-like and non-ASCII text),
    with Muser's final reading of each, are read by llama.cpp's parser into the same content
    and calls. Each output is written in the layout and parameter order Muser's grammar
    writes (required parameters first: llama.cpp refuses an optional one before them), and
    llama.cpp must read every one. (Formerly `xml_calls_oracle.py`, which had llama-server
    continue each output.)"""
    dump = tmp_path / "xml.jsonl"
    subprocess.run(["cargo", "test", "-q", "-p", "muser-server", "--lib",
                    "dump_outputs_for_the_llama_server_comparison"], cwd=REPO, check=True,
                   capture_output=True,
                   env={**os.environ, "MUSER_XML_DUMP": str(dump),
                        "MUSER_XML_DUMP_N": os.environ.get("MUSER_READING_ROUNDS", "40"),
                        "MUSER_XML_DUMP_SEED": os.environ.get("MUSER_READING_SEED", "7")})
    cases = [json.loads(line) for line in dump.read_text().splitlines()]
    by_name = {p.name: p for p in TEMPLATES}
    cases = [c for c in cases if c["template"] in by_name]
    theirs = read_by_llamacpp(llamacpp_chat, [
        {"template": str(by_name[c["template"]]),
         "messages": [{"role": "user", "content": "hi"}], "tools": c["tools"],
         "tool_choice": "required", "parallel_tool_calls": True, "enable_thinking": False,
         "text": "".join(OPENS_BLOCK.get(c["template"], ())) + c["text"]} for c in cases])
    tally: dict[str, dict[str, int]] = {}
    differ = []
    for c, want in zip(cases, theirs):
        t = tally.setdefault(c["template"], {"same": 0, "refused": 0, "differ": 0})
        if "error" in want:
            t["refused"] += 1
            continue
        got = (c["content"].strip(), OPENS_BLOCK.get(c["template"], ("",))[0],
               [(x["name"], json_or_text(x["arguments"])) for x in c["calls"]])
        if reading(want) == got:
            t["same"] += 1
        else:
            t["differ"] += 1
            differ.append((c["text"], want, got))
    print(tally)
    for d in differ[:6]:
        print(repr(d[0]), "\n  llama:", d[1], "\n  muser:", d[2])
    assert not differ, differ[:4]
    assert all(t["refused"] == 0 and t["same"] > 0 for t in tally.values()), tally


# The JSON-argument formats' random outputs (test_json_random_outputs_read_as_llama_cpp_reads_them):
# tools with nested objects and arrays, one without parameters, a name with '.' and '-'.
JSON_TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "The weather in a city",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string"}, "days": {"type": "integer"},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            "detail": {"type": "object", "properties": {
                "hourly": {"type": "boolean"},
                "tags": {"type": "array", "items": {"type": "string"}}}}},
            "required": ["city"]}}},
    {"type": "function", "function": {"name": "ping", "description": "Pings",
                                      "parameters": {"type": "object", "properties": {}}}},
    {"type": "function", "function": {
        "name": "search.web-2", "description": "Searches",
        "parameters": {"type": "object", "properties": {"q": {"type": "string"}},
                       "required": ["q"]}}},
]


def json_args(rng: random.Random, name: str) -> dict:
    """Random arguments of a JSON_TOOLS tool, valid by its schema."""
    if name == "ping":
        return {}
    if name == "search.web-2":
        return {"q": random_text(rng)}
    a = {"city": random_text(rng)}
    if rng.random() < 0.5:
        a["days"] = rng.randrange(-50, 50)
    if rng.random() < 0.5:
        a["unit"] = rng.choice(["celsius", "fahrenheit"])
    if rng.random() < 0.5:
        a["detail"] = {"hourly": rng.random() < 0.5,
                       "tags": [random_text(rng) for _ in range(rng.randrange(3))]}
    if rng.random() < 0.3:
        a["extra"] = json_value(rng)
    return a


def json_value(rng: random.Random, depth: int = 0):
    """A random JSON value of any type (numbers with fractions and exponents, integers of up
    to 64 bits: Muser reads larger ones as serde_json does, as the nearest double, where
    llama.cpp passes their text through)."""
    r = rng.random() * (0.7 if depth > 2 else 1)
    if r < 0.2:
        return random_text(rng)
    if r < 0.3:
        return rng.choice([None, True, False])
    if r < 0.4:
        return rng.randrange(-min(10**rng.randrange(1, 20), 2**63), 10**rng.randrange(1, 20))
    if r < 0.55:
        return rng.choice([-1, 1]) * rng.random() * 10**rng.randrange(-8, 12)
    if r < 0.7:
        return [json_value(rng, depth + 1) for _ in range(rng.randrange(4))]
    return {random_text(rng): json_value(rng, depth + 1) for _ in range(rng.randrange(4))}


def json_layout(rng: random.Random, v) -> str:
    """`v` as JSON in a random layout: spaced or compact, indented, non-ASCII escaped or not."""
    return rng.choice([
        lambda: json.dumps(v), lambda: json.dumps(v, ensure_ascii=False),
        lambda: json.dumps(v, separators=(",", ":")), lambda: json.dumps(v, indent=2)])()


def kimi_k2_output(rng: random.Random, calls: list, text: str) -> str:
    """Kimi K2's section of calls, the section's and calls' ends left out at times (llama.cpp's
    grammar lets the model leave them out), the calls' numbers in order or not."""
    body = "".join(
        f"<|tool_call_begin|>functions.{n}:{rng.choice([i, rng.randrange(100)])}"
        f"<|tool_call_argument_begin|>{json_layout(rng, a)}"
        + ("<|tool_call_end|>" if rng.random() < 0.85 else "") for i, (n, a) in enumerate(calls))
    begin = "<|tool_calls_section_begin|>" if rng.random() < 0.8 else ""
    end = "<|tool_calls_section_end|>" if rng.random() < 0.8 else ""
    return text + begin + body + end


def nemotron_v2_output(rng: random.Random, calls: list, text: str) -> str:
    items = ", ".join(json_layout(rng, {"name": n, "arguments": a}) for n, a in calls)
    return f"{text}<TOOLCALL>[{items}]</TOOLCALL>"


def hermes_output(rng: random.Random, calls: list, text: str) -> str:
    return text + "\n".join(
        f"<tool_call>\n{json_layout(rng, {'name': n, 'arguments': a})}\n</tool_call>"
        for n, a in calls)


def listed_output(open_: str, close: str, name: str = "name", args: str = "arguments",
                  sep: str = ", ", ids: bool = False):
    """Outputs of a format that writes its calls as a list of objects between `open_` and
    `close` (`sep` between them, `name` and `args` their keys, then an `id` of 9 letters and
    digits where `ids`)."""
    def item(rng: random.Random, n: str, a: dict) -> str:
        o = {name: n, args: a}
        if ids:
            o["id"] = "".join(rng.choices(string.ascii_letters + string.digits, k=9))
        return json_layout(rng, o)

    def output(rng: random.Random, calls: list, text: str) -> str:
        return text + open_ + sep.join(item(rng, n, a) for n, a in calls) + close
    return output


def each_output(call, between: str = "", block: tuple[str, str] = ("", "")):
    """Outputs of a format that writes each call alone (`call(name, arguments as JSON)`),
    `between` them, the calls between `block`'s tags."""
    def output(rng: random.Random, calls: list, text: str) -> str:
        items = between.join(call(n, json_layout(rng, a)) for n, a in calls)
        return f"{text}{block[0]}{items}{block[1]}"
    return output


def cohere_output(start: str, end: str):
    """Command R7B's and Cohere2MoE's outputs: a reply between the template's reply marks, or
    an action's list of calls."""
    def output(rng: random.Random, calls: list, text: str) -> str:
        if rng.random() < 0.3:
            return start + random_text(rng) + end
        items = ",\n    ".join(
            json_layout(rng, {"tool_call_id": str(i), "tool_name": n, "parameters": a})
            for i, (n, a) in enumerate(calls))
        return f"<|START_ACTION|>[\n    {items}\n]<|END_ACTION|>"
    return output


# Gemma 4's random outputs: its own notation (<|"|> strings, bare keys), keys and values that
# no schema asks for, thought channels before and between the replies.
GEMMA4_TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}}}},
    {"type": "function", "function": {"name": "add", "parameters": {
        "type": "object", "properties": {"a": {"type": "number"}}}}},
    {"type": "function", "function": {"name": "ping"}},
    {"type": "function", "function": {"name": "f.x-y_2"}},
]


class Gemma4Writer:
    """Random texts in Gemma 4's notation (as the fixture tools/testdata/gemma4-llama-cpp.json's
    `cases` were written)."""
    Q = '<|"|>'

    def __init__(self, rng: random.Random):
        self.rng = rng

    def ws(self) -> str:
        return self.rng.choice(["", "", "", " ", "\n", "  ", " \n\t"])

    def piece(self) -> str:
        return "".join(self.rng.choice(
            ["a", "Q", " ", "\n", "\u00e9", "\U0001F600", '"', "\\", "{", "}", ":", ",", "[", "<",
             "|", ">", "x y", "0", "'", "\t"]) for _ in range(self.rng.randrange(0, 10)))

    def key(self) -> str:
        k = "".join(self.rng.choice('abcXYZ_09 -."\\\u00e9{,[')
                    for _ in range(self.rng.randrange(1, 8)))
        return k.lstrip(" ") or "k"

    def number(self) -> str:
        rng = self.rng
        s = rng.choice(["", "-"]) + rng.choice(
            ["0", str(rng.randrange(1, 10**rng.randrange(1, 8)))])
        if rng.random() < 0.3:
            s += "." + str(rng.randrange(0, 1000)).zfill(rng.randrange(1, 4))
        if rng.random() < 0.15:
            s += rng.choice("eE") + rng.choice(["", "+", "-"]) + str(rng.randrange(0, 30))
        return s

    def value(self, depth: int = 0) -> str:
        r = self.rng.random() * (0.6 if depth > 3 else 1)
        if r < 0.3:
            return self.Q + self.piece() + self.Q
        if r < 0.42:
            return self.number()
        if r < 0.5:
            return self.rng.choice(["true", "false", "null"])
        if r < 0.6:
            return self.object(depth + 1)
        if self.rng.random() < 0.2:
            return "[" + self.ws() + "]"
        items = ("," + self.ws()).join(self.value(depth + 1)
                                       for _ in range(self.rng.randrange(1, 4)))
        return "[" + self.ws() + items + self.ws() + "]"

    def object(self, depth: int = 0) -> str:
        if self.rng.random() < 0.2:
            return "{" + self.ws() + "}"
        members = ("," + self.ws()).join(self.key() + ":" + self.ws() + self.value(depth)
                                         for _ in range(self.rng.randrange(1, 4)))
        return "{" + self.ws() + members + self.ws() + "}"

    def call(self) -> str:
        name = self.rng.choice(GEMMA4_TOOLS)["function"]["name"]
        return f"<|tool_call>call:{name}{self.object()}<tool_call|>"

    def thought(self) -> str:
        return "<|channel>thought" + self.ws() + self.piece() + "<channel|>"

    def output(self) -> str:
        rng, parts = self.rng, []
        if rng.random() < 0.5:
            parts.append(self.ws() + self.thought() + self.ws())
        if rng.random() < 0.7:
            parts.append(self.piece().strip() or "Sure")
        if rng.random() < 0.2:
            parts.append(self.thought())
        if rng.random() < 0.3:
            parts.append(self.piece().strip() or "ok")
        parts += [self.call() for _ in range(rng.choice([0, 1, 1, 1, 2, 3]))]
        return "".join(parts)


def gemma4_unfinished_tail(text: str) -> str:
    """The end of a Gemma 4 output cut inside a marker, or inside a call's opening before its
    arguments open."""
    i = text.rfind("<|tool_call>")
    if i >= 0 and "{" not in text[i:]:
        return text[i:]
    return max((m[:k] for m in ("<|tool_call>", "<|channel>", "<channel|>")
                for k in range(1, len(m)) if text.endswith(m[:k])), key=len, default="")


# Where llama.cpp's reading of these random outputs is plainly wrong, by template: why, and
# the end of the text that Muser's content keeps and llama.cpp's drops (the readings are
# compared without it).
KNOWN_JSON_DIFFERENCES = {
    name: ("llama.cpp's reading of a finished output drops its end where it is cut inside a "
           "marker or a call's opening (as if more could follow); Muser keeps it in the "
           "content: what does not follow the format is content", gemma4_unfinished_tail)
    for name in ("google-gemma-4-31B-it.jinja", "google-gemma-4-31B-it-interleaved.jinja")}


GEMMA4_TEMPLATES = ("google-gemma-4-31B-it.jinja", "google-gemma-4-31B-it-interleaved.jinja")
DEEPSEEK_CALLS = ("<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>")
# The templates of the JSON-argument formats with a writer of random outputs (calls and the
# text before them) each; Gemma 4's outputs are written whole by Gemma4Writer.
JSON_WRITERS = {
    "Kimi-K2-Instruct.jinja": kimi_k2_output,
    "Kimi-K2-Thinking.jinja": kimi_k2_output,
    "moonshotai-Kimi-K2.jinja": kimi_k2_output,
    "NVIDIA-Nemotron-Nano-v2.jinja": nemotron_v2_output,
    "CohereForAI-c4ai-command-r7b-12-2024-tool_use.jinja":
        cohere_output("<|START_RESPONSE|>", "<|END_RESPONSE|>"),
    "Cohere2MoE.jinja": cohere_output("<|START_TEXT|>", "<|END_TEXT|>"),
    "Qwen-Qwen2.5-7B-Instruct.jinja": hermes_output,
    "Qwen-Qwen3-0.6B.jinja": hermes_output,
    "NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use.jinja": hermes_output,
    "NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja": hermes_output,
    "ibm-granite-granite-4.0.jinja": hermes_output,
    "ibm-granite-granite-4.1.jinja": hermes_output,
    "mistralai-Mistral-Nemo-Instruct-2407.jinja": listed_output("[TOOL_CALLS][", "]", ids=True),
    "Mistral-Small-3.2-24B-Instruct-2506.jinja":
        each_output(lambda n, a: f"[TOOL_CALLS]{n}[CALL_ID]abcDEF123[ARGS]{a}"),
    "unsloth-mistral-Devstral-Small-2507.jinja":
        each_output(lambda n, a: f"[TOOL_CALLS]{n}[ARGS]{a}"),
    "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja": each_output(
        lambda n, a: f"<｜tool▁call▁begin｜>function<｜tool▁sep｜>{n}\n```json\n{a}\n```"
                     "<｜tool▁call▁end｜>", "\n", DEEPSEEK_CALLS),
    "deepseek-ai-DeepSeek-V3.1.jinja": each_output(
        lambda n, a: f"<｜tool▁call▁begin｜>{n}<｜tool▁sep｜>{a}<｜tool▁call▁end｜>", "",
        DEEPSEEK_CALLS),
    "meta-llama-Llama-3.1-8B-Instruct.jinja": listed_output("", "", args="parameters"),
    "meta-llama-Llama-3.2-3B-Instruct.jinja": listed_output("", "", args="parameters"),
    "meta-llama-Llama-3.3-70B-Instruct.jinja": listed_output("", "", args="parameters"),
    "unsloth-Apriel-1.5.jinja": listed_output("<tool_calls>[", "]</tool_calls>"),
    "Apriel-1.6-15b-Thinker-fixed.jinja": listed_output("<tool_calls>[", "]</tool_calls>"),
    "fireworks-ai-llama-3-firefunction-v2.jinja": listed_output(" functools[", "]"),
    "MiniMax-M1.jinja": listed_output("<tool_calls>\n", "\n</tool_calls>", sep=",\n"),
    "GigaChat3-10B-A1.8B.jinja":
        listed_output("<|message_sep|>\n\nfunction call<|role_sep|>\n", ""),
    "GigaChat3.1-10B-A1.8B.jinja": listed_output("<|function_call|>", ""),
    "meetkai-functionary-medium-v3.1.jinja":
        each_output(lambda n, a: f"<function={n}>{a}</function>"),
}
# Templates always asked with thinking on (their outputs start after the generation prompt's
# opening of a reasoning block, if any); the other reasoning templates half the time, with a
# reasoning block then (`json_random_requests`), the rest with thinking off.
THINKING_ON = {"Kimi-K2-Instruct.jinja", "Kimi-K2-Thinking.jinja", "moonshotai-Kimi-K2.jinja",
               *GEMMA4_TEMPLATES}
# Templates whose replies hold one call at most.
ONE_CALL = {"meta-llama-Llama-3.1-8B-Instruct.jinja", "meta-llama-Llama-3.2-3B-Instruct.jinja",
            "meta-llama-Llama-3.3-70B-Instruct.jinja", "GigaChat3-10B-A1.8B.jinja",
            "GigaChat3.1-10B-A1.8B.jinja"}


def json_random_requests(rng: random.Random, path: Path, rounds: int) -> list[dict]:
    """`rounds` chat requests of the template with a random output each to read. A reasoning
    template's are asked with thinking on half the time, the output then starting with a
    closed reasoning block (its opening tag written or left to the prompt)."""
    tags = reasoning_tags_of(path.read_text()) if path.name in reasoning_family_templates() \
        else None
    out = []
    for _ in range(rounds):
        thinking = path.name in THINKING_ON
        if path.name in GEMMA4_TEMPLATES:
            tools, text = GEMMA4_TOOLS, Gemma4Writer(rng).output()
            calls = [None] * text.count("<|tool_call>")
        else:
            tools = JSON_TOOLS
            most = 1 if path.name in ONE_CALL else 3
            calls = [t["function"]["name"]
                     for t in rng.choices(tools, k=rng.randrange(1, most + 1))]
            before = rng.choice(["", "", "Sure. ", random_text(rng) + "\n"])
            text = JSON_WRITERS[path.name](rng, [(n, json_args(rng, n)) for n in calls], before)
            if tags and rng.random() < 0.5:
                thinking = True
                text = (rng.choice(["", tags[0]]) + random_text(rng) + tags[1]
                        + rng.choice(["", "\n", "\n\n"]) + text)
        # parallel calls asked for where there are several (llama.cpp's readers take one
        # call without, or refuse more), and at random where there is one; calls required at
        # times (Gemma 4's outputs, mostly text or unfinished calls, under auto)
        parallel = path.name not in ONE_CALL and (len(calls) > 1 or rng.random() < 0.5)
        required = path.name not in GEMMA4_TEMPLATES and rng.random() < 0.3
        out.append({"template": str(path), "messages": [{"role": "user", "content": "hi"}],
                    "tools": tools, "tool_choice": "required" if required else "auto",
                    "parallel_tool_calls": parallel, "enable_thinking": thinking,
                    "text": text})
    return out


@pytest.mark.skipif(not TEMPLATES, reason="llama.cpp's source (MUSER_GGML_SRC) is not here")
def test_json_random_outputs_read_as_llama_cpp_reads_them(llamacpp_chat, muser_chat_read):
    """Random outputs of the JSON-argument call formats (JSON_WRITERS: Kimi K2, Nemotron Nano
    v2, Command R7B, Cohere2MoE, Hermes, Mistral Nemo and Small 3.2, Devstral, DeepSeek R1
    and V3.1, Llama 3.x, Apriel, FireFunction v2, MiniMax M1, GigaChat 3 and 3.1, Functionary
    v3.1: text before the calls, the calls' JSON in random layouts, with the leniencies
    llama.cpp's grammars allow) and of Gemma 4's notation (thought channels, strings in
    <|"|>, keys no schema names) are read by llama.cpp's parser and by Muser's
    (examples/chat_read.rs, whole and streamed) into the same calls, content and reasoning.
    Outputs llama.cpp refuses to read are not compared; KNOWN_JSON_DIFFERENCES says where
    llama.cpp's reading is wrong. MUSER_READING_ROUNDS outputs a template (MUSER_READING_SEED,
    MUSER_READING_TEMPLATES as above). (Formerly scripts/llama_call_readings.py, which had
    llama-server continue each output, and scripts/gemma4_oracle, which recorded llama.cpp's
    readings in the fixture tools/testdata/gemma4-llama-cpp.json.)"""
    rng = random.Random(int(os.environ.get("MUSER_READING_SEED", "2026")))
    rounds = int(os.environ.get("MUSER_READING_ROUNDS", "40"))
    by_name = {p.name: p for p in TEMPLATES}
    only = [w for w in os.environ.get("MUSER_READING_TEMPLATES", "").split(",") if w]
    asked = [r for name in [*JSON_WRITERS, *GEMMA4_TEMPLATES]
             if name in by_name and not (only and not any(w in name for w in only))
             for r in json_random_requests(rng, by_name[name], rounds)]
    theirs = read_by_llamacpp(llamacpp_chat, asked)
    ours = read_by_llamacpp(muser_chat_read, asked)
    tally: dict[str, dict[str, int]] = {}
    differ = []
    for req, want, got in zip(asked, theirs, ours):
        name = Path(req["template"]).name
        t = tally.setdefault(name, {"same": 0, "refused": 0, "differ": 0, "known": 0})
        assert "error" not in got and "stream_error" not in got, (req["text"], got)
        tail = KNOWN_JSON_DIFFERENCES[name][1](req["text"]) if name in KNOWN_JSON_DIFFERENCES \
            else ""
        if "error" in want:
            t["refused"] += 1
        elif reading(want) == reading(got):
            t["same"] += 1
        elif tail and reading(want) == reading(
                {**got, "content": got["content"].removesuffix(tail)}):
            t["known"] += 1
        else:
            t["differ"] += 1
            differ.append((name, req["text"], want, got))
    for name, t in tally.items():
        print(f"{name}: {t}")
    for d in differ[:8]:
        print(d[0], repr(d[1]), "\n  llama:", d[2], "\n  muser:", d[3])
    assert not differ, differ[:4]
    assert tally and all(t["same"] > 0 for t in tally.values()), tally
