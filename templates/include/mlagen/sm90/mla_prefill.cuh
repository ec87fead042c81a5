// Dense MLA prefill for Hopper (sm_90a): a TMA producer warp and wgmma consumer warpgroups.
//
// A CTA owns BLOCK_M = 64 * CONSUMERS query rows of one head at a time. The producer warp loads Q
// and streams K (nope, then rope: shared by all heads when k_rope is [Tk, 1, 64]) and V tiles
// into STAGES-deep rings guarded by full/empty mbarriers. Each consumer warpgroup computes its 64
// rows: S = Q K^T with both operands in shared memory, online softmax in the exp2 domain, then
// O += P V with P from registers. With OVERLAP, the next S is issued before the current P V, so
// softmax hides behind tensor-core work; with PINGPONG the two consumer warpgroups take turns
// issuing MMAs. The output goes back through shared memory (reusing the warpgroup's Q rows) and a
// TMA store. Key tiles are visited last-to-first, so the masked (diagonal, partial) tiles come
// first; fully masked tiles are never visited.
//
// With CLUSTER = 2, the two CTAs of a cluster take the two halves of one 2 * BLOCK_M-row tile of
// the same head and sequence, so they read the same key tiles: each producer loads half the rows
// of every K and V tile and multicasts them into both CTAs, and a stage is refilled only after the
// consumers of both CTAs have released it (one arrival per consumer warp on each CTA's empty
// barrier). When causal, the lower half needs fewer key tiles than the cluster streams; its
// consumers release those stages without computing.
//
// FP8 (Cfg::kElemBytes == 1, e4m3 inputs): both products run on the k32 e4m3 wgmma, which takes
// no transpose, so every shared-memory operand is K-major. Q and K are naturally; P V reads V^T
// tiles (d_v rows of BLOCK_N keys). Inside every 16 keys of a tile, V^T's column order is permuted
// (position 4t + i holds key 8 (i / 2) + 2 t + i % 2) so that the fp32 S accumulator a thread
// holds, converted to e4m3, already is the k32 A fragment of P V: no shuffle. Cfg::kVtInKernel:
// the producer loads each V tile as stored into a ring of its own and its warps that issue no
// loads write V^T from it (transpose_v_tile); else V^T is a [heads, d_v, columns] copy the
// launcher makes before the kernel (tma.py: transpose_v), each sequence starting on a 16-column
// boundary (vt_column), loaded by TMA. q_descale * k_descale is folded into the softmax scale (with
// softcap into softcap's pre-scale), v_descale into the output normalisation; P (in [0, 1]) is
// rounded to e4m3.
#pragma once
#include "mlagen/common/mask.cuh"
#include "mlagen/cuda/online_softmax.cuh"
#include "mlagen/cuda/softmax_traits.cuh"
#include "mlagen/common/tile_index.cuh"
#include "mlagen/common/types.cuh"
#include "mlagen/sm90/barrier.cuh"
#include "mlagen/sm90/skeleton.cuh"
#include "mlagen/sm90/tma.cuh"
#include "mlagen/sm90/wgmma.cuh"

