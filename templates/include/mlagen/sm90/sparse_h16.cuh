// Sparse MLA prefill for few heads on Hopper (H <= 16: DeepSeek-V3.2 at TP8), without padding the
// heads to wgmma's 64 rows.
//
// At 16 heads a gathered row carries a quarter of the work it carries at 64, so the kernel is bound
// by moving rows (L2 -> shared memory -> registers), not by the tensor cores: it gathers with one
// 1-D bulk copy per row, keeps several slots of rows in flight, and swaps the operands so that the
// keys, not the heads, fill the 64 rows of each wgmma (the padded kernels do four times the MMA
// work and read Q as the large operand).
//
// Persistent CTAs take the work items (query token, group of 16 heads) in turn. Producer warps
// (4 ...) gather the selected KV rows into a ring of 32-row slots, one cp.async.bulk per row, the
// warps taking slots in turn; the first also copies each item's Q (16 rows, 128-byte swizzled,
// cp.async) into one of two buffers. Rows are
// padded by 16 bytes so that ldmatrix reads of eight rows hit eight bank groups. Invalid rows
// (index < 0 or >= N, positions past topk_length) are never read: the producer zero-fills them
// (so stale rows cannot turn masked zeros into NaN) and clears their bit in the slot's mask.
// Warps 0-3 (one warpgroup) compute each 64-key block (two slots):
//   S^T [64 keys x 16 heads] = K Q^T, wgmma m64n16k16 with K from registers (ldmatrix of the
//     gathered rows; warp w holds keys 16w .. 16w + 15) and Q from shared memory;
//   the block's max per head meets across the four warps in shared memory (exact running max);
//   P^T (bf16, [16 heads x 64 keys], 128-byte swizzled) goes to shared memory as the B operand of
//   O^T [512 dims x 16 heads] += V^T P^T, eight m64n16k16 accumulators with V^T from registers
//     (ldmatrix.trans of the same rows; V is the first 512 values of each row).
// Row sums stay per thread until the item ends. The output is written straight from the
// accumulators; lse and max_logits follow MLA.md (natural log, sink only in the denominator).
//
// The plumbing (shared-memory base, mbarrier init, role dispatch with setmaxnreg, the CTA sync) is
// skeleton.cuh's; this header supplies the layout, the barrier table, the named barriers, the
// producers, the consumers and H16Kernel.
#pragma once
#include "mlagen/common/types.cuh"
#include "mlagen/cuda/sparse_pools.cuh"
#include "mlagen/sm80/mma.cuh"
#include "mlagen/sm90/barrier.cuh"
#include "mlagen/sm90/e4m3.cuh"
#include "mlagen/sm90/skeleton.cuh"
#include "mlagen/sm90/sparse_gather.cuh"
#include "mlagen/sm90/wgmma.cuh"

namespace mlagen::sm90::sparse_h16 {

using sm80::ldmatrix_x4;
using sm80::ldmatrix_x4_trans;

constexpr int kHeads = 16;     // heads per work item (wgmma N)
constexpr int kSlotRows = 32;  // gathered rows per slot (one per producer lane)
constexpr int kBlockK = 64;    // keys per block (wgmma M): two slots
constexpr int kConsumerThreads = 128;

// Named barriers (skeleton.cuh: id 0 is the skeleton's).
enum NamedBarrier : int {
  kMaxReady = skeleton::kFirstNamedBarrier,  // every warp (of the first consumer warpgroup) published its block max per head
  kPReady = 2,    // P^T (and, with two consumer warpgroups, the rescale factors) in shared memory
  kSumReady = 3,  // row sums published (epilogue)
  kExchange = 4,  // two consumer warpgroups: the second's partial S^T is in shared memory
  kEpilogue = 5,  // two consumer warpgroups: the output factors are in shared memory
  kNamedEnd,
};
static_assert(skeleton::named_barriers_fit(kNamedEnd), "sm90 has 16 named barriers");

template <class Cfg>
struct Layout {
  static constexpr int kDValues = Cfg::kDQk;
  // TMA rows are 128-byte swizzled and not padded. Bulk-copied rows are padded by Cfg::kRowPad
  // bytes: 16 puts the 8 rows of an ldmatrix in 8 bank groups but leaves the copies' destinations
  // 16-byte aligned (twice the L2 requests); 32 keeps 32-byte alignment at a 2-way conflict.
  // TMA rows sit 9 x 128 bytes apart whatever d_qk (a 512-value row is followed by 128 unused
  // bytes): consecutive rows then start one swizzle phase apart; 1024 bytes apart (d_qk 512
  // unpadded) every row would have the same phase and ldmatrix would conflict 8-way.
  static constexpr int kRowBytes = Cfg::kTmaGather ? 9 * 128 : Cfg::kDQk * 2 + Cfg::kRowPad;
  static constexpr int kQBytes = kHeads * Cfg::kDQk * 2;  // Cfg::kDQk / 64 tiles of 16 rows x 128 B
  static constexpr int kSlotBytes = kSlotRows * kRowBytes;
  static constexpr int kQ = 0;                            // two Q buffers (items alternate)
  static constexpr int kPT = kQ + 2 * kQBytes;            // P^T: 16 x 64 bf16, one swizzled tile
  static constexpr int kRing = kPT + kHeads * kBlockK * 2;
  static constexpr int kRed = kRing + Cfg::kSlots * kSlotBytes;  // [4 warps][16 heads] block maxima
  static constexpr int kSum = kRed + 4 * kHeads * 4;             // [4 warps][16 heads] row sums
  static constexpr int kXs = kSum + 4 * kHeads * 4;              // the second warpgroup's partial S^T
  static constexpr int kCorr = kXs + (Cfg::kConsumers == 2 ? kConsumerThreads * 8 * 4 : 0);  // 16 factors
  static constexpr int kInv = kCorr + kHeads * 4;                 // 16 output factors
  static constexpr int kFlags = kInv + kHeads * 4;               // one valid-row mask per slot
  // A quantized cache: each producer warp's copy of every slot's valid-row mask.
  static constexpr int kWarpFlags = kFlags + (Cfg::kSlots * 4 + 63) / 64 * 64;
  static constexpr int kBars = kWarpFlags + (Cfg::kKvQuantized ? (Cfg::kSlots * Cfg::kProducers * 4 + 63) / 64 * 64 : 0);
  // + a quantized cache's landed barriers: one per slot and producer warp.
  static constexpr int kBarBytes = (2 * Cfg::kSlots + 4 + (Cfg::kKvQuantized ? Cfg::kProducers * Cfg::kSlots : 0)) * 8;
  // + 1 KB: the base is aligned up to the 128-byte swizzle atom (1 KB) at run time.
  static constexpr int kSmemBytes = kBars + kBarBytes + 1024;
  static_assert(kQBytes % 1024 == 0 && kPT % 1024 == 0, "swizzled operands start on a 1 KB atom");
  static_assert(!Cfg::kTmaGather || (Cfg::kRowPad == 0 && kRing % 1024 == 0), "TMA rows: 128-byte aligned, unpadded");
  static_assert(!Cfg::kTmaGather || (kRowBytes / 128) % 2 == 1,
                "TMA rows an odd number of 128-byte blocks apart: consecutive rows in distinct swizzle phases");
};

template <class Cfg>
struct QuantLanes;

// The mbarriers (skeleton.cuh: Mbarriers): full and empty per ring slot, q_full and q_empty per Q
// buffer and, with a quantized cache, landed per slot and producer warp; initialised in that order.
template <class Cfg>
struct BarrierTable {
  enum class Id { kFull, kEmpty, kQFull, kQEmpty, kLanded, kCount };
  __host__ __device__ static constexpr skeleton::Group group(Id g) {
    if (g == Id::kFull || g == Id::kEmpty) return {Cfg::kSlots, 0};
    if (g == Id::kQFull || g == Id::kQEmpty) return {2, 1};
    return {Cfg::kKvQuantized ? Cfg::kProducers * Cfg::kSlots : 0, 2};
  }
  __host__ __device__ static constexpr int arrivals(Id g, int) {
    switch (g) {
      // Every producer lane arrives (with its row's bytes); a quantized cache: every producer
      // thread, after its dequantized rows are stored.
      case Id::kFull: return Cfg::kKvQuantized ? 32 * Cfg::kProducers : kSlotRows;
      case Id::kQFull: return 32;  // the producer lanes' cp.async copies
      case Id::kLanded: return QuantLanes<Cfg>::kRows;  // a producer warp's copying lanes
      default: return 4 * Cfg::kConsumers;  // every consumer warp releases
    }
  }
};

template <class Cfg>
struct Barriers : skeleton::Mbarriers<BarrierTable<Cfg>> {
  using Id = typename BarrierTable<Cfg>::Id;
  using skeleton::Mbarriers<BarrierTable<Cfg>>::Mbarriers;
  static constexpr int kLanded = skeleton::Mbarriers<BarrierTable<Cfg>>::first(static_cast<int>(Id::kLanded));
  __device__ __forceinline__ u32 full(int slot) const { return this->template at<Id::kFull>(slot); }
  __device__ __forceinline__ u32 empty(int slot) const { return this->template at<Id::kEmpty>(slot); }
  __device__ __forceinline__ u32 q_full(int b) const { return this->template at<Id::kQFull>(b); }
  __device__ __forceinline__ u32 q_empty(int b) const { return this->template at<Id::kQEmpty>(b); }
  // A quantized cache: producer warp w's raw rows of the slot have landed (bulk copies).
  __device__ __forceinline__ u32 landed(int slot, int w) const {
    return this->base + 8 * (kLanded + Cfg::kProducers * slot + w);
  }
};

// Pool 1's valid length (the FP8 producer reads one pool; the host passes no extra pool to it).
template <class Params>
__device__ __forceinline__ int valid_length(const Params& p, int t) {
  int len = p.topk;
  if (p.topk_length != nullptr) len = min(len, max(0, __ldg(p.topk_length + t)));
  return len;
}

__device__ __forceinline__ int num_blocks(int len) { return (len + kBlockK - 1) / kBlockK; }

// Byte offset of (row, 16-byte chunk) in a 128-byte-swizzled tile (the wgmma 128B pattern).
__device__ __forceinline__ u32 swizzled(int row, int chunk) { return row * 128 + ((chunk ^ (row % 8)) << 4); }

__device__ __forceinline__ void bulk_copy(u32 dst, const void* src, u32 bytes, u32 bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(dst),
               "l"(src), "r"(bytes), "r"(bar)
               : "memory");
}

