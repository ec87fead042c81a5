#!/usr/bin/env bash
# Session 14 H100 call b: the CTA-wide V normalisers (the per-pair scale stage gone from the
# producer): the fp8 case matrix and S1/S3 timing (f8check --time), the clock64 trace, the fp8
# compute GPU tests.
export PYTHONUNBUFFERED=1 MLAGEN_OUT_DIR=/tmp/mlo
D=docs/data/s14-h100-2026-11-24
PYTHONPATH=$PWD timeout 200 python3 docs/data/s13-h100-2026-11-24/f8check.py --time > $OUT/f8check.log 2>&1; echo "f8check rc=$?"
grep -E "FAIL|correctness|^S[13]" $OUT/f8check.log
python3 $D/mktrace.py
(PYTHONPATH=$PWD/s14trace timeout 200 python3 $D/trace14.py > $OUT/trace.log 2>&1; echo "trace rc=$?" >> $OUT/trace.log)
grep -v skipping $OUT/trace.log
PYTHONPATH=$PWD timeout 240 python3 -m pytest -q tests/gpu/test_sparse_fp8_compute_gpu.py -p no:cacheprovider -x > $OUT/tests.log 2>&1; echo "tests rc=$?"
tail -n 3 $OUT/tests.log
