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
__device__ __forceinline__ int shfl_int(int x, int src) { return __shfl_sync(0xffffffffu, x, src); }

}  // namespace mlagen