__device__ __forceinline__ void bulk_copy_evict_last(u32 dst, const void* src, u32 bytes, u32 bar, u64 policy) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1], %2, [%3], %4;\n" ::"r"(
          dst),
      "l"(src), "r"(bytes), "r"(bar), "l"(policy)
      : "memory");
}

// The bf16 (round to nearest even) bits of x.
__device__ __forceinline__ u16 bf16_bits(float x) { return (u16)(pack_bf16x2(x, 0.f) & 0xffffu); }

// One gathered row by TMA: a 4-D box (64 values, d_qk / 64 chunks, 1 row, 1 page) of the KV tensor
// map, written with the 128-byte swizzle (16-byte pieces XORed by smem address bits 7-9).
template <bool kEvictLast>
__device__ __forceinline__ void tma_load_4d(u32 dst, const TensorMap* map, u32 bar, int c0, int c1, int c2, int c3,
                                            u64 policy) {
  if constexpr (kEvictLast) {
    asm volatile(
        "cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1, {%3, %4, %5, %6}], [%2], %7;\n" ::
            "r"(dst),
        "l"(reinterpret_cast<u64>(map)), "r"(bar), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "l"(policy)
        : "memory");
  } else {
    asm volatile(
        "cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4, %5, %6}], [%2];\n" ::
            "r"(dst),
        "l"(reinterpret_cast<u64>(map)), "r"(bar), "r"(c0), "r"(c1), "r"(c2), "r"(c3)
        : "memory");
  }
}

// Shared address of 16-byte chunk j of the gathered row at `row`: TMA rows are 128-byte swizzled
// by address (row starts are 128-byte aligned, so 8 consecutive rows have 8 different phases and
// ldmatrix reads of one column hit 8 bank groups); bulk-copied rows are linear and padded.
template <class Cfg>
__device__ __forceinline__ u32 chunk_addr(u32 row, int j) {
  if constexpr (Cfg::kTmaGather) return row + 128 * (j / 8) + 16 * ((j % 8) ^ (((row >> 7) + j / 8) & 7));
  return row + 16 * j;
}

__device__ __forceinline__ void st_shared_zero16(u32 addr) {
  asm volatile("st.shared.v4.u32 [%0], {%1, %1, %1, %1};\n" ::"r"(addr), "r"(0u) : "memory");
}

// Key row `row` (>= 0) of either pool (mlagen/cuda/sparse_pools.cuh).
template <class Cfg, class Params>
__device__ __forceinline__ const u16* kv_row(const Params& p, int row) {
  return p.kv + mlagen::sparse_pools::key_offset<Cfg::kPaged>(p, row);
}

// ------------------------------------------------------------------------------------------------
// Producer (one warp).

constexpr int kAhead = 4;  // slots whose indices the producer has in flight

// The index at `pos` of a token's list, or -1 past its valid length (not read).
__device__ __forceinline__ int load_index(const int* idx, int pos, int len) {
  return pos < len ? __ldg(idx + pos) : -1;
}

