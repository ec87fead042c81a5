"""S5 three ways, alternating blocks of 20 calls for 8 rounds: the public call, the spec by name, the
default variant pinned; prints what dispatch selected for the public call (symbol, origin, grid)."""
import torch, mlagen
from mlagen import spec, variant
from mlagen.families import mla_sparse_prefill as fam
from mlagen.families.mla_sparse_prefill import random_indices
g = torch.Generator(device="cuda").manual_seed(0)
sq, h, topk, skv = 4096, 16, 2048, 32768
q = torch.randn(sq, h, 576, device="cuda", dtype=torch.bfloat16, generator=g)
kv = torch.randn(skv, 576, device="cuda", dtype=torch.bfloat16, generator=g)
idx = random_indices(sq, topk, skv, "cuda", generator=g)
v = variant.make(spec.load("mla_sparse_prefill_sm90_h16"), {"d_qk": 576, "paged": False, "kv_format": "bf16"})
fns = {"public": lambda: mlagen.mla_sparse_prefill(q, kv, idx, softmax_scale=576 ** -0.5),
       "by name": lambda: mlagen.mla_sparse_prefill(q, kv, idx, softmax_scale=576 ** -0.5, kernel="mla_sparse_prefill_sm90_h16"),
       "pinned default": lambda: mlagen.mla_sparse_prefill(q, kv, idx, softmax_scale=576 ** -0.5, kernel=v)}
for f in fns.values():
    f()
torch.cuda.synchronize()
call = fam.prepare(q, kv, idx, softmax_scale=576 ** -0.5)
dev, sel = fam.select(call)
print("public call selects", sel.variant.symbol, sel.origin, "grid", fam.grid(sel, call), "pinned", v.symbol, flush=True)
e0, e1 = torch.cuda.Event(True), torch.cuda.Event(True)
times = {k: [] for k in fns}
for r in range(8):
    for k, f in (list(fns.items()) if r % 2 == 0 else list(reversed(list(fns.items())))):
        e0.record()
        for _ in range(20):
            f()
        e1.record(); torch.cuda.synchronize()
        times[k].append(e0.elapsed_time(e1) / 20)
for k, ts in times.items():
    ts2 = sorted(ts)
    print(f"{k}: median {ts2[len(ts2)//2]:.3f} ms, min {ts2[0]:.3f}, rounds {' '.join(f'{t:.3f}' for t in ts)}", flush=True)
