#!/usr/bin/env bash
# Session 23 (H200) call b: the staged FP8-cache path (compute="bf16" without kernel=: rows dequantized into a
# bf16 workspace, then dispatch's bf16 kernel): the sparse GPU tests, then bench-fp8 (the call as users write it
# against the in-kernel conversion, the bf16 kernel on the copy and the serving path), FlashMLA built here.
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 MLAGEN_OUT_DIR=/tmp/mlo
T0=$(date +%s); S=$OUT/summary.txt
el() { echo $(( $(date +%s)-T0 )); }
ls shared/peers/flashmla/build/*.so >/dev/null 2>&1 || (env -u OUT bash shared/peers/flashmla/run_remote.sh --jobs 8 > $OUT/flashmla-build.log 2>&1; echo "flashmla build rc=$? $(el)s" >> $S) &
timeout 330 python3 -m pytest -q -x tests/gpu/test_sparse_fp8_gpu.py tests/gpu/test_sparse_fp8_compute_gpu.py tests/gpu/test_bench_sparse_gpu.py tests/gpu/test_op_gpu.py tests/gpu/test_large_offsets_gpu.py > $OUT/b-gpu-tests.log 2>&1
echo "gpu tests rc=$? $(el)s: $(tail -1 $OUT/b-gpu-tests.log)" >> $S
wait
timeout 240 python3 -m mlagen.bench_sparse bench-fp8 --shapes S1,S3 --formats fp8_v32 --scales ue8m0,fp32 > $OUT/b-bench-fp8.log 2>&1
echo "bench-fp8 rc=$? $(el)s" >> $S
cat $S; grep -E "FAIL|Error" $OUT/b-gpu-tests.log | head -20; tail -14 $OUT/b-bench-fp8.log
