"""One call each of the H<=16 sparse kernel (spec default) and of the 64-head kernel (padded) on
sq=1024, H=16, topk=2048 of 32768 rows, inside cudaProfilerStart/Stop (ncu --profile-from-start off)."""
import torch, mlagen
from mlagen.families.mla_sparse_prefill import random_indices
g = torch.Generator(device="cuda").manual_seed(0)
sq, h, topk, skv = 1024, 16, 2048, 32768
q = torch.randn(sq, h, 576, device="cuda", dtype=torch.bfloat16, generator=g)
kv = torch.randn(skv, 576, device="cuda", dtype=torch.bfloat16, generator=g)
idx = random_indices(sq, topk, skv, "cuda", generator=g)
calls = [lambda: mlagen.mla_sparse_prefill(q, kv, idx, softmax_scale=576 ** -0.5, kernel="mla_sparse_prefill_sm90_h16"),
         lambda: mlagen.mla_sparse_prefill(q, kv, idx, softmax_scale=576 ** -0.5, kernel="mla_sparse_prefill_sm90")]
for f in calls:
    f()
torch.cuda.synchronize()
torch.cuda.cudart().cudaProfilerStart()
for f in calls:
    f()
torch.cuda.synchronize()
torch.cuda.cudart().cudaProfilerStop()
