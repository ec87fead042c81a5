#!/usr/bin/env bash
# Session 16 H100 call o: the sparse table on the final tree (no sparse kernel changed; launch plans in the host table).
export PYTHONUNBUFFERED=1 MLAGEN_OUT_DIR=/tmp/mlo PYTHONPATH=$PWD
env -u OUT bash shared/peers/flashmla/run_remote.sh > $OUT/o-flashmla-build.log 2>&1; echo "flashmla rc=$?"
timeout 480 python3 -m mlagen.cli bench --shapes S1,S2,S3,S4,S5,S6 --peers flashmla,mlagen --rounds 3 \
  --markdown $OUT/o-bench.md > $OUT/o-bench.log 2>&1; echo "bench rc=$?"
grep -E "^\| S|^\| shape" $OUT/o-bench.md | head -20