// The key row at `pos` of a token's list over both pools, or -1 (not read past its length); a
// token without a second pool's entries takes the one-pool read (a warp-uniform branch).
template <class Params>
__device__ __forceinline__ int load_key(const Params& p, const mlagen::sparse_pools::KeyList& keys, int pos) {
  namespace pools = mlagen::sparse_pools;
  if (keys.len == keys.len1) return pools::key_row_in<pools::kFirstOnly>(p, keys, pos);
  return pools::key_row(p, keys, pos);
}

// Fill ring slot number `filled` (over all items) with the 32 rows whose key rows (either pool,
// -1: invalid) the lanes hold.
template <class Cfg, class Params>
__device__ __forceinline__ void fill_slot(const Params& p, u32 smem, const Barriers<Cfg>& bar, u32 filled, int id,
                                          int lane, u64 policy) {
  using L = Layout<Cfg>;
  const bool ok = id >= 0;
  const int slot = filled % Cfg::kSlots;
  const u32 round = filled / Cfg::kSlots;
  if (round > 0) mbar_wait(bar.empty(slot), (round - 1) & 1);
  const u32 base = smem + L::kRing + slot * L::kSlotBytes;
  const u32 invalid = __ballot_sync(0xffffffffu, !ok);
  if (invalid != 0) {
    // Zero the invalid rows (all lanes, 16 bytes each), then order these ordinary writes before
    // later bulk copies (async proxy) into the same rows.
    for (u32 m = invalid; m != 0; m &= m - 1) {
      const u32 row = base + (__ffs(m) - 1) * L::kRowBytes;
      for (int c = lane; c < Cfg::kDQk / 8; c += 32) st_shared_zero16(row + 16 * c);
    }
    fence_async_shared();
  }
  if (lane == 0) asm volatile("st.shared.u32 [%0], %1;\n" ::"r"(smem + L::kFlags + 4 * slot), "r"(~invalid) : "memory");
  if (ok) {
    mbar_arrive_expect_tx(bar.full(slot), Cfg::kDQk * 2);
    const u32 dst = base + lane * L::kRowBytes;
    if constexpr (Cfg::kTmaGather) {
      // Each pool has its own tensor map (a flat pool's is one page of all its rows).
      const bool second = id >= p.num_kv;
      const int row = second ? id - p.num_kv : id;
      const int ps = second ? p.extra_page_size : p.page_size;
      const int page = Cfg::kPaged ? row / ps : 0;
      tma_load_4d<Cfg::kEvictLast>(dst, second ? &p.extra_kv_map : &p.kv_map, bar.full(slot), 0, 0,
                                   Cfg::kPaged ? row - page * ps : row, page, policy);
    } else if constexpr (Cfg::kEvictLast)
      bulk_copy_evict_last(dst, kv_row<Cfg>(p, id), Cfg::kDQk * 2, bar.full(slot), policy);
    else
      bulk_copy(dst, kv_row<Cfg>(p, id), Cfg::kDQk * 2, bar.full(slot));
  } else {
    mbar_arrive(bar.full(slot));
  }
}

// Item n's Q (token t, heads head0 ...) into buffer n % 2 by one warp: 16 rows x d_qk / 8 chunks,
// 128-byte swizzled tiles of 64 columns; heads past H are zeros.
template <class Cfg, class Params>
__device__ __forceinline__ void load_q(const Params& p, u32 smem, const Barriers<Cfg>& bar, int t, int head0, int n,
                                       int lane) {
  using L = Layout<Cfg>;
  const int qb = n & 1;
  if (n >= 2) mbar_wait(bar.q_empty(qb), ((n >> 1) - 1) & 1);
  const u32 q = smem + L::kQ + qb * L::kQBytes;
  constexpr int kChunks = Cfg::kDQk / 8;
#pragma unroll 4
  for (int i = lane; i < kHeads * kChunks; i += 32) {
    const int row = i / kChunks, c = i % kChunks;
    const bool ok = head0 + row < p.heads;
    const u16* src = p.q + (i64)t * p.q_row_stride + (i64)(ok ? head0 + row : 0) * p.q_head_stride + 8 * c;
    cp_async_16<false>(q + (c / 8) * (kHeads * 128) + swizzled(row, c % 8), src, ok, 0);
  }
  cp_async_arrive_noinc(bar.q_full(qb));
}

// Producer warp `pw` of Cfg::kProducers fills the ring slots whose number (over all items) is pw
// modulo the warp count. One warp issues its 32 bulk copies one after another (the copy takes
// uniform operands, so the lanes' rows are issued in a loop), so several warps on different
// schedulers keep more rows in flight.
template <class Cfg, class Params>
__device__ void produce(const Params& p, u32 smem, const Barriers<Cfg>& bar, int items, int groups, int pw) {
  using L = Layout<Cfg>;
  constexpr int kP = Cfg::kProducers;
  const int lane = threadIdx.x % 32;
  u64 policy = 0;
  if constexpr (Cfg::kEvictLast) policy = l2_policy_evict_last();
  u32 filled = 0;  // slots filled over all items (by every producer warp): ring position and phase
  for (int item = blockIdx.x, n = 0; item < items; item += gridDim.x, ++n) {
    const int t = item / groups, head0 = (item % groups) * kHeads;
    if (pw == 0) load_q<Cfg>(p, smem, bar, t, head0, n, lane);
    const mlagen::sparse_pools::KeyList keys = mlagen::sparse_pools::key_list(p, t);
    const int slots = 2 * num_blocks(keys.len);
    const int first = (int)((pw - filled % kP + kP) % kP);  // this warp's first slot of the item
    // Each lane's index for this warp's next kAhead slots is loaded ahead: an index load is a
    // dependent global access, and waiting for it slot by slot would bound the gather.
    int ahead[kAhead];
#pragma unroll
    for (int j = 0; j < kAhead; ++j) ahead[j] = load_key(p, keys, kSlotRows * (first + kP * j) + lane);
    for (int s0 = first; s0 < slots; s0 += kP * kAhead) {
#pragma unroll
      for (int j = 0; j < kAhead; ++j) {
        const int s = s0 + kP * j;
        if (s >= slots) break;
        const int id = ahead[j];
        ahead[j] = load_key(p, keys, kSlotRows * (s + kP * kAhead) + lane);
        fill_slot<Cfg>(p, smem, bar, filled + s, id, lane, policy);
      }
    }
    filled += slots;
  }
}


// ------------------------------------------------------------------------------------------------
// Producer of a quantized cache (Cfg::kKvQuantized; four warps).
//
// The raw rows are bulk-copied into the ring slot that will hold them dequantized (a 656-byte raw
// row fits in a 1152-byte ring row), kQuantAhead slots ahead, so every free ring slot is staging
// and the ring's depth is the gather's as with a bf16 cache. Warp w owns rows 8w .. 8w + 7 of
// every slot: its lanes 0-7 copy them (raw row r at 16 (r % 8) bytes into its ring row, so a
// quarter-warp reading one 16-byte column of eight rows hits eight bank groups), then all its
// lanes read them into registers (lane l: row 8w + l % 8, 16-value chunks l / 8 + 4j, rope chunks
// l / 8 + 4j'), wait for each other, and write them back dequantized in the ring's TMA row layout,
// so the consumers read what they read from a bf16 cache. A value becomes the fp32 product of the
// e4m3 value and its block's scale, rounded to bf16, exactly as operands.dequantize(round_bf16=True)
// and the 64-head kernel compute it; the e4m3 bits are widened to fp32 by integer operations (the
// conversion pipe, a quarter of the others' rate, then only packs the bf16 pairs). The rope is
// copied; invalid rows are written as zeros.

