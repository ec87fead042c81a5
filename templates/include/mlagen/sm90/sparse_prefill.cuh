// Sparse MLA prefill for Hopper (sm_90a), DeepSeek-V3.2 DSA (../../../../../shared/MLA.md section 2).
//
// One CTA per (query token, group of 64 heads); three warpgroups. The producer warpgroup gathers
// the token's selected KV rows, 64 at a time, into two shared-memory buffers of bf16 tiles, each
// buffer in two halves (columns 0-255 and 256-575) with their own mbarriers so that Q K^T can
// start on the first half. How rows are read is the KV operand's (Cfg::Kv, one header per kind:
// sparse_kv_bf16.cuh gathers bf16 rows with cp.async, sparse_kv_fp8.cuh dequantizes FP8 rows);
// everything after the tiles are filled is the same for every operand. Consumer 0 computes the scores of even blocks (buffer 0), consumer 1
// of odd blocks (buffer 1), both as S = Q K^T over 64 heads x 64 keys (wgmma, Q and K in shared
// memory). V is the K buffer read transposed (columns 0-511 of each row), so nothing is loaded
// twice. Consumer 0 owns output columns 0-255 and consumer 1 columns 256-511: each multiplies its
// own P from registers and the other's P from shared memory. Their softmax shares one running
// max per row: consumer 0 publishes its block's max, consumer 1 folds its block into it, and
// consumer 0 rescales to the result before publishing P. The rope tile of buffer 0 is not needed
// after Q K^T, so it holds consumer 0's P (d_qk 576).
//
// Rows (heads) past H are zero-filled Q rows whose outputs are not written; blocks past the
// valid length are skipped whole (the block count is rounded up to pairs; the extra block is all
// invalid). Softmax runs in the exp2 domain with the scale folded in. With Cfg::kLazyMax the
// shared running max moves only when a block's row max exceeds it by more than 2^8 (each
// consumer applies the rule to the published values, so both agree row by row); O is rescaled
// only when some row of the warp moved, and the exact max for max_logits is kept beside it.
//
// The plumbing (shared-memory base, mbarrier init, role dispatch with setmaxnreg, the CTA sync) is
// skeleton.cuh's; this header supplies the layout, the barrier table, the named barriers, the
// consumers, the epilogue and SparseKernel (the KV operand headers supply the producer).
#pragma once
#include "mlagen/cuda/online_softmax.cuh"
#include "mlagen/common/types.cuh"
#include "mlagen/cuda/sparse_pools.cuh"
#include "mlagen/sm90/barrier.cuh"
#include "mlagen/sm90/skeleton.cuh"
#include "mlagen/sm90/sparse_gather.cuh"
#include "mlagen/sm90/wgmma.cuh"

