"""Session 14: the FP8 cache's "bf16" compute mode with two producer warpgroups (producers=2):
bit equality with the bf16 kernel on the dequantized copy (the mode's promise) on a few cases,
then S1/S3-like timing (CUDA events, interleaved rounds, warm L2: a first look, not the bench)
against the shipped one-producer variant and the bf16 kernel on the copy."""
import torch
import mlagen
from mlagen import bench_sparse as bs, operands, spec, variant

SPEC = spec.load("mla_sparse_prefill_sm90")
VARIANTS = [dict(producers=2, consumer_regs=216, producer_regs=40), dict(producers=2, consumer_regs=208, producer_regs=48)]


def pinned(fmt, paged, **kw):
    return variant.make(SPEC, {"d_qk": 576, "paged": paged, "kv_format": fmt, **kw})


def call_pinned(q, cache, idx, scale, fname, kw, **out):
    """The call on the pinned variant of the layout the family takes the cache to be (a contiguous
    pool of pages is flat rows to it)."""
    for paged in (False, True):
        try:
            return mlagen.mla_sparse_prefill(q, cache, idx, softmax_scale=scale, kv_format=fname,
                                             kernel=pinned(fname, paged, **kw), **out)
        except ValueError as exc:
            if "is compiled for" not in str(exc):
                raise
    raise RuntimeError("no layout fits")


def main():
    device = torch.device("cuda")
    only = VARIANTS
    # Bit equality with the bf16 kernel on the dequantized copy.
    bad = 0
    for i, (fname, kvl, heads, topk, sq, n) in enumerate([("fp8_v32", "p64", 128, 2048, 64, 8192), ("fp8_v32", "p1", 5, 33, 7, 300),
                                                         ("fp8_b0", "p64_4d", 64, 640, 9, 3000), ("fp8_b64", "p64_strided", 16, 700, 5, 2000)]):
        gen = torch.Generator(device=device)
        gen.manual_seed(100 + i)
        fmt = operands.get(fname)
        q = torch.randn((sq, heads, 576), generator=gen, device=device).to(torch.bfloat16)
        cache = bs.make_fp8_kv(torch, kvl, n, fmt, gen, device, spread=2.0)
        n_rows = cache.shape[0] * cache.shape[1] if cache.dim() >= 3 else cache.shape[0]
        idx = torch.randint(-3, n_rows + 3, (sq, topk), generator=gen, device=device).int()
        copy = operands.dequantize(cache, fmt, round_bf16=True)
        ref = mlagen.mla_sparse_prefill(q, copy, idx, softmax_scale=0.07, kernel="mla_sparse_prefill_sm90")
        for kw in only:
            outs = [torch.full_like(ref[0], float("nan")), torch.full_like(ref[1], float("nan")), torch.full_like(ref[2], float("nan"))]
            got = call_pinned(q, cache, idx, 0.07, fname, kw, out=outs[0], max_logits=outs[1], lse=outs[2])
            same = all(torch.equal(a, b) for a, b in zip(got, ref))
            bad += not same
            print(f"case {i} {fname} {kvl} H{heads} topk{topk} {kw}: {'bit-equal' if same else 'DIFFERENT'}", flush=True)
    print(f"bit equality: {bad} different", flush=True)
    for name, sq, heads, topk, skv, fname in (("S1", 4096, 128, 2048, 8192, "fp8_v32"), ("S3", 4096, 128, 2048, 131072, "fp8_v32")):
        gen = torch.Generator(device=device)
        gen.manual_seed(7)
        fmt = operands.get(fname)
        q = torch.randn((sq, heads, 576), generator=gen, device=device).to(torch.bfloat16)
        cache = bs.make_fp8_kv(torch, "p64", skv, fmt, gen, device, scale_fmt="ue8m0")
        idx = torch.rand((sq, skv), generator=gen, device=device).argsort(-1)[:, :topk].int()
        copy = operands.dequantize(cache, fmt, round_bf16=True)
        scale = 576 ** -0.5
        calls = {"bf16mode": lambda: mlagen.mla_sparse_prefill(q, cache, idx, softmax_scale=scale, kv_format=fname,
                                                                 kernel="mla_sparse_prefill_sm90"),
                 "bf16copy": lambda: mlagen.mla_sparse_prefill(q, copy, idx, softmax_scale=scale, kernel="mla_sparse_prefill_sm90")}
        for kw in only:
            calls[f"p2 rc{kw['consumer_regs']}/rp{kw['producer_regs']}"] = (
                lambda kw=kw: call_pinned(q, cache, idx, scale, fname, kw))
        flops = 2 * sq * heads * topk * (576 + 512)
        for f in calls.values():
            f()
        torch.cuda.synchronize()
        times = {k: [] for k in calls}
        for _ in range(5):
            for k, f in calls.items():
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a.record()
                for _ in range(5):
                    f()
                b.record()
                torch.cuda.synchronize()
                times[k].append(a.elapsed_time(b) / 5)
        base = min(times["bf16copy"])
        for k, v in times.items():
            t = min(v)
            print(f"{name} {fname} {k:18s} {t:.3f} ms {flops / t / 1e9:6.1f} TFLOP/s  x{base / t:.2f} of bf16copy  (all {['%.3f' % x for x in v]})",
                  flush=True)


main()
