#!/usr/bin/env bash
# Session 16 H100 call g: reproduce the Q-in-registers race on multi-tile schedulers, without and with a
# fence.proxy.async between the Q fragments' ldmatrix and the q_empty arrive (device copy only: the spec's
# constraint removed for the experiment).
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
python3 - <<'PY'
import re
p = "specs/mla_prefill_sm90.yaml"
s = open(p).read()
s = re.sub(r"  - require: q_operand == 'smem' or scheduler == 'static'\n    message: [^\n]*\n", "", s)
open(p, "w").write(s)
PY
MLAGEN_OUT_DIR=/tmp/mlo_base timeout 250 python3 docs/data/s16-h100-2026-11-24/repro_qregs.py base 40 > $OUT/i-base.log 2>&1; echo "base rc=$?"; cat $OUT/i-base.log
python3 - <<'PY'
p = "templates/include/mlagen/sm90/mla_prefill.cuh"
s = open(p).read()
old = "        load_q_fragments<Cfg>(r, smem, wg);\n        mbar_arrive(bar.q_empty());"
assert old in s
s = s.replace(old, "        load_q_fragments<Cfg>(r, smem, wg);\n        fence_async_shared();\n        mbar_arrive(bar.q_empty());")
open(p, "w").write(s)
PY
MLAGEN_OUT_DIR=/tmp/mlo_fence timeout 250 python3 docs/data/s16-h100-2026-11-24/repro_qregs.py fence 40 > $OUT/i-fence.log 2>&1; echo "fence rc=$?"; cat $OUT/i-fence.log
