#!/usr/bin/env bash
# Session 10 H100 call 14: the final tree (parameter struct built once per format; check --gpu reads
# an fp8 record's shapes; the dense shipped-winner test skips sparse records): GPU tests, mlagen check
# --gpu over every shipped record, the sparse host time by step, the sparse table.
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 MLAGEN_OUT_DIR=/tmp/mlo
T0=$(date +%s); S=$OUT/summary.txt
el() { echo $(( $(date +%s)-T0 )); }
(env -u OUT nice bash shared/peers/flashmla/run_remote.sh > /tmp/flashmla.log 2>&1; echo "flashmla build rc=$? $(el)s" >> $S) &
timeout 240 python3 -m pytest -q tests/gpu/test_sparse_gpu.py tests/gpu/test_sparse_fp8_gpu.py tests/gpu/test_op_gpu.py tests/gpu/test_bench_sparse_gpu.py -p no:cacheprovider > $OUT/tests.log 2>&1
echo "sparse tests rc=$? $(el)s $(tail -n 1 $OUT/tests.log)" >> $S
timeout 120 python3 -m pytest -q tests/gpu/test_mla_prefill_gpu.py tests/gpu/test_fp8_gpu.py -k "shipped or memoised" -p no:cacheprovider > $OUT/tests-shipped.log 2>&1
echo "shipped-winner tests rc=$? $(el)s $(tail -n 1 $OUT/tests-shipped.log)" >> $S
timeout 200 python3 -m mlagen.cli check --gpu > $OUT/check-gpu.log 2>&1
echo "check --gpu rc=$? $(el)s $(tail -n 1 $OUT/check-gpu.log)" >> $S
timeout 60 python3 .carry/prof/hostprof10.py S1 S6 2>&1 | grep -E "^S[0-9]" > $OUT/host.log
wait
timeout 100 python3 -m mlagen.cli bench --shapes S1,S2,S3,S4,S5,S6 --peers flashmla,mlagen --rounds 5 --iters 30 --markdown $OUT/bench-sparse.md > $OUT/bench-sparse.log 2>&1
echo "bench sparse rc=$? $(el)s" >> $S
cat $S; grep -E "FAILED" $OUT/tests.log $OUT/tests-shipped.log | head; cat $OUT/check-gpu.log | tail -n 20; cat $OUT/host.log; grep -E "^\| S" $OUT/bench-sparse.md | cut -d'|' -f2,4-6
