#!/usr/bin/env bash
# Session 17 H100 call b: the key-scale table padded for 64- and 32-value scale blocks (the folds'
# loads were 2- / 4-way bank conflicts). The fp8-mode GPU tests again; bench-fp8 on S1 / S3 for
# fp8_v32, fp8_b64, fp8_b32; the compute="fp8" case matrix with its errors per case (verify-fp8);
# a tune of the fp8 spec on S1's fp8_b64 and fp8_b32 classes.
export PYTHONUNBUFFERED=1 MLAGEN_OUT_DIR=/tmp/mlo PYTHONPATH=$PWD
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
( env -u OUT bash shared/peers/flashmla/run_remote.sh > $OUT/b-flashmla-build.log 2>&1; echo "flashmla rc=$?" >> $OUT/b-flashmla-build.log ) &
timeout 200 python3 -m pytest -q tests/gpu/test_sparse_fp8_compute_gpu.py -p no:cacheprovider > $OUT/b-tests.log 2>&1; echo "tests rc=$?"
grep -E "passed|failed|FAILED|Error" $OUT/b-tests.log | tail -25
wait; tail -n 1 $OUT/b-flashmla-build.log
timeout 200 python3 -m mlagen.bench_sparse bench-fp8 --shapes S1,S3 --formats fp8_v32,fp8_b64,fp8_b32 --scales ue8m0 \
  --rounds 3 --iters 20 > $OUT/b-bench-fp8.log 2>&1; echo "bench-fp8 rc=$?"
grep -A12 'compute="fp8"' $OUT/b-bench-fp8.log | tail -n 8
timeout 120 python3 -m mlagen.bench_sparse verify-fp8 --compute fp8 > $OUT/b-verify.log 2>&1; echo "verify rc=$?"; tail -n 3 $OUT/b-verify.log
timeout 200 python3 -m mlagen.cli tune mla_sparse_prefill_sm90_fp8 --shape sq=4096,h=128,topk=2048,skv=8192,kv=fp8_b64,compute=fp8 \
  --shape sq=4096,h=128,topk=2048,skv=8192,kv=fp8_b32,compute=fp8 --db $OUT/b-tune.sqlite --no-progress > $OUT/b-tune.log 2>&1
echo "tune rc=$?"; grep -v "^  *[0-9]* *|" $OUT/b-tune.log | tail -n 30
