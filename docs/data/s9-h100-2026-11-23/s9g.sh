#!/usr/bin/env bash
# Session 9 H100 call 7: Nsight Compute of the bf16 and FP8 records (lazy maximum) on D1 and D3: what limits FP8.
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 MLAGEN_OUT_DIR=/tmp/mlo
T0=$(date +%s); S=$OUT/summary.txt
el() { echo $(( $(date +%s)-T0 )); }
NCU="/usr/local/cuda/bin/ncu --profile-from-start off --clock-control none --set full --import-source no"
for id in D1 D3; do
  timeout 200 $NCU --csv --page raw python3 .carry/prof/prof9.py $id > $OUT/ncu-$id.csv 2> /tmp/ncu-$id.err
  echo "ncu $id rc=$? $(el)s" >> $S; tail -3 /tmp/ncu-$id.err >> $S
done
for id in D1 D3; do python3 .carry/prof/ncu_sum.py $OUT/ncu-$id.csv gpu__time_duration.sum,sm__inst_executed.sum,smsp__issue_active.avg.pct_of_peak_sustained_active,sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active,sm__inst_executed_pipe_xu.avg.pct_of_peak_sustained_active,sm__pipe_fma_cycles_active.avg.pct_of_peak_sustained_active,sm__pipe_alu_cycles_active.avg.pct_of_peak_sustained_active,sm__cycles_elapsed.avg.per_second >> $S 2>&1; done
cat $S
