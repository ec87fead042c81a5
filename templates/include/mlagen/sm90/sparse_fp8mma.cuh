// Sparse MLA prefill for Hopper (sm_90a) from an FP8 latent cache on FP8 tensor cores: the "fp8"
// compute mode (docs/notes-sparse.md, "The fp8 compute mode"; MLA.md section 2 for what is
// computed). The block structure is the bf16 kernel's (sparse_prefill.cuh): one CTA per (query
// token, 64 heads), a producer warpgroup and two consumer warpgroups, consumer 0 scoring even key
// blocks and consumer 1 odd ones, consumer c owning output columns [256 c, 256 c + 256).
//
// Cache rows (mlagen/operands.py): 512 e4m3 values v, a fp32 scale per 128 values (Cfg::kScaled;
// fp8_v32) or none (fp8_b0), 64 bf16 rope values. A key's latent values are k = v * ks_b.
//
// * Q (consumers, once per CTA): each head row h gets a power-of-two scale qs_h >= amax / 448;
//   its 512 latent values become e4m3(q / qs_h) (exact scaling, one rounding) and its rope values
//   bf16(q_rope / qs_h) (exact). The row's logits are qs_h * S with
//   S = sum_b ks_b[key] * (Q8_b . K8_b) + Q_rope' . K_rope:
//   one bf16 wgmma chain for the rope, one e4m3 chain per scale block into a second accumulator
//   folded into S with each key's scale (a single e4m3 chain when unscaled); qs_h goes into the
//   row's softmax scale.
// * The producer gathers a block's raw rows with cp.async (values into four 128-byte-swizzled
//   e4m3 tiles, rope into a bf16 tile, each row's scales by one 16-byte copy into a
//   [key][scale block] table, invalid rows zero-filled and never read; the row ids are loaded a
//   pair of blocks ahead) and transposes the values into V^T with ldmatrix.trans / stmatrix: 512
//   rows (dims) of 64 keys, K-major with a 64-byte swizzle, the 16 keys of each group in the order
//   perm16 (the order in which a thread's four scores per 16 keys are its e4m3 A-fragment bytes:
//   no shuffles).
// * V's scales: output column block b (128 columns) accumulates P'_b V8_b with
//   P'_b = P * ks_b[key] / C_b, where C_b is a power of two >= every scale of block b seen so far
//   (running over key-block pairs, computed by the producer: f_b[key] = ks_b[key] / C_b, and the
//   factor C_old / C_new that rescales O_b when C_b grows); O_b is multiplied by C_b at the end.
//   P = 2^6 exp2(s - m) (the 2^6 folded into the exponent, so the row sums carry it and O / l is
//   unchanged); P' <= 2^8 (the lazy max lets exp2(s - m) reach 2^2), inside e4m3's range; P's
//   row sums are taken in fp32.
#pragma once
#include "mlagen/cuda/online_softmax.cuh"
#include "mlagen/common/types.cuh"
#include "mlagen/sm90/barrier.cuh"
#include "mlagen/sm90/sparse_gather.cuh"
#include "mlagen/sm90/sparse_prefill.cuh"
#include "mlagen/sm90/wgmma.cuh"

namespace mlagen::sm90::sparse_fp8 {

using sparse::kBlockK;
using sparse::kRows;
using sparse::swizzled;

constexpr int kTileBytes = 64 * 128;  // 64 rows x 128 bytes (e4m3: 128 values; bf16: 64)
constexpr int kVtBytes = 512 * 64;    // V^T: 512 dims x 64 keys
constexpr int kPxBytes = 64 * 64;     // an exchanged P' tile: 64 heads x 64 keys (e4m3)
// The lazy running max moves when a block's row max exceeds it by more than 2^kLazyMargin, so
// P / 2^6 <= 2^kLazyMargin; P' is P * f <= 2^(2 + 6) = 256 < 448 (e4m3's largest), and the
// 2^6 keeps small products out of e4m3's subnormals (2^-9 .. 2^-6) six binades longer.
constexpr float kLazyMargin = 2.f;
constexpr float kLog2PScale = 6.f;  // P is computed as 2^6 exp2(x - m): the row sums carry it too

// The shared-memory layout for `NB` scale blocks per row (0, 4, 8 or 16). The small tables are
// sized for max(NB, 4) blocks, so the layouts of NB 0 and 4 are one.
template <int NB>
struct LayoutT {
  static constexpr int kSB = NB > 4 ? NB : 4;
  static constexpr int kQ8 = 0;                        // Q latent, e4m3, 4 tiles
  static constexpr int kQR = kQ8 + 4 * kTileBytes;     // Q rope / qs, bf16, 1 tile
  static constexpr int kBuf = 5 * kTileBytes;          // a gathered block: 4 e4m3 tiles + the rope tile
  static constexpr int kK0 = kQR + kTileBytes;
  static constexpr int kVt0 = kK0 + 2 * kBuf;
  // Consumer c's P for the other: two e4m3 P' tiles (NB <= 4), or one f16 tile of P (NB > 4).
  static constexpr int kPx0 = kVt0 + 2 * kVtBytes;
  static constexpr int kSmall = kPx0 + 2 * 2 * kPxBytes;
  // Key scales, float [buffer][key][kKsStride]: a key's NB scales, padded by four with more than
  // four, so that the folds' loads (keys 2 t + 8 j of the four lanes t of a quad) fall in four
  // distinct bank groups (unpadded, 8 / 16 scales a key put them 2- / 4-way on one bank).
  static constexpr int kKsStride = NB > 4 ? NB + 4 : 4;
  static constexpr int kKs = kSmall;
  static constexpr int kFv = kKs + 2 * 64 * kKsStride * 4;  // float [buffer][block][key]: ks / C
  static constexpr int kValid = kFv + 2 * kSB * 64 * 4;  // u8 [buffer][key]
  static constexpr int kQs = kValid + 128;             // float [64]: Q row scales
  static constexpr int kMax = kQs + 256;               // float [64]: running max, exchanged
  static constexpr int kSum = kMax + 256;              // float [2][64]: row sums, exchanged at the end
  static constexpr int kVnorm = kSum + 512;            // float [parity][2][kSB]: O_b rescale of the pair, C_b
  static constexpr int kRed = kVnorm + 16 * kSB;       // float [parity][4 warps][kSB]: producer's maxima
  static constexpr int kBarriers = kRed + 32 * kSB;    // kready[2], vready[2], kfree[2], vfree[2]
  static constexpr int kEnd = kBarriers + 8 * 8;
  static constexpr int kReserved = (kEnd - kSmall + 1023) / 1024 * 1024;  // 6 / 12 / 20 KB
  static constexpr int kSmemBytes = kSmall + kReserved + 1024;  // + slack to align the base to 1024
  static_assert(kVt0 % 1024 == 0 && kPx0 % 1024 == 0 && kK0 % 1024 == 0, "swizzle atoms");
  static __device__ __forceinline__ u32 k8(u32 smem, int buf) { return smem + kK0 + buf * kBuf; }
  static __device__ __forceinline__ u32 kr(u32 smem, int buf) { return smem + kK0 + buf * kBuf + 4 * kTileBytes; }
  static __device__ __forceinline__ u32 vt(u32 smem, int buf) { return smem + kVt0 + buf * kVtBytes; }
  // The tile in which consumer `from` leaves P' of column block `b` (0, 1 of the other's two).
  static __device__ __forceinline__ u32 px(u32 smem, int from, int b) { return smem + kPx0 + (2 * from + b) * kPxBytes; }
  // Scale block b's normaliser data of a pair's parity: which 0: O_b's growth factor, 1: C_b.
  static __device__ __forceinline__ u32 vnorm(u32 smem, u32 parity, int which, int b) {
    return smem + kVnorm + 4 * ((2 * parity + which) * kSB + b);
  }
};

// What a configuration's cache format makes of the kernel: kNB scale blocks of kW values per row
// (0: unscaled), kCB output column blocks of kW columns per consumer (one when unscaled). With
// 128-value blocks (V3.2) a consumer hands the other its P' of each of the other's column blocks
// as e4m3 tiles; with 64- or 32-value blocks (four or eight P' per consumer, which neither fit
// the registers nor the shared memory) it hands over P itself, as an f16 tile, and the receiver
// forms the P' of its own column blocks from it.
template <class Cfg>
struct ScaleFormat {
  static constexpr int kW = Cfg::kKvScaleBlock;
  static constexpr int kNB = kW ? 512 / kW : 0;
  static constexpr int kCB = kW ? 256 / kW : 1;
  static constexpr int kCols = 256 / kCB;  // output columns per column block
  static constexpr bool kF16Exchange = kNB > 4;
  static_assert(kW == 0 || kW == 128 || kW == 64 || kW == 32, "scale blocks of 128, 64 or 32 values, or none");
};

template <class Cfg>
using LayoutFor = LayoutT<ScaleFormat<Cfg>::kNB>;

struct Barriers {
  u32 base;
  __device__ __forceinline__ u32 kready(int buf) const { return base + 8 * buf; }
  __device__ __forceinline__ u32 vready(int buf) const { return base + 8 * (2 + buf); }
  __device__ __forceinline__ u32 kfree(int buf) const { return base + 8 * (4 + buf); }
  __device__ __forceinline__ u32 vfree(int buf) const { return base + 8 * (6 + buf); }
};

enum NamedBarrier : int {
  kMax0Ready = sparse::kMax0Ready,
  kMax1Ready = sparse::kMax1Ready,
  kP0Ready = sparse::kP0Ready,
  kP1Ready = sparse::kP1Ready,
  kSumReady = sparse::kSumReady,
  kEpilogue0 = sparse::kEpilogue0,  // + consumer
  kQReady = 8,                      // both consumers quantized their part of Q
  kScalesSeen = 9,                  // the producer's per-warp scale maxima (and, for NB > 4, C_b) are in shared memory
  kTransposed = 10,                 // every producer warp is done reading the pair's buffers
};

// The running max after folding in a block's row max b (sparse::fold_max with this kernel's margin).
template <bool LAZY>
__device__ __forceinline__ float fold_max(float kept, float b) {
  if constexpr (LAZY) return b > kept + kLazyMargin ? b : kept;
  return fmaxf(kept, b);
}

// 1 / x for a power of two x in [2^-126, 2^126] (exact): the exponent reflected about the bias.
__device__ __forceinline__ float pow2_inverse(float x) { return __uint_as_float((254u - (__float_as_uint(x) >> 23)) << 23); }

// A power of two >= x (x >= 0 finite; 2^-126 for 0 and subnormals).
__device__ __forceinline__ float pow2_ceil(float x) {
  const u32 bits = __float_as_uint(x);
  u32 e = bits >> 23;
  if ((bits & 0x7fffffu) != 0 || e == 0) e += 1;
  return __uint_as_float(e << 23);
}

// Four floats as e4m3 (round to nearest even, saturating), x0 in the low byte.
__device__ __forceinline__ u32 pack_e4m3x4(float x0, float x1, float x2, float x3) {
  u32 out;
  asm("{\n .reg .b16 lo, hi;\n cvt.rn.satfinite.e4m3x2.f32 lo, %2, %1;\n cvt.rn.satfinite.e4m3x2.f32 hi, %4, %3;\n"
      " mov.b32 %0, {lo, hi};\n}\n"
      : "=r"(out)
      : "f"(x0), "f"(x1), "f"(x2), "f"(x3));
  return out;
}

__device__ __forceinline__ u32 opaque32(u32 x) {
  asm volatile("" : "+r"(x));
  return x;
}

__device__ __forceinline__ u32 prmt(u32 a, u32 b, u32 sel) {
  u32 d;
  asm("prmt.b32 %0, %1, %2, %3;\n" : "=r"(d) : "r"(a), "r"(b), "r"(sel));
  return d;
}

__device__ __forceinline__ float ld_shared_f32(u32 addr) {
  float v;
  asm volatile("ld.shared.f32 %0, [%1];\n" : "=f"(v) : "r"(addr) : "memory");
  return v;
}

__device__ __forceinline__ float2 ld_shared_f32x2(u32 addr) {
  float2 v;
  asm volatile("ld.shared.v2.f32 {%0, %1}, [%2];\n" : "=f"(v.x), "=f"(v.y) : "r"(addr) : "memory");
  return v;
}

__device__ __forceinline__ void st_shared_f32(u32 addr, float v) {
  asm volatile("st.shared.f32 [%0], %1;\n" ::"r"(addr), "f"(v) : "memory");
}

__device__ __forceinline__ void st_shared_u32(u32 addr, u32 v) {
  asm volatile("st.shared.u32 [%0], %1;\n" ::"r"(addr), "r"(v) : "memory");
}

// Byte offset of (row, 16-byte chunk) in a K-major tile of 64-byte rows with the 64-byte swizzle.
__device__ __forceinline__ u32 swizzled64(int row, int chunk) { return row * 64 + ((chunk ^ ((row >> 1) & 3)) << 4); }

// ------------------------------------------------------------------------------------------------
// Producer.

template <class Cfg>
struct Producer {
  using L = LayoutFor<Cfg>;
  using SF = ScaleFormat<Cfg>;
  template <class Params>
  static __device__ __forceinline__ const u8* row_ptr(const Params& p, int row) {
    i64 off;
    if constexpr (Cfg::kPaged) off = (i64)(row / p.page_size) * p.kv_page_stride + (i64)(row % p.page_size) * p.kv_row_stride;
    else off = (i64)row * p.kv_row_stride;
    return p.kv + off;
  }

