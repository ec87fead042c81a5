#!/usr/bin/env bash
# Session 12 H100 call b: records with diagonal=half (bf16 sm90): the dense GPU tests, the dense table
# (four peers), and an FP8 A/B of the half first tile on the FP8 D1 / D3 records.
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 MLAGEN_OUT_DIR=/tmp/mlo
D=docs/data/s12-h100-2026-11-24
T0=$(date +%s); S=$OUT/summary.txt
el() { echo $(( $(date +%s)-T0 )); }
{ nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv,noheader; python3 -c "import torch; print('torch', torch.__version__, 'cudnn', torch.backends.cudnn.version())"; } >> $S 2>&1
(env -u OUT nice python3 shared/peers/fa3/build_fa3.py --build-dir shared/peers/fa3/build > /tmp/fa3build.log 2>&1; echo "fa3 build rc=$? $(el)s" >> $S) &
timeout 280 python3 -m pytest -q tests/gpu/test_mla_prefill_gpu.py tests/gpu/test_fp8_gpu.py tests/gpu/test_op_gpu.py -p no:cacheprovider > $OUT/tests.log 2>&1
echo "tests rc=$? $(el)s" >> $S
wait
timeout 170 python3 -m mlagen.cli bench --shapes D1,D2,D3,D4,D5,D6,D7 --peers fa3,cudnn,mlagen,mlagen-check --rounds 5 --markdown $OUT/bench.md --json $OUT/bench.json > $OUT/bench.log 2>&1
echo "bench rc=$? $(el)s" >> $S
F=mla_prefill_sm90_fp8_causal_c3_n96_s3_qsmem_onone_ov1_rslazy_pwlate_schdynamic_epdirect_lw1_rp24_rc160_sq64_sk64_sv32_cl1_dgfull
AB_DTYPE=fp8_e4m3 timeout 90 python3 $D/ab_env.py D1 rec@$F half@$F:diagonal=half rec2@$F half2@$F:diagonal=half > $OUT/ab-fp8.log 2>&1
echo "ab fp8 rc=$? $(el)s" >> $S
cat $S; tail -n 3 $OUT/tests.log; grep -E "^\| [DS][0-9]" $OUT/bench.md | cut -d'|' -f2,4-9; cat $OUT/ab-fp8.log | cut -c1-40,150-
