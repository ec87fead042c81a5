#!/usr/bin/env bash
# Session 10 H100 call 21: the bf16 sparse classes have no records (the spec default ran against
# FlashMLA): tune the classes of S1-S3, S4, S5 and S6 (one-minute budget each), then with those
# records dispatched (user database) the sparse GPU tests and the S table.
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 MLAGEN_OUT_DIR=/tmp/mlo MLAGEN_TUNING_DB=/tmp/rec.sqlite
T0=$(date +%s); S=$OUT/summary.txt
el() { echo $(( $(date +%s)-T0 )); }
(env -u OUT nice bash shared/peers/flashmla/run_remote.sh > /tmp/flashmla.log 2>&1; echo "flashmla build rc=$? $(el)s" >> $S) &
for sh in S1 S4 S5 S6; do
  timeout 110 python3 -m mlagen.cli tune mla_sparse_prefill_sm90 --shape $sh --max-trials 40 --budget 1 --no-progress > $OUT/tune-$sh.log 2>&1
  echo "tune $sh rc=$? $(el)s $(grep -E '^winner' $OUT/tune-$sh.log)" >> $S
done
python3 -m mlagen.cli db export --best-only $OUT/rec.json >> $S 2>&1
timeout 150 python3 -m pytest -q tests/gpu/test_sparse_gpu.py tests/gpu/test_bench_sparse_gpu.py -p no:cacheprovider > $OUT/tests.log 2>&1
echo "sparse tests rc=$? $(el)s $(tail -n 1 $OUT/tests.log)" >> $S
wait
timeout 100 python3 -m mlagen.cli bench --shapes S1,S2,S3,S4,S5,S6 --peers flashmla,mlagen --rounds 5 --iters 30 --markdown $OUT/bench-sparse.md > $OUT/bench-sparse.log 2>&1
echo "bench sparse rc=$? $(el)s" >> $S
cat $S | cut -c1-250; grep -E "^\| S" $OUT/bench-sparse.md | cut -d'|' -f2,6
