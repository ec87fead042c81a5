#!/usr/bin/env bash
# Session 11 H100 call s (final kernel): the two per-head warpgroup reductions (block max, row sums) through one helper (SASS
# reordered, so re-validated): the sparse GPU suites, the S5 sweep, S5 / H=8 against FlashMLA.
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 MLAGEN_OUT_DIR=/tmp/mlo
T0=$(date +%s); S=$OUT/summary.txt
el() { echo $(( $(date +%s)-T0 )); }
D=docs/data/s11-h100-2026-11-24
{ nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv,noheader; python3 -c "import torch; print('torch', torch.__version__)"; } >> $S 2>&1
[ -f shared/peers/flashmla/build/flashmla_sparse_sm90_C.so ] || (env -u OUT nice bash shared/peers/flashmla/run_remote.sh > /tmp/flashmla.log 2>&1; echo "flashmla build rc=$? $(el)s" >> $S) &
timeout 400 python3 -m pytest -q tests/gpu/test_sparse_gpu.py tests/gpu/test_sparse_fp8_gpu.py tests/gpu/test_op_gpu.py tests/gpu/test_bench_sparse_gpu.py -p no:cacheprovider > $OUT/tests.log 2>&1
echo "tests rc=$? $(el)s" >> $S; tail -n 1 $OUT/tests.log >> $S; grep -E "^FAILED" $OUT/tests.log | head >> $S
timeout 100 python3 $D/h16sweep.py all s5only > $OUT/sweep.log 2>&1; echo "sweep rc=$? $(el)s" >> $S
wait
timeout 90 python3 -m mlagen.cli bench --shape S5 --shape sq=4096,h=8,topk=2048,skv=32768 --peers flashmla,mlagen,mlagen:mla_sparse_prefill_sm90 --rounds 7 --iters 30 --markdown $OUT/bench-h16.md > $OUT/bench-h16.log 2>&1
echo "bench h16 rc=$? $(el)s" >> $S
cat $S; grep -E "^\| S[0-9]|^\| sq" $OUT/bench-h16.md | cut -d'|' -f2,4-8; cat $OUT/sweep.log
