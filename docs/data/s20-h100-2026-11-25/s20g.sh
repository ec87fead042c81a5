#!/usr/bin/env bash
# Session 20 H100 call g: the whole GPU suite on the final tree (the spec's 384-key flush bound, the
# test schedules changed with it, the tuner changes).
export PYTHONUNBUFFERED=1 MLAGEN_OUT_DIR=/tmp/mlo PYTHONPATH=$PWD
timeout 560 python3 -m pytest -q -p no:cacheprovider tests/gpu -rxXs > $OUT/g-gpu-tests.log 2>&1; echo "gpu tests rc=$?"
tail -9 $OUT/g-gpu-tests.log
