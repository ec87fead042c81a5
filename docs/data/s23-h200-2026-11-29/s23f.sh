#!/usr/bin/env bash
# Session 23 (H200) call f: after the last staging change (the conversion's warps stride over the rows from a grid of
# at most 2048 blocks; MLAGEN_STAGING_MB): the sparse GPU files, the staging per route, bench-fp8 on S1 / S3 / S5.
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 MLAGEN_OUT_DIR=/tmp/mlo
T0=$(date +%s); S=$OUT/summary.txt
el() { echo $(( $(date +%s)-T0 )); }
ls shared/peers/flashmla/build/*.so >/dev/null 2>&1 || (env -u OUT bash shared/peers/flashmla/run_remote.sh --jobs 8 > $OUT/flashmla-build.log 2>&1; echo "flashmla build rc=$? $(el)s" >> $S) &
timeout 200 python3 -m pytest -q tests/gpu/test_sparse_fp8_gpu.py tests/gpu/test_sparse_fp8_compute_gpu.py tests/gpu/test_bench_sparse_gpu.py tests/gpu/test_op_gpu.py tests/gpu/test_large_offsets_gpu.py tests/gpu/test_plans_gpu.py > $OUT/f-gpu-tests.log 2>&1
echo "gpu tests rc=$? $(el)s: $(tail -1 $OUT/f-gpu-tests.log)" >> $S
timeout 60 python3 docs/data/s23-h200-2026-11-29/stages.py S1 S3 big > $OUT/f-stages.log 2>&1; echo "stages rc=$? $(el)s" >> $S
wait
timeout 200 python3 -m mlagen.bench_sparse bench-fp8 --shapes S1,S3,S5 --formats fp8_v32 --scales ue8m0,fp32 > $OUT/f-bench-fp8.log 2>&1
echo "bench-fp8 rc=$? $(el)s" >> $S
cat $S; grep -E "FAILED|ERROR" $OUT/f-gpu-tests.log | head; grep -v "^  " $OUT/f-stages.log | grep -v -i warn | cut -c1-200; grep "big compacted" $OUT/f-stages.log | cut -c1-700; tail -20 $OUT/f-bench-fp8.log | grep "^|"
