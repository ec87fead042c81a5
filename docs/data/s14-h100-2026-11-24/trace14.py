"""Session 14 (from session 13 calls n, o): where the fp8 compute mode's time goes, from clock64 accumulators in an
instrumented copy of sparse_fp8mma.cuh (s14trace/, made by mktrace.py; not shipped): per role, the
cycles spent waiting at each barrier and in each step, summed over a CTA's pairs and averaged over
CTAs, per pair. sq=4096, H=64 (one head group: the trace is written into max_logits columns 0-23),
topk=2048 of 8192 rows, pages of 64, UE8M0 scales."""
import torch, mlagen
from mlagen import operands, bench_sparse as bs
g = torch.Generator(device="cuda").manual_seed(0)
sq, h, topk, skv = 4096, 64, 2048, 8192
q = torch.randn(sq, h, 576, device="cuda", dtype=torch.bfloat16, generator=g)
idx = torch.rand((sq, skv), generator=g, device="cuda").argsort(-1)[:, :topk].int()
names = {0: ["kready wait", "Q K^T (scores)", "vready own", "Max1Ready", "P1Ready", "vready other", "loop", "-"],
         1: ["kready wait", "Q K^T (scores)", "Max0Ready", "vready own", "P0Ready", "vready other", "loop", "-"],
         2: ["kready waits", "scale-stage barrier", "vfree waits", "transposes", "kfree waits", "gathers", "total", "fences",
            "scale stage", "fv stores", "load_rows issue", "-"]}
for name in ("fp8_v32", "fp8_b0"):
    fmt = operands.get(name)
    cache = bs.make_fp8_kv(torch, "p64", skv, fmt, g, torch.device("cuda"), spread=0.5, scale_fmt="ue8m0")
    for _ in range(3):
        out, ml, lse = mlagen.mla_sparse_prefill(q, cache, idx, softmax_scale=576 ** -0.5, kv_format=name, compute="fp8")
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(5):
        out, ml, lse = mlagen.mla_sparse_prefill(q, cache, idx, softmax_scale=576 ** -0.5, kv_format=name, compute="fp8")
    b.record()
    torch.cuda.synchronize()
    pairs = topk // 128
    tr = ml[:, :28].double().mean(0) / pairs
    print(f"{name}: {a.elapsed_time(b) / 5:.3f} ms; cycles per pair (mean over CTAs):")
    for role in range(3):
        row = ", ".join(f"{n} {tr[8 * role + k].item():.0f}" for k, n in enumerate(names[role]) if n != "-")
        print(f"  {['consumer 0', 'consumer 1', 'producer'][role]}: {row}")
