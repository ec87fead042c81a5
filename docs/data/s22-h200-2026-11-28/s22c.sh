#!/usr/bin/env bash
# Session 22 (H200) call c: the new large-offset GPU tests (> 2**31-element tensors through every
# family), then a user's short tunes with the shipped records in place (session 21's rule: the record in
# use is replaced only by a finalist faster in every paired round). Logs under $OUT.
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 MLAGEN_OUT_DIR=/tmp/mlo
T0=$(date +%s); S=$OUT/summary.txt
el() { echo $(( $(date +%s)-T0 )); }
timeout 200 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_large_offsets_gpu.py -rxXs > $OUT/c-large.log 2>&1
echo "large-offset tests rc=$? $(el)s" >> $S
run() {  # name spec shape
  timeout 150 python3 -m mlagen.cli tune $2 --shape $3 --max-trials 24 --db $OUT/c-$1.sqlite --no-progress > $OUT/c-tune-$1.log 2>&1
  echo "tune $1 rc=$? $(el)s" >> $S
}
run bf16-D1 mla_prefill_sm90 D1
run fp8-D3 mla_prefill_sm90_fp8 D3
cat $S; tail -6 $OUT/c-large.log; for f in $OUT/c-tune-*.log; do echo "== $f"; tail -12 $f; done
