"""Random Gemma 4 outputs read by llama.cpp's own parser (the oracle harness): a fixture of
(text, tools, llama's reading) for Muser's Rust test."""
import json, random, subprocess, sys
T = sys.argv[1]; N = int(sys.argv[2]); OUT = sys.argv[3]
rng = random.Random(int(sys.argv[4]) if len(sys.argv) > 4 else 1)
TOOLS = [{"type":"function","function":{"name":"get_weather","parameters":{"type":"object","properties":{"city":{"type":"string"},"days":{"type":"integer"}}}}},
         {"type":"function","function":{"name":"add","parameters":{"type":"object","properties":{"a":{"type":"number"}}}}},
         {"type":"function","function":{"name":"ping"}},
         {"type":"function","function":{"name":"f.x-y_2"}}]
NAMES = [t["function"]["name"] for t in TOOLS]
Q = '<|"|>'
def ws(): return rng.choice(["", "", "", " ", "\n", "  ", " \n\t"])
def text_piece():
    return "".join(rng.choice(["a", "Q", " ", "\n", "é", "😀", "\"", "\\", "{", "}", ":", ",", "[", "<", "|", ">", "x y", "0", "'", "\t"]) for _ in range(rng.randrange(0, 10)))
def key():
    k = "".join(rng.choice("abcXYZ_09 -.\"\\é{,[") for _ in range(rng.randrange(1, 8)))
    return k.lstrip(" ") or "k"
def number():
    s = rng.choice(["", "-"]) + rng.choice(["0", str(rng.randrange(1, 10**rng.randrange(1, 8)))])
    if rng.random() < 0.3: s += "." + str(rng.randrange(0, 1000)).zfill(rng.randrange(1, 4))
    if rng.random() < 0.15: s += rng.choice("eE") + rng.choice(["", "+", "-"]) + str(rng.randrange(0, 30))
    return s
def value(d=0):
    r = rng.random()
    if d > 3: r = r * 0.6
    if r < 0.3: return Q + text_piece() + Q
    if r < 0.42: return number()
    if r < 0.5: return rng.choice(["true", "false", "null"])
    if r < 0.6: return obj(d + 1)
    return "[" + ws() + ("]" if rng.random() < 0.2 else ("," + ws()).join(value(d + 1) for _ in range(rng.randrange(1, 4))) + ws() + "]")
def obj(d=0):
    if rng.random() < 0.2: return "{" + ws() + "}"
    return "{" + ws() + ("," + ws()).join(key() + ":" + ws() + value(d) for _ in range(rng.randrange(1, 4))) + ws() + "}"
def call():
    return "<|tool_call>call:" + rng.choice(NAMES) + obj() + "<tool_call|>"
def thought():
    return "<|channel>thought" + ws() + text_piece() + "<channel|>"
def output():
    parts = []
    if rng.random() < 0.5: parts.append(ws() + thought() + ws())
    if rng.random() < 0.7: parts.append(text_piece().strip() or "Sure")
    if rng.random() < 0.2: parts.append(thought())
    if rng.random() < 0.3: parts.append(text_piece().strip() or "ok")
    n = rng.choice([0, 1, 1, 1, 2, 3])
    parts.append("".join(call() for _ in range(n)))
    return "".join(parts)
cases = []
for i in range(N):
    cases.append({"tools": TOOLS, "tool_choice": "auto", "parallel": True, "text": output()})
p = subprocess.run([sys.argv[5] if len(sys.argv) > 5 else "/tmp/g/h/gemma_oracle", T], input="\n".join(json.dumps(c) for c in cases) + "\n",
                   capture_output=True, text=True)
outs = [json.loads(l) for l in p.stdout.splitlines()]
assert len(outs) == len(cases), (len(outs), p.stderr[-500:])
fixture = []
for c, o in zip(cases, outs):
    if "error" in o:
        continue
    fixture.append({"text": c["text"], "content": o["content"], "reasoning": o["reasoning_content"],
                    "calls": [[t["name"], t["arguments"]] for t in o["tool_calls"]]})
json.dump({"tools": TOOLS, "cases": fixture}, open(OUT, "w"), ensure_ascii=False, indent=0)
print(len(cases), "cases,", len(fixture), "read by llama.cpp,", sum(len(f["calls"]) for f in fixture), "calls")
