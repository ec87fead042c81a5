#!/usr/bin/env bash
# Session 9 H100 call 5: the whole GPU test suite after the last kernel change (lazy maximum, new records).
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 MLAGEN_OUT_DIR=/tmp/mlo
T0=$(date +%s); S=$OUT/summary.txt
el() { echo $(( $(date +%s)-T0 )); }
timeout 560 python3 -m pytest -q tests/gpu -p no:cacheprovider --durations=15 > $OUT/gpu-tests.log 2>&1
echo "tests rc=$? $(el)s" >> $S
cat $S; tail -25 $OUT/gpu-tests.log
