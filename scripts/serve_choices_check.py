"""Checks a running `muser serve` (any backend; the device job runs it on CUDA) for what the
Python tests check on the CPU: a request's `n` choices are each what the same request alone
draws with the seed plus i, streamed or not, and requests sharing a long prompt prefix compute it
once (the others copy it from a slot's cache: `prompt_tokens_copied_total`) and still get what
they get alone, bit for bit; a prompt whose slot was given up comes back from the host cache
(`--cache-ram`) with the same answer; with `--slot-files` (the server started with
`--slot-save-path`), a slot saved to a file, erased and restored answers as before. Standard library only (the device has no `requests`).

    python3 scripts/serve_choices_check.py --url http://127.0.0.1:8090

Prints one line a check and `CHOICES PASS` or `CHOICES FAIL` last; exits 1 on a failure."""
from __future__ import annotations

import argparse
import json
import random
import sys
import threading
import urllib.request

WORDS = ("the of and to in is was for on that with as by at from his her it an were are "
         "which this be or has had not but also their one first its new after who they two "
         "time river city house light water stone night garden market music winter road").split()


def post(url: str, body: dict, path: str = "/v1/completions") -> dict:
    req = urllib.request.Request(url + path, json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=600) as r:
        return json.loads(r.read())


def stream(url: str, body: dict) -> tuple[list[str], list[str]]:
    """Each choice's streamed text and finish reason."""
    req = urllib.request.Request(url + "/v1/completions",
                                 json.dumps({**body, "stream": True}).encode(),
                                 {"Content-Type": "application/json"})
    n = body.get("n", 1)
    texts, finishes = [""] * n, [""] * n
    with urllib.request.urlopen(req, timeout=600) as r:
        for line in r:
            line = line.decode().strip()
            if not line.startswith("data: {"):
                continue
            for c in json.loads(line[6:]).get("choices", []):
                texts[c["index"]] += c.get("text", "")
                finishes[c["index"]] = c.get("finish_reason") or finishes[c["index"]]
    return texts, finishes


