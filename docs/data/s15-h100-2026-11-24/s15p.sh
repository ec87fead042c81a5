#!/usr/bin/env bash
# Session 15 H100 call p: the D1 FP8 record with diagonal=half measured and recorded by the tuner (--fixed),
# exported; the FP8 GPU tests (its schedule list has the variant).
export PYTHONUNBUFFERED=1 MLAGEN_OUT_DIR=/tmp/mlo PYTHONPATH=$PWD
S=mla_prefill_sm90_fp8_causal_c3_n96_s3_qsmem_onone_ov1_rslazy_pwlate_schdynamic_epdirect_lw1_rp24_rc160_sq64_sk64_sv32_cl1_dghalf
timeout 200 python3 -m mlagen.cli tune mla_prefill_sm90_fp8 --shape D1 --fixed $S --db $OUT/p-d1half.sqlite --no-progress > $OUT/p-tune.log 2>&1; echo "tune rc=$?"
grep -v "^ *warn" $OUT/p-tune.log | tail -12
python3 -m mlagen.cli db --db $OUT/p-d1half.sqlite export $OUT/p-d1half.json; echo "export rc=$?"
timeout 300 python3 -m pytest -q tests/gpu/test_fp8_gpu.py > $OUT/p-tests.log 2>&1; echo "fp8 tests rc=$?"; tail -3 $OUT/p-tests.log
