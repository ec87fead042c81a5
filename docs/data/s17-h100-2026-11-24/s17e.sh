#!/usr/bin/env bash
# Session 17 H100 call e: the whole GPU test suite on the final tree.
export PYTHONUNBUFFERED=1 MLAGEN_OUT_DIR=/tmp/mlo PYTHONPATH=$PWD
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
timeout 575 python3 -m pytest -q -p no:cacheprovider tests/gpu > $OUT/e-gpu-tests.log 2>&1; echo "gpu tests rc=$?"
grep -E "passed|failed|^FAILED|^ERROR" $OUT/e-gpu-tests.log | tail -15
