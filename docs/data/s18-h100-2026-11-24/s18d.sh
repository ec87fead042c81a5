#!/usr/bin/env bash
# Session 18 H100 call d: the tuner over where V^T is made, the ring depth and the producer's
# registers, the rest of each shipped FP8 record held fixed (D1 and D3), then bench_fp8 with the
# winners forced beside the shipped records.
export PYTHONUNBUFFERED=1 MLAGEN_OUT_DIR=/tmp/mlo PYTHONPATH=$PWD
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
C=consumers=3,order=none,block_n=96,swizzle_v=32,load_warps=1,consumer_regs=160,rescale=lazy,epilogue=direct,q_operand=smem,overlap=true,scheduler=dynamic,swizzle_q=64,swizzle_k=64,cluster=1
for sh in D1 D3; do
  if [ $sh = D1 ]; then F=$C,pv_wait=late,diagonal=half; else F=$C,pv_wait=early,diagonal=full; fi
  timeout 250 python3 -m mlagen.cli tune mla_prefill_sm90_fp8 --shape $sh --fixed $F --db $OUT/d-$sh.sqlite --no-progress --top 6 > $OUT/d-tune-$sh.log 2>&1; echo "tune $sh rc=$?"
  python3 -m mlagen.cli db --db $OUT/d-$sh.sqlite export $OUT/d-$sh.json > /dev/null 2>&1
  tail -25 $OUT/d-tune-$sh.log
done
