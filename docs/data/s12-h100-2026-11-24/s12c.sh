#!/usr/bin/env bash
# Session 12 H100 call c: re-tune the classes of D5 and D2 (the shapes nearest 1.0x FA3) over the
# current space (diagonal, lazy maximum), then A/B each winner against the shipped record and FA3.
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 MLAGEN_OUT_DIR=/tmp/mlo MLAGEN_TUNING_DB=/tmp/rec.sqlite
D=docs/data/s12-h100-2026-11-24
T0=$(date +%s); S=$OUT/summary.txt
el() { echo $(( $(date +%s)-T0 )); }
(env -u OUT nice python3 shared/peers/fa3/build_fa3.py --build-dir shared/peers/fa3/build > /tmp/fa3build.log 2>&1; echo "fa3 build rc=$? $(el)s" >> $S) &
for sh in D5 D2; do
  timeout 200 python3 -m mlagen.cli tune mla_prefill_sm90 --shape $sh --budget 2.5 --no-progress > $OUT/tune-$sh.log 2>&1
  echo "tune $sh rc=$? $(el)s" >> $S
done
python3 -m mlagen.cli db export --best-only $OUT/rec.json >> $S 2>&1
wait
python3 - > $OUT/winners.txt <<'PY'
import json, os
d = json.load(open(os.environ["OUT"] + "/rec.json"))
for r in d["best"]:
    print(r["problem"], r["symbol"], r.get("tflops"))
PY
cat $OUT/winners.txt
P=mla_prefill_sm90_causal
R5=${P}_c3_n80_s3_qsmem_onone_ov1_rsoverlapped_pwearly_schdynamic_eptma_lw1_rp24_rc160_sq128_sk128_sv128_cl1_dghalf
R2=${P}_c2_n128_s2_qsmem_opingpong_ov1_rsoverlapped_pwearly_schdynamic_eptma_lw2_rp24_rc240_sq128_sk128_sv128_cl1_dghalf
W5=$(grep "q2048/k16384" $OUT/winners.txt | awk '{print $2}')
W2=$(grep "h16/q4096/k4096" $OUT/winners.txt | awk '{print $2}')
timeout 120 python3 $D/ab_env.py D5 rec@$R5 new@$W5 rec2@$R5 new2@$W5 > $OUT/ab.log 2>&1; echo "ab D5 rc=$? $(el)s" >> $S
timeout 90 python3 $D/ab_env.py D2 rec@$R2 new@$W2 rec2@$R2 new2@$W2 >> $OUT/ab.log 2>&1; echo "ab D2 rc=$? $(el)s" >> $S
cat $S; cat $OUT/ab.log | cut -c1-30,140-
