"""Collects llama-server's readings of random outputs of tool-calling templates into a JSON
file of cases, which Muser's test `http::tests::llama_server_call_readings` reads back:

    python scripts/llama_call_readings.py OUT.json N TEMPLATE...
    MUSER_LLAMA_CASES=OUT.json cargo test -p muser-server llama_server_call_readings -- --ignored

llama-server refuses a custom grammar beside tools, and its own grammar lets the random model
write text before a call for as long as it likes; so each output is given to it as the final
assistant message to continue, with the end token forced next (a logit bias): it reads the
message's text as the answer's (its handlers parse the continued message with the generated
text). The outputs are written in each template's format, the calls' JSON in random layouts,
with the leniencies llama.cpp's grammars allow (Kimi's optional section and call ends).

Needs MUSER_BIN, MUSER_GGML_SRC and LLAMA_CPP_BIN (tests/python's environment)."""
import json
import random
import sys
import tempfile
from pathlib import Path

import requests

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "python"))
from test_chat_templates import both_servers, random_text, tiny_model  # noqa: E402

TOOLS = [
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


def random_args(rng, name):
    s = lambda: random_text(rng)  # noqa: E731
    if name == "ping":
        return {}
    if name == "search.web-2":
        return {"q": s()}
    a = {"city": s()}
    if rng.random() < 0.5:
        a["days"] = rng.randrange(-50, 50)
    if rng.random() < 0.5:
        a["unit"] = rng.choice(["celsius", "fahrenheit"])
    if rng.random() < 0.5:
        a["detail"] = {"hourly": rng.random() < 0.5, "tags": [s() for _ in range(rng.randrange(3))]}
    return a


def dump(rng, v):
    return rng.choice([
        lambda: json.dumps(v), lambda: json.dumps(v, ensure_ascii=False),
        lambda: json.dumps(v, separators=(",", ":")), lambda: json.dumps(v, indent=2)])()


def random_output(rng, template):
    """An output of `template`'s format: a reply, or text then calls (one to three)."""
    calls = [(t["function"]["name"],) for t in rng.choices(TOOLS, k=rng.randrange(1, 4))]
    calls = [(n, random_args(rng, n)) for (n,) in calls]
    text = rng.choice(["", "", "Sure. ", random_text(rng) + "\n"])
    if template.startswith(("Kimi", "moonshot")):
        body = "".join(
            f"<|tool_call_begin|>functions.{n}:{i}<|tool_call_argument_begin|>{dump(rng, a)}"
            + ("<|tool_call_end|>" if rng.random() < 0.85 else "")
            for i, (n, a) in enumerate(calls))
        begin = "<|tool_calls_section_begin|>" if rng.random() < 0.8 else ""
        end = "<|tool_calls_section_end|>" if rng.random() < 0.8 else ""
        return text + begin + body + end
    if template.startswith("NVIDIA"):
        items = ", ".join(dump(rng, {"name": n, "arguments": a}) for n, a in calls)
        return text + f"<TOOLCALL>[{items}]</TOOLCALL>"
    if template.startswith("Cohere"):
        wrap = ("<|START_TEXT|>", "<|END_TEXT|>") if "MoE" in template else (
            "<|START_RESPONSE|>", "<|END_RESPONSE|>")
        if rng.random() < 0.3:
            return wrap[0] + random_text(rng) + wrap[1]
        items = ",\n    ".join(
            dump(rng, {"tool_call_id": str(i), "tool_name": n, "parameters": a})
            for i, (n, a) in enumerate(calls))
        return f"<|START_ACTION|>[\n    {items}\n]<|END_ACTION|>"
    raise SystemExit(f"no outputs for {template}")


def main():
    out, n, templates = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
    rng = random.Random()
    cases = []
    with tempfile.TemporaryDirectory() as tmp:
        model = tiny_model(Path(tmp))
        for name in templates:
            with both_servers(model, name, ctx=8192) as (_, llama, _bos):
                eos = requests.get(llama.url + "/props", timeout=60).json()["eos_token"]
                eos_id = requests.post(llama.url + "/tokenize", json={
                    "content": eos, "parse_special": True}, timeout=60).json()["tokens"][0]
                for i in range(n):
                    raw = random_output(rng, name)
                    messages = [{"role": "user", "content": f"What is the weather? {i}"},
                                {"role": "assistant", "content": raw}]
                    body = {"messages": messages, "tools": TOOLS, "max_tokens": 2,
                            "temperature": 0, "logit_bias": {str(eos_id): 100}}
                    r = requests.post(llama.url + "/v1/chat/completions", json=body, timeout=300)
                    case = {"template": name, "tools": TOOLS, "raw": raw}
                    if r.status_code != 200:
                        cases.append({**case, "error": r.text[:300]})
                        continue
                    m = r.json()["choices"][0]["message"]
                    cases.append({
                        **case, "content": m.get("content") or "",
                        "reasoning": m.get("reasoning_content") or "",
                        "calls": [{"name": c["function"]["name"],
                                   "arguments": c["function"]["arguments"]}
                                  for c in m.get("tool_calls") or []]})
    Path(out).write_text(json.dumps(cases, indent=1, ensure_ascii=False))
    print(f"{len(cases)} cases, {sum('error' in c for c in cases)} refused by llama-server")


if __name__ == "__main__":
    main()
