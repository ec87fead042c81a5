#!/usr/bin/env bash
# Session 15 H100 call r: a fresh FP8 D1 tune with the current tuner (global search), fresh database.
export PYTHONUNBUFFERED=1 MLAGEN_OUT_DIR=/tmp/mlo PYTHONPATH=$PWD
timeout 400 python3 -m mlagen.cli tune mla_prefill_sm90_fp8 --shape D1 --budget 4 --seed 5 --db $OUT/r-tune.sqlite --no-progress --top 12 > $OUT/r-tune.log 2>&1; echo "tune rc=$?"
grep -v "^ *warn" $OUT/r-tune.log | tail -22
python3 -m mlagen.cli db --db $OUT/r-tune.sqlite export $OUT/r-tune.json
