#!/usr/bin/env bash
# Session 9 H100 call 6: the dense table with the new records (lazy maximum on c3), and FP8 against bf16.
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 MLAGEN_OUT_DIR=/tmp/mlo
T0=$(date +%s); S=$OUT/summary.txt
el() { echo $(( $(date +%s)-T0 )); }
{ nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv,noheader; python3 -c "import torch; print('torch', torch.__version__, 'cudnn', torch.backends.cudnn.version())"; } >> $S 2>&1
git log --oneline | head -1 >> $S
env -u OUT python3 shared/peers/fa3/build_fa3.py --build-dir shared/peers/fa3/build > /tmp/fa3build.log 2>&1; echo "fa3 build rc=$? $(el)s" >> $S
timeout 200 python3 -m mlagen.cli bench --shapes D1,D2,D3,D4,D5,D6,D7 --peers fa3,cudnn,mlagen,mlagen-check --rounds 5 --markdown $OUT/bench.md --json $OUT/bench.json > $OUT/bench.log 2>&1
echo "bench rc=$? $(el)s" >> $S
timeout 100 python3 -m mlagen.bench_fp8 --shapes D1,D3 > $OUT/fp8.log 2>&1; echo "fp8 rc=$? $(el)s" >> $S
cat $S; grep -E "^\| D" $OUT/bench.md | cut -d'|' -f2-12; grep TFLOP $OUT/fp8.log
