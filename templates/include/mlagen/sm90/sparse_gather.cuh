// Gathering rows of a table into shared memory with cp.async (16 bytes per thread), for kernels
// whose rows come from an index list (sparse attention) and so cannot be described to TMA.
// Invalid rows are zero-filled without being read (src-size 0 from a harmless in-bounds address).
// And the way back: rows of shared memory stored by 1-D bulk copies (addresses the kernel computes).
#pragma once
#include "mlagen/common/types.cuh"

namespace mlagen::sm90 {

// An L2 policy that keeps the gathered rows resident: a table read by many CTAs (the shared KV
// cache) should outlive streaming data in L2.
__device__ __forceinline__ u64 l2_policy_evict_last() {
  u64 policy;
  asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;\n" : "=l"(policy));
  return policy;
}

// An L2 policy for data read once (the queries): its lines are the first to go, so streaming it
// does not push the gathered rows out.
__device__ __forceinline__ u64 l2_policy_evict_first() {
  u64 policy;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(policy));
  return policy;
}

// 16 bytes from global to shared memory, bypassing L1; `valid == false` writes zeros and reads
// nothing. With kEvictLast (the name of its first use) the copy takes `policy`, whichever it is.
template <bool kEvictLast>
__device__ __forceinline__ void cp_async_16(u32 dst, const void* src, bool valid, u64 policy) {
  const u32 src_bytes = valid ? 16 : 0;
  if constexpr (kEvictLast) {
    asm volatile("cp.async.cg.shared.global.L2::cache_hint.L2::256B [%0], [%1], 16, %2, %3;\n" ::"r"(dst),
                 "l"(src), "r"(src_bytes), "l"(policy)
                 : "memory");
  } else {
    asm volatile("cp.async.cg.shared.global.L2::256B [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes)
                 : "memory");
  }
}

// Arrive on `bar` once this thread's earlier cp.async copies have landed. `noinc`: the arrival is
// one of the barrier's initialised count (the barrier counts the copying threads).
__device__ __forceinline__ void cp_async_arrive_noinc(u32 bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(bar) : "memory");
}

// A 1-D bulk copy (no tensor map) of `bytes` (a multiple of 16, both addresses 16-byte aligned)
// from shared to global memory, in the issuing thread's bulk group.
__device__ __forceinline__ void bulk_store(void* dst, u32 src, u32 bytes) {
  asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;\n" ::"l"(reinterpret_cast<u64>(dst)),
               "r"(src), "r"(bytes)
               : "memory");
}

__device__ __forceinline__ void bulk_commit() { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }

// Wait until this thread's committed bulk copies have read their shared memory (it may be reused).
__device__ __forceinline__ void bulk_wait_read() { asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory"); }

}  // namespace mlagen::sm90
