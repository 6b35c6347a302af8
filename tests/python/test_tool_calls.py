"""Tool calling through `muser serve` and the real `openai` client: OpenAI's `tools`,
`tool_choice` and `parallel_tool_calls` on /v1/chat/completions, in the formats Muser knows
(the format the chat template teaches its model):

- generic: any other template (here the default model's plain fallback): the reply is one JSON
  object, `tool_call(s)` or `response`, described in the system prompt and held by a grammar;
- hermes: `<tool_call>{"name": ..., "arguments": ...}</tool_call>` (Qwen 2.5 and 3, Hermes);
- with llama.cpp's real templates (models/templates, read from $MUSER_GGML_SRC when it is
  there): atem (Muse Glimmer's channels and `<atem:function_calls>` blocks), qwen3-coder
  (`<function=...><parameter=...>` XML: Qwen3-Coder, Qwen 3.5), llama3 (and Llama 3.1's built-in
  tools after `<|python_tag|>`), mistral-nemo, mistral
  (Small 3.2; Ministral 3, its `[THINK]` reasoning before the calls), deepseek-r1,
  deepseek-v3.1, gemma4 (Gemma 4's `<|tool_call>call:NAME{...}<tool_call|>`, its thought
  channel before the calls; both of its templates), the XML formats seed-oss
  (`<seed:tool_call>`), minimax-m2 (`<minimax:tool_call><invoke name=...>`) and glm-4.5
  (`<tool_call>NAME<arg_key>...`: GLM 4.6, and 4.7 whose prompt opens a `<think>` block),
  DeepSeek V3.2's and V4's DSML (`<｜DSML｜invoke name=...><｜DSML｜parameter name=... string=...>`),
  minicpm5 (`<function name=...><param name=...>`),
  kimi-k2, the JSON lists of nemotron-v2, command-r7b, cohere2moe and granite, and harmony
  (gpt-oss).

The model (models/muse-default.gguf) knows nothing of tools: every call it makes comes from the
grammar's choices, so each must name a given tool and its arguments must validate against that
tool's JSON schema (the `jsonschema` package). Streamed answers must add up to the unstreamed
ones. Lazy grammars (`grammar_lazy`, `grammar_triggers`) are checked on /completion.
"""

from __future__ import annotations

import json
import os
import random
import re
from pathlib import Path

import jsonschema
import openai
import pytest
import requests

from test_server import ServerProcess, completion_native, post

SRC = os.environ.get("MUSER_GGML_SRC")
TEMPLATES = Path(SRC) / "models" / "templates" if SRC else None

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 20},
                "days": {"type": "integer", "minimum": 1, "maximum": 7},
                "unit": {"enum": ["C", "F"]},
            },
            "required": ["city", "days"],
        },
    },
}
ADD = {
    "type": "function",
    "function": {
        "name": "add",
        "description": "Adds numbers.",
        "parameters": {
            "type": "object",
            "properties": {
                "a": {"type": "number"},
                "b": {"type": "number"},
                "exact": {"type": "boolean"},
                "tags": {"type": "array", "items": {"type": "string", "maxLength": 6},
                         "maxItems": 3},
            },
            "required": ["a", "b"],
        },
    },
}
# No description and no parameters: templates get "" and {} (as llama.cpp gives them).
PING = {"type": "function", "function": {"name": "ping"}}
TOOLS = [WEATHER, ADD, PING]
SCHEMAS = {t["function"]["name"]: t["function"].get("parameters", {"type": "object"})
           for t in TOOLS}
MESSAGES = [{"role": "user", "content": "What is the weather in Paris for 3 days?"}]

# A Hermes-style template written for this test (the real Qwen 2.5 one is used too, when
# llama.cpp's source is here).
HERMES = """{%- if tools %}<|im_start|>system
You may call these tools:
<tools>
{%- for t in tools %}
{{ t | tojson }}
{%- endfor %}
</tools>
Call one as <tool_call>{"name": ..., "arguments": ...}</tool_call>.<|im_end|>
{% endif %}
{%- for m in messages %}<|im_start|>{{ m.role }}
{% if m.tool_calls %}{% for c in m.tool_calls %}<tool_call>
{{ {"name": c.function.name, "arguments": c.function.arguments} | tojson }}
</tool_call>{% endfor %}{% else %}{{ m.content }}{% endif %}<|im_end|>
{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant
{% endif %}"""


