"""One call each of the H<=16 sparse kernel on an fp8_v32 cache and on its bf16 copy (sq=1024, H=16,
topk=2048 of 32768 rows, pages of 64), inside cudaProfilerStart/Stop (ncu --profile-from-start off)."""
import torch, mlagen
from mlagen import operands
from mlagen.families.mla_sparse_prefill import random_indices
g = torch.Generator(device="cuda").manual_seed(0)
sq, h, topk, skv = 1024, 16, 2048, 32768
fmt = operands.get("fp8_v32")
q = torch.randn(sq, h, 576, device="cuda", dtype=torch.bfloat16, generator=g)
rows = torch.randn(skv, 576, device="cuda", generator=g)
cache = operands.quantize(rows, fmt).view(skv // 64, 64, fmt.row_bytes)
copy = operands.dequantize(cache, fmt, round_bf16=True)
idx = random_indices(sq, topk, skv, "cuda", generator=g)
calls = [lambda: mlagen.mla_sparse_prefill(q, cache, idx, softmax_scale=576 ** -0.5, kv_format="fp8_v32"),
         lambda: mlagen.mla_sparse_prefill(q, copy, idx, softmax_scale=576 ** -0.5)]
for f in calls:
    f()
torch.cuda.synchronize()
torch.cuda.cudart().cudaProfilerStart()
for f in calls:
    f()
torch.cuda.synchronize()
torch.cuda.cudart().cudaProfilerStop()
