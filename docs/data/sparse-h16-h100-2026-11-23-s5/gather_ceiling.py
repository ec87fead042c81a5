"""Pure gather of S5's rows (4096 tokens x 2048 random rows of 1152 B out of 32768): the L2->SM ceiling
for the sparse kernel at H=16. Each CTA gathers one token's rows into shared memory and writes one word;
two ways: 16-B cp.async (as the kernel's producer) and one cp.async.bulk (TMA 1-D copy) per row.
Then mlagen's sparse kernel on S5 (H=16) and on the same problem at H=64, same process, CUDA events."""
import sys, torch, cupy as cp
src = r'''
extern "C" __global__ void __launch_bounds__(NT) gather(const char* __restrict__ kv, const int* __restrict__ idx,
    int topk, int* __restrict__ out) {
  extern __shared__ __align__(128) char smem[];
  for (int tok = blockIdx.x; tok < gridDim.x * TPB; tok += gridDim.x) {
  const int* ix = idx + (long)tok * topk;
  const int lanes_per_row = 1152 / 16;  // 72 chunks per row
  int acc = 0;
  for (int r0 = 0; r0 < topk; r0 += ROWS) {
    for (int c = threadIdx.x; c < ROWS * lanes_per_row; c += NT) {
      int r = r0 + c / lanes_per_row, ch = c % lanes_per_row;
      long row = ix[r];
      const char* g = kv + row * 1152 + ch * 16;
      unsigned s = (unsigned)__cvta_generic_to_shared(smem + ((r0 / ROWS) % STAGES) * ROWS * 1152 + (c / lanes_per_row) * 1152 + ch * 16);
      asm volatile("cp.async.cg.shared.global.L2::256B [%0], [%1], 16;" :: "r"(s), "l"(g));
    }
    asm volatile("cp.async.commit_group;");
    asm volatile("cp.async.wait_group %0;" :: "n"(STAGES - 1));
    __syncthreads();
    acc += smem[threadIdx.x];
  }
  asm volatile("cp.async.wait_group 0;");
  if (acc == 12345678) out[tok] = acc;
  }
}
extern "C" __global__ void __launch_bounds__(NT) gather_bulk(const char* __restrict__ kv, const int* __restrict__ idx,
    int topk, int* __restrict__ out) {
  extern __shared__ __align__(128) char smem[];
  __shared__ __align__(8) unsigned long long bar[STAGES];
  if (threadIdx.x == 0) {
    for (int s = 0; s < STAGES; ++s)
      asm volatile("mbarrier.init.shared.b64 [%0], 1;" :: "r"((unsigned)__cvta_generic_to_shared(&bar[s])));
    asm volatile("fence.mbarrier_init.release.cluster;");
  }
  __syncthreads();
  int acc = 0, blk = 0;
  for (int tok = blockIdx.x; tok < gridDim.x * TPB; tok += gridDim.x) {
  const int* ix = idx + (long)tok * topk;
  for (int r0 = 0; r0 < topk; r0 += ROWS, ++blk) {
    const int s = blk % STAGES;
    const unsigned b = (unsigned)__cvta_generic_to_shared(&bar[s]);
    if (blk >= STAGES) {  // wait for this stage's previous fill, then everyone has "used" it
      const unsigned parity = ((blk / STAGES) - 1) & 1;
      asm volatile("{ .reg .pred p; W: mbarrier.try_wait.parity.shared.b64 p, [%0], %1; @!p bra W; }" :: "r"(b), "r"(parity));
      acc += smem[s * ROWS * 1152 + threadIdx.x];
      __syncthreads();
    }
    if (threadIdx.x == 0)
      asm volatile("mbarrier.arrive.expect_tx.shared.b64 _, [%0], %1;" :: "r"(b), "r"(ROWS * 1152));
    __syncthreads();
    for (int r = threadIdx.x; r < ROWS; r += NT) {
      long row = ix[r0 + r];
      unsigned d = (unsigned)__cvta_generic_to_shared(smem + s * ROWS * 1152 + r * 1152);
      asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], 1152, [%2];"
                   :: "r"(d), "l"(kv + row * 1152), "r"(b) : "memory");
    }
  }
  }
  for (int k = blk - STAGES; k < blk; ++k) {
    if (k < 0) continue;
    const unsigned b = (unsigned)__cvta_generic_to_shared(&bar[k % STAGES]);
    const unsigned parity = (k / STAGES) & 1;
    asm volatile("{ .reg .pred p; W: mbarrier.try_wait.parity.shared.b64 p, [%0], %1; @!p bra W; }" :: "r"(b), "r"(parity));
  }
  if (acc == 12345678) out[0] = acc;
}
'''
sq, topk, skv = 4096, 2048, int(sys.argv[1]) if len(sys.argv) > 1 else 32768
torch.manual_seed(0)
kv = torch.randn(skv, 576, device="cuda", dtype=torch.bfloat16)
idx = torch.rand(sq, skv, device="cuda").argsort(dim=1)[:, :topk].int().contiguous()
out = torch.zeros(sq, dtype=torch.int32, device="cuda")
gb = sq * topk * 1152 / 1e9
e0, e1 = torch.cuda.Event(True), torch.cuda.Event(True)

def timeit(fn, n=10):
    for _ in range(3):
        fn()
    ts = []
    for _ in range(n):
        e0.record(); fn(); e1.record(); torch.cuda.synchronize(); ts.append(e0.elapsed_time(e1))
    return sorted(ts)[len(ts) // 2]

for name, nt, rows, stages, tpb in [("gather", 128, 64, 2, 1), ("gather", 256, 64, 2, 1), ("gather", 128, 32, 4, 1),
                                    ("gather", 256, 32, 4, 1), ("gather", 128, 32, 2, 1), ("gather", 256, 64, 3, 1),
                                    ("gather_bulk", 128, 64, 2, 1), ("gather_bulk", 128, 64, 3, 1),
                                    ("gather_bulk", 128, 32, 4, 1), ("gather_bulk", 64, 32, 2, 1),
                                    ("gather_bulk", 128, 64, 3, 31)]:
    k = cp.RawKernel(src, name, options=(f"-DNT={nt}", f"-DROWS={rows}", f"-DSTAGES={stages}", f"-DTPB={tpb}", "-arch=sm_90a"))
    smem = rows * 1152 * stages
    k.max_dynamic_shared_size_bytes = smem
    args = (kv.data_ptr(), idx.data_ptr(), cp.int32(topk), out.data_ptr())
    grid = sq // tpb
    ms = timeit(lambda: k((grid,), (nt,), args, shared_mem=smem)) * sq / (grid * tpb)  # per 4096 tokens
    print(f"{name} skv={skv} nt={nt} rows={rows} stages={stages} tokens/CTA={tpb} smem={smem//1024}KB: {ms:.3f} ms, {gb/ms:.2f} TB/s "
          f"(S5 at this time: {2*sq*16*topk*1088/ms/1e9:.0f} TFLOP/s at H=16)", flush=True)

import mlagen
for h in (16, 64):
    q = torch.randn(sq, h, 576, device="cuda", dtype=torch.bfloat16)
    sink = torch.randn(h, device="cuda")
    f = lambda: mlagen.mla_sparse_prefill(q, kv, idx, softmax_scale=576 ** -0.5, attn_sink=sink)
    ms = timeit(f)
    print(f"mlagen sparse H={h} skv={skv}: {ms:.3f} ms = {gb/ms:.2f} TB/s of gathered rows, "
          f"{2*sq*h*topk*1088/ms/1e9:.0f} TFLOP/s", flush=True)