namespace mlagen::sm90::sparse {

constexpr int kRows = 64;        // heads per CTA (wgmma M)
constexpr int kBlockK = 64;      // gathered keys per block (wgmma N of Q K^T)
constexpr int kTileCols = 64;    // bf16 columns of one 128-byte swizzled tile
constexpr int kTileBytes = 64 * 128;
constexpr int kHalfTiles = 4;    // tiles of the first half of a buffer (columns 0-255)

template <class Cfg>
struct Layout {
  static constexpr int kDTiles = Cfg::kDQk / kTileCols;       // 9 (576) or 8 (512)
  static constexpr int kOperandBytes = kDTiles * kTileBytes;  // 64 rows x d_qk
  static constexpr int kQ = 0;
  static constexpr int kK0 = kQ + kOperandBytes;
  static constexpr int kK1 = kK0 + kOperandBytes;
  static constexpr int kP1 = kK1 + kOperandBytes;
  // Consumer 0's P: in buffer 0's rope tile when there is one (free once Q K^T has read it).
  static constexpr bool kP0InRope = kDTiles > 8;
  static constexpr int kP0 = kP0InRope ? kK0 + 8 * kTileBytes : kP1 + kTileBytes;
  static constexpr int kSmall = kP1 + (kP0InRope ? 1 : 2) * kTileBytes;
  static constexpr int kValid = kSmall;              // u8 [2][64]: gathered row is a key
  static constexpr int kMax = kValid + 128;          // float [64]: running max, exchanged
  static constexpr int kSum = kMax + 256;            // float [2][64]: row sums, exchanged at the end
  static constexpr int kBarriers = kSum + 512;       // q_full, ready[2][2], free[2][2], q_free
  static constexpr int kEnd = kBarriers + 8 * 10;
  static constexpr int kReserved = 1024;
  static constexpr int kSmemBytes = kSmall + kReserved + 1024;  // + slack to align the base to 1024
  static_assert(kEnd - kSmall <= kReserved, "small area overflows its reservation");
};

// The mbarriers (skeleton.cuh: Mbarriers): q_full, ready[buffer][half], free[buffer][half],
// initialised buffer by buffer (both halves' ready, then both halves' free), and with
// Cfg::kPersistent q_free (the consumers' last Q K^T of an item has read Q; none otherwise).
template <class Cfg>
struct BarrierTable {
  enum class Id { kQFull, kReady, kFree, kQFree, kCount };
  __host__ __device__ static constexpr skeleton::Group group(Id g) {
    if (g == Id::kQFree) return skeleton::Group{Cfg::kPersistent ? 1 : 0, 0};
    return g == Id::kQFull ? skeleton::Group{1, 0} : skeleton::Group{4, 1, 2};
  }
  __host__ __device__ static constexpr int arrivals(Id g, int slot) {
    // Q is copied by every consumer thread, or with Cfg::kPersistent by the producer warpgroup.
    if (g == Id::kQFull) return Cfg::kPersistent ? 128 : 256;
    if (g == Id::kQFree) return 256;  // every consumer thread, after its last Q K^T of the item
    // As many as the KV operand's loader arrives with; one consumer warpgroup releases each part.
    if (g == Id::kReady) return slot % 2 == 0 ? Cfg::Kv::kReadyFirst : Cfg::Kv::kReadySecond;
    return 128;
  }
};

template <class Cfg>
struct Barriers : skeleton::Mbarriers<BarrierTable<Cfg>> {
  using Id = typename BarrierTable<Cfg>::Id;
  using skeleton::Mbarriers<BarrierTable<Cfg>>::Mbarriers;
  __device__ __forceinline__ u32 q_full() const { return this->template at<Id::kQFull>(); }
  __device__ __forceinline__ u32 q_free() const { return this->template at<Id::kQFree>(); }
  // (first + 2 buf) + half, as the addresses were summed before the table (another association
  // folds differently: other SASS for the FP8 operand's loader).
  static constexpr int kReady = skeleton::Mbarriers<BarrierTable<Cfg>>::first(static_cast<int>(Id::kReady));
  static constexpr int kFree = skeleton::Mbarriers<BarrierTable<Cfg>>::first(static_cast<int>(Id::kFree));
  __device__ __forceinline__ u32 ready(int buf, int half) const { return this->base + 8 * (kReady + 2 * buf + half); }
  __device__ __forceinline__ u32 free(int buf, int half) const { return this->base + 8 * (kFree + 2 * buf + half); }
};

// Named barriers between the consumers (skeleton.cuh: id 0 is the skeleton's).
enum NamedBarrier : int {
  kMax0Ready = skeleton::kFirstNamedBarrier,  // consumer 0 published its block's running max
  kMax1Ready = 2,  // consumer 1 folded its block in: the pair's max
  kP0Ready = 3,    // consumer 0's P (rescaled to the pair's max) is in shared memory
  kP1Ready = 4,    // consumer 1's P is in shared memory
  kSumReady = 5,   // row sums exchanged
  kEpilogue0 = 6,  // (+ consumer) the consumer's output rows are staged
  kNamedEnd = 8,
};
static_assert(skeleton::named_barriers_fit(kNamedEnd), "sm90 has 16 named barriers");

// Pool 1's valid length (the FP8 operand reads one pool); the consumers count both pools' keys
// (mlagen/cuda/sparse_pools.cuh), which is the same when the host passes no extra pool.
template <class Params>
__device__ __forceinline__ int valid_length(const Params& p, int t) {
  int len = p.topk;
  if (p.topk_length != nullptr) len = min(len, max(0, __ldg(p.topk_length + t)));
  return len;
}

// Blocks are processed in pairs (one per consumer); the count is rounded up.
__device__ __forceinline__ int num_pairs(int len) { return (len + 2 * kBlockK - 1) / (2 * kBlockK); }

// Byte offset of (row, 16-byte chunk) in a 128-byte-swizzled tile (the wgmma/TMA 128B pattern).
__device__ __forceinline__ u32 swizzled(int row, int chunk) { return row * 128 + ((chunk ^ (row % 8)) << 4); }

// Q's copies by THREADS threads (8 a row, chunk c of each 128-byte tile row): rows g, g + THREADS / 8,
// ... of the 64; heads past H become zero rows. Q is read once (Cfg::kQEvictFirst: with an
// evict-first L2 policy, as FlashMLA's TMA load of Q).
template <class Cfg, int THREADS, class Params>
__device__ __forceinline__ void copy_q(const Params& p, u32 smem, int t, int head0, int tid) {
  using L = Layout<Cfg>;
  const int g = tid / 8, c = tid % 8;
  const u64 policy = Cfg::kQEvictFirst ? l2_policy_evict_first() : 0;
#pragma unroll
  for (int r = 0; r < kRows * 8 / THREADS; ++r) {
    const int row = g + THREADS / 8 * r;
    const bool ok = head0 + row < p.heads;
    const u16* src = p.q + (i64)t * p.q_row_stride + (i64)(ok ? head0 + row : 0) * p.q_head_stride + c * 8;
#pragma unroll
    for (int tile = 0; tile < L::kDTiles; ++tile)
      cp_async_16<Cfg::kQEvictFirst>(smem + L::kQ + tile * kTileBytes + swizzled(row, c), src + tile * kTileCols, ok,
                                     policy);
  }
}

// Q, gathered by the two consumer warpgroups (idle until it lands) so that the producer starts
// on the indices and the first KV rows at once.
template <class Cfg, class Params>
__device__ __forceinline__ void load_q(const Params& p, u32 smem, const Barriers<Cfg>& bar, int t, int head0) {
  copy_q<Cfg, 256>(p, smem, t, head0, threadIdx.x);  // 0..255 over both consumers
  cp_async_arrive_noinc(bar.q_full());
  mbar_wait(bar.q_full(), 0);
  fence_async_shared();  // Q written by cp.async, read by wgmma
}

// Q of the persistent kernel (Cfg::kPersistent), copied by the producer warpgroup (thread = row group
// g of 16, chunk c of 8, as in the gather) once the consumers' last Q K^T of the previous item has
// read the tile: it lands while they finish that item's softmax, P V and epilogue.
template <class Cfg, class Params>
__device__ __forceinline__ void produce_q(const Params& p, u32 smem, const Barriers<Cfg>& bar, int t, int head0, int n) {
  mbar_wait(bar.q_free(), (n & 1) ^ 1);
  copy_q<Cfg, 128>(p, smem, t, head0, threadIdx.x % 128);
  cp_async_arrive_noinc(bar.q_full());
}

// Persistent: after the Q K^T of the item's last pair this consumer reads Q no more, so the
// producer may load the next item's.
template <class Cfg>
__device__ __forceinline__ void release_q(const Barriers<Cfg>& bar, int pair, int pairs) {
  if constexpr (Cfg::kPersistent) {
    if (pair + 1 == pairs) mbar_arrive(bar.q_free());
  }
}

// The consumers' side of Q: gather it themselves (one CTA per item), or wait for item n's (persistent).
template <class Cfg, class Params>
__device__ __forceinline__ void acquire_q(const Params& p, u32 smem, const Barriers<Cfg>& bar, int t, int head0, int n,
                                          int pairs) {
  if constexpr (Cfg::kPersistent) {
    mbar_wait(bar.q_full(), n & 1);
    fence_async_shared();  // Q written by cp.async, read by wgmma
    if (pairs == 0) mbar_arrive(bar.q_free());  // an item without keys reads no Q
  } else {
    load_q<Cfg>(p, smem, bar, t, head0);
  }
}

// ------------------------------------------------------------------------------------------------
// Consumers.

// The value subtracted before exp2: the max, or 0 while a row has seen no key (avoids inf - inf).
__device__ __forceinline__ float max_or_zero(float m) { return m == neg_inf() ? 0.f : m; }

struct ConsumerRegs {
  float o[128];   // 64 rows x 256 output columns
  float s[32];    // 64 rows x 64 keys: scores, then probabilities (fp32)
  u32 pb[4][4];   // probabilities as bf16 A fragments (4 k-steps of 16 keys)
  float m[2];     // running max (log2 domain, scale folded in) of rows lane/4 and lane/4 + 8
  float l[2];     // running sum of this consumer's probabilities
  float mx[2];    // exact max of this consumer's blocks (for max_logits; r.m may lag with kLazyMax)
};

// The running max after folding in a block's row max b: the exact max, or with LAZY the kept one
// unless b exceeds it by more than kLazyMaxMargin (-inf + margin is -inf: a first key moves it).
template <bool LAZY>
__device__ __forceinline__ float fold_max(float kept, float b) {
  if constexpr (LAZY) return b > kept + kLazyMaxMargin ? b : kept;
  return fmaxf(kept, b);
}

// The factor that takes values relative to `from` to relative to `to`: exactly 1 when the max
// did not move (so the lazy path can skip the multiplies), else exp2(from - to).
__device__ __forceinline__ float max_correction(float from, float to) {
  return from == to ? 1.f : fast_exp2(from - max_or_zero(to));
}

// desc_offset and opaque (forming each MMA's descriptor from a base): mlagen/sm90/wgmma.cuh.

// Wait for gathered data. The rows were written by cp.async and are read by wgmma (the async
// proxy); the memory model asks for a proxy fence in each reading thread after the barrier
// (GATHER_FENCE). In SASS that fence is MEMBAR.ALL.CTA + FENCE.VIEW.ASYNC.S, which also waits for
// the thread's in-flight wgmma, so it serialises the next Q K^T behind the exchanged P V; FlashMLA
// runs without it (cp.async data is complete in shared memory when the mbarrier phase flips).
template <class Cfg>
__device__ __forceinline__ void wait_gathered(u32 bar, u32 phase) {
  mbar_wait(bar, phase);
  if constexpr (Cfg::kGatherFence) fence_async_shared();
}

template <class Cfg>
__device__ __forceinline__ void issue_qk(ConsumerRegs& r, u32 smem, int buf, int first_tile, int last_tile,
                                         bool clear) {
  using L = Layout<Cfg>;
  const u64 q = opaque(desc_k_major<128>(smem + L::kQ));
  const u64 k = opaque(desc_k_major<128>(smem + (buf == 0 ? L::kK0 : L::kK1)));
#pragma unroll
  for (int tile = first_tile; tile < last_tile; ++tile) {
#pragma unroll
    for (int ks = 0; ks < kTileCols / 16; ++ks) {
      const u64 off = desc_offset(tile * kTileBytes + ks * 32);
      Wgmma<kBlockK>::ss(r.s, q + off, k + off, (clear && tile == first_tile && ks == 0) ? 0 : 1);
    }
  }
}

// O[:, 256 wg ...] += P V with P from registers; V = columns [256 wg, 256 wg + 256) of buffer `buf`.
template <class Cfg>
__device__ __forceinline__ void issue_pv_local(ConsumerRegs& r, u32 smem, int buf, int wg) {
  using L = Layout<Cfg>;
  const u64 v = opaque(desc_mn_major<128>(smem + (buf == 0 ? L::kK0 : L::kK1) + wg * kHalfTiles * kTileBytes, kTileBytes));
#pragma unroll
  for (int kt = 0; kt < kBlockK / 16; ++kt) Wgmma<256>::rs<1>(r.o, r.pb[kt], v + desc_offset(kt * 16 * 128), 1);
}

// O[:, 256 wg ...] += P' V' with the other consumer's P' from shared memory.
template <class Cfg>
__device__ __forceinline__ void issue_pv_remote(ConsumerRegs& r, u32 smem, u32 p_tile, int buf, int wg) {
  using L = Layout<Cfg>;
  const u64 v = opaque(desc_mn_major<128>(smem + (buf == 0 ? L::kK0 : L::kK1) + wg * kHalfTiles * kTileBytes, kTileBytes));
  const u64 a = opaque(desc_k_major<128>(p_tile));
#pragma unroll
  for (int kt = 0; kt < kBlockK / 16; ++kt)
    Wgmma<256>::ss<1>(r.o, a + desc_offset(kt * 32), v + desc_offset(kt * 16 * 128), 1);
}

// Scores of invalid keys become -inf.
template <class Cfg>
__device__ __forceinline__ void mask(ConsumerRegs& r, u32 smem, int buf) {
  using L = Layout<Cfg>;
  const int lane = threadIdx.x % 32;
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    const int col = 8 * j + 2 * (lane % 4);
    u16 pair;
    asm volatile("ld.shared.u16 %0, [%1];\n" : "=h"(pair) : "r"(smem + L::kValid + buf * 64 + col));
    if (!(pair & 0xff)) r.s[4 * j + 0] = r.s[4 * j + 2] = neg_inf();
    if (!(pair >> 8)) r.s[4 * j + 1] = r.s[4 * j + 3] = neg_inf();
  }
}