def metric(url: str, name: str) -> float:
    with urllib.request.urlopen(url + "/metrics", timeout=60) as r:
        for line in r.read().decode().splitlines():
            if line.startswith("muser:" + name + " "):
                return float(line.split()[1])
    return float("nan")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", default="http://127.0.0.1:8090")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--slots", type=int, default=8, help="the server's --parallel")
    ap.add_argument("--slot-files", action="store_true",
                    help="the server has --slot-save-path: check save, erase and restore")
    a = ap.parse_args()
    rng = random.Random(7)
    fails = 0

    def check(what: str, ok: bool, detail: str = "") -> None:
        nonlocal fails
        fails += not ok
        print(f"{'ok  ' if ok else 'FAIL'} {what} {detail}".rstrip(), flush=True)

    for r in range(a.rounds):
        seed = rng.randrange(1 << 30)
        n = rng.randrange(2, 6)
        body = {"prompt": " ".join(rng.choice(WORDS) for _ in range(rng.randrange(3, 40))),
                "temperature": 1.0, "max_tokens": rng.randrange(8, 48), "n": n, "seed": seed}
        many = post(a.url, body)
        solo = [post(a.url, {**body, "n": 1, "seed": seed + i})["choices"][0]
                for i in range(n)]
        same = sum(c["text"] == s["text"] and c["finish_reason"] == s["finish_reason"]
                   for c, s in zip(many["choices"], solo))
        check(f"round {r}: n={n} choices each the solo request with seed+i", same == n,
              f"({same} of {n})")
        texts, finishes = stream(a.url, body)
        check(f"round {r}: streamed choices", texts == [c["text"] for c in many["choices"]]
              and finishes == [c["finish_reason"] for c in many["choices"]])

    # A long shared prefix: n greedy choices, and concurrent requests with other tails.
    long = " ".join(rng.choice(WORDS) for _ in range(700))
    before = metric(a.url, "prompt_tokens_copied_total")
    greedy = {"prompt": long, "temperature": 0, "max_tokens": 16}
    tails = [long + " " + " ".join(rng.choice(WORDS) for _ in range(5)) for _ in range(3)]
    got: dict[int, str] = {}

    def one(i: int, body: dict) -> None:
        got[i] = post(a.url, body)["choices"]

    threads = [threading.Thread(target=one, args=(0, {**greedy, "n": 4}))]
    threads += [threading.Thread(target=one, args=(1 + k, {**greedy, "prompt": t}))
                for k, t in enumerate(tails)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    copied = metric(a.url, "prompt_tokens_copied_total") - before
    alone = post(a.url, greedy)["choices"][0]["text"]
    check("shared prefix: the 4 greedy choices equal the solo answer",
          [c["text"] for c in got[0]] == [alone] * 4)
    for k, t in enumerate(tails):
        want = post(a.url, {**greedy, "prompt": t})["choices"][0]["text"]
        check(f"shared prefix: request {k} with another tail equals its solo answer",
              got[1 + k][0]["text"] == want)
    check("shared prefix: copied, not computed again", copied > 3 * 500, f"({copied:.0f} tokens)")

    # The host cache (--cache-ram): a long prompt, then more other prompts than the server has
    # slots, then the first again: its prefix comes back from host memory, and so does its
    # answer, bit for bit.
    restored = metric(a.url, "prompt_tokens_restored_total")
    convo = {**greedy, "prompt": " ".join(rng.choice(WORDS) for _ in range(600))}
    first = post(a.url, convo)["choices"][0]["text"]
    for _ in range(a.slots + 1):
        post(a.url, {**greedy, "max_tokens": 2,
                     "prompt": " ".join(rng.choice(WORDS) for _ in range(300))})
    back = post(a.url, convo)
    restored = metric(a.url, "prompt_tokens_restored_total") - restored
    cached = back["usage"]["prompt_tokens_details"]["cached_tokens"]
    check("host cache: the prefix came back", restored == cached == back["usage"]["prompt_tokens"] - 1,
          f"({restored:.0f} restored, {cached} cached of {back['usage']['prompt_tokens']})")
    check("host cache: the same answer", back["choices"][0]["text"] == first)

    if a.slot_files:
        # A slot's cache to a file and back (POST /slots/{id}?action=save|erase|restore): the
        # restored slot gives the same prompt its prefix, not the host cache, and the same answer.
        native = {"prompt": convo["prompt"], "n_predict": 8, "temperature": 0}
        was = post(a.url, native, "/completion")
        slot = was["id_slot"]
        saved = post(a.url, {"filename": "choices.bin"}, f"/slots/{slot}?action=save")
        erased = post(a.url, {}, f"/slots/{slot}?action=erase")
        restored = post(a.url, {"filename": "choices.bin"}, f"/slots/{slot}?action=restore")
        # (a backend whose prefill and decode differ in bits saves only the prompt's positions;
        # erasing empties every position the slot held, the decoded ones too)
        check("slot file: saved, erased and restored whole",
              saved["n_saved"] == restored["n_restored"] > 600
              and erased["n_erased"] >= saved["n_saved"]
              and restored["n_read"] == saved["n_written"], f"({saved}, {erased}, {restored})")
        from_host = metric(a.url, "prompt_tokens_restored_total")
        again = post(a.url, native, "/completion")
        from_host = metric(a.url, "prompt_tokens_restored_total") - from_host
        check("slot file: the prefix came from the file",
              again["id_slot"] == slot and from_host == 0
              and again["tokens_cached"] == again["tokens_evaluated"] - 1,
              f"(slot {again['id_slot']} of {slot}, {from_host:.0f} from host, "
              f"{again['tokens_cached']} cached of {again['tokens_evaluated']})")
        check("slot file: the same answer", again["content"] == was["content"])
    print("CHOICES PASS" if fails == 0 else f"CHOICES FAIL ({fails})", flush=True)
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
