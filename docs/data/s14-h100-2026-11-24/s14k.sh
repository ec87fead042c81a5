#!/usr/bin/env bash
# Session 14 H100 call k: the transposed P V with four gather buffers for fp8_b0 (ab_ot/, installed
# in this copy only) against the shipped fp8-mode kernel (ab_ot.py).
export PYTHONUNBUFFERED=1 MLAGEN_OUT_DIR=/tmp/mlo PYTHONPATH=$PWD
D=docs/data/s14-h100-2026-11-24
cp $D/ab_ot/mla_sparse_prefill_sm90_fp8_ot.yaml specs/ && cp $D/ab_ot/mla_sparse_prefill_sm90_fp8_ot.cu.j2 templates/ \
  && cp $D/ab_ot/sparse_fp8mma_ot.cuh.txt templates/include/mlagen/sm90/sparse_fp8mma_ot.cuh
timeout 400 python3 $D/ab_ot.py > $OUT/ab_ot.log 2>&1; echo "rc=$?"
grep -v "^ *warn" $OUT/ab_ot.log | grep -v "^case .* PASS" | tail -n 14