// This block's row max of the scores (log2 domain, scale folded in), over the row's quad.
__device__ __forceinline__ void block_max(const ConsumerRegs& r, float scale_log2, float (&mx)[2]) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    float m = neg_inf();
#pragma unroll
    for (int j = 0; j < 8; ++j) m = fmaxf(m, fmaxf(r.s[4 * j + 2 * h], r.s[4 * j + 2 * h + 1]));
    m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 1));
    m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 2));
    mx[h] = m * scale_log2;
  }
}

// With the new running max published, rescale O and the sum from r.m to it and turn the scores
// into probabilities. Split from block_max so that the max reaches the other consumer before
// this consumer spends time on exponentials and the O rescale.
template <bool LAZY>
__device__ __forceinline__ void exponentiate(ConsumerRegs& r, const float (&m_new)[2], float scale_log2) {
  float corr[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) corr[h] = LAZY ? max_correction(r.m[h], m_new[h]) : fast_exp2(r.m[h] - max_or_zero(m_new[h]));
  if (!LAZY || any_row_moved(corr)) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
#pragma unroll
      for (int j = 0; j < 32; ++j) {
        r.o[4 * j + 2 * h] *= corr[h];
        r.o[4 * j + 2 * h + 1] *= corr[h];
      }
    }
  }
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const float sub = max_or_zero(m_new[h]);
    float sum = 0.f;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      r.s[4 * j + 2 * h] = fast_exp2(fmaf(r.s[4 * j + 2 * h], scale_log2, -sub));
      r.s[4 * j + 2 * h + 1] = fast_exp2(fmaf(r.s[4 * j + 2 * h + 1], scale_log2, -sub));
      sum += r.s[4 * j + 2 * h] + r.s[4 * j + 2 * h + 1];
    }
    r.l[h] = r.l[h] * corr[h] + sum;
    r.m[h] = m_new[h];
  }
}

