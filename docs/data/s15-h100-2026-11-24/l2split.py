"""Is S5's gather held by the L2's two partitions? (fifteenth session, call a)

H100's 50 MB L2 is two partitions, each serving the SMs of its GPCs. If a partition also keeps copies of
lines homed in the other one, a random gather over 37.7 MB (S5's KV) meets an effective ~25 MB per side,
which fits the 68.8% hit rate measured in session 11. Three measurements:
 1. pure gather (one 1-D bulk copy per 1152-B row, persistent CTAs) against the working-set size;
 2. the same rows split in two halves by row index, each token's half an item; items taken from one
    queue (mixed) or the CTA's side's queue first (split), the side from %smid by a candidate mapping;
 3. a probe: one CTA warms 132 x 64 lines, then each SM in turn times its first read of its own 64 lines
    (with duplication the warm SM's side reads all lines near; without it every SM sees half far);
    and clusters of 8 CTAs (one GPC each) record their %smid, to group SMs into GPCs.

Outcome (a-l2split.log): 1. decides it: the gather moves 7.4-7.5 TB/s from 9 MiB to 36 MiB of rows and
first slows at 45 MiB, so no partition halves the L2 for this pattern; 2. every mapping within 1% of
mixed. 3. is void: the clock64 reads were not ordered with the loads (every latency reads 2 cycles), and
8-CTA clusters only grouped SMs in eights (15 groups of 8, 12 singletons), not into GPCs.
"""
import sys, json, os, itertools, torch, cupy as cp

