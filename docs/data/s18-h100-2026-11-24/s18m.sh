#!/usr/bin/env bash
# Session 18 H100 call m: FlashAttention-3's FP8 forward (which also transposes V in shared memory)
# beside ours on the final tree: bench_fp8 --fa3-fp8 on D1 / D3, the records dispatched, the D3
# record's schedule with V^T in the kernel forced.
export PYTHONUNBUFFERED=1 MLAGEN_OUT_DIR=/tmp/mlo PYTHONPATH=$PWD
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
python3 tools/fa3_fp8/build.py --no-copy-out > $OUT/m-fa3fp8-build.log 2>&1; echo "fa3 fp8 build rc=$?"
tail -3 $OUT/m-fa3fp8-build.log
R=consumers=3,order=none,block_n=96,swizzle_v=32,load_warps=1,consumer_regs=160,rescale=lazy,epilogue=direct,pv_wait=early,diagonal=full,producer_regs=32,stages=3,v_transpose=kernel
timeout 120 python3 -m mlagen.bench_fp8 --shapes D1,D3 --rounds 7 --iters 10 --fa3-fp8 --variant $R > $OUT/m-bench-fp8.log 2>&1; echo "bench rc=$?"
tail -14 $OUT/m-bench-fp8.log
