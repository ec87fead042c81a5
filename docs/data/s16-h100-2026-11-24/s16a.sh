#!/usr/bin/env bash
# Session 16 H100 call a: launch plans. GPU tests of the plans, the ops and the sparse matrix; host time per call
# with plans on and off (no peers built in this call).
export PYTHONUNBUFFERED=1 MLAGEN_OUT_DIR=/tmp/mlo PYTHONPATH=$PWD
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
timeout 330 python3 -m pytest -q tests/gpu/test_plans_gpu.py tests/gpu/test_op_gpu.py tests/gpu/test_sparse_gpu.py > $OUT/a-tests.log 2>&1; echo "tests rc=$?"
grep -E "passed|failed|Error|error" $OUT/a-tests.log | tail -25
timeout 200 python3 docs/data/s16-h100-2026-11-24/hostplans.py > $OUT/a-host.log 2>&1; echo "host rc=$?"
head -120 $OUT/a-host.log
