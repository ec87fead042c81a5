#!/usr/bin/env bash
# Session 10 H100 call 12: the shipped tree (the committed FP8 producer, the first sparse record:
# fp8_v32 class at rc208/rp88): every sparse GPU test (bf16 and FP8), compute-sanitizer, bench-fp8.
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 MLAGEN_OUT_DIR=/tmp/mlo
T0=$(date +%s); S=$OUT/summary.txt
el() { echo $(( $(date +%s)-T0 )); }
[ -f shared/peers/flashmla/build/flashmla_sparse_sm90_C.so ] || (env -u OUT nice bash shared/peers/flashmla/run_remote.sh > /tmp/flashmla.log 2>&1; echo "flashmla build rc=$? $(el)s" >> $S) &
timeout 300 python3 -m pytest -q tests/gpu/test_sparse_gpu.py tests/gpu/test_sparse_fp8_gpu.py tests/gpu/test_bench_sparse_gpu.py tests/gpu/test_op_gpu.py -p no:cacheprovider > $OUT/tests.log 2>&1
echo "tests rc=$? $(el)s $(tail -n 1 $OUT/tests.log)" >> $S
CS=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer); timeout 150 $CS --tool memcheck --report-api-errors no python3 -m mlagen.bench_sparse sanitize > $OUT/sanitize.log 2>&1
echo "sanitize rc=$? $(el)s $(tail -n 1 $OUT/sanitize.log)" >> $S
wait
timeout 120 python3 -m mlagen.bench_sparse bench-fp8 --rounds 3 > $OUT/bench-fp8.log 2>&1
echo "bench-fp8 rc=$? $(el)s" >> $S
cat $S; grep -E "FAILED" $OUT/tests.log | head; grep -E "^\|" $OUT/bench-fp8.log
