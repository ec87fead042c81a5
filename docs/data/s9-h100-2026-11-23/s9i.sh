#!/usr/bin/env bash
# Session 9 H100 call 9: sparse lazy max as the default: every sparse GPU test, compute-sanitizer, the S table, FP8 cache.
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 MLAGEN_OUT_DIR=/tmp/mlo
T0=$(date +%s); S=$OUT/summary.txt
el() { echo $(( $(date +%s)-T0 )); }
[ -f shared/peers/flashmla/build/flashmla_sparse_sm90_C.so ] && echo "flashmla build kept" >> $S
[ -f shared/peers/flashmla/build/flashmla_sparse_sm90_C.so ] || (env -u OUT nice bash shared/peers/flashmla/run_remote.sh > /tmp/flashmla.log 2>&1; echo "flashmla build rc=$? $(el)s" >> $S) &
timeout 280 python3 -m pytest -q tests/gpu/test_sparse_gpu.py tests/gpu/test_sparse_fp8_gpu.py tests/gpu/test_bench_sparse_gpu.py -p no:cacheprovider > $OUT/sparse-tests.log 2>&1
echo "tests rc=$? $(el)s" >> $S
CS=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer); timeout 120 $CS --tool memcheck --report-api-errors no python3 -m mlagen.bench_sparse sanitize > $OUT/sanitize.log 2>&1
echo "sanitize rc=$? $(el)s" >> $S
wait
timeout 150 python3 -m mlagen.cli bench --shapes S1,S2,S3,S4,S5,S6 --peers flashmla,mlagen --rounds 5 --iters 30 --markdown $OUT/bench-sparse.md --json $OUT/bench-sparse.json > $OUT/bench-sparse.log 2>&1
echo "bench rc=$? $(el)s" >> $S
timeout 100 python3 -m mlagen.bench_sparse bench-fp8 > $OUT/bench-fp8.log 2>&1
echo "bench-fp8 rc=$? $(el)s" >> $S
cat $S; tail -3 $OUT/sparse-tests.log; tail -4 $OUT/sanitize.log; grep -E "^\| S" $OUT/bench-sparse.md | cut -d'|' -f2,4-8; grep -E "x |TFLOP" $OUT/bench-fp8.log | tail -12
