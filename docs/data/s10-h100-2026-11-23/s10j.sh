#!/usr/bin/env bash
# Session 10 H100 call 10: the tuner on the FP8-cache class (d576/h128/k2048/flat/fp8_v32: S1 and S3),
# a record from it, and bench-fp8 with the record dispatched (bench-fp8 calls mla_sparse_prefill as a
# user does: the tuning database decides).
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 MLAGEN_OUT_DIR=/tmp/mlo MLAGEN_TUNING_DB=/tmp/rec.sqlite
T0=$(date +%s); S=$OUT/summary.txt
el() { echo $(( $(date +%s)-T0 )); }
[ -f shared/peers/flashmla/build/flashmla_sparse_sm90_C.so ] || (env -u OUT nice bash shared/peers/flashmla/run_remote.sh > /tmp/flashmla.log 2>&1; echo "flashmla build rc=$? $(el)s" >> $S) &
timeout 330 python3 -m mlagen.cli tune mla_sparse_prefill_sm90 --shape sq=4096,h=128,topk=2048,skv=8192,kv=fp8_v32 --max-trials 60 --budget 4 --no-progress > $OUT/tune.log 2>&1
echo "tune rc=$? $(el)s" >> $S
python3 -m mlagen.cli db export --best-only $OUT/rec.json >> $S 2>&1
python3 -m mlagen.cli db ls >> $S 2>&1
wait
timeout 120 python3 -m mlagen.bench_sparse bench-fp8 --rounds 3 > $OUT/bench-fp8.log 2>&1
echo "bench-fp8 rc=$? $(el)s" >> $S
cat $S; tail -n 15 $OUT/tune.log; grep -E "^\|" $OUT/bench-fp8.log
