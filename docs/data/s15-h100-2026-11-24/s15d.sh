#!/usr/bin/env bash
# Session 15 H100 call d: FlashAttention-3's FP8 forward (tools/fa3_fp8) built, then bench_fp8 on D1 and D3
# with it beside our FP8 and bf16 calls.
export PYTHONUNBUFFERED=1 MLAGEN_OUT_DIR=/tmp/mlo PYTHONPATH=$PWD
python3 tools/fa3_fp8/build.py --no-copy-out > $OUT/fa3fp8-build.log 2>&1; echo "fa3 fp8 build rc=$?"
grep -E "rc=|registers|spill|linked" $OUT/fa3fp8-build.log
cp out/fa3_fp8/*.log $OUT/ 2>/dev/null
timeout 420 python3 -m mlagen.bench_fp8 --shapes D1,D3 --rounds 5 --fa3-fp8 2>&1 | grep -v "^ *warn" | tee $OUT/bench-fp8-fa3.log
