#!/usr/bin/env bash
# Session 14 H100 call m: tools/ab_install.py on the device, and the A/B harness's noise floor: the
# committed fp8-mode kernel (927c246) against the same kernel in the working tree (ab14.py).
export PYTHONUNBUFFERED=1 MLAGEN_OUT_DIR=/tmp/mlo PYTHONPATH=$PWD
D=docs/data/s14-h100-2026-11-24
python3 tools/ab_install.py mla_sparse_prefill_sm90_fp8 927c246 || exit 1
timeout 400 python3 $D/ab14.py > $OUT/ab.log 2>&1; echo "ab rc=$?"
grep -v "^ *warn" $OUT/ab.log | tail -n 12
python3 tools/ab_install.py mla_sparse_prefill_sm90_fp8 --remove
