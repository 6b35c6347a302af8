"""`muser serve` against the real `openai` Python client (and raw HTTP where the client hides
what is checked): completions and chat, streaming and not, logprobs, usage with cached tokens,
llama-server's timings, stop strings, token-array prompts, tokenize/detokenize, 16 concurrent
streams each identical to its solo run, a client disconnecting mid-stream, every kind of bad
request, overload (503) and the API key; llama-server's /props and /slots; llama.cpp's samplers
(typical-p, top-n-sigma, XTC, dynamic temperature, mirostat, min_keep) on every endpoint.

The servers run models/muse-default.gguf on a free loopback port; the binary is $MUSER_BIN,
else target/release/muser (`cargo build --release -p muser-cli`).
"""

from __future__ import annotations

import json
import math
import os
import random
import re
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import jinja2
import openai
import pytest
import requests

REPO = Path(__file__).resolve().parents[2]
MODEL = REPO / "models" / "muse-default.gguf"
MODEL_ID = "muse-default"
N_CTX = 8192  # per slot; above the model's 512 so a stream runs long enough to interrupt


def muser_bin() -> Path:
    b = Path(os.environ.get("MUSER_BIN", REPO / "target" / "release" / "muser"))
    if not b.exists():
        pytest.fail(f"{b} not found: run `cargo build --release -p muser-cli` or set MUSER_BIN")
    return b


class ServerProcess:
    """`muser serve` on port 0 (a free port); the address is read from its first line."""

    def __init__(self, *args: str, model: Path = MODEL):
        cmd = [str(muser_bin()), "serve", "-m", str(model), "--port", "0", *args]
        self.proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True)
        self.headers = {}
        if "--api-key" in args:
            self.headers["Authorization"] = "Bearer " + args[args.index("--api-key") + 1]
        self.log: list[str] = []
        first = self.proc.stderr.readline()
        self.log.append(first)
        m = re.search(r"listening on (http://[\d.:]+)", first)
        if not m:
            self.stop()
            raise RuntimeError(f"server did not start: {first!r}")
        self.url = m.group(1)
        threading.Thread(target=self._drain, daemon=True).start()
        deadline = time.monotonic() + 60
        while requests.get(self.url + "/health", timeout=10).status_code != 200:
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError("server never became ready:\n" + "".join(self.log))
            time.sleep(0.05)

    def _drain(self) -> None:
        for line in self.proc.stderr:
            self.log.append(line)

    def metrics(self) -> dict[str, float]:
        text = requests.get(self.url + "/metrics", headers=self.headers, timeout=10).text
        out = {}
        for line in text.splitlines():
            if line.startswith("muser:"):
                name, value = line.split()
                out[name[len("muser:"):]] = float(value)
        return out

    def wait_metric(self, name: str, pred, timeout: float = 30.0) -> float:
        """Polls /metrics until pred(value) holds (a bounded wait, not a timing assertion)."""
        deadline = time.monotonic() + timeout
        while True:
            v = self.metrics()[name]
            if pred(v):
                return v
            if time.monotonic() > deadline:
                raise AssertionError(f"{name} = {v} after {timeout} s")
            time.sleep(0.02)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@pytest.fixture(scope="module")
def server():
    s = ServerProcess("--parallel", "16", "--ctx-size", str(N_CTX), "--threads", "2")
    yield s
    s.stop()
    assert s.proc.returncode is not None


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0)


def post(server, path: str, body, **kw) -> requests.Response:
    data = body if isinstance(body, (bytes, str)) else json.dumps(body)
    return requests.post(server.url + path, data=data, timeout=60, **kw)


def tokenize(server, text: str, add_special: bool = True) -> list[int]:
    r = post(server, "/tokenize", {"content": text, "add_special": add_special})
    assert r.status_code == 200, r.text
    return r.json()["tokens"]


# --- basics -----------------------------------------------------------------------------------


def test_health_models_and_metrics(server, client):
    r = requests.get(server.url + "/health", timeout=10)
    assert (r.status_code, r.json()) == (200, {"status": "ok"})
    models = client.models.list().data
    assert [m.id for m in models] == [MODEL_ID]
    m = server.metrics()
    for name in ["prompt_tokens_total", "tokens_predicted_total", "predicted_tokens_seconds",
                 "requests_processing", "requests_deferred", "kv_cache_usage_ratio"]:
        assert name in m, name


def test_completion(server, client):
    prompt = "Once upon a time"
    r = client.completions.create(model=MODEL_ID, prompt=prompt, max_tokens=20, temperature=0)
    c = r.choices[0]
    assert r.object == "text_completion" and c.text
    assert c.finish_reason == "length"
    assert r.usage.prompt_tokens == len(tokenize(server, prompt))
    assert r.usage.completion_tokens == 20
    assert r.usage.total_tokens == r.usage.prompt_tokens + 20

    # The same request streamed gives the same text, and the stream ends with [DONE].
    chunks = list(client.completions.create(model=MODEL_ID, prompt=prompt, max_tokens=20,
                                            temperature=0, stream=True))
    assert "".join(ch.choices[0].text for ch in chunks) == c.text
    assert chunks[-1].choices[0].finish_reason == "length"
    raw = post(server, "/v1/completions",
               {"prompt": prompt, "max_tokens": 3, "stream": True}).text
    events = [line for line in raw.split("\n") if line.startswith("data: ")]
    assert events[-1] == "data: [DONE]"


def test_chat(client):
    msgs = [{"role": "system", "content": "You are a fortune cookie."},
            {"role": "user", "content": "What does the future hold?"}]
    r = client.chat.completions.create(model=MODEL_ID, messages=msgs, max_tokens=24,
                                       temperature=0)
    m = r.choices[0].message
    assert r.object == "chat.completion" and m.role == "assistant"
    stream = client.chat.completions.create(model=MODEL_ID, messages=msgs, max_tokens=24,
                                            temperature=0, stream=True,
                                            stream_options={"include_usage": True})
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert text == m.content
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == \
        r.usage.completion_tokens
    finish = [ch.choices[0].finish_reason for ch in chunks if ch.choices]
    assert finish[-1] == r.choices[0].finish_reason


def test_sampling_parameters_and_seed(client):
    kw = dict(model=MODEL_ID, prompt="You will", max_tokens=16, temperature=1.0, top_p=0.9,
              extra_body={"top_k": 20, "min_p": 0.02, "repetition_penalty": 1.1})
    a = client.completions.create(seed=5, **kw).choices[0].text
    b = client.completions.create(seed=5, **kw).choices[0].text
    assert a == b  # a seed reproduces the draw


def test_several_choices_are_each_the_solo_request_with_its_seed(server, client):
    """`n` choices: choice i is what the same request alone draws with the seed plus i (as
    llama-server seeds its choices; decode groups keep each row's bits), streamed or not;
    usage counts the prompt once and the completions of all; a stream gives each choice its
    chunks, its role and its finish, and [DONE] once all have ended."""
    rng = random.Random()
    for _ in range(2):
        seed = rng.randrange(1 << 30)
        n = rng.randrange(2, 6)
        kw = dict(model=MODEL_ID, prompt=rng.choice(PROMPTS), temperature=1.0,
                  max_tokens=rng.randrange(8, 40), logprobs=2)
        many = client.completions.create(n=n, seed=seed, **kw)
        assert [c.index for c in many.choices] == list(range(n))
        solo = [client.completions.create(seed=seed + i, **kw) for i in range(n)]
        for c, s in zip(many.choices, solo):
            assert (c.text, c.finish_reason) == (s.choices[0].text, s.choices[0].finish_reason)
            assert c.logprobs.tokens == s.choices[0].logprobs.tokens
        assert many.usage.prompt_tokens == solo[0].usage.prompt_tokens
        assert many.usage.completion_tokens == sum(s.usage.completion_tokens for s in solo)
        texts, finishes, usage = [""] * n, [None] * n, None
        for ch in client.completions.create(n=n, seed=seed, stream=True,
                                            stream_options={"include_usage": True}, **kw):
            if not ch.choices:
                usage = ch.usage
            for c in ch.choices:
                assert finishes[c.index] is None, "a chunk after its choice's finish"
                texts[c.index] += c.text
                finishes[c.index] = c.finish_reason
        assert texts == [c.text for c in many.choices]
        assert finishes == [c.finish_reason for c in many.choices]
        assert usage.completion_tokens == many.usage.completion_tokens

    msgs = [{"role": "user", "content": rng.choice(PROMPTS)}]
    kw = dict(model=MODEL_ID, messages=msgs, temperature=1.0, max_tokens=24, seed=seed)
    many = client.chat.completions.create(n=3, **kw)
    solo = [client.chat.completions.create(**{**kw, "seed": seed + i}) for i in range(3)]
    assert [c.message.content for c in many.choices] == \
        [s.choices[0].message.content for s in solo]
    roles, texts = {}, ["", "", ""]
    for ch in client.chat.completions.create(n=3, stream=True, **kw):
        for c in ch.choices:
            if c.delta.role:
                roles[c.index] = c.delta.role
            texts[c.index] += c.delta.content or ""
    assert roles == {0: "assistant", 1: "assistant", 2: "assistant"}
    assert texts == [c.message.content for c in many.choices]
    # Several prompts: prompt p's i-th choice is index p * n + i; usage counts each prompt.
    prompts = rng.sample(PROMPTS, 3)
    kw = dict(model=MODEL_ID, temperature=1.0, max_tokens=16, seed=seed)
    many = client.completions.create(prompt=prompts, n=2, **kw)
    assert [c.index for c in many.choices] == list(range(6))
    for p, prompt in enumerate(prompts):
        for i in range(2):
            s = client.completions.create(prompt=prompt, **{**kw, "seed": seed + i})
            assert many.choices[2 * p + i].text == s.choices[0].text, (p, i)
    assert many.usage.prompt_tokens == sum(len(tokenize(server, p)) for p in prompts)
    # Without a seed each choice draws with a seed of its own.
    free = client.completions.create(model=MODEL_ID, prompt="Once", temperature=1.5,
                                     max_tokens=32, n=4)
    assert len({c.text for c in free.choices}) > 1


