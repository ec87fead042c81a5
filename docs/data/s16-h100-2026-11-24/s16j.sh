#!/usr/bin/env bash
# Session 16 H100 call j: the Q-in-registers fix. First the new tests against the kernel without the fence (device copy
# only; they must fail), then the dense and FP8 GPU tests on the committed tree (with the fence).
export PYTHONUNBUFFERED=1 MLAGEN_OUT_DIR=/tmp/mlo PYTHONPATH=$PWD
cp templates/include/mlagen/sm90/mla_prefill.cuh /tmp/mla_prefill.cuh.fixed
python3 - <<'PY'
p = "templates/include/mlagen/sm90/mla_prefill.cuh"
s = open(p).read()
old = "        fence_async_shared();\n        mbar_arrive(bar.q_empty());  // Q lives in registers now"
assert old in s
open(p, "w").write(s.replace(old, "        mbar_arrive(bar.q_empty());  // Q lives in registers now"))
PY
MLAGEN_OUT_DIR=/tmp/mlo_nofence timeout 200 python3 -m pytest -q -k "many_tiles or (test_sm90_schedules and q_operand) or (test_sm90_fp8_schedules and q_operand)" tests/gpu/test_mla_prefill_gpu.py tests/gpu/test_fp8_gpu.py > $OUT/k-nofence-tests.log 2>&1; echo "without the fence rc=$? (must fail)"
grep -E "passed|failed" $OUT/k-nofence-tests.log | tail -3; grep -E "^FAILED" $OUT/k-nofence-tests.log | cut -c1-160
if [ "$1" = "nofence-only" ]; then exit 0; fi
cp /tmp/mla_prefill.cuh.fixed templates/include/mlagen/sm90/mla_prefill.cuh
timeout 380 python3 -m pytest -q tests/gpu/test_mla_prefill_gpu.py tests/gpu/test_fp8_gpu.py > $OUT/j-tests.log 2>&1; echo "with the fence rc=$?"
grep -E "passed|failed|Error" $OUT/j-tests.log | tail -8
