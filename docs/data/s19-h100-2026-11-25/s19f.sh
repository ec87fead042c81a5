#!/usr/bin/env bash
# Session 19 H100 call f: exp2_fma (every n-th score group's exponential on the FMA pipes) on the FP8
# records, against the records themselves and the bf16 records as dispatched, one process.
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
timeout 500 python3 docs/data/s19-h100-2026-11-25/abvar.py mla_prefill_sm90_fp8 D3,D1 10 exp2_fma=4 exp2_fma=3 exp2_fma=2 2>&1 | grep -v "^ *warn" | tee $OUT/f-abvar.log
