// Dense MLA prefill for Ampere-class tensor cores (runs on sm_80 and newer, Hopper included).
//
// One CTA computes BLOCK_M query rows of one head. Warps split the rows (16 per MMA slice); K
// (nope from k, rope from k_rope, which may be shared by all heads) and V stream through a
// STAGES-deep cp.async ring. Key tiles are visited from the last to the first, so the tiles that
// need a causal or length mask come first and the rest run unmasked.
#pragma once
#include "mlagen/cuda/online_softmax.cuh"
#include "mlagen/common/tile_index.cuh"
#include "mlagen/common/types.cuh"
#include "mlagen/sm80/mma.cuh"
#include "mlagen/sm80/smem_tile.cuh"

namespace mlagen::sm80 {

template <class Cfg>
struct PrefillLayout {
  static constexpr int kThreads = Cfg::kWarps * 32;
  static constexpr int kMTiles = Cfg::kBlockM / (16 * Cfg::kWarps);  // 16-row slices per warp
  using QTile = SmemTile<Cfg::kBlockM, Cfg::kDQk, Cfg::kSwizzle>;
  using KTile = SmemTile<Cfg::kBlockN, Cfg::kDQk, Cfg::kSwizzle>;
  using VTile = SmemTile<Cfg::kBlockN, Cfg::kDV, Cfg::kSwizzle>;
  using OTile = SmemTile<Cfg::kBlockM, Cfg::kDV, Cfg::kSwizzle>;  // aliases the Q tile
  static constexpr int kSmemBytes = QTile::kBytes + Cfg::kStages * (KTile::kBytes + VTile::kBytes);
  static_assert(OTile::kBytes <= QTile::kBytes, "the output staging tile reuses the Q tile");
};

// Copy `rows` x COLS bf16 from global rows (stride `row_stride` elements) into a shared tile;
// rows at or past `valid_rows` are zero-filled without reading global memory.
template <class Tile, int ROWS, int THREADS, int SPLIT_CHUNK>
__device__ __forceinline__ void load_rows(u32 tile_addr, const u16* src, i64 row_stride, const u16* src_hi,
                                          i64 row_stride_hi, int valid_rows) {
  constexpr int kTotal = ROWS * Tile::kChunks;
#pragma unroll
  for (int it = 0; it < CeilDiv<kTotal, THREADS>::value; ++it) {
    const int i = it * THREADS + threadIdx.x;
    if (kTotal % THREADS == 0 || i < kTotal) {
      const int r = i / Tile::kChunks;
      const int c = i % Tile::kChunks;
      const bool valid = r < valid_rows;
      const int rr = valid ? r : 0;
      // Chunks before SPLIT_CHUNK come from `src`, the rest from `src_hi` (the rope columns).
      const u16* g = c < SPLIT_CHUNK ? src + rr * row_stride + c * 8 : src_hi + rr * row_stride_hi + (c - SPLIT_CHUNK) * 8;
      cp_async_16(tile_addr + Tile::offset(r, c), g, valid);
    }
  }
}

template <class Cfg, class Params>
__device__ __forceinline__ void mla_prefill_forward(const Params& p) {
  using L = PrefillLayout<Cfg>;
  using QTile = typename L::QTile;
  using KTile = typename L::KTile;
  using VTile = typename L::VTile;
  using OTile = typename L::OTile;
  constexpr int BM = Cfg::kBlockM, BN = Cfg::kBlockN, DQK = Cfg::kDQk, DV = Cfg::kDV;
  constexpr int ST = Cfg::kStages, THREADS = L::kThreads, MT = L::kMTiles;
  constexpr int N_FRAGS = BN / 8, O_FRAGS = DV / 8;
  constexpr bool CAUSAL = Cfg::kCausal;
  static_assert(!Cfg::kQInRegs || MT == 1, "Q fragments fit in registers only for one 16-row slice per warp");

  extern __shared__ __align__(128) u8 smem[];
  const u32 sQ = smem_u32(smem);
  const u32 sK = sQ + QTile::kBytes;
  const u32 sV = sK + ST * KTile::kBytes;

  const int head = blockIdx.y;
  const QueryTile t = locate_tile<BM, BN, CAUSAL>(p.cu_seqlens_q, p.cu_seqlens_k, p.total_q, p.total_k, p.batch,
                                                  blockIdx.x);
  if (t.rows == 0) return;

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int warp_row0 = warp * 16 * MT;  // first tile row of this warp
  const u16* q_base = p.q + (i64)(t.seq.q_start + t.row0) * p.q_row_stride + (i64)head * p.q_head_stride;
  const u16* k_base = p.k + (i64)t.seq.k_start * p.k_row_stride + (i64)head * p.k_head_stride;
  const u16* kr_base = p.k_rope + (i64)t.seq.k_start * p.kr_row_stride + (i64)head * p.kr_head_stride;
  const u16* v_base = p.v + (i64)t.seq.k_start * p.v_row_stride + (i64)head * p.v_head_stride;

  auto load_kv = [&](int n, int buf) {
    const i64 key0 = (i64)n * BN;
    const int valid = t.seq.len_k - n * BN;
    load_rows<KTile, BN, THREADS, Cfg::kDNope / 8>(sK + buf * KTile::kBytes, k_base + key0 * p.k_row_stride,
                                                   p.k_row_stride, kr_base + key0 * p.kr_row_stride,
                                                   p.kr_row_stride, valid);
    load_rows<VTile, BN, THREADS, DV / 8>(sV + buf * VTile::kBytes, v_base + key0 * p.v_row_stride,
                                          p.v_row_stride, v_base, 0, valid);
  };

  // Prologue: Q and the first STAGES-1 key tiles (last key tile first). Every stage commits a
  // group, even an empty one, so wait_group counts stay aligned with tile numbers.
  load_rows<QTile, BM, THREADS, DQK / 8>(sQ, q_base, p.q_row_stride, q_base, 0, t.rows);
  const int n_blocks = t.n_blocks;
#pragma unroll
  for (int s = 0; s < ST - 1; ++s) {
    if (s < n_blocks) load_kv(n_blocks - 1 - s, s);
    cp_async_commit();
  }

  float o[MT][O_FRAGS * 4];
  RowStats stats[MT];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
    stats[mt].init();
#pragma unroll
    for (int i = 0; i < O_FRAGS * 4; ++i) o[mt][i] = 0.f;
  }
  u32 q_frag[Cfg::kQInRegs ? DQK / 16 : 1][4];
  const int offset = t.seq.len_k - t.seq.len_q;

