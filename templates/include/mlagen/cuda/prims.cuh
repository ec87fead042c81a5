// NVIDIA primitives behind the vendor-neutral names the common headers use (PTX, warp intrinsics).
#pragma once

namespace mlagen {

// Two fp32 values rounded to nearest-even bf16, packed low | high << 16.
__device__ __forceinline__ unsigned pack_bf16x2(float lo, float hi) {
  unsigned out;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(out) : "f"(hi), "f"(lo));
  return out;
}

__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// exp2 on the FMA pipe, for finite x <= 0 (the softmax's scaled scores minus the row maximum):
// 2^x = 2^j * 2^f with j = round(x) and f = x - j in [-1/2, 1/2]; 2^f by a degree-3 polynomial
// fitted for relative error (at most 1.0e-4, below bf16's and e4m3's rounding of P); j enters
// the exponent bits by an integer add. Adding 1.5 * 2^23 leaves round(x) in the low mantissa bits
// of t, and t << 23 moves the low 9 of them (j mod 512) onto the exponent and sign. x is clamped
// at -126, so results below 2^-126 come out as about 1e-38 instead of 0 (never -inf: a masked
// score must use fast_exp2, which gives exactly 0). The MUFU unit exponentiates 16 values per
// clock and SM, the FMA pipe runs this at about 18 (7 FP32 and 2 integer instructions): moving a
// part of the exponentials here lets the two run side by side (FlashAttention-4 does this).
__device__ __forceinline__ float exp2_fma(float x) {
  x = fmaxf(x, -126.f);
  const float t = x + 12582912.f;
  const float f = x - (t - 12582912.f);
  const float p = fmaf(fmaf(fmaf(0.05500893f, f, 0.24221098f), f, 0.6932829f), f, 1.f);
  return __int_as_float(__float_as_int(p) + (__float_as_int(t) << 23));
}

__device__ __forceinline__ float fast_log2(float x) {
  float y;
  asm("lg2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

__device__ __forceinline__ unsigned smem_u32(const void* ptr) {
  return static_cast<unsigned>(__cvta_generic_to_shared(ptr));
}

__device__ __forceinline__ float pos_inf() { return __int_as_float(0x7f800000); }
__device__ __forceinline__ float neg_inf() { return __int_as_float(0xff800000); }

// Read-only global load through the non-coherent cache.
template <typename T>
__device__ __forceinline__ T ldg(const T* p) { return __ldg(p); }

// Lane within a group of 32 and the ballot of those 32 lanes (a full warp on NVIDIA).
__device__ __forceinline__ int lane32() { return threadIdx.x & 31; }
__device__ __forceinline__ unsigned ballot32(bool pred) { return __ballot_sync(0xffffffffu, pred); }
__device__ __forceinline__ int clz32(unsigned x) { return __clz(x); }
__device__ __forceinline__ int popc32(unsigned x) { return __popc(x); }

}  // namespace mlagen
