#!/usr/bin/env bash
# Session 6 final H100 call: peers built, every GPU test after the c3 records, then dense D1-D7 + H64 vs FA3/cuDNN,
# FP8 vs bf16, sparse S1-S5 vs FlashMLA.
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 MLAGEN_OUT_DIR=/tmp/mlo
T0=$(date +%s); S=$OUT/summary.txt
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; python3 -c "import torch; print('torch', torch.__version__, 'cudnn', torch.backends.cudnn.version())"; } >> $S 2>&1
(env -u OUT nice python3 shared/peers/fa3/build_fa3.py --build-dir shared/peers/fa3/build > /tmp/fa3build.log 2>&1; echo "fa3 build rc=$? $(( $(date +%s)-T0 ))s" >> $S
 env -u OUT nice bash shared/peers/flashmla/run_remote.sh > /tmp/flashmla.log 2>&1; echo "flashmla build rc=$? $(( $(date +%s)-T0 ))s" >> $S) &
timeout 330 python3 -m pytest -q -p no:cacheprovider -rs tests/gpu > $OUT/gpu-tests.log 2>&1
echo "gpu tests rc=$? $(( $(date +%s)-T0 ))s $(tail -1 $OUT/gpu-tests.log)" >> $S
wait
timeout 110 python3 -m mlagen.cli bench --shapes D1,D2,D3,D4,D5,D6,D7 --peers fa3,cudnn,mlagen,mlagen-check --rounds 5 --markdown $OUT/bench.md > $OUT/bench.log 2>&1
echo "bench rc=$? $(( $(date +%s)-T0 ))s" >> $S
timeout 30 python3 -m mlagen.cli bench --shapes b=1,q=8192,k=8192,h=64,causal --peers fa3,cudnn,mlagen --rounds 3 --markdown $OUT/bench_h64.md >> $OUT/bench.log 2>&1
echo "h64 rc=$? $(( $(date +%s)-T0 ))s" >> $S
timeout 60 python3 -m mlagen.bench_fp8 --shapes D1,D3 > $OUT/bench_fp8.log 2>&1
echo "fp8 rc=$? $(( $(date +%s)-T0 ))s" >> $S
timeout 80 python3 -m mlagen.cli bench --shapes S1,S2,S3,S4,S5 --peers flashmla,mlagen --rounds 5 --iters 30 --markdown $OUT/bench_sparse.md >> $OUT/bench.log 2>&1
echo "sparse rc=$? $(( $(date +%s)-T0 ))s" >> $S
cat $S; grep -E "FAILED|ERROR" $OUT/gpu-tests.log | head
