#!/usr/bin/env bash
# Session 19 H100 call l: without ping-pong, Q K^T issued before the wait for the previous tile's V
# (mla_prefill.cuh's overlapped loop), A/B against HEAD (the _base specs, device copy only), bf16 and FP8
# records on D3 and D1, 16 rounds.
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
timeout 300 python3 docs/data/s19-h100-2026-11-25/ab19.py D3,D1 16 2>&1 | grep -v "^ *warn" | tee $OUT/l-ab.log
