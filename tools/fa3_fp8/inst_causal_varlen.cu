// One leaf of FlashAttention-3's forward dispatch (hopper/flash_fwd_launch_template.h), built as a
// benchmark peer for mlagen's dense FP8 kernel: d_qk 192 / d_v 128, e4m3 in, bf16 out, causal, varlen,
// no cluster, V row-major (FA3 transposes it in shared memory), no PackGQA / split / paged / softcap.
#include "flash_fwd_launch_template.h"
#include "fa3_fp8_kernels.h"

void fa3_fp8_fwd_causal_varlen(Flash_fwd_params &params, cudaStream_t stream) {
    run_flash_fwd<90, /*kHeadDim=*/192, /*kHeadDimV=*/128, /*ClusterM=*/1, cutlass::float_e4m3_t, cutlass::bfloat16_t,
                  /*Is_causal=*/true, /*Is_local=*/false, /*Has_softcap=*/false, /*Varlen=*/true,
                  /*PagedKVNonTMA=*/false, /*AppendKV=*/false, /*HasQv=*/false, /*PackGQA=*/false,
                  /*Split=*/false, /*V_colmajor=*/false>(params, stream);
}
