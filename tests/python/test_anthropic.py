"""Anthropic's Messages API on `muser serve` (`POST /v1/messages`, `/v1/messages/count_tokens`)
through the real `anthropic` client: a message whole and streamed (the stream helper's final
message must be the whole one), usage equal to the chat endpoint's for the same conversation,
max_tokens, stop sequences, forced tool calls (their input validates against the tool's schema,
and the streamed input_json_delta pieces add up to it), a conversation with tool_use and
tool_result blocks rendered as the equivalent OpenAI messages, thinking split into a thinking
block, count_tokens, `x-api-key`, and every kind of bad request answered in Anthropic's error
shape with its status. Where $LLAMA_CPP_BIN holds llama-server, the same requests go to it too
and Muser's answers must carry its fields (differences listed with their reasons).

The model (models/muse-default.gguf, or `muser synth llama-tiny` beside llama-server) knows
nothing of tools or thinking: calls come from the grammar, reasoning from a template that opens
a `<think>` block.
"""

from __future__ import annotations

import json
import os
import random
import re
import socket
import subprocess
from pathlib import Path

import anthropic
import jsonschema
import openai
import pytest
import requests

from test_llama_server_compat import LlamaServer, shape
from test_server import ServerProcess, muser_bin, post
from test_tool_calls import ADD, HERMES, THINK, WEATHER

MODEL_ID = "muse-default"
N_CTX = 2048
SRC = os.environ.get("MUSER_GGML_SRC")
QWEN3 = Path(SRC, "models", "templates", "Qwen-Qwen3-0.6B.jinja") if SRC else None

# The tools as Anthropic gives them.
TOOLS = [{"name": t["function"]["name"], "description": t["function"]["description"],
          "input_schema": t["function"]["parameters"]} for t in (WEATHER, ADD)]
SCHEMAS = {t["name"]: t["input_schema"] for t in TOOLS}


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    """The model's own template (plain chat), a Hermes template (tool calls) and a template
    that opens a `<think>` block (reasoning)."""
    tmp = tmp_path_factory.mktemp("anthropic")
    (tmp / "hermes.jinja").write_text(HERMES)
    (tmp / "think.jinja").write_text(THINK)
    started = {}
    try:
        for name, template in [("plain", None), ("hermes", tmp / "hermes.jinja"),
                               ("think", tmp / "think.jinja")]:
            args = ["--parallel", "2", "--ctx-size", str(N_CTX), "--threads", "2"]
            if template is not None:
                args += ["--chat-template-file", str(template)]
            started[name] = ServerProcess(*args)
        yield started
    finally:
        for s in started.values():
            s.stop()


# Sampling settings go in the body: the newest clients take no temperature, top_p or top_k.
GREEDY = {"temperature": 0}


def claude(server, **kw) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=server.url, api_key="none", max_retries=0, **kw)


def gpt(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0)


def blocks(message) -> list[dict]:
    return [b.model_dump(exclude_none=True) for b in message.content]


def sse(server, body) -> list[tuple[str, dict]]:
    """The events of a raw streamed request: (event name, data)."""
    r = requests.post(server.url + "/v1/messages", json={**body, "stream": True}, timeout=120,
                      stream=True)
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("text/event-stream")
    out, name = [], None
    for line in r.iter_lines(decode_unicode=True):
        if line.startswith("event: "):
            name = line[7:]
        elif line.startswith("data: "):
            out.append((name, json.loads(line[6:])))
            name = None
    return out


def check_events(events) -> None:
    """Anthropic's order: message_start, then blocks each started, given deltas and stopped
    (indices 0, 1, ... in turn, one open at a time), then message_delta and message_stop."""
    names = [n for n, _ in events]
    assert names[0] == "message_start" and names[-2:] == ["message_delta", "message_stop"], names
    for name, data in events:
        assert data["type"] == name, (name, data)
    open_at, next_at = None, 0
    for name, data in events[1:-2]:
        if name == "content_block_start":
            assert open_at is None and data["index"] == next_at, events
            open_at, next_at = data["index"], next_at + 1
        elif name == "content_block_delta":
            assert data["index"] == open_at, events
        else:
            assert name == "content_block_stop" and data["index"] == open_at, events
            open_at = None
    assert open_at is None


def seeds(n: int) -> list[int]:
    return random.Random().sample(range(1 << 30), n)


CONVERSATION = [{"role": "user", "content": "Tell me a story about a cat."},
                {"role": "assistant", "content": "Once there was a cat."},
                {"role": "user", "content": [{"type": "text", "text": "Go on."},
                                             {"type": "text", "text": "Make it long."}]}]


# --- messages ---------------------------------------------------------------------------------


