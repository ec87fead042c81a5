#!/usr/bin/env bash
# Session 10 H100 call 16: D6 reads 0.98-0.99x FA3 with four peers and 1.02-1.03x with two. Which
# peer moves it? D6 alone, 5 rounds, four peer mixes in a rotated order, twice.
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 MLAGEN_OUT_DIR=/tmp/mlo
T0=$(date +%s); S=$OUT/summary.txt
el() { echo $(( $(date +%s)-T0 )); }
env -u OUT python3 shared/peers/fa3/build_fa3.py --build-dir shared/peers/fa3/build > /tmp/fa3build.log 2>&1; echo "fa3 build rc=$? $(el)s" >> $S
for rep in 1 2; do
for peers in fa3,mlagen fa3,cudnn,mlagen fa3,mlagen,mlagen-check fa3,cudnn,mlagen,mlagen-check; do
  timeout 60 python3 -m mlagen.cli bench --shapes D6 --peers $peers --rounds 5 --markdown $OUT/d6-$rep-$peers.md > /dev/null 2>&1
  echo "rep $rep peers $peers rc=$? $(el)s: $(grep -E '^\| D6' $OUT/d6-$rep-$peers.md | awk -F'|' '{for(i=4;i<=NF;i++) if ($i ~ /×/) {printf "%s ", $i}}')" >> $S
done; done
cat $S
