#!/usr/bin/env bash
# Session 16 H100 call b: launch plans, second version (the dense public call looks for its plan before its
# checks; knobs read from os.environ's mapping). Peers built (FA3, FlashMLA) for the host-time comparison;
# GPU tests of the plans, the ops and the dense kernels; host time per call with plans on and off.
export PYTHONUNBUFFERED=1 MLAGEN_OUT_DIR=/tmp/mlo PYTHONPATH=$PWD
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
( env -u OUT python3 shared/peers/fa3/build_fa3.py --build-dir shared/peers/fa3/build > $OUT/b-fa3-build.log 2>&1; echo "fa3 build rc=$?" >> $OUT/b-fa3-build.log
  env -u OUT bash shared/peers/flashmla/run_remote.sh > $OUT/b-flashmla-build.log 2>&1; echo "flashmla rc=$?" >> $OUT/b-flashmla-build.log ) &
timeout 400 python3 -m pytest -q tests/gpu/test_plans_gpu.py tests/gpu/test_op_gpu.py tests/gpu/test_mla_prefill_gpu.py > $OUT/b-tests.log 2>&1; echo "tests rc=$?"
grep -E "passed|failed|Error|error" $OUT/b-tests.log | tail -25
wait
tail -2 $OUT/b-fa3-build.log $OUT/b-flashmla-build.log
timeout 200 python3 docs/data/s16-h100-2026-11-24/hostplans.py > $OUT/b-host.log 2>&1; echo "host rc=$?"
head -14 $OUT/b-host.log