def test_message_and_its_stream_agree(servers):
    """Seeded sampling: the stream helper's final message is the whole message (content,
    stop_reason, usage), and the raw events come in Anthropic's order."""
    s = servers["plain"]
    c = claude(s)
    for seed in seeds(3):
        kw = dict(model="any-name", max_tokens=30, messages=CONVERSATION, system="Be vivid.",
                  extra_body=dict(temperature=0.9, top_p=0.95, top_k=40, seed=seed))
        whole = c.messages.create(**kw)
        assert whole.type == "message" and whole.role == "assistant"
        assert re.fullmatch(r"msg_[0-9a-f]{16}", whole.id), whole.id
        assert whole.model == MODEL_ID
        assert whole.content and whole.content[0].type == "text" and whole.content[0].text
        with c.messages.stream(**kw) as stream:
            text = "".join(stream.text_stream)
            final = stream.get_final_message()
        assert blocks(final) == blocks(whole), seed
        assert text == whole.content[0].text
        assert (final.stop_reason, final.stop_sequence) == (whole.stop_reason, whole.stop_sequence)
        u, v = final.usage, whole.usage
        assert v.output_tokens == u.output_tokens > 0
        # the second run reads the prompt from the slot's cache
        assert u.input_tokens + u.cache_read_input_tokens == \
            v.input_tokens + v.cache_read_input_tokens
        body = dict(kw, **kw.pop("extra_body"))
        events = sse(s, body)
        check_events(events)
        streamed = "".join(d["delta"]["text"] for n, d in events if n == "content_block_delta")
        assert streamed == whole.content[0].text


def test_usage_and_count_tokens_equal_the_chat_endpoints(servers):
    """The same conversation on /v1/chat/completions and /v1/messages: the same greedy text,
    prompt tokens (input plus those read from the cache) and completion tokens; count_tokens
    counts the same prompt without generating."""
    s = servers["plain"]
    c = claude(s)
    msgs = [{"role": "system", "content": "Be vivid."},
            {"role": "user", "content": "Tell me a story about a cat."},
            {"role": "assistant", "content": "Once there was a cat."},
            {"role": "user", "content": "Go on.\nMake it long."}]
    chat = gpt(s).chat.completions.create(model=MODEL_ID, messages=msgs, max_tokens=25,
                                          temperature=0)
    msg = c.messages.create(model=MODEL_ID, max_tokens=25, messages=CONVERSATION,
                            system=[{"type": "text", "text": "Be vivid."}], extra_body=GREEDY)
    assert msg.content[0].text == chat.choices[0].message.content
    u = msg.usage
    assert u.input_tokens + u.cache_read_input_tokens == chat.usage.prompt_tokens
    assert u.output_tokens == chat.usage.completion_tokens
    assert u.cache_read_input_tokens > 0  # the chat request left the prompt in the slot
    counted = c.messages.count_tokens(model=MODEL_ID, messages=CONVERSATION, system="Be vivid.")
    assert counted.input_tokens == chat.usage.prompt_tokens
    shorter = c.messages.count_tokens(model=MODEL_ID, messages=CONVERSATION[:1])
    assert 0 < shorter.input_tokens < counted.input_tokens


def test_a_final_assistant_message_is_continued(servers):
    """Anthropic's prefill: the reply goes on from a final assistant message, its text the
    chat endpoint's continuation of the same messages."""
    s = servers["plain"]
    msgs = [{"role": "user", "content": "Tell me a story."},
            {"role": "assistant", "content": "Once upon a time"}]
    chat = gpt(s).chat.completions.create(model=MODEL_ID, messages=msgs, max_tokens=12,
                                          temperature=0)
    msg = claude(s).messages.create(model=MODEL_ID, messages=msgs, max_tokens=12,
                                    extra_body=GREEDY)
    assert msg.content[0].text == chat.choices[0].message.content
    assert msg.usage.output_tokens == chat.usage.completion_tokens


def test_max_tokens_and_stop_sequences(servers):
    s = servers["plain"]
    c = claude(s)
    kw = dict(model=MODEL_ID, messages=CONVERSATION, extra_body=GREEDY)
    base = c.messages.create(max_tokens=40, **kw)
    text = base.content[0].text
    if base.stop_reason == "max_tokens":
        assert base.usage.output_tokens == 40
    n = random.randint(1, 10)
    cut = c.messages.create(max_tokens=n, **kw)
    assert (cut.stop_reason, cut.stop_sequence, cut.usage.output_tokens) == ("max_tokens", None, n)
    assert text.startswith(cut.content[0].text)
    word = text.split()[3]
    stopped = c.messages.create(max_tokens=40, stop_sequences=["zzzz", word], **kw)
    assert (stopped.stop_reason, stopped.stop_sequence) == ("stop_sequence", word)
    assert "".join(b.text for b in stopped.content) == text[: text.index(word)]
    with c.messages.stream(max_tokens=40, stop_sequences=["zzzz", word], **kw) as stream:
        final = stream.get_final_message()
    assert (final.stop_reason, final.stop_sequence) == ("stop_sequence", word)
    assert blocks(final) == blocks(stopped)


