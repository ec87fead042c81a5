#!/usr/bin/env bash
# Session 12 H100 call e: the dense table on the shipped tree with nine rounds (four peers, then FA3 alone).
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 MLAGEN_OUT_DIR=/tmp/mlo
T0=$(date +%s); S=$OUT/summary.txt
el() { echo $(( $(date +%s)-T0 )); }
{ nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv,noheader; git log --oneline | head -1; } >> $S 2>&1
[ -f shared/peers/fa3/build/fa3_peer_C.so ] || env -u OUT python3 shared/peers/fa3/build_fa3.py --build-dir shared/peers/fa3/build > /tmp/fa3build.log 2>&1; echo "fa3 build rc=$? $(el)s" >> $S
timeout 300 python3 -m mlagen.cli bench --shapes D1,D2,D3,D4,D5,D6,D7 --peers fa3,cudnn,mlagen,mlagen-check --rounds 9 --markdown $OUT/bench.md --json $OUT/bench.json > $OUT/bench.log 2>&1
echo "bench rc=$? $(el)s" >> $S
timeout 150 python3 -m mlagen.cli bench --shapes D1,D2,D3,D4,D5,D6,D7 --peers fa3,mlagen --rounds 9 --markdown $OUT/bench2.md --json $OUT/bench2.json > $OUT/bench2.log 2>&1
echo "bench2 rc=$? $(el)s" >> $S
cat $S; grep -E "^\| D[0-9]" $OUT/bench.md $OUT/bench2.md | cut -d'|' -f2,4-9
