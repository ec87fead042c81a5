#!/usr/bin/env bash
# Session 5, final H100 call 2/2: dense D1-D7 and H64 against FA3 and cuDNN (public call; check_seqlens beside it),
# FP8 dense against bf16, sparse S1-S5 against FlashMLA.
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 MLAGEN_OUT_DIR=/tmp/mlo
T0=$(date +%s)
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; python3 -c "import torch; print('torch', torch.__version__)"; } > $OUT/env.txt 2>&1
timeout 150 python3 -m mlagen.cli bench --shapes D1,D2,D3,D4,D5,D6,D7 --peers fa3,cudnn,mlagen,mlagen-check --rounds 5 --markdown $OUT/bench.md --json $OUT/bench.json > $OUT/bench.log 2>&1
echo "bench rc=$? $(( $(date +%s)-T0 ))s" >> $OUT/summary.txt
timeout 40 python3 -m mlagen.cli bench --shapes b=1,q=8192,k=8192,h=64,causal --peers fa3,cudnn,mlagen --rounds 3 --markdown $OUT/bench_h64.md >> $OUT/bench.log 2>&1
echo "h64 rc=$? $(( $(date +%s)-T0 ))s" >> $OUT/summary.txt
timeout 90 python3 -m mlagen.bench_fp8 --shapes D1,D3 > $OUT/bench_fp8.log 2>&1
echo "fp8 rc=$? $(( $(date +%s)-T0 ))s" >> $OUT/summary.txt
timeout 200 python3 -m mlagen.cli bench --shapes S1,S2,S3,S4,S5 --peers flashmla,mlagen --rounds 5 --iters 30 --markdown $OUT/bench_sparse.md > $OUT/bench_sparse.log 2>&1
echo "sparse rc=$? $(( $(date +%s)-T0 ))s" >> $OUT/summary.txt
cat $OUT/summary.txt
