#!/usr/bin/env bash
# Session 20 H100 call d: the whole GPU suite on the final kernels and records (FP8 dense records with
# two-level accumulation, o_flush 4, the copy in shared memory), then the sparse fp8 mode on V with a
# channel mean (sbias.py).
export PYTHONUNBUFFERED=1 MLAGEN_OUT_DIR=/tmp/mlo PYTHONPATH=$PWD
D=docs/data/s20-h100-2026-11-25
timeout 470 python3 -m pytest -q -p no:cacheprovider tests/gpu -rxXs > $OUT/d-gpu-tests.log 2>&1; echo "gpu tests rc=$?"
tail -12 $OUT/d-gpu-tests.log
timeout 90 python3 $D/sbias.py 2>&1 | grep -v "^ *warn" | tee $OUT/d-sbias.log