namespace mlagen::sm90 {

// Shared memory of one CTA; every offset is a multiple of 1024 bytes (the 128-byte swizzle atom).
template <class Cfg>
struct Layout {
  static constexpr int kE = Cfg::kElemBytes;  // 2 (bf16) or 1 (e4m3)
  static constexpr bool kFp8 = kE == 1;
  static constexpr int kCbQ = Cfg::kSwQ / kE;  // columns per TMA box / column block
  static constexpr int kCbK = Cfg::kSwK / kE;
  static constexpr int kCbV = Cfg::kSwV / kE;  // bf16: V columns (d_v); fp8: V^T columns (keys)
  static constexpr int kCbO = Cfg::kSwQ / 2;   // the bf16 output staged in the Q tile
  // A V tile is BLOCK_N key rows of d_v (bf16), or d_v rows of BLOCK_N keys (fp8: V^T).
  static constexpr int kVRows = kFp8 ? Cfg::kDV : Cfg::kBlockN;
  static constexpr int kQCbBytes = Cfg::kBlockM * Cfg::kSwQ;
  static constexpr int kKCbBytes = Cfg::kBlockN * Cfg::kSwK;
  static constexpr int kVCbBytes = kVRows * Cfg::kSwV;
  static constexpr int kQBytes = Cfg::kBlockM * Cfg::kDQk * kE;
  static constexpr int kKBytes = Cfg::kBlockN * Cfg::kDQk * kE;
  static constexpr int kVBytes = Cfg::kBlockN * Cfg::kDV * kE;
  // K along one wgmma: 16 bf16 or 32 e4m3 (32 bytes either way).
  static constexpr int kMmaK = 32 / kE;
  static constexpr int kQ = 0;
  static constexpr int kK = kQ + kQBytes;
  static constexpr int kV = kK + Cfg::kStages * kKBytes;
  // FP8 with the transpose in the kernel: the V tiles as stored (BLOCK_N rows of d_v bytes,
  // 128-byte swizzle) in a ring of their own, read by the transposing warps. It is refilled as
  // soon as they have read a tile, so the next tile is there when the consumers free a V^T slot.
  static constexpr bool kVtInKernel = Cfg::kVtInKernel;
  static constexpr int kRawStages = kVtInKernel ? 2 : 0;
  static constexpr int kVRaw = kV + Cfg::kStages * kVBytes;
  static constexpr int kBarriers = kVRaw + kRawStages * kVBytes;
  // Producer warps that transpose V (those issuing no loads).
  static constexpr int kTransposeWarps = kVtInKernel ? 4 - Cfg::kLoadWarps : 0;
  // Barriers: q_full, q_empty, k_full[S], k_empty[S], v_full[S], v_empty[S], tile_full[2], tile_empty[2],
  // and with the transpose in the kernel vraw_full[2], vraw_empty[2].
  static constexpr int kNumBarriers = 2 + 4 * Cfg::kStages + 4 + 2 * kRawStages;
  static constexpr int kTileIds = kBarriers + 8 * kNumBarriers;
  static constexpr int kEnd = kTileIds + 8;
  static constexpr int kReserved = 1024;  // barriers and tile ids, rounded up
  // FP8 two-level accumulation with the fp32 copy of O in shared memory (o_copy: smem): 16-byte
  // groups of a thread's 64 values, group-major, so a warp's 32 groups are 512 contiguous bytes.
  static constexpr int kOCopy = kBarriers + kReserved;
  static constexpr int kOCopyBytes = Cfg::kOCopySmem ? Cfg::kConsumers * 128 * (Cfg::kDV / 2) * 4 : 0;
  // ... and there each consumer thread's product of corrections since its last flush (8 bytes).
  static constexpr int kOCorr = kOCopy + kOCopyBytes;
  static constexpr int kOCorrBytes = Cfg::kOCopySmem ? Cfg::kConsumers * 128 * 8 : 0;
  static constexpr int kSmemBytes = kOCorr + kOCorrBytes + 1024;  // + slack to align the base to 1024
  static_assert(kEnd - kBarriers <= kReserved, "barrier area overflows its reservation");
  // A swizzled box must start where its pattern starts: on its swizzle atom (8 rows of SW bytes).
  static_assert(kQCbBytes % (8 * Cfg::kSwQ) == 0 && kKCbBytes % (8 * Cfg::kSwK) == 0 &&
                    kVCbBytes % (8 * Cfg::kSwV) == 0 && kQBytes % 1024 == 0 && kKBytes % 1024 == 0 &&
                    kVBytes % 1024 == 0,
                "every TMA box must start on its swizzle atom, every tile on a 1024-byte boundary");
  static_assert(!Cfg::kTmaEpilogue || Cfg::kDV * 2 <= Cfg::kDQk * kE, "the output staging tile reuses the Q tile");
  static_assert(!kVtInKernel || (kFp8 && Cfg::kDV == 128), "the transposing warps read V rows of 128 e4m3 values");
};

// Per-warp arrivals on a stage's empty barrier: every consumer thread (one CTA), or one elected
// lane per consumer warp and CTA (a cluster shares the stage, so both CTAs must release it).
template <class Cfg>
__host__ __device__ constexpr int kv_release_count() {
  return Cfg::kCluster == 1 ? Cfg::kConsumers * 128 : Cfg::kCluster * Cfg::kConsumers * 4;
}

// Release a K or V stage: to this CTA's producer, or to the producers of every CTA of the cluster
// (their multicast loads write into this CTA's ring). Called by all lanes of a consumer warp after
// the warp's MMAs reading the stage have completed.
template <class Cfg>
__device__ __forceinline__ void release_kv(u32 bar) {
  if constexpr (Cfg::kCluster == 1) {
    mbar_arrive(bar);
  } else {
    const u32 lane = threadIdx.x % 32;
    if (lane < Cfg::kCluster) mbar_arrive_cluster(bar, lane);
  }
}

// Release a V stage. With V^T made in the kernel each CTA writes its own V^T slots (only the raw V
// tiles are multicast, and released by the transposing warps), so the release stays in the CTA.
template <class Cfg>
__device__ __forceinline__ void release_v(u32 bar) {
  if constexpr (Cfg::kVtInKernel) mbar_arrive(bar);
  else release_kv<Cfg>(bar);
}

// Load rows [row0, row0 + ROWS) of one column block of K or V (ROWS = BLOCK_N key rows; d_v rows
// of V^T with the FP8 pre-pass) into a ring slot. In a cluster, each CTA loads its share of the rows and
// multicasts it to the same slot of every CTA.
template <class Cfg, int SW, int ROWS = Cfg::kBlockN>
__device__ __forceinline__ void load_kv_box(u32 dst, const TensorMap* map, u32 bar, int col, int head, int row0) {
  if constexpr (Cfg::kCluster == 1) {
    tma_load_3d(dst, map, bar, col, head, row0);
  } else {
    constexpr int kPart = ROWS / Cfg::kCluster;
    const int rank = static_cast<int>(cluster_cta_rank());
    tma_load_3d_multicast(dst + rank * kPart * SW, map, bar, col, head, row0 + rank * kPart,
                          static_cast<u16>((1 << Cfg::kCluster) - 1));
  }
}

// The mbarriers (skeleton.cuh: Mbarriers), in this order in shared memory; initialised ring by ring:
// Q, then the K and V stages (k_full, k_empty, v_full, v_empty per stage), the raw V slots, the tile ids.
template <class Cfg>
struct BarrierTable {
  enum class Id { kQFull, kQEmpty, kKFull, kKEmpty, kVFull, kVEmpty, kTileFull, kTileEmpty, kVrawFull, kVrawEmpty, kCount };
  __host__ __device__ static constexpr skeleton::Group group(Id g) {
    if (g == Id::kQFull || g == Id::kQEmpty) return {1, 0};
    if (g == Id::kTileFull || g == Id::kTileEmpty) return {2, 3};
    if (g == Id::kVrawFull || g == Id::kVrawEmpty) return {Layout<Cfg>::kRawStages, 2};
    return {Cfg::kStages, 1};
  }
  __host__ __device__ static constexpr int arrivals(Id g, int) {
    using L = Layout<Cfg>;
    switch (g) {
      // Every consumer thread releases what it read once its own MMAs have completed.
      case Id::kQEmpty: return Cfg::kConsumers * 128;
      case Id::kKEmpty: return kv_release_count<Cfg>();
      // The V loader's expect_tx, or every lane of the transposing warps (its V tile then lands on vraw_full).
      case Id::kVFull: return L::kVtInKernel ? 32 * L::kTransposeWarps : 1;
      case Id::kVEmpty: return L::kVtInKernel ? Cfg::kConsumers * 128 : kv_release_count<Cfg>();
      case Id::kVrawEmpty: return Cfg::kCluster * L::kTransposeWarps;  // a lane per transposing warp and CTA
      // Every consumer thread and, when they are warps of their own, the V producer warp and the
      // transposing warps.
      case Id::kTileEmpty: return Cfg::kConsumers * 128 + (Cfg::kLoadWarps == 2 ? 32 : 0) + 32 * L::kTransposeWarps;
      default: return 1;  // a TMA load's expect_tx, or the tile id's publisher
    }
  }
};

template <class Cfg>
struct Barriers : skeleton::Mbarriers<BarrierTable<Cfg>> {
  using Id = typename BarrierTable<Cfg>::Id;
  using skeleton::Mbarriers<BarrierTable<Cfg>>::Mbarriers;
  static_assert(skeleton::Mbarriers<BarrierTable<Cfg>>::kCount == Layout<Cfg>::kNumBarriers, "the layout reserves every barrier");
  __device__ __forceinline__ u32 q_full() const { return this->template at<Id::kQFull>(); }
  __device__ __forceinline__ u32 q_empty() const { return this->template at<Id::kQEmpty>(); }
  __device__ __forceinline__ u32 k_full(int s) const { return this->template at<Id::kKFull>(s); }
  __device__ __forceinline__ u32 k_empty(int s) const { return this->template at<Id::kKEmpty>(s); }
  __device__ __forceinline__ u32 v_full(int s) const { return this->template at<Id::kVFull>(s); }
  __device__ __forceinline__ u32 v_empty(int s) const { return this->template at<Id::kVEmpty>(s); }
  __device__ __forceinline__ u32 tile_full(int s) const { return this->template at<Id::kTileFull>(s); }
  __device__ __forceinline__ u32 tile_empty(int s) const { return this->template at<Id::kTileEmpty>(s); }
  // FP8 with the transpose in the kernel: raw slot s holds a V tile as stored / is free again
  // (v_full and v_empty then guard the V^T slots).
  __device__ __forceinline__ u32 vraw_full(int s) const { return this->template at<Id::kVrawFull>(s); }
  __device__ __forceinline__ u32 vraw_empty(int s) const { return this->template at<Id::kVrawEmpty>(s); }
};

// Named barriers (skeleton.cuh: id 0 is the skeleton's).
enum NamedBarrier : int {
  kTurn = skeleton::kFirstNamedBarrier,  // + consumer warpgroup: its turn to issue MMAs (pingpong)
  kOutStaged = kTurn + 2,                // + consumer warpgroup: its output rows are staged / stored
  kVStageRead = kOutStaged + 2,          // every consumer's last P V has read the V stage (vtma epilogue)
  kNamedEnd,
};
static_assert(skeleton::named_barriers_fit(kNamedEnd), "sm90 has 16 named barriers");

// Work assignment: tile t covers head t / num_virtual and virtual query tile t % num_virtual, so
// consecutive tiles share a head (its K and V stay in L2) and, when causal, go longest-first
// (query_tile). With the dynamic scheduler the producer's Q/K warp publishes the ids.
template <class Cfg>
using DenseScheduler = TileScheduler<Cfg::kScheduler, Cfg::kCluster, Barriers<Cfg>, Barriers<Cfg>::Id::kTileFull,
                                     Barriers<Cfg>::Id::kTileEmpty, Layout<Cfg>::kTileIds>;

template <class Cfg, class Params>
__device__ __forceinline__ DenseScheduler<Cfg> tile_scheduler(const Params& p) {
  return DenseScheduler<Cfg>(p.num_virtual_tiles * p.num_heads, p.tile_counter);
}

// The mask's run-time arguments (window sides, chunk size) from the parameters.
template <class Params>
__device__ __forceinline__ MaskArgs mask_args(const Params& p) {
  return MaskArgs{p.mask_left, p.mask_right, p.mask_chunk};
}

// The first key tile a tile visits: 0 unless the mask has a lower bound (window, chunked), which
// runs without clusters, so a CTA's range is its cluster's.
template <class Cfg>
__device__ __forceinline__ int first_key_tile(const BandTile& qt) {
  if constexpr (Band<Cfg::kMask>::kLower) return qt.n_begin;
  return 0;
}

// This CTA's rows of tile t, and how many key tiles the cluster streams for it (the CTA's own
// count, or more for the lower half of a causal cluster tile).
//
// Tile order: heads in groups of p.head_group; a group's tiles go virtual tile by virtual tile
// (sequence after sequence, the longest key range first within a causal sequence) with the
// group's heads innermost. The last tiles handed out are then the group's shortest ones, not one
// head's whole sequence (whose long tiles end the grid late). head_group 1 is head after head;
// the launcher picks it (mla_prefill/tma.py: head_group).
template <class Cfg, class Params>
__device__ __forceinline__ BandTile query_tile(const Params& p, int t, int& head, int& kv_blocks) {
  const int group = t / (p.head_group * p.num_virtual_tiles);
  const int first_head = group * p.head_group;
  const int heads = min(p.head_group, p.num_heads - first_head);  // the last group may be smaller
  const int i = t - first_head * p.num_virtual_tiles;
  const int v = i / heads;
  head = first_head + (i - v * heads);
  // The launcher asks for the longest-first order only where find_sequence_lpt applies (tma.py: lpt_order).
  constexpr int kRows = Cfg::kBlockM * Cfg::kCluster;
  const MaskArgs m = mask_args(p);
  const BandTile whole =
      p.lpt_order ? locate_band_tile<kRows, Cfg::kBlockN, Cfg::kMask, true>(p.cu_seqlens_q, p.cu_seqlens_k, p.total_q,
                                                                           p.total_k, p.batch, v, m)
                  : locate_band_tile<kRows, Cfg::kBlockN, Cfg::kMask>(p.cu_seqlens_q, p.cu_seqlens_k, p.total_q,
                                                                     p.total_k, p.batch, v, m);
  kv_blocks = whole.n_blocks;
  if constexpr (Cfg::kCluster == 1) return whole;
  else return split_band_tile<Cfg::kBlockM, Cfg::kBlockN, Cfg::kMask>(whole, static_cast<int>(cluster_cta_rank()));
}

// Column of V^T (FP8) holding the first key of the tile that starts at packed key `key0`: each
// sequence's keys start on a 16-column boundary, round_up(k_start, 16) + 16 * batch (the launcher's
// transpose_v writes the same layout), so the key permutation inside 16-key groups is tile-relative.
__device__ __forceinline__ int vt_column(const QueryTile& qt, int key0) {
  return ((qt.seq.k_start + 15) & ~15) + 16 * qt.batch + (key0 - qt.seq.k_start);
}

// V^T of one key tile from the tile as stored (FP8, Cfg::kVtInKernel), by the producer's
// transposing warp `tw` of L::kTransposeWarps. `raw`: BLOCK_N key rows of d_v = 128 bytes, 16-byte
// chunk c of row k at c ^ (k % 8) (128-byte swizzle); `vt`: d_v rows of BLOCK_N keys in column
// blocks of SW_V bytes, each 16-key group in perm16 order. A unit is a 16-key group g and 32 dims
// 32 j .. 32 j + 31: one ldmatrix.x4.trans reads the b16 matrices (keys 8 (m % 2) + r of the group)
// x (chunk 2 j + m / 2), after which lane 4 u + t holds dims 2 u, 2 u + 1 of keys 2 t, 2 t + 1 (and
// 8 + 2 t, 9 + 2 t) of each chunk; two byte permutes per chunk make dim 2 u's and dim 2 u + 1's
// words of keys (2t, 2t+1, 8+2t, 9+2t), perm16 positions 4t .. 4t+3; one stmatrix.x4 writes them as
// four 8 x 16-byte matrices of V^T rows: matrix m holds chunk 2 j + m / 2's dims 0 2 4 6 9 11 13 15
// (m even) or 1 3 5 7 8 10 12 14 (m odd), whose rows fall in eight distinct 16-byte bank groups
// under the 32-, 64- and 128-byte swizzles alike (as the ldmatrix rows do under the 128-byte one).
template <class Cfg>
__device__ __forceinline__ void transpose_v_tile(u32 raw, u32 vt, int tw) {
  using L = Layout<Cfg>;
  constexpr int kGroups = Cfg::kBlockN / 16;
  constexpr int kCbGroups = Cfg::kSwV / 16;  // 16-key groups per V^T column block
  const int lane = threadIdx.x % 32, m = lane / 8, r = lane % 8;
  // Row 8 (m % 2) + r of the group, its chunk (2 j + m / 2) ^ r = 2 j ^ (m / 2) ^ r: the lane's part
  // (m / 2) ^ r set in the low 7 bits of the 128-byte-aligned row address, 2 j XORed in per unit.
  const u32 ld = (raw + (8 * (m % 2) + r) * 128) | ((u32)((m / 2) ^ r) << 4);
  const int dd = (m % 2 == 0) == (r < 4) ? 2 * r : 2 * r + 1;
  const int st_row = 16 * (m / 2) + dd;  // V^T row (dim) of this lane's address, in each 32-dim unit
  // This lane's words: the even dim goes to matrix 0 / 2 for lanes u < 4, to matrix 1 / 3 otherwise.
  const u32 sel0 = lane < 16 ? 0x6420u : 0x7531u;
#pragma unroll 1
  for (int g = tw; g < kGroups; g += L::kTransposeWarps) {
    const u32 src = ld + g * 16 * 128;
    const u32 dst = vt + (g / kCbGroups) * L::kVCbBytes +
                    swizzle_offset<Cfg::kSwV>(st_row * Cfg::kSwV + (g % kCbGroups) * 16);
#pragma unroll
    for (int j = 0; j < 4; ++j) {  // the group's four 32-dim units
      u32 x[4];
      asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                   : "=r"(x[0]), "=r"(x[1]), "=r"(x[2]), "=r"(x[3])
                   : "r"(src ^ ((u32)(2 * j) << 4))
                   : "memory");
      const u32 sel1 = sel0 ^ 0x1111u;
      asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(dst + j * 32 * Cfg::kSwV),
                   "r"(__byte_perm(x[0], x[1], sel0)), "r"(__byte_perm(x[0], x[1], sel1)),
                   "r"(__byte_perm(x[2], x[3], sel0)), "r"(__byte_perm(x[2], x[3], sel1))
                   : "memory");
    }
  }
}

