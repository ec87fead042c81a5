#!/usr/bin/env bash
# Session 6, second H100 run: the new (c3) records against the old ones in one process (mlagen:<symbol> peers),
# FA3 beside them; D2/D6/D7 again; FP8 new vs old records.
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 MLAGEN_OUT_DIR=/tmp/mlo
T0=$(date +%s); S=$OUT/summary.txt; L=$OUT/bench.log
env -u OUT nice python3 shared/peers/fa3/build_fa3.py --build-dir shared/peers/fa3/build > /tmp/fa3build.log 2>&1; echo "fa3 build rc=$? $(( $(date +%s)-T0 ))s" >> $S
O=mla_prefill_sm90_causal_c2_n128_s2_qsmem_opingpong_ov1_rsoverlapped_pwearly_schdynamic_eptma_lw2_rp24_rc240_sq128_sk128_sv128_cl1
for job in "D1 mla_prefill_sm90_causal_c2_n128_s2_qsmem_opingpong_ov1_rsoverlapped_pwearly_schstatic_eptma_lw1_rp24_rc240_sq64_sk128_sv128_cl2" \
           "D3 mla_prefill_sm90_none_c2_n128_s2_qregs_opingpong_ov1_rsoverlapped_pwearly_schstatic_epdirect_lw2_rp24_rc240_sq128_sk128_sv128_cl2" \
           "D4 $O" "D5 $O" "b=1,q=8192,k=8192,h=64,causal $O"; do
  set -- $job
  timeout 60 python3 -m mlagen.cli bench --shapes $1 --peers fa3,mlagen,mlagen:$2 --rounds 5 --markdown $OUT/t.md >> $L 2>&1
  echo "bench $1 rc=$? $(( $(date +%s)-T0 ))s" >> $S; grep "^| " $OUT/t.md | tail -1 >> $OUT/oldnew.md
done
timeout 90 python3 -m mlagen.cli bench --shapes D2,D6,D7 --peers fa3,cudnn,mlagen --rounds 5 --markdown $OUT/bench_short.md >> $L 2>&1
echo "bench short rc=$? $(( $(date +%s)-T0 ))s" >> $S
timeout 90 python3 -m mlagen.bench_fp8 --shapes D1,D3 --rounds 5 --variant consumers=2,block_n=224,stages=2,q_operand=smem,order=none,overlap=true,rescale=first,pv_wait=early,scheduler=dynamic,load_warps=1,producer_regs=24,consumer_regs=240,swizzle_q=64,swizzle_k=64,swizzle_v=32,cluster=1 --variant consumers=2,block_n=192,stages=2,q_operand=smem,order=pingpong,overlap=true,rescale=overlapped,pv_wait=early,scheduler=static,load_warps=1,producer_regs=24,consumer_regs=240,swizzle_q=64,swizzle_k=64,swizzle_v=64,cluster=1 > $OUT/bench_fp8.log 2>&1
echo "fp8 rc=$? $(( $(date +%s)-T0 ))s" >> $S
rm -f $OUT/t.md
cat $S; cat $OUT/oldnew.md | cut -c1-400; grep "^| " $OUT/bench_short.md; grep -v ": ok" $OUT/bench_fp8.log | cut -c1-200
