"""A bounded load test of `muser serve` on loopback: N clients each send M completion requests
(a quarter of them streamed), then it prints p50/p99 latency, time to first token of the
streamed ones, and the aggregate generated tokens/s. Every request must complete or get a
clear error (an OpenAI-shaped JSON error); the run stops by itself (request count and a
deadline).

    python3 tests/python/load_test.py                      # starts its own server
    python3 tests/python/load_test.py --url http://127.0.0.1:8080   # an already running one

Not collected by pytest (the name does not start with test_).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import requests

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_server import ServerProcess  # noqa: E402

WORDS = ("the of a time love you will never money life fortune day night friend luck "
         "wise fool heart truth dream work cat dog road sea king").split()


def percentile(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    if not xs:
        return float("nan")
    k = (len(xs) - 1) * p / 100
    lo, hi = int(k), min(int(k) + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


class Results:
    def __init__(self):
        self.lock = threading.Lock()
        self.latency: list[float] = []
        self.ttft: list[float] = []
        self.completion_tokens = 0
        self.prompt_tokens = 0
        self.cached_tokens = 0
        self.errors: dict[str, int] = {}
        self.unclear: list[str] = []

    def error(self, key: str):
        with self.lock:
            self.errors[key] = self.errors.get(key, 0) + 1


def one_request(url: str, session: requests.Session, rng: random.Random, args, res: Results,
                deadline: float):
    if time.monotonic() > deadline:
        res.error("skipped (deadline)")
        return
    prompt = " ".join(rng.choice(WORDS) for _ in range(rng.randint(3, args.max_prompt_words)))
    stream = rng.random() < 0.25
    body = {"prompt": prompt, "max_tokens": rng.randint(args.max_tokens // 2, args.max_tokens),
            "temperature": 0.8, "seed": rng.randint(0, 1 << 30), "stream": stream}
    if stream:
        body["stream_options"] = {"include_usage": True}
    t0 = time.monotonic()
    try:
        r = session.post(url + "/v1/completions", json=body, stream=stream, timeout=120)
        if r.status_code != 200:
            try:
                err = r.json()["error"]
                res.error(f"{r.status_code} {err['code']}")
            except (ValueError, KeyError, TypeError):
                with res.lock:
                    res.unclear.append(f"{r.status_code}: {r.text[:200]}")
            return
        usage = None
        first = None
        if stream:
            for line in r.iter_lines():
                if not line.startswith(b"data: "):
                    continue
                data = line[6:]
                if data == b"[DONE]":
                    break
                ev = json.loads(data)
                if "error" in ev:
                    res.error("stream error: " + ev["error"]["message"])
                    return
                if first is None and ev["choices"] and ev["choices"][0].get("text"):
                    first = time.monotonic() - t0
                if ev.get("usage"):
                    usage = ev["usage"]
        else:
            usage = r.json()["usage"]
        dt = time.monotonic() - t0
        with res.lock:
            res.latency.append(dt)
            if first is not None:
                res.ttft.append(first)
            if usage:
                res.completion_tokens += usage["completion_tokens"]
                res.prompt_tokens += usage["prompt_tokens"]
                res.cached_tokens += usage["prompt_tokens_details"]["cached_tokens"]
    except requests.RequestException as e:
        with res.lock:
            res.unclear.append(f"{type(e).__name__}: {e}")


def client(i: int, url: str, args, res: Results, deadline: float):
    rng = random.Random(1000 + i)
    with requests.Session() as session:
        for _ in range(args.requests):
            one_request(url, session, rng, args, res, deadline)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--url", help="a running server (default: start one)")
    ap.add_argument("--clients", type=int, default=64)
    ap.add_argument("--requests", type=int, default=20, help="per client")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--max-prompt-words", type=int, default=40)
    ap.add_argument("--parallel", type=int, default=16, help="slots of the started server")
    ap.add_argument("--max-queue", type=int, default=64, help="queue of the started server")
    ap.add_argument("--threads", type=int, default=2, help="CPU threads of the started server")
    ap.add_argument("--deadline", type=float, default=600, help="seconds; later requests skip")
    args = ap.parse_args()

    server = None
    url = args.url
    if url is None:
        server = ServerProcess("--parallel", str(args.parallel), "--max-queue",
                               str(args.max_queue), "--threads", str(args.threads))
        url = server.url
    try:
        res = Results()
        deadline = time.monotonic() + args.deadline
        t0 = time.monotonic()
        with ThreadPoolExecutor(args.clients) as ex:
            for f in [ex.submit(client, i, url, args, res, deadline) for i in range(args.clients)]:
                f.result()
        wall = time.monotonic() - t0
        metrics = requests.get(url + "/metrics", timeout=10).text
    finally:
        if server:
            server.stop()

    total = args.clients * args.requests
    ok = len(res.latency)
    print(f"{args.clients} clients x {args.requests} requests = {total}, "
          f"max_tokens <= {args.max_tokens}, server --parallel {args.parallel} "
          f"--max-queue {args.max_queue} --threads {args.threads}")
    print(f"completed: {ok}   errors: {res.errors or 'none'}   unclear failures: "
          f"{len(res.unclear)}")
    print(f"wall: {wall:.1f} s   requests/s: {ok / wall:.1f}")
    print(f"latency  p50 {percentile(res.latency, 50) * 1e3:.0f} ms   "
          f"p90 {percentile(res.latency, 90) * 1e3:.0f} ms   "
          f"p99 {percentile(res.latency, 99) * 1e3:.0f} ms   "
          f"max {max(res.latency, default=0) * 1e3:.0f} ms")
    if res.ttft:
        print(f"ttft (streamed, {len(res.ttft)})  p50 {percentile(res.ttft, 50) * 1e3:.0f} ms"
              f"   p99 {percentile(res.ttft, 99) * 1e3:.0f} ms")
    print(f"tokens: {res.prompt_tokens} prompt ({res.cached_tokens} cached), "
          f"{res.completion_tokens} generated")
    print(f"aggregate generated tokens/s (wall): {res.completion_tokens / wall:.0f}")
    for line in metrics.splitlines():
        if line.startswith(("muser:predicted_tokens_seconds", "muser:prompt_tokens_seconds")):
            print("server " + line)
    for u in res.unclear[:5]:
        print("unclear:", u)
    return 0 if not res.unclear else 1


if __name__ == "__main__":
    sys.exit(main())
