#!/usr/bin/env bash
# Session 16 H100 call p: the idle-GPU loss at three sq (idleprobe3.py, idleprobe.patch on the device copy only).
export PYTHONUNBUFFERED=1 MLAGEN_OUT_DIR=/tmp/mlo PYTHONPATH=$PWD
cp docs/data/s16-h100-2026-11-24/mla_sparse_prefill_sm90.cu.j2.probe templates/mla_sparse_prefill_sm90.cu.j2   # = idleprobe.patch applied
timeout 300 python3 docs/data/s16-h100-2026-11-24/idleprobe3.py > $OUT/p-idleprobe3.log 2>&1; echo "probe rc=$?"
cat $OUT/p-idleprobe3.log
