#!/usr/bin/env bash
# Session 19 H100 call h: the whole FP8 dense space tuned again on D1 and D3 after the softmax change
# (online_softmax's lazy check), then each winner against the shipped record in one process (abvar.py).
export PYTHONUNBUFFERED=1 MLAGEN_OUT_DIR=/tmp/mlo PYTHONPATH=$PWD
for sh in D1 D3; do
  timeout 230 python3 -m mlagen.cli tune mla_prefill_sm90_fp8 --shape $sh --max-trials 400 --budget 3.3 --db $OUT/h-$sh.sqlite --no-progress --top 8 > $OUT/h-tune-$sh.log 2>&1; echo "tune $sh rc=$?"
  python3 -m mlagen.cli db --db $OUT/h-$sh.sqlite export $OUT/h-$sh.json > /dev/null 2>&1
  grep -E "trials in|^winner|final" $OUT/h-tune-$sh.log | tail -4
done
python3 - <<'PY' > $OUT/h-overrides.txt
import json, os
out = os.environ["OUT"]
recs = json.load(open("mlagen/tuned/h100.json"))["best"]
for sh, key in (("D1", "causal/h128/q8192/k8192"), ("D3", "none/h16/q8192/k8192")):
    rec = next(r for r in recs if r["spec"] == "mla_prefill_sm90_fp8" and r["problem"] == key)
    win = json.load(open(f"{out}/h-{sh}.json"))["best"][0]["variant"]
    diff = ",".join(f"{k}={v}" for k, v in sorted(win.items()) if rec["variant"].get(k) != v)
    print(sh, diff or "same")
PY
cat $OUT/h-overrides.txt
for sh in D1 D3; do
  d=$(grep "^$sh " $OUT/h-overrides.txt | cut -d' ' -f2)
  if [ "$d" != "same" ]; then
    timeout 150 python3 docs/data/s19-h100-2026-11-25/abvar.py mla_prefill_sm90_fp8 $sh 12 "$d" 2>&1 | grep -v "^ *warn" | tee -a $OUT/h-abvar.log
  fi
done
