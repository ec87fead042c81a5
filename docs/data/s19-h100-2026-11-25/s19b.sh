#!/usr/bin/env bash
# Session 19 H100 call b: MUFU.EX2 next to the FP8 / bf16 packs (pipes.py).
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
timeout 120 python3 docs/data/s19-h100-2026-11-25/pipes.py 2>&1 | grep -v "^ *warn" | tee $OUT/b-pipes.log