// The transposing warps' loop (FP8, Cfg::kVtInKernel): the loaders' sequence of key tiles, each
// transposed once its V tile has landed (vraw_full) and the consumers have freed its V^T slot
// (v_empty); then the raw slot is released to the loader (in a cluster, to both CTAs' loaders: each
// multicasts its half of the next tile into both). A loop of its own, apart from the loaders', so
// that only the tile count and the ring position live across it (32 registers).
template <class Cfg, class Params>
__device__ void transposer(const Params& p, u32 smem, const Barriers<Cfg>& bar, int tw) {
  using L = Layout<Cfg>;
  const auto sched = tile_scheduler<Cfg>(p);
  int kv_iter = 0, id_iter = 0;
  for (int t = sched.first(); t < sched.total;) {
    int head, kv_blocks;
    const BandTile qt = query_tile<Cfg>(p, t, head, kv_blocks);
    // The tiles the consumers only release (the cluster streams them for the other CTA's rows, or
    // this CTA has no rows) come first: they are passed on untransposed.
    const int skip = kv_blocks - (qt.rows > 0 && qt.n_blocks > 0 ? qt.n_blocks : 0);
    for (int i = 0; i < kv_blocks; ++i, ++kv_iter) {
      const int s = kv_iter % Cfg::kStages, rs = kv_iter % L::kRawStages;
      mbar_wait(bar.vraw_full(rs), (kv_iter / L::kRawStages) & 1);
      mbar_wait(bar.v_empty(s), ((kv_iter / Cfg::kStages) & 1) ^ 1);
      if (i >= skip) transpose_v_tile<Cfg>(smem + L::kVRaw + rs * L::kVBytes, smem + L::kV + s * L::kVBytes, tw);
      fence_async_shared();  // the generic-proxy stores, before wgmma reads them
      mbar_arrive(bar.v_full(s));
      __syncwarp();  // every lane's reads of the raw tile are done
      const u32 lane = threadIdx.x % 32;
      if constexpr (Cfg::kCluster == 1) {
        if (lane == 0) mbar_arrive(bar.vraw_empty(rs));
      } else {
        if (lane < Cfg::kCluster) mbar_arrive_cluster(bar.vraw_empty(rs), lane);
      }
    }
    t = sched.next(t, id_iter, smem, bar);
    if constexpr (DenseScheduler<Cfg>::kDynamic) ++id_iter;  // the ids read so far
  }
}

// ------------------------------------------------------------------------------------------------
// Producer: warp 0 loads Q and K and runs the dynamic tile queue; with LOAD_WARPS = 2, warp 1
// loads V (else warp 0 does). Separate warps keep a K load from waiting behind a V slot (V is
// released later, after P V), so each ring has the whole time between a slot's release and its
// next use to hide the TMA latency. FP8 with the transpose in the kernel: the other warps write
// V^T from each V tile once it has landed (vraw_full), then arrive on v_full.