def template_files(tmp: Path) -> dict[str, Path | None]:
    """The templates to run, by format: None is the model's own (the fallback: generic)."""
    own = tmp / "hermes.jinja"
    own.write_text(HERMES)
    out: dict[str, Path | None] = {"generic": None, "hermes": own}
    if TEMPLATES is not None:
        for name, fmt in [("Qwen-Qwen2.5-7B-Instruct.jinja", "hermes-qwen"),
                          ("Qwen-Qwen3-0.6B.jinja", "hermes-think"),
                          ("muse-glimmer.jinja", "atem"),
                          ("Qwen3-Coder.jinja", "qwen3-coder"),
                          ("Qwen3.5-4B.jinja", "qwen3-coder-think"),
                          ("meta-llama-Llama-3.2-3B-Instruct.jinja", "llama3"),
                          ("mistralai-Mistral-Nemo-Instruct-2407.jinja", "mistral-nemo"),
                          ("Mistral-Small-3.2-24B-Instruct-2506.jinja", "mistral"),
                          ("mistralai-Ministral-3-14B-Reasoning-2512.jinja", "mistral-think"),
                          ("deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja", "deepseek-r1"),
                          ("deepseek-ai-DeepSeek-V3.1.jinja", "deepseek-v3.1"),
                          ("google-gemma-4-31B-it.jinja", "gemma4-think"),
                          ("google-gemma-4-31B-it-interleaved.jinja", "gemma4-interleaved"),
                          ("Kimi-K2-Instruct.jinja", "kimi-k2"),
                          ("moonshotai-Kimi-K2.jinja", "kimi-k2-moonshot"),
                          ("Kimi-K2-Thinking.jinja", "kimi-k2-think"),
                          ("NVIDIA-Nemotron-Nano-v2.jinja", "nemotron-v2-think"),
                          ("CohereForAI-c4ai-command-r7b-12-2024-tool_use.jinja", "command-r7b"),
                          ("Cohere2MoE.jinja", "cohere2moe"),
                          ("ibm-granite-granite-3.3-2B-Instruct.jinja", "granite"),
                          ("openai-gpt-oss-120b.jinja", "harmony"),
                          ("ByteDance-Seed-OSS.jinja", "seed-oss"),
                          ("MiniMax-M2.jinja", "minimax-m2-think"),
                          ("MiniMax-M3.jinja", "minimax-m3-think"),
                          ("GLM-4.6.jinja", "glm-4.5"),
                          ("GLM-4.7-Flash.jinja", "glm-4.5-think"),
                          ("LFM2-8B-A1B.jinja", "lfm2"),
                          ("LFM2.5-8B-A1B.jinja", "lfm2-think"),
                          ("LFM2.5-Instruct.jinja", "lfm2-instruct"),
                          ("deepseek-ai-DeepSeek-V3.2.jinja", "deepseek-v3.2-think"),
                          ("deepseek-ai-DeepSeek-V4.jinja", "deepseek-v4-think"),
                          ("openbmb-MiniCPM5-1B.jinja", "minicpm5-think"),
                          ("upstage-Solar-Open-100B.jinja", "solar-open"),
                          ("meetkai-functionary-medium-v3.1.jinja", "functionary-v3.1"),
                          ("meetkai-functionary-medium-v3.2.jinja", "functionary-v3.2"),
                          ("inclusionai-ling-3.0-flash.jinja", "ling-3"),
                          ("tencent-Hy3.jinja", "hy3"),
                          ("Kimi-K3.jinja", "kimi-k3"),
                          ("unsloth-Apriel-1.5.jinja", "apriel"),
                          ("Apriel-1.6-15b-Thinker-fixed.jinja", "apriel-think"),
                          ("fireworks-ai-llama-3-firefunction-v2.jinja", "firefunction-v2"),
                          ("MiniMax-M1.jinja", "minimax-m1"),
                          ("GigaChat3-10B-A1.8B.jinja", "gigachat-v3"),
                          ("GigaChat3.1-10B-A1.8B.jinja", "gigachat-v3.1")]:
            if (TEMPLATES / name).exists():
                out[fmt] = TEMPLATES / name
    return out


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("templates")
    started = {}
    try:
        for fmt, path in template_files(tmp).items():
            args = ["--parallel", "4", "--ctx-size", "4096", "--threads", "2"]
            if path is not None:
                args += ["--chat-template-file", str(path)]
            started[fmt] = ServerProcess(*args)
        yield started
    finally:
        for s in started.values():
            s.stop()


def client_of(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0)


# Formats whose templates think in <think> tags, Seed-OSS's <seed:think>, MiniMax M3's
# <mm:think> or Cohere's (the model here never closes the block by itself, so a forced call
# after it may be cut by max_tokens). Granite 3.3's template names <think> in its system
# prompt; Apriel 1.6 reasons up to [BEGIN FINAL RESPONSE]. Hy3 thinks only when asked, but its
# long tags, spelt out in this model's tokens, may run a call past max_tokens. Kimi K3's
# template opens its think section unless asked not to.
THINKING = {"atem", "hermes-think", "qwen3-coder-think", "mistral-think", "deepseek-r1",
            "deepseek-v3.1", "gemma4-think", "gemma4-interleaved", "kimi-k2-think",
            "nemotron-v2-think", "command-r7b", "cohere2moe", "granite", "harmony",
            "minimax-m2-think", "minimax-m3-think", "glm-4.5", "glm-4.5-think", "seed-oss",
            "lfm2-think", "deepseek-v3.2-think", "deepseek-v4-think", "minicpm5-think", "ling-3",
            "hy3", "apriel-think", "kimi-k3"}