def test_max_tokens_past_the_context_runs_to_its_end(servers):
    """Claude Code asks for more tokens than a local context holds: the answer runs until the
    context is full (stop_reason model_context_window_exceeded) instead of being refused."""
    s = servers["plain"]
    # (the client refuses to wait for so many tokens unstreamed)
    r = post(s, "/v1/messages", {"model": MODEL_ID, "max_tokens": 1 << 20,
                                 "messages": CONVERSATION, **GREEDY})
    assert r.status_code == 200, r.text
    r = r.json()
    u = r["usage"]
    total = u["input_tokens"] + u["cache_read_input_tokens"] + u["output_tokens"]
    assert total <= N_CTX
    assert r["stop_reason"] in ("end_turn", "model_context_window_exceeded")
    assert (r["stop_reason"] == "model_context_window_exceeded") == (total == N_CTX)
    with claude(s).messages.stream(model=MODEL_ID, max_tokens=1 << 20, messages=CONVERSATION,
                                   extra_body=GREEDY) as stream:
        final = stream.get_final_message()
    assert final.stop_reason == r["stop_reason"]
    assert final.usage.output_tokens == u["output_tokens"]


def check_tool_use(block, names: set[str]) -> None:
    assert block.type == "tool_use" and block.name in names, block
    assert re.fullmatch(r"toolu_[A-Za-z0-9]{24}", block.id), block.id
    jsonschema.validate(block.input, SCHEMAS[block.name])


def without_ids(message) -> list[dict]:
    """The blocks, without the calls' ids (each request draws its own)."""
    return [{k: v for k, v in b.items() if k != "id"} for b in blocks(message)]


@pytest.mark.parametrize("choice", [{"type": "any"}, {"type": "tool", "name": "add"},
                                    {"type": "any", "disable_parallel_tool_use": True}])
def test_forced_tool_calls_validate_and_stream_as_json_deltas(servers, choice):
    """Forced calls come back as tool_use blocks whose input validates against the tool's
    schema (with parallel calls allowed, the model may go on calling until max_tokens cuts the
    last call short: its input is then {} in the whole message, or its markup is text after
    the calls); the stream's helper adds up to the whole message, blocks in the same order,
    and the input_json_delta pieces add up to each input."""
    s = servers["hermes"]
    c = claude(s)
    names = {choice["name"]} if "name" in choice else set(SCHEMAS)
    parallel = not choice.get("disable_parallel_tool_use")
    # (seed 623525631 with "any": two calls, then a third cut short, its markup read as text)
    for seed in seeds(2) + ([623525631] if choice == {"type": "any"} else []):
        kw = dict(model=MODEL_ID, max_tokens=200, tools=TOOLS, tool_choice=choice,
                  messages=[{"role": "user", "content": "Weather in Paris for 3 days?"}],
                  extra_body={"temperature": 0.8, "seed": seed})
        whole = c.messages.create(**kw)
        calls = [b for b in whole.content if b.type == "tool_use"]
        assert calls, whole
        cut = whole.stop_reason == "max_tokens"
        assert whole.stop_reason == "tool_use" or (parallel and cut), whole
        if not parallel:
            assert len(calls) == 1
        for b in calls[:-1] if cut else calls:
            check_tool_use(b, names)
        assert len({b.id for b in calls}) == len(calls)
        with c.messages.stream(**kw) as stream:
            final = stream.get_final_message()
        got, want = without_ids(final), without_ids(whole)
        if cut and want[-1]["type"] == "tool_use":
            # A call cut short: its input is {} whole, what the client's partial reading of the
            # JSON pieces makes of them streamed.
            assert want[-1]["input"] == {} or want[-1]["input"] == got[-1]["input"]
            got[-1]["input"] = want[-1]["input"]
        assert got == want, seed
        events = sse(s, dict(kw, **kw.pop("extra_body")))
        check_events(events)
        pieces: dict[int, str] = {}
        for name, d in events:
            if name == "content_block_start" and d["content_block"]["type"] == "tool_use":
                assert d["content_block"]["input"] == {}
                assert re.fullmatch(r"toolu_[A-Za-z0-9]{24}", d["content_block"]["id"])
                pieces[d["index"]] = ""
            if name == "content_block_delta" and d["delta"]["type"] == "input_json_delta":
                pieces[d["index"]] += d["delta"]["partial_json"]
        n = len(pieces) - 1 if cut else len(pieces)
        got = [json.loads(pieces[i]) for i in sorted(pieces)[:n]]
        assert got == [b.input for b in calls[:n]]
        assert events[-2][1]["delta"]["stop_reason"] == whole.stop_reason


