#!/usr/bin/env bash
# Session 9 H100 call 1: lazy-maximum GPU tests, FA3 build, A/B of each shipped record with rescale=lazy.
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 MLAGEN_OUT_DIR=/tmp/mlo
T0=$(date +%s); S=$OUT/summary.txt
el() { echo $(( $(date +%s)-T0 )); }
{ nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv,noheader; python3 -c "import torch; print('torch', torch.__version__, 'cudnn', torch.backends.cudnn.version())"; } >> $S 2>&1
(env -u OUT python3 shared/peers/fa3/build_fa3.py --build-dir shared/peers/fa3/build > /tmp/fa3build.log 2>&1; echo "fa3 build rc=$? $(el)s" >> $S) &
timeout 300 python3 -m pytest -q -x tests/gpu/test_mla_prefill_gpu.py tests/gpu/test_fp8_gpu.py -k "lazy or schedules" -p no:cacheprovider > $OUT/tests.log 2>&1
echo "tests rc=$? $(el)s" >> $S
wait
P=mla_prefill_sm90_causal
C3=${P}_c3_n80_s3_qsmem_onone_ov1_rsoverlapped_pwearly_schdynamic_eptma_lw1_rp24_rc160_sq128_sk128_sv128_cl1
C3N=mla_prefill_sm90_none_c3_n80_s3_qsmem_onone_ov1_rsoverlapped_pwearly_schdynamic_eptma_lw1_rp24_rc160_sq128_sk128_sv128_cl1
A=$OUT/ab.log
for job in "D1 rec@$C3 lazy@$C3:rescale=lazy" "D3 rec@$C3N lazy@$C3N:rescale=lazy" "D5 rec@$C3 lazy@$C3:rescale=lazy" "D4 rec@$C3 lazy@$C3:rescale=lazy"; do
  timeout 75 python3 .carry/prof/ab_env.py $job >> $A 2>&1; echo "ab ${job%% *} rc=$? $(el)s" >> $S
done
cat $S; tail -3 $OUT/tests.log; grep -E "x fa3|WRONG|Error" $A
