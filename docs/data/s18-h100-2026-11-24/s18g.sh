#!/usr/bin/env bash
# Session 18 H100 call g: call f's candidates with bench_fp8 reversing its order every other round
# (in calls c, e, f the dispatched FP8 block, always right after the bf16 one, measured 3.38-3.45 ms on
# D1 against 2.90-2.96 for the same record forced later in the round), D1 and D3.
export PYTHONUNBUFFERED=1 MLAGEN_OUT_DIR=/tmp/mlo PYTHONPATH=$PWD
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
R=consumers=3,order=none,block_n=96,swizzle_v=32,load_warps=1,consumer_regs=160,rescale=lazy,pv_wait=late,epilogue=direct,diagonal=half
timeout 400 python3 -m mlagen.bench_fp8 --shapes D1,D3 --rounds 9 --iters 10 \
  --variant $R,producer_regs=32,stages=2,v_transpose=kernel --variant $R,producer_regs=24,stages=3,v_transpose=prepass \
  --variant $R,producer_regs=32,stages=3,v_transpose=kernel --variant $R,producer_regs=32,stages=3,v_transpose=prepass \
  > $OUT/g-bench-fp8.log 2>&1; echo "bench rc=$?"
grep -v ": ok;" $OUT/g-bench-fp8.log | sed 's/consumers=3,order=none,block_n=96,swizzle_v=32,load_warps=1,consumer_regs=160,rescale=lazy,pv_wait=late,epilogue=direct,diagonal=half,/R,/' | tail -14
grep -c ": ok;" $OUT/g-bench-fp8.log
