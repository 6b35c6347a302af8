"""OpenAI's Responses API on `muser serve` (`POST /v1/responses`, `/v1/responses/input_tokens`)
through the real `openai` client: the answer streamed (its typed events, in order, each with its
sequence number, rebuilt from their deltas) is the answer whole for the same seed, and both are
what /v1/chat/completions answers for the same conversation (text, calls, reasoning, usage);
`max_output_tokens` makes a response incomplete; forced calls come back as `function_call` items
whose arguments validate; an `input` of messages, calls, call outputs and reasoning renders the
prompt of the equivalent chat messages; every bad request is a 400 naming its field.

The servers run models/muse-default.gguf with a Hermes-style template written for the tests
(tool calls) or one that opens a <think> block (reasoning); the binary is $MUSER_BIN.
"""

from __future__ import annotations

import json
import random

import jsonschema
import openai
import pytest

from test_server import ServerProcess, post
from test_tool_calls import HERMES, THINK, servers  # noqa: F401 (a fixture)

MODEL_ID = "muse-default"
WEATHER = {"type": "function", "name": "get_weather", "description": "The weather in a city.",
           "parameters": {"type": "object",
                          "properties": {"city": {"type": "string", "maxLength": 20},
                                         "days": {"type": "integer", "minimum": 1,
                                                  "maximum": 7}},
                          "required": ["city", "days"]}}
ADD = {"type": "function", "name": "add",
       "parameters": {"type": "object", "properties": {"a": {"type": "number"},
                                                      "b": {"type": "number"}},
                      "required": ["a", "b"]}}
TOOLS = [WEATHER, ADD]
SCHEMAS = {t["name"]: t["parameters"] for t in TOOLS}
INPUTS = ["Hello there", "What is the weather in Paris?", "Tell me a story about a cat.",
          "Why is the sky blue?", "Add 2 and 3."]


def chat_tool(t):
    """A Responses API function tool in chat completions' shape."""
    return {"type": "function", "function": {k: v for k, v in t.items() if k != "type"}}


@pytest.fixture(scope="module")
def hermes(tmp_path_factory):
    path = tmp_path_factory.mktemp("responses") / "hermes.jinja"
    path.write_text(HERMES)
    s = ServerProcess("--chat-template-file", str(path), "--parallel", "4", "--ctx-size", "4096",
                      "--threads", "2")
    yield s
    s.stop()


@pytest.fixture(scope="module")
def client(hermes):
    return openai.OpenAI(base_url=hermes.url + "/v1", api_key="none", max_retries=0)


def events_of(stream) -> tuple[list, object]:
    """The events of a streamed response, checked as a client reads them: sequence numbers
    0, 1, 2 ...; created and in_progress first; each item added at the next output index before
    its parts and deltas, and done (with the text its deltas add up to) before the next item is
    added; the last event completes (or leaves incomplete) the response, whose output is the
    items as their done events gave them. Returns the events and the final response."""
    events = list(stream)
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert [e.type for e in events[:2]] == ["response.created", "response.in_progress"]
    rid = events[0].response.id
    assert rid.startswith("resp_") and events[1].response.id == rid
    assert events[0].response.status == "in_progress" and events[0].response.output == []
    items, done, text, open_at = [], [], {}, None
    for e in events[2:-1]:
        if e.type == "response.output_item.added":
            assert open_at is None, "an item was added before the last one was done"
            assert e.output_index == len(items)
            items.append(e.item)
            text[e.output_index] = ""
            open_at = e.output_index
            continue
        assert e.output_index == open_at, e
        item = items[open_at]
        if e.type in ("response.output_text.delta", "response.reasoning_text.delta",
                      "response.function_call_arguments.delta"):
            assert e.item_id == item.id
            text[open_at] += e.delta
        elif e.type in ("response.output_text.done", "response.reasoning_text.done"):
            assert e.text == text[open_at]
        elif e.type == "response.function_call_arguments.done":
            assert (e.arguments, e.name) == (text[open_at], item.name)
        elif e.type in ("response.content_part.added", "response.content_part.done"):
            assert e.item_id == item.id and e.content_index == 0
        elif e.type == "response.output_item.done":
            assert e.item.id == item.id and e.item.type == item.type
            whole = e.item.arguments if e.item.type == "function_call" else \
                e.item.content[0].text
            assert whole == text[open_at]
            done.append(e.item)
            open_at = None
        else:
            raise AssertionError(f"unexpected event {e.type}")
    assert open_at is None
    last = events[-1]
    assert last.type in ("response.completed", "response.incomplete")
    assert last.response.id == rid and last.response.status == last.type.split(".")[1]
    assert [i.model_dump() for i in last.response.output] == [i.model_dump() for i in done]
    return events, last.response


