#!/usr/bin/env bash
# Session 17 H100 call c: an experiment (working tree only, not committed): fp8_v32 through the f16
# exchange too (kF16Exchange = kNB >= 4: P handed over as f16, each consumer forms its own column
# blocks' P'; the last remote P V drained before the next Q K^T). A/B against the committed
# kernel (HEAD, installed as mla_sparse_prefill_sm90_fp8_base), the fp8-mode GPU tests.
export PYTHONUNBUFFERED=1 MLAGEN_OUT_DIR=/tmp/mlo PYTHONPATH=$PWD
git log --oneline | head -2
python3 tools/ab_install.py mla_sparse_prefill_sm90_fp8 HEAD > /dev/null || echo "ab_install failed"
sed "s/ROUNDS, CALLS = 7, 5/ROUNDS, CALLS = 5, 5/" docs/data/s14-h100-2026-11-24/ab14.py > /tmp/ab17.py
timeout 150 python3 /tmp/ab17.py > $OUT/c-ab.log 2>&1; echo "ab rc=$?"
grep -v "^ *warn" $OUT/c-ab.log | tail -n 9
python3 tools/ab_install.py mla_sparse_prefill_sm90_fp8 --remove > /dev/null
timeout 200 python3 -m pytest -q tests/gpu/test_sparse_fp8_compute_gpu.py -p no:cacheprovider > $OUT/c-tests.log 2>&1; echo "tests rc=$?"
grep -E "passed|failed|FAILED|Error" $OUT/c-tests.log | tail -12
