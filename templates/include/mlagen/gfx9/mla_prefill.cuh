// Dense MLA prefill (MLA.md section 1) for gfx9 (CDNA3/CDNA4) with 32x32 bf16 MFMA atoms.
//
// A work-group owns BLOCK_M = 32 * WAVES query rows of one head; wave w owns rows [32w, 32w+32).
// Per key tile of BLOCK_N keys, K (nope | rope) and V^T are staged in LDS by all threads through
// registers: the next tile's global loads are issued before the current tile's math, and stored
// to LDS after it (into the other of two stages, or into the one stage behind a barrier).
// Each wave computes S^T = K Q^T (so a lane's accumulator column is one query, and softmax
// statistics are lane-local up to the two lane halves), then O^T += V^T P^T with P^T taken
// straight from the S^T registers (mfma_layout.cuh, pv_key). Softmax is online, in the exp2
// domain, with the rescale applied to O every tile.
#pragma once
#include "mlagen/common/tile_index.cuh"
#include "mlagen/gfx9/mfma.cuh"

namespace mlagen {
namespace gfx9 {

// One LDS stage: K [BLOCK_N][D_QK] (bf16, or fp8 when S is computed in fp8) with 2 * PAD bytes
// of padding per row, then V^T [D_V][BLOCK_N + PAD] in bf16.
template <class C>
struct PrefillLayout {
  static constexpr bool kKFp8 = C::AtomQK::kK == 64;
  static constexpr int kKRowBytes = C::kDQk * (kKFp8 ? 1 : 2) + 2 * C::kPad;
  static constexpr int kVtStride = C::kBlockN + C::kPad;  // bf16 elements
  static constexpr int kVtOffsetBytes = C::kBlockN * kKRowBytes;
  static constexpr int kStageBytes = kVtOffsetBytes + C::kDV * kVtStride * 2;
  static constexpr int kLdsBytes = C::kStages * kStageBytes;
  static_assert(kKRowBytes % 16 == 0 && kStageBytes % 16 == 0, "LDS rows and stages stay 16-byte aligned");
};

// The global -> register -> LDS copy of one key tile: 16-byte chunks spread over all threads.
template <class C>
struct KvTileCopy {
  static constexpr int kThreads = C::kWaves * kWave;
  static constexpr int kKChunksPerRow = C::kDQk / 8;  // nope chunks first, then rope
  static constexpr int kNopeChunks = C::kDNope / 8;
  static constexpr int kVChunksPerRow = C::kDV / 8;
  static constexpr int kKChunks = C::kBlockN * kKChunksPerRow;
  static constexpr int kVChunks = C::kBlockN * kVChunksPerRow;
  static constexpr int kKPer = (kKChunks + kThreads - 1) / kThreads;
  static constexpr int kVPer = (kVChunks + kThreads - 1) / kThreads;

  u32x4 k[kKPer];
  u32x4 v[kVPer];

  // Rows at or past len_k load zeros: they are masked, and zeros keep 0 * V finite. The loads
  // themselves read a clamped, valid row, so no lane branches around them (len_k > 0 here).
  template <class Params>
  __device__ __forceinline__ void load(const Params& p, const u16* k_base, const u16* kr_base, const u16* v_base,
                                       int key0, int len_k, int tid) {
#pragma unroll
    for (int i = 0; i < kKPer; ++i) {
      const int c = kKChunks % kThreads == 0 ? tid + i * kThreads : min(tid + i * kThreads, kKChunks - 1);
      const int row = c / kKChunksPerRow, col = c % kKChunksPerRow;
      const int key = min(key0 + row, len_k - 1);
      const u16* src = col < kNopeChunks ? k_base + (i64)key * p.k_row_stride + col * 8
                                         : kr_base + (i64)key * p.kr_row_stride + (col - kNopeChunks) * 8;
      const u32x4 x = *reinterpret_cast<const u32x4*>(src);
      k[i] = key0 + row < len_k ? x : u32x4{0u, 0u, 0u, 0u};
    }
#pragma unroll
    for (int i = 0; i < kVPer; ++i) {
      const int c = kVChunks % kThreads == 0 ? tid + i * kThreads : min(tid + i * kThreads, kVChunks - 1);
      const int row = c / kVChunksPerRow, col = c % kVChunksPerRow;
      const int key = min(key0 + row, len_k - 1);
      const u32x4 x = *reinterpret_cast<const u32x4*>(v_base + (i64)key * p.v_row_stride + col * 8);
      v[i] = key0 + row < len_k ? x : u32x4{0u, 0u, 0u, 0u};
    }
  }

