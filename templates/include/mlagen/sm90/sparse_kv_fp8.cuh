// The FP8 KV operand of the sparse prefill kernel, "bf16" compute mode (mlagen/operands.py:
// fp8_v32 = DeepSeek-V3.2's 656-byte rows, fp8_b64 / fp8_b32 / fp8_b0, fp8_v4 = DeepSeek-V4's).
// A row is Cfg::kKvValues e4m3 values, then one fp32 scale per Cfg::kKvScaleBlock values (none
// when 0), then 64 bf16 rope values, Cfg::kKvRowBytes in all. With Cfg::kKvPageScales (fp8_v4:
// 448 values and the rope, d_qk 512) the scales are UE8M0 bytes kept after the page's rows:
// row r's at page + page_size * kKvRowBytes + (r % page_size) * kKvPageScales.
//
// The producer warpgroup prefetches each step's rows into L1 one step ahead (no registers held),
// then, once the buffer is free, loads them to registers a row at a time (16-byte loads),
// dequantizes them (the fp32 product of the value and its block's scale, rounded to bf16: round
// to nearest even) and stores them into the same 128-byte-swizzled bf16 tiles the bf16 operand
// fills; the rope values are already bf16 and are copied to their tile by cp.async. So the
// consumers, and the result, are the bf16 kernel's on the dequantized rows. Invalid rows are
// written as zeros and never read.
//
// Thread (row group g of 16, chunk c of 8) handles rows g + 16 r of each block. In half h
// (columns 256 h ... 256 h + 255) it loads, per row, the 16 values at bytes 256 h + 128 k + 16 c
// (k = 0, 1): bf16 tile 4 h + 2 k + c / 4, 16-byte chunks 2 (c % 4) and 2 (c % 4) + 1 there.
// Loads at or past kKvValues bytes are skipped: with 448 values that is tile 7, the rope's.
#pragma once
#include "mlagen/sm90/e4m3.cuh"
#include "mlagen/sm90/sparse_gather.cuh"
#include "mlagen/sm90/sparse_prefill.cuh"

namespace mlagen::sm90::sparse {

// 16 bytes from global memory through the non-coherent path (L1-allocating: the step's
// prefetch put them there).
__device__ __forceinline__ uint4 ld_nc_16(const u8* src) {
  uint4 v;
  asm volatile("ld.global.nc.v4.u32 {%0, %1, %2, %3}, [%4];\n" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(src));
  return v;
}

__device__ __forceinline__ void prefetch_l1(const u8* src) { asm volatile("prefetch.global.L1 [%0];\n" ::"l"(src)); }

// One fp32 scale. Volatile like ld_nc_16 so that the compiler keeps it in its step (hoisted
// across the steps' barrier waits, every scale of a block pair would be live at once).
__device__ __forceinline__ float ld_scale(const u8* src) {
  float s;
  asm volatile("ld.global.nc.f32 %0, [%1];\n" : "=f"(s) : "l"(src));
  return s;
}

// One UE8M0 scale (float8_e8m0fnu): byte e is 2^(e - 127), 0 the fp32 subnormal 2^-127, 255 NaN.
__device__ __forceinline__ float ld_scale_ue8m0(const u8* src) {
  u32 e;
  asm volatile("ld.global.nc.u8 %0, [%1];\n" : "=r"(e) : "l"(src));
  return __uint_as_float(e == 0u ? 0x00400000u : e == 255u ? 0x7fc00000u : e << 23);
}

template <class Cfg>
struct KvFp8 {
  // ready(buffer, 0): the 128 threads after their stores and a proxy fence; ready(buffer, 1): the
  // same + the 16 threads publishing validity flags.
  static constexpr int kReadyFirst = 128;
  static constexpr int kReadySecond = 128 + 16;

  static_assert((Cfg::kDQk == 576 && Cfg::kKvValues == 512) || (Cfg::kDQk == 512 && Cfg::kKvValues == 448),
                "512 e4m3 values + 64 bf16 rope values per row (d_qk 576), or 448 + 64 (d_qk 512)");
  static_assert(Cfg::kKvScaleBlock == 0 || (Cfg::kKvScaleBlock % 16 == 0 && Cfg::kKvValues % Cfg::kKvScaleBlock == 0),
                "each 16-value load shares one scale");
  static_assert(Cfg::kKvRowBytes % 16 == 0 && Cfg::kKvRopeOffset % 16 == 0 && Cfg::kKvScaleOffset % 4 == 0,
                "16-byte loads of values and rope, 4-byte scales");
  static_assert(Cfg::kKvPageScales == 0 || (Cfg::kPaged && Cfg::kKvScaleUe8m0 && Cfg::kKvScaleBlock > 0),
                "UE8M0 scales after each page's rows: their address needs the page size (a paged variant)");
  static_assert(Cfg::kKvPageScales > 0 || !Cfg::kKvScaleUe8m0, "in-row scales are fp32");
  // The rope's bf16 tile: right after the values' tiles (8 with 512 values, 7 with 448).
  static constexpr int kRopeTile = Cfg::kKvValues / 64;
  static_assert(Cfg::kKvValues % 64 == 0 && kRopeTile + 1 == Cfg::kDQk / 64, "the rope fills the last tile");

