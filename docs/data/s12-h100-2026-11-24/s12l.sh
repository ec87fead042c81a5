#!/usr/bin/env bash
# Session 12 H100 call l: the final sparse tree (the H <= 16 kernel reads FP8 caches when asked by name;
# dispatch keeps the 64-head kernel for them): sparse, FP8, op and bench GPU tests, compute-sanitizer
# on FP8 cases of the H <= 16 kernel, S5 and S1 from the FP8 cache.
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 MLAGEN_OUT_DIR=/tmp/mlo
D=docs/data/s12-h100-2026-11-24
T0=$(date +%s); S=$OUT/summary.txt
el() { echo $(( $(date +%s)-T0 )); }
CS=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
(env -u OUT nice bash shared/peers/flashmla/run_remote.sh > /tmp/flashmla.log 2>&1; echo "flashmla build rc=$? $(el)s" >> $S) &
timeout 330 python3 -m pytest -q tests/gpu/test_sparse_gpu.py tests/gpu/test_sparse_fp8_gpu.py tests/gpu/test_op_gpu.py tests/gpu/test_bench_sparse_gpu.py -p no:cacheprovider > $OUT/tests.log 2>&1
echo "tests rc=$? $(el)s" >> $S; tail -n 3 $OUT/tests.log >> $S
timeout 100 $CS --tool memcheck --report-api-errors no python3 $D/sanitize12.py > $OUT/sanitize.log 2>&1
echo "memcheck rc=$? $(el)s" >> $S; grep -E "ERROR SUMMARY" $OUT/sanitize.log >> $S; grep -c True $OUT/sanitize.log >> $S
wait
timeout 120 python3 -m mlagen.bench_sparse bench-fp8 --shapes S5,S1 --scales ue8m0 --rounds 5 > $OUT/bench-fp8.log 2>&1
echo "bench-fp8 rc=$? $(el)s" >> $S
cat $S; tail -4 $OUT/bench-fp8.log