  // Block n's entries for this thread's rows g + 16 r (-1 past the valid length). Not checked
  // here: the check would wait for the loads, which are issued a pair ahead of their use.
  template <class Params>
  static __device__ __forceinline__ void load_rows(const Params& p, const int* idx_row, int len, int n, int g,
                                                   int (&rows)[4]) {
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      const int pos = n * kBlockK + g + 16 * r;
      rows[r] = pos < len ? __ldg(idx_row + pos) : -1;
    }
  }

  template <class Params>
  static __device__ __forceinline__ void gather(const Params& p, u32 smem, const Barriers& bar, int buf,
                                                const int (&rows)[4], int g, int c) {
    // Formed here (one instruction) rather than held across the loop by the 56-register producer.
    const u64 policy = Cfg::kEvictLast ? l2_policy_evict_last() : 0;
    const u32 k8 = L::k8(smem, buf), kr = L::kr(smem, buf);
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      const int key = g + 16 * r;
      const bool ok = rows[r] >= 0 && rows[r] < p.num_kv;
      const u8* src = row_ptr(p, ok ? rows[r] : 0);
#pragma unroll
      for (int tile = 0; tile < 4; ++tile)
        cp_async_16<Cfg::kEvictLast>(k8 + tile * kTileBytes + swizzled(key, c), src + 128 * tile + 16 * c, ok, policy);
      cp_async_16<Cfg::kEvictLast>(kr + swizzled(key, c), src + Cfg::kKvRopeOffset + 16 * c, ok, policy);
      // The row's scales, 16 bytes (four) per copy, into [buffer][key][block]: four scales by
      // thread c = r, more by threads c < copies (copy c; one predicate and address per row).
      if constexpr (SF::kNB == 4) {
        if (c == r) cp_async_16<false>(smem + L::kKs + 4 * L::kKsStride * (buf * 64 + key), src + Cfg::kKvScaleOffset, ok, 0);
      } else if constexpr (Cfg::kScaled) {
        if (c < SF::kNB / 4)
          cp_async_16<false>(smem + L::kKs + 4 * L::kKsStride * (buf * 64 + key) + 16 * c, src + Cfg::kKvScaleOffset + 16 * c,
                             ok, 0);
      }
    }
    cp_async_arrive_noinc(bar.kready(buf));
    if (c == 0) {
#pragma unroll
      for (int r = 0; r < 4; ++r)
        asm volatile("st.shared.u8 [%0], %1;\n" ::"r"(smem + L::kValid + buf * 64 + g + 16 * r),
                     "h"((u16)(rows[r] >= 0 && rows[r] < p.num_kv))
                     : "memory");
      mbar_arrive(bar.kready(buf));
    }
  }

  // V^T of buffer `buf` from its e4m3 tiles with ldmatrix.trans / stmatrix. The tiles read as
  // b16 matrices (rows: keys; columns: dim pairs). Warp w takes the key group q = w (keys
  // 16 q ... 16 q + 15) and, per step k, dims 32 k ... 32 k + 31 (16-dim chunks 2 k, 2 k + 1): one
  // ldmatrix.x4.trans loads the 8 x 8 b16 matrices (keys 0-7 | 8-15 of the group) x (chunk 2k |
  // 2k + 1), so lane T = 4 g + t holds, per matrix, dims 2 g and 2 g + 1 of keys 2 t and 2 t + 1
  // (or 8 + 2 t, 9 + 2 t); two byte permutes per chunk give dim 2 g's and dim 2 g + 1's word t of
  // the group, keys (2t, 2t+1, 8+2t, 9+2t): the perm16 order, in which a thread's scores are its
  // e4m3 A fragment. One stmatrix.x4 writes them as four 8 x 16-byte matrices of V^T rows
  // (dims); a matrix takes dims 0, 2, 4, 6, 9, 11, 13, 15 (or the others) of a chunk, so its eight
  // rows land in eight distinct 16-byte bank groups under the 64-byte swizzle. 16 steps per warp,
  // about 8 instructions each (the byte-wise version: about 260).
  static __device__ __forceinline__ void transpose(u32 smem, int buf) {
    // From an opaque thread id: the lane constants below are formed per call (a few ALU
    // instructions) instead of being hoisted out of the pair loop into registers.
    const int tid = (int)opaque32(threadIdx.x % 128), warp = tid / 32, lane = tid % 32;
    const int m = lane / 8, r = lane % 8;  // the matrix and row this lane addresses
    // ldmatrix: matrix m = (keys 8 (m % 2) + r of the group) x (chunk 2 k + m / 2).
    const int key = 16 * warp + 8 * (m % 2) + r;
    const u32 ld_base = L::k8(smem, buf) + key * 128;
    const u32 sw = (u32)((m / 2) ^ r) << 4;  // chunk (2k % 8 + m / 2) XOR key % 8 = (2k % 8) XOR ((m / 2) ^ r)
    // stmatrix: matrix m = chunk 2 k + m / 2, dims (m % 2 == 0: 0 2 4 6 9 11 13 15; else the others).
    const int dd = (m % 2 == 0) == (r < 4) ? 2 * r : 2 * r + 1;
    const u32 st_addr = L::vt(smem, buf) + (16 * (m / 2) + dd) * 64 + ((warp ^ ((dd >> 1) & 3)) << 4);
    // This lane's words: the even dim goes to matrix 0 / 2 for lanes g < 4, to matrix 1 / 3 otherwise.
    const bool low = lane < 16;
    const u32 sel0 = low ? 0x6420u : 0x7531u, sel1 = low ? 0x7531u : 0x6420u;
    // Software-pipelined: step k + 1's ldmatrix is issued before step k's permutes and stmatrix.
    auto load = [&](int k, u32 (&x)[4]) {
      const u32 src = ld_base + (k / 4) * kTileBytes + (((u32)(2 * k % 8) << 4) ^ sw);
      asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                   : "=r"(x[0]), "=r"(x[1]), "=r"(x[2]), "=r"(x[3])
                   : "r"(src)
                   : "memory");
    };
    auto store = [&](int k, const u32 (&x)[4]) {
      const u32 y0 = prmt(x[0], x[1], sel0), y1 = prmt(x[0], x[1], sel1);
      const u32 y2 = prmt(x[2], x[3], sel0), y3 = prmt(x[2], x[3], sel1);
      asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(st_addr + k * 32 * 64),
                   "r"(y0), "r"(y1), "r"(y2), "r"(y3)
                   : "memory");
    };
    u32 xa[4], xb[4];
    load(0, xa);
