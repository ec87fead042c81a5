#!/usr/bin/env bash
# Session 19 H100 call k: bench_fp8 on the final kernels as users call it (the shipped records
# dispatched), with FlashAttention-3's FP8 forward built in the same command beside it.
export PYTHONUNBUFFERED=1 MLAGEN_OUT_DIR=/tmp/mlo PYTHONPATH=$PWD
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
python3 tools/fa3_fp8/build.py --no-copy-out > $OUT/k-fa3fp8-build.log 2>&1; echo "fa3 fp8 build rc=$?"
tail -3 $OUT/k-fa3fp8-build.log
timeout 200 python3 -m mlagen.bench_fp8 --shapes D1,D3 --rounds 9 --iters 10 --fa3-fp8 > $OUT/k-bench-fp8.log 2>&1; echo "bench rc=$?"
tail -14 $OUT/k-bench-fp8.log