src = r'''
__device__ __forceinline__ unsigned smid() { unsigned r; asm volatile("mov.u32 %0, %%smid;" : "=r"(r)); return r; }
__device__ __forceinline__ void wait_bar(unsigned b, unsigned parity) {
  asm volatile("{ .reg .pred p; W: mbarrier.try_wait.parity.shared.b64 p, [%0], %1; @!p bra W; }" :: "r"(b), "r"(parity));
}
// items: [n_items][rows_per_item] row indices. mode 0: one queue over all items. mode 1: the CTA takes
// items of its side first (item i has side i % 2), then steals from the other side's queue.
extern "C" __global__ void __launch_bounds__(NT) gather_items(const char* __restrict__ kv, const int* __restrict__ idx,
    int rows_per_item, int n_items, const int* __restrict__ side_of_sm, int mode, int* counters, int* out) {
  extern __shared__ __align__(128) char smem[];
  __shared__ __align__(8) unsigned long long bar[STAGES];
  __shared__ int item_s;
  if (threadIdx.x == 0) {
    for (int s = 0; s < STAGES; ++s)
      asm volatile("mbarrier.init.shared.b64 [%0], 1;" :: "r"((unsigned)__cvta_generic_to_shared(&bar[s])));
    asm volatile("fence.mbarrier_init.release.cluster;");
  }
  const int side = mode == 1 ? side_of_sm[smid()] : 0;
  const int per_side = n_items / 2;
  int acc = 0, blk = 0;
  for (;;) {
    __syncthreads();
    if (threadIdx.x == 0) {
      int it = -1;
      if (mode == 0) { int k = atomicAdd(&counters[0], 1); it = k < n_items ? k : -1; }
      else {
        int k = atomicAdd(&counters[side], 1);
        if (k < per_side) it = 2 * k + side;
        else { k = atomicAdd(&counters[1 - side], 1); it = k < per_side ? 2 * k + (1 - side) : -1; }
      }
      item_s = it;
    }
    __syncthreads();
    const int item = item_s;
    if (item < 0) break;
    const int* ix = idx + (long)item * rows_per_item;
    for (int r0 = 0; r0 < rows_per_item; r0 += ROWS, ++blk) {
      const int s = blk % STAGES;
      const unsigned b = (unsigned)__cvta_generic_to_shared(&bar[s]);
      if (blk >= STAGES) {
        wait_bar(b, ((blk / STAGES) - 1) & 1);
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
    wait_bar((unsigned)__cvta_generic_to_shared(&bar[k % STAGES]), (k / STAGES) & 1);
  }
  if (acc == 12345678) out[0] = acc;
}

// one CTA: read every line once (warm), record its SM
extern "C" __global__ void warm(const int* __restrict__ lines, int n, int* out) {
  int acc = 0;
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    int v; asm volatile("ld.global.cg.s32 %0, [%1];" : "=r"(v) : "l"(lines + i * 32)); acc += v;
  }
  if (threadIdx.x == 0) out[0] = smid();
  if (acc == 12345678) out[1] = acc;
}
// CTA b (one per SM) in its turn times dependent first reads of its own NL lines
extern "C" __global__ void probe(const int* __restrict__ lines, int nl, volatile int* turn, long long* lat, int* sm) {
  extern __shared__ char pad[];
  if (threadIdx.x != 0) return;
  const int b = blockIdx.x;
  while (*turn != b) __nanosleep(100);
  sm[b] = smid();
  int dep = 0;
  for (int j = 0; j < nl; ++j) {
    const int* p = lines + ((long)b * nl + j) * 32 + (dep & 0);
    long long t0 = clock64();
    int v; asm volatile("ld.global.cg.s32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    dep = v;
    long long t1 = clock64();
    lat[(long)b * nl + j] = t1 - t0 + (dep & 0);
  }
  for (int j = 0; j < nl; ++j) {   // second read of the same lines
    const int* p = lines + ((long)b * nl + j) * 32 + (dep & 0);
    long long t0 = clock64();
    int v; asm volatile("ld.global.cg.s32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    dep = v;
    long long t1 = clock64();
    lat[(long)(gridDim.x + b) * nl + j] = t1 - t0 + (dep & 0);
  }
  __threadfence();
  *turn = b + 1;
}
extern "C" __global__ void __cluster_dims__(8, 1, 1) cluster_sm(int* sm) {
  extern __shared__ char pad[];
  if (threadIdx.x == 0) sm[blockIdx.x] = smid();
}
'''
out_dir = os.environ.get("OUT", "/tmp")
dev = torch.cuda.get_device_properties(0)
nsm = dev.multi_processor_count
print(f"device {dev.name}, {nsm} SMs, L2 {dev.L2_cache_size >> 20} MB", flush=True)
e0, e1 = torch.cuda.Event(True), torch.cuda.Event(True)
def timeit(fn, n=10):
    for _ in range(3):
        fn()
    ts = []
    for _ in range(n):
        e0.record(); fn(); e1.record(); torch.cuda.synchronize(); ts.append(e0.elapsed_time(e1))
    return sorted(ts)[len(ts) // 2]

results = {}
# --- 3. probe + clusters first (cheap)
mod = cp.RawModule(code=src, options=("-arch=sm_90a", "-DNT=64", "-DROWS=32", "-DSTAGES=4"), name_expressions=None)
nl = 64
lines = torch.zeros(nsm * nl * 32, dtype=torch.int32, device="cuda")
wout = torch.zeros(2, dtype=torch.int32, device="cuda")
turn = torch.zeros(1, dtype=torch.int32, device="cuda")
lat = torch.zeros(2 * nsm * nl, dtype=torch.int64, device="cuda")
sm = torch.zeros(nsm, dtype=torch.int32, device="cuda")
probe = mod.get_function("probe"); probe.max_dynamic_shared_size_bytes = 200 * 1024
probes = []
for rep in range(3):
    # flush L2 with a 256 MB write, then warm from one CTA
    torch.empty(64 << 20, dtype=torch.int32, device="cuda").fill_(rep)
    mod.get_function("warm")((1,), (256,), (lines.data_ptr(), cp.int32(nsm * nl), wout.data_ptr()))
    turn.zero_()
    probe((nsm,), (32,), (lines.data_ptr(), cp.int32(nl), turn.data_ptr(), lat.data_ptr(), sm.data_ptr()), shared_mem=200 * 1024)
    torch.cuda.synchronize()
    L = lat.view(2, nsm, nl).cpu()
    probes.append({"warm_sm": int(wout[0]), "sm": sm.cpu().tolist(), "first": L[0].tolist(), "second": L[1].tolist()})
    first = L[0].float().mean(1); second = L[1].float().mean(1)
    order = sorted(range(nsm), key=lambda b: first[b].item())
    print(f"probe {rep}: warm SM {int(wout[0])}; mean first-read latency per SM (cycles) "
          f"min {first.min():.0f} median {first.median():.0f} max {first.max():.0f}; second {second.median():.0f}", flush=True)
    print("  SMs by first-read latency:", [(probes[-1]['sm'][b], round(first[b].item())) for b in order], flush=True)
results["probes"] = probes
cl = mod.get_function("cluster_sm"); cl.max_dynamic_shared_size_bytes = 200 * 1024
clusters = []
for ncl in (16, 15, 14, 12, 10, 8, 6, 4, 2, 1):
    smc = torch.full((ncl * 8,), -1, dtype=torch.int32, device="cuda")
    try:
        cl((ncl * 8,), (32,), (smc.data_ptr(),), shared_mem=200 * 1024)
        torch.cuda.synchronize()
        v = smc.cpu().tolist()
        clusters += [sorted(v[i * 8:(i + 1) * 8]) for i in range(ncl)]
    except Exception as e:
        print("cluster launch", ncl, "failed:", e, flush=True)
        break
results["clusters"] = clusters
# union-find over cluster co-membership: SMs in one cluster share a GPC
parent = list(range(nsm))
def find(x):
    while parent[x] != x:
        parent[x] = parent[parent[x]]; x = parent[x]
    return x
for c in clusters:
    for a in c[1:]:
        parent[find(a)] = find(c[0])
groups = {}
for s in range(nsm):
    groups.setdefault(find(s), []).append(s)
gpcs = sorted(groups.values(), key=lambda g: g[0])
print("GPC groups from clusters:", [len(g) for g in gpcs], gpcs, flush=True)
results["gpcs"] = gpcs

# --- 1. + 2. gathers
sq, topk, skv = 4096, 2048, 32768
torch.manual_seed(0)
gb = sq * topk * 1152 / 1e9
counters = torch.zeros(2, dtype=torch.int32, device="cuda")
out = torch.zeros(2, dtype=torch.int32, device="cuda")
def run(kern, nt, rows, stages, kv, idx, rows_per_item, n_items, side, mode, ctas_per_sm):
    smem = rows * 1152 * stages
    kern.max_dynamic_shared_size_bytes = smem
    args = (kv.data_ptr(), idx.data_ptr(), cp.int32(rows_per_item), cp.int32(n_items), side.data_ptr(), cp.int32(mode),
            counters.data_ptr(), out.data_ptr())
    def f():
        counters.zero_()
        kern((nsm * ctas_per_sm,), (nt,), args, shared_mem=smem)
    return timeit(f)
configs = [(64, 32, 4, 1), (64, 32, 2, 3)]   # (threads, rows per block, stages, CTAs per SM)
kerns = {c: cp.RawModule(code=src, options=("-arch=sm_90a", f"-DNT={c[0]}", f"-DROWS={c[1]}", f"-DSTAGES={c[2]}")).get_function("gather_items")
         for c in configs}
zero_side = torch.zeros(256, dtype=torch.int32, device="cuda")
kv_big = torch.randn(65536, 576, device="cuda", dtype=torch.bfloat16)
print("\n1. working set (one 2048-row item per token, one queue):", flush=True)
for n in (8192, 16384, 21845, 24576, 28672, 32768, 40960, 49152, 65536):
    idx = torch.randint(0, n, (sq, topk), device="cuda", dtype=torch.int32)
    for c in configs:
        ms = run(kerns[c], c[0], c[1], c[2], kv_big, idx, topk, sq, zero_side, 0, c[3])
        print(f"  rows {n:6d} ({n * 1152 / 2**20:5.1f} MiB) cfg {c}: {ms:.3f} ms {gb / ms:.2f} TB/s", flush=True)
        results[f"ws/{n}/{c}"] = ms
# split: half-items, side 0 rows in [0, skv/2), side 1 in [skv/2, skv)
half = skv // 2
idx_h = torch.randint(0, half, (sq, 2, topk // 2), device="cuda", dtype=torch.int32)
idx_h[:, 1] += half
idx_h = idx_h.reshape(sq * 2, topk // 2).contiguous()
cands = {
    "smid<66": [int(s < nsm // 2) for s in range(nsm)],
    "smid&1": [s & 1 for s in range(nsm)],
    "(smid>>1)&1": [(s >> 1) & 1 for s in range(nsm)],
    "(smid>>2)&1": [(s >> 2) & 1 for s in range(nsm)],
    "(smid>>3)&1": [(s >> 3) & 1 for s in range(nsm)],
    "(smid>>1)%8<4": [int((s >> 1) % 8 < 4) for s in range(nsm)],
    "(smid>>1)%4<2": [int((s >> 1) % 4 < 2) for s in range(nsm)],
}
# from the probe: the warm SM's side reads everything near (if lines are copied); split at the median
f0 = torch.tensor(probes[0]["first"]).float().mean(1)
med = f0.median()
by_sm = [0] * nsm
for b in range(nsm):
    by_sm[probes[0]["sm"][b]] = int(f0[b] > med)
cands["probe"] = by_sm
# balanced GPC splits (if the clusters found 6-10 groups)
if 6 <= len(gpcs) <= 10:
    k = len(gpcs)
    for combo in itertools.combinations(range(1, k), k // 2 - 1 + (k % 2)):
        sel = {0, *combo}
        m = [0] * nsm
        for gi, g in enumerate(gpcs):
            for s in g:
                m[s] = int(gi in sel)
        cands["gpc" + "".join(str(i) for i in sorted(sel))] = m
print(f"\n2. half-items (rows of side 0 in [0, {half}), side 1 above), {len(cands)} mappings:", flush=True)
for c in configs:
    ms_mixed = run(kerns[c], c[0], c[1], c[2], kv_big, idx_h, topk // 2, 2 * sq, zero_side, 0, c[3])
    print(f"  cfg {c} mixed: {ms_mixed:.3f} ms {gb / ms_mixed:.2f} TB/s", flush=True)
    results[f"mixed/{c}"] = ms_mixed
    best = []
    for name, m in cands.items():
        side = torch.tensor(m + [0] * (256 - nsm), dtype=torch.int32, device="cuda")
        ms = run(kerns[c], c[0], c[1], c[2], kv_big, idx_h, topk // 2, 2 * sq, side, 1, c[3])
        results[f"split/{name}/{c}"] = ms
        best.append((ms, name))
    best.sort()
    for ms, name in best[:8]:
        print(f"  cfg {c} split {name:16s}: {ms:.3f} ms {gb / ms:.2f} TB/s ({ms_mixed / ms:.3f}x mixed)", flush=True)
    print(f"  worst: {best[-1][1]} {best[-1][0]:.3f} ms", flush=True)
results["cands"] = cands
json.dump(results, open(os.path.join(out_dir, "l2split.json"), "w"))  # not kept in the repository (the probe part is void)
