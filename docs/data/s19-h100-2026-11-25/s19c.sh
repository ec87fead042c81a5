#!/usr/bin/env bash
# Session 19 H100 call c: writes into the peer CTA's shared memory in a 2-CTA cluster (dsmem.py).
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
timeout 120 python3 docs/data/s19-h100-2026-11-25/dsmem.py 2>&1 | grep -v "^ *warn" | tee $OUT/c-dsmem.log