template <class Cfg, class Params>
__device__ __forceinline__ const u8* kv_row_bytes(const Params& p, int row) {
  const u8* kv = reinterpret_cast<const u8*>(p.kv);
  if constexpr (Cfg::kPaged)
    return kv + (i64)(row / p.page_size) * p.kv_page_stride + (i64)(row % p.page_size) * p.kv_row_stride;
  return kv + (i64)row * p.kv_row_stride;
}

__device__ __forceinline__ uint4 ld_shared_16(u32 addr) {
  uint4 v;
  asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];\n" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(addr));
  return v;
}

// e4m3 byte i of w as an fp32 equal to its value times 2^-120 (exact, subnormals too): the sign to
// bit 31, exponent and mantissa to bits 26-20 (an fp32 of the same exponent field).
template <int I>
__device__ __forceinline__ float e4m3_times_2m120(u32 w) {
  const int top = static_cast<int>(w << (24 - 8 * I));  // byte i in bits 24-31
  return __int_as_float((top >> 4) & static_cast<int>(0x87f00000u));
}

// Four e4m3 values times `scale_2p60` (the scale times 2^60), as two bf16 pairs: each value is
// widened (times 2^-120), multiplied by 2^60 (exact) and by scale_2p60 (one rounding: the fp32
// product of value and scale), then rounded to bf16.
__device__ __forceinline__ uint2 dequant_e4m3x4_int(u32 w, float scale_2p60) {
  constexpr float k2p60 = 1152921504606846976.f;
  const float f0 = e4m3_times_2m120<0>(w) * k2p60 * scale_2p60, f1 = e4m3_times_2m120<1>(w) * k2p60 * scale_2p60;
  const float f2 = e4m3_times_2m120<2>(w) * k2p60 * scale_2p60, f3 = e4m3_times_2m120<3>(w) * k2p60 * scale_2p60;
  return make_uint2(pack_bf16x2(f0, f1), pack_bf16x2(f2, f3));
}

// Four e4m3 values times a power-of-two scale given as the bf16 pair (scale x 2^120, scale x 2^120):
// each pair of bytes becomes a bf16 pair equal to the values times 2^-120 by integer operations
// (sign, then exponent and mantissa into the low bits of the bf16 exponent and mantissa; exact,
// subnormals too), and one bf16 multiply makes it value x scale, exact (a 4-bit significand times a
// power of two): no fp32 and no conversion instruction. The caller checks that scale x 2^120 is a
// normal bf16 (scale a power of two in [2^-126, 2^7]; UE8M0 scales, what V3.2's quantizer writes).
__device__ __forceinline__ u32 widen_e4m3_pair(u32 t) {  // the two e4m3 bytes in bits 8-15 and 24-31
  return (t & 0x80008000u) | ((t & 0x7f007f00u) >> 4);
}

__device__ __forceinline__ uint2 dequant_e4m3x4_pow2(u32 w, u32 scale_bf16x2) {
  u32 lo, hi;
  asm("prmt.b32 %0, %1, 0, 0x1404;\n" : "=r"(lo) : "r"(w));  // bytes 0, 1 to bits 8-15, 24-31
  asm("prmt.b32 %0, %1, 0, 0x3424;\n" : "=r"(hi) : "r"(w));  // bytes 2, 3
  lo = widen_e4m3_pair(lo);
  hi = widen_e4m3_pair(hi);
  asm("mul.rn.bf16x2 %0, %1, %2;\n" : "=r"(lo) : "r"(lo), "r"(scale_bf16x2));
  asm("mul.rn.bf16x2 %0, %1, %2;\n" : "=r"(hi) : "r"(hi), "r"(scale_bf16x2));
  return make_uint2(lo, hi);
}

constexpr int kQuantAhead = 3;  // slots whose raw rows are copied before the current one is dequantized

// How the producer warps share a slot's 32 rows: Cfg::kProducers warps of kRows rows each; lane l
// holds row kRows w + l % kRows and kChunks of its 16-value chunks (chunk(l, j)), and kRopeChunks
// of its 8 rope chunks. In each quarter-warp the (row, chunk) pairs fall in eight bank groups
// (rows sit 16 (r % 8) bytes into their 1152-byte ring rows).
template <class Cfg>
struct QuantLanes {
  static constexpr int kRows = kSlotRows / Cfg::kProducers;  // 8 (four warps) or 4 (eight)
  static constexpr int kChunks = Cfg::kKvValues / 16 / (32 / kRows);
  static constexpr int kRopeChunks = 8 / (32 / kRows);
  static __device__ __forceinline__ int chunk(int lane, int j) {
    if constexpr (kRows == 8) return lane / 8 + 4 * j;
    return lane / 8 + 4 * ((lane / 4) % 2) + 8 * j;
  }
  static __device__ __forceinline__ int rope_chunk(int lane, int j) {
    if constexpr (kRows == 8) return lane / 8 + 4 * j;
    return lane / 4;
  }
};

// Warp w: copy its raw rows of slot k into the ring (lanes < kRows), after recording the slot's
// valid-row mask (`ids`: lane l holds the id of row l) for itself and, warp 0, for the consumers.
template <class Cfg, class Params>
__device__ __forceinline__ void copy_raw_rows(const Params& p, u32 smem, const Barriers<Cfg>& bar, u32 k, int ids,
                                              int w, int lane) {
  using L = Layout<Cfg>;
  using Q = QuantLanes<Cfg>;
  const int slot = k % Cfg::kSlots;
  if (k >= Cfg::kSlots) mbar_wait(bar.empty(slot), (k / Cfg::kSlots - 1) & 1);
  const u32 valid = __ballot_sync(0xffffffffu, ids >= 0 && ids < p.num_kv);
  const int id = __shfl_sync(0xffffffffu, ids, Q::kRows * w + lane % Q::kRows);
  if (lane == 0) {
    asm volatile("st.shared.u32 [%0], %1;\n" ::"r"(smem + L::kWarpFlags + 4 * (Cfg::kProducers * slot + w)), "r"(valid)
                 : "memory");
    if (w == 0) asm volatile("st.shared.u32 [%0], %1;\n" ::"r"(smem + L::kFlags + 4 * slot), "r"(valid) : "memory");
  }
  // This warp's ordinary writes of these rows (the slot's last round) before the async-proxy copies.
  fence_async_shared();
  if (lane < Q::kRows) {
    if ((valid >> (Q::kRows * w + lane)) & 1) {
      mbar_arrive_expect_tx(bar.landed(slot, w), Cfg::kKvRowBytes);
      const u32 dst = smem + L::kRing + slot * L::kSlotBytes + (Q::kRows * w + lane) * L::kRowBytes +
                      16 * ((Q::kRows * w + lane) % 8);
      bulk_copy(dst, kv_row_bytes<Cfg>(p, id), Cfg::kKvRowBytes, bar.landed(slot, w));
    } else {
      mbar_arrive(bar.landed(slot, w));
    }
  }
}

