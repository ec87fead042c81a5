"""Call i: the bare TMA-box gather with shared-memory reads of each landed slot (READS passes of 16-byte
loads by every thread), to see whether the consumer's reads (~1.9 passes per gathered byte in the H16
kernel) slow the gather's TMA writes. Derived from call g's ringgather.py (S5's rows, one TMA box per row,
each timed after a 2 ms spin). The reads sit between a slot's landing and its refill, so they also delay
that CTA's ring: a slowdown that more threads (128) or more CTAs remove is latency, one that stays is the
shared-memory port."""
import time, torch, cupy as cp
from mlagen.runtime import encode_tensor_map_bf16
from mlagen.families import mla_sparse_prefill as fam

src = r'''
__device__ __forceinline__ void wait_bar(unsigned b, unsigned parity) {
  asm volatile("{ .reg .pred p; W: mbarrier.try_wait.parity.shared.b64 p, [%0], %1; @!p bra W; }" :: "r"(b), "r"(parity));
}
// MODE 0: one bulk copy per row; 1: 16-byte cp.async (8 threads per 128 B); 2: one TMA box (64 x 9) per row
extern "C" __global__ void __launch_bounds__(NT) gather(const char* __restrict__ kv, const int* __restrict__ idx,
    int rows_per_item, int n_items, const void* map, int* counter, int* out) {
  extern __shared__ __align__(1024) char smem_raw[];
  char* smem = (char*)(((unsigned long long)smem_raw + 1023) & ~1023ull);
  __shared__ __align__(8) unsigned long long bar[STAGES];
  __shared__ int item_s;
  if (threadIdx.x == 0) {
    for (int s = 0; s < STAGES; ++s)
      asm volatile("mbarrier.init.shared.b64 [%0], 1;" :: "r"((unsigned)__cvta_generic_to_shared(&bar[s])));
    asm volatile("fence.mbarrier_init.release.cluster;");
  }
  int acc = 0, blk = 0;
  for (;;) {
    __syncthreads();
    if (threadIdx.x == 0) { int k = atomicAdd(counter, 1); item_s = k < n_items ? k : -1; }
    __syncthreads();
    const int item = item_s;
    if (item < 0) break;
    const int* ix = idx + (long)item * rows_per_item;
    for (int r0 = 0; r0 < rows_per_item; r0 += ROWS, ++blk) {
      const int s = blk % STAGES;
      const unsigned b = (unsigned)__cvta_generic_to_shared(&bar[s]);
      char* slot = smem + s * ROWS * 1152;
      if (MODE == 1) {
        asm volatile("cp.async.wait_group %0;" :: "n"(STAGES - 1));
        __syncthreads();
        acc += slot[threadIdx.x];
        __syncthreads();
        for (int c = threadIdx.x; c < ROWS * 72; c += NT) {
          const long row = ix[r0 + c / 72];
          const unsigned d = (unsigned)__cvta_generic_to_shared(slot + (c / 72) * 1152 + (c % 72) * 16);
          asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" :: "r"(d), "l"(kv + row * 1152 + (c % 72) * 16));
        }
        asm volatile("cp.async.commit_group;");
        continue;
      }
      if (blk >= STAGES) {
        wait_bar(b, ((blk / STAGES) - 1) & 1);
        acc += slot[threadIdx.x];
        // READS passes over the landed slot by every thread, 16 B per load (the consumer's ldmatrix traffic)
        for (int pass = 0; pass < READS; ++pass)
          for (int o = threadIdx.x * 16; o < ROWS * 1152; o += NT * 16) {
            unsigned x, y, z, w;
            asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(x), "=r"(y), "=r"(z), "=r"(w)
                         : "r"((unsigned)__cvta_generic_to_shared(slot + o)));
            acc += x ^ y ^ z ^ w;
          }
        __syncthreads();
      }
      if (threadIdx.x == 0)
        asm volatile("mbarrier.arrive.expect_tx.shared.b64 _, [%0], %1;" :: "r"(b), "r"(ROWS * 1152));
      __syncthreads();
      for (int r = threadIdx.x; r < ROWS; r += NT) {
        const int row = ix[r0 + r];
        const unsigned d = (unsigned)__cvta_generic_to_shared(slot + r * 1152);
        if (MODE == 0)
          asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], 1152, [%2];"
                       :: "r"(d), "l"(kv + (long)row * 1152), "r"(b) : "memory");
        else
          asm volatile("cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4, %5}], [%2];"
                       :: "r"(d), "l"(map), "r"(b), "r"(0), "r"(0), "r"(row) : "memory");
      }
    }
  }
  if (MODE == 1) asm volatile("cp.async.wait_group 0;");
  for (int k = blk - STAGES; MODE != 1 && k < blk; ++k) {
    if (k < 0) continue;
    wait_bar((unsigned)__cvta_generic_to_shared(&bar[k % STAGES]), (k / STAGES) & 1);
  }
  if (acc == 12345678) out[0] = acc;
}
'''
shape = fam.parse_shape("S5")
inp = fam.make_inputs(shape, "cuda", seed=0)
kv2 = inp["kv"].reshape(-1, 576)
idx2 = inp["indices"].reshape(shape.sq, -1).contiguous()
mapbytes = encode_tensor_map_bf16(kv2.data_ptr(), [64, 9, kv2.shape[0]], [128, 1152], [64, 9, 1], 128, "kv")
mapbuf = torch.tensor(list(mapbytes), dtype=torch.uint8, device="cuda")
counter = torch.zeros(1, dtype=torch.int32, device="cuda")
out = torch.zeros(1, dtype=torch.int32, device="cuda")
nsm = torch.cuda.get_device_properties(0).multi_processor_count
ev = [torch.cuda.Event(enable_timing=True) for _ in range(2)]
spin = int(2e-3 * 1.98e9)
gb = shape.sq * shape.topk * 1152 / 1e9
print(f"{time.strftime('%Y-%m-%d %H:%M')} {torch.cuda.get_device_name()} S5 rows, TMA box per row, after a 2 ms spin")
for nt, rows, stages, ctas, reads in [(64, 32, 2, 3, 0), (64, 32, 2, 3, 1), (64, 32, 2, 3, 2), (64, 32, 2, 3, 3),
                                      (128, 32, 2, 3, 2), (128, 64, 3, 1, 0), (128, 64, 3, 1, 2)]:
    k = cp.RawModule(code=src, options=("-arch=sm_90a", f"-DNT={nt}", f"-DROWS={rows}", f"-DSTAGES={stages}",
                                        "-DMODE=2", f"-DREADS={reads}")).get_function("gather")
    smem = rows * 1152 * stages + 1024
    k.max_dynamic_shared_size_bytes = smem
    args = (kv2.data_ptr(), idx2.data_ptr(), cp.int32(idx2.shape[1]), cp.int32(shape.sq), mapbuf.data_ptr(),
            counter.data_ptr(), out.data_ptr())
    ts = []
    for _ in range(12):
        torch.cuda.synchronize()
        torch.cuda._sleep(spin)
        counter.zero_()
        ev[0].record(); k((nsm * ctas,), (nt,), args, shared_mem=smem); ev[1].record(); torch.cuda.synchronize()
        ts.append(ev[0].elapsed_time(ev[1]))
    ms = sorted(ts)[6]
    print(f"  {reads} read passes, {nt} threads: {ctas} CTA/SM x {stages} slots x {rows} rows ({ctas * stages * rows:3d} rows, {ctas * smem // 1024:3d} KB/SM): "
          f"{ms:.3f} ms {gb / ms:5.2f} TB/s", flush=True)
