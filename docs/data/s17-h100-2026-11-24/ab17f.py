"""Session 17 (from session 14's ab14.py): A/B of the fp8 compute mode in one process, the working tree's
mla_sparse_prefill_sm90_fp8 against the committed kernel installed as mla_sparse_prefill_sm90_fp8_base
(ab/, copied into specs/ and templates/ by the calling script), S1 / S3 (fp8_v32) and S1 (fp8_b0),
CUDA events, interleaved rounds, L2 flushed before each call (as the bench does)."""
import torch
import mlagen
from mlagen import bench_sparse as bs, operands

ROUNDS, CALLS = 5, 5


def main():
    device = torch.device("cuda")
    flush = torch.empty(256 * 1024 * 1024, dtype=torch.uint8, device=device)
    import sys
    formats = sys.argv[1].split(",") if len(sys.argv) > 1 else ["fp8_v32", "fp8_b0"]
    for name, sq, heads, topk, skv, fname in [(s, 4096, 128, 2048, n, f) for s, n in (("S1", 8192), ("S3", 131072))
                                              for f in formats]:
        gen = torch.Generator(device=device)
        gen.manual_seed(7)
        fmt = operands.get(fname)
        q = torch.randn((sq, heads, 576), generator=gen, device=device).to(torch.bfloat16)
        cache = bs.make_fp8_kv(torch, "p64", skv, fmt, gen, device, scale_fmt="ue8m0")
        idx = torch.rand((sq, skv), generator=gen, device=device).argsort(-1)[:, :topk].int()
        scale = 576 ** -0.5
        calls = {k: (lambda k=k: mlagen.mla_sparse_prefill(q, cache, idx, softmax_scale=scale, kv_format=fname, compute="fp8",
                                                           kernel=k))
                 for k in ("mla_sparse_prefill_sm90_fp8_base", "mla_sparse_prefill_sm90_fp8")}
        outs = {k: f() for k, f in calls.items()}
        a, b = outs.values()
        print(f"{name} {fname}: max |out new - out base| {(a[0].float() - b[0].float()).abs().max().item():.3e}, "
              f"lse {(a[2] - b[2]).abs().max().item():.3e}", flush=True)
        times = {k: [] for k in calls}
        for _ in range(ROUNDS):
            for k, f in calls.items():
                total = 0.0
                for _ in range(CALLS):
                    flush.zero_()
                    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    e0.record()
                    f()
                    e1.record()
                    torch.cuda.synchronize()
                    total += e0.elapsed_time(e1)
                times[k].append(total / CALLS)
        med = {k: sorted(v)[len(v) // 2] for k, v in times.items()}
        base = med["mla_sparse_prefill_sm90_fp8_base"]
        for k, v in times.items():
            print(f"{name} {fname} {k:34s} median {med[k]:.3f} ms  x{base / med[k]:.3f} of base  (rounds {['%.3f' % x for x in v]})",
                  flush=True)


main()
