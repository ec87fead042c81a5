#!/usr/bin/env bash
# Session 15 H100 calls f-g: which copy path loses after an idle GPU (f: idlepath.py); the bare gather with the H16 ring shapes (g: ringgather.py); with shared-memory reads (i: smemgather.py).
export PYTHONUNBUFFERED=1 MLAGEN_OUT_DIR=/tmp/mlo PYTHONPATH=$PWD
D=docs/data/s15-h100-2026-11-24
timeout 300 python3 $D/smemgather.py 2>&1 | grep -v "^ *warn" | tee $OUT/i-smemgather.log
