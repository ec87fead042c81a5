#!/usr/bin/env bash
# Session 18 H100 call l: the whole GPU suite on the final tree (c197248), then bench_fp8 on D1 / D3
# as users call it (the shipped records dispatched).
export PYTHONUNBUFFERED=1 MLAGEN_OUT_DIR=/tmp/mlo PYTHONPATH=$PWD
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
timeout 520 python3 -m pytest -q -p no:cacheprovider tests/gpu > $OUT/l-gpu-tests.log 2>&1; echo "gpu tests rc=$?"
grep -E "passed|failed|^FAILED|^ERROR" $OUT/l-gpu-tests.log | tail -15
timeout 60 python3 -m mlagen.bench_fp8 --shapes D1,D3 --rounds 7 --iters 10 > $OUT/l-bench-fp8.log 2>&1; echo "bench rc=$?"
tail -8 $OUT/l-bench-fp8.log
