#!/usr/bin/env bash
# Session 6: c3 correctness tests, then bf16 A/B on every dense shape and FP8 A/B.
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 MLAGEN_OUT_DIR=/tmp/mlo
T0=$(date +%s)
(ls shared/peers/fa3/build/*.so >/dev/null 2>&1 || env -u OUT nice python3 shared/peers/fa3/build_fa3.py --build-dir shared/peers/fa3/build > /tmp/fa3build.log 2>&1; echo "fa3 build rc=$? $(( $(date +%s)-T0 ))s" >> $OUT/summary.txt) &
timeout 240 python3 -m pytest -q -p no:cacheprovider -rs tests/gpu/test_mla_prefill_gpu.py tests/gpu/test_fp8_gpu.py -k "consumers" > $OUT/tests-c3.log 2>&1
echo "c3 tests rc=$? $(( $(date +%s)-T0 ))s $(tail -1 $OUT/tests-c3.log)" >> $OUT/summary.txt
F=consumers=3,block_n=96,order=none,load_warps=1,producer_regs=24,consumer_regs=160,swizzle_v=32
timeout 150 python3 -m mlagen.bench_fp8 --shapes D1,D3 --rounds 5 --variant $F --variant $F,rescale=first --variant $F,pv_wait=late --variant $F,stages=3 --variant $F,stages=3,pv_wait=late --variant $F,load_warps=2,producer_regs=32 --variant $F,cluster=2,scheduler=static > $OUT/bench-fp8-c3.log 2>&1
echo "fp8 bench rc=$? $(( $(date +%s)-T0 ))s" >> $OUT/summary.txt
wait
B=consumers=3,block_n=80,order=none,load_warps=1,producer_regs=24,consumer_regs=160
for S in D1 D3 D4 D5 D6 D7 b=1,q=8192,k=8192,h=64,causal D2; do
timeout 100 python3 .carry/prof/ab_bf16.py $S $B $B,stages=3 $B,load_warps=2 $B,pv_wait=late $B,cluster=2,scheduler=static $B,overlap=false > $OUT/ab-${S:0:2}.log 2>&1
echo "ab $S rc=$? $(( $(date +%s)-T0 ))s" >> $OUT/summary.txt
done
cat $OUT/summary.txt; grep -E "FAILED|ERROR|passed|failed" $OUT/tests-c3.log | head -20; grep -v ": ok" $OUT/bench-fp8-c3.log | cut -c1-200 | tail -20; for f in $OUT/ab-*.log; do grep -v ": ok" $f | cut -c1-200 | tail -8; done
