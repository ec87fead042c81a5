#!/usr/bin/env bash
# Session 11 H100 call o (final kernel: each warp waits for its own Q K^T slot first): the sparse GPU suites (case matrix on every spec, the H<=16 schedule
# options, FP8, op, bench), compute-sanitizer, the S5 sweep, S1-S6 and H=8 against FlashMLA.
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 MLAGEN_OUT_DIR=/tmp/mlo
T0=$(date +%s); S=$OUT/summary.txt
el() { echo $(( $(date +%s)-T0 )); }
D=docs/data/s11-h100-2026-11-24
CS=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
{ nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv,noheader; python3 -c "import torch; print('torch', torch.__version__, 'cudnn', torch.backends.cudnn.version())"; } >> $S 2>&1
[ -f shared/peers/flashmla/build/flashmla_sparse_sm90_C.so ] || (env -u OUT nice bash shared/peers/flashmla/run_remote.sh > /tmp/flashmla.log 2>&1; echo "flashmla build rc=$? $(el)s" >> $S) &
timeout 400 python3 -m pytest -q tests/gpu/test_sparse_gpu.py tests/gpu/test_sparse_fp8_gpu.py tests/gpu/test_op_gpu.py tests/gpu/test_bench_sparse_gpu.py -p no:cacheprovider > $OUT/tests.log 2>&1
echo "tests rc=$? $(el)s" >> $S; tail -n 2 $OUT/tests.log >> $S; grep -E "^FAILED" $OUT/tests.log | head -20 >> $S
timeout 150 $CS --tool memcheck --report-api-errors no python3 -m mlagen.bench_sparse sanitize > $OUT/sanitize.log 2>&1
echo "sanitize (dispatch) rc=$? $(el)s" >> $S; grep -E "ERROR SUMMARY" $OUT/sanitize.log >> $S
timeout 120 $CS --tool memcheck --report-api-errors no python3 $D/sanitize11.py > $OUT/sanitize-h16.log 2>&1
echo "sanitize (h16 pinned) rc=$? $(el)s" >> $S; grep -E "ERROR SUMMARY" $OUT/sanitize-h16.log >> $S
wait
timeout 150 python3 -m mlagen.cli bench --shapes S1,S2,S3,S4,S5,S6 --peers flashmla,mlagen,mlagen:mla_sparse_prefill_sm90 --rounds 5 --iters 30 --markdown $OUT/bench-sparse.md --json $OUT/bench-sparse.json > $OUT/bench-sparse.log 2>&1
echo "bench rc=$? $(el)s" >> $S
timeout 90 python3 -m mlagen.cli bench --shape S5 --shape sq=4096,h=8,topk=2048,skv=32768 --peers flashmla,mlagen,mlagen:mla_sparse_prefill_sm90 --rounds 7 --iters 30 --markdown $OUT/bench-h16.md > $OUT/bench-h16.log 2>&1
echo "bench h16 rc=$? $(el)s" >> $S
timeout 100 python3 $D/h16sweep.py all s5only > $OUT/sweep.log 2>&1; echo "sweep rc=$? $(el)s" >> $S
cat $S; grep -E "^\| S[0-9]|^\| sq" $OUT/bench-sparse.md $OUT/bench-h16.md | cut -d'|' -f2,4-8; cat $OUT/sweep.log