# Formats whose forced calls may come after content: gpt-oss's commentary preambles.
PREAMBLES = {"harmony"}


def id_pattern(fmt: str) -> str:
    """Mistral's templates take only ids of 9 letters and digits back; Kimi K2 writes its
    own, `functions.NAME:IDX`, and Solar Open 10 lowercase letters and digits (OpenAI's where
    it repeats one); the others get OpenAI's."""
    if fmt.startswith("mistral"):
        return r"[A-Za-z0-9]{9}"
    if fmt.startswith("kimi"):
        return r"functions\.[A-Za-z0-9_.-]+:[0-9]+|call_[A-Za-z0-9]{24}"
    if fmt.startswith("solar"):
        return r"[a-z0-9]{10}|call_[A-Za-z0-9]{24}"
    return r"call_[A-Za-z0-9]{24}"


def check_calls(calls, allowed: set[str], parallel: bool, fmt: str, cut: bool = False) -> None:
    """Each call names an allowed tool, its arguments validate, its id has the format's shape
    and is new. With `cut` (max_tokens ended the answer) the last call's arguments may stop
    short: they are what the model wrote before the cut."""
    assert calls, "no tool call"
    if not parallel:
        assert len(calls) == 1, calls
    ids = set()
    for i, c in enumerate(calls):
        assert c.type == "function"
        assert c.function.name in allowed, c.function.name
        try:
            args = json.loads(c.function.arguments)
        except json.JSONDecodeError:
            assert cut and i == len(calls) - 1, (fmt, c)
            args = None
        if args is not None:
            jsonschema.validate(args, SCHEMAS[c.function.name])
        assert re.fullmatch(id_pattern(fmt), c.id), (fmt, c.id)
        ids.add(c.id)
    assert len(ids) == len(calls), "tool call ids repeat"


def streamed(client, **kw):
    """The streamed answer added up: content, reasoning, calls by index (each with the number
    of chunks its arguments came in), finish reason."""
    content, reasoning, calls, finish = "", "", {}, None
    for chunk in client.chat.completions.create(stream=True, **kw):
        if not chunk.choices:
            continue
        ch = chunk.choices[0]
        d = ch.delta
        content += d.content or ""
        reasoning += getattr(d, "reasoning_content", None) or (d.model_extra or {}).get(
            "reasoning_content", "") or ""
        for c in d.tool_calls or []:
            e = calls.setdefault(c.index, {"id": None, "name": "", "arguments": "", "pieces": 0})
            e["id"] = c.id or e["id"]
            if c.function is not None:
                e["name"] += c.function.name or ""
                e["arguments"] += c.function.arguments or ""
                e["pieces"] += bool(c.function.arguments)
        finish = ch.finish_reason or finish
    return content, reasoning, [calls[i] for i in sorted(calls)], finish


def reasoning_of(msg) -> str:
    return (msg.model_extra or {}).get("reasoning_content") or ""


def test_each_template_gets_its_format(servers):
    """/props names the format detected from each template's source."""
    for fmt, server in servers.items():
        want = re.sub(r"-(think|qwen|moonshot|interleaved|instruct)$", "", fmt)
        got = requests.get(server.url + "/props", timeout=30).json()["chat_format"]
        assert got == want, (fmt, got)


# Formats whose calls are streamed only once whole (Mistral Nemo writes a call's id after its
# arguments, and a call is sent with its id).
WHOLE_CALLS = {"mistral-nemo"}