// Warp w (all lanes): dequantize its rows of slot k in place.
template <class Cfg>
__device__ __forceinline__ void dequantize_rows(u32 smem, const Barriers<Cfg>& bar, u32 k, int w, int lane) {
  using L = Layout<Cfg>;
  using Q = QuantLanes<Cfg>;
  constexpr float k2p60 = 1152921504606846976.f;
  const int slot = k % Cfg::kSlots;
  const int r = Q::kRows * w + lane % Q::kRows;
  mbar_wait(bar.landed(slot, w), (k / Cfg::kSlots) & 1);
  __syncwarp();
  u32 mask;
  asm volatile("ld.shared.u32 %0, [%1];\n" : "=r"(mask) : "r"(smem + L::kWarpFlags + 4 * (Cfg::kProducers * slot + w)));
  const u32 row = smem + L::kRing + slot * L::kSlotBytes + r * L::kRowBytes;
  const u32 raw = row + 16 * (r % 8);
  if ((mask >> r) & 1) {
    uint4 v[Q::kChunks], rope[Q::kRopeChunks];
    float scale[Q::kChunks];
#pragma unroll
    for (int j = 0; j < Q::kChunks; ++j) {
      const int c = Q::chunk(lane, j);  // 16-value chunk of the row
      v[j] = ld_shared_16(raw + 16 * c);
      scale[j] = 1.f;
      if constexpr (Cfg::kKvScaleBlock > 0)
        asm volatile("ld.shared.f32 %0, [%1];\n" : "=f"(scale[j]) : "r"(raw + Cfg::kKvScaleOffset + 4 * (16 * c / Cfg::kKvScaleBlock)));
    }
#pragma unroll
    for (int j = 0; j < Q::kRopeChunks; ++j) rope[j] = ld_shared_16(raw + Cfg::kKvRopeOffset + 16 * Q::rope_chunk(lane, j));
    __syncwarp();  // the row's lanes have read all of it: now it may be overwritten
#pragma unroll
    for (int j = 0; j < Q::kChunks; ++j) {
      const int c = Q::chunk(lane, j);
      const u32 sbits = __float_as_uint(scale[j]), e = (sbits >> 23) & 0xffu;
      if ((sbits & 0x7fffffu) == 0 && e - 1 < 134) {  // a power of two in [2^-126, 2^7]
        const u32 b = ((sbits >> 16) & 0x8000u) | ((e + 120) << 7), sb = b | (b << 16);
        st_shared_16(chunk_addr<Cfg>(row, 2 * c), dequant_e4m3x4_pow2(v[j].x, sb), dequant_e4m3x4_pow2(v[j].y, sb));
        st_shared_16(chunk_addr<Cfg>(row, 2 * c + 1), dequant_e4m3x4_pow2(v[j].z, sb), dequant_e4m3x4_pow2(v[j].w, sb));
      } else {
        const float s60 = scale[j] * k2p60;
        st_shared_16(chunk_addr<Cfg>(row, 2 * c), dequant_e4m3x4_int(v[j].x, s60), dequant_e4m3x4_int(v[j].y, s60));
        st_shared_16(chunk_addr<Cfg>(row, 2 * c + 1), dequant_e4m3x4_int(v[j].z, s60),
                     dequant_e4m3x4_int(v[j].w, s60));
      }
    }
#pragma unroll
    for (int j = 0; j < Q::kRopeChunks; ++j)
      asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};\n" ::"r"(chunk_addr<Cfg>(row, Cfg::kKvValues / 8 + Q::rope_chunk(lane, j))),
                   "r"(rope[j].x), "r"(rope[j].y), "r"(rope[j].z), "r"(rope[j].w)
                   : "memory");
  } else {
    __syncwarp();
#pragma unroll
    for (int j = 0; j < Q::kChunks; ++j) {
      const int c = Q::chunk(lane, j);
      st_shared_zero16(chunk_addr<Cfg>(row, 2 * c));
      st_shared_zero16(chunk_addr<Cfg>(row, 2 * c + 1));
    }
#pragma unroll
    for (int j = 0; j < Q::kRopeChunks; ++j) st_shared_zero16(chunk_addr<Cfg>(row, Cfg::kKvValues / 8 + Q::rope_chunk(lane, j)));
  }
  mbar_arrive(bar.full(slot));
}

template <class Cfg, class Params>
__device__ void produce_quantized(const Params& p, u32 smem, const Barriers<Cfg>& bar, int items, int groups, int w) {
  static_assert((Cfg::kProducers == 4 || Cfg::kProducers == 8) && Cfg::kKvValues == 512,
                "four or eight warps of 8 or 4 rows; 512 values of 32 chunks");
  static_assert(kQuantAhead <= Cfg::kSlots - 2, "the consumers hold two slots; the rest take copies ahead");
  static_assert(Layout<Cfg>::kRowBytes >= Cfg::kKvRowBytes + 16 * 7, "a raw row fits its ring row at any offset");
  const int lane = threadIdx.x % 32;
  u32 filled = 0;  // slots over all items: ring positions and phases
  for (int item = blockIdx.x, n = 0; item < items; item += gridDim.x, ++n) {
    const int t = item / groups, head0 = (item % groups) * kHeads;
    if (w == 0) load_q<Cfg>(p, smem, bar, t, head0, n, lane);
    const int len = valid_length(p, t);
    const int slots = 2 * num_blocks(len);
    const int* idx = p.indices + (i64)t * p.idx_row_stride;
    // Lane l: the id of row l of a slot (every warp reads the slot's 32: the mask is its ballot).
    auto ids_of = [&](int s) { return load_index(idx, kSlotRows * s + lane, len); };
    for (int a = 0; a < kQuantAhead && a < slots; ++a) copy_raw_rows<Cfg>(p, smem, bar, filled + a, ids_of(a), w, lane);
    int next = ids_of(kQuantAhead);
    for (int s = 0; s < slots; ++s) {
      dequantize_rows<Cfg>(smem, bar, filled + s, w, lane);
      if (s + kQuantAhead < slots) {
        copy_raw_rows<Cfg>(p, smem, bar, filled + s + kQuantAhead, next, w, lane);
        next = ids_of(s + kQuantAhead + 1);
      }
    }
    filled += slots;
  }
}

// ------------------------------------------------------------------------------------------------
// Consumers (one warpgroup).

