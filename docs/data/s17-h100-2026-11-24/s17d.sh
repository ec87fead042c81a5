#!/usr/bin/env bash
# Session 17 H100 call d: the review's changes (a producer named barrier before the gathers that
# refill the pair's buffers; consumer 1 hands P to consumer 0 before its local P V; the drained
# f16-path consumers free their V^T buffers at once; vector loads in the NB > 4 factor stores; the
# growth factors read once per column block). The fp8-mode GPU tests; A/B of fp8_v32 / fp8_b0
# against the session's starting kernel (2e1f4ac); bench-fp8 for fp8_v32 / b64 / b32 on S1 / S3.
export PYTHONUNBUFFERED=1 MLAGEN_OUT_DIR=/tmp/mlo PYTHONPATH=$PWD
( env -u OUT bash shared/peers/flashmla/run_remote.sh > $OUT/d-flashmla-build.log 2>&1; echo "flashmla rc=$?" >> $OUT/d-flashmla-build.log ) &
timeout 200 python3 -m pytest -q tests/gpu/test_sparse_fp8_compute_gpu.py -p no:cacheprovider > $OUT/d-tests.log 2>&1; echo "tests rc=$?"
grep -E "passed|failed|FAILED|Error" $OUT/d-tests.log | tail -12
wait; tail -n 1 $OUT/d-flashmla-build.log
python3 tools/ab_install.py mla_sparse_prefill_sm90_fp8 2e1f4ac > /dev/null || echo "ab_install failed"
sed "s/ROUNDS, CALLS = 7, 5/ROUNDS, CALLS = 5, 5/" docs/data/s14-h100-2026-11-24/ab14.py > /tmp/ab17.py
timeout 150 python3 /tmp/ab17.py > $OUT/d-ab.log 2>&1; echo "ab rc=$?"
grep -v "^ *warn" $OUT/d-ab.log | tail -n 9
python3 tools/ab_install.py mla_sparse_prefill_sm90_fp8 --remove > /dev/null
timeout 200 python3 -m mlagen.bench_sparse bench-fp8 --shapes S1,S3 --formats fp8_v32,fp8_b64,fp8_b32 --scales ue8m0 \
  --rounds 3 --iters 20 > $OUT/d-bench-fp8.log 2>&1; echo "bench-fp8 rc=$?"
grep -A12 'compute="fp8"' $OUT/d-bench-fp8.log | tail -n 8
