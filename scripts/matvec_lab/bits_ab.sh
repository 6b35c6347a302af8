#!/usr/bin/env bash
# Two builds of a change meant to keep every bit (lab run 83 on): A (before) and B (after), each a
# stripped binary with its kernel cache (and the step-trace builds) in a folder carried to the
# device (A=target/sideA B=target/sideB, the defaults). One device call:
#   1. synthesizes muse-tiny, llama-glimmer and muse-glimmer;
#   2. `muser logits` of one random token sequence per model with A and with B, from decode steps
#      (`--decode`: the generation kernels) and from prefill, compared byte for byte (`cmp`);
#   3. B's quick parity command with batch invariance (`muser check --quick`);
#   4. ROUNDS rounds (default 2) of A then B: tg128 on muse-glimmer and llama-glimmer and one
#      muse-glimmer step trace (MUSER_CUDA_STEP_TRACE=1) each.
# A_ENV / B_ENV: environment settings for A's / B's runs, so one build with a switch can be set
# against itself (run 84: A=B=the build with gate-side.patch, B_ENV=MUSER_CUDA_GATE_SIDE=1).
# C_ENV (optional): a third side, B's build with those settings (its logits compared with A's too,
# and its own quick parity run, C_CHECK=1). TRACE=0 leaves out
# the step traces, TG=0 the tg128 runs. STREAMS (optional, e.g. "1,8"): decode groups of
# llama-glimmer too (`-s`);
# with ARGMAX=1, A's groups also with the next tokens picked on the GPU (`--argmax`).
# Full logs go to $OUT; the short table is printed last (0-stdout.txt).
set -uo pipefail
A=${A:-target/sideA}
B=${B:-target/sideB}
A_ENV=${A_ENV:-} B_ENV=${B_ENV:-} C_ENV=${C_ENV:-}
OUT=${OUT:-/tmp/muser-out}
M=${MODELS:-/tmp/muser-models}
mkdir -p "$OUT" "$M"
exec > >(tee "$OUT/0-stdout.txt") 2>&1
TEE_PID=$!
trap 'exec >&- 2>&-; wait $TEE_PID' EXIT
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader

run() { # name build-folder limit_s muser-args... (XENV: settings for this run)
    local name=$1 dir=$2 limit=$3
    shift 3
    local t0=$SECONDS
    env ${XENV:-} MUSER_KERNEL_CACHE="$PWD/$dir/kernels" timeout "$limit" "$dir/muser" "$@" > "$OUT/$name.log" 2>&1
    echo "$name rc=$? ($((SECONDS - t0)) s)" >> "$OUT/summary.txt"
}

T=$M/muse-tiny.gguf G=$M/llama-glimmer.gguf U=$M/muse-glimmer.gguf
run synth-muse-tiny "$B" 60 synth muse-tiny "$T"
run synth-llama-glimmer "$B" 120 synth llama-glimmer "$G"
run synth-muse-glimmer "$B" 120 synth muse-glimmer "$U"

# Token ids below 1000 (muse-tiny's vocabulary is 2048); 300 decode steps on muse-tiny take its
# attention past 8 splits of 32 positions, 96 on the Glimmers.
tokens() { python3 -c "import random; r = random.Random($1); print(','.join(str(r.randrange(1000)) for _ in range($2)))"; }
for m in "muse-tiny $T 300" "llama-glimmer $G 96" "muse-glimmer $U 96"; do
    set -- $m
    toks=$(tokens 83 "$3")
    for mode in decode prefill; do
        flag=$([ $mode = decode ] && echo --decode)
        for x in A B $([ -n "$C_ENV" ] && echo C); do
            dir=$([ $x = A ] && echo "$A" || echo "$B")
            XENV=$(case $x in A) echo "$A_ENV" ;; B) echo "$B_ENV" ;; *) echo "$C_ENV" ;; esac) \
            run "logits-$1-$mode-$x" "$dir" 200 logits --backend cuda -m "$2" --tokens "$toks" -o "$M/$1-$mode-$x.npy" $flag
        done
        for x in B $([ -n "$C_ENV" ] && echo C); do
            if cmp -s "$M/$1-$mode-A.npy" "$M/$1-$mode-$x.npy"; then r="bit-identical"; else r="DIFFER"; fi
            echo "bits $1 $mode ($3 tokens): A and $x $r ($(stat -c %s "$M/$1-$mode-$x.npy" 2>/dev/null) bytes)" | tee -a "$OUT/bits.txt"
        done
        rm -f "$M/$1-$mode-"[ABC].npy
    done