  for (int i = 0; i < n_blocks; ++i) {
    cp_async_wait<ST - 2>();
    __syncthreads();  // tile i is resident and every warp has finished tile i-1
    {
      const int j = i + ST - 1;
      if (j < n_blocks) load_kv(n_blocks - 1 - j, j % ST);
      cp_async_commit();
    }
    if constexpr (Cfg::kQInRegs) {
      if (i == 0) {
#pragma unroll
        for (int kk = 0; kk < DQK / 16; ++kk)
          ldmatrix_x4(q_frag[kk], sQ + QTile::offset(warp_row0 + (lane % 16), kk * 2 + lane / 16));
      }
    }
    const int n = n_blocks - 1 - i;
    const int buf = i % ST;
    const u32 kt = sK + buf * KTile::kBytes;
    const u32 vt = sV + buf * VTile::kBytes;

    // S = Q K^T for this warp's rows.
    float s[MT][N_FRAGS * 4];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int e = 0; e < N_FRAGS * 4; ++e) s[mt][e] = 0.f;
#pragma unroll
    for (int kk = 0; kk < DQK / 16; ++kk) {
      u32 a[MT][4];
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        if constexpr (Cfg::kQInRegs) {
#pragma unroll
          for (int e = 0; e < 4; ++e) a[mt][e] = q_frag[kk][e];
        } else {
          ldmatrix_x4(a[mt], sQ + QTile::offset(warp_row0 + mt * 16 + (lane % 16), kk * 2 + lane / 16));
        }
      }
#pragma unroll
      for (int np = 0; np < BN / 16; ++np) {
        u32 b[4];
        ldmatrix_x4(b, kt + KTile::offset(np * 16 + (lane / 16) * 8 + (lane % 8), kk * 2 + (lane / 8) % 2));
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          mma_bf16_16816(&s[mt][(2 * np) * 4], a[mt], b[0], b[1]);
          mma_bf16_16816(&s[mt][(2 * np + 1) * 4], a[mt], b[2], b[3]);
        }
      }
    }

    if (n >= t.first_masked_block) {
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
        for (int j = 0; j < N_FRAGS; ++j) {
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int row = t.row0 + warp_row0 + mt * 16 + lane / 4 + 8 * (e / 2);
            const int col = n * BN + j * 8 + 2 * (lane % 4) + (e % 2);
            const bool visible = col < t.seq.len_k && (!CAUSAL || col <= row + offset);
            if (!visible) s[mt][4 * j + e] = neg_inf();
          }
        }
      }
    }