template <class Cfg, class Params>
__device__ void producer(const Params& p, u32 smem, const Barriers<Cfg>& bar) {
  using L = Layout<Cfg>;
  const int warp = (threadIdx.x / 32) % 4;
  const bool loads_qk = warp == 0;
  const bool loads_v = Cfg::kLoadWarps == 1 ? warp == 0 : warp == 1;
  if constexpr (L::kVtInKernel) {
    if (warp >= Cfg::kLoadWarps) return transposer<Cfg>(p, smem, bar, warp - Cfg::kLoadWarps);
  }
  if (!loads_qk && !loads_v) return;
  const int lane = threadIdx.x % 32;
  const auto sched = tile_scheduler<Cfg>(p);
  int tile_iter = 0, kv_iter = 0, id_iter = 0;
  for (int t = sched.first(); t < sched.total;) {
    int head, kv_blocks;
    const BandTile qt = query_tile<Cfg>(p, t, head, kv_blocks);
    const bool computes = qt.rows > 0 && qt.n_blocks > 0;  // else the consumers only release stages
    if (kv_blocks > 0) {
      const int rope_head = p.rope_shared ? 0 : head;
      const int vt0 = L::kFp8 && !L::kVtInKernel ? vt_column(qt, qt.seq.k_start) : 0;  // V^T column of the sequence's first key (pre-pass)
      for (int i = 0; i < kv_blocks; ++i, ++kv_iter) {
        const int key0 = qt.seq.k_start + (first_key_tile<Cfg>(qt) + kv_blocks - 1 - i) * Cfg::kBlockN;
        const int s = kv_iter % Cfg::kStages;
        const u32 phase = ((kv_iter / Cfg::kStages) & 1) ^ 1;
        if (loads_qk) {
          const u32 k_tile = smem + L::kK + s * L::kKBytes;
          mbar_wait(bar.k_empty(s), phase);
          if (lane == 0) {
            mbar_arrive_expect_tx(bar.k_full(s), L::kKBytes);
#pragma unroll
            for (int cb = 0; cb < Cfg::kDNope / L::kCbK; ++cb)
              load_kv_box<Cfg, Cfg::kSwK>(k_tile + cb * L::kKCbBytes, &p.tma_k, bar.k_full(s), cb * L::kCbK, head,
                                          key0);
#pragma unroll
            for (int cb = 0; cb < Cfg::kDRope / L::kCbK; ++cb)
              load_kv_box<Cfg, Cfg::kSwK>(k_tile + (Cfg::kDNope / L::kCbK + cb) * L::kKCbBytes, &p.tma_k_rope,
                                          bar.k_full(s), cb * L::kCbK, rope_head, key0);
          }
          if (i == 0 && computes) {
            // Q after the first K tile: that load overlaps the previous tile's epilogue, which
            // still owns the Q buffer until both consumer warpgroups release it.
            mbar_wait(bar.q_empty(), (tile_iter & 1) ^ 1);
            if (lane == 0) {
              mbar_arrive_expect_tx(bar.q_full(), L::kQBytes);
#pragma unroll
              for (int cb = 0; cb < Cfg::kDQk / L::kCbQ; ++cb)
                tma_load_3d(smem + L::kQ + cb * L::kQCbBytes, &p.tma_q, bar.q_full(), cb * L::kCbQ, head,
                            qt.seq.q_start + qt.row0);
            }
            ++tile_iter;
          }
        }
        if (loads_v) {
          if constexpr (L::kVtInKernel) {
            // V as stored, into the raw ring: BLOCK_N rows of d_v bytes (one 128-byte box column).
            const int rs = kv_iter % L::kRawStages;
            mbar_wait(bar.vraw_empty(rs), ((kv_iter / L::kRawStages) & 1) ^ 1);
            if (lane == 0) {
              mbar_arrive_expect_tx(bar.vraw_full(rs), L::kVBytes);
              load_kv_box<Cfg, 128>(smem + L::kVRaw + rs * L::kVBytes, &p.tma_v, bar.vraw_full(rs), 0, head, key0);
            }
          } else {
            mbar_wait(bar.v_empty(s), phase);
            if (lane == 0) {
              mbar_arrive_expect_tx(bar.v_full(s), L::kVBytes);
              if constexpr (L::kFp8) {
                // V^T: column blocks of kCbV keys, all d_v rows each.
                const int col0 = vt0 + (key0 - qt.seq.k_start);
#pragma unroll
                for (int cb = 0; cb < Cfg::kBlockN / L::kCbV; ++cb)
                  load_kv_box<Cfg, Cfg::kSwV, Cfg::kDV>(smem + L::kV + s * L::kVBytes + cb * L::kVCbBytes, &p.tma_v,
                                                        bar.v_full(s), col0 + cb * L::kCbV, head, 0);
              } else {
#pragma unroll
                for (int cb = 0; cb < Cfg::kDV / L::kCbV; ++cb)
                  load_kv_box<Cfg, Cfg::kSwV>(smem + L::kV + s * L::kVBytes + cb * L::kVCbBytes, &p.tma_v,
                                              bar.v_full(s), cb * L::kCbV, head, key0);
              }
            }
          }
        }
      }
    }
    if constexpr (Cfg::kScheduler == Scheduler::kDynamic) {
      int next;
      if (loads_qk) {
        next = sched.publish(smem, bar, id_iter);
      } else {
        next = sched.read(smem, bar, id_iter);
      }
      ++id_iter;
      t = next;
    } else {
      t = sched.next_static(t);
    }
  }
}

// ------------------------------------------------------------------------------------------------
// Consumer warpgroup: 64 query rows.

template <class Cfg>
struct ConsumerRegs {
  static constexpr int kSFrags = Cfg::kBlockN / 8;
  // The first half of a key tile (rounded up to 16 keys), for DIAGONAL half (first_half_only).
  static constexpr int kHalfN = (Cfg::kBlockN / 2 + 15) / 16 * 16;
  static constexpr int kHalfFrags = kHalfN / 8;
  static constexpr int kOFrags = Cfg::kDV / 8;
  static constexpr int kMmaK = Layout<Cfg>::kMmaK;
  float s[kSFrags * 4];
  float o[kOFrags * 4];
  u32 p[Cfg::kBlockN / kMmaK][4];
  u32 q[Cfg::kQInRegs ? Cfg::kDQk / kMmaK : 1][4];  // Q as wgmma A fragments (QK with A in registers)
  // FP8 two-level accumulation (O_FLUSH > 0): the FP8 wgmma accumulator adds with about 14 bits, so a
  // long sum of one sign loses its small terms (out 0.85x the reference at 8192 keys with V = 1 +
  // noise, nineteenth session). Every O_FLUSH completed P V, o is added into this fp32 copy and the
  // next P V starts afresh (scale-d 0), so the tensor cores sum at most O_FLUSH tiles.
  // With o_copy: smem the copy lives in shared memory instead (ocopy: this thread's first group).
  float oacc[Cfg::kOFlush > 0 && !Cfg::kOCopySmem ? kOFrags * 4 : 1];
  // One register of state: bits 0-2 the P Vs since the last flush, kFresh (the next P V ignores o:
  // it was flushed into the copy), kBased (o_copy: smem: the copy holds this tile's values).
  int oflush;
  static constexpr int kFresh = 8, kBased = 16;
  // The product of the corrections o took since its last flush (its two rows); with o_copy: smem in
  // shared memory (ocorr_addr), as three consumer warpgroups have no two registers to spare (the
  // causal kernel spilled 48 bytes with them).
  float ocorr[Cfg::kOCopySmem ? 1 : 2];
  RowStats stats;
  // FP8 with softcap: softcap's pre-scale times q_descale * k_descale of the tile's head (set per
  // tile by tile_scale_log2), so tanh sees the true score; bf16 reads p.softcap_scale instead.
  float cap_scale;
};

// The MMA of an element type: Wgmma (bf16, k16) or WgmmaE4m3 (e4m3, k32, no transpose).
template <class Cfg, int N>
struct Mma {
  __device__ __forceinline__ static void ss(float* d, u64 a, u64 b, int acc) {
    if constexpr (Cfg::kElemBytes == 1) WgmmaE4m3<N>::ss(d, a, b, acc);
    else Wgmma<N>::ss(d, a, b, acc);
  }
  // B K-major (Q K^T), or with TRANS_B MN-major (bf16 V; FP8 reads V^T K-major instead).
  template <int TRANS_B>
  __device__ __forceinline__ static void rs(float* d, const u32 (&a)[4], u64 b, int acc) {
    if constexpr (Cfg::kElemBytes == 1) WgmmaE4m3<N>::rs(d, a, b, acc);
    else Wgmma<N>::template rs<TRANS_B>(d, a, b, acc);
  }
};

// Load this warpgroup's 64 Q rows from the swizzled Q tile into A fragments (the wgmma A layout
// of each warp's 16 rows is the mma.sync one, so ldmatrix.x4 produces it directly; for e4m3 the
// k32 fragment, 4 consecutive bytes per thread and row, is the same 8x16-byte matrices).
template <class Cfg>
__device__ __forceinline__ void load_q_fragments(ConsumerRegs<Cfg>& r, u32 smem, int wg) {
  using L = Layout<Cfg>;
  const int tid = threadIdx.x % 128, warp = tid / 32, lane = tid % 32;
  const int row = wg * 64 + warp * 16 + (lane % 8) + 8 * ((lane / 8) % 2);
#pragma unroll
  for (int kk = 0; kk < Cfg::kDQk / L::kMmaK; ++kk) {
    const int col = kk * L::kMmaK + (16 / L::kE) * (lane / 16);
    const u32 addr = smem + L::kQ + (col / L::kCbQ) * L::kQCbBytes +
                     swizzle_offset<Cfg::kSwQ>(row * Cfg::kSwQ + (col % L::kCbQ) * L::kE);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r.q[kk][0]), "=r"(r.q[kk][1]), "=r"(r.q[kk][2]), "=r"(r.q[kk][3])
                 : "r"(addr));
  }
}

// S = Q K^T on the first N keys of the stage into `acc` (r.s, or with N < BLOCK_N an array of its
// own: wgmmas of two widths on the same registers in two branches make ptxas 13.0 serialize every
// wgmma of the kernel, C7511).
template <class Cfg, int N = Cfg::kBlockN>
__device__ __forceinline__ void issue_qk(float (&acc)[N / 2], ConsumerRegs<Cfg>& r, u32 smem, int wg, int stage) {
  using L = Layout<Cfg>;
  // Descriptors of the tile bases, advanced by constant offsets per MMA (one add each).
  const u64 q_desc = opaque(desc_k_major<Cfg::kSwQ>(smem + L::kQ + wg * 64 * Cfg::kSwQ));
  const u64 k_desc = opaque(desc_k_major<Cfg::kSwK>(smem + L::kK + stage * L::kKBytes));
  pin_registers(acc);
  if constexpr (Cfg::kQInRegs) pin_registers(r.q);
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < Cfg::kDQk / L::kMmaK; ++kk) {
    const int col = kk * L::kMmaK;
    const u64 b = desc_advance(k_desc, (col / L::kCbK) * L::kKCbBytes + (col % L::kCbK) * L::kE);
    if constexpr (Cfg::kQInRegs) {
      Mma<Cfg, N>::template rs<0>(acc, r.q[kk], b, kk > 0);
    } else {
      const u64 a = desc_advance(q_desc, (col / L::kCbQ) * L::kQCbBytes + (col % L::kCbQ) * L::kE);
      Mma<Cfg, N>::ss(acc, a, b, kk > 0);
    }
  }
  wgmma_commit();
}

