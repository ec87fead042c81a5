#!/usr/bin/env bash
# Session 20 H100 call a: the FP8 GPU tests on branch fp8-two-level (o_flush, o_copy), then the price and
# the bias of two-level accumulation against the records (abvar2.py; spilling variants allowed to measure).
export PYTHONUNBUFFERED=1 MLAGEN_OUT_DIR=/tmp/mlo PYTHONPATH=$PWD
D=docs/data/s20-h100-2026-11-25
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
. $D/variants_a.sh
timeout 280 python3 $D/abvar2.py mla_prefill_sm90_fp8 D3,D1 5 $V --allow-spills 2>&1 | grep -v "^ *warn" | tee $OUT/a-abvar2.log
timeout 250 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_fp8_gpu.py -rxXs 2>&1 | tail -25 | tee $OUT/a-tests.log