def test_logprobs(client):
    r = client.completions.create(model=MODEL_ID, prompt="A penny saved", max_tokens=8,
                                  temperature=0, logprobs=3)
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 8
    assert "".join(lp.tokens) == r.choices[0].text
    for tok, p, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs):
        assert p <= 0 and len(top) <= 3
        assert max(top.values()) == pytest.approx(p, abs=1e-6)  # greedy takes the top token
    assert lp.text_offset[0] == 0

    r = client.chat.completions.create(model=MODEL_ID, max_tokens=6, temperature=0,
                                       messages=[{"role": "user", "content": "Hi"}],
                                       logprobs=True, top_logprobs=2)
    content = r.choices[0].logprobs.content
    assert len(content) == r.usage.completion_tokens
    for e in content:
        assert len(e.top_logprobs) == 2 and e.top_logprobs[0].logprob >= e.top_logprobs[1].logprob
        assert e.logprob == pytest.approx(e.top_logprobs[0].logprob, abs=1e-6)
        assert bytes(e.bytes).decode("utf-8", "replace") == e.token


def test_text_offsets_index_the_text_streamed_or_not(server):
    """`text_offset` counts the bytes of text decoded before each token, so a token holding
    part of a character shares its offset with the character's start, the offsets never pass
    the text's end, and the streamed chunks carry the same offsets as the whole answer."""
    body = {"prompt": "\u00e9\U0001F600" * 10, "max_tokens": 12, "temperature": 0,
            "logprobs": 1}
    whole = post(server, "/v1/completions", body).json()["choices"][0]
    offsets = whole["logprobs"]["text_offset"]
    text = whole["text"].encode()
    assert len(offsets) == 12 and offsets[0] == 0
    assert offsets == sorted(offsets) and offsets[-1] <= len(text)
    # Not vacuous: this answer has tokens that are parts of characters (repeated offsets).
    assert len(set(offsets)) < len(offsets)
    raw = post(server, "/v1/completions", dict(body, stream=True)).text
    streamed = []
    for line in raw.split("\n"):
        if line.startswith("data: {"):
            lp = json.loads(line[6:])["choices"][0]["logprobs"]
            if lp:
                streamed += lp["text_offset"]
    assert streamed == offsets


def test_echo_scores_the_prompt_as_decoding_scores_its_tokens(server, client):
    """`echo` with `logprobs` (an evaluation's loglikelihood request): the answer starts with
    the prompt, each prompt token with its logprob given the tokens before it (the first has
    none). Scored in passes of 64 positions, a prompt's tokens get the logprobs, bit for bit,
    that the same tokens get when generated one at a time; streamed or not; with max_tokens 1
    the token after the prompt is the one a request without echo gets."""
    rng = random.Random(11)
    words = "the of and to in is was for on that with as by at from river stone".split()
    prompt = " ".join(rng.choice(words) for _ in range(110))
    ids = tokenize(server, prompt)
    assert len(ids) > 100  # several passes of 64
    opts = {"temperature": 0, "logprobs": 3, "extra_body": {"ignore_eos": True}}
    gen = completion_native(server, {"prompt": ids, "n_predict": 20, "temperature": 0,
                                     "return_tokens": True, "ignore_eos": True})["tokens"]
    ref = client.completions.create(model=MODEL_ID, prompt=ids, max_tokens=20, **opts)
    ref_lp = ref.choices[0].logprobs
    full = ids + gen
    r = post(server, "/v1/completions", {"prompt": full, "max_tokens": 0, "echo": True,
                                         "temperature": 0, "logprobs": 3})
    assert r.status_code == 200, r.text
    a = r.json()
    c, lp = a["choices"][0], a["choices"][0]["logprobs"]
    assert c["finish_reason"] == "length"
    assert a["usage"]["completion_tokens"] == 0 and a["usage"]["prompt_tokens"] == len(full)
    assert len(lp["tokens"]) == len(lp["token_logprobs"]) == len(lp["text_offset"]) == len(full)
    assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
    assert lp["token_logprobs"][len(ids):] == ref_lp.token_logprobs
    assert lp["top_logprobs"][len(ids):] == ref_lp.top_logprobs
    assert c["text"].endswith(ref.choices[0].text) and prompt.strip() in c["text"]
    offsets = lp["text_offset"]
    assert offsets == sorted(offsets) and offsets[-1] <= len(c["text"].encode())
    for p, top in zip(lp["token_logprobs"][1:], lp["top_logprobs"][1:]):
        assert p <= max(top.values()) <= 0 and len(top) == 3
    # Not vacuous: the prompt's random words are not what the model would have said.
    assert sum(p < max(t.values()) for p, t in zip(lp["token_logprobs"][1:len(ids)],
                                                    lp["top_logprobs"][1:len(ids)])) > 10

    # One token after the echo: the first token of the request without echo, its text after
    # the prompt's, its offset past it.
    one = post(server, "/v1/completions", {"prompt": ids, "max_tokens": 1, "echo": True,
                                           "temperature": 0, "logprobs": 3}).json()
    c1 = one["choices"][0]
    assert c1["logprobs"]["token_logprobs"][:len(ids)] == lp["token_logprobs"][:len(ids)]
    assert c1["logprobs"]["token_logprobs"][-1] == ref_lp.token_logprobs[0]
    assert c1["logprobs"]["tokens"][-1] == ref_lp.tokens[0]
    prompt_text = c["text"][:len(c["text"]) - len(ref.choices[0].text)]
    assert c1["text"] == prompt_text + ref_lp.tokens[0]
    assert c1["logprobs"]["text_offset"][-1] == len(prompt_text.encode())

    # Streamed: the prompt comes first, with its logprobs; the chunks make the same answer.
    raw = post(server, "/v1/completions", {"prompt": ids, "max_tokens": 4, "echo": True,
                                           "temperature": 0, "logprobs": 3,
                                           "stream": True}).text
    chunks = [json.loads(line[6:])["choices"][0] for line in raw.split("\n")
              if line.startswith("data: {")]
    whole = post(server, "/v1/completions", {"prompt": ids, "max_tokens": 4, "echo": True,
                                             "temperature": 0, "logprobs": 3}).json()
    w = whole["choices"][0]
    assert chunks[0]["text"] == prompt_text
    assert "".join(ch["text"] for ch in chunks) == w["text"]
    for key in ["tokens", "token_logprobs", "top_logprobs", "text_offset"]:
        got = [x for ch in chunks if ch["logprobs"] for x in ch["logprobs"][key]]
        assert got == w["logprobs"][key], key

    # Echo without logprobs: the text only; with the OpenAI client too.
    e = client.completions.create(model=MODEL_ID, prompt=ids, max_tokens=4, temperature=0,
                                  echo=True)
    assert e.choices[0].text == w["text"] and e.choices[0].logprobs is None


