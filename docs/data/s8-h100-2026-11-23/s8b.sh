#!/usr/bin/env bash
# Session 8 H100 call 2: Nsight Compute of FA3 and mlagen on D7, D6, D4 (and D7 snake vs stride).
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 MLAGEN_OUT_DIR=/tmp/mlo
T0=$(date +%s); S=$OUT/summary.txt
el() { echo $(( $(date +%s)-T0 )); }
which ncu >> $S 2>&1; ncu --version | tail -1 >> $S
env -u OUT python3 shared/peers/fa3/build_fa3.py --build-dir shared/peers/fa3/build > /tmp/fa3build.log 2>&1; echo "fa3 build rc=$? $(el)s" >> $S
P=mla_prefill_sm90_causal_c2_n128_s2_qsmem_opingpong_ov1_rsoverlapped_pwearly
D2REC=${P}_schdynamic_eptma_lw2_rp24_rc240_sq128_sk128_sv128_cl1
NCU="ncu --profile-from-start off --clock-control none --set full --import-source no"
for job in "D7 fa3 auto=MLAGEN_TILE_DEAL=stride snake=MLAGEN_TILE_DEAL=snake dyn2@$D2REC" "D6 fa3 auto" "D4 fa3 auto" "D1 fa3 auto"; do
  [ $(el) -gt 400 ] && { echo "skip ${job%% *}" >> $S; continue; }
  id=${job%% *}
  timeout 150 $NCU --csv --page raw python3 .carry/prof/prof8.py $job > $OUT/ncu-$id.csv 2> /tmp/ncu-$id.err
  echo "ncu $id rc=$? $(el)s" >> $S; tail -3 /tmp/ncu-$id.err >> $S
done
cat $S
