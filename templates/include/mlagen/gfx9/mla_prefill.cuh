// Dense MLA prefill (MLA.md section 1) for gfx9 (CDNA3/CDNA4) with 32x32 MFMA atoms: bf16 inputs on
// the bf16 atoms, fp8 e4m3 inputs (with descale factors) on the fp8 atoms for both products.
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

// Inputs are bf16 (C::kInBytes = 2) or fp8 e4m3 (1 byte: OCP on gfx950, FNUZ on gfx942); every
// address below is in bytes, every stride the launcher passes in elements.
//
// One LDS stage: K [BLOCK_N][D_QK] in the input type with 2 * PAD bytes of padding per row, then
// V^T [D_V][BLOCK_N + PAD] in the input type; optionally Q [BLOCK_M][D_QK] after the stages.
template <class C>
struct PrefillLayout {
  static constexpr int kBytes = C::kInBytes;
  static constexpr int kKRowBytes = C::kDQk * kBytes + 2 * C::kPad;
  static constexpr int kVtStrideBytes = (C::kBlockN + C::kPad) * kBytes;
  static constexpr int kVtOffsetBytes = C::kBlockN * kKRowBytes;
  static constexpr int kStageBytes = kVtOffsetBytes + C::kDV * kVtStrideBytes;
  // C::kQInLds: after the stages, the work-group's Q rows (padded like K rows), read per k-step
  // instead of held in registers.
  static constexpr int kQRowBytes = C::kDQk * kBytes + 2 * C::kPad;
  static constexpr int kQOffsetBytes = C::kStages * kStageBytes;
  static constexpr int kLdsBytes = kQOffsetBytes + (C::kQInLds ? C::kBlockM * kQRowBytes : 0);
  static_assert(kKRowBytes % 16 == 0 && kStageBytes % 16 == 0, "LDS rows and stages stay 16-byte aligned");
};

// The global -> register -> LDS copy of one key tile: 16-byte chunks spread over the threads.
// C::kKvSplit: the first half of the waves copies K, the second half V (the branch is uniform per
// wave), each through the same registers; otherwise every thread copies both.
template <class C>
struct KvTileCopy {
  static constexpr int kThreads = C::kWaves * kWave;
  static constexpr bool kSplit = C::kKvSplit;
  static_assert(!kSplit || C::kWaves % 2 == 0, "splitting the copy needs an even number of waves");
  static constexpr int kKThreads = kSplit ? kThreads / 2 : kThreads;  // threads copying K (first ones)
  static constexpr int kVThreads = kSplit ? kThreads / 2 : kThreads;  // threads copying V
  static constexpr int kElems = 16 / C::kInBytes;             // elements per 16-byte chunk
  static constexpr int kKChunksPerRow = C::kDQk / kElems;     // nope chunks first, then rope
  static constexpr int kNopeChunks = C::kDNope / kElems;
  static constexpr int kVChunksPerRow = C::kDV / kElems;
  static constexpr int kKChunks = C::kBlockN * kKChunksPerRow;
  static constexpr int kVChunks = C::kBlockN * kVChunksPerRow;
  static constexpr int kKPer = (kKChunks + kKThreads - 1) / kKThreads;
  static constexpr int kVPer = (kVChunks + kVThreads - 1) / kVThreads;
  static constexpr int kVOff = kSplit ? 0 : kKPer;  // where a thread's V chunks start in buf
  static constexpr int kBuf = kSplit ? (kKPer > kVPer ? kKPer : kVPer) : kKPer + kVPer;

  u32x4 buf[kBuf];

  __device__ __forceinline__ static bool copies_k(int tid) { return !kSplit || tid < kKThreads; }
  __device__ __forceinline__ static bool copies_v(int tid) { return !kSplit || tid >= kKThreads; }
  __device__ __forceinline__ static int v_thread(int tid) { return kSplit ? tid - kKThreads : tid; }