def same_output(a, b) -> None:
    """Two responses' outputs agree but for ids (a call's `call_id` is drawn per request)."""
    def strip(r):
        out = []
        for i in r.output:
            d = i.model_dump()
            d.pop("id")
            d.pop("call_id", None)
            out.append(d)
        return out
    assert strip(a) == strip(b)
    assert a.status == b.status
    assert a.usage.output_tokens == b.usage.output_tokens
    assert a.usage.input_tokens == b.usage.input_tokens


def test_text_streamed_whole_and_as_chat_agree(hermes, client):
    """For random seeds: the streamed events add up to the whole answer; its text is what chat
    completions answers for the same seed and messages (`instructions` a system message); usage
    counts what chat's does, and /input_tokens counts the same prompt."""
    rng = random.Random()
    for _ in range(3):
        seed = rng.randrange(1 << 30)
        kw = dict(model=MODEL_ID, input=rng.choice(INPUTS), instructions="Be brief.",
                  temperature=0.9, max_output_tokens=rng.randrange(8, 40),
                  extra_body={"seed": seed})
        whole = client.responses.create(**kw)
        assert whole.object == "response" and whole.id.startswith("resp_")
        assert whole.model == MODEL_ID and whole.output_text
        assert [i.type for i in whole.output] == ["message"]
        assert whole.output[0].id.startswith("msg_")
        _, streamed = events_of(client.responses.create(stream=True, **kw))
        same_output(streamed, whole)
        with client.responses.stream(**kw) as s:
            deltas = "".join(e.delta for e in s if e.type == "response.output_text.delta")
            if whole.status == "completed":
                assert s.get_final_response().output_text == whole.output_text
        assert deltas == whole.output_text
        chat = client.chat.completions.create(
            model=MODEL_ID, temperature=0.9, max_tokens=kw["max_output_tokens"], seed=seed,
            messages=[{"role": "system", "content": "Be brief."},
                      {"role": "user", "content": kw["input"]}])
        assert chat.choices[0].message.content == whole.output_text
        u = whole.usage
        assert (u.input_tokens, u.output_tokens) == (chat.usage.prompt_tokens,
                                                    chat.usage.completion_tokens)
        assert u.total_tokens == u.input_tokens + u.output_tokens
        assert u.output_tokens_details.reasoning_tokens == 0
        body = {"input": kw["input"], "instructions": "Be brief."}
        n = post(hermes, "/v1/responses/input_tokens", body).json()
        assert n == {"object": "response.input_tokens", "input_tokens": u.input_tokens}
        assert post(hermes, "/responses/input_tokens", body).json() == n


