// Basic integer types, bf16 packing and small arithmetic helpers shared by every CUDA kernel.
// NVRTC compiles without the C++ standard library, so nothing here includes a system header.
#pragma once

namespace mlagen {

using u8 = unsigned char;
using u16 = unsigned short;
using u32 = unsigned int;
using i32 = int;
using i64 = long long;
using u64 = unsigned long long;

// Opaque 128-byte TMA descriptor, encoded on the host by cuTensorMapEncodeTiled.
struct alignas(64) TensorMap {
  u64 opaque[16];
};

template <int A, int B>
struct CeilDiv {
  static constexpr int value = (A + B - 1) / B;
};

__device__ __forceinline__ int ceil_div(int a, int b) { return (a + b - 1) / b; }

// Floor division that is correct for negative numerators.
__device__ __forceinline__ int floor_div(int a, int b) { return a >= 0 ? a / b : -((-a + b - 1) / b); }

// Two fp32 values rounded to nearest-even bf16, packed low | high << 16.
__device__ __forceinline__ u32 pack_bf16x2(float lo, float hi) {
  u32 out;
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

__device__ __forceinline__ u32 smem_u32(const void* ptr) {
  return static_cast<u32>(__cvta_generic_to_shared(ptr));
}

constexpr float kLn2 = 0.6931471805599453f;

__device__ __forceinline__ float pos_inf() { return __int_as_float(0x7f800000); }
__device__ __forceinline__ float neg_inf() { return __int_as_float(0xff800000); }

}  // namespace mlagen
