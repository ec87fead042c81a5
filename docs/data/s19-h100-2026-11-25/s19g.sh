#!/usr/bin/env bash
# Session 19 H100 call g: rowsum: mma (the FP8 softmax's row sums by an m64n8k32 wgmma of P and a column
# of ones beside P V): the FP8 GPU tests (its schedules added), then the records with it against the
# records as they are and the bf16 records as dispatched, one process.
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
timeout 330 python3 -m pytest -q -x -p no:cacheprovider tests/gpu/test_fp8_gpu.py 2>&1 | tail -15 | tee $OUT/g-tests.log
timeout 250 python3 docs/data/s19-h100-2026-11-25/abvar.py mla_prefill_sm90_fp8 D3,D1 10 rowsum=mma 2>&1 | grep -v "^ *warn" | tee $OUT/g-abvar.log