def test_max_output_tokens_leaves_the_response_incomplete(client):
    """A response cut by max_output_tokens is `incomplete` (reason max_output_tokens), its
    message item too, with exactly that many output tokens; streamed, it ends with
    response.incomplete and the same output."""
    n = random.randrange(3, 9)
    kw = dict(model=MODEL_ID, input="Tell me a very long story.", max_output_tokens=n,
              temperature=0, extra_body={"ignore_eos": True})
    r = client.responses.create(**kw)
    assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
    assert r.usage.output_tokens == n and r.max_output_tokens == n
    assert r.output[-1].status == "incomplete"
    events, s = events_of(client.responses.create(stream=True, **kw))
    assert events[-1].type == "response.incomplete"
    same_output(s, r)
    # A complete answer says so, its items too.
    done = client.responses.create(model=MODEL_ID, input="Hi", max_output_tokens=200,
                                   temperature=0)
    if done.usage.output_tokens < 200:
        assert done.status == "completed" and done.incomplete_details is None
        assert all(i.status == "completed" for i in done.output)


@pytest.mark.parametrize("choice", ["required", "named"])
def test_forced_calls_are_function_call_items(client, choice):
    """tool_choice required or named: the answer is function_call items whose arguments
    validate against the tool's schema, the named tool where one is named; streamed, the
    argument deltas add up to the same calls; chat completions gives the same calls for the
    same seed."""
    rng = random.Random()
    for _ in range(3):
        seed = rng.randrange(1 << 30)
        name = rng.choice(["get_weather", "add"])
        tc = "required" if choice == "required" else {"type": "function", "name": name}
        kw = dict(model=MODEL_ID, input=rng.choice(INPUTS), tools=TOOLS, tool_choice=tc,
                  temperature=0.8, extra_body={"seed": seed})
        r = client.responses.create(**kw)
        calls = [i for i in r.output if i.type == "function_call"]
        assert calls and r.status == "completed", r.output
        for c in calls:
            assert c.id.startswith("fc_") and c.call_id and c.status == "completed"
            if choice == "named":
                assert c.name == name
            jsonschema.validate(json.loads(c.arguments), SCHEMAS[c.name])
        events, s = events_of(client.responses.create(stream=True, **kw))
        same_output(s, r)
        pieces = [e for e in events if e.type == "response.function_call_arguments.delta"]
        assert len(pieces) > 1
        chat_choice = tc if tc == "required" else {"type": "function",
                                                   "function": {"name": name}}
        m = client.chat.completions.create(
            model=MODEL_ID, messages=[{"role": "user", "content": kw["input"]}],
            tools=[chat_tool(t) for t in TOOLS], tool_choice=chat_choice, temperature=0.8,
            seed=seed).choices[0].message
        assert [(c.function.name, c.function.arguments) for c in m.tool_calls] == \
            [(c.name, c.arguments) for c in calls]


def test_every_formats_calls_and_reasoning_are_chats(servers):
    """In every tool-call format (each chat template test_tool_calls.py runs), a forced call
    through the Responses API is what chat completions gives for the same seed: the reasoning
    item's text its reasoning_content, the message's text its content, the function_call items
    its calls; streamed, the events add up to the same response."""
    rng = random.Random()
    for fmt, server in servers.items():
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0)
        seed, temperature = rng.randrange(1 << 30), rng.choice([0.0, 0.8])
        common = dict(model=MODEL_ID, temperature=temperature)
        where = f"{fmt} seed {seed} t {temperature}"
        kw = dict(input=INPUTS[1], tools=TOOLS, tool_choice="required", max_output_tokens=300,
                  extra_body={"seed": seed}, **common)
        r = client.responses.create(**kw)
        m = client.chat.completions.create(
            messages=[{"role": "user", "content": INPUTS[1]}], tools=[chat_tool(t) for t in TOOLS],
            tool_choice="required", max_tokens=300, seed=seed, **common).choices[0].message
        reasoning = "".join(i.content[0].text for i in r.output if i.type == "reasoning")
        assert reasoning == ((m.model_extra or {}).get("reasoning_content") or ""), where
        assert r.output_text == (m.content or ""), where
        assert [(i.name, i.arguments) for i in r.output if i.type == "function_call"] == \
            [(c.function.name, c.function.arguments) for c in m.tool_calls or []], where
        _, streamed = events_of(client.responses.create(stream=True, **kw))
        same_output(streamed, r)


