"""Raw outputs llama-server's own grammar forces for Gemma 4 (tool_choice required or auto,
random seeds, temperatures and logit biases towards the notation's characters, so that some calls
close) from the model it serves, with its reading of each: `collect_server.py PORT N OUT`, for a
llama-server started with --jinja and a Gemma 4 template on a tiny model."""
import json, sys, requests, random
URL = "http://127.0.0.1:%s" % sys.argv[1]
N = int(sys.argv[2]); out = sys.argv[3]
TOOLS = [{"type":"function","function":{"name":"get_weather","description":"w","parameters":{"type":"object","properties":{"city":{"type":"string"},"days":{"type":"integer"}},"required":["city"]}}},
         {"type":"function","function":{"name":"add","description":"a","parameters":{"type":"object","properties":{"a":{"type":"number"},"tags":{"type":"array","items":{"type":"string"}},"opt":{"type":"object","properties":{"x":{"type":"boolean"}}}}}}},
         {"type":"function","function":{"name":"ping"}}]
recs = []
rng = random.Random(7)
for i in range(N):
    body = {"messages":[{"role":"user","content":"call a tool " + str(i)}], "tools": TOOLS,
            "tool_choice": rng.choice(["required", "required", "auto"]), "parallel_tool_calls": rng.random() < 0.4,
            "verbose": True, "seed": i, "temperature": rng.choice([0.8, 1.0, 1.5]), "max_tokens": rng.choice([40, 80, 160]), "logit_bias": {str(k): rng.choice([0, 3, 6, 9]) for k in [58,125,123,44,60,124,34,62,48,49,775,416,91,93]}}
    if rng.random() < 0.3: body["chat_template_kwargs"] = {"enable_thinking": False}
    r = requests.post(URL + "/v1/chat/completions", json=body, timeout=120)
    if r.status_code != 200:
        recs.append({"body": body, "error": r.text[:300]}); continue
    j = r.json()
    m = j["choices"][0]["message"]
    recs.append({"choice": body["tool_choice"], "parallel": body["parallel_tool_calls"],
                 "thinking": "chat_template_kwargs" not in body,
                 "raw": j["__verbose"]["content"], "finish": j["choices"][0]["finish_reason"],
                 "content": m.get("content"), "reasoning_content": m.get("reasoning_content"),
                 "tool_calls": [{"name": c["function"]["name"], "arguments": c["function"]["arguments"]} for c in (m.get("tool_calls") or [])]})
json.dump(recs, open(out, "w"), indent=1, ensure_ascii=False)
print(len(recs), sum("error" in r for r in recs))
