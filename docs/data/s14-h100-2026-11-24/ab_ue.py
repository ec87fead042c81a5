"""Session 14 call n: fp8_v32 rows converted to one scale per row by the producer, on call k's
transposed-P V kernel with four buffers (ab_ue/, installed in the device's copy as
mla_sparse_prefill_sm90_fp8_ue by s14n.sh), against the shipped fp8-mode kernel: every fp8_v32 case
of the fp8 compute matrix checked against the reference (the family's own check, outputs poisoned;
the fp32-scale cases carry one more e4m3 rounding here), then S1 / S3 timing on UE8M0 scales,
interleaved in one process, L2 flushed before each call."""
import torch
import mlagen
from mlagen import bench_sparse as bs, operands

NEW, OLD = "mla_sparse_prefill_sm90_fp8_ue", "mla_sparse_prefill_sm90_fp8"


def main():
    device = torch.device("cuda")
    cases = [c for c in bs.fp8_compute_cases() if c.get("kv_format", "fp8_v32") == "fp8_v32"]
    bad = 0
    for i, c in enumerate(cases):
        ok, msg = bs.check_fp8_compute_case(torch, c, 500 + i, kernel=NEW)
        bad += not ok
        print(f"case {i} {'PASS' if ok else 'FAIL'} {msg} :: {c}", flush=True)
    print(f"correctness: {len(cases) - bad}/{len(cases)} passed", flush=True)
    flush = torch.empty(256 * 1024 * 1024, dtype=torch.uint8, device=device)
    for name, sq, heads, topk, skv in (("S1", 4096, 128, 2048, 8192), ("S3", 4096, 128, 2048, 131072)):
        gen = torch.Generator(device=device)
        gen.manual_seed(7)
        fmt = operands.get("fp8_v32")
        q = torch.randn((sq, heads, 576), generator=gen, device=device).to(torch.bfloat16)
        cache = bs.make_fp8_kv(torch, "p64", skv, fmt, gen, device, scale_fmt="ue8m0")
        idx = torch.rand((sq, skv), generator=gen, device=device).argsort(-1)[:, :topk].int()
        calls = {k: (lambda k=k: mlagen.mla_sparse_prefill(q, cache, idx, softmax_scale=576 ** -0.5, kv_format="fp8_v32",
                                                           compute="fp8", kernel=k)) for k in (OLD, NEW)}
        a, b = (f() for f in calls.values())
        diff = ((a[0].float() - b[0].float()).norm() / b[0].float().norm()).item()
        print(f"{name} fp8_v32: relative L2 |out new - out shipped| {diff:.3e}", flush=True)
        times = {k: [] for k in calls}
        for _ in range(7):
            for k, f in calls.items():
                total = 0.0
                for _ in range(5):
                    flush.zero_()
                    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    e0.record()
                    f()
                    e1.record()
                    torch.cuda.synchronize()
                    total += e0.elapsed_time(e1)
                times[k].append(total / 5)
        med = {k: sorted(v)[len(v) // 2] for k, v in times.items()}
        for k, v in times.items():
            print(f"{name} fp8_v32 {k:32s} median {med[k]:.3f} ms  x{med[OLD] / med[k]:.3f} of shipped  "
                  f"(rounds {['%.3f' % x for x in v]})", flush=True)


main()
