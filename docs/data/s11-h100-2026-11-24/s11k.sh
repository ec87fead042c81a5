#!/usr/bin/env bash
# Session 11 H100 call k: the H<=16 kernel as dispatch's choice for H <= 16: the sparse GPU suites, compute-sanitizer
# (memcheck) on a few cases, Nsight Compute of the kernel, and S1-S6 against FlashMLA.
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 MLAGEN_OUT_DIR=/tmp/mlo
T0=$(date +%s); S=$OUT/summary.txt
el() { echo $(( $(date +%s)-T0 )); }
D=docs/data/s11-h100-2026-11-24; P=docs/data/s10-h100-2026-11-23
NCU=/usr/local/cuda/bin/ncu; CS=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
{ nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv,noheader; python3 -c "import torch; print('torch', torch.__version__, 'cudnn', torch.backends.cudnn.version())"; } >> $S 2>&1
[ -f shared/peers/flashmla/build/flashmla_sparse_sm90_C.so ] || (env -u OUT nice bash shared/peers/flashmla/run_remote.sh > /tmp/flashmla.log 2>&1; echo "flashmla build rc=$? $(el)s" >> $S) &
timeout 330 python3 -m pytest -q tests/gpu/test_sparse_gpu.py tests/gpu/test_op_gpu.py tests/gpu/test_bench_sparse_gpu.py tests/gpu/test_sparse_fp8_gpu.py -p no:cacheprovider > $OUT/tests.log 2>&1
echo "tests rc=$? $(el)s" >> $S; tail -n 4 $OUT/tests.log >> $S
timeout 120 $CS --tool memcheck python3 $D/sanitize11.py > $OUT/sanitize.log 2>&1
echo "memcheck rc=$? $(el)s" >> $S; grep -E "ERROR SUMMARY|True|False" $OUT/sanitize.log | tail -7 >> $S
timeout 120 $NCU --profile-from-start off --clock-control none --set full --import-source no -o /tmp/rep python3 $D/prof11.py > /tmp/ncu.log 2>&1
echo "ncu rc=$? $(el)s" >> $S
$NCU -i /tmp/rep.ncu-rep --csv --page raw > $OUT/raw.csv 2>> $S
$NCU -i /tmp/rep.ncu-rep --csv --page source --print-source sass --kernel-name regex:h16 > $OUT/source-h16.csv 2>> $S
python3 $P/ncu9.py $OUT/raw.csv > $OUT/ncu-summary.txt 2>&1
wait
timeout 120 python3 -m mlagen.cli bench --shapes S1,S2,S3,S4,S5,S6 --peers flashmla,mlagen,mlagen:mla_sparse_prefill_sm90 --rounds 5 --iters 30 --markdown $OUT/bench-sparse.md --json $OUT/bench-sparse.json > $OUT/bench-sparse.log 2>&1
echo "bench rc=$? $(el)s" >> $S
cat $S; head -8 $OUT/ncu-summary.txt; grep -E "^\| S[0-9]" $OUT/bench-sparse.md | cut -d'|' -f2,4-8
