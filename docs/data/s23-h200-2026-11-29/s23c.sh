#!/usr/bin/env bash
# Session 23 (H200) call c: the whole GPU suite after the staging change, then the staging routes timed.
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 MLAGEN_OUT_DIR=/tmp/mlo
T0=$(date +%s); S=$OUT/summary.txt
el() { echo $(( $(date +%s)-T0 )); }
timeout 470 python3 -m pytest -q tests/gpu > $OUT/c-gpu-tests.log 2>&1
echo "gpu suite rc=$? $(el)s: $(tail -1 $OUT/c-gpu-tests.log)" >> $S
timeout 100 python3 docs/data/s23-h200-2026-11-29/routes.py S1 S3 big > $OUT/c-routes.log 2>&1
echo "routes rc=$? $(el)s" >> $S
cat $S; grep -E "FAILED|ERROR" $OUT/c-gpu-tests.log | head -20; cut -c1-400 $OUT/c-routes.log | tail -8
