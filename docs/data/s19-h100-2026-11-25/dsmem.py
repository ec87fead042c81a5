"""Call c: how fast can one CTA of a 2-CTA cluster write into its peer's shared memory? The sparse kernels
run one CTA per (token, 64-head group), so at H = 128 two CTAs gather (and in the FP8 cache's bf16 mode,
dequantize) the same rows. A cluster of the two could split that work and exchange the results through
distributed shared memory, if the SM-to-SM path moves enough: per S1 block pair a CTA would send half of its
rows' bf16 tiles, 64 x 1152 B = 74 KB per ~4.4 K cycles, about 17 B/clock. Measured per SM (one CTA per SM,
132 CTAs, 8 passes over 64 KB (the mbarrier tx count holds < 1 MB) between cluster barriers):
  0: st.shared.v4 into the CTA's own shared memory (reference), 128 / 256 threads
  1: st.shared::cluster.v4 into the peer's (mapa addresses), 128 / 256 threads
  2: cp.async.bulk.shared::cluster.shared::cta (the copy engine), 4 KB / 16 KB pieces, completion on the peer's
     mbarrier"""
import time, torch, cupy as cp

src = r'''
__device__ __forceinline__ unsigned smem_u32(const void* p) { return (unsigned)__cvta_generic_to_shared(p); }
__device__ __forceinline__ unsigned peer_addr(unsigned a, unsigned rank) {
  unsigned r; asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(rank)); return r;
}
__device__ __forceinline__ void cluster_sync() {
  asm volatile("barrier.cluster.arrive.release.aligned; barrier.cluster.wait.acquire.aligned;" ::: "memory");
}
extern "C" __global__ void __cluster_dims__(2, 1, 1) __launch_bounds__(256) xfer(int iters, int* out) {
  extern __shared__ __align__(1024) char sm[];
  char* src = sm;              // 64 KB the CTA sends
  char* dst = sm + 65536;      // 64 KB the peer writes into
  __shared__ __align__(8) unsigned long long bar;
  unsigned rank; asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(rank));
  const unsigned peer = rank ^ 1;
  const unsigned bar_a = smem_u32(&bar);
  if (threadIdx.x == 0) {
    asm volatile("mbarrier.init.shared.b64 [%0], 1;" :: "r"(bar_a));
    asm volatile("fence.mbarrier_init.release.cluster;");
  }
  for (int i = threadIdx.x; i < 65536 / 4; i += blockDim.x) ((int*)src)[i] = i;
  cluster_sync();
  for (int it = 0; it < iters; ++it) {
    if (MODE == 0 || MODE == 1) {
      const unsigned base = MODE == 0 ? smem_u32(dst) : peer_addr(smem_u32(dst), peer);
      for (int o = threadIdx.x * 16; o < REPS * 65536; o += blockDim.x * 16) {
        if (MODE == 0)
          asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};" :: "r"(base + (o & 65535)), "r"(o), "r"(it), "r"(o), "r"(it) : "memory");
        else
          asm volatile("st.shared::cluster.v4.u32 [%0], {%1, %2, %3, %4};" :: "r"(base + (o & 65535)), "r"(o), "r"(it), "r"(o), "r"(it) : "memory");
      }
    } else {
      // thread 0 expects the peer's 64 KB on its own barrier and sends its 64 KB to the peer's
      if (threadIdx.x == 0) {
        asm volatile("mbarrier.arrive.expect_tx.shared.b64 _, [%0], %1;" :: "r"(bar_a), "r"(REPS * 65536) : "memory");
      }
      cluster_sync();   // the peer's expect_tx precedes our complete_tx
      if (threadIdx.x == 0) {
        const unsigned pdst = peer_addr(smem_u32(dst), peer), pbar = peer_addr(bar_a, peer);
        for (int o = 0; o < REPS * 65536; o += PIECE)
          asm volatile("cp.async.bulk.shared::cluster.shared::cta.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
                       :: "r"(pdst + (o & 65535)), "r"(smem_u32(src) + (o & 65535)), "r"(PIECE), "r"(pbar) : "memory");
      }
      asm volatile("{ .reg .pred p; W: mbarrier.try_wait.parity.shared.b64 p, [%0], %1; @!p bra W; }"
                   :: "r"(bar_a), "r"(it & 1) : "memory");
    }
    cluster_sync();
  }
  if (threadIdx.x == 0 && ((int*)dst)[5] == 0x1234567) out[0] = 1;
}
'''
out = torch.zeros(1, dtype=torch.int32, device="cuda")
nsm = torch.cuda.get_device_properties(0).multi_processor_count
ev = [torch.cuda.Event(enable_timing=True) for _ in range(2)]
iters = 800
print(f"{time.strftime('%Y-%m-%d %H:%M')} {torch.cuda.get_device_name()} {nsm} CTAs in clusters of 2, 512 KB (8 x 64 KB) per CTA and cluster barrier, {iters} iterations")
configs = [(0, 128, 0), (0, 256, 0), (1, 128, 0), (1, 256, 0), (2, 128, 4096), (2, 128, 16384)]
for mode, nt, piece in configs:
    m = cp.RawModule(code=src, options=("-arch=sm_90a", f"-DMODE={mode}", f"-DPIECE={piece or 4096}", "-DREPS=8"))
    k = m.get_function("xfer")
    smem = 2 * 65536
    k.max_dynamic_shared_size_bytes = smem
    k((nsm,), (nt,), (cp.int32(10), out.data_ptr()), shared_mem=smem)
    torch.cuda.synchronize()
    ts = []
    for _ in range(5):
        ev[0].record(); k((nsm,), (nt,), (cp.int32(iters), out.data_ptr()), shared_mem=smem); ev[1].record()
        torch.cuda.synchronize()
        ts.append(ev[0].elapsed_time(ev[1]))
    ms = sorted(ts)[2]
    per_sm = 8 * 65536 * iters / (ms * 1e-3) / 1e9
    name = {0: "st.shared (own)", 1: "st.shared::cluster (peer)", 2: f"bulk copy to peer, {piece // 1024} KB pieces"}[mode]
    print(f"  {name:34s} {nt} threads: {ms:7.3f} ms  {per_sm:6.1f} GB/s per SM  "
          f"({per_sm / 1.755:5.1f} B/clock at 1755 MHz)  {per_sm * nsm / 1e3:5.2f} TB/s in all", flush=True)
