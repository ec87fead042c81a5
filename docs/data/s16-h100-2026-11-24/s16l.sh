#!/usr/bin/env bash
# Session 16 H100 call l: Q in registers on the dynamic scheduler (allowed again since the fence) against the shipped
# records of D2, D6, D7, in one mlagen bench run (interleaved rounds, L2 flushed, public call and forced variants).
export PYTHONUNBUFFERED=1 MLAGEN_OUT_DIR=/tmp/mlo PYTHONPATH=$PWD
A=mla_prefill_sm90_causal_c2_n128_s2_qregs_opingpong_ov1_rsoverlapped_pwearly_schdynamic_epdirect_lw2_rp24_rc240_sq128_sk128_sv128_cl1_dghalf
B=mla_prefill_sm90_causal_c2_n128_s2_qregs_opingpong_ov1_rsoverlapped_pwearly_schdynamic_epvtma_lw2_rp24_rc240_sq128_sk128_sv128_cl1_dghalf
C=mla_prefill_sm90_causal_c2_n128_s2_qregs_opingpong_ov1_rslazy_pwearly_schdynamic_epvtma_lw2_rp24_rc240_sq128_sk128_sv128_cl1_dghalf
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
timeout 500 python3 -m mlagen.cli bench --shapes D2,D7,D6 --peers cudnn,mlagen,mlagen:$A,mlagen:$B,mlagen:$C --rounds 5 \
  --markdown $OUT/l-bench.md > $OUT/l-bench.log 2>&1; echo "bench rc=$?"
cat $OUT/l-bench.md | head -60
