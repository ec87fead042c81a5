#!/usr/bin/env bash
# Session 14 H100 call i (the shipped kernel, 927c246; the script of session 13 call j): Nsight Compute (full set, SASS source page) of the sparse fp8 compute mode
# (fp8_v32 and fp8_b0 caches) and of the bf16 kernel on the bf16 copy.
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 MLAGEN_OUT_DIR=/tmp/mlo
D=docs/data/s13-h100-2026-11-24
NCU=/usr/local/cuda/bin/ncu
timeout 300 $NCU --profile-from-start off --clock-control none --set full --import-source no -o /tmp/rep python3 $D/prof13.py > /tmp/ncu.log 2>&1
echo "ncu rc=$?"; tail -3 /tmp/ncu.log
$NCU -i /tmp/rep.ncu-rep --csv --page raw > $OUT/raw.csv
$NCU -i /tmp/rep.ncu-rep --csv --page source --print-source sass --kernel-name regex:fp8_v32 > $OUT/source-v32.csv
$NCU -i /tmp/rep.ncu-rep --csv --page source --print-source sass --kernel-name regex:fp8_b0 > $OUT/source-b0.csv
python3 $D/ncu9.py $OUT/raw.csv > $OUT/ncu-summary.txt 2>&1; head -40 $OUT/ncu-summary.txt
python3 $D/src_stalls.py $OUT/source-v32.csv 50 > $OUT/stalls-v32.txt 2>&1; cut -c1-220 $OUT/stalls-v32.txt
python3 $D/src_stalls.py $OUT/source-b0.csv 30 > $OUT/stalls-b0.txt 2>&1; cut -c1-200 $OUT/stalls-b0.txt | head -32