@pytest.mark.parametrize("choice", ["required", "named"])
def test_forced_calls_name_a_tool_and_validate_streamed_or_not(servers, choice):
    """Forced calls name an allowed tool and validate; streamed, they add up to the same calls,
    their arguments arriving in pieces as the model writes them."""
    rng = random.Random()
    for fmt, server in servers.items():
        long_args, in_pieces = 0, 0
        client = client_of(server)
        for i in range(3):
            parallel = i == 2
            seed = rng.randrange(1 << 30)
            temperature = rng.choice([0.0, 0.8, 1.3])
            if choice == "named":
                pick = rng.choice(TOOLS)["function"]["name"]
                tool_choice = {"type": "function", "function": {"name": pick}}
                allowed = {pick}
            else:
                tool_choice, allowed = "required", set(SCHEMAS)
            kw = dict(model="muse-default", messages=MESSAGES, tools=TOOLS,
                      tool_choice=tool_choice, parallel_tool_calls=parallel, seed=seed,
                      temperature=temperature, max_tokens=400)
            r = client.chat.completions.create(**kw)
            ch = r.choices[0]
            where = f"{fmt} {choice} seed {seed} t {temperature} parallel {parallel}"
            # Parallel calls may go on until max_tokens cuts one ("length"; the cut call comes
            # back as far as it was written, as OpenAI's API gives it), and so may ATEM's
            # reasoning messages or Qwen 3's <think> block before the call (this model never
            # stops reasoning by itself); otherwise the call ends with the grammar.
            if ch.finish_reason == "length":
                assert parallel or fmt in THINKING, (where, ch)
                if ch.message.tool_calls:
                    check_calls(ch.message.tool_calls, allowed, parallel, fmt, cut=True)
            else:
                assert ch.finish_reason == "tool_calls", (where, ch)
                check_calls(ch.message.tool_calls, allowed, parallel, fmt)
                if fmt not in PREAMBLES:
                    assert not (ch.message.content or "").strip(), (where, ch.message.content)
            # Streamed: the same calls (ids are per request), the same text.
            content, reasoning, calls, finish = streamed(client, **kw)
            assert finish == ch.finish_reason, where
            assert content == (ch.message.content or ""), where
            assert reasoning == reasoning_of(ch.message), where
            assert [(c["name"], c["arguments"]) for c in calls] == [
                (c.function.name, c.function.arguments)
                for c in ch.message.tool_calls or []], where
            for c in calls:
                if len(c["arguments"]) > 12:
                    long_args += 1
                    in_pieces += c["pieces"] > 1
        # Arguments of more than a few characters span several tokens: streamed as written,
        # they come in several chunks.
        if long_args and fmt not in WHOLE_CALLS:
            assert in_pieces, (fmt, long_args)


def test_several_choices_call_as_their_solo_requests_with_ids_of_their_own(servers):
    """`n` choices with forced calls: choice i's calls are the solo request's with the seed
    plus i, and no call id is given twice in the answer."""
    rng = random.Random()
    for fmt, server in servers.items():
        client = client_of(server)
        seed = rng.randrange(1 << 30)
        kw = dict(model="muse-default", messages=MESSAGES, tools=TOOLS, tool_choice="required",
                  parallel_tool_calls=True, temperature=0.9, max_tokens=200)
        r = client.chat.completions.create(n=3, seed=seed, **kw)
        ids = []
        for i, ch in enumerate(r.choices):
            solo = client.chat.completions.create(seed=seed + i, **kw).choices[0]
            assert ch.index == i and ch.finish_reason == solo.finish_reason, (fmt, i)
            calls = [(c.function.name, c.function.arguments) for c in ch.message.tool_calls or []]
            assert calls == [(c.function.name, c.function.arguments)
                             for c in solo.message.tool_calls or []], (fmt, i)
            ids += [c.id for c in ch.message.tool_calls or []]
        assert len(ids) == len(set(ids)), (fmt, ids)


def test_auto_answers_or_calls(servers):
    rng = random.Random()
    for fmt, server in servers.items():
        client = client_of(server)
        for _ in range(3):
            seed = rng.randrange(1 << 30)
            kw = dict(model="muse-default", messages=MESSAGES, tools=TOOLS, seed=seed,
                      temperature=rng.choice([0.0, 1.0]), max_tokens=120)
            ch = client.chat.completions.create(**kw).choices[0]
            where = f"{fmt} seed {seed}"
            if ch.message.tool_calls:
                cut = ch.finish_reason == "length"
                assert cut or ch.finish_reason == "tool_calls", where
                check_calls(ch.message.tool_calls, set(SCHEMAS), False, fmt, cut=cut)
            else:
                assert ch.finish_reason in ("stop", "length"), where
                assert isinstance(ch.message.content, str), where
            content, reasoning, calls, finish = streamed(client, **kw)
            assert content == (ch.message.content or ""), where
            assert reasoning == reasoning_of(ch.message), where
            assert [(c["name"], c["arguments"]) for c in calls] == [
                (c.function.name, c.function.arguments)
                for c in ch.message.tool_calls or []], where
            assert finish == ch.finish_reason, where


ANSWER = {"type": "object",
          "properties": {"answer": {"type": "integer", "minimum": 0, "maximum": 99},
                         "unit": {"enum": ["C", "F"]}},
          "required": ["answer"], "additionalProperties": False}


