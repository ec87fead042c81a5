// AMD gfx9 (CDNA3/CDNA4) prelude: HIP keywords and the vendor primitives from clang builtins only.
//
// Sources are compiled by hipRTC at run time and by an offline clang (-nogpuinc, no HIP headers)
// anywhere else, so nothing here includes a header: keywords hipRTC already defines are left
// alone, and every builtin is used through __has_builtin so a missing one fails with a message.
#pragma once

#ifndef __global__
#define __global__ __attribute__((global))
#endif
#ifndef __device__
#define __device__ __attribute__((device))
#endif
#ifndef __shared__
#define __shared__ __attribute__((shared))
#endif
#ifndef __forceinline__
#define __forceinline__ inline __attribute__((always_inline))
#endif

#if !__has_builtin(__builtin_amdgcn_workitem_id_x) || !__has_builtin(__builtin_amdgcn_ds_bpermute) || \
    !__has_builtin(__builtin_amdgcn_s_barrier) || !__has_builtin(__builtin_amdgcn_exp2f) ||          \
    !__has_builtin(__builtin_amdgcn_logf)
#error "this compiler lacks the AMDGPU builtins mlagen's gfx9 kernels use; use clang >= 20 or hipRTC from ROCm >= 6.2"
#endif

namespace mlagen {

__device__ __forceinline__ int thread_x() { return __builtin_amdgcn_workitem_id_x(); }
__device__ __forceinline__ int block_x() { return __builtin_amdgcn_workgroup_id_x(); }
__device__ __forceinline__ int block_y() { return __builtin_amdgcn_workgroup_id_y(); }
__device__ __forceinline__ int lane64() { return __builtin_amdgcn_mbcnt_hi(~0u, __builtin_amdgcn_mbcnt_lo(~0u, 0u)); }

__device__ __forceinline__ int min(int a, int b) { return a < b ? a : b; }
__device__ __forceinline__ int max(int a, int b) { return a > b ? a : b; }
__device__ __forceinline__ float fmaxf(float a, float b) { return __builtin_fmaxf(a, b); }

__device__ __forceinline__ float pos_inf() { return __builtin_inff(); }
__device__ __forceinline__ float neg_inf() { return -__builtin_inff(); }

// v_exp_f32 / v_log_f32 are base 2 (flushing denormals, like PTX ex2.approx.ftz).
__device__ __forceinline__ float fast_exp2(float x) { return __builtin_amdgcn_exp2f(x); }
__device__ __forceinline__ float fast_log2(float x) { return __builtin_amdgcn_logf(x); }

// Two fp32 values rounded to nearest-even bf16, packed low | high << 16. NaN never occurs here
// (probabilities and normalised outputs), so the rounding needs no NaN case.
__device__ __forceinline__ unsigned bf16_bits(float x) {
  const unsigned u = __builtin_bit_cast(unsigned, x);
  return (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
}
__device__ __forceinline__ unsigned pack_bf16x2(float lo, float hi) { return bf16_bits(lo) | (bf16_bits(hi) << 16); }
__device__ __forceinline__ float bf16_to_float(unsigned short b) { return __builtin_bit_cast(float, unsigned(b) << 16); }

// Global loads: the kernels only read inputs through const pointers, so a plain load is what
// __ldg means on NVIDIA (AMD has no separate read-only path).
template <typename T>
__device__ __forceinline__ T ldg(const T* p) { return *p; }

// Lane within a group of 32 and the ballot of those 32 lanes: on a 64-lane wave the common
// headers' 32-candidate searches run twice over (lanes 32..63 repeat 0..31), so the low half of
// the wave's ballot is the answer a 32-lane warp would get.
__device__ __forceinline__ int lane32() { return lane64() & 31; }
__device__ __forceinline__ unsigned ballot32(bool pred) {
  return static_cast<unsigned>(__builtin_amdgcn_ballot_w64(pred));
}
__device__ __forceinline__ int clz32(unsigned x) { return x ? __builtin_clz(x) : 32; }
__device__ __forceinline__ int popc32(unsigned x) { return __builtin_popcount(x); }

// Value of ``x`` in lane ``src`` (any lane of the wave), through the LDS crossbar.
__device__ __forceinline__ float shfl(float x, int src) {
  return __builtin_bit_cast(float, __builtin_amdgcn_ds_bpermute(src << 2, __builtin_bit_cast(int, x)));
}

__device__ __forceinline__ int shfl_int(int x, int src) { return __builtin_amdgcn_ds_bpermute(src << 2, x); }

// Keeps the instruction scheduler from moving anything across this point: it otherwise hoists
// the next phase's LDS reads over the MFMAs of this one until the register file overflows.
__device__ __forceinline__ void sched_fence() {
#if __has_builtin(__builtin_amdgcn_sched_barrier)
  __builtin_amdgcn_sched_barrier(0);
#endif
}

__device__ __forceinline__ void barrier() {
  // Make this wave's LDS writes visible, then wait for every wave of the work-group.
  __builtin_amdgcn_fence(__ATOMIC_RELEASE, "workgroup");
  __builtin_amdgcn_s_barrier();
  __builtin_amdgcn_fence(__ATOMIC_ACQUIRE, "workgroup");
}

}  // namespace mlagen