// O += P V over the stage's first KEYS keys (BLOCK_N, or the half tile whose other P columns are 0).
template <class Cfg, int KEYS = Cfg::kBlockN>
__device__ __forceinline__ void issue_pv(ConsumerRegs<Cfg>& r, u32 smem, int stage) {
  using L = Layout<Cfg>;
  pin_registers(r.o);
  pin_registers(r.p);
  if constexpr (L::kFp8) {
    // V^T is K-major: keys along each d_v row, column blocks of kCbV keys.
    const u64 v_desc = opaque(desc_k_major<Cfg::kSwV>(smem + L::kV + stage * L::kVBytes));
    wgmma_fence();
#pragma unroll
    for (int kt = 0; kt < (KEYS + L::kMmaK - 1) / L::kMmaK; ++kt) {
      const int col = kt * L::kMmaK;
      const int acc = Cfg::kOFlush > 0 ? (kt > 0 || !(r.oflush & ConsumerRegs<Cfg>::kFresh)) : 1;
      WgmmaE4m3<Cfg::kDV>::rs(r.o, r.p[kt], desc_advance(v_desc, (col / L::kCbV) * L::kVCbBytes + col % L::kCbV), acc);
    }
    if constexpr (Cfg::kOFlush > 0) r.oflush &= ~ConsumerRegs<Cfg>::kFresh;
  } else {
    const u64 v_desc = opaque(desc_mn_major<Cfg::kSwV>(smem + L::kV + stage * L::kVBytes, L::kVCbBytes));
    wgmma_fence();
#pragma unroll
    for (int kt = 0; kt < KEYS / 16; ++kt)
      Wgmma<Cfg::kDV>::template rs<1>(r.o, r.p[kt], desc_advance(v_desc, kt * 16 * Cfg::kSwV), 1);
  }
  wgmma_commit();
}

// Scores of keys outside the row's band (mask.cuh: past the sequence, right of the causal
// diagonal, outside the window or the chunk) become -inf. Each row gets one limit per side (the
// first invisible column past the band, the first visible one; relative to this thread's first
// column), so every score costs one compare with an immediate and one select per side.
template <class Cfg, int FRAGS>
__device__ __forceinline__ void apply_mask(float (&s)[FRAGS * 4], const QueryTile& qt, int n, int row_base,
                                           const MaskArgs& m) {
  using B = Band<Cfg::kMask>;
  const int lane = threadIdx.x % 32;
  const int col0 = n * Cfg::kBlockN + 2 * (lane % 4);
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int pos = qt.row0 + row_base + lane / 4 + 8 * h + (qt.seq.len_k - qt.seq.len_q);
    const int limit = B::hi(m, pos, qt.seq.len_k) - col0;
    const int lower = B::kLower ? B::lo(m, pos) - col0 : 0;
#pragma unroll
    for (int j = 0; j < FRAGS; ++j) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        if (j * 8 + e >= limit) s[4 * j + 2 * h + e] = neg_inf();
        if constexpr (B::kLower) {
          if (j * 8 + e < lower) s[4 * j + 2 * h + e] = neg_inf();
        }
      }
    }
  }
}

// Softcap (Cfg::kSoftcap): s <- tanh(s * scale / c), before the mask; the softmax's scale is then
// c * log2(e) (the launcher sets it), so the scores it sees are c * tanh(scale * s / c).
template <class Cfg, int N>
__device__ __forceinline__ void softcap_scores(float (&s)[N], float pre_scale) {
  if constexpr (Cfg::kSoftcap) {
#pragma unroll
    for (int i = 0; i < N; ++i) s[i] = tanh_accurate(s[i] * pre_scale);
  }
}

// Softcap's pre-scale: scale / c, with FP8 times the head's q_descale * k_descale (S is computed on
// the stored values; MLA.md section 1b caps the true scaled score).
template <class Cfg, class Params>
__device__ __forceinline__ float softcap_pre_scale(const Params& p, const ConsumerRegs<Cfg>& r) {
  if constexpr (Cfg::kElemBytes == 1) return r.cap_scale;
  else return p.softcap_scale;
}

// Whether key tile n cuts some row's band (or the sequence's end) and needs apply_mask.
template <class Cfg>
__device__ __forceinline__ bool tile_needs_mask(const BandTile& qt, int n) {
  if constexpr (Band<Cfg::kMask>::kLower) return n >= qt.first_masked_block || n < qt.lo_masked_end;
  return n >= qt.first_masked_block;
}

template <class Cfg, class Params>
__device__ __forceinline__ void scores_to_probabilities(const Params& p, ConsumerRegs<Cfg>& r, const BandTile& qt,
                                                        int n, int row_base, float scale_log2, float (&corr)[2]) {
  pin_registers(r.s);
  softcap_scores<Cfg>(r.s, softcap_pre_scale<Cfg>(p, r));
  if (tile_needs_mask<Cfg>(qt, n)) apply_mask<Cfg, ConsumerRegs<Cfg>::kSFrags>(r.s, qt, n, row_base, mask_args(p));
  softmax_update<ConsumerRegs<Cfg>::kSFrags, Cfg::kLazyRescale>(r.s, r.stats, scale_log2, corr);
}

// Whether no row of warpgroup `wg` sees a key of tile n past its first half (kHalfN keys): the
// causal diagonal tile of a 64-row slice in the first half of a BLOCK_N >= 128 tile, or a
// sequence's last tile ending in its first half. Rows past the tile's end see nothing.
template <class Cfg>
__device__ __forceinline__ bool first_half_only(const QueryTile& qt, int n, int wg, const MaskArgs& m) {
  const int last_row = min(qt.rows, wg * 64 + 64) - 1;
  const int limit = Band<Cfg::kMask>::hi(m, qt.row0 + last_row + (qt.seq.len_k - qt.seq.len_q), qt.seq.len_k);
  return limit - n * Cfg::kBlockN <= ConsumerRegs<Cfg>::kHalfN;
}

// The softmax of a half tile's scores `s` (issue_qk<kHalfN>): mask and softmax on its columns, then
// S's registers hold the probabilities and 0 for the other columns, so a full-width P V adds
// nothing for them.
template <class Cfg, class Params>
__device__ __forceinline__ void half_scores_to_probabilities(const Params& p, ConsumerRegs<Cfg>& r,
                                                             float (&s)[ConsumerRegs<Cfg>::kHalfFrags * 4],
                                                             const BandTile& qt, int n, int row_base,
                                                             float scale_log2, float (&corr)[2]) {
  using R = ConsumerRegs<Cfg>;
  pin_registers(s);
  softcap_scores<Cfg>(s, softcap_pre_scale<Cfg>(p, r));
  apply_mask<Cfg, R::kHalfFrags>(s, qt, n, row_base, mask_args(p));
  softmax_update<R::kHalfFrags, Cfg::kLazyRescale>(s, r.stats, scale_log2, corr);
#pragma unroll
  for (int i = 0; i < R::kSFrags * 4; ++i) r.s[i] = i < R::kHalfFrags * 4 ? s[i] : 0.f;
}

// o_copy: smem: this consumer thread's first 16-byte group of the fp32 copy of O (consumer warpgroup
// threadIdx.x / 128 - 1: the producer is warpgroup 0), formed where used rather than held in a register.
template <class Cfg>
__device__ __forceinline__ u32 ocopy_addr() {
  // The aligned base written out, not skeleton::aligned_smem_base(): that one the compiler shares
  // with the kernel's entry, which folds the offsets differently (FP8 o_copy smem: other SASS).
  const u32 base = (smem_u32(smem_raw) + 1023) & ~1023u;
  return base + Layout<Cfg>::kOCopy + ((threadIdx.x / 128 - 1) * (Cfg::kDV / 8) * 128 + threadIdx.x % 128) * 16;
}

// The correction product of two-level accumulation (ConsumerRegs::ocorr): read, and set.
template <class Cfg>
__device__ __forceinline__ void ocorr_get(const ConsumerRegs<Cfg>& r, float& c0, float& c1) {
  if constexpr (Cfg::kOCopySmem) {
    const u32 a = ((smem_u32(smem_raw) + 1023) & ~1023u) + Layout<Cfg>::kOCorr + (threadIdx.x - 128) * 8;
    asm volatile("ld.shared.v2.f32 {%0, %1}, [%2];" : "=f"(c0), "=f"(c1) : "r"(a));
  } else {
    c0 = r.ocorr[0];
    c1 = r.ocorr[1];
  }
}

