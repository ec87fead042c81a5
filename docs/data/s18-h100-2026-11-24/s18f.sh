#!/usr/bin/env bash
# Session 18 H100 call f: call e's candidates with the shipped D1 record forced in the middle of
# each round (the dispatched FP8 block always follows the bf16 one, which measured slower in calls c
# and e: 3.38-3.41 ms against 2.90 in call a), D1 and D3.
export PYTHONUNBUFFERED=1 MLAGEN_OUT_DIR=/tmp/mlo PYTHONPATH=$PWD
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
R=consumers=3,order=none,block_n=96,swizzle_v=32,load_warps=1,consumer_regs=160,rescale=lazy,pv_wait=late,epilogue=direct,diagonal=half
timeout 400 python3 -m mlagen.bench_fp8 --shapes D1,D3 --rounds 9 --iters 10 \
  --variant $R,producer_regs=32,stages=2,v_transpose=kernel --variant $R,producer_regs=24,stages=3,v_transpose=prepass \
  --variant $R,producer_regs=32,stages=3,v_transpose=kernel --variant $R,producer_regs=32,stages=3,v_transpose=prepass \
  > $OUT/f-bench-fp8.log 2>&1; echo "bench rc=$?"
grep -v ": ok;" $OUT/f-bench-fp8.log | sed 's/consumers=3,order=none,block_n=96,swizzle_v=32,load_warps=1,consumer_regs=160,rescale=lazy,pv_wait=late,epilogue=direct,diagonal=half,/R,/' | tail -14
grep -c ": ok;" $OUT/f-bench-fp8.log
