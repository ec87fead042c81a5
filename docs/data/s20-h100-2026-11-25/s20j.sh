#!/usr/bin/env bash
# Session 20 H100 call j: the stress check with its bias bound (0.75%): short FP8 tunes on D4 (16 ragged
# sequences of 128-4096 tokens) and D3, where single-level variants passed the tolerance on the relative
# L2 error alone on shorter rows; then the FP8 GPU test file and the GPU tune tests on the final tree.
export PYTHONUNBUFFERED=1 MLAGEN_OUT_DIR=/tmp/mlo PYTHONPATH=$PWD
for sh in D4 D3; do
  timeout 150 python3 -m mlagen.cli tune mla_prefill_sm90_fp8 --shape $sh --max-trials 40 --budget 1.2 --db $OUT/j.sqlite --no-progress --top 5 > $OUT/j-tune-$sh.log 2>&1; echo "tune $sh rc=$?"
  grep -E "trials in|^winner|wrong" $OUT/j-tune-$sh.log | head -8 | cut -c1-330
done
timeout 200 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_fp8_gpu.py tests/gpu/test_tune_gpu.py -rxXs 2>&1 | tail -5 | tee $OUT/j-tests.log
