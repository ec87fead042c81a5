#!/usr/bin/env bash
# Session 18 H100 call i: S5 (H = 16, the per-GPU head count of DeepSeek-V3.2 at TP8) from the FP8
# cache: the fp8 compute mode (padded to 64 heads), the bf16 mode, the H <= 16 kernel in the bf16 mode,
# our bf16 kernel on the dequantized copy and the serving path (dequantize + FlashMLA padded to 64 heads).
export PYTHONUNBUFFERED=1 MLAGEN_OUT_DIR=/tmp/mlo PYTHONPATH=$PWD
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
env -u OUT bash shared/peers/flashmla/run_remote.sh > $OUT/i-flashmla-build.log 2>&1; echo "flashmla build rc=$?"
timeout 300 python3 -m mlagen.bench_sparse bench-fp8 --shapes S5 --formats fp8_v32,fp8_b64 --scales ue8m0 --rounds 3 --iters 20 > $OUT/i-bench-fp8.log 2>&1; echo "bench rc=$?"
tail -40 $OUT/i-bench-fp8.log
