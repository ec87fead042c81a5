#!/usr/bin/env bash
# Session 10 H100 call 7: the committed FP8 producer with every load of a step issued before its
# conversions (LOADS_FIRST=1) against as committed (0), with and without the L1 prefetch; the FP8
# tests on LOADS_FIRST=1.
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 MLAGEN_OUT_DIR=/tmp/mlo
T0=$(date +%s); S=$OUT/summary.txt
el() { echo $(( $(date +%s)-T0 )); }
H=templates/include/mlagen/sm90/sparse_kv_fp8.cuh
[ -f shared/peers/flashmla/build/flashmla_sparse_sm90_C.so ] || (env -u OUT nice bash shared/peers/flashmla/run_remote.sh > /tmp/flashmla.log 2>&1; echo "flashmla build rc=$? $(el)s" >> $S) &
timeout 200 python3 -m pytest -q tests/gpu/test_sparse_fp8_gpu.py -p no:cacheprovider > $OUT/fp8-tests.log 2>&1
echo "fp8 tests (loads first) rc=$? $(el)s $(tail -n 1 $OUT/fp8-tests.log)" >> $S
wait
cp $H /tmp/h.cuh
for cfg in "1 1" "0 1" "1 0" "0 0"; do set -- $cfg
  cp /tmp/h.cuh $H
  sed -i "s/^#define MLAGEN_FP8_LOADS_FIRST .*/#define MLAGEN_FP8_LOADS_FIRST $1/; s/^#define MLAGEN_FP8_PREFETCH .*/#define MLAGEN_FP8_PREFETCH $2/" $H
  timeout 100 python3 -m mlagen.bench_sparse bench-fp8 --shapes S1,S3 --scales ue8m0 --rounds 2 > $OUT/bench-lf$1-pf$2.log 2>&1
  { echo "loads_first=$1 prefetch=$2 rc=$? $(el)s"; grep -E '^\| S' $OUT/bench-lf$1-pf$2.log; } >> $S
done
cat $S
