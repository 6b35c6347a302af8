"""`POST /infill` (llama-server's fill-in-the-middle endpoint) on a synthesized llama-tiny given
fill-in-the-middle tokens (its reserved control tokens named in the metadata with the `gguf`
package's own script), beside llama-server on the same file:

- random prefixes, suffixes, extra files and prompts, short and past llama-server's limits
  (3/4 of its 2,048-token batch for the prefix, the rest of a quarter for the suffix, what the
  context leaves for the extra files): the same prompt (its text, control tokens written out),
  the same token count and the same greedy answer, for a repo-level model (FIM_REP, FIM_SEP), one
  without them (extra files after a "--- snippet ---" line) and with `--spm-infill`;
- streamed and whole answers agree;
- bad requests name their field; a model without the tokens answers 501.
"""

from __future__ import annotations

import json
import os
import random
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import requests

from test_server import ServerProcess, muser_bin, post

LLAMA_BIN = os.environ.get("LLAMA_CPP_BIN")
N_CTX = 8192
WORDS = ("def return if else for while class import self value index result x y z = ( ) : "
         "+ - * river stone light").split()


def edit(src: Path, dst: Path, *args: str) -> None:
    subprocess.run([sys.executable, "-m", "gguf.scripts.gguf_new_metadata", str(src), str(dst),
                    *args, "--force"], check=True, capture_output=True)


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("infill")
    plain = d / "plain.gguf"
    subprocess.run([str(muser_bin()), "synth", "llama-tiny", str(plain)], check=True,
                   capture_output=True)
    fim = ["--special-token-by-id", "fim_pre", "2038", "--special-token-by-id", "fim_suf", "2039",
           "--special-token-by-id", "fim_mid", "2040"]
    repo = ["--special-token-by-id", "fim_rep", "2041", "--special-token-by-id", "fim_sep", "2042",
            "--special-token-by-id", "fim_pad", "2043"]
    out = {"plain": plain, "fim": d / "fim.gguf", "repo": d / "repo.gguf"}
    edit(plain, out["fim"], *fim)
    edit(plain, out["repo"], *fim, *repo)
    # A training context of 8192, so that llama-server does not cap its slot's context below
    # Muser's (it caps a slot at the training context).
    for name in ("fim", "repo"):
        subprocess.run([sys.executable, "-m", "gguf.scripts.gguf_set_metadata", str(out[name]),
                        "llama.context_length", str(N_CTX), "--force"], check=True,
                       capture_output=True)
    return out


def words(rng: random.Random, n: int) -> str:
    text = " ".join(rng.choice(WORDS) for _ in range(n))
    return text.replace(": ", ":\n    ", rng.randint(0, 3))


def random_request(rng: random.Random, long: bool) -> dict:
    scale = 1400 if long else 30
    body = {"input_prefix": words(rng, rng.randint(0, 2 * scale)),
            "input_suffix": words(rng, rng.randint(0, scale)),
            "n_predict": 8, "temperature": 0}
    if rng.random() < 0.8:
        body["input_extra"] = [
            {"text": words(rng, rng.randint(1, 4 * scale)),
             **({"filename": f"src/f{i}.py"} if rng.random() < 0.7 else {})}
            for i in range(rng.randint(1, 3))]
    if rng.random() < 0.6:
        body["prompt"] = words(rng, rng.randint(1, 6))
    return body


@pytest.mark.skipif(not (LLAMA_BIN and Path(LLAMA_BIN, "llama-server").exists()),
                    reason="set LLAMA_CPP_BIN to a folder with llama.cpp's llama-server")
