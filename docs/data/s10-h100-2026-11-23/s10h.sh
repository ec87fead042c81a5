#!/usr/bin/env bash
# Session 10 H100 call 8: Nsight Compute on the sparse kernel from the FP8 cache (bf16 mode, UE8M0
# scales) and on its bf16 copy, sq=1024 h=128 topk=2048 skv=8192: stall reasons, and per-instruction
# stall samples of the FP8 kernel (where does its producer wait?).
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 MLAGEN_OUT_DIR=/tmp/mlo
T0=$(date +%s); S=$OUT/summary.txt
el() { echo $(( $(date +%s)-T0 )); }
NCU=/usr/local/cuda/bin/ncu
timeout 300 $NCU --profile-from-start off --clock-control none --set full --import-source no -o /tmp/rep python3 .carry/prof/prof10.py > /tmp/ncu.log 2>&1
echo "ncu rc=$? $(el)s" >> $S; tail -3 /tmp/ncu.log >> $S
$NCU -i /tmp/rep.ncu-rep --csv --page raw > $OUT/raw.csv 2>> $S
$NCU -i /tmp/rep.ncu-rep --csv --page source --print-source sass --kernel-name regex:fp8 > $OUT/source-fp8.csv 2>> $S
$NCU -i /tmp/rep.ncu-rep --csv --page source --print-source sass --kernel-name regex:bf16 > $OUT/source-bf16.csv 2>> $S
python3 .carry/prof/ncu9.py $OUT/raw.csv >> $S 2>&1
ls -la $OUT >> $S
cat $S
