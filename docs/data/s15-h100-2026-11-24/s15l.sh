#!/usr/bin/env bash
# Session 15 H100 call l: SM-bound and DRAM-bound kernels after an idle GPU (idlebound.py).
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
timeout 200 python3 docs/data/s15-h100-2026-11-24/idlebound.py 2>&1 | grep -v "^ *warn" | tee $OUT/l-idlebound.log