def test_auto_tools_answer_or_call(servers):
    c = claude(servers["hermes"])
    for seed in seeds(3):
        r = c.messages.create(model=MODEL_ID, max_tokens=120, tools=TOOLS,
                              messages=[{"role": "user", "content": "Add 2 and 3"}],
                              extra_body={"temperature": 1.0, "seed": seed})
        calls = [b for b in r.content if b.type == "tool_use"]
        for b in calls:
            check_tool_use(b, set(SCHEMAS))
        if r.stop_reason == "tool_use":
            assert calls
        # tool_choice none: no call is read
        r = c.messages.create(model=MODEL_ID, max_tokens=30, tools=TOOLS,
                              tool_choice={"type": "none"},
                              messages=[{"role": "user", "content": "Add 2 and 3"}],
                              extra_body={"temperature": 1.0, "seed": seed})
        assert all(b.type == "text" for b in r.content) and r.stop_reason != "tool_use"


def test_a_conversation_with_tool_use_renders_as_its_openai_messages(servers):
    """tool_use and tool_result blocks (a string result, text blocks, an error) are counted,
    and answered, as the same conversation in OpenAI's messages."""
    s = servers["hermes"]
    c = claude(s)
    args = {"city": "Paris", "days": 3}
    anth = [
        {"role": "user", "content": "Weather in Paris, and 2+3?"},
        {"role": "assistant", "content": [
            {"type": "text", "text": "Let me check."},
            {"type": "tool_use", "id": "toolu_abc", "name": "get_weather", "input": args},
            {"type": "tool_use", "id": "toolu_def", "name": "add", "input": {"a": 2, "b": 3}}]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "toolu_abc",
             "content": [{"type": "text", "text": "Sunny"}, {"type": "text", "text": "20 C"}]},
            {"type": "tool_result", "tool_use_id": "toolu_def", "content": "overflow",
             "is_error": True},
            {"type": "text", "text": "Thanks!", "cache_control": {"type": "ephemeral"}}]},
    ]
    compact = lambda v: json.dumps(v, separators=(",", ":"))  # noqa: E731
    oai = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather in Paris, and 2+3?"},
        {"role": "assistant", "content": "Let me check.", "tool_calls": [
            {"id": "call_abc", "type": "function",
             "function": {"name": "get_weather", "arguments": compact(args)}},
            {"id": "call_def", "type": "function",
             "function": {"name": "add", "arguments": compact({"a": 2, "b": 3})}}]},
        {"role": "tool", "tool_call_id": "call_abc", "content": "Sunny\n20 C"},
        {"role": "tool", "tool_call_id": "call_def", "content": "overflow"},
        {"role": "user", "content": "Thanks!"},
    ]
    tools = [WEATHER, ADD]
    prompt = post(s, "/apply-template", {"messages": oai, "tools": tools,
                                         "parallel_tool_calls": True}).json()["prompt"]
    assert "call_abc" in prompt or "Sunny\n20 C" in prompt
    chat = gpt(s).chat.completions.create(model=MODEL_ID, messages=oai, tools=tools,
                                          parallel_tool_calls=True, max_tokens=20, temperature=0)
    counted = c.messages.count_tokens(model=MODEL_ID, system="Be brief.", messages=anth,
                                      tools=TOOLS)
    assert counted.input_tokens == chat.usage.prompt_tokens
    msg = c.messages.create(model=MODEL_ID, system="Be brief.", messages=anth, tools=TOOLS,
                            max_tokens=20, extra_body=GREEDY)
    u = msg.usage
    assert u.input_tokens + u.cache_read_input_tokens == chat.usage.prompt_tokens
    assert u.output_tokens == chat.usage.completion_tokens
    text = "".join(b.text for b in msg.content if b.type == "text")
    assert text == (chat.choices[0].message.content or "")
    # A different result is a different prompt (the results are read, not dropped).
    other = json.loads(json.dumps(anth))
    other[2]["content"][0]["content"][1]["text"] = "25 C and windy"
    assert c.messages.count_tokens(model=MODEL_ID, system="Be brief.", messages=other,
                                   tools=TOOLS).input_tokens != counted.input_tokens


