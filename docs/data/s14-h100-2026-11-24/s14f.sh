#!/usr/bin/env bash
# Session 14 H100 call f: the bf16 compute mode with two producer warpgroups (bf16mode14.py).
export PYTHONUNBUFFERED=1 MLAGEN_OUT_DIR=/tmp/mlo PYTHONPATH=$PWD
timeout 300 python3 docs/data/s14-h100-2026-11-24/bf16mode14.py > $OUT/bf16mode.log 2>&1; echo "rc=$?"
grep -v "^ *warn" $OUT/bf16mode.log | tail -n 30