@pytest.mark.parametrize("model,spm", [("repo", False), ("fim", False), ("repo", True)])
def test_infill_prompts_and_answers_are_llama_servers(models, model, spm):
    from test_llama_server_compat import LlamaServer
    extra = ["--spm-infill"] if spm else []
    muser = ServerProcess("--parallel", "1", "--ctx-size", str(N_CTX), "--threads", "2", *extra,
                          model=models[model])
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    try:
        llama = LlamaServer(models[model], port, "-np", "1", "-c", str(N_CTX), *extra)
    except Exception:
        muser.stop()
        raise
    rng = random.Random(f"{model}{spm}")
    refused = 0
    try:
        for i in range(8):
            body = random_request(rng, long=i % 2 == 1)
            got = [requests.post(s.url + "/infill", json=body, timeout=300).json()
                   for s in (muser, llama)]
            if "error" in got[1]:
                # llama-server's layout can pass the context by a few tokens (the extra files
                # fill n_ctx - n_batch + 2 positions): both refuse it, with the same count.
                assert got[0]["error"]["n_prompt_tokens"] == got[1]["error"]["n_prompt_tokens"]
                refused += 1
                continue
            for key in ("prompt", "tokens_evaluated", "content", "tokens_predicted"):
                assert got[0][key] == got[1][key], (key, i, json.dumps(body)[:300])
        assert refused < 4
    finally:
        muser.stop()
        llama.stop()


def test_streamed_infill_and_bad_requests(models):
    s = ServerProcess("--parallel", "1", "--ctx-size", "4096", "--threads", "2",
                      model=models["repo"])
    try:
        body = {"input_prefix": "def f(x):\n    ", "input_suffix": "\n    return y\n",
                "input_extra": [{"filename": "a.py", "text": "import os\n"}],
                "n_predict": 24, "temperature": 0, "ignore_eos": True}
        whole = post(s, "/infill", body).json()
        r = requests.post(s.url + "/infill", json={**body, "stream": True}, stream=True,
                          timeout=60)
        events = [json.loads(line[6:]) for line in r.iter_lines()
                  if line.startswith(b"data: {")]
        assert "".join(e["content"] for e in events) == whole["content"]
        assert events[-1]["stop"] is True and whole["tokens_predicted"] == 24
        # The layout's control tokens are in the prompt, in order; the prefix's text is text.
        p = whole["prompt"]
        order = [p.index(t) for t in ("<|reserved_13|>myproject\n", "<|reserved_14|>a.py\n",
                                      "<|reserved_14|>filename\n", "<|reserved_10|>def f",
                                      "<|reserved_11|>\n    return y", "<|reserved_12|>")]
        assert order == sorted(order) and p.endswith("<|reserved_12|>")
        same = post(s, "/infill", {**body, "input_prefix": "<|reserved_12|>" + body["input_prefix"]})
        assert same.json()["tokens_evaluated"] > whole["tokens_evaluated"]  # not one control token
        for bad, param in [({"input_suffix": ""}, "input_prefix"),
                           ({"input_prefix": ""}, "input_suffix"),
                           ({"input_prefix": 5, "input_suffix": ""}, "input_prefix"),
                           ({"input_prefix": ["a", 99999], "input_suffix": ""}, "input_prefix"),
                           ({"input_prefix": "", "input_suffix": "", "input_extra": {}},
                            "input_extra"),
                           ({"input_prefix": "", "input_suffix": "",
                             "input_extra": [{"filename": "a"}]}, "input_extra"),
                           ({"input_prefix": "", "input_suffix": "",
                             "input_extra": [{"text": "a", "filename": 3}]}, "input_extra"),
                           ({"input_prefix": "", "input_suffix": "", "prompt": [1, 2]},
                            "prompt")]:
            r = post(s, "/infill", bad)
            assert r.status_code == 400 and r.json()["error"]["param"] == param, (bad, r.text)
        # Token ids mixed with text are taken as ids.
        mixed = post(s, "/infill", {**body, "input_prefix": ["def f", 300, "(x):"]})
        assert mixed.status_code == 200, mixed.text
    finally:
        s.stop()
    plain = ServerProcess("--ctx-size", "256", "--threads", "2", model=models["plain"])
    try:
        r = post(plain, "/infill", {"input_prefix": "a", "input_suffix": "b"})
        assert r.status_code == 501
        assert "prefix, suffix, middle" in r.json()["error"]["message"], r.text
    finally:
        plain.stop()
