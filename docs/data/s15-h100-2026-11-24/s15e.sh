#!/usr/bin/env bash
# Session 15 H100 call e: S5 after an idle GPU, a spin, GEMMs or the same call, with SM clocks sampled.
export PYTHONUNBUFFERED=1 MLAGEN_OUT_DIR=/tmp/mlo PYTHONPATH=$PWD
D=docs/data/s15-h100-2026-11-24
[ -f shared/peers/flashmla/build/flashmla_sparse_sm90_C.so ] || { env -u OUT bash shared/peers/flashmla/run_remote.sh > $OUT/flashmla-build.log 2>&1; echo "flashmla rc=$?"; }
timeout 300 python3 $D/idleclock.py 2>&1 | grep -v "^ *warn" | tee $OUT/e-idleclock.log
