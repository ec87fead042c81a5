#!/usr/bin/env bash
# Session 15 H100 calls j-k: the sparse bench as a user runs it (j: mlagen bench --shapes S1,...,S6 --peers flashmla,mlagen --rounds 5 --iters 20); S5 cool / hot (k: s5heat.py), today's
# machine, no kernel changed since session 14.
export PYTHONUNBUFFERED=1 MLAGEN_OUT_DIR=/tmp/mlo PYTHONPATH=$PWD
[ -f shared/peers/flashmla/build/flashmla_sparse_sm90_C.so ] || { env -u OUT bash shared/peers/flashmla/run_remote.sh > $OUT/flashmla-build.log 2>&1; echo "flashmla rc=$?"; }
timeout 300 python3 docs/data/s15-h100-2026-11-24/s5heat.py 2>&1 | grep -v "^ *warn" | tee $OUT/k-s5heat.log
