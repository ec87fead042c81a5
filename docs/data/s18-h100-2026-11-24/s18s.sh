#!/usr/bin/env bash
# Session 18 H100 call s: the final records (D3 now the full tune's winner, V^T in the kernel): the FP8 and
# plan GPU tests, then bench_fp8 as users call it with the previous D3 record forced beside it.
export PYTHONUNBUFFERED=1 MLAGEN_OUT_DIR=/tmp/mlo PYTHONPATH=$PWD
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
timeout 300 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_fp8_gpu.py tests/gpu/test_plans_gpu.py > $OUT/s-tests.log 2>&1; echo "tests rc=$?"
grep -E "passed|failed|^FAILED|^ERROR" $OUT/s-tests.log | tail -8
P=consumers=3,order=none,block_n=96,swizzle_v=32,load_warps=1,consumer_regs=160,rescale=lazy,epilogue=direct,pv_wait=early,diagonal=full,producer_regs=24,stages=3,v_transpose=prepass
timeout 150 python3 -m mlagen.bench_fp8 --shapes D1,D3 --rounds 9 --iters 10 --variant $P > $OUT/s-bench-fp8.log 2>&1; echo "bench rc=$?"
grep -v ": ok;" $OUT/s-bench-fp8.log | sed 's/consumers=3,order=none,block_n=96,swizzle_v=32,load_warps=1,consumer_regs=160,rescale=lazy,epilogue=direct,pv_wait=early,diagonal=full,producer_regs=24,stages=3,v_transpose=prepass/old D3 record/' | tail -8