def test_text_format_holds_the_answer_to_a_schema(client):
    """text.format json_schema (and json_object) is chat's response_format: the text parses and
    validates, streamed or not, and the response repeats the format."""
    schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
                                               "age": {"type": "integer", "minimum": 0}},
              "required": ["name", "age"], "additionalProperties": False}
    fmt = {"type": "json_schema", "name": "person", "schema": schema, "strict": True}
    seed = random.randrange(1 << 30)
    kw = dict(model=MODEL_ID, input="Make up a person.", text={"format": fmt}, temperature=0.9,
              max_output_tokens=120, extra_body={"seed": seed})
    r = client.responses.create(**kw)
    jsonschema.validate(json.loads(r.output_text), schema)
    assert r.text.format.type == "json_schema" and r.text.format.name == "person"
    _, s = events_of(client.responses.create(stream=True, **kw))
    same_output(s, r)
    # Any JSON object: whole unless max_output_tokens cut it (a long string), then its start.
    r = client.responses.create(model=MODEL_ID, input="Make up a person.", temperature=0.9,
                                text={"format": {"type": "json_object"}}, max_output_tokens=200)
    if r.status == "completed":
        assert isinstance(json.loads(r.output_text), dict)
    else:
        assert r.output_text.lstrip().startswith("{") and r.usage.output_tokens == 200


def test_an_input_with_calls_renders_the_chat_prompt(hermes, client):
    """An input of messages (string and part contents, developer and system roles), an
    assistant's reasoning, text and calls (joined into one assistant message, as llama-server
    joins them) and the calls' outputs renders the prompt of the same chat messages: the same
    token count by /input_tokens and in usage, and the same answer for the same seed."""
    rng = random.Random()
    for _ in range(3):
        city = rng.choice(["Paris", "Oslo", "Lima", "Kyoto"])
        days = rng.randrange(1, 8)
        args = json.dumps({"city": city, "days": days})
        call_id = "call_" + "".join(rng.choice("abcdefXYZ0123") for _ in range(12))
        result = f"{rng.randrange(-20, 40)} C and sunny"
        items = [
            {"role": "developer", "content": "Answer in one line."},
            {"type": "message", "role": "user",
             "content": [{"type": "input_text", "text": f"Weather in {city}?"},
                         {"type": "input_text", "text": f"For {days} days."}]},
            {"type": "reasoning", "summary": [],
             "content": [{"type": "reasoning_text", "text": "I should call the tool."}]},
            {"type": "message", "role": "assistant",
             "content": [{"type": "output_text", "text": "Let me look."}]},
            {"type": "function_call", "call_id": call_id, "name": "get_weather",
             "arguments": args},
            {"type": "function_call_output", "call_id": call_id, "output": result},
            {"role": "user", "content": "Thanks. And tomorrow?"},
        ]
        messages = [
            {"role": "system", "content": "Answer in one line."},
            {"role": "user", "content": f"Weather in {city}?\nFor {days} days."},
            {"role": "assistant", "content": "Let me look.",
             "reasoning_content": "I should call the tool.",
             "tool_calls": [{"id": call_id, "type": "function",
                             "function": {"name": "get_weather", "arguments": args}}]},
            {"role": "tool", "tool_call_id": call_id, "content": result},
            {"role": "user", "content": "Thanks. And tomorrow?"},
        ]
        prompt = post(hermes, "/apply-template",
                      {"messages": messages, "tools": [chat_tool(t) for t in TOOLS]}).json()
        assert result in prompt["prompt"] and city in prompt["prompt"]
        n = post(hermes, "/tokenize", {"content": prompt["prompt"], "add_special": True}).json()
        count = post(hermes, "/v1/responses/input_tokens",
                     {"input": items, "tools": TOOLS}).json()["input_tokens"]
        assert count == len(n["tokens"])
        seed = rng.randrange(1 << 30)
        r = client.responses.create(model=MODEL_ID, input=items, tools=TOOLS, temperature=0.9,
                                    max_output_tokens=30, extra_body={"seed": seed})
        chat = client.chat.completions.create(
            model=MODEL_ID, messages=messages, tools=[chat_tool(t) for t in TOOLS],
            temperature=0.9, max_tokens=30, seed=seed)
        assert r.usage.input_tokens == chat.usage.prompt_tokens == count
        m = chat.choices[0].message
        assert r.output_text == (m.content or "")
        assert [(i.name, i.arguments) for i in r.output if i.type == "function_call"] == \
            [(c.function.name, c.function.arguments) for c in m.tool_calls or []]


