#!/usr/bin/env bash
# 2x H200: D1 tune on one GPU vs two (cold and warm compile cache), then the GPU tune tests.
set -u; export PYTHONPATH=$PWD PYTHONUNBUFFERED=1; T=$(mktemp -d); A="mla_prefill_sm90 --shape D1 --max-trials 80 --seed 1 --no-progress"
{ nvidia-smi -L; nproc; git log -1 --oneline 2>/dev/null; } > $OUT/env.txt 2>&1
run(){ # name devices: fresh database and out dir each; compile cache $CACHE
  local t0=$EPOCHREALTIME rc
  MLAGEN_OUT_DIR=$T/$1 MLAGEN_CACHE_DIR=$CACHE timeout 140 python3 -m mlagen.cli tune $A --devices $2 --db $T/$1.sqlite > $OUT/$1.log 2>&1; rc=$?
  local w=$(awk "BEGIN{printf \"%.1f\", $EPOCHREALTIME-$t0}")
  echo "$1 devices=$2 rc=$rc wall_s=$w final=$(grep -m1 'final \*' $OUT/$1.log | awk '{print $3, $NF}') $(grep -o '[0-9]* of [0-9]* trials were measured ahead' $OUT/$1.log)" | tee -a $OUT/summary.txt
}
CACHE=$T/cache1 run cold_1gpu 0
CACHE=$T/cache2 run cold_2gpu 0,1
mkdir -p $T/warm; cp -r $T/cache1/. $T/warm/; cp -rn $T/cache2/. $T/warm/
CACHE=$T/warm run warm_1gpu 0
CACHE=$T/warm run warm_2gpu 0,1
awk '{for(i=1;i<=NF;i++)if($i~/^wall_s=/){split($i,a,"=");w[$1]=a[2]}} END{printf "ratio cold %.3f  warm %.3f\n", w["cold_2gpu"]/w["cold_1gpu"], w["warm_2gpu"]/w["warm_1gpu"]}' $OUT/summary.txt | tee -a $OUT/summary.txt
MLAGEN_OUT_DIR=$T/t timeout 200 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_tune_gpu.py 2>&1 | tail -4 | tee -a $OUT/summary.txt
