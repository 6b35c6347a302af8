#!/usr/bin/env bash
# temp (untracked): greedy picks on the device, serve rate
set -uo pipefail
B=target/device/muser; M=/tmp/m; mkdir -p $M $OUT
export MUSER_KERNEL_CACHE=$PWD/target/device/kernels
t0=$SECONDS
$B synth llama-glimmer $M/g.gguf > $OUT/synth.log 2>&1; $B synth muse-tiny $M/t.gguf >> $OUT/synth.log 2>&1
echo "synth $((SECONDS-t0)) s"
timeout 400 $B check --backend cuda --quick --model $M/t.gguf --invariance $M/t.gguf --invariance $M/g.gguf > $OUT/check.log 2>&1
echo "check rc=$? $((SECONDS-t0)) s: $(grep -c '^ok' $OUT/check.log) ok, $(grep -c '^FAIL' $OUT/check.log) FAIL"
grep -E "^FAIL|decode_picks|^invariance|decode_greedy" $OUT/check.log | head -20
for r in 1 2; do
  for a in "" "--argmax"; do
    timeout 120 $B bench --backend cuda -m $M/g.gguf -p 0 -n 64 -r 2 -s 1,8,32 $a 2>&1 | tee -a $OUT/bench.log | grep '^| .*CUDA' | awk -F'|' '{print $7 "|" $8}'
  done
done
echo "bench done $((SECONDS-t0)) s"
$B serve --backend cuda -m $M/g.gguf --port 8090 --parallel 32 > $OUT/serve.log 2>&1 &
SP=$!
for i in $(seq 1 120); do curl -s -o /dev/null -w "%{http_code}" localhost:8090/health 2>/dev/null | grep -q 200 && break; sleep 1; done
echo "serve up $((SECONDS-t0)) s"
U=http://127.0.0.1:8090
python3 scripts/serve_rate.py --url $U --clients 8 --requests 1 --max-tokens 32 > /dev/null 2>&1  # warm-up
for c in 1 8 32; do
  python3 scripts/serve_rate.py --url $U --clients $c --requests 2 --max-tokens 128
  python3 scripts/serve_rate.py --url $U --clients $c --requests 2 --max-tokens 128 --logprobs 1
  python3 scripts/serve_rate.py --url $U --clients $c --requests 2 --max-tokens 128 --temperature 0.8
done 2>&1 | tee $OUT/serve_rate.log
kill $SP
echo "all $((SECONDS-t0)) s"
