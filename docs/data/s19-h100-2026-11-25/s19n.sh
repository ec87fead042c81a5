#!/usr/bin/env bash
# Session 19 H100 call n: FP8 dense out with V's channels biased (vbias.py).
export PYTHONUNBUFFERED=1 MLAGEN_OUT_DIR=/tmp/mlo PYTHONPATH=$PWD
timeout 200 python3 docs/data/s19-h100-2026-11-25/vbias.py 2>&1 | grep -v "^ *warn" | tee $OUT/n-vbias.log
