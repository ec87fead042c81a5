#!/usr/bin/env bash
# Session 18 H100 call a: V^T made by the FP8 dense kernel's producer (v_transpose: kernel).
# The FP8 GPU tests (both modes, bit equality kernel vs pre-pass), the dense plan tests, then
# bench_fp8 on D1 / D3: the shipped records (pre-pass, 24-register producer) against the D1
# record's schedule with V^T in the kernel (32-register producer), the same with the pre-pass at 32
# registers, and the spec default (V^T in the kernel).
export PYTHONUNBUFFERED=1 MLAGEN_OUT_DIR=/tmp/mlo PYTHONPATH=$PWD
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
timeout 300 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_fp8_gpu.py "tests/gpu/test_plans_gpu.py::test_dense_plans_match_the_full_path" > $OUT/a-tests.log 2>&1; echo "tests rc=$?"
grep -E "passed|failed|^FAILED|^ERROR" $OUT/a-tests.log | tail -15
R=consumers=3,order=none,block_n=96,swizzle_v=32,load_warps=1,consumer_regs=160,rescale=lazy,pv_wait=late,epilogue=direct,diagonal=half,stages=3
timeout 240 python3 -m mlagen.bench_fp8 --shapes D1,D3 --rounds 5 --iters 10 \
  --variant $R,producer_regs=32,v_transpose=kernel --variant $R,producer_regs=32,v_transpose=prepass \
  --variant v_transpose=kernel > $OUT/a-bench-fp8.log 2>&1; echo "bench rc=$?"
cat $OUT/a-bench-fp8.log | tail -20
