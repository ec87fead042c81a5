#!/usr/bin/env bash
# Session 20 H100 call f: call b's tunes again after two tuner changes (known winners that the fixed
# values make unfit are repaired to their nearest fitting neighbours; finalists are the fastest of
# different schedules), then each winner against the shipped record in one process (abvar2.py).
export PYTHONUNBUFFERED=1 MLAGEN_OUT_DIR=/tmp/mlo PYTHONPATH=$PWD
D=docs/data/s20-h100-2026-11-25
for sh in D3 D1; do
  timeout 250 python3 -m mlagen.cli tune mla_prefill_sm90_fp8 --shape $sh --fixed o_flush=4 --max-trials 300 --budget 3.4 --db $OUT/f-$sh.sqlite --no-progress --top 8 > $OUT/f-tune-$sh.log 2>&1; echo "tune $sh rc=$?"
  python3 -m mlagen.cli db --db $OUT/f-$sh.sqlite export $OUT/f-$sh.json > /dev/null 2>&1
  grep -E "trials in|^winner|final" $OUT/f-tune-$sh.log | tail -8 | cut -c1-250
done
python3 - <<'PY' > $OUT/f-overrides.txt
import json, os
out = os.environ["OUT"]
recs = json.load(open("mlagen/tuned/h100.json"))["best"]
for sh, key in (("D1", "causal/h128/q8192/k8192"), ("D3", "none/h16/q8192/k8192")):
    rec = next(r for r in recs if r["spec"] == "mla_prefill_sm90_fp8" and r["problem"] == key)
    win = json.load(open(f"{out}/f-{sh}.json"))["best"][0]["variant"]
    diff = ",".join(f"{k}={v}" for k, v in sorted(win.items()) if rec["variant"].get(k) != v)
    print(sh, diff or "same")
PY
cat $OUT/f-overrides.txt
for sh in D3 D1; do
  d=$(grep "^$sh " $OUT/f-overrides.txt | cut -d' ' -f2)
  if [ "$d" != "same" ]; then
    timeout 120 python3 $D/abvar2.py mla_prefill_sm90_fp8 $sh 8 "$d" 2>&1 | grep -v "^ *warn" | tee -a $OUT/f-abvar2.log
  fi
done
