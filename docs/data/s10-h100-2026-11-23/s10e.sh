#!/usr/bin/env bash
# Session 10 H100 call 5: the committed producer with only the bf16-factor path added (working tree)
# against the committed producer (HEAD): tests first, then S1 in both scale formats.
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 MLAGEN_OUT_DIR=/tmp/mlo
T0=$(date +%s); S=$OUT/summary.txt
el() { echo $(( $(date +%s)-T0 )); }
H=templates/include/mlagen/sm90/sparse_kv_fp8.cuh
[ -f shared/peers/flashmla/build/flashmla_sparse_sm90_C.so ] || (env -u OUT bash shared/peers/flashmla/run_remote.sh > /tmp/flashmla.log 2>&1; echo "flashmla build rc=$? $(el)s" >> $S)
timeout 200 python3 -m pytest -q tests/gpu/test_sparse_fp8_gpu.py -p no:cacheprovider > $OUT/fp8-tests.log 2>&1
echo "fp8 tests rc=$? $(el)s $(tail -n 1 $OUT/fp8-tests.log)" >> $S
run() { timeout 100 python3 -m mlagen.bench_sparse bench-fp8 --shapes S1,S3 --scales $2 --rounds 2 > $OUT/bench-fp8-$1.log 2>&1
        echo "$1 rc=$? $(el)s"; grep -E '^\| S' $OUT/bench-fp8-$1.log; } >> $S
run factor ue8m0,fp32
git show HEAD:$H > $H; run head ue8m0
cat $S
