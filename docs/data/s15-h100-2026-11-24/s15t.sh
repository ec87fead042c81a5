#!/usr/bin/env bash
# Session 15 H100 call t: a fresh FP8 D3 tune with the fixed tuner, then its winner against the shipped D3
# record in bench_fp8 (15 rounds), if it differs.
export PYTHONUNBUFFERED=1 MLAGEN_OUT_DIR=/tmp/mlo PYTHONPATH=$PWD
timeout 300 python3 -m mlagen.cli tune mla_prefill_sm90_fp8 --shape D3 --budget 4 --seed 5 --db $OUT/t-tune.sqlite --no-progress --top 8 > $OUT/t-tune.log 2>&1; echo "tune rc=$?"
grep -E "local:|final|winner|trials in" $OUT/t-tune.log | cut -c1-200
python3 -m mlagen.cli db --db $OUT/t-tune.sqlite export $OUT/t-tune.json > /dev/null
V=$(python3 -c "
import json; b=json.load(open('$OUT/t-tune.json'))['best'][0]['variant']
print(','.join(f'{k}={str(v).lower() if isinstance(v, bool) else v}' for k, v in sorted(b.items())))")
echo "winner: $V"
timeout 200 python3 -m mlagen.bench_fp8 --shapes D3 --rounds 15 --variant "$V" 2>&1 | grep -v "^ *warn" | tee $OUT/t-bench.log | cut -c1-220
