// MFMA atoms of gfx9 (CDNA3/CDNA4): 32x32xK bf16 products into 16 fp32 accumulator registers.
//
// Operand fragments are stored as K/4 32-bit words per lane (K/2 bf16), in the order of
// mfma_layout.cuh; each atom converts them to the vector type its builtin takes.
#pragma once
#include "mlagen/gfx9/mfma_layout.cuh"

namespace mlagen {
namespace gfx9 {

typedef float f32x16 __attribute__((ext_vector_type(16)));
typedef short i16x4 __attribute__((ext_vector_type(4)));
typedef __bf16 bf16x8 __attribute__((ext_vector_type(8)));
typedef unsigned u32x2 __attribute__((ext_vector_type(2)));
typedef unsigned u32x4 __attribute__((ext_vector_type(4)));

// v_mfma_f32_32x32x8_bf16 (CDNA3 and CDNA4): A and B are 4 bf16 per lane.
struct MfmaBf16K8 {
  static constexpr int kK = 8;
  static constexpr int kRun = 4;  // consecutive k per lane (mfma_layout.cuh)
  static constexpr int kWords = 2;
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

}  // namespace gfx9
}  // namespace mlagen