  // Rows at or past len_k load zeros: they are masked, and zeros keep 0 * V finite. The loads
  // themselves read a clamped, valid row, so no lane branches around them (len_k > 0 here).
  template <class Params>
  __device__ __forceinline__ void load(const Params& p, const u8* k_base, const u8* kr_base, const u8* v_base,
                                       int key0, int len_k, int tid) {
    constexpr int B = C::kInBytes;
    if (copies_k(tid)) {
#pragma unroll
      for (int i = 0; i < kKPer; ++i) {
        const int c = kKChunks % kKThreads == 0 ? tid + i * kKThreads : min(tid + i * kKThreads, kKChunks - 1);
        const int row = c / kKChunksPerRow, col = c % kKChunksPerRow;
        const int key = min(key0 + row, len_k - 1);
        const u8* src = col < kNopeChunks ? k_base + (i64)key * p.k_row_stride * B + col * 16
                                          : kr_base + (i64)key * p.kr_row_stride * B + (col - kNopeChunks) * 16;
        const u32x4 x = *reinterpret_cast<const u32x4*>(src);
        buf[i] = key0 + row < len_k ? x : u32x4{0u, 0u, 0u, 0u};
      }
    }
    if (copies_v(tid)) {
      const int t = v_thread(tid);
#pragma unroll
      for (int i = 0; i < kVPer; ++i) {
        const int c = kVChunks % kVThreads == 0 ? t + i * kVThreads : min(t + i * kVThreads, kVChunks - 1);
        const int row = c / kVChunksPerRow, col = c % kVChunksPerRow;
        const int key = min(key0 + row, len_k - 1);
        const u32x4 x = *reinterpret_cast<const u32x4*>(v_base + (i64)key * p.v_row_stride * B + col * 16);
        buf[kVOff + i] = key0 + row < len_k ? x : u32x4{0u, 0u, 0u, 0u};
      }
    }
  }

  // K rows go in as 16-byte stores; V is transposed on the way (V^T[d][key], one element per
  // store) so the P V product reads its A operand as runs of four consecutive keys.
  __device__ __forceinline__ void store(u8* stage, int tid) const {
    using L = PrefillLayout<C>;
    u8* vt = stage + L::kVtOffsetBytes;
    if (copies_k(tid)) {
#pragma unroll
      for (int i = 0; i < kKPer; ++i) {
        const int c = tid + i * kKThreads;
        if (kKChunks % kKThreads == 0 || c < kKChunks) {
          const int row = c / kKChunksPerRow, col = c % kKChunksPerRow;
          *reinterpret_cast<u32x4*>(stage + row * L::kKRowBytes + col * 16) = buf[i];
        }
      }
    }
    if (copies_v(tid)) {
      const int t = v_thread(tid);
#pragma unroll
      for (int i = 0; i < kVPer; ++i) {
        const int c = t + i * kVThreads;
        if (kVChunks % kVThreads == 0 || c < kVChunks) {
          const int row = c / kVChunksPerRow, d0 = (c % kVChunksPerRow) * kElems;
          const u32x4 x = buf[kVOff + i];
#pragma unroll
          for (int e = 0; e < kElems; ++e) {
            if constexpr (C::kInBytes == 2) {
              reinterpret_cast<u16*>(vt + (d0 + e) * L::kVtStrideBytes)[row] = static_cast<u16>(x[e / 2] >> (16 * (e % 2)));
            } else {
              vt[(d0 + e) * L::kVtStrideBytes + row] = static_cast<u8>(x[e / 4] >> (8 * (e % 4)));
            }
          }
        }
      }
    }
  }
};

// Q^T as the B operand of k-step ks: this lane's query row, d = ks*K + b_row(RUN, lane, i), read
// from global memory in runs of RUN elements.
template <class Atom>
__device__ __forceinline__ void load_q_fragment(const u8* row, int ks, int lane, bool ok,
                                                unsigned (&frag)[Atom::kWords]) {
  constexpr int K = Atom::kK, R = Atom::kRun, B = Atom::kBytes;
  constexpr int kRunWords = R * B / 4;
#pragma unroll
  for (int g = 0; g < K / 2 / R; ++g) {
    const unsigned* src = reinterpret_cast<const unsigned*>(row + (ks * K + b_row(R, lane, g * R)) * B);
#pragma unroll
    for (int w = 0; w < kRunWords; ++w) frag[g * kRunWords + w] = ok ? src[w] : 0u;
  }
}

