#!/usr/bin/env bash
# Session 10 H100 call 22: the sparse call's checks without per-call format objects and error text
# (host only): sparse and FP8 GPU tests, the host time by step.
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 MLAGEN_OUT_DIR=/tmp/mlo
T0=$(date +%s); S=$OUT/summary.txt
el() { echo $(( $(date +%s)-T0 )); }
timeout 200 python3 -m pytest -q tests/gpu/test_sparse_gpu.py tests/gpu/test_sparse_fp8_gpu.py tests/gpu/test_op_gpu.py -p no:cacheprovider > $OUT/tests.log 2>&1
echo "tests rc=$? $(el)s $(tail -n 1 $OUT/tests.log)" >> $S
timeout 60 python3 .carry/prof/hostprof10.py S1 S6 2>&1 | grep -E "^S[0-9]" > $OUT/host.log
cat $S; cat $OUT/host.log
