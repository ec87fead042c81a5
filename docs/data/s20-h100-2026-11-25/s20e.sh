#!/usr/bin/env bash
# Session 20 H100 call e: the public call as users write it on the final records (bench_fp8, every
# candidate checked against float32) with FlashAttention-3's FP8 forward built in the same command; then
# vbias.py on the shipped records (and FA3's FP8 forward on the same operands); the FP8 test file again
# (its one test changed after call d: the transposes' c3 schedule with the copy in shared memory).
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
export PYTHONUNBUFFERED=1 MLAGEN_OUT_DIR=/tmp/mlo PYTHONPATH=$PWD
python3 tools/fa3_fp8/build.py --no-copy-out > $OUT/e-fa3fp8-build.log 2>&1; echo "fa3 fp8 build rc=$?"
timeout 200 python3 -m mlagen.bench_fp8 --shapes D1,D3 --rounds 9 --iters 10 --fa3-fp8 > $OUT/e-bench-fp8.log 2>&1; echo "bench rc=$?"; tail -14 $OUT/e-bench-fp8.log
timeout 120 python3 docs/data/s19-h100-2026-11-25/vbias.py --fa3 2>&1 | grep -v "^ *warn" | tee $OUT/e-vbias.log
timeout 150 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_fp8_gpu.py -rxXs 2>&1 | tail -4 | tee $OUT/e-fp8-tests.log
