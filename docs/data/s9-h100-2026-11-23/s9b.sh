#!/usr/bin/env bash
# Session 9 H100 call 2: lazy maximum on the two-consumer records (D2, D6, D7), and D1/D3/D4 again.
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 MLAGEN_OUT_DIR=/tmp/mlo
T0=$(date +%s); S=$OUT/summary.txt
el() { echo $(( $(date +%s)-T0 )); }
[ -d shared/peers/fa3/build ] && ls shared/peers/fa3/build | head -2 >> $S
python3 -c "import sys; sys.path.insert(0,'shared/peers/fa3/build'); " 2>>$S
(env -u OUT python3 shared/peers/fa3/build_fa3.py --build-dir shared/peers/fa3/build > /tmp/fa3build.log 2>&1; echo "fa3 build rc=$? $(el)s" >> $S)
P=mla_prefill_sm90_causal
C3=${P}_c3_n80_s3_qsmem_onone_ov1_rsoverlapped_pwearly_schdynamic_eptma_lw1_rp24_rc160_sq128_sk128_sv128_cl1
C3N=mla_prefill_sm90_none_c3_n80_s3_qsmem_onone_ov1_rsoverlapped_pwearly_schdynamic_eptma_lw1_rp24_rc160_sq128_sk128_sv128_cl1
D2REC=${P}_c2_n128_s2_qsmem_opingpong_ov1_rsoverlapped_pwearly_schdynamic_eptma_lw2_rp24_rc240_sq128_sk128_sv128_cl1
D6REC=${P}_c2_n128_s2_qsmem_opingpong_ov1_rsoverlapped_pwearly_schdynamic_epvtma_lw1_rp24_rc208_sq128_sk128_sv128_cl1
A=$OUT/ab.log
for job in "D2 rec@$D2REC lazy@$D2REC:rescale=lazy" "D7 rec@$D2REC lazy@$D2REC:rescale=lazy" "D6 rec@$D6REC lazy@$D6REC:rescale=lazy" "D1 rec@$C3 lazy@$C3:rescale=lazy" "D3 rec@$C3N lazy@$C3N:rescale=lazy" "D4 rec@$C3 lazy@$C3:rescale=lazy" "b=1,q=8192,h=64,causal rec@$C3 lazy@$C3:rescale=lazy"; do
  timeout 75 python3 .carry/prof/ab_env.py $job >> $A 2>&1; echo "ab ${job%% *} rc=$? $(el)s" >> $S
done
cat $S; grep -E "x fa3|WRONG|Error" $A | sed 's/ causal_c[23]_n[0-9]*_s[23]_qsmem_o[a-z]*_ov1_rs\([a-z]*\)_pwearly_schdynamic_ep\([a-z]*\)_lw\([12]\)_rp24_rc\([0-9]*\)_sq128_sk128_sv128_cl1/ \1 \2/; s/ none_c3.*rs\([a-z]*\)_pw.*/ \1/'