#pragma unroll 1
    for (int k = 0; k < 16; k += 2) {
      load(k + 1, xb);
      store(k, xa);
      if (k + 2 < 16) load(k + 2, xa);
      store(k + 1, xb);
    }
  }

  // The pair's normalisers with more than four scale blocks, none held across the pair (the
  // producer has 56 registers): each warp's maximum of every block's scales (thread = key tid % 64
  // of buffer tid / 64), then thread b < NB forms C_b (a power of two >= every scale of block b so
  // far) and O_b's growth factor C_old / C_new into the parity's normaliser slots.
  static __device__ __forceinline__ void wide_scale_stage(u32 smem, int tid, int mine, int key, int pair, u32 phase) {
    const int warp = tid / 32, lane = tid % 32;
    const u32 red = smem + L::kRed + 16 * L::kSB * phase;  // float [4 warps][NB] of this parity
#pragma unroll
    for (int b0 = 0; b0 < SF::kNB; b0 += 4) {
      float mx[4];
      asm volatile("ld.shared.v4.f32 {%0, %1, %2, %3}, [%4];\n"
                   : "=f"(mx[0]), "=f"(mx[1]), "=f"(mx[2]), "=f"(mx[3])
                   : "r"(smem + L::kKs + 4 * (L::kKsStride * (mine * 64 + key) + b0))
                   : "memory");
#pragma unroll
      for (int b = 0; b < 4; ++b) {
        mx[b] = fabsf(mx[b]);
#pragma unroll
        for (int o = 16; o > 0; o /= 2) mx[b] = fmaxf(mx[b], __shfl_xor_sync(0xffffffffu, mx[b], o));
      }
      if (lane == 0)
        asm volatile("st.shared.v4.f32 [%0], {%1, %2, %3, %4};\n" ::"r"(red + 4 * (warp * SF::kNB + b0)), "f"(mx[0]),
                     "f"(mx[1]), "f"(mx[2]), "f"(mx[3])
                     : "memory");
    }
    named_sync(kScalesSeen, 128);
    if (tid < SF::kNB) {
      const int b = tid;
      float m = 0.f;
#pragma unroll
      for (int w = 0; w < 4; ++w) m = fmaxf(m, ld_shared_f32(red + 4 * (w * SF::kNB + b)));
      const float prev = pair > 0 ? ld_shared_f32(L::vnorm(smem, phase ^ 1, 1, b)) : 0.f;
      const float next = m > prev ? pow2_ceil(m) : prev;
      st_shared_f32(L::vnorm(smem, phase, 0, b), prev > 0.f ? prev * pow2_inverse(next) : 1.f);
      st_shared_f32(L::vnorm(smem, phase, 1, b), next);
    }
    named_sync(kScalesSeen, 128);  // every C_b of the pair is in shared memory for the factors
  }

  template <class Params>
  static __device__ void run(const Params& p, u32 smem, const Barriers& bar, int t) {
    const int tid = threadIdx.x % 128;
    const int g = tid / 8, c = tid % 8;
    const int len = sparse::valid_length(p, t);
    const int pairs = sparse::num_pairs(len);
    const int* idx_row = p.indices + (i64)t * p.idx_row_stride;
#pragma unroll 1
    for (int buf = 0; buf < (pairs > 0 ? 2 : 0); ++buf) {  // the first pair's rows
      int rows[4];
      load_rows(p, idx_row, len, buf, g, rows);
      gather(p, smem, bar, buf, rows, g, c);
    }
    for (int pair = 0; pair < pairs; ++pair) {
      const u32 phase = pair & 1;
      // The next pair's row ids, loaded now so that their latency hides behind this pair's
      // transposes (loaded just before its gathers, it was on the producer's path: ~1.6 K cycles
      // per pair of 10 K, measured with clock64 counters in call n).
      int next_rows[2][4];
#pragma unroll
      for (int buf = 0; buf < 2; ++buf) load_rows(p, idx_row, len, 2 * (pair + 1) + buf, g, next_rows[buf]);
      mbar_wait(bar.kready(0), phase);
      mbar_wait(bar.kready(1), phase);
      // This thread's key (tid % 64) of buffer tid / 64 and its four scales, and the pair's new
      // normalisers (the factors go out per buffer below, once its previous P V are done).
      // From an opaque thread id: the addresses below are formed here each pair instead of being
      // hoisted out of the loop into registers the producer does not have.
      const int me = (int)opaque32(tid);
      const int mine = me / 64, key = me % 64;
      float inv[4];  // 1 / C_b of this pair (four scale blocks)
      if constexpr (SF::kNB > 4) {
        wide_scale_stage(smem, tid, mine, key, pair, phase);
      } else if constexpr (Cfg::kScaled) {
        const int warp = tid / 32, lane = tid % 32;
        float mx[4];
        float4 ks4;
        asm volatile("ld.shared.v4.f32 {%0, %1, %2, %3}, [%4];\n"
                     : "=f"(ks4.x), "=f"(ks4.y), "=f"(ks4.z), "=f"(ks4.w)
                     : "r"(smem + L::kKs + 4 * L::kKsStride * (mine * 64 + key))
                     : "memory");
        const float ks[4] = {ks4.x, ks4.y, ks4.z, ks4.w};
#pragma unroll
        for (int b = 0; b < 4; ++b) {
          mx[b] = fabsf(ks[b]);
#pragma unroll
          for (int o = 16; o > 0; o /= 2) mx[b] = fmaxf(mx[b], __shfl_xor_sync(0xffffffffu, mx[b], o));
        }
        const u32 red = smem + L::kRed + 64 * phase;
        if (lane == 0)
          asm volatile("st.shared.v4.f32 [%0], {%1, %2, %3, %4};\n" ::"r"(red + 16 * warp), "f"(mx[0]), "f"(mx[1]),
                       "f"(mx[2]), "f"(mx[3])
                       : "memory");
        named_sync(kScalesSeen, 128);
#pragma unroll
        for (int b = 0; b < 4; ++b) {
          float m = 0.f;
#pragma unroll
          for (int w = 0; w < 4; ++w) m = fmaxf(m, ld_shared_f32(red + 4 * (w * 4 + b)));
          // C_b so far: the previous pair's (0 before the first nonzero scale), read back from
          // shared memory rather than held in registers across the loop.
          const float prev = pair > 0 ? ld_shared_f32(smem + L::kVnorm + 32 * (phase ^ 1) + 16 + 4 * b) : 0.f;
          const float next = m > prev ? pow2_ceil(m) : prev;
          // Powers of two: 1 / next by its exponent bits, and prev / next as a product, both exact
          // (a division here was a ~100-cycle chain, four per pair, on the producer's path).
          inv[b] = next > 0.f ? pow2_inverse(next) : 0.f;
          const float grow = prev > 0.f ? prev * inv[b] : 1.f;
          // The pair's factors, double-buffered by parity: the previous pair's readers may still
          // be before their P V (they read them first); the pair before has passed vfree.
          if (tid == 0) {
            st_shared_f32(smem + L::kVnorm + 32 * phase + 4 * b, grow);
            st_shared_f32(smem + L::kVnorm + 32 * phase + 16 + 4 * b, next);
          }
        }
      }
#pragma unroll 1
      for (int buf = 0; buf < 2; ++buf) {
        mbar_wait(bar.vfree(buf), phase ^ 1);  // the previous pair's P V are done with V^T and the factors
        if constexpr (SF::kNB > 4) {
          if (mine == buf) {
#pragma unroll 1
            for (int b0 = 0; b0 < SF::kNB; b0 += 4) {
              float ks[4];  // four of the key's scales by one 16-byte load (scalar ones: 4-way conflicts)
              asm volatile("ld.shared.v4.f32 {%0, %1, %2, %3}, [%4];\n"
                           : "=f"(ks[0]), "=f"(ks[1]), "=f"(ks[2]), "=f"(ks[3])
                           : "r"(smem + L::kKs + 4 * ((buf * 64 + key) * L::kKsStride + b0))
                           : "memory");
#pragma unroll
              for (int i = 0; i < 4; ++i) {
                const float next = ld_shared_f32(L::vnorm(smem, phase, 1, b0 + i));
                st_shared_f32(smem + L::kFv + 4 * ((buf * SF::kNB + b0 + i) * 64 + key),
                              ks[i] * (next > 0.f ? pow2_inverse(next) : 0.f));
              }
            }
          }
        } else if constexpr (Cfg::kScaled) {
          if (mine == buf) {
#pragma unroll
            for (int b = 0; b < 4; ++b) {
              st_shared_f32(smem + L::kFv + 4 * ((buf * 4 + b) * 64 + key),
                            ld_shared_f32(smem + L::kKs + 4 * ((buf * 64 + key) * L::kKsStride + b)) * inv[b]);
            }
          }
        }
        transpose(smem, buf);
        fence_async_shared();  // V^T written by st.shared, read by wgmma
        mbar_arrive(bar.vready(buf));
      }
      // The next pair's rows, once each buffer's Q K^T is done: after both transposes, which the
      // consumers wait for sooner (each V^T is needed right after its block's softmax).
      if (pair + 1 < pairs) {
        // Every producer warp is past its transposes and factor stores of both buffers: a warp's
        // gather writes keys of every warp's transpose group, so a lagging warp would read the
        // next pair's rows.
        named_sync(kTransposed, 128);
#pragma unroll
        for (int buf = 0; buf < 2; ++buf) {
          mbar_wait(bar.kfree(buf), phase);  // its Q K^T and flags were read
          gather(p, smem, bar, buf, next_rows[buf], g, c);
        }
      }
    }
  }
};