def test_model_retrieve(server, client):
    m = client.models.retrieve(MODEL_ID)
    assert m.id == MODEL_ID and m.object == "model"
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("gpt-5")


def test_partial_characters_keep_their_bytes(server, client):
    """A token that holds part of a character: /tokenize gives its bytes (as llama-server does),
    and a chat logprob's `bytes` are the token's own bytes, not a replacement character's."""
    emoji = "\U0001F600"
    pieces = post(server, "/tokenize", {"content": emoji, "with_pieces": True}).json()["tokens"]
    raw = b"".join(bytes(p["piece"]) if isinstance(p["piece"], list) else p["piece"].encode()
                   for p in pieces)
    assert raw == emoji.encode() and isinstance(pieces[0]["piece"], list)
    first = pieces[0]["id"]
    r = client.chat.completions.create(model=MODEL_ID, max_tokens=1, temperature=0,
                                       messages=[{"role": "user", "content": "Hi"}],
                                       logprobs=True, top_logprobs=1,
                                       logit_bias={str(first): 100})
    e = r.choices[0].logprobs.content[0]
    assert e.model_extra["id"] == first
    assert bytes(e.bytes) == bytes(pieces[0]["piece"])
    assert emoji.encode().startswith(bytes(e.bytes)) and e.token == "\ufffd"


def completion_native(server, body, stream=False):
    """llama-server's /completion: the answer, or a stream's events (the last has stop: true)."""
    r = post(server, "/completion", dict(body, stream=stream), stream=stream)
    assert r.status_code == 200, r.text
    if not stream:
        return r.json()
    events = [json.loads(line[6:]) for line in r.iter_lines(decode_unicode=True)
              if line.startswith("data: ")]
    assert events[-1]["stop"] is True and all(e["stop"] is False for e in events[:-1])
    return events


def test_llama_server_completion_endpoint(server, client):
    prompt = "Once upon a time"
    body = {"prompt": prompt, "n_predict": 12, "temperature": 0, "return_tokens": True,
            "n_probs": 3, "ignore_eos": True}
    a = completion_native(server, body)
    # The same generation as OpenAI's endpoint gives.
    ref = client.completions.create(model=MODEL_ID, prompt=prompt, max_tokens=12, temperature=0,
                                    extra_body={"ignore_eos": True})
    assert a["content"] == ref.choices[0].text
    assert a["tokens_predicted"] == len(a["tokens"]) == 12 and a["stop_type"] == "limit"
    assert a["tokens_evaluated"] == len(tokenize(server, prompt))
    assert post(server, "/detokenize", {"tokens": a["tokens"]}).json()["content"] == a["content"]
    probs = a["completion_probabilities"]
    assert [p["id"] for p in probs] == a["tokens"]
    for p in probs:
        assert len(p["top_logprobs"]) == 3 and p["top_logprobs"][0]["id"] == p["id"]
    assert a["generation_settings"]["n_predict"] == 12 and a["timings"]["predicted_n"] == 12

    # Streamed: the events' pieces make the same text; the last event carries the summary.
    events = completion_native(server, body, stream=True)
    assert "".join(e["content"] for e in events) == a["content"]
    assert [t for e in events[:-1] for t in e["tokens"]] == a["tokens"]
    assert events[-1]["tokens_predicted"] == 12 and events[-1]["stop_type"] == "limit"

    # A stop string ends it, named; logit_bias pairs ban (false) or force a token.
    word = a["content"][len(a["content"]) // 2:][:3]
    b = completion_native(server, dict(body, stop=[word]))
    assert (b["stop_type"], b["stopping_word"]) == ("word", word)
    assert b["content"] == a["content"][:a["content"].index(word)]
    first = a["tokens"][0]
    banned = completion_native(server, dict(body, n_predict=1, logit_bias=[[first, False]]))
    assert banned["tokens"][0] != first
    forced = completion_native(server, dict(body, n_predict=2, logit_bias=[[first + 1, 100]]))
    assert forced["tokens"] == [first + 1] * 2

    # What Muser does not have is refused by name, never ignored.
    for extra, field in [({"grammar": "root ::= a"}, "grammar"),
                         ({"samplers": ["top_k"]}, "samplers"),
                         ({"n_predict": 0}, "n_predict"), ({"logit_bias": [["hi", 1]]}, "logit_bias"),
                         ({"n_probs": 99}, "n_probs")]:
        r = post(server, "/completion", dict(body, **extra))
        assert r.status_code == 400 and r.json()["error"]["param"] == field, (extra, r.text)


def test_streamed_completion_events_name_their_slot(server):
    """As llama-server: every event of a /completion stream gives the request's slot
    (`id_slot`), the one its last event names; two requests running together have two slots."""
    body = {"prompt": "Once upon a time", "temperature": 0, "ignore_eos": True, "stream": True}
    a = post(server, "/completion", dict(body, n_predict=1024), stream=True)
    assert a.status_code == 200, a.text
    a_lines = (line for line in a.iter_lines(decode_unicode=True) if line.startswith("data: "))
    a_events = [json.loads(next(a_lines)[6:])]  # a is running: its first token has come
    b_events = completion_native(server, dict(body, prompt="The cat", n_predict=8), stream=True)
    a_events += [json.loads(line[6:]) for line in a_lines]
    assert a_events[-1]["stop"] is True and len(a_events) > 2
    for events in (a_events, b_events):
        slot = events[-1]["id_slot"]
        assert slot >= 0 and all(e["id_slot"] == slot for e in events[:-1]), events[:3]
    assert a_events[-1]["id_slot"] != b_events[-1]["id_slot"]


def test_llama_server_limits_new_lines_and_control_tokens(server):
    """llama-server's n_predict is a maximum: past the context's room the answer stops when the
    context is full (`stop_type` limit, `truncated`), as n_predict -1 does even beside an OpenAI
    max_tokens; a streamed answer's `has_new_line` covers the whole text; a generated control
    token gives no text."""
    s = ServerProcess("--ctx-size", "64", "--parallel", "1", "--threads", "2")
    try:
        prompt = "Once upon a time"
        n_prompt = len(tokenize(s, prompt))
        for extra in [{"n_predict": 600}, {"n_predict": -1, "max_tokens": 2}]:
            a = completion_native(s, dict({"prompt": prompt, "temperature": 0,
                                           "ignore_eos": True}, **extra))
            assert a["stop_type"] == "limit" and a["truncated"] is True, extra
            assert a["tokens_predicted"] == 64 - n_prompt, extra
        a = completion_native(s, {"prompt": prompt, "n_predict": 8, "temperature": 0,
                                  "ignore_eos": True})
        assert a["truncated"] is False and a["tokens_predicted"] == 8
        # The OpenAI endpoint keeps its 400 for a prompt plus max_tokens past the context.
        r = post(s, "/v1/completions", {"prompt": prompt, "max_tokens": 600})
        assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"
    finally:
        s.stop()
    body = {"prompt": "Once upon a time", "n_predict": 48, "temperature": 0, "ignore_eos": True}
    whole = completion_native(server, body)
    events = completion_native(server, body, stream=True)
    text = "".join(e["content"] for e in events)
    assert text == whole["content"]
    assert events[-1]["has_new_line"] == whole["has_new_line"] == ("\n" in text)
    bos = tokenize(server, "")[0]  # the default model's <|bos|>, a control token
    forced = completion_native(server, {"prompt": "Hi", "n_predict": 3, "return_tokens": True,
                                        "logit_bias": [[bos, 100]]})
    assert forced["tokens"] == [bos] * 3 and forced["content"] == ""


def test_stop_strings_take_their_tokens_logprobs_along(server, client):
    """A non-streamed answer that a stop string ended has no logprobs for tokens whose text
    starts inside the stop string (they gave the answer nothing)."""
    prompt = "Once upon a time"
    full = client.completions.create(model=MODEL_ID, prompt=prompt, max_tokens=24, temperature=0,
                                     logprobs=1, extra_body={"ignore_eos": True}).choices[0]
    text = full.text
    stop = text[len(text) // 2:][:4]
    cut = client.completions.create(model=MODEL_ID, prompt=prompt, max_tokens=24, temperature=0,
                                    logprobs=1, stop=[stop],
                                    extra_body={"ignore_eos": True}).choices[0]
    assert cut.text == text[:text.index(stop)] and cut.finish_reason == "stop"
    lp = cut.logprobs
    assert lp.text_offset == full.logprobs.text_offset[:len(lp.text_offset)]
    assert all(o < len(cut.text.encode()) for o in lp.text_offset)
    # Every token that began before the stop string is kept.
    kept = [o for o in full.logprobs.text_offset if o < len(cut.text.encode())]
    assert lp.text_offset == kept and len(kept) < len(full.logprobs.text_offset)
    assert lp.tokens == full.logprobs.tokens[:len(kept)]


def test_usage_chunks_and_llama_samplers_on_openai_endpoints(server):
    raw = post(server, "/v1/completions", {"prompt": "Hi", "max_tokens": 3, "stream": True,
                                           "stream_options": {"include_usage": True}}).text
    chunks = [json.loads(line[6:]) for line in raw.split("\n") if line.startswith("data: {")]
    assert all("usage" in c for c in chunks)
    assert all(c["usage"] is None for c in chunks[:-1]) and chunks[-1]["usage"]["total_tokens"]
    for path, body in [("/v1/completions", {"prompt": "Hi"}),
                       ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}]})]:
        for extra, field in [({"grammar": "root ::= \"a\"", "json_schema": {}}, "grammar"),
                             ({"json_schema": {"type": "objet"}}, "json_schema"),
                             ({"samplers": ["top_k"]}, "samplers")]:
            r = post(server, path, dict(body, max_tokens=2, **extra))
            assert r.status_code == 400 and r.json()["error"]["param"] == field, (path, r.text)


