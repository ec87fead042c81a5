#!/usr/bin/env bash
# Session 16 H100 call e: the idle-GPU "slowdown" as the launch path's latency (marker kernel before the call).
export PYTHONUNBUFFERED=1 MLAGEN_OUT_DIR=/tmp/mlo PYTHONPATH=$PWD
cp docs/data/s16-h100-2026-11-24/mla_sparse_prefill_sm90.cu.j2.probe templates/mla_sparse_prefill_sm90.cu.j2   # = idleprobe.patch applied
timeout 240 python3 docs/data/s16-h100-2026-11-24/idleprobe2.py > $OUT/e-idleprobe2.log 2>&1; echo "probe rc=$?"
tail -30 $OUT/e-idleprobe2.log
