#!/usr/bin/env bash
# Session 18 H100 call q: the whole FP8 dense space (now with v_transpose) tuned on D1 and D3 from scratch,
# then bench_fp8 with each winner forced beside the shipped records.
export PYTHONUNBUFFERED=1 MLAGEN_OUT_DIR=/tmp/mlo PYTHONPATH=$PWD
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
for sh in D1 D3; do
  timeout 230 python3 -m mlagen.cli tune mla_prefill_sm90_fp8 --shape $sh --max-trials 400 --budget 3.3 --db $OUT/q-$sh.sqlite --no-progress --top 8 > $OUT/q-tune-$sh.log 2>&1; echo "tune $sh rc=$?"
  python3 -m mlagen.cli db --db $OUT/q-$sh.sqlite export $OUT/q-$sh.json > /dev/null 2>&1
  grep -E "trials in|^winner|final" $OUT/q-tune-$sh.log | tail -8
done
