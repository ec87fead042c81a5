#!/usr/bin/env bash
# Session 15 H100 call m: dense FP8 / bf16 sustained at the power cap and spaced out (fp8power.py).
export PYTHONUNBUFFERED=1 MLAGEN_OUT_DIR=/tmp/mlo PYTHONPATH=$PWD
timeout 300 python3 docs/data/s15-h100-2026-11-24/fp8power.py 2>&1 | grep -v "^ *warn" | tee $OUT/m-fp8power.log
