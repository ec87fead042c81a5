#!/usr/bin/env bash
# Session 19 H100 call d: the softmax's lazy check without the quad shuffles and its row maximum as a
# tree (online_softmax.cuh), A/B against HEAD's kernels (bf16 and FP8 records, D1 and D3) in one
# process; the _base specs are installed in this copy of the tree only.
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
set -o pipefail
nvidia-smi --query-gpu=name,driver_version,clocks.sm,power.draw --format=csv | tee $OUT/d-gpu.txt
timeout 400 python3 docs/data/s19-h100-2026-11-25/ab19.py D3,D1 8 2>&1 | grep -v "^ *warn" | tee $OUT/d-ab.log
