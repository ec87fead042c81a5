"""Session 14 call o: where call k's kernel (transposed P V, four buffers, fp8_b0) spends a pair:
the counters of mktrace_ot.py, sq 4096, H 64 (one head group), topk 2048 of 8192, pages of 64."""
import torch
import mlagen
from mlagen import bench_sparse as bs, operands

g = torch.Generator(device="cuda").manual_seed(0)
sq, h, topk, skv = 4096, 64, 2048, 8192
q = torch.randn(sq, h, 576, device="cuda", dtype=torch.bfloat16, generator=g)
idx = torch.rand((sq, skv), generator=g, device="cuda").argsort(-1)[:, :topk].int()
cache = bs.make_fp8_kv(torch, "p64", skv, operands.get("fp8_b0"), g, torch.device("cuda"))
names = {0: ["kready/conv waits", "Q K^T (scores)", "vfree wait (P' tiles)", "own P' sync", "P1Ready", "P V issue (both)",
             "wait<1>", "loop", "exponentiate", "store P'", "mask", "block max"],
         1: ["kready/conv waits", "Q K^T (scores)", "Max0Ready", "vfree wait (P' tiles)", "own P' sync", "P0Ready",
             "P V issue (both)", "loop", "exponentiate", "store P'", "mask", "block max"],
         2: ["vfree waits", "gathers", "total"]}
for k in ("mla_sparse_prefill_sm90_fp8", "mla_sparse_prefill_sm90_fp8_ot"):  # the instrumented one last: its max_logits are read
    for _ in range(3):
        out, ml, lse = mlagen.mla_sparse_prefill(q, cache, idx, softmax_scale=576 ** -0.5, kv_format="fp8_b0", compute="fp8",
                                                 kernel=k)
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(5):
        out, ml, lse = mlagen.mla_sparse_prefill(q, cache, idx, softmax_scale=576 ** -0.5, kv_format="fp8_b0", compute="fp8",
                                                 kernel=k)
    b.record()
    torch.cuda.synchronize()
    print(f"{k}: {a.elapsed_time(b) / 5:.3f} ms", flush=True)
tr = ml[:, :27].double().mean(0) / (topk // 128)
print("instrumented call k kernel (fp8_b0), cycles per pair (mean over CTAs):")
for role, base in ((0, 0), (1, 12), (2, 24)):
    row = ", ".join(f"{n} {tr[base + i].item():.0f}" for i, n in enumerate(names[role]))
    print(f"  {['consumer 0', 'consumer 1', 'producer'][role]}: {row}")
