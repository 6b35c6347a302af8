"""Chat templates rendered as Hugging Face renders them. `muser serve --chat-template-file` is
started with each Jinja chat template that llama.cpp's source ships (models/templates under
$MUSER_GGML_SRC: ~70 real models' templates) and asked through `POST /apply-template` for a
conversation; the same template is rendered by jinja2, set up the way transformers sets it up
(sandboxed, trim_blocks and lstrip_blocks, loop controls, the `{% generation %}` tag, `tojson`
without ASCII escapes, `raise_exception`). Each prompt must be the same string, byte for byte,
or both must refuse the conversation.

`strftime_now` is today's date on both sides; a reference is rendered before and after each
request, so a request that crosses midnight matches one of them.

Request options are checked against the same reference: `add_generation_prompt`,
`chat_template_kwargs`, the message fields templates read (`name`, `tool_calls`, ...), and
llama-server's assistant prefill (a conversation ending with an assistant message is continued:
the conversation before it with the generation prompt, then the message's text).

Reasoning in the history and `continue_final_message` of a message's reasoning or content are
checked against llama-server itself (when $LLAMA_CPP_BIN holds it), on templates that write
reasoning tags: the same prompt for the same request, and the continued reasoning's reply.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import time
import socket
import subprocess
from datetime import datetime
from pathlib import Path

import pytest
import requests

jinja2 = pytest.importorskip("jinja2")
from jinja2 import nodes  # noqa: E402
from jinja2.ext import Extension  # noqa: E402
from jinja2.sandbox import ImmutableSandboxedEnvironment  # noqa: E402

from test_server import ServerProcess, muser_bin  # noqa: E402
from test_llama_server_compat import LLAMA_SERVER, LlamaServer  # noqa: E402

SRC = os.environ.get("MUSER_GGML_SRC")
TEMPLATES = sorted(Path(SRC, "models", "templates").glob("*.jinja")) if SRC else []

WITH_SYSTEM = [
    {"role": "system", "content": "Answer in one line."},
    {"role": "user", "content": "What is the capital of France?"},
    {"role": "assistant", "content": "Paris."},
    {"role": "user", "content": "And of Italy? \u00e9\u00e8 \U0001F600"},
]
WITHOUT_SYSTEM = WITH_SYSTEM[1:]


class Generation(Extension):
    """transformers' `{% generation %}...{% endgeneration %}`: renders its body."""

    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

    def _body(self, caller):
        return caller()


