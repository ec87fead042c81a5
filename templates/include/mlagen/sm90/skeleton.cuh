// The device skeleton of the sm90 warp-specialized kernels: what each of them does around its own
// parts, in one place. A kernel K supplies
//   K::Barriers        its mbarriers: an Mbarriers<Table> (below; the table names the groups, their
//                      sizes, arrival counts and init order), at shared-memory offset K::kBarrierOffset;
//   K::Roles           Roles<Role<first warpgroup, end, registers, Part>, ...>, each Part a type with
//                      a static run(p, smem, bar, warpgroup index within the role);
//   K::kThreads, K::kCluster, K::kUniformWarpgroup, K::prefetch(p) (its TMA descriptors, or
//                      nothing), K::Work and K::work(p) (what every role needs of the CTA's work,
//                      or NoWork) and K::kWorkBeforeSync (whether it is computed before the sync);
// and names its named barriers in an enum from kFirstNamedBarrier on (id 0 is the skeleton's).
// run<K>(p) does: aligned shared-memory base -> mbarrier init -> descriptor prefetch -> CTA or
// cluster sync -> warpgroup index -> setmaxnreg -> the role's part -> trailing cluster sync.
// Inside a part: the tile loop's step is the scheduler's (scheduler.cuh: next), and an output
// staged in shared memory leaves through staged_store with the kernel's store part (below).
// The tile schedulers are in scheduler.cuh; each kernel's layout, producer, consumer and epilogue in
// its own header (mla_prefill.cuh, sparse_prefill.cuh, sparse_h16.cuh).
//
// Byte-identical SASS with the hand-written kernels this replaced (NVRTC 13.5 with -lineinfo: the
// dense and sparse 64-head ones; the H <= 16 one differs in scheduling only, docs/notes.md)
// constrains the shapes here: the role dispatch is an if-chain written out, not a
// recursion or a fold; barriers are initialised in a copy returned by value; named barriers are
// plain enumerators, not wrapped. Each of those alternatives moved instructions or registers.
#pragma once
#include "mlagen/common/types.cuh"
#include "mlagen/sm90/barrier.cuh"
#include "mlagen/sm90/scheduler.cuh"
#include "mlagen/sm90/tma.cuh"
#include "mlagen/sm90/wgmma.cuh"

namespace mlagen::sm90 {
// The dynamic shared memory (one symbol for every sm90 kernel header).
extern __shared__ __align__(1024) u8 smem_raw[];
}  // namespace mlagen::sm90

namespace mlagen::sm90::skeleton {

// The dynamic shared-memory base rounded up to the 1024-byte swizzle atom (every layout reserves
// 1 KB of slack for it).
__device__ __forceinline__ u32 aligned_smem_base() {
  const u32 base = smem_u32(smem_raw);
  return (base + 1023) & ~1023u;
}

// ------------------------------------------------------------------------------------------------
// mbarriers. A kernel's table T names its groups in an enum class T::Id ending in kCount, and says
// per group: T::group(g) (its barriers, and the ring it is initialised in: rings in increasing
// order, each slot by slot (CHUNK slots at a time), the ring's groups in enum order per slot) and
// T::arrivals(g, slot) (the count it is initialised with). Group g's barriers are contiguous, after
// those of the groups before it.

struct Group {
  int slots;      // barriers in the group
  int ring;       // init order
  int chunk = 1;  // slots of each group initialised together before the ring's next group
};

template <class T>
struct Mbarriers {
  using Id = typename T::Id;
  static constexpr int kGroups = static_cast<int>(Id::kCount);
  __host__ __device__ static constexpr int first(int g) {
    int n = 0;
    for (int i = 0; i < g; ++i) n += T::group(static_cast<Id>(i)).slots;
    return n;
  }
  static constexpr int kCount = first(kGroups);
  static constexpr int kBytes = 8 * kCount;
  __host__ __device__ static constexpr int rings() {
    int r = 0;
    for (int i = 0; i < kGroups; ++i) r = T::group(static_cast<Id>(i)).ring + 1 > r ? T::group(static_cast<Id>(i)).ring + 1 : r;
    return r;
  }
  __host__ __device__ static constexpr int ring_slots(int ring) {
    int n = 0;
    for (int i = 0; i < kGroups; ++i)
      if (T::group(static_cast<Id>(i)).ring == ring && T::group(static_cast<Id>(i)).slots > n) n = T::group(static_cast<Id>(i)).slots;
    return n;
  }
  __host__ __device__ static constexpr int ring_chunk(int ring) {
    for (int i = 0; i < kGroups; ++i)
      if (T::group(static_cast<Id>(i)).ring == ring) return T::group(static_cast<Id>(i)).chunk;
    return 1;
  }