def test_reasoning_is_an_item_of_its_own(tmp_path):
    """With a template that opens a <think> block, the reasoning is a `reasoning` item (its
    `reasoning_text` the chat answer's reasoning_content for the same seed), counted in
    reasoning_tokens; streamed, its deltas add up to it; `reasoning.effort` is passed on (and
    "none" turns thinking off for the template, as chat's reasoning_effort)."""
    path = tmp_path / "think.jinja"
    path.write_text(THINK)
    s = ServerProcess("--chat-template-file", str(path), "--ctx-size", "2048", "--threads", "2")
    try:
        client = openai.OpenAI(base_url=s.url + "/v1", api_key="none", max_retries=0)
        for seed in random.Random().sample(range(1 << 30), 3):
            kw = dict(model=MODEL_ID, input="Why?", temperature=0.9, max_output_tokens=30,
                      extra_body={"seed": seed})
            r = client.responses.create(**kw)
            assert [i.type for i in r.output] == ["reasoning"], r.output
            item = r.output[0]
            assert item.id.startswith("rs_") and item.content[0].type == "reasoning_text"
            chat = client.chat.completions.create(
                model=MODEL_ID, messages=[{"role": "user", "content": "Why?"}], temperature=0.9,
                max_tokens=30, seed=seed).choices[0].message
            assert item.content[0].text == chat.model_extra["reasoning_content"]
            assert 0 < r.usage.output_tokens_details.reasoning_tokens <= r.usage.output_tokens
            events, streamed = events_of(client.responses.create(stream=True, **kw))
            same_output(streamed, r)
            assert "".join(e.delta for e in events
                           if e.type == "response.reasoning_text.delta") == item.content[0].text
        r = post(s, "/v1/responses", {"input": "Hi", "reasoning": {"effort": "low"},
                                      "max_output_tokens": 2})
        assert r.status_code == 200 and r.json()["reasoning"]["effort"] == "low"
    finally:
        s.stop()


