// The two FA3 FP8 forward leaves compiled by build.py (inst_*_varlen.cu).
#pragma once
#include <cuda_runtime_api.h>
#include "flash.h"

void fa3_fp8_fwd_causal_varlen(Flash_fwd_params &params, cudaStream_t stream);
void fa3_fp8_fwd_noncausal_varlen(Flash_fwd_params &params, cudaStream_t stream);
