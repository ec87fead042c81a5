#!/usr/bin/env bash
# Session 18 H100 call c: the in-kernel V^T with a raw V ring of its own (two slots, refilled as soon
# as the transposing warps have read a tile). The FP8 GPU tests, then bench_fp8 as in call b.
export PYTHONUNBUFFERED=1 MLAGEN_OUT_DIR=/tmp/mlo PYTHONPATH=$PWD
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
timeout 300 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_fp8_gpu.py "tests/gpu/test_plans_gpu.py::test_dense_plans_match_the_full_path" > $OUT/c-tests.log 2>&1; echo "tests rc=$?"
grep -E "passed|failed|^FAILED|^ERROR" $OUT/c-tests.log | tail -15
R=consumers=3,order=none,block_n=96,swizzle_v=32,load_warps=1,consumer_regs=160,rescale=lazy,pv_wait=late,epilogue=direct,diagonal=half,producer_regs=32
timeout 240 python3 -m mlagen.bench_fp8 --shapes D1,D3 --rounds 7 --iters 10 \
  --variant $R,stages=3,v_transpose=kernel --variant $R,stages=3,v_transpose=prepass \
  --variant $R,stages=4,v_transpose=kernel --variant $R,stages=4,v_transpose=prepass > $OUT/c-bench-fp8.log 2>&1; echo "bench rc=$?"
grep -v ": ok;" $OUT/c-bench-fp8.log | sed 's/consumers=3,order=none,block_n=96,swizzle_v=32,load_warps=1,consumer_regs=160,rescale=lazy,pv_wait=late,epilogue=direct,diagonal=half,producer_regs=32,/R,/' | tail -14
grep -c ": ok;" $OUT/c-bench-fp8.log