__device__ __forceinline__ float max_or_zero(float m) { return m == neg_inf() ? 0.f : m; }

// The thread's four heads: 2q, 2q + 1, 8 + 2q, 9 + 2q (q = lane % 4); accumulator register e of an
// m64n16 fragment belongs to head slot 2 * (e / 4) + e % 2.
__device__ __forceinline__ int head_of_slot(int hs, int q) { return 8 * (hs / 2) + 2 * q + (hs % 2); }

struct MaxOp {
  __device__ __forceinline__ float operator()(float a, float b) const { return fmaxf(a, b); }
};
struct SumOp {
  __device__ __forceinline__ float operator()(float a, float b) const { return a + b; }
};

// Reduce the thread's four per-head values over the warpgroup: over the lanes that hold the same
// heads (shuffles), then over the four warps through `buf` ([4 warps][16 heads] floats) behind
// named barrier `barrier`; acc[hs] starts each head's cross-warp fold.
template <class Op>
__device__ __forceinline__ void reduce_heads(float (&v)[4], float (&acc)[4], u32 buf, int barrier, int warp, int lane,
                                             Op op) {
  const int q = lane % 4;
#pragma unroll
  for (int hs = 0; hs < 4; ++hs) {
    v[hs] = op(v[hs], __shfl_xor_sync(0xffffffffu, v[hs], 4));
    v[hs] = op(v[hs], __shfl_xor_sync(0xffffffffu, v[hs], 8));
    v[hs] = op(v[hs], __shfl_xor_sync(0xffffffffu, v[hs], 16));
  }
  if (lane < 4) {
#pragma unroll
    for (int hs = 0; hs < 4; ++hs)
      asm volatile("st.shared.f32 [%0], %1;\n" ::"r"(buf + 4 * (kHeads * warp + head_of_slot(hs, q))), "f"(v[hs])
                   : "memory");
  }
  named_sync(barrier, kConsumerThreads);
#pragma unroll
  for (int hs = 0; hs < 4; ++hs)
#pragma unroll
    for (int w = 0; w < 4; ++w) {
      float y;
      asm volatile("ld.shared.f32 %0, [%1];\n" : "=f"(y) : "r"(buf + 4 * (kHeads * w + head_of_slot(hs, q))));
      acc[hs] = op(acc[hs], y);
    }
}