template <class Cfg>
__device__ __forceinline__ void ocorr_set(ConsumerRegs<Cfg>& r, float c0, float c1) {
  if constexpr (Cfg::kOCopySmem) {
    const u32 a = ((smem_u32(smem_raw) + 1023) & ~1023u) + Layout<Cfg>::kOCorr + (threadIdx.x - 128) * 8;
    asm volatile("st.shared.v2.f32 [%0], {%1, %2};" ::"r"(a), "f"(c0), "f"(c1) : "memory");
  } else {
    r.ocorr[0] = c0;
    r.ocorr[1] = c1;
  }
}

// O *= the softmax correction of its rows (the running max moved). With the lazy maximum most
// steps move no row of the warp, and the 64 multiplies are skipped (a warp-uniform branch).
template <class Cfg>
__device__ __forceinline__ void rescale_o(ConsumerRegs<Cfg>& r, const float (&corr)[2]) {
  pin_registers(r.o);
  if constexpr (Cfg::kLazyRescale) {
    if (!any_row_moved(corr)) return;
  }
#pragma unroll
  for (int j = 0; j < ConsumerRegs<Cfg>::kOFrags; ++j) {
    r.o[4 * j + 0] *= corr[0];
    r.o[4 * j + 1] *= corr[0];
    r.o[4 * j + 2] *= corr[1];
    r.o[4 * j + 3] *= corr[1];
  }
  // The copy of o_flush is rescaled when o joins it, by the product of the corrections o took since.
  if constexpr (Cfg::kOFlush > 0) {
    float c0, c1;
    ocorr_get(r, c0, c1);
    ocorr_set(r, c0 * corr[0], c1 * corr[1]);
  }
}

// Two-level accumulation (FP8, O_FLUSH > 0): after a P V has completed, every O_FLUSH-th time (or
// always when FORCE, after the tile's last one) o joins the fp32 copy, copy = copy * ocorr + o (the
// corrections o took since the last flush bring the copy to o's maximum), and the next P V starts afresh.
template <class Cfg, bool FORCE = false>
__device__ __forceinline__ void flush_o(ConsumerRegs<Cfg>& r) {
  if constexpr (Cfg::kOFlush > 0) {
    using R = ConsumerRegs<Cfg>;
    r.oflush += 1;
    if (FORCE || (r.oflush & 7) == Cfg::kOFlush) {
      const bool based = r.oflush & R::kBased;
      r.oflush = R::kFresh | R::kBased;  // count 0
      float c0, c1;
      ocorr_get(r, c0, c1);
      ocorr_set(r, 1.f, 1.f);
      if constexpr (Cfg::kOCopySmem) {
        const u32 base = ocopy_addr<Cfg>();
#pragma unroll
        for (int j = 0; j < R::kOFrags; ++j) {
          const u32 a = base + j * 128 * 16;
          float x0 = 0.f, x1 = 0.f, x2 = 0.f, x3 = 0.f;
          if (based)
            asm volatile("ld.shared.v4.f32 {%0, %1, %2, %3}, [%4];" : "=f"(x0), "=f"(x1), "=f"(x2), "=f"(x3) : "r"(a));
          asm volatile("st.shared.v4.f32 [%0], {%1, %2, %3, %4};" ::"r"(a), "f"(fmaf(x0, c0, r.o[4 * j])),
                       "f"(fmaf(x1, c0, r.o[4 * j + 1])), "f"(fmaf(x2, c1, r.o[4 * j + 2])), "f"(fmaf(x3, c1, r.o[4 * j + 3]))
                       : "memory");
        }
      } else {
#pragma unroll
        for (int j = 0; j < R::kOFrags; ++j) {
          r.oacc[4 * j + 0] = fmaf(r.oacc[4 * j + 0], c0, r.o[4 * j + 0]);
          r.oacc[4 * j + 1] = fmaf(r.oacc[4 * j + 1], c0, r.o[4 * j + 1]);
          r.oacc[4 * j + 2] = fmaf(r.oacc[4 * j + 2], c1, r.o[4 * j + 2]);
          r.oacc[4 * j + 3] = fmaf(r.oacc[4 * j + 3], c1, r.o[4 * j + 3]);
        }
      }
    }
  }
}

// Four floats as e4m3 (round to nearest even, saturating), x0 in the low byte.
__device__ __forceinline__ u32 pack_e4m3x4(float x0, float x1, float x2, float x3) {
  u32 out;
  // cvt ... e4m3x2.f32 d, a, b puts a in the upper byte of d.
  asm("{\n .reg .b16 lo, hi;\n cvt.rn.satfinite.e4m3x2.f32 lo, %2, %1;\n cvt.rn.satfinite.e4m3x2.f32 hi, %4, %3;\n"
      " mov.b32 %0, {lo, hi};\n}\n"
      : "=r"(out)
      : "f"(x0), "f"(x1), "f"(x2), "f"(x3));
  return out;
}

// P as A fragments of the next P V: bf16 (k16), or e4m3 (k32). The e4m3 fragment of a thread
// holds, per 16 keys, positions 4t..4t+3 of row g (register 0, then 2 for the next 16) and of
// row g + 8 (registers 1 and 3); the thread's S columns there are 2t, 2t+1, 8+2t, 9+2t, which
// V^T's key permutation (transpose_v) puts at exactly those positions.
template <class Cfg>
__device__ __forceinline__ void pack_p(ConsumerRegs<Cfg>& r) {
  pin_registers(r.p);  // the previous P V has completed; only now may P be overwritten
  if constexpr (Cfg::kElemBytes == 1) {
#pragma unroll
    for (int kt = 0; kt < Cfg::kBlockN / 32; ++kt) {
      const float* s = r.s + 16 * kt;
      r.p[kt][0] = pack_e4m3x4(s[0], s[1], s[4], s[5]);
      r.p[kt][1] = pack_e4m3x4(s[2], s[3], s[6], s[7]);
      r.p[kt][2] = pack_e4m3x4(s[8], s[9], s[12], s[13]);
      r.p[kt][3] = pack_e4m3x4(s[10], s[11], s[14], s[15]);
    }
  } else {
#pragma unroll
    for (int kt = 0; kt < Cfg::kBlockN / 16; ++kt) {
      r.p[kt][0] = pack_bf16x2(r.s[8 * kt + 0], r.s[8 * kt + 1]);
      r.p[kt][1] = pack_bf16x2(r.s[8 * kt + 2], r.s[8 * kt + 3]);
      r.p[kt][2] = pack_bf16x2(r.s[8 * kt + 4], r.s[8 * kt + 5]);
      r.p[kt][3] = pack_bf16x2(r.s[8 * kt + 6], r.s[8 * kt + 7]);
    }
  }
}

// After the softmax of key tile j: P(j) packed, and O rescaled now unless RESCALE_UNDER_QK defers
// it to the next step, between issuing Q K^T and P V (the multiplies then run while the tensor
// cores work on Q K^T, as in FlashAttention-3, instead of in front of it).
template <class Cfg>
__device__ __forceinline__ void finish_step(ConsumerRegs<Cfg>& r, const float (&corr)[2]) {
  if constexpr (!Cfg::kRescaleUnderQk) rescale_o(r, corr);
  pack_p(r);
}

// Ping-pong between the two consumer warpgroups: a warpgroup waits for its turn before issuing
// MMAs and hands the turn over after issuing them (kTurn + warpgroup, 256 threads).
template <class Cfg>
__device__ __forceinline__ void turn_wait(int wg) {
  if constexpr (Cfg::kPingpong) named_sync(kTurn + wg, 256);
}
template <class Cfg>
__device__ __forceinline__ void turn_pass(int wg) {
  if constexpr (Cfg::kPingpong) named_arrive(kTurn + (wg ^ 1), 256);
}

template <class Cfg, class Params>
__device__ __forceinline__ void write_empty_rows(const Params& p, const QueryTile& qt, int head, int wg) {
  // A tile whose rows see no key: out = 0, lse = +inf.
  const int tid = threadIdx.x % 128;
  for (int i = tid; i < 64 * (Cfg::kDV / 8); i += 128) {
    const int row = wg * 64 + i / (Cfg::kDV / 8);
    const int chunk = i % (Cfg::kDV / 8);
    if (row < qt.rows) {
      u16* dst = p.out + (i64)(qt.seq.q_start + qt.row0 + row) * p.o_row_stride + (i64)head * p.o_head_stride + chunk * 8;
      *reinterpret_cast<uint4*>(dst) = make_uint4(0, 0, 0, 0);
    }
  }
  if (tid < 64 && wg * 64 + tid < qt.rows)
    p.lse[(i64)(qt.seq.q_start + qt.row0 + wg * 64 + tid) * p.lse_row_stride + head] = pos_inf();
}

