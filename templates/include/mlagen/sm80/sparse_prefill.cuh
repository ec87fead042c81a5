// Sparse MLA prefill for Ampere-class tensor cores (mma.sync m16n8k16, ldmatrix, cp.async): the
// portable kernel of the family, correct on every NVIDIA target mlagen builds for.
//
// One CTA per (query token, group of 16 heads), four warps. Each block of 32 gathered KV rows is
// copied with 16-byte cp.async (invalid rows zero-filled, never read) into a STAGES-deep ring.
// Warp w scores keys [8w, 8w + 8) of the block against all 16 heads (Q from shared memory), the
// scores meet in shared memory, every warp runs the same online softmax over the whole block (so
// the four warps agree on the running max without exchanging it), and warp w accumulates output
// columns [128w, 128w + 128) with P from registers and V through ldmatrix.trans.
#pragma once
#include "mlagen/common/types.cuh"
#include "mlagen/sm80/mma.cuh"
#include "mlagen/sm80/smem_tile.cuh"

namespace mlagen::sm80::sparse {

constexpr int kHeads = 16;   // heads per CTA (the mma M)
constexpr int kWarps = 4;
constexpr int kBlockK = 32;  // keys per block: 8 per warp for Q K^T
constexpr int kSStride = kBlockK + 4;  // floats per staged score row (pad: spreads the banks)

template <class Cfg>
struct Layout {
  using QTile = SmemTile<kHeads, Cfg::kDQk, Swizzle::kXor>;
  using KTile = SmemTile<kBlockK, Cfg::kDQk, Swizzle::kXor>;
  static constexpr int kQ = 0;
  static constexpr int kK = kQ + QTile::kBytes;
  static constexpr int kS = kK + Cfg::kStages * KTile::kBytes;
  static constexpr int kValid = kS + kHeads * kSStride * 4;
  static constexpr int kSmemBytes = kValid + Cfg::kStages * kBlockK + 128;
};

template <class Cfg, class Params>
__device__ __forceinline__ const u16* kv_row(const Params& p, int row) {
  if constexpr (Cfg::kPaged)
    return p.kv + (i64)(row / p.page_size) * p.kv_page_stride + (i64)(row % p.page_size) * p.kv_row_stride;
  return p.kv + (i64)row * p.kv_row_stride;
}

// Thread tid copies row tid / 4 of the block, chunks tid % 4, tid % 4 + 4, ... (72 or 64 chunks).
template <class Cfg, class Params>
__device__ __forceinline__ void load_block(const Params& p, u32 smem, int t, int len, int block, int stage) {
  using L = Layout<Cfg>;
  const int tid = threadIdx.x, row = tid / 4;
  const int pos = block * kBlockK + row;
  int id = -1;
  if (pos < len) id = __ldg(p.indices + (i64)t * p.idx_row_stride + pos);
  const bool ok = id >= 0 && id < p.num_kv;
  const u16* src = kv_row<Cfg>(p, ok ? id : 0);
  const u32 dst = smem + L::kK + stage * L::KTile::kBytes;
#pragma unroll
  for (int c = tid % 4; c < Cfg::kDQk / 8; c += 4) cp_async_16(dst + L::KTile::offset(row, c), src + 8 * c, ok);
  if (tid % 4 == 0)
    asm volatile("st.shared.u8 [%0], %1;\n" ::"r"(smem + L::kValid + stage * kBlockK + row), "h"((u16)ok) : "memory");
}

template <class Cfg, class Params>
__device__ void forward(const Params& p) {
  using L = Layout<Cfg>;
  extern __shared__ __align__(128) u8 smem_raw[];
  const u32 smem = smem_u32(smem_raw);
  const int groups = (p.heads + kHeads - 1) / kHeads;
  const int t = blockIdx.x / groups;
  const int head0 = (blockIdx.x % groups) * kHeads;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;

  int len = p.topk;
  if (p.topk_length != nullptr) len = min(len, max(0, __ldg(p.topk_length + t)));
  const int blocks = (len + kBlockK - 1) / kBlockK;

  // Q: 16 rows (heads past H zero-filled).
  for (int i = tid; i < kHeads * (Cfg::kDQk / 8); i += kWarps * 32) {
    const int row = i / (Cfg::kDQk / 8), c = i % (Cfg::kDQk / 8);
    const bool ok = head0 + row < p.heads;
    const u16* src = p.q + (i64)t * p.q_row_stride + (i64)(ok ? head0 + row : 0) * p.q_head_stride + 8 * c;
    cp_async_16(smem + L::kQ + L::QTile::offset(row, c), src, ok);
  }
  if (blocks > 0) load_block<Cfg>(p, smem, t, len, 0, 0);
  cp_async_commit();
#pragma unroll
  for (int s = 1; s < Cfg::kStages - 1; ++s) {
    if (s < blocks) load_block<Cfg>(p, smem, t, len, s, s);
    cp_async_commit();
  }

  float o[16][4];
#pragma unroll
  for (int j = 0; j < 16; ++j) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.f;
  float m[2] = {neg_inf(), neg_inf()}, l[2] = {0.f, 0.f};
  const int r = lane / 4, q = lane % 4;

  for (int b = 0; b < blocks; ++b) {
    const int stage = b % Cfg::kStages;
    const int ahead = b + Cfg::kStages - 1;
    if (ahead < blocks) load_block<Cfg>(p, smem, t, len, ahead, ahead % Cfg::kStages);
    cp_async_commit();
    cp_async_wait<Cfg::kStages - 1>();
    __syncthreads();  // block b (and Q) landed for every thread's copies; its flags are visible

    // Scores of this warp's 8 keys, in the log2 domain; invalid keys -inf.
    const u32 k_tile = smem + L::kK + stage * L::KTile::kBytes;
    float s[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll 4
    for (int kk = 0; kk < Cfg::kDQk / 32; ++kk) {
      u32 bq[4];
      ldmatrix_x4(bq, k_tile + L::KTile::offset(8 * warp + lane % 8, 4 * kk + lane / 8));
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        u32 a[4];
        ldmatrix_x4(a, smem + L::kQ + L::QTile::offset((lane % 8) + 8 * ((lane / 8) % 2), 4 * kk + 2 * h + lane / 16));
        mma_bf16_16816(&s[0], a, bq[2 * h], bq[2 * h + 1]);
      }
    }
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int col = 8 * warp + 2 * q + (e % 2);
      u16 ok;
      asm volatile("ld.shared.u8 %0, [%1];\n" : "=h"(ok) : "r"(smem + L::kValid + stage * kBlockK + col));
      const float v = ok ? s[e] * p.scale_log2 : neg_inf();
      asm volatile("st.shared.f32 [%0], %1;\n" ::"r"(smem + L::kS + 4 * ((r + 8 * (e / 2)) * kSStride + col)), "f"(v)
                   : "memory");
    }
    __syncthreads();  // the block's scores are complete

    // Every warp: the same online softmax over the 32 keys, P as A fragments of two k-steps.
    float x[2][2][4];  // [row half][k-step][a-fragment element of that row]
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
      for (int kk = 0; kk < 2; ++kk)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int col = 16 * kk + 2 * q + (e % 2) + 8 * (e / 2);
          asm volatile("ld.shared.f32 %0, [%1];\n" : "=f"(x[h][kk][e]) : "r"(smem + L::kS + 4 * ((r + 8 * h) * kSStride + col)));
        }
    float corr[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float mx = m[h];
#pragma unroll
      for (int kk = 0; kk < 2; ++kk)
#pragma unroll
        for (int e = 0; e < 4; ++e) mx = fmaxf(mx, x[h][kk][e]);
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      const float sub = mx == neg_inf() ? 0.f : mx;  // no key yet: avoid inf - inf
      corr[h] = fast_exp2(m[h] - sub);
      m[h] = mx;
      float sum = 0.f;
#pragma unroll
      for (int kk = 0; kk < 2; ++kk)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          x[h][kk][e] = fast_exp2(x[h][kk][e] - sub);
          sum += x[h][kk][e];
        }
      l[h] = l[h] * corr[h] + sum;
    }
