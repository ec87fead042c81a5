// Basic integer types and small arithmetic helpers shared by every kernel, NVIDIA and AMD.
// NVRTC, hipRTC and the offline clang compile without the C++ standard library, so nothing here
// includes a system header; the vendor primitives (bf16 packing, exp2, ballots) come first.
#pragma once
#include "mlagen/common/vendor.cuh"

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

constexpr float kLn2 = 0.6931471805599453f;

}  // namespace mlagen
