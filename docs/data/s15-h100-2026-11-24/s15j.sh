#!/usr/bin/env bash
# Session 15 H100 call j: the sparse family's bench as a user runs it (S1-S6 against FlashMLA), today's
# machine, no kernel changed since session 14.
export PYTHONUNBUFFERED=1 MLAGEN_OUT_DIR=/tmp/mlo PYTHONPATH=$PWD
[ -f shared/peers/flashmla/build/flashmla_sparse_sm90_C.so ] || { env -u OUT bash shared/peers/flashmla/run_remote.sh > $OUT/flashmla-build.log 2>&1; echo "flashmla rc=$?"; }
timeout 500 python3 -m mlagen.cli bench --shapes S1,S2,S3,S4,S5,S6 --peers flashmla,mlagen --rounds 5 --iters 20 --markdown $OUT/j-bench-sparse.md > $OUT/j-bench-sparse.log 2>&1; echo "bench rc=$?"
grep -v "^ *warn" $OUT/j-bench-sparse.log | tail -30