def test_a_response_format_holds_the_reply_that_calls_no_tool(servers):
    """Tools with a JSON response_format, as OpenAI's API takes them: under `auto` the model
    calls tools or answers in the schema (the grammar holds both); under `none` it answers in
    the schema; under `required` it calls. Streamed answers add up to the unstreamed ones."""
    rng = random.Random()
    rf = {"type": "json_schema", "json_schema": {"name": "answer", "schema": ANSWER}}
    for fmt, server in servers.items():
        client = client_of(server)
        for choice in ["auto", "auto", "auto", "none", "required"]:
            seed = rng.randrange(1 << 30)
            kw = dict(model="muse-default", messages=MESSAGES, tools=TOOLS, tool_choice=choice,
                      response_format=rf, seed=seed, temperature=rng.choice([0.0, 1.0]),
                      max_tokens=300)
            where = f"{fmt} {choice} seed {seed}"
            if fmt == "atem" and choice == "auto":
                with pytest.raises(openai.BadRequestError) as e:
                    client.chat.completions.create(**kw)
                assert e.value.body["param"] == "response_format", where
                continue
            ch = client.chat.completions.create(**kw).choices[0]
            if ch.finish_reason == "length":
                continue
            if ch.message.tool_calls:
                assert choice != "none", where
                assert ch.finish_reason == "tool_calls", where
                check_calls(ch.message.tool_calls, set(SCHEMAS), False, fmt)
            else:
                assert choice != "required", where
                assert ch.finish_reason == "stop", (where, ch)
                jsonschema.validate(json.loads(ch.message.content or "null"), ANSWER)
            content, reasoning, calls, finish = streamed(client, **kw)
            assert (content, finish) == (ch.message.content or "", ch.finish_reason), where
            assert len(calls) == len(ch.message.tool_calls or []), where
    # /apply-template shows the prompt the request runs on: the generic format describes the
    # response schema in the system prompt.
    for body, shown in [({"response_format": rf}, True), ({}, False)]:
        p = post(servers["generic"], "/apply-template",
                 {"messages": MESSAGES, "tools": TOOLS, **body}).json()["prompt"]
        assert ('"maximum": 99' in p or '"maximum":99' in p) == shown, p
    # A raw grammar still cannot be combined with tools.
    r = post(servers["generic"], "/v1/chat/completions",
             {"messages": MESSAGES, "tools": TOOLS, "grammar": 'root ::= "x"'})
    assert r.status_code == 400 and r.json()["error"]["param"] == "tools", r.text
    # A response schema that cannot be a grammar is named as such.
    bad = {"type": "json_schema", "json_schema": {"schema": {"type": "object",
                                                             "properties": {"x": {"not": {}}}}}}
    r = post(servers["hermes"], "/v1/chat/completions",
             {"messages": MESSAGES, "tools": TOOLS, "response_format": bad})
    assert r.status_code == 400 and r.json()["error"]["param"] == "response_format", r.text


def test_generic_answers_in_its_json_or_calls(servers):
    """The generic format's reply is its JSON: `response` becomes the content."""
    client = client_of(servers["generic"])
    for seed in random.Random().sample(range(1 << 30), 4):
        ch = client.chat.completions.create(
            model="muse-default", messages=MESSAGES, tools=TOOLS, seed=seed,
            temperature=1.0, max_tokens=300).choices[0]
        if ch.message.tool_calls:
            check_calls(ch.message.tool_calls, set(SCHEMAS), False, "generic",
                        cut=ch.finish_reason == "length")
        elif ch.finish_reason == "stop":
            # The grammar's JSON was read: its `response` string is the content, not the JSON.
            assert not ch.message.content.lstrip().startswith('{"response"'), ch.message.content


def test_a_conversation_with_calls_and_results_renders(servers):
    """An assistant turn with tool calls (arguments as OpenAI's JSON string) and the tool's
    result go back to the template; the ATEM template needs the arguments as a mapping. The
    calls a server made go back too, as a client sends them (Mistral's templates refuse ids
    that are not 9 letters and digits)."""
    history = MESSAGES + [
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call00001", "type": "function",
             "function": {"name": "get_weather", "arguments": '{"city": "Paris", "days": 3}'}}]},
        {"role": "tool", "tool_call_id": "call00001", "content": '{"temp": 21}'},
    ]
    for fmt, server in servers.items():
        client = client_of(server)
        ch = client.chat.completions.create(
            model="muse-default", messages=MESSAGES, tools=TOOLS, tool_choice="required",
            seed=random.randrange(1 << 30), temperature=0.8, max_tokens=300).choices[0]
        made = ch.message
        # (calls cut by max_tokens, "length", stop short of their JSON: not sent back)
        if ch.finish_reason == "tool_calls":
            again = MESSAGES + [made.model_dump(exclude_none=True)] + [
                {"role": "tool", "tool_call_id": c.id, "content": '{"ok": true}'}
                for c in made.tool_calls]
            r = post(server, "/v1/chat/completions",
                     {"messages": again, "tools": TOOLS, "max_tokens": 4, "seed": 1})
            assert r.status_code == 200, (fmt, again, r.text)
        r = post(server, "/v1/chat/completions",
                 {"messages": history, "tools": TOOLS, "max_tokens": 8, "seed": 1})
        assert r.status_code == 200, (fmt, r.text)
        prompt = post(server, "/apply-template", {"messages": history, "tools": TOOLS})
        assert prompt.status_code == 200, (fmt, prompt.text)
        text = prompt.json()["prompt"]
        if fmt != "generic":
            assert "Paris" in text and "get_weather" in text, (fmt, text)


