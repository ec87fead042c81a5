#!/usr/bin/env bash
# Session 14 H100 call c: the transposed P V (O^T = V^T P'^T, V^T fragments by ldmatrix.trans
# from the gathered rows; no producer transpose; three gather buffers): the fp8 case matrix and
# S1/S3 timing (f8check --time), the fp8 compute GPU tests, memcheck on fuzzed cases.
export PYTHONUNBUFFERED=1 MLAGEN_OUT_DIR=/tmp/mlo PYTHONPATH=$PWD
PYTHONPATH=$PWD timeout 240 python3 docs/data/s13-h100-2026-11-24/f8check.py --time > $OUT/f8check.log 2>&1; echo "f8check rc=$?"
grep -E "FAIL|correctness|^S[13]|rror" $OUT/f8check.log | head -40
timeout 200 python3 -m pytest -q tests/gpu/test_sparse_fp8_compute_gpu.py -p no:cacheprovider -x > $OUT/tests.log 2>&1; echo "tests rc=$?"
tail -n 15 $OUT/tests.log
CS=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
timeout 150 $CS --tool memcheck --report-api-errors no python3 docs/data/s13-h100-2026-11-24/sanitize13.py > $OUT/sanitize.log 2>&1
echo "memcheck rc=$?"; grep -E "ERROR SUMMARY" $OUT/sanitize.log; tail -n 5 $OUT/sanitize.log
