#!/usr/bin/env bash
# Session 10 H100 call 3: the rewritten FP8 producer ran at 0.43x the bf16 kernel (was 0.56x): which
# L1 prefetch scheme? Each build edits MLAGEN_FP8_PREFETCH's default in the header (device copy only).
# 0: ahead + rope, 1: ahead, 2: ahead, two lines per row (the old scheme), 3: the step's own rows just
# before it, 4: none.
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 MLAGEN_OUT_DIR=/tmp/mlo
T0=$(date +%s); S=$OUT/summary.txt
el() { echo $(( $(date +%s)-T0 )); }
H=templates/include/mlagen/sm90/sparse_kv_fp8.cuh
[ -f shared/peers/flashmla/build/flashmla_sparse_sm90_C.so ] && echo "flashmla build kept" >> $S
for V in 3 1 2 4 0; do
  sed -i "s/^#define MLAGEN_FP8_PREFETCH .*/#define MLAGEN_FP8_PREFETCH $V/" $H
  timeout 100 python3 -m mlagen.bench_sparse bench-fp8 --shapes S1 --scales ue8m0 --rounds 2 > $OUT/bench-fp8-v$V.log 2>&1
  echo "V=$V rc=$? $(el)s $(grep -E '^\| S1' $OUT/bench-fp8-v$V.log)" >> $S
done
cat $S
