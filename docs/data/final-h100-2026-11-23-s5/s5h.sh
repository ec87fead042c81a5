#!/usr/bin/env bash
# Session 5, final H100 call 1/2: peers built, every GPU test after the last record change.
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 MLAGEN_OUT_DIR=/tmp/mlo
T0=$(date +%s)
(ls shared/peers/fa3/build/*.so >/dev/null 2>&1 || env -u OUT nice python3 shared/peers/fa3/build_fa3.py --build-dir shared/peers/fa3/build > /tmp/fa3build.log 2>&1; echo "fa3 build rc=$? $(( $(date +%s)-T0 ))s" >> $OUT/summary.txt
 env -u OUT nice bash shared/peers/flashmla/run_remote.sh > /tmp/flashmla.log 2>&1; echo "flashmla build rc=$? $(( $(date +%s)-T0 ))s" >> $OUT/summary.txt) &
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; python3 -c "import torch; print('torch', torch.__version__)"; git log -1 --oneline 2>/dev/null; } > $OUT/env.txt 2>&1
timeout 420 python3 -m pytest -q -p no:cacheprovider -rs tests/gpu > $OUT/gpu-tests.log 2>&1
echo "gpu tests rc=$? $(( $(date +%s)-T0 ))s $(tail -1 $OUT/gpu-tests.log)" >> $OUT/summary.txt
wait
cat $OUT/summary.txt; grep -E "FAILED|ERROR" $OUT/gpu-tests.log | head; tail -3 $OUT/gpu-tests.log
