#!/usr/bin/env bash
# Session 18 H100 call r: the full tunes' winners (call q) forced beside the shipped records (dispatched):
# W2 = the D1 record's schedule (V^T in the kernel, 2 stages; D3's tune winner), W3 = D1's tune winner
# (two load warps, 3 stages). bench_fp8, 9 rounds in alternating order, D1 and D3.
export PYTHONUNBUFFERED=1 MLAGEN_OUT_DIR=/tmp/mlo PYTHONPATH=$PWD
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
R=consumers=3,order=none,block_n=96,swizzle_v=32,consumer_regs=160,rescale=lazy,epilogue=direct,pv_wait=late,diagonal=half,producer_regs=32,v_transpose=kernel
timeout 200 python3 -m mlagen.bench_fp8 --shapes D1,D3 --rounds 9 --iters 10 \
  --variant $R,load_warps=1,stages=2 --variant $R,load_warps=2,stages=3 > $OUT/r-bench-fp8.log 2>&1; echo "bench rc=$?"
grep -v ": ok;" $OUT/r-bench-fp8.log | sed 's/consumers=3,order=none,block_n=96,swizzle_v=32,consumer_regs=160,rescale=lazy,epilogue=direct,pv_wait=late,diagonal=half,producer_regs=32,v_transpose=kernel,/R,/' | tail -10
