#!/usr/bin/env bash
# One H200 call that checks and benchmarks Muser's CUDA backend (issues 4 and 5):
#   1. synthesizes muse-glimmer (16.75 GB) and llama-glimmer on the device (never carried),
#   2. runs the parity command (`muser check --backend cuda`, op by op at the Glimmer shapes,
#      and whole-model parity of the small presets against the CPU backend),
#   3. runs `muser bench --backend cuda` (pp512, tg128 at depth 0 and 8192) on both models,
#   4. optionally (LLAMA=1, with .llamacpp-src.tar.xz from scripts/pack_llamacpp.sh carried) builds llama.cpp with CUDA and
#      runs llama-bench on llama-glimmer in the same call.
# Full logs go to $OUT; a short table is printed last.
#
# JOB=streams instead (issue 6, multi-sequence decode): synthesizes llama-glimmer and muse-tiny,
# runs the quick parity check with batch invariance on both models, `muser bench -s` (aggregate
# decode tokens/s at each stream count) and a per-op profile of decode-group steps.
#
# JOB=serve: serve_benches alone.
#
# JOB=choices: `muser serve` on CUDA checked by scripts/serve_choices_check.py (n choices, a
# shared prefix copied between slots, the host cache, slot files) on muse-mid and llama-1b
# (PRESETS), after `muser check --model` on each (whole-model parity with embeddings, invariance,
# the KV copies).
#
# JOB=steptrace: one decode step (1 and 8 streams) kernel by kernel inside its CUDA graph
# (MUSER_CUDA_STEP_TRACE, crates/muser-cuda/src/steptrace.rs); TRACE_DEPTHS at context depths.
#
# JOB=depth: decode at long context (DEPTHS, default 0 to 32768; DEPTH_STREAMS: decode groups too) on llama-glimmer, with LLAMA=1
# llama-bench at the same depths, with MUSE=1 muse-glimmer too.
#
# JOB=side (the closing call of a session): the full parity command while llama.cpp builds (LLAMA=1),
# then llama.cpp's and Muser's benchmarks on the same llama-glimmer file on a quiet machine; with
# SERVE=1 also `muser serve` driven by scripts/serve_rate.py (serve_benches), and with SERVE_LLAMA=1
# llama.cpp's llama-server under the same loads.
# With MUSE=1 also pp512 and tg128 on muse-glimmer, and with TRACE_MUSE=1 one muse-glimmer step
# kernel by kernel (the kernel cache carried must hold the step-trace builds too).
#
# JOB=ncu: Nsight Compute on one decode launch of NCU_KERNEL (NCU_STREAMS, NCU_DEPTH), alone.
#
# JOB=compare (issues 4 and 6, side by side with llama.cpp; needs LLAMA=1 and the carried source):
# synthesizes llama-glimmer and muse-tiny, runs the quick parity check with batch invariance
# (which also holds graph replay to the bits of op-by-op decode), `muser bench` on llama-glimmer
# (pp512, tg128 with and without CUDA graphs and with --audit, tg128 at depth 8192, decode groups
# of 1/8/32 streams), then llama.cpp's llama-bench and llama-batched-bench on the same file.
#
# Usage (device tool, repository root, carrying target/release/muser):
#   bash scripts/device_bench.sh            # QUICK=1 for the quick op check only
#   JOB=streams STREAMS=1,8,32 bash scripts/device_bench.sh
#
# Kernel cache: `MUSER_KERNEL_CACHE=target/device/kernels target/release/muser kernels` here (NVRTC
# from the pip wheel, no GPU) and carrying target/device/kernels spares the device's first run
# of every call the NVRTC compilation (58-102 s on a fresh H200 machine) and the driver's
# translation (27-41 s); files that do not match the binary's kernels are compiled as before.
set -uo pipefail
BIN=${MUSER_BIN:-target/release/muser}
KERNELS=${KERNELS:-target/device/kernels}
[ -d "$KERNELS" ] && export MUSER_KERNEL_CACHE="$PWD/$KERNELS"
OUT=${OUT:-/tmp/muser-out}
MODELS=${MODELS:-/tmp/muser-models}
REPS=${REPS:-3}
mkdir -p "$OUT" "$MODELS"
# Everything this script prints also goes to $OUT/0-stdout.txt, whose name sorts first: the device
# tool brings back only the first few files of $OUT, and the short table is in this one.
exec > >(tee "$OUT/0-stdout.txt") 2>&1
TEE_PID=$!
trap 'exec >&- 2>&-; wait $TEE_PID' EXIT
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"

if [ "${LLAMA:-0}" = 1 ] && [ -f .llamacpp-src.tar.xz ]; then
    ( mkdir -p /tmp/llama && tar xJf .llamacpp-src.tar.xz -C /tmp/llama && cd /tmp/llama/llama.cpp &&
      cmake -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
        -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_APP=OFF &&
      cmake --build build -j 16 --target llama-bench llama-batched-bench \
        $([ "${SERVE_LLAMA:-0}" = 1 ] && echo llama-server) ) > "$OUT/llama-build.log" 2>&1 &
    LLAMA_PID=$!
fi

# The parity command's totals, and (check_summary) its failures, invariance and model lines.
check_counts() { echo "check: $(grep -hcE "^ok" "$OUT/check.log") ok, $(grep -hcE "^FAIL" "$OUT/check.log") FAIL"; }
check_summary() {
    check_counts
    grep -hE "^FAIL|^invariance|never dispatched|^all |panicked|rror|^model " "$OUT/check.log" | head -16
}

# Every step ends by the deadline (BUDGET seconds after the start), so the table below is printed
# within the device call's limit.
DEADLINE=$((SECONDS + ${BUDGET:-100000}))
step() { # name limit_s command...
    local name=$1 limit=$2
    shift 2
    local left=$((DEADLINE - SECONDS))
    [ "$limit" -gt "$left" ] && limit=$left
    if [ "$limit" -lt 5 ]; then
        echo "$name skipped (device budget)" | tee -a "$OUT/summary.txt"
        return
    fi
    local t0=$SECONDS
    timeout "$limit" "$@" > "$OUT/$name.log" 2>&1
    local rc=$?
    echo "$name rc=$rc ($((SECONDS - t0)) s)" | tee -a "$OUT/summary.txt"
}

# Nsight Compute, and one decode step of llama-glimmer ($G) kernel by kernel with it (each
# kernel's duration run alone, clocks and caches as they are): ncu_timeline SUFFIX [VAR=value ...]
# writes ncu$SUFFIX.csv and timeline$SUFFIX.txt.
NCU_BIN=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
ncu_timeline() {
    local sfx=$1
    shift
    step "ncu$sfx" "${NCU_LIMIT:-100}" env MUSER_CUDA_GRAPHS=0 "$@" "$NCU_BIN" --clock-control none \
        --cache-control none --metrics gpu__time_duration.sum --csv --page raw --log-file "$OUT/ncu$sfx.csv" \
        "$BIN" bench --backend cuda -m "$G" -p 0 -n 3 -r 1
    python3 scripts/ncu_timeline.py "$OUT/ncu$sfx.csv" > "$OUT/timeline$sfx.txt" 2>&1
}

