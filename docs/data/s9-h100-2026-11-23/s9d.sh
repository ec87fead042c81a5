#!/usr/bin/env bash
# Session 9 H100 call 4: FP8 schedules with the lazy maximum (D1, D3), and the FP8 records.
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 MLAGEN_OUT_DIR=/tmp/mlo
T0=$(date +%s); S=$OUT/summary.txt
el() { echo $(( $(date +%s)-T0 )); }
C3="consumers=3,stages=3,order=none,scheduler=dynamic,epilogue=direct,load_warps=1,producer_regs=24,consumer_regs=160,swizzle_q=64,swizzle_k=64,rescale=lazy"
for sh in D1 D3; do
timeout 200 python3 -m mlagen.bench_fp8 --shapes $sh --variant $C3,block_n=96,swizzle_v=32,pv_wait=late --variant $C3,block_n=96,swizzle_v=32,pv_wait=early --variant $C3,block_n=64,swizzle_v=64 --variant rescale=lazy --variant rescale=lazy,block_n=128,swizzle_v=128 >> $OUT/fp8.log 2>&1; echo "fp8 $sh rc=$? $(el)s" >> $S
done
cat $S; grep -E "TFLOP|WRONG|rror" $OUT/fp8.log | sed 's/consumers=3,stages=3,order=none,scheduler=dynamic,epilogue=direct,load_warps=1,producer_regs=24,consumer_regs=160,swizzle_q=64,swizzle_k=64,rescale=lazy/C3LAZY/'
