#!/usr/bin/env bash
# Session 15 H100 call s: the tuner with halving re-timings put on the trials' scale: the same FP8 D1 tune
# as call r (fresh database, seed 5), then the GPU tune tests.
export PYTHONUNBUFFERED=1 MLAGEN_OUT_DIR=/tmp/mlo PYTHONPATH=$PWD
timeout 300 python3 -m mlagen.cli tune mla_prefill_sm90_fp8 --shape D1 --budget 4 --seed 5 --db $OUT/s-tune.sqlite --no-progress --top 8 > $OUT/s-tune.log 2>&1; echo "tune rc=$?"
grep -E "halving|local:|final|winner|trials in" $OUT/s-tune.log | cut -c1-230
timeout 280 python3 -m pytest -q tests/gpu/test_tune_gpu.py > $OUT/s-tests.log 2>&1; echo "tune tests rc=$?"; tail -2 $OUT/s-tests.log
