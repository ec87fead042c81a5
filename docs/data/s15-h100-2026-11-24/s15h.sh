#!/usr/bin/env bash
# Session 15 H100 call h: split slot fills in the H <= 16 kernel: GPU tests of its schedule options, then
# the A/B (h16ab.py) against the default and FlashMLA padded.
export PYTHONUNBUFFERED=1 MLAGEN_OUT_DIR=/tmp/mlo PYTHONPATH=$PWD
D=docs/data/s15-h100-2026-11-24
[ -f shared/peers/flashmla/build/flashmla_sparse_sm90_C.so ] || { env -u OUT bash shared/peers/flashmla/run_remote.sh > $OUT/flashmla-build.log 2>&1; echo "flashmla rc=$?"; }
timeout 240 python3 -m pytest -q -x tests/gpu/test_sparse_gpu.py -k "h16" > $OUT/h-tests.log 2>&1; echo "tests rc=$?"; tail -3 $OUT/h-tests.log
timeout 300 python3 $D/h16ab.py 2>&1 | grep -v "^ *warn" | tee $OUT/h-ab.log
