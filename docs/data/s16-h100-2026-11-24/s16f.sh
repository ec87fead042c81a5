#!/usr/bin/env bash
# Session 16 H100 call f: the dense tile counters as a ring (no memset per launch); GPU tests of the dense kernels,
# plans and ops; host time per call (peers built) and its parts.
export PYTHONUNBUFFERED=1 MLAGEN_OUT_DIR=/tmp/mlo PYTHONPATH=$PWD
( env -u OUT python3 shared/peers/fa3/build_fa3.py --build-dir shared/peers/fa3/build > $OUT/f-fa3-build.log 2>&1; echo "fa3 build rc=$?" >> $OUT/f-fa3-build.log
  env -u OUT bash shared/peers/flashmla/run_remote.sh > $OUT/f-flashmla-build.log 2>&1; echo "flashmla rc=$?" >> $OUT/f-flashmla-build.log ) &
timeout 400 python3 -m pytest -q tests/gpu/test_plans_gpu.py tests/gpu/test_op_gpu.py tests/gpu/test_mla_prefill_gpu.py > $OUT/f-tests.log 2>&1; echo "tests rc=$?"
grep -E "passed|failed|Error|error" $OUT/f-tests.log | tail -25
wait
tail -n 1 $OUT/f-fa3-build.log; tail -n 1 $OUT/f-flashmla-build.log
timeout 100 python3 docs/data/s16-h100-2026-11-24/hostparts.py > $OUT/f-hostparts.log 2>&1; echo "parts rc=$?"; cat $OUT/f-hostparts.log
timeout 150 python3 docs/data/s16-h100-2026-11-24/hostplans.py > $OUT/f-host.log 2>&1; echo "host rc=$?"
head -14 $OUT/f-host.log
