#!/usr/bin/env bash
# Session 18 H100 call b: is the in-kernel V^T's cost latency (more stages hide it) or shared-memory
# traffic? The D1 record's schedule at 32 producer registers, 3 and 4 stages, V^T by the kernel and
# by the pre-pass, interleaved in one process (bench_fp8), D1 and D3.
export PYTHONUNBUFFERED=1 MLAGEN_OUT_DIR=/tmp/mlo PYTHONPATH=$PWD
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
R=consumers=3,order=none,block_n=96,swizzle_v=32,load_warps=1,consumer_regs=160,rescale=lazy,pv_wait=late,epilogue=direct,diagonal=half,producer_regs=32
timeout 300 python3 -m mlagen.bench_fp8 --shapes D1,D3 --rounds 7 --iters 10 \
  --variant $R,stages=3,v_transpose=kernel --variant $R,stages=3,v_transpose=prepass \
  --variant $R,stages=4,v_transpose=kernel --variant $R,stages=4,v_transpose=prepass > $OUT/b-bench-fp8.log 2>&1; echo "bench rc=$?"
grep -v ": ok;" $OUT/b-bench-fp8.log | sed 's/consumers=3,order=none,block_n=96,swizzle_v=32,load_warps=1,consumer_regs=160,rescale=lazy,pv_wait=late,epilogue=direct,diagonal=half,producer_regs=32,/R,/' | tail -14
grep -c ": ok;" $OUT/b-bench-fp8.log