// ------------------------------------------------------------------------------------------------
// Consumers.

struct Regs {
  float o[128];   // 64 rows x 256 output columns (O_b in units of C_b)
  float s[32];    // scores, then probabilities
  float sb[32];   // one scale block's e4m3 chain
  u32 pa[2][2][4];  // own P' as e4m3 A fragments: [column block][k32 step]
  float m[2], l[2], mx[2];
  float sl[2];    // the row's softmax scale (log2 domain) times qs
};

// Quantize Q: consumer thread (0..255) = (row tid / 4, part tid % 4): latent values
// [128 part, 128 part + 128) (tile `part`) and rope values [16 part, 16 part + 16).
template <class Cfg, class Params>
__device__ __forceinline__ void quantize_q(const Params& p, u32 smem, int t, int head0) {
  using L = LayoutFor<Cfg>;
  const int tid = threadIdx.x;  // 0..255
  const int row = tid / 4, part = tid % 4;
  const bool ok = head0 + row < p.heads;
  const u16* src = p.q + (i64)t * p.q_row_stride + (i64)(ok ? head0 + row : 0) * p.q_head_stride;
  uint4 v[16];
#pragma unroll
  for (int i = 0; i < 16; ++i)
    v[i] = ok ? __ldg(reinterpret_cast<const uint4*>(src + 128 * part) + i) : make_uint4(0, 0, 0, 0);
  float amax = 0.f;
#pragma unroll
  for (int i = 0; i < 16; ++i) {
    const u32 w[4] = {v[i].x, v[i].y, v[i].z, v[i].w};
#pragma unroll
    for (int j = 0; j < 4; ++j)
      amax = fmaxf(amax, fmaxf(fabsf(__uint_as_float(w[j] << 16)), fabsf(__uint_as_float(w[j] & 0xffff0000u))));
  }
  amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 1));
  amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 2));
  const float qs = amax > 0.f ? pow2_ceil(amax * (1.f / 448.f)) : 1.f;
  const float inv = 1.f / qs;  // a power of two: exact
  const u32 tile = smem + L::kQ8 + part * kTileBytes;
#pragma unroll
  for (int i = 0; i < 8; ++i) {  // 16-byte chunk i: values 16 i ... 16 i + 15 of the part
    u32 out[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const u32 w0 = (j < 2 ? (j == 0 ? v[2 * i].x : v[2 * i].z) : (j == 2 ? v[2 * i + 1].x : v[2 * i + 1].z));
      const u32 w1 = (j < 2 ? (j == 0 ? v[2 * i].y : v[2 * i].w) : (j == 2 ? v[2 * i + 1].y : v[2 * i + 1].w));
      out[j] = pack_e4m3x4(__uint_as_float(w0 << 16) * inv, __uint_as_float(w0 & 0xffff0000u) * inv,
                                __uint_as_float(w1 << 16) * inv, __uint_as_float(w1 & 0xffff0000u) * inv);
    }
    asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};\n" ::"r"(tile + swizzled(row, i)), "r"(out[0]), "r"(out[1]),
                 "r"(out[2]), "r"(out[3])
                 : "memory");
  }
  // Rope: 16 bf16 values (two 16-byte chunks of the rope tile), divided by qs.
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    uint4 r = ok ? __ldg(reinterpret_cast<const uint4*>(src + 512 + 16 * part) + h) : make_uint4(0, 0, 0, 0);
    const u32 w[4] = {r.x, r.y, r.z, r.w};
    u32 out[4];
#pragma unroll
    for (int j = 0; j < 4; ++j)
      out[j] = pack_bf16x2(__uint_as_float(w[j] << 16) * inv, __uint_as_float(w[j] & 0xffff0000u) * inv);
    asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};\n" ::"r"(smem + L::kQR + swizzled(row, 2 * part + h)),
                 "r"(out[0]), "r"(out[1]), "r"(out[2]), "r"(out[3])
                 : "memory");
  }
  if (part == 0) st_shared_f32(smem + L::kQs + 4 * row, qs);
  fence_async_shared();  // Q written by st.shared, read by wgmma
  named_sync(kQReady, 256);
}

