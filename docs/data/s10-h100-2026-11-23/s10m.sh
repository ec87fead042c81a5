#!/usr/bin/env bash
# Session 10 H100 call 13: the sparse call's host time by step (hostprof10.py), S1 and S6.
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 MLAGEN_OUT_DIR=/tmp/mlo
timeout 200 python3 .carry/prof/hostprof10.py S1 S6 > $OUT/host.log 2>&1; echo "rc=$?" >> $OUT/host.log
cat $OUT/host.log | head -80
