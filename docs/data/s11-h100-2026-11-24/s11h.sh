#!/usr/bin/env bash
# Session 11 H100 call h: the first slot of a block released after its P V reads (k-steps 0-1), not at the block end: tests, sweep, S5 bench.
# variant sweep on S5 and H=8, then S5 against FlashMLA (padded to 64 heads) in mlagen bench.
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 MLAGEN_OUT_DIR=/tmp/mlo
T0=$(date +%s); S=$OUT/summary.txt
el() { echo $(( $(date +%s)-T0 )); }
D=docs/data/s11-h100-2026-11-24
{ nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv,noheader; python3 -c "import torch; print('torch', torch.__version__)"; } >> $S 2>&1
[ -f shared/peers/flashmla/build/flashmla_sparse_sm90_C.so ] || (env -u OUT nice bash shared/peers/flashmla/run_remote.sh > /tmp/flashmla.log 2>&1; echo "flashmla build rc=$? $(el)s" >> $S) &
timeout 200 python3 -m pytest -x -q tests/gpu/test_sparse_gpu.py -k "h16" -p no:cacheprovider > $OUT/tests.log 2>&1
echo "tests rc=$? $(el)s" >> $S
tail -n 15 $OUT/tests.log >> $S
if grep -q " passed" $OUT/tests.log && ! grep -q "failed" $OUT/tests.log; then
  timeout 200 python3 $D/h16sweep.py > $OUT/sweep.log 2>&1; echo "sweep rc=$? $(el)s" >> $S
  wait
  timeout 90 python3 -m mlagen.cli bench --shapes S5 --peers flashmla,mlagen,mlagen:mla_sparse_prefill_sm90 --rounds 5 --iters 30 --markdown $OUT/bench-s5.md > $OUT/bench-s5.log 2>&1
  echo "bench rc=$? $(el)s" >> $S
fi
wait
cat $S; head -n 12 $OUT/sweep.log; grep -A12 "H=8" $OUT/sweep.log | head -5; grep -E "^\| S5" $OUT/bench-s5.md
