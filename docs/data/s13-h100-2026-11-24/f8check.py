"""Session 13: the sparse fp8 compute mode (mla_sparse_prefill_sm90_fp8) on the device.
Correctness over the FP8 case matrix (fp8_v32 / fp8_b0 cases) against the float32 reference on
fp32-dequantized rows (errors printed), then S1/S3-like timing against the bf16 mode and the bf16
kernel on the dequantized copy (CUDA events, back to back, warm L2: a first look, not the bench)."""
import inspect, math, sys
import torch
import mlagen
from mlagen import bench_sparse as bs, operands
from mlagen.families import mla_sparse_prefill as fam

KERNEL = "mla_sparse_prefill_sm90_fp8"
HAS_COMPUTE = "compute" in inspect.signature(mlagen.mla_sparse_prefill).parameters
EXTRA = {"compute": "fp8"} if HAS_COMPUTE else {}
print("compute kwarg:", HAS_COMPUTE, flush=True)


def run_fp8(q, cache, idx, scale, fmt, **kw):
    return mlagen.mla_sparse_prefill(q, cache, idx, softmax_scale=scale, kv_format=fmt, kernel=KERNEL, **EXTRA, **kw)


def check(case, seed):
    device = torch.device("cuda")
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    sq, heads, n = case["sq"], case["heads"], case["n"]
    fmt = operands.get(case.get("kv_format", "fp8_v32"))
    q_big = torch.randn((sq, heads + 3, 640), generator=gen, device=device).to(torch.bfloat16)
    q = q_big[:, 1:heads + 1, :576]
    cache = bs.make_fp8_kv(torch, case.get("kv", "p64"), n, fmt, gen, device, spread=case.get("spread", 2.0),
                           scale_fmt=case.get("scales", "fp32"))
    n_rows = cache.shape[0] * cache.shape[1]
    idx, length, sink = bs.case_indices(torch, case, n_rows, gen, device)
    scale = 576 ** -0.5
    out = torch.full((sq, heads, 512), math.nan, dtype=torch.bfloat16, device=device)
    ml = torch.full((sq, heads), math.nan, device=device)
    lse = torch.full((sq, heads), math.nan, device=device)
    got = run_fp8(q, cache, idx, scale, fmt.name, topk_length=length, attn_sink=sink, out=out, max_logits=ml, lse=lse)
    torch.cuda.synchronize()
    ref32 = fam.reference(q, cache, idx, softmax_scale=scale, topk_length=length, attn_sink=sink, kv_format=fmt.name)
    refq = fam.reference(quantized_q(q), cache, idx, softmax_scale=scale, topk_length=length, attn_sink=sink,
                         kv_format=fmt.name)
    okq, msgq = bs.judge(torch, got, refq, 6e-2, 2e-2)
    ok32, msg32 = bs.judge(torch, got, ref32, 6e-2, 6e-2)
    return okq, f"vs Q-as-quantized: {msgq} | vs exact: {msg32}"


def quantized_q(q):
    """The kernel's Q: latent values e4m3(q / qs) * qs with qs = 2^ceil(log2(amax * (1/448))) per
    (token, head) over the 512 latent values (1 when all are 0); rope unchanged (scaled exactly)."""
    q32 = q.float()
    lat = q32[..., :512]
    amax = lat.abs().amax(-1, keepdim=True)
    x = amax * torch.tensor(1.0 / 448.0, dtype=torch.float32, device=q.device)
    qs = torch.where(amax > 0, torch.exp2(torch.ceil(torch.log2(x))), torch.ones_like(x))
    q8 = (lat / qs).clamp(-448, 448).to(torch.float8_e4m3fn).float() * qs
    return torch.cat([q8, q32[..., 512:]], -1).to(torch.bfloat16)


def main():
    cases = [c for c in bs.fp8_cases() if c.get("kv_format", "fp8_v32") in ("fp8_v32", "fp8_b0")]
    cases += [dict(sq=8, heads=128, topk=2048, n=8192, kv="p64", kv_format="fp8_v32", sink="none", invalid=0.0),
              dict(sq=8, heads=64, topk=640, n=4096, kv="p64", kv_format="fp8_b0", sink="finite", invalid=0.1),
              dict(sq=8, heads=128, topk=2048, n=8192, kv="p64", kv_format="fp8_v32", sink="none", invalid=0.0,
                   scales="ue8m0", spread=1.0)]
    bad = 0
    for i, case in enumerate(cases):
        try:
            ok, msg = check(case, 100 + i)
        except Exception as exc:  # noqa: BLE001
            ok, msg = False, f"{type(exc).__name__}: {exc}"
        bad += not ok
        print(f"case {i:2d} {'PASS' if ok else 'FAIL'} {msg} :: { {k: v for k, v in case.items() if k not in ('sq',)} }",
              flush=True)
    print(f"correctness: {len(cases) - bad}/{len(cases)} passed", flush=True)
    if "--time" not in sys.argv:
        return
    device = torch.device("cuda")
    for name, sq, heads, topk, skv, fname in (("S1", 4096, 128, 2048, 8192, "fp8_v32"), ("S1", 4096, 128, 2048, 8192, "fp8_b0"),
                                              ("S3", 4096, 128, 2048, 131072, "fp8_v32")):
        gen = torch.Generator(device=device)
        gen.manual_seed(7)
        fmt = operands.get(fname)
        q = torch.randn((sq, heads, 576), generator=gen, device=device).to(torch.bfloat16)
        cache = bs.make_fp8_kv(torch, "p64", skv, fmt, gen, device, scale_fmt="ue8m0")
        idx = torch.rand((sq, skv), generator=gen, device=device).argsort(-1)[:, :topk].int()
        copy = operands.dequantize(cache, fmt, round_bf16=True)
        scale = 576 ** -0.5
        calls = {
            "fp8mma": lambda: run_fp8(q, cache, idx, scale, fname),
            "bf16mode": lambda: mlagen.mla_sparse_prefill(q, cache, idx, softmax_scale=scale, kv_format=fname,
                                                          kernel="mla_sparse_prefill_sm90"),
            "bf16copy": lambda: mlagen.mla_sparse_prefill(q, copy, idx, softmax_scale=scale,
                                                          kernel="mla_sparse_prefill_sm90"),
        }
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
            print(f"{name} {fname} {k:9s} {t:.3f} ms {flops / t / 1e9:6.1f} TFLOP/s  x{base / t:.2f} of bf16copy  (all {['%.3f' % x for x in v]})",
                  flush=True)


main()