  // K rows go in as 16-byte stores; V is transposed on the way (V^T[d][key], 2-byte stores) so
  // the P V product reads its A operand as runs of consecutive keys.
  // With fp8 S, K is quantized once here (8 bytes per chunk) rather than by every wave that reads it.
  __device__ __forceinline__ void store(u8* stage, int tid) const {
    using L = PrefillLayout<C>;
    u16* vt = reinterpret_cast<u16*>(stage + L::kVtOffsetBytes);
#pragma unroll
    for (int i = 0; i < kKPer; ++i) {
      const int c = tid + i * kThreads;
      if (kKChunks % kThreads == 0 || c < kKChunks) {
        const int row = c / kKChunksPerRow, col = c % kKChunksPerRow;
        if constexpr (L::kKFp8) {
          const u32x4 x = k[i];
          const u32x2 q = {pack_fp8x4(bf16_lo(x[0]), bf16_hi(x[0]), bf16_lo(x[1]), bf16_hi(x[1])),
                           pack_fp8x4(bf16_lo(x[2]), bf16_hi(x[2]), bf16_lo(x[3]), bf16_hi(x[3]))};
          *reinterpret_cast<u32x2*>(stage + row * L::kKRowBytes + col * 8) = q;
        } else {
          *reinterpret_cast<u32x4*>(stage + row * L::kKRowBytes + col * 16) = k[i];
        }
      }
    }
#pragma unroll
    for (int i = 0; i < kVPer; ++i) {
      const int c = tid + i * kThreads;
      if (kVChunks % kThreads == 0 || c < kVChunks) {
        const int row = c / kVChunksPerRow, d0 = (c % kVChunksPerRow) * 8;
#pragma unroll
        for (int e = 0; e < 8; ++e) {
          vt[(d0 + e) * L::kVtStride + row] = static_cast<u16>(v[i][e / 2] >> (16 * (e % 2)));
        }
      }
    }
  }
};

// Q^T as the B operand of k-step ks: this lane's query row, d = ks*K + b_row(RUN, lane, i), read
// from global memory in runs of RUN bf16 (quantized to fp8 for the fp8 atom).
template <class Atom>
__device__ __forceinline__ void load_q_fragment(const u16* row, int ks, int lane, bool ok,
                                                unsigned (&frag)[Atom::kWords]) {
  constexpr int K = Atom::kK, R = Atom::kRun;
#pragma unroll
  for (int g = 0; g < K / 2 / R; ++g) {
    const unsigned* src = reinterpret_cast<const unsigned*>(row + ks * K + b_row(R, lane, g * R));
    if constexpr (K == 64) {
#pragma unroll
      for (int w = 0; w < R / 4; ++w) {  // 4 bf16 (2 words) -> 4 fp8 (1 word)
        const unsigned x0 = ok ? src[2 * w] : 0u, x1 = ok ? src[2 * w + 1] : 0u;
        frag[g * R / 4 + w] = pack_fp8x4(bf16_lo(x0), bf16_hi(x0), bf16_lo(x1), bf16_hi(x1));
      }
    } else {
#pragma unroll
      for (int w = 0; w < R / 2; ++w) frag[g * R / 2 + w] = ok ? src[w] : 0u;
    }
  }
}

// K rows (keys) as the A operand of k-step ks, from the LDS stage.
template <class Atom, class L>
__device__ __forceinline__ void load_k_fragment(const u8* stage, int key, int ks, int lane,
                                                unsigned (&frag)[Atom::kWords]) {
  constexpr int K = Atom::kK, R = Atom::kRun;
  constexpr int kBytes = K == 64 ? 1 : 2;
#pragma unroll
  for (int g = 0; g < K / 2 / R; ++g) {
    const unsigned* src = reinterpret_cast<const unsigned*>(
        stage + key * L::kKRowBytes + (ks * K + a_col(R, lane, g * R)) * kBytes);
#pragma unroll
    for (int w = 0; w < R * kBytes / 4; ++w) frag[g * R * kBytes / 4 + w] = src[w];
  }
}

template <class C, class Params>
__device__ __forceinline__ void mla_prefill_forward(const Params& p, u8* lds) {
  using Atom = typename C::AtomQK;  // S^T = K Q^T (bf16, or fp8 on gfx950)
  using AtomPV = typename C::AtomPV;  // O^T = V^T P^T (bf16)
  using L = PrefillLayout<C>;
  constexpr int K = Atom::kK;
  constexpr int W = Atom::kWords;
  constexpr int KP = AtomPV::kK;
  constexpr int WP = AtomPV::kWords;
  constexpr int kQSteps = C::kDQk / K;     // k-steps of S^T = K Q^T
  constexpr int kSub = C::kBlockN / 32;    // 32-key sub-tiles of a key tile
  constexpr int kPvSteps = 32 / KP;        // k-steps of O^T = V^T P^T per sub-tile
  constexpr int kDTiles = C::kDV / 32;     // 32-row tiles of O^T
  constexpr bool CAUSAL = C::kCausal;

  const int tid = thread_x();
  const int lane = tid % kWave;
  const int wave = tid / kWave;
  const int half = half_of(lane);
  const int head = block_y();
  const QueryTile t = locate_tile<C::kBlockM, C::kBlockN, CAUSAL>(p.cu_seqlens_q, p.cu_seqlens_k, p.total_q,
                                                                    p.total_k, p.batch, block_x());
  if (t.rows <= 0) return;  // uniform over the work-group: no barrier is skipped by a part of it

  const int offset = t.seq.len_k - t.seq.len_q;  // bottom-right causal: key j visible to row i iff j <= i + offset
  const int qrow = t.row0 + wave * 32 + b_col(lane);   // this lane's query row within the sequence
  const bool wave_live = t.row0 + wave * 32 < t.seq.len_q;
  const int wave_last_key = t.row0 + wave * 32 + 31 + offset;  // no row of the wave sees a later key

  const u16* q_base = p.q + (i64)t.seq.q_start * p.q_row_stride + (i64)head * p.q_head_stride;
  const u16* k_base = p.k + (i64)t.seq.k_start * p.k_row_stride + (i64)head * p.k_head_stride;
  const u16* kr_base = p.k_rope + (i64)t.seq.k_start * p.kr_row_stride + (i64)head * p.kr_head_stride;
  const u16* v_base = p.v + (i64)t.seq.k_start * p.v_row_stride + (i64)head * p.v_head_stride;

  unsigned qf[kQSteps][W];
  {
    const bool ok = qrow < t.seq.len_q;
    const u16* row = q_base + (i64)(ok ? qrow : 0) * p.q_row_stride;
#pragma unroll
    for (int ks = 0; ks < kQSteps; ++ks) load_q_fragment<Atom>(row, ks, lane, ok, qf[ks]);
  }

  f32x16 o[kDTiles];
#pragma unroll
  for (int d = 0; d < kDTiles; ++d) o[d] = f32x16{};
  float row_max = neg_inf();  // of scale_log2 * s over the keys seen so far
  float row_sum = 0.f;        // this lane's partial sum (its half of the keys), reduced at the end

  KvTileCopy<C> copy;
  if (t.n_blocks > 0) {
    copy.load(p, k_base, kr_base, v_base, 0, t.seq.len_k, tid);
    copy.store(lds, tid);
    barrier();
  }
  for (int n = 0; n < t.n_blocks; ++n) {
    const bool more = n + 1 < t.n_blocks;
    if (more) copy.load(p, k_base, kr_base, v_base, (n + 1) * C::kBlockN, t.seq.len_k, tid);
    const u8* ks_lds = lds + (n % C::kStages) * L::kStageBytes;
    const u16* vt_lds = reinterpret_cast<const u16*>(ks_lds + L::kVtOffsetBytes);
    const int key0 = n * C::kBlockN;

    if (wave_live && (!CAUSAL || key0 <= wave_last_key)) {
      // S^T = K Q^T over 32-key sub-tiles.
      f32x16 s[kSub];
#pragma unroll
      for (int j = 0; j < kSub; ++j) s[j] = f32x16{};
#pragma unroll
      for (int ks = 0; ks < kQSteps; ++ks) {
#pragma unroll
        for (int j = 0; j < kSub; ++j) {
          unsigned a[W];
          load_k_fragment<Atom, L>(ks_lds, 32 * j + a_row(lane), ks, lane, a);
          Atom::mma(s[j], a, qf[ks]);
        }
      }
      sched_fence();
      // Masks (only on tiles that reach past a length or the diagonal), then the online softmax.
      const bool masked = n >= t.first_masked_block;
      float mx = neg_inf();
#pragma unroll
      for (int j = 0; j < kSub; ++j) {
#pragma unroll
        for (int r = 0; r < kAccRegs; ++r) {
          const int key = key0 + 32 * j + c_row(lane, r);
          const bool hidden = key >= t.seq.len_k || (CAUSAL && key > qrow + offset);
          s[j][r] = masked && hidden ? neg_inf() : s[j][r];
          mx = fmaxf(mx, s[j][r]);
        }
      }
      mx = fmaxf(mx, shfl(mx, lane ^ 32));  // the other half of the lanes holds the query's other keys
      const float new_max = fmaxf(row_max, mx * p.scale_log2);
      const float base = new_max == neg_inf() ? 0.f : new_max;  // -inf - -inf would be NaN
      const float corr = fast_exp2(row_max - base);
      row_max = new_max;
      float sum = 0.f;
      unsigned pf[kSub][kPvSteps][WP];  // P^T as bf16 B operands
#pragma unroll
      for (int j = 0; j < kSub; ++j) {
#pragma unroll
        for (int r = 0; r < kAccRegs; r += 2) {
          const float p0 = fast_exp2(s[j][r] * p.scale_log2 - base);
          const float p1 = fast_exp2(s[j][r + 1] * p.scale_log2 - base);
          sum += p0 + p1;
          pf[j][r / (KP / 2)][(r % (KP / 2)) / 2] = pack_bf16x2(p0, p1);
        }
      }
      row_sum = row_sum * corr + sum;
#pragma unroll
      for (int d = 0; d < kDTiles; ++d) o[d] *= corr;
      sched_fence();
      // O^T += V^T P^T: A is V^T rows d, in the key order pv_key gives B's registers.
#pragma unroll
      for (int j = 0; j < kSub; ++j) {
#pragma unroll
        for (int st = 0; st < kPvSteps; ++st) {
#pragma unroll
          for (int d = 0; d < kDTiles; ++d) {
            const u16* row = vt_lds + (32 * d + a_row(lane)) * L::kVtStride + 32 * j;
            unsigned a[WP];
#pragma unroll
            for (int w = 0; w < WP; w += 2) {  // runs of four consecutive keys: two words each
              const unsigned* run = reinterpret_cast<const unsigned*>(row + pv_key(KP, lane, st, 2 * w));
              a[w] = run[0];
              a[w + 1] = run[1];
            }
            AtomPV::mma(o[d], a, pf[j][st]);
          }
        }
      }
      sched_fence();
    }
    if (more) {
      if (C::kStages == 1) barrier();  // every wave is done reading the only stage
      copy.store(lds + ((n + 1) % C::kStages) * L::kStageBytes, tid);
      barrier();
    }
  }

  // Epilogue: normalise, write O (bf16) and the natural-log LSE; empty rows give 0 and +inf.
  if (!wave_live) return;
  const float total = row_sum + shfl(row_sum, lane ^ 32);
  const bool empty = !(total > 0.f);
  const float inv = empty ? 0.f : 1.f / total;
  if (qrow >= t.seq.len_q) return;
  const i64 grow = (i64)(t.seq.q_start + qrow);
  if (half == 0) p.lse[grow * p.lse_row_stride + head] = empty ? pos_inf() : (row_max + fast_log2(total)) * kLn2;
  u16* out = p.out + grow * p.o_row_stride + (i64)head * p.o_head_stride;
#pragma unroll
  for (int d = 0; d < kDTiles; ++d) {
#pragma unroll
    for (int g = 0; g < kAccRegs / 4; ++g) {
      const int col = 32 * d + c_row(lane, 4 * g);  // four consecutive d values
      u32x2 w = {pack_bf16x2(o[d][4 * g] * inv, o[d][4 * g + 1] * inv),
                 pack_bf16x2(o[d][4 * g + 2] * inv, o[d][4 * g + 3] * inv)};
      *reinterpret_cast<u32x2*>(out + col) = w;
    }
  }
}

}  // namespace gfx9
}  // namespace mlagen
