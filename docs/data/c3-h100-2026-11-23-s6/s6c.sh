#!/usr/bin/env bash
# Session 6: c3 schedule tests; records for the c3 winners of the A/B (tune --fixed <symbol>, one trial each).
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 MLAGEN_OUT_DIR=/tmp/mlo
T0=$(date +%s); L=$OUT/log.txt
timeout 240 python3 -m pytest -q -p no:cacheprovider -rs tests/gpu/test_mla_prefill_gpu.py tests/gpu/test_fp8_gpu.py -k "consumers" > $OUT/tests-c3.log 2>&1
echo "c3 tests rc=$? $(( $(date +%s)-T0 ))s $(tail -1 $OUT/tests-c3.log)" >> $L
BC=mla_prefill_sm90_causal_c3_n80_s3_qsmem_onone_ov1_rsoverlapped_pwearly_schdynamic_eptma_lw1_rp24_rc160_sq128_sk128_sv128_cl1
BN=mla_prefill_sm90_none_c3_n80_s3_qsmem_onone_ov1_rsoverlapped_pwearly_schdynamic_eptma_lw1_rp24_rc160_sq128_sk128_sv128_cl1
FC=mla_prefill_sm90_fp8_causal_c3_n96_s3_qsmem_onone_ov1_rsoverlapped_pwlate_schdynamic_epdirect_lw1_rp24_rc160_sq64_sk64_sv32_cl1
FN=mla_prefill_sm90_fp8_none_c3_n96_s3_qsmem_onone_ov1_rsoverlapped_pwearly_schdynamic_epdirect_lw1_rp24_rc160_sq64_sk64_sv32_cl1
for job in "mla_prefill_sm90 D1 $BC" "mla_prefill_sm90 D3 $BN" "mla_prefill_sm90 D4 $BC" "mla_prefill_sm90 D5 $BC" "mla_prefill_sm90 b=1,q=8192,k=8192,h=64,causal $BC" "mla_prefill_sm90_fp8 D1 $FC" "mla_prefill_sm90_fp8 D3 $FN"; do
  set -- $job
  timeout 120 python3 -m mlagen.cli tune $1 --shape $2 --fixed $3 --db $OUT/c3.sqlite --no-progress >> $OUT/tune.log 2>&1
  echo "tune $1 $2 rc=$? $(( $(date +%s)-T0 ))s" >> $L
done
python3 -m mlagen.cli db --db $OUT/c3.sqlite export --best-only $OUT/c3-best.json >> $L 2>&1
cat $L; grep -E "FAILED|ERROR|passed|failed" $OUT/tests-c3.log | head -20; grep -E "final|trial|ok " $OUT/tune.log | cut -c1-200 | tail -30
