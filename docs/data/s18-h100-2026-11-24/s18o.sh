#!/usr/bin/env bash
# Session 18 H100 call o: one arrival per transposing warp on v_full instead of 32 (Nsight Compute, call n: the
# in-kernel mode had 5.8 M shared bank conflicts and 23% more shared wavefronts) against c197248 (as
# mla_prefill_sm90_fp8_base, installed on this machine before the call), then the FP8 GPU tests.
export PYTHONUNBUFFERED=1 MLAGEN_OUT_DIR=/tmp/mlo PYTHONPATH=$PWD
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
timeout 200 python3 docs/data/s18-h100-2026-11-24/ab18.py D1,D3 8 > $OUT/o-ab.log 2>&1; echo "ab rc=$?"
cat $OUT/o-ab.log
timeout 300 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_fp8_gpu.py -k "not base" > $OUT/o-tests.log 2>&1; echo "tests rc=$?"
grep -E "passed|failed|^FAILED|^ERROR" $OUT/o-tests.log | tail -15
M=gpu__time_duration.sum,l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum,l1tex__data_pipe_lsu_wavefronts_mem_shared.sum,l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ld.sum,l1tex__data_pipe_lsu_wavefronts_mem_shared_op_st.sum,l1tex__data_pipe_lsu_wavefronts_mem_shared_op_atom.sum,smsp__inst_executed_op_shared_atom.sum,smsp__inst_executed_op_ldsm.sum,smsp__inst_executed_op_stsm.sum
timeout 120 /usr/local/cuda/bin/ncu --profile-from-start off --clock-control none --metrics $M --csv python3 docs/data/s18-h100-2026-11-24/prof18.py > $OUT/o-ncu.csv 2> $OUT/o-ncu.err; echo "ncu rc=$?"
grep -v "^==" $OUT/o-ncu.csv | awk -F'","' '{print $5 " | " $(NF-2) " | " $NF}' | cut -c1-200 | tail -30
