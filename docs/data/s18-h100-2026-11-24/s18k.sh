#!/usr/bin/env bash
# Session 18 H100 call k: call j without the transposer's loads one unit ahead (V^T released inside
# the CTA and no transposes of tiles a CTA only releases kept) against the committed kernel (100b250's, as
# mla_prefill_sm90_fp8_base, installed on this machine before the call), then the FP8 GPU tests.
export PYTHONUNBUFFERED=1 MLAGEN_OUT_DIR=/tmp/mlo PYTHONPATH=$PWD
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
timeout 200 python3 docs/data/s18-h100-2026-11-24/ab18.py D1,D3 8 > $OUT/k-ab.log 2>&1; echo "ab rc=$?"
cat $OUT/k-ab.log