  u32 base;
  __device__ __forceinline__ explicit Mbarriers(u32 b) : base(b) {}

  // Barrier `slot` of group G.
  template <Id G>
  __device__ __forceinline__ u32 at(int slot = 0) const {
    constexpr int kFirst = first(static_cast<int>(G));
    return base + 8 * (kFirst + slot);
  }

  // Every barrier initialised by thread 0, made visible to the async proxy before any role starts.
  __device__ __forceinline__ void init() const {
    if (threadIdx.x == 0) {
      init_ring<0>();
      fence_barrier_init();
    }
  }

 private:
  // Ring R: slot by slot (chunk slots at a time), its groups in enum order. Plain loops, as a
  // kernel writes them (the compiler unrolls the short ones).
  template <int R>
  __device__ __forceinline__ void init_ring() const {
    if constexpr (R < rings()) {
      for (int s = 0; s < ring_slots(R); s += ring_chunk(R)) init_groups<R, 0>(s);
      init_ring<R + 1>();
    }
  }
  template <int R, int G>
  __device__ __forceinline__ void init_groups(int s) const {
    if constexpr (G < kGroups) {
      constexpr Group g = T::group(static_cast<Id>(G));
      if constexpr (g.ring == R && g.chunk == 1 && g.slots == ring_slots(R)) {
        mbar_init(base + 8 * (first(G) + s), T::arrivals(static_cast<Id>(G), s));
      } else if constexpr (g.ring == R) {
        for (int c = 0; c < g.chunk; ++c)
          if (s + c < g.slots) mbar_init(base + 8 * (first(G) + s + c), T::arrivals(static_cast<Id>(G), s + c));
      }
      init_groups<R, G + 1>(s);
    }
  }
};

// K::work's result for kernels whose roles take their tiles from a scheduler.
struct NoWork {};

// A kernel's barriers (B: an Mbarriers), initialised. Returned by value: initialising the caller's
// object in place gives the same kernel other registers (ptxas 13.0), so every kernel does it so.
template <class B>
__device__ __forceinline__ B init_barriers(u32 base) {
  B bar(base);
  bar.init();
  return bar;
}

// ------------------------------------------------------------------------------------------------
// Named barriers: a kernel names its own in an enum (NamedBarrier) from kFirstNamedBarrier on, id 0
// being __syncthreads (the skeleton's CTA sync), and passes them (plus a warpgroup's offset) to
// named_sync / named_arrive (barrier.cuh). A plain enum, not a helper that takes one: every added
// inline level moves ptxas 13.0's line-info boundaries and with them its instruction order.
constexpr int kFirstNamedBarrier = 1;
__host__ __device__ constexpr bool named_barriers_fit(int end) { return end > kFirstNamedBarrier && end <= 16; }

// ------------------------------------------------------------------------------------------------
// Roles: warpgroups [FIRST, END) run PART after setmaxnreg to REGS (0: keep the launch allocation;
// a budget under it is given back, .dec, one over it taken, .inc). The roles are tested in the
// order listed, each by MATCH: kBelowEnd `wg < END` (roles in warpgroup order from 0), kOnly
// `wg == FIRST`, kFrom `wg >= FIRST`, kRest the warpgroups no role before took (the last role).
enum class Match { kBelowEnd, kOnly, kFrom, kRest };

template <int FIRST, int END, int REGS, class PART, Match MATCH = Match::kBelowEnd>
struct Role {
  static_assert(0 <= FIRST && FIRST < END, "a role holds one warpgroup or more");
  static constexpr int kFirst = FIRST, kEnd = END, kRegs = REGS;
  static constexpr Match kMatch = MATCH;
  using Part = PART;
};

template <class... R>
struct Roles {};

// A type chosen at compile time (no <type_traits> under NVRTC): a kernel's role list by its config.
template <bool C, class T, class F>
struct If {
  using type = T;
};
template <class T, class F>
struct If<false, T, F> {
  using type = F;
};

// Registers per thread at launch (launch bounds: one CTA per SM), as the host's resource model.
template <int THREADS>
constexpr int kEntryRegisters = 65536 / THREADS / 8 * 8 < 255 ? 65536 / THREADS / 8 * 8 : 255;

template <int REGS, int ENTRY>
__device__ __forceinline__ void set_registers() {
  if constexpr (REGS > 0 && REGS < ENTRY) set_max_registers_dec<REGS>();
  else if constexpr (REGS > 0) set_max_registers_inc<REGS>();
}

// Warpgroup wg's role: an if-chain written out for one to four roles, each test a constant choice
// of expressions in place (a recursive or folded chain, or the test in a function of its own, gives
// ptxas 13.0 another block order). `work`: what the kernel computed for every role before the sync.
template <class K, class Params, class B, class W, class R0>
__device__ __forceinline__ void dispatch(Roles<R0>, const Params& p, u32 smem, const B& bar, const W& work, int wg) {
  if constexpr (R0::kMatch == Match::kRest) {
    set_registers<R0::kRegs, kEntryRegisters<K::kThreads>>();
    R0::Part::run(p, smem, bar, work, wg - R0::kFirst);
  } else if ((R0::kMatch == Match::kBelowEnd && wg < R0::kEnd) || (R0::kMatch == Match::kOnly && wg == R0::kFirst) || (R0::kMatch == Match::kFrom && wg >= R0::kFirst)) {
    set_registers<R0::kRegs, kEntryRegisters<K::kThreads>>();
    R0::Part::run(p, smem, bar, work, wg - R0::kFirst);
  }
}

template <class K, class Params, class B, class W, class R0, class R1>
__device__ __forceinline__ void dispatch(Roles<R0, R1>, const Params& p, u32 smem, const B& bar, const W& work, int wg) {
  static_assert(R0::kMatch != Match::kRest, "only the last role takes the rest");
  if ((R0::kMatch == Match::kBelowEnd && wg < R0::kEnd) || (R0::kMatch == Match::kOnly && wg == R0::kFirst) || (R0::kMatch == Match::kFrom && wg >= R0::kFirst)) {
    set_registers<R0::kRegs, kEntryRegisters<K::kThreads>>();
    R0::Part::run(p, smem, bar, work, wg - R0::kFirst);
  } else if constexpr (R1::kMatch == Match::kRest) {
    set_registers<R1::kRegs, kEntryRegisters<K::kThreads>>();
    R1::Part::run(p, smem, bar, work, wg - R1::kFirst);
  } else if ((R1::kMatch == Match::kBelowEnd && wg < R1::kEnd) || (R1::kMatch == Match::kOnly && wg == R1::kFirst) || (R1::kMatch == Match::kFrom && wg >= R1::kFirst)) {
    set_registers<R1::kRegs, kEntryRegisters<K::kThreads>>();
    R1::Part::run(p, smem, bar, work, wg - R1::kFirst);
  }
}

template <class K, class Params, class B, class W, class R0, class R1, class R2>
__device__ __forceinline__ void dispatch(Roles<R0, R1, R2>, const Params& p, u32 smem, const B& bar, const W& work, int wg) {
  static_assert(R0::kMatch != Match::kRest && R1::kMatch != Match::kRest, "only the last role takes the rest");
  if ((R0::kMatch == Match::kBelowEnd && wg < R0::kEnd) || (R0::kMatch == Match::kOnly && wg == R0::kFirst) || (R0::kMatch == Match::kFrom && wg >= R0::kFirst)) {
    set_registers<R0::kRegs, kEntryRegisters<K::kThreads>>();
    R0::Part::run(p, smem, bar, work, wg - R0::kFirst);
  } else if ((R1::kMatch == Match::kBelowEnd && wg < R1::kEnd) || (R1::kMatch == Match::kOnly && wg == R1::kFirst) || (R1::kMatch == Match::kFrom && wg >= R1::kFirst)) {
    set_registers<R1::kRegs, kEntryRegisters<K::kThreads>>();
    R1::Part::run(p, smem, bar, work, wg - R1::kFirst);
  } else if constexpr (R2::kMatch == Match::kRest) {
    set_registers<R2::kRegs, kEntryRegisters<K::kThreads>>();
    R2::Part::run(p, smem, bar, work, wg - R2::kFirst);
  } else if ((R2::kMatch == Match::kBelowEnd && wg < R2::kEnd) || (R2::kMatch == Match::kOnly && wg == R2::kFirst) || (R2::kMatch == Match::kFrom && wg >= R2::kFirst)) {
    set_registers<R2::kRegs, kEntryRegisters<K::kThreads>>();
    R2::Part::run(p, smem, bar, work, wg - R2::kFirst);
  }
}

template <class K, class Params, class B, class W, class R0, class R1, class R2, class R3>
__device__ __forceinline__ void dispatch(Roles<R0, R1, R2, R3>, const Params& p, u32 smem, const B& bar, const W& work, int wg) {
  static_assert(R0::kMatch != Match::kRest && R1::kMatch != Match::kRest && R2::kMatch != Match::kRest, "only the last role takes the rest");
  if ((R0::kMatch == Match::kBelowEnd && wg < R0::kEnd) || (R0::kMatch == Match::kOnly && wg == R0::kFirst) || (R0::kMatch == Match::kFrom && wg >= R0::kFirst)) {
    set_registers<R0::kRegs, kEntryRegisters<K::kThreads>>();
    R0::Part::run(p, smem, bar, work, wg - R0::kFirst);
  } else if ((R1::kMatch == Match::kBelowEnd && wg < R1::kEnd) || (R1::kMatch == Match::kOnly && wg == R1::kFirst) || (R1::kMatch == Match::kFrom && wg >= R1::kFirst)) {
    set_registers<R1::kRegs, kEntryRegisters<K::kThreads>>();
    R1::Part::run(p, smem, bar, work, wg - R1::kFirst);
  } else if ((R2::kMatch == Match::kBelowEnd && wg < R2::kEnd) || (R2::kMatch == Match::kOnly && wg == R2::kFirst) || (R2::kMatch == Match::kFrom && wg >= R2::kFirst)) {
    set_registers<R2::kRegs, kEntryRegisters<K::kThreads>>();
    R2::Part::run(p, smem, bar, work, wg - R2::kFirst);
  } else if constexpr (R3::kMatch == Match::kRest) {
    set_registers<R3::kRegs, kEntryRegisters<K::kThreads>>();
    R3::Part::run(p, smem, bar, work, wg - R3::kFirst);
  } else if ((R3::kMatch == Match::kBelowEnd && wg < R3::kEnd) || (R3::kMatch == Match::kOnly && wg == R3::kFirst) || (R3::kMatch == Match::kFrom && wg >= R3::kFirst)) {
    set_registers<R3::kRegs, kEntryRegisters<K::kThreads>>();
    R3::Part::run(p, smem, bar, work, wg - R3::kFirst);
  }
}

// ------------------------------------------------------------------------------------------------
// The output seam: a warpgroup's tile leaves through a TMA store from a staging tile in shared
// memory. The kernel writes its fragments into the stage (its layout, its swizzle) and supplies
// STORE, a type with a static issue(args...) that issues the TMA stores of the stage (the
// warpgroup's `leader` thread runs it); the skeleton does the rest of the protocol: the proxy
// fence, the warpgroup barrier `barrier` (the stage is complete), the commit and the wait for the
// TMA engine's reads, and the barrier again (the stage may be overwritten). Arguments go by value
// (scalars, and pointers to the parameters and to locals); what the stores compute from them is
// computed in issue: a row computed at the call site instead moved instructions (ptxas with
// -lineinfo). A role that stored through TMA drains its stores before it exits (drain_stores).
template <class STORE, class... Args>
__device__ __forceinline__ void staged_store(int barrier, bool leader, Args... args) {
  fence_async_shared();
  named_sync(barrier, 128);
  if (leader) {
    STORE::issue(args...);
    tma_store_commit();
    tma_store_wait_read();
  }
  named_sync(barrier, 128);  // the staged rows have been read by the TMA engine
}

// The same seam for a stage the warpgroup's threads copy out themselves (the sparse kernel's
// staged epilogue): the barrier, then the kernel's COPY::copy(args...) run by every thread.
template <class COPY, class... Args>
__device__ __forceinline__ void staged_copy(int barrier, Args... args) {
  named_sync(barrier, 128);
  COPY::copy(args...);
}

__device__ __forceinline__ void drain_stores(int tid) {
  if (tid == 0) tma_store_wait_all();
}

// The kernel's entry: every thread of the CTA calls it.
template <class K, class Params>
__device__ __forceinline__ void run(const Params& p) {
  const u32 smem = aligned_smem_base();
  const typename K::Barriers bar = init_barriers<typename K::Barriers>(smem + K::kBarrierOffset);
  K::prefetch(p);
  // What every role needs of the CTA's work, before the sync or after it as the kernel says (the
  // two orders compile to other SASS, so each kernel keeps the one it was tuned with).
  typename K::Work work;
  if constexpr (K::kWorkBeforeSync) work = K::work(p);
  if constexpr (K::kCluster > 1) cluster_sync();  // the other CTA's barriers exist before anything is multicast into them
  else __syncthreads();
  if constexpr (!K::kWorkBeforeSync) work = K::work(p);
  // The warpgroup index, written here rather than in a function (that gives other SASS). Uniform:
  // warp-uniform by construction (a shuffle from lane 0), so the compiler keeps the index and what is
  // derived from it (wgmma descriptors) in uniform registers instead of rebuilding them per MMA.
  int wg;
  if constexpr (K::kUniformWarpgroup) wg = __shfl_sync(0xffffffffu, threadIdx.x / 128, 0);
  else wg = threadIdx.x / 128;
  dispatch<K>(typename K::Roles{}, p, smem, bar, work, wg);
  // Stay until the other CTA is done: it still multicasts into this CTA and arrives on its barriers.
  if constexpr (K::kCluster > 1) cluster_sync();
}

}  // namespace mlagen::sm90::skeleton
