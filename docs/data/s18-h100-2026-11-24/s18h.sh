#!/usr/bin/env bash
# Session 18 H100 call h: the whole GPU suite on the final tree (records restamped, the D1 FP8 record
# now V^T in the kernel), then bench_fp8 on D1 / D3 as users call it (dispatched), with the
# previous D1 record and the spec default in both modes forced beside it.
export PYTHONUNBUFFERED=1 MLAGEN_OUT_DIR=/tmp/mlo PYTHONPATH=$PWD
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
timeout 420 python3 -m pytest -q -p no:cacheprovider tests/gpu > $OUT/h-gpu-tests.log 2>&1; echo "gpu tests rc=$?"
grep -E "passed|failed|^FAILED|^ERROR" $OUT/h-gpu-tests.log | tail -15
R=consumers=3,order=none,block_n=96,swizzle_v=32,load_warps=1,consumer_regs=160,rescale=lazy,pv_wait=late,epilogue=direct,diagonal=half
timeout 150 python3 -m mlagen.bench_fp8 --shapes D1,D3 --rounds 9 --iters 10 \
  --variant $R,producer_regs=24,stages=3,v_transpose=prepass --variant v_transpose=kernel --variant v_transpose=prepass \
  > $OUT/h-bench-fp8.log 2>&1; echo "bench rc=$?"
sed 's/consumers=3,order=none,block_n=96,swizzle_v=32,load_warps=1,consumer_regs=160,rescale=lazy,pv_wait=late,epilogue=direct,diagonal=half,/R,/' $OUT/h-bench-fp8.log | tail -18