# --- llama.cpp's samplers ---------------------------------------------------------------------

# Each of llama.cpp's samplers beyond OpenAI's, turned on, with llama-server's field names.
LLAMA_SAMPLERS = {
    "typical_p": {"typical_p": 0.5},
    "top_n_sigma": {"top_n_sigma": 1.0},
    "xtc": {"xtc_probability": 0.5, "xtc_threshold": 0.05},
    "dynatemp": {"dynatemp_range": 0.5, "dynatemp_exponent": 1.5},
    "mirostat 1": {"mirostat": 1, "mirostat_tau": 4.0, "mirostat_eta": 0.2},
    "mirostat 2": {"mirostat": 2, "mirostat_tau": 3.0, "mirostat_eta": 0.1},
    "min_keep": {"min_keep": 5, "top_p": 0.2},
    "dry": {"dry_multiplier": 0.8, "dry_base": 1.5, "dry_allowed_length": 1,
            "dry_penalty_last_n": 32, "dry_sequence_breakers": ["\n", "."]},
}


@pytest.mark.parametrize("name", list(LLAMA_SAMPLERS))
def test_llama_cpp_samplers_run_reproducibly_on_every_endpoint(server, name):
    """Each is accepted on /completion (and shown in its generation_settings) and on the OpenAI
    endpoints; a seed reproduces the draw; without logprobs (the backend's argmax or top-k
    where the sampler allows it) the tokens are those drawn from the whole logits row."""
    extra = LLAMA_SAMPLERS[name]
    body = {"prompt": "Once upon a time", "n_predict": 16, "temperature": 0.9, "seed": 21,
            "ignore_eos": True, "return_tokens": True, **extra}
    a = completion_native(server, body)
    assert a["tokens_predicted"] == 16
    for k, v in extra.items():
        assert a["generation_settings"][k] == pytest.approx(v), k
    assert completion_native(server, body)["tokens"] == a["tokens"]
    assert completion_native(server, dict(body, n_probs=1))["tokens"] == a["tokens"]
    streamed = completion_native(server, body, stream=True)
    assert [t for e in streamed[:-1] for t in e["tokens"]] == a["tokens"]
    # OpenAI's endpoints read them as /completion does: the same text for the same prompt.
    kw = {"prompt": "Once upon a time", "max_tokens": 16, "temperature": 0.9, "seed": 21,
          "ignore_eos": True, **extra}
    r = post(server, "/v1/completions", kw)
    assert r.status_code == 200 and r.json()["choices"][0]["text"] == a["content"], r.text
    chat = {"messages": [{"role": "user", "content": "Tell me a story"}], "max_tokens": 12,
            "temperature": 0.9, "seed": 5, **extra}
    texts = [post(server, "/v1/chat/completions", chat).json()["choices"][0]["message"]["content"]
             for _ in range(2)]
    assert texts[0] == texts[1]


def repeats(ids: list[int], n: int = 4) -> int:
    """How many of the n-token windows of `ids` occurred before."""
    seen, count = set(), 0
    for i in range(len(ids) - n + 1):
        w = tuple(ids[i:i + n])
        count += w in seen
        seen.add(w)
    return count


def test_dry_breaks_a_greedy_loop(server):
    """The default model's greedy continuation of this prompt falls into a loop
    ("year-year-year-..."); a strong DRY penalty steers it out: a different continuation with
    fewer repeated 4-token windows, the same with or without n_probs (the whole-row path either
    way), and shown in generation_settings with the default breakers."""
    body = {"prompt": "Once upon a time", "n_predict": 60, "temperature": 0, "ignore_eos": True,
            "return_tokens": True}
    greedy = completion_native(server, body)["tokens"]
    assert repeats(greedy) >= 4, greedy
    dry = dict(body, dry_multiplier=2.0)
    a = completion_native(server, dry)
    assert a["tokens"] != greedy and repeats(a["tokens"]) < repeats(greedy), a["content"]
    assert a["generation_settings"]["dry_sequence_breakers"] == ["\n", ":", "\"", "*"]
    assert a["generation_settings"]["dry_penalty_last_n"] == 64
    assert completion_native(server, dict(dry, n_probs=2))["tokens"] == a["tokens"]
    # A dry_base below 1 is llama-server's default; the chat endpoint takes DRY too.
    assert completion_native(server, dict(dry, dry_base=0.5))["generation_settings"][
        "dry_base"] == 1.75
    chat = {"messages": [{"role": "user", "content": "Tell me a story"}], "max_tokens": 40,
            "temperature": 0, "dry_multiplier": 2.0, "dry_sequence_breakers": ["."]}
    r = post(server, "/v1/chat/completions", chat)
    assert r.status_code == 200, r.text


def xtc_pick(alternatives: list[dict], threshold: float) -> int | None:
    """llama.cpp's greedy pick after XTC at probability 1 among the 20 best tokens (top_k 20,
    top-p and min-p off): drop every token at or above the threshold but the least likely of
    them. None where a probability is too near the threshold to say from the reported ones."""
    lp = [a["logprob"] for a in alternatives]
    z = sum(math.exp(x - lp[0]) for x in lp)
    p = [math.exp(x - lp[0]) / z for x in lp]
    if any(abs(q - threshold) < 1e-3 for q in p):
        return None
    above = [i for i, q in enumerate(p) if q >= threshold]
    return alternatives[above[-1] if above else 0]["id"]


def typical_pick(alternatives: list[dict], typical: float) -> int | None:
    """llama.cpp's greedy pick after typical-p among the 20 best tokens: the likeliest of the
    tokens kept, those whose surprise is nearest the entropy until their mass passes p. None
    where two surprises or the mass are too near to order from the reported probabilities."""
    lp = [a["logprob"] for a in alternatives]
    z = sum(math.exp(x - lp[0]) for x in lp)
    p = [math.exp(x - lp[0]) / z for x in lp]
    h = -sum(q * math.log(q) for q in p)
    shift = [abs(-math.log(q) - h) for q in p]
    order = sorted(range(len(p)), key=lambda i: shift[i])
    if any(abs(shift[i] - shift[j]) < 1e-4 for i, j in zip(order, order[1:])):
        return None
    kept, mass = [], 0.0
    for i in order:
        kept.append(i)
        mass += p[i]
        if mass > typical:
            if abs(mass - typical) < 1e-4:
                return None
            break
    return alternatives[min(kept)]["id"]


