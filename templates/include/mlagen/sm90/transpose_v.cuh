// The FP8 kernel's pre-pass: V^T from one-byte V [total_k, heads, D_V] (mla_prefill.cuh, FP8).
//
// V^T is [heads, D_V, width] bytes. Sequence b's keys start at column round_up(k_start, 16) +
// 16 * b (vt_column in mla_prefill.cuh), so every key tile of the main kernel starts on a 16-key
// group; inside a group, column p holds key perm16(p), the order in which a thread's S registers
// become its e4m3 A fragment of P V. Columns that hold no key of their sequence repeat the
// sequence's first key (finite values; the main kernel's P is 0 there). tma.py: PERM16 and
// vt_sources are the same layout in torch (the CPU tests compare them).
//
// A block of 256 threads makes 128 columns of one head: it loads the 128 source rows (D_V bytes
// each, 16-byte loads) into shared memory, then writes V^T 16 bytes at a time, 8 lanes per d row
// (128 contiguous bytes per row and instruction). Staged row r keeps its 16-byte chunk c at
// position c ^ (r / 16 % 8), so the lanes gathering one column from 8 groups of 16 rows read 8
// different banks. Heads are the grid's fast dimension: the blocks running together read whole
// key rows (all heads) instead of one head's 256 bytes of each.
#pragma once
#include "mlagen/common/types.cuh"

namespace mlagen::sm90 {

constexpr int kVtColumns = 128;  // V^T columns per block
constexpr int kVtThreads = 256;

__device__ __forceinline__ int perm16(int p) { return 8 * ((p & 3) >> 1) + 2 * (p >> 2) + (p & 1); }

// Source row (key) of V^T column x, clamped like load_seq so unchecked offsets stay in bounds.
template <class P>
__device__ __forceinline__ int vt_source(const P& p, int x) {
  int b = 0;
  if (p.cu_seqlens_k != nullptr) {  // the last b with start(b) <= x (starts increase by >= 16)
    int lo = 0, hi = p.batch;
    while (hi - lo > 1) {
      const int mid = (lo + hi) / 2;
      const int ks = min(max(ldg(p.cu_seqlens_k + mid), 0), p.total_k);
      if (((ks + 15) & ~15) + 16 * mid <= x) lo = mid;
      else hi = mid;
    }
    b = lo;
  }
  int k_start = 0, len = p.total_k;
  if (p.cu_seqlens_k != nullptr) {
    k_start = min(max(ldg(p.cu_seqlens_k + b), 0), p.total_k);
    len = min(max(ldg(p.cu_seqlens_k + b + 1), k_start), p.total_k) - k_start;
  }
  const int rel = x - (((k_start + 15) & ~15) + 16 * b);
  const int key = (rel & ~15) + perm16(rel & 15);
  return rel >= 0 && key < len ? k_start + key : min(k_start, p.total_k - 1);
}

template <int D_V, class P>
__device__ __forceinline__ void transpose_v(const P& p) {
  static_assert(D_V == 128, "staged rows are 128 bytes: 8 chunks, one per 16-row group of a column block");
  __shared__ __align__(16) u8 tile[kVtColumns * D_V];
  __shared__ int src[kVtColumns];
  const int head = blockIdx.x, tid = threadIdx.x;
  // Column blocks stride by the grid (its y extent is capped at 65535 blocks).
  for (int x0 = blockIdx.y * kVtColumns; x0 < p.width; x0 += gridDim.y * kVtColumns) {
    if (tid < kVtColumns) src[tid] = vt_source(p, min(x0 + tid, p.width - 1));
    __syncthreads();
    constexpr int kChunks = D_V / 16;
#pragma unroll
    for (int i = tid; i < kVtColumns * kChunks; i += kVtThreads) {
      const int r = i / kChunks, c = i % kChunks;
      const u8* row = p.v + (i64)src[r] * p.v_row_stride + (i64)head * p.v_head_stride + c * 16;
      *reinterpret_cast<uint4*>(tile + r * D_V + ((c ^ (r / 16 % 8)) * 16)) = *reinterpret_cast<const uint4*>(row);
    }
    __syncthreads();
    constexpr int kGroups = kVtColumns / 16;  // 16-column groups per d row
#pragma unroll
    for (int i = tid; i < D_V * kGroups; i += kVtThreads) {
      const int d = i / kGroups, q = i % kGroups;
      const int x = x0 + 16 * q;
      if (x >= p.width) continue;  // width is a multiple of 16
      const u8* t = tile + 16 * q * D_V + (((d / 16) ^ q) * 16) + d % 16;
      u32 w[4];
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const u8* tj = t + 4 * j * D_V;
        w[j] = u32(tj[0]) | (u32(tj[D_V]) << 8) | (u32(tj[2 * D_V]) << 16) | (u32(tj[3 * D_V]) << 24);
      }
      *reinterpret_cast<uint4*>(p.vt + ((i64)head * D_V + d) * p.width + x) = make_uint4(w[0], w[1], w[2], w[3]);
    }
    __syncthreads();  // the tile and src are refilled for the next column block
  }
}

}  // namespace mlagen::sm90
