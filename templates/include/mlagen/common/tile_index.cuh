// Query-tile indexing over packed (ragged) batches and the key range each query tile attends to.
//
// Tiles are numbered without knowing sequence lengths on the host: sequence b owns the virtual
// tile indices [start(b), start(b+1)) with start(b) = floor(cu_q[b] / BLOCK_M) + b, which leaves
// room for its ceil(Lq_b / BLOCK_M) tiles. The host launches floor(total_q / BLOCK_M) + batch
// virtual tiles per head; the few that map past a sequence's last tile exit at once.
#pragma once
#include "mlagen/common/types.cuh"

namespace mlagen {

struct SeqInfo {
  int q_start;  // first row of the sequence in the packed query tensor
  int k_start;
  int len_q;
  int len_k;
};

// Sequence b's rows. Offsets are clamped into the tensors, so cu_seqlens values that were not
// validated on the host (device tensors, graph capture) can never send a kernel out of bounds.
__device__ __forceinline__ SeqInfo load_seq(const int* cu_q, const int* cu_k, int total_q, int total_k, int b) {
  SeqInfo s;
  if (cu_q == nullptr) {
    s.q_start = 0;
    s.len_q = total_q;
  } else {
    s.q_start = min(max(ldg(cu_q + b), 0), total_q);
    s.len_q = min(max(ldg(cu_q + b + 1), s.q_start), total_q) - s.q_start;
  }
  if (cu_k == nullptr) {
    s.k_start = 0;
    s.len_k = total_k;
  } else {
    s.k_start = min(max(ldg(cu_k + b), 0), total_k);
    s.len_k = min(max(ldg(cu_k + b + 1), s.k_start), total_k) - s.k_start;
  }
  return s;
}

template <int BLOCK_M>
__device__ __forceinline__ int virtual_tile_start(const int* cu_q, int b) {
  return ldg(cu_q + b) / BLOCK_M + b;
}

// The sequence that owns virtual tile v: the last b in [0, batch) with start(b) <= v.
// Called by a whole warp (all lanes get the answer): each step samples 32 candidates, so a batch
// of up to 32^k sequences costs k dependent loads. Offsets that were never checked may break the
// invariant below (cu_q[0] != 0, decreasing entries); the answer still stays in [0, batch), so
// every cu_q / cu_k read stays inside their batch + 1 entries. On a 64-lane wave the upper 32
// lanes repeat the lower ones' candidates, and ballot32 returns the lower half: the same answer.
template <int BLOCK_M>
__device__ __forceinline__ int find_sequence(const int* cu_q, int batch, int v) {
  if (cu_q == nullptr) return 0;
  const int lane = lane32();
  int lo = 0, hi = batch;  // invariant: start(lo) <= v, answer in [lo, hi)
  while (hi - lo > 32) {
    const int step = (hi - lo + 31) / 32;
    const int idx = lo + lane * step;
    const bool le = idx < hi && virtual_tile_start<BLOCK_M>(cu_q, idx) <= v;
    const unsigned mask = ballot32(le);
    const int k = max(31 - clz32(mask), 0);  // mask == 0 only for unchecked, invalid offsets
    lo = lo + k * step;
    hi = min(hi, lo + step);
  }
  const int idx = lo + lane;
  const bool le = idx < hi && virtual_tile_start<BLOCK_M>(cu_q, idx) <= v;
  return lo + max(popc32(ballot32(le)) - 1, 0);
}

// The sequence that owns virtual tile v when sequences are taken longest-first (LPT order): the
// longest key range first, ties in batch order, each sequence's tiles packed one after the other
// (no gaps, unlike the batch order above; the launcher's virtual tile count still covers them, and
// the spare virtual tiles at the end are empty). With a dynamic queue the last tiles handed out are
// then the shortest sequences' instead of whichever sequence comes last in the batch (a chunked
// prefill batch whose prefixes differ by 10x). One sequence per lane: batch <= 32, a whole warp
// calling (on a 64-lane wave lanes 32..63 repeat 0..31). Returns the sequence and sets `local`,
// its tile index within it (past its tiles when v is a spare tile).
template <int BLOCK_M>
__device__ __forceinline__ int find_sequence_lpt(const int* cu_q, const int* cu_k, int total_q, int total_k,
                                                 int batch, int v, int& local) {
  const int lane = lane32();
  int tiles = 0, len_k = -1;  // lanes past the batch own nothing and sort last
  if (lane < batch) {
    const SeqInfo s = load_seq(cu_q, cu_k, total_q, total_k, lane);
    tiles = ceil_div(s.len_q, BLOCK_M);
    len_k = s.len_k;
  }
  int start = 0;  // tiles of the sequences before this lane's in LPT order
  for (int j = 0; j < batch; ++j) {
    const int len_j = shfl_int(len_k, j);
    const int tiles_j = shfl_int(tiles, j);
    if (len_j > len_k || (len_j == len_k && j < lane)) start += tiles_j;
  }
  const unsigned owner = ballot32(lane < batch && v >= start && v < start + tiles);
  if (owner == 0) {  // a spare tile past every sequence's tiles
    local = 1 << 30;
    return 0;
  }
  const int b = 31 - clz32(owner & (0u - owner));  // the lowest owning lane (there is one)
  local = v - shfl_int(start, b);
  return b;
}

// One query tile: which sequence, which rows, and the keys it attends to.
struct QueryTile {
  SeqInfo seq;
  int batch;
  int m_block;     // tile index within the sequence
  int row0;        // first query row of the tile, within the sequence
  int rows;        // valid rows in the tile (<= BLOCK_M); 0 means the virtual tile is empty
  int n_blocks;    // key tiles to visit: [0, n_blocks)
  int first_masked_block;  // key tiles >= this one need the causal or length mask
};

// The key tiles that rows [row0, row0 + BLOCK_M) of a tile attend to.
template <int BLOCK_M, int BLOCK_N, bool CAUSAL>
__device__ __forceinline__ void set_key_range(QueryTile& t) {
  // Bottom-right aligned causal mask: row i sees key j iff j <= i + (len_k - len_q).
  const int offset = t.seq.len_k - t.seq.len_q;
  int n_end = t.seq.len_k;
  if (CAUSAL) n_end = min(n_end, t.row0 + BLOCK_M + offset);
  t.n_blocks = n_end > 0 ? ceil_div(n_end, BLOCK_N) : 0;
  // Key tiles past the last full one are length-masked; with causal, tiles reaching past the
  // first row's diagonal are masked too.
  int first = t.seq.len_k / BLOCK_N;
  if (CAUSAL) first = min(first, max(0, floor_div(t.row0 + offset + 1, BLOCK_N)));
  t.first_masked_block = first;
}

// Map virtual tile v to its query tile. Within a sequence, tiles are visited longest-first when
// causal (the last rows see the most keys), so a grid walked in order balances itself.
// With LPT the sequences are taken longest-first (find_sequence_lpt: cu_q given, at most 32
// sequences, the caller checks), else in batch order.
template <int BLOCK_M, int BLOCK_N, bool CAUSAL, bool LPT = false>
__device__ __forceinline__ QueryTile locate_tile(const int* cu_q, const int* cu_k, int total_q, int total_k,
                                                 int batch, int v) {
  QueryTile t;
  int lpt_local = 0;
  const int b = LPT ? find_sequence_lpt<BLOCK_M>(cu_q, cu_k, total_q, total_k, batch, v, lpt_local)
                    : find_sequence<BLOCK_M>(cu_q, batch, v);
  t.batch = b;
  t.seq = load_seq(cu_q, cu_k, total_q, total_k, b);
  const int local = LPT ? lpt_local : cu_q == nullptr ? v : v - virtual_tile_start<BLOCK_M>(cu_q, b);
  const int m_tiles = ceil_div(t.seq.len_q, BLOCK_M);
  if (local < 0 || local >= m_tiles) {  // local < 0 only for unchecked, invalid offsets
    t.rows = 0;
    t.n_blocks = 0;
    t.m_block = 0;
    t.row0 = 0;
    t.first_masked_block = 0;
    return t;
  }
  t.m_block = CAUSAL ? m_tiles - 1 - local : local;
  t.row0 = t.m_block * BLOCK_M;
  t.rows = min(BLOCK_M, t.seq.len_q - t.row0);
  set_key_range<BLOCK_M, BLOCK_N, CAUSAL>(t);
  return t;
}

// Rows [part * PART_M, (part + 1) * PART_M) of a located tile, as a tile of their own (for the
// CTAs of a cluster that share one tile's key stream). Its key range is never longer than the
// whole tile's; rows <= 0 means this part is past the end of the sequence.
template <int PART_M, int BLOCK_N, bool CAUSAL>
__device__ __forceinline__ QueryTile split_tile(const QueryTile& whole, int part) {
  QueryTile t = whole;
  t.row0 = whole.row0 + part * PART_M;
  t.m_block = t.row0 / PART_M;
  t.rows = min(PART_M, whole.rows - part * PART_M);
  if (t.rows <= 0) {
    t.rows = 0;
    t.n_blocks = 0;
    t.first_masked_block = 0;
    return t;
  }
  set_key_range<PART_M, BLOCK_N, CAUSAL>(t);
  return t;
}

}  // namespace mlagen