def test_bad_tool_requests_are_400s_naming_the_field(servers):
    server = servers["generic"]
    bad_schema = {"type": "function", "function": {
        "name": "f", "parameters": {"type": "object", "properties": {"x": {"not": {}}}}}}
    for body, field in [
        ({"tools": [bad_schema]}, "tools"),
        ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}},
         "tool_choice"),
        ({"tools": TOOLS, "tool_choice": "sometimes"}, "tool_choice"),
        ({"tools": [{"type": "function", "function": {"name": "bad name!"}}]}, "tools"),
        ({"tools": [WEATHER, WEATHER]}, "tools"),
        ({"tools": "get_weather"}, "tools"),
        ({"tools": TOOLS, "grammar": 'root ::= "x"'}, "tools"),
        ({"tools": TOOLS, "parallel_tool_calls": "yes"}, "parallel_tool_calls"),
        ({"functions": [{"name": "f"}]}, "functions"),
    ]:
        r = post(server, "/v1/chat/completions", {"messages": MESSAGES, **body})
        assert r.status_code == 400, (body, r.text)
        assert r.json()["error"]["param"].startswith(field), (body, r.text)
    r = post(server, "/v1/completions", {"prompt": "x", "tools": TOOLS})
    assert r.status_code == 400 and r.json()["error"]["param"] == "tools", r.text


def test_lazy_grammar_applies_from_its_trigger(servers):
    """llama-server's lazy grammar on /completion: free text until the trigger word, then the
    grammar from the trigger's start (here: "e", up to 30 characters that are not "!", then
    "!", then the end). A pattern trigger: a word trigger that is one token ("e" is) triggers
    on that token alone, and must be a preserved token, as in llama-server."""
    server = servers["generic"]
    grammar = 'root ::= "e" [^!]{0,30} "!"'
    # At most 30 characters after "e" as the grammar counts them (bytes that are not UTF-8 come
    # back as one U+FFFD each, where the grammar may read several as one code point).
    pattern = re.compile(r"[^e]*e([^!]*)!", re.S)
    rng = random.Random()
    # (the first: a seed whose answer ends before the trigger appears)
    cases = [(180607040, 0.9)] + [(rng.randrange(1 << 30), rng.choice([0.0, 0.9]))
                                  for _ in range(5)]
    for seed, temperature in cases:
        body = {"prompt": "Once upon a time", "n_predict": 200, "seed": seed,
                "temperature": temperature, "grammar": grammar,
                "grammar_lazy": True, "grammar_triggers": [{"type": 2, "value": "e"}]}
        a = completion_native(server, body)
        if "e" not in a["content"]:
            # The model ended before it wrote the trigger (seed 180607040 at 0.9: ", it's a
            # lunch."): free text throughout, ended by the end token.
            assert a["stop_type"] == "eos", (seed, a)
        else:
            m = pattern.fullmatch(a["content"])
            assert m and len(m.group(1).replace("\ufffd", "")) <= 30, (seed, a["content"])
        assert a["generation_settings"]["grammar_lazy"] is True
        assert a["generation_settings"]["grammar_triggers"] == [{"type": 2, "value": "e"}]
        # A full-pattern trigger (it must match the whole output so far) that any first
        # token matches, its capture group the whole of it: the grammar holds from the start.
        b = completion_native(server, {**body, "grammar": 'root ::= [^!]{0,40} "!"',
                                       "grammar_triggers": [{"type": 3,
                                                             "value": r"([\s\S]+)"}]})
        m = re.fullmatch(r"([^!]*)!", b["content"], re.S)
        assert m and len(m.group(1).replace("\ufffd", "")) <= 40, (seed, b["content"])
    for body, field in [
        ({"grammar": grammar, "grammar_lazy": True}, "grammar_triggers"),
        ({"grammar": grammar, "grammar_triggers": [{"type": 2, "value": "e"}]}, "grammar_lazy"),
        ({"grammar": grammar, "grammar_lazy": True,
          "grammar_triggers": [{"type": 2, "value": "(unclosed"}]}, "grammar_triggers"),
        ({"grammar": grammar, "grammar_lazy": True,
          "grammar_triggers": [{"type": 0, "value": "x"}]}, "grammar_triggers"),
        ({"grammar": grammar, "grammar_lazy": True,
          "grammar_triggers": [{"type": 7, "value": "x"}]}, "grammar_triggers"),
        # One token, not preserved.
        ({"grammar": grammar, "grammar_lazy": True,
          "grammar_triggers": [{"type": 1, "value": "e"}]}, "grammar_triggers"),
    ]:
        r = requests.post(server.url + "/completion", json={"prompt": "a", **body}, timeout=60)
        assert r.status_code == 400, (body, r.text)
        assert r.json()["error"]["param"] == field, (body, r.text)


