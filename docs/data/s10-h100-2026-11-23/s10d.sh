#!/usr/bin/env bash
# Session 10 H100 call 4: prefetch schemes did not matter (call 3). The committed producer (HEAD) against
# the rewrite with its row loop unrolled (ROLL=0) or rolled (ROLL=1): code size, not issue?
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 MLAGEN_OUT_DIR=/tmp/mlo
T0=$(date +%s); S=$OUT/summary.txt
el() { echo $(( $(date +%s)-T0 )); }
H=templates/include/mlagen/sm90/sparse_kv_fp8.cuh
cp $H /tmp/new.cuh
run() { timeout 100 python3 -m mlagen.bench_sparse bench-fp8 --shapes S1 --scales ue8m0 --rounds 2 > $OUT/bench-fp8-$1.log 2>&1
        echo "$1 rc=$? $(el)s $(grep -E '^\| S1' $OUT/bench-fp8-$1.log)" >> $S; }
git show HEAD:$H > $H; run head
for cfg in "1 0" "1 1" "3 1" "4 1"; do set -- $cfg
  cp /tmp/new.cuh $H
  sed -i "s/^#define MLAGEN_FP8_PREFETCH .*/#define MLAGEN_FP8_PREFETCH $1/; s/^#define MLAGEN_FP8_ROLL .*/#define MLAGEN_FP8_ROLL $2/" $H
  run "pf$1-roll$2"
done
cat $S
