#!/usr/bin/env bash
# Session 10 H100 call 15: `mlagen check --gpu` after its fix (a dense FP8 record is timed on FP8
# inputs; an fp8-cache sparse record on S1 read from its format).
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 MLAGEN_OUT_DIR=/tmp/mlo
timeout 300 python3 -m mlagen.cli check --gpu --junit $OUT/check-gpu.xml > $OUT/check-gpu.log 2>&1
echo "check --gpu rc=$?" >> $OUT/check-gpu.log
cat $OUT/check-gpu.log | tail -n 25
