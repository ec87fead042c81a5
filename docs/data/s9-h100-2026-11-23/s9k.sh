#!/usr/bin/env bash
# Session 9 H100 call 11: the lazy maximum decided per row (no vote) against the warp vote, c2 and c3 records.
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 MLAGEN_OUT_DIR=/tmp/mlo
T0=$(date +%s); S=$OUT/summary.txt
el() { echo $(( $(date +%s)-T0 )); }
env -u OUT python3 shared/peers/fa3/build_fa3.py --build-dir shared/peers/fa3/build > /tmp/fa3build.log 2>&1; echo "fa3 build rc=$? $(el)s" >> $S
P=mla_prefill_sm90_causal
C3=${P}_c3_n80_s3_qsmem_onone_ov1_rslazy_pwearly_schdynamic_eptma_lw1_rp24_rc160_sq128_sk128_sv128_cl1
C3N=mla_prefill_sm90_none_c3_n80_s3_qsmem_onone_ov1_rslazy_pwearly_schdynamic_eptma_lw1_rp24_rc160_sq128_sk128_sv128_cl1
D2REC=${P}_c2_n128_s2_qsmem_opingpong_ov1_rsoverlapped_pwearly_schdynamic_eptma_lw2_rp24_rc240_sq128_sk128_sv128_cl1
D6REC=${P}_c2_n128_s2_qsmem_opingpong_ov1_rsoverlapped_pwearly_schdynamic_epvtma_lw1_rp24_rc208_sq128_sk128_sv128_cl1
A=$OUT/ab.log
for job in "D2 rec@$D2REC vote@$D2REC:rescale=lazy row@$D2REC:rescale=lazy_row" "D7 rec@$D2REC vote@$D2REC:rescale=lazy row@$D2REC:rescale=lazy_row" "D6 rec@$D6REC vote@$D6REC:rescale=lazy row@$D6REC:rescale=lazy_row" "D1 vote@$C3 row@$C3:rescale=lazy_row" "D3 vote@$C3N row@$C3N:rescale=lazy_row"; do
  timeout 75 python3 .carry/prof/ab_env.py $job >> $A 2>&1; echo "ab ${job%% *} rc=$? $(el)s" >> $S
done
cat $S; grep -E "x fa3|WRONG|Error" $A | awk '{print $1,$2,$(NF-6),$(NF-5),$(NF-4),$(NF-3)}'
