#!/usr/bin/env bash
# Session 22 (H200) call b: the BENCHMARKS.md tables on the H200 with the peers of call a (rebuilt if the
# machine is a fresh one): dense D1-D7 (FA3, cuDNN), sparse S1-S6 (FlashMLA), issue 10's bars (dense FP8 vs
# bf16 and FA3's FP8 forward; sparse from the FP8 cache vs the bf16 copy, the serving path, FlashMLA).
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 MLAGEN_OUT_DIR=/tmp/mlo
T0=$(date +%s); S=$OUT/summary.txt
el() { echo $(( $(date +%s)-T0 )); }
[ -f shared/peers/fa3/build/fa3_C.so ] || ls shared/peers/fa3/build/*.so >/dev/null 2>&1 || (env -u OUT python3 shared/peers/fa3/build_fa3.py --build-dir shared/peers/fa3/build > /tmp/fa3build.log 2>&1; echo "fa3 build rc=$? $(el)s" >> $S) &
ls shared/peers/flashmla/build/*.so >/dev/null 2>&1 || (env -u OUT bash shared/peers/flashmla/run_remote.sh > /tmp/flashmla.log 2>&1; echo "flashmla build rc=$? $(el)s" >> $S) &
ls out/fa3_fp8/*.so >/dev/null 2>&1 || (env -u OUT python3 tools/fa3_fp8/build.py --no-copy-out > /tmp/fa3fp8.log 2>&1; echo "fa3 fp8 build rc=$? $(el)s" >> $S) &
wait
timeout 130 python3 -m mlagen.cli bench --shapes D1,D2,D3,D4,D5,D6,D7 --peers fa3,cudnn,mlagen --rounds 5 --markdown $OUT/b-bench-dense.md > $OUT/b-bench-dense.log 2>&1
echo "bench dense rc=$? $(el)s" >> $S
timeout 110 python3 -m mlagen.cli bench --shapes S1,S2,S3,S4,S5,S6 --peers flashmla,mlagen --rounds 5 --iters 30 --markdown $OUT/b-bench-sparse.md > $OUT/b-bench-sparse.log 2>&1
echo "bench sparse rc=$? $(el)s" >> $S
timeout 150 python3 -m mlagen.bench_fp8 --shapes D1,D3 --rounds 9 --iters 10 --fa3-fp8 > $OUT/b-bench-fp8.log 2>&1
echo "bench fp8 dense rc=$? $(el)s" >> $S
timeout 150 python3 -m mlagen.bench_sparse bench-fp8 --shapes S1,S3 > $OUT/b-bench-fp8-sparse.log 2>&1
echo "bench fp8 sparse rc=$? $(el)s" >> $S
cat $S; grep -E "^\| [DS][0-9]" $OUT/b-bench-dense.md $OUT/b-bench-sparse.md | cut -d'|' -f2,4-9; tail -8 $OUT/b-bench-fp8.log; tail -16 $OUT/b-bench-fp8-sparse.log
