#!/usr/bin/env bash
# Session 20 H100 call h: the public call on the final records again (call e's rounds spread 15-25%),
# with FlashAttention-3's FP8 forward built in the same command.
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
export PYTHONUNBUFFERED=1 MLAGEN_OUT_DIR=/tmp/mlo PYTHONPATH=$PWD
python3 tools/fa3_fp8/build.py --no-copy-out > $OUT/h-fa3fp8-build.log 2>&1; echo "fa3 fp8 build rc=$?"
timeout 300 python3 -m mlagen.bench_fp8 --shapes D1,D3 --rounds 15 --iters 10 --fa3-fp8 > $OUT/h-bench-fp8.log 2>&1; echo "bench rc=$?"; tail -14 $OUT/h-bench-fp8.log