# A template whose generation prompt opens a <think> block (as DeepSeek R1's and QwQ's do), and
# that drops the reasoning of earlier turns.
THINK = """{%- for m in messages %}<|im_start|>{{ m.role }}
{% if '</think>' in m.content %}{{ m.content.split('</think>')[-1] | trim }}{% else %}\
{{ m.content }}{% endif %}<|im_end|>
{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant
<think>
{% endif %}"""


def test_reasoning_in_think_tags_is_split_out(tmp_path):
    """With the block opened by the prompt, the whole output (this model never closes it) is
    reasoning: `reasoning_content` is exactly what `reasoning_format: "none"` gives as content,
    streamed or not, and the content is empty."""
    path = tmp_path / "think.jinja"
    path.write_text(THINK)
    s = ServerProcess("--chat-template-file", str(path), "--ctx-size", "2048", "--threads", "2")
    try:
        client = client_of(s)
        history = [{"role": "user", "content": "Hi"},
                   {"role": "assistant", "content": "<think>secret</think>Hello"},
                   {"role": "user", "content": "Why?"}]
        prompt = post(s, "/apply-template", {"messages": history}).json()["prompt"]
        assert "secret" not in prompt and prompt.endswith("<think>\n"), prompt
        for seed in random.Random().sample(range(1 << 30), 3):
            kw = dict(model="muse-default", messages=history, seed=seed, temperature=0.9,
                      max_tokens=40)
            plain = client.chat.completions.create(extra_body={"reasoning_format": "none"}, **kw)
            text = plain.choices[0].message.content
            assert text, seed
            split = client.chat.completions.create(**kw).choices[0].message
            assert reasoning_of(split) == text.removesuffix("</think>"), seed
            assert (split.content or "") == "", seed
            content, reasoning, calls, _ = streamed(client, **kw)
            assert (content, reasoning, calls) == ("", reasoning_of(split), []), seed
        r = post(s, "/v1/chat/completions", {"messages": history, "reasoning_format": "raw"})
        assert r.status_code == 400 and r.json()["error"]["param"] == "reasoning_format"
    finally:
        s.stop()


def test_review_findings_stay_fixed(servers):
    """What an adversarial review found: a raw-string constraint the ATEM format cannot carry is
    refused, not dropped; an empty or excessive trigger list is a 400; a past call's arguments
    that are not a JSON object are a 400 naming them where the template reads objects."""
    if "atem" in servers:
        atem = servers["atem"]
        for params in [{"type": "string", "maxLength": 3, "pattern": "^a"},
                       {"type": "string", "minLength": 1000000}]:
            tool = {"type": "function", "function": {"name": "f", "parameters": {
                "type": "object", "properties": {"s": params}, "required": ["s"]}}}
            r = post(atem, "/v1/chat/completions", {"messages": MESSAGES, "tools": [tool],
                                                    "tool_choice": "required"})
            assert r.status_code == 400 and r.json()["error"]["param"] == "tools", r.text
        bad = MESSAGES + [{"role": "assistant", "content": None, "tool_calls": [
            {"id": "c", "type": "function", "function": {"name": "get_weather",
                                                         "arguments": "{bad"}}]},
                             {"role": "tool", "tool_call_id": "c", "content": "{}"}]
        r = post(atem, "/v1/chat/completions", {"messages": bad, "tools": TOOLS})
        assert r.status_code == 400, r.text
        assert "tool_calls[0].function.arguments" in r.json()["error"]["message"], r.text
    server = servers["generic"]
    grammar = 'root ::= "x"'
    for triggers in [[{"type": 1, "value": ""}], [{"type": 2, "value": ""}],
                     [{"type": 2, "value": f"z{i}"} for i in range(65)]]:
        r = requests.post(server.url + "/completion", timeout=60, json={
            "prompt": "a", "grammar": grammar, "grammar_lazy": True, "grammar_triggers": triggers})
        assert r.status_code == 400 and r.json()["error"]["param"] == "grammar_triggers", r.text


BRAVE = {"type": "function", "function": {
    "name": "brave_search", "description": "Searches the web.",
    "parameters": {"type": "object", "properties": {"query": {"type": "string", "maxLength": 24}},
                   "required": ["query"]}}}
PYTHON = {"type": "function", "function": {
    "name": "python", "description": "Runs Python code.",
    "parameters": {"type": "object", "properties": {"code": {"type": "string"}},
                   "required": ["code"]}}}
