#!/usr/bin/env bash
# Session 16 H100 call n: the dense table on the final tree (plans, the counter ring; no shipped kernel changed):
# mlagen bench D1-D7 against FA3 and cuDNN, interleaved rounds, with the host-time table.
export PYTHONUNBUFFERED=1 MLAGEN_OUT_DIR=/tmp/mlo PYTHONPATH=$PWD
env -u OUT python3 shared/peers/fa3/build_fa3.py --build-dir shared/peers/fa3/build > $OUT/n-fa3-build.log 2>&1; echo "fa3 build rc=$?"
timeout 420 python3 -m mlagen.cli bench --shapes D1,D2,D3,D4,D5,D6,D7 --peers fa3,cudnn,mlagen --rounds 3 \
  --markdown $OUT/n-bench.md > $OUT/n-bench.log 2>&1; echo "bench rc=$?"
grep -E "^\| D|^\| shape" $OUT/n-bench.md | head -20
