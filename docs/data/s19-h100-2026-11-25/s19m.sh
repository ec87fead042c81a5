#!/usr/bin/env bash
# Session 19 H100 call m: turns for three consumer warpgroups (order: pingpong as a ring), forced on the
# FP8 and bf16 records against the records themselves (order: none), one process per spec.
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
timeout 200 python3 docs/data/s19-h100-2026-11-25/abvar.py mla_prefill_sm90_fp8 D3,D1 10 order=pingpong 2>&1 | grep -v "^ *warn" | tee $OUT/m-abvar-fp8.log
timeout 200 python3 docs/data/s19-h100-2026-11-25/abvar.py mla_prefill_sm90 D3,D1 10 order=pingpong 2>&1 | grep -v "^ *warn" | tee $OUT/m-abvar-bf16.log