// S of buffer `buf` (64 heads x 64 keys): the rope chain, then the latent chains. `after_first_wait`
// runs once the first chain (and every earlier wgmma of this warpgroup) has completed.
template <class Cfg, class F>
__device__ __forceinline__ void scores(Regs& r, u32 smem, int buf, F after_first_wait) {
  using L = LayoutFor<Cfg>;
  using SF = ScaleFormat<Cfg>;
  const int lane = threadIdx.x % 32;
  const u64 qr = opaque(desc_k_major<128>(smem + L::kQR));
  const u64 kr = opaque(desc_k_major<128>(L::kr(smem, buf)));
  const u64 q8 = opaque(desc_k_major<128>(smem + L::kQ8));
  const u64 k8 = opaque(desc_k_major<128>(L::k8(smem, buf)));
  pin_registers(r.s);
  wgmma_fence();
#pragma unroll
  for (int ks = 0; ks < 4; ++ks) Wgmma<64>::ss(r.s, qr + desc_offset(ks * 32), kr + desc_offset(ks * 32), ks > 0);
  if constexpr (!Cfg::kScaled) {
#pragma unroll
    for (int tile = 0; tile < 4; ++tile)
#pragma unroll
      for (int ks = 0; ks < 4; ++ks) {
        const u64 off = desc_offset(tile * kTileBytes + ks * 32);
        WgmmaE4m3<64>::ss(r.s, q8 + off, k8 + off, 1);
      }
    wgmma_commit();
    wgmma_wait<0>();
    pin_registers(r.s);
    after_first_wait();
  } else {
    wgmma_commit();
#pragma unroll 1
    for (int b = 0; b < SF::kNB; ++b) {
      pin_registers(r.sb);
      wgmma_fence();
#pragma unroll
      for (int ks = 0; ks < SF::kW / 32; ++ks) {
        const u64 off = SF::kNB == 4 ? desc_offset(b * kTileBytes + ks * 32) : desc_offset((b * SF::kW / 128) * kTileBytes + (b * SF::kW) % 128 + ks * 32);
        WgmmaE4m3<64>::ss(r.sb, q8 + off, k8 + off, ks > 0);
      }
      wgmma_commit();
      wgmma_wait<0>();
      pin_registers(r.sb);
      pin_registers(r.s);
      if (b == 0) after_first_wait();
      const u32 ks_row = smem + L::kKs + 4 * ((buf * 64 + 2 * (lane % 4)) * L::kKsStride + b);
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const float2 k = make_float2(ld_shared_f32(ks_row + 4 * L::kKsStride * 8 * j),
                                     ld_shared_f32(ks_row + 4 * L::kKsStride * (8 * j + 1)));
        r.s[4 * j + 0] = fmaf(k.x, r.sb[4 * j + 0], r.s[4 * j + 0]);
        r.s[4 * j + 1] = fmaf(k.y, r.sb[4 * j + 1], r.s[4 * j + 1]);
        r.s[4 * j + 2] = fmaf(k.x, r.sb[4 * j + 2], r.s[4 * j + 2]);
        r.s[4 * j + 3] = fmaf(k.y, r.sb[4 * j + 3], r.s[4 * j + 3]);
      }
    }
  }
}

template <class Cfg>
__device__ __forceinline__ void mask(Regs& r, u32 smem, int buf) {
  using L = LayoutFor<Cfg>;
  const int lane = threadIdx.x % 32;
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    u16 pair;
    asm volatile("ld.shared.u16 %0, [%1];\n" : "=h"(pair) : "r"(smem + L::kValid + buf * 64 + 8 * j + 2 * (lane % 4)));
    if (!(pair & 0xff)) r.s[4 * j + 0] = r.s[4 * j + 2] = neg_inf();
    if (!(pair >> 8)) r.s[4 * j + 1] = r.s[4 * j + 3] = neg_inf();
  }
}

__device__ __forceinline__ void block_max(const Regs& r, float (&mx)[2]) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    float m = neg_inf();
#pragma unroll
    for (int j = 0; j < 8; ++j) m = fmaxf(m, fmaxf(r.s[4 * j + 2 * h], r.s[4 * j + 2 * h + 1]));
    m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 1));
    m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 2));
    mx[h] = m * r.sl[h];
  }
}

// Rescale O (by the max correction and, per column block, the pair's V normaliser growth) and
// turn the scores into probabilities relative to m_new.
// grow(b): the growth factor of this consumer's column block b's normaliser (CB blocks).
template <bool LAZY, int CB, class Grow>
__device__ __forceinline__ void exponentiate(Regs& r, const float (&m_new)[2], Grow grow) {
  float corr[2];
#pragma unroll
  for (int h = 0; h < 2; ++h)
    corr[h] = LAZY ? sparse::max_correction(r.m[h], m_new[h]) : fast_exp2(r.m[h] - sparse::max_or_zero(m_new[h]));
  bool grown = false;
#pragma unroll
  for (int b = 0; b < CB; ++b) grown |= grow(b) != 1.f;
  if (!LAZY || any_row_moved(corr) || grown) {
    if constexpr (CB <= 2) {
#pragma unroll
      for (int j = 0; j < 32; ++j) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const float f = corr[h] * grow(j * CB / 32);
          r.o[4 * j + 2 * h] *= f;
          r.o[4 * j + 2 * h + 1] *= f;
        }
      }
    } else {  // one read of each column block's factor (grow reads shared memory)
#pragma unroll
      for (int b = 0; b < CB; ++b) {
        const float g = grow(b);
        const float f[2] = {corr[0] * g, corr[1] * g};
#pragma unroll
        for (int j = 32 / CB * b; j < 32 / CB * (b + 1); ++j) {
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            r.o[4 * j + 2 * h] *= f[h];
            r.o[4 * j + 2 * h + 1] *= f[h];
          }
        }
      }
    }
  }
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const float sub = sparse::max_or_zero(m_new[h]) - kLog2PScale;
    float sum = 0.f;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      r.s[4 * j + 2 * h] = fast_exp2(fmaf(r.s[4 * j + 2 * h], r.sl[h], -sub));
      r.s[4 * j + 2 * h + 1] = fast_exp2(fmaf(r.s[4 * j + 2 * h + 1], r.sl[h], -sub));
      sum += r.s[4 * j + 2 * h] + r.s[4 * j + 2 * h + 1];
    }
    r.l[h] = r.l[h] * corr[h] + sum;
    r.m[h] = m_new[h];
  }
}

// P' of column block `b` (global 0..3) from the probabilities of buffer `buf`, times `row` per
// row half, as e4m3 A fragments (two k32 steps).
template <class Cfg>
__device__ __forceinline__ void pack_pv(const Regs& r, u32 smem, int buf, int b, const float (&row_in)[2],
                                        u32 (&pa)[2][4]) {
  using L = LayoutFor<Cfg>;
  using SF = ScaleFormat<Cfg>;
  const int lane = threadIdx.x % 32;
  float2 f[8];
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    if constexpr (Cfg::kScaled) f[j] = ld_shared_f32x2(smem + L::kFv + 4 * ((buf * SF::kNB + b) * 64 + 8 * j + 2 * (lane % 4)));
    else f[j] = make_float2(1.f, 1.f);
  }
  const float row[2] = {row_in[0], row_in[1]};
#pragma unroll
  for (int kt = 0; kt < 2; ++kt) {
    const float* s = r.s + 16 * kt;
    const float2* fk = f + 4 * kt;
    pa[kt][0] = pack_e4m3x4(s[0] * fk[0].x * row[0], s[1] * fk[0].y * row[0], s[4] * fk[1].x * row[0],
                                 s[5] * fk[1].y * row[0]);
    pa[kt][1] = pack_e4m3x4(s[2] * fk[0].x * row[1], s[3] * fk[0].y * row[1], s[6] * fk[1].x * row[1],
                                 s[7] * fk[1].y * row[1]);
    pa[kt][2] = pack_e4m3x4(s[8] * fk[2].x * row[0], s[9] * fk[2].y * row[0], s[12] * fk[3].x * row[0],
                                 s[13] * fk[3].y * row[0]);
    pa[kt][3] = pack_e4m3x4(s[10] * fk[2].x * row[1], s[11] * fk[2].y * row[1], s[14] * fk[3].x * row[1],
                                 s[15] * fk[3].y * row[1]);
  }
}

// The A fragments into a 64 x 64 e4m3 tile (K-major, 64-byte swizzle) for the other consumer.
__device__ __forceinline__ void store_pa(const u32 (&pa)[2][4], u32 tile) {
  const int tid = threadIdx.x % 128, warp = tid / 32, lane = tid % 32;
  const int row = warp * 16 + lane / 4, t = lane % 4;
#pragma unroll
  for (int kt = 0; kt < 2; ++kt) {
    st_shared_u32(tile + swizzled64(row, 2 * kt) + 4 * t, pa[kt][0]);
    st_shared_u32(tile + swizzled64(row + 8, 2 * kt) + 4 * t, pa[kt][1]);
    st_shared_u32(tile + swizzled64(row, 2 * kt + 1) + 4 * t, pa[kt][2]);
    st_shared_u32(tile + swizzled64(row + 8, 2 * kt + 1) + 4 * t, pa[kt][3]);
  }
}

// O[:, 128 bl ...] += P'_b V_b for this consumer's column blocks bl = 0, 1 (global 2 wg + bl).
// Without scales P'_b is P for every block: one fragment set and one exchanged tile serve both.
template <class Cfg, bool kScaledPa>
__device__ __forceinline__ void issue_pv_local(Regs& r, u32 smem, int buf, int wg) {
  using L = LayoutFor<Cfg>;
#pragma unroll
  for (int bl = 0; bl < 2; ++bl) {
    const u64 v = opaque(desc_k_major<64>(L::vt(smem, buf) + (256 * wg + 128 * bl) * 64));
#pragma unroll
    for (int kt = 0; kt < 2; ++kt) WgmmaE4m3<128>::rs(r.o + 64 * bl, r.pa[kScaledPa ? bl : 0][kt], v + desc_offset(32 * kt), 1);
  }
}

