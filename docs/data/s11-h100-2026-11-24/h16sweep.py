"""S5 (4096 tokens, H=16, topk 2048 of 32768 rows) and H=8 with each variant of the H<=16 kernel,
CUDA events around blocks of calls, variants alternating per round; also the 64-head kernel (padded)."""
import sys, torch, mlagen
from mlagen import spec, variant
from mlagen.families.mla_sparse_prefill import random_indices

def inputs(h, sq=4096, topk=2048, skv=32768, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    q = torch.randn(sq, h, 576, device="cuda", dtype=torch.bfloat16, generator=g)
    kv = torch.randn(skv, 576, device="cuda", dtype=torch.bfloat16, generator=g)
    idx = random_indices(sq, topk, skv, "cuda", generator=g)
    return q, kv, idx

def timeit(fn, iters=20, rounds=1):
    e0, e1 = torch.cuda.Event(True), torch.cuda.Event(True)
    fn(); torch.cuda.synchronize()
    e0.record()
    for _ in range(iters): fn()
    e1.record(); torch.cuda.synchronize()
    return e0.elapsed_time(e1) / iters

sp = spec.load("mla_sparse_prefill_sm90_h16")
grid = [dict(), dict(consumers=2), dict(consumers=2, qk_group=9), dict(consumers=2, pv_sets=2), dict(consumers=2, slots=4)]
grid.append(dict(l2_evict_last=False))
if len(sys.argv) > 1 and sys.argv[1] == "quick":
    grid = grid[:1]
for h in ((16, 8) if len(sys.argv) < 3 else (16,)):
    q, kv, idx = inputs(h)
    fl = 2 * 4096 * h * 2048 * (576 + 512)
    fns = {}
    for vals in grid:
        v = variant.make(sp, dict(vals, d_qk=576, paged=False, kv_format="bf16"))
        fns[v.symbol] = (lambda v=v: mlagen.mla_sparse_prefill(q, kv, idx, softmax_scale=576 ** -0.5, kernel=v))
    fns["sm90 (64-head, padded)"] = lambda: mlagen.mla_sparse_prefill(q, kv, idx, softmax_scale=576 ** -0.5, kernel="mla_sparse_prefill_sm90")
    fns["public call"] = lambda: mlagen.mla_sparse_prefill(q, kv, idx, softmax_scale=576 ** -0.5)
    times = {k: [] for k in fns}
    for r in range(3):
        for k, f in (fns.items() if r % 2 == 0 else reversed(list(fns.items()))):
            times[k].append(timeit(f))
    for k, ts in sorted(times.items(), key=lambda kv: min(kv[1])):
        print(f"H={h} {k}: {min(ts):.3f} ms (rounds {' '.join(f'{t:.3f}' for t in ts)}) {fl / min(ts) / 1e9:.0f} TFLOP/s", flush=True)