done

XENV="$B_ENV" run check "$B" 240 check --backend cuda --quick --model "$T" --invariance "$T" --invariance "$G"
[ -n "$C_ENV" ] && [ "${C_CHECK:-0}" = 1 ] &&
    XENV="$C_ENV" run check-c "$B" 240 check --backend cuda --quick --model "$T" --invariance "$T" --invariance "$G"

for round in $(seq "${ROUNDS:-2}"); do
    for x in A B $([ -n "$C_ENV" ] && echo C); do
        dir=$([ $x = A ] && echo "$A" || echo "$B")
        export XENV=$(case $x in A) echo "$A_ENV" ;; B) echo "$B_ENV" ;; *) echo "$C_ENV" ;; esac)
        [ "${TG:-1}" = 0 ] || run "tg-muse-$round-$x" "$dir" 90 bench --backend cuda -m "$U" -p 0 -n 128 -r 2
        [ "${TG:-1}" = 0 ] || run "tg-llama-$round-$x" "$dir" 90 bench --backend cuda -m "$G" -p 0 -n 128 -r 2
        [ -z "${STREAMS:-}" ] || run "streams-llama-$round-$x" "$dir" 120 bench --backend cuda -m "$G" -p 0 -n 128 -r 2 -s "$STREAMS"
        # ARGMAX=1: A's groups once more with each next token picked on the GPU (4 bytes a row
        # read back instead of the logits): the bound of any faster logits read.
        [ -z "${STREAMS:-}" ] || [ "${ARGMAX:-0}" != 1 ] || [ $x != A ] ||
            run "streams-llama-$round-A-argmax" "$dir" 120 bench --backend cuda -m "$G" -p 0 -n 128 -r 2 -s "$STREAMS" --argmax
        [ "${TRACE:-1}" = 0 ] || MUSER_CUDA_STEP_TRACE=1 run "trace-muse-$round-$x" "$dir" 90 bench --backend cuda -m "$U" -p 0 -n 32 -r 1
        unset XENV
    done
done

echo
echo "================ short table ================"
cat "$OUT/summary.txt"
cat "$OUT/bits.txt"
echo "check: $(grep -hcE "^ok" "$OUT/check.log") ok, $(grep -hcE "^FAIL" "$OUT/check.log") FAIL"
grep -hE "^all |^FAIL|^invariance|never dispatched" "$OUT/check.log" | head -12
grep -hE "^\| +[0-9]+ \| +[0-9]+ \|" "$OUT/check.log" | head -2
if [ -f "$OUT/check-c.log" ]; then
    echo "check (C): $(grep -hcE "^ok" "$OUT/check-c.log") ok, $(grep -hcE "^FAIL" "$OUT/check-c.log") FAIL"
    grep -hE "^all |^FAIL|^invariance|never dispatched" "$OUT/check-c.log" | head -12
fi
for f in $(ls "$OUT"/tg-*.log 2>/dev/null); do echo "$(basename "$f" .log): $(grep -h "tg128" "$f" | awk -F'|' '{print $8, $11}')"; done
for f in $(ls "$OUT"/streams-*.log 2>/dev/null); do grep -h "streams" "$f" | awk -F'|' -v n="$(basename "$f" .log)" '{print n ":", $7, $8, $11}'; done
for f in $(ls "$OUT"/trace-muse-*.log 2>/dev/null); do
    echo "== $(basename "$f" .log): $(grep -h "^step trace" "$f")"
    grep -hE "^\| (residual_norm|attn_rows_mma_fin8_128|mvk_1 \[Q4_K\] \(after attn|mvk_silu_1|mvk_1 \[Q4_K\+Q6_K\] \(after residual)" "$f"
done
