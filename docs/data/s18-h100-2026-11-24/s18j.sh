#!/usr/bin/env bash
# Session 18 H100 call j: the review's changes (transposer loads one unit ahead, V^T released inside
# the CTA, no transposes of tiles a CTA only releases) against the committed kernel (100b250's, as
# mla_prefill_sm90_fp8_base, installed on this machine before the call), then the FP8 GPU tests.
export PYTHONUNBUFFERED=1 MLAGEN_OUT_DIR=/tmp/mlo PYTHONPATH=$PWD
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
timeout 200 python3 docs/data/s18-h100-2026-11-24/ab18.py D1,D3 8 > $OUT/j-ab.log 2>&1; echo "ab rc=$?"
cat $OUT/j-ab.log
timeout 300 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_fp8_gpu.py "tests/gpu/test_plans_gpu.py::test_dense_plans_match_the_full_path" > $OUT/j-tests.log 2>&1; echo "tests rc=$?"
grep -E "passed|failed|^FAILED|^ERROR" $OUT/j-tests.log | tail -15
