#!/usr/bin/env bash
# Session 12 H100 call k: Nsight Compute (full set, SASS source page) of the H <= 16 kernel on an fp8_v32
# cache (raw rows copied into the ring three slots ahead, dequantized in place) and on its bf16 copy.
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 MLAGEN_OUT_DIR=/tmp/mlo
D=docs/data/s12-h100-2026-11-24
NCU=/usr/local/cuda/bin/ncu
timeout 240 $NCU --profile-from-start off --clock-control none --set full --import-source no -o /tmp/rep python3 $D/prof12.py > /tmp/ncu.log 2>&1
echo "ncu rc=$?"; tail -2 /tmp/ncu.log
$NCU -i /tmp/rep.ncu-rep --csv --page raw > $OUT/raw.csv
$NCU -i /tmp/rep.ncu-rep --csv --page source --print-source sass --kernel-name regex:fp8 > $OUT/source-fp8.csv
python3 $D/ncu9.py $OUT/raw.csv > $OUT/ncu-summary.txt 2>&1; head -40 $OUT/ncu-summary.txt
python3 $D/src_stalls.py $OUT/source-fp8.csv 45 > $OUT/stalls-fp8.txt 2>&1; cat $OUT/stalls-fp8.txt | cut -c1-200
