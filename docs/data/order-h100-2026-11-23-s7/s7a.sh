#!/usr/bin/env bash
# Session 7 H100 call: the grouped tile order (mla_prefill.cuh: query_tile). FA3 built; every GPU
# test after the kernel change; A/B of head groups against FA3 per shape; the dense table; FP8.
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 MLAGEN_OUT_DIR=/tmp/mlo
T0=$(date +%s); S=$OUT/summary.txt
el() { echo $(( $(date +%s)-T0 )); }
{ nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv,noheader; python3 -c "import torch; print('torch', torch.__version__, 'cudnn', torch.backends.cudnn.version())"; git log --oneline -1; } >> $S 2>&1
(env -u OUT nice python3 shared/peers/fa3/build_fa3.py --build-dir shared/peers/fa3/build > /tmp/fa3build.log 2>&1; echo "fa3 build rc=$? $(el)s" >> $S) &
timeout 290 python3 -m pytest -q -p no:cacheprovider -rs tests/gpu --ignore=tests/gpu/test_sparse_fp8_gpu.py --ignore=tests/gpu/test_bench_sparse_gpu.py > $OUT/gpu-tests.log 2>&1
echo "gpu tests rc=$? $(el)s $(tail -1 $OUT/gpu-tests.log)" >> $S
wait
A=$OUT/ab.log
D7REC=mla_prefill_sm90_causal_c2_n128_s2_qsmem_opingpong_ov1_rsoverlapped_pwearly_schpersistent_epdirect_lw1_rp56_rc224_sq128_sk128_sv128_cl1
for job in "D2 1 2 16" "D7 1 4 8 $D7REC:scheduler=dynamic" "D1 1 16" "b=1,q=8192,k=8192,h=64,causal 1 16" "D4 1 4" "D6 1 8" "D3 1" "D5 1"; do
  [ $(el) -gt 470 ] && { echo "skip ab $job (time)" >> $S; continue; }
  timeout 60 python3 .carry/prof/ab_order.py $job >> $A 2>&1; echo "ab ${job%% *} rc=$? $(el)s" >> $S
done
if [ $(el) -lt 480 ]; then
  timeout 100 python3 -m mlagen.cli bench --shapes D1,D2,D3,D4,D5,D6,D7 --peers fa3,cudnn,mlagen,mlagen-check --rounds 5 --markdown $OUT/bench.md > $OUT/bench.log 2>&1
  echo "bench rc=$? $(el)s" >> $S
fi
if [ $(el) -lt 560 ]; then
  timeout 25 python3 -m mlagen.bench_fp8 --shapes D1,D3 > $OUT/bench_fp8.log 2>&1; echo "fp8 rc=$? $(el)s" >> $S
fi
cat $S; grep -E "FAILED|ERROR" $OUT/gpu-tests.log | head; grep -E "x fa3|WRONG" $A | cut -c1-40,100-200
