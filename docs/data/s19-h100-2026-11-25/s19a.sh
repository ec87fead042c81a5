#!/usr/bin/env bash
# Session 19 H100 call a: S5's rows gathered into registers (reggather.py) beside the fifteenth session's
# shared-memory gather with 0-3 read passes (smemgather.py) as the same-call reference.
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
nvidia-smi --query-gpu=name,driver_version,clocks.sm,power.draw --format=csv | tee $OUT/a-gpu.txt
timeout 250 python3 docs/data/s19-h100-2026-11-25/reggather.py 2>&1 | grep -v "^ *warn" | tee $OUT/a-reggather.log
timeout 150 python3 docs/data/s15-h100-2026-11-24/smemgather.py 2>&1 | grep -v "^ *warn" | tee $OUT/a-smemgather.log
