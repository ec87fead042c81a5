#!/usr/bin/env bash
# Session 19 H100 call i: the softmax change against the session's starting kernels (bfc042f, installed
# as _base specs in the device's copy only), 20 rounds, bf16 and FP8 records on D3 and D1.
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
timeout 400 python3 docs/data/s19-h100-2026-11-25/ab19.py D3,D1 20 2>&1 | grep -v "^ *warn" | tee $OUT/i-ab.log