// This thread's 32 values v[first, first + 32) of a 64 x 64 fp32 accumulator tile (probabilities,
// or a 64-column piece of O), times `scale` per row half, as bf16 A fragments (per 16 columns kt,
// the four 8x8 matrices).
template <int N>
__device__ __forceinline__ void pack_p(const float (&v)[N], int first, const float (&scale)[2], u32 (&pb)[4][4]) {
#pragma unroll
  for (int kt = 0; kt < 4; ++kt) {
#pragma unroll
    for (int x = 0; x < 4; ++x)
      pb[kt][x] = pack_bf16x2(v[first + 8 * kt + 2 * x] * scale[x % 2], v[first + 8 * kt + 2 * x + 1] * scale[x % 2]);
  }
}

// Store the packed P into a 64 x 64 tile (K-major, 128-byte swizzle: the wgmma A layout) with
// stmatrix: per 16 keys, the four 8x8 matrices (rows 0-7 | 8-15) x (keys 0-7 | 8-15) of the warp's
// rows are exactly pb[kt][0..3].
__device__ __forceinline__ void store_p(const u32 (&pb)[4][4], u32 tile) {
  const int tid = threadIdx.x % 128, warp = tid / 32, lane = tid % 32;
  const int mat = lane / 8;
  const int row = warp * 16 + 8 * (mat % 2) + lane % 8;
#pragma unroll
  for (int kt = 0; kt < 4; ++kt) {
    const u32 addr = tile + swizzled(row, 2 * kt + mat / 2);
    asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "r"(pb[kt][0]),
                 "r"(pb[kt][1]), "r"(pb[kt][2]), "r"(pb[kt][3])
                 : "memory");
  }
}

__device__ __forceinline__ void load_max(u32 smem_max, float (&m)[2]) {
  const int tid = threadIdx.x % 128, warp = tid / 32, lane = tid % 32;
#pragma unroll
  for (int h = 0; h < 2; ++h)
    asm volatile("ld.shared.f32 %0, [%1];\n" : "=f"(m[h]) : "r"(smem_max + 4 * (warp * 16 + lane / 4 + 8 * h)) : "memory");
}

