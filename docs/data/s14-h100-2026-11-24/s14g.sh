#!/usr/bin/env bash
# Session 14 H100 A/B calls: the committed fp8 kernel (as mla_sparse_prefill_sm90_fp8_base) against
# the working tree's, one process (ab14.py); the base spec is installed only in this copy.
export PYTHONUNBUFFERED=1 MLAGEN_OUT_DIR=/tmp/mlo PYTHONPATH=$PWD
D=docs/data/s14-h100-2026-11-24
# The base kernel: ab/sparse_fp8mma_base.cuh.txt, the header of 927c246 (the thirteenth session's
# final tree; `git show 927c246:templates/include/mlagen/sm90/sparse_fp8mma.cuh`).
cp $D/ab/mla_sparse_prefill_sm90_fp8_base.yaml specs/ && cp $D/ab/mla_sparse_prefill_sm90_fp8_base.cu.j2 templates/ \
  && cp $D/ab/sparse_fp8mma_base.cuh.txt templates/include/mlagen/sm90/sparse_fp8mma_base.cuh
timeout 400 python3 $D/ab14.py > $OUT/ab.log 2>&1; echo "ab rc=$?"
grep -v "^ *warn" $OUT/ab.log | tail -n 12
