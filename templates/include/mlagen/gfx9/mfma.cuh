// MFMA atoms of gfx9 (CDNA3/CDNA4): 32x32xK bf16 or fp8 products into 16 fp32 accumulator registers.
//
// Operand fragments are stored as kWords 32-bit words per lane (K/2 elements of kBytes each,
// byte-packed little-endian: element i is byte i % (4 / kBytes) of word i / (4 / kBytes)), in the
// order of mfma_layout.cuh; each atom converts them to the vector type its builtin takes.
#pragma once
#include "mlagen/gfx9/mfma_layout.cuh"

namespace mlagen {
namespace gfx9 {

typedef float f32x16 __attribute__((ext_vector_type(16)));
typedef short i16x4 __attribute__((ext_vector_type(4)));
typedef __bf16 bf16x8 __attribute__((ext_vector_type(8)));
typedef unsigned u32x2 __attribute__((ext_vector_type(2)));
typedef unsigned u32x4 __attribute__((ext_vector_type(4)));
typedef int i32x8 __attribute__((ext_vector_type(8)));
typedef long i64_t;

// v_mfma_f32_32x32x8_bf16 (CDNA3 and CDNA4): A and B are 4 bf16 per lane.
struct MfmaBf16K8 {
  static constexpr int kK = 8;
  static constexpr int kRun = 4;  // consecutive k per lane (mfma_layout.cuh)
  static constexpr int kWords = 2;
  static constexpr int kBytes = 2;  // bytes per element
  // A template, so the builtin is only checked where the atom is used (gfx942 lacks K = 16).
  template <typename Frag>
  __device__ static __forceinline__ void mma(f32x16& acc, const Frag& a, const Frag& b) {
#if __has_builtin(__builtin_amdgcn_mfma_f32_32x32x8bf16_1k)
    const u32x2 av = {a[0], a[1]}, bv = {b[0], b[1]};
    acc = __builtin_amdgcn_mfma_f32_32x32x8bf16_1k(__builtin_bit_cast(i16x4, av), __builtin_bit_cast(i16x4, bv),
                                                   acc, 0, 0, 0);
#else
static_assert(sizeof(Frag) == 0, "v_mfma_f32_32x32x8_bf16 needs gfx90a or later (and a clang that knows it)");
#endif
  }
};

// v_mfma_f32_32x32x16_bf16 (CDNA4 only): A and B are 8 bf16 per lane; twice the K of CDNA3's.
struct MfmaBf16K16 {
  static constexpr int kK = 16;
  static constexpr int kRun = 8;
  static constexpr int kWords = 4;
  static constexpr int kBytes = 2;
  template <typename Frag>
  __device__ static __forceinline__ void mma(f32x16& acc, const Frag& a, const Frag& b) {
#if __has_builtin(__builtin_amdgcn_mfma_f32_32x32x16_bf16)
    const u32x4 av = {a[0], a[1], a[2], a[3]}, bv = {b[0], b[1], b[2], b[3]};
    acc = __builtin_amdgcn_mfma_f32_32x32x16_bf16(__builtin_bit_cast(bf16x8, av), __builtin_bit_cast(bf16x8, bv),
                                                  acc, 0, 0, 0);
#else
static_assert(sizeof(Frag) == 0, "v_mfma_f32_32x32x16_bf16 exists on gfx950 only: use k_atom 8 (32x32x8) elsewhere");
#endif
  }
};

// v_mfma_scale_f32_32x32x64_f8f6f4 with fp8 (OCP e4m3) A and B (CDNA4 only): 32 bytes per lane,
// in two runs of 16 k. The E8M0 block scales are 127 (2^0): the descale factors are per tensor or
// per head, so they are folded into the softmax scale and the output once rather than per block.
struct MfmaF8K64 {
  static constexpr int kK = 64;
  static constexpr int kRun = 16;
  static constexpr int kWords = 8;
  static constexpr int kBytes = 1;
  template <typename Frag>
  __device__ static __forceinline__ void mma(f32x16& acc, const Frag& a, const Frag& b) {
#if __has_builtin(__builtin_amdgcn_mfma_scale_f32_32x32x64_f8f6f4)
    const i32x8 av = {(int)a[0], (int)a[1], (int)a[2], (int)a[3], (int)a[4], (int)a[5], (int)a[6], (int)a[7]};
    const i32x8 bv = {(int)b[0], (int)b[1], (int)b[2], (int)b[3], (int)b[4], (int)b[5], (int)b[6], (int)b[7]};
    // Format codes 0, 0: A and B are fp8 e4m3 (OCP); op_sel 0 and scale exponents 127 (= 1.0).
    acc = __builtin_amdgcn_mfma_scale_f32_32x32x64_f8f6f4(av, bv, acc, 0, 0, 0, 127, 0, 127);
#else
    static_assert(sizeof(Frag) == 0, "v_mfma_scale_f32_32x32x64_f8f6f4 exists on gfx950 only");
#endif
  }
};

// v_mfma_f32_32x32x16_fp8_fp8 (CDNA3; FNUZ e4m3 on gfx942): A and B are 8 fp8 per lane, one run
// of 8 k (k = 8 * (lane / 32) + i). No block scales: descales are folded in as for MfmaF8K64.
struct MfmaFp8K16 {
  static constexpr int kK = 16;
  static constexpr int kRun = 8;
  static constexpr int kWords = 2;
  static constexpr int kBytes = 1;
  template <typename Frag>
  __device__ static __forceinline__ void mma(f32x16& acc, const Frag& a, const Frag& b) {
#if __has_builtin(__builtin_amdgcn_mfma_f32_32x32x16_fp8_fp8)
    const u32x2 av = {a[0], a[1]}, bv = {b[0], b[1]};
    acc = __builtin_amdgcn_mfma_f32_32x32x16_fp8_fp8(__builtin_bit_cast(i64_t, av), __builtin_bit_cast(i64_t, bv),
                                                     acc, 0, 0, 0);
#else
    static_assert(sizeof(Frag) == 0, "v_mfma_f32_32x32x16_fp8_fp8 needs gfx940 or later");
#endif
  }
};

// Four fp32 values in the target's fp8 e4m3 in one word (byte i = value i), round to nearest
// even: OCP e4m3fn on gfx950, e4m3fnuz on gfx942. Not saturated: the kernel converts only P
// scaled by kPScale, which stays within both formats' range (P <= 1).
__device__ __forceinline__ unsigned pack_fp8x4(float x0, float x1, float x2, float x3) {
  int w = __builtin_amdgcn_cvt_pk_fp8_f32(x0, x1, 0, false);
  w = __builtin_amdgcn_cvt_pk_fp8_f32(x2, x3, w, true);
  return static_cast<unsigned>(w);
}


}  // namespace gfx9
}  // namespace mlagen