template <class Cfg, bool kScaledPa>
__device__ __forceinline__ void issue_pv_remote(Regs& r, u32 smem, int buf, int wg) {
  using L = LayoutFor<Cfg>;
#pragma unroll
  for (int bl = 0; bl < 2; ++bl) {
    const u64 v = opaque(desc_k_major<64>(L::vt(smem, buf) + (256 * wg + 128 * bl) * 64));
    const u64 a = opaque(desc_k_major<64>(L::px(smem, wg ^ 1, kScaledPa ? bl : 0)));
#pragma unroll
    for (int kt = 0; kt < 2; ++kt) WgmmaE4m3<128>::ss(r.o + 64 * bl, a + desc_offset(32 * kt), v + desc_offset(32 * kt), 1);
  }
}

__device__ __forceinline__ u32 pack_f16x2(float lo, float hi) {
  u32 out;
  asm("cvt.rn.f16x2.f32 %0, %2, %1;\n" : "=r"(out) : "f"(lo), "f"(hi));
  return out;
}

// This thread's probabilities times `row` per row half, as f16, into slot `tid` of an f16 tile
// for the other consumer (whose thread tid holds the same heads and keys of its own block): 64
// bytes a thread as four 16-byte chunks 2 KB apart (consecutive threads, consecutive chunks).
__device__ __forceinline__ void store_p_f16(const Regs& r, const float (&row)[2], u32 tile) {
  const u32 slot = tile + 16 * (threadIdx.x % 128);
#pragma unroll
  for (int c = 0; c < 4; ++c) {
    u32 w[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int m = 4 * c + i;  // scores 2 m, 2 m + 1: row half m % 2
      w[i] = pack_f16x2(r.s[2 * m] * row[m % 2], r.s[2 * m + 1] * row[m % 2]);
    }
    asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};\n" ::"r"(slot + 2048 * c), "r"(w[0]), "r"(w[1]), "r"(w[2]),
                 "r"(w[3])
                 : "memory");
  }
}

// The other consumer's probabilities (store_p_f16): 16 f16x2 words, scores 2 m and 2 m + 1 in word m.
__device__ __forceinline__ void load_p_f16(u32 (&h)[16], u32 tile) {
  const u32 slot = tile + 16 * (threadIdx.x % 128);
#pragma unroll
  for (int c = 0; c < 4; ++c)
    asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(h[4 * c]), "=r"(h[4 * c + 1]), "=r"(h[4 * c + 2]), "=r"(h[4 * c + 3])
                 : "r"(slot + 2048 * c)
                 : "memory");
}

// Two f16x2 words as four e4m3 (round to nearest even, saturating), a's low half in the low byte.
__device__ __forceinline__ u32 pack_e4m3x4_f16(u32 a, u32 b) {
  u32 out;
  asm("{\n .reg .b16 lo, hi;\n cvt.rn.satfinite.e4m3x2.f16x2 lo, %1;\n cvt.rn.satfinite.e4m3x2.f16x2 hi, %2;\n"
      " mov.b32 %0, {lo, hi};\n}\n"
      : "=r"(out)
      : "r"(a), "r"(b));
  return out;
}

__device__ __forceinline__ u32 mul_f16x2(u32 a, u32 b) {
  u32 d;
  asm("mul.rn.f16x2 %0, %1, %2;\n" : "=r"(d) : "r"(a), "r"(b));
  return d;
}

// pack_pv from the other consumer's probabilities as f16x2 words (load_p_f16): P'_b = P * f_b[key]
// in f16 (P <= 2^8; a product below f16's normal range is below e4m3's smallest subnormal too),
// then e4m3. Fewer registers than 32 floats: the factors are the only other operands.
template <class Cfg>
__device__ __forceinline__ void pack_pv_f16(const u32 (&h)[16], u32 smem, int buf, int b, u32 (&pa)[2][4]) {
  using SF = ScaleFormat<Cfg>;
  const int lane = threadIdx.x % 32;
#pragma unroll
  for (int kt = 0; kt < 2; ++kt) {
    u32 f[4];  // the factors of key pairs (8 j + 2 t, 8 j + 2 t + 1), j = 4 kt ... 4 kt + 3, as f16x2
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const float2 x = ld_shared_f32x2(smem + LayoutFor<Cfg>::kFv + 4 * ((buf * SF::kNB + b) * 64 + 8 * (4 * kt + j) + 2 * (lane % 4)));
      f[j] = pack_f16x2(x.x, x.y);
    }
    const u32* w = h + 8 * kt;  // words m: key pair j = m / 2 of row half m % 2
    pa[kt][0] = pack_e4m3x4_f16(mul_f16x2(w[0], f[0]), mul_f16x2(w[2], f[1]));
    pa[kt][1] = pack_e4m3x4_f16(mul_f16x2(w[1], f[0]), mul_f16x2(w[3], f[1]));
    pa[kt][2] = pack_e4m3x4_f16(mul_f16x2(w[4], f[2]), mul_f16x2(w[6], f[3]));
    pa[kt][3] = pack_e4m3x4_f16(mul_f16x2(w[5], f[2]), mul_f16x2(w[7], f[3]));
  }
}

// Scale blocks of 64 or 32 values (ScaleFormat::kF16Exchange): O_b += P'_b V_b for this consumer
// wg's column blocks b, P'_b formed from r.s with buffer buf's factors of block b into two
// alternating fragment sets, one wgmma group (two k32 steps, N = the block's width) per block. A
// set is formed again once the group that read it has completed (kPending: groups issued before
// the first still hold both sets). kDrain: wait for every group at the end (the next Q K^T's
// accumulators do not fit beside fragment sets still being read).
template <class Cfg, bool kPending, bool kDrain, bool kFromOther>
__device__ __forceinline__ void pv_from_registers(Regs& r, u32 smem, int buf, int wg, const u32 (&h)[16]) {
  using SF = ScaleFormat<Cfg>;
  // Two sets, reused from the third block on: an even number of blocks, so that a kPending call
  // finds the previous (non-draining) call's last two groups on sets 0 and 1 in that order.
  static_assert(SF::kCB % 2 == 0 && SF::kCB >= 2, "column blocks in pairs");
  const float one[2] = {1.f, 1.f};
#pragma unroll
  for (int bl = 0; bl < SF::kCB; ++bl) {
    if (kPending || bl >= 2) wgmma_wait<1>();  // (no pin of O: a group still writes part of it)
    if constexpr (kFromOther) pack_pv_f16<Cfg>(h, smem, buf, SF::kCB * wg + bl, r.pa[bl % 2]);
    else pack_pv<Cfg>(r, smem, buf, SF::kCB * wg + bl, one, r.pa[bl % 2]);
    const u64 v = opaque(desc_k_major<64>(LayoutFor<Cfg>::vt(smem, buf) + (256 * wg + SF::kCols * bl) * 64));
    wgmma_fence();
#pragma unroll
    for (int kt = 0; kt < 2; ++kt)
      WgmmaE4m3<SF::kCols>::rs(r.o + SF::kCols / 2 * bl, r.pa[bl % 2][kt], v + desc_offset(32 * kt), 1);
    wgmma_commit();
  }
  if constexpr (kDrain) {
    wgmma_wait<0>();
    pin_registers(r.o);
  }
}

// The growth factors of consumer wg's column blocks' normalisers in the pair of this parity, as
// exponentiate reads them: up to two held in registers; more read from shared memory where used
// (registers are short with 64- and 32-value scale blocks).
template <class Cfg>
struct Growth {
  using SF = ScaleFormat<Cfg>;
  u32 base;
  float held[SF::kCB <= 2 ? SF::kCB : 1];
  __device__ __forceinline__ float operator()(int b) const {
    if constexpr (!Cfg::kScaled) return 1.f;
    else if constexpr (SF::kCB <= 2) return held[b];
    else return ld_shared_f32(base + 4 * b);
  }
};

template <class Cfg>
__device__ __forceinline__ Growth<Cfg> growth(u32 smem, int wg, u32 phase) {
  using SF = ScaleFormat<Cfg>;
  Growth<Cfg> g;
  g.base = LayoutFor<Cfg>::vnorm(smem, phase, 0, SF::kCB * wg);
  if constexpr (Cfg::kScaled && SF::kCB <= 2) {
#pragma unroll
    for (int b = 0; b < SF::kCB; ++b) g.held[b] = ld_shared_f32(g.base + 4 * b);
  }
  return g;
}

// The slot of this thread's row (half h) in its consumer's row-sum area (kSum), which is idle until
// the epilogue: where track_max keeps the running maximum with 64- and 32-value scale blocks.
template <class Cfg>
__device__ __forceinline__ u32 max_slot(u32 smem, int h) {
  const int wg = threadIdx.x / 128, warp = threadIdx.x % 128 / 32, lane = threadIdx.x % 32;
  return smem + LayoutFor<Cfg>::kSum + 4 * (wg * 64 + warp * 16 + lane / 4 + 8 * h);
}

