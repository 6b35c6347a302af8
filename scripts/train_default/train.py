#!/usr/bin/env python3
"""Train Muser's default `muse` model (issue 7) on the prepared fortunes token streams.

Run after prepare.py. Designed for one GPU call of a few minutes (it was run on one
NVIDIA H200; see README.md for the measured time), also runs on CPU with tiny settings:
  python3 train.py --work work --out out
Each configuration in CONFIGS is trained for at most --budget seconds (the cosine
schedule is sized from the measured step time), evaluated on a dev set carved from the
*training* documents (3%, seeded) every --eval-every steps; the best dev checkpoint of
the best configuration is kept. The 5% held-out documents (val.npy) are scored only
once, at the end, and are never used for any choice.

Outputs in --out: weights_*.npz ({GGUF tensor name: float32 (out, in)}), ref_tokens.npy
and ref_logits.npy (fp32 logits of the first --ref-len held-out tokens), report.json.
"""
import argparse
import json
import math
import os
import platform
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from model_torch import Muse  # noqa: E402
from muse_ref import DEFAULT_CONFIG  # noqa: E402

SEED = 1234
# (name, dropout, max_steps, peak_lr)
CONFIGS = [("drop0.1", 0.1, 1000, 1.5e-3), ("drop0.2", 0.2, 2000, 1.5e-3),
           ("drop0.3", 0.3, 3000, 1.5e-3)]


def split_dev(stream, bos, frac, seed):
    """Split a <bos> doc <eos> stream into (train, dev) streams by whole documents."""
    starts = np.flatnonzero(stream == bos)
    ends = np.append(starts[1:], stream.size)
    rng = np.random.default_rng(seed)
    is_dev = rng.random(starts.size) < frac
    tr = np.concatenate([stream[s:e] for s, e, d in zip(starts, ends, is_dev) if not d])
    dv = np.concatenate([stream[s:e] for s, e, d in zip(starts, ends, is_dev) if d])
    return tr, dv


@torch.no_grad()
def eval_loss(model, stream, T, device, autocast):
    """Mean next-token loss over non-overlapping windows of T+1 tokens (all positions scored)."""
    model.eval()
    n = (stream.size - 1) // T
    x = torch.from_numpy(stream[: n * T].astype(np.int64)).view(n, T)
    y = torch.from_numpy(stream[1: n * T + 1].astype(np.int64)).view(n, T)
    tot, cnt = 0.0, 0
    for i in range(0, n, 64):
        xb, yb = x[i:i + 64].to(device), y[i:i + 64].to(device)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=autocast):
            z = model(xb)
        tot += F.cross_entropy(z.float().view(-1, z.size(-1)), yb.view(-1), reduction="sum").item()
        cnt += yb.numel()
    model.train()
    return tot / cnt