def test_thinking_comes_back_as_a_thinking_block(servers):
    """A template that opens a <think> block: the reasoning is a thinking block (with an empty
    signature), exactly the chat endpoint's reasoning_content, streamed as thinking_delta
    events that add up to it; thinking blocks in the history are accepted."""
    s = servers["think"]
    c = claude(s)
    history = [{"role": "user", "content": "Hi"},
               {"role": "assistant", "content": [
                   {"type": "thinking", "thinking": "secret", "signature": "sig"},
                   {"type": "redacted_thinking", "data": "opaque"},
                   {"type": "text", "text": "Hello"}]},
               {"role": "user", "content": "Why?"}]
    oai = [{"role": "user", "content": "Hi"},
           {"role": "assistant", "content": "Hello", "reasoning_content": "secret"},
           {"role": "user", "content": "Why?"}]
    for seed in seeds(2):
        kw = dict(model=MODEL_ID, max_tokens=30, extra_body={"temperature": 0.9, "seed": seed})
        chat = gpt(s).chat.completions.create(messages=oai, seed=seed, max_tokens=30,
                                              temperature=0.9, model=MODEL_ID)
        reasoning = chat.choices[0].message.model_extra["reasoning_content"]
        whole = c.messages.create(messages=history,
                                  thinking={"type": "enabled", "budget_tokens": 1024}, **kw)
        assert blocks(whole)[0] == {"type": "thinking", "thinking": reasoning, "signature": ""}
        with c.messages.stream(messages=history, **kw) as stream:
            final = stream.get_final_message()
        assert blocks(final) == blocks(whole)
        events = sse(s, dict(kw, messages=history, **kw.pop("extra_body")))
        check_events(events)
        thought = "".join(d["delta"].get("thinking", "") for n, d in events
                          if n == "content_block_delta")
        assert thought == reasoning
        sig = [d for n, d in events if n == "content_block_delta"
               and d["delta"]["type"] == "signature_delta"]
        assert len(sig) == 1 and sig[0]["index"] == 0


@pytest.mark.skipif(not (QWEN3 and QWEN3.exists()), reason="needs llama.cpp's Qwen 3 template")
def test_thinking_switch_reaches_the_template(tmp_path):
    """Qwen 3's template: thinking disabled is the chat endpoint's enable_thinking false (an
    empty think block in the prompt), enabled or left out its default."""
    s = ServerProcess("--chat-template-file", str(QWEN3), "--ctx-size", "1024", "--threads", "2")
    try:
        c = claude(s)
        msgs = [{"role": "user", "content": "Hi"}]

        def count(**kw):
            return c.messages.count_tokens(model=MODEL_ID, messages=msgs, **kw).input_tokens

        def chat_count(**kw):
            return gpt(s).chat.completions.create(model=MODEL_ID, messages=msgs, max_tokens=1,
                                                  **kw).usage.prompt_tokens

        off = chat_count(extra_body={"chat_template_kwargs": {"enable_thinking": False}})
        on = chat_count()
        assert off > on
        assert count(thinking={"type": "disabled"}) == off
        assert count(thinking={"type": "enabled", "budget_tokens": 2000}) == on == count()
    finally:
        s.stop()


def test_a_claude_code_request(servers):
    """A request shaped as Claude Code sends them (its billing header in the system prompt,
    cache_control marks, beta headers, fields this server does not use) streams; the header's
    `cch` value, new in each request, does not keep the next request from reusing the prompt
    from the slot's cache."""
    s = servers["hermes"]

    def body(cch: str) -> dict:
        return {
            "model": "claude-sonnet-4-5", "max_tokens": 32000, "stream": True,
            "system": [{"type": "text", "text": f"x-anthropic-billing-header: cc_version=2.1.5; "
                                                f"cc_entrypoint=cli; cch={cch};"},
                       {"type": "text", "text": "You are Claude Code.",
                        "cache_control": {"type": "ephemeral"}}],
            "messages": [{"role": "user", "content": [
                {"type": "text", "text": "List the files.",
                 "cache_control": {"type": "ephemeral"}}]}],
            "tools": [{"name": "Bash", "description": "Runs a command.",
                       "input_schema": {"$schema": "http://json-schema.org/draft-07/schema#",
                                        "type": "object", "additionalProperties": False,
                                        "properties": {"command": {"type": "string"}},
                                        "required": ["command"]}}],
            "metadata": {"user_id": "user_abc"}, "thinking": {"type": "adaptive"},
            "context_management": {"edits": []}, "output_config": {"effort": "high"},
            "temperature": 1,
        }

    headers = {"anthropic-version": "2023-06-01", "anthropic-beta": "claude-code-20250219",
               "x-api-key": "unused"}
    usages = []
    for cch in ["a5145", "07e2c"]:
        # (Claude Code asks with ?beta=true)
        r = requests.post(s.url + "/v1/messages?beta=true", json=body(cch), headers=headers,
                          timeout=120, stream=True)
        assert r.status_code == 200, r.text
        events = [json.loads(line[6:]) for line in r.iter_lines(decode_unicode=True)
                  if line.startswith("data: ")]
        assert [e["type"] for e in events[-2:]] == ["message_delta", "message_stop"]
        usages.append(events[-2]["usage"])
    first, second = usages
    prompt = first["input_tokens"] + first["cache_read_input_tokens"]
    assert second["input_tokens"] + second["cache_read_input_tokens"] == prompt
    # (a slot keeps the whole prompt, but the last token is always computed again)
    assert second["cache_read_input_tokens"] >= prompt - 1, usages


