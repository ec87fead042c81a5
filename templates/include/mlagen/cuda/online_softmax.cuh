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

// How far (log2 units) a row's scores may rise above its kept maximum before a lazy softmax moves
// it: probabilities then reach at most 2^8 = 256, which bf16, e4m3 (448) and the fp32 sums hold.
constexpr float kLazyMaxMargin = 8.f;

// The largest of this thread's scores of row r (g or g+8), elements [LO, LO + N) of the row in
// fragment order, as a balanced tree: the softmax waits for it before its first exponential, and
// a tree is about log2(2 N_FRAGS) FMNMX deep where a running maximum is N_FRAGS deep. fmaxf is
// exact, so the order does not change the result. (Templates, not a loop: every index is a
// compile-time constant, so the scores stay in registers.)
template <int N_FRAGS, int LO, int N>
struct RowMaxTree {
  static __device__ __forceinline__ float run(const float (&s)[N_FRAGS * 4], int r) {
    return fmaxf(RowMaxTree<N_FRAGS, LO, N / 2>::run(s, r), RowMaxTree<N_FRAGS, LO + N / 2, N - N / 2>::run(s, r));
  }
};
template <int N_FRAGS, int LO>
struct RowMaxTree<N_FRAGS, LO, 1> {
  static __device__ __forceinline__ float run(const float (&s)[N_FRAGS * 4], int r) {
    return s[4 * (LO / 2) + 2 * r + LO % 2];
  }
};
template <int N_FRAGS>
__device__ __forceinline__ float thread_row_max(const float (&s)[N_FRAGS * 4], int r) {
  return RowMaxTree<N_FRAGS, 0, 2 * N_FRAGS>::run(s, r);
}

// Rescale-and-exponentiate one tile of scores in place: s becomes exp2(s*scale_log2 - new_max).
// Returns the factor by which the output accumulator of each row must be multiplied.
// A row that has seen only masked keys keeps max = -inf; its factors and probabilities are 0.
// LAZY keeps every row's maximum unless some row of the warp would rise by more than
// kLazyMaxMargin (a warp vote, so the decision is warp-uniform); the factors are then exactly 1
// and the caller may skip the output rescale (see any_row_moved). The result is the same softmax:
// the maximum only has to bound the scores well enough that exp2 neither overflows nor loses them.
template <int N_FRAGS, bool LAZY = false>
__device__ __forceinline__ void softmax_update(float (&s)[N_FRAGS * 4], RowStats& st, float scale_log2,
                                               float (&correction)[2]) {
  float mx[2];
  bool keep = false;  // LAZY: every row of the warp keeps its maximum
  if constexpr (LAZY) {
    // Whether some row rises past its kept maximum by the margin is decided on each thread's own
    // maximum (the scale is positive, so max(m) * scale = max(m * scale)) and one vote: the quad
    // shuffles for the row maximum run only when some row moves, not on the common path.
    float m[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) m[r] = thread_row_max<N_FRAGS>(s, r);
    // -inf + margin is -inf, so a row's first visible score always moves it.
    keep = !__any_sync(0xffffffffu, m[0] * scale_log2 > st.max_scaled[0] + kLazyMaxMargin ||
                                        m[1] * scale_log2 > st.max_scaled[1] + kLazyMaxMargin);
    if (!keep) {
#pragma unroll
      for (int r = 0; r < 2; ++r) mx[r] = quad_max(m[r]) * scale_log2;
    }
  }
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    if constexpr (!LAZY) mx[r] = quad_max(thread_row_max<N_FRAGS>(s, r)) * scale_log2;
    const float new_max = keep ? st.max_scaled[r] : fmaxf(st.max_scaled[r], mx[r]);
    // -inf - (-inf) is NaN: subtract 0 instead while the row has seen nothing.
    const float base = new_max == neg_inf() ? 0.f : new_max;
    correction[r] = keep ? 1.f : fast_exp2(st.max_scaled[r] - base);
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

// Warp-uniform: does any row of this warp have a correction other than 1 (its maximum moved)?
__device__ __forceinline__ bool any_row_moved(const float (&correction)[2]) {
  return __any_sync(0xffffffffu, correction[0] != 1.f || correction[1] != 1.f);
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