def train_one(cfg, name, dropout, max_steps, lr, train, dev, a, device, log):
    torch.manual_seed(SEED)
    model = Muse(cfg, dropout=dropout).to(device)
    opt = torch.optim.AdamW(model.param_groups(a.wd), lr=lr, betas=(0.9, 0.95), eps=1e-8,
                            fused=device.type == "cuda")
    T, B = a.seq, a.batch
    data = torch.from_numpy(train.astype(np.int64)).to(device)
    gen = torch.Generator(device=device)
    gen.manual_seed(SEED)
    total = max_steps
    best = (float("inf"), -1, None)
    curve = []
    t0 = time.time()
    step = 0
    while step < total:
        if step == 20:  # size the schedule to the time budget from the measured step time
            if device.type == "cuda":
                torch.cuda.synchronize()
            per = (time.time() - t0) / 20
            if not math.isinf(a.budget):
                total = max(step, min(max_steps, int(a.budget / (per * 1.1))))
            log(f"[{name}] {per * 1000:.1f} ms/step -> {total} steps")
        warm = min(a.warmup, total // 10)
        if step < warm:
            f = (step + 1) / warm
        else:
            f = 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * (step - warm) / max(1, total - warm)))
        for g in opt.param_groups:
            g["lr"] = lr * f
        ix = torch.randint(0, data.numel() - T - 1, (B,), device=device, generator=gen)
        off = torch.arange(T + 1, device=device)
        w = data[ix[:, None] + off[None, :]]
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=a.bf16):
            z = model(w[:, :-1])
        loss = F.cross_entropy(z.float().reshape(-1, z.size(-1)), w[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        if step % a.eval_every == 0 or step == total:
            d = eval_loss(model, dev, T, device, a.bf16)
            curve.append((step, round(loss.item(), 4), round(d, 4)))
            log(f"[{name}] step {step}/{total} train {loss.item():.4f} dev {d:.4f} "
                f"t {time.time() - t0:.1f}s")
            if d < best[0]:
                best = (d, step, {k: v.detach().clone() for k, v in model.state_dict().items()})
    secs = time.time() - t0
    model.load_state_dict(best[2])
    return model, {"name": name, "dropout": dropout, "lr": lr, "steps": total,
                   "best_dev": best[0], "best_step": best[1], "seconds": round(secs, 1),
                   "curve": curve}


def save_weights(state, out, limit=14_000_000):
    """Split into npz files of at most ~limit bytes (the device returns files <= 16 MiB)."""
    chunks, cur, size = [], {}, 0
    for k, v in state.items():
        if cur and size + v.nbytes > limit:
            chunks.append(cur)
            cur, size = {}, 0
        cur[k] = v
        size += v.nbytes
    chunks.append(cur)
    for i, c in enumerate(chunks):
        np.savez(os.path.join(out, f"weights_{i}.npz"), **c)
    return len(chunks)


def finalize(model, cfg, val, bos, a, device, report, log):
    """Held-out loss, reference logits and samples of `model`, in eval mode (no dropout), fp32."""
    model = model.float().eval()
    val_loss = eval_loss(model, val, a.seq, device, autocast=False)
    model.eval()  # eval_loss leaves the model in train mode
    with torch.no_grad():
        ref = torch.from_numpy(val[: a.ref_len].astype(np.int64))[None].to(device)
        logits = model(ref)[0].float().cpu().numpy()
    np.save(os.path.join(a.out, "ref_tokens.npy"), val[: a.ref_len].astype(np.int32))
    np.save(os.path.join(a.out, "ref_logits.npy"), logits.astype(np.float32))
    n_params = sum(p.numel() for p in model.parameters())
    report.update(val_loss=val_loss, val_ppl=math.exp(val_loss), n_params=n_params,
                  reference_device=str(device))
    log(f"chosen {report['chosen']} val loss {val_loss:.4f} ppl {math.exp(val_loss):.2f} "
        f"(unigram {report['unigram_val_ppl']:.1f}); params {n_params}")
    try:  # a sample, if the tokenizer package is there
        from tokenizers import Tokenizer
        tok = Tokenizer.from_file(os.path.join(a.work, "tokenizer.json"))
        g = torch.Generator(device=device)
        g.manual_seed(SEED)
        samples = []
        for prompt in ["Once upon a time", "The computer"]:
            ids = [bos] + tok.encode(prompt, add_special_tokens=False).ids
            with torch.no_grad():
                for _ in range(80):
                    z = model(torch.tensor([ids[-cfg["context_length"]:]], device=device))[0, -1]
                    p = torch.softmax(z / 0.8, -1)
                    nxt = int(torch.multinomial(p, 1, generator=g))
                    if nxt == bos + 1:
                        break
                    ids.append(nxt)
            samples.append(tok.decode(ids[1:]))
        report["samples"] = samples
        for s in samples:
            log("SAMPLE: " + s)
    except Exception as e:  # noqa: BLE001
        log(f"no sample: {e}")


def load_model(run_dir, device):
    """A Muse model holding the weights saved by save_weights in run_dir."""
    import glob
    report = json.load(open(os.path.join(run_dir, "report.json")))
    cfg = report["config"]
    w = {}
    for p in sorted(glob.glob(os.path.join(run_dir, "weights_*.npz"))):
        w.update(np.load(p))
    model = Muse(cfg)
    for name, p in model.named_parameters():
        if name.startswith("blocks."):
            _, i, n = name.split(".")
            key = f"blk.{i}.{n}.weight"
        else:
            key = name + ".weight"
        p.data.copy_(torch.from_numpy(np.asarray(w[key], dtype=np.float32)))
    return model.to(device), cfg, report


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--work", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "work"))
    ap.add_argument("--out", required=True)
    ap.add_argument("--budget", type=float, default=120.0, help="seconds per configuration")
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--wd", type=float, default=0.1)
    ap.add_argument("--warmup", type=int, default=100)
    ap.add_argument("--eval-every", type=int, default=100)
    ap.add_argument("--ref-len", type=int, default=512)
    ap.add_argument("--steps", default=None,
                    help="comma-separated step counts, one per configuration, instead of sizing "
                         "the schedules from --budget (to repeat a run exactly)")
    ap.add_argument("--tiny", action="store_true", help="smoke test: tiny model, few steps")
    ap.add_argument("--reference-only", action="store_true",
                    help="reload the weights in --out and recompute the held-out loss, "
                         "reference logits and samples (no training)")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    a.bf16 = device.type == "cuda"
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    logf = open(os.path.join(a.out, "train.log"), "a" if a.reference_only else "w")

    def log(s):
        print(s, flush=True)
        logf.write(s + "\n")
        logf.flush()

    t_start = time.time()
    cfg = dict(DEFAULT_CONFIG)
    configs = CONFIGS
    if a.tiny:
        cfg.update(n_layer=4, d_model=64, d_ff=128, n_head=2, n_kv_head=1, head_dim=32,
                   sliding_window=16, context_length=64)
        configs = [("tiny", 0.0, 30, 3e-3)]
        a.seq, a.batch, a.eval_every, a.ref_len = 64, 8, 10, 64
    if a.reference_only:
        model, cfg, report = load_model(a.out, device)
        val = np.load(os.path.join(a.work, "val.npy"))
        finalize(model, cfg, val, int(val[0]), a, device, report, log)
        json.dump(report, open(os.path.join(a.out, "report.json"), "w"), indent=1)
        return
    train = np.load(os.path.join(a.work, "train.npy"))
    val = np.load(os.path.join(a.work, "val.npy"))
    stats = json.load(open(os.path.join(a.work, "stats.json")))
    cfg["vocab_size"] = stats["vocab_size"]
    bos = int(train[0])
    train, dev = split_dev(train, bos, 0.03, SEED)
    hw = {"device": torch.cuda.get_device_name(0) if device.type == "cuda" else platform.processor(),
          "torch": torch.__version__, "python": platform.python_version()}
    log(f"hardware {hw}; train {train.size} dev {dev.size} val {val.size} tokens; cfg {cfg}")

    runs, best_model, best = [], None, None
    if a.steps:
        fixed = [int(x) for x in a.steps.split(",")]
        assert len(fixed) == len(configs), "--steps needs one count per configuration"
        configs = [(n, d, s, lr) for (n, d, _, lr), s in zip(configs, fixed)]
        a.budget = float("inf")
    for name, dropout, steps, lr in configs:
        model, r = train_one(cfg, name, dropout, steps, lr, train, dev, a, device, log)
        runs.append(r)
        if best is None or r["best_dev"] < best["best_dev"]:
            best, best_model = r, model
        else:
            del model
    model = best_model.float()
    nfiles = save_weights(model.gguf_state(), a.out)
    report = {"config": cfg, "chosen": best["name"], "runs": runs,
              "unigram_val_ppl": stats["unigram_val_ppl"], "hardware": hw, "seed": SEED,
              "weight_files": nfiles, "seq": a.seq, "batch": a.batch, "wd": a.wd,
              "train_seconds": round(time.time() - t_start, 1)}
    finalize(model, cfg, val, bos, a, device, report, log)
    json.dump(report, open(os.path.join(a.out, "report.json"), "w"), indent=1)
    log(f"done in {time.time() - t_start:.1f}s")


if __name__ == "__main__":
    main()