// The descale factor of `head` (FP8): null is 1.0, head stride 0 one factor for every head.
__device__ __forceinline__ float descale(const float* d, int head_stride, int head) {
  return d == nullptr ? 1.f : ldg(d + head * head_stride);
}

// The softmax scale in the exp2 domain; with FP8, times q_descale * k_descale (S is computed on
// the stored values). With softcap and FP8 the descales go into softcap's pre-scale instead (r's
// cap_scale; tanh must see the true score) and the softmax's scale stays c * log2(e).
template <class Cfg, class Params>
__device__ __forceinline__ float tile_scale_log2(const Params& p, ConsumerRegs<Cfg>& r, int head) {
  if constexpr (Cfg::kElemBytes == 1) {
    if constexpr (Cfg::kSoftcap) {
      r.cap_scale = p.softcap_scale * descale(p.q_descale, p.qd_head_stride, head) *
                    descale(p.k_descale, p.kd_head_stride, head);
      return p.scale_log2;
    } else {
      return p.scale_log2 * descale(p.q_descale, p.qd_head_stride, head) * descale(p.k_descale, p.kd_head_stride, head);
    }
  } else {
    return p.scale_log2;
  }
}

// What O is multiplied by besides 1 / rowsum: v_descale with FP8 (P V used the stored values).
template <class Cfg, class Params>
__device__ __forceinline__ float output_scale(const Params& p, int head) {
  if constexpr (Cfg::kElemBytes == 1) {
    return descale(p.v_descale, p.vd_head_stride, head);
  } else {
    return 1.f;
  }
}

// The epilogue's part of skeleton::staged_store: a warpgroup's 64 staged rows (from `rows`, the
// stage's first row of the slice) to rows row0.. of head `head` of O, one box per kCbO columns.
template <class Cfg>
struct OutputStore {
  template <class Params>
  __device__ __forceinline__ static void issue(const Params* p, const QueryTile* qt, u32 stage, int slice_row0, int head) {
    using L = Layout<Cfg>;
#pragma unroll
    for (int cb = 0; cb < Cfg::kDV / L::kCbO; ++cb)
      tma_store_3d(&p->tma_o, stage + cb * L::kQCbBytes + slice_row0 * Cfg::kSwQ, cb * L::kCbO, head,
                   qt->seq.q_start + qt->row0 + slice_row0);
  }
};

// The output leaves through a TMA store from a staging tile (the Q tile, or with VTMA the V stage
// `v_stage` that the last P V read, which this warpgroup releases only once the store has read it),
// or straight from registers.
template <class Cfg, class Params>
__device__ __forceinline__ void epilogue(const Params& p, ConsumerRegs<Cfg>& r, const QueryTile& qt, int head, int wg,
                                         u32 smem, const Barriers<Cfg>& bar, int v_stage) {
  using L = Layout<Cfg>;
  const int tid = threadIdx.x % 128, warp = tid / 32, lane = tid % 32;
  float inv[2], lse[2];
  if constexpr (Cfg::kSink) softmax_finish_sink(r.stats, ldg(p.attn_sink + head) * kLog2e, inv, lse);
  else softmax_finish(r.stats, inv, lse);
  if constexpr (Cfg::kElemBytes == 1) {
    const float vd = output_scale<Cfg>(p, head);
    inv[0] *= vd;
    inv[1] *= vd;
  }
  const int slice_row0 = wg * 64;
  const int row_in_slice = warp * 16 + lane / 4;
  if (lane % 4 == 0) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = slice_row0 + row_in_slice + 8 * h;
      if (row < qt.rows) p.lse[(i64)(qt.seq.q_start + qt.row0 + row) * p.lse_row_stride + head] = lse[h];
    }
  }
  // TMA stores clip at the end of the tensor but not at the end of a packed sequence, so a slice
  // that ends inside another sequence's rows is written with predicated stores instead. With the
  // direct epilogue the Q buffer was released after the last Q K^T and registers go straight out.
  constexpr bool kStaged = Cfg::kTmaEpilogue || Cfg::kVtmaEpilogue;
  const bool tma_ok = kStaged && (slice_row0 + 64 <= qt.rows || qt.seq.q_start + qt.seq.len_q == p.total_q);
  // Staging tile: column blocks of kCbQ columns x BLOCK_M rows, swizzled like Q (the TMA map of O).
  const u32 stage = smem + (Cfg::kVtmaEpilogue ? L::kV + v_stage * L::kVBytes : L::kQ);
  // Every consumer warpgroup reads the whole V tile, so the stage may be overwritten only once all
  // of them have finished their last P V (the Q tile, by contrast, holds each warpgroup's own rows).
  if constexpr (Cfg::kVtmaEpilogue && Cfg::kConsumers > 1) named_sync(kVStageRead, 128 * Cfg::kConsumers);
  if (tma_ok) {
#pragma unroll
    for (int j = 0; j < ConsumerRegs<Cfg>::kOFrags; ++j) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int col = 8 * j + 2 * (lane % 4);
        const int row = slice_row0 + row_in_slice + 8 * h;
        const u32 addr = stage + (col / L::kCbO) * L::kQCbBytes +
                         swizzle_offset<Cfg::kSwQ>(row * Cfg::kSwQ + (col % L::kCbO) * 2);
        const u32 packed = pack_bf16x2(r.o[4 * j + 2 * h] * inv[h], r.o[4 * j + 2 * h + 1] * inv[h]);
        asm volatile("st.shared.u32 [%0], %1;\n" ::"r"(addr), "r"(packed) : "memory");
      }
    }
    skeleton::staged_store<OutputStore<Cfg>>(kOutStaged + wg, tid == 0, &p, &qt, stage, slice_row0, head);
  } else {
    u16* base = p.out + (i64)(qt.seq.q_start + qt.row0) * p.o_row_stride + (i64)head * p.o_head_stride;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = slice_row0 + row_in_slice + 8 * h;
      if (row < qt.rows) {
#pragma unroll
        for (int j = 0; j < ConsumerRegs<Cfg>::kOFrags; ++j) {
          const u32 packed = pack_bf16x2(r.o[4 * j + 2 * h] * inv[h], r.o[4 * j + 2 * h + 1] * inv[h]);
          *reinterpret_cast<u32*>(base + (i64)row * p.o_row_stride + 8 * j + 2 * (lane % 4)) = packed;
        }
      }
    }
  }
  if constexpr (Cfg::kTmaEpilogue) mbar_arrive(bar.q_empty());
  if constexpr (Cfg::kVtmaEpilogue) release_v<Cfg>(bar.v_empty(v_stage));
}

// One key step without overlap: S = Q K^T, softmax, and (without overlap) P V. With overlap this
// is step 0 only: it stops after the softmax, and the next step issues its P V.
template <class Cfg, bool HALF = false, class Params>
__device__ __forceinline__ void serial_step(const Params& p, ConsumerRegs<Cfg>& r, const BandTile& qt,
                                            const Barriers<Cfg>& bar, u32 smem, int wg, int row_base, int n, int s,
                                            u32 phase, float scale_log2, float (&corr)[2]) {
  constexpr int kHalfN = ConsumerRegs<Cfg>::kHalfN;
  turn_wait<Cfg>(wg);
  float s_half[kHalfN / 2];  // HALF: the half tile's scores (issue_qk)
  if constexpr (HALF) issue_qk<Cfg, kHalfN>(s_half, r, smem, wg, s);
  else issue_qk<Cfg>(r.s, r, smem, wg, s);
  turn_pass<Cfg>(wg);
  wgmma_wait<0>();
  release_kv<Cfg>(bar.k_empty(s));
  // The last Q K^T done (the band's first key tile: tiles go last to first).
  if (!Cfg::kTmaEpilogue && !Cfg::kQInRegs && n == first_key_tile<Cfg>(qt)) mbar_arrive(bar.q_empty());
  if constexpr (HALF) half_scores_to_probabilities<Cfg>(p, r, s_half, qt, n, row_base, scale_log2, corr);
  else scores_to_probabilities<Cfg>(p, r, qt, n, row_base, scale_log2, corr);
  finish_step<Cfg>(r, corr);
  if constexpr (!Cfg::kOverlap) {
    mbar_wait(bar.v_full(s), phase);
    turn_wait<Cfg>(wg);
    if constexpr (HALF) issue_pv<Cfg, kHalfN>(r, smem, s);
    else issue_pv<Cfg>(r, smem, s);
    turn_pass<Cfg>(wg);
    wgmma_wait<0>();
    flush_o<Cfg>(r);
    release_v<Cfg>(bar.v_empty(s));
  }
}