__device__ __forceinline__ void store_max(u32 smem_max, const float (&m)[2]) {
  const int tid = threadIdx.x % 128, warp = tid / 32, lane = tid % 32;
  __syncwarp();  // every lane of the quad has read the previous value
  if (lane % 4 == 0) {
#pragma unroll
    for (int h = 0; h < 2; ++h)
      asm volatile("st.shared.f32 [%0], %1;\n" ::"r"(smem_max + 4 * (warp * 16 + lane / 4 + 8 * h)), "f"(m[h])
                   : "memory");
  }
}

// The staged epilogue's part of skeleton::staged_copy: the warpgroup's 64 staged row halves (256
// columns, kStride bytes apart) to token t's rows of heads head0.. (heads past H are not written),
// 16 bytes a thread at a time.
template <class Cfg>
struct StagedRows {
  static constexpr int kStride = 2 * Cfg::kDV + 16;  // bytes per staged row; the pad spreads the banks
  template <class Params>
  __device__ __forceinline__ static void copy(const Params* p, u32 smem, int tid, int wg, int t, int head0) {
    using L = Layout<Cfg>;
    const u32 stage = smem + L::kQ + wg * 512;
#pragma unroll 4
    for (int i = tid; i < 64 * 32; i += 128) {
      const int row = i / 32, chunk = i % 32;
      if (head0 + row < p->heads) {
        uint4 v;
        asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];\n"
                     : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                     : "r"(stage + row * kStride + 16 * chunk));
        *reinterpret_cast<uint4*>(p->out + (i64)t * p->o_row_stride + (i64)(head0 + row) * p->o_head_stride +
                                  wg * 256 + 8 * chunk) = v;
      }
    }
  }
};

template <class Cfg, class Params>
__device__ __forceinline__ void epilogue(const Params& p, ConsumerRegs& r, u32 smem, int wg, int t, int head0) {
  using L = Layout<Cfg>;
  const int tid = threadIdx.x % 128, warp = tid / 32, lane = tid % 32;
  // Total row sums: this consumer's probabilities plus the other's.
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    r.l[h] += __shfl_xor_sync(0xffffffffu, r.l[h], 1);
    r.l[h] += __shfl_xor_sync(0xffffffffu, r.l[h], 2);
  }
  if (lane % 4 == 0) {
#pragma unroll
    for (int h = 0; h < 2; ++h)
      asm volatile("st.shared.f32 [%0], %1;\n" ::"r"(smem + L::kSum + 4 * (wg * 64 + warp * 16 + lane / 4 + 8 * h)),
                   "f"(r.l[h])
                   : "memory");
  }
  if constexpr (Cfg::kLazyMax) {
    // The exact max for max_logits: consumer 0's blocks through the exchange slot (its last reader,
    // consumer 0 itself, has passed it), folded in by consumer 1, which writes max_logits.
    if (wg == 0) store_max(smem + L::kMax, r.mx);
  }
  named_sync(kSumReady, 256);
  if constexpr (Cfg::kLazyMax) {
    if (wg == 1) {
      float other[2];
      load_max(smem + L::kMax, other);
      r.mx[0] = fmaxf(r.mx[0], other[0]);
      r.mx[1] = fmaxf(r.mx[1], other[1]);
    }
  }
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    float other;
    asm volatile("ld.shared.f32 %0, [%1];\n"
                 : "=f"(other)
                 : "r"(smem + L::kSum + 4 * ((wg ^ 1) * 64 + warp * 16 + lane / 4 + 8 * h))
                 : "memory");
    r.l[h] += other;
  }
  // Persistent: both consumers have read the exchanged sums (and consumer 1 the max) before either
  // writes the next item's.
  if constexpr (Cfg::kPersistent) named_sync(kSumReady, 256);
  float inv[2];
  int heads[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    heads[h] = head0 + warp * 16 + lane / 4 + 8 * h;
    // The sink adds exp(sink - max) to the denominator only (natural-log units, log2 domain here).
    float sink = neg_inf();
    if (p.attn_sink != nullptr && heads[h] < p.heads) sink = __ldg(p.attn_sink + heads[h]) * 1.4426950408889634f;
    const float denom = r.l[h] + fast_exp2(sink - max_or_zero(r.m[h]));
    inv[h] = r.l[h] == 0.f ? 0.f : 1.f / denom;  // a row with no key gives 0 whatever the sink
  }
  constexpr int kStride = 2 * Cfg::kDV + 16;  // bytes per staged row; the pad spreads the banks
  if constexpr (Cfg::kStagedEpilogue || Cfg::kBulkEpilogue) {
    // Through shared memory (the Q tile: every Q K^T of both consumers completed before the sum
    // exchange above), then 16-byte stores of whole 512-byte row halves (staged), or one bulk
    // copy per row half (bulk: the copy engine reads the tile, the threads go on to exit).
    const u32 stage = smem + L::kQ + wg * 512;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const u32 row = stage + (warp * 16 + lane / 4 + 8 * h) * kStride + 4 * (lane % 4);
#pragma unroll
      for (int j = 0; j < 32; ++j)
        asm volatile("st.shared.u32 [%0], %1;\n" ::"r"(row + 16 * j),
                     "r"(pack_bf16x2(r.o[4 * j + 2 * h] * inv[h], r.o[4 * j + 2 * h + 1] * inv[h]))
                     : "memory");
    }
  }
  if constexpr (Cfg::kBulkEpilogue) {
    // A warp staged exactly its own 16 rows, so a warp barrier orders them for its lanes 0-15,
    // each of which copies one row (generic-proxy stores, then the async proxy reads them).
    fence_async_shared();
    __syncwarp();
    const int row = warp * 16 + lane;
    if (lane < 16 && head0 + row < p.heads)
      bulk_store(p.out + (i64)t * p.o_row_stride + (i64)(head0 + row) * p.o_head_stride + wg * 256,
                 smem + L::kQ + wg * 512 + row * kStride, 512);
    bulk_commit();
  }
  if constexpr (Cfg::kStagedEpilogue) skeleton::staged_copy<StagedRows<Cfg>>(kEpilogue0 + wg, &p, smem, tid, wg, t, head0);
  if constexpr (Cfg::kWarpEpilogue) {
    // Through this consumer's P tile (free: both consumers' P V completed before the sum exchange),
    // 64 columns at a time, each warp its own 16 rows of it (so only warp barriers): stmatrix in
    // the P layout, then each lane reads 16 bytes of a row and stores them, 4 whole 128-byte row
    // pieces per warp instruction.
    const u32 tile = smem + (wg == 0 ? L::kP0 : L::kP1);
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      u32 pb[4][4];
      pack_p(r.o, 32 * q, inv, pb);
      store_p(pb, tile);
      __syncwarp();
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int row = warp * 16 + lane / 8 + 4 * i, chunk = lane % 8;
        uint4 v;
        asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];\n"
                     : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                     : "r"(tile + swizzled(row, chunk))
                     : "memory");
        if (head0 + row < p.heads)
          *reinterpret_cast<uint4*>(p.out + (i64)t * p.o_row_stride + (i64)(head0 + row) * p.o_head_stride + wg * 256 +
                                    64 * q + 8 * chunk) = v;
      }
      __syncwarp();  // every lane has read the piece before the next is written over it
    }
  }
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    if (heads[h] < p.heads) {
      if constexpr (!Cfg::kStagedEpilogue && !Cfg::kBulkEpilogue && !Cfg::kWarpEpilogue) {
        u16* dst = p.out + (i64)t * p.o_row_stride + (i64)heads[h] * p.o_head_stride + wg * 256 + 2 * (lane % 4);
#pragma unroll
        for (int j = 0; j < 32; ++j)
          *reinterpret_cast<u32*>(dst + 8 * j) =
              pack_bf16x2(r.o[4 * j + 2 * h] * inv[h], r.o[4 * j + 2 * h + 1] * inv[h]);
      }
      if (wg == 1 && lane % 4 == 0) {
        const bool empty = r.l[h] == 0.f;
        p.max_logits[(i64)t * p.ml_row_stride + heads[h]] = empty ? neg_inf() : (Cfg::kLazyMax ? r.mx[h] : r.m[h]) * kLn2;
        p.lse[(i64)t * p.lse_row_stride + heads[h]] = empty ? pos_inf() : (r.m[h] + __log2f(r.l[h])) * kLn2;
      }
    }
  }
  // The staged rows must stay until the copy engine has read them (the CTA's shared memory goes
  // to the next CTA at exit).
  if constexpr (Cfg::kBulkEpilogue) bulk_wait_read();
}

