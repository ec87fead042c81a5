// The FP8 kernel's pre-pass: V^T from one-byte V [total_k, heads, D_V] (mla_prefill.cuh, FP8).
//
// V^T is [heads, D_V, width] bytes. Sequence b's keys start at column round_up(k_start, 16) +
// 16 * b (vt_column in mla_prefill.cuh), so every key tile of the main kernel starts on a 16-key
// group; inside a group, column p holds key perm16(p), the order in which a thread's S registers
// become its e4m3 A fragment of P V. Columns that hold no key of their sequence repeat the
// sequence's first key (finite values; the main kernel's P is 0 there). tma.py: PERM16 and
// vt_sources are the same layout in torch (the CPU tests compare them).
//
// A block of 256 threads makes 64 columns of one head: it loads the 64 source rows (D_V bytes
// each, 16-byte loads) into shared memory, then each thread gathers 32 bytes of one d row and
// writes them as one 32-byte sector.
#pragma once
#include "mlagen/common/types.cuh"

namespace mlagen::sm90 {

constexpr int kVtColumns = 64;   // V^T columns per block
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
  static_assert(D_V % 16 == 0 && D_V * 2 == kVtThreads, "one thread per (d row, 32-column half)");
  constexpr int kPitch = D_V + 16;  // bytes per staged row
  __shared__ __align__(16) u8 tile[kVtColumns * kPitch];
  __shared__ int src[kVtColumns];
  const int head = blockIdx.y, x0 = blockIdx.x * kVtColumns, tid = threadIdx.x;
  if (tid < kVtColumns) src[tid] = vt_source(p, min(x0 + tid, p.width - 1));
  __syncthreads();
  constexpr int kChunks = D_V / 16;
#pragma unroll
  for (int i = tid; i < kVtColumns * kChunks; i += kVtThreads) {
    const int c = i / kChunks, ch = i % kChunks;
    const u8* row = p.v + (i64)src[c] * p.v_row_stride + (i64)head * p.v_head_stride + ch * 16;
    *reinterpret_cast<uint4*>(tile + c * kPitch + ch * 16) = *reinterpret_cast<const uint4*>(row);
  }
  __syncthreads();
  // Lanes take consecutive d (distinct words of one staged row: no bank conflict).
  const int d = tid % D_V, half = tid / D_V;
  const int x = x0 + 32 * half;
  if (x >= p.width) return;  // width is a multiple of 16; the last block may hold 16 or 48 columns
  u32 w[8];
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    const u8* t = tile + (32 * half + 4 * j) * kPitch + d;
    w[j] = u32(t[0]) | (u32(t[kPitch]) << 8) | (u32(t[2 * kPitch]) << 16) | (u32(t[3 * kPitch]) << 24);
  }
  u8* dst = p.vt + ((i64)head * D_V + d) * p.width + x;
  *reinterpret_cast<uint4*>(dst) = make_uint4(w[0], w[1], w[2], w[3]);
  if (x + 16 < p.width) *reinterpret_cast<uint4*>(dst + 16) = make_uint4(w[4], w[5], w[6], w[7]);
}

}  // namespace mlagen::sm90
