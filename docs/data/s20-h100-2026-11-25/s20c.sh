#!/usr/bin/env bash
# Session 20 H100 call c: call b's winners (o_flush 4) against the shipped records (single-level, biased)
# and the records' schedule with the copy in shared memory, one process per shape (abvar2.py); then the
# FP8 GPU tests (schedules with o_copy smem, the two-level tests with both copies).
export PYTHONUNBUFFERED=1 MLAGEN_OUT_DIR=/tmp/mlo PYTHONPATH=$PWD
D=docs/data/s20-h100-2026-11-25
W3=consumers=2,block_n=192,order=pingpong,pv_wait=early,scheduler=persistent,producer_regs=40,consumer_regs=232,swizzle_v=64,cluster=2,v_transpose=prepass,o_flush=4,o_copy=smem,diagonal=full
W1=consumers=2,block_n=128,q_operand=regs,producer_regs=56,consumer_regs=224,o_flush=4,o_copy=smem,diagonal=full
timeout 200 python3 $D/abvar2.py mla_prefill_sm90_fp8 D3 8 o_flush=4,o_copy=smem $W3 $W1 2>&1 | grep -v "^ *warn" | tee $OUT/c-abvar2.log
timeout 200 python3 $D/abvar2.py mla_prefill_sm90_fp8 D1 8 o_flush=4,o_copy=smem $W1 $W3 2>&1 | grep -v "^ *warn" | tee -a $OUT/c-abvar2.log
timeout 180 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_fp8_gpu.py -rxXs 2>&1 | tail -15 | tee $OUT/c-tests.log
