// Warpgroup MMA (wgmma) helpers: shared-memory matrix descriptors for swizzled K-major and
// MN-major tiles, the fence/commit/wait protocol, and register pinning around async MMAs.
#pragma once
#include "mlagen/common/types.cuh"
#include "mlagen/sm90/wgmma_ops.cuh"

namespace mlagen::sm90 {

// Swizzle of a tile made of TMA boxes whose rows are SW bytes wide: the 16-byte chunk index is
// XORed with bits of the row (CuTe Swizzle<log2(SW/16), 4, 3> on byte offsets).
template <int SW>
__device__ __forceinline__ u32 swizzle_offset(u32 offset) {
  return offset ^ (((offset >> 7) & (SW / 16 - 1)) << 4);
}

template <int SW>
struct SwizzleMode;
template <>
struct SwizzleMode<128> {
  static constexpr u64 value = 1;
};
template <>
struct SwizzleMode<64> {
  static constexpr u64 value = 2;
};
template <>
struct SwizzleMode<32> {
  static constexpr u64 value = 3;
};

// Descriptor of a K-major operand: rows of SW bytes, 8-row groups SBO = 8 * SW bytes apart.
// Advancing along K inside a row moves the start address; the hardware applies the swizzle.
template <int SW>
__device__ __forceinline__ u64 desc_k_major(u32 smem_addr) {
  constexpr u64 sbo = 8 * SW;
  return (u64)((smem_addr & 0x3FFFF) >> 4) | ((u64)1 << 16) | ((sbo >> 4) << 32) | (SwizzleMode<SW>::value << 62);
}

// Descriptor of an MN-major operand stored as column blocks of SW bytes: LBO is the distance
// between column blocks along MN, SBO the distance between 8-row groups along K.
template <int SW>
__device__ __forceinline__ u64 desc_mn_major(u32 smem_addr, u32 column_block_bytes) {
  constexpr u64 sbo = 8 * SW;
  return (u64)((smem_addr & 0x3FFFF) >> 4) | ((u64)((column_block_bytes & 0x3FFFF) >> 4) << 16) |
         ((sbo >> 4) << 32) | (SwizzleMode<SW>::value << 62);
}

// A descriptor advanced by `bytes` along its operand: the start address is the low field (address >> 4),
// so adding bytes >> 4 moves it without rebuilding the descriptor (one add per MMA instead of an
// and, a shift and an or). Valid while the address stays inside the 256 KB shared window.
__device__ __forceinline__ constexpr u64 desc_offset(u32 bytes) { return bytes >> 4; }

// `desc` advanced by `bytes` with a 32-bit add on its low word, which holds the start address (bits
// 0-13) and the leading byte offset: the address stays inside shared memory, so nothing carries
// into the high word. A 64-bit add costs ptxas two adds with carry and two moves per MMA when the
// descriptor feeds a wgmma with two shared-memory operands; this costs one add.
__device__ __forceinline__ u64 desc_advance(u64 desc, u32 bytes) {
  u64 out;
  asm("mov.b64 %0, {%1, %2};" : "=l"(out) : "r"((u32)desc + (bytes >> 4)), "r"((u32)(desc >> 32)));
  return out;
}

// Hide a value from the optimiser so that per-MMA descriptors are formed at their use (one add
// each) instead of being hoisted out of the loop into dozens of live 64-bit registers.
__device__ __forceinline__ u64 opaque(u64 x) {
  asm volatile("" : "+l"(x));
  return x;
}

// End the basic block here without a cost worth counting: a branch on a kernel argument that the
// host guarantees is positive, so it always jumps over the instruction after it, but ptxas cannot
// know that. ptxas's scheduler hoists `wgmma.wait_group` to the top of its basic block (13.0: above
// the whole softmax, which then no longer overlaps the P V in flight; docs/notes.md), and a block
// boundary stops it. The skipped instruction must not end the thread: with a `trap` there (the
// first version) ptxas 13.0 serialised every wgmma of the kernel for "insufficient register
// resources" (C7512) and spilled 232 bytes, whatever the register budget.
__device__ __forceinline__ void schedule_boundary(int positive) {
  // Inline asm, not an `if`: the optimiser would hoist a loop-invariant test and unswitch the loop.
  // Labels inside a { } block are local to it, so the asm can be inlined any number of times.
  asm volatile("{\n.reg .pred p;\nsetp.gt.s32 p, %0, 0;\n@p bra.uni SKIP;\nnanosleep.u32 1;\nSKIP:\n}\n" ::"r"(positive));
}

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }

__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }

template <int N>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}

// Keep the compiler from moving reads or writes of accumulator registers across an async MMA's
// issue or wait (it cannot see that wgmma writes them later).
template <int N>
__device__ __forceinline__ void pin_registers(float (&r)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(r[i])::"memory");
}

template <int N>
__device__ __forceinline__ void pin_registers(u32 (&r)[N][4]) {
#pragma unroll
  for (int i = 0; i < N; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) asm volatile("" : "+r"(r[i][j])::"memory");
}

template <int REGS>
__device__ __forceinline__ void set_max_registers_inc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(REGS));
}

template <int REGS>
__device__ __forceinline__ void set_max_registers_dec() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(REGS));
}

}  // namespace mlagen::sm90
