"""`muser serve` beside llama.cpp's `llama-server` on one file: the same requests to both, and
every field of llama-server's answer must be in Muser's too, with a JSON type that agrees (null
agrees with any type), except the differences listed in DIFFERENCES, each with its reason. A
stream is compared as the union of its chunks' fields, and both must end with `[DONE]`. The
server's properties (`/props`) and slots (`/slots`) must also agree in value where both servers
describe the same thing.

The file is `muser synth llama-tiny` (a llama both engines run). Skipped unless $LLAMA_CPP_BIN
holds llama-server (scripts/test.sh builds it on the side from the comparator's source).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
from pathlib import Path

import pytest
import requests

from test_server import ServerProcess, muser_bin

LLAMA_BIN = os.environ.get("LLAMA_CPP_BIN")
LLAMA_SERVER = Path(LLAMA_BIN, "llama-server") if LLAMA_BIN else None
pytestmark = pytest.mark.skipif(not (LLAMA_SERVER and LLAMA_SERVER.exists()),
                                reason="set LLAMA_CPP_BIN to a folder with llama.cpp's llama-server")

MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello there"}]
# llama.cpp's samplers beyond OpenAI's, with a seed.
TRUNCATIONS = {"temperature": 0.9, "seed": 7, "typical_p": 0.8, "top_n_sigma": 1.5,
               "xtc_probability": 0.5, "xtc_threshold": 0.1, "min_keep": 2,
               "dynatemp_range": 0.3, "dynatemp_exponent": 1.5}
DRY = {"temperature": 0.9, "seed": 7, "dry_multiplier": 0.8, "dry_base": 1.5,
       "dry_allowed_length": 1, "dry_penalty_last_n": 32, "dry_sequence_breakers": ["\n", "."]}
MIROSTAT = {"temperature": 0.9, "seed": 7, "mirostat": 2, "mirostat_tau": 4.0,
            "mirostat_eta": 0.2}
REQUESTS = {
    "completion": ("/v1/completions", {"prompt": "Once upon a time", "max_tokens": 5,
                                       "temperature": 0}),
    "completion stream": ("/v1/completions", {"prompt": "Once upon a time", "max_tokens": 4,
                                              "temperature": 0, "stream": True,
                                              "stream_options": {"include_usage": True}}),
    "chat": ("/v1/chat/completions", {"messages": MESSAGES, "max_tokens": 5, "temperature": 0}),
    "chat stream": ("/v1/chat/completions", {"messages": MESSAGES, "max_tokens": 4,
                                             "temperature": 0, "stream": True,
                                             "stream_options": {"include_usage": True}}),
    "chat logprobs": ("/v1/chat/completions", {"messages": MESSAGES, "max_tokens": 3,
                                               "temperature": 0, "logprobs": True,
                                               "top_logprobs": 2}),
    "sampled chat": ("/v1/chat/completions", {"messages": MESSAGES, "max_tokens": 4,
                                              "temperature": 0.9, "top_p": 0.9, "top_k": 20,
                                              "min_p": 0.05, "seed": 7, "stop": ["\n\n"]}),
    "models": ("/v1/models", None),
    "health": ("/health", None),
    "tokenize": ("/tokenize", {"content": "hello \U0001F600", "with_pieces": True}),
    "detokenize": ("/detokenize", {"tokens": [5, 6, 7]}),
    "apply-template": ("/apply-template", {"messages": MESSAGES}),
    "bad request": ("/v1/completions", {"prompt": "x", "max_tokens": "ten"}),
    # The server's properties and slots (idle; each server has run a request in one slot: the
    # fixture's, so the slot shows that request's params and next_token).
    "props": ("/props", None),
    "post props": ("/props", {}),
    "slots": ("/slots", None),
    # llama-server's own endpoint.
    "native completion": ("/completion", {"prompt": "Once upon a time", "n_predict": 4,
                                          "temperature": 0, "n_probs": 2,
                                          "return_tokens": True}),
    "native completion stream": ("/completion", {"prompt": "Once upon a time", "n_predict": 3,
                                                 "temperature": 0, "stream": True}),
    "native completion stop": ("/completion", {"prompt": "Once upon a time", "n_predict": 8,
                                               "temperature": 0, "stop": ["ry"],
                                               "logit_bias": [[5, False]]}),
    # llama.cpp's other samplers, on both endpoints.
    "native completion samplers": ("/completion", {"prompt": "Once upon a time", "n_predict": 4,
                                                   **TRUNCATIONS}),
    "chat mirostat": ("/v1/chat/completions", {"messages": MESSAGES, "max_tokens": 4,
                                               **MIROSTAT}),
    "native completion dry": ("/completion", {"prompt": "Once upon a time", "n_predict": 4,
                                              **DRY}),
    "chat dry": ("/v1/chat/completions", {"messages": MESSAGES, "max_tokens": 4, **DRY}),
    "bad dry": ("/completion", {"prompt": "x", "n_predict": 2,
                                "dry_sequence_breakers": []}),
    # Constrained decoding: a GBNF grammar, a JSON schema, and a grammar that does not parse.
    "native completion grammar": ("/completion", {"prompt": "Once upon a time", "n_predict": 8,
                                                  "temperature": 0,
                                                  "grammar": 'root ::= [a-z ]{1,12} "."'}),
    "chat json_schema": ("/v1/chat/completions", {
        "messages": MESSAGES, "max_tokens": 40, "temperature": 0,
        "response_format": {"type": "json_schema", "json_schema": {
            "name": "n", "schema": {"type": "object", "properties": {"n": {"type": "integer"}},
                                   "required": ["n"], "additionalProperties": False}}}}),
    "bad grammar": ("/completion", {"prompt": "x", "n_predict": 2, "grammar": 'root ::= "a'}),
}

# The settings of llama-server's samplers and features that Muser does not have (a request that
# turns one on gets a 400 naming it): /completion's `generation_settings` does not list them.
NOT_IMPLEMENTED = ["adaptive_decay", "adaptive_target", "backend_sampling", "chat_format",
                   "generation_prompt", "lora", "n_discard", "n_keep", "post_sampling_probs",
                   "reasoning_format", "reasoning_in_content", "samplers*",
                   "speculative.types", "timings_per_token"]
# Of those, the ones llama-server leaves out of the settings it shows in /props and /slots.
NOT_IN_SUMMARY = ["grammar", "grammar_lazy", "grammar_triggers", "preserved_tokens"]

# The HTTP status both servers answer with, where it is not 200.
STATUS = {"bad request": 400, "post props": 501, "bad dry": 400, "bad grammar": 400}

# (request, field path, what differs, why). A path ending in "*" covers the fields below it.
DIFFERENCES = [
    ("models", ".models*", "missing",
     "llama-server's second model list, in Ollama's format; Muser answers the OpenAI list"),
    ("models", ".data[].meta.vocab_type", "missing", "llama.cpp's internal vocabulary enum"),
    ("models", ".data[].meta.ftype", "missing", "llama.cpp's name for the file type"),
    ("bad request", ".error.code", "type",
     "llama-server puts the HTTP status there; OpenAI's errors (and Muser's) a string or null"),
    ("bad dry", ".error.code", "type",
     "llama-server puts the HTTP status there; OpenAI's errors (and Muser's) a string or null"),
    ("bad grammar", ".error.code", "type",
     "llama-server puts the HTTP status there; OpenAI's errors (and Muser's) a string or null"),
    ("post props", ".error.code", "type",
     "llama-server puts the HTTP status there; OpenAI's errors (and Muser's) a string or null"),
    ("props", ".model_ftype", "missing", "llama.cpp's name for the file type"),
    ("props", ".media_marker", "missing",
     "the placeholder of an image or audio clip in a multimodal prompt; Muser takes text only"),
    ("props", ".chat_template_caps*", "missing",
     "llama.cpp's probe of what the template supports (tools, system role, typed content, ...), "
     "found by rendering test conversations with it; Muser probes only whether a template reads "
     "tool-call arguments as an object"),
] + [(name, ".generation_settings." + field, "missing", "a sampler Muser does not have")
     for name in ["native completion", "native completion stream", "native completion stop",
                  "native completion samplers", "native completion dry",
                  "native completion grammar"]
     for field in NOT_IMPLEMENTED] + [
    (name, prefix + field, "missing", "a sampler Muser does not have")
    for name, prefix in [("props", ".default_generation_settings.params."),
                         ("slots", "[].params.")]
    for field in NOT_IMPLEMENTED if field not in NOT_IN_SUMMARY]


def allowed(name: str, path: str, kind: str) -> bool:
    for n, p, k, _ in DIFFERENCES:
        if n == name and k == kind and (path == p or (p.endswith("*") and path.startswith(p[:-1]))):
            return True
    return False


def shape(x, path: str = "", out: dict | None = None) -> dict[str, str]:
    """Each field's path (".a.b", "[]" for list items) and JSON type."""
    out = {} if out is None else out
    if isinstance(x, dict):
        for k, v in x.items():
            shape(v, f"{path}.{k}", out)
    elif isinstance(x, list):
        out[path] = "array"
        for v in x:
            shape(v, path + "[]", out)
    else:
        kind = {bool: "boolean", int: "number", float: "number", str: "string"}
        out.setdefault(path, "null" if x is None else kind[type(x)])
    return out


