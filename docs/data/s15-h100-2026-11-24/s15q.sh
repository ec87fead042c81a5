#!/usr/bin/env bash
# Session 15 H100 call q: the final tree: FP8 GPU tests with the new D1 record shipped, then bench_fp8 on D1/D3
# with FlashAttention-3's FP8 beside (the record dispatched as a user calls it).
export PYTHONUNBUFFERED=1 MLAGEN_OUT_DIR=/tmp/mlo PYTHONPATH=$PWD
timeout 200 python3 -m pytest -q tests/gpu/test_fp8_gpu.py tests/gpu/test_op_gpu.py > $OUT/q-tests.log 2>&1; echo "tests rc=$?"; tail -2 $OUT/q-tests.log
[ -f out/fa3_fp8/fa3_fp8_C.so ] || { python3 tools/fa3_fp8/build.py --no-copy-out > $OUT/q-fa3fp8-build.log 2>&1; echo "fa3 fp8 build rc=$?"; }
timeout 300 python3 -m mlagen.bench_fp8 --shapes D1,D3 --rounds 7 --fa3-fp8 2>&1 | grep -v "^ *warn" | tee $OUT/q-bench-fp8.log
# D3's record with diagonal=half (its last partial key tile on 48 keys) against the record
timeout 200 python3 -m mlagen.bench_fp8 --shapes D3 --rounds 15 --variant block_n=96,cluster=1,consumer_regs=160,consumers=3,epilogue=direct,load_warps=1,order=none,overlap=true,producer_regs=24,pv_wait=early,q_operand=smem,rescale=lazy,scheduler=dynamic,stages=3,swizzle_k=64,swizzle_q=64,swizzle_v=32,diagonal=half 2>&1 | grep -v "^ *warn" | tee $OUT/q-bench-fp8-d3half.log