def test_greedy_with_xtc_or_typical_p_picks_what_the_sampler_says(server):
    """At temperature 0, XTC (probability 1) and typical-p move the pick off the argmax where
    llama.cpp's samplers do: checked step by step against the reported probabilities of the
    20 best tokens (top_k 20, top-p and min-p off, so those 20 are the candidates)."""
    body = {"prompt": "Once upon a time", "n_predict": 24, "temperature": 0, "top_k": 20,
            "top_p": 1.0, "min_p": 0.0, "ignore_eos": True, "return_tokens": True}
    # ignore_eos bans the end token (id 1, as llama-server does): where it is among the 20
    # best, the candidates are the best 21 without it, one of which the report does not show.
    eos = 1
    plain = completion_native(server, body)["tokens"]
    for extra, pick in [({"xtc_probability": 1.0, "xtc_threshold": 0.1},
                         lambda alts: xtc_pick(alts, 0.1)),
                        ({"typical_p": 0.3}, lambda alts: typical_pick(alts, 0.3))]:
        a = completion_native(server, dict(body, n_probs=20, **extra))
        steps = a["completion_probabilities"]
        assert [s["id"] for s in steps] == a["tokens"]
        checked = 0
        for s in steps:
            assert s["id"] != eos, (extra, s)
            if any(t["id"] == eos for t in s["top_logprobs"]):
                continue
            want = pick(s["top_logprobs"])
            if want is not None:
                assert s["id"] == want, (extra, s)
                checked += 1
        assert checked >= 20, (extra, checked)
        # Off the argmax somewhere, so not plain greedy; the same without logprobs (the
        # backend's top 20 instead of the row).
        assert any(s["id"] != s["top_logprobs"][0]["id"] for s in steps), extra
        assert a["tokens"] != plain, extra
        assert completion_native(server, dict(body, **extra))["tokens"] == a["tokens"], extra
    # min_keep 20 leaves XTC nothing to remove from 20 candidates: plain greedy.
    kept = completion_native(server, dict(body, xtc_probability=1.0, xtc_threshold=0.1,
                                          min_keep=20))
    assert kept["tokens"] == plain


def test_cached_prefix_is_reported(client):
    prompt = "It is a truth universally acknowledged, that a single man in possession of"
    first = client.completions.create(model=MODEL_ID, prompt=prompt, max_tokens=4, temperature=0)
    again = client.completions.create(model=MODEL_ID, prompt=prompt, max_tokens=4, temperature=0)
    n = first.usage.prompt_tokens
    assert again.usage.prompt_tokens_details.cached_tokens == n - 1
    assert again.choices[0].text == first.choices[0].text


def test_llama_server_timings(client):
    """Each answer carries llama-server's `timings`: counts that agree with the usage, times that
    are positive, and rates that are their quotients; a stream carries them on its finish chunk."""
    prompt = "The best things in life are"
    client.completions.create(model=MODEL_ID, prompt=prompt, max_tokens=2, temperature=0)
    r = client.completions.create(model=MODEL_ID, prompt=prompt, max_tokens=12, temperature=0,
                                  extra_body={"ignore_eos": True})
    t = r.model_extra["timings"]
    u = r.usage
    assert t["cache_n"] == u.prompt_tokens_details.cached_tokens == u.prompt_tokens - 1
    assert t["prompt_n"] == 1 and t["predicted_n"] == u.completion_tokens == 12
    assert t["prompt_ms"] > 0 and t["predicted_ms"] > 0
    for part in ("prompt", "predicted"):
        n, ms = t[f"{part}_n"], t[f"{part}_ms"]
        assert t[f"{part}_per_token_ms"] == pytest.approx(ms / n)
        assert t[f"{part}_per_second"] == pytest.approx(n * 1e3 / ms)

    chunks = list(client.chat.completions.create(
        model=MODEL_ID, messages=[{"role": "user", "content": "Tell me a fortune."}],
        max_tokens=6, temperature=0, stream=True, stream_options={"include_usage": True},
        extra_body={"ignore_eos": True}))
    timed = [ch for ch in chunks if (ch.model_extra or {}).get("timings")]
    assert len(timed) == 1 and timed[0].choices[0].finish_reason == "length"
    t = timed[0].model_extra["timings"]
    assert t["predicted_n"] == chunks[-1].usage.completion_tokens == 6
    assert t["prompt_n"] + t["cache_n"] == chunks[-1].usage.prompt_tokens


def test_stop_strings(client):
    base = client.completions.create(model=MODEL_ID, prompt="Once upon a time", max_tokens=40,
                                     temperature=0).choices[0].text
    word = base.split()[2]
    r = client.completions.create(model=MODEL_ID, prompt="Once upon a time", max_tokens=40,
                                  temperature=0, stop=[word, "zzzz"])
    assert r.choices[0].text == base[: base.index(word)]
    assert r.choices[0].finish_reason == "stop"


def test_logit_bias(server, client):
    """OpenAI's logit_bias through the real client: +100 on a token makes a greedy request emit
    it at every step; -100 on a greedy pick moves the request off it."""
    forced = tokenize(server, " moon", add_special=False)[0]
    piece = post(server, "/detokenize", {"tokens": [forced]}).json()["content"]
    assert piece
    r = client.completions.create(model=MODEL_ID, prompt="The sky", max_tokens=4, temperature=0,
                                  logit_bias={str(forced): 100})
    assert r.choices[0].text == piece * 4
    base = client.completions.create(model=MODEL_ID, prompt="The sky", max_tokens=1,
                                     temperature=0).choices[0].text
    first = tokenize(server, base, add_special=False)[0]
    banned = client.completions.create(model=MODEL_ID, prompt="The sky", max_tokens=1,
                                       temperature=0, logit_bias={str(first): -100})
    assert tokenize(server, banned.choices[0].text, add_special=False)[0] != first
    # Chat takes it too; sampled requests with a bias are reproducible by seed.
    r = client.chat.completions.create(model=MODEL_ID, max_tokens=3, temperature=0,
                                       messages=[{"role": "user", "content": "Hi"}],
                                       logit_bias={str(forced): 100})
    assert r.choices[0].message.content == piece * 3
    kw = dict(model=MODEL_ID, prompt="You will", max_tokens=8, temperature=1.0, seed=3,
              logit_bias={str(forced): 2.5})
    assert client.completions.create(**kw).choices[0].text == \
        client.completions.create(**kw).choices[0].text


def test_token_array_prompt(server, client):
    ids = tokenize(server, "Love is")
    a = client.completions.create(model=MODEL_ID, prompt=ids, max_tokens=10, temperature=0)
    b = client.completions.create(model=MODEL_ID, prompt="Love is", max_tokens=10,
                                  temperature=0)
    assert a.choices[0].text == b.choices[0].text


def test_tokenize_detokenize(server):
    ids = tokenize(server, "Hello, world!", add_special=False)
    assert ids and 0 not in ids  # no BOS without add_special
    r = post(server, "/detokenize", {"tokens": ids})
    assert r.json() == {"content": "Hello, world!"}
    pieces = post(server, "/tokenize", {"content": "Hi there", "with_pieces": True}).json()
    assert "".join(p["piece"] for p in pieces["tokens"]) == "Hi there"


# --- concurrency, disconnect ------------------------------------------------------------------

PROMPTS = [
    "Once upon a time", "The meaning of life is", "A penny saved", "You will",
    "Q: Why did the chicken cross the road?\nA:", "Never", "In the beginning", "Love",
    "The best way to predict the future", "He who laughs last", "Today", "Beware of",
    "There are two kinds of people", "If at first you don't succeed,", "Your lucky number is",
    "It is a truth universally acknowledged",
]


def test_16_concurrent_streams_match_their_solo_runs(server, client):
    def run(prompt: str, stream: bool) -> str:
        kw = dict(model=MODEL_ID, prompt=prompt, max_tokens=48, temperature=0)
        if not stream:
            return client.completions.create(**kw).choices[0].text
        return "".join(ch.choices[0].text for ch in client.completions.create(stream=True, **kw))

    solo = [run(p, False) for p in PROMPTS]
    barrier = threading.Barrier(len(PROMPTS))

    def together(p: str) -> str:
        barrier.wait(timeout=30)
        return run(p, True)

    before = server.metrics()
    with ThreadPoolExecutor(len(PROMPTS)) as ex:
        concurrent = list(ex.map(together, PROMPTS))
    for p, a, b in zip(PROMPTS, solo, concurrent):
        assert a == b, p
    # The streams shared decode steps: the mean group (rows per step) is well above one.
    after = server.metrics()
    steps = after["decode_steps_total"] - before["decode_steps_total"]
    rows = after["decode_rows_total"] - before["decode_rows_total"]
    generated = after["tokens_predicted_total"] - before["tokens_predicted_total"]
    # A request's first token comes from its prefill, each later one (or its end of text) from
    # a decode step.
    assert generated - len(PROMPTS) <= rows <= generated, (rows, generated)
    # Mean group above 2: the clients start within a barrier, not in one step (CI saw 3.4).
    assert rows / steps > 2, (rows, steps)


