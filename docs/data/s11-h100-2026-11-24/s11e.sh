#!/usr/bin/env bash
# Session 11 H100 call e: Nsight Compute on the H<=16 kernel with four producer warps (sq=1024, H=16), and the
# Q K^T group size / chain sweep on S5.
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 MLAGEN_OUT_DIR=/tmp/mlo
T0=$(date +%s); S=$OUT/summary.txt
el() { echo $(( $(date +%s)-T0 )); }
D=docs/data/s11-h100-2026-11-24; P=docs/data/s10-h100-2026-11-23
NCU=/usr/local/cuda/bin/ncu
timeout 300 $NCU --profile-from-start off --clock-control none --set full --import-source no -o /tmp/rep python3 $D/prof11.py > /tmp/ncu.log 2>&1
echo "ncu rc=$? $(el)s" >> $S; tail -1 /tmp/ncu.log >> $S
$NCU -i /tmp/rep.ncu-rep --csv --page raw > $OUT/raw.csv 2>> $S
$NCU -i /tmp/rep.ncu-rep --csv --page source --print-source sass --kernel-name regex:h16 > $OUT/source-h16.csv 2>> $S
python3 $P/ncu9.py $OUT/raw.csv >> $S 2>&1
timeout 200 python3 $D/h16sweep.py all s5only > $OUT/sweep.log 2>&1; echo "sweep rc=$? $(el)s" >> $S
cat $S; cat $OUT/sweep.log
