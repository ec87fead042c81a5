#!/usr/bin/env bash
# Session 8: SM clock and power while FA3 and mlagen run (is mlagen's extra instruction count paid in clock?).
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 MLAGEN_OUT_DIR=/tmp/mlo
env -u OUT python3 shared/peers/fa3/build_fa3.py --build-dir shared/peers/fa3/build > /tmp/fa3build.log 2>&1; echo "fa3 build rc=$?"
nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu,clocks_throttle_reasons.active --format=csv,noheader -lms 20 > $OUT/smi.csv 2>&1 &
SMI=$!
timeout 200 python3 .carry/prof/powerclk.py D1 D3 D6 > $OUT/powerclk.log 2>&1; echo "powerclk rc=$?"
kill $SMI; cp /tmp/blocks.json $OUT/blocks.json; wc -l $OUT/smi.csv; tail -3 $OUT/powerclk.log
