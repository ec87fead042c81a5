#!/usr/bin/env bash
# Session 18 H100 call p: the V^T transpose's ldmatrix.trans / stmatrix alone (tmicro.cu) under Nsight
# Compute: shared-memory wavefronts and bank conflicts per instruction in isolation.
D=docs/data/s18-h100-2026-11-24
nvcc -arch=sm_90a -O3 -o /tmp/tmicro $D/tmicro.cu && /tmp/tmicro
M=l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum,l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ld.sum,l1tex__data_pipe_lsu_wavefronts_mem_shared_op_st.sum,smsp__inst_executed_op_ldsm.sum,l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum,l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum,smsp__sass_inst_executed_op_shared_st.sum,smsp__sass_inst_executed_op_shared_ld.sum
/usr/local/cuda/bin/ncu --metrics $M --csv /tmp/tmicro > $OUT/p-ncu.csv 2>&1; grep -v "^==" $OUT/p-ncu.csv | tail -20
