"""Call f: which copy path loses after an idle GPU (call e: our TMA-box H <= 16 kernel 19%, FlashMLA's
cp.async kernel 5%, our cp.async 64-head kernel ~0)? S5's rows gathered by bare kernels (one bulk copy per
row / 16-byte cp.async / one TMA box per row, 3 CTAs x 2 slots of 32 rows per SM, persistent, one queue)
and the H <= 16 kernel with its TMA boxes and with its bulk-copy option, each timed after a host sync and
2 ms of idle ("idle") and right after a 2 ms spin kernel ("spin")."""
import time, torch, cupy as cp
import mlagen
from mlagen import spec as spec_mod, variant
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
q, kv, idx, sink, sc = inp["q"], inp["kv"], inp["indices"], inp["attn_sink"], inp["softmax_scale"]
kv2 = kv.reshape(-1, 576)
idx2 = idx.reshape(shape.sq, -1).contiguous()
mapbytes = encode_tensor_map_bf16(kv2.data_ptr(), [64, 9, kv2.shape[0]], [128, 1152], [64, 9, 1], 128, "kv")
mapbuf = torch.tensor(list(mapbytes), dtype=torch.uint8, device="cuda")
counter = torch.zeros(1, dtype=torch.int32, device="cuda")
out = torch.zeros(1, dtype=torch.int32, device="cuda")
nsm = torch.cuda.get_device_properties(0).multi_processor_count
fns = {}
for mode, name in ((0, "bare bulk copy"), (1, "bare cp.async 16 B"), (2, "bare TMA box 64x9")):
    k = cp.RawModule(code=src, options=("-arch=sm_90a", "-DNT=64", "-DROWS=32", "-DSTAGES=2", f"-DMODE={mode}")).get_function("gather")
    smem = 32 * 1152 * 2 + 1024
    k.max_dynamic_shared_size_bytes = smem
    args = (kv2.data_ptr(), idx2.data_ptr(), cp.int32(idx2.shape[1]), cp.int32(shape.sq), mapbuf.data_ptr(),
            counter.data_ptr(), out.data_ptr())
    def f(k=k, args=args, smem=smem):
        counter.zero_()
        k((nsm * 3,), (64,), args, shared_mem=smem)
    fns[name] = f
def h16(**o):
    return variant.make(spec_mod.load("mla_sparse_prefill_sm90_h16"), dict(o, d_qk=576, paged=False, kv_format="bf16"))
for name, v in (("H16 kernel, TMA boxes", h16()), ("H16 kernel, bulk rows +32 B", h16(gather="bulk", row_pad=32))):
    fns[name] = lambda v=v: mlagen.mla_sparse_prefill(q, kv, idx, softmax_scale=sc, attn_sink=sink, kernel=v)
fns["H64 kernel (cp.async)"] = lambda: mlagen.mla_sparse_prefill(q, kv, idx, softmax_scale=sc, attn_sink=sink,
                                                                 kernel="mla_sparse_prefill_sm90")
ev = [torch.cuda.Event(enable_timing=True) for _ in range(2)]
spin = int(2e-3 * 1.98e9)
for f in fns.values():
    f()
torch.cuda.synchronize()
res = {}
for rnd in range(4):
    for name, f in fns.items():
        for mode, pre in (("idle", lambda: None), ("spin", lambda: torch.cuda._sleep(spin))):
            for _ in range(6):
                torch.cuda.synchronize(); time.sleep(0.002)
                pre()
                ev[0].record(); f(); ev[1].record(); torch.cuda.synchronize()
                res.setdefault((name, mode), []).append(ev[0].elapsed_time(ev[1]))
gb = shape.sq * shape.topk * 1152 / 1e9
print(f"{time.strftime('%Y-%m-%d %H:%M')} {torch.cuda.get_device_name()} S5 rows; medians of 24 calls")
print(f"{'':32s}{'idle':>22s}{'spin':>22s}{'idle/spin':>11s}")
for name in fns:
    a = sorted(res[(name, "idle")])[12]; b = sorted(res[(name, "spin")])[12]
    print(f"{name:32s}{a:9.3f} ms {gb / a:5.2f} TB/s{b:9.3f} ms {gb / b:5.2f} TB/s{a / b:10.3f}x", flush=True)
