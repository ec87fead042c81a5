#!/usr/bin/env bash
# Session 9 H100 call 8: sparse lazy running max: GPU tests, then S1-S6 against FlashMLA with the variant beside the default.
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 MLAGEN_OUT_DIR=/tmp/mlo
T0=$(date +%s); S=$OUT/summary.txt
el() { echo $(( $(date +%s)-T0 )); }
(env -u OUT nice bash shared/peers/flashmla/run_remote.sh > /tmp/flashmla.log 2>&1; echo "flashmla build rc=$? $(el)s" >> $S) &
timeout 250 python3 -m pytest -q tests/gpu/test_sparse_gpu.py -k "lazy or rising or matches_reference" -p no:cacheprovider > $OUT/sparse-tests.log 2>&1
echo "tests rc=$? $(el)s" >> $S
wait
timeout 250 python3 -m mlagen.bench_sparse bench --shapes S1,S2,S3,S4,S5,S6 --peers flashmla,mlagen --rounds 5 --iters 30 --variant softmax_max=lazy > $OUT/bench-sparse.log 2>&1
echo "bench rc=$? $(el)s" >> $S
cat $S; tail -4 $OUT/sparse-tests.log; grep -E "^\| S|TFLOP|x " $OUT/bench-sparse.log | head -40