// consumer0 / consumer1: item n of this CTA (0 unless persistent), whose first pair is the CTA's
// pair number `done` (the barriers' phases run on over the items); they return the item's pairs.
template <class Cfg, class Params>
__device__ int consumer0(const Params& p, u32 smem, const Barriers<Cfg>& bar, int t, int head0, int n, int done) {
  using L = Layout<Cfg>;
  ConsumerRegs r;
#pragma unroll
  for (int i = 0; i < 128; ++i) r.o[i] = 0.f;
  r.m[0] = r.m[1] = neg_inf();
  r.mx[0] = r.mx[1] = neg_inf();
  r.l[0] = r.l[1] = 0.f;
  const int pairs = num_pairs(mlagen::sparse_pools::key_count(p, t));
  acquire_q<Cfg>(p, smem, bar, t, head0, n, pairs);
  for (int pair = 0; pair < pairs; ++pair) {
    const u32 phase = (done + pair) & 1;
    if (pair == 0) {
      pin_registers(r.s);
      wgmma_fence();
      wait_gathered<Cfg>(bar.ready(0, 0), phase);
      issue_qk<Cfg>(r, smem, 0, 0, kHalfTiles, true);
      wgmma_commit();
      wait_gathered<Cfg>(bar.ready(0, 1), phase);
      issue_qk<Cfg>(r, smem, 0, kHalfTiles, L::kDTiles, false);
      wgmma_commit();
      wgmma_wait<0>();
      pin_registers(r.s);
    }
    release_q<Cfg>(bar, pair, pairs);  // Q K^T of this pair has completed
    mask<Cfg>(r, smem, 0);
    float m0[2];
    block_max(r, p.scale_log2, m0);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      if constexpr (Cfg::kLazyMax) r.mx[h] = fmaxf(r.mx[h], m0[h]);
      m0[h] = fold_max<Cfg::kLazyMax>(r.m[h], m0[h]);
    }
    store_max(smem + L::kMax, m0);
    named_arrive(kMax0Ready, 256);
    exponentiate<Cfg::kLazyMax>(r, m0, p.scale_log2);
    const float one[2] = {1.f, 1.f};
    pack_p(r.s, 0, one, r.pb);
    pin_registers(r.o);
    pin_registers(r.pb);
    wgmma_fence();
    issue_pv_local<Cfg>(r, smem, 0, 0);
    wgmma_commit();
    if constexpr (Cfg::kEarlyFree) {
      // FlashMLA's order: wait for this P V and release buffer 0's first half before the
      // exchange, so the producer starts the next pair's gather without waiting for consumer 1.
      wgmma_wait<0>();
      pin_registers(r.o);
      mbar_arrive(bar.free(0, 0));
    }
    // The pair's max from consumer 1; P, rescaled to it, goes to consumer 1 while this
    // consumer's own P V still runs (a second register set: the first is the MMA's operand).
    named_sync(kMax1Ready, 256);
    float m1[2], f[2];
    load_max(smem + L::kMax, m1);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      f[h] = Cfg::kLazyMax ? max_correction(r.m[h], m1[h]) : fast_exp2(r.m[h] - max_or_zero(m1[h]));
      r.m[h] = m1[h];
    }
    const bool rescale = !Cfg::kLazyMax || any_row_moved(f);
    {
      u32 pb2[4][4];
      pack_p(r.s, 0, f, pb2);
      store_p(pb2, smem + L::kP0);
    }
    fence_async_shared();
    named_arrive(kP0Ready, 256);
    if constexpr (!Cfg::kEarlyFree) {
      wgmma_wait<0>();
      pin_registers(r.o);
      mbar_arrive(bar.free(0, 0));
    }
    if (rescale) {
#pragma unroll
      for (int i = 0; i < 64; ++i) {
        r.o[2 * i] *= f[(i % 2)];
        r.o[2 * i + 1] *= f[(i % 2)];
      }
      r.l[0] *= f[0];
      r.l[1] *= f[1];
    }
    named_sync(kP1Ready, 256);
    pin_registers(r.o);
    wgmma_fence();
    issue_pv_remote<Cfg>(r, smem, smem + L::kP1, 1, 0);
    wgmma_commit();
    if (pair + 1 < pairs) {
      // Next pair's scores while the exchanged P V runs.
      pin_registers(r.s);
      wgmma_fence();
      wait_gathered<Cfg>(bar.ready(0, 0), phase ^ 1);
      issue_qk<Cfg>(r, smem, 0, 0, kHalfTiles, true);
      wgmma_commit();
      wgmma_wait<1>();
      mbar_arrive(bar.free(1, 0));
      wait_gathered<Cfg>(bar.ready(0, 1), phase ^ 1);
      issue_qk<Cfg>(r, smem, 0, kHalfTiles, L::kDTiles, false);
      wgmma_commit();
      wgmma_wait<0>();
      pin_registers(r.s);
      pin_registers(r.o);
    } else {
      wgmma_wait<0>();
      pin_registers(r.o);
      mbar_arrive(bar.free(1, 0));
    }
  }
  epilogue<Cfg>(p, r, smem, 0, t, head0);
  return pairs;
}

