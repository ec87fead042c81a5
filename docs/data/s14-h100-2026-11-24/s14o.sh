#!/usr/bin/env bash
# Session 14 H100 call o: clock64 counters in call k's kernel (mktrace_ot.py, trace_ot.py).
export PYTHONUNBUFFERED=1 MLAGEN_OUT_DIR=/tmp/mlo PYTHONPATH=$PWD
D=docs/data/s14-h100-2026-11-24
cp $D/ab_ot/mla_sparse_prefill_sm90_fp8_ot.yaml specs/ && cp $D/ab_ot/mla_sparse_prefill_sm90_fp8_ot.cu.j2 templates/
python3 $D/mktrace_ot.py || exit 1
timeout 300 python3 $D/trace_ot.py > $OUT/trace_ot.log 2>&1; echo "rc=$?"
grep -v "^ *warn\|skipping\|spills; launching" $OUT/trace_ot.log | tail -n 8