// The true running maximum of each row's logits (the lazy max's max_logits): in registers, or with
// 64- and 32-value scale blocks (short of registers) in shared memory, by lane 0 of each quad
// (its four threads hold the same rows; the epilogue reads it back).
template <class Cfg>
__device__ __forceinline__ void track_max(Regs& r, u32 smem, const float (&m)[2]) {
  if constexpr (Cfg::kLazyMax && ScaleFormat<Cfg>::kF16Exchange) {
    if (threadIdx.x % 4 == 0) {
#pragma unroll
      for (int h = 0; h < 2; ++h) st_shared_f32(max_slot<Cfg>(smem, h), fmaxf(ld_shared_f32(max_slot<Cfg>(smem, h)), m[h]));
    }
  } else if constexpr (Cfg::kLazyMax) {
#pragma unroll
    for (int h = 0; h < 2; ++h) r.mx[h] = fmaxf(r.mx[h], m[h]);
  }
}

// The rows' softmax scales (log2 domain) times their Q scales.
template <class Cfg>
__device__ __forceinline__ void load_row_scales(Regs& r, u32 smem, float scale_log2) {
  const int tid = threadIdx.x % 128, warp = tid / 32, lane = tid % 32;
#pragma unroll
  for (int h = 0; h < 2; ++h) r.sl[h] = scale_log2 * ld_shared_f32(smem + LayoutFor<Cfg>::kQs + 4 * (warp * 16 + lane / 4 + 8 * h));
}

template <class Cfg>
__device__ __forceinline__ void init_regs(Regs& r, u32 smem, float scale_log2) {
  using L = LayoutFor<Cfg>;
  const int tid = threadIdx.x % 128, warp = tid / 32, lane = tid % 32;
#pragma unroll
  for (int i = 0; i < 128; ++i) r.o[i] = 0.f;
  r.m[0] = r.m[1] = neg_inf();
  r.mx[0] = r.mx[1] = neg_inf();
  if constexpr (Cfg::kLazyMax && ScaleFormat<Cfg>::kF16Exchange) {
    if (lane % 4 == 0) {
#pragma unroll
      for (int h = 0; h < 2; ++h) st_shared_f32(max_slot<Cfg>(smem, h), neg_inf());
    }
  }
  r.l[0] = r.l[1] = 0.f;
#pragma unroll
  for (int h = 0; h < 2; ++h) r.sl[h] = scale_log2 * ld_shared_f32(smem + L::kQs + 4 * (warp * 16 + lane / 4 + 8 * h));
}

template <class Cfg, class Params>
__device__ void epilogue(const Params& p, Regs& r, u32 smem, int wg, int t, int head0, int pairs) {
  using L = LayoutFor<Cfg>;
  using SF = ScaleFormat<Cfg>;
  const int tid = threadIdx.x % 128, warp = tid / 32, lane = tid % 32;
  if constexpr (Cfg::kLazyMax && SF::kF16Exchange) {  // track_max's slots, before the row sums take them
    __syncwarp();
#pragma unroll
    for (int h = 0; h < 2; ++h) r.mx[h] = ld_shared_f32(max_slot<Cfg>(smem, h));
    __syncwarp();
  }
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    r.l[h] += __shfl_xor_sync(0xffffffffu, r.l[h], 1);
    r.l[h] += __shfl_xor_sync(0xffffffffu, r.l[h], 2);
  }
  if (lane % 4 == 0) {
#pragma unroll
    for (int h = 0; h < 2; ++h) st_shared_f32(smem + L::kSum + 4 * (wg * 64 + warp * 16 + lane / 4 + 8 * h), r.l[h]);
  }
  if constexpr (Cfg::kLazyMax) {
    if (wg == 0) sparse::store_max(smem + L::kMax, r.mx);
  }
  named_sync(kSumReady, 256);
  if constexpr (Cfg::kLazyMax) {
    if (wg == 1) {
      float other[2];
      sparse::load_max(smem + L::kMax, other);
      r.mx[0] = fmaxf(r.mx[0], other[0]);
      r.mx[1] = fmaxf(r.mx[1], other[1]);
    }
  }
#pragma unroll
  for (int h = 0; h < 2; ++h) r.l[h] += ld_shared_f32(smem + L::kSum + 4 * ((wg ^ 1) * 64 + warp * 16 + lane / 4 + 8 * h));
  float norm[SF::kCB];
#pragma unroll
  for (int b = 0; b < SF::kCB; ++b) norm[b] = 1.f;
  if constexpr (Cfg::kScaled) {
    if (pairs > 0) {  // the last pair's normalisers
#pragma unroll
      for (int b = 0; b < SF::kCB; ++b) norm[b] = ld_shared_f32(L::vnorm(smem, (pairs - 1) & 1, 1, SF::kCB * wg + b));
    }
  }
  float inv[2];
  int heads[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    heads[h] = head0 + warp * 16 + lane / 4 + 8 * h;
    float sink = neg_inf();
    if (p.attn_sink != nullptr && heads[h] < p.heads) sink = __ldg(p.attn_sink + heads[h]) * 1.4426950408889634f;
    const float denom = r.l[h] + fast_exp2(sink + kLog2PScale - sparse::max_or_zero(r.m[h]));
    inv[h] = r.l[h] == 0.f ? 0.f : 1.f / denom;
  }
  // Through shared memory (Q and buffer 0, idle now), then 16-byte stores of 512-byte row halves.
  constexpr int kStride = 2 * Cfg::kDV + 16;
  const u32 stage = smem + wg * 512;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const u32 row = stage + (warp * 16 + lane / 4 + 8 * h) * kStride + 4 * (lane % 4);
#pragma unroll
    for (int j = 0; j < 32; ++j) {
      const float f = inv[h] * norm[j * SF::kCB / 32];
      st_shared_u32(row + 16 * j, pack_bf16x2(r.o[4 * j + 2 * h] * f, r.o[4 * j + 2 * h + 1] * f));
    }
  }
  named_sync(kEpilogue0 + wg, 128);
#pragma unroll 4
  for (int i = tid; i < 64 * 32; i += 128) {
    const int row = i / 32, chunk = i % 32;
    if (head0 + row < p.heads) {
      uint4 v;
      asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];\n"
                   : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                   : "r"(stage + row * kStride + 16 * chunk));
      *reinterpret_cast<uint4*>(p.out + (i64)t * p.o_row_stride + (i64)(head0 + row) * p.o_head_stride + wg * 256 +
                                8 * chunk) = v;
    }
  }
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    if (heads[h] < p.heads && wg == 1 && lane % 4 == 0) {
      const bool empty = r.l[h] == 0.f;
      p.max_logits[(i64)t * p.ml_row_stride + heads[h]] = empty ? neg_inf() : (Cfg::kLazyMax ? r.mx[h] : r.m[h]) * kLn2;
      p.lse[(i64)t * p.lse_row_stride + heads[h]] = empty ? pos_inf() : (r.m[h] + __log2f(r.l[h]) - kLog2PScale) * kLn2;
    }
  }
}

