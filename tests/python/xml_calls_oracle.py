"""Compares Muser's reading of XML tool calls (Seed-OSS, MiniMax M2, GLM) with llama-server's.

Not a pytest module: a tool. `cargo test -p muser-server dump_outputs_for_the_llama_server` with
MUSER_XML_DUMP=FILE writes random outputs, their tools and Muser's final reading; this script
has llama-server (one per template, on a tiny model) read each output, and counts agreements.

llama-server reads no given text, so each output is given as the assistant message to continue
(all of it but its last character, the closing tag's `>`), `tool_choice` required: its own grammar
can only finish the tag, and its reading of the whole is what its parser gives the text.

    python xml_calls_oracle.py DUMP MODEL.gguf
"""
import json
import os
import subprocess
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path

import requests

SRC = os.environ["MUSER_GGML_SRC"]
BIN = Path(os.environ["LLAMA_CPP_BIN"]) / "llama-server"


def start(model: str, template: str, port: int) -> subprocess.Popen:
    p = subprocess.Popen([str(BIN), "-m", model, "--jinja", "--chat-template-file",
                          str(Path(SRC, "models", "templates", template)), "--port", str(port),
                          "-c", "8192"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(600):
        try:
            if requests.get(f"http://127.0.0.1:{port}/health", timeout=1).ok:
                return p
        except requests.RequestException:
            pass
        time.sleep(0.1)
    raise RuntimeError("llama-server did not start")


def llama_reading(port: int, case: dict):
    text = case["text"]
    body = {"messages": [{"role": "user", "content": "hi"},
                         {"role": "assistant", "content": text[:-1]}],
            "tools": case["tools"], "tool_choice": "required", "parallel_tool_calls": True,
            "max_tokens": 1, "temperature": 0, "verbose": True}
    r = requests.post(f"http://127.0.0.1:{port}/v1/chat/completions", json=body, timeout=60)
    if not r.ok:
        return ("refused", r.json()["error"]["message"][:120])
    j = r.json()
    if j["__verbose"]["content"] != text[-1]:
        return ("continued", j["__verbose"]["content"])
    m = j["choices"][0]["message"]
    calls = [(c["function"]["name"], json.loads(c["function"]["arguments"]))
             for c in m.get("tool_calls") or []]
    return ((m.get("content") or "").strip(), calls)


def main():
    dump, model = sys.argv[1], sys.argv[2]
    cases = defaultdict(list)
    for line in open(dump):
        c = json.loads(line)
        cases[c["template"]].append(c)
    port = 18800
    for template, cs in cases.items():
        port += 1
        server = start(model, template, port)
        tally, shown = Counter(), 0
        try:
            for c in cs:
                want = llama_reading(port, c)
                got = (c["content"].strip(),
                       [(x["name"], json.loads(x["arguments"])) for x in c["calls"]])
                if want[0] in ("refused", "continued"):
                    tally[want[0]] += 1
                elif want == got:
                    tally["same"] += 1
                else:
                    tally["differ"] += 1
                    if shown < 4:
                        shown += 1
                        print(f"  {template}: {c['text']!r}\n    llama: {want!r}\n    muser: {got!r}")
        finally:
            server.terminate()
            server.wait()
        print(template, dict(tally), flush=True)


if __name__ == "__main__":
    main()
