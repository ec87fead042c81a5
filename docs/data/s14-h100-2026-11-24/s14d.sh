#!/usr/bin/env bash
# Session 14 H100 call d (and later variants): f8check (fp8 case matrix + S1/S3 timing) only.
export PYTHONUNBUFFERED=1 MLAGEN_OUT_DIR=/tmp/mlo PYTHONPATH=$PWD
timeout 240 python3 docs/data/s13-h100-2026-11-24/f8check.py --time > $OUT/f8check.log 2>&1; echo "f8check rc=$?"
grep -E "FAIL|correctness|^S[13]|rror" $OUT/f8check.log | head -40