def test_disconnect_mid_stream_frees_the_slot(server):
    before = server.metrics()
    r = requests.post(server.url + "/v1/completions", stream=True, timeout=60,
                      json={"prompt": "Once upon a time", "max_tokens": N_CTX - 16,
                            "temperature": 0, "stream": True, "ignore_eos": True})
    lines = r.iter_lines()
    got = 0
    for line in lines:
        if line.startswith(b"data: {"):
            got += 1
            if got == 3:
                break
    r.close()  # the client goes away after three tokens
    server.wait_metric("requests_processing", lambda v: v == 0)
    server.wait_metric("requests_cancelled_total",
                       lambda v: v == before["requests_cancelled_total"] + 1)
    after = server.metrics()
    generated = after["tokens_predicted_total"] - before["tokens_predicted_total"]
    assert generated < (N_CTX - 16) / 2, generated
    # The server goes on serving.
    assert post(server, "/v1/completions", {"prompt": "Hi", "max_tokens": 2}).status_code == 200


# --- llama-server's /props and /slots ---------------------------------------------------------


def get_json(server, path: str):
    r = requests.get(server.url + path, headers=server.headers, timeout=10)
    assert r.status_code == 200, r.text
    return r.json()


def test_props_describe_the_server(server):
    p = get_json(server, "/props")
    assert p["total_slots"] == 16
    d = p["default_generation_settings"]
    assert d["n_ctx"] == N_CTX
    # A request that sets nothing: until the context is full, llama.cpp's default sampler.
    assert (d["params"]["n_predict"], d["params"]["top_k"]) == (-1, 40)
    assert d["params"]["temperature"] == pytest.approx(0.8)
    # llama.cpp's other samplers, off (llama.cpp's defaults).
    assert {k: d["params"][k] for k in ["typical_p", "top_n_sigma", "xtc_probability",
                                        "dynatemp_range", "mirostat", "min_keep"]} == \
        {"typical_p": 1.0, "top_n_sigma": -1.0, "xtc_probability": 0.0, "dynatemp_range": 0.0,
         "mirostat": 0, "min_keep": 0}
    assert (d["params"]["mirostat_tau"], d["params"]["mirostat_eta"]) == \
        (5.0, pytest.approx(0.1))
    assert p["modalities"] == {"vision": False, "video": False, "audio": False}
    assert p["model_path"] == str(MODEL)
    # The template it renders with (the model has none: Muser's fallback), rendered by Jinja as
    # a client would, gives /apply-template's prompt.
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    env = jinja2.Environment(trim_blocks=True, lstrip_blocks=True)
    want = env.from_string(p["chat_template"]).render(
        messages=msgs, add_generation_prompt=True, bos_token=p["bos_token"],
        eos_token=p["eos_token"])
    assert post(server, "/apply-template", {"messages": msgs}).json()["prompt"] == want
    # BOS and EOS by their text: the tokens a prompt starts with and a request ends on.
    assert tokenize(server, "", add_special=True) == tokenize(server, p["bos_token"], False)
    assert len(tokenize(server, p["eos_token"], False)) == 1
    # llama-server changes its settings only when started with --props; Muser never does.
    r = post(server, "/props", {"n_ctx": 5})
    assert r.status_code == 501 and r.json()["error"]["type"] == "not_supported_error"


def test_props_follow_the_command_line(tmp_path):
    """Another --parallel, --ctx-size and --chat-template-file: /props and /slots follow."""
    template = "{% for m in messages %}<{{ m.role }}>{{ m.content }}</{{ m.role }}>{% endfor %}"
    path = tmp_path / "t.jinja"
    path.write_text(template)
    s = ServerProcess("--parallel", "3", "--ctx-size", "640", "--chat-template-file", str(path),
                      "--threads", "2")
    try:
        p = get_json(s, "/props")
        assert (p["total_slots"], p["default_generation_settings"]["n_ctx"]) == (3, 640)
        assert p["chat_template"] == template
        assert [(x["id"], x["n_ctx"]) for x in get_json(s, "/slots")] == [(0, 640), (1, 640),
                                                                         (2, 640)]
    finally:
        s.stop()


def test_slots_show_the_running_request(server):
    idle = get_json(server, "/slots")
    assert [s["id"] for s in idle] == list(range(16))
    assert all(s["n_ctx"] == N_CTX and not s["is_processing"] for s in idle)

    body = {"prompt": "Once upon a time", "n_predict": 512, "temperature": 0.5, "seed": 3,
            "ignore_eos": True, "stream": True}
    r = post(server, "/completion", body, stream=True)
    assert r.status_code == 200, r.text
    lines = (line for line in r.iter_lines(decode_unicode=True) if line.startswith("data: "))
    first = json.loads(next(lines)[6:])  # the request is running: its first token has come
    busy = [s for s in get_json(server, "/slots") if s["is_processing"]]
    assert [s["id"] for s in busy] == [first["id_slot"]], busy
    s = busy[0]
    assert s["n_prompt_tokens"] == first["tokens_evaluated"]
    assert (s["params"]["n_predict"], s["params"]["seed"], s["params"]["ignore_eos"]) == \
        (512, 3, True)
    assert s["params"]["temperature"] == pytest.approx(0.5)
    t = s["next_token"][0]
    assert t["has_next_token"] is True and t["n_decoded"] + t["n_remain"] == 512, t

    events = [json.loads(line[6:]) for line in lines]
    assert events[-1]["stop"] is True and events[-1]["tokens_predicted"] == 512
    # Once the client has the end, no slot is processing; the slot keeps the request's counts.
    after = get_json(server, "/slots")
    assert not any(x["is_processing"] for x in after), after
    mine = after[first["id_slot"]]
    assert mine["id_task"] == s["id_task"]
    t = mine["next_token"][0]
    assert (t["has_next_token"], t["n_decoded"], t["n_remain"]) == (False, 512, 0)


# --- bad requests -----------------------------------------------------------------------------