#pragma unroll
    for (int j = 0; j < 16; ++j) {
      o[j][0] *= corr[0];
      o[j][1] *= corr[0];
      o[j][2] *= corr[1];
      o[j][3] *= corr[1];
    }
    // O[:, 128 warp ...] += P V.
#pragma unroll
    for (int kk = 0; kk < 2; ++kk) {
      const u32 a[4] = {pack_bf16x2(x[0][kk][0], x[0][kk][1]), pack_bf16x2(x[1][kk][0], x[1][kk][1]),
                        pack_bf16x2(x[0][kk][2], x[0][kk][3]), pack_bf16x2(x[1][kk][2], x[1][kk][3])};
#pragma unroll
      for (int j = 0; j < 16; j += 2) {
        u32 bv[4];
        ldmatrix_x4_trans(bv, k_tile + L::KTile::offset(16 * kk + (lane % 8) + 8 * ((lane / 8) % 2),
                                                         16 * warp + j + lane / 16));
        mma_bf16_16816(&o[j][0], a, bv[0], bv[1]);
        mma_bf16_16816(&o[j + 1][0], a, bv[2], bv[3]);
      }
    }
    __syncthreads();  // stage and scores are free for the next block
  }
  cp_async_wait<0>();

#pragma unroll
  for (int h = 0; h < 2; ++h) {
    l[h] += __shfl_xor_sync(0xffffffffu, l[h], 1);
    l[h] += __shfl_xor_sync(0xffffffffu, l[h], 2);
  }
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int head = head0 + r + 8 * h;
    if (head >= p.heads) continue;
    float sink = neg_inf();
    if (p.attn_sink != nullptr) sink = __ldg(p.attn_sink + head) * 1.4426950408889634f;
    const float sub = m[h] == neg_inf() ? 0.f : m[h];
    const float inv = l[h] == 0.f ? 0.f : 1.f / (l[h] + fast_exp2(sink - sub));
    u16* dst = p.out + (i64)t * p.o_row_stride + (i64)head * p.o_head_stride + 128 * warp + 2 * q;
#pragma unroll
    for (int j = 0; j < 16; ++j)
      *reinterpret_cast<u32*>(dst + 8 * j) = pack_bf16x2(o[j][2 * h] * inv, o[j][2 * h + 1] * inv);
    if (warp == 0 && q == 0) {
      const bool empty = l[h] == 0.f;
      p.max_logits[(i64)t * p.ml_row_stride + head] = empty ? neg_inf() : m[h] * kLn2;
      p.lse[(i64)t * p.lse_row_stride + head] = empty ? pos_inf() : (m[h] + __log2f(l[h])) * kLn2;
    }
  }
}

}  // namespace mlagen::sm80::sparse
