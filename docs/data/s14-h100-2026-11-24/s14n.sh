#!/usr/bin/env bash
# Session 14 H100 call n: one scale per row for fp8_v32 on the transposed-P V kernel (ab_ue/,
# installed in this copy only) against the shipped fp8-mode kernel (ab_ue.py).
export PYTHONUNBUFFERED=1 MLAGEN_OUT_DIR=/tmp/mlo PYTHONPATH=$PWD
D=docs/data/s14-h100-2026-11-24
cp $D/ab_ue/mla_sparse_prefill_sm90_fp8_ue.yaml specs/ && cp $D/ab_ue/mla_sparse_prefill_sm90_fp8_ue.cu.j2 templates/ \
  && cp $D/ab_ue/sparse_fp8mma_ue.cuh.txt templates/include/mlagen/sm90/sparse_fp8mma_ue.cuh
timeout 400 python3 $D/ab_ue.py > $OUT/ab_ue.log 2>&1; echo "rc=$?"
grep -v "^ *warn" $OUT/ab_ue.log | grep -v "^case .* PASS" | tail -n 24