BAD = [
    # (name, path, body, status, param or code that must appear)
    ("malformed json", "/v1/completions", b'{"prompt": "hi", ', 400, "invalid_json"),
    ("not an object", "/v1/completions", b"[1, 2]", 400, "invalid_json"),
    ("invalid utf-8", "/v1/completions", b'{"prompt": "\xff\xfe"}', 400, "invalid_utf8"),
    ("wrong type", "/v1/completions", {"prompt": "hi", "temperature": "hot"}, 400, "temperature"),
    ("prompt type", "/v1/completions", {"prompt": {"a": 1}}, 400, "prompt"),
    ("no prompt", "/v1/completions", {"max_tokens": 3}, 400, "prompt"),
    ("negative max_tokens", "/v1/completions", {"prompt": "hi", "max_tokens": -1}, 400,
     "max_tokens"),
    ("huge max_tokens", "/v1/completions", {"prompt": "hi", "max_tokens": 10**30}, 400,
     "max_tokens"),
    ("negative top_k", "/v1/completions", {"prompt": "hi", "top_k": -2}, 400, "top_k"),
    ("huge temperature", "/v1/completions", {"prompt": "hi", "temperature": 1e300}, 400,
     "temperature"),
    ("token id out of range", "/v1/completions", {"prompt": [1, 2, 4096]}, 400, "prompt"),
    ("negative token id", "/v1/completions", {"prompt": [-1]}, 400, "prompt"),
    ("tokens and text mixed", "/completion", {"prompt": [1, "hi"]}, 400, "prompt"),
    ("two prompts on /completion", "/completion", {"prompt": ["a", "b"]}, 400, "prompt"),
    ("a bad prompt among several", "/v1/completions", {"prompt": ["a", [1, "x"]]}, 400,
     "prompt"),
    ("more choices than the server takes", "/v1/completions",
     {"prompt": ["a"] * 20, "n": 16}, 400, "prompt"),
    ("grammar that does not parse", "/completion", {"prompt": "hi", "grammar": "root ::= \"a"},
     400, "grammar"),
    ("grammar with an undefined rule", "/v1/completions",
     {"prompt": "hi", "grammar": "root ::= item+"}, 400, "grammar"),
    ("lazy grammar without triggers", "/completion",
     {"prompt": "hi", "grammar": "root ::= \"a\"", "grammar_lazy": True}, 400,
     "grammar_triggers"),
    ("grammar not a string", "/completion", {"prompt": "hi", "grammar": {"root": "a"}}, 400,
     "grammar"),
    ("grammar and json_schema", "/completion",
     {"prompt": "hi", "grammar": "root ::= \"a\"", "json_schema": {"type": "string"}}, 400,
     "grammar"),
    ("unknown response_format", "/v1/chat/completions",
     {"messages": [{"role": "user", "content": "hi"}], "response_format": {"type": "xml"}}, 400,
     "response_format"),
    ("response_format not an object", "/v1/chat/completions",
     {"messages": [{"role": "user", "content": "hi"}], "response_format": "json"}, 400,
     "response_format"),
    ("json_schema with a remote $ref", "/v1/chat/completions",
     {"messages": [{"role": "user", "content": "hi"}],
      "response_format": {"type": "json_schema", "json_schema": {
          "name": "x", "schema": {"$ref": "https://example.com/s.json"}}}}, 400,
     "response_format"),
    ("unknown model", "/v1/completions", {"model": "gpt-5", "prompt": "hi"}, 404,
     "model_not_found"),
    ("n past the slots", "/v1/completions", {"prompt": "hi", "n": 17}, 400, "n"),
    ("n of 0", "/v1/chat/completions",
     {"messages": [{"role": "user", "content": "hi"}], "n": 0}, 400, "n"),
    ("n_cmpl past the slots", "/v1/completions", {"prompt": "hi", "n_cmpl": 40}, 400,
     "n_cmpl"),
    ("n on /completion", "/completion", {"prompt": "hi", "n": 2}, 400, "n"),
    ("no messages", "/v1/chat/completions", {"messages": []}, 400, "messages"),
    ("echo on chat", "/v1/chat/completions",
     {"messages": [{"role": "user", "content": "hi"}], "echo": True}, 400, "echo"),
    ("max_tokens 0 without echo", "/v1/completions", {"prompt": "hi", "max_tokens": 0}, 400,
     "max_tokens"),
    ("bad role", "/v1/chat/completions", {"messages": [{"role": "x", "content": "hi"}]}, 400,
     "messages"),
    ("top_logprobs > 20", "/v1/chat/completions",
     {"messages": [{"role": "user", "content": "hi"}], "logprobs": True, "top_logprobs": 50},
     400, "top_logprobs"),
    ("detokenize bad id", "/detokenize", {"tokens": [5, 99999]}, 400, "tokens"),
    ("logit_bias id out of range", "/v1/completions",
     {"prompt": "hi", "logit_bias": {"4096": 1}}, 400, "logit_bias"),
    ("logit_bias value out of range", "/v1/completions",
     {"prompt": "hi", "logit_bias": {"5": -250}}, 400, "logit_bias"),
    ("tools on completions", "/v1/completions",
     {"prompt": "hi",
      "tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}]},
     400, "tools"),
    ("tokenize no content", "/tokenize", {"text": "hi"}, 400, "content"),
    ("mirostat 3", "/v1/chat/completions",
     {"messages": [{"role": "user", "content": "hi"}], "mirostat": 3}, 400, "mirostat"),
    ("typical_p string", "/completion", {"prompt": "hi", "typical_p": "x"}, 400, "typical_p"),
    ("typical_p string chat", "/v1/chat/completions",
     {"messages": [{"role": "user", "content": "hi"}], "typical_p": "x"}, 400, "typical_p"),
    ("xtc_probability past 1", "/completion", {"prompt": "hi", "xtc_probability": 2}, 400,
     "xtc_probability"),
    ("top_n_sigma past f32", "/v1/completions", {"prompt": "hi", "top_n_sigma": 1e300}, 400,
     "top_n_sigma"),
    ("negative min_keep", "/completion", {"prompt": "hi", "min_keep": -1}, 400, "min_keep"),
    ("dry_multiplier string", "/completion", {"prompt": "hi", "dry_multiplier": "x"}, 400,
     "dry_multiplier"),
    ("negative dry_allowed_length", "/v1/completions",
     {"prompt": "hi", "dry_allowed_length": -1}, 400, "dry_allowed_length"),
    ("dry_penalty_last_n -1", "/completion", {"prompt": "hi", "dry_penalty_last_n": -1}, 400,
     "dry_penalty_last_n"),
    ("empty dry_sequence_breakers", "/completion",
     {"prompt": "hi", "dry_multiplier": 0.8, "dry_sequence_breakers": []}, 400,
     "dry_sequence_breakers"),
    ("dry_sequence_breakers of numbers", "/v1/chat/completions",
     {"messages": [{"role": "user", "content": "hi"}], "dry_sequence_breakers": [1]}, 400,
     "dry_sequence_breakers"),
    ("mirostat_eta type", "/v1/chat/completions",
     {"messages": [{"role": "user", "content": "hi"}], "mirostat_eta": [0.1]}, 400,
     "mirostat_eta"),
]


@pytest.mark.parametrize("name,path,body,status,what", BAD, ids=[b[0] for b in BAD])
def test_bad_request(server, name, path, body, status, what):
    r = post(server, path, body)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) >= {"message", "type", "code"}
    assert err["message"]
    assert what in (err["code"], err["param"]), err


def test_whole_numbers_count_as_integers(server):
    r = post(server, "/v1/completions", {"prompt": "hi", "max_tokens": 2.0, "n": 1.0})
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 2
    r = post(server, "/v1/completions", {"prompt": "hi", "seed": 2.5})
    assert r.status_code == 400
    assert r.json()["error"]["message"] == "seed must be an integer, got 2.5"


def test_prompt_past_the_context(server, client):
    n_prompt = len(tokenize(server, "Once upon a time"))
    r = post(server, "/v1/completions", {"prompt": "Once upon a time", "max_tokens": N_CTX})
    assert r.status_code == 400
    err = r.json()["error"]
    assert err["code"] == "context_length_exceeded"
    assert (err["n_prompt_tokens"], err["n_ctx"]) == (n_prompt, N_CTX)
    long = [2 + i % 4000 for i in range(N_CTX)]
    r = post(server, "/v1/completions", {"prompt": long})
    assert r.status_code == 400 and r.json()["error"]["n_prompt_tokens"] == N_CTX
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model=MODEL_ID, prompt="hi", max_tokens=N_CTX + 1)


def test_body_over_the_limit(server):
    big = json.dumps({"prompt": "x" * (9 << 20)})
    r = post(server, "/v1/completions", big)
    assert r.status_code == 413
    assert r.json()["error"]["code"] == "request_too_large"

    # Without Content-Length (chunked): the limit holds while reading.
    def chunks():
        yield b'{"prompt": "'
        for _ in range(9):
            yield b"x" * (1 << 20)
        yield b'"}'

    r = requests.post(server.url + "/v1/completions", data=chunks(), timeout=60)
    assert r.status_code == 413


def test_unknown_route_and_server_survives(server, client):
    r = requests.get(server.url + "/v1/nothing", timeout=10)
    assert r.status_code == 404 and r.json()["error"]["code"] == "not_found"
    assert client.completions.create(model=MODEL_ID, prompt="Hi", max_tokens=2).choices


# --- overload and the API key -----------------------------------------------------------------


LONG_CTX = 20000


@pytest.fixture(scope="module")
def small_server():
    # A context long enough that a stream (with ignore_eos) outlasts the test's requests (about
    # 10 s of tokens; the stream is cancelled when the test closes it).
    s = ServerProcess("--parallel", "1", "--max-queue", "1", "--ctx-size", str(LONG_CTX),
                      "--api-key", "sesame", "--threads", "2")
    yield s
    s.stop()


def test_api_key(small_server):
    url = small_server.url
    assert requests.get(url + "/health", timeout=10).status_code == 200
    r = requests.post(url + "/v1/completions", json={"prompt": "hi", "max_tokens": 1}, timeout=10)
    assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
    # /props and /slots too (llama-server leaves only /health open).
    for path in ["/props", "/slots"]:
        assert requests.get(url + path, timeout=10).status_code == 401, path
        assert get_json(small_server, path), path
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=url + "/v1", api_key="wrong", max_retries=0).completions.create(
            model=MODEL_ID, prompt="hi", max_tokens=1)
    ok = openai.OpenAI(base_url=url + "/v1", api_key="sesame", max_retries=0)
    assert ok.completions.create(model=MODEL_ID, prompt="hi", max_tokens=2).choices
    # The scheme's name is case-insensitive.
    r = requests.post(url + "/v1/completions", json={"prompt": "hi", "max_tokens": 1},
                      headers={"Authorization": "bearer sesame"}, timeout=10)
    assert r.status_code == 200, r.text


