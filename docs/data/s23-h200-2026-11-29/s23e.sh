#!/usr/bin/env bash
# Session 23 (H200) call e: after the last staging change (mark stores only where clear; the whole-pool route up to
# a 32nd of the references): the sparse GPU files, the staging per route, the routes end to end, bench-fp8 on
# S1 / S3 and S5 (H 16: the staged call runs dispatch's H <= 16 kernel on the bf16 rows).
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 MLAGEN_OUT_DIR=/tmp/mlo
T0=$(date +%s); S=$OUT/summary.txt
el() { echo $(( $(date +%s)-T0 )); }
ls shared/peers/flashmla/build/*.so >/dev/null 2>&1 || (env -u OUT bash shared/peers/flashmla/run_remote.sh --jobs 8 > $OUT/flashmla-build.log 2>&1; echo "flashmla build rc=$? $(el)s" >> $S) &
timeout 200 python3 -m pytest -q tests/gpu/test_sparse_fp8_gpu.py tests/gpu/test_sparse_fp8_compute_gpu.py tests/gpu/test_bench_sparse_gpu.py tests/gpu/test_op_gpu.py tests/gpu/test_large_offsets_gpu.py tests/gpu/test_plans_gpu.py > $OUT/e-gpu-tests.log 2>&1
echo "gpu tests rc=$? $(el)s: $(tail -1 $OUT/e-gpu-tests.log)" >> $S
timeout 60 python3 docs/data/s23-h200-2026-11-29/stages.py S1 S3 big > $OUT/e-stages.log 2>&1; echo "stages rc=$? $(el)s" >> $S
timeout 90 python3 docs/data/s23-h200-2026-11-29/routes.py S1 S3 big > $OUT/e-routes.log 2>&1; echo "routes rc=$? $(el)s" >> $S
wait
timeout 200 python3 -m mlagen.bench_sparse bench-fp8 --shapes S1,S3,S5 --formats fp8_v32 --scales ue8m0,fp32 > $OUT/e-bench-fp8.log 2>&1
echo "bench-fp8 rc=$? $(el)s" >> $S
cat $S; grep -E "FAILED|ERROR" $OUT/e-gpu-tests.log | head; grep -v "^  " $OUT/e-stages.log | grep -v Warn | cut -c1-200; cut -c1-260 $OUT/e-routes.log; tail -20 $OUT/e-bench-fp8.log | grep "^|"
