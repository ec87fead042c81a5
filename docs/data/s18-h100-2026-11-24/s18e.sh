#!/usr/bin/env bash
# Session 18 H100 call e: the D1 tune's winner (V^T in the kernel, 2 stages, 32-register producer)
# and its 3-stage neighbour against the shipped records (dispatched: pre-pass, 3 stages, 24
# registers), and the spec default in both modes; bench_fp8, 9 interleaved rounds, D1 and D3.
export PYTHONUNBUFFERED=1 MLAGEN_OUT_DIR=/tmp/mlo PYTHONPATH=$PWD
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
R=consumers=3,order=none,block_n=96,swizzle_v=32,load_warps=1,consumer_regs=160,rescale=lazy,pv_wait=late,epilogue=direct,diagonal=half,producer_regs=32
timeout 400 python3 -m mlagen.bench_fp8 --shapes D1,D3 --rounds 9 --iters 10 \
  --variant $R,stages=2,v_transpose=kernel --variant $R,stages=3,v_transpose=kernel \
  --variant v_transpose=kernel --variant v_transpose=prepass > $OUT/e-bench-fp8.log 2>&1; echo "bench rc=$?"
grep -v ": ok;" $OUT/e-bench-fp8.log | sed 's/consumers=3,order=none,block_n=96,swizzle_v=32,load_warps=1,consumer_regs=160,rescale=lazy,pv_wait=late,epilogue=direct,diagonal=half,producer_regs=32,/R,/' | tail -14
grep -c ": ok;" $OUT/e-bench-fp8.log