#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
      float corr[2];
      softmax_update<N_FRAGS>(s[mt], stats[mt], p.scale_log2, corr);
#pragma unroll
      for (int j = 0; j < O_FRAGS; ++j) {
        o[mt][4 * j + 0] *= corr[0];
        o[mt][4 * j + 1] *= corr[0];
        o[mt][4 * j + 2] *= corr[1];
        o[mt][4 * j + 3] *= corr[1];
      }
    }

    // O += P V, with P converted from the score accumulators straight into A fragments.
#pragma unroll
    for (int kt16 = 0; kt16 < BN / 16; ++kt16) {
      u32 a[MT][4];
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        a[mt][0] = pack_bf16x2(s[mt][8 * kt16 + 0], s[mt][8 * kt16 + 1]);
        a[mt][1] = pack_bf16x2(s[mt][8 * kt16 + 2], s[mt][8 * kt16 + 3]);
        a[mt][2] = pack_bf16x2(s[mt][8 * kt16 + 4], s[mt][8 * kt16 + 5]);
        a[mt][3] = pack_bf16x2(s[mt][8 * kt16 + 6], s[mt][8 * kt16 + 7]);
      }
#pragma unroll
      for (int dp = 0; dp < DV / 16; ++dp) {
        u32 b[4];
        ldmatrix_x4_trans(b, vt + VTile::offset(kt16 * 16 + (lane % 8) + ((lane / 8) % 2) * 8, dp * 2 + lane / 16));
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          mma_bf16_16816(&o[mt][(2 * dp) * 4], a[mt], b[0], b[1]);
          mma_bf16_16816(&o[mt][(2 * dp + 1) * 4], a[mt], b[2], b[3]);
        }
      }
    }
  }
  cp_async_wait<0>();
  __syncthreads();  // all warps are done with Q, K and V; the Q tile becomes the output tile

  // Epilogue: normalise, stage bf16 rows in shared memory, then write whole 16-byte chunks.
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
    float inv[2], lse[2];
    softmax_finish(stats[mt], inv, lse);
    const int r0 = warp_row0 + mt * 16 + lane / 4;
#pragma unroll
    for (int j = 0; j < O_FRAGS; ++j) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const u32 packed = pack_bf16x2(o[mt][4 * j + 2 * h] * inv[h], o[mt][4 * j + 2 * h + 1] * inv[h]);
        const u32 addr = sQ + OTile::offset(r0 + 8 * h, j) + (lane % 4) * 4;
        asm volatile("st.shared.u32 [%0], %1;\n" ::"r"(addr), "r"(packed));
      }
    }
    if (lane % 4 == 0) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int row = r0 + 8 * h;
        if (row < t.rows) p.lse[(i64)(t.seq.q_start + t.row0 + row) * p.lse_row_stride + head] = lse[h];
      }
    }
  }
  __syncthreads();
  u16* o_base = p.out + (i64)(t.seq.q_start + t.row0) * p.o_row_stride + (i64)head * p.o_head_stride;
  constexpr int kOutChunks = BM * OTile::kChunks;
#pragma unroll
  for (int it = 0; it < CeilDiv<kOutChunks, THREADS>::value; ++it) {
    const int i = it * THREADS + tid;
    const int r = i / OTile::kChunks;
    const int c = i % OTile::kChunks;
    if ((kOutChunks % THREADS == 0 || i < kOutChunks) && r < t.rows) {
      uint4 val;
      asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];\n"
                   : "=r"(val.x), "=r"(val.y), "=r"(val.z), "=r"(val.w)
                   : "r"(sQ + OTile::offset(r, c)));
      *reinterpret_cast<uint4*>(o_base + (i64)r * p.o_row_stride + c * 8) = val;
    }
  }
}

}  // namespace mlagen::sm80
