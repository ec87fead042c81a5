#!/usr/bin/env bash
# Session 10 H100 call 18: the FP8 producer with its rope by cp.async (committed form), and the
# source hash that now counts the KV operand headers: re-tune the FP8 class, then with that record
# dispatched (user database) every sparse GPU test, compute-sanitizer and bench-fp8.
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 MLAGEN_OUT_DIR=/tmp/mlo MLAGEN_TUNING_DB=/tmp/rec.sqlite
T0=$(date +%s); S=$OUT/summary.txt
el() { echo $(( $(date +%s)-T0 )); }
(env -u OUT nice bash shared/peers/flashmla/run_remote.sh > /tmp/flashmla.log 2>&1; echo "flashmla build rc=$? $(el)s" >> $S) &
timeout 200 python3 -m mlagen.cli tune mla_sparse_prefill_sm90 --shape sq=4096,h=128,topk=2048,skv=8192,kv=fp8_v32 --max-trials 60 --budget 3 --no-progress > $OUT/tune.log 2>&1
echo "tune rc=$? $(el)s" >> $S
python3 -m mlagen.cli db export --best-only $OUT/rec.json >> $S 2>&1
timeout 240 python3 -m pytest -q tests/gpu/test_sparse_gpu.py tests/gpu/test_sparse_fp8_gpu.py tests/gpu/test_op_gpu.py tests/gpu/test_bench_sparse_gpu.py -p no:cacheprovider > $OUT/tests.log 2>&1
echo "sparse tests rc=$? $(el)s $(tail -n 1 $OUT/tests.log)" >> $S
CS=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer); timeout 150 $CS --tool memcheck --report-api-errors no python3 -m mlagen.bench_sparse sanitize > $OUT/sanitize.log 2>&1
echo "sanitize rc=$? $(el)s $(tail -n 1 $OUT/sanitize.log)" >> $S
wait
timeout 120 python3 -m mlagen.bench_sparse bench-fp8 --rounds 3 > $OUT/bench-fp8.log 2>&1
echo "bench-fp8 rc=$? $(el)s" >> $S
cat $S; tail -n 14 $OUT/tune.log | cut -c1-160; grep -E "FAILED" $OUT/tests.log | head; grep -E "^\|" $OUT/bench-fp8.log
