// Score traits of the online softmax (online_softmax.cuh; MLA.md section 1b): softcap's tanh and
// the attention sink's denominator.
#pragma once
#include "mlagen/common/types.cuh"
#include "mlagen/cuda/online_softmax.cuh"

namespace mlagen {

constexpr float kLog2e = 1.4426950408889634f;

// softmax_finish with a sink (MLA.md section 2): the denominator gains exp(sink) (sink_log2 =
// sink * log2(e), in the domain of max_scaled); lse ignores it. A row with no visible key still
// gets inv = 0 and lse = +inf.
__device__ __forceinline__ void softmax_finish_sink(RowStats& st, float sink_log2, float (&inv)[2], float (&lse)[2]) {
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const float total = quad_sum(st.sum[r]);
    const bool empty = !(total > 0.f);
    inv[r] = empty ? 0.f : 1.f / (total + fast_exp2(sink_log2 - st.max_scaled[r]));
    lse[r] = empty ? pos_inf() : (st.max_scaled[r] + fast_log2(total)) * kLn2;
  }
}

// tanh to about 1e-7 absolute (softcap): 1 - 2 / (1 + e^{2|x|}) with the sign of x, on two MUFU
// operations; tanh.approx.f32 (one) is off by up to 2^-11 relative, c * 2^-11 in a capped score.
__device__ __forceinline__ float tanh_accurate(float x) {
  const float e = fast_exp2(-2.f * kLog2e * fabsf(x));  // in (0, 1]
  return copysignf(__fdividef(1.f - e, 1.f + e), x);
}

}  // namespace mlagen
