#!/usr/bin/env bash
# Session 12 H100 call a: A/B of the half first key tile (diagonal=half) on the shipped records
# against FA3 (same process), then the GPU schedule tests of the option.
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 MLAGEN_OUT_DIR=/tmp/mlo
D=docs/data/s12-h100-2026-11-24
T0=$(date +%s); S=$OUT/summary.txt
el() { echo $(( $(date +%s)-T0 )); }
{ nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv,noheader; python3 -c "import torch; print('torch', torch.__version__, 'cudnn', torch.backends.cudnn.version())"; } >> $S 2>&1
env -u OUT python3 shared/peers/fa3/build_fa3.py --build-dir shared/peers/fa3/build > /tmp/fa3build.log 2>&1; echo "fa3 build rc=$? $(el)s" >> $S
tail -3 /tmp/fa3build.log
P=mla_prefill_sm90_causal
D6=${P}_c2_n128_s2_qsmem_opingpong_ov1_rslazy_pwearly_schdynamic_epvtma_lw1_rp24_rc208_sq128_sk128_sv128_cl1_dgfull
D7=${P}_c2_n128_s2_qsmem_opingpong_ov1_rsoverlapped_pwearly_schdynamic_eptma_lw2_rp24_rc240_sq128_sk128_sv128_cl1_dgfull
C3=${P}_c3_n80_s3_qsmem_onone_ov1_rslazy_pwearly_schdynamic_eptma_lw1_rp24_rc160_sq128_sk128_sv128_cl1_dgfull
A=$OUT/ab.log
for job in "D6 rec@$D6 half@$D6:diagonal=half rec2@$D6 half2@$D6:diagonal=half" "D7 rec@$D7 half@$D7:diagonal=half" "D2 rec@$D7 half@$D7:diagonal=half" "D1 rec@$C3 half@$C3:diagonal=half"; do
  timeout 100 python3 $D/ab_env.py $job >> $A 2>&1; echo "ab ${job%% *} rc=$? $(el)s" >> $S
done
cat $A
timeout 240 python3 -m pytest -q tests/gpu/test_mla_prefill_gpu.py tests/gpu/test_fp8_gpu.py -k "diagonal" -p no:cacheprovider > $OUT/tests.log 2>&1
echo "tests rc=$? $(el)s" >> $S
cat $S; tail -5 $OUT/tests.log
