#!/usr/bin/env bash
# Session 20 H100 call b: the FP8 dense space re-tuned on D3 and D1 with two-level accumulation every 4
# key tiles (o_flush 4; o_copy regs or smem), the tuner now checking every variant on V with a channel
# mean too (verify.PARTS "stress"); then the sign of the accumulator's loss (V = -1 + 0.1 N) on D3.
export PYTHONUNBUFFERED=1 MLAGEN_OUT_DIR=/tmp/mlo PYTHONPATH=$PWD
D=docs/data/s20-h100-2026-11-25
for sh in D3 D1; do
  timeout 250 python3 -m mlagen.cli tune mla_prefill_sm90_fp8 --shape $sh --fixed o_flush=4 --max-trials 300 --budget 3.4 --db $OUT/b-$sh.sqlite --no-progress --top 8 > $OUT/b-tune-$sh.log 2>&1; echo "tune $sh rc=$?"
  python3 -m mlagen.cli db --db $OUT/b-$sh.sqlite export $OUT/b-$sh.json > /dev/null 2>&1
  grep -E "trials in|^winner|final|wrong" $OUT/b-tune-$sh.log | tail -4 | cut -c1-400
done
timeout 60 python3 $D/abvar2.py mla_prefill_sm90_fp8 D3 1 o_flush=4,o_copy=smem --mean=-1 2>&1 | grep -v "^ *warn" | grep "rel L2" | tee $OUT/b-negmean.log
