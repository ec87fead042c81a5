#!/usr/bin/env bash
# Session 16 H100 call d: the idle-GPU slowdown of the sparse kernel, probed from inside (idleprobe.patch on the
# device's copy only: clock64 and globaltimer per CTA).
export PYTHONUNBUFFERED=1 MLAGEN_OUT_DIR=/tmp/mlo PYTHONPATH=$PWD
cp docs/data/s16-h100-2026-11-24/mla_sparse_prefill_sm90.cu.j2.probe templates/mla_sparse_prefill_sm90.cu.j2   # = idleprobe.patch applied
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,power.draw --format=csv,noheader
(nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,clocks_event_reasons.active --format=csv,noheader -lms 20 > $OUT/d-smi.log 2>&1 &) 
timeout 240 python3 docs/data/s16-h100-2026-11-24/idleprobe.py > $OUT/d-idleprobe.log 2>&1; echo "probe rc=$?"
pkill -f "nvidia-smi --query" ; cat $OUT/d-idleprobe.log | tail -40
