// The two KV pools of one sparse softmax (../../../../../shared/MLA.md section 2b, DeepSeek-V4: a
// window over raw tokens and the entries of a compressed pool).
//
// A token's key list is positions [0, len1) of its row of `indices` (rows of `kv`) followed by
// positions [0, len2) of its row of `extra_indices` (rows of `extra_kv`): len1 is topk_length[t]
// (capped to [0, topk]) or topk, len2 likewise from extra_topk_length / extra_topk, and 0 without an
// extra pool (the host passes extra_topk 0). The kernels walk positions [0, len1 + len2) of that
// list as they walked one pool's: a pair or block that straddles the seam is gathered from both.
//
// An entry names a key row: pool 1's rows are [0, num_kv), pool 2's num_kv + [0, extra_num_kv)
// (the host keeps the sum below 2^31), -1 an invalid entry (never read). Pool 2 has its own base,
// row stride and paging; a flat pool in a paged kernel is one page of all its rows.
#pragma once
#include "mlagen/common/types.cuh"

namespace mlagen::sparse_pools {

template <class Params>
__device__ __forceinline__ int first_length(const Params& p, int t) {
  int len = p.topk;
  if (p.topk_length != nullptr) len = min(len, max(0, __ldg(p.topk_length + t)));
  return len;
}

template <class Params>
__device__ __forceinline__ int extra_length(const Params& p, int t) {
  if (p.extra_topk == 0) return 0;  // no extra pool (or an empty one): nothing is read
  int len = p.extra_topk;
  if (p.extra_topk_length != nullptr) len = min(len, max(0, __ldg(p.extra_topk_length + t)));
  return len;
}

// Keys of token t over both pools (what the consumers count blocks by).
template <class Params>
__device__ __forceinline__ int key_count(const Params& p, int t) {
  return first_length(p, t) + extra_length(p, t);
}

// One token's key list: the token and where the second pool's positions start and end. (The
// index rows' addresses are formed where they are read, from the parameters: three live registers,
// which the register-tight producers need.)
struct KeyList {
  int t;
  int len1;  // positions [0, len1) are pool 1's
  int len;   // len1 + len2
};

template <class Params>
__device__ __forceinline__ KeyList key_list(const Params& p, int t) {
  const int len1 = first_length(p, t);
  return KeyList{t, len1, len1 + extra_length(p, t)};
}

// The key row at position pos of the list, or -1 (past the list, negative, or out of its pool).
template <class Params>
__device__ __forceinline__ int key_row(const Params& p, const KeyList& k, int pos) {
  if (pos < k.len1) {
    const int r = __ldg(p.indices + (i64)k.t * p.idx_row_stride + pos);
    return r >= 0 && r < p.num_kv ? r : -1;
  }
  if (pos < k.len) {
    const int r = __ldg(p.extra_indices + (i64)k.t * p.extra_idx_row_stride + (pos - k.len1));
    return r >= 0 && r < p.extra_num_kv ? p.num_kv + r : -1;
  }
  return -1;
}

// Elements from p.kv to p.extra_kv (both 16-byte aligned rows of the same element type).
template <class Params>
__device__ __forceinline__ i64 extra_base(const Params& p) {
  return ((i64)reinterpret_cast<u64>(p.extra_kv) - (i64)reinterpret_cast<u64>(p.kv)) / (i64)sizeof(*p.kv);
}

// Element offset from p.kv of key row `row` (>= 0). PAGED: row r of a pool is page r / page_size,
// offset r % page_size (a flat pool has page_size = its rows); else r rows of the pool's stride.
// Each pool's formula reads its parameters straight from the constant bank (a branch, not
// selects of the two pools' values: those would take registers the producers do not have).
template <bool kPaged, class Params>
__device__ __forceinline__ i64 key_offset(const Params& p, int row) {
  if (row >= p.num_kv) {
    const int r = row - p.num_kv;
    if constexpr (kPaged)
      return extra_base(p) + (i64)(r / p.extra_page_size) * p.extra_page_stride +
             (i64)(r % p.extra_page_size) * p.extra_row_stride;
    return extra_base(p) + (i64)r * p.extra_row_stride;
  }
  if constexpr (kPaged) return (i64)(row / p.page_size) * p.kv_page_stride + (i64)(row % p.page_size) * p.kv_row_stride;
  return (i64)row * p.kv_row_stride;
}

// Which pools a run of positions [start, end) of a list reads: only the first (so every run of a
// call without a second pool), only the second, or both (the run straddles the seam). A producer
// that gathers a run takes the span once (a warp-uniform branch) and reads each row through the
// span's own code: a one-pool call runs exactly the one-pool gather.
enum Span : int { kFirstOnly = 0, kSecondOnly = 1, kBoth = 2 };

template <int V>
struct SpanTag {
  static constexpr int value = V;
};

__device__ __forceinline__ int span_of(const KeyList& k, int start, int end) {
  if (end <= k.len1 || k.len == k.len1) return kFirstOnly;
  if (start >= k.len1) return kSecondOnly;
  return kBoth;
}

// key_row for positions of a run of span kSpan.
template <int kSpan, class Params>
__device__ __forceinline__ int key_row_in(const Params& p, const KeyList& k, int pos) {
  if constexpr (kSpan == kFirstOnly) {
    int r = -1;
    if (pos < k.len1) r = __ldg(p.indices + (i64)k.t * p.idx_row_stride + pos);
    return r >= 0 && r < p.num_kv ? r : -1;
  } else if constexpr (kSpan == kSecondOnly) {
    int r = -1;
    if (pos < k.len) r = __ldg(p.extra_indices + (i64)k.t * p.extra_idx_row_stride + (pos - k.len1));
    return r >= 0 && r < p.extra_num_kv ? p.num_kv + r : -1;
  } else {
    return key_row(p, k, pos);
  }
}

// key_offset for key rows of a run of span kSpan.
template <int kSpan, bool kPaged, class Params>
__device__ __forceinline__ i64 key_offset_in(const Params& p, int row) {
  if constexpr (kSpan == kFirstOnly) {
    if constexpr (kPaged)
      return (i64)(row / p.page_size) * p.kv_page_stride + (i64)(row % p.page_size) * p.kv_row_stride;
    return (i64)row * p.kv_row_stride;
  } else if constexpr (kSpan == kSecondOnly) {
    const int r = row - p.num_kv;
    if constexpr (kPaged)
      return extra_base(p) + (i64)(r / p.extra_page_size) * p.extra_page_stride +
             (i64)(r % p.extra_page_size) * p.extra_row_stride;
    return extra_base(p) + (i64)r * p.extra_row_stride;
  } else {
    return key_offset<kPaged>(p, row);
  }
}

}  // namespace mlagen::sparse_pools