# Where a kernel's warps stall, instruction by instruction: Nsight Compute's source counters
# (warp-state samples and executed instructions per SASS line) for one launch of each kernel in
# SASS_KERNELS ("name:launches-to-skip ...") while `muser bench $SASS_BENCH` runs on
# llama-glimmer ($G, already synthesized; no graphs), exported as CSV to $OUT. SASS_SECTIONS: more
# Nsight Compute sections (e.g. "--section ComputeWorkloadAnalysis --section InstructionStats").
sass_profile() {
    # A spec may name a decode group width as a third field ("mmv_silu_1:20:8": `-s 8`).
    for spec in ${SASS_KERNELS:-mvk_silu_1:20 mvk_1:41}; do
        IFS=: read -r k skip streams <<< "$spec"
        step "ncu-$k-$skip" 150 env MUSER_CUDA_GRAPHS=0 "$NCU_BIN" --clock-control none --kernel-name "regex:^$k\$" \
            --launch-skip "$skip" --launch-count 1 --section SourceCounters --section WarpStateStats \
            --section SpeedOfLight --section Occupancy ${SASS_SECTIONS:-} --import-source no -o "$OUT/$k-$skip" -f \
            "$BIN" bench --backend cuda -m "$G" ${SASS_BENCH:--p 0 -n 2 -r 1} ${streams:+-s $streams}
        "$NCU_BIN" -i "$OUT/$k-$skip.ncu-rep" --page source --csv --print-source sass > "$OUT/$k-$skip-sass.csv" 2> "$OUT/$k-$skip-sass.err"
        "$NCU_BIN" -i "$OUT/$k-$skip.ncu-rep" --page details > "$OUT/$k-$skip-details.txt" 2>&1
        rm -f "$OUT/$k-$skip.ncu-rep"
        grep -E "Duration|Warp Cycles Per Issued|Issue Slots Busy|Achieved Occupancy|Executed Instructions |Registers Per" "$OUT/$k-$skip-details.txt" | head -8
        wc -c "$OUT/$k-$skip-sass.csv"
    done
    # One archive, named to sort first (the device tool brings back only the first few files).
    (cd "$OUT" && tar czf 0-sass.tgz ./*-sass.csv ./*-details.txt && rm -f ./*-sass.csv ./*-sass.err ./*-details.txt)
}

# Memory traffic of one launch of each kernel in TRAFFIC_KERNELS ("name:launches-to-skip ...") for
# binary $1 (DRAM bytes read, the sectors L1 asks of L2, L1 sector requests, L2 and L1 hit rates,
# the shared-memory carveout the driver chose): how many sectors the kernel asks of L2 for each
# byte it reads from DRAM.
traffic_profile() {
    # Arguments after the binary and the tag: the setting's variables (VAR=value ...).
    local b=$1 tag=$2
    shift 2
    for spec in ${TRAFFIC_KERNELS:-mvk_silu_1:20}; do
        # A third field is a decode group width, as in sass_profile ("mmv_1:35:8").
        IFS=: read -r k skip streams <<< "$spec"
        step "traffic-$tag-$k" 90 env MUSER_CUDA_GRAPHS=0 "$@" "$NCU_BIN" --clock-control none --kernel-name "regex:^$k\$" \
            --launch-skip "$skip" --launch-count 1 --metrics \
            gpu__time_duration.sum,dram__bytes_read.sum,lts__t_sectors_srcunit_tex_op_read.sum,l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum,l1tex__t_requests_pipe_lsu_mem_global_op_ld.sum,lts__t_sector_hit_rate.pct,lts__throughput.avg.pct_of_peak_sustained_elapsed,dram__throughput.avg.pct_of_peak_sustained_elapsed,l1tex__t_sector_hit_rate.pct,launch__shared_mem_config_size \
            "$b" bench --backend cuda -m "$G" ${SASS_BENCH:--p 0 -n 2 -r 1} ${streams:+-s $streams}
        echo "traffic $tag $k:"
        grep -E "duration|bytes_read|sectors|requests|hit_rate|throughput|config_size" "$OUT/traffic-$tag-$k.log" | sed 's/^ */  /'
    done
}

# The three models of the parity command, synthesized, then the command itself: ops at the
# Glimmer shapes, whole-model muse-tiny and muse-mid, invariance on muse-tiny and llama-glimmer
# (with CHECK_ENV's variables set, e.g. MUSER_CUDA_MMV_MIN=4).
full_parity() {
    G=$MODELS/llama-glimmer.gguf T=$MODELS/muse-tiny.gguf D=$MODELS/muse-mid.gguf
    step synth-llama-glimmer 90 "$BIN" synth llama-glimmer "$G"
    step synth-muse-tiny 30 "$BIN" synth muse-tiny "$T"
    step synth-muse-mid 60 "$BIN" synth muse-mid "$D"
    step check 300 env ${CHECK_ENV:-} "$BIN" check --backend cuda --bench --model "$T" --model "$D" --invariance "$T" \
        --invariance "$G"
}

# With LLAMA=1: waits for llama.cpp's build, then runs llama-bench and llama-batched-bench on $G
# (llama_benches); llama_table prints their tables.
llama_benches() {
    [ -n "${LLAMA_PID:-}" ] || return 0
    wait "$LLAMA_PID"
    local lb=/tmp/llama/llama.cpp/build/bin
    step llama-bench 150 "$lb/llama-bench" -m "$G" -p 512 -n 128 -fa 1 -r "$REPS" -d 0,8192
    # A context that holds every sequence's 128 + 128 tokens at the widest stream count.
    local widest
    widest=$(echo "${STREAMS:-1,8,32}" | tr ',' '\n' | sort -n | tail -1)
    step llama-batched-bench 150 "$lb/llama-batched-bench" -m "$G" -c $((widest * 256 > 16384 ? widest * 256 : 16384)) \
        -b 2048 -ub 512 -npp 128 -ntg 128 -npl "${STREAMS:-1,8,32}" -fa on -ngl 99
}
llama_table() {
    [ -f "$OUT/llama-bench.log" ] && grep "^| " "$OUT/llama-bench.log"
    [ -f "$OUT/llama-batched-bench.log" ] && grep "^|" "$OUT/llama-batched-bench.log"
    return 0
}

# `muser serve` on llama-glimmer ($G) with --parallel 32, driven by scripts/serve_rate.py:
# serve_rate TAG [VAR=value ...] -- serve_rate.py args. Prints one line per run. SERVER=llama
# serves the same file with llama.cpp's llama-server instead (the same slots, 4,096 tokens each,
# flash attention, every layer on the GPU).
serve_rate() {
    local tag=$1
    shift
    if [ $((DEADLINE - SECONDS)) -lt 45 ]; then
        echo "serve $tag skipped (device budget)" | tee -a "$OUT/serve.txt"
        return
    fi
    local envs=()
    while [ "$1" != "--" ]; do envs+=("$1"); shift; done
    shift
    local par=${SERVE_PAR:-32}
    if [ "${SERVER:-muser}" = llama ]; then
        env "${envs[@]}" /tmp/llama/llama.cpp/build/bin/llama-server -m "$G" -ngl 99 -fa on -np "$par" \
            -c $((par * 4096)) --no-webui --port 8090 > "$OUT/serve-$tag.log" 2>&1 &
    else
        env "${envs[@]}" "$BIN" serve -m "$G" --backend cuda --parallel "$par" -c 4096 --port 8090 > "$OUT/serve-$tag.log" 2>&1 &
    fi
    local pid=$! i
    for i in $(seq 1 150); do curl -sf http://127.0.0.1:8090/health > /dev/null 2>&1 && break; sleep 1; done
    echo "serve $tag: $(timeout $((DEADLINE - SECONDS - 5)) python3 scripts/serve_rate.py --url http://127.0.0.1:8090 "$@" 2>&1 | tr '\n' ' ')" |
        tee -a "$OUT/serve.txt"
    kill "$pid"
    wait "$pid" 2> /dev/null
}
# Greedy and sampled streams at 8 and 32 clients (2 x 128 tokens each), and long prompts (~1,850
# tokens, 8 clients x 2, 16 tokens each: the prefill path). The greedy loads run 2-3 rounds on
# one server: the first pays for the first steps of each group size (op by op, then recorded as a
# graph), the later ones run warm. SERVE_AB="VAR=value ..." also runs the 32-client load with
# those variables set.
serve_benches() {
    # SERVE_RUNS="TAG ...": only those runs (default: all but the A/B ones, which run when their
    # variables are set).
    want() { [ -z "${SERVE_RUNS:-}" ] || [[ " $SERVE_RUNS " == *" $1 "* ]]; }
    # greedy4 (4 clients) only when SERVE_RUNS names it; SERVE_AB4="VAR=value ...": again with those.
    [[ " ${SERVE_RUNS:-} " == *" greedy4 "* ]] && serve_rate greedy4 X=1 -- --clients 4 --requests 2 --max-tokens 128 --rounds 2
    [ -n "${SERVE_AB4:-}" ] && serve_rate greedy4-ab $SERVE_AB4 -- --clients 4 --requests 2 --max-tokens 128 --rounds 2
    want greedy8 && serve_rate greedy8 X=1 -- --clients 8 --requests 2 --max-tokens 128 --rounds 2
    # SERVE_AB8="VAR=value ...": the 8-client load with those variables set too.
    [ -n "${SERVE_AB8:-}" ] && serve_rate greedy8-ab $SERVE_AB8 -- --clients 8 --requests 2 --max-tokens 128 --rounds 2
    want greedy32 && serve_rate greedy32 X=1 -- --clients 32 --requests 2 --max-tokens 128 --rounds 3
    [ -n "${SERVE_AB:-}" ] && serve_rate greedy32-ab $SERVE_AB -- --clients 32 --requests 2 --max-tokens 128 --rounds 3
    # SERVE64=1: 64 clients on 64 slots too.
    [ "${SERVE64:-0}" = 1 ] && SERVE_PAR=64 serve_rate greedy64 X=1 -- --clients 64 --requests 2 --max-tokens 128
    want temp32 && serve_rate temp32 X=1 -- --clients 32 --requests 2 --max-tokens 128 --temperature 0.8
    want long8 && serve_rate long8 X=1 -- --clients 8 --requests 2 --max-tokens 16 --prompt-words 900-1100
    # SERVE_LLAMA=1 (with LLAMA=1, which then builds llama-server too): llama.cpp's llama-server on
    # the same file under the same greedy loads (scripts/serve_compare.sh does this on the CPU).
    if [ "${SERVE_LLAMA:-0}" = 1 ] && [ -n "${LLAMA_PID:-}" ]; then
        wait "$LLAMA_PID" 2> /dev/null
        want greedy8 && SERVER=llama serve_rate llama-greedy8 X=1 -- --clients 8 --requests 2 --max-tokens 128 --rounds 2
        want greedy32 && SERVER=llama serve_rate llama-greedy32 X=1 -- --clients 32 --requests 2 --max-tokens 128 --rounds 2
    fi
    return 0
}

if [ "${JOB:-}" = choices ]; then
    # `muser serve` on CUDA: a request's n choices each the solo request with its seed, and a
    # shared long prefix copied between slots' caches (scripts/serve_choices_check.py), on a
    # model with sliding layers (muse-mid) and one with full layers only (llama-1b).
    for preset in ${PRESETS:-muse-mid llama-1b}; do
        G=$MODELS/$preset.gguf
        step "synth-$preset" 120 "$BIN" synth "$preset" "$G"
        # whole-model parity against the CPU (prompt logits, `model embeddings`, greedy decode),
        # batch invariance, the copied prefixes (`kv_copy_prefix`) and the prefixes saved to host
        # memory and taken back (`kv_save_load`) on this model, bit for bit
        step "invariance-$preset" 200 "$BIN" check --backend cuda --no-ops --model "$G" --tokens 8
        grep -hE "^FAIL|kv_copy_prefix|kv_save_load|model (embeddings|prompt)" "$OUT/invariance-$preset.log"
        rm -rf /tmp/muser-slots && mkdir -p /tmp/muser-slots
        "$BIN" serve -m "$G" --backend cuda --parallel 8 -c 4096 --port 8090 --slot-save-path /tmp/muser-slots > "$OUT/serve-$preset.log" 2>&1 &
        pid=$!
        for i in $(seq 1 150); do curl -sf http://127.0.0.1:8090/health > /dev/null 2>&1 && break; sleep 1; done
        step "choices-$preset" 240 python3 scripts/serve_choices_check.py --url http://127.0.0.1:8090 --slot-files
        kill "$pid"
        wait "$pid" 2> /dev/null
        echo "$preset: $(tail -1 "$OUT/choices-$preset.log")"
        grep FAIL "$OUT/choices-$preset.log"
    done
    exit 0
fi

if [ "${JOB:-}" = serve ]; then
    # `muser serve` alone (serve_benches) on a synthesized llama-glimmer.
    G=$MODELS/llama-glimmer.gguf
    step synth-llama-glimmer 90 "$BIN" synth llama-glimmer "$G"
    serve_benches
    # The engine's own decode groups on the same file, for the servers' figures.
    step bench-streams 90 "$BIN" bench --backend cuda -m "$G" -p 0 -n 128 -r 2 -s "${STREAMS:-8,32}"
    grep "^|" "$OUT/bench-streams.log"
    exit 0
fi

if [ "${JOB:-}" = final ]; then
    # Everything of issues 4-6 in one call: parity (ops at the Glimmer shapes, whole-model
    # muse-tiny and muse-mid, invariance with graph replay), the matvec timing, muse-glimmer and
    # llama-glimmer (pp512, tg128 with and without graphs, depth 8192, decode groups), and with
    # LLAMA=1 llama.cpp's llama-bench and llama-batched-bench on the same llama-glimmer file.
    G=$MODELS/llama-glimmer.gguf M=$MODELS/muse-glimmer.gguf T=$MODELS/muse-tiny.gguf D=$MODELS/muse-mid.gguf
    # Most important first: every step stops at the deadline (BUDGET), the rest are skipped.
    step synth-llama-glimmer 90 "$BIN" synth llama-glimmer "$G"
    step synth-muse-tiny 30 "$BIN" synth muse-tiny "$T"
    step synth-muse-mid 60 "$BIN" synth muse-mid "$D"
    # The parity command at the Glimmer shapes (QUICK=1: the small shapes), whole models, invariance.
    step check 240 "$BIN" check --backend cuda $([ "${QUICK:-0}" = 1 ] && echo --quick) --bench \
        --model "$T" --model "$D" --invariance "$T" --invariance "$G"
    step bench-llama 90 "$BIN" bench --backend cuda -m "$G" -p 512 -n 128 -r "$REPS"
    # FINAL_AB="VAR=value ...": tg128 again with those variables, right after.
    [ -n "${FINAL_AB:-}" ] && step bench-llama-ab 60 env $FINAL_AB "$BIN" bench --backend cuda -m "$G" -p 0 -n 128 -r "$REPS"
    step bench-llama-streams 90 "$BIN" bench --backend cuda -m "$G" -p 0 -n 64 -r 2 -s "${STREAMS:-1,8,32}"
    llama_benches
    step bench-llama-d8192 90 "$BIN" bench --backend cuda -m "$G" -p 0 -n 128 -d 8192 -r 2
    step synth-muse-glimmer 150 "$BIN" synth muse-glimmer "$M"
    step bench-muse 120 "$BIN" bench --backend cuda -m "$M" -p 512 -n 128 -r "$REPS" --audit
    step bench-muse-d8192 90 "$BIN" bench --backend cuda -m "$M" -p 0 -n 128 -d 8192 -r 2
    step profile 60 "$BIN" check --backend cuda --no-ops --speed "$G" --group-profile 8,32
    step bench-llama-nographs 60 env MUSER_CUDA_GRAPHS=0 "$BIN" bench --backend cuda -m "$G" -p 0 -n 128 -r "$REPS"
    if [ "${NCU:-0}" = 1 ]; then
        # One decode step kernel by kernel (as JOB=timeline), if the budget still allows.
        ncu_timeline ""
    fi
    echo
    echo "================ short table ================"
    check_counts
    grep -hE "^FAIL|never dispatched|^all |decode_greedy|batch invariance|^model |speed" "$OUT/check.log" | head -24
    sed -n '/^matvec timing/,/^$/p' "$OUT/check.log" | head -16
    grep -h "^decode group of" "$OUT/profile.log" 2>/dev/null
    grep "^| .*CUDA" "$OUT"/bench-*.log | sed "s|$OUT/||"
    grep -h "one decode step launches\|^decode step:\|never dispatched by" "$OUT/bench-muse.log"
    llama_table
    [ -f "$OUT/timeline.txt" ] && head -14 "$OUT/timeline.txt"
    cat "$OUT/summary.txt"
    exit 0
fi

if [ "${JOB:-}" = parity ]; then
    # The parity command at the Glimmer shapes (every op, both sides of every routing boundary),
    # whole-model parity of muse-tiny and muse-mid against the CPU backend, batch invariance with
    # graph replay on muse-tiny and llama-glimmer, the matvec timings, then tg128 on llama-glimmer.
    full_parity
    step bench-llama 90 "$BIN" bench --backend cuda -m "$G" -p 512 -n 128 -r "$REPS" --audit
    step bench-llama-streams 90 "$BIN" bench --backend cuda -m "$G" -p 0 -n 64 -r 2 -s "${STREAMS:-1,8,32}"
    [ "${PROFILE:-1}" = 1 ] && step profile 60 "$BIN" check --backend cuda --no-ops --speed "$G" --group-profile 8,32
    # SASS_KERNELS set: their source counters too (see sass_profile).
    [ -n "${SASS_KERNELS:-}" ] && sass_profile > "$OUT/sass.txt" 2>&1
    echo
    echo "================ short table ================"
    check_counts
    grep -hE "^FAIL|never dispatched|^all |decode_greedy|batch invariance|^model |speed" "$OUT/check.log" | head -24
    grep -h "^decode group of\|^speed" "$OUT/profile.log" 2>/dev/null
    sed -n '/^matvec timing/,/^$/p' "$OUT/check.log" | head -16
    grep -h "^| .*CUDA" "$OUT"/bench-*.log
    grep -h "one decode step launches\|never dispatched by" "$OUT/bench-llama.log"
    [ -f "$OUT/sass.txt" ] && cat "$OUT/sass.txt"
    cat "$OUT/summary.txt"
    exit 0
fi

if [ "${JOB:-}" = graphs ]; then
    # Quick A/B of the decode-step recording: parity and invariance (graph replay against op by
    # op), then tg128 with graphs+PDL, graphs alone and neither, and at depth 8192.
    G=$MODELS/llama-glimmer.gguf T=$MODELS/muse-tiny.gguf
    step synth-llama-glimmer 90 "$BIN" synth llama-glimmer "$G"
    step synth-muse-tiny 30 "$BIN" synth muse-tiny "$T"
    step check 120 "$BIN" check --backend cuda --quick --invariance "$T" --invariance "$G"
    step bench-pdl 60 "$BIN" bench --backend cuda -m "$G" -p 0 -n 128 -r "$REPS" --audit
    step bench-graphs 60 env MUSER_CUDA_PDL=0 "$BIN" bench --backend cuda -m "$G" -p 0 -n 128 -r "$REPS"
    step bench-nographs 60 env MUSER_CUDA_GRAPHS=0 "$BIN" bench --backend cuda -m "$G" -p 0 -n 128 -r "$REPS"
    step bench-d8192 90 "$BIN" bench --backend cuda -m "$G" -p 0 -n 128 -d 8192 -r 2
    step bench-streams 90 "$BIN" bench --backend cuda -m "$G" -p 0 -n 64 -r 2 -s "${STREAMS:-1,8,32}"
    echo
    echo "================ short table ================"
    check_counts
    grep -hE "^FAIL|never dispatched|^all |decode_greedy|batch invariance" "$OUT/check.log" | head -16
    grep -h "^| .*CUDA" "$OUT"/bench-*.log
    grep -h "one decode step launches\|^decode step:\|never dispatched by" "$OUT/bench-pdl.log"
    cat "$OUT/summary.txt"
    exit 0
fi

if [ "${JOB:-}" = compare ]; then
    G=$MODELS/llama-glimmer.gguf T=$MODELS/muse-tiny.gguf
    step synth-llama-glimmer 90 "$BIN" synth llama-glimmer "$G"
    step synth-muse-tiny 30 "$BIN" synth muse-tiny "$T"
    step check 120 "$BIN" check --backend cuda --quick --invariance "$T" --invariance "$G"
    step bench-graphs 150 "$BIN" bench --backend cuda -m "$G" -p 512 -n 128 -r "$REPS" --audit
    step bench-nographs 60 env MUSER_CUDA_GRAPHS=0 "$BIN" bench --backend cuda -m "$G" -p 0 -n 128 -r "$REPS"
    step bench-d8192 90 "$BIN" bench --backend cuda -m "$G" -p 0 -n 128 -d 8192 -r 2
    step bench-streams 90 "$BIN" bench --backend cuda -m "$G" -p 0 -n 64 -r 2 -s "${STREAMS:-1,8,32}"
    llama_benches
    echo
    echo "================ short table ================"
    check_counts
    grep -hE "^FAIL|^invariance|never dispatched|^all |decode_greedy|batch invariance" "$OUT/check.log" | head -16
    grep -h "^| .*CUDA" "$OUT"/bench-*.log
    grep -h "one decode step launches\|never dispatched by" "$OUT/bench-graphs.log"
    llama_table
    tail -3 "$OUT/llama-build.log" 2>/dev/null
    cat "$OUT/summary.txt"
    exit 0
fi

if [ "${JOB:-}" = side ]; then
    # The session's closing call (issues 5 and 6): the full parity command while llama.cpp builds
    # on the host (LLAMA=1), then llama.cpp's benchmarks and Muser's on the same llama-glimmer
    # file, each after the build has ended, so on a quiet machine.
    full_parity
    llama_benches
    step bench-graphs 120 "$BIN" bench --backend cuda -m "$G" -p 512 -n 128 -r "$REPS" --audit
    step bench-d8192 90 "$BIN" bench --backend cuda -m "$G" -p 0 -n 128 -d 8192 -r 2
    step bench-streams 120 "$BIN" bench --backend cuda -m "$G" -p 0 -n 128 -r 2 -s "${STREAMS:-1,8,32}"
    # STREAMS_AB="VAR=value ...": 8 and 32 streams with those settings, then without them again
    # (an A/B/A of a switch in the same call, e.g. lab run 89's MUSER_CUDA_LM_CHUNKS=4).
    if [ -n "${STREAMS_AB:-}" ]; then
        step bench-streams-b 90 env $STREAMS_AB "$BIN" bench --backend cuda -m "$G" -p 0 -n 128 -r 2 -s 8,32
        step bench-streams-a2 90 "$BIN" bench --backend cuda -m "$G" -p 0 -n 128 -r 2 -s 8,32
    fi
    [ "${SERVE:-0}" = 1 ] && serve_benches
    # MUSE=1: pp512 and tg128 on muse-glimmer too (issue 5's own model), synthesized here.
    if [ "${MUSE:-0}" = 1 ]; then
        M=$MODELS/muse-glimmer.gguf
        step synth-muse-glimmer 90 "$BIN" synth muse-glimmer "$M" &&
            step bench-muse 120 "$BIN" bench --backend cuda -m "$M" -p 512 -n 128 -r "$REPS" --audit
        # TRACE_MUSE=1: one muse-glimmer decode step kernel by kernel (JOB=steptrace's trace; its
        # kernels must be in the carried cache, built with MUSER_CUDA_STEP_TRACE=1).
        [ "${TRACE_MUSE:-0}" = 1 ] && [ -f "$M" ] &&
            step trace-muse 60 env MUSER_CUDA_STEP_TRACE=1 "$BIN" bench --backend cuda -m "$M" -p 0 -n 32 -r 1 -s 1
        rm -f "$M"
    fi
    # TIMELINE=1: one decode step kernel by kernel last (as JOB=timeline), within the budget.
    [ "${TIMELINE:-0}" = 1 ] && ncu_timeline ""
    echo
    echo "================ short table ================"
    check_counts
    grep -hE "^FAIL|^invariance|never dispatched|^all |decode_greedy|batch invariance|^model " "$OUT/check.log" | head -20
    [ -f "$OUT/serve.txt" ] && cat "$OUT/serve.txt"
    grep -h "^| .*CUDA" "$OUT"/bench-*.log
    [ -n "${STREAMS_AB:-}" ] && for f in streams streams-b streams-a2; do
        echo "$f: $(grep -hE 'streams' "$OUT/bench-$f.log" | tr '\n' ' ')"
    done
    grep -h "one decode step launches\|never dispatched by" "$OUT/bench-graphs.log"
    llama_table
    tail -3 "$OUT/llama-build.log" 2>/dev/null
    [ -f "$OUT/timeline.txt" ] && head -14 "$OUT/timeline.txt"
    [ -f "$OUT/trace-muse.log" ] && sed -n '/^step trace/,/^middle/p' "$OUT/trace-muse.log" | head -24
    cat "$OUT/summary.txt"
    exit 0
fi

if [ "${JOB:-}" = timeline ]; then
    # One decode step kernel by kernel (Nsight Compute, each kernel alone, clocks and caches left
    # as they are) against the step's wall time: what the gaps cost. With CHECK=1 the quick
    # parity command (and batch invariance on both models) runs first.
    G=$MODELS/llama-glimmer.gguf T=$MODELS/muse-tiny.gguf
    step synth-llama-glimmer 60 "$BIN" synth llama-glimmer "$G"
    step synth-muse-tiny 30 "$BIN" synth muse-tiny "$T"
    if [ "${CHECK:-0}" = ops ]; then
        step check 90 "$BIN" check --backend cuda --quick
        check_counts
        grep -hE "^FAIL|never dispatched|^all |panicked|error" "$OUT/check.log" | head -20
    fi
    if [ "${CHECK:-0}" = 1 ]; then
        step check 240 "$BIN" check --backend cuda --quick --bench --invariance "$T" --invariance "$G"
        check_counts
        grep -hE "^FAIL|never dispatched|^all |panicked|error" "$OUT/check.log" | head -20
        sed -n '/^matvec timing/,/^$/p' "$OUT/check.log" | head -16
    fi
    step bench 150 "$BIN" bench --backend cuda -m "$G" -p "${PP:-512}" -n 128 -r 2 --audit
    tail -3 "$OUT/bench.log"
    # AB="VAR=value ...": the bench and the timeline again with those variables (an A/B run).
    for ab in "" ${AB:+"$AB"}; do
        sfx=${ab:+-ab}
        [ -n "$ab" ] && step bench$sfx 150 env $ab "$BIN" bench --backend cuda -m "$G" -p 0 -n 128 -r 2
        ncu_timeline "$sfx" $ab
    done
    echo
    echo "================ short table ================"
    grep "^| .*CUDA" "$OUT"/bench*.log | sed "s|$OUT/||"
    head -12 "$OUT/timeline.txt"
    [ -n "${AB:-}" ] && echo "with $AB:" && head -12 "$OUT/timeline-ab.txt"
    cat "$OUT/summary.txt"
    exit 0
fi

if [ "${JOB:-}" = steptrace ]; then
    # One decode step inside its CUDA graph, kernel by kernel (crates/muser-cuda/src/steptrace.rs:
    # MUSER_CUDA_STEP_TRACE=1 builds the kernels with the trace, so carry them in the kernel cache:
    # `MUSER_CUDA_STEP_TRACE=1 MUSER_KERNEL_CACHE=target/device/kernels target/device/muser
    # kernels`): what each kernel costs the step from its release to the next kernel's, for
    # STREAMS (default "1 8") decode streams on llama-glimmer (or the preset TRACE_MODEL).
    TM=${TRACE_MODEL:-llama-glimmer}
    G=$MODELS/$TM.gguf
    step "synth-$TM" 60 "$BIN" synth "$TM" "$G"
    # TRACE_DEPTHS="0 8192 ...": each stream count at each of those context depths (default 0).
    for d in ${TRACE_DEPTHS:-0}; do
        for s in ${STREAMS:-1 8}; do
            sfx=$s$([ "$d" = 0 ] || echo "-d$d")
            step "trace-$sfx" 120 env MUSER_CUDA_STEP_TRACE=1 "$BIN" bench --backend cuda -m "$G" -p 0 -n 32 -r 1 \
                -s "$s" -d "$d"
        done
    done
    echo
    echo "================ short table ================"
    for d in ${TRACE_DEPTHS:-0}; do
        for s in ${STREAMS:-1 8}; do
            sfx=$s$([ "$d" = 0 ] || echo "-d$d")
            grep -h "^| .*CUDA" "$OUT/trace-$sfx.log"
            sed -n '/^step trace/,$p' "$OUT/trace-$sfx.log"
        done
    done
    cat "$OUT/summary.txt"
    exit 0
fi

if [ "${JOB:-}" = ab ]; then
    # A/B of settings of one binary: the parity command (FULL=1 the full one, else --quick) with
    # --bench (matvec timings at the Glimmer shapes) and batch invariance, then for each setting
    # in AB (settings separated by ';', each "VAR=value ..." with an optional "bin=PATH", or "-")
    # llama-glimmer's
    # pp512 and tg128 (and decode groups of STREAMS, tg at DEPTH when set), and the per-op profile
    # of the first.
    G=$MODELS/llama-glimmer.gguf T=$MODELS/muse-tiny.gguf
    if [ "${FULL:-0}" = 1 ]; then
        # The full parity command (full_parity: muse-mid's whole-model parity too).
        full_parity
    else
        step synth-llama-glimmer 60 "$BIN" synth llama-glimmer "$G"
        step synth-muse-tiny 30 "$BIN" synth muse-tiny "$T"
        step check 240 env ${CHECK_ENV:-} "$BIN" check --backend cuda --quick --bench \
            --model "$T" --invariance "$T" --invariance "$G"
    fi
    # CHECK_BINS="PATH ...": the same parity command (without the matvec timing) on more
    # candidate builds, each its own log (check-NAME.log) and summary line.
    for cb in ${CHECK_BINS:-}; do
        step "check-$(basename "$cb")" 200 env ${CHECK_ENV:-} "$cb" check --backend cuda \
            $([ "${FULL:-0}" = 1 ] || echo --quick) --model "$T" --invariance "$T" --invariance "$G"
        echo "check $(basename "$cb"): $(grep -hcE "^ok" "$OUT/check-$(basename "$cb").log") ok," \
            "$(grep -hcE "^FAIL" "$OUT/check-$(basename "$cb").log") FAIL" >> "$OUT/summary.txt"
    done
    i=0
    IFS=';' read -ra SETS <<< "${AB:--}"
    for set in "${SETS[@]}"; do
        i=$((i + 1))
        [ "$set" = - ] && set=""
        # "bin=PATH" in a setting: that binary instead of $BIN (an A/B of builds).
        b=$BIN
        for w in $set; do case $w in bin=*) b=${w#bin=} ;; esac; done
        set=$(echo "$set" | tr ' ' '\n' | grep -v '^bin=' | tr '\n' ' ')
        echo "setting $i: $(basename "$b") ${set:-(none)}" >> "$OUT/summary.txt"
        step "bench-$i" 90 env $set "$b" bench --backend cuda -m "$G" -p 512 -n 128 -r 2 \
            $([ -n "${STREAMS:-}" ] && echo "-s $STREAMS")
        # DEPTH=N: tg at that context depth too.
        [ -n "${DEPTH:-}" ] && step "bench-$i-d$DEPTH" 90 env $set "$b" bench --backend cuda -m "$G" -p 0 -n 64 \
            -d "$DEPTH" -r 2
        # TRACE="i j ...": the step trace (JOB=steptrace; its kernels in the carried cache) of
        # those settings too, at TRACE_STREAMS (default 1) streams, appended to trace.log.
        case " ${TRACE:-} " in *" $i "*)
            step "trace-$i" 90 env $set MUSER_CUDA_STEP_TRACE=1 "$b" bench --backend cuda -m "$G" -p 0 -n 32 -r 1 \
                -s "${TRACE_STREAMS:-1}"
            { echo "== setting $i: $set"; sed -n '/^step trace/,$p' "$OUT/trace-$i.log"; } >> "$OUT/trace.log"
            rm -f "$OUT/trace-$i.log" ;;
        esac
    done
    # FINAL=1: $BIN's figures as the parity job records them (pp512, tg128 with --audit, and
    # decode groups of 1, 4, 8, 16 and 32 streams).
    if [ "${FINAL:-0}" = 1 ]; then
        step bench-final 90 "$BIN" bench --backend cuda -m "$G" -p 512 -n 128 -r 3 --audit
        step bench-final-streams 90 "$BIN" bench --backend cuda -m "$G" -p 0 -n 64 -r 2 -s 1,4,8,16,32
    fi
    # SPEED_ARGS: more arguments of the per-op profile (e.g. "--depth 8192": one at that depth too);
    # SPEED=0: none.
    [ "${SPEED:-1}" = 1 ] && step speed 150 "$BIN" check --backend cuda --no-ops ${SPEED_ARGS:-} --speed "$G"
    # TRAFFIC_KERNELS set: each setting's memory traffic for them (traffic_profile), its binary
    # run with its variables.
    if [ -n "${TRAFFIC_KERNELS:-}" ]; then
        i=0
        for set in "${SETS[@]}"; do
            i=$((i + 1))
            [ "$set" = - ] && set=""
            b=$BIN
            for w in $set; do case $w in bin=*) b=${w#bin=} ;; esac; done
            set=$(echo "$set" | tr ' ' '\n' | grep -v '^bin=' | tr '\n' ' ')
            traffic_profile "$b" "$i" $set
        done > "$OUT/traffic.txt" 2>&1
    fi
    # SASS_KERNELS set: their source counters too (see sass_profile).
    [ -n "${SASS_KERNELS:-}" ] && sass_profile > "$OUT/sass.txt" 2>&1
    echo
    echo "================ short table ================"
    check_summary
    sed -n '/^| matrix | type/,/^$/p' "$OUT/check.log" | head -24
    for f in "$OUT"/bench-*.log; do grep -H "^| .*CUDA" "$f" | sed "s|$OUT/||"; done
    [ -f "$OUT/speed.log" ] && grep -h "^| \|^speed" "$OUT/speed.log" | head -64
    [ -f "$OUT/trace.log" ] && cat "$OUT/trace.log"
    [ -f "$OUT/sass.txt" ] && cat "$OUT/sass.txt"
    [ -f "$OUT/traffic.txt" ] && cat "$OUT/traffic.txt"
    cat "$OUT/summary.txt"
    exit 0
fi

if [ "${JOB:-}" = sass ]; then
    # PROFILE_GROUPS=8,32: the per-op profile of decode-group steps of those widths first.
    G=$MODELS/llama-glimmer.gguf
    step synth-llama-glimmer 60 "$BIN" synth llama-glimmer "$G"
    [ -n "${PROFILE_GROUPS:-}" ] && step profile 90 "$BIN" check --backend cuda --no-ops --speed "$G" --group-profile "$PROFILE_GROUPS" &&
        grep -h "^| \|^decode group\|^group" "$OUT/profile.log" | tail -40
    sass_profile
    cat "$OUT/summary.txt"
    exit 0
fi

ncu_kernel() {
    # Hardware counters of one launch of NCU_KERNEL in decode groups of NCU_STREAMS, at depth
    # NCU_DEPTH (default 0). Only the timed decode steps are captured (MUSER_PROFILE_DECODE:
    # bench opens the profiler's range around them), so the launch count skips decode
    # launches only, not the prefill's (which runs the same attention kernels).
    step ncu-kernel 240 env MUSER_CUDA_GRAPHS=0 MUSER_PROFILE_DECODE=1 "$NCU_BIN" --profile-from-start off \
        --clock-control none --kernel-name "regex:^$NCU_KERNEL\$" \
        --launch-skip "${NCU_SKIP:-60}" --launch-count 1 --section SpeedOfLight --section Occupancy --section LaunchStats \
        --section WarpStateStats --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis \
        --section SourceCounters \
        "$BIN" bench --backend cuda -m "$1" -p 0 -n 4 -r 1 -s "${NCU_STREAMS:-8}" ${NCU_DEPTH:+-d "$NCU_DEPTH"}
}
ncu_table() {
    [ -f "$OUT/ncu-kernel.log" ] && grep -E "Duration|Memory Throughput|DRAM Throughput|Achieved Occupancy|Registers Per|Stall|Warp Cycles Per Issued|Issue Slots Busy|L1/TEX Hit|L2 Hit|Eligible Warps" "$OUT/ncu-kernel.log" | head -30
}

if [ "${JOB:-}" = tiles ]; then
    # Prefill and decode groups (the tensor-core kernels of 2 or more columns, prefill attention):
    # the quick parity command with batch invariance on both models, whole-model parity of
    # muse-tiny (FULL=1: the full parity command, which also checks mmt_split_4), then pp512
    # and decode groups of 8 and 32 streams on llama-glimmer for $BIN, each binary in ALT (an
    # A/B of builds) and $BIN with the variables in AB, the prefill and decode-step breakdowns
    # per op, and the per-op profile of decode groups.
    G=$MODELS/llama-glimmer.gguf T=$MODELS/muse-tiny.gguf
    step synth-llama-glimmer 60 "$BIN" synth llama-glimmer "$G"
    step synth-muse-tiny 30 "$BIN" synth muse-tiny "$T"
    step check 240 "$BIN" check --backend cuda $([ "${FULL:-0}" = 1 ] || echo --quick) --model "$T" \
        --invariance "$T" --invariance "$G"
    for b in "$BIN" ${ALT:-}; do
        step "bench-$(basename "$b")" 90 "$b" bench --backend cuda -m "$G" -p 512 -n 32 -r 2 -s "${STREAMS:-8,32}"
    done
    # AB="VAR=value ...": $BIN's bench again with those variables (e.g. MUSER_CUDA_MMT_SPLIT=1).
    [ -n "${AB:-}" ] && step bench-ab 90 env $AB "$BIN" bench --backend cuda -m "$G" -p 512 -n 32 -r 2 \
        -s "${STREAMS:-8,32}"
    # SPEED_ARGS: more arguments of the per-op profile (e.g. "--depth 8192": one at that depth too).
    step speed 90 "$BIN" check --backend cuda --no-ops ${SPEED_ARGS:-} --speed "$G" --group-profile 8,32
    if [ -n "${NCU_KERNEL:-}" ]; then
        ncu_kernel "$G"
    fi
    echo
    echo "================ short table ================"
    check_summary
    grep "^| .*CUDA" "$OUT"/bench-*.log | sed "s|$OUT/||"
    grep -h "^| \|^speed\|^decode group of" "$OUT/speed.log" | head -40
    ncu_table
    cat "$OUT/summary.txt"
    exit 0
fi

if [ "${JOB:-}" = ncu ]; then
    # Nsight Compute alone: one decode launch of NCU_KERNEL (e.g. attn_rows_mma8_128) in groups of
    # NCU_STREAMS at depth NCU_DEPTH on llama-glimmer, with its source counters (the SASS lines'
    # warp stalls) in $OUT/ncu-kernel.log. E.g. JOB=ncu NCU_KERNEL=attn_rows_mma8_128
    # NCU_STREAMS=32 NCU_DEPTH=4096 (the grouped attention at depth, ~29% of that step).
    G=$MODELS/llama-glimmer.gguf
    step synth-llama-glimmer 90 "$BIN" synth llama-glimmer "$G"
    ncu_kernel "$G"
    echo
    echo "================ short table ================"
    ncu_table
    cat "$OUT/summary.txt"
    exit 0
fi

if [ "${JOB:-}" = depth ]; then
    # Decode at long context: tg at each depth of DEPTHS (default "0 8192 16384 32768") on
    # llama-glimmer, with LLAMA=1 llama-bench at the same depths on the same file, and with MUSE=1
    # muse-glimmer (39 of its 52 layers slide over 4096 positions). Each depth's context is
    # prefilled (untimed) before every repetition, so the deep runs take one warm-up and DREPS
    # (default 1) timed runs of NGEN (default 64) tokens. CHECK=1: the quick parity command with
    # batch invariance first. DEPTH_AB="VAR=value ...": each llama-glimmer depth again with those
    # variables set, right after its default run. DEPTH_STREAMS="4,8,32": decode groups too, at
    # each depth past 0 (`bench -s`, tg32, each stream prefilled to the depth), with LLAMA=1
    # llama-batched-bench at the same depths and stream counts.
    G=$MODELS/llama-glimmer.gguf M=$MODELS/muse-glimmer.gguf T=$MODELS/muse-tiny.gguf
    DEPTHS=${DEPTHS:-0 8192 16384 32768}
    NGEN=${NGEN:-64}
    step synth-llama-glimmer 90 "$BIN" synth llama-glimmer "$G"
    if [ "${CHECK:-0}" = 1 ]; then
        step synth-muse-tiny 30 "$BIN" synth muse-tiny "$T"
        step check 240 "$BIN" check --backend cuda --quick --model "$T" --invariance "$T" --invariance "$G"
        check_summary
    fi
    for d in $DEPTHS; do
        step "bench-llama-d$d" 150 "$BIN" bench --backend cuda -m "$G" -p 0 -n "$NGEN" -d "$d" -r "${DREPS:-1}"
        [ -n "${DEPTH_AB:-}" ] && step "bench-llama-d$d-ab" 150 env $DEPTH_AB "$BIN" bench --backend cuda -m "$G" \
            -p 0 -n "$NGEN" -d "$d" -r "${DREPS:-1}"
        if [ -n "${DEPTH_STREAMS:-}" ] && [ "$d" != 0 ]; then
            step "bench-groups-d$d" 300 "$BIN" bench --backend cuda -m "$G" -p 0 -n 32 -r 1 -d "$d" -s "$DEPTH_STREAMS"
            [ -n "${DEPTH_AB:-}" ] && step "bench-groups-d$d-ab" 300 env $DEPTH_AB "$BIN" bench --backend cuda \
                -m "$G" -p 0 -n 32 -r 1 -d "$d" -s "$DEPTH_STREAMS"
        fi
    done
    if [ -n "${LLAMA_PID:-}" ]; then
        wait "$LLAMA_PID"
        step llama-bench-depth 300 /tmp/llama/llama.cpp/build/bin/llama-bench -m "$G" -p 0 -n "$NGEN" -fa 1 \
            -r "${DREPS:-1}" -d "$(echo $DEPTHS | tr ' ' ',')"
        if [ -n "${DEPTH_STREAMS:-}" ]; then
            most=$(echo "$DEPTH_STREAMS" | tr ',' '\n' | sort -n | tail -1)
            for d in $DEPTHS; do
                [ "$d" = 0 ] && continue
                step "llama-batched-d$d" 300 /tmp/llama/llama.cpp/build/bin/llama-batched-bench -m "$G" \
                    -c $((most * (d + 32))) -b 2048 -ub 512 -npp "$d" -ntg 32 -npl "$DEPTH_STREAMS" -fa on -ngl 99
            done
        fi
    fi
    if [ "${MUSE:-0}" = 1 ]; then
        step synth-muse-glimmer 150 "$BIN" synth muse-glimmer "$M"
        for d in $DEPTHS; do
            step "bench-muse-d$d" 150 "$BIN" bench --backend cuda -m "$M" -p 0 -n "$NGEN" -d "$d" -r "${DREPS:-1}"
        done
    fi
    echo
    echo "================ short table ================"
    for f in "$OUT"/bench-llama-d*.log "$OUT"/bench-muse-d*.log "$OUT"/bench-groups-d*.log; do
        [ -f "$f" ] && grep -h "^| .*CUDA" "$f" | cut -d'|' -f7-8 | sed "s|^|$(basename "$f" .log):|"
    done
    [ -f "$OUT/llama-bench-depth.log" ] && grep "^| " "$OUT/llama-bench-depth.log"
    for f in "$OUT"/llama-batched-d*.log; do [ -f "$f" ] && grep "^|" "$f"; done
    tail -3 "$OUT/llama-build.log" 2> /dev/null
    cat "$OUT/summary.txt"
    exit 0
fi

if [ "${JOB:-}" = streams ]; then
    G=$MODELS/llama-glimmer.gguf T=$MODELS/muse-tiny.gguf
    step synth-llama-glimmer 60 "$BIN" synth llama-glimmer "$G"
    step synth-muse-tiny 30 "$BIN" synth muse-tiny "$T"
    S=${STREAMS:-1,8,32}
    step check 90 "$BIN" check --backend cuda --quick --invariance "$T" --invariance "$G"
    step bench-streams 60 "$BIN" bench --backend cuda -m "$G" -p 0 -n 32 -r 1 -s "$S"
    [ "${PROFILE:-1}" = 1 ] && step profile 60 "$BIN" check --backend cuda --no-ops --speed "$G" --group-profile 8,32
    # SASS_KERNELS set: their source counters too (see sass_profile).
    [ -n "${SASS_KERNELS:-}" ] && sass_profile > "$OUT/sass.txt" 2>&1
    echo
    echo "================ short table ================"
    check_counts
    grep -hE "^FAIL|^invariance|never dispatched|^all " "$OUT/check.log" | head -12
    grep -h "^decode group of\|^speed" "$OUT/profile.log" 2>/dev/null
    grep -h "^| " "$OUT/bench-streams.log"
    cat "$OUT/summary.txt"
    exit 0
fi

for p in muse-glimmer llama-glimmer muse-tiny muse-mid; do
    step "synth-$p" 120 "$BIN" synth "$p" "$MODELS/$p.gguf"
done
if [ "${QUICK:-0}" = 1 ]; then
    step check 120 "$BIN" check --backend cuda --quick
else
    step check 200 "$BIN" check --backend cuda --model "$MODELS/muse-tiny.gguf" --model "$MODELS/muse-mid.gguf"
fi
for m in muse-glimmer llama-glimmer; do
    step "bench-$m" 150 "$BIN" bench --backend cuda -m "$MODELS/$m.gguf" -p 512 -n 128 -r "$REPS"
    step "bench-$m-d8192" 150 "$BIN" bench --backend cuda -m "$MODELS/$m.gguf" -p 0 -n 128 -d 8192 -r 2
done

if [ -n "${LLAMA_PID:-}" ]; then
    wait "$LLAMA_PID"
    LB=/tmp/llama/llama.cpp/build/bin/llama-bench
    step llama-bench 200 "$LB" -m "$MODELS/llama-glimmer.gguf" -p 512 -n 128 -fa 1 -r "$REPS" -d 0,8192
fi

echo
echo "================ short table ================"
grep -hE "^(ok|FAIL)" "$OUT/check.log" | awk '{print $1}' | sort | uniq -c
grep -hE "never dispatched|^all |failed" "$OUT/check.log" | head -20
grep -h "^| " "$OUT"/bench-*.log | sort -u
[ -f "$OUT/llama-bench.log" ] && grep "^| " "$OUT/llama-bench.log"
cat "$OUT/summary.txt"
