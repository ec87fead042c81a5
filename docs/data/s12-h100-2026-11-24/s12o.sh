#!/usr/bin/env bash
# Session 12 H100 call o: the final tree: sparse, FP8, op and bench GPU tests; compute-sanitizer memcheck on
# FP8 cases of the H <= 16 kernel (eight producer warps, power-of-two path); the sparse table against FlashMLA.
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 MLAGEN_OUT_DIR=/tmp/mlo
D=docs/data/s12-h100-2026-11-24
T0=$(date +%s); S=$OUT/summary.txt
el() { echo $(( $(date +%s)-T0 )); }
CS=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
(env -u OUT nice bash shared/peers/flashmla/run_remote.sh > /tmp/flashmla.log 2>&1; echo "flashmla build rc=$? $(el)s" >> $S) &
timeout 330 python3 -m pytest -q tests/gpu/test_sparse_gpu.py tests/gpu/test_sparse_fp8_gpu.py tests/gpu/test_op_gpu.py tests/gpu/test_bench_sparse_gpu.py -p no:cacheprovider > $OUT/tests.log 2>&1
echo "tests rc=$? $(el)s" >> $S; tail -n 2 $OUT/tests.log >> $S
timeout 100 $CS --tool memcheck --report-api-errors no python3 $D/sanitize12.py > $OUT/sanitize.log 2>&1
echo "memcheck rc=$? $(el)s" >> $S; grep -E "ERROR SUMMARY" $OUT/sanitize.log >> $S; grep -c True $OUT/sanitize.log >> $S
wait
timeout 120 python3 -m mlagen.cli bench --shapes S1,S2,S3,S4,S5,S6 --peers flashmla,mlagen --rounds 5 --iters 30 --markdown $OUT/bench-sparse.md --json $OUT/bench-sparse.json > $OUT/bench-sparse.log 2>&1
echo "bench rc=$? $(el)s" >> $S
cat $S; grep -E "^\| S[0-9]" $OUT/bench-sparse.md | cut -d'|' -f2,4-7
