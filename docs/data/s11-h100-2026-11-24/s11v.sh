#!/usr/bin/env bash
# Session 11 H100 call v: two consumer warpgroups per block (split Q K^T k-steps with the partial S^T exchanged, split
# P V dims): the sparse GPU suites (incl. the new options), the S5 sweep, S5 / H=8 against FlashMLA with it pinned.
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 MLAGEN_OUT_DIR=/tmp/mlo
T0=$(date +%s); S=$OUT/summary.txt
el() { echo $(( $(date +%s)-T0 )); }
D=docs/data/s11-h100-2026-11-24
{ nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv,noheader; python3 -c "import torch; print('torch', torch.__version__)"; } >> $S 2>&1
[ -f shared/peers/flashmla/build/flashmla_sparse_sm90_C.so ] || (env -u OUT nice bash shared/peers/flashmla/run_remote.sh > /tmp/flashmla.log 2>&1; echo "flashmla build rc=$? $(el)s" >> $S) &
timeout 400 python3 -m pytest -q tests/gpu/test_sparse_gpu.py tests/gpu/test_sparse_fp8_gpu.py tests/gpu/test_op_gpu.py tests/gpu/test_bench_sparse_gpu.py -p no:cacheprovider > $OUT/tests.log 2>&1
echo "tests rc=$? $(el)s" >> $S; tail -n 1 $OUT/tests.log >> $S; grep -E "^FAILED" $OUT/tests.log | head >> $S
timeout 100 python3 $D/h16sweep.py all s5only > $OUT/sweep.log 2>&1; echo "sweep rc=$? $(el)s" >> $S
wait
timeout 90 python3 -m mlagen.cli bench --shape S5 --peers flashmla,mlagen,mlagen:mla_sparse_prefill_sm90_h16_576_0_bf16_h16_k64_s5_gatma_rp0_g6_qs3_vs3_sr0_ld0_c2_cw2_p4_l21 --rounds 7 --iters 30 --markdown $OUT/bench-h16.md > $OUT/bench-h16.log 2>&1
echo "bench h16 rc=$? $(el)s" >> $S
cat $S; grep -E "^\| S[0-9]|^\| sq" $OUT/bench-h16.md | cut -d'|' -f2,4-8; cat $OUT/sweep.log
