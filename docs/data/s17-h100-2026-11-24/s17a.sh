#!/usr/bin/env bash
# Session 17 H100 call a: the fp8 compute mode with 64- and 32-value scale blocks (P exchanged as f16).
# The fp8-mode GPU tests (b64 / b32 now in the case matrix), memcheck on fuzzed b64 / b32 cases,
# an A/B of the V3.2 (fp8_v32) and unscaled kernels against the committed ones (2e1f4ac), and
# bench-fp8 on S1 / S3 for fp8_v32, fp8_b64, fp8_b32 (FlashMLA built for the bar's ratio).
export PYTHONUNBUFFERED=1 MLAGEN_OUT_DIR=/tmp/mlo PYTHONPATH=$PWD
D=docs/data/s17-h100-2026-11-24
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
( env -u OUT bash shared/peers/flashmla/run_remote.sh > $OUT/a-flashmla-build.log 2>&1; echo "flashmla rc=$?" >> $OUT/a-flashmla-build.log ) &
timeout 260 python3 -m pytest -q tests/gpu/test_sparse_fp8_compute_gpu.py -p no:cacheprovider > $OUT/a-tests.log 2>&1; echo "tests rc=$?"
grep -E "passed|failed|FAILED|Error" $OUT/a-tests.log | tail -25
CS=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
timeout 100 $CS --tool memcheck --report-api-errors no python3 $D/sanitize17.py > $OUT/a-sanitize.log 2>&1
echo "memcheck rc=$?"; grep -E "ERROR SUMMARY|^[0-9] " $OUT/a-sanitize.log | head
wait; tail -n 1 $OUT/a-flashmla-build.log
python3 tools/ab_install.py mla_sparse_prefill_sm90_fp8 2e1f4ac > /dev/null || echo "ab_install failed"
sed "s/ROUNDS, CALLS = 7, 5/ROUNDS, CALLS = 5, 5/" docs/data/s14-h100-2026-11-24/ab14.py > /tmp/ab17.py  # (as run: a copy, 5 rounds)
timeout 120 python3 /tmp/ab17.py > $OUT/a-ab.log 2>&1; echo "ab rc=$?"
grep -v "^ *warn" $OUT/a-ab.log | tail -n 9
python3 tools/ab_install.py mla_sparse_prefill_sm90_fp8 --remove > /dev/null
timeout 200 python3 -m mlagen.bench_sparse bench-fp8 --shapes S1,S3 --formats fp8_v32,fp8_b64,fp8_b32 --scales ue8m0 \
  --rounds 3 --iters 20 > $OUT/a-bench-fp8.log 2>&1; echo "bench-fp8 rc=$?"
grep -A12 'compute="fp8"' $OUT/a-bench-fp8.log | tail -n 10