BAD = [
    ("no input", {}, "input"),
    ("input a number", {"input": 3}, "input"),
    ("input empty", {"input": []}, "input"),
    ("item not an object", {"input": ["hi"]}, "input"),
    ("unknown item type", {"input": [{"type": "item_reference", "id": "msg_1"}]},
     "input[0].type"),
    ("unknown role", {"input": [{"role": "robot", "content": "hi"}]}, "input"),
    ("image part", {"input": [{"role": "user", "content": [
        {"type": "input_image", "image_url": "http://x/y.png"}]}]}, "input"),
    ("output_text from the user", {"input": [{"role": "user", "content": [
        {"type": "output_text", "text": "x"}]}]}, "input"),
    ("part text not a string", {"input": [{"role": "user", "content": [
        {"type": "input_text", "text": 5}]}]}, "input"),
    ("call without call_id", {"input": [{"type": "function_call", "name": "f",
                                         "arguments": "{}"}]}, "input"),
    ("call output without output", {"input": [{"type": "function_call_output",
                                               "call_id": "c"}]}, "input"),
    ("previous_response_id", {"input": "hi", "previous_response_id": "resp_1"},
     "previous_response_id"),
    ("background", {"input": "hi", "background": True}, "background"),
    ("conversation", {"input": "hi", "conversation": "conv_1"}, "conversation"),
    ("context_management", {"input": "hi", "context_management": [{"type": "compaction"}]},
     "context_management"),
    ("built-in tool", {"input": "hi", "tools": [{"type": "web_search"}]}, "tools[0].type"),
    ("tools not an array", {"input": "hi", "tools": {"type": "function"}}, "tools"),
    ("tool without a name", {"input": "hi", "tools": [{"type": "function",
                                                       "parameters": {}}]}, "tools[0].name"),
    ("tool_choice unknown tool", {"input": "hi", "tools": [WEATHER],
                                  "tool_choice": {"type": "function", "name": "nope"}},
     "tool_choice.name"),
    ("tool_choice built-in", {"input": "hi", "tool_choice": {"type": "web_search_preview"}},
     "tool_choice.type"),
    ("tool_choice word", {"input": "hi", "tool_choice": "sometimes"}, "tool_choice"),
    ("max_output_tokens a string", {"input": "hi", "max_output_tokens": "ten"},
     "max_output_tokens"),
    ("max_output_tokens 0", {"input": "hi", "max_output_tokens": 0}, "max_output_tokens"),
    ("max_output_tokens past the context", {"input": "hi", "max_output_tokens": 100000},
     "max_output_tokens"),
    ("temperature too high", {"input": "hi", "temperature": 3}, "temperature"),
    ("text.format unknown", {"input": "hi", "text": {"format": {"type": "xml"}}},
     "text.format"),
    ("json_schema without a schema", {"input": "hi", "text": {"format": {
        "type": "json_schema", "name": "x"}}}, "text.format"),
    ("verbosity", {"input": "hi", "text": {"verbosity": "low"}}, "text.verbosity"),
    ("reasoning not an object", {"input": "hi", "reasoning": "high"}, "reasoning"),
    ("reasoning effort a number", {"input": "hi", "reasoning": {"effort": 3}},
     "reasoning.effort"),
    ("instructions a number", {"input": "hi", "instructions": 3}, "instructions"),
    ("truncation auto", {"input": "hi", "truncation": "auto"}, "truncation"),
    ("include logprobs", {"input": "hi", "include": ["message.output_text.logprobs"]},
     "include"),
    ("messages", {"input": "hi", "messages": [{"role": "user", "content": "hi"}]},
     "messages"),
    ("max_tokens", {"input": "hi", "max_tokens": 5}, "max_tokens"),
    ("n", {"input": "hi", "n": 2}, "n"),
    ("stream a string", {"input": "hi", "stream": "yes"}, "stream"),
    ("metadata a list", {"input": "hi", "metadata": ["a"]}, "metadata"),
]


@pytest.mark.parametrize("name,body,param", BAD, ids=[b[0] for b in BAD])
def test_bad_requests_are_400s_naming_the_field(hermes, name, body, param):
    """Each is a 400 in OpenAI's error shape naming the field, on both paths and on
    /input_tokens where the prompt is at fault; the server goes on answering."""
    for path in ["/v1/responses", "/responses"]:
        r = post(hermes, path, body)
        assert r.status_code == 400, (name, r.text)
        e = r.json()["error"]
        assert e["type"] == "invalid_request_error" and e["message"], e
        assert e["param"] == param, (name, e)
    if param.startswith("input"):
        r = post(hermes, "/v1/responses/input_tokens", body)
        assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text


def test_the_client_raises_on_a_bad_request(client):
    with pytest.raises(openai.BadRequestError) as e:
        client.responses.create(model=MODEL_ID, input="hi", previous_response_id="resp_1")
    assert e.value.body["param"] == "previous_response_id"
    assert client.responses.create(model=MODEL_ID, input="hi", max_output_tokens=2).output_text
