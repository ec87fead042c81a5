#!/usr/bin/env bash
# Session 12 H100 call n: as call m, power-of-two scales dequantized by bf16 multiplies again (with eight producer warps)
# and the e4m3 values widened by integer operations: FP8 and bf16 sparse GPU tests, the FP8 cases with the kernel forced (every H),
# then S5 from the fp8_v32 cache against our bf16 kernel on the copy, the serving path and the
# 64-head kernel on the FP8 cache.
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 MLAGEN_OUT_DIR=/tmp/mlo
T0=$(date +%s); S=$OUT/summary.txt
el() { echo $(( $(date +%s)-T0 )); }
(env -u OUT nice bash shared/peers/flashmla/run_remote.sh > /tmp/flashmla.log 2>&1; echo "flashmla build rc=$? $(el)s" >> $S) &
timeout 240 python3 -m pytest -q -x tests/gpu/test_sparse_fp8_gpu.py -p no:cacheprovider > $OUT/tests-fp8.log 2>&1
echo "fp8 tests rc=$? $(el)s" >> $S; tail -3 $OUT/tests-fp8.log
timeout 120 python3 -m mlagen.bench_sparse verify-fp8 --kernel mla_sparse_prefill_sm90_h16 > $OUT/verify-fp8-h16.log 2>&1
echo "verify-fp8 h16 rc=$? $(el)s" >> $S; tail -5 $OUT/verify-fp8-h16.log
wait
timeout 150 python3 -m mlagen.bench_sparse bench-fp8 --shapes S5 --rounds 5 > $OUT/bench-fp8.log 2>&1
echo "bench-fp8 rc=$? $(el)s" >> $S
cat $S; tail -6 $OUT/bench-fp8.log
timeout 100 python3 -m pytest -q tests/gpu/test_sparse_gpu.py -k "h16" -p no:cacheprovider > $OUT/tests-h16.log 2>&1
echo "h16 tests rc=$? $(el)s" >> $S; tail -2 $OUT/tests-h16.log