// One consumer warpgroup (Cfg::kConsumers == 1) computes a block alone. With two, warpgroup CW takes
// k-steps [CW * K/2, (CW + 1) * K/2) of Q K^T and output dims [256 CW, 256 CW + 256) of P V: the
// second hands its partial S^T to the first through shared memory, the first runs the softmax and
// publishes P^T and the rescale factors, and both multiply P V; each warpgroup's chain is about half
// as long. The first warpgroup keeps the running max and sums and writes lse and max_logits.
template <class Cfg, int CW, class Params>
__device__ void consume(const Params& p, u32 smem, const Barriers<Cfg>& bar, int items, int groups) {
  using L = Layout<Cfg>;
  constexpr int kNC = Cfg::kConsumers;
  constexpr int kAll = kNC * kConsumerThreads;  // threads of every consumer warpgroup
  constexpr int kKSteps = Cfg::kDQk / 16;       // Q K^T k-steps (36 or 32)
  constexpr int kKPer = kKSteps / kNC;          // this warpgroup's k-steps
  constexpr int kK0 = CW * kKPer;
  constexpr int kG = Cfg::kQkGroup;             // k-steps per committed group
  static_assert(kKPer % kG == 0, "the Q K^T groups split the warpgroup's k-steps evenly");
  constexpr int kMT = 8 / kNC, kMT0 = CW * kMT;  // this warpgroup's 64-dim tiles of O^T
  constexpr bool kSoftmax = CW == 0;
  const int tid = threadIdx.x % kConsumerThreads, warp = tid / 32, lane = tid % 32, q = lane % 4;
  const float scale = p.scale_log2;
  u32 used = 0;  // slots consumed over all items
  for (int item = blockIdx.x, n = 0; item < items; item += gridDim.x, ++n) {
    const int t = item / groups, head0 = (item % groups) * kHeads;
    const int qb = n & 1;
    const u32 qtile = smem + L::kQ + qb * L::kQBytes;
    const int blocks = num_blocks(mlagen::sparse_pools::key_count(p, t));
    mbar_wait(bar.q_full(qb), (n >> 1) & 1);
    fence_async_shared();  // Q written by cp.async, read by wgmma

    float o[kMT][8];
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
      for (int e = 0; e < 8; ++e) o[mt][e] = 0.f;
    float m[4], l[4];
#pragma unroll
    for (int h = 0; h < 4; ++h) m[h] = neg_inf(), l[h] = 0.f;

    for (int b = 0; b < blocks; ++b, used += 2) {
      const int slot_a = used % Cfg::kSlots, slot_b = (used + 1) % Cfg::kSlots;
      mbar_wait(bar.full(slot_a), (used / Cfg::kSlots) & 1);
      mbar_wait(bar.full(slot_b), ((used + 1) / Cfg::kSlots) & 1);
      const u32 ring = smem + L::kRing;
      const u32 slot_base[2] = {ring + slot_a * L::kSlotBytes, ring + slot_b * L::kSlotBytes};

      // S^T = K Q^T: warp w's 16 keys are rows 16 (w % 2) .. of slot w / 2.
      float s[8];
      {
        constexpr int kC = Cfg::kQkChains;  // independent accumulators, summed after the last k-step
        float acc[kC][8];
        const u32 krow = slot_base[warp / 2] + (16 * (warp % 2) + lane % 8 + 8 * ((lane / 8) % 2)) * L::kRowBytes;
        const u64 qdesc = desc_k_major<128>(qtile);
        // Register sets of K fragments, loaded kS - 1 groups ahead of the group that uses them:
        // a group's wgmmas are issued, then (once the group before it is done) the set that group
        // used is refilled, so each ldmatrix has a whole group's MMAs to land.
        constexpr int kS = Cfg::kQkSets, kGroups = kKPer / kG;
        u32 a[kS][kG][4];
        auto load = [&](int g) {
#pragma unroll
          for (int i = 0; i < kG; ++i)
            ldmatrix_x4(a[g % kS][i], chunk_addr<Cfg>(krow, 2 * (kK0 + g * kG + i) + lane / 16));
        };
#pragma unroll
        for (int g = 0; g < kS - 1 && g < kGroups; ++g) load(g);
        // The previous block's P V drains while the first K fragments load.
        if constexpr (Cfg::kLateDrain) wgmma_wait<0>();
#pragma unroll
        for (int g = 0; g < kGroups; ++g) {
          wgmma_fence();
#pragma unroll
          for (int i = 0; i < kG; ++i) {
            const int j = g * kG + i, kk = kK0 + j;
            Wgmma<16>::rs<0>(acc[j % kC], a[g % kS][i], desc_advance(qdesc, (kk / 4) * (kHeads * 128) + (kk % 4) * 32),
                             j >= kC);
          }
          wgmma_commit();
          if (g + kS - 1 < kGroups) {
            if (g >= 1) wgmma_wait<1>();  // group g - 1, the last user of the set refilled next, is done
            load(g + kS - 1);
          }
        }
        wgmma_wait<0>();
#pragma unroll
        for (int c = 0; c < kC; ++c) pin_registers(acc[c]);
#pragma unroll
        for (int e = 0; e < 8; ++e) {
          s[e] = acc[0][e];
#pragma unroll
          for (int c = 1; c < kC; ++c) s[e] += acc[c][e];
        }
      }
      if constexpr (kNC == 2) {
        // The second warpgroup's partial S^T to the first (thread for thread: same fragment layout).
        const u32 xs = smem + L::kXs + 32 * tid;
        if constexpr (CW == 1) {
          asm volatile("st.shared.v4.f32 [%0], {%1, %2, %3, %4};\n" ::"r"(xs), "f"(s[0]), "f"(s[1]), "f"(s[2]),
                       "f"(s[3])
                       : "memory");
          asm volatile("st.shared.v4.f32 [%0], {%1, %2, %3, %4};\n" ::"r"(xs + 16), "f"(s[4]), "f"(s[5]), "f"(s[6]),
                       "f"(s[7])
                       : "memory");
        }
        named_sync(kExchange, kAll);
        if constexpr (CW == 0) {
          float y[8];
          asm volatile("ld.shared.v4.f32 {%0, %1, %2, %3}, [%4];\n"
                       : "=f"(y[0]), "=f"(y[1]), "=f"(y[2]), "=f"(y[3])
                       : "r"(xs));
          asm volatile("ld.shared.v4.f32 {%0, %1, %2, %3}, [%4];\n"
                       : "=f"(y[4]), "=f"(y[5]), "=f"(y[6]), "=f"(y[7])
                       : "r"(xs + 16));
#pragma unroll
          for (int e = 0; e < 8; ++e) s[e] += y[e];
        }
      }

      // The first V^T fragments of P V do not depend on P: their loads overlap the softmax.
      constexpr int kPS = Cfg::kPvSets;
      u32 va[kPS][kMT][4];
      auto load_v = [&](int ks) {
        const u32 vrow = slot_base[ks / 2] + (16 * (ks % 2) + 8 * (lane / 16) + lane % 8) * L::kRowBytes;
#pragma unroll
        for (int mt = 0; mt < kMT; ++mt)
          ldmatrix_x4_trans(va[ks % kPS][mt], chunk_addr<Cfg>(vrow, 8 * (kMT0 + mt) + 2 * warp + (lane / 8) % 2));
      };
#pragma unroll
      for (int ks = 0; ks < kPS - 1; ++ks) load_v(ks);

      float corr[4];
      const u32 pt = smem + L::kPT;
      if constexpr (kSoftmax) {
        // Mask, scale, block max per head across the warpgroup.
        const u32 mask = [&] {
          u32 v;
          asm volatile("ld.shared.u32 %0, [%1];\n" : "=r"(v) : "r"(smem + L::kFlags + 4 * (warp / 2 ? slot_b : slot_a)));
          return v;
        }();
        const int r0 = 16 * (warp % 2) + lane / 4;
        const bool v0 = (mask >> r0) & 1, v1 = (mask >> (r0 + 8)) & 1;
#pragma unroll
        for (int e = 0; e < 8; ++e) s[e] = ((e / 2) % 2 ? v1 : v0) ? s[e] * scale : neg_inf();
        float bm[4], mx[4];
#pragma unroll
        for (int hs = 0; hs < 4; ++hs) {
          const int e = 4 * (hs / 2) + hs % 2;
          bm[hs] = fmaxf(s[e], s[e + 2]);
          mx[hs] = m[hs];
        }
        reduce_heads(bm, mx, smem + L::kRed, kMaxReady, warp, lane, MaxOp{});
        float sub[4];
#pragma unroll
        for (int hs = 0; hs < 4; ++hs) {
          sub[hs] = max_or_zero(mx[hs]);
          corr[hs] = fast_exp2(m[hs] - sub[hs]);
          m[hs] = mx[hs];
        }
        // P = exp2(S - max): row sums per thread, P^T (bf16) to shared memory.
#pragma unroll
        for (int e = 0; e < 8; ++e) {
          const int hs = 2 * (e / 4) + e % 2;
          s[e] = fast_exp2(s[e] - sub[hs]);
        }
#pragma unroll
        for (int hs = 0; hs < 4; ++hs) {
          const int e = 4 * (hs / 2) + hs % 2;
          l[hs] = l[hs] * corr[hs] + s[e] + s[e + 2];
        }
        const int key0 = 16 * warp + lane / 4;  // block-relative keys key0 and key0 + 8
#pragma unroll
        for (int e = 0; e < 8; ++e) {
          const int h = head_of_slot(2 * (e / 4) + e % 2, q), key = key0 + 8 * ((e / 2) % 2);
          const u32 addr = pt + swizzled(h, key / 8) + 2 * (key % 8);
          asm volatile("st.shared.b16 [%0], %1;\n" ::"r"(addr), "h"(bf16_bits(s[e])) : "memory");
        }
        if (kNC == 2 && warp == 0 && lane < 4) {  // the rescale factors of the 16 heads
#pragma unroll
          for (int hs = 0; hs < 4; ++hs)
            asm volatile("st.shared.f32 [%0], %1;\n" ::"r"(smem + L::kCorr + 4 * head_of_slot(hs, q)), "f"(corr[hs])
                         : "memory");
        }
        fence_async_shared();
      }
      named_sync(kPReady, kAll);
      if constexpr (!kSoftmax) {
#pragma unroll
        for (int hs = 0; hs < 4; ++hs)
          asm volatile("ld.shared.f32 %0, [%1];\n" : "=f"(corr[hs]) : "r"(smem + L::kCorr + 4 * head_of_slot(hs, q)));
      }
      // O is rescaled only when some head of the warp's threads moved its max (the factor is then
      // exactly 1 for every other head): after the first blocks the max rarely moves.
      const bool moved = corr[0] != 1.f || corr[1] != 1.f || corr[2] != 1.f || corr[3] != 1.f;
      if (!Cfg::kSkipRescale || __any_sync(0xffffffffu, moved)) {
#pragma unroll
        for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
          for (int e = 0; e < 8; ++e) o[mt][e] *= corr[2 * (e / 4) + e % 2];
      }

      // O^T += V^T P^T: k-step ks reads keys 16 ks .. of the block (slot ks / 2); warp w's rows of
      // dim tile mt are dims 64 mt + 16 w ...
      {
        const u64 pdesc = desc_k_major<128>(pt);
#pragma unroll
        for (int ks = 0; ks < 4; ++ks) {
          wgmma_fence();
#pragma unroll
          for (int mt = 0; mt < kMT; ++mt) Wgmma<16>::rs<0>(o[mt], va[ks % kPS][mt], desc_advance(pdesc, 32 * ks), 1);
          wgmma_commit();
          if (ks % 2 == 1) {  // the slot's rows are in registers: hand it back to the producers
            __syncwarp();
            if (lane == 0) mbar_arrive(bar.empty(ks == 1 ? slot_a : slot_b));
          }
          if (ks + kPS - 1 < 4) {
            if (ks >= 1) wgmma_wait<1>();  // k-step ks - 1, the last user of the set refilled next, is done
            load_v(ks + kPS - 1);
          }
        }
      }
      // P V completes inside the block (or, kLateDrain, once the next block's first K fragments
      // are loading): with its groups still in flight up to the rescale of O, ptxas 13 reads that
      // as an accumulator read inside the pipeline and serialises every wgmma of the kernel (C7514).
      if constexpr (!Cfg::kLateDrain) wgmma_wait<0>();
    }
    wgmma_wait<0>();
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt) pin_registers(o[mt]);
    __syncwarp();
    if (lane == 0) mbar_arrive(bar.q_empty(qb));

    // Row sums over the warpgroup; then out = O / (sum + sink), lse and max_logits (natural log).
    float inv[4];
    if constexpr (kSoftmax) {
      float total[4] = {0.f, 0.f, 0.f, 0.f};
      reduce_heads(l, total, smem + L::kSum, kSumReady, warp, lane, SumOp{});
#pragma unroll
      for (int hs = 0; hs < 4; ++hs) {
        const float sum = total[hs];
        const int head = head0 + head_of_slot(hs, q);
        float sink = neg_inf();
        if (p.attn_sink != nullptr && head < p.heads) sink = __ldg(p.attn_sink + head) * 1.4426950408889634f;
        const float base = max_or_zero(m[hs]);
        inv[hs] = sum == 0.f ? 0.f : 1.f / (sum + fast_exp2(sink - base));
        if (warp == 0 && lane < 4 && head < p.heads) {
          const bool empty = sum == 0.f;
          p.max_logits[(i64)t * p.ml_row_stride + head] = empty ? neg_inf() : m[hs] * kLn2;
          p.lse[(i64)t * p.lse_row_stride + head] = empty ? pos_inf() : (m[hs] + __log2f(sum)) * kLn2;
        }
        if (kNC == 2 && warp == 0 && lane < 4)
          asm volatile("st.shared.f32 [%0], %1;\n" ::"r"(smem + L::kInv + 4 * head_of_slot(hs, q)), "f"(inv[hs])
                       : "memory");
      }
    }
    if constexpr (kNC == 2) {
      named_sync(kEpilogue, kAll);
      if constexpr (!kSoftmax) {
#pragma unroll
        for (int hs = 0; hs < 4; ++hs)
          asm volatile("ld.shared.f32 %0, [%1];\n" : "=f"(inv[hs]) : "r"(smem + L::kInv + 4 * head_of_slot(hs, q)));
      }
    }
    u16* out = p.out + (i64)t * p.o_row_stride;
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      const int hs = 2 * (e / 4) + e % 2;
      const int head = head0 + head_of_slot(hs, q);
      if (head >= p.heads) continue;
      u16* dst = out + (i64)head * p.o_head_stride + 64 * kMT0 + 16 * warp + lane / 4 + 8 * ((e / 2) % 2);
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt) dst[64 * mt] = bf16_bits(o[mt][e] * inv[hs]);
    }
    // The sums (and the factors handed to the second warpgroup) are read before the next item's
    // epilogue overwrites them.
    if constexpr (kNC == 1)
      named_sync(kSumReady, kConsumerThreads);
    else
      named_sync(kEpilogue, kAll);  // not kSumReady: the first warpgroup alone uses that one
  }
}

