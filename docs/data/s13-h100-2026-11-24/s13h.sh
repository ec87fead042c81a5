#!/usr/bin/env bash
# Session 13 H100 call h: the GPU tests of the sparse fp8 compute mode (new), the FP8-cache bf16 mode,
# the sparse bf16 family and the ops; compute-sanitizer memcheck on three fp8-mode cases.
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 MLAGEN_OUT_DIR=/tmp/mlo
D=docs/data/s13-h100-2026-11-24
T0=$(date +%s); S=$OUT/summary.txt
el() { echo $(( $(date +%s)-T0 )); }
CS=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
timeout 150 $CS --tool memcheck --report-api-errors no python3 $D/sanitize13.py > $OUT/sanitize.log 2>&1
echo "memcheck rc=$? $(el)s" >> $S; grep -E "ERROR SUMMARY" $OUT/sanitize.log >> $S; grep -c "(True" $OUT/sanitize.log >> $S
timeout 400 python3 -m pytest -q tests/gpu/test_sparse_fp8_compute_gpu.py tests/gpu/test_sparse_fp8_gpu.py tests/gpu/test_op_gpu.py tests/gpu/test_sparse_gpu.py -p no:cacheprovider -x > $OUT/tests.log 2>&1
echo "tests rc=$? $(el)s" >> $S; tail -n 5 $OUT/tests.log >> $S
cat $S
