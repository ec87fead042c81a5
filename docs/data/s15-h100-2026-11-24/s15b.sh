#!/usr/bin/env bash
# Session 15 H100 calls b-c: FlashMLA build, then S5 flushed vs back to back (b: flushwarm.py S5 sq=1024,... sq=12288,...; c: flushwarm2.py).
export PYTHONUNBUFFERED=1 MLAGEN_OUT_DIR=/tmp/mlo PYTHONPATH=$PWD
D=docs/data/s15-h100-2026-11-24
[ -f shared/peers/flashmla/build/flashmla_sparse_sm90_C.so ] || { env -u OUT bash shared/peers/flashmla/run_remote.sh > $OUT/flashmla-build.log 2>&1; echo "flashmla rc=$?"; }
timeout 400 python3 $D/flushwarm2.py S5 2>&1 | grep -v "^ *warn" | tee $OUT/flushwarm2.log
