#!/usr/bin/env bash
# Session 10 H100 call 11: where the FP8 producer's time goes (rc208/rp88, the record's variant): as built (0), loads without the conversion (1: raw words stored), the
# conversion without loads (2), neither (3). Results of 1-3 are wrong on purpose; only times matter.
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 MLAGEN_OUT_DIR=/tmp/mlo
T0=$(date +%s); S=$OUT/summary.txt
el() { echo $(( $(date +%s)-T0 )); }
H=templates/include/mlagen/sm90/sparse_kv_fp8.cuh
[ -f shared/peers/flashmla/build/flashmla_sparse_sm90_C.so ] || (env -u OUT bash shared/peers/flashmla/run_remote.sh > /tmp/flashmla.log 2>&1; echo "flashmla build rc=$? $(el)s" >> $S)
Y=specs/mla_sparse_prefill_sm90.yaml
# (The header edit changes the source hash, so the record is not dispatched: the spec defaults are
# set to the record's registers instead.)
sed -i "s/consumer_regs: {values: \[216, 224, 208\], default: 216/consumer_regs: {values: [216, 224, 208], default: 208/; s/producer_regs: {values: \[72, 56, 88\], default: 72/producer_regs: {values: [72, 56, 88], default: 88/" $Y
grep -E "consumer_regs|producer_regs" $Y | head -2 >> $S
cp $H /tmp/h.cuh
for X in 0 1 2 3; do
  cp /tmp/h.cuh $H; sed -i "s/^#define MLAGEN_FP8_EXPERIMENT .*/#define MLAGEN_FP8_EXPERIMENT $X/" $H
  timeout 100 python3 -m mlagen.bench_sparse bench-fp8 --shapes S1,S3 --scales ue8m0 --rounds 2 > $OUT/bench-x$X.log 2>&1
  { echo "experiment=$X rc=$? $(el)s"; grep -E '^\| S' $OUT/bench-x$X.log; } >> $S
done
cat $S