# --- errors and keys --------------------------------------------------------------------------

USER = [{"role": "user", "content": "hi"}]
BAD = [
    ("no max_tokens", {"messages": USER}, 400, "max_tokens is required"),
    ("max_tokens text", {"messages": USER, "max_tokens": "10"}, 400, "max_tokens must be"),
    ("no messages", {"max_tokens": 5}, 400, "messages is required"),
    ("empty messages", {"max_tokens": 5, "messages": []}, 400, "at least one message"),
    ("bad role", {"max_tokens": 5, "messages": [{"role": "tool", "content": "x"}]}, 400,
     "messages[0].role"),
    ("system role", {"max_tokens": 5, "messages": [{"role": "system", "content": "x"}]}, 400,
     "top-level system"),
    ("bad block", {"max_tokens": 5, "messages": [{"role": "user", "content": [
        {"type": "video", "url": "x"}]}]}, 400, "messages[0].content[0].type \"video\""),
    ("image", {"max_tokens": 5, "messages": [{"role": "user", "content": [
        {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                     "data": "iVBORw0KGgo="}}]}]}, 400, "image blocks are not"),
    ("image result", {"max_tokens": 5, "messages": [{"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "t", "content": [{"type": "image"}]}]}]}, 400,
     "image blocks are not"),
    ("tool_use input", {"max_tokens": 5, "messages": [{"role": "assistant", "content": [
        {"type": "tool_use", "id": "t", "name": "f", "input": "{}"}]}]}, 400,
     "input must be an object"),
    ("server tool", {"max_tokens": 5, "messages": USER, "tools": [
        {"type": "web_search_20250305", "name": "web_search"}]}, 400, "only custom tools"),
    ("unknown tool", {"max_tokens": 5, "messages": USER, "tools": TOOLS,
                      "tool_choice": {"type": "tool", "name": "nope"}}, 400, "nope"),
    ("bad stop", {"max_tokens": 5, "messages": USER, "stop_sequences": [""]}, 400,
     "stop_sequences"),
    ("bad thinking", {"max_tokens": 5, "messages": USER, "thinking": {"type": "always"}}, 400,
     "thinking.type"),
    ("bad temperature", {"max_tokens": 5, "messages": USER, "temperature": "hot"}, 400,
     "temperature"),
    ("past the context", {"max_tokens": 5, "messages": [
        {"role": "user", "content": "cat " * (2 * N_CTX)}]}, 400, "prompt is too long: "),
    ("not json", "{\"max_tokens\": 5,", 400, "not valid JSON"),
]


# What count_tokens does not read (it generates nothing).
GENERATING_ONLY = {"no max_tokens", "max_tokens text", "bad temperature", "past the context"}


@pytest.mark.parametrize("name,body,status,says", BAD, ids=[b[0] for b in BAD])
def test_bad_requests_get_anthropics_error_shape(servers, name, body, status, says):
    s = servers["plain"]
    for path in ["/v1/messages", "/v1/messages/count_tokens"]:
        if path.endswith("count_tokens") and name in GENERATING_ONLY:
            continue
        r = post(s, path, body)
        assert r.status_code == status, (path, r.text)
        e = r.json()
        assert e["type"] == "error" and set(e) == {"type", "error"}, e
        assert e["error"]["type"] == "invalid_request_error", e
        assert says in e["error"]["message"], (path, e)
    # The client raises it with the message.
    if isinstance(body, dict) and isinstance(body.get("max_tokens"), int) and "messages" in body:
        rest = {k: v for k, v in body.items() if k not in ("max_tokens", "messages")}
        with pytest.raises(anthropic.BadRequestError, match=re.escape(says)):
            claude(s).messages.create(model=MODEL_ID, max_tokens=body["max_tokens"],
                                      messages=body["messages"], extra_body=rest)


def test_a_prompt_past_the_context_is_too_long_as_anthropic_says_it(servers):
    """Claude Code compacts its conversation when told "prompt is too long: N tokens > M
    maximum"; N is what count_tokens counts."""
    s = servers["plain"]
    body = {"max_tokens": 5, "messages": [{"role": "user", "content": "cat " * (2 * N_CTX)}]}
    n = post(s, "/v1/messages/count_tokens", body).json()["input_tokens"]
    assert n > N_CTX
    e = post(s, "/v1/messages", body).json()["error"]
    assert e["message"].startswith(f"prompt is too long: {n} tokens > {N_CTX - 1} maximum"), e


def test_other_methods_get_anthropics_error_shape(servers):
    s = servers["plain"]
    for path in ["/v1/messages", "/v1/messages/count_tokens"]:
        r = requests.get(s.url + path, timeout=10)
        assert r.status_code == 405 and r.json()["error"]["type"] == "invalid_request_error"
    # and the server still answers
    assert claude(s).messages.create(model=MODEL_ID, max_tokens=2, messages=USER).content


def test_busy_server_and_large_body_refusals():
    """Every slot busy and no queue: 503 overloaded_error; a body past the limit: 413
    request_too_large; both in Anthropic's shape."""
    s = ServerProcess("--parallel", "1", "--max-queue", "0", "--ctx-size", "8192",
                      "--threads", "2")
    try:
        big = json.dumps({"max_tokens": 5, "messages": [{"role": "user",
                                                         "content": "x" * (9 << 20)}]})
        r = post(s, "/v1/messages", big)
        assert r.status_code == 413
        assert r.json()["error"]["type"] == "request_too_large", r.text
        # ignore_eos: the stream holds the only slot until it is closed.
        hold = requests.post(s.url + "/v1/completions", stream=True, timeout=60, json={
            "prompt": "Once upon a time", "max_tokens": 8000, "stream": True,
            "ignore_eos": True})
        lines = hold.iter_lines()
        for line in lines:
            if line.startswith(b"data: {"):
                break
        r = post(s, "/v1/messages", {"max_tokens": 5, "messages": USER})
        assert r.status_code == 503
        assert r.json()["type"] == "error" and r.json()["error"]["type"] == "overloaded_error"
        hold.close()
        del lines
        s.wait_metric("requests_processing", lambda v: v == 0)
        assert claude(s).messages.create(model=MODEL_ID, max_tokens=2, messages=USER).content
    finally:
        s.stop()


def test_x_api_key(tmp_path):
    s = ServerProcess("--api-key", "sesame", "--ctx-size", "512", "--threads", "2")
    try:
        ok = claude(s).__class__(base_url=s.url, api_key="sesame", max_retries=0)
        assert ok.messages.create(model=MODEL_ID, max_tokens=2, messages=USER).content
        assert ok.messages.count_tokens(model=MODEL_ID, messages=USER).input_tokens > 0
        for path in ["/v1/messages", "/v1/messages/count_tokens"]:
            r = requests.post(s.url + path, json={"max_tokens": 2, "messages": USER},
                              headers={"x-api-key": "wrong"}, timeout=10)
            assert r.status_code == 401
            assert r.json() == {"type": "error", "error": {
                "type": "authentication_error", "message": r.json()["error"]["message"]}}
        with pytest.raises(anthropic.AuthenticationError):
            claude(s).messages.create(model=MODEL_ID, max_tokens=2, messages=USER)
        # x-api-key opens the OpenAI routes too, as in llama-server; a bearer key /v1/messages.
        r = requests.post(s.url + "/v1/chat/completions", headers={"x-api-key": "sesame"},
                          json={"messages": USER, "max_tokens": 2}, timeout=30)
        assert r.status_code == 200, r.text
        r = requests.post(s.url + "/v1/messages", headers={"Authorization": "Bearer sesame"},
                          json={"messages": USER, "max_tokens": 2}, timeout=30)
        assert r.status_code == 200, r.text
    finally:
        s.stop()


# --- beside llama-server ----------------------------------------------------------------------

LLAMA_BIN = os.environ.get("LLAMA_CPP_BIN")
LLAMA_SERVER = Path(LLAMA_BIN, "llama-server") if LLAMA_BIN else None

COMPARED = {
    "message": {"model": "m", "max_tokens": 6, "temperature": 0, "system": "Be brief.",
                "messages": CONVERSATION},
    "stop sequence": {"model": "m", "max_tokens": 30, "temperature": 0,
                      "messages": CONVERSATION, "stop_sequences": ["e"]},
    "tool history": {"model": "m", "max_tokens": 8, "temperature": 0, "tools": TOOLS,
                     "system": "Be brief.", "messages": [
                         {"role": "user", "content": "Weather in Paris?"},
                         {"role": "assistant", "content": [
                             {"type": "text", "text": "Let me check."},
                             {"type": "tool_use", "id": "toolu_1", "name": "get_weather",
                              "input": {"city": "Paris", "days": 3}}]},
                         {"role": "user", "content": [
                             {"type": "tool_result", "tool_use_id": "toolu_1",
                              "content": [{"type": "text", "text": "Sunny"}]}]}]},
}
# llama-server forces no call on this model (its grammar for Qwen 2.5's calls does not take
# hold here), so with tools only the prompt (count_tokens, usage) and the fields compare.
SAME_CONTENT = {"message", "stop sequence"}
# (request, field path, why Muser differs).
DIFFERENCES = {
    ("stop sequence", ".stop_reason"):
        "llama-server says end_turn for a stop sequence; Muser says stop_sequence, as Anthropic",
}


@pytest.fixture(scope="module")
def beside(tmp_path_factory):
    if not (LLAMA_SERVER and LLAMA_SERVER.exists()):
        pytest.skip("set LLAMA_CPP_BIN to a folder with llama.cpp's llama-server")
    tmp = tmp_path_factory.mktemp("beside")
    model = tmp / "llama-tiny.gguf"
    subprocess.run([str(muser_bin()), "synth", "llama-tiny", str(model)], check=True,
                   capture_output=True)
    # llama.cpp's own Qwen 2.5 template, whose tool calls both servers know (llama-server does
    # not take the test's Hermes template for one).
    qwen = Path(SRC, "models", "templates", "Qwen-Qwen2.5-7B-Instruct.jinja") if SRC else None
    if not (qwen and qwen.exists()):
        pytest.skip("needs llama.cpp's templates ($MUSER_GGML_SRC)")
    template = ["--chat-template-file", str(qwen)]
    muser = ServerProcess("--parallel", "2", "--ctx-size", "2048", *template, model=model)
    try:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        llama = LlamaServer(model, port, "--jinja", *template)
    except Exception:
        muser.stop()
        raise
    yield muser, llama
    muser.stop()
    llama.stop()


@pytest.mark.parametrize("name", list(COMPARED))
def test_answers_carry_llama_servers_fields(beside, name):
    """Every field of llama-server's message is in Muser's with the same JSON type; the stop
    reasons, the usage and the text agree (both engines run the file greedily)."""
    muser, llama = beside
    body = COMPARED[name]
    want = requests.post(llama.url + "/v1/messages", json=body, timeout=120).json()
    got = requests.post(muser.url + "/v1/messages", json=body, timeout=120).json()
    w, g = shape(want), shape(got)
    missing = [p for p in w if p not in g]
    assert not missing, (missing, want, got)
    clash = [(p, w[p], g[p]) for p in w if p in g and "null" not in (w[p], g[p])
             and w[p] != g[p] and (name, p) not in DIFFERENCES]
    assert not clash, clash
    if name in SAME_CONTENT:
        assert got["content"] == want["content"]
        if name != "stop sequence":
            assert got["stop_reason"] == want["stop_reason"]
        else:
            assert (got["stop_reason"], want["stop_reason"]) == ("stop_sequence", "end_turn")
            assert got["stop_sequence"] == want["stop_sequence"] == "e"
        assert got["usage"]["output_tokens"] == want["usage"]["output_tokens"]
    assert sum(got["usage"].values()) - got["usage"]["output_tokens"] == \
        sum(want["usage"].values()) - want["usage"]["output_tokens"]
    cw = requests.post(llama.url + "/v1/messages/count_tokens", json=body, timeout=60).json()
    cg = requests.post(muser.url + "/v1/messages/count_tokens", json=body, timeout=60).json()
    assert cg == cw


@pytest.mark.parametrize("name", list(COMPARED))
def test_streams_send_llama_servers_events(beside, name):
    """The same events, in the same order, with the same fields (llama-server's own stream
    added up is its message)."""
    muser, llama = beside
    body = COMPARED[name]
    want, got = sse(llama, body), sse(muser, body)
    if name in SAME_CONTENT:
        assert [n for n, _ in got] == [n for n, _ in want], (got, want)
    else:
        want, got = want[:1] + want[-2:], got[:1] + got[-2:]
    for (n, w), (_, g) in zip(want, got):
        fw, fg = shape(w), shape(g)
        missing = [p for p in fw if p not in fg]
        assert not missing, (n, missing, w, g)