template <class Cfg, class Params>
__device__ int consumer1(const Params& p, u32 smem, const Barriers<Cfg>& bar, int t, int head0, int n, int done) {
  using L = Layout<Cfg>;
  ConsumerRegs r;
#pragma unroll
  for (int i = 0; i < 128; ++i) r.o[i] = 0.f;
  r.m[0] = r.m[1] = neg_inf();
  r.mx[0] = r.mx[1] = neg_inf();
  r.l[0] = r.l[1] = 0.f;
  const int pairs = num_pairs(mlagen::sparse_pools::key_count(p, t));
  acquire_q<Cfg>(p, smem, bar, t, head0, n, pairs);
  for (int pair = 0; pair < pairs; ++pair) {
    const u32 phase = (done + pair) & 1;
    // The second half first: consumer 1 itself releases it, so it is refilled earlier.
    pin_registers(r.s);
    wgmma_fence();
    wait_gathered<Cfg>(bar.ready(1, 1), phase);
    issue_qk<Cfg>(r, smem, 1, kHalfTiles, L::kDTiles, true);
    wgmma_commit();
    wait_gathered<Cfg>(bar.ready(1, 0), phase);
    issue_qk<Cfg>(r, smem, 1, 0, kHalfTiles, false);
    wgmma_commit();
    wgmma_wait<0>();
    pin_registers(r.s);
    release_q<Cfg>(bar, pair, pairs);
    mask<Cfg>(r, smem, 1);
    float m1[2];
    block_max(r, p.scale_log2, m1);
    named_sync(kMax0Ready, 256);
    {
      float prior[2];
      load_max(smem + L::kMax, prior);
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        if constexpr (Cfg::kLazyMax) r.mx[h] = fmaxf(r.mx[h], m1[h]);
        m1[h] = fold_max<Cfg::kLazyMax>(prior[h], m1[h]);
      }
    }
    store_max(smem + L::kMax, m1);
    named_arrive(kMax1Ready, 256);
    exponentiate<Cfg::kLazyMax>(r, m1, p.scale_log2);
    const float one[2] = {1.f, 1.f};
    pack_p(r.s, 0, one, r.pb);
    pin_registers(r.o);
    pin_registers(r.pb);
    wgmma_fence();
    issue_pv_local<Cfg>(r, smem, 1, 1);
    wgmma_commit();
    store_p(r.pb, smem + L::kP1);
    if constexpr (!Cfg::kLateFence) fence_async_shared();
    named_sync(kP0Ready, 256);
    issue_pv_remote<Cfg>(r, smem, smem + L::kP0, 0, 1);
    wgmma_commit();
    // LATE_FENCE: fence after the exchanged P V is queued, so the tensor pipe never drains
    // while this warpgroup's P stores are being ordered for consumer 0's wgmma.
    if constexpr (Cfg::kLateFence) fence_async_shared();
    named_arrive(kP1Ready, 256);
    wgmma_wait<1>();
    mbar_arrive(bar.free(1, 1));
    wgmma_wait<0>();
    pin_registers(r.o);
    mbar_arrive(bar.free(0, 1));
  }
  epilogue<Cfg>(p, r, smem, 1, t, head0);
  return pairs;
}

