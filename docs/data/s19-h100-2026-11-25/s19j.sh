#!/usr/bin/env bash
# Session 19 H100 call j: the whole GPU suite on the final kernels (online_softmax's lazy check, 1d1b34d).
export PYTHONUNBUFFERED=1 MLAGEN_OUT_DIR=/tmp/mlo PYTHONPATH=$PWD
git log --oneline -1
timeout 560 python3 -m pytest -q -p no:cacheprovider tests/gpu > $OUT/j-gpu-tests.log 2>&1; echo "gpu tests rc=$?"
grep -E "passed|failed|^FAILED|^ERROR" $OUT/j-gpu-tests.log | tail -15
