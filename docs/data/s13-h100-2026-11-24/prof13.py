"""One call each (inside cudaProfilerStart/Stop, for ncu --profile-from-start off): the fp8 compute
mode on an fp8_v32 cache and on an fp8_b0 cache, and the bf16 kernel on the bf16 copy (sq=1024, H=128,
topk=2048 of 8192 rows, pages of 64, UE8M0 scales)."""
import torch, mlagen
from mlagen import operands, bench_sparse as bs
g = torch.Generator(device="cuda").manual_seed(0)
sq, h, topk, skv = 1024, 128, 2048, 8192
q = torch.randn(sq, h, 576, device="cuda", dtype=torch.bfloat16, generator=g)
idx = torch.rand((sq, skv), generator=g, device="cuda").argsort(-1)[:, :topk].int()
calls = []
for name in ("fp8_v32", "fp8_b0"):
    fmt = operands.get(name)
    cache = bs.make_fp8_kv(torch, "p64", skv, fmt, g, torch.device("cuda"), spread=0.5, scale_fmt="ue8m0")
    calls.append(lambda c=cache, n=name: mlagen.mla_sparse_prefill(q, c, idx, softmax_scale=576 ** -0.5, kv_format=n,
                                                                    compute="fp8"))
copy = operands.dequantize(cache, fmt, round_bf16=True)
calls.append(lambda: mlagen.mla_sparse_prefill(q, copy, idx, softmax_scale=576 ** -0.5))
for f in calls:
    f()
torch.cuda.synchronize()
torch.cuda.cudart().cudaProfilerStart()
for f in calls:
    f()
torch.cuda.synchronize()
torch.cuda.cudart().cudaProfilerStop()
