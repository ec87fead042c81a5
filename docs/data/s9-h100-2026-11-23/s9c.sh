#!/usr/bin/env bash
# Session 9 H100 call 3: FP8 c3 records with the lazy maximum; records for the c3 shapes with rescale=lazy.
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 MLAGEN_OUT_DIR=/tmp/mlo
T0=$(date +%s); S=$OUT/summary.txt
el() { echo $(( $(date +%s)-T0 )); }
F8="consumers=3,block_n=96,stages=3,q_operand=smem,order=none,overlap=true,scheduler=dynamic,epilogue=direct,load_warps=1,producer_regs=24,consumer_regs=160,swizzle_q=64,swizzle_k=64,swizzle_v=32,cluster=1"
timeout 120 python3 -m mlagen.bench_fp8 --shapes D1 --variant $F8,pv_wait=late,rescale=overlapped --variant $F8,pv_wait=late,rescale=lazy > $OUT/fp8.log 2>&1; echo "fp8 D1 rc=$? $(el)s" >> $S
timeout 120 python3 -m mlagen.bench_fp8 --shapes D3 --variant $F8,pv_wait=early,rescale=overlapped --variant $F8,pv_wait=early,rescale=lazy >> $OUT/fp8.log 2>&1; echo "fp8 D3 rc=$? $(el)s" >> $S
L=_c3_n80_s3_qsmem_onone_ov1_rslazy_pwearly_schdynamic_eptma_lw1_rp24_rc160_sq128_sk128_sv128_cl1
export MLAGEN_TUNING_DB=/tmp/rec.sqlite
for sh in "D1 causal" "D3 none" "D4 causal" "b=1,q=8192,h=64,causal causal"; do
  set -- $sh
  timeout 120 python3 -m mlagen.cli tune mla_prefill_sm90 --shape $1 --fixed mla_prefill_sm90_$2$L --no-progress >> $OUT/tune.log 2>&1; echo "tune $1 rc=$? $(el)s" >> $S
done
python3 -m mlagen.cli db export --best-only $OUT/rec.json >> $S 2>&1
cat $S; grep -vE "^\s*$" $OUT/fp8.log | tail -30; grep -E "winner|best|TFLOP|Error" $OUT/tune.log | tail -20
