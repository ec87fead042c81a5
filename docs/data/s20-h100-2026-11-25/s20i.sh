#!/usr/bin/env bash
# Session 20 H100 call i: `mlagen tune` on the FP8 spec for D2 and D5 (batches of sequences) as a user runs it,
# a short budget: every variant checked on the three parts (check problem, shape, stress: V with a channel mean).
export PYTHONUNBUFFERED=1 MLAGEN_OUT_DIR=/tmp/mlo PYTHONPATH=$PWD
for sh in D2 D5; do
  timeout 200 python3 -m mlagen.cli tune mla_prefill_sm90_fp8 --shape $sh --max-trials 40 --budget 1.5 --db $OUT/i.sqlite --no-progress --top 5 > $OUT/i-tune-$sh.log 2>&1; echo "tune $sh rc=$?"
  grep -E "trials in|^winner|wrong|checks" $OUT/i-tune-$sh.log | head -8 | cut -c1-300
done