template <class Cfg, class Params>
__device__ void consumer0(const Params& p, u32 smem, const Barriers& bar, int t, int head0) {
  using L = LayoutFor<Cfg>;
  using SF = ScaleFormat<Cfg>;
  Regs r;
  quantize_q<Cfg>(p, smem, t, head0);
  init_regs<Cfg>(r, smem, p.scale_log2);
  const int pairs = sparse::num_pairs(sparse::valid_length(p, t));
  for (int pair = 0; pair < pairs; ++pair) {
    const u32 phase = pair & 1;
    // With 64- or 32-value scale blocks the rows' softmax scales are read again each pair rather
    // than held (two registers the P V from f16 words need).
    if constexpr (SF::kF16Exchange) load_row_scales<Cfg>(r, smem, p.scale_log2);
    if (pair == 0) {
      mbar_wait(bar.kready(0), phase);
      scores<Cfg>(r, smem, 0, [] {});
    }
    mask<Cfg>(r, smem, 0);
    mbar_arrive(bar.kfree(0));
    float m0[2];
    block_max(r, m0);
    track_max<Cfg>(r, smem, m0);
#pragma unroll
    for (int h = 0; h < 2; ++h) m0[h] = fold_max<Cfg::kLazyMax>(r.m[h], m0[h]);
    sparse::store_max(smem + L::kMax, m0);
    named_arrive(kMax0Ready, 256);
    mbar_wait(bar.vready(0), phase);
    exponentiate<Cfg::kLazyMax, SF::kCB>(r, m0, growth<Cfg>(smem, 0, phase));
    const float one[2] = {1.f, 1.f};
    const u32 no_words[16] = {};  // (the local P V reads this consumer's own probabilities)
    pin_registers(r.o);
    if constexpr (SF::kF16Exchange) {
      pv_from_registers<Cfg, false, false, false>(r, smem, 0, 0, no_words);
    } else {
      pack_pv<Cfg>(r, smem, 0, 0, one, r.pa[0]);
      if constexpr (Cfg::kScaled) pack_pv<Cfg>(r, smem, 0, 1, one, r.pa[1]);
      wgmma_fence();
      issue_pv_local<Cfg, Cfg::kScaled>(r, smem, 0, 0);
      wgmma_commit();
    }
    // The pair's max from consumer 1; P' of its column blocks (or P), rescaled to it, goes to
    // consumer 1.
    named_sync(kMax1Ready, 256);
    float m1[2], f[2];
    sparse::load_max(smem + L::kMax, m1);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      f[h] = Cfg::kLazyMax ? sparse::max_correction(r.m[h], m1[h]) : fast_exp2(r.m[h] - sparse::max_or_zero(m1[h]));
      r.m[h] = m1[h];
    }
    const bool rescale = !Cfg::kLazyMax || any_row_moved(f);
    if constexpr (SF::kF16Exchange) {
      store_p_f16(r, f, L::px(smem, 0, 0));
    } else {
#pragma unroll 1
      for (int bl = 0; bl < (Cfg::kScaled ? 2 : 1); ++bl) {
        u32 pb[2][4];
        pack_pv<Cfg>(r, smem, 0, 2 + bl, f, pb);
        store_pa(pb, L::px(smem, 0, bl));
      }
      fence_async_shared();
    }
    named_arrive(kP0Ready, 256);
    wgmma_wait<0>();
    pin_registers(r.o);
    mbar_arrive(bar.vfree(0));
    if (rescale) {
#pragma unroll
      for (int i = 0; i < 64; ++i) {
        r.o[2 * i] *= f[i % 2];
        r.o[2 * i + 1] *= f[i % 2];
      }
      r.l[0] *= f[0];
      r.l[1] *= f[1];
    }
    named_sync(kP1Ready, 256);
    mbar_wait(bar.vready(1), phase);
    pin_registers(r.o);
    if constexpr (SF::kF16Exchange) {
      u32 h[16];
      load_p_f16(h, L::px(smem, 1, 0));
      pv_from_registers<Cfg, false, true, true>(r, smem, 1, 0, h);
      mbar_arrive(bar.vfree(1));  // drained: buffer 1's V^T and factors are free now
    } else {
      wgmma_fence();
      issue_pv_remote<Cfg, Cfg::kScaled>(r, smem, 1, 0);
      wgmma_commit();
    }
    if constexpr (SF::kF16Exchange) {
      if (pair + 1 < pairs) {
        mbar_wait(bar.kready(0), phase ^ 1);
        scores<Cfg>(r, smem, 0, [] {});
        pin_registers(r.o);
      }
    } else if (pair + 1 < pairs) {
      mbar_wait(bar.kready(0), phase ^ 1);
      scores<Cfg>(r, smem, 0, [&] { mbar_arrive(bar.vfree(1)); });
      pin_registers(r.o);
    } else {
      wgmma_wait<0>();
      pin_registers(r.o);
      mbar_arrive(bar.vfree(1));
    }
  }
  epilogue<Cfg>(p, r, smem, 0, t, head0, pairs);
}

template <class Cfg, class Params>
__device__ void consumer1(const Params& p, u32 smem, const Barriers& bar, int t, int head0) {
  using L = LayoutFor<Cfg>;
  using SF = ScaleFormat<Cfg>;
  Regs r;
  quantize_q<Cfg>(p, smem, t, head0);
  init_regs<Cfg>(r, smem, p.scale_log2);
  const int pairs = sparse::num_pairs(sparse::valid_length(p, t));
  for (int pair = 0; pair < pairs; ++pair) {
    const u32 phase = pair & 1;
    // With 64- or 32-value scale blocks the rows' softmax scales are read again each pair rather
    // than held (two registers the P V from f16 words need).
    if constexpr (SF::kF16Exchange) load_row_scales<Cfg>(r, smem, p.scale_log2);
    if (pair == 0) {
      mbar_wait(bar.kready(1), phase);
      scores<Cfg>(r, smem, 1, [] {});
    }
    mask<Cfg>(r, smem, 1);
    mbar_arrive(bar.kfree(1));
    float m1[2];
    block_max(r, m1);
    track_max<Cfg>(r, smem, m1);
    named_sync(kMax0Ready, 256);
    {
      float prior[2];
      sparse::load_max(smem + L::kMax, prior);
#pragma unroll
      for (int h = 0; h < 2; ++h) m1[h] = fold_max<Cfg::kLazyMax>(prior[h], m1[h]);
    }
    sparse::store_max(smem + L::kMax, m1);
    named_arrive(kMax1Ready, 256);
    mbar_wait(bar.vready(1), phase);
    exponentiate<Cfg::kLazyMax, SF::kCB>(r, m1, growth<Cfg>(smem, 1, phase));
    const float one[2] = {1.f, 1.f};
    const u32 no_words[16] = {};  // (the local P V reads this consumer's own probabilities)
    pin_registers(r.o);
    if constexpr (SF::kF16Exchange) {
      // P to consumer 0 first (it waits for it), then the local P V.
      store_p_f16(r, one, L::px(smem, 1, 0));
      named_arrive(kP1Ready, 256);
      pv_from_registers<Cfg, false, false, false>(r, smem, 1, 1, no_words);
      named_sync(kP0Ready, 256);
      mbar_wait(bar.vready(0), phase);
      u32 h[16];
      load_p_f16(h, L::px(smem, 0, 0));
      // Its first fragment sets are the local groups' last: every remote group waits for the
      // group before the previous one, so the local P V are done when the loop ends.
      pv_from_registers<Cfg, true, true, true>(r, smem, 0, 1, h);
    } else {
      pack_pv<Cfg>(r, smem, 1, 2, one, r.pa[0]);
      if constexpr (Cfg::kScaled) pack_pv<Cfg>(r, smem, 1, 3, one, r.pa[1]);
      wgmma_fence();
      issue_pv_local<Cfg, Cfg::kScaled>(r, smem, 1, 1);
      wgmma_commit();
#pragma unroll 1
      for (int bl = 0; bl < (Cfg::kScaled ? 2 : 1); ++bl) {
        u32 pb[2][4];
        pack_pv<Cfg>(r, smem, 1, bl, one, pb);
        store_pa(pb, L::px(smem, 1, bl));
      }
      named_sync(kP0Ready, 256);
      mbar_wait(bar.vready(0), phase);
      wgmma_fence();
      issue_pv_remote<Cfg, Cfg::kScaled>(r, smem, 0, 1);
      wgmma_commit();
      fence_async_shared();  // this consumer's P' stores, read by consumer 0's wgmma
      named_arrive(kP1Ready, 256);
      wgmma_wait<1>();  // the local P V: its P' registers are free, buffer 1's V^T too
    }
    mbar_arrive(bar.vfree(1));
    if constexpr (SF::kF16Exchange) {
      mbar_arrive(bar.vfree(0));  // drained: buffer 0's V^T and factors are free now
      if (pair + 1 < pairs) {
        mbar_wait(bar.kready(1), phase ^ 1);
        scores<Cfg>(r, smem, 1, [] {});
        pin_registers(r.o);
      }
    } else if (pair + 1 < pairs) {
      // The next block's scores while the exchanged P V runs (it reads P' from shared memory,
      // not S); the first wait of the scores covers it, and buffer 0's V^T is released there.
      mbar_wait(bar.kready(1), phase ^ 1);
      scores<Cfg>(r, smem, 1, [&] { mbar_arrive(bar.vfree(0)); });
      pin_registers(r.o);
    } else {
      wgmma_wait<0>();
      pin_registers(r.o);
      mbar_arrive(bar.vfree(0));
    }
  }
  epilogue<Cfg>(p, r, smem, 1, t, head0, pairs);
}

template <class Cfg>
__device__ __forceinline__ Barriers init_barriers(u32 smem) {
  Barriers bar{smem + LayoutFor<Cfg>::kBarriers};
  if (threadIdx.x == 0) {
    for (int b = 0; b < 2; ++b) {
      mbar_init(bar.kready(b), 128 + 16);  // the copying threads (cp.async noinc) + 16 flag publishers
      mbar_init(bar.vready(b), 128);       // the transposing threads
      mbar_init(bar.kfree(b), 128);        // the scoring consumer
      mbar_init(bar.vfree(b), 256);        // both consumers' P V
    }
    fence_barrier_init();
  }
  return bar;
}

}  // namespace mlagen::sm90::sparse_fp8
