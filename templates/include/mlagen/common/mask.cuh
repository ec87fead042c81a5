// Attention masks as bands of visible keys (MLA.md section 1b), and the key tiles a query tile visits.
//
// Query i of a sequence sits at position p = i + len_k - len_q (bottom-right aligned) and sees the
// keys j in [lo(p), hi(p)) of its sequence:
//   none     [0, len_k)
//   causal   [0, p + 1)
//   window   [p - left, p + right + 1) (FlashAttention's window_size; a negative side is unbounded)
//   chunked  [floor(p / C) * C, p + 1)
// Both bounds never decrease with p, so a tile of rows [row0, row0 + BLOCK_M) sees keys
// [lo(p_first), hi(p_last)): key tiles outside it are never visited, and only the tiles that cut
// some row's band (at either end) are masked element by element.
#pragma once
#include "mlagen/common/tile_index.cuh"
#include "mlagen/common/types.cuh"

namespace mlagen {

enum class MaskKind { kNone, kCausal, kWindow, kChunked };

// The run-time part of a mask: the window's sides (-1: unbounded) and the chunk size.
struct MaskArgs {
  int left;
  int right;
  int chunk;
};

template <MaskKind K>
struct Band {
  static constexpr bool kUpper = K != MaskKind::kNone;                           // hi(p) may be < len_k
  static constexpr bool kLower = K == MaskKind::kWindow || K == MaskKind::kChunked;  // lo(p) may be > 0
  // Query tiles of a sequence go last-first (the last rows see the most keys when causal).
  static constexpr bool kReverse = K != MaskKind::kNone;

  // One past the last visible key of position p, before the clamp to len_k (p <= len_k - 1 always;
  // may be <= 0). hi is min(len_k, hi_raw).
  static __device__ __forceinline__ int hi_raw(const MaskArgs& m, int p, int len_k) {
    if constexpr (K == MaskKind::kNone) return len_k;
    if constexpr (K == MaskKind::kWindow) {
      // p + 1 + right without overflow: len_k - p - 1 >= 0 bounds the right side.
      return m.right < 0 ? len_k : p + 1 + min(m.right, len_k - p - 1);
    }
    return p + 1;
  }
  static __device__ __forceinline__ int hi(const MaskArgs& m, int p, int len_k) {
    if constexpr (K == MaskKind::kNone) return len_k;
    return min(len_k, hi_raw(m, p, len_k));
  }
  // The first visible key of position p (>= 0).
  static __device__ __forceinline__ int lo(const MaskArgs& m, int p) {
    if constexpr (K == MaskKind::kWindow) return m.left >= 0 && p > m.left ? p - m.left : 0;
    if constexpr (K == MaskKind::kChunked) return p > 0 ? p / m.chunk * m.chunk : 0;
    return 0;
  }
};

// A query tile (tile_index.cuh) with the band's lower side: the key tiles visited are
// [n_begin, n_begin + n_blocks), those < lo_masked_end cut by the lower bound (both 0 without one).
struct BandTile : QueryTile {
  int n_begin;
  int lo_masked_end;
};

// The key tiles rows [row0, row0 + BLOCK_M) of a tile with rows visit, and which of them the band cuts.
template <int BLOCK_M, int BLOCK_N, MaskKind K>
__device__ __forceinline__ void set_band_range(BandTile& t, const MaskArgs& m) {
  using B = Band<K>;
  const int offset = t.seq.len_k - t.seq.len_q;
  const int p_first = t.row0 + offset, p_last = t.row0 + BLOCK_M - 1 + offset;
  const int n_end_key = B::hi(m, p_last, t.seq.len_k);
  const int n_end = n_end_key > 0 ? ceil_div(n_end_key, BLOCK_N) : 0;
  const int n_begin = B::kLower ? min(B::lo(m, p_first) / BLOCK_N, n_end) : 0;
  t.n_begin = n_begin;
  t.n_blocks = n_end - n_begin;
  int first = t.seq.len_k / BLOCK_N;
  if constexpr (B::kUpper) first = min(first, max(0, floor_div(B::hi_raw(m, p_first, t.seq.len_k), BLOCK_N)));
  t.first_masked_block = first;
  t.lo_masked_end = B::kLower ? ceil_div(B::lo(m, p_last), BLOCK_N) : 0;
}

// locate_tile (tile_index.cuh) with a band mask. Without a lower bound (none, causal) it is
// locate_tile itself; otherwise locate_tile's rows (the causal order) and the band's key range.
template <int BLOCK_M, int BLOCK_N, MaskKind K, bool LPT = false>
__device__ __forceinline__ BandTile locate_band_tile(const int* cu_q, const int* cu_k, int total_q, int total_k,
                                                     int batch, int v, const MaskArgs& m) {
  BandTile t;
  static_cast<QueryTile&>(t) = locate_tile<BLOCK_M, BLOCK_N, Band<K>::kReverse, LPT>(cu_q, cu_k, total_q, total_k,
                                                                                   batch, v);
  t.n_begin = 0;
  t.lo_masked_end = 0;
  if constexpr (Band<K>::kLower) {
    if (t.rows > 0) set_band_range<BLOCK_M, BLOCK_N, K>(t, m);
  }
  return t;
}

// split_tile (tile_index.cuh) for a band without a lower bound (a cluster's CTAs share one key
// range, which a lower bound would make differ).
template <int PART_M, int BLOCK_N, MaskKind K>
__device__ __forceinline__ BandTile split_band_tile(const BandTile& whole, int part) {
  static_assert(!Band<K>::kLower, "a cluster streams one key range for both CTAs");
  BandTile t;
  static_cast<QueryTile&>(t) = split_tile<PART_M, BLOCK_N, Band<K>::kUpper>(whole, part);
  t.n_begin = 0;
  t.lo_masked_end = 0;
  return t;
}

}  // namespace mlagen
