#!/usr/bin/env bash
# Session 12 H100 call d: the shipped tree (D5's new record): shipped-winner GPU tests, the dense table
# with four peers and with FA3 alone, FP8 dense against bf16 in one process.
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 MLAGEN_OUT_DIR=/tmp/mlo
T0=$(date +%s); S=$OUT/summary.txt
el() { echo $(( $(date +%s)-T0 )); }
{ nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv,noheader; python3 -c "import torch; print('torch', torch.__version__, 'cudnn', torch.backends.cudnn.version())"; } >> $S 2>&1
(env -u OUT nice python3 shared/peers/fa3/build_fa3.py --build-dir shared/peers/fa3/build > /tmp/fa3build.log 2>&1; echo "fa3 build rc=$? $(el)s" >> $S) &
timeout 200 python3 -m pytest -q tests/gpu/test_mla_prefill_gpu.py tests/gpu/test_fp8_gpu.py -k "shipped or record or diagonal" -p no:cacheprovider > $OUT/tests.log 2>&1
echo "tests rc=$? $(el)s" >> $S
wait
timeout 170 python3 -m mlagen.cli bench --shapes D1,D2,D3,D4,D5,D6,D7 --peers fa3,cudnn,mlagen,mlagen-check --rounds 5 --markdown $OUT/bench.md --json $OUT/bench.json > $OUT/bench.log 2>&1
echo "bench rc=$? $(el)s" >> $S
timeout 120 python3 -m mlagen.cli bench --shapes D1,D2,D3,D4,D5,D6,D7 --peers fa3,mlagen --rounds 5 --markdown $OUT/bench2.md --json $OUT/bench2.json > $OUT/bench2.log 2>&1
echo "bench2 rc=$? $(el)s" >> $S
timeout 100 python3 -m mlagen.bench_fp8 --shapes D1,D3 --rounds 5 > $OUT/fp8.log 2>&1
echo "fp8 rc=$? $(el)s" >> $S
cat $S; tail -n 3 $OUT/tests.log; grep -E "^\| D[0-9]" $OUT/bench.md $OUT/bench2.md | cut -d'|' -f2,4-9; grep -v "^$" $OUT/fp8.log | head -12
