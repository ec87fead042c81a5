// Tile schedulers of the sm90 kernels: which tile a CTA (or a cluster) takes next.
//
// TileScheduler: tiles 0 .. total - 1 over the grid; a cluster of CLUSTER consecutive CTAs in x
// takes one tile. kStatic: one tile per CTA (the grid covers them all); kPersistent: tile t, then t
// plus the grid's CTAs (clusters), computed alike by every warp (next_static); kDynamic: the first
// tile by position, the next ones from a global counter, fetched by one warp of the CTA (publish)
// and read by the others (read) through two shared-memory slots, each guarded by a full and an
// empty mbarrier of the kernel's (it counts the warps that read them). The sparse kernels keep
// their own work order: one item per CTA (64 heads), or a grid-stride loop over items (H <= 16).
//
// A role's tile loop is `for (int t = sched.first(); t < sched.total;) { ...; t = sched.next(t,
// id_iter, smem, bar); if constexpr (kDynamic) ++id_iter; }`: the scheduler says which tile comes
// next (next: static, persistent or the published id), the role counts the ids it has read. The
// dynamic producer, which publishes, writes its own step (publish / read). Every other shape tried
// compiled the dense kernel to other SASS (ptxas 13.0 and 13.5 with -lineinfo; docs/notes.md, the
// sm90 skeleton): a loop taking its body as a lambda, the step in the for statement's increment,
// a loop object holding the tile or the id count (members or references), the count passed by
// reference, the step returned as a {tile, count} pair (static / persistent moved), the count
// advanced in a function (dynamic moved), valid() as a function (the compare is swapped), and the
// publisher's choice made inside the scheduler.
#pragma once
#include "mlagen/common/types.cuh"
#include "mlagen/sm90/barrier.cuh"

namespace mlagen::sm90 {

enum class Scheduler { kStatic, kPersistent, kDynamic };

// B: the kernel's mbarriers (skeleton.cuh: Mbarriers), FULL and EMPTY the groups of two that guard
// the published ids, IDS their shared-memory offset (8 bytes). A const object: what changes from
// tile to tile (id_iter, the ids read or published so far) is the tile loop's.
template <Scheduler S, int CLUSTER, class B, typename B::Id FULL, typename B::Id EMPTY, int IDS>
struct TileScheduler {
  static constexpr bool kDynamic = S == Scheduler::kDynamic;
  int total;
  int* const& counter;  // kDynamic: tiles handed out past the first grid (a kernel parameter, read at use)

  __device__ __forceinline__ TileScheduler(int tiles, int* const& tile_counter) : total(tiles), counter(tile_counter) {}

  // A cluster takes one tile (of CLUSTER * BLOCK_M rows); clusters are consecutive CTAs in x.
  __device__ __forceinline__ int first() const { return blockIdx.x / CLUSTER; }

  // Static and persistent: the tile after t, computed alike by every warp.
  __device__ __forceinline__ int next_static(int t) const {
    if constexpr (S == Scheduler::kStatic) return total;
    if constexpr (CLUSTER == 1) return t + gridDim.x;
    return t + static_cast<int>(cluster_count_x());
  }

  // Dynamic: the publisher warp (all its lanes) fetches the next tile and publishes it in slot
  // id_iter % 2; the other warps read it there and release the slot.
  __device__ __forceinline__ int publish(u32 smem, const B& bar, int id_iter) const {
    const int slot = id_iter & 1;
    const int lane = threadIdx.x % 32;
    int next = 0;
    if (lane == 0) next = gridDim.x + atomicAdd(counter, 1);
    next = __shfl_sync(0xffffffffu, next, 0);
    mbar_wait(bar.template at<EMPTY>(slot), ((id_iter >> 1) & 1) ^ 1);
    if (lane == 0) {
      asm volatile("st.shared.u32 [%0], %1;\n" ::"r"(smem + IDS + 4 * slot), "r"(next) : "memory");
      mbar_arrive(bar.template at<FULL>(slot));
    }
    return next;
  }
  // The tile after t for every warp but the dynamic publisher: the next static or persistent
  // tile, or the id published in slot id_iter % 2 (the caller counts id_iter).
  __device__ __forceinline__ int next(int t, int id_iter, u32 smem, const B& bar) const {
    if constexpr (kDynamic) {
      return read(smem, bar, id_iter);
    } else {
      return next_static(t);
    }
  }
  __device__ __forceinline__ int read(u32 smem, const B& bar, int id_iter) const {
    const int slot = id_iter & 1;
    mbar_wait(bar.template at<FULL>(slot), (id_iter >> 1) & 1);
    int next;
    asm volatile("ld.shared.u32 %0, [%1];\n" : "=r"(next) : "r"(smem + IDS + 4 * slot) : "memory");
    mbar_arrive(bar.template at<EMPTY>(slot));
    return next;
  }
};

}  // namespace mlagen::sm90
