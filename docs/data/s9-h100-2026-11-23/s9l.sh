#!/usr/bin/env bash
# Session 9 H100 call 12: D6 record with the lazy maximum (tune --fixed), then the shipped-winner GPU tests and the dense table.
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 MLAGEN_OUT_DIR=/tmp/mlo
T0=$(date +%s); S=$OUT/summary.txt
el() { echo $(( $(date +%s)-T0 )); }
[ -d shared/peers/fa3/build ] && echo "fa3 build present" >> $S
(env -u OUT python3 shared/peers/fa3/build_fa3.py --build-dir shared/peers/fa3/build > /tmp/fa3build.log 2>&1; echo "fa3 build rc=$? $(el)s" >> $S) &
D6L=mla_prefill_sm90_causal_c2_n128_s2_qsmem_opingpong_ov1_rslazy_pwearly_schdynamic_epvtma_lw1_rp24_rc208_sq128_sk128_sv128_cl1
MLAGEN_TUNING_DB=/tmp/rec6.sqlite timeout 100 python3 -m mlagen.cli tune mla_prefill_sm90 --shape D6 --fixed $D6L --no-progress > $OUT/tune-d6.log 2>&1; echo "tune D6 rc=$? $(el)s" >> $S
MLAGEN_TUNING_DB=/tmp/rec6.sqlite python3 -m mlagen.cli db export --best-only $OUT/rec6.json >> $S 2>&1
wait
# The D6 record from the user database (it beats the shipped one for its key), as a user would have it.
MLAGEN_TUNING_DB=/tmp/rec6.sqlite timeout 60 python3 -m pytest -q tests/gpu/test_mla_prefill_gpu.py -k "shipped or lazy" -p no:cacheprovider > $OUT/tests.log 2>&1; echo "tests rc=$? $(el)s" >> $S
MLAGEN_TUNING_DB=/tmp/rec6.sqlite timeout 100 python3 -m mlagen.cli bench --shapes D1,D2,D3,D4,D5,D6,D7 --peers fa3,mlagen --rounds 5 --markdown $OUT/bench.md > $OUT/bench.log 2>&1
echo "bench rc=$? $(el)s" >> $S
cat $S; tail -2 $OUT/tests.log; grep -E "\[1\]" $OUT/tune-d6.log; grep -E "^\| D[0-9]" $OUT/bench.md | cut -d'|' -f2,4-6
