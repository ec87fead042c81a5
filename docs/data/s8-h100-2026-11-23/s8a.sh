#!/usr/bin/env bash
# Session 8 H100 call: the persistent scheduler's snake deal. FA3 built; the dense GPU tests after
# the kernel change; A/B against FA3; the dense table of the shipped records end to end.
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 MLAGEN_OUT_DIR=/tmp/mlo
T0=$(date +%s); S=$OUT/summary.txt
el() { echo $(( $(date +%s)-T0 )); }
{ nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv,noheader; python3 -c "import torch; print('torch', torch.__version__, 'cudnn', torch.backends.cudnn.version())"; git log --oneline -1; } >> $S 2>&1
(env -u OUT nice python3 shared/peers/fa3/build_fa3.py --build-dir shared/peers/fa3/build > /tmp/fa3build.log 2>&1; echo "fa3 build rc=$? $(el)s" >> $S) &
timeout 290 python3 -m pytest -q -p no:cacheprovider -rs tests/gpu --ignore=tests/gpu/test_sparse_fp8_gpu.py --ignore=tests/gpu/test_bench_sparse_gpu.py ${GPUTESTS_K:+-k "$GPUTESTS_K"} > $OUT/gpu-tests.log 2>&1
echo "gpu tests rc=$? $(el)s $(tail -1 $OUT/gpu-tests.log)" >> $S
wait
A=$OUT/ab.log
P=mla_prefill_sm90_causal_c2_n128_s2_qsmem_opingpong_ov1_rsoverlapped_pwearly
D7REC=${P}_schpersistent_epdirect_lw1_rp56_rc224_sq128_sk128_sv128_cl1
D2REC=${P}_schdynamic_eptma_lw2_rp24_rc240_sq128_sk128_sv128_cl1
D6REC=${P}_schdynamic_epvtma_lw1_rp24_rc208_sq128_sk128_sv128_cl1
jobs=(
 "D7 stride=MLAGEN_TILE_DEAL=stride snakeg2=MLAGEN_HEAD_GROUP=2 dyn@$D7REC:scheduler=dynamic dyng4=MLAGEN_HEAD_GROUP=4@$D7REC:scheduler=dynamic dyn2@$D2REC"
 "D2 pers@$D2REC:scheduler=persistent persd7@$D7REC"
 "D4 c2@$D2REC c2v@$D6REC g4=MLAGEN_HEAD_GROUP=4"
 "D6 pers@$D6REC:scheduler=persistent"
 "D1 pers@$D2REC:scheduler=persistent"
)
for job in "${jobs[@]}"; do
  [ $(el) -gt 420 ] && { echo "skip ab ${job%% *} (time)" >> $S; continue; }
  timeout 70 python3 .carry/prof/ab_env.py $job >> $A 2>&1; echo "ab ${job%% *} rc=$? $(el)s" >> $S
done
if [ $(el) -lt 470 ]; then
  timeout 110 python3 -m mlagen.cli bench --shapes D1,D2,D3,D4,D5,D6,D7 --peers fa3,cudnn,mlagen,mlagen-check --rounds 5 --markdown $OUT/bench.md > $OUT/bench.log 2>&1
  echo "bench rc=$? $(el)s" >> $S
fi
cat $S; grep -E "FAILED|ERROR" $OUT/gpu-tests.log | head; grep -E "x fa3|WRONG|Error" $A