  // Byte offset of this thread's 16 values (k = 0, 1) in half h of a row.
  static __device__ __forceinline__ int value_byte(int h, int k, int c) { return 256 * h + 128 * k + 16 * c; }

  template <class Params>
  static __device__ void produce(const Params& p, u32 smem, const Barriers<Cfg>& bar, int t, int head0) {
    using L = Layout<Cfg>;
    const int tid = threadIdx.x % 128;
    const int g = tid / 8, c = tid % 8;
    // Threads c and c + 4 write the same chunk positions of tiles 8 KB apart (same banks): the
    // upper four store their odd chunk first, so each store instruction covers all 32 banks.
    const bool odd_first = c >= 4;
    // Row g + 16 r has the swizzle phase of row g, so every store address is one of three
    // per-thread slots plus a constant (buffer, tile, r): spelled out, the compiler keeps three
    // registers instead of hoisting dozens of addresses out of the loop.
    const u32 slot_first = swizzled(g, 2 * (c % 4) + odd_first);
    const u32 slot_second = swizzled(g, 2 * (c % 4) + !odd_first);
    const u32 slot_rope = swizzled(g, c);
    // (Cfg::kEvictLast is not used: the rows come through L1 prefetches, which take no L2 policy.)

    const int len = valid_length(p, t);
    const int pairs = num_pairs(len);
    const int* idx_row = p.indices + (i64)t * p.idx_row_stride;
    // Page-stored scales: where a page's scale rows start (after its page_size rows).
    const int scale_rows = Cfg::kKvPageScales > 0 ? p.page_size * Cfg::kKvRowBytes : 0;
    for (int pair = 0; pair < pairs; ++pair) {
      const u32 phase = (pair & 1) ^ 1;
      // 32-bit row ids (-1: invalid), read early so the index latency hides behind the waits;
      // each step forms its rows' byte offsets anew (64-bit offsets kept across the steps do
      // not fit the producer's registers beside the loaded values).
      int rows0[4], rows1[4];
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        const int pos = 2 * pair * kBlockK + g + 16 * r;
        int row0 = -1, row1 = -1;
        if (pos < len) row0 = __ldg(idx_row + pos);
        if (pos + kBlockK < len) row1 = __ldg(idx_row + pos + kBlockK);
        rows0[r] = row0 >= 0 && row0 < p.num_kv ? row0 : -1;
        rows1[r] = row1 >= 0 && row1 < p.num_kv ? row1 : -1;
      }
      // The step's buffer is a run-time value (the step loop is not unrolled): select, not index.
      auto row_of = [&](int b, int r) { return b ? rows1[r] : rows0[r]; };
      // A row's start, as an opaque pointer: each load and copy then addresses it with an
      // immediate offset instead of forming its own 64-bit address.
      auto row_ptr = [&](int row) -> const u8* {
        row = max(row, 0);
        i64 off;
        if constexpr (Cfg::kPaged)
          off = (i64)(row / p.page_size) * p.kv_page_stride + (i64)(row % p.page_size) * p.kv_row_stride;
        else
          off = (i64)row * p.kv_row_stride;
        const u8* ptr = p.kv + off;
        asm volatile("mov.b64 %0, %0;\n" : "+l"(ptr));
        return ptr;
      };
      // Where a row's scales start in its page's scale rows (Cfg::kKvPageScales only).
      auto page_scales_ptr = [&](int row) -> const u8* {
        row = max(row, 0);
        const u8* ptr = p.kv + (i64)(row / p.page_size) * p.kv_page_stride + scale_rows +
                        (row % p.page_size) * Cfg::kKvPageScales;
        asm volatile("mov.b64 %0, %0;\n" : "+l"(ptr));
        return ptr;
      };
      // Pull a step's values and scales into L1 (no registers held): the loads after the
      // buffer wait then mostly hit L1, so the producer keeps one row in registers at a time.
      auto prefetch = [&](int b, int h) {
        // Branch-free: an invalid row prefetches row 0 (in bounds, harmless).
#pragma unroll
        for (int r = 0; r < 4; ++r) {
          const u8* src = row_ptr(row_of(b, r));
          prefetch_l1(src + 256 * h);
          prefetch_l1(src + 256 * h + 128);
          if constexpr (Cfg::kKvPageScales > 0) prefetch_l1(page_scales_ptr(row_of(b, r)));
          else if constexpr (Cfg::kKvScaleBlock > 0) prefetch_l1(src + Cfg::kKvScaleOffset);
        }
      };
      auto step = [&](int b, int h) {
        const u32 buf = smem + (b == 0 ? L::kK0 : L::kK1);
        mbar_wait(bar.free(b, h), phase);
        if (h == 1) {
          // The rope tile, bf16 already: 16-byte cp.async per thread and row (zero-filled if
          // invalid), in flight while the values convert; each thread waits for its own copies
          // (cp.async.wait_all) before the step's proxy fence and arrival. Not through registers:
          // that cost 4-8% (the producer is latency-bound; notes-sparse.md). Not with
          // cp.async.mbarrier.arrive.noinc: inside this rolled loop that stopped the kernel on an
          // illegal instruction on the H100.
#pragma unroll
          for (int r = 0; r < 4; ++r)
            cp_async_16<false>(buf + kRopeTile * kTileBytes + 16 * 128 * r + slot_rope,
                               row_ptr(row_of(b, r)) + 16 * c + Cfg::kKvRopeOffset, row_of(b, r) >= 0, 0);
        }
#pragma unroll
        for (int r = 0; r < 4; ++r) {
          const bool ok = row_of(b, r) >= 0;
          const u8* src = row_ptr(row_of(b, r)) + 16 * c;
          const u8* scales = src - 16 * c + Cfg::kKvScaleOffset;   // in the row
          if constexpr (Cfg::kKvPageScales > 0) scales = page_scales_ptr(row_of(b, r));
#pragma unroll
          for (int k = 0; k < 2; ++k) {
            if (Cfg::kKvValues < 512 && value_byte(h, k, c) >= Cfg::kKvValues) continue;   // the rope's tile
            uint4 w = make_uint4(0, 0, 0, 0);
            float sc = 1.f;
            if (ok) {
              w = ld_nc_16(src + 256 * h + 128 * k);
              if constexpr (Cfg::kKvPageScales > 0)
                sc = ld_scale_ue8m0(scales + value_byte(h, k, c) / Cfg::kKvScaleBlock);
              else if constexpr (Cfg::kKvScaleBlock > 0)
                sc = ld_scale(scales + 4 * (value_byte(h, k, c) / Cfg::kKvScaleBlock));
            }
            const u32 tile = buf + (4 * h + 2 * k + c / 4) * kTileBytes + 16 * 128 * r;
            // Values 0-7 of the load fill chunk 2 (c % 4), values 8-15 the next one.
            const u32 a0 = odd_first ? w.z : w.x, a1 = odd_first ? w.w : w.y;
            const u32 b0 = odd_first ? w.x : w.z, b1 = odd_first ? w.y : w.w;
            st_shared_16(tile + slot_first, dequant_e4m3x4(a0, sc), dequant_e4m3x4(a1, sc));
            st_shared_16(tile + slot_second, dequant_e4m3x4(b0, sc), dequant_e4m3x4(b1, sc));
          }
        }
        if (h == 1) asm volatile("cp.async.wait_all;\n" ::: "memory");   // this thread's rope copies
        // The tiles were written by the generic proxy and are read by wgmma (the async proxy).
        fence_async_shared();
        if (h == 1 && c == 0) {
#pragma unroll
          for (int r = 0; r < 4; ++r)
            asm volatile("st.shared.u8 [%0], %1;\n" ::"r"(smem + L::kValid + b * 64 + g + 16 * r),
                         "h"((u16)(row_of(b, r) >= 0))
                         : "memory");
          mbar_arrive(bar.ready(b, 1));
        }
        mbar_arrive(bar.ready(b, h));
      };
      // Steps in the bf16 operand's order (when the consumers release each part): (buffer,
      // half) = (0, 0), (1, 1), (0, 1), (1, 0); each step's data is prefetched while the step
      // before it runs. The loop stays rolled so that the compiler cannot hoist later steps'
      // address arithmetic into one long-lived register set.
      prefetch(0, 0);
#pragma unroll 1
      for (int st = 0; st < 4; ++st) {
        if (st < 3) prefetch((st + 1) & 1, ((st + 1) ^ ((st + 1) >> 1)) & 1);
        step(st & 1, (st ^ (st >> 1)) & 1);
      }
    }
  }
};

}  // namespace mlagen::sm90::sparse
