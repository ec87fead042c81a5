#!/usr/bin/env bash
# Session 8 H100 call 3: where the public call's event time goes (gaps.py), and D7 records A/B.
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 MLAGEN_OUT_DIR=/tmp/mlo
T0=$(date +%s); S=$OUT/summary.txt
el() { echo $(( $(date +%s)-T0 )); }
env -u OUT python3 shared/peers/fa3/build_fa3.py --build-dir shared/peers/fa3/build > /tmp/fa3build.log 2>&1; echo "fa3 build rc=$? $(el)s" >> $S
timeout 120 python3 .carry/prof/gaps.py D6 D7 D4 D2 D1 > $OUT/gaps.log 2>&1; echo "gaps rc=$? $(el)s" >> $S
P=mla_prefill_sm90_causal_c2_n128_s2_qsmem_opingpong_ov1_rsoverlapped_pwearly
D7REC=${P}_schpersistent_epdirect_lw1_rp56_rc224_sq128_sk128_sv128_cl1
D2REC=${P}_schdynamic_eptma_lw2_rp24_rc240_sq128_sk128_sv128_cl1
D6REC=${P}_schdynamic_epvtma_lw1_rp24_rc208_sq128_sk128_sv128_cl1
A=$OUT/ab.log
for job in "D7 stride=MLAGEN_TILE_DEAL=stride dyn2@$D2REC dyn2g4=MLAGEN_HEAD_GROUP=4@$D2REC dyn2g16=MLAGEN_HEAD_GROUP=16@$D2REC" "D6 stat@$D6REC:scheduler=static pers=MLAGEN_TILE_DEAL=stride@$D6REC:scheduler=persistent"; do
  timeout 70 python3 .carry/prof/ab_env.py $job >> $A 2>&1; echo "ab ${job%% *} rc=$? $(el)s" >> $S
done
cat $S $OUT/gaps.log; grep -E "x fa3|WRONG|Error" $A
