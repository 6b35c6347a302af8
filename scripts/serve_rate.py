"""Aggregate generation rate of a running `muser serve` (or llama-server): C clients, each
sending R completion requests of a fixed length (`ignore_eos`), all at once; prints the
completed requests, errors, wall time, aggregate completion tokens/s and latency percentiles.
Python's standard library only (the device machine has no `requests`).

    python3 scripts/serve_rate.py --url http://127.0.0.1:8080 --clients 8 --requests 2 \\
        --max-tokens 128 [--temperature 0] [--logprobs N] [--prompt-words 4-24] [--rounds N]

`--rounds N` runs the whole load N times against the same server (new prompts each round) and
prints each round: the first round of a fresh server pays for its first steps of each decode
group size (recorded as CUDA graphs on their second step), the later ones show it warm.

After each round it prints what the server's /metrics counted during it (a muser server): the
prefill passes and their rate, the decode steps, their mean group (rows a step), their mean
time and how they ran (replayed from a recorded graph, recorded, op by op).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import threading
import time
import urllib.error
import urllib.request

WORDS = ("the of a time love you will never money life fortune day night friend luck "
         "wise fool heart truth dream work cat dog road sea king").split()


def post(url: str, body: dict, timeout: float) -> dict:
    req = urllib.request.Request(url, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())


def metrics(url: str) -> dict[str, float]:
    """The server's muser:* counters (empty for a server without them)."""
    out: dict[str, float] = {}
    try:
        with urllib.request.urlopen(url + "/metrics", timeout=60) as r:
            for line in r.read().decode().splitlines():
                if line.startswith("muser:") and " " in line:
                    name, _, value = line.partition(" ")
                    try:
                        out[name[len("muser:"):]] = float(value)
                    except ValueError:
                        pass
    except (urllib.error.URLError, OSError):
        pass
    return out


def report_server(before: dict[str, float], after: dict[str, float]) -> None:
    d = {k: v - before.get(k, 0.0) for k, v in after.items()}
    if d.get("prompt_passes_total"):
        secs = d["prompt_seconds_total"]
        print(f"server prefill {d['prompt_tokens_total']:.0f} tokens in {d['prompt_passes_total']:.0f} "
              f"passes, {secs:.2f} s ({d['prompt_tokens_total'] / max(secs, 1e-9):.1f} tokens/s)")
    if d.get("decode_steps_total"):
        steps, secs = d["decode_steps_total"], d["tokens_predicted_seconds_total"]
        print(f"server decode {steps:.0f} steps, mean group {d['decode_rows_total'] / steps:.2f} rows, "
              f"{secs:.2f} s ({1e3 * secs / steps:.2f} ms a step, "
              f"{d['decode_rows_total'] / max(secs, 1e-9):.1f} rows/s inside the steps); replayed "
              f"{d.get('decode_steps_replayed_total', 0):.0f}, recorded "
              f"{d.get('decode_steps_recorded_total', 0):.0f}, op by op "
              f"{d.get('decode_steps_direct_total', 0):.0f}")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", default="http://127.0.0.1:8080")
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--requests", type=int, default=2)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--logprobs", type=int, default=None)
    ap.add_argument("--timeout", type=float, default=600.0)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--prompt-words", default="4-24",
                    help="words per prompt, drawn uniformly from the range A-B (or exactly N)")
    args = ap.parse_args()
    lo, _, hi = args.prompt_words.partition("-")
    words = (int(lo), int(hi or lo))

    with urllib.request.urlopen(args.url + "/v1/models", timeout=60) as r:
        model = json.loads(r.read())["data"][0]["id"]
    failed = False
    for rnd in range(args.rounds):
        lock = threading.Lock()
        latency: list[float] = []
        tokens = [0]
        errors: dict[str, int] = {}

        def client(i: int):
            rng = random.Random(i + 1000 * rnd)
            for _ in range(args.requests):
                body = {"model": model, "max_tokens": args.max_tokens, "temperature": args.temperature,
                        "ignore_eos": True, "seed": rng.randrange(1 << 30),
                        "prompt": " ".join(rng.choice(WORDS) for _ in range(rng.randint(*words)))}
                if args.logprobs is not None:
                    body["logprobs"] = args.logprobs
                t = time.perf_counter()
                try:
                    out = post(args.url + "/v1/completions", body, args.timeout)
                    n = out["usage"]["completion_tokens"]
                    with lock:
                        latency.append(time.perf_counter() - t)
                        tokens[0] += n
                except (urllib.error.URLError, OSError, KeyError, ValueError) as e:
                    key = getattr(e, "code", None) or type(e).__name__
                    with lock:
                        errors[str(key)] = errors.get(str(key), 0) + 1

        before = metrics(args.url)
        t0 = time.perf_counter()
        threads = [threading.Thread(target=client, args=(i,)) for i in range(args.clients)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        wall = time.perf_counter() - t0
        lat = sorted(latency)
        pct = (lambda p: lat[min(len(lat) - 1, int(p / 100 * len(lat)))] if lat else float("nan"))
        mode = f"temperature {args.temperature}" + (f", logprobs {args.logprobs}" if args.logprobs is not None else "")
        tag = f" round {rnd + 1}/{args.rounds}" if args.rounds > 1 else ""
        print(f"serve_rate{tag} clients={args.clients} requests={args.clients * args.requests} ({mode}): "
              f"completed {len(lat)}, errors {errors or 0}, wall {wall:.2f} s, "
              f"{tokens[0] / wall:.1f} completion tokens/s, latency p50 {pct(50):.2f} s "
              f"p99 {pct(99):.2f} s, mean {statistics.mean(lat) if lat else float('nan'):.2f} s")
        report_server(before, metrics(args.url))
        failed |= bool(errors)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
