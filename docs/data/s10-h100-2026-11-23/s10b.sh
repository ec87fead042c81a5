#!/usr/bin/env bash
# Session 10 H100 call 2: the FP8-cache producer rewritten (rows by shuffle, bf16-factor path for
# bf16-representable scales, immediates): every sparse FP8 GPU test, compute-sanitizer, bench-fp8.
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 MLAGEN_OUT_DIR=/tmp/mlo
T0=$(date +%s); S=$OUT/summary.txt
el() { echo $(( $(date +%s)-T0 )); }
[ -f shared/peers/flashmla/build/flashmla_sparse_sm90_C.so ] || (env -u OUT nice bash shared/peers/flashmla/run_remote.sh > /tmp/flashmla.log 2>&1; echo "flashmla build rc=$? $(el)s" >> $S) &
timeout 240 python3 -m pytest -q tests/gpu/test_sparse_fp8_gpu.py -p no:cacheprovider > $OUT/fp8-tests.log 2>&1
echo "fp8 tests rc=$? $(el)s" >> $S
CS=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer); timeout 150 $CS --tool memcheck --report-api-errors no python3 -m mlagen.bench_sparse sanitize > $OUT/sanitize.log 2>&1
echo "sanitize rc=$? $(el)s" >> $S
wait
timeout 150 python3 -m mlagen.bench_sparse bench-fp8 > $OUT/bench-fp8.log 2>&1
echo "bench-fp8 rc=$? $(el)s" >> $S
cat $S; tail -n 4 $OUT/fp8-tests.log; grep -E "FAILED|Error" $OUT/fp8-tests.log | head -5; tail -n 6 $OUT/sanitize.log; grep -E "^\|" $OUT/bench-fp8.log
