#!/usr/bin/env bash
# Session 6: three consumer warpgroups (c3): correctness tests, then FP8 and bf16 A/B.
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 MLAGEN_OUT_DIR=/tmp/mlo
T0=$(date +%s)
(ls shared/peers/fa3/build/*.so >/dev/null 2>&1 || env -u OUT nice python3 shared/peers/fa3/build_fa3.py --build-dir shared/peers/fa3/build > /tmp/fa3build.log 2>&1; echo "fa3 build rc=$? $(( $(date +%s)-T0 ))s" >> $OUT/summary.txt) &
nvidia-smi --query-gpu=name,driver_version,clocks.sm,power.draw --format=csv,noheader > $OUT/env.txt
timeout 200 python3 -m pytest -q -p no:cacheprovider -rs tests/gpu/test_mla_prefill_gpu.py tests/gpu/test_fp8_gpu.py -k "consumers=3" > $OUT/tests-c3.log 2>&1
echo "c3 tests rc=$? $(( $(date +%s)-T0 ))s $(tail -1 $OUT/tests-c3.log)" >> $OUT/summary.txt
F=consumers=3,block_n=96,order=none,load_warps=1,producer_regs=24,consumer_regs=160,swizzle_v=32
timeout 150 python3 -m mlagen.bench_fp8 --shapes D1,D3 --rounds 5 --variant $F --variant $F,rescale=first --variant $F,stages=3 --variant $F,pv_wait=late --variant $F,scheduler=static --variant consumers=3,block_n=64,order=none,load_warps=1,producer_regs=24,consumer_regs=160,swizzle_v=64,stages=3 > $OUT/bench-fp8-c3.log 2>&1
echo "fp8 bench rc=$? $(( $(date +%s)-T0 ))s" >> $OUT/summary.txt
wait
B=consumers=3,block_n=80,order=none,load_warps=1,producer_regs=24,consumer_regs=160
for S in D1 D3 D2; do
timeout 100 python3 .carry/prof/ab_bf16.py $S $B $B,stages=3 $B,rescale=first consumers=3,block_n=64,order=none,load_warps=1,producer_regs=24,consumer_regs=160,stages=3 $B,epilogue=direct $B,scheduler=static > $OUT/ab-$S.log 2>&1
echo "ab $S rc=$? $(( $(date +%s)-T0 ))s" >> $OUT/summary.txt
done
cat $OUT/summary.txt; grep -E "FAILED|ERROR|passed|failed" $OUT/tests-c3.log | head -20; cut -c1-220 $OUT/bench-fp8-c3.log | tail -20; for S in D1 D3 D2; do cut -c1-200 $OUT/ab-$S.log | tail -8; done
