G=/tmp/m/llama-glimmer.gguf; B=target/device/mmh6; export MUSER_KERNEL_CACHE=$PWD/target/device/kernels; mkdir -p /tmp/m
$B synth llama-glimmer $G > /dev/null 2>&1
for s in "" "MUSER_CUDA_MMG_LBO=128 MUSER_CUDA_MMG_SBO=2048"; do
  env MUSER_CUDA_MMH_KERNEL=mmh_g $s timeout 60 $B check --backend cuda --quick > $OUT/check-g.log 2>&1; echo "mmh_g [$s]: $(grep -c ^ok $OUT/check-g.log) ok $(grep -c ^FAIL $OUT/check-g.log) FAIL"; grep -m3 "f16" $OUT/check-g.log; grep -E "^  mmh" $OUT/check-g.log | head -3
  env MUSER_CUDA_MMH_KERNEL=mmh_g $s timeout 60 $B bench --backend cuda -m $G -p 512 -n 0 -r 3 2>&1 | grep -E "pp512|rror|anic"
  env MUSER_CUDA_MMH_KERNEL=mmh_g $s timeout 60 $B check --backend cuda --no-ops --speed $G > $OUT/speed-g.log 2>&1; grep -m4 "ffn_gate_up\|ffn_down\|attn_q\|attn_output" $OUT/speed-g.log
done
MUSER_CUDA_MMH=0 timeout 60 $B bench --backend cuda -m $G -p 512 -n 0 -r 3 2>&1 | grep pp512
MUSER_CUDA_MMH_KERNEL=mmh_w timeout 60 $B bench --backend cuda -m $G -p 512 -n 0 -r 3 2>&1 | grep pp512