template <class Cfg, class Params>
__device__ void consumer(const Params& p, u32 smem, const Barriers<Cfg>& bar, int wg) {
  using L = Layout<Cfg>;
  const int tid = threadIdx.x % 128, warp = tid / 32;
  const int row_base = wg * 64 + warp * 16;  // first tile row of this warp
  const auto sched = tile_scheduler<Cfg>(p);
  ConsumerRegs<Cfg> r;
  int tile_iter = 0, kv_iter = 0;
  if constexpr (Cfg::kPingpong) {
    if (wg == 1) named_arrive(kTurn, 256);  // warpgroup 0 issues first
  }
  int id_iter = 0;
  for (int t = sched.first(); t < sched.total;) {
    int head, kv_blocks;
    const BandTile qt = query_tile<Cfg>(p, t, head, kv_blocks);
    if (qt.rows > 0 && qt.n_blocks == 0) write_empty_rows<Cfg>(p, qt, head, wg);
    const bool computes = qt.rows > 0 && qt.n_blocks > 0;
    // Key tiles the cluster streams that this CTA's rows do not see (they come first): release them.
    for (int i = computes ? qt.n_blocks : 0; i < kv_blocks; ++i, ++kv_iter) {
      const int s = kv_iter % Cfg::kStages;
      const u32 phase = (kv_iter / Cfg::kStages) & 1;
      mbar_wait(bar.k_full(s), phase);
      release_kv<Cfg>(bar.k_empty(s));
      mbar_wait(bar.v_full(s), phase);
      release_v<Cfg>(bar.v_empty(s));
    }
    if (computes) {
      mbar_wait(bar.q_full(), tile_iter & 1);
      ++tile_iter;
      if constexpr (Cfg::kQInRegs) {
        load_q_fragments<Cfg>(r, smem, wg);
        // The next tile's Q is written by TMA (the async proxy) over what ldmatrix (the generic
        // proxy) just read: the proxy fence orders the two, the release on q_empty alone does not.
        // Without it a CTA that runs several tiles read the next Q into this one (wrong lse on
        // D4 / D6 in 40 of 40 calls on the H100, none with it: docs/notes.md, sixteenth session).
        fence_async_shared();
        mbar_arrive(bar.q_empty());  // Q lives in registers now: the next tile's Q may load
      }
#pragma unroll
      for (int i = 0; i < ConsumerRegs<Cfg>::kOFrags * 4; ++i) r.o[i] = 0.f;
      if constexpr (Cfg::kOFlush > 0) {
        if constexpr (!Cfg::kOCopySmem) {
#pragma unroll
          for (int i = 0; i < ConsumerRegs<Cfg>::kOFrags * 4; ++i) r.oacc[i] = 0.f;
        }
        r.oflush = 0;
        ocorr_set(r, 1.f, 1.f);
      }
      r.stats.init();
      const float scale_log2 = tile_scale_log2<Cfg>(p, r, head);
      float corr[2];
      // Key tiles are visited last to first, so the masked ones come first. With overlap, step 0
      // stops after the softmax, every later step issues
      // its S and the previous step's P V back to back, and the last P V follows the loop. Step 0 is
      // peeled so the loop has one body: with a branch inside, ptxas 13.0 no longer sees that O's
      // last P V was waited for, and waits for the whole Q K^T before rescaling O under it (C7517).
      int s = kv_iter % Cfg::kStages;
      u32 phase = (kv_iter / Cfg::kStages) & 1;
      mbar_wait(bar.k_full(s), phase);
      // DIAGONAL half: a warpgroup whose rows see only the first half of this tile computes that half.
      const int n_top = first_key_tile<Cfg>(qt) + qt.n_blocks - 1;  // the first key tile visited
      const bool half = Cfg::kHalfDiagonal && first_half_only<Cfg>(qt, n_top, wg, mask_args(p));
      if (half) serial_step<Cfg, true>(p, r, qt, bar, smem, wg, row_base, n_top, s, phase, scale_log2, corr);
      else serial_step<Cfg>(p, r, qt, bar, smem, wg, row_base, n_top, s, phase, scale_log2, corr);
      for (int i = 1; i < qt.n_blocks; ++i) {
        const int prev_stage = s;
        const u32 prev_phase = phase;
        ++kv_iter;
        s = kv_iter % Cfg::kStages;
        phase = (kv_iter / Cfg::kStages) & 1;
        const int n = n_top - i;
        mbar_wait(bar.k_full(s), phase);
        if constexpr (Cfg::kOverlap) {
          mbar_wait(bar.v_full(prev_stage), prev_phase);
          turn_wait<Cfg>(wg);
          issue_qk<Cfg>(r.s, r, smem, wg, s);
          if constexpr (Cfg::kRescaleUnderQk) rescale_o(r, corr);
          issue_pv<Cfg>(r, smem, prev_stage);
          turn_pass<Cfg>(wg);
          wgmma_wait<1>();
          release_kv<Cfg>(bar.k_empty(s));
          // The last Q K^T done (the band's first key tile: tiles go last to first).
          if (!Cfg::kTmaEpilogue && !Cfg::kQInRegs && n == first_key_tile<Cfg>(qt)) mbar_arrive(bar.q_empty());
          scores_to_probabilities<Cfg>(p, r, qt, n, row_base, scale_log2, corr);
          if constexpr (Cfg::kPvWaitLate) schedule_boundary(p.num_heads);
          wgmma_wait<0>();
          flush_o<Cfg>(r);
          release_v<Cfg>(bar.v_empty(prev_stage));
          finish_step<Cfg>(r, corr);
        } else {
          serial_step<Cfg>(p, r, qt, bar, smem, wg, row_base, n, s, phase, scale_log2, corr);
        }
      }
      ++kv_iter;
      if constexpr (Cfg::kOverlap) {
        mbar_wait(bar.v_full(s), phase);
        turn_wait<Cfg>(wg);
        if constexpr (Cfg::kRescaleUnderQk) rescale_o(r, corr);
        if (half && qt.n_blocks == 1) issue_pv<Cfg, ConsumerRegs<Cfg>::kHalfN>(r, smem, s);  // the tile's only P V
        else issue_pv<Cfg>(r, smem, s);
        turn_pass<Cfg>(wg);
        wgmma_wait<0>();
        if constexpr (!Cfg::kVtmaEpilogue) release_v<Cfg>(bar.v_empty(s));  // else after the store
      }
      if constexpr (Cfg::kOFlush > 0) {
        // The whole of O is in the fp32 copy once the tile's last P V has joined it.
        if (!(r.oflush & ConsumerRegs<Cfg>::kFresh)) flush_o<Cfg, true>(r);
        if constexpr (Cfg::kOCopySmem) {
          const u32 base = ocopy_addr<Cfg>();
#pragma unroll
          for (int j = 0; j < ConsumerRegs<Cfg>::kOFrags; ++j)
            asm volatile("ld.shared.v4.f32 {%0, %1, %2, %3}, [%4];"
                         : "=f"(r.o[4 * j]), "=f"(r.o[4 * j + 1]), "=f"(r.o[4 * j + 2]), "=f"(r.o[4 * j + 3])
                         : "r"(base + j * 128 * 16));
        } else {
#pragma unroll
          for (int i = 0; i < ConsumerRegs<Cfg>::kOFrags * 4; ++i) r.o[i] = r.oacc[i];
        }
      }
      pin_registers(r.o);
      epilogue<Cfg>(p, r, qt, head, wg, smem, bar, s);
    }
    t = sched.next(t, id_iter, smem, bar);
    if constexpr (DenseScheduler<Cfg>::kDynamic) ++id_iter;  // the ids read so far
  }
  skeleton::drain_stores(tid);
}

// The roles' parts (skeleton.cuh: Role): the producer warpgroup, and consumer warpgroup `index`.
template <class Cfg>
struct ProducerPart {
  template <class Params>
  __device__ __forceinline__ static void run(const Params& p, u32 smem, const Barriers<Cfg>& bar, skeleton::NoWork, int) {
    producer<Cfg>(p, smem, bar);
  }
};

template <class Cfg>
struct ConsumerPart {
  template <class Params>
  __device__ __forceinline__ static void run(const Params& p, u32 smem, const Barriers<Cfg>& bar, skeleton::NoWork,
                                             int index) {
    consumer<Cfg>(p, smem, bar, index);
  }
};

// The kernel for skeleton::run: ROLES is the spec's schedule.roles, rendered by the template.
template <class Cfg, class ROLES>
struct DenseKernel {
  static constexpr int kThreads = Cfg::kThreads;
  static constexpr int kCluster = Cfg::kCluster;
  static constexpr bool kUniformWarpgroup = true;
  static constexpr bool kWorkBeforeSync = false;
  static constexpr int kBarrierOffset = Layout<Cfg>::kBarriers;
  using Work = skeleton::NoWork;
  using Barriers = sm90::Barriers<Cfg>;
  using Roles = ROLES;
  template <class Params>
  __device__ __forceinline__ static skeleton::NoWork work(const Params&) {
    return {};
  }
  template <class Params>
  __device__ __forceinline__ static void prefetch(const Params& p) {
    if (threadIdx.x == 0) {
      tma_prefetch_descriptor(&p.tma_q);
      tma_prefetch_descriptor(&p.tma_k);
      tma_prefetch_descriptor(&p.tma_k_rope);
      tma_prefetch_descriptor(&p.tma_v);
      tma_prefetch_descriptor(&p.tma_o);
    }
  }
};

}  // namespace mlagen::sm90