TAG = "<|python_tag|>"


def json_object(text):
    """The JSON object `text` is, if it is one."""
    try:
        obj = json.loads(text)
    except ValueError:
        return None
    return obj if isinstance(obj, dict) else None


@pytest.mark.skipif(TEMPLATES is None, reason="llama.cpp's templates are not here")
def test_llama31_builtin_tools():
    """Llama 3.1's template with built-in tools: the prompt says "Environment: ipython" and
    "Tools: ...", a past built-in call renders as `<|python_tag|>NAME.call(query="...")`, and
    forced calls of a built-in come as the grammar lets the model write them (the raw text,
    from the logprobs' tokens, is `<|python_tag|>brave_search.call(query="...")`, raw code
    after the tag, or the JSON call), read back as that call, streamed as unstreamed."""
    path = TEMPLATES / "meta-llama-Llama-3.1-8B-Instruct.jinja"
    server = ServerProcess("--chat-template-file", str(path), "--ctx-size", "4096",
                           "--threads", "2")
    try:
        assert requests.get(server.url + "/props", timeout=30).json()["chat_format"] == "llama3"
        tools = [WEATHER, BRAVE, PYTHON]
        prompt = post(server, "/apply-template", {"messages": MESSAGES, "tools": tools}).json()
        assert "Environment: ipython\nTools: brave_search, python\n\n" in prompt["prompt"]
        plain = post(server, "/apply-template", {"messages": MESSAGES, "tools": [WEATHER]}).json()
        assert "Environment: ipython\n" in plain["prompt"] and "Tools:" not in plain["prompt"]
        rng = random.Random()
        query = "".join(rng.choice("abcXYZ019 _-") for _ in range(rng.randrange(1, 20)))
        history = MESSAGES + [
            {"role": "assistant", "content": None, "tool_calls": [{
                "id": "call_1", "type": "function",
                "function": {"name": "brave_search", "arguments": json.dumps({"query": query})}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}]
        r = post(server, "/apply-template", {"messages": history, "tools": tools}).json()
        assert f'{TAG}brave_search.call(query="{query}")<|eom_id|>' in r["prompt"], r
        client = client_of(server)
        tagged = 0
        schemas = {"brave_search": BRAVE["function"]["parameters"],
                   "python": PYTHON["function"]["parameters"]}
        for pick in ["brave_search", "python"] * 3:
            seed = rng.randrange(1 << 30)
            kw = dict(model="muse-default", messages=MESSAGES, tools=tools, seed=seed,
                      tool_choice={"type": "function", "function": {"name": pick}},
                      temperature=rng.choice([0.0, 0.8]), max_tokens=160)
            ch = client.chat.completions.create(logprobs=True, **kw).choices[0]
            where = f"{pick} seed {seed}"
            raw = "".join(t.token for t in ch.logprobs.content)
            [call] = ch.message.tool_calls
            assert call.function.name == pick, where
            assert call.id.startswith("call_"), where
            assert not (ch.message.content or "").strip(), where
            whole = ch.finish_reason == "tool_calls"
            assert whole or ch.finish_reason == "length", where
            if raw.startswith(TAG):
                tagged += 1
                form = f"{TAG}{pick}.call({'query' if pick == 'brave_search' else 'code'}="
                if raw.startswith(form) and whole:
                    # the call form: its value is JSON, read as the argument
                    key, value = form[len(TAG) + len(pick) + 6:-1], raw[len(form):].rstrip()
                    assert value.endswith(")"), (where, raw)
                    assert json.loads(call.function.arguments) == {key: json.loads(value[:-1])}
                elif (obj := json_object(raw[len(TAG):])) and obj.get("name") == pick and whole:
                    # a JSON call after the tag (Llama 3.1's, told "Environment: ipython")
                    assert json.loads(call.function.arguments) == obj["parameters"], (where, raw)
                elif not whole and raw[len(TAG):].lstrip().startswith("{"):
                    pass  # a JSON call cut by max_tokens: as far as it was written
                elif pick == "python" and not raw.startswith(form):
                    # raw code, ended by the model or cut by max_tokens: all of it, trimmed
                    assert json.loads(call.function.arguments) == {"code": raw[len(TAG):].strip()}
            else:
                assert raw.lstrip().startswith("{"), (where, raw)
            if whole:
                jsonschema.validate(json.loads(call.function.arguments), schemas[pick])
            content, _, calls, finish = streamed(client, **kw)
            assert finish == ch.finish_reason, where
            assert content == (ch.message.content or ""), where
            assert [(c["name"], c["arguments"]) for c in calls] == [
                (call.function.name, call.function.arguments)], where
        # the model knows nothing of tools; the grammar's `<|python_tag|>` forms are the ones
        # it takes here
        assert tagged, "no call after <|python_tag|>"
    finally:
        server.stop()
