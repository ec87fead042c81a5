#!/usr/bin/env bash
# Session 23 (H200) call a: how far the unscaled FP8 path (fp8_b0 cache, compute="fp8") is from issue 10's
# 1.15x FlashMLA bar, next to the V3.2 format (fp8_v32), with FlashMLA built in the same command.
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 MLAGEN_OUT_DIR=/tmp/mlo
T0=$(date +%s); S=$OUT/summary.txt
el() { echo $(( $(date +%s)-T0 )); }
mkdir -p shared && { [ -d shared/peers ] || cp -r ../shared/peers shared/ 2>/dev/null; }
ls shared/peers/flashmla/build/*.so >/dev/null 2>&1 || (env -u OUT bash shared/peers/flashmla/run_remote.sh --jobs 8 > $OUT/flashmla-build.log 2>&1; echo "flashmla build rc=$? $(el)s" >> $S)
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv >> $S
timeout 400 python3 -m mlagen.bench_sparse bench-fp8 --shapes S1,S3 --formats fp8_b0,fp8_v32 --scales ue8m0 > $OUT/a-bench-fp8-b0.log 2>&1
echo "bench-fp8 rc=$? $(el)s" >> $S
cat $S; tail -20 $OUT/a-bench-fp8-b0.log