// The work item of this CTA (one per CTA, computed before the roles start): query token t, heads
// [head0, head0 + kRows).
struct WorkItem {
  int t, head0;
};

// The persistent kernel's work (Cfg::kPersistent, one CTA per SM): items (token, 64-head group) in
// turn, item, item + gridDim.x, ..., numbered in the order of the non-persistent grid.
struct WorkItems {
  int items, groups;
};

// Runs f(t, head0, n, done) on each of this CTA's items; f returns the item's pairs, summed into
// `done` (the pair number the barriers' phases follow).
template <class F>
__device__ __forceinline__ void for_each_item(const WorkItems& w, F&& f) {
  int done = 0;
  for (int item = blockIdx.x, n = 0; item < w.items; item += gridDim.x, ++n)
    done += f(item / w.groups, (item % w.groups) * kRows, n, done);
}

// The roles' parts (skeleton.cuh: Role): consumer 0 (even blocks, output columns 0-255), consumer 1
// (odd blocks, columns 256-511), and the producer (gathers Q and the selected KV rows).
template <class Cfg, int C>
struct ConsumerPart {
  template <class Params>
  __device__ __forceinline__ static int item(const Params& p, u32 smem, const Barriers<Cfg>& bar, int t, int head0,
                                             int n, int done) {
    if constexpr (C == 0) return consumer0<Cfg>(p, smem, bar, t, head0, n, done);
    else return consumer1<Cfg>(p, smem, bar, t, head0, n, done);
  }
  template <class Params>
  __device__ __forceinline__ static void run(const Params& p, u32 smem, const Barriers<Cfg>& bar, const WorkItem& w,
                                             int) {
    item(p, smem, bar, w.t, w.head0, 0, 0);
  }
  template <class Params>
  __device__ __forceinline__ static void run(const Params& p, u32 smem, const Barriers<Cfg>& bar, const WorkItems& w,
                                             int) {
    for_each_item(w, [&](int t, int head0, int n, int done) { return item(p, smem, bar, t, head0, n, done); });
  }
};

template <class Cfg>
struct ProducerPart {
  template <class Params>
  __device__ __forceinline__ static void run(const Params& p, u32 smem, const Barriers<Cfg>& bar, const WorkItem& w,
                                             int) {
    Cfg::Kv::produce(p, smem, bar, w.t, w.head0);
  }
  // Persistent: each item's Q (after the previous item's last Q K^T), then its pairs.
  template <class Params>
  __device__ __forceinline__ static void run(const Params& p, u32 smem, const Barriers<Cfg>& bar, const WorkItems& w,
                                             int) {
    for_each_item(w, [&](int t, int head0, int n, int done) {
      produce_q<Cfg>(p, smem, bar, t, head0, n);
      return Cfg::Kv::produce(p, smem, bar, t, head0, done);
    });
  }
};

// The kernel for skeleton::run: consumers in warpgroups 0 and 1, the producer in warpgroup 2.
template <class Cfg, int CONSUMER_REGS, int PRODUCER_REGS>
struct SparseKernel {
  static constexpr int kThreads = Cfg::kThreads;
  static constexpr int kCluster = 1;
  static constexpr bool kUniformWarpgroup = false;
  static constexpr bool kWorkBeforeSync = true;
  static constexpr int kBarrierOffset = Layout<Cfg>::kBarriers;
  using Work = typename skeleton::If<Cfg::kPersistent, WorkItems, WorkItem>::type;
  using Barriers = sparse::Barriers<Cfg>;
  using Roles = skeleton::Roles<skeleton::Role<2, 3, PRODUCER_REGS, ProducerPart<Cfg>, skeleton::Match::kOnly>,
                                skeleton::Role<0, 1, CONSUMER_REGS, ConsumerPart<Cfg, 0>, skeleton::Match::kOnly>,
                                skeleton::Role<1, 2, CONSUMER_REGS, ConsumerPart<Cfg, 1>, skeleton::Match::kRest>>;
  template <class Params>
  __device__ __forceinline__ static Work work(const Params& p) {
    const int groups = (p.heads + kRows - 1) / kRows;
    if constexpr (Cfg::kPersistent) {
      return {p.sq * groups, groups};
    } else {
      const int t = blockIdx.x / groups;
      const int head0 = (blockIdx.x % groups) * kRows;
      return {t, head0};
    }
  }
  template <class Params>
  __device__ __forceinline__ static void prefetch(const Params&) {}
};

}  // namespace mlagen::sm90::sparse
