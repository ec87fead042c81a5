// The bf16 KV operand of the sparse prefill kernel (mlagen/operands.py "bf16"): rows of d_qk bf16
// values, gathered straight into the shared-memory tiles with 16-byte cp.async (rows zero-filled
// and never read when invalid). The kernel calls KvBf16<Cfg>::produce from its producer warpgroup
// and sizes the ready barriers with kReadyArrivals. The rows come from one pool or two
// (mlagen/cuda/sparse_pools.cuh: a pair that straddles the seam is gathered from both).
#pragma once
#include "mlagen/cuda/sparse_pools.cuh"
#include "mlagen/sm90/sparse_gather.cuh"
#include "mlagen/sm90/sparse_prefill.cuh"

namespace mlagen::sm90::sparse {

template <class Cfg>
struct KvBf16 {
  // Arrivals that complete ready(buffer, half): the 128 copying threads (cp.async noinc), and in
  // the second half also the 16 threads that publish the validity flags.
  static constexpr int kReadyFirst = 128;
  static constexpr int kReadySecond = 128 + 16;

  // One pair of blocks, its rows read through the code of its span (kSpan: sparse_pools.cuh).
  template <int kSpan, class Params>
  static __device__ __forceinline__ void gather_pair(const Params& p, u32 smem, const Barriers<Cfg>& bar,
                                                   const mlagen::sparse_pools::KeyList& keys, int pair, int g, int c,
                                                   u64 policy, int done) {
    namespace pools = mlagen::sparse_pools;
    using L = Layout<Cfg>;
    const u16* kv = p.kv + c * 8;
    const u32 phase = ((done + pair) & 1) ^ 1;  // done: the pairs of the CTA's earlier items
    // Where each of this pair's rows starts (element offset from p.kv, either pool; pool 2's may
    // be negative), kNoRow where the entry is invalid; read early so the index latency hides
    // behind the waits below. A flat table (PAGED false) folds the pool's base and stride in
    // here, as 64-bit offsets (row * stride overflows 32 bits past 2**31 elements), keeping the
    // copy loop free of branches; a paged pool keeps 32-bit key rows (the 72-register producer
    // cannot hold eight 64-bit offsets beside its division temporaries) and splits them into
    // page and offset at copy time.
    using Slot = typename Cfg::GatherSlot;
    constexpr Slot kNoRow = Cfg::kPaged ? (Slot)-1 : (Slot)(-0x7fffffffffffffffLL - 1);
    Slot rows[2][4];
#pragma unroll
    for (int b = 0; b < 2; ++b) {
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        const int row = pools::key_row_in<kSpan>(p, keys, (2 * pair + b) * kBlockK + g + 16 * r);
        if constexpr (Cfg::kPaged) rows[b][r] = row;
        else rows[b][r] = row >= 0 ? pools::key_offset_in<kSpan, false>(p, row) : kNoRow;
      }
    }
    auto copy = [&](int b, int half) {
      const u32 buf = smem + (b == 0 ? L::kK0 : L::kK1);
      const int first = half == 0 ? 0 : kHalfTiles;
      const int last = half == 0 ? kHalfTiles : L::kDTiles;
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        const bool ok = rows[b][r] != kNoRow;
        i64 off;
        // (An invalid row reads from the span's first row, never from memory: src-size 0.)
        if constexpr (Cfg::kPaged)
          off = pools::key_offset_in<kSpan, true>(p, ok ? (int)rows[b][r] : kSpan == pools::kSecondOnly ? p.num_kv : 0);
        else off = ok ? rows[b][r] : 0;
        const u16* src = kv + off;
#pragma unroll
        for (int tile = first; tile < last; ++tile)
          cp_async_16<Cfg::kEvictLast>(buf + tile * kTileBytes + swizzled(g + 16 * r, c), src + tile * kTileCols, ok,
                                       policy);
      }
    };
    auto publish_valid = [&](int b) {
      // Plain stores then a plain (release) arrival on the same barrier as the rows.
      if (c == 0) {
#pragma unroll
        for (int r = 0; r < 4; ++r)
          asm volatile("st.shared.u8 [%0], %1;\n" ::"r"(smem + L::kValid + b * 64 + g + 16 * r),
                       "h"((u16)(rows[b][r] != kNoRow))
                       : "memory");
        mbar_arrive(bar.ready(b, 1));
      }
    };
    // The order follows when each part is released: buffer 0's first half by consumer 0's own
    // P V, buffer 1's second half by consumer 1's own P V, the others after the exchanged P V.
    mbar_wait(bar.free(0, 0), phase);
    copy(0, 0);
    cp_async_arrive_noinc(bar.ready(0, 0));
    mbar_wait(bar.free(1, 1), phase);
    copy(1, 1);
    cp_async_arrive_noinc(bar.ready(1, 1));
    publish_valid(1);
    mbar_wait(bar.free(0, 1), phase);
    copy(0, 1);
    cp_async_arrive_noinc(bar.ready(0, 1));
    publish_valid(0);
    mbar_wait(bar.free(1, 0), phase);
    copy(1, 0);
    cp_async_arrive_noinc(bar.ready(1, 0));
  }

  // Producer warpgroup: thread = (row group g of 16, chunk c of 8); it copies chunk c of every tile
  // of rows g, g + 16, g + 32, g + 48 of each block.
  // `done`: pairs of this CTA's earlier items (the persistent kernel); returns this item's pairs.
  template <class Params>
  static __device__ int produce(const Params& p, u32 smem, const Barriers<Cfg>& bar, int t, int head0, int done = 0) {
    const int tid = threadIdx.x % 128;
    const int g = tid / 8, c = tid % 8;
    const u64 policy = Cfg::kEvictLast ? l2_policy_evict_last() : 0;

    namespace pools = mlagen::sparse_pools;
    const pools::KeyList keys = pools::key_list(p, t);
    const int pairs = num_pairs(keys.len);
    for (int pair = 0; pair < pairs; ++pair) {
      const int start = 2 * pair * kBlockK;
      switch (pools::span_of(keys, start, start + 2 * kBlockK)) {
        case pools::kFirstOnly: gather_pair<pools::kFirstOnly>(p, smem, bar, keys, pair, g, c, policy, done); break;
        case pools::kSecondOnly: gather_pair<pools::kSecondOnly>(p, smem, bar, keys, pair, g, c, policy, done); break;
        default: gather_pair<pools::kBoth>(p, smem, bar, keys, pair, g, c, policy, done); break;
      }
    }
    return pairs;
  }
};

}  // namespace mlagen::sm90::sparse
