#!/usr/bin/env bash
# Session 19 H100 call o: vbias.py with FlashAttention-3's FP8 forward built in the same command beside ours.
export PYTHONUNBUFFERED=1 MLAGEN_OUT_DIR=/tmp/mlo PYTHONPATH=$PWD
python3 tools/fa3_fp8/build.py --no-copy-out > $OUT/o-fa3fp8-build.log 2>&1; echo "fa3 fp8 build rc=$?"
timeout 200 python3 docs/data/s19-h100-2026-11-25/vbias.py --fa3 2>&1 | grep -v "^ *warn" | tee $OUT/o-vbias.log
