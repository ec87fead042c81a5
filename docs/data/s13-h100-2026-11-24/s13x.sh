#!/usr/bin/env bash
# Session 13 H100 call x: the fp8 compute mode on the final tree. bench-fp8 on S1 and S3 (UE8M0 and
# fp32 scales): the public calls as a user writes them, interleaved in one process, FlashMLA built in
# this call; memcheck on three fp8-mode cases; the sparse, FP8 and op GPU tests.
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 MLAGEN_OUT_DIR=/tmp/mlo
D=docs/data/s13-h100-2026-11-24
T0=$(date +%s); S=$OUT/summary.txt
el() { echo $(( $(date +%s)-T0 )); }
(env -u OUT nice bash shared/peers/flashmla/run_remote.sh > /tmp/flashmla.log 2>&1; echo "flashmla build rc=$? $(el)s" >> $S) &
wait
timeout 300 python3 -m mlagen.bench_sparse bench-fp8 --shapes S1,S3 --rounds 5 > $OUT/bench-fp8.log 2>&1
echo "bench-fp8 rc=$? $(el)s" >> $S
cat $S; tail -n 16 $OUT/bench-fp8.log
CS=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
timeout 150 $CS --tool memcheck --report-api-errors no python3 $D/sanitize13.py > $OUT/sanitize.log 2>&1
echo "memcheck rc=$? $(el)s" >> $S; grep -E "ERROR SUMMARY" $OUT/sanitize.log >> $S; grep -c "(True" $OUT/sanitize.log >> $S
timeout 300 python3 -m pytest -q tests/gpu/test_sparse_fp8_compute_gpu.py tests/gpu/test_sparse_fp8_gpu.py tests/gpu/test_op_gpu.py tests/gpu/test_sparse_gpu.py -p no:cacheprovider > $OUT/tests.log 2>&1
echo "tests rc=$? $(el)s" >> $S; tail -n 2 $OUT/tests.log >> $S
tail -n 12 $S