def reference_env() -> ImmutableSandboxedEnvironment:
    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                          sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[Generation, jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env


def render_around(render, request):
    """(reference before, Muser's response, reference after): `strftime_now` may give either
    date when a request crosses midnight."""
    before = render()
    got = request()
    return before, got, render()


def apply(server: ServerProcess, messages) -> requests.Response:
    return requests.post(server.url + "/apply-template", json={"messages": messages}, timeout=60)


@pytest.fixture(scope="module")
def special_tokens(tmp_path_factory) -> dict[str, str]:
    """The default model's BOS and EOS texts, as the server hands them to a template."""
    probe = tmp_path_factory.mktemp("tmpl") / "probe.jinja"
    probe.write_text("{{ bos_token }}\n{{ eos_token }}")
    s = ServerProcess("--chat-template-file", str(probe))
    try:
        r = apply(s, WITHOUT_SYSTEM)
        assert r.status_code == 200, r.text
        bos, eos = r.json()["prompt"].split("\n")
    finally:
        s.stop()
    assert bos and eos
    return {"bos_token": bos, "eos_token": eos}


def dates() -> dict:
    """The dates llama-server (and Muser) give every template, local time."""
    return {"datetime": time.strftime("%b %d %Y"), "date_string": time.strftime("%d %b %Y")}


@pytest.mark.skipif(not TEMPLATES, reason="llama.cpp's source (MUSER_GGML_SRC) is not here")
def test_every_shipped_template_renders_as_transformers_does(special_tokens, tmp_path):
    """Where jinja2 refuses a template that Muser renders (an undefined value added to a
    string, FireFunction v2's `functions`: llama-server's template engine takes it as ""),
    the prompt is llama-server's for the same conversation."""
    env = reference_env()
    rendered = refused = 0
    llama_only = []
    for path in TEMPLATES:
        source = path.read_text()
        template = env.from_string(source)
        # llama-server's `enable_thinking`: true for a template that writes reasoning tags.
        thinks = any(o in source and c in source
                     for o, c in (("<think>", "</think>"), ("[THINK]", "[/THINK]")))
        s = ServerProcess("--chat-template-file", str(path))
        try:
            for messages in (WITH_SYSTEM, WITHOUT_SYSTEM):
                try:
                    want, got, want_after = render_around(
                        lambda: template.render(messages=messages, add_generation_prompt=True,
                                                enable_thinking=thinks, **dates(),
                                                **special_tokens),
                        lambda: apply(s, messages))
                except jinja2.exceptions.TemplateError as e:
                    want, why = None, str(e)
                    got = apply(s, messages)
                if want is None and got.status_code == 200:
                    llama_only.append((path.name, messages))
                    rendered += 1
                    break
                if want is None:
                    # Both refuse: a clear 400 naming the template's refusal.
                    assert got.status_code == 400, (path.name, got.text, why)
                    assert "chat template" in got.json()["error"]["message"], path.name
                    continue
                assert got.status_code == 200, (path.name, got.text)
                assert got.json()["prompt"] in (want, want_after), path.name
                for m in messages:
                    assert m["content"] in want, (path.name, m)
                rendered += 1
                break
            else:
                refused += 1
        finally:
            s.stop()
    # Most real templates take one of the two conversations; a few need variables of their own.
    assert rendered >= 0.9 * len(TEMPLATES), (rendered, refused, len(TEMPLATES))
    assert len(llama_only) <= 2, llama_only
    if llama_only and not (LLAMA_SERVER and LLAMA_SERVER.exists()):
        pytest.skip(f"needs llama-server (LLAMA_CPP_BIN) for {[n for n, _ in llama_only]}")
    model = tiny_model(tmp_path)
    for name, messages in llama_only:
        with both_servers(model, name) as (muser, llama, bos):
            got = same_prompt(muser, llama, bos, {"messages": messages}, name)
            for m in messages:
                assert m["content"] in got, (name, m)


def test_apply_template_is_the_chat_prompt(special_tokens):
    """The default model's own template: /apply-template's prompt, tokenized (with BOS unless
    the template wrote it), is the prompt a chat request runs."""
    s = ServerProcess()
    try:
        prompt = apply(s, WITH_SYSTEM).json()["prompt"]
        bos_written = prompt.startswith(special_tokens["bos_token"])
        ids = requests.post(s.url + "/tokenize", timeout=60,
                            json={"content": prompt, "add_special": not bos_written}).json()["tokens"]
        r = requests.post(s.url + "/v1/chat/completions", timeout=60,
                          json={"messages": WITH_SYSTEM, "max_tokens": 1})
        assert r.status_code == 200, r.text
        assert r.json()["usage"]["prompt_tokens"] == len(ids)
        for m in WITH_SYSTEM:
            assert m["content"] in prompt
        bad = apply(s, [{"role": "wizard", "content": "x"}])
        assert bad.status_code == 400 and "role" in bad.json()["error"]["message"]
    finally:
        s.stop()


# One template that uses what the review found missing: tojson with its options, strftime_now,
# the message fields besides role and content, a template variable from the request, nested
# objects whose keys are not in sorted order, and Windows line ends.
PROBE = (
    "{{ messages | tojson }}\r\n"
    "{{ messages[-1] | tojson(indent=2) }}\r\n"
    "{{ {'b': 1, 'a': [1.5, none, 'x<y & \\'z\\''], 'c': 1e16} | tojson }}\r\n"
    "{{ {'b': 1, 'a': 2} | tojson(sort_keys=true, separators=(',', ':')) }}\r\n"
    "{{ strftime_now('%Y-%m-%d %B %b %A %a %j %y %e') }}\r\n"
    "{% for m in messages %}{{ m.role }}:{{ m.name }}:{{ m.tool_call_id }}:"
    "{{ m.reasoning_content }}:{% for c in m.tool_calls %}{{ c.function.name }}"
    "{{ c.function.arguments | tojson }}{% endfor %}\r\n{% endfor %}"
    "{{ enable_thinking }}{% if hint is defined %}{{ hint | tojson }}{% endif %}"
    "{% if add_generation_prompt %}<assistant>{% endif %}"
)
FIELDS = [
    {"role": "system", "content": "Be brief. \u00e9 \U0001F600 \"q\" <b>"},
    {"role": "user", "content": "Weather in Paris?", "name": "bob"},
    {"role": "assistant", "content": "", "reasoning_content": "Use the tool.",
     "tool_calls": [{"id": "c1", "type": "function",
                     "function": {"name": "weather", "arguments": {"days": 2, "city": "Paris",
                                                               "units": {"temp": "C", "speed": "kmh"}}}}]},
    {"role": "tool", "content": "{\"temp\": 20}", "tool_call_id": "c1"},
]


def test_request_options_and_fields_render_as_transformers_does(tmp_path):
    path = tmp_path / "probe.jinja"
    path.write_bytes(PROBE.encode())
    template = reference_env().from_string(PROBE)
    s = ServerProcess("--chat-template-file", str(path))
    try:
        # `enable_thinking` is false unless the request sets it: this template writes no
        # reasoning tags (llama-server's default).
        off = {"enable_thinking": False}
        for extra, agp, kwargs in [
            ({}, True, off),
            ({"add_generation_prompt": False}, False, off),
            ({"chat_template_kwargs": {"enable_thinking": True}}, True,
             {"enable_thinking": True}),
            ({"chat_template_kwargs": {"enable_thinking": True}, "reasoning_effort": "none"},
             True, off),
            # Nested objects keep the request's key order (not sorted), as in transformers.
            ({"chat_template_kwargs": {"hint": {"z": 1, "a": {"y": 2, "b": 3}}}}, True,
             {"hint": {"z": 1, "a": {"y": 2, "b": 3}}, **off}),
        ]:
            want, got, want_after = render_around(
                lambda: template.render(messages=FIELDS, add_generation_prompt=agp, **kwargs),
                lambda: requests.post(s.url + "/apply-template", timeout=60,
                                      json={"messages": FIELDS, **extra}))
            assert got.status_code == 200, got.text
            assert got.json()["prompt"] in (want, want_after), extra
        # Text parts are joined with a newline, as llama-server joins them.
        parts = [{"role": "user", "content": [{"type": "text", "text": "a"},
                                              {"type": "text", "text": "b"}]}]
        joined = [{"role": "user", "content": "a\nb"}]
        want, got, want_after = render_around(
            lambda: template.render(messages=joined, add_generation_prompt=True, **off),
            lambda: apply(s, parts))
        assert got.json()["prompt"] in (want, want_after)
    finally:
        s.stop()


CHATML = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def test_a_final_assistant_message_is_continued(tmp_path):
    """llama-server's assistant prefill: the prompt is the conversation before the assistant
    message with the generation prompt, then that message's text (what transformers gives with
    continue_final_message); a chat request runs exactly that prompt. An empty message (no
    text) is not continued: the prompt is the conversation before it, no generation prompt
    (llama-server's, which the test of its own below compares)."""
    convo = [{"role": "user", "content": "Write a poem."},
             {"role": "assistant", "content": "Roses are"}]
    path = tmp_path / "chatml.jinja"
    path.write_text(CHATML)
    template = reference_env().from_string(CHATML)
    continued = template.render(messages=convo[:1], add_generation_prompt=True) + "Roses are"
    finished = template.render(messages=convo, add_generation_prompt=True)
    s = ServerProcess("--chat-template-file", str(path))
    try:
        assert apply(s, convo).json()["prompt"] == continued
        r = requests.post(s.url + "/apply-template", timeout=60,
                          json={"messages": convo, "continue_final_message": True,
                                "add_generation_prompt": False})
        assert r.json()["prompt"] == continued
        before = template.render(messages=convo[:1], add_generation_prompt=False)
        for content in ("", None, []):
            empty = convo[:1] + [{"role": "assistant", "content": content}]
            for extra in ({}, {"continue_final_message": True, "add_generation_prompt": False}):
                r = requests.post(s.url + "/apply-template", timeout=60,
                                  json={"messages": empty, **extra})
                assert r.json()["prompt"] == before, (content, extra)
        # Not continued when asked not to: the message is a finished turn.
        r = requests.post(s.url + "/apply-template", timeout=60,
                          json={"messages": convo, "continue_final_message": False})
        assert r.json()["prompt"] == finished
        ids = requests.post(s.url + "/tokenize", timeout=60,
                            json={"content": continued, "add_special": True,
                                  "parse_special": True}).json()["tokens"]
        r = requests.post(s.url + "/v1/chat/completions", timeout=60,
                          json={"messages": convo, "max_tokens": 1})
        assert r.status_code == 200, r.text
        assert r.json()["usage"]["prompt_tokens"] == len(ids)
        # Refused as llama-server refuses them.
        for body, what in [
            ({"messages": convo, "continue_final_message": True, "add_generation_prompt": True},
             "Cannot set both"),
            ({"messages": convo + [{"role": "assistant", "content": "x"}]}, "assistant messages"),
            ({"messages": convo[:1], "continue_final_message": True}, "assistant"),
        ]:
            r = requests.post(s.url + "/apply-template", json=body, timeout=60)
            assert r.status_code == 400 and what in r.json()["error"]["message"], r.text
    finally:
        s.stop()


# Templates that write reasoning tags (R1's and QwQ's close the block of a new turn unless
# `enable_thinking` is given, which llama-server and Muser pass as true for them).
REASONING_TEMPLATES = [
    "Qwen-Qwen3-0.6B.jinja",
    "Qwen3.5-4B.jinja",
    "Qwen-QwQ-32B.jinja",
    "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja",
    "mistralai-Ministral-3-14B-Reasoning-2512.jinja",
]


def random_text(rng: random.Random) -> str:
    """Letters, spaces, newlines, markup characters and non-ASCII; no whitespace at the ends."""
    alphabet = ["a", "Q", " ", "\n", "\u00e9", "<", "[", "/", "]", ">", "{", "\U0001F600", "ok"]
    return "x" + "".join(rng.choice(alphabet) for _ in range(rng.randrange(1, 16))) + "y"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def reply(server, body, stream=False):
    """(content, reasoning_content, prompt tokens) of a chat answer, streamed or not."""
    r = requests.post(server.url + "/v1/chat/completions", timeout=60, stream=stream,
                      json={**body, "stream": stream, "max_tokens": 6, "temperature": 0,
                            **({"stream_options": {"include_usage": True}} if stream else {})})
    assert r.status_code == 200, r.text
    if not stream:
        j = r.json()
        m = j["choices"][0]["message"]
        return m.get("content") or "", m.get("reasoning_content") or "", \
            j["usage"]["prompt_tokens"]
    content = reasoning = ""
    tokens = None
    for line in r.iter_lines():
        if line.startswith(b"data: ") and line != b"data: [DONE]":
            chunk = json.loads(line[6:])
            for ch in chunk.get("choices", []):
                content += ch["delta"].get("content") or ""
                reasoning += ch["delta"].get("reasoning_content") or ""
            if chunk.get("usage"):
                tokens = chunk["usage"]["prompt_tokens"]
    return content, reasoning, tokens


def tiny_model(tmp_path) -> Path:
    """A synthetic llama-tiny GGUF, for servers whose prompts (not answers) are compared."""
    model = tmp_path / "llama-tiny.gguf"
    subprocess.run([str(muser_bin()), "synth", "llama-tiny", str(model)], check=True,
                   capture_output=True)
    return model


@contextlib.contextmanager
def both_servers(model: Path, template: str):
    """`muser serve` and llama-server on `model` with llama.cpp's template `template`, and
    the BOS text Muser's /apply-template prompt starts with where the template writes it
    (llama-server leaves it out)."""
    path = Path(SRC, "models", "templates", template)
    muser = ServerProcess("--chat-template-file", str(path), "--ctx-size", "1024", model=model)
    try:
        llama = LlamaServer(model, free_port(), "--chat-template-file", str(path))
    except Exception:
        muser.stop()
        raise
    try:
        bos = requests.get(muser.url + "/props", timeout=60).json()["bos_token"]
        yield muser, llama, bos
    finally:
        muser.stop()
        llama.stop()


def same_prompt(muser, llama, bos: str, body: dict, name: str) -> str:
    """/apply-template's prompt for `body` from both servers, asserted equal."""
    want = requests.post(llama.url + "/apply-template", json=body, timeout=60)
    got = requests.post(muser.url + "/apply-template", json=body, timeout=60)
    assert want.status_code == got.status_code == 200, (name, body, got.text)
    got = got.json()["prompt"]
    got = got[len(bos):] if bos and got.startswith(bos) else got
    assert got == want.json()["prompt"], (name, body)
    return got


@pytest.mark.skipif(not (SRC and LLAMA_SERVER and LLAMA_SERVER.exists()),
                    reason="needs llama.cpp's source (MUSER_GGML_SRC) and llama-server "
                           "(LLAMA_CPP_BIN)")
def test_dated_templates_get_todays_date_as_from_llama_server(tmp_path):
    """The templates that read the date llama-server gives every template (`date_string`:
    Llama 3.x's "Today Date") render the same prompt in both servers, for random
    conversations, and a request's own `date_string` wins in both. (FireFunction's, which
    reads `datetime`, has a test of its own.)"""
    model = tiny_model(tmp_path)
    rng = random.Random()
    for name in ["meta-llama-Llama-3.1-8B-Instruct.jinja",
                 "meta-llama-Llama-3.2-3B-Instruct.jinja",
                 "meta-llama-Llama-3.3-70B-Instruct.jinja"]:
        with both_servers(model, name) as (muser, llama, bos):
            for _ in range(3):
                user = [{"role": "user", "content": random_text(rng)}]
                system = [{"role": "system", "content": random_text(rng)}]
                for body in [{"messages": user}, {"messages": system + user},
                             {"messages": user,
                              "chat_template_kwargs": {"date_string": random_text(rng)}}]:
                    got = same_prompt(muser, llama, bos, body, name)
                    date = body.get("chat_template_kwargs", {}).get("date_string")
                    assert "Today Date: " + (date or time.strftime("%d %b %Y")) in got


@pytest.mark.skipif(not (SRC and LLAMA_SERVER and LLAMA_SERVER.exists()),
                    reason="needs llama.cpp's source (MUSER_GGML_SRC) and llama-server "
                           "(LLAMA_CPP_BIN)")
def test_firefunction_v2_renders_as_llama_server_renders_it(tmp_path):
    """FireFunction v2's template adds `functions`, which no request defines, to a string
    (jinja2 refuses it; llama-server's engine takes the undefined value as ""), and reads
    `datetime`: random conversations, with and without a system message and tools, render
    the same prompt in both servers. (With tools to call, Muser's generic tool-call format
    describes them in the system prompt, which the template cannot show: the prompt is
    llama-server's for the system message Muser writes.)"""
    model = tiny_model(tmp_path)
    rng = random.Random()
    name = "fireworks-ai-llama-3-firefunction-v2.jinja"
    tools = [{"type": "function", "function": {
        "name": "get_weather", "description": "The weather in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                       "required": ["city"]}}}]
    with both_servers(model, name) as (muser, llama, bos):
        for _ in range(4):
            user = [{"role": "user", "content": random_text(rng)}]
            system = [{"role": "system", "content": random_text(rng)}]
            turns = user + [{"role": "assistant", "content": random_text(rng)},
                            {"role": "user", "content": random_text(rng)}]
            for messages in (user, system + user, system + turns):
                for extra in ({}, {"tools": tools, "tool_choice": "none"}):
                    got = same_prompt(muser, llama, bos, {"messages": messages, **extra}, name)
                    assert "JSON spec:\n\nToday is " + time.strftime("%b %d %Y") in got
                    for m in messages:
                        assert m["content"] in got, m
                body = {"messages": messages, "tools": tools}
                got = requests.post(muser.url + "/apply-template", json=body, timeout=60)
                assert got.status_code == 200, got.text
                head = "<|start_header_id|>system<|end_header_id|>\n\n"
                written = got.json()["prompt"].split(head, 1)[1].split("\nIn addition to", 1)[0]
                own = messages[0]["role"] == "system"
                assert "get_weather" in written and (not own or messages[0]["content"] in written)
                rest = messages[1:] if own else messages
                written = [{"role": "system", "content": written}] + rest
                want = requests.post(llama.url + "/apply-template", timeout=60,
                                     json={"messages": written, "tools": tools})
                assert got.json()["prompt"].removeprefix(bos) == want.json()["prompt"]


@pytest.mark.skipif(not (SRC and LLAMA_SERVER and LLAMA_SERVER.exists()),
                    reason="needs llama.cpp's source (MUSER_GGML_SRC) and llama-server "
                           "(LLAMA_CPP_BIN)")
def test_an_empty_final_message_is_not_continued_as_in_llama_server(tmp_path):
    """A final assistant message with nothing in it (content "", null or no parts; no
    reasoning) is not continued by llama-server's prefill, by default or when asked: the
    prompt is the conversation before it without a generation prompt. Random conversations
    on templates without reasoning tags (those with them: the reasoning test below), the same
    prompt in both servers; a message with a name is not empty."""
    model = tiny_model(tmp_path)
    rng = random.Random()
    for name in ["Qwen-Qwen2.5-7B-Instruct.jinja", "meta-llama-Llama-3.2-3B-Instruct.jinja"]:
        with both_servers(model, name) as (muser, llama, bos):
            for _ in range(2):
                user = [{"role": "user", "content": random_text(rng)}]
                before = same_prompt(muser, llama, bos,
                                     {"messages": user, "add_generation_prompt": False}, name)
                for empty in ("", None, []):
                    last = [{"role": "assistant", "content": empty}]
                    for extra in ({}, {"continue_final_message": True,
                                       "add_generation_prompt": False}):
                        body = {"messages": user + last, **extra}
                        assert same_prompt(muser, llama, bos, body, name) == before, body
                named = [{"role": "assistant", "content": "", "name": random_text(rng)}]
                opened = same_prompt(muser, llama, bos, {"messages": user + named}, name)
                assert opened.startswith(before) and len(opened) > len(before), name


@pytest.mark.skipif(not (SRC and LLAMA_SERVER and LLAMA_SERVER.exists()),
                    reason="needs llama.cpp's source (MUSER_GGML_SRC) and llama-server "
                           "(LLAMA_CPP_BIN)")
def test_reasoning_is_continued_as_llama_server_continues_it(tmp_path):
    """Random reasoning and text, on templates that write `<think>` or `[THINK]` tags: the
    prompt of a new turn (thinking on by default, off with `enable_thinking` false or
    `reasoning_effort` "none"), of a conversation with reasoning in its history (Ministral 3
    reads it from content blocks), and of a final assistant message continued (its reasoning,
    left open, by default when it has no text or with `continue_final_message:
    "reasoning_content"`; its text, after its reasoning block, with `true` or `"content"`; an
    empty message not at all), is llama-server's for the same request.
    A continued reasoning's reply is what the model goes on writing, as llama-server streams
    it, streamed or not."""
    model = tiny_model(tmp_path)
    rng = random.Random()
    for name in REASONING_TEMPLATES:
        with both_servers(model, name) as (muser, llama, bos):
            for _ in range(3):
                q, q2, r, a = (random_text(rng) for _ in range(4))
                user = [{"role": "user", "content": q}]
                if "Ministral" in name:
                    user.insert(0, {"role": "system", "content": random_text(rng)})
                both = {"role": "assistant", "content": a, "reasoning_content": r}
                only = {"role": "assistant", "content": "", "reasoning_content": r}
                plain = {"role": "assistant", "content": a}
                cont = {"add_generation_prompt": False}
                bodies = [
                    {"messages": user + [only]},
                    {"messages": user + [only], "continue_final_message": True, **cont},
                    {"messages": user + [only], "continue_final_message": "reasoning_content",
                     **cont},
                    {"messages": user + [both]},
                    {"messages": user + [both], "continue_final_message": "content", **cont},
                    {"messages": user + [plain]},
                    {"messages": user + [both, {"role": "user", "content": q2}]},
                    # Nothing to continue: the conversation before, no generation prompt.
                    {"messages": user + [{"role": "assistant", "content": ""}]},
                    {"messages": user + [{"role": "assistant", "content": None,
                                          "reasoning_content": ""}]},
                    {"messages": user + [{"role": "assistant", "content": ""}],
                     "continue_final_message": "content", **cont},
                    {"messages": user + [{"role": "assistant", "content": []}],
                     "continue_final_message": "reasoning_content", **cont},
                    # A new turn: thinking on by default, off by kwarg or reasoning_effort.
                    {"messages": user},
                    {"messages": user, "chat_template_kwargs": {"enable_thinking": False}},
                    {"messages": user, "reasoning_effort": "none"},
                    {"messages": user, "reasoning_effort": "high",
                     "chat_template_kwargs": {"enable_thinking": True}},
                ]
                for body in bodies:
                    same_prompt(muser, llama, bos, body, name)
                body = {"messages": user + [only], "continue_final_message": "reasoning_content",
                        **cont}
                content, reasoning, tokens = reply(muser, body)
                assert content == "" and reasoning, (name, reasoning)
                assert reply(muser, body, stream=True) == (content, reasoning, tokens), name
                raw = reply(muser, {**body, "reasoning_format": "none"})[0]
                close = "[/THINK]" if "Ministral" in name else "</think>"
                assert reasoning == raw.split(close)[0], name
                # llama-server streams the continuation only (its whole message also repeats
                # the message's reasoning), of the same prompt's tokens. (The texts are not
                # compared: two engines' greedy picks may part at a near tie of the logits.)
                want = reply(llama, body, stream=True)
                assert want[2] == tokens, name
                assert want[1] and not want[1].startswith(r), (name, want[1])
                assert not reasoning.startswith(r), (name, reasoning)