def test_more_clients_than_slots_and_queue_get_503(small_server):
    s = small_server
    auth = {"Authorization": "Bearer sesame"}
    # ignore_eos: the greedy text would end on its own after ~80 tokens, freeing the slot.
    body = {"prompt": "Once upon a time", "max_tokens": LONG_CTX - 16, "temperature": 0,
            "stream": True, "ignore_eos": True}

    def open_stream():
        r = requests.post(s.url + "/v1/completions", json=body, headers=auth, stream=True,
                          timeout=60)
        assert r.status_code == 200
        return r

    a = open_stream()  # takes the only slot
    # Keep the line iterator referenced: a dropped one closes the connection (urllib3), which
    # the server rightly takes as a disconnect.
    a_lines = a.iter_lines()
    for line in a_lines:
        if line.startswith(b"data: {"):
            break
    # The only slot is busy: llama-server's `fail_on_no_slot` check says so.
    assert [x["is_processing"] for x in get_json(s, "/slots")] == [True]
    r = requests.get(s.url + "/slots?fail_on_no_slot=1", headers=auth, timeout=10)
    assert r.status_code == 503, r.text
    b = open_stream()  # waits in the queue (headers come at once; tokens later)
    s.wait_metric("requests_deferred", lambda v: v == 1)
    r = requests.post(s.url + "/v1/completions", json=body, headers=auth, timeout=60)
    assert r.status_code == 503, r.text
    assert r.json()["error"]["code"] == "server_overloaded"
    with pytest.raises(openai.InternalServerError):  # the client's class for 5xx
        openai.OpenAI(base_url=s.url + "/v1", api_key="sesame", max_retries=0).completions.create(
            model=MODEL_ID, prompt="hi", max_tokens=1)
    a.close()
    b.close()
    del a_lines
    s.wait_metric("requests_processing", lambda v: v == 0)
    s.wait_metric("requests_deferred", lambda v: v == 0)
    ok = requests.post(s.url + "/v1/completions", headers=auth, timeout=60,
                       json={"prompt": "hi", "max_tokens": 2})
    assert ok.status_code == 200


def test_free_slots_take_requests_with_no_queue():
    """`--max-queue 0`: no request waits, but every free slot takes one; only a request that
    finds every slot busy gets 503."""
    s = ServerProcess("--parallel", "2", "--max-queue", "0", "--ctx-size", str(LONG_CTX),
                      "--threads", "2")
    try:
        body = {"prompt": "Once upon a time", "max_tokens": LONG_CTX - 16, "temperature": 0,
                "stream": True, "ignore_eos": True}
        streams, lines = [], []
        for _ in range(2):
            r = requests.post(s.url + "/v1/completions", json=body, stream=True, timeout=60)
            assert r.status_code == 200, r.text
            it = r.iter_lines()
            for line in it:
                if line.startswith(b"data: {"):
                    break
            streams.append(r)
            lines.append(it)
        s.wait_metric("requests_processing", lambda v: v == 2)
        r = requests.post(s.url + "/v1/completions", json=body, timeout=60)
        assert r.status_code == 503 and r.json()["error"]["code"] == "server_overloaded"
        for r in streams:
            r.close()
        del lines
        s.wait_metric("requests_processing", lambda v: v == 0)
        ok = requests.post(s.url + "/v1/completions", json={"prompt": "hi", "max_tokens": 2},
                           timeout=60)
        assert ok.status_code == 200, ok.text
    finally:
        s.stop()


def test_a_conversation_comes_back_from_the_host_cache():
    """One slot: a long prompt, then another that takes the slot, then the first again with a
    new tail: its prefix comes back from host memory (`--cache-ram`), counted in the cached
    tokens and in `prompt_tokens_restored_total`, and the answer is the one computed without."""
    first = ("It was the best of times, it was the worst of times, it was the age of wisdom, "
             "it was the age of foolishness, it was the epoch of belief. ") * 3
    second = "Call me Ishmael. Some years ago, never mind how long precisely. " * 4
    runs = {}
    for mib in ["64", "0"]:
        s = ServerProcess("--parallel", "1", "--cache-ram", mib, "--threads", "2")
        try:
            c = openai.OpenAI(base_url=s.url + "/v1", api_key="none", max_retries=0)
            ask = lambda p: c.completions.create(model=MODEL_ID, prompt=p, max_tokens=8,
                                                 temperature=0)
            n_first = ask(first).usage.prompt_tokens
            ask(second)
            again = ask(first + "So it goes.")
            runs[mib] = (again, n_first, s.metrics())
        finally:
            s.stop()
    (on, n_first, m_on), (off, _, m_off) = runs["64"], runs["0"]
    assert on.choices[0].text == off.choices[0].text
    cached = on.usage.prompt_tokens_details.cached_tokens
    assert n_first - 3 <= cached <= n_first  # the shared prefix (a token may merge at the seam)
    assert m_on["prompt_tokens_restored_total"] == cached
    assert m_on["prompt_cache_tokens"] >= n_first and m_on["prompt_cache_bytes"] > 0
    assert off.usage.prompt_tokens_details.cached_tokens <= 1  # BOS at most
    assert m_off["prompt_tokens_restored_total"] == 0 and m_off["prompt_cache_bytes"] == 0


def test_slot_files_save_restore_and_erase(server, tmp_path):
    """llama-server's slot actions under `--slot-save-path`: a slot's cache saved to a file,
    the slot erased, the file taken back, by this server and by a fresh one: a request with the
    prompt then reuses it (cached) and answers as computed from scratch. Bad names, actions,
    slots and files are refused by name; a server without the path answers 501."""
    prompt = ("It was the best of times, it was the worst of times, it was the age of wisdom, "
              "it was the age of foolishness. ") * 3
    runs = []
    for fresh in [False, True]:
        s = ServerProcess("--parallel", "1", "--slot-save-path", str(tmp_path), "--cache-ram",
                          "0", "--threads", "2")
        try:
            c = openai.OpenAI(base_url=s.url + "/v1", api_key="none", max_retries=0)
            ask = lambda p: c.completions.create(model=MODEL_ID, prompt=p, max_tokens=8,
                                                 temperature=0)
            if not fresh:
                first = ask(prompt)
                n = first.usage.prompt_tokens
                saved = post(s, "/slots/0?action=save", {"filename": "a.bin"}).json()
                assert saved["id_slot"] == 0 and saved["filename"] == "a.bin"
                assert saved["n_saved"] >= n  # the prompt and the tokens decoded after it
                assert saved["n_written"] == (tmp_path / "a.bin").stat().st_size
                erased = post(s, "/slots/0?action=erase", {}).json()
                assert erased == {"id_slot": 0, "n_erased": saved["n_saved"]}
                assert ask(prompt).usage.prompt_tokens_details.cached_tokens <= 1
                for body, param in [({"filename": "../a.bin"}, "filename"), ({}, "filename"),
                                    ({"filename": "none.bin"}, "filename")]:
                    r = post(s, "/slots/0?action=restore", body)
                    assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text
                (tmp_path / "bad.bin").write_bytes(b"MUSERKV1" + b"\xff" * 40)
                r = post(s, "/slots/0?action=restore", {"filename": "bad.bin"})
                assert r.status_code == 400 and "header" in r.json()["error"]["message"], r.text
                r = post(s, "/slots/0?action=rename", {"filename": "a.bin"})
                assert r.status_code == 400 and r.json()["error"]["param"] == "action"
                r = post(s, "/slots/3?action=save", {"filename": "b.bin"})
                assert r.status_code == 400 and r.json()["error"]["param"] == "id_slot"
            restored = post(s, "/slots/0?action=restore", {"filename": "a.bin"}).json()
            assert restored["n_restored"] == saved["n_saved"]
            assert restored["n_read"] == saved["n_written"]
            back = ask(prompt)
            runs.append((back.choices[0].text, back.usage.prompt_tokens_details.cached_tokens))
        finally:
            s.stop()
    assert runs == [(first.choices[0].text, n - 1)] * 2
    r = post(server, "/slots/0?action=save", {"filename": "a.bin"})
    assert r.status_code == 501 and r.json()["error"]["code"] == "not_supported"
