#!/usr/bin/env bash
# Session 16 H100 call c: launch plans for the FP8 dense launcher too (the V^T pre-pass in the plan). Peers built;
# the GPU tests of everything the change touches (plans, FP8 dense, ops, FP8 caches, bench, tune); host time.
export PYTHONUNBUFFERED=1 MLAGEN_OUT_DIR=/tmp/mlo PYTHONPATH=$PWD
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
( env -u OUT python3 shared/peers/fa3/build_fa3.py --build-dir shared/peers/fa3/build > $OUT/c-fa3-build.log 2>&1; echo "fa3 build rc=$?" >> $OUT/c-fa3-build.log
  env -u OUT bash shared/peers/flashmla/run_remote.sh > $OUT/c-flashmla-build.log 2>&1; echo "flashmla rc=$?" >> $OUT/c-flashmla-build.log ) &
timeout 400 python3 -m pytest -q tests/gpu/test_plans_gpu.py tests/gpu/test_fp8_gpu.py tests/gpu/test_op_gpu.py \
  tests/gpu/test_sparse_fp8_gpu.py tests/gpu/test_sparse_fp8_compute_gpu.py tests/gpu/test_bench_sparse_gpu.py \
  tests/gpu/test_tune_gpu.py > $OUT/c-tests.log 2>&1; echo "tests rc=$?"
grep -E "passed|failed|Error|error" $OUT/c-tests.log | tail -25
wait
tail -n 2 $OUT/c-fa3-build.log; tail -n 2 $OUT/c-flashmla-build.log
timeout 150 python3 docs/data/s16-h100-2026-11-24/hostplans.py > $OUT/c-host.log 2>&1; echo "host rc=$?"
head -14 $OUT/c-host.log
