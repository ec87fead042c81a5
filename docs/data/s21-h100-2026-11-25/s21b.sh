#!/bin/bash
# Session 21, call b: a user's short tunes (30 trials, fresh database each, shipped records in
# place) after the paired-rounds rule for replacing the record in use. Logs under $OUT.
export PYTHONPATH=$PWD
run() {  # name spec shape
  timeout 150 python3 -m mlagen.cli tune $2 --shape $3 --max-trials 30 --db $OUT/b-$1.sqlite --no-progress \
    > $OUT/b-$1.log 2>&1
  echo "rc=$?" >> $OUT/b-$1.log
}
run fp8-D3 mla_prefill_sm90_fp8 D3
run fp8-D1 mla_prefill_sm90_fp8 D1
run bf16-D1 mla_prefill_sm90 D1
run bf16-D3 mla_prefill_sm90 D3
run sparse-S1-fp8 mla_sparse_prefill_sm90 sq=4096,h=128,topk=2048,skv=8192,kv=fp8_v32
