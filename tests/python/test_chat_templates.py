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
import re
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


# The reasoning tags Muser knows, and the variables llama-server gives every template to keep
# past turns' reasoning (its default `preserve_reasoning`, under each name templates read).
REASONING_TAGS = [("Here are my reasoning steps:", "[BEGIN FINAL RESPONSE]"),  # Apriel 1.6's
                  ("<think>", "</think>"), ("[THINK]", "[/THINK]"),
                  ("<seed:think>", "</seed:think>"), ("<mm:think>", "</mm:think>"),
                  ("<|START_THINKING|>", "<|END_THINKING|>"),
                  ("<|channel>thought", "<channel|>")]
PRESERVED_REASONING = {"preserve_reasoning": True, "preserve_thinking": True,
                       "clear_thinking": False, "truncate_history_thinking": False,
                       "drop_thinking": False}


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
        thinks = any(o in source and c in source for o, c in REASONING_TAGS)
        s = ServerProcess("--chat-template-file", str(path))
        try:
            for messages in (WITH_SYSTEM, WITHOUT_SYSTEM):
                try:
                    want, got, want_after = render_around(
                        lambda: template.render(messages=messages, add_generation_prompt=True,
                                                enable_thinking=thinks, **dates(),
                                                **PRESERVED_REASONING, **special_tokens),
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
                      json={"max_tokens": 6, "temperature": 0, **body, "stream": stream,
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
def both_servers(model: Path, template: str, ctx: int = 1024):
    """`muser serve` and llama-server on `model` with llama.cpp's template `template` and `ctx`
    tokens of context a request, and the BOS text Muser's /apply-template prompt starts with
    where the template writes it (llama-server leaves it out)."""
    path = Path(SRC, "models", "templates", template)
    muser = ServerProcess("--chat-template-file", str(path), "--ctx-size", str(ctx), model=model)
    try:
        # Two slots share llama-server's context.
        llama = LlamaServer(model, free_port(), "--chat-template-file", str(path),
                            "-c", str(2 * ctx))
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
    the same prompt in both servers. (With tools to call, Muser gives the template their
    specs as `functions`, which its system prompt shows: the prompt is llama-server's with
    them there.)"""
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
                prompt = got.json()["prompt"]
                spec = json.dumps([tools[0]["function"]], indent=2, ensure_ascii=False)
                assert "Available functions as JSON spec:\n" + spec + "\nToday is " in prompt
                want = requests.post(llama.url + "/apply-template", timeout=60, json=body)
                assert prompt.replace(spec, "", 1).removeprefix(bos) == want.json()["prompt"]


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


GEMMA4_TEMPLATES = ["google-gemma-4-31B-it.jinja", "google-gemma-4-31B-it-interleaved.jinja"]


def gemma4_bodies(rng: random.Random) -> list[dict]:
    """Random conversations with tool calls in Gemma 4's history: calls with random arguments
    (strings, integers, lists, objects; not null nor fractions, which llama-server's Jinja
    writes otherwise than Muser's: nothing for `None`, 6 digits of a float), their results (JSON objects, JSON values, plain text),
    reasoning beside the calls, the turn's answer, thinking on and off, a final message
    continued."""
    tools = [{"type": "function", "function": {
        "name": "get_weather", "description": random_text(rng),
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string", "description": random_text(rng)},
            "days": {"type": "integer"}, "tags": {"type": "array", "items": {"type": "string"}},
            "unit": {"type": "string", "enum": ["C", "F"]}},
            "required": ["city"]}}}]
    def args():
        return json.dumps({"city": random_text(rng), "days": rng.randrange(-9, 99),
                           "tags": [random_text(rng) for _ in range(rng.randrange(3))],
                           "nested": {"b": rng.random() < 0.5, "z": rng.randrange(-99, 99)}})
    def result():
        return rng.choice([json.dumps({"temp": rng.randrange(40), "sky": random_text(rng)}),
                           json.dumps(rng.randrange(100)), random_text(rng)])
    n = rng.randrange(1, 3)
    calls = [{"id": f"call_{i}{rng.randrange(1000)}", "type": "function",
              "function": {"name": "get_weather", "arguments": args()}} for i in range(n)]
    user = [{"role": "system", "content": random_text(rng)},
            {"role": "user", "content": random_text(rng)}]
    asked = {"role": "assistant", "content": rng.choice(["", random_text(rng)]),
             "reasoning_content": random_text(rng), "tool_calls": calls}
    results = [{"role": "tool", "tool_call_id": c["id"], "content": result()} for c in calls]
    answer = {"role": "assistant", "content": random_text(rng)}
    off = {"chat_template_kwargs": {"enable_thinking": False}}
    cont = {"add_generation_prompt": False}
    return [
        {"messages": user + [asked] + results, "tools": tools},
        {"messages": user + [asked] + results, "tools": tools, **off},
        {"messages": user + [asked] + results + [answer], "tools": tools},
        {"messages": user + [asked] + results + [answer, {"role": "user",
                                                         "content": random_text(rng)}],
         "tools": tools, **off},
        {"messages": user + [asked] + results + [{**answer, "reasoning_content": "r"}],
         "tools": tools, "continue_final_message": "content", **cont},
        {"messages": user + [asked] + results + [{"role": "assistant", "content": "",
                                                  "reasoning_content": random_text(rng)}],
         "tools": tools, "continue_final_message": True, **cont},
        {"messages": user, "tools": tools},
    ]


@pytest.mark.skipif(not (SRC and LLAMA_SERVER and LLAMA_SERVER.exists()),
                    reason="needs llama.cpp's source (MUSER_GGML_SRC) and llama-server "
                           "(LLAMA_CPP_BIN)")
def test_gemma4_tool_histories_prompt_as_llama_server_does(tmp_path):
    """Gemma 4's two templates, on random conversations with calls, results, reasoning and
    answers (`gemma4_bodies`): Muser's prompt is llama-server's, byte for byte (the older
    template's results merged into their assistant message, a model turn opened after a
    finished one, as llama-server does both)."""
    model = tiny_model(tmp_path)
    rng = random.Random()
    for name in GEMMA4_TEMPLATES:
        with both_servers(model, name, ctx=4096) as (muser, llama, bos):
            for _ in range(3):
                for body in gemma4_bodies(rng):
                    same_prompt(muser, llama, bos, body, name)


def reasoning_family_templates() -> list[str]:
    """llama.cpp's templates that write a pair of reasoning tags of any kind (`<think>`,
    `<seed:think>`, `<mm:think>`, `[THINK]`, `<|think|>`, `<thinking>`..., Hy3's built
    `'<think{}>'.format(HYTK)`)."""
    pairs = re.compile(r"<(\|?)([a-z_]+:)?think(ing)?(\|?)>|\[THINK\]|<\|START_THINKING\|>"
                       r"|<think\{\}>")
    return [p.name for p in TEMPLATES if pairs.search(p.read_text())]


def family_bodies(rng: random.Random) -> dict[str, dict]:
    """The conversations each reasoning template is compared on, by name: a new turn, thinking
    off, reasoning in the history (with text, and with a null content), and a final assistant
    message continued (its text; its reasoning)."""
    q, q2, r, a = (random_text(rng) for _ in range(4))
    user = [{"role": "system", "content": random_text(rng)}, {"role": "user", "content": q}]
    both = {"role": "assistant", "content": a, "reasoning_content": r}
    return {
        "plain": {"messages": user},
        "thinking off": {"messages": user, "chat_template_kwargs": {"enable_thinking": False}},
        "history": {"messages": user + [both, {"role": "user", "content": q2}]},
        "history, thinking off": {"messages": user + [both, {"role": "user", "content": q2}],
                                  "chat_template_kwargs": {"enable_thinking": False}},
        "history, null content": {"messages": user + [{**both, "content": None},
                                                      {"role": "user", "content": q2}]},
        "continued text": {"messages": user + [both]},
        "continued reasoning": {"messages": user + [{**both, "content": ""}]},
    }


def prompt_differences(muser, llama, bos: str, bodies: dict[str, dict]) -> dict[str, tuple]:
    """The conversations whose /apply-template prompts differ (or that one server refuses):
    name -> (llama-server's, Muser's)."""
    out = {}
    for case, body in bodies.items():
        want = requests.post(llama.url + "/apply-template", json=body, timeout=60)
        got = requests.post(muser.url + "/apply-template", json=body, timeout=60)
        if want.status_code != 200 or got.status_code != 200:
            if want.status_code != got.status_code:
                out[case] = (want.text, got.text)
            continue
        got = got.json()["prompt"]
        got = got[len(bos):] if bos and got.startswith(bos) else got
        if got != want.json()["prompt"]:
            out[case] = (want.json()["prompt"], got)
    return out


# The templates whose prompts differ from llama-server's (for some of `family_bodies`), with why.
KNOWN_PROMPT_DIFFERENCES: dict[str, str] = {
    "llama-cpp-rwkv-world.jinja":
        "llama-server writes the opening tag twice when continuing, once from the generation "
        "prompt and once as the block's (its own test template; its analysis takes "
        "'\\n</think>' for the closing tag)",
    "muse-glimmer.jinja": "reasoning in a message to=self, which Muser does not split",
    "Kimi-K2-Instruct.jinja":
        "llama-server's Kimi K2 handler writes a <think> block when continuing templates that "
        "write none",
    "moonshotai-Kimi-K2.jinja": "as Kimi-K2-Instruct.jinja",
    "LFM2-8B-A1B.jinja":
        "llama-server's LFM2 handler writes a <think> block when continuing templates that "
        "write none",
    "LFM2.5-Instruct.jinja": "as LFM2-8B-A1B.jinja",
    "unsloth-mistral-Devstral-Small-2507.jinja":
        "llama-server takes it for Ministral 3 (the same markers): it hands the messages' text "
        "as content blocks, which this template drops, and writes [THINK] when continuing",
    "meetkai-functionary-medium-v3.2.jinja":
        "llama-server's handler continues a message after '>>>all\\n'",
    "microsoft-Phi-3.5-mini-instruct.jinja":
        "llama-server appends the generation prompt's tail to the rendering without it, which "
        "ends in the EOS text here (<|end_of_text|>assistant|>); Muser takes the opened turn "
        "whole",
    "google-gemma-2-2b-it.jinja":
        "refuses a system message; llama-server merges it into the first user message, Muser "
        "passes on the template's refusal",
}


@pytest.mark.skipif(not (SRC and LLAMA_SERVER and LLAMA_SERVER.exists()),
                    reason="needs llama.cpp's source (MUSER_GGML_SRC) and llama-server "
                           "(LLAMA_CPP_BIN)")
def test_every_template_prompts_as_llama_server_does(tmp_path):
    """Every template of llama.cpp, on random conversations (`family_bodies`: a new turn,
    thinking off, reasoning in the history, a final message continued): Muser's prompt is
    llama-server's, byte for byte, except in the named KNOWN_PROMPT_DIFFERENCES (each of which
    still differs)."""
    model = tiny_model(tmp_path)
    rng = random.Random()
    found = {}
    for path in TEMPLATES:
        with both_servers(model, path.name) as (muser, llama, bos):
            for _ in range(2):
                for case, (want, got) in prompt_differences(muser, llama, bos,
                                                            family_bodies(rng)).items():
                    found.setdefault(path.name, (case, want, got))
    report = "\n".join(f"{n} / {c}:\n  llama: {w!r}\n  muser: {g!r}"
                       for n, (c, w, g) in sorted(found.items()))
    assert set(found) == set(KNOWN_PROMPT_DIFFERENCES), report


# The templates of the XML call formats (seed-oss, minimax-m2, minimax-m3, glm-4.5, ling-3,
# hy3, DSML, minicpm5) whose calls and results in the history are compared.
XML_CALL_TEMPLATES = ["ByteDance-Seed-OSS.jinja", "MiniMax-M2.jinja", "MiniMax-M3.jinja",
                      "GLM-4.6.jinja", "GLM-4.7-Flash.jinja", "inclusionai-ling-3.0-flash.jinja",
                      "tencent-Hy3.jinja", "deepseek-ai-DeepSeek-V3.2.jinja",
                      "deepseek-ai-DeepSeek-V4.jinja", "deepseek-ai-DeepSeek-V4-Flash-0731.jinja",
                      "openbmb-MiniCPM5-1B.jinja", "Kimi-K3.jinja"]
# Templates of formats that write a call's name in markup and its arguments as JSON, compared
# the same way (Solar Open writes the calls' ids, Functionary v3.2 its recipients).
JSON_CALL_TEMPLATES = ["upstage-Solar-Open-100B.jinja", "meetkai-functionary-medium-v3.1.jinja",
                       "meetkai-functionary-medium-v3.2.jinja"]


def call_bodies(rng: random.Random) -> dict[str, dict]:
    """Conversations with tool calls (random arguments of every JSON type, null among them, as
    OpenAI's JSON string) and their results, by name: answered, several calls and results,
    reasoning with the calls, and a new turn after them. The floats are integral (`-56.0`,
    which llama-server writes as `-56` in JSON and `-56.0` printed, as Muser does) or fractions
    exact in 6 digits (llama-server writes a float's 6 significant digits, `3.14159` for
    3.14159265, where Muser keeps the number, Python's `3.14159265`: see chat/text.rs)."""
    tools = [{"type": "function", "function": {
        "name": "get_weather", "description": random_text(rng),
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string", "description": random_text(rng)},
            "days": {"type": "integer"}, "hourly": {"type": "boolean"},
            "tags": {"type": "array", "items": {"type": "string"}},
            "where": {"type": "object"}, "temp": {"type": "number"},
            "ratio": {"type": "number"}, "note": {"type": "string"}},
            "required": ["city"]}}},
        {"type": "function", "function": {"name": "ping", "description": "p",
                                          "parameters": {"type": "object", "properties": {}}}}]

    def call(i: int) -> dict:
        args = {"city": random_text(rng), "days": rng.randrange(-99, 99),
                "hourly": rng.random() < 0.5, "tags": [random_text(rng)],
                "where": {"lat": (2 * rng.randrange(-999, 999) + 1) / 8, "name": random_text(rng),
                          "alt": float(rng.randrange(-999, 999))},
                "temp": float(rng.randrange(-99, 99)), "ratio": rng.randrange(-7999, 7999) / 8,
                "note": None}
        keep = {k: v for k, v in args.items() if k == "city" or rng.random() < 0.6}
        name, a = ("get_weather", keep) if rng.random() < 0.8 else ("ping", {})
        return {"id": f"call{i:05d}", "type": "function",
                "function": {"name": name, "arguments": json.dumps(a, ensure_ascii=False)}}

    user = [{"role": "system", "content": random_text(rng)},
            {"role": "user", "content": random_text(rng)}]
    calls = [call(i) for i in range(3)]
    turn = lambda cs, **kw: ([{"role": "assistant", "content": kw.get("content", ""),  # noqa: E731
                               "tool_calls": cs, **({"reasoning_content": kw["reasoning"]}
                                                    if "reasoning" in kw else {})}]
                             + [{"role": "tool", "tool_call_id": c["id"],
                                 "content": random_text(rng)} for c in cs])
    return {
        "one call": {"messages": user + turn(calls[:1]), "tools": tools},
        "calls": {"messages": user + turn(calls, content=random_text(rng)), "tools": tools},
        "reasoning": {"messages": user + turn(calls[:2], reasoning=random_text(rng)),
                      "tools": tools},
        "new turn": {"messages": user + turn(calls[:1]) + [
            {"role": "assistant", "content": random_text(rng)},
            {"role": "user", "content": random_text(rng)}], "tools": tools},
    }


@pytest.mark.skipif(not (SRC and LLAMA_SERVER and LLAMA_SERVER.exists()),
                    reason="needs llama.cpp's source (MUSER_GGML_SRC) and llama-server "
                           "(LLAMA_CPP_BIN)")
def test_xml_call_templates_render_calls_and_results_as_llama_server(tmp_path):
    """The templates of the XML call formats (and of the JSON ones named) render conversations
    with tool calls (their arguments of every JSON type) and results as llama-server renders
    them, byte for byte, except in the named KNOWN_CALL_PROMPT_DIFFERENCES (each of which still
    differs)."""
    model = tiny_model(tmp_path)
    rng = random.Random()
    found = {}
    for name in XML_CALL_TEMPLATES + JSON_CALL_TEMPLATES:
        with both_servers(model, name, ctx=4096) as (muser, llama, bos):
            for _ in range(3):
                for case, (want, got) in prompt_differences(muser, llama, bos,
                                                            call_bodies(rng)).items():
                    found.setdefault(name, (case, want, got))
    report = "\n".join(f"{n} / {c}:\n  llama: {w!r}\n  muser: {g!r}"
                       for n, (c, w, g) in sorted(found.items()))
    assert set(found) == set(KNOWN_CALL_PROMPT_DIFFERENCES), report


# The XML call templates whose prompts with calls differ from llama-server's, with why.
KNOWN_CALL_PROMPT_DIFFERENCES = {
    "openbmb-MiniCPM5-1B.jinja":
        "it writes non-string arguments with `{{ }}`: llama-server's engine writes a mapping as "
        "nothing and a list's items run together (`2x` for [2, \"x\"]), plainly broken; Muser "
        "writes jinja2's text ({'k': 1}, [2, 'x'])",
}


def gbnf_literal(text: str) -> str:
    """`text` as a GBNF string literal."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def forced_reply(server, messages, text: str, stream: bool = False):
    """(content, reasoning_content) of a chat answer whose output is `text`, forced by a
    grammar of that text alone."""
    body = {"messages": messages, "grammar": "root ::= " + gbnf_literal(text),
            "max_tokens": 4 * len(text.encode()) + 16, "temperature": 0}
    content, reasoning, _ = reply(server, body, stream=stream)
    return content, reasoning


# The tags some templates wrap a reply in (Cohere's), by a marker of the template's source.
REPLY_WRAPPERS = {"<|START_TEXT|>": ("<|START_TEXT|>", "<|END_TEXT|>"),
                  "<|START_RESPONSE|>": ("<|START_RESPONSE|>", "<|END_RESPONSE|>")}


def family_outputs(rng: random.Random, tags: tuple[str, str],
                   wrap: tuple[str, str] = ("", "")) -> dict[str, str]:
    """Outputs a reasoning model may write, by name: a block then a reply (with whitespace
    around both), the rest of a block the prompt opened, a reply alone, and a reply after a
    bare closing tag; the reply in the template's wrapper `wrap`, if any."""
    open_, close = tags
    r, a = random_text(rng), random_text(rng)
    a = wrap[0] + a + wrap[1]
    ws = lambda: rng.choice(["", " ", "\n", "\n\n", " \n "])  # noqa: E731
    return {
        "block": f"{open_}{ws()}{r}{ws()}{close}{ws()}{a}{ws()}",
        "opened": f"{ws()}{r}{ws()}{close}{ws()}{a}",
        "reply": f"{a}{ws()}",
        "bare close": f"{close}{ws()}{a}",
    }


# The templates whose reasoning llama-server's handler reads from its first non-whitespace
# character, as Muser does for them (the Qwen3-Coder XML family, MiniCPM5, MiniMax M3, Gemma 4);
# in the others llama-server keeps the whitespace that starts it (with the generation prompt's own
# after an opening tag), and Muser the output's.
TRIMMED_REASONING = {"Qwen3.5-4B.jinja", "NVIDIA-Nemotron-3-Nano-30B-A3B-BF16.jinja",
                     "StepFun3.5-Flash.jinja", "openbmb-MiniCPM5-1B.jinja", "MiniMax-M3.jinja",
                     "google-gemma-4-31B-it.jinja", "google-gemma-4-31B-it-interleaved.jinja"}

# Replies of reasoning templates read otherwise than llama-server reads them, with why.
KNOWN_READING_DIFFERENCES: dict[str, str] = {
    "llama-cpp-rwkv-world.jinja":
        "llama-server's analysis takes '\\n</think>' for the closing tag of llama.cpp's own test "
        "template, and reads a reply after a prompt that opened a block as content",
    "CohereForAI-c4ai-command-r7b-12-2024-tool_use.jinja":
        "llama-server refuses (a 500) most of these outputs, even with the reply in its "
        "<|START_RESPONSE|> wrapper: whitespace between the tags, a reply after a block the "
        "prompt opened; Muser splits the reasoning and unwraps the reply",
    "Cohere2MoE.jinja": "as Command R7B's, with the <|START_TEXT|> wrapper",
    "google-gemma-4-31B-it.jinja":
        "llama-server refuses (a 500) an output that starts with a stray <channel|>; Muser reads "
        "it as llama.cpp's parser reads a stray channel marker later in a reply: the reply's "
        "text ends there (here: nothing)",
    "google-gemma-4-31B-it-interleaved.jinja": "as google-gemma-4-31B-it.jinja",
}


def reasoning_tags_of(source: str) -> tuple[str, str]:
    """The pair of reasoning tags a template writes (`<think>` where it writes none; Hy3's
    `<think:opensource>`, which it builds when rendering; Apriel 1.6's generation prompt line and
    delimiter before the `<think>` its template mentions)."""
    if all(m in source for m in ["<think{}>", "</think{}>", "':opensource'"]):
        return ("<think:opensource>", "</think:opensource>")
    return next((p for p in REASONING_TAGS if all(t in source for t in p)), REASONING_TAGS[1])


@pytest.mark.skipif(not (SRC and LLAMA_SERVER and LLAMA_SERVER.exists()),
                    reason="needs llama.cpp's source (MUSER_GGML_SRC) and llama-server "
                           "(LLAMA_CPP_BIN)")
def test_every_reasoning_template_reads_replies_as_llama_server_does(tmp_path):
    """Every template of llama.cpp that writes reasoning tags: random outputs of a reasoning
    model (`family_outputs`, in the template's tags), forced by a grammar in both servers, are
    split into the same reasoning and reply, streamed or not, up to the whitespace that starts
    them (llama-server keeps whitespace after the closing tag beyond its own, and in most
    templates the whitespace that starts the reasoning; Muser's reply starts at its first
    non-whitespace character), except the named KNOWN_READING_DIFFERENCES."""
    model = tiny_model(tmp_path)
    rng = random.Random()
    found = {}
    user = [{"role": "user", "content": random_text(rng)}]
    for name in reasoning_family_templates():
        source = Path(SRC, "models", "templates", name).read_text()
        tags = reasoning_tags_of(source)
        wrap = next((w for m, w in REPLY_WRAPPERS.items() if m in source), ("", ""))
        # Command R7B's own system prompt takes 1,182 of the tiny model's tokens.
        with both_servers(model, name, ctx=4096) as (muser, llama, _):
            for case, text in family_outputs(rng, tags, wrap).items():
                try:
                    want = forced_reply(llama, user, text)
                except AssertionError as e:  # llama-server refused to read it
                    want = ("refused", str(e))
                got = forced_reply(muser, user, text)
                if case == "block":
                    assert forced_reply(muser, user, text, stream=True) == got, (name, text)
                exact = name in TRIMMED_REASONING
                norm = lambda c, r: (c.lstrip(), r if exact else r.lstrip())  # noqa: E731
                if norm(*got) != norm(*want):
                    found.setdefault(name, (case, text, want, got))
    report = "\n".join(f"{n} / {c}: {t!r}\n  llama: {w!r}\n  muser: {g!r}"
                       for n, (c, t, w, g) in sorted(found.items()))
    assert set(found) == set(KNOWN_READING_DIFFERENCES), report


def kimi_k3_outputs(rng: random.Random) -> dict[str, tuple[dict, str]]:
    """Outputs Kimi K3 may write, by name, each with the template variables of its prompt:
    with `thinking` (the template's default) the rest of the `think` section the prompt opened,
    then the reply in a `response` section (or bare, or after a `response` opening that ends the
    reasoning), the message's closing after it or not; without, the rest of the `response`
    section."""
    think_end, resp = "<|close|>think<|sep|>", "<|open|>response<|sep|>"
    resp_end, msg_end = "<|close|>response<|sep|>", "<|close|>message<|sep|>"
    r, a = random_text(rng), random_text(rng)
    off = {"chat_template_kwargs": {"thinking": False}}
    return {
        "sections": ({}, f"{r}{think_end}{resp}{a}{resp_end}{msg_end}"),
        "sections, open": ({}, f"{r}{think_end}{resp}{a}"),
        "bare reply": ({}, f"{r}{think_end}{a}"),
        "response ends the reasoning": ({}, f"{r}{resp}{a}{resp_end}"),
        "reasoning only": ({}, r),
        "thinking off": (off, f"{a}{resp_end}{msg_end}"),
        "thinking off, open": (off, a),
    }


@pytest.mark.skipif(not (SRC and LLAMA_SERVER and LLAMA_SERVER.exists()),
                    reason="needs llama.cpp's source (MUSER_GGML_SRC) and llama-server "
                           "(LLAMA_CPP_BIN)")
def test_kimi_k3_reads_replies_as_llama_server_does(tmp_path):
    """Kimi K3's template, whose reasoning is a `think` section and whose reply a `response`
    section: random outputs (`kimi_k3_outputs`), forced by a grammar in both servers, are split
    into the same reasoning and reply, streamed or not; its prompts with thinking off are
    llama-server's."""
    model = tiny_model(tmp_path)
    rng = random.Random()
    user = [{"role": "user", "content": random_text(rng)}]
    with both_servers(model, "Kimi-K3.jinja", ctx=4096) as (muser, llama, bos):
        for _ in range(3):
            for case, (kwargs, text) in kimi_k3_outputs(rng).items():
                body = {"messages": user, **kwargs, "grammar": "root ::= " + gbnf_literal(text),
                        "max_tokens": 4 * len(text.encode()) + 16}
                want = reply(llama, body)[:2]
                got = reply(muser, body)[:2]
                assert got == want, (case, text)
                assert reply(muser, body, stream=True)[:2] == got, (case, text)
            # Its prompts with thinking off (the template reads `thinking`, not
            # `enable_thinking`), the same as llama-server's, continued messages included.
            off = {case: {**body, "chat_template_kwargs": {"thinking": False}}
                   for case, body in family_bodies(rng).items()}
            assert not prompt_differences(muser, llama, bos, off)


def harmony_outputs(rng: random.Random) -> dict[str, str]:
    """Outputs gpt-oss may write after its generation prompt (`<|start|>assistant`), by name:
    analysis messages (now and then after a stray commentary header) and commentary preambles,
    then a final message, ended or not."""
    def message() -> str:
        channel = rng.choice(["analysis", "analysis", "commentary"])
        stray = rng.choice(["", "", "<|channel|>commentary",
                            "<|channel|>commentary to=assistant"]) if channel == "analysis" else ""
        return f"{stray}<|channel|>{channel}<|message|>{random_text(rng)}<|end|><|start|>assistant"
    final = f"<|channel|>final<|message|>{random_text(rng)}"
    before = "".join(message() for _ in range(rng.randrange(1, 4)))
    return {"final": final, "messages": before + final,
            "ended": before + final + "<|end|>",
            "reasoning only": before + "<|channel|>analysis<|message|>" + random_text(rng)}


@pytest.mark.skipif(not (SRC and LLAMA_SERVER and LLAMA_SERVER.exists()),
                    reason="needs llama.cpp's source (MUSER_GGML_SRC) and llama-server "
                           "(LLAMA_CPP_BIN)")
def test_gpt_oss_channels_read_as_llama_server_does(tmp_path):
    """gpt-oss's harmony outputs (`harmony_outputs`), forced by a grammar in both servers, are
    split into the same reasoning (its analysis messages) and content (preambles and the final
    message), Muser's streamed as unstreamed; and a continued message's output is read as the
    rest of that message (llama-server's answer repeats the message's own text before it)."""
    model = tiny_model(tmp_path)
    rng = random.Random()
    user = [{"role": "user", "content": random_text(rng)}]
    with both_servers(model, "openai-gpt-oss-120b.jinja", ctx=2048) as (muser, llama, _):
        for _ in range(4):
            for case, text in harmony_outputs(rng).items():
                want = forced_reply(llama, user, text)
                got = forced_reply(muser, user, text)
                assert got == want, (case, text)
                assert forced_reply(muser, user, text, stream=True) == got, (case, text)
        r, a, more = random_text(rng), random_text(rng), random_text(rng)
        for last, text, want in [
            ({"role": "assistant", "content": "", "reasoning_content": r},
             f"{more}<|end|><|start|>assistant<|channel|>final<|message|>{a}", (a, more)),
            ({"role": "assistant", "content": a, "reasoning_content": r}, more, (more, "")),
            ({"role": "assistant", "content": a}, more, (more, "")),
        ]:
            got = forced_reply(muser, user + [last], text)
            assert got == want, (last, text)
            assert forced_reply(muser, user + [last], text, stream=True) == got, (last, text)
            full = forced_reply(llama, user + [last], text)
            prefix = (last["content"], last.get("reasoning_content", ""))
            assert full == (prefix[0] + got[0], prefix[1] + got[1]), (last, text, full)
