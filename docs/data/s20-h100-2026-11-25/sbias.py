"""Session 20: does the sparse kernel's compute="fp8" mode (O summed over topk = 2048 keys in the FP8
wgmma accumulator) share the dense FP8 kernel's bias on V with a channel mean? The latent rows are
mean + 0.1 N(0, 1) in their 512 value columns (so V = those columns has a channel mean), quantized to the
V3.2 cache (fp8_v32, one fp32 scale per 128 values), 64 query rows, 128 heads, 2048 valid indices out of
8192 rows; the public call in both compute modes against the float32 reference on the dequantized rows
(Q as the fp8 mode rounds it for that mode): relative L2 of out and the least-squares ratio."""
import torch

import mlagen
from mlagen import operands
from mlagen.families import mla_sparse_prefill as fam

dev = torch.device("cuda")
g = torch.Generator(device=dev).manual_seed(0)
fmt = operands.get("fp8_v32")
sq, h, n, topk = 64, 128, 8192, 2048
q = torch.randn((sq, h, 576), generator=g, device=dev).to(torch.bfloat16)
idx = torch.stack([torch.randperm(n, generator=g, device=dev)[:topk] for _ in range(sq)]).to(torch.int32)
for mean in (0.0, 1.0, -1.0):
    rows = torch.randn((n, 576), generator=g, device=dev)
    rows[:, :512] = mean + (0.1 if mean else 1.0) * rows[:, :512]
    cache = operands.quantize(rows, fmt, scale_fmt="fp32").view(n // 64, 64, fmt.row_bytes)
    for compute in ("bf16", "fp8"):
        out = mlagen.mla_sparse_prefill(q, cache, idx, softmax_scale=576 ** -0.5, kv_format=fmt.name,
                                        compute=compute)[0].double()
        qq = fam.quantize_q_fp8(q) if compute == "fp8" else q
        ref = fam.reference(qq, cache, idx, softmax_scale=576 ** -0.5, kv_format=fmt.name)[0].double()
        rel = float((out - ref).norm() / ref.norm())
        ratio = float((out * ref).sum() / (ref * ref).sum())
        print(f"V = {mean} + noise, compute={compute}: out rel L2 {rel:.4f}, out/ref {ratio:.4f}", flush=True)
