#!/usr/bin/env bash
# Session 8 H100 call: after the host-path change. FA3 built; GPU tests; host time by piece; the
# D7 record (D2's dynamic kernel) written by the tuner; the dense table end to end with it.
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 MLAGEN_OUT_DIR=/tmp/mlo
T0=$(date +%s); S=$OUT/summary.txt
el() { echo $(( $(date +%s)-T0 )); }
{ nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv,noheader; python3 -c "import torch; print('torch', torch.__version__, 'cudnn', torch.backends.cudnn.version())"; } >> $S 2>&1
(env -u OUT nice python3 shared/peers/fa3/build_fa3.py --build-dir shared/peers/fa3/build > /tmp/fa3build.log 2>&1; echo "fa3 build rc=$? $(el)s" >> $S) &
timeout 300 python3 -m pytest -q -p no:cacheprovider -rs tests/gpu --ignore=tests/gpu/test_sparse_fp8_gpu.py --ignore=tests/gpu/test_bench_sparse_gpu.py > $OUT/gpu-tests.log 2>&1
echo "gpu tests rc=$? $(el)s $(tail -1 $OUT/gpu-tests.log)" >> $S
wait
H=$OUT/host.log
timeout 60 python3 .carry/prof/hostprof2.py D7 D6 D1 >> $H 2>&1; timeout 60 python3 .carry/prof/hostprof3.py D7 D6 D1 >> $H 2>&1; echo "host rc=$? $(el)s" >> $S
P=mla_prefill_sm90_causal_c2_n128_s2_qsmem_opingpong_ov1_rsoverlapped_pwearly
D2REC=${P}_schdynamic_eptma_lw2_rp24_rc240_sq128_sk128_sv128_cl1
export MLAGEN_TUNING_DB=/tmp/rec.sqlite
timeout 120 python3 -m mlagen.cli tune mla_prefill_sm90 --shape D7 --fixed $D2REC --no-progress > $OUT/tune-d7.log 2>&1
echo "tune d7 rc=$? $(el)s" >> $S
python3 -m mlagen.cli db export --best-only /tmp/rec.json >> $OUT/tune-d7.log 2>&1; cp /tmp/rec.json $OUT/rec-d7.json
if [ $(el) -lt 470 ]; then
  timeout 120 python3 -m mlagen.cli bench --shapes D1,D2,D3,D4,D5,D6,D7 --peers fa3,cudnn,mlagen,mlagen-check --rounds 5 --markdown $OUT/bench.md > $OUT/bench.log 2>&1
  echo "bench rc=$? $(el)s" >> $S
fi
cat $S; grep -E "FAILED|ERROR" $OUT/gpu-tests.log | head; cat $H | grep -E "^D"; tail -5 $OUT/tune-d7.log; grep -E "^\| D" $OUT/bench.md | cut -d'|' -f2,8,10; grep -A10 "Host (CPU)" $OUT/bench.md
