#!/usr/bin/env bash
# Session 23 (H200) call d: the staging alone per route and per launch (after the mark kernel stores only where
# the mark is clear).
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 MLAGEN_OUT_DIR=/tmp/mlo
timeout 150 python3 docs/data/s23-h200-2026-11-29/stages.py S1 S3 big > $OUT/d-stages.log 2>&1; echo "rc=$?"
cut -c1-600 $OUT/d-stages.log | tail -12
