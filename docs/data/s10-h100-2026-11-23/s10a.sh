#!/usr/bin/env bash
# Session 10 H100 call 1: the sparse select memo (session 9, CPU-tested only) on the GPU; the dense table
# with the reversed-order bench (four peers, as run m); the sparse table with host time.
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 MLAGEN_OUT_DIR=/tmp/mlo
T0=$(date +%s); S=$OUT/summary.txt
el() { echo $(( $(date +%s)-T0 )); }
{ nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv,noheader; python3 -c "import torch; print('torch', torch.__version__, 'cudnn', torch.backends.cudnn.version())"; } >> $S 2>&1
(env -u OUT nice python3 shared/peers/fa3/build_fa3.py --build-dir shared/peers/fa3/build > /tmp/fa3build.log 2>&1; echo "fa3 build rc=$? $(el)s" >> $S) &
[ -f shared/peers/flashmla/build/flashmla_sparse_sm90_C.so ] || (env -u OUT nice bash shared/peers/flashmla/run_remote.sh > /tmp/flashmla.log 2>&1; echo "flashmla build rc=$? $(el)s" >> $S) &
timeout 300 python3 -m pytest -q tests/gpu/test_sparse_gpu.py tests/gpu/test_op_gpu.py tests/gpu/test_bench_sparse_gpu.py -p no:cacheprovider > $OUT/tests.log 2>&1
echo "tests rc=$? $(el)s" >> $S
wait
timeout 170 python3 -m mlagen.cli bench --shapes D1,D2,D3,D4,D5,D6,D7 --peers fa3,cudnn,mlagen,mlagen-check --rounds 5 --markdown $OUT/bench.md --json $OUT/bench.json > $OUT/bench.log 2>&1
echo "bench rc=$? $(el)s" >> $S
timeout 90 python3 -m mlagen.cli bench --shapes S1,S2,S3,S4,S5,S6 --peers flashmla,mlagen --rounds 5 --iters 30 --markdown $OUT/bench-sparse.md --json $OUT/bench-sparse.json > $OUT/bench-sparse.log 2>&1
echo "bench sparse rc=$? $(el)s" >> $S
cat $S; tail -n 3 $OUT/tests.log; grep -E "^\| [DS][0-9]" $OUT/bench.md $OUT/bench-sparse.md | cut -d'|' -f2,4-9