// K rows (keys) as the A operand of k-step ks, from the LDS stage.
template <class Atom, class L>
__device__ __forceinline__ void load_k_fragment(const u8* stage, int key, int ks, int lane,
                                                unsigned (&frag)[Atom::kWords]) {
  constexpr int K = Atom::kK, R = Atom::kRun, B = Atom::kBytes;
  constexpr int kRunWords = R * B / 4;
#pragma unroll
  for (int g = 0; g < K / 2 / R; ++g) {
    const unsigned* src = reinterpret_cast<const unsigned*>(
        stage + key * L::kKRowBytes + (ks * K + a_col(R, lane, g * R)) * B);
#pragma unroll
    for (int w = 0; w < kRunWords; ++w) frag[g * kRunWords + w] = src[w];
  }
}

// A descale factor: the tensor's (head stride 0) or the head's; a null pointer means 1.
__device__ __forceinline__ float descale(const float* d, int head, int head_stride) {
  return d == nullptr ? 1.f : d[head * head_stride];
}

template <class C, class Params>
__device__ __forceinline__ void mla_prefill_forward(const Params& p, u8* lds) {
  using Atom = typename C::AtomQK;    // S^T = K Q^T
  using AtomPV = typename C::AtomPV;  // O^T = V^T P^T (P^T in the input type)
  using L = PrefillLayout<C>;
  constexpr int K = Atom::kK;
  constexpr int W = Atom::kWords;
  constexpr int KP = AtomPV::kK;
  constexpr int WP = AtomPV::kWords;
  constexpr int kPPerWord = 4 / AtomPV::kBytes;  // P^T elements per 32-bit word
  constexpr int kQSteps = C::kDQk / K;     // k-steps of S^T = K Q^T
  constexpr int kSub = C::kBlockN / 32;    // 32-key sub-tiles of a key tile
  constexpr int kPvSteps = C::kBlockN / KP;  // k-steps of O^T = V^T P^T over the key tile
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

  constexpr int B = C::kInBytes;
  const u8* q_base = reinterpret_cast<const u8*>(p.q) +
                     ((i64)t.seq.q_start * p.q_row_stride + (i64)head * p.q_head_stride) * B;
  const u8* k_base = reinterpret_cast<const u8*>(p.k) +
                     ((i64)t.seq.k_start * p.k_row_stride + (i64)head * p.k_head_stride) * B;
  const u8* kr_base = reinterpret_cast<const u8*>(p.k_rope) +
                      ((i64)t.seq.k_start * p.kr_row_stride + (i64)head * p.kr_head_stride) * B;
  const u8* v_base = reinterpret_cast<const u8*>(p.v) +
                     ((i64)t.seq.k_start * p.v_row_stride + (i64)head * p.v_head_stride) * B;

  // FP8 inputs: S = (qd q)(kd k)^T, so qd * kd joins the softmax scale; O = sum p (vd v), and P^T
  // is stored as P * kPScale (a power of two that keeps P <= 1 inside e4m3's range with full
  // precision down to 2^-6 / kPScale), so vd / kPScale joins the final normalisation.
  float scale_log2 = p.scale_log2;
  float out_scale = 1.f;
  if constexpr (C::kInBytes == 1) {
    scale_log2 *= descale(p.q_descale, head, p.qd_head_stride) * descale(p.k_descale, head, p.kd_head_stride);
    out_scale = descale(p.v_descale, head, p.vd_head_stride) * (1.f / C::kPScale);
  }

  // Q^T fragments: all k-steps in registers, or (kQInLds) one k-step at a time from LDS, where
  // the two halves of the lanes holding a query copy one half of its row each. The barrier after
  // the first K/V tile's stores orders these stores before any read.
  constexpr int kQRegSteps = C::kQInLds ? 1 : kQSteps;
  unsigned qf[kQRegSteps][W];
  const u8* q_lds = lds + L::kQOffsetBytes + (wave * 32 + b_col(lane)) * L::kQRowBytes;
  {
    const bool ok = qrow < t.seq.len_q;
    const u8* row = q_base + (i64)(ok ? qrow : 0) * p.q_row_stride * B;
    if constexpr (C::kQInLds) {
      constexpr int kHalfBytes = C::kDQk * B / 2;
      static_assert(kHalfBytes % 16 == 0, "half a Q row must be whole 16-byte chunks");
#pragma unroll
      for (int c = 0; c < kHalfBytes / 16; ++c) {
        const int off = half * kHalfBytes + 16 * c;
        const u32x4 x = *reinterpret_cast<const u32x4*>(row + off);
        *reinterpret_cast<u32x4*>(const_cast<u8*>(q_lds) + off) = ok ? x : u32x4{0u, 0u, 0u, 0u};
      }
    } else {
#pragma unroll
      for (int ks = 0; ks < kQSteps; ++ks) load_q_fragment<Atom>(row, ks, lane, ok, qf[ks]);
    }
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
    const u8* vt_lds = ks_lds + L::kVtOffsetBytes;
    const int key0 = n * C::kBlockN;

    if (wave_live && (!CAUSAL || key0 <= wave_last_key)) {
      // S^T = K Q^T over 32-key sub-tiles.
      f32x16 s[kSub];
#pragma unroll
      for (int j = 0; j < kSub; ++j) s[j] = f32x16{};
#pragma unroll
      for (int ks = 0; ks < kQSteps; ++ks) {
        if constexpr (C::kQInLds) load_q_fragment<Atom>(q_lds, ks, lane, true, qf[0]);
#pragma unroll
        for (int j = 0; j < kSub; ++j) {
          unsigned a[W];
          load_k_fragment<Atom, L>(ks_lds, 32 * j + a_row(lane), ks, lane, a);
          Atom::mma(s[j], a, qf[C::kQInLds ? 0 : ks]);
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
      const float new_max = fmaxf(row_max, mx * scale_log2);
      const float base = new_max == neg_inf() ? 0.f : new_max;  // -inf - -inf would be NaN
      const float corr = fast_exp2(row_max - base);
      row_max = new_max;
      float sum = 0.f;
      // P^T as B operands: register g = 16 j + r is element p_elem of k-step p_step (mfma_layout.cuh).
      unsigned pf[kPvSteps][WP];
#pragma unroll
      for (int j = 0; j < kSub; ++j) {
#pragma unroll
        for (int r = 0; r < kAccRegs; r += kPPerWord) {
          const int g = 16 * j + r;
          float pv[kPPerWord];
#pragma unroll
          for (int e = 0; e < kPPerWord; ++e) {
            pv[e] = fast_exp2(s[j][r + e] * scale_log2 - base);
            sum += pv[e];
          }
          unsigned word;
          if constexpr (kPPerWord == 2) {
            word = pack_bf16x2(pv[0], pv[1]);
          } else {
            word = pack_fp8x4(pv[0] * C::kPScale, pv[1] * C::kPScale, pv[2] * C::kPScale, pv[3] * C::kPScale);
          }
          pf[p_step(KP, g)][p_elem(KP, g) / kPPerWord] = word;
        }
      }
      row_sum = row_sum * corr + sum;
#pragma unroll
      for (int d = 0; d < kDTiles; ++d) o[d] *= corr;
      sched_fence();
      // O^T += V^T P^T: A is V^T rows d, in the key order pv_key gives B's registers.
#pragma unroll
      for (int st = 0; st < kPvSteps; ++st) {
#pragma unroll
        for (int d = 0; d < kDTiles; ++d) {
          const u8* row = vt_lds + (32 * d + a_row(lane)) * L::kVtStrideBytes;
          unsigned a[WP];
          constexpr int kRunWords = AtomPV::kBytes;  // four consecutive keys: 4 * kBytes bytes
#pragma unroll
          for (int q4 = 0; q4 < KP / 2 / 4; ++q4) {
            const unsigned* run = reinterpret_cast<const unsigned*>(row + pv_key(KP, lane, st, 4 * q4) * AtomPV::kBytes);
#pragma unroll
            for (int w = 0; w < kRunWords; ++w) a[q4 * kRunWords + w] = run[w];
          }
          AtomPV::mma(o[d], a, pf[st]);
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
  const float inv = empty ? 0.f : out_scale / total;
  if (qrow >= t.seq.len_q) return;
  const i64 grow = (i64)(t.seq.q_start + qrow);
  if (half == 0) p.lse[grow * p.lse_row_stride + head] = empty ? pos_inf() : (row_max + fast_log2(total)) * kLn2;
  u16* out = p.out + grow * p.o_row_stride + (i64)head * p.o_head_stride;  // bf16 for every input type
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
