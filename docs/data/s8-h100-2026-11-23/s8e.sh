#!/usr/bin/env bash
# Session 8 H100 call: GPU tests after the counter and D7-record change; does the mlagen-check peer
# (a host sync per call, the GPU half idle) bias the block after it? Bench with and without it.
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 MLAGEN_OUT_DIR=/tmp/mlo
T0=$(date +%s); S=$OUT/summary.txt
el() { echo $(( $(date +%s)-T0 )); }
(env -u OUT nice python3 shared/peers/fa3/build_fa3.py --build-dir shared/peers/fa3/build > /tmp/fa3build.log 2>&1; echo "fa3 build rc=$? $(el)s" >> $S) &
timeout 300 python3 -m pytest -q -p no:cacheprovider -rs tests/gpu --ignore=tests/gpu/test_sparse_fp8_gpu.py --ignore=tests/gpu/test_bench_sparse_gpu.py > $OUT/gpu-tests.log 2>&1
echo "gpu tests rc=$? $(el)s $(tail -1 $OUT/gpu-tests.log)" >> $S
wait
for peers in fa3,mlagen fa3,cudnn,mlagen,mlagen-check fa3,mlagen; do
  [ $(el) -gt 520 ] && break
  timeout 90 python3 -m mlagen.cli bench --shapes D6,D7,D4 --peers $peers --rounds 5 --markdown /tmp/b.md > /dev/null 2>&1
  echo "bench $peers rc=$? $(el)s" >> $S; cat /tmp/b.md >> $OUT/bench-$peers.md
  grep -E "^\| D" /tmp/b.md | cut -d'|' -f2,4,5,6,7,8 >> $S
done
cat $S; grep -E "FAILED|ERROR" $OUT/gpu-tests.log | head