def ask(url: str, path: str, body) -> tuple[int, dict[str, str]]:
    if body is None:
        r = requests.get(url + path, timeout=60)
        return r.status_code, shape(r.json())
    if not body.get("stream"):
        r = requests.post(url + path, json=body, timeout=60)
        return r.status_code, shape(r.json())
    r = requests.post(url + path, json=body, timeout=60, stream=True)
    events = [line[6:] for line in r.iter_lines(decode_unicode=True) if line.startswith("data: ")]
    if path == "/completion":
        # llama-server's own stream ends with an event whose `stop` is true, no [DONE].
        assert events and json.loads(events[-1])["stop"] is True, (path, events[-3:])
        events.append("[DONE]")
    assert events and events[-1] == "[DONE]", (path, events[-3:])
    fields: dict[str, str] = {}
    for e in events[:-1]:
        for k, v in shape(json.loads(e)).items():
            # A field that is null in one chunk and set in another has the set type.
            if fields.get(k, "null") == "null":
                fields[k] = v
    return r.status_code, fields


class LlamaServer:
    """llama-server on `model` and `port`, with `args` after its own (a chat template, ...)."""

    def __init__(self, model: Path, port: int, *args: str):
        self.url = f"http://127.0.0.1:{port}"
        self.proc = subprocess.Popen(
            [str(LLAMA_SERVER), "-m", str(model), "-np", "2", "-c", "2048", "-t", "2",
             "--port", str(port), "--no-webui", *args],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 120
        while True:
            try:
                if requests.get(self.url + "/health", timeout=5).status_code == 200:
                    return
            except requests.ConnectionError:
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError("llama-server did not become ready")
            time.sleep(0.1)

    def stop(self):
        self.proc.terminate()
        self.proc.wait(timeout=30)


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    model = tmp_path_factory.mktemp("compat") / "llama-tiny.gguf"
    subprocess.run([str(muser_bin()), "synth", "llama-tiny", str(model)], check=True,
                   capture_output=True)
    muser = ServerProcess("--parallel", "2", "--ctx-size", "1024", model=model)
    try:
        with socket.socket() as sock:  # a free port, released for llama-server to take
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        llama = LlamaServer(model, port)
    except Exception:
        muser.stop()
        raise
    # One request each, so that /slots shows a slot that has run one whatever the tests' order.
    for s in (muser, llama):
        r = requests.post(s.url + "/completion", json={"prompt": "Hi", "n_predict": 2}, timeout=60)
        assert r.status_code == 200, r.text
    yield muser, llama
    muser.stop()
    llama.stop()


@pytest.mark.parametrize("name", list(REQUESTS))
def test_muser_answers_with_llama_servers_fields(servers, name):
    muser, llama = servers
    path, body = REQUESTS[name]
    want_status, want = ask(llama.url, path, body)
    got_status, got = ask(muser.url, path, body)
    assert got_status == want_status == STATUS.get(name, 200), (got_status, want_status)
    missing = [p for p in want if p not in got and not allowed(name, p, "missing")]
    assert not missing, f"{name}: llama-server's fields that Muser lacks: {missing}"
    clash = [(p, want[p], got[p]) for p in want if p in got and "null" not in (want[p], got[p])
             and want[p] != got[p] and not allowed(name, p, "type")]
    assert not clash, f"{name}: fields whose JSON types differ: {clash}"


def test_every_listed_difference_is_still_one(servers):
    """A difference that no longer shows is taken off the list, so the list stays true."""
    muser, llama = servers
    for name, path, kind, _ in DIFFERENCES:
        p, body = REQUESTS[name]
        _, want = ask(llama.url, p, body)
        _, got = ask(muser.url, p, body)
        prefix = path[:-1] if path.endswith("*") else None
        hits = [q for q in want if (q.startswith(prefix) if prefix else q == path)]
        assert hits, (name, path, "llama-server no longer has it")
        if kind == "missing":
            assert any(q not in got for q in hits), (name, path, "Muser has it now")
        else:
            assert any(q in got and got[q] != want[q] for q in hits), (name, path)


def test_props_and_slots_agree_with_llama_servers_values(servers):
    """Both servers run 2 slots of 1,024 tokens of one file with the same defaults: /props and
    /slots say the same of them (the templates differ: the file has none, and each server has
    its own fallback)."""
    muser, llama = servers
    got, want = (requests.get(s.url + "/props", timeout=60).json() for s in (muser, llama))
    for key in ["total_slots", "model_path", "modalities", "bos_token", "eos_token",
                "endpoint_slots", "endpoint_props", "is_sleeping"]:
        assert got[key] == want[key], key
    g, w = got["default_generation_settings"], want["default_generation_settings"]
    assert g["n_ctx"] == w["n_ctx"] == 1024
    common = [k for k in w["params"] if k in g["params"]]
    assert len(common) >= 12, common
    assert {k: g["params"][k] for k in common} == {k: w["params"][k] for k in common}
    got, want = (requests.get(s.url + "/slots", timeout=60).json() for s in (muser, llama))
    assert [(s["id"], s["n_ctx"], s["is_processing"]) for s in got] == \
        [(s["id"], s["n_ctx"], s["is_processing"]) for s in want] == [(0, 1024, False),
                                                                      (1, 1024, False)]


# --- the Responses API ------------------------------------------------------------------------

def responses_events(url: str, body: dict) -> list[tuple[str, dict]]:
    """A streamed /v1/responses answer: each event's `event:` name and its JSON; the stream
    ends after the last (no [DONE] in this API, on either server)."""
    r = requests.post(url + "/v1/responses", json=dict(body, stream=True), timeout=60,
                      stream=True)
    assert r.status_code == 200, r.text
    out, name = [], None
    for line in r.iter_lines(decode_unicode=True):
        if line.startswith("event: "):
            name = line[7:]
        elif line.startswith("data: "):
            assert line != "data: [DONE]"
            data = json.loads(line[6:])
            assert data["type"] == name
            out.append((name, data))
    return out


# What differs in the Responses API's answers, and why (field paths as `shape` writes them).
RESPONSES_DIFFERENCES = {
    # llama-server's own telemetry on the last event; Muser's stream has no timings.
    ("response.completed", ".timings*"),
}


def test_responses_have_llama_servers_fields_and_events(tmp_path):
    """Both servers on one file with one chat template: /v1/responses/input_tokens counts the
    same prompt for an input of every item kind; the answer has every field of llama-server's
    with the same JSON type; a stream's events come in llama-server's order, each type with
    llama-server's fields (Muser adds OpenAI's `sequence_number`, `output_index`,
    `content_index` and the full response object); a refused `previous_response_id` is a 400
    on both. llama-server says "completed" for an answer max_output_tokens cut; Muser, as
    OpenAI, "incomplete" (with response.incomplete as the last event)."""
    model = tmp_path / "llama-tiny.gguf"
    subprocess.run([str(muser_bin()), "synth", "llama-tiny", str(model)], check=True,
                   capture_output=True)
    from test_tool_calls import HERMES
    template = tmp_path / "hermes.jinja"
    template.write_text(HERMES)
    muser = ServerProcess("--ctx-size", "2048", "--chat-template-file", str(template),
                          model=model)
    try:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        llama = LlamaServer(model, port, "--jinja", "--chat-template-file", str(template))
    except Exception:
        muser.stop()
        raise
    try:
        tool = {"type": "function", "name": "f", "description": "F.",
                "parameters": {"type": "object", "properties": {"a": {"type": "integer"}}}}
        items = [{"role": "developer", "content": "Be brief."},
                 {"role": "user", "content": [{"type": "input_text", "text": "a"},
                                              {"type": "input_text", "text": "b"}]},
                 {"type": "function_call", "call_id": "c1", "name": "f",
                  "arguments": "{\"a\": 1}"},
                 {"type": "function_call_output", "call_id": "c1", "output": "42"},
                 {"type": "message", "role": "assistant",
                  "content": [{"type": "output_text", "text": "It is 42."}]},
                 {"role": "user", "content": "And b?"}]
        body = {"input": items, "instructions": "Be nice.", "tools": [tool]}
        counts = [requests.post(s.url + "/v1/responses/input_tokens", json=body,
                                timeout=60).json() for s in (muser, llama)]
        assert counts[0] == counts[1] and counts[0]["input_tokens"] > 20, counts

        ask = {"input": "Hello there", "instructions": "Be brief.", "max_output_tokens": 6,
               "temperature": 0}
        got, want = (requests.post(s.url + "/v1/responses", json=ask, timeout=60)
                     for s in (muser, llama))
        assert got.status_code == want.status_code == 200
        g, w = shape(got.json()), shape(want.json())
        assert not [p for p in w if p not in g], [p for p in w if p not in g]
        assert not [p for p in w if "null" not in (w[p], g[p]) and w[p] != g[p]]
        assert want.json()["status"] == "completed" and got.json()["status"] == "incomplete"
        assert got.json()["output"][0]["content"][0]["text"]

        got, want = (responses_events(s.url, ask) for s in (muser, llama))
        # (runs of deltas as one: the texts differ, each engine's own draw)
        def order(events):
            names = [n for n, _ in events]
            return [n for i, n in enumerate(names) if i == 0 or n != names[i - 1]]
        mapped = [n.replace("response.incomplete", "response.completed") for n in order(got)]
        assert mapped == order(want), (order(got), order(want))
        fields_g, fields_w = {}, {}
        for events, fields in ((got, fields_g), (want, fields_w)):
            for name, data in events:
                name = name.replace("response.incomplete", "response.completed")
                fields.setdefault(name, {}).update(shape(data))
        for name, w in fields_w.items():
            g = fields_g[name]
            missing = [p for p in w if p not in g and not any(
                n == name and (p == q or (q.endswith("*") and p.startswith(q[:-1])))
                for n, q in RESPONSES_DIFFERENCES)]
            assert not missing, (name, missing)
            assert not [p for p in w if p in g and "null" not in (w[p], g[p])
                        and w[p] != g[p]], name
        assert all(d["sequence_number"] == i for i, (_, d) in enumerate(got))

        for s in (muser, llama):
            r = requests.post(s.url + "/v1/responses",
                              json={"input": "hi", "previous_response_id": "resp_1"}, timeout=60)
            assert r.status_code == 400
            e = r.json()["error"]
            assert e["type"] == "invalid_request_error" and "previous_response_id" in e["message"]
    finally:
        muser.stop()
        llama.stop()
