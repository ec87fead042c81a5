#!/bin/bash
# Session 21, call a: the GPU tune tests, then a user's short tunes with the shipped records in
# place (fresh database each): the record in use is measured, re-timed with the finalists, kept or
# replaced. Run from the repository root on the device machine; logs under $OUT.
export PYTHONPATH=$PWD
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv > $OUT/a-gpu.txt
python3 -m pytest -q -p no:cacheprovider tests/gpu/test_tune_gpu.py -rxXs > $OUT/a-tune-gpu.log 2>&1
for s in "mla_prefill_sm90_fp8 D3" "mla_prefill_sm90 D1" "mla_prefill_sm90 D3"; do
  set -- $s
  timeout 150 python3 -m mlagen.cli tune $1 --shape $2 --max-trials 30 --db $OUT/$1-$2.sqlite --no-progress \
    > $OUT/a-$1-$2.log 2>&1
  echo "rc=$?" >> $OUT/a-$1-$2.log
done
