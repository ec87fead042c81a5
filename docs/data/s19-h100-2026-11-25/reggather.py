"""Call a: can a gather into registers (no shared memory) move S5's rows faster than the TMA gather into
shared memory? The eleventh/fifteenth sessions measured the shared-memory paths: one TMA box per row
7.34-7.5 TB/s bare, 6.69 with one read pass of each slot, 5.96 with two (the H16 kernel moves 5.85);
16-byte cp.async 5.8 at best. The 1.3x bar at H = 16 needs about 6.7 TB/s of gathered rows. A kernel that
loads each key's fragments straight into registers (the split-by-dims mma.sync design of the seventeenth
session's notes, with ld.global instead of TMA + ldmatrix) puts every byte through the L1 datapath once.
This measures only that gather: each warp of a CTA owns 288 B of every row (256 B of the latent part and
32 B of the rope), per 16-key step thread (g, t) loads keys g and g + 8 (nine 16-byte loads), D steps in
flight in registers; indices loaded 2 D steps ahead. One CTA per token (S5: 4096 x 2048 rows of 1152 B),
CTAs per SM set by dynamic shared memory; timed after a 2 ms spin, median of 12."""
import time, torch, cupy as cp
from mlagen.families import mla_sparse_prefill as fam

src = r'''
#define LD(dst, p) asm volatile(LDOP " {%0, %1, %2, %3}, [%4];" : "=r"(dst.x), "=r"(dst.y), "=r"(dst.z), "=r"(dst.w) : "l"(p))
extern "C" __global__ void __launch_bounds__(128) gather(const char* __restrict__ kv, const int* __restrict__ idx,
                                                        int topk, int* out) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int* ix = idx + (long)blockIdx.x * topk;
  const int steps = topk / 16;
  // per-thread byte offsets inside a row: latent pieces 256 w + 16 t + 64 j, rope piece 1024 + 32 w + 16 (t % 2)
  const int lat = 256 * warp + 16 * t, rope = 1024 + 32 * warp + 16 * (t % 2);
  const int rk = g + 8 * (t / 2);
  uint4 buf[D][9];
  int rows[2 * D][3];
  unsigned acc = 0;
#pragma unroll
  for (int s = 0; s < 2 * D; ++s) {
    rows[s][0] = s < steps ? ix[16 * s + g] : 0;
    rows[s][1] = s < steps ? ix[16 * s + g + 8] : 0;
    rows[s][2] = s < steps ? ix[16 * s + rk] : 0;
  }
#pragma unroll
  for (int s = 0; s < D; ++s) {
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      LD(buf[s][j], kv + (long)rows[s][0] * 1152 + lat + 64 * j);
      LD(buf[s][4 + j], kv + (long)rows[s][1] * 1152 + lat + 64 * j);
    }
    LD(buf[s][8], kv + (long)rows[s][2] * 1152 + rope);
  }
  for (int s0 = 0; s0 < steps; s0 += 2 * D) {
#pragma unroll
    for (int u = 0; u < 2 * D; ++u) {
      const int s = s0 + u, b = u % D;
#pragma unroll
      for (int j = 0; j < 9; ++j) acc += buf[b][j].x ^ buf[b][j].y ^ buf[b][j].z ^ buf[b][j].w;
      // refill this register set with step s + D (rows loaded D steps earlier)
      const int nr = (u + D) % (2 * D);
      if (s + D < steps) {
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          LD(buf[b][j], kv + (long)rows[nr][0] * 1152 + lat + 64 * j);
          LD(buf[b][4 + j], kv + (long)rows[nr][1] * 1152 + lat + 64 * j);
        }
        LD(buf[b][8], kv + (long)rows[nr][2] * 1152 + rope);
      }
      // this slot of row ids is free again: load step s + 2 D's
      const int s2 = s + 2 * D;
      rows[u][0] = s2 < steps ? ix[16 * s2 + g] : 0;
      rows[u][1] = s2 < steps ? ix[16 * s2 + g + 8] : 0;
      rows[u][2] = s2 < steps ? ix[16 * s2 + rk] : 0;
    }
  }
  if (acc == 0x12345678u) out[0] = acc;
}
'''
shape = fam.parse_shape("S5")
inp = fam.make_inputs(shape, "cuda", seed=0)
kv2 = inp["kv"].reshape(-1, 576)
idx2 = inp["indices"].reshape(shape.sq, -1).contiguous().clamp(0, kv2.shape[0] - 1)
out = torch.zeros(1, dtype=torch.int32, device="cuda")
ev = [torch.cuda.Event(enable_timing=True) for _ in range(2)]
spin = int(2e-3 * 1.98e9)
gb = shape.sq * shape.topk * 1152 / 1e9
print(f"{time.strftime('%Y-%m-%d %H:%M')} {torch.cuda.get_device_name()} S5 rows into registers, one CTA (4 warps) per token, after a 2 ms spin")
ops = {"nc.na": "ld.global.nc.L1::no_allocate.v4.u32", "cg": "ld.global.cg.v4.u32", "plain": "ld.global.v4.u32"}
for op in ["nc.na", "cg", "plain"]:
    for d in [1, 2, 3]:
        k = cp.RawModule(code=src, options=("-arch=sm_90a", f"-DD={d}", f'-DLDOP="{ops[op]}"')).get_function("gather")
        regs = k.num_regs
        for ctas in [1, 2, 3, 4]:
            if ctas * 128 * regs > 65536:
                continue
            smem = (227 * 1024) // ctas - 1024
            k.max_dynamic_shared_size_bytes = smem
            args = (kv2.data_ptr(), idx2.data_ptr(), cp.int32(idx2.shape[1]), out.data_ptr())
            ts = []
            for _ in range(12):
                torch.cuda.synchronize()
                torch.cuda._sleep(spin)
                ev[0].record(); k((shape.sq,), (128,), args, shared_mem=smem); ev[1].record(); torch.cuda.synchronize()
                ts.append(ev[0].elapsed_time(ev[1]))
            ms = sorted(ts)[6]
            print(f"  {op:6s} D={d} ({regs} regs) {ctas} CTA/SM: {ms:.3f} ms {gb / ms:5.2f} TB/s", flush=True)
