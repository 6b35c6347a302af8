#!/usr/bin/env python3
"""Random-interleaving check of run 81's multicast protocol (mmw-multicast.patch), no GPU.

Models the two blocks of an `mmwc_silu_pair_4` cluster, 4 warps each, S stages and n stage
uses: the full / empty mbarriers of each block, rank 0's `mmw_xready`, the `mmw_done` counts,
each warp's own bulk copies and rank 0's multicast activation copies, which land at random later
times. mbarriers follow PTX's rules as the patch relies on them: an arrival (with or without an
expected byte count) takes one pending arrival, `expect_tx` adds bytes, a copy's completion
subtracts them (the count may go below zero), and a phase completes when no arrival is pending
and the byte count is zero. Each trial runs every warp and copy in a random order and checks:
  - no deadlock: every warp finishes;
  - a warp that passes its wait on a stage use finds that use's activation and its own weights
    in the stage;
  - a multicast into a stage is issued only once every warp of both blocks is done with the
    stage's previous use (nothing still being read is overwritten);
  - a parity wait never sees its barrier two phases ahead (which would alias);
  - each barrier ends with no pending bytes and no stray arrivals.
Run: python3 scripts/matvec_lab/mc_protocol_check.py [trials]
`--mutants` also runs three broken versions of the protocol and requires each to be caught:
rank 0 copying without waiting for rank 1, the activation expected after the warp's own arrival,
and rank 1 never arriving.
"""
import random
import signal
import sys

A, W = 9344, 2304  # activation region, one warp's own weights (bytes; any positive values do)


class Bar:
    def __init__(self, count):
        self.count, self.pending, self.tx, self.phase = count, count, 0, 0

    def _check(self):
        if self.pending == 0 and self.tx == 0:
            self.phase += 1
            self.pending = self.count

    def arrive(self, tx=0):
        assert self.pending > 0, "arrival on a barrier with no pending arrival"
        self.tx += tx
        self.pending -= 1
        self._check()

    def expect(self, tx):
        self.tx += tx

    def complete(self, tx):
        self.tx -= tx
        self._check()

    def done(self, k):
        # try_wait.parity for phase k: true once phase k has completed; the parity alone cannot
        # tell phase k + 2 from phase k.
        assert self.phase <= k + 2, f"parity aliasing: waiting for phase {k}, barrier at {self.phase}"
        return self.phase > k


def trial(rng, S, n, mutant=None):
    full = [[Bar(4) for _ in range(S)] for _ in range(2)]
    empty = [[Bar(4) for _ in range(S)] for _ in range(2)]
    xready = [Bar(2) for _ in range(S)]
    done_cnt = [[0] * S for _ in range(2)]
    act = [[None] * S for _ in range(2)]  # which use's activation a stage holds
    own = [[[None] * 4 for _ in range(S)] for _ in range(2)]
    consumed = [[0] * n for _ in range(2)]  # warps of a block done with a use
    copies = []  # in flight: callables that land the copy
    cluster_bar = {"arrived": 0, "gen": 0}

    def own_copy(c, s, w, use):
        full[c][s].arrive(W)

        def land():
            own[c][s][w] = use
            full[c][s].complete(W)

        copies.append(land)

    def multicast(s, use):
        prev = use - S
        if prev >= 0:
            for d in (0, 1):
                assert consumed[d][prev] == 4, f"multicast of use {use} while block {d} still reads use {prev}"
        for d in (0, 1):
            def land(d=d):
                act[d][s] = use
                full[d][s].complete(A)

            copies.append(land)

    def cluster_sync():
        gen = cluster_bar["gen"]
        cluster_bar["arrived"] += 1
        if cluster_bar["arrived"] == 8:
            cluster_bar["arrived"] = 0
            cluster_bar["gen"] += 1
        while cluster_bar["gen"] == gen:
            yield

    def warp(c, w):
        yield from cluster_sync()  # after the barriers' initialization
        for i in range(min(S, n)):  # mmw_prime
            if w == 0:
                full[c][i].expect(A)
                if c == 0:
                    multicast(i, i)
            own_copy(c, i, w, i)
        for i in range(n):  # mmw_rows
            s = i % S
            while not full[c][s].done(i // S):
                yield
            assert act[c][s] == i, f"block {c} warp {w} use {i}: activation of use {act[c][s]}"
            assert own[c][s][w] == i, f"block {c} warp {w} use {i}: own weights of use {own[c][s][w]}"
            yield  # the arithmetic
            consumed[c][i] += 1
            empty[c][s].arrive()  # mmw_refill
            last = done_cnt[c][s] % 4 == 3
            done_cnt[c][s] += 1
            nxt = i + S
            if nxt < n:
                if last:
                    while not empty[c][s].done(i // S):
                        yield
                    if mutant != "late_expect":
                        full[c][s].expect(A)
                own_copy(c, s, w, nxt)
                if last:
                    if mutant == "late_expect":
                        yield
                        full[c][s].expect(A)
                    if c == 1:
                        if mutant != "no_remote":
                            xready[s].arrive()  # remote, release at cluster scope
                    else:
                        xready[s].arrive()
                        while mutant != "nowait" and not xready[s].done(i // S):
                            yield
                        multicast(s, nxt)
        yield from cluster_sync()  # before the pair's results are exchanged

    warps = [warp(c, w) for c in (0, 1) for w in range(4)]
    live = list(range(8))
    while live or copies:
        choices = [("w", k) for k in live] + [("c", j) for j in range(len(copies))]
        kind, k = rng.choice(choices)
        if kind == "c":
            copies.pop(k)()
            continue
        try:
            next(warps[k])
        except StopIteration:
            live.remove(k)
    for c in (0, 1):
        for s in range(S):
            assert full[c][s].tx == 0 and full[c][s].pending == 4, "full barrier left unbalanced"
            assert empty[c][s].pending == 4
    for s in range(S):
        assert xready[s].pending == 2


def run(trials, mutant=None):
    rng = random.Random(81)
    for t in range(trials):
        S = rng.choice([2, 3])
        n = rng.randint(1, 14)
        # A deadlock shows as warps spinning forever: bound the time.
        def timeout(*_):
            raise RuntimeError(f"deadlock (trial {t}, S {S}, n {n})")

        signal.signal(signal.SIGALRM, timeout)
        signal.alarm(5)
        try:
            trial(rng, S, n, mutant)
        finally:
            signal.alarm(0)
    print(f"{trials} random interleavings of the multicast protocol: every check held")


if __name__ == "__main__":
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    trials = int(args[0]) if args else 2000
    run(trials)
    if "--mutants" in sys.argv:
        for m in ("nowait", "late_expect", "no_remote"):
            try:
                run(trials, m)
            except (AssertionError, RuntimeError) as e:
                print(f"mutant {m}: caught ({e})")
            else:
                sys.exit(f"mutant {m}: NOT caught")
