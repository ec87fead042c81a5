#!/usr/bin/env bash
# Session 14 H100 call a: where the fp8 compute mode's producer spends a pair now (clock64
# counters in an instrumented copy, with the scale stage, the factor stores and the id loads
# counted too), and the S1/S3 timing of the shipped kernel (f8check --time).
export PYTHONUNBUFFERED=1 MLAGEN_OUT_DIR=/tmp/mlo
D=docs/data/s14-h100-2026-11-24
python3 $D/mktrace.py
(PYTHONPATH=$PWD/s14trace timeout 200 python3 $D/trace14.py > $OUT/trace.log 2>&1; echo "trace rc=$?" >> $OUT/trace.log)
cat $OUT/trace.log
PYTHONPATH=$PWD timeout 200 python3 docs/data/s13-h100-2026-11-24/f8check.py --time > $OUT/f8check.log 2>&1; echo "f8check rc=$?"
tail -n 20 $OUT/f8check.log
