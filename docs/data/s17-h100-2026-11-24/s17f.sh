#!/usr/bin/env bash
# Session 17 H100 call f: the latent chains of 64- and 32-value scale blocks pipelined in two key
# halves (one half's fold under the other's wgmma). A/B in one process against the committed kernel
# (installed locally with tools/ab_install.py ... HEAD and carried as untracked files), fp8_b64 and
# fp8_b32 on S1 and S3; the fp8-mode GPU tests.
export PYTHONUNBUFFERED=1 MLAGEN_OUT_DIR=/tmp/mlo PYTHONPATH=$PWD
D=docs/data/s17-h100-2026-11-24
timeout 200 python3 $D/ab17f.py fp8_b64,fp8_b32 > $OUT/f-ab.log 2>&1; echo "ab rc=$?"
grep -v "^ *warn" $OUT/f-ab.log | tail -n 12
timeout 200 python3 -m pytest -q tests/gpu/test_sparse_fp8_compute_gpu.py -p no:cacheprovider > $OUT/f-tests.log 2>&1; echo "tests rc=$?"
grep -E "passed|failed|FAILED|Error" $OUT/f-tests.log | tail -12