// What every role needs of the grid's work: items (query token, group of 16 heads) and groups.
struct Work {
  int items, groups;
};

// The roles' parts (skeleton.cuh: Role): the producer warps (a warpgroup after the consumers, or
// fewer warps), and consumer warpgroup C.
template <class Cfg>
struct ProducerPart {
  template <class Params>
  __device__ __forceinline__ static void run(const Params& p, u32 smem, const Barriers<Cfg>& bar, const Work& w, int) {
    const int pw = (threadIdx.x - Cfg::kConsumers * kConsumerThreads) / 32;
    if constexpr (Cfg::kKvQuantized) produce_quantized<Cfg>(p, smem, bar, w.items, w.groups, pw);
    else produce<Cfg>(p, smem, bar, w.items, w.groups, pw);
  }
};

template <class Cfg, int C>
struct ConsumerPart {
  template <class Params>
  __device__ __forceinline__ static void run(const Params& p, u32 smem, const Barriers<Cfg>& bar, const Work& w, int) {
    consume<Cfg, C>(p, smem, bar, w.items, w.groups);
  }
};

// The kernel for skeleton::run. setmaxnreg only with 384 threads (else every role keeps the launch
// allocation).
template <class Cfg>
struct H16Kernel {
  static constexpr int kNC = Cfg::kConsumers;
  static constexpr int kThreads = Cfg::kThreads;
  static constexpr int kCluster = 1;
  static constexpr bool kUniformWarpgroup = false;
  static constexpr bool kWorkBeforeSync = false;
  static constexpr int kBarrierOffset = Layout<Cfg>::kBars;
  using Work = sparse_h16::Work;
  using Barriers = sparse_h16::Barriers<Cfg>;
  static constexpr int kProducerRegs = kThreads > 256 ? Cfg::kProducerRegs : 0;
  static constexpr int kConsumerRegs = kThreads > 256 ? Cfg::kConsumerRegs : 0;
  using Producer = skeleton::Role<kNC, kThreads / kConsumerThreads + (kThreads % kConsumerThreads ? 1 : 0), kProducerRegs,
                                  ProducerPart<Cfg>, skeleton::Match::kFrom>;
  using Consumer0 = skeleton::Role<0, 1, kConsumerRegs, ConsumerPart<Cfg, 0>, skeleton::Match::kOnly>;
  using Roles = typename skeleton::If<kNC == 2,
                                      skeleton::Roles<Producer, Consumer0,
                                                      skeleton::Role<1, 2, kConsumerRegs, ConsumerPart<Cfg, 1>, skeleton::Match::kRest>>,
                                      skeleton::Roles<Producer, Consumer0>>::type;
  template <class Params>
  __device__ __forceinline__ static Work work(const Params& p) {
    const int groups = (p.heads + kHeads - 1) / kHeads;
    const int items = p.sq * groups;
    return {items, groups};
  }
  template <class Params>
  __device__ __forceinline__ static void prefetch(const Params&) {}
};

}  // namespace mlagen::sm90::sparse_h16
