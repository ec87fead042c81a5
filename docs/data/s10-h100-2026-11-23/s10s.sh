#!/usr/bin/env bash
# Session 10 H100 call 19: the final tree with the shipped files only (no user database): the shipped
# FP8 record is dispatched (its source hash matches), the sparse FP8 GPU tests and every shipped-winner
# test pass, and `mlagen check --gpu` passes over all 13 records.
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 MLAGEN_OUT_DIR=/tmp/mlo
T0=$(date +%s); S=$OUT/summary.txt
el() { echo $(( $(date +%s)-T0 )); }
python3 -m mlagen.cli db ls --shipped >> $S 2>&1 || python3 -m mlagen.cli db ls >> $S 2>&1
timeout 200 python3 -m pytest -q tests/gpu/test_sparse_fp8_gpu.py -p no:cacheprovider > $OUT/fp8-tests.log 2>&1
echo "fp8 tests rc=$? $(el)s $(tail -n 1 $OUT/fp8-tests.log)" >> $S
timeout 120 python3 -m pytest -q tests/gpu/test_mla_prefill_gpu.py tests/gpu/test_fp8_gpu.py -k shipped -p no:cacheprovider > $OUT/shipped-tests.log 2>&1
echo "shipped-winner tests rc=$? $(el)s $(tail -n 1 $OUT/shipped-tests.log)" >> $S
timeout 200 python3 -m mlagen.cli check --gpu > $OUT/check-gpu.log 2>&1
echo "check --gpu rc=$? $(el)s" >> $S
cat $S | cut -c1-220; tail -n 16 $OUT/check-gpu.log | cut -c1-60,150-260
