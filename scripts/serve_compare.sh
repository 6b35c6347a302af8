#!/usr/bin/env bash
# `muser serve` beside llama.cpp's `llama-server` on the same GGUF, driven by the same client
# (scripts/serve_rate.py: C clients at once, each R completion requests of MAX_TOKENS tokens with
# `ignore_eos`, greedy). One server runs at a time; the two alternate ROUNDS times, so drift on a
# shared host shows as a spread rather than as a difference.
#
#   LLAMA_CPP_BIN=DIR bash scripts/serve_compare.sh MODEL.gguf
#
# DIR holds llama-server (`cmake --build build-cpu --target llama-server` in llama.cpp's source,
# SPEC section 7). Settings (environment): CLIENTS ("1 8 16"), PARALLEL (16 slots), SLOT_CTX (1,024
# tokens a slot), THREADS (all cores), MAX_TOKENS (64), REQUESTS (2 a client), ROUNDS (2),
# PROMPT_WORDS (4-24 words a prompt; e.g. 300-400 for a prefill-heavy load),
# BACKEND (cpu), MUSER_BIN (target/release/muser), OUT (a fresh temporary folder: the servers'
# logs and every serve_rate line). Prints a table last.
set -euo pipefail
MODEL=${1:?usage: serve_compare.sh MODEL.gguf}
HERE=$(cd "$(dirname "$0")" && pwd)
MUSER=${MUSER_BIN:-$HERE/../target/release/muser}
LLAMA=${LLAMA_CPP_BIN:?set LLAMA_CPP_BIN to the folder that holds llama-server}/llama-server
CLIENTS=${CLIENTS:-1 8 16}
PARALLEL=${PARALLEL:-16}
SLOT_CTX=${SLOT_CTX:-1024}
THREADS=${THREADS:-$(nproc)}
MAX_TOKENS=${MAX_TOKENS:-64}
PROMPT_WORDS=${PROMPT_WORDS:-4-24}
REQUESTS=${REQUESTS:-2}
ROUNDS=${ROUNDS:-2}
BACKEND=${BACKEND:-cpu}
OUT=${OUT:-$(mktemp -d)}
PORT=${PORT:-8097}
mkdir -p "$OUT"
[ -x "$MUSER" ] || { echo "no muser binary at $MUSER (cargo build --release)" >&2; exit 2; }
[ -x "$LLAMA" ] || { echo "no llama-server at $LLAMA" >&2; exit 2; }

PID=
stop() {
    if [ -n "$PID" ]; then kill "$PID" 2>/dev/null || true; wait "$PID" 2>/dev/null || true; fi
    PID=
}
trap stop EXIT

# start NAME: one server on $PORT, then wait (at most 300 s) until /health answers 200.
start() {
    local name=$1
    case $name in
    muser) "$MUSER" serve -m "$MODEL" --backend "$BACKEND" --threads "$THREADS" --parallel "$PARALLEL" \
        -c "$SLOT_CTX" --max-queue 1024 --port "$PORT" > "$OUT/$name.log" 2>&1 & ;;
    llama) "$LLAMA" -m "$MODEL" -t "$THREADS" -np "$PARALLEL" -c $((PARALLEL * SLOT_CTX)) \
        --port "$PORT" --no-webui > "$OUT/$name.log" 2>&1 & ;;
    esac
    PID=$!
    for _ in $(seq 600); do
        if curl -fs "http://127.0.0.1:$PORT/health" > /dev/null 2>&1; then return 0; fi
        kill -0 "$PID" 2>/dev/null || { echo "$name exited; log: $OUT/$name.log" >&2; tail -5 "$OUT/$name.log" >&2; exit 1; }
        sleep 0.5
    done
    echo "$name not ready after 300 s" >&2
    exit 1
}

for r in $(seq "$ROUNDS"); do
    for name in muser llama; do
        start "$name"
        # One short request first, so that neither side's first-request costs land in a figure.
        python3 "$HERE/serve_rate.py" --url "http://127.0.0.1:$PORT" --clients 1 --requests 1 \
            --max-tokens 4 > /dev/null
        for c in $CLIENTS; do
            python3 "$HERE/serve_rate.py" --url "http://127.0.0.1:$PORT" --clients "$c" \
                --requests "$REQUESTS" --max-tokens "$MAX_TOKENS" --prompt-words "$PROMPT_WORDS" \
                > "$OUT/last.txt" || true
            cat "$OUT/last.txt" >> "$OUT/$name-rate.log"
            line=$(head -1 "$OUT/last.txt")
            echo "$r $name $c $line" | tee -a "$OUT/rates.txt"
        done
        stop
    done
done

echo
echo "model $MODEL, backend $BACKEND, $THREADS threads, $PARALLEL slots of $SLOT_CTX tokens," \
    "each client $REQUESTS requests of $MAX_TOKENS tokens after $PROMPT_WORDS words (greedy, ignore_eos);" \
    "logs in $OUT"
echo "| clients | muser serve tokens/s | llama-server tokens/s | muser p50 / p99 s | llama-server p50 / p99 s |"
echo "| ---: | --- | --- | --- | --- |"
for c in $CLIENTS; do
    row() { # name: the rounds' rates, then their latencies
        awk -v n="$1" -v c="$c" '$2 == n && $3 == c {
            for (i = 4; i <= NF; i++) {
                if ($i == "completion") rate = rate (rate ? " / " : "") $(i - 1)
                if ($i == "p50") lat = lat (lat ? ", " : "") $(i + 1) " / " $(i + 4)
                if ($i == "errors" && $(i + 1) != "0,") err = err " errors " $(i + 1)
            }
        } END { printf "%s%s|%s", rate, err, lat }' "$OUT/rates.txt"
    }
    IFS='|' read -r mr ml <<< "$(row muser)"
    IFS='|' read -r lr ll <<< "$(row llama)"
    echo "| $c | $mr | $lr | $ml | $ll |"
done
