// Online softmax over accumulator fragments in the exp2 domain, with the scale folded in.
//
// Fragments follow the mma/wgmma accumulator layout: a thread holds, for each 8-column group j,
// values (row g, cols 2c, 2c+1) in [4j], [4j+1] and (row g+8, same cols) in [4j+2], [4j+3], where
// the four lanes of a quad share the rows. Row statistics are therefore reduced over quads.
// NVIDIA-only (warp shuffles, mma layouts); the gfx9 kernels keep one query per lane instead.
#pragma once
#include "mlagen/common/types.cuh"

namespace mlagen {

__device__ __forceinline__ float quad_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
  return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}

__device__ __forceinline__ float quad_sum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

// Running statistics of two rows (g and g+8) of a 16-row slice. max_scaled is the row maximum of
// scale*log2(e)*s; sum is this thread's partial sum of exp2(scaled - max), reduced at the end.
struct RowStats {
  float max_scaled[2];
  float sum[2];

  __device__ __forceinline__ void init() {
    max_scaled[0] = max_scaled[1] = neg_inf();
    sum[0] = sum[1] = 0.f;
  }
};

// Rescale-and-exponentiate one tile of scores in place: s becomes exp2(s*scale_log2 - new_max).
// Returns the factor by which the output accumulator of each row must be multiplied.
// A row that has seen only masked keys keeps max = -inf; its factors and probabilities are 0.
template <int N_FRAGS>
__device__ __forceinline__ void softmax_update(float (&s)[N_FRAGS * 4], RowStats& st, float scale_log2,
                                               float (&correction)[2]) {
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    float mx = neg_inf();
#pragma unroll
    for (int j = 0; j < N_FRAGS; ++j) mx = fmaxf(mx, fmaxf(s[4 * j + 2 * r], s[4 * j + 2 * r + 1]));
    mx = quad_max(mx);
    const float new_max = fmaxf(st.max_scaled[r], mx * scale_log2);
    // -inf - (-inf) is NaN: subtract 0 instead while the row has seen nothing.
    const float base = new_max == neg_inf() ? 0.f : new_max;
    correction[r] = fast_exp2(st.max_scaled[r] - base);
    st.max_scaled[r] = new_max;
    float sum = 0.f;
#pragma unroll
    for (int j = 0; j < N_FRAGS; ++j) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        float p = fast_exp2(fmaf(s[4 * j + 2 * r + e], scale_log2, -base));
        s[4 * j + 2 * r + e] = p;
        sum += p;
      }
    }
    st.sum[r] = st.sum[r] * correction[r] + sum;
  }
}

// Final per-row normaliser and log-sum-exp (natural log). A row with no visible key gets
// inv = 0 (output 0) and lse = +inf.
__device__ __forceinline__ void softmax_finish(RowStats& st, float (&inv)[2], float (&lse)[2]) {
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const float total = quad_sum(st.sum[r]);
    const bool empty = !(total > 0.f);
    inv[r] = empty ? 0.f : 1.f / total;
    lse[r] = empty ? pos_inf() : (st.max_scaled[r] + fast_log2(total)) * kLn2;
  }
}

}  // namespace mlagen
