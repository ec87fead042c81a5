#!/usr/bin/env bash
# Session 9 H100 call 13: the shipped records (D6 now lazy) through the shipped-winner GPU tests, and the final dense table.
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 MLAGEN_OUT_DIR=/tmp/mlo
T0=$(date +%s); S=$OUT/summary.txt
el() { echo $(( $(date +%s)-T0 )); }
[ -d shared/peers/fa3/build ] && echo "fa3 build present" >> $S
env -u OUT python3 shared/peers/fa3/build_fa3.py --build-dir shared/peers/fa3/build > /tmp/fa3build.log 2>&1; echo "fa3 build rc=$? $(el)s" >> $S
timeout 60 python3 -m pytest -q tests/gpu/test_mla_prefill_gpu.py tests/gpu/test_fp8_gpu.py -k "shipped" -p no:cacheprovider > $OUT/tests.log 2>&1; echo "tests rc=$? $(el)s" >> $S
timeout 150 python3 -m mlagen.cli bench --shapes D1,D2,D3,D4,D5,D6,D7 --peers fa3,cudnn,mlagen,mlagen-check --rounds 5 --markdown $OUT/bench.md --json $OUT/bench.json > $OUT/bench.log 2>&1
echo "bench rc=$? $(el)s" >> $S
cat $S; tail -2 $OUT/tests.log; grep -E "^\| D[0-9]" $OUT/bench.md | cut -d'|' -f2,4-9
